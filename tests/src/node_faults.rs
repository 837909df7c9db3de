//! Node faults under load: two host instances competing for one quorum
//! queue on a three-node cluster, while one node's application is stopped
//! and started again and then another node is SIGKILLed. Shared by the
//! integration test (`tests/cluster.rs`, small numbers, asserts) and the
//! fault tally (`benches/cluster_tally.rs`, 30,000 inputs, prints).
//!
//! The pipeline is the stamp one (`stamp-v1`: each input published,
//! confirmed, as an output whose body names its input). Both hosts have
//! the same config but for the order of the cluster's addresses: host A
//! lists node 0 first, host B node 1, so each starts on its own node, and
//! after a loss each moves on to the next address that answers.
//!
//! Inputs are published at a steady pace through node 2, which no fault
//! touches, over the whole run, so every fault lands while messages flow.
//! The schedule:
//!
//! 1. node 0 (host A's): `rabbitmqctl stop_app`, the application down for
//!    [`Settings::app_down`], then `start_app`;
//! 2. node 1 (host B's, and host A's since it left node 0): SIGKILL. It is
//!    started again once every input is handled, so that the cluster is
//!    whole for whatever runs next.
//!
//! Tallied: inputs lost (no output names them; must be 0), outputs
//! duplicated (at-least-once: bounded by what was in flight on each host
//! that lost its connection, its prefetch plus its unconfirmed publishes),
//! and per fault and host, from the host's log, whether it lost its
//! connections, how long it took to consume again, and which node it
//! reconnected to.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::broker_faults::LOST;
use crate::host::{HostProcess, SUBSCRIBED, free_port, http_get, metric_sum};
use crate::stamp::StampConfig;
use crate::tally::{HostLog, Tally, drain_all, publish_inputs_until_confirmed};
use crate::{Broker, Cluster, unique_name};
use lapin::options::ConfirmSelectOptions;

const RECOVERED: &str = "connection recovered";
/// The node inputs are published through and outputs drained from: no
/// fault touches it.
const CALM_NODE: usize = 2;
/// How often the publisher publishes a slice of the inputs.
const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// The knobs of one run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How many inputs are published over `publish_over`: at least this
    /// many, more when injecting the faults outlasts it (see [`Publisher`]).
    pub inputs: usize,
    /// How long publishing the inputs is spread over.
    pub publish_over: Duration,
    /// The faults' times, as fractions of `publish_over`: the first fault
    /// (stop_app) and the second (SIGKILL).
    pub fault_at: [f64; 2],
    /// How long node 0's application stays down.
    pub app_down: Duration,
    pub prefetch: u16,
    pub concurrency: usize,
    /// The hosts' `max_unconfirmed` (spelt out: the duplicates' bound is
    /// made of it).
    pub max_unconfirmed: usize,
    /// How long the inputs may take to be handled after the last one is
    /// published.
    pub done_within: Duration,
}

/// What one fault did to one host.
#[derive(Debug, Clone)]
pub struct HostEffect {
    /// "A" or "B".
    pub host: &'static str,
    /// Whether the host lost its connections in this fault's window.
    pub lost_connection: bool,
    /// From "connection lost" to consuming again.
    pub recovery: Option<Duration>,
    /// The node it reconnected to, by index.
    pub reconnected_to: Option<usize>,
}

/// One fault as it happened.
#[derive(Debug, Clone)]
pub struct FaultRow {
    pub label: String,
    /// When it was injected, seconds since the run's start.
    pub at: f64,
    /// Inputs acked by both hosts in the second before it.
    pub rate_before: f64,
    pub effects: Vec<HostEffect>,
}

