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
//! - [`flow`]: where a delivery goes on after its handler: the reply to a
//!   request, the hop to a routing slip's next step.
//! - [`metrics`]: the consumer's metric handles; a report is counted once.
//!
//! AMQP mechanics (subscribing, coalesced acks, confirmed publishing) live
//! in `crate::broker`, which knows nothing of this module.

pub mod decide;
pub mod flow;
pub mod metrics;
pub mod plugins;
pub mod settle;
pub mod shadow;

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::FutureExt as _;
use lapin::BasicProperties;
use tokio_util::sync::CancellationToken;

pub use decide::{ConsumeOutcome, DeliveryFacts, Settlement};
use flow::Flow;
pub use plugins::{PluginRun, run_plugins, run_plugins_with_state};
use settle::{BrokerPort, Subject, Waited};

use self::metrics::ConsumerMetrics;
use crate::broker::Phase;
use crate::broker::publisher::{Publication, PublishError, PublishLink, Publisher};
use crate::broker::stream::StreamPosition;
use crate::broker::subscription::{Receipt, Received, Slot};
use crate::envelope::{self, Envelope};
use crate::plugin::{Codecs, HandlerSlot, Input, StateEnd};
use crate::retry::RetryPolicy;
use crate::rollout::live::{Role, RolloutSlot, Route};
use crate::state::consumer::{Before, ConsumerState};
use crate::telemetry::Metrics;
use crate::trace::{DeliveryTrace, Processed, Tracer};
use shadow::ShadowCall;

