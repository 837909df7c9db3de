//! Throwaway RabbitMQ nodes for integration tests.
//!
//! [`Broker::start`] runs Debian's RabbitMQ 3.10 as a plain child process in a
//! fresh temporary directory, on ports picked at run time, so tests never
//! depend on or disturb another broker on the machine (a packaged service, a
//! colleague's test run). [`shared_broker`] gives every test in one test
//! binary the same node, because a node takes several seconds to boot.
//!
//! Environment:
//! - `ACEMQ_TEST_URL` (and optionally `ACEMQ_TEST_MGMT_URL`, `ACEMQ_TEST_NODE`):
//!   [`shared_broker`] uses that broker and starts nothing.
//! - `ACEMQ_RABBITMQ_BIN_DIR`: where `rabbitmq-server` and `rabbitmqctl` live
//!   (default `/usr/lib/rabbitmq/bin`).

mod client;
pub mod cluster;
pub mod dev;
mod process;

pub use client::{ReceivedMessage, passive_declare};
pub use cluster::{Cluster, shared_cluster};

use anyhow::{Context, Result, anyhow, bail};
use process::{Cli, Lifetime, NodeProcess};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// Debian installs the real scripts here; the `/usr/sbin` wrappers `cd` to
/// `/var/lib/rabbitmq` and `su` to the `rabbitmq` user, which a throwaway node
/// in our own directory must avoid.
const DEFAULT_BIN_DIR: &str = "/usr/lib/rabbitmq/bin";

/// Port-in-use races (another process grabbing a port between our probe and
/// the node binding it) are the only start failures worth retrying.
const START_ATTEMPTS: u32 = 3;

/// How long a single `rabbitmqctl`/`rabbitmq-diagnostics` call may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(120);

/// A RabbitMQ broker the tests talk to: either a throwaway node this process
/// started (stopped by [`Broker::stop`] or on drop) or an external broker.
///
/// AMQP helpers open their own short-lived connection per call: a lapin
/// connection is tied to the tokio runtime that opened it, and every
/// `#[tokio::test]` has its own runtime, so nothing AMQP is cached here.
pub struct Broker {
    amqp_url: String,
    amqp_host: String,
    amqp_port: u16,
    /// The stream protocol's listener (the `rabbitmq_stream` plugin).
    stream_port: u16,
    /// Percent-encoded for management API paths (`%2F` for `/`).
    vhost_path: String,
    mgmt_url: String,
    /// `Authorization` header value for the management API.
    mgmt_auth: String,
    http: ureq::Agent,
    cli: Cli,
    node_name: Option<String>,
    data_dir: Option<PathBuf>,
    log_file: Option<PathBuf>,
    /// `None` for an external broker and after [`Broker::stop`].
    node: Mutex<Option<NodeProcess>>,
}

impl Broker {
    /// Starts a throwaway node and waits until it accepts AMQP and
    /// management requests.
    ///
    /// Installs RabbitMQ first (`scripts/ensure-rabbitmq.sh`) if the server
    /// binary is missing. Blocks for several seconds; fine to call from async
    /// tests. On failure the error carries the tail of the node's logs and the
    /// node's directory is kept for inspection.
    pub fn start() -> Result<Broker> {
        Self::start_with_config("")
    }

    /// Like [`Broker::start`], with `extra_config` appended to the node's
    /// `rabbitmq.conf` (a TLS listener, say).
    pub fn start_with_config(extra_config: &str) -> Result<Broker> {
        Self::start_node(
            &next_node_name(),
            extra_config,
            &Lifetime::Tied,
            &process::new_cookie(),
        )
    }

    fn start_node(
        name: &str,
        extra_config: &str,
        lifetime: &Lifetime,
        cookie: &str,
    ) -> Result<Broker> {
        let bin_dir = bin_dir();
        ensure_installed(&bin_dir)?;
        let mut last_error = None;
        for attempt in 1..=START_ATTEMPTS {
            let may_retry = attempt < START_ATTEMPTS;
            match NodeProcess::start(&bin_dir, name, may_retry, extra_config, lifetime, cookie) {
                Ok(node) => {
                    let broker = Broker::from_node(bin_dir, node);
                    if let Err(error) = broker.wait_for_endpoints() {
                        let logs = broker.log_tail(60);
                        // Dropping the broker stops the node.
                        return Err(error.context(format!(
                            "RabbitMQ node {} is unusable\n--- node log ---\n{logs}",
                            broker.node_name().unwrap_or_default()
                        )));
                    }
                    return Ok(broker);
                }
                Err(failure) if failure.port_in_use && may_retry => {
                    let summary = failure.error.to_string();
                    eprintln!(
                        "acemq-tests: start attempt {attempt} of {START_ATTEMPTS} hit a taken \
                         port, retrying: {}",
                        summary.lines().next().unwrap_or_default()
                    );
                    last_error = Some(failure.error);
                }
                Err(failure) => return Err(failure.error),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow!("RabbitMQ node did not start")))
    }

