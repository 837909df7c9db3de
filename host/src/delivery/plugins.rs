//! The plugins' part of one delivery: decode the body, call the handler,
//! encode its outputs.
//!
//! A future on the async runtime: plugin calls yield between epoch ticks
//! (`plugin/pool.rs`), so a long call never holds a worker for more than a
//! tick. What it returns is a [`PluginRun`], plain data that `decide.rs`
//! turns into a settlement.

use std::sync::Arc;

use crate::envelope::Reply;
use crate::plugin::{
    CodecSet, Conversion, Fault, HandlerSlot, HandlerVersion, Input, Invocation, Outcome, Outgoing,
    StateEnd,
};
use crate::rollout::decision::{Decision, Output as DecidedOutput};
use crate::rollout::judge::Call;

/// What running the plugins on one delivery produced.
#[derive(Debug)]
pub enum PluginRun {
    /// Every codec claiming the content type refused the body; no handler ran.
    Undecodable { reason: String },
    /// A codec claiming the content type failed (trap, deadline, memory)
    /// before any converted it; no handler ran.
    CodecFaulted { reason: String },
    /// The handler returned a outcome; for an accept, its outputs (and its
    /// reply, when it answered) are encoded and ready to publish (otherwise
    /// there are none).
    Decided {
        outcome: Outcome,
        outputs: Vec<Outgoing>,
        version: Arc<str>,
        fuel: Option<u64>,
        reply: Option<Reply>,
    },
    /// The handler call failed: trap, panic, deadline, memory, fuel.
    Faulted {
        fault: Fault,
        version: Arc<str>,
        fuel: Option<u64>,
    },
    /// The handler accepted, but a codec refused to encode one of its outputs.
    OutputsRefused {
        reason: String,
        version: Arc<str>,
        fuel: Option<u64>,
    },
    /// The handler published to an exchange its consumer's `publish_to`
    /// does not allow: a configuration fault, whatever it returned after.
    Misconfigured {
        reason: String,
        version: Arc<str>,
        fuel: Option<u64>,
    },
    /// The host itself failed around the plugins (a bug of ours, not the
    /// plugin's): the delivery fails like any other, so it is not lost.
    HostFailed { reason: String },
    /// The host had no room to run a plugin (no free slot in the engine's
    /// instance pool until the deadline): neither the message's fault nor
    /// the plugin's, so the delivery is given back without counting an
    /// attempt, and no plugin outcome is recorded.
    HostBusy { reason: String },
    /// The state store could not be reached during the handler's call:
    /// the delivery waits (given back after a pause), no attempt counted.
    StoreUnavailable { reason: String },
    /// The handler's checked state writes conflicted on every run
    /// (`state::consumer::MAX_RERUNS`): a failure, the policy decides.
    StateConflicted { reason: String, version: Arc<str> },
}

impl PluginRun {
    /// SHA-256 of the handler version that ran, if one did.
    pub fn version(&self) -> Option<&Arc<str>> {
        match self {
            PluginRun::Decided { version, .. }
            | PluginRun::Faulted { version, .. }
            | PluginRun::OutputsRefused { version, .. }
            | PluginRun::Misconfigured { version, .. }
            | PluginRun::StateConflicted { version, .. } => Some(version),
            PluginRun::Undecodable { .. }
            | PluginRun::CodecFaulted { .. }
            | PluginRun::HostFailed { .. }
            | PluginRun::HostBusy { .. }
            | PluginRun::StoreUnavailable { .. } => None,
        }
    }

    /// Fuel the handler call burned, when fuel metering is on.
    pub fn fuel(&self) -> Option<u64> {
        match self {
            PluginRun::Decided { fuel, .. }
            | PluginRun::Faulted { fuel, .. }
            | PluginRun::OutputsRefused { fuel, .. }
            | PluginRun::Misconfigured { fuel, .. } => *fuel,
            PluginRun::Undecodable { .. }
            | PluginRun::CodecFaulted { .. }
            | PluginRun::HostFailed { .. }
            | PluginRun::HostBusy { .. }
            | PluginRun::StoreUnavailable { .. }
            | PluginRun::StateConflicted { .. } => None,
        }
    }
}

