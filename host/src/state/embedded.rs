//! The embedded store: one redb file, durable on every commit (an fsync
//! before the commit returns), so a kill -9 loses no committed write.
//!
//! Writes of concurrent inputs are grouped: a committer thread takes every
//! write waiting and applies them in one transaction, one fsync for the
//! group, each checked and applied on its own (a refused commit leaves the
//! others alone). Reads open a read transaction on the caller's thread:
//! redb reads are lock-free snapshots of memory-mapped pages.
//!
//! The file is opened in redb's multi-writer mode, so `acemq-host state`
//! can read and edit it while the host runs; a second *host* on the same
//! file is refused by an exclusive lock on `{file}.lock`, since two hosts
//! would each run the consumer's inputs without the other's claims.
//!
//! Tables (keys and values are byte strings; `ns`/`queue` are prefixed by
//! their length, a big-endian u16, so that no name is a prefix of another's):
//!
//! | table | key | value |
//! |---|---|---|
//! | `entries` | ns, key | version (u64), expiry (u64 ms, 0 none), value |
//! | `expiries` | expiry (u64 ms), ns, key | nothing: what the sweeper removes |
//! | `usage` | ns | keys (u64), bytes (u64) |
//! | `meta` | `version` | the last version given (u64) |
//! | `locks` | ns, key | expiry (u64 ms), token |
//! | `done` | queue, id | expiry (u64 ms) |
//! | `done_expiries` | expiry, queue, id | nothing |
//! | `claims` | queue, id | expiry (u64 ms), holder |

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use super::{
    ABSENT, Backend, Claim, Commit, Committed, Entry, InputKey, Quota, Reserved, StoreError, Usage,
    Write,
};

type Bytes<'a> = &'a [u8];

const ENTRIES: TableDefinition<Bytes, Bytes> = TableDefinition::new("entries");
const EXPIRIES: TableDefinition<Bytes, ()> = TableDefinition::new("expiries");
const USAGE: TableDefinition<Bytes, (u64, u64)> = TableDefinition::new("usage");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const LOCKS: TableDefinition<Bytes, Bytes> = TableDefinition::new("locks");
const DONE: TableDefinition<Bytes, u64> = TableDefinition::new("done");
const DONE_EXPIRIES: TableDefinition<Bytes, ()> = TableDefinition::new("done_expiries");
const CLAIMS: TableDefinition<Bytes, Bytes> = TableDefinition::new("claims");

/// How often expired keys and done records are removed.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// Most writes grouped in one transaction.
const GROUP_AT_MOST: usize = 256;

/// The embedded store.
pub struct EmbeddedStore {
    path: PathBuf,
    db: std::sync::Arc<redb::Database>,
    writes: mpsc::Sender<Job>,
    /// Held for as long as the store is open (host use only).
    _host_lock: Option<File>,
}

/// Who opens the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opener {
    /// The host: one at a time per file.
    Host,
    /// `acemq-host state`, beside a running host or not.
    Tool,
}

/// A write for the committer thread, and where its answer goes.
enum Job {
    Commit(Box<Commit>, oneshot::Sender<Result<Committed, StoreError>>),
    Reserve {
        namespace: String,
        checks: Vec<(Vec<u8>, u64)>,
        token: String,
        expires_at_ms: u64,
        now_ms: u64,
        answer: oneshot::Sender<Result<Reserved, StoreError>>,
    },
    Release {
        namespace: String,
        keys: Vec<Vec<u8>>,
        token: String,
        answer: oneshot::Sender<Result<(), StoreError>>,
    },
    Claim {
        input: InputKey,
        holder: String,
        lease: Duration,
        now_ms: u64,
        answer: oneshot::Sender<Result<Claim, StoreError>>,
    },
    ReleaseClaim {
        input: InputKey,
        holder: String,
        answer: oneshot::Sender<Result<(), StoreError>>,
    },
    DeleteNow {
        namespace: String,
        key: Vec<u8>,
        now_ms: u64,
        answer: oneshot::Sender<Result<bool, StoreError>>,
    },
    Sweep {
        now_ms: u64,
    },
    /// A namespace's usage, after a sweep (so expired keys do not count).
    Usage {
        namespace: String,
        now_ms: u64,
        answer: oneshot::Sender<Result<Usage, StoreError>>,
    },
}

