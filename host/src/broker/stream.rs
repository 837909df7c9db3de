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
//! again; one still running then is. The resume point only moves forward
//! through work done: where a subscription starts is its floor, so one that
//! ends before reading anything (its consume refused, its connection lost
//! again) leaves the position where it was.
//!
//! A checkpoint (`checkpoint.rs`) keeps that position across restarts:
//! asked for every so many deliveries done, every few seconds and when the
//! subscription stops, stored by a saver task of its own, and read when a
//! subscription starts without a position of this process's own. It
//! overrides the configured offset once it exists; one that cannot be read
//! fails the start, which is tried again. A consumer with a
//! `consumer_name` reads only while it holds that name's lease
//! (`lease.rs`): one host at a time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::Connection;
use tokio_util::sync::CancellationToken;

use super::checkpoint::{Checkpoint, Fence, Saves, keep_saving};
use super::lease::{self, Lease, NotTaken};
pub use super::offset::{OFFSET_ARGUMENT, StreamOffset};

/// Subscribes on `channel` to `stream` from `from`, with at most `prefetch`
/// deliveries unacknowledged, under the tag `{tag_prefix}.{random}` (a tag
/// of its own, so a read never collides with a host's consumer); returns
/// the tag and the deliveries. One reader's subscription: the probe's and
/// the replay's (`stream_read.rs`).
pub(super) async fn consume_from(
    channel: &lapin::Channel,
    stream: &str,
    from: StreamOffset,
    prefetch: u16,
    tag_prefix: &str,
) -> lapin::Result<(String, lapin::Consumer)> {
    use lapin::options::{BasicConsumeOptions, BasicQosOptions};
    channel
        .basic_qos(prefetch, BasicQosOptions { global: false })
        .await?;
    let mut arguments = lapin::types::FieldTable::default();
    arguments.insert(OFFSET_ARGUMENT.into(), from.to_amqp());
    let tag = format!("{tag_prefix}.{}", uuid::Uuid::new_v4().simple());
    let deliveries = channel
        .basic_consume(
            stream.into(),
            tag.as_str().into(),
            BasicConsumeOptions::default(),
            arguments,
        )
        .await?;
    Ok((tag, deliveries))
}

/// The newest offset `stream` holds: a short-lived consumer reads from
/// `last` (the newest chunk) until nothing more comes for a moment, and the
/// highest offset it saw is the answer. `None` for an empty stream. It acks
/// nothing it must not: a stream keeps every message whatever its readers do.
///
/// Bounded: on a stream appended to faster than the quiet moment, "until
/// nothing more comes" would never come, so it reads for at most
/// [`PROBE_LIMIT`] and answers with the highest offset seen by then; each
/// step with the broker is bounded too.
pub async fn newest_offset(connection: &Connection, stream: &str) -> lapin::Result<Option<u64>> {
    use futures::StreamExt as _;
    use lapin::options::BasicCancelOptions;
    let timed_out = || lapin::Error::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
    let channel = tokio::time::timeout(PROBE_LIMIT, connection.create_channel())
        .await
        .map_err(|_| timed_out())??;
    let consuming = consume_from(
        &channel,
        stream,
        StreamOffset::Last,
        1000,
        "acemq-host.probe",
    );
    let consumed = tokio::time::timeout(PROBE_LIMIT, consuming)
        .await
        .map_err(|_| timed_out())
        .and_then(|r| r);
    let (tag, mut deliveries) = match consumed {
        Ok(consumed) => consumed,
        Err(e) => {
            let _ =
                tokio::time::timeout(PROBE_LIMIT, channel.close(200, "probe failed".into())).await;
            return Err(e);
        }
    };
    let mut newest = None;
    let until = tokio::time::Instant::now() + PROBE_LIMIT;
    while tokio::time::Instant::now() < until {
        let quiet = Duration::from_millis(200).min(until - tokio::time::Instant::now());
        let Ok(Some(Ok(delivery))) = tokio::time::timeout(quiet, deliveries.next()).await else {
            break;
        };
        if let Some(offset) = StreamOffset::of_delivery(delivery.properties.headers().as_ref()) {
            newest = Some(newest.map_or(offset, |n: u64| n.max(offset)));
        }
    }
    let cancel = channel.basic_cancel(tag.as_str().into(), BasicCancelOptions::default());
    let _ = tokio::time::timeout(PROBE_LIMIT, cancel).await;
    let _ = tokio::time::timeout(PROBE_LIMIT, channel.close(200, "probe done".into())).await;
    Ok(newest)
}

