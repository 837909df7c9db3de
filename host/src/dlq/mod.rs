//! `acemq-host dlq list|show|replay|purge`: the operator's tools for the
//! messages a consumer set aside in `{q}.dlq` and `{q}.parked` (contract
//! §1, §5 and §11, "Replay").
//!
//! Pure logic is kept apart from the broker, so all of it is unit-tested:
//!
//! * `filter.rs`: `--filter` parsing and matching.
//! * `message.rs`: what one set-aside message is to an operator (id, type,
//!   attempt, reason, first seen, earlier replays).
//! * `format.rs`: the `list` table, the `show` page, ages and body previews.
//! * `summary.rs`: the counts of a `replay` or `purge` and their table.
//! * `progress.rs`: progress on stderr, a bar on a terminal, lines otherwise.
//! * `commands.rs`: what each command does over one pass of the broker's
//!   peek/take reading ([`crate::broker::set_aside`]): list, show, move,
//!   purge.
//!
//! How a replayed message is stamped is the envelope's business
//! ([`crate::envelope::replay_properties`]), as is every header read here.

mod commands;
mod filter;
pub(crate) mod format;
mod message;
mod progress;
mod summary;

pub use commands::{Shown, list, purge, replay, show};
pub use filter::Filters;
pub use format::list_table;
// The table and age helpers `schedule list` shares.
pub(crate) use format::{age, aligned, one_line};
pub use summary::Summary;

use crate::config::LoadedConfig;
use crate::topology::naming::{dead_letter_queue, parked_queue};

/// Which set-aside queue of a consumer's queue to read (`--from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SetAsideQueue {
    /// `{q}.dlq`: exhausted, too old and rejected messages.
    #[default]
    Dlq,
    /// `{q}.parked`: parked and undecodable messages.
    Parked,
}

/// The two queues a command works between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The consumer's queue, where a replay sends messages back.
    pub source: String,
    /// The set-aside queue read.
    pub set_aside: String,
}

impl Target {
    /// The queues of `--queue queue --from from`, where `queue` must be one
    /// that a consumer of `config` reads: the set-aside queues belong to
    /// consumers, and replaying into a queue nobody consumes would only
    /// move the problem. The refusal names the queues it would accept.
    pub fn of(config: &LoadedConfig, queue: &str, from: SetAsideQueue) -> Result<Self, String> {
        let known: Vec<&str> = config
            .config
            .consumers
            .iter()
            .map(|c| c.queue.get_ref().as_str())
            .collect();
        if !known.contains(&queue) {
            return Err(format!(
                "{}: no consumer reads the queue '{queue}' (consumers' queues: {})",
                config.path.display(),
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ));
        }
        let set_aside = match from {
            SetAsideQueue::Dlq => dead_letter_queue(queue),
            SetAsideQueue::Parked => parked_queue(queue),
        };
        Ok(Self {
            source: queue.to_owned(),
            set_aside,
        })
    }
}

/// What a command acts on, beyond its queues.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Only messages matching every filter.
    pub filters: Filters,
    /// At most this many matching messages (moved or failed, listed,
    /// purged).
    pub limit: Option<usize>,
    /// Change nothing; say what would change.
    pub dry_run: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> LoadedConfig {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.toml");
        std::fs::write(&path, text).unwrap();
        LoadedConfig::load(&path).unwrap()
    }

    #[test]
    fn the_queue_must_be_a_consumers_and_the_refusal_names_them() {
        let config = config(
            "[broker]\nurl = \"amqp://localhost\"\n\n[[consumers]]\nqueue = \"orders.new\"\nplugin = \"a.wasm\"\n\n[[consumers]]\nqueue = \"orders.paid\"\nplugin = \"a.wasm\"\n",
        );
        assert_eq!(
            Target::of(&config, "orders.new", SetAsideQueue::Dlq).unwrap(),
            Target {
                source: "orders.new".into(),
                set_aside: "orders.new.dlq".into()
            }
        );
        assert_eq!(
            Target::of(&config, "orders.paid", SetAsideQueue::Parked)
                .unwrap()
                .set_aside,
            "orders.paid.parked"
        );
        let error = Target::of(&config, "orders.new.dlq", SetAsideQueue::Dlq).unwrap_err();
        assert!(
            error.contains("no consumer reads the queue 'orders.new.dlq'")
                && error.contains("(consumers' queues: orders.new, orders.paid)"),
            "{error}"
        );
    }
}
