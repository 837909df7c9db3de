//! The `acemq-host` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use crate::config::LoadedConfig;
use crate::logging::{self, LogFormat};
use crate::telemetry::Metrics;
use crate::topology::{self, Topology};
use crate::{app, plugin};
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(
    name = "acemq-host",
    version,
    about = "Runs RabbitMQ consumers whose logic is WebAssembly components"
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
    Run {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Print every declaration the config makes, without connecting.
    Plan {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Check config, topology and plugins without connecting.
    Validate {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Work with plugin files.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// Read a stream consumer's history through a candidate plugin, without
    /// publishing anything or moving its checkpoint; with --compare, through
    /// the running version too, and show where they differ.
    Replay {
        #[arg(long, short)]
        config: PathBuf,
        /// The consumer's `consumer_name` (or its queue).
        #[arg(long)]
        consumer: String,
        /// The candidate plugin file.
        #[arg(long)]
        plugin: PathBuf,
        /// Where to start: `first`, an offset, a time, an interval (`1h`).
        #[arg(long, default_value = "first")]
        from: String,
        /// The last offset to read, or `last` (the default): whatever the
        /// stream holds.
        #[arg(long, default_value = "last", value_parser = parse_up_to)]
        to: UpTo,
        /// Run the consumer's current plugin too, and compare.
        #[arg(long)]
        compare: bool,
        /// With --compare: how many differing messages still exit 0.
        #[arg(long, default_value_t = 0)]
        max_diff: usize,
    },
    /// Work with stream consumers' checkpoints.
    Stream {
        #[command(subcommand)]
        command: StreamCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum StreamCommand {
    /// Move a stopped stream consumer's checkpoint: it resumes from there.
    Reset {
        #[arg(long, short)]
        config: PathBuf,
        /// The consumer's `consumer_name`.
        #[arg(long)]
        consumer: String,
        /// `first`, `last`, `next`, an offset, an RFC 3339 time or an
        /// interval back from now (`1h`).
        #[arg(long)]
        to: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Turn a core module with an embedded component type into a component.
    Componentize { input: PathBuf, output: PathBuf },
    /// Show what a plugin file is: world, imports, exports, size, hash.
    Inspect { file: PathBuf },
}

/// `replay --to`: an offset, or `None` for the end of what the stream holds.
#[derive(Debug, Clone, Copy)]
pub struct UpTo(Option<u64>);

fn parse_up_to(text: &str) -> Result<UpTo, String> {
    match text.trim() {
        "last" => Ok(UpTo(None)),
        offset => offset
            .parse()
            .map(|n| UpTo(Some(n)))
            .map_err(|_| format!("{text:?} is neither an offset nor \"last\"")),
    }
}

/// Exit code for a config, topology or plugin that cannot be used.
const EXIT_INVALID: u8 = 2;

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // `run` reads its config first: the config may say how to log.
    if !matches!(cli.command, Command::Run { .. }) {
        logging::init(cli.log_format.unwrap_or_default());
    }
    match cli.command {
        Command::Run { config } => run(config, cli.log_format),
        Command::Plan { config } => plan(config),
        Command::Validate { config } => validate(config),
        Command::Plugin {
            command: PluginCommand::Componentize { input, output },
        } => report(componentize(&input, &output)),
        Command::Stream {
            command:
                StreamCommand::Reset {
                    config,
                    consumer,
                    to,
                },
        } => stream_reset(config, &consumer, &to),
        Command::Replay {
            config,
            consumer,
            plugin,
            from,
            to,
            compare,
            max_diff,
        } => replay(
            config,
            &crate::replay::ReplayRequest {
                consumer,
                candidate: plugin,
                from,
                to: to.0,
                compare,
            },
            max_diff,
        ),
        Command::Plugin {
            command: PluginCommand::Inspect { file },
        } => match plugin::inspect::inspect_file(&file) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(EXIT_INVALID, &e),
        },
    }
}

fn run(config_path: PathBuf, log_format: Option<LogFormat>) -> ExitCode {
    let config = match LoadedConfig::load(&config_path) {
        Ok(config) => config,
        Err(e) => {
            logging::init(log_format.unwrap_or_default());
            return fail(EXIT_INVALID, &e);
        }
    };
    logging::init(
        log_format
            .or(config.config.host.log_format)
            .unwrap_or_default(),
    );
    let prepared = match app::prepare(config) {
        Ok(prepared) => prepared,
        Err(e) => return fail(EXIT_INVALID, &e),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(1, &e),
    };
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        tokio::spawn(stop_on_signals(shutdown.clone()));
        app::run(prepared, shutdown, Arc::new(Metrics::new())).await
    });
    report(result)
}

fn replay(
    config_path: PathBuf,
    request: &crate::replay::ReplayRequest,
    max_diff: usize,
) -> ExitCode {
    with_broker_task(config_path, |config| async move {
        let report = crate::replay::replay(&config, request).await?;
        print!("{}", report.table());
        // A candidate that faults, or differs more than allowed, is not
        // ready to go live: scripts can gate a deploy on this.
        let ready = report.faults() == 0 && (!request.compare || report.differing <= max_diff);
        Ok(if ready {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(3)
        })
    })
}

fn stream_reset(config_path: PathBuf, consumer: &str, to: &str) -> ExitCode {
    with_broker_task(config_path, |config| async move {
        println!(
            "{}",
            app::reset_stream_checkpoint(&config, consumer, to).await?
        );
        Ok(ExitCode::SUCCESS)
    })
}

/// Runs a one-off broker task of a command on the config at `config_path`:
/// exit 2 for a config that cannot be used, 1 when the task fails.
fn with_broker_task<F, T>(config_path: PathBuf, task: T) -> ExitCode
where
    T: FnOnce(LoadedConfig) -> F,
    F: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let config = match LoadedConfig::load(&config_path) {
        Ok(config) => config,
        Err(e) => return fail(EXIT_INVALID, &e),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(1, &e),
    };
    match runtime.block_on(task(config)) {
        Ok(code) => code,
        Err(e) => fail(1, &format!("{e:#}")),
    }
}

fn plan(config_path: PathBuf) -> ExitCode {
    let config = match LoadedConfig::load(&config_path) {
        Ok(config) => config,
        Err(e) => return fail(EXIT_INVALID, &e),
    };
    match Topology::from_config(&config.config) {
        Ok(topology) => {
            println!("{}", topology::plan(&topology));
            ExitCode::SUCCESS
        }
        Err(problems) => {
            println!("{}", config.topology_problems(&problems));
            ExitCode::from(EXIT_INVALID)
        }
    }
}

fn validate(config_path: PathBuf) -> ExitCode {
    let config = match LoadedConfig::load(&config_path) {
        Ok(config) => config,
        Err(e) => return fail(EXIT_INVALID, &e),
    };
    match app::prepare(config) {
        Ok(prepared) => {
            println!(
                "{}: valid ({} exchanges, {} queues, {} bindings, {} consumers)",
                config_path.display(),
                prepared.topology.exchanges.len(),
                prepared.topology.queues.len(),
                prepared.topology.bindings.len(),
                prepared.consumers.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(EXIT_INVALID, &e),
    }
}

fn componentize(input: &std::path::Path, output: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let core = std::fs::read(input).with_context(|| format!("cannot read {}", input.display()))?;
    let component = plugin::componentize::componentize(&core)
        .with_context(|| format!("{}", input.display()))?;
    std::fs::write(output, component)
        .with_context(|| format!("cannot write {}", output.display()))?;
    Ok(())
}

async fn stop_on_signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::error!("cannot listen for SIGINT/SIGTERM");
        return;
    };
    let name = tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
    };
    tracing::info!(
        signal = name,
        "shutting down: no new deliveries, finishing the running ones"
    );
    shutdown.cancel();
}

fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(1, &e),
    }
}

fn fail(code: u8, error: &(impl std::fmt::Display + ?Sized)) -> ExitCode {
    // `{:#}` on anyhow errors prints the whole chain on one line.
    eprintln!("error: {error:#}");
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_reads_up_to_an_offset_or_the_last_message() {
        assert_eq!(parse_up_to("last").unwrap().0, None);
        assert_eq!(parse_up_to("9999").unwrap().0, Some(9999));
        assert!(
            parse_up_to("soon")
                .unwrap_err()
                .contains("neither an offset nor \"last\"")
        );
    }
}
