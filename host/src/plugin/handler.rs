//! Handler plugins: a version (compiled, type-checked against the
//! `handler-plugin` world, warmed), its pool of instances, and the slot a
//! consumer calls through, which hot swap replaces atomically.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use arc_swap::ArcSwap;
use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

use super::bindings::handler_world::acemq::plugin::types;
use super::bindings::handler_world::{HandlerPlugin, HandlerPluginPre};
use super::engine::{CompiledPlugin, PluginEngine};
use super::fault::{self, Fault};
use super::host_state::HostState;
use super::{ConsumerContext, Input, Outgoing, PluginError, Verdict};
use crate::config::Isolation;

/// An instance ready to take a call, with the store it lives in.
struct Warm {
    store: Store<HostState>,
    plugin: HandlerPlugin,
}

/// One loaded version of a consumer's handler plugin.
pub struct HandlerVersion {
    /// SHA-256 of the file's bytes, hex; shared with every invocation's report.
    pub sha256: Arc<str>,
    pub size: usize,
    pub from_cache: bool,
    /// When this version finished loading (shown by the admin endpoint).
    pub loaded_at: SystemTime,
    engine: wasmtime::Engine,
    fuel_metering: bool,
    pre: HandlerPluginPre<HostState>,
    context: Arc<ConsumerContext>,
    /// Idle instances, reused when the consumer's isolation is `pooled`.
    idle: Mutex<Vec<Warm>>,
}

/// The result of one handler call.
#[derive(Debug)]
pub struct Invocation {
    /// The handler's verdict, or the fault that stopped it.
    pub result: Result<Verdict, Fault>,
    /// What it asked to publish (meaningful only for `Accept`).
    pub outputs: Vec<Outgoing>,
    /// SHA-256 of the version that handled it.
    pub version: Arc<str>,
    /// Fuel the call burned, when fuel metering is on.
    pub fuel: Option<u64>,
}

impl HandlerVersion {
    /// Compiles, type-checks and warms a handler plugin file.
    pub fn load(
        engine: &PluginEngine,
        path: &Path,
        context: Arc<ConsumerContext>,
    ) -> Result<Arc<Self>, PluginError> {
        let compiled = engine.compile_file(path)?;
        Self::from_compiled(engine, compiled, context)
    }

