//! The host keeps running through the broker's troubles: connections cut
//! under load, an address that refuses connections, a resource alarm, a
//! queue deleted under its consumer, a shutdown in the middle of a recovery.
//! A start the broker refuses outright is reported at once.
//!
//! Faults that touch only this host go through a [`FaultProxy`] between it
//! and the test broker; faults that touch the whole broker (an alarm) run
//! on a node of their own, so no other test feels them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use acemq_tests::host::{HostOptions, HostProcess, SUBSCRIBED, free_port, http_get, plugin_path};
use acemq_tests::stamp::StampConfig;
use acemq_tests::{Broker, FaultProxy, shared_broker, unique_name};
use lapin::BasicProperties;
use serde_json::Value;

/// How quickly a test's host reconnects (`network_recovery_interval`,
/// `recovery_backoff_max`).
#[derive(Clone, Copy)]
struct Recovery {
    first_wait: &'static str,
    backoff_max: &'static str,
}

/// What most tests here use: no test waits the contract's 5 s.
const QUICK_RECOVERY: Recovery = Recovery {
    first_wait: "300ms",
    backoff_max: "2s",
};

/// One consume → stamp → confirmed publish pipeline and its names.
struct Pipeline {
    input: String,
    output: String,
    out_exchange: String,
    admin: String,
    dir: tempfile::TempDir,
}

