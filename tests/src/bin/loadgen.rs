//! A look-alike of RabbitMQ's PerfTest for acemq-host benchmarks (docs/targets.md):
//! its short flags (`-C` count, `-s` size, `-c` confirm window, `-A` multi-ack) follow PerfTest's.
//!
//! ```text
//! loadgen publish      --url URL --queue Q -C 50000 -s 1000 -c 500 --queue-type quorum
//! loadgen consume-bare --url URL --queue Q -C 50000 --prefetch 200 [-A 20] [--transform-to X]
//! loadgen consume-host --url URL --queue Q -C 50000 --prefetch 200 --plugin target/plugins/echo.wasm
//! loadgen consume-host --url URL --queue Q -C 50000 --prefetch 200 --transform-to X
//! loadgen publish      --url URL --queue Q -C 20000 --orders
//! loadgen consume-host --url URL --queue Q -C 20000 --plugin target/plugins/order-router-py.wasm \
//!     --transform-to X --exchange-key events_exchange
//! ```
//!
//! `publish` declares the queue (durable) and publishes persistent messages
//! with a window of confirms in flight. The consume modes take exactly `-C`
//! messages and exit. `consume-bare` is a plain lapin consume-and-ack loop,
//! written to be the fastest bare consumer, since it is the baseline the host
//! is measured against: `-A N` acks with `multiple` every N messages; without
//! it (`-A 1`) every message gets an ack of its own. Either way acks are
//! pipelined: each is sent as its delivery is taken, and awaited only later
//! (see [`Acks`]). `consume-host` runs the acemq-host library in this
//! process with one consumer on the queue.
//!
//! With `--transform-to X` both consume modes do consume -> transform ->
//! publish (confirmed) -> ack: each message becomes the JSON
//! `{"input", "version", "input_id"}` published to exchange `X` (a fanout,
//! declared with a durable queue `X.sink` bound to it), and is acked once
//! that publish is confirmed. The host does it with the `stamp-v1` plugin;
//! the bare loop does the same work natively on one confirm channel, with
//! up to the prefetch of publishes being written or awaiting their
//! confirms (none awaited alone), settled in publish order, and acks every
//! `-A` confirmed inputs (with `multiple`).
//! Another plugin that publishes (the order routers, on the orders that
//! `publish --orders` writes) is given the exchange under the config key
//! `--exchange-key`.
//!
//! Each mode ends with one machine-readable line on stdout:
//!
//! ```text
//! RESULT mode=bare-multi-ack messages=50000 seconds=1.9 rate=26315.8 cpu_us_per_msg=31.20 steady_messages=40000 steady_seconds=1.4 steady_rate=28571.4 steady_cpu_us_per_msg=29.80 steady_io_cpu_us_per_msg=21.90 steady_allocs_per_msg=13.0
//! ```
//!
//! The clock of a consume mode starts just before it connects (for the host:
//! after its config and plugin are loaded, which the host does before it
//! connects too) and stops when the last message is acked; `cpu_us_per_msg`
//! is this process's user+system CPU over the same span. The `steady_`
//! figures cover the span from 10 % to 90 % of the messages acked, which
//! leaves out connecting, the first deliveries and the tail;
//! `steady_io_cpu_us_per_msg` is the part of that CPU spent on lapin's I/O
//! threads (one per connection), and the rest is the runtime's workers;
//! `steady_allocs_per_msg` counts the process's allocations over the span
//! (`acemq_tests::counting_alloc`), exact where CPU figures are noisy.

/// The allocator the acemq-host binary ships with (host/src/main.rs), for
/// the host and the bare consumers alike: the comparison stays like for like.
/// Counted (`steady_allocs_per_msg`); the count costs each allocation a
/// load and a store on a line of the thread's own, on both sides alike.
#[global_allocator]
static ALLOCATOR: Counting<mimalloc::MiMalloc> = Counting(mimalloc::MiMalloc);

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand, ValueEnum};
use futures::future::BoxFuture;
use futures::stream::{FuturesOrdered, FuturesUnordered};
use futures::{FutureExt as _, StreamExt as _};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, DeliveryTag, FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, Consumer,
    PublisherConfirm,
};
use tokio_util::sync::CancellationToken;

use acemq_host::app;
use acemq_host::broker::BrokerUrl;
use acemq_host::config::LoadedConfig;
use acemq_host::envelope::{self, Envelope};
use acemq_host::telemetry::Metrics;
use acemq_tests::counting_alloc::{self, Counting};

