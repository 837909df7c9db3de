//! Hot swap against a real broker (docs/targets.md, Hot swap): a handler plugin
//! replaced while messages flow loses nothing, handles nothing twice, never
//! cancels the consumer, and switches versions at one point; a broken or
//! wrong-world file is refused and the serving version keeps serving.
//!
//! The host runs as a real process (`acemq-host run`), so SIGHUP and its log
//! are the real ones; its admin endpoint is on a free loopback port. The
//! plugin file lives in a temporary folder as `handler.wasm`, and versions
//! are deployed as a deploy tool would: written beside it, then renamed over
//! it (or, for the broken ones, written over it in place). Compiled versions
//! are cached in another temporary folder, as in production.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use acemq_tests::host::{HostProcess, cache_entry, free_port, plugin_path};
use acemq_tests::{shared_broker, unique_name};
use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde_json::Value;

/// Messages published while the plugin is replaced, over about six seconds.
const STREAM: u32 = 3000;
const BATCH: u32 = 25;
const BATCH_EVERY: Duration = Duration::from_millis(50);
/// The new version is deployed once this many outputs came from the old one.
const SWAP_AFTER: u32 = 1000;
/// The admin endpoint's token (reloading over HTTP needs one), in the file
/// `admin.token` beside the plugin.
const ADMIN_TOKEN: &str = "hot-swap-test-admin-token";

/// One test's names, plugin folder and admin address.
struct Scenario {
    input: String,
    out_exchange: String,
    output: String,
    dir: tempfile::TempDir,
    /// Holds the compiled-plugin cache (`entries/`) and its key.
    cache: tempfile::TempDir,
    admin: String,
}

impl Scenario {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("admin.token"), ADMIN_TOKEN).unwrap();
        Self {
            input: unique_name("swap.in"),
            out_exchange: unique_name("swap.out"),
            output: unique_name("swap.stamped"),
            dir,
            cache: tempfile::tempdir().unwrap(),
            admin: format!("127.0.0.1:{}", free_port()),
        }
    }

    fn handler(&self) -> PathBuf {
        self.dir.path().join("handler.wasm")
    }

    fn cache_entries(&self) -> PathBuf {
        self.cache.path().join("entries")
    }

    /// The compiled-plugin cache entry of the version hashing to `sha256`.
    fn cache_entry(&self, sha256: &str) -> PathBuf {
        cache_entry(&self.cache_entries(), sha256)
    }

    fn config(&self) -> String {
        format!(
            r#"
[broker]
url = "{url}"
connect_timeout = "10s"

[host]
admin_listen = "{admin}"
admin_token_file = "{token_file}"
plugin_cache_dir = "{cache}"

[[exchanges]]
name = "{out}"
kind = "direct"

[[queues]]
name = "{input}"
dead_letter = true

[[queues]]
name = "{output}"

[[bindings]]
queue = "{output}"
exchange = "{out}"
routing_key = "stamped"

[[consumers]]
queue = "{input}"
plugin = "{plugin}"
publish_to = ["{out}"]
prefetch = 50
concurrency = 1

[consumers.config]
out_exchange = "{out}"
"#,
            url = shared_broker().amqp_url(),
            admin = self.admin,
            token_file = self.dir.path().join("admin.token").display(),
            cache = self.cache_entries().display(),
            out = self.out_exchange,
            input = self.input,
            output = self.output,
            plugin = self.handler().display(),
        )
    }

    /// Deploys `plugin` as a deploy tool would: a temporary file in the same
    /// folder, renamed over `handler.wasm` (atomic: the host never sees half).
    fn deploy(&self, plugin: &Path) {
        let tmp = self.dir.path().join(".handler.wasm.tmp");
        std::fs::copy(plugin, &tmp).unwrap();
        std::fs::rename(&tmp, self.handler()).unwrap();
    }

    fn get(&self, path: &str) -> (u16, String) {
        http("GET", &format!("http://{}{path}", self.admin))
    }

    fn get_json(&self, path: &str) -> Value {
        let (status, body) = self.get(path);
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    fn post_reload(&self, query: &str) -> (u16, Value) {
        let (status, body) = http(
            "POST",
            &format!("http://{}/plugins/reload{query}", self.admin),
        );
        (
            status,
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}")),
        )
    }

    /// The one consumer's entry of `GET /plugins`.
    fn plugin(&self) -> Value {
        let plugins = self.get_json("/plugins");
        assert_eq!(plugins.as_array().unwrap().len(), 1, "{plugins}");
        plugins[0].clone()
    }

    fn metric(&self, series: &str) -> Option<f64> {
        let (status, text) = self.get("/metrics");
        assert_eq!(status, 200, "{text}");
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
    }

    fn swaps(&self, result: &str) -> f64 {
        self.metric(&format!(
            "acemq_plugin_swaps_total{{queue=\"{}\",result=\"{result}\"}}",
            self.input
        ))
        .unwrap_or(0.0)
    }

    fn version_gauge(&self, sha256: &str) -> Option<f64> {
        self.metric(&format!(
            "acemq_plugin_version{{queue=\"{}\",sha256=\"{sha256}\"}}",
            self.input
        ))
    }

    /// Publishes `seqs` to the input queue, all at once, confirmed.
    async fn publish(&self, seqs: std::ops::Range<u32>) {
        shared_broker()
            .publish_many("", &self.input, seqs.map(|i| (body(i), properties(i))))
            .await
            .unwrap();
    }

    /// Publishes `count` copies of `text` as a MessagePack string (a
    /// one-byte header: `text` is under 32 bytes), content type
    /// `application/msgpack`.
    async fn publish_msgpack(&self, text: &str, count: u32) {
        assert!(text.len() < 32, "a fixstr");
        let mut packed = vec![0xa0 | text.len() as u8];
        packed.extend(text.as_bytes());
        let msgpack = BasicProperties::default().with_content_type("application/msgpack".into());
        shared_broker()
            .publish_many(
                "",
                &self.input,
                (0..count).map(|_| (packed.clone(), msgpack.clone())),
            )
            .await
            .unwrap();
    }

    /// Drains `count` outputs; returns `seq -> version` after checking each
    /// output names its input.
    async fn outputs(&self, count: usize, host: &HostProcess) -> Vec<(u32, String)> {
        let got = shared_broker()
            .drain(&self.output, count, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(
            got.len(),
            count,
            "outputs missing; host log:\n{}",
            host.log_text()
        );
        got.iter()
            .map(|m| {
                let v: Value = serde_json::from_slice(&m.body).unwrap();
                let seq: u32 = v["input"].as_str().unwrap().parse().unwrap();
                assert_eq!(v["input_id"], format!("seq-{seq}"), "{v}");
                (seq, v["version"].as_str().unwrap().to_string())
            })
            .collect()
    }
}