impl EmbeddedStore {
    /// Opens (creating when missing) the store at `path`.
    pub fn open(path: &Path, opener: Opener) -> Result<Self, StoreError> {
        let failed = |reason: String| StoreError {
            store: path.display().to_string(),
            reason,
        };
        let host_lock = match opener {
            Opener::Host => Some(lock_for_host(path).map_err(failed)?),
            Opener::Tool => None,
        };
        let db = redb::Database::builder()
            .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
            .create(path)
            .map_err(|e| failed(format!("cannot be opened: {e}")))?;
        let db = std::sync::Arc::new(db);
        // Every table exists before the first read.
        let txn = db.begin_write().map_err(|e| failed(e.to_string()))?;
        {
            let opened = (|| -> Result<(), redb::TableError> {
                txn.open_table(ENTRIES)?;
                txn.open_table(EXPIRIES)?;
                txn.open_table(USAGE)?;
                txn.open_table(META)?;
                txn.open_table(LOCKS)?;
                txn.open_table(DONE)?;
                txn.open_table(DONE_EXPIRIES)?;
                txn.open_table(CLAIMS)?;
                Ok(())
            })();
            opened.map_err(|e| failed(format!("is not a state store: {e}")))?;
        }
        txn.commit().map_err(|e| failed(e.to_string()))?;
        let (writes, jobs) = mpsc::channel();
        let committer_db = db.clone();
        let name = path.display().to_string();
        std::thread::Builder::new()
            .name("state-committer".into())
            .spawn(move || run_committer(&committer_db, &name, &jobs))
            .map_err(|e| failed(format!("cannot start its committer: {e}")))?;
        Ok(Self {
            path: path.to_path_buf(),
            db,
            writes,
            _host_lock: host_lock,
        })
    }

    /// Removes expired keys, done records, claims and reservations (the
    /// host calls it every [`SWEEP_EVERY`]).
    pub fn sweep(&self, now_ms: u64) {
        let _ = self.writes.send(Job::Sweep { now_ms });
    }

    fn error(&self, reason: impl std::fmt::Display) -> StoreError {
        StoreError {
            store: self.path.display().to_string(),
            reason: reason.to_string(),
        }
    }

    async fn ask<T>(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Job,
    ) -> Result<T, StoreError> {
        let (answer, answered) = oneshot::channel();
        self.writes
            .send(job(answer))
            .map_err(|_| self.error("has stopped committing (its committer ended)"))?;
        answered
            .await
            .map_err(|_| self.error("has stopped committing (its committer ended)"))?
    }

    fn read<T>(
        &self,
        read: impl FnOnce(&redb::ReadTransaction) -> Result<T, redb::Error>,
    ) -> Result<T, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.error(e))?;
        read(&txn).map_err(|e| self.error(e))
    }
}

/// The exclusive lock a host holds on `{path}.lock`.
fn lock_for_host(path: &Path) -> Result<File, String> {
    use std::os::fd::AsRawFd;
    let lock_path = PathBuf::from(format!("{}.lock", path.display()));
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("cannot open its lock file {}: {e}", lock_path.display()))?;
    // SAFETY: flock on a file descriptor this function owns.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if locked != 0 {
        return Err(format!(
            "is in use by another host (its lock {} is held): one host per embedded store; \
             use [state] url = \"redis://...\" for several",
            lock_path.display()
        ));
    }
    Ok(file)
}

