//! The state tests' plugin (tests/tests/state.rs): counts its inputs in the
//! consumer's state.
//!
//! On each message: `n = state::increment(key, 1)`; with `per_message`,
//! also `state::set("m/{id}", body)` (with `ttl_ms` as its TTL when set);
//! then a busy wait of `spin_ms` on the host clock, so that calls handled
//! at once overlap and their increments conflict; with `out`, one output to
//! that exchange (routing key `tally`, body `n` as text), whose id the host
//! derives from the input's; with `fail_first`, a retry on attempt 1 (its
//! writes are then never committed). Otherwise it accepts.
//!
//! | `[consumers.config]` | default |
//! |---|---|
//! | `key` | `count` |
//! | `per_message` | `false` |
//! | `ttl_ms` | none |
//! | `spin_ms` | `0` |
//! | `out` | none |
//! | `fail_first` | `false` |
//!
//! A value that cannot be read retries the input, naming the key.

use std::time::Duration;

use acemq_guest::prelude::*;

const KEY: &str = "key";
const DEFAULT_KEY: &str = "count";
const PER_MESSAGE: &str = "per_message";
const TTL_MS: &str = "ttl_ms";
const SPIN_MS: &str = "spin_ms";
const OUT: &str = "out";
const FAIL_FIRST: &str = "fail_first";
/// The routing key of the output.
pub const ROUTING_KEY: &str = "tally";
/// The per-message keys are this and the message's envelope id.
pub const MESSAGE_PREFIX: &str = "m/";

acemq_guest::config_keys![
    "key",
    "per_message",
    "ttl_ms",
    "spin_ms",
    "out",
    "fail_first"
];

struct Tally;

impl Handler for Tally {
    fn handle(msg: Message) -> Result {
        let settings = Settings::from_config()?;
        let n = state::increment(&settings.key, 1)?;
        if settings.per_message {
            let key = format!("{MESSAGE_PREFIX}{}", msg.envelope().id);
            match settings.ttl {
                Some(ttl) => state::set_for(&key, msg.body(), ttl)?,
                None => state::set(&key, msg.body())?,
            }
        }
        spin(settings.spin_ms);
        if let Some(exchange) = &settings.out {
            publish(exchange, ROUTING_KEY).text(n.to_string()).send()?;
        }
        if settings.fail_first && msg.envelope().attempt <= 1 {
            return retry(format_args!(
                "tally fails attempt 1 (fail_first); its increment to {n} is not committed"
            ));
        }
        accept()
    }
}

/// Busy-waits `ms` milliseconds on the host's clock: the call holds its
/// instance (and whatever it read) all that time.
fn spin(ms: u64) {
    if ms == 0 {
        return;
    }
    let until = now_ms().saturating_add(ms);
    while now_ms() < until {
        std::hint::spin_loop();
    }
}

/// The consumer's settings.
#[derive(Debug, PartialEq, Eq)]
struct Settings {
    key: String,
    per_message: bool,
    ttl: Option<Duration>,
    spin_ms: u64,
    out: Option<String>,
    fail_first: bool,
}

impl Settings {
    fn from_config() -> Result<Self> {
        let key = config(KEY).unwrap_or_else(|| DEFAULT_KEY.to_owned());
        let ttl = number(TTL_MS)?
            .map(|ms| {
                (ms > 0)
                    .then(|| Duration::from_millis(ms))
                    .or_retry(format_args!(
                        "the consumer's config `{TTL_MS}` must be 1 or more"
                    ))
            })
            .transpose()?;
        Ok(Settings {
            key,
            per_message: flag(PER_MESSAGE)?,
            ttl,
            spin_ms: number(SPIN_MS)?.unwrap_or(0),
            out: config(OUT).filter(|out| !out.trim().is_empty()),
            fail_first: flag(FAIL_FIRST)?,
        })
    }
}

/// A `"true"`/`"false"` config key; absent is false.
fn flag(key: &str) -> Result<bool> {
    match config(key).as_deref().map(str::trim) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => retry(format_args!(
            "the consumer's config `{key}` must be \"true\" or \"false\", got {other:?}"
        )),
    }
}

/// A whole-number config key (milliseconds); absent is `None`.
fn number(key: &str) -> Result<Option<u64>> {
    let Some(text) = config(key) else {
        return Ok(None);
    };
    text.trim().parse().ok().map(Some).or_retry(format_args!(
        "the consumer's config `{key}` must be a whole number of milliseconds, got {text:?}"
    ))
}

