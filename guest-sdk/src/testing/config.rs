//! `config`: the consumer's `[consumers.config]` table, as the test sets it.

use super::{TestHost, with_state};

impl TestHost {
    /// Sets a `[consumers.config]` value.
    pub fn config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.insert(key.into(), value.into());
        self
    }
}

pub(crate) fn config(key: &str) -> Option<String> {
    with_state(|s| s.host.config.get(key).cloned())
}
