//! Hot swap: replacing a consumer's handler plugin while the host runs
//! (docs/targets.md, Hot swap).
//!
//! A reload reads the plugin file, and unless its SHA-256 is the one already
//! serving, compiles it on a blocking thread, type-checks it against the
//! `handler-plugin` world and warms one instance ([`HandlerVersion`] does all
//! three); only then does it swap the consumer's [`HandlerSlot`]. A version
//! that fails any step is refused, with a logged reason naming the file, and
//! the old version keeps serving. A swap touches nothing but the slot: the
//! AMQP consumer stays subscribed, no delivery is requeued, and a delivery
//! already running finishes on the version it started with (it holds its own
//! `Arc` of that version).
//!
//! Three triggers, all ending in [`Reloader::reload`]:
//! - a change to the plugin file, seen by watching its folder (so writing in
//!   place and renaming a new file over it are both seen), debounced so a
//!   file still being written is read once, complete;
//! - SIGHUP, which reloads every consumer;
//! - `POST /plugins/reload` on the admin endpoint (`admin.rs`).
//!
//! Reloads of one consumer are serialised, so two triggers at once load the
//! file once: the second finds its hash already serving.
//!
//! Before every reload the file and every folder above it are checked again
//! as at start (`fs_trust::check_plugin`): a folder made writable to others
//! since, or a plugin folder swapped for someone else's, is refused with the
//! reason, and the version serving keeps serving. A plugin's start-up code
//! runs under the consumer's deadline, waiting or not (`pool.rs`), so it
//! cannot hold the reload, or this consumer's later reloads, past it.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
use notify::{RecommendedWatcher, RecursiveMode, Watcher as _};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::engine::CompiledPlugin;
use super::{
    CodecVersion, Codecs, HandlerSlot, HandlerVersion, InstanceCost, Limits, PluginEngine,
    PluginError,
};
use crate::telemetry::{Metrics, PluginSwapLabels, PluginVersionLabels};

/// How long a plugin file must stay quiet after a change before it is read
/// (debounce), by what the last event said about the file:
/// - renamed into place, or closed by its writer: it is complete; wait only
///   for the rest of the same burst of events;
const QUIET_COMPLETE: Duration = Duration::from_millis(10);
/// - created, removed, attributes changed: something may follow;
const QUIET: Duration = Duration::from_millis(75);
/// - written but not yet closed (Linux reports closes): a copy is going on.
const QUIET_OPEN_FOR_WRITING: Duration = Duration::from_millis(500);

/// What asked for a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    FileChanged,
    Signal,
    Admin,
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cause::FileChanged => "file change",
            Cause::Signal => "SIGHUP",
            Cause::Admin => "admin request",
        })
    }
}

/// A reload request: why, and since when (the swap's latency is measured
/// from here to the new version serving).
#[derive(Debug, Clone, Copy)]
pub struct Trigger {
    pub cause: Cause,
    pub at: Instant,
}

impl Trigger {
    pub fn now(cause: Cause) -> Self {
        Self {
            cause,
            at: Instant::now(),
        }
    }
}

/// How one consumer's reload ended.
#[derive(Debug, Clone)]
pub enum ReloadResult {
    /// The new version serves every delivery from now on.
    Swapped {
        from: String,
        to: String,
        /// From the trigger to the new version serving.
        took: Duration,
        from_cache: bool,
    },
    /// The file holds the version already serving: nothing to do.
    Unchanged { sha256: String },
    /// The file cannot serve; `serving` still does.
    Refused {
        /// The refused file's hash, when it could be read.
        sha256: Option<String>,
        reason: String,
        serving: String,
    },
}

impl ReloadResult {
    pub fn label(&self) -> &'static str {
        match self {
            ReloadResult::Swapped { .. } => "swapped",
            ReloadResult::Unchanged { .. } => "unchanged",
            ReloadResult::Refused { .. } => "refused",
        }
    }

    pub fn is_refused(&self) -> bool {
        matches!(self, ReloadResult::Refused { .. })
    }
}

/// One consumer's reload result.
#[derive(Debug, Clone)]
pub struct ReloadReport {
    pub queue: String,
    pub path: PathBuf,
    pub result: ReloadResult,
}