impl PluginRun {
    /// What the handler decided, as two versions are compared (a live
    /// shadow, `replay --compare`): the outcome and its reason, and the
    /// outputs it would publish; the host's own words for a run in which
    /// no handler decided.
    pub fn decision(&self) -> Decision {
        let plain = |word: &str| Decision {
            word: word.to_string(),
            reason: None,
            outputs: Vec::new(),
        };
        match self {
            PluginRun::Decided {
                outcome, outputs, ..
            } => {
                let (word, reason) = match outcome {
                    Outcome::Accept => ("accept", None),
                    Outcome::Retry(why) => ("retry", Some(why.clone())),
                    Outcome::Reject(why) => ("reject", Some(why.clone())),
                    Outcome::Park(why) => ("park", Some(why.clone())),
                };
                Decision {
                    word: word.to_string(),
                    reason,
                    outputs: outputs
                        .iter()
                        .map(|o| DecidedOutput::new(&o.exchange, &o.routing_key, &o.body))
                        .collect(),
                }
            }
            PluginRun::Faulted { fault, .. } => plain(&format!("fault: {}", fault.kind.label())),
            PluginRun::OutputsRefused { .. } => plain("outputs refused"),
            PluginRun::Misconfigured { .. } => plain("published outside publish_to"),
            PluginRun::Undecodable { .. } => plain("undecodable"),
            PluginRun::CodecFaulted { .. } => plain("fault: codec"),
            PluginRun::HostFailed { .. } => plain("host failure"),
            PluginRun::HostBusy { .. } => plain("host busy"),
            PluginRun::StoreUnavailable { .. } => plain("state store unavailable"),
            PluginRun::StateConflicted { .. } => plain("state conflict"),
        }
    }

    /// What the call of the version that ran came to, for a rollout's
    /// window; `None` when no handler ran (the host's or a codec's doing,
    /// not the version's).
    pub fn rollout_call(&self, took: std::time::Duration) -> Option<Call> {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let call = |faulted, set_aside, outputs: usize| Call {
            faulted,
            set_aside,
            outputs: outputs as u64,
            micros,
        };
        match self {
            PluginRun::Decided {
                outcome, outputs, ..
            } => Some(call(
                false,
                matches!(outcome, Outcome::Reject(_) | Outcome::Park(_)),
                outputs.len(),
            )),
            PluginRun::Faulted { .. }
            | PluginRun::OutputsRefused { .. }
            | PluginRun::Misconfigured { .. }
            | PluginRun::StateConflicted { .. } => Some(call(true, false, 0)),
            PluginRun::Undecodable { .. }
            | PluginRun::CodecFaulted { .. }
            | PluginRun::HostFailed { .. }
            | PluginRun::HostBusy { .. }
            | PluginRun::StoreUnavailable { .. } => None,
        }
    }
}

/// Runs codecs and the handler for one delivery: decode, handle, encode the
/// outputs.
pub async fn run_plugins(handler: &HandlerSlot, codecs: &CodecSet, input: Input) -> PluginRun {
    run_plugins_with_state(&handler.current(), codecs, input)
        .await
        .0
}

/// [`run_plugins`], and the state the handler left: its writes, to commit
/// if the input is accepted. A call during which the state store could not
/// be reached is the host's trouble, whatever the plugin made of it: the
/// delivery is given back to wait ([`PluginRun::StoreUnavailable`]).
pub async fn run_plugins_with_state(
    handler: &HandlerVersion,
    codecs: &CodecSet,
    mut input: Input,
) -> (PluginRun, StateEnd) {
    match codecs.decode(input.content_type(), &input.body).await {
        Conversion::Unclaimed => {}
        Conversion::Converted { content_type, body } => {
            input.decoded_content_type = Some(content_type);
            input.body = body.into();
        }
        Conversion::Refused(reason) => {
            return (PluginRun::Undecodable { reason }, StateEnd::default());
        }
        Conversion::Faulted(reason) => {
            return (PluginRun::CodecFaulted { reason }, StateEnd::default());
        }
        Conversion::HostBusy(reason) => {
            return (PluginRun::HostBusy { reason }, StateEnd::default());
        }
    }
    let mut invocation = handler.invoke(input).await;
    let state = std::mem::take(&mut invocation.state);
    if let Some(reason) = &state.unavailable {
        let reason = reason.clone();
        return (PluginRun::StoreUnavailable { reason }, state);
    }
    (decided(codecs, invocation).await, state)
}

