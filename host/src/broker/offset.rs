//! Where a stream consumer starts: a position named by the `x-stream-offset`
//! consumer argument.
//!
//! A stream never removes a message, and its AMQP type matters to the
//! broker: `first`, `last` and `next` as strings, an absolute offset as an
//! integer, a point in time as an AMQP timestamp (seconds), and an interval
//! back from now as a string like `3600s`. `next` is the broker's default
//! and is still sent explicitly, as every AceMQ library does.

use std::time::{Duration, UNIX_EPOCH};

use lapin::types::{AMQPValue, LongString};

/// The consumer argument naming where a stream subscription starts.
pub const OFFSET_ARGUMENT: &str = "x-stream-offset";

/// Where a stream consumer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamOffset {
    /// The oldest message the stream still holds.
    First,
    /// The last chunk written (a few of the newest messages).
    Last,
    /// Only what is appended from now on.
    Next,
    /// The message at this offset.
    At(u64),
    /// The first chunk written at or after this many seconds since the epoch.
    Since(u64),
    /// Messages written within this interval before the subscription.
    Ago(Duration),
}

impl StreamOffset {
    /// Reads a config value: `first`, `last`, `next`, an RFC 3339 time
    /// (`2026-11-30T12:00:00Z`) or an interval back from now (`1h`, `90m`).
    /// An integer offset comes as a number, see [`StreamOffset::At`].
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim() {
            "first" => return Ok(StreamOffset::First),
            "last" => return Ok(StreamOffset::Last),
            "next" => return Ok(StreamOffset::Next),
            _ => {}
        }
        if let Ok(time) = humantime::parse_rfc3339_weak(text.trim()) {
            let seconds = time
                .duration_since(UNIX_EPOCH)
                .map_err(|_| format!("the time {text:?} is before 1970"))?
                .as_secs();
            return Ok(StreamOffset::Since(seconds));
        }
        match humantime::parse_duration(text.trim()) {
            Ok(interval) if interval >= Duration::from_secs(1) => Ok(StreamOffset::Ago(interval)),
            Ok(_) => Err(format!(
                "the interval {text:?} is under a second; the broker counts whole seconds"
            )),
            Err(_) => Err(format!(
                "{text:?} is not an offset: use \"first\", \"last\", \"next\", an offset number, an RFC 3339 time such as \"2026-11-30T12:00:00Z\", or an interval back from now such as \"1h\""
            )),
        }
    }

    /// A position as an operator gives it (`replay --from`, `stream reset
    /// --to`, a checkpoint): an offset number, or what [`StreamOffset::parse`]
    /// reads.
    pub fn parse_position(text: &str) -> Result<Self, String> {
        match text.trim().parse::<u64>() {
            Ok(offset) => Ok(StreamOffset::At(offset)),
            Err(_) => StreamOffset::parse(text),
        }
    }

    /// The `x-stream-offset` value, typed as the broker expects it.
    pub fn to_amqp(self) -> AMQPValue {
        let text = |s: String| AMQPValue::LongString(LongString::from(s));
        match self {
            StreamOffset::First => text("first".into()),
            StreamOffset::Last => text("last".into()),
            StreamOffset::Next => text("next".into()),
            StreamOffset::At(offset) => {
                AMQPValue::LongLongInt(i64::try_from(offset).unwrap_or(i64::MAX))
            }
            StreamOffset::Since(seconds) => AMQPValue::Timestamp(seconds),
            StreamOffset::Ago(interval) => text(format!("{}s", interval.as_secs())),
        }
    }

    /// The offset read from a delivery's `x-stream-offset` header.
    pub fn of_delivery(headers: Option<&lapin::types::FieldTable>) -> Option<u64> {
        let value = headers?.inner().get(OFFSET_ARGUMENT)?;
        let number = match value {
            AMQPValue::LongLongInt(n) => *n,
            AMQPValue::LongInt(n) => i64::from(*n),
            AMQPValue::Timestamp(n) => i64::try_from(*n).ok()?,
            _ => return None,
        };
        u64::try_from(number).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_offset_is_read_and_typed_as_the_broker_expects() {
        let text = |s: &str| AMQPValue::LongString(LongString::from(s));
        assert_eq!(
            StreamOffset::parse("first").unwrap().to_amqp(),
            text("first")
        );
        assert_eq!(StreamOffset::parse("last").unwrap().to_amqp(), text("last"));
        assert_eq!(StreamOffset::parse("next").unwrap().to_amqp(), text("next"));
        assert_eq!(StreamOffset::At(42).to_amqp(), AMQPValue::LongLongInt(42));
        assert_eq!(
            StreamOffset::parse("2026-11-30T12:00:00Z").unwrap(),
            StreamOffset::Since(1_796_040_000)
        );
        assert_eq!(
            StreamOffset::Since(1_796_040_000).to_amqp(),
            AMQPValue::Timestamp(1_796_040_000)
        );
        assert_eq!(StreamOffset::parse("1h").unwrap().to_amqp(), text("3600s"));
        let err = StreamOffset::parse("yesterday").unwrap_err();
        assert!(err.contains("is not an offset"), "{err}");
        assert!(
            StreamOffset::parse("500ms")
                .unwrap_err()
                .contains("under a second")
        );
    }

    #[test]
    fn the_offset_of_a_delivery_is_read_from_its_header() {
        let mut headers = lapin::types::FieldTable::default();
        headers.insert(OFFSET_ARGUMENT.into(), AMQPValue::LongLongInt(7));
        assert_eq!(StreamOffset::of_delivery(Some(&headers)), Some(7));
        assert_eq!(StreamOffset::of_delivery(None), None);
    }
}
