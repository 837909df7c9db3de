//! How many bytes lapin's encoder writes for a message's properties,
//! counted instead of written.
//!
//! Every output is measured before it is published ([`super::check_frame`]):
//! a content header larger than the connection's `frame_max` closes the
//! whole connection. Measuring by encoding (`gen_properties` into a `Vec`)
//! cost about 3 % of the host's CPU on the transform path, more than the
//! encoding lapin does anyway when it sends the frame, because the
//! encoder writes every table twice over (a placeholder for its length,
//! then back to fill it in) through a chain of closures. The count below
//! follows the same layout, AMQP 0-9-1 §4.2.5 as amq-protocol writes it,
//! and a test holds it equal to the encoder's output for every kind of
//! value and every property.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};

/// Bytes of the length prefix of a long string, a table or an array.
const LONG_LENGTH: usize = 4;
/// The property flags: one 16-bit word (the 14 basic properties fit in
/// its 15 flag bits, so no continuation word is ever written).
const FLAGS: usize = 2;

/// Bytes `gen_properties` writes for `properties`: the flags, then each
/// property that is set.
#[must_use]
pub fn encoded_properties_len(properties: &BasicProperties) -> usize {
    let short_strings = [
        properties.content_type(),
        properties.content_encoding(),
        properties.correlation_id(),
        properties.reply_to(),
        properties.expiration(),
        properties.message_id(),
        properties.kind(),
        properties.user_id(),
        properties.app_id(),
        properties.cluster_id(),
    ];
    let octets = [properties.delivery_mode(), properties.priority()];
    FLAGS
        + short_strings
            .iter()
            .filter_map(|s| s.as_ref())
            .map(short_string_len)
            .sum::<usize>()
        + octets.iter().filter(|o| o.is_some()).count()
        + properties.timestamp().map_or(0, |_| 8)
        + properties.headers().as_ref().map_or(0, table_len)
}

fn short_string_len(s: &ShortString) -> usize {
    1 + s.as_str().len()
}

/// A field table: its length, then each name (a short string) with its
/// tagged value.
fn table_len(table: &FieldTable) -> usize {
    LONG_LENGTH
        + table
            .inner()
            .iter()
            .map(|(name, value)| short_string_len(name) + tagged_value_len(value))
            .sum::<usize>()
}

/// A value in a table or an array: its type octet, then the value.
fn tagged_value_len(value: &AMQPValue) -> usize {
    1 + value_len(value)
}

fn value_len(value: &AMQPValue) -> usize {
    match value {
        AMQPValue::Void => 0,
        AMQPValue::Boolean(_) | AMQPValue::ShortShortInt(_) | AMQPValue::ShortShortUInt(_) => 1,
        AMQPValue::ShortInt(_) | AMQPValue::ShortUInt(_) => 2,
        AMQPValue::LongInt(_) | AMQPValue::LongUInt(_) | AMQPValue::Float(_) => 4,
        // Scale (1) and value (4).
        AMQPValue::DecimalValue(_) => 5,
        AMQPValue::LongLongInt(_) | AMQPValue::Double(_) | AMQPValue::Timestamp(_) => 8,
        AMQPValue::ShortString(s) => short_string_len(s),
        AMQPValue::LongString(s) => LONG_LENGTH + s.as_bytes().len(),
        AMQPValue::ByteArray(bytes) => LONG_LENGTH + bytes.as_slice().len(),
        AMQPValue::FieldArray(array) => {
            LONG_LENGTH + array.as_slice().iter().map(tagged_value_len).sum::<usize>()
        }
        AMQPValue::FieldTable(table) => table_len(table),
    }
}

#[cfg(test)]
mod tests {
    use lapin::protocol::basic::gen_properties;
    use lapin::types::{ByteArray, DecimalValue, FieldArray, LongString};

    use super::*;

    fn encoded(properties: &BasicProperties) -> usize {
        gen_properties::<Vec<u8>>(properties)(Vec::new().into())
            .expect("a Vec takes any properties")
            .write
            .len()
    }