impl Backend for EmbeddedStore {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    async fn get(
        &self,
        namespace: &str,
        key: &[u8],
        now_ms: u64,
    ) -> Result<Option<Entry>, StoreError> {
        let id = named(namespace, key);
        self.read(|txn| {
            let table = txn.open_table(ENTRIES)?;
            Ok(table
                .get(id.as_slice())?
                .map(|v| decode_entry(v.value()))
                .filter(|e| e.live_at(now_ms)))
        })
    }

    async fn reserve(
        &self,
        namespace: &str,
        checks: &[(Vec<u8>, u64)],
        token: &str,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Reserved, StoreError> {
        let (namespace, checks, token) = (namespace.to_string(), checks.to_vec(), token.into());
        let expires_at_ms = now_ms.saturating_add(lease.as_millis() as u64);
        self.ask(|answer| Job::Reserve {
            namespace,
            checks,
            token,
            expires_at_ms,
            now_ms,
            answer,
        })
        .await
    }

    async fn release_reservation(
        &self,
        namespace: &str,
        keys: &[Vec<u8>],
        token: &str,
    ) -> Result<(), StoreError> {
        let (namespace, keys, token) = (namespace.to_string(), keys.to_vec(), token.to_string());
        self.ask(|answer| Job::Release {
            namespace,
            keys,
            token,
            answer,
        })
        .await
    }

    async fn commit(&self, commit: &Commit) -> Result<Committed, StoreError> {
        let commit = Box::new(commit.clone());
        self.ask(|answer| Job::Commit(commit, answer)).await
    }

    async fn is_done(&self, input: &InputKey, now_ms: u64) -> Result<bool, StoreError> {
        let id = named(&input.queue, input.id.as_bytes());
        self.read(|txn| {
            let table = txn.open_table(DONE)?;
            Ok(table
                .get(id.as_slice())?
                .is_some_and(|until| until.value() > now_ms))
        })
    }

    async fn claim(
        &self,
        input: &InputKey,
        holder: &str,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Claim, StoreError> {
        let (input, holder) = (input.clone(), holder.to_string());
        self.ask(|answer| Job::Claim {
            input,
            holder,
            lease,
            now_ms,
            answer,
        })
        .await
    }

    async fn release_claim(&self, input: &InputKey, holder: &str) -> Result<(), StoreError> {
        let (input, holder) = (input.clone(), holder.to_string());
        self.ask(|answer| Job::ReleaseClaim {
            input,
            holder,
            answer,
        })
        .await
    }

    async fn list(
        &self,
        namespace: &str,
        prefix: &[u8],
        limit: usize,
        now_ms: u64,
    ) -> Result<Vec<(Vec<u8>, Entry)>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let start = named(namespace, prefix);
        let name_len = start.len() - prefix.len();
        self.read(|txn| {
            let table = txn.open_table(ENTRIES)?;
            let mut found = Vec::new();
            for row in table.range(start.as_slice()..)? {
                let (id, value) = row?;
                let id = id.value();
                if !id.starts_with(&start) {
                    break;
                }
                let entry = decode_entry(value.value());
                if entry.live_at(now_ms) {
                    found.push((id[name_len..].to_vec(), entry));
                    if found.len() >= limit {
                        break;
                    }
                }
            }
            Ok(found)
        })
    }

    async fn delete_now(
        &self,
        namespace: &str,
        key: &[u8],
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let (namespace, key) = (namespace.to_string(), key.to_vec());
        self.ask(|answer| Job::DeleteNow {
            namespace,
            key,
            now_ms,
            answer,
        })
        .await
    }

    async fn usage(&self, namespace: &str, now_ms: u64) -> Result<Usage, StoreError> {
        let namespace = namespace.to_string();
        self.ask(|answer| Job::Usage {
            namespace,
            now_ms,
            answer,
        })
        .await
    }
}

/// The committer: takes what waits, applies it in one transaction, commits
/// (durably), then answers each. Ends when the store is dropped.
fn run_committer(db: &redb::Database, name: &str, jobs: &mpsc::Receiver<Job>) {
    while let Ok(first) = jobs.recv() {
        let mut group = vec![first];
        while group.len() < GROUP_AT_MOST {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        let failed = |e: &dyn std::fmt::Display| StoreError {
            store: name.to_string(),
            reason: format!("could not commit: {e}"),
        };
        let result = (|| -> Result<Vec<Answer>, redb::Error> {
            let txn = db.begin_write()?;
            let answers = {
                let mut tables = Tables::open(&txn)?;
                group
                    .iter()
                    .map(|job| tables.apply(job))
                    .collect::<Result<Vec<_>, _>>()?
            };
            txn.commit()?;
            Ok(answers)
        })();
        match result {
            Ok(answers) => {
                for (job, answer) in group.into_iter().zip(answers) {
                    job.answer(Ok(answer));
                }
            }
            Err(e) => {
                tracing::error!(store = name, error = %e, "the state store could not commit a group of writes; none of them is applied");
                for job in group {
                    job.answer(Err(failed(&e)));
                }
            }
        }
    }
}

/// What one job's application answers, before the group is committed.
enum Answer {
    Committed(Committed),
    Reserved(Reserved),
    Claimed(Claim),
    Deleted(bool),
    Used(Usage),
    Nothing,
}

impl Job {
    fn answer(self, answer: Result<Answer, StoreError>) {
        match self {
            Job::Commit(_, to) => {
                let _ = to.send(answer.map(|a| match a {
                    Answer::Committed(c) => c,
                    _ => unreachable!("a commit answers Committed"),
                }));
            }
            Job::Reserve { answer: to, .. } => {
                let _ = to.send(answer.map(|a| match a {
                    Answer::Reserved(r) => r,
                    _ => unreachable!("a reservation answers Reserved"),
                }));
            }
            Job::Claim { answer: to, .. } => {
                let _ = to.send(answer.map(|a| match a {
                    Answer::Claimed(c) => c,
                    _ => unreachable!("a claim answers Claimed"),
                }));
            }
            Job::DeleteNow { answer: to, .. } => {
                let _ = to.send(answer.map(|a| match a {
                    Answer::Deleted(d) => d,
                    _ => unreachable!("a delete answers Deleted"),
                }));
            }
            Job::Release { answer: to, .. } | Job::ReleaseClaim { answer: to, .. } => {
                let _ = to.send(answer.map(|_| ()));
            }
            Job::Usage { answer: to, .. } => {
                let _ = to.send(answer.map(|a| match a {
                    Answer::Used(u) => u,
                    _ => unreachable!("a usage answers Used"),
                }));
            }
            Job::Sweep { .. } => {}
        }
    }
}

/// The tables of one write transaction.
struct Tables<'t> {
    entries: redb::Table<'t, Bytes<'static>, Bytes<'static>>,
    expiries: redb::Table<'t, Bytes<'static>, ()>,
    usage: redb::Table<'t, Bytes<'static>, (u64, u64)>,
    meta: redb::Table<'t, &'static str, u64>,
    locks: redb::Table<'t, Bytes<'static>, Bytes<'static>>,
    done: redb::Table<'t, Bytes<'static>, u64>,
    done_expiries: redb::Table<'t, Bytes<'static>, ()>,
    claims: redb::Table<'t, Bytes<'static>, Bytes<'static>>,
}

impl<'t> Tables<'t> {
    fn open(txn: &'t redb::WriteTransaction) -> Result<Self, redb::Error> {
        Ok(Self {
            entries: txn.open_table(ENTRIES)?,
            expiries: txn.open_table(EXPIRIES)?,
            usage: txn.open_table(USAGE)?,
            meta: txn.open_table(META)?,
            locks: txn.open_table(LOCKS)?,
            done: txn.open_table(DONE)?,
            done_expiries: txn.open_table(DONE_EXPIRIES)?,
            claims: txn.open_table(CLAIMS)?,
        })
    }

