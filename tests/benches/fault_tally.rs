//! Fault tally (issue 17's acceptance): what broker faults under load cost
//! the host, in messages and in time.
//!
//! ```text
//! scripts/build-plugins && cargo bench -p acemq-tests --bench fault_tally
//! ACEMQ_TALLY_INPUTS=50000 cargo bench -p acemq-tests --bench fault_tally
//! ```
//!
//! A throwaway RabbitMQ node of its own (the faults hit the whole broker,
//! so `ACEMQ_TEST_URL` is not used) and the `acemq-host` binary as a child
//! process: `stamp-v1` consuming a quorum queue with dead-lettering
//! (prefetch 100, concurrency 4) and publishing, confirmed, to an exchange
//! bound to an output queue. `ACEMQ_TALLY_INPUTS` inputs (20,000; 1 KiB
//! JSON, message ids `in-{i}`) are published, then the faults of
//! [`SCHEDULE`] are injected one at a time, each once the host is back from
//! the one before: `rabbitmqctl close_all_connections` three times, a 5 s
//! memory alarm and a restart of the broker's application.
//!
//! Every fault must land while messages flow. How fast the host drains
//! 20,000 depends on the machine, and `rabbitmqctl` boots an Erlang VM
//! before it acts (seconds, on a busy machine), so before each fault the
//! input backlog is topped up to cover the CLI's start-up and
//! [`BACKLOG_SECONDS`] more at the host's usual rate. Top-ups happen only
//! between faults, on a healthy broker, so no input is ever published twice
//! and every duplicate counted below is the host's.
//!
//! The host's `/metrics` (served by the host, untouched by broker faults)
//! is read every 250 ms; inputs acked per interval make the timeline. At the
//! end the output queue is drained and tallied:
//!
//! - lost: inputs without an output (by the `input_id` in each stamped
//!   body). Anything above 0 is a bug: the host acks an input only once its
//!   outputs are confirmed.
//! - duplicated: outputs of an input seen before (`stamp-v1` makes one
//!   output per input, its id derived from the input's), so an input
//!   handled again (redelivered after a loss) counts once more. At-least-once allows these; they
//!   are bounded by what was in flight at a loss: the prefetch plus the
//!   unconfirmed publishes.
//! - refused: publishes the host declined while its publish connection was
//!   down or blocked; the host holds those inputs and publishes their
//!   outputs once the connection is back, without counting an attempt.
//! - dead-lettered: the input's `.dlq`, which stays empty: no fault here is
//!   a message's fault.
//!
//! And per fault, from the host's log: when it took effect (the host's
//! connections lost, or its publishing blocked), the host's rate in the
//! second before (above 0: the fault landed while messages flowed) and the
//! recovery, from "connection lost; recovering" to the next "consuming"
//! (its subscription back).
//!
//! The host's recovery settings are [`Pipeline::host_config`]'s.
//!
//! Prints a table and writes the timeline, faults marked, to
//! `target/fault-tally.svg`, and the host's log beside it. Asserts nothing:
//! it fails only when it cannot set up.

use std::ops::Range;
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use plotters::prelude::*;
use serde_json::Value;
use tokio::runtime::Runtime;

use acemq_tests::broker_faults::{BLOCKED, Fault, LOST, Timing, UNBLOCKED};
use acemq_tests::host::{HostProcess, SUBSCRIBED, metric_sum, workspace_root};
use acemq_tests::tally::{
    HostLog, MAX_UNCONFIRMED, PREFETCH, Pipeline, SAMPLE_EVERY, Sample, Sampler, Tally,
    count_lines, drain_all, publish_inputs,
};
use acemq_tests::{Broker, env_or, median};

/// Work that each fault finds left once it is in effect, in seconds at the
/// host's usual rate: enough to keep it busy through the fault and its
/// recovery.
const BACKLOG_SECONDS: f64 = 5.0;
/// The top-up's floor, should no rate be known yet.
const MIN_BACKLOG: usize = 2_000;
/// How long the host may take to come back from one fault.
const BACK_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the inputs may take to be done after the last fault.
const DONE_TIMEOUT: Duration = Duration::from_secs(240);

