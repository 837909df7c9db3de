//! The stamp handler, shared by `stamp-v1`, `stamp-v2` and the rollout
//! tests' `stamp-flaky` and `stamp-quirky`: each crate's `lib.rs` defines
//! `VERSION` and `QUIRK` and includes this file (the others through
//! `#[path]`), so the plugins differ by those constants alone.
//!
//! For each message: publishes
//! `{"input": <body as text>, "version": VERSION, "input_id": <envelope id>}`
//! (JSON) to the exchange in config key `out_exchange` with routing key
//! `stamped`, and accepts. A body that is not UTF-8 is rejected; a consumer
//! without `out_exchange` retries, as does a refused publish. A [`Quirk`]
//! changes that for bodies that are a multiple of some number: they trap,
//! or are stamped `VERSION` followed by `-varied`.

use acemq_guest::prelude::*;
use serde::Serialize;

use super::{QUIRK, VERSION};

/// How a build departs from the plain stamp, for bodies that are a decimal
/// number `n`: what the rollout tests need of a bad or a different version.
#[allow(dead_code)] // each build uses one of them
pub enum Quirk {
    None,
    /// Traps (a panic) when `n` is a multiple of this.
    FaultEvery(u64),
    /// Stamps `VERSION-varied` when `n` is a multiple of this.
    VaryEvery(u64),
}

/// Whether `input` is a decimal number that is a multiple of `every`.
fn multiple_of(input: &str, every: u64) -> bool {
    input
        .trim()
        .parse::<u64>()
        .is_ok_and(|n| n.is_multiple_of(every))
}

/// Consumer config key naming the exchange stamped messages go to.
const OUT_EXCHANGE_KEY: &str = "out_exchange";
/// Routing key of the stamped messages.
const STAMPED_ROUTING_KEY: &str = "stamped";

/// The published body.
#[derive(Serialize)]
struct Stamped<'a> {
    input: &'a str,
    version: &'a str,
    input_id: &'a str,
}

pub struct Stamp;

impl Handler for Stamp {
    fn handle(msg: Message) -> Result {
        let input = msg.text()?;
        let varied;
        let version = match QUIRK {
            Quirk::FaultEvery(every) if multiple_of(input, every) => {
                panic!("stamp: {input} is a multiple of {every}, which this build cannot stamp")
            }
            Quirk::VaryEvery(every) if multiple_of(input, every) => {
                varied = format!("{VERSION}-varied");
                varied.as_str()
            }
            _ => VERSION,
        };
        let exchange = config(OUT_EXCHANGE_KEY).or_retry(format_args!(
            "the consumer's config sets no `{OUT_EXCHANGE_KEY}`, the exchange stamped messages go to"
        ))?;
        publish(&exchange, STAMPED_ROUTING_KEY)
            .json(&Stamped {
                input,
                version,
                input_id: &msg.envelope().id,
            })
            .send()?;
        accept()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_guest::serde_json::{self, Value};
    use acemq_guest::testing::{self, TestHost};

    fn host() -> TestHost {
        TestHost::new()
            .config(OUT_EXCHANGE_KEY, "stamp.out")
            .publish_to(["stamp.out"])
    }

    #[test]
    fn publishes_the_body_stamped_with_version_and_id() {
        let mut msg = testing::message(r#"order "7" ✓"#);
        msg.envelope_mut().id = "m-42".into();
        let done = host().handle::<Stamp>(msg);
        assert_eq!(done.outcome, Outcome::Accept);
        let [out] = &done.published[..] else {
            panic!("one message expected: {:?}", done.published)
        };
        assert_eq!(
            (out.exchange.as_str(), out.routing_key.as_str()),
            ("stamp.out", "stamped")
        );
        assert_eq!(out.content_type.as_deref(), Some("application/json"));
        assert_eq!(
            serde_json::from_slice::<Value>(&out.body).unwrap(),
            json!({"input": "order \"7\" ✓", "version": VERSION, "input_id": "m-42"})
        );
        assert!(done.logs.is_empty());
    }

    #[test]
    fn not_utf8_is_rejected() {
        let done = host().handle::<Stamp>(testing::message(vec![0xff]));
        assert!(
            matches!(&done.outcome, Outcome::Reject(r) if r.starts_with("body is not UTF-8 text")),
            "{:?}",
            done.outcome
        );
        assert!(done.published.is_empty());
    }

    #[test]
    fn missing_out_exchange_is_a_retry_naming_the_key() {
        let done = TestHost::new().handle::<Stamp>(testing::message("x"));
        assert!(
            matches!(&done.outcome, Outcome::Retry(r) if r.contains("`out_exchange`")),
            "{:?}",
            done.outcome
        );
    }
}
