//! Carries out a delivery's settlement through a [`BrokerPort`], and
//! reports how it ended.
//!
//! Every path ends in exactly one ack or one requeue of the delivery: an
//! ack only after its work is confirmed (outputs published, or the copy to
//! a retry rung, `.dlq` or `.parked` confirmed), a requeue when that copy
//! could not be confirmed or shutdown interrupted a wait. What to do when a
//! step fails is not decided here but by [`follow_up`] (decide.rs); this
//! file only performs steps and notes what happened in a [`Report`], which
//! the pipeline counts in metrics once.
//!
//! The port is the settlement's whole view of the outside world (the
//! broker, the clock and the dice), so every path is unit-tested below with
//! a recording double, as `topology/apply.rs` tests declarations.

use std::time::{Duration, SystemTime};

use lapin::BasicProperties;

use super::decide::{ConsumeOutcome, DeliveryFacts, Setback, Settlement, follow_up};
use super::flow::{self, Flow};
use crate::broker::publisher::{Publication, PublishError, PublishOutcome};
use crate::envelope::{self, Envelope, Reply};
use crate::plugin::Outgoing;
use crate::retry::RetryPolicy;
use crate::scheduler;
use crate::trace::{DeliveryTrace, Published, TraceParent};

/// What carrying out a settlement needs from the broker (and the clock).
///
/// One port serves one delivery. Generic, not `dyn`: this is the hot path.
/// Crate-private: its futures' `Send` bounds are those of the one real
/// implementation, which the compiler sees at the call site.
pub(crate) trait BrokerPort {
    /// Publishes a handler's outputs (confirmed, mandatory): all of them
    /// confirmed, or the first failure.
    async fn publish(&self, outputs: &[Publication]) -> Result<(), PublishError>;
    /// Publishes the delivery's own body to `queue` through the default
    /// exchange (confirmed, mandatory).
    async fn republish(&self, queue: &str, properties: BasicProperties)
    -> Result<(), PublishError>;
    /// Acknowledges the delivery (its work is done).
    async fn ack(&self);
    /// Gives the delivery back to its queue.
    async fn requeue(&self);
    /// A stream delivery's requeue: neither acked nor requeued, it is read
    /// again from its offset (see `Settlement::ReadAgain`).
    fn read_again(&self);
    /// Waits `wait`, unless shutdown begins first.
    async fn wait(&self, wait: Duration) -> Waited;
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
    /// A uniform sample in [0, 1) for retry jitter.
    fn jitter_sample(&self) -> f64;
    /// The largest frame the broker accepts (negotiated): nothing whose
    /// properties exceed it may be published, or the broker closes the
    /// whole connection.
    fn frame_max(&self) -> u32;
    /// Commits the state an accept leaves (its writes and done record:
    /// `crate::state::consumer`), after its outputs are confirmed and
    /// before its ack. A consumer without state has nothing to commit.
    async fn commit_state(&self) -> StateCommitted {
        StateCommitted::Ack { duplicate: false }
    }
}

/// How an accept's state commit ended.
pub use crate::state::consumer::Outcome as StateCommitted;

/// How a [`BrokerPort::wait`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    Elapsed,
    ShutDown,
    /// The delivery's channel closed: the broker delivers it again.
    ChannelLost,
}

/// The delivery being settled, as the settlement reads it.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub queue: &'a str,
    pub envelope: &'a Envelope,
    /// The delivery's properties: every republish keeps them.
    pub properties: &'a BasicProperties,
    /// Whether outputs that do not say must reach a queue.
    pub mandatory_outputs: bool,
    /// It came from a stream: see [`DeliveryFacts::from_stream`].
    pub from_stream: bool,
    /// Its trace: whatever is published for it continues it.
    pub trace: &'a DeliveryTrace,
    /// Its request and routing slip (`flow.rs`).
    pub flow: &'a Flow,
}

/// Where a retried delivery waited (the `where` label of
/// `acemq.messages.retried.total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryPlace {
    Consumer,
    Broker,
    /// Given back to its queue at once, attempt unchanged.
    Requeued,
    /// A stream delivery left to be read again from its offset.
    ReadAgain,
    /// Another host holds a claim on it: republished after a wait, attempt
    /// unchanged.
    InProgress,
}

impl RetryPlace {
    pub const ALL: [RetryPlace; 5] = [
        RetryPlace::Consumer,
        RetryPlace::Broker,
        RetryPlace::Requeued,
        RetryPlace::ReadAgain,
        RetryPlace::InProgress,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RetryPlace::Consumer => "consumer",
            RetryPlace::Broker => "broker",
            RetryPlace::Requeued => "requeued",
            RetryPlace::ReadAgain => "read_again",
            RetryPlace::InProgress => "in_progress",
        }
    }
}

/// How one delivery's settlement went: everything metrics count about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The settlement that was carried out in the end.
    pub outcome: ConsumeOutcome,
    /// Set when the delivery was retried.
    pub retried: Option<RetryPlace>,
    /// Set when a copy went to `.dlq` or `.parked` (the outcome says which).
    pub set_aside: bool,
    /// Broker retries that found their rung missing, by rung.
    pub rung_missing: Option<String>,
    /// A set-aside copy that was not confirmed, by target queue.
    pub set_aside_failed: Option<String>,
    /// The handler's reply to the request was confirmed with its
    /// accept (the span's outcome is `answered`).
    pub answered: bool,
    /// It was done already (its envelope id's done record): acked without
    /// a call, or its commit found another run's.
    pub duplicate: bool,
}

impl Report {
    /// A delivery that ended in `outcome`, with nothing else to count yet.
    pub fn new(outcome: ConsumeOutcome) -> Self {
        Self {
            outcome,
            retried: None,
            set_aside: false,
            rung_missing: None,
            set_aside_failed: None,
            answered: false,
            duplicate: false,
        }
    }

    /// The span's outcome word: `answered` for a request answered (the
    /// contract's word, §11), else the settlement's.
    pub fn span_outcome(&self) -> &'static str {
        if self.answered {
            "answered"
        } else {
            self.outcome.as_str()
        }
    }
}

/// How long a delivery whose retry or set-aside copy failed waits before it
/// is requeued (or, from a stream, before the copy is tried again).
pub const PAUSE_BEFORE_REQUEUE: Duration = Duration::from_secs(1);
/// The longest pause between tries of a stream delivery's set-aside: each
/// failure in a row doubles the pause up to this.
pub const LONGEST_PAUSE: Duration = Duration::from_secs(30);

/// A step that settled the delivery, and what it adds to the report.
enum Done {
    Acked,
    /// Acked as done already.
    Duplicate,
    /// Acked, its reply confirmed.
    Answered,
    Retried(RetryPlace),
    SetAside,
}

/// Carries out `settlement`, and whatever [`follow_up`] decides when a step
/// of it fails, until the delivery is acked or requeued.
pub(crate) async fn settle(
    port: &impl BrokerPort,
    subject: Subject<'_>,
    policy: &RetryPolicy,
    settlement: Settlement,
) -> Report {
    let mut report = Report::new(settlement.outcome());
    let mut settlement = settlement;
    let mut pause = PAUSE_BEFORE_REQUEUE;
    loop {
        match carry_out(port, subject, &mut settlement).await {
            Ok(done) => {
                report.outcome = settlement.outcome();
                match done {
                    Done::Acked => {}
                    Done::Duplicate => report.duplicate = true,
                    Done::Answered => report.answered = true,
                    Done::Retried(place) => report.retried = Some(place),
                    Done::SetAside => report.set_aside = true,
                }
                return report;
            }
            Err(setback) => {
                match (&setback, &settlement) {
                    (Setback::RungMissing, Settlement::RetryInBroker { rung, .. }) => {
                        report.rung_missing = Some(rung.clone());
                    }
                    (Setback::SetAsideFailed(_), Settlement::DeadLetter { queue, .. })
                    | (Setback::SetAsideFailed(_), Settlement::Park { queue, .. }) => {
                        report.set_aside_failed = Some(queue.clone());
                    }
                    _ => {}
                }
                let setback = if matches!(
                    setback,
                    Setback::SetAsideFailed(_)
                        | Setback::RetryNotPublished(_)
                        | Setback::StoreTrouble(_)
                ) {
                    // A copy the broker did not take (a deleted `.dlq`, a
                    // rung that refuses it) will likely fail again at once:
                    // the delivery pauses before it is requeued (or, from a
                    // stream, tried again), so that it does not spin.
                    let waited = port.wait(pause).await;
                    pause = (pause * 2).min(LONGEST_PAUSE);
                    match waited {
                        Waited::Elapsed => setback,
                        Waited::ShutDown => Setback::ShutdownDuringWait,
                        Waited::ChannelLost => Setback::BrokerTrouble(
                            "its channel closed while it waited to be set aside again".to_string(),
                        ),
                    }
                } else {
                    setback
                };
                let facts = DeliveryFacts {
                    queue: subject.queue,
                    envelope: subject.envelope,
                    now_ms: port.now_ms(),
                    jitter_sample: port.jitter_sample(),
                    from_stream: subject.from_stream,
                };
                // Never an accept again, and a requeue cannot fail: this ends.
                settlement = follow_up(facts, &settlement, setback, policy);
            }
        }
    }
}

