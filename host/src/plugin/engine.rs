//! The wasmtime engine shared by every plugin of a host process: how code is
//! compiled, cached on disk (see [`cache`]: only entries the host can prove
//! it wrote are used), and the epoch clock that lets a running call yield
//! and ends it at its deadline (see `pool.rs`).

mod cache;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use self::cache::PluginCache;
use super::limiter::{MAX_CORE_INSTANCES, MAX_MEMORIES, MAX_TABLES};
use super::{Contract, PluginError};

/// How often the engine's epoch advances. At every tick a running call
/// either yields to the async runtime or, past its deadline, traps: a
/// deadline is honoured to within one tick, and a long call holds a runtime
/// worker for at most one tick at a time.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Sizing of the engine, decided from the whole config before any plugin loads.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Upper bound on live plugin instances across all consumers (pool slots).
    pub max_instances: u32,
    /// Largest per-instance memory budget of any plugin (consumer or codec),
    /// in bytes: the size of each pooled memory slot.
    pub max_memory_bytes: u64,
    /// Where compiled plugins are cached; `None` compiles at every start.
    pub cache_dir: Option<PathBuf>,
    /// The key that authenticates cache entries; `None` puts it beside the
    /// cache folder (`<cache_dir>.key`). Unused without `cache_dir`.
    pub cache_key_file: Option<PathBuf>,
    /// Count fuel (instructions, roughly) so it can be reported per call.
    pub fuel_metering: bool,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            max_instances: 256,
            max_memory_bytes: 64 << 20,
            cache_dir: None,
            cache_key_file: None,
            fuel_metering: false,
        }
    }
}

/// A plugin file read from disk: its bytes' identity and its compiled code.
#[derive(Clone)]
pub struct CompiledPlugin {
    pub path: PathBuf,
    /// SHA-256 of the file's bytes, hex: the version's identity in logs and metrics.
    pub sha256: String,
    pub size: usize,
    pub component: Component,
    /// True when the compiled code came from the disk cache.
    pub from_cache: bool,
    /// The `[consumers.config]` keys the plugin declares it reads
    /// ([`super::config_keys`]); `None` when it declares none.
    pub config_keys: Option<Vec<String>>,
    /// The version of the contract it was built against.
    pub contract: Contract,
}

impl CompiledPlugin {
    /// The contract the component was built against, or its refusal
    /// (`contract.rs`), whichever world it is loaded as.
    fn read_contract(&self, engine: &Engine) -> Result<Contract, PluginError> {
        let ty = self.component.component_type();
        let names = ty
            .imports(engine)
            .map(|(name, _)| name)
            .chain(ty.exports(engine).map(|(name, _)| name));
        Contract::of_names(names).map_err(|why| PluginError::new(&self.path, why))
    }
}

/// The engine plus the thread that drives epoch interruption.
pub struct PluginEngine {
    engine: Engine,
    settings: EngineSettings,
    /// Whether the pooling allocator could be used (it needs a lot of virtual
    /// address space; some hosts refuse it, and then instances are allocated
    /// on demand instead of failing to start).
    pooling: bool,
    /// The compiled-plugin cache, when one is configured.
    cache: Option<PluginCache>,
    ticker_stop: Arc<AtomicBool>,
}

