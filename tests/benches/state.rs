//! Plugin state: what one `get` and one `set` per message cost a consumer
//! (docs/state.md; issue targets: >= 0.7x the rate of the same handler
//! without state on the embedded store, >= 0.5x on a local Redis), and the
//! stores' commit times.
//!
//! ```text
//! scripts/build-plugins && cargo bench -p acemq-tests --bench state
//! ACEMQ_BENCH_MESSAGES=5000 ACEMQ_BENCH_ROUNDS=1 cargo bench -p acemq-tests --bench state
//! ```
//!
//! A throwaway RabbitMQ node and a throwaway `redis-server` are started.
//! Each round fills three fresh quorum queues with `ACEMQ_BENCH_MESSAGES`
//! (20,000) persistent 1 KiB messages (`loadgen publish`), then drains each
//! with the host in a `loadgen consume-host` child process, prefetch 200,
//! the host's default concurrency, the `get-set` plugin:
//!
//! 1. `off`: the plugin told not to touch state, on a consumer without
//!    any: the baseline, the same handler without state;
//! 2. `embedded`: `state = "bench"` on the embedded store (a redb file,
//!    every commit durable: its group fsynced before the acks);
//! 3. `redis`: the same namespace on the local Redis.
//!
//! Each message is one `get` and one `set` of one of 64 keys, then the
//! commit (the write and the input's done record) after the accept, and
//! the ack; and before the call, the done-record check. The order is
//! reversed every other round. Printed per round and as medians: each
//! run's steady rate (10 % to 90 % of its messages acked) and CPU per
//! message, and the ratio to `off` in the same round.
//!
//! Then each store's commit time, measured on the store itself from this
//! process: `ACEMQ_BENCH_COMMITS` (2,000) commits of one write and a done
//! record, as the host makes them, one at a time and then 32 at once
//! (about what a consumer with prefetch 200 has in flight): p50 and p99.
//!
//! Prints figures and asserts nothing: broker, Redis, host and this bench
//! share the machine's cores.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;

use acemq_host::state::embedded::{EmbeddedStore, Opener};
use acemq_host::state::redis::RedisStore;
use acemq_host::state::{Backend, Commit, Committed, InputKey, KeyWrite, Quota, Write};
use acemq_tests::host::plugin_path;
use acemq_tests::machine::{cpus, load_average};
use acemq_tests::redis::RedisServer;
use acemq_tests::{Broker, env_or, loadgen_result, median, unique_name};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Off,
    Embedded,
    Redis,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Off, Mode::Embedded, Mode::Redis];

    fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Embedded => "embedded",
            Mode::Redis => "redis",
        }
    }

    /// The issue's target ratio to `off`.
    fn target(self) -> Option<f64> {
        match self {
            Mode::Off => None,
            Mode::Embedded => Some(0.7),
            Mode::Redis => Some(0.5),
        }
    }
}

struct Bench {
    broker: Broker,
    redis: RedisServer,
    loadgen: PathBuf,
    plugin: PathBuf,
    dir: tempfile::TempDir,
    messages: u64,
}

/// One run's figures.
#[derive(Debug, Clone, Copy)]
struct Run {
    rate: f64,
    cpu_us: f64,
}

