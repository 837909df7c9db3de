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
use super::subscription::{self, Reading, Received, SubscriptionEnv, SubscriptionSpec};

/// First and longest wait before a consumer that failed alone restarts.
const FIRST_RESTART: Duration = Duration::from_secs(1);
const LONGEST_RESTART: Duration = Duration::from_secs(30);
/// A subscription that ran this long before failing starts its backoff
/// again from the first wait.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

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
    loop {
        if let Some(detail) = link.phase().detail() {
            env.board.set(&queue, Reading::Stopped { reason: detail });
        }
        let Some((connection, generation)) = link.up(&env.shutdown).await else {
            return;
        };
        if needs_repair && let Err(e) = repair(connection.clone()).await {
            let reason = format!("{e:#}");
            tracing::warn!(queue = %queue, error = %reason, "cannot restore the consumer's topology yet");
            env.board.set(&queue, Reading::Stopped { reason });
            if !pause(&mut backoff, &env.shutdown, &queue).await {
                return;
            }
            continue;
        }
        let started = Instant::now();
        let result = subscription::run(&connection, spec.clone(), env.clone(), &handle).await;
        let Err(failure) = result else {
            return;
        };
        if env.shutdown.is_cancelled() {
            return;
        }
        let connection_lost =
            link.state().generation != generation || !connection.status().connected();
        if connection_lost {
            // The link recovers the connection; resubscribe on the new one.
            tracing::warn!(queue = %queue, error = %format!("{failure:#}"), "consumer stopped with its connection; it resumes once the connection is recovered");
            needs_repair = false;
            continue;
        }
        if started.elapsed() >= HEALTHY_RUN {
            backoff = Backoff::new(FIRST_RESTART, LONGEST_RESTART);
        }
        tracing::error!(queue = %queue, error = %format!("{failure:#}"), "consumer stopped; restarting it alone");
        needs_repair = true;
        if !pause(&mut backoff, &env.shutdown, &queue).await {
            return;
        }
    }
}

/// Waits the next backoff; `false` if shutdown came first.
async fn pause(backoff: &mut Backoff, shutdown: &CancellationToken, queue: &str) -> bool {
    let wait = backoff.next_wait(rand::random::<f64>());
    tracing::info!(queue, retry_in = %humantime::format_duration(Duration::from_millis(wait.as_millis() as u64)), "restarting the consumer after a pause");
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => false,
        _ = tokio::time::sleep(wait) => true,
    }
}
