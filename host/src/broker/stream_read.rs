//! Reading a stream from an offset on a one-off connection until it goes
//! quiet: `acemq-host replay`. No checkpoint moves and no lease is taken.
//!
//! Over AMQP 0-9-1 the read is a consumer with a tag of its own, whose acks
//! only pace the broker (a stream keeps every message whatever its readers
//! ack). Over the stream protocol it is a subscription on a connection of
//! its own, read a chunk at a time. Either way each message comes as an
//! AMQP 0-9-1 consumer would see it ([`StoredMessage`]), so a replay judges
//! a plugin on exactly what it gets live.

use std::collections::VecDeque;
use std::time::Duration;

use futures::StreamExt as _;
use lapin::options::BasicAckOptions;
use lapin::{BasicProperties, Channel, Consumer};

use super::lost::until_lost;
use super::offset::StreamOffset;
use super::oneoff::OneOff;
use super::stream::consume_from;
use super::stream_protocol::reader::ChunkReader;
use super::stream_protocol::{StreamEndpoints, amqp10};

/// One message of the stream, as an AMQP 0-9-1 consumer receives it.
pub struct StoredMessage {
    pub offset: u64,
    pub exchange: String,
    pub routing_key: String,
    pub redelivered: bool,
    pub properties: BasicProperties,
    pub body: bytes::Bytes,
}

/// One read of a stream.
pub enum StreamRead {
    Amqp {
        channel: Channel,
        deliveries: Consumer,
        stream: String,
    },
    StreamProtocol {
        reader: ChunkReader,
        /// The rest of the chunk read last.
        waiting: VecDeque<StoredMessage>,
        stream: String,
    },
}

impl StreamRead {
    /// Starts reading `stream` at `from` over AMQP 0-9-1, with at most
    /// `prefetch` messages unacknowledged; the consumer tag is
    /// `{tag_prefix}.{random}`.
    pub async fn open(
        broker: &OneOff,
        stream: &str,
        from: StreamOffset,
        prefetch: u16,
        tag_prefix: &str,
    ) -> anyhow::Result<Self> {
        let channel = broker.channel().await?;
        let subscribing = consume_from(&channel, stream, from, prefetch, tag_prefix);
        let (_tag, deliveries) = until_lost(broker.connection(), subscribing)
            .await
            .map_err(|e| anyhow::anyhow!("cannot read the stream '{stream}': {e}"))?;
        Ok(Self::Amqp {
            channel,
            deliveries,
            stream: stream.to_owned(),
        })
    }

    /// Starts reading `stream` at `from` over the stream protocol.
    pub async fn open_stream_protocol(
        endpoints: &StreamEndpoints,
        stream: &str,
        from: StreamOffset,
        purpose: &str,
    ) -> anyhow::Result<Self> {
        let connection = endpoints
            .connect(purpose)
            .await
            .map_err(|why| anyhow::anyhow!("cannot read the stream '{stream}': {why}"))?;
        let reader = ChunkReader::open(connection, stream, from)
            .await
            .map_err(|why| anyhow::anyhow!("cannot read the stream '{stream}': {why}"))?;
        Ok(Self::StreamProtocol {
            reader,
            waiting: VecDeque::new(),
            stream: stream.to_owned(),
        })
    }

    /// The next message, or `None` once nothing has arrived for `quiet`
    /// (the end of what the stream holds) or the broker ended the read.
    pub async fn next(&mut self, quiet: Duration) -> anyhow::Result<Option<StoredMessage>> {
        match self {
            StreamRead::Amqp {
                deliveries, stream, ..
            } => match tokio::time::timeout(quiet, deliveries.next()).await {
                Ok(Some(Ok(delivery))) => {
                    // Acked at once: the ack only paces the broker.
                    delivery.acker.ack(BasicAckOptions::default()).await?;
                    Ok(Some(StoredMessage {
                        offset: StreamOffset::of_delivery(delivery.properties.headers().as_ref())
                            .unwrap_or(0),
                        exchange: delivery.exchange.to_string(),
                        routing_key: delivery.routing_key.to_string(),
                        redelivered: delivery.redelivered,
                        properties: delivery.properties,
                        body: delivery.data.into(),
                    }))
                }
                Ok(Some(Err(e))) => anyhow::bail!("reading the stream '{stream}' failed: {e}"),
                Ok(None) | Err(_) => Ok(None),
            },
            StreamRead::StreamProtocol {
                reader,
                waiting,
                stream,
            } => {
                while waiting.is_empty() {
                    let chunk = match tokio::time::timeout(quiet, reader.next()).await {
                        Ok(Ok(chunk)) => chunk,
                        Ok(Err(why)) => {
                            anyhow::bail!("reading the stream '{stream}' failed: {why}")
                        }
                        Err(_) => return Ok(None),
                    };
                    for (offset, message) in chunk.into_offsets() {
                        let view = amqp10::to_amqp091(&message, stream, offset).map_err(|e| {
                            anyhow::anyhow!("offset {offset} of the stream '{stream}': {e}")
                        })?;
                        waiting.push_back(StoredMessage {
                            offset,
                            exchange: view.exchange,
                            routing_key: view.routing_key,
                            redelivered: false,
                            properties: view.properties,
                            body: view.body,
                        });
                    }
                }
                Ok(waiting.pop_front())
            }
        }
    }

    pub async fn close(self) {
        match self {
            StreamRead::Amqp { channel, .. } => {
                let _ = channel.close(200, "replay done".into()).await;
            }
            StreamRead::StreamProtocol { reader, .. } => reader.close().await,
        }
    }
}
