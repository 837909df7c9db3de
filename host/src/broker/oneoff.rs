//! The connection of a one-off command (`dlq`, `replay`, `stream reset`):
//! opened as the host opens its own ([`Addresses`]: the configured
//! addresses and TLS, frames bounded by the frame guard, passwords masked
//! in every error), in one round and without recovery, since a command that
//! loses its broker reports it and ends.
//!
//! It is a [`Link`] that is up from the start, so a command publishes
//! through the host's own [`Publisher`] (confirms, returns, bounded waits)
//! instead of a publisher of its own.

use std::sync::Arc;
use std::time::Duration;

use lapin::{Channel, Connection};

use super::link::{Link, LinkObserver, Phase};
use super::lost::until_lost;
use super::publisher::{PublishLink, PublishObserver, PublishOutcome, PublishSettings, Publisher};
use super::{Addresses, ConnectError};

/// How long a command waits for the broker to confirm its connection's close.
const CLOSE_LIMIT: Duration = Duration::from_secs(5);

/// One connection for the length of a command.
pub struct OneOff {
    link: Arc<Link>,
    connection: Arc<Connection>,
}

impl OneOff {
    /// One attempt per address, each bounded by `attempt_timeout`. `role`
    /// names the connection in the logs (`dlq`, `replay`, `reset`).
    pub async fn open(
        role: &'static str,
        addresses: Addresses,
        attempt_timeout: Duration,
    ) -> Result<Self, ConnectError> {
        let link = Link::new(role, addresses, Arc::new(Unobserved));
        let connection = link.connect_once(attempt_timeout).await?;
        Ok(Self { link, connection })
    }

    /// The connection itself, for the broker's own modules that take one
    /// (a checkpoint's reset).
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// A confirmed publisher on this connection: one confirm-mode channel
    /// of its own, so a channel error there leaves the command's other
    /// channels (messages it holds) as they are.
    pub fn publisher(&self, settings: PublishSettings) -> Publisher {
        Publisher::new(PublishLink::new(
            self.link.clone(),
            settings,
            Arc::new(Unobserved),
        ))
    }

    /// The connection, for a step that keeps it beyond a borrow of this.
    pub(super) fn shared_connection(&self) -> Arc<Connection> {
        self.connection.clone()
    }

    pub(super) async fn channel(&self) -> lapin::Result<Channel> {
        until_lost(&self.connection, self.connection.create_channel()).await
    }

    /// Closes the connection, and with it every channel still open on it
    /// (the publisher's). A failure is of no consequence: the broker
    /// requeues whatever the connection held. Bounded, so a command whose
    /// broker went silent still ends (the socket closes when the process
    /// exits, with the same effect).
    pub async fn close(self, reason: &str) {
        let closing = self.connection.close(200, reason.into());
        let _ = tokio::time::timeout(CLOSE_LIMIT, closing).await;
    }
}

/// A one-off command keeps no metrics.
struct Unobserved;

impl LinkObserver for Unobserved {
    fn phase_changed(&self, _role: &str, _phase: &Phase) {}
    fn recovered(&self, _role: &str, _took: Duration) {}
}

impl PublishObserver for Unobserved {
    fn published(&self, _exchange: &str, _outcome: PublishOutcome, _took: Duration) {}
    fn unconfirmed(&self, _change: i64) {}
}
