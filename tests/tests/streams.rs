//! Stream consumers on a real broker: where each kind of offset starts
//! reading, and that a subscription that ends (a lost connection) resumes
//! where it stopped rather than at its configured offset.

use std::collections::BTreeMap;
use std::time::Duration;

use acemq_tests::host::{InProcessHost, plugin_path};
use acemq_tests::stamp::{StampConfig, drain_stamped};
use acemq_tests::{FaultProxy, shared_broker, unique_name};
use lapin::BasicProperties;
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};
use serde_json::Value;

/// A stream declared as the host declares one (durable, `x-queue-type`).
async fn declare_stream(name: &str) {
    shared_broker()
        .declare_queue(name, "stream", &[])
        .await
        .unwrap();
}

async fn append(stream: &str, ids: &[String]) {
    let messages = ids.iter().map(|id| {
        let properties = BasicProperties::default().with_message_id(id.as_str().into());
        (id.clone().into_bytes(), properties)
    });
    shared_broker()
        .publish_many("", stream, messages)
        .await
        .unwrap();
}

fn ids(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}{i}")).collect()
}

/// The config of a host on `url` reading `stream` through `stamp-v1` into
/// `output` (by way of `out_exchange`); `consumer` holds the consumer's own
/// lines (offset, name, checkpoint).
fn stream_config(
    url: &str,
    stream: &str,
    output: &str,
    out_exchange: &str,
    consumer: &str,
) -> String {
    let broker = format!("url = \"{url}\"\nnetwork_recovery_interval = \"200ms\"");
    StampConfig {
        broker: &broker,
        input_queue: "type = \"stream\"",
        consumer,
        ..StampConfig::new(stream, output, out_exchange)
    }
    .toml()
}

/// A host reading `stream` from `offset` (a TOML value) into an output
/// queue of its own; `url` is the broker's or a proxy's.
async fn reader(stream: &str, offset: &str, url: &str) -> (InProcessHost, String) {
    let out_exchange = unique_name("streams.x");
    let output = unique_name("streams.out");
    let config = stream_config(
        url,
        stream,
        &output,
        &out_exchange,
        &format!("offset = {offset}"),
    );
    (InProcessHost::start(&config).await.unwrap(), output)
}

/// How many times each input id was stamped into `output`, once at least
/// `expected` outputs arrived (or the wait ran out) and a moment passed for
/// any more.
async fn stamped(output: &str, expected: u32) -> BTreeMap<String, usize> {
    let broker = shared_broker();
    broker
        .wait_for_message_count(output, expected, Duration::from_secs(30))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    drain_stamped(broker, output).await
}

/// Every input stamped into `output`, once `distinct` were (see
/// [`acemq_tests::stamp::stamped_until`]).
async fn stamped_until(output: &str, distinct: usize) -> BTreeMap<String, usize> {
    acemq_tests::stamp::stamped_until(shared_broker(), output, distinct).await
}