fn body(seq: u32) -> Vec<u8> {
    seq.to_string().into_bytes()
}

fn properties(seq: u32) -> BasicProperties {
    BasicProperties::default()
        .with_content_type("text/plain".into())
        .with_delivery_mode(2)
        .with_message_id(format!("seq-{seq}").into())
}

/// A blocking HTTP call (loopback, milliseconds) without stalling the runtime.
fn http(method: &str, url: &str) -> (u16, String) {
    tokio::task::block_in_place(|| {
        let agent = ureq::Agent::config_builder()
            .proxy(None)
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .new_agent();
        let authorization = format!("Bearer {ADMIN_TOKEN}");
        let mut response = match method {
            "GET" => agent
                .get(url)
                .header("Authorization", &authorization)
                .call(),
            "POST" => agent
                .post(url)
                .header("Authorization", &authorization)
                .send_empty(),
            other => panic!("no {other} here"),
        }
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let status = response.status().as_u16();
        (status, response.body_mut().read_to_string().unwrap())
    })
}

/// Blocking waits on the host's log, off the runtime's workers' duties.
fn wait_for_log(host: &mut HostProcess, needle: &str, count: usize) {
    tokio::task::block_in_place(|| {
        host.wait_for_log(needle, count, Duration::from_secs(60))
            .unwrap()
    });
}

fn log_lines_with(host: &HostProcess, needle: &str) -> Vec<String> {
    host.log_lines()
        .into_iter()
        .filter(|l| l.contains(needle))
        .collect()
}

