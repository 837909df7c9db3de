//! A look-alike of RabbitMQ's PerfTest for acemq-host benchmarks (docs/targets.md):
//! its short flags (`-C` count, `-s` size, `-c` confirm window, `-A` multi-ack) follow PerfTest's.
//!
//! ```text
//! loadgen publish      --url URL --queue Q -C 20000 -s 1000 -c 500 --queue-type quorum
//! loadgen consume-bare --url URL --queue Q -C 20000 --prefetch 200 [-A 20] [--transform-to X]
//! loadgen consume-host --url URL --queue Q -C 20000 --prefetch 200 --plugin target/plugins/echo.wasm
//! loadgen consume-host --url URL --queue Q -C 20000 --prefetch 200 --transform-to X
//! ```
//!
//! `publish` declares the queue (durable) and publishes persistent messages
//! with a window of confirms in flight. The consume modes take exactly `-C`
//! messages and exit: `consume-bare` is a plain lapin consume-and-ack loop,
//! the baseline the host is measured against (`-A N` acks with `multiple`
//! every N messages instead, which is much cheaper in lapin); `consume-host`
//! runs the acemq-host library in this process with one consumer on the queue.
//!
//! With `--transform-to X` both consume modes do consume -> transform ->
//! publish (confirmed) -> ack: each message becomes the JSON
//! `{"input", "version", "input_id"}` published to exchange `X` (a fanout,
//! declared with a durable queue `X.sink` bound to it), and is acked once
//! that publish is confirmed. The host does it with the `stamp-v1` plugin;
//! the bare loop does the same work natively, with the confirms of every
//! delivery in flight awaited concurrently, as the host's are.
//!
//! Each mode ends with one machine-readable line on stdout:
//!
//! ```text
//! RESULT mode=bare messages=20000 seconds=1.9 rate=10526 cpu_us_per_msg=31.2
//! ```
//!
//! The clock of a consume mode starts just before it connects (for the host:
//! after its config and plugin are loaded, which the host does before it
//! connects too) and stops when the last message is acked; `cpu_us_per_msg`
//! is this process's user+system CPU over the same span.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand, ValueEnum};
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, Consumer};
use tokio_util::sync::CancellationToken;

use acemq_host::app;
use acemq_host::broker::BrokerUrl;
use acemq_host::config::LoadedConfig;
use acemq_host::telemetry::Metrics;

