//! Tracing: each delivery continues the trace of its `traceparent`, and
//! everything published for it (outputs, retry copies, set-aside copies)
//! carries a `traceparent` of its own publish span, a child of the
//! delivery's `{queue} process` span. The propagation always runs; the spans
//! are exported only when a collector is configured ([`export`]).
//!
//! Span names, kinds and attributes are the AceMQ libraries' (contract §8):
//! `{queue} process` (consumer) and `{destination} publish` (producer, the
//! destination being the exchange, or the routing key on the default
//! exchange), `messaging.*` semantic conventions plus
//! `messaging.acemq.{message_type, attempt, outcome, reason,
//! retry_delay_ms}`, error status for the outcomes `dead_lettered`,
//! `unroutable` and `failed` only.

pub mod context;
pub mod export;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use opentelemetry::KeyValue;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};

pub use context::TraceParent;
pub use export::Tracer;

use crate::envelope::Envelope;

/// The W3C header names (unprefixed application headers in AceMQ).
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// One delivery's place in its trace.
#[derive(Debug)]
pub struct DeliveryTrace {
    /// The delivery's `traceparent`, when it had a valid one.
    pub parent: Option<TraceParent>,
    /// The `{queue} process` span: the parent of every publish for it.
    pub span: TraceParent,
    /// The delivery's `tracestate`, passed on unchanged.
    pub tracestate: Option<String>,
    started: SystemTime,
    tracer: Arc<Tracer>,
}

/// What a finished `{queue} process` span says.
pub struct Processed<'a> {
    pub queue: &'a str,
    pub envelope: &'a Envelope,
    /// The contract's outcome word (`acked`, `retried`, ...).
    pub outcome: &'static str,
    pub reason: Option<&'a str>,
    pub retry_delay: Option<Duration>,
}

/// What a finished `{destination} publish` span says.
pub struct Published<'a> {
    pub span: TraceParent,
    pub exchange: &'a str,
    pub routing_key: &'a str,
    pub message_id: Option<&'a str>,
    pub started: SystemTime,
    /// `confirmed`, `unroutable`, `failed` or `refused`.
    pub outcome: &'static str,
}

impl DeliveryTrace {
    /// Continues the trace of a delivery with these headers, or starts one.
    pub fn start(tracer: &Arc<Tracer>, headers: Option<&FieldTable>) -> Self {
        let header = |name: &str| headers.and_then(|h| text_header(h, name));
        let parent = header(TRACEPARENT).and_then(|t| TraceParent::parse(&t));
        let span = match &parent {
            Some(parent) => parent.child(),
            None => TraceParent::new_trace(),
        };
        Self {
            parent,
            span,
            // Only meaningful beside the traceparent it belongs to.
            tracestate: parent.and(header(TRACESTATE)),
            started: span_start(tracer),
            tracer: tracer.clone(),
        }
    }

    /// When a span of this delivery starts now: see [`span_start`].
    pub fn span_start(&self) -> SystemTime {
        span_start(&self.tracer)
    }

    /// The trace id, for log lines.
    pub fn trace_id(&self) -> context::TraceIdHex {
        context::TraceIdHex(self.span.trace_id)
    }

    /// A new publish span of this delivery.
    pub fn publish_span(&self) -> TraceParent {
        self.span.child()
    }

    /// `properties` with `span` as their `traceparent` (replacing any) and
    /// this delivery's `tracestate`.
    pub fn stamp(&self, properties: BasicProperties, span: &TraceParent) -> BasicProperties {
        let mut headers = properties.headers().clone().unwrap_or_default();
        for (name, value) in self.headers(span) {
            headers.insert(name, value);
        }
        properties.with_headers(headers)
    }

