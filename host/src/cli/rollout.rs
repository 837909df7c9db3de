//! `acemq-host rollout status|start|abort`: a running host's rollouts,
//! through its admin endpoint (`/rollouts`; docs/rollout.md).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::Value;

use super::admin_client::{self, Answer};
use super::{Exit, fail, load_config};

/// How long one request may take: starting a rollout compiles the
/// candidate (seconds for a Python or JavaScript one, not cached).
const TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, clap::Subcommand)]
pub enum RolloutCommand {
    /// Show each consumer's rollout: mode, status, step and share, the
    /// figures of both versions, why it ended, and a shadow's differences.
    #[command(after_help = STATUS_HELP)]
    Status {
        #[command(flatten)]
        host: HostArgs,
        /// Only this consumer's.
        #[arg(long)]
        queue: Option<String>,
    },
    /// Start a rollout of a candidate on a consumer (canary by default).
    #[command(after_help = START_HELP)]
    Start(StartArgs),
    /// Abort the rollout under way on a consumer: the current version
    /// serves every delivery.
    #[command(after_help = ABORT_HELP)]
    Abort {
        #[command(flatten)]
        host: HostArgs,
        #[arg(long)]
        queue: String,
    },
}

/// Which host to ask: the one its config describes.
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    /// The running host's config: its `[host] admin_listen` and admin token
    /// (`ACEMQ_ADMIN_TOKEN`, else `admin_token_file`).
    #[arg(long, short)]
    pub config: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct StartArgs {
    #[command(flatten)]
    host: HostArgs,
    #[arg(long)]
    queue: String,
    /// The candidate's component (a path on the host's machine).
    #[arg(long)]
    plugin: PathBuf,
    /// `canary` or `shadow`.
    #[arg(long, default_value = "canary")]
    mode: String,
    /// A canary's shares, comma separated (default 1%,10%,50%,100%).
    #[arg(long)]
    steps: Option<String>,
    /// A shadow's share (default 100%).
    #[arg(long)]
    share: Option<String>,
    #[arg(long)]
    messages_per_step: Option<u64>,
    #[arg(long)]
    max_fault_rate_increase: Option<String>,
    #[arg(long)]
    max_set_aside_rate_increase: Option<String>,
    #[arg(long)]
    max_call_time_ratio: Option<f64>,
}

const STATUS_HELP: &str = "Examples:
  acemq-host rollout status --config /etc/acemq-host/host.toml
  acemq-host rollout status --config host.toml --queue orders.new

Exit codes: 0 shown; 1 the host could not be asked or refused; 2 no admin
endpoint in the config.";

const START_HELP: &str = "Examples:
  acemq-host rollout start --config host.toml --queue orders.new --plugin plugins/router-v2.wasm
  acemq-host rollout start --config host.toml --queue orders.new --plugin router-v2.wasm \\
      --steps 5%,25%,100% --messages-per-step 1000 --max-fault-rate-increase 0.5%
  acemq-host rollout start --config host.toml --queue orders.new --plugin router-v2.wasm \\
      --mode shadow --share 20%

The candidate is checked, compiled and warmed by the host before the first
delivery goes to it; one it cannot load is refused with the reason. A
rollout started this way is not resumed after a restart (a promotion it
decided stands); configure [consumers.candidate] for one that is.
Exit codes: 0 started; 1 refused (the reason is printed) or the host could
not be asked; 2 an unusable argument or no admin endpoint.";

const ABORT_HELP: &str = "Example:
  acemq-host rollout abort --config host.toml --queue orders.new

Exit codes: 0 aborted; 1 none under way, or the host could not be asked.";

