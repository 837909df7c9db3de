//! Reading a stream over RabbitMQ's stream protocol against reading it over
//! AMQP 0-9-1, in the same run on this machine (issue 32's target): a named
//! stream consumer with `echo` and its checkpoint, and `replay --compare`,
//! each on both paths, beside bare readers of both protocols.
//!
//! ```text
//! scripts/build-plugins && cargo bench -p acemq-tests --bench stream_protocol
//! ACEMQ_BENCH_STREAM_MESSAGES=100000 ACEMQ_BENCH_AMQP_MESSAGES=50000 ACEMQ_BENCH_ROUNDS=1 \
//!     cargo bench -p acemq-tests --bench stream_protocol
//! ```
//!
//! One stream of `ACEMQ_BENCH_STREAM_MESSAGES` (1,000,000) messages of
//! 1 KiB is published once (AMQP 0-9-1, over `ACEMQ_BENCH_PUBLISHERS` (8)
//! channels at once, 500 confirms in flight). The broker stores what
//! arrived while it wrote the chunk before as one chunk, so a stream many
//! producers feed, the case of a week of events, is stored in full chunks
//! (about 1,700 messages here), and one publisher makes chunks of about 17,
//! where the broker's cost per chunk bounds every reader of either protocol
//! at about 66,000 msg/s on this machine (docs/benchmarks.md). Each of
//! `ACEMQ_BENCH_ROUNDS` (3) rounds then reads it from `first` with every
//! row below, in reverse order every other round:
//!
//! 1. the host (in process) with the no-op `echo` plugin, a named consumer
//!    (`consumer_name`, `checkpoint = "broker"`, every 1000, the default)
//!    with `stream_protocol = "stream"`: its checkpoint is the broker's
//!    offset tracking. Prefetch 10 and concurrency 1, the stream defaults;
//! 2. the same with `stream_protocol = "amqp"` (the checkpoint queue);
//! 3. `replay --compare` (candidate `echo`, current `echo`, in process)
//!    over the stream protocol, and 4. over AMQP 0-9-1;
//! 5. a bare stream reader: the host library's `ChunkReader` from `first`
//!    and `to_amqp091` on each message (the work the host must do to hand a
//!    message over), nothing of the host's machinery;
//! 6. the same counting messages only (no decoding): the protocol's
//!    ceiling with the host's client, which keeps one chunk's credit out;
//! 7. the same with `ACEMQ_BENCH_CREDIT` (8) chunks of credit out, on the
//!    host's `StreamConnection` directly: whether one credit limits it;
//! 8. a bare AMQP 0-9-1 reader (lapin, `x-stream-offset` = `first`,
//!    prefetch `ACEMQ_BENCH_AMQP_PREFETCH` (1000) against the host's 10,
//!    a `multiple` ack every `ACEMQ_BENCH_MULTI_ACK` (100), pipelined):
//!    the best the AMQP path does;
//! 9. a bare reader with RabbitMQ's own Rust client, `rabbitmq-stream-client`
//!    0.4.4 (the last release that connects to RabbitMQ 3.10), a consumer
//!    from `first` taking each decoded message's body: the issue's
//!    baseline for the host on the stream protocol.
//!
//! The AMQP rows (2, 4, 8) are slow: they read only the first
//! `ACEMQ_BENCH_AMQP_MESSAGES` (200,000) messages, and say so. Before the
//! rounds the stream is read once for the offsets of those last messages,
//! where the replays stop: each new segment file (every 500 MB) starts
//! with a chunk of the broker's own that takes an offset. A host row's
//! rate runs from its subscription (the host started, its plugin compiled)
//! to its N-th ack (`acemq_consume_total{outcome="acked"}`); a replay's is
//! the whole `replay()` call, its set-up included (printed once, measured
//! on one message); a bare reader's from its subscription to its N-th
//! message. CPU per message is this process's (getrusage: host, replay and
//! bare readers all run in it) over the same span; the broker's is its
//! VM's (`/proc/PID/stat` of the node's pid file), when the broker is one
//! this bench started. Each round prints its rows; then the medians and
//! the ratios the target names (stream ≥ 5× AMQP for the host and for
//! replay, the host ≥ 0.8× of the bare `rabbitmq-stream-client` reader),
//! each the ratio of the medians with the rounds' own ratios beside it, and
//! the load average at the start and the end. Asserts nothing.
//!
//! The in-process host logs nothing (no subscriber unless `ACEMQ_TEST_LOG`
//! is set); replay's progress lines on stderr are silenced while a replay
//! runs (`ACEMQ_BENCH_REPLAY_PROGRESS=1` keeps them).
//!
//! For diagnosis: `ACEMQ_BENCH_ROWS` (a comma-separated list of `host-stream`,
//! `host-amqp`, `replay-stream`, `replay-amqp`, `bare-decode`, `bare-count`,
//! `bare-credit`, `bare-amqp`, `bare-client`; all when unset) runs only those rows (under
//! `perf record`, say), and `ACEMQ_BENCH_HOST_PREFETCH` and
//! `ACEMQ_BENCH_HOST_CONCURRENCY` set the host consumers' `prefetch` and
//! `concurrency` (unset: the host's defaults, 10 and 1 for a stream; the
//! output says when they are not). `ACEMQ_BENCH_PUBLISHERS=1` writes the
//! stream of small chunks (the rows print the chunks' size).

