//! One reader per stream consumer name, across hosts.
//!
//! A stream is not shared the way a queue is: every subscriber reads every
//! message. Two hosts running a consumer of the same `consumer_name` would
//! each handle the whole stream and overwrite each other's checkpoint.
//! RabbitMQ 3.10 has no single active consumer for a stream read over AMQP
//! 0-9-1: it refuses `x-single-active-consumer` on a stream (`invalid arg
//! ... of queue type rabbit_stream_queue`, see `tests/tests/streams.rs`;
//! 3.11 added it for the stream protocol only). So the host takes a lease
//! instead: an
//! exclusive queue `acemq.lease.{consumer_name}`, declared on the
//! connection the consumer reads on. The broker lets one connection hold an
//! exclusive queue of a name and refuses the others (`RESOURCE_LOCKED`),
//! and deletes it when that connection closes or dies, so the lease is
//! freed exactly when its holder can no longer read. A host that finds the
//! lease taken stands by and tries again.
//!
//! The lease is also the checkpoint's fence: a host saves only while it
//! holds it (see `checkpoint.rs`), so a host whose connection dropped
//! cannot overwrite the checkpoint of the one that took over.

use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ErrorKind};

use super::checkpoint::BROKER_STEP_LIMIT;

/// The lease queue of the consumer named `consumer_name`.
pub fn queue_name(consumer_name: &str) -> String {
    format!("acemq.lease.{consumer_name}")
}

/// Why a lease was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotTaken {
    /// Another connection holds it: another host reads under this name.
    Held,
    /// The broker could not be asked (a channel error, a lost connection).
    Failed(String),
}

/// A lease held on one connection.
#[derive(Debug)]
pub struct Lease {
    queue: String,
    channel: Channel,
}

impl Lease {
    /// Takes the lease of `consumer_name` on `connection`.
    pub async fn take(connection: &Connection, consumer_name: &str) -> Result<Lease, NotTaken> {
        let queue = queue_name(consumer_name);
        let taking = async {
            let channel = connection.create_channel().await?;
            let options = QueueDeclareOptions {
                exclusive: true,
                ..QueueDeclareOptions::default()
            };
            channel
                .queue_declare(queue.as_str().into(), options, FieldTable::default())
                .await?;
            Ok::<_, lapin::Error>(channel)
        };
        match tokio::time::timeout(BROKER_STEP_LIMIT, taking).await {
            Ok(Ok(channel)) => Ok(Lease { queue, channel }),
            Ok(Err(e)) if is_locked(&e) => Err(NotTaken::Held),
            Ok(Err(e)) => Err(NotTaken::Failed(format!(
                "cannot take the lease queue '{queue}': {e}"
            ))),
            Err(_) => Err(NotTaken::Failed(format!(
                "taking the lease queue '{queue}' took longer than {} s",
                BROKER_STEP_LIMIT.as_secs()
            ))),
        }
    }

    /// Whether it is still held: its connection (and channel) are open.
    pub fn held(&self) -> bool {
        self.channel.status().connected()
    }

    /// Gives the lease up at once (another host may take it now), rather
    /// than when the connection closes.
    pub async fn release(self) {
        if !self.held() {
            return;
        }
        let release = async {
            let _ = self
                .channel
                .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
                .await;
            let _ = self.channel.close(200, "lease released".into()).await;
        };
        if tokio::time::timeout(BROKER_STEP_LIMIT, release)
            .await
            .is_err()
        {
            tracing::debug!(queue = %self.queue, "releasing the lease took too long; it ends with the connection");
        }
    }
}

fn is_locked(error: &lapin::Error) -> bool {
    matches!(error.kind(), ErrorKind::ProtocolError(e)
        if matches!(e.kind(), AMQPErrorKind::Soft(AMQPSoftError::RESOURCELOCKED)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_queue_is_named_apart_from_the_checkpoint_queue() {
        // Apart: a consumer named `x.lease` must not collide with `x`.
        assert_eq!(queue_name("projection-1"), "acemq.lease.projection-1");
        assert_ne!(
            queue_name("x"),
            crate::broker::checkpoint::queue_name("x.lease")
        );
    }
}
