//! `state`: the consumer's key-value namespace, kept in memory by the
//! [`TestHost`] (and shared by its clones), with the host's semantics
//! (`docs/state.md`, `host/src/plugin/host/state.rs`):
//!
//! - Each call sees the committed state plus its own writes, which it
//!   buffers; they are committed at the end of [`TestHost::handle`] only when
//!   the outcome is [`Outcome::Accept`](crate::Outcome::Accept) (and at the
//!   end of [`TestHost::run`], which has no outcome, always). A retried,
//!   rejected or parked call leaves nothing behind.
//! - TTLs run on the test host's clock ([`TestHost::now_ms`],
//!   [`TestHost::advance`]): a key expires `ttl` after the call that wrote
//!   it, as that call's clock read.
//! - Versions are unique within the namespace and never reused; each
//!   committed write gives its key a new one.
//! - The limits (key 1 to 1,024 bytes, value at most 1 MiB, 1,000 writes a
//!   call, a TTL of at least 1 ms), `increment`'s integer text and its
//!   overflow, and a consumer without a store ([`TestHost::without_state`])
//!   are refused in the host's words (`host/src/state/call.rs`).
//! - A conflict: a key that [`increment`](crate::state::increment) or
//!   [`set_if_version`](crate::state::set_if_version) depended on changed
//!   between the call and its commit
//!   ([`TestHost::state_changes_during_next_call`] makes it happen), or a
//!   `set_if_version` named a version the committed key did not have (the
//!   version is always compared with the committed key's, the first check
//!   of a key in a call is kept, and an `increment` of a value the call
//!   wrote itself depends on nothing). Nothing of the
//!   call is committed and [`Handled::conflict`](super::Handled::conflict)
//!   names the key. The real host would then run the call again on fresh
//!   state (up to 5 times); the test host does not: handle the message again
//!   to see what that run does.
//!
//! The namespace's quotas (`max_keys`, `max_bytes`) and done records are
//! not modelled.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::de::DeserializeOwned;

use super::{TestHost, with_state};
use crate::state::{ABSENT, MAX_KEY_BYTES, MAX_VALUE_BYTES, MAX_WRITES, shown_key};

/// What every state call answers on a consumer without `state`: the host's
/// words.
pub(crate) const NO_STORE: &str =
    "this consumer has no state store: set state = \"NAME\" in its [[consumers]] entry";

/// A write a call made, in the order it made them (see
/// [`Handled::state_writes`](super::Handled::state_writes)): what the
/// handler asked for, whether or not it was committed. A TTL is as the host
/// receives it, in whole milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateWrite {
    /// [`set`](crate::state::set) and its helpers; `ttl` `None`: never
    /// expires.
    Set {
        key: Vec<u8>,
        value: Vec<u8>,
        ttl: Option<Duration>,
    },
    /// [`delete`](crate::state::delete).
    Delete { key: Vec<u8> },
    /// [`increment`](crate::state::increment): `by`, and the `value` it
    /// returned (stored as its decimal text); `ttl` `None`: the key kept its
    /// expiry.
    Increment {
        key: Vec<u8>,
        by: i64,
        value: i64,
        ttl: Option<Duration>,
    },
    /// [`set_if_version`](crate::state::set_if_version) and its JSON helper.
    SetIfVersion {
        key: Vec<u8>,
        value: Vec<u8>,
        version: u64,
        ttl: Option<Duration>,
    },
}

impl StateWrite {
    /// The key written.
    pub fn key(&self) -> &[u8] {
        match self {
            StateWrite::Set { key, .. }
            | StateWrite::Delete { key }
            | StateWrite::Increment { key, .. }
            | StateWrite::SetIfVersion { key, .. } => key,
        }
    }
}

/// The namespace of a [`TestHost`] and its clones.
pub(crate) type Shared = Arc<Mutex<Namespace>>;

pub(crate) fn new_namespace() -> Shared {
    Arc::default()
}

/// The committed state.
#[derive(Debug, Default)]
pub(crate) struct Namespace {
    entries: BTreeMap<Vec<u8>, Entry>,
    /// The last version given (the namespace's counter).
    last_version: u64,
    /// Changes another input commits while the next call runs: applied
    /// after it, before its commit (`None`: a delete).
    during_next_call: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

#[derive(Clone, Debug)]
struct Entry {
    value: Vec<u8>,
    version: u64,
    expires_at_ms: Option<u64>,
}

fn live(expires_at_ms: Option<u64>, now_ms: u64) -> bool {
    expires_at_ms.is_none_or(|at| at > now_ms)
}

impl Namespace {
    fn live_entry(&self, key: &[u8], now_ms: u64) -> Option<&Entry> {
        self.entries
            .get(key)
            .filter(|e| live(e.expires_at_ms, now_ms))
    }

