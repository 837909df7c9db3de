//! Version 1 of the stamp handler: publishes each body as
//! `{"input": ..., "version": "v1", "input_id": ...}`. See `stamp.rs`,
//! shared with `stamp-v2`, which differs only by [`VERSION`]. The pair lets
//! the hot-swap tests tell which version handled each message.

/// The version this build stamps on its outputs.
const VERSION: &str = "v1";
/// It stamps every message plainly.
const QUIRK: stamp::Quirk = stamp::Quirk::None;

mod stamp;

acemq_guest::export_handler!(stamp::Stamp);

#[cfg(test)]
mod tests {
    use acemq_guest::serde_json::{self, Value};
    use acemq_guest::testing::{self, TestHost};

    /// The shared handler stamps this crate's version, not the other's.
    #[test]
    fn stamps_v1() {
        let done = TestHost::new()
            .config("out_exchange", "out")
            .handle::<super::stamp::Stamp>(testing::message("hi"));
        let out: Value = serde_json::from_slice(&done.published[0].body).unwrap();
        assert_eq!(out["version"], "v1");
    }
}
