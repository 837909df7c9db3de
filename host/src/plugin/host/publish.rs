//! `publish` of `acemq:plugin/host`: messages a call buffers, checked
//! against the consumer's `publish_to` allowlist, the reserved `x-acemq-*`
//! headers and the per-call limits when they are buffered; the host
//! publishes them only if the call accepts.

use std::sync::Arc;

use super::super::bindings::handler_world::acemq::plugin::types;
use super::super::{ConsumerContext, Input, Outgoing};
use super::HostInterface;
use super::message::from_wit;
use crate::envelope::{self, HeaderValue};

/// Most bytes of an output's message type (`x-acemq-type`). Not an AMQP
/// short string, but a type name, and the same bound keeps it one.
pub const MAX_MESSAGE_TYPE_BYTES: usize = envelope::MAX_SHORT_STRING;

/// One instance's publishing: what its current call buffered.
pub struct Publishing {
    /// Its `publish_to` and its limits (`max_outputs`, `max_output_bytes`).
    context: Arc<ConsumerContext>,
    /// The plugin version's sha256: part of each output's default id.
    plugin: Arc<str>,
    /// Messages buffered by `publish`, sent only if the handler accepts.
    outputs: Vec<Outgoing>,
    output_bytes: usize,
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
            refused: None,
        }
    }
}

/// `value` when it is at most `max` bytes; otherwise the plugin's refusal,
/// naming `what` was too long.
fn check_length(what: &str, value: &str, max: usize) -> Result<(), String> {
    if value.len() <= max {
        return Ok(());
    }
    Err(format!(
        "the {what} '{}' is {} bytes long; at most {max} are allowed",
        envelope::preview(value),
        value.len()
    ))
}

/// The AMQP short strings of `msg`: lapin cannot even write a longer one.
fn check_lengths(msg: &types::Outgoing) -> Result<(), String> {
    check_length("exchange", &msg.exchange, envelope::MAX_SHORT_STRING)?;
    check_length("routing key", &msg.routing_key, envelope::MAX_SHORT_STRING)?;
    if let Some(content_type) = &msg.content_type {
        check_length("content type", content_type, envelope::MAX_SHORT_STRING)?;
    }
    if let Some(message_type) = &msg.envelope.message_type {
        check_length("message type", message_type, MAX_MESSAGE_TYPE_BYTES)?;
    }
    Ok(())
}

impl Publishing {
    /// Hands over what the call buffered, and the first publish its
    /// consumer refused; the next call starts empty.
    pub fn take(&mut self) -> (Vec<Outgoing>, Option<String>) {
        self.output_bytes = 0;
        (std::mem::take(&mut self.outputs), self.refused.take())
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
        let headers: Vec<(String, HeaderValue)> = msg
            .headers
            .into_iter()
            .map(|(k, v)| (k, from_wit(v)))
            .collect();
        envelope::check_plugin_headers(&headers).map_err(|e| e.to_string())?;
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
        self.output_bytes += size;
        let sent = types::Sent {
            id: envelope::output_id(&input.envelope.id, &self.plugin, self.outputs.len()),
            correlation_id: input.envelope.correlation_id.clone(),
        };
        self.outputs.push(Outgoing {
            exchange: msg.exchange,
            routing_key: msg.routing_key,
            body: msg.body,
            content_type: msg.content_type,
            headers,
            message_type: msg.envelope.message_type,
            persistent: msg.persistent,
            mandatory: msg.mandatory,
        });
        Ok(sent)
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
