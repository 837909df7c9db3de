//! The state example: a velocity check on orders.
//!
//! Each input is a JSON order, `{"id": "o-1", "customer": "c-42", ...}`.
//! The plugin keeps, for each customer, the times (epoch ms, the host's
//! clock) of their accepted orders still within the window, under the state
//! key `customer/{customer}`, as a JSON list. An order that finds `limit` of
//! them already there is parked (`customer c-42 placed 5 orders within 10m
//! (limit 5)`); any other is added to the list and accepted. Nothing is
//! published.
//!
//! - `[consumers.config] limit`: how many orders a window may hold; default
//!   5. `window`: how long an order counts, as `10m`, `30s`, `1h`, `500ms`,
//!   `1d` or a sum such as `1h 30m`; default `10m`. An order counts while
//!   it is less than `window` old. A value that cannot be read retries the
//!   input, naming the key, until an operator fixes it.
//! - A body that is not a JSON object, or has no `customer` text, is
//!   rejected with a reason naming what is wrong.
//! - The list is read with `get_versioned` and written back with
//!   `set_if_version`, with the window as its TTL (the key goes away when
//!   its newest order leaves the window). Two inputs of one customer handled
//!   at once cannot both add to the same list: the host commits one, finds
//!   the other's version changed, and runs that call again on the new list.
//!   A parked order writes nothing, so it does not count.

use std::time::Duration;

use acemq_guest::prelude::*;
use acemq_guest::serde_json::{self, Value};
use acemq_guest::state::MAX_KEY_BYTES;

/// Consumer config key: how many orders a window may hold.
const LIMIT_KEY: &str = "limit";
const DEFAULT_LIMIT: usize = 5;
/// Consumer config key: how long an order counts.
const WINDOW_KEY: &str = "window";
const DEFAULT_WINDOW: &str = "10m";
/// The state key of a customer's orders is this and the customer.
const KEY_PREFIX: &str = "customer/";
/// The longest customer a state key can hold.
const MAX_CUSTOMER_BYTES: usize = MAX_KEY_BYTES - KEY_PREFIX.len();

acemq_guest::config_keys!["limit", "window"];

struct Velocity;

impl Handler for Velocity {
    fn handle(msg: Message) -> Result {
        let settings = Settings::from_config()?;
        let order = Order::read(&msg)?;
        let key = format!("{KEY_PREFIX}{}", order.customer);
        let now = now_ms();
        let (mut placed, version) = placed(&key)?;
        // Orders less than `window` old still count.
        let since = now.saturating_sub(settings.window_ms());
        placed.retain(|&at| at > since);
        if placed.len() >= settings.limit {
            return park(format_args!(
                "customer {} placed {} orders within {} (limit {})",
                order.customer,
                placed.len(),
                settings.window_text,
                settings.limit
            ));
        }
        placed.push(now);
        // Committed only if no other input changed the list since it was
        // read; otherwise the host runs this call again on the new list.
        state::set_json_if_version(&key, &placed, version, Some(settings.window))?;
        info!(
            "{} of customer {}: {} of {} within {}",
            order.named(),
            order.customer,
            placed.len(),
            settings.limit,
            settings.window_text
        );
        accept()
    }
}

/// The times of the customer's orders in the state, and the version to
/// write them back with.
fn placed(key: &str) -> Result<(Vec<u64>, u64)> {
    let Some(found) = state::get_versioned(key)? else {
        return Ok((Vec::new(), state::ABSENT));
    };
    // Only this plugin writes these keys; an operator's edit that broke one
    // is for a person to look at (`acemq-host state get|delete`).
    let placed = serde_json::from_slice(&found.value).or_park(format_args!(
        "the state key `{key}` does not hold a JSON list of epoch-ms times"
    ))?;
    Ok((placed, found.version))
}

/// The consumer's settings.
struct Settings {
    limit: usize,
    window: Duration,
    /// The window as configured, for reasons and logs.
    window_text: String,
}

