//! Codec plugins (the `codec-plugin` world) and composite decoding.
//!
//! A `[[codecs]]` entry names a component and the content types it claims.
//! On consume, the codecs claiming a message's content type are tried in
//! config order; the first that decodes it wins, and if all refuse, the
//! refusals are listed in one reason (contract §9: composite decoding). A
//! message whose content type no codec claims reaches the handler as is.
//! On publish, an output whose content type a codec claims is encoded the
//! same way.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use futures::future::{BoxFuture, Either, Ready, ready};
use wasmtime::component::Linker;

use super::bindings::codec_world::{CodecPlugin, CodecPluginPre};
use super::bindings::v0_3::codec_world as v0_3;
use super::engine::PluginEngine;
use super::fault::CallEvidence;
use super::pool::{CallBounds, Instantiate, Observed, Pool, Warm, new_store};
use super::{Contract, Limits, PluginError};

/// The store data of a codec instance: codecs import nothing, so only limits.
struct CodecState {
    bounds: CallBounds,
    /// WASI, for a codec that imports it; what it prints is not kept.
    wasi: super::host::wasi::LazyWasi,
}

impl wasmtime_wasi::WasiView for CodecState {
    fn ctx(&mut self) -> wasmtime_wasi::WasiCtxView<'_> {
        self.wasi.view()
    }
}

/// A codec logs nothing: a refused memory growth is all there is to report.
impl Observed for CodecState {
    fn evidence(&self) -> CallEvidence {
        CallEvidence {
            refused_memory: self.bounds.limiter.refused,
            last_error_log: None,
            guest_error: None,
        }
    }

    fn bounds(&mut self) -> &mut CallBounds {
        &mut self.bounds
    }

    fn bounds_ref(&self) -> &CallBounds {
        &self.bounds
    }
}

/// A codec, pre-linked, in the contract it was built against (0.3's codec
/// world has the same shape as 0.4's, under its own version).
enum CodecPre {
    V0_4(CodecPluginPre<CodecState>),
    V0_3(v0_3::CodecPluginPre<CodecState>),
}

/// One codec instance's exports.
enum CodecBindings {
    V0_4(CodecPlugin),
    V0_3(v0_3::CodecPlugin),
}

impl CodecPre {
    /// Checks the exports of the plugin's `codec-plugin` world.
    fn new(
        contract: Contract,
        instance_pre: wasmtime::component::InstancePre<CodecState>,
    ) -> wasmtime::Result<Self> {
        Ok(match contract {
            Contract::V0_4 => CodecPre::V0_4(CodecPluginPre::new(instance_pre)?),
            Contract::V0_3 => CodecPre::V0_3(v0_3::CodecPluginPre::new(instance_pre)?),
        })
    }
}

impl CodecBindings {
    /// Converts `body` one way or the other; `Ok(Err(why))` is the codec's
    /// refusal.
    async fn convert(
        &self,
        store: &mut wasmtime::Store<CodecState>,
        direction: Direction,
        content_type: &str,
        body: &[u8],
    ) -> wasmtime::Result<Result<(String, Vec<u8>), String>> {
        match (self, direction) {
            (CodecBindings::V0_4(b), Direction::Decode) => {
                b.acemq_plugin_codec()
                    .call_decode(store, content_type, body)
                    .await
            }
            (CodecBindings::V0_4(b), Direction::Encode) => {
                b.acemq_plugin_codec()
                    .call_encode(store, content_type, body)
                    .await
            }
            (CodecBindings::V0_3(b), Direction::Decode) => {
                b.acemq_plugin_codec()
                    .call_decode(store, content_type, body)
                    .await
            }
            (CodecBindings::V0_3(b), Direction::Encode) => {
                b.acemq_plugin_codec()
                    .call_encode(store, content_type, body)
                    .await
            }
        }
    }
}

/// What makes a codec's instances.
struct Instances {
    engine: wasmtime::Engine,
    pre: CodecPre,
    limits: Limits,
}

