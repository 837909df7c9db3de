//! The AMQP properties of everything the host publishes: the copy of a
//! delivery republished for a retry or a set-aside (contract §5), and a
//! plugin's new message. Their `x-acemq-*` headers come from one writer,
//! [`Envelope::to_headers`], which drops any the application headers carry.
//!
//! Writing is strict, because what this host writes is what the other
//! libraries read: whatever form a header arrived in, it leaves in one form.
//! Always the same six headers, strings as long strings, integers as 64-bit
//! integers, absent optional fields omitted rather than written empty.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};

use super::amqp::{long_string, short_string};
use super::headers::{
    HeaderError, HeaderValue, check_plugin_headers, plugin_headers_to_table, preview,
};
use super::{Envelope, header, is_reserved, or_default_type};

/// Content type of a plugin's outgoing message when it names none.
pub const DEFAULT_CONTENT_TYPE: &str = "application/json";

/// AMQP `delivery-mode` of a message the broker writes to disk.
pub const PERSISTENT: u8 = 2;
/// AMQP `delivery-mode` of a message the broker may keep in memory only.
pub const TRANSIENT: u8 = 1;

impl Envelope {
    /// The headers of a message carrying this envelope: `app` first, then the
    /// envelope. Id, type, version, correlation, attempt and first-seen are
    /// always written; absent optional fields are omitted (never empty or
    /// void). Any `x-acemq-*` entry in `app` is dropped, so the envelope is
    /// the only source of reserved headers.
    #[must_use]
    pub fn to_headers(&self, app: &FieldTable) -> FieldTable {
        let mut table = FieldTable::default();
        for (name, value) in app {
            if !is_reserved(name.as_str()) {
                table.insert(name.clone(), value.clone());
            }
        }
        self.stamped(table, [])
    }

    /// [`Envelope::to_headers`] of a table of the plugin's that holds no
    /// reserved name already ([`plugin_headers_to_table`] leaves them out),
    /// taken as it is rather than copied, with `added` after the envelope.
    fn stamped(
        &self,
        mut table: FieldTable,
        added: impl IntoIterator<Item = (ShortString, AMQPValue)>,
    ) -> FieldTable {
        self.stamp(&mut table);
        for (name, value) in added {
            table.insert(name, value);
        }
        table
    }

    fn stamp(&self, table: &mut FieldTable) {
        let mut put_text = |name: &str, value: &str| {
            table.insert(name.into(), long_string(value));
        };
        put_text(header::ID, &self.id);
        // Fields are public, so an envelope built by hand may hold empty
        // strings; the defaults are applied again rather than written empty.
        put_text(header::TYPE, &or_default_type(self.message_type.as_str()));
        let correlation = match self.correlation_id.as_str() {
            "" => self.id.as_str(),
            correlation => correlation,
        };
        put_text(header::CORRELATION, correlation);
        for (name, value) in [
            (header::CAUSATION, &self.causation_id),
            (header::ORIGIN, &self.origin),
            (header::ERROR, &self.error),
            (header::CLAIM, &self.claim),
            (header::ROUTE, &self.route),
            (header::ROUTE_ID, &self.route_id),
        ] {
            if let Some(value) = value.as_deref().filter(|v| !v.is_empty()) {
                put_text(name, value);
            }
        }

        // Version and attempt as signed 32-bit integers (`I`), the type the
        // Java library writes them with; a reader of any library accepts
        // any width, but a Java reader that casts the value it finds gets
        // the type it expects. A value past i32 (only a producer's odd
        // header can make one) keeps its value in 64 bits rather than being
        // cut. First-seen needs 64 bits.
        let to_i32 = |value: u32| {
            let value = value.max(1);
            i32::try_from(value)
                .map_or(AMQPValue::LongLongInt(i64::from(value)), AMQPValue::LongInt)
        };
        table.insert(header::VERSION.into(), to_i32(self.version));
        table.insert(header::ATTEMPT.into(), to_i32(self.attempt));
        let mut put_int = |name: &str, value: i64| {
            table.insert(name.into(), AMQPValue::LongLongInt(value));
        };
        put_int(
            header::FIRST_SEEN,
            i64::try_from(self.first_seen_ms).unwrap_or(i64::MAX),
        );
        if let Some(position) = self.route_position {
            put_int(header::ROUTE_POSITION, position);
        }
    }
}

