//! What happens to one delivery, decided without touching the broker.
//!
//! A delivery comes in as plain data; the handler (and, later, codecs) run;
//! the result is a [`Settlement`]: exactly one of the contract's settlements
//! (AceMQ contract §5), which `broker::consumer` then carries out. Keeping the
//! decision pure means every rule here is unit-tested without a broker.

use std::sync::Arc;
use std::time::Duration;

use crate::envelope::Envelope;
use crate::plugin::{CodecSet, Conversion, Fault, HandlerSlot, Input, Outgoing, Verdict};
use crate::retry::{Decision, RetryPolicy, WaitPlace};
use crate::topology::naming;

/// How a delivery ends. Each variant is one settlement of the contract.
#[derive(Debug, Clone, PartialEq)]
pub enum Settlement {
    /// Publish every output (confirmed, mandatory), then ack the input.
    Accept { outputs: Vec<Outgoing> },
    /// Hold the delivery unacked for `delay`, then republish it to its own
    /// queue with the attempt advanced, then ack.
    RetryInConsumer { delay: Duration, reason: String },
    /// Republish to the rung queue (it dead-letters back after its TTL), then ack.
    RetryInBroker {
        rung: String,
        delay: Duration,
        reason: String,
    },
    /// Republish to `{queue}.dlq` with `x-acemq-error`, then ack.
    DeadLetter {
        queue: String,
        reason: String,
        outcome: Outcome,
    },
    /// Republish to `{queue}.parked` with `x-acemq-error`, then ack.
    Park { queue: String, reason: String },
}

/// The contract's settlement outcome words (metrics `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    Acked,
    Retried,
    /// Exhausted, too old, or failed without a retry policy.
    DeadLettered,
    /// Deliberately refused by the handler (`reject`).
    Rejected,
    Parked,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Acked => "acked",
            Outcome::Retried => "retried",
            Outcome::DeadLettered => "dead_lettered",
            Outcome::Rejected => "rejected",
            Outcome::Parked => "parked",
        }
    }
}

impl Settlement {
    /// The outcome word counted for this settlement.
    pub fn outcome(&self) -> Outcome {
        match self {
            Settlement::Accept { .. } => Outcome::Acked,
            Settlement::RetryInConsumer { .. } | Settlement::RetryInBroker { .. } => {
                Outcome::Retried
            }
            Settlement::DeadLetter { outcome, .. } => *outcome,
            Settlement::Park { .. } => Outcome::Parked,
        }
    }
}

/// The facts about a delivery that the decision depends on.
#[derive(Debug, Clone, Copy)]
pub struct DeliveryFacts<'a> {
    pub queue: &'a str,
    pub envelope: &'a Envelope,
    pub now_ms: u64,
}

impl DeliveryFacts<'_> {
    /// Age of the message since it was first published. A first-seen in the
    /// future (clock skew between hosts) counts as age zero.
    fn age(&self) -> Duration {
        Duration::from_millis(self.now_ms.saturating_sub(self.envelope.first_seen_ms))
    }
}

/// Decides the settlement for a handler's verdict (or its fault).
pub fn decide(
    facts: DeliveryFacts<'_>,
    result: Result<Verdict, Fault>,
    outputs: Vec<Outgoing>,
    policy: &RetryPolicy,
) -> Settlement {
    match result {
        Ok(Verdict::Accept) => Settlement::Accept { outputs },
        Ok(Verdict::Retry(reason)) => retry_or_give_up(facts, or_no_reason(reason), policy),
        // A fault is a failure like any other: the policy decides.
        Err(fault) => retry_or_give_up(facts, fault.reason, policy),
        Ok(Verdict::Reject(reason)) => Settlement::DeadLetter {
            queue: naming::dead_letter_queue(facts.queue),
            reason: format!("the handler rejected it: {}", or_no_reason(reason)),
            outcome: Outcome::Rejected,
        },
        Ok(Verdict::Park(reason)) => Settlement::Park {
            queue: naming::parked_queue(facts.queue),
            reason: format!("the handler parked it: {}", or_no_reason(reason)),
        },
    }
}

/// What running the plugins on one delivery came to.
#[derive(Debug)]
pub enum Step {
    /// Every codec claiming the content type refused the body; no handler ran.
    Undecodable(String),
    /// The handler ran (or failed), and its outputs were encoded.
    Handled {
        result: Result<Verdict, Fault>,
        outputs: Vec<Outgoing>,
    },
    /// The handler accepted, but a codec refused to encode one of its outputs.
    OutputsRefused(String),
    /// The host itself failed around the plugins (a bug of ours, not the
    /// plugin's): the delivery fails like any other, so it is not lost.
    HostFailed(String),
}