    /// Uses an already running broker; starts and stops nothing.
    ///
    /// `mgmt_url` defaults to `http://{amqp host}:15672`; credentials come
    /// from its userinfo if it has any, else from the AMQP URL. The CLI
    /// helpers target `ACEMQ_TEST_NODE` if set, else the CLI's default node.
    pub fn external(amqp_url: &str, mgmt_url: Option<&str>) -> Result<Broker> {
        let uri: lapin::uri::AMQPUri = amqp_url
            .parse()
            .map_err(|e| anyhow!("invalid AMQP URL {amqp_url:?}: {e}"))?;
        let host = uri.authority.host.clone();
        let default_mgmt = format!("http://{host}:15672");
        let (mgmt_url, userinfo) = split_userinfo(mgmt_url.unwrap_or(&default_mgmt));
        let (user, password) = match userinfo {
            Some(info) => match info.split_once(':') {
                Some((u, p)) => (u.to_owned(), p.to_owned()),
                None => (info.to_owned(), String::new()),
            },
            None => (
                uri.authority.userinfo.username.clone(),
                uri.authority.userinfo.password.clone(),
            ),
        };
        let node_name = std::env::var("ACEMQ_TEST_NODE")
            .ok()
            .filter(|n| !n.is_empty());
        Ok(Broker {
            amqp_url: amqp_url.to_owned(),
            amqp_host: host,
            amqp_port: uri.authority.port,
            // An external broker's stream listener: the plugin's default
            // unless the environment names another.
            stream_port: std::env::var("ACEMQ_TEST_STREAM_PORT")
                .ok()
                .and_then(|p| p.parse().ok())
                .unwrap_or(5552),
            vhost_path: encode_path_segment(&uri.vhost),
            mgmt_url: mgmt_url.trim_end_matches('/').to_owned(),
            mgmt_auth: basic_auth(&user, &password),
            http: http_agent(),
            cli: Cli::external(bin_dir(), node_name.clone()),
            node_name,
            data_dir: None,
            log_file: None,
            node: Mutex::new(None),
        })
    }

    fn from_node(bin_dir: PathBuf, node: NodeProcess) -> Broker {
        Broker {
            amqp_url: format!("amqp://guest:guest@127.0.0.1:{}/%2f", node.ports.amqp),
            amqp_host: "127.0.0.1".to_owned(),
            amqp_port: node.ports.amqp,
            stream_port: node.ports.stream,
            vhost_path: "%2F".to_owned(),
            mgmt_url: format!("http://127.0.0.1:{}", node.ports.mgmt),
            mgmt_auth: basic_auth("guest", "guest"),
            http: http_agent(),
            cli: Cli::for_node(bin_dir, &node),
            node_name: Some(node.name.clone()),
            data_dir: Some(node.dir().to_owned()),
            log_file: Some(node.log_file()),
            node: Mutex::new(Some(node)),
        }
    }

    /// Stops the node cleanly (`rabbitmqctl stop`), kills whatever is left if
    /// that fails, and removes its directory. Idempotent; a no-op for an
    /// external broker.
    pub fn stop(&self) -> Result<()> {
        let node = self.lock_node().take();
        match node {
            Some(node) => node.stop(&self.cli),
            None => Ok(()),
        }
    }

    /// SIGKILLs the node (the whole VM at once, as a machine that lost
    /// power): no clean stop, its connections simply end. A no-op for an
    /// external broker. [`Broker::restart`] starts it again.
    pub fn kill(&self) {
        if let Some(node) = self.lock_node().as_mut() {
            node.kill();
        }
    }

    /// Starts a node that was killed again: the same name, ports and data.
    pub fn restart(&self) -> Result<()> {
        let mut node = self.lock_node();
        let node = node.as_mut().context("not a node this process runs")?;
        node.restart(&bin_dir())
    }

    /// `amqp://guest:guest@127.0.0.1:{port}/%2f` for a throwaway node.
    pub fn amqp_url(&self) -> &str {
        &self.amqp_url
    }

    /// Host of the AMQP listener (for proxies that sit in front of it).
    pub fn amqp_host(&self) -> &str {
        &self.amqp_host
    }

