//! A RabbitMQ cluster of throwaway nodes on this one machine: each node the
//! very node [`Broker::start`] runs (its own folder, ports picked at run
//! time, loopback only), the nodes sharing one Erlang cookie and joined
//! with `rabbitmqctl join_cluster`. Quorum queues declared on it get a
//! replica on every node.
//!
//! [`shared_cluster`] gives every test of one test binary the same cluster,
//! started on first use (booting three nodes and joining them is the
//! expensive part: about half a minute on two busy cores) and stopped when
//! the process exits, like [`super::shared_broker`]. Tests that stop or
//! kill nodes take [`Cluster::faults`] (exclusive) while the others take
//! [`Cluster::steady`], so no test sees another's fault.

use std::sync::{OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::process::{Lifetime, new_cookie};
use super::{Broker, encode_path_segment, next_node_name};

/// Nodes of [`shared_cluster`]: the smallest cluster whose quorum queues
/// survive the loss of one node.
pub const CLUSTER_SIZE: usize = 3;

/// How long the nodes may take to see each other, and a queue to get its
/// replicas, after a join or a restart.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Appended to each node's `rabbitmq.conf`. `pause_minority`: a node cut
/// off from the others stops serving rather than diverging, the setting
/// RabbitMQ recommends for clusters of three or more.
const NODE_CONFIG: &str = "cluster_partition_handling = pause_minority";

/// Throwaway nodes joined into one cluster.
pub struct Cluster {
    nodes: Vec<Broker>,
    /// Held shared by tests that need every node up, exclusively by a test
    /// that stops or kills nodes.
    turns: RwLock<()>,
}

impl Cluster {
    /// Starts `size` nodes (in parallel: a boot is mostly waiting) and joins
    /// the others to the first. Installs RabbitMQ first if it is missing.
    pub fn start(size: usize) -> Result<Cluster> {
        anyhow::ensure!(size >= 1, "a cluster needs a node");
        let started = Instant::now();
        let cookie = new_cookie();
        let names: Vec<String> = (0..size).map(|_| next_node_name()).collect();
        let nodes = std::thread::scope(|scope| {
            let booting: Vec<_> = names
                .iter()
                .map(|name| {
                    let cookie = &cookie;
                    scope.spawn(move || {
                        Broker::start_node(name, NODE_CONFIG, &Lifetime::Tied, cookie)
                    })
                })
                .collect();
            booting
                .into_iter()
                .map(|boot| boot.join().expect("a node's start panicked"))
                .collect::<Result<Vec<Broker>>>()
        })?;
        join(&nodes)?;
        let cluster = Cluster {
            nodes,
            turns: RwLock::new(()),
        };
        cluster.await_all_running()?;
        eprintln!(
            "acemq-tests: RabbitMQ cluster of {size} nodes ready in {:.1} s ({})",
            started.elapsed().as_secs_f64(),
            cluster.amqp_urls().join(", ")
        );
        Ok(cluster)
    }

    /// The nodes, the first the one the others joined.
    pub fn nodes(&self) -> &[Broker] {
        &self.nodes
    }

    pub fn node(&self, index: usize) -> &Broker {
        &self.nodes[index]
    }

    /// Every node's AMQP address, in node order.
    pub fn amqp_urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.amqp_url().to_owned()).collect()
    }

    /// The index of the node whose Erlang name is `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.node_name() == Some(name))
    }

    /// For a test that needs every node up: shared with other such tests.
    pub fn steady(&self) -> RwLockReadGuard<'_, ()> {
        self.turns.read().unwrap_or_else(|e| e.into_inner())
    }

    /// For a test that stops or kills nodes: no other test runs meanwhile.
    /// It must leave every node running again.
    pub fn faults(&self) -> RwLockWriteGuard<'_, ()> {
        self.turns.write().unwrap_or_else(|e| e.into_inner())
    }

    /// `rabbitmqctl stop_app` on a node: it closes every connection and
    /// stops serving, its Erlang VM (and cluster membership) stays.
    pub fn stop_app(&self, index: usize) -> Result<()> {
        self.nodes[index].rabbitmqctl(&["stop_app"])?;
        Ok(())
    }

    /// `rabbitmqctl start_app` on a node, then waits until the cluster
    /// sees every node running.
    pub fn start_app(&self, index: usize) -> Result<()> {
        self.nodes[index].rabbitmqctl(&["start_app"])?;
        self.await_all_running()
    }

    /// SIGKILLs a node's VM, as a machine losing power.
    pub fn kill(&self, index: usize) {
        self.nodes[index].kill();
    }

    /// Starts a killed node again (it rejoins on its own: its data says it
    /// is a member), then waits until the cluster sees every node running.
    pub fn restart(&self, index: usize) -> Result<()> {
        self.nodes[index].restart()?;
        self.await_all_running()
    }

    /// Waits until a node that is up sees all the cluster's nodes running.
    fn await_all_running(&self) -> Result<()> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        let want = self.nodes.len();
        loop {
            let running = self
                .nodes
                .iter()
                .find_map(|node| node.management_get("/api/nodes").ok())
                .map(|nodes| {
                    nodes
                        .as_array()
                        .map_or(0, |all| all.iter().filter(|n| n["running"] == true).count())
                });
            if running == Some(want) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the cluster's nodes were not all running within {SETTLE_TIMEOUT:?} \
                     (running: {running:?} of {want})"
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A quorum queue's members and leader, as the management API of any
    /// running node reports them: `(leader, members)`, Erlang node names.
    pub fn quorum_members(&self, queue: &str) -> Result<(String, Vec<String>)> {
        let path = format!("/api/queues/%2F/{}", encode_path_segment(queue));
        let info: Value = self
            .nodes
            .iter()
            .find_map(|node| node.management_get(&path).ok())
            .with_context(|| format!("no node answers for queue {queue}"))?;
        let leader = info["leader"]
            .as_str()
            .with_context(|| format!("queue {queue} has no leader: {info}"))?
            .to_owned();
        let members = info["members"]
            .as_array()
            .with_context(|| format!("queue {queue} has no members: {info}"))?
            .iter()
            .filter_map(|m| m.as_str().map(str::to_owned))
            .collect();
        Ok((leader, members))
    }
}

