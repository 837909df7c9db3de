//! End to end: the host against the best bare lapin consumers doing the same
//! work, at the same prefetch, on the same broker (docs/targets.md,
//! Performance).
//!
//! ```text
//! scripts/build-plugins && cargo bench -p acemq-tests --bench end_to_end
//! ACEMQ_BENCH_MESSAGES=5000 ACEMQ_BENCH_TRANSFORM_MESSAGES=3000 ACEMQ_BENCH_ROUNDS=1 \
//!     cargo bench -p acemq-tests --bench end_to_end
//! ```
//!
//! A throwaway RabbitMQ node is started (or `ACEMQ_TEST_URL` is used). Each
//! round runs eleven consumers, each as a `loadgen` child process draining a
//! fresh quorum queue that `loadgen publish` filled with persistent 1 KiB
//! messages, every consumer at the same prefetch (200):
//!
//! 1. `consume-bare -A 20`: a bare lapin loop acking with `multiple` every
//!    20 messages, acks pipelined. The baseline of the consume-only target:
//!    the best bare consumer (a per-message ack costs lapin far more CPU than
//!    the message itself).
//! 2. `consume-bare -A 1`: the same with an ack per message, pipelined (not
//!    awaited one by one). Shown for comparison, scored against (1).
//! 3. `consume-host` with the `echo` (no-op) plugin, at the host's default
//!    concurrency (`ACEMQ_BENCH_CONCURRENCY` overrides it), and the same
//!    on one runtime worker (`[host] worker_threads = 1`), for reference.
//! 4. `consume-bare --transform-to X -A 20 --envelope`: consume -> stamp
//!    (JSON) -> publish on one confirm channel -> pipelined confirms -> a
//!    `multiple` ack per 20 confirmed inputs, with no wait on any one
//!    publish's write (each publish and its confirm is one future, polled
//!    beside the others in publish order). The baseline of the transform
//!    target. Each output carries the AceMQ envelope the host writes on its
//!    outputs (six `x-acemq-*` headers and a message id, built by the host
//!    library's envelope code): the contract requires them, so a bare loop
//!    doing the host's work puts the same messages on the wire.
//! 5. The same without the envelope, for reference: the envelope's headers
//!    cost the broker and lapin about a quarter of this path's rate on a
//!    2-core machine, and this row shows it beside the others.
//! 6. The same as (4), publishing on a connection of its own
//!    (`--publish-connection`), for reference: the host publishes on a
//!    connection apart from its consumers' (during a resource alarm
//!    RabbitMQ blocks a publishing connection whole, acks included), and
//!    this row shows what the second connection costs a bare loop.
//! 7. `consume-host --transform-to X`: the same through the host and the
//!    `stamp-v1` plugin.
//! 8. to 10. The order router end to end, in Rust, Python and JavaScript
//!    (`plugins/order-router`, `-py`, `-js`): `consume-host` on a queue of
//!    valid JSON orders (`loadgen publish --orders`, about 60 bytes each),
//!    each parsed, an `order.accepted` event published and confirmed, the
//!    order acked. The Rust router is the baseline of the other two.
//!
//! The order is reversed every other round, so that drift (broker WAL, page
//! cache, other load) cancels out. The headline figures are each consumer's
//! steady span, from 10 % to 90 % of its messages acked (leaving out
//! connecting, plugin loading and the tail): its rate, and its CPU per
//! message from its own getrusage, split into lapin's I/O threads (one per
//! connection: socket reads, frame parsing and writing) and the rest, the
//! runtime's workers, where the host's own work runs, and its allocations
//! per message (every thread's; exact, where CPU is noisy). Each is also shown
//! as a ratio to its baseline in the same round, and beside it the whole
//! consume span (connect to last ack) and the child's whole-process CPU
//! from `wait4` (start-up, plugin load and shutdown included). Each round
//! prints a table, then a table of the medians over the rounds, then the
//! targets, on the medians:
//!
//! - host + echo >= 1.0x the bare multi-ack consumer's msg/s, at <= 1.1x its
//!   CPU per message;
//! - host transform >= 1.0x the bare transform loop's msg/s, at <= 1.1x its
//!   CPU per message;
//! - the Python order router >= 0.6x the Rust one's msg/s.
//!
//! Settings (environment): `ACEMQ_BENCH_MESSAGES` (50000, consume only),
//! `ACEMQ_BENCH_TRANSFORM_MESSAGES` (30000), `ACEMQ_BENCH_SIZE` bytes (1024),
//! `ACEMQ_BENCH_CONFIRM` window of the publisher filling the queues (500),
//! `ACEMQ_BENCH_PREFETCH` (200), `ACEMQ_BENCH_ROUNDS` (3),
//! `ACEMQ_BENCH_CONCURRENCY` of the host consumers (unset or 0: the host's
//! default), `ACEMQ_BENCH_QUEUE_TYPE` (quorum), `ACEMQ_BENCH_MULTI_ACK` (20,
//! the bare loops' `-A`), `ACEMQ_BENCH_TRANSFORM` (1; 0 leaves out (4) to
//! (7)), `ACEMQ_BENCH_ROUTER_MESSAGES` (20000), `ACEMQ_BENCH_ROUTERS` (1; 0
//! leaves out (8) to (10)).
//!
//! Prints figures and asserts nothing: broker and clients share the
//! machine's cores (its load average is printed at the start and the end),
//! so expect ±20 % between runs; compare the medians.

