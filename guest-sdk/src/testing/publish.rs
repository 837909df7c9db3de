//! `publish`: the host's refusals (the consumer's `publish_to`, a delayed
//! message the consumer may not send or that is due too far ahead, the
//! envelope fields, the reserved `x-acemq-*` headers, the scheduler's
//! `x-schedule-*` headers on a delayed message, an id already used in the
//! call), in the same order as the host's `plugin/host/publish.rs`; its output limits are not
//! modelled. Each buffered output gets the [`Sent`] the host would return
//! (see [`envelope`](super::envelope) for its id).

use std::collections::BTreeSet;
use std::time::Duration;

use crate::HeaderValue;

use super::envelope::{check_fields, check_unique, sent};
use super::{Outgoing, Published, Sent, TestHost, with_state};

const RESERVED_PREFIX: &str = "x-acemq-";
/// The headers of a scheduled message that say where and when it goes.
const SCHEDULE_PREFIX: &str = "x-schedule-";

impl TestHost {
    /// Refuses publishes to exchanges not listed, as the host does with the
    /// consumer's `publish_to`. Without it every exchange is allowed (the
    /// real host allows none that `publish_to` does not list).
    pub fn publish_to<S: Into<String>>(mut self, exchanges: impl IntoIterator<Item = S>) -> Self {
        self.publish_to = Some(exchanges.into_iter().map(Into::into).collect());
        self
    }

    /// Whether the consumer may publish delayed messages
    /// ([`deliver_at`](crate::Publish::deliver_at),
    /// [`delay`](crate::Publish::delay)), as its `publish_delayed` setting
    /// says. `false` refuses them as the host does; unset, they are allowed
    /// (the real host allows them only with `publish_delayed = true`).
    pub fn publish_delayed(mut self, allowed: bool) -> Self {
        self.publish_delayed = allowed;
        self
    }

    /// The longest delay the host schedules (its `[scheduler] max_delay`):
    /// a message due further ahead of [`now_ms`](TestHost::now_ms) is
    /// refused. Default: [`DEFAULT_MAX_DELAY`], the host's default.
    pub fn max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }
}

/// The host's `[scheduler] max_delay` when its configuration sets none:
/// 30 days.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(30 * 24 * 3600);

pub(crate) fn publish(msg: &Outgoing) -> Result<Sent, String> {
    with_state(|s| {
        if let Some(allowed) = &s.host.publish_to {
            check_allowed(allowed, &msg.exchange)?;
        }
        let due_in = msg
            .deliver_at_ms
            .map(|at| check_delay(&s.host, at))
            .transpose()?;
        check_fields(&msg.envelope)?;
        check_headers(&msg.headers)?;
        if msg.deliver_at_ms.is_some() {
            check_schedule_headers(&msg.headers)?;
        }
        let sent = sent(
            &msg.envelope,
            &s.input,
            &format!("output {}", s.published.len()),
        );
        check_unique(&sent.id, s.sent_ids())?;
        s.published.push(Published {
            message: msg.clone(),
            sent: sent.clone(),
            due_in,
        });
        Ok(sent)
    })
}

fn check_allowed(allowed: &BTreeSet<String>, exchange: &str) -> Result<(), String> {
    if allowed.contains(exchange) {
        return Ok(());
    }
    let allowed: Vec<String> = allowed.iter().map(|e| format!("'{e}'")).collect();
    Err(format!(
        "publishing to exchange '{exchange}' is not allowed for this consumer (publish_to = [{}])",
        allowed.join(", ")
    ))
}