/// One attempt at a settlement: it settled the delivery, or it hit a setback.
///
/// An accept's outputs are moved out of it (their bodies are not copied);
/// a failed accept is followed up without them.
///
/// The settlements other than an accept, a give-back and a duplicate's ack
/// are boxed: each one's future is kilobytes (a republish and its
/// confirm), and inline the largest of them sized this future, and so every
/// delivery's, which each `.await` up the chain copies whole. Those are the
/// failure paths, where one allocation is nothing beside a republish
/// (docs/benchmarks.md, "What a delivery's future costs").
async fn carry_out(
    port: &impl BrokerPort,
    subject: Subject<'_>,
    settlement: &mut Settlement,
) -> Result<Done, Setback> {
    if matches!(
        settlement,
        Settlement::DeadLetter { .. } | Settlement::Park { .. }
    ) {
        Box::pin(answer_with_error(port, subject, settlement)).await?;
    }
    match settlement {
        Settlement::Accept {
            outputs,
            version,
            reply,
        } => {
            accept(
                port,
                subject,
                std::mem::take(outputs),
                reply.take().map(|reply| *reply),
                version,
            )
            .await
        }
        Settlement::RetryInConsumer { wait, reason } => {
            Box::pin(retry_in_consumer(port, subject, *wait, reason)).await
        }
        Settlement::RetryInBroker { rung, reason, .. } => {
            Box::pin(retry_in_broker(port, subject, rung, reason)).await
        }
        Settlement::DeadLetter {
            queue: target,
            reason,
            ..
        }
        | Settlement::Park {
            queue: target,
            reason,
        } => Box::pin(set_aside(port, subject, target, reason)).await,
        Settlement::Requeue { why } | Settlement::ReadAgain { why } => {
            Ok(give_back(port, subject, why).await)
        }
        Settlement::Duplicate => {
            port.ack().await;
            tracing::debug!(queue = subject.queue, message_id = %subject.envelope.id, "done already; acked without a call");
            Ok(Done::Duplicate)
        }
        Settlement::InProgress { wait, reason } => {
            Box::pin(in_progress(port, subject, *wait, reason)).await
        }
    }
}

/// Waits `wait` in the consumer, then republishes the delivery to its own
/// queue as it came (attempt unchanged: being claimed elsewhere is not a
/// failure), then acks. A stream delivery is read again after the wait.
async fn in_progress(
    port: &impl BrokerPort,
    subject: Subject<'_>,
    wait: Duration,
    reason: &str,
) -> Result<Done, Setback> {
    let (queue, id) = (subject.queue, &subject.envelope.id);
    wait_in_consumer(port, wait, "while it waited on another host's claim").await?;
    if subject.from_stream {
        return Ok(give_back(port, subject, reason).await);
    }
    let span = subject.trace.publish_span();
    let properties = subject.trace.stamp(subject.properties.clone(), &span);
    if let Err(e) = republish(port, subject, queue, properties, span).await {
        log_publish_failure(queue, id, "in-progress republish failed; requeueing", &e);
        return Err(broker_trouble_or(e, Setback::RetryNotPublished));
    }
    port.ack().await;
    tracing::info!(queue, message_id = %id, trace_id = %subject.trace.trace_id(), reason, "claimed by another host; republished to wait its turn");
    Ok(Done::Retried(RetryPlace::InProgress))
}

/// Publishes the handler's outputs, its reply and the slip's next hop, as
/// one confirmed batch, then acks.
async fn accept(
    port: &impl BrokerPort,
    subject: Subject<'_>,
    outputs: Vec<Outgoing>,
    reply: Option<Reply>,
    version: &str,
) -> Result<Done, Setback> {
    let (queue, id) = (subject.queue, &subject.envelope.id);
    let (now_ms, frame_max) = (port.now_ms(), port.frame_max());
    let (mut publications, mut spans) =
        output_publications(subject, outputs, now_ms, frame_max).map_err(Setback::OutputsFailed)?;
    // The reply and the hop go in the outputs' batch: all of them are
    // confirmed, or the accept fails and the delivery is not acked.
    let answered = match (reply, &subject.flow.request) {
        (Some(reply), Some(request)) => {
            let span = subject.trace.publish_span();
            publications.push(
                flow::reply_publication(subject, request, reply, version, now_ms, frame_max, &span)
                    .map_err(Setback::OutputsFailed)?,
            );
            spans.push(span);
            true
        }
        // Refused before it came here (`flow::refuse_unanswerable`).
        (Some(_), None) | (None, _) => false,
    };
    let span = subject.trace.publish_span();
    if let Some(hop) =
        flow::hop_publication(subject, now_ms, frame_max, &span).map_err(Setback::OutputsFailed)?
    {
        publications.push(hop);
        spans.push(span);
    }
    let started = subject.trace.span_start();
    let published = port.publish(&publications).await;
    for (publication, span) in publications.iter().zip(spans) {
        publish_span(subject, span, publication, started, &published);
    }
    if let Err(e) = published {
        log_publish_failure(queue, id, "outputs were not confirmed", &e);
        return Err(broker_trouble_or(e, Setback::OutputsFailed));
    }
    let duplicate = match port.commit_state().await {
        StateCommitted::Ack { duplicate } => duplicate,
        StateCommitted::Refused(why) => {
            tracing::warn!(queue, message_id = %id, error = %why, "its state was not committed; the input fails");
            return Err(Setback::StateRefused(why));
        }
        StateCommitted::Unavailable(why) => {
            tracing::warn!(queue, message_id = %id, error = %why, "its state could not be committed now; the input waits");
            return Err(Setback::StoreTrouble(why));
        }
    };
    port.ack().await;
    tracing::debug!(queue, message_id = %id, answered, duplicate, "acked");
    Ok(match (answered, duplicate) {
        (true, _) => Done::Answered,
        (false, true) => Done::Duplicate,
        (false, false) => Done::Acked,
    })
}

/// Answers a request that `settlement` sets aside with the error reply,
/// before its set-aside copy: a reply not confirmed fails the set-aside
/// (the delivery is requeued, nothing acked), and a copy that fails after
/// the reply makes the next try answer again, with the same id.
async fn answer_with_error(
    port: &impl BrokerPort,
    subject: Subject<'_>,
    settlement: &Settlement,
) -> Result<(), Setback> {
    let span = subject.trace.publish_span();
    let Some(reply) =
        flow::error_reply_publication(subject, settlement, port.now_ms(), port.frame_max(), &span)
    else {
        return Ok(());
    };
    let started = subject.trace.span_start();
    let published = port.publish(std::slice::from_ref(&reply)).await;
    publish_span(subject, span, &reply, started, &published);
    published.map_err(|e| {
        let (queue, id) = (subject.queue, &subject.envelope.id);
        log_publish_failure(queue, id, "the error reply was not confirmed", &e);
        broker_trouble_or(e, Setback::SetAsideFailed)
    })
}

/// Holds the delivery `wait` in the consumer; shutdown, or its channel
/// closing (`when` says during what), ends the wait as a setback.
async fn wait_in_consumer(
    port: &impl BrokerPort,
    wait: Duration,
    when: &str,
) -> Result<(), Setback> {
    match port.wait(wait).await {
        Waited::Elapsed => Ok(()),
        Waited::ShutDown => Err(Setback::ShutdownDuringWait),
        Waited::ChannelLost => Err(Setback::BrokerTrouble(format!("its channel closed {when}"))),
    }
}