/// The plugins' part of one delivery, with the version that handled it.
#[derive(Debug)]
pub struct Handled {
    pub step: Step,
    /// SHA-256 of the handler version, empty when no handler ran.
    pub version: Arc<str>,
    pub fuel: Option<u64>,
}

impl Handled {
    /// The host's own code failed (panicked) while running the plugins.
    pub fn host_failed(why: &str) -> Self {
        Self {
            step: Step::HostFailed(why.to_string()),
            version: "".into(),
            fuel: None,
        }
    }
}

/// Runs codecs and the handler for one delivery: decode, handle, encode the
/// outputs. Blocking (wasm calls): run it off the async runtime's workers.
pub fn run_plugins(handler: &HandlerSlot, codecs: &CodecSet, mut input: Input) -> Handled {
    match codecs.decode(input.content_type.as_deref(), &input.body) {
        Conversion::Unclaimed => {}
        Conversion::Converted { content_type, body } => {
            input.content_type = Some(content_type);
            input.body = body.into();
        }
        Conversion::Refused(why) => {
            return Handled {
                step: Step::Undecodable(why),
                version: "".into(),
                fuel: None,
            };
        }
    }
    let invocation = handler.invoke(input);
    let step = match invocation.result {
        Ok(Verdict::Accept) => match encode_outputs(codecs, invocation.outputs) {
            Ok(outputs) => Step::Handled {
                result: Ok(Verdict::Accept),
                outputs,
            },
            Err(why) => Step::OutputsRefused(why),
        },
        result => Step::Handled {
            result,
            outputs: Vec::new(),
        },
    };
    Handled {
        step,
        version: invocation.version,
        fuel: invocation.fuel,
    }
}

fn encode_outputs(codecs: &CodecSet, outputs: Vec<Outgoing>) -> Result<Vec<Outgoing>, String> {
    if codecs.is_empty() {
        return Ok(outputs);
    }
    outputs
        .into_iter()
        .map(
            |mut output| match codecs.encode(output.content_type.as_deref(), &output.body) {
                Conversion::Unclaimed => Ok(output),
                Conversion::Converted { content_type, body } => {
                    output.content_type = Some(content_type);
                    output.body = body;
                    Ok(output)
                }
                Conversion::Refused(why) => Err(format!(
                    "an output to '{}' could not be encoded: {why}",
                    output.exchange
                )),
            },
        )
        .collect()
}

/// The settlement for what the plugins came to.
pub fn settle(facts: DeliveryFacts<'_>, step: Step, policy: &RetryPolicy) -> Settlement {
    match step {
        Step::Undecodable(why) => undecodable(facts.queue, &why),
        Step::OutputsRefused(why) => retry_or_give_up(facts, why, policy),
        Step::HostFailed(why) => retry_or_give_up(
            facts,
            format!("the host failed while running the plugins: {why}"),
            policy,
        ),
        Step::Handled { result, outputs } => decide(facts, result, outputs, policy),
    }
}

/// A delivery whose body no codec could decode is parked before any handler
/// runs (contract §5), never retried.
pub fn undecodable(queue: &str, why: &str) -> Settlement {
    Settlement::Park {
        queue: naming::parked_queue(queue),
        reason: format!("could not be decoded: {why}"),
    }
}

/// Outputs that could not be published turn an accept into a failure, which
/// the policy handles like a retry (outputs are at-least-once).
pub fn outputs_failed(facts: DeliveryFacts<'_>, why: &str, policy: &RetryPolicy) -> Settlement {
    retry_or_give_up(
        facts,
        format!("publishing its outputs failed: {why}"),
        policy,
    )
}

fn retry_or_give_up(facts: DeliveryFacts<'_>, reason: String, policy: &RetryPolicy) -> Settlement {
    match policy.decide(facts.envelope.attempt, Some(facts.age())) {
        Decision::Wait {
            delay,
            place: WaitPlace::Consumer,
        } => Settlement::RetryInConsumer { delay, reason },
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
            Err(_) => Settlement::RetryInConsumer { delay, reason },
        },
        Decision::GiveUp(give_up) => Settlement::DeadLetter {
            queue: naming::dead_letter_queue(facts.queue),
            reason: give_up.error_text(&reason),
            outcome: Outcome::DeadLettered,
        },
    }
}