impl Settings {
    fn from_config() -> Result<Self> {
        let limit = match config(LIMIT_KEY) {
            None => DEFAULT_LIMIT,
            Some(text) => text
                .trim()
                .parse()
                .ok()
                .filter(|&limit| limit >= 1)
                .or_retry(format_args!(
                    "the consumer's config `{LIMIT_KEY}` must be a whole number, 1 or more, \
                     got {text:?}"
                ))?,
        };
        let window_text = config(WINDOW_KEY).unwrap_or_else(|| DEFAULT_WINDOW.into());
        let window = parse_duration(&window_text).or_retry(format_args!(
            "the consumer's config `{WINDOW_KEY}` must be a duration such as 10m, 30s, 1h or \
             500ms, got {window_text:?}"
        ))?;
        Ok(Settings {
            limit,
            window,
            window_text: window_text.trim().to_owned(),
        })
    }

    fn window_ms(&self) -> u64 {
        u64::try_from(self.window.as_millis()).unwrap_or(u64::MAX)
    }
}

/// A duration as config writes it: one or more `<whole number><unit>`, the
/// units `ms`, `s`, `m`, `h` and `d`, spaces allowed between them (`10m`,
/// `1h 30m`, `1h30m`). `None` for anything else, and for zero.
fn parse_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    let mut total_ms: u64 = 0;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let count: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let unit_ms: u64 = match &rest[..unit] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return None,
        };
        total_ms = total_ms.checked_add(count.checked_mul(unit_ms)?)?;
        rest = rest[unit..].trim_start();
    }
    (total_ms > 0).then(|| Duration::from_millis(total_ms))
}

/// The parts of an order the check reads.
struct Order {
    id: Option<String>,
    customer: String,
}

impl Order {
    fn read(msg: &Message) -> Result<Self> {
        let body: Value = serde_json::from_slice(msg.body()).or_reject("the body is not JSON")?;
        let Value::Object(fields) = body else {
            return reject(
                "the body is not a JSON object (an order: {\"id\": ..., \"customer\": ...})",
            );
        };
        let id = match fields.get("id") {
            Some(Value::String(id)) => Some(id.clone()),
            Some(Value::Number(id)) => Some(id.to_string()),
            _ => None,
        };
        let named = named(id.as_deref());
        let customer = match fields.get("customer") {
            None | Some(Value::Null) => {
                return reject(format_args!(
                    "{named} has no `customer` (the text naming who placed it)"
                ));
            }
            Some(Value::String(customer)) if customer.is_empty() => {
                return reject(format_args!("{named} has an empty `customer`"));
            }
            Some(Value::String(customer)) if customer.len() > MAX_CUSTOMER_BYTES => {
                return reject(format_args!(
                    "{named} has a `customer` of {} bytes; at most {MAX_CUSTOMER_BYTES} fit \
                     in a state key",
                    customer.len()
                ));
            }
            Some(Value::String(customer)) => customer.clone(),
            Some(other) => {
                return reject(format_args!(
                    "{named} has a `customer` that is not text: {other}"
                ));
            }
        };
        Ok(Order { id, customer })
    }

    /// How reasons and logs name it.
    fn named(&self) -> String {
        named(self.id.as_deref())
    }
}

/// `order o-1`, or `the order` when it has no id.
fn named(id: Option<&str>) -> String {
    match id {
        Some(id) => format!("order {id}"),
        None => "the order".to_string(),
    }
}

