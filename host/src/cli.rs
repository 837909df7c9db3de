//! The `acemq-host` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use crate::config::LoadedConfig;
use crate::logging::{self, LogFormat};
use crate::plugin_dev::run::parse_key_value;
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
    /// Look at, replay or purge the messages a consumer set aside in
    /// `{queue}.dlq` and `{queue}.parked`.
    #[command(after_help = DLQ_HELP)]
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
}

/// `dlq --help`: an example of each command, and the exit codes they share
/// with the rest of the CLI.
const DLQ_HELP: &str = "Examples:
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
    /// Create a plugin crate that builds and passes its tests as it is.
    #[command(after_help = PLUGIN_NEW_HELP)]
    New {
        /// The crate's name (and its folder's): lowercase letters, digits,
        /// `-` and `_`, starting with a letter.
        name: String,
        /// A codec (converts bodies between the wire and handlers) instead
        /// of a handler.
        #[arg(long)]
        codec: bool,
        /// The folder to create the crate's folder in.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// The guest SDK (the `guest-sdk` folder of an acemq-host checkout)
        /// a crate outside a plugin workspace depends on; by default the
        /// one of the checkout this binary was built from.
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Build a plugin crate, or every plugin crate of a workspace, into
    /// WebAssembly components.
    #[command(after_help = PLUGIN_BUILD_HELP)]
    Build {
        /// The crate or workspace folder (or its Cargo.toml).
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// Cargo's target directory for the wasm build (core modules go in
        /// `wasm/` or `wasm-rustup/` under it). Default: the workspace's
        /// `[workspace.metadata.acemq] target-dir`, else cargo's.
        #[arg(long)]
        target_dir: Option<PathBuf>,
        /// Where the components go. Default: `plugins/` in the target directory.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Run one message through a handler component, without a broker, and
    /// show what the host would do: the outcome, the outputs it would
    /// publish, the plugin's log lines, time and fuel.
    #[command(after_help = PLUGIN_RUN_HELP)]
    Run {
        /// The handler component.
        file: PathBuf,
        /// The message body: the text itself, `@FILE` for a file's bytes,
        /// or `@-` for standard input.
        #[arg(long)]
        body: String,
        /// A message header, `KEY=VALUE` (a text value); repeatable.
        #[arg(long = "header", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        headers: Vec<(String, String)>,
        /// A `[consumers.config]` entry the plugin reads with `config(KEY)`,
        /// `KEY=VALUE`; repeatable.
        #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_key_value)]
        config: Vec<(String, String)>,
        /// An exchange the plugin may publish to (`publish_to`); repeatable.
        /// A publish anywhere else is refused, as the host refuses it.
        #[arg(long = "publish-to", value_name = "EXCHANGE")]
        publish_to: Vec<String>,
        /// The message's content type.
        #[arg(long)]
        content_type: Option<String>,
        /// The exchange the message seems to come from ("" is the default exchange).
        #[arg(long, default_value = "")]
        exchange: String,
        /// The routing key it seems to have been published with.
        #[arg(long, default_value = "plugin.run")]
        routing_key: String,
        /// Its message id; a random one by default.
        #[arg(long)]
        message_id: Option<String>,
        /// The call's time limit, as a consumer's `deadline`.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        deadline: std::time::Duration,
    },
}

const PLUGIN_NEW_HELP: &str = "\
Inside a workspace that takes every folder as a member and provides the SDK
(this repository's plugins/), the crate joins it; anywhere else it is a
workspace of its own depending on the guest SDK by path.

Example:
  acemq-host plugin new order-audit
  cd order-audit && cargo test && acemq-host plugin build

Exit codes: 0 created, 2 unusable name or folder, 1 could not write.";

const PLUGIN_BUILD_HELP: &str = "\
Uses rustup's toolchain when it has the wasm32-unknown-unknown target,
otherwise Debian's rustc-web (installed with apt when missing and allowed;
otherwise the command to run is printed). Prints where each component is.
Only what changed is rebuilt.

Examples:
  acemq-host plugin build order-audit
  acemq-host plugin build plugins          # every plugin of this repository

Exit codes: 0 built, 2 not a plugin crate or workspace, 1 build failed.";

const PLUGIN_RUN_HELP: &str = "\
Example:
  acemq-host plugin run target/plugins/order-router.wasm \\
      --body '{\"id\":\"A-1\",\"customer\":\"ada\",\"total\":4.5}' \\
      --content-type application/json --publish-to orders.events

Exit codes: 0 the call completed, whatever the handler decided; 1 it did not
(trap, panic, deadline, memory, or a publish outside --publish-to); 2 unusable
input (an argument, the body file, the plugin file).";

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
        Command::Plugin { command } => plugin_command(command),
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
        Command::Dlq { command } => dlq(command),
    }
}

