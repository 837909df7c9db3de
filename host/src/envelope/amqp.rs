//! AMQP field values as the envelope reads and writes them: the small
//! conversions that reading (`read.rs`), plugin headers (`headers.rs`) and
//! properties (`properties.rs`) share, kept apart so that those three
//! depend on this file and never on each other in a circle.

use lapin::types::{AMQPValue, LongString, ShortString};

/// Every string this host writes into a header table is a long string (see
/// [`HeaderValue::to_amqp`] for why); plugin headers and the envelope share it.
pub(crate) fn long_string(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// `None` when the value is too long for a short string, so the caller can
/// leave the property out or refuse it where lapin's `From` would panic.
pub(super) fn short_string(value: &str) -> Option<ShortString> {
    ShortString::try_new(value).ok()
}

/// The value of an AMQP integer type, `None` for every other type.
pub(crate) fn integer_value(value: &AMQPValue) -> Option<i128> {
    Some(match *value {
        AMQPValue::ShortShortInt(n) => n.into(),
        AMQPValue::ShortShortUInt(n) => n.into(),
        AMQPValue::ShortInt(n) => n.into(),
        AMQPValue::ShortUInt(n) => n.into(),
        AMQPValue::LongInt(n) => n.into(),
        AMQPValue::LongUInt(n) => n.into(),
        AMQPValue::LongLongInt(n) => n.into(),
        AMQPValue::Timestamp(n) => n.into(),
        _ => return None,
    })
}
