//! The scheduler's control consumer: reads `acemq.schedule.due` (prefetch
//! 50, declaring nothing itself) and moves each message one step on: down
//! the next rung, or to its final exchange once due. A message is acked
//! only after the publish that moves it is confirmed, so a host killed
//! mid-hop loses nothing: the broker delivers the message again, and at
//! worst the next rung or the final exchange gets it twice (with the same
//! id). Several control consumers, of this host or of any AceMQ library,
//! may read the same queue: each message is on one queue at a time.
//!
//! What cannot be delivered is never acked into nothing:
//! - a final publish the broker did not route or refused waits on the 10 s
//!   rung and is tried again (counted `undeliverable`, and its age past due
//!   shows in `acemq_scheduler_oldest_overdue_seconds`);
//! - a hop a rung did not take (an operator deleted the rung; the host
//!   declares it again on its next connection) waits on the 10 s rung
//!   instead;
//! - a publish that failed for the broker's or the connection's sake is
//!   requeued after a pause;
//! - a message without the headers that say where it goes is rejected, as
//!   the contract says (the control queue has no dead-letter exchange of its
//!   own: an operator policy may give it one; see docs/scheduler.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::rungs::{self, RUNGS, Rung};
use super::wire::{self, Schedule};
use super::{CONTROL_PREFETCH, DUE_QUEUE};
use crate::broker::{PublishError, PublishLink, Publisher, Received, SubscriptionSpec};
use crate::telemetry::{Metrics, ReasonLabel, RungLabel};

/// How many of the control consumer's 50 places may hold a message that is
/// due in under a second until its due time. Beyond that, such messages
/// are delivered at once (up to a second early, as the contract allows), so
/// holds never starve the hops behind them: the 10 places left move about
/// 500 hops a second at 20 ms a confirm. Measured (benches/
/// scheduler_lateness.rs, 10,000 messages due over 2 minutes): 25 places
/// held too few, median lateness -448 ms; 40, median +2 ms.
pub const HOLD_PLACES: usize = 40;
/// Where a message whose final publish failed waits before it is tried again.
const UNDELIVERABLE_WAIT: &Rung = &RUNGS[3];
/// The pause before a message whose publish failed for the broker's sake
/// is given back to the control queue.
const BROKER_TROUBLE_PAUSE: Duration = Duration::from_secs(1);
/// An overdue message not seen again for this long has been delivered by
/// another control consumer, or deleted: it no longer counts as overdue here.
const OVERDUE_FORGOTTEN_AFTER: Duration = Duration::from_secs(60);

/// What the control consumer does with a message, `left_ms` before it is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Down this rung.
    Hop(&'static Rung),
    /// Hold it this long, then deliver.
    Hold(Duration),
    /// Publish it to its final exchange now.
    Deliver,
}

/// The step for a message `left_ms` before its due time, when a hold place
/// is free (`may_hold`) or not.
#[must_use]
pub fn step(left_ms: i64, may_hold: bool) -> Step {
    if let Some(rung) = rungs::rung_for(left_ms) {
        return Step::Hop(rung);
    }
    match u64::try_from(left_ms) {
        Ok(left) if left > 0 && may_hold => Step::Hold(Duration::from_millis(left)),
        _ => Step::Deliver,
    }
}

/// Messages this host found overdue and has not delivered yet, by id: due
/// time and when last seen. Read at scrape time for
/// `acemq_scheduler_oldest_overdue_seconds`.
#[derive(Debug, Default)]
pub struct Overdue {
    seen: Mutex<HashMap<String, (i64, Instant)>>,
}

impl Overdue {
    /// `id`, due at `due_at_ms`, failed to be delivered.
    pub fn note(&self, id: &str, due_at_ms: i64) {
        let mut seen = self.seen.lock().expect("overdue poisoned");
        seen.insert(id.to_string(), (due_at_ms, Instant::now()));
    }

    /// `id` was delivered.
    pub fn delivered(&self, id: &str) {
        let mut seen = self.seen.lock().expect("overdue poisoned");
        if !seen.is_empty() {
            seen.remove(id);
        }
    }

    /// How far past its due time the most overdue message is at `now`;
    /// forgets messages not seen for a while.
    pub fn oldest(&self, now: SystemTime) -> Option<Duration> {
        let now_ms = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let mut seen = self.seen.lock().expect("overdue poisoned");
        seen.retain(|_, (_, last)| last.elapsed() < OVERDUE_FORGOTTEN_AFTER);
        seen.values()
            .map(|(due, _)| now_ms.saturating_sub(*due))
            .max()
            .and_then(|late| u64::try_from(late).ok())
            .map(Duration::from_millis)
    }
}