/// The longest the newest-offset probe reads, and the longest each of its
/// steps with the broker may take.
pub const PROBE_LIMIT: Duration = Duration::from_secs(5);

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
pub struct StreamPosition {
    configured: StreamOffset,
    state: Mutex<PositionState>,
    checkpoint: Option<Arc<Checkpoint>>,
    /// The saves asked of the checkpoint's saver (see `checkpoint.rs`).
    saves: Arc<Saves>,
    /// For a consumer with a `consumer_name`: the name its lease is taken
    /// under, and the lease while a subscription holds it.
    lease: Option<(String, Arc<Mutex<Option<Lease>>>)>,
    /// Names this process in the checkpoints it writes.
    owner: String,
    /// Subscriptions that could not start because the checkpoint could not
    /// be read, or failed to take the lease for another reason.
    start_failures: AtomicU64,
    /// The newest offset the stream held when last probed (see
    /// [`newest_offset`]).
    newest: Mutex<Option<u64>>,
    /// The label of the code that handled the last delivery (a plugin
    /// version); a change saves the checkpoint first.
    handled_by: Mutex<Option<String>>,
}

impl std::fmt::Debug for StreamPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamPosition")
            .field("configured", &self.configured)
            .field("checkpoint", &self.checkpoint)
            .field("lease", &self.lease.as_ref().map(|(name, _)| name))
            .finish_non_exhaustive()
    }
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
    /// Where the current subscription started: every offset below it was
    /// done by an earlier one (or lies before where reading began). The
    /// resume point never goes below it, and a subscription that ends
    /// before reading anything leaves it where it was.
    floor: Option<u64>,
    /// One past the highest offset the current subscription read (at least
    /// the floor).
    next: Option<u64>,
    /// Deliveries done since the checkpoint was last asked to save.
    done_since_save: u64,
    save_asked_at: Option<Instant>,
}

impl PositionState {
    /// The lowest offset not done, else just past the highest read; never
    /// below the floor. It only moves forward through work done.
    fn resume(&self) -> Option<u64> {
        let lowest = self.pending.values().min().copied().or(self.next);
        match (lowest, self.floor) {
            (Some(lowest), Some(floor)) => Some(lowest.max(floor)),
            (lowest, floor) => lowest.or(floor),
        }
    }

    /// A subscription starts at `offset` (`None`: a position such as
    /// `first` or a time, whose offset is known once a delivery arrives).
    fn start_at(&mut self, offset: Option<u64>) {
        self.pending.clear();
        self.floor = offset;
        self.next = offset;
    }
}

