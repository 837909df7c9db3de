//! Reading the envelope off a delivery, for the consumer: [`Envelope::read`]
//! turns the known `x-acemq-*` headers into fields, and [`split_headers`]
//! gives the plugin the rest as [`AppHeaders`].
//!
//! Reading is tolerant because a message from another producer is still a
//! message: a header written with another integer width, as a numeric string
//! or as bytes is accepted, and anything missing or unreadable takes the
//! contract's default. Nothing here fails.

use std::sync::Arc;

use bytes::Bytes;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};

use super::amqp::integer_value;
use super::headers::HeaderValue;
use super::{Envelope, MessageId, header, is_reserved, non_empty, or_default_type};

/// What a plugin sees of a delivery's headers: the envelope taken out.
///
/// A republish (retry, set-aside) needs no copy of its own: it writes the
/// delivery's headers through [`Envelope::to_headers`], which drops the old
/// envelope on the way.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppHeaders {
    /// The flat non-`x-acemq-*` headers, in table order. Tables, arrays,
    /// decimals and voids are left out (a republish still carries them).
    pub visible: Vec<(String, HeaderValue)>,
    /// The broker's `x-stream-offset`, read tolerantly; `None` when absent,
    /// negative or unreadable.
    pub stream_offset: Option<u64>,
}

/// Splits a delivery's headers into the application's part (see
/// [`AppHeaders`]). Every `x-acemq-*` header, known or not, is left out:
/// [`Envelope::read`] turns the known ones into fields and the rest are
/// dropped, as every AceMQ library does.
#[must_use]
pub fn split_headers(properties: &BasicProperties) -> AppHeaders {
    split_table(properties.headers().as_ref())
}

/// The broker's `x-stream-offset` of a delivery, read as [`split_headers`]
/// does, without reading the other headers.
#[must_use]
pub fn stream_offset(properties: &BasicProperties) -> Option<u64> {
    let headers = properties.headers().as_ref()?;
    offset_value(headers.inner().get(header::STREAM_OFFSET)?)
}

/// An `x-stream-offset` value, read tolerantly: `None` when negative or
/// unreadable.
fn offset_value(value: &AMQPValue) -> Option<u64> {
    integer(value).and_then(|n| u64::try_from(n).ok())
}

/// [`split_headers`] over a bare header table.
#[must_use]
pub fn split_table(headers: Option<&FieldTable>) -> AppHeaders {
    let mut out = AppHeaders::default();
    let Some(headers) = headers else {
        return out;
    };
    for (name, value) in headers {
        if is_reserved(name.as_str()) {
            continue;
        }
        if name.as_str() == header::STREAM_OFFSET {
            out.stream_offset = offset_value(value);
        }
        if let Some(visible) = HeaderValue::from_amqp(value) {
            out.visible.push((name.as_str().to_owned(), visible));
        }
    }
    out
}

/// The known `x-acemq-*` entries of a header table, found in one ordered
/// scan: a delivery is read once per message, and a dozen separate lookups
/// in the table cost more than the handler call they precede.
#[derive(Default)]
struct ReservedHeaders<'a> {
    id: Option<&'a AMQPValue>,
    message_type: Option<&'a AMQPValue>,
    version: Option<&'a AMQPValue>,
    correlation: Option<&'a AMQPValue>,
    causation: Option<&'a AMQPValue>,
    attempt: Option<&'a AMQPValue>,
    first_seen: Option<&'a AMQPValue>,
    origin: Option<&'a AMQPValue>,
    error: Option<&'a AMQPValue>,
    claim: Option<&'a AMQPValue>,
    route: Option<&'a AMQPValue>,
    route_position: Option<&'a AMQPValue>,
    route_id: Option<&'a AMQPValue>,
}

