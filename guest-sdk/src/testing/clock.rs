//! `now-ms`: the test's clock, fixed unless the test sets or advances it.

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

    /// Moves the clock `by` forward (whole milliseconds): between two calls,
    /// to let state TTLs run out. The host it returns shares this one's
    /// state, so rebind it: `let host = host.advance(Duration::from_secs(60));`.
    #[must_use = "the clock of `self` is unchanged: use the host returned"]
    pub fn advance(mut self, by: std::time::Duration) -> Self {
        let by_ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.now_ms = self.now_ms.saturating_add(by_ms);
        self
    }
}

pub(crate) fn now_ms() -> u64 {
    with_state(|s| s.host.now_ms)
}
