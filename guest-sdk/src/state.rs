//! The consumer's key-value state (`acemq:plugin/state`): counters, velocity
//! windows, de-duplication sets, small aggregates kept between calls.
//!
//! The host keeps the state in a namespace that the consumer names with
//! `state = "NAME"` in its `[[consumers]]` entry; `docs/state.md` in the
//! repository is the whole story. In short:
//!
//! - **Keys and values are bytes.** Every function takes a key as anything
//!   that is bytes (`"customer/c-42"`, a `String`, a `Vec<u8>`). A key is 1
//!   to [`MAX_KEY_BYTES`] bytes, a value at most [`MAX_VALUE_BYTES`], and a
//!   call makes at most [`MAX_WRITES`] writes; past a limit the call fails
//!   with an error naming it.
//! - **Reads see committed state plus this call's own writes.** A [`get`]
//!   after a [`set`] in the same call returns the new value.
//! - **Writes are buffered like outputs.** They are committed only when the
//!   handler [`accept`](crate::accept)s, after its outputs are confirmed and
//!   before the input is acked. A call that retries, rejects or parks leaves
//!   no write behind, and a redelivered input already done is acked without
//!   calling the plugin: state changes once per input.
//! - **[`increment`] and [`set_if_version`] depend on what the call read.**
//!   If another input changed such a key between the call and its commit,
//!   the host runs the call again on fresh state (up to 5 times; then the
//!   input fails, naming the conflict). Nothing a conflicted run published is
//!   sent. Plain [`set`] and [`delete`] are last-writer-wins.
//! - **A TTL** (the `_for` functions) expires a key that long after the
//!   write; without one a key never expires ([`increment`] without one keeps
//!   the key's own expiry).
//!
//! Every function returns a [`StateError`] when the host refuses the call
//! (a limit, a value [`increment`] cannot add to, a consumer without a state
//! store) or, for the text and JSON helpers, when the value cannot be read
//! or written as such. It converts into [`Outcome::Retry`], so `?` ends the
//! handler with a retry that names the operation, the key and the reason.
//!
//! ```
//! use acemq_guest::prelude::*;
//!
//! /// Counts each customer's orders, parking the eleventh of a day.
//! struct Counter;
//! impl Handler for Counter {
//!     fn handle(msg: Message) -> Result {
//!         let customer = msg.text()?;
//!         let key = format!("orders/{customer}");
//!         let today = state::increment_for(&key, 1, std::time::Duration::from_secs(86_400))?;
//!         if today > 10 {
//!             return park(format_args!("customer {customer}: {today} orders today"));
//!         }
//!         accept()
//!     }
//! }
//! # use acemq_guest::testing::{self, TestHost};
//! # let host = TestHost::new();
//! # for _ in 0..10 {
//! #     assert_eq!(host.handle::<Counter>(testing::message("c-1")).outcome, Outcome::Accept);
//! # }
//! # let done = host.handle::<Counter>(testing::message("c-1"));
//! # assert_eq!(done.outcome, Outcome::park("customer c-1: 11 orders today"));
//! # assert_eq!(host.state_get("orders/c-1"), Some(b"10".to_vec()), "a park commits nothing");
//! ```
//!
//! Natively, these functions talk to the [`TestHost`](crate::testing::TestHost),
//! which keeps a namespace in memory (see its `state` part).

use core::fmt;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::host::sys::state as sys;
use crate::outcome::Outcome;

/// The most bytes in a key (and the fewest: 1).
pub const MAX_KEY_BYTES: usize = 1024;

/// The most bytes in a value: 1 MiB.
pub const MAX_VALUE_BYTES: usize = 1_048_576;

/// The most writes ([`set`], [`delete`], [`increment`], [`set_if_version`]
/// and their helpers) one call may make.
pub const MAX_WRITES: usize = 1000;

/// The version [`set_if_version`] expects of a key that must not exist yet.
pub const ABSENT: u64 = 0;