use std::time::{Duration, Instant};

use acemq_host::broker::BrokerUrl;
use acemq_host::broker::offset::StreamOffset;
use acemq_host::broker::stream_protocol::StreamEndpoints;
use acemq_host::broker::stream_protocol::amqp10::to_amqp091;
use acemq_host::broker::stream_protocol::connection::SubscriptionEvent;
use acemq_host::broker::stream_protocol::reader::ChunkReader;
use acemq_host::broker::stream_protocol::wire::Start;
use acemq_host::config::{LoadedConfig, StreamProtocol};
use acemq_host::replay::{ReplayRequest, replay};
use acemq_tests::host::{InProcessHost, plugin_path};
use acemq_tests::machine::{cpu_seconds, cpus, load_average};
use acemq_tests::stream_reader::StreamReaderConfig;
use acemq_tests::{Broker, env_or, median, shared_broker, unique_name};
use anyhow::{Context, Result, anyhow, bail};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt as _};
use lapin::BasicProperties;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};

/// The host binary's allocator: the in-process host allocates as it does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BODY_BYTES: usize = 1024;

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run())
}

/// A row's note when the bodies it read do not add up to `read` bodies of
/// `BODY_BYTES`: what it measured is not the work it claims.
fn wrong_bodies(read: u64, body_bytes: usize) -> &'static str {
    if body_bytes == read as usize * BODY_BYTES {
        ""
    } else {
        " (bodies of the wrong size!)"
    }
}

/// What a row reads with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    HostStream,
    HostAmqp,
    ReplayStream,
    ReplayAmqp,
    BareDecode,
    BareCount,
    BareCredit,
    BareAmqp,
    BareClient,
}

const KINDS: [Kind; 9] = [
    Kind::HostStream,
    Kind::HostAmqp,
    Kind::ReplayStream,
    Kind::ReplayAmqp,
    Kind::BareDecode,
    Kind::BareCount,
    Kind::BareCredit,
    Kind::BareAmqp,
    Kind::BareClient,
];

impl Kind {
    fn label(self, credit: u16) -> String {
        match self {
            Kind::HostStream => "host + echo, stream protocol, offset tracking".into(),
            Kind::HostAmqp => "host + echo, AMQP 0-9-1, checkpoint queue".into(),
            Kind::ReplayStream => "replay --compare, stream protocol".into(),
            Kind::ReplayAmqp => "replay --compare, AMQP 0-9-1".into(),
            Kind::BareDecode => "bare stream reader + to_amqp091".into(),
            Kind::BareCount => "bare stream reader, count only".into(),
            Kind::BareCredit => format!("bare stream, count only, {credit} credits"),
            Kind::BareAmqp => "bare lapin reader, AMQP 0-9-1".into(),
            Kind::BareClient => "bare rabbitmq-stream-client 0.4.4 reader".into(),
        }
    }

    /// Its name in `ACEMQ_BENCH_ROWS`.
    fn key(self) -> &'static str {
        match self {
            Kind::HostStream => "host-stream",
            Kind::HostAmqp => "host-amqp",
            Kind::ReplayStream => "replay-stream",
            Kind::ReplayAmqp => "replay-amqp",
            Kind::BareDecode => "bare-decode",
            Kind::BareCount => "bare-count",
            Kind::BareCredit => "bare-credit",
            Kind::BareAmqp => "bare-amqp",
            Kind::BareClient => "bare-client",
        }
    }

    fn amqp(self) -> bool {
        matches!(self, Kind::HostAmqp | Kind::ReplayAmqp | Kind::BareAmqp)
    }
}

