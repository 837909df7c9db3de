//! The wasmtime engine shared by every plugin of a host process: how code is
//! compiled, cached on disk (see [`cache`]: only entries the host can prove
//! it wrote are used), and the epoch clock that lets a running call yield
//! and ends it at its deadline (see `pool.rs`).

mod cache;
mod functions;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use self::cache::PluginCache;
pub use self::cache::default_key_file as default_cache_key_file;
pub use self::functions::Counts as FunctionCounts;
use self::functions::FunctionCache;
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
    /// Whether and where compiled plugins are cached.
    pub cache: CacheChoice,
    /// The key that authenticates cache entries; `None` puts it beside the
    /// cache folder (`<folder>.key`). Unused without a cache.
    pub cache_key_file: Option<PathBuf>,
    /// Count fuel (instructions, roughly) so it can be reported per call.
    pub fuel_metering: bool,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            max_instances: 256,
            max_memory_bytes: 64 << 20,
            cache: CacheChoice::Off,
            cache_key_file: None,
            fuel_metering: false,
        }
    }
}

/// Whether and where compiled plugins are kept between processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheChoice {
    /// Compile every plugin at every start: for tests and benchmarks that
    /// must not share compiled code with anything else.
    Off,
    /// The user's cache folder ([`crate::user_cache::compiled_plugins`]),
    /// the host's default. A folder that cannot be used (no home, refused
    /// by the trust rules) is logged, and plugins are compiled without it:
    /// a cache nobody asked for never stops a host.
    UserDefault,
    /// A folder the configuration names: one that cannot be used refuses
    /// the start, naming it and why.
    Folder(PathBuf),
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
    /// The functions compiled, kept in the cache's folder (inert without one).
    functions: Arc<FunctionCache>,
    ticker_stop: Arc<AtomicBool>,
}

impl PluginEngine {
    /// Creates the engine, and opens the compiled-plugin cache when one is
    /// configured: a cache folder or key file others could change is refused
    /// here, before any plugin loads.
    pub fn new(settings: EngineSettings) -> anyhow::Result<Self> {
        let functions = Arc::new(FunctionCache::default());
        let (engine, pooling) = match Engine::new(&engine_config(&settings, true, &functions)) {
            Ok(engine) => (engine, true),
            Err(pooling_error) => {
                tracing::warn!(
                    error = %pooling_error,
                    "the pooling instance allocator is not available here; allocating plugin instances on demand"
                );
                let engine = Engine::new(&engine_config(&settings, false, &functions))
                    .map_err(|e| anyhow::anyhow!("cannot create the WebAssembly engine: {e:#}"))?;
                (engine, false)
            }
        };
        let cache = open_cache(&engine, &settings)?;
        if let Some(cache) = &cache {
            cache.arm(&functions);
        }
        let ticker_stop = Arc::new(AtomicBool::new(false));
        spawn_epoch_ticker(engine.clone(), ticker_stop.clone());
        Ok(Self {
            engine,
            settings,
            pooling,
            cache,
            functions,
            ticker_stop,
        })
    }