    /// Type-checks and warms already compiled code.
    pub fn from_compiled(
        engine: &PluginEngine,
        compiled: CompiledPlugin,
        context: Arc<ConsumerContext>,
    ) -> Result<Arc<Self>, PluginError> {
        let path = compiled.path.clone();
        let mut linker: Linker<HostState> = Linker::new(engine.engine());
        HandlerPlugin::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state).map_err(|e| {
            PluginError::new(&path, format!("cannot link the host interface: {e:#}"))
        })?;
        // instantiate_pre checks every import against what the linker offers:
        // a plugin importing WASI, or another version of the contract, fails here.
        let instance_pre = linker.instantiate_pre(&compiled.component).map_err(|e| {
            PluginError::new(
                &path,
                format!("is not a handler plugin of this host: {}", chain(&e)),
            )
        })?;
        // HandlerPluginPre::new checks the exports of the handler-plugin world.
        let pre = HandlerPluginPre::new(instance_pre).map_err(|e| {
            PluginError::new(
                &path,
                format!(
                    "does not export the handler world ({}): {}",
                    contract!("handler"),
                    chain(&e)
                ),
            )
        })?;
        let version = Arc::new(Self {
            sha256: compiled.sha256.into(),
            size: compiled.size,
            from_cache: compiled.from_cache,
            loaded_at: SystemTime::now(),
            engine: engine.engine().clone(),
            fuel_metering: engine.fuel_metering(),
            pre,
            context,
            idle: Mutex::new(Vec::new()),
        });
        // Warm: one real instantiation proves the start-up code runs, and
        // leaves an instance ready for the first message.
        let warm = version.instantiate().map_err(|e| {
            PluginError::new(&path, format!("cannot be instantiated: {}", chain(&e)))
        })?;
        version.idle.lock().expect("idle pool poisoned").push(warm);
        Ok(version)
    }

    /// What the consumer allows its plugin: hot swap loads the next version
    /// with the same context.
    pub fn context(&self) -> &Arc<ConsumerContext> {
        &self.context
    }

    /// A short form of the hash for log lines.
    pub fn short_id(&self) -> &str {
        &self.sha256[..12.min(self.sha256.len())]
    }

    fn instantiate(&self) -> wasmtime::Result<Warm> {
        let mut store = Store::new(&self.engine, HostState::new(self.context.clone()));
        store.limiter(|state| &mut state.limiter);
        if self.fuel_metering {
            store.set_fuel(u64::MAX)?;
        }
        // Instantiation runs guest code (start functions): bound it too.
        store.set_epoch_deadline(PluginEngine::deadline_ticks(self.context.limits.deadline));
        let plugin = self.pre.instantiate(&mut store)?;
        Ok(Warm { store, plugin })
    }

    /// Calls the handler for one message. Blocking: run it off the async
    /// runtime's worker threads.
    pub fn invoke(&self, input: Input) -> Invocation {
        let pooled = self.context.limits.isolation == Isolation::Pooled;
        let reused = if pooled {
            self.idle.lock().expect("idle pool poisoned").pop()
        } else {
            None
        };
        let mut warm = match reused.map(Ok).unwrap_or_else(|| self.instantiate()) {
            Ok(warm) => warm,
            Err(e) => return self.failed(fault::instantiation_failed(&e), None),
        };
        let message = warm.store.data_mut().begin_call(input);
        let limits = &self.context.limits;
        warm.store
            .set_epoch_deadline(PluginEngine::deadline_ticks(limits.deadline));
        let fuel_before = self
            .fuel_metering
            .then(|| warm.store.get_fuel().unwrap_or(0));
        let result = warm
            .plugin
            .acemq_plugin_handler()
            .call_handle(&mut warm.store, message);
        let fuel =
            fuel_before.map(|before| before.saturating_sub(warm.store.get_fuel().unwrap_or(0)));
        let outputs = warm.store.data_mut().end_call();
        match result {
            Ok(outcome) => {
                if pooled {
                    self.idle.lock().expect("idle pool poisoned").push(warm);
                }
                Invocation {
                    result: Ok(verdict(outcome)),
                    outputs,
                    version: self.sha256.clone(),
                    fuel,
                }
            }
            Err(e) => {
                // The instance that failed is dropped here, never reused: its
                // memory may be corrupt and the component model forbids
                // re-entering an instance after a trap.
                let fault = fault::classify(
                    &e,
                    &warm.store.data().evidence(),
                    limits.deadline,
                    limits.max_memory_bytes,
                );
                self.failed(fault, fuel)
            }
        }
    }

    fn failed(&self, fault: Fault, fuel: Option<u64>) -> Invocation {
        Invocation {
            result: Err(fault),
            outputs: Vec::new(),
            version: self.sha256.clone(),
            fuel,
        }
    }

    /// Idle instances currently pooled (for tests and the admin view).
    pub fn idle_instances(&self) -> usize {
        self.idle.lock().expect("idle pool poisoned").len()
    }
}

/// The version a consumer calls through. Swapping it is atomic: a call that
/// already holds the old version finishes on it; every later call gets the new.
pub struct HandlerSlot {
    current: ArcSwap<HandlerVersion>,
    swapped_at: Mutex<Instant>,
}

impl HandlerSlot {
    pub fn new(version: Arc<HandlerVersion>) -> Self {
        Self {
            current: ArcSwap::new(version),
            swapped_at: Mutex::new(Instant::now()),
        }
    }

    pub fn current(&self) -> Arc<HandlerVersion> {
        self.current.load_full()
    }

    /// Installs a new version; returns the one it replaced.
    pub fn swap(&self, version: Arc<HandlerVersion>) -> Arc<HandlerVersion> {
        *self.swapped_at.lock().expect("poisoned") = Instant::now();
        self.current.swap(version)
    }

    pub fn invoke(&self, input: Input) -> Invocation {
        self.current().invoke(input)
    }
}

fn verdict(outcome: types::Outcome) -> Verdict {
    match outcome {
        types::Outcome::Accept => Verdict::Accept,
        types::Outcome::Retry(reason) => Verdict::Retry(reason),
        types::Outcome::Reject(reason) => Verdict::Reject(reason),
        types::Outcome::Park(reason) => Verdict::Park(reason),
    }
}

/// Every cause of an error on one line, outermost first.
fn chain(error: &wasmtime::Error) -> String {
    error
        .chain()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(": ")
}
