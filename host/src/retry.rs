//! Retry policies (AceMQ contract §3): how many times a failed message is
//! tried again, how long each wait is, and whether the wait is held in this
//! process or on a broker rung queue.
//!
//! Everything here is pure arithmetic over plain data, so the conformance
//! fixture can pin it without a broker. The random number behind jitter is an
//! input, for the same reason.

use std::fmt;
use std::time::Duration;

use crate::config::RetryConfig;

/// Delays at or above this wait on a broker rung queue unless a policy says
/// otherwise (`defaultBrokerWaitThresholdMillis` in the contract fixture).
pub const DEFAULT_BROKER_THRESHOLD: Duration = Duration::from_secs(30);

/// Jitter of an exponential policy: ±20 %, the factor every library uses
/// since Java's 10 % was aligned with the others.
pub const DEFAULT_EXPONENTIAL_JITTER: f64 = 0.2;

/// The longest per-queue message TTL RabbitMQ accepts (`x-message-ttl`), in
/// milliseconds: its expiry timers are 32-bit. A longer rung would be refused
/// by the broker with PRECONDITION_FAILED when the topology is applied.
pub const MAX_RUNG_TTL_MILLIS: u128 = u32::MAX as u128;

/// The longest a retry may be held unacknowledged in the consumer. RabbitMQ
/// closes the channel of a delivery left unacknowledged for its
/// `consumer_timeout` (30 minutes by default), which would fail every other
/// delivery on that channel; half of it leaves room for the handler's own
/// time and a clock that runs slow.
pub const LONGEST_CONSUMER_WAIT: Duration = Duration::from_secs(15 * 60);

/// A retry policy: the contract's fields, one to one.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Total deliveries, the first included; 1 means never retry.
    pub max_attempts: u32,
    /// The first delay.
    pub initial: Duration,
    /// Growth per retry: 2 for exponential, 1 for fixed.
    pub multiplier: u32,
    /// Cap on each delay; `None` = uncapped.
    pub max: Option<Duration>,
    /// Jitter factor in [0, 1], applied both ways to waits held in the consumer.
    pub jitter: f64,
    /// Give up once a message is at least this old; `None` (or zero) = no limit.
    pub max_age: Option<Duration>,
    /// Delays at or above this wait on a broker rung; `ZERO` = never use the broker.
    pub broker_threshold: Duration,
}

/// What to do with a message whose handling just failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Stop retrying: the message goes to `{queue}.dlq`.
    GiveUp(GiveUp),
    /// Try again after `delay` (the scheduled delay, before any jitter).
    Wait { delay: Duration, place: WaitPlace },
}

/// Where a retry wait is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitPlace {
    /// The consumer holds the message unacked for a jittered delay.
    Consumer,
    /// The message is republished to the rung queue `{queue}.retry.{delay}`,
    /// whose TTL sends it back; never jittered, because the delay names the queue.
    Broker,
}

/// Why a policy stopped retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// Every attempt the policy allows has been made.
    Exhausted { attempts: u32 },
    /// The message reached the policy's maximum age.
    TooOld { max_age: Duration },
}

impl GiveUp {
    /// The `x-acemq-error` text of the dead-lettered copy, given why the last
    /// attempt failed (contract §5, Python's wording).
    pub fn error_text(&self, reason: &str) -> String {
        match *self {
            GiveUp::Exhausted { attempts: 1 } => format!("exhausted 1 attempt: {reason}"),
            GiveUp::Exhausted { attempts } => format!("exhausted {attempts} attempts: {reason}"),
            GiveUp::TooOld { max_age } => format!(
                "exceeded the maximum message age of {}: {reason}",
                humantime::format_duration(max_age)
            ),
        }
    }
}

impl fmt::Display for GiveUp {
    /// A short description for logs, without the failure reason.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            GiveUp::Exhausted { attempts } => write!(f, "exhausted after {attempts} attempt(s)"),
            GiveUp::TooOld { max_age } => write!(
                f,
                "older than the maximum message age of {}",
                humantime::format_duration(max_age)
            ),
        }
    }
}

