//! The stamp handler, shared by `stamp-v1` and `stamp-v2`: each crate's
//! `lib.rs` defines `VERSION` and includes this file (`stamp-v2` through
//! `#[path]`), so the two plugins differ by that constant alone.
//!
//! For each message: publishes
//! `{"input": <body as text>, "version": VERSION, "input_id": <envelope id>}`
//! (JSON) to the exchange in config key `out_exchange` with routing key
//! `stamped`, and accepts. A body that is not UTF-8 is rejected; a consumer
//! without `out_exchange` retries, as does a refused publish.

use acemq_guest::prelude::*;
use serde::Serialize;

use super::VERSION;

/// Consumer config key naming the exchange stamped messages go to.
const OUT_EXCHANGE_KEY: &str = "out_exchange";
/// Routing key of the stamped messages.
const STAMPED_ROUTING_KEY: &str = "stamped";

/// The published body.
#[derive(Serialize)]
struct Stamped<'a> {
    input: &'a str,
    version: &'static str,
    input_id: &'a str,
}

pub struct Stamp;

impl Handler for Stamp {
    fn handle(msg: Message) -> Result {
        let input = msg.text()?;
        let exchange = config(OUT_EXCHANGE_KEY).or_retry(format_args!(
            "the consumer's config sets no `{OUT_EXCHANGE_KEY}`, the exchange stamped messages go to"
        ))?;
        publish(&exchange, STAMPED_ROUTING_KEY)
            .json(&Stamped {
                input,
                version: VERSION,
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
