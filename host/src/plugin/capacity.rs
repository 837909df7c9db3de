//! How many plugin instances can be alive at once, which is how many slots
//! the engine's pooling allocator must have (`engine.rs`). An instance that
//! finds no free slot cannot be made at all, so every instance that can
//! exist at the same time is counted here, handlers' and codecs' alike.
//!
//! A consumer of concurrency `C` runs at most `C` deliveries at once, and a
//! delivery holds at most one instance at a time (it decodes, then calls the
//! handler, then encodes: one after another, each instance given back
//! before the next is taken). From that:
//!
//! - its current handler version has at most `C` instances, idle or in a
//!   call, plus the warm one a `fresh` consumer keeps beside its fresh ones:
//!   `C + 1`;
//! - versions hot swap replaced are retired (`Pool::retire`): they keep only
//!   the instances of calls still running on them, at most `C` together;
//! - a version being loaded for a swap holds its warm-up instance (reloads
//!   of one consumer run one at a time): `1`.
//!
//! - a rollout's candidate (`crate::rollout`) has a pool of its own: as a
//!   canary it takes some of the consumer's `C` calls, as a shadow it runs
//!   `S` calls of its own beside them (its `shadow_concurrency`, `C` unless
//!   configured), plus its warm instance: `max(C, S) + 1`. Counted for
//!   every consumer, configured with a candidate or not, so that one can be
//!   started from the admin endpoint at any time.
//!
//! So `2C + 2 + max(C, S) + 1` per consumer. A codec serves every consumer:
//! its instances are its warm one plus one per delivery of the host
//! decoding or encoding with it at once, shadows' included,
//! `1 + Σ(C + max(C, S))`, and each codec keeps its own.

/// What one consumer can hold at once: its concurrency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerDemand {
    pub concurrency: usize,
    /// A configured shadow's calls at once (0 without one).
    pub shadow: usize,
}

impl ConsumerDemand {
    /// Calls a candidate of this consumer can hold at once.
    fn candidate(&self) -> usize {
        self.concurrency.max(1).max(self.shadow)
    }
}

/// The fewest slots an engine gets, whatever the config: room for a
/// `plugin run`, a replay, and a small config's growth.
pub const MIN_INSTANCE_SLOTS: usize = 16;

/// Instances that can be alive at once for these consumers and `codecs`
/// codecs (see the module doc), at least [`MIN_INSTANCE_SLOTS`].
pub fn instance_slots(consumers: &[ConsumerDemand], codecs: usize) -> u32 {
    let at_once: usize = consumers
        .iter()
        .map(|c| c.concurrency.max(1).saturating_add(c.candidate()))
        .sum();
    let handlers: usize = consumers
        .iter()
        .map(|c| {
            c.concurrency
                .max(1)
                .saturating_mul(2)
                .saturating_add(2)
                .saturating_add(c.candidate() + 1)
        })
        .sum();
    let codecs = codecs.saturating_mul(at_once.saturating_add(1));
    let slots = handlers.saturating_add(codecs).max(MIN_INSTANCE_SLOTS);
    u32::try_from(slots).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumers(concurrencies: &[usize]) -> Vec<ConsumerDemand> {
        concurrencies
            .iter()
            .map(|&concurrency| ConsumerDemand {
                concurrency,
                shadow: 0,
            })
            .collect()
    }

    #[test]
    fn each_consumer_counts_its_versions_and_a_candidates_room() {
        // Current and retiring versions 2C + 2, a candidate C + 1.
        assert_eq!(instance_slots(&consumers(&[8]), 0), 18 + 9);
        assert_eq!(instance_slots(&consumers(&[8, 32]), 0), 18 + 9 + 66 + 33);
        // A shadow configured wider than the consumer takes its own width.
        let wide = [ConsumerDemand {
            concurrency: 8,
            shadow: 20,
        }];
        assert_eq!(instance_slots(&wide, 0), 18 + 21);
    }

    /// Codec instances were not counted: a host of two consumers and two
    /// codecs got the handlers' slots alone, and under load its codecs'
    /// instantiations failed, dead-lettering valid messages.
    #[test]
    fn every_codec_counts_one_instance_per_delivery_the_host_runs_at_once_and_its_warm_one() {
        assert_eq!(
            instance_slots(&consumers(&[8, 32]), 2),
            18 + 9 + 66 + 33 + 2 * ((8 + 8) + (32 + 32) + 1)
        );
    }

    #[test]
    fn a_small_config_gets_the_minimum() {
        assert_eq!(instance_slots(&[], 0), MIN_INSTANCE_SLOTS as u32);
        assert_eq!(
            instance_slots(&consumers(&[1]), 1),
            MIN_INSTANCE_SLOTS as u32
        );
        assert_eq!(
            instance_slots(&consumers(&[0]), 0),
            MIN_INSTANCE_SLOTS as u32
        );
    }
}
