//! The no-op handler: accepts every message, publishes nothing, logs
//! nothing. Used to measure the cost of the host and the wasm boundary alone.

use acemq_guest::prelude::*;

struct Echo;

impl Handler for Echo {
    fn handle(_msg: Message) -> Result {
        accept()
    }
}

acemq_guest::export_handler!(Echo);

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_guest::testing::{self, TestHost};

    #[test]
    fn accepts_anything() {
        let done = TestHost::new().handle::<Echo>(testing::message(vec![0xff, 0x00]));
        assert_eq!(done.outcome, Outcome::Accept);
        assert!(done.published.is_empty() && done.logs.is_empty());
    }
}