/// Everything a run found.
#[derive(Debug)]
pub struct Report {
    pub settings: Settings,
    pub inputs: usize,
    /// Inputs the broker nacked and the publisher published again: if a
    /// nacked one was enqueued after all, it is there twice, and its
    /// outputs count as duplicates that are not the hosts' doing.
    pub republished: usize,
    pub outputs: usize,
    pub tally: Tally,
    pub dead_lettered: u32,
    /// Inputs each host acked (its `/metrics`), A then B.
    pub handled: [f64; 2],
    /// `None` for a host still running at the end; its exit status otherwise.
    pub exited: [Option<String>; 2],
    /// `/health` of each host at the end.
    pub health: [String; 2],
    pub rows: Vec<FaultRow>,
    /// Seconds from the start until every input was handled; `None` if
    /// they were not within [`Settings::done_within`].
    pub done: Option<f64>,
    /// The hosts' logs, A then B.
    pub logs: [String; 2],
}

impl Report {
    /// Duplicates allowed: for every fault, each host that lost its
    /// connections may handle again what it had in flight; and an input
    /// published again may have been there twice.
    pub fn duplicate_bound(&self) -> usize {
        let per_loss = usize::from(self.settings.prefetch) + self.settings.max_unconfirmed;
        let losses: usize = self
            .rows
            .iter()
            .map(|row| row.effects.iter().filter(|e| e.lost_connection).count())
            .sum();
        per_loss * losses + self.republished
    }

    /// The tally as a table, for a person.
    pub fn print(&self) {
        let s = &self.settings;
        println!(
            "cluster fault tally: {} inputs through two hosts on a 3-node cluster (quorum queues \
             on every node), stamp-v1, prefetch {}, concurrency {}, max_unconfirmed {}",
            self.inputs, s.prefetch, s.concurrency, s.max_unconfirmed
        );
        println!(
            "{:<34} {:>7} {:>12} {:>5} {:>13} {:>15}",
            "fault", "at (s)", "rate before", "host", "recovery (s)", "reconnected to"
        );
        for row in &self.rows {
            for (i, effect) in row.effects.iter().enumerate() {
                let (label, at, rate) = if i == 0 {
                    (
                        row.label.as_str(),
                        format!("{:.1}", row.at),
                        format!("{:.0} msg/s", row.rate_before),
                    )
                } else {
                    ("", String::new(), String::new())
                };
                let recovery = match (effect.lost_connection, effect.recovery) {
                    (false, _) => "unaffected".to_string(),
                    (true, Some(d)) => format!("{:.2}", d.as_secs_f64()),
                    (true, None) => "NOT BACK".to_string(),
                };
                let node = effect
                    .reconnected_to
                    .map_or("-".to_string(), |n| format!("node {n}"));
                println!(
                    "{label:<34} {at:>7} {rate:>12} {:>5} {recovery:>13} {node:>15}",
                    effect.host
                );
            }
        }
        let up = |i: usize| match &self.exited[i] {
            None => format!("up, /health {}", self.health[i]),
            Some(status) => format!("EXITED {status}"),
        };
        println!(
            "lost {} · duplicated {} (bound: (prefetch + max_unconfirmed) per host per fault that cut it, \
             + inputs published again after a nack ({}) = {}) \
             · dead-lettered {} · outputs {} · distinct inputs seen {} of {}",
            self.tally.lost.len(),
            self.tally.duplicated,
            self.republished,
            self.duplicate_bound(),
            self.dead_lettered,
            self.outputs,
            self.tally.distinct,
            self.inputs
        );
        println!(
            "host A handled {:.0} ({}) · host B handled {:.0} ({}) · all handled: {}",
            self.handled[0],
            up(0),
            self.handled[1],
            up(1),
            self.done.map_or("NO".to_string(), |at| format!(
                "yes, {at:.1} s after the start"
            )),
        );
        if !self.tally.lost.is_empty() {
            let first = &self.tally.lost[..self.tally.lost.len().min(10)];
            println!("lost inputs, the first of them: {first:?}");
        }
    }
}

/// One host of the run: its process and its admin endpoint.
struct RunHost {
    name: &'static str,
    process: HostProcess,
    admin: String,
}

