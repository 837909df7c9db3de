//! Opening one connection: the broker addresses tried in turn, each failure
//! sorted into "the broker said no" (credentials, vhost: trying again will
//! not help) and "could not reach it" (worth another round), and every
//! address shown with its password masked.

use std::time::Duration;

use lapin::tcp::AsyncTcpStream;
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Connection, ConnectionProperties, ErrorKind};

use super::BrokerUrl;
use super::frame_guard::transport::GuardedReactor;
use super::tls::Tls;

/// Heartbeat asked for when the URL names none: a blackholed connection is
/// noticed after about two of these, not after RabbitMQ's default 60 s.
pub const DEFAULT_HEARTBEAT_SECS: u16 = 10;

/// `frame_max` asked for when the URL names none: RabbitMQ's own default,
/// so the negotiated size is the one a default broker would choose anyway.
/// Asked for rather than left to the broker because lapin sizes each
/// connection's two buffers (32 frames each) from what was asked before the
/// broker answers: asked 0, it makes them for 4 KiB frames and then grows
/// them by writing 8 MiB of zeros per connection, all of it resident from
/// the first second; asked this, it takes them zeroed from the allocator,
/// and only what traffic touches becomes resident (the host's idle RSS
/// fell from 37 to 20 MiB with the two connections; docs/deploying.md).
/// A broker configured with larger frames gets this size from the host
/// unless the URL asks for more (`?frame_max=`).
pub const DEFAULT_FRAME_MAX: u32 = 131_072;

impl std::fmt::Display for Addresses {
    /// The addresses, passwords masked, separated by commas.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, url) in self.urls.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{url}")?;
        }
        Ok(())
    }
}

/// How one round of connection attempts failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConnectError {
    /// The broker answered and refused the login or the vhost. Retrying the
    /// same credentials cannot succeed, so a start reports it at once.
    #[error("the broker at {address} refused the connection: {reason}")]
    Refused { address: String, reason: String },
    /// No address could be reached (network, DNS, TLS, broker not up yet).
    #[error("could not reach the broker at {address}: {reason}")]
    Unreachable { address: String, reason: String },
}

/// The addresses to connect to, in the order to try them, and how.
#[derive(Debug, Clone)]
pub struct Addresses {
    urls: Vec<BrokerUrl>,
    /// The name shown in the management UI.
    name: String,
    /// How `amqps://` addresses are reached.
    tls: Option<Tls>,
}

impl Addresses {
    /// `urls` must not be empty (the config refuses an empty list).
    pub fn new(urls: Vec<BrokerUrl>, name: impl Into<String>) -> Self {
        assert!(!urls.is_empty(), "at least one broker address");
        Self {
            urls,
            name: name.into(),
            tls: None,
        }
    }

    /// Reaches `amqps://` addresses with `tls` (without it, lapin's
    /// defaults: the built-in roots, the URL's host as the name).
    pub fn with_tls(mut self, tls: Option<Tls>) -> Self {
        self.tls = tls;
        self
    }

    pub fn len(&self) -> usize {
        self.urls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    /// The address at `index`, wrapping round.
    pub fn at(&self, index: usize) -> &BrokerUrl {
        &self.urls[index % self.urls.len()]
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// One attempt per address, starting at `first` and going round once.
    /// Returns the connection and the index of the address that answered.
    ///
    /// A refusal ends the round at once: another node of the same cluster
    /// has the same users and vhosts.
    pub async fn connect_round(
        &self,
        first: usize,
        attempt_timeout: Duration,
    ) -> Result<(Connection, usize), ConnectError> {
        let mut last = None;
        for offset in 0..self.urls.len() {
            let index = (first + offset) % self.urls.len();
            match self.connect_one(index, attempt_timeout).await {
                Ok(connection) => return Ok((connection, index)),
                Err(refused @ ConnectError::Refused { .. }) => return Err(refused),
                Err(unreachable) => {
                    tracing::debug!(error = %unreachable, "broker address not reachable");
                    last = Some(unreachable);
                }
            }
        }
        Err(last.expect("at least one address was tried"))
    }

    async fn connect_one(
        &self,
        index: usize,
        timeout: Duration,
    ) -> Result<Connection, ConnectError> {
        let url = &self.urls[index];
        let mut uri = url.amqp_uri();
        uri.query.heartbeat = uri.query.heartbeat.or(Some(DEFAULT_HEARTBEAT_SECS));
        uri.query.frame_max = uri.query.frame_max.or(Some(DEFAULT_FRAME_MAX));
        let properties =
            ConnectionProperties::default().with_connection_name(self.name.clone().into());
        // The parsed URI, never the text: lapin's parse errors repeat the URL.
        let attempt = open_guarded(uri, properties, self.tls.clone());
        let result = match tokio::time::timeout(timeout, attempt).await {
            Ok(result) => result,
            Err(_) => {
                return Err(ConnectError::Unreachable {
                    address: url.to_string(),
                    reason: format!("no answer within {}", humantime::format_duration(timeout)),
                });
            }
        };
        result.map_err(|error| {
            // No lapin error is known to hold the password once it has the
            // parsed URI; scrubbing keeps it so should one start to.
            let reason = url.scrub(&error.to_string());
            let address = url.to_string();
            if is_refusal(&error) {
                ConnectError::Refused { address, reason }
            } else {
                ConnectError::Unreachable { address, reason }
            }
        })
    }
}

/// Opens a connection whose inbound bytes pass through the frame guard
/// (`frame_guard`): TCP, then TLS for `amqps://`, then the guard, so that no
/// producer's bytes in a delivery can make lapin close the connection.
/// lapin calls the closure again for each reconnection of its own.
async fn open_guarded(
    uri: AMQPUri,
    properties: ConnectionProperties,
    tls: Option<Tls>,
) -> lapin::Result<Connection> {
    let reactor = GuardedReactor::new(uri.query.frame_max.unwrap_or(0));
    let runtime = reactor.runtime();
    Connection::connector(
        uri,
        runtime,
        async move |uri: AMQPUri, _runtime| {
            let tokio = async_rs::Runtime::new(reactor.tokio().clone());
            let host = uri.authority.host.clone();
            let addresses = tokio.to_socket_addrs((host.clone(), uri.authority.port));
            let stream = AsyncTcpStream::connect(&tokio, addresses).await?;
            let stream = match uri.scheme {
                AMQPScheme::AMQP => stream,
                AMQPScheme::AMQPS => {
                    let tls = match &tls {
                        Some(tls) => tls.clone(),
                        None => Tls::defaults().map_err(std::io::Error::other)?,
                    };
                    tls.handshake(stream, &host).await?
                }
            };
            Ok(AsyncTcpStream::Plain(reactor.guard(stream)))
        },
        properties,
    )
    .await
}

/// The broker refused the login (403 ACCESS_REFUSED) or the vhost (530
/// NOT_ALLOWED), as opposed to a network failure.
fn is_refusal(error: &lapin::Error) -> bool {
    match error.kind() {
        ErrorKind::ProtocolError(amqp) => matches!(amqp.get_id(), 403 | 530),
        ErrorKind::AuthProviderError(_) => true,
        _ => false,
    }
}
