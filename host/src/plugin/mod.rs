//! Plugins: loading components, running them under limits, pooling their
//! instances and swapping versions while the host runs.
//!
//! The sandbox, as `wit/plugin.wit` and `SECURITY.md` say it too: A plugin
//! has no files, sockets or environment: it reaches the broker, the log and
//! its configuration only through the `host` interface. A component that
//! imports WASI 0.2 (as Python and JavaScript runtimes do) gets the part of
//! it SECURITY.md lists, locked down: its clocks and random numbers, but no
//! file, socket or environment variable. The grant is stated once in code,
//! in `host/wasi.rs` (`GRANT`); each interface of `host` has its file in
//! `host/`.

/// The version of `wit/plugin.wit` (`package acemq:plugin@...`) this host
/// implements. A plugin built against a version this host does not
/// implement (this one or [`legacy_contract_version`]) is refused when it
/// loads (`contract.rs`). A macro, so that names can be built from it with
/// `concat!` in constants.
macro_rules! contract_version {
    () => {
        "0.4.0"
    };
}

/// The version of `wit/v0.3/plugin.wit`, the frozen contract whose plugins
/// this host still loads and runs (`host/v0_3.rs`).
macro_rules! legacy_contract_version {
    () => {
        "0.3.0"
    };
}

/// [`contract`] for the 0.3 contract: `legacy_contract!("handler")` is
/// `acemq:plugin/handler@0.3.0`.
#[allow(unused_macros)]
macro_rules! legacy_contract {
    ($name:literal) => {
        concat!("acemq:plugin/", $name, "@", legacy_contract_version!())
    };
}

/// A name of `wit/plugin.wit`, qualified with the package and the version
/// this host implements: `contract!("handler")` is `acemq:plugin/handler@0.4.0`.
macro_rules! contract {
    ($name:literal) => {
        concat!("acemq:plugin/", $name, "@", contract_version!())
    };
}

mod bindings;
pub mod capacity;
pub mod codec;
pub mod componentize;
pub mod config_keys;
mod contract;
mod engine;
mod fault;
pub mod fault_window;
mod guest_error;
mod handler;
mod host;
pub mod inspect;
mod limiter;
mod pool;
pub mod swap;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use lapin::BasicProperties;
use lapin::types::ShortString;

pub use codec::{CodecSet, CodecVersion, Codecs, Conversion};
pub use contract::Contract;
pub use engine::{
    CacheChoice, CompiledPlugin, EPOCH_TICK, EngineSettings, PluginEngine, default_cache_key_file,
};
pub use fault::{Fault, FaultKind};
pub use handler::{HandlerSlot, HandlerVersion, Invocation};
pub use host::state::StateEnd;
pub use host::wasi;
pub use pool::InstanceCost;

use crate::config::Isolation;
use crate::envelope::{Envelope, HeaderValue, OutputFields};

/// A plugin file that cannot be used, and why. Always names the file.
#[derive(Debug, Clone, thiserror::Error)]
pub struct PluginError {
    pub path: PathBuf,
    pub reason: String,
}

impl PluginError {
    pub fn new(path: &Path, reason: impl Into<String>) -> Self {
        Self {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "plugin {}: {}", self.path.display(), self.reason)
    }
}

/// What one consumer allows its plugin.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Wall-clock limit of one handler call.
    pub deadline: Duration,
    /// Linear-memory cap of one instance, in bytes.
    pub max_memory_bytes: u64,
    /// Most messages one call may buffer for publishing.
    pub max_outputs: usize,
    /// Most bytes those messages may add up to.
    pub max_output_bytes: usize,
    pub isolation: Isolation,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(2),
            max_memory_bytes: 64 << 20,
            max_outputs: 1000,
            max_output_bytes: 64 << 20,
            isolation: Isolation::Pooled,
        }
    }
}

