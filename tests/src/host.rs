//! Running acemq-host in tests: as a real process (for signals and exit
//! codes) or in-process (for its metrics), always with real plugins built by
//! `scripts/build-plugins`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use tokio_util::sync::CancellationToken;

use acemq_host::admin::policy::TOKEN_ENV;
use acemq_host::app;
use acemq_host::broker::{Board, Reading};
use acemq_host::config::LoadedConfig;
use acemq_host::telemetry::Metrics;

/// The workspace's root folder.
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The one entry of the compiled-plugin cache folder `cache` that belongs
/// to the plugin whose source hashes to `sha256` (entries are named after
/// it); panics naming what is there otherwise.
pub fn cache_entry(cache: &Path, sha256: &str) -> PathBuf {
    let entries: Vec<PathBuf> = std::fs::read_dir(cache)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(sha256)
        })
        .collect();
    let [entry] = &entries[..] else {
        panic!("one cache entry expected for {sha256}: {entries:?}")
    };
    entry.clone()
}

/// Path of a plugin component built by `scripts/build-plugins`.
pub fn plugin_path(name: &str) -> PathBuf {
    let path = workspace_root()
        .join("target/plugins")
        .join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} is missing: build the plugins first with scripts/build-plugins (scripts/test does)",
        path.display()
    );
    path
}