/// One fault of the schedule.
struct Step {
    label: &'static str,
    fault: Fault,
    /// How long the host works undisturbed before this fault (after the
    /// inputs are published, or once it is back from the fault before).
    settle: Duration,
}

/// The faults, in order, about 2-3 s apart once the host is back from each.
const SCHEDULE: [Step; 5] = [
    Step {
        label: "close_all_connections #1",
        fault: Fault::CloseConnections,
        settle: Duration::from_secs(2),
    },
    Step {
        label: "close_all_connections #2",
        fault: Fault::CloseConnections,
        settle: Duration::from_millis(2500),
    },
    Step {
        label: "close_all_connections #3",
        fault: Fault::CloseConnections,
        settle: Duration::from_millis(2500),
    },
    Step {
        label: "memory alarm (5 s)",
        fault: Fault::MemoryAlarm(Duration::from_secs(5)),
        settle: Duration::from_millis(2500),
    },
    Step {
        label: "broker app restart",
        fault: Fault::Restart(Duration::from_secs(2)),
        settle: Duration::from_millis(2500),
    },
];

/// A fault as it happened.
struct Injected {
    step: &'static Step,
    timing: Timing,
    /// Whether the host was back (subscribed, `/health` UP) within
    /// [`BACK_TIMEOUT`].
    back: bool,
}

fn main() -> Result<()> {
    // `cargo bench` passes `--bench`; there is nothing to filter.
    let preload: usize = env_or("ACEMQ_TALLY_INPUTS", 20_000)?;
    let mut run = Run::start()?;
    let sampler = Sampler::start(&run.names, run.start);
    eprintln!("fault_tally: publishing {preload} inputs");
    run.publish(preload)?;
    let mut injected = Vec::new();
    for step in &SCHEDULE {
        std::thread::sleep(step.settle);
        let seconds = run.cli_latency.as_secs_f64() + BACKLOG_SECONDS;
        run.top_up(
            ((sampler.usual_rate(Duration::ZERO..Duration::MAX) * seconds) as usize)
                .max(MIN_BACKLOG),
        )?;
        injected.push(run.inject(step)?);
    }
    let done = run.wait_until_done()?;
    let samples = sampler.stop();
    let report = run.report(preload, &injected, &samples, done)?;
    report.print();

    let chart = workspace_root().join("target/fault-tally.svg");
    draw_timeline(&chart, &timeline(&samples), &report.rows, &run.publishing)?;
    println!("timeline: {}", chart.display());
    // The host's own account of each fault, for whoever reads the figures.
    let log = chart.with_extension("log");
    std::fs::write(&log, run.host.log_text() + "\n")?;
    println!("host log: {}", log.display());
    run.host.terminate(Duration::from_secs(30))?;
    run.broker.stop()
}

/// The broker, the host and the inputs published so far.
struct Run {
    runtime: Runtime,
    broker: Broker,
    names: Pipeline,
    host: HostProcess,
    /// The bench's clock starts once the host consumes (and the CLI was
    /// timed)...
    start: Instant,
    /// ... at this time on the wall clock.
    start_wall: SystemTime,
    /// Inputs published so far: `in-0` to `in-{published - 1}`.
    published: usize,
    /// The longest a `rabbitmqctl` call took to act so far.
    cli_latency: Duration,
    /// When the bench was publishing inputs, in seconds since the start:
    /// the host slows down meanwhile (broker, bench and host share the
    /// machine's cores), which the chart must not pass off as a fault's doing.
    publishing: Vec<Range<f64>>,
}

