//! {{name}}: an acemq-host handler plugin.
//!
//! - `cargo test`: runs the tests below natively, against the SDK's test host.
//! - `acemq-host plugin build`: builds the WebAssembly component.
//! - `acemq-host plugin run <component> --body 'hello'`: one message through it.

use acemq_guest::prelude::*;

// The [consumers.config] keys this plugin reads: the host warns of any
// other key in its consumer's config (a typo, most often).
acemq_guest::config_keys!["forward_to"];

struct {{type_name}};

impl Handler for {{type_name}} {
    fn handle(msg: Message) -> Result {
        // A body that is not UTF-8 can never be read: `?` rejects the message
        // (the host dead-letters it) with the reason.
        let text = msg.text()?;
        if text.trim().is_empty() {
            return reject("the body is empty");
        }
        let routing_key = &msg.delivery().routing_key;
        info!("{} bytes with routing key '{routing_key}'", text.len());
        // With `forward_to = "EXCHANGE"` in the consumer's [consumers.config]
        // (and EXCHANGE in its `publish_to`), the body goes on there in
        // capitals. The host publishes it only if this call accepts.
        if let Some(exchange) = config("forward_to") {
            publish(exchange, routing_key.as_str())
                .text(text.to_uppercase())
                .send()?;
        }
        accept()
    }
}

acemq_guest::export_handler!({{type_name}});

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_guest::testing::{self, TestHost};

    #[test]
    fn forwards_the_body_in_capitals() {
        let host = TestHost::new()
            .config("forward_to", "out")
            .publish_to(["out"]);
        let done = host.handle::<{{type_name}}>(testing::message("hello"));
        assert_eq!(done.outcome, Outcome::Accept);
        assert_eq!(done.published.len(), 1);
        assert_eq!(done.published[0].exchange, "out");
        assert_eq!(done.published[0].body, b"HELLO");
    }

    #[test]
    fn accepts_without_forwarding_when_not_configured() {
        let done = TestHost::new().handle::<{{type_name}}>(testing::message("hello"));
        assert_eq!(done.outcome, Outcome::Accept);
        assert!(done.published.is_empty());
    }

    #[test]
    fn rejects_an_empty_body() {
        let done = TestHost::new().handle::<{{type_name}}>(testing::message("  "));
        assert_eq!(done.outcome, Outcome::Reject("the body is empty".into()));
    }
}