/// The properties of a copy of a delivery republished for a retry or a
/// set-aside (contract §5): persistent, `message-id` = envelope id, headers =
/// the original's application headers verbatim followed by `envelope`.
///
/// The body is republished unchanged, so what describes it is kept
/// (content type and encoding), as is what describes the conversation
/// (correlation-id, reply-to, priority, timestamp, type, app-id). Two
/// properties are dropped on purpose:
/// * `expiration`: a per-message TTL on a copy would let a dead letter expire
///   out of `.dlq` unseen and would stall a retry rung behind it; the
///   contract never uses per-message TTLs.
/// * `user-id`: the broker refuses a publish whose user-id is not the
///   publishing connection's user, with a channel error that would take the
///   host's publishing channel down with it.
///
/// `message-id` is left unset when the id is longer than an AMQP short
/// string allows; the `x-acemq-id` header still carries it.
#[must_use]
pub fn republish_properties(original: &BasicProperties, envelope: &Envelope) -> BasicProperties {
    let headers = match original.headers() {
        Some(delivered) => envelope.to_headers(delivered),
        None => envelope.to_headers(&FieldTable::default()),
    };
    let mut properties = BasicProperties::default()
        .with_delivery_mode(PERSISTENT)
        .with_headers(headers);
    if let Some(id) = short_string(&envelope.id) {
        properties = properties.with_message_id(id);
    }
    if let Some(v) = original.content_type() {
        properties = properties.with_content_type(v.clone());
    }
    if let Some(v) = original.content_encoding() {
        properties = properties.with_content_encoding(v.clone());
    }
    if let Some(v) = original.priority() {
        properties = properties.with_priority(*v);
    }
    if let Some(v) = original.correlation_id() {
        properties = properties.with_correlation_id(v.clone());
    }
    if let Some(v) = original.reply_to() {
        properties = properties.with_reply_to(v.clone());
    }
    if let Some(v) = original.timestamp() {
        properties = properties.with_timestamp(*v);
    }
    if let Some(v) = original.kind() {
        properties = properties.with_type(v.clone());
    }
    if let Some(v) = original.app_id() {
        properties = properties.with_app_id(v.clone());
    }
    if let Some(v) = original.cluster_id() {
        properties = properties.with_cluster_id(v.clone());
    }
    properties
}

/// [`republish_properties`] for a retry: [`Envelope::for_retry`].
#[must_use]
pub fn retry_properties(original: &BasicProperties, envelope: &Envelope) -> BasicProperties {
    republish_properties(original, &envelope.for_retry())
}

/// [`republish_properties`] for a set-aside to `.dlq` / `.parked`:
/// [`Envelope::for_set_aside`].
#[must_use]
pub fn set_aside_properties(
    original: &BasicProperties,
    envelope: &Envelope,
    reason: &str,
) -> BasicProperties {
    republish_properties(original, &envelope.for_set_aside(reason))
}

