//! `reply` of `acemq:plugin/host`: the answer to the request being handled,
//! buffered like an output and sent only if the call accepts
//! (`delivery/flow.rs` publishes it).
//!
//! Checked when it is buffered, so the plugin hears at once what is wrong:
//! at most one per call (a requester waits for one answer; a second would
//! reach a caller that has stopped listening, or be taken for the answer
//! to its next request), its envelope fields as an output's are, and the
//! correlation and causation refused, because a reply always carries the
//! request's (the pairing the requester waits on). A reply is buffered even
//! when the request names no reply queue: the host rejects such a request
//! when the handler accepts, naming both places it looked
//! ([`envelope::NO_REPLY_ADDRESS`]), which tells the requester's author
//! more than a refusal inside the plugin would.

use std::sync::Arc;

use super::super::bindings::handler_world::acemq::plugin::types;
use super::super::{ConsumerContext, Input};
use super::HostInterface;
use super::message::from_wit;
use super::publish::{Publishing, chosen_fields};
use crate::envelope::{self, HeaderValue, Reply, check_length};

/// One instance's replying: what its current call buffered.
pub struct Replying {
    /// Its limits (`max_output_bytes` bounds a reply as it does outputs).
    context: Arc<ConsumerContext>,
    /// The plugin version's sha256: part of the reply's default id.
    plugin: Arc<str>,
    /// The reply of the current call.
    reply: Option<Reply>,
}

impl HostInterface for Replying {
    fn prepare(context: &Arc<ConsumerContext>, plugin: &Arc<str>) -> Self {
        Self {
            context: context.clone(),
            plugin: plugin.clone(),
            reply: None,
        }
    }
}

impl Replying {
    /// Hands over the reply the call buffered; the next call starts without.
    pub fn take(&mut self) -> Option<Reply> {
        self.reply.take()
    }

