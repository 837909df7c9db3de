//! How a delivery ends, decided without touching the broker.
//!
//! [`decide`] turns what the plugins produced into exactly one of the
//! contract's settlements (AceMQ contract §5). Carrying a settlement out can
//! go wrong in a few known ways (a [`Setback`]: the outputs were not
//! confirmed, the retry rung is gone, a republish failed, shutdown came
//! during a wait); [`follow_up`] decides what happens instead. Every rule of
//! a message's end is here, as plain functions over plain data, so each one
//! is unit-tested without a broker; `settle.rs` only carries them out.

use std::borrow::Cow;
use std::time::Duration;

use super::plugins::PluginRun;
use std::sync::Arc;

use crate::envelope::{self, Envelope, NO_REASON, Reply};
use crate::plugin::{Outcome, Outgoing};
use crate::retry::{Decision, LONGEST_CONSUMER_WAIT, RetryPolicy, WaitPlace};
use crate::topology::naming;

/// How a delivery ends. Each variant is one settlement of the contract.
#[derive(Debug, Clone, PartialEq)]
pub enum Settlement {
    /// Publish every output (confirmed, mandatory), then ack the input.
    /// `version` (the handler's sha256) makes the outputs' ids: the same
    /// input handled by the same version publishes the same ids again.
    Accept {
        outputs: Vec<Outgoing>,
        version: Arc<str>,
        /// The answer to the request, published with the outputs (not
        /// mandatory; see `delivery/flow.rs`). Boxed: rare, and large beside
        /// the other settlements.
        reply: Option<Box<Reply>>,
    },
    /// Hold the delivery unacked for `wait` (the policy's delay, jittered),
    /// then republish it to its own queue with the attempt advanced, then ack.
    RetryInConsumer { wait: Duration, reason: String },
    /// Republish to the rung queue (it dead-letters back after its TTL),
    /// then ack. `delay` is the rung's: a consumer wait of that length
    /// stands in if the rung is missing.
    RetryInBroker {
        rung: String,
        delay: Duration,
        reason: String,
    },
    /// Republish to `{queue}.dlq` with `x-acemq-error`, then ack.
    DeadLetter {
        queue: String,
        reason: String,
        outcome: ConsumeOutcome,
    },
    /// Republish to `{queue}.parked` with `x-acemq-error`, then ack.
    Park { queue: String, reason: String },
    /// Give the delivery back to its queue now, attempt unchanged: what is
    /// left when a retry or set-aside could not be published, or shutdown
    /// interrupted a wait. Nothing is lost; the delivery comes back.
    /// Never for a stream delivery (see [`Settlement::ReadAgain`]).
    Requeue { why: String },
    /// An input already done (its envelope id has a done record): acked
    /// without a call, counted as a duplicate (docs/state.md).
    Duplicate,
    /// An input another host holds a live claim on (`idempotent`): held
    /// for `wait`, then republished to its own queue with its attempt
    /// unchanged, then acked (Python's `in_progress`). From a stream: read
    /// again after the wait.
    InProgress { wait: Duration, reason: String },
    /// A stream delivery's requeue. RabbitMQ does not deliver a requeued
    /// stream message again, and closes the channel (RabbitMQ 3.10; see
    /// `tests/tests/streams.rs`): a requeue would end the subscription and
    /// have everything it had in hand read again, or, were the channel
    /// kept, leave the offset unfinished for good, pinning the checkpoint
    /// behind it. Instead it is neither acked nor requeued: its work counts as not
    /// done, and the consumer reads it again from its offset (its
    /// subscription starts again there, at once or at the next start).
    ReadAgain { why: String },
}

/// The contract's settlement outcome words: the `outcome` label of
/// `acemq.consume.total`, exactly one per delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConsumeOutcome {
    Acked,
    Retried,
    /// Exhausted, too old, or failed without a retry policy.
    DeadLettered,
    /// Deliberately refused by the handler (`reject`).
    Rejected,
    Parked,
}

impl ConsumeOutcome {
    pub const ALL: [ConsumeOutcome; 5] = [
        ConsumeOutcome::Acked,
        ConsumeOutcome::Retried,
        ConsumeOutcome::DeadLettered,
        ConsumeOutcome::Rejected,
        ConsumeOutcome::Parked,
    ];

    /// The words of [`ALL`](Self::ALL), in its order.
    pub const WORDS: [&'static str; 5] =
        ["acked", "retried", "dead_lettered", "rejected", "parked"];

    pub fn as_str(self) -> &'static str {
        match self {
            ConsumeOutcome::Acked => "acked",
            ConsumeOutcome::Retried => "retried",
            ConsumeOutcome::DeadLettered => "dead_lettered",
            ConsumeOutcome::Rejected => "rejected",
            ConsumeOutcome::Parked => "parked",
        }
    }
}

