//! The checkpoint of a stream consumer that reads over the stream protocol:
//! the broker's own offset tracking (`store_offset` / `query_offset`),
//! under the consumer's `consumer_name`, on the stream.
//!
//! What is stored is what every checkpoint of the host stores: the offset
//! the consumer resumes at (the lowest not done), so 0 means "from the
//! start". The stream clients of other languages store the offset of the
//! last message processed and resume one past it: a tool of theirs reading
//! this name's offset would re-read one message, never skip one.
//!
//! `store_offset` has no answer in the protocol: a save is confirmed by
//! reading the offset back on the same connection (the broker handles a
//! connection's commands in order, so the read sees the store).
//!
//! A consumer that read over AMQP 0-9-1 before keeps a checkpoint of that
//! path (a file, or the queue `acemq.checkpoint.{name}`): while the broker
//! tracks no offset for the name yet, that checkpoint is read, so moving a
//! consumer to the stream protocol resumes where it was.

use std::time::Duration;

use lapin::Connection;
use tokio::sync::Mutex;

use super::connection::StreamConnection;
use super::endpoint::StreamEndpoints;
use crate::broker::checkpoint::{BROKER_STEP_LIMIT, Cadence, Checkpoint, Saved};
use crate::broker::offset::StreamOffset;

/// A position kept by the broker's offset tracking.
pub struct TrackedCheckpoint {
    /// The consumer name: the tracking reference.
    reference: String,
    stream: String,
    endpoints: std::sync::Arc<StreamEndpoints>,
    cadence: Cadence,
    /// The checkpoint this consumer kept on the AMQP path, read while the
    /// broker tracks nothing for it yet.
    earlier: Option<Box<Checkpoint>>,
    /// The connection saves and reads go over, opened when first needed
    /// and again after a failure.
    client: Mutex<Option<StreamConnection>>,
}

impl std::fmt::Debug for TrackedCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackedCheckpoint")
            .field("reference", &self.reference)
            .field("stream", &self.stream)
            .field("earlier", &self.earlier)
            .finish_non_exhaustive()
    }
}

impl TrackedCheckpoint {
    pub fn new(
        consumer_name: &str,
        stream: &str,
        endpoints: std::sync::Arc<StreamEndpoints>,
        cadence: Cadence,
        earlier: Option<Checkpoint>,
    ) -> Self {
        Self {
            reference: consumer_name.to_string(),
            stream: stream.to_string(),
            endpoints,
            cadence,
            earlier: earlier.map(Box::new),
            client: Mutex::new(None),
        }
    }

    pub fn cadence(&self) -> Cadence {
        self.cadence
    }

    /// Where it is kept, for log lines.
    pub fn place(&self) -> String {
        format!(
            "the broker's offset tracking of the stream '{}' under the name '{}'",
            self.stream, self.reference
        )
    }

    /// The tracked offset; else the earlier checkpoint's; `None` when
    /// neither holds one. An error when it cannot be read.
    pub async fn load(&self, connection: &Connection) -> Result<Option<Saved>, String> {
        match self.query().await? {
            Some(offset) => Ok(Some(Saved {
                offset: StreamOffset::At(offset),
                owner: None,
            })),
            None => match &self.earlier {
                Some(earlier) => {
                    let saved = Box::pin(earlier.load(connection)).await?;
                    if let Some(saved) = &saved {
                        tracing::info!(stream = %self.stream, consumer_name = %self.reference, offset = ?saved.offset, earlier = %earlier.place(), "the broker tracks no offset for this consumer yet; resuming from its AMQP checkpoint");
                    }
                    Ok(saved)
                }
                None => Ok(None),
            },
        }
    }

    /// Stores `offset` and reads it back.
    pub async fn store(&self, offset: u64) -> Result<(), String> {
        let mut slot = self.client.lock().await;
        let result = self.store_on(&mut slot, offset).await;
        if result.is_err() {
            forget(&mut slot).await;
        }
        result
    }

    async fn store_on(
        &self,
        slot: &mut Option<StreamConnection>,
        offset: u64,
    ) -> Result<(), String> {
        let client = self.connected(slot).await?;
        bounded(
            "storing the offset",
            client.store_offset(&self.reference, &self.stream, offset),
        )
        .await?
        .map_err(|e| format!("storing the offset failed: {e}"))?;
        let read = bounded(
            "reading the offset back",
            client.query_offset(&self.reference, &self.stream),
        )
        .await?;
        match read {
            Ok(Some(stored)) if stored == offset => Ok(()),
            Ok(stored) => Err(format!(
                "the broker holds offset {stored:?} after storing {offset}: another reader stores under the name '{}'",
                self.reference
            )),
            Err(e) => Err(format!("reading the offset back failed: {e}")),
        }
    }

    /// The tracked offset, `None` when the broker tracks none.
    async fn query(&self) -> Result<Option<u64>, String> {
        let mut slot = self.client.lock().await;
        let result = async {
            let client = self.connected(&mut slot).await?;
            bounded(
                "reading the offset",
                client.query_offset(&self.reference, &self.stream),
            )
            .await?
            .map_err(|e| format!("reading the offset failed: {e}"))
        }
        .await;
        if result.is_err() {
            forget(&mut slot).await;
        }
        result
    }

    async fn connected<'a>(
        &self,
        slot: &'a mut Option<StreamConnection>,
    ) -> Result<&'a StreamConnection, String> {
        if slot.as_ref().is_some_and(StreamConnection::is_closed) {
            *slot = None;
        }
        if slot.is_none() {
            let name = format!("checkpoint.{}", self.reference);
            *slot = Some(self.endpoints.connect(&name).await?);
        }
        Ok(slot.as_ref().expect("connected just now"))
    }

    /// Moves the tracked offset to `position` (`acemq-host stream reset`,
    /// while no host reads): an offset number, or `first` (offset 0: the
    /// oldest message the stream still holds).
    pub async fn reset(&self, position: &str) -> Result<(), String> {
        let offset = match StreamOffset::parse_position(position)? {
            StreamOffset::At(offset) => offset,
            StreamOffset::First => 0,
            _ => {
                return Err(format!(
                    "the broker's offset tracking holds an offset number: give {position:?} as a number, or `first`"
                ));
            }
        };
        self.store(offset).await
    }

    /// Closes its connection (the saver stops).
    pub async fn close(&self) {
        forget(&mut *self.client.lock().await).await;
    }
}

async fn forget(slot: &mut Option<StreamConnection>) {
    if let Some(connection) = slot.take() {
        connection.close().await;
    }
}

/// `step` within [`BROKER_STEP_LIMIT`], or an error naming it.
async fn bounded<T>(step: &str, future: impl Future<Output = T>) -> Result<T, String> {
    tokio::time::timeout(BROKER_STEP_LIMIT, future)
        .await
        .map_err(|_| {
            format!(
                "{step} took over {} s",
                Duration::as_secs(&BROKER_STEP_LIMIT)
            )
        })
}
