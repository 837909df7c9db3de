//! The AceMQ scheduler (contract §11): how a message published "for later"
//! waits in the broker and is delivered at its due time, shared on one vhost
//! by this host and every AceMQ library.
//!
//! A scheduled message goes to the direct exchange `acemq.schedule` with the
//! name of the largest rung not longer than the time left as routing key.
//! Each rung is a classic queue with a fixed `x-message-ttl` that
//! dead-letters to `acemq.schedule` with the key `acemq.schedule.due`: when
//! the TTL runs out the broker moves the message to the control queue
//! `acemq.schedule.due`. The control consumer ([`control`]) then either
//! sends it down the next rung or, with under a second left, publishes it to
//! its final exchange and routing key, and only then acks it. The ladder
//! (1 h, 10 min, 1 min, 10 s, 1 s) reaches any due time with a handful of
//! hops: a message waits at most one rung too few, never one too many.
//!
//! Where the libraries leave a choice, this host takes the interoperable one:
//! - The headers are read leniently (any integer width for the due time, a
//!   short or long string for the texts, no content type meaning
//!   `application/json`) and written the one way Java writes them (texts as
//!   long strings, the due time as a 64-bit long).
//! - With under a second left the control consumer holds the message until
//!   its due time rather than deliver it up to a second early, on up to 40
//!   of its 50 places ([`control::HOLD_PLACES`]); beyond that it delivers
//!   at once, as the contract allows.
//! - The envelope type while scheduled is `ScheduledMessage`, as the
//!   contract says; the host carries the message's own type in the
//!   extension header `x-schedule-message-type` and restores it on the final
//!   delivery. A message another library scheduled has none and is
//!   delivered as that library delivers it.

pub mod control;
pub mod list;
pub mod rungs;
pub mod wire;

use crate::topology::QueueDecl;
use crate::topology::build::holding_queue;
use crate::topology::{ArgValue, Arguments, DeclaredBy};

/// The scheduler's direct exchange.
pub const EXCHANGE: &str = "acemq.schedule";
/// The control queue: where rungs dead-letter, and what the control
/// consumer reads.
pub const DUE_QUEUE: &str = "acemq.schedule.due";
/// The envelope type of a message while it is scheduled.
pub const SCHEDULED_TYPE: &str = "ScheduledMessage";
/// The control consumer's prefetch: the contract's, in every library.
pub const CONTROL_PREFETCH: u16 = 50;

/// The headers of a scheduled message. Not `x-acemq-*`: every library
/// reads these names, and strips every `x-schedule-*` header on delivery.
pub mod header {
    pub const PREFIX: &str = "x-schedule-";
    pub const EXCHANGE: &str = "x-schedule-exchange";
    pub const ROUTING_KEY: &str = "x-schedule-routing-key";
    /// Epoch milliseconds, an integer.
    pub const DUE_AT: &str = "x-schedule-due-at";
    pub const CONTENT_TYPE: &str = "x-schedule-content-type";
    /// This host's extension: the message's own envelope type.
    pub const MESSAGE_TYPE: &str = "x-schedule-message-type";
}

/// The scheduler's six queues, exactly as the contract declares them: each
/// rung classic and durable with exactly `x-message-ttl`,
/// `x-dead-letter-exchange: acemq.schedule` and `x-dead-letter-routing-key:
/// acemq.schedule.due`; the control queue classic with no arguments.
#[must_use]
pub fn topology_queues() -> Vec<QueueDecl> {
    let by = DeclaredBy::Topology;
    let mut queues: Vec<QueueDecl> = rungs::RUNGS
        .iter()
        .map(|rung| QueueDecl {
            arguments: Arguments::from([
                (
                    "x-message-ttl".to_string(),
                    ArgValue::Int(i64::try_from(rung.ttl_ms).unwrap_or(i64::MAX)),
                ),
                ("x-dead-letter-exchange".to_string(), EXCHANGE.into()),
                ("x-dead-letter-routing-key".to_string(), DUE_QUEUE.into()),
            ]),
            ..holding_queue(rung.name.to_string(), by)
        })
        .collect();
    queues.push(holding_queue(DUE_QUEUE.to_string(), by));
    queues
}

/// Every queue the scheduler keeps messages in, longest wait first.
#[must_use]
pub fn queue_names() -> Vec<&'static str> {
    rungs::RUNGS
        .iter()
        .map(|rung| rung.name)
        .chain([DUE_QUEUE])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::QueueType;

    #[test]
    fn six_classic_durable_queues_with_exactly_the_contract_arguments() {
        let queues = topology_queues();
        let names: Vec<&str> = queues.iter().map(|q| q.name.as_str()).collect();
        assert_eq!(names, queue_names());
        assert_eq!(
            names,
            [
                "acemq.schedule.1h",
                "acemq.schedule.10m",
                "acemq.schedule.1m",
                "acemq.schedule.10s",
                "acemq.schedule.1s",
                "acemq.schedule.due"
            ]
        );
        for queue in &queues {
            assert_eq!(queue.queue_type, QueueType::Classic);
            assert!(queue.durable && !queue.exclusive && !queue.auto_delete);
            assert!(!queue.arguments.contains_key("x-queue-type"));
        }
        let ten_seconds = &queues[3];
        assert_eq!(
            ten_seconds.arguments,
            Arguments::from([
                ("x-message-ttl".to_string(), ArgValue::Int(10_000)),
                (
                    "x-dead-letter-exchange".to_string(),
                    "acemq.schedule".into()
                ),
                (
                    "x-dead-letter-routing-key".to_string(),
                    "acemq.schedule.due".into()
                ),
            ])
        );
        assert!(queues[5].arguments.is_empty());
    }
}
