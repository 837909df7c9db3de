//! The data behind one plugin instance's store, and the `host` interface the
//! plugin calls: its only authority.

use std::sync::Arc;

use wasmtime::component::Resource;

use super::bindings::handler_world::acemq::plugin::{host, types};
use super::fault::CallEvidence;
use super::pool::{CallBounds, Observed};
use super::{ConsumerContext, Input, Outgoing};
use crate::envelope::{self, HeaderValue};

/// Per-store state: fixed consumer context, plus what the current call did.
pub struct HostState {
    pub context: Arc<ConsumerContext>,
    /// The plugin version's sha256, in its log lines.
    pub plugin: Arc<str>,
    pub bounds: CallBounds,
    pub call: CallState,
    /// WASI, for a plugin that imports it (built on first use).
    pub wasi: super::wasi::LazyWasi,
}

/// The handle a plugin holds on the message of its current call
/// (`resource message` in the WIT). The message itself stays in
/// [`CallState::message`]; the handle's number names the call it was lent
/// for, so a handle kept past its call is caught, never read as the next
/// message.
pub struct LentMessage;

/// One handler call: the message lent to it, and what it produced besides
/// its outcome.
#[derive(Default)]
pub struct CallState {
    /// The message being handled; `None` between calls.
    pub message: Option<Input>,
    /// Counts this store's calls; the message handle carries it.
    pub number: u32,
    /// Messages buffered by `publish`, sent only if the handler accepts.
    pub outputs: Vec<Outgoing>,
    pub output_bytes: usize,
    pub last_error_log: Option<String>,
    /// Log lines the plugin asked for during this call, written or not.
    pub log_lines: usize,
    /// The first publish this consumer's `publish_to` refused during the
    /// call, in the host's words: a configuration fault (see [`CallEnd`]).
    pub refused_publish: Option<String>,
}

/// What a handler call produced besides its outcome.
pub struct CallEnd {
    /// Messages buffered by `publish`, sent only if the handler accepts.
    pub outputs: Vec<Outgoing>,
    /// A publish the consumer's `publish_to` refused. The plugin was told
    /// (and the SDK turns the refusal into a retry), but no retry can make
    /// the exchange allowed: the host sets the message aside at once.
    pub refused_publish: Option<String>,
}

/// Most bytes of one plugin log line; a longer one keeps its start and end
/// (`envelope::truncate_middle`). Log lines are the plugin's words in the
/// host's logs: a plugin must not be able to flood them.
pub const MAX_LOG_LINE_BYTES: usize = 4096;
/// Most log lines one handler call writes; the rest are counted, and one
/// line at the end of the call says how many were dropped.
pub const MAX_LOG_LINES_PER_CALL: usize = 100;
/// Most bytes of an output's message type (`x-acemq-type`). Not an AMQP
/// short string, but a type name, and the same bound keeps it one.
pub const MAX_MESSAGE_TYPE_BYTES: usize = envelope::MAX_SHORT_STRING;

/// `value` when it is at most `max` bytes; otherwise the plugin's refusal,
/// naming `what` was too long.
fn check_length(what: &str, value: &str, max: usize) -> Result<(), String> {
    if value.len() <= max {
        return Ok(());
    }
    Err(format!(
        "the {what} '{}' is {} bytes long; at most {max} are allowed",
        envelope::preview(value),
        value.len()
    ))
}

impl HostState {
    pub fn new(context: Arc<ConsumerContext>, plugin: Arc<str>) -> Self {
        Self {
            bounds: CallBounds::new(context.limits.max_memory_bytes),
            context,
            plugin,
            call: CallState::default(),
            wasi: super::wasi::LazyWasi::default(),
        }
    }

    /// Resets the per-call state for `message`; returns the handle that
    /// lends it to the plugin.
    pub fn begin_call(&mut self, message: Input) -> Resource<LentMessage> {
        let number = self.call.number.wrapping_add(1);
        self.call = CallState {
            message: Some(message),
            number,
            ..CallState::default()
        };
        self.bounds.limiter.refused = None;
        Resource::new_own(number)
    }

    /// Ends the call: the message is no longer lent; what it buffered, and
    /// any publish its consumer refused, are handed over.
    pub fn end_call(&mut self) -> CallEnd {
        self.log_wasi_output();
        let dropped = self.call.log_lines.saturating_sub(MAX_LOG_LINES_PER_CALL);
        if dropped > 0 {
            tracing::warn!(target: "plugin", queue = %self.context.queue, message_id = self.message_id(),
                "{dropped} more log lines of this call were dropped: a call writes at most {MAX_LOG_LINES_PER_CALL}");
        }
        self.call.message = None;
        self.call.output_bytes = 0;
        CallEnd {
            outputs: std::mem::take(&mut self.call.outputs),
            refused_publish: self.call.refused_publish.take(),
        }
    }