use acemq_tests::{env_or, loadgen_result, median};
use std::collections::HashMap;
use std::io::Read as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use acemq_tests::host::plugin_path;
use acemq_tests::machine::{cpus, load_average};
use acemq_tests::{Broker, unique_name};

/// docs/targets.md, Performance.
const TARGETS: [Target; 5] = [
    Target {
        mode: Mode::Host,
        figure: Figure::Rate,
        bound: Bound::AtLeast(1.0),
    },
    Target {
        mode: Mode::Host,
        figure: Figure::Cpu,
        bound: Bound::AtMost(1.1),
    },
    Target {
        mode: Mode::HostTransform,
        figure: Figure::Rate,
        bound: Bound::AtLeast(1.0),
    },
    Target {
        mode: Mode::HostTransform,
        figure: Figure::Cpu,
        bound: Bound::AtMost(1.1),
    },
    Target {
        mode: Mode::RouterPython,
        figure: Figure::Rate,
        bound: Bound::AtLeast(0.6),
    },
];

/// Messages of the uncounted warm-up run of each consumer.
const WARM_UP: u64 = 2_000;

struct Settings {
    messages: u64,
    transform_messages: u64,
    router_messages: u64,
    size: usize,
    confirm: usize,
    prefetch: u16,
    rounds: usize,
    /// `concurrency` of the host consumers; none: the host's default.
    concurrency: Option<usize>,
    queue_type: String,
    /// `-A` of the bare loops.
    multi_ack: u64,
    /// Whether to compare consume-transform-publish too.
    transform: bool,
    /// Whether to run the order routers too.
    routers: bool,
}

impl Settings {
    fn from_env() -> Result<Self> {
        let multi_ack = env_or("ACEMQ_BENCH_MULTI_ACK", 20)?;
        if multi_ack < 2 {
            bail!("ACEMQ_BENCH_MULTI_ACK={multi_ack}: at least 2 (1 is the single-ack loop)");
        }
        Ok(Self {
            messages: env_or("ACEMQ_BENCH_MESSAGES", 50_000)?,
            transform_messages: env_or("ACEMQ_BENCH_TRANSFORM_MESSAGES", 30_000)?,
            router_messages: env_or("ACEMQ_BENCH_ROUTER_MESSAGES", 20_000)?,
            size: env_or("ACEMQ_BENCH_SIZE", 1024)?,
            confirm: env_or("ACEMQ_BENCH_CONFIRM", 500)?,
            prefetch: env_or("ACEMQ_BENCH_PREFETCH", 200)?,
            rounds: env_or("ACEMQ_BENCH_ROUNDS", 3)?,
            concurrency: Some(env_or("ACEMQ_BENCH_CONCURRENCY", 0)?).filter(|&n| n > 0),
            queue_type: env_or("ACEMQ_BENCH_QUEUE_TYPE", "quorum".to_string())?,
            multi_ack,
            transform: env_or("ACEMQ_BENCH_TRANSFORM", 1u8)? != 0,
            routers: env_or("ACEMQ_BENCH_ROUTERS", 1u8)? != 0,
        })
    }