impl<'a> ReservedHeaders<'a> {
    fn collect(headers: Option<&'a FieldTable>) -> Self {
        use std::ops::Bound;
        let mut found = Self::default();
        let Some(table) = headers else {
            return found;
        };
        // Every name with the prefix sorts between "x-acemq-" and "x-acemq."
        // ('.' follows '-' in ASCII).
        let upper = "x-acemq.";
        let reserved = table.inner().range::<str, _>((
            Bound::Included(header::RESERVED_PREFIX),
            Bound::Excluded(upper),
        ));
        for (name, value) in reserved {
            let slot = match name.as_str() {
                header::ID => &mut found.id,
                header::TYPE => &mut found.message_type,
                header::VERSION => &mut found.version,
                header::CORRELATION => &mut found.correlation,
                header::CAUSATION => &mut found.causation,
                header::ATTEMPT => &mut found.attempt,
                header::FIRST_SEEN => &mut found.first_seen,
                header::ORIGIN => &mut found.origin,
                header::ERROR => &mut found.error,
                header::CLAIM => &mut found.claim,
                header::ROUTE => &mut found.route,
                header::ROUTE_POSITION => &mut found.route_position,
                header::ROUTE_ID => &mut found.route_id,
                // Unknown names (a newer library's) are dropped unread.
                _ => continue,
            };
            *slot = Some(value);
        }
        found
    }
}

impl Envelope {
    /// Reads the envelope of a delivery. Never fails: missing, empty or
    /// unreadable headers take the contract's defaults (id <= `message-id`
    /// property <= new UUID v4; type <= routing key <= `message`;
    /// correlation <= id; version and attempt at least 1; first seen <= now).
    ///
    /// Known names are matched exactly as every library writes them; another
    /// spelling of the prefix (`X-AceMQ-Id`) is not read, only dropped by
    /// [`split_headers`].
    #[must_use]
    pub fn read(properties: &BasicProperties, routing_key: &str, now_ms: u64) -> Self {
        Self::from_headers(
            properties.headers().as_ref(),
            properties.message_id().as_ref().map(ShortString::as_str),
            routing_key,
            now_ms,
        )
    }

    /// [`Envelope::read`] of a delivery with `body`: a message that names
    /// no id gets the one derived from what the broker delivered
    /// ([`derived_input_id`](super::derived_input_id)), the same at every
    /// delivery of it, instead of a fresh one each time.
    ///
    /// `stream` is the name of the stream the consumer reads, when it reads
    /// one: there a message's offset names it
    /// ([`stream_message_id`](super::stream_message_id)).
    ///
    /// The derived id is made when something first reads it
    /// ([`MessageId::derived`]): a handler that only acks needs none.
    #[must_use]
    pub fn read_delivery(
        properties: &Arc<BasicProperties>,
        routing_key: &str,
        body: &Bytes,
        stream: Option<&str>,
        now_ms: u64,
    ) -> Self {
        Self::from_headers_or(
            properties.headers().as_ref(),
            properties.message_id().as_ref().map(ShortString::as_str),
            routing_key,
            now_ms,
            || match stream.zip(stream_offset(properties)) {
                Some((stream, offset)) => super::stream_message_id(stream, offset).into(),
                None => {
                    let (properties, body) = (properties.clone(), body.clone());
                    MessageId::derived(move || super::derived_input_id(&properties, &body))
                }
            },
        )
    }

    /// [`Envelope::read`] over a bare header table and `message-id`.
    #[must_use]
    pub fn from_headers(
        headers: Option<&FieldTable>,
        message_id: Option<&str>,
        routing_key: &str,
        now_ms: u64,
    ) -> Self {
        Self::from_headers_or(headers, message_id, routing_key, now_ms, || {
            uuid::Uuid::new_v4().to_string().into()
        })
    }

