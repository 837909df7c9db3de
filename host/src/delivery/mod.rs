//! One message's life, from a delivery to its one settlement.
//!
//! The shape is the `topology/` folder's: plain vocabulary and pure
//! decisions, and one file that talks to the broker through a small trait.
//!
//! - [`Pipeline`] (this file): one consumer's path for each delivery. It
//!   reads the envelope, builds the handler's message, runs the plugins
//!   (a future that yields while the plugin runs), decides, settles and
//!   counts.
//! - [`plugins`]: decode, handle, encode; what that produced is a
//!   [`PluginRun`].
//! - [`decide`]: pure. The settlement for a plugin run, and what happens
//!   instead when carrying one out hits a setback (outputs not confirmed,
//!   rung missing, set-aside failed, shutdown during a wait).
//! - [`settle`]: carries a settlement out through a broker port (a small
//!   trait) and reports how it ended; unit-tested with a recording port.
//! - [`metrics`]: the consumer's metric handles; a report is counted once.
//!
//! AMQP mechanics (subscribing, coalesced acks, confirmed publishing) live
//! in `crate::broker`, which knows nothing of this module.

pub mod decide;
pub mod metrics;
pub mod plugins;
pub mod settle;

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::FutureExt as _;
use lapin::BasicProperties;
use tokio_util::sync::CancellationToken;

pub use decide::{DeliveryFacts, Outcome, Settlement};
pub use plugins::{PluginRun, run_plugins};
use settle::{BrokerPort, Subject, Waited};

use self::metrics::ConsumerMetrics;
use crate::broker::publisher::{Publication, PublishError, PublishLink, Publisher};
use crate::broker::stream::StreamPosition;
use crate::broker::subscription::{Receipt, Received};
use crate::envelope::{self, Envelope};
use crate::plugin::{CodecSet, HandlerSlot, Input};
use crate::retry::RetryPolicy;
use crate::telemetry::Metrics;
use crate::trace::{DeliveryTrace, Processed, Tracer};

/// What one consumer does with each of its deliveries.
pub struct Pipeline {
    queue: String,
    rules: ConsumerRules,
    handler: Arc<HandlerSlot>,
    codecs: Arc<CodecSet>,
    /// This consumer's own: a channel error of its publishes fails no other
    /// consumer's.
    publisher: Publisher,
    metrics: ConsumerMetrics,
    /// Cancelled when the host shuts down: ends a retry's consumer wait.
    shutdown: CancellationToken,
    /// A stream consumer's position, told which version handled each
    /// delivery (a swap saves its checkpoint).
    stream: Option<Arc<StreamPosition>>,
    tracer: Arc<Tracer>,
}

/// How one consumer treats its deliveries, from its config.
#[derive(Debug, Clone)]
pub struct ConsumerRules {
    pub policy: RetryPolicy,
    /// Bodies larger than this are parked before any plugin runs.
    pub max_body_bytes: usize,
    /// Whether an output must reach a queue when its plugin does not say.
    pub mandatory_outputs: bool,
}

/// What every consumer's pipeline shares.
#[derive(Clone)]
pub struct Shared {
    pub codecs: Arc<CodecSet>,
    pub publish_link: Arc<PublishLink>,
    pub metrics: Arc<Metrics>,
    pub shutdown: CancellationToken,
    pub tracer: Arc<Tracer>,
}

impl Pipeline {
    pub fn new(
        queue: &str,
        rules: ConsumerRules,
        handler: Arc<HandlerSlot>,
        shared: &Shared,
    ) -> Self {
        Self {
            queue: queue.to_string(),
            rules,
            handler,
            codecs: shared.codecs.clone(),
            publisher: Publisher::new(shared.publish_link.clone()),
            metrics: ConsumerMetrics::new(shared.metrics.clone(), queue),
            shutdown: shared.shutdown.clone(),
            stream: None,
            tracer: shared.tracer.clone(),
        }
    }

    /// For a stream consumer: its position, told of version changes.
    pub fn with_stream(mut self, position: Option<Arc<StreamPosition>>) -> Self {
        self.stream = position;
        self
    }

