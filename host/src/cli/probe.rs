//! `acemq-host probe live|ready`: asks a running host's admin endpoint
//! whether it is alive or ready, for a container's `HEALTHCHECK` or any
//! check that has no HTTP client (the container image has nothing but the
//! binary). Exit 0 when the host answers 200, 1 otherwise.

use std::io::{Read as _, Write as _};
use std::net::{TcpStream, ToSocketAddrs as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use super::{Exit, fail, load_config};

/// How long the whole probe may take: a host that cannot answer in this
/// time is not live, whatever it would say later.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// Enough for the status line and a short JSON body.
const MAX_ANSWER_BYTES: u64 = 16 * 1024;

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
            match &config.config.host.admin_listen {
                Some(listen) => listen.get_ref().clone(),
                None => {
                    return fail(
                        Exit::Invalid,
                        &format!(
                            "{}: no [host] admin_listen, so there is no endpoint to ask",
                            path.display()
                        ),
                    );
                }
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
    let target = address
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other("the address resolves to nothing"))?;
    let mut stream = TcpStream::connect_timeout(&target, PROBE_TIMEOUT)?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
    stream.set_write_timeout(Some(PROBE_TIMEOUT))?;
    // A probe asks as the kubelet does: any Host is answered.
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream.take(MAX_ANSWER_BYTES).read_to_end(&mut answer)?;
    parse_answer(&String::from_utf8_lossy(&answer))
        .ok_or_else(|| std::io::Error::other("not an HTTP answer"))
}

/// The status code of an HTTP/1.1 answer and the `status` of its JSON body
/// (empty when it has none).
fn parse_answer(answer: &str) -> Option<(u16, String)> {
    let status = answer.lines().next()?.split(' ').nth(1)?.parse().ok()?;
    let word = answer
        .split_once("\r\n\r\n")
        .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(body.trim()).ok())
        .and_then(|body| body["status"].as_str().map(str::to_string))
        .unwrap_or_default();
    Some((status, word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_and_its_word_are_read_from_the_answer() {
        let answer = "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 24\r\n\r\n{\"status\":\"NOT_READY\"}\n";
        assert_eq!(parse_answer(answer), Some((503, "NOT_READY".into())));
        let no_body = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(parse_answer(no_body), Some((200, String::new())));
        assert_eq!(parse_answer("garbage"), None);
    }
}
