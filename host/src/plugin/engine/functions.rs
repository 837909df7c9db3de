//! The compiled-function cache: the machine code of each function a plugin
//! compiled to, kept in the compiled-plugin cache folder so that the next
//! plugin sharing that function does not compile it again.
//!
//! Why: a new version of a Python or JavaScript plugin is a new 12 to 19 MB
//! component, so the compiled-plugin cache (keyed by the whole file) misses
//! and a hot swap used to compile for seconds. Yet almost all of it is the
//! interpreter, whose functions are byte for byte those of every other
//! version and every other plugin built with the same toolchain. Cranelift
//! can key each function's compilation by its own content (wasmtime's
//! incremental compilation): with this cache a changed Python router
//! compiles about 2.5 times faster (docs/plugins/python-and-javascript.md).
//!
//! Each value is machine code the host will run, so it is held to the same
//! proof as a whole cached plugin ([`super::cache`]): sealed with an HMAC
//! under a key derived from the cache key, bound to the engine's fingerprint
//! and to the digest of cranelift's key for the function. A value whose MAC
//! does not open is a miss: the function is compiled again.
//!
//! The values live in one redb file, `functions.redb`, opened only while a
//! compilation runs (so an idle host holds no part of it in memory) and
//! locked by redb against other processes: a second process compiling at the
//! same time compiles in full instead of waiting. What a compilation adds is
//! written in one transaction when it ends. The file is started afresh when
//! it has grown past [`MAX_FILE_BYTES`].

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, RwLock};

use redb::{Database, ReadableDatabase, TableDefinition};
use sha2::{Digest, Sha256};

use super::cache::{CacheKey, EntryId, seal, unseal};

/// The file's name in the cache folder.
pub const FILE_NAME: &str = "functions.redb";
/// Past this size the file is removed and started afresh (an interpreter's
/// functions take about 30 MB; a file this large mostly holds toolchain
/// versions nobody builds with any more).
pub const MAX_FILE_BYTES: u64 = 512 << 20;
/// redb's page cache while the file is open.
const PAGE_CACHE_BYTES: usize = 16 << 20;

const FUNCTIONS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("functions");

/// Where the values are kept and how they are sealed, once the
/// compiled-plugin cache is open.
struct Place {
    file: PathBuf,
    key: CacheKey,
    engine: [u8; 32],
}

/// Counts of one process's lookups, for tests and log lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Functions taken from the file.
    pub reused: u64,
    /// Functions compiled (not in the file, or the file not open).
    pub compiled: u64,
    /// Values whose MAC did not open: compiled again.
    pub untrusted: u64,
}

/// wasmtime's [`wasmtime::CacheStore`] over `functions.redb`. Inert (every
/// lookup a miss, nothing kept) until [`FunctionCache::arm`] is called and
/// outside a [`Compiling`] session.
#[derive(Default)]
pub struct FunctionCache {
    place: OnceLock<Place>,
    /// The open file, during compilations.
    open: RwLock<Option<Database>>,
    /// Compilations in progress in this process: the file is open while
    /// there is at least one.
    sessions: Mutex<usize>,
    /// Sealed values compiled during the open sessions, written when the
    /// last one ends: (digest of cranelift's key, sealed value).
    fresh: Mutex<Vec<([u8; 32], Vec<u8>)>>,
    reused: AtomicU64,
    compiled: AtomicU64,
    untrusted: AtomicU64,
}

impl std::fmt::Debug for FunctionCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FunctionCache")
            .field("counts", &self.counts())
            .finish_non_exhaustive()
    }
}

/// A compilation in progress; the file stays open while one lives.
pub struct Compiling<'a> {
    cache: &'a FunctionCache,
}

impl Drop for Compiling<'_> {
    fn drop(&mut self) {
        self.cache.end_session();
    }
}

impl FunctionCache {
    /// From now on, compilations keep their functions in `folder`'s
    /// [`FILE_NAME`], sealed with `key` for the engine of fingerprint
    /// `engine`.
    /// An engine has one cache folder: a second call changes nothing.
    pub fn arm(&self, folder: &std::path::Path, key: CacheKey, engine: [u8; 32]) {
        let _ = self.place.set(Place {
            file: folder.join(FILE_NAME),
            key,
            engine,
        });
    }