/// One row's measurement.
#[derive(Clone)]
struct Row {
    messages: u64,
    seconds: f64,
    /// This process's CPU over the row, in seconds.
    cpu: f64,
    /// The broker's, when known.
    broker_cpu: Option<f64>,
    /// What else the row found (chunks, time waiting on the broker).
    note: String,
}

impl Row {
    fn rate(&self) -> f64 {
        self.messages as f64 / self.seconds
    }

    fn cpu_us(&self) -> f64 {
        self.cpu * 1e6 / self.messages as f64
    }

    fn broker_us(&self) -> Option<f64> {
        self.broker_cpu.map(|c| c * 1e6 / self.messages as f64)
    }
}

/// The settings of the run.
struct Bench {
    broker: &'static Broker,
    stream: String,
    messages: u64,
    amqp_messages: u64,
    credit: u16,
    amqp_prefetch: u16,
    multi_ack: u64,
    broker_pid: Option<u32>,
    endpoints: StreamEndpoints,
    /// The offsets of the `amqp_messages`-th and the `messages`-th message
    /// (not one less: a segment the stream starts holds a chunk of the
    /// broker's own, which takes an offset), where replays stop.
    last_offsets: (u64, u64),
    /// `prefetch = N` and `concurrency = N` lines for the host's consumer,
    /// when set (for diagnosis; the defaults are the host's).
    host_tuning: String,
}