impl ReloadReport {
    /// The report as the admin endpoint shows it.
    pub fn to_json(&self) -> serde_json::Value {
        let mut json = serde_json::json!({
            "queue": self.queue,
            "path": self.path.display().to_string(),
            "result": self.result.label(),
        });
        let fields = json.as_object_mut().expect("an object");
        match &self.result {
            ReloadResult::Swapped {
                from,
                to,
                took,
                from_cache,
            } => {
                fields.insert("from".into(), from.as_str().into());
                fields.insert("to".into(), to.as_str().into());
                fields.insert("sha256".into(), to.as_str().into());
                fields.insert("took_ms".into(), millis(*took).into());
                fields.insert("from_cache".into(), (*from_cache).into());
            }
            ReloadResult::Unchanged { sha256 } => {
                fields.insert("sha256".into(), sha256.as_str().into());
            }
            ReloadResult::Refused {
                sha256,
                reason,
                serving,
            } => {
                fields.insert("refused_sha256".into(), sha256.clone().into());
                fields.insert("reason".into(), reason.as_str().into());
                fields.insert("sha256".into(), serving.as_str().into());
            }
        }
        json
    }
}

/// A refused reload, kept for the admin endpoint.
#[derive(Debug, Clone)]
pub struct RefusedReload {
    pub at: SystemTime,
    pub cause: Cause,
    pub sha256: Option<String>,
    pub reason: String,
}

/// A consumer's plugin as the admin endpoint shows it.
#[derive(Debug, Clone)]
pub struct PluginStatus {
    /// The consumer's queue, or for a codec its `codec:NAME`.
    pub queue: String,
    /// A codec's, not a consumer's handler.
    pub codec: bool,
    pub path: PathBuf,
    pub sha256: String,
    pub size: usize,
    pub loaded_at: SystemTime,
    pub from_cache: bool,
    /// Pooled instances waiting for a call.
    pub idle_instances: usize,
    pub instance_cost: InstanceCost,
    pub last_refused: Option<RefusedReload>,
    /// Set while most of the current version's latest calls fault.
    pub faulting: Option<super::fault_window::Faulting>,
}

impl PluginStatus {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "queue": self.queue,
            "kind": if self.codec { "codec" } else { "handler" },
            "path": self.path.display().to_string(),
            "sha256": self.sha256,
            "size": self.size,
            "loaded_at": humantime::format_rfc3339_millis(self.loaded_at).to_string(),
            "from_cache": self.from_cache,
            "instances": {
                "idle": self.idle_instances,
                "memory_bytes": self.instance_cost.memory_bytes,
                "instantiation_ms": self.instance_cost.instantiation.as_secs_f64() * 1e3,
            },
            "faulting": self.faulting.as_ref().map(|f| serde_json::json!({
                "faulted": f.faulted,
                "of": f.of,
                "last_reason": f.last_reason,
            })),
            "last_refused": self.last_refused.as_ref().map(|r| serde_json::json!({
                "at": humantime::format_rfc3339_millis(r.at).to_string(),
                "trigger": r.cause.to_string(),
                "sha256": r.sha256,
                "reason": r.reason,
            })),
        })
    }
}

/// A consumer whose plugin can be reloaded.
pub struct PluginSpec {
    pub queue: String,
    pub path: PathBuf,
    pub slot: Arc<HandlerSlot>,
}

/// A codec of the host that can be reloaded: the one at `index` of
/// `codecs` (config order).
pub struct CodecSpec {
    pub path: PathBuf,
    pub index: usize,
    pub codecs: Arc<Codecs>,
    pub limits: Limits,
}

/// The name a codec goes by where consumers go by their queue (reloads,
/// `/plugins`, the swap metrics): `codec:` and its file's stem.
pub fn codec_label(path: &Path) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    format!("codec:{stem}")
}

/// What a reload replaces.
#[derive(Clone)]
enum Target {
    /// A consumer's handler, through its slot.
    Handler(Arc<HandlerSlot>),
    /// A codec, in its place among the host's codecs.
    Codec {
        index: usize,
        codecs: Arc<Codecs>,
        limits: Limits,
    },
}

/// A version loaded for a [`Target`], not yet swapped in.
enum Loaded {
    Handler(Arc<HandlerVersion>),
    Codec(Arc<CodecVersion>),
}

struct Entry {
    /// The consumer's queue, or the codec's [`codec_label`].
    queue: String,
    /// The file reloads read: the configured one, or a rollout's candidate
    /// once it was promoted ([`Reloader::set_path`]).
    path: Mutex<PathBuf>,
    /// The file watched for changes (the configured one).
    watched: PathBuf,
    target: Target,
    /// Held for the whole of a reload: one reload per consumer at a time.
    reloading: tokio::sync::Mutex<()>,
    last_refused: Mutex<Option<RefusedReload>>,
}

