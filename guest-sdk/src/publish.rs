//! Asking the host to publish a message.

use core::fmt;

use crate::bindings::wit_types::Outgoing;
pub use crate::bindings::wit_types::Sent;
use crate::outcome::Outcome;
use crate::outgoing::{Parts, shared_builder_methods};

/// Starts a message to `exchange` with `routing_key`; finish it with
/// [`send`](Publish::send).
///
/// **Nothing is sent while the handler runs.** `send` hands the message to
/// the host, which buffers it. If the handler then returns
/// [`accept`](crate::accept), the host publishes every buffered message, waits
/// for the broker to confirm each one, and only then acknowledges the input.
/// Any other outcome discards the buffer. If a confirmed publish fails, the
/// input is retried, so outputs are delivered *at least once*: consumers of
/// what you publish should tolerate duplicates (the envelope id helps).
///
/// The exchange must be in the consumer's `publish_to` list, header names
/// starting with `x-acemq-` are reserved, and an explicit [`id`](Publish::id)
/// must be a UUID unique in the call; otherwise `send` fails and buffers
/// nothing.
///
/// `send` returns the [`Sent`] envelope fields: the id and correlation the
/// message will carry on the wire. This is the id to log, or to hand on.
///
/// ```
/// # use acemq_guest::prelude::*;
/// # fn f(order_id: &str) -> Result {
/// let sent = publish("orders.events", "order.accepted")
///     .json(&json!({ "id": order_id }))
///     .header("tenant", "acme")
///     .message_type("order.accepted")
///     .version(2)
///     .send()?; // refused by the host: ends the handler with `retry`
/// acemq_guest::info!("order {order_id} announced as {}", sent.id);
/// # accept()
/// # }
/// ```
pub fn publish(exchange: impl Into<String>, routing_key: impl Into<String>) -> Publish {
    Publish {
        exchange: exchange.into(),
        routing_key: routing_key.into(),
        parts: Parts::default(),
        persistent: true,
        mandatory: None,
    }
}

/// A message being built by [`publish`]. Defaults: empty body, no content
/// type (the host then uses `application/json`), no headers, persistent;
/// envelope: an id derived by the host, message type = routing key,
/// version 1, the input's correlation, causation = the input's id.
#[must_use = "nothing is published until `.send()` is called"]
#[derive(Clone, Debug)]
pub struct Publish {
    exchange: String,
    routing_key: String,
    parts: Parts,
    persistent: bool,
    mandatory: Option<bool>,
}

impl Publish {
    shared_builder_methods!("the routing key");

    /// Sets the conversation the message belongs to (`x-acemq-correlation`).
    /// Default: the input's correlation; set it to start a conversation of
    /// its own.
    pub fn correlation_id(mut self, correlation_id: impl Into<String>) -> Self {
        self.parts.envelope.correlation_id = Some(correlation_id.into());
        self
    }

    /// Names the message that caused this one (`x-acemq-causation`).
    /// Default: the input's id.
    pub fn causation_id(mut self, causation_id: impl Into<String>) -> Self {
        self.parts.envelope.causation_id = Some(causation_id.into());
        self
    }

    /// Publishes with delivery mode 1: the broker may lose it on restart.
    /// Messages are persistent unless this is called.
    pub fn transient(mut self) -> Self {
        self.persistent = false;
        self
    }

    /// Whether the message must reach a queue. `true`: if no queue takes it,
    /// the handler's input fails and is retried (or set aside). `false`: the
    /// broker drops it unrouted and the input is acked, for an event that
    /// may have no subscriber yet. Unset, the consumer's `mandatory_outputs`
    /// setting decides (true unless configured).
    pub fn mandatory(mut self, must_be_routed: bool) -> Self {
        self.mandatory = Some(must_be_routed);
        self
    }

    /// Hands the message to the host's buffer (see [`publish`] for when it is
    /// really sent) and returns the id and correlation it will carry. The
    /// error converts into [`Outcome::Retry`], so `?` ends the handler with
    /// a retry that names the exchange and the host's reason.
    pub fn send(self) -> Result<Sent, PublishError> {
        let fail = |problem: String| PublishError {
            exchange: self.exchange.clone(),
            routing_key: self.routing_key.clone(),
            problem,
        };
        if let Some(problem) = &self.parts.encode_error {
            return Err(fail(problem.clone()));
        }
        let out = Outgoing {
            exchange: self.exchange.clone(),
            routing_key: self.routing_key.clone(),
            body: self.parts.body,
            content_type: self.parts.content_type,
            headers: self.parts.headers,
            envelope: self.parts.envelope,
            persistent: self.persistent,
            mandatory: self.mandatory,
            // Delayed publishing belongs to a later contract feature; this
            // SDK does not offer it yet, and the host refuses it.
            deliver_at_ms: None,
        };
        crate::host::sys::publish(&out).map_err(fail)
    }
}

/// A publish the host refused (exchange not allowed, reserved header,
/// refused envelope field), or whose body could not be serialized.
/// Nothing was buffered.
///
/// Converts into [`Outcome::Retry`]: a refusal usually comes from the
/// consumer's configuration, which an operator can fix while the retry
/// policy holds the message. Use [`OrOutcome`](crate::OrOutcome) or
/// `map_err` to decide otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishError {
    exchange: String,
    routing_key: String,
    problem: String,
}

impl PublishError {
    /// The exchange the message was for.
    pub fn exchange(&self) -> &str {
        &self.exchange
    }

    /// Its routing key.
    pub fn routing_key(&self) -> &str {
        &self.routing_key
    }

