//! `message`: the messages a test hands to a handler, with test defaults.

use serde::Serialize;

use super::DEFAULT_NOW_MS;
use crate::{Delivery, Envelope, Headers, Message};

/// A message with `body` and test defaults: id `test-message-1`, type `test`,
/// version 1, attempt 1, from queue `test.queue`; no content type, no
/// headers. Change any part before handling it, with the `_mut` methods:
///
/// ```
/// let mut msg = acemq_guest::testing::message("hi");
/// msg.envelope_mut().attempt = 3;
/// msg.headers_mut().insert("tenant", "acme");
/// *msg.content_type_mut() = Some("text/plain".into());
/// assert_eq!(msg.envelope().attempt, 3);
/// ```
pub fn message(body: impl Into<Vec<u8>>) -> Message {
    Message::local(
        Envelope {
            id: "test-message-1".into(),
            message_type: "test".into(),
            version: 1,
            correlation_id: "test-correlation-1".into(),
            causation_id: None,
            attempt: 1,
            first_seen_ms: DEFAULT_NOW_MS,
            origin: None,
            route: None,
        },
        Delivery {
            queue: "test.queue".into(),
            exchange: "test.exchange".into(),
            routing_key: "test".into(),
            redelivered: false,
            stream_offset: None,
            reply_to: None,
            amqp_correlation_id: None,
        },
        None,
        Headers::new(),
        body.into(),
    )
}

/// [`message`] with `value` serialized as JSON and content type
/// `application/json`.
pub fn json_message<T: Serialize + ?Sized>(value: &T) -> Message {
    let mut msg = message(serde_json::to_vec(value).expect("test value serializes to JSON"));
    *msg.content_type_mut() = Some("application/json".into());
    msg
}