impl Run {
    fn start() -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        eprintln!("fault_tally: starting a throwaway RabbitMQ node");
        let broker = Broker::start()?;
        let names = Pipeline::new("tally");
        let host = HostProcess::start(&names.host_config(&broker), 1)?;
        // A harmless call, for a first idea of how long the CLI takes here.
        let probe = Instant::now();
        broker.rabbitmqctl(&["list_vhosts"])?;
        Ok(Self {
            runtime,
            broker,
            names,
            host,
            start: Instant::now(),
            start_wall: SystemTime::now(),
            published: 0,
            cli_latency: probe.elapsed(),
            publishing: Vec::new(),
        })
    }

    /// Publishes `count` more inputs.
    fn publish(&mut self, count: usize) -> Result<()> {
        let ids = self.published..self.published + count;
        let from = self.start.elapsed().as_secs_f64();
        self.runtime
            .block_on(publish_inputs(&self.broker, &self.names.input, ids))?;
        self.publishing
            .push(from..self.start.elapsed().as_secs_f64());
        self.published += count;
        Ok(())
    }

    /// Inputs ready in the input queue.
    fn backlog(&self) -> Result<u32> {
        self.runtime
            .block_on(self.broker.message_count(&self.names.input))
    }

    /// Publishes inputs until at least `target` are waiting.
    fn top_up(&mut self, target: usize) -> Result<()> {
        let ready = self.backlog()? as usize;
        if ready < target {
            self.publish(target - ready)?;
        }
        Ok(())
    }

    /// Injects the fault of `step` and waits for the host to be back.
    fn inject(&mut self, step: &'static Step) -> Result<Injected> {
        let subscriptions = count_lines(&self.host.log_lines(), SUBSCRIBED);
        eprintln!(
            "fault_tally: {} ({} inputs waiting)",
            step.label,
            self.backlog()?
        );
        let timing = step.fault.inject(&self.broker)?;
        let took = timing.began.duration_since(timing.called)?;
        self.cli_latency = self.cli_latency.max(took);
        let back = self.wait_until_back(step.fault, subscriptions);
        Ok(Injected { step, timing, back })
    }

    /// Waits until the host is back from `fault`: subscribed again (a
    /// `consuming` line beyond the `subscriptions` before it) when
    /// connections were cut, and `/health` UP. False after [`BACK_TIMEOUT`].
    fn wait_until_back(&mut self, fault: Fault, subscriptions: usize) -> bool {
        let deadline = Instant::now() + BACK_TIMEOUT;
        if fault.cuts_connections()
            && let Err(error) = self
                .host
                .wait_for_log(SUBSCRIBED, subscriptions + 1, BACK_TIMEOUT)
        {
            eprintln!("fault_tally: {error:#}");
            return false;
        }
        while Instant::now() < deadline {
            let health = self.names.admin_get("/health").ok();
            let health = health.and_then(|body| serde_json::from_str::<Value>(&body).ok());
            if health.is_some_and(|h| h["status"] == "UP") {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// Waits until every input is handled (see
    /// [`Pipeline::wait_until_handled`]): when, since the start, or `None`
    /// after [`DONE_TIMEOUT`].
    fn wait_until_done(&self) -> Result<Option<Duration>> {
        let outputs = || {
            let count = self.broker.message_count(&self.names.output);
            Ok(self.runtime.block_on(count)? as usize)
        };
        let done = self.names.wait_until_handled(
            &self.runtime,
            &self.broker,
            self.published,
            outputs,
            DONE_TIMEOUT,
        )?;
        Ok(done.map(|at| at - self.start))
    }

    /// Tallies the outputs and the dead letters, reads the host's metrics
    /// and log, and notes whether it is still running.
    fn report(
        &mut self,
        preload: usize,
        injected: &[Injected],
        samples: &[Sample],
        done: Option<Duration>,
    ) -> Result<Report> {
        let exited = self.host.exited()?;
        let metrics = self.names.admin_get("/metrics").unwrap_or_default();
        let outputs = self
            .runtime
            .block_on(drain_all(&self.broker, &self.names.output))?;
        let dead_lettered = self
            .runtime
            .block_on(self.broker.message_count(&self.names.dlq()))?;
        let log = HostLog::new(&self.host.log_lines(), self.start_wall);
        let rows = injected
            .iter()
            .enumerate()
            .map(|(i, fault)| fault_row(&log, fault, injected.get(i + 1), samples))
            .collect();
        Ok(Report {
            inputs: self.published,
            preload,
            tally: Tally::of(&outputs, self.published),
            outputs: outputs.len(),
            refused: metric_sum(&metrics, "acemq_publish_total", &[("outcome", "refused")]),
            dead_lettered,
            exited,
            losses_logged: log.count(LOST),
            rows,
            done,
        })
    }
}

/// The host's rate (inputs acked per second) over the second before `at`,
/// in seconds since the start.
fn rate_before(samples: &[Sample], at: f64) -> f64 {
    let last_at = |t: f64| samples.iter().rev().find(|s| s.at.as_secs_f64() <= t);
    match (last_at(at - 1.0), last_at(at)) {
        (Some(from), Some(to)) if to.at > from.at => {
            (to.acked - from.acked) / (to.at - from.at).as_secs_f64()
        }
        _ => 0.0,
    }
}

/// Inputs acked per [`SAMPLE_EVERY`] against seconds since the start,
/// scaled to the interval when a read was missed.
fn timeline(samples: &[Sample]) -> Vec<(f64, f64)> {
    samples
        .windows(2)
        .map(|w| {
            let span = (w[1].at - w[0].at).as_secs_f64();
            let per_interval = (w[1].acked - w[0].acked) * SAMPLE_EVERY.as_secs_f64() / span;
            (w[1].at.as_secs_f64(), per_interval)
        })
        .collect()
}

/// What `fault` did, as the host logged it (up to the `next` fault).
fn fault_row(log: &HostLog, fault: &Injected, next: Option<&Injected>, samples: &[Sample]) -> Row {
    let Timing {
        called,
        began,
        ended,
    } = fault.timing;
    let until = next.map(|next| next.timing.called);
    let kind = fault.step.fault;
    // The host's own line is exact; the CLI's return comes later.
    let felt = log.first(kind.felt_as(), called, until).unwrap_or(began);
    let recovery = kind
        .cuts_connections()
        .then(|| log.span(LOST, SUBSCRIBED, called, until))
        .flatten();
    let lasted = ended
        .duration_since(began)
        .unwrap_or_default()
        .as_secs_f64();
    let note = match kind {
        Fault::CloseConnections => String::new(),
        Fault::MemoryAlarm(_) => {
            let blocked = match log.span(BLOCKED, UNBLOCKED, called, until) {
                Some(d) => format!("publishing blocked {:.2} s", d.as_secs_f64()),
                None => "the host logged no block".to_string(),
            };
            format!("alarm on {lasted:.1} s; {blocked}")
        }
        Fault::Restart(_) => {
            let back = log.first(SUBSCRIBED, ended, None);
            let back = back.and_then(|at| at.duration_since(ended).ok());
            let back = back.map_or("never".to_string(), |d| format!("{:.2} s", d.as_secs_f64()));
            format!("app down {lasted:.1} s; subscribed {back} after start_app returned")
        }
    };
    Row {
        label: fault.step.label,
        at: log.secs(felt),
        until: log.secs(ended).max(log.secs(felt)),
        rate_before: rate_before(samples, log.secs(felt)),
        recovery,
        note,
        back: fault.back,
    }
}

/// One fault's line of the table and mark on the chart.
struct Row {
    label: &'static str,
    /// When the host felt the fault (its connections lost, its publishing
    /// blocked), or else when the call returned; seconds since the start.
    at: f64,
    /// When the fault was over (its last call returned).
    until: f64,
    /// The host's rate in the second before `at`, inputs per second.
    rate_before: f64,
    /// "connection lost; recovering" to "consuming", for a lost connection.
    recovery: Option<Duration>,
    /// What the recovery column does not say: how long an alarm was on and
    /// blocked the host, how long the application was down and how soon
    /// the host was back once it was up.
    note: String,
    back: bool,
}

/// Everything the bench prints.
struct Report {
    inputs: usize,
    /// Of `inputs`, those published before the faults.
    preload: usize,
    tally: Tally,
    outputs: usize,
    refused: f64,
    dead_lettered: u32,
    /// `None`: the host never exited.
    exited: Option<ExitStatus>,
    losses_logged: usize,
    rows: Vec<Row>,
    /// When every input was handled, since the start.
    done: Option<Duration>,
}

impl Report {
    fn print(&self) {
        println!(
            "fault tally: {} inputs ({} before the faults, {} topped up between them), \
             quorum queue, stamp-v1, prefetch {PREFETCH}",
            self.inputs,
            self.preload,
            self.inputs - self.preload
        );
        println!(
            "{:<26} {:>7} {:>13} {:>13}",
            "fault", "at (s)", "rate before", "recovery (s)"
        );
        for row in &self.rows {
            let recovery = row
                .recovery
                .map_or("-".to_string(), |d| format!("{:.2}", d.as_secs_f64()));
            let line = format!(
                "{:<26} {:>7.1} {:>7.0} msg/s {:>13}   {}",
                row.label, row.at, row.rate_before, recovery, row.note
            );
            println!("{}", line.trim_end());
        }
        self.print_totals();
        for row in self.rows.iter().filter(|row| !row.back) {
            let within = BACK_TIMEOUT.as_secs();
            println!("the host was not back within {within} s of: {}", row.label);
        }
    }

    fn print_totals(&self) {
        let losses = self
            .rows
            .iter()
            .filter(|row| row.recovery.is_some())
            .count();
        let per_loss = usize::from(PREFETCH) + MAX_UNCONFIRMED;
        println!(
            "lost {} · duplicated {} (bound: prefetch + max_unconfirmed per loss = {per_loss} × {losses} = {}) \
             · refused {} · dead-lettered {} · host up throughout: {}",
            self.tally.lost.len(),
            self.tally.duplicated,
            per_loss * losses,
            self.refused,
            self.dead_lettered,
            match self.exited {
                None => "yes".to_string(),
                Some(status) => format!("NO, it exited: {status}"),
            },
        );
        let mut seconds: Vec<f64> = self
            .rows
            .iter()
            .filter_map(|row| Some(row.recovery?.as_secs_f64()))
            .collect();
        println!("recovery median: {:.2} s", median(&mut seconds));
        println!(
            "outputs {} · distinct inputs seen {} of {} · connection losses logged {} · all handled: {}",
            self.outputs,
            self.tally.distinct,
            self.inputs,
            self.losses_logged,
            match self.done {
                Some(at) => format!("yes, {:.1} s after the start", at.as_secs_f64()),
                None => format!(
                    "NO, not within {} s of the last fault",
                    DONE_TIMEOUT.as_secs()
                ),
            },
        );
        if !self.tally.lost.is_empty() {
            let first = &self.tally.lost[..self.tally.lost.len().min(10)];
            println!("lost inputs, the first of them: {first:?}");
        }
    }
}

/// Draws the inputs handled per interval against time as an SVG file,
/// each fault a labelled vertical line where the host felt it and a red
/// band until it was over, and the bench `publishing` inputs in grey.
fn draw_timeline(
    path: &Path,
    points: &[(f64, f64)],
    faults: &[Row],
    publishing: &[Range<f64>],
) -> Result<()> {
    let x_max = points.last().map_or(1.0, |(at, _)| *at).max(1.0);
    let y_max = points.iter().map(|(_, n)| *n).fold(1.0, f64::max) * 1.25;
    let per = format!("inputs handled per {} ms", SAMPLE_EVERY.as_millis());
    let root = SVGBackend::new(path, (1200, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("fault tally: {per} (grey: the bench publishing inputs)"),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the host started consuming")
        .y_desc(per)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    chart.draw_series(publishing.iter().map(|span| {
        Rectangle::new(
            [(span.start, 0.0), (span.end, y_max)],
            BLACK.mix(0.08).filled(),
        )
    }))?;
    for (i, fault) in faults.iter().enumerate() {
        chart.draw_series(std::iter::once(Rectangle::new(
            [(fault.at, 0.0), (fault.until, y_max)],
            RED.mix(0.08).filled(),
        )))?;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(fault.at, 0.0), (fault.at, y_max)],
            RED,
        )))?;
        // Staggered, so that the labels of faults close together stay apart.
        let height = y_max * (0.97 - 0.05 * (i % 3) as f64);
        chart.draw_series(std::iter::once(Text::new(
            fault.label,
            (fault.at, height),
            ("sans-serif", 13).into_font().color(&RED),
        )))?;
    }
    chart.draw_series(LineSeries::new(points.iter().copied(), &BLUE))?;
    root.present()?;
    Ok(())
}
