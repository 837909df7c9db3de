//! What an operator is told about one set-aside message, read off its
//! properties with the envelope's own reader ([`Envelope::read`]) and the
//! replay stamps' ([`ReplayStamps::read`]).

use lapin::BasicProperties;

use crate::envelope::{Envelope, HeaderValue, ReplayStamps, header};

/// The broker's reason for the first time it dead-lettered a message
/// (`rejected`, `expired`, `maxlen`, `delivery_limit`): what a message the
/// broker set aside, rather than a consumer, has instead of `x-acemq-error`.
const BROKER_REASON: &str = "x-first-death-reason";

/// One set-aside message, as `list` shows it and `--filter` matches it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAside {
    /// The envelope id.
    pub id: String,
    /// The envelope type.
    pub message_type: String,
    /// The attempt it was set aside on.
    pub attempt: u32,
    /// `x-acemq-error`, or the broker's dead-lettering reason; `None` when
    /// the message carries neither.
    pub reason: Option<String>,
    /// `x-acemq-first-seen`; `None` when the message does not carry one
    /// (the envelope would default it to now, which would be a lie here).
    pub first_seen_ms: Option<u64>,
    /// Earlier replays.
    pub replays: ReplayStamps,
}

impl SetAside {
    /// Reads a message set aside from `source_queue`. The envelope's type
    /// defaults to the routing key, and a set-aside copy's routing key is
    /// the set-aside queue's name; the source queue is the key it was
    /// consumed with, so it is the default here.
    #[must_use]
    pub fn read(properties: &BasicProperties, source_queue: &str, now_ms: u64) -> Self {
        Self::of(
            &Envelope::read(properties, source_queue, now_ms),
            properties,
        )
    }

    /// The message whose envelope, already read off `properties`, is
    /// `envelope`: a message without an id gets a new one at every read, so
    /// whoever publishes it reads it once and describes it with the same.
    #[must_use]
    pub fn of(envelope: &Envelope, properties: &BasicProperties) -> Self {
        let headers = properties.headers().as_ref();
        let has = |name: &str| headers.is_some_and(|table| table.inner().contains_key(name));
        let broker_reason = || match headers
            .and_then(|table| table.inner().get(BROKER_REASON))
            .and_then(HeaderValue::from_amqp)
        {
            Some(HeaderValue::Text(reason)) if !reason.is_empty() => {
                Some(format!("dead-lettered by the broker: {reason}"))
            }
            _ => None,
        };
        Self {
            reason: envelope.error.clone().or_else(broker_reason),
            first_seen_ms: has(header::FIRST_SEEN).then_some(envelope.first_seen_ms),
            replays: ReplayStamps::read(headers),
            id: envelope.id.to_string(),
            message_type: envelope.message_type.clone(),
            attempt: envelope.attempt,
        }
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::{AMQPValue, FieldTable};

    use super::*;
    use crate::envelope::set_aside_properties;

    const NOW: u64 = 1_770_091_506_789;

    #[test]
    fn reads_a_consumers_set_aside_copy() {
        let mut envelope = Envelope::new("order.placed", "acemq@here", NOW - 5_000);
        envelope.attempt = 3;
        let properties =
            set_aside_properties(&BasicProperties::default(), &envelope, "exhausted: boom");
        let read = SetAside::read(&properties, "orders.new", NOW);
        assert_eq!(
            read,
            SetAside {
                id: envelope.id.to_string(),
                message_type: "order.placed".into(),
                attempt: 3,
                reason: Some("exhausted: boom".into()),
                first_seen_ms: Some(NOW - 5_000),
                replays: ReplayStamps::default(),
            }
        );
    }

    #[test]
    fn a_bare_message_reads_with_the_source_queue_as_type_and_no_first_seen() {
        let mut headers = FieldTable::default();
        headers.insert(
            BROKER_REASON.into(),
            AMQPValue::LongString("rejected".into()),
        );
        let properties = BasicProperties::default()
            .with_message_id("m-1".into())
            .with_headers(headers);
        let read = SetAside::read(&properties, "orders.new", NOW);
        assert_eq!(read.id, "m-1");
        assert_eq!(read.message_type, "orders.new");
        assert_eq!(read.attempt, 1);
        assert_eq!(read.first_seen_ms, None);
        assert_eq!(
            read.reason.as_deref(),
            Some("dead-lettered by the broker: rejected")
        );
        let read = SetAside::read(&BasicProperties::default(), "q", NOW);
        assert_eq!(read.reason, None);
    }
}