    /// One delivery, from its handler call to its settlement.
    pub async fn handle(self: Arc<Self>, received: Received) {
        let arrived = Instant::now();
        let _in_flight = self.metrics.in_flight();
        let queue = self.queue.as_str();
        let Received {
            exchange,
            routing_key,
            redelivered,
            properties,
            body,
            receipt,
            slot,
        } = received;
        // Shared with the handler call and with any republish, never copied.
        let body = Bytes::from(body);
        // Reading is inside the fault boundary too: a panic there (in code
        // that reads what a producer wrote) would otherwise drop the
        // receipt, requeue the delivery and meet the same panic again, for
        // ever. It sets that one delivery aside instead.
        let read = read_within_boundary(queue, || {
            self.read(
                &properties,
                exchange.as_str(),
                routing_key.as_str(),
                redelivered,
                &body,
            )
        });
        let Read {
            envelope,
            trace,
            input,
        } = match read {
            Ok(read) => read,
            Err(set_aside) => {
                drop(slot);
                self.set_aside_unread(
                    &properties,
                    routing_key.as_str(),
                    &receipt,
                    &body,
                    set_aside,
                    arrived,
                )
                .await;
                return;
            }
        };
        let delivery = Delivery {
            envelope: &envelope,
            properties: &properties,
            receipt: &receipt,
            body: &body,
            trace: &trace,
            arrived,
        };
        let mut input = match input {
            Ok(input) => input,
            Err(refusal) => {
                // Never handed to a plugin: the concurrency slot is not needed.
                drop(slot);
                self.settle(delivery, refusal).await;
                return;
            }
        };
        input.trace_id = Some(trace.trace_id());

        // On this task: the calls yield between epoch ticks (plugin/pool.rs),
        // so no thread hop is needed to keep the runtime's workers free.
        // Boxed: the call's future is kilobytes (wasmtime's fiber call
        // inside), and every delivery's task would otherwise copy it on
        // each move from creation to spawn.
        let calling = Instant::now();
        let called = AssertUnwindSafe(Box::pin(run_plugins(&self.handler, &self.codecs, input)))
            .catch_unwind()
            .await;
        let call_took = calling.elapsed();
        // The concurrency bound is on plugin calls; settling waits on the broker.
        drop(slot);
        let run = called.unwrap_or_else(|panic| {
            // The host's own code panicked around the call. The delivery is
            // still ours: it fails like any other, and the policy decides.
            let error = panic_text(panic.as_ref());
            tracing::error!(queue, message_id = %envelope.id, trace_id = %trace.trace_id(), error = %envelope::bound_reason(&error), "handler call failed inside the host");
            PluginRun::HostFailed { reason: error }
        });
        if let PluginRun::Faulted { fault, version, .. } = &run {
            self.metrics.fault(fault.kind);
            // A fault's reason may quote a plugin's panic text, of any size.
            tracing::warn!(queue, message_id = %envelope.id, trace_id = %trace.trace_id(), plugin = %version, fault = %envelope::bound_reason(&fault.reason), "handler failed");
        }
        if let Some(version) = run.version() {
            self.metrics.plugin_call(version, call_took, run.fuel());
        }
        if let (Some(stream), Some(version)) = (&self.stream, run.version()) {
            stream.handled_by(version);
        }

        let facts = DeliveryFacts {
            queue,
            envelope: &envelope,
            now_ms: envelope::now_ms(),
            jitter_sample: rand::random::<f64>(),
            from_stream: from_stream(&properties),
        };
        let settlement = decide::decide(facts, run, &self.rules.policy);
        self.settle(delivery, settlement).await;
    }

