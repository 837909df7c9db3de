//! AMQP mechanics, and nothing of what a message means: the connection,
//! declarations each on a channel of their own ([`declare`]),
//! subscriptions that hand each delivery to a function and settle it as
//! told, coalesced acks, and confirmed publishing; and, for the one-off
//! commands, their connection ([`oneoff`]), the peek/take pass over a
//! set-aside queue ([`set_aside`]) and a stream read ([`stream_read`]).
//! Every conversation with the broker is here: no other module opens a
//! connection or a channel, or sends a `basic.*` method.
//!
//! This module imports nothing from `delivery`, `plugin`, `retry` or
//! `envelope`: the message path (`crate::delivery`) uses it, never the
//! other way round.

pub mod acks;
pub mod address;
pub mod checkpoint;
pub mod connection;
pub mod declare;
mod driver_wake;
pub mod frame_guard;
pub mod lease;
pub mod link;
pub mod lost;
pub mod offset;
pub mod oneoff;
mod placement;
pub mod publisher;
pub mod resubscribe;
pub mod set_aside;
pub mod stream;
pub mod stream_protocol;
pub mod stream_read;
pub mod subscription;
pub mod tls;

pub use address::{BrokerUrl, UrlError};
pub use connection::{Addresses, ConnectError};
pub use link::{Link, LinkObserver, OnConnected, Phase, Recovery};
pub use oneoff::OneOff;
pub use publisher::{PublishError, PublishLink, PublishObserver, PublishSettings, Publisher};
pub use subscription::{
    Board, Reading, Receipt, Received, StreamProgress, SubscriptionEnv, SubscriptionSpec,
};
pub use tls::{Tls, TlsSettings};
