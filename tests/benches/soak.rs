//! Soak (issue 25's acceptance): the host under steady load for a long
//! while, with broker faults at a fixed cadence, watched for lost work and
//! for memory that grows.
//!
//! ```text
//! scripts/build-plugins && cargo bench -p acemq-tests --bench soak
//! ACEMQ_SOAK_MINUTES=4 ACEMQ_SOAK_CLOSE_EVERY=1m cargo bench -p acemq-tests --bench soak
//! ```
//!
//! A throwaway RabbitMQ node of its own (the faults hit the whole broker,
//! so `ACEMQ_TEST_URL` is not used) and the `acemq-host` binary as a child
//! process, on the fault tally's pipeline ([`Pipeline`]): `stamp-v1`
//! consuming a quorum queue with dead-lettering (prefetch 100, concurrency
//! 4) and publishing, confirmed, to an exchange bound to a quorum output
//! queue. Inputs are 1 KiB JSON bodies with message ids `in-{n}`.
//!
//! 1. Capacity: `ACEMQ_SOAK_CAPACITY_INPUTS` inputs (20,000) are published
//!    at once and the host drains them; its capacity is its usual rate
//!    once they are all published (the median of its rates over 1 s).
//! 2. Soak: for `ACEMQ_SOAK_MINUTES` (20) a paced producer publishes at
//!    `ACEMQ_SOAK_LOAD` (0.7) of that capacity, while every
//!    `ACEMQ_SOAK_CLOSE_EVERY` (2m) `rabbitmqctl close_all_connections`
//!    cuts every connection (the host's, the producer's and the output
//!    reader's), and once, between two closes halfway through, a memory
//!    alarm is held for `ACEMQ_SOAK_ALARM` (10s). Every minute the host's
//!    resident set (`VmRSS` of `/proc/PID/status`) is read, with its
//!    rate, the backlog and the size of its `/metrics`.
//! 3. The producer stops; once the host has handled every input, the
//!    figures are printed.
//!
//! The producer keeps its schedule across the faults (what falls behind
//! during an outage is published when the broker is back) with publisher
//! confirms and at most [`PRODUCER_WINDOW`] unconfirmed. A publish the
//! broker nacks is published again; one whose confirm was lost with its
//! connection may have landed or not, so it is published again with an
//! attempt number in its body. Both are counted, and the tally tells an
//! input published twice that landed twice (not the host's doing) from an
//! input the host handled twice.
//!
//! A run this long makes millions of outputs, too many to keep, so a reader
//! consumes the output queue throughout and counts each output by the input
//! and publish it names ([`OutputCounter`]). Then:
//!
//! - lost: inputs without an output. Anything above 0 is a bug.
//! - duplicated: outputs of a publish of an input seen before: the host
//!   handled it again (at-least-once allows these, bounded by what was in
//!   flight at each loss: the prefetch plus the unconfirmed publishes).
//! - dead-lettered: the input's `.dlq`, which stays empty: no fault here is
//!   a message's fault.
//!
//! Targets: lost 0, and the resident set at the end within 10 % of the one
//! after the first 2 minutes (by then the pools, caches and buffers have
//! their working size; what grows after that grows with time). Prints a
//! table and the exact command, and writes the host's log to
//! `target/soak.log`. Asserts nothing: it fails only when it cannot set up.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use lapin::options::ConfirmSelectOptions;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Confirmation, PublisherConfirm};
use tokio::runtime::Runtime;

use acemq_tests::broker_faults::{BLOCKED, Fault, LOST, Timing, UNBLOCKED};
use acemq_tests::host::{HostProcess, SUBSCRIBED, host_binary, metric_sum, workspace_root};
use acemq_tests::machine::{cpu_seconds, cpus, load_average, rss_bytes};
use acemq_tests::tally::{
    HostLog, MAX_UNCONFIRMED, OutputCounter, PREFETCH, Pipeline, Sampler, Tally, input_attempt,
    publish_inputs,
};
use acemq_tests::{Broker, env_or};