    /// Port of the AMQP listener.
    pub fn amqp_port(&self) -> u16 {
        self.amqp_port
    }

    /// Port of the stream protocol's listener.
    pub fn stream_port(&self) -> u16 {
        self.stream_port
    }

    /// The AMQP listener's address: what a proxy in front of it forwards to.
    pub fn amqp_addr(&self) -> std::net::SocketAddr {
        format!("{}:{}", self.amqp_host, self.amqp_port)
            .parse()
            .or_else(|_| format!("127.0.0.1:{}", self.amqp_port).parse())
            .expect("a loopback address")
    }

    /// [`amqp_url`](Self::amqp_url) with `port` (a proxy's) in place of
    /// the broker's own.
    pub fn amqp_url_via(&self, port: u16) -> String {
        self.amqp_url
            .replacen(&format!(":{}", self.amqp_port), &format!(":{port}"), 1)
    }

    /// Base URL of the management API, without credentials or trailing slash.
    pub fn mgmt_url(&self) -> &str {
        &self.mgmt_url
    }

    /// Erlang node name (`acemq-test-{pid}-{n}@localhost`); `None` for an
    /// external broker without `ACEMQ_TEST_NODE`.
    pub fn node_name(&self) -> Option<&str> {
        self.node_name.as_deref()
    }

    /// True when this broker was not started by this process.
    pub fn is_external(&self) -> bool {
        self.data_dir.is_none()
    }

    /// The node's temporary directory (config, data, logs); `None` for an
    /// external broker. Removed by [`Broker::stop`].
    pub fn data_dir(&self) -> Option<&Path> {
        self.data_dir.as_deref()
    }

    /// Last `lines` lines of the node's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        match &self.log_file {
            Some(path) => process::file_tail(path, lines),
            None => String::from("(external broker: no log available)"),
        }
    }

    /// Runs `rabbitmqctl -n NODE ARGS...` with the node's cookie and returns
    /// its stdout; fails with stdout and stderr on a non-zero exit. Blocking.
    pub fn rabbitmqctl(&self, args: &[&str]) -> Result<String> {
        self.cli("rabbitmqctl", args)
    }

    /// Runs another CLI tool from the RabbitMQ bin directory against the node
    /// (`rabbitmq-diagnostics`, `rabbitmq-queues`, `rabbitmq-plugins`...).
    pub fn cli(&self, tool: &str, args: &[&str]) -> Result<String> {
        self.cli.run(tool, args, CLI_TIMEOUT)
    }

    fn lock_node(&self) -> MutexGuard<'_, Option<NodeProcess>> {
        // A panic while holding the lock leaves the node state intact.
        self.node.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            eprintln!("acemq-tests: stopping the RabbitMQ node failed: {error:#}");
        }
    }
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("amqp_url", &self.amqp_url)
            .field("mgmt_url", &self.mgmt_url)
            .field("node_name", &self.node_name)
            .field("data_dir", &self.data_dir)
            .finish_non_exhaustive()
    }
}

/// The broker shared by every test in this test binary, started on first use.
///
/// With `ACEMQ_TEST_URL` set it is that external broker. Otherwise a
/// throwaway node is started once and stopped when the process exits (an
/// `atexit` handler: the test harness ends with `std::process::exit` or a
/// return from `main`, both of which run it). If the process is killed
/// instead, the node gets SIGTERM from the kernel (parent-death signal) and
/// shuts itself down.
///
/// Panics if the broker cannot be started; every later call panics with the
/// same error rather than trying again, so one broken start costs one wait.
pub fn shared_broker() -> &'static Broker {
    static SHARED: OnceLock<Result<Broker, String>> = OnceLock::new();

    extern "C" fn stop_shared_broker() {
        // Unwinding out of an extern "C" fn aborts; a failed stop must not.
        let _ = std::panic::catch_unwind(|| {
            if let Some(Ok(broker)) = SHARED.get()
                && let Err(error) = broker.stop()
            {
                eprintln!("acemq-tests: stopping the shared RabbitMQ node failed: {error:#}");
            }
        });
    }

    let shared = SHARED.get_or_init(|| {
        if let Some(url) = std::env::var("ACEMQ_TEST_URL")
            .ok()
            .filter(|u| !u.is_empty())
        {
            let mgmt = std::env::var("ACEMQ_TEST_MGMT_URL")
                .ok()
                .filter(|u| !u.is_empty());
            return Broker::external(&url, mgmt.as_deref()).map_err(|e| format!("{e:#}"));
        }
        let broker = Broker::start().map_err(|e| format!("{e:#}"))?;
        // SAFETY: registers a plain function with no preconditions; it
        // only reads a static that outlives every caller.
        if unsafe { libc::atexit(stop_shared_broker) } != 0 {
            eprintln!("acemq-tests: atexit failed; the shared node stops only on process death");
        }
        Ok(broker)
    });
    match shared {
        Ok(broker) => broker,
        Err(error) => panic!("acemq-tests: no shared RabbitMQ broker: {error}"),
    }
}