/// What one consumer does with each of its deliveries.
pub struct Pipeline {
    queue: String,
    rules: ConsumerRules,
    handler: Arc<HandlerSlot>,
    /// Read once per delivery ([`Codecs::snapshot`]): a codec swapped while
    /// a delivery runs is not used by it.
    codecs: Arc<Codecs>,
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
    /// Its state namespace, done records and claims (docs/state.md).
    state: Option<Arc<ConsumerState>>,
    /// Its rollout, when a candidate version runs beside the current one
    /// (`crate::rollout`): which version each delivery goes to.
    rollout: Arc<RolloutSlot>,
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
    pub codecs: Arc<Codecs>,
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
            state: None,
            rollout: Arc::default(),
        }
    }

    /// For a consumer with state or `idempotent`: its use of the store.
    pub fn with_state(mut self, state: Option<Arc<ConsumerState>>) -> Self {
        self.state = state;
        self
    }

    /// For a stream consumer: its position, told of version changes.
    /// Routes each delivery through `rollout` (empty until a rollout is
    /// started on the consumer).
    pub fn with_rollout(mut self, rollout: Arc<RolloutSlot>) -> Self {
        self.rollout = rollout;
        self
    }

    pub fn with_stream(mut self, position: Option<Arc<StreamPosition>>) -> Self {
        self.stream = position;
        self
    }

    /// Once the consumer has ended (every delivery settled): its publishing
    /// channels are closed, before the host closes the connection
    /// ([`Publisher::close_idle`]).
    pub async fn close(&self) {
        self.publisher.close_idle(CHANNEL_CLOSE_LIMIT).await;
    }

    /// One delivery, from its arrival to its settlement, in stages: read,
    /// call the plugins, decide, settle.
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
        // Shared with the envelope, which derives an id from them only if
        // something reads it (`MessageId::derived`).
        let properties = Arc::new(properties);
        // `body` is shared with the handler call and with any republish,
        // never copied.
        // Reading is inside the fault boundary too: a panic there (in code
        // that reads what a producer wrote) would otherwise drop the
        // receipt, requeue the delivery and meet the same panic again, for
        // ever. It sets that one delivery aside instead.
        let read = read_within_boundary(queue, || {
            self.read(&properties, exchange.as_str(), routing_key.as_str(), &body)
        });
        let Read {
            envelope,
            trace,
            flow,
            headers,
        } = match read {
            Ok(read) => read,
            Err(set_aside) => {
                drop(slot);
                // Boxed, as are the stateful path's calls below: rare or
                // optional stages whose futures are kilobytes would
                // otherwise size every delivery's future (see
                // `settle::carry_out`).
                Box::pin(self.set_aside_unread(
                    &properties,
                    routing_key.as_str(),
                    &receipt,
                    &body,
                    set_aside,
                    arrived,
                ))
                .await;
                return;
            }
        };
        let mut flow = flow;
        let headers = match headers {
            Ok(headers) => headers,
            Err(refusal) => {
                // Never handed to a plugin: the concurrency slot is not needed.
                drop(slot);
                let delivery = Unsettled {
                    envelope: &envelope,
                    properties: &properties,
                    receipt: &receipt,
                    body: &body,
                    trace: &trace,
                    flow: &flow,
                    arrived,
                };
                self.settle(delivery, refusal).await;
                return;
            }
        };
        // The exchange and routing key are moved into the input, not copied,
        // once reading is done: the set-aside of a delivery whose reading
        // panicked (above) still needed them.
        let mut input = input_of(
            envelope.clone(),
            properties.clone(),
            headers,
            exchange.into(),
            routing_key.into(),
            redelivered,
            body.clone(),
        );
        input.trace_id = Some(trace.trace_id());
        let parts = Parts {
            envelope: &envelope,
            properties: &properties,
            receipt: &receipt,
            body: &body,
            trace: &trace,
            arrived,
        };
        let Some(state) = self.state.clone() else {
            let run = self.call_plugins(input, slot, &envelope, &trace).await;
            let settlement = self.settlement_for(&envelope, &properties, &mut flow, run);
            self.settle(parts.with(&flow), settlement).await;
            return;
        };
        // Done already, claimed elsewhere, or a store that cannot answer:
        // settled without a call.
        if let Some(settlement) = Box::pin(self.before_call(&state, parts)).await {
            drop(slot);
            self.settle(parts.with(&flow), settlement).await;
            return;
        }
        let (run, pending) =
            Box::pin(self.call_with_state(&state, input, slot, &envelope, &trace)).await;
        if matches!(run, PluginRun::StoreUnavailable { .. }) {
            self.pause_for_the_store(&receipt).await;
        }
        let settlement = self.settlement_for(&envelope, &properties, &mut flow, run);
        let accepted = matches!(settlement, Settlement::Accept { .. });
        let committed = Box::pin(self.settle_committing(
            parts.with(&flow),
            settlement,
            accepted.then_some((&*state, &pending)),
        ))
        .await;
        if !committed {
            state
                .abandon(
                    &envelope.id,
                    &pending.changes,
                    pending.reservation.as_deref(),
                )
                .await;
        }
    }

    /// What the store says of an input before its call: `None` to call the
    /// plugin, else how it is settled instead.
    async fn before_call(&self, state: &ConsumerState, delivery: Parts<'_>) -> Option<Settlement> {
        let envelope = delivery.envelope;
        match state.before_call(&envelope.id, envelope::now_ms()).await {
            Before::Run => None,
            Before::Duplicate => Some(Settlement::Duplicate),
            Before::InProgress { reason } => Some(Settlement::InProgress {
                wait: crate::state::consumer::IN_PROGRESS_WAIT,
                reason,
            }),
            Before::Unavailable { reason } => {
                tracing::warn!(queue = self.queue.as_str(), message_id = %envelope.id, error = %reason, "the state store cannot answer; the delivery waits");
                self.pause_for_the_store(delivery.receipt).await;
                let why = format!("its state store could not be reached: {reason}");
                Some(if from_stream(delivery.properties) {
                    Settlement::ReadAgain { why }
                } else {
                    Settlement::Requeue { why }
                })
            }
        }
    }

    /// A pause before a delivery the store could not serve is given back,
    /// so that it does not come straight back to fail again.
    async fn pause_for_the_store(&self, receipt: &Receipt) {
        tokio::select! {
            _ = tokio::time::sleep(settle::PAUSE_BEFORE_REQUEUE) => {}
            _ = self.shutdown.cancelled() => {}
            _ = receipt.lost() => {}
        }
    }

    /// The calling stage of a consumer with state: the call, and for an
    /// accept whose writes depend on what it read, the reservation of those
    /// keys before anything is published. A conflict runs the call again
    /// on fresh state (bounded: then the input fails with it).
    async fn call_with_state(
        &self,
        state: &ConsumerState,
        input: Input,
        slot: Slot,
        envelope: &Envelope,
        trace: &DeliveryTrace,
    ) -> (PluginRun, PendingState) {
        let mut reruns = 0;
        loop {
            let (run, ended) = self
                .call_plugins_keeping_state(input.clone(), envelope, trace)
                .await;
            let accepted = matches!(
                run,
                PluginRun::Decided {
                    outcome: crate::plugin::Outcome::Accept,
                    ..
                }
            );
            let changes = ended.changes;
            if !accepted || changes.checks().is_empty() {
                drop(slot);
                return (
                    run,
                    PendingState {
                        changes,
                        reservation: None,
                    },
                );
            }
            // The input's own token, the same on every run of it: a run
            // after a crash (whose reservation outlives it until its lease
            // ends) takes the reservation over instead of conflicting with
            // it. Two hosts running one input at once share it too; the
            // done record, checked at commit, applies its writes once.
            let token = format!("{}/{}", self.queue, envelope.id);
            match state.reserve(&changes, &token, envelope::now_ms()).await {
                Ok(None) => {
                    drop(slot);
                    let pending = PendingState {
                        changes,
                        reservation: Some(token),
                    };
                    return (run, pending);
                }
                Ok(Some(key)) if reruns < crate::state::consumer::MAX_RERUNS => {
                    reruns += 1;
                    state.rerun(&key, &envelope.id);
                    // Another input holds the key until its commit, a
                    // confirm away: a short, growing pause before reading again.
                    tokio::time::sleep(Duration::from_millis(5 << reruns)).await;
                }
                Ok(Some(key)) => {
                    drop(slot);
                    let reason = ConsumerState::conflicted(&key);
                    let version = run.version().cloned().unwrap_or_else(|| Arc::from(""));
                    return (
                        PluginRun::StateConflicted { reason, version },
                        PendingState::default(),
                    );
                }
                Err(e) => {
                    drop(slot);
                    let reason = e.to_string();
                    return (
                        PluginRun::StoreUnavailable { reason },
                        PendingState::default(),
                    );
                }
            }
        }
    }

    /// The settlement for what the plugins did, and the failure it is, if
    /// any, noted in the delivery's flow (for an error reply); an answer to
    /// a request that names no reply queue is refused.
    fn settlement_for(
        &self,
        envelope: &Envelope,
        properties: &BasicProperties,
        flow: &mut Flow,
        run: PluginRun,
    ) -> Settlement {
        flow.failure = flow.failure.or(flow::failure_of(&run));
        let settlement = self.decide(envelope, properties, run);
        flow::refuse_unanswerable(&self.queue, flow, settlement)
    }

    /// The deciding stage: the settlement for what the plugins did, now.
    fn decide(
        &self,
        envelope: &Envelope,
        properties: &BasicProperties,
        run: PluginRun,
    ) -> Settlement {
        let facts = DeliveryFacts {
            queue: &self.queue,
            envelope,
            now_ms: envelope::now_ms(),
            jitter_sample: rand::random::<f64>(),
            from_stream: from_stream(properties),
        };
        decide::decide(facts, run, &self.rules.policy)
    }

    /// The calling stage: decode, handle and encode, inside the fault
    /// boundary, holding `slot` (the concurrency bound is on plugin calls;
    /// settling waits on the broker); then the call is counted.
    async fn call_plugins(
        &self,
        input: Input,
        slot: Slot,
        envelope: &Envelope,
        trace: &DeliveryTrace,
    ) -> PluginRun {
        let (run, _) = self
            .call_plugins_keeping_state(input, envelope, trace)
            .await;
        drop(slot);
        run
    }

    /// [`Pipeline::call_plugins`] without the slot (the caller holds it),
    /// and the state the handler left.
    async fn call_plugins_keeping_state(
        &self,
        input: Input,
        envelope: &Envelope,
        trace: &DeliveryTrace,
    ) -> (PluginRun, StateEnd) {
        // On this task: the calls yield between epoch ticks (plugin/pool.rs),
        // so no thread hop is needed to keep the runtime's workers free.
        // Not boxed, though the call's future is kilobytes (wasmtime's
        // fiber call inside): the delivery's whole future is boxed where
        // it is made and never moved after (`Placement::start`), and a box
        // of its own here cost an allocation and a copy of the call's
        // future into it on every delivery (measured in docs/benchmarks.md).
        let codecs = self.codecs.snapshot();
        // Which version handles it: the current one, or a rollout's
        // candidate; and whether a shadow runs on a copy beside it.
        let (route, rollout) = self.rollout.route(&envelope.id);
        let (version, role, shadow) = match route {
            Route::Current => (self.handler.current(), Role::Current, None),
            Route::Candidate(candidate) => (candidate, Role::Candidate, None),
            Route::Shadowed(candidate) => {
                let shadow = rollout.clone().and_then(|rollout| {
                    ShadowCall::start(rollout, candidate, codecs.clone(), input.clone())
                });
                (self.handler.current(), Role::Current, shadow)
            }
        };
        let calling = Instant::now();
        let called = AssertUnwindSafe(run_plugins_with_state(&version, &codecs, input))
            .catch_unwind()
            .await;
        let call_took = calling.elapsed();
        let (run, state) = called.unwrap_or_else(|panic| {
            // The host's own code panicked around the call. The delivery is
            // still ours: it fails like any other, and the policy decides.
            let error = panic_text(panic.as_ref());
            tracing::error!(queue = self.queue.as_str(), message_id = %envelope.id, trace_id = %trace.trace_id(), error = %envelope::bound_reason(&error), "handler call failed inside the host");
            (PluginRun::HostFailed { reason: error }, StateEnd::default())
        });
        self.note_call(&run, call_took, envelope, trace, role);
        if let (Some(rollout), Some(call)) = (&rollout, run.rollout_call(call_took)) {
            rollout.record(role, call);
        }
        if let Some(shadow) = shadow {
            shadow.compare(run.decision());
        }
        (run, state)
    }

    /// Counts a plugin call (its fault, its version's time and fuel) and
    /// tells a stream's position which version handled the delivery.
    fn note_call(
        &self,
        run: &PluginRun,
        took: Duration,
        envelope: &Envelope,
        trace: &DeliveryTrace,
        role: Role,
    ) {
        if let PluginRun::Faulted { fault, version, .. } = run {
            self.metrics.fault(fault.kind);
            // A fault's reason may quote a plugin's panic text, of any size.
            tracing::warn!(queue = self.queue.as_str(), message_id = %envelope.id, trace_id = %trace.trace_id(), plugin = %version, fault = %envelope::bound_reason(&fault.reason), "handler failed");
        }
        if let Some(version) = run.version() {
            self.metrics.plugin_call(version, took, run.fuel());
        }
        // A canary's candidate is not the version the stream's position
        // is kept for (a checkpoint is saved when that changes).
        if let (Some(stream), Some(version), Role::Current) = (&self.stream, run.version(), role) {
            stream.handled_by(version);
        }
    }

    /// The reading stage: the envelope, the trace context and the headers
    /// a handler sees, all taken from the delivery before any plugin runs;
    /// or, instead of the headers, the set-aside of a delivery no plugin
    /// should see (unreadable as sent, or a body over `max_body_bytes`).
    fn read(
        &self,
        properties: &Arc<BasicProperties>,
        exchange: &str,
        routing_key: &str,
        body: &Bytes,
    ) -> Read {
        // A stream consumer's messages are named by their offsets.
        let stream = self.stream.as_ref().map(|_| self.queue.as_str());
        let envelope = Arc::new(Envelope::read_delivery(
            properties,
            routing_key,
            body,
            stream,
            envelope::now_ms(),
        ));
        let trace = DeliveryTrace::start(&self.tracer, properties.headers().as_ref());
        let (mut flow, unfollowable) =
            Flow::read(&self.queue, properties, &envelope, exchange, body);
        let refusal = match (
            decide::refuse_unreadable(&self.queue, unreadable_note(properties).as_deref()),
            decide::refuse_oversized(&self.queue, body.len(), self.rules.max_body_bytes),
        ) {
            (Some(unreadable), _) => {
                flow.failure = Some(envelope::ErrorType::Undecodable);
                Some(unreadable)
            }
            (None, Some(oversized)) => {
                flow.failure = Some(envelope::ErrorType::TooLarge);
                Some(oversized)
            }
            (None, None) => unfollowable,
        };
        let headers = match refusal {
            Some(refusal) => Err(refusal),
            None => Ok(envelope::split_headers(properties)),
        };
        Read {
            envelope,
            trace,
            flow,
            headers,
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
            let delivery = Unsettled {
                envelope: &envelope,
                properties,
                receipt,
                body,
                trace: &trace,
                flow: &Flow::default(),
                arrived,
            };
            let settled = AssertUnwindSafe(self.settle(delivery, set_aside.clone()))
                .catch_unwind()
                .await;
            match settled {
                Ok(()) => return,
                Err(panic) => {
                    tracing::error!(queue, error = %envelope::bound_reason(panic_message(panic.as_ref())), "setting aside an unreadable delivery panicked")
                }
            }
        }
    }

    /// Carries `settlement` out on the broker, then counts how it ended and
    /// ends the delivery's span.
    async fn settle(&self, delivery: Unsettled<'_>, settlement: Settlement) {
        self.settle_committing(delivery, settlement, None).await;
    }

    /// [`Pipeline::settle`], committing `commit`'s state if it accepts
    /// (after its outputs are confirmed, before its ack); whether it did.
    async fn settle_committing(
        &self,
        delivery: Unsettled<'_>,
        settlement: Settlement,
        commit: Option<(&ConsumerState, &PendingState)>,
    ) -> bool {
        let Unsettled {
            envelope,
            properties,
            receipt,
            body,
            trace,
            flow,
            arrived,
        } = delivery;
        let from_stream = from_stream(properties);
        // Read before the settlement is consumed: for the status page, should
        // it be set aside (only a settlement other than an accept has one).
        let reason = settlement.reason().map(str::to_owned);
        // Read before the settlement is consumed, and only for a span.
        let span_facts = self
            .tracer
            .exporting()
            .then(|| (reason.clone(), settlement.retry_delay()));
        let port = OnBroker {
            publisher: &self.publisher,
            receipt,
            body,
            shutdown: &self.shutdown,
            metrics: &self.metrics,
            commit: commit.map(|(state, pending)| Committing {
                state,
                pending,
                id: &envelope.id,
                committed: std::sync::atomic::AtomicBool::new(false),
            }),
        };
        let subject = Subject {
            queue: &self.queue,
            envelope,
            properties,
            mandatory_outputs: self.rules.mandatory_outputs,
            from_stream,
            trace,
            flow,
        };
        // Not boxed, as the plugin call is not (see
        // `call_plugins_keeping_state`).
        let report = settle::settle(&port, subject, &self.rules.policy, settlement).await;
        self.metrics
            .count(&report, envelope.attempt, arrived.elapsed());
        if report.set_aside
            && let Some(reason) = &reason
        {
            self.metrics
                .note_set_aside(report.outcome, reason, &envelope.id);
        }
        if let Some((reason, retry_delay)) = span_facts {
            trace.processed(Processed {
                queue: &self.queue,
                envelope,
                outcome: report.span_outcome(),
                reason: reason.as_deref(),
                retry_delay,
            });
        }
        port.commit
            .is_some_and(|c| c.committed.load(std::sync::atomic::Ordering::Relaxed))
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
    /// Its request and routing slip.
    flow: Flow,
    /// The headers the handler's input carries, or the delivery's
    /// set-aside instead.
    headers: Result<envelope::AppHeaders, Settlement>,
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

/// A delivery read, but for its flow (which the handler's run may change).
#[derive(Clone, Copy)]
struct Parts<'a> {
    envelope: &'a Envelope,
    properties: &'a BasicProperties,
    receipt: &'a Receipt,
    body: &'a Bytes,
    trace: &'a DeliveryTrace,
    arrived: Instant,
}