    /// Buffers the reply to `input`, or says why not (and buffers nothing);
    /// answers the id and correlation it will carry. Its id is one of the
    /// call's, so `publishing` (the call's outputs) is told of it: an id is
    /// unique among all the messages of one call.
    pub fn buffer(
        &mut self,
        msg: types::OutgoingReply,
        input: Option<&Input>,
        publishing: &mut Publishing,
    ) -> Result<types::Sent, String> {
        let Some(input) = input else {
            return Err(
                "reply is only possible while handling a message (not in start-up code)"
                    .to_string(),
            );
        };
        if self.reply.is_some() {
            return Err(
                "this call already replied: a request gets one answer (publish anything else)"
                    .to_string(),
            );
        }
        let chosen = chosen_fields(msg.envelope);
        if chosen.correlation_id.is_some() {
            return Err(
                "a reply carries the request's correlation; correlation-id cannot be \
                 set on a reply"
                    .to_string(),
            );
        }
        if chosen.causation_id.is_some() {
            return Err(
                "a reply names the request as its causation; causation-id cannot be \
                 set on a reply"
                    .to_string(),
            );
        }
        chosen.check()?;
        if let Some(content_type) = &msg.content_type {
            check_length("content type", content_type, envelope::MAX_SHORT_STRING)?;
        }
        let headers: Vec<(String, HeaderValue)> = msg
            .headers
            .into_iter()
            .map(|(k, v)| (k, from_wit(v)))
            .collect();
        envelope::check_plugin_headers(&headers).map_err(|e| e.to_string())?;
        let size = msg.body.len() + envelope::plugin_headers_size(&headers);
        let limit = self.context.limits.max_output_bytes;
        if size > limit {
            return Err(format!(
                "a reply of {size} bytes (body and headers) exceeds the {limit} bytes one call may publish"
            ));
        }
        let id = chosen
            .id
            .clone()
            .unwrap_or_else(|| envelope::reply_id(&input.envelope.id, &self.plugin));
        if !publishing.claim_id(envelope::parse_id(&id)?) {
            return Err(format!(
                "the id '{id}' is already the id of another message this call publishes: \
                 ids are unique among the messages of one call"
            ));
        }
        self.reply = Some(Reply {
            body: msg.body,
            content_type: msg.content_type,
            headers,
            id: Some(id.clone()),
            message_type: chosen.message_type,
            version: chosen.version,
        });
        Ok(types::Sent {
            id,
            correlation_id: input.envelope.correlation_id.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::test_input;

    fn context() -> Arc<ConsumerContext> {
        Arc::new(ConsumerContext {
            queue: "requests".into(),
            config: Default::default(),
            publish_to: ["out".to_string()].into(),
            delayed: None,
            state: None,
            limits: Default::default(),
        })
    }

    fn replying() -> Replying {
        Replying::prepare(&context(), &Arc::from("sha-1"))
    }

    fn publishing() -> Publishing {
        Publishing::prepare(&context(), &Arc::from("sha-1"))
    }

    fn reply(envelope: types::EnvelopeFields) -> types::OutgoingReply {
        types::OutgoingReply {
            body: b"{}".to_vec(),
            content_type: None,
            headers: vec![],
            envelope,
        }
    }

    fn no_fields() -> types::EnvelopeFields {
        types::EnvelopeFields {
            id: None,
            message_type: None,
            version: None,
            correlation_id: None,
            causation_id: None,
        }
    }

    #[test]
    fn one_reply_per_call_with_a_derived_id_and_the_requests_correlation() {
        let input = test_input();
        let mut state = replying();
        let sent = state
            .buffer(reply(no_fields()), Some(&input), &mut publishing())
            .unwrap();
        assert_eq!(sent.id, envelope::reply_id(&input.envelope.id, "sha-1"));
        assert_eq!(sent.correlation_id, input.envelope.correlation_id);
        let second = state
            .buffer(reply(no_fields()), Some(&input), &mut publishing())
            .unwrap_err();
        assert!(second.contains("already replied"), "{second}");
        let taken = state.take().unwrap();
        assert_eq!(taken.id.as_deref(), Some(sent.id.as_str()));
        assert_eq!(state.take(), None, "the next call starts without");
    }

    #[test]
    fn the_pairing_fields_are_refused_and_the_others_checked() {
        let input = test_input();
        let refused = [
            (
                types::EnvelopeFields {
                    correlation_id: Some("c".into()),
                    ..no_fields()
                },
                "correlation-id cannot be set on a reply",
            ),
            (
                types::EnvelopeFields {
                    causation_id: Some("c".into()),
                    ..no_fields()
                },
                "causation-id cannot be set on a reply",
            ),
            (
                types::EnvelopeFields {
                    id: Some("not-a-uuid".into()),
                    ..no_fields()
                },
                "the id 'not-a-uuid' is not a UUID",
            ),
            (
                types::EnvelopeFields {
                    version: Some(0),
                    ..no_fields()
                },
                "versions start at 1",
            ),
            (
                types::EnvelopeFields {
                    message_type: Some("t".repeat(256)),
                    ..no_fields()
                },
                "at most 255 are allowed",
            ),
        ];
        for (fields, expected) in refused {
            let mut state = replying();
            let error = state
                .buffer(reply(fields), Some(&input), &mut publishing())
                .unwrap_err();
            assert!(error.contains(expected), "{error}");
            assert_eq!(state.take(), None, "nothing buffered");
        }
        let mut state = replying();
        let mut reserved = reply(no_fields());
        reserved.headers = vec![("x-acemq-id".into(), types::HeaderValue::Text("x".into()))];
        assert!(
            state
                .buffer(reserved, Some(&input), &mut publishing())
                .is_err()
        );

        let chosen = "0b0e5f0c-8a1d-4c1e-9d4a-1f2e3d4c5b6a";
        let fields = types::EnvelopeFields {
            id: Some(chosen.into()),
            message_type: Some("echo.reply".into()),
            version: Some(2),
            ..no_fields()
        };
        let sent = state
            .buffer(reply(fields), Some(&input), &mut publishing())
            .unwrap();
        assert_eq!(sent.id, chosen);
        let taken = state.take().unwrap();
        assert_eq!(
            (taken.message_type.as_deref(), taken.version),
            (Some("echo.reply"), Some(2))
        );
    }

    #[test]
    fn a_reply_outside_a_call_is_refused() {
        let error = replying()
            .buffer(reply(no_fields()), None, &mut publishing())
            .unwrap_err();
        assert!(error.contains("only possible while handling a message"));
    }

    #[test]
    fn the_reply_id_is_unique_among_the_calls_messages_both_ways() {
        let input = test_input();
        let chosen = "0b0e5f0c-8a1d-4c1e-9d4a-1f2e3d4c5b6a";
        let output = |id: &str| types::Outgoing {
            exchange: "out".into(),
            routing_key: "k".into(),
            body: b"{}".to_vec(),
            content_type: None,
            headers: Vec::new(),
            envelope: types::EnvelopeFields {
                id: Some(id.into()),
                ..no_fields()
            },
            persistent: true,
            mandatory: None,
            deliver_at_ms: None,
        };
        let with_id = || {
            reply(types::EnvelopeFields {
                id: Some(chosen.into()),
                ..no_fields()
            })
        };
        // An output took it first: the reply is refused.
        let mut outputs = publishing();
        outputs.buffer(output(chosen), Some(&input)).unwrap();
        let error = replying()
            .buffer(with_id(), Some(&input), &mut outputs)
            .unwrap_err();
        assert!(
            error.contains("already the id of another message"),
            "{error}"
        );
        // The reply took it first: the output is refused.
        let mut outputs = publishing();
        replying()
            .buffer(with_id(), Some(&input), &mut outputs)
            .unwrap();
        assert!(outputs.buffer(output(chosen), Some(&input)).is_err());
    }
}
