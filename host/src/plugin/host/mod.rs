//! The host side of the plugin contract: each interface a handler plugin
//! may import, in a file of its own with its state, its limits and its
//! check of the consumer's settings.
//!
//! | file | WIT | what it keeps per instance |
//! |---|---|---|
//! | `message.rs` | `resource message` of `acemq:plugin/types` | the message lent to the current call |
//! | `log.rs` | `log` of `acemq:plugin/host` | what tags its lines; the lines of the call, counted |
//! | `publish.rs` | `publish` of `acemq:plugin/host` | the outputs the call buffered, against `publish_to` and the limits |
//! | `reply.rs` | `reply` of `acemq:plugin/host` | the reply the call buffered |
//! | `config.rs` | `config` of `acemq:plugin/host` | the consumer's `[consumers.config]` |
//! | `clock.rs` | `now-ms` of `acemq:plugin/host` | nothing |
//! | `state.rs` | `acemq:plugin/state` | the consumer's namespace; what the call read and wrote |
//! | `wasi.rs` | WASI 0.2, for a component that imports it | the locked-down WASI context, and the grant ([`wasi::GRANT`]) |
//!
//! A new interface is a new file whose state implements [`HostInterface`],
//! a field of [`HostState`], and its line in [`link`].
//!
//! Those are contract 0.4's. A plugin built against 0.3 is linked to
//! `v0_3.rs` instead, which maps each of its calls onto the same state.

pub mod clock;
pub mod config;
pub mod log;
pub mod message;
pub mod publish;
pub mod reply;
#[cfg(test)]
mod sandbox_doc;
pub mod state;
pub mod v0_3;
pub mod wasi;

use std::sync::Arc;

use wasmtime::component::{HasSelf, Linker, Resource};

use super::bindings::handler_world::acemq::plugin::host as wit_host;
use super::bindings::handler_world::acemq::plugin::{state as wit_state, types};
use super::bindings::v0_3::handler_world::acemq::plugin::{host as old_host, types as old_types};
use super::engine::CompiledPlugin;
use super::fault::CallEvidence;
use super::pool::{CallBounds, Observed};
use super::{ConsumerContext, Contract, Input, Outgoing, PluginError};
use message::{LentMessage, MessageInterface};

/// One interface's state in each instance of a consumer's handler plugin.
pub trait HostInterface: Sized {
    /// The state of a new instance of `plugin` (its sha256) for `context`.
    fn prepare(context: &Arc<ConsumerContext>, plugin: &Arc<str>) -> Self;

    /// Checks, when a plugin version loads for a consumer, the consumer's
    /// settings for this interface against the plugin; a refusal stops the
    /// load. Most interfaces have nothing to check.
    fn check_config(
        _plugin: &CompiledPlugin,
        _context: &ConsumerContext,
    ) -> Result<(), PluginError> {
        Ok(())
    }
}

/// Checks every interface's settings for a plugin version about to load.
pub fn check_config(plugin: &CompiledPlugin, context: &ConsumerContext) -> Result<(), PluginError> {
    config::Config::check_config(plugin, context)
}

/// Links what a handler plugin of `contract` may import: one line per WIT
/// interface. WASI only for a component that imports it (a Rust plugin
/// built with the guest SDK does not, and its stores never build a WASI
/// context).
pub fn link(
    linker: &mut Linker<HostState>,
    contract: Contract,
    imports_wasi: bool,
) -> Result<(), String> {
    let host = |e: wasmtime::Error| format!("cannot link the host interface: {e:#}");
    match contract {
        Contract::V0_4 => {
            types::add_to_linker::<_, MessageInterface>(linker, |state| &mut state.message)
                .map_err(host)?;
            wit_host::add_to_linker::<_, HasSelf<_>>(linker, |state| state).map_err(host)?;
            wit_state::add_to_linker::<_, StateInterface>(linker, |state| &mut state.state)
                .map_err(host)?;
        }
        Contract::V0_3 => {
            old_types::add_to_linker::<_, MessageInterface>(linker, |state| &mut state.message)
                .map_err(host)?;
            old_host::add_to_linker::<_, HasSelf<_>>(linker, |state| state).map_err(host)?;
        }
    }
    if imports_wasi {
        wasi::link(linker).map_err(|e| format!("cannot link WASI: {e:#}"))?;
    }
    Ok(())
}

/// Links `acemq:plugin/state` on its own state alone.
pub struct StateInterface;

impl wasmtime::component::HasData for StateInterface {
    type Data<'a> = &'a mut state::StateCalls;
}

/// The data of one handler instance's store: each interface's state, and
/// the bounds of its calls.
pub struct HostState {
    pub bounds: CallBounds,
    pub message: message::Lending,
    pub log: log::Log,
    pub publish: publish::Publishing,
    pub reply: reply::Replying,
    pub config: config::Config,
    pub clock: clock::Clock,
    pub state: state::StateCalls,
    /// WASI, for a plugin that imports it (built on first use).
    pub wasi: wasi::LazyWasi,
}