impl RetryPolicy {
    /// Never retry: the first failure dead-letters (the contract's default).
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            initial: Duration::ZERO,
            multiplier: 1,
            max: None,
            jitter: 0.0,
            max_age: None,
            broker_threshold: DEFAULT_BROKER_THRESHOLD,
        }
    }

    /// `attempts` deliveries in all, `delay` between each; no jitter.
    pub fn fixed(attempts: u32, delay: Duration) -> Self {
        Self {
            max_attempts: attempts,
            initial: delay,
            ..Self::none()
        }
    }

    /// `attempts` deliveries in all; delays `initial`, doubling each time,
    /// each capped at `max`; jitter 0.2.
    pub fn exponential(attempts: u32, initial: Duration, max: Duration) -> Self {
        Self {
            max_attempts: attempts,
            initial,
            multiplier: 2,
            max: Some(max),
            jitter: DEFAULT_EXPONENTIAL_JITTER,
            ..Self::none()
        }
    }

    /// Sets the jitter factor (meant to be in [0, 1]; see [`RetryPolicy::check`]).
    pub fn with_jitter(mut self, factor: f64) -> Self {
        self.jitter = factor;
        self
    }

    /// Gives up on a message once it is `age` old; zero means no limit.
    pub fn give_up_after(mut self, age: Duration) -> Self {
        self.max_age = (!age.is_zero()).then_some(age);
        self
    }

    /// Holds delays at or above `threshold` on broker rungs; zero = never.
    pub fn wait_in_broker_from(mut self, threshold: Duration) -> Self {
        self.broker_threshold = threshold;
        self
    }

    /// Builds the policy `[retry.NAME]` describes, refusing values no AceMQ
    /// library would accept. Every message names the table and the key.
    pub fn from_config(name: &str, cfg: &RetryConfig) -> Result<Self, String> {
        let table = format!("[retry.{name}]");
        let kind = cfg.kind.as_str();
        let mut policy = match kind {
            "none" => {
                // A "none" policy with a delay or an age limit is a contradiction
                // the operator should resolve, not one we should guess about.
                let unused = [
                    ("attempts", cfg.attempts.is_some_and(|n| n != 1)),
                    ("initial", cfg.initial.is_some()),
                    ("max", cfg.max.is_some()),
                    ("jitter", cfg.jitter.is_some()),
                    ("give_up_after", cfg.give_up_after.is_some()),
                    ("wait_in_broker_from", cfg.wait_in_broker_from.is_some()),
                ];
                if let Some((key, _)) = unused.iter().find(|(_, set)| *set) {
                    return Err(format!(
                        "{table} {key}: kind = \"none\" never retries, so it takes no {key}; remove it or choose kind = \"fixed\" or \"exponential\""
                    ));
                }
                Self::none()
            }
            "fixed" | "exponential" => {
                let attempts = match cfg.attempts {
                    None => {
                        return Err(format!(
                            "{table} attempts: missing; say how many deliveries to make in all, the first included (1 = no retry)"
                        ));
                    }
                    Some(0) => {
                        return Err(format!(
                            "{table} attempts: must be at least 1 (the first delivery is attempt 1)"
                        ));
                    }
                    Some(n) => n,
                };
                let Some(initial) = cfg.initial else {
                    return Err(format!(
                        "{table} initial: missing; a {kind} policy needs its first delay, such as initial = \"10s\""
                    ));
                };
                if kind == "fixed" {
                    if cfg.max.is_some() {
                        return Err(format!(
                            "{table} max: a fixed policy's delays never grow, so it takes no max; remove it or choose kind = \"exponential\""
                        ));
                    }
                    Self::fixed(attempts, initial)
                } else {
                    if let Some(max) = cfg.max
                        && max < initial
                    {
                        return Err(format!(
                            "{table} max: {} is shorter than initial {}, so every delay would be {}; raise max or lower initial",
                            humantime::format_duration(max),
                            humantime::format_duration(initial),
                            humantime::format_duration(max),
                        ));
                    }
                    // No max means uncapped, which the factory has no spelling for.
                    let mut policy = Self::exponential(attempts, initial, Duration::MAX);
                    policy.max = cfg.max;
                    policy
                }
            }
            other => {
                return Err(format!(
                    "{table} kind: unknown kind '{other}'; use none, fixed or exponential"
                ));
            }
        };
        if let Some(jitter) = cfg.jitter {
            if !(0.0..=1.0).contains(&jitter) {
                return Err(format!(
                    "{table} jitter: {jitter} is outside [0, 1]; it is the fraction by which a wait held in the consumer may be shortened or lengthened"
                ));
            }
            policy = policy.with_jitter(jitter);
        }
        if let Some(age) = cfg.give_up_after {
            policy = policy.give_up_after(age);
        }
        if let Some(threshold) = cfg.wait_in_broker_from {
            policy = policy.wait_in_broker_from(threshold);
        }
        policy
            .check()
            .map_err(|problem| format!("{table}: {problem}"))?;
        Ok(policy)
    }

    /// Refuses a policy that no AceMQ library could share a broker with:
    /// attempts of zero, jitter outside [0, 1], and broker rungs that are not
    /// whole seconds (interop invariant 4) or longer than RabbitMQ's TTL limit.
    pub fn check(&self) -> Result<(), String> {
        if self.max_attempts == 0 {
            return Err("attempts must be at least 1 (the first delivery is attempt 1)".into());
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(format!(
                "the jitter factor {} is outside [0, 1]",
                self.jitter
            ));
        }
        if let Some(held) = self.longest_consumer_wait()
            && held > LONGEST_CONSUMER_WAIT
        {
            return Err(format!(
                "a retry would be held in the consumer for up to {}, and at most {} is allowed: RabbitMQ closes the channel of a delivery left unacknowledged for its consumer_timeout (30 minutes by default); lower max, or let long delays wait on a broker rung (wait_in_broker_from below them)",
                humantime::format_duration(held),
                humantime::format_duration(LONGEST_CONSUMER_WAIT)
            ));
        }
        for rung in self.broker_rungs() {
            let shown = humantime::format_duration(rung);
            if rung.subsec_nanos() != 0 {
                return Err(format!(
                    "the delay {shown} would wait on a broker rung queue, and rung names are whole seconds in every AceMQ library; use whole seconds or raise wait_in_broker_from above it"
                ));
            }
            if rung.as_millis() > MAX_RUNG_TTL_MILLIS {
                return Err(format!(
                    "the delay {shown} would wait on a broker rung queue, and RabbitMQ accepts a queue message TTL of at most {MAX_RUNG_TTL_MILLIS} ms (about 49 days); use a shorter max or give up sooner"
                ));
            }
        }
        Ok(())
    }

    /// The delay before retry number `k + 1` (k from 0): `min(initial × m^k, max)`.
    /// Exact in nanoseconds, saturating at `Duration::MAX` instead of
    /// overflowing, so a long uncapped ladder stays finite.
    pub fn delay(&self, k: u32) -> Duration {
        if self.initial.is_zero() {
            return Duration::ZERO;
        }
        let grown = u128::from(self.multiplier)
            .checked_pow(k)
            .and_then(|factor| self.initial.as_nanos().checked_mul(factor))
            .map_or(Duration::MAX, duration_from_nanos);
        match self.max {
            Some(max) => grown.min(max),
            None => grown,
        }
    }

    /// Every scheduled delay in order: `max_attempts - 1` of them (use
    /// [`RetryPolicy::delay`] rather than this for a policy of huge attempts).
    pub fn schedule(&self) -> Vec<Duration> {
        (0..self.max_attempts.saturating_sub(1))
            .map(|k| self.delay(k))
            .collect()
    }

    /// The distinct delays that wait on a broker rung, in order of first
    /// appearance: one rung queue is declared for each.
    pub fn broker_rungs(&self) -> Vec<Duration> {
        let mut rungs = Vec::new();
        for k in 0..self.max_attempts.saturating_sub(1) {
            let delay = self.delay(k);
            if self.waits_in_broker(delay) && !rungs.contains(&delay) {
                rungs.push(delay);
            }
            // Once a step stops growing (capped, saturated, fixed or zero),
            // every later delay is this one: a policy with millions of
            // attempts costs no more than a short one.
            if self.delay(k + 1) == delay {
                break;
            }
        }
        rungs
    }

    /// The longest wait held in the consumer, jitter included; `None` when
    /// every wait is on a broker rung (or there is no retry).
    fn longest_consumer_wait(&self) -> Option<Duration> {
        let mut longest = None;
        for k in 0..self.max_attempts.saturating_sub(1) {
            let delay = self.delay(k);
            if !self.waits_in_broker(delay) {
                let held = self.jittered(delay, 1.0);
                longest = Some(longest.map_or(held, |l: Duration| l.max(held)));
            }
            if self.delay(k + 1) == delay {
                break;
            }
        }
        longest
    }

    /// Whether a wait of `delay` is held on a broker rung rather than in the consumer.
    pub fn waits_in_broker(&self, delay: Duration) -> bool {
        !self.broker_threshold.is_zero() && !delay.is_zero() && delay >= self.broker_threshold
    }

    /// Decides what follows the failure of `attempt` (from 1; 0 is read as 1,
    /// as a missing attempt header is) for a message `age` old (`None` = unknown,
    /// which counts as young).
    pub fn decide(&self, attempt: u32, age: Option<Duration>) -> Decision {
        let attempt = attempt.max(1);
        if attempt >= self.max_attempts {
            return Decision::GiveUp(GiveUp::Exhausted { attempts: attempt });
        }
        if let (Some(max_age), Some(age)) = (self.max_age, age)
            && !max_age.is_zero()
            && age >= max_age
        {
            return Decision::GiveUp(GiveUp::TooOld { max_age });
        }
        let delay = self.delay(attempt - 1);
        let place = if self.waits_in_broker(delay) {
            WaitPlace::Broker
        } else {
            WaitPlace::Consumer
        };
        Decision::Wait { delay, place }
    }

    /// `delay` with jitter applied: `delay × (1 + (unit × 2 − 1) × jitter)`,
    /// floored at 1 ms. `unit` is a random number in [0, 1) (clamped into [0, 1]).
    pub fn jittered(&self, delay: Duration, unit: f64) -> Duration {
        let unit = if unit.is_nan() {
            0.5
        } else {
            unit.clamp(0.0, 1.0)
        };
        let factor = 1.0 + (unit * 2.0 - 1.0) * self.jitter;
        let waited = Duration::try_from_secs_f64(delay.as_secs_f64() * factor.max(0.0))
            .unwrap_or(Duration::MAX);
        waited.max(Duration::from_millis(1))
    }

    /// How long to actually wait for a [`Decision::Wait`]: consumer waits are
    /// jittered, broker waits are exactly the delay their rung queue is named after.
    pub fn wait_time(&self, delay: Duration, place: WaitPlace, unit: f64) -> Duration {
        match place {
            WaitPlace::Consumer => self.jittered(delay, unit),
            WaitPlace::Broker => delay,
        }
    }
}

