//! `acemq-host dlq list|show|replay|purge` against a real broker, run as
//! the operator runs them: the host binary, on a config file.
//!
//! The set-aside messages are either set aside by a running host (the
//! `outcomes` plugin rejecting them), or published straight into
//! `{queue}.dlq` with the headers the host writes on a set-aside copy
//! (`envelope::set_aside_properties`), when a test needs many of them or
//! exact ids.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use acemq_host::envelope::{
    Envelope, header, now_ms, parse_rfc3339_ms, set_aside_properties, stamp,
};
use acemq_tests::host::{InProcessHost, host_binary, plugin_path};
use acemq_tests::{ReceivedMessage, shared_broker, unique_name, watchdog};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};

const WAIT: Duration = Duration::from_secs(60);
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A consumer's queue with its set-aside queues, and a config naming it.
struct Scene {
    queue: String,
    dlq: String,
    config: String,
    dir: tempfile::TempDir,
}

impl Scene {
    /// The config of one consumer of `prefix.*` running `outcomes`, with
    /// its topology declared by a host that is stopped again, so nothing
    /// consumes while the test works.
    async fn new(prefix: &str) -> Scene {
        let broker = shared_broker();
        let queue = unique_name(prefix);
        let config = format!(
            r#"
[broker]
url = "{url}"

[[queues]]
name = "{queue}"
dead_letter = true

[[consumers]]
queue = "{queue}"
plugin = "{plugin}"
"#,
            url = broker.amqp_url(),
            plugin = plugin_path("outcomes").display(),
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("host.toml"), &config).unwrap();
        InProcessHost::start(&config)
            .await
            .unwrap()
            .stop()
            .await
            .unwrap();
        Scene {
            dlq: format!("{queue}.dlq"),
            queue,
            config,
            dir,
        }
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("host.toml")
    }

    /// `acemq-host dlq ARGS --config ... --queue ...`, to its end.
    fn dlq(&self, args: &[&str]) -> Output {
        let _step = watchdog::step(format!("acemq-host dlq {}", args.join(" ")));
        tokio::task::block_in_place(|| self.command(args).output().expect("acemq-host runs"))
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(host_binary());
        command
            .arg("dlq")
            .args(args)
            .arg("--config")
            .arg(self.config_path())
            .args(["--queue", &self.queue])
            .env_remove("ACEMQ_URL")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null());
        command
    }

    async fn count(&self, queue: &str) -> u32 {
        shared_broker().message_count(queue).await.unwrap()
    }

    /// Publishes set-aside copies straight into `{queue}.dlq`, in order.
    async fn set_aside(&self, messages: Vec<(Vec<u8>, BasicProperties)>) {
        shared_broker()
            .publish_many("", &self.dlq, messages)
            .await
            .unwrap();
    }

    /// Takes every message out of `queue`, in order.
    async fn drain_all(&self, queue: &str) -> Vec<ReceivedMessage> {
        let count = self.count(queue).await as usize;
        let messages = shared_broker().drain(queue, count, WAIT).await.unwrap();
        assert_eq!(messages.len(), count, "drained {queue}");
        messages
    }
}

/// A row of the summary table.
fn row(label: &str, count: usize) -> String {
    format!("  {label:<18}{count:>8}\n")
}