/// Why a subscription could not start reading its stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// Another host holds the consumer name's lease: this one stands by.
    StandBy(String),
    /// The checkpoint could not be read, or the lease could not be asked
    /// for: retried with backoff, never answered by choosing an offset.
    Failed(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::StandBy(why) | StartError::Failed(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for StartError {}

/// The longest a subscription's stop waits for its last checkpoint to be
/// stored (the saver's own steps are bounded too; see `checkpoint.rs`).
pub const FLUSH_LIMIT: Duration = Duration::from_secs(10);

impl StreamPosition {
    pub fn new(configured: StreamOffset) -> Self {
        Self {
            configured,
            state: Mutex::new(PositionState::default()),
            checkpoint: None,
            saves: Arc::new(Saves::default()),
            lease: None,
            owner: format!("acemq-host.{}", uuid::Uuid::new_v4().simple()),
            start_failures: AtomicU64::new(0),
            newest: Mutex::new(None),
            handled_by: Mutex::new(None),
        }
    }

    /// Keeps the position in `checkpoint` too.
    pub fn with_checkpoint(mut self, checkpoint: Checkpoint) -> Self {
        self.checkpoint = Some(Arc::new(checkpoint));
        self
    }

    /// Keeps the position in what `make` builds from the checkpoint it
    /// has, if it has one (a consumer moved to the stream protocol keeps it
    /// in the broker's offset tracking, reading the old one until that
    /// holds an offset). Before the consumer starts.
    pub fn replace_checkpoint(&mut self, make: impl FnOnce(Checkpoint) -> Checkpoint) {
        let Some(current) = self.checkpoint.take() else {
            return;
        };
        let current = Arc::try_unwrap(current)
            .expect("a checkpoint is not shared before its consumer starts");
        self.checkpoint = Some(Arc::new(make(current)));
    }

    /// Reads only while holding the lease of `consumer_name` (see
    /// `lease.rs`): one reader of that name at a time, across hosts.
    pub fn with_lease(mut self, consumer_name: &str) -> Self {
        self.lease = Some((consumer_name.to_string(), Arc::new(Mutex::new(None))));
        self
    }

    /// Starts the task that stores the checkpoint, if there is one, until
    /// `stop` is cancelled; `publish` is the host's publish link, which a
    /// checkpoint kept in the broker is saved over. Once per consumer.
    pub fn spawn_saver(
        &self,
        publish: Option<Arc<super::link::Link>>,
        stop: CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let checkpoint = self.checkpoint.clone()?;
        let fence: Fence = match &self.lease {
            Some((_, lease)) => {
                let lease = lease.clone();
                Arc::new(move || {
                    lease
                        .lock()
                        .expect("lease poisoned")
                        .as_ref()
                        .is_some_and(Lease::held)
                })
            }
            None => Arc::new(|| true),
        };
        Some(tokio::spawn(keep_saving(
            checkpoint,
            self.saves.clone(),
            self.owner.clone(),
            publish,
            fence,
            stop,
        )))
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

    /// Where the next subscription, on `connection`, starts, with the
    /// handle through which it reports its deliveries.
    ///
    /// A named consumer first takes its lease on `connection` (another
    /// host holding it: [`StartError::StandBy`]). Then: where this process
    /// would resume, when it read anything yet and the checkpoint is its
    /// own (a checkpoint kept in the broker that another host wrote since
    /// is where that host left off, and wins); else the checkpoint; else,
    /// only when no checkpoint exists, the configured offset. A checkpoint
    /// that cannot be read fails the start ([`StartError::Failed`]): the
    /// subscription is tried again, and no offset is chosen for it.
    pub async fn start(
        self: &Arc<Self>,
        connection: &Connection,
    ) -> Result<(StreamOffset, SubscriptionPosition), StartError> {
        let (resume, reports) = self.begin();
        if let Some((name, slot)) = &self.lease {
            match Lease::take(connection, name).await {
                Ok(lease) => *slot.lock().expect("lease poisoned") = Some(lease),
                Err(NotTaken::Held) => {
                    return Err(StartError::StandBy(format!(
                        "another host reads this stream as consumer '{name}' (it holds the lease queue '{}'); this one stands by and takes over when that one stops",
                        lease::queue_name(name)
                    )));
                }
                Err(NotTaken::Failed(why)) => return Err(self.start_failed(why).await),
            }
        }
        let Some(checkpoint) = &self.checkpoint else {
            return Ok((resume.map_or(self.configured, StreamOffset::At), reports));
        };
        // A file is written by this process alone: what it read since is
        // newer than the file.
        if let (Checkpoint::File(_), Some(offset)) = (&**checkpoint, resume) {
            return Ok((StreamOffset::At(offset), reports));
        }
        let start = match checkpoint.load(connection).await {
            Err(e) => {
                let why = format!(
                    "cannot read the stream checkpoint in {}: {e}; the consumer waits until it can be read rather than choose an offset",
                    checkpoint.place()
                );
                return Err(self.start_failed(why).await);
            }
            Ok(Some(saved)) => match (resume, saved.offset) {
                (Some(offset), _) if saved.owner.as_deref() == Some(self.owner.as_str()) => {
                    return Ok((StreamOffset::At(offset), reports));
                }
                // The broker's offset tracking names no writer. Read under
                // the lease, it is this process's own saves (behind what it
                // read since, by up to a save's cadence) or those of a host
                // that read while this one stood by (ahead): the further of
                // the two skips nothing done by neither.
                (Some(offset), StreamOffset::At(tracked))
                    if matches!(&**checkpoint, Checkpoint::Tracked(_)) =>
                {
                    StreamOffset::At(offset.max(tracked))
                }
                (resume, _) => {
                    if resume.is_some() {
                        tracing::info!(checkpoint = %checkpoint.place(), offset = ?saved.offset, writer = ?saved.owner, "another host moved the checkpoint since; resuming where it left off");
                    }
                    saved.offset
                }
            },
            Ok(None) => resume.map_or(self.configured, StreamOffset::At),
        };
        let mut state = self.state.lock().expect("stream position poisoned");
        state.start_at(match start {
            StreamOffset::At(offset) => Some(offset),
            _ => None,
        });
        Ok((start, reports))
    }

    async fn start_failed(&self, why: String) -> StartError {
        self.start_failures.fetch_add(1, Ordering::Relaxed);
        self.release_lease().await;
        StartError::Failed(why)
    }

    async fn release_lease(&self) {
        let lease = self
            .lease
            .as_ref()
            .and_then(|(_, slot)| slot.lock().expect("lease poisoned").take());
        if let Some(lease) = lease {
            lease.release().await;
        }
    }

    /// A new subscription begins: where this process would resume, if it
    /// read anything yet, and the new subscription's handle. What an
    /// earlier subscription still has running is read again (its offsets
    /// count in the resume point, which becomes the new floor); its late
    /// reports are ignored.
    fn begin(self: &Arc<Self>) -> (Option<u64>, SubscriptionPosition) {
        let mut state = self.state.lock().expect("stream position poisoned");
        let resume = state.resume();
        state.start_at(resume);
        state.generation += 1;
        let reports = SubscriptionPosition {
            position: self.clone(),
            generation: state.generation,
        };
        (resume, reports)
    }

    /// For the metrics: the offset the consumer would resume from now, and
    /// how long ago its checkpoint was last stored (`None`: never, or no
    /// checkpoint).
    pub fn progress(&self) -> (Option<u64>, Option<Duration>) {
        let resume = self
            .state
            .lock()
            .expect("stream position poisoned")
            .resume();
        let saved = self
            .checkpoint
            .as_ref()
            .and(self.saves.stored_at())
            .map(|at| at.elapsed());
        (resume, saved)
    }

    /// Checkpoint reads and saves that failed (or were refused for want of
    /// the lease), and starts that failed to ask for the lease.
    pub fn checkpoint_failures(&self) -> u64 {
        self.start_failures.load(Ordering::Relaxed) + self.saves.failures()
    }

    /// A subscription stops (whatever it could finish is done): saves the
    /// position, waits for it to be stored (at most [`FLUSH_LIMIT`]), then
    /// gives up the lease.
    pub async fn finish(&self) {
        {
            let mut state = self.state.lock().expect("stream position poisoned");
            self.save_locked(&mut state);
        }
        if let Some(checkpoint) = &self.checkpoint
            && let Err(e) = self.saves.flush(FLUSH_LIMIT).await
        {
            tracing::error!(checkpoint = %checkpoint.place(), error = %e, "the last stream checkpoint was not saved; a restart reads some messages again");
        }
        self.release_lease().await;
    }

    /// Asks the saver to store the resume point. Only a `watch` send: this
    /// runs on the ack path, under the state's lock.
    fn save_locked(&self, state: &mut PositionState) {
        let (Some(_), Some(offset)) = (&self.checkpoint, state.resume()) else {
            return;
        };
        self.saves.request(offset);
        state.done_since_save = 0;
        state.save_asked_at = Some(Instant::now());
    }

    /// A delivery of subscription `generation` at `offset` arrived with
    /// `tag`.
    fn received(&self, generation: u64, tag: u64, offset: u64) {
        let mut state = self.state.lock().expect("stream position poisoned");
        // Below the floor: done by an earlier subscription (the broker
        // starts at the chunk holding the offset asked for, and may deliver
        // some before it); read again, it does not hold the position back.
        if state.generation != generation || state.floor.is_some_and(|floor| offset < floor) {
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
                    .save_asked_at
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

    /// The offset the consumer resumes from now.
    pub fn resume(&self) -> Option<u64> {
        self.position.progress().0
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
    fn a_subscription_that_ends_before_reading_again_keeps_what_was_in_flight() {
        let position = Arc::new(StreamPosition::new(StreamOffset::First));
        let (_, first) = position.begin();
        first.received(1, 100);
        first.done(1);
        // 105 to 124 in flight when the connection drops.
        for (tag, offset) in (2..).zip(105..125) {
            first.received(tag, offset);
        }
        let (resume, _second) = position.begin();
        assert_eq!(resume, Some(105));
        // The second subscription fails before 105 is read again (its
        // basic.consume refused, or its connection dropped): the third
        // still starts at 105, not past what was in flight.
        let (resume, third) = position.begin();
        assert_eq!(resume, Some(105), "nothing in flight may be skipped");
        assert_eq!(position.progress().0, Some(105));
        // A broker that starts at the chunk holding 105 may deliver offsets
        // below it, done long ago: they do not pull the position back.
        third.received(1, 103);
        third.received(2, 105);
        assert_eq!(position.progress().0, Some(105));
        third.done(2);
        assert_eq!(position.progress().0, Some(106));
        third.done(1);
        assert_eq!(position.progress().0, Some(106));
    }

    #[tokio::test]
    async fn a_checkpoint_is_saved_every_so_many_deliveries_done() {
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
        let stop = CancellationToken::new();
        let saver = position.spawn_saver(None, stop.clone()).unwrap();
        let (_, reading) = position.begin();
        for (tag, offset) in [(1, 10), (2, 11), (3, 12)] {
            reading.received(tag, offset);
        }
        // The first done saves (nothing saved yet); then every second one.
        let saved = || async {
            position.saves.flush(Duration::from_secs(10)).await.unwrap();
            file().load().unwrap()
        };
        reading.done(1);
        assert_eq!(saved().await, Some(StreamOffset::At(11)));
        reading.done(2);
        assert_eq!(saved().await, Some(StreamOffset::At(11)));
        reading.done(3);
        assert_eq!(saved().await, Some(StreamOffset::At(13)));
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
        saved().await;
        std::fs::remove_file(&path).unwrap();
        position.handled_by("v1");
        assert_eq!(saved().await, None, "same version: nothing saved");
        reading.received(5, 14);
        position.handled_by("v2");
        assert_eq!(saved().await, Some(StreamOffset::At(14)));
        stop.cancel();
        saver.await.unwrap();
    }

    #[test]
    fn saving_on_the_ack_path_does_no_io() {
        // No saver runs: done() only records what to save, so it cannot
        // block on a file (or a broker) while it holds the position's lock.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orders.checkpoint");
        let cadence = Cadence {
            every: 1,
            interval: Duration::from_secs(3600),
        };
        let position = Arc::new(
            StreamPosition::new(StreamOffset::First)
                .with_checkpoint(Checkpoint::File(FileCheckpoint::new(path.clone(), cadence))),
        );
        let (_, reading) = position.begin();
        reading.received(1, 10);
        reading.done(1);
        assert!(!path.exists(), "written by the saver, not by done()");
        assert_eq!(position.saves.asked(), Some(11));
    }
}