    /// Writes what the plugin printed to stdout (info) and stderr (warn)
    /// during the call to the host log, one line per line, counted and
    /// bounded like its own log lines.
    fn log_wasi_output(&mut self) {
        for (stream, text, dropped) in self.wasi.drain() {
            let level = match stream {
                super::wasi::Stream::Stdout => host::Level::Info,
                super::wasi::Stream::Stderr => host::Level::Warn,
            };
            for line in text.lines().filter(|line| !line.trim().is_empty()) {
                let _ = host::Host::log(self, level, format!("{}: {line}", stream.as_str()));
            }
            if dropped > 0 {
                let _ = host::Host::log(
                    self,
                    host::Level::Warn,
                    format!(
                        "{}: {dropped} more bytes were dropped: a call keeps at most {} bytes of it",
                        stream.as_str(),
                        super::wasi::MAX_CALL_OUTPUT_BYTES
                    ),
                );
            }
        }
    }

    /// The message `handle` names, if it is the one lent to this call.
    fn lent(&self, handle: &Resource<LentMessage>) -> wasmtime::Result<&Input> {
        match &self.call.message {
            Some(message) if handle.rep() == self.call.number => Ok(message),
            _ => Err(wasmtime::Error::msg(
                "the plugin used a message after the handle call it was given to returned",
            )),
        }
    }

    fn message_id(&self) -> &str {
        self.call
            .message
            .as_ref()
            .map_or("", |message| message.envelope.id.as_str())
    }

    fn buffer(&mut self, msg: types::Outgoing) -> Result<(), String> {
        let limits = &self.context.limits;
        // AMQP short strings: lapin cannot even write a longer one.
        check_length("exchange", &msg.exchange, envelope::MAX_SHORT_STRING)?;
        check_length("routing key", &msg.routing_key, envelope::MAX_SHORT_STRING)?;
        if let Some(content_type) = &msg.content_type {
            check_length("content type", content_type, envelope::MAX_SHORT_STRING)?;
        }
        if let Some(message_type) = &msg.message_type {
            check_length("message type", message_type, MAX_MESSAGE_TYPE_BYTES)?;
        }
        if !self.context.publish_to.contains(&msg.exchange) {
            let allowed: Vec<String> = self
                .context
                .publish_to
                .iter()
                .map(|e| format!("'{e}'"))
                .collect();
            let refusal = format!(
                "publishing to exchange '{}' is not allowed for this consumer (publish_to = [{}])",
                msg.exchange,
                allowed.join(", ")
            );
            self.call
                .refused_publish
                .get_or_insert_with(|| refusal.clone());
            return Err(refusal);
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
        // Headers are bytes published like the body's: counted with it.
        let size = msg.body.len() + envelope::plugin_headers_size(&headers);
        if self.call.output_bytes + size > limits.max_output_bytes {
            return Err(format!(
                "publishing {size} more bytes (body and headers) would exceed the {} bytes one call may publish",
                limits.max_output_bytes
            ));
        }
        self.call.output_bytes += size;
        self.call.outputs.push(Outgoing {
            exchange: msg.exchange,
            routing_key: msg.routing_key,
            body: msg.body,
            content_type: msg.content_type,
            headers,
            message_type: msg.message_type,
            persistent: msg.persistent,
            mandatory: msg.mandatory,
        });
        Ok(())
    }
}

/// What the host saw during the call, for naming a fault.
impl Observed for HostState {
    fn evidence(&self) -> CallEvidence {
        CallEvidence {
            refused_memory: self.bounds.limiter.refused,
            last_error_log: self.call.last_error_log.clone(),
        }
    }

    fn bounds(&mut self) -> &mut CallBounds {
        &mut self.bounds
    }

    fn bounds_ref(&self) -> &CallBounds {
        &self.bounds
    }
}

impl types::Host for HostState {}

impl wasmtime_wasi::WasiView for HostState {
    fn ctx(&mut self) -> wasmtime_wasi::WasiCtxView<'_> {
        self.wasi.view()
    }
}

/// Each part is copied out only when the plugin asks for it.
impl types::HostMessage for HostState {
    fn envelope(&mut self, handle: Resource<LentMessage>) -> wasmtime::Result<types::Envelope> {
        let e = &self.lent(&handle)?.envelope;
        Ok(types::Envelope {
            id: e.id.clone(),
            message_type: e.message_type.clone(),
            version: e.version,
            correlation_id: e.correlation_id.clone(),
            causation_id: e.causation_id.clone(),
            attempt: e.attempt,
            first_seen_ms: e.first_seen_ms,
            origin: e.origin.clone(),
        })
    }