    fn apply(&mut self, job: &Job) -> Result<Answer, redb::Error> {
        Ok(match job {
            Job::Commit(commit, _) => Answer::Committed(self.commit(commit)?),
            Job::Reserve {
                namespace,
                checks,
                token,
                expires_at_ms,
                now_ms,
                ..
            } => {
                Answer::Reserved(self.reserve(namespace, checks, token, *expires_at_ms, *now_ms)?)
            }
            Job::Release {
                namespace,
                keys,
                token,
                ..
            } => {
                self.release(namespace, keys, token)?;
                Answer::Nothing
            }
            Job::Claim {
                input,
                holder,
                lease,
                now_ms,
                ..
            } => Answer::Claimed(self.claim(input, holder, *lease, *now_ms)?),
            Job::ReleaseClaim { input, holder, .. } => {
                self.release_claim(input, holder)?;
                Answer::Nothing
            }
            Job::DeleteNow {
                namespace,
                key,
                now_ms,
                ..
            } => Answer::Deleted(self.delete_now(namespace, key, *now_ms)?),
            Job::Sweep { now_ms } => {
                self.sweep(*now_ms)?;
                Answer::Nothing
            }
            Job::Usage {
                namespace, now_ms, ..
            } => {
                self.sweep(*now_ms)?;
                Answer::Used(self.usage_of(namespace)?)
            }
        })
    }

