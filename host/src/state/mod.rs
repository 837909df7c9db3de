//! Plugin state and idempotent consumers (docs/state.md): the store a
//! consumer's key-value namespace, done records and claims live in.
//!
//! - this file: the vocabulary ([`Entry`], [`Commit`], [`Claim`] ...), the
//!   [`Backend`] trait both stores implement, and [`Store`], the one the
//!   host opened.
//! - [`call`]: pure. One call's view of the state: committed reads plus its
//!   own writes, the limits, and what it leaves to commit.
//! - [`embedded`]: the default store, a redb file beside the config.
//! - [`redis`]: the shared store, for several hosts (connected on first
//!   use, and again after a failure).
//! - [`consumer`]: what the delivery path asks of the store, in its order
//!   (done or claimed before the call, reserve before publishing, commit
//!   before the ack).

pub mod call;
pub mod consumer;
pub mod embedded;
pub mod redis;

use std::time::Duration;

/// A key's committed value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub value: Vec<u8>,
    /// Unique within its namespace and never reused (a counter of the
    /// namespace's): a key deleted and written again has a new version.
    pub version: u64,
    /// When it expires (epoch ms); an expired entry reads as absent.
    pub expires_at_ms: Option<u64>,
}

impl Entry {
    /// Whether the entry is still there at `now_ms`.
    pub fn live_at(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_none_or(|at| at > now_ms)
    }
}

/// The version a check expects of a key that must not exist.
pub const ABSENT: u64 = 0;

/// One key's change, as committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    Put {
        value: Vec<u8>,
        expires_at_ms: Option<u64>,
    },
    Delete,
}

/// A write to one key, and the version the key must still have for it to
/// apply (from `increment` or `set-if-version`; [`ABSENT`] when the call saw
/// no key), or none for a last-writer-wins `set` or `delete`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyWrite {
    pub key: Vec<u8>,
    pub write: Write,
    pub expect: Option<u64>,
}

/// A namespace's limits, checked at commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub max_keys: u64,
    /// Keys plus values.
    pub max_bytes: u64,
}

/// The refusal of a commit past `max_keys` (both stores say it alike).
pub fn over_keys(namespace: &str, keys: impl std::fmt::Display, max: u64) -> String {
    format!("namespace \"{namespace}\" would hold {keys} keys, over its quota of {max} (max_keys)")
}

/// The refusal of a commit past `max_bytes`.
pub fn over_bytes(namespace: &str, bytes: impl std::fmt::Display, max: u64) -> String {
    format!(
        "namespace \"{namespace}\" would hold {bytes} bytes, over its quota of {max} (max_bytes)"
    )
}

/// A namespace's usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub keys: u64,
    pub bytes: u64,
}

/// Which input a done record or claim is of: a consumer's queue and the
/// input's envelope id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InputKey {
    pub queue: String,
    pub id: String,
}

/// Everything one accepted input commits, at once: its writes (when its
/// consumer has a namespace), its done record, the release of its claim
/// and of its reservations.
#[derive(Debug, Clone)]
pub struct Commit {
    /// The namespace the writes go to; `None` for a consumer that only
    /// keeps done records (`idempotent` without `state`).
    pub namespace: Option<String>,
    pub quota: Quota,
    pub writes: Vec<KeyWrite>,
    /// The input now done, and for how long the record is kept.
    pub done: InputKey,
    pub retention: Duration,
    /// The claim to release: its holder's name (`idempotent` consumers).
    pub claim_holder: Option<String>,
    /// The reservation of the checked keys to release (see
    /// [`Backend::reserve`]).
    pub reservation: Option<String>,
    /// The host's clock, for expiry (a Redis store uses its own for
    /// leases and retention).
    pub now_ms: u64,
}

/// How a commit ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Committed {
    /// Writes applied, done record written, claim and reservation released.
    Applied,
    /// The input was already done (another run of it committed first):
    /// nothing applied, the input is a duplicate.
    AlreadyDone,
    /// A checked key's version changed (or another input reserves it):
    /// nothing applied.
    Conflict { key: Vec<u8> },
    /// The writes would take the namespace past a quota: nothing applied.
    OverQuota { reason: String },
}

