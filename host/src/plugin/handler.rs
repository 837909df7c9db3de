//! Handler plugins: a version (compiled, type-checked against the
//! `handler-plugin` world, warmed), its pool of instances, and the slot a
//! consumer calls through, which hot swap replaces atomically.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use arc_swap::ArcSwap;
use wasmtime::component::Linker;

use super::bindings::handler_world::acemq::plugin::types;
use super::bindings::handler_world::{HandlerPlugin, HandlerPluginPre};
use super::bindings::v0_3::handler_world as v0_3;
use super::engine::{CompiledPlugin, PluginEngine};
use super::fault::Fault;
use super::fault_window::{FaultWindow, Faulting};
use super::host::{self, HostState};
use super::pool::{Instantiate, Pool, Warm, new_store};
use super::{ConsumerContext, Contract, Input, Outcome, Outgoing, PluginError};
use crate::config::Isolation;

/// A handler plugin, pre-linked, in the contract it was built against.
enum HandlerPre {
    V0_4(HandlerPluginPre<HostState>),
    V0_3(v0_3::HandlerPluginPre<HostState>),
}

/// One instance's exports, in the contract its plugin was built against.
pub(super) enum HandlerBindings {
    V0_4(HandlerPlugin),
    V0_3(v0_3::HandlerPlugin),
}

impl HandlerPre {
    /// Checks the exports of the plugin's `handler-plugin` world.
    fn new(
        contract: Contract,
        instance_pre: wasmtime::component::InstancePre<HostState>,
    ) -> wasmtime::Result<Self> {
        Ok(match contract {
            Contract::V0_4 => HandlerPre::V0_4(HandlerPluginPre::new(instance_pre)?),
            Contract::V0_3 => HandlerPre::V0_3(v0_3::HandlerPluginPre::new(instance_pre)?),
        })
    }

    async fn instantiate_async(
        &self,
        store: &mut wasmtime::Store<HostState>,
    ) -> wasmtime::Result<HandlerBindings> {
        Ok(match self {
            HandlerPre::V0_4(pre) => HandlerBindings::V0_4(pre.instantiate_async(store).await?),
            HandlerPre::V0_3(pre) => HandlerBindings::V0_3(pre.instantiate_async(store).await?),
        })
    }
}

impl HandlerBindings {
    /// Calls the plugin's `handle` on the message `message` names.
    async fn handle(
        &self,
        store: &mut wasmtime::Store<HostState>,
        message: wasmtime::component::Resource<host::message::LentMessage>,
    ) -> wasmtime::Result<Outcome> {
        match self {
            HandlerBindings::V0_4(bindings) => bindings
                .acemq_plugin_handler()
                .call_handle(store, message)
                .await
                .map(host_outcome),
            HandlerBindings::V0_3(bindings) => bindings
                .acemq_plugin_handler()
                .call_handle(store, message)
                .await
                .map(host::v0_3::outcome_of),
        }
    }
}

/// What makes a handler version's instances.
struct Instances {
    engine: wasmtime::Engine,
    fuel_metering: bool,
    pre: HandlerPre,
    context: Arc<ConsumerContext>,
    /// The version's sha256, named in the plugin's log lines.
    sha256: Arc<str>,
}

impl Instantiate for Instances {
    type Instance = Warm<HostState, HandlerBindings>;

    async fn instantiate(&self, deadline: Instant) -> wasmtime::Result<Self::Instance> {
        // Instantiation runs guest code (start functions): bound it too.
        let mut store = new_store(
            &self.engine,
            HostState::new(self.context.clone(), self.sha256.clone()),
            deadline,
        );
        if self.fuel_metering {
            store.set_fuel(u64::MAX)?;
        }
        let bindings = self.pre.instantiate_async(&mut store).await?;
        Ok(Warm { store, bindings })
    }
}

/// One loaded version of a consumer's handler plugin.
pub struct HandlerVersion {
    /// SHA-256 of the file's bytes, hex; shared with every invocation's report.
    pub sha256: Arc<str>,
    pub size: usize,
    pub from_cache: bool,
    /// When this version finished loading (shown by the admin endpoint).
    pub loaded_at: SystemTime,
    /// Its instances, reused when the consumer's isolation is `pooled`.
    instances: Pool<Instances>,
    /// Whether its latest calls mostly fault (`/health`).
    faults: FaultWindow,
}