impl RunHost {
    fn get(&self, path: &str) -> Result<String> {
        let (status, body) = http_get(&format!("http://{}{path}", self.admin))?;
        anyhow::ensure!(
            status == 200,
            "host {} GET {path}: {status}: {body}",
            self.name
        );
        Ok(body)
    }

    fn acked(&self, input: &str) -> f64 {
        self.get("/metrics").map_or(0.0, |m| {
            metric_sum(
                &m,
                "acemq_consume_total",
                &[("queue", input), ("outcome", "acked")],
            )
        })
    }

    fn in_flight(&self, input: &str) -> f64 {
        self.get("/metrics").map_or(f64::NAN, |m| {
            metric_sum(&m, "acemq_consume_in_flight", &[("queue", input)])
        })
    }

    fn health(&self) -> String {
        self.get("/health")
            .ok()
            .and_then(|body| serde_json::from_str::<Value>(&body).ok())
            .and_then(|h| h["status"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "unreachable".to_string())
    }
}

/// Publishes `inputs` through one node at a steady pace on a thread of its
/// own, over one connection in confirm mode; counts what was confirmed and
/// what had to be published again.
///
/// It goes on at the same pace past `inputs` until [`Publisher::finish`]:
/// injecting a fault takes as long as the broker's tools take, which on a
/// busy machine was once most of the publishing window, and a fault after
/// the last input lands on idle hosts, which is not the scenario (the run
/// counts whatever was published).
struct Publisher {
    published: Arc<AtomicUsize>,
    finishing: Arc<AtomicBool>,
    thread: JoinHandle<Result<usize>>,
}

impl Publisher {
    fn start(node: &Broker, queue: String, inputs: usize, over: Duration) -> Publisher {
        let (url, mgmt) = (node.amqp_url().to_owned(), node.mgmt_url().to_owned());
        let published = Arc::new(AtomicUsize::new(0));
        let finishing = Arc::new(AtomicBool::new(false));
        let slices = (over.as_secs_f64() / PUBLISH_EVERY.as_secs_f64()).max(1.0) as usize;
        let per_slice = inputs.div_ceil(slices).max(1);
        let thread = std::thread::spawn({
            let (published, finishing) = (published.clone(), finishing.clone());
            move || -> Result<usize> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let broker = Broker::external(&url, Some(&mgmt))?;
                runtime.block_on(async {
                    let connection = broker.connect().await?;
                    let channel = connection.create_channel().await?;
                    channel
                        .confirm_select(ConfirmSelectOptions::default())
                        .await?;
                    let start = Instant::now();
                    let (mut next, mut again) = (0, 0);
                    for slice in 0.. {
                        if next >= inputs && finishing.load(Ordering::Relaxed) {
                            break;
                        }
                        tokio::time::sleep_until((start + PUBLISH_EVERY * slice).into()).await;
                        let until = if next < inputs { inputs } else { usize::MAX };
                        let ids: Range<usize> = next..(next + per_slice).min(until);
                        again += publish_inputs_until_confirmed(&channel, &queue, ids.clone())
                            .await
                            .with_context(|| format!("publishing inputs {ids:?}"))?;
                        next = ids.end;
                        published.store(next, Ordering::Relaxed);
                    }
                    let _ = connection.close(200, "published".into()).await;
                    Ok(again)
                })
            }
        });
        Publisher {
            published,
            finishing,
            thread,
        }
    }

    /// Waits until every input is published (and stops the publishing
    /// past them): how many there are, and how many were published again
    /// after a nack.
    fn finish(self) -> Result<(usize, usize)> {
        self.finishing.store(true, Ordering::Relaxed);
        let again = self
            .thread
            .join()
            .map_err(|_| anyhow::anyhow!("the publisher panicked"))??;
        Ok((self.published.load(Ordering::Relaxed), again))
    }
}