impl Settlement {
    /// The outcome counted for this settlement once it is carried out.
    /// Why it was not simply acked, in the words set-aside headers carry.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Settlement::Accept { .. } | Settlement::Duplicate => None,
            Settlement::InProgress { reason, .. } => Some(reason),
            Settlement::RetryInConsumer { reason, .. }
            | Settlement::RetryInBroker { reason, .. }
            | Settlement::DeadLetter { reason, .. }
            | Settlement::Park { reason, .. } => Some(reason),
            Settlement::Requeue { why } | Settlement::ReadAgain { why } => Some(why),
        }
    }

    /// How long a retry waits before its next attempt.
    pub fn retry_delay(&self) -> Option<Duration> {
        match self {
            Settlement::RetryInConsumer { wait, .. } | Settlement::InProgress { wait, .. } => {
                Some(*wait)
            }
            Settlement::RetryInBroker { delay, .. } => Some(*delay),
            _ => None,
        }
    }

    pub fn outcome(&self) -> ConsumeOutcome {
        match self {
            Settlement::Accept { .. } | Settlement::Duplicate => ConsumeOutcome::Acked,
            Settlement::InProgress { .. }
            | Settlement::RetryInConsumer { .. }
            | Settlement::RetryInBroker { .. }
            | Settlement::Requeue { .. }
            | Settlement::ReadAgain { .. } => ConsumeOutcome::Retried,
            Settlement::DeadLetter { outcome, .. } => *outcome,
            Settlement::Park { .. } => ConsumeOutcome::Parked,
        }
    }
}

/// The facts about a delivery that the decisions depend on.
#[derive(Debug, Clone, Copy)]
pub struct DeliveryFacts<'a> {
    pub queue: &'a str,
    pub envelope: &'a Envelope,
    pub now_ms: u64,
    /// A uniform sample in [0, 1) for the policy's jitter: drawn by the
    /// caller, so the decision itself stays a function of its inputs.
    pub jitter_sample: f64,
    /// It came from a stream (it carries `x-stream-offset`): it is never
    /// retried, whatever the policy, because a retry would append a copy
    /// to the stream for every other reader.
    pub from_stream: bool,
}

impl DeliveryFacts<'_> {
    /// Age of the message since it was first published.
    fn age(&self) -> Duration {
        Duration::from_millis(self.envelope.age_ms(self.now_ms))
    }

    /// How long a retry waits in the consumer: the delay, jittered.
    /// A wait held in the consumer, never longer than
    /// [`LONGEST_CONSUMER_WAIT`]: a policy's own waits are checked against it
    /// when the config loads, but a missing rung's delay (hours, perhaps)
    /// is waited here instead, and a longer hold would have the broker
    /// close the channel.
    fn consumer_wait(&self, delay: Duration, policy: &RetryPolicy) -> Duration {
        policy
            .wait_time(delay, WaitPlace::Consumer, self.jitter_sample)
            .min(LONGEST_CONSUMER_WAIT)
    }
}

impl Settlement {
    /// The same settlement with its reason cut to
    /// [`envelope::MAX_REASON_BYTES`]: a reason may quote a plugin (a
    /// panic text, a reject reason holding a whole order id) and is
    /// written into `x-acemq-error` and logs, which must stay small.
    pub(crate) fn with_bounded_reason(mut self) -> Self {
        match &mut self {
            Settlement::Accept { .. } | Settlement::Duplicate => {}
            Settlement::InProgress { reason, .. }
            | Settlement::RetryInConsumer { reason, .. }
            | Settlement::RetryInBroker { reason, .. }
            | Settlement::DeadLetter { reason, .. }
            | Settlement::Park { reason, .. }
            | Settlement::Requeue { why: reason }
            | Settlement::ReadAgain { why: reason } => {
                if let Cow::Owned(cut) = envelope::bound_reason(reason) {
                    *reason = cut;
                }
            }
        }
        self
    }
}

/// The set-aside of a delivery whose body is larger than its consumer
/// allows (`max_body_bytes`): parked before any plugin runs, never retried
/// (it would be as large the next time). `None` when the body is allowed.
pub fn refuse_oversized(queue: &str, body_len: usize, max_body_bytes: usize) -> Option<Settlement> {
    (body_len > max_body_bytes).then(|| Settlement::Park {
        queue: naming::parked_queue(queue),
        reason: format!(
            "its body is {body_len} bytes, more than the {max_body_bytes} bytes this consumer \
             accepts (max_body_bytes)"
        ),
    })
}

/// The set-aside of a delivery the host had to make readable (the frame
/// guard's note, `broker::frame_guard`: bytes that are not UTF-8 where AMQP
/// wants text, a header table that cannot be read): parked before any
/// plugin runs, never retried (it would be as unreadable the next time),
/// the note saying what was wrong and where. `None` for a readable one.
pub fn refuse_unreadable(queue: &str, note: Option<&str>) -> Option<Settlement> {
    note.map(|note| {
        Settlement::Park {
            queue: naming::parked_queue(queue),
            reason: format!("it could not be read as it was sent: {note}"),
        }
        .with_bounded_reason()
    })
}

