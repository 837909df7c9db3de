//! Where a stream consumer keeps its position across restarts: in a file, or
//! in the broker itself; and the one task per consumer that saves it.
//!
//! The position saved is the offset the consumer resumes from (the lowest
//! offset whose work is not done; see `stream.rs`). It is saved every so
//! many deliveries done or seconds, and when a subscription stops, so a
//! crash costs at most `every` + 2 × prefetch messages read again, plus
//! what was done while the newest save was being stored (see
//! `docs/streams.md`: deliveries are settled out of order, and saves are
//! stored off the ack path).
//!
//! In the broker, the position is the only message of a quorum queue
//! `acemq.checkpoint.{consumer name}` (`x-max-length` 1, `drop-head`: each
//! save replaces the last), with a header naming the process that wrote it.
//! A host on another machine with the same consumer name resumes where this
//! one stopped; the queue is replicated like the stream it describes.
//! Reading it takes the message and gives it back (a get, then a requeue),
//! so it stays.
//!
//! Saving never happens on the path that acks deliveries: the position only
//! records the newest offset to save ([`Saves::request`], a `watch` send),
//! and [`keep_saving`], one task per consumer for the life of the host,
//! stores it. A file is written on tokio's blocking pool (a write and an
//! fsync would otherwise hold a runtime worker). The broker's copy is
//! published over the host's *publish* connection, on one channel per
//! connection: a broker in a resource alarm blocks a connection that
//! publishes and stops reading it, and on the consume connection that would
//! stall every consumer's acks. Every broker step is bounded, so a stop
//! during an alarm ends.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, BasicNackOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::link::Link;
use super::offset::StreamOffset;

/// The longest one broker step of a checkpoint (a declaration, a get, a
/// publish and its confirm) may take.
pub const BROKER_STEP_LIMIT: Duration = Duration::from_secs(5);

/// The header naming the process that wrote a checkpoint kept in the broker.
pub const OWNER_HEADER: &str = "x-acemq-checkpoint-owner";

/// How often a checkpoint is saved.
#[derive(Debug, Clone, Copy)]
pub struct Cadence {
    /// After this many deliveries done...
    pub every: u64,
    /// ...or once this long has passed since the last save.
    pub interval: Duration,
}

/// A checkpoint as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub offset: StreamOffset,
    /// The process that wrote it (see [`OWNER_HEADER`]); `None` for a file,
    /// for `stream reset` and for checkpoints of older hosts.
    pub owner: Option<String>,
}

/// A stream position store.
#[derive(Debug)]
pub enum Checkpoint {
    File(FileCheckpoint),
    Broker(BrokerCheckpoint),
    /// The broker's offset tracking: the checkpoint of a consumer that
    /// reads over the stream protocol (`stream_protocol/tracking.rs`).
    Tracked(super::stream_protocol::tracking::TrackedCheckpoint),
}

impl Checkpoint {
    pub fn cadence(&self) -> Cadence {
        match self {
            Checkpoint::File(file) => file.cadence,
            Checkpoint::Broker(broker) => broker.cadence,
            Checkpoint::Tracked(tracked) => tracked.cadence(),
        }
    }

    /// Where it is kept, for log lines.
    pub fn place(&self) -> String {
        match self {
            Checkpoint::File(file) => format!("the file {}", file.path.display()),
            Checkpoint::Broker(broker) => format!("the queue '{}'", broker.queue),
            Checkpoint::Tracked(tracked) => tracked.place(),
        }
    }

    /// The saved position; `None` when none was ever saved. An error when
    /// it cannot be read (the file is unreadable, the checkpoint queue's
    /// node is down, a channel error): never taken for "none saved", which
    /// would start the consumer at its configured offset and overwrite the
    /// real checkpoint at the first save.
    pub async fn load(&self, connection: &Connection) -> Result<Option<Saved>, String> {
        match self {
            Checkpoint::File(file) => {
                let path = file.path.clone();
                let cadence = file.cadence;
                tokio::task::spawn_blocking(move || FileCheckpoint::new(path, cadence).load())
                    .await
                    .map_err(|e| format!("reading the checkpoint file failed: {e}"))?
                    .map(|offset| {
                        offset.map(|offset| Saved {
                            offset,
                            owner: None,
                        })
                    })
            }
            Checkpoint::Broker(broker) => {
                bounded("reading the checkpoint", broker.load(connection)).await
            }
            Checkpoint::Tracked(tracked) => tracked.load(connection).await,
        }
    }

