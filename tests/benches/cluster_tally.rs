//! Cluster fault tally (issue 15's acceptance): node faults on a 3-node
//! RabbitMQ cluster under load, what they cost two host instances.
//!
//! ```text
//! scripts/build-plugins && cargo bench -p acemq-tests --bench cluster_tally
//! ACEMQ_TALLY_INPUTS=50000 cargo bench -p acemq-tests --bench cluster_tally
//! ```
//!
//! A throwaway cluster of its own (three nodes on this machine, quorum
//! queues on all three) and two `acemq-host` processes with the `stamp-v1`
//! pipeline; the scenario is `acemq_tests::node_faults`: `ACEMQ_TALLY_INPUTS`
//! inputs (30,000) published at a steady pace through the node no fault
//! touches, node 0's application stopped and started again (host A's
//! node), then node 1 SIGKILLed (host B's, and by then host A's too), and
//! started again at the end.
//!
//! Prints, per fault and host, whether the host lost its connections, its
//! recovery (from "connection lost" to consuming again) and the node it
//! reconnected to; then lost (must be 0), duplicated against its bound
//! (prefetch + max_unconfirmed per host per fault that cut it), and whether
//! both hosts stayed up. The hosts' logs go to `target/cluster-tally-a.log`
//! and `-b.log`. Asserts nothing: it fails only when it cannot set up.

use std::time::Duration;

use anyhow::Result;

use acemq_tests::host::workspace_root;
use acemq_tests::node_faults::{self, Settings};
use acemq_tests::{Cluster, env_or};

fn main() -> Result<()> {
    let inputs: usize = env_or("ACEMQ_TALLY_INPUTS", 30_000)?;
    let publish_over: u64 = env_or("ACEMQ_TALLY_SECONDS", 40)?;
    eprintln!("cluster_tally: starting a throwaway 3-node RabbitMQ cluster");
    let cluster = Cluster::start(3)?;
    let settings = Settings {
        inputs,
        publish_over: Duration::from_secs(publish_over),
        fault_at: [0.2, 0.6],
        app_down: Duration::from_secs(5),
        prefetch: 100,
        concurrency: 4,
        max_unconfirmed: 1000,
        done_within: Duration::from_secs(300),
    };
    let report = node_faults::run(&cluster, &settings)?;
    report.print();
    for (name, log) in ["a", "b"].iter().zip(&report.logs) {
        let path = workspace_root().join(format!("target/cluster-tally-{name}.log"));
        std::fs::write(&path, format!("{log}\n"))?;
        println!("host {} log: {}", name.to_uppercase(), path.display());
    }
    for node in cluster.nodes().iter().rev() {
        node.stop()?;
    }
    Ok(())
}