    /// The version a check compares with: the live entry's, else [`ABSENT`].
    fn version(&self, key: &[u8], now_ms: u64) -> u64 {
        self.live_entry(key, now_ms).map_or(ABSENT, |e| e.version)
    }

    fn apply(&mut self, key: Vec<u8>, pending: Pending) {
        match pending {
            Pending::Put {
                value,
                expires_at_ms,
            } => {
                self.last_version += 1;
                let entry = Entry {
                    value,
                    version: self.last_version,
                    expires_at_ms,
                };
                self.entries.insert(key, entry);
            }
            Pending::Deleted => {
                self.entries.remove(&key);
            }
        }
    }
}

/// A write buffered by the call, not yet committed.
#[derive(Clone, Debug)]
enum Pending {
    Put {
        value: Vec<u8>,
        expires_at_ms: Option<u64>,
    },
    Deleted,
}

/// One call's part: its buffered writes and what its commit checks, as the
/// host's `CallState` (`host/src/state/call.rs`) keeps them.
#[derive(Debug, Default)]
pub(crate) struct Call {
    /// The last write of each key.
    overlay: BTreeMap<Vec<u8>, Pending>,
    /// The version each checked key must still have at commit; the first
    /// check of a key is kept (what the call read first).
    checks: Vec<(Vec<u8>, u64)>,
    pub(crate) writes: Vec<StateWrite>,
}

/// What a value looks like to the call.
struct Seen {
    value: Vec<u8>,
    expires_at_ms: Option<u64>,
}

impl Call {
    /// `key` as the call sees it: its own write, else the committed entry.
    fn seen(&self, ns: &Namespace, key: &[u8], now_ms: u64) -> Option<Seen> {
        match self.overlay.get(key) {
            Some(Pending::Put {
                value,
                expires_at_ms,
            }) => Some(Seen {
                value: value.clone(),
                expires_at_ms: *expires_at_ms,
            }),
            Some(Pending::Deleted) => None,
            None => ns.live_entry(key, now_ms).map(|e| Seen {
                value: e.value.clone(),
                expires_at_ms: e.expires_at_ms,
            }),
        }
    }

    /// Refuses a write past the call's limit, in the host's words.
    fn count_write(&self) -> Result<(), String> {
        if self.writes.len() >= MAX_WRITES {
            return Err(format!(
                "a call makes at most {MAX_WRITES} state writes; this would be write {}",
                self.writes.len() + 1
            ));
        }
        Ok(())
    }

    fn write(&mut self, key: &[u8], pending: Pending, write: StateWrite) {
        self.overlay.insert(key.to_vec(), pending);
        self.writes.push(write);
    }

    /// Makes the commit depend on `key` still having `version`, unless an
    /// earlier call of this one already checks it.
    fn expect(&mut self, key: &[u8], version: u64) {
        if !self.checks.iter().any(|(k, _)| k == key) {
            self.checks.push((key.to_vec(), version));
        }
    }
}

fn check_key(key: &[u8]) -> Result<(), String> {
    if key.is_empty() {
        return Err("a state key must not be empty".to_string());
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "a state key is at most {MAX_KEY_BYTES} bytes; this one is {}",
            key.len()
        ));
    }
    Ok(())
}

fn check_value(value: &[u8]) -> Result<(), String> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(format!(
            "a state value is at most {MAX_VALUE_BYTES} bytes; this one is {}",
            value.len()
        ));
    }
    Ok(())
}

/// When a write with `ttl_ms` expires; a TTL of 0 is refused.
fn expiry(now_ms: u64, ttl_ms: Option<u64>) -> Result<Option<u64>, String> {
    match ttl_ms {
        None => Ok(None),
        Some(0) => Err("ttl-ms must be at least 1 (none: the key never expires)".to_string()),
        Some(ttl) => Ok(Some(now_ms.saturating_add(ttl))),
    }
}

/// A key as the host's errors name it.
fn host_key(key: &[u8]) -> String {
    match core::str::from_utf8(key) {
        Ok(text) => format!("the key {text:?}"),
        Err(_) => {
            let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
            format!("the key 0x{hex}")
        }
    }
}