#[derive(Debug, Parser)]
#[command(
    name = "loadgen",
    about = "Load generator for acemq-host benchmarks (PerfTest-like flags)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Declare a durable queue and publish persistent messages with windowed confirms.
    Publish(PublishArgs),
    /// Consume N messages with a bare lapin loop (manual ack per message), then exit.
    ConsumeBare(BareArgs),
    /// Consume N messages through the acemq-host library running in this process, then exit.
    ConsumeHost(HostArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum QueueType {
    Quorum,
    Classic,
    Stream,
}

#[derive(Debug, clap::Args)]
struct PublishArgs {
    /// AMQP URL of the broker.
    #[arg(long, env = "ACEMQ_LOADGEN_URL")]
    url: String,
    /// Queue to declare and publish to (through the default exchange).
    #[arg(long, short = 'u')]
    queue: String,
    /// Messages to publish (PerfTest `-C/--pmessages`).
    #[arg(long, short = 'C', default_value_t = 20_000)]
    count: u64,
    /// Body size in bytes (PerfTest `-s/--size`).
    #[arg(long, short = 's', default_value_t = 1000)]
    size: usize,
    /// Confirms kept in flight (PerfTest `-c/--confirm`); 0 publishes without confirms.
    #[arg(long, short = 'c', default_value_t = 500)]
    confirm: usize,
    /// Type of the durable queue to declare.
    #[arg(long, value_enum, default_value_t = QueueType::Quorum)]
    queue_type: QueueType,
}

#[derive(Debug, clap::Args)]
struct ConsumeArgs {
    /// AMQP URL of the broker.
    #[arg(long, env = "ACEMQ_LOADGEN_URL")]
    url: String,
    /// Queue to consume from (must exist and hold at least `count` messages).
    #[arg(long, short = 'u')]
    queue: String,
    /// Messages to consume before exiting (PerfTest `-D/--cmessages`).
    #[arg(long, short = 'C', default_value_t = 20_000)]
    count: u64,
    /// Per-consumer prefetch (PerfTest `-q/--qos`).
    #[arg(long, short = 'q', default_value_t = 200)]
    prefetch: u16,
}

#[derive(Debug, clap::Args)]
struct BareArgs {
    #[command(flatten)]
    consume: ConsumeArgs,
    /// Ack with `multiple` every N messages (PerfTest `-A/--multi-ack-every`);
    /// 1 (the default) acks each message and awaits it.
    #[arg(long, short = 'A', default_value_t = 1)]
    multi_ack_every: u64,
    /// Transform each message and publish it (confirmed) to this exchange
    /// before acking it (see the module docs).
    #[arg(long, conflicts_with = "multi_ack_every")]
    transform_to: Option<String>,
}

#[derive(Debug, clap::Args)]
struct HostArgs {
    #[command(flatten)]
    consume: ConsumeArgs,
    /// Handler plugin for the consumer (default: target/plugins/echo.wasm).
    #[arg(long)]
    plugin: Option<PathBuf>,
    /// `concurrency` of the consumer: handler calls running at once.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// `[host] plugin_cache_dir`: compiled plugins are cached there.
    #[arg(long)]
    plugin_cache_dir: Option<PathBuf>,
    /// Transform with the `stamp-v1` plugin (unless `--plugin` says
    /// otherwise) and publish to this exchange (see the module docs).
    #[arg(long)]
    transform_to: Option<String>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    // The same runtime as the acemq-host binary: one worker per core.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Publish(args) => publish(args).await,
            Command::ConsumeBare(args) => consume_bare(args).await,
            Command::ConsumeHost(args) => consume_host(args).await,
        }
    })
}

async fn connect(url: &str, name: &str) -> Result<Connection> {
    // Parsed as the host parses it, so that neither an invalid URL nor
    // lapin's errors (which repeat a URL it parsed itself) show the password.
    let url =
        BrokerUrl::parse(url).map_err(|e| anyhow!("--url: the broker URL is invalid: {e}"))?;
    Connection::connect_uri(
        url.amqp_uri(),
        ConnectionProperties::default().with_connection_name(name.into()),
    )
    .await
    .map_err(|e| anyhow!("connecting to {url}: {}", url.scrub(&e.to_string())))
}

// ---------------------------------------------------------------- publish

async fn publish(args: PublishArgs) -> Result<()> {
    let connection = connect(&args.url, "loadgen-publish").await?;
    declare(&connection, &args.queue, args.queue_type).await?;
    let channel = connection.create_channel().await?;
    if args.confirm > 0 {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
    }
    let body: Vec<u8> = (0..args.size).map(|i| b'a' + (i % 26) as u8).collect();
    // Persistent (delivery mode 2), as PerfTest's `-f persistent`.
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/octet-stream".into());
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };

    let started = Instant::now();
    let mut pending = VecDeque::with_capacity(args.confirm);
    for _ in 0..args.count {
        if args.confirm > 0
            && pending.len() >= args.confirm
            && let Some(confirm) = pending.pop_front()
        {
            check(confirm).await?;
        }
        let confirm = channel
            .basic_publish(
                "".into(),
                args.queue.as_str().into(),
                options,
                &body,
                properties.clone(),
            )
            .await?;
        if args.confirm > 0 {
            pending.push_back(confirm);
        }
    }
    for confirm in pending {
        check(confirm).await?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let _ = connection.close(200, "loadgen done".into()).await;
    let rate = args.count as f64 / seconds;
    println!(
        "published {} in {seconds:.3} s ({rate:.0} msg/s)",
        args.count
    );
    println!(
        "RESULT mode=publish messages={} seconds={seconds:.6} rate={rate:.1}",
        args.count
    );
    Ok(())
}