impl Bench {
    fn loadgen(&self, args: &[&str]) -> Result<String> {
        let output = Command::new(&self.loadgen)
            .args(args)
            .output()
            .context("loadgen")?;
        if !output.status.success() {
            bail!(
                "loadgen {args:?} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    fn run(&self, mode: Mode, messages: u64) -> Result<Run> {
        let queue = unique_name(&format!("bench.state.{}", mode.name()));
        let url = self.broker.amqp_url();
        let count = messages.to_string();
        self.loadgen(&[
            "publish", "--url", url, "--queue", &queue, "-C", &count, "-s", "1024",
        ])?;
        let file = self.dir.path().join(format!("{queue}.redb"));
        let (keys, tail) = match mode {
            Mode::Off => (
                String::new(),
                "[consumers.config]\nstate = \"off\"".to_string(),
            ),
            Mode::Embedded => (
                "state = \"bench\"".to_string(),
                format!("[state]\npath = {:?}", file.to_string_lossy()),
            ),
            Mode::Redis => (
                "state = \"bench\"".to_string(),
                format!("[state]\nurl = {:?}", self.redis.url()),
            ),
        };
        let cache = self.dir.path().join("cache");
        let plugin = self.plugin.to_string_lossy();
        let cache = cache.to_string_lossy();
        let mut args = vec![
            "consume-host",
            "--url",
            url,
            "--queue",
            &queue,
            "-C",
            &count,
            "--prefetch",
            "200",
            "--plugin",
            &plugin,
            "--plugin-cache-dir",
            &cache,
            "--config-tail",
            &tail,
        ];
        if !keys.is_empty() {
            args.extend(["--consumer-keys", &keys]);
        }
        let out = self.loadgen(&args)?;
        Ok(Run {
            rate: loadgen_result(&out, "steady_rate")?,
            cpu_us: loadgen_result(&out, "steady_cpu_us_per_msg")?,
        })
    }
}

fn main() -> Result<()> {
    let messages: u64 = env_or("ACEMQ_BENCH_MESSAGES", 20_000)?;
    let rounds: usize = env_or("ACEMQ_BENCH_ROUNDS", 3)?;
    let commits: usize = env_or("ACEMQ_BENCH_COMMITS", 2_000)?;
    eprintln!("state: starting a throwaway RabbitMQ node and redis-server");
    let bench = Bench {
        broker: Broker::start()?,
        redis: RedisServer::start()?,
        loadgen: PathBuf::from(env!("CARGO_BIN_EXE_loadgen")),
        plugin: plugin_path("get-set"),
        dir: tempfile::tempdir()?,
        messages,
    };
    println!(
        "state: {} persistent 1 KiB messages per run on quorum queues, prefetch 200, the host's default \
         concurrency, plugin get-set (one get and one set per message); rounds: {rounds}; \
         {} CPUs, load average {}",
        bench.messages,
        cpus(),
        load_average()
    );
    // Warm-up, not counted: the compiled-plugin cache, the broker's queues.
    for mode in Mode::ALL {
        bench
            .run(mode, bench.messages.min(2_000))
            .with_context(|| format!("warm-up of {}", mode.name()))?;
    }
    let mut all: Vec<Vec<(Mode, Run)>> = Vec::new();
    for round in 0..rounds {
        let mut order = Mode::ALL.to_vec();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut runs = Vec::new();
        for mode in order {
            runs.push((mode, bench.run(mode, bench.messages)?));
        }
        print_table(&format!("round {} of {rounds}", round + 1), &runs);
        all.push(runs);
    }
    let medians: Vec<(Mode, Run, f64)> = Mode::ALL
        .iter()
        .map(|&mode| {
            let pick = |f: fn(&Run) -> f64| {
                let mut values: Vec<f64> = all
                    .iter()
                    .map(|runs| runs.iter().find(|(m, _)| *m == mode).map(|(_, r)| f(r)))
                    .map(Option::unwrap)
                    .collect();
                median(&mut values)
            };
            // The ratio of each round's pair, then their median.
            let mut ratios: Vec<f64> = all
                .iter()
                .map(|runs| {
                    let of = |m: Mode| runs.iter().find(|(x, _)| *x == m).unwrap().1.rate;
                    of(mode) / of(Mode::Off)
                })
                .collect();
            (
                mode,
                Run {
                    rate: pick(|r| r.rate),
                    cpu_us: pick(|r| r.cpu_us),
                },
                median(&mut ratios),
            )
        })
        .collect();
    println!("median of {} round(s):", all.len());
    println!(
        "  {:<9} {:>10} {:>12} {:>10}  target",
        "mode", "msg/s", "cpu us/msg", "x off"
    );
    for (mode, run, ratio) in &medians {
        let verdict = match mode.target() {
            None => "(baseline)".to_string(),
            Some(target) => format!(
                ">= {target:.1}x: {}",
                if *ratio >= target { "met" } else { "NOT met" }
            ),
        };
        println!(
            "  {:<9} {:>10.0} {:>12.1} {:>9.2}x  {verdict}",
            mode.name(),
            run.rate,
            run.cpu_us,
            ratio
        );
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let embedded = EmbeddedStore::open(&bench.dir.path().join("commits.redb"), Opener::Host)?;
        commit_times("embedded", &embedded, commits).await?;
        let redis = RedisStore::connect(bench.redis.url()).await?;
        commit_times("redis", &redis, commits).await?;
        anyhow::Ok(())
    })?;
    println!("state: load average at the end {}", load_average());
    Ok(())
}

fn print_table(title: &str, runs: &[(Mode, Run)]) {
    let off = runs
        .iter()
        .find(|(m, _)| *m == Mode::Off)
        .map_or(f64::NAN, |(_, r)| r.rate);
    println!("{title}:");
    for (mode, run) in runs {
        println!(
            "  {:<9} {:>10.0} msg/s {:>8.1} cpu us/msg {:>6.2}x off",
            mode.name(),
            run.rate,
            run.cpu_us,
            run.rate / off
        );
    }
}

/// `count` commits as the host makes them (one write, a done record), one
/// at a time, then 32 at once: their p50 and p99.
async fn commit_times(name: &str, store: &impl Backend, count: usize) -> Result<()> {
    let namespace = unique_name("bench");
    let one = |i: usize| Commit {
        namespace: Some(namespace.clone()),
        quota: Quota {
            max_keys: u64::MAX,
            max_bytes: u64::MAX,
        },
        writes: vec![KeyWrite {
            key: format!("last/{}", i % 64).into_bytes(),
            write: Write::Put {
                value: vec![b'x'; 64],
                expires_at_ms: None,
            },
            expect: None,
        }],
        done: InputKey {
            queue: "bench".into(),
            id: format!("{namespace}-{i}"),
        },
        retention: Duration::from_secs(3600),
        claim_holder: None,
        reservation: None,
        now_ms: acemq_tests::state_cases::now_ms(),
    };
    for (label, at_once) in [("one at a time", 1usize), ("32 at once", 32)] {
        let offset = if at_once == 1 { 0 } else { count };
        let timed = |i: usize| {
            let commit = one(offset + i);
            async move {
                let started = Instant::now();
                let committed = store.commit(&commit).await;
                (started.elapsed(), committed)
            }
        };
        let started = Instant::now();
        let mut times: Vec<f64> = Vec::with_capacity(count);
        let mut results = futures::stream::iter(0..count)
            .map(timed)
            .buffer_unordered(at_once);
        while let Some((took, committed)) = results.next().await {
            if committed? != Committed::Applied {
                bail!("{name}: a benchmark commit was not applied");
            }
            times.push(took.as_secs_f64() * 1000.0);
        }
        let wall = started.elapsed().as_secs_f64();
        times.sort_by(f64::total_cmp);
        let at =
            |p: f64| times[((p * (times.len() - 1) as f64).round() as usize).min(times.len() - 1)];
        println!(
            "commit time, {name}, {label}: p50 {:.2} ms, p99 {:.2} ms ({count} commits, {:.0}/s)",
            at(0.50),
            at(0.99),
            count as f64 / wall
        );
    }
    Ok(())
}