    /// Moves the checkpoint to `position` (`first`, `last`, `next`, an
    /// offset, a time): `acemq-host stream reset`, while no host reads.
    pub async fn reset(
        &self,
        connection: Option<&Connection>,
        position: &str,
    ) -> Result<(), String> {
        if parse_offset(position).is_none() {
            return Err(format!("{position:?} is not a stream position"));
        }
        match self {
            Checkpoint::File(file) => file.save(position),
            Checkpoint::Broker(broker) => {
                let connection =
                    connection.ok_or("a checkpoint kept in the broker needs a connection")?;
                let channel = broker.confirm_channel(connection).await?;
                let done = publish(&channel, &broker.queue, position, None).await;
                let _ = tokio::time::timeout(
                    BROKER_STEP_LIMIT,
                    channel.close(200, "checkpoint reset".into()),
                )
                .await;
                done
            }
            Checkpoint::Tracked(tracked) => tracked.reset(position).await,
        }
    }
}

/// A stream position kept in a file, as decimal text. Written whole or not
/// at all (a temporary file in the same folder, synced, then renamed over
/// the old one), so a crash leaves the previous checkpoint, never half of
/// one. Its calls block: the host makes them on tokio's blocking pool.
#[derive(Debug)]
pub struct FileCheckpoint {
    path: PathBuf,
    cadence: Cadence,
}

impl FileCheckpoint {
    pub fn new(path: PathBuf, cadence: Cadence) -> Self {
        Self { path, cadence }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn load(&self) -> Result<Option<StreamOffset>, String> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => parse_offset(&text).map(Some).ok_or_else(|| {
                format!(
                    "the checkpoint {} holds {:?}, not an offset",
                    self.path.display(),
                    text.trim()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!(
                "cannot read the checkpoint {}: {e}",
                self.path.display()
            )),
        }
    }

    pub fn save(&self, position: &str) -> Result<(), String> {
        use std::io::Write as _;
        let folder = self
            .path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let write = || -> std::io::Result<()> {
            let mut file = tempfile::NamedTempFile::new_in(folder)?;
            writeln!(file, "{position}")?;
            file.as_file().sync_all()?;
            file.persist(&self.path).map_err(|e| e.error)?;
            Ok(())
        };
        write().map_err(|e| format!("cannot write the checkpoint {}: {e}", self.path.display()))
    }
}

/// A saved position: an offset (what the host saves), or what `stream
/// reset` may write (`first`, `last`, `next`, a time).
fn parse_offset(text: &str) -> Option<StreamOffset> {
    StreamOffset::parse_position(text).ok()
}

/// A stream position kept in the broker (see the module's note).
#[derive(Debug)]
pub struct BrokerCheckpoint {
    queue: String,
    cadence: Cadence,
}

impl BrokerCheckpoint {
    /// The checkpoint of the consumer named `consumer_name`.
    pub fn new(consumer_name: &str, cadence: Cadence) -> Self {
        Self {
            queue: queue_name(consumer_name),
            cadence,
        }
    }

    async fn declared_channel(&self, connection: &Connection) -> lapin::Result<Channel> {
        let channel = connection.create_channel().await?;
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString(LongString::from("quorum")),
        );
        arguments.insert("x-max-length".into(), AMQPValue::LongLongInt(1));
        arguments.insert(
            "x-overflow".into(),
            AMQPValue::LongString(LongString::from("drop-head")),
        );
        let options = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(self.queue.as_str().into(), options, arguments)
            .await?;
        Ok(channel)
    }

    /// A channel in confirm mode on which the checkpoint queue is declared.
    async fn confirm_channel(&self, connection: &Connection) -> Result<Channel, String> {
        let failed =
            |e: lapin::Error| format!("cannot open a channel for the queue '{}': {e}", self.queue);
        bounded("opening the checkpoint's channel", async {
            let channel = self.declared_channel(connection).await.map_err(failed)?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(failed)?;
            Ok(channel)
        })
        .await
    }