async fn run() -> Result<()> {
    let messages: u64 = env_or("ACEMQ_BENCH_STREAM_MESSAGES", 1_000_000)?;
    let amqp_messages: u64 = env_or("ACEMQ_BENCH_AMQP_MESSAGES", 200_000)?;
    let rounds: usize = env_or("ACEMQ_BENCH_ROUNDS", 3)?;
    let credit: u16 = env_or("ACEMQ_BENCH_CREDIT", 8)?;
    let amqp_prefetch: u16 = env_or("ACEMQ_BENCH_AMQP_PREFETCH", 1000)?;
    let multi_ack: u64 = env_or("ACEMQ_BENCH_MULTI_ACK", 100)?;
    let host_prefetch: u16 = env_or("ACEMQ_BENCH_HOST_PREFETCH", 0)?;
    let host_concurrency: usize = env_or("ACEMQ_BENCH_HOST_CONCURRENCY", 0)?;
    let wanted: String = env_or("ACEMQ_BENCH_ROWS", String::new())?;
    let publishers: u64 = env_or::<u64>("ACEMQ_BENCH_PUBLISHERS", 8)?.max(1);
    let kinds: Vec<Kind> = KINDS
        .iter()
        .copied()
        .filter(|k| wanted.is_empty() || wanted.split(',').any(|w| w.trim() == k.key()))
        .collect();
    anyhow::ensure!(
        !kinds.is_empty(),
        "ACEMQ_BENCH_ROWS={wanted:?} names no row (rows: {})",
        KINDS.map(Kind::key).join(", ")
    );
    let mut host_tuning = String::new();
    if host_prefetch > 0 {
        host_tuning.push_str(&format!("prefetch = {host_prefetch}\n"));
    }
    if host_concurrency > 0 {
        host_tuning.push_str(&format!("concurrency = {host_concurrency}\n"));
    }
    anyhow::ensure!(messages > 0 && rounds > 0, "nothing to measure");
    let amqp_messages = amqp_messages.clamp(1, messages);
    let load_at_start = load_average();
    let started = Instant::now();
    let broker = shared_broker();
    let url = BrokerUrl::parse(broker.amqp_url()).map_err(|e| anyhow!("{e}"))?;
    let endpoints = StreamEndpoints::new(
        &[url],
        Some(broker.stream_port()),
        None,
        "acemq-bench".into(),
    )
    .map_err(|e| anyhow!("{e}"))?;
    let mut bench = Bench {
        broker,
        stream: unique_name("bench.sp"),
        messages,
        amqp_messages,
        credit: credit.max(1),
        amqp_prefetch,
        multi_ack: multi_ack.max(1),
        broker_pid: broker_pid(broker),
        endpoints,
        host_tuning,
        last_offsets: (0, 0),
    };
    println!(
        "stream_protocol: {} CPUs, load average at the start {load_at_start}; broker pid {}",
        cpus(),
        bench
            .broker_pid
            .map_or("unknown (its CPU is not shown)".to_string(), |p| p
                .to_string()),
    );
    if !bench.host_tuning.is_empty() {
        println!(
            "stream_protocol: the host's consumers NOT at their defaults: {}",
            bench.host_tuning.trim().replace('\n', ", ")
        );
    }

    // Declares the stream as the host does, then the messages go in.
    let declare = unique_name("bench.declare");
    InProcessHost::start(&bench.host_config(&declare, "amqp", "none"))
        .await?
        .stop()
        .await?;
    let published = Instant::now();
    let body = vec![b'x'; BODY_BYTES];
    // One publisher by default; more fill the broker's chunks fuller (it
    // stores what arrived while it wrote the chunk before).
    let share = messages.div_ceil(publishers);
    let publishing = (0..publishers).map(|p| {
        let count = share.min(messages.saturating_sub(p * share));
        broker.publish_many(
            "",
            &bench.stream,
            (0..count).map(|_| (body.as_slice(), BasicProperties::default())),
        )
    });
    for published in futures::future::join_all(publishing).await {
        published?;
    }
    let took = published.elapsed().as_secs_f64();
    println!(
        "stream_protocol: {messages} messages of {BODY_BYTES} bytes in stream {} ({publishers} publisher(s), {took:.1} s, {:.0} msg/s); \
         AMQP 0-9-1 rows read the first {amqp_messages}",
        bench.stream,
        messages as f64 / took
    );

    // Where the messages lie (and the stream read once before the rounds).
    let scanned = Instant::now();
    bench.last_offsets = bench.offsets_of(amqp_messages, messages).await?;
    println!(
        "stream_protocol: message {amqp_messages} at offset {}, message {messages} at offset {} \
         ({} offsets taken by the broker's own chunks), found in {:.1} s",
        bench.last_offsets.0,
        bench.last_offsets.1,
        bench.last_offsets.1 + 1 - messages,
        scanned.elapsed().as_secs_f64()
    );

    // What a replay costs before its first message: connecting, two
    // plugins compiled.
    for protocol in [StreamProtocol::Stream, StreamProtocol::Amqp] {
        let row = bench.replay(protocol, 1, 0).await?;
        println!(
            "stream_protocol: replay set-up ({}, one message): {:.2} s, {:.3} CPU s",
            protocol.word(),
            row.seconds,
            row.cpu
        );
    }

    let mut results: Vec<Vec<(Kind, Row)>> = Vec::new();
    for round in 0..rounds {
        let mut order = kinds.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut rows = Vec::new();
        for kind in order {
            let row = bench
                .measure(kind)
                .await
                .with_context(|| format!("round {}: {}", round + 1, kind.label(bench.credit)))?;
            rows.push((kind, row));
        }
        println!(
            "\nround {} of {rounds} (load average {}):",
            round + 1,
            load_average()
        );
        print_header();
        for (kind, row) in &rows {
            print_row(&kind.label(bench.credit), row);
        }
        rows.sort_by_key(|(kind, _)| KINDS.iter().position(|k| k == kind));
        results.push(rows);
    }

    println!(
        "\nmedians of {rounds} round(s) ({messages} messages; AMQP 0-9-1 rows the first {amqp_messages}):"
    );
    print_header();
    let row_of = |round: &Vec<(Kind, Row)>, kind: Kind| -> Row {
        round
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, row)| row.clone())
            .expect("every round has every row")
    };
    let medians: Vec<(Kind, f64, f64, Option<f64>)> = kinds
        .iter()
        .map(|&kind| {
            let rows: Vec<Row> = results.iter().map(|r| row_of(r, kind)).collect();
            let mut rates: Vec<f64> = rows.iter().map(Row::rate).collect();
            let mut cpu: Vec<f64> = rows.iter().map(Row::cpu_us).collect();
            let mut broker: Vec<f64> = rows.iter().filter_map(Row::broker_us).collect();
            let broker = (!broker.is_empty()).then(|| median(&mut broker));
            (kind, median(&mut rates), median(&mut cpu), broker)
        })
        .collect();
    for (kind, rate, cpu, broker) in &medians {
        let count = if kind.amqp() { amqp_messages } else { messages };
        println!(
            "  {:<48} {:>9} {:>8} {:>10.0} {:>10.2} {:>10}",
            kind.label(bench.credit),
            count,
            "",
            rate,
            cpu,
            broker.map_or("-".to_string(), |b| format!("{b:.2}"))
        );
    }
    let median_of = |kind: Kind| medians.iter().find(|(k, ..)| *k == kind);
    let median_rate = |kind: Kind| median_of(kind).map_or(f64::NAN, |(_, rate, ..)| *rate);
    let median_cpu = |kind: Kind| median_of(kind).map_or(f64::NAN, |(_, _, cpu, _)| *cpu);
    println!("\nratios (of the medians; each round's in brackets):");
    let ratio = |what: &str, of: Kind, to: Kind, target: Option<f64>| {
        if !(kinds.contains(&of) && kinds.contains(&to)) {
            return;
        }
        let rounds: Vec<String> = results
            .iter()
            .map(|r| format!("{:.2}", row_of(r, of).rate() / row_of(r, to).rate()))
            .collect();
        let value = median_rate(of) / median_rate(to);
        let verdict = match target {
            Some(target) if value >= target => format!(" — target ≥ {target}×: met"),
            Some(target) => format!(" — target ≥ {target}×: NOT met"),
            None => String::new(),
        };
        println!(
            "  {what:<44} {value:>6.2}× ({}); CPU/msg {:.2}×{verdict}",
            rounds.join(", "),
            median_cpu(of) / median_cpu(to)
        );
    };
    ratio(
        "host: stream / AMQP 0-9-1",
        Kind::HostStream,
        Kind::HostAmqp,
        Some(5.0),
    );
    ratio(
        "replay --compare: stream / AMQP 0-9-1",
        Kind::ReplayStream,
        Kind::ReplayAmqp,
        Some(5.0),
    );
    ratio(
        "host stream / bare rabbitmq-stream-client",
        Kind::HostStream,
        Kind::BareClient,
        Some(0.8),
    );
    ratio(
        "host stream / bare stream reader + decode",
        Kind::HostStream,
        Kind::BareDecode,
        None,
    );
    ratio(
        "bare stream decode / bare rabbitmq-stream-client",
        Kind::BareDecode,
        Kind::BareClient,
        None,
    );
    ratio(
        "host stream / bare stream reader, count only",
        Kind::HostStream,
        Kind::BareCount,
        None,
    );
    ratio(
        "bare decode / bare count only",
        Kind::BareDecode,
        Kind::BareCount,
        None,
    );
    ratio(
        "bare count: credit 1 / more credits",
        Kind::BareCount,
        Kind::BareCredit,
        None,
    );
    ratio(
        "host AMQP / bare lapin reader",
        Kind::HostAmqp,
        Kind::BareAmqp,
        None,
    );
    ratio(
        "bare stream decode / bare lapin reader",
        Kind::BareDecode,
        Kind::BareAmqp,
        None,
    );
    println!(
        "\nstream_protocol: load average at the start {load_at_start}, at the end {}; {} CPUs; run took {:.0} s",
        load_average(),
        cpus(),
        started.elapsed().as_secs_f64()
    );
    broker.delete_queue(&bench.stream).await?;
    Ok(())
}