/// The pid of this test process's `acemq-host` child (one at a time in this
/// binary); `HostProcess` keeps its `Child` to itself.
fn host_pid() -> libc::pid_t {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let Some((head, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let ppid = rest.split_whitespace().nth(1);
        if head.ends_with("(acemq-host") && ppid == Some(me.as_str()) {
            found.push(head.split_whitespace().next().unwrap().parse().unwrap());
        }
    }
    assert_eq!(found.len(), 1, "acemq-host children: {found:?}");
    found[0]
}

/// Publishes `STREAM` numbered messages at a steady pace, confirmed.
async fn publish_stream(queue: String) {
    let connection = shared_broker().connect().await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut tick = tokio::time::interval(BATCH_EVERY);
    for start in (0..STREAM).step_by(BATCH as usize) {
        tick.tick().await;
        let mut confirms = Vec::new();
        for seq in start..(start + BATCH).min(STREAM) {
            confirms.push(
                channel
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..Default::default()
                        },
                        &body(seq),
                        properties(seq),
                    )
                    .await
                    .unwrap(),
            );
        }
        for confirm in confirms {
            assert!(confirm.await.unwrap().is_ack());
        }
    }
    let _ = connection.close(200, "done".into()).await;
}

/// Samples the queue's consumer count until `stop`; returns the lowest seen.
async fn watch_consumers(queue: String, stop: Arc<AtomicBool>, samples: Arc<AtomicU32>) -> u32 {
    let connection = shared_broker().connect().await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    let mut lowest = u32::MAX;
    while !stop.load(Ordering::Relaxed) {
        let declared = channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        lowest = lowest.min(declared.consumer_count());
        samples.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = connection.close(200, "done".into()).await;
    lowest
}

/// One host at a time in this binary: [`host_pid`] looks for the one child.
static ONE_HOST_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plugin_swapped_under_load_loses_nothing_and_broken_versions_are_refused() {
    let _one_host = ONE_HOST_AT_A_TIME.lock().await;
    let broker = shared_broker();
    let s = Scenario::new();
    std::fs::copy(plugin_path("stamp-v1"), s.handler()).unwrap();
    let mut host =
        tokio::task::block_in_place(|| HostProcess::start(&s.config(), 1)).expect("host starts");

    let v1 = s.plugin();
    let sha_v1 = v1["sha256"].as_str().unwrap().to_string();
    assert_eq!(v1["queue"], s.input.as_str());
    assert_eq!(v1["path"], s.handler().display().to_string());
    assert_eq!(
        v1["size"],
        std::fs::metadata(s.handler()).unwrap().len(),
        "{v1}"
    );
    assert!(v1["last_refused"].is_null(), "{v1}");
    let health = s.get_json("/health");
    assert_eq!(health["status"], "UP");
    assert_eq!(health["consuming"], "1/1");
    assert_eq!(health["consumers"][0]["queue"], s.input.as_str());
    assert_eq!(health["consumers"][0]["sha256"], sha_v1.as_str());

    // --- v1 -> v2 under a steady stream -------------------------------------
    let stop_watching = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(AtomicU32::new(0));
    let watcher = tokio::spawn(watch_consumers(
        s.input.clone(),
        stop_watching.clone(),
        samples.clone(),
    ));
    let publisher = tokio::spawn(publish_stream(s.input.clone()));
    let handled = broker
        .wait_for_message_count(&s.output, SWAP_AFTER, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        handled >= SWAP_AFTER,
        "only {handled} outputs; host log:\n{}",
        host.log_text()
    );
    assert!(
        !publisher.is_finished(),
        "the stream ended before the swap; the test proves nothing"
    );
    s.deploy(&plugin_path("stamp-v2"));
    wait_for_log(&mut host, "plugin swapped", 1);
    publisher.await.unwrap();
    broker
        .wait_for_message_count(&s.output, STREAM, Duration::from_secs(60))
        .await
        .unwrap();
    stop_watching.store(true, Ordering::Relaxed);
    let lowest_consumers = watcher.await.unwrap();

    let outputs = s.outputs(STREAM as usize, &host).await;
    // Exactly one output per input: none lost, none twice.
    let mut by_seq = BTreeMap::new();
    for (seq, version) in &outputs {
        assert!(
            by_seq.insert(*seq, version.clone()).is_none(),
            "input {seq} produced two outputs"
        );
    }
    assert_eq!(
        by_seq.keys().copied().collect::<Vec<_>>(),
        (0..STREAM).collect::<Vec<_>>(),
        "every input produced an output"
    );
    // One cut: with concurrency 1 the handler runs the inputs one at a time
    // in queue order, so in sequence order it is v1 up to the swap, then v2.
    // (Outputs of neighbouring deliveries are confirmed on different
    // channels, so their order in the output queue may differ by a place.)
    let versions: Vec<&str> = by_seq.values().map(String::as_str).collect();
    let cut = versions.iter().position(|v| *v == "v2").expect("v2 served");
    assert!(
        versions[..cut].iter().all(|v| *v == "v1") && versions[cut..].iter().all(|v| *v == "v2"),
        "versions switch more than once: {:?}",
        runs(&versions)
    );
    assert!(
        cut >= SWAP_AFTER as usize && cut < STREAM as usize - 100,
        "the swap came at input {cut} of {STREAM}"
    );
    // The consumer stayed attached and nothing went back or aside.
    assert_eq!(broker.message_count(&s.input).await.unwrap(), 0);
    assert_eq!(
        broker
            .message_count(&format!("{}.dlq", s.input))
            .await
            .unwrap(),
        0
    );
    assert_eq!(broker.message_count(&s.output).await.unwrap(), 0);
    // A handful is enough to have watched through the swap; a loaded
    // machine takes fewer samples than an idle one.
    assert!(samples.load(Ordering::Relaxed) >= 5, "too few samples");
    assert_eq!(
        lowest_consumers, 1,
        "the queue lost its consumer during the swap"
    );
    assert_eq!(log_lines_with(&host, ": consuming").len(), 1);
    assert!(log_lines_with(&host, "consumer stopped").is_empty());

    let v2 = s.plugin();
    let sha_v2 = v2["sha256"].as_str().unwrap().to_string();
    assert_ne!(sha_v2, sha_v1);
    let swapped = log_lines_with(&host, "plugin swapped");
    assert!(
        swapped[0].contains(&format!("from={sha_v1}"))
            && swapped[0].contains(&format!("to={sha_v2}"))
            && swapped[0].contains("trigger=file change")
            && swapped[0].contains("took_ms="),
        "{}",
        swapped[0]
    );
    eprintln!(
        "hot_swap: v1 served inputs 0..{cut}, v2 {cut}..{STREAM}; {}",
        swapped[0]
    );
    assert_eq!(s.swaps("swapped"), 1.0);
    assert_eq!(s.version_gauge(&sha_v1), Some(0.0));
    assert_eq!(s.version_gauge(&sha_v2), Some(1.0));
    assert_eq!(
        s.get_json("/health")["consumers"][0]["sha256"],
        sha_v2.as_str()
    );

    // --- a broken v3, written in place: refused, v2 keeps serving -----------
    std::fs::write(s.handler(), b"this is not WebAssembly at all, just bytes").unwrap();
    wait_for_log(&mut host, "plugin refused", 1);
    let refused = s.plugin();
    assert_eq!(refused["sha256"], sha_v2.as_str(), "{refused}");
    let reason = refused["last_refused"]["reason"].as_str().unwrap();
    assert!(
        reason.contains(&s.handler().display().to_string())
            && reason.contains("not a WebAssembly component"),
        "{reason}"
    );
    let line = &log_lines_with(&host, "plugin refused")[0];
    assert!(
        line.contains("not a WebAssembly component") && line.contains(&format!("serving={sha_v2}")),
        "{line}"
    );
    assert_eq!(s.swaps("refused"), 1.0);
    s.publish(STREAM..STREAM + 20).await;
    assert!(
        s.outputs(20, &host).await.iter().all(|(_, v)| v == "v2"),
        "v2 stopped serving"
    );

    // --- the wrong world (a codec) copied over it: refused likewise ---------
    std::fs::copy(plugin_path("msgpack-codec"), s.handler()).unwrap();
    wait_for_log(&mut host, "plugin refused", 2);
    let refused = s.plugin();
    assert_eq!(refused["sha256"], sha_v2.as_str(), "{refused}");
    let reason = refused["last_refused"]["reason"].as_str().unwrap();
    assert!(
        reason.contains(&s.handler().display().to_string()) && reason.contains("handler"),
        "{reason}"
    );
    assert_eq!(s.swaps("refused"), 2.0);
    s.publish(STREAM + 20..STREAM + 40).await;
    assert!(
        s.outputs(20, &host).await.iter().all(|(_, v)| v == "v2"),
        "v2 stopped serving"
    );

    // --- explicit reloads of the same wrong file: the endpoint and SIGHUP ---
    let (status, answer) = s.post_reload("");
    assert_eq!(status, 422, "{answer}");
    let result = &answer["results"][0];
    assert_eq!(result["queue"], s.input.as_str());
    assert_eq!(result["result"], "refused");
    assert_eq!(result["sha256"], sha_v2.as_str(), "{result}");
    assert!(
        result["reason"].as_str().unwrap().contains("handler"),
        "{result}"
    );
    assert_eq!(s.swaps("refused"), 3.0);
    let (status, answer) = s.post_reload("?queue=no.such.queue");
    assert_eq!(status, 404, "{answer}");
    assert_eq!(s.get("/plugins/reload").0, 405);

    // SAFETY: plain kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(host_pid(), libc::SIGHUP) }, 0);
    wait_for_log(&mut host, "plugin refused", 4);
    assert!(
        log_lines_with(&host, "plugin refused")[3].contains("trigger=SIGHUP"),
        "{}",
        host.log_text()
    );
    assert_eq!(s.swaps("refused"), 4.0);

    // --- roll back to v1 through a poisoned cache: swapped again, as v1 ----
    // v2's compiled entry copied over v1's (v1's name kept): the swap must
    // not run v2's code under v1's hash, but compile v1 from its file.
    let v1_entry = s.cache_entry(&sha_v1);
    std::fs::copy(s.cache_entry(&sha_v2), &v1_entry).unwrap();
    s.deploy(&plugin_path("stamp-v1"));
    wait_for_log(&mut host, "plugin swapped", 2);
    s.publish(STREAM + 40..STREAM + 60).await;
    assert!(
        s.outputs(20, &host).await.iter().all(|(_, v)| v == "v1"),
        "v1 is not serving after the rollback"
    );
    let untrusted = log_lines_with(&host, "compiled-plugin cache entry is not trusted");
    assert!(
        untrusted.len() == 1 && untrusted[0].contains(&v1_entry.display().to_string()),
        "{untrusted:?}"
    );
    assert_eq!(s.plugin()["from_cache"], false);
    // A reload of the same file is a no-op.
    let (status, answer) = s.post_reload(&format!("?queue={}", s.input));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["results"][0]["result"], "unchanged", "{answer}");
    assert_eq!(answer["results"][0]["sha256"], sha_v1.as_str(), "{answer}");
    assert_eq!(s.swaps("swapped"), 2.0);
    assert_eq!(s.version_gauge(&sha_v1), Some(1.0));
    assert_eq!(s.version_gauge(&sha_v2), Some(0.0));
    let plugin = s.plugin();
    assert_eq!(plugin["sha256"], sha_v1.as_str());
    // What the swapped-in version's instances cost: at least the warm one
    // idle, its linear memory (a Rust guest: its 1 MiB stack and the SDK's
    // arena, far below the 64 MiB limit) and how long it took to make.
    let instances = &plugin["instances"];
    assert!(instances["idle"].as_u64() >= Some(1), "{plugin}");
    let memory = instances["memory_bytes"].as_u64().unwrap_or(0);
    assert!((1 << 20..16 << 20).contains(&memory), "{plugin}");
    assert!(
        instances["instantiation_ms"].as_f64() > Some(0.0),
        "{plugin}"
    );
    // The last refusal stays on show, with its reason and trigger.
    assert_eq!(plugin["last_refused"]["trigger"], "SIGHUP", "{plugin}");

    // Still one subscription, from start to finish.
    assert_eq!(log_lines_with(&host, ": consuming").len(), 1);
    assert_eq!(broker.message_count(&s.input).await.unwrap(), 0);
    let status = tokio::task::block_in_place(|| host.terminate(Duration::from_secs(30))).unwrap();
    assert!(status.success(), "{status}");
}

