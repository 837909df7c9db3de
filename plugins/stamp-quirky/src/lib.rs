//! A version of the stamp handler that decides differently on 10 % of
//! messages, for the shadow tests: it stamps like `stamp-v1`, except every
//! body that is a multiple of 10, stamped `v1-varied`. See
//! `stamp-v1/src/stamp.rs`.

/// The version this build stamps on its outputs.
const VERSION: &str = "v1";
/// It differs from `stamp-v1` on one message in ten.
const QUIRK: stamp::Quirk = stamp::Quirk::VaryEvery(10);

#[path = "../../stamp-v1/src/stamp.rs"]
mod stamp;

acemq_guest::export_handler!(stamp::Stamp);

#[cfg(test)]
mod tests {
    use acemq_guest::serde_json::{self, Value};
    use acemq_guest::testing::{self, TestHost};

    #[test]
    fn multiples_of_ten_are_stamped_varied() {
        let stamp = |body: &str| {
            let done = TestHost::new()
                .config("out_exchange", "out")
                .handle::<super::stamp::Stamp>(testing::message(body));
            let out: Value = serde_json::from_slice(&done.published[0].body).unwrap();
            out["version"].as_str().unwrap().to_string()
        };
        assert_eq!(stamp("30"), "v1-varied");
        assert_eq!(stamp("31"), "v1");
        assert_eq!(stamp("not a number"), "v1");
    }
}