/// Decides the settlement for what the plugins produced.
pub fn decide(facts: DeliveryFacts<'_>, run: PluginRun, policy: &RetryPolicy) -> Settlement {
    settlement_for(facts, run, policy).with_bounded_reason()
}

fn settlement_for(facts: DeliveryFacts<'_>, run: PluginRun, policy: &RetryPolicy) -> Settlement {
    match run {
        // A delivery whose body no codec could decode is parked before any
        // handler runs (contract §9), never retried.
        PluginRun::Undecodable { reason } => Settlement::Park {
            queue: naming::parked_queue(facts.queue),
            reason: format!("could not be decoded: {reason}"),
        },
        PluginRun::Decided {
            outcome,
            outputs,
            version,
            reply,
            ..
        } => decide_outcome(facts, outcome, outputs, version, reply, policy),
        // A fault is a failure like any other: the policy decides.
        PluginRun::Faulted { fault, .. } => retry_or_give_up(facts, fault.reason, policy),
        PluginRun::OutputsRefused { reason, .. } => retry_or_give_up(facts, reason, policy),
        // No retry can make the exchange allowed: set aside at once, for an
        // operator to fix `publish_to` (or the plugin) and replay it.
        PluginRun::Misconfigured { reason, .. } => Settlement::Park {
            queue: naming::parked_queue(facts.queue),
            reason: format!("its plugin published outside the consumer's publish_to: {reason}"),
        },
        // A codec that failed (rather than refused the bytes) may well
        // succeed next time: a valid message is not parked for it.
        PluginRun::CodecFaulted { reason } => {
            retry_or_give_up(facts, format!("its codec failed: {reason}"), policy)
        }
        PluginRun::HostFailed { reason } => retry_or_give_up(
            facts,
            format!("the host failed while running the plugins: {reason}"),
            policy,
        ),
        // The host's shortage, not the message's: given back, no attempt.
        PluginRun::HostBusy { reason } => {
            requeue(format!("the host had no room to run its plugins: {reason}"))
        }
        // Nor is a store that cannot be reached (the pipeline pauses first).
        PluginRun::StoreUnavailable { reason } => {
            requeue(format!("its state store could not be reached: {reason}"))
        }
        PluginRun::StateConflicted { reason, .. } => retry_or_give_up(facts, reason, policy),
    }
}

/// The settlement for the handler's outcome.
fn decide_outcome(
    facts: DeliveryFacts<'_>,
    outcome: Outcome,
    outputs: Vec<Outgoing>,
    version: Arc<str>,
    reply: Option<Reply>,
    policy: &RetryPolicy,
) -> Settlement {
    match outcome {
        Outcome::Accept => Settlement::Accept {
            outputs,
            version,
            reply: reply.map(Box::new),
        },
        Outcome::Retry(reason) if facts.from_stream => Settlement::DeadLetter {
            queue: naming::dead_letter_queue(facts.queue),
            reason: stream_retry_refused(facts.queue, &facts.envelope.id, &or_no_reason(reason)),
            outcome: ConsumeOutcome::DeadLettered,
        },
        Outcome::Retry(reason) => retry_or_give_up(facts, or_no_reason(reason), policy),
        Outcome::Reject(reason) => Settlement::DeadLetter {
            queue: naming::dead_letter_queue(facts.queue),
            reason: format!("the handler rejected it: {}", or_no_reason(reason)),
            outcome: ConsumeOutcome::Rejected,
        },
        Outcome::Park(reason) => Settlement::Park {
            queue: naming::parked_queue(facts.queue),
            reason: format!("the handler parked it: {}", or_no_reason(reason)),
        },
    }
}

/// What went wrong while a settlement was being carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Setback {
    /// The outputs of an accept were not all confirmed (or one could not be
    /// turned into a publication).
    OutputsFailed(String),
    /// The rung queue of a broker retry is gone: nothing is bound to it.
    RungMissing,
    /// The republish of a retry (rung or own queue) was not confirmed.
    RetryNotPublished(String),
    /// The retry copy cannot be published at all (its properties do not
    /// fit a frame): it would fail the same way every time.
    RetryTooLarge(String),
    /// The copy to `.dlq` or `.parked` was not confirmed.
    SetAsideFailed(String),
    /// Shutdown began while the delivery waited in the consumer.
    ShutdownDuringWait,
    /// The state store refused the accept's commit (a quota, a conflict
    /// after the reservation ran out): the input failed, and the policy
    /// decides, as for outputs that failed.
    StateRefused(String),
    /// The state store could not commit now: not the message's fault, so
    /// no attempt is counted.
    StoreTrouble(String),
    /// Publishing was declined or interrupted by the broker or the
    /// connection (lost, recovering, blocked), or the delivery's own channel
    /// closed: not the message's fault, so no attempt is counted.
    BrokerTrouble(String),
}