/// Waits `wait` in the consumer, republishes the delivery to its own queue
/// with the attempt advanced, then acks.
async fn retry_in_consumer(
    port: &impl BrokerPort,
    subject: Subject<'_>,
    wait: Duration,
    reason: &str,
) -> Result<Done, Setback> {
    let (queue, id) = (subject.queue, &subject.envelope.id);
    // Checked before the wait: a copy that cannot be sent is not worth
    // waiting for.
    let (properties, span) = retry_copy(subject, port.frame_max())?;
    wait_in_consumer(port, wait, "during the retry wait").await?;
    if let Err(e) = republish(port, subject, queue, properties, span).await {
        log_publish_failure(queue, id, "retry republish failed; requeueing", &e);
        return Err(broker_trouble_or(e, Setback::RetryNotPublished));
    }
    port.ack().await;
    tracing::info!(queue, message_id = %id, trace_id = %subject.trace.trace_id(), wait_ms = wait.as_millis() as u64, reason, "retried after waiting in the consumer");
    Ok(Done::Retried(RetryPlace::Consumer))
}

/// Republishes the delivery to its retry `rung`, then acks.
async fn retry_in_broker(
    port: &impl BrokerPort,
    subject: Subject<'_>,
    rung: &str,
    reason: &str,
) -> Result<Done, Setback> {
    let (queue, id) = (subject.queue, &subject.envelope.id);
    let (properties, span) = retry_copy(subject, port.frame_max())?;
    match republish(port, subject, rung, properties, span).await {
        Ok(()) => {
            port.ack().await;
            tracing::info!(queue, message_id = %id, trace_id = %subject.trace.trace_id(), rung = %rung, reason = %reason, "retrying through the broker");
            Ok(Done::Retried(RetryPlace::Broker))
        }
        Err(PublishError::Unroutable { .. }) => {
            tracing::warn!(queue, rung = %rung, "retry rung missing; waiting in the consumer instead");
            Err(Setback::RungMissing)
        }
        Err(e) => {
            log_publish_failure(queue, id, "retry republish failed; requeueing", &e);
            Err(broker_trouble_or(e, Setback::RetryNotPublished))
        }
    }
}

/// Republishes the delivery to `target` (its `.dlq` or `.parked`) with its
/// reason, then acks.
async fn set_aside(
    port: &impl BrokerPort,
    subject: Subject<'_>,
    target: &str,
    reason: &str,
) -> Result<Done, Setback> {
    let (queue, id) = (subject.queue, &subject.envelope.id);
    let Some((properties, span)) = set_aside_copy(subject, reason, port.frame_max()) else {
        tracing::error!(queue, message_id = %id, trace_id = %subject.trace.trace_id(), to = %target, "even its envelope alone is too big for a frame; requeueing");
        return Err(Setback::SetAsideFailed(
            "even its envelope alone is too big for the broker's frame".to_string(),
        ));
    };
    if let Err(e) = republish(port, subject, target, properties, span).await {
        log_publish_failure(
            queue,
            id,
            &format!("set-aside publish to {target} failed; requeueing"),
            &e,
        );
        return Err(broker_trouble_or(e, Setback::SetAsideFailed));
    }
    port.ack().await;
    tracing::warn!(queue, message_id = %id, trace_id = %subject.trace.trace_id(), to = %target, reason = %reason, "set aside");
    Ok(Done::SetAside)
}

/// Gives the delivery back: requeued, or, from a stream, left to be read
/// again.
async fn give_back(port: &impl BrokerPort, subject: Subject<'_>, why: &str) -> Done {
    let (queue, id) = (subject.queue, &subject.envelope.id);
    // Decided for queues only (see decide::follow_up); a stream delivery
    // that got here anyway is read again, never requeued.
    if subject.from_stream {
        port.read_again();
        tracing::info!(queue, message_id = %id, why = %why, "left to be read again from its stream offset");
        return Done::Retried(RetryPlace::ReadAgain);
    }
    port.requeue().await;
    tracing::debug!(queue, message_id = %id, why = %why, "requeued");
    Done::Retried(RetryPlace::Requeued)
}

/// Logs a publish that failed: a warning, unless the broker or the
/// connection is in trouble, which the connection's link logs once; a line
/// per delivery would bury that one.
fn log_publish_failure(queue: &str, id: &str, what: &str, error: &PublishError) {
    if error.is_broker_trouble() {
        tracing::debug!(queue, message_id = %id, error = %error, "{what}");
    } else {
        tracing::warn!(queue, message_id = %id, error = %error, "{what}");
    }
}

/// A publish that failed because of the broker or the connection (declined
/// or interrupted) is held apart from one that failed on its own: it does
/// not count against the message.
fn broker_trouble_or(error: PublishError, otherwise: fn(String) -> Setback) -> Setback {
    if error.is_broker_trouble() {
        Setback::BrokerTrouble(error.to_string())
    } else {
        otherwise(error.to_string())
    }
}

/// The properties of the retry copy, when they fit a frame of `frame_max`,
/// and the span that publishes it (its `traceparent`).
fn retry_copy(
    subject: Subject<'_>,
    frame_max: u32,
) -> Result<(BasicProperties, TraceParent), Setback> {
    let span = subject.trace.publish_span();
    let traced = subject.trace.stamp(subject.properties.clone(), &span);
    let properties = envelope::retry_properties(&traced, subject.envelope);
    envelope::check_frame(&properties, frame_max)
        .map_err(|e| Setback::RetryTooLarge(e.to_string()))?;
    Ok((properties, span))
}

/// The properties of the set-aside copy (its envelope and `reason`, within
/// a frame of `frame_max`: see [`envelope::set_aside_within_frame`]), and
/// the span that publishes it; `None` when not even the envelope fits.
fn set_aside_copy(
    subject: Subject<'_>,
    reason: &str,
    frame_max: u32,
) -> Option<(BasicProperties, TraceParent)> {
    let span = subject.trace.publish_span();
    let traced = subject.trace.stamp(subject.properties.clone(), &span);
    let properties =
        envelope::set_aside_within_frame(&traced, subject.envelope, reason, frame_max)?;
    Some((properties, span))
}

