//! Returns whatever outcome the message body asks for, so the host's
//! settlement paths can be driven one by one from a test:
//!
//! - `accept`
//! - `retry:REASON`, `reject:REASON`, `park:REASON`
//! - `retry-until:N:REASON`: retry while the envelope's attempt is below N,
//!   then accept (a retry that eventually succeeds).
//!
//! Anything else is rejected, naming the body.

use acemq_guest::prelude::*;

struct Outcomes;

impl Handler for Outcomes {
    fn handle(msg: Message) -> Result {
        let body = msg.text()?.trim().to_string();
        let (verb, rest) = body.split_once(':').unwrap_or((body.as_str(), ""));
        match verb {
            "accept" => accept(),
            "retry" => retry(rest),
            "reject" => reject(rest),
            "park" => park(rest),
            "retry-until" => {
                let (until, reason) = rest.split_once(':').unwrap_or((rest, ""));
                let until: u32 = until
                    .parse()
                    .or_reject(format_args!("retry-until needs a number, got {until:?}"))?;
                if msg.envelope().attempt < until {
                    retry(reason)
                } else {
                    accept()
                }
            }
            _ => reject(format_args!("unknown instruction {body:?}")),
        }
    }
}

acemq_guest::export_handler!(Outcomes);

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_guest::testing::{self, TestHost};

    fn run(body: &str) -> Outcome {
        TestHost::new()
            .handle::<Outcomes>(testing::message(body))
            .outcome
    }

    #[test]
    fn each_instruction_gives_its_outcome() {
        assert_eq!(run("accept"), Outcome::Accept);
        assert_eq!(run("retry:db down"), Outcome::Retry("db down".into()));
        assert_eq!(run("reject:bad"), Outcome::Reject("bad".into()));
        assert_eq!(run("park:look"), Outcome::Park("look".into()));
        assert_eq!(run("retry-until:2:later"), Outcome::Retry("later".into()));
        assert!(matches!(run("dance"), Outcome::Reject(r) if r.contains("dance")));
    }
}