#[derive(Debug, Parser)]
#[command(
    name = "loadgen",
    about = "Load generator for acemq-host benchmarks (PerfTest-like flags)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The runtime's workers (`[host] worker_threads`); the host's default
    /// (one per core) when absent.
    #[arg(long, global = true)]
    worker_threads: Option<std::num::NonZeroUsize>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Declare a durable queue and publish persistent messages with windowed confirms.
    Publish(PublishArgs),
    /// Consume N messages with a bare lapin loop (pipelined manual acks), then exit.
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
    /// Publish valid JSON orders for the order routers (`{"id", "customer",
    /// "total"}`, each different, about 60 bytes) instead of `-s` bytes of
    /// letters.
    #[arg(long, conflicts_with = "size")]
    orders: bool,
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
    /// Ack with `multiple` every N messages (PerfTest `-A/--multi-ack-every`),
    /// or every N confirmed inputs with `--transform-to`; 1 (the default)
    /// sends an ack of its own for each message.
    #[arg(long, short = 'A', default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    multi_ack_every: u64,
    /// Transform each message and publish it (confirmed) to this exchange
    /// before acking it (see the module docs).
    #[arg(long)]
    transform_to: Option<String>,
    /// With `--transform-to`: stamp each output with the AceMQ envelope the
    /// host writes on its outputs (its six `x-acemq-*` headers and a message
    /// id, built by the host library's own envelope code), so that both put
    /// the same messages on the wire.
    #[arg(long, requires = "transform_to")]
    envelope: bool,
    /// With `--transform-to`: publish on a connection of its own, as the
    /// host does (RabbitMQ blocks a connection that publishes during a
    /// resource alarm, its acks and deliveries included; the host keeps its
    /// consumers off that connection). For reference: what the second
    /// connection costs a bare loop.
    #[arg(long, requires = "transform_to")]
    publish_connection: bool,
}