acemq_guest::export_handler!(Velocity);

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_guest::testing::{self, Handled, StateWrite, TestHost};

    const SECOND: Duration = Duration::from_secs(1);
    const WINDOW: Duration = Duration::from_secs(600);

    fn order(id: &str, customer: &str) -> Message {
        testing::json_message(&json!({ "id": id, "customer": customer, "total": 12.5 }))
    }

    fn check(host: &TestHost, id: &str, customer: &str) -> Handled {
        host.handle::<Velocity>(order(id, customer))
    }

    /// The times in the state of `customer`.
    fn placed(host: &TestHost, customer: &str) -> Option<Vec<u64>> {
        host.state_get_json(format!("customer/{customer}"))
    }

    /// `count` orders of `customer` a second apart, each accepted; returns
    /// the host at the last one.
    fn accepted(mut host: TestHost, customer: &str, count: usize) -> TestHost {
        for i in 0..count {
            if i > 0 {
                host = host.advance(SECOND);
            }
            let done = check(&host, &format!("o-{i}"), customer);
            assert_eq!(done.outcome, Outcome::Accept, "order {i} of {customer}");
            assert_eq!(done.conflict, None);
        }
        host
    }

    fn rejected(msg: Message) -> String {
        let host = TestHost::new();
        let done = host.handle::<Velocity>(msg);
        assert!(done.state_writes.is_empty(), "nothing written on a reject");
        match done.outcome {
            Outcome::Reject(reason) => reason,
            other => panic!("a reject expected, got {other:?}"),
        }
    }

    fn retried(host: &TestHost) -> String {
        let done = check(host, "o-1", "c-1");
        match done.outcome {
            Outcome::Retry(reason) => reason,
            other => panic!("a retry expected, got {other:?}"),
        }
    }

    #[test]
    fn accepts_up_to_the_limit_then_parks_the_next() {
        let start = TestHost::new();
        let host = accepted(start.clone(), "c-42", 5);
        let t0 = testing::DEFAULT_NOW_MS;
        assert_eq!(
            placed(&host, "c-42"),
            Some(vec![t0, t0 + 1000, t0 + 2000, t0 + 3000, t0 + 4000])
        );

        let host = host.advance(SECOND);
        let done = check(&host, "o-5", "c-42");
        assert_eq!(
            done.outcome,
            Outcome::park("customer c-42 placed 5 orders within 10m (limit 5)")
        );
        assert!(done.published.is_empty());
        assert!(
            done.state_writes.is_empty(),
            "a parked order writes nothing"
        );
        assert_eq!(placed(&host, "c-42").map(|p| p.len()), Some(5));
    }

    #[test]
    fn each_order_writes_its_list_back_if_unchanged_with_the_window_as_ttl() {
        let host = TestHost::new();
        let done = check(&host, "o-1", "c-1");
        let now = testing::DEFAULT_NOW_MS;
        assert_eq!(
            done.state_writes,
            [StateWrite::SetIfVersion {
                key: b"customer/c-1".to_vec(),
                value: format!("[{now}]").into_bytes(),
                version: state::ABSENT,
                ttl: Some(WINDOW),
            }]
        );
        assert_eq!(
            done.logs[0].1,
            "order o-1 of customer c-1: 1 of 5 within 10m"
        );

        let version = host.state_version("customer/c-1").expect("committed");
        let host = host.advance(SECOND);
        let done = check(&host, "o-2", "c-1");
        let [StateWrite::SetIfVersion { version: read, .. }] = done.state_writes[..] else {
            panic!("one set_if_version expected: {:?}", done.state_writes)
        };
        assert_eq!(read, version, "the version it read");

        // The key goes once its newest order is a window old.
        let host = host.advance(WINDOW - Duration::from_millis(1));
        assert_eq!(host.state_keys(), [b"customer/c-1".to_vec()]);
        let host = host.advance(Duration::from_millis(1));
        assert!(host.state_keys().is_empty());
    }

    #[test]
    fn the_window_passing_lets_the_customer_order_again() {
        // Orders at 0 s .. 4 s; the sixth is parked until the first is a
        // whole window old.
        let host = accepted(TestHost::new(), "c-42", 5);
        let first = testing::DEFAULT_NOW_MS;
        let host = host.now_ms(first + 600_000 - 1);
        let done = check(&host, "o-5", "c-42");
        assert!(
            matches!(done.outcome, Outcome::Park(_)),
            "{:?}",
            done.outcome
        );

        let host = host.now_ms(first + 600_000);
        let done = check(&host, "o-5", "c-42");
        assert_eq!(done.outcome, Outcome::Accept);
        let placed = placed(&host, "c-42").unwrap();
        assert_eq!(placed.len(), 5, "the first dropped, this one added");
        assert_eq!(placed.first(), Some(&(first + 1000)));
        assert_eq!(placed.last(), Some(&(first + 600_000)));

        // And the next is parked again.
        let done = check(&host, "o-6", "c-42");
        assert!(matches!(done.outcome, Outcome::Park(_)));
    }

    #[test]
    fn customers_are_counted_apart() {
        let host = accepted(TestHost::new(), "c-1", 5);
        let host = accepted(host, "c-2", 5);
        assert!(matches!(
            check(&host, "o-9", "c-1").outcome,
            Outcome::Park(_)
        ));
        let done = check(&host, "o-9", "c-3");
        assert_eq!(done.outcome, Outcome::Accept);
        assert_eq!(
            host.state_keys(),
            [
                b"customer/c-1".to_vec(),
                b"customer/c-2".to_vec(),
                b"customer/c-3".to_vec()
            ]
        );
    }

    #[test]
    fn the_configured_limit_and_window_are_used() {
        let start = TestHost::new()
            .config(LIMIT_KEY, "2")
            .config(WINDOW_KEY, "30s");
        let host = accepted(start, "c-7", 2);
        let done = check(&host, "o-2", "c-7");
        assert_eq!(
            done.outcome,
            Outcome::park("customer c-7 placed 2 orders within 30s (limit 2)")
        );
        // 30 s after the first order, one slot is free again.
        let host = host.advance(Duration::from_secs(29));
        assert_eq!(check(&host, "o-2", "c-7").outcome, Outcome::Accept);
        let done = check(&host, "o-3", "c-7");
        assert!(matches!(done.outcome, Outcome::Park(_)));

        let host = TestHost::new().config(WINDOW_KEY, " 1h 30m ");
        let done = check(&host, "o-1", "c-1");
        let [StateWrite::SetIfVersion { ttl, .. }] = &done.state_writes[..] else {
            panic!("one write expected")
        };
        assert_eq!(*ttl, Some(Duration::from_secs(5400)));
        assert_eq!(
            done.logs[0].1,
            "order o-1 of customer c-1: 1 of 5 within 1h 30m"
        );
    }

    #[test]
    fn a_config_that_cannot_be_read_retries_naming_the_key() {
        for limit in ["0", "-1", "five", ""] {
            let reason = retried(&TestHost::new().config(LIMIT_KEY, limit));
            assert_eq!(
                reason,
                format!(
                    "the consumer's config `limit` must be a whole number, 1 or more, got {limit:?}"
                )
            );
        }
        for window in ["10", "ten minutes", "0s", "10x", "m", "1.5h", ""] {
            let reason = retried(&TestHost::new().config(WINDOW_KEY, window));
            assert_eq!(
                reason,
                format!(
                    "the consumer's config `window` must be a duration such as 10m, 30s, 1h \
                     or 500ms, got {window:?}"
                )
            );
        }
    }

    #[test]
    fn a_parked_order_does_not_count() {
        let start = TestHost::new().config(LIMIT_KEY, "2");
        let t0 = testing::DEFAULT_NOW_MS;
        let at = |minutes: u64| start.clone().now_ms(t0 + minutes * 60_000);
        // Orders at 0 and 1 min are accepted; those at 2 and 3 min parked.
        assert_eq!(check(&at(0), "o-0", "c-1").outcome, Outcome::Accept);
        assert_eq!(check(&at(1), "o-1", "c-1").outcome, Outcome::Accept);
        for minutes in [2, 3] {
            let done = check(&at(minutes), "o-x", "c-1");
            assert!(matches!(done.outcome, Outcome::Park(_)), "{minutes}");
        }
        // At 10 min the first is a window old and only the one at 1 min
        // counts; had the parked ones counted, there would be three.
        let host = at(10);
        assert_eq!(check(&host, "o-4", "c-1").outcome, Outcome::Accept);
        assert_eq!(placed(&host, "c-1"), Some(vec![t0 + 60_000, t0 + 600_000]));
    }

    #[test]
    fn a_conflict_commits_nothing_and_the_run_again_counts_the_other_order() {
        let host = TestHost::new();
        let now = testing::DEFAULT_NOW_MS;
        // Another input of the same customer commits while this one runs.
        host.state_changes_during_next_call("customer/c-1", format!("[{}]", now - 1000));
        let done = check(&host, "o-2", "c-1");
        assert_eq!(done.outcome, Outcome::Accept, "the handler accepted");
        assert_eq!(done.conflict, Some(b"customer/c-1".to_vec()));
        assert_eq!(
            placed(&host, "c-1"),
            Some(vec![now - 1000]),
            "only the other input's order: nothing of this call was committed"
        );

        // The host runs the call again, on the list as it is now.
        let done = check(&host, "o-2", "c-1");
        assert_eq!((done.outcome, done.conflict), (Outcome::Accept, None));
        assert_eq!(placed(&host, "c-1"), Some(vec![now - 1000, now]));
    }

    #[test]
    fn bad_bodies_are_rejected_naming_what_is_wrong() {
        let reason = rejected(testing::message("not json"));
        assert!(
            reason.starts_with("the body is not JSON: expected"),
            "{reason}"
        );
        assert_eq!(
            rejected(testing::json_message(&json!(["o-1", "c-1"]))),
            "the body is not a JSON object (an order: {\"id\": ..., \"customer\": ...})"
        );
        assert_eq!(
            rejected(testing::json_message(&json!({ "id": "o-1" }))),
            "order o-1 has no `customer` (the text naming who placed it)"
        );
        assert_eq!(
            rejected(testing::json_message(&json!({ "customer": null }))),
            "the order has no `customer` (the text naming who placed it)"
        );
        assert_eq!(
            rejected(testing::json_message(&json!({ "id": 7, "customer": 42 }))),
            "order 7 has a `customer` that is not text: 42"
        );
        assert_eq!(
            rejected(testing::json_message(
                &json!({ "id": "o-1", "customer": "" })
            )),
            "order o-1 has an empty `customer`"
        );
        let long = "c".repeat(MAX_CUSTOMER_BYTES + 1);
        assert_eq!(
            rejected(testing::json_message(
                &json!({ "id": "o-1", "customer": long })
            )),
            "order o-1 has a `customer` of 1016 bytes; at most 1015 fit in a state key"
        );
        // The longest that fits is checked like any other.
        let longest = "c".repeat(MAX_CUSTOMER_BYTES);
        let done = check(&TestHost::new(), "o-1", &longest);
        assert_eq!(done.outcome, Outcome::Accept);
    }

    #[test]
    fn state_that_is_not_a_list_of_times_is_parked_for_a_person() {
        let host = TestHost::new();
        host.state_set("customer/c-1", "{\"edited\": true}");
        let done = check(&host, "o-1", "c-1");
        let Outcome::Park(reason) = done.outcome else {
            panic!("a park expected, got {:?}", done.outcome)
        };
        assert!(
            reason.starts_with(
                "the state key `customer/c-1` does not hold a JSON list of epoch-ms times: "
            ),
            "{reason}"
        );
    }

    #[test]
    fn a_consumer_without_state_retries_with_the_hosts_reason() {
        let reason = retried(&TestHost::new().without_state());
        assert_eq!(
            reason,
            "state get_versioned of key `customer/c-1` failed: this consumer has no state \
             store: set state = \"NAME\" in its [[consumers]] entry"
        );
    }

    #[test]
    fn durations_are_read_as_config_writes_them() {
        let ms = |text| parse_duration(text).map(|d| d.as_millis());
        assert_eq!(ms("10m"), Some(600_000));
        assert_eq!(ms("30s"), Some(30_000));
        assert_eq!(ms("1h"), Some(3_600_000));
        assert_eq!(ms("500ms"), Some(500));
        assert_eq!(ms("2d"), Some(172_800_000));
        assert_eq!(ms("1h 30m"), Some(5_400_000));
        assert_eq!(ms("1h30m15s"), Some(5_415_000));
        assert_eq!(ms(" 10m "), Some(600_000));
        for bad in [
            "",
            "10",
            "m",
            "0m",
            "0s 0ms",
            "10 m",
            "1.5h",
            "-1m",
            "10M",
            "1w",
            "1m,2s",
            "99999999999999999999d",
        ] {
            assert_eq!(ms(bad), None, "{bad:?}");
        }
    }
}
