//! The wasmtime engine shared by every plugin of a host process: how code is
//! compiled, cached on disk, and interrupted when it runs past its deadline.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::PluginError;
use super::host_state::{MAX_CORE_INSTANCES, MAX_MEMORIES, MAX_TABLES};

/// How often the engine's epoch advances. A call's deadline is counted in
/// these ticks, so a deadline is honoured to within one tick.
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
    /// Count fuel (instructions, roughly) so it can be reported per call.
    pub fuel_metering: bool,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            max_instances: 256,
            max_memory_bytes: 64 << 20,
            cache_dir: None,
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
}

impl CompiledPlugin {
    /// Refuses a plugin built against another version of the contract with
    /// an error that says so. Left to the linker, the same plugin fails with
    /// "instance export `log` has the wrong type", which sends an operator
    /// looking in the wrong place.
    fn check_contract_version(&self, engine: &Engine) -> Result<(), PluginError> {
        let ty = self.component.component_type();
        let names = ty
            .imports(engine)
            .map(|(name, _)| name)
            .chain(ty.exports(engine).map(|(name, _)| name));
        for name in names {
            if let Some(version) = other_contract_version(name) {
                return Err(PluginError::new(
                    &self.path,
                    format!(
                        "was built against acemq:plugin@{version}, and this host implements \
                         acemq:plugin@{}: rebuild it with this host's guest SDK (wit/plugin.wit)",
                        contract_version!()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The version in an `acemq:plugin/NAME@VERSION` name, when it is not ours.
fn other_contract_version(name: &str) -> Option<&str> {
    let (interface, version) = name.strip_prefix("acemq:plugin/")?.split_once('@')?;
    (!interface.is_empty() && version != contract_version!()).then_some(version)
}

/// The engine plus the thread that drives epoch interruption.
pub struct PluginEngine {
    engine: Engine,
    settings: EngineSettings,
    /// Whether the pooling allocator could be used (it needs a lot of virtual
    /// address space; some hosts refuse it, and then instances are allocated
    /// on demand instead of failing to start).
    pooling: bool,
    ticker_stop: Arc<AtomicBool>,
}

impl PluginEngine {
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
        let ticker_stop = Arc::new(AtomicBool::new(false));
        spawn_epoch_ticker(engine.clone(), ticker_stop.clone());
        Ok(Self {
            engine,
            settings,
            pooling,
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

    /// Epoch ticks that make up `deadline` (rounded up, at least one).
    pub fn deadline_ticks(deadline: Duration) -> u64 {
        let ticks = deadline.as_nanos().div_ceil(EPOCH_TICK.as_nanos());
        u64::try_from(ticks).unwrap_or(u64::MAX).max(1)
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
        let compiled = self.compile_component(path, bytes)?;
        compiled.check_contract_version(&self.engine)?;
        Ok(compiled)
    }

    fn compile_component(&self, path: &Path, bytes: &[u8]) -> Result<CompiledPlugin, PluginError> {
        check_is_component(path, bytes)?;
        let sha256 = hex::encode(Sha256::digest(bytes));
        let cached = self.cache_path(&sha256);
        if let Some(cached) = &cached
            && cached.exists()
        {
            // SAFETY: the cache directory holds only files this host wrote from
            // code it compiled itself (named by the source's hash and the
            // engine's compatibility hash); wasmtime rejects files from another
            // version or configuration deterministically.
            match unsafe { Component::deserialize_file(&self.engine, cached) } {
                Ok(component) => {
                    return Ok(CompiledPlugin {
                        path: path.to_path_buf(),
                        sha256,
                        size: bytes.len(),
                        component,
                        from_cache: true,
                    });
                }
                Err(e) => {
                    tracing::warn!(cache = %cached.display(), error = %e, "ignoring an unusable compiled-plugin cache entry")
                }
            }
        }
        let component = Component::new(&self.engine, bytes)
            .map_err(|e| PluginError::new(path, format!("does not compile: {e:#}")))?;
        if let Some(cached) = &cached
            && let Err(e) = write_cache(cached, &component)
        {
            tracing::warn!(cache = %cached.display(), error = %e, "cannot cache the compiled plugin");
        }
        Ok(CompiledPlugin {
            path: path.to_path_buf(),
            sha256,
            size: bytes.len(),
            component,
            from_cache: false,
        })
    }

    fn cache_path(&self, sha256: &str) -> Option<PathBuf> {
        let dir = self.settings.cache_dir.as_ref()?;
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.engine
            .precompile_compatibility_hash()
            .hash(&mut hasher);
        Some(dir.join(format!("{sha256}-{:016x}.cwasm", hasher.finish())))
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
    // Deadlines: every store gets a deadline in epoch ticks before each call.
    config.epoch_interruption(true);
    config.consume_fuel(settings.fuel_metering);
    if pooling {
        let slots = settings.max_instances.max(1);
        // The pool admits exactly what each store's `MemoryLimiter` admits
        // (host_state.rs), so a plugin behaves the same with and without
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

fn write_cache(path: &Path, component: &Component) -> anyhow::Result<()> {
    let bytes = component.serialize()?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Write then rename, so a crash never leaves a half-written entry that a
    // later start would try to load.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
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
    fn another_contract_version_is_named() {
        assert_eq!(
            other_contract_version("acemq:plugin/host@0.1.0"),
            Some("0.1.0")
        );
        assert_eq!(other_contract_version(contract!("handler")), None);
        assert_eq!(other_contract_version("wasi:cli/environment@0.2.0"), None);
        assert_eq!(other_contract_version("acemq:plugin/host"), None);
    }

    #[test]
    fn deadline_ticks_round_up() {
        assert_eq!(PluginEngine::deadline_ticks(Duration::from_millis(1)), 1);
        assert_eq!(PluginEngine::deadline_ticks(Duration::from_millis(10)), 1);
        assert_eq!(PluginEngine::deadline_ticks(Duration::from_millis(11)), 2);
        assert_eq!(PluginEngine::deadline_ticks(Duration::from_secs(2)), 200);
    }

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
