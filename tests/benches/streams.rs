//! Stream consumption with checkpoints off and on, and shadow replay
//! throughput, in the same run.
//!
//! ```text
//! scripts/build-plugins && cargo bench -p acemq-tests --bench streams
//! ACEMQ_BENCH_STREAM_MESSAGES=100000 ACEMQ_BENCH_ROUNDS=5 cargo bench -p acemq-tests --bench streams
//! ```
//!
//! A stream of `ACEMQ_BENCH_STREAM_MESSAGES` (50,000) 1 KiB messages is read
//! from `first` by the host with the no-op `echo` plugin (prefetch 10, the
//! stream default), once with no checkpoint and once with a checkpoint kept
//! in the broker (every 1000 acks, the default), alternating which goes
//! first in each of `ACEMQ_BENCH_ROUNDS` (3) rounds; the rate runs from the
//! subscription to the last ack. Then `acemq-host replay` (in process) reads
//! the same stream through `echo` without publishing. Prints each round and
//! the medians; asserts nothing.

use std::time::{Duration, Instant};

use acemq_host::config::LoadedConfig;
use acemq_host::replay::{ReplayRequest, replay};
use acemq_tests::host::{InProcessHost, plugin_path};
use acemq_tests::stream_reader::StreamReaderConfig;
use acemq_tests::{env_or, median, shared_broker, unique_name};
use anyhow::Result;
use lapin::BasicProperties;

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run())
}

async fn run() -> Result<()> {
    let messages: u64 = env_or("ACEMQ_BENCH_STREAM_MESSAGES", 50_000)?;
    let rounds: usize = env_or("ACEMQ_BENCH_ROUNDS", 3)?;
    let broker = shared_broker();
    let stream = unique_name("bench.stream");
    let config = |checkpoint: &str, name: &str| {
        StreamReaderConfig::echo(broker.amqp_url(), &stream, name, checkpoint).toml()
    };
    // Declares the stream, then the messages go in.
    InProcessHost::start(&config("none", &unique_name("bench.declare")))
        .await?
        .stop()
        .await?;
    let body = vec![b'x'; 1000];
    broker
        .publish_many(
            "",
            &stream,
            (0..messages).map(|_| (body.clone(), BasicProperties::default())),
        )
        .await?;
    eprintln!("streams: {messages} messages in stream {stream}");

    let (mut off, mut on, mut replays) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            ["none", "broker"]
        } else {
            ["broker", "none"]
        };
        for checkpoint in order {
            let name = unique_name("bench.reader");
            let rate = consume(&config(checkpoint, &name), &stream, messages).await?;
            if checkpoint == "none" {
                off.push(rate);
            } else {
                on.push(rate);
                broker
                    .delete_queue(&format!("acemq.checkpoint.{name}"))
                    .await?;
            }
        }
        let name = unique_name("bench.replay");
        let loaded = LoadedConfig::parse(std::path::Path::new("bench.toml"), config("none", &name))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let request = ReplayRequest {
            consumer: name,
            candidate: plugin_path("echo"),
            from: "first".to_string(),
            to: Some(messages - 1),
            compare: false,
            stream_protocol: None,
        };
        let started = Instant::now();
        let report = replay(&loaded, &request).await?;
        let rate = report.read as f64 / started.elapsed().as_secs_f64();
        replays.push(rate);
        println!(
            "round {}: checkpoints off {:>7.0} msg/s, on (broker, every 1000) {:>7.0} msg/s, replay {:>7.0} msg/s ({} read)",
            round + 1,
            off[round],
            on[round],
            rate,
            report.read
        );
    }
    let (off, on, replayed) = (median(&mut off), median(&mut on), median(&mut replays));
    println!(
        "median of {rounds}: checkpoints off {off:.0} msg/s, on {on:.0} msg/s (on/off {:.2}); replay {replayed:.0} msg/s",
        on / off
    );
    broker.delete_queue(&stream).await?;
    Ok(())
}

/// Runs a host with `config` until it has acked `messages` deliveries of
/// `stream`; its rate from the subscription on.
async fn consume(config: &str, stream: &str, messages: u64) -> Result<f64> {
    let host = InProcessHost::start(config).await?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(600);
    while host.metrics.consumed_count(stream, "acked") < messages {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the host did not read {messages} messages in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = messages as f64 / started.elapsed().as_secs_f64();
    host.stop().await?;
    Ok(rate)
}
