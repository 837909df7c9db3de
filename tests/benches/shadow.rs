//! What a live shadow costs the version it shadows (docs/rollout.md): the
//! host's consume → transform (`stamp-v1`) → confirmed publish → ack rate,
//! without a shadow and with one taking 100 % of the deliveries
//! (`stamp-v2` on a copy of each, at most as many calls at once as the
//! consumer's), measured alternately in the same run.
//!
//! ```text
//! scripts/build-plugins && cargo bench -p acemq-tests --bench shadow
//! ACEMQ_BENCH_MESSAGES=10000 ACEMQ_BENCH_ROUNDS=1 cargo bench -p acemq-tests --bench shadow
//! ```
//!
//! Each run fills a fresh quorum queue with `ACEMQ_BENCH_MESSAGES` (20,000)
//! persistent 1 KiB messages, then drains it with the host library in the
//! load generator (`loadgen consume-host`, as the end-to-end bench does);
//! the figures are the load generator's steady span (10 % to 90 % acked):
//! messages a second and CPU microseconds a message. Medians of
//! `ACEMQ_BENCH_ROUNDS` (3). Prints figures and asserts nothing.

use std::process::Command;

use anyhow::{Context, Result, bail};

use acemq_tests::host::plugin_path;
use acemq_tests::{env_or, loadgen_result, median, shared_broker, unique_name};

fn main() -> Result<()> {
    let messages: u64 = env_or("ACEMQ_BENCH_MESSAGES", 20_000)?;
    let rounds: usize = env_or("ACEMQ_BENCH_ROUNDS", 3)?;
    let broker = shared_broker();
    let shadow = format!(
        "[consumers.candidate]\nplugin = \"{}\"\nmode = \"shadow\"\nshare = \"100%\"\n",
        plugin_path("stamp-v2").display()
    );
    let mut figures: [(Vec<f64>, Vec<f64>); 2] = Default::default();
    for round in 0..rounds {
        // Alternating which goes first, so neither always meets a warmer
        // broker.
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let queue = unique_name("bench.shadow");
            let sink = unique_name("bench.shadow.sink");
            loadgen(&[
                "publish",
                "--url",
                broker.amqp_url(),
                "--queue",
                &queue,
                "-C",
                &messages.to_string(),
            ])?;
            let mut args = vec![
                "consume-host".to_string(),
                "--url".into(),
                broker.amqp_url().into(),
                "--queue".into(),
                queue.clone(),
                "-C".into(),
                messages.to_string(),
                "--transform-to".into(),
                sink.clone(),
            ];
            if which == 1 {
                args.extend(["--config-tail".into(), shadow.clone()]);
            }
            let out = loadgen(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
            let (rate, cpu) = (
                loadgen_result(&out, "steady_rate")?,
                loadgen_result(&out, "steady_cpu_us_per_msg")?,
            );
            // What the shadow ran on, and what it skipped for want of a place.
            let shadowed = out
                .lines()
                .find(|l| l.starts_with("SHADOW "))
                .map(|l| format!(" ({})", &l["SHADOW ".len()..]))
                .unwrap_or_default();
            println!(
                "  round {round}: {:<24} {rate:>8.0} msg/s {cpu:>7.1} µs CPU/msg{shadowed}",
                ["without a shadow", "with a 100% shadow"][which]
            );
            figures[which].0.push(rate);
            figures[which].1.push(cpu);
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(broker.delete_queue(&queue))?;
            runtime.block_on(broker.delete_queue(&format!("{sink}.sink")))?;
            runtime.block_on(broker.delete_exchange(&sink))?;
        }
    }
    let [
        (mut plain_rate, mut plain_cpu),
        (mut shadow_rate, mut shadow_cpu),
    ] = figures;
    let (plain_rate, plain_cpu) = (median(&mut plain_rate), median(&mut plain_cpu));
    let (shadow_rate, shadow_cpu) = (median(&mut shadow_rate), median(&mut shadow_cpu));
    println!(
        "\nmedians of {rounds}: consume -> stamp-v1 -> confirmed publish -> ack, {messages} messages"
    );
    println!("  without a shadow       {plain_rate:>8.0} msg/s {plain_cpu:>7.1} µs CPU/msg");
    println!(
        "  with a 100% shadow     {shadow_rate:>8.0} msg/s {shadow_cpu:>7.1} µs CPU/msg  ({:.2}x the rate, {:.2}x the CPU)",
        shadow_rate / plain_rate,
        shadow_cpu / plain_cpu
    );
    Ok(())
}

/// Runs the load generator to its end; its stdout.
fn loadgen(args: &[&str]) -> Result<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(args)
        .env_remove("ACEMQ_URL")
        .env_remove("ACEMQ_LOADGEN_URL")
        .output()
        .with_context(|| format!("loadgen {}", args.join(" ")))?;
    if !output.status.success() {
        bail!(
            "loadgen {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
