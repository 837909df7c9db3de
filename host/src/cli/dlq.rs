//! `acemq-host dlq list|show|replay|purge`: each command's arguments,
//! checked (filters parsed, the queue one of the config's consumers')
//! before anything connects, and what it prints ([`crate::dlq`] does the
//! work).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use super::{Exit, fail, with_broker_task};
use crate::config::LoadedConfig;
use crate::dlq::{self, Filters, Selection, Shown, Summary, Target};

/// `dlq --help`: an example of each command, and the exit codes they share
/// with the rest of the CLI.
pub const DLQ_HELP: &str = "Examples:
  acemq-host dlq list   --config host.toml --queue orders.new
  acemq-host dlq show   --config host.toml --queue orders.new --position 1
  acemq-host dlq replay --config host.toml --queue orders.new --filter 'reason~=timeout'
  acemq-host dlq purge  --config host.toml --queue orders.new --from parked --yes

Exit codes: 0 done; 1 the broker could not be used, or (replay) a message could not be \
moved; 2 the config, the queue or an argument cannot be used.";

/// Which set-aside queue of which consumer, shared by every `dlq` command.
#[derive(Debug, clap::Args)]
pub struct DlqQueue {
    /// The host's config: its broker, and its consumers' queues.
    #[arg(long, short)]
    config: PathBuf,
    /// The consumer's queue (one of the config's `[[consumers]]`).
    #[arg(long)]
    queue: String,
    /// Which of its set-aside queues: `dlq` ({queue}.dlq: exhausted, too
    /// old and rejected) or `parked` ({queue}.parked: parked and
    /// undecodable).
    #[arg(long, value_enum, default_value_t = crate::dlq::SetAsideQueue::Dlq)]
    from: crate::dlq::SetAsideQueue,
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// List set-aside messages, one row each (position, id, type, attempt,
    /// replays, first seen, age, reason), without consuming them: they are
    /// read and requeued in their order.
    #[command(after_help = concat!(
        "Examples:\n",
        "  acemq-host dlq list --config host.toml --queue orders.new\n",
        "  acemq-host dlq list --config host.toml --queue orders.new --from parked --filter 'type=order.placed' --limit 20\n\n",
        "Exit codes: 0 listed; 1 the broker could not be used; 2 the config, the queue or an argument cannot be used."
    ))]
    List {
        #[command(flatten)]
        queue: DlqQueue,
        /// Only messages matching: `reason~=TEXT` (the reason contains
        /// TEXT), `type=NAME` or `id=ID`; repeat to require several.
        #[arg(long = "filter", value_name = "FILTER")]
        filters: Vec<String>,
        /// At most this many rows.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Print one set-aside message in full: envelope, replay stamps,
    /// properties, headers and the start of its body (text, or hex when it
    /// is not UTF-8), without consuming it.
    #[command(after_help = concat!(
        "Examples:\n",
        "  acemq-host dlq show --config host.toml --queue orders.new --position 1\n",
        "  acemq-host dlq show --config host.toml --queue orders.new --id 5f0c6f3e-8d1a-4c57-9a53-0e2b8f1c9d4a\n\n",
        "Exit codes: 0 shown; 1 the broker could not be used, or no such message; 2 the config, the queue or an argument cannot be used."
    ))]
    #[command(group(clap::ArgGroup::new("which").required(true).args(["id", "position"])))]
    Show {
        #[command(flatten)]
        queue: DlqQueue,
        /// The message with this envelope id (`x-acemq-id`).
        #[arg(long)]
        id: Option<String>,
        /// The message at this position, 1 for the head, as `list` numbers them.
        #[arg(long)]
        position: Option<usize>,
        /// At most this many bytes of the body are printed.
        #[arg(long, default_value_t = 4096)]
        bytes: usize,
    },
    /// Move set-aside messages back to their queue through the default
    /// exchange: body unchanged, attempt reset to 1, reason cleared, stamped
    /// acemq-replayed-from, acemq-replayed-at and acemq-replay-count. Each
    /// copy is confirmed by the broker before its original is acknowledged,
    /// so an interrupted replay loses nothing.
    #[command(after_help = concat!(
        "Examples:\n",
        "  acemq-host dlq replay --config host.toml --queue orders.new\n",
        "  acemq-host dlq replay --config host.toml --queue orders.new --from parked --filter 'reason~=timeout' --limit 100 --dry-run\n\n",
        "Ends with a table: moved, skipped by filter, failed.\n",
        "Exit codes: 0 every matching message moved; 1 the broker could not be used, or a message could not be moved (it stays where it was); 2 the config, the queue or an argument cannot be used."
    ))]
    Replay {
        #[command(flatten)]
        queue: DlqQueue,
        /// Only messages matching: `reason~=TEXT` (the reason contains
        /// TEXT), `type=NAME` or `id=ID`; repeat to require several.
        #[arg(long = "filter", value_name = "FILTER")]
        filters: Vec<String>,
        /// Move at most this many messages.
        #[arg(long)]
        limit: Option<usize>,
        /// Move nothing: count what would move.
        #[arg(long)]
        dry_run: bool,
    },
    /// Remove set-aside messages for good: with --filter or --limit only
    /// those, otherwise the whole queue. Needs --yes (or --dry-run to count
    /// what it would remove).
    #[command(after_help = concat!(
        "Examples:\n",
        "  acemq-host dlq purge --config host.toml --queue orders.new --filter 'type=test.ping' --dry-run\n",
        "  acemq-host dlq purge --config host.toml --queue orders.new --from parked --yes\n\n",
        "Exit codes: 0 purged (or counted); 1 the broker could not be used; 2 the config, the queue or an argument cannot be used, or neither --yes nor --dry-run was given."
    ))]
    Purge {
        #[command(flatten)]
        queue: DlqQueue,
        /// Only messages matching: `reason~=TEXT` (the reason contains
        /// TEXT), `type=NAME` or `id=ID`; repeat to require several.
        #[arg(long = "filter", value_name = "FILTER")]
        filters: Vec<String>,
        /// Remove at most this many messages.
        #[arg(long)]
        limit: Option<usize>,
        /// Remove nothing: count what would be removed.
        #[arg(long, conflicts_with = "yes")]
        dry_run: bool,
        /// Remove them: purging cannot be undone.
        #[arg(long)]
        yes: bool,
    },
}