    /// The consumers each round runs, in the order of the first round.
    fn modes(&self) -> Vec<Mode> {
        Mode::ALL
            .into_iter()
            .filter(|mode| self.transform || !mode.transforms())
            .filter(|mode| self.routers || mode.router().is_none())
            .collect()
    }

    /// Messages of one run of `mode`.
    fn messages(&self, mode: Mode) -> u64 {
        if mode.router().is_some() {
            self.router_messages
        } else if mode.transforms() {
            self.transform_messages
        } else {
            self.messages
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Mode {
    /// `consume-bare -A N`: the consume-only baseline.
    BareMultiAck,
    /// `consume-bare -A 1`: an ack per message, pipelined.
    BareSingleAck,
    /// `consume-host` with the echo plugin.
    Host,
    /// The same on one runtime worker (`--worker-threads 1`), for
    /// reference: what `[host] worker_threads` buys where the connections'
    /// I/O threads share the cores.
    HostOneWorker,
    /// `consume-bare --transform-to X -A N --envelope`: the transform
    /// baseline, writing the same messages as the host.
    BareTransform,
    /// `consume-bare --transform-to X -A N`: the same without the AceMQ
    /// envelope, for reference: what the envelope itself costs.
    BareTransformPlain,
    /// `consume-bare --transform-to X -A N --envelope --publish-connection`:
    /// the baseline publishing on a connection of its own, as the host
    /// does, for reference: what the second connection costs.
    BareTransformTwoConnections,
    /// `consume-host --transform-to X` (stamp-v1).
    HostTransform,
    /// `consume-host` with `plugins/order-router` on orders.
    RouterRust,
    /// The same with `plugins/order-router-py`.
    RouterPython,
    /// The same with `plugins/order-router-js`.
    RouterJs,
}

impl Mode {
    const ALL: [Mode; 11] = [
        Mode::BareMultiAck,
        Mode::BareSingleAck,
        Mode::Host,
        Mode::HostOneWorker,
        Mode::BareTransform,
        Mode::BareTransformPlain,
        Mode::BareTransformTwoConnections,
        Mode::HostTransform,
        Mode::RouterRust,
        Mode::RouterPython,
        Mode::RouterJs,
    ];

    /// Short, for queue names and progress lines.
    fn name(self) -> &'static str {
        match self {
            Mode::BareMultiAck => "bare-multi-ack",
            Mode::BareSingleAck => "bare-single-ack",
            Mode::Host => "host",
            Mode::HostOneWorker => "host-one-worker",
            Mode::BareTransform => "bare-transform",
            Mode::BareTransformPlain => "bare-transform-plain",
            Mode::BareTransformTwoConnections => "bare-transform-2conn",
            Mode::HostTransform => "host-transform",
            Mode::RouterRust => "router-rust",
            Mode::RouterPython => "router-python",
            Mode::RouterJs => "router-js",
        }
    }

    /// For the tables.
    fn label(self, settings: &Settings) -> String {
        match self {
            Mode::BareMultiAck => format!("bare multi-ack (-A {})", settings.multi_ack),
            Mode::BareSingleAck => "bare single acks, pipelined".to_string(),
            Mode::Host => "host + echo".to_string(),
            Mode::HostOneWorker => "  same, one worker (reference)".to_string(),
            Mode::BareTransform => format!("bare transform (-A {})", settings.multi_ack),
            Mode::BareTransformPlain => "  same, no envelope (reference)".to_string(),
            Mode::BareTransformTwoConnections => "  same, two connections (reference)".to_string(),
            Mode::HostTransform => "host transform (stamp-v1)".to_string(),
            Mode::RouterRust => "order router, Rust".to_string(),
            Mode::RouterPython => "order router, Python".to_string(),
            Mode::RouterJs => "order router, JavaScript".to_string(),
        }
    }

    /// What it is scored against.
    fn baseline(self) -> Mode {
        if self.router().is_some() {
            Mode::RouterRust
        } else if self.transforms() {
            Mode::BareTransform
        } else {
            Mode::BareMultiAck
        }
    }

    /// For an order router's run: its plugin, a folder of `plugins/`.
    fn router(self) -> Option<&'static str> {
        match self {
            Mode::RouterRust => Some("order-router"),
            Mode::RouterPython => Some("order-router-py"),
            Mode::RouterJs => Some("order-router-js"),
            _ => None,
        }
    }

    /// Whether it publishes what it consumes to a sink.
    fn publishes(self) -> bool {
        self.transforms() || self.router().is_some()
    }

    fn transforms(self) -> bool {
        matches!(
            self,
            Mode::BareTransform
                | Mode::BareTransformPlain
                | Mode::BareTransformTwoConnections
                | Mode::HostTransform
        )
    }

    fn is_host(self) -> bool {
        matches!(self, Mode::Host | Mode::HostOneWorker | Mode::HostTransform)
            || self.router().is_some()
    }
}

/// One consumer run, as the child measured it, and the child's whole cost.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// From 10 % to 90 % acked: messages per second, and CPU µs per message.
    steady_rate: f64,
    steady_cpu_us: f64,
    /// Of `steady_cpu_us`, lapin's I/O threads' part; the rest is the
    /// runtime's workers (for the host, its own work).
    steady_io_cpu_us: f64,
    /// Allocations per message over the steady span (every thread's).
    steady_allocs: f64,
    /// Over the whole consume span (connect to last ack).
    rate: f64,
    cpu_consume_us: f64,
    /// Whole-process CPU (wait4) per message, µs.
    cpu_process_us: f64,
}

