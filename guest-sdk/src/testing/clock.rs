//! `now-ms`: the test's clock, fixed unless the test sets it.

use super::{TestHost, with_state};

/// `now_ms` of a [`TestHost`] unless set: 2023-11-14T22:13:20Z. Also the
/// `first_seen_ms` of [`message`](super::message()).
pub const DEFAULT_NOW_MS: u64 = 1_700_000_000_000;

impl TestHost {
    /// Sets what `now_ms()` returns.
    pub fn now_ms(mut self, now_ms: u64) -> Self {
        self.now_ms = now_ms;
        self
    }
}

pub(crate) fn now_ms() -> u64 {
    with_state(|s| s.host.now_ms)
}
