//! The id of a delivery that names none: derived from what the broker
//! delivers, so that every delivery of the same message reads the same id.

use lapin::BasicProperties;
use lapin::protocol::basic::gen_properties;
use lapin::types::FieldTable;
use sha2::{Digest, Sha256};

/// Headers the broker adds or changes between deliveries of one message:
/// quorum queues count deliveries in `x-delivery-count`; dead-lettering
/// writes `x-death` and the `x-first-death-*` / `x-last-death-*` summary.
const CHANGED_BY_THE_BROKER: [&str; 2] = ["x-delivery-count", "x-death"];
const CHANGED_BY_THE_BROKER_PREFIXES: [&str; 2] = ["x-first-death-", "x-last-death-"];

/// Keeps the hash of an input id apart from any other hash the host makes
/// (an output's id, [`super::output_id`]).
const DOMAIN: &[u8] = b"acemq-host derived input id v1";

/// The id of a delivered message that carries neither `x-acemq-id` nor a
/// `message-id`: a UUID (version 8, RFC 9562's custom layout, like
/// [`super::output_id`]) made of the first bytes of a SHA-256 of its body
/// and its properties, headers included.
///
/// Why derived and not random: the outputs of a message are named after its
/// id ([`super::output_id`]), so a random id, drawn again at every
/// delivery, gave a redelivered message (after a crash between the
/// outputs' confirm and the input's ack, say) outputs with new ids, which
/// no reader could recognise as duplicates. Derived from what the broker
/// delivers, the id is the same at every delivery of the message, and so
/// are its outputs' ids.
///
/// What the broker changes between deliveries of one message is left out:
/// the headers `x-delivery-count` (quorum queues), `x-death` and the
/// `x-first-death-*` / `x-last-death-*` summary (dead-lettering), and the
/// delivery's redelivered flag and delivery tag, which are not properties
/// at all. Everything else the publisher set counts, including the
/// broker's `x-stream-offset`, which tells two equal messages of a stream
/// apart.
///
/// The limit: two byte-identical messages without ids (the same body, the
/// same properties and headers) get the same id, and so do their outputs.
/// The host cannot tell them apart, and neither could a reader; a
/// publisher that sends the same message twice on purpose gives each an
/// id (or a timestamp, or any header that differs).
#[must_use]
pub fn derived_input_id(properties: &BasicProperties, body: &[u8]) -> String {
    // A copy without the broker's headers only when there are some: the
    // first delivery of a message (most of them) has none, and the copy
    // cost as much as the hash of a small body.
    let without_the_brokers;
    let stable = match properties.headers() {
        Some(headers)
            if headers
                .into_iter()
                .any(|(name, _)| changed_by_the_broker(name.as_str())) =>
        {
            let kept: FieldTable = headers
                .into_iter()
                .filter(|(name, _)| !changed_by_the_broker(name.as_str()))
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect::<std::collections::BTreeMap<_, _>>()
                .into();
            without_the_brokers = properties.clone().with_headers(kept);
            &without_the_brokers
        }
        _ => properties,
    };
    let mut hash = Sha256::new();
    hash.update(DOMAIN);
    // The AMQP encoding of the properties: the same bytes for the same
    // properties (the header table is ordered by name), whatever the
    // version of this host.
    ENCODED_PROPERTIES.with_borrow_mut(|buffer| {
        buffer.clear();
        match gen_properties::<Vec<u8>>(stable)(std::mem::take(buffer).into()) {
            Ok(written) => {
                part(&mut hash, &written.write);
                if written.write.capacity() <= KEPT_ENCODING_CAPACITY {
                    *buffer = written.write;
                }
            }
            // Only for a value the encoder cannot write, which a delivery
            // that was read off the wire does not hold.
            Err(_) => part(&mut hash, format!("{stable:?}").as_bytes()),
        }
    });
    part(&mut hash, body);
    uuid_of(hash)
}

