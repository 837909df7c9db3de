//! `resource message` of `acemq:plugin/types`: the message lent to the
//! current call, copied into the plugin's memory one part at a time.

use std::sync::Arc;

use wasmtime::component::{HasData, Resource};

use super::super::bindings::handler_world::acemq::plugin::types;
use super::super::{ConsumerContext, Input};
use super::HostInterface;
use crate::envelope::HeaderValue;

/// The handle a plugin holds on the message of its current call
/// (`resource message` in the WIT). The message itself stays in
/// [`Lending::message`]; the handle's number names the call it was lent
/// for, so a handle kept past its call is caught, never read as the next
/// message.
pub struct LentMessage;

/// One instance's lending: the message of its current call, if any, and
/// which call that is.
pub struct Lending {
    context: Arc<ConsumerContext>,
    /// The message being handled; `None` between calls.
    message: Option<Input>,
    /// Counts this instance's calls; the message handle carries it.
    number: u32,
}

impl HostInterface for Lending {
    fn prepare(context: &Arc<ConsumerContext>, _plugin: &Arc<str>) -> Self {
        Self {
            context: context.clone(),
            message: None,
            number: 0,
        }
    }
}

/// Links `acemq:plugin/types` with the message resource on [`Lending`]
/// alone: reading a message needs nothing else of the instance.
pub struct MessageInterface;

impl HasData for MessageInterface {
    type Data<'a> = &'a mut Lending;
}

impl Lending {
    /// Lends `message` to a new call; returns the handle that names it.
    pub fn lend(&mut self, message: Input) -> Resource<LentMessage> {
        self.number = self.number.wrapping_add(1);
        self.message = Some(message);
        Resource::new_own(self.number)
    }

    /// Ends the lending: a handle kept from now on traps.
    pub fn take_back(&mut self) {
        self.message = None;
    }

    /// The message of the current call, if one is running.
    pub fn current(&self) -> Option<&Input> {
        self.message.as_ref()
    }

    /// The message `handle` names, if it is the one lent to this call.
    fn lent(&self, handle: &Resource<LentMessage>) -> wasmtime::Result<&Input> {
        match &self.message {
            Some(message) if handle.rep() == self.number => Ok(message),
            _ => Err(wasmtime::Error::msg(
                "the plugin used a message after the handle call it was given to returned",
            )),
        }
    }
}

impl types::Host for Lending {}

/// Each part is copied out only when the plugin asks for it.
impl types::HostMessage for Lending {
    fn envelope(&mut self, handle: Resource<LentMessage>) -> wasmtime::Result<types::Envelope> {
        let e = &self.lent(&handle)?.envelope;
        Ok(types::Envelope {
            id: e.id.to_string(),
            message_type: e.message_type.clone(),
            version: e.version,
            correlation_id: e.correlation_id.to_string(),
            causation_id: e.causation_id.clone(),
            attempt: e.attempt,
            first_seen_ms: e.first_seen_ms,
            origin: e.origin.clone(),
            route: declared_route(e),
        })
    }

    fn delivery(&mut self, handle: Resource<LentMessage>) -> wasmtime::Result<types::Delivery> {
        let message = self.lent(&handle)?;
        Ok(types::Delivery {
            queue: self.context.queue.clone(),
            exchange: message.exchange.clone(),
            routing_key: message.routing_key.clone(),
            redelivered: message.redelivered,
            stream_offset: message.stream_offset,
            reply_to: message.reply_to().map(str::to_owned),
            amqp_correlation_id: message.amqp_correlation_id().map(str::to_owned),
        })
    }

    fn content_type(&mut self, handle: Resource<LentMessage>) -> wasmtime::Result<Option<String>> {
        Ok(self.lent(&handle)?.content_type().map(str::to_owned))
    }

    fn headers(&mut self, handle: Resource<LentMessage>) -> wasmtime::Result<types::Headers> {
        Ok(self
            .lent(&handle)?
            .headers
            .iter()
            .map(|(name, value)| (name.clone(), to_wit(value)))
            .collect())
    }

    fn body(&mut self, handle: Resource<LentMessage>) -> wasmtime::Result<Vec<u8>> {
        Ok(self.lent(&handle)?.body.to_vec())
    }

    /// Nothing to free: the message belongs to the call, not to the handle.
    fn drop(&mut self, _handle: Resource<LentMessage>) -> wasmtime::Result<()> {
        Ok(())
    }
}

/// Java's declared route of `envelope`, when it is on one: the step names
/// of `x-acemq-route`, comma-joined on the wire, and the position of the
/// current step (0 when the header is missing or does not fit).
fn declared_route(envelope: &crate::envelope::Envelope) -> Option<types::DeclaredRoute> {
    let route = envelope.route.as_deref()?;
    Some(types::DeclaredRoute {
        steps: route
            .split(',')
            .map(|step| step.trim().to_string())
            .collect(),
        position: envelope
            .route_position
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(0),
        id: envelope.route_id.clone(),
    })
}

/// A header value as the guest reads it.
fn to_wit(value: &HeaderValue) -> types::HeaderValue {
    match value {
        HeaderValue::Text(s) => types::HeaderValue::Text(s.clone()),
        HeaderValue::Int(i) => types::HeaderValue::Int(*i),
        HeaderValue::Float(f) => types::HeaderValue::Float(*f),
        HeaderValue::Bool(b) => types::HeaderValue::Boolean(*b),
        HeaderValue::Bytes(b) => types::HeaderValue::Bytes(b.clone()),
    }
}

/// A header value the guest handed over (in something it publishes).
pub(super) fn from_wit(value: types::HeaderValue) -> HeaderValue {
    match value {
        types::HeaderValue::Text(s) => HeaderValue::Text(s),
        types::HeaderValue::Int(i) => HeaderValue::Int(i),
        types::HeaderValue::Float(f) => HeaderValue::Float(f),
        types::HeaderValue::Boolean(b) => HeaderValue::Bool(b),
        types::HeaderValue::Bytes(b) => HeaderValue::Bytes(b),
    }
}
