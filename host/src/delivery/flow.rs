//! Where a delivery goes on after its handler (contract §11): the answer to
//! a request, and the hop to a routing slip's next step.
//!
//! Read with the envelope, before any plugin runs ([`Flow::read`]): a slip
//! that cannot be followed sets the message aside to `{q}.dlq` there and
//! then, so no step does work for a message it could not forward. Settled
//! with the delivery (`settle.rs`):
//!
//! * after an accept, the handler's outputs, its reply ([`reply_publication`],
//!   not mandatory) and the slip's next hop ([`hop_publication`], the host's
//!   own publish, mandatory) go out as one confirmed batch, then the request
//!   is acked; one not confirmed fails the accept like an output would, so
//!   the delivery is not acked;
//! * a request set aside (reject, park, retries run out, a fault, a body
//!   that could not be decoded, a slip that cannot be followed) is answered
//!   with the error reply ([`error_reply_publication`]) before its set-aside
//!   copy;
//! * a request accepted without a reply gets none: an accept says the work
//!   is done, not what the answer is, and a made-up one would be a lie the
//!   caller cannot tell from the real thing (it waits for its timeout, as it
//!   would for a responder that sends nothing).
//!
//! The builders are pure (the span they publish in is drawn by the caller's
//! trace); `settle.rs` publishes what they return.

use bytes::Bytes;
use lapin::BasicProperties;

use super::decide::{ConsumeOutcome, Settlement};
use super::plugins::PluginRun;
use super::settle::Subject;
use crate::broker::publisher::Publication;
use crate::envelope::{
    self, Arrival, Envelope, ErrorType, NO_REPLY_ADDRESS, Reply, Request, Slip, SlipError,
};
use crate::plugin::Outcome;
use crate::topology::naming;
use crate::trace::TraceParent;

/// What a delivery asks of its settlement beyond an ack.
#[derive(Debug, Clone, Default)]
pub struct Flow {
    /// The requester's address, when the delivery is a request.
    pub request: Option<Request>,
    /// Its routing slip, checked.
    pub slip: Option<Slip>,
    /// The body as delivered (before any codec): a hop forwards it as is.
    pub body: Bytes,
    /// Why the request failed, in the `acemq-error` words, once known
    /// ([`failure_of`]); the settlement's own kind when not.
    pub failure: Option<ErrorType>,
}

impl Flow {
    /// The flow of a delivery, or, when its slip cannot be followed, the
    /// flow without it and the set-aside that takes its place.
    pub fn read(
        queue: &str,
        properties: &BasicProperties,
        envelope: &Envelope,
        exchange: &str,
        body: &Bytes,
    ) -> (Self, Option<Settlement>) {
        let mut flow = Self {
            request: Request::of(properties),
            slip: None,
            body: body.clone(),
            failure: None,
        };
        let arrival = Arrival { exchange, queue };
        match Slip::read(properties.headers().as_ref(), envelope, arrival) {
            Ok(slip) => {
                flow.slip = slip;
                (flow, None)
            }
            Err(error) => {
                flow.failure = Some(ErrorType::InvalidRoutingSlip);
                (flow, Some(refuse_slip(queue, &error)))
            }
        }
    }

    /// The `acemq-error` kind of `settlement`, when it sets the request
    /// aside: what made it fail when that is known, else what the
    /// settlement says (a reject, a park, or retries that ran out, which a
    /// failed republish or an output not confirmed also ends in).
    #[must_use]
    pub fn error_type(&self, settlement: &Settlement) -> Option<ErrorType> {
        let settled = match settlement {
            Settlement::DeadLetter {
                outcome: ConsumeOutcome::Rejected,
                ..
            } => ErrorType::Rejected,
            Settlement::DeadLetter { .. } => ErrorType::RetriesExhausted,
            Settlement::Park { .. } => ErrorType::Parked,
            _ => return None,
        };
        Some(self.failure.unwrap_or(settled))
    }
}