    /// The reading stage: the envelope, the trace context and the
    /// handler's input, all taken from the delivery before any plugin runs;
    /// or, instead of the input, the set-aside of a delivery no plugin
    /// should see (unreadable as sent, or a body over `max_body_bytes`).
    fn read(
        &self,
        properties: &BasicProperties,
        exchange: &str,
        routing_key: &str,
        redelivered: bool,
        body: &Bytes,
    ) -> Read {
        let envelope = Arc::new(Envelope::read(properties, routing_key, envelope::now_ms()));
        let trace = DeliveryTrace::start(&self.tracer, properties.headers().as_ref());
        let refusal =
            decide::refuse_unreadable(&self.queue, unreadable_note(properties).as_deref()).or_else(
                || decide::refuse_oversized(&self.queue, body.len(), self.rules.max_body_bytes),
            );
        let input = match refusal {
            Some(refusal) => Err(refusal),
            None => Ok(handler_input(
                envelope.clone(),
                properties,
                exchange,
                routing_key,
                redelivered,
                body.clone(),
            )),
        };
        Read {
            envelope,
            trace,
            input,
        }
    }

    /// Carries out `set_aside` for a delivery whose reading panicked, under
    /// an envelope of defaults (the delivery's own could not be read).
    /// Should that panic as well, the copy goes without the delivery's
    /// properties, which are then all that can be wrong.
    async fn set_aside_unread(
        &self,
        properties: &BasicProperties,
        routing_key: &str,
        receipt: &Receipt,
        body: &Bytes,
        set_aside: Settlement,
        arrived: Instant,
    ) {
        let queue = self.queue.as_str();
        let envelope = Envelope::from_headers(None, None, routing_key, envelope::now_ms());
        let trace = DeliveryTrace::start(&self.tracer, None);
        let bare = BasicProperties::default();
        for properties in [properties, &bare] {
            let delivery = Delivery {
                envelope: &envelope,
                properties,
                receipt,
                body,
                trace: &trace,
                arrived,
            };
            let settled = AssertUnwindSafe(self.settle(delivery, set_aside.clone()))
                .catch_unwind()
                .await;
            match settled {
                Ok(()) => return,
                Err(panic) => {
                    tracing::error!(queue, error = %envelope::bound_reason(&panic_message(panic.as_ref())), "setting aside an unreadable delivery panicked")
                }
            }
        }
    }

    /// Carries `settlement` out on the broker, then counts how it ended and
    /// ends the delivery's span.
    async fn settle(&self, delivery: Delivery<'_>, settlement: Settlement) {
        let Delivery {
            envelope,
            properties,
            receipt,
            body,
            trace,
            arrived,
        } = delivery;
        let from_stream = from_stream(properties);
        // Read before the settlement is consumed, and only for a span.
        let span_facts = self.tracer.exporting().then(|| {
            (
                settlement.reason().map(str::to_owned),
                settlement.retry_delay(),
            )
        });
        let port = OnBroker {
            publisher: &self.publisher,
            receipt,
            body,
            shutdown: &self.shutdown,
        };
        let subject = Subject {
            queue: &self.queue,
            envelope,
            properties,
            mandatory_outputs: self.rules.mandatory_outputs,
            from_stream,
            trace,
        };
        // Boxed for the same reason as the plugin call: its future is large.
        let report = Box::pin(settle::settle(
            &port,
            subject,
            &self.rules.policy,
            settlement,
        ))
        .await;
        self.metrics
            .count(&report, envelope.attempt, arrived.elapsed());
        if let Some((reason, retry_delay)) = span_facts {
            trace.processed(Processed {
                queue: &self.queue,
                envelope,
                outcome: report.outcome.as_str(),
                reason: reason.as_deref(),
                retry_delay,
            });
        }
    }
}

/// Runs the reading stage inside the fault boundary: what it read, or, if
/// it panicked, the delivery's set-aside (parked, the panic its reason:
/// reading it again would panic again, so it is never retried).
fn read_within_boundary(queue: &str, read: impl FnOnce() -> Read) -> Result<Read, Settlement> {
    std::panic::catch_unwind(AssertUnwindSafe(read)).map_err(|panic| {
        let reason = format!(
            "the host could not read it: {}",
            panic_message(panic.as_ref())
        );
        tracing::error!(queue, error = %envelope::bound_reason(&reason), "a delivery could not be read; parking it");
        Settlement::Park {
            queue: crate::topology::naming::parked_queue(queue),
            reason,
        }
        .with_bounded_reason()
    })
}