    /// The headers [`DeliveryTrace::stamp`] writes: `span` as the
    /// `traceparent`, and this delivery's `tracestate` when it has one. For
    /// a message whose header table is still being built, so that it is not
    /// copied again to take them.
    pub fn headers(&self, span: &TraceParent) -> impl Iterator<Item = (ShortString, AMQPValue)> {
        let parent = (
            ShortString::from(TRACEPARENT),
            AMQPValue::LongString(LongString::from(span.header())),
        );
        let state = self.tracestate.as_ref().map(|state| {
            (
                ShortString::from(TRACESTATE),
                AMQPValue::LongString(LongString::from(state.as_str())),
            )
        });
        std::iter::once(parent).chain(state)
    }

    /// Records a finished publish span, when exporting.
    pub fn published(&self, publish: Published<'_>) {
        let Some(scope) = self.tracer.scope() else {
            return;
        };
        let destination = if publish.exchange.is_empty() {
            publish.routing_key
        } else {
            publish.exchange
        };
        let mut attributes = vec![
            KeyValue::new("messaging.system", "rabbitmq"),
            KeyValue::new("messaging.destination.name", destination.to_string()),
            KeyValue::new("messaging.operation", "publish"),
            KeyValue::new(
                "messaging.rabbitmq.destination.routing_key",
                publish.routing_key.to_string(),
            ),
            KeyValue::new("messaging.acemq.outcome", publish.outcome),
        ];
        if let Some(id) = publish.message_id {
            attributes.push(KeyValue::new("messaging.message.id", id.to_string()));
        }
        let status = match publish.outcome {
            "unroutable" | "failed" => Status::error(publish.outcome),
            _ => Status::Unset,
        };
        self.tracer.record(span_data(SpanFacts {
            span: publish.span,
            parent: Some((self.span, false)),
            kind: SpanKind::Producer,
            name: format!("{destination} publish").into(),
            started: publish.started,
            attributes,
            status,
            scope,
            tracestate: self.tracestate.as_deref(),
        }));
    }

    /// Records the finished `{queue} process` span, when exporting.
    pub fn processed(&self, processed: Processed<'_>) {
        let Some(scope) = self.tracer.scope() else {
            return;
        };
        let envelope = processed.envelope;
        let mut attributes = vec![
            KeyValue::new("messaging.system", "rabbitmq"),
            KeyValue::new("messaging.destination.name", processed.queue.to_string()),
            KeyValue::new("messaging.operation", "process"),
            KeyValue::new("messaging.message.id", envelope.id.to_string()),
            KeyValue::new(
                "messaging.acemq.message_type",
                envelope.message_type.clone(),
            ),
            KeyValue::new("messaging.acemq.attempt", i64::from(envelope.attempt)),
            KeyValue::new("messaging.acemq.outcome", processed.outcome),
        ];
        if !envelope.correlation_id.is_empty() {
            attributes.push(KeyValue::new(
                "messaging.message.conversation_id",
                envelope.correlation_id.to_string(),
            ));
        }
        if let Some(reason) = processed.reason {
            attributes.push(KeyValue::new("messaging.acemq.reason", reason.to_string()));
        }
        if let Some(delay) = processed.retry_delay {
            attributes.push(KeyValue::new(
                "messaging.acemq.retry_delay_ms",
                i64::try_from(delay.as_millis()).unwrap_or(i64::MAX),
            ));
        }
        let status = match (processed.outcome, processed.reason) {
            ("dead_lettered", reason) => {
                Status::error(reason.unwrap_or("dead-lettered").to_string())
            }
            _ => Status::Unset,
        };
        self.tracer.record(span_data(SpanFacts {
            span: self.span,
            parent: self.parent.map(|p| (p, true)),
            kind: SpanKind::Consumer,
            name: format!("{} process", processed.queue).into(),
            started: self.started,
            attributes,
            status,
            scope,
            tracestate: self.tracestate.as_deref(),
        }));
    }
}

/// Now, for the start of a span, when spans are exported. A span that is
/// not exported needs no time. The clock was read about 14 times a delivery
/// (2.8 % of the echo path's samples, docs/benchmarks.md); this spares two
/// of those reads when tracing is off, a few dozen nanoseconds.
fn span_start(tracer: &Tracer) -> SystemTime {
    if tracer.scope().is_some() {
        SystemTime::now()
    } else {
        SystemTime::UNIX_EPOCH
    }
}

