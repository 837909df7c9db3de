//! Asking the host to publish a message.

use core::fmt;
use std::time::Duration;

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
/// A message can also be published later: [`delay`](Publish::delay) and
/// [`deliver_at`](Publish::deliver_at) hand it to the AceMQ scheduler.
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
        deliver_at_ms: None,
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
    deliver_at_ms: Option<u64>,
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

    /// Delivers the message at `epoch_ms` (the host's wall clock, in
    /// milliseconds since the Unix epoch, as [`now_ms`](crate::now_ms)
    /// reads it) instead of now.
    ///
    /// When the handler accepts, the host publishes the message to the
    /// AceMQ scheduler (the `acemq.schedule` exchange and its queues on the
    /// broker) instead of to `exchange`, and acknowledges the input once the
    /// broker has confirmed it there: from then on the broker holds it, so a
    /// host restart loses nothing. At its due time, within about a second,
    /// the scheduler publishes it to `exchange` with its routing key, body,
    /// content type, headers and envelope (the same id). A time already past
    /// delivers it as soon as possible, still through the scheduler.
    ///
    /// The host refuses it (and `send` fails) unless the consumer's
    /// `[[consumers]]` entry has `publish_delayed = true`, and when it is
    /// further ahead than the host's `[scheduler] max_delay` (30 days unless
    /// configured). The consumer's `publish_to` must list `exchange`, as for
    /// any output.
    ///
    /// ```
    /// # use acemq_guest::prelude::*;
    /// # fn f(due_at_ms: u64) -> Result {
    /// publish("reminders", "invoice.due")
    ///     .text("invoice 42 is due")
    ///     .deliver_at(due_at_ms)
    ///     .send()?;
    /// # accept()
    /// # }
    /// ```
    pub fn deliver_at(mut self, epoch_ms: u64) -> Self {
        self.deliver_at_ms = Some(epoch_ms);
        self
    }

    /// Delivers the message `delay` after now: [`deliver_at`](Self::deliver_at)
    /// the host's [`now_ms`](crate::now_ms) plus `delay` (whole
    /// milliseconds; a sum past `u64::MAX` stays there, which the host
    /// refuses as beyond its `max_delay`). See `deliver_at` for what the
    /// host does and what the consumer needs (`publish_delayed = true`).
    ///
    /// ```
    /// # use acemq_guest::prelude::*;
    /// # fn f() -> Result {
    /// use std::time::Duration;
    ///
    /// publish("reminders", "call.back")
    ///     .text("call the customer back")
    ///     .delay(Duration::from_secs(15 * 60))
    ///     .send()?;
    /// # accept()
    /// # }
    /// ```
    pub fn delay(self, delay: Duration) -> Self {
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        let now = crate::now_ms();
        self.deliver_at(now.saturating_add(delay_ms))
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
            deliver_at_ms: self.deliver_at_ms,
        };
        crate::host::sys::publish(&out).map_err(fail)
    }
}

