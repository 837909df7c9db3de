//! `reply`: the answer to the request being handled. The host's refusals
//! (a second reply, the reserved `x-acemq-*` headers, the envelope fields,
//! a correlation or causation set by hand) come first; then the reply is
//! recorded with the address the host would send it to.

use super::envelope::{check_fields, sent};
use super::publish::check_headers;
use super::{OutgoingReply, Replied, Sent, with_state};

pub(crate) fn reply(msg: &OutgoingReply) -> Result<Sent, String> {
    with_state(|s| {
        if s.reply.is_some() {
            return Err(
                "this call has already replied: a request gets one answer, and the first \
                 reply stays"
                    .into(),
            );
        }
        check_headers(&msg.headers)?;
        if msg.envelope.correlation_id.is_some() || msg.envelope.causation_id.is_some() {
            return Err(
                "a reply's correlation and causation are the request's; they cannot be set".into(),
            );
        }
        check_fields(&msg.envelope, s.sent_ids())?;
        let sent = sent(&msg.envelope, &s.input, "reply");
        s.reply = Some(Replied {
            message: msg.clone(),
            sent: sent.clone(),
            to: s.input.reply_to.clone(),
        });
        Ok(sent)
    })
}
