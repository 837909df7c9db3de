//! Throwaway Redis servers for the state store's tests.
//!
//! [`RedisServer::start`] runs Debian's `/usr/bin/redis-server` (7.0 on
//! Debian 12) as a plain child process on a free loopback port, in a fresh
//! temporary directory, with no persistence (`--save "" --appendonly no`),
//! so tests never depend on or disturb another Redis on the machine (a
//! packaged service, a colleague's test run). It is killed when dropped,
//! and with this process (parent-death signal) if that dies first.
//! [`shared_redis`] gives every test of one test binary the same server;
//! tests share it by using namespaces and queues of their own
//! ([`crate::unique_name`]). [`RedisServer::start_tls`] runs one that
//! speaks only TLS (`rediss://`), with the test's own certificates.
//!
//! Environment:
//! - `ACEMQ_TEST_REDIS_URL`: [`shared_redis`] uses that Redis and starts
//!   nothing.
//! - `ACEMQ_REDIS_SERVER`: the `redis-server` to run (default
//!   `/usr/bin/redis-server`, installed by `scripts/ensure-redis.sh` when
//!   missing).

use anyhow::{Context, Result, anyhow, bail};
use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock, mpsc};
use std::thread;
use std::time::{Duration, Instant};

const DEFAULT_SERVER: &str = "/usr/bin/redis-server";

/// Port races (another process taking the port between our probe and the
/// server binding it) are the only start failures worth retrying.
const START_ATTEMPTS: u32 = 3;

/// How long a server may take to answer its first PING.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A Redis the tests talk to: a throwaway server this process started, or
/// an external one (`ACEMQ_TEST_REDIS_URL`).
pub struct RedisServer {
    url: String,
    port: u16,
    password: Option<String>,
    /// A TLS-only server's files.
    tls: Option<ServerTls>,
    /// `None` for an external server.
    dir: Option<tempfile::TempDir>,
    /// `None` for an external server and while killed.
    child: Mutex<Option<Child>>,
}

impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("dir", &self.dir.as_ref().map(|d| d.path().to_owned()))
            .finish_non_exhaustive()
    }
}

/// What a TLS-only server ([`RedisServer::start_tls`]) is started with:
/// PEM files, and whether clients need a certificate.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The server's certificate (`tls-cert-file`): it must name
    /// 127.0.0.1, the address clients reach it by.
    pub cert_file: PathBuf,
    /// Its key (`tls-key-file`).
    pub key_file: PathBuf,
    /// The CA(s) client certificates are checked against
    /// (`tls-ca-cert-file`; Redis needs one even when it asks for none).
    pub ca_file: PathBuf,
    /// `tls-auth-clients yes`: a client without a certificate the CA signed
    /// is refused (`no`: none is asked for).
    pub auth_clients: bool,
    /// `requirepass`, when set.
    pub password: Option<String>,
}

impl RedisServer {
    /// Starts a throwaway server and waits until it answers PING.
    /// Installs Redis first (`scripts/ensure-redis.sh`) if the server is
    /// missing.
    pub fn start() -> Result<RedisServer> {
        Self::start_inner(None, None)
    }

    /// Like [`RedisServer::start`], with `requirepass` set: clients must
    /// send `password` (`redis://:password@...`).
    pub fn start_with_password(password: &str) -> Result<RedisServer> {
        Self::start_inner(Some(password.to_owned()), None)
    }

    /// Like [`RedisServer::start`], speaking only TLS (`--port 0
    /// --tls-port P`): its URL is `rediss://127.0.0.1:P/0` (with
    /// `:password@` when `tls` has one). Ready once it listens and its log
    /// says so (a plain PING cannot reach it).
    pub fn start_tls(tls: ServerTls) -> Result<RedisServer> {
        Self::start_inner(tls.password.clone(), Some(tls))
    }

    /// Uses an already running Redis; starts and stops nothing.
    pub fn external(url: &str) -> RedisServer {
        RedisServer {
            url: url.to_owned(),
            port: 0,
            password: None,
            tls: None,
            dir: None,
            child: Mutex::new(None),
        }
    }