    async fn load(&self, connection: &Connection) -> Result<Option<Saved>, String> {
        let failed =
            |e: lapin::Error| format!("cannot read the checkpoint queue '{}': {e}", self.queue);
        let channel = self.declared_channel(connection).await.map_err(failed)?;
        let got = channel
            .basic_get(
                self.queue.as_str().into(),
                BasicGetOptions { no_ack: false },
            )
            .await;
        let got = match got {
            Ok(got) => got,
            Err(e) => {
                let _ = channel.close(200, "checkpoint read".into()).await;
                return Err(failed(e));
            }
        };
        let Some(message) = got else {
            let _ = channel.close(200, "checkpoint read".into()).await;
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&message.delivery.data).into_owned();
        let owner = message
            .delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| match h.inner().get(OWNER_HEADER) {
                Some(AMQPValue::LongString(s)) => Some(s.to_string()),
                Some(AMQPValue::ShortString(s)) => Some(s.to_string()),
                _ => None,
            });
        // Given back: it stays the checkpoint until the next save.
        let requeue = BasicNackOptions {
            multiple: false,
            requeue: true,
        };
        let _ = message.delivery.acker.nack(requeue).await;
        let _ = channel.close(200, "checkpoint read".into()).await;
        let offset = parse_offset(&text).ok_or_else(|| {
            format!(
                "the checkpoint queue '{}' holds {text:?}, not an offset",
                self.queue
            )
        })?;
        Ok(Some(Saved { offset, owner }))
    }
}

/// The queue holding the checkpoint of the consumer named `consumer_name`.
pub fn queue_name(consumer_name: &str) -> String {
    format!("acemq.checkpoint.{consumer_name}")
}

/// Publishes `position` as the checkpoint, confirmed, within
/// [`BROKER_STEP_LIMIT`].
async fn publish(
    channel: &Channel,
    queue: &str,
    position: &str,
    owner: Option<&str>,
) -> Result<(), String> {
    let mut properties = BasicProperties::default().with_delivery_mode(2);
    if let Some(owner) = owner {
        let mut headers = FieldTable::default();
        headers.insert(
            OWNER_HEADER.into(),
            AMQPValue::LongString(LongString::from(owner)),
        );
        properties = properties.with_headers(headers);
    }
    bounded("saving the checkpoint", async {
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                position.as_bytes(),
                properties,
            )
            .await
            .map_err(|e| e.to_string())?;
        match confirm.await.map_err(|e| e.to_string())? {
            Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
            Confirmation::Ack(Some(_)) => Err(format!("the checkpoint queue '{queue}' is gone")),
            Confirmation::Nack(_) => Err("the broker refused it".to_string()),
        }
    })
    .await
}

/// `step` within [`BROKER_STEP_LIMIT`], or an error naming `what`.
async fn bounded<T>(
    what: &str,
    step: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, String> {
    match tokio::time::timeout(BROKER_STEP_LIMIT, step).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "{what} took longer than {} s",
            BROKER_STEP_LIMIT.as_secs()
        )),
    }
}

/// What the position asks to save, and what the saver did: shared between
/// the ack path (which only records a request) and [`keep_saving`].
#[derive(Debug)]
pub struct Saves {
    requested: watch::Sender<Request>,
    stored: watch::Sender<Stored>,
}

/// The newest offset to save, numbered.
#[derive(Debug, Clone, Copy, Default)]
struct Request {
    /// 0: nothing asked yet.
    seq: u64,
    offset: u64,
}

/// What the saver did last.
#[derive(Debug, Clone, Copy, Default)]
struct Stored {
    /// The last request it handled (stored, refused or failed).
    seq: u64,
    /// The last request it stored.
    stored_seq: u64,
    at: Option<Instant>,
    failures: u64,
}

impl Default for Saves {
    fn default() -> Self {
        Self {
            requested: watch::Sender::new(Request::default()),
            stored: watch::Sender::new(Stored::default()),
        }
    }
}