fn print_header() {
    println!(
        "  {:<48} {:>9} {:>8} {:>10} {:>10} {:>10}  notes",
        "row", "messages", "s", "msg/s", "CPU µs/msg", "broker µs"
    );
}

fn print_row(label: &str, row: &Row) {
    println!(
        "  {label:<48} {:>9} {:>8.2} {:>10.0} {:>10.2} {:>10}  {}",
        row.messages,
        row.seconds,
        row.rate(),
        row.cpu_us(),
        row.broker_us()
            .map_or("-".to_string(), |b| format!("{b:.2}")),
        row.note
    );
}

impl Bench {
    fn host_config(&self, name: &str, protocol: &str, checkpoint: &str) -> String {
        let mut config =
            StreamReaderConfig::echo(self.broker.amqp_url(), &self.stream, name, checkpoint);
        config.broker_lines = format!("stream_port = {}\n", self.broker.stream_port());
        config.consumer_lines = format!("stream_protocol = \"{protocol}\"\n{}", self.host_tuning);
        config.toml()
    }

    async fn measure(&self, kind: Kind) -> Result<Row> {
        match kind {
            Kind::HostStream => self.host("stream", self.messages).await,
            Kind::HostAmqp => self.host("amqp", self.amqp_messages).await,
            Kind::ReplayStream => {
                let to = self.last_offsets.1;
                self.replay(StreamProtocol::Stream, self.messages, to).await
            }
            Kind::ReplayAmqp => {
                let to = self.last_offsets.0;
                self.replay(StreamProtocol::Amqp, self.amqp_messages, to)
                    .await
            }
            Kind::BareDecode => self.bare_stream(true).await,
            Kind::BareCount => self.bare_stream(false).await,
            Kind::BareCredit => self.bare_credit().await,
            Kind::BareAmqp => self.bare_amqp().await,
            Kind::BareClient => self.bare_client().await,
        }
    }

