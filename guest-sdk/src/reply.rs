//! Answering the request being handled.

use core::fmt;

use crate::bindings::wit_types::OutgoingReply;
use crate::outcome::Outcome;
use crate::outgoing::{Parts, shared_builder_methods};
use crate::publish::Sent;

/// Starts the answer to the request being handled; finish it with
/// [`send`](Reply::send).
///
/// A request names its reply queue in the `acemq-reply-to` header and the
/// AMQP `reply-to` property ([`Message::reply_to`](crate::Message::reply_to)
/// reads them as the host does). Like an output, the reply is buffered and
/// sent only when the handler accepts: through the default exchange to the
/// reply queue, with the request's correlation (`x-acemq-correlation`, how
/// AceMQ callers pair it; a plain AMQP client's `correlation-id` property
/// is echoed too) and causation = the request's id, not mandatory (a reply
/// queue that is gone means the caller has gone). One reply per call.
///
/// A request that is not accepted gets no reply from the handler: when the
/// handler rejects it (or it fails for good after its retries), the host
/// answers the caller itself with the header `acemq-error:
/// "{ErrType}: {message}"`. A message with no reply address that the
/// handler replies to and accepts is rejected by the host, naming both
/// addresses it looked for.
///
/// ```
/// # use acemq_guest::prelude::*;
/// # fn f(msg: Message) -> Result {
/// let name = msg.text()?;
/// let sent = reply()
///     .json(&json!({ "greeting": format!("hello, {name}") }))
///     .message_type("greeting.reply")
///     .send()?; // refused by the host: ends the handler with `retry`
/// acemq_guest::info!("answered {} with {}", msg.envelope().id, sent.id);
/// accept()
/// # }
/// ```
pub fn reply() -> Reply {
    Reply {
        parts: Parts::default(),
    }
}

/// A reply being built by [`reply`]. Defaults: empty body, no content type
/// (the host then uses `application/json`), no headers; envelope: an id
/// derived by the host, message type `reply`, version 1, and always the
/// request's correlation, with causation = the request's id.
#[must_use = "nothing is sent until `.send()` is called"]
#[derive(Clone, Debug)]
pub struct Reply {
    parts: Parts,
}

impl Reply {
    shared_builder_methods!("`reply`");

    /// Hands the reply to the host's buffer (see [`reply`] for when it is
    /// really sent) and returns the id and correlation it will carry. The
    /// error converts into [`Outcome::Retry`], so `?` ends the handler with
    /// a retry that gives the host's reason.
    pub fn send(self) -> Result<Sent, ReplyError> {
        let fail = |problem: String| ReplyError { problem };
        if let Some(problem) = self.parts.encode_error {
            return Err(fail(problem));
        }
        let out = OutgoingReply {
            body: self.parts.body,
            content_type: self.parts.content_type,
            headers: self.parts.headers,
            envelope: self.parts.envelope,
        };
        crate::host::sys::reply(&out).map_err(fail)
    }
}

/// A reply the host refused (a second reply in one call, a reserved header,
/// a refused envelope field), or whose body could not be serialized.
/// Nothing was buffered.
///
/// Converts into [`Outcome::Retry`], as a refused
/// [`PublishError`](crate::PublishError) does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplyError {
    problem: String,
}

impl ReplyError {
    /// What went wrong: the host's message, or the serializer's.
    pub fn reason(&self) -> &str {
        &self.problem
    }
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reply failed: {}", self.problem)
    }
}

impl std::error::Error for ReplyError {}

impl From<ReplyError> for Outcome {
    fn from(e: ReplyError) -> Self {
        Outcome::Retry(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{self, EnvelopeFields, TestHost};
    use crate::{Handler, HeaderValue, Message, Result, accept, publish};

    /// Answers with the body in capitals; `twice` replies twice.
    struct Shout;
    impl Handler for Shout {
        fn handle(msg: Message) -> Result {
            let text = msg.text()?;
            let sent = reply()
                .text(text.to_uppercase())
                .header("tone", "loud")
                .message_type("shout.reply")
                .version(2)
                .send()?;
            crate::info!("replied {}", sent.id);
            if text == "twice" {
                reply().text("again").send()?;
            }
            accept()
        }
    }

    #[test]
    fn a_request_gets_the_reply_the_handler_buffered() {
        let mut request = testing::request("hi", "caller.replies");
        request.envelope_mut().correlation_id = "conversation-3".into();
        let done = TestHost::new().handle::<Shout>(request);
        assert_eq!(done.outcome, Outcome::Accept);
        let replied = done.reply.expect("a reply");
        assert_eq!(replied.to.as_deref(), Some("caller.replies"));
        assert_eq!(replied.body, b"HI");
        assert_eq!(
            replied.content_type.as_deref(),
            Some("text/plain; charset=utf-8")
        );
        assert_eq!(
            replied.headers,
            [("tone".into(), HeaderValue::Text("loud".into()))]
        );
        assert_eq!(
            replied.envelope,
            EnvelopeFields {
                message_type: Some("shout.reply".into()),
                version: Some(2),
                ..EnvelopeFields::default()
            }
        );
        assert_eq!(replied.sent.correlation_id, "conversation-3");
        assert_eq!(done.logs[0].1, format!("replied {}", replied.sent.id));
        assert!(done.published.is_empty(), "a reply is not an output");
    }

    #[test]
    fn the_reply_queue_falls_back_to_the_property_and_may_be_missing() {
        let mut plain_amqp = testing::message("hi");
        plain_amqp.delivery_mut().reply_to = Some("amq.gen-1".into());
        let done = TestHost::new().handle::<Shout>(plain_amqp);
        assert_eq!(done.reply.unwrap().to.as_deref(), Some("amq.gen-1"));

        // The host would reject this one when the handler accepts.
        let done = TestHost::new().handle::<Shout>(testing::message("hi"));
        assert_eq!(done.reply.unwrap().to, None);
    }

    #[test]
    fn one_reply_per_call() {
        let done = TestHost::new().handle::<Shout>(testing::request("twice", "q"));
        let reason = done.outcome.reason().unwrap().to_owned();
        assert!(
            reason.starts_with("reply failed: ") && reason.contains("already"),
            "{reason}"
        );
        assert_eq!(done.reply.unwrap().body, b"TWICE", "the first one stays");
    }

    #[test]
    fn reply_and_outputs_share_the_calls_ids() {
        let id = "0190b3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d";
        let ran = TestHost::new().run(|| {
            publish("ex", "rk").id(id).send().unwrap();
            reply().id(id).send()
        });
        assert!(ran.value.unwrap_err().reason().contains("already the id"));
        assert!(ran.reply.is_none());
    }
}