/// `nanos` as a duration, or `Duration::MAX` when it is longer.
fn duration_from_nanos(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    u64::try_from(nanos / NANOS_PER_SEC).map_or(Duration::MAX, |secs| {
        // The remainder is below a billion, so it fits.
        Duration::new(secs, (nanos % NANOS_PER_SEC) as u32)
    })
}

/// Access to the AceMQ contract fixture, the cross-language conformance file
/// kept byte-for-byte in `tests/fixtures/acemq/` (see `tests/fixtures/README.md`).
#[cfg(test)]
pub(crate) mod contract_fixture {
    use std::time::Duration;

    use serde_json::Value;

    pub const PATH: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/acemq/contract-fixtures.json"
    );

    pub fn load() -> Value {
        let text = std::fs::read_to_string(PATH)
            .unwrap_or_else(|e| panic!("cannot read the contract fixture {PATH}: {e}"));
        serde_json::from_str(&text).expect("the contract fixture is JSON")
    }

    /// A `...Millis` number of the fixture as a duration.
    pub fn millis(value: &Value) -> Duration {
        Duration::from_millis(
            value
                .as_u64()
                .unwrap_or_else(|| panic!("not millis: {value}")),
        )
    }

    pub fn millis_list(value: &Value) -> Vec<Duration> {
        value
            .as_array()
            .expect("a list of millis")
            .iter()
            .map(millis)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::contract_fixture::{load, millis, millis_list};
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Builds a policy from the fixture's `how`, e.g.
    /// `exponential(5, 1s, 24h).giveUpAfter(2m)`, the way Java wrote it.
    fn policy_from_how(how: &str) -> RetryPolicy {
        let mut calls = how.split(").");
        let first = calls.next().unwrap().trim_end_matches(')');
        let (factory, args) = first.split_once('(').unwrap();
        let args: Vec<&str> = args
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .collect();
        let duration = |s: &str| humantime::parse_duration(s).unwrap();
        let mut policy = match factory {
            "none" => RetryPolicy::none(),
            "fixed" => RetryPolicy::fixed(args[0].parse().unwrap(), duration(args[1])),
            "exponential" => RetryPolicy::exponential(
                args[0].parse().unwrap(),
                duration(args[1]),
                duration(args[2]),
            ),
            other => panic!("unknown factory {other} in {how}"),
        };
        for call in calls {
            let (method, arg) = call.trim_end_matches(')').split_once('(').unwrap();
            policy = match method {
                "giveUpAfter" => policy.give_up_after(duration(arg)),
                other => panic!("unknown builder {other} in {how}"),
            };
        }
        policy
    }

    #[test]
    fn a_policy_that_would_hold_a_delivery_past_the_consumer_timeout_is_refused() {
        // Every wait in the consumer (no rungs), up to 30 min with jitter.
        let held = RetryPolicy::exponential(8, secs(60), secs(25 * 60))
            .wait_in_broker_from(Duration::ZERO);
        let err = held.check().unwrap_err();
        assert!(
            err.starts_with("a retry would be held in the consumer for up to 30m"),
            "{err}"
        );
        assert!(err.contains("consumer_timeout"), "{err}");
        // The same delays on rungs from 30 s on: fine.
        let on_rungs = RetryPolicy::exponential(8, secs(60), secs(25 * 60));
        assert!(on_rungs.check().is_ok());
        // Short consumer waits: fine.
        assert!(
            RetryPolicy::fixed(5, secs(10))
                .wait_in_broker_from(Duration::ZERO)
                .check()
                .is_ok()
        );
    }

    #[test]
    fn fixture_defaults() {
        let fixture = load();
        assert_eq!(
            millis(&fixture["defaultBrokerWaitThresholdMillis"]),
            DEFAULT_BROKER_THRESHOLD
        );
        assert_eq!(
            RetryPolicy::none().broker_threshold,
            DEFAULT_BROKER_THRESHOLD
        );
        assert_eq!(
            millis(&fixture["maxMessageAge"]["defaultMillis"]),
            Duration::ZERO
        );
        assert_eq!(RetryPolicy::exponential(3, secs(1), secs(9)).max_age, None);
    }

    #[test]
    fn fixture_retry_schedules() {
        let fixture = load();
        let schedules = fixture["retrySchedules"].as_array().unwrap();
        assert_eq!(schedules.len(), 5);
        for case in schedules {
            let name = case["name"].as_str().unwrap();
            let policy = policy_from_how(case["how"].as_str().unwrap());

            assert_eq!(
                policy.max_attempts as u64,
                case["maxAttempts"].as_u64().unwrap(),
                "{name}"
            );
            assert_eq!(
                policy.jitter,
                case["jitterFactor"].as_f64().unwrap(),
                "{name}"
            );
            assert_eq!(
                policy.broker_threshold,
                millis(&case["brokerWaitThresholdMillis"]),
                "{name}"
            );
            let has_age = case["hasMaxMessageAge"].as_bool().unwrap();
            let age = millis(&case["maxMessageAgeMillis"]);
            assert_eq!(policy.max_age, has_age.then_some(age), "{name}");
            assert!(has_age || age.is_zero(), "{name}: no limit is written as 0");

            let schedule = millis_list(&case["scheduleMillis"]);
            assert_eq!(policy.schedule(), schedule, "{name}");
            assert_eq!(
                policy.broker_rungs(),
                millis_list(&case["brokerRungDelaysMillis"]),
                "{name}"
            );
            policy.check().unwrap_or_else(|e| panic!("{name}: {e}"));

            for row in case["decisions"].as_array().unwrap() {
                let attempt = row["attempt"].as_u64().unwrap() as u32;
                let message_age = millis(&row["messageAgeMillis"]);
                let retries = row["retries"].as_bool().unwrap();
                let decision = policy.decide(attempt, Some(message_age));
                match decision {
                    Decision::Wait { delay, place } => {
                        assert!(retries, "{name} {row}: {decision:?}");
                        assert_eq!(delay, schedule[attempt as usize - 1], "{name} {row}");
                        let expected = if policy.waits_in_broker(delay) {
                            WaitPlace::Broker
                        } else {
                            WaitPlace::Consumer
                        };
                        assert_eq!(place, expected, "{name} {row}");
                    }
                    Decision::GiveUp(_) => assert!(!retries, "{name} {row}: {decision:?}"),
                }
            }
        }
    }

    #[test]
    fn fixture_max_message_age() {
        let fixture = load();
        let section = &fixture["maxMessageAge"];
        assert!(section["zeroMeansNoLimit"].as_bool().unwrap());
        for case in section["cases"].as_array().unwrap() {
            let policy = RetryPolicy::exponential(5, secs(1), secs(86_400))
                .give_up_after(millis(&case["maxMessageAgeMillis"]));
            let retries = case["retries"].as_bool().unwrap();
            let decision = policy.decide(1, Some(millis(&case["messageAgeMillis"])));
            assert_eq!(matches!(decision, Decision::Wait { .. }), retries, "{case}");
            if !retries {
                assert_eq!(
                    decision,
                    Decision::GiveUp(GiveUp::TooOld {
                        max_age: ms(120_000)
                    })
                );
            }
        }
        // An unknown age counts as young, even under a limit.
        assert!(section["unknownAgeRetries"].as_bool().unwrap());
        let limited = RetryPolicy::exponential(5, secs(1), secs(60)).give_up_after(secs(1));
        assert!(matches!(limited.decide(1, None), Decision::Wait { .. }));
    }

    #[test]
    fn fixture_jitter_bounds() {
        let fixture = load();
        let jitter = &fixture["jitter"];
        let policy = fixture["retrySchedules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == jitter["policy"])
            .map(|c| policy_from_how(c["how"].as_str().unwrap()))
            .unwrap();
        assert_eq!(policy.jitter, jitter["factor"].as_f64().unwrap());
        let low = jitter["minMultiplier"].as_f64().unwrap();
        let high = jitter["maxMultiplier"].as_f64().unwrap();
        let floor = millis(&jitter["flooredAtMillis"]);
        // Float products are within a nanosecond of the exact bound.
        let slack = Duration::from_nanos(1);

        for delay in policy
            .schedule()
            .into_iter()
            .chain([ms(1), ms(3), secs(30), secs(3600)])
        {
            for unit in [0.0, 0.001, 0.25, 0.5, 0.75, 0.999_999] {
                let waited = policy.wait_time(delay, WaitPlace::Consumer, unit);
                let lowest = delay.mul_f64(low).max(floor);
                let highest = delay.mul_f64(high).max(floor);
                assert!(waited + slack >= lowest, "{delay:?} × {unit}: {waited:?}");
                assert!(waited <= highest + slack, "{delay:?} × {unit}: {waited:?}");
                assert!(waited >= floor);
            }
            // Broker waits name a rung queue, so they are never jittered.
            assert!(!jitter["appliesToBrokerWaits"].as_bool().unwrap());
            for unit in [0.0, 0.5, 0.999] {
                assert_eq!(policy.wait_time(delay, WaitPlace::Broker, unit), delay);
            }
        }
        // Both directions are reached: the extremes of the random number give the extremes.
        let delay = secs(10);
        let near = |got: Duration, want: Duration| got.abs_diff(want) <= Duration::from_micros(1);
        assert!(near(policy.jittered(delay, 0.0), secs(8)));
        assert!(near(policy.jittered(delay, 0.5), delay));
        assert!(policy.jittered(delay, 0.999_999) > Duration::from_millis(11_999));
        // A zero delay still waits the floor rather than spinning.
        assert_eq!(policy.jittered(Duration::ZERO, 0.3), floor);
        // A fixed policy has no jitter unless asked.
        assert_eq!(
            RetryPolicy::fixed(3, secs(5)).jittered(secs(5), 0.0),
            secs(5)
        );
    }

    #[test]
    fn fixture_broker_wait_threshold() {
        let fixture = load();
        let cases = fixture["brokerWaitThreshold"]["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 30);
        for case in cases {
            let policy = RetryPolicy::fixed(2, secs(1))
                .wait_in_broker_from(millis(&case["thresholdMillis"]));
            assert_eq!(
                policy.waits_in_broker(millis(&case["delayMillis"])),
                case["waitsInBroker"].as_bool().unwrap(),
                "{case}"
            );
        }
    }

    #[test]
    fn a_zero_threshold_declares_no_rungs() {
        let policy =
            RetryPolicy::exponential(6, secs(10), secs(300)).wait_in_broker_from(Duration::ZERO);
        assert!(policy.broker_rungs().is_empty());
        assert!(matches!(
            policy.decide(5, None),
            Decision::Wait {
                place: WaitPlace::Consumer,
                ..
            }
        ));
    }

    #[test]
    fn exhausted_counts_the_attempts_made() {
        let policy = RetryPolicy::fixed(3, secs(1));
        assert_eq!(
            policy.decide(3, None),
            Decision::GiveUp(GiveUp::Exhausted { attempts: 3 })
        );
        // An attempt header beyond the policy (the policy was shortened) still gives up.
        assert_eq!(
            policy.decide(7, None),
            Decision::GiveUp(GiveUp::Exhausted { attempts: 7 })
        );
        // A missing attempt (0) is the first attempt.
        assert_eq!(policy.decide(0, None), policy.decide(1, None));
        assert_eq!(
            RetryPolicy::none().decide(1, None),
            Decision::GiveUp(GiveUp::Exhausted { attempts: 1 })
        );
    }

    #[test]
    fn error_texts_follow_the_contract() {
        let exhausted = GiveUp::Exhausted { attempts: 5 };
        assert_eq!(exhausted.error_text("boom"), "exhausted 5 attempts: boom");
        let once = GiveUp::Exhausted { attempts: 1 };
        assert_eq!(once.error_text("boom"), "exhausted 1 attempt: boom");
        let old = GiveUp::TooOld { max_age: secs(120) };
        assert_eq!(
            old.error_text("trap: unreachable"),
            "exceeded the maximum message age of 2m: trap: unreachable"
        );
    }

    #[test]
    fn long_ladders_saturate_instead_of_overflowing() {
        let uncapped = RetryPolicy {
            max: None,
            ..RetryPolicy::exponential(u32::MAX, secs(1), secs(1))
        };
        assert_eq!(uncapped.delay(200), Duration::MAX);
        // Exact well past 32 doublings of a millisecond (about 49.7 days).
        let from_a_millisecond = RetryPolicy {
            max: None,
            ..RetryPolicy::exponential(64, ms(1), ms(1))
        };
        assert_eq!(from_a_millisecond.delay(32), ms(1 << 32));
        assert_eq!(from_a_millisecond.delay(40), ms(1 << 40));
        // Nothing doubled is still nothing, however long the ladder.
        let from_zero = RetryPolicy {
            max: None,
            ..RetryPolicy::exponential(u32::MAX, Duration::ZERO, ms(1))
        };
        assert_eq!(from_zero.delay(500), Duration::ZERO);
        assert!(from_zero.broker_rungs().is_empty());
        let capped = RetryPolicy::exponential(u32::MAX, secs(10), secs(300));
        assert_eq!(capped.delay(1_000_000), secs(300));
        assert_eq!(
            capped.broker_rungs(),
            vec![secs(40), secs(80), secs(160), secs(300)]
        );
        assert_eq!(
            RetryPolicy::fixed(u32::MAX, secs(60)).broker_rungs(),
            vec![secs(60)]
        );
    }

    fn config(text: &str) -> RetryConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn from_config_builds_each_kind() {
        assert_eq!(
            RetryPolicy::from_config("n", &config("kind = \"none\"")).unwrap(),
            RetryPolicy::none()
        );
        assert_eq!(
            RetryPolicy::from_config(
                "f",
                &config("kind = \"fixed\"\nattempts = 4\ninitial = \"30s\"")
            )
            .unwrap(),
            RetryPolicy::fixed(4, secs(30))
        );
        assert_eq!(
            RetryPolicy::from_config(
                "e",
                &config("kind = \"exponential\"\nattempts = 6\ninitial = \"10s\"\nmax = \"5m\"")
            )
            .unwrap(),
            RetryPolicy::exponential(6, secs(10), secs(300))
        );
        let tuned = RetryPolicy::from_config(
            "t",
            &config(
                "kind = \"exponential\"\nattempts = 5\ninitial = \"1s\"\njitter = 0.5\n\
                 give_up_after = \"2m\"\nwait_in_broker_from = \"2s\"",
            ),
        )
        .unwrap();
        assert_eq!(tuned.max, None);
        assert_eq!(tuned.jitter, 0.5);
        assert_eq!(tuned.max_age, Some(secs(120)));
        assert_eq!(tuned.broker_threshold, secs(2));
        assert_eq!(tuned.broker_rungs(), vec![secs(2), secs(4), secs(8)]);
        // The contract's 0 = no limit.
        let no_limit = RetryPolicy::from_config(
            "z",
            &config("kind = \"fixed\"\nattempts = 2\ninitial = \"1s\"\ngive_up_after = \"0s\""),
        )
        .unwrap();
        assert_eq!(no_limit.max_age, None);
    }

    fn refused(text: &str) -> String {
        RetryPolicy::from_config("fast", &config(text)).unwrap_err()
    }

    #[test]
    fn from_config_refuses_with_table_and_key() {
        let cases = [
            (
                "kind = \"linear\"",
                "[retry.fast] kind: unknown kind 'linear'",
            ),
            (
                "kind = \"fixed\"\nattempts = 0\ninitial = \"1s\"",
                "[retry.fast] attempts: must be at least 1",
            ),
            (
                "kind = \"fixed\"\ninitial = \"1s\"",
                "[retry.fast] attempts: missing",
            ),
            (
                "kind = \"fixed\"\nattempts = 3",
                "[retry.fast] initial: missing",
            ),
            (
                "kind = \"exponential\"\nattempts = 3",
                "[retry.fast] initial: missing",
            ),
            (
                "kind = \"fixed\"\nattempts = 3\ninitial = \"1s\"\njitter = 1.5",
                "[retry.fast] jitter: 1.5 is outside [0, 1]",
            ),
            (
                "kind = \"fixed\"\nattempts = 3\ninitial = \"1s\"\njitter = -0.1",
                "[retry.fast] jitter: -0.1 is outside [0, 1]",
            ),
            (
                "kind = \"fixed\"\nattempts = 3\ninitial = \"1s\"\nmax = \"5s\"",
                "[retry.fast] max: a fixed policy",
            ),
            (
                "kind = \"exponential\"\nattempts = 3\ninitial = \"10s\"\nmax = \"5s\"",
                "[retry.fast] max: 5s is shorter than initial 10s",
            ),
            (
                "kind = \"none\"\ninitial = \"1s\"",
                "[retry.fast] initial: kind = \"none\" never retries",
            ),
            (
                "kind = \"none\"\nattempts = 3",
                "[retry.fast] attempts: kind = \"none\" never retries",
            ),
        ];
        for (text, expected) in cases {
            let message = refused(text);
            assert!(message.starts_with(expected), "{text:?} gave {message:?}");
        }
    }

    #[test]
    fn from_config_refuses_fractional_and_sub_second_rungs() {
        assert_eq!(
            refused(
                "kind = \"fixed\"\nattempts = 3\ninitial = \"1s 500ms\"\nwait_in_broker_from = \"1s\""
            ),
            "[retry.fast]: the delay 1s 500ms would wait on a broker rung queue, and rung names are \
             whole seconds in every AceMQ library; use whole seconds or raise wait_in_broker_from above it"
        );
        let sub_second = refused(
            "kind = \"exponential\"\nattempts = 3\ninitial = \"500ms\"\nwait_in_broker_from = \"100ms\"",
        );
        assert!(
            sub_second.starts_with("[retry.fast]: the delay 500ms would wait"),
            "{sub_second}"
        );
        // The same delays are fine when they wait in the consumer.
        let in_consumer = "kind = \"fixed\"\nattempts = 3\ninitial = \"1s 500ms\"";
        assert!(RetryPolicy::from_config("fast", &config(in_consumer)).is_ok());
        // And a delay too long for a queue TTL is refused before the broker does it.
        let too_long = refused("kind = \"fixed\"\nattempts = 2\ninitial = \"60days\"");
        assert!(too_long.contains("at most 4294967295 ms"), "{too_long}");
    }
}
