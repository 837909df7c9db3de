//! One handler call's view of its consumer's state: pure, no store.
//!
//! Reads see the committed value and the call's own writes. A key's
//! committed entry is fetched once per call (by the caller, through
//! [`CallState::needs`] and [`CallState::remember`]) and then answered from
//! here, so a call reads each key consistently. Writes are kept, last one
//! per key wins, and left to commit ([`CallState::finish`]) with the
//! versions they depend on: `increment` on a committed value and
//! `set-if-version` are checked at commit, plain `set` and `delete` are not.

use std::collections::HashMap;

use super::{ABSENT, Entry, KeyWrite, Write};

/// Longest key.
pub const MAX_KEY_BYTES: usize = 1024;
/// Largest value.
pub const MAX_VALUE_BYTES: usize = 1 << 20;
/// Most writes (`set`, `delete`, `increment`, `set-if-version`) of one call.
pub const MAX_WRITES_PER_CALL: usize = 1000;

/// What one call read and wrote.
#[derive(Debug)]
pub struct CallState {
    now_ms: u64,
    /// Committed entries fetched this call (`None`: no live key).
    base: HashMap<Vec<u8>, Option<Entry>>,
    /// The call's own writes, in the order each key was first written.
    writes: Vec<(Vec<u8>, Write)>,
    /// The version each checked key must still have at commit.
    checks: HashMap<Vec<u8>, u64>,
    write_count: usize,
}

/// What a call leaves to commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Each written key once, with the version it must still have when it
    /// was checked.
    pub writes: Vec<KeyWrite>,
}

impl Changes {
    /// The keys whose versions the commit depends on, with those versions.
    pub fn checks(&self) -> Vec<(Vec<u8>, u64)> {
        self.writes
            .iter()
            .filter_map(|w| w.expect.map(|v| (w.key.clone(), v)))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }
}

/// What answering a read needs first.
pub enum Lookup<T> {
    /// Answered from the call's own writes or what it fetched already.
    Known(T),
    /// The committed entry of the key must be fetched and remembered first.
    Fetch,
}

impl CallState {
    /// A call starting at `now_ms` (expiries count from it).
    pub fn new(now_ms: u64) -> Self {
        Self {
            now_ms,
            base: HashMap::new(),
            writes: Vec::new(),
            checks: HashMap::new(),
            write_count: 0,
        }
    }

    /// Whether the committed entry of `key` must be fetched before a read
    /// of it can be answered.
    pub fn needs(&self, key: &[u8]) -> bool {
        !self.base.contains_key(key) && self.own(key).is_none()
    }

    /// Whether the committed entry of `key` was fetched this call.
    pub fn has_fetched(&self, key: &[u8]) -> bool {
        self.base.contains_key(key)
    }

    /// Remembers the committed entry of `key`, as fetched.
    pub fn remember(&mut self, key: &[u8], entry: Option<Entry>) {
        let entry = entry.filter(|e| e.live_at(self.now_ms));
        self.base.insert(key.to_vec(), entry);
    }

