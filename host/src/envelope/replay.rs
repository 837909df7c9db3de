//! The replay stamps (contract §4 and §11, "Replay"): what a message moved
//! back from `{q}.dlq` or `{q}.parked` to `{q}` carries, and how they are
//! read back, tolerantly, whichever library wrote them.
//!
//! The stamps are ordinary application headers under the shared `acemq-`
//! prefix, not the reserved `x-acemq-` one: every AceMQ consumer drops
//! unknown `x-acemq-*` headers on the way in, so a stamp written there would
//! never reach the handler that might want to treat a replayed message
//! differently.

use std::time::{Duration, UNIX_EPOCH};

use lapin::BasicProperties;
use lapin::types::FieldTable;

use super::headers::HeaderValue;
use super::{Envelope, republish_properties};

/// The wire names of the replay stamps, spelled as every library spells them.
pub mod stamp {
    /// The set-aside queue the message was moved out of (a string).
    pub const REPLAYED_FROM: &str = "acemq-replayed-from";
    /// When it was moved: RFC 3339 in UTC with milliseconds
    /// (`2026-02-03T04:05:06.789Z`). Older writers put epoch milliseconds.
    pub const REPLAYED_AT: &str = "acemq-replayed-at";
    /// How many times it has been replayed, an integer; absent means 0.
    pub const REPLAY_COUNT: &str = "acemq-replay-count";
}

/// The replay stamps a message carries, read tolerantly: any integer width
/// or a numeric string for the count, RFC 3339 (`Z` or `+00:00`) or epoch
/// milliseconds for the time. Anything unreadable reads as absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayStamps {
    /// `acemq-replayed-from`.
    pub from: Option<String>,
    /// `acemq-replayed-at`, epoch milliseconds.
    pub at_ms: Option<u64>,
    /// `acemq-replay-count`; 0 when absent, negative or unreadable.
    pub count: u64,
}

impl ReplayStamps {
    /// The stamps in a delivery's header table.
    #[must_use]
    pub fn read(headers: Option<&FieldTable>) -> Self {
        // The plugin-visible form of a header is the host's one tolerant
        // reading of an application header's value; the stamps are read
        // through it rather than through a parser of their own.
        let value = |name: &str| {
            headers
                .and_then(|table| table.inner().get(name))
                .and_then(HeaderValue::from_amqp)
        };
        let from = match value(stamp::REPLAYED_FROM) {
            Some(HeaderValue::Text(text)) if !text.is_empty() => Some(text),
            Some(HeaderValue::Bytes(bytes)) if !bytes.is_empty() => {
                Some(String::from_utf8_lossy(&bytes).into_owned())
            }
            _ => None,
        };
        let at_ms = match value(stamp::REPLAYED_AT) {
            Some(HeaderValue::Text(text)) => parse_rfc3339_ms(&text),
            Some(HeaderValue::Int(ms)) => u64::try_from(ms).ok(),
            _ => None,
        };
        let count = match value(stamp::REPLAY_COUNT) {
            Some(HeaderValue::Int(n)) => u64::try_from(n).unwrap_or(0),
            Some(HeaderValue::Text(text)) => text.trim().parse().unwrap_or(0),
            _ => 0,
        };
        Self { from, at_ms, count }
    }
}