impl Entry {
    fn path(&self) -> PathBuf {
        self.path.lock().expect("poisoned").clone()
    }

    /// The SHA-256 of the version serving now.
    fn serving(&self) -> String {
        match &self.target {
            Target::Handler(slot) => slot.current().sha256.to_string(),
            Target::Codec { index, codecs, .. } => codecs
                .get(*index)
                .map(|codec| codec.sha256.clone())
                .unwrap_or_default(),
        }
    }
}

impl Target {
    /// Type-checks and warms a compiled version for this target.
    fn load(&self, engine: &PluginEngine, compiled: CompiledPlugin) -> Result<Loaded, PluginError> {
        match self {
            Target::Handler(slot) => {
                let context = slot.current().context().clone();
                HandlerVersion::from_compiled(engine, compiled, context).map(Loaded::Handler)
            }
            Target::Codec { limits, .. } => {
                CodecVersion::from_compiled(engine, compiled, limits.clone()).map(Loaded::Codec)
            }
        }
    }
}

impl Entry {
    /// Puts `loaded` in place; the SHA-256 and load facts of the version it
    /// replaced (dropped here: deliveries still running keep their own).
    fn swap(&self, loaded: Loaded) -> (String, String, bool) {
        match (&self.target, loaded) {
            (Target::Handler(slot), Loaded::Handler(version)) => {
                let (to, from_cache) = (version.sha256.to_string(), version.from_cache);
                (slot.swap(version).sha256.to_string(), to, from_cache)
            }
            (Target::Codec { index, codecs, .. }, Loaded::Codec(version)) => {
                let (to, from_cache) = (version.sha256.clone(), version.from_cache);
                let from = codecs
                    .replace(*index, version)
                    .map(|old| old.sha256.clone())
                    .unwrap_or_default();
                (from, to, from_cache)
            }
            _ => unreachable!("a target loads its own kind of version"),
        }
    }

    fn status(&self) -> PluginStatus {
        let last_refused = self.last_refused.lock().expect("poisoned").clone();
        match &self.target {
            Target::Handler(slot) => {
                let current = slot.current();
                PluginStatus {
                    queue: self.queue.clone(),
                    codec: false,
                    path: self.path(),
                    sha256: current.sha256.to_string(),
                    size: current.size,
                    loaded_at: current.loaded_at,
                    from_cache: current.from_cache,
                    idle_instances: current.idle_instances(),
                    instance_cost: current.instance_cost(),
                    last_refused,
                    faulting: current.faulting(),
                }
            }
            Target::Codec { index, codecs, .. } => {
                let codec = codecs.get(*index).expect("a codec's index stays in range");
                PluginStatus {
                    queue: self.queue.clone(),
                    codec: true,
                    path: self.path(),
                    sha256: codec.sha256.clone(),
                    size: codec.size,
                    loaded_at: codec.loaded_at,
                    from_cache: codec.from_cache,
                    idle_instances: codec.idle_instances(),
                    instance_cost: codec.instance_cost(),
                    last_refused,
                    faulting: None,
                }
            }
        }
    }
}

/// A consumer name that matches no consumer.
#[derive(Debug, Clone, thiserror::Error)]
#[error("no consumer reads queue '{0}'")]
pub struct UnknownQueue(pub String);

/// Reloads consumers' handler plugins, on request and on file changes.
pub struct Reloader {
    engine: Arc<PluginEngine>,
    metrics: Arc<Metrics>,
    entries: Vec<Entry>,
}

impl Reloader {
    pub fn new(
        engine: Arc<PluginEngine>,
        metrics: Arc<Metrics>,
        specs: impl IntoIterator<Item = PluginSpec>,
    ) -> Self {
        let entries = specs
            .into_iter()
            .map(|spec| Entry {
                queue: spec.queue,
                watched: spec.path.clone(),
                path: Mutex::new(spec.path),
                target: Target::Handler(spec.slot),
                reloading: tokio::sync::Mutex::new(()),
                last_refused: Mutex::new(None),
            })
            .collect();
        Self {
            engine,
            metrics,
            entries,
        }
    }