acemq_guest::export_handler!(Tally);

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_guest::testing::{self, Handled, StateWrite, TestHost};

    fn tally(host: &TestHost, id: &str, body: &str) -> Handled {
        let mut msg = testing::message(body);
        msg.envelope_mut().id = id.into();
        host.handle::<Tally>(msg)
    }

    fn count(host: &TestHost, key: &str) -> Option<String> {
        host.state_get(key)
            .map(|v| String::from_utf8(v).expect("a counter is text"))
    }

    #[test]
    fn counts_each_message_under_count() {
        let host = TestHost::new();
        for i in 1..=3 {
            let done = tally(&host, &format!("m-{i}"), "x");
            assert_eq!(done.outcome, Outcome::Accept);
            assert_eq!(
                done.state_writes,
                [StateWrite::Increment {
                    key: b"count".to_vec(),
                    by: 1,
                    value: i,
                    ttl: None,
                }]
            );
            assert!(done.published.is_empty());
        }
        assert_eq!(count(&host, "count").as_deref(), Some("3"));
        assert_eq!(host.state_keys(), [b"count".to_vec()]);
    }

    #[test]
    fn the_key_is_configurable() {
        let host = TestHost::new().config(KEY, "tallies/a");
        tally(&host, "m-1", "x");
        assert_eq!(count(&host, "tallies/a").as_deref(), Some("1"));
        assert_eq!(count(&host, "count"), None);
    }

    #[test]
    fn per_message_sets_one_key_per_message_with_its_body() {
        let host = TestHost::new().config(PER_MESSAGE, "true");
        let done = tally(&host, "m-1", "first");
        assert_eq!(
            done.state_writes[1],
            StateWrite::Set {
                key: b"m/m-1".to_vec(),
                value: b"first".to_vec(),
                ttl: None,
            }
        );
        tally(&host, "m-2", "second");
        assert_eq!(
            host.state_keys(),
            [b"count".to_vec(), b"m/m-1".to_vec(), b"m/m-2".to_vec()]
        );
        assert_eq!(host.state_get("m/m-2"), Some(b"second".to_vec()));
    }

    #[test]
    fn ttl_ms_expires_the_per_message_keys() {
        let host = TestHost::new()
            .config(PER_MESSAGE, "true")
            .config(TTL_MS, "1500");
        let done = tally(&host, "m-1", "x");
        assert_eq!(
            done.state_writes[1],
            StateWrite::Set {
                key: b"m/m-1".to_vec(),
                value: b"x".to_vec(),
                ttl: Some(Duration::from_millis(1500)),
            }
        );
        let host = host.advance(Duration::from_millis(1499));
        assert!(host.state_get("m/m-1").is_some());
        let host = host.advance(Duration::from_millis(1));
        assert_eq!(host.state_get("m/m-1"), None);
        assert_eq!(count(&host, "count").as_deref(), Some("1"), "no TTL");
    }

    #[test]
    fn out_publishes_the_count_as_text() {
        let host = TestHost::new().config(OUT, "tallied");
        tally(&host, "m-1", "x");
        let done = tally(&host, "m-2", "x");
        assert_eq!(done.outcome, Outcome::Accept);
        let [output] = &done.published[..] else {
            panic!("one output expected: {:?}", done.published)
        };
        assert_eq!(output.exchange, "tallied");
        assert_eq!(output.routing_key, ROUTING_KEY);
        assert_eq!(output.body, b"2");
    }

    #[test]
    fn fail_first_retries_attempt_one_and_commits_nothing() {
        let host = TestHost::new().config(FAIL_FIRST, "true");
        let done = tally(&host, "m-1", "x");
        assert_eq!(
            done.outcome,
            Outcome::retry(
                "tally fails attempt 1 (fail_first); its increment to 1 is not committed"
            )
        );
        assert_eq!(count(&host, "count"), None, "a retry commits nothing");

        let mut again = testing::message("x");
        again.envelope_mut().attempt = 2;
        let done = host.handle::<Tally>(again);
        assert_eq!(done.outcome, Outcome::Accept);
        assert_eq!(count(&host, "count").as_deref(), Some("1"));
    }

    #[test]
    fn a_conflicting_increment_commits_nothing() {
        let host = TestHost::new().config(OUT, "tallied");
        host.state_set("count", "7");
        host.state_changes_during_next_call("count", "8");
        let done = tally(&host, "m-1", "x");
        assert_eq!(done.conflict, Some(b"count".to_vec()));
        assert_eq!(count(&host, "count").as_deref(), Some("8"));
        // The host runs it again, on the new value.
        let done = tally(&host, "m-1", "x");
        assert_eq!(done.conflict, None);
        assert_eq!(done.published[0].body, b"9");
        assert_eq!(count(&host, "count").as_deref(), Some("9"));
    }

    #[test]
    fn spin_ms_zero_does_not_wait() {
        // The test host's clock stands still, so only 0 can be run here;
        // the real host's clock moves (tests/tests/state.rs).
        let host = TestHost::new().config(SPIN_MS, "0");
        assert_eq!(tally(&host, "m-1", "x").outcome, Outcome::Accept);
    }

    #[test]
    fn a_consumer_without_state_retries_with_the_hosts_reason() {
        let done = tally(&TestHost::new().without_state(), "m-1", "x");
        assert_eq!(
            done.outcome,
            Outcome::retry(
                "state increment of key `count` failed: this consumer has no state store: \
                 set state = \"NAME\" in its [[consumers]] entry"
            )
        );
    }

    #[test]
    fn settings_that_cannot_be_read_retry_naming_the_key() {
        let retried = |key: &str, value: &str| {
            let done = tally(&TestHost::new().config(key, value), "m-1", "x");
            assert!(done.state_writes.is_empty(), "{key}={value:?}");
            match done.outcome {
                Outcome::Retry(reason) => reason,
                other => panic!("{key}={value:?}: a retry expected, got {other:?}"),
            }
        };
        assert_eq!(
            retried(SPIN_MS, "soon"),
            "the consumer's config `spin_ms` must be a whole number of milliseconds, got \"soon\""
        );
        assert_eq!(
            retried(TTL_MS, "0"),
            "the consumer's config `ttl_ms` must be 1 or more"
        );
        assert_eq!(
            retried(PER_MESSAGE, "yes"),
            "the consumer's config `per_message` must be \"true\" or \"false\", got \"yes\""
        );
        assert_eq!(
            retried(FAIL_FIRST, "1"),
            "the consumer's config `fail_first` must be \"true\" or \"false\", got \"1\""
        );
    }
}
