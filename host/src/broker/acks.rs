//! Coalesced acknowledgements for one consumer channel.
//!
//! One `basic.ack` per message costs the host (and the broker) more than the
//! message's handling: a bare lapin loop acking each message reaches about a
//! quarter of the rate of one acking every 20th with `multiple`. So a
//! delivery whose work is done is only marked *ready*; ready deliveries are
//! acknowledged together, by one `multiple` ack up to the highest ready tag
//! below every delivery still unsettled, soon after (when a batch is full,
//! or after a few milliseconds at most).
//!
//! The rule that keeps this exact: `ack(multiple, T)` settles every
//! unacknowledged delivery of the channel up to `T`, so `T` must lie below
//! the lowest delivery that is still running, waiting, or whose nack is not
//! yet written. Ready deliveries above that one are acked one by one when
//! the batch is flushed anyway, so a slow delivery never holds back the
//! others' acks for longer than the linger.
//!
//! [`AckLedger`] is the bookkeeping alone (no I/O); [`AckBatcher`] sends.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lapin::Channel;

use super::stream::SubscriptionPosition;
use lapin::options::BasicAckOptions;
use std::sync::Mutex;

/// How long a ready delivery may wait for its ack to be sent.
const ACK_LINGER: Duration = Duration::from_millis(5);

/// One `basic.ack` to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AckFrame {
    delivery_tag: u64,
    multiple: bool,
}

/// Which deliveries of a channel are unsettled and which are ready to ack.
#[derive(Debug, Default)]
struct AckLedger {
    /// Received (when), and neither ready nor settled otherwise.
    unsettled: BTreeMap<u64, Instant>,
    /// Work done, ack not sent yet.
    ready: BTreeSet<u64>,
}

impl AckLedger {
    /// A delivery was received (it is unsettled until said otherwise).
    fn received(&mut self, tag: u64) {
        self.unsettled.insert(tag, Instant::now());
    }

    /// When the oldest unsettled delivery was received.
    fn oldest(&self) -> Option<Instant> {
        // Tags grow with time on a channel: the lowest is the oldest.
        self.unsettled.first_key_value().map(|(_, at)| *at)
    }

    /// The delivery's work is done: it only needs its ack. False when it
    /// was not unsettled (already ready, or forgotten).
    fn ready(&mut self, tag: u64) -> bool {
        let unsettled = self.unsettled.remove(&tag).is_some();
        if unsettled {
            self.ready.insert(tag);
        }
        unsettled
    }

    /// The delivery was settled another way (a nack already written), or
    /// will never be settled on this channel (it is left to the close).
    fn forget(&mut self, tag: u64) {
        self.unsettled.remove(&tag);
    }

    fn ready_count(&self) -> usize {
        self.ready.len()
    }

    /// The acks to send now: one `multiple` ack for the ready deliveries
    /// below the lowest unsettled one; with `everything`, also one single
    /// ack for each ready delivery above it. Taken acks leave the ledger.
    fn take(&mut self, everything: bool) -> Vec<AckFrame> {
        let mut frames = Vec::new();
        let below = match self.unsettled.first_key_value() {
            Some((&lowest, _)) => {
                let above = self.ready.split_off(&lowest);
                std::mem::replace(&mut self.ready, above)
            }
            None => std::mem::take(&mut self.ready),
        };
        match below.len() {
            0 => {}
            1 => frames.push(AckFrame {
                delivery_tag: *below.first().expect("one tag"),
                multiple: false,
            }),
            _ => frames.push(AckFrame {
                delivery_tag: *below.last().expect("tags"),
                multiple: true,
            }),
        }
        if everything {
            frames.extend(
                std::mem::take(&mut self.ready)
                    .into_iter()
                    .map(|tag| AckFrame {
                        delivery_tag: tag,
                        multiple: false,
                    }),
            );
        }
        frames
    }
}