    /// One value of every kind the encoder knows, with lengths that are
    /// not round numbers.
    fn every_kind() -> Vec<AMQPValue> {
        vec![
            AMQPValue::Void,
            AMQPValue::Boolean(true),
            AMQPValue::ShortShortInt(-3),
            AMQPValue::ShortShortUInt(3),
            AMQPValue::ShortInt(-300),
            AMQPValue::ShortUInt(300),
            AMQPValue::LongInt(-70_000),
            AMQPValue::LongUInt(70_000),
            AMQPValue::LongLongInt(-5_000_000_000),
            AMQPValue::Float(1.5),
            AMQPValue::Double(2.25),
            AMQPValue::DecimalValue(DecimalValue {
                scale: 2,
                value: 12_345,
            }),
            AMQPValue::ShortString("short".into()),
            AMQPValue::LongString(LongString::from("a long string, of 33 bytes here.")),
            AMQPValue::ByteArray(ByteArray::from(vec![0_u8, 255, 7])),
            AMQPValue::Timestamp(1_700_000_000),
        ]
    }

    fn table_of(values: Vec<AMQPValue>) -> FieldTable {
        let mut table = FieldTable::default();
        for (i, value) in values.into_iter().enumerate() {
            table.insert(format!("h{i}-{}", "x".repeat(i)).into(), value);
        }
        table
    }

    #[test]
    fn no_properties_are_the_flags_alone() {
        let none = BasicProperties::default();
        assert_eq!(encoded_properties_len(&none), encoded(&none));
        assert_eq!(encoded_properties_len(&none), FLAGS);
    }

    #[test]
    fn every_property_counts_as_the_encoder_writes_it() {
        let all = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_content_encoding("gzip".into())
            .with_headers(table_of(every_kind()))
            .with_delivery_mode(2)
            .with_priority(5)
            .with_correlation_id("corr-1".into())
            .with_reply_to("replies".into())
            .with_expiration("60000".into())
            .with_message_id("0190a4c2-7e1b-8f00-9c3d-1234567890ab".into())
            .with_timestamp(1_700_000_000)
            .with_type("order.created".into())
            .with_user_id("guest".into())
            .with_app_id("acemq-host".into())
            .with_cluster_id("c".into());
        assert_eq!(encoded_properties_len(&all), encoded(&all));
    }

    #[test]
    fn each_property_alone_counts_as_the_encoder_writes_it() {
        let one_each = [
            BasicProperties::default().with_content_type("text/plain".into()),
            BasicProperties::default().with_content_encoding("".into()),
            BasicProperties::default().with_headers(FieldTable::default()),
            BasicProperties::default().with_delivery_mode(1),
            BasicProperties::default().with_priority(0),
            BasicProperties::default().with_correlation_id("c".into()),
            BasicProperties::default().with_reply_to("r".into()),
            BasicProperties::default().with_expiration("1".into()),
            BasicProperties::default().with_message_id("m".repeat(255).into()),
            BasicProperties::default().with_timestamp(0),
            BasicProperties::default().with_type("t".into()),
            BasicProperties::default().with_user_id("u".into()),
            BasicProperties::default().with_app_id("a".into()),
            BasicProperties::default().with_cluster_id("c".into()),
        ];
        for properties in one_each {
            assert_eq!(
                encoded_properties_len(&properties),
                encoded(&properties),
                "{properties:?}"
            );
        }
    }

    #[test]
    fn nested_tables_and_arrays_count_as_the_encoder_writes_them() {
        let array = FieldArray::from(every_kind());
        let inner = table_of(every_kind());
        let mut nested = table_of(vec![
            AMQPValue::FieldArray(array.clone()),
            AMQPValue::FieldTable(inner.clone()),
            AMQPValue::FieldArray(FieldArray::from(vec![
                AMQPValue::FieldTable(inner),
                AMQPValue::FieldArray(array),
                AMQPValue::FieldArray(FieldArray::default()),
            ])),
        ]);
        nested.insert("empty".into(), AMQPValue::FieldTable(FieldTable::default()));
        // x-death as the broker writes it: an array of tables.
        let death = table_of(vec![
            AMQPValue::LongString("orders".into()),
            AMQPValue::LongLongInt(3),
            AMQPValue::Timestamp(1_700_000_000),
        ]);
        nested.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(death)])),
        );
        let properties = BasicProperties::default().with_headers(nested);
        assert_eq!(encoded_properties_len(&properties), encoded(&properties));
    }

    #[test]
    fn large_bodies_of_headers_count_exactly() {
        let big = table_of(
            (0..200)
                .map(|i| AMQPValue::LongString("v".repeat(i * 7).into()))
                .collect(),
        );
        let properties = BasicProperties::default().with_headers(big);
        assert_eq!(encoded_properties_len(&properties), encoded(&properties));
    }
}