/// The properties of a new message a plugin publishes: `content-type` (empty
/// or absent means [`DEFAULT_CONTENT_TYPE`]), `message-id` = envelope id,
/// delivery mode 2 when `persistent` else 1, headers = the plugin's headers
/// followed by the envelope, then `added` (the trace's, which replace any
/// of the plugin's of the same name).
///
/// The headers are checked here as well as when the plugin buffered them:
/// a refusal is an answer for the plugin, never a silently altered message.
pub fn outgoing_properties(
    envelope: &Envelope,
    content_type: Option<&str>,
    persistent: bool,
    headers: &[(String, HeaderValue)],
    added: impl IntoIterator<Item = (ShortString, AMQPValue)>,
) -> Result<BasicProperties, HeaderError> {
    check_plugin_headers(headers)?;
    let content_type = content_type
        .filter(|c| !c.is_empty())
        .unwrap_or(DEFAULT_CONTENT_TYPE);
    let content_type =
        short_string(content_type).ok_or_else(|| HeaderError::ContentTypeTooLong {
            shown: preview(content_type),
            len: content_type.len(),
        })?;
    let mut properties = BasicProperties::default()
        .with_content_type(content_type)
        .with_delivery_mode(if persistent { PERSISTENT } else { TRANSIENT })
        .with_headers(envelope.stamped(plugin_headers_to_table(headers), added));
    if let Some(id) = short_string(&envelope.id) {
        properties = properties.with_message_id(id);
    }
    Ok(properties)
}

#[cfg(test)]
mod tests {
    use lapin::types::ShortString;

    use super::*;
    use crate::envelope::test_support::*;
    use crate::envelope::{DEFAULT_MESSAGE_TYPE, NO_REASON, default_origin};
    use lapin::protocol::basic::{gen_properties, parse_properties};

    #[test]
    fn writes_the_six_headers_always_as_strings_and_integers() {
        let envelope = Envelope::new("order.placed", "", NOW);
        let headers = envelope.to_headers(&FieldTable::default());
        assert_eq!(
            reserved_names(&headers),
            [
                header::ATTEMPT,
                header::CORRELATION,
                header::FIRST_SEEN,
                header::ID,
                header::TYPE,
                header::VERSION,
            ]
        );
        assert_eq!(get(&headers, header::ID), Some(&ls(&envelope.id)));
        assert_eq!(get(&headers, header::TYPE), Some(&ls("order.placed")));
        assert_eq!(get(&headers, header::CORRELATION), Some(&ls(&envelope.id)));
        assert_eq!(get(&headers, header::VERSION), Some(&AMQPValue::LongInt(1)));
        assert_eq!(get(&headers, header::ATTEMPT), Some(&AMQPValue::LongInt(1)));
        assert_eq!(
            get(&headers, header::FIRST_SEEN),
            Some(&AMQPValue::LongLongInt(NOW as i64))
        );
    }

    #[test]
    fn writes_present_optionals_and_omits_absent_or_empty_ones() {
        let headers = full_envelope().to_headers(&FieldTable::default());
        assert_eq!(reserved_names(&headers).len(), 13);
        assert_eq!(get(&headers, header::CAUSATION), Some(&ls("cause-1")));
        assert_eq!(get(&headers, header::ORIGIN), Some(&ls("billing@host-a")));
        assert_eq!(
            get(&headers, header::ERROR),
            Some(&ls("the handler parked it: bad"))
        );
        assert_eq!(get(&headers, header::CLAIM), Some(&ls("s3://bucket/key")));
        assert_eq!(
            get(&headers, header::ROUTE),
            Some(&ls("validate,price,ship"))
        );
        assert_eq!(get(&headers, header::ROUTE_ID), Some(&ls("run-7")));
        assert_eq!(
            get(&headers, header::ROUTE_POSITION),
            Some(&AMQPValue::LongLongInt(1))
        );

        // Hand-built envelopes with empty strings still write no empty header.
        let hand_built = Envelope {
            message_type: String::new(),
            correlation_id: String::new().into(),
            causation_id: Some(String::new()),
            origin: Some(String::new()),
            version: 0,
            attempt: 0,
            ..full_envelope()
        };
        let headers = hand_built.to_headers(&FieldTable::default());
        assert_eq!(get(&headers, header::CAUSATION), None);
        assert_eq!(get(&headers, header::ORIGIN), None);
        assert_eq!(get(&headers, header::TYPE), Some(&ls(DEFAULT_MESSAGE_TYPE)));
        assert_eq!(
            get(&headers, header::CORRELATION),
            Some(&ls(&hand_built.id))
        );
        assert_eq!(get(&headers, header::VERSION), Some(&AMQPValue::LongInt(1)));
        assert_eq!(get(&headers, header::ATTEMPT), Some(&AMQPValue::LongInt(1)));
    }