#[derive(Debug, clap::Args)]
struct HostArgs {
    #[command(flatten)]
    consume: ConsumeArgs,
    /// Handler plugin for the consumer (default: target/plugins/echo.wasm).
    #[arg(long)]
    plugin: Option<PathBuf>,
    /// `concurrency` of the consumer: handler calls running at once. Unset,
    /// the config leaves it out, so that the host's default is measured.
    #[arg(long)]
    concurrency: Option<usize>,
    /// `[host] plugin_cache_dir`: compiled plugins are cached there.
    #[arg(long)]
    plugin_cache_dir: Option<PathBuf>,
    /// Transform with the `stamp-v1` plugin (unless `--plugin` says
    /// otherwise) and publish to this exchange (see the module docs).
    #[arg(long)]
    transform_to: Option<String>,
    /// With `--transform-to`: the key of the consumer's `[consumers.config]`
    /// that names the exchange to the plugin (`events_exchange` for the
    /// order routers).
    #[arg(long, default_value = "out_exchange", requires = "transform_to")]
    exchange_key: String,
    /// Lines added to the consumer's `[[consumers]]` entry (`state = "bench"`).
    #[arg(long)]
    consumer_keys: Option<String>,
    /// Text added at the end of the config (`[state]` ..., `[consumers.config]` ...).
    #[arg(long)]
    config_tail: Option<String>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    // The same runtime as the acemq-host binary's.
    let runtime = acemq_host::runtime::build(cli.worker_threads)?;
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
    let letters: Vec<u8> = (0..args.size).map(|i| b'a' + (i % 26) as u8).collect();
    let content_type = if args.orders {
        "application/json"
    } else {
        "application/octet-stream"
    };
    // Persistent (delivery mode 2), as PerfTest's `-f persistent`.
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type(content_type.into());
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };

    let started = Instant::now();
    let mut pending = VecDeque::with_capacity(args.confirm);
    for n in 0..args.count {
        let order;
        let body = if args.orders {
            order = order_body(n);
            order.as_bytes()
        } else {
            &letters
        };
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
                body,
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

/// The `n`th order of `publish --orders`: valid for the order routers
/// (a positive total), and each one different, as real orders are.
fn order_body(n: u64) -> String {
    format!(
        r#"{{"id":"o-{n}","customer":"customer-{}","total":{}.{}}}"#,
        n % 97,
        1 + n % 500,
        n % 100
    )
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

async fn check(confirm: PublisherConfirm) -> Result<()> {
    confirmed(confirm.await)
}

/// A publish's confirmation, as an error unless the broker took it.
fn confirmed(confirmation: lapin::Result<Confirmation>) -> Result<()> {
    match confirmation.context("waiting for a publisher confirm")? {
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
    let every = bare.multi_ack_every;
    if let Some(exchange) = &bare.transform_to {
        let shape = TransformShape {
            envelope: bare.envelope,
            publish_connection: bare.publish_connection,
        };
        return consume_bare_transform(bare.consume, every, exchange, shape).await;
    }
    let args = bare.consume;
    let mut clock = Clock::start(args.count);
    let connection = connect(&args.url, "loadgen-consume-bare").await?;
    let (channel, mut consumer) = subscribe(&connection, &args).await?;
    let mut acks = Acks::new(&channel, every, args.count);
    let mut consumed = 0u64;
    while consumed < args.count {
        let delivery = next_delivery(&mut consumer, consumed).await?;
        consumed += 1;
        clock.settled(acks.done(delivery.delivery_tag)?);
    }
    acks.finish().await?;
    let mode = if every > 1 {
        "bare-multi-ack"
    } else {
        "bare-single-ack"
    };
    let result = clock.stop(mode, consumed);
    shut(&channel, &connection).await;
    result.print();
    Ok(())
}

/// The bare loop doing the host's work with the stamp plugin: transform,
/// publish on one confirm channel, ack once confirmed.
///
/// No task per delivery, and no wait per publish: each publish and then its
/// confirm is one future in a queue kept in publish order, all of them
/// polled together, so the loop takes the next delivery while lapin's I/O
/// thread writes the last one out. (Awaiting each `basic_publish` inline,
/// as this loop once did, parks the loop until lapin's I/O thread has
/// written that frame: a wake-up of each thread by the other per message,
/// which was most of that loop's CPU and made it a weak baseline.) The
/// loop settles the oldest as soon as it is confirmed. Settling in publish
/// order is what lets one `multiple` ack cover every input up to the last
/// one settled: each of their outputs is confirmed. RabbitMQ confirms a
/// channel's publishes in order in practice, so the oldest is the next to
/// resolve; one confirmed early just waits its turn.
async fn consume_bare_transform(
    args: ConsumeArgs,
    every: u64,
    exchange: &str,
    shape: TransformShape,
) -> Result<()> {
    let mut clock = Clock::start(args.count);
    let connection = connect(&args.url, "loadgen-consume-bare-transform").await?;
    declare_sink(&connection, exchange).await?;
    let publishing = if shape.publish_connection {
        Some(connect(&args.url, "loadgen-consume-bare-transform.publish").await?)
    } else {
        None
    };
    let publisher = publishing
        .as_ref()
        .unwrap_or(&connection)
        .create_channel()
        .await?;
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let (channel, mut consumer) = subscribe(&connection, &args).await?;
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into());
    // Every unconfirmed output's input is unacked, so the broker already
    // holds the queue to the prefetch; the bound is explicit so that it does
    // not rest on the broker alone.
    let window = usize::from(args.prefetch.max(1));
    let mut unconfirmed = FuturesOrdered::new();
    let mut acks = Acks::new(&channel, every, args.count);
    let (mut consumed, mut acked) = (0u64, 0u64);
    while acked < args.count {
        tokio::select! {
            // Confirms first: settling one may free a place in the prefetch
            // for the next delivery.
            biased;
            Some((confirmation, tag)) = unconfirmed.next() => {
                confirmed(confirmation)?;
                acked = acks.done(tag)?;
                clock.settled(acked);
            }
            delivery = next_delivery(&mut consumer, consumed),
                if consumed < args.count && unconfirmed.len() < window =>
            {
                let delivery = delivery?;
                consumed += 1;
                let properties = if shape.envelope {
                    stamped_properties()?
                } else {
                    properties.clone()
                };
                let body = stamp(&delivery)?;
                unconfirmed.push_back(publish_confirmed(
                    publisher.clone(),
                    exchange.into(),
                    body,
                    properties,
                    delivery.delivery_tag,
                ));
            }
        }
    }
    acks.finish().await?;
    let result = clock.stop("bare-transform", acked);
    shut(&channel, &connection).await;
    if let Some(publishing) = publishing {
        let _ = publishing.close(200, "loadgen done".into()).await;
    }
    result.print();
    Ok(())
}

/// How the bare transform loop publishes: see [`BareArgs`].
#[derive(Debug, Clone, Copy)]
struct TransformShape {
    envelope: bool,
    publish_connection: bool,
}

/// Publishes one stamped output (mandatory) and waits for its confirm;
/// carries the input's tag to its settling.
async fn publish_confirmed(
    publisher: Channel,
    exchange: ShortString,
    body: Vec<u8>,
    properties: BasicProperties,
    tag: DeliveryTag,
) -> (lapin::Result<Confirmation>, DeliveryTag) {
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let confirmation = match publisher
        .basic_publish(exchange, "stamped".into(), options, &body, properties)
        .await
    {
        Ok(confirm) => confirm.await,
        Err(e) => Err(e),
    };
    (confirmation, tag)
}

/// The properties the host gives a `stamp-v1` output: JSON, persistent, and
/// a fresh AceMQ envelope (the host's own code writes it).
fn stamped_properties() -> Result<BasicProperties> {
    let envelope = Envelope::new("stamped", envelope::default_origin(), envelope::now_ms());
    Ok(envelope::outgoing_properties(
        &envelope,
        Some("application/json"),
        true,
        &[],
        [],
    )?)
}

/// What the `stamp-v1` plugin makes of a message, done natively.
fn stamp(delivery: &Delivery) -> Result<Vec<u8>> {
    let input = std::str::from_utf8(&delivery.data).context("a body that is not UTF-8")?;
    let input_id = delivery
        .properties
        .message_id()
        .as_ref()
        .map_or("", |id| id.as_str());
    Ok(serde_json::to_vec(&serde_json::json!({
        "input": input,
        "version": "bare",
        "input_id": input_id,
    }))?)
}

/// A bare loop's acks: one for every `every` messages done (with
/// `multiple` when `every` > 1), and one for the last of `count`.
///
/// Pipelined: each ack is sent the moment it is due and awaited only later.
/// lapin resolves an ack once its frame is written out, so awaiting each
/// before taking the next delivery holds the loop on lapin's writer for
/// every ack (with an ack per message, that more than halved the rate on a
/// two-core machine; with `-A 20` it made no measurable difference). The acks go through the channel (`Channel::basic_ack`),
/// not the deliveries' `Acker`: an `Acker` hands its ack to lapin's internal
/// RPC task, which spawns a task to send it, which costs CPU per ack and
/// lets acks go out in any order, and a `multiple` ack overtaken by a later
/// one names a tag already acked, for which the broker closes the channel.
struct Acks {
    channel: Channel,
    every: u64,
    count: u64,
    /// Messages done so far, and how many of them an ack has been sent for.
    done: u64,
    acked: u64,
    /// Acks sent whose frames lapin has not yet reported written.
    in_flight: FuturesUnordered<BoxFuture<'static, lapin::Result<()>>>,
}

impl Acks {
    fn new(channel: &Channel, every: u64, count: u64) -> Self {
        Self {
            channel: channel.clone(),
            every: every.max(1),
            count,
            done: 0,
            acked: 0,
            in_flight: FuturesUnordered::new(),
        }
    }

    /// Delivery `tag` is done, and so is every delivery before it (the
    /// loops finish them in delivery order); acks if one is due. Returns
    /// how many messages have been acked so far.
    fn done(&mut self, tag: DeliveryTag) -> Result<u64> {
        self.done += 1;
        if self.done - self.acked < self.every && self.done < self.count {
            return Ok(self.acked);
        }
        let channel = self.channel.clone();
        let options = BasicAckOptions {
            multiple: self.every > 1,
        };
        let mut ack = async move { channel.basic_ack(tag, options).await }.boxed();
        // Its first poll queues the frame: done here, so that acks go out in
        // the order they are made.
        match (&mut ack).now_or_never() {
            Some(written) => written.context("acking")?,
            None => self.in_flight.push(ack),
        }
        self.acked = self.done;
        // Collect the finished ones: errors surface early, and the set stays small.
        while let Some(Some(written)) = self.in_flight.next().now_or_never() {
            written.context("acking")?;
        }
        Ok(self.acked)
    }

    /// Waits until every ack sent is written out.
    async fn finish(mut self) -> Result<()> {
        while let Some(written) = self.in_flight.next().await {
            written.context("acking")?;
        }
        Ok(())
    }
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
    let mut text = host_config(
        &args.consume,
        &plugin,
        args.concurrency,
        args.plugin_cache_dir.as_deref(),
        args.transform_to
            .as_deref()
            .map(|exchange| (exchange, args.exchange_key.as_str())),
        args.consumer_keys.as_deref(),
    );
    if let Some(tail) = &args.config_tail {
        text.push_str(&format!("\n{tail}\n"));
    }
    let loaded =
        LoadedConfig::parse(Path::new("loadgen-host.toml"), text).map_err(|e| anyhow!("{e}"))?;
    // Config, topology and plugin compilation: not part of the measurement,
    // as with the bare loop (the host does all of it before it connects).
    let metrics = Arc::new(Metrics::new());
    let registry = metrics.clone();
    let prepared = tokio::task::spawn_blocking(move || app::prepare(loaded, &registry)).await??;

    let queue = args.consume.queue.clone();
    let count = args.consume.count;
    let shutdown = CancellationToken::new();
    let mut clock = Clock::start(count);
    let mut host = tokio::spawn(app::run(prepared, shutdown.clone(), metrics.clone()));

    // The metrics counter is the exact signal. Read every 10 ms, not every
    // 1: each read is a timer wake-up in the host's process, which the bare
    // loops (counting their acks inline) do not pay, and at 1 ms those cost
    // the host 1–2 µs a message on the transform path (4 interleaved
    // rounds, medians 46.1 against 44.7 µs). The marks stay exact: each reads
    // the count at its own instant, so a span's messages and seconds match.
    let mut last_progress = (0, Instant::now());
    loop {
        let acked = metrics.consumed_count(&queue, "acked");
        clock.settled(acked);
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
            _ = tokio::time::sleep(PROGRESS_READ_EVERY) => {}
        }
    }
    let mode = if args.transform_to.is_some() {
        "host-transform"
    } else {
        "host"
    };
    let result = clock.stop(mode, count);

    // Drained means nothing ready either (and nothing settled any other way).
    let ready = ready_count(&args.consume.url, &queue).await?;
    let other: u64 = ["retried", "dead_lettered", "parked", "rejected"]
        .iter()
        .map(|outcome| metrics.consumed_count(&queue, outcome))
        .sum();
    // A shadow's calls (a candidate in the config's tail), printed beside
    // the figures: what its cost was the cost of.
    let exposition = metrics.render();
    let shadowed = |result| {
        acemq_tests::host::metric_sum(
            &exposition,
            "acemq_shadow_calls_total",
            &[("queue", queue.as_str()), ("result", result)],
        )
    };
    let shadow = (
        shadowed("same") + shadowed("different"),
        shadowed("skipped"),
    );
    shutdown.cancel();
    host.await??;
    if shadow != (0.0, 0.0) {
        println!("SHADOW compared={} skipped={}", shadow.0, shadow.1);
    }
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
    concurrency: Option<usize>,
    cache: Option<&Path>,
    transform_to: Option<(&str, &str)>,
    consumer_keys: Option<&str>,
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
        "[[consumers]]\nqueue = {}\nplugin = {}\nprefetch = {}\n",
        quoted(&args.queue),
        quoted(&plugin.to_string_lossy()),
        args.prefetch
    ));
    // Left out unless given, so that the host's default is what is measured.
    if let Some(concurrency) = concurrency {
        text.push_str(&format!("concurrency = {concurrency}\n"));
    }
    if let Some(keys) = consumer_keys {
        text.push_str(&format!("{keys}\n"));
    }
    if let Some((exchange, key)) = transform_to {
        text.push_str(&format!(
            "publish_to = [{0}]\n\n[consumers.config]\n{key} = {0}\n",
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

/// Wall and CPU time of this process at one moment, and how many messages
/// had been acked by then.
#[derive(Debug, Clone, Copy)]
struct Mark {
    wall: Instant,
    cpu: Duration,
    /// Of `cpu`, what lapin's I/O threads have spent.
    io_cpu: Duration,
    /// Allocations made so far, by every thread.
    allocations: u64,
    acked: u64,
}

impl Mark {
    fn now(acked: u64) -> Self {
        Self {
            wall: Instant::now(),
            cpu: process_cpu(),
            io_cpu: lapin_io_cpu(),
            allocations: counting_alloc::allocations(),
            acked,
        }
    }
}

/// A consume mode's measurement: the whole span, from just before it
/// connects to its last ack, and the steady span, from when 10 % of the
/// `count` messages are acked to when 90 % are. The steady span leaves out
/// connecting, the prefetch filling and the tail, so it is the rate at which
/// a long backlog drains (the issue measured it from 45,000 to 5,000
/// messages left of 50,000).
struct Clock {
    start: Mark,
    /// Acked counts at which the steady span starts and ends.
    steady_at: [u64; 2],
    steady: [Option<Mark>; 2],
}

/// Messages, seconds and CPU between two marks.
#[derive(Debug, Clone, Copy)]
struct Span {
    messages: u64,
    seconds: f64,
    cpu: Duration,
    io_cpu: Duration,
    allocations: u64,
}

struct Measured {
    mode: &'static str,
    whole: Span,
    steady: Span,
}

impl Clock {
    fn start(count: u64) -> Self {
        Self {
            start: Mark::now(0),
            steady_at: [count / 10, count - count / 10].map(|at| at.max(1)),
            steady: [None; 2],
        }
    }

    /// `acked` messages are acked so far: notes the ends of the steady span
    /// as they are passed. Cheap until then (a loop calls it per message).
    fn settled(&mut self, acked: u64) {
        for (mark, at) in self.steady.iter_mut().zip(self.steady_at) {
            if mark.is_none() && acked >= at {
                *mark = Some(Mark::now(acked));
            }
        }
    }

    fn stop(self, mode: &'static str, messages: u64) -> Measured {
        let end = Mark::now(messages);
        let whole = Span::between(self.start, end);
        // A run too short or too coarse (the host's counter is polled) to
        // have passed the two ends at different counts has no steady span
        // of its own: the whole one stands in.
        let steady = match self.steady {
            [Some(from), Some(to)] if to.acked > from.acked => Span::between(from, to),
            _ => whole,
        };
        Measured {
            mode,
            whole,
            steady,
        }
    }
}

impl Span {
    fn between(from: Mark, to: Mark) -> Self {
        Self {
            messages: to.acked - from.acked,
            seconds: (to.wall - from.wall).as_secs_f64(),
            cpu: to.cpu.saturating_sub(from.cpu),
            io_cpu: to.io_cpu.saturating_sub(from.io_cpu),
            allocations: to.allocations.saturating_sub(from.allocations),
        }
    }

    fn rate(&self) -> f64 {
        self.messages as f64 / self.seconds
    }

    fn cpu_us_per_msg(&self) -> f64 {
        self.per_msg(self.cpu.as_secs_f64() * 1e6)
    }

    fn io_cpu_us_per_msg(&self) -> f64 {
        self.per_msg(self.io_cpu.as_secs_f64() * 1e6)
    }

    fn allocations_per_msg(&self) -> f64 {
        self.per_msg(self.allocations as f64)
    }

    /// `total` over the span, per message.
    fn per_msg(&self, total: f64) -> f64 {
        total / self.messages.max(1) as f64
    }
}

impl Measured {
    fn print(&self) {
        let (whole, steady) = (&self.whole, &self.steady);
        println!(
            "consumed {} ({}) in {:.3} s ({:.0} msg/s, {:.1} µs CPU per message; \
             from 10 % to 90 % acked: {:.0} msg/s, {:.1} µs CPU per message)",
            whole.messages,
            self.mode,
            whole.seconds,
            whole.rate(),
            whole.cpu_us_per_msg(),
            steady.rate(),
            steady.cpu_us_per_msg(),
        );
        println!(
            "RESULT mode={} messages={} seconds={:.6} rate={:.1} cpu_us_per_msg={:.2} \
             steady_messages={} steady_seconds={:.6} steady_rate={:.1} steady_cpu_us_per_msg={:.2} \
             steady_io_cpu_us_per_msg={:.2} steady_allocs_per_msg={:.1}",
            self.mode,
            whole.messages,
            whole.seconds,
            whole.rate(),
            whole.cpu_us_per_msg(),
            steady.messages,
            steady.seconds,
            steady.rate(),
            steady.cpu_us_per_msg(),
            steady.io_cpu_us_per_msg(),
            steady.allocations_per_msg(),
        );
    }
}

/// How often `consume-host` reads the host's acked count (see its loop).
const PROGRESS_READ_EVERY: Duration = Duration::from_millis(10);

/// CPU time spent so far by lapin's I/O threads (each connection reads and
/// writes its socket on a thread of its own, named `lapin-io-loop`), from
/// each thread's scheduler statistics (nanoseconds on a CPU). The rest of
/// the process's CPU is the runtime's workers: for the host, its own work.
/// Zero where `/proc` is not there.
fn lapin_io_cpu() -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|name| name.starts_with("lapin-io"))
        })
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .map(Duration::from_nanos)
        .sum()
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
