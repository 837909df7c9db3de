//! The node's OS process: files, ports, start, readiness, stop, CLI calls.

use anyhow::{Context, Result, anyhow, bail};
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{OnceLock, mpsc};
use std::thread;
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// Overall budget for boot. `rabbitmqctl wait --timeout 60` applies its
/// timeout per stage (pid file, distribution, applications), so it needs an
/// outer bound; a cold boot on a busy 2-core machine takes 5-15 s.
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// `rabbitmqctl stop` returns once the node has stopped its applications:
/// about 6 s normally.
pub(super) const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// After `rabbitmqctl stop` returned, the VM still halts (about 1 s).
pub(super) const EXIT_GRACE: Duration = Duration::from_secs(15);
pub(super) const POLL: Duration = Duration::from_millis(50);
/// The CLI tools' own distribution listeners (`RABBITMQ_CTL_DIST_PORT_MIN`
/// default, +10). The node must not take one, or CLI calls could fail.
const CLI_DIST_PORTS: std::ops::RangeInclusive<u16> = 35672..=35682;
/// epmd's port: shared by every Erlang node on the machine.
const EPMD_PORT: u16 = 4369;
const LOG_TAIL_LINES: usize = 60;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    pub amqp: u16,
    pub mgmt: u16,
    pub dist: u16,
    /// The stream protocol's listener (the `rabbitmq_stream` plugin).
    pub stream: u16,
}

impl Ports {
    /// Asks the kernel for free loopback ports. All probe sockets stay open
    /// until all four are chosen, so they differ. Another process can
    /// still take one before the node binds it; the caller retries then.
    fn pick() -> io::Result<Ports> {
        let mut held = Vec::new();
        let mut ports = Vec::new();
        while ports.len() < 4 {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
            let port = listener.local_addr()?.port();
            // Unsuitable ports stay held too, so the kernel offers another.
            held.push(listener);
            if !CLI_DIST_PORTS.contains(&port) && port != EPMD_PORT {
                ports.push(port);
            }
        }
        Ok(Ports {
            amqp: ports[0],
            mgmt: ports[1],
            dist: ports[2],
            stream: ports[3],
        })
    }
}

/// Why a start failed, and whether trying again with other ports may help.
pub(super) struct StartFailure {
    pub error: anyhow::Error,
    pub port_in_use: bool,
}

impl From<anyhow::Error> for StartFailure {
    fn from(error: anyhow::Error) -> Self {
        StartFailure {
            error,
            port_in_use: false,
        }
    }
}

/// How long a node lives, and where.
#[derive(Debug, Clone)]
pub(super) enum Lifetime {
    /// A fresh temporary directory; the node gets SIGTERM when this process
    /// dies, however it dies: no test leaves a broker behind.
    Tied,
    /// This directory (created, and removed when the node stops); the node
    /// outlives this process, for `scripts/broker` and `scripts/demo --keep`.
    Kept(PathBuf),
}

/// The node's directory.
enum NodeDir {
    /// Deleted when dropped.
    Temp(TempDir),
    /// Deleted by [`NodeProcess::stop`] only.
    Kept(PathBuf),
}

impl NodeDir {
    fn path(&self) -> &Path {
        match self {
            NodeDir::Temp(dir) => dir.path(),
            NodeDir::Kept(dir) => dir,
        }
    }

    /// Keeps the directory for inspection; returns its path.
    fn keep(self) -> PathBuf {
        match self {
            NodeDir::Temp(dir) => dir.keep(),
            NodeDir::Kept(dir) => dir,
        }
    }
}

