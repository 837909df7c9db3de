//! How long a Python plugin takes to load, compiled and cached
//! (docs/plugins/python-and-javascript.md, "Loading a plugin").
//!
//! ```text
//! scripts/build-plugins && cargo bench -p acemq-tests --bench plugin_loading
//! ACEMQ_HOST_BINARY=target/release/acemq-host cargo bench -p acemq-tests --bench plugin_loading
//! ```
//!
//! The host runs as a process (the dev build the tests use, or
//! `ACEMQ_HOST_BINARY`), against a throwaway RabbitMQ node, with the
//! Python order router (`ACEMQ_BENCH_PLUGIN`, a folder of `plugins/` with
//! a `src/app.py`). Its changed version is built first: the same folder
//! with one more module-level constant, so its Python differs and its
//! interpreter does not, as in a real new version. Each round, with a cache
//! folder of its own:
//!
//! - `plugin run` of one order: in an empty cache (it compiles), then again
//!   (cached);
//! - host start (the process started → its consumer subscribed) without
//!   any cache (`plugin_cache = false`: every start and every swap compiles,
//!   as before the caches), in an empty cache, then cached;
//! - hot swap (the rename → `plugin swapped` logged) to the changed
//!   version, without caches and with them (only the functions that
//!   changed compile), and back to the version the start compiled (cached).
//!
//! Prints medians of `ACEMQ_BENCH_ROUNDS` (3) rounds and asserts nothing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use acemq_tests::host::{HostOptions, HostProcess, host_binary, plugin_path, workspace_root};
use acemq_tests::{env_or, median, shared_broker, unique_name};

const SWAPPED: &str = "plugin swapped";
const WITHIN: Duration = Duration::from_secs(300);

fn main() -> Result<()> {
    let rounds: usize = env_or("ACEMQ_BENCH_ROUNDS", 3)?;
    let plugin: String = env_or("ACEMQ_BENCH_PLUGIN", "order-router-py".to_string())?;
    let work = tempfile::tempdir()?;
    let current = plugin_path(&plugin);
    let changed = build_changed_version(&plugin, work.path())?;
    println!(
        "plugin_loading: {} ({:.1} MB), host {}, {rounds} rounds",
        plugin,
        std::fs::metadata(&current)?.len() as f64 / 1e6,
        host_binary().display()
    );
    let mut figures = Figures::default();
    for round in 0..rounds {
        let caches = work.path().join(format!("round-{round}"));
        let (cold, cached) = plugin_runs(&current, &caches.join("run"))?;
        figures.run_cold.push(cold);
        figures.run_cached.push(cached);
        let uncached = start_and_swap(&current, &changed, None)?;
        let cache = caches.join("host");
        let cold = start_and_swap(&current, &changed, Some(&cache))?;
        let warm = start_only(&current, &cache)?;
        println!(
            "  round {round}: run {:.2} s / {:.2} s; start {:.2} / {:.2} / {:.2} s; swap to the changed version {:.2} / {:.2} s, back {:.2} s",
            figures.run_cold[round],
            figures.run_cached[round],
            uncached.start,
            cold.start,
            warm,
            uncached.swap_changed,
            cold.swap_changed,
            cold.swap_back
        );
        figures.start_uncached.push(uncached.start);
        figures.start_cold.push(cold.start);
        figures.start_cached.push(warm);
        figures.swap_uncached.push(uncached.swap_changed);
        figures.swap_changed.push(cold.swap_changed);
        figures.swap_back_uncached.push(uncached.swap_back);
        figures.swap_back.push(cold.swap_back);
    }
    figures.print();
    Ok(())
}

#[derive(Default)]
struct Figures {
    run_cold: Vec<f64>,
    run_cached: Vec<f64>,
    start_uncached: Vec<f64>,
    start_cold: Vec<f64>,
    start_cached: Vec<f64>,
    swap_uncached: Vec<f64>,
    swap_changed: Vec<f64>,
    swap_back_uncached: Vec<f64>,
    swap_back: Vec<f64>,
}

impl Figures {
    fn print(mut self) {
        let m = |values: &mut Vec<f64>| median(values);
        println!("\nmedians, seconds          compiling (no cache)   with the caches");
        println!(
            "plugin run                {:>20.2}   {:>15.2}",
            m(&mut self.run_cold),
            m(&mut self.run_cached)
        );
        println!(
            "host start                {:>20.2}   {:>15.2}  (empty cache: {:.2})",
            m(&mut self.start_uncached),
            m(&mut self.start_cached),
            m(&mut self.start_cold)
        );
        println!(
            "hot swap, changed version {:>20.2}   {:>15.2}  (only its changed functions compile)",
            m(&mut self.swap_uncached),
            m(&mut self.swap_changed)
        );
        println!(
            "hot swap, built before    {:>20.2}   {:>15.2}",
            m(&mut self.swap_back_uncached),
            m(&mut self.swap_back)
        );
    }
}

