//! The host's memory, as a platform team plans for it (docs/deploying.md):
//! the resident set of an `acemq-host run` process (release build) with one
//! Rust consumer (`echo`), idle and while it consumes 100,000 messages, and
//! what each more consumer adds.
//!
//! ```text
//! scripts/build-plugins && cargo bench -p acemq-tests --bench memory
//! ACEMQ_BENCH_MESSAGES=200000 ACEMQ_BENCH_CONSUMERS=17 cargo bench -p acemq-tests --bench memory
//! ACEMQ_BENCH_BINARY=/path/to/another/acemq-host cargo bench -p acemq-tests --bench memory
//! ```
//!
//! It builds the release binary first (`cargo build --release -p
//! acemq-host`; `ACEMQ_BENCH_BINARY` measures another build instead), starts a throwaway RabbitMQ node, and reads `VmRSS` (and
//! its anonymous and file-backed parts) from `/proc`:
//!
//! - idle: the median of 5 readings a second apart, 5 s after the consumer
//!   subscribed;
//! - under load: every 200 ms while `loadgen publish` puts
//!   `ACEMQ_BENCH_MESSAGES` (100,000) persistent 1 KiB messages on the
//!   consumer's quorum queue and the host consumes them, the peak and the
//!   median, with the rate the host consumed at;
//! - per extra consumer: idle RSS with `ACEMQ_BENCH_CONSUMERS` (9) echo
//!   consumers against one, divided by the extra ones.
//!
//! Prints figures and asserts nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use acemq_tests::host::{HostOptions, HostProcess, plugin_path, workspace_root};
use acemq_tests::{env_or, median, shared_broker, unique_name};

const MIB: f64 = 1024.0 * 1024.0;

fn main() -> Result<()> {
    let messages: u64 = env_or("ACEMQ_BENCH_MESSAGES", 100_000)?;
    let many: usize = env_or("ACEMQ_BENCH_CONSUMERS", 9)?;
    let binary = match std::env::var_os("ACEMQ_BENCH_BINARY") {
        Some(path) => PathBuf::from(path),
        None => release_binary()?,
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let broker = shared_broker();
    println!(
        "memory: {}, echo consumers, quorum queues",
        binary.display()
    );

    let queues: Vec<String> = (0..many).map(|_| unique_name("bench.memory")).collect();
    for queue in &queues {
        runtime.block_on(broker.declare_queue(queue, "quorum", &[]))?;
    }
    let one = Host::start(&binary, &queues[..1])?;
    std::thread::sleep(Duration::from_secs(5));
    let idle = one.idle()?;
    println!(
        "idle, 1 consumer: {:.1} MiB RSS ({:.1} anonymous, {:.1} file-backed)",
        idle.rss, idle.anonymous, idle.file
    );

    let started = Instant::now();
    let mut publisher = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["publish", "--url", broker.amqp_url(), "--queue", &queues[0]])
        .args(["-C", &messages.to_string(), "-s", "1024"])
        .stdout(Stdio::null())
        .spawn()
        .context("loadgen publish")?;
    let mut readings = Vec::new();
    loop {
        readings.push(one.reading()?.rss);
        let left = runtime.block_on(broker.message_count(&queues[0]))?;
        let published = publisher.try_wait()?.is_some();
        if published && left == 0 {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("{left} messages still queued after 10 minutes");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let took = started.elapsed().as_secs_f64();
    let peak = readings.iter().copied().fold(0.0, f64::max);
    let middle = median(&mut readings.clone());
    println!(
        "under load, 1 consumer: peak {peak:.1} MiB, median {middle:.1} MiB over {} readings, \
         {messages} messages published and consumed in {took:.1} s ({:.0} msg/s)",
        readings.len(),
        messages as f64 / took
    );
    std::thread::sleep(Duration::from_secs(3));
    let after = one.idle()?;
    println!("idle again after the load: {:.1} MiB RSS", after.rss);
    one.stop()?;

    let all = Host::start(&binary, &queues)?;
    std::thread::sleep(Duration::from_secs(5));
    let idle_many = all.idle()?;
    all.stop()?;
    let extra = (idle_many.rss - idle.rss) / (many - 1) as f64;
    println!(
        "idle, {many} consumers: {:.1} MiB RSS: {extra:.2} MiB per extra consumer",
        idle_many.rss
    );
    for queue in &queues {
        runtime.block_on(broker.delete_queue(queue))?;
    }
    Ok(())
}

/// `target/release/acemq-host`, built now (quick when it is up to date).
fn release_binary() -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(cargo)
        .args([
            "build",
            "--release",
            "-p",
            "acemq-host",
            "--bin",
            "acemq-host",
        ])
        .current_dir(workspace_root())
        .status()?;
    if !built.success() {
        bail!("cargo build --release -p acemq-host failed");
    }
    Ok(workspace_root().join("target/release/acemq-host"))
}

struct Host(HostProcess);

/// One `/proc` reading, in MiB.
#[derive(Clone, Copy)]
struct Reading {
    rss: f64,
    anonymous: f64,
    file: f64,
}

impl Host {
    fn start(binary: &Path, queues: &[String]) -> Result<Self> {
        let mut config = format!("[broker]\nurl = \"{}\"\n", shared_broker().amqp_url());
        for queue in queues {
            config.push_str(&format!(
                "\n[[consumers]]\nqueue = \"{queue}\"\nplugin = \"{}\"\n",
                plugin_path("echo").display()
            ));
        }
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("host.toml");
        std::fs::write(&path, config)?;
        let options = HostOptions {
            consumers: queues.len(),
            binary: Some(binary.to_path_buf()),
            ..HostOptions::default()
        };
        Ok(Self(HostProcess::start_with(&path, dir, &options)?))
    }

    fn reading(&self) -> Result<Reading> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.0.pid()))?;
        let field = |name: &str| -> Result<f64> {
            let kb: f64 = status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .with_context(|| format!("no {name} in /proc/PID/status"))?
                .parse()?;
            Ok(kb * 1024.0 / MIB)
        };
        Ok(Reading {
            rss: field("VmRSS:")?,
            anonymous: field("RssAnon:")?,
            file: field("RssFile:")?,
        })
    }

    /// The median of 5 readings a second apart.
    fn idle(&self) -> Result<Reading> {
        let mut readings = Vec::new();
        for _ in 0..5 {
            readings.push(self.reading()?);
            std::thread::sleep(Duration::from_secs(1));
        }
        readings.sort_by(|a, b| a.rss.total_cmp(&b.rss));
        Ok(readings[2])
    }

    fn stop(self) -> Result<()> {
        self.0.terminate(Duration::from_secs(30))?;
        Ok(())
    }
}