/// The `acemq-host` binary built in the dev profile (by `scripts/build-plugins`).
pub fn host_binary() -> PathBuf {
    // ACEMQ_HOST_BINARY runs the tests against another build (a release
    // build, or a copy kept while the sources change).
    // A relative path is the workspace's (cargo runs tests and benches in
    // their package's folder).
    if let Some(path) = std::env::var_os("ACEMQ_HOST_BINARY") {
        return workspace_root().join(path);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let path = target.join("debug/acemq-host");
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p acemq-host` (scripts/build-plugins does)",
        path.display()
    );
    path
}

/// What the host logs once a subscription holds its consumer (its message,
/// then its first field): other lines may mention consuming in passing.
pub const SUBSCRIBED: &str = ": consuming queue=";

/// The host's log format, from the environment (`--log-format`).
const LOG_FORMAT_ENV: &str = "ACEMQ_LOG_FORMAT";

/// How to start an [`HostProcess`].
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// Consumers to wait for (`consuming` log lines) before returning.
    pub consumers: usize,
    /// Passed as `ACEMQ_URL`.
    pub url: Option<String>,
    /// Print each log line as it arrives, after this prefix.
    pub echo: Option<String>,
    /// Passed as `RUST_LOG`; `None` runs the host with its own default
    /// filter, as an operator who sets nothing gets it.
    pub rust_log: Option<String>,
    /// Passed as `ACEMQ_ADMIN_TOKEN`; the test process's own never is.
    pub admin_token: Option<String>,
    /// Passed as `ACEMQ_LOG_FORMAT` (`text` or `json`); unset, the host
    /// writes text, which [`SUBSCRIBED`] and the log waits look for.
    pub log_format: Option<String>,
    /// How long the host may take to subscribe: a minute, unless its
    /// plugins take longer to compile (Python or JavaScript interpreters).
    pub start_within: Duration,
    /// More environment variables (the crash point `ACEMQ_CRASH_AT` of the
    /// state tests).
    pub env: Vec<(String, String)>,
    /// The binary to run instead of [`host_binary`]'s (the memory bench's
    /// release build).
    pub binary: Option<PathBuf>,
}

impl Default for HostOptions {
    fn default() -> Self {
        Self {
            consumers: 1,
            start_within: Duration::from_secs(60),
            url: None,
            echo: None,
            // ACEMQ_TEST_HOST_LOG raises the host's log level when a test
            // needs to be diagnosed (for example `acemq_host=debug`).
            rust_log: Some(std::env::var("ACEMQ_TEST_HOST_LOG").unwrap_or_else(|_| "info".into())),
            admin_token: None,
            log_format: None,
            env: Vec::new(),
            binary: None,
        }
    }
}

/// An `acemq-host run` child process with its config in a temporary folder.
pub struct HostProcess {
    child: Child,
    /// Every line the host wrote, to stderr (its log) or stdout, so far.
    log: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl HostProcess {
    /// Writes `config` to a file and starts `acemq-host run` on it; returns
    /// once it logged `consuming` for `consumers` consumers.
    pub fn start(config: &str, consumers: usize) -> Result<Self> {
        Self::start_within(config, consumers, HostOptions::default().start_within)
    }

    /// [`start`](Self::start), allowing the host `within` to subscribe.
    pub fn start_within(config: &str, consumers: usize, within: Duration) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("host.toml");
        std::fs::write(&path, config)?;
        Self::start_with(
            &path,
            dir,
            &HostOptions {
                consumers,
                start_within: within,
                ..HostOptions::default()
            },
        )
    }

    /// Starts `acemq-host run --config PATH`; `dir` lives as long as the host.
    /// With `consumers: 0` it returns at once, for a host expected to exit
    /// by itself ([`wait_with_log`](Self::wait_with_log)).
    pub fn start_with(path: &Path, dir: tempfile::TempDir, options: &HostOptions) -> Result<Self> {
        let mut host = Self::spawn(path, dir, options)?;
        host.wait_for_log(SUBSCRIBED, options.consumers, options.start_within)?;
        Ok(host)
    }

    /// Runs `acemq-host run --config PATH` expecting it to refuse to start:
    /// returns its exit status and log once it exits. A host still running
    /// after `timeout` is an error (and is killed).
    pub fn run_refused(
        path: &Path,
        dir: tempfile::TempDir,
        options: &HostOptions,
        timeout: Duration,
    ) -> Result<(ExitStatus, String)> {
        let (status, log) = Self::spawn(path, dir, options)?
            .wait_with_log(timeout)
            .context("acemq-host was expected to refuse to start")?;
        Ok((status, log.join("\n")))
    }

    /// [`run_refused`](Self::run_refused) with the default options, a
    /// fresh working folder and 30 s to exit: a config the host must refuse
    /// at start (exit status, log).
    pub fn refuses(path: &Path) -> Result<(ExitStatus, String)> {
        let options = HostOptions {
            consumers: 0,
            ..HostOptions::default()
        };
        Self::run_refused(
            path,
            tempfile::tempdir()?,
            &options,
            Duration::from_secs(30),
        )
    }

    fn spawn(path: &Path, dir: tempfile::TempDir, options: &HostOptions) -> Result<Self> {
        let mut command = Command::new(options.binary.clone().unwrap_or_else(host_binary));
        command
            .args(["run", "--config"])
            .arg(path)
            .env_remove("RUST_LOG")
            .env_remove("ACEMQ_URL")
            .env_remove(TOKEN_ENV)
            .env_remove(LOG_FORMAT_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(filter) = &options.rust_log {
            command.env("RUST_LOG", filter);
        }
        if let Some(url) = &options.url {
            command.env("ACEMQ_URL", url);
        }
        if let Some(token) = &options.admin_token {
            command.env(TOKEN_ENV, token);
        }
        if let Some(format) = &options.log_format {
            command.env(LOG_FORMAT_ENV, format);
        }
        command.envs(options.env.iter().map(|(name, value)| (name, value)));
        let mut child = command.spawn().context("cannot start acemq-host")?;
        let log = Arc::new(Mutex::new(Vec::new()));
        // Both streams, so a test that reads the log reads all the host said.
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        collect_lines(stdout, log.clone(), options.echo.clone());
        collect_lines(stderr, log.clone(), options.echo.clone());
        Ok(Self {
            child,
            log,
            _dir: dir,
        })
    }

    /// Waits until `needle` appeared on `count` lines of the host's log.
    pub fn wait_for_log(&mut self, needle: &str, count: usize, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self
                .log_lines()
                .iter()
                .filter(|l| l.contains(needle))
                .count()
                >= count
            {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "acemq-host exited ({status}) before logging {needle:?}:\n{}",
                    self.log_text()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "acemq-host did not log {needle:?} within {timeout:?}:\n{}",
                    self.log_text()
                );
            }
            // Fine enough for the benches that time a log line.
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The host's exit status if it has exited, `None` while it runs;
    /// does not wait. A benchmark checks with it that the host stayed up.
    pub fn exited(&mut self) -> Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// The host's process id (for its `/proc` entry).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().expect("log poisoned").clone()
    }

    pub fn log_text(&self) -> String {
        self.log_lines().join("\n")
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn terminate(self, timeout: Duration) -> Result<ExitStatus> {
        self.terminate_with_log(timeout).map(|(status, _)| status)
    }

    /// Like [`terminate`](Self::terminate), and returns everything the host
    /// logged, for tests that examine what it said.
    pub fn terminate_with_log(self, timeout: Duration) -> Result<(ExitStatus, Vec<String>)> {
        let pid = libc::pid_t::try_from(self.child.id())?;
        // SAFETY: plain kill(2) on our own child's pid.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            bail!(
                "cannot signal acemq-host: {}",
                std::io::Error::last_os_error()
            );
        }
        self.wait_with_log(timeout).context("after SIGTERM")
    }

    /// Waits for the host to exit by itself and returns everything it logged.
    pub fn wait_with_log(mut self, timeout: Duration) -> Result<(ExitStatus, Vec<String>)> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                // Give the reader threads a moment to collect the last lines.
                std::thread::sleep(Duration::from_millis(50));
                return Ok((status, self.log_lines()));
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                bail!(
                    "acemq-host did not exit within {timeout:?}:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Appends each line of `stream` to `log` as it arrives (echoed after
/// `echo`, when set), on a thread of its own.
fn collect_lines(
    stream: impl std::io::Read + Send + 'static,
    log: Arc<Mutex<Vec<String>>>,
    echo: Option<String>,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if let Some(prefix) = &echo {
                println!("{prefix}{line}");
            }
            log.lock().expect("log poisoned").push(line);
        }
    });
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The host running inside the test process, for access to its metrics.
pub struct InProcessHost {
    pub metrics: Arc<Metrics>,
    board: Arc<Board>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<()>>,
    /// Its state in the watchdog's reports while it lives.
    _reported: crate::watchdog::Reporter,
}

/// The series of a host's metrics that say where its deliveries are.
const STATE_SERIES: &[&str] = &[
    "acemq_consume_in_flight",
    "acemq_consume_oldest_unacked_seconds",
    "acemq_consume_total",
    "acemq_publish_unconfirmed",
    "acemq_connection_up",
    "acemq_connection_blocked{",
    "acemq_connection_recoveries_total",
];

/// What an in-process host is doing: each queue's reading (its own board)
/// and the series of [`STATE_SERIES`], for the report of a wait that does
/// not end.
fn state_of(metrics: &Metrics, board: &Board) -> String {
    let mut out = String::new();
    for (queue, reading) in board.snapshot() {
        out.push_str(&format!("queue {queue}: {reading:?}\n"));
    }
    for line in metrics.render().lines() {
        if STATE_SERIES.iter().any(|series| line.starts_with(series)) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

impl InProcessHost {
    /// Prepares (config, topology, plugins) and starts the host on the
    /// current tokio runtime; returns once its topology is applied and its
    /// consumers are subscribed.
    pub async fn start(config: &str) -> Result<Self> {
        let _step = crate::watchdog::step("starting an in-process host");
        log_when_asked();
        let loaded = LoadedConfig::parse(Path::new("test-host.toml"), config.to_string())
            .map_err(|e| anyhow!("{e}"))?;
        let metrics = Arc::new(Metrics::new());
        let registry = metrics.clone();
        let preparing = crate::watchdog::step("an in-process host preparing (config, plugins)");
        let prepared =
            tokio::task::spawn_blocking(move || app::prepare(loaded, &registry)).await??;
        drop(preparing);
        let board = prepared.board.clone();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(app::run(prepared, shutdown.clone(), metrics.clone()));
        let reported = {
            let (metrics, board) = (metrics.clone(), board.clone());
            crate::watchdog::reporter("an in-process host", move || state_of(&metrics, &board))
        };
        let host = Self {
            metrics,
            board,
            shutdown,
            task,
            _reported: reported,
        };
        let _subscribing = crate::watchdog::step("an in-process host subscribing to its queues");
        host.wait_until_consuming().await?;
        Ok(host)
    }

    /// What the host is doing now (see [`state_of`]): for a test's own
    /// failure message.
    pub fn state(&self) -> String {
        state_of(&self.metrics, &self.board)
    }

    /// Waits until every consumer holds its subscription, as the host's own
    /// board says (exact, unlike the broker's sampled consumer counts).
    async fn wait_until_consuming(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.task.is_finished() {
                bail!("the host stopped before it consumed from every queue");
            }
            let waiting: Vec<String> = self
                .board
                .snapshot()
                .into_iter()
                .filter(|(_, reading)| *reading != Reading::Consuming)
                .map(|(queue, _)| queue)
                .collect();
            if waiting.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the host did not start consuming from {} within 30 s; its state:\n{}",
                    waiting.join(", "),
                    self.state()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the host as a signal would, and returns what its run
    /// returned; a host that has not stopped after 60 s is an error that
    /// says what it was doing.
    pub async fn stop(mut self) -> Result<()> {
        let _step = crate::watchdog::step("stopping an in-process host");
        self.shutdown.cancel();
        match tokio::time::timeout(Duration::from_secs(60), &mut self.task).await {
            Ok(joined) => joined?,
            Err(_) => bail!(
                "the host did not stop within 60 s of its shutdown; its state:\n{}",
                self.state()
            ),
        }
    }
}

/// With `ACEMQ_TEST_LOG` set (a filter such as `info` or
/// `acemq_host=debug`), in-process hosts log to stderr (shown for a failing
/// test, or with `--nocapture`): what a stop that does not end was doing.
fn log_when_asked() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Ok(filter) = std::env::var("ACEMQ_TEST_LOG")
            && !filter.trim().is_empty()
        {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .try_init();
        }
    });
}

/// A TCP port free on loopback right now (for an admin endpoint or a proxy).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("a bound address").port()
}

/// The sum of every sample of the metric `name` (as exposed, e.g.
/// `acemq_publish_total`) in the Prometheus text `exposition` of `GET
/// /metrics` whose labels include each of `labels`; 0 when none match.
/// Label values are compared as written, so they must need no escaping
/// (queue and exchange names made by [`crate::unique_name`] do not).
pub fn metric_sum(exposition: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    exposition
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            // `{labels} value`, or ` value` for a metric without labels;
            // anything else is another metric whose name starts with `name`.
            let (set, value) = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            let pairs: Vec<&str> = set.split(',').collect();
            labels
                .iter()
                .all(|(key, wanted)| pairs.contains(&format!("{key}=\"{wanted}\"").as_str()))
                .then(|| value.split_whitespace().next()?.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// `GET url` without credentials (the admin endpoint's reads are open when
/// no token is configured): status and body. Blocking, for a few
/// milliseconds on loopback; from async code call it inside
/// `tokio::task::block_in_place`.
pub fn http_get(url: &str) -> Result<(u16, String)> {
    let agent = ureq::Agent::config_builder()
        .proxy(None)
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .new_agent();
    let mut response = agent
        .get(url)
        .call()
        .with_context(|| format!("GET {url}"))?;
    let status = response.status().as_u16();
    Ok((status, response.body_mut().read_to_string()?))
}

#[cfg(test)]
mod tests {
    use super::metric_sum;

    #[test]
    fn metric_sum_adds_the_matching_samples_of_one_metric() {
        let exposition = "\
# TYPE acemq_publish counter
acemq_publish_total{exchange=\"x\",routing_key=\"a\",outcome=\"refused\"} 2
acemq_publish_total{exchange=\"x\",routing_key=\"b\",outcome=\"refused\"} 3
acemq_publish_total{exchange=\"x\",routing_key=\"a\",outcome=\"confirmed\"} 40
acemq_publish_totally{outcome=\"refused\"} 100
acemq_publish_unconfirmed 7
# EOF";
        let refused = [("outcome", "refused")];
        assert_eq!(metric_sum(exposition, "acemq_publish_total", &refused), 5.0);
        assert_eq!(
            metric_sum(
                exposition,
                "acemq_publish_total",
                &[("routing_key", "a"), ("outcome", "confirmed")]
            ),
            40.0
        );
        assert_eq!(
            metric_sum(exposition, "acemq_publish_unconfirmed", &[]),
            7.0
        );
        assert_eq!(metric_sum(exposition, "acemq_consume_total", &refused), 0.0);
    }
}