    /// Reloads the host's codecs too, each by its [`codec_label`].
    pub fn with_codecs(mut self, specs: impl IntoIterator<Item = CodecSpec>) -> Self {
        self.entries.extend(specs.into_iter().map(|spec| Entry {
            queue: codec_label(&spec.path),
            watched: spec.path.clone(),
            path: Mutex::new(spec.path),
            target: Target::Codec {
                index: spec.index,
                codecs: spec.codecs,
                limits: spec.limits,
            },
            reloading: tokio::sync::Mutex::new(()),
            last_refused: Mutex::new(None),
        }));
        self
    }

    /// From now on, reloads of the consumer of `queue` read `path`: its
    /// rollout's candidate was promoted, and it is the version's file.
    pub fn set_path(&self, queue: &str, path: &Path) {
        if let Some(entry) = self.entries.iter().find(|e| e.queue == queue) {
            *entry.path.lock().expect("poisoned") = path.to_path_buf();
        }
    }

    /// Every consumer's current plugin, then every codec's.
    pub fn status(&self) -> Vec<PluginStatus> {
        self.entries.iter().map(Entry::status).collect()
    }

    /// Reloads the plugin of the consumer of `queue`, or of every consumer.
    pub async fn reload(
        &self,
        queue: Option<&str>,
        trigger: Trigger,
    ) -> Result<Vec<ReloadReport>, UnknownQueue> {
        let chosen: Vec<usize> = (0..self.entries.len())
            .filter(|&i| queue.is_none_or(|q| self.entries[i].queue == q))
            .collect();
        if let Some(queue) = queue
            && chosen.is_empty()
        {
            return Err(UnknownQueue(queue.to_string()));
        }
        Ok(self.reload_entries(&chosen, trigger).await)
    }

    async fn reload_entries(&self, chosen: &[usize], trigger: Trigger) -> Vec<ReloadReport> {
        let mut reports = Vec::with_capacity(chosen.len());
        for &index in chosen {
            reports.push(self.reload_entry(&self.entries[index], trigger).await);
        }
        reports
    }