/// The set-aside of a delivery whose slip cannot be followed: `{q}.dlq`
/// (no retry makes the slip readable), before any handler runs.
#[must_use]
pub fn refuse_slip(queue: &str, error: &SlipError) -> Settlement {
    Settlement::DeadLetter {
        queue: naming::dead_letter_queue(queue),
        reason: format!("its routing slip cannot be followed: {error}"),
        outcome: ConsumeOutcome::DeadLettered,
    }
    .with_bounded_reason()
}

/// What made a run fail, in the `acemq-error` words, where the settlement
/// alone would not tell: a fault or a configuration fault of the plugin
/// (set aside once its retries run out, or at once), a body no codec
/// decoded, the handler's own reject or park.
#[must_use]
pub fn failure_of(run: &PluginRun) -> Option<ErrorType> {
    Some(match run {
        PluginRun::Faulted { .. } | PluginRun::Misconfigured { .. } => ErrorType::PluginFault,
        PluginRun::Undecodable { .. } => ErrorType::Undecodable,
        PluginRun::Decided {
            outcome: Outcome::Reject(_),
            ..
        } => ErrorType::Rejected,
        PluginRun::Decided {
            outcome: Outcome::Park(_),
            ..
        } => ErrorType::Parked,
        _ => return None,
    })
}

/// An accept whose handler replied to a delivery that names no reply
/// queue is not carried out: nothing would receive the answer, and
/// acking would let the requester's mistake pass unseen. It is rejected to
/// `{q}.dlq` instead, the reason naming both places an address is looked
/// for. Every other settlement is returned as it is.
#[must_use]
pub fn refuse_unanswerable(queue: &str, flow: &Flow, settlement: Settlement) -> Settlement {
    match &settlement {
        Settlement::Accept { reply: Some(_), .. } if flow.request.is_none() => {
            Settlement::DeadLetter {
                queue: naming::dead_letter_queue(queue),
                reason: NO_REPLY_ADDRESS.to_string(),
                outcome: ConsumeOutcome::Rejected,
            }
        }
        _ => settlement,
    }
}

/// The handler's reply as a publication to the requester: default
/// exchange, routing key = the reply queue, not mandatory (a reply queue
/// that has gone means the caller has gone, and the request is still
/// done), with the id the plugin chose or else one derived from the
/// request and the handler `version`. Refused when its properties would
/// not fit a frame of `frame_max`.
pub fn reply_publication(
    subject: Subject<'_>,
    request: &Request,
    reply: Reply,
    version: &str,
    now_ms: u64,
    frame_max: u32,
    span: &TraceParent,
) -> Result<Publication, String> {
    let asked = subject.envelope;
    let id = reply
        .id
        .clone()
        .unwrap_or_else(|| envelope::reply_id(&asked.id, version));
    let answer = Envelope::reply_to(
        asked,
        id,
        reply.message_type.as_deref(),
        reply.version,
        envelope::default_origin(),
        now_ms,
    );
    let properties = envelope::reply_properties(
        &answer,
        request,
        reply.content_type.as_deref(),
        &reply.headers,
    )
    .map_err(|e| format!("its reply cannot be published: {e}"))?;
    let properties = subject.trace.stamp(properties, span);
    envelope::check_frame(&properties, frame_max).map_err(|e| {
        format!(
            "its reply to '{}' cannot be published: {e}",
            request.reply_to
        )
    })?;
    Ok(Publication {
        exchange: String::new(),
        routing_key: request.reply_to.clone(),
        body: Bytes::from(reply.body),
        properties,
        mandatory: false,
    })
}

/// The copy of the delivery forwarded to its slip's next step, or `None`
/// when the step just done was the last: body as delivered, envelope and
/// slip as [`envelope::hop_properties`] writes them, mandatory (a step
/// that nobody consumes would lose the message) and confirmed like every
/// publish the host makes on its own account. Refused when its properties
/// would not fit a frame of `frame_max`.
pub fn hop_publication(
    subject: Subject<'_>,
    now_ms: u64,
    frame_max: u32,
    span: &TraceParent,
) -> Result<Option<Publication>, String> {
    let flow = subject.flow;
    let Some(hop) = flow.slip.as_ref().and_then(|slip| slip.next_hop(now_ms)) else {
        return Ok(None);
    };
    let traced = subject.trace.stamp(subject.properties.clone(), span);
    let properties = envelope::hop_properties(&traced, subject.envelope, &hop);
    envelope::check_frame(&properties, frame_max).map_err(|e| {
        format!(
            "its copy to the routing slip's next step '{}' cannot be published: {e}",
            hop.step
        )
    })?;
    Ok(Some(Publication {
        exchange: hop.exchange,
        routing_key: hop.routing_key,
        body: flow.body.clone(),
        properties,
        mandatory: true,
    }))
}

