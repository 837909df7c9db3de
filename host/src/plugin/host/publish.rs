//! `publish` of `acemq:plugin/host`: messages a call buffers, checked
//! against the consumer's `publish_to` allowlist, the reserved `x-acemq-*`
//! headers, the envelope fields a plugin may choose and the per-call limits
//! when they are buffered; the host publishes them only if the call accepts.
//!
//! Each output's id is settled here, when it is buffered (the plugin's own,
//! or [`envelope::output_id`] of the input, the plugin version and the
//! output's position), so `publish` can answer it and the host publishes
//! exactly that id.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::super::bindings::handler_world::acemq::plugin::types;
use super::super::{ConsumerContext, Input, Outgoing};
use super::HostInterface;
use super::message::from_wit;
use crate::envelope::{self, ChosenFields, HeaderValue, check_length};

/// What a publish with `deliver-at-ms` answers when its consumer may not
/// publish delayed.
pub const DELAYED_NOT_ALLOWED: &str = "delayed publishing (deliver-at-ms) is not allowed for \
     this consumer: set publish_delayed = true in its [[consumers]] entry";

/// One instance's publishing: what its current call buffered.
pub struct Publishing {
    /// Its `publish_to` and its limits (`max_outputs`, `max_output_bytes`).
    context: Arc<ConsumerContext>,
    /// The plugin version's sha256: part of each output's default id.
    plugin: Arc<str>,
    /// Messages buffered by `publish`, sent only if the handler accepts.
    outputs: Vec<Outgoing>,
    output_bytes: usize,
    /// The ids of the call's outputs: an id is unique among them.
    ids: HashSet<uuid::Uuid>,
    /// The first publish this consumer's `publish_to` refused during the
    /// call, in the host's words: a configuration fault (see
    /// [`CallEnd`](super::CallEnd)).
    refused: Option<String>,
}

impl HostInterface for Publishing {
    fn prepare(context: &Arc<ConsumerContext>, plugin: &Arc<str>) -> Self {
        Self {
            context: context.clone(),
            plugin: plugin.clone(),
            outputs: Vec::new(),
            output_bytes: 0,
            ids: HashSet::new(),
            refused: None,
        }
    }
}

/// A delayed output's headers may not name the scheduler's own: they say
/// where and when it goes, and the host writes them.
fn check_no_schedule_headers(headers: &[(String, HeaderValue)]) -> Result<(), String> {
    match headers
        .iter()
        .find(|(name, _)| name.starts_with(crate::scheduler::header::PREFIX))
    {
        Some((name, _)) => Err(format!(
            "the header '{name}' is the scheduler's (x-schedule-* headers say where and when a delayed message goes, and the host writes them)"
        )),
        None => Ok(()),
    }
}

/// The AMQP short strings of `msg`: lapin cannot even write a longer one.
fn check_lengths(msg: &types::Outgoing) -> Result<(), String> {
    check_length("exchange", &msg.exchange, envelope::MAX_SHORT_STRING)?;
    check_length("routing key", &msg.routing_key, envelope::MAX_SHORT_STRING)?;
    if let Some(content_type) = &msg.content_type {
        check_length("content type", content_type, envelope::MAX_SHORT_STRING)?;
    }
    Ok(())
}

/// The plugin's `envelope-fields`, in the host's terms.
pub fn chosen_fields(fields: types::EnvelopeFields) -> ChosenFields {
    ChosenFields {
        id: fields.id,
        message_type: fields.message_type,
        version: fields.version,
        correlation_id: fields.correlation_id,
        causation_id: fields.causation_id,
    }
}

impl Publishing {
    /// Hands over what the call buffered, and the first publish its
    /// consumer refused; the next call starts empty.
    pub fn take(&mut self) -> (Vec<Outgoing>, Option<String>) {
        self.output_bytes = 0;
        self.ids.clear();
        (std::mem::take(&mut self.outputs), self.refused.take())
    }

    /// Takes `id` for a message of this call that is not an output (its
    /// reply), so that no output may take it after; false when an output
    /// already has it.
    pub fn claim_id(&mut self, id: uuid::Uuid) -> bool {
        self.ids.insert(id)
    }