impl Instantiate for Instances {
    type Instance = Warm<CodecState, CodecBindings>;

    async fn instantiate(&self, deadline: Instant) -> wasmtime::Result<Self::Instance> {
        let state = CodecState {
            bounds: CallBounds::new(self.limits.max_memory_bytes),
            wasi: super::host::wasi::LazyWasi::default(),
        };
        let mut store = new_store(&self.engine, state, deadline);
        let bindings = match &self.pre {
            CodecPre::V0_4(pre) => CodecBindings::V0_4(pre.instantiate_async(&mut store).await?),
            CodecPre::V0_3(pre) => CodecBindings::V0_3(pre.instantiate_async(&mut store).await?),
        };
        Ok(Warm { store, bindings })
    }
}

/// One loaded codec component.
pub struct CodecVersion {
    pub name: String,
    pub sha256: String,
    pub size: usize,
    pub from_cache: bool,
    /// When this version finished loading (shown by the admin endpoint).
    pub loaded_at: std::time::SystemTime,
    /// Its instances; a codec call always reuses an idle one.
    instances: Pool<Instances>,
}

/// Which way a body is converted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Decode,
    Encode,
}

impl CodecVersion {
    /// Compiles, type-checks against the codec world, and warms a codec.
    pub fn load(
        engine: &PluginEngine,
        path: &Path,
        limits: Limits,
    ) -> Result<Arc<Self>, PluginError> {
        Self::from_compiled(engine, engine.compile_file(path)?, limits)
    }

    /// Type-checks and warms a codec already compiled (a hot swap compiles
    /// the bytes it read, to know their hash first).
    pub fn from_compiled(
        engine: &PluginEngine,
        compiled: super::engine::CompiledPlugin,
        limits: Limits,
    ) -> Result<Arc<Self>, PluginError> {
        let path = compiled.path.as_path();
        let mut linker: Linker<CodecState> = Linker::new(engine.engine());
        if super::host::wasi::imports_wasi(engine.engine(), &compiled.component) {
            super::host::wasi::link(&mut linker)
                .map_err(|e| PluginError::new(path, format!("cannot link WASI: {e:#}")))?;
        }
        let instance_pre = linker.instantiate_pre(&compiled.component).map_err(|e| {
            PluginError::new(path, format!("is not a codec plugin of this host: {e:#}"))
        })?;
        let pre = CodecPre::new(compiled.contract, instance_pre).map_err(|e| {
            PluginError::new(
                path,
                format!(
                    "does not export the codec world (acemq:plugin/codec@{}): {e:#}",
                    compiled.contract.version()
                ),
            )
        })?;
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        let (deadline, memory_limit) = (limits.deadline, limits.max_memory_bytes);
        let instances = Pool::new(
            Instances {
                engine: engine.engine().clone(),
                pre,
                limits,
            },
            deadline,
            memory_limit,
        );
        // Loading is blocking work (compiling), done off the async workers:
        // the one warm instantiation is driven to its end right here.
        super::pool::block_on_loading(instances.warm())
            .map_err(|e| PluginError::new(path, format!("cannot be instantiated: {e:#}")))?;
        Ok(Arc::new(Self {
            name,
            sha256: compiled.sha256,
            size: compiled.size,
            from_cache: compiled.from_cache,
            loaded_at: std::time::SystemTime::now(),
            instances,
        }))
    }

    /// Pooled instances waiting for a call.
    pub fn idle_instances(&self) -> usize {
        self.instances.idle()
    }

    /// What an instance of this version costs.
    pub fn instance_cost(&self) -> super::InstanceCost {
        self.instances.cost()
    }