    /// [`Envelope::from_headers`], with `no_id` making the id of a message
    /// that names none.
    pub(crate) fn from_headers_or(
        headers: Option<&FieldTable>,
        message_id: Option<&str>,
        routing_key: &str,
        now_ms: u64,
        no_id: impl FnOnce() -> MessageId,
    ) -> Self {
        let reserved = ReservedHeaders::collect(headers);

        // Java falls back to the AMQP property; a message nobody stamped
        // still needs an id, and the republish writes it so later attempts
        // keep it.
        let id = reserved
            .id
            .and_then(text)
            .or_else(|| message_id.and_then(non_empty))
            .map_or_else(no_id, MessageId::from);
        let message_type = reserved
            .message_type
            .and_then(text)
            .unwrap_or_else(|| or_default_type(routing_key));
        let correlation_id = reserved
            .correlation
            .and_then(text)
            .map_or_else(|| id.clone(), MessageId::from);
        // Below 1 is not a version or an attempt; 1 is what a message that
        // never said reads as. Beyond u32 saturates: it is still a large
        // number, and for the attempt that means "give up", not "start over".
        let at_least_one = |value: Option<&AMQPValue>| {
            value
                .and_then(integer)
                .map_or(1, |n| u32::try_from(n.max(1)).unwrap_or(u32::MAX))
        };
        let first_seen_ms = reserved.first_seen.and_then(epoch_millis).unwrap_or(now_ms);

        Self {
            version: at_least_one(reserved.version),
            attempt: at_least_one(reserved.attempt),
            first_seen_ms,
            causation_id: reserved.causation.and_then(text),
            origin: reserved.origin.and_then(text),
            error: reserved.error.and_then(text),
            claim: reserved.claim.and_then(text),
            route: reserved.route.and_then(text),
            // Kept as read, even negative: judging a slip is the pipeline's
            // business, and it can only do so if it sees what was written.
            route_position: reserved
                .route_position
                .and_then(integer)
                .and_then(|n| i64::try_from(n).ok()),
            route_id: reserved.route_id.and_then(text),
            id,
            message_type,
            correlation_id,
        }
    }
}

/// A string header, tolerantly: long and short strings and byte arrays
/// (invalid UTF-8 replaced, as Python decodes them), integers in decimal.
/// Empty reads as absent, so a default applies.
fn text(value: &AMQPValue) -> Option<String> {
    let text = match value {
        AMQPValue::LongString(s) => utf8_or_replaced(s.as_bytes()),
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::ByteArray(b) => utf8_or_replaced(b.as_slice()),
        other => integer_value(other)?.to_string(),
    };
    (!text.is_empty()).then_some(text)
}