    fn entry(&self, id: &[u8]) -> Result<Option<Entry>, redb::Error> {
        Ok(self.entries.get(id)?.map(|v| decode_entry(v.value())))
    }

    /// Another token's live reservation of `id`, if any.
    fn locked_by_other(
        &self,
        id: &[u8],
        token: Option<&str>,
        now_ms: u64,
    ) -> Result<bool, redb::Error> {
        Ok(match self.locks.get(id)? {
            None => false,
            Some(lock) => {
                let (until, holder) = split_expiry(lock.value());
                until > now_ms && Some(holder) != token.map(str::as_bytes)
            }
        })
    }

    fn commit(&mut self, commit: &Commit) -> Result<Committed, redb::Error> {
        let now = commit.now_ms;
        let done_id = named(&commit.done.queue, commit.done.id.as_bytes());
        if self
            .done
            .get(done_id.as_slice())?
            .is_some_and(|until| until.value() > now)
        {
            return Ok(Committed::AlreadyDone);
        }
        if let Some(namespace) = &commit.namespace {
            // Checks first: a refused commit changes nothing.
            let (mut keys, mut bytes) = match self.check(namespace, commit)? {
                Ok(deltas) => deltas,
                Err(refused) => return Ok(refused),
            };
            let quota = commit.quota;
            if over_quota(namespace, self.usage_of(namespace)?, keys, bytes, quota).is_some() {
                // Expired keys count until they are swept: sweep, then
                // check again (what the writes replace may have gone).
                self.sweep(now)?;
                (keys, bytes) = match self.check(namespace, commit)? {
                    Ok(deltas) => deltas,
                    Err(refused) => return Ok(refused),
                };
                let usage = self.usage_of(namespace)?;
                if let Some(reason) = over_quota(namespace, usage, keys, bytes, quota) {
                    return Ok(Committed::OverQuota { reason });
                }
            }
            for write in &commit.writes {
                let id = named(namespace, &write.key);
                self.remove_entry(namespace, &id, write.key.len())?;
                if let Write::Put {
                    value,
                    expires_at_ms,
                } = &write.write
                {
                    self.put_entry(namespace, &id, write.key.len(), value, *expires_at_ms)?;
                }
                self.locks.remove(id.as_slice())?;
            }
        }
        let until = now.saturating_add(commit.retention.as_millis() as u64);
        self.done.insert(done_id.as_slice(), until)?;
        self.done_expiries
            .insert(expiry_key(until, &done_id).as_slice(), ())?;
        if let Some(holder) = &commit.claim_holder {
            self.release_claim(&commit.done, holder)?;
        }
        Ok(Committed::Applied)
    }