fn lock(ns: &Shared) -> MutexGuard<'_, Namespace> {
    // A panic elsewhere (a failed assert) never leaves the namespace half
    // changed: every change is made under one lock, without user code.
    ns.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs a state call of the active [`TestHost`]: refused on a host without
/// a store, and for a key out of bounds.
fn call<R>(
    key: &[u8],
    f: impl FnOnce(&mut Call, &mut Namespace, u64) -> Result<R, String>,
) -> Result<R, String> {
    with_state(|s| {
        let ns = s.host.state.as_ref().ok_or_else(|| NO_STORE.to_string())?;
        check_key(key)?;
        f(&mut s.kv, &mut lock(ns), s.host.now_ms)
    })
}

pub(crate) fn get(key: &[u8]) -> Result<Option<Vec<u8>>, String> {
    call(key, |call, ns, now| {
        Ok(call.seen(ns, key, now).map(|seen| seen.value))
    })
}

/// The value and the committed version it is based on: a key only this
/// call wrote shows [`ABSENT`].
pub(crate) fn get_versioned(key: &[u8]) -> Result<Option<(Vec<u8>, u64)>, String> {
    call(key, |call, ns, now| {
        Ok(call
            .seen(ns, key, now)
            .map(|seen| (seen.value, ns.version(key, now))))
    })
}

pub(crate) fn set(key: &[u8], value: &[u8], ttl_ms: Option<u64>) -> Result<(), String> {
    call(key, |call, _, now| {
        check_value(value)?;
        let expires_at_ms = expiry(now, ttl_ms)?;
        call.count_write()?;
        let write = StateWrite::Set {
            key: key.to_vec(),
            value: value.to_vec(),
            ttl: ttl_ms.map(Duration::from_millis),
        };
        let pending = Pending::Put {
            value: value.to_vec(),
            expires_at_ms,
        };
        call.write(key, pending, write);
        Ok(())
    })
}

pub(crate) fn delete(key: &[u8]) -> Result<(), String> {
    call(key, |call, _, _| {
        call.count_write()?;
        let write = StateWrite::Delete { key: key.to_vec() };
        call.write(key, Pending::Deleted, write);
        Ok(())
    })
}

/// Based on a committed value (or none), checked at commit; based on the
/// call's own write, not.
pub(crate) fn increment(key: &[u8], by: i64, ttl_ms: Option<u64>) -> Result<i64, String> {
    call(key, |call, ns, now| {
        let ttl_expiry = expiry(now, ttl_ms)?;
        let based_on_committed = !call.overlay.contains_key(key);
        let seen = call.seen(ns, key, now);
        let current = match &seen {
            None => 0,
            Some(seen) => decimal(&seen.value).ok_or_else(|| {
                format!(
                    "{} does not hold an integer (increment keeps decimal text such as \"6\"), \
                     so it cannot be incremented",
                    host_key(key)
                )
            })?,
        };
        let value = current.checked_add(by).ok_or_else(|| {
            format!(
                "incrementing {} by {by} overflows a 64-bit integer (it holds {current})",
                host_key(key)
            )
        })?;
        call.count_write()?;
        if based_on_committed {
            call.expect(key, ns.version(key, now));
        }
        let write = StateWrite::Increment {
            key: key.to_vec(),
            by,
            value,
            ttl: ttl_ms.map(Duration::from_millis),
        };
        let pending = Pending::Put {
            value: value.to_string().into_bytes(),
            expires_at_ms: ttl_expiry.or(seen.and_then(|seen| seen.expires_at_ms)),
        };
        call.write(key, pending, write);
        Ok(value)
    })
}

/// Checked at commit: the committed key must still have `version`.
pub(crate) fn set_if_version(
    key: &[u8],
    value: &[u8],
    version: u64,
    ttl_ms: Option<u64>,
) -> Result<(), String> {
    call(key, |call, _, now| {
        check_value(value)?;
        let expires_at_ms = expiry(now, ttl_ms)?;
        call.count_write()?;
        call.expect(key, version);
        let write = StateWrite::SetIfVersion {
            key: key.to_vec(),
            value: value.to_vec(),
            version,
            ttl: ttl_ms.map(Duration::from_millis),
        };
        let pending = Pending::Put {
            value: value.to_vec(),
            expires_at_ms,
        };
        call.write(key, pending, write);
        Ok(())
    })
}