/// Publishes the producer keeps waiting for a confirm.
const PRODUCER_WINDOW: usize = 500;
/// How often the producer looks at its schedule.
const PRODUCER_TICK: Duration = Duration::from_millis(10);
/// The output reader's prefetch.
const READER_PREFETCH: u16 = 500;
/// How long a client waits before reconnecting after a lost connection.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);
/// How long the producer, once stopped, may fail to reconnect before the
/// bench gives up on it.
const GIVE_UP_AFTER: Duration = Duration::from_secs(120);
/// How often the host's resident set is read and a row printed.
const ROW_EVERY: Duration = Duration::from_secs(60);
/// The resident set the end is held against: after this much of the soak.
const BASELINE_AFTER: Duration = Duration::from_secs(120);
/// The end's resident set may exceed the baseline by this fraction.
const RSS_GROWTH_TARGET: f64 = 0.10;
/// How long the capacity inputs may take to be handled, and at the end the
/// soak's, beyond twice the time the backlog takes at the host's capacity.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);

struct Settings {
    capacity_inputs: usize,
    load: f64,
    soak: Duration,
    close_every: Duration,
    alarm: Duration,
}

impl Settings {
    fn from_env() -> Result<Self> {
        let minutes: f64 = env_or("ACEMQ_SOAK_MINUTES", 20.0)?;
        let close_every: humantime::Duration =
            env_or("ACEMQ_SOAK_CLOSE_EVERY", Duration::from_secs(120).into())?;
        let alarm: humantime::Duration =
            env_or("ACEMQ_SOAK_ALARM", Duration::from_secs(10).into())?;
        let settings = Self {
            capacity_inputs: env_or("ACEMQ_SOAK_CAPACITY_INPUTS", 20_000)?,
            load: env_or("ACEMQ_SOAK_LOAD", 0.7)?,
            soak: Duration::from_secs_f64(minutes * 60.0),
            close_every: close_every.into(),
            alarm: alarm.into(),
        };
        if settings.close_every < Duration::from_secs(10) {
            bail!("ACEMQ_SOAK_CLOSE_EVERY: at least 10s (the host must be back between closes)");
        }
        if !(0.0..=1.0).contains(&settings.load) || settings.soak.is_zero() {
            bail!("ACEMQ_SOAK_LOAD is a fraction of 1 and ACEMQ_SOAK_MINUTES above 0");
        }
        Ok(settings)
    }

    /// The command that runs the bench again with these settings.
    fn command(&self) -> String {
        format!(
            "ACEMQ_SOAK_MINUTES={} ACEMQ_SOAK_CLOSE_EVERY={} ACEMQ_SOAK_ALARM={} \
             ACEMQ_SOAK_LOAD={} ACEMQ_SOAK_CAPACITY_INPUTS={} cargo bench -p acemq-tests --bench soak",
            self.soak.as_secs_f64() / 60.0,
            humantime::format_duration(self.close_every),
            humantime::format_duration(self.alarm),
            self.load,
            self.capacity_inputs,
        )
    }

    /// The faults, by their time since the soak's start: a close every
    /// `close_every` and the alarm halfway between the two closes nearest
    /// the middle (or halfway through a soak too short for two).
    fn schedule(&self) -> Vec<(Duration, &'static str, Fault)> {
        let mut faults: Vec<_> = (1..)
            .map(|k| self.close_every * k)
            .take_while(|at| *at < self.soak)
            .map(|at| (at, "close_all_connections", Fault::CloseConnections))
            .collect();
        let middle = self.soak / 2;
        let before =
            self.close_every * (middle.as_secs_f64() / self.close_every.as_secs_f64()) as u32;
        let alarm_at = if before + self.close_every < self.soak {
            before + self.close_every / 2
        } else {
            middle
        };
        let label = "memory alarm";
        faults.push((alarm_at, label, Fault::MemoryAlarm(self.alarm)));
        faults.sort_by_key(|(at, _, _)| *at);
        faults
    }

    /// When the baseline resident set is read, since the soak's start.
    fn baseline_after(&self) -> Duration {
        BASELINE_AFTER.min(self.soak / 2)
    }
}