/// The value of `key`, `None` when it is not set (or has expired).
///
/// ```
/// # acemq_guest::testing::TestHost::new().run(|| -> acemq_guest::Result<()> {
/// use acemq_guest::state;
///
/// state::set("greeting", "hello")?;
/// assert_eq!(state::get("greeting")?, Some(b"hello".to_vec()));
/// assert_eq!(state::get("nobody")?, None);
/// # Ok(()) }).value.unwrap();
/// ```
pub fn get(key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, StateError> {
    let key = key.as_ref();
    sys::get(key).map_err(|problem| StateError::new("get", key, problem))
}

/// [`get`] as UTF-8 text. A value that is not UTF-8 is an error.
///
/// ```
/// # acemq_guest::testing::TestHost::new().run(|| -> acemq_guest::Result<()> {
/// use acemq_guest::state;
///
/// state::increment("visits", 6)?;
/// assert_eq!(state::get_text("visits")?.as_deref(), Some("6"));
/// # Ok(()) }).value.unwrap();
/// ```
pub fn get_text(key: impl AsRef<[u8]>) -> Result<Option<String>, StateError> {
    let key = key.as_ref();
    let Some(value) = get(key)? else {
        return Ok(None);
    };
    String::from_utf8(value)
        .map(Some)
        .map_err(|e| StateError::new("get", key, format!("the value is not UTF-8 text: {e}")))
}

/// [`get`] deserialized from JSON. A value that is not a valid `T` is an
/// error.
///
/// ```
/// # acemq_guest::testing::TestHost::new().run(|| -> acemq_guest::Result<()> {
/// use acemq_guest::state;
///
/// state::set_json("seen", &["o-1", "o-2"])?;
/// let seen: Vec<String> = state::get_json("seen")?.unwrap_or_default();
/// assert_eq!(seen, ["o-1", "o-2"]);
/// # Ok(()) }).value.unwrap();
/// ```
pub fn get_json<T: DeserializeOwned>(key: impl AsRef<[u8]>) -> Result<Option<T>, StateError> {
    let key = key.as_ref();
    get(key)?
        .map(|value| from_json(key, "get", &value))
        .transpose()
}

/// Sets `key` to `value`, with no expiry (a TTL the key had is dropped).
pub fn set(key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<(), StateError> {
    set_with(key.as_ref(), value.as_ref(), None)
}

/// Sets `key` to `value`, expiring `ttl` after now (whole milliseconds,
/// rounded up; a zero `ttl` is refused).
///
/// ```
/// # acemq_guest::testing::TestHost::new().run(|| -> acemq_guest::Result<()> {
/// use std::time::Duration;
/// use acemq_guest::state;
///
/// state::set_for("session/42", "open", Duration::from_secs(30 * 60))?;
/// # Ok(()) }).value.unwrap();
/// ```
pub fn set_for(
    key: impl AsRef<[u8]>,
    value: impl AsRef<[u8]>,
    ttl: Duration,
) -> Result<(), StateError> {
    set_with(key.as_ref(), value.as_ref(), Some(ttl))
}

/// [`set`] with `value` serialized as JSON.
pub fn set_json<T: Serialize + ?Sized>(key: impl AsRef<[u8]>, value: &T) -> Result<(), StateError> {
    let key = key.as_ref();
    set_with(key, &to_json(key, "set", value)?, None)
}

/// [`set_for`] with `value` serialized as JSON.
pub fn set_json_for<T: Serialize + ?Sized>(
    key: impl AsRef<[u8]>,
    value: &T,
    ttl: Duration,
) -> Result<(), StateError> {
    let key = key.as_ref();
    set_with(key, &to_json(key, "set", value)?, Some(ttl))
}

fn set_with(key: &[u8], value: &[u8], ttl: Option<Duration>) -> Result<(), StateError> {
    sys::set(key, value, ttl.map(ttl_ms)).map_err(|problem| StateError::new("set", key, problem))
}

/// Removes `key` (nothing happens when it is not set).
pub fn delete(key: impl AsRef<[u8]>) -> Result<(), StateError> {
    let key = key.as_ref();
    sys::delete(key).map_err(|problem| StateError::new("delete", key, problem))
}

/// Adds `by` (negative to subtract) to the integer at `key`, 0 when it is
/// not set, and returns the new value. The key keeps its expiry.
///
/// The value is stored as ASCII decimal text (`b"6"`), so [`get_text`]
/// reads it as `"6"` and `set(key, "5")` sets a counter. A value that is not
/// such an integer, or a sum past the range of `i64`, is an error.
///
/// The result depends on what the call read: if another input changes the
/// key before this call's commit, the host runs the call again (see the
/// [module](self)). An increment of a value this call wrote itself depends
/// on nothing.
///
/// ```
/// # acemq_guest::testing::TestHost::new().run(|| -> acemq_guest::Result<()> {
/// use acemq_guest::state;
///
/// assert_eq!(state::increment("stock/sku-1", 10)?, 10);
/// assert_eq!(state::increment("stock/sku-1", -3)?, 7);
/// assert_eq!(state::get("stock/sku-1")?, Some(b"7".to_vec()));
/// # Ok(()) }).value.unwrap();
/// ```
pub fn increment(key: impl AsRef<[u8]>, by: i64) -> Result<i64, StateError> {
    increment_with(key.as_ref(), by, None)
}

/// [`increment`], and the key then expires `ttl` after now (whole
/// milliseconds, rounded up; a zero `ttl` is refused): a counter per time
/// window.
pub fn increment_for(key: impl AsRef<[u8]>, by: i64, ttl: Duration) -> Result<i64, StateError> {
    increment_with(key.as_ref(), by, Some(ttl))
}

fn increment_with(key: &[u8], by: i64, ttl: Option<Duration>) -> Result<i64, StateError> {
    sys::increment(key, by, ttl.map(ttl_ms))
        .map_err(|problem| StateError::new("increment", key, problem))
}

/// A value and the version it had when it was read, for [`set_if_version`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned<T = Vec<u8>> {
    /// The value.
    pub value: T,
    /// Its version: unique within the namespace and never reused (a key
    /// deleted and written again has a new one), never [`ABSENT`] for a
    /// committed value. A key this call has written has no version of its
    /// own until the commit: it shows the version of the committed value the
    /// write replaces ([`ABSENT`] when none), which is what
    /// [`set_if_version`] compares with.
    pub version: u64,
}

/// The value of `key` with its version, `None` when it is not set (or has
/// expired). Hand the version to [`set_if_version`] to write only if no
/// other input changed the key in between; for a key that is not set, use
/// [`ABSENT`].
pub fn get_versioned(key: impl AsRef<[u8]>) -> Result<Option<Versioned>, StateError> {
    let key = key.as_ref();
    sys::get_versioned(key)
        .map(|found| found.map(|(value, version)| Versioned { value, version }))
        .map_err(|problem| StateError::new("get_versioned", key, problem))
}

/// [`get_versioned`] deserialized from JSON. A value that is not a valid `T`
/// is an error.
pub fn get_versioned_json<T: DeserializeOwned>(
    key: impl AsRef<[u8]>,
) -> Result<Option<Versioned<T>>, StateError> {
    let key = key.as_ref();
    let Some(found) = get_versioned(key)? else {
        return Ok(None);
    };
    Ok(Some(Versioned {
        value: from_json(key, "get_versioned", &found.value)?,
        version: found.version,
    }))
}

/// Sets `key` to `value` only if its version is still `version` when the
/// input settles ([`ABSENT`]: only if the key does not exist), expiring
/// `ttl` after now when given, never otherwise.
///
/// `version` is compared with the committed key's, whatever this call
/// wrote to it before, and the first check of a key in a call is the one
/// kept: read with [`get_versioned`] before writing the key.
///
/// The check is the host's, at the commit: if another input changed the key
/// since this call read it, nothing the call wrote is committed and the
/// host runs the call again on fresh state, so a read-modify-write with
/// [`get_versioned`] never loses an update. The call itself goes on as if
/// the write applied.
///
/// ```
/// # acemq_guest::testing::TestHost::new().run(|| -> acemq_guest::Result<()> {
/// use acemq_guest::state;
///
/// // Appends an order id to the customer's list.
/// let key = "orders-of/c-42";
/// let (mut ids, version) = match state::get_versioned_json::<Vec<String>>(key)? {
///     Some(found) => (found.value, found.version),
///     None => (Vec::new(), state::ABSENT),
/// };
/// ids.push("o-7".into());
/// state::set_json_if_version(key, &ids, version, None)?;
/// # Ok(()) }).value.unwrap();
/// ```
pub fn set_if_version(
    key: impl AsRef<[u8]>,
    value: impl AsRef<[u8]>,
    version: u64,
    ttl: Option<Duration>,
) -> Result<(), StateError> {
    set_if_version_with(key.as_ref(), value.as_ref(), version, ttl)
}

/// [`set_if_version`] with `value` serialized as JSON.
pub fn set_json_if_version<T: Serialize + ?Sized>(
    key: impl AsRef<[u8]>,
    value: &T,
    version: u64,
    ttl: Option<Duration>,
) -> Result<(), StateError> {
    let key = key.as_ref();
    let value = to_json(key, "set_if_version", value)?;
    set_if_version_with(key, &value, version, ttl)
}

fn set_if_version_with(
    key: &[u8],
    value: &[u8],
    version: u64,
    ttl: Option<Duration>,
) -> Result<(), StateError> {
    sys::set_if_version(key, value, version, ttl.map(ttl_ms))
        .map_err(|problem| StateError::new("set_if_version", key, problem))
}

/// A TTL in whole milliseconds, rounded up (so that a TTL under a
/// millisecond does not expire the key at once), saturating at `u64::MAX`.
fn ttl_ms(ttl: Duration) -> u64 {
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

fn to_json<T: Serialize + ?Sized>(
    key: &[u8],
    operation: &'static str,
    value: &T,
) -> Result<Vec<u8>, StateError> {
    serde_json::to_vec(value).map_err(|e| {
        StateError::new(
            operation,
            key,
            format!("the value could not be serialized as JSON: {e}"),
        )
    })
}

fn from_json<T: DeserializeOwned>(
    key: &[u8],
    operation: &'static str,
    value: &[u8],
) -> Result<T, StateError> {
    serde_json::from_slice(value).map_err(|e| {
        StateError::new(
            operation,
            key,
            format!(
                "the value is not a valid {}: {e}",
                crate::message::short_type_name::<T>()
            ),
        )
    })
}

/// A state call that failed: the host refused it (a limit, a value
/// [`increment`] cannot add to, a consumer without a state store), or the
/// value could not be read or written as text or JSON. Nothing was written.
///
/// Converts into [`Outcome::Retry`]: the usual causes (no `state` in the
/// consumer's config, a store that cannot be reached) are for an operator
/// to fix while the retry policy holds the message. Use
/// [`OrOutcome`](crate::OrOutcome) or `map_err` to decide otherwise.
///
/// ```
/// use acemq_guest::prelude::*;
/// use acemq_guest::testing::{self, TestHost};
///
/// struct Tally;
/// impl Handler for Tally {
///     fn handle(_: Message) -> Result {
///         state::increment("tally", 1)?;
///         accept()
///     }
/// }
///
/// let done = TestHost::new().without_state().handle::<Tally>(testing::message(""));
/// assert_eq!(done.outcome, Outcome::retry(
///     "state increment of key `tally` failed: this consumer has no state store: \
///      set state = \"NAME\" in its [[consumers]] entry"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateError {
    operation: &'static str,
    key: Vec<u8>,
    problem: String,
}

impl StateError {
    fn new(operation: &'static str, key: &[u8], problem: String) -> Self {
        StateError {
            operation,
            key: key.to_vec(),
            problem,
        }
    }

    /// The call that failed, as the host's metrics name it: `get`, `set`,
    /// `delete`, `increment`, `get_versioned`, `set_if_version`.
    pub fn operation(&self) -> &str {
        self.operation
    }

    /// The key it was for.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// What went wrong: the host's message, or the serializer's.
    pub fn reason(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "state {} of key `{}` failed: {}",
            self.operation,
            shown_key(&self.key),
            self.problem
        )
    }
}