/// A running node: the `rabbitmq-server` start script (leader of its own
/// process group, which the beam VM shares) and the directory it lives in.
pub(super) struct NodeProcess {
    pub name: String,
    pub ports: Ports,
    /// The start script; it forwards SIGTERM to the VM as a clean shutdown.
    child: Child,
    pid_file: PathBuf,
    /// Dropped (deleted) only after the VM is gone.
    dir: NodeDir,
    env: Vec<(&'static str, OsString)>,
    lifetime: Lifetime,
}

impl NodeProcess {
    /// `may_retry`: the caller will try again if a port was taken, so the
    /// directory of a failed start need not be kept.
    pub(super) fn start(
        bin_dir: &Path,
        name: &str,
        may_retry: bool,
        extra_config: &str,
        lifetime: &Lifetime,
        cookie: &str,
    ) -> Result<NodeProcess, StartFailure> {
        let started = Instant::now();
        let dir = match lifetime {
            Lifetime::Tied => NodeDir::Temp(
                tempfile::Builder::new()
                    .prefix("acemq-rabbitmq-")
                    .tempdir()
                    .context("creating the node directory")?,
            ),
            Lifetime::Kept(dir) => {
                fs::create_dir_all(dir)
                    .with_context(|| format!("creating the node directory {}", dir.display()))?;
                NodeDir::Kept(dir.clone())
            }
        };
        let ports = Ports::pick().context("picking free ports")?;
        write_node_files(dir.path(), &ports, extra_config, cookie)
            .context("writing the node's config files")?;
        let env = node_env(dir.path(), name, &ports);
        let child = spawn_server(bin_dir, dir.path(), &env, lifetime)?;
        let mut node = NodeProcess {
            name: name.to_owned(),
            ports,
            child,
            pid_file: dir.path().join("node.pid"),
            dir,
            env,
            lifetime: lifetime.clone(),
        };
        let cli = Cli::for_node(bin_dir.to_owned(), &node);
        match node.wait_until_ready(&cli) {
            Ok(()) => {
                eprintln!(
                    "acemq-tests: RabbitMQ node {name} ready in {:.1} s (amqp 127.0.0.1:{}, \
                     management 127.0.0.1:{}, dist {}, dir {})",
                    started.elapsed().as_secs_f64(),
                    ports.amqp,
                    ports.mgmt,
                    ports.dist,
                    node.dir().display(),
                );
                Ok(node)
            }
            Err(error) => Err(node.fail(error, may_retry)),
        }
    }