fn text(output: &Output) -> (Option<i32>, String, String) {
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A set-aside copy as the host writes one: envelope `id` of `message_type`,
/// set aside on attempt 3 with `reason`, with a trace and an application
/// header of its own.
fn copy(id: &str, message_type: &str, reason: &str, body: &[u8]) -> (Vec<u8>, BasicProperties) {
    let mut envelope = Envelope::new(message_type, "acemq@test", now_ms() - 60_000);
    envelope.id = id.into();
    envelope.attempt = 3;
    let mut app = FieldTable::default();
    app.insert(
        "traceparent".into(),
        AMQPValue::LongString(LongString::from(TRACEPARENT)),
    );
    app.insert("x-tenant".into(), AMQPValue::LongLongInt(7));
    let original = BasicProperties::default()
        .with_content_type("text/plain".into())
        .with_correlation_id(format!("corr-{id}").as_str().into())
        .with_headers(app);
    (
        body.to_vec(),
        set_aside_properties(&original, &envelope, reason),
    )
}

fn envelope_id(message: &ReceivedMessage) -> String {
    match message.header(header::ID) {
        Some(AMQPValue::LongString(id)) => String::from_utf8_lossy(id.as_bytes()).into_owned(),
        other => panic!("x-acemq-id: {other:?}"),
    }
}

fn text_header(message: &ReceivedMessage, name: &str) -> String {
    match message.header(name) {
        Some(AMQPValue::LongString(text)) => String::from_utf8_lossy(text.as_bytes()).into_owned(),
        other => panic!("{name}: {other:?}"),
    }
}

/// Checks that `after` is `before` replayed out of `dlq` (for the
/// `count`-th time, between `from_ms` and `to_ms`): the stamps exact, the
/// attempt 1, the reason gone, and everything else as it was.
fn assert_replayed(
    before: &ReceivedMessage,
    after: &ReceivedMessage,
    dlq: &str,
    count: i64,
    (from_ms, to_ms): (u64, u64),
) {
    let id = envelope_id(before);
    assert_eq!(envelope_id(after), id);
    assert_eq!(after.body, before.body, "{id}: the body, byte for byte");
    assert_eq!(
        after.header(header::ATTEMPT),
        Some(&AMQPValue::LongInt(1)),
        "{id}"
    );
    assert_eq!(
        after.header(header::ERROR),
        None,
        "{id}: the reason is cleared"
    );
    assert_eq!(text_header(after, stamp::REPLAYED_FROM), dlq, "{id}");
    let at = text_header(after, stamp::REPLAYED_AT);
    assert!(
        at.len() == "2026-02-03T04:05:06.789Z".len() && at.ends_with('Z'),
        "{id}: RFC 3339 with milliseconds: {at}"
    );
    let at_ms = parse_rfc3339_ms(&at).unwrap_or_else(|| panic!("{id}: {at} parses"));
    assert!(
        (from_ms / 1000 * 1000..=to_ms).contains(&at_ms),
        "{id}: {at} is when the replay ran"
    );
    assert_eq!(
        after.header(stamp::REPLAY_COUNT),
        Some(&AMQPValue::LongLongInt(count)),
        "{id}"
    );
    // Every other header as it was, and nothing else added.
    let changed = [
        header::ATTEMPT,
        header::ERROR,
        stamp::REPLAYED_FROM,
        stamp::REPLAYED_AT,
        stamp::REPLAY_COUNT,
    ];
    let unchanged = |m: &ReceivedMessage| -> HashMap<String, AMQPValue> {
        m.headers
            .inner()
            .iter()
            .filter(|(name, _)| !changed.contains(&name.as_str()))
            .map(|(name, value)| (name.to_string(), value.clone()))
            .collect()
    };
    assert_eq!(
        unchanged(after),
        unchanged(before),
        "{id}: the other headers"
    );
    assert!(after.header("traceparent").is_some(), "{id}");
    let p = (&after.properties, &before.properties);
    assert_eq!(p.0.message_id(), p.1.message_id(), "{id}");
    assert_eq!(p.0.content_type(), p.1.content_type(), "{id}");
    assert_eq!(p.0.correlation_id(), p.1.correlation_id(), "{id}");
    assert_eq!(p.0.delivery_mode(), p.1.delivery_mode(), "{id}");
    // Back to the consumer's queue through the default exchange.
    assert_eq!(after.exchange, "");
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_moves_every_message_back_stamped_and_a_second_replay_counts_two() {
    const MESSAGES: usize = 5;
    let broker = shared_broker();
    let scene = Scene::new("dlq.replay").await;

    // A host rejects them: real set-aside copies.
    let host = InProcessHost::start(&scene.config).await.unwrap();
    let mut headers = FieldTable::default();
    headers.insert(
        "traceparent".into(),
        AMQPValue::LongString(LongString::from(TRACEPARENT)),
    );
    let messages = (0..MESSAGES).map(|i| {
        let properties = BasicProperties::default()
            .with_content_type("text/plain".into())
            .with_message_id(format!("order-{i}").as_str().into())
            .with_correlation_id(format!("corr-{i}").as_str().into())
            .with_headers(headers.clone());
        (format!("reject:bad order {i}").into_bytes(), properties)
    });
    broker
        .publish_many("", &scene.queue, messages)
        .await
        .unwrap();
    let set_aside = broker
        .wait_for_message_count(&scene.dlq, MESSAGES as u32, WAIT)
        .await
        .unwrap();
    host.stop().await.unwrap();
    assert_eq!(set_aside, MESSAGES as u32);
    // Looked at, then put back as they were, so the replay can be compared.
    let before = scene.drain_all(&scene.dlq).await;
    // (In the order the host's concurrent handlers set them aside.)
    for message in &before {
        let reason = message.acemq_error();
        assert!(
            reason.starts_with("the handler rejected it: bad order"),
            "{reason}"
        );
    }
    let again: Vec<_> = before
        .iter()
        .map(|m| (m.body.clone(), m.properties.clone()))
        .collect();
    scene.set_aside(again).await;

    let started = now_ms();
    let (code, stdout, stderr) = text(&scene.dlq(&["replay"]));
    let ended = now_ms();
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("replay {} -> {}", scene.dlq, scene.queue)),
        "{stdout}"
    );
    assert!(stdout.contains(&row("moved", 5)), "{stdout}");
    assert!(stdout.contains(&row("skipped by filter", 0)), "{stdout}");
    assert!(stdout.contains(&row("failed", 0)), "{stdout}");
    // Not a terminal: plain progress, no bar.
    assert!(stderr.contains("examined"), "{stderr}");
    assert_eq!(scene.count(&scene.dlq).await, 0);
    let replayed = scene.drain_all(&scene.queue).await;
    assert_eq!(replayed.len(), MESSAGES);
    for (before, after) in before.iter().zip(&replayed) {
        assert_replayed(before, after, &scene.dlq, 1, (started, ended));
    }

    // The host rejects them again: the stamps ride along on the new
    // set-aside copies, and a second replay counts two.
    let again: Vec<_> = replayed
        .iter()
        .map(|m| (m.body.clone(), m.properties.clone()))
        .collect();
    broker.publish_many("", &scene.queue, again).await.unwrap();
    let host = InProcessHost::start(&scene.config).await.unwrap();
    broker
        .wait_for_message_count(&scene.dlq, MESSAGES as u32, WAIT)
        .await
        .unwrap();
    host.stop().await.unwrap();
    let before = scene.drain_all(&scene.dlq).await;
    assert_eq!(
        before[0].header(stamp::REPLAY_COUNT),
        Some(&AMQPValue::LongLongInt(1))
    );
    let again: Vec<_> = before
        .iter()
        .map(|m| (m.body.clone(), m.properties.clone()))
        .collect();
    scene.set_aside(again).await;
    let started = now_ms();
    let (code, stdout, stderr) = text(&scene.dlq(&["replay"]));
    let ended = now_ms();
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let replayed = scene.drain_all(&scene.queue).await;
    assert_eq!(replayed.len(), MESSAGES);
    for (before, after) in before.iter().zip(&replayed) {
        assert_replayed(before, after, &scene.dlq, 2, (started, ended));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn filter_limit_and_dry_run_move_only_what_they_say_and_keep_the_order() {
    let scene = Scene::new("dlq.filter").await;
    // Even: timeouts of order.placed; odd: refusals of order.cancelled.
    let messages = (0..10)
        .map(|i| match i % 2 {
            0 => copy(
                &format!("m-{i}"),
                "order.placed",
                "exhausted 3 attempts: timeout",
                b"{}",
            ),
            _ => copy(
                &format!("m-{i}"),
                "order.cancelled",
                "rejected: bad total",
                b"{}",
            ),
        })
        .collect();
    scene.set_aside(messages).await;

    let (code, stdout, stderr) =
        text(&scene.dlq(&["replay", "--filter", "reason~=timeout", "--dry-run"]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("(dry run: nothing changed)"), "{stdout}");
    assert!(stdout.contains(&row("would move", 5)), "{stdout}");
    assert!(stdout.contains(&row("skipped by filter", 5)), "{stdout}");
    assert_eq!(scene.count(&scene.dlq).await, 10);
    assert_eq!(scene.count(&scene.queue).await, 0);

    let (code, stdout, stderr) = text(&scene.dlq(&[
        "replay",
        "--filter",
        "reason~=timeout",
        "--filter",
        "type=order.placed",
        "--limit",
        "3",
    ]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains(&row("moved", 3)), "{stdout}");
    assert_eq!(scene.count(&scene.queue).await, 3);
    assert_eq!(scene.count(&scene.dlq).await, 7);

    let (code, stdout, stderr) = text(&scene.dlq(&["replay", "--filter", "type=order.cancelled"]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains(&row("moved", 5)), "{stdout}");
    assert!(stdout.contains(&row("skipped by filter", 2)), "{stdout}");

    // Moved in their order; the two left behind kept theirs.
    let moved: Vec<String> = scene
        .drain_all(&scene.queue)
        .await
        .iter()
        .map(envelope_id)
        .collect();
    assert_eq!(
        moved,
        ["m-0", "m-2", "m-4", "m-1", "m-3", "m-5", "m-7", "m-9"]
    );
    let left: Vec<String> = scene
        .drain_all(&scene.dlq)
        .await
        .iter()
        .map(envelope_id)
        .collect();
    assert_eq!(left, ["m-6", "m-8"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn unusable_arguments_exit_2_naming_what_was_wrong_before_touching_the_broker() {
    let scene = Scene::new("dlq.refusals").await;
    scene
        .set_aside(vec![copy("m-0", "t", "rejected: x", b"{}")])
        .await;

    let (code, _, stderr) = text(&scene.dlq(&["replay", "--filter", "colour=red"]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--filter 'colour=red': unknown key 'colour'"),
        "{stderr}"
    );

    let output = tokio::task::block_in_place(|| {
        Command::new(host_binary())
            .args(["dlq", "list", "--config"])
            .arg(scene.config_path())
            .args(["--queue", "orders.unknown"])
            .output()
            .unwrap()
    });
    let (code, _, stderr) = text(&output);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("no consumer reads the queue 'orders.unknown'")
            && stderr.contains(&format!("(consumers' queues: {})", scene.queue)),
        "{stderr}"
    );

    let (code, _, stderr) = text(&scene.dlq(&["purge"]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("add --yes"), "{stderr}");
    assert_eq!(scene.count(&scene.dlq).await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_copy_the_broker_returns_fails_the_replay_and_its_original_stays() {
    let scene = Scene::new("dlq.returned").await;
    let messages = (0..3)
        .map(|i| copy(&format!("m-{i}"), "t", "rejected: x", b"{}"))
        .collect();
    scene.set_aside(messages).await;
    // Nothing to route to: every copy comes back as unroutable.
    shared_broker().delete_queue(&scene.queue).await.unwrap();

    let (code, stdout, stderr) = text(&scene.dlq(&["replay"]));
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(stdout.contains(&row("moved", 0)), "{stdout}");
    assert!(stdout.contains(&row("failed", 3)), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "failed: m-0: the broker returned it (312 NO_ROUTE): is the queue '{}' declared?",
            scene.queue
        )),
        "{stdout}"
    );
    let ids: Vec<String> = scene
        .drain_all(&scene.dlq)
        .await
        .iter()
        .map(envelope_id)
        .collect();
    assert_eq!(ids, ["m-0", "m-1", "m-2"], "every original stays, in order");
}

#[tokio::test(flavor = "multi_thread")]
async fn list_and_show_leave_the_queue_exactly_as_it_was() {
    let scene = Scene::new("dlq.list").await;
    let mut messages: Vec<_> = (0..6)
        .map(|i| {
            copy(
                &format!("m-{i}"),
                if i < 3 { "order.placed" } else { "order.paid" },
                &format!("exhausted 3 attempts: failure {i}"),
                format!("{{\"order\":{i}}}").as_bytes(),
            )
        })
        .collect();
    messages.push(copy(
        "m-bin",
        "blob",
        "the body is not UTF-8",
        &[0xff, 0x00, 0x41],
    ));
    scene.set_aside(messages).await;

    let (code, stdout, stderr) = text(&scene.dlq(&["list"]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("#  ID"), "{stdout}");
    for (i, line) in lines[1..7].iter().enumerate() {
        assert!(line.starts_with(&format!("{}  m-{i} ", i + 1)), "{stdout}");
        assert!(
            line.ends_with(&format!("exhausted 3 attempts: failure {i}")),
            "{line}"
        );
        assert!(
            line.contains("  3        0        "),
            "attempt 3, no replays: {line}"
        );
        assert!(line.contains(" 1m"), "an age of a minute: {line}");
    }
    assert!(lines[7].starts_with("7  m-bin"), "{stdout}");
    assert!(
        stdout.ends_with(&format!("7 of the 7 messages in {} shown\n", scene.dlq)),
        "{stdout}"
    );

    let (code, stdout, _) =
        text(&scene.dlq(&["list", "--filter", "type=order.paid", "--limit", "2"]));
    assert_eq!(code, Some(0));
    let ids: Vec<&str> = stdout
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(1))
        .filter(|id| id.starts_with("m-"))
        .collect();
    assert_eq!(ids, ["m-3", "m-4"], "{stdout}");
    assert!(stdout.contains("matching type=order.paid"), "{stdout}");

    let field = |name: &str, value: &str| format!("  {name:<18}{value}\n");
    let (code, stdout, stderr) = text(&scene.dlq(&["show", "--id", "m-2"]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    for expected in [
        format!("message 3 of {}\n", scene.dlq),
        field("type", "order.placed"),
        field("reason", "exhausted 3 attempts: failure 2"),
        field("correlation-id", "corr-m-2"),
        format!("  traceparent = \"{TRACEPARENT}\"\n"),
        "body (11 bytes, text)\n{\"order\":2}\n".into(),
    ] {
        assert!(stdout.contains(&expected), "{expected:?} in\n{stdout}");
    }
    let (code, stdout, _) = text(&scene.dlq(&["show", "--position", "7"]));
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("body (3 bytes, binary)\n00000000  ff 00 41"),
        "{stdout}"
    );
    let (code, _, stderr) = text(&scene.dlq(&["show", "--id", "m-none"]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("no message with id 'm-none' among the 7 messages"),
        "{stderr}"
    );

    // Every message still there, once, in its order.
    let ids: Vec<String> = scene
        .drain_all(&scene.dlq)
        .await
        .iter()
        .map(envelope_id)
        .collect();
    assert_eq!(ids, ["m-0", "m-1", "m-2", "m-3", "m-4", "m-5", "m-bin"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn purge_removes_only_what_matches_or_with_yes_everything() {
    let scene = Scene::new("dlq.purge").await;
    let messages = (0..6)
        .map(|i| {
            copy(
                &format!("m-{i}"),
                if i % 3 == 0 { "test.ping" } else { "order" },
                "rejected: x",
                b"{}",
            )
        })
        .collect();
    scene.set_aside(messages).await;

    let (code, stdout, _) = text(&scene.dlq(&["purge", "--filter", "type=test.ping", "--dry-run"]));
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains(&row("would purge", 2)), "{stdout}");
    assert_eq!(scene.count(&scene.dlq).await, 6);

    let (code, stdout, _) = text(&scene.dlq(&["purge", "--filter", "type=test.ping", "--yes"]));
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains(&row("purged", 2)), "{stdout}");
    assert!(stdout.contains(&row("skipped by filter", 4)), "{stdout}");
    assert_eq!(scene.count(&scene.dlq).await, 4);

    let (code, stdout, _) = text(&scene.dlq(&["purge", "--yes"]));
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains(&row("purged", 4)), "{stdout}");
    assert_eq!(scene.count(&scene.dlq).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_replay_loses_nothing_and_doubles_at_most_the_one_in_flight() {
    use std::os::unix::process::ExitStatusExt as _;
    const MESSAGES: usize = 2000;
    /// Killed once the source queue holds this many: some, far from all.
    const KILL_AT: u32 = 200;
    let scene = Scene::new("dlq.interrupted").await;
    let messages = (0..MESSAGES)
        .map(|i| {
            copy(
                &format!("m-{i}"),
                "order.placed",
                "exhausted 3 attempts: timeout",
                format!("{i}").as_bytes(),
            )
        })
        .collect();
    scene.set_aside(messages).await;

    let mut child = scene
        .command(&["replay"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    let moved_when_killed = loop {
        let moved = scene.count(&scene.queue).await;
        if moved >= KILL_AT {
            child.kill().unwrap(); // SIGKILL: no chance to finish the message in flight
            break moved;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the replay ended before it could be interrupted"
        );
        assert!(tokio::time::Instant::now() < deadline, "no message moved");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let status = tokio::task::block_in_place(|| child.wait()).unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "the replay was killed, not finished"
    );
    assert!((moved_when_killed as usize) < MESSAGES);

    // The broker requeues what the dead connection held; then the two
    // queues together hold every message, at most one of them twice.
    let moved = scene.drain_all(&scene.queue).await;
    assert!(
        moved.len() < MESSAGES,
        "some, not all, moved: {}",
        moved.len()
    );
    shared_broker()
        .wait_for_message_count(&scene.dlq, (MESSAGES - moved.len()) as u32, WAIT)
        .await
        .unwrap();
    let left = scene.drain_all(&scene.dlq).await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for message in moved.iter().chain(&left) {
        *seen.entry(envelope_id(message)).or_default() += 1;
    }
    let missing: Vec<usize> = (0..MESSAGES)
        .filter(|i| !seen.contains_key(&format!("m-{i}")))
        .collect();
    assert!(missing.is_empty(), "lost: {missing:?}");
    let doubled: Vec<(&String, &usize)> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        doubled.len() <= 1 && doubled.iter().all(|(_, n)| **n == 2),
        "only the message in flight may be in both queues: {doubled:?}"
    );
    println!(
        "killed with {moved_when_killed} moved; {} moved in all, {} left, doubled: {doubled:?}",
        moved.len(),
        left.len()
    );
    assert_eq!(moved.len() + left.len(), MESSAGES + doubled.len());
    // What moved carries its stamps; what stayed is as it was.
    assert!(
        moved
            .iter()
            .all(|m| m.header(stamp::REPLAY_COUNT).is_some())
    );
    assert!(
        left.iter()
            .all(|m| m.header(stamp::REPLAY_COUNT).is_none() && m.header(header::ERROR).is_some())
    );
}