    async fn reload_entry(&self, entry: &Entry, trigger: Trigger) -> ReloadReport {
        let _one_at_a_time = entry.reloading.lock().await;
        let serving = entry.serving();
        let engine = self.engine.clone();
        let path = entry.path();
        let serving_sha = serving.clone();
        // Reading, hashing, compiling and warming are blocking work (the
        // compile takes milliseconds to seconds): off the runtime's workers.
        let target = entry.target.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            // Trusted at start is not trusted now: checked again each time.
            crate::fs_trust::check_plugin(&path).map_err(|refused| {
                (
                    None,
                    PluginError::new(&path, format!("is not trusted now: {refused}")),
                )
            })?;
            let bytes = std::fs::read(&path).map_err(|e| {
                (
                    None,
                    PluginError::new(&path, format!("cannot read it: {e}")),
                )
            })?;
            let sha256 = hex::encode(Sha256::digest(&bytes));
            if sha256 == serving_sha {
                return Ok(None);
            }
            let started = Instant::now();
            let compiled = engine
                .compile_bytes(&path, &bytes)
                .map_err(|e| (Some(sha256.clone()), e))?;
            let version = target
                .load(&engine, compiled)
                .map_err(|e| (Some(sha256), e))?;
            Ok(Some((version, started.elapsed())))
        })
        .await
        .unwrap_or_else(|join_error| {
            Err((
                None,
                PluginError::new(&entry.path(), format!("loading it panicked: {join_error}")),
            ))
        });

        let result = match loaded {
            Ok(None) => ReloadResult::Unchanged { sha256: serving },
            Ok(Some((version, load_time))) => self.swap_in(entry, version, load_time, trigger),
            Err((sha256, error)) => self.refuse(entry, sha256, error, serving, trigger),
        };
        if let ReloadResult::Unchanged { sha256 } = &result {
            // A file event that changed nothing (a touch, our own rewrite of
            // the same bytes) is routine; an explicit request is worth a line.
            if trigger.cause == Cause::FileChanged {
                tracing::debug!(queue = %entry.queue, plugin = %entry.path().display(), sha256 = %sha256, trigger = %trigger.cause, "plugin unchanged");
            } else {
                tracing::info!(queue = %entry.queue, plugin = %entry.path().display(), sha256 = %sha256, trigger = %trigger.cause, "plugin unchanged; nothing to swap");
            }
        }
        ReloadReport {
            queue: entry.queue.clone(),
            path: entry.path(),
            result,
        }
    }

    fn swap_in(
        &self,
        entry: &Entry,
        version: Loaded,
        load_time: Duration,
        trigger: Trigger,
    ) -> ReloadResult {
        // The swap itself: every delivery that loads the slot (or the
        // codecs) from here on gets the new version; running ones keep
        // their own `Arc` of the old.
        let (from, to, from_cache) = entry.swap(version);
        let took = trigger.at.elapsed();
        let gauge = |sha256: &str| {
            self.metrics
                .plugin_version
                .get_or_create(&PluginVersionLabels {
                    queue: entry.queue.clone(),
                    sha256: sha256.to_string(),
                })
                .clone()
        };
        gauge(&from).set(0);
        gauge(&to).set(1);
        self.count(entry, "swapped");
        tracing::info!(
            queue = %entry.queue,
            plugin = %entry.path().display(),
            from = %from,
            to = %to,
            trigger = %trigger.cause,
            took_ms = millis(took),
            load_ms = millis(load_time),
            from_cache,
            "plugin swapped"
        );
        ReloadResult::Swapped {
            from,
            to,
            took,
            from_cache,
        }
    }

    fn refuse(
        &self,
        entry: &Entry,
        sha256: Option<String>,
        error: PluginError,
        serving: String,
        trigger: Trigger,
    ) -> ReloadResult {
        let reason = error.to_string();
        self.count(entry, "refused");
        tracing::warn!(
            queue = %entry.queue,
            plugin = %entry.path().display(),
            refused_sha256 = sha256.as_deref().unwrap_or("-"),
            serving = %serving,
            trigger = %trigger.cause,
            reason = %reason,
            "plugin refused; the current version keeps serving"
        );
        *entry.last_refused.lock().expect("poisoned") = Some(RefusedReload {
            at: SystemTime::now(),
            cause: trigger.cause,
            sha256: sha256.clone(),
            reason: reason.clone(),
        });
        ReloadResult::Refused {
            sha256,
            reason,
            serving,
        }
    }

    fn count(&self, entry: &Entry, result: &str) {
        self.metrics
            .plugin_swaps
            .get_or_create(&PluginSwapLabels {
                queue: entry.queue.clone(),
                result: result.to_string(),
            })
            .inc();
    }

    /// Starts the automatic triggers: the file watcher and SIGHUP. They stop
    /// when `stop` is cancelled; await the handle to know they have.
    ///
    /// Neither is essential: if the watcher cannot start (no inotify
    /// watches left, say), that is logged and SIGHUP and the admin endpoint
    /// still reload.
    pub fn start(self: &Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let reloader = self.clone();
        let (events, watched) = mpsc::unbounded_channel();
        let watcher = reloader.watch(events);
        tokio::spawn(async move {
            // Kept alive for as long as the loop runs; dropping it stops it.
            let _watcher = watcher;
            reloader.trigger_loop(watched, stop).await;
        })
    }

    /// Watches the folder of every plugin file (a file replaced by a rename
    /// is a new inode: only its folder sees that) and sends the indexes of
    /// the consumers whose file an event touched.
    fn watch(&self, events: mpsc::UnboundedSender<FileEvent>) -> Option<RecommendedWatcher> {
        // Watched file path -> the consumers it serves. Keys are built from
        // the watched folder exactly as the watcher builds event paths.
        let mut files: HashMap<PathBuf, Vec<usize>> = HashMap::new();
        // Watched folder -> the consumers whose file is named in it: a
        // swap of its `..data` link changes all of them at once.
        let mut by_folder: HashMap<PathBuf, Vec<usize>> = HashMap::new();
        let mut folders = BTreeSet::new();
        for (index, entry) in self.entries.iter().enumerate() {
            let Some(name) = entry.watched.file_name() else {
                continue;
            };
            let folder = match entry.watched.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let folder = std::fs::canonicalize(&folder).unwrap_or(folder);
            files.entry(folder.join(name)).or_default().push(index);
            by_folder.entry(folder.clone()).or_default().push(index);
            folders.insert(folder);
        }
        let handler = move |event: notify::Result<notify::Event>| {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    tracing::warn!(error = %e, "plugin file watcher");
                    return;
                }
            };
            // The watcher lost events (its queue overflowed): look at every file.
            let consumers: Vec<usize> = if event.need_rescan() {
                files.values().flatten().copied().collect()
            } else if is_change(&event.kind) {
                event
                    .paths
                    .iter()
                    .flat_map(|p| touched(p, &files, &by_folder))
                    .copied()
                    .collect()
            } else {
                return;
            };
            if !consumers.is_empty() {
                let _ = events.send(FileEvent {
                    consumers,
                    at: Instant::now(),
                    quiet_for: quiet_for(&event.kind),
                });
            }
        };
        let mut watcher = match notify::recommended_watcher(handler) {
            Ok(watcher) => watcher,
            Err(e) => {
                tracing::error!(error = %e, "cannot watch plugin files; reload them with SIGHUP or POST /plugins/reload");
                return None;
            }
        };
        for folder in &folders {
            match watcher.watch(folder, RecursiveMode::NonRecursive) {
                Ok(()) => tracing::debug!(folder = %folder.display(), "watching plugin files"),
                Err(e) => tracing::error!(
                    folder = %folder.display(),
                    error = %e,
                    "cannot watch this folder's plugin files; reload them with SIGHUP or POST /plugins/reload"
                ),
            }
        }
        Some(watcher)
    }

    async fn trigger_loop(
        &self,
        mut watched: mpsc::UnboundedReceiver<FileEvent>,
        stop: CancellationToken,
    ) {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangup = match signal(SignalKind::hangup()) {
            Ok(hangup) => Some(hangup),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP; plugins reload on file changes and POST /plugins/reload only");
                None
            }
        };
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                Some(()) = recv_signal(&mut hangup) => {
                    tracing::info!("SIGHUP: reloading every plugin (only plugins: the config file is read at start)");
                    let all: Vec<usize> = (0..self.entries.len()).collect();
                    self.reload_entries(&all, Trigger::now(Cause::Signal)).await;
                }
                Some(first) = watched.recv() => {
                    let Some((consumers, at)) = debounce(first, &mut watched, &stop).await else {
                        break;
                    };
                    let trigger = Trigger { cause: Cause::FileChanged, at };
                    self.reload_entries(&consumers, trigger).await;
                }
            }
        }
    }
}