/// A table row: a run and its ratios to its baseline's run in the same round.
#[derive(Debug, Clone, Copy)]
struct Figures {
    run: Run,
    /// Steady rate over the baseline's steady rate.
    rate_ratio: f64,
    /// Steady CPU per message over the baseline's.
    cpu_ratio: f64,
}

#[derive(Debug, Clone, Copy)]
enum Figure {
    Rate,
    Cpu,
}

#[derive(Debug, Clone, Copy)]
enum Bound {
    AtLeast(f64),
    AtMost(f64),
}

/// A target: `figure` of `mode`, as a ratio to its baseline's, within `bound`.
struct Target {
    mode: Mode,
    figure: Figure,
    bound: Bound,
}

struct Bench {
    settings: Settings,
    broker: Broker,
    runtime: tokio::runtime::Runtime,
    loadgen: PathBuf,
    echo: PathBuf,
    cache: tempfile::TempDir,
}

fn main() -> Result<()> {
    // `cargo bench` passes `--bench` (and any filter); there is nothing to filter.
    let settings = Settings::from_env()?;
    let echo = plugin_path("echo");
    let broker = match std::env::var("ACEMQ_TEST_URL")
        .ok()
        .filter(|u| !u.is_empty())
    {
        Some(url) => Broker::external(&url, std::env::var("ACEMQ_TEST_MGMT_URL").ok().as_deref())?,
        None => {
            eprintln!("end_to_end: starting a throwaway RabbitMQ node");
            Broker::start()?
        }
    };
    let bench = Bench {
        settings,
        broker,
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        loadgen: PathBuf::from(env!("CARGO_BIN_EXE_loadgen")),
        echo,
        cache: tempfile::tempdir()?,
    };
    let s = &bench.settings;
    println!(
        "end_to_end: {} queues of {} B persistent messages ({} per consume-only run, {} per transform run; \
         {} JSON orders per order-router run), prefetch {} for every consumer, host concurrency {}, rounds: {}",
        s.queue_type,
        s.size,
        s.messages,
        s.transform_messages,
        s.router_messages,
        s.prefetch,
        s.concurrency
            .map_or("default".to_string(), |n| n.to_string()),
        s.rounds
    );
    println!(
        "end_to_end: broker, publisher and consumer share this machine: {} CPUs, load average {}",
        cpus(),
        load_average()
    );

    // Warm-up, not counted: fills the compiled-plugin cache, starts the
    // broker's quorum machinery and the page cache.
    for mode in s.modes() {
        bench
            .run(mode, s.messages(mode).min(WARM_UP))
            .with_context(|| format!("warm-up of {}", mode.name()))?;
    }

    let mut rounds = Vec::new();
    for round in 0..s.rounds {
        // Reverse the order every other round, to cancel drift.
        let mut order = s.modes();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut runs = HashMap::new();
        for &mode in &order {
            runs.insert(mode, bench.run(mode, s.messages(mode))?);
        }
        let figures = figures(&s.modes(), &runs);
        print_table(
            &format!(
                "round {} of {} ({} first)",
                round + 1,
                s.rounds,
                order[0].name()
            ),
            s,
            &figures,
        );
        rounds.push(figures);
    }

    let medians = medians(&s.modes(), &rounds);
    print_table(
        &format!(
            "median of {} round{}",
            rounds.len(),
            if rounds.len() == 1 { "" } else { "s" }
        ),
        s,
        &medians,
    );
    println!("targets (docs/targets.md, Performance), on the medians:");
    for target in &TARGETS {
        if let Some((_, figures)) = medians.iter().find(|(mode, _)| *mode == target.mode) {
            println!("  {}", target.verdict(s, figures));
        }
    }
    println!("end_to_end: load average at the end {}", load_average());
    Ok(())
}