    fn start_inner(password: Option<String>, tls: Option<ServerTls>) -> Result<RedisServer> {
        let server = server_path();
        ensure_installed(&server)?;
        let started = Instant::now();
        let mut last_error = None;
        for attempt in 1..=START_ATTEMPTS {
            let dir = tempfile::Builder::new()
                .prefix("acemq-redis-")
                .tempdir()
                .context("creating the Redis server's directory")?;
            let port = free_port().context("picking a free port")?;
            let child = spawn(&server, dir.path(), port, password.as_deref(), tls.as_ref())?;
            let redis = RedisServer {
                url: url_of(port, password.as_deref(), tls.is_some()),
                port,
                password: password.clone(),
                tls: tls.clone(),
                dir: Some(dir),
                child: Mutex::new(Some(child)),
            };
            match redis.wait_until_ready(0) {
                Ok(()) => {
                    eprintln!(
                        "acemq-tests: redis-server ready in {:.2} s (127.0.0.1:{port}, dir {})",
                        started.elapsed().as_secs_f64(),
                        redis.dir().display()
                    );
                    return Ok(redis);
                }
                Err(error) => {
                    let log = redis.log_tail(40);
                    // Dropping `redis` kills the server.
                    if log.contains("Address already in use") && attempt < START_ATTEMPTS {
                        eprintln!(
                            "acemq-tests: redis-server start attempt {attempt} hit a taken port, \
                             retrying"
                        );
                        last_error = Some(error);
                        continue;
                    }
                    return Err(error.context(format!(
                        "redis-server on 127.0.0.1:{port} did not start\n--- log ---\n{log}"
                    )));
                }
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow!("redis-server did not start")))
    }

    /// `redis://127.0.0.1:{port}/0` (`rediss://` for a TLS server; with
    /// `:password@` when it has one).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The same server with `password` in the URL instead of its own.
    pub fn url_with_password(&self, password: &str) -> String {
        url_of(self.port, Some(password), self.tls.is_some())
    }

    /// The server's port (0 for an external server).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// SIGKILLs the server: its connections end at once, and its data is
    /// gone (nothing is persisted). A no-op for an external server or one
    /// already killed. [`RedisServer::restart`] starts it again.
    pub fn kill(&self) {
        if let Some(mut child) = self.lock_child().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed server again on the same port, empty.
    pub fn restart(&self) -> Result<()> {
        let Some(dir) = &self.dir else {
            bail!("an external Redis cannot be restarted");
        };
        // A TLS server's readiness is read from its log: only from here on.
        let log_from = std::fs::metadata(dir.path().join("redis.log")).map_or(0, |m| m.len());
        {
            let mut child = self.lock_child();
            if child.is_some() {
                bail!("redis-server on 127.0.0.1:{} is still running", self.port);
            }
            *child = Some(spawn(
                &server_path(),
                dir.path(),
                self.port,
                self.password.as_deref(),
                self.tls.as_ref(),
            )?);
        }
        self.wait_until_ready(log_from).with_context(|| {
            format!(
                "redis-server on 127.0.0.1:{} did not start again\n--- log ---\n{}",
                self.port,
                self.log_tail(40)
            )
        })
    }

    fn dir(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new("."), |d| d.path())
    }

    fn lock_child(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until the server answers PING (or, with a password, asks for
    /// it), or fails when it exited or took too long. A TLS server: until
    /// its log past `log_from` says it is ready and its port takes a
    /// connection.
    fn wait_until_ready(&self, log_from: u64) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.lock_child().as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("redis-server exited ({status})");
            }
            let answered = if self.tls.is_some() {
                self.listening_with_tls(log_from)
            } else {
                ping(self.port)
            };
            match answered {
                Ok(()) => return Ok(()),
                Err(error) if Instant::now() >= deadline => {
                    return Err(anyhow!(error).context(format!(
                        "redis-server did not answer PING within {READY_TIMEOUT:?}"
                    )));
                }
                Err(_) => thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Whether the log (past `log_from`) says the server is ready, and its
    /// port takes a connection (closed at once, before any handshake).
    fn listening_with_tls(&self, log_from: u64) -> io::Result<()> {
        let log = std::fs::read(self.dir().join("redis.log"))?;
        let since = log.get(log_from as usize..).unwrap_or_default();
        if !String::from_utf8_lossy(since).contains("Ready to accept connections") {
            return Err(io::Error::other("not ready yet (log)"));
        }
        TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).map(drop)
    }

    fn log_tail(&self, lines: usize) -> String {
        let path = self.dir().join("redis.log");
        match std::fs::read(&path) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let all: Vec<&str> = text.lines().collect();
                all[all.len().saturating_sub(lines)..].join("\n")
            }
            Err(error) => format!("({}: {error})", path.display()),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The Redis shared by every test in this test binary, started on first
/// use and killed when the process exits (`atexit`, or the parent-death
/// signal if the process is killed). With `ACEMQ_TEST_REDIS_URL` set it is
/// that external Redis.
///
/// Panics if the server cannot be started; every later call panics with
/// the same error rather than trying again.
pub fn shared_redis() -> &'static RedisServer {
    static SHARED: OnceLock<Result<RedisServer, String>> = OnceLock::new();

    extern "C" fn kill_shared_redis() {
        // Unwinding out of an extern "C" fn aborts; a failed kill must not.
        let _ = std::panic::catch_unwind(|| {
            if let Some(Ok(redis)) = SHARED.get() {
                redis.kill();
                // A static is never dropped, so neither is its TempDir.
                if let Some(dir) = &redis.dir {
                    let _ = std::fs::remove_dir_all(dir.path());
                }
            }
        });
    }

    let shared = SHARED.get_or_init(|| {
        if let Some(url) = std::env::var("ACEMQ_TEST_REDIS_URL")
            .ok()
            .filter(|u| !u.is_empty())
        {
            return Ok(RedisServer::external(&url));
        }
        let redis = RedisServer::start().map_err(|e| format!("{e:#}"))?;
        // SAFETY: registers a plain function with no preconditions; it
        // only reads a static that outlives every caller.
        if unsafe { libc::atexit(kill_shared_redis) } != 0 {
            eprintln!("acemq-tests: atexit failed; the shared Redis stops only on process death");
        }
        Ok(redis)
    });
    match shared {
        Ok(redis) => redis,
        Err(error) => panic!("acemq-tests: no shared Redis: {error}"),
    }
}

fn url_of(port: u16, password: Option<&str>, tls: bool) -> String {
    let scheme = if tls { "rediss" } else { "redis" };
    match password {
        Some(password) => format!("{scheme}://:{password}@127.0.0.1:{port}/0"),
        None => format!("{scheme}://127.0.0.1:{port}/0"),
    }
}

fn server_path() -> PathBuf {
    std::env::var_os("ACEMQ_REDIS_SERVER")
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SERVER))
}