    /// How many functions this engine's compilations took from the
    /// compiled-function cache, and how many they compiled.
    pub fn function_counts(&self) -> FunctionCounts {
        self.functions.counts()
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

    /// The folder compiled plugins are cached in, when there is a cache.
    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache.as_ref().map(PluginCache::dir)
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
        let started = Instant::now();
        let cached = self
            .cache
            .as_ref()
            .and_then(|cache| cache.load(&self.engine, path, &source));
        let from_cache = cached.is_some();
        let component = match cached {
            Some(component) => {
                tracing::info!(
                    plugin = %path.display(),
                    size = %megabytes(bytes.len()),
                    seconds = %seconds(started.elapsed()),
                    "plugin taken from the compiled-plugin cache"
                );
                component
            }
            None => self.compile_and_cache(path, bytes, &source)?,
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

impl PluginEngine {
    /// Compiles a plugin the cache does not hold, saying when it starts and
    /// how long it took: a large plugin (a Python or JavaScript one carries
    /// its interpreter, 12 to 20 MB) takes seconds, and a host that says
    /// nothing meanwhile looks stuck.
    fn compile_and_cache(
        &self,
        path: &Path,
        bytes: &[u8],
        source: &[u8; 32],
    ) -> Result<Component, PluginError> {
        tracing::info!(
            plugin = %path.display(),
            size = %megabytes(bytes.len()),
            "compiling the plugin"
        );
        let started = Instant::now();
        let before = self.functions.counts();
        let component = {
            let _compiling = self.functions.compiling();
            Component::new(&self.engine, bytes)
                .map_err(|e| PluginError::new(path, format!("does not compile: {e:#}")))?
        };
        let compiled_in = started.elapsed();
        let after = self.functions.counts();
        let cached = match &self.cache {
            Some(cache) => match cache.store(source, &component) {
                Ok(_entry) => "cached",
                Err(e) => {
                    tracing::warn!(plugin = %path.display(), error = %e, "cannot cache the compiled plugin");
                    "not cached"
                }
            },
            None => "no cache",
        };
        tracing::info!(
            plugin = %path.display(),
            size = %megabytes(bytes.len()),
            seconds = %seconds(compiled_in),
            cache = cached,
            functions_reused = after.reused - before.reused,
            functions_compiled = after.compiled - before.compiled,
            "plugin compiled"
        );
        Ok(component)
    }
}

/// Opens the cache `settings` ask for. Only a configured folder's refusal
/// is an error; the user's default folder is a convenience, and without it
/// the host compiles at every start, as it says.
fn open_cache(engine: &Engine, settings: &EngineSettings) -> anyhow::Result<Option<PluginCache>> {
    let key_file = settings.cache_key_file.as_deref();
    match &settings.cache {
        CacheChoice::Off => Ok(None),
        CacheChoice::Folder(dir) => Ok(Some(PluginCache::open(engine, dir, key_file)?)),
        CacheChoice::UserDefault => {
            let Some(dir) = crate::user_cache::compiled_plugins() else {
                tracing::warn!(
                    "compiled plugins are not cached: neither XDG_CACHE_HOME nor HOME is an \
                     absolute path (set [host] plugin_cache_dir to cache them)"
                );
                return Ok(None);
            };
            match PluginCache::open(engine, &dir, key_file) {
                Ok(cache) => Ok(Some(cache)),
                Err(refused) => {
                    tracing::warn!(
                        error = %refused,
                        "compiled plugins are not cached in the user's cache folder; every start \
                         compiles them (set [host] plugin_cache_dir, or plugin_cache = false)"
                    );
                    Ok(None)
                }
            }
        }
    }
}

/// A size in MB with one decimal, as log lines show it.
fn megabytes(bytes: usize) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// A duration in seconds with two decimals, as log lines show it.
fn seconds(duration: Duration) -> String {
    format!("{:.2} s", duration.as_secs_f64())
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

fn engine_config(
    settings: &EngineSettings,
    pooling: bool,
    functions: &Arc<FunctionCache>,
) -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    // Each function's compilation is looked up by its content first
    // (functions.rs): a new version of a plugin compiles only what changed.
    config
        .enable_incremental_compilation(functions.clone())
        .expect("wasmtime is built with its incremental-cache feature");
    // Deadlines and yielding: every store's epoch callback decides at each
    // tick whether its running call yields or ends (pool.rs).
    config.epoch_interruption(true);
    config.consume_fuel(settings.fuel_metering);
    if perf_map_requested() {
        // Names the plugins' compiled functions for `perf report`
        // (/tmp/perf-<pid>.map); it changes no compiled code.
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
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

/// Set to `1`, the host writes a perf map of the plugins' compiled
/// functions, so that a profile names the guest code it ran
/// (docs/operating.md, "Tuning and profiling").
const PERF_MAP_VARIABLE: &str = "ACEMQ_PERF_MAP";

fn perf_map_requested() -> bool {
    std::env::var_os(PERF_MAP_VARIABLE).is_some_and(|value| value == "1")
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

    /// `plugin build` precompiles with an engine sized for one instance;
    /// a host sizes its pool from its config. The machine code must be
    /// the same (so the cache entry is found), and fuel metering, which
    /// changes the code, must give another entry.
    #[test]
    fn the_pool_size_does_not_change_the_cache_entry_and_fuel_metering_does() {
        let fingerprint = |settings: EngineSettings| {
            cache::engine_fingerprint(PluginEngine::new(settings).unwrap().engine())
        };
        let precompiling = fingerprint(EngineSettings {
            max_instances: 1,
            ..EngineSettings::default()
        });
        let host = fingerprint(EngineSettings {
            max_instances: 40,
            max_memory_bytes: 256 << 20,
            ..EngineSettings::default()
        });
        assert_eq!(precompiling, host);
        let metered = fingerprint(EngineSettings {
            fuel_metering: true,
            ..EngineSettings::default()
        });
        assert_ne!(precompiling, metered);
    }

    /// A component of one core module whose functions return `values`.
    fn component_returning(values: &[i32]) -> Vec<u8> {
        let functions: String = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                format!("(func (export \"f{i}\") (result i32) i32.const {v} i32.const 3 i32.mul)")
            })
            .collect();
        wat::parse_str(format!(
            "(component (core module {functions}) (core instance (instantiate 0)))"
        ))
        .unwrap()
    }

    fn engine_caching_in(folder: &Path, key_file: &Path) -> PluginEngine {
        PluginEngine::new(EngineSettings {
            cache: CacheChoice::Folder(folder.to_path_buf()),
            cache_key_file: Some(key_file.to_path_buf()),
            ..EngineSettings::default()
        })
        .unwrap()
    }

    /// A new version shares most functions with the last: only the
    /// changed ones are compiled, in another engine (another process) too.
    #[test]
    fn a_new_version_compiles_only_the_functions_it_changed() {
        let dir = tempfile::tempdir().unwrap();
        let (folder, key) = (dir.path().join("plugins"), dir.path().join("plugins.key"));
        let first = engine_caching_in(&folder, &key);
        first
            .compile_component(Path::new("v1.wasm"), &component_returning(&[1, 2, 3, 4]))
            .unwrap();
        let counts = first.function_counts();
        assert_eq!(counts.reused, 0, "{counts:?}");
        assert!(counts.compiled >= 4, "{counts:?}");
        assert!(folder.join(functions::FILE_NAME).is_file());

        let second = engine_caching_in(&folder, &key);
        let v2 = component_returning(&[1, 2, 3, 5]);
        let compiled = second.compile_component(Path::new("v2.wasm"), &v2).unwrap();
        assert!(
            !compiled.from_cache,
            "a new version is not in the plugin cache"
        );
        let counts = second.function_counts();
        assert!(
            counts.reused >= 3,
            "the three unchanged functions: {counts:?}"
        );
        assert_eq!(counts.untrusted, 0, "{counts:?}");
        // The reused code runs as compiled code does.
        let mut store = wasmtime::Store::new(second.engine(), ());
        let linker = wasmtime::component::Linker::<()>::new(second.engine());
        assert!(linker.instantiate(&mut store, &compiled.component).is_ok());
    }

    /// Values sealed under another key (another host's cache key, or a
    /// file someone else wrote) are never used: the functions compile.
    #[test]
    fn functions_sealed_under_another_key_are_compiled_again() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("plugins");
        let wasm = component_returning(&[7, 8]);
        engine_caching_in(&folder, &dir.path().join("plugins.key"))
            .compile_component(Path::new("a.wasm"), &wasm)
            .unwrap();
        let other = engine_caching_in(&folder, &dir.path().join("other.key"));
        other.compile_component(Path::new("a.wasm"), &wasm).unwrap();
        let counts = other.function_counts();
        assert_eq!(counts.reused, 0, "{counts:?}");
        assert!(counts.untrusted >= 2, "{counts:?}");
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
