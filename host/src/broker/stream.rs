//! Where a stream consumer starts reading, and where it resumes after its
//! subscription ends (a lost connection, a restart of the consumer).
//!
//! Where it starts is a [`StreamOffset`] (`offset.rs`). After a
//! subscription ends, the next one resumes from the lowest offset whose
//! work is not done (or just past the highest one read, when all of it
//! is), not from the configured offset: `first` would read the whole
//! stream again after each lost connection, and `next` would skip what was
//! appended meanwhile. Done means handled, outputs confirmed: whether its
//! ack reached the broker does not matter, since a stream keeps every
//! message whatever its readers ack. So a delivery handled after its
//! connection died but before the next subscription began is not read
//! again; one still running then is. A checkpoint (`checkpoint.rs`) keeps that
//! position across restarts: saved every so many acks, every few seconds
//! and when the subscription stops, and read when the consumer first
//! subscribes. It overrides the configured offset once it exists.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::Connection;

use super::checkpoint::Checkpoint;
pub use super::offset::{OFFSET_ARGUMENT, StreamOffset};

/// The newest offset `stream` holds: a short-lived consumer reads from
/// `last` (the newest chunk) until nothing more comes for a moment, and the
/// highest offset it saw is the answer. `None` for an empty stream. It acks
/// nothing it must not: a stream keeps every message whatever its readers do.
pub async fn newest_offset(connection: &Connection, stream: &str) -> lapin::Result<Option<u64>> {
    use futures::StreamExt as _;
    use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
    let channel = connection.create_channel().await?;
    channel
        .basic_qos(1000, BasicQosOptions { global: false })
        .await?;
    let mut arguments = lapin::types::FieldTable::default();
    arguments.insert(OFFSET_ARGUMENT.into(), StreamOffset::Last.to_amqp());
    let tag = format!("acemq-host.probe.{}", uuid::Uuid::new_v4().simple());
    let mut deliveries = channel
        .basic_consume(
            stream.into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            arguments,
        )
        .await?;
    let mut newest = None;
    while let Ok(Some(Ok(delivery))) =
        tokio::time::timeout(Duration::from_millis(200), deliveries.next()).await
    {
        if let Some(offset) = StreamOffset::of_delivery(delivery.properties.headers().as_ref()) {
            newest = Some(newest.map_or(offset, |n: u64| n.max(offset)));
        }
    }
    let _ = channel
        .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
        .await;
    let _ = channel.close(200, "probe done".into()).await;
    Ok(newest)
}

/// How often a stream's newest offset is probed for the lag metric.
pub const PROBE_EVERY: Duration = Duration::from_secs(30);

/// Probes `stream`'s newest offset on `link`'s connection every
/// [`PROBE_EVERY`], for `position`'s lag, until `stop` is cancelled.
pub async fn probe_newest(
    link: std::sync::Arc<super::link::Link>,
    stream: String,
    position: std::sync::Arc<StreamPosition>,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        let Some((connection, _)) = link.up(&stop).await else {
            return;
        };
        match newest_offset(&connection, &stream).await {
            Ok(Some(newest)) => position.set_newest(newest),
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(stream = %stream, error = %e, "cannot probe the stream's newest offset now")
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(PROBE_EVERY) => {}
        }
    }
}

/// A stream consumer's reading position, shared by its successive
/// subscriptions.
#[derive(Debug)]
pub struct StreamPosition {
    configured: StreamOffset,
    state: Mutex<PositionState>,
    checkpoint: Option<Checkpoint>,
    /// The newest offset the stream held when last probed (see
    /// [`newest_offset`]).
    newest: Mutex<Option<u64>>,
    /// The label of the code that handled the last delivery (a plugin
    /// version); a change saves the checkpoint first.
    handled_by: Mutex<Option<String>>,
}

#[derive(Debug, Default)]
struct PositionState {
    /// Counts subscriptions: delivery tags restart with each, so a report
    /// of an earlier one (a delivery it handled late) must not be taken
    /// for one of the current one's.
    generation: u64,
    /// Offsets of the current subscription's deliveries whose work is not
    /// done, by delivery tag.
    pending: BTreeMap<u64, u64>,
    /// One past the highest offset read so far.
    next: Option<u64>,
    /// Deliveries done since the checkpoint was last saved, and when that
    /// was.
    done_since_save: u64,
    saved_at: Option<std::time::Instant>,
}

impl PositionState {
    /// The lowest offset not done, else just past the highest read.
    fn resume(&self) -> Option<u64> {
        self.pending.values().min().copied().or(self.next)
    }
}