/// What the reading stage took from a delivery.
struct Read {
    envelope: Arc<Envelope>,
    trace: DeliveryTrace,
    /// The handler's input, or the delivery's set-aside instead.
    input: Result<Input, Settlement>,
}

/// What the frame guard wrote on a delivery it had to make readable
/// (`broker::frame_guard`): which of its bytes were not as AMQP reads them.
fn unreadable_note(properties: &BasicProperties) -> Option<String> {
    use lapin::types::AMQPValue;
    let headers = properties.headers().as_ref()?;
    match headers
        .inner()
        .get(crate::broker::frame_guard::UNREADABLE_HEADER)?
    {
        AMQPValue::LongString(note) => Some(String::from_utf8_lossy(note.as_bytes()).into_owned()),
        _ => Some("(no note)".to_string()),
    }
}

/// One delivery on its way to settlement, as the pipeline holds it.
struct Delivery<'a> {
    envelope: &'a Envelope,
    properties: &'a BasicProperties,
    receipt: &'a Receipt,
    body: &'a Bytes,
    trace: &'a DeliveryTrace,
    /// When it arrived: the start of its `acemq.consume.duration`.
    arrived: Instant,
}

/// Whether a delivery came from a stream: the broker stamps every stream
/// delivery with its offset. Known from the delivery itself, so a stream
/// declared by another service is recognised too.
fn from_stream(properties: &BasicProperties) -> bool {
    properties.headers().as_ref().is_some_and(|h| {
        h.inner()
            .contains_key(crate::broker::stream::OFFSET_ARGUMENT)
    })
}

/// The message a handler is given for a delivery: its envelope (read once
/// by the caller, and shared), the headers a plugin may see and the content
/// type from its properties, and its body.
pub fn handler_input(
    envelope: Arc<Envelope>,
    properties: &BasicProperties,
    exchange: &str,
    routing_key: &str,
    redelivered: bool,
    body: Bytes,
) -> Input {
    let headers = envelope::split_headers(properties);
    Input {
        envelope,
        exchange: exchange.to_string(),
        routing_key: routing_key.to_string(),
        redelivered,
        stream_offset: headers.stream_offset,
        content_type: properties.content_type().as_ref().map(|c| c.to_string()),
        headers: headers.visible,
        body,
        trace_id: None,
    }
}

/// The port of one delivery on the real broker.
struct OnBroker<'a> {
    publisher: &'a Publisher,
    receipt: &'a Receipt,
    /// The delivery's body, for republishes.
    body: &'a Bytes,
    shutdown: &'a CancellationToken,
}

impl OnBroker<'_> {
    /// Publishes `publications`, holding on while the broker is in trouble.
    ///
    /// A publish declined (connection lost, recovering, blocked) or
    /// interrupted (connection dropped before its confirm) is back pressure,
    /// not the message's failure: the delivery stays unacked and its
    /// outputs go out once publishing is back, without counting an attempt.
    /// The hold ends early when the delivery's own channel is gone (the
    /// broker redelivers it; publishing now would only duplicate), at
    /// shutdown, or after [`HOLD_AT_MOST`], well inside the broker's
    /// consumer timeout; the caller then requeues it. A stream delivery is
    /// held without that limit: a requeue would not bring it back (it is
    /// read again instead), and should the broker's consumer timeout close
    /// its channel, the next subscription reads it again from its offset.
    async fn publish_holding(&self, publications: &[Publication]) -> Result<(), PublishError> {
        let started = tokio::time::Instant::now();
        let hold_at_most = if self.receipt.is_stream() {
            Duration::MAX / 4
        } else {
            HOLD_AT_MOST
        };
        loop {
            if self.receipt.is_lost() {
                return Err(delivery_lost(&publications[0]));
            }
            let error = match self.publisher.publish_all(publications).await {
                Err(e) if e.is_broker_trouble() => e,
                done => return done,
            };
            let give_up = started + hold_at_most;
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return Err(error),
                _ = self.receipt.lost() => return Err(error),
                _ = tokio::time::sleep_until(give_up) => return Err(error),
                _ = self.ready_again() => {}
            }
        }
    }

    /// Publishing may be tried again: the link is up, after a short pause so
    /// that a publish declined for want of confirm places does not spin.
    async fn ready_again(&self) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.publisher.link().ready().await;
    }
}