/// An integer as `increment` reads it: decimal text, as the host parses it
/// (`i64`'s `FromStr`: an optional sign, then digits).
fn decimal(value: &[u8]) -> Option<i64> {
    core::str::from_utf8(value).ok()?.parse().ok()
}

/// Ends a call: first what another input committed meanwhile
/// ([`TestHost::state_changes_during_next_call`]), then, when `accepted`,
/// the call's writes, unless a key they depend on changed. Returns that key.
pub(crate) fn settle(host: &TestHost, call: Call, accepted: bool) -> Option<Vec<u8>> {
    let ns = host.state.as_ref()?;
    let mut ns = lock(ns);
    for (key, value) in std::mem::take(&mut ns.during_next_call) {
        let change = match value {
            Some(value) => Pending::Put {
                value,
                expires_at_ms: None,
            },
            None => Pending::Deleted,
        };
        ns.apply(key, change);
    }
    if !accepted {
        return None;
    }
    let now = host.now_ms;
    if let Some((key, _)) = call
        .checks
        .into_iter()
        .find(|(key, base)| ns.version(key, now) != *base)
    {
        return Some(key);
    }
    for (key, pending) in call.overlay {
        ns.apply(key, pending);
    }
    None
}

impl TestHost {
    /// A consumer without `state` in its `[[consumers]]` entry: every state
    /// call fails with the host's error naming the setting (which `?` turns
    /// into a retry). The `state_*` methods below then panic.
    pub fn without_state(mut self) -> Self {
        self.state = None;
        self
    }