    #[test]
    fn written_envelope_reads_back_identically_over_the_wire() {
        let envelope = full_envelope();
        let headers = over_the_wire(&envelope.to_headers(&FieldTable::default()));
        let properties = BasicProperties::default().with_headers(headers);
        assert_eq!(Envelope::read(&properties, "other.key", NOW), envelope);
    }

    #[test]
    fn to_headers_puts_app_headers_first_and_drops_reserved_ones_from_them() {
        let app = table(vec![
            ("traceparent", ls(TRACEPARENT)),
            (header::ID, ls("forged")),
            ("X-ACEMQ-ATTEMPT", AMQPValue::LongLongInt(99)),
        ]);
        let envelope = full_envelope();
        let headers = envelope.to_headers(&app);
        assert_eq!(get(&headers, "traceparent"), Some(&ls(TRACEPARENT)));
        assert_eq!(get(&headers, header::ID), Some(&ls(&envelope.id)));
        assert_eq!(get(&headers, "X-ACEMQ-ATTEMPT"), None);
    }

    /// A delivery as a Java or Python producer sends it, after one trip
    /// round a retry rung (so with the broker's x-death).
    fn delivered_on_attempt_two() -> BasicProperties {
        BasicProperties::default()
            .with_content_type("application/json".into())
            .with_content_encoding("gzip".into())
            .with_delivery_mode(TRANSIENT)
            .with_priority(5)
            .with_correlation_id("rpc-1".into())
            .with_reply_to("replies".into())
            .with_expiration("60000".into())
            .with_message_id("id-1".into())
            .with_timestamp(1_770_000_000)
            .with_type("legacy-type".into())
            .with_user_id("someone-else".into())
            .with_app_id("billing".into())
            .with_headers(table(vec![
                (header::ID, ls("id-1")),
                (header::TYPE, ls("order.placed")),
                (header::VERSION, AMQPValue::LongInt(2)),
                (header::CORRELATION, ls("corr-1")),
                (header::ATTEMPT, AMQPValue::LongInt(2)),
                (header::FIRST_SEEN, AMQPValue::LongLongInt(EARLIER as i64)),
                (header::ORIGIN, ls("acemq@java-host")),
                (header::ERROR, ls("replayed from the dlq")),
                ("x-acemq-future", ls("dropped")),
                ("x-death", x_death()),
                ("x-first-death-reason", ls("expired")),
                ("traceparent", ls(TRACEPARENT)),
                ("tracestate", ls("vendor=1")),
                ("acemq-reply-to", ls("replies")),
            ]))
    }

    #[test]
    fn retry_republish_advances_the_attempt_and_carries_app_headers_exactly() {
        let original = delivered_on_attempt_two();
        let envelope = Envelope::read(&original, "orders.new", NOW);
        let copy = retry_properties(&original, &envelope);

        // Encoded and parsed as the broker would relay it.
        let headers = over_the_wire(headers_of(&copy));
        for name in [
            "x-death",
            "x-first-death-reason",
            "traceparent",
            "tracestate",
            "acemq-reply-to",
        ] {
            assert_eq!(
                get(&headers, name),
                get(headers_of(&original), name),
                "{name}"
            );
        }
        assert_eq!(get(&headers, "x-death"), Some(&x_death()));
        assert_eq!(get(&headers, "x-acemq-future"), None);
        assert_eq!(get(&headers, header::ERROR), None);
        assert_eq!(get(&headers, header::ATTEMPT), Some(&AMQPValue::LongInt(3)));
        assert_eq!(
            get(&headers, header::FIRST_SEEN),
            Some(&AMQPValue::LongLongInt(EARLIER as i64))
        );

        let reread = Envelope::read(&copy, "orders.new", NOW + 60_000);
        assert_eq!(
            reread,
            Envelope {
                attempt: 3,
                error: None,
                ..envelope.clone()
            }
        );
    }