/// How long a delivery is held while publishing is paused before it is
/// requeued instead (RabbitMQ's consumer timeout is 30 minutes by default).
const HOLD_AT_MOST: Duration = Duration::from_secs(5 * 60);

/// Nothing is published for a delivery whose channel is gone.
fn delivery_lost(first: &Publication) -> PublishError {
    PublishError::Declined {
        id: first
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string())
            .unwrap_or_default(),
        exchange: first.exchange.clone(),
        routing_key: first.routing_key.clone(),
        reason: "the channel it was delivered on closed, so the broker delivers it again; nothing was sent".to_string(),
    }
}

impl BrokerPort for OnBroker<'_> {
    async fn publish(&self, outputs: &[Publication]) -> Result<(), PublishError> {
        if outputs.is_empty() {
            return Ok(());
        }
        self.publish_holding(outputs).await
    }

    async fn republish(
        &self,
        queue: &str,
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        let copy = Publication {
            exchange: String::new(),
            routing_key: queue.to_string(),
            body: self.body.clone(),
            properties,
            // A retry or set-aside copy that reached no queue would be lost.
            mandatory: true,
        };
        self.publish_holding(std::slice::from_ref(&copy)).await
    }

    async fn ack(&self) {
        self.receipt.ack().await;
    }

    async fn requeue(&self) {
        self.receipt.requeue().await;
    }

    fn read_again(&self) {
        self.receipt.read_again();
    }

    async fn wait(&self, wait: Duration) -> Waited {
        tokio::select! {
            _ = tokio::time::sleep(wait) => Waited::Elapsed,
            _ = self.shutdown.cancelled() => Waited::ShutDown,
            // Its channel is gone: the broker delivers it again, and the
            // retry copy would be a duplicate.
            _ = self.receipt.lost() => Waited::ChannelLost,
        }
    }

    fn now_ms(&self) -> u64 {
        envelope::now_ms()
    }

    fn frame_max(&self) -> u32 {
        self.publisher.frame_max()
    }

    fn jitter_sample(&self) -> f64 {
        rand::random::<f64>()
    }
}

/// What a panic said, for the delivery's reason.
fn panic_text(panic: &(dyn Any + Send)) -> String {
    format!(
        "the host panicked while running the plugins: {}",
        panic_message(panic)
    )
}

/// A panic's message, or that it had none.
fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic with no message")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_while_reading_parks_the_delivery_with_the_panic_as_its_reason() {
        let set_aside =
            read_within_boundary("orders.new", || panic!("index 54 is not a char boundary"))
                .err()
                .expect("the panic is caught");
        assert_eq!(
            set_aside,
            Settlement::Park {
                queue: "orders.new.parked".into(),
                reason: "the host could not read it: index 54 is not a char boundary".into(),
            }
        );
        let long = "x".repeat(100_000);
        let Err(Settlement::Park { reason, .. }) =
            read_within_boundary("q", || std::panic::panic_any(long.clone()))
        else {
            panic!("not parked");
        };
        assert!(
            reason.len() <= envelope::MAX_REASON_BYTES,
            "{}",
            reason.len()
        );
    }

    #[test]
    fn the_frame_guards_note_is_what_marks_a_delivery_unreadable() {
        use lapin::types::{AMQPValue, FieldTable, LongString};
        let mut headers = FieldTable::default();
        assert_eq!(unreadable_note(&BasicProperties::default()), None);
        headers.insert("x-acemq-id".into(), AMQPValue::LongString("id".into()));
        let plain = BasicProperties::default().with_headers(headers.clone());
        assert_eq!(unreadable_note(&plain), None);
        headers.insert(
            crate::broker::frame_guard::UNREADABLE_HEADER.into(),
            AMQPValue::LongString(LongString::from("the routing key is not UTF-8: \"\\xff\"")),
        );
        let marked = BasicProperties::default().with_headers(headers);
        assert_eq!(
            unreadable_note(&marked).as_deref(),
            Some("the routing key is not UTF-8: \"\\xff\"")
        );
    }
}