/// When a subscription's oldest unsettled delivery arrived, readable
/// without a lock (for the metrics endpoint, at scrape time).
#[derive(Debug)]
pub struct OldestUnsettled {
    base: Instant,
    /// Nanoseconds after `base`; `u64::MAX` when nothing is unsettled.
    since_base: AtomicU64,
}

impl Default for OldestUnsettled {
    fn default() -> Self {
        Self {
            base: Instant::now(),
            since_base: AtomicU64::new(u64::MAX),
        }
    }
}

impl OldestUnsettled {
    fn set(&self, oldest: Option<Instant>) {
        let value = oldest.map_or(u64::MAX, |at| {
            u64::try_from(at.saturating_duration_since(self.base).as_nanos())
                .unwrap_or(u64::MAX - 1)
        });
        self.since_base.store(value, Ordering::Relaxed);
    }

    /// How long the oldest unsettled delivery has waited; `None` when
    /// every delivery is settled.
    pub fn age(&self) -> Option<Duration> {
        match self.since_base.load(Ordering::Relaxed) {
            u64::MAX => None,
            nanos => Some((self.base + Duration::from_nanos(nanos)).elapsed()),
        }
    }
}

/// The ledger of one channel, and the sending of its acks.
pub struct AckBatcher {
    channel: Channel,
    /// Locked only to update it or take acks from it, never across an
    /// await: receiving a delivery or marking one ready never waits for an
    /// ack to be written.
    ledger: Mutex<AckLedger>,
    /// Held while acks are taken from the ledger *and* written: two flushes
    /// racing could otherwise write `multiple` acks out of order, and the
    /// broker closes a channel that acks a tag twice.
    sending: tokio::sync::Mutex<()>,
    /// Ready deliveries that trigger a flush without waiting for the linger.
    batch: usize,
    oldest: Arc<OldestUnsettled>,
    /// A stream consumer's position, told of every delivery done.
    stream: Option<SubscriptionPosition>,
}

