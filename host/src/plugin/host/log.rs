//! `log` of `acemq:plugin/host`: the plugin's lines in the host's log,
//! tagged with the consumer, the message and the plugin version, and
//! bounded in size and number so that a plugin cannot flood the log.

use std::sync::Arc;

use super::super::bindings::handler_world::acemq::plugin::host::Level;
use super::super::{ConsumerContext, Input};
use super::HostInterface;
use crate::envelope;

/// Most bytes of one plugin log line; a longer one keeps its start and end
/// (`envelope::truncate_middle`). Log lines are the plugin's words in the
/// host's logs: a plugin must not be able to flood them.
pub const MAX_LOG_LINE_BYTES: usize = 4096;
/// Most log lines one handler call writes; the rest are counted, and one
/// line at the end of the call says how many were dropped.
pub const MAX_LOG_LINES_PER_CALL: usize = 100;

/// One instance's log: what tags its lines, and what its current call wrote.
pub struct Log {
    context: Arc<ConsumerContext>,
    /// The plugin version's sha256, in its log lines.
    plugin: Arc<str>,
    /// Lines the plugin asked for during this call, written or not.
    lines: usize,
    /// The last error the plugin logged in its last call: it names a fault
    /// that follows (kept after the call, for the fault's reason).
    last_error: Option<String>,
    /// The cause of a trap the plugin printed to stderr during the call
    /// (an uncaught exception), when it printed one.
    guest_error: Option<String>,
}

impl HostInterface for Log {
    fn prepare(context: &Arc<ConsumerContext>, plugin: &Arc<str>) -> Self {
        Self {
            context: context.clone(),
            plugin: plugin.clone(),
            lines: 0,
            last_error: None,
            guest_error: None,
        }
    }
}

impl Log {
    /// A new call: its lines are counted from zero.
    pub fn begin_call(&mut self) {
        self.lines = 0;
        self.last_error = None;
        self.guest_error = None;
    }

    /// Says how many lines of the call were dropped beyond the bound.
    pub fn end_call(&mut self, message: Option<&Input>) {
        let dropped = self.lines.saturating_sub(MAX_LOG_LINES_PER_CALL);
        if dropped > 0 {
            tracing::warn!(target: "plugin", queue = %self.context.queue, message_id = message_id(message),
                "{dropped} more log lines of this call were dropped: a call writes at most {MAX_LOG_LINES_PER_CALL}");
        }
    }

    pub fn last_error(&self) -> Option<String> {
        self.last_error.clone()
    }

    /// Notes what the plugin's stderr said made it fail (see
    /// [`super::super::guest_error`]).
    pub fn note_guest_error(&mut self, cause: String) {
        self.guest_error = Some(cause);
    }

    pub fn guest_error(&self) -> Option<String> {
        self.guest_error.clone()
    }

    /// Writes one plugin line at `level`, tagged with `message` (the one
    /// lent to the current call; `-` between calls: start-up code may log).
    pub fn write(&mut self, level: Level, text: &str, message: Option<&Input>) {
        self.lines = self.lines.saturating_add(1);
        let text = envelope::truncate_middle(text, MAX_LOG_LINE_BYTES).into_owned();
        if self.lines > MAX_LOG_LINES_PER_CALL {
            // Not written, but an error still names a fault that follows.
            if matches!(level, Level::Error) {
                self.last_error = Some(text);
            }
            return;
        }
        let queue = self.context.queue.as_str();
        let id = message_id(message);
        let plugin = &*self.plugin;
        let trace_id = tracing::field::display(OrDash(message.and_then(|m| m.trace_id)));
        match level {
            Level::Trace => {
                tracing::trace!(target: "plugin", queue, message_id = id, trace_id, plugin, "{text}")
            }
            Level::Debug => {
                tracing::debug!(target: "plugin", queue, message_id = id, trace_id, plugin, "{text}")
            }
            Level::Info => {
                tracing::info!(target: "plugin", queue, message_id = id, trace_id, plugin, "{text}")
            }
            Level::Warn => {
                tracing::warn!(target: "plugin", queue, message_id = id, trace_id, plugin, "{text}")
            }
            Level::Error => {
                tracing::error!(target: "plugin", queue, message_id = id, trace_id, plugin, "{text}");
                self.last_error = Some(text);
            }
        }
    }
}

fn message_id(message: Option<&Input>) -> &str {
    message.map_or("", |message| message.envelope.id.as_str())
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