/// `v1 x 1000, v2 x 2000` style summary of a version sequence.
fn runs(versions: &[&str]) -> Vec<(String, usize)> {
    let mut runs: Vec<(String, usize)> = Vec::new();
    for v in versions {
        match runs.last_mut() {
            Some((last, n)) if last == v => *n += 1,
            _ => runs.push((v.to_string(), 1)),
        }
    }
    runs
}

/// The outputs of `seqs` and the version that made each, once all came.
async fn versions_of(s: &Scenario, seqs: std::ops::Range<u32>, host: &HostProcess) -> Vec<String> {
    let count = seqs.len();
    s.publish(seqs.clone()).await;
    let mut outputs = s.outputs(count, host).await;
    outputs.sort();
    assert_eq!(
        outputs.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(),
        seqs.collect::<Vec<_>>()
    );
    outputs.into_iter().map(|(_, version)| version).collect()
}

/// A new version whose start-up code sleeps inside the host (a WASI sleep
/// in its `_initialize`, where no epoch check can reach it) is refused at
/// its deadline, naming it; the reload lock is not held past it (the next
/// reload answers within seconds), and the old version keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_version_whose_start_up_code_sleeps_is_refused_at_its_deadline_and_the_old_one_keeps_serving()
 {
    let _one_host = ONE_HOST_AT_A_TIME.lock().await;
    let s = Scenario::new();
    std::fs::copy(plugin_path("stamp-v1"), s.handler()).unwrap();
    let config = s
        .config()
        .replace("concurrency = 1\n", "concurrency = 1\ndeadline = \"1s\"\n")
        .replace(
            "[consumers.config]\n",
            "[consumers.config]\nstartup_sleep_ms = \"60000\"\n",
        );
    let mut host = tokio::task::block_in_place(|| HostProcess::start(&config, 1)).unwrap();
    assert_eq!(versions_of(&s, 0..3, &host).await, ["v1"; 3]);

    let deployed = std::time::Instant::now();
    s.deploy(&plugin_path("sleeper"));
    wait_for_log(&mut host, "plugin refused", 1);
    let refused_after = deployed.elapsed();
    let refusal = log_lines_with(&host, "plugin refused").remove(0);
    assert!(
        refusal.contains("deadline of 1s exceeded"),
        "{refusal}\n{}",
        host.log_text()
    );
    // Compiling a 27 KB plugin, then the 1 s deadline: nowhere near the
    // minute its start-up code asks to sleep.
    assert!(refused_after < Duration::from_secs(20), "{refused_after:?}");

    // The lock was let go: another reload runs, and is refused alike.
    let asked = std::time::Instant::now();
    let (status, reports) = s.post_reload("");
    assert_eq!(status, 422, "{reports}");
    let reports = &reports["results"];
    assert_eq!(reports[0]["result"], "refused", "{reports}");
    assert!(
        reports[0]["reason"]
            .as_str()
            .unwrap()
            .contains("deadline of 1s exceeded"),
        "{reports}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "{:?}",
        asked.elapsed()
    );

    assert_eq!(versions_of(&s, 3..6, &host).await, ["v1"; 3]);
    let status = host.terminate(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
}

/// `wasm` with one more custom section: the same plugin, another file and
/// hash, so a deploy of it is a swap.
fn variant(wasm: &[u8], tag: u8) -> Vec<u8> {
    let name = b"acemq-test-variant";
    let mut out = wasm.to_vec();
    out.extend([0, (1 + name.len() + 1) as u8, name.len() as u8]);
    out.extend(name);
    out.push(tag);
    out
}

/// Codecs' instances count against the engine's pool as handlers' do.
/// Five codecs (each keeps a warm instance), a consumer running eight
/// calls at once that each sleep 100 ms, and its plugin swapped back and
/// forth while they run: every instance any of them needs finds a slot, and
/// every message is handled, none dead-lettered or parked. Before, the pool
/// was sized for the handlers alone, and with the old version's instances
/// still alive during each swap the new version's instantiations failed,
/// dead-lettering valid messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn codecs_and_hot_swaps_under_load_never_leave_an_instance_without_a_slot() {
    const MESSAGES: u32 = 480;
    const SWAPS: u8 = 10;
    let _one_host = ONE_HOST_AT_A_TIME.lock().await;
    let broker = shared_broker();
    let s = Scenario::new();
    let sleeper = std::fs::read(plugin_path("sleeper")).unwrap();
    std::fs::write(s.handler(), variant(&sleeper, 0)).unwrap();
    let codecs: String = [
        "application/msgpack",
        "application/x-msgpack",
        "application/vnd.a+msgpack",
        "application/vnd.b+msgpack",
        "application/vnd.c+msgpack",
    ]
    .iter()
    .map(|content_type| {
        format!(
            "[[codecs]]\nplugin = \"{}\"\ncontent_types = [\"{content_type}\"]\n\n",
            plugin_path("msgpack-codec").display()
        )
    })
    .collect();
    let config = s
        .config()
        .replace(
            "prefetch = 50\nconcurrency = 1\n",
            "prefetch = 32\nconcurrency = 8\ndeadline = \"10s\"\n",
        )
        .replace("[[consumers]]\n", &format!("{codecs}[[consumers]]\n"));
    let mut host = tokio::task::block_in_place(|| HostProcess::start(&config, 1)).unwrap();

    // "sleep:100" as a MessagePack string; the codec makes it a JSON one.
    s.publish_msgpack("sleep:100", MESSAGES).await;
    for swap in 1..=SWAPS {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let staged = s.dir.path().join(".handler.wasm.tmp");
        std::fs::write(&staged, variant(&sleeper, swap)).unwrap();
        std::fs::rename(&staged, s.handler()).unwrap();
    }
    wait_for_log(&mut host, "plugin swapped", 5);
    broker
        .wait_for_message_count(&s.input, 0, Duration::from_secs(120))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dead = broker
        .message_count(&format!("{}.dlq", s.input))
        .await
        .unwrap();
    let parked = broker
        .message_count(&format!("{}.parked", s.input))
        .await
        .unwrap();
    let (status, log) = host.terminate_with_log(Duration::from_secs(30)).unwrap();
    let swapped = log.iter().filter(|l| l.contains("plugin swapped")).count();
    let failures: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("handler failed") || l.contains("instance slot"))
        .take(5)
        .collect();
    assert_eq!((dead, parked), (0, 0), "{failures:#?}");
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(swapped >= 5, "only {swapped} swaps: the test proves little");
    assert!(status.success(), "{status}");
}

