//! Names every AceMQ library derives from a queue name (contract §1), and the
//! stream retention string (§7). These are cross-language contracts: a name
//! rendered differently is a different queue on the shared broker.

use std::time::Duration;

/// Where brokers dead-letter to, and where `{q}.dlq` / `{q}.parked` are bound.
pub const DEAD_LETTER_EXCHANGE: &str = "acemq.dlx";

/// Where rung queues dead-letter expired waits to; each source queue is bound
/// to it on its own name. Every library hard-codes this name.
pub const RETRY_EXCHANGE: &str = "acemq.retry";

/// `{queue}.dlq`: where exhausted and rejected messages go.
pub fn dead_letter_queue(queue: &str) -> String {
    format!("{queue}.dlq")
}

/// `{queue}.parked`: where undecodable and parked messages go.
pub fn parked_queue(queue: &str) -> String {
    format!("{queue}.parked")
}

/// `{queue}.retry.{delay}`: the rung queue holding waits of `delay`.
///
/// The delay is rendered with the largest unit that divides it exactly
/// (`2h`, `5m`, `90s`). Only whole, non-zero seconds have a name: the
/// libraries disagree below that (fixture `naming.subSecondDisagreement`:
/// Java writes `orders.new.retry.500ms`, Go, Python and Ruby truncate to
/// `orders.new.retry.0s`, and likewise `30500ms` versus `30s`), so either name
/// we picked would be a different queue from some library's. We refuse such a
/// delay instead, and retry policies refuse to put one on a broker rung, which
/// keeps every rung we declare one that all five libraries name identically.
pub fn retry_queue(queue: &str, delay: Duration) -> Result<String, String> {
    if delay.is_zero() {
        return Err(format!(
            "a zero delay has no rung queue for '{queue}': it never waits on the broker"
        ));
    }
    if delay.subsec_nanos() != 0 {
        return Err(format!(
            "the delay {} is not a whole number of seconds, so '{queue}' has no rung name every \
             AceMQ library agrees on (Java would call it {queue}.retry.{}ms, Go, Python and Ruby \
             {queue}.retry.{}s)",
            humantime::format_duration(delay),
            delay.as_millis(),
            delay.as_secs(),
        ));
    }
    let suffix = largest_exact_unit(delay.as_secs(), &[(3600, "h"), (60, "m"), (1, "s")]);
    Ok(format!("{queue}.retry.{suffix}"))
}

/// The `x-max-age` argument of a stream: whole seconds (fractions dropped)
/// in the largest exact unit, days written with a capital `D` as RabbitMQ
/// expects (`7D`, `36h`, `90m`, `90s`; 90.5 s gives `90s`, 24 h gives `1D`).
pub fn max_age_argument(age: Duration) -> String {
    largest_exact_unit(
        age.as_secs(),
        &[(86_400, "D"), (3600, "h"), (60, "m"), (1, "s")],
    )
}

/// `seconds` as `{n}{unit}` with the first (largest) unit that divides it;
/// the last unit must be 1 second so that one always does. Zero is `0s`.
fn largest_exact_unit(seconds: u64, units: &[(u64, &str)]) -> String {
    let (size, unit) = units
        .iter()
        .find(|(size, _)| seconds != 0 && seconds.is_multiple_of(*size))
        .unwrap_or(&units[units.len() - 1]);
    format!("{}{unit}", seconds / size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::contract_fixture::{load, millis};

    #[test]
    fn fixture_names() {
        let fixture = load();
        let naming = &fixture["naming"];
        let queue = naming["queue"].as_str().unwrap();
        assert_eq!(fixture["deadLetterExchange"], DEAD_LETTER_EXCHANGE);
        assert_eq!(fixture["retryExchange"], RETRY_EXCHANGE);
        assert_eq!(naming["deadLetterQueue"], dead_letter_queue(queue).as_str());
        assert_eq!(naming["parkedQueue"], parked_queue(queue).as_str());

        let rows = naming["retryQueues"].as_array().unwrap();
        assert_eq!(rows.len(), 6);
        for row in rows {
            let delay = millis(&row["delayMillis"]);
            let expected = row["queue"].as_str().unwrap();
            if delay.subsec_nanos() == 0 {
                assert_eq!(retry_queue(queue, delay).unwrap(), expected);
            } else {
                // The 500 ms row is Java's name, which Go/Python/Ruby disagree with.
                let refusal = retry_queue(queue, delay).unwrap_err();
                assert!(refusal.contains(expected), "{refusal}");
                assert!(refusal.contains("orders.new.retry.0s"), "{refusal}");
            }
        }
    }

    #[test]
    fn rung_names_use_the_largest_exact_unit() {
        let name = |secs| retry_queue("q", Duration::from_secs(secs)).unwrap();
        assert_eq!(name(1), "q.retry.1s");
        assert_eq!(name(59), "q.retry.59s");
        assert_eq!(name(60), "q.retry.1m");
        assert_eq!(name(3599), "q.retry.3599s");
        assert_eq!(name(3660), "q.retry.61m");
        assert_eq!(name(86_400), "q.retry.24h");
    }

    #[test]
    fn fractional_and_zero_rungs_are_refused() {
        let fractional = retry_queue("q", Duration::from_millis(30_500)).unwrap_err();
        assert!(fractional.contains("q.retry.30500ms") && fractional.contains("q.retry.30s"));
        assert!(retry_queue("q", Duration::ZERO).is_err());
    }

    #[test]
    fn max_age_follows_the_streams_contract() {
        let age = |secs| max_age_argument(Duration::from_secs(secs));
        assert_eq!(age(2 * 86_400), "2D");
        assert_eq!(age(86_400), "1D");
        assert_eq!(age(36 * 3600), "36h");
        assert_eq!(age(90 * 60), "90m");
        assert_eq!(age(90), "90s");
        assert_eq!(max_age_argument(Duration::from_millis(90_500)), "90s");
        assert_eq!(age(0), "0s");
    }
}
