//! The `acemq-host` command line: [`Cli`], the [`Exit`] codes every
//! command shares, and one module per command group, each owning its
//! arguments (as typed, then checked) and its `run`:
//!
//! * `run.rs`: `run`, `plan` and `validate`, on a host's config.
//! * `plugin.rs`: `plugin componentize|inspect|new|build|run`.
//! * `dlq.rs`: `dlq list|show|replay|purge`.
//! * `schedule.rs`: `schedule list`.
//! * `state.rs`: `state get|list|delete`.
//! * `stream.rs`: `stream reset`.
//! * `probe.rs`: `probe live|ready`.
//! * `rollout.rs`: `rollout status|start|abort`.
//! * `admin_client.rs`: asking a running host's admin endpoint (`probe`,
//!   `rollout`).
//! * `replay.rs`: `replay`.
//!
//! The config is loaded, and refused, in one place ([`load_config`]).

mod admin_client;
mod dlq;
mod plugin;
mod probe;
mod replay;
mod rollout;
mod run;
mod schedule;
mod state;
mod stream;

use std::path::Path;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::LoadedConfig;
use crate::logging::{self, LogFormat};

#[derive(Debug, Parser)]
#[command(
    name = "acemq-host",
    version,
    long_version = crate::build_info::LONG_VERSION,
    about = "Runs RabbitMQ consumers whose logic is WebAssembly components",
    after_help = EXIT_HELP
)]
pub struct Cli {
    /// How log lines are written to stderr: `text` for people, `json` for a
    /// log pipeline (one JSON object per line: time, level, target, the
    /// message and its fields, such as `queue`, `message_id` and
    /// `trace_id`). Wins over the config's `[host] log_format`; `text` when
    /// neither says.
    #[arg(long, global = true, value_enum, env = "ACEMQ_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Connect, declare the topology and consume until SIGINT or SIGTERM.
    Run(run::ConfigArg),
    /// Print every declaration the config makes, without connecting.
    Plan(run::ConfigArg),
    /// Check config, topology and plugins without connecting.
    Validate(run::ConfigArg),
    /// Work with plugin files.
    Plugin {
        #[command(subcommand)]
        command: plugin::PluginCommand,
    },
    /// Read a stream consumer's history through a candidate plugin, without
    /// publishing anything or moving its checkpoint; with --compare, through
    /// the running version too, and show where they differ.
    Replay(replay::ReplayArgs),
    /// Work with stream consumers' checkpoints.
    Stream {
        #[command(subcommand)]
        command: stream::StreamCommand,
    },
    /// Look at, replay or purge the messages a consumer set aside in
    /// `{queue}.dlq` and `{queue}.parked`.
    #[command(after_help = dlq::DLQ_HELP)]
    Dlq {
        #[command(subcommand)]
        command: dlq::DlqCommand,
    },
    /// Look at the messages waiting in the AceMQ scheduler's queues
    /// (published for later).
    #[command(after_help = schedule::SCHEDULE_HELP)]
    Schedule {
        #[command(subcommand)]
        command: schedule::ScheduleCommand,
    },
    /// Read and edit a consumer's state namespace (plugin state) in the
    /// store the config names.
    #[command(after_help = state::STATE_HELP)]
    State {
        #[command(subcommand)]
        command: state::StateCommand,
    },
    /// Ask a running host whether it is live or ready (its admin
    /// endpoint's probes), for a container's health check.
    Probe(probe::ProbeArgs),
    /// Roll out a candidate version of a consumer's handler on a running
    /// host (canary or shadow), and watch or abort it.
    Rollout {
        #[command(subcommand)]
        command: rollout::RolloutCommand,
    },
}

/// How a command ends, as its exit code; `--help` lists them
/// ([`EXIT_HELP`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: the command did what it was asked.
    Done = 0,
    /// 1: it could not: the broker could not be used, or its work failed.
    Failed = 1,
    /// 2: its input cannot be used: the config, an argument, a file.
    Invalid = 2,
    /// 3: `replay`: the candidate is not ready to go live (it faulted, or
    /// differed from the running version more than `--max-diff`).
    NotReady = 3,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit as u8)
    }
}

/// `acemq-host --help`: the exit codes, with [`Exit`]'s meanings.
const EXIT_HELP: &str = "Exit codes: 0 done; 1 failed (the broker could not be used, or the \
command's work failed); 2 the config, an argument or a file cannot be used; 3 (replay) the \
candidate is not ready to go live.";

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // `run` reads its config first: the config may say how to log.
    if !matches!(cli.command, Command::Run(_)) {
        logging::init(cli.log_format.unwrap_or_default());
    }
    match cli.command {
        Command::Run(args) => run::run(&args.config, cli.log_format),
        Command::Plan(args) => run::plan(&args.config),
        Command::Validate(args) => run::validate(&args.config),
        Command::Plugin { command } => plugin::run(command),
        Command::Replay(args) => replay::run(args),
        Command::Stream { command } => stream::run(command),
        Command::Dlq { command } => dlq::run(command),
        Command::Schedule { command } => schedule::run(command),
        Command::State { command } => state::run(command),
        Command::Probe(args) => probe::run(args),
        Command::Rollout { command } => rollout::run(command),
    }
}

/// The config at `path`, or its refusal printed and [`Exit::Invalid`].
fn load_config(path: &Path) -> Result<LoadedConfig, ExitCode> {
    LoadedConfig::load(path).map_err(|e| fail(Exit::Invalid, &e))
}

/// Runs a one-off broker task of a command on the config at `config_path`:
/// [`Exit::Invalid`] for a config that cannot be used, [`Exit::Failed`]
/// when the task fails.
fn with_broker_task<F, T>(config_path: &Path, task: T) -> ExitCode
where
    T: FnOnce(LoadedConfig) -> F,
    F: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let config = match load_config(config_path) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(Exit::Failed, &e),
    };
    match runtime.block_on(task(config)) {
        Ok(code) => code,
        Err(e) => fail(Exit::Failed, &format!("{e:#}")),
    }
}

/// [`Exit::Done`], or [`Exit::Failed`] with the error.
fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => Exit::Done.into(),
        Err(e) => fail(Exit::Failed, &e),
    }
}

/// Prints `error` and ends with `code`.
fn fail(code: impl Into<ExitCode>, error: &(impl std::fmt::Display + ?Sized)) -> ExitCode {
    // `{:#}` on anyhow errors prints the whole chain on one line.
    eprintln!("error: {error:#}");
    code.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed_and_its_help_lists_the_exit_codes() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
        let help = Cli::command().render_long_help().to_string();
        for code in [Exit::Done, Exit::Failed, Exit::Invalid, Exit::NotReady] {
            assert!(help.contains(&format!(" {} ", code as u8)), "{help}");
        }
    }
}
