//! Publishes what its input asks for, with the envelope fields it chooses:
//! the test plugin of envelope control (contract §4).
//!
//! - Body `{ "outputs": [ { "id"?, "message_type"?, "version"?,
//!   "correlation_id"?, "causation_id"?, "routing_key"? }, ... ] }`: one
//!   output per entry, to the exchange in config key `exchange` (default
//!   `envelope.out`), with routing key `routing_key` (default: config key
//!   `routing_key`, else `envelope.output`) and body `{ "n": position }`;
//!   each field given is set on the output's envelope, each one left out
//!   takes the host's default.
//! - Not that JSON: reject.
//! - A field the host refuses: reject, with the host's reason (so a test
//!   reads the refusal off the dead-letter copy).
//!
//! Logs `sent <position> id=<id> correlation=<correlation>` for each
//! output: the fields the host answered.

use acemq_guest::Publish;
use acemq_guest::prelude::*;
use serde::Deserialize;

const EXCHANGE_KEY: &str = "exchange";
const ROUTING_KEY_KEY: &str = "routing_key";
const DEFAULT_EXCHANGE: &str = "envelope.out";
const DEFAULT_ROUTING_KEY: &str = "envelope.output";

/// What the input asks for.
#[derive(Deserialize)]
struct Instructions {
    outputs: Vec<Fields>,
}

/// One output's envelope fields; absent ones are the host's default.
#[derive(Deserialize, Default)]
struct Fields {
    id: Option<String>,
    message_type: Option<String>,
    version: Option<u32>,
    correlation_id: Option<String>,
    causation_id: Option<String>,
    routing_key: Option<String>,
}

struct EnvelopeFields;

impl Handler for EnvelopeFields {
    fn handle(msg: Message) -> Result {
        let instructions: Instructions = msg.json()?;
        let exchange = config(EXCHANGE_KEY).unwrap_or_else(|| DEFAULT_EXCHANGE.into());
        let default_key = config(ROUTING_KEY_KEY).unwrap_or_else(|| DEFAULT_ROUTING_KEY.into());
        for (position, fields) in instructions.outputs.into_iter().enumerate() {
            let routing_key = fields
                .routing_key
                .clone()
                .unwrap_or_else(|| default_key.clone());
            let sent = match output(&exchange, &routing_key, position, fields).send() {
                Ok(sent) => sent,
                Err(refused) => return reject(refused.reason()),
            };
            info!(
                "sent {position} id={} correlation={}",
                sent.id, sent.correlation_id
            );
        }
        accept()
    }
}

/// Output `position`, with the envelope fields `fields` chooses.
fn output(exchange: &str, routing_key: &str, position: usize, fields: Fields) -> Publish {
    let mut out = publish(exchange, routing_key).json(&json!({ "n": position }));
    if let Some(id) = fields.id {
        out = out.id(id);
    }
    if let Some(message_type) = fields.message_type {
        out = out.message_type(message_type);
    }
    if let Some(version) = fields.version {
        out = out.version(version);
    }
    if let Some(correlation_id) = fields.correlation_id {
        out = out.correlation_id(correlation_id);
    }
    if let Some(causation_id) = fields.causation_id {
        out = out.causation_id(causation_id);
    }
    out
}

acemq_guest::export_handler!(EnvelopeFields);

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_guest::testing::{self, TestHost};

    fn host() -> TestHost {
        TestHost::new().publish_to([DEFAULT_EXCHANGE])
    }

    #[test]
    fn publishes_each_listed_output_with_the_fields_it_chooses() {
        let body = br#"{"outputs":[
            {"id":"6f1c0c1e-3b5a-4c8e-9d2f-0a1b2c3d4e5f","message_type":"invoice.raised",
             "version":3,"correlation_id":"conv-1","causation_id":"cause-1"},
            {"routing_key":"other"}
        ]}"#;
        let done = host().handle::<EnvelopeFields>(testing::message(body.to_vec()));
        assert_eq!(done.outcome, Outcome::Accept);
        assert_eq!(done.published.len(), 2);
        let first = &done.published[0];
        assert_eq!(
            first.envelope.id.as_deref(),
            Some("6f1c0c1e-3b5a-4c8e-9d2f-0a1b2c3d4e5f")
        );
        assert_eq!(
            first.envelope.message_type.as_deref(),
            Some("invoice.raised")
        );
        assert_eq!(first.envelope.version, Some(3));
        assert_eq!(first.envelope.correlation_id.as_deref(), Some("conv-1"));
        assert_eq!(first.envelope.causation_id.as_deref(), Some("cause-1"));
        let second = &done.published[1];
        assert_eq!(second.routing_key, "other");
        assert_eq!(second.envelope.id, None);
    }

    #[test]
    fn a_refused_field_rejects_with_the_hosts_reason() {
        let body = br#"{"outputs":[{"version":0}]}"#;
        let done = host().handle::<EnvelopeFields>(testing::message(body.to_vec()));
        assert!(
            matches!(done.outcome, Outcome::Reject(_)),
            "{:?}",
            done.outcome
        );
    }
}