    /// Whether a key may be used at all.
    pub fn check_key(key: &[u8]) -> Result<(), String> {
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

    /// `get`: the value, from the call's writes or the committed entry.
    pub fn get(&self, key: &[u8]) -> Lookup<Option<Vec<u8>>> {
        match self.own(key) {
            Some(Write::Put { value, .. }) => Lookup::Known(Some(value.clone())),
            Some(Write::Delete) => Lookup::Known(None),
            None => match self.base.get(key) {
                Some(entry) => Lookup::Known(entry.as_ref().map(|e| e.value.clone())),
                None => Lookup::Fetch,
            },
        }
    }

    /// `get-versioned`: the value and the committed version it is based on
    /// (a key only this call wrote has version [`ABSENT`]: a
    /// `set-if-version` with it then requires the key still not to exist).
    pub fn get_versioned(&self, key: &[u8]) -> Lookup<Option<(Vec<u8>, u64)>> {
        let Some(base) = self.base.get(key) else {
            return Lookup::Fetch;
        };
        let version = base.as_ref().map_or(ABSENT, |e| e.version);
        Lookup::Known(match self.own(key) {
            Some(Write::Put { value, .. }) => Some((value.clone(), version)),
            Some(Write::Delete) => None,
            None => base.as_ref().map(|e| (e.value.clone(), e.version)),
        })
    }

    /// `set`: last writer wins, no check.
    pub fn set(&mut self, key: &[u8], value: Vec<u8>, ttl_ms: Option<u64>) -> Result<(), String> {
        Self::check_key(key)?;
        check_value(&value)?;
        let expires_at_ms = self.expiry(ttl_ms)?;
        self.write(
            key,
            Write::Put {
                value,
                expires_at_ms,
            },
        )
    }

    /// `delete`: last writer wins, no check.
    pub fn delete(&mut self, key: &[u8]) -> Result<(), String> {
        Self::check_key(key)?;
        self.write(key, Write::Delete)
    }

    /// `increment`, once the key's committed entry is known (see
    /// [`CallState::needs`]): the new value. Based on a committed value, it
    /// is checked at commit; on the call's own write, it is not.
    pub fn increment(&mut self, key: &[u8], by: i64, ttl_ms: Option<u64>) -> Result<i64, String> {
        Self::check_key(key)?;
        let ttl = self.expiry(ttl_ms)?;
        let (current, expires, base_version) = match self.own(key) {
            Some(Write::Put {
                value,
                expires_at_ms,
            }) => (Some(value.clone()), *expires_at_ms, None),
            Some(Write::Delete) => (None, None, None),
            None => {
                let base = self
                    .base
                    .get(key)
                    .expect("increment is called once the key is fetched");
                (
                    base.as_ref().map(|e| e.value.clone()),
                    base.as_ref().and_then(|e| e.expires_at_ms),
                    Some(base.as_ref().map_or(ABSENT, |e| e.version)),
                )
            }
        };
        let current = match current {
            None => 0,
            Some(bytes) => parse_integer(key, &bytes)?,
        };
        let new = current.checked_add(by).ok_or_else(|| {
            format!(
                "incrementing {} by {by} overflows a 64-bit integer (it holds {current})",
                show_key(key)
            )
        })?;
        if let Some(version) = base_version {
            self.checks.entry(key.to_vec()).or_insert(version);
        }
        self.write(
            key,
            Write::Put {
                value: new.to_string().into_bytes(),
                expires_at_ms: ttl.or(expires),
            },
        )?;
        Ok(new)
    }

    /// `set-if-version`: sets the value, to be committed only if the key
    /// still has `version` ([`ABSENT`]: does not exist).
    pub fn set_if_version(
        &mut self,
        key: &[u8],
        value: Vec<u8>,
        version: u64,
        ttl_ms: Option<u64>,
    ) -> Result<(), String> {
        Self::check_key(key)?;
        check_value(&value)?;
        let expires_at_ms = self.expiry(ttl_ms)?;
        self.write(
            key,
            Write::Put {
                value,
                expires_at_ms,
            },
        )?;
        // A second check of the same key keeps the first: the commit
        // depends on what the call read first.
        self.checks.entry(key.to_vec()).or_insert(version);
        Ok(())
    }

    /// How many writes the call made.
    pub fn write_count(&self) -> usize {
        self.write_count
    }

    /// What the call leaves to commit.
    pub fn finish(self) -> Changes {
        let Self {
            writes, mut checks, ..
        } = self;
        Changes {
            writes: writes
                .into_iter()
                .map(|(key, write)| {
                    let expect = checks.remove(&key);
                    KeyWrite { key, write, expect }
                })
                .collect(),
        }
    }

    fn own(&self, key: &[u8]) -> Option<&Write> {
        self.writes.iter().find(|(k, _)| k == key).map(|(_, w)| w)
    }

    fn write(&mut self, key: &[u8], write: Write) -> Result<(), String> {
        if self.write_count >= MAX_WRITES_PER_CALL {
            return Err(format!(
                "a call makes at most {MAX_WRITES_PER_CALL} state writes; this would be write {}",
                self.write_count + 1
            ));
        }
        self.write_count += 1;
        match self.writes.iter_mut().find(|(k, _)| k == key) {
            Some((_, pending)) => *pending = write,
            None => self.writes.push((key.to_vec(), write)),
        }
        Ok(())
    }

    fn expiry(&self, ttl_ms: Option<u64>) -> Result<Option<u64>, String> {
        match ttl_ms {
            None => Ok(None),
            Some(0) => Err("ttl-ms must be at least 1 (none: the key never expires)".to_string()),
            Some(ttl) => Ok(Some(self.now_ms.saturating_add(ttl))),
        }
    }
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

/// The integer an `increment` adds to: ASCII decimal text.
fn parse_integer(key: &[u8], bytes: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| text.parse::<i64>().ok())
        .ok_or_else(|| {
            format!(
                "{} does not hold an integer (increment keeps decimal text such as \"6\"), so it cannot be incremented",
                show_key(key)
            )
        })
}

/// A key as an error names it: text when it is UTF-8, else hex.
pub fn show_key(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(text) => format!("the key {text:?}"),
        Err(_) => format!("the key 0x{}", hex::encode(key)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000;

    fn entry(value: &str, version: u64) -> Option<Entry> {
        Some(Entry {
            value: value.as_bytes().to_vec(),
            version,
            expires_at_ms: None,
        })
    }

    fn known<T>(lookup: Lookup<T>) -> T {
        match lookup {
            Lookup::Known(v) => v,
            Lookup::Fetch => panic!("should be known"),
        }
    }

    #[test]
    fn reads_see_the_committed_value_then_the_calls_own_writes() {
        let mut call = CallState::new(NOW);
        assert!(call.needs(b"k"));
        assert!(matches!(call.get(b"k"), Lookup::Fetch));
        call.remember(b"k", entry("old", 7));
        assert!(!call.needs(b"k"));
        assert_eq!(known(call.get(b"k")), Some(b"old".to_vec()));
        call.set(b"k", b"new".to_vec(), None).unwrap();
        assert_eq!(known(call.get(b"k")), Some(b"new".to_vec()));
        assert_eq!(
            known(call.get_versioned(b"k")),
            Some((b"new".to_vec(), 7)),
            "the version stays the committed one the write is based on"
        );
        call.delete(b"k").unwrap();
        assert_eq!(known(call.get(b"k")), None);
        let changes = call.finish();
        assert_eq!(
            changes.writes,
            [KeyWrite {
                key: b"k".to_vec(),
                write: Write::Delete,
                expect: None
            }],
            "one write per key, the last; a plain write is not checked"
        );
    }

    #[test]
    fn a_key_the_call_wrote_needs_no_fetch() {
        let mut call = CallState::new(NOW);
        call.set(b"k", b"v".to_vec(), Some(10)).unwrap();
        assert!(!call.needs(b"k"));
        assert_eq!(known(call.get(b"k")), Some(b"v".to_vec()));
        // get-versioned does need the committed version.
        assert!(matches!(call.get_versioned(b"k"), Lookup::Fetch));
    }

    #[test]
    fn an_expired_entry_reads_as_absent() {
        let mut call = CallState::new(NOW);
        call.remember(
            b"k",
            Some(Entry {
                value: b"v".to_vec(),
                version: 3,
                expires_at_ms: Some(NOW),
            }),
        );
        assert_eq!(known(call.get(b"k")), None);
        assert_eq!(known(call.get_versioned(b"k")), None);
    }

    #[test]
    fn increment_counts_in_decimal_text_and_is_checked_against_the_committed_version() {
        let mut call = CallState::new(NOW);
        call.remember(b"n", entry("41", 9));
        assert_eq!(call.increment(b"n", 1, None).unwrap(), 42);
        assert_eq!(call.increment(b"n", -2, None).unwrap(), 40);
        assert_eq!(known(call.get(b"n")), Some(b"40".to_vec()));
        call.remember(b"fresh", None);
        assert_eq!(call.increment(b"fresh", 5, Some(1000)).unwrap(), 5);
        let changes = call.finish();
        assert_eq!(
            changes.checks(),
            [(b"n".to_vec(), 9), (b"fresh".to_vec(), ABSENT)]
        );
        assert_eq!(
            changes.writes[1].write,
            Write::Put {
                value: b"5".to_vec(),
                expires_at_ms: Some(NOW + 1000)
            }
        );
    }

    #[test]
    fn increment_keeps_the_keys_expiry_unless_given_one() {
        let mut call = CallState::new(NOW);
        call.remember(
            b"n",
            Some(Entry {
                value: b"1".to_vec(),
                version: 2,
                expires_at_ms: Some(NOW + 500),
            }),
        );
        call.increment(b"n", 1, None).unwrap();
        let Write::Put { expires_at_ms, .. } = &call.finish().writes[0].write else {
            panic!()
        };
        assert_eq!(*expires_at_ms, Some(NOW + 500));
    }

    #[test]
    fn increment_on_the_calls_own_value_is_not_checked() {
        let mut call = CallState::new(NOW);
        call.set(b"n", b"10".to_vec(), None).unwrap();
        assert_eq!(call.increment(b"n", 1, None).unwrap(), 11);
        assert!(call.finish().checks().is_empty());
    }

    #[test]
    fn increment_refuses_what_is_not_an_integer_and_overflow() {
        let mut call = CallState::new(NOW);
        call.remember(b"text", entry("hello", 1));
        let error = call.increment(b"text", 1, None).unwrap_err();
        assert_eq!(
            error,
            "the key \"text\" does not hold an integer (increment keeps decimal text such as \"6\"), so it cannot be incremented"
        );
        call.remember(b"max", entry(&i64::MAX.to_string(), 1));
        let error = call.increment(b"max", 1, None).unwrap_err();
        assert!(error.contains("overflows a 64-bit integer"), "{error}");
        assert!(
            call.finish().is_empty(),
            "a refused increment writes nothing"
        );
    }

    #[test]
    fn set_if_version_is_checked_at_commit_against_what_the_call_read_first() {
        let mut call = CallState::new(NOW);
        call.set_if_version(b"k", b"a".to_vec(), 4, None).unwrap();
        call.set_if_version(b"k", b"b".to_vec(), 5, Some(100))
            .unwrap();
        let changes = call.finish();
        assert_eq!(
            changes.writes,
            [KeyWrite {
                key: b"k".to_vec(),
                write: Write::Put {
                    value: b"b".to_vec(),
                    expires_at_ms: Some(NOW + 100)
                },
                expect: Some(4)
            }]
        );
    }

    #[test]
    fn limits_are_named() {
        let mut call = CallState::new(NOW);
        assert_eq!(
            call.set(b"", b"v".to_vec(), None).unwrap_err(),
            "a state key must not be empty"
        );
        let long = vec![b'k'; MAX_KEY_BYTES + 1];
        assert_eq!(
            call.delete(&long).unwrap_err(),
            "a state key is at most 1024 bytes; this one is 1025"
        );
        let big = vec![0; MAX_VALUE_BYTES + 1];
        assert_eq!(
            call.set(b"k", big, None).unwrap_err(),
            "a state value is at most 1048576 bytes; this one is 1048577"
        );
        assert_eq!(
            call.set(b"k", b"v".to_vec(), Some(0)).unwrap_err(),
            "ttl-ms must be at least 1 (none: the key never expires)"
        );
        for i in 0..MAX_WRITES_PER_CALL {
            call.set(format!("k{i}").as_bytes(), b"v".to_vec(), None)
                .unwrap();
        }
        assert_eq!(
            call.set(b"one-more", b"v".to_vec(), None).unwrap_err(),
            "a call makes at most 1000 state writes; this would be write 1001"
        );
        assert_eq!(call.write_count(), MAX_WRITES_PER_CALL);
    }

    #[test]
    fn a_binary_key_is_named_in_hex() {
        assert_eq!(show_key(&[0xff, 0x00]), "the key 0xff00");
        assert_eq!(show_key(b"customer/7"), "the key \"customer/7\"");
    }
}