/// A fault injected: when its calls were made, for reading the logs.
struct Injected {
    label: String,
    called: SystemTime,
    at: f64,
    rate_before: f64,
}

/// Runs the scenario on `cluster`, whose nodes must all be up (the run
/// leaves them so).
pub fn run(cluster: &Cluster, settings: &Settings) -> Result<Report> {
    anyhow::ensure!(cluster.nodes().len() == 3, "the scenario needs 3 nodes");
    let input = unique_name("cluster.in");
    let output = unique_name("cluster.out");
    let exchange = unique_name("cluster.x");
    let urls = cluster.amqp_urls();
    let host_config = |order: [usize; 3], admin: &str| {
        let list: Vec<String> = order.iter().map(|&i| format!("{:?}", urls[i])).collect();
        let broker = format!(
            "urls = [{}]\nnetwork_recovery_interval = \"1s\"\nrecovery_backoff_max = \"5s\"\nmax_unconfirmed = {}",
            list.join(", "),
            settings.max_unconfirmed
        );
        let host = format!("admin_listen = \"{admin}\"");
        // A call's outputs take their places among the unconfirmed at
        // once, so no consumer may publish more per call than that.
        let consumer = format!(
            "prefetch = {}\nconcurrency = {}\nmax_outputs = {}",
            settings.prefetch,
            settings.concurrency,
            settings.max_unconfirmed.min(1000)
        );
        StampConfig {
            broker: &broker,
            host: &host,
            input_queue: "dead_letter = true",
            consumer: &consumer,
            ..StampConfig::new(&input, &output, &exchange)
        }
        .toml()
    };
    let start_host = |name: &'static str, order: [usize; 3]| -> Result<RunHost> {
        let admin = format!("127.0.0.1:{}", free_port());
        let process = HostProcess::start(&host_config(order, &admin), 1)
            .with_context(|| format!("starting host {name}"))?;
        Ok(RunHost {
            name,
            process,
            admin,
        })
    };
    let mut hosts = [start_host("A", [0, 1, 2])?, start_host("B", [1, 2, 0])?];
    let calm = cluster.node(CALM_NODE);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let start = Instant::now();
    let start_wall = SystemTime::now();
    let publisher = Publisher::start(calm, input.clone(), settings.inputs, settings.publish_over);
    let acked = |hosts: &[RunHost; 2]| hosts.iter().map(|h| h.acked(&input)).sum::<f64>();
    let rate_now = |hosts: &[RunHost; 2]| {
        let before = acked(hosts);
        std::thread::sleep(Duration::from_secs(1));
        acked(hosts) - before
    };
    let mut injected = Vec::new();
    let over = settings.publish_over.as_secs_f64();

    // 1. node 0's application stopped, later started.
    sleep_until(start, over * settings.fault_at[0]);
    let rate_before = rate_now(&hosts);
    let called = SystemTime::now();
    let at = start.elapsed().as_secs_f64();
    cluster.stop_app(0)?;
    std::thread::sleep(settings.app_down);
    cluster.start_app(0)?;
    injected.push(Injected {
        label: format!(
            "node 0: stop_app, start_app after {} s",
            settings.app_down.as_secs()
        ),
        called,
        at,
        rate_before,
    });

    // 2. node 1 killed.
    sleep_until(start, over * settings.fault_at[1]);
    let rate_before = rate_now(&hosts);
    let called = SystemTime::now();
    let at = start.elapsed().as_secs_f64();
    cluster.kill(1);
    injected.push(Injected {
        label: "node 1: SIGKILL".to_string(),
        called,
        at,
        rate_before,
    });

    let result = (|| {
        let (inputs, again) = publisher.finish()?;
        let done = wait_until_done(&runtime, calm, &hosts, &input, &output, inputs, settings)?
            .map(|_| start.elapsed().as_secs_f64());
        Ok::<_, anyhow::Error>((inputs, again, done))
    })();
    // The cluster whole again, whatever happened.
    let restarted = cluster.restart(1);
    let (inputs, republished, done) = result?;
    restarted?;

    let outputs = runtime.block_on(drain_all(calm, &output))?;
    let dead_lettered = runtime.block_on(calm.message_count(&format!("{input}.dlq")))?;
    let handled = [hosts[0].acked(&input), hosts[1].acked(&input)];
    let health = [hosts[0].health(), hosts[1].health()];
    let mut exited = [None, None];
    for (i, host) in hosts.iter_mut().enumerate() {
        exited[i] = host.process.exited()?.map(|status| status.to_string());
    }
    let logs: Vec<HostLog> = hosts
        .iter()
        .map(|h| HostLog::new(&h.process.log_lines(), start_wall))
        .collect();
    let rows = injected
        .iter()
        .enumerate()
        .map(|(i, fault)| {
            let until = injected.get(i + 1).map(|next| next.called);
            let effects = hosts
                .iter()
                .zip(&logs)
                .map(|(host, log)| effect_on(host.name, log, fault.called, until, cluster))
                .collect();
            FaultRow {
                label: fault.label.clone(),
                at: fault.at,
                rate_before: fault.rate_before,
                effects,
            }
        })
        .collect();
    let report = Report {
        settings: settings.clone(),
        inputs,
        republished,
        outputs: outputs.len(),
        tally: Tally::of(&outputs, inputs),
        dead_lettered,
        handled,
        exited,
        health,
        rows,
        done,
        logs: [hosts[0].process.log_text(), hosts[1].process.log_text()],
    };
    for host in hosts {
        host.process.terminate(Duration::from_secs(30))?;
    }
    Ok(report)
}

