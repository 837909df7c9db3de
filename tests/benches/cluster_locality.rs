//! Does it matter which node of a cluster the host consumes through? A
//! quorum queue's deliveries come from its leader; a consumer connected to
//! another node gets them forwarded by that node. This measures the host
//! (`loadgen consume-host`, the `echo` plugin, prefetch 200) draining a
//! quorum queue whose leader is node 0, connected to node 0 (the leader's)
//! and to node 1 (a follower's), in alternating order over the rounds.
//!
//! ```text
//! scripts/build-plugins && cargo bench -p acemq-tests --bench cluster_locality
//! ACEMQ_BENCH_MESSAGES=50000 ACEMQ_BENCH_ROUNDS=5 cargo bench -p acemq-tests --bench cluster_locality
//! ```
//!
//! Each round fills two fresh queues (`loadgen publish` through node 0,
//! which makes node 0 their leader: RabbitMQ places a new quorum queue's
//! leader on the node it is declared through), then drains one through
//! each node. Figures are each drain's steady span (10 % to 90 % acked):
//! msg/s and the consumer's CPU µs per message; medians over the rounds,
//! and the follower's rate as a ratio to the leader's. Asserts nothing.

use std::io::Read as _;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use acemq_tests::{Cluster, env_or, loadgen_result, median, unique_name};

/// Where a drain connects: the queue's leader, or a follower.
#[derive(Clone, Copy, PartialEq)]
enum Placement {
    Leader,
    Follower,
}

impl Placement {
    fn node(self) -> usize {
        match self {
            Placement::Leader => 0,
            Placement::Follower => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Placement::Leader => "through the leader's node",
            Placement::Follower => "through a follower's node",
        }
    }
}

fn main() -> Result<()> {
    let messages: usize = env_or("ACEMQ_BENCH_MESSAGES", 30_000)?;
    let rounds: usize = env_or("ACEMQ_BENCH_ROUNDS", 3)?;
    eprintln!("cluster_locality: starting a throwaway 3-node RabbitMQ cluster");
    let cluster = Cluster::start(3)?;
    let count = messages.to_string();
    let mut rates = [Vec::new(), Vec::new()];
    let mut cpu = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        let mut order = [Placement::Leader, Placement::Follower];
        if round % 2 == 1 {
            order.reverse();
        }
        for placement in order {
            let queue = unique_name("locality");
            loadgen(&[
                "publish",
                "--url",
                cluster.node(0).amqp_url(),
                "-u",
                &queue,
                "-C",
                &count,
                "-s",
                "1024",
            ])?;
            let (leader, _) = cluster.quorum_members(&queue)?;
            if Some(leader.as_str()) != cluster.node(0).node_name() {
                bail!("queue {queue}'s leader is {leader}, not node 0");
            }
            let out = loadgen(&[
                "consume-host",
                "--url",
                cluster.node(placement.node()).amqp_url(),
                "-u",
                &queue,
                "-C",
                &count,
                "-q",
                "200",
            ])?;
            let rate = loadgen_result(&out, "steady_rate")?;
            let cpu_us = loadgen_result(&out, "steady_cpu_us_per_msg")?;
            eprintln!(
                "cluster_locality: round {} {}: {rate:.0} msg/s, {cpu_us:.1} µs CPU/msg",
                round + 1,
                placement.name()
            );
            let slot = usize::from(placement == Placement::Follower);
            rates[slot].push(rate);
            cpu[slot].push(cpu_us);
        }
    }
    let leader = median(&mut rates[0]);
    let follower = median(&mut rates[1]);
    println!(
        "host + echo draining {messages} persistent 1 KiB messages from a quorum queue led by node 0 \
         of 3, prefetch 200; steady span, median of {rounds} rounds:"
    );
    println!("  {:<28} {:>10} {:>14}", "consumer", "msg/s", "CPU µs/msg");
    println!(
        "  {:<28} {leader:>10.0} {:>14.1}",
        Placement::Leader.name(),
        median(&mut cpu[0])
    );
    println!(
        "  {:<28} {follower:>10.0} {:>14.1}   ({:.2}x the leader's rate)",
        Placement::Follower.name(),
        median(&mut cpu[1]),
        follower / leader
    );
    for node in cluster.nodes().iter().rev() {
        node.stop()?;
    }
    Ok(())
}

/// Runs `loadgen ARGS` to its end; its stdout.
fn loadgen(args: &[&str]) -> Result<String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(args)
        .env_remove("ACEMQ_URL")
        .env_remove("ACEMQ_LOADGEN_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("loadgen {}", args.join(" ")))?;
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("piped")
        .read_to_string(&mut out)?;
    let status = child.wait()?;
    if !status.success() {
        bail!("loadgen {} failed ({status}):\n{out}", args.join(" "));
    }
    Ok(out)
}