/// Each output as a publication (see [`output_publication`]), with the span
/// that publishes it.
fn output_publications(
    subject: Subject<'_>,
    outputs: Vec<Outgoing>,
    now_ms: u64,
    frame_max: u32,
) -> Result<(Vec<Publication>, Vec<TraceParent>), String> {
    let mut spans = Vec::with_capacity(outputs.len());
    let publications = outputs
        .into_iter()
        .map(|o| {
            let span = subject.trace.publish_span();
            let publication = output_publication(subject, o, now_ms, frame_max, &span);
            spans.push(span);
            publication
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((publications, spans))
}

/// Republishes the delivery to `queue` with `properties`, in `span`.
async fn republish(
    port: &impl BrokerPort,
    subject: Subject<'_>,
    queue: &str,
    properties: BasicProperties,
    span: TraceParent,
) -> Result<(), PublishError> {
    let started = subject.trace.span_start();
    let id = properties.message_id().as_ref().map(|id| id.to_string());
    let result = port.republish(queue, properties).await;
    subject.trace.published(Published {
        span,
        exchange: "",
        routing_key: queue,
        message_id: id.as_deref(),
        started,
        outcome: PublishOutcome::of(&result).as_str(),
    });
    result
}

/// Ends the span of one output's publish, which `result` (its batch's) ended.
fn publish_span(
    subject: Subject<'_>,
    span: TraceParent,
    publication: &Publication,
    started: SystemTime,
    result: &Result<(), PublishError>,
) {
    subject.trace.published(Published {
        span,
        exchange: &publication.exchange,
        routing_key: &publication.routing_key,
        message_id: publication
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str()),
        started,
        outcome: PublishOutcome::of(result).as_str(),
    });
}

/// The AMQP properties a plugin's output goes out with: a new AceMQ
/// message caused by the delivery whose envelope is `parent` (the `x-acemq-*`
/// headers after the plugin's own), then `added`: the trace's headers on
/// the broker, none in `plugin run`, which shows the rest as a host
/// publishes it.
pub fn output_properties(
    parent: &Envelope,
    output: &Outgoing,
    now_ms: u64,
    added: impl IntoIterator<Item = (lapin::types::ShortString, lapin::types::AMQPValue)>,
) -> Result<lapin::BasicProperties, String> {
    let child = Envelope::output_of(
        parent,
        &output.envelope,
        &output.routing_key,
        envelope::default_origin(),
        now_ms,
    );
    envelope::outgoing_properties(
        &child,
        output.content_type.as_deref(),
        output.persistent,
        &output.headers,
        added,
    )
    .map_err(|e| e.to_string())
}

/// A plugin's output as a new AceMQ message caused by the delivery, with
/// the envelope fields settled when it was buffered (its id above all, the
/// one `publish` answered: see [`Envelope::output_of`]); refused when its
/// properties would not fit a frame of `frame_max` bytes.
fn output_publication(
    subject: Subject<'_>,
    output: Outgoing,
    now_ms: u64,
    frame_max: u32,
    span: &TraceParent,
) -> Result<Publication, String> {
    let properties = output_properties(
        subject.envelope,
        &output,
        now_ms,
        subject.trace.headers(span),
    )?;
    let publication = Publication {
        exchange: output.exchange,
        routing_key: output.routing_key,
        body: bytes::Bytes::from(output.body),
        properties,
        mandatory: output.mandatory.unwrap_or(subject.mandatory_outputs),
    };
    let too_large = |e: envelope::FrameTooSmall, publication: &Publication| {
        format!(
            "the output to exchange '{}' with key '{}' cannot be published: {e}",
            publication.exchange, publication.routing_key
        )
    };
    // For later: the same message, sent through the scheduler (its final
    // delivery is mandatory, as every scheduler publish is). The frame is
    // checked with the scheduler's headers on.
    if let Some(due_at_ms) = output.deliver_at_ms {
        let scheduled = scheduler::wire::scheduled(publication.clone(), due_at_ms, now_ms);
        envelope::check_frame(&scheduled.properties, frame_max)
            .map_err(|e| too_large(e, &publication))?;
        return Ok(scheduled);
    }
    envelope::check_frame(&publication.properties, frame_max)
        .map_err(|e| too_large(e, &publication))?;
    Ok(publication)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use lapin::types::{AMQPValue, FieldTable, LongString};

    use super::*;
    use crate::delivery::decide::decide;
    use crate::delivery::plugins::PluginRun;
    use crate::plugin::Outcome;

    const NOW_MS: u64 = 1_700_000_100_000;
    const FIRST_SEEN_MS: u64 = 1_700_000_000_000;

    /// What the settlement asked of the port, in order.
    #[derive(Debug, Clone, PartialEq)]
    enum Call {
        /// (exchange, routing key, envelope read back) of each output.
        Publish(Vec<(String, String, Envelope)>),
        /// Target queue, and the envelope read back off the properties.
        Republish(String, Box<Envelope>),
        Ack,
        Requeue,
        ReadAgain,
        Wait(Duration),
    }

    /// A port that records every call and fails where it is told to.
    #[derive(Default)]
    struct Recorder {
        calls: Mutex<Vec<Call>>,
        /// Every output publish fails with this.
        publish_fails: Option<PublishError>,
        /// Republishes to these queues fail with these.
        republish_fails: BTreeMap<String, PublishError>,
        /// When set, only this many republishes fail (then they land).
        republish_fails_times: Option<Mutex<usize>>,
        /// Shutdown begins during any wait.
        shutting_down: bool,
        /// The broker's frame size; RabbitMQ's default when unset.
        frame_max: Option<u32>,
        /// The `mandatory` flag of every output published, in order.
        mandatory: Mutex<Vec<bool>>,
        /// Every publication of `publish`, whole, in order.
        publications: Mutex<Vec<Publication>>,
        /// What the state commit of an accept answers (acked when unset).
        commit: Option<StateCommitted>,
    }

    impl Recorder {
        fn calls(&self) -> Vec<Call> {
            self.calls.lock().unwrap().clone()
        }

        fn record(&self, call: Call) {
            self.calls.lock().unwrap().push(call);
        }
    }

    fn read_back(properties: &BasicProperties) -> Envelope {
        Envelope::read(properties, "", NOW_MS)
    }

    impl BrokerPort for Recorder {
        async fn publish(&self, outputs: &[Publication]) -> Result<(), PublishError> {
            self.mandatory
                .lock()
                .unwrap()
                .extend(outputs.iter().map(|p| p.mandatory));
            self.publications
                .lock()
                .unwrap()
                .extend(outputs.iter().cloned());
            self.record(Call::Publish(
                outputs
                    .iter()
                    .map(|p| {
                        (
                            p.exchange.clone(),
                            p.routing_key.clone(),
                            read_back(&p.properties),
                        )
                    })
                    .collect(),
            ));
            self.publish_fails.clone().map_or(Ok(()), Err)
        }

        async fn republish(
            &self,
            queue: &str,
            properties: BasicProperties,
        ) -> Result<(), PublishError> {
            self.record(Call::Republish(
                queue.to_string(),
                Box::new(read_back(&properties)),
            ));
            if let Some(left) = &self.republish_fails_times {
                let mut left = left.lock().unwrap();
                if *left == 0 {
                    return Ok(());
                }
                *left -= 1;
            }
            self.republish_fails.get(queue).cloned().map_or(Ok(()), Err)
        }

        async fn ack(&self) {
            self.record(Call::Ack);
        }

        async fn requeue(&self) {
            self.record(Call::Requeue);
        }

        fn read_again(&self) {
            self.record(Call::ReadAgain);
        }

        async fn wait(&self, wait: Duration) -> Waited {
            self.record(Call::Wait(wait));
            if self.shutting_down {
                Waited::ShutDown
            } else {
                Waited::Elapsed
            }
        }

        fn now_ms(&self) -> u64 {
            NOW_MS
        }

        fn jitter_sample(&self) -> f64 {
            0.5
        }

        fn frame_max(&self) -> u32 {
            self.frame_max.unwrap_or(131_072)
        }

        async fn commit_state(&self) -> StateCommitted {
            self.commit
                .clone()
                .unwrap_or(StateCommitted::Ack { duplicate: false })
        }
    }

    /// A delivery at `attempt` with an application header and a content type.
    fn delivered(attempt: u32) -> (Envelope, BasicProperties) {
        let mut envelope = Envelope::new("order.created", "acemq@test", FIRST_SEEN_MS);
        envelope.id = "message-1".into();
        envelope.correlation_id = "correlation-1".into();
        envelope.attempt = attempt;
        let mut app = FieldTable::default();
        app.insert(
            "traceparent".into(),
            AMQPValue::LongString(LongString::from("00-trace-01")),
        );
        let properties = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_headers(envelope.to_headers(&app));
        (read_back(&properties), properties)
    }

    fn output(exchange: &str, routing_key: &str) -> Outgoing {
        Outgoing {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            body: b"{}".to_vec(),
            content_type: None,
            headers: vec![],
            envelope: envelope::OutputFields::with_id(uuid::Uuid::new_v4().to_string()),
            persistent: true,
            mandatory: None,
            deliver_at_ms: None,
        }
    }

    fn decided(outcome: Outcome, outputs: Vec<Outgoing>) -> PluginRun {
        PluginRun::Decided {
            outcome,
            outputs,
            version: "v1".into(),
            fuel: None,
            reply: None,
        }
    }

    fn retry(reason: &str) -> PluginRun {
        decided(Outcome::Retry(reason.into()), vec![])
    }

    fn unroutable(routing_key: &str) -> PublishError {
        PublishError::Unroutable {
            id: "m1".into(),
            exchange: String::new(),
            routing_key: routing_key.into(),
            reason: "no queue is bound to receive it".into(),
        }
    }

    /// Decides and settles one delivery at `attempt` against `port`.
    async fn run(
        port: &Recorder,
        attempt: u32,
        plugins: PluginRun,
        policy: &RetryPolicy,
    ) -> Report {
        let (envelope, _) = delivered(attempt);
        let facts = DeliveryFacts {
            queue: "orders.new",
            envelope: &envelope,
            now_ms: NOW_MS,
            jitter_sample: 0.5,
            from_stream: false,
        };
        let settlement = decide(facts, plugins, policy);
        let report = settle_delivered(port, attempt, policy, settlement).await;
        let settled = port
            .calls()
            .iter()
            .filter(|c| matches!(c, Call::Ack | Call::Requeue))
            .count();
        assert_eq!(settled, 1, "exactly one ack or requeue: {:?}", port.calls());
        report
    }

    /// Like [`run`], for a delivery from a stream: it ends in exactly one
    /// ack or read again, and is never requeued.
    async fn run_on_stream(port: &Recorder, plugins: PluginRun) -> Report {
        let (envelope, properties) = delivered(1);
        let facts = DeliveryFacts {
            queue: "orders.new",
            envelope: &envelope,
            now_ms: NOW_MS,
            jitter_sample: 0.5,
            from_stream: true,
        };
        let policy = RetryPolicy::none();
        let settlement = decide(facts, plugins, &policy);
        let subject = Subject {
            queue: "orders.new",
            envelope: &envelope,
            properties: &properties,
            mandatory_outputs: true,
            from_stream: true,
            trace: &untraced(),
            flow: &Flow::default(),
        };
        let report = settle(port, subject, &policy, settlement).await;
        let calls = port.calls();
        assert!(!calls.contains(&Call::Requeue), "never requeued: {calls:?}");
        let settled = calls
            .iter()
            .filter(|c| matches!(c, Call::Ack | Call::ReadAgain))
            .count();
        assert_eq!(settled, 1, "exactly one ack or read again: {calls:?}");
        report
    }

    /// The one copy the settlement republished to `queue` before its ack,
    /// read back; panics naming the calls when that is not what happened.
    fn copy_to(port: &Recorder, queue: &str) -> Envelope {
        match &port.calls()[..] {
            [Call::Republish(target, copy), Call::Ack] if target == queue => (**copy).clone(),
            calls => panic!("expected one republish to {queue}, then an ack; got {calls:?}"),
        }
    }

    /// A delivery's trace when nothing is exported.
    fn untraced() -> DeliveryTrace {
        DeliveryTrace::start(&std::sync::Arc::new(crate::trace::Tracer::off()), None)
    }

    /// Retries stay in the consumer up to 30 s, then use rungs; no jitter.
    fn policy() -> RetryPolicy {
        RetryPolicy::exponential(6, Duration::from_secs(10), Duration::from_secs(300))
            .with_jitter(0.0)
    }

    #[tokio::test]
    async fn accept_publishes_every_output_as_a_child_then_acks() {
        let port = Recorder::default();
        let outputs = vec![
            output("orders.events", "order.accepted"),
            output("audit", "order.seen"),
        ];
        let r = run(&port, 1, decided(Outcome::Accept, outputs), &policy()).await;
        assert_eq!(r, Report::new(ConsumeOutcome::Acked));
        let (parent, _) = delivered(1);
        let calls = port.calls();
        let [Call::Publish(published), Call::Ack] = &calls[..] else {
            panic!("publish then ack, got {calls:?}");
        };
        let routes: Vec<_> = published
            .iter()
            .map(|(e, k, _)| (e.as_str(), k.as_str()))
            .collect();
        assert_eq!(
            routes,
            [("orders.events", "order.accepted"), ("audit", "order.seen")]
        );
        for (_, key, child) in published {
            assert_eq!(child.causation_id.as_deref(), Some(parent.id.as_str()));
            assert_eq!(child.correlation_id, parent.correlation_id);
            assert_eq!(
                &child.message_type, key,
                "the type defaults to the routing key"
            );
            assert_eq!(child.attempt, 1);
            assert_eq!(child.first_seen_ms, NOW_MS);
        }
    }

    #[tokio::test]
    async fn an_output_must_reach_a_queue_as_it_says_or_as_its_consumer_says() {
        let outputs = || {
            let mut optional = output("orders.events", "maybe");
            optional.mandatory = Some(false);
            let mut required = output("orders.events", "surely");
            required.mandatory = Some(true);
            vec![output("orders.events", "unsaid"), optional, required]
        };
        for consumer_default in [true, false] {
            let port = Recorder::default();
            let (envelope, properties) = delivered(1);
            let subject = Subject {
                queue: "orders.new",
                envelope: &envelope,
                properties: &properties,
                mandatory_outputs: consumer_default,
                from_stream: false,
                trace: &untraced(),
                flow: &Flow::default(),
            };
            let settlement = crate::delivery::decide::decide(
                DeliveryFacts {
                    queue: "orders.new",
                    envelope: &envelope,
                    now_ms: NOW_MS,
                    jitter_sample: 0.0,
                    from_stream: false,
                },
                decided(Outcome::Accept, outputs()),
                &policy(),
            );
            settle(&port, subject, &policy(), settlement).await;
            assert_eq!(
                *port.mandatory.lock().unwrap(),
                [consumer_default, false, true],
                "consumer default {consumer_default}"
            );
        }
    }

    /// The id settled when the output was buffered (the one `publish`
    /// answered the plugin) is the one published, with the fields chosen.
    #[tokio::test]
    async fn an_output_is_published_with_the_id_and_fields_it_was_buffered_with() {
        let port = Recorder::default();
        let mut chosen = output("orders.events", "a");
        chosen.envelope = envelope::OutputFields {
            id: "6f1c0c1e-3b5a-4c8e-9d2f-0a1b2c3d4e5f".into(),
            message_type: Some("invoice.raised".into()),
            version: Some(3),
            correlation_id: Some("conversation-9".into()),
            causation_id: Some("cause-7".into()),
        };
        let defaulted = output("orders.events", "b");
        let default_id = defaulted.envelope.id.clone();
        run(
            &port,
            1,
            decided(Outcome::Accept, vec![chosen, defaulted]),
            &policy(),
        )
        .await;
        let calls = port.calls();
        let [Call::Publish(published), Call::Ack] = &calls[..] else {
            panic!("publish then ack, got {calls:?}");
        };
        let (parent, _) = delivered(1);
        let (first, second) = (&published[0].2, &published[1].2);
        assert_eq!(first.id, "6f1c0c1e-3b5a-4c8e-9d2f-0a1b2c3d4e5f");
        assert_eq!(first.message_type, "invoice.raised");
        assert_eq!(first.version, 3);
        assert_eq!(first.correlation_id, "conversation-9");
        assert_eq!(first.causation_id.as_deref(), Some("cause-7"));
        assert_eq!(second.id, default_id);
        assert_eq!(second.message_type, "b");
        assert_eq!(second.version, 1);
        assert_eq!(second.correlation_id, parent.correlation_id);
        assert_eq!(second.causation_id.as_deref(), Some(parent.id.as_str()));
    }

    #[tokio::test]
    async fn an_output_the_broker_refused_turns_the_accept_into_a_retry() {
        let port = Recorder {
            publish_fails: Some(PublishError::Unroutable {
                id: "m1".into(),
                exchange: "orders.events".into(),
                routing_key: "nowhere".into(),
                reason: "no queue is bound to receive it".into(),
            }),
            ..Recorder::default()
        };
        let accepted = decided(Outcome::Accept, vec![output("orders.events", "nowhere")]);
        let r = run(&port, 1, accepted, &policy()).await;
        assert_eq!(
            r,
            Report {
                retried: Some(RetryPlace::Consumer),
                ..Report::new(ConsumeOutcome::Retried)
            }
        );
        let calls = port.calls();
        assert!(matches!(calls[0], Call::Publish(_)), "{calls:?}");
        assert_eq!(calls[1], Call::Wait(Duration::from_secs(10)));
        let Call::Republish(queue, copy) = &calls[2] else {
            panic!("a retry republish, got {calls:?}");
        };
        assert_eq!((queue.as_str(), copy.attempt), ("orders.new", 2));
        assert_eq!(calls[3..], [Call::Ack]);
    }

    #[tokio::test]
    async fn an_output_with_a_reserved_header_is_never_published() {
        let port = Recorder::default();
        let mut bad = output("orders.events", "order.accepted");
        bad.headers = vec![(
            "x-acemq-attempt".into(),
            crate::envelope::HeaderValue::Int(9),
        )];
        let r = run(
            &port,
            1,
            decided(Outcome::Accept, vec![bad]),
            &RetryPolicy::none(),
        )
        .await;
        assert_eq!(
            r,
            Report {
                set_aside: true,
                ..Report::new(ConsumeOutcome::DeadLettered)
            }
        );
        let copy = copy_to(&port, "orders.new.dlq");
        let error = copy.error.as_deref().unwrap_or_default();
        assert!(
            error.starts_with("exhausted 1 attempt: publishing its outputs failed: ")
                && error.contains("x-acemq-attempt"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_short_retry_waits_in_the_consumer_then_republishes_to_its_queue() {
        let port = Recorder::default();
        let r = run(&port, 1, retry("db down"), &policy()).await;
        assert_eq!(
            r,
            Report {
                retried: Some(RetryPlace::Consumer),
                ..Report::new(ConsumeOutcome::Retried)
            }
        );
        let calls = port.calls();
        assert_eq!(calls[0], Call::Wait(Duration::from_secs(10)));
        let Call::Republish(queue, copy) = &calls[1] else {
            panic!("{calls:?}");
        };
        let (original, _) = delivered(1);
        assert_eq!(queue, "orders.new");
        assert_eq!(copy.attempt, 2);
        assert_eq!(copy.id, original.id, "a retry is the same message");
        assert_eq!(copy.first_seen_ms, FIRST_SEEN_MS);
        assert_eq!(copy.error, None);
        assert_eq!(calls[2..], [Call::Ack]);
    }

    /// Settles `settlement` for the delivery of `attempt` on `port`.
    async fn settle_delivered(
        port: &Recorder,
        attempt: u32,
        policy: &RetryPolicy,
        settlement: Settlement,
    ) -> Report {
        let (envelope, properties) = delivered(attempt);
        let subject = Subject {
            queue: "orders.new",
            envelope: &envelope,
            properties: &properties,
            mandatory_outputs: true,
            from_stream: false,
            trace: &untraced(),
            flow: &Flow::default(),
        };
        settle(port, subject, policy, settlement).await
    }

    /// Settles `settlement` for a first attempt on `port`.
    async fn settle_first(port: &Recorder, settlement: Settlement) -> Report {
        settle_delivered(port, 1, &policy(), settlement).await
    }

    #[tokio::test]
    async fn an_input_claimed_elsewhere_waits_then_is_republished_as_it_came() {
        let port = Recorder::default();
        let wait = Duration::from_secs(5);
        let settlement = Settlement::InProgress {
            wait,
            reason: "in progress: host-b holds a claim on it".into(),
        };
        let r = settle_first(&port, settlement).await;
        assert_eq!(
            r,
            Report {
                retried: Some(RetryPlace::InProgress),
                ..Report::new(ConsumeOutcome::Retried)
            }
        );
        let calls = port.calls();
        assert_eq!(calls[0], Call::Wait(wait));
        let Call::Republish(queue, copy) = &calls[1] else {
            panic!("{calls:?}");
        };
        assert_eq!(queue, "orders.new");
        assert_eq!(copy.attempt, 1, "being claimed elsewhere is no attempt");
        assert_eq!(copy.id, delivered(1).0.id);
        assert_eq!(calls[2..], [Call::Ack]);
    }

    #[tokio::test]
    async fn a_done_input_is_acked_and_nothing_else() {
        let port = Recorder::default();
        let r = settle_first(&port, Settlement::Duplicate).await;
        assert_eq!(
            r,
            Report {
                duplicate: true,
                ..Report::new(ConsumeOutcome::Acked)
            }
        );
        assert_eq!(port.calls(), [Call::Ack]);
    }

    #[tokio::test]
    async fn an_accept_is_acked_only_after_its_outputs_and_its_state_commit() {
        let accept = || decided(Outcome::Accept, vec![output("events", "order.accepted")]);
        // Committed: published, then acked.
        let port = Recorder::default();
        let r = run(&port, 1, accept(), &policy()).await;
        assert_eq!(r, Report::new(ConsumeOutcome::Acked));
        assert!(matches!(port.calls()[..], [Call::Publish(_), Call::Ack]));
        // Found done by another run's commit: acked, a duplicate.
        let port = Recorder {
            commit: Some(StateCommitted::Ack { duplicate: true }),
            ..Recorder::default()
        };
        assert!(run(&port, 1, accept(), &policy()).await.duplicate);
        // Refused (a quota): the input fails, and the policy retries it.
        let quota = "namespace \"orders\" would hold 3 keys, over its quota of 2 (max_keys)";
        let port = Recorder {
            commit: Some(StateCommitted::Refused(quota.into())),
            ..Recorder::default()
        };
        let r = run(&port, 1, accept(), &policy()).await;
        assert_eq!(r.retried, Some(RetryPlace::Consumer));
        let calls = port.calls();
        assert!(matches!(calls[0], Call::Publish(_)), "{calls:?}");
        assert!(!calls.contains(&Call::Requeue));
        // The store cannot be reached: given back after a pause, no attempt.
        let port = Recorder {
            commit: Some(StateCommitted::Unavailable("cannot be reached".into())),
            ..Recorder::default()
        };
        let r = run(&port, 1, accept(), &policy()).await;
        assert_eq!(r.retried, Some(RetryPlace::Requeued));
        let calls = port.calls();
        assert_eq!(calls[1], Call::Wait(PAUSE_BEFORE_REQUEUE), "{calls:?}");
        assert_eq!(calls.last(), Some(&Call::Requeue));
    }

    #[tokio::test]
    async fn a_long_retry_goes_through_its_rung() {
        let port = Recorder::default();
        let r = run(&port, 3, retry("db down"), &policy()).await;
        assert_eq!(
            r,
            Report {
                retried: Some(RetryPlace::Broker),
                ..Report::new(ConsumeOutcome::Retried)
            }
        );
        assert_eq!(copy_to(&port, "orders.new.retry.40s").attempt, 4);
    }

    #[tokio::test]
    async fn a_missing_rung_is_counted_and_the_wait_happens_in_the_consumer() {
        let port = Recorder {
            republish_fails: [(
                "orders.new.retry.40s".to_string(),
                unroutable("orders.new.retry.40s"),
            )]
            .into(),
            ..Recorder::default()
        };
        let r = run(&port, 3, retry("db down"), &policy()).await;
        assert_eq!(
            r,
            Report {
                retried: Some(RetryPlace::Consumer),
                rung_missing: Some("orders.new.retry.40s".into()),
                ..Report::new(ConsumeOutcome::Retried)
            }
        );
        let calls = port.calls();
        let targets: Vec<_> = calls
            .iter()
            .map(|c| match c {
                Call::Republish(queue, _) => format!("republish {queue}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            targets,
            [
                "republish orders.new.retry.40s",
                "Wait(40s)",
                "republish orders.new",
                "Ack"
            ]
        );
    }

    #[tokio::test]
    async fn a_retry_that_cannot_be_republished_is_requeued() {
        let port = Recorder {
            republish_fails: [(
                "orders.new.retry.40s".to_string(),
                PublishError::Unknown {
                    id: "m1".into(),
                    exchange: String::new(),
                    routing_key: "orders.new.retry.40s".into(),
                    reason: "channel closed".into(),
                },
            )]
            .into(),
            ..Recorder::default()
        };
        let r = run(&port, 3, retry("db down"), &policy()).await;
        assert_eq!(
            r,
            Report {
                retried: Some(RetryPlace::Requeued),
                ..Report::new(ConsumeOutcome::Retried)
            }
        );
        // It pauses before the requeue, so a failing copy does not spin.
        assert!(matches!(
            port.calls()[..],
            [
                Call::Republish(..),
                Call::Wait(PAUSE_BEFORE_REQUEUE),
                Call::Requeue
            ]
        ));
    }

    #[tokio::test]
    async fn exhaustion_dead_letters_with_the_attempts_named() {
        let port = Recorder::default();
        let r = run(&port, 6, retry("still down"), &policy()).await;
        assert_eq!(
            r,
            Report {
                set_aside: true,
                ..Report::new(ConsumeOutcome::DeadLettered)
            }
        );
        let copy = copy_to(&port, "orders.new.dlq");
        assert_eq!(
            copy.error.as_deref(),
            Some("exhausted 6 attempts: still down")
        );
        assert_eq!(copy.attempt, 6, "a set-aside copy keeps its attempt");
    }

    #[tokio::test]
    async fn the_age_limit_dead_letters_before_the_attempts_run_out() {
        let port = Recorder::default();
        let policy = policy().give_up_after(Duration::from_secs(60));
        let r = run(&port, 1, retry("slow"), &policy).await;
        assert_eq!(r.outcome, ConsumeOutcome::DeadLettered);
        let copy = copy_to(&port, "orders.new.dlq");
        let error = copy.error.as_deref().unwrap_or_default();
        assert!(
            error.starts_with("exceeded the maximum message age of 1m"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn reject_and_park_set_a_copy_aside_with_the_reason() {
        for (plugins, queue, outcome, error) in [
            (
                decided(Outcome::Reject("bad total".into()), vec![]),
                "orders.new.dlq",
                ConsumeOutcome::Rejected,
                "the handler rejected it: bad total",
            ),
            (
                decided(Outcome::Park("needs a human".into()), vec![]),
                "orders.new.parked",
                ConsumeOutcome::Parked,
                "the handler parked it: needs a human",
            ),
        ] {
            let port = Recorder::default();
            let r = run(&port, 2, plugins, &policy()).await;
            assert_eq!(
                r,
                Report {
                    set_aside: true,
                    ..Report::new(outcome)
                }
            );
            let copy = copy_to(&port, queue);
            assert_eq!(copy.error.as_deref(), Some(error));
        }
    }

    #[tokio::test]
    async fn a_set_aside_that_fails_is_counted_and_requeued() {
        let port = Recorder {
            republish_fails: [(
                "orders.new.parked".to_string(),
                unroutable("orders.new.parked"),
            )]
            .into(),
            ..Recorder::default()
        };
        let parked = decided(Outcome::Park("odd".into()), vec![]);
        let r = run(&port, 1, parked, &policy()).await;
        assert_eq!(
            r,
            Report {
                retried: Some(RetryPlace::Requeued),
                set_aside_failed: Some("orders.new.parked".into()),
                ..Report::new(ConsumeOutcome::Retried)
            }
        );
        // It pauses before the requeue, so a failing copy does not spin.
        assert!(matches!(
            port.calls()[..],
            [
                Call::Republish(..),
                Call::Wait(PAUSE_BEFORE_REQUEUE),
                Call::Requeue
            ]
        ));
    }

    #[tokio::test]
    async fn a_stream_delivery_whose_set_aside_fails_is_tried_again_in_place_not_requeued() {
        let port = Recorder {
            republish_fails: [("orders.new.dlq".to_string(), unroutable("orders.new.dlq"))].into(),
            republish_fails_times: Some(Mutex::new(2)),
            ..Recorder::default()
        };
        let rejected = decided(Outcome::Reject("bad".into()), vec![]);
        let r = run_on_stream(&port, rejected).await;
        assert_eq!(
            r,
            Report {
                set_aside: true,
                set_aside_failed: Some("orders.new.dlq".into()),
                ..Report::new(ConsumeOutcome::Rejected)
            }
        );
        // Each try pauses longer than the one before.
        let calls = port.calls();
        assert!(
            matches!(
                calls[..],
                [
                    Call::Republish(..),
                    Call::Wait(first),
                    Call::Republish(..),
                    Call::Wait(second),
                    Call::Republish(..),
                    Call::Ack
                ] if first == PAUSE_BEFORE_REQUEUE && second == 2 * PAUSE_BEFORE_REQUEUE
            ),
            "{calls:?}"
        );
    }

    #[tokio::test]
    async fn a_stream_delivery_that_cannot_be_settled_before_shutdown_is_read_again() {
        // Its set-aside fails and shutdown interrupts the pause.
        let port = Recorder {
            republish_fails: [("orders.new.dlq".to_string(), unroutable("orders.new.dlq"))].into(),
            shutting_down: true,
            ..Recorder::default()
        };
        let rejected = decided(Outcome::Reject("bad".into()), vec![]);
        let r = run_on_stream(&port, rejected).await;
        assert_eq!(r.retried, Some(RetryPlace::ReadAgain));
        assert_eq!(
            port.calls()[1..],
            [Call::Wait(PAUSE_BEFORE_REQUEUE), Call::ReadAgain]
        );
        // Its outputs held back by broker trouble until shutdown.
        let port = Recorder {
            publish_fails: Some(PublishError::Declined {
                id: "m1".into(),
                exchange: "x".into(),
                routing_key: "k".into(),
                reason: crate::broker::publisher::LOST.into(),
            }),
            ..Recorder::default()
        };
        let accepted = decided(Outcome::Accept, vec![output("x", "k")]);
        let r = run_on_stream(&port, accepted).await;
        assert_eq!(r.retried, Some(RetryPlace::ReadAgain));
        assert!(matches!(
            port.calls()[..],
            [Call::Publish(_), Call::ReadAgain]
        ));
    }

    #[tokio::test]
    async fn a_set_aside_that_would_exceed_the_frame_is_shortened_and_still_lands() {
        let port = Recorder {
            frame_max: Some(2048),
            ..Recorder::default()
        };
        let reason = format!("order {} is bad", "9".repeat(100_000));
        let rejected = decided(Outcome::Reject(reason), vec![]);
        let r = run(&port, 1, rejected, &policy()).await;
        assert_eq!(
            r,
            Report {
                set_aside: true,
                ..Report::new(ConsumeOutcome::Rejected)
            }
        );
        let copy = copy_to(&port, "orders.new.dlq");
        let error = copy.error.as_deref().unwrap_or_default();
        assert!(
            error.starts_with("the handler rejected it: order 999")
                && error.contains("[cut ")
                && error.ends_with(" is bad")
                && error.len() < 2048,
            "{error}"
        );
    }

    #[tokio::test]
    async fn an_output_too_big_for_the_frame_is_never_published() {
        let port = Recorder::default();
        let mut big = output("orders.events", "order.accepted");
        big.headers = vec![(
            "x-big".into(),
            crate::envelope::HeaderValue::Text("h".repeat(200_000)),
        )];
        let r = run(
            &port,
            1,
            decided(Outcome::Accept, vec![big]),
            &RetryPolicy::none(),
        )
        .await;
        assert_eq!(r.outcome, ConsumeOutcome::DeadLettered);
        let copy = copy_to(&port, "orders.new.dlq");
        let error = copy.error.as_deref().unwrap_or_default();
        assert!(
            error.contains("the output to exchange 'orders.events' with key 'order.accepted' cannot be published")
                && error.contains("131072-byte frame"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn shutdown_during_a_consumer_wait_requeues_without_republishing() {
        let port = Recorder {
            shutting_down: true,
            ..Recorder::default()
        };
        let r = run(&port, 1, retry("db down"), &policy()).await;
        assert_eq!(
            r,
            Report {
                retried: Some(RetryPlace::Requeued),
                ..Report::new(ConsumeOutcome::Retried)
            }
        );
        assert_eq!(
            port.calls(),
            [Call::Wait(Duration::from_secs(10)), Call::Requeue]
        );
    }

    // Replies and routing slips (`flow.rs`).

    /// Settles one delivery carrying `headers` (and, for a plain AMQP
    /// client, `reply_to` and `correlation_id` properties), read into its
    /// flow as the pipeline reads it.
    async fn run_flowing(
        port: &Recorder,
        headers: &[(&str, &str)],
        reply_to: Option<&str>,
        plugins: PluginRun,
    ) -> Report {
        let (envelope, properties) = delivered(1);
        let mut table = properties.headers().clone().unwrap_or_default();
        for (name, value) in headers {
            table.insert(
                (*name).into(),
                AMQPValue::LongString(LongString::from(*value)),
            );
        }
        let mut properties = properties.with_headers(table);
        if let Some(queue) = reply_to {
            properties = properties
                .with_reply_to(queue.into())
                .with_correlation_id("pika-7".into());
        }
        let body = bytes::Bytes::from_static(b"as delivered");
        let (mut flow, refusal) = Flow::read("orders.new", &properties, &envelope, "orders", &body);
        flow.failure = flow.failure.or(flow::failure_of(&plugins));
        let policy = RetryPolicy::none();
        let facts = DeliveryFacts {
            queue: "orders.new",
            envelope: &envelope,
            now_ms: NOW_MS,
            jitter_sample: 0.5,
            from_stream: false,
        };
        let settlement = match refusal {
            Some(refusal) => refusal,
            None => flow::refuse_unanswerable("orders.new", &flow, decide(facts, plugins, &policy)),
        };
        let subject = Subject {
            queue: "orders.new",
            envelope: &envelope,
            properties: &properties,
            mandatory_outputs: true,
            from_stream: false,
            trace: &untraced(),
            flow: &flow,
        };
        settle(port, subject, &policy, settlement).await
    }

    fn replied(outcome: Outcome, outputs: Vec<Outgoing>) -> PluginRun {
        PluginRun::Decided {
            outcome,
            outputs,
            version: "v1".into(),
            fuel: None,
            reply: Some(envelope::Reply {
                body: b"{\"echo\":\"hi\"}".to_vec(),
                content_type: None,
                headers: vec![],
                id: None,
                message_type: Some("echo.reply".into()),
                version: None,
            }),
        }
    }

    fn header_text(publication: &Publication, name: &str) -> Option<String> {
        match publication
            .properties
            .headers()
            .as_ref()?
            .inner()
            .get(name)?
        {
            AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
            other => panic!("{name} is not a long string: {other:?}"),
        }
    }

    const SLIP: &str = r#"{"steps":[{"exchange":"a","routingKey":"a"},{"exchange":"b","routingKey":"b","name":"second"}],"done":[]}"#;

    #[tokio::test]
    async fn an_answered_request_publishes_outputs_reply_and_hop_in_one_batch_then_acks() {
        let port = Recorder::default();
        let report = run_flowing(
            &port,
            &[("acemq-reply-to", "replies"), ("acemq-routing-slip", SLIP)],
            Some("replies"),
            replied(Outcome::Accept, vec![output("orders.events", "k")]),
        )
        .await;
        assert!(report.answered);
        assert_eq!(report.span_outcome(), "answered");
        assert_eq!(report.outcome, ConsumeOutcome::Acked);
        let calls = port.calls();
        let [Call::Publish(batch), Call::Ack] = calls.as_slice() else {
            panic!("one batch, then the ack: {calls:?}");
        };
        let targets: Vec<(&str, &str)> = batch
            .iter()
            .map(|(x, k, _)| (x.as_str(), k.as_str()))
            .collect();
        assert_eq!(
            targets,
            [("orders.events", "k"), ("", "replies"), ("b", "b")]
        );
        // The reply is not mandatory; the output and the hop are.
        assert_eq!(*port.mandatory.lock().unwrap(), [true, false, true]);
        let (_, _, reply) = &batch[1];
        assert_eq!(reply.correlation_id, "correlation-1");
        assert_eq!(reply.causation_id.as_deref(), Some("message-1"));
        assert_eq!(reply.message_type, "echo.reply");
        assert_eq!(reply.id, envelope::reply_id("message-1", "v1"));
        let publications = port.publications.lock().unwrap();
        assert_eq!(
            publications[1]
                .properties
                .correlation_id()
                .as_ref()
                .map(|c| c.as_str()),
            Some("pika-7")
        );
        // The hop: the delivery itself, the step done, attempt 1.
        let (_, _, hop) = &batch[2];
        assert_eq!((hop.id.as_str(), hop.attempt), ("message-1", 1));
        assert_eq!(&publications[2].body[..], b"as delivered");
        let slip: serde_json::Value =
            serde_json::from_str(&header_text(&publications[2], "acemq-routing-slip").unwrap())
                .unwrap();
        assert_eq!(slip["steps"].as_array().unwrap().len(), 1);
        assert_eq!(slip["done"][0]["routingKey"], "a");
        assert!(slip["done"][0]["completedAt"].is_string());
    }

    #[tokio::test]
    async fn a_reply_or_hop_not_confirmed_fails_the_accept_and_nothing_is_acked() {
        let port = Recorder {
            publish_fails: Some(unroutable("b")),
            ..Recorder::default()
        };
        let report = run_flowing(
            &port,
            &[("acemq-routing-slip", SLIP)],
            None,
            decided(Outcome::Accept, vec![]),
        )
        .await;
        assert!(!report.answered);
        let calls = port.calls();
        // Without a policy the failed accept is dead-lettered, not acked unsent.
        assert_eq!(report.outcome, ConsumeOutcome::DeadLettered);
        assert!(matches!(calls[0], Call::Publish(_)));
        assert!(matches!(&calls[1], Call::Republish(q, _) if q == "orders.new.dlq"));
    }

    #[tokio::test]
    async fn an_accept_without_a_reply_sends_none_and_the_last_step_forwards_nothing() {
        let port = Recorder::default();
        let last = r#"{"steps":[{"exchange":"a","routingKey":"a"}],"done":[]}"#;
        let report = run_flowing(
            &port,
            &[("acemq-reply-to", "replies"), ("acemq-routing-slip", last)],
            None,
            decided(Outcome::Accept, vec![]),
        )
        .await;
        assert!(!report.answered);
        assert_eq!(report.span_outcome(), "acked");
        assert!(
            port.publications.lock().unwrap().is_empty(),
            "nothing published"
        );
        assert_eq!(port.calls().last(), Some(&Call::Ack));
    }

    #[tokio::test]
    async fn a_rejected_request_is_answered_with_acemq_error_before_its_set_aside() {
        let port = Recorder::default();
        let report = run_flowing(
            &port,
            &[],
            Some("amq.gen-reply"),
            replied(Outcome::Reject("fail".into()), vec![]),
        )
        .await;
        assert_eq!(report.outcome, ConsumeOutcome::Rejected);
        assert!(!report.answered);
        let calls = port.calls();
        assert!(
            matches!(&calls[0], Call::Publish(b) if b[0].1 == "amq.gen-reply"),
            "{calls:?}"
        );
        assert!(matches!(&calls[1], Call::Republish(q, _) if q == "orders.new.dlq"));
        assert_eq!(calls[2], Call::Ack);
        let publications = port.publications.lock().unwrap();
        assert_eq!(publications.len(), 1, "the handler's own reply is dropped");
        assert_eq!(
            header_text(&publications[0], "acemq-error").as_deref(),
            Some("Rejected: the handler rejected it: fail")
        );
        assert!(!publications[0].mandatory);
        assert_eq!(
            publications[0]
                .properties
                .correlation_id()
                .as_ref()
                .map(|c| c.as_str()),
            Some("pika-7")
        );
    }

    #[tokio::test]
    async fn an_error_reply_not_confirmed_requeues_the_request_without_a_set_aside() {
        let port = Recorder {
            publish_fails: Some(PublishError::Refused {
                id: "r".into(),
                exchange: String::new(),
                routing_key: "amq.gen-reply".into(),
            }),
            ..Recorder::default()
        };
        let report = run_flowing(
            &port,
            &[],
            Some("amq.gen-reply"),
            decided(Outcome::Park("later".into()), vec![]),
        )
        .await;
        assert_eq!(report.outcome, ConsumeOutcome::Retried);
        let calls = port.calls();
        assert!(
            !calls.iter().any(|c| matches!(c, Call::Republish(..))),
            "{calls:?}"
        );
        assert_eq!(calls.last(), Some(&Call::Requeue));
    }

    #[tokio::test]
    async fn a_reply_to_a_request_without_an_address_rejects_it_naming_both() {
        let port = Recorder::default();
        let report = run_flowing(&port, &[], None, replied(Outcome::Accept, vec![])).await;
        assert_eq!(report.outcome, ConsumeOutcome::Rejected);
        let copy = copy_to(&port, "orders.new.dlq");
        let error = copy.error.unwrap();
        assert!(
            error.contains("acemq-reply-to") && error.contains("reply-to property"),
            "{error}"
        );
        assert!(
            port.publications.lock().unwrap().is_empty(),
            "no reply, nowhere to send it"
        );
    }

    #[tokio::test]
    async fn an_unfollowable_slip_is_dead_lettered_and_its_requester_told() {
        let port = Recorder::default();
        let report = run_flowing(
            &port,
            &[("acemq-routing-slip", "{not json")],
            Some("amq.gen-reply"),
            decided(Outcome::Accept, vec![]),
        )
        .await;
        assert_eq!(report.outcome, ConsumeOutcome::DeadLettered);
        let calls = port.calls();
        let [Call::Publish(_), Call::Republish(target, copy), Call::Ack] = calls.as_slice() else {
            panic!("the error reply, the set-aside, the ack: {calls:?}");
        };
        assert_eq!(target, "orders.new.dlq");
        assert!(
            copy.error.as_deref().unwrap().starts_with(
                "its routing slip cannot be followed: the acemq-routing-slip header is not valid JSON"
            ),
            "{copy:?}"
        );
        let publications = port.publications.lock().unwrap();
        assert!(
            header_text(&publications[0], "acemq-error")
                .unwrap()
                .starts_with("InvalidRoutingSlip: its routing slip cannot be followed")
        );
    }
}