    /// Converts one body, or says why not: the codec's refusal of these
    /// bytes, or its fault (a trap, the deadline, memory).
    async fn convert(
        &self,
        direction: Direction,
        content_type: &str,
        body: &[u8],
    ) -> Result<(String, Vec<u8>), NotConverted> {
        let converted = async {
            let mut lease = self.instances.lease(true).await?;
            let deadline = lease.deadline();
            let warm = lease.instance();
            // The limiter's memory of a refusal is per call.
            warm.store.data_mut().bounds.limiter.refused = None;
            // Bounded on the host's side too, like a handler call (pool.rs).
            let result = deadline
                .bound(
                    warm.bindings
                        .convert(&mut warm.store, direction, content_type, body),
                )
                .await;
            lease.finish(result)
        }
        .await;
        // Ok(Err(why)) is the codec refusing, and its instance stays pooled.
        match converted {
            Ok(result) => result.map_err(NotConverted::Refused),
            Err(fault) if fault.kind.is_the_hosts() => Err(NotConverted::HostBusy(fault.reason)),
            Err(fault) => Err(NotConverted::Faulted(fault.reason)),
        }
    }
}

/// Why one codec did not convert a body.
enum NotConverted {
    /// It read the bytes and refused them: the same bytes are refused again.
    Refused(String),
    /// It failed (trap, deadline, memory): another try may succeed.
    Faulted(String),
    /// The host had no instance slot to run it in: the host's fault.
    HostBusy(String),
}

/// What the codecs made of a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conversion {
    /// No codec claims the content type: use the body as it is.
    Unclaimed,
    /// A codec converted it.
    Converted { content_type: String, body: Vec<u8> },
    /// Every claimant refused; the reason lists each refusal.
    Refused(String),
    /// No claimant converted it, and one failed rather than refused (a trap,
    /// the deadline, memory): worth another try, unlike a refusal.
    Faulted(String),
    /// A claimant could not even be run: the host had no free instance
    /// slot for it. Not the message's fault, nor the codec's.
    HostBusy(String),
}

/// The codecs of a host, in config order, with the content types each claims.
#[derive(Default, Clone)]
pub struct CodecSet {
    entries: Vec<(Vec<String>, Arc<CodecVersion>)>,
}

/// The host's codecs as deliveries read them, each replaceable while the
/// host runs (hot swap). A delivery takes a [`snapshot`](Self::snapshot)
/// when it starts and decodes its body and encodes its outputs with it, so
/// a swap never has one delivery use two versions of a codec.
#[derive(Default)]
pub struct Codecs {
    current: arc_swap::ArcSwap<CodecSet>,
}

impl Codecs {
    pub fn new(set: CodecSet) -> Self {
        Self {
            current: arc_swap::ArcSwap::from_pointee(set),
        }
    }

    /// The codecs as they are now, for one delivery.
    pub fn snapshot(&self) -> Arc<CodecSet> {
        self.current.load_full()
    }

    /// The codec at `index` (config order), now.
    pub fn get(&self, index: usize) -> Option<Arc<CodecVersion>> {
        self.current
            .load()
            .entries
            .get(index)
            .map(|(_, codec)| codec.clone())
    }

    /// Puts `codec` in the place of the one at `index`, for every delivery
    /// that starts from now on; returns the one it replaced, retired (its
    /// idle instances dropped; the deliveries still using it keep theirs
    /// until they end). `None` for an index out of range.
    pub fn replace(&self, index: usize, codec: Arc<CodecVersion>) -> Option<Arc<CodecVersion>> {
        let mut replaced = None;
        self.current.rcu(|set| {
            let mut next = CodecSet::clone(set);
            replaced = next
                .entries
                .get_mut(index)
                .map(|(_, slot)| std::mem::replace(slot, codec.clone()));
            next
        });
        if let Some(old) = &replaced {
            old.instances.retire();
        }
        replaced
    }
}