/// `{prefix}.{12 random hex digits}`: queue and exchange names that never
/// collide between tests sharing a broker (or with leftovers of earlier runs
/// on an external one).
pub fn unique_name(prefix: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}.{}", &id[..12])
}

fn bin_dir() -> PathBuf {
    std::env::var_os("ACEMQ_RABBITMQ_BIN_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_BIN_DIR))
}

/// `acemq-test-{pid}-{n}@localhost`: unique per process and start, so nodes
/// of concurrent test binaries never clash in the shared epmd.
fn next_node_name() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("acemq-test-{}-{n}@localhost", std::process::id())
}

/// Runs `scripts/ensure-rabbitmq.sh` when the server is missing from the
/// default location; a custom `ACEMQ_RABBITMQ_BIN_DIR` is never installed.
fn ensure_installed(bin_dir: &Path) -> Result<()> {
    // One installer at a time: concurrent apt-get runs fail on apt's lock.
    static INSTALL: Mutex<()> = Mutex::new(());
    let _guard = INSTALL.lock().unwrap_or_else(|e| e.into_inner());

    let server = bin_dir.join("rabbitmq-server");
    if server.exists() {
        return Ok(());
    }
    if bin_dir != Path::new(DEFAULT_BIN_DIR) {
        bail!(
            "{} does not exist (ACEMQ_RABBITMQ_BIN_DIR={})",
            server.display(),
            bin_dir.display()
        );
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ensure-rabbitmq.sh");
    eprintln!(
        "acemq-tests: {} missing; running {}",
        server.display(),
        script.display()
    );
    let output = std::process::Command::new("sh")
        .arg(&script)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprint!("{stdout}{stderr}");
    if !output.status.success() || !server.exists() {
        bail!(
            "{} failed ({}); RabbitMQ is not installed\n{stdout}{stderr}",
            script.display(),
            output.status
        );
    }
    Ok(())
}

fn http_agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        // The management API is on loopback (or a CI service next to it); an
        // HTTP(S)_PROXY from the environment must not capture it.
        .proxy(None)
        // Non-2xx answers are read and reported with their body.
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .new_agent()
}

/// Splits `scheme://user:pass@host...` into the URL without userinfo and the
/// userinfo (taken literally, not percent-decoded).
fn split_userinfo(url: &str) -> (String, Option<&str>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_owned(), None);
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => (format!("{scheme}://{}", &rest[at + 1..]), Some(&rest[..at])),
        None => (url.to_owned(), None),
    }
}

/// Percent-encodes one URL path segment (vhost, queue or exchange name):
/// names may contain `/`, `%`, `#` or spaces, which the management API
/// expects encoded.
fn encode_path_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `Basic base64(user:password)`. Hand-rolled: not worth a dependency, and
/// URL userinfo would need the same encoding care.
fn basic_auth(user: &str, password: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let input = format!("{user}:{password}").into_bytes();
    let mut encoded = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                encoded.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                encoded.push('=');
            }
        }
    }
    format!("Basic {encoded}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth_matches_rfc_7617_example() {
        assert_eq!(
            basic_auth("Aladdin", "open sesame"),
            "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        assert_eq!(basic_auth("guest", "guest"), "Basic Z3Vlc3Q6Z3Vlc3Q=");
        assert_eq!(basic_auth("a", ""), "Basic YTo=");
    }

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(encode_path_segment("/"), "%2F");
        assert_eq!(encode_path_segment("q.a-b_c~"), "q.a-b_c~");
        assert_eq!(encode_path_segment("a b#%"), "a%20b%23%25");
    }

    #[test]
    fn userinfo_is_split_off() {
        assert_eq!(
            split_userinfo("http://u:p@host:15672/x"),
            ("http://host:15672/x".to_owned(), Some("u:p"))
        );
        assert_eq!(
            split_userinfo("http://host:15672"),
            ("http://host:15672".to_owned(), None)
        );
    }

    #[test]
    fn unique_names_differ() {
        let a = unique_name("q");
        assert!(a.starts_with("q.") && a.len() == 14, "{a}");
        assert_ne!(a, unique_name("q"));
    }
}