/// How a reservation of checked keys ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserved {
    /// Every key still has the version the call read, and is held for this
    /// reservation until its commit (or the lease ends).
    Held,
    /// A key changed, or another reservation holds it: nothing is held.
    Conflict { key: Vec<u8> },
}

/// The answer to a claim of an input (`idempotent` consumers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This host holds it now (a new claim, or its own again).
    Taken,
    /// It is done: a duplicate.
    Done,
    /// Another host holds a live claim on it.
    HeldElsewhere {
        holder: String,
        expires_in: Duration,
    },
}

/// A store that cannot be used now (unreachable, an I/O error): the input
/// waits, it has not failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the state store ({store}) {reason}")]
pub struct StoreError {
    /// Which store: its file, or its Redis address without the password.
    pub store: String,
    pub reason: String,
}

/// What a state store does. Both stores implement it; the conformance
/// tests (tests/tests/state_store.rs) run the same cases on each.
#[allow(async_fn_in_trait)]
pub trait Backend {
    /// The store's name for logs and errors (never a password).
    fn describe(&self) -> String;

    /// The committed entry of `key` in `namespace`, live at `now_ms`.
    async fn get(
        &self,
        namespace: &str,
        key: &[u8],
        now_ms: u64,
    ) -> Result<Option<Entry>, StoreError>;

