//! `acemq-host probe live|ready`: asks a running host's admin endpoint
//! whether it is alive or ready, for a container's `HEALTHCHECK` or any
//! check that has no HTTP client (the container image has nothing but the
//! binary). Exit 0 when the host answers 200, 1 otherwise.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use super::{Exit, fail, load_config};

/// How long the whole probe may take: a host that cannot answer in this
/// time is not live, whatever it would say later.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Probe {
    /// `GET /health/live`: the host's runtime makes progress.
    Live,
    /// `GET /health/ready`: connected, and every consumer reading.
    Ready,
}

#[derive(Debug, clap::Args)]
#[command(after_help = PROBE_HELP)]
pub struct ProbeArgs {
    /// What to ask.
    #[arg(value_enum)]
    pub probe: Probe,
    /// The host's config: the endpoint is its `[host] admin_listen`.
    #[arg(
        long,
        short,
        conflicts_with = "address",
        required_unless_present = "address"
    )]
    pub config: Option<PathBuf>,
    /// The endpoint's address, `HOST:PORT`, instead of a config's.
    #[arg(long)]
    pub address: Option<String>,
}

pub const PROBE_HELP: &str = "Examples:
  acemq-host probe live --config /etc/acemq-host/host.toml
  acemq-host probe ready --address 127.0.0.1:9090

Prints the status word the endpoint answered (LIVE, STALLED, READY,
NOT_READY). Exit codes: 0 the host answered 200; 1 it answered otherwise,
or not within 3 s; 2 no admin endpoint to ask (no admin_listen in the
config) or an unusable argument.";

pub fn run(args: ProbeArgs) -> ExitCode {
    let address = match (&args.address, &args.config) {
        (Some(address), _) => address.clone(),
        (None, Some(path)) => {
            let config = match load_config(path) {
                Ok(config) => config,
                Err(code) => return code,
            };
            match super::admin_client::endpoint_of(&config) {
                Ok((address, _token)) => address,
                Err(why) => return fail(Exit::Invalid, &why),
            }
        }
        (None, None) => unreachable!("clap requires one of them"),
    };
    let path = match args.probe {
        Probe::Live => "/health/live",
        Probe::Ready => "/health/ready",
    };
    match ask(&address, path) {
        Ok((200, word)) => {
            println!("{word}");
            Exit::Done.into()
        }
        Ok((status, word)) => {
            println!("{word}");
            fail(
                Exit::Failed,
                &format!("GET {path} on {address} answered {status}"),
            )
        }
        Err(e) => fail(Exit::Failed, &format!("GET {path} on {address}: {e}")),
    }
}

/// `GET path` on `address`: the status code and the answer's status word.
fn ask(address: &str, path: &str) -> std::io::Result<(u16, String)> {
    // A probe asks as the kubelet does: no token, any Host answered.
    let answer = super::admin_client::request(address, "GET", path, None, PROBE_TIMEOUT)?;
    let word = answer.json()["status"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Ok((answer.status, word))
}
