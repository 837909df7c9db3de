//! Reading streams over RabbitMQ's stream protocol (the `rabbitmq_stream`
//! plugin) rather than AMQP 0-9-1: the broker sends a stream in chunks as
//! they lie on disk, which on the same broker reads several times faster
//! than one delivery frame per message.
//!
//! - `wire.rs`: the protocol's frames and the chunks deliveries carry;
//! - `connection.rs`: one connection: handshake, requests, heartbeats;
//! - `endpoint.rs`: where the stream listener is (derived from the AMQP
//!   addresses) and connecting to it;
//! - `reader.rs`: one subscription, a chunk at a time, with its credit;
//! - `amqp10.rs`: a stored message as an AMQP 0-9-1 consumer of the stream
//!   would receive it, so a plugin sees the same on both paths;
//! - `subscription.rs`: a stream consumer's subscription on this path;
//! - `probe.rs`: the stream's newest offset, for the lag metric;
//! - `tracking.rs`: the broker's offset tracking, the checkpoint of this
//!   path.

pub mod amqp10;
pub mod connection;
pub mod endpoint;
pub mod probe;
pub mod reader;
pub mod subscription;
pub mod tracking;
pub mod wire;

pub use endpoint::StreamEndpoints;

/// Whether the broker offers the stream protocol at `endpoints`: a
/// connection opens (and is closed again). The error says why not.
pub async fn offered(endpoints: &StreamEndpoints) -> Result<(), String> {
    endpoints.connect("probe").await?.close().await;
    Ok(())
}