/// A reload checks the plugin's folders again, up to `/`: a folder above
/// the plugin folder made writable to everyone since the start (so anyone
/// could have swapped the plugin folder) refuses the reload with the
/// reason, and the old version keeps serving; trusted again, the same file
/// swaps in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_checks_every_folder_above_the_plugin_again() {
    use std::os::unix::fs::PermissionsExt;
    let _one_host = ONE_HOST_AT_A_TIME.lock().await;
    let s = Scenario::new();
    let folder = s.dir.path().join("plugins");
    std::fs::create_dir(&folder).unwrap();
    let handler = folder.join("handler.wasm");
    std::fs::copy(plugin_path("stamp-v1"), &handler).unwrap();
    let config = s.config().replace(
        &s.handler().display().to_string(),
        &handler.display().to_string(),
    );
    let mut host = tokio::task::block_in_place(|| HostProcess::start(&config, 1)).unwrap();
    assert_eq!(versions_of(&s, 0..3, &host).await, ["v1"; 3]);

    let chmod = |mode| {
        std::fs::set_permissions(s.dir.path(), std::fs::Permissions::from_mode(mode)).unwrap()
    };
    chmod(0o777);
    let staged = folder.join(".handler.wasm.tmp");
    std::fs::copy(plugin_path("stamp-v2"), &staged).unwrap();
    std::fs::rename(&staged, &handler).unwrap();
    wait_for_log(&mut host, "plugin refused", 1);
    let refusal = log_lines_with(&host, "plugin refused").remove(0);
    assert!(
        refusal.contains(&format!(
            "folder above a plugin {}: is writable by its group and others (mode 0777",
            s.dir.path().display()
        )),
        "{refusal}"
    );
    let plugin = s.plugin();
    assert!(
        plugin["last_refused"]["reason"]
            .as_str()
            .unwrap()
            .contains("is not trusted now"),
        "{plugin}"
    );
    assert_eq!(versions_of(&s, 3..6, &host).await, ["v1"; 3]);

    chmod(0o700);
    let (status, reports) = s.post_reload("");
    assert_eq!(status, 200, "{reports}");
    assert_eq!(reports["results"][0]["result"], "swapped", "{reports}");
    assert_eq!(versions_of(&s, 6..9, &host).await, ["v2"; 3]);
    let status = host.terminate(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
}