impl<'a> Parts<'a> {
    fn with(self, flow: &'a Flow) -> Unsettled<'a> {
        Unsettled {
            envelope: self.envelope,
            properties: self.properties,
            receipt: self.receipt,
            body: self.body,
            trace: self.trace,
            flow,
            arrived: self.arrived,
        }
    }
}

/// One delivery on its way to settlement, as the pipeline holds it (read,
/// not yet settled).
struct Unsettled<'a> {
    envelope: &'a Envelope,
    properties: &'a BasicProperties,
    receipt: &'a Receipt,
    body: &'a Bytes,
    trace: &'a DeliveryTrace,
    flow: &'a Flow,
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
/// by the caller, and shared), its properties (shared), the headers a
/// plugin may see, and its body.
pub fn handler_input(
    envelope: Arc<Envelope>,
    properties: Arc<BasicProperties>,
    exchange: &str,
    routing_key: &str,
    redelivered: bool,
    body: Bytes,
) -> Input {
    let headers = envelope::split_headers(&properties);
    input_of(
        envelope,
        properties,
        headers,
        exchange.to_owned(),
        routing_key.to_owned(),
        redelivered,
        body,
    )
}

/// [`handler_input`] from headers already split, and the exchange and
/// routing key given (moved from a delivery, or copied).
fn input_of(
    envelope: Arc<Envelope>,
    properties: Arc<BasicProperties>,
    headers: envelope::AppHeaders,
    exchange: String,
    routing_key: String,
    redelivered: bool,
    body: Bytes,
) -> Input {
    Input {
        envelope,
        properties,
        exchange,
        routing_key,
        redelivered,
        stream_offset: headers.stream_offset,
        decoded_content_type: None,
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
    metrics: &'a ConsumerMetrics,
    /// The state an accept commits, for a consumer with state.
    commit: Option<Committing<'a>>,
}

/// What a consumer with state left to commit for one delivery.
#[derive(Debug, Default)]
struct PendingState {
    /// The handler's writes (of its last run).
    changes: crate::state::call::Changes,
    /// The token its checked keys are reserved under, if it has any.
    reservation: Option<String>,
}

/// A delivery's commit, and whether it happened.
struct Committing<'a> {
    state: &'a ConsumerState,
    pending: &'a PendingState,
    id: &'a str,
    /// The commit was applied (or found done): nothing to release.
    committed: std::sync::atomic::AtomicBool,
}

impl OnBroker<'_> {
    /// Publishes `publications`, holding on while the broker is in trouble.
    ///
    /// A publish declined (connection lost, recovering, blocked, no places
    /// among the unconfirmed) or interrupted (no confirm: the connection
    /// dropped, or the confirm timeout passed) is back pressure, not the
    /// message's failure: the delivery stays unacked and the messages not
    /// yet confirmed go out again once publishing is back, without counting
    /// an attempt. What was confirmed is not published again. The hold ends
    /// early when the delivery's own channel is gone (the broker redelivers
    /// it; publishing now would only duplicate), at shutdown, or after
    /// [`HOLD_AT_MOST`], well inside the broker's consumer timeout; the
    /// caller then requeues it. A stream delivery is held without that
    /// limit: a requeue would not bring it back (it is read again instead),
    /// and should the broker's consumer timeout close its channel, the next
    /// subscription reads it again from its offset.
    async fn publish_holding(&self, publications: &[Publication]) -> Result<(), PublishError> {
        let started = tokio::time::Instant::now();
        let mut outstanding: Vec<usize> = (0..publications.len()).collect();
        let mut held = false;
        let hold_at_most = if self.receipt.is_stream() {
            Duration::MAX / 4
        } else {
            HOLD_AT_MOST
        };
        loop {
            if self.receipt.is_lost() {
                return Err(delivery_lost(&publications[outstanding[0]]));
            }
            let results = if outstanding.len() == publications.len() {
                self.publisher.publish_batch(publications).await
            } else {
                let again: Vec<Publication> = outstanding
                    .iter()
                    .map(|&i| publications[i].clone())
                    .collect();
                self.publisher.publish_batch(&again).await
            };
            let why = match left_after(&outstanding, results, publications.len()) {
                Left::Nothing => return Ok(()),
                Left::Failed(error) => return Err(error),
                Left::Held { again, why } => {
                    outstanding = again;
                    why
                }
            };
            if !held {
                held = true;
                // A lost or blocked link says so once, itself; a broker that
                // is up but slow (confirms or places late) is said here.
                let link_says_it = !matches!(self.publisher.link().link().phase(), Phase::Up);
                if link_says_it {
                    tracing::debug!(error = %why, "publishing is held back; the delivery waits");
                } else {
                    tracing::warn!(error = %why, waiting = outstanding.len(), "publishing is held back by a slow broker; the delivery waits and publishes what was not confirmed again");
                }
            }
            let give_up = started + hold_at_most;
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return Err(why),
                _ = self.receipt.lost() => return Err(why),
                _ = tokio::time::sleep_until(give_up) => return Err(why),
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

/// How long a stopping consumer waits for the broker to confirm the close
/// of each of its publishing channels (the host's stop is bounded).
const CHANNEL_CLOSE_LIMIT: Duration = Duration::from_secs(5);

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

/// What one attempt at publishing a batch's outstanding messages leaves.
#[derive(Debug)]
enum Left {
    /// Every message of the batch is confirmed.
    Nothing,
    /// Only the broker's trouble: these messages (positions in the batch)
    /// go out again once publishing is back; `why` is the batch's error.
    Held {
        again: Vec<usize>,
        why: PublishError,
    },
    /// A message failed on its own account (or some did while others met
    /// broker trouble): the batch fails, with the contract's sentence.
    Failed(PublishError),
}

/// What is left after `results`, the results of publishing the messages at
/// positions `outstanding` of a batch of `total` (the others were confirmed
/// by earlier attempts).
fn left_after(outstanding: &[usize], results: Vec<Result<(), PublishError>>, total: usize) -> Left {
    let whole = if outstanding.len() == total {
        results
    } else {
        let mut whole: Vec<Result<(), PublishError>> = vec![Ok(()); total];
        for (&position, result) in outstanding.iter().zip(results) {
            whole[position] = result;
        }
        whole
    };
    let again: Vec<usize> = whole
        .iter()
        .enumerate()
        .filter(|(_, r)| r.is_err())
        .map(|(position, _)| position)
        .collect();
    match crate::broker::publisher::batch_result(whole) {
        Ok(()) => Left::Nothing,
        Err(why) if why.is_broker_trouble() => Left::Held { again, why },
        Err(error) => Left::Failed(error),
    }
}

impl BrokerPort for OnBroker<'_> {
    async fn publish(&self, outputs: &[Publication]) -> Result<(), PublishError> {
        if outputs.is_empty() {
            return Ok(());
        }
        self.publish_holding(outputs).await?;
        // Delayed outputs go to the scheduler's exchange (see
        // `settle::output_publication`); nothing else of a handler does.
        let scheduled = outputs
            .iter()
            .filter(|o| o.exchange == crate::scheduler::EXCHANGE)
            .count();
        self.metrics.scheduled(scheduled);
        Ok(())
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

    async fn commit_state(&self) -> settle::StateCommitted {
        let Some(commit) = &self.commit else {
            return settle::StateCommitted::Ack { duplicate: false };
        };
        let outcome = commit
            .state
            .commit(
                commit.id,
                &commit.pending.changes,
                commit.pending.reservation.as_deref(),
                envelope::now_ms(),
            )
            .await;
        if matches!(outcome, settle::StateCommitted::Ack { .. }) {
            commit
                .committed
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        outcome
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

    fn declined(id: &str) -> Result<(), PublishError> {
        Err(PublishError::Declined {
            id: id.into(),
            exchange: "out".into(),
            routing_key: "k".into(),
            reason: "1000 publishes are already waiting for a confirm".into(),
        })
    }

    fn timed_out(id: &str) -> Result<(), PublishError> {
        Err(PublishError::Interrupted {
            id: id.into(),
            exchange: "out".into(),
            routing_key: "k".into(),
            reason: "no confirm came within 10s; the broker is not keeping up".into(),
        })
    }

    fn unroutable(id: &str) -> Result<(), PublishError> {
        Err(PublishError::Unroutable {
            id: id.into(),
            exchange: "out".into(),
            routing_key: "k".into(),
            reason: "no queue is bound to receive it".into(),
        })
    }

    #[test]
    fn only_what_the_broker_did_not_confirm_is_published_again() {
        // Messages 0 and 2 confirmed, 1 declined, 3 timed out.
        let first = vec![Ok(()), declined("m1"), Ok(()), timed_out("m3")];
        let Left::Held { again, why } = left_after(&[0, 1, 2, 3], first, 4) else {
            panic!("broker trouble holds the batch")
        };
        assert_eq!(again, [1, 3], "the confirmed ones are not sent again");
        assert!(why.is_broker_trouble());
        assert!(
            why.to_string()
                .starts_with("2 of 4 messages were not confirmed; 2 were."),
            "{why}"
        );
        // The next attempt publishes only 1 and 3; 3 still gets no confirm.
        let Left::Held { again, why } = left_after(&[1, 3], vec![Ok(()), timed_out("m3")], 4)
        else {
            panic!("still held")
        };
        assert_eq!(again, [3]);
        assert!(
            why.to_string()
                .starts_with("1 of 4 messages were not confirmed; 3 were."),
            "counted over the whole batch: {why}"
        );
        assert!(matches!(left_after(&[3], vec![Ok(())], 4), Left::Nothing));
    }

    #[test]
    fn a_message_that_fails_on_its_own_fails_the_batch_even_beside_broker_trouble() {
        let Left::Failed(error) = left_after(&[1, 3], vec![unroutable("m1"), declined("m3")], 4)
        else {
            panic!("an unroutable output is the batch's failure")
        };
        assert!(!error.is_broker_trouble());
        match error {
            PublishError::Batch {
                failed,
                total,
                confirmed,
                first,
                ..
            } => {
                assert_eq!((failed, total, confirmed), (2, 4, 2));
                assert!(matches!(*first, PublishError::Unroutable { .. }));
            }
            other => panic!("{other}"),
        }
        // A batch of one keeps its message's own error.
        assert!(matches!(
            left_after(&[0], vec![unroutable("m0")], 1),
            Left::Failed(PublishError::Unroutable { .. })
        ));
    }
}
