//! Generated header tables and properties against the envelope reader and
//! writer: whatever a producer put on a delivery, reading it never panics,
//! and every copy the host writes from it can be encoded and parsed again.
//! A delivery's headers are whatever another client wrote, so the cases
//! cover every AMQP value type, nesting, odd strings and extreme numbers.

use lapin::BasicProperties;
use lapin::protocol::basic::{gen_properties, parse_properties};
use lapin::types::generation::gen_field_table;
use lapin::types::parsing::parse_field_table;
use lapin::types::{
    AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString,
};
use proptest::prelude::*;

use super::{
    Envelope, HeaderValue, header, plugin_headers_to_table, republish_properties,
    set_aside_within_frame, split_headers,
};

/// Strings a producer may send: empty, ASCII, any Unicode, and the
/// envelope's own names (so reserved headers are read in every shape).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z0-9.-]{1,12}",
        any::<String>(),
        Just(header::ATTEMPT.to_owned()),
        Just(header::FIRST_SEEN.to_owned()),
        Just(header::ID.to_owned()),
        Just(header::VERSION.to_owned()),
        Just(header::STREAM_OFFSET.to_owned()),
        Just("X-AceMQ-Route-Position".to_owned()),
    ]
}

fn name() -> impl Strategy<Value = ShortString> {
    text().prop_map(|mut s| {
        // A name longer than a short string cannot be on the wire.
        while s.len() > 255 {
            s.pop();
        }
        ShortString::from(s)
    })
}

fn flat() -> impl Strategy<Value = AMQPValue> {
    prop_oneof![
        any::<bool>().prop_map(AMQPValue::Boolean),
        any::<i8>().prop_map(AMQPValue::ShortShortInt),
        any::<u8>().prop_map(AMQPValue::ShortShortUInt),
        any::<i16>().prop_map(AMQPValue::ShortInt),
        any::<u16>().prop_map(AMQPValue::ShortUInt),
        any::<i32>().prop_map(AMQPValue::LongInt),
        any::<u32>().prop_map(AMQPValue::LongUInt),
        any::<i64>().prop_map(AMQPValue::LongLongInt),
        any::<f32>().prop_map(AMQPValue::Float),
        any::<f64>().prop_map(AMQPValue::Double),
        (any::<u8>(), any::<u32>())
            .prop_map(|(scale, value)| AMQPValue::DecimalValue(DecimalValue { scale, value })),
        name().prop_map(AMQPValue::ShortString),
        text().prop_map(|s| AMQPValue::LongString(LongString::from(s))),
        proptest::collection::vec(any::<u8>(), 0..32)
            .prop_map(|b| AMQPValue::LongString(LongString::from(b))),
        any::<u64>().prop_map(AMQPValue::Timestamp),
        proptest::collection::vec(any::<u8>(), 0..32)
            .prop_map(|b| AMQPValue::ByteArray(ByteArray::from(b))),
        Just(AMQPValue::Void),
    ]
}

fn value() -> impl Strategy<Value = AMQPValue> {
    flat().prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6)
                .prop_map(|v| AMQPValue::FieldArray(FieldArray::from(v))),
            proptest::collection::vec((name(), inner), 0..6)
                .prop_map(|entries| AMQPValue::FieldTable(table_of(entries))),
        ]
    })
}

fn table_of(entries: Vec<(ShortString, AMQPValue)>) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in entries {
        table.insert(name, value);
    }
    table
}

fn table() -> impl Strategy<Value = FieldTable> {
    proptest::collection::vec((name(), value()), 0..12).prop_map(table_of)
}

/// The table as a consumer receives it: written and parsed back. `None`
/// for a table lapin cannot write, which no broker would deliver.
fn delivered(table: &FieldTable) -> Option<FieldTable> {
    let written = gen_field_table::<Vec<u8>>(table)(Vec::new().into()).ok()?;
    let (_, parsed) = parse_field_table(&written.write[..]).ok()?;
    Some(parsed)
}

/// Encodes properties as lapin sends them and parses them back.
fn round_trip(properties: &BasicProperties) {
    let written = gen_properties::<Vec<u8>>(properties)(Vec::new().into())
        .expect("properties the host writes can be encoded");
    let (rest, _) = parse_properties(&written.write[..]).expect("and parsed again");
    assert!(rest.is_empty());
}

proptest! {
    // Small enough for every `cargo test`; the strategies are wide.
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_delivery_is_read_and_written_back_without_panicking(
        headers in table(),
        routing_key in text(),
        content_type in proptest::option::of(name()),
        message_id in proptest::option::of(name()),
        now_ms in any::<u64>(),
        reason in text(),
    ) {
        let Some(headers) = delivered(&headers) else {
            return Ok(());
        };
        let mut properties = BasicProperties::default().with_headers(headers);
        if let Some(content_type) = content_type {
            properties = properties.with_content_type(content_type);
        }
        if let Some(message_id) = message_id {
            properties = properties.with_message_id(message_id);
        }

        let envelope = Envelope::read(&properties, &routing_key, now_ms);
        let app = split_headers(&properties);
        for (_, value) in &app.visible {
            // What a plugin sees converts back to something writable.
            let _ = HeaderValue::from_amqp(&value.to_amqp());
        }
        let plugin_table = plugin_headers_to_table(&app.visible);
        prop_assert!(delivered(&plugin_table).is_some());

        round_trip(&republish_properties(&properties, &envelope));
        round_trip(&republish_properties(&properties, &envelope.for_retry()));
        if let Some(copy) = set_aside_within_frame(&properties, &envelope, &reason, 131_072) {
            round_trip(&copy);
        }
        // Read back, the copy has the same envelope.
        let again = Envelope::read(&republish_properties(&properties, &envelope), &routing_key, now_ms);
        prop_assert_eq!(again.id, envelope.id);
        prop_assert_eq!(again.attempt, envelope.attempt);
    }
}
