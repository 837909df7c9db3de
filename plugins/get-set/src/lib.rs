//! The state benchmark's handler (tests/benches/state.rs): for each
//! message, one `get` and one `set` of one of 64 keys (chosen by the
//! message's id, so concurrent calls rarely share one), then accept. With `[consumers.config] state = "off"` it
//! accepts without touching state: the same handler, for the baseline.

use acemq_guest::prelude::*;

struct GetSet;

impl Handler for GetSet {
    fn handle(msg: Message) -> Result {
        if config("state").as_deref() == Some("off") {
            return accept();
        }
        let key = format!("last/{}", bucket(&msg.envelope().id));
        let seen = state::get(&key)?.map_or(0, |v| v.len());
        // What it read decides nothing here; writing it back keeps the
        // value from growing.
        let body = msg.body();
        state::set(&key, if seen > 0 { &body[..] } else { b"first" })?;
        accept()
    }
}

/// One of 64 buckets for an id (FNV-1a).
fn bucket(id: &str) -> u64 {
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    hash % 64
}

acemq_guest::export_handler!(GetSet);

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_guest::testing::{self, TestHost};

    #[test]
    fn reads_then_writes_one_of_64_keys() {
        let host = TestHost::new();
        for _ in 0..200 {
            let done = host.handle::<GetSet>(testing::message("a"));
            assert_eq!(done.outcome, Outcome::Accept);
            assert_eq!(done.state_writes.len(), 1);
        }
        assert_eq!(host.state_keys().len(), 1, "one message id, one key");
    }

    #[test]
    fn ids_spread_over_the_64_keys() {
        let buckets: std::collections::BTreeSet<u64> =
            (0..1000).map(|i| bucket(&format!("id-{i}"))).collect();
        assert_eq!(buckets.len(), 64);
    }

    #[test]
    fn off_touches_no_state() {
        let host = TestHost::new().without_state().config("state", "off");
        let done = host.handle::<GetSet>(testing::message("a"));
        assert_eq!(done.outcome, Outcome::Accept);
        assert!(done.state_writes.is_empty());
    }
}