/// `ms` since the Unix epoch as the stamp writes it: RFC 3339, UTC,
/// milliseconds, `Z` (`2026-02-03T04:05:06.789Z`).
#[must_use]
pub fn rfc3339_millis(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// An RFC 3339 time in UTC (`Z` or `+00:00`, any fraction) as epoch
/// milliseconds; `None` when it is not one, or lies before 1970.
#[must_use]
pub fn parse_rfc3339_ms(text: &str) -> Option<u64> {
    let time = humantime::parse_rfc3339(text.trim()).ok()?;
    let since = time.duration_since(UNIX_EPOCH).ok()?;
    u64::try_from(since.as_millis()).ok()
}

impl Envelope {
    /// The envelope of a message replayed out of a set-aside queue: attempt
    /// back to 1, `x-acemq-error` cleared, everything else kept (the id, so
    /// consumers can still tell a duplicate; first-seen, so the age limit
    /// still counts from the first publish: a fix was for the bug, not the
    /// clock).
    ///
    /// The reason is cleared because the contract has `x-acemq-error` only
    /// on set-aside copies (§4) and a replayed message is going back to
    /// work, as a retry copy is ([`Envelope::for_retry`] clears it too); the
    /// other AceMQ libraries' replays clear it as well. Where the message
    /// came from stays readable in `acemq-replayed-from`.
    #[must_use]
    pub fn for_replay(&self) -> Self {
        Self {
            attempt: 1,
            error: None,
            ..self.clone()
        }
    }
}

/// The properties of a message replayed out of `from_queue` at `now_ms`:
/// [`republish_properties`] with [`Envelope::for_replay`], plus the stamps
/// `acemq-replayed-from` = `from_queue`, `acemq-replayed-at` = `now_ms` in
/// RFC 3339 and `acemq-replay-count` = the count the original carried + 1.
///
/// Every other header (`traceparent`, `x-death`, the application's own) and
/// property goes through as the host's republish carries it, which means
/// two properties are dropped: `expiration` and `user-id` (see
/// [`republish_properties`] for why).
#[must_use]
pub fn replay_properties(
    original: &BasicProperties,
    envelope: &Envelope,
    from_queue: &str,
    now_ms: u64,
) -> BasicProperties {
    let previous = ReplayStamps::read(original.headers().as_ref()).count;
    let properties = republish_properties(original, &envelope.for_replay());
    let mut headers = properties.headers().clone().unwrap_or_default();
    let count = i64::try_from(previous.saturating_add(1)).unwrap_or(i64::MAX);
    for (name, value) in [
        (
            stamp::REPLAYED_FROM,
            HeaderValue::Text(from_queue.to_owned()),
        ),
        (
            stamp::REPLAYED_AT,
            HeaderValue::Text(rfc3339_millis(now_ms)),
        ),
        (stamp::REPLAY_COUNT, HeaderValue::Int(count)),
    ] {
        headers.insert(name.into(), value.to_amqp());
    }
    properties.with_headers(headers)
}

#[cfg(test)]
mod tests {
    use lapin::types::AMQPValue;

    use super::*;
    use crate::envelope::test_support::*;
    use crate::envelope::{header, is_reserved};

    const SET_ASIDE: &str = "exhausted 3 attempts: boom";

    fn dead_letter() -> BasicProperties {
        let envelope = Envelope::read(
            &with_headers(vec![
                (header::ID, ls("id-1")),
                (header::TYPE, ls("order.placed")),
                (header::ATTEMPT, AMQPValue::LongInt(3)),
                (header::FIRST_SEEN, AMQPValue::LongLongInt(EARLIER as i64)),
            ]),
            "orders.new",
            NOW,
        );
        crate::envelope::set_aside_properties(
            &BasicProperties::default()
                .with_content_type("text/plain".into())
                .with_correlation_id("corr".into())
                .with_headers(table(vec![
                    ("traceparent", ls(TRACEPARENT)),
                    ("x-death", x_death()),
                    ("x-tenant", AMQPValue::LongLongInt(7)),
                ])),
            &envelope,
            SET_ASIDE,
        )
    }

    #[test]
    fn stamp_names_are_the_contracts_and_not_reserved() {
        assert_eq!(stamp::REPLAYED_FROM, "acemq-replayed-from");
        assert_eq!(stamp::REPLAYED_AT, "acemq-replayed-at");
        assert_eq!(stamp::REPLAY_COUNT, "acemq-replay-count");
        for name in [
            stamp::REPLAYED_FROM,
            stamp::REPLAYED_AT,
            stamp::REPLAY_COUNT,
        ] {
            assert!(!is_reserved(name));
        }
    }

    #[test]
    fn a_replay_resets_the_attempt_clears_the_reason_and_stamps_the_first_replay() {
        let original = dead_letter();
        let envelope = Envelope::read(&original, "orders.new", NOW);
        assert_eq!(envelope.error.as_deref(), Some(SET_ASIDE));
        let copy = replay_properties(&original, &envelope, "orders.new.dlq", NOW);
        let headers = headers_of(&copy);
        assert_eq!(get(headers, header::ATTEMPT), Some(&AMQPValue::LongInt(1)));
        assert_eq!(get(headers, header::ERROR), None);
        assert_eq!(
            get(headers, stamp::REPLAYED_FROM),
            Some(&ls("orders.new.dlq"))
        );
        assert_eq!(
            get(headers, stamp::REPLAYED_AT),
            Some(&ls("2026-02-03T04:05:06.789Z"))
        );
        assert_eq!(
            get(headers, stamp::REPLAY_COUNT),
            Some(&AMQPValue::LongLongInt(1))
        );
        // Everything else as it was: the other envelope fields, application
        // and broker headers, and the properties.
        let before = headers_of(&original);
        for (name, value) in before {
            if [header::ATTEMPT, header::ERROR].contains(&name.as_str()) {
                continue;
            }
            assert_eq!(get(headers, name.as_str()), Some(value), "{name}");
        }
        assert_eq!(headers.inner().len(), before.inner().len() - 1 + 3);
        assert_eq!(copy.message_id(), original.message_id());
        assert_eq!(copy.content_type(), original.content_type());
        assert_eq!(copy.correlation_id(), original.correlation_id());
        assert_eq!(copy.delivery_mode(), original.delivery_mode());
        // What a consumer reads off the wire.
        let read = Envelope::from_headers(Some(&over_the_wire(headers)), None, "orders.new", NOW);
        assert_eq!(read, envelope.for_replay());
    }

    #[test]
    fn a_second_replay_counts_two_and_restamps_where_and_when() {
        let original = dead_letter();
        let envelope = Envelope::read(&original, "orders.new", NOW);
        let once = replay_properties(&original, &envelope, "orders.new.parked", EARLIER);
        let twice = replay_properties(&once, &envelope, "orders.new.dlq", NOW);
        let stamps = ReplayStamps::read(twice.headers().as_ref());
        assert_eq!(
            stamps,
            ReplayStamps {
                from: Some("orders.new.dlq".into()),
                at_ms: Some(NOW),
                count: 2,
            }
        );
    }

    #[test]
    fn stamps_are_read_in_every_form_a_library_writes() {
        let read = |entries: Vec<(&str, AMQPValue)>| ReplayStamps::read(Some(&table(entries)));
        assert_eq!(read(vec![]), ReplayStamps::default());
        let stamps = read(vec![
            (stamp::REPLAYED_FROM, ls("q.dlq")),
            (stamp::REPLAYED_AT, AMQPValue::LongLongInt(NOW as i64)),
            (stamp::REPLAY_COUNT, AMQPValue::ShortShortInt(4)),
        ]);
        assert_eq!((stamps.at_ms, stamps.count), (Some(NOW), 4));
        let stamps = read(vec![
            (stamp::REPLAYED_AT, ls("2026-02-03T04:05:06.789+00:00")),
            (stamp::REPLAY_COUNT, ls(" 12 ")),
        ]);
        assert_eq!((stamps.at_ms, stamps.count), (Some(NOW), 12));
        let stamps = read(vec![
            (stamp::REPLAYED_FROM, ls("")),
            (stamp::REPLAYED_AT, ls("yesterday")),
            (stamp::REPLAY_COUNT, AMQPValue::LongLongInt(-3)),
        ]);
        assert_eq!(stamps, ReplayStamps::default());
    }

    #[test]
    fn times_round_trip_through_rfc3339_with_milliseconds() {
        assert_eq!(rfc3339_millis(NOW), "2026-02-03T04:05:06.789Z");
        assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(parse_rfc3339_ms("2026-02-03T04:05:06.789Z"), Some(NOW));
        assert_eq!(parse_rfc3339_ms("2026-02-03T04:05:06Z"), Some(NOW - 789));
        assert_eq!(parse_rfc3339_ms("2026-02-03 04:05:06"), None);
    }
}
