//! A bad version 2 of the stamp handler, for the rollout tests: it stamps
//! like `stamp-v2`, and traps on every body that is a multiple of 20 (5 %
//! of a run of numbered messages). See `stamp-v1/src/stamp.rs`.

/// The version this build stamps on its outputs.
const VERSION: &str = "v2";
/// It fails on one message in twenty.
const QUIRK: stamp::Quirk = stamp::Quirk::FaultEvery(20);

#[path = "../../stamp-v1/src/stamp.rs"]
mod stamp;

acemq_guest::export_handler!(stamp::Stamp);

#[cfg(test)]
mod tests {
    use acemq_guest::testing::{self, TestHost};

    #[test]
    fn traps_on_multiples_of_twenty_and_stamps_the_rest() {
        let host = || TestHost::new().config("out_exchange", "out");
        let done = host().handle::<super::stamp::Stamp>(testing::message("41"));
        assert_eq!(done.published.len(), 1);
        let trapped = std::panic::catch_unwind(|| {
            host().handle::<super::stamp::Stamp>(testing::message("40"))
        });
        assert!(trapped.is_err(), "40 traps");
    }
}