    /// Starts the span of a row: the time, this process's CPU, the broker's.
    fn span(&self) -> Span {
        Span {
            at: Instant::now(),
            cpu: process_cpu(),
            broker: self.broker_pid.and_then(|pid| cpu_seconds(pid).ok()),
            broker_pid: self.broker_pid,
        }
    }

    /// A host reading the stream from `first` with `protocol`, until it has
    /// acked `count` messages.
    async fn host(&self, protocol: &str, count: u64) -> Result<Row> {
        let name = unique_name("bench.reader");
        let host = InProcessHost::start(&self.host_config(&name, protocol, "broker")).await?;
        let span = self.span();
        let deadline = span.at + Duration::from_secs(1800);
        while host.metrics.consumed_count(&self.stream, "acked") < count {
            if Instant::now() > deadline {
                bail!("the host did not ack {count} messages in 30 minutes");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let row = span.end(count, String::new());
        host.stop().await?;
        self.broker
            .delete_queue(&format!("acemq.checkpoint.{name}"))
            .await?;
        Ok(row)
    }

    /// `replay --compare` of the first `count` messages (up to offset
    /// `to`), `echo` against `echo`, over `protocol`.
    async fn replay(&self, protocol: StreamProtocol, count: u64, to: u64) -> Result<Row> {
        let name = unique_name("bench.replay");
        let config = self.host_config(&name, protocol.word(), "none");
        let loaded = LoadedConfig::parse(std::path::Path::new("bench.toml"), config)
            .map_err(|e| anyhow!("{e}"))?;
        let request = ReplayRequest {
            consumer: name,
            candidate: plugin_path("echo"),
            from: "first".to_string(),
            to: Some(to),
            compare: true,
            stream_protocol: Some(protocol),
        };
        let quiet = QuietStderr::new();
        let span = self.span();
        let report = replay(&loaded, &request).await;
        drop(quiet);
        let report = report?;
        let note = format!("{} differing", report.differing);
        if report.read as u64 != count {
            bail!("the replay read {} messages of {count}", report.read);
        }
        Ok(span.end(count, note))
    }

    /// The offsets of the `first`-th and the `second`-th message.
    async fn offsets_of(&self, first: u64, second: u64) -> Result<(u64, u64)> {
        let connection = self
            .endpoints
            .connect("bench.scan")
            .await
            .map_err(|e| anyhow!(e))?;
        let mut reader = ChunkReader::open(connection, &self.stream, StreamOffset::First)
            .await
            .map_err(|e| anyhow!(e))?;
        let (mut read, mut found) = (0u64, None);
        let last = loop {
            let chunk = reader.next().await.map_err(|e| anyhow!(e))?;
            let mut last = None;
            for (offset, _) in chunk.into_offsets() {
                read += 1;
                if read == first {
                    found = Some(offset);
                }
                if read == second {
                    last = Some(offset);
                    break;
                }
            }
            if let Some(last) = last {
                break last;
            }
        };
        reader.close().await;
        Ok((found.context("the stream holds fewer messages")?, last))
    }

    /// The host's stream client alone: `ChunkReader` from `first`, and
    /// each message decoded as the host decodes it when `decode`.
    async fn bare_stream(&self, decode: bool) -> Result<Row> {
        let connection = self
            .endpoints
            .connect("bench.bare")
            .await
            .map_err(|e| anyhow!(e))?;
        let span = self.span();
        let mut reader = ChunkReader::open(connection, &self.stream, StreamOffset::First)
            .await
            .map_err(|e| anyhow!(e))?;
        let (mut read, mut chunks, mut waiting) = (0u64, 0u64, Duration::ZERO);
        let mut body_bytes = 0usize;
        'reading: loop {
            let asked = Instant::now();
            let chunk = reader.next().await.map_err(|e| anyhow!(e))?;
            waiting += asked.elapsed();
            chunks += 1;
            for (offset, message) in chunk.into_offsets() {
                if decode {
                    let view = to_amqp091(&message, &self.stream, offset)?;
                    body_bytes += view.body.len();
                    std::hint::black_box(view);
                } else {
                    std::hint::black_box(&message);
                }
                read += 1;
                if read == self.messages {
                    break 'reading;
                }
            }
        }
        let note = format!(
            "{chunks} chunks ({:.0} msgs each), {:.0} % of the time waiting for a chunk{}",
            read as f64 / chunks as f64,
            waiting.as_secs_f64() * 100.0 / span.at.elapsed().as_secs_f64(),
            if decode {
                wrong_bodies(read, body_bytes)
            } else {
                ""
            }
        );
        let row = span.end(read, note);
        reader.close().await;
        Ok(row)
    }

    /// RabbitMQ's own client for the stream protocol, reading from `first`
    /// as its documentation shows: a consumer whose deliveries are each
    /// message decoded (AMQP 1.0) with its offset; each body's length is
    /// added up, so nothing goes unread.
    async fn bare_client(&self) -> Result<Row> {
        use rabbitmq_stream_client::Environment;
        use rabbitmq_stream_client::types::OffsetSpecification;
        let environment = Environment::builder()
            .host("127.0.0.1")
            .port(self.broker.stream_port())
            .build()
            .await
            .map_err(|e| anyhow!("rabbitmq-stream-client: {e:?}"))?;
        let span = self.span();
        let mut consumer = environment
            .consumer()
            .offset(OffsetSpecification::First)
            .build(&self.stream)
            .await
            .map_err(|e| anyhow!("rabbitmq-stream-client: {e:?}"))?;
        let (mut read, mut body_bytes) = (0u64, 0usize);
        while read < self.messages {
            let delivery = consumer
                .next()
                .await
                .context("the rabbitmq-stream-client consumer ended")?
                .map_err(|e| anyhow!("rabbitmq-stream-client: {e:?}"))?;
            body_bytes += delivery.message().data().map_or(0, <[u8]>::len);
            read += 1;
        }
        let row = span.end(read, wrong_bodies(read, body_bytes).into());
        let _ = consumer.handle().close().await;
        Ok(row)
    }

    /// A subscription with `credit` chunks out, on the host's
    /// `StreamConnection` (the `ChunkReader` keeps one out), counting.
    async fn bare_credit(&self) -> Result<Row> {
        const ID: u8 = 1;
        let connection = self
            .endpoints
            .connect("bench.credit")
            .await
            .map_err(|e| anyhow!(e))?;
        let span = self.span();
        let (sender, mut events) = tokio::sync::mpsc::channel(usize::from(self.credit) + 1);
        connection
            .subscribe(ID, &self.stream, Start::First, self.credit, sender)
            .await
            .map_err(|e| anyhow!(e))?;
        let (mut read, mut chunks) = (0u64, 0u64);
        while read < self.messages {
            match events.recv().await {
                Some(SubscriptionEvent::Chunk(chunk)) => {
                    connection.credit(ID, 1).await.map_err(|e| anyhow!(e))?;
                    if chunk.kind == 0 {
                        chunks += 1;
                        read += chunk.records.len() as u64;
                    }
                }
                Some(SubscriptionEvent::Ended(why)) => bail!("the subscription ended: {why}"),
                None => bail!("the stream connection closed"),
            }
        }
        let read = read.min(self.messages);
        let row = span.end(
            read,
            format!(
                "{chunks} chunks ({:.0} msgs each)",
                read as f64 / chunks as f64
            ),
        );
        let _ = connection.unsubscribe(ID).await;
        connection.close().await;
        Ok(row)
    }

    /// lapin reading the stream from `first` with a large prefetch and a
    /// `multiple` ack every `multi_ack`, acks pipelined.
    async fn bare_amqp(&self) -> Result<Row> {
        let count = self.amqp_messages;
        let connection = self.broker.connect().await?;
        let channel = connection.create_channel().await?;
        channel
            .basic_qos(self.amqp_prefetch, BasicQosOptions { global: false })
            .await?;
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-stream-offset".into(),
            AMQPValue::LongString("first".into()),
        );
        let span = self.span();
        let mut deliveries = channel
            .basic_consume(
                self.stream.as_str().into(),
                "bench-bare".into(),
                BasicConsumeOptions::default(),
                arguments,
            )
            .await?;
        let mut in_flight: FuturesUnordered<BoxFuture<'static, lapin::Result<()>>> =
            FuturesUnordered::new();
        let mut read = 0u64;
        while read < count {
            let delivery = deliveries
                .next()
                .await
                .context("the broker cancelled the consumer")??;
            std::hint::black_box(&delivery.data);
            read += 1;
            if read.is_multiple_of(self.multi_ack) || read == count {
                let channel = channel.clone();
                let tag = delivery.delivery_tag;
                let mut ack = async move {
                    channel
                        .basic_ack(tag, BasicAckOptions { multiple: true })
                        .await
                }
                .boxed();
                // Its first poll queues the frame, so acks go out in order.
                match (&mut ack).now_or_never() {
                    Some(written) => written?,
                    None => in_flight.push(ack),
                }
                while let Some(Some(written)) = in_flight.next().now_or_never() {
                    written?;
                }
            }
        }
        while let Some(written) = in_flight.next().await {
            written?;
        }
        let row = span.end(
            count,
            format!(
                "prefetch {}, a multiple ack every {}",
                self.amqp_prefetch, self.multi_ack
            ),
        );
        let _ = connection.close(200, "bench done".into()).await;
        Ok(row)
    }
}

