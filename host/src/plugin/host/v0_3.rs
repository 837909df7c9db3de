//! Contract 0.3 (`wit/v0.3/plugin.wit`), mapped onto the 0.4 internals, so
//! a plugin built before the host was upgraded loads and runs unchanged.
//!
//! A thin adapter and nothing more: each 0.3 call converts its arguments to
//! 0.4's, calls the 0.4 implementation, and drops from the answer what 0.3
//! does not have. What 0.3 lacks is simply never asked for: it has no
//! `reply`, no `state`, no route on the envelope and no reply address on
//! the delivery; its output's `message-type` is 0.4's
//! `envelope.message-type`, and every other envelope field of its outputs
//! takes the host's default.

use wasmtime::component::Resource;

use super::super::Outcome;
use super::super::bindings::handler_world::acemq::plugin::{host as wit_host, types};
use super::super::bindings::v0_3::handler_world::acemq::plugin::{
    host as old_host, types as old_types,
};
use super::HostState;
use super::message::{Lending, LentMessage};

impl old_types::Host for Lending {}

impl old_types::HostMessage for Lending {
    fn envelope(&mut self, handle: Resource<LentMessage>) -> wasmtime::Result<old_types::Envelope> {
        let e = types::HostMessage::envelope(self, handle)?;
        Ok(old_types::Envelope {
            id: e.id,
            message_type: e.message_type,
            version: e.version,
            correlation_id: e.correlation_id,
            causation_id: e.causation_id,
            attempt: e.attempt,
            first_seen_ms: e.first_seen_ms,
            origin: e.origin,
        })
    }

    fn delivery(&mut self, handle: Resource<LentMessage>) -> wasmtime::Result<old_types::Delivery> {
        let d = types::HostMessage::delivery(self, handle)?;
        Ok(old_types::Delivery {
            queue: d.queue,
            exchange: d.exchange,
            routing_key: d.routing_key,
            redelivered: d.redelivered,
            stream_offset: d.stream_offset,
        })
    }

    fn content_type(&mut self, handle: Resource<LentMessage>) -> wasmtime::Result<Option<String>> {
        types::HostMessage::content_type(self, handle)
    }

    fn headers(&mut self, handle: Resource<LentMessage>) -> wasmtime::Result<old_types::Headers> {
        let headers = types::HostMessage::headers(self, handle)?;
        Ok(headers
            .into_iter()
            .map(|(name, value)| (name, header_to_old(value)))
            .collect())
    }

    fn body(&mut self, handle: Resource<LentMessage>) -> wasmtime::Result<Vec<u8>> {
        types::HostMessage::body(self, handle)
    }

    fn drop(&mut self, handle: Resource<LentMessage>) -> wasmtime::Result<()> {
        types::HostMessage::drop(self, handle)
    }
}

/// `acemq:plugin/host@0.3.0`: 0.4's, less `reply`.
impl old_host::Host for HostState {
    fn log(&mut self, level: old_host::Level, text: String) -> wasmtime::Result<()> {
        wit_host::Host::log(self, level_of(level), text)
    }

    /// 0.3's `publish` answers nothing on success: the id 0.4 returns is
    /// dropped (the output still carries it).
    fn publish(&mut self, msg: old_types::Outgoing) -> wasmtime::Result<Result<(), String>> {
        let sent = wit_host::Host::publish(self, outgoing_of(msg))?;
        Ok(sent.map(|_| ()))
    }

    fn config(&mut self, key: String) -> wasmtime::Result<Option<String>> {
        wit_host::Host::config(self, key)
    }

    fn now_ms(&mut self) -> wasmtime::Result<u64> {
        wit_host::Host::now_ms(self)
    }
}

/// A 0.3 output as 0.4's: its message type is the envelope's, and the
/// rest of the envelope (and the delivery time) is left to the host.
fn outgoing_of(msg: old_types::Outgoing) -> types::Outgoing {
    types::Outgoing {
        exchange: msg.exchange,
        routing_key: msg.routing_key,
        body: msg.body,
        content_type: msg.content_type,
        headers: msg
            .headers
            .into_iter()
            .map(|(name, value)| (name, header_of(value)))
            .collect(),
        envelope: types::EnvelopeFields {
            id: None,
            message_type: msg.message_type,
            version: None,
            correlation_id: None,
            causation_id: None,
        },
        persistent: msg.persistent,
        mandatory: msg.mandatory,
        deliver_at_ms: None,
    }
}

fn level_of(level: old_host::Level) -> wit_host::Level {
    match level {
        old_host::Level::Trace => wit_host::Level::Trace,
        old_host::Level::Debug => wit_host::Level::Debug,
        old_host::Level::Info => wit_host::Level::Info,
        old_host::Level::Warn => wit_host::Level::Warn,
        old_host::Level::Error => wit_host::Level::Error,
    }
}

fn header_of(value: old_types::HeaderValue) -> types::HeaderValue {
    match value {
        old_types::HeaderValue::Text(s) => types::HeaderValue::Text(s),
        old_types::HeaderValue::Int(i) => types::HeaderValue::Int(i),
        old_types::HeaderValue::Float(f) => types::HeaderValue::Float(f),
        old_types::HeaderValue::Boolean(b) => types::HeaderValue::Boolean(b),
        old_types::HeaderValue::Bytes(b) => types::HeaderValue::Bytes(b),
    }
}

fn header_to_old(value: types::HeaderValue) -> old_types::HeaderValue {
    match value {
        types::HeaderValue::Text(s) => old_types::HeaderValue::Text(s),
        types::HeaderValue::Int(i) => old_types::HeaderValue::Int(i),
        types::HeaderValue::Float(f) => old_types::HeaderValue::Float(f),
        types::HeaderValue::Boolean(b) => old_types::HeaderValue::Boolean(b),
        types::HeaderValue::Bytes(b) => old_types::HeaderValue::Bytes(b),
    }
}

/// A 0.3 handler's decision, in the host's terms (the same four as 0.4's).
pub fn outcome_of(outcome: old_types::Outcome) -> Outcome {
    match outcome {
        old_types::Outcome::Accept => Outcome::Accept,
        old_types::Outcome::Retry(reason) => Outcome::Retry(reason),
        old_types::Outcome::Reject(reason) => Outcome::Reject(reason),
        old_types::Outcome::Park(reason) => Outcome::Park(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_0_3_output_keeps_its_message_type_and_leaves_the_rest_to_the_host() {
        let old = old_types::Outgoing {
            exchange: "ex".into(),
            routing_key: "rk".into(),
            body: b"{}".to_vec(),
            content_type: Some("application/json".into()),
            headers: vec![("n".into(), old_types::HeaderValue::Int(7))],
            message_type: Some("order.placed".into()),
            persistent: true,
            mandatory: Some(false),
        };
        let new = outgoing_of(old);
        assert_eq!(new.envelope.message_type.as_deref(), Some("order.placed"));
        assert_eq!(new.envelope.id, None);
        assert_eq!(new.envelope.version, None);
        assert_eq!(new.envelope.correlation_id, None);
        assert_eq!(new.envelope.causation_id, None);
        assert_eq!(new.deliver_at_ms, None);
        assert_eq!(
            (new.exchange.as_str(), new.routing_key.as_str()),
            ("ex", "rk")
        );
        assert!(matches!(new.headers[0].1, types::HeaderValue::Int(7)));
        assert!(new.persistent);
        assert_eq!(new.mandatory, Some(false));
    }
}
