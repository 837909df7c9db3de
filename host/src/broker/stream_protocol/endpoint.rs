//! Where the stream protocol is reached, and connecting to it.
//!
//! The stream listener is the `rabbitmq_stream` plugin's, on the same nodes
//! as AMQP: its address is derived from each configured AMQP address (same
//! host, user, password and vhost; port `[broker] stream_port`, by default
//! 5552, or 5551 for `amqps://`). TLS follows the AMQP address's scheme.
//!
//! TLS is the AMQP connection's own (`[broker.tls]`: the CA file or the
//! built-in roots, a client certificate, a server name), set up once.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use lapin::uri::AMQPScheme;

use super::connection::{StreamConnection, Target};
use crate::broker::Tls;
use crate::broker::address::BrokerUrl;

/// The stream plugin's default port, and its default with TLS.
pub const DEFAULT_PORT: u16 = 5552;
pub const DEFAULT_TLS_PORT: u16 = 5551;

/// One node's stream listener.
#[derive(Clone)]
struct Endpoint {
    host: String,
    port: u16,
    user: String,
    password: String,
    vhost: String,
    tls: Option<Tls>,
}

/// The stream listeners of the configured nodes, tried in turn.
pub struct StreamEndpoints {
    /// The configured nodes' listeners, then those the broker advertised
    /// for a stream's members (a cluster's other nodes: where to go when
    /// the configured ones are down).
    endpoints: Mutex<Vec<Endpoint>>,
    /// The connections' name in the management UI.
    name: String,
    /// The endpoint tried first by the next connect (the one that last
    /// worked, or the one after the last that failed).
    next: AtomicUsize,
}

impl std::fmt::Debug for StreamEndpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        let shown: Vec<String> = self.snapshot().iter().map(Endpoint::shown).collect();
        f.debug_struct("StreamEndpoints")
            .field("endpoints", &shown)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    fn shown(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rabbitmq-stream+tls"
        } else {
            "rabbitmq-stream"
        };
        format!("{scheme}://{}:{}", self.host, self.port)
    }

    fn target(&self, name: String) -> Target {
        Target {
            host: self.host.clone(),
            port: self.port,
            user: self.user.clone(),
            password: self.password.clone(),
            vhost: self.vhost.clone(),
            tls: self.tls.clone(),
            name,
        }
    }
}

impl StreamEndpoints {
    /// The stream listeners of `urls` at `port` (the plugin's default when
    /// `None`), for connections named `{name}.{purpose}`; `tls` for
    /// `amqps://` addresses (the built-in roots when `None`).
    pub fn new(
        urls: &[BrokerUrl],
        port: Option<u16>,
        tls: Option<Tls>,
        name: String,
    ) -> Result<Self, crate::broker::tls::TlsError> {
        let endpoints = urls
            .iter()
            .map(|url| endpoint_of(url, port, tls.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            endpoints: Mutex::new(endpoints),
            name,
            next: AtomicUsize::new(0),
        })
    }

    /// Where the next connection goes, as shown in logs.
    pub fn shown(&self) -> String {
        let endpoints = self.snapshot();
        let at = self.next.load(Ordering::Relaxed) % endpoints.len().max(1);
        endpoints.get(at).map(Endpoint::shown).unwrap_or_default()
    }

    /// Connects to the first listener that answers, starting with the one
    /// that last worked; each attempt bounded. The error names every
    /// listener tried and why it failed.
    pub async fn connect(&self, purpose: &str) -> Result<StreamConnection, String> {
        let name = format!("{}.{purpose}", self.name);
        let endpoints = self.snapshot();
        let count = endpoints.len();
        let first = self.next.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for step in 0..count {
            let at = (first + step) % count;
            let endpoint = &endpoints[at];
            match StreamConnection::open(&endpoint.target(name.clone())).await {
                Ok(client) => {
                    self.next.store(at, Ordering::Relaxed);
                    return Ok(client);
                }
                Err(why) => failures.push(format!("{}: {why}", endpoint.shown())),
            }
        }
        self.next.store(first + 1, Ordering::Relaxed);
        Err(format!(
            "cannot reach the stream protocol ({})",
            failures.join("; ")
        ))
    }
}