    /// Checks a commit's writes (versions, reservations): the change in
    /// the namespace's keys and bytes they make, or why it is refused.
    fn check(
        &self,
        namespace: &str,
        commit: &Commit,
    ) -> Result<Result<(i64, i64), Committed>, redb::Error> {
        let now = commit.now_ms;
        let (mut keys, mut bytes) = (0i64, 0i64);
        for write in &commit.writes {
            let id = named(namespace, &write.key);
            let old = self.entry(&id)?;
            let conflict = || Committed::Conflict {
                key: write.key.clone(),
            };
            if let Some(expected) = write.expect {
                let version = old
                    .as_ref()
                    .filter(|e| e.live_at(now))
                    .map_or(ABSENT, |e| e.version);
                if version != expected {
                    return Ok(Err(conflict()));
                }
            }
            if self.locked_by_other(&id, commit.reservation.as_deref(), now)? {
                return Ok(Err(conflict()));
            }
            if let Some(old) = &old {
                keys -= 1;
                bytes -= (write.key.len() + old.value.len()) as i64;
            }
            if let Write::Put { value, .. } = &write.write {
                keys += 1;
                bytes += (write.key.len() + value.len()) as i64;
            }
        }
        Ok(Ok((keys, bytes)))
    }

    fn usage_of(&self, namespace: &str) -> Result<Usage, redb::Error> {
        Ok(self
            .usage
            .get(namespace.as_bytes())?
            .map(|u| {
                let (keys, bytes) = u.value();
                Usage { keys, bytes }
            })
            .unwrap_or_default())
    }

    fn add_usage(&mut self, namespace: &str, keys: i64, bytes: i64) -> Result<(), redb::Error> {
        let usage = self.usage_of(namespace)?;
        let keys = usage.keys.saturating_add_signed(keys);
        let bytes = usage.bytes.saturating_add_signed(bytes);
        self.usage.insert(namespace.as_bytes(), (keys, bytes))?;
        Ok(())
    }

    /// Removes the entry `id` (of a key `key_len` long), its expiry and its
    /// usage, if it is there; whether it was live at `now_ms` is the
    /// caller's concern.
    fn remove_entry(
        &mut self,
        namespace: &str,
        id: &[u8],
        key_len: usize,
    ) -> Result<Option<Entry>, redb::Error> {
        let Some(old) = self.entries.remove(id)?.map(|v| decode_entry(v.value())) else {
            return Ok(None);
        };
        if let Some(at) = old.expires_at_ms {
            self.expiries.remove(expiry_key(at, id).as_slice())?;
        }
        self.add_usage(namespace, -1, -((key_len + old.value.len()) as i64))?;
        Ok(Some(old))
    }

    fn put_entry(
        &mut self,
        namespace: &str,
        id: &[u8],
        key_len: usize,
        value: &[u8],
        expires_at_ms: Option<u64>,
    ) -> Result<(), redb::Error> {
        let version = self.meta.get("version")?.map_or(0, |v| v.value()) + 1;
        self.meta.insert("version", version)?;
        let entry = Entry {
            value: value.to_vec(),
            version,
            expires_at_ms,
        };
        self.entries.insert(id, encode_entry(&entry).as_slice())?;
        if let Some(at) = expires_at_ms {
            self.expiries.insert(expiry_key(at, id).as_slice(), ())?;
        }
        self.add_usage(namespace, 1, (key_len + value.len()) as i64)
    }

    fn reserve(
        &mut self,
        namespace: &str,
        checks: &[(Vec<u8>, u64)],
        token: &str,
        expires_at_ms: u64,
        now_ms: u64,
    ) -> Result<Reserved, redb::Error> {
        for (key, expected) in checks {
            let id = named(namespace, key);
            let version = self
                .entry(&id)?
                .filter(|e| e.live_at(now_ms))
                .map_or(ABSENT, |e| e.version);
            if version != *expected || self.locked_by_other(&id, Some(token), now_ms)? {
                return Ok(Reserved::Conflict { key: key.clone() });
            }
        }
        for (key, _) in checks {
            let id = named(namespace, key);
            self.locks.insert(
                id.as_slice(),
                with_expiry(expires_at_ms, token.as_bytes()).as_slice(),
            )?;
        }
        Ok(Reserved::Held)
    }

