//! Keeps one queue's subscription going, whatever happens to it: a consumer
//! the broker cancelled (its queue was deleted), a channel error, a lost
//! connection. Each consumer restarts on its own; the others keep reading.
//!
//! A lone failure (the connection is still up) is retried with capped
//! backoff, after `repair` (the host re-declares its topology, so a deleted
//! queue comes back). After a lost connection the subscription waits for
//! the link's next connection, on which the topology was already applied.
//! Meanwhile the [`Board`] says why the queue is not being read.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::link::{Backoff, Link, OnConnected};
use super::stream::StartError;
use super::subscription::{self, Reading, Received, SubscriptionEnv, SubscriptionSpec};

/// First and longest wait before a consumer that failed alone restarts.
const FIRST_RESTART: Duration = Duration::from_secs(1);
const LONGEST_RESTART: Duration = Duration::from_secs(30);
/// A subscription that ran this long before failing starts its backoff
/// again from the first wait.
const HEALTHY_RUN: Duration = Duration::from_secs(60);
/// How often a stream consumer standing by (another host holds its lease)
/// asks for the lease again, give or take half.
const STANDBY_RETRY: Duration = Duration::from_secs(2);

/// Subscribes on `link`'s connection and keeps subscribing until shutdown.
pub async fn keep_subscribed<H, F>(
    link: Arc<Link>,
    spec: SubscriptionSpec,
    env: SubscriptionEnv,
    repair: OnConnected,
    handle: H,
) where
    H: Fn(Received) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let queue = spec.queue.clone();
    let mut backoff = Backoff::new(FIRST_RESTART, LONGEST_RESTART);
    let mut needs_repair = false;
    // The generation of the connection the last subscription died with.
    let mut lost_generation = None;
    // Another host holds this stream consumer's lease (logged once).
    let mut standing_by = false;
    loop {
        if let Some(detail) = link.phase().detail() {
            env.board.set(&queue, Reading::Stopped { reason: detail });
        }
        let Some((connection, generation)) = link.up_after(lost_generation, &env.shutdown).await
        else {
            return;
        };
        // The repair (declaring the topology again) waits on the broker with
        // no bound of its own; on a connection that stopped answering it would
        // hold a stop until the connection fails. Nothing is subscribed yet,
        // and a declare is safe to leave half-done: shutdown simply wins.
        let repaired = if needs_repair {
            tokio::select! {
                biased;
                _ = env.shutdown.cancelled() => return,
                repaired = repair(connection.clone()) => repaired,
            }
        } else {
            Ok(())
        };
        if let Err(e) = repaired {
            let reason = format!("{e:#}");
            tracing::warn!(queue = %queue, error = %reason, "cannot restore the consumer's topology yet");
            env.board.set(&queue, Reading::Stopped { reason });
            if !pause(&mut backoff, &env.shutdown, &queue).await {
                return;
            }
            continue;
        }
        let started = Instant::now();
        let this_run = careful(&link, &spec);
        let result = subscription::run(&connection, this_run, env.clone(), &handle).await;
        if env.shutdown.is_cancelled() {
            return;
        }
        let Err(failure) = result else {
            // A careful subscription's time is up: subscribe normally.
            tracing::info!(queue = %queue, prefetch = spec.prefetch, "consuming with the full prefetch again");
            continue;
        };
        let connection_lost =
            link.state().generation != generation || !connection.status().connected();
        if connection_lost {
            // The link recovers the connection; resubscribe on the new one.
            tracing::warn!(queue = %queue, error = %format!("{failure:#}"), "consumer stopped with its connection; it resumes once the connection is recovered");
            needs_repair = false;
            lost_generation = Some(generation);
            continue;
        }
        if let Some(StartError::StandBy(why)) = failure.downcast_ref::<StartError>() {
            // Another host reads under this consumer name: not a failure of
            // this one, and nothing to repair. Asked again soon, so that a
            // stop of that host is followed within seconds.
            if !standing_by {
                tracing::info!(queue = %queue, reason = %why, "standing by");
                standing_by = true;
            }
            let wait = STANDBY_RETRY.mul_f64(0.5 + rand::random::<f64>());
            tokio::select! {
                biased;
                _ = env.shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            continue;
        }
        if standing_by {
            tracing::info!(queue = %queue, "no longer standing by: the lease was free");
            standing_by = false;
        }
        if started.elapsed() >= HEALTHY_RUN {
            backoff = Backoff::new(FIRST_RESTART, LONGEST_RESTART);
        }
        tracing::error!(queue = %queue, error = %format!("{failure:#}"), "consumer stopped; restarting it alone");
        // A stream's start that failed (its checkpoint unreadable) has
        // nothing of the topology to repair.
        needs_repair = failure.downcast_ref::<StartError>().is_none();
        if !pause(&mut backoff, &env.shutdown, &queue).await {
            return;
        }
    }
}

/// How long consumers subscribe carefully after their connection was lost
/// to a frame it could not parse.
const CAREFUL_FOR: Duration = Duration::from_secs(60);

/// The subscription to make now: `spec`, or, shortly after the connection
/// was lost to a message that cannot be parsed, the same with a prefetch of
/// one until [`CAREFUL_FOR`] has passed.
///
/// Why: such a message closes the connection each time it is delivered,
/// until the queue's delivery limit dead-letters it. On a quorum queue
/// every delivery returned by a closed connection counts towards that
/// limit, so with a full prefetch the messages delivered alongside it
/// would run out of tries too. With a prefetch of one, it is delivered
/// alone (returned messages go back to the head of the queue).
fn careful(link: &Link, spec: &SubscriptionSpec) -> SubscriptionSpec {
    match link.unparsable_within(CAREFUL_FOR) {
        Some(left) => {
            tracing::warn!(queue = %spec.queue, careful_for_ms = left.as_millis() as u64, "consuming one message at a time after a message that could not be parsed");
            SubscriptionSpec {
                prefetch: 1,
                ends_after: Some(left),
                ..spec.clone()
            }
        }
        None => spec.clone(),
    }
}

/// Waits the next backoff; `false` if shutdown came first.
async fn pause(backoff: &mut Backoff, shutdown: &CancellationToken, queue: &str) -> bool {
    let wait = backoff.next_wait(rand::random::<f64>());
    tracing::info!(
        queue,
        retry_in_ms = wait.as_millis() as u64,
        "restarting the consumer after a pause"
    );
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => false,
        _ = tokio::time::sleep(wait) => true,
    }
}