/// Where a row's span began.
struct Span {
    at: Instant,
    cpu: f64,
    broker: Option<f64>,
    broker_pid: Option<u32>,
}

impl Span {
    fn end(self, messages: u64, note: String) -> Row {
        let seconds = self.at.elapsed().as_secs_f64();
        let cpu = process_cpu() - self.cpu;
        let broker_now = self.broker_pid.and_then(|pid| cpu_seconds(pid).ok());
        Row {
            messages,
            seconds,
            cpu,
            broker_cpu: self.broker.zip(broker_now).map(|(then, now)| now - then),
            note,
        }
    }
}

/// User + system CPU time of this process (every thread) so far, in
/// seconds: getrusage, finer than `/proc/self/stat`'s clock ticks.
fn process_cpu() -> f64 {
    // SAFETY: getrusage only writes into the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// The broker VM's pid, from the pid file of a node this process started
/// (`RABBITMQ_PID_FILE`, in its folder); `None` for an external broker.
fn broker_pid(broker: &Broker) -> Option<u32> {
    let text = std::fs::read_to_string(broker.data_dir()?.join("node.pid")).ok()?;
    let pid: u32 = text.trim().parse().ok()?;
    cpu_seconds(pid).ok().map(|_| pid)
}

/// Sends this process's stderr to /dev/null while it lives (replay prints
/// a progress line every 1000 messages there), unless
/// `ACEMQ_BENCH_REPLAY_PROGRESS` is set.
struct QuietStderr(Option<libc::c_int>);

impl QuietStderr {
    fn new() -> Self {
        if std::env::var_os("ACEMQ_BENCH_REPLAY_PROGRESS").is_some() {
            return Self(None);
        }
        // SAFETY: plain descriptor calls on stderr and a file we open; the
        // saved copy is put back (and closed) on drop.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if null < 0 {
                return Self(None);
            }
            let saved = libc::dup(2);
            if saved < 0 {
                libc::close(null);
                return Self(None);
            }
            libc::dup2(null, 2);
            libc::close(null);
            Self(Some(saved))
        }
    }
}

impl Drop for QuietStderr {
    fn drop(&mut self) {
        if let Some(saved) = self.0.take() {
            // SAFETY: `saved` is the descriptor `new` duplicated from stderr.
            unsafe {
                libc::dup2(saved, 2);
                libc::close(saved);
            }
        }
    }
}