fn or_no_reason(reason: String) -> String {
    if reason.trim().is_empty() {
        "no reason given".to_string()
    } else {
        reason
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::FaultKind;

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
        }
    }

    #[test]
    fn accept_carries_the_outputs() {
        let e = envelope(1, 0);
        let s = decide(
            facts(&e, 0),
            Ok(Verdict::Accept),
            vec![],
            &RetryPolicy::none(),
        );
        assert_eq!(s, Settlement::Accept { outputs: vec![] });
        assert_eq!(s.outcome(), Outcome::Acked);
    }

    #[test]
    fn retry_without_a_policy_is_dead_lettered_as_exhausted() {
        let e = envelope(1, 0);
        let s = decide(
            facts(&e, 0),
            Ok(Verdict::Retry("db down".into())),
            vec![],
            &RetryPolicy::none(),
        );
        assert_eq!(
            s,
            Settlement::DeadLetter {
                queue: "orders.new.dlq".into(),
                reason: "exhausted 1 attempt: db down".into(),
                outcome: Outcome::DeadLettered,
            }
        );
    }

    #[test]
    fn short_waits_stay_in_the_consumer_and_long_ones_use_a_rung() {
        let policy = RetryPolicy::exponential(6, Duration::from_secs(10), Duration::from_secs(300));
        let e = envelope(1, 0);
        let s = decide(
            facts(&e, 0),
            Ok(Verdict::Retry("x".into())),
            vec![],
            &policy,
        );
        assert!(
            matches!(s, Settlement::RetryInConsumer { delay, .. } if delay == Duration::from_secs(10))
        );
        let e = envelope(3, 0);
        let s = decide(
            facts(&e, 0),
            Ok(Verdict::Retry("x".into())),
            vec![],
            &policy,
        );
        assert_eq!(
            s,
            Settlement::RetryInBroker {
                rung: "orders.new.retry.40s".into(),
                delay: Duration::from_secs(40),
                reason: "x".into()
            }
        );
        assert_eq!(s.outcome(), Outcome::Retried);
    }

    #[test]
    fn exhaustion_names_the_attempts() {
        let policy = RetryPolicy::fixed(3, Duration::from_secs(1));
        let e = envelope(3, 0);
        let s = decide(
            facts(&e, 0),
            Ok(Verdict::Retry("still down".into())),
            vec![],
            &policy,
        );
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
        let s = decide(
            facts(&e, 121_000),
            Ok(Verdict::Retry("slow".into())),
            vec![],
            &policy,
        );
        assert!(
            matches!(&s, Settlement::DeadLetter { reason, outcome: Outcome::DeadLettered, .. }
            if reason.starts_with("exceeded the maximum message age of 2m")),
            "{s:?}"
        );
    }

    #[test]
    fn reject_and_park_use_the_contract_wording() {
        let e = envelope(1, 0);
        let s = decide(
            facts(&e, 0),
            Ok(Verdict::Reject("missing field `total`".into())),
            vec![],
            &RetryPolicy::none(),
        );
        assert_eq!(
            s,
            Settlement::DeadLetter {
                queue: "orders.new.dlq".into(),
                reason: "the handler rejected it: missing field `total`".into(),
                outcome: Outcome::Rejected
            }
        );
        let s = decide(
            facts(&e, 0),
            Ok(Verdict::Park(String::new())),
            vec![],
            &RetryPolicy::none(),
        );
        assert_eq!(
            s,
            Settlement::Park {
                queue: "orders.new.parked".into(),
                reason: "the handler parked it: no reason given".into()
            }
        );
    }

    #[test]
    fn a_fault_is_retried_under_the_policy() {
        let e = envelope(1, 0);
        let fault = Fault {
            kind: FaultKind::Deadline,
            reason: "deadline of 2s exceeded".into(),
        };
        let s = decide(facts(&e, 0), Err(fault), vec![], &RetryPolicy::none());
        assert!(
            matches!(&s, Settlement::DeadLetter { reason, .. } if reason == "exhausted 1 attempt: deadline of 2s exceeded")
        );
    }

    #[test]
    fn undecodable_bodies_are_parked() {
        assert_eq!(
            undecodable("orders.new", "msgpack: invalid marker"),
            Settlement::Park {
                queue: "orders.new.parked".into(),
                reason: "could not be decoded: msgpack: invalid marker".into()
            }
        );
    }
}