impl std::error::Error for StateError {}

impl From<StateError> for Outcome {
    fn from(e: StateError) -> Self {
        Outcome::Retry(e.to_string())
    }
}

/// A key as a reason shows it: its text when it is UTF-8, else `0x` and
/// hex; the first 64 bytes, then `...`.
pub(crate) fn shown_key(key: &[u8]) -> String {
    const SHOWN: usize = 64;
    let more = if key.len() > SHOWN { "..." } else { "" };
    match core::str::from_utf8(key) {
        Ok(text) => {
            let mut end = text.len().min(SHOWN);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}{more}", &text[..end])
        }
        Err(_) => {
            let hex: String = key.iter().take(SHOWN).map(|b| format!("{b:02x}")).collect();
            format!("0x{hex}{more}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestHost;

    #[test]
    fn ttls_are_whole_milliseconds_rounded_up() {
        assert_eq!(ttl_ms(Duration::ZERO), 0);
        assert_eq!(ttl_ms(Duration::from_nanos(1)), 1);
        assert_eq!(ttl_ms(Duration::from_millis(1500)), 1500);
        assert_eq!(ttl_ms(Duration::new(1, 1)), 1001);
        assert_eq!(ttl_ms(Duration::MAX), u64::MAX);
    }

    #[test]
    fn keys_are_shown_as_text_or_hex_and_cut() {
        assert_eq!(shown_key(b"customer/c-42"), "customer/c-42");
        assert_eq!(shown_key(&[0xff, 0x00, 0x10]), "0xff0010");
        let long = "k".repeat(100);
        assert_eq!(shown_key(long.as_bytes()), format!("{}...", "k".repeat(64)));
        // Not cut inside a character.
        let wide = "é".repeat(40);
        assert_eq!(shown_key(wide.as_bytes()), format!("{}...", "é".repeat(32)));
    }

    #[test]
    fn errors_name_the_operation_the_key_and_the_reason_and_retry() {
        let ran = TestHost::new().run(|| {
            set("n", "six")?;
            increment("n", 1)
        });
        let err = ran.value.unwrap_err();
        assert_eq!((err.operation(), err.key()), ("increment", &b"n"[..]));
        assert!(err.reason().contains("does not hold an integer"), "{err}");
        let Outcome::Retry(reason) = Outcome::from(err) else {
            panic!("a retry expected")
        };
        assert!(
            reason.starts_with("state increment of key `n` failed: "),
            "{reason}"
        );
    }

    #[test]
    fn text_and_json_helpers_name_what_they_could_not_read() {
        let host = TestHost::new();
        host.state_set("bytes", [0xff, 0xfe]);
        host.state_set("text", "not json");
        let ran = host.run(|| {
            (
                get_text("bytes").unwrap_err(),
                get_json::<Vec<u64>>("text").unwrap_err(),
                get_versioned_json::<Vec<u64>>("text").unwrap_err(),
                get_text("missing"),
                get_json::<u8>("missing"),
                get_versioned_json::<u8>("missing"),
            )
        });
        let (not_utf8, not_json, not_json_versioned, missing_text, missing_json, missing_v) =
            ran.value;
        assert!(not_utf8.reason().starts_with("the value is not UTF-8 text"));
        assert!(
            not_json
                .reason()
                .starts_with("the value is not a valid Vec<u64>: "),
            "{not_json}"
        );
        assert_eq!(not_json_versioned.operation(), "get_versioned");
        assert_eq!(missing_text, Ok(None));
        assert_eq!(missing_json, Ok(None));
        assert_eq!(missing_v, Ok(None));
    }

    #[test]
    fn an_unserializable_value_writes_nothing() {
        use std::collections::HashMap;
        let bad: HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let ran = TestHost::new().run(|| {
            (
                set_json("k", &bad).unwrap_err(),
                set_json_for("k", &bad, Duration::from_secs(1)).unwrap_err(),
                set_json_if_version("k", &bad, ABSENT, None).unwrap_err(),
            )
        });
        let (plain, for_ttl, if_version) = ran.value;
        assert!(
            plain
                .reason()
                .starts_with("the value could not be serialized as JSON")
        );
        assert_eq!(for_ttl.operation(), "set");
        assert_eq!(if_version.operation(), "set_if_version");
        assert!(ran.state_writes.is_empty());
    }

    #[test]
    fn versioned_json_round_trips_with_its_version() {
        let host = TestHost::new();
        host.state_set("list", "[1,2]");
        let version = host.state_version("list").expect("set");
        let ran = host.run(|| {
            let found = get_versioned_json::<Vec<u8>>("list")?.expect("set");
            assert_eq!(
                found,
                Versioned {
                    value: vec![1, 2],
                    version
                }
            );
            set_json_if_version("list", &[1, 2, 3], found.version, None)
        });
        assert_eq!(ran.value, Ok(()));
        assert_eq!(ran.conflict, None);
        assert_eq!(host.state_get("list"), Some(b"[1,2,3]".to_vec()));
        assert_ne!(host.state_version("list"), Some(version), "a new version");
    }
}
