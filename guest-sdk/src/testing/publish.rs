//! `publish`: the host's refusals (the consumer's `publish_to`, the
//! reserved `x-acemq-*` headers, then the envelope fields), in the same
//! order as the host's `plugin/host/publish.rs`; its output limits are not
//! modelled. Each buffered output gets the [`Sent`] the host would return
//! (see [`envelope`](super::envelope) for its id).

use std::collections::BTreeSet;

use crate::HeaderValue;

use super::envelope::{check_fields, sent};
use super::{Outgoing, Published, Sent, TestHost, with_state};

const RESERVED_PREFIX: &str = "x-acemq-";

impl TestHost {
    /// Refuses publishes to exchanges not listed, as the host does with the
    /// consumer's `publish_to`. Without it every exchange is allowed (the
    /// real host allows none that `publish_to` does not list).
    pub fn publish_to<S: Into<String>>(mut self, exchanges: impl IntoIterator<Item = S>) -> Self {
        self.publish_to = Some(exchanges.into_iter().map(Into::into).collect());
        self
    }
}

pub(crate) fn publish(msg: &Outgoing) -> Result<Sent, String> {
    with_state(|s| {
        if let Some(allowed) = &s.host.publish_to {
            check_allowed(allowed, &msg.exchange)?;
        }
        check_headers(&msg.headers)?;
        check_fields(&msg.envelope, s.sent_ids())?;
        let sent = sent(
            &msg.envelope,
            &s.input,
            &format!("output {}", s.published.len()),
        );
        s.published.push(Published {
            message: msg.clone(),
            sent: sent.clone(),
        });
        Ok(sent)
    })
}

fn check_allowed(allowed: &BTreeSet<String>, exchange: &str) -> Result<(), String> {
    if allowed.contains(exchange) {
        return Ok(());
    }
    let allowed: Vec<String> = allowed.iter().map(|e| format!("'{e}'")).collect();
    Err(format!(
        "publishing to exchange '{exchange}' is not allowed for this consumer (publish_to = [{}])",
        allowed.join(", ")
    ))
}

/// Refuses a header in the reserved `x-acemq-*` namespace (outputs and
/// replies alike).
pub(crate) fn check_headers(headers: &[(String, HeaderValue)]) -> Result<(), String> {
    let reserved = headers.iter().find(|(name, _)| {
        name.get(..RESERVED_PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_PREFIX))
    });
    match reserved {
        Some((name, _)) => Err(format!(
            "header '{name}' is in the reserved '{RESERVED_PREFIX}' namespace, which belongs to AceMQ; \
             use a namespace of your own, such as x-yourcompany-"
        )),
        None => Ok(()),
    }
}