impl Saves {
    /// Asks for `offset` to be saved. Never waits and never does I/O: the
    /// saver stores the newest offset asked for when it can.
    pub fn request(&self, offset: u64) {
        self.requested.send_modify(|r| {
            r.seq += 1;
            r.offset = offset;
        });
    }

    /// The newest offset asked for, if any.
    pub fn asked(&self) -> Option<u64> {
        let request = *self.requested.borrow();
        (request.seq > 0).then_some(request.offset)
    }

    /// When a checkpoint was last stored.
    pub fn stored_at(&self) -> Option<Instant> {
        self.stored.borrow().at
    }

    /// Saves that failed or were refused, since the host started.
    pub fn failures(&self) -> u64 {
        self.stored.borrow().failures
    }

    /// Waits, at most `limit`, until the saver has stored the last offset
    /// asked for. An error says why it was not.
    pub async fn flush(&self, limit: Duration) -> Result<(), String> {
        let wanted = self.requested.borrow().seq;
        if wanted == 0 {
            return Ok(());
        }
        let mut stored = self.stored.subscribe();
        let handled = tokio::time::timeout(limit, stored.wait_for(|s| s.seq >= wanted)).await;
        match handled {
            Ok(Ok(s)) if s.stored_seq >= wanted => Ok(()),
            Ok(Ok(_)) => Err("the saver could not store it (see the line before)".to_string()),
            Ok(Err(_)) => Err("the saver has stopped".to_string()),
            Err(_) => Err(format!(
                "it was not stored within {} s (is the publish connection blocked or lost?)",
                limit.as_secs()
            )),
        }
    }

    fn handled(&self, seq: u64, result: &Result<(), String>) {
        self.stored.send_modify(|s| {
            s.seq = s.seq.max(seq);
            match result {
                Ok(()) => {
                    s.stored_seq = s.stored_seq.max(seq);
                    s.at = Some(Instant::now());
                }
                Err(_) => s.failures += 1,
            }
        });
    }
}

/// Whether this process may write the checkpoint now: it holds its
/// consumer name's lease (see `lease.rs`). A process that lost the lease
/// (its connection dropped, another host took over) is a stale writer, and
/// its saves are refused.
pub type Fence = Arc<dyn Fn() -> bool + Send + Sync>;

/// Saves `saves`' requests into `store` until `stop` is cancelled: one task
/// per stream consumer, for the life of the host. `publish` is the host's
/// publish link (for a checkpoint kept in the broker); `owner` names this
/// process in what it writes.
pub async fn keep_saving(
    store: Arc<Checkpoint>,
    saves: Arc<Saves>,
    owner: String,
    publish: Option<Arc<Link>>,
    fence: Fence,
    stop: CancellationToken,
) {
    let mut requests = saves.requested.subscribe();
    if requests.borrow().seq > 0 {
        // Asked before the saver started.
        requests.mark_changed();
    }
    let mut on_broker = OnBroker::default();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            changed = requests.changed() => if changed.is_err() { break },
        }
        let request = *requests.borrow_and_update();
        let result = match &*store {
            Checkpoint::File(file) => {
                let (path, cadence) = (file.path.clone(), file.cadence);
                let text = request.offset.to_string();
                tokio::task::spawn_blocking(move || FileCheckpoint::new(path, cadence).save(&text))
                    .await
                    .unwrap_or_else(|e| Err(format!("writing the checkpoint failed: {e}")))
            }
            Checkpoint::Tracked(tracked) => match fence() {
                true => tracked.store(request.offset).await,
                false => Err(NOT_HELD.to_string()),
            },
            Checkpoint::Broker(broker) => {
                let Some(link) = &publish else {
                    tracing::error!(queue = %broker.queue, "no publish connection to save the stream checkpoint on");
                    break;
                };
                if !fence() {
                    Err(NOT_HELD.to_string())
                } else {
                    match on_broker
                        .store(link, broker, request.offset, &owner, &stop)
                        .await
                    {
                        Some(result) => result,
                        None => break,
                    }
                }
            }
        };
        if let Err(e) = &result {
            tracing::warn!(checkpoint = %store.place(), offset = request.offset, error = %e, "a stream checkpoint was not saved; the next one will be");
        }
        saves.handled(request.seq, &result);
    }
    on_broker.close().await;
    if let Checkpoint::Tracked(tracked) = &*store {
        tracked.close().await;
    }
}

