//! Everything that talks to RabbitMQ: the connection, confirmed publishing,
//! and consumers that carry out each delivery's settlement.

pub mod acks;
pub mod connection;
pub mod consumer;
pub mod publisher;

pub use connection::connect;
pub use publisher::{PublishError, Publisher};
