//! AMQP mechanics, and nothing of what a message means: the connection,
//! subscriptions that hand each delivery to a function and settle it as
//! told, coalesced acks, and confirmed publishing.
//!
//! This module imports nothing from `delivery`, `plugin`, `retry` or
//! `envelope`: the message path (`crate::delivery`) uses it, never the
//! other way round.

pub mod acks;
pub mod address;
pub mod checkpoint;
pub mod connection;
pub mod frame_guard;
pub mod lease;
pub mod link;
pub mod offset;
pub mod publisher;
pub mod resubscribe;
pub mod stream;
pub mod subscription;
pub mod tls;

pub use address::{BrokerUrl, UrlError};
pub use connection::{Addresses, ConnectError};
pub use link::{Link, LinkObserver, OnConnected, Phase, Recovery};
pub use publisher::{PublishError, PublishLink, PublishObserver, PublishSettings, Publisher};
pub use subscription::{Board, Reading, Receipt, Received, SubscriptionEnv, SubscriptionSpec};
pub use tls::{Tls, TlsSettings};