pub fn run(command: DlqCommand) -> ExitCode {
    match command {
        DlqCommand::List {
            queue,
            filters,
            limit,
        } => list(queue, &filters, limit),
        DlqCommand::Show {
            queue,
            id,
            position,
            bytes,
        } => {
            let which = match (id, position) {
                (Some(id), _) => Shown::Id(id),
                (None, Some(position)) => Shown::Position(position),
                // clap requires one of the two.
                (None, None) => return fail(Exit::Invalid, "--id or --position is required"),
            };
            dlq_task(queue, &[], |config, target, _| async move {
                print!("{}", dlq::show(&config, &target, &which, bytes).await?);
                Ok(Exit::Done.into())
            })
        }
        DlqCommand::Replay {
            queue,
            filters,
            limit,
            dry_run,
        } => dlq_task(queue, &filters, |config, target, filters| async move {
            let selection = Selection {
                filters,
                limit,
                dry_run,
            };
            Ok(summarized(dlq::replay(&config, &target, &selection).await?))
        }),
        DlqCommand::Purge {
            queue,
            filters,
            limit,
            dry_run,
            yes,
        } => purge(queue, &filters, limit, dry_run, yes),
    }
}

/// `dlq list`: the rows, and how many of the queue's messages they are.
fn list(queue: DlqQueue, filters: &[String], limit: usize) -> ExitCode {
    dlq_task(queue, filters, |config, target, filters| async move {
        let selection = Selection {
            filters,
            limit: Some(limit),
            dry_run: false,
        };
        let (rows, total) = dlq::list(&config, &target, &selection).await?;
        print!("{}", dlq::list_table(&rows, crate::envelope::now_ms()));
        let matching = match selection.filters.is_empty() {
            true => String::new(),
            false => format!(" matching {}", selection.filters),
        };
        println!(
            "{} of the {total} messages in {}{matching} shown",
            rows.len(),
            target.set_aside
        );
        Ok(Exit::Done.into())
    })
}

