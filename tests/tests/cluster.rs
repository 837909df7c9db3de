//! The host on a three-node RabbitMQ cluster (one per test binary, started
//! on first use: [`shared_cluster`]): the replicas of the quorum queues it
//! declares, two host instances competing for one queue, a rollout of a
//! new plugin version one instance at a time, and node faults under load.
//!
//! Tests that stop or kill nodes hold the cluster alone
//! ([`Cluster::faults`]); the others share it ([`Cluster::steady`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use acemq_tests::host::{HostProcess, free_port, http_get, metric_sum, plugin_path};
use acemq_tests::node_faults::{self, Settings};
use acemq_tests::stamp::StampConfig;
use acemq_tests::{Broker, Cluster, ReceivedMessage, shared_cluster, unique_name};
use lapin::BasicProperties;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use serde_json::Value;
use tokio::runtime::Runtime;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `[broker]` lines listing the cluster's nodes in `order`.
fn broker_lines(cluster: &Cluster, order: [usize; 3]) -> String {
    let urls = cluster.amqp_urls();
    let list: Vec<String> = order.iter().map(|&i| format!("{:?}", urls[i])).collect();
    format!(
        "urls = [{}]\nnetwork_recovery_interval = \"1s\"",
        list.join(", ")
    )
}

/// The queues' replicas: on every node unless `replicas` says otherwise,
/// and a queue declared as the AceMQ libraries declare it is accepted.
#[test]
fn the_host_s_quorum_queues_get_a_replica_on_every_node_unless_told_otherwise() {
    let cluster = shared_cluster();
    let _turn = cluster.steady();
    let (input, output, exchange) = (
        unique_name("replicas.in"),
        unique_name("replicas.out"),
        unique_name("replicas.x"),
    );
    let config = StampConfig {
        broker: &broker_lines(cluster, [0, 1, 2]),
        input_queue: "dead_letter = true",
        output_queue: "replicas = 2",
        ..StampConfig::new(&input, &output, &exchange)
    }
    .toml();
    let host = HostProcess::start(&config, 1).unwrap();

    let all: BTreeSet<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.node_name().unwrap().to_owned())
        .collect();
    let (leader, members) = cluster.quorum_members(&input).unwrap();
    assert_eq!(members.iter().cloned().collect::<BTreeSet<_>>(), all);
    // Declared through node 0, the first address: its leader is there.
    assert_eq!(Some(leader.as_str()), cluster.node(0).node_name());
    let (_, members) = cluster.quorum_members(&output).unwrap();
    assert_eq!(members.len(), 2, "{members:?}");
    assert!(members.iter().all(|m| all.contains(m)), "{members:?}");
    let warned = host.log_lines();
    assert!(
        warned.iter().any(|l| l.contains(&format!(
            "queue '{output}' sets replicas = 2: the broker then refuses every declaration of it without the same argument"
        ))),
        "{}",
        host.log_text()
    );

    // Another AceMQ client declares the input queue on another node with
    // exactly the contract's arguments: the same queue, not refused.
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    arguments.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("acemq.dlx".into()),
    );
    arguments.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(format!("{input}.dlq").into()),
    );
    runtime().block_on(async {
        let connection = cluster.node(2).connect().await.unwrap();
        let channel = connection.create_channel().await.unwrap();
        let options = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(input.as_str().into(), options, arguments)
            .await
            .expect("the host's queue refused an AceMQ library's declaration");
        let _ = connection.close(200, "done".into()).await;
    });
    host.terminate(Duration::from_secs(30)).unwrap();
}

/// One host instance of a pair: its process, its own plugin file and its
/// admin endpoint.
struct Instance {
    process: HostProcess,
    plugin: PathBuf,
    admin: String,
    _dir: tempfile::TempDir,
}