async fn declare(connection: &Connection, queue: &str, queue_type: QueueType) -> Result<()> {
    let mut arguments = FieldTable::default();
    let kind = match queue_type {
        QueueType::Quorum => Some("quorum"),
        QueueType::Stream => Some("stream"),
        QueueType::Classic => None,
    };
    if let Some(kind) = kind {
        arguments.insert(
            ShortString::from("x-queue-type"),
            AMQPValue::LongString(LongString::from(kind)),
        );
    }
    // Its own channel: a refused declaration closes the channel, and lapin
    // does not reopen one the broker closed (as in topology::apply).
    let channel = connection.create_channel().await?;
    channel
        .queue_declare(queue.into(), QueueDeclareOptions::durable(), arguments)
        .await
        .with_context(|| format!("declaring queue {queue:?}"))?;
    let _ = channel.close(200, "declared".into()).await;
    Ok(())
}

async fn check(confirm: lapin::PublisherConfirm) -> Result<()> {
    match confirm.await.context("waiting for a publisher confirm")? {
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        Confirmation::Ack(Some(returned)) => {
            bail!(
                "the broker returned a message: {} {}",
                returned.reply_code,
                returned.reply_text
            )
        }
        Confirmation::Nack(_) => bail!("the broker nacked a message"),
    }
}

// ------------------------------------------------------------ consume-bare

async fn consume_bare(bare: BareArgs) -> Result<()> {
    if let Some(exchange) = &bare.transform_to {
        return consume_bare_transform(bare.consume, exchange).await;
    }
    let args = bare.consume;
    let every = bare.multi_ack_every.max(1);
    let clock = Clock::start();
    let connection = connect(&args.url, "loadgen-consume-bare").await?;
    let (channel, mut consumer) = subscribe(&connection, &args).await?;
    let mut consumed = 0u64;
    while consumed < args.count {
        let delivery = next_delivery(&mut consumer, consumed).await?;
        consumed += 1;
        if every == 1 {
            // One ack per message, awaited, as the host does.
            delivery.ack(BasicAckOptions::default()).await?;
        } else if consumed.is_multiple_of(every) || consumed == args.count {
            delivery.ack(BasicAckOptions { multiple: true }).await?;
        }
    }
    let result = clock.stop("bare", consumed);
    shut(&channel, &connection).await;
    result.print();
    Ok(())
}

/// The bare loop doing the host's work with the stamp plugin: transform,
/// publish with a confirm, ack once confirmed. Every delivery's confirm is
/// awaited in a task of its own, so confirms overlap as the host's do.
async fn consume_bare_transform(args: ConsumeArgs, exchange: &str) -> Result<()> {
    let clock = Clock::start();
    let connection = connect(&args.url, "loadgen-consume-bare-transform").await?;
    declare_sink(&connection, exchange).await?;
    let publisher = connection.create_channel().await?;
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let (channel, mut consumer) = subscribe(&connection, &args).await?;
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into());
    let mut settling = tokio::task::JoinSet::new();
    let mut consumed = 0u64;
    while consumed < args.count {
        let delivery = next_delivery(&mut consumer, consumed).await?;
        consumed += 1;
        let input = std::str::from_utf8(&delivery.data).context("a body that is not UTF-8")?;
        let input_id = delivery
            .properties
            .message_id()
            .as_ref()
            .map_or("", |id| id.as_str());
        let body = serde_json::to_vec(&serde_json::json!({
            "input": input,
            "version": "bare",
            "input_id": input_id,
        }))?;
        let confirm = publisher
            .basic_publish(
                exchange.into(),
                "stamped".into(),
                options,
                &body,
                properties.clone(),
            )
            .await?;
        settling.spawn(async move {
            check(confirm).await?;
            delivery.ack(BasicAckOptions::default()).await?;
            anyhow::Ok(())
        });
        while let Some(done) = settling.try_join_next() {
            done??;
        }
    }
    while let Some(done) = settling.join_next().await {
        done??;
    }
    let result = clock.stop("bare-transform", consumed);
    shut(&channel, &connection).await;
    result.print();
    Ok(())
}

