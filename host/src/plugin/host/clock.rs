//! `now-ms` of `acemq:plugin/host`: the host's wall clock. A plugin that
//! imports WASI also has WASI's clocks (see `wasi.rs`'s grant); this is the
//! clock every plugin has.

use std::sync::Arc;

use super::super::ConsumerContext;
use super::HostInterface;
use crate::envelope;

/// The wall clock: no state, the same for every instance.
pub struct Clock;

impl HostInterface for Clock {
    fn prepare(_context: &Arc<ConsumerContext>, _plugin: &Arc<str>) -> Self {
        Clock
    }
}

impl Clock {
    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        envelope::now_ms()
    }
}