/// The bytes as text, invalid UTF-8 replaced. Valid text (the usual case)
/// takes the validator's fast path and one copy.
fn utf8_or_replaced(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// An integer header, tolerantly: every AMQP integer width and timestamps,
/// and decimal strings in any string form (surrounding blanks ignored).
/// Booleans and floats are not integers (Python reads them as unreadable
/// too). `i128` holds every width without loss; each field narrows it.
fn integer(value: &AMQPValue) -> Option<i128> {
    let digits = match value {
        AMQPValue::LongString(s) => s.as_bytes(),
        AMQPValue::ByteArray(b) => b.as_slice(),
        AMQPValue::ShortString(s) => s.as_str().as_bytes(),
        other => return integer_value(other),
    };
    std::str::from_utf8(digits).ok()?.trim().parse().ok()
}

/// `x-acemq-first-seen` as epoch milliseconds. An AMQP timestamp counts
/// seconds (a producer handing its client a date gets one), so it is scaled;
/// every other integer is taken as milliseconds, as written. Negative is
/// unreadable.
fn epoch_millis(value: &AMQPValue) -> Option<u64> {
    match *value {
        AMQPValue::Timestamp(seconds) => Some(seconds.saturating_mul(1000)),
        _ => u64::try_from(integer(value)?).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::test_support::*;
    use crate::envelope::{DEFAULT_MESSAGE_TYPE, republish_properties};
    use lapin::types::{ByteArray, DecimalValue, FieldArray, LongString};

    fn read(entries: Vec<(&str, AMQPValue)>) -> Envelope {
        Envelope::read(&with_headers(entries), "orders.new", NOW)
    }

    #[test]
    fn reads_every_field_written_the_usual_way() {
        let envelope = read(vec![
            (header::ID, ls("id-1")),
            (header::TYPE, ls("order.placed")),
            (header::VERSION, AMQPValue::LongLongInt(3)),
            (header::CORRELATION, ls("corr-1")),
            (header::CAUSATION, ls("cause-1")),
            (header::ATTEMPT, AMQPValue::LongLongInt(4)),
            (header::FIRST_SEEN, AMQPValue::LongLongInt(EARLIER as i64)),
            (header::ORIGIN, ls("billing@host-a")),
            (header::ERROR, ls("exhausted 4 attempts: E: x")),
            (header::CLAIM, ls("s3://b/k")),
            (header::ROUTE, ls("a,b,c")),
            (header::ROUTE_POSITION, AMQPValue::LongLongInt(2)),
            (header::ROUTE_ID, ls("run-1")),
        ]);
        assert_eq!(
            envelope,
            Envelope {
                id: "id-1".into(),
                message_type: "order.placed".into(),
                version: 3,
                correlation_id: "corr-1".into(),
                causation_id: Some("cause-1".into()),
                attempt: 4,
                first_seen_ms: EARLIER,
                origin: Some("billing@host-a".into()),
                error: Some("exhausted 4 attempts: E: x".into()),
                claim: Some("s3://b/k".into()),
                route: Some("a,b,c".into()),
                route_position: Some(2),
                route_id: Some("run-1".into()),
            }
        );
    }

    #[test]
    fn reads_integers_of_every_width() {
        let widths = [
            AMQPValue::ShortShortInt(3),
            AMQPValue::ShortShortUInt(3),
            AMQPValue::ShortInt(3),
            AMQPValue::ShortUInt(3),
            AMQPValue::LongInt(3),
            AMQPValue::LongUInt(3),
            AMQPValue::LongLongInt(3),
            AMQPValue::Timestamp(3),
        ];
        for value in widths {
            let envelope = read(vec![
                (header::ATTEMPT, value.clone()),
                (header::VERSION, value.clone()),
                (header::ROUTE_POSITION, value.clone()),
            ]);
            assert_eq!(envelope.attempt, 3, "attempt from {value:?}");
            assert_eq!(envelope.version, 3, "version from {value:?}");
            assert_eq!(envelope.route_position, Some(3), "position from {value:?}");
        }
        for value in [
            AMQPValue::LongInt(1_000_000),
            AMQPValue::LongUInt(123_456),
            AMQPValue::LongLongInt(EARLIER as i64),
        ] {
            let expected = integer_value(&value).unwrap() as u64;
            assert_eq!(
                read(vec![(header::FIRST_SEEN, value)]).first_seen_ms,
                expected
            );
        }
    }

    #[test]
    fn reads_numeric_strings_and_bytes() {
        let forms = [
            ls("5"),
            ls(" 5 "),
            ls("+5"),
            AMQPValue::ShortString("5".into()),
            AMQPValue::ByteArray(ByteArray::from(&b"5"[..])),
        ];
        for value in forms {
            let envelope = read(vec![
                (header::ATTEMPT, value.clone()),
                (header::VERSION, value.clone()),
                (header::ROUTE_POSITION, value.clone()),
            ]);
            assert_eq!(envelope.attempt, 5, "attempt from {value:?}");
            assert_eq!(envelope.version, 5, "version from {value:?}");
            assert_eq!(envelope.route_position, Some(5), "position from {value:?}");
        }
        let envelope = read(vec![(header::FIRST_SEEN, ls(&EARLIER.to_string()))]);
        assert_eq!(envelope.first_seen_ms, EARLIER);
    }

    #[test]
    fn reads_strings_in_every_form() {
        for value in [
            ls("id-9"),
            AMQPValue::ShortString("id-9".into()),
            AMQPValue::ByteArray(ByteArray::from(&b"id-9"[..])),
        ] {
            assert_eq!(
                read(vec![(header::ID, value.clone())]).id,
                "id-9",
                "{value:?}"
            );
        }
        // An integer where a string belongs is still readable (as Python's
        // str() reads it).
        assert_eq!(read(vec![(header::ID, AMQPValue::LongInt(42))]).id, "42");
        // Invalid UTF-8 is replaced, not refused: the message still has an id.
        let bytes = AMQPValue::LongString(LongString::from(vec![b'a', 0xff, b'b']));
        assert_eq!(read(vec![(header::ID, bytes)]).id, "a\u{fffd}b");
    }

    #[test]
    fn first_seen_as_an_amqp_timestamp_is_seconds() {
        let envelope = read(vec![(
            header::FIRST_SEEN,
            AMQPValue::Timestamp(1_770_000_000),
        )]);
        assert_eq!(envelope.first_seen_ms, 1_770_000_000_000);
    }

    #[test]
    fn missing_headers_take_the_defaults() {
        let properties = BasicProperties::default().with_message_id("from-property".into());
        let envelope = Envelope::read(&properties, "orders.new", NOW);
        assert_eq!(
            envelope,
            Envelope {
                id: "from-property".into(),
                message_type: "orders.new".into(),
                version: 1,
                correlation_id: "from-property".into(),
                causation_id: None,
                attempt: 1,
                first_seen_ms: NOW,
                origin: None,
                error: None,
                claim: None,
                route: None,
                route_position: None,
                route_id: None,
            }
        );
    }

    #[test]
    fn no_id_anywhere_gets_a_fresh_uuid_v4_used_for_correlation_too() {
        let first = Envelope::read(&BasicProperties::default(), "", NOW);
        let second = Envelope::read(&BasicProperties::default(), "", NOW);
        let uuid = uuid::Uuid::parse_str(&first.id).expect("a UUID");
        assert_eq!(uuid.get_version_num(), 4);
        assert_eq!(first.id, uuid.hyphenated().to_string());
        assert_eq!(first.correlation_id, first.id);
        assert_ne!(first.id, second.id);
        // Empty routing key: Java's literal `message`.
        assert_eq!(first.message_type, DEFAULT_MESSAGE_TYPE);
    }

    /// [`Envelope::read_delivery`] of a delivery on routing key `k`.
    fn delivered(
        properties: &BasicProperties,
        body: &[u8],
        stream: Option<&str>,
        now_ms: u64,
    ) -> Envelope {
        let (properties, body) = (Arc::new(properties.clone()), Bytes::copy_from_slice(body));
        Envelope::read_delivery(&properties, "k", &body, stream, now_ms)
    }

    #[test]
    fn a_delivery_with_no_id_gets_the_same_derived_id_at_every_delivery() {
        let properties = with_headers(vec![("tenant", ls("acme"))]);
        let first = delivered(&properties, b"{}", None, NOW);
        let redelivered = with_headers(vec![
            ("tenant", ls("acme")),
            ("x-delivery-count", AMQPValue::LongLongInt(1)),
        ]);
        let again = delivered(&redelivered, b"{}", None, NOW + 1);
        assert_eq!(
            first.id,
            crate::envelope::derived_input_id(&properties, b"{}")
        );
        assert_eq!(first.id, again.id);
        assert_eq!(first.correlation_id, first.id);
        // An id the message carries is kept as it is.
        let named = properties.clone().with_message_id("from-property".into());
        assert_eq!(delivered(&named, b"{}", None, NOW).id, "from-property");
    }

    #[test]
    fn a_stream_consumers_message_with_no_id_is_named_by_its_stream_and_offset() {
        let at = |offset: i64, tenant: &str| {
            with_headers(vec![
                ("tenant", ls(tenant)),
                (header::STREAM_OFFSET, AMQPValue::LongLongInt(offset)),
            ])
        };
        let read = |properties: &BasicProperties, body: &[u8], stream| {
            delivered(properties, body, stream, NOW).id
        };
        let id = read(&at(7, "acme"), b"{}", Some("orders.log"));
        assert_eq!(id, crate::envelope::stream_message_id("orders.log", 7));
        // The offset names it: the body is not read again for it.
        assert_eq!(id, read(&at(7, "acme"), b"{\"n\":2}", Some("orders.log")));
        assert_ne!(id, read(&at(8, "acme"), b"{}", Some("orders.log")));
        // On a queue an offset header is a producer's word, not a name.
        let on_a_queue = read(&at(7, "acme"), b"{}", None);
        assert_eq!(
            on_a_queue,
            crate::envelope::derived_input_id(&at(7, "acme"), b"{}")
        );
        assert_ne!(on_a_queue, read(&at(7, "other"), b"{}", None));
        // A stream message without an offset header is hashed as before,
        // and an id the message carries is kept on a stream too.
        let no_offset = with_headers(vec![("tenant", ls("acme"))]);
        assert_eq!(
            read(&no_offset, b"{}", Some("orders.log")),
            crate::envelope::derived_input_id(&no_offset, b"{}")
        );
        let named = at(7, "acme").with_message_id("from-property".into());
        assert_eq!(read(&named, b"{}", Some("orders.log")), "from-property");
    }

    #[test]
    fn the_header_id_wins_over_the_message_id_property() {
        let properties = with_headers(vec![(header::ID, ls("from-header"))])
            .with_message_id("from-property".into());
        assert_eq!(Envelope::read(&properties, "k", NOW).id, "from-header");
    }

    #[test]
    fn empty_strings_read_as_absent() {
        let properties = with_headers(vec![
            (header::ID, ls("")),
            (header::TYPE, ls("")),
            (header::CORRELATION, ls("")),
            (header::CAUSATION, ls("")),
            (header::ORIGIN, ls("")),
            (header::ERROR, ls("")),
            (header::CLAIM, ls("")),
            (header::ROUTE, ls("")),
            (header::ROUTE_ID, ls("")),
            (header::ATTEMPT, ls("")),
            (header::VERSION, ls("")),
            (header::FIRST_SEEN, ls("")),
            (header::ROUTE_POSITION, ls("")),
        ])
        .with_message_id("mid".into());
        let envelope = Envelope::read(&properties, "orders.new", NOW);
        assert_eq!(envelope.id, "mid");
        assert_eq!(envelope.message_type, "orders.new");
        assert_eq!(envelope.correlation_id, "mid");
        assert_eq!(envelope.causation_id, None);
        assert_eq!(envelope.origin, None);
        assert_eq!(envelope.error, None);
        assert_eq!(envelope.claim, None);
        assert_eq!(envelope.route, None);
        assert_eq!(envelope.route_id, None);
        assert_eq!(envelope.attempt, 1);
        assert_eq!(envelope.version, 1);
        assert_eq!(envelope.first_seen_ms, NOW);
        assert_eq!(envelope.route_position, None);

        // An empty message-id property is no id either.
        let properties = BasicProperties::default().with_message_id("".into());
        let envelope = Envelope::read(&properties, "k", NOW);
        assert!(uuid::Uuid::parse_str(&envelope.id).is_ok());
    }

    #[test]
    fn unreadable_values_take_the_defaults() {
        let unreadable = [
            ls("four"),
            ls("4.0"),
            AMQPValue::Boolean(true),
            AMQPValue::Double(4.0),
            AMQPValue::Float(4.0),
            AMQPValue::DecimalValue(DecimalValue { scale: 0, value: 4 }),
            AMQPValue::Void,
            AMQPValue::FieldTable(FieldTable::default()),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongLongInt(4)])),
            AMQPValue::ByteArray(ByteArray::from(vec![0xff])),
        ];
        for value in unreadable {
            let envelope = read(vec![
                (header::ATTEMPT, value.clone()),
                (header::VERSION, value.clone()),
                (header::FIRST_SEEN, value.clone()),
                (header::ROUTE_POSITION, value.clone()),
                (header::TYPE, value.clone()),
                (header::CAUSATION, value.clone()),
            ]);
            assert_eq!(envelope.attempt, 1, "{value:?}");
            assert_eq!(envelope.version, 1, "{value:?}");
            assert_eq!(envelope.first_seen_ms, NOW, "{value:?}");
            assert_eq!(envelope.route_position, None, "{value:?}");
            if !matches!(value, AMQPValue::LongString(_) | AMQPValue::ByteArray(_)) {
                assert_eq!(envelope.message_type, "orders.new", "{value:?}");
                assert_eq!(envelope.causation_id, None, "{value:?}");
            }
        }
    }

    #[test]
    fn version_and_attempt_below_one_read_as_one_and_saturate_above_u32() {
        for low in [0, -1, i64::MIN] {
            let envelope = read(vec![
                (header::ATTEMPT, AMQPValue::LongLongInt(low)),
                (header::VERSION, AMQPValue::LongLongInt(low)),
            ]);
            assert_eq!((envelope.attempt, envelope.version), (1, 1), "{low}");
        }
        let envelope = read(vec![
            (header::ATTEMPT, AMQPValue::LongLongInt(i64::MAX)),
            (header::VERSION, ls("99999999999999999999")),
        ]);
        assert_eq!((envelope.attempt, envelope.version), (u32::MAX, u32::MAX));
        // And the next retry does not wrap round to attempt 0.
        assert_eq!(envelope.for_retry().attempt, u32::MAX);
    }

    #[test]
    fn negative_first_seen_is_unreadable() {
        let envelope = read(vec![(header::FIRST_SEEN, AMQPValue::LongLongInt(-5))]);
        assert_eq!(envelope.first_seen_ms, NOW);
    }

    #[test]
    fn unknown_and_differently_cased_reserved_headers_are_dropped() {
        let properties = with_headers(vec![
            (header::ID, ls("id-1")),
            (header::ATTEMPT, AMQPValue::LongLongInt(2)),
            ("x-acemq-foo", ls("from a newer library")),
            ("X-AceMQ-Bar", ls("odd case")),
            ("x-acemq-replayed-at", AMQPValue::LongLongInt(1)),
            ("acemq-reply-to", ls("replies")),
            ("traceparent", ls(TRACEPARENT)),
        ]);
        let app = split_headers(&properties);
        let names: Vec<&str> = app.visible.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["acemq-reply-to", "traceparent"]);
        // The known ones became fields.
        let envelope = Envelope::read(&properties, "k", NOW);
        assert_eq!((envelope.id.as_str(), envelope.attempt), ("id-1", 2));
        // A republish carries the same two, and of the reserved names only
        // those of the envelope it writes.
        let copy = republish_properties(&properties, &envelope);
        let copied = headers_of(&copy);
        assert_eq!(
            reserved_names(copied),
            reserved_names(&envelope.to_headers(&FieldTable::default()))
        );
        assert_eq!(copied.inner().len() - reserved_names(copied).len(), 2);
        assert_eq!(get(copied, "traceparent"), Some(&ls(TRACEPARENT)));
        assert_eq!(get(copied, "acemq-reply-to"), Some(&ls("replies")));
    }

    #[test]
    fn split_keeps_everything_else_verbatim_and_shows_the_flat_ones() {
        let nested = AMQPValue::FieldTable(table(vec![("k", ls("v"))]));
        let properties = with_headers(vec![
            (header::ID, ls("id-1")),
            ("x-death", x_death()),
            ("x-first-death-queue", ls("orders.new")),
            ("traceparent", ls(TRACEPARENT)),
            ("x-stream-offset", AMQPValue::LongLongInt(42)),
            ("nested", nested.clone()),
            ("t-bool", AMQPValue::Boolean(true)),
            ("t-short", AMQPValue::ShortInt(-7)),
            ("t-float", AMQPValue::Float(1.5)),
            ("t-double", AMQPValue::Double(2.25)),
            (
                "t-bytes",
                AMQPValue::ByteArray(ByteArray::from(vec![0, 1, 2])),
            ),
            (
                "t-binary",
                AMQPValue::LongString(LongString::from(vec![0xff, 0xfe])),
            ),
            ("t-stamp", AMQPValue::Timestamp(1_770_000_000)),
            (
                "t-decimal",
                AMQPValue::DecimalValue(DecimalValue { scale: 2, value: 5 }),
            ),
            ("t-void", AMQPValue::Void),
        ]);
        let app = split_headers(&properties);

        // A republish carries the delivery's headers, minus the old
        // envelope, value for value.
        let envelope = Envelope::read(&properties, "k", NOW);
        let mut expected = headers_of(&properties).inner().clone();
        expected.remove(header::ID);
        let copy = republish_properties(&properties, &envelope);
        let mut carried = headers_of(&copy).inner().clone();
        carried.retain(|name, _| !is_reserved(name.as_str()));
        assert_eq!(&carried, &expected);

        assert_eq!(app.stream_offset, Some(42));
        let visible: std::collections::BTreeMap<&str, &HeaderValue> =
            app.visible.iter().map(|(n, v)| (n.as_str(), v)).collect();
        assert_eq!(
            visible.keys().copied().collect::<Vec<_>>(),
            [
                "t-binary",
                "t-bool",
                "t-bytes",
                "t-double",
                "t-float",
                "t-short",
                "t-stamp",
                "traceparent",
                "x-first-death-queue",
                "x-stream-offset",
            ]
        );
        assert_eq!(
            visible["traceparent"],
            &HeaderValue::Text(TRACEPARENT.into())
        );
        assert_eq!(visible["t-bool"], &HeaderValue::Bool(true));
        assert_eq!(visible["t-short"], &HeaderValue::Int(-7));
        assert_eq!(visible["t-float"], &HeaderValue::Float(1.5));
        assert_eq!(visible["t-double"], &HeaderValue::Float(2.25));
        assert_eq!(visible["t-bytes"], &HeaderValue::Bytes(vec![0, 1, 2]));
        assert_eq!(visible["t-binary"], &HeaderValue::Bytes(vec![0xff, 0xfe]));
        assert_eq!(visible["t-stamp"], &HeaderValue::Int(1_770_000_000));
        assert_eq!(visible["x-stream-offset"], &HeaderValue::Int(42));
    }

    #[test]
    fn stream_offset_is_read_tolerantly() {
        let offset = |value: AMQPValue| {
            let headers = table(vec![("x-stream-offset", value)]);
            let split = split_table(Some(&headers)).stream_offset;
            let direct = stream_offset(&BasicProperties::default().with_headers(headers));
            assert_eq!(split, direct, "both readings agree");
            split
        };
        assert_eq!(offset(AMQPValue::LongLongInt(7)), Some(7));
        assert_eq!(offset(AMQPValue::LongUInt(7)), Some(7));
        assert_eq!(offset(AMQPValue::ShortShortUInt(7)), Some(7));
        assert_eq!(offset(ls("7")), Some(7));
        assert_eq!(offset(AMQPValue::LongLongInt(-1)), None);
        assert_eq!(offset(ls("next")), None);
        assert_eq!(split_table(None), AppHeaders::default());
        assert_eq!(
            split_headers(&BasicProperties::default()).stream_offset,
            None
        );
    }
}