/// What happens instead of `failed` after `setback`.
///
/// Each answer settles the delivery another way and never as an accept, so
/// a chain of setbacks ends: at the latest in a requeue, which cannot fail
/// (a lost nack is a redelivery). A stream delivery is never requeued (see
/// [`after_on_a_stream`]); its chain ends in a set-aside or a read again.
pub fn follow_up(
    facts: DeliveryFacts<'_>,
    failed: &Settlement,
    setback: Setback,
    policy: &RetryPolicy,
) -> Settlement {
    let next = if facts.from_stream {
        after_on_a_stream(facts, failed, setback)
    } else {
        next_after(facts, failed, setback, policy)
    };
    next.with_bounded_reason()
}

/// [`follow_up`] for a stream delivery, by the stream rules (contract §7:
/// never a retry, the log never touched). A set-aside whose copy was not
/// confirmed is tried again in place (after the settlement's pause): the
/// delivery holds its place, and with it the stream's position, until its
/// copy is in `.dlq` or `.parked`. Outputs that failed are a failure, so
/// the delivery is dead-lettered. What a requeue answers on a queue
/// (broker trouble at shutdown, a channel that closed) is a read again.
fn after_on_a_stream(
    facts: DeliveryFacts<'_>,
    failed: &Settlement,
    setback: Setback,
) -> Settlement {
    match setback {
        Setback::SetAsideFailed(_)
            if matches!(
                failed,
                Settlement::DeadLetter { .. } | Settlement::Park { .. }
            ) =>
        {
            failed.clone()
        }
        Setback::OutputsFailed(_) | Setback::RetryTooLarge(_) | Setback::StateRefused(_) => {
            next_after(facts, failed, setback, &RetryPolicy::none())
        }
        other => Settlement::ReadAgain {
            why: match next_after(facts, failed, other, &RetryPolicy::none()) {
                Settlement::Requeue { why } => why,
                // Never reached: the other setbacks end in a requeue.
                settlement => format!("{settlement:?}"),
            },
        },
    }
}

fn next_after(
    facts: DeliveryFacts<'_>,
    failed: &Settlement,
    setback: Setback,
    policy: &RetryPolicy,
) -> Settlement {
    match setback {
        // Outputs are at-least-once: not confirmed, the delivery fails, and
        // the policy handles it like a retry.
        Setback::OutputsFailed(why) => retry_or_give_up(
            facts,
            format!("publishing its outputs failed: {why}"),
            policy,
        ),
        // Deleted, or never declared by whoever owns the queue: wait here
        // instead, as every AceMQ library does.
        Setback::RungMissing => match failed {
            Settlement::RetryInBroker { delay, reason, .. } => Settlement::RetryInConsumer {
                wait: facts.consumer_wait(*delay, policy),
                reason: reason.clone(),
            },
            other => requeue(format!("a retry rung was missing while settling {other:?}")),
        },
        Setback::RetryNotPublished(why) => requeue(format!("the retry was not published: {why}")),
        // Requeueing would bring it back to fail alike forever: set aside,
        // where the copy is made to fit (envelope::set_aside_within_frame).
        Setback::RetryTooLarge(why) => {
            let reason = match failed {
                Settlement::RetryInConsumer { reason, .. }
                | Settlement::RetryInBroker { reason, .. } => reason.as_str(),
                _ => NO_REASON,
            };
            Settlement::DeadLetter {
                queue: naming::dead_letter_queue(facts.queue),
                reason: format!(
                    "its retry copy could not be published ({why}); it failed with: {reason}"
                ),
                outcome: ConsumeOutcome::DeadLettered,
            }
        }
        Setback::SetAsideFailed(why) => requeue(format!("the set-aside was not published: {why}")),
        Setback::ShutdownDuringWait => requeue("shutdown began during the retry wait".to_string()),
        Setback::BrokerTrouble(why) => requeue(format!("the broker could not take it now: {why}")),
        Setback::StateRefused(why) => retry_or_give_up(facts, why, policy),
        Setback::StoreTrouble(why) => {
            requeue(format!("its state could not be committed now: {why}"))
        }
    }
}

fn requeue(why: String) -> Settlement {
    Settlement::Requeue { why }
}

/// The contract's sentence (Python's `StreamRetryError`, without its
/// `acemq: ` prefix) for a handler that asked to retry a stream message,
/// followed by the handler's own reason.
fn stream_retry_refused(stream: &str, id: &str, reason: &str) -> String {
    format!(
        "a handler reading the stream '{stream}' asked to retry message {id}. A stream never removes a message, so retrying one means appending a second copy of it to the log for every other consumer to read as well. Park it instead — park(...) puts a copy in {stream}.parked and leaves the log alone — or accept() to checkpoint past it and record the failure yourself. The handler's reason: {reason}"
    )
}