/// A plugin folder as the kubelet writes a ConfigMap volume: each file is a
/// link through `..data`, which links to a folder of the contents, and an
/// update writes a new contents folder and renames a new `..data` link over
/// the old one. The host watches the folder, sees only that rename, and
/// swaps to the new version.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_configmap_style_link_swap_deploys_the_new_version() {
    use std::os::unix::fs::symlink;
    let _one_host = ONE_HOST_AT_A_TIME.lock().await;
    let s = Scenario::new();
    let volume = s.dir.path();
    let contents = |name: &str, plugin: &str| {
        let folder = volume.join(name);
        std::fs::create_dir(&folder).unwrap();
        std::fs::copy(plugin_path(plugin), folder.join("handler.wasm")).unwrap();
    };
    contents("..2026_12_04_18_00_00.1", "stamp-v1");
    symlink("..2026_12_04_18_00_00.1", volume.join("..data")).unwrap();
    symlink("..data/handler.wasm", s.handler()).unwrap();
    let mut host = tokio::task::block_in_place(|| HostProcess::start(&s.config(), 1)).unwrap();
    assert_eq!(versions_of(&s, 0..3, &host).await, ["v1"; 3]);

    contents("..2026_12_04_18_05_00.2", "stamp-v2");
    symlink("..2026_12_04_18_05_00.2", volume.join("..data_tmp")).unwrap();
    std::fs::rename(volume.join("..data_tmp"), volume.join("..data")).unwrap();
    std::fs::remove_dir_all(volume.join("..2026_12_04_18_00_00.1")).unwrap();
    wait_for_log(&mut host, "plugin swapped", 1);
    assert_eq!(versions_of(&s, 3..6, &host).await, ["v2"; 3]);
    assert_eq!(s.swaps("swapped"), 1.0);
    let status = host.terminate(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
}