    fn release(
        &mut self,
        namespace: &str,
        keys: &[Vec<u8>],
        token: &str,
    ) -> Result<(), redb::Error> {
        for key in keys {
            let id = named(namespace, key);
            let mine = self
                .locks
                .get(id.as_slice())?
                .is_some_and(|lock| split_expiry(lock.value()).1 == token.as_bytes());
            if mine {
                self.locks.remove(id.as_slice())?;
            }
        }
        Ok(())
    }

    fn claim(
        &mut self,
        input: &InputKey,
        holder: &str,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Claim, redb::Error> {
        let id = named(&input.queue, input.id.as_bytes());
        if self
            .done
            .get(id.as_slice())?
            .is_some_and(|until| until.value() > now_ms)
        {
            return Ok(Claim::Done);
        }
        if let Some(claim) = self.claims.get(id.as_slice())? {
            let (until, by) = split_expiry(claim.value());
            if until > now_ms && by != holder.as_bytes() {
                return Ok(Claim::HeldElsewhere {
                    holder: String::from_utf8_lossy(by).into_owned(),
                    expires_in: Duration::from_millis(until - now_ms),
                });
            }
        }
        let until = now_ms.saturating_add(lease.as_millis() as u64);
        self.claims.insert(
            id.as_slice(),
            with_expiry(until, holder.as_bytes()).as_slice(),
        )?;
        Ok(Claim::Taken)
    }

    fn release_claim(&mut self, input: &InputKey, holder: &str) -> Result<(), redb::Error> {
        let id = named(&input.queue, input.id.as_bytes());
        let mine = self
            .claims
            .get(id.as_slice())?
            .is_some_and(|claim| split_expiry(claim.value()).1 == holder.as_bytes());
        if mine {
            self.claims.remove(id.as_slice())?;
        }
        Ok(())
    }

    fn delete_now(
        &mut self,
        namespace: &str,
        key: &[u8],
        now_ms: u64,
    ) -> Result<bool, redb::Error> {
        let id = named(namespace, key);
        let old = self.remove_entry(namespace, &id, key.len())?;
        Ok(old.is_some_and(|e| e.live_at(now_ms)))
    }

    /// Removes what expired by `now_ms`: entries (and their usage), done
    /// records, claims and reservations.
    fn sweep(&mut self, now_ms: u64) -> Result<(), redb::Error> {
        let end = (now_ms + 1).to_be_bytes();
        let expired: Vec<Vec<u8>> = self
            .expiries
            .range(..end.as_slice())?
            .map(|row| row.map(|(k, _)| k.value().to_vec()))
            .collect::<Result<_, _>>()?;
        for key in expired {
            let id = &key[8..];
            let (namespace, name_len) = split_name(id);
            let namespace = namespace.to_string();
            self.remove_entry(&namespace, id, id.len() - name_len)?;
            self.expiries.remove(key.as_slice())?;
        }
        let expired: Vec<Vec<u8>> = self
            .done_expiries
            .range(..end.as_slice())?
            .map(|row| row.map(|(k, _)| k.value().to_vec()))
            .collect::<Result<_, _>>()?;
        for key in expired {
            let id = &key[8..];
            // A record written again since keeps its later expiry.
            let still = self.done.get(id)?.map(|u| u.value());
            if still.is_some_and(|until| until <= now_ms) {
                self.done.remove(id)?;
            }
            self.done_expiries.remove(key.as_slice())?;
        }
        self.claims
            .retain(|_, claim| split_expiry(claim).0 > now_ms)?;
        self.locks.retain(|_, lock| split_expiry(lock).0 > now_ms)?;
        Ok(())
    }
}

/// The quota refusal of a namespace at `usage` changed by the deltas, if
/// it would be over.
pub fn over_quota(
    namespace: &str,
    usage: Usage,
    delta_keys: i64,
    delta_bytes: i64,
    quota: Quota,
) -> Option<String> {
    let keys = usage.keys.saturating_add_signed(delta_keys);
    let bytes = usage.bytes.saturating_add_signed(delta_bytes);
    if delta_keys > 0 && keys > quota.max_keys {
        return Some(super::over_keys(namespace, keys, quota.max_keys));
    }
    if delta_bytes > 0 && bytes > quota.max_bytes {
        return Some(super::over_bytes(namespace, bytes, quota.max_bytes));
    }
    None
}

/// `name` prefixed by its length, then `key`.
fn named(name: &str, key: &[u8]) -> Vec<u8> {
    let len = u16::try_from(name.len()).unwrap_or(u16::MAX);
    let mut id = Vec::with_capacity(2 + name.len() + key.len());
    id.extend_from_slice(&len.to_be_bytes());
    id.extend_from_slice(&name.as_bytes()[..len as usize]);
    id.extend_from_slice(key);
    id
}

/// The name of a [`named`] id, and the length of its prefix.
fn split_name(id: &[u8]) -> (&str, usize) {
    let len = u16::from_be_bytes([id[0], id[1]]) as usize;
    (std::str::from_utf8(&id[2..2 + len]).unwrap_or(""), 2 + len)
}

fn expiry_key(at: u64, id: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + id.len());
    key.extend_from_slice(&at.to_be_bytes());
    key.extend_from_slice(id);
    key
}

fn with_expiry(at: u64, rest: &[u8]) -> Vec<u8> {
    expiry_key(at, rest)
}

fn split_expiry(value: &[u8]) -> (u64, &[u8]) {
    let (at, rest) = value.split_at(8);
    (u64::from_be_bytes(at.try_into().expect("8 bytes")), rest)
}

fn encode_entry(entry: &Entry) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(16 + entry.value.len());
    bytes.extend_from_slice(&entry.version.to_be_bytes());
    bytes.extend_from_slice(&entry.expires_at_ms.unwrap_or(0).to_be_bytes());
    bytes.extend_from_slice(&entry.value);
    bytes
}

