//! Fixtures shared by the tests of every file in this folder: the tables,
//! envelopes and broker headers they build, and the wire round trip they
//! check against. One copy, so the files' tests describe the same messages.

use lapin::BasicProperties;
use lapin::types::generation::gen_field_table;
use lapin::types::parsing::parse_field_table;
use lapin::types::{AMQPValue, FieldArray, FieldTable, ShortString};

use super::amqp::long_string;
use super::{Envelope, is_reserved};

pub(super) const NOW: u64 = 1_770_091_506_789;
pub(super) const EARLIER: u64 = 1_770_000_000_000;

pub(super) fn table(entries: Vec<(&str, AMQPValue)>) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in entries {
        table.insert(name.into(), value);
    }
    table
}

pub(super) fn ls(s: &str) -> AMQPValue {
    long_string(s)
}

pub(super) fn with_headers(entries: Vec<(&str, AMQPValue)>) -> BasicProperties {
    BasicProperties::default().with_headers(table(entries))
}

pub(super) fn headers_of(properties: &BasicProperties) -> &FieldTable {
    properties.headers().as_ref().expect("headers are set")
}

pub(super) fn get<'a>(table: &'a FieldTable, name: &str) -> Option<&'a AMQPValue> {
    table.inner().get(name)
}

pub(super) fn reserved_names(table: &FieldTable) -> Vec<&str> {
    table
        .inner()
        .keys()
        .map(ShortString::as_str)
        .filter(|name| is_reserved(name))
        .collect()
}

/// Encodes a table as it goes on the wire and parses it back, as a
/// consumer's client would: what survives this is what another library
/// sees.
pub(super) fn over_the_wire(table: &FieldTable) -> FieldTable {
    let written = gen_field_table::<Vec<u8>>(table)(Vec::new().into())
        .expect("the table can be written to the wire");
    let (rest, parsed) = parse_field_table(&written.write[..]).expect("the table parses back");
    assert!(rest.is_empty());
    parsed
}

/// A realistic broker-added `x-death`: a list of tables, newest first,
/// with a nested array and a timestamp.
pub(super) fn x_death() -> AMQPValue {
    let mut death = FieldTable::default();
    death.insert("count".into(), AMQPValue::LongLongInt(2));
    death.insert("reason".into(), ls("expired"));
    death.insert("queue".into(), ls("orders.new.retry.30s"));
    death.insert("exchange".into(), ls("acemq.retry"));
    death.insert(
        "routing-keys".into(),
        AMQPValue::FieldArray(FieldArray::from(vec![ls("orders.new")])),
    );
    death.insert("time".into(), AMQPValue::Timestamp(1_770_091_506));
    AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(death)]))
}

pub(super) const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

pub(super) fn full_envelope() -> Envelope {
    Envelope {
        id: "6f0b6c8e-0a49-4c8e-9d3e-6b1f3f2f8a11".into(),
        message_type: "order.placed".into(),
        version: 3,
        correlation_id: "corr-1".into(),
        causation_id: Some("cause-1".into()),
        attempt: 2,
        first_seen_ms: EARLIER,
        origin: Some("billing@host-a".into()),
        error: Some("the handler parked it: bad".into()),
        claim: Some("s3://bucket/key".into()),
        route: Some("validate,price,ship".into()),
        route_position: Some(1),
        route_id: Some("run-7".into()),
    }
}