impl StreamPosition {
    pub fn new(configured: StreamOffset) -> Self {
        Self {
            configured,
            state: Mutex::new(PositionState::default()),
            checkpoint: None,
            newest: Mutex::new(None),
            handled_by: Mutex::new(None),
        }
    }

    /// A delivery was handled by `version` (a plugin version). When that
    /// differs from the last one (a hot swap), the checkpoint is saved
    /// first: the position where the new version took over, which
    /// `stream reset` can return to should it have to be rolled back.
    pub fn handled_by(&self, version: &str) {
        let mut last = self.handled_by.lock().expect("stream position poisoned");
        match last.as_deref() {
            Some(previous) if previous != version => {
                let mut state = self.state.lock().expect("stream position poisoned");
                tracing::info!(offset = ?state.resume(), from = %previous, to = %version, "a new plugin version reads the stream; checkpoint saved where it took over");
                self.save_locked(&mut state);
            }
            Some(_) => return,
            None => {}
        }
        *last = Some(version.to_string());
    }

    /// Records the stream's newest offset, as probed.
    pub fn set_newest(&self, offset: u64) {
        *self.newest.lock().expect("stream position poisoned") = Some(offset);
    }

    /// How many messages the consumer is behind: from where it resumes to
    /// the newest offset probed; `None` before a probe.
    pub fn lag(&self) -> Option<u64> {
        let newest = (*self.newest.lock().expect("stream position poisoned"))?;
        let resume = self.progress().0.unwrap_or(0);
        Some((newest + 1).saturating_sub(resume))
    }

    /// Keeps the position in `checkpoint` too.
    pub fn with_checkpoint(mut self, checkpoint: Checkpoint) -> Self {
        self.checkpoint = Some(checkpoint);
        self
    }

    /// Where the next subscription, on `connection`, starts: the checkpoint,
    /// else the configured offset, the first time; afterwards the lowest
    /// offset not done, else just past the highest read. With the handle
    /// through which that subscription reports its deliveries.
    pub async fn start(
        self: &Arc<Self>,
        connection: &Connection,
    ) -> (StreamOffset, SubscriptionPosition) {
        let (resume, reports) = self.begin();
        let Some(checkpoint) = &self.checkpoint else {
            return (resume.map_or(self.configured, StreamOffset::At), reports);
        };
        checkpoint.attach(connection).await;
        if let Some(offset) = resume {
            return (StreamOffset::At(offset), reports);
        }
        let start = match checkpoint.load(connection).await {
            Ok(Some(offset)) => offset,
            Ok(None) => self.configured,
            Err(e) => {
                tracing::error!(error = %e, offset = ?self.configured, "cannot read the stream checkpoint; starting from the configured offset");
                self.configured
            }
        };
        (start, reports)
    }

    /// A new subscription begins: where this process would resume, if it
    /// read anything yet, and the new subscription's handle. What an
    /// earlier subscription still has running is read again (its offsets
    /// count in the resume point); its late reports are ignored.
    fn begin(self: &Arc<Self>) -> (Option<u64>, SubscriptionPosition) {
        let mut state = self.state.lock().expect("stream position poisoned");
        let resume = state.resume();
        state.pending.clear();
        state.generation += 1;
        let reports = SubscriptionPosition {
            position: self.clone(),
            generation: state.generation,
        };
        (resume, reports)
    }

    /// For the metrics: the offset the consumer would resume from now, and
    /// how long ago its checkpoint was last saved (`None`: never, or no
    /// checkpoint).
    pub fn progress(&self) -> (Option<u64>, Option<Duration>) {
        let state = self.state.lock().expect("stream position poisoned");
        let saved = self
            .checkpoint
            .as_ref()
            .and(state.saved_at)
            .map(|at| at.elapsed());
        (state.resume(), saved)
    }

    /// Saves the position now and waits until it is stored (a
    /// subscription stops; whatever it could finish is done).
    pub async fn finish(&self) {
        {
            let mut state = self.state.lock().expect("stream position poisoned");
            self.save_locked(&mut state);
        }
        if let Some(checkpoint) = &self.checkpoint {
            checkpoint.flush().await;
        }
    }

    fn save_locked(&self, state: &mut PositionState) {
        let (Some(checkpoint), Some(offset)) = (&self.checkpoint, state.resume()) else {
            return;
        };
        match checkpoint.save(offset) {
            Ok(()) => {
                state.done_since_save = 0;
                state.saved_at = Some(std::time::Instant::now());
            }
            Err(e) => {
                tracing::error!(error = %e, offset, "cannot save the stream checkpoint; it is tried again")
            }
        }
    }