/// A publish the host refused (exchange not allowed, reserved header,
/// refused envelope field, a delay the consumer may not ask for), or whose body could not be serialized.
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
                .deliver_at(testing::DEFAULT_NOW_MS + 60_000)
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
                deliver_at_ms: Some(testing::DEFAULT_NOW_MS + 60_000),
            }
        );
        assert_eq!(ran.published[0].due_in, Some(Duration::from_secs(60)));
    }

    #[test]
    fn without_a_due_time_the_message_is_published_now() {
        let ran = TestHost::new().run(|| publish("ex", "rk").text("now").send());
        assert!(ran.value.is_ok());
        assert_eq!(ran.published[0].deliver_at_ms, None);
        assert_eq!(ran.published[0].due_in, None);
    }

    #[test]
    fn delay_counts_from_the_hosts_clock() {
        let host = TestHost::new().now_ms(1_000);
        let ran = host.run(|| {
            publish("ex", "rk")
                .text("later")
                .delay(Duration::from_millis(90_500))
                .send()
        });
        assert!(ran.value.is_ok());
        assert_eq!(ran.published[0].deliver_at_ms, Some(91_500));
        assert_eq!(ran.published[0].due_in, Some(Duration::from_millis(90_500)));

        // The last call wins, whichever of the two it is.
        let ran = host.run(|| {
            publish("ex", "rk")
                .delay(Duration::from_secs(5))
                .deliver_at(7_000)
                .send()
        });
        assert_eq!(ran.published[0].deliver_at_ms, Some(7_000));
        let ran = host.run(|| {
            publish("ex", "rk")
                .deliver_at(7_000)
                .delay(Duration::from_secs(5))
                .send()
        });
        assert_eq!(ran.published[0].deliver_at_ms, Some(6_000));
    }

    #[test]
    fn delay_saturates_instead_of_wrapping() {
        // Near the end of u64 milliseconds, a huge delay stops at u64::MAX
        // rather than wrapping round to a time in the past (which would
        // deliver at once); `Duration::MAX` has more milliseconds than u64.
        let host = TestHost::new().now_ms(u64::MAX - 5);
        let ran = host.run(|| publish("ex", "rk").delay(Duration::MAX).send());
        assert!(ran.value.is_ok());
        assert_eq!(ran.published[0].deliver_at_ms, Some(u64::MAX));
        assert_eq!(ran.published[0].due_in, Some(Duration::from_millis(5)));

        // From an ordinary now, the saturated time is beyond any max_delay.
        let ran = TestHost::new().run(|| publish("ex", "rk").delay(Duration::MAX).send());
        let err = ran.value.unwrap_err();
        assert!(err.reason().contains("beyond the longest delay"), "{err}");
        assert!(ran.published.is_empty());
    }

    #[test]
    fn a_due_time_already_past_is_due_at_once() {
        let ran = TestHost::new()
            .now_ms(10_000)
            .run(|| publish("ex", "rk").deliver_at(4_000).send());
        assert!(ran.value.is_ok());
        assert_eq!(ran.published[0].deliver_at_ms, Some(4_000));
        assert_eq!(ran.published[0].due_in, Some(Duration::ZERO));
    }

    #[test]
    fn a_consumer_without_publish_delayed_is_refused_a_delay() {
        let host = TestHost::new().publish_delayed(false);
        let ran = host.run(|| {
            (
                publish("ex", "rk").delay(Duration::from_secs(1)).send(),
                publish("ex", "rk").text("now").send(),
            )
        });
        let (delayed, now) = ran.value;
        assert_eq!(
            delayed.unwrap_err().reason(),
            "delayed publishing (deliver-at-ms) is not allowed for this consumer: \
             set publish_delayed = true in its [[consumers]] entry"
        );
        assert!(now.is_ok(), "publishing now is still allowed");
        assert_eq!(ran.published.len(), 1);
        assert_eq!(ran.published[0].deliver_at_ms, None);
    }

    #[test]
    fn a_delay_beyond_max_delay_is_refused_naming_the_limit() {
        let host = TestHost::new()
            .now_ms(0)
            .max_delay(Duration::from_secs(3600));
        let ran = host.run(|| {
            (
                publish("ex", "rk").deliver_at(3_600_000).send(),
                publish("ex", "rk").deliver_at(3_600_001).send(),
            )
        });
        let (at_the_limit, beyond) = ran.value;
        assert!(at_the_limit.is_ok(), "the limit itself is allowed");
        assert_eq!(
            beyond.unwrap_err().reason(),
            "deliver-at-ms 3600001 is 1h from now, beyond the longest delay \
             this host schedules ([scheduler] max_delay = 1h)"
        );
        assert_eq!(ran.published.len(), 1);

        // The default limit is the host's: 30 days.
        let ran = TestHost::new().run(|| {
            publish("ex", "rk")
                .delay(testing::DEFAULT_MAX_DELAY + Duration::from_secs(1))
                .send()
        });
        assert!(
            ran.value
                .unwrap_err()
                .reason()
                .ends_with("max_delay = 30days)")
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
    fn a_delayed_message_may_not_set_the_schedulers_headers() {
        let ran = TestHost::new().run(|| {
            (
                publish("ex", "rk")
                    .header("x-schedule-exchange", "elsewhere")
                    .delay(Duration::from_secs(1))
                    .send(),
                // Published now, the name is an application header like any.
                publish("ex", "rk")
                    .header("x-schedule-exchange", "elsewhere")
                    .send(),
            )
        });
        let (delayed, now) = ran.value;
        assert_eq!(
            delayed.unwrap_err().reason(),
            "the header 'x-schedule-exchange' is the scheduler's (x-schedule-* headers \
             say where and when a delayed message goes, and the host writes them)"
        );
        assert!(now.is_ok());
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
