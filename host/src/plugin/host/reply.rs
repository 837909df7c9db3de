//! `reply` of `acemq:plugin/host`: the answer to the request being handled.
//! Linked so that a 0.4 plugin which imports it loads; not wired yet.

use std::sync::Arc;

use super::super::bindings::handler_world::acemq::plugin::types;
use super::super::{ConsumerContext, Input};
use super::HostInterface;

/// One instance's replying: what its current call buffered.
pub struct Replying {
    #[allow(dead_code)]
    context: Arc<ConsumerContext>,
}

impl HostInterface for Replying {
    fn prepare(context: &Arc<ConsumerContext>, _plugin: &Arc<str>) -> Self {
        Self {
            context: context.clone(),
        }
    }
}

impl Replying {
    /// Buffers the reply to `input`, or says why not.
    pub fn buffer(
        &mut self,
        _msg: types::OutgoingReply,
        _input: Option<&Input>,
    ) -> Result<types::Sent, String> {
        Err("replies are not wired yet".to_string())
    }
}
