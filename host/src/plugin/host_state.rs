//! The data behind one plugin instance's store, and the `host` interface the
//! plugin calls: its only authority.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use wasmtime::ResourceLimiter;

use super::bindings::handler_world::acemq::plugin::{host, types};
use super::fault::CallEvidence;
use super::{ConsumerContext, Outgoing};
use crate::envelope::{self, HeaderValue};

/// Per-store state: fixed consumer context, plus what the current call did.
pub struct HostState {
    pub context: Arc<ConsumerContext>,
    pub limiter: MemoryLimiter,
    pub call: CallState,
}

/// What one handler call produced besides its outcome.
#[derive(Default)]
pub struct CallState {
    /// Id of the message being handled, for log lines.
    pub message_id: String,
    /// Messages buffered by `publish`, sent only if the handler accepts.
    pub outputs: Vec<Outgoing>,
    pub output_bytes: usize,
    pub last_error_log: Option<String>,
}

impl HostState {
    pub fn new(context: Arc<ConsumerContext>) -> Self {
        let limit = usize::try_from(context.limits.max_memory_bytes).unwrap_or(usize::MAX);
        Self {
            context,
            limiter: MemoryLimiter::new(limit),
            call: CallState::default(),
        }
    }

    /// Resets the per-call state before a new message.
    pub fn begin_call(&mut self, message_id: &str) {
        self.call = CallState {
            message_id: message_id.to_string(),
            ..CallState::default()
        };
        self.limiter.refused = None;
    }

    /// What the host saw during the call, for naming a fault.
    pub fn evidence(&self) -> CallEvidence {
        CallEvidence {
            refused_memory: self.limiter.refused,
            last_error_log: self.call.last_error_log.clone(),
        }
    }

    fn buffer(&mut self, msg: types::Outgoing) -> Result<(), String> {
        let limits = &self.context.limits;
        if !self.context.publish_to.contains(&msg.exchange) {
            let allowed: Vec<&str> = self.context.publish_to.iter().map(String::as_str).collect();
            return Err(format!(
                "publishing to exchange '{}' is not allowed for this consumer (publish_to = [{}])",
                msg.exchange,
                allowed
                    .iter()
                    .map(|e| format!("'{e}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let headers: Vec<(String, HeaderValue)> = msg
            .headers
            .into_iter()
            .map(|(k, v)| (k, from_wit(v)))
            .collect();
        envelope::check_plugin_headers(&headers).map_err(|e| e.to_string())?;
        if self.call.outputs.len() >= limits.max_outputs {
            return Err(format!(
                "this message already buffered {} messages, the most one call may publish",
                limits.max_outputs
            ));
        }
        if self.call.output_bytes + msg.body.len() > limits.max_output_bytes {
            return Err(format!(
                "publishing {} more bytes would exceed the {} bytes one call may publish",
                msg.body.len(),
                limits.max_output_bytes
            ));
        }
        self.call.output_bytes += msg.body.len();
        self.call.outputs.push(Outgoing {
            exchange: msg.exchange,
            routing_key: msg.routing_key,
            body: msg.body,
            content_type: msg.content_type,
            headers,
            message_type: msg.message_type,
            persistent: msg.persistent,
        });
        Ok(())
    }
}

impl types::Host for HostState {}

impl host::Host for HostState {
    fn log(&mut self, level: host::Level, text: String) {
        let queue = self.context.queue.as_str();
        let id = self.call.message_id.as_str();
        match level {
            host::Level::Trace => {
                tracing::trace!(target: "plugin", queue, message_id = id, "{text}")
            }
            host::Level::Debug => {
                tracing::debug!(target: "plugin", queue, message_id = id, "{text}")
            }
            host::Level::Info => tracing::info!(target: "plugin", queue, message_id = id, "{text}"),
            host::Level::Warn => tracing::warn!(target: "plugin", queue, message_id = id, "{text}"),
            host::Level::Error => {
                tracing::error!(target: "plugin", queue, message_id = id, "{text}");
                self.call.last_error_log = Some(text);
            }
        }
    }

    fn publish(&mut self, msg: types::Outgoing) -> Result<(), String> {
        self.buffer(msg)
    }

    fn config(&mut self, key: String) -> Option<String> {
        self.context.config.get(&key).cloned()
    }

    fn now_ms(&mut self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// Caps linear memory, and remembers a refusal so the resulting trap can be
/// reported as "out of memory" rather than a bare `unreachable`.
pub struct MemoryLimiter {
    limit: usize,
    pub refused: Option<usize>,
}

impl MemoryLimiter {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            refused: None,
        }
    }
}

/// Table growth beyond this many elements is refused; guests need a handful.
const MAX_TABLE_ELEMENTS: usize = 100_000;

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.refused = Some(desired);
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// A header value lent to the guest (lowered straight from the host's copy).
pub fn to_wit(value: &HeaderValue) -> types::HeaderValueParam<'_> {
    match value {
        HeaderValue::Text(s) => types::HeaderValueParam::Text(s),
        HeaderValue::Int(i) => types::HeaderValueParam::Int(*i),
        HeaderValue::Float(f) => types::HeaderValueParam::Float(*f),
        HeaderValue::Bool(b) => types::HeaderValueParam::Boolean(*b),
        HeaderValue::Bytes(b) => types::HeaderValueParam::Bytes(b),
    }
}

/// A header value the guest handed over (in something it publishes).
pub fn from_wit(value: types::HeaderValueResult) -> HeaderValue {
    match value {
        types::HeaderValueResult::Text(s) => HeaderValue::Text(s),
        types::HeaderValueResult::Int(i) => HeaderValue::Int(i),
        types::HeaderValueResult::Float(f) => HeaderValue::Float(f),
        types::HeaderValueResult::Boolean(b) => HeaderValue::Bool(b),
        types::HeaderValueResult::Bytes(b) => HeaderValue::Bytes(b),
    }
}