/// What a handler call produced besides its outcome.
pub struct CallEnd {
    /// Messages buffered by `publish`, sent only if the handler accepts.
    pub outputs: Vec<Outgoing>,
    /// A publish the consumer's `publish_to` refused. The plugin was told
    /// (and the SDK turns the refusal into a retry), but no retry can make
    /// the exchange allowed: the host sets the message aside at once.
    pub refused_publish: Option<String>,
    /// The reply buffered by `reply`, sent only if the handler accepts.
    pub reply: Option<crate::envelope::Reply>,
    /// The state it wrote, committed only if the handler accepts.
    pub state: state::StateEnd,
}

impl HostState {
    /// A new instance's state: each interface prepares its own.
    pub fn new(context: Arc<ConsumerContext>, plugin: Arc<str>) -> Self {
        Self {
            bounds: CallBounds::new(context.limits.max_memory_bytes),
            message: HostInterface::prepare(&context, &plugin),
            log: HostInterface::prepare(&context, &plugin),
            publish: HostInterface::prepare(&context, &plugin),
            reply: HostInterface::prepare(&context, &plugin),
            config: HostInterface::prepare(&context, &plugin),
            clock: HostInterface::prepare(&context, &plugin),
            state: HostInterface::prepare(&context, &plugin),
            wasi: HostInterface::prepare(&context, &plugin),
        }
    }

    /// Starts a call on `message`, with nothing left of the last call (nor
    /// of the start-up code); returns the handle that lends it to the plugin.
    pub fn begin_call(&mut self, message: Input) -> Resource<LentMessage> {
        self.log.begin_call();
        let _ = self.publish.take();
        let _ = self.reply.take();
        self.bounds.limiter.refused = None;
        self.state.begin_call(crate::envelope::now_ms);
        self.message.lend(message)
    }

    /// Ends the call: the message is no longer lent; what it buffered, and
    /// any publish its consumer refused, are handed over.
    pub fn end_call(&mut self) -> CallEnd {
        self.log_wasi_output();
        self.log.end_call(self.message.current());
        self.message.take_back();
        let (outputs, refused_publish) = self.publish.take();
        CallEnd {
            outputs,
            refused_publish,
            reply: self.reply.take(),
            state: self.state.end_call(),
        }
    }

    /// Writes what the plugin printed to stdout (info) and stderr (warn)
    /// during the call to the host log, one line per line, counted and
    /// bounded like its own log lines.
    fn log_wasi_output(&mut self) {
        let message = self.message.current();
        for (stream, text, dropped) in self.wasi.drain() {
            let level = match stream {
                wasi::Stream::Stdout => wit_host::Level::Info,
                wasi::Stream::Stderr => wit_host::Level::Warn,
            };
            if stream == wasi::Stream::Stderr
                && let Some(cause) = super::guest_error::cause(&text)
            {
                self.log.note_guest_error(cause);
            }
            for line in text.lines().filter(|line| !line.trim().is_empty()) {
                self.log
                    .write(level, &format!("{}: {line}", stream.as_str()), message);
            }
            if dropped > 0 {
                let text = format!(
                    "{}: {dropped} more bytes were dropped: a call keeps at most {} bytes of it",
                    stream.as_str(),
                    wasi::MAX_CALL_OUTPUT_BYTES
                );
                self.log.write(wit_host::Level::Warn, &text, message);
            }
        }
    }
}

/// What the host saw during the call, for naming a fault.
impl Observed for HostState {
    fn evidence(&self) -> CallEvidence {
        CallEvidence {
            refused_memory: self.bounds.limiter.refused,
            last_error_log: self.log.last_error(),
            guest_error: self.log.guest_error(),
        }
    }

    fn bounds(&mut self) -> &mut CallBounds {
        &mut self.bounds
    }

    fn bounds_ref(&self) -> &CallBounds {
        &self.bounds
    }
}

/// `acemq:plugin/host`: each function is its own file's.
impl wit_host::Host for HostState {
    fn log(&mut self, level: wit_host::Level, text: String) -> wasmtime::Result<()> {
        self.log.write(level, &text, self.message.current());
        Ok(())
    }

    fn publish(&mut self, msg: types::Outgoing) -> wasmtime::Result<Result<types::Sent, String>> {
        Ok(self.publish.buffer(msg, self.message.current()))
    }

    fn reply(
        &mut self,
        msg: types::OutgoingReply,
    ) -> wasmtime::Result<Result<types::Sent, String>> {
        Ok(self
            .reply
            .buffer(msg, self.message.current(), &mut self.publish))
    }

    fn config(&mut self, key: String) -> wasmtime::Result<Option<String>> {
        Ok(self.config.get(&key))
    }

    fn now_ms(&mut self) -> wasmtime::Result<u64> {
        Ok(self.clock.now_ms())
    }
}

impl wasmtime_wasi::WasiView for HostState {
    fn ctx(&mut self) -> wasmtime_wasi::WasiCtxView<'_> {
        self.wasi.view()
    }
}