/// Each mode's run in one round with its ratios to its baseline's.
fn figures(modes: &[Mode], runs: &HashMap<Mode, Run>) -> Vec<(Mode, Figures)> {
    modes
        .iter()
        .map(|&mode| {
            let (run, baseline) = (runs[&mode], runs[&mode.baseline()]);
            let figures = Figures {
                run,
                rate_ratio: run.steady_rate / baseline.steady_rate,
                cpu_ratio: run.steady_cpu_us / baseline.steady_cpu_us,
            };
            (mode, figures)
        })
        .collect()
}

/// Each mode's figures, each the median over the rounds. The ratios are the
/// medians of each round's ratio, not ratios of medians: a round's two runs
/// share its drift.
fn medians(modes: &[Mode], rounds: &[Vec<(Mode, Figures)>]) -> Vec<(Mode, Figures)> {
    modes
        .iter()
        .enumerate()
        .map(|(i, &mode)| {
            let of = |f: fn(&Figures) -> f64| {
                median(
                    &mut rounds
                        .iter()
                        .map(|round| f(&round[i].1))
                        .collect::<Vec<_>>(),
                )
            };
            let figures = Figures {
                run: Run {
                    steady_rate: of(|f| f.run.steady_rate),
                    steady_cpu_us: of(|f| f.run.steady_cpu_us),
                    steady_io_cpu_us: of(|f| f.run.steady_io_cpu_us),
                    steady_allocs: of(|f| f.run.steady_allocs),
                    rate: of(|f| f.run.rate),
                    cpu_consume_us: of(|f| f.run.cpu_consume_us),
                    cpu_process_us: of(|f| f.run.cpu_process_us),
                },
                rate_ratio: of(|f| f.rate_ratio),
                cpu_ratio: of(|f| f.cpu_ratio),
            };
            (mode, figures)
        })
        .collect()
}