/// What the watcher saw happen to some consumers' plugin file.
#[derive(Debug)]
struct FileEvent {
    consumers: Vec<usize>,
    at: Instant,
    /// How long to wait for more, were this the last event.
    quiet_for: Duration,
}

/// Changes worth a reload: anything that can change the bytes at the path
/// (written, created, renamed over or away, removed, closed after writing).
/// Opening and reading are not: the reload's own read would loop forever.
/// The name of the link a Kubernetes ConfigMap, Secret or projected volume
/// swaps to publish new contents: its files are links through it
/// (`plugin.wasm -> ..data/plugin.wasm`), and the kubelet replaces the link
/// with a rename, so the only event the folder sees is on this name.
pub const KUBERNETES_DATA_LINK: &str = "..data";

/// The consumers an event on `path` concerns: those whose plugin file it
/// is, or, for the swap of a [`KUBERNETES_DATA_LINK`], every consumer whose
/// file is named in that folder.
fn touched<'a>(
    path: &Path,
    files: &'a HashMap<PathBuf, Vec<usize>>,
    by_folder: &'a HashMap<PathBuf, Vec<usize>>,
) -> &'a [usize] {
    if let Some(consumers) = files.get(path) {
        return consumers;
    }
    if path.file_name() == Some(std::ffi::OsStr::new(KUBERNETES_DATA_LINK))
        && let Some(consumers) = path.parent().and_then(|folder| by_folder.get(folder))
    {
        return consumers;
    }
    &[]
}

fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_) => true,
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) | EventKind::Any | EventKind::Other => false,
    }
}

fn quiet_for(kind: &EventKind) -> Duration {
    match kind {
        EventKind::Modify(ModifyKind::Name(_))
        | EventKind::Access(AccessKind::Close(AccessMode::Write)) => QUIET_COMPLETE,
        EventKind::Modify(ModifyKind::Data(_)) => QUIET_OPEN_FOR_WRITING,
        _ => QUIET,
    }
}