/// Joins every node after the first to the first's cluster.
pub(super) fn join(nodes: &[Broker]) -> Result<()> {
    let Some((first, others)) = nodes.split_first() else {
        return Ok(());
    };
    let first = first
        .node_name()
        .context("not a node this process started")?;
    for node in others {
        let name = node.node_name().unwrap_or_default();
        for step in [&["stop_app"][..], &["join_cluster", first], &["start_app"]] {
            node.rabbitmqctl(step)
                .with_context(|| format!("joining {name} to {first}"))?;
        }
    }
    Ok(())
}

/// The cluster shared by every test of this test binary, started on first
/// use and stopped when the process exits (see [`super::shared_broker`]).
/// Panics if it cannot be started; later calls panic with the same error.
pub fn shared_cluster() -> &'static Cluster {
    static SHARED: OnceLock<Result<Cluster, String>> = OnceLock::new();

    extern "C" fn stop_shared_cluster() {
        let _ = std::panic::catch_unwind(|| {
            if let Some(Ok(cluster)) = SHARED.get() {
                // The joined nodes first: the first node stopping while the
                // others run makes them wait for it.
                for node in cluster.nodes.iter().rev() {
                    if let Err(error) = node.stop() {
                        eprintln!("acemq-tests: stopping a cluster node failed: {error:#}");
                    }
                }
            }
        });
    }

    let shared = SHARED.get_or_init(|| {
        let cluster = Cluster::start(CLUSTER_SIZE).map_err(|e| format!("{e:#}"))?;
        // SAFETY: registers a plain function with no preconditions.
        if unsafe { libc::atexit(stop_shared_cluster) } != 0 {
            eprintln!("acemq-tests: atexit failed; the cluster stops only on process death");
        }
        Ok(cluster)
    });
    match shared {
        Ok(cluster) => cluster,
        Err(error) => panic!("acemq-tests: no RabbitMQ cluster: {error}"),
    }
}