/// The control consumer's work on each delivery of `acemq.schedule.due`.
pub struct Control {
    publisher: Publisher,
    metrics: Arc<Metrics>,
    holds: Arc<Semaphore>,
    shutdown: CancellationToken,
}

/// What became of one delivery, for the log and the metrics.
enum Moved {
    Hopped(&'static Rung),
    Delivered,
}

/// A publish that did not move the message on: the hop down `rung`, or
/// (`None`) the final delivery.
struct NotMoved {
    rung: Option<&'static Rung>,
    error: PublishError,
}

impl Control {
    pub fn new(
        publish_link: Arc<PublishLink>,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            publisher: Publisher::new(publish_link),
            metrics,
            holds: Arc::new(Semaphore::new(HOLD_PLACES)),
            shutdown,
        }
    }

    /// The subscription: the control queue, prefetch 50, each delivery
    /// worked on at once (most of the time is spent waiting for a confirm).
    #[must_use]
    pub fn subscription() -> SubscriptionSpec {
        SubscriptionSpec {
            queue: DUE_QUEUE.to_string(),
            prefetch: CONTROL_PREFETCH,
            concurrency: usize::from(CONTROL_PREFETCH),
            ends_after: None,
            stream: None,
            consumer_tag: None,
            stream_protocol: None,
        }
    }

    /// Moves one message on, then settles it.
    pub async fn handle(self: Arc<Self>, received: Received) {
        let Received {
            properties,
            body,
            receipt,
            slot: _slot,
            ..
        } = received;
        let id = properties
            .message_id()
            .as_ref()
            .map_or_else(String::new, |id| id.to_string());
        let schedule = match Schedule::read(properties.headers().as_ref()) {
            Ok(schedule) => schedule,
            Err(refused) => {
                tracing::warn!(
                    queue = DUE_QUEUE,
                    message_id = %id,
                    reason = %refused,
                    "a message on the scheduler's control queue cannot be scheduled: rejected"
                );
                self.metrics
                    .scheduler
                    .refused
                    .get_or_create(&ReasonLabel {
                        reason: refused.label().to_string(),
                    })
                    .inc();
                receipt.reject().await;
                return;
            }
        };
        let moved = self.move_on(&properties, &body, &schedule).await;
        let settled = match moved {
            Ok(moved) => {
                self.count(&moved, &schedule, &id);
                Ok(())
            }
            Err(NotMoved { error, .. }) if error.is_broker_trouble() => Err(error),
            Err(NotMoved { rung: None, error }) => {
                self.undeliverable(&properties, &body, &schedule, &id, error)
                    .await
            }
            Err(NotMoved {
                rung: Some(rung),
                error,
            }) => {
                self.rung_refused(&properties, &body, &id, rung, error)
                    .await
            }
        };
        match settled {
            Ok(()) => receipt.ack().await,
            Err(e) => {
                tracing::warn!(
                    queue = DUE_QUEUE,
                    message_id = %id,
                    error = %e,
                    "a scheduled message could not be moved on; it goes back to the control queue"
                );
                tokio::select! {
                    _ = tokio::time::sleep(BROKER_TROUBLE_PAUSE) => {}
                    _ = self.shutdown.cancelled() => {}
                    _ = receipt.lost() => {}
                }
                if !receipt.is_lost() {
                    receipt.requeue().await;
                }
            }
        }
    }