impl Instance {
    /// A host on `cluster`, the nodes listed in `order`, running `stamp-v1`
    /// from a plugin file of its own.
    fn start(
        cluster: &Cluster,
        order: [usize; 3],
        (input, output, exchange): (&str, &str, &str),
    ) -> Instance {
        let dir = tempfile::tempdir().unwrap();
        let plugin = dir.path().join("handler.wasm");
        std::fs::copy(plugin_path("stamp-v1"), &plugin).unwrap();
        let admin = format!("127.0.0.1:{}", free_port());
        let config = StampConfig {
            broker: &broker_lines(cluster, order),
            host: &format!("admin_listen = \"{admin}\""),
            input_queue: "dead_letter = true",
            consumer: "prefetch = 20",
            plugin: plugin.clone(),
            ..StampConfig::new(input, output, exchange)
        }
        .toml();
        Instance {
            process: HostProcess::start(&config, 1).unwrap(),
            plugin,
            admin,
            _dir: dir,
        }
    }

    fn get(&self, path: &str) -> String {
        let (status, body) = http_get(&format!("http://{}{path}", self.admin)).unwrap();
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    /// The version `/plugins` reports.
    fn sha256(&self) -> String {
        let plugins: Value = serde_json::from_str(&self.get("/plugins")).unwrap();
        plugins[0]["sha256"].as_str().unwrap().to_owned()
    }

    fn acked(&self, input: &str) -> f64 {
        metric_sum(
            &self.get("/metrics"),
            "acemq_consume_total",
            &[("queue", input), ("outcome", "acked")],
        )
    }

    /// Deploys `plugin` as a deploy tool would (written beside, renamed
    /// over), then waits until `/plugins` reports a version other than
    /// `serving`; returns it.
    fn roll_out(&self, plugin: &Path, serving: &str) -> String {
        let tmp = self.plugin.with_extension("wasm.tmp");
        std::fs::copy(plugin, &tmp).unwrap();
        std::fs::rename(&tmp, &self.plugin).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let now = self.sha256();
            if now != serving {
                return now;
            }
            assert!(
                Instant::now() < deadline,
                "not swapped within 60 s:\n{}",
                self.process.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn properties(seq: usize) -> BasicProperties {
    BasicProperties::default()
        .with_content_type("text/plain".into())
        .with_delivery_mode(2)
        .with_message_id(format!("seq-{seq}").into())
}

async fn publish(broker: &Broker, queue: &str, seqs: std::ops::Range<usize>) {
    broker
        .publish_many(
            "",
            queue,
            seqs.map(|i| (i.to_string().into_bytes(), properties(i))),
        )
        .await
        .unwrap();
}

/// `seq -> versions` of every output, each output's input named right.
fn versions_of(outputs: &[ReceivedMessage]) -> BTreeMap<usize, Vec<String>> {
    let mut by_input: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for output in outputs {
        let stamped: Value = serde_json::from_slice(&output.body).unwrap();
        let seq: usize = stamped["input"].as_str().unwrap().parse().unwrap();
        assert_eq!(stamped["input_id"], format!("seq-{seq}"), "{stamped}");
        by_input
            .entry(seq)
            .or_default()
            .push(stamped["version"].as_str().unwrap().to_owned());
    }
    by_input
}

/// Two instances with the same config compete for one queue: each message
/// is handled once, by one of them. Then a rollout, one instance at a
/// time, under load: every instance reports its version on `/plugins`,
/// nothing is lost, and both versions answer only during the rollout.
#[test]
fn two_instances_share_a_queue_and_roll_out_a_new_version_one_at_a_time() {
    const FIRST: usize = 1000;
    const DURING: usize = 2000;
    const AFTER: usize = 500;
    let cluster = shared_cluster();
    let _turn = cluster.steady();
    let names = (
        unique_name("rollout.in"),
        unique_name("rollout.out"),
        unique_name("rollout.x"),
    );
    let (input, output) = (names.0.as_str(), names.1.as_str());
    let queues = (input, output, names.2.as_str());
    let a = Instance::start(cluster, [0, 1, 2], queues);
    let b = Instance::start(cluster, [1, 2, 0], queues);
    let calm = cluster.node(2);
    let rt = runtime();

    // Competing consumers: each message once, both instances at work.
    rt.block_on(publish(calm, input, 0..FIRST));
    let outputs = rt
        .block_on(calm.drain(output, FIRST, Duration::from_secs(120)))
        .unwrap();
    let first = versions_of(&outputs);
    assert_eq!(first.len(), FIRST, "inputs without an output");
    assert!(
        first.values().all(|v| v == &["v1"]),
        "handled twice: {first:?}"
    );
    let (by_a, by_b) = (a.acked(input), b.acked(input));
    assert_eq!(by_a + by_b, FIRST as f64);
    assert!(by_a > 0.0 && by_b > 0.0, "A {by_a}, B {by_b}");
    let v1 = a.sha256();
    assert_eq!(b.sha256(), v1);

    // The rollout, while inputs keep coming through the calm node.
    let published_by_then = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(FIRST));
    let publisher = std::thread::spawn({
        let (url, mgmt, input) = (
            calm.amqp_url().to_owned(),
            calm.mgmt_url().to_owned(),
            input.to_owned(),
        );
        let published = published_by_then.clone();
        move || {
            let broker = Broker::external(&url, Some(&mgmt)).unwrap();
            let rt = runtime();
            for start in (FIRST..FIRST + DURING).step_by(50) {
                rt.block_on(publish(&broker, &input, start..start + 50));
                published.store(start + 50, std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(40));
            }
        }
    });
    std::thread::sleep(Duration::from_secs(1));
    let v2 = a.roll_out(&plugin_path("stamp-v2"), &v1);
    assert_eq!(b.sha256(), v1, "B swapped with A");
    std::thread::sleep(Duration::from_secs(1));
    let v2_on_b = b.roll_out(&plugin_path("stamp-v2"), &v1);
    // Every input published from here on finds only v2.
    let all_swapped_at = published_by_then.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(v2_on_b, v2);
    assert_eq!((a.sha256(), b.sha256()), (v2.clone(), v2.clone()));
    publisher.join().unwrap();
    rt.block_on(publish(calm, input, FIRST + DURING..FIRST + DURING + AFTER));

    let outputs = rt
        .block_on(calm.drain(output, DURING + AFTER, Duration::from_secs(120)))
        .unwrap();
    let rest = versions_of(&outputs);
    let expected: BTreeSet<usize> = (FIRST..FIRST + DURING + AFTER).collect();
    assert_eq!(
        rest.keys().copied().collect::<BTreeSet<_>>(),
        expected,
        "lost inputs"
    );
    assert!(
        rest.values().all(|v| v.len() == 1),
        "an input handled twice"
    );
    for (seq, versions) in &rest {
        if versions[0] == "v1" {
            assert!(
                *seq < all_swapped_at,
                "input {seq}, published after both instances swapped, was handled by v1"
            );
        }
    }
    let during: BTreeSet<&str> = rest
        .iter()
        .filter(|(seq, _)| **seq < FIRST + DURING)
        .map(|(_, v)| v[0].as_str())
        .collect();
    assert_eq!(
        during,
        BTreeSet::from(["v1", "v2"]),
        "both versions answer during the rollout"
    );
    assert!(
        rest.range(FIRST + DURING..).all(|(_, v)| v == &["v2"]),
        "only v2 after the rollout"
    );
    a.process.terminate(Duration::from_secs(30)).unwrap();
    b.process.terminate(Duration::from_secs(30)).unwrap();
}

/// Node faults under load (see `node_faults`): node 0's application
/// stopped and started, then node 1 SIGKILLed, while two hosts handle a
/// steady stream. Both hosts stay up and reconnect on their own; nothing is
/// lost; duplicates stay within what each cut host had in flight.
#[test]
fn node_faults_under_load_lose_nothing_and_both_hosts_carry_on() {
    let cluster = shared_cluster();
    let _turn = cluster.faults();
    let settings = Settings {
        inputs: 3000,
        publish_over: Duration::from_secs(24),
        fault_at: [0.2, 0.6],
        app_down: Duration::from_secs(3),
        prefetch: 50,
        concurrency: 2,
        max_unconfirmed: 100,
        done_within: Duration::from_secs(180),
    };
    let report = node_faults::run(cluster, &settings).unwrap();
    report.print();
    let logs = || format!("host A:\n{}\n\nhost B:\n{}", report.logs[0], report.logs[1]);
    assert!(
        report.done.is_some(),
        "not every input was handled\n{}",
        logs()
    );
    assert_eq!(report.tally.lost, Vec::<usize>::new(), "{}", logs());
    assert!(
        report.tally.duplicated <= report.duplicate_bound(),
        "{} duplicates, bound {}",
        report.tally.duplicated,
        report.duplicate_bound()
    );
    assert_eq!(report.dead_lettered, 0);
    assert_eq!(report.exited, [None, None], "{}", logs());
    assert_eq!(report.health, ["UP", "UP"], "{}", logs());
    assert!(
        report.handled.iter().all(|&n| n > 0.0),
        "{:?}",
        report.handled
    );
    for row in &report.rows {
        assert!(row.rate_before > 0.0, "{} landed while idle", row.label);
        assert!(
            row.effects.iter().any(|e| e.lost_connection),
            "{} cut no host\n{}",
            row.label,
            logs()
        );
        for effect in row.effects.iter().filter(|e| e.lost_connection) {
            assert!(
                effect.recovery.is_some(),
                "host {} not back after {}\n{}",
                effect.host,
                row.label,
                logs()
            );
        }
    }
    // Host A was on node 0: the first fault cut it.
    assert!(report.rows[0].effects[0].lost_connection, "{}", logs());
}

/// The contract's `.dlq` is a classic queue: on a cluster it lives on the
/// node it was declared on. While that node is down the host still
/// reconnects and consumes its quorum queue on the other nodes (the
/// declaration of the unavailable queue is skipped, with a warning), and a
/// message set aside meanwhile is not lost: the broker returns it as
/// unroutable, the host holds its input, and it reaches the `.dlq` once the
/// node is back.
#[test]
fn a_set_aside_waits_while_the_dlq_s_node_is_down_and_lands_when_it_is_back() {
    let cluster = shared_cluster();
    let _turn = cluster.faults();
    let (input, output, exchange) = (
        unique_name("aside.in"),
        unique_name("aside.out"),
        unique_name("aside.x"),
    );
    let dlq = format!("{input}.dlq");
    let config = StampConfig {
        broker: &broker_lines(cluster, [0, 1, 2]),
        input_queue: "dead_letter = true",
        plugin: plugin_path("outcomes"),
        ..StampConfig::new(&input, &output, &exchange)
    }
    .toml();
    // Node 0, the first address, is where the host declares everything.
    let mut host = HostProcess::start(&config, 1).unwrap();
    let calm = cluster.node(2);
    let rt = runtime();

    cluster.stop_app(0).unwrap();
    host.wait_for_log(": consuming queue=", 2, Duration::from_secs(60))
        .unwrap();
    let skipped = format!("declare queue {dlq}: skipped, the queue exists but its node is down");
    assert!(
        host.log_lines().iter().any(|l| l.contains(&skipped)),
        "{}",
        host.log_text()
    );
    rt.block_on(calm.publish("", &input, b"reject:no such customer", properties(1)))
        .unwrap();
    // Handled and refused by the broker, again and again, while node 0 is down.
    std::thread::sleep(Duration::from_secs(3));
    let started = cluster.start_app(0);
    let landed = rt.block_on(calm.wait_for_message_count(&dlq, 1, Duration::from_secs(60)));
    started.unwrap();
    landed.unwrap_or_else(|e| panic!("{e:#}\n{}", host.log_text()));
    let dead = rt
        .block_on(calm.drain(&dlq, 1, Duration::from_secs(10)))
        .unwrap();
    assert_eq!(dead[0].body_str(), "reject:no such customer");
    assert_eq!(rt.block_on(calm.message_count(&input)).unwrap(), 0);
    host.terminate(Duration::from_secs(30)).unwrap();
}

/// A stream read over the stream protocol keeps being read when the node
/// whose listener the host was configured with goes down: the host learned
/// the other members' listeners from the broker's metadata, reconnects to
/// one, and resumes from the offset the broker tracks, skipping nothing.
#[test]
fn a_stream_read_over_the_stream_protocol_survives_the_loss_of_its_node() {
    const BEFORE: usize = 500;
    const AFTER: usize = 300;
    let cluster = shared_cluster();
    let _turn = cluster.faults();
    let (stream, output, exchange) = (
        unique_name("cluster.stream"),
        unique_name("cluster.stream.out"),
        unique_name("cluster.stream.x"),
    );
    let broker = format!(
        "{}\nstream_port = {}",
        broker_lines(cluster, [0, 1, 2]),
        cluster.node(0).stream_port()
    );
    let consumer = format!(
        "offset = \"first\"\nconsumer_name = \"projection-{stream}\"\nstream_protocol = \"stream\""
    );
    let config = StampConfig {
        broker: &broker,
        input_queue: "type = \"stream\"",
        consumer: &consumer,
        ..StampConfig::new(&stream, &output, &exchange)
    }
    .toml();
    let mut host = HostProcess::start(&config, 1).unwrap();
    let calm = cluster.node(2);
    let rt = runtime();
    let ids = |range: std::ops::Range<usize>| range.map(|i| format!("m{i}")).collect::<Vec<_>>();
    let append = |ids: Vec<String>| {
        let messages = ids.into_iter().map(|id| {
            let properties = BasicProperties::default().with_message_id(id.as_str().into());
            (id.into_bytes(), properties)
        });
        rt.block_on(calm.publish_many("", &stream, messages))
            .unwrap();
    };
    append(ids(0..BEFORE));
    rt.block_on(calm.wait_for_message_count(&output, BEFORE as u32, Duration::from_secs(60)))
        .unwrap();

    cluster.stop_app(0).unwrap();
    append(ids(BEFORE..BEFORE + AFTER));
    let resumed = host.wait_for_log(": consuming queue=", 2, Duration::from_secs(90));
    let landed = rt.block_on(calm.wait_for_message_count(
        &output,
        (BEFORE + AFTER) as u32,
        Duration::from_secs(90),
    ));
    let started = cluster.start_app(0);
    resumed.unwrap_or_else(|e| panic!("{e:#}\n{}", host.log_text()));
    landed.unwrap_or_else(|e| panic!("{e:#}\n{}", host.log_text()));
    started.unwrap();
    let count = rt.block_on(calm.message_count(&output)).unwrap() as usize;
    let outputs = rt
        .block_on(calm.drain(&output, count, Duration::from_secs(30)))
        .unwrap();
    let seen: BTreeSet<String> = outputs
        .iter()
        .map(|m| {
            let body: Value = serde_json::from_slice(&m.body).unwrap();
            body["input"].as_str().unwrap().to_string()
        })
        .collect();
    let missing: Vec<String> = ids(0..BEFORE + AFTER)
        .into_iter()
        .filter(|id| !seen.contains(id))
        .collect();
    assert!(
        missing.is_empty(),
        "skipped: {missing:?}\n{}",
        host.log_text()
    );
    assert!(host.terminate(Duration::from_secs(30)).unwrap().success());
    rt.block_on(calm.delete_queue(&stream)).unwrap();
}