/// `acemq-host plugin ...`; `new`, `build` and `run` live in `plugin_dev`.
fn plugin_command(command: PluginCommand) -> ExitCode {
    use crate::plugin_dev::{build, new, run};
    let result = match command {
        PluginCommand::Componentize { input, output } => {
            return report(componentize(&input, &output));
        }
        PluginCommand::Inspect { file } => {
            return match plugin::inspect::inspect_file(&file) {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(EXIT_INVALID, &e),
            };
        }
        PluginCommand::New {
            name,
            codec,
            dir,
            sdk,
        } => new::create(&new::NewRequest {
            name: name.clone(),
            codec,
            parent: dir,
            sdk,
        })
        .map(|created| {
            print!("{}", new::next_steps(&created, &name, codec));
            ExitCode::SUCCESS
        }),
        PluginCommand::Build {
            dir,
            target_dir,
            out_dir,
        } => build::build(
            &dir,
            &build::Overrides {
                target_dir,
                out_dir,
            },
        )
        .map(|built| {
            print!("{}", build::summary(&built));
            ExitCode::SUCCESS
        }),
        PluginCommand::Run {
            file,
            body,
            headers,
            config,
            publish_to,
            content_type,
            exchange,
            routing_key,
            message_id,
            deadline,
        } => run::run(&run::RunRequest {
            plugin: file,
            body,
            headers,
            config,
            content_type,
            exchange,
            routing_key,
            message_id,
            publish_to,
            deadline,
        })
        .map(|report| {
            print!("{}", run::render(&report));
            if report.completed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }),
    };
    result.unwrap_or_else(|failure| fail(failure.code, &failure.error))
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

fn dlq(command: DlqCommand) -> ExitCode {
    use crate::dlq::{self, Selection, Shown};
    match command {
        DlqCommand::List {
            queue,
            filters,
            limit,
        } => dlq_task(queue, &filters, |config, target, filters| async move {
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
            Ok(ExitCode::SUCCESS)
        }),
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
                (None, None) => return fail(EXIT_INVALID, "--id or --position is required"),
            };
            dlq_task(queue, &[], |config, target, _| async move {
                print!("{}", dlq::show(&config, &target, &which, bytes).await?);
                Ok(ExitCode::SUCCESS)
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
        } => {
            // Asking at a prompt would hang a script; refusing without
            // --yes makes the destructive run the one spelled out.
            if !yes && !dry_run {
                return fail(
                    EXIT_INVALID,
                    "purge removes messages for good: add --yes, or --dry-run to count what it would remove",
                );
            }
            dlq_task(queue, &filters, |config, target, filters| async move {
                let selection = Selection {
                    filters,
                    limit,
                    dry_run,
                };
                Ok(summarized(dlq::purge(&config, &target, &selection).await?))
            })
        }
    }
}

/// Runs a `dlq` command as a broker task ([`with_broker_task`]) once its
/// filters parse and its queue is one of the config's consumers': exit 2
/// otherwise, before connecting.
fn dlq_task<F, T>(queue: DlqQueue, filters: &[String], task: T) -> ExitCode
where
    T: FnOnce(LoadedConfig, crate::dlq::Target, crate::dlq::Filters) -> F,
    F: std::future::Future<Output = anyhow::Result<ExitCode>>,
{
    let filters = match crate::dlq::Filters::parse(filters) {
        Ok(filters) => filters,
        Err(e) => return fail(EXIT_INVALID, &e),
    };
    let DlqQueue {
        config,
        queue,
        from,
    } = queue;
    with_broker_task(config, |config| async move {
        match crate::dlq::Target::of(&config, &queue, from) {
            Ok(target) => task(config, target, filters).await,
            Err(e) => Ok(fail(EXIT_INVALID, &e)),
        }
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

/// Prints a dlq run's table; exit 1 when a message could not be handled.
fn summarized(summary: crate::dlq::Summary) -> ExitCode {
    print!("{}", summary.table());
    if summary.succeeded() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
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
    fn dlq_commands_parse_with_their_defaults() {
        use clap::{CommandFactory as _, Parser as _};
        Cli::command().debug_assert();
        let parse = |args: &[&str]| {
            Cli::try_parse_from([&["acemq-host", "dlq"], args].concat()).map(|cli| cli.command)
        };
        let common = ["--config", "h.toml", "--queue", "q"];
        match parse(&[&["list"], &common[..]].concat()).unwrap() {
            Command::Dlq {
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
            Command::Dlq {
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