/// The result of one handler call.
#[derive(Debug)]
pub struct Invocation {
    /// The handler's outcome, or the fault that stopped it.
    pub result: Result<Outcome, Fault>,
    /// What it asked to publish (meaningful only for `Accept`).
    pub outputs: Vec<Outgoing>,
    /// SHA-256 of the version that handled it.
    pub version: Arc<str>,
    /// Fuel the call burned, when fuel metering is on.
    pub fuel: Option<u64>,
    /// A publish the consumer's `publish_to` refused during the call,
    /// whatever the handler returned afterwards (see `host::CallEnd`).
    pub refused_publish: Option<String>,
    /// Its reply to the request (meaningful only for `Accept`).
    pub reply: Option<crate::envelope::Reply>,
    /// Its state writes (committed only for `Accept`), and whether the
    /// store failed it.
    pub state: host::state::StateEnd,
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
        host::check_config(&compiled, &context)?;
        let mut linker: Linker<HostState> = Linker::new(engine.engine());
        let imports_wasi = super::host::wasi::imports_wasi(engine.engine(), &compiled.component);
        host::link(&mut linker, compiled.contract, imports_wasi)
            .map_err(|e| PluginError::new(&path, e))?;
        // instantiate_pre checks every import against what the linker offers:
        // a plugin importing WASI beyond the grant, or another version of the
        // contract, fails here.
        let instance_pre = linker.instantiate_pre(&compiled.component).map_err(|e| {
            PluginError::new(
                &path,
                format!("is not a handler plugin of this host: {}", chain(&e)),
            )
        })?;
        let pre = HandlerPre::new(compiled.contract, instance_pre).map_err(|e| {
            PluginError::new(
                &path,
                format!(
                    "does not export the handler world (acemq:plugin/handler@{}): {}",
                    compiled.contract.version(),
                    chain(&e)
                ),
            )
        })?;
        let (deadline, memory_limit) = (context.limits.deadline, context.limits.max_memory_bytes);
        let sha256: Arc<str> = compiled.sha256.into();
        let instances = Pool::new(
            Instances {
                engine: engine.engine().clone(),
                fuel_metering: engine.fuel_metering(),
                pre,
                context,
                sha256: sha256.clone(),
            },
            deadline,
            memory_limit,
        );
        // Warm even when every call takes a fresh instance: the one real
        // instantiation is what proves the start-up code runs.
        // Loading is blocking work (compiling), done off the async workers:
        // the one warm instantiation is driven to its end right here.
        super::pool::block_on_loading(instances.warm()).map_err(|e| {
            PluginError::new(&path, format!("cannot be instantiated: {}", chain(&e)))
        })?;
        Ok(Arc::new(Self {
            sha256,
            size: compiled.size,
            from_cache: compiled.from_cache,
            loaded_at: SystemTime::now(),
            instances,
            faults: FaultWindow::default(),
        }))
    }

    /// `Some` while most of this version's latest calls faulted.
    pub fn faulting(&self) -> Option<Faulting> {
        self.faults.faulting()
    }

    /// What the consumer allows its plugin: hot swap loads the next version
    /// with the same context.
    pub fn context(&self) -> &Arc<ConsumerContext> {
        &self.instances.source().context
    }

    /// Calls the handler for one message: a future on the async runtime
    /// that yields between epoch ticks while the plugin runs (see `pool.rs`).
    pub async fn invoke(&self, input: Input) -> Invocation {
        let source = self.instances.source();
        let reuse = source.context.limits.isolation == Isolation::Pooled;
        // Counted whether the call succeeds or fails; `None` when metering is
        // off or no instance could be made.
        let mut fuel = None;
        // Kept whether the call then succeeds or traps (a plugin may
        // `unwrap` the refusal).
        let mut refused_publish = None;
        let mut reply = None;
        let mut state = host::state::StateEnd::default();
        let result = async {
            let mut lease = self.instances.lease(reuse).await?;
            let deadline = lease.deadline();
            let warm = lease.instance();
            let message = warm.store.data_mut().begin_call(input);
            let fuel_before = source
                .fuel_metering
                .then(|| warm.store.get_fuel().unwrap_or(0));
            // Bounded on the host's side too: a call waiting in a WASI sleep
            // runs no wasm, so its epoch check never comes (pool.rs).
            let result = deadline
                .bound(warm.bindings.handle(&mut warm.store, message))
                .await;
            fuel =
                fuel_before.map(|before| before.saturating_sub(warm.store.get_fuel().unwrap_or(0)));
            let ended = warm.store.data_mut().end_call();
            refused_publish = ended.refused_publish;
            reply = ended.reply;
            state = ended.state;
            lease.finish(result.map(|outcome| (outcome, ended.outputs)))
        }
        .await;
        let (result, outputs) = match result {
            Ok((outcome, outputs)) => (Ok(outcome), outputs),
            Err(fault) => {
                reply = None;
                (Err(fault), Vec::new())
            }
        };
        // The host's own shortage (no instance slot) says nothing of the plugin.
        match &result {
            Err(fault) if fault.kind.is_the_hosts() => {}
            result => self
                .faults
                .record(result.as_ref().err().map(|f| f.reason.as_str())),
        }
        Invocation {
            result,
            outputs,
            version: self.sha256.clone(),
            fuel,
            refused_publish,
            reply,
            state,
        }
    }

    /// Idle instances currently pooled (for tests and the admin view).
    pub fn idle_instances(&self) -> usize {
        self.instances.idle()
    }

    /// Lets go of its idle instances, and of the others as their calls end
    /// (a version no delivery will be given again).
    pub fn retire(&self) {
        self.instances.retire();
    }

    /// What an instance of this version costs (the admin view, the
    /// dispatch benchmark).
    pub fn instance_cost(&self) -> super::InstanceCost {
        self.instances.cost()
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

    /// Installs a new version; returns the one it replaced, retired: its
    /// idle instances are dropped and its running calls keep theirs only
    /// until they end, so the slots of the engine's instance pool a swap
    /// takes are bounded (`capacity.rs`).
    pub fn swap(&self, version: Arc<HandlerVersion>) -> Arc<HandlerVersion> {
        *self.swapped_at.lock().expect("poisoned") = Instant::now();
        let old = self.current.swap(version);
        old.instances.retire();
        old
    }

    pub async fn invoke(&self, input: Input) -> Invocation {
        self.current().invoke(input).await
    }
}

fn host_outcome(outcome: types::Outcome) -> Outcome {
    match outcome {
        types::Outcome::Accept => Outcome::Accept,
        types::Outcome::Retry(reason) => Outcome::Retry(reason),
        types::Outcome::Reject(reason) => Outcome::Reject(reason),
        types::Outcome::Park(reason) => Outcome::Park(reason),
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
