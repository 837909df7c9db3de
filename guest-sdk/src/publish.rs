//! Asking the host to publish a message.

use core::fmt;

use serde::Serialize;

use crate::bindings::wit_types::Outgoing;
use crate::message::{HeaderValue, Headers};
use crate::outcome::Outcome;

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
/// The exchange must be in the consumer's `publish_to` list, and header names
/// starting with `x-acemq-` are reserved; otherwise `send` fails and buffers
/// nothing.
///
/// ```
/// # use acemq_guest::prelude::*;
/// # fn f(order_id: &str) -> Result {
/// publish("orders.events", "order.accepted")
///     .json(&json!({ "id": order_id }))
///     .header("tenant", "acme")
///     .send()?; // refused by the host: ends the handler with `retry`
/// # accept()
/// # }
/// ```
pub fn publish(exchange: impl Into<String>, routing_key: impl Into<String>) -> Publish {
    Publish {
        out: Outgoing {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            body: Vec::new(),
            content_type: None,
            headers: Vec::new(),
            message_type: None,
            persistent: true,
            mandatory: None,
        },
        encode_error: None,
    }
}

/// A message being built by [`publish`]. Defaults: empty body, no content
/// type (the host then uses `application/json`), no headers, message type =
/// routing key, persistent.
#[must_use = "nothing is published until `.send()` is called"]
#[derive(Clone, Debug)]
pub struct Publish {
    out: Outgoing,
    // A body that failed to serialize is reported by `send`, so the builder
    // chain needs a single `?` at its end.
    encode_error: Option<String>,
}

impl Publish {
    /// Sets the body to `value` serialized as JSON, and the content type to
    /// `application/json` unless one was set. A value that cannot be
    /// serialized makes [`send`](Self::send) fail.
    pub fn json<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => {
                self.out.body = body;
                self.encode_error = None;
            }
            Err(e) => self.encode_error = Some(format!("body could not be serialized: {e}")),
        }
        self.out
            .content_type
            .get_or_insert_with(|| "application/json".into());
        self
    }

    /// Sets the body to `text`, and the content type to
    /// `text/plain; charset=utf-8` unless one was set.
    pub fn text(mut self, text: impl Into<String>) -> Self {
        self.out.body = text.into().into_bytes();
        self.encode_error = None;
        self.out
            .content_type
            .get_or_insert_with(|| "text/plain; charset=utf-8".into());
        self
    }

    /// Sets the body to raw bytes. Set a [`content_type`](Self::content_type)
    /// too: without one the host labels the message `application/json`.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.out.body = body.into();
        self.encode_error = None;
        self
    }

    /// Sets the AMQP content type.
    pub fn content_type(mut self, content_type: impl Into<String>) -> Self {
        self.out.content_type = Some(content_type.into());
        self
    }

    /// Sets an application header (replacing one of the same name).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<HeaderValue>) -> Self {
        let name = name.into();
        let value = value.into();
        match self.out.headers.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => *v = value,
            None => self.out.headers.push((name, value)),
        }
        self
    }

    /// Sets several headers, e.g. to forward those of the input:
    /// `.headers(msg.headers().clone())`.
    pub fn headers(mut self, headers: Headers) -> Self {
        for (name, value) in headers {
            self = self.header(name, value);
        }
        self
    }

    /// Sets the envelope's message type (`x-acemq-type`); it defaults to the
    /// routing key.
    pub fn message_type(mut self, message_type: impl Into<String>) -> Self {
        self.out.message_type = Some(message_type.into());
        self
    }

    /// Publishes with delivery mode 1: the broker may lose it on restart.
    /// Messages are persistent unless this is called.
    pub fn transient(mut self) -> Self {
        self.out.persistent = false;
        self
    }

    /// Whether the message must reach a queue. `true`: if no queue takes it,
    /// the handler's input fails and is retried (or set aside). `false`: the
    /// broker drops it unrouted and the input is acked, for an event that
    /// may have no subscriber yet. Unset, the consumer's `mandatory_outputs`
    /// setting decides (true unless configured).
    pub fn mandatory(mut self, must_be_routed: bool) -> Self {
        self.out.mandatory = Some(must_be_routed);
        self
    }

    /// Hands the message to the host's buffer (see [`publish`] for when it is
    /// really sent). The error converts into [`Outcome::Retry`], so `?` ends
    /// the handler with a retry that names the exchange and the host's reason.
    pub fn send(self) -> Result<(), PublishError> {
        let fail = |problem: String| PublishError {
            exchange: self.out.exchange.clone(),
            routing_key: self.out.routing_key.clone(),
            problem,
        };
        if let Some(problem) = &self.encode_error {
            return Err(fail(problem.clone()));
        }
        crate::host::sys::publish(&self.out).map_err(fail)
    }
}

/// A publish the host refused (exchange not allowed, reserved header), or
/// whose body could not be serialized. Nothing was buffered.
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
    use crate::testing::TestHost;

    #[test]
    fn builder_fills_every_field() {
        let host = TestHost::new();
        let sent = host.run(|| {
            publish("ex", "rk")
                .json(&serde_json::json!({"a": 1}))
                .header("k", "v")
                .header("n", 1)
                .header("k", "w")
                .message_type("thing.done")
                .transient()
                .mandatory(false)
                .send()
        });
        assert_eq!(sent.value, Ok(()));
        assert_eq!(
            sent.published,
            [Outgoing {
                exchange: "ex".into(),
                routing_key: "rk".into(),
                body: br#"{"a":1}"#.to_vec(),
                content_type: Some("application/json".into()),
                headers: vec![
                    ("k".into(), HeaderValue::Text("w".into())),
                    ("n".into(), HeaderValue::Int(1)),
                ],
                message_type: Some("thing.done".into()),
                persistent: false,
                mandatory: Some(false),
            }]
        );
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