/// `plugin run` of one order in an empty cache folder, then again.
fn plugin_runs(plugin: &Path, cache: &Path) -> Result<(f64, f64)> {
    std::fs::create_dir_all(cache)?;
    let once = || -> Result<f64> {
        let started = Instant::now();
        let output = Command::new(host_binary())
            .args(["plugin", "run"])
            .arg(plugin)
            .args([
                "--body",
                r#"{"id":"A-1","customer":"ada","total":4.5}"#,
                "--content-type",
                "application/json",
                "--publish-to",
                "orders.events",
            ])
            .env("XDG_CACHE_HOME", cache)
            .output()?;
        if !output.status.success() {
            bail!(
                "plugin run failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(started.elapsed().as_secs_f64())
    };
    Ok((once()?, once()?))
}

struct StartAndSwap {
    start: f64,
    swap_changed: f64,
    swap_back: f64,
}

/// A host running `plugin` (a copy): its start, a swap to `changed` and one
/// back. `cache`: the user's cache folder, or none at all.
fn start_and_swap(plugin: &Path, changed: &Path, cache: Option<&Path>) -> Result<StartAndSwap> {
    let (mut host, start, live) = start(plugin, cache)?;
    let swap_changed = swap(&mut host, &live, changed, 1)?;
    let swap_back = swap(&mut host, &live, plugin, 2)?;
    host.terminate(Duration::from_secs(30))?;
    Ok(StartAndSwap {
        start,
        swap_changed,
        swap_back,
    })
}

fn start_only(plugin: &Path, cache: &Path) -> Result<f64> {
    let (host, start, _) = start(plugin, Some(cache))?;
    host.terminate(Duration::from_secs(30))?;
    Ok(start)
}

/// Starts a host whose one consumer runs a copy of `plugin`; returns it,
/// the seconds until it consumed, and the copy's path.
fn start(plugin: &Path, cache: Option<&Path>) -> Result<(HostProcess, f64, PathBuf)> {
    let dir = tempfile::tempdir()?;
    std::fs::create_dir(dir.path().join("plugins"))?;
    let live = dir.path().join("plugins/router.wasm");
    std::fs::copy(plugin, &live)?;
    let queue = unique_name("plugin-loading");
    let host_section = if cache.is_some() {
        ""
    } else {
        "[host]\nplugin_cache = false\n\n"
    };
    let config = format!(
        "{host_section}[broker]\nurl = \"{url}\"\n\n[[exchanges]]\nname = \"{queue}.events\"\nkind = \"fanout\"\n\n[[queues]]\nname = \"{queue}\"\n\n[[consumers]]\nqueue = \"{queue}\"\nplugin = \"plugins/router.wasm\"\npublish_to = [\"{queue}.events\"]\n",
        url = shared_broker().amqp_url()
    );
    let path = dir.path().join("host.toml");
    std::fs::write(&path, config)?;
    let mut options = HostOptions {
        start_within: WITHIN,
        ..HostOptions::default()
    };
    if let Some(cache) = cache {
        options
            .env
            .push(("XDG_CACHE_HOME".into(), cache.display().to_string()));
    }
    let started = Instant::now();
    let host = HostProcess::start_with(&path, dir, &options)?;
    Ok((host, started.elapsed().as_secs_f64(), live))
}

/// Renames a copy of `version` over `live`, as a deploy tool would, and
/// waits for the `count`th swap.
fn swap(host: &mut HostProcess, live: &Path, version: &Path, count: usize) -> Result<f64> {
    let staged = live.with_file_name(".staged.wasm");
    std::fs::copy(version, &staged)?;
    let started = Instant::now();
    std::fs::rename(&staged, live)?;
    host.wait_for_log(SWAPPED, count, WITHIN)?;
    Ok(started.elapsed().as_secs_f64())
}

/// The plugin's folder copied, with one more module-level constant in its
/// `src/app.py`, built by the repository's script into `work`.
fn build_changed_version(plugin: &str, work: &Path) -> Result<PathBuf> {
    let root = workspace_root();
    let source = root.join("plugins").join(plugin);
    let copy = work.join(plugin);
    let copied = Command::new("cp")
        .arg("-r")
        .arg(&source)
        .arg(&copy)
        .status()?;
    if !copied.success() {
        bail!("cannot copy {}", source.display());
    }
    let app = copy.join("src/app.py");
    let mut text = std::fs::read_to_string(&app)
        .with_context(|| format!("{} (the bench loads Python plugins)", app.display()))?;
    text.push_str(&format!("\nBENCH_VERSION = \"{}\"\n", unique_name("v")));
    std::fs::write(&app, text)?;
    let out = work.join(format!("{plugin}-changed.wasm"));
    let built = Command::new(root.join("scripts/build-python-plugin"))
        .arg(&copy)
        .arg(root.join("wit/plugin.wit"))
        .arg(&out)
        .arg(root.join("target/wasm-langs"))
        .status()?;
    if !built.success() || !out.exists() {
        bail!("cannot build the changed version of {plugin}");
    }
    Ok(out)
}