/// Why a save is refused to a host that lost its consumer name's lease.
const NOT_HELD: &str = "this host no longer holds the consumer's lease, so its save is refused: another host may be reading";

/// The saver's channel on the publish connection: one at a time, opened
/// again only when the connection was replaced or the channel failed.
#[derive(Default)]
struct OnBroker {
    channel: Option<(u64, Channel)>,
}

impl OnBroker {
    /// Stores `offset` once the publish link is up (not blocked): `None`
    /// when `stop` came first.
    async fn store(
        &mut self,
        link: &Link,
        broker: &BrokerCheckpoint,
        offset: u64,
        owner: &str,
        stop: &CancellationToken,
    ) -> Option<Result<(), String>> {
        let (connection, generation) = link.up(stop).await?;
        let usable =
            matches!(&self.channel, Some((g, c)) if *g == generation && c.status().connected());
        if !usable {
            self.close().await;
            match broker.confirm_channel(&connection).await {
                Ok(channel) => self.channel = Some((generation, channel)),
                Err(e) => return Some(Err(e)),
            }
        }
        let (_, channel) = self.channel.as_ref().expect("a channel was just opened");
        Some(publish(channel, &broker.queue, &offset.to_string(), Some(owner)).await)
    }

    async fn close(&mut self) {
        if let Some((_, channel)) = self.channel.take()
            && channel.status().connected()
        {
            let _ = tokio::time::timeout(
                BROKER_STEP_LIMIT,
                channel.close(200, "checkpoint saver done".into()),
            )
            .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_checkpoint_is_written_whole_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.checkpoint");
        let cadence = Cadence {
            every: 1,
            interval: Duration::from_secs(1),
        };
        let file = FileCheckpoint::new(path.clone(), cadence);
        assert_eq!(file.load().unwrap(), None);
        file.save("42").unwrap();
        assert_eq!(file.load().unwrap(), Some(StreamOffset::At(42)));
        file.save("first").unwrap();
        assert_eq!(file.load().unwrap(), Some(StreamOffset::First));
        std::fs::write(&path, "nonsense").unwrap();
        assert!(file.load().unwrap_err().contains("not an offset"));
        assert_eq!(queue_name("projection-1"), "acemq.checkpoint.projection-1");
    }

    #[test]
    fn an_unreadable_file_checkpoint_is_an_error_not_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        // A folder where the file should be: it exists, and cannot be read.
        let path = dir.path().join("c.checkpoint");
        std::fs::create_dir(&path).unwrap();
        let cadence = Cadence {
            every: 1,
            interval: Duration::from_secs(1),
        };
        let error = FileCheckpoint::new(path, cadence).load().unwrap_err();
        assert!(error.contains("cannot read the checkpoint"), "{error}");
    }

    #[tokio::test]
    async fn the_saver_stores_the_newest_request_off_the_ack_path_and_flush_waits_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.checkpoint");
        let cadence = Cadence {
            every: 1,
            interval: Duration::from_secs(1),
        };
        let store = Arc::new(Checkpoint::File(FileCheckpoint::new(path.clone(), cadence)));
        let saves = Arc::new(Saves::default());
        assert!(
            saves.flush(Duration::from_millis(10)).await.is_ok(),
            "nothing asked"
        );
        // Without a saver a request is recorded, not written, and flush
        // says so within its bound.
        saves.request(7);
        assert!(!path.exists());
        let error = saves.flush(Duration::from_millis(50)).await.unwrap_err();
        assert!(error.contains("not stored within"), "{error}");
        let stop = CancellationToken::new();
        let saver = tokio::spawn(keep_saving(
            store,
            saves.clone(),
            "me".into(),
            None,
            Arc::new(|| true),
            stop.clone(),
        ));
        saves.request(8);
        saves.request(9);
        saves.flush(Duration::from_secs(10)).await.unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), "9");
        assert!(saves.stored_at().is_some());
        stop.cancel();
        saver.await.unwrap();
    }
}