    /// Starts the node again after it died (a test killed it): the same
    /// name, ports, folder and data, as a machine that rebooted. Fails if
    /// it still runs.
    pub(super) fn restart(&mut self, bin_dir: &Path) -> Result<()> {
        if self.child.try_wait()?.is_none() {
            bail!("node {} is still running", self.name);
        }
        let started = Instant::now();
        // The pid file of the dead VM would satisfy `rabbitmqctl wait` at once.
        let _ = fs::remove_file(&self.pid_file);
        self.child = spawn_server(bin_dir, self.dir.path(), &self.env, &self.lifetime)?;
        let cli = Cli::for_node(bin_dir.to_owned(), self);
        if let Err(error) = self.wait_until_ready(&cli) {
            self.kill();
            return Err(error.context(format!(
                "RabbitMQ node {} did not start again\n{}",
                self.name,
                self.log_tails()
            )));
        }
        eprintln!(
            "acemq-tests: RabbitMQ node {} started again in {:.1} s",
            self.name,
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Kills the node after a failed start and builds the error: log tails,
    /// and the directory kept for inspection (unless a retry follows).
    fn fail(mut self, error: anyhow::Error, may_retry: bool) -> StartFailure {
        self.kill();
        let logs = self.log_tails();
        let port_in_use = says_a_port_was_taken(&logs);
        let name = self.name.clone();
        let dir_note = if port_in_use && may_retry {
            // The retry makes a kept folder afresh (a temporary one is new anyway).
            if let NodeDir::Kept(dir) = &self.dir {
                let _ = fs::remove_dir_all(dir);
            }
            String::from("a port was taken; retrying on other ports")
        } else {
            format!("directory kept: {}", self.dir.keep().display())
        };
        StartFailure {
            error: anyhow!("RabbitMQ node {name} failed to start: {error:#}\n({dir_note})\n{logs}"),
            port_in_use,
        }
    }

    pub(super) fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub(super) fn log_file(&self) -> PathBuf {
        self.dir
            .path()
            .join("log")
            .join(format!("{}.log", self.name))
    }

    /// The start script's process id, which is also its process group's.
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lets go of the node without stopping it: dropping the child handle
    /// neither kills nor waits. A [`Lifetime::Kept`] node then runs on after
    /// this process (a tied one would still stop with it).
    pub(super) fn leave_running(self) {}

    /// Stops the node with `rabbitmqctl stop` and waits for the start script
    /// (which exits with the VM), kills the process group if that fails,
    /// then removes the directory.
    ///
    /// Takes ~7 s here, 5 of them a fixed wait inside RabbitMQ 3.10 when
    /// the management plugin shuts down. No PIDFILE argument: we own the
    /// process, and waiting on it directly beats the CLI's once-a-second
    /// polling of the pid file (~2 s saved).
    pub(super) fn stop(mut self, cli: &Cli) -> Result<()> {
        let started = Instant::now();
        if let Ok(Some(status)) = self.child.try_wait() {
            let logs = self.log_tails();
            self.kill();
            bail!(
                "RabbitMQ node {} had already exited ({status})\n{logs}",
                self.name
            );
        }
        let stopped = cli.run("rabbitmqctl", &["stop"], STOP_TIMEOUT);
        // The CLI can report an error when the node halts under its RPC; the
        // node's exit is what counts, and comes soon if the stop took.
        let grace = if stopped.is_ok() {
            EXIT_GRACE
        } else {
            Duration::from_secs(2)
        };
        if wait_for_exit(&mut self.child, grace) {
            self.remove_kept_dir();
            if verbose() {
                eprintln!(
                    "acemq-tests: RabbitMQ node {} stopped in {:.1} s",
                    self.name,
                    started.elapsed().as_secs_f64()
                );
            }
            return Ok(());
        }
        self.kill();
        self.remove_kept_dir();
        match stopped {
            Err(error) => Err(error.context(format!(
                "`rabbitmqctl stop` failed for node {}; killed it",
                self.name
            ))),
            Ok(_) => Err(anyhow!(
                "node {} still running {EXIT_GRACE:?} after `rabbitmqctl stop`; killed it",
                self.name
            )),
        }
    }

    /// A temporary directory goes when dropped; a kept one when the node stops.
    fn remove_kept_dir(&self) {
        if let NodeDir::Kept(dir) = &self.dir {
            let _ = fs::remove_dir_all(dir);
        }
    }

    /// Waits for `rabbitmqctl wait PIDFILE`, which succeeds once the pid file
    /// exists, the node is reachable and `rabbit` with its plugins runs.
    /// (`await_startup` right after the spawn fails at once: the node is not
    /// registered with epmd yet.) Fails fast if the server exits meanwhile.
    fn wait_until_ready(&mut self, cli: &Cli) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let pid_file = self.pid_file.to_string_lossy().into_owned();
        let mut wait =
            Captured::spawn(cli.command("rabbitmqctl", &["wait", &pid_file, "--timeout", "60"]))
                .context("spawning `rabbitmqctl wait`")?;
        loop {
            if let Some(status) = self.child.try_wait()? {
                wait.kill();
                bail!("rabbitmq-server exited ({status}) before the node was ready");
            }
            if let Some(status) = wait.child.try_wait()? {
                if status.success() {
                    return Ok(());
                }
                bail!("`rabbitmqctl wait` failed ({status}):\n{}", wait.output());
            }
            if Instant::now() >= deadline {
                wait.kill();
                bail!("node not ready after {READY_TIMEOUT:?}");
            }
            thread::sleep(POLL);
        }
    }

    /// SIGKILLs the start script's process group (script and VM) and reaps
    /// the script. The VM's helpers (erl_child_setup, inet_gethost) exit on
    /// their own when the VM is gone; epmd is shared and deliberately spared.
    pub(super) fn kill(&mut self) {
        if let Ok(pgid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: plain syscall; the group is the one we created at spawn.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
        let _ = self.child.wait();
    }

    fn log_tails(&self) -> String {
        let log = self.log_file();
        let out = self.dir.path().join("server.out");
        format!(
            "--- last {LOG_TAIL_LINES} lines of {} ---\n{}\n--- last {LOG_TAIL_LINES} lines of {} ---\n{}",
            log.display(),
            file_tail(&log, LOG_TAIL_LINES),
            out.display(),
            file_tail(&out, LOG_TAIL_LINES),
        )
    }
}

/// How to run the RabbitMQ CLI tools against one node.
pub(super) struct Cli {
    bin_dir: PathBuf,
    node: Option<String>,
    /// For our own nodes: the node's environment (above all HOME, which
    /// decides the Erlang cookie), replacing any RABBITMQ_* of the caller.
    /// `None` for an external broker: the caller's environment as is.
    env: Option<Vec<(&'static str, OsString)>>,
}

impl Cli {
    pub(super) fn for_node(bin_dir: PathBuf, node: &NodeProcess) -> Cli {
        Cli {
            bin_dir,
            node: Some(node.name.clone()),
            env: Some(node.env.clone()),
        }
    }

    /// For a node this process did not start but whose directory, name and
    /// ports it knows (a kept node, see `dev.rs`).
    pub(super) fn for_kept_node(bin_dir: PathBuf, dir: &Path, name: &str, ports: &Ports) -> Cli {
        Cli {
            bin_dir,
            node: Some(name.to_owned()),
            env: Some(node_env(dir, name, ports)),
        }
    }

    pub(super) fn external(bin_dir: PathBuf, node: Option<String>) -> Cli {
        Cli {
            bin_dir,
            node,
            env: None,
        }
    }

    pub(super) fn command(&self, tool: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.bin_dir.join(tool));
        if let Some(env) = &self.env {
            apply_env(&mut cmd, env);
        }
        if let Some(node) = &self.node {
            cmd.arg("-n").arg(node);
        }
        cmd.args(args).stdin(Stdio::null());
        cmd
    }

    /// Runs a tool to completion (killed after `timeout`); its stdout on
    /// success, an error with stdout and stderr otherwise.
    pub(super) fn run(&self, tool: &str, args: &[&str], timeout: Duration) -> Result<String> {
        let what = format!("{tool} {}", args.join(" "));
        let mut run = Captured::spawn(self.command(tool, args))
            .with_context(|| format!("spawning `{what}`"))?;
        let Some(status) = run.wait(timeout)? else {
            bail!(
                "`{what}` did not finish within {timeout:?}:\n{}",
                run.output()
            );
        };
        if !status.success() {
            bail!("`{what}` failed ({status}):\n{}", run.output());
        }
        Ok(run.stdout())
    }
}

/// A child whose stdout and stderr go to anonymous temporary files: no pipe
/// can fill up and block it, and no reader threads are needed.
struct Captured {
    child: Child,
    stdout: File,
    stderr: File,
}

impl Captured {
    fn spawn(mut cmd: Command) -> io::Result<Captured> {
        let stdout = tempfile::tempfile()?;
        let stderr = tempfile::tempfile()?;
        cmd.stdout(stdout.try_clone()?).stderr(stderr.try_clone()?);
        Ok(Captured {
            // A CLI call has nothing to clean up, but `rabbitmqctl wait`
            // would otherwise linger for its full timeout after we die.
            child: spawn_tied_to_process(cmd, libc::SIGKILL)?,
            stdout,
            stderr,
        })
    }

    /// `Some(status)` once exited; `None` (after killing it) on timeout.
    fn wait(&mut self, timeout: Duration) -> io::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                self.kill();
                return Ok(None);
            }
            thread::sleep(POLL);
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stdout(&mut self) -> String {
        read_from_start(&mut self.stdout)
    }

    /// stdout and stderr together, for error messages.
    fn output(&mut self) -> String {
        let stdout = read_from_start(&mut self.stdout);
        let stderr = read_from_start(&mut self.stderr);
        format!("{stdout}{stderr}").trim_end().to_owned()
    }
}

/// Reads a capture file from its start. Only valid once the child has
/// exited: the child's descriptor shares this one's file offset.
fn read_from_start(file: &mut File) -> String {
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(0)).is_ok() {
        let _ = file.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn wait_for_exit(child: &mut Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return true,
            Err(_) => return false,
            Ok(None) if Instant::now() >= deadline => return false,
            Ok(None) => thread::sleep(POLL),
        }
    }
}

/// Spawns `rabbitmq-server` in `dir` with `env`, its output to
/// `server.out` (appended: a restarted node keeps its first run's).
fn spawn_server(
    bin_dir: &Path,
    dir: &Path,
    env: &[(&'static str, OsString)],
    lifetime: &Lifetime,
) -> Result<Child> {
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("server.out"))
        .context("opening server.out")?;
    let mut cmd = Command::new(bin_dir.join("rabbitmq-server"));
    cmd.current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone().context("duplicating server.out")?)
        .stderr(out)
        // Its own process group: a Ctrl-C on the terminal reaches the
        // test process, whose death then stops the node (parent-death
        // signal) cleanly; and leftovers can be killed as one group.
        .process_group(0);
    apply_env(&mut cmd, env);
    match lifetime {
        Lifetime::Tied => spawn_tied_to_process(cmd, libc::SIGTERM),
        Lifetime::Kept(_) => cmd.spawn(),
    }
    .with_context(|| format!("spawning {}", bin_dir.join("rabbitmq-server").display()))
}

/// A fresh Erlang cookie: nodes (and CLI calls) that share it may talk to
/// each other, so the nodes of one cluster get the same one.
pub(super) fn new_cookie() -> String {
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .map(|b| char::from(b'A' + b % 26))
        .collect()
}

/// The node's files: config, plugins, an empty env file, and the cookie.
fn write_node_files(dir: &Path, ports: &Ports, extra_config: &str, cookie: &str) -> io::Result<()> {
    for sub in ["mnesia", "log", "home"] {
        fs::create_dir(dir.join(sub))?;
    }
    fs::write(
        dir.join("rabbitmq.conf"),
        format!(
            "listeners.tcp.default = 127.0.0.1:{amqp}\n\
             management.tcp.ip = 127.0.0.1\n\
             management.tcp.port = {mgmt}\n\
             stream.listeners.tcp.1 = 127.0.0.1:{stream}\n\
             # What the broker tells stream clients to connect to (its\n\
             # metadata): the loopback listener, not the machine's name.\n\
             stream.advertised_host = 127.0.0.1\n\
             stream.advertised_port = {stream}\n\
             # guest may log in over non-loopback addresses too (a proxy in\n\
             # front of the node, the machine's own IP).\n\
             loopback_users = none\n\
             # Management stats every second instead of every 5 s, so\n\
             # assertions on consumers and connections settle sooner.\n\
             collect_statistics_interval = 1000\n\
             # The log file is enough; stdout (server.out) keeps boot errors.\n\
             log.console = false\n\
             {extra_config}\n",
            amqp = ports.amqp,
            mgmt = ports.mgmt,
            stream = ports.stream,
        ),
    )?;
    // The stream plugin: the host reads streams over the stream protocol
    // when the broker offers it (and over AMQP 0-9-1 otherwise).
    fs::write(
        dir.join("enabled_plugins"),
        "[rabbitmq_management,rabbitmq_stream].\n",
    )?;
    // Empty, so /etc/rabbitmq/rabbitmq-env.conf of the machine is not read.
    fs::write(dir.join("rabbitmq-env.conf"), "")?;
    // Written up front: otherwise the server and the first CLI call race to
    // create ~/.erlang.cookie with different random values. Erlang insists
    // on owner-only permissions.
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(dir.join("home").join(".erlang.cookie"))?
        .write_all(cookie.as_bytes())
}

/// Environment shared by the server and the CLI calls against it.
fn node_env(dir: &Path, name: &str, ports: &Ports) -> Vec<(&'static str, OsString)> {
    let path = |p: &str| dir.join(p).into_os_string();
    vec![
        // Decides which .erlang.cookie is used: must be the same for both.
        ("HOME", path("home")),
        ("RABBITMQ_NODENAME", name.into()),
        ("RABBITMQ_NODE_PORT", ports.amqp.to_string().into()),
        ("RABBITMQ_DIST_PORT", ports.dist.to_string().into()),
        ("RABBITMQ_MNESIA_BASE", path("mnesia")),
        ("RABBITMQ_LOG_BASE", path("log")),
        ("RABBITMQ_CONFIG_FILE", path("rabbitmq.conf")),
        // Does not exist; keeps /etc/rabbitmq/advanced.config out.
        ("RABBITMQ_ADVANCED_CONFIG_FILE", path("advanced.config")),
        ("RABBITMQ_ENABLED_PLUGINS_FILE", path("enabled_plugins")),
        ("RABBITMQ_CONF_ENV_FILE", path("rabbitmq-env.conf")),
        ("RABBITMQ_PID_FILE", path("node.pid")),
        // The distribution port binds 0.0.0.0 unless told otherwise.
        (
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
            "-kernel inet_dist_use_interface {127,0,0,1}".into(),
        ),
        // If no epmd runs yet, the one this node starts listens on loopback only.
        ("ERL_EPMD_ADDRESS", "127.0.0.1".into()),
        ("ERL_CRASH_DUMP", path("erl_crash.dump")),
    ]
}

/// Sets `env` and drops every other RABBITMQ_* variable of the caller, so a
/// developer's RabbitMQ settings cannot leak into the throwaway node.
fn apply_env(cmd: &mut Command, env: &[(&'static str, OsString)]) {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("RABBITMQ_") {
            cmd.env_remove(key);
        }
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
}

/// Spawns `cmd` so that it gets `signal` when this process dies, however it
/// dies (panic=abort, SIGKILL from a CI timeout, Ctrl-C). The node's start
/// script turns SIGTERM into a clean shutdown, so no broker outlives its
/// tests.
///
/// Linux sends the parent-death signal when the *thread* that forked the
/// child exits, so the spawn happens on a dedicated thread that lives as long
/// as the process, not on a test thread that ends with its test.
fn spawn_tied_to_process(mut cmd: Command, signal: libc::c_int) -> io::Result<Child> {
    type Request = (Command, mpsc::Sender<io::Result<Child>>);
    static SPAWNER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();

    #[cfg(target_os = "linux")]
    {
        let parent = libc::pid_t::try_from(std::process::id()).map_err(io::Error::other)?;
        // SAFETY: the closure runs between fork and exec and only makes
        // async-signal-safe syscalls; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, signal) != 0 {
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

    #[cfg(not(target_os = "linux"))]
    let _ = signal; // no parent-death signal outside Linux

    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        thread::Builder::new()
            .name("acemq-broker-spawner".into())
            .spawn(move || {
                // Never ends: the sender lives in a static.
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("starting the broker spawner thread");
        tx
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .send((cmd, reply_tx))
        .map_err(|_| io::Error::other("broker spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("broker spawner thread is gone"))?
}

/// Last `lines` lines of a (log) file, or a note why there are none.
pub(super) fn file_tail(path: &Path, lines: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(error) => format!("({}: {error})", path.display()),
    }
}

/// `ACEMQ_TEST_VERBOSE=1` reports stops too (starts are always reported;
/// the test harness shows that output only for failing tests).
fn verbose() -> bool {
    std::env::var_os("ACEMQ_TEST_VERBOSE").is_some_and(|v| !v.is_empty() && v != "0")
}

/// What a node's logs say when a port chosen for it was taken meanwhile:
/// a listener's `eaddrinuse`, or the distribution port's own wording
/// (`dist_port_already_used`, seen when test binaries started nodes at the
/// same moment).
const PORT_TAKEN_MARKS: &[&str] = &["eaddrinuse", "dist_port_already_used"];

/// Whether a failed start's `logs` show a taken port: the one failure a
/// start on other ports mends.
fn says_a_port_was_taken(logs: &str) -> bool {
    PORT_TAKEN_MARKS.iter().any(|mark| logs.contains(mark))
}

#[cfg(test)]
mod port_taken_tests {
    use super::says_a_port_was_taken;

    #[test]
    fn a_taken_listener_or_distribution_port_is_told_apart_from_other_failures() {
        assert!(says_a_port_was_taken(
            "{failed_to_start_child,{ranch_listener_sup,{acceptor,{127,0,0,1},5672}},eaddrinuse}"
        ));
        assert!(says_a_port_was_taken(
            "reason: {dist_port_already_used,36551,not_erlang,\"localhost\"}"
        ));
        assert!(!says_a_port_was_taken(
            "ERROR: epmd error for host localhost: timeout (timed out)"
        ));
    }
}