    /// Buffers `msg`, an output of `input`, or says why not (and buffers
    /// nothing); answers the id and correlation it will carry.
    pub fn buffer(
        &mut self,
        msg: types::Outgoing,
        input: Option<&Input>,
    ) -> Result<types::Sent, String> {
        let Some(input) = input else {
            return Err(
                "publish is only possible while handling a message (not in start-up code)"
                    .to_string(),
            );
        };
        check_lengths(&msg)?;
        self.check_allowed(&msg.exchange)?;
        if let Some(due_at_ms) = msg.deliver_at_ms {
            self.check_delay(due_at_ms)?;
        }
        let chosen = chosen_fields(msg.envelope);
        chosen.check()?;
        let headers: Vec<(String, HeaderValue)> = msg
            .headers
            .into_iter()
            .map(|(k, v)| (k, from_wit(v)))
            .collect();
        envelope::check_plugin_headers(&headers).map_err(|e| e.to_string())?;
        if msg.deliver_at_ms.is_some() {
            check_no_schedule_headers(&headers)?;
        }
        let limits = &self.context.limits;
        if self.outputs.len() >= limits.max_outputs {
            return Err(format!(
                "this message already buffered {} messages, the most one call may publish",
                limits.max_outputs
            ));
        }
        // Headers are bytes published like the body's: counted with it.
        let size = msg.body.len() + envelope::plugin_headers_size(&headers);
        if self.output_bytes + size > limits.max_output_bytes {
            return Err(format!(
                "publishing {size} more bytes (body and headers) would exceed the {} bytes one call may publish",
                limits.max_output_bytes
            ));
        }
        let id = match &chosen.id {
            Some(id) => id.clone(),
            None => envelope::output_id(&input.envelope.id, &self.plugin, self.outputs.len()),
        };
        let uuid = envelope::parse_id(&id)?;
        if self.ids.contains(&uuid) {
            return Err(format!(
                "the id '{id}' is already the id of another message this call publishes: \
                 ids are unique among the messages of one call"
            ));
        }
        self.ids.insert(uuid);
        self.output_bytes += size;
        let sent = types::Sent {
            id: id.clone(),
            correlation_id: chosen
                .correlation_id
                .clone()
                .unwrap_or_else(|| input.envelope.correlation_id.to_string()),
        };
        self.outputs.push(Outgoing {
            exchange: msg.exchange,
            routing_key: msg.routing_key,
            body: msg.body,
            content_type: msg.content_type,
            headers,
            envelope: chosen.with_id(id),
            persistent: msg.persistent,
            mandatory: msg.mandatory,
            deliver_at_ms: msg.deliver_at_ms,
        });
        Ok(sent)
    }

    /// Whether this consumer may publish delayed, and `due_at_ms` is within
    /// its `max_delay` from now.
    fn check_delay(&self, due_at_ms: u64) -> Result<(), String> {
        let Some(max_delay) = self.context.delayed else {
            return Err(DELAYED_NOT_ALLOWED.to_string());
        };
        let ahead = Duration::from_millis(due_at_ms.saturating_sub(envelope::now_ms()));
        if ahead > max_delay {
            return Err(format!(
                "deliver-at-ms {due_at_ms} is {} from now, beyond the longest delay this host schedules ([scheduler] max_delay = {})",
                humantime::format_duration(Duration::from_secs(ahead.as_secs())),
                humantime::format_duration(max_delay)
            ));
        }
        Ok(())
    }