/// A codec swapped while messages flow through it: each swap is atomic (a
/// delivery decodes and encodes with the version it started with), a
/// broken file is refused and the old codec keeps serving, and nothing is
/// lost: every message decoded and acked, none dead-lettered or parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_codec_swapped_under_load_loses_nothing_and_a_broken_one_is_refused() {
    const MESSAGES: u32 = 600;
    const SWAPS: u8 = 6;
    let _one_host = ONE_HOST_AT_A_TIME.lock().await;
    let broker = shared_broker();
    let s = Scenario::new();
    std::fs::copy(plugin_path("sleeper"), s.handler()).unwrap();
    let codec_file = s.dir.path().join("codec.wasm");
    let codec = std::fs::read(plugin_path("msgpack-codec")).unwrap();
    std::fs::write(&codec_file, variant(&codec, 0)).unwrap();
    let config = s
        .config()
        .replace(
            "prefetch = 50\nconcurrency = 1\n",
            "prefetch = 32\nconcurrency = 4\n",
        )
        .replace(
            "[[consumers]]\n",
            &format!(
                "[[codecs]]\nplugin = \"{}\"\ncontent_types = [\"application/msgpack\"]\n\n[[consumers]]\n",
                codec_file.display()
            ),
        );
    let mut host = tokio::task::block_in_place(|| HostProcess::start(&config, 1)).unwrap();
    // Only a working codec makes it text the handler accepts; undecoded,
    // it would be parked.
    s.publish_msgpack("sleep:20", MESSAGES).await;
    let deploy = |bytes: &[u8]| {
        let staged = s.dir.path().join(".codec.wasm.tmp");
        std::fs::write(&staged, bytes).unwrap();
        std::fs::rename(&staged, &codec_file).unwrap();
    };
    for swap in 1..=SWAPS {
        tokio::time::sleep(Duration::from_millis(300)).await;
        deploy(&variant(&codec, swap));
    }
    wait_for_log(&mut host, "plugin swapped", usize::from(SWAPS));
    let before_garbage = s.get_json("/plugins");
    deploy(b"not a component");
    wait_for_log(&mut host, "plugin refused", 1);
    broker
        .wait_for_message_count(&s.input, 0, Duration::from_secs(120))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let codec_status = |plugins: &Value| {
        plugins
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["kind"] == "codec")
            .cloned()
            .unwrap()
    };
    let after = codec_status(&s.get_json("/plugins"));
    assert_eq!(after["queue"], "codec:codec");
    assert_eq!(
        after["sha256"],
        codec_status(&before_garbage)["sha256"],
        "the refused file did not replace it"
    );
    assert!(
        after["last_refused"]["reason"]
            .as_str()
            .unwrap()
            .contains("codec.wasm"),
        "{after}"
    );
    // Every message settled: the ready count is 0 with some still held.
    let acked = |s: &Scenario| {
        s.metric(&format!(
            "acemq_consume_total{{queue=\"{}\",outcome=\"acked\"}}",
            s.input
        ))
        .unwrap_or(0.0)
    };
    let settled = std::time::Instant::now();
    while acked(&s) < f64::from(MESSAGES) && settled.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, metrics) = s.get("/metrics");
    let outcomes: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("acemq_consume_total{") || l.starts_with("acemq_plugin_faults_total{")
        })
        .collect();
    let acked = acked(&s);
    let dead = broker
        .message_count(&format!("{}.dlq", s.input))
        .await
        .unwrap();
    let parked = broker
        .message_count(&format!("{}.parked", s.input))
        .await
        .unwrap();
    let (status, log) = host.terminate_with_log(Duration::from_secs(30)).unwrap();
    let swaps = log
        .iter()
        .filter(|l| l.contains("plugin swapped") && l.contains("codec:codec"))
        .count();
    assert_eq!(
        (acked, dead, parked),
        (f64::from(MESSAGES), 0, 0),
        "{outcomes:#?}"
    );
    assert_eq!(swaps, usize::from(SWAPS), "each deploy swapped the codec");
    assert!(status.success(), "{status}");
}
