//! `message`: the messages a test hands to a handler, with test defaults.

use serde::Serialize;

use super::DEFAULT_NOW_MS;
use crate::{DeclaredRoute, Delivery, DoneStep, Envelope, Headers, Message, SlipStep};
use crate::{REPLY_TO_HEADER, ROUTING_SLIP_HEADER};

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

/// [`message`] as an AceMQ caller sends a request: its reply queue
/// `reply_to` in both the `acemq-reply-to` header and the AMQP `reply-to`
/// property. For a plain AMQP RPC client (pika), set only the property:
/// `msg.delivery_mut().reply_to = Some(..)`, and its correlation-id in
/// `msg.delivery_mut().amqp_correlation_id`.
///
/// ```
/// use acemq_guest::prelude::*;
/// use acemq_guest::testing::{self, TestHost};
///
/// struct Echo;
/// impl Handler for Echo {
///     fn handle(msg: Message) -> Result {
///         reply().text(msg.text()?).send()?;
///         accept()
///     }
/// }
///
/// let done = TestHost::new().handle::<Echo>(testing::request("ping", "caller.replies"));
/// let answer = done.reply.expect("a reply");
/// assert_eq!((answer.to.as_deref(), &answer.body[..]), (Some("caller.replies"), &b"ping"[..]));
/// assert_eq!(answer.sent.correlation_id, "test-correlation-1", "the request's");
/// ```
pub fn request(body: impl Into<Vec<u8>>, reply_to: &str) -> Message {
    let mut msg = message(body);
    msg.headers_mut().insert(REPLY_TO_HEADER, reply_to);
    msg.delivery_mut().reply_to = Some(reply_to.into());
    msg
}

/// `msg` on a JSON routing slip, as the Python, Go and Ruby libraries write
/// it in the `acemq-routing-slip` header: `steps` still to do (the first
/// is the one handling the message now), `done` those done before.
///
/// ```
/// use acemq_guest::testing;
/// use acemq_guest::SlipStep;
///
/// let steps = [SlipStep::new("work", "enrich", "enrich"), SlipStep::new("work", "store", "store")];
/// let msg = testing::on_json_slip(testing::message("x"), &steps, &[]);
/// let slip = msg.routing_slip().unwrap().expect("on a slip");
/// assert_eq!(slip.current().unwrap().name, "enrich");
/// assert_eq!(slip.next().unwrap().name, "store");
/// ```
pub fn on_json_slip(mut msg: Message, steps: &[SlipStep], done: &[DoneStep]) -> Message {
    let step = |step: &SlipStep| {
        let mut json = serde_json::Map::new();
        json.insert("name".into(), step.name.clone().into());
        if let Some(exchange) = &step.exchange {
            json.insert("exchange".into(), exchange.clone().into());
        }
        if let Some(routing_key) = &step.routing_key {
            json.insert("routingKey".into(), routing_key.clone().into());
        }
        json
    };
    let done = done.iter().map(|d| {
        let mut json = step(&d.step);
        if let Some(at) = &d.completed_at {
            json.insert("completedAt".into(), at.clone().into());
        }
        json
    });
    let slip = serde_json::json!({
        "steps": steps.iter().map(step).collect::<Vec<_>>(),
        "done": done.collect::<Vec<_>>(),
    });
    msg.headers_mut()
        .insert(ROUTING_SLIP_HEADER, slip.to_string());
    msg
}

/// `msg` on Java's declared route: the step names, the position of the one
/// handling it now (from 0) and the run's id, as the host reads them from
/// `x-acemq-route`, `x-acemq-route-position` and `x-acemq-route-id` into
/// [`Envelope::route`].
pub fn on_declared_route(
    mut msg: Message,
    steps: &[&str],
    position: u32,
    id: Option<&str>,
) -> Message {
    msg.envelope_mut().route = Some(DeclaredRoute {
        steps: steps.iter().map(|s| (*s).to_owned()).collect(),
        position,
        id: id.map(str::to_owned),
    });
    msg
}