/// Refuses a delayed message the consumer may not publish, or one due
/// further ahead than `max_delay`; otherwise answers how long until it is
/// due.
fn check_delay(host: &TestHost, deliver_at_ms: u64) -> Result<Duration, String> {
    if !host.publish_delayed {
        return Err(
            "delayed publishing (deliver-at-ms) is not allowed for this consumer: \
             set publish_delayed = true in its [[consumers]] entry"
                .to_string(),
        );
    }
    let due_in = Duration::from_millis(deliver_at_ms.saturating_sub(host.now_ms));
    if due_in > host.max_delay {
        return Err(format!(
            "deliver-at-ms {deliver_at_ms} is {} from now, beyond the longest delay \
             this host schedules ([scheduler] max_delay = {})",
            // The host shows how far ahead in whole seconds.
            human(Duration::from_secs(due_in.as_secs())),
            human(host.max_delay)
        ));
    }
    Ok(due_in)
}

/// A duration as the host writes it in its refusals (and as its config
/// reads it): the units that are not zero, largest first, with a year of
/// 365.25 days and a month of 30.44 days: `30days`, `1h 30m`, `1month 4h`,
/// `250ms`, `0s`.
fn human(d: Duration) -> String {
    const DAY: u64 = 86_400;
    const MONTH: u64 = 2_630_016;
    const YEAR: u64 = 31_557_600;
    let secs = d.as_secs();
    let in_year = secs % YEAR;
    let in_month = in_year % MONTH;
    let in_day = in_month % DAY;
    let nanos = u64::from(d.subsec_nanos());
    // (count, unit, whether the unit takes a plural `s`)
    let parts = [
        (secs / YEAR, "year", true),
        (in_year / MONTH, "month", true),
        (in_month / DAY, "day", true),
        (in_day / 3600, "h", false),
        (in_day % 3600 / 60, "m", false),
        (in_day % 60, "s", false),
        (nanos / 1_000_000, "ms", false),
        (nanos / 1_000 % 1_000, "us", false),
        (nanos % 1_000, "ns", false),
    ];
    let shown: Vec<String> = parts
        .into_iter()
        .filter(|&(count, ..)| count > 0)
        .map(|(count, unit, plural)| {
            let s = if plural && count > 1 { "s" } else { "" };
            format!("{count}{unit}{s}")
        })
        .collect();
    if shown.is_empty() {
        "0s".to_string()
    } else {
        shown.join(" ")
    }
}

/// Refuses, on a delayed message, a header of the scheduler's own
/// `x-schedule-*` namespace: the host writes those to say where and when the
/// message goes.
fn check_schedule_headers(headers: &[(String, HeaderValue)]) -> Result<(), String> {
    match headers
        .iter()
        .find(|(name, _)| name.starts_with(SCHEDULE_PREFIX))
    {
        Some((name, _)) => Err(format!(
            "the header '{name}' is the scheduler's (x-schedule-* headers say where and when \
             a delayed message goes, and the host writes them)"
        )),
        None => Ok(()),
    }
}

/// Refuses a header in the reserved `x-acemq-*` namespace (outputs and
/// replies alike).
pub(crate) fn check_headers(headers: &[(String, HeaderValue)]) -> Result<(), String> {
    let reserved = headers.iter().find(|(name, _)| {
        name.get(..RESERVED_PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_PREFIX))
    });
    match reserved {
        Some((name, _)) => Err(format!(
            "header '{name}' is in the reserved '{RESERVED_PREFIX}' namespace, which belongs to AceMQ; \
             use a namespace of your own, such as x-yourcompany-"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_written_as_the_host_writes_them() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_secs(60), "1m"),
            (Duration::from_secs(5400), "1h 30m"),
            (Duration::from_secs(86_400), "1day"),
            (Duration::from_secs(30 * 86_400), "30days"),
            // 31 days is a month (30.44 days) and 13h 26m 24s.
            (Duration::from_secs(31 * 86_400), "1month 13h 26m 24s"),
            (Duration::from_secs(2 * 31_557_600 + 1), "2years 1s"),
            (Duration::new(1, 1_001_001), "1s 1ms 1us 1ns"),
        ];
        for (d, shown) in cases {
            assert_eq!(human(d), shown, "{d:?}");
        }
    }
}