impl CodecSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a codec claiming `content_types` (matched without parameters,
    /// ignoring case).
    pub fn add(&mut self, content_types: &[String], codec: Arc<CodecVersion>) {
        let claimed = content_types.iter().map(|c| media_type(c)).collect();
        self.entries.push((claimed, codec));
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Decodes a delivery's body for the handler.
    pub fn decode<'a>(&'a self, content_type: Option<&'a str>, body: &'a [u8]) -> Converting<'a> {
        self.convert(Direction::Decode, content_type, body)
    }

    /// Encodes a handler's output for the wire.
    pub fn encode<'a>(&'a self, content_type: Option<&'a str>, body: &'a [u8]) -> Converting<'a> {
        self.convert(Direction::Encode, content_type, body)
    }

    /// Every delivery and output passes here, and most are claimed by no
    /// codec: those get a future that is ready at once and a few dozen
    /// bytes long. The future of a codec's call is kilobytes (wasmtime's
    /// call, the deadline's timer), and each `.await` moves its callee's
    /// future into the caller's: inline, it made every delivery's future
    /// kilobytes longer and cost each one more copying (dispatch benchmark:
    /// docs/benchmarks.md). A claimed body, which pays for a wasm call
    /// anyway, pays for a box instead.
    fn convert<'a>(
        &'a self,
        direction: Direction,
        content_type: Option<&'a str>,
        body: &'a [u8],
    ) -> Converting<'a> {
        // A host without codecs (the common case) answers before the
        // content type is even normalised.
        let (false, Some(content_type)) = (self.entries.is_empty(), content_type) else {
            return Either::Left(ready(Conversion::Unclaimed));
        };
        let wanted = media_type(content_type);
        let claimants: Vec<&'a Arc<CodecVersion>> = self
            .entries
            .iter()
            .filter(|(claimed, _)| claimed.contains(&wanted))
            .map(|(_, codec)| codec)
            .collect();
        if claimants.is_empty() {
            return Either::Left(ready(Conversion::Unclaimed));
        }
        Either::Right(Box::pin(by_claimants(
            claimants,
            direction,
            content_type,
            body,
        )))
    }
}

/// What [`CodecSet::decode`] and [`CodecSet::encode`] return: ready at once
/// when no codec claims the content type, else the claimants' calls, boxed.
pub type Converting<'a> = Either<Ready<Conversion>, BoxFuture<'a, Conversion>>;

/// Asks each codec claiming the content type in turn, until one converts
/// the body.
async fn by_claimants(
    claimants: Vec<&Arc<CodecVersion>>,
    direction: Direction,
    content_type: &str,
    body: &[u8],
) -> Conversion {
    let mut reasons = Vec::new();
    let mut faulted = false;
    for codec in claimants {
        match codec.convert(direction, content_type, body).await {
            Ok((content_type, body)) => return Conversion::Converted { content_type, body },
            Err(NotConverted::Refused(why)) => reasons.push(format!("{}: {why}", codec.name)),
            Err(NotConverted::Faulted(why)) => {
                faulted = true;
                reasons.push(format!("{} failed: {why}", codec.name));
            }
            // The next claimant would find the pool as full.
            Err(NotConverted::HostBusy(why)) => {
                return Conversion::HostBusy(format!("{}: {why}", codec.name));
            }
        }
    }
    if faulted {
        Conversion::Faulted(reasons.join("; "))
    } else {
        Conversion::Refused(reasons.join("; "))
    }
}

/// `Application/MsgPack; charset=x` -> `application/msgpack`.
fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use futures::executor::block_on;

    use super::*;

    #[test]
    fn media_types_ignore_parameters_and_case() {
        assert_eq!(
            media_type("Application/MsgPack; charset=binary"),
            "application/msgpack"
        );
        assert_eq!(media_type("text/plain"), "text/plain");
    }

    #[test]
    fn nothing_is_claimed_without_codecs_or_content_type() {
        let set = CodecSet::new();
        assert_eq!(
            block_on(set.decode(Some("application/msgpack"), b"x")),
            Conversion::Unclaimed
        );
        assert_eq!(block_on(set.decode(None, b"x")), Conversion::Unclaimed);
    }
}