    /// What went wrong: the host's message, or the serializer's.
    pub fn reason(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "publish to exchange `{}` with routing key `{}` failed: {}",
            self.exchange, self.routing_key, self.problem
        )
    }
}

impl std::error::Error for PublishError {}

impl From<PublishError> for Outcome {
    fn from(e: PublishError) -> Self {
        Outcome::Retry(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HeaderValue;
    use crate::testing::{self, EnvelopeFields, TestHost};

    #[test]
    fn builder_fills_every_field() {
        let host = TestHost::new();
        let ran = host.run(|| {
            publish("ex", "rk")
                .json(&serde_json::json!({"a": 1}))
                .header("k", "v")
                .header("n", 1)
                .header("k", "w")
                .message_type("thing.done")
                .version(3)
                .id("0190b3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d")
                .correlation_id("conversation-9")
                .causation_id("cause-1")
                .transient()
                .mandatory(false)
                .send()
        });
        let sent = Sent {
            id: "0190b3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d".into(),
            correlation_id: "conversation-9".into(),
        };
        assert_eq!(ran.value, Ok(sent.clone()));
        assert_eq!(ran.published[0].sent, sent);
        assert_eq!(
            ran.published[0].message,
            Outgoing {
                exchange: "ex".into(),
                routing_key: "rk".into(),
                body: br#"{"a":1}"#.to_vec(),
                content_type: Some("application/json".into()),
                headers: vec![
                    ("k".into(), HeaderValue::Text("w".into())),
                    ("n".into(), HeaderValue::Int(1)),
                ],
                envelope: EnvelopeFields {
                    id: Some("0190b3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d".into()),
                    message_type: Some("thing.done".into()),
                    version: Some(3),
                    correlation_id: Some("conversation-9".into()),
                    causation_id: Some("cause-1".into()),
                },
                persistent: false,
                mandatory: Some(false),
                deliver_at_ms: None,
            }
        );
    }

    #[test]
    fn defaults_leave_the_envelope_to_the_host_and_inherit_the_correlation() {
        let mut input = testing::message("in");
        input.envelope_mut().id = "input-7".into();
        input.envelope_mut().correlation_id = "conversation-1".into();
        let done = TestHost::new().handle::<TwoOutputs>(input);
        assert_eq!(done.outcome, Outcome::Accept);
        let [first, second] = &done.published[..] else {
            panic!("two outputs expected: {:?}", done.published)
        };
        assert_eq!(first.envelope, EnvelopeFields::default());
        assert_eq!(first.sent.correlation_id, "conversation-1");
        assert_ne!(first.sent.id, second.sent.id, "each output has its own id");
        // What the handler logged is what the host would put on the wire.
        assert_eq!(done.logs[0].1, format!("sent {}", first.sent.id));

        // Handled again (a redelivery), the same outputs get the same ids.
        let mut again = testing::message("in");
        again.envelope_mut().id = "input-7".into();
        let redone = TestHost::new().handle::<TwoOutputs>(again);
        assert_eq!(redone.published[0].sent.id, first.sent.id);
        assert_eq!(redone.published[1].sent.id, second.sent.id);
    }

    struct TwoOutputs;
    impl crate::Handler for TwoOutputs {
        fn handle(_: crate::Message) -> crate::Result {
            let sent = publish("ex", "a").text("1").send()?;
            crate::info!("sent {}", sent.id);
            publish("ex", "b").text("2").send()?;
            crate::accept()
        }
    }

    #[test]
    fn refused_envelope_fields_buffer_nothing() {
        let id = "0190b3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d";
        let ran = TestHost::new().run(|| {
            (
                publish("ex", "rk").id("order-1").send(),
                publish("ex", "rk").version(0).send(),
                publish("ex", "rk").id(id).send(),
                publish("ex", "rk").id(id).send(),
            )
        });
        let (not_uuid, version_zero, first, duplicate) = ran.value;
        assert!(
            not_uuid
                .unwrap_err()
                .reason()
                .contains("'order-1' is not a UUID"),
            "the refusal names the id"
        );
        assert!(version_zero.unwrap_err().reason().contains("version 0"));
        assert_eq!(first.unwrap().id, id);
        assert!(duplicate.unwrap_err().reason().contains("already the id"));
        assert_eq!(ran.published.len(), 1);
    }

    #[test]
    fn explicit_content_type_wins() {
        let host = TestHost::new();
        let sent = host.run(|| {
            publish("ex", "rk")
                .content_type("application/vnd.acme+json")
                .json(&1)
                .send()
        });
        assert_eq!(
            sent.published[0].content_type.as_deref(),
            Some("application/vnd.acme+json")
        );
    }

    #[test]
    fn unserializable_body_fails_at_send_and_buffers_nothing() {
        use std::collections::HashMap;
        let bad: HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let host = TestHost::new();
        let sent = host.run(|| publish("ex", "rk").json(&bad).send());
        let err = sent.value.unwrap_err();
        assert_eq!(err.exchange(), "ex");
        assert!(
            Outcome::from(err)
                .to_string()
                .starts_with("retry: publish to exchange `ex` with routing key `rk` failed: body could not be serialized"),
        );
        assert!(sent.published.is_empty());
    }

    #[test]
    fn host_refusal_becomes_retry_with_the_hosts_reason() {
        let host = TestHost::new().publish_to(["allowed"]);
        let sent = host.run(|| publish("other", "rk").text("hi").send());
        assert_eq!(
            Outcome::from(sent.value.unwrap_err()),
            Outcome::Retry(
                "publish to exchange `other` with routing key `rk` failed: \
                 publishing to exchange 'other' is not allowed for this consumer \
                 (publish_to = ['allowed'])"
                    .into()
            )
        );
    }
}
