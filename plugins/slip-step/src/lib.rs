//! One step of a routing slip: accepts every message and logs
//! `step <name> handled <message id>`, with the name from the consumer's
//! `[consumers.config] step`.
//!
//! It does nothing else on purpose: the host forwards a message on a slip
//! (the JSON `acemq-routing-slip` header, or Java's declared route) to its
//! next step after the accept, marking this one done, so a slip through
//! three consumers running this plugin shows the forwarding alone. Without
//! a `step` key, the name is the slip's current step, else `unnamed`.

use acemq_guest::prelude::*;

acemq_guest::config_keys!["step"];

struct SlipStep;

impl Handler for SlipStep {
    fn handle(msg: Message) -> Result {
        let name = config("step")
            .or_else(|| {
                // An unreadable slip is the host's to refuse; this step
                // still accepts.
                let slip = msg.routing_slip().ok().flatten()?;
                slip.current().map(|step| step.name.clone())
            })
            .unwrap_or_else(|| "unnamed".into());
        info!("step {name} handled {}", msg.envelope().id);
        accept()
    }
}

acemq_guest::export_handler!(SlipStep);

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_guest::testing::{self, TestHost};

    fn logged(host: &TestHost, msg: Message) -> String {
        let done = host.handle::<SlipStep>(msg);
        assert_eq!(done.outcome, Outcome::Accept);
        assert!(done.published.is_empty() && done.reply.is_none());
        let [(_, line)] = &done.logs[..] else {
            panic!("one line expected: {:?}", done.logs)
        };
        line.clone()
    }

    #[test]
    fn logs_its_configured_name_and_the_message_id() {
        let host = TestHost::new().config("step", "enrich");
        let mut msg = testing::message("x");
        msg.envelope_mut().id = "m-42".into();
        assert_eq!(logged(&host, msg), "step enrich handled m-42");
    }

    #[test]
    fn without_a_name_it_uses_the_slips_current_step() {
        let steps = [acemq_guest::SlipStep::new("work", "check", "check")];
        let on_slip = testing::on_json_slip(testing::message("x"), &steps, &[]);
        assert_eq!(
            logged(&TestHost::new(), on_slip),
            "step check handled test-message-1"
        );
        let on_route = testing::on_declared_route(testing::message("x"), &["a", "b"], 1, None);
        assert_eq!(
            logged(&TestHost::new(), on_route),
            "step b handled test-message-1"
        );
    }

    #[test]
    fn accepts_anything_even_an_unreadable_slip() {
        let mut msg = testing::message(vec![0xff]);
        msg.headers_mut().insert("acemq-routing-slip", "not json");
        assert_eq!(
            logged(&TestHost::new(), msg),
            "step unnamed handled test-message-1"
        );
    }
}
