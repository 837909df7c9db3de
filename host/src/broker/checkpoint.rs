//! Where a stream consumer keeps its position across restarts: in a file, or
//! in the broker itself.
//!
//! The position saved is the offset the consumer resumes from (the lowest
//! offset whose work is not done; see `stream.rs`). It is saved every so
//! many deliveries done or seconds, and when a subscription stops, so a crash costs at most
//! `every` + prefetch messages read again.
//!
//! In the broker, the position is the only message of a quorum queue
//! `acemq.checkpoint.{consumer name}` (`x-max-length` 1, `drop-head`: each
//! save replaces the last). A host on another machine with the same
//! consumer name resumes where this one stopped; the queue is replicated
//! like the stream it describes. Reading it takes the message and gives it
//! back (a get, then a requeue), so it stays.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use lapin::options::{
    BasicGetOptions, BasicNackOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use tokio::sync::watch;

use super::offset::StreamOffset;

/// How often a checkpoint is saved.
#[derive(Debug, Clone, Copy)]
pub struct Cadence {
    /// After this many deliveries done...
    pub every: u64,
    /// ...or once this long has passed since the last save.
    pub interval: Duration,
}

/// A stream position store.
#[derive(Debug)]
pub enum Checkpoint {
    File(FileCheckpoint),
    Broker(BrokerCheckpoint),
}

impl Checkpoint {
    pub fn cadence(&self) -> Cadence {
        match self {
            Checkpoint::File(file) => file.cadence,
            Checkpoint::Broker(broker) => broker.cadence,
        }
    }

    /// The saved position; `None` before the first save.
    pub async fn load(&self, connection: &Connection) -> Result<Option<StreamOffset>, String> {
        match self {
            Checkpoint::File(file) => file.load(),
            Checkpoint::Broker(broker) => broker.load(connection).await,
        }
    }

    /// Saves `offset`: at once to a file; to the broker by a task of the
    /// current subscription, which publishes the newest offset it was given.
    pub fn save(&self, offset: u64) -> Result<(), String> {
        match self {
            Checkpoint::File(file) => file.save(&offset.to_string()),
            Checkpoint::Broker(broker) => {
                broker.latest.send_replace(Some(offset));
                Ok(())
            }
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
                let channel = broker
                    .declared_channel(connection)
                    .await
                    .map_err(|e| e.to_string())?;
                channel
                    .confirm_select(ConfirmSelectOptions::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let done = publish(&channel, &broker.queue, position).await;
                let _ = channel.close(200, "checkpoint reset".into()).await;
                done
            }
        }
    }

    /// A subscription starts on `connection`: saves to the broker go there.
    pub async fn attach(&self, connection: &Connection) {
        if let Checkpoint::Broker(broker) = self
            && let Err(e) = broker.attach(connection).await
        {
            tracing::error!(queue = %broker.queue, error = %e, "cannot keep the stream checkpoint in the broker yet; the next subscription tries again");
        }
    }

    /// Waits until the last offset saved is in the store (a subscription
    /// stops: its checkpoint must not be lost with its connection).
    pub async fn flush(&self) {
        if let Checkpoint::Broker(broker) = self
            && let Err(e) = broker.flush().await
        {
            tracing::error!(queue = %broker.queue, error = %e, "the last stream checkpoint was not saved; a restart reads some messages again");
        }
    }
}

/// A stream position kept in a file, as decimal text. Written whole or not
/// at all (a temporary file in the same folder, synced, then renamed over
/// the old one), so a crash leaves the previous checkpoint, never half of one.
#[derive(Debug)]
pub struct FileCheckpoint {
    path: PathBuf,
    cadence: Cadence,
}

impl FileCheckpoint {
    pub fn new(path: PathBuf, cadence: Cadence) -> Self {
        Self { path, cadence }
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
    let text = text.trim();
    match text.parse::<u64>() {
        Ok(offset) => Some(StreamOffset::At(offset)),
        Err(_) => StreamOffset::parse(text).ok(),
    }
}

/// A stream position kept in the broker (see the module's note).
#[derive(Debug)]
pub struct BrokerCheckpoint {
    queue: String,
    cadence: Cadence,
    /// The newest offset to save; the saver publishes each change.
    latest: watch::Sender<Option<u64>>,
    /// The current subscription's confirm channel for saves.
    channel: Mutex<Option<Channel>>,
}

impl BrokerCheckpoint {
    /// The checkpoint of the consumer named `consumer_name`.
    pub fn new(consumer_name: &str, cadence: Cadence) -> Self {
        Self {
            queue: queue_name(consumer_name),
            cadence,
            latest: watch::Sender::new(None),
            channel: Mutex::new(None),
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

    async fn load(&self, connection: &Connection) -> Result<Option<StreamOffset>, String> {
        let failed =
            |e: lapin::Error| format!("cannot read the checkpoint queue '{}': {e}", self.queue);
        let channel = self.declared_channel(connection).await.map_err(failed)?;
        let got = channel
            .basic_get(
                self.queue.as_str().into(),
                BasicGetOptions { no_ack: false },
            )
            .await
            .map_err(failed)?;
        let Some(message) = got else {
            let _ = channel.close(200, "checkpoint read".into()).await;
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&message.delivery.data).into_owned();
        // Given back: it stays the checkpoint until the next save.
        let requeue = BasicNackOptions {
            multiple: false,
            requeue: true,
        };
        let _ = message.delivery.acker.nack(requeue).await;
        let _ = channel.close(200, "checkpoint read".into()).await;
        parse_offset(&text).map(Some).ok_or_else(|| {
            format!(
                "the checkpoint queue '{}' holds {text:?}, not an offset",
                self.queue
            )
        })
    }

    async fn attach(&self, connection: &Connection) -> lapin::Result<()> {
        let channel = self.declared_channel(connection).await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        *self.channel.lock().expect("checkpoint poisoned") = Some(channel.clone());
        let mut changes = self.latest.subscribe();
        let queue = self.queue.clone();
        tokio::spawn(async move {
            // Ends with its channel: the next subscription attaches anew.
            while changes.changed().await.is_ok() && channel.status().connected() {
                let latest = *changes.borrow_and_update();
                if let Some(offset) = latest
                    && let Err(e) = publish(&channel, &queue, &offset.to_string()).await
                {
                    tracing::warn!(queue = %queue, offset, error = %e, "a stream checkpoint was not saved; the next one will be");
                }
            }
        });
        Ok(())
    }

    async fn flush(&self) -> Result<(), String> {
        let Some(offset) = *self.latest.borrow() else {
            return Ok(());
        };
        let channel = self.channel.lock().expect("checkpoint poisoned").clone();
        match channel {
            Some(channel) if channel.status().connected() => {
                publish(&channel, &self.queue, &offset.to_string()).await
            }
            _ => Err("its channel is closed".to_string()),
        }
    }
}

/// The queue holding the checkpoint of the consumer named `consumer_name`.
pub fn queue_name(consumer_name: &str) -> String {
    format!("acemq.checkpoint.{consumer_name}")
}

/// Publishes `position` as the checkpoint, confirmed.
async fn publish(channel: &Channel, queue: &str, position: &str) -> Result<(), String> {
    let body = position;
    let confirm = channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            body.as_bytes(),
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .map_err(|e| e.to_string())?;
    match confirm.await.map_err(|e| e.to_string())? {
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        Confirmation::Ack(Some(_)) => Err(format!("the checkpoint queue '{queue}' is gone")),
        Confirmation::Nack(_) => Err("the broker refused it".to_string()),
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
}