/// The error reply to a request set aside by `settlement` (its reason is
/// the message), or `None` when the delivery is no request or is not set
/// aside. Not mandatory, as every reply. An error reply too big for the
/// frame (only a request with huge headers makes one) is left out: the
/// set-aside must still happen, and the caller's timeout answers instead.
pub fn error_reply_publication(
    subject: Subject<'_>,
    settlement: &Settlement,
    now_ms: u64,
    frame_max: u32,
    span: &TraceParent,
) -> Option<Publication> {
    let request = subject.flow.request.as_ref()?;
    let error = subject.flow.error_type(settlement)?;
    let reason = settlement.reason().unwrap_or(envelope::NO_REASON);
    let (properties, body) = envelope::error_reply(
        subject.envelope,
        request,
        error,
        reason,
        envelope::default_origin(),
        now_ms,
    );
    let properties = subject.trace.stamp(properties, span);
    envelope::check_frame(&properties, frame_max).ok()?;
    Some(Publication {
        exchange: String::new(),
        routing_key: request.reply_to.clone(),
        body: Bytes::from(body),
        properties,
        mandatory: false,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use lapin::types::{AMQPValue, FieldTable, LongString};

    use super::*;
    use crate::envelope::{ROUTING_SLIP_HEADER, reply_header};
    use crate::plugin::{Fault, FaultKind};

    const NOW: u64 = 1_770_091_506_789;

    fn headers(entries: &[(&str, &str)]) -> FieldTable {
        let mut table = FieldTable::default();
        for (name, value) in entries {
            table.insert(
                (*name).into(),
                AMQPValue::LongString(LongString::from(*value)),
            );
        }
        table
    }

    fn read(properties: &BasicProperties) -> (Flow, Option<Settlement>) {
        let envelope = Envelope::read(properties, "k", NOW);
        Flow::read(
            "orders",
            properties,
            &envelope,
            "ex",
            &Bytes::from_static(b"body"),
        )
    }

    #[test]
    fn a_request_and_its_slip_are_read_with_the_delivery() {
        let properties = BasicProperties::default()
            .with_headers(headers(&[
                (reply_header::REPLY_TO, "replies"),
                (
                    ROUTING_SLIP_HEADER,
                    r#"{"steps":[{"exchange":"a","routingKey":"a"},{"exchange":"b","routingKey":"b"}]}"#,
                ),
            ]))
            .with_correlation_id("c-1".into());
        let (flow, refusal) = read(&properties);
        assert_eq!(refusal, None);
        assert_eq!(flow.request.as_ref().unwrap().reply_to, "replies");
        assert_eq!(flow.slip.unwrap().next_hop(NOW).unwrap().routing_key, "b");
        assert_eq!(&flow.body[..], b"body");
    }

    #[test]
    fn an_unfollowable_slip_sets_the_delivery_aside_to_its_dlq() {
        let properties = BasicProperties::default().with_headers(headers(&[
            (reply_header::REPLY_TO, "replies"),
            (ROUTING_SLIP_HEADER, r#"{"steps":[{"routingKey":"a"}]}"#),
        ]));
        let (flow, refusal) = read(&properties);
        let Some(Settlement::DeadLetter {
            queue,
            reason,
            outcome,
        }) = refusal.clone()
        else {
            panic!("{refusal:?}");
        };
        assert_eq!(queue, "orders.dlq");
        assert_eq!(outcome, ConsumeOutcome::DeadLettered);
        assert_eq!(
            reason,
            "its routing slip cannot be followed: step 0 of the acemq-routing-slip header has \
             no \"exchange\" text"
        );
        // Still a request: the requester hears why.
        assert_eq!(
            flow.error_type(&refusal.unwrap()),
            Some(ErrorType::InvalidRoutingSlip)
        );
    }

    #[test]
    fn the_error_type_is_what_failed_else_what_the_settlement_says() {
        let dead_letter = |outcome| Settlement::DeadLetter {
            queue: "q.dlq".into(),
            reason: "r".into(),
            outcome,
        };
        let park = Settlement::Park {
            queue: "q.parked".into(),
            reason: "r".into(),
        };
        let flow = Flow::default();
        assert_eq!(
            flow.error_type(&dead_letter(ConsumeOutcome::Rejected)),
            Some(ErrorType::Rejected)
        );
        assert_eq!(
            flow.error_type(&dead_letter(ConsumeOutcome::DeadLettered)),
            Some(ErrorType::RetriesExhausted)
        );
        assert_eq!(flow.error_type(&park), Some(ErrorType::Parked));
        let retry = Settlement::Requeue { why: "x".into() };
        assert_eq!(
            flow.error_type(&retry),
            None,
            "only a set-aside is answered"
        );
        let faulted = Flow {
            failure: Some(ErrorType::PluginFault),
            ..Flow::default()
        };
        assert_eq!(
            faulted.error_type(&dead_letter(ConsumeOutcome::DeadLettered)),
            Some(ErrorType::PluginFault)
        );
    }

    #[test]
    fn failures_are_named_by_what_ran() {
        let decided = |outcome| PluginRun::Decided {
            outcome,
            outputs: vec![],
            version: Arc::from("v"),
            fuel: None,
            reply: None,
        };
        assert_eq!(
            failure_of(&decided(Outcome::Reject("x".into()))),
            Some(ErrorType::Rejected)
        );
        assert_eq!(
            failure_of(&decided(Outcome::Park("x".into()))),
            Some(ErrorType::Parked)
        );
        assert_eq!(failure_of(&decided(Outcome::Retry("x".into()))), None);
        assert_eq!(failure_of(&decided(Outcome::Accept)), None);
        assert_eq!(
            failure_of(&PluginRun::Undecodable { reason: "x".into() }),
            Some(ErrorType::Undecodable)
        );
        let fault = PluginRun::Faulted {
            fault: Fault {
                kind: FaultKind::Trap,
                reason: "trap: x".into(),
            },
            version: Arc::from("v"),
            fuel: None,
        };
        assert_eq!(failure_of(&fault), Some(ErrorType::PluginFault));
        let misconfigured = PluginRun::Misconfigured {
            reason: "x".into(),
            version: Arc::from("v"),
            fuel: None,
        };
        assert_eq!(failure_of(&misconfigured), Some(ErrorType::PluginFault));
    }

    #[test]
    fn a_reply_without_an_address_rejects_the_request_naming_both_places() {
        let accept = |reply| Settlement::Accept {
            outputs: vec![],
            version: Arc::from("v"),
            reply,
        };
        let reply = Reply {
            body: b"{}".to_vec(),
            content_type: None,
            headers: vec![],
            id: None,
            message_type: None,
            version: None,
        };
        let refused = refuse_unanswerable(
            "orders",
            &Flow::default(),
            accept(Some(Box::new(reply.clone()))),
        );
        assert_eq!(
            refused,
            Settlement::DeadLetter {
                queue: "orders.dlq".into(),
                reason: NO_REPLY_ADDRESS.into(),
                outcome: ConsumeOutcome::Rejected,
            }
        );
        let request = Flow {
            request: Request::of(&BasicProperties::default().with_reply_to("r".into())),
            ..Flow::default()
        };
        assert_eq!(
            refuse_unanswerable("orders", &request, accept(Some(Box::new(reply.clone())))),
            accept(Some(Box::new(reply)))
        );
        // No reply, nothing to refuse.
        assert_eq!(
            refuse_unanswerable("orders", &Flow::default(), accept(None)),
            accept(None)
        );
    }
}