fn names(seen: &BTreeMap<String, usize>) -> Vec<&str> {
    seen.keys().map(String::as_str).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn each_kind_of_offset_starts_where_it_says() {
    let broker = shared_broker();
    let stream = unique_name("streams.offsets");
    declare_stream(&stream).await;
    let (early, late) = (ids("a", 5), ids("b", 5));
    append(&stream, &early).await;
    // Separate chunks, a second apart: a time offset falls between them.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let between = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    append(&stream, &late).await;
    let everything: Vec<&str> = early.iter().chain(&late).map(String::as_str).collect();

    for offset in ["\"first\"", "\"1h\""] {
        let (host, output) = reader(&stream, offset, broker.amqp_url()).await;
        let seen = stamped(&output, 10).await;
        assert_eq!(names(&seen), everything, "offset {offset}");
        host.stop().await.unwrap();
    }
    // Offsets count from 0: offset 5 is the first of the second batch
    // (the stream holds nothing else).
    let (host, output) = reader(&stream, "5", broker.amqp_url()).await;
    assert_eq!(
        names(&stamped(&output, 5).await),
        ["b0", "b1", "b2", "b3", "b4"]
    );
    host.stop().await.unwrap();

    let (host, output) = reader(&stream, &format!("\"{between}\""), broker.amqp_url()).await;
    assert_eq!(
        names(&stamped(&output, 5).await),
        ["b0", "b1", "b2", "b3", "b4"]
    );
    host.stop().await.unwrap();

    // The last chunk: the newest messages, never the first batch.
    let (host, output) = reader(&stream, "\"last\"", broker.amqp_url()).await;
    let last = stamped(&output, 1).await;
    assert!(
        !last.is_empty() && last.keys().all(|k| k.starts_with('b')),
        "{last:?}"
    );
    assert!(last.contains_key("b4"), "{last:?}");
    host.stop().await.unwrap();

    // Next: only what is appended once it reads.
    let (host, output) = reader(&stream, "\"next\"", broker.amqp_url()).await;
    append(&stream, &ids("c", 1)).await;
    assert_eq!(names(&stamped(&output, 1).await), ["c0"]);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_lost_connection_reading_resumes_where_it_stopped_not_at_first() {
    const BEFORE: usize = 300;
    let broker = shared_broker();
    let stream = unique_name("streams.resume");
    declare_stream(&stream).await;
    append(&stream, &ids("m", BEFORE)).await;
    let upstream = format!("127.0.0.1:{}", broker.amqp_port()).parse().unwrap();
    let proxy = FaultProxy::start(upstream).unwrap();
    let url = broker.amqp_url().replacen(
        &format!(":{}", broker.amqp_port()),
        &format!(":{}", proxy.port()),
        1,
    );
    let (host, output) = reader(&stream, "\"first\"", &url).await;
    broker
        .wait_for_message_count(&output, BEFORE as u32, Duration::from_secs(30))
        .await
        .unwrap();
    proxy.cut_all();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after: Vec<String> = (BEFORE..BEFORE + 20).map(|i| format!("m{i}")).collect();
    append(&stream, &after).await;
    let seen = stamped(&output, (BEFORE + 20) as u32).await;
    assert_eq!(
        seen.len(),
        BEFORE + 20,
        "every message, before and after the loss"
    );
    // Only what was read but not yet acked when the connection dropped is
    // read again (at most the prefetch, 10); from "first" it would be all.
    let again: usize = seen.values().map(|n| n - 1).sum();
    assert!(again <= 10, "{again} messages read twice");
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_on_a_stream_declared_elsewhere_appends_nothing_and_is_dead_lettered_with_why() {
    let broker = shared_broker();
    let stream = unique_name("streams.elsewhere");
    // Another service's stream: this config does not declare it, names no
    // offset, and gives its consumer a retry policy.
    declare_stream(&stream).await;
    let config = format!(
        r#"
[broker]
url = "{url}"

[retry.three]
kind = "fixed"
attempts = 3
initial = "1s"

[[consumers]]
queue = "{stream}"
plugin = "{plugin}"
retry = "three"
"#,
        url = broker.amqp_url(),
        plugin = plugin_path("outcomes").display(),
    );
    let host = InProcessHost::start(&config).await.unwrap();
    append(&stream, &["retry:db down".to_string()]).await;

    let dead = broker
        .drain(&format!("{stream}.dlq"), 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(dead.len(), 1, "the retry went to the .dlq");
    let error = dead[0].acemq_error();
    let expected = format!("a handler reading the stream '{stream}' asked to retry message");
    assert!(error.starts_with(&expected), "{error}");
    assert!(error.ends_with("The handler's reason: db down"), "{error}");
    host.stop().await.unwrap();

    // The stream holds the one message it was given, no retry copy.
    let (reader, output) = reader(&stream, "\"first\"", broker.amqp_url()).await;
    assert_eq!(names(&stamped(&output, 1).await), ["retry:db down"]);
    reader.stop().await.unwrap();
}

/// The config of a host reading `stream` from the first offset, with
/// `checkpoint` lines and a consumer name unique to the stream (a
/// checkpoint kept in the broker is named by it).
fn checkpointed(stream: &str, output: &str, out_exchange: &str, checkpoint: &str) -> String {
    let consumer =
        format!("offset = \"first\"\nconsumer_name = \"projection-{stream}\"\n{checkpoint}");
    stream_config(
        shared_broker().amqp_url(),
        stream,
        output,
        out_exchange,
        &consumer,
    )
}

/// A stream holding `messages` messages (`m0`, `m1`, ...) and the config of
/// a named, checkpointing host reading it (see [`checkpointed`]), written
/// in a folder of its own.
struct Scene {
    stream: String,
    output: String,
    dir: tempfile::TempDir,
}

impl Scene {
    async fn new(prefix: &str, messages: usize, checkpoint: &str) -> Self {
        let stream = unique_name(prefix);
        declare_stream(&stream).await;
        append(&stream, &ids("m", messages)).await;
        let (out_exchange, output) = (unique_name("streams.x"), unique_name("streams.out"));
        let dir = tempfile::tempdir().unwrap();
        let config = checkpointed(&stream, &output, &out_exchange, checkpoint);
        std::fs::write(dir.path().join("host.toml"), config).unwrap();
        Self {
            stream,
            output,
            dir,
        }
    }

    fn config(&self) -> std::path::PathBuf {
        self.dir.path().join("host.toml")
    }

    /// The checkpoint queue a named consumer of this stream keeps.
    async fn drop_checkpoint_queue(&self) {
        shared_broker()
            .delete_queue(&format!("acemq.checkpoint.projection-{}", self.stream))
            .await
            .unwrap();
    }
}

/// Starts the host on `config` as a child process.
fn host_on(config: &std::path::Path) -> acemq_tests::host::HostProcess {
    use acemq_tests::host::{HostOptions, HostProcess};
    HostProcess::start_with(
        config,
        tempfile::tempdir().unwrap(),
        &HostOptions::default(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_kill_a_restarted_host_resumes_at_its_checkpoint_and_skips_nothing() {
    const MESSAGES: usize = 5000;
    const EVERY: usize = 100;
    const PREFETCH: usize = 10;
    let broker = shared_broker();
    let stream = unique_name("streams.checkpoint");
    declare_stream(&stream).await;
    append(&stream, &ids("m", MESSAGES)).await;
    let (out_exchange, output) = (unique_name("streams.x"), unique_name("streams.out"));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("host.toml");
    let lines =
        format!("checkpoint = \"file:projection-1.checkpoint\"\ncheckpoint_every = {EVERY}");
    std::fs::write(
        &config,
        checkpointed(&stream, &output, &out_exchange, &lines),
    )
    .unwrap();

    let first = host_on(&config);
    broker
        .wait_for_message_count(&output, (MESSAGES / 3) as u32, Duration::from_secs(60))
        .await
        .unwrap();
    drop(first); // SIGKILL: no shutdown, no last checkpoint
    let saved: u64 = std::fs::read_to_string(dir.path().join("projection-1.checkpoint"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(saved > 0, "a checkpoint was saved before the kill");

    let second = host_on(&config);
    let seen = stamped_until(&output, MESSAGES).await;
    assert_eq!(seen.len(), MESSAGES, "no offset was skipped");
    let again: usize = seen.values().map(|n| n - 1).sum();
    // Read again: what was done since the last save (under EVERY), what
    // was done out of order above the saved position (under PREFETCH: up
    // to PREFETCH deliveries are settled at once while one call runs at a
    // time), what had its outputs out but was not done (PREFETCH), and
    // what was done while the newest save was being written, if the kill
    // came then (a file written in milliseconds: a few messages, a quarter
    // of EVERY allowed for a loaded machine), as docs/streams.md says. It
    // catches a checkpoint that lags (a whole EVERY more) or a restart from
    // "first" (5000).
    let bound = EVERY + 2 * PREFETCH + EVERY / 4;
    assert!(again <= bound, "{again} read twice (bound {bound})");
    assert!(second.terminate(Duration::from_secs(30)).unwrap().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_kept_in_the_broker_moves_to_another_host_with_the_same_consumer_name() {
    const MESSAGES: usize = 3000;
    let broker = shared_broker();
    let stream = unique_name("streams.moves");
    declare_stream(&stream).await;
    append(&stream, &ids("m", MESSAGES)).await;
    let (out_exchange, output) = (unique_name("streams.x"), unique_name("streams.out"));
    // Two hosts that share nothing but the broker and the consumer name;
    // the checkpoint is the broker's (the default with a consumer name).
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for dir in [&dir_a, &dir_b] {
        std::fs::write(
            dir.path().join("host.toml"),
            checkpointed(&stream, &output, &out_exchange, ""),
        )
        .unwrap();
    }
    let a = host_on(&dir_a.path().join("host.toml"));
    broker
        .wait_for_message_count(&output, (MESSAGES / 3) as u32, Duration::from_secs(60))
        .await
        .unwrap();
    // A clean stop saves the last position.
    assert!(a.terminate(Duration::from_secs(30)).unwrap().success());
    let b = host_on(&dir_b.path().join("host.toml"));
    let seen = stamped_until(&output, MESSAGES).await;
    assert_eq!(seen.len(), MESSAGES, "no offset was skipped");
    let again: usize = seen.values().map(|n| n - 1).sum();
    // After a clean stop nothing is read twice (each ack was sent first).
    assert_eq!(again, 0, "{again} read twice");
    assert!(b.terminate(Duration::from_secs(30)).unwrap().success());
    broker
        .delete_queue(&format!("acemq.checkpoint.projection-{stream}"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn stream_reset_moves_a_stopped_consumers_checkpoint() {
    const MESSAGES: usize = 100;
    let scene = Scene::new("streams.reset", MESSAGES, "").await;
    let host = host_on(&scene.config());
    assert_eq!(stamped_until(&scene.output, MESSAGES).await.len(), MESSAGES);
    assert!(host.terminate(Duration::from_secs(30)).unwrap().success());

    let consumer = format!("projection-{}", scene.stream);
    let reset = std::process::Command::new(acemq_tests::host::host_binary())
        .args([
            "stream",
            "reset",
            "--consumer",
            &consumer,
            "--to",
            "50",
            "--config",
        ])
        .arg(scene.config())
        .env_remove("ACEMQ_URL")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&reset.stdout);
    assert!(
        reset.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&reset.stderr)
    );
    assert!(said.contains("now says: 50"), "{said}");

    // Restarted, it reads from offset 50 again: m50 to m99.
    let host = host_on(&scene.config());
    let again = stamped_until(&scene.output, MESSAGES / 2).await;
    let expected: Vec<String> = (50..MESSAGES).map(|i| format!("m{i}")).collect();
    assert_eq!(
        names(&again),
        expected.iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert!(host.terminate(Duration::from_secs(30)).unwrap().success());
    scene.drop_checkpoint_queue().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shadow_replay_compares_a_candidate_with_the_running_version_and_publishes_nothing() {
    const MESSAGES: usize = 10_000;
    let broker = shared_broker();
    let scene = Scene::new("streams.replay", MESSAGES, "").await;
    // Declares the output queue (and the stream), then stops at once.
    let host = host_on(&scene.config());
    assert!(host.terminate(Duration::from_secs(30)).unwrap().success());
    let published_before = broker.message_count(&scene.output).await.unwrap();

    let consumer = format!("projection-{}", scene.stream);
    let replay = |candidate: &str| {
        let output = std::process::Command::new(acemq_tests::host::host_binary())
            .args(["replay", "--consumer", &consumer, "--compare", "--config"])
            .arg(scene.config())
            .arg("--plugin")
            .arg(plugin_path(candidate))
            .env_remove("ACEMQ_URL")
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    let (code, table) = tokio::task::block_in_place(|| replay("stamp-v2"));
    assert_eq!(
        code,
        Some(3),
        "a candidate that differs fails the replay: {table}"
    );
    assert!(
        table.contains(&format!("messages read: {MESSAGES}")),
        "{table}"
    );
    assert!(
        table.contains(&format!("differing: {MESSAGES} of {MESSAGES}")),
        "{table}"
    );
    let (code, table) = tokio::task::block_in_place(|| replay("stamp-v1"));
    assert_eq!(code, Some(0), "{table}");
    assert!(
        table.contains(&format!("differing: 0 of {MESSAGES}")),
        "{table}"
    );
    // Nothing was published by either replay.
    assert_eq!(
        broker.message_count(&scene.output).await.unwrap(),
        published_before
    );
    scene.drop_checkpoint_queue().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_newest_offset_probe_finds_the_last_message_of_a_stream() {
    use acemq_host::broker::stream::newest_offset;
    let stream = unique_name("streams.newest");
    declare_stream(&stream).await;
    let connection = shared_broker().connect().await.unwrap();
    assert_eq!(
        newest_offset(&connection, &stream).await.unwrap(),
        None,
        "empty"
    );
    append(&stream, &ids("m", 25)).await;
    // Offsets count from 0: 25 messages end at 24.
    assert_eq!(newest_offset(&connection, &stream).await.unwrap(), Some(24));
    let _ = connection.close(200, "done".into()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn when_the_broker_closes_its_connection_a_reader_resumes_and_skips_nothing() {
    const MESSAGES: usize = 5000;
    const PREFETCH: usize = 10;
    let broker = shared_broker();
    let name = unique_name("stream-reader");
    let scene = Scene::new("streams.closed", MESSAGES, "").await;
    // The reader's connections carry its own name, so only they are closed
    // (other tests share this broker).
    let config = std::fs::read_to_string(scene.config()).unwrap().replacen(
        "[broker]\n",
        &format!("[broker]\nconnection_name = \"{name}\"\n"),
        1,
    );
    std::fs::write(scene.config(), config).unwrap();
    let host = host_on(&scene.config());
    broker
        .wait_for_message_count(
            &scene.output,
            (MESSAGES / 3) as u32,
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let listed = broker
        .rabbitmqctl(&["list_connections", "pid", "client_properties"])
        .unwrap();
    let ours: Vec<&str> = listed
        .lines()
        .filter(|l| l.contains(&format!("{name}.consume")))
        .filter_map(|l| l.split('\t').next())
        .collect();
    assert_eq!(ours.len(), 1, "{listed}");
    broker
        .rabbitmqctl(&["close_connection", ours[0], "closed by the stream test"])
        .unwrap();
    let seen = stamped_until(&scene.output, MESSAGES).await;
    assert_eq!(seen.len(), MESSAGES, "no offset was skipped");
    let again: usize = seen.values().map(|n| n - 1).sum();
    // What was still being handled when the connection closed (a delivery
    // handled since, its ack lost, is not read again); not the whole
    // stream again from "first". Prefetch bounds it whatever the
    // consumer's concurrency.
    assert!(again <= PREFETCH, "{again} read twice");
    assert!(host.terminate(Duration::from_secs(30)).unwrap().success());
    scene.drop_checkpoint_queue().await;
}

/// Like [`checkpointed`], with `[host]` lines (an admin endpoint, say).
fn checkpointed_with_host(
    stream: &str,
    output: &str,
    out_exchange: &str,
    checkpoint: &str,
    host: &str,
) -> String {
    let consumer =
        format!("offset = \"first\"\nconsumer_name = \"projection-{stream}\"\n{checkpoint}");
    let broker = format!(
        "url = \"{}\"\nnetwork_recovery_interval = \"200ms\"",
        shared_broker().amqp_url()
    );
    StampConfig {
        broker: &broker,
        host,
        input_queue: "type = \"stream\"",
        consumer: &consumer,
        ..StampConfig::new(stream, output, out_exchange)
    }
    .toml()
}

/// Starts the host on `config` without waiting for it to consume.
fn host_not_consuming(config: &std::path::Path) -> acemq_tests::host::HostProcess {
    use acemq_tests::host::{HostOptions, HostProcess};
    let options = HostOptions {
        consumers: 0,
        ..HostOptions::default()
    };
    HostProcess::start_with(config, tempfile::tempdir().unwrap(), &options).unwrap()
}

/// `GET /health` of the admin endpoint at `admin`, as JSON.
fn health(admin: &str) -> Value {
    let (_, body) = tokio::task::block_in_place(|| {
        acemq_tests::host::http_get(&format!("http://{admin}/health"))
    })
    .unwrap();
    serde_json::from_str(&body).unwrap()
}

/// Declares `queue` as a classic durable queue holding one message `body`.
async fn classic_queue_holding(queue: &str, body: &str) {
    let connection = shared_broker().connect().await.unwrap();
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    connection
        .create_channel()
        .await
        .unwrap()
        .queue_declare(queue.into(), options, FieldTable::default())
        .await
        .unwrap();
    let _ = connection.close(200, "done".into()).await;
    shared_broker()
        .publish("", queue, body.as_bytes(), BasicProperties::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_that_cannot_be_read_holds_the_consumer_instead_of_starting_it_at_its_offset()
{
    const MESSAGES: usize = 100;
    let broker = shared_broker();
    let stream = unique_name("streams.unreadable");
    declare_stream(&stream).await;
    append(&stream, &ids("m", MESSAGES)).await;
    let (out_exchange, output) = (unique_name("streams.x"), unique_name("streams.out"));
    // The real checkpoint says 50, in a queue the host cannot read: it
    // exists as a classic queue, so the host's declaration of its
    // checkpoint queue (quorum, one message) is refused.
    let checkpoint_queue = format!("acemq.checkpoint.projection-{stream}");
    classic_queue_holding(&checkpoint_queue, "50").await;
    let admin = format!("127.0.0.1:{}", acemq_tests::host::free_port());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("host.toml");
    let host_lines = format!("admin_listen = \"{admin}\"");
    std::fs::write(
        &config,
        checkpointed_with_host(&stream, &output, &out_exchange, "", &host_lines),
    )
    .unwrap();
    let mut host = host_not_consuming(&config);
    host.wait_for_log(
        "cannot read the stream checkpoint",
        2,
        Duration::from_secs(60),
    )
    .unwrap();
    // Tried again with backoff, and nothing read meanwhile: from "first"
    // it would have read all 100 and overwritten the checkpoint.
    let said = health(&admin);
    assert_eq!(said["status"], "DEGRADED", "{said}");
    let reason = said["consumers"][0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("cannot read the stream checkpoint"),
        "{said}"
    );
    let metrics = tokio::task::block_in_place(|| {
        acemq_tests::host::http_get(&format!("http://{admin}/metrics"))
    })
    .unwrap()
    .1;
    let failures = acemq_tests::host::metric_sum(
        &metrics,
        "acemq_stream_checkpoint_failures_total",
        &[("queue", stream.as_str())],
    );
    assert!(failures >= 2.0, "{metrics}");
    assert_eq!(broker.message_count(&output).await.unwrap(), 0);
    assert_eq!(broker.message_count(&checkpoint_queue).await.unwrap(), 1);

    // The checkpoint queue repaired (as the host declares it, holding the
    // same checkpoint): the consumer starts where the checkpoint says.
    broker.delete_queue(&checkpoint_queue).await.unwrap();
    let reset = std::process::Command::new(acemq_tests::host::host_binary())
        .args(["stream", "reset", "--consumer"])
        .arg(format!("projection-{stream}"))
        .args(["--to", "50", "--config"])
        .arg(&config)
        .env_remove("ACEMQ_URL")
        .output()
        .unwrap();
    assert!(
        reset.status.success(),
        "{}",
        String::from_utf8_lossy(&reset.stderr)
    );
    let seen = stamped_until(&output, MESSAGES / 2).await;
    let expected: Vec<String> = (50..MESSAGES).map(|i| format!("m{i}")).collect();
    assert_eq!(
        names(&seen),
        expected.iter().map(String::as_str).collect::<Vec<_>>(),
        "{}",
        host.log_text()
    );
    assert!(host.terminate(Duration::from_secs(30)).unwrap().success());
    broker.delete_queue(&checkpoint_queue).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hosts_with_one_consumer_name_read_one_at_a_time_and_the_second_takes_over() {
    const MESSAGES: usize = 2000;
    const LATER: usize = 300;
    let scene = Scene::new("streams.pair", MESSAGES, "").await;
    let a = host_on(&scene.config());
    // The second host, same config and name: it stands by.
    let mut b = host_not_consuming(&scene.config());
    b.wait_for_log("standing by", 1, Duration::from_secs(60))
        .unwrap();
    let seen = stamped_until(&scene.output, MESSAGES).await;
    assert_eq!(seen.len(), MESSAGES, "no offset was skipped");
    let again: usize = seen.values().map(|n| n - 1).sum();
    assert_eq!(again, 0, "read by one host only: {again} read twice");
    assert!(
        !b.log_text().contains(acemq_tests::host::SUBSCRIBED),
        "{}",
        b.log_text()
    );
    // The first stops cleanly; the second takes over where it left off.
    assert!(a.terminate(Duration::from_secs(30)).unwrap().success());
    b.wait_for_log(acemq_tests::host::SUBSCRIBED, 1, Duration::from_secs(30))
        .unwrap();
    let later: Vec<String> = (MESSAGES..MESSAGES + LATER)
        .map(|i| format!("m{i}"))
        .collect();
    append(&scene.stream, &later).await;
    let seen = stamped_until(&scene.output, LATER).await;
    assert_eq!(
        names(&seen),
        {
            let mut sorted: Vec<&str> = later.iter().map(String::as_str).collect();
            sorted.sort();
            sorted
        },
        "only what came after, each once: {seen:?}"
    );
    assert!(seen.values().all(|n| *n == 1), "{seen:?}");
    assert!(b.terminate(Duration::from_secs(30)).unwrap().success());
    scene.drop_checkpoint_queue().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_broker_offers_no_single_active_consumer_on_a_stream_read_over_amqp() {
    // Why the host takes a lease (broker/lease.rs) for a consumer name:
    // RabbitMQ 3.10 refuses the argument on a stream (3.11 added single
    // active consumer for the stream protocol only).
    let stream = unique_name("streams.sac");
    let refused = shared_broker()
        .declare_queue(
            &stream,
            "stream",
            &[("x-single-active-consumer", AMQPValue::Boolean(true))],
        )
        .await
        .unwrap_err();
    let refused = format!("{refused:#}");
    assert!(
        refused.contains("invalid arg 'x-single-active-consumer'"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_delivery_whose_set_aside_fails_is_tried_again_in_place_and_the_position_passes_it()
 {
    let broker = shared_broker();
    let stream = unique_name("streams.inplace");
    declare_stream(&stream).await;
    let bodies: Vec<String> = (0..10)
        .map(|i| match i {
            5 => "reject:bad".to_string(),
            _ => "accept".to_string(),
        })
        .collect();
    append(&stream, &bodies).await;
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("inplace.checkpoint");
    // declare = false: its `.dlq` is not declared, so the rejected
    // message's copy reaches no queue until the test declares one.
    let config = format!(
        r#"
[broker]
url = "{url}"

[[consumers]]
queue = "{stream}"
plugin = "{plugin}"
offset = "first"
declare = false
checkpoint = "file:{checkpoint}"
checkpoint_every = 1
"#,
        url = broker.amqp_url(),
        plugin = plugin_path("outcomes").display(),
        checkpoint = checkpoint.display(),
    );
    let host = InProcessHost::start(&config).await.unwrap();
    let dlq = format!("{stream}.dlq");
    // A requeued stream message is not delivered to its subscription
    // again: its offset (5) would stay unfinished for good. Tried again in
    // place, it waits for its `.dlq`.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let saved = || {
        std::fs::read_to_string(&checkpoint)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    assert_eq!(saved(), "5", "held at the message whose copy failed");
    broker.declare_queue(&dlq, "classic", &[]).await.unwrap();
    let dead = broker
        .drain(&dlq, 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(dead.len(), 1, "the copy landed once its queue existed");
    assert!(
        dead[0].acemq_error().contains("bad"),
        "{}",
        dead[0].acemq_error()
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while saved() != "10" && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(saved(), "10", "the position passed it, and the rest");
    // Never requeued (a retried outcome), and nothing read twice: the
    // subscription never had to start again to get past it.
    let count = |outcome| host.metrics.consumed_count(&stream, outcome);
    assert_eq!(
        (count("retried"), count("rejected"), count("acked")),
        (0, 1, 9),
        "{}",
        host.metrics.render()
    );
    host.stop().await.unwrap();
    broker.delete_queue(&dlq).await.unwrap();
}

/// The channels the broker lists for the consume and the publish
/// connection of the host named `name`; the fewest of three looks, a moment
/// apart (the lag probe opens one for a moment).
fn channels_of(name: &str) -> (usize, usize) {
    let broker = shared_broker();
    let connections = broker
        .rabbitmqctl(&["list_connections", "pid", "client_properties"])
        .unwrap();
    let pid = |role: &str| {
        connections
            .lines()
            .find(|l| l.contains(&format!("{name}.{role}")))
            .and_then(|l| l.split('\t').next())
            .unwrap_or_else(|| panic!("no {role} connection of {name}: {connections}"))
            .to_string()
    };
    let (consume, publish) = (pid("consume"), pid("publish"));
    let looks = (0..3).map(|_| {
        std::thread::sleep(Duration::from_millis(300));
        let channels = broker
            .rabbitmqctl(&["list_channels", "connection"])
            .unwrap();
        let on = |pid: &str| channels.lines().filter(|l| l.trim() == pid).count();
        (on(&consume), on(&publish))
    });
    looks.reduce(|a, b| (a.0.min(b.0), a.1.min(b.1))).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn resubscribing_on_a_live_connection_leaves_no_checkpoint_channel_behind() {
    const RESUBSCRIPTIONS: usize = 3;
    let broker = shared_broker();
    let name = unique_name("stream-resubscriber");
    let scene = Scene::new("streams.channels", 10, "").await;
    let config = std::fs::read_to_string(scene.config()).unwrap().replacen(
        "[broker]\n",
        &format!("[broker]\nconnection_name = \"{name}\"\n"),
        1,
    );
    std::fs::write(scene.config(), config).unwrap();
    let mut host = host_on(&scene.config());
    assert_eq!(stamped_until(&scene.output, 10).await.len(), 10);
    let before = tokio::task::block_in_place(|| channels_of(&name));
    for round in 1..=RESUBSCRIPTIONS {
        // The broker cancels the consumer of a deleted stream; the host
        // declares it again and resubscribes on the same connection.
        broker.delete_queue(&scene.stream).await.unwrap();
        tokio::task::block_in_place(|| {
            host.wait_for_log(
                acemq_tests::host::SUBSCRIBED,
                round + 1,
                Duration::from_secs(60),
            )
        })
        .unwrap();
    }
    let after = tokio::task::block_in_place(|| channels_of(&name));
    assert!(
        after.0 <= before.0 && after.1 <= before.1,
        "channels (consume, publish) before {before:?}, after {RESUBSCRIPTIONS} resubscriptions {after:?}"
    );
    assert!(host.terminate(Duration::from_secs(30)).unwrap().success());
    scene.drop_checkpoint_queue().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn during_a_memory_alarm_a_stream_consumer_keeps_reading_and_its_stop_ends() {
    const MESSAGES: usize = 3000;
    // The alarm is broker-wide: a node of its own.
    let broker = acemq_tests::Broker::start().unwrap();
    let stream = unique_name("streams.alarm");
    broker.declare_queue(&stream, "stream", &[]).await.unwrap();
    // Accepted without outputs: the only publishes are checkpoints.
    let messages = (0..MESSAGES).map(|_| (b"accept".to_vec(), BasicProperties::default()));
    broker.publish_many("", &stream, messages).await.unwrap();
    let admin = format!("127.0.0.1:{}", acemq_tests::host::free_port());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("host.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[broker]
url = "{url}"

[host]
admin_listen = "{admin}"

[[consumers]]
queue = "{stream}"
plugin = "{plugin}"
offset = "first"
consumer_name = "projection-{stream}"
checkpoint_every = 100
"#,
            url = broker.amqp_url(),
            plugin = plugin_path("outcomes").display(),
        ),
    )
    .unwrap();
    broker
        .rabbitmqctl(&["set_vm_memory_high_watermark", "0"])
        .unwrap();
    let host = host_on(&config);
    // A publishing connection is blocked: on the consume connection a
    // checkpoint would stall every ack, and the reading with them.
    let position = || {
        let metrics = tokio::task::block_in_place(|| {
            acemq_tests::host::http_get(&format!("http://{admin}/metrics"))
        })
        .map(|(_, text)| text)
        .unwrap_or_default();
        acemq_tests::host::metric_sum(
            &metrics,
            "acemq_stream_position",
            &[("queue", stream.as_str())],
        )
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while position() < MESSAGES as f64 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let said = health(&admin);
    assert_eq!(
        position(),
        MESSAGES as f64,
        "read the whole stream during the alarm: {said}"
    );
    assert_eq!(said["connections"]["consume"]["state"], "up", "{said}");
    // Its stop ends although its last checkpoint cannot be stored.
    let stopped = host.terminate_with_log(Duration::from_secs(40));
    broker
        .rabbitmqctl(&["set_vm_memory_high_watermark", "0.4"])
        .unwrap();
    let (status, log) = stopped.expect("the host stops during the alarm");
    assert!(status.success(), "{}", log.join("\n"));
    broker.stop().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_requeued_stream_delivery_is_not_delivered_again_and_its_channel_is_closed() {
    // Why a stream delivery is never requeued (delivery/decide.rs): the
    // broker gives it to no one, and closes the channel, so the
    // subscription ends and whatever else it had in hand is read again.
    use futures::StreamExt as _;
    use lapin::options::{BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
    let stream = unique_name("streams.requeue");
    declare_stream(&stream).await;
    append(&stream, &ids("m", 3)).await;
    let connection = shared_broker().connect().await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_qos(10, BasicQosOptions { global: false })
        .await
        .unwrap();
    let mut offset = FieldTable::default();
    offset.insert(
        "x-stream-offset".into(),
        AMQPValue::LongString("first".into()),
    );
    let mut deliveries = channel
        .basic_consume(
            stream.as_str().into(),
            "requeue-probe".into(),
            BasicConsumeOptions::default(),
            offset,
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut nacked = false;
    while let Ok(Some(Ok(delivery))) =
        tokio::time::timeout(Duration::from_secs(3), deliveries.next()).await
    {
        seen.push(String::from_utf8_lossy(&delivery.data).into_owned());
        if !nacked {
            nacked = true;
            let requeue = BasicNackOptions {
                multiple: false,
                requeue: true,
            };
            delivery.acker.nack(requeue).await.unwrap();
        }
    }
    assert_eq!(
        seen.iter().filter(|m| *m == "m0").count(),
        1,
        "m0 was not delivered again: {seen:?}"
    );
    assert!(
        !channel.status().connected(),
        "the broker closed the channel"
    );
    let _ = connection.close(200, "done".into()).await;
}
