//! A throwaway RabbitMQ that outlives the command that started it, for
//! trying plugins and configs by hand: `scripts/broker start|stop|url` and
//! `scripts/demo --keep`.
//!
//! The very node the tests start (`process.rs`: its own config, ports picked
//! at run time, loopback only, no service, no root), in a fixed folder
//! instead of a temporary one, and not stopped when the starting process
//! ends. The folder holds a state file (name, ports, process id, URLs), so a
//! later command finds the node, reaches it with `rabbitmqctl` (the folder's
//! Erlang cookie) and stops it; stopping removes the folder.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use super::process::{Cli, EXIT_GRACE, Lifetime, POLL, Ports, STOP_TIMEOUT, new_cookie};
use super::{Broker, bin_dir};

/// The state file in the node's folder.
const STATE_FILE: &str = "acemq-broker.state";

/// The folder of this user's kept broker: one per user and machine.
pub fn default_dir() -> PathBuf {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    std::env::temp_dir().join(format!("acemq-broker-{uid}"))
}

/// A kept node, as its state file describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptBroker {
    pub dir: PathBuf,
    pub name: String,
    pub amqp_url: String,
    pub mgmt_url: String,
    /// The start script's process id (and process group).
    pub pid: u32,
    ports: Ports,
}

impl KeptBroker {
    /// Port of its stream protocol's listener.
    pub fn stream_port(&self) -> u16 {
        self.ports.stream
    }

    /// The state file's text: `key=value` lines.
    fn to_state(&self) -> String {
        format!(
            "name={}\namqp_url={}\nmgmt_url={}\npid={}\namqp_port={}\nmgmt_port={}\ndist_port={}\nstream_port={}\n",
            self.name,
            self.amqp_url,
            self.mgmt_url,
            self.pid,
            self.ports.amqp,
            self.ports.mgmt,
            self.ports.dist,
            self.ports.stream
        )
    }

    /// Reads a state file's text; `None` if anything is missing.
    fn from_state(dir: &Path, text: &str) -> Option<Self> {
        let get = |key: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
                .map(str::to_string)
        };
        Some(Self {
            dir: dir.to_path_buf(),
            name: get("name")?,
            amqp_url: get("amqp_url")?,
            mgmt_url: get("mgmt_url")?,
            pid: get("pid")?.parse().ok()?,
            ports: Ports {
                amqp: get("amqp_port")?.parse().ok()?,
                mgmt: get("mgmt_port")?.parse().ok()?,
                dist: get("dist_port")?.parse().ok()?,
                // Nodes kept by an older harness have no stream listener
                // (0); they can still be found and stopped.
                stream: get("stream_port")
                    .and_then(|port| port.parse().ok())
                    .unwrap_or(0),
            },
        })
    }

    fn is_alive(&self) -> bool {
        process_alive(self.pid)
    }
}

impl Broker {
    /// Starts a node in `dir` that keeps running after this process ends
    /// (see [`Broker::leave_running`]); fails if one already runs there.
    /// A folder left by a node that died is cleared first.
    pub fn start_kept(dir: &Path) -> Result<Broker> {
        // SAFETY: getuid has no preconditions and cannot fail.
        let name = format!("acemq-dev-{}@localhost", unsafe { libc::getuid() });
        Self::start_kept_as(dir, &name, &new_cookie())
    }

    /// [`Broker::start_kept`] under this Erlang name and cookie.
    fn start_kept_as(dir: &Path, name: &str, cookie: &str) -> Result<Broker> {
        if let Some(running) = running(dir)? {
            bail!(
                "a broker already runs in {} at {} (scripts/broker stop stops it)",
                dir.display(),
                running.amqp_url
            );
        }
        if dir.join(STATE_FILE).exists() {
            // Left by a node that died: ours to clear.
            fs::remove_dir_all(dir)
                .with_context(|| format!("clearing the stale folder {}", dir.display()))?;
        } else if dir.exists() {
            // Never remove a folder this did not make (a wrong --dir); a
            // failed start keeps its folder for inspection and says so.
            bail!(
                "{} exists but holds no broker: remove it, or choose another --dir",
                dir.display()
            );
        }
        let broker = Self::start_node(name, "", &Lifetime::Kept(dir.to_path_buf()), cookie)?;
        let state = {
            let node = broker.lock_node();
            let node = node.as_ref().context("the node is gone")?;
            KeptBroker {
                dir: dir.to_path_buf(),
                name: node.name.clone(),
                amqp_url: broker.amqp_url.clone(),
                mgmt_url: broker.mgmt_url.clone(),
                pid: node.pid(),
                ports: node.ports,
            }
        };
        fs::write(dir.join(STATE_FILE), state.to_state())
            .with_context(|| format!("writing {}", dir.join(STATE_FILE).display()))?;
        Ok(broker)
    }