/// `dlq purge`: refused without `--yes` or `--dry-run`.
fn purge(
    queue: DlqQueue,
    filters: &[String],
    limit: Option<usize>,
    dry_run: bool,
    yes: bool,
) -> ExitCode {
    // Asking at a prompt would hang a script; refusing without --yes makes
    // the destructive run the one spelled out.
    if !yes && !dry_run {
        return fail(
            Exit::Invalid,
            "purge removes messages for good: add --yes, or --dry-run to count what it would remove",
        );
    }
    dlq_task(queue, filters, |config, target, filters| async move {
        let selection = Selection {
            filters,
            limit,
            dry_run,
        };
        Ok(summarized(dlq::purge(&config, &target, &selection).await?))
    })
}

/// Runs a `dlq` command as a broker task ([`with_broker_task`]) once its
/// filters parse and its queue is one of the config's consumers':
/// [`Exit::Invalid`] otherwise, before connecting.
fn dlq_task<F, T>(queue: DlqQueue, filters: &[String], task: T) -> ExitCode
where
    T: FnOnce(LoadedConfig, Target, Filters) -> F,
    F: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let filters = match Filters::parse(filters) {
        Ok(filters) => filters,
        Err(e) => return fail(Exit::Invalid, &e),
    };
    let DlqQueue {
        config,
        queue,
        from,
    } = queue;
    with_broker_task(&config, |config| async move {
        match Target::of(&config, &queue, from) {
            Ok(target) => task(config, target, filters).await,
            Err(e) => Ok(fail(Exit::Invalid, &e)),
        }
    })
}

/// Prints a dlq run's table; [`Exit::Failed`] when a message could not be
/// handled.
fn summarized(summary: Summary) -> ExitCode {
    print!("{}", summary.table());
    match summary.succeeded() {
        true => Exit::Done.into(),
        false => Exit::Failed.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dlq_commands_parse_with_their_defaults() {
        use clap::Parser as _;
        let parse = |args: &[&str]| {
            super::super::Cli::try_parse_from([&["acemq-host", "dlq"], args].concat())
                .map(|cli| cli.command)
        };
        let common = ["--config", "h.toml", "--queue", "q"];
        match parse(&[&["list"], &common[..]].concat()).unwrap() {
            super::super::Command::Dlq {
                command: DlqCommand::List { queue, limit, .. },
            } => {
                assert_eq!(limit, 100);
                assert_eq!(queue.from, crate::dlq::SetAsideQueue::Dlq);
            }
            other => panic!("{other:?}"),
        }
        let replay = [
            &["replay"],
            &common[..],
            &["--from", "parked", "--filter", "type=a"],
        ];
        match parse(&replay.concat()).unwrap() {
            super::super::Command::Dlq {
                command:
                    DlqCommand::Replay {
                        queue,
                        filters,
                        limit,
                        dry_run,
                    },
            } => {
                assert_eq!(queue.from, crate::dlq::SetAsideQueue::Parked);
                assert_eq!(
                    (filters, limit, dry_run),
                    (vec!["type=a".to_string()], None, false)
                );
            }
            other => panic!("{other:?}"),
        }
        // show needs one of --id and --position, not both.
        assert!(parse(&[&["show"], &common[..]].concat()).is_err());
        assert!(
            parse(&[&["show"], &common[..], &["--id", "a", "--position", "1"]].concat()).is_err()
        );
        // purge cannot be both a dry run and meant.
        assert!(parse(&[&["purge"], &common[..], &["--yes", "--dry-run"]].concat()).is_err());
    }
}
