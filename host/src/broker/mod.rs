//! AMQP mechanics, and nothing of what a message means: the connection,
//! subscriptions that hand each delivery to a function and settle it as
//! told, coalesced acks, and confirmed publishing.
//!
//! This module imports nothing from `delivery`, `plugin`, `retry` or
//! `envelope`: the message path (`crate::delivery`) uses it, never the
//! other way round.

pub mod acks;
pub mod address;
pub mod connection;
pub mod publisher;
pub mod subscription;

pub use address::{BrokerUrl, UrlError};
pub use connection::connect;
pub use publisher::{PublishError, Publisher};
pub use subscription::{Receipt, Received, SubscriptionEnv, SubscriptionSpec};
