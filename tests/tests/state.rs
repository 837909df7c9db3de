//! Plugin state and idempotent consumers end to end (docs/state.md): the
//! `tally` and `velocity` plugins on a real broker, with the embedded store
//! (a redb file in a folder of each test's own) and the binary's shared
//! Redis. Each test asserts what lands on which queue, what the store holds
//! afterwards and what `/metrics` counted.
//!
//! Every test has a queue, a namespace and an output queue of its own
//! (`acemq_tests::state_host::Scenario`), so they run at once.

use std::time::{Duration, Instant};

use acemq_tests::host::{HostOptions, HostProcess, InProcessHost, host_binary, metric_sum};
use acemq_tests::state_host::{
    Consumer, Scenario, StoreKind, free_admin_address, new_envelope, scrape, wait_until,
};
use acemq_tests::{ReceivedMessage, shared_broker};

/// The envelope id and AMQP message-id of an output; panics when they differ.
fn output_id(message: &ReceivedMessage) -> String {
    let id = message
        .string_header("x-acemq-id")
        .expect("an output has an x-acemq-id");
    assert_eq!(message.message_id.as_deref(), Some(id.as_str()));
    id
}

/// The sum of a metric's samples with `labels` on an in-process host.
fn metric(host: &InProcessHost, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_sum(&host.metrics.render(), name, labels)
}

/// Waits until the host settled `count` deliveries of `queue` as `outcome`.
async fn settled(host: &InProcessHost, queue: &str, outcome: &str, count: u64) {
    wait_until(
        Duration::from_secs(60),
        &format!("{count} deliveries of {queue} settled {outcome}"),
        async || host.metrics.consumed_count(queue, outcome) >= count,
    )
    .await;
}

/// Everything on `queue` now (up to `at_most`), waiting `within` for more.
async fn take(queue: &str, at_most: usize, within: Duration) -> Vec<ReceivedMessage> {
    shared_broker().drain(queue, at_most, within).await.unwrap()
}

async fn count_of(queue: &str) -> u32 {
    shared_broker().message_count(queue).await.unwrap()
}

/// Starts an in-process host on `config`.
async fn start(config: &str) -> InProcessHost {
    InProcessHost::start(config)
        .await
        .unwrap_or_else(|e| panic!("the host starts: {e:#}\n{config}"))
}

// ---- 1. de-duplication ----