impl AckBatcher {
    /// `prefetch` sizes the batch: a quarter of the window, so the broker
    /// always has room to deliver while acks wait.
    pub fn new(channel: Channel, prefetch: u16, stream: Option<SubscriptionPosition>) -> Self {
        Self {
            channel,
            ledger: Mutex::new(AckLedger::default()),
            sending: tokio::sync::Mutex::new(()),
            batch: usize::from(prefetch / 4).clamp(1, 64),
            oldest: Arc::new(OldestUnsettled::default()),
            stream,
        }
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, AckLedger> {
        self.ledger.lock().expect("ack ledger poisoned")
    }

    /// The age of the oldest delivery not yet settled, kept current.
    pub fn oldest(&self) -> Arc<OldestUnsettled> {
        self.oldest.clone()
    }

    pub fn received(&self, tag: u64) {
        let mut ledger = self.ledger();
        ledger.received(tag);
        self.oldest.set(ledger.oldest());
    }

    /// Marks the delivery done; its ack is sent with the next flush.
    pub async fn ready(&self, tag: u64) {
        let (was_unsettled, full) = {
            let mut ledger = self.ledger();
            let was_unsettled = ledger.ready(tag);
            self.oldest.set(ledger.oldest());
            (was_unsettled, ledger.ready_count() >= self.batch)
        };
        if was_unsettled && let Some(stream) = &self.stream {
            stream.done(tag);
        }
        if full {
            self.flush(false).await;
        }
    }

    /// Call once a nack for `tag` has been written (or when it is left to
    /// the channel's close), never before: until then no `multiple` ack may
    /// cover it.
    pub fn forget(&self, tag: u64) {
        let mut ledger = self.ledger();
        ledger.forget(tag);
        self.oldest.set(ledger.oldest());
    }

    /// Sends what can be sent; with `everything`, every ready ack.
    pub async fn flush(&self, everything: bool) {
        let _sending = self.sending.lock().await;
        let frames = self.ledger().take(everything);
        for frame in frames {
            let options = BasicAckOptions {
                multiple: frame.multiple,
            };
            if let Err(e) = self.channel.basic_ack(frame.delivery_tag, options).await {
                // The channel is gone: the broker requeues what it had not
                // been told, and it is handled again (at-least-once).
                if self.channel.status().connected() {
                    tracing::warn!(delivery_tag = frame.delivery_tag, multiple = frame.multiple, error = %e, "ack failed; the broker will redeliver");
                } else {
                    // The channel's loss is logged once, by its connection.
                    tracing::debug!(delivery_tag = frame.delivery_tag, error = %e, "ack on a closed channel; the broker redelivers");
                }
            }
        }
    }

    /// Flushes everything every [`ACK_LINGER`] until `stop` is cancelled.
    pub async fn run_linger(&self, stop: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(ACK_LINGER);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if self.ledger().ready_count() > 0 {
                self.flush(true).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(received: &[u64]) -> AckLedger {
        let mut ledger = AckLedger::default();
        for &tag in received {
            ledger.received(tag);
        }
        ledger
    }

    #[test]
    fn the_oldest_unsettled_delivery_is_the_lowest_tag_still_unsettled() {
        let mut ledger = ledger(&[1]);
        std::thread::sleep(Duration::from_millis(2));
        ledger.received(2);
        let first = ledger.oldest().unwrap();
        ledger.ready(1);
        let second = ledger.oldest().unwrap();
        assert!(second > first, "after 1 is ready, 2 is the oldest");
        ledger.forget(2);
        assert_eq!(ledger.oldest(), None);
        let oldest = OldestUnsettled::default();
        assert_eq!(oldest.age(), None);
        // Deliveries arrive after the subscription began (its base).
        std::thread::sleep(Duration::from_millis(60));
        oldest.set(Some(Instant::now() - Duration::from_millis(50)));
        assert!(oldest.age().unwrap() >= Duration::from_millis(50));
    }

    fn multiple(tag: u64) -> AckFrame {
        AckFrame {
            delivery_tag: tag,
            multiple: true,
        }
    }

    fn single(tag: u64) -> AckFrame {
        AckFrame {
            delivery_tag: tag,
            multiple: false,
        }
    }

    #[test]
    fn in_order_completions_become_one_multiple_ack() {
        let mut l = ledger(&[1, 2, 3, 4]);
        for tag in [1, 2, 3] {
            l.ready(tag);
        }
        assert_eq!(l.take(false), vec![multiple(3)]);
        assert_eq!(l.take(true), vec![], "nothing left to ack");
        l.ready(4);
        assert_eq!(l.take(false), vec![single(4)]);
    }

    #[test]
    fn a_multiple_ack_never_covers_a_running_delivery() {
        let mut l = ledger(&[1, 2, 3, 4, 5]);
        for tag in [1, 2, 4, 5] {
            l.ready(tag);
        }
        // 3 is still running: 1 and 2 may go together, 4 and 5 must wait...
        assert_eq!(l.take(false), vec![multiple(2)]);
        assert_eq!(l.ready_count(), 2);
        // ...or go one by one when everything is flushed.
        assert_eq!(l.take(true), vec![single(4), single(5)]);
        l.ready(3);
        assert_eq!(l.take(false), vec![single(3)]);
    }

    #[test]
    fn a_nacked_delivery_no_longer_blocks_and_is_never_acked() {
        let mut l = ledger(&[1, 2, 3]);
        l.ready(1);
        l.ready(3);
        assert_eq!(l.take(false), vec![single(1)]);
        // 2 was nacked (written): forgetting it lets 3 go, and a multiple
        // ack up to 3 would not touch 2 any more on the broker.
        l.forget(2);
        assert_eq!(l.take(false), vec![single(3)]);
        l.ready(2);
        assert_eq!(l.take(true), vec![], "a forgotten delivery is not acked");
    }

    #[test]
    fn deliveries_left_unsettled_hold_back_only_what_lies_above_them() {
        let mut l = ledger(&[10, 11, 12, 13]);
        l.ready(11);
        l.ready(13);
        assert_eq!(l.take(false), vec![], "10 is below both");
        assert_eq!(l.take(true), vec![single(11), single(13)]);
    }
}