    /// Checks that each `(key, version)` still holds (version [`ABSENT`]:
    /// no live key) and that no other reservation holds any of them, and if
    /// so holds them all for `token` until the commit that names it, or
    /// until `lease` ends.
    async fn reserve(
        &self,
        namespace: &str,
        checks: &[(Vec<u8>, u64)],
        token: &str,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Reserved, StoreError>;

    /// Releases a reservation without committing (the input was not
    /// accepted after all).
    async fn release_reservation(
        &self,
        namespace: &str,
        keys: &[Vec<u8>],
        token: &str,
    ) -> Result<(), StoreError>;

    /// Commits `commit` atomically: all of it or none of it.
    async fn commit(&self, commit: &Commit) -> Result<Committed, StoreError>;

    /// Whether the input is done (its record is within its retention).
    async fn is_done(&self, input: &InputKey, now_ms: u64) -> Result<bool, StoreError>;

    /// Claims the input for `holder` for `lease`.
    async fn claim(
        &self,
        input: &InputKey,
        holder: &str,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Claim, StoreError>;

    /// Releases `holder`'s claim (an input retried or set aside); another
    /// holder's claim is left alone.
    async fn release_claim(&self, input: &InputKey, holder: &str) -> Result<(), StoreError>;

    /// Up to `limit` live entries of `namespace` whose key starts with
    /// `prefix`, in key order.
    async fn list(
        &self,
        namespace: &str,
        prefix: &[u8],
        limit: usize,
        now_ms: u64,
    ) -> Result<Vec<(Vec<u8>, Entry)>, StoreError>;

    /// Removes `key` at once, outside any input (`acemq-host state delete`).
    /// Whether it was there.
    async fn delete_now(
        &self,
        namespace: &str,
        key: &[u8],
        now_ms: u64,
    ) -> Result<bool, StoreError>;

    /// The namespace's usage (live keys; expired ones may count until they
    /// are swept).
    async fn usage(&self, namespace: &str, now_ms: u64) -> Result<Usage, StoreError>;
}

/// Whether the store answered its last use, for `/health`: set by the
/// commits of the delivery path and by the host's probe of it every
/// [`embedded::SWEEP_EVERY`].
#[derive(Debug, Default)]
pub struct StoreHealth {
    trouble: std::sync::Mutex<Option<String>>,
}

impl StoreHealth {
    /// Notes how a use of the store ended.
    pub fn note<T>(&self, result: &Result<T, StoreError>) {
        let mut trouble = self.trouble.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(_) if trouble.is_some() => {
                tracing::info!("the state store answers again");
                *trouble = None;
            }
            Ok(_) => {}
            Err(e) => *trouble = Some(e.to_string()),
        }
    }

    /// What is wrong with the store, if its last use failed.
    pub fn trouble(&self) -> Option<String> {
        self.trouble
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Opens the store at `location`: the embedded file (for the host, refused
/// when another host holds it), or a Redis client, which connects on first
/// use and again after any failure.
pub fn open(
    location: &crate::config::state::StoreLocation,
    opener: embedded::Opener,
) -> Result<Store, StoreError> {
    use crate::config::state::StoreLocation;
    Ok(match location {
        StoreLocation::Embedded(path) => {
            Store::Embedded(embedded::EmbeddedStore::open(path, opener)?)
        }
        StoreLocation::Redis(location) => Store::Redis(Box::new(redis::RedisStore::lazy_with_tls(
            &location.url,
            &location.tls,
        )?)),
    })
}

/// The store this host opened.
pub enum Store {
    Embedded(embedded::EmbeddedStore),
    /// Boxed: a Redis client is large beside the embedded store's handle.
    Redis(Box<redis::RedisStore>),
}

/// Calls the same method on whichever store this is.
macro_rules! on_backend {
    ($self:ident, $store:ident => $call:expr) => {
        match $self {
            Store::Embedded($store) => $call,
            Store::Redis($store) => $call,
        }
    };
}

impl Backend for Store {
    fn describe(&self) -> String {
        on_backend!(self, s => s.describe())
    }

    async fn get(
        &self,
        namespace: &str,
        key: &[u8],
        now_ms: u64,
    ) -> Result<Option<Entry>, StoreError> {
        on_backend!(self, s => s.get(namespace, key, now_ms).await)
    }

    async fn reserve(
        &self,
        namespace: &str,
        checks: &[(Vec<u8>, u64)],
        token: &str,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Reserved, StoreError> {
        on_backend!(self, s => s.reserve(namespace, checks, token, lease, now_ms).await)
    }

    async fn release_reservation(
        &self,
        namespace: &str,
        keys: &[Vec<u8>],
        token: &str,
    ) -> Result<(), StoreError> {
        on_backend!(self, s => s.release_reservation(namespace, keys, token).await)
    }

    async fn commit(&self, commit: &Commit) -> Result<Committed, StoreError> {
        on_backend!(self, s => s.commit(commit).await)
    }

    async fn is_done(&self, input: &InputKey, now_ms: u64) -> Result<bool, StoreError> {
        on_backend!(self, s => s.is_done(input, now_ms).await)
    }

    async fn claim(
        &self,
        input: &InputKey,
        holder: &str,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Claim, StoreError> {
        on_backend!(self, s => s.claim(input, holder, lease, now_ms).await)
    }

    async fn release_claim(&self, input: &InputKey, holder: &str) -> Result<(), StoreError> {
        on_backend!(self, s => s.release_claim(input, holder).await)
    }

    async fn list(
        &self,
        namespace: &str,
        prefix: &[u8],
        limit: usize,
        now_ms: u64,
    ) -> Result<Vec<(Vec<u8>, Entry)>, StoreError> {
        on_backend!(self, s => s.list(namespace, prefix, limit, now_ms).await)
    }

    async fn delete_now(
        &self,
        namespace: &str,
        key: &[u8],
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        on_backend!(self, s => s.delete_now(namespace, key, now_ms).await)
    }

    async fn usage(&self, namespace: &str, now_ms: u64) -> Result<Usage, StoreError> {
        on_backend!(self, s => s.usage(namespace, now_ms).await)
    }
}

/// A consumer's namespace as its plugin's calls reach it.
pub struct NamespaceAccess {
    pub store: std::sync::Arc<Store>,
    pub namespace: String,
    pub metrics: crate::telemetry::StateMetrics,
}

impl NamespaceAccess {
    /// Counts one call of `op` by a plugin.
    pub fn count(&self, op: &str) {
        self.metrics
            .operations
            .get_or_create(&crate::telemetry::StateOpLabel {
                namespace: self.namespace.clone(),
                op: op.to_string(),
            })
            .inc();
    }
}

impl std::fmt::Debug for NamespaceAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceAccess")
            .field("store", &self.store.describe())
            .field("namespace", &self.namespace)
            .finish()
    }
}
