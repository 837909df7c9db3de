//! The request/reply example: a service that answers each request with
//! the JSON `{"echo": "<the request body as text>"}`, message type
//! `echo.reply`.
//!
//! The host does the wire work: it sends the reply when the handler
//! accepts, to the request's reply queue (`acemq-reply-to`, else the
//! `reply-to` property) through the default exchange, paired on the
//! request's correlation with causation = the request's id. A request
//! whose body is `fail` (or is not UTF-8 text) is rejected: the host sets
//! it aside and answers the caller with the header `acemq-error`.

use acemq_guest::prelude::*;

/// The message type of every answer.
const REPLY_TYPE: &str = "echo.reply";

struct Responder;

impl Handler for Responder {
    fn handle(msg: Message) -> Result {
        let text = msg.text()?;
        if text.trim() == "fail" {
            return reject("the request asked to fail (body `fail`)");
        }
        let sent = reply()
            .json(&json!({ "echo": text }))
            .message_type(REPLY_TYPE)
            .send()?;
        info!("answered {} with {}", msg.envelope().id, sent.id);
        accept()
    }
}

acemq_guest::export_handler!(Responder);

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_guest::testing::{self, TestHost};

    #[test]
    fn answers_with_the_body_echoed_as_json() {
        let mut request = testing::request("hello", "caller.replies");
        request.envelope_mut().correlation_id = "call-1".into();
        let done = TestHost::new().handle::<Responder>(request);
        assert_eq!(done.outcome, Outcome::Accept);
        let answer = done.reply.expect("a reply");
        assert_eq!(answer.to.as_deref(), Some("caller.replies"));
        assert_eq!(answer.body, br#"{"echo":"hello"}"#);
        assert_eq!(answer.content_type.as_deref(), Some("application/json"));
        assert_eq!(answer.envelope.message_type.as_deref(), Some("echo.reply"));
        assert_eq!(answer.sent.correlation_id, "call-1");
        assert_eq!(
            done.logs[0].1,
            format!("answered test-message-1 with {}", answer.sent.id)
        );
        assert!(done.published.is_empty());
    }

    #[test]
    fn answers_a_plain_amqp_client_through_the_property() {
        let mut request = testing::message("ping");
        request.delivery_mut().reply_to = Some("amq.gen-abc".into());
        request.delivery_mut().amqp_correlation_id = Some("rpc-7".into());
        let done = TestHost::new().handle::<Responder>(request);
        assert_eq!(done.outcome, Outcome::Accept);
        assert_eq!(done.reply.unwrap().to.as_deref(), Some("amq.gen-abc"));
    }

    #[test]
    fn rejects_fail_without_replying() {
        let done = TestHost::new().handle::<Responder>(testing::request("fail", "q"));
        assert_eq!(
            done.outcome,
            Outcome::Reject("the request asked to fail (body `fail`)".into())
        );
        assert!(done.reply.is_none(), "the host answers with acemq-error");
    }

    #[test]
    fn rejects_a_body_that_is_not_text() {
        let done = TestHost::new().handle::<Responder>(testing::request(vec![0xff], "q"));
        assert!(matches!(done.outcome, Outcome::Reject(_)));
        assert!(done.reply.is_none());
    }
}