/// The bare loops' subscription: a channel with the prefetch, consuming
/// `args.queue` with manual acks.
async fn subscribe(connection: &Connection, args: &ConsumeArgs) -> Result<(Channel, Consumer)> {
    let channel = connection.create_channel().await?;
    channel
        .basic_qos(args.prefetch, BasicQosOptions { global: false })
        .await?;
    let consumer = channel
        .basic_consume(
            args.queue.as_str().into(),
            "loadgen-bare".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("consuming from {:?}", args.queue))?;
    Ok((channel, consumer))
}

/// The next delivery; the stream ending means the broker cancelled us.
async fn next_delivery(consumer: &mut Consumer, consumed: u64) -> Result<Delivery> {
    match consumer.next().await {
        Some(delivery) => Ok(delivery?),
        None => bail!("the broker cancelled the consumer after {consumed} messages"),
    }
}

/// Exchange `exchange` (fanout) and the durable queue `{exchange}.sink`
/// bound to it, where transformed messages go.
async fn declare_sink(connection: &Connection, exchange: &str) -> Result<()> {
    let channel = connection.create_channel().await?;
    channel
        .exchange_declare(
            exchange.into(),
            lapin::ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("declaring exchange {exchange:?}"))?;
    let sink = format!("{exchange}.sink");
    declare(connection, &sink, QueueType::Classic).await?;
    channel
        .queue_bind(
            sink.as_str().into(),
            exchange.into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let _ = channel.close(200, "declared".into()).await;
    Ok(())
}

async fn shut(channel: &Channel, connection: &Connection) {
    let _ = channel
        .basic_cancel("loadgen-bare".into(), BasicCancelOptions::default())
        .await;
    let _ = connection.close(200, "loadgen done".into()).await;
}

// ------------------------------------------------------------ consume-host

async fn consume_host(args: HostArgs) -> Result<()> {
    let plugin = match (args.plugin, &args.transform_to) {
        (Some(path), _) => path,
        (None, Some(_)) => acemq_tests::host::plugin_path("stamp-v1"),
        (None, None) => acemq_tests::host::plugin_path("echo"),
    };
    if let Some(exchange) = &args.transform_to {
        let connection = connect(&args.consume.url, "loadgen-declare").await?;
        declare_sink(&connection, exchange).await?;
        let _ = connection.close(200, "declared".into()).await;
    }
    let plugin =
        std::fs::canonicalize(&plugin).with_context(|| format!("plugin {}", plugin.display()))?;
    let text = host_config(
        &args.consume,
        &plugin,
        args.concurrency,
        args.plugin_cache_dir.as_deref(),
        args.transform_to.as_deref(),
    );
    let loaded =
        LoadedConfig::parse(Path::new("loadgen-host.toml"), text).map_err(|e| anyhow!("{e}"))?;
    // Config, topology and plugin compilation: not part of the measurement,
    // as with the bare loop (the host does all of it before it connects).
    let prepared = tokio::task::spawn_blocking(move || app::prepare(loaded)).await??;

    let queue = args.consume.queue.clone();
    let count = args.consume.count;
    let metrics = Arc::new(Metrics::new());
    let shutdown = CancellationToken::new();
    let clock = Clock::start();
    let mut host = tokio::spawn(app::run(prepared, shutdown.clone(), metrics.clone()));

    // The metrics counter is the exact signal; 1 ms is the timer's resolution.
    let mut last_progress = (0, Instant::now());
    loop {
        let acked = metrics.consumed_count(&queue, "acked");
        if acked >= count {
            break;
        }
        if acked != last_progress.0 {
            last_progress = (acked, Instant::now());
        } else if last_progress.1.elapsed() > Duration::from_secs(30) {
            bail!(
                "no progress for 30 s at {acked} of {count} acked: {}",
                metrics.render()
            );
        }
        tokio::select! {
            finished = &mut host => bail!("the host stopped after {acked} of {count} messages: {:?}", finished?),
            _ = tokio::time::sleep(Duration::from_millis(1)) => {}
        }
    }
    let result = clock.stop("host", count);

    // Drained means nothing ready either (and nothing settled any other way).
    let ready = ready_count(&args.consume.url, &queue).await?;
    let other: u64 = ["retried", "dead_lettered", "parked", "rejected"]
        .iter()
        .map(|outcome| metrics.consumed_count(&queue, outcome))
        .sum();
    shutdown.cancel();
    host.await??;
    if ready != 0 || other != 0 {
        bail!(
            "queue {queue:?} not drained cleanly: {ready} ready, {other} settled other than acked"
        );
    }
    result.print();
    Ok(())
}

/// One consumer on the queue, and no `[[queues]]`: the queue was declared by
/// `publish`, so the topology to apply is empty.
fn host_config(
    args: &ConsumeArgs,
    plugin: &Path,
    concurrency: usize,
    cache: Option<&Path>,
    transform_to: Option<&str>,
) -> String {
    let quoted = |s: &str| toml::Value::String(s.to_string()).to_string();
    let mut text = format!(
        "[broker]\nurl = {}\nconnection_name = \"loadgen-consume-host\"\n\n",
        quoted(&args.url)
    );
    if let Some(cache) = cache {
        text.push_str(&format!(
            "[host]\nplugin_cache_dir = {}\n\n",
            quoted(&cache.to_string_lossy())
        ));
    }
    text.push_str(&format!(
        "[[consumers]]\nqueue = {}\nplugin = {}\nprefetch = {}\nconcurrency = {concurrency}\n",
        quoted(&args.queue),
        quoted(&plugin.to_string_lossy()),
        args.prefetch
    ));
    if let Some(exchange) = transform_to {
        text.push_str(&format!(
            "publish_to = [{0}]\n\n[consumers.config]\nout_exchange = {0}\n",
            quoted(exchange)
        ));
    }
    text
}

/// Ready messages of `queue`, from a passive declare.
async fn ready_count(url: &str, queue: &str) -> Result<u32> {
    let connection = connect(url, "loadgen-check").await?;
    let channel = connection.create_channel().await?;
    let declared = acemq_tests::broker::passive_declare(&channel, queue).await?;
    let _ = connection.close(200, "checked".into()).await;
    Ok(declared.message_count())
}

// ------------------------------------------------------------ measurement

/// Wall time and this process's CPU time from one point to another.
struct Clock {
    wall: Instant,
    cpu: Duration,
}

struct Measured {
    mode: &'static str,
    messages: u64,
    seconds: f64,
    cpu: Duration,
}

impl Clock {
    fn start() -> Self {
        Self {
            wall: Instant::now(),
            cpu: process_cpu(),
        }
    }

    fn stop(self, mode: &'static str, messages: u64) -> Measured {
        Measured {
            mode,
            messages,
            seconds: self.wall.elapsed().as_secs_f64(),
            cpu: process_cpu().saturating_sub(self.cpu),
        }
    }
}

impl Measured {
    fn print(&self) {
        let rate = self.messages as f64 / self.seconds;
        let cpu_per_msg = self.cpu.as_secs_f64() * 1e6 / self.messages.max(1) as f64;
        println!(
            "consumed {} ({}) in {:.3} s ({rate:.0} msg/s, {cpu_per_msg:.1} µs CPU per message)",
            self.messages, self.mode, self.seconds
        );
        println!(
            "RESULT mode={} messages={} seconds={:.6} rate={rate:.1} cpu_us_per_msg={cpu_per_msg:.2}",
            self.mode, self.messages, self.seconds
        );
    }
}

/// User + system CPU time of this process (every thread) so far.
fn process_cpu() -> Duration {
    // SAFETY: getrusage only writes into the struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let micros = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    micros(usage.ru_utime) + micros(usage.ru_stime)
}