    /// Publishes the message to where it goes next: its next rung, or once
    /// due (after a hold of under a second, when a place is free) its final
    /// exchange.
    async fn move_on(
        &self,
        properties: &lapin::BasicProperties,
        body: &Bytes,
        schedule: &Schedule,
    ) -> Result<Moved, NotMoved> {
        let hold = self.holds.clone().try_acquire_owned().ok();
        let left = schedule.left_ms(crate::envelope::now_ms());
        match step(left, hold.is_some()) {
            Step::Hop(rung) => {
                drop(hold);
                let hop = wire::hop(properties, body, rung.name);
                match self.publisher.publish(&hop).await {
                    Ok(()) => Ok(Moved::Hopped(rung)),
                    Err(error) => Err(NotMoved {
                        rung: Some(rung),
                        error,
                    }),
                }
            }
            Step::Hold(wait) => {
                // Under a second: a shutdown meanwhile delivers it early
                // rather than hold the drain.
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = self.shutdown.cancelled() => {}
                }
                drop(hold);
                self.deliver(properties, body, schedule).await
            }
            Step::Deliver => {
                drop(hold);
                self.deliver(properties, body, schedule).await
            }
        }
    }

    async fn deliver(
        &self,
        properties: &lapin::BasicProperties,
        body: &Bytes,
        schedule: &Schedule,
    ) -> Result<Moved, NotMoved> {
        let delivery = wire::final_delivery(properties, body, schedule);
        match self.publisher.publish(&delivery).await {
            Ok(()) => Ok(Moved::Delivered),
            Err(error) => Err(NotMoved { rung: None, error }),
        }
    }

    /// A rung did not take the message (an operator deleted it, say; the
    /// host declares it again on its next connection): it waits on the 10 s
    /// rung instead, and its next hop tries again. `Err` when that was the
    /// 10 s rung, or that publish failed too: it goes back to the control
    /// queue after a pause.
    async fn rung_refused(
        &self,
        properties: &lapin::BasicProperties,
        body: &Bytes,
        id: &str,
        rung: &'static Rung,
        failure: PublishError,
    ) -> Result<(), PublishError> {
        if rung == UNDELIVERABLE_WAIT {
            return Err(failure);
        }
        tracing::warn!(
            queue = DUE_QUEUE,
            message_id = %id,
            rung = rung.name,
            error = %failure,
            "a rung did not take a scheduled message; it waits on {} instead",
            UNDELIVERABLE_WAIT.name
        );
        let wait = wire::hop(properties, body, UNDELIVERABLE_WAIT.name);
        self.publisher.publish(&wait).await
    }

    /// The final publish failed for the message's sake (nothing bound to
    /// its routing key, the broker refused it): it waits on the 10 s rung
    /// and is tried again. `Err` when even that publish failed.
    async fn undeliverable(
        &self,
        properties: &lapin::BasicProperties,
        body: &Bytes,
        schedule: &Schedule,
        id: &str,
        failure: PublishError,
    ) -> Result<(), PublishError> {
        let reason = match &failure {
            PublishError::Unroutable { .. } => "unroutable",
            _ => "refused",
        };
        tracing::warn!(
            queue = DUE_QUEUE,
            message_id = %id,
            exchange = %schedule.exchange,
            routing_key = %schedule.routing_key,
            error = %failure,
            "a scheduled message is due but could not be delivered; it waits {} s and is tried again",
            UNDELIVERABLE_WAIT.ttl_ms / 1000
        );
        let scheduler = &self.metrics.scheduler;
        scheduler
            .undeliverable
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
        scheduler.overdue.note(id, schedule.due_at_ms);
        let wait = wire::hop(properties, body, UNDELIVERABLE_WAIT.name);
        self.publisher.publish(&wait).await
    }

    fn count(&self, moved: &Moved, schedule: &Schedule, id: &str) {
        let scheduler = &self.metrics.scheduler;
        match moved {
            Moved::Hopped(rung) => {
                scheduler
                    .hops
                    .get_or_create(&RungLabel {
                        rung: rung.name.to_string(),
                    })
                    .inc();
            }
            Moved::Delivered => {
                let late_ms = -schedule.left_ms(crate::envelope::now_ms());
                scheduler.delivered.inc();
                scheduler.lateness.observe(late_ms.max(0) as f64 / 1000.0);
                scheduler.overdue.delivered(id);
                tracing::debug!(
                    message_id = %id,
                    exchange = %schedule.exchange,
                    routing_key = %schedule.routing_key,
                    late_ms,
                    "scheduled message delivered"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_or_more_left_hops_down_the_largest_rung() {
        assert_eq!(step(75_000, true), Step::Hop(&RUNGS[2]));
        assert_eq!(step(1_000, true), Step::Hop(&RUNGS[4]));
    }

    #[test]
    fn under_a_second_is_held_to_its_due_time_when_a_place_is_free() {
        assert_eq!(step(400, true), Step::Hold(Duration::from_millis(400)));
        assert_eq!(step(400, false), Step::Deliver);
        assert_eq!(step(0, true), Step::Deliver);
        assert_eq!(step(-3_000, true), Step::Deliver);
    }

    #[test]
    fn overdue_messages_are_tracked_until_delivered_and_the_oldest_shows() {
        let overdue = Overdue::default();
        let now = SystemTime::now();
        let now_ms = now.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
        assert_eq!(overdue.oldest(now), None);
        overdue.note("a", now_ms - 30_000);
        overdue.note("b", now_ms - 5_000);
        assert_eq!(overdue.oldest(now), Some(Duration::from_secs(30)));
        overdue.delivered("a");
        assert_eq!(overdue.oldest(now), Some(Duration::from_secs(5)));
        overdue.delivered("b");
        assert_eq!(overdue.oldest(now), None);
    }
}
