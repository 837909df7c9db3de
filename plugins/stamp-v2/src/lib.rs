//! Version 2 of the stamp handler: publishes each body as
//! `{"input": ..., "version": "v2", "input_id": ...}`. The handler is
//! `stamp-v1`'s `stamp.rs`, compiled again here; only [`VERSION`] differs.
//! The pair lets the hot-swap tests tell which version handled each message.

/// The version this build stamps on its outputs.
const VERSION: &str = "v2";
/// It stamps every message plainly.
const QUIRK: stamp::Quirk = stamp::Quirk::None;

#[path = "../../stamp-v1/src/stamp.rs"]
mod stamp;

acemq_guest::export_handler!(stamp::Stamp);

#[cfg(test)]
mod tests {
    use acemq_guest::serde_json::{self, Value};
    use acemq_guest::testing::{self, TestHost};

    /// The shared handler stamps this crate's version, not the other's.
    #[test]
    fn stamps_v2() {
        let done = TestHost::new()
            .config("out_exchange", "out")
            .handle::<super::stamp::Stamp>(testing::message("hi"));
        let out: Value = serde_json::from_slice(&done.published[0].body).unwrap();
        assert_eq!(out["version"], "v2");
    }
}