fn main() -> Result<()> {
    // `cargo bench` passes `--bench`; there is nothing to filter.
    let settings = Settings::from_env()?;
    let load_at_start = load_average();
    println!(
        "soak: {} CPUs shared by broker, host and load; load average at the start {load_at_start}",
        cpus()
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    eprintln!("soak: starting a throwaway RabbitMQ node");
    let broker = Broker::start()?;
    let pipeline = Pipeline::new("soak");
    let mut host = HostProcess::start(&pipeline.host_config(&broker), 1)?;
    let start = Instant::now();
    let start_wall = SystemTime::now();
    let sampler = Sampler::start(&pipeline, start);
    let stop_reading = AtomicBool::new(false);
    let counter = Mutex::new(OutputCounter::default());
    let counted = AtomicUsize::new(0);
    let reader = OutputReader {
        broker: &broker,
        queue: &pipeline.output,
        stop: &stop_reading,
        counter: &counter,
        counted: &counted,
    };

    let outcome = std::thread::scope(|scope| -> Result<Outcome> {
        let reading = scope.spawn(|| reader.run());
        let run = || -> Result<Outcome> {
            let capacity =
                measure_capacity(&runtime, &broker, &pipeline, &sampler, &settings, start)?;
            let rate = capacity * settings.load;
            eprintln!("soak: capacity {capacity:.0} msg/s; soaking at {rate:.0} msg/s");
            let soak = soak(&runtime, &broker, &pipeline, &host, &settings, rate, start)?;
            let published = settings.capacity_inputs + soak.producer.inputs;
            let outputs = || Ok(counted.load(Ordering::Relaxed));
            let backlog = soak.rows.last().and_then(|row| row.backlog).unwrap_or(0);
            let drain_timeout =
                DRAIN_TIMEOUT + Duration::from_secs_f64(2.0 * f64::from(backlog) / capacity);
            let done = pipeline.wait_until_handled(
                &runtime,
                &broker,
                published,
                outputs,
                drain_timeout,
            )?;
            Ok(Outcome {
                capacity,
                rate,
                soak,
                published,
                done: done.map(|at| at - start),
                drain_timeout,
                rss_drained: rss_bytes(host.pid()).ok(),
                reader: ReaderCounts::default(),
            })
        };
        let outcome = run();
        // Stopped whether the run got through or not, or the scope would
        // wait for the reader for ever.
        stop_reading.store(true, Ordering::Relaxed);
        let reader_counts = reading
            .join()
            .map_err(|_| anyhow::anyhow!("the output reader panicked"))??;
        Ok(Outcome {
            reader: reader_counts,
            ..outcome?
        })
    })?;

    let samples = sampler.stop();
    let metrics = pipeline.admin_get("/metrics").unwrap_or_default();
    let tally = counter.into_inner().unwrap().tally(outcome.published);
    let dead_lettered = runtime.block_on(broker.message_count(&pipeline.dlq()))?;
    let log = HostLog::new(&host.log_lines(), start_wall);
    let report = Report {
        tally,
        dead_lettered,
        refused: metric_sum(&metrics, "acemq_publish_total", &[("outcome", "refused")]),
        exited: host.exited()?.map(|status| status.to_string()),
        faults: outcome
            .soak
            .faults
            .iter()
            .enumerate()
            .map(|(i, fault)| fault_row(&log, fault, outcome.soak.faults.get(i + 1)))
            .collect(),
        acked: samples.last().map_or(0.0, |sample| sample.acked),
        outcome,
    };
    report.print(&settings);
    println!(
        "load average at the end {} · CPU used by the bench itself (producer, reader) {:.0} s",
        load_average(),
        cpu_seconds(std::process::id()).unwrap_or(f64::NAN)
    );
    println!("command: {}", settings.command());
    // The host's metrics at the baseline and at the end, to compare where
    // its memory went should it grow.
    let soak = &report.outcome.soak;
    let baseline = soak.baseline.map(|i| &soak.rows[i]);
    for (name, row) in [("baseline", baseline), ("end", soak.rows.last())] {
        if let Some(metrics) = row.and_then(|row| row.metrics.as_ref()) {
            let path = workspace_root().join(format!("target/soak-metrics-{name}.txt"));
            std::fs::write(&path, metrics)?;
            println!("host metrics at the {name}: {}", path.display());
        }
    }
    let log_path = workspace_root().join("target/soak.log");
    std::fs::write(&log_path, host.log_text() + "\n")?;
    println!("host log: {}", log_path.display());
    host.terminate(Duration::from_secs(30))?;
    broker.stop()
}

/// Publishes the capacity inputs at once and returns the host's usual rate
/// from the moment they are all published until they are handled.
fn measure_capacity(
    runtime: &Runtime,
    broker: &Broker,
    pipeline: &Pipeline,
    sampler: &Sampler,
    settings: &Settings,
    start: Instant,
) -> Result<f64> {
    eprintln!(
        "soak: measuring the host's capacity on {} inputs",
        settings.capacity_inputs
    );
    runtime.block_on(publish_inputs(
        broker,
        &pipeline.input,
        0..settings.capacity_inputs,
    ))?;
    let published = start.elapsed();
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while runtime.block_on(broker.message_count(&pipeline.input))? > 0 {
        if Instant::now() > deadline {
            bail!("the host did not drain the capacity inputs within {DRAIN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let capacity = sampler.usual_rate(published..start.elapsed());
    if capacity <= 0.0 {
        bail!("no rate measured: the host drained the capacity inputs in under a second");
    }
    Ok(capacity)
}

/// What the soak phase saw.
struct Soak {
    rows: Vec<Row>,
    faults: Vec<Injected>,
    producer: ProducerCounts,
    /// When it began, since the bench's start.
    began: Duration,
    /// Of `rows`, the one the end is held against.
    baseline: Option<usize>,
}

/// One line of the minute table.
struct Row {
    /// Since the soak's start.
    at: Duration,
    rss: Option<u64>,
    /// CPU seconds the host has used so far.
    host_cpu: Option<f64>,
    /// Inputs the producer had published (confirmed) so far.
    confirmed: usize,
    /// Inputs the host had acked so far (all phases).
    acked: f64,
    /// Inputs ready in the input queue.
    backlog: Option<u32>,
    /// Lines of the host's `/metrics`: a series that grows without bound
    /// shows here.
    metric_lines: Option<usize>,
    load: String,
    /// The host's `/metrics` text, for what grew between two rows.
    metrics: Option<String>,
}

/// A fault as it happened.
struct Injected {
    label: &'static str,
    fault: Fault,
    /// Its time in the schedule, since the soak's start.
    at: Duration,
    timing: Result<Timing, String>,
}

/// Runs the producer and the faults for the soak's length, reading a row
/// every [`ROW_EVERY`].
fn soak(
    runtime: &Runtime,
    broker: &Broker,
    pipeline: &Pipeline,
    host: &HostProcess,
    settings: &Settings,
    rate: f64,
    start: Instant,
) -> Result<Soak> {
    let began = Instant::now();
    let stop = AtomicBool::new(false);
    let producer = Producer {
        broker,
        queue: &pipeline.input,
        first: settings.capacity_inputs,
        rate,
        began,
        stop: &stop,
        confirmed: AtomicUsize::new(0),
    };
    std::thread::scope(|scope| {
        let producing = scope.spawn(|| producer.run());
        let injecting = scope.spawn(|| {
            let mut injected = Vec::new();
            for (at, label, fault) in settings.schedule() {
                std::thread::sleep((began + at).saturating_duration_since(Instant::now()));
                eprintln!("soak: {label} at {:.0} s", at.as_secs_f64());
                let timing = fault.inject(broker).map_err(|e| format!("{e:#}"));
                injected.push(Injected {
                    label,
                    fault,
                    at,
                    timing,
                });
            }
            injected
        });
        // The soak's start, for the first minute's rates.
        let mut rows = vec![read_row(runtime, broker, pipeline, host, &producer, began)];
        let mut baseline = None;
        let mut next = began;
        loop {
            next += ROW_EVERY;
            let last = next >= began + settings.soak;
            let read_at = if last { began + settings.soak } else { next };
            // The baseline's own reading, if it falls between two rows.
            let wanted = began + settings.baseline_after();
            if baseline.is_none() && wanted < read_at {
                std::thread::sleep(wanted.saturating_duration_since(Instant::now()));
                rows.push(read_row(runtime, broker, pipeline, host, &producer, began));
                baseline = Some(rows.len() - 1);
            }
            std::thread::sleep(read_at.saturating_duration_since(Instant::now()));
            let row = read_row(runtime, broker, pipeline, host, &producer, began);
            print_progress(&row);
            rows.push(row);
            if baseline.is_none() && read_at >= wanted {
                baseline = Some(rows.len() - 1);
            }
            if last {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        let producer_counts = producing
            .join()
            .map_err(|_| anyhow::anyhow!("the producer panicked"))??;
        let faults = injecting
            .join()
            .map_err(|_| anyhow::anyhow!("the fault injector panicked"))?;
        Ok(Soak {
            rows,
            faults,
            producer: producer_counts,
            began: began - start,
            baseline,
        })
    })
}

fn read_row(
    runtime: &Runtime,
    broker: &Broker,
    pipeline: &Pipeline,
    host: &HostProcess,
    producer: &Producer,
    began: Instant,
) -> Row {
    let metrics = pipeline.admin_get("/metrics").ok();
    Row {
        at: began.elapsed(),
        rss: rss_bytes(host.pid()).ok(),
        host_cpu: cpu_seconds(host.pid()).ok(),
        confirmed: producer.confirmed.load(Ordering::Relaxed),
        acked: metrics.as_deref().map_or(f64::NAN, |m| pipeline.acked(m)),
        backlog: runtime.block_on(broker.message_count(&pipeline.input)).ok(),
        metric_lines: metrics.as_ref().map(|m| m.lines().count()),
        load: load_average(),
        metrics,
    }
}

fn print_progress(row: &Row) {
    eprintln!(
        "soak: {:>5.1} min: RSS {}, {} inputs published, {:.0} acked, backlog {}",
        row.at.as_secs_f64() / 60.0,
        mib(row.rss),
        row.confirmed,
        row.acked,
        row.backlog.map_or("?".to_string(), |b| b.to_string()),
    );
}

/// A paced producer of inputs `in-{first}` on: `rate` per second since
/// `began`, until `stop`, over a connection of its own that it opens again
/// whenever it is lost.
struct Producer<'a> {
    broker: &'a Broker,
    queue: &'a str,
    first: usize,
    rate: f64,
    began: Instant,
    stop: &'a AtomicBool,
    /// Inputs confirmed so far.
    confirmed: AtomicUsize,
}

/// What the producer did.
#[derive(Debug, Default)]
struct ProducerCounts {
    /// Inputs it published (each at least once): `in-{first}` on.
    inputs: usize,
    /// Publishes the broker nacked, published again.
    nacked: usize,
    /// Publishes whose confirm was lost with the connection, published again.
    unconfirmed_lost: usize,
    /// Connections it opened after the first.
    reconnects: usize,
}

/// A publish waiting for its confirm.
struct Pending {
    n: usize,
    attempt: u32,
    confirm: PublisherConfirm,
}

/// The producer's state across its connections.
#[derive(Default)]
struct Schedule {
    /// The next fresh input, counted from the producer's first.
    next: usize,
    /// Inputs to publish again, with their next attempt number, first.
    again: VecDeque<(usize, u32)>,
    counts: ProducerCounts,
}

impl Producer<'_> {
    fn run(&self) -> Result<ProducerCounts> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let mut schedule = Schedule::default();
            let mut stopped_at = None;
            while let Err(error) = self.session(&mut schedule).await {
                if self.stop.load(Ordering::Relaxed) {
                    let since = *stopped_at.get_or_insert_with(Instant::now);
                    if since.elapsed() > GIVE_UP_AFTER {
                        return Err(error.context("the producer could not finish publishing"));
                    }
                }
                eprintln!("soak: producer: {error:#}; reconnecting");
                schedule.counts.reconnects += 1;
                tokio::time::sleep(RECONNECT_AFTER).await;
            }
            schedule.counts.inputs = schedule.next;
            Ok(schedule.counts)
        })
    }

    /// Publishes on one connection until it is lost (an error) or the
    /// producer is stopped and everything it published is confirmed.
    async fn session(&self, schedule: &mut Schedule) -> Result<()> {
        let connection = self.broker.connect().await?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let mut window: VecDeque<Pending> = VecDeque::new();
        let result = self.publish_on(&channel, schedule, &mut window).await;
        // What is left waiting lost its confirm with the connection: it
        // may have landed or not, so it is published again, as a new attempt.
        for pending in window {
            schedule.counts.unconfirmed_lost += 1;
            schedule.again.push_back((pending.n, pending.attempt + 1));
        }
        if result.is_ok() {
            let _ = connection.close(200, "published".into()).await;
        }
        result
    }

    async fn publish_on(
        &self,
        channel: &Channel,
        schedule: &mut Schedule,
        window: &mut VecDeque<Pending>,
    ) -> Result<()> {
        loop {
            let stopping = self.stop.load(Ordering::Relaxed);
            let due = if stopping {
                schedule.next
            } else {
                (self.began.elapsed().as_secs_f64() * self.rate) as usize
            };
            while window.len() < PRODUCER_WINDOW {
                let (n, attempt) = match schedule.again.pop_front() {
                    Some(again) => again,
                    None if schedule.next < due => {
                        schedule.next += 1;
                        (self.first + schedule.next - 1, 0)
                    }
                    None => break,
                };
                let (body, properties) = input_attempt(n, attempt);
                let options = BasicPublishOptions::default();
                let published = channel
                    .basic_publish("".into(), self.queue.into(), options, &body, properties)
                    .await;
                match published {
                    Ok(confirm) => window.push_back(Pending {
                        n,
                        attempt,
                        confirm,
                    }),
                    Err(error) => {
                        // Whether any of it went out is unknown.
                        schedule.counts.unconfirmed_lost += 1;
                        schedule.again.push_back((n, attempt + 1));
                        return Err(error).context("publishing");
                    }
                }
            }
            let Some(front) = window.front_mut() else {
                if stopping && schedule.again.is_empty() {
                    return Ok(());
                }
                tokio::time::sleep(PRODUCER_TICK).await;
                continue;
            };
            let confirmation = match tokio::time::timeout(PRODUCER_TICK, &mut front.confirm).await {
                Err(_) => continue,
                Ok(confirmation) => confirmation.context("waiting for a confirm")?,
            };
            let pending = window.pop_front().expect("the front was there");
            match confirmation {
                Confirmation::Nack(_) => {
                    schedule.counts.nacked += 1;
                    schedule.again.push_back((pending.n, pending.attempt + 1));
                }
                Confirmation::Ack(_) | Confirmation::NotRequested => {
                    self.confirmed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Consumes the output queue until stopped, counting every output; opens
/// its connection again whenever it is lost.
struct OutputReader<'a> {
    broker: &'a Broker,
    queue: &'a str,
    stop: &'a AtomicBool,
    counter: &'a Mutex<OutputCounter>,
    /// Outputs counted so far.
    counted: &'a AtomicUsize,
}

/// What the output reader did.
#[derive(Debug, Default)]
struct ReaderCounts {
    /// Redeliveries of outputs already counted (their acks were lost with a
    /// connection).
    skipped: usize,
    reconnects: usize,
}

impl OutputReader<'_> {
    fn run(&self) -> Result<ReaderCounts> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let mut counts = ReaderCounts::default();
            while let Err(error) = self.session(&mut counts).await {
                if self.stop.load(Ordering::Relaxed) {
                    // Stopped while it was reconnecting: nothing left to read.
                    break;
                }
                eprintln!("soak: output reader: {error:#}; reconnecting");
                counts.reconnects += 1;
                tokio::time::sleep(RECONNECT_AFTER).await;
            }
            Ok(counts)
        })
    }

    async fn session(&self, counts: &mut ReaderCounts) -> Result<()> {
        let connection = self.broker.connect().await?;
        let channel = connection.create_channel().await?;
        channel
            .basic_qos(READER_PREFETCH, BasicQosOptions { global: false })
            .await?;
        let mut consumer = channel
            .basic_consume(
                self.queue.into(),
                "soak-reader".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        while !self.stop.load(Ordering::Relaxed) {
            let delivery =
                match tokio::time::timeout(Duration::from_millis(200), consumer.next()).await {
                    Err(_) => continue,
                    Ok(None) => bail!("the broker cancelled the output reader"),
                    Ok(Some(delivery)) => delivery.context("reading an output")?,
                };
            let counted = self
                .counter
                .lock()
                .unwrap()
                .record(&delivery.data, delivery.redelivered);
            if counted {
                self.counted.fetch_add(1, Ordering::Relaxed);
            } else if delivery.redelivered {
                counts.skipped += 1;
            }
            delivery.ack(BasicAckOptions::default()).await?;
        }
        let _ = connection.close(200, "read".into()).await;
        Ok(())
    }
}

/// A fault's line of the table, from the host's log (up to the `next`).
struct FaultRow {
    label: &'static str,
    at: Duration,
    /// The recovery (lost to consuming again) or the time publishing was
    /// blocked, or why neither was seen.
    effect: String,
}

fn fault_row(log: &HostLog, fault: &Injected, next: Option<&Injected>) -> FaultRow {
    let effect = match &fault.timing {
        Err(error) => format!("NOT injected: {error}"),
        Ok(timing) => {
            let until = next.and_then(|next| next.timing.as_ref().ok().map(|t| t.called));
            let (from, to) = if fault.fault.cuts_connections() {
                (LOST, SUBSCRIBED)
            } else {
                (BLOCKED, UNBLOCKED)
            };
            match log.span(from, to, timing.called, until) {
                Some(span) if fault.fault.cuts_connections() => {
                    format!("recovered in {:.2} s", span.as_secs_f64())
                }
                Some(span) => format!("publishing blocked {:.2} s", span.as_secs_f64()),
                None => format!("the host logged no {from:?} then {to:?}"),
            }
        }
    };
    FaultRow {
        label: fault.label,
        at: fault.at,
        effect,
    }
}

struct Outcome {
    capacity: f64,
    rate: f64,
    soak: Soak,
    /// Inputs published in all.
    published: usize,
    /// When every input was handled, since the bench's start.
    done: Option<Duration>,
    /// How long the inputs were waited for after the soak.
    drain_timeout: Duration,
    /// The resident set once everything was handled.
    rss_drained: Option<u64>,
    reader: ReaderCounts,
}

struct Report {
    outcome: Outcome,
    tally: Tally,
    dead_lettered: u32,
    refused: f64,
    exited: Option<String>,
    faults: Vec<FaultRow>,
    /// Inputs the host acked in all.
    acked: f64,
}

impl Report {
    fn print(&self, settings: &Settings) {
        let o = &self.outcome;
        let soak = &o.soak;
        println!(
            "\nsoak: {:.1} min at {:.0} msg/s ({:.0} % of the host's measured capacity, {:.0} msg/s), \
             stamp-v1, quorum queues, prefetch {PREFETCH}; host binary {}",
            settings.soak.as_secs_f64() / 60.0,
            o.rate,
            settings.load * 100.0,
            o.capacity,
            host_binary().display(),
        );
        println!(
            "| {:>6} | {:>9} | {:>12} | {:>13} | {:>12} | {:>7} | {:>14} | {:>16} |",
            "min",
            "RSS MiB",
            "published/s",
            "handled msg/s",
            "host CPU %",
            "backlog",
            "/metrics lines",
            "load average"
        );
        println!(
            "|{:->8}|{:->11}|{:->14}|{:->15}|{:->14}|{:->9}|{:->16}|{:->18}|",
            ":", ":", ":", ":", ":", ":", ":", ":"
        );
        let mut before: Option<&Row> = None;
        for (i, row) in soak.rows.iter().enumerate() {
            let per_second = |of: fn(&Row) -> Option<f64>| {
                let b = before?;
                Some((of(row)? - of(b)?) / (row.at - b.at).as_secs_f64())
            };
            let figure = |value: Option<f64>, scale: f64| {
                value.map_or("-".to_string(), |v| format!("{:.0}", v * scale))
            };
            let mark = if Some(i) == soak.baseline {
                " (baseline)"
            } else {
                ""
            };
            println!(
                "| {:>6.1} | {:>9} | {:>12} | {:>13} | {:>12} | {:>7} | {:>14} | {:>16} |{mark}",
                row.at.as_secs_f64() / 60.0,
                mib(row.rss),
                figure(per_second(|r| Some(r.confirmed as f64)), 1.0),
                figure(per_second(|r| Some(r.acked)), 1.0),
                figure(per_second(|r| r.host_cpu), 100.0),
                row.backlog.map_or("?".to_string(), |b| b.to_string()),
                row.metric_lines.map_or("?".to_string(), |l| l.to_string()),
                row.load,
            );
            before = Some(row);
        }
        println!("faults:");
        for fault in &self.faults {
            println!(
                "  {:>6.1} s  {:<22} {}",
                fault.at.as_secs_f64(),
                fault.label,
                fault.effect
            );
        }
        let p = &soak.producer;
        let losses = self
            .faults
            .iter()
            .filter(|f| f.label == "close_all_connections")
            .count();
        let per_loss = usize::from(PREFETCH) + MAX_UNCONFIRMED;
        println!(
            "inputs {} ({} for the capacity, {} in the soak) · host acked {:.0} · producer: \
             {} nacked and {} unconfirmed at a loss published again, {} reconnects · \
             output reader: {} redeliveries skipped, {} reconnects",
            o.published,
            settings.capacity_inputs,
            p.inputs,
            self.acked,
            p.nacked,
            p.unconfirmed_lost,
            p.reconnects,
            o.reader.skipped,
            o.reader.reconnects,
        );
        println!(
            "lost {} · duplicated {} (bound: prefetch + max_unconfirmed per loss = {per_loss} × {losses} = {}) \
             · published twice by the producer, both landed {} · refused by the host {} · dead-lettered {} \
             · host up throughout: {}",
            self.tally.lost.len(),
            self.tally.duplicated,
            per_loss * losses,
            self.tally.published_twice,
            self.refused,
            self.dead_lettered,
            match &self.exited {
                None => "yes".to_string(),
                Some(status) => format!("NO, it exited: {status}"),
            },
        );
        println!(
            "all handled: {}",
            match o.done {
                Some(at) => format!(
                    "yes, {:.1} s after the soak ended",
                    (at - soak.began).as_secs_f64() - settings.soak.as_secs_f64()
                ),
                None => format!(
                    "NO, not within {:.0} s of the soak's end: lost counts inputs not handled yet",
                    o.drain_timeout.as_secs_f64()
                ),
            }
        );
        if !self.tally.lost.is_empty() {
            let first = &self.tally.lost[..self.tally.lost.len().min(10)];
            println!("lost inputs, the first of them: {first:?}");
        }
        println!("targets:");
        let lost = self.tally.lost.len();
        println!(
            "  lost 0: {lost}, {}",
            if lost == 0 { "met" } else { "NOT met" }
        );
        let baseline = soak.baseline.and_then(|i| soak.rows[i].rss);
        let end = soak.rows.last().and_then(|row| row.rss);
        match (baseline, end) {
            (Some(baseline), Some(end)) => {
                let growth = end as f64 / baseline as f64 - 1.0;
                println!(
                    "  RSS at the end within {:.0} % of the RSS after {:.0} s: {} → {} ({:+.1} %), {}; \
                     after the drain {}",
                    RSS_GROWTH_TARGET * 100.0,
                    settings.baseline_after().as_secs_f64(),
                    mib(Some(baseline)),
                    mib(Some(end)),
                    growth * 100.0,
                    if growth <= RSS_GROWTH_TARGET {
                        "met"
                    } else {
                        "NOT met"
                    },
                    mib(o.rss_drained),
                );
            }
            _ => println!("  RSS: not read (the host's /proc entry was gone)"),
        }
    }
}

/// Bytes as MiB, one decimal; `?` when unknown.
fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("?".to_string(), |b| {
        format!("{:.1}", b as f64 / (1024.0 * 1024.0))
    })
}