    /// Lets a node started by [`Broker::start_kept`] run on after this
    /// process; [`stop`] stops it later. Returns what its state file says.
    pub fn leave_running(self) -> Result<KeptBroker> {
        let dir = self
            .data_dir
            .clone()
            .context("not a node this process started")?;
        let state = running(&dir)?.context("not a kept node (no state file)")?;
        if let Some(node) = self.lock_node().take() {
            node.leave_running();
        }
        Ok(state)
    }
}

/// The folder of this user's kept cluster: one per user and machine.
pub fn default_cluster_dir() -> PathBuf {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    std::env::temp_dir().join(format!("acemq-cluster-{uid}"))
}

/// The folder of a kept cluster's node.
fn node_dir(cluster: &Path, index: usize) -> PathBuf {
    cluster.join(format!("node-{index}"))
}

/// Starts `size` nodes in `dir` (a folder each), joins them into one
/// cluster and leaves them running, for `scripts/cluster`; returns their
/// state, node 0 first. A failed start stops what it started.
pub fn start_cluster(dir: &Path, size: usize) -> Result<Vec<KeptBroker>> {
    if !running_cluster(dir)?.is_empty() {
        bail!(
            "a cluster already runs in {} (scripts/cluster stop stops it)",
            dir.display()
        );
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let cookie = new_cookie();
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let mut nodes = Vec::new();
    for index in 0..size {
        let name = format!("acemq-dev-{uid}-{index}@localhost");
        // Dropping the nodes started so far stops them (a kept node is
        // stopped like any other until it is left running).
        nodes.push(Broker::start_kept_as(
            &node_dir(dir, index),
            &name,
            &cookie,
        )?);
    }
    super::cluster::join(&nodes)?;
    nodes.into_iter().map(Broker::leave_running).collect()
}

/// The running nodes of the kept cluster in `dir`, node 0 first.
pub fn running_cluster(dir: &Path) -> Result<Vec<KeptBroker>> {
    let mut nodes = Vec::new();
    for index in 0.. {
        let node = node_dir(dir, index);
        if !node.exists() {
            break;
        }
        nodes.extend(running(&node)?);
    }
    Ok(nodes)
}

/// Stops every node of the kept cluster in `dir`, the joined ones first,
/// and removes its folder. `Ok(false)`: none ran.
pub fn stop_cluster(dir: &Path) -> Result<bool> {
    let mut folders: Vec<PathBuf> = (0..)
        .map(|index| node_dir(dir, index))
        .take_while(|node| node.exists())
        .collect();
    folders.reverse();
    let mut any = false;
    for node in folders {
        any |= stop(&node)?;
    }
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(any)
}

/// The kept node in `dir`, if one runs there.
pub fn running(dir: &Path) -> Result<Option<KeptBroker>> {
    let path = dir.join(STATE_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let state = KeptBroker::from_state(dir, &text)
        .with_context(|| format!("{} is not a broker state file", path.display()))?;
    Ok(state.is_alive().then_some(state))
}

/// Stops the kept node in `dir` (`rabbitmqctl stop`, then its process group
/// is killed if it lingers) and removes the folder. `Ok(false)`: none ran.
pub fn stop(dir: &Path) -> Result<bool> {
    let Some(state) = running(dir)? else {
        // A folder left by a node that died: nothing to stop, but clear it.
        if dir.join(STATE_FILE).exists() {
            let _ = fs::remove_dir_all(dir);
        }
        return Ok(false);
    };
    let cli = Cli::for_kept_node(bin_dir(), dir, &state.name, &state.ports);
    let stopped = cli.run("rabbitmqctl", &["stop"], STOP_TIMEOUT);
    let deadline = Instant::now() + EXIT_GRACE;
    while state.is_alive() && Instant::now() < deadline {
        std::thread::sleep(POLL);
    }
    if state.is_alive()
        && let Ok(pgid) = libc::pid_t::try_from(state.pid)
    {
        // SAFETY: plain syscall on the group the node was started in.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
    fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    if let Err(error) = stopped {
        eprintln!("broker: `rabbitmqctl stop` failed, the node was killed: {error:#}");
    }
    Ok(true)
}

fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_file_reads_back() {
        let state = KeptBroker {
            dir: PathBuf::from("/tmp/acemq-broker-0"),
            name: "acemq-dev-0@localhost".into(),
            amqp_url: "amqp://guest:guest@127.0.0.1:40001/%2f".into(),
            mgmt_url: "http://127.0.0.1:40002".into(),
            pid: 1234,
            ports: Ports {
                amqp: 40001,
                mgmt: 40002,
                dist: 40003,
                stream: 40004,
            },
        };
        let text = state.to_state();
        assert_eq!(
            KeptBroker::from_state(&state.dir, &text),
            Some(state.clone())
        );
        let truncated = text.replace("pid=1234\n", "");
        assert_eq!(KeptBroker::from_state(&state.dir, &truncated), None);
    }
}
