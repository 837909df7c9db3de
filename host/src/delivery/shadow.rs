//! A live shadow's call: the candidate runs on a copy of one delivery
//! (decode, handle, encode, as the current version's call does), on a task
//! of its own, and its decision is compared with the current version's
//! once both are known. It publishes nothing and commits no state: its run
//! ends here, its outputs and state writes dropped. A delivery whose shadow
//! finds no free place is not shadowed (`Rollout::shadow_place`), so the
//! shadow never makes the current version's work wait; what it costs is
//! the CPU its calls take (docs/rollout.md gives the figure).

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use super::plugins::run_plugins_with_state;
use crate::plugin::{CodecSet, HandlerVersion, Input};
use crate::rollout::decision::Decision;
use crate::rollout::live::{Role, Rollout};

/// A shadow call under way, waiting for the current version's decision.
pub struct ShadowCall {
    current: oneshot::Sender<Decision>,
}

impl ShadowCall {
    /// Starts `candidate` on a copy of the delivery (`input`, decoded with
    /// the delivery's own `codecs`), or does nothing when every shadow
    /// place is taken.
    pub fn start(
        rollout: Arc<Rollout>,
        candidate: Arc<HandlerVersion>,
        codecs: Arc<CodecSet>,
        input: Input,
    ) -> Option<Self> {
        let place = rollout.shadow_place()?;
        let (current, decided) = oneshot::channel::<Decision>();
        let message_id = input.envelope.id.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            // Its state writes are dropped with the run: a shadow changes
            // no state.
            let (run, _writes) = run_plugins_with_state(&candidate, &codecs, input).await;
            drop(place);
            let Some(call) = run.rollout_call(started.elapsed()) else {
                // No handler ran (no instance slot, a codec's fault): the
                // host's doing, nothing to compare.
                rollout.shadow_not_run();
                return;
            };
            rollout.record(Role::Shadow, call);
            let theirs = run.decision();
            // The current version's decision; none when its delivery failed
            // inside the host before deciding (nothing to compare).
            if let Ok(ours) = decided.await {
                let difference = (!ours.same_as(&theirs)).then(|| ours.difference(&theirs));
                rollout.shadow_compared(&message_id, difference);
            }
        });
        Some(Self { current })
    }

    /// The current version's decision, to compare the shadow's with.
    pub fn compare(self, current: Decision) {
        let _ = self.current.send(current);
    }
}