/// Debounce: collects events until the files have been quiet for as long as
/// the last event asks ([`quiet_for`]). Returns the consumers touched and
/// when the first event came, or `None` on stop.
async fn debounce(
    first: FileEvent,
    watched: &mut mpsc::UnboundedReceiver<FileEvent>,
    stop: &CancellationToken,
) -> Option<(Vec<usize>, Instant)> {
    let at = first.at;
    let mut quiet = first.quiet_for;
    let mut consumers: BTreeSet<usize> = first.consumers.into_iter().collect();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return None,
            next = watched.recv() => match next {
                Some(event) => {
                    quiet = event.quiet_for;
                    consumers.extend(event.consumers);
                }
                None => break,
            },
            _ = tokio::time::sleep(quiet) => break,
        }
    }
    Some((consumers.into_iter().collect(), at))
}

async fn recv_signal(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

fn millis(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1e6).round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, DataChange, RenameMode};

    #[test]
    fn a_data_link_swap_touches_every_plugin_named_in_its_folder_only() {
        let files = HashMap::from([
            (PathBuf::from("/p/a.wasm"), vec![0]),
            (PathBuf::from("/p/b.wasm"), vec![1, 2]),
            (PathBuf::from("/q/c.wasm"), vec![3]),
        ]);
        let by_folder = HashMap::from([
            (PathBuf::from("/p"), vec![0, 1, 2]),
            (PathBuf::from("/q"), vec![3]),
        ]);
        let touched = |path: &str| touched(Path::new(path), &files, &by_folder).to_vec();
        assert_eq!(touched("/p/b.wasm"), [1, 2]);
        assert_eq!(touched("/p/..data"), [0, 1, 2]);
        assert_eq!(touched("/q/..data"), [3]);
        assert_eq!(touched("/p/..data_tmp"), Vec::<usize>::new());
        assert_eq!(touched("/p/other.wasm"), Vec::<usize>::new());
        assert_eq!(touched("/r/..data"), Vec::<usize>::new());
    }

    #[test]
    fn reads_and_opens_are_not_changes() {
        assert!(!is_change(&EventKind::Access(AccessKind::Open(
            AccessMode::Any
        ))));
        assert!(!is_change(&EventKind::Access(AccessKind::Close(
            AccessMode::Read
        ))));
        assert!(is_change(&EventKind::Access(AccessKind::Close(
            AccessMode::Write
        ))));
        assert!(is_change(&EventKind::Modify(ModifyKind::Name(
            RenameMode::To
        ))));
        assert!(is_change(&EventKind::Modify(ModifyKind::Data(
            DataChange::Any
        ))));
        assert!(is_change(&EventKind::Create(CreateKind::File)));
    }

    #[test]
    fn a_file_renamed_in_or_closed_is_read_at_once_one_being_written_later() {
        let renamed = EventKind::Modify(ModifyKind::Name(RenameMode::To));
        let closed = EventKind::Access(AccessKind::Close(AccessMode::Write));
        let written = EventKind::Modify(ModifyKind::Data(DataChange::Any));
        assert_eq!(quiet_for(&renamed), QUIET_COMPLETE);
        assert_eq!(quiet_for(&closed), QUIET_COMPLETE);
        assert_eq!(quiet_for(&written), QUIET_OPEN_FOR_WRITING);
        assert_eq!(quiet_for(&EventKind::Create(CreateKind::File)), QUIET);
    }

    #[tokio::test]
    async fn debounce_merges_a_burst_and_waits_as_long_as_the_last_event_asks() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let event = |consumers: Vec<usize>, quiet_for| FileEvent {
            consumers,
            at: Instant::now(),
            quiet_for,
        };
        // Written, written, then closed: read soon after the close.
        let start = Instant::now();
        tx.send(event(vec![1], QUIET_OPEN_FOR_WRITING)).unwrap();
        tx.send(event(vec![0, 1], QUIET_COMPLETE)).unwrap();
        let first = event(vec![2], QUIET_OPEN_FOR_WRITING);
        let first_at = first.at;
        let (consumers, at) = debounce(first, &mut rx, &stop).await.unwrap();
        assert_eq!(consumers, vec![0, 1, 2]);
        assert_eq!(at, first_at);
        assert!(start.elapsed() < QUIET, "{:?}", start.elapsed());

        // Written and not closed: waits the long quiet period.
        let start = Instant::now();
        debounce(event(vec![0], QUIET_OPEN_FOR_WRITING), &mut rx, &stop)
            .await
            .unwrap();
        assert!(start.elapsed() >= QUIET_OPEN_FOR_WRITING);

        stop.cancel();
        assert!(
            debounce(event(vec![0], QUIET), &mut rx, &stop)
                .await
                .is_none()
        );
    }
}