/// The same envelope delivered twice, one after the other: the state
/// changes once, one output is published, the second is a duplicate.
async fn delivered_twice(store: StoreKind) {
    let s = Scenario::new("state.dedup", store);
    let consumer = Consumer::tally()
        .config("out", &s.out_exchange)
        .line("concurrency = 1");
    let host = start(&s.config(&consumer)).await;
    let envelope = new_envelope();
    s.send_envelope(&envelope, b"first").await;
    settled(&host, &s.queue, "acked", 1).await;
    s.send_envelope(&envelope, b"again").await;
    settled(&host, &s.queue, "acked", 2).await;
    let queue = [("queue", s.queue.as_str())];
    assert_eq!(metric(&host, "acemq_state_duplicates_total", &queue), 1.0);
    assert_eq!(
        metric(
            &host,
            "acemq_state_commits_total",
            &[("namespace", &s.namespace), ("result", "committed")]
        ),
        1.0
    );
    assert_eq!(
        metric(
            &host,
            "acemq_state_operations_total",
            &[("namespace", &s.namespace), ("op", "increment")]
        ),
        1.0,
        "the plugin was called once"
    );
    host.stop().await.unwrap();

    assert_eq!(s.get_text("count").await.as_deref(), Some("1"));
    let outputs = take(&s.out_queue, 2, Duration::from_secs(2)).await;
    assert_eq!(outputs.len(), 1, "one output");
    assert_eq!(outputs[0].body_str(), "1");
    assert_eq!(count_of(&s.dlq()).await, 0);
    assert_eq!(count_of(&s.queue).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_delivery_changes_state_once_embedded() {
    delivered_twice(StoreKind::Embedded).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_delivery_changes_state_once_redis() {
    delivered_twice(StoreKind::Redis).await;
}

// ---- 2. a crash between the outputs' confirm and the commit ----

/// A host killed right after an accept's outputs were confirmed, before
/// its commit and ack: the input is redelivered and handled again; the
/// state changed once, the output was published twice with the same id.
async fn killed_after_the_outputs_confirm(store: StoreKind) {
    let s = Scenario::new("state.crash", store);
    let consumer = Consumer::tally().config("out", &s.out_exchange);
    let config = s.config(&consumer);
    let path = s.write_config("host.toml", &config);
    let options = HostOptions {
        env: vec![("ACEMQ_CRASH_AT".into(), "after-outputs-confirmed".into())],
        ..HostOptions::default()
    };
    let crashing = tokio::task::block_in_place(|| {
        HostProcess::start_with(&path, tempfile::tempdir().unwrap(), &options)
    })
    .unwrap();
    let envelope = s.send(b"once").await;
    let (status, log) =
        tokio::task::block_in_place(|| crashing.wait_with_log(Duration::from_secs(30))).unwrap();
    let log = log.join("\n");
    assert!(!status.success(), "{status}");
    assert!(
        log.contains("ACEMQ_CRASH_AT=after-outputs-confirmed: aborting before the commit"),
        "{log}"
    );
    assert_eq!(
        shared_broker()
            .wait_for_message_count(&s.out_queue, 1, Duration::from_secs(10))
            .await
            .unwrap(),
        1,
        "the output was confirmed before the crash"
    );
    assert_eq!(s.get("count").await, None, "nothing was committed");

    // Again, without the crash point: the input comes back, and is
    // handled (the crashed run's reservation must not stand in its way).
    let host = start(&config).await;
    wait_until(
        Duration::from_secs(60),
        "the redelivered input settled",
        async || {
            host.metrics.consumed_count(&s.queue, "acked")
                + host.metrics.consumed_count(&s.queue, "dead_lettered")
                >= 1
        },
    )
    .await;
    if let [dead] = &take(&s.dlq(), 1, Duration::from_millis(500)).await[..] {
        panic!(
            "the redelivered input was dead-lettered: {}",
            dead.acemq_error()
        );
    }
    assert_eq!(host.metrics.consumed_count(&s.queue, "acked"), 1);
    assert_eq!(
        metric(
            &host,
            "acemq_state_commits_total",
            &[("namespace", &s.namespace), ("result", "committed")]
        ),
        1.0
    );
    host.stop().await.unwrap();

    assert_eq!(s.get_text("count").await.as_deref(), Some("1"));
    let outputs = take(&s.out_queue, 3, Duration::from_secs(2)).await;
    assert_eq!(outputs.len(), 2, "the output of each run");
    assert_eq!(
        output_id(&outputs[0]),
        output_id(&outputs[1]),
        "the same id"
    );
    assert_ne!(output_id(&outputs[0]), envelope.id);
    for output in &outputs {
        assert_eq!(output.body_str(), "1");
        assert_eq!(
            output.string_header("x-acemq-causation").as_deref(),
            Some(envelope.id.as_str())
        );
    }
    assert_eq!(count_of(&s.queue).await, 0);
    assert_eq!(count_of(&s.dlq()).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_between_the_outputs_confirm_and_the_ack_embedded() {
    killed_after_the_outputs_confirm(StoreKind::Embedded).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_between_the_outputs_confirm_and_the_ack_redis() {
    killed_after_the_outputs_confirm(StoreKind::Redis).await;
}

// ---- 3. two hosts on one Redis: claims ----

/// The idempotent consumer both hosts run: one call at a time, one
/// delivery ahead, so a second delivery goes to the idle host.
fn claiming(s: &Scenario) -> Consumer {
    Consumer::tally()
        .config("out", &s.out_exchange)
        .line("idempotent = true")
        .line("prefetch = 1")
        .line("concurrency = 1")
        .line("deadline = \"60s\"")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_taken_by_the_other_host_is_not_handled_twice() {
    let s = Scenario::new("state.claims", StoreKind::Redis);
    let config = s.config(&claiming(&s).config("spin_ms", "3000"));
    let hosts = [start(&config).await, start(&config).await];
    let envelope = new_envelope();
    s.send_envelope(&envelope, b"x").await;
    // Delivered to one host, which claims it and spins for 3 s.
    wait_until(
        Duration::from_secs(10),
        "the first copy delivered",
        async || count_of(&s.queue).await == 0,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.send_envelope(&envelope, b"x").await;
    let queue = [("queue", s.queue.as_str())];
    let waited = |host: &InProcessHost| metric(host, "acemq_state_claims_waited_total", &queue);
    let duplicates = |host: &InProcessHost| metric(host, "acemq_state_duplicates_total", &queue);
    wait_until(
        Duration::from_secs(10),
        "the copy answered in progress",
        async || hosts.iter().map(waited).sum::<f64>() >= 1.0,
    )
    .await;
    // Republished after 5 s, once the holder is done: a duplicate.
    wait_until(Duration::from_secs(30), "the copy found done", async || {
        hosts.iter().map(duplicates).sum::<f64>() >= 1.0
    })
    .await;
    let handled: Vec<bool> = hosts
        .iter()
        .map(|h| {
            metric(
                h,
                "acemq_state_commits_total",
                &[("namespace", &s.namespace), ("result", "committed")],
            ) == 1.0
        })
        .collect();
    assert_eq!(
        handled.iter().filter(|h| **h).count(),
        1,
        "one host handled it"
    );
    let (holder, other) = if handled[0] { (0, 1) } else { (1, 0) };
    assert!(
        waited(&hosts[other]) >= 1.0,
        "the idle host answered in progress"
    );
    assert_eq!(waited(&hosts[holder]), 0.0);
    for host in hosts {
        host.stop().await.unwrap();
    }
    assert_eq!(s.get_text("count").await.as_deref(), Some("1"));
    let outputs = take(&s.out_queue, 2, Duration::from_secs(2)).await;
    assert_eq!(outputs.len(), 1, "one output");
    assert_eq!(count_of(&s.queue).await, 0);
    assert_eq!(count_of(&s.dlq()).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_claim_of_a_killed_host_expires_after_its_lease() {
    let s = Scenario::new("state.lease", StoreKind::Redis);
    let consumer = claiming(&s).line("claim_lease = \"4s\"");
    let slow = s.config(&consumer.clone().config("spin_ms", "30000"));
    let a = tokio::task::block_in_place(|| HostProcess::start(&slow, 1)).unwrap();
    s.send(b"x").await;
    wait_until(
        Duration::from_secs(10),
        "the input delivered to A",
        async || count_of(&s.queue).await == 0,
    )
    .await;
    // A claimed it about now, and spins in its call.
    let claimed = Instant::now();
    let b = start(&s.config(&consumer)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(a); // SIGKILL, in the call: its claim stays until its lease ends.
    settled(&b, &s.queue, "acked", 1).await;
    let after = claimed.elapsed();
    assert!(
        after >= Duration::from_secs(4) && after <= Duration::from_secs(40),
        "handled {after:?} after A's claim"
    );
    let queue = [("queue", s.queue.as_str())];
    assert!(metric(&b, "acemq_state_claims_waited_total", &queue) >= 1.0);
    assert_eq!(metric(&b, "acemq_state_duplicates_total", &queue), 0.0);
    b.stop().await.unwrap();
    assert_eq!(s.get_text("count").await.as_deref(), Some("1"));
    let outputs = take(&s.out_queue, 2, Duration::from_secs(2)).await;
    assert_eq!(outputs.len(), 1, "B's output; A published nothing");
    assert_eq!(count_of(&s.dlq()).await, 0);
}

// ---- 4. TTL expiry: velocity ----

fn order(id: &str, customer: &str) -> Vec<u8> {
    format!(r#"{{"id":"{id}","customer":"{customer}"}}"#).into_bytes()
}

/// Three orders of one customer to a velocity consumer with `limit = 1`
/// and `window = 2s`: the first accepted, the second parked with the limit
/// named, the third accepted once the first has left the window (its key's
/// TTL). `accepted(n)` waits until `n` orders were acked.
async fn one_order_per_window(s: &Scenario, accepted: impl AsyncFn(u64)) {
    s.send(&order("o-1", "c")).await;
    accepted(1).await;
    let first = Instant::now();
    s.send(&order("o-2", "c")).await;
    let parked = take(&s.parked(), 1, Duration::from_secs(30)).await;
    assert_eq!(parked.len(), 1, "order 2 parked");
    let reason = parked[0].acemq_error();
    assert!(
        reason.contains("customer c placed 1 orders within 2s (limit 1)"),
        "{reason}"
    );
    tokio::time::sleep(
        (first + Duration::from_millis(2500)).saturating_duration_since(Instant::now()),
    )
    .await;
    s.send(&order("o-3", "c")).await;
    accepted(2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn velocity_parks_past_its_limit_until_the_window_passes() {
    let s = Scenario::new("state.velocity", StoreKind::Embedded);
    let consumer = Consumer::new("velocity")
        .config("limit", "1")
        .config("window", "2s")
        .line("concurrency = 1");
    let host = start(&s.config(&consumer)).await;
    one_order_per_window(&s, async |n| settled(&host, &s.queue, "acked", n).await).await;
    assert_eq!(host.metrics.consumed_count(&s.queue, "parked"), 1);
    host.stop().await.unwrap();
    let placed: Vec<u64> =
        serde_json::from_slice(&s.get("customer/c").await.expect("order 3's list")).unwrap();
    assert_eq!(placed.len(), 1, "only order 3: {placed:?}");
    assert_eq!(count_of(&s.parked()).await, 0);
    assert_eq!(count_of(&s.dlq()).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn velocity_py_parks_past_its_limit_until_the_window_passes() {
    let s = Scenario::new("state.velocity-py", StoreKind::Embedded);
    let admin = free_admin_address();
    let consumer = Consumer::new("velocity-py")
        .config("limit", "1")
        .config("window", "2s")
        .line("concurrency = 1")
        .line("deadline = \"10s\"");
    let path = s.write_config("host.toml", &s.config_with(&consumer, Some(&admin)));
    let options = HostOptions {
        // The Python interpreter takes a while to compile.
        start_within: Duration::from_secs(240),
        ..HostOptions::default()
    };
    let host = tokio::task::block_in_place(|| {
        HostProcess::start_with(&path, tempfile::tempdir().unwrap(), &options)
    })
    .unwrap();
    let acked = || {
        let text = tokio::task::block_in_place(|| scrape(&admin)).unwrap();
        metric_sum(
            &text,
            "acemq_consume_total",
            &[("queue", &s.queue), ("outcome", "acked")],
        )
    };
    one_order_per_window(&s, async |n| {
        wait_until(Duration::from_secs(60), "orders accepted", async || {
            acked() >= n as f64
        })
        .await
    })
    .await;
    tokio::task::block_in_place(|| host.terminate(Duration::from_secs(30))).unwrap();
    assert_eq!(count_of(&s.dlq()).await, 0);
    assert_eq!(count_of(&s.queue).await, 0);
}

// ---- 5. quotas ----

/// `tally` with one key per message and the namespace's quota `quota` (a
/// `[state.namespaces.NS]` key), one message at a time.
async fn over_quota(store: StoreKind, quota: &str, body: &[u8], named: &str) {
    let s = Scenario::new("state.quota", store);
    let consumer = Consumer::tally()
        .config("per_message", "true")
        .line("concurrency = 1")
        .table(format!("[state.namespaces.\"{}\"]\n{quota}", s.namespace));
    let host = start(&s.config(&consumer)).await;
    let first = s.send(body).await;
    settled(&host, &s.queue, "acked", 1).await;
    s.send(body).await;
    settled(&host, &s.queue, "acked", 2).await;
    let third = s.send(body).await;
    let dead = take(&s.dlq(), 1, Duration::from_secs(20)).await;
    assert_eq!(dead.len(), 1, "the third input dead-lettered");
    assert_eq!(dead[0].message_id.as_deref(), Some(third.id.as_str()));
    let reason = dead[0].acemq_error();
    assert!(reason.contains(named), "{reason}");
    assert!(reason.contains(&s.namespace), "{reason}");
    settled(&host, &s.queue, "dead_lettered", 1).await;
    assert!(
        metric(
            &host,
            "acemq_state_commits_total",
            &[("namespace", &s.namespace), ("result", "quota")]
        ) >= 1.0
    );
    host.stop().await.unwrap();
    assert_eq!(s.get_text("count").await.as_deref(), Some("2"));
    assert_eq!(
        s.get(&format!("m/{}", first.id)).await.as_deref(),
        Some(body)
    );
    assert_eq!(s.get(&format!("m/{}", third.id)).await, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_commit_past_max_keys_dead_letters_the_input_embedded() {
    over_quota(StoreKind::Embedded, "max_keys = 3", b"x", "(max_keys)").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_commit_past_max_keys_dead_letters_the_input_redis() {
    over_quota(StoreKind::Redis, "max_keys = 3", b"x", "(max_keys)").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_commit_past_max_bytes_dead_letters_the_input() {
    // Each input adds a key of 38 bytes and a value of 200 (and the first
    // the counter, 6): 244, 482, then 720, past 600.
    over_quota(
        StoreKind::Embedded,
        "max_bytes = 600",
        &[b'b'; 200],
        "(max_bytes)",
    )
    .await;
}

// ---- 6. conflicts re-run the call ----

async fn concurrent_increments(store: StoreKind) {
    let s = Scenario::new("state.conflicts", store);
    let consumer = Consumer::tally()
        .config("spin_ms", "50")
        .line("concurrency = 4")
        .line("prefetch = 20")
        .retry("kind = \"fixed\"\nattempts = 20\ninitial = \"100ms\"");
    let host = start(&s.config(&consumer)).await;
    for i in 0..20 {
        s.send(format!("m-{i}").as_bytes()).await;
    }
    settled(&host, &s.queue, "acked", 20).await;
    let reruns = metric(
        &host,
        "acemq_state_reruns_total",
        &[("queue", s.queue.as_str())],
    );
    assert!(reruns > 0.0, "no conflict happened");
    assert_eq!(
        metric(
            &host,
            "acemq_state_commits_total",
            &[("namespace", &s.namespace), ("result", "committed")]
        ),
        20.0
    );
    host.stop().await.unwrap();
    assert_eq!(
        s.get_text("count").await.as_deref(),
        Some("20"),
        "no lost update"
    );
    assert_eq!(count_of(&s.dlq()).await, 0);
    assert_eq!(count_of(&s.queue).await, 0);
    eprintln!("{store:?}: {reruns} reruns");
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_increments_conflict_and_run_again_embedded() {
    concurrent_increments(StoreKind::Embedded).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_increments_conflict_and_run_again_redis() {
    concurrent_increments(StoreKind::Redis).await;
}

// ---- 7. the embedded store after kill -9 ----

#[tokio::test(flavor = "multi_thread")]
async fn the_embedded_store_survives_a_kill_and_its_lock_does_not_stop_a_restart() {
    let s = Scenario::new("state.kill", StoreKind::Embedded);
    let admin = free_admin_address();
    let path = s.write_config(
        "host.toml",
        &s.config_with(&Consumer::tally(), Some(&admin)),
    );
    let run = || {
        tokio::task::block_in_place(|| {
            HostProcess::start_with(&path, tempfile::tempdir().unwrap(), &HostOptions::default())
        })
        .unwrap()
    };
    let acked = || {
        let text = tokio::task::block_in_place(|| scrape(&admin)).unwrap();
        metric_sum(
            &text,
            "acemq_consume_total",
            &[("queue", &s.queue), ("outcome", "acked")],
        )
    };
    let host = run();
    for i in 0..10 {
        s.send(format!("m-{i}").as_bytes()).await;
    }
    wait_until(Duration::from_secs(30), "10 inputs acked", async || {
        acked() >= 10.0
    })
    .await;
    drop(host); // SIGKILL
    assert!(
        s.dir().join("state.redb.lock").exists(),
        "the lock file stays behind"
    );
    assert_eq!(s.get_text("count").await.as_deref(), Some("10"));

    let host = run();
    for i in 10..15 {
        s.send(format!("m-{i}").as_bytes()).await;
    }
    wait_until(Duration::from_secs(30), "5 more inputs acked", async || {
        acked() >= 5.0
    })
    .await;
    tokio::task::block_in_place(|| host.terminate(Duration::from_secs(30))).unwrap();
    // As an operator reads it.
    let read = std::process::Command::new(host_binary())
        .args(["state", "get", "--config"])
        .arg(&path)
        .args(["--namespace", &s.namespace, "count"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&read.stdout);
    assert!(
        read.status.success(),
        "{}\n{stdout}\n{}",
        read.status,
        String::from_utf8_lossy(&read.stderr)
    );
    assert_eq!(stdout.lines().last().map(str::trim), Some("15"), "{stdout}");
    assert_eq!(s.get_text("count").await.as_deref(), Some("15"));
    assert_eq!(count_of(&s.queue).await, 0);
}

// ---- 8. a retried input leaves no write ----

#[tokio::test(flavor = "multi_thread")]
async fn a_retried_attempt_commits_nothing() {
    let s = Scenario::new("state.retried", StoreKind::Embedded);
    let consumer = Consumer::tally()
        .config("fail_first", "true")
        .config("out", &s.out_exchange)
        .retry("kind = \"fixed\"\nattempts = 3\ninitial = \"300ms\"");
    let host = start(&s.config(&consumer)).await;
    s.send(b"x").await;
    settled(&host, &s.queue, "acked", 1).await;
    settled(&host, &s.queue, "retried", 1).await;
    assert_eq!(
        metric(
            &host,
            "acemq_state_operations_total",
            &[("namespace", &s.namespace), ("op", "increment")]
        ),
        2.0,
        "called twice"
    );
    host.stop().await.unwrap();
    assert_eq!(s.get_text("count").await.as_deref(), Some("1"));
    let outputs = take(&s.out_queue, 2, Duration::from_secs(2)).await;
    assert_eq!(outputs.len(), 1, "only the accepted attempt's output");
    assert_eq!(outputs[0].body_str(), "1");
    assert_eq!(count_of(&s.dlq()).await, 0);
}

// ---- 9. a consumer without state ----

#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_without_state_fails_its_state_calls() {
    let s = Scenario::new("state.none", StoreKind::Embedded);
    let host = start(&s.config(&Consumer::tally().without_state())).await;
    s.send(b"x").await;
    let dead = take(&s.dlq(), 1, Duration::from_secs(20)).await;
    assert_eq!(dead.len(), 1, "dead-lettered");
    let reason = dead[0].acemq_error();
    assert!(
        reason.contains("this consumer has no state store"),
        "{reason}"
    );
    assert!(reason.contains("increment of key `count`"), "{reason}");
    host.stop().await.unwrap();
    assert!(!s.store_file().exists(), "no store was opened");
}
