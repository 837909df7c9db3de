//! What one handler call decided, in the terms two versions are compared
//! in, by a live shadow and by `replay --compare` alike: the outcome and
//! its reason, and each output's exchange, routing key and body (by its
//! SHA-256). Pure.

use sha2::{Digest, Sha256};

/// One call's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// `accept`, `retry`, `reject`, `park`, or `fault: KIND` (and the
    /// host's own words for a call that never decided).
    pub word: String,
    /// The reason of a retry, reject or park.
    pub reason: Option<String>,
    pub outputs: Vec<Output>,
}

/// One output as compared: where it goes and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub exchange: String,
    pub routing_key: String,
    /// SHA-256 of the body, hex.
    pub body_sha256: String,
    /// The body's first bytes as text, for a person reading a difference.
    pub body_start: String,
}

/// How many bytes of a body a difference quotes.
const QUOTED: usize = 80;

impl Output {
    pub fn new(exchange: &str, routing_key: &str, body: &[u8]) -> Self {
        Self {
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
            body_sha256: hex::encode(Sha256::digest(body)),
            body_start: String::from_utf8_lossy(&body[..body.len().min(QUOTED)]).into_owned(),
        }
    }

    fn same_as(&self, other: &Output) -> bool {
        (&self.exchange, &self.routing_key, &self.body_sha256)
            == (&other.exchange, &other.routing_key, &other.body_sha256)
    }
}

impl Decision {
    /// Whether `other` decided the same: outcome, reason and outputs (their
    /// exchange, routing key and body), in order.
    pub fn same_as(&self, other: &Decision) -> bool {
        self.word == other.word
            && self.reason == other.reason
            && self.outputs.len() == other.outputs.len()
            && self
                .outputs
                .iter()
                .zip(&other.outputs)
                .all(|(a, b)| a.same_as(b))
    }

    /// One line saying how `candidate` differs from this, the current
    /// version's decision.
    pub fn difference(&self, candidate: &Decision) -> String {
        if self.word != candidate.word {
            return format!(
                "current {}, candidate {}",
                self.described(),
                candidate.described()
            );
        }
        if self.reason != candidate.reason {
            return format!(
                "both {}; reasons differ: current {:?}, candidate {:?}",
                self.word,
                self.reason.as_deref().unwrap_or(""),
                candidate.reason.as_deref().unwrap_or("")
            );
        }
        if self.outputs.len() != candidate.outputs.len() {
            return format!(
                "both {}; current published {} outputs, candidate {}",
                self.word,
                self.outputs.len(),
                candidate.outputs.len()
            );
        }
        let (index, (ours, theirs)) = self
            .outputs
            .iter()
            .zip(&candidate.outputs)
            .enumerate()
            .find(|(_, (a, b))| !a.same_as(b))
            .unwrap_or((0, (&self.outputs[0], &candidate.outputs[0])));
        format!(
            "both {}; output {} differs: current {}/{} {:?}, candidate {}/{} {:?}",
            self.word,
            index + 1,
            ours.exchange,
            ours.routing_key,
            ours.body_start,
            theirs.exchange,
            theirs.routing_key,
            theirs.body_start
        )
    }

    fn described(&self) -> String {
        match &self.reason {
            Some(reason) => format!("{} ({reason})", self.word),
            None => self.word.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(outputs: &[(&str, &str, &[u8])]) -> Decision {
        Decision {
            word: "accept".into(),
            reason: None,
            outputs: outputs
                .iter()
                .map(|(x, k, b)| Output::new(x, k, b))
                .collect(),
        }
    }

    #[test]
    fn decisions_differ_in_outcome_reason_or_any_output_and_say_where() {
        let a = accept(&[("events", "order.accepted", b"{\"id\":1}")]);
        assert!(a.same_as(&a.clone()));
        let other_body = accept(&[("events", "order.accepted", b"{\"id\":2}")]);
        assert!(!a.same_as(&other_body));
        assert_eq!(
            a.difference(&other_body),
            "both accept; output 1 differs: current events/order.accepted \"{\\\"id\\\":1}\", candidate events/order.accepted \"{\\\"id\\\":2}\""
        );
        let other_key = accept(&[("events", "order.held", b"{\"id\":1}")]);
        assert!(!a.same_as(&other_key));
        let reject = |why: &str| Decision {
            word: "reject".into(),
            reason: Some(why.into()),
            outputs: vec![],
        };
        assert_eq!(
            a.difference(&reject("no total")),
            "current accept, candidate reject (no total)"
        );
        assert!(!reject("a").same_as(&reject("b")));
        assert_eq!(
            reject("a").difference(&reject("b")),
            "both reject; reasons differ: current \"a\", candidate \"b\""
        );
        assert_eq!(
            a.difference(&accept(&[])),
            "both accept; current published 1 outputs, candidate 0"
        );
    }
}
