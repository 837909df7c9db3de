//! Reading a queue without consuming what is not meant to go: the
//! peek/take [`Pass`] of the `dlq` commands over a set-aside queue, its
//! count and its purge.
//!
//! A pass reads with `basic.get`: a message is either taken (acknowledged,
//! once it is safely elsewhere or purged) or held (left unacknowledged
//! until the pass ends, then requeued all at once). A held message is not
//! handed out again, so a pass never meets the same message twice, and it
//! is bounded by the queue's count at its start, so messages set aside
//! while it runs (a replayed message failing again) wait for the next run
//! instead of going round in a loop. Requeued messages go back to where
//! they stood in the (classic) queue, so a pass leaves the others in their
//! order. If the command dies, the broker requeues whatever it held.

use std::sync::Arc;

use anyhow::Context as _;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};

use super::lost::until_lost;
use super::oneoff::OneOff;

/// Messages ready in `queue` now. A passive declare of a missing queue
/// closes its channel, so it gets one of its own.
pub async fn ready(broker: &OneOff, queue: &str) -> lapin::Result<usize> {
    let channel = broker.channel().await?;
    let connection = broker.connection();
    let declared = until_lost(
        connection,
        channel.queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        ),
    )
    .await?;
    let _ = until_lost(connection, channel.close(200, "counted".into())).await;
    Ok(declared.message_count() as usize)
}

/// Removes every message ready in `queue` in one `queue.purge`; how many.
pub async fn purge(broker: &OneOff, queue: &str) -> lapin::Result<u32> {
    let channel = broker.channel().await?;
    let connection = broker.connection();
    let purged = until_lost(
        connection,
        channel.queue_purge(queue.into(), QueuePurgeOptions::default()),
    )
    .await;
    if channel.status().connected() {
        let _ = until_lost(connection, channel.close(200, "purged".into())).await;
    }
    purged
}

/// One pass over the messages a queue held when it started (see the
/// module's comment), on a channel of its own. Each step is raced against
/// the connection's end (see `lost.rs`).
pub struct Pass {
    connection: Arc<Connection>,
    channel: Channel,
    queue: String,
    remaining: usize,
    /// Position of the last message got, 1 for the queue's head.
    position: usize,
    /// The highest delivery tag held: one `basic.nack` with `multiple`
    /// requeues them all, since every message not held has been acked.
    held: Option<u64>,
}

impl Pass {
    /// A pass over at most `bound` messages of `queue`.
    pub async fn open(broker: &OneOff, queue: &str, bound: usize) -> anyhow::Result<Self> {
        Ok(Self {
            connection: broker.shared_connection(),
            channel: broker.channel().await?,
            queue: queue.to_owned(),
            remaining: bound,
            position: 0,
            held: None,
        })
    }

    /// Position of the last message got, 1 for the queue's head.
    pub fn position(&self) -> usize {
        self.position
    }

    /// The next message, or `None` once the bound is reached or the queue
    /// has nothing more to hand out.
    pub async fn next(&mut self) -> anyhow::Result<Option<Delivery>> {
        if self.remaining == 0 {
            return Ok(None);
        }
        self.remaining -= 1;
        let getting = self.channel.basic_get(
            self.queue.as_str().into(),
            BasicGetOptions { no_ack: false },
        );
        let got = until_lost(&self.connection, getting)
            .await
            .with_context(|| format!("reading the queue '{}'", self.queue))?;
        Ok(got.map(|got| {
            self.position += 1;
            got.delivery
        }))
    }

    /// Leaves the message to be requeued when the pass ends.
    pub fn hold(&mut self, delivery: &Delivery) {
        self.held = Some(delivery.delivery_tag);
    }

    /// Removes the message from the queue.
    pub async fn take(&self, delivery: &Delivery) -> anyhow::Result<()> {
        let acking = self
            .channel
            .basic_ack(delivery.delivery_tag, BasicAckOptions::default());
        until_lost(&self.connection, acking)
            .await
            .with_context(|| format!("acknowledging a message of '{}'", self.queue))
    }

    /// Requeues every message held, and closes the pass's channel. Should
    /// the requeue fail, the broker requeues them anyway when the channel
    /// or connection closes.
    pub async fn finish(self) {
        if let Some(tag) = self.held {
            let requeue = BasicNackOptions {
                multiple: true,
                requeue: true,
            };
            if let Err(e) =
                until_lost(&self.connection, self.channel.basic_nack(tag, requeue)).await
            {
                tracing::warn!(
                    queue = self.queue,
                    "requeueing held messages: {e}; the broker requeues them when the connection closes"
                );
            }
        }
        let _ = until_lost(&self.connection, self.channel.close(200, "done".into())).await;
    }
}