    /// A delivery of subscription `generation` at `offset` arrived with
    /// `tag`.
    fn received(&self, generation: u64, tag: u64, offset: u64) {
        let mut state = self.state.lock().expect("stream position poisoned");
        if state.generation != generation {
            return;
        }
        state.pending.insert(tag, offset);
        let past = offset.saturating_add(1);
        state.next = Some(state.next.map_or(past, |n| n.max(past)));
    }

    /// The work of subscription `generation`'s delivery `tag` is done (its
    /// ack may still be on its way, or never arrive).
    fn done(&self, generation: u64, tag: u64) {
        let mut state = self.state.lock().expect("stream position poisoned");
        if state.generation != generation || state.pending.remove(&tag).is_none() {
            return;
        }
        state.done_since_save += 1;
        if let Some(checkpoint) = &self.checkpoint {
            let cadence = checkpoint.cadence();
            let due = state.done_since_save >= cadence.every
                || state
                    .saved_at
                    .is_none_or(|at| at.elapsed() >= cadence.interval);
            if due {
                self.save_locked(&mut state);
            }
        }
    }
}

/// One subscription's handle on its consumer's [`StreamPosition`]: what
/// it received and what it finished. Reports through the handle of a
/// subscription that has been replaced are ignored.
#[derive(Debug, Clone)]
pub struct SubscriptionPosition {
    position: Arc<StreamPosition>,
    generation: u64,
}

impl SubscriptionPosition {
    /// A delivery at `offset` arrived with `tag`.
    pub fn received(&self, tag: u64, offset: u64) {
        self.position.received(self.generation, tag, offset);
    }

    /// The delivery's work is done: handled, its outputs confirmed.
    pub fn done(&self, tag: u64) {
        self.position.done(self.generation, tag);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::checkpoint::{Cadence, FileCheckpoint};

    #[test]
    fn a_new_subscription_resumes_at_the_lowest_offset_not_done() {
        let position = Arc::new(StreamPosition::new(StreamOffset::First));
        let (resume, first) = position.begin();
        assert_eq!(resume, None, "nothing read: the configured offset");
        for (tag, offset) in [(1, 100), (2, 101), (3, 102), (4, 103)] {
            first.received(tag, offset);
        }
        first.done(1);
        first.done(2);
        first.done(4);
        // 102 was never done: it is read again, and so is what follows.
        let (resume, second) = position.begin();
        assert_eq!(resume, Some(102));
        second.received(1, 102);
        second.received(2, 103);
        // The first subscription finishes 102 late: its tag 3 is not the
        // second's, and the second's tag 1 (102 again) stays pending.
        first.done(3);
        first.done(1);
        assert_eq!(position.progress().0, Some(102));
        second.done(1);
        second.done(2);
        // Everything of the second subscription done: just past the highest.
        let (resume, _) = position.begin();
        assert_eq!(resume, Some(104));
    }

    #[test]
    fn a_checkpoint_is_saved_every_so_many_deliveries_done() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orders.checkpoint");
        let cadence = Cadence {
            every: 2,
            interval: Duration::from_secs(3600),
        };
        let file = || FileCheckpoint::new(path.clone(), cadence);
        let position = Arc::new(
            StreamPosition::new(StreamOffset::First).with_checkpoint(Checkpoint::File(file())),
        );
        let (_, reading) = position.begin();
        for (tag, offset) in [(1, 10), (2, 11), (3, 12)] {
            reading.received(tag, offset);
        }
        // The first done saves (nothing saved yet); then every second one.
        let saved = || file().load().unwrap();
        reading.done(1);
        assert_eq!(saved(), Some(StreamOffset::At(11)));
        reading.done(2);
        assert_eq!(saved(), Some(StreamOffset::At(11)));
        reading.done(3);
        assert_eq!(saved(), Some(StreamOffset::At(13)));
        let (resume, age) = position.progress();
        assert_eq!(resume, Some(13));
        assert!(age.is_some_and(|a| a < Duration::from_secs(60)), "{age:?}");
        let without = StreamPosition::new(StreamOffset::First);
        assert_eq!(without.progress(), (None, None));
        // Lag: from where it resumes (13) to the newest probed (19).
        assert_eq!(position.lag(), None, "before a probe");
        position.set_newest(19);
        assert_eq!(position.lag(), Some(7));
        // A new version takes over: the checkpoint is saved at once.
        reading.received(4, 13);
        position.handled_by("v1");
        reading.done(4);
        std::fs::remove_file(&path).unwrap();
        position.handled_by("v1");
        assert_eq!(saved(), None, "same version: nothing saved");
        reading.received(5, 14);
        position.handled_by("v2");
        assert_eq!(saved(), Some(StreamOffset::At(14)));
    }
}