fn sleep_until(start: Instant, seconds: f64) {
    let due = start + Duration::from_secs_f64(seconds);
    std::thread::sleep(due.saturating_duration_since(Instant::now()));
}

/// What a fault (from `called` until the next fault) did to one host, as
/// its log tells it.
fn effect_on(
    host: &'static str,
    log: &HostLog,
    called: SystemTime,
    until: Option<SystemTime>,
    cluster: &Cluster,
) -> HostEffect {
    let lost_connection = log.first(LOST, called, until).is_some();
    let recovery = lost_connection
        .then(|| log.span(LOST, SUBSCRIBED, called, until))
        .flatten();
    let reconnected_to = log
        .line(RECOVERED, called, until)
        .and_then(|line| node_of(&line, cluster));
    HostEffect {
        host,
        lost_connection,
        recovery,
        reconnected_to,
    }
}

/// The node a log line's `broker=` address names, by its AMQP port.
fn node_of(line: &str, cluster: &Cluster) -> Option<usize> {
    cluster
        .nodes()
        .iter()
        .position(|node| line.contains(&format!("127.0.0.1:{}", node.amqp_port())))
}

/// Waits until both hosts are done: the input queue empty, nothing in
/// flight, at least as many outputs as inputs (then a moment more for
/// duplicates). `Some(())` when done, `None` after the settings' limit.
fn wait_until_done(
    runtime: &tokio::runtime::Runtime,
    calm: &Broker,
    hosts: &[RunHost; 2],
    input: &str,
    output: &str,
    inputs: usize,
    settings: &Settings,
) -> Result<Option<()>> {
    let deadline = Instant::now() + settings.done_within;
    while Instant::now() < deadline {
        let ready = runtime.block_on(calm.message_count(input))?;
        let outputs = runtime.block_on(calm.message_count(output))?;
        let in_flight: f64 = hosts.iter().map(|h| h.in_flight(input)).sum();
        if ready == 0 && in_flight == 0.0 && outputs as usize >= inputs {
            std::thread::sleep(Duration::from_secs(1));
            return Ok(Some(()));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    if hosts.iter().any(|h| h.health() == "unreachable") {
        bail!("a host stopped answering on its admin endpoint");
    }
    Ok(None)
}
