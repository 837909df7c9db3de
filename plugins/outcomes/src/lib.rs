//! Returns whatever outcome the message body asks for, so the host's
//! settlement paths can be driven one by one from a test:
//!
//! - `accept`
//! - `retry:REASON`, `reject:REASON`, `park:REASON`
//! - `retry-until:N:REASON`: retry while the envelope's attempt is below N,
//!   then accept (a retry that eventually succeeds).
//! - `reject-long:N`: reject with a reason of N bytes (`long reason ` and
//!   `r`s up to N, ending in ` end`): a huge reason without a huge body.
//! - `publish-headers:N`: publish `{}` with one header `x-big` of N bytes,
//!   then accept.
//! - `publish-key:N`: publish `{}` with a routing key of N bytes, then
//!   accept.
//! - `publish-to:K1,K2,...`: publish `{}` once with each routing key, then
//!   accept (outputs of one batch that meet different fates).
//!
//! They publish to the exchange in config key `out_exchange`; a refused
//! publish becomes the SDK's retry carrying the host's words.
//!
//! Anything else is rejected, naming the body.

use acemq_guest::prelude::*;

acemq_guest::config_keys!["out_exchange"];

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
            "reject-long" => reject(long_reason(count(rest)?)),
            "publish-headers" => {
                let big = "h".repeat(count(rest)?);
                publish(out_exchange()?, "out")
                    .header("x-big", big)
                    .text("{}")
                    .send()?;
                accept()
            }
            "publish-to" => {
                let exchange = out_exchange()?;
                for key in rest.split(',') {
                    publish(&exchange, key).text("{}").send()?;
                }
                accept()
            }
            "publish-key" => {
                publish(out_exchange()?, "k".repeat(count(rest)?))
                    .text("{}")
                    .send()?;
                accept()
            }
            _ => reject(format_args!("unknown instruction {body:?}")),
        }
    }
}

/// The size a `*-long`/`publish-*` instruction names.
fn count(text: &str) -> Result<usize> {
    text.parse()
        .or_reject(format_args!("a size is needed, got {text:?}"))
}

/// A reason of exactly `len` bytes (at least the frame around it), whose
/// start and end a test can recognise after the host cut its middle.
fn long_reason(len: usize) -> String {
    let (start, end) = ("long reason ", " end");
    let fill = len.saturating_sub(start.len() + end.len());
    format!("{start}{}{end}", "r".repeat(fill))
}

fn out_exchange() -> Result<String> {
    config("out_exchange").or_retry("the consumer's config sets no `out_exchange`")
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

    #[test]
    fn long_reasons_and_big_outputs_are_made_to_order() {
        let Outcome::Reject(reason) = run("reject-long:1000") else {
            panic!("a reject")
        };
        assert_eq!(reason.len(), 1000);
        assert!(reason.starts_with("long reason rrr") && reason.ends_with("rrr end"));

        let host = TestHost::new()
            .config("out_exchange", "outcomes.out")
            .publish_to(["outcomes.out"]);
        let done = host.handle::<Outcomes>(testing::message("publish-headers:300"));
        assert_eq!(done.outcome, Outcome::Accept);
        assert_eq!(done.published[0].headers[0].0, "x-big");
        let done = host.handle::<Outcomes>(testing::message("publish-key:300"));
        assert_eq!(done.outcome, Outcome::Accept);
        assert_eq!(done.published[0].routing_key.len(), 300);
        let done = host.handle::<Outcomes>(testing::message("publish-to:a,b"));
        assert_eq!(done.outcome, Outcome::Accept);
        let keys: Vec<_> = done
            .published
            .iter()
            .map(|p| p.routing_key.as_str())
            .collect();
        assert_eq!(keys, ["a", "b"]);
    }
}