thread_local! {
    /// Where [`derived_input_id`] encodes properties, kept between calls on
    /// each thread: encoding into a new vector grew it two or three times
    /// a delivery (`heaptrack`, the transform path).
    static ENCODED_PROPERTIES: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The largest encoding buffer kept for the next call: a message with
/// unusually large headers does not hold its size on the thread for good.
const KEPT_ENCODING_CAPACITY: usize = 16 * 1024;

/// Keeps the hash of a stream message's id apart from the others.
const STREAM_DOMAIN: &[u8] = b"acemq-host stream message id v1";

/// The id of a message read from a stream that carries neither
/// `x-acemq-id` nor a `message-id`: a UUID (version 8, as
/// [`derived_input_id`]) made of the first bytes of a SHA-256 of the
/// stream's name and the message's offset.
///
/// Why not [`derived_input_id`]: a stream keeps each message at one offset
/// for good, and the broker stamps every delivery of it with that offset,
/// over either protocol; the name and the offset already tell it apart from
/// every other message, the same at every read. Hashing its body as well
/// (SHA-256 over a kilobyte or more) was the largest single cost of
/// handing a stream message to a plugin, for nothing the offset does not
/// give. The caller uses this only for a consumer it knows reads a stream
/// (on a queue, an offset header is the producer's word, and two messages
/// could carry the same one).
#[must_use]
pub fn stream_message_id(stream: &str, offset: u64) -> String {
    let mut hash = Sha256::new();
    hash.update(STREAM_DOMAIN);
    part(&mut hash, stream.as_bytes());
    hash.update(offset.to_be_bytes());
    uuid_of(hash)
}

/// The UUID (version 8, RFC 9562's custom layout) made of the first 16
/// bytes of `hash`: how every id the host derives looks like every other
/// AceMQ id.
pub(super) fn uuid_of(hash: Sha256) -> String {
    let digest = hash.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Uuid::new_v8(bytes).to_string()
}

/// Length-prefixed, so no two different inputs hash the same bytes.
pub(super) fn part(hash: &mut Sha256, bytes: &[u8]) {
    hash.update((bytes.len() as u64).to_be_bytes());
    hash.update(bytes);
}

fn changed_by_the_broker(name: &str) -> bool {
    // In any case, compared without a lowercased copy of every name.
    CHANGED_BY_THE_BROKER
        .iter()
        .any(|changed| name.eq_ignore_ascii_case(changed))
        || CHANGED_BY_THE_BROKER_PREFIXES.iter().any(|prefix| {
            name.get(..prefix.len())
                .is_some_and(|start| start.eq_ignore_ascii_case(prefix))
        })
}

#[cfg(test)]
mod tests {
    use lapin::types::AMQPValue;

    use super::*;
    use crate::envelope::test_support::{ls, x_death};

    fn with_headers(entries: Vec<(&str, AMQPValue)>) -> BasicProperties {
        let mut table = FieldTable::default();
        for (name, value) in entries {
            table.insert(name.into(), value);
        }
        BasicProperties::default()
            .with_content_type("application/json".into())
            .with_headers(table)
    }

    fn tenant() -> (&'static str, AMQPValue) {
        ("tenant", ls("acme"))
    }

    #[test]
    fn a_stream_message_id_is_a_uuid_named_by_its_stream_and_offset_alone() {
        let id = stream_message_id("orders.log", 42);
        assert_eq!(
            uuid::Uuid::parse_str(&id)
                .expect("a UUID")
                .get_version_num(),
            8
        );
        assert_eq!(id, stream_message_id("orders.log", 42));
        assert_ne!(id, stream_message_id("orders.log", 43));
        assert_ne!(id, stream_message_id("orders.lo", 42));
        // Length-prefixed: the name's end cannot pass for the offset's start.
        assert_ne!(stream_message_id("a", 0), stream_message_id("", 0));
    }

    #[test]
    fn the_id_is_a_uuid_and_the_same_for_the_same_delivery() {
        let properties = with_headers(vec![tenant()]);
        let id = derived_input_id(&properties, b"{\"n\":1}");
        let uuid = uuid::Uuid::parse_str(&id).expect("a UUID");
        assert_eq!(uuid.get_version_num(), 8);
        assert_eq!(id, uuid.hyphenated().to_string());
        assert_eq!(id, derived_input_id(&properties.clone(), b"{\"n\":1}"));
    }

    #[test]
    fn the_id_does_not_depend_on_what_the_thread_derived_before() {
        let small = with_headers(vec![tenant()]);
        let on_a_fresh_thread = std::thread::spawn({
            let small = small.clone();
            move || derived_input_id(&small, b"{}")
        })
        .join()
        .expect("derived");
        // A longer encoding first (the buffer it leaves is longer than the
        // next one), then one too large to keep.
        let note = "n".repeat(100);
        let longer = with_headers(vec![tenant(), ("note", ls(&note))]);
        assert_ne!(derived_input_id(&longer, b"{}"), on_a_fresh_thread);
        assert_eq!(derived_input_id(&small, b"{}"), on_a_fresh_thread);
        let huge = "h".repeat(KEPT_ENCODING_CAPACITY * 2);
        let too_large = with_headers(vec![("note", ls(&huge))]);
        assert_ne!(derived_input_id(&too_large, b"{}"), on_a_fresh_thread);
        assert_eq!(derived_input_id(&small, b"{}"), on_a_fresh_thread);
    }

    #[test]
    fn what_the_broker_changes_between_deliveries_does_not_change_the_id() {
        let body = b"{\"n\":1}";
        let first = derived_input_id(&with_headers(vec![tenant()]), body);
        let again = with_headers(vec![
            tenant(),
            ("x-delivery-count", AMQPValue::LongLongInt(3)),
            ("x-death", x_death()),
            ("x-first-death-exchange", ls("orders")),
            ("x-first-death-queue", ls("orders.new")),
            ("x-first-death-reason", ls("rejected")),
            ("x-last-death-exchange", ls("orders")),
            ("x-last-death-queue", ls("orders.new.retry")),
            ("x-last-death-reason", ls("expired")),
        ]);
        assert_eq!(first, derived_input_id(&again, body));
    }

    #[test]
    fn a_different_body_header_or_property_is_a_different_id() {
        let body = b"{\"n\":1}";
        let first = derived_input_id(&with_headers(vec![tenant()]), body);
        assert_ne!(
            first,
            derived_input_id(&with_headers(vec![tenant()]), b"{\"n\":2}")
        );
        assert_ne!(
            first,
            derived_input_id(&with_headers(vec![("tenant", ls("globex"))]), body)
        );
        assert_ne!(
            first,
            derived_input_id(
                &with_headers(vec![
                    tenant(),
                    ("x-stream-offset", AMQPValue::LongLongInt(7))
                ]),
                body
            )
        );
        assert_ne!(first, derived_input_id(&with_headers(vec![]), body));
        let other_property = with_headers(vec![tenant()]).with_timestamp(1_700_000_000);
        assert_ne!(first, derived_input_id(&other_property, body));
        // The body and the properties are told apart, not run together.
        assert_ne!(
            derived_input_id(&BasicProperties::default(), b""),
            derived_input_id(&BasicProperties::default(), b"\0")
        );
    }

    /// The documented limit: byte-identical messages without ids are one
    /// message to the host.
    #[test]
    fn byte_identical_messages_without_ids_get_the_same_id() {
        let a = derived_input_id(&with_headers(vec![tenant()]), b"same");
        let b = derived_input_id(&with_headers(vec![tenant()]), b"same");
        assert_eq!(a, b);
    }

    /// The ids of fixed deliveries, as every version of the host has
    /// derived them: a redelivery after an upgrade keeps its id (and its
    /// outputs theirs), so the derivation may be made faster, never
    /// different. The broker's headers are left out in any case.
    #[test]
    fn the_derivation_never_changes() {
        let first = with_headers(vec![tenant()]).with_delivery_mode(2);
        let redelivered = with_headers(vec![
            tenant(),
            ("X-Delivery-Count", AMQPValue::LongLongInt(2)),
            ("x-Last-Death-Queue", ls("q")),
        ])
        .with_delivery_mode(2);
        let body = br#"{"order":17}"#;
        let pinned = "ff7db554-9cae-881d-9cf7-768c382e7b84";
        assert_eq!(derived_input_id(&first, body), pinned);
        assert_eq!(derived_input_id(&redelivered, body), pinned);
        assert_eq!(
            derived_input_id(&BasicProperties::default(), b""),
            "9e0fec11-5fa1-8975-bae1-c64353eb5cd8"
        );
    }
}