fn print_table(title: &str, settings: &Settings, rows: &[(Mode, Figures)]) {
    println!("\n{title}: steady span (10 % to 90 % acked), and the whole consume span");
    println!(
        "| {:<35} | {:>8} | {:>10} | {:>12} | {:>12} | {:>10} | {:>24} | {:>16} | {:>18} | {:>18} |",
        "consumer",
        "msg/s",
        "CPU µs/msg",
        "of it: I/O",
        "runtime",
        "allocs/msg",
        "ratio to baseline",
        "whole span msg/s",
        "whole span µs/msg",
        "process CPU µs/msg"
    );
    println!(
        "|{:-<37}|{:->10}|{:->12}|{:->14}|{:->14}|{:->12}|{:->26}|{:->18}|{:->20}|{:->20}|",
        ":", ":", ":", ":", ":", ":", ":", ":", ":", ":"
    );
    for (mode, f) in rows {
        let ratio = if mode.baseline() == *mode {
            "(baseline)".to_string()
        } else {
            format!("{:.3}x msg/s, {:.2}x CPU", f.rate_ratio, f.cpu_ratio)
        };
        println!(
            "| {:<35} | {:>8.0} | {:>10.1} | {:>12.1} | {:>12.1} | {:>10.1} | {:>24} | {:>16.0} | {:>18.1} | {:>18.1} |",
            mode.label(settings),
            f.run.steady_rate,
            f.run.steady_cpu_us,
            f.run.steady_io_cpu_us,
            f.run.steady_cpu_us - f.run.steady_io_cpu_us,
            f.run.steady_allocs,
            ratio,
            f.run.rate,
            f.run.cpu_consume_us,
            f.run.cpu_process_us,
        );
    }
}

impl Target {
    fn verdict(&self, settings: &Settings, figures: &Figures) -> String {
        let (what, value) = match self.figure {
            Figure::Rate => ("msg/s", figures.rate_ratio),
            Figure::Cpu => ("CPU µs/msg", figures.cpu_ratio),
        };
        let (relation, bound, met) = match self.bound {
            Bound::AtLeast(bound) => (">=", bound, value >= bound),
            Bound::AtMost(bound) => ("<=", bound, value <= bound),
        };
        format!(
            "{}: {what} {relation} {bound}x {}: {value:.3}x, {}",
            self.mode.label(settings),
            self.mode.baseline().label(settings),
            if met { "met" } else { "NOT met" }
        )
    }
}

