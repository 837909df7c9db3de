//! Reading a stream from an offset on a one-off connection, under a
//! consumer tag of its own, until it goes quiet: `acemq-host replay`. No
//! checkpoint moves and no lease is taken; acks only pace the broker (a
//! stream keeps every message whatever its readers ack).

use std::time::Duration;

use futures::StreamExt as _;
use lapin::message::Delivery;
use lapin::options::BasicAckOptions;
use lapin::{Channel, Consumer};

use super::offset::StreamOffset;
use super::oneoff::OneOff;
use super::stream::consume_from;

/// One read of a stream.
pub struct StreamRead {
    channel: Channel,
    deliveries: Consumer,
    stream: String,
}

impl StreamRead {
    /// Starts reading `stream` at `from`, with at most `prefetch` messages
    /// unacknowledged; the consumer tag is `{tag_prefix}.{random}`.
    pub async fn open(
        broker: &OneOff,
        stream: &str,
        from: StreamOffset,
        prefetch: u16,
        tag_prefix: &str,
    ) -> anyhow::Result<Self> {
        let channel = broker.channel().await?;
        let (_tag, deliveries) = consume_from(&channel, stream, from, prefetch, tag_prefix)
            .await
            .map_err(|e| anyhow::anyhow!("cannot read the stream '{stream}': {e}"))?;
        Ok(Self {
            channel,
            deliveries,
            stream: stream.to_owned(),
        })
    }

    /// The next message, or `None` once nothing has arrived for `quiet`
    /// (the end of what the stream holds) or the broker ended the read.
    pub async fn next(&mut self, quiet: Duration) -> anyhow::Result<Option<Delivery>> {
        match tokio::time::timeout(quiet, self.deliveries.next()).await {
            Ok(Some(Ok(delivery))) => Ok(Some(delivery)),
            Ok(Some(Err(e))) => anyhow::bail!("reading the stream '{}' failed: {e}", self.stream),
            Ok(None) | Err(_) => Ok(None),
        }
    }

    /// Acknowledges `delivery`, so the broker sends more.
    pub async fn done(&self, delivery: &Delivery) -> anyhow::Result<()> {
        delivery.acker.ack(BasicAckOptions::default()).await?;
        Ok(())
    }

    pub async fn close(self) {
        let _ = self.channel.close(200, "replay done".into()).await;
    }
}