    #[test]
    fn republish_properties_keep_the_body_description_and_drop_ttl_and_user_id() {
        let original = delivered_on_attempt_two();
        let envelope = Envelope::read(&original, "orders.new", NOW);
        let copy = retry_properties(&original, &envelope);

        assert_eq!(
            copy.message_id().as_ref().map(ShortString::as_str),
            Some("id-1")
        );
        assert_eq!(copy.delivery_mode(), &Some(PERSISTENT));
        assert_eq!(copy.content_type(), original.content_type());
        assert_eq!(copy.content_encoding(), original.content_encoding());
        assert_eq!(copy.priority(), original.priority());
        assert_eq!(copy.correlation_id(), original.correlation_id());
        assert_eq!(copy.reply_to(), original.reply_to());
        assert_eq!(copy.timestamp(), original.timestamp());
        assert_eq!(copy.kind(), original.kind());
        assert_eq!(copy.app_id(), original.app_id());
        assert_eq!(copy.expiration(), &None);
        assert_eq!(copy.user_id(), &None);

        // The properties as a whole encode and parse back unchanged.
        let written = gen_properties::<Vec<u8>>(&copy)(Vec::new().into()).expect("encodes");
        let (rest, parsed) = parse_properties(&written.write[..]).expect("parses");
        assert!(rest.is_empty());
        assert_eq!(parsed, copy);
    }

    #[test]
    fn message_id_is_the_envelope_id_even_when_the_property_differed() {
        let original =
            with_headers(vec![(header::ID, ls("header-id"))]).with_message_id("property-id".into());
        let envelope = Envelope::read(&original, "q", NOW);
        let copy = retry_properties(&original, &envelope);
        assert_eq!(
            copy.message_id().as_ref().map(ShortString::as_str),
            Some("header-id")
        );

        // A delivery with no id at all: the new id is written both ways, so
        // every later attempt keeps it.
        let original = BasicProperties::default();
        let envelope = Envelope::read(&original, "q", NOW);
        let copy = retry_properties(&original, &envelope);
        assert_eq!(
            copy.message_id().as_ref().map(ShortString::as_str),
            Some(envelope.id.as_str())
        );
        assert_eq!(Envelope::read(&copy, "q", NOW + 1).id, envelope.id);
        assert_eq!(copy.content_type(), &None);
    }

    #[test]
    fn an_id_too_long_for_message_id_is_carried_by_the_header_alone() {
        let envelope = Envelope {
            id: "i".repeat(300).into(),
            ..full_envelope()
        };
        let copy = retry_properties(&BasicProperties::default(), &envelope);
        assert_eq!(copy.message_id(), &None);
        assert_eq!(get(headers_of(&copy), header::ID), Some(&ls(&envelope.id)));
        let out = outgoing_properties(&envelope, None, true, &[], []).expect("accepted");
        assert_eq!(out.message_id(), &None);
    }

    #[test]
    fn set_aside_adds_the_reason_and_keeps_the_attempt() {
        let original = delivered_on_attempt_two();
        let envelope = Envelope::read(&original, "orders.new", NOW);
        let reason = "exhausted 2 attempts: ValueError: no such customer";
        let copy = set_aside_properties(&original, &envelope, reason);

        let headers = over_the_wire(headers_of(&copy));
        assert_eq!(get(&headers, header::ERROR), Some(&ls(reason)));
        assert_eq!(get(&headers, header::ATTEMPT), Some(&AMQPValue::LongInt(2)));
        assert_eq!(get(&headers, "x-death"), Some(&x_death()));
        assert_eq!(get(&headers, "traceparent"), Some(&ls(TRACEPARENT)));
        assert_eq!(copy.delivery_mode(), &Some(PERSISTENT));
        assert_eq!(
            copy.message_id().as_ref().map(ShortString::as_str),
            Some("id-1")
        );
        let reread = Envelope::read(&copy, "orders.new", NOW);
        assert_eq!(reread.error.as_deref(), Some(reason));
        assert_eq!(reread.first_seen_ms, EARLIER);

        assert_eq!(envelope.for_set_aside("").error.as_deref(), Some(NO_REASON));
    }