    fn namespace(&self) -> MutexGuard<'_, Namespace> {
        lock(self.state.as_ref().expect(
            "this TestHost has no state store (TestHost::without_state): \
             there is no state to seed or read",
        ))
    }

    /// Commits `key` = `value` (no expiry), as an earlier input would have:
    /// seeds the state before a call. It gets a new version.
    pub fn state_set(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        let put = Pending::Put {
            value: value.as_ref().to_vec(),
            expires_at_ms: None,
        };
        self.namespace().apply(key.as_ref().to_vec(), put);
    }

    /// [`state_set`](Self::state_set), expiring `ttl` after this host's
    /// [`now_ms`](Self::now_ms).
    pub fn state_set_for(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>, ttl: Duration) {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let put = Pending::Put {
            value: value.as_ref().to_vec(),
            expires_at_ms: Some(self.now_ms.saturating_add(ttl_ms)),
        };
        self.namespace().apply(key.as_ref().to_vec(), put);
    }

    /// Removes `key` from the committed state.
    pub fn state_delete(&self, key: impl AsRef<[u8]>) {
        self.namespace()
            .apply(key.as_ref().to_vec(), Pending::Deleted);
    }

    /// The committed value of `key`, live at this host's
    /// [`now_ms`](Self::now_ms).
    pub fn state_get(&self, key: impl AsRef<[u8]>) -> Option<Vec<u8>> {
        let ns = self.namespace();
        ns.live_entry(key.as_ref(), self.now_ms)
            .map(|e| e.value.clone())
    }

    /// [`state_get`](Self::state_get) deserialized from JSON; panics when
    /// the value is not a valid `T`.
    pub fn state_get_json<T: DeserializeOwned>(&self, key: impl AsRef<[u8]>) -> Option<T> {
        let key = key.as_ref();
        let value = self.state_get(key)?;
        Some(serde_json::from_slice(&value).unwrap_or_else(|e| {
            panic!(
                "the state of `{}` is not valid JSON for the type asked: {e}",
                shown_key(key)
            )
        }))
    }

    /// The committed version of `key`, live at this host's
    /// [`now_ms`](Self::now_ms).
    pub fn state_version(&self, key: impl AsRef<[u8]>) -> Option<u64> {
        let ns = self.namespace();
        ns.live_entry(key.as_ref(), self.now_ms).map(|e| e.version)
    }

    /// The committed keys live at this host's [`now_ms`](Self::now_ms), in
    /// byte order.
    pub fn state_keys(&self) -> Vec<Vec<u8>> {
        let ns = self.namespace();
        ns.entries
            .iter()
            .filter(|(_, e)| live(e.expires_at_ms, self.now_ms))
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Makes another input commit `key` = `value` (no expiry, a new version)
    /// while the next call runs: after the call has read the state, before
    /// its commit. If that call's writes depend on `key` (an `increment` of
    /// it, a `set_if_version` of it), its commit then conflicts: nothing of
    /// it is committed, and [`Handled::conflict`](super::Handled::conflict)
    /// names the key. (The real host would run the call again, on the new
    /// state; handle the message again to see that run.) A plain `set` or
    /// `delete` of the key does not conflict: it is last-writer-wins, and
    /// the call's write replaces the other input's.
    ///
    /// ```
    /// use acemq_guest::prelude::*;
    /// use acemq_guest::testing::{self, TestHost};
    ///
    /// struct Append;
    /// impl Handler for Append {
    ///     fn handle(msg: Message) -> Result {
    ///         let (mut text, version) = match state::get_versioned("log")? {
    ///             Some(found) => (found.value, found.version),
    ///             None => (Vec::new(), state::ABSENT),
    ///         };
    ///         text.extend_from_slice(msg.body());
    ///         state::set_if_version("log", text, version, None)?;
    ///         accept()
    ///     }
    /// }
    ///
    /// let host = TestHost::new();
    /// host.state_set("log", "a");
    /// host.state_changes_during_next_call("log", "ab");
    /// let done = host.handle::<Append>(testing::message("c"));
    /// assert_eq!(done.outcome, Outcome::Accept);
    /// assert_eq!(done.conflict, Some(b"log".to_vec()));
    /// assert_eq!(host.state_get("log"), Some(b"ab".to_vec()), "the other input's");
    ///
    /// // The host's next run of the call, on fresh state:
    /// let done = host.handle::<Append>(testing::message("c"));
    /// assert_eq!(done.conflict, None);
    /// assert_eq!(host.state_get("log"), Some(b"abc".to_vec()));
    /// ```
    pub fn state_changes_during_next_call(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        let change = (key.as_ref().to_vec(), Some(value.as_ref().to_vec()));
        self.namespace().during_next_call.push(change);
    }

    /// [`state_changes_during_next_call`](Self::state_changes_during_next_call),
    /// the other input deleting `key`.
    pub fn state_deleted_during_next_call(&self, key: impl AsRef<[u8]>) {
        let change = (key.as_ref().to_vec(), None);
        self.namespace().during_next_call.push(change);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state;
    use crate::testing::{self, TestHost};
    use crate::{Handler, Message, Outcome, Result, accept};

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn reads_see_committed_state_plus_the_calls_own_writes() {
        let host = TestHost::new();
        host.state_set("a", "1");
        host.state_set("b", "2");
        let ran = host.run(|| {
            state::set("a", "one").unwrap();
            state::delete("b").unwrap();
            state::set("c", "3").unwrap();
            (
                state::get("a").unwrap(),
                state::get("b").unwrap(),
                state::get("c").unwrap(),
            )
        });
        assert_eq!(
            ran.value,
            (Some(b"one".to_vec()), None, Some(b"3".to_vec()))
        );
        assert_eq!(ran.state_writes.len(), 3);
        assert_eq!(host.state_keys(), [b"a".to_vec(), b"c".to_vec()]);
    }

    /// Writes "x" = the body, then ends as the body's first word says.
    struct Decide;
    impl Handler for Decide {
        fn handle(msg: Message) -> Result {
            let text = msg.text()?.to_owned();
            state::set("x", &text)?;
            match text.split(' ').next() {
                Some("retry") => crate::retry("later"),
                Some("reject") => crate::reject("bad"),
                Some("park") => crate::park("odd"),
                _ => accept(),
            }
        }
    }

    #[test]
    fn only_an_accepted_call_commits() {
        let host = TestHost::new();
        for body in ["retry 1", "reject 2", "park 3"] {
            let done = host.handle::<Decide>(testing::message(body));
            assert_ne!(done.outcome, Outcome::Accept);
            assert_eq!(
                done.state_writes,
                [StateWrite::Set {
                    key: b"x".to_vec(),
                    value: body.as_bytes().to_vec(),
                    ttl: None
                }],
                "what the call asked for is still shown"
            );
            assert_eq!(host.state_get("x"), None, "{body}: nothing committed");
        }
        let done = host.handle::<Decide>(testing::message("ok"));
        assert_eq!((done.outcome, done.conflict), (Outcome::Accept, None));
        assert_eq!(host.state_get("x"), Some(b"ok".to_vec()));
    }

    #[test]
    fn clones_share_the_namespace_and_a_fresh_host_has_its_own() {
        let host = TestHost::new();
        let later = host.clone().advance(Duration::from_secs(1));
        host.run(|| state::set("k", "v").unwrap());
        assert_eq!(later.state_get("k"), Some(b"v".to_vec()));
        assert_eq!(TestHost::new().state_keys(), Vec::<Vec<u8>>::new());
    }

    #[test]
    fn keys_expire_on_the_test_hosts_clock() {
        let host = TestHost::new().now_ms(1_000);
        host.run(|| {
            state::set_for("short", "s", Duration::from_millis(500)).unwrap();
            state::set("forever", "f").unwrap();
        });
        let host = host.advance(Duration::from_millis(499));
        assert_eq!(host.state_get("short"), Some(b"s".to_vec()));
        let host = host.advance(Duration::from_millis(1));
        assert_eq!(host.state_get("short"), None, "expired at 1,500");
        assert_eq!(host.run(|| state::get("short").unwrap()).value, None);
        assert_eq!(host.state_keys(), [b"forever".to_vec()]);

        // A write without a TTL drops the one the key had.
        let host = host.now_ms(0);
        host.state_set_for("k", "1", HOUR);
        host.run(|| state::set("k", "2").unwrap());
        let host = host.advance(HOUR * 2);
        assert_eq!(host.state_get("k"), Some(b"2".to_vec()));
    }

    #[test]
    fn increment_counts_in_decimal_text_and_keeps_or_sets_the_expiry() {
        let host = TestHost::new().now_ms(0);
        let ran = host.run(|| {
            (
                state::increment_for("n", 5, HOUR).unwrap(),
                state::increment("n", 1).unwrap(),
                state::increment("m", -2).unwrap(),
            )
        });
        assert_eq!(ran.value, (5, 6, -2));
        assert_eq!(host.state_get("n"), Some(b"6".to_vec()));
        assert_eq!(host.state_get("m"), Some(b"-2".to_vec()));
        assert_eq!(
            ran.state_writes[1],
            StateWrite::Increment {
                key: b"n".to_vec(),
                by: 1,
                value: 6,
                ttl: None
            }
        );
        // The second increment kept the first one's expiry.
        let host = host.advance(HOUR);
        assert_eq!(host.state_get("n"), None);
        assert_eq!(host.state_get("m"), Some(b"-2".to_vec()), "never expires");

        // A later TTL replaces it.
        host.state_set_for("t", "1", Duration::from_secs(1));
        host.run(|| state::increment_for("t", 1, HOUR).unwrap());
        let host = host.advance(Duration::from_secs(2));
        assert_eq!(host.state_get("t"), Some(b"2".to_vec()));
    }

    #[test]
    fn increment_refuses_what_is_not_an_integer_and_overflow() {
        let host = TestHost::new();
        for value in ["six", "", "1.5", " 6", "-", "99999999999999999999"] {
            host.state_set("n", value);
            let err = host.run(|| state::increment("n", 1)).value.unwrap_err();
            assert_eq!(
                err.reason(),
                "the key \"n\" does not hold an integer (increment keeps decimal text such \
                 as \"6\"), so it cannot be incremented",
                "{value:?}"
            );
        }
        host.state_set([0xff], "x");
        let err = host.run(|| state::increment([0xff], 1)).value.unwrap_err();
        assert!(
            err.reason().starts_with("the key 0xff does not hold"),
            "{err}"
        );
        host.state_set("n", i64::MAX.to_string());
        let ran = host.run(|| state::increment("n", 1));
        assert_eq!(
            ran.value.unwrap_err().reason(),
            "incrementing the key \"n\" by 1 overflows a 64-bit integer \
             (it holds 9223372036854775807)"
        );
        assert!(ran.state_writes.is_empty(), "a refused write is no write");
        // The host parses as i64 does: a sign, leading zeros.
        host.state_set("n", "-007");
        assert_eq!(host.run(|| state::increment("n", 8)).value, Ok(1));
        host.state_set("n", "+6");
        assert_eq!(host.run(|| state::increment("n", 1)).value, Ok(7));
    }

    #[test]
    fn the_limits_are_refused_naming_them() {
        let ran = TestHost::new().run(|| {
            (
                state::get("").unwrap_err(),
                state::set(vec![b'k'; MAX_KEY_BYTES + 1], "v").unwrap_err(),
                state::set(vec![b'k'; MAX_KEY_BYTES], "v"),
                state::set("big", vec![0; MAX_VALUE_BYTES + 1]).unwrap_err(),
                state::set("big", vec![0; MAX_VALUE_BYTES]),
            )
        });
        let (empty, long, longest, big, biggest) = ran.value;
        assert_eq!(empty.reason(), "a state key must not be empty");
        assert_eq!(
            long.reason(),
            "a state key is at most 1024 bytes; this one is 1025"
        );
        assert_eq!(longest, Ok(()));
        assert_eq!(
            big.reason(),
            "a state value is at most 1048576 bytes; this one is 1048577"
        );
        assert_eq!(biggest, Ok(()));

        let ran = TestHost::new().run(|| {
            (
                state::set_for("k", "v", Duration::ZERO).unwrap_err(),
                state::increment_for("k", 1, Duration::ZERO).unwrap_err(),
                state::set_if_version("k", "v", ABSENT, Some(Duration::ZERO)).unwrap_err(),
                // Under a millisecond rounds up to one.
                state::set_for("k", "v", Duration::from_micros(1)),
            )
        });
        let (set, increment, if_version, short) = ran.value;
        for err in [set, increment, if_version] {
            assert_eq!(
                err.reason(),
                "ttl-ms must be at least 1 (none: the key never expires)"
            );
        }
        assert_eq!(short, Ok(()));

        let ran = TestHost::new().run(|| {
            for i in 0..MAX_WRITES {
                state::increment(format!("k{}", i % 7), 1).unwrap();
            }
            (state::delete("one-more"), state::get("k0"))
        });
        let (one_more, read) = ran.value;
        assert_eq!(
            one_more.unwrap_err().reason(),
            "a call makes at most 1000 state writes; this would be write 1001"
        );
        assert!(read.is_ok(), "reads are not writes");
        assert_eq!(ran.state_writes.len(), MAX_WRITES);
    }

    #[test]
    fn a_host_without_state_refuses_every_call_naming_the_setting() {
        let ran = TestHost::new().without_state().run(|| {
            [
                state::get("k").map(drop),
                state::set("k", "v"),
                state::delete("k"),
                state::increment("k", 1).map(drop),
                state::get_versioned("k").map(drop),
                state::set_if_version("k", "v", state::ABSENT, None),
            ]
        });
        for result in ran.value {
            assert_eq!(result.unwrap_err().reason(), NO_STORE);
        }
        assert_eq!(ran.conflict, None);
    }

    #[test]
    #[should_panic(expected = "this TestHost has no state store")]
    fn a_host_without_state_has_nothing_to_seed() {
        TestHost::new().without_state().state_set("k", "v");
    }

    #[test]
    fn versions_are_new_for_every_commit_and_never_reused() {
        let host = TestHost::new();
        host.state_set("k", "1");
        let first = host.state_version("k").unwrap();
        assert_ne!(first, ABSENT);
        host.state_delete("k");
        assert_eq!(host.state_version("k"), None);
        host.run(|| state::set("k", "2").unwrap());
        let second = host.state_version("k").unwrap();
        host.state_set("other", "x");
        assert!(second > first);
        assert!(host.state_version("other").unwrap() > second);
    }

    #[test]
    fn a_key_the_call_wrote_shows_the_version_it_replaces() {
        let host = TestHost::new();
        host.state_set("k", "1");
        let committed = host.state_version("k").unwrap();
        let ran = host.run(|| {
            state::set("k", "2").unwrap();
            state::set("new", "n").unwrap();
            let k = state::get_versioned("k").unwrap().unwrap();
            let new = state::get_versioned("new").unwrap().unwrap();
            // Both still apply: that is the version the commit compares.
            state::set_if_version("k", "3", k.version, None).unwrap();
            state::set_if_version("new", "m", new.version, None).unwrap();
            (k.version, new.version)
        });
        assert_eq!(ran.value, (committed, ABSENT));
        assert_eq!(ran.conflict, None);
        assert_eq!(host.state_get("k"), Some(b"3".to_vec()));
        assert_eq!(host.state_get("new"), Some(b"m".to_vec()));
    }

    #[test]
    fn set_if_version_applies_only_to_the_version_read() {
        let host = TestHost::new();
        // ABSENT on a missing key applies; on a present one it conflicts.
        let ran = host.run(|| state::set_if_version("k", "1", ABSENT, None));
        assert_eq!((ran.value, ran.conflict), (Ok(()), None));
        let ran = host.run(|| state::set_if_version("k", "2", ABSENT, None));
        assert_eq!(ran.conflict, Some(b"k".to_vec()));
        assert_eq!(host.state_get("k"), Some(b"1".to_vec()));

        // A version the key does not have conflicts; the one it has applies.
        let version = host.state_version("k").unwrap();
        let ran = host.run(|| {
            state::set("other", "o").unwrap();
            state::set_if_version("k", "3", version + 1, None)
        });
        assert_eq!(ran.conflict, Some(b"k".to_vec()));
        assert_eq!(host.state_get("other"), None, "nothing of the call");
        let ran = host.run(|| state::set_if_version("k", "3", version, Some(HOUR)));
        assert_eq!(ran.conflict, None);
        assert_eq!(host.state_get("k"), Some(b"3".to_vec()));
        let host = host.advance(HOUR);
        assert_eq!(host.state_get("k"), None, "with its TTL");

        // The version is compared with the committed key's, whatever the
        // call wrote to it before: ABSENT after the call's own delete of a
        // committed key conflicts.
        host.state_set("gone", "g");
        let ran = host.run(|| {
            state::delete("gone").unwrap();
            assert_eq!(state::get_versioned("gone").unwrap(), None);
            state::set_if_version("gone", "back", ABSENT, None)
        });
        assert_eq!(ran.conflict, Some(b"gone".to_vec()));
        assert_eq!(host.state_get("gone"), Some(b"g".to_vec()));

        // Two checks of one key: the first is kept (what the call read first).
        let version = host.state_version("gone").unwrap();
        let ran = host.run(|| {
            state::set_if_version("gone", "a", version, None).unwrap();
            state::set_if_version("gone", "b", version + 100, None)
        });
        assert_eq!(ran.conflict, None);
        assert_eq!(host.state_get("gone"), Some(b"b".to_vec()));
    }

    #[test]
    fn an_increment_of_the_calls_own_write_depends_on_nothing() {
        let host = TestHost::new();
        host.state_changes_during_next_call("n", "100");
        let ran = host.run(|| {
            state::set("n", "10").unwrap();
            state::increment("n", 1).unwrap()
        });
        assert_eq!((ran.value, ran.conflict), (11, None));
        assert_eq!(
            host.state_get("n"),
            Some(b"11".to_vec()),
            "last writer wins"
        );

        // An increment of a key absent when read depends on its absence.
        host.state_changes_during_next_call("fresh", "7");
        let ran = host.run(|| state::increment("fresh", 1).unwrap());
        assert_eq!(ran.conflict, Some(b"fresh".to_vec()));
        assert_eq!(host.state_get("fresh"), Some(b"7".to_vec()));
    }

    #[test]
    fn a_change_during_the_call_conflicts_with_what_depended_on_the_key() {
        let host = TestHost::new();
        host.state_set("n", "1");
        host.state_changes_during_next_call("n", "10");
        let ran = host.run(|| {
            state::set("unrelated", "u").unwrap();
            state::increment("n", 1).unwrap()
        });
        assert_eq!(ran.value, 2, "the call saw the state before the change");
        assert_eq!(ran.conflict, Some(b"n".to_vec()));
        assert_eq!(host.state_get("n"), Some(b"10".to_vec()));
        assert_eq!(host.state_get("unrelated"), None);

        // Only the next call: the one after commits.
        let ran = host.run(|| state::increment("n", 1).unwrap());
        assert_eq!((ran.value, ran.conflict), (11, None));
        assert_eq!(host.state_get("n"), Some(b"11".to_vec()));
    }

    #[test]
    fn a_change_during_the_call_does_not_conflict_with_a_plain_write() {
        let host = TestHost::new();
        host.state_changes_during_next_call("k", "theirs");
        host.state_deleted_during_next_call("gone");
        host.state_set("gone", "g");
        let ran = host.run(|| {
            assert_eq!(state::get("gone").unwrap(), Some(b"g".to_vec()));
            state::set("k", "mine")
        });
        assert_eq!((ran.value, ran.conflict), (Ok(()), None));
        assert_eq!(
            host.state_get("k"),
            Some(b"mine".to_vec()),
            "last writer wins"
        );
        assert_eq!(host.state_get("gone"), None, "deleted by the other input");
    }

    #[test]
    fn a_change_during_a_call_that_is_not_accepted_still_happens() {
        let host = TestHost::new();
        host.state_changes_during_next_call("x", "theirs");
        let done = host.handle::<Decide>(testing::message("park"));
        assert_eq!(
            done.conflict, None,
            "nothing to commit, nothing to conflict"
        );
        assert_eq!(host.state_get("x"), Some(b"theirs".to_vec()));
    }
}