impl PluginEngine {
    /// Creates the engine, and opens the compiled-plugin cache when one is
    /// configured: a cache folder or key file others could change is refused
    /// here, before any plugin loads.
    pub fn new(settings: EngineSettings) -> anyhow::Result<Self> {
        let (engine, pooling) = match Engine::new(&engine_config(&settings, true)) {
            Ok(engine) => (engine, true),
            Err(pooling_error) => {
                tracing::warn!(
                    error = %pooling_error,
                    "the pooling instance allocator is not available here; allocating plugin instances on demand"
                );
                let engine = Engine::new(&engine_config(&settings, false))
                    .map_err(|e| anyhow::anyhow!("cannot create the WebAssembly engine: {e:#}"))?;
                (engine, false)
            }
        };
        let cache = match &settings.cache_dir {
            Some(dir) => Some(PluginCache::open(
                &engine,
                dir,
                settings.cache_key_file.as_deref(),
            )?),
            None => None,
        };
        let ticker_stop = Arc::new(AtomicBool::new(false));
        spawn_epoch_ticker(engine.clone(), ticker_stop.clone());
        Ok(Self {
            engine,
            settings,
            pooling,
            cache,
            ticker_stop,
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn uses_pooling(&self) -> bool {
        self.pooling
    }

    pub fn fuel_metering(&self) -> bool {
        self.settings.fuel_metering
    }

    /// Reads a plugin file and compiles it, through the disk cache when one is
    /// configured. Errors name the file and say what is wrong with it.
    pub fn compile_file(&self, path: &Path) -> Result<CompiledPlugin, PluginError> {
        let bytes = std::fs::read(path)
            .map_err(|e| PluginError::new(path, format!("cannot read it: {e}")))?;
        self.compile_bytes(path, &bytes)
    }

    /// Compiles plugin bytes that claim to come from `path`. A plugin built
    /// against another version of the contract is refused here, whichever
    /// world it is loaded as.
    pub fn compile_bytes(&self, path: &Path, bytes: &[u8]) -> Result<CompiledPlugin, PluginError> {
        let mut compiled = self.compile_component(path, bytes)?;
        compiled.contract = compiled.read_contract(&self.engine)?;
        Ok(compiled)
    }

    /// Compiles `bytes`, or takes their compilation from the cache when its
    /// MAC proves this host made it from these very bytes. Hot swap comes
    /// through here too, so a swapped version is held to the same proof.
    fn compile_component(&self, path: &Path, bytes: &[u8]) -> Result<CompiledPlugin, PluginError> {
        check_is_component(path, bytes)?;
        let source: [u8; 32] = Sha256::digest(bytes).into();
        let cached = self
            .cache
            .as_ref()
            .and_then(|cache| cache.load(&self.engine, path, &source));
        let from_cache = cached.is_some();
        let component = match cached {
            Some(component) => component,
            None => {
                let component = Component::new(&self.engine, bytes)
                    .map_err(|e| PluginError::new(path, format!("does not compile: {e:#}")))?;
                if let Some(cache) = &self.cache
                    && let Err(e) = cache.store(&source, &component)
                {
                    tracing::warn!(plugin = %path.display(), error = %e, "cannot cache the compiled plugin");
                }
                component
            }
        };
        Ok(CompiledPlugin {
            path: path.to_path_buf(),
            sha256: hex::encode(source),
            size: bytes.len(),
            component,
            from_cache,
            config_keys: super::config_keys::declared(bytes),
            // Read from the component just compiled, by `compile_bytes`.
            contract: Contract::V0_4,
        })
    }
}

impl Drop for PluginEngine {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

/// Bytes at the bottom of each pooled linear memory that stay mapped between
/// instances: the guest's shadow stack (1 MiB by default), its data and the
/// start of its heap.
const KEEP_RESIDENT_BYTES: usize = 2 << 20;

fn engine_config(settings: &EngineSettings, pooling: bool) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    // Deadlines and yielding: every store's epoch callback decides at each
    // tick whether its running call yields or ends (pool.rs).
    config.epoch_interruption(true);
    config.consume_fuel(settings.fuel_metering);
    if pooling {
        let slots = settings.max_instances.max(1);
        // The pool admits exactly what each store's `MemoryLimiter` admits
        // (limiter.rs), so a plugin behaves the same with and without
        // pooling, and a pool sized for `slots` instances of the largest
        // plugin allowed never runs out of memory or table slots first.
        let per_instance = |count: usize| u32::try_from(count).expect("a small constant");
        let (instances, memories, tables) = (
            per_instance(MAX_CORE_INSTANCES),
            per_instance(MAX_MEMORIES),
            per_instance(MAX_TABLES),
        );
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(slots)
            .max_core_instances_per_component(instances)
            .total_core_instances(slots.saturating_mul(instances))
            .max_memories_per_component(memories)
            .max_memories_per_module(memories)
            .total_memories(slots.saturating_mul(memories))
            .max_tables_per_component(tables)
            .max_tables_per_module(tables)
            .total_tables(slots.saturating_mul(tables))
            // Calls run on fibers (async calls); each store keeps the stack
            // of its last call, so one stack per live instance.
            .total_stacks(slots)
            // The limiter's budget covers all of an instance's memories
            // together, so one memory can reach the whole budget and never
            // more: the largest budget is each memory slot's size.
            .max_memory_size(usize::try_from(settings.max_memory_bytes).unwrap_or(usize::MAX))
            // A fresh instance per message would otherwise spend most of its
            // time in the kernel: page faults on the guest's stack, data and
            // heap, then madvise and TLB shootdowns to give them back. Pages
            // a slot used stay mapped instead, and are reset in place.
            // (A Rust guest's stack is its first MiB, data and heap follow.)
            .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
            .table_keep_resident(64 << 10)
            // With PAGEMAP_SCAN (Linux 6.7+) only the pages an instance
            // dirtied are reset, so a large resident region costs little when
            // little of it was touched; without it, wasmtime memsets it all.
            .pagemap_scan(wasmtime::Enabled::Auto);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    config
}

fn spawn_epoch_ticker(engine: Engine, stop: Arc<AtomicBool>) {
    std::thread::Builder::new()
        .name("acemq-epoch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(EPOCH_TICK);
                engine.increment_epoch();
            }
        })
        .expect("cannot start the epoch thread");
}

/// Refuses what is not a component before compiling, with a message that says
/// what the file is instead.
fn check_is_component(path: &Path, bytes: &[u8]) -> Result<(), PluginError> {
    if wasmparser::Parser::is_component(bytes) {
        return Ok(());
    }
    if wasmparser::Parser::is_core_wasm(bytes) {
        return Err(PluginError::new(
            path,
            "is a core WebAssembly module, not a component; build it with scripts/build-plugins \
             or convert it with `acemq-host plugin componentize`",
        ));
    }
    let head: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
    Err(PluginError::new(
        path,
        if bytes.is_empty() {
            "is empty, not a WebAssembly component".to_string()
        } else {
            format!(
                "is not a WebAssembly component (it starts with bytes {})",
                head.join(" ")
            )
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_and_core_modules_are_named_as_such() {
        let err = check_is_component(Path::new("x.wasm"), b"hello world").unwrap_err();
        assert!(err.to_string().contains("x.wasm"), "{err}");
        assert!(
            err.to_string().contains("not a WebAssembly component"),
            "{err}"
        );
        let core = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
        let err = check_is_component(Path::new("m.wasm"), &core).unwrap_err();
        assert!(err.to_string().contains("core WebAssembly module"), "{err}");
        let err = check_is_component(Path::new("e.wasm"), &[]).unwrap_err();
        assert!(err.to_string().contains("is empty"), "{err}");
    }
}