fn retry_or_give_up(facts: DeliveryFacts<'_>, reason: String, policy: &RetryPolicy) -> Settlement {
    // A stream message runs on no retry whatever the policy says: a failure
    // is dead-lettered at once.
    let none = RetryPolicy::none();
    let policy = if facts.from_stream { &none } else { policy };
    match policy.decide(facts.envelope.attempt, Some(facts.age())) {
        Decision::Wait {
            delay,
            place: WaitPlace::Consumer,
        } => Settlement::RetryInConsumer {
            wait: facts.consumer_wait(delay, policy),
            reason,
        },
        Decision::Wait {
            delay,
            place: WaitPlace::Broker,
        } => match naming::retry_queue(facts.queue, delay) {
            Ok(rung) => Settlement::RetryInBroker {
                rung,
                delay,
                reason,
            },
            // Policies with such delays are refused when the config loads;
            // should one get here anyway, waiting in the consumer loses nothing.
            Err(_) => Settlement::RetryInConsumer {
                wait: facts.consumer_wait(delay, policy),
                reason,
            },
        },
        Decision::GiveUp(give_up) => Settlement::DeadLetter {
            queue: naming::dead_letter_queue(facts.queue),
            reason: give_up.error_text(&reason),
            outcome: ConsumeOutcome::DeadLettered,
        },
    }
}

