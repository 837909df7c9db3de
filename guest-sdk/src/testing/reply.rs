//! `reply`: the answer to the request being handled. The host's refusals
//! (a second reply, a correlation or causation set by hand, the envelope
//! fields, the reserved `x-acemq-*` headers, an id already used in the
//! call) come first, in the host's words; then the reply is recorded with
//! the address the host would send it to.

use super::envelope::{check_fields, check_unique, sent};
use super::publish::check_headers;
use super::{OutgoingReply, Replied, Sent, with_state};

pub(crate) fn reply(msg: &OutgoingReply) -> Result<Sent, String> {
    with_state(|s| {
        if s.reply.is_some() {
            return Err(
                "this call already replied: a request gets one answer (publish anything else)"
                    .into(),
            );
        }
        if msg.envelope.correlation_id.is_some() {
            return Err(
                "a reply carries the request's correlation; correlation-id cannot be \
                        set on a reply"
                    .into(),
            );
        }
        if msg.envelope.causation_id.is_some() {
            return Err(
                "a reply names the request as its causation; causation-id cannot be \
                        set on a reply"
                    .into(),
            );
        }
        check_fields(&msg.envelope)?;
        check_headers(&msg.headers)?;
        let sent = sent(&msg.envelope, &s.input, "reply");
        check_unique(&sent.id, s.sent_ids())?;
        s.reply = Some(Replied {
            message: msg.clone(),
            sent: sent.clone(),
            to: s.input.reply_to.clone(),
        });
        Ok(sent)
    })
}