/// A header's text, whether written as a long or a short string.
fn text_header(headers: &FieldTable, name: &str) -> Option<String> {
    match headers.inner().get(name)? {
        AMQPValue::LongString(text) => Some(String::from_utf8_lossy(text.as_bytes()).into_owned()),
        AMQPValue::ShortString(text) => Some(text.as_str().to_string()),
        _ => None,
    }
}

struct SpanFacts<'a> {
    span: TraceParent,
    /// The parent, and whether it is remote (another process's span).
    parent: Option<(TraceParent, bool)>,
    kind: SpanKind,
    name: Cow<'static, str>,
    started: SystemTime,
    attributes: Vec<KeyValue>,
    status: Status,
    scope: &'a opentelemetry::InstrumentationScope,
    tracestate: Option<&'a str>,
}

fn span_data(facts: SpanFacts<'_>) -> SpanData {
    let state = facts
        .tracestate
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    let (parent_span_id, parent_span_is_remote) = match facts.parent {
        Some((parent, remote)) => (SpanId::from_bytes(parent.span_id), remote),
        None => (SpanId::INVALID, false),
    };
    SpanData {
        span_context: SpanContext::new(
            TraceId::from_bytes(facts.span.trace_id),
            SpanId::from_bytes(facts.span.span_id),
            TraceFlags::new(facts.span.flags),
            false,
            state,
        ),
        parent_span_id,
        parent_span_is_remote,
        span_kind: facts.kind,
        name: facts.name,
        start_time: facts.started,
        end_time: SystemTime::now(),
        attributes: facts.attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: facts.status,
        instrumentation_scope: facts.scope.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(pairs: &[(&str, &str)]) -> FieldTable {
        let mut table = FieldTable::default();
        for (name, value) in pairs {
            table.insert(
                (*name).into(),
                AMQPValue::LongString(LongString::from(*value)),
            );
        }
        table
    }

    #[test]
    fn a_delivery_continues_its_trace_and_stamps_children_of_its_span() {
        let tracer = Arc::new(Tracer::off());
        let incoming = headers(&[(TRACEPARENT, PARENT), (TRACESTATE, "vendor=1")]);
        let trace = DeliveryTrace::start(&tracer, Some(&incoming));
        let parent = TraceParent::parse(PARENT).unwrap();
        assert_eq!(trace.parent, Some(parent));
        assert_eq!(trace.span.trace_id, parent.trace_id);
        assert_ne!(trace.span.span_id, parent.span_id);
        assert_eq!(
            trace.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );

        let publish = trace.publish_span();
        let stamped = trace.stamp(
            BasicProperties::default().with_headers(incoming.clone()),
            &publish,
        );
        let out = stamped.headers().as_ref().unwrap();
        let written = TraceParent::parse(&text_header(out, TRACEPARENT).unwrap()).unwrap();
        assert_eq!(written, publish);
        assert_eq!(written.trace_id, parent.trace_id);
        assert_ne!(written.span_id, trace.span.span_id);
        assert_eq!(text_header(out, TRACESTATE).as_deref(), Some("vendor=1"));
    }

    #[test]
    fn a_delivery_without_a_valid_traceparent_starts_a_trace() {
        let tracer = Arc::new(Tracer::off());
        let trace = DeliveryTrace::start(
            &tracer,
            Some(&headers(&[(TRACEPARENT, "junk"), (TRACESTATE, "orphan=1")])),
        );
        assert_eq!(trace.parent, None);
        assert!(trace.span.sampled());
        assert_eq!(
            trace.tracestate, None,
            "a tracestate without its parent is dropped"
        );
        let none = DeliveryTrace::start(&tracer, None);
        assert_ne!(none.span.trace_id, trace.span.trace_id);
    }
}