impl Pipeline {
    fn new(prefix: &str) -> Self {
        Self {
            input: unique_name(&format!("{prefix}.in")),
            output: unique_name(&format!("{prefix}.out")),
            out_exchange: unique_name(&format!("{prefix}.x")),
            admin: format!("127.0.0.1:{}", free_port()),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// The host's config, connecting to `urls` in order; quick recovery so
    /// that the tests do not wait the contract's 5 s.
    fn config(&self, urls: &[String]) -> String {
        self.config_recovering(urls, QUICK_RECOVERY)
    }

    /// [`config`](Self::config) with `recovery`'s first wait and largest
    /// backoff.
    fn config_recovering(&self, urls: &[String], recovery: Recovery) -> String {
        let urls: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
        let broker = format!(
            "urls = [{}]\nconnect_timeout = \"10s\"\nnetwork_recovery_interval = \"{}\"\nrecovery_backoff_max = \"{}\"",
            urls.join(", "),
            recovery.first_wait,
            recovery.backoff_max
        );
        let host = format!("admin_listen = \"{}\"", self.admin);
        StampConfig {
            broker: &broker,
            host: &host,
            input_queue: "type = \"quorum\"\ndead_letter = true",
            consumer: "prefetch = 100\nconcurrency = 4",
            ..StampConfig::new(&self.input, &self.output, &self.out_exchange)
        }
        .toml()
    }

    fn start(&self, urls: &[String]) -> HostProcess {
        let path = self
            .dir
            .path()
            .join(format!("{}.toml", unique_name("host")));
        std::fs::write(&path, self.config(urls)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        HostProcess::start_with(&path, dir, &HostOptions::default()).expect("the host starts")
    }

    /// Starts the host on `urls`, publishes `inputs`, and returns once
    /// `flowing` outputs arrived: a run a fault can be injected into.
    async fn flowing(
        &self,
        broker: &Broker,
        urls: &[String],
        inputs: usize,
        flowing: u32,
    ) -> HostProcess {
        let host = self.start(urls);
        self.publish_inputs(broker, 0..inputs).await;
        broker
            .wait_for_message_count(&self.output, flowing, Duration::from_secs(60))
            .await
            .unwrap();
        host
    }

    /// No input was dead-lettered: no fault here is a message's fault.
    async fn assert_nothing_dead_lettered(&self, broker: &Broker) {
        let dlq = format!("{}.dlq", self.input);
        assert_eq!(broker.message_count(&dlq).await.unwrap(), 0, "{dlq}");
    }

    async fn publish_inputs(&self, broker: &Broker, range: std::ops::Range<usize>) {
        let inputs = range.map(|i| {
            let properties = BasicProperties::default()
                .with_content_type("application/json".into())
                .with_message_id(format!("in-{i}").into());
            (format!(r#"{{"n":{i}}}"#).into_bytes(), properties)
        });
        broker.publish_many("", &self.input, inputs).await.unwrap();
    }

    /// Waits until outputs for `expected` distinct inputs arrived (or the
    /// timeout), then takes every output: how many times each input was
    /// published.
    async fn outputs(
        &self,
        broker: &Broker,
        expected: usize,
        timeout: Duration,
    ) -> BTreeMap<String, usize> {
        broker
            .wait_for_message_count(&self.output, expected as u32, timeout)
            .await
            .unwrap();
        // Duplicates, if any, arrive with the rest; give stragglers a moment.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let count = broker.message_count(&self.output).await.unwrap() as usize;
        let messages = broker
            .drain(&self.output, count, Duration::from_secs(30))
            .await
            .unwrap();
        let mut seen = BTreeMap::new();
        for message in messages {
            let body: Value = serde_json::from_slice(&message.body).unwrap();
            let input = body["input_id"].as_str().unwrap_or_default().to_string();
            *seen.entry(input).or_insert(0) += 1;
        }
        seen
    }

    /// `/health`, or why it could not be read (the endpoint not up yet).
    fn health(&self) -> Result<Value, String> {
        let url = format!("http://{}/health", self.admin);
        let (_, body) =
            tokio::task::block_in_place(|| http_get(&url)).map_err(|e| format!("{e:#}"))?;
        serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))
    }

    /// Polls `/health` until `check` holds; the last answer otherwise.
    async fn health_until(
        &self,
        timeout: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Result<Value, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let health = self.health();
            if let Ok(health) = &health
                && check(health)
            {
                return Ok(health.clone());
            }
            if Instant::now() > deadline {
                return Err(match health {
                    Ok(health) => health.to_string(),
                    Err(e) => e,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn proxy_url(broker: &Broker, proxy: &FaultProxy) -> String {
    broker.amqp_url().replacen(
        &format!(":{}", broker.amqp_port()),
        &format!(":{}", proxy.port()),
        1,
    )
}

fn upstream(broker: &Broker) -> std::net::SocketAddr {
    format!("{}:{}", broker.amqp_host(), broker.amqp_port())
        .parse()
        .or_else(|_| format!("127.0.0.1:{}", broker.amqp_port()).parse())
        .unwrap()
}

fn assert_every_input_once_or_more(seen: &BTreeMap<String, usize>, inputs: usize) -> usize {
    let missing: Vec<usize> = (0..inputs)
        .filter(|i| !seen.contains_key(&format!("in-{i}")))
        .collect();
    assert!(
        missing.is_empty(),
        "{} inputs have no output, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    seen.values().map(|n| n - 1).sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_cut_three_times_under_load_lose_nothing_and_the_host_recovers_by_itself() {
    const INPUTS: usize = 3000;
    let broker = shared_broker();
    let proxy = FaultProxy::start(upstream(broker)).unwrap();
    let run = Pipeline::new("cut");
    let mut host = run.start(&[proxy_url(broker, &proxy)]);
    run.publish_inputs(broker, 0..INPUTS).await;

    for cut in 1..=3 {
        broker
            .wait_for_message_count(
                &run.output,
                (cut * INPUTS / 5) as u32,
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        proxy.cut_all();
        host.wait_for_log("connection recovered", 2 * cut, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("cut {cut}: {e}\n{}", host.log_text()));
    }
    let seen = run.outputs(broker, INPUTS, Duration::from_secs(90)).await;
    let duplicates = assert_every_input_once_or_more(&seen, INPUTS);
    // At most what was in flight per loss: the prefetch and the confirms.
    assert!(duplicates <= 3 * (100 + 1000), "{duplicates} duplicates");
    run.assert_nothing_dead_lettered(broker).await;
    assert_eq!(broker.message_count(&run.input).await.unwrap(), 0);
    let health = run
        .health_until(Duration::from_secs(10), |h| h["status"] == "UP")
        .await;
    assert!(health.is_ok(), "{health:?}");
    let metrics =
        tokio::task::block_in_place(|| http_get(&format!("http://{}/metrics", run.admin)))
            .unwrap()
            .1;
    assert!(
        metrics.contains("acemq_connection_recoveries_total{connection=\"consume\"} 3"),
        "{metrics}"
    );
    let status = host.terminate(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_second_address_takes_over_when_the_first_refuses_and_back_again() {
    let broker = shared_broker();
    let first = FaultProxy::start(upstream(broker)).unwrap();
    let second = FaultProxy::start(upstream(broker)).unwrap();
    first.set_refusing(true);
    let run = Pipeline::new("failover");
    let mut host = run.start(&[proxy_url(broker, &first), proxy_url(broker, &second)]);
    assert_eq!(first.accepted(), 0);
    run.publish_inputs(broker, 0..100).await;
    broker
        .wait_for_message_count(&run.output, 100, Duration::from_secs(30))
        .await
        .unwrap();

    // The second goes away; the first is back.
    second.set_refusing(true);
    first.set_refusing(false);
    second.cut_all();
    host.wait_for_log("connection recovered", 2, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}\n{}", host.log_text()));
    run.publish_inputs(broker, 100..200).await;
    let seen = run.outputs(broker, 200, Duration::from_secs(30)).await;
    assert_every_input_once_or_more(&seen, 200);
    assert!(
        first.open_connections() >= 2,
        "both connections moved to the first address"
    );
    let log = host.log_text();
    assert!(
        log.contains(&format!(
            "broker=amqp://guest:***@127.0.0.1:{}",
            first.port()
        )) || log.contains(&format!(":{}", first.port())),
        "{log}"
    );
    host.terminate(Duration::from_secs(30)).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_a_recovery_exits_cleanly_within_the_drain_timeout() {
    let broker = shared_broker();
    let proxy = FaultProxy::start(upstream(broker)).unwrap();
    let run = Pipeline::new("sigterm");
    let mut host = run.start(&[proxy_url(broker, &proxy)]);
    proxy.set_refusing(true);
    proxy.cut_all();
    host.wait_for_log("connection lost; recovering", 1, Duration::from_secs(30))
        .unwrap();
    let health = run
        .health_until(Duration::from_secs(10), |h| h["status"] == "DEGRADED")
        .await
        .unwrap_or_else(|h| panic!("{h}"));
    assert!(
        health["details"]
            .to_string()
            .contains("connection: the connection was lost"),
        "{health}"
    );
    let started = Instant::now();
    let status = host.terminate(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
    // The drain timeout is 20 s; nothing was in flight, so it is quicker.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_login_is_reported_at_once_not_retried_until_the_timeout() {
    let broker = shared_broker();
    let run = Pipeline::new("login");
    let wrong = broker
        .amqp_url()
        .replacen("guest:guest", "guest:not-the-password", 1);
    assert_ne!(
        wrong,
        broker.amqp_url(),
        "the test broker's URL carries guest:guest"
    );
    let config = run
        .config(&[wrong])
        .replace("connect_timeout = \"10s\"", "connect_timeout = \"60s\"");
    let path = run.dir.path().join("host.toml");
    std::fs::write(&path, config).unwrap();
    let started = Instant::now();
    let (status, log) = HostProcess::refuses(&path).unwrap();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    assert!(log.contains("refused the connection"), "{log}");
    assert!(!log.contains("not-the-password"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_memory_alarm_pauses_publishing_and_dead_letters_nothing_retries_nothing() {
    // Enough that the host is still publishing when the alarm comes (the
    // broker blocks a connection at its next publish), all queued before
    // the host starts: published while it ran, a host as fast as the
    // producer had handled all 20,000 before `rabbitmqctl` set the alarm.
    const INPUTS: usize = 30_000;
    // The alarm is broker-wide: a node of its own.
    let broker = Broker::start().unwrap();
    let run = Pipeline::new("alarm");
    let urls = [broker.amqp_url().to_string()];
    // A first host declares the topology, and stops.
    let declaring = run.start(&urls);
    assert!(
        declaring
            .terminate(Duration::from_secs(30))
            .unwrap()
            .success()
    );
    run.publish_inputs(&broker, 0..INPUTS).await;
    let mut host = run.start(&urls);
    broker
        .wait_for_message_count(&run.output, 100, Duration::from_secs(60))
        .await
        .unwrap();

    broker
        .rabbitmqctl(&["set_vm_memory_high_watermark", "0"])
        .unwrap();
    let blocked = run
        .health_until(Duration::from_secs(20), |h| {
            h["connections"]["publish"]["state"] == "blocked"
        })
        .await;
    let alarm_held = Instant::now();
    let health = match blocked {
        Ok(health) => health,
        Err(last) => {
            let outputs = broker.message_count(&run.output).await.unwrap();
            panic!(
                "never blocked ({outputs} of {INPUTS} outputs made): {last}\n{}",
                host.log_text()
            )
        }
    };
    assert_eq!(health["status"], "DEGRADED", "{health}");
    assert!(
        health["details"]
            .to_string()
            .contains("the broker has blocked this connection; publishing is paused"),
        "{health}"
    );
    // Consuming goes on: the consume connection is not blocked.
    assert_eq!(health["connections"]["consume"]["state"], "up", "{health}");
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(alarm_held.elapsed())).await;
    broker
        .rabbitmqctl(&["set_vm_memory_high_watermark", "0.4"])
        .unwrap();

    let seen = run.outputs(&broker, INPUTS, Duration::from_secs(180)).await;
    assert_every_input_once_or_more(&seen, INPUTS);
    run.assert_nothing_dead_lettered(&broker).await;
    let metrics =
        tokio::task::block_in_place(|| http_get(&format!("http://{}/metrics", run.admin)))
            .unwrap()
            .1;
    assert!(
        !metrics.contains("acemq_messages_retried_total{"),
        "nothing retried: {metrics}"
    );
    assert!(
        !metrics.contains("outcome=\"dead_lettered\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("acemq_connection_blocked_seconds_total{connection=\"publish\"}"),
        "{metrics}"
    );
    host.wait_for_log(
        "the broker unblocked the connection",
        1,
        Duration::from_secs(10),
    )
    .unwrap();
    host.terminate(Duration::from_secs(30)).unwrap();
    broker.stop().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_queue_deleted_under_its_consumer_is_restored_and_the_other_consumer_never_stops() {
    let broker = shared_broker();
    let a = Pipeline::new("deleted");
    let b_queue = unique_name("deleted.other");
    let config = format!(
        "{}\n[[queues]]\nname = \"{b_queue}\"\n\n[[consumers]]\nqueue = \"{b_queue}\"\nplugin = \"{plugin}\"\npublish_to = [\"{out}\"]\n\n[consumers.config]\nout_exchange = \"{out}\"\n",
        a.config(&[broker.amqp_url().to_string()]),
        plugin = plugin_path("stamp-v1").display(),
        out = a.out_exchange,
    );
    let path = a.dir.path().join("host.toml");
    std::fs::write(&path, config).unwrap();
    let mut host = HostProcess::start_with(
        &path,
        tempfile::tempdir().unwrap(),
        &HostOptions {
            consumers: 2,
            ..HostOptions::default()
        },
    )
    .unwrap();

    broker.delete_queue(&a.input).await.unwrap();
    host.wait_for_log(
        "consumer stopped; restarting it alone",
        1,
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", host.log_text()));
    // The other consumer keeps its rate meanwhile.
    let others = (0..200).map(|i| {
        (
            format!(r#"{{"n":{i}}}"#).into_bytes(),
            BasicProperties::default().with_message_id(format!("other-{i}").into()),
        )
    });
    broker.publish_many("", &b_queue, others).await.unwrap();
    // The deleted queue comes back (the host declares its topology again)
    // and its consumer reads it.
    host.wait_for_log(SUBSCRIBED, 3, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}\n{}", host.log_text()));
    a.publish_inputs(broker, 0..100).await;
    let seen = a.outputs(broker, 300, Duration::from_secs(30)).await;
    assert_every_input_once_or_more(&seen, 100);
    assert_eq!(
        (0..200)
            .filter(|i| seen.contains_key(&format!("other-{i}")))
            .count(),
        200
    );
    let health = a
        .health_until(Duration::from_secs(10), |h| h["status"] == "UP")
        .await;
    assert!(health.is_ok(), "{health:?}");
    assert_eq!(
        host.terminate(Duration::from_secs(30)).unwrap().code(),
        Some(0)
    );
}

/// A consumer that restarts alone first declares its topology again. On a
/// connection that has stopped answering (here: the proxy forwards nothing,
/// and heartbeats take minutes to notice), those declares wait until the
/// connection fails; the stop used to wait with them, past the drain timeout.
/// Nothing is subscribed while it resubscribes, so a stop must end at once.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_while_a_consumer_resubscribes_on_a_silent_connection_exits_within_the_drain_timeout()
 {
    let broker = shared_broker();
    let proxy = FaultProxy::start(upstream(broker)).unwrap();
    let run = Pipeline::new("resubscribing");
    // Heartbeats every 60 s: the silence is not noticed during the test.
    let url = format!("{}?heartbeat=60", proxy_url(broker, &proxy));
    let mut host = run.start(&[url]);
    host.wait_for_log(SUBSCRIBED, 1, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}\n{}", host.log_text()));
    // The broker cancels the consumer; it restarts alone after about 1 s,
    // declaring the topology first. The network goes silent before that.
    broker.delete_queue(&run.input).await.unwrap();
    host.wait_for_log(
        "consumer stopped; restarting it alone",
        1,
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", host.log_text()));
    proxy.set_blackhole(true);
    // The pause before the restart is at most 1 s: the declares now wait.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = Instant::now();
    let (status, log) = host
        .terminate_with_log(Duration::from_secs(50))
        .unwrap_or_else(|e| panic!("the stop did not end: {e}"));
    assert!(status.success(), "{status}\n{}", log.join("\n"));
    println!("stopped in {:?}", started.elapsed());
    // The drain timeout is 20 s; nothing is in flight. The two connection
    // closes that the silent broker never confirms take 5 s each.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}\n{}",
        started.elapsed(),
        log.join("\n")
    );
    proxy.set_blackhole(false);
}

#[tokio::test(flavor = "multi_thread")]
async fn while_it_connects_health_is_down_and_says_what_it_waits_for() {
    let broker = shared_broker();
    let proxy = FaultProxy::start(upstream(broker)).unwrap();
    proxy.set_refusing(true);
    let run = Pipeline::new("starting");
    let path = run.dir.path().join("host.toml");
    let config = run
        .config(&[proxy_url(broker, &proxy)])
        .replace("connect_timeout = \"10s\"", "connect_timeout = \"60s\"");
    std::fs::write(&path, config).unwrap();
    let options = HostOptions {
        consumers: 0,
        ..HostOptions::default()
    };
    let mut host = HostProcess::start_with(&path, tempfile::tempdir().unwrap(), &options).unwrap();
    // DOWN from the start; once the first attempt was refused, it says why.
    let down = run
        .health_until(Duration::from_secs(20), |h| {
            h["status"] == "DOWN" && h["details"].to_string().contains("Connection refused")
        })
        .await
        .unwrap_or_else(|h| panic!("{h}"));
    let details = down["details"].to_string();
    assert!(
        details.contains("consume connection: waiting for"),
        "{down}"
    );
    let (status, _) =
        tokio::task::block_in_place(|| http_get(&format!("http://{}/health", run.admin))).unwrap();
    assert_eq!(status, 503);
    proxy.set_refusing(false);
    host.wait_for_log(SUBSCRIBED, 1, Duration::from_secs(30))
        .unwrap();
    let up = run
        .health_until(Duration::from_secs(10), |h| h["status"] == "UP")
        .await;
    assert!(up.is_ok(), "{up:?}");
    host.terminate(Duration::from_secs(30)).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blackholed_network_is_noticed_by_heartbeats_and_recovered_from() {
    const INPUTS: usize = 500;
    let broker = shared_broker();
    let proxy = FaultProxy::start(upstream(broker)).unwrap();
    let run = Pipeline::new("blackhole");
    // Heartbeats every 2 s: a silent connection is noticed in a few seconds.
    let url = format!("{}?heartbeat=2", proxy_url(broker, &proxy));
    let mut host = run.flowing(broker, &[url], INPUTS / 2, 50).await;
    proxy.set_blackhole(true);
    host.wait_for_log("connection lost; recovering", 2, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}\n{}", host.log_text()));
    run.publish_inputs(broker, INPUTS / 2..INPUTS).await;
    proxy.set_blackhole(false);
    host.wait_for_log("connection recovered", 2, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}\n{}", host.log_text()));
    let seen = run.outputs(broker, INPUTS, Duration::from_secs(60)).await;
    assert_every_input_once_or_more(&seen, INPUTS);
    run.assert_nothing_dead_lettered(broker).await;
    host.terminate(Duration::from_secs(30)).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn latency_between_host_and_broker_slows_it_down_and_loses_nothing() {
    const INPUTS: usize = 300;
    let broker = shared_broker();
    let proxy = FaultProxy::start(upstream(broker)).unwrap();
    let run = Pipeline::new("latency");
    let host = run.start(&[proxy_url(broker, &proxy)]);
    proxy.set_latency(Duration::from_millis(40));
    run.publish_inputs(broker, 0..INPUTS).await;
    let seen = run.outputs(broker, INPUTS, Duration::from_secs(90)).await;
    assert_eq!(
        assert_every_input_once_or_more(&seen, INPUTS),
        0,
        "no loss, so no duplicate"
    );
    assert!(
        !host.log_text().contains("connection lost"),
        "{}",
        host.log_text()
    );
    host.terminate(Duration::from_secs(30)).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_broker_closing_every_connection_and_restarting_loses_nothing() {
    const INPUTS: usize = 5000;
    // Both faults reach every client of the node: a node of its own.
    let broker = Broker::start().unwrap();
    let run = Pipeline::new("restart");
    let mut host = run
        .flowing(&broker, &[broker.amqp_url().to_string()], INPUTS, 500)
        .await;
    broker
        .rabbitmqctl(&["close_all_connections", "fault test"])
        .unwrap();
    host.wait_for_log("connection recovered", 2, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}\n{}", host.log_text()));
    broker.rabbitmqctl(&["stop_app"]).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    broker.rabbitmqctl(&["start_app"]).unwrap();
    host.wait_for_log("connection recovered", 4, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}\n{}", host.log_text()));
    let log = host.log_text();
    assert!(
        log.contains("CONNECTION_FORCED"),
        "the broker's reason is logged: {log}"
    );
    let seen = run.outputs(&broker, INPUTS, Duration::from_secs(120)).await;
    assert_every_input_once_or_more(&seen, INPUTS);
    run.assert_nothing_dead_lettered(&broker).await;
    assert!(host.terminate(Duration::from_secs(30)).unwrap().success());
    broker.stop().unwrap();
}

/// lapin leaves a step that awaits the broker's reply pending for ever when
/// its connection fails at that moment (this test without the race below:
/// 10 of 300 cuts left `create_channel` pending, the connection already
/// `Error`).
/// The host races every such step against the connection's end
/// (`acemq_host::broker::lost`): here channels are opened and closed in a
/// loop while the socket is cut, hundreds of times, and every loop ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_step_whose_connection_is_cut_ends_with_it_instead_of_waiting_for_ever() {
    use acemq_host::broker::lost::{ended, until_lost};
    use lapin::{Connection, ConnectionProperties};
    use std::sync::Arc;

    const CUTS: u64 = 300;
    let broker = shared_broker();
    let proxy = FaultProxy::start(broker.amqp_addr()).unwrap();
    let url = broker.amqp_url_via(proxy.port());
    let connect = async || {
        Arc::new(
            Connection::connect(&url, ConnectionProperties::default())
                .await
                .unwrap(),
        )
    };

    // A step that never ends by itself ends with its connection.
    let connection = connect().await;
    let pending = tokio::spawn({
        let connection = connection.clone();
        async move { until_lost(&connection, std::future::pending::<lapin::Result<()>>()).await }
    });
    proxy.cut_all();
    let ended_with = tokio::time::timeout(Duration::from_secs(2), pending)
        .await
        .expect("a step outlived its connection by 2 s")
        .unwrap();
    assert!(
        matches!(
            ended_with.as_ref().map_err(lapin::Error::kind),
            Err(lapin::ErrorKind::InvalidConnectionState(
                lapin::ConnectionState::Error
            ))
        ),
        "{ended_with:?}"
    );

    // Opening and closing channels while the socket is cut.
    let mut stuck = Vec::new();
    let mut rescued = 0;
    for cut in 0..CUTS {
        let connection = connect().await;
        let opening = tokio::spawn({
            let connection = connection.clone();
            async move {
                loop {
                    let channel = tokio::select! {
                        biased;
                        opened = connection.create_channel() => match opened {
                            Ok(channel) => channel,
                            Err(_) => return false,
                        },
                        _ = ended(&connection) => return true,
                    };
                    let closing = channel.close(200, "done".into());
                    if until_lost(&connection, closing).await.is_err() {
                        return false;
                    }
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(5 + cut % 23)).await;
        proxy.cut_all();
        match tokio::time::timeout(Duration::from_secs(5), opening).await {
            Ok(ended_by_the_race) => rescued += u32::from(ended_by_the_race.unwrap()),
            Err(_) => stuck.push(cut),
        }
    }
    eprintln!("{rescued} of {CUTS} cuts left a channel's opening pending until the race ended it");
    assert!(
        stuck.is_empty(),
        "cuts whose loop did not end within 5 s: {stuck:?}"
    );
}

/// A recovery is a chain of such steps: connect, declare the topology,
/// open the publisher's channel, subscribe. A cut in the middle of any of
/// them must end that attempt, and the next one must follow. Here the
/// host's connections are cut again and again just after it reconnects, at
/// moments spread over its recovery; it comes back after each cut, and,
/// left alone, handles every input and stops at once. Without the race
/// (`until_lost` a plain await) 2 of 7 runs failed: the consume connection
/// never came back, its recovery waiting on a declaration for good.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_cut_again_and_again_in_the_middle_of_its_recovery_comes_back_every_time() {
    use acemq_tests::host::InProcessHost;

    const CUTS: u64 = 120;
    const INPUTS: usize = 200;
    let broker = shared_broker();
    let proxy = FaultProxy::start(upstream(broker)).unwrap();
    let run = Pipeline::new("recut");
    // Recovery within milliseconds, so that 120 cuts take seconds.
    let recovery = Recovery {
        first_wait: "20ms",
        backoff_max: "200ms",
    };
    let config = run.config_recovering(&[proxy_url(broker, &proxy)], recovery);
    let host = InProcessHost::start(&config).await.unwrap();

    for cut in 0..CUTS {
        let accepted = proxy.accepted();
        proxy.cut_all();
        let deadline = Instant::now() + Duration::from_secs(20);
        // Both connections (consume and publish) are attempted again.
        while proxy.accepted() < accepted + 2 {
            assert!(
                Instant::now() < deadline,
                "the host did not connect again within 20 s of cut {cut}; its state:\n{}",
                host.state()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Somewhere in the recovery that just began: the handshake, the
        // declarations, the publisher's channel or the subscription.
        tokio::time::sleep(Duration::from_millis(cut % 67)).await;
    }

    run.publish_inputs(broker, 0..INPUTS).await;
    let seen = run.outputs(broker, INPUTS, Duration::from_secs(60)).await;
    assert_every_input_once_or_more(&seen, INPUTS);
    run.assert_nothing_dead_lettered(broker).await;
    let stopping = Instant::now();
    host.stop().await.unwrap();
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "the stop took {:?}",
        stopping.elapsed()
    );
}