pub fn run(command: RolloutCommand) -> ExitCode {
    match command {
        RolloutCommand::Status { host, queue } => ask(&host, "GET", "/rollouts", |answer| {
            let views: Vec<Value> = answer.json().as_array().cloned().unwrap_or_default();
            let shown: Vec<&Value> = views
                .iter()
                .filter(|v| queue.as_deref().is_none_or(|q| v["queue"] == q))
                .collect();
            if shown.is_empty() {
                println!("no rollout since the host started");
            }
            for view in shown {
                print!("{}", describe(view));
            }
        }),
        RolloutCommand::Start(args) => {
            let plugin = match std::path::absolute(&args.plugin) {
                Ok(path) => path,
                Err(e) => return fail(Exit::Invalid, &format!("--plugin: {e}")),
            };
            let mut query = form_urlencoded::Serializer::new(String::new());
            query
                .append_pair("queue", &args.queue)
                .append_pair("plugin", &plugin.display().to_string())
                .append_pair("mode", &args.mode);
            let optional = [
                ("steps", args.steps.clone()),
                ("share", args.share.clone()),
                (
                    "messages_per_step",
                    args.messages_per_step.map(|n| n.to_string()),
                ),
                (
                    "max_fault_rate_increase",
                    args.max_fault_rate_increase.clone(),
                ),
                (
                    "max_set_aside_rate_increase",
                    args.max_set_aside_rate_increase.clone(),
                ),
                (
                    "max_call_time_ratio",
                    args.max_call_time_ratio.map(|r| r.to_string()),
                ),
            ];
            for (key, value) in optional {
                if let Some(value) = value {
                    query.append_pair(key, &value);
                }
            }
            let target = format!("/rollouts/start?{}", query.finish());
            ask(&args.host, "POST", &target, |answer| {
                print!("started: {}", describe(&answer.json()));
            })
        }
        RolloutCommand::Abort { host, queue } => {
            let target = format!(
                "/rollouts/abort?{}",
                form_urlencoded::Serializer::new(String::new())
                    .append_pair("queue", &queue)
                    .finish()
            );
            ask(&host, "POST", &target, |answer| {
                print!("aborted: {}", describe(&answer.json()));
            })
        }
    }
}

/// Sends the request; on a 200 shows the answer, otherwise prints the
/// host's error and fails.
fn ask(host: &HostArgs, method: &str, target: &str, show: impl FnOnce(&Answer)) -> ExitCode {
    let config = match load_config(&host.config) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let (address, token) = match admin_client::endpoint_of(&config) {
        Ok(endpoint) => endpoint,
        Err(why) => return fail(Exit::Invalid, &why),
    };
    match admin_client::request(&address, method, target, token.as_deref(), TIMEOUT) {
        Ok(answer) if answer.status == 200 => {
            show(&answer);
            Exit::Done.into()
        }
        Ok(answer) => {
            let error = answer.json()["error"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| answer.body.trim().to_string());
            fail(
                Exit::Failed,
                &format!("the host answered {}: {error}", answer.status),
            )
        }
        Err(e) => fail(
            Exit::Failed,
            &format!("cannot ask the host at {address}: {e}"),
        ),
    }
}

/// A rollout's view (`/rollouts`) for a person: a few lines.
fn describe(view: &Value) -> String {
    let window = |w: &Value| {
        format!(
            "{} calls, {} faulted ({:.1}%), {} rejected or parked ({:.1}%), p99 {}",
            w["calls"],
            w["faults"],
            w["fault_rate"].as_f64().unwrap_or(0.0) * 100.0,
            w["set_aside"],
            w["set_aside_rate"].as_f64().unwrap_or(0.0) * 100.0,
            w["p99_ms"]
                .as_f64()
                .map_or("-".to_string(), |ms| format!("{ms:.1} ms"))
        )
    };
    let text = |v: &Value| v.as_str().unwrap_or("-").to_string();
    let mut out = format!(
        "{} ({}): {}, step {} of {} ({}), candidate {} ({})\n",
        text(&view["queue"]),
        text(&view["mode"]),
        text(&view["status"]),
        view["step"],
        view["of"],
        text(&view["share"]),
        text(&view["candidate"]["path"]),
        text(&view["candidate"]["sha256"])
            .chars()
            .take(12)
            .collect::<String>(),
    );
    out.push_str(&format!(
        "  current:   {}\n  candidate: {}\n",
        window(&view["window"]["current"]),
        window(&view["window"]["candidate"])
    ));
    if let Some(reason) = view["reason"].as_str() {
        out.push_str(&format!("  why: {reason}\n"));
    }
    let shadow = &view["shadow"];
    if !shadow.is_null() {
        out.push_str(&format!(
            "  shadow: {} compared, {} different ({:.1}%), {} skipped\n",
            shadow["compared"],
            shadow["different"],
            shadow["difference_rate"].as_f64().unwrap_or(0.0) * 100.0,
            shadow["skipped"]
        ));
        for example in shadow["examples"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "    {}: {}\n",
                text(&example["message_id"]),
                text(&example["difference"])
            ));
        }
    }
    out
}