    /// Whether the consumer's `publish_to` lists `exchange`; the first
    /// refusal of a call is kept for the host.
    fn check_allowed(&mut self, exchange: &str) -> Result<(), String> {
        let publish_to = &self.context.publish_to;
        if publish_to.contains(exchange) {
            return Ok(());
        }
        let allowed: Vec<String> = publish_to.iter().map(|e| format!("'{e}'")).collect();
        let refusal = format!(
            "publishing to exchange '{exchange}' is not allowed for this consumer (publish_to = [{}])",
            allowed.join(", ")
        );
        self.refused.get_or_insert_with(|| refusal.clone());
        Err(refusal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::test_input;

    const PLUGIN: &str = "sha-of-the-plugin";
    const ID: &str = "6f1c0c1e-3b5a-4c8e-9d2f-0a1b2c3d4e5f";

    fn publishing() -> Publishing {
        let context = Arc::new(ConsumerContext {
            publish_to: ["out".to_string()].into(),
            ..ConsumerContext::default()
        });
        Publishing::prepare(&context, &Arc::from(PLUGIN))
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

    fn outgoing(envelope: types::EnvelopeFields) -> types::Outgoing {
        types::Outgoing {
            exchange: "out".into(),
            routing_key: "order.billed".into(),
            body: b"{}".to_vec(),
            content_type: None,
            headers: Vec::new(),
            envelope,
            persistent: true,
            mandatory: None,
            deliver_at_ms: None,
        }
    }

    /// The refusal of `msg`, checking that nothing was buffered.
    fn refusal(publishing: &mut Publishing, msg: types::Outgoing, input: &Input) -> String {
        let before = publishing.outputs.len();
        let err = publishing.buffer(msg, Some(input)).unwrap_err();
        assert_eq!(
            publishing.outputs.len(),
            before,
            "a refused publish buffers nothing"
        );
        err
    }

    #[test]
    fn defaults_derive_the_id_and_keep_the_inputs_correlation() {
        let input = test_input();
        let mut p = publishing();
        let first = p.buffer(outgoing(no_fields()), Some(&input)).unwrap();
        let second = p.buffer(outgoing(no_fields()), Some(&input)).unwrap();
        assert_eq!(first.id, envelope::output_id(&input.envelope.id, PLUGIN, 0));
        assert_eq!(
            second.id,
            envelope::output_id(&input.envelope.id, PLUGIN, 1)
        );
        assert_eq!(first.correlation_id, input.envelope.correlation_id);
        let (outputs, _) = p.take();
        assert_eq!(
            outputs[0].envelope,
            envelope::OutputFields::with_id(first.id)
        );
        assert_eq!(outputs[1].envelope.id, second.id);
    }

    #[test]
    fn the_same_input_handled_again_answers_the_same_ids() {
        let input = test_input();
        let ids = || {
            let mut p = publishing();
            (0..3)
                .map(|_| p.buffer(outgoing(no_fields()), Some(&input)).unwrap().id)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(), ids());
    }

    #[test]
    fn chosen_fields_are_answered_and_buffered() {
        let input = test_input();
        let mut p = publishing();
        let fields = types::EnvelopeFields {
            id: Some(ID.into()),
            message_type: Some("invoice.raised".into()),
            version: Some(2),
            correlation_id: Some("conversation-9".into()),
            causation_id: Some("cause-7".into()),
        };
        let sent = p.buffer(outgoing(fields), Some(&input)).unwrap();
        assert_eq!(
            (sent.id.as_str(), sent.correlation_id.as_str()),
            (ID, "conversation-9")
        );
        let (outputs, _) = p.take();
        assert_eq!(
            outputs[0].envelope,
            envelope::OutputFields {
                id: ID.into(),
                message_type: Some("invoice.raised".into()),
                version: Some(2),
                correlation_id: Some("conversation-9".into()),
                causation_id: Some("cause-7".into()),
            }
        );
    }

    #[test]
    fn an_id_is_a_uuid_unique_among_the_ids_of_one_call() {
        let input = test_input();
        let mut p = publishing();
        let with_id = |id: &str| {
            outgoing(types::EnvelopeFields {
                id: Some(id.into()),
                ..no_fields()
            })
        };
        let err = refusal(&mut p, with_id("order-1"), &input);
        assert!(err.starts_with("the id 'order-1' is not a UUID"), "{err}");
        p.buffer(with_id(ID), Some(&input)).unwrap();
        let err = refusal(&mut p, with_id(&ID.to_uppercase()), &input);
        assert!(
            err.contains("is already the id of another message this call publishes"),
            "{err}"
        );
        // The id the host would derive for the next output is taken too.
        let derived = envelope::output_id(&input.envelope.id, PLUGIN, 1);
        p.buffer(outgoing(no_fields()), Some(&input)).unwrap();
        let err = refusal(&mut p, with_id(&derived), &input);
        assert!(err.contains("is already the id"), "{err}");
        // The next call starts with no ids taken.
        let _ = p.take();
        p.buffer(with_id(ID), Some(&input)).unwrap();
    }

    #[test]
    fn each_refused_field_is_named() {
        let input = test_input();
        let mut p = publishing();
        let cases = [
            (
                types::EnvelopeFields {
                    version: Some(0),
                    ..no_fields()
                },
                "the version 0 is not allowed",
            ),
            (
                types::EnvelopeFields {
                    correlation_id: Some(String::new()),
                    ..no_fields()
                },
                "the correlation id is empty",
            ),
            (
                types::EnvelopeFields {
                    causation_id: Some("c".repeat(256)),
                    ..no_fields()
                },
                "is 256 bytes long; at most 255 are allowed",
            ),
            (
                types::EnvelopeFields {
                    message_type: Some("t".repeat(256)),
                    ..no_fields()
                },
                "the message type 'ttt",
            ),
        ];
        for (fields, expected) in cases {
            let err = refusal(&mut p, outgoing(fields), &input);
            assert!(err.contains(expected), "{err}");
        }
    }

    fn delayed(due_at_ms: u64) -> types::Outgoing {
        types::Outgoing {
            deliver_at_ms: Some(due_at_ms),
            ..outgoing(no_fields())
        }
    }

    #[test]
    fn delayed_publishing_needs_publish_delayed() {
        let input = test_input();
        let mut p = publishing();
        let due = envelope::now_ms() + 60_000;
        assert_eq!(refusal(&mut p, delayed(due), &input), DELAYED_NOT_ALLOWED);
        assert!(DELAYED_NOT_ALLOWED.contains("publish_delayed = true"));
    }

    fn publishing_delayed(max_delay: Duration) -> Publishing {
        let context = Arc::new(ConsumerContext {
            publish_to: ["out".to_string()].into(),
            delayed: Some(max_delay),
            state: None,
            ..ConsumerContext::default()
        });
        Publishing::prepare(&context, &Arc::from(PLUGIN))
    }

    #[test]
    fn a_delayed_output_keeps_its_due_time_within_max_delay() {
        let input = test_input();
        let mut p = publishing_delayed(Duration::from_secs(3600));
        let due = envelope::now_ms() + 600_000;
        p.buffer(delayed(due), Some(&input)).unwrap();
        // Overdue already: delivered as soon as possible.
        p.buffer(delayed(1), Some(&input)).unwrap();
        let (outputs, refused) = p.take();
        assert_eq!(refused, None);
        let due_times: Vec<_> = outputs.iter().map(|o| o.deliver_at_ms).collect();
        assert_eq!(due_times, [Some(due), Some(1)]);
    }

    #[test]
    fn a_delay_beyond_max_delay_is_refused_naming_the_limit() {
        let input = test_input();
        let mut p = publishing_delayed(Duration::from_secs(3600));
        let due = envelope::now_ms() + 2 * 3_600_000 + 500;
        let err = refusal(&mut p, delayed(due), &input);
        assert!(
            err.starts_with(&format!("deliver-at-ms {due} is 2h from now")),
            "{err}"
        );
        assert!(
            err.ends_with(
                "beyond the longest delay this host schedules ([scheduler] max_delay = 1h)"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_delayed_output_may_not_write_the_schedulers_headers() {
        let input = test_input();
        let mut p = publishing_delayed(Duration::from_secs(3600));
        let msg = types::Outgoing {
            headers: vec![(
                "x-schedule-exchange".into(),
                types::HeaderValue::Text("elsewhere".into()),
            )],
            ..delayed(envelope::now_ms() + 5_000)
        };
        let err = refusal(&mut p, msg, &input);
        assert!(
            err.starts_with("the header 'x-schedule-exchange' is the scheduler's"),
            "{err}"
        );
    }

    #[test]
    fn reserved_headers_and_other_exchanges_are_still_refused() {
        let input = test_input();
        let mut p = publishing();
        let msg = types::Outgoing {
            headers: vec![("x-acemq-attempt".into(), types::HeaderValue::Int(9))],
            ..outgoing(no_fields())
        };
        let err = refusal(&mut p, msg, &input);
        assert!(err.contains("reserved 'x-acemq-' namespace"), "{err}");
        let msg = types::Outgoing {
            exchange: "elsewhere".into(),
            ..outgoing(no_fields())
        };
        let err = refusal(&mut p, msg, &input);
        assert!(err.contains("'elsewhere' is not allowed"), "{err}");
    }

    #[test]
    fn outside_a_call_nothing_is_buffered() {
        let mut p = publishing();
        let err = p.buffer(outgoing(no_fields()), None).unwrap_err();
        assert!(
            err.starts_with("publish is only possible while handling a message"),
            "{err}"
        );
    }
}