impl StreamEndpoints {
    fn snapshot(&self) -> Vec<Endpoint> {
        self.endpoints.lock().expect("endpoints poisoned").clone()
    }

    /// Connects (see [`StreamEndpoints::connect`]) to read `stream`, and
    /// learns where the stream's members listen, so that a later connect
    /// reaches another member when the configured nodes are down.
    pub async fn connect_to_read(
        &self,
        purpose: &str,
        stream: &str,
    ) -> Result<StreamConnection, String> {
        let connection = self.connect(purpose).await?;
        match connection.members(stream).await {
            Ok(members) => self.learn(members.leader.iter().chain(&members.replicas)),
            Err(why) => {
                tracing::debug!(stream, error = %why, "cannot learn where the stream's members listen")
            }
        }
        Ok(connection)
    }

    /// Adds the listeners at `places` not known yet, with the credentials
    /// and TLS of the first configured one.
    fn learn<'a>(&self, places: impl Iterator<Item = &'a (String, u16)>) {
        let mut endpoints = self.endpoints.lock().expect("endpoints poisoned");
        let Some(model) = endpoints.first().cloned() else {
            return;
        };
        for (host, port) in places {
            if endpoints.iter().any(|e| e.host == *host && e.port == *port) {
                continue;
            }
            tracing::debug!(host = %host, port, "learned a stream listener from the broker's metadata");
            endpoints.push(Endpoint {
                host: host.clone(),
                port: *port,
                ..model.clone()
            });
        }
    }
}

/// The stream listener beside the AMQP listener of `url`.
fn endpoint_of(
    url: &BrokerUrl,
    port: Option<u16>,
    tls: Option<&Tls>,
) -> Result<Endpoint, crate::broker::tls::TlsError> {
    let uri = url.amqp_uri();
    let secure = matches!(uri.scheme, AMQPScheme::AMQPS);
    let tls = match (secure, tls) {
        (false, _) => None,
        (true, Some(tls)) => Some(tls.clone()),
        (true, None) => Some(Tls::defaults()?),
    };
    let default_port = if secure {
        DEFAULT_TLS_PORT
    } else {
        DEFAULT_PORT
    };
    Ok(Endpoint {
        host: uri.authority.host,
        port: port.unwrap_or(default_port),
        user: uri.authority.userinfo.username,
        password: uri.authority.userinfo.password,
        vhost: uri.vhost,
        tls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> BrokerUrl {
        BrokerUrl::parse(text).unwrap()
    }

    #[test]
    fn the_stream_listener_is_derived_from_the_amqp_address() {
        let endpoints = StreamEndpoints::new(
            &[url("amqp://app:s3cret@rabbit-1:5672/orders")],
            None,
            None,
            "acemq-host.stream".into(),
        )
        .unwrap();
        let endpoint = &endpoints.snapshot()[0];
        assert_eq!(endpoint.host, "rabbit-1");
        assert_eq!(endpoint.port, DEFAULT_PORT);
        assert_eq!(endpoint.user, "app");
        assert_eq!(endpoint.password, "s3cret");
        assert_eq!(endpoint.vhost, "orders");
        assert!(endpoint.tls.is_none());
        assert_eq!(endpoints.shown(), "rabbitmq-stream://rabbit-1:5552");
        assert!(!format!("{endpoints:?}").contains("s3cret"));
        let configured = StreamEndpoints::new(
            &[url("amqp://guest:guest@127.0.0.1:5672/%2f")],
            Some(15552),
            None,
            String::new(),
        )
        .unwrap();
        assert_eq!(configured.snapshot()[0].port, 15552);
        assert_eq!(configured.snapshot()[0].vhost, "/");
    }

    #[test]
    fn an_amqps_address_has_its_stream_listener_over_tls_on_5551() {
        let endpoints = StreamEndpoints::new(
            &[url("amqps://app:pw@rabbit-1/")],
            None,
            None,
            String::new(),
        )
        .unwrap();
        assert_eq!(endpoints.snapshot()[0].port, DEFAULT_TLS_PORT);
        assert!(endpoints.snapshot()[0].tls.is_some());
        assert_eq!(endpoints.shown(), "rabbitmq-stream+tls://rabbit-1:5551");
    }
}