    fn delivery(&mut self, handle: Resource<LentMessage>) -> wasmtime::Result<types::Delivery> {
        let message = self.lent(&handle)?;
        Ok(types::Delivery {
            queue: self.context.queue.clone(),
            exchange: message.exchange.clone(),
            routing_key: message.routing_key.clone(),
            redelivered: message.redelivered,
            stream_offset: message.stream_offset,
        })
    }

    fn content_type(&mut self, handle: Resource<LentMessage>) -> wasmtime::Result<Option<String>> {
        Ok(self.lent(&handle)?.content_type.clone())
    }

    fn headers(&mut self, handle: Resource<LentMessage>) -> wasmtime::Result<types::Headers> {
        Ok(self
            .lent(&handle)?
            .headers
            .iter()
            .map(|(name, value)| (name.clone(), to_wit(value)))
            .collect())
    }

    fn body(&mut self, handle: Resource<LentMessage>) -> wasmtime::Result<Vec<u8>> {
        Ok(self.lent(&handle)?.body.to_vec())
    }

    /// Nothing to free: the message belongs to the call, not to the handle.
    fn drop(&mut self, _handle: Resource<LentMessage>) -> wasmtime::Result<()> {
        Ok(())
    }
}

impl host::Host for HostState {
    fn log(&mut self, level: host::Level, text: String) -> wasmtime::Result<()> {
        self.call.log_lines = self.call.log_lines.saturating_add(1);
        let text = envelope::truncate_middle(&text, MAX_LOG_LINE_BYTES).into_owned();
        if self.call.log_lines > MAX_LOG_LINES_PER_CALL {
            // Not written, but an error still names a fault that follows.
            if matches!(level, host::Level::Error) {
                self.call.last_error_log = Some(text);
            }
            return Ok(());
        }
        let queue = self.context.queue.as_str();
        let id = self.message_id();
        let plugin = &*self.plugin;
        // Shown as `-` between calls (start-up code may log).
        let trace_id = self.call.message.as_ref().and_then(|m| m.trace_id);
        let trace_id = tracing::field::display(OrDash(trace_id));
        match level {
            host::Level::Trace => {
                tracing::trace!(target: "plugin", queue, message_id = id, trace_id, plugin, "{text}")
            }
            host::Level::Debug => {
                tracing::debug!(target: "plugin", queue, message_id = id, trace_id, plugin, "{text}")
            }
            host::Level::Info => {
                tracing::info!(target: "plugin", queue, message_id = id, trace_id, plugin, "{text}")
            }
            host::Level::Warn => {
                tracing::warn!(target: "plugin", queue, message_id = id, trace_id, plugin, "{text}")
            }
            host::Level::Error => {
                tracing::error!(target: "plugin", queue, message_id = id, trace_id, plugin, "{text}");
                self.call.last_error_log = Some(text);
            }
        }
        Ok(())
    }

    fn publish(&mut self, msg: types::Outgoing) -> wasmtime::Result<Result<(), String>> {
        Ok(self.buffer(msg))
    }

    fn config(&mut self, key: String) -> wasmtime::Result<Option<String>> {
        Ok(self.context.config.get(&key).cloned())
    }

    fn now_ms(&mut self) -> wasmtime::Result<u64> {
        Ok(envelope::now_ms())
    }
}

/// A header value as the guest reads it.
fn to_wit(value: &HeaderValue) -> types::HeaderValue {
    match value {
        HeaderValue::Text(s) => types::HeaderValue::Text(s.clone()),
        HeaderValue::Int(i) => types::HeaderValue::Int(*i),
        HeaderValue::Float(f) => types::HeaderValue::Float(*f),
        HeaderValue::Bool(b) => types::HeaderValue::Boolean(*b),
        HeaderValue::Bytes(b) => types::HeaderValue::Bytes(b.clone()),
    }
}

/// A header value the guest handed over (in something it publishes).
fn from_wit(value: types::HeaderValue) -> HeaderValue {
    match value {
        types::HeaderValue::Text(s) => HeaderValue::Text(s),
        types::HeaderValue::Int(i) => HeaderValue::Int(i),
        types::HeaderValue::Float(f) => HeaderValue::Float(f),
        types::HeaderValue::Boolean(b) => HeaderValue::Bool(b),
        types::HeaderValue::Bytes(b) => HeaderValue::Bytes(b),
    }
}

/// An optional value shown as itself, or `-` when absent.
struct OrDash<T>(Option<T>);

impl<T: std::fmt::Display> std::fmt::Display for OrDash<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(value) => value.fmt(f),
            None => f.write_str("-"),
        }
    }
}