/// The run for the handler's invocation: its outcome, with the outputs of
/// an accept encoded.
async fn decided(codecs: &CodecSet, invocation: Invocation) -> PluginRun {
    let (version, fuel) = (invocation.version, invocation.fuel);
    if let Some(reason) = invocation.refused_publish {
        return PluginRun::Misconfigured {
            reason,
            version,
            fuel,
        };
    }
    match invocation.result {
        Ok(Outcome::Accept) => match encode_all(codecs, invocation.outputs, invocation.reply).await
        {
            Ok((outputs, reply)) => PluginRun::Decided {
                outcome: Outcome::Accept,
                outputs,
                version,
                fuel,
                reply,
            },
            Err(NotEncoded::Refused(reason)) => PluginRun::OutputsRefused {
                reason,
                version,
                fuel,
            },
            Err(NotEncoded::HostBusy(reason)) => PluginRun::HostBusy { reason },
        },
        // Only an accept publishes: whatever else was buffered is dropped.
        Ok(outcome) => PluginRun::Decided {
            outcome,
            outputs: Vec::new(),
            version,
            fuel,
            reply: None,
        },
        Err(fault) if fault.kind.is_the_hosts() => PluginRun::HostBusy {
            reason: fault.reason,
        },
        Err(fault) => PluginRun::Faulted {
            fault,
            version,
            fuel,
        },
    }
}

/// Why the outputs of an accept were not all encoded.
enum NotEncoded {
    /// A codec refused or failed on one: the message's run failed.
    Refused(String),
    /// The host had no instance slot for a codec: the host's fault.
    HostBusy(String),
}

/// The outputs and the reply of an accept, encoded alike: a reply is a
/// message the requester's codecs read like any other.
async fn encode_all(
    codecs: &CodecSet,
    outputs: Vec<Outgoing>,
    reply: Option<Reply>,
) -> Result<(Vec<Outgoing>, Option<Reply>), NotEncoded> {
    let outputs = encode_outputs(codecs, outputs).await?;
    let Some(mut reply) = reply else {
        return Ok((outputs, None));
    };
    if codecs.is_empty() {
        return Ok((outputs, Some(reply)));
    }
    match codecs
        .encode(reply.content_type.as_deref(), &reply.body)
        .await
    {
        Conversion::Unclaimed => {}
        Conversion::Converted { content_type, body } => {
            reply.content_type = Some(content_type);
            reply.body = body;
        }
        Conversion::Refused(why) | Conversion::Faulted(why) => {
            return Err(NotEncoded::Refused(format!(
                "its reply could not be encoded: {why}"
            )));
        }
        Conversion::HostBusy(why) => return Err(NotEncoded::HostBusy(why)),
    }
    Ok((outputs, Some(reply)))
}

async fn encode_outputs(
    codecs: &CodecSet,
    outputs: Vec<Outgoing>,
) -> Result<Vec<Outgoing>, NotEncoded> {
    if codecs.is_empty() {
        return Ok(outputs);
    }
    let mut encoded = Vec::with_capacity(outputs.len());
    for mut output in outputs {
        match codecs
            .encode(output.content_type.as_deref(), &output.body)
            .await
        {
            Conversion::Unclaimed => {}
            Conversion::Converted { content_type, body } => {
                output.content_type = Some(content_type);
                output.body = body;
            }
            Conversion::Refused(why) | Conversion::Faulted(why) => {
                return Err(NotEncoded::Refused(format!(
                    "an output to '{}' could not be encoded: {why}",
                    output.exchange
                )));
            }
            Conversion::HostBusy(why) => return Err(NotEncoded::HostBusy(why)),
        }
        encoded.push(output);
    }
    Ok(encoded)
}