impl Bench {
    /// Fills a fresh queue with `messages`, drains it with `mode`, deletes it.
    fn run(&self, mode: Mode, messages: u64) -> Result<Run> {
        let s = &self.settings;
        let queue = unique_name(&format!("bench.{}", mode.name()));
        let url = self.broker.amqp_url();
        let count = messages.to_string();
        let (size, confirm) = (s.size.to_string(), s.confirm.to_string());
        let mut publish = vec![
            "publish",
            "--url",
            url,
            "--queue",
            &queue,
            "-C",
            &count,
            "-c",
            &confirm,
            "--queue-type",
            &s.queue_type,
        ];
        if mode.router().is_some() {
            publish.push("--orders");
        } else {
            publish.extend(["-s", &size]);
        }
        let published = self.loadgen(&publish)?;
        let publish_rate = loadgen_result(&published.stdout, "rate")?;
        eprintln!("end_to_end: {queue}: published {messages} at {publish_rate:.0} msg/s");

        let prefetch = s.prefetch.to_string();
        let command = if mode.is_host() {
            "consume-host"
        } else {
            "consume-bare"
        };
        let mut args = vec![
            command,
            "--url",
            url,
            "--queue",
            &queue,
            "-C",
            &count,
            "--prefetch",
            &prefetch,
        ];
        let multi_ack = s.multi_ack.to_string();
        let sink = unique_name("bench.sink");
        if mode.publishes() {
            args.extend(["--transform-to", &sink]);
        }
        match mode {
            Mode::BareMultiAck | Mode::BareTransformPlain => args.extend(["-A", &multi_ack]),
            Mode::BareTransform => args.extend(["-A", &multi_ack, "--envelope"]),
            Mode::BareTransformTwoConnections => {
                args.extend(["-A", &multi_ack, "--envelope", "--publish-connection"]);
            }
            Mode::BareSingleAck => args.extend(["-A", "1"]),
            Mode::HostOneWorker => args.extend(["--worker-threads", "1"]),
            Mode::Host | Mode::HostTransform => {}
            Mode::RouterRust | Mode::RouterPython | Mode::RouterJs => {
                args.extend(["--exchange-key", "events_exchange"]);
            }
        }
        let plugin = match mode.router() {
            Some(router) => Some(plugin_path(router)),
            None => matches!(mode, Mode::Host | Mode::HostOneWorker).then(|| self.echo.clone()),
        };
        let plugin = plugin.as_ref().map(|path| path.to_string_lossy());
        if let Some(plugin) = &plugin {
            args.extend(["--plugin", plugin]);
        }
        // A folder inside the temporary one, so that its key (beside it)
        // goes away with it too.
        let cache = self.cache.path().join("entries");
        let cache = cache.to_string_lossy();
        let concurrency = s.concurrency.map(|n| n.to_string());
        // Every host run: the same compiled-plugin cache, and the same
        // consumer settings.
        if mode.is_host() {
            args.extend(["--plugin-cache-dir", &cache]);
            if let Some(concurrency) = &concurrency {
                args.extend(["--concurrency", concurrency]);
            }
        }
        let consumed = self.loadgen(&args)?;
        self.runtime.block_on(self.broker.delete_queue(&queue))?;
        if mode.publishes() {
            self.runtime
                .block_on(self.broker.delete_queue(&format!("{sink}.sink")))?;
            self.runtime.block_on(self.broker.delete_exchange(&sink))?;
        }
        let out = &consumed.stdout;
        let run = Run {
            steady_rate: loadgen_result(out, "steady_rate")?,
            steady_cpu_us: loadgen_result(out, "steady_cpu_us_per_msg")?,
            steady_io_cpu_us: loadgen_result(out, "steady_io_cpu_us_per_msg")?,
            steady_allocs: loadgen_result(out, "steady_allocs_per_msg")?,
            rate: loadgen_result(out, "rate")?,
            cpu_consume_us: loadgen_result(out, "cpu_us_per_msg")?,
            cpu_process_us: consumed.cpu.as_secs_f64() * 1e6 / messages as f64,
        };
        eprintln!(
            "end_to_end: {queue}: {} consumed at {:.0} msg/s steady ({:.1} µs CPU/msg), \
             child wall {:.2} s",
            mode.name(),
            run.steady_rate,
            run.steady_cpu_us,
            consumed.wall.as_secs_f64(),
        );
        Ok(run)
    }

    fn loadgen(&self, args: &[&str]) -> Result<Child> {
        let mut command = Command::new(&self.loadgen);
        command
            .args(args)
            .env_remove("ACEMQ_URL")
            .env_remove("ACEMQ_LOADGEN_URL");
        run_measured(command).with_context(|| format!("loadgen {}", args.join(" ")))
    }
}

/// What a finished child printed, and what it cost.
struct Child {
    stdout: String,
    wall: Duration,
    cpu: Duration,
}

/// Runs a child to completion and reads its user+system CPU time from the
/// kernel as it is reaped (`wait4`): exact, and covers every thread.
fn run_measured(mut command: Command) -> Result<Child> {
    let started = Instant::now();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut stdout = String::new();
    // Until EOF: the child closes its stdout when it exits.
    child
        .stdout
        .take()
        .expect("piped")
        .read_to_string(&mut stdout)?;
    let pid = libc::pid_t::try_from(child.id())?;
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value; wait4 only writes to the
    // two out-pointers, which live across the call.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: as above; `pid` is our own unreaped child (std's `Child`
        // is never waited on, so nothing else reaps it).
        let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if reaped == pid {
            break;
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            bail!("wait4: {error}");
        }
    }
    let wall = started.elapsed();
    let status = ExitStatus::from_raw(status);
    if !status.success() {
        bail!("exited with {status}; stdout:\n{stdout}");
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    Ok(Child {
        stdout,
        wall,
        cpu: time(usage.ru_utime) + time(usage.ru_stime),
    })
}
