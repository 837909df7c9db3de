//! Where a stream consumer starts reading, and where it resumes after its
//! subscription ends (a lost connection, a restart of the consumer).
//!
//! Where it starts is a [`StreamOffset`] (`offset.rs`). After a
//! subscription ends, the next one resumes from the lowest offset
//! whose ack was not sent (or just past the highest one read, when every
//! ack went out), not from the configured offset: `first` would read the
//! whole stream again after each lost connection, and `next` would skip
//! what was appended meanwhile. A checkpoint (`checkpoint.rs`) keeps that
//! position across restarts: saved every so many acks, every few seconds
//! and when the subscription stops, and read when the consumer first
//! subscribes. It overrides the configured offset once it exists.

use std::collections::BTreeMap;
use std::sync::Mutex;
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
    /// Offsets of deliveries whose ack has not been sent, by delivery tag.
    unacked: BTreeMap<u64, u64>,
    /// One past the highest offset read so far.
    next: Option<u64>,
    /// Acks since the checkpoint was last saved, and when that was.
    acks_since_save: u64,
    saved_at: Option<std::time::Instant>,
}

impl PositionState {
    /// The lowest offset not acked, else just past the highest read.
    fn resume(&self) -> Option<u64> {
        self.unacked.values().min().copied().or(self.next)
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
    /// offset not acked, else just past the highest read.
    pub async fn start(&self, connection: &Connection) -> StreamOffset {
        let resume = self.begin();
        let Some(checkpoint) = &self.checkpoint else {
            return resume.map_or(self.configured, StreamOffset::At);
        };
        checkpoint.attach(connection).await;
        if let Some(offset) = resume {
            return StreamOffset::At(offset);
        }
        match checkpoint.load(connection).await {
            Ok(Some(offset)) => offset,
            Ok(None) => self.configured,
            Err(e) => {
                tracing::error!(error = %e, offset = ?self.configured, "cannot read the stream checkpoint; starting from the configured offset");
                self.configured
            }
        }
    }

    /// A new subscription begins: where this process would resume, if it
    /// read anything yet. Its delivery tags start again, so the old ones
    /// are dropped.
    fn begin(&self) -> Option<u64> {
        let mut state = self.state.lock().expect("stream position poisoned");
        let resume = state.resume();
        state.unacked.clear();
        resume
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
    /// subscription stops; whatever acks it could send went out).
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
                state.acks_since_save = 0;
                state.saved_at = Some(std::time::Instant::now());
            }
            Err(e) => {
                tracing::error!(error = %e, offset, "cannot save the stream checkpoint; it is tried again")
            }
        }
    }

    /// A delivery at `offset` arrived with `tag`.
    pub fn received(&self, tag: u64, offset: u64) {
        let mut state = self.state.lock().expect("stream position poisoned");
        state.unacked.insert(tag, offset);
        let past = offset.saturating_add(1);
        state.next = Some(state.next.map_or(past, |n| n.max(past)));
    }

    /// Acks for every tag up to `tag` (`multiple`) or for `tag` alone went
    /// out.
    pub fn acked(&self, tag: u64, multiple: bool) {
        let mut state = self.state.lock().expect("stream position poisoned");
        let before = state.unacked.len();
        if multiple {
            state.unacked = state.unacked.split_off(&(tag + 1));
        } else {
            state.unacked.remove(&tag);
        }
        state.acks_since_save += (before - state.unacked.len()) as u64;
        if let Some(checkpoint) = &self.checkpoint {
            let cadence = checkpoint.cadence();
            let due = state.acks_since_save >= cadence.every
                || state
                    .saved_at
                    .is_none_or(|at| at.elapsed() >= cadence.interval);
            if due {
                self.save_locked(&mut state);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::checkpoint::{Cadence, FileCheckpoint};

    #[test]
    fn a_new_subscription_resumes_at_the_lowest_offset_not_acked() {
        let position = StreamPosition::new(StreamOffset::First);
        assert_eq!(
            position.begin(),
            None,
            "nothing read: the configured offset"
        );
        for (tag, offset) in [(1, 100), (2, 101), (3, 102), (4, 103)] {
            position.received(tag, offset);
        }
        position.acked(2, true);
        position.acked(4, false);
        // 102 was never acked: it is read again, and so is what follows.
        assert_eq!(position.begin(), Some(102));
        // Everything of the next subscription acked: just past the highest.
        position.received(1, 102);
        position.received(2, 103);
        position.acked(2, true);
        assert_eq!(position.begin(), Some(104));
    }

    #[test]
    fn a_checkpoint_is_saved_every_so_many_acks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orders.checkpoint");
        let cadence = Cadence {
            every: 2,
            interval: Duration::from_secs(3600),
        };
        let file = || FileCheckpoint::new(path.clone(), cadence);
        let position =
            StreamPosition::new(StreamOffset::First).with_checkpoint(Checkpoint::File(file()));
        for (tag, offset) in [(1, 10), (2, 11), (3, 12)] {
            position.received(tag, offset);
        }
        // The first ack saves (nothing saved yet); then every second ack.
        let saved = || file().load().unwrap();
        position.acked(1, false);
        assert_eq!(saved(), Some(StreamOffset::At(11)));
        position.acked(2, false);
        assert_eq!(saved(), Some(StreamOffset::At(11)));
        position.acked(3, false);
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
        position.received(4, 13);
        position.handled_by("v1");
        position.acked(4, false);
        std::fs::remove_file(&path).unwrap();
        position.handled_by("v1");
        assert_eq!(saved(), None, "same version: nothing saved");
        position.received(5, 14);
        position.handled_by("v2");
        assert_eq!(saved(), Some(StreamOffset::At(14)));
    }
}