    #[test]
    fn outgoing_properties_for_a_plugin_message() {
        let parent = full_envelope();
        let envelope = Envelope::child_of(&parent, "invoice.raised".into(), default_origin(), NOW);
        let headers = vec![(
            "traceparent".to_owned(),
            HeaderValue::Text(TRACEPARENT.into()),
        )];

        let persistent = outgoing_properties(&envelope, None, true, &headers, []).unwrap();
        assert_eq!(
            persistent.content_type().as_ref().map(ShortString::as_str),
            Some(DEFAULT_CONTENT_TYPE)
        );
        assert_eq!(persistent.delivery_mode(), &Some(PERSISTENT));
        assert_eq!(
            persistent.message_id().as_ref().map(ShortString::as_str),
            Some(envelope.id.as_str())
        );
        let table = over_the_wire(headers_of(&persistent));
        assert_eq!(get(&table, "traceparent"), Some(&ls(TRACEPARENT)));
        assert_eq!(get(&table, header::CAUSATION), Some(&ls(&parent.id)));
        assert_eq!(get(&table, header::ORIGIN), Some(&ls(default_origin())));
        assert_eq!(Envelope::read(&persistent, "ignored", NOW + 5), envelope);

        let transient = outgoing_properties(&envelope, Some("text/plain"), false, &[], []).unwrap();
        assert_eq!(transient.delivery_mode(), &Some(TRANSIENT));
        assert_eq!(
            transient.content_type().as_ref().map(ShortString::as_str),
            Some("text/plain")
        );
        let empty = outgoing_properties(&envelope, Some(""), true, &[], []).unwrap();
        assert_eq!(
            empty.content_type().as_ref().map(ShortString::as_str),
            Some(DEFAULT_CONTENT_TYPE)
        );
    }

    #[test]
    fn added_headers_come_after_the_envelope_and_replace_the_plugins_own() {
        let envelope = Envelope::new("order.placed", "", NOW);
        let headers = vec![
            ("traceparent".to_owned(), HeaderValue::Text("forged".into())),
            ("tenant".to_owned(), HeaderValue::Text("acme".into())),
        ];
        let added = [("traceparent".into(), ls(TRACEPARENT))];
        let properties = outgoing_properties(&envelope, None, true, &headers, added).unwrap();
        let table = over_the_wire(headers_of(&properties));
        assert_eq!(get(&table, "traceparent"), Some(&ls(TRACEPARENT)));
        assert_eq!(get(&table, "tenant"), Some(&ls("acme")));
        assert_eq!(get(&table, header::ID), Some(&ls(&envelope.id)));
        assert_eq!(Envelope::read(&properties, "ignored", NOW + 5), envelope);
    }

    #[test]
    fn outgoing_properties_refuse_reserved_headers_and_long_content_types() {
        let envelope = Envelope::new("t", "", NOW);
        let forged = vec![("x-acemq-attempt".to_owned(), HeaderValue::Int(9))];
        assert_eq!(
            outgoing_properties(&envelope, None, true, &forged, []),
            Err(HeaderError::Reserved {
                name: "x-acemq-attempt".into()
            })
        );
        let long = "a".repeat(256);
        assert!(matches!(
            outgoing_properties(&envelope, Some(&long), true, &[], []),
            Err(HeaderError::ContentTypeTooLong { len: 256, .. })
        ));
    }
}