/// Asks the kernel for a free loopback port. Another process can take it
/// before the server binds it; the caller retries then.
fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// One PING in the Redis protocol; a server that wants a password first
/// (`-NOAUTH`) is up too.
fn ping(port: u16) -> io::Result<()> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(b"PING\r\n")?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    if line.starts_with("+PONG") || line.starts_with("-NOAUTH") {
        Ok(())
    } else {
        Err(io::Error::other(format!("PING answered {line:?}")))
    }
}

fn spawn(
    server: &Path,
    dir: &Path,
    port: u16,
    password: Option<&str>,
    tls: Option<&ServerTls>,
) -> Result<Child> {
    let mut cmd = Command::new(server);
    cmd.current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    match tls {
        None => {
            cmd.arg("--port").arg(port.to_string());
        }
        Some(tls) => {
            cmd.args(["--port", "0", "--tls-port"])
                .arg(port.to_string())
                .arg("--tls-cert-file")
                .arg(&tls.cert_file)
                .arg("--tls-key-file")
                .arg(&tls.key_file)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca_file)
                .arg("--tls-auth-clients")
                .arg(if tls.auth_clients { "yes" } else { "no" });
        }
    }
    cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--daemonize", "no", "--protected-mode", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"));
    if let Some(password) = password {
        cmd.arg("--requirepass").arg(password);
    }
    spawn_tied_to_process(cmd).with_context(|| format!("spawning {}", server.display()))
}

/// Spawns `cmd` so that it gets SIGKILL when this process dies (Linux's
/// parent-death signal), however the process ends.
///
/// Linux sends the parent-death signal when the *thread* that forked the
/// child exits, so the spawn happens on a dedicated thread that lives as
/// long as the process, not on a test thread that ends with its test.
fn spawn_tied_to_process(mut cmd: Command) -> io::Result<Child> {
    type Request = (Command, mpsc::Sender<io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();

    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt as _;
        let parent = libc::pid_t::try_from(std::process::id()).map_err(io::Error::other)?;
        // SAFETY: the closure runs between fork and exec and only makes
        // async-signal-safe syscalls; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // If we died between fork and prctl no signal will come.
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }

    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        thread::Builder::new()
            .name("acemq-redis-spawner".into())
            .spawn(move || {
                // Never ends: the sender lives in a static.
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("starting the Redis spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply_tx))
        .map_err(|_| io::Error::other("the Redis spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("the Redis spawner thread is gone"))?
}

/// Runs `scripts/ensure-redis.sh` when the server is missing from the
/// default location; a custom `ACEMQ_REDIS_SERVER` is never installed.
fn ensure_installed(server: &Path) -> Result<()> {
    // One installer at a time: concurrent apt-get runs fail on apt's lock.
    static INSTALL: Mutex<()> = Mutex::new(());
    let _guard = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if server.exists() {
        return Ok(());
    }
    if server != Path::new(DEFAULT_SERVER) {
        bail!(
            "{} does not exist (ACEMQ_REDIS_SERVER={})",
            server.display(),
            server.display()
        );
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ensure-redis.sh");
    eprintln!(
        "acemq-tests: {} missing; running {}",
        server.display(),
        script.display()
    );
    let output = Command::new("sh")
        .arg(&script)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprint!("{stdout}{stderr}");
    if !output.status.success() || !server.exists() {
        bail!(
            "{} failed ({}); Redis is not installed\n{stdout}{stderr}",
            script.display(),
            output.status
        );
    }
    Ok(())
}