    /// Begins a compilation: opens the file if this is the only one.
    pub fn compiling(&self) -> Compiling<'_> {
        let mut sessions = lock(&self.sessions);
        if *sessions == 0 {
            *self.open.write().unwrap_or_else(|e| e.into_inner()) = self.open_file();
        }
        *sessions += 1;
        Compiling { cache: self }
    }

    /// What this process's compilations found so far.
    pub fn counts(&self) -> Counts {
        Counts {
            reused: self.reused.load(Ordering::Relaxed),
            compiled: self.compiled.load(Ordering::Relaxed),
            untrusted: self.untrusted.load(Ordering::Relaxed),
        }
    }

    fn open_file(&self) -> Option<Database> {
        let file = &self.place.get()?.file;
        if std::fs::metadata(file).is_ok_and(|m| m.len() > MAX_FILE_BYTES) {
            tracing::info!(file = %file.display(), limit_mb = MAX_FILE_BYTES >> 20, "the compiled-function cache has grown past its limit; starting it afresh");
            let _ = std::fs::remove_file(file);
        }
        match Database::builder()
            .set_cache_size(PAGE_CACHE_BYTES)
            .create(file)
        {
            Ok(db) => Some(db),
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                tracing::debug!(file = %file.display(), "the compiled-function cache is in use by another process; compiling every function");
                None
            }
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "cannot open the compiled-function cache; compiling every function (delete the file to start it afresh)");
                None
            }
        }
    }

    fn end_session(&self) {
        let mut sessions = lock(&self.sessions);
        *sessions -= 1;
        if *sessions > 0 {
            return;
        }
        let fresh = std::mem::take(&mut *lock(&self.fresh));
        let db = self.open.write().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(db) = db
            && !fresh.is_empty()
            && let Err(e) = write_all(&db, &fresh)
        {
            tracing::warn!(error = %e, "cannot write to the compiled-function cache; the next compilation compiles these functions again");
        }
    }

    fn id<'p>(place: &'p Place, digest: &'p [u8; 32]) -> EntryId<'p> {
        EntryId {
            engine: &place.engine,
            source: digest,
        }
    }
}

fn write_all(db: &Database, fresh: &[([u8; 32], Vec<u8>)]) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut table = txn.open_table(FUNCTIONS)?;
        for (digest, sealed) in fresh {
            table.insert(digest.as_slice(), sealed.as_slice())?;
        }
    }
    txn.commit()?;
    Ok(())
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Cranelift's keys are long; values are filed under their digest.
fn digest(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

impl wasmtime::CacheStore for FunctionCache {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        let found = self.lookup(key);
        let counter = if found.is_some() {
            &self.reused
        } else {
            &self.compiled
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found.map(Cow::Owned)
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        if self
            .open
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
        {
            return false;
        }
        let Some(place) = self.place.get() else {
            return false;
        };
        let digest = digest(key);
        let sealed = seal(&place.key, Self::id(place, &digest), &value);
        lock(&self.fresh).push((digest, sealed));
        true
    }
}

impl FunctionCache {
    fn lookup(&self, key: &[u8]) -> Option<Vec<u8>> {
        let open = self.open.read().unwrap_or_else(|e| e.into_inner());
        let db = open.as_ref()?;
        let digest = digest(key);
        let txn = db.begin_read().ok()?;
        // No table yet: nothing was ever written.
        let table = txn.open_table(FUNCTIONS).ok()?;
        let sealed = table.get(digest.as_slice()).ok()??;
        let place = self.place.get()?;
        match unseal(&place.key, Self::id(place, &digest), sealed.value()) {
            Ok(value) => Some(value.to_vec()),
            Err(why) => {
                self.untrusted.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    "a compiled-function cache value is not trusted ({why}); compiling the function again"
                );
                None
            }
        }
    }
}
