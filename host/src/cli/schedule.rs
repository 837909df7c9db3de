//! `acemq-host schedule list`: its arguments, and what it prints
//! ([`crate::scheduler::list`] does the work).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use super::{Exit, with_broker_task};
use crate::config::LoadedConfig;
use crate::scheduler::list;

/// `schedule --help`: an example, and the exit codes it shares with the
/// rest of the CLI.
pub const SCHEDULE_HELP: &str = "Examples:
  acemq-host schedule list --config host.toml
  acemq-host schedule list --config host.toml --limit 20

Exit codes: 0 listed (a scheduler queue the broker does not have is named in the output); \
1 the broker could not be used; 2 the config or an argument cannot be used.";

#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// List the messages waiting in the scheduler's queues
    /// (acemq.schedule.1h, .10m, .1m, .10s, .1s and .due), one row each
    /// (queue, position, due time, time left or overdue, age, id, type,
    /// target exchange and routing key), without consuming them: they are
    /// read and requeued in their order. Messages a running host's control
    /// consumer already holds are not ready, so not listed.
    #[command(after_help = SCHEDULE_HELP)]
    List {
        /// A host's config: the broker (and vhost) to read. The config
        /// need not run the scheduler; the heading says when it does not.
        #[arg(long, short)]
        config: PathBuf,
        /// At most this many rows in all, longest rung first.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
}

pub fn run(command: ScheduleCommand) -> ExitCode {
    match command {
        ScheduleCommand::List { config, limit } => with_broker_task(&config, |config| async move {
            let listing = list::list(&config, limit).await?;
            let not_run = not_running(&config);
            print!(
                "{}",
                list::report(&listing, not_run.as_deref(), crate::envelope::now_ms())
            );
            Ok(Exit::Done.into())
        }),
    }
}

/// The heading's note when the config does not run the scheduler: the
/// messages are listed all the same, but a host of this config does not
/// deliver them.
fn not_running(config: &LoadedConfig) -> Option<String> {
    if config.config.scheduler_enabled() {
        return None;
    }
    let why = match &config.config.scheduler.enabled {
        Some(_) => "[scheduler] enabled = false",
        None => "no consumer has publish_delayed = true and [scheduler] enabled is not set",
    };
    Some(format!(
        "{} does not run the scheduler ({why}): these are delivered only where another host or AceMQ library runs it on this vhost",
        config.path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<ScheduleCommand, clap::Error> {
        use clap::Parser as _;
        let cli = super::super::Cli::try_parse_from([&["acemq-host", "schedule"], args].concat())?;
        match cli.command {
            super::super::Command::Schedule { command } => Ok(command),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn list_takes_a_config_and_a_limit_of_100_by_default() {
        let ScheduleCommand::List { config, limit } =
            parse(&["list", "--config", "h.toml"]).unwrap();
        assert_eq!((config, limit), (PathBuf::from("h.toml"), 100));
        let ScheduleCommand::List { limit, .. } =
            parse(&["list", "-c", "h.toml", "--limit", "5"]).unwrap();
        assert_eq!(limit, 5);
        assert!(parse(&["list"]).is_err(), "--config is required");
    }

    fn config(text: &str) -> LoadedConfig {
        LoadedConfig::parse(std::path::Path::new("host.toml"), text.to_string()).unwrap()
    }

    #[test]
    fn the_note_says_why_a_config_does_not_run_the_scheduler() {
        let broker = "[broker]\nurl = \"amqp://localhost\"\n";
        let note = not_running(&config(broker)).unwrap();
        assert!(
            note.ends_with(
                "host.toml does not run the scheduler (no consumer has publish_delayed = true and \
                 [scheduler] enabled is not set): these are delivered only where another host or \
                 AceMQ library runs it on this vhost"
            ),
            "{note}"
        );
        let off = not_running(&config(&format!(
            "{broker}\n[scheduler]\nenabled = false\n"
        )));
        assert!(off.unwrap().contains("([scheduler] enabled = false)"));
        assert_eq!(
            not_running(&config(&format!("{broker}\n[scheduler]\nenabled = true\n"))),
            None
        );
    }
}