fn or_no_reason(reason: String) -> String {
    if reason.trim().is_empty() {
        NO_REASON.to_string()
    } else {
        reason
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outcome_words_are_those_of_all_in_its_order() {
        let words: Vec<&str> = ConsumeOutcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(words, ConsumeOutcome::WORDS);
    }
    use crate::plugin::{Fault, FaultKind};

    fn envelope(attempt: u32, first_seen_ms: u64) -> Envelope {
        let mut e = Envelope::read(
            &lapin::BasicProperties::default(),
            "order.created",
            first_seen_ms,
        );
        e.attempt = attempt;
        e.first_seen_ms = first_seen_ms;
        e
    }

    fn facts(envelope: &Envelope, now_ms: u64) -> DeliveryFacts<'_> {
        DeliveryFacts {
            queue: "orders.new",
            envelope,
            now_ms,
            jitter_sample: 0.5,
            from_stream: false,
        }
    }

    #[test]
    fn a_stream_message_is_never_retried_and_a_retry_outcome_says_why() {
        let e = envelope(1, 0);
        let stream_facts = || DeliveryFacts {
            from_stream: true,
            ..facts(&e, 0)
        };
        match decide(stream_facts(), retry("db down"), &two_minutes_of_tries()) {
            Settlement::DeadLetter { queue, reason, .. } => {
                assert_eq!(queue, "orders.new.dlq");
                assert!(
                    reason.starts_with(
                        "a handler reading the stream 'orders.new' asked to retry message "
                    ),
                    "{reason}"
                );
                assert!(
                    reason.ends_with("The handler's reason: db down"),
                    "{reason}"
                );
            }
            other => panic!("dead-lettered, not {other:?}"),
        }
        // A fault too goes to the .dlq at once, policy or not.
        let host = PluginRun::HostFailed {
            reason: "boom".into(),
        };
        assert!(matches!(
            decide(stream_facts(), host, &two_minutes_of_tries()),
            Settlement::DeadLetter { .. }
        ));
    }

    #[test]
    fn a_stream_delivery_is_never_requeued_after_a_setback() {
        let e = envelope(1, 0);
        let on_a_stream = DeliveryFacts {
            from_stream: true,
            ..facts(&e, 0)
        };
        let policy = two_minutes_of_tries();
        let dead_letter = Settlement::DeadLetter {
            queue: "orders.new.dlq".into(),
            reason: "the handler rejected it: bad".into(),
            outcome: ConsumeOutcome::Rejected,
        };
        // A set-aside whose copy was not confirmed is tried again in place;
        // on a queue it is requeued.
        let unconfirmed = || Setback::SetAsideFailed("reached no queue".into());
        assert_eq!(
            follow_up(on_a_stream, &dead_letter, unconfirmed(), &policy),
            dead_letter
        );
        assert!(matches!(
            follow_up(facts(&e, 0), &dead_letter, unconfirmed(), &policy),
            Settlement::Requeue { .. }
        ));
        // Broker trouble (at shutdown, or with its channel gone) and a
        // shutdown during a wait: read again, never requeued.
        let accept = Settlement::Accept {
            outputs: vec![],
            version: Arc::from("v1"),
            reply: None,
        };
        for setback in [
            Setback::BrokerTrouble("the connection was lost".into()),
            Setback::ShutdownDuringWait,
            Setback::RetryNotPublished("refused".into()),
        ] {
            match follow_up(on_a_stream, &accept, setback.clone(), &policy) {
                Settlement::ReadAgain { why } => assert!(!why.is_empty()),
                other => panic!("{setback:?}: read again, not {other:?}"),
            }
        }
        // Outputs that failed are a failure: dead-lettered at once.
        assert!(matches!(
            follow_up(
                on_a_stream,
                &accept,
                Setback::OutputsFailed("unroutable".into()),
                &policy
            ),
            Settlement::DeadLetter { .. }
        ));
    }

    fn decided(outcome: Outcome) -> PluginRun {
        PluginRun::Decided {
            outcome,
            outputs: vec![],
            version: "v1".into(),
            fuel: None,
            reply: None,
        }
    }

    fn retry(reason: &str) -> PluginRun {
        decided(Outcome::Retry(reason.into()))
    }

    fn two_minutes_of_tries() -> RetryPolicy {
        RetryPolicy::exponential(6, Duration::from_secs(10), Duration::from_secs(300))
            .with_jitter(0.0)
    }

    #[test]
    fn accept_carries_the_outputs() {
        let e = envelope(1, 0);
        let output = Outgoing {
            exchange: "orders.events".into(),
            routing_key: "order.accepted".into(),
            body: b"{}".to_vec(),
            content_type: None,
            headers: vec![],
            envelope: crate::envelope::OutputFields::with_id(crate::envelope::output_id(
                &e.id, "v1", 0,
            )),
            persistent: true,
            mandatory: None,
            deliver_at_ms: None,
        };
        let run = PluginRun::Decided {
            outcome: Outcome::Accept,
            outputs: vec![output.clone()],
            version: "v1".into(),
            fuel: None,
            reply: None,
        };
        let s = decide(facts(&e, 0), run, &RetryPolicy::none());
        assert_eq!(
            s,
            Settlement::Accept {
                outputs: vec![output],
                version: "v1".into(),
                reply: None,
            }
        );
        assert_eq!(s.outcome(), ConsumeOutcome::Acked);
    }

    #[test]
    fn retry_without_a_policy_is_dead_lettered_as_exhausted() {
        let e = envelope(1, 0);
        let s = decide(facts(&e, 0), retry("db down"), &RetryPolicy::none());
        assert_eq!(
            s,
            Settlement::DeadLetter {
                queue: "orders.new.dlq".into(),
                reason: "exhausted 1 attempt: db down".into(),
                outcome: ConsumeOutcome::DeadLettered,
            }
        );
    }

    #[test]
    fn short_waits_stay_in_the_consumer_and_long_ones_use_a_rung() {
        let policy = two_minutes_of_tries();
        let e = envelope(1, 0);
        let s = decide(facts(&e, 0), retry("x"), &policy);
        assert_eq!(
            s,
            Settlement::RetryInConsumer {
                wait: Duration::from_secs(10),
                reason: "x".into()
            }
        );
        let e = envelope(3, 0);
        let s = decide(facts(&e, 0), retry("x"), &policy);
        assert_eq!(
            s,
            Settlement::RetryInBroker {
                rung: "orders.new.retry.40s".into(),
                delay: Duration::from_secs(40),
                reason: "x".into()
            }
        );
        assert_eq!(s.outcome(), ConsumeOutcome::Retried);
    }

    #[test]
    fn a_consumer_wait_is_jittered_by_the_policy_with_the_given_sample() {
        let policy = RetryPolicy::fixed(3, Duration::from_secs(10)).with_jitter(0.2);
        let e = envelope(1, 0);
        let wait = |sample: f64| {
            let facts = DeliveryFacts {
                jitter_sample: sample,
                ..facts(&e, 0)
            };
            match decide(facts, retry("x"), &policy) {
                Settlement::RetryInConsumer { wait, .. } => wait,
                other => panic!("expected a consumer wait, got {other:?}"),
            }
        };
        assert_eq!(wait(0.0), policy.jittered(Duration::from_secs(10), 0.0));
        assert_eq!(wait(0.99), policy.jittered(Duration::from_secs(10), 0.99));
        assert_ne!(wait(0.0), wait(0.99), "the sample moves the wait");
    }

    #[test]
    fn exhaustion_names_the_attempts() {
        let policy = RetryPolicy::fixed(3, Duration::from_secs(1));
        let e = envelope(3, 0);
        let s = decide(facts(&e, 0), retry("still down"), &policy);
        assert!(
            matches!(&s, Settlement::DeadLetter { reason, .. } if reason == "exhausted 3 attempts: still down"),
            "{s:?}"
        );
    }

    #[test]
    fn age_limit_gives_up_early() {
        let policy =
            RetryPolicy::fixed(5, Duration::from_secs(1)).give_up_after(Duration::from_secs(120));
        let e = envelope(1, 1_000);
        let s = decide(facts(&e, 121_000), retry("slow"), &policy);
        assert!(
            matches!(&s, Settlement::DeadLetter { reason, outcome: ConsumeOutcome::DeadLettered, .. }
            if reason.starts_with("exceeded the maximum message age of 2m")),
            "{s:?}"
        );
    }

    #[test]
    fn reject_and_park_use_the_contract_wording() {
        let e = envelope(1, 0);
        let s = decide(
            facts(&e, 0),
            decided(Outcome::Reject("missing field `total`".into())),
            &RetryPolicy::none(),
        );
        assert_eq!(
            s,
            Settlement::DeadLetter {
                queue: "orders.new.dlq".into(),
                reason: "the handler rejected it: missing field `total`".into(),
                outcome: ConsumeOutcome::Rejected
            }
        );
        let s = decide(
            facts(&e, 0),
            decided(Outcome::Park(String::new())),
            &RetryPolicy::none(),
        );
        assert_eq!(
            s,
            Settlement::Park {
                queue: "orders.new.parked".into(),
                reason: "the handler parked it: no reason given".into()
            }
        );
        assert_eq!(s.outcome(), ConsumeOutcome::Parked);
    }

    #[test]
    fn a_fault_is_retried_under_the_policy() {
        let e = envelope(1, 0);
        let run = PluginRun::Faulted {
            fault: Fault {
                kind: FaultKind::Deadline,
                reason: "deadline of 2s exceeded".into(),
            },
            version: "v1".into(),
            fuel: None,
        };
        let s = decide(facts(&e, 0), run, &RetryPolicy::none());
        assert!(
            matches!(&s, Settlement::DeadLetter { reason, .. } if reason == "exhausted 1 attempt: deadline of 2s exceeded"),
            "{s:?}"
        );
    }

    #[test]
    fn a_publish_outside_publish_to_is_parked_at_once_whatever_the_policy() {
        let e = envelope(1, 0);
        let run = PluginRun::Misconfigured {
            reason:
                "publishing to exchange 'x' is not allowed for this consumer (publish_to = ['y'])"
                    .into(),
            version: "v1".into(),
            fuel: None,
        };
        assert_eq!(
            decide(facts(&e, 0), run, &two_minutes_of_tries()),
            Settlement::Park {
                queue: "orders.new.parked".into(),
                reason: "its plugin published outside the consumer's publish_to: publishing to \
                         exchange 'x' is not allowed for this consumer (publish_to = ['y'])"
                    .into()
            }
        );
    }

    #[test]
    fn undecodable_bodies_are_parked_and_never_retried() {
        let e = envelope(1, 0);
        let run = PluginRun::Undecodable {
            reason: "msgpack: invalid marker".into(),
        };
        assert_eq!(
            decide(facts(&e, 0), run, &two_minutes_of_tries()),
            Settlement::Park {
                queue: "orders.new.parked".into(),
                reason: "could not be decoded: msgpack: invalid marker".into()
            }
        );
    }

    #[test]
    fn a_codec_that_failed_rather_than_refused_is_retried_not_parked() {
        let e = envelope(1, 0);
        let run = PluginRun::CodecFaulted {
            reason: "msgpack-codec failed: the call ran past its 2s deadline".into(),
        };
        match decide(facts(&e, 0), run, &two_minutes_of_tries()) {
            Settlement::RetryInConsumer { reason, .. } => assert_eq!(
                reason,
                "its codec failed: msgpack-codec failed: the call ran past its 2s deadline"
            ),
            other => panic!("a retry, not {other:?}"),
        }
    }

    #[test]
    fn refused_outputs_and_host_failures_are_retried_under_the_policy() {
        let e = envelope(1, 0);
        let policy = two_minutes_of_tries();
        let refused = PluginRun::OutputsRefused {
            reason: "an output to 'x' could not be encoded: bad".into(),
            version: "v1".into(),
            fuel: None,
        };
        assert_eq!(
            decide(facts(&e, 0), refused, &policy),
            Settlement::RetryInConsumer {
                wait: Duration::from_secs(10),
                reason: "an output to 'x' could not be encoded: bad".into()
            }
        );
        let host = PluginRun::HostFailed {
            reason: "task panicked".into(),
        };
        assert_eq!(
            decide(facts(&e, 0), host, &RetryPolicy::none()),
            Settlement::DeadLetter {
                queue: "orders.new.dlq".into(),
                reason:
                    "exhausted 1 attempt: the host failed while running the plugins: task panicked"
                        .into(),
                outcome: ConsumeOutcome::DeadLettered,
            }
        );
    }

    /// No free instance slot is the host's shortage: the delivery goes back
    /// with its attempt unchanged, whatever the policy (even none, which
    /// would dead-letter a failure at once).
    #[test]
    fn a_host_without_room_for_the_plugin_gives_the_delivery_back() {
        let e = envelope(1, 0);
        let busy = PluginRun::HostBusy {
            reason: "the host had no free plugin instance slot for 2s".into(),
        };
        assert_eq!(
            decide(facts(&e, 0), busy, &RetryPolicy::none()),
            Settlement::Requeue {
                why: "the host had no room to run its plugins: the host had no free plugin instance slot for 2s".into()
            }
        );
    }

    #[test]
    fn outputs_that_failed_turn_an_accept_into_a_retry() {
        let e = envelope(1, 0);
        let accepted = Settlement::Accept {
            outputs: vec![],
            version: "v1".into(),
            reply: None,
        };
        let s = follow_up(
            facts(&e, 0),
            &accepted,
            Setback::OutputsFailed("message m1 ... reached no queue".into()),
            &two_minutes_of_tries(),
        );
        assert_eq!(
            s,
            Settlement::RetryInConsumer {
                wait: Duration::from_secs(10),
                reason: "publishing its outputs failed: message m1 ... reached no queue".into()
            }
        );
        // Without a policy the same failure dead-letters, naming it.
        let s = follow_up(
            facts(&e, 0),
            &accepted,
            Setback::OutputsFailed("boom".into()),
            &RetryPolicy::none(),
        );
        assert!(
            matches!(&s, Settlement::DeadLetter { reason, .. } if reason == "exhausted 1 attempt: publishing its outputs failed: boom"),
            "{s:?}"
        );
    }

    #[test]
    fn every_reason_is_bounded() {
        let e = envelope(1, 0);
        let huge = format!("order {} is bad", "9".repeat(200_000));
        for run in [
            decided(Outcome::Reject(huge.clone())),
            decided(Outcome::Park(huge.clone())),
            retry(&huge),
            PluginRun::HostFailed {
                reason: huge.clone(),
            },
        ] {
            let s = decide(facts(&e, 0), run, &two_minutes_of_tries());
            let reason = match &s {
                Settlement::DeadLetter { reason, .. }
                | Settlement::Park { reason, .. }
                | Settlement::RetryInConsumer { reason, .. } => reason,
                other => panic!("{other:?}"),
            };
            assert!(
                reason.len() <= envelope::MAX_REASON_BYTES,
                "{}",
                reason.len()
            );
            assert!(
                reason.ends_with(" is bad") && reason.contains("[cut "),
                "{s:?}"
            );
        }
        let s = follow_up(
            facts(&e, 0),
            &Settlement::Accept {
                outputs: vec![],
                version: "v1".into(),
                reply: None,
            },
            Setback::SetAsideFailed(huge),
            &RetryPolicy::none(),
        );
        assert!(
            matches!(&s, Settlement::Requeue { why } if why.len() <= envelope::MAX_REASON_BYTES)
        );
    }

    #[test]
    fn an_unreadable_delivery_is_parked_with_the_guards_note() {
        assert_eq!(refuse_unreadable("orders.new", None), None);
        assert_eq!(
            refuse_unreadable(
                "orders.new",
                Some("the routing key is not UTF-8: \"\\xff\"")
            ),
            Some(Settlement::Park {
                queue: "orders.new.parked".into(),
                reason:
                    "it could not be read as it was sent: the routing key is not UTF-8: \"\\xff\""
                        .into()
            })
        );
    }

    #[test]
    fn a_body_over_the_consumers_limit_is_parked_naming_both_sizes() {
        assert_eq!(refuse_oversized("orders.new", 100, 100), None);
        assert_eq!(
            refuse_oversized("orders.new", 101, 100),
            Some(Settlement::Park {
                queue: "orders.new.parked".into(),
                reason: "its body is 101 bytes, more than the 100 bytes this consumer accepts \
                         (max_body_bytes)"
                    .into()
            })
        );
    }

    #[test]
    fn a_retry_too_large_to_publish_is_dead_lettered_with_both_reasons() {
        let e = envelope(1, 0);
        let policy = two_minutes_of_tries();
        let waiting = decide(facts(&e, 0), retry("db down"), &policy);
        let s = follow_up(
            facts(&e, 0),
            &waiting,
            Setback::RetryTooLarge("too big".into()),
            &policy,
        );
        assert_eq!(
            s,
            Settlement::DeadLetter {
                queue: "orders.new.dlq".into(),
                reason: "its retry copy could not be published (too big); it failed with: db down"
                    .into(),
                outcome: ConsumeOutcome::DeadLettered,
            }
        );
    }

    #[test]
    fn a_missing_rung_becomes_a_consumer_wait_of_the_rungs_delay() {
        let e = envelope(3, 0);
        let policy = two_minutes_of_tries();
        let through_rung = decide(facts(&e, 0), retry("x"), &policy);
        let s = follow_up(facts(&e, 0), &through_rung, Setback::RungMissing, &policy);
        assert_eq!(
            s,
            Settlement::RetryInConsumer {
                wait: Duration::from_secs(40),
                reason: "x".into()
            }
        );
    }

    #[test]
    fn failed_republishes_and_shutdown_during_a_wait_requeue() {
        let e = envelope(1, 0);
        let policy = two_minutes_of_tries();
        let waiting = decide(facts(&e, 0), retry("x"), &policy);
        for (setback, why) in [
            (
                Setback::RetryNotPublished("channel closed".into()),
                "the retry was not published: channel closed",
            ),
            (
                Setback::SetAsideFailed("no queue".into()),
                "the set-aside was not published: no queue",
            ),
            (
                Setback::ShutdownDuringWait,
                "shutdown began during the retry wait",
            ),
        ] {
            let s = follow_up(facts(&e, 0), &waiting, setback, &policy);
            assert_eq!(s, Settlement::Requeue { why: why.into() });
            assert_eq!(s.outcome(), ConsumeOutcome::Retried);
        }
    }
}