/// What a consumer's plugin may see and do, fixed for the consumer's life.
#[derive(Debug, Clone, Default)]
pub struct ConsumerContext {
    /// The consumer's queue: where its messages come from, and a tag in logs.
    pub queue: String,
    /// The `[consumers.config]` table, read by `config(key)`.
    pub config: BTreeMap<String, String>,
    /// Exchanges `publish` may target (`publish_to`).
    pub publish_to: BTreeSet<String>,
    /// The longest delay its plugin may publish with (`deliver-at-ms`);
    /// `None`: it may not publish delayed (`publish_delayed` unset).
    pub delayed: Option<Duration>,
    /// Its state namespace (`[[consumers]] state`), if it has one.
    pub state: Option<Arc<crate::state::NamespaceAccess>>,
    pub limits: Limits,
}

/// One message as handed to a handler.
///
/// Owned, because the plugin's store holds it for the length of the call and
/// the plugin copies out only the parts it reads; cheap to build, because the
/// envelope and the properties are shared, the body reference-counted and
/// the exchange and routing key moved from the delivery. The queue is the
/// consumer's ([`ConsumerContext::queue`]). Built from a delivery by
/// `crate::delivery::handler_input`.
#[derive(Debug, Clone)]
pub struct Input {
    pub envelope: Arc<Envelope>,
    /// The delivery's AMQP properties, shared with the consumer's pipeline:
    /// `reply-to`, `correlation-id` and the content type are read from them
    /// when a plugin asks ([`Input::reply_to`], [`Input::amqp_correlation_id`],
    /// [`Input::content_type`]), not copied for every delivery.
    pub properties: Arc<BasicProperties>,
    pub exchange: String,
    pub routing_key: String,
    pub redelivered: bool,
    pub stream_offset: Option<u64>,
    /// The content type a codec decoded the body into, which the handler
    /// sees instead of the delivery's; `None` until a codec decodes it.
    pub decoded_content_type: Option<String>,
    pub headers: Vec<(String, HeaderValue)>,
    pub body: Bytes,
    /// The delivery's trace, for the plugin's log lines.
    pub trace_id: Option<crate::trace::context::TraceIdHex>,
}

impl Input {
    /// The AMQP `reply-to` property.
    #[must_use]
    pub fn reply_to(&self) -> Option<&str> {
        self.properties.reply_to().as_ref().map(ShortString::as_str)
    }

    /// The AMQP `correlation-id` property (a plain RPC client's pairing).
    #[must_use]
    pub fn amqp_correlation_id(&self) -> Option<&str> {
        self.properties
            .correlation_id()
            .as_ref()
            .map(ShortString::as_str)
    }

    /// The body's content type: a codec's, once one decoded it, else the
    /// delivery's property.
    #[must_use]
    pub fn content_type(&self) -> Option<&str> {
        self.decoded_content_type.as_deref().or_else(|| {
            self.properties
                .content_type()
                .as_ref()
                .map(ShortString::as_str)
        })
    }
}

/// A message a plugin asked to publish, checked against the allowlist and
/// the reserved headers when it was buffered.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    pub exchange: String,
    pub routing_key: String,
    pub body: Vec<u8>,
    pub content_type: Option<String>,
    pub headers: Vec<(String, HeaderValue)>,
    /// Its id (settled when it was buffered) and the envelope fields the
    /// plugin chose.
    pub envelope: OutputFields,
    pub persistent: bool,
    /// Must reach a queue; `None` follows the consumer's setting.
    pub mandatory: Option<bool>,
    /// Delivered through the scheduler at this time (epoch ms), not now.
    pub deliver_at_ms: Option<u64>,
}

/// What the handler decided, in the host's terms: the WIT's `outcome`,
/// named as there and in the guest SDK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Accept,
    Retry(String),
    Reject(String),
    Park(String),
}

/// A plain input for unit tests: a new message with an empty JSON body.
#[cfg(test)]
pub(crate) fn test_input() -> Input {
    Input {
        envelope: Arc::new(Envelope::new("test", "acemq@test", 1_700_000_000_000)),
        properties: Arc::new(
            BasicProperties::default().with_content_type("application/json".into()),
        ),
        exchange: "in".into(),
        routing_key: "test".into(),
        redelivered: false,
        stream_offset: None,
        decoded_content_type: None,
        headers: Vec::new(),
        body: Bytes::from_static(b"{}"),
        trace_id: None,
    }
}