fn decode_entry(bytes: &[u8]) -> Entry {
    let version = u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes"));
    let expires = u64::from_be_bytes(bytes[8..16].try_into().expect("8 bytes"));
    Entry {
        value: bytes[16..].to_vec(),
        version,
        expires_at_ms: (expires != 0).then_some(expires),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_length_prefixed_so_none_is_a_prefix_of_another() {
        let a = named("ab", b"c");
        let b = named("a", b"bc");
        assert_ne!(a, b);
        assert_eq!(split_name(&a), ("ab", 4));
    }

    #[test]
    fn an_entry_reads_back_as_written() {
        for expires_at_ms in [None, Some(17)] {
            let entry = Entry {
                value: vec![0, 1, 0xff],
                version: 42,
                expires_at_ms,
            };
            assert_eq!(decode_entry(&encode_entry(&entry)), entry);
        }
    }

    #[test]
    fn a_quota_is_refused_with_its_limit_named_and_shrinking_is_always_allowed() {
        let quota = Quota {
            max_keys: 2,
            max_bytes: 100,
        };
        let full = Usage { keys: 2, bytes: 10 };
        assert_eq!(
            over_quota("orders", full, 1, 5, quota).as_deref(),
            Some("namespace \"orders\" would hold 3 keys, over its quota of 2 (max_keys)")
        );
        assert_eq!(
            over_quota("orders", full, 0, 91, quota).as_deref(),
            Some("namespace \"orders\" would hold 101 bytes, over its quota of 100 (max_bytes)")
        );
        let over = Usage {
            keys: 5,
            bytes: 500,
        };
        assert_eq!(over_quota("orders", over, -1, -50, quota), None);
    }
}
