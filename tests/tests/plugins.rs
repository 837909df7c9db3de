//! Untrusted plugins against a real broker: each fault costs one failed
//! delivery with a reason that names it, never the host, while healthy
//! messages on the same consumer keep flowing; and codec plugins decode
//! before the handler and park what they cannot read.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use acemq_host::envelope::{self, Envelope};
use acemq_host::plugin::{
    CacheChoice, CodecSet, CodecVersion, CompiledPlugin, ConsumerContext, Conversion,
    EngineSettings, FaultKind, HandlerVersion, Input, Limits, Outcome, PluginEngine,
};
use acemq_tests::host::{
    HostProcess, InProcessHost, cache_entry, free_port, http_get, metric_sum, plugin_path,
};
use acemq_tests::{shared_broker, unique_name};
use lapin::BasicProperties;

#[tokio::test(flavor = "multi_thread")]
async fn each_fault_is_named_and_healthy_messages_keep_flowing() {
    let broker = shared_broker();
    let queue = unique_name("faults");
    let out = unique_name("faults.out");
    let out_queue = unique_name("faults.healthy");
    let config = format!(
        r#"
[broker]
url = "{url}"

[host]
fuel_metering = true

[[exchanges]]
name = "{out}"
kind = "direct"

[[queues]]
name = "{queue}"

[[queues]]
name = "{out_queue}"

[[bindings]]
queue = "{out_queue}"
exchange = "{out}"
routing_key = "healthy"

[retry.twice]
kind = "fixed"
attempts = 2
initial = "1s"

[[consumers]]
queue = "{queue}"
plugin = "{plugin}"
retry = "twice"
publish_to = ["{out}"]
deadline = "500ms"
max_memory_bytes = 16777216

[consumers.config]
out_exchange = "{out}"
"#,
        url = broker.amqp_url(),
        plugin = plugin_path("faults").display(),
    );
    let host = InProcessHost::start(&config).await.unwrap();

    let faults = ["trap", "panic", "loop", "oom", "recurse", "forbidden"];
    let mut healthy = 0;
    for (i, fault) in faults.iter().enumerate() {
        for body in [
            format!("healthy {i}a"),
            fault.to_string(),
            format!("healthy {i}b"),
        ] {
            healthy += usize::from(body.starts_with("healthy"));
            let properties = BasicProperties::default()
                .with_content_type("text/plain".into())
                .with_message_id(body.replace(' ', "-").into());
            broker
                .publish("", &queue, body.as_bytes(), properties)
                .await
                .unwrap();
        }
    }

    let outputs = broker
        .drain(&out_queue, healthy, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outputs.len(), healthy, "healthy messages stopped flowing");
    // Every fault but the configuration one climbs the retry ladder to the
    // dead-letter queue; a publish outside publish_to is parked at once.
    let dlq = format!("{queue}.dlq");
    let retried_faults = faults.len() - 1;
    let dead = broker
        .drain(&dlq, retried_faults, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(dead.len(), retried_faults);
    let reasons: BTreeMap<String, String> = dead
        .iter()
        .map(|m| (m.body_str().into_owned(), m.acemq_error()))
        .collect();
    let expected = [
        (
            "trap",
            "exhausted 2 attempts: trap: wasm `unreachable` instruction executed",
        ),
        (
            "panic",
            "exhausted 2 attempts: panic: boom: the faults plugin was asked to panic",
        ),
        ("loop", "exhausted 2 attempts: deadline of 500ms exceeded"),
        (
            "oom",
            "exhausted 2 attempts: out of memory: the plugin asked for",
        ),
        ("recurse", "exhausted 2 attempts: stack overflow"),
    ];
    for (fault, prefix) in expected {
        let reason = &reasons[fault];
        assert!(reason.starts_with(prefix), "{fault}: {reason}");
    }
    let parked = broker
        .drain(&format!("{queue}.parked"), 1, Duration::from_secs(60))
        .await
        .unwrap();
    let [forbidden] = &parked[..] else {
        panic!("one parked message expected, got {}", parked.len())
    };
    assert_eq!(forbidden.body_str(), "forbidden");
    let reason = forbidden.acemq_error();
    assert!(
        reason.starts_with("its plugin published outside the consumer's publish_to: ")
            && reason.contains("publishing to exchange 'forbidden.exchange' is not allowed"),
        "{reason}"
    );
    let read = Envelope::read(
        &forbidden
            .properties
            .clone()
            .with_headers(forbidden.headers.clone()),
        "",
        0,
    );
    assert_eq!(read.attempt, 1, "parked at once, without a retry");
    assert_eq!(broker.message_count(&queue).await.unwrap(), 0);
    // Every fault was counted by kind, and the host is still consuming.
    let rendered = host.metrics.render();
    for kind in [
        "trap",
        "panic",
        "deadline",
        "out_of_memory",
        "stack_overflow",
    ] {
        assert!(
            rendered.contains(&format!(
                "acemq_plugin_faults_total{{queue=\"{queue}\",fault=\"{kind}\"}} 2"
            )),
            "{kind} not counted twice:\n{rendered}"
        );
    }
    // Fuel metering is on: the healthy calls' fuel was counted.
    let fuel_line = rendered
        .lines()
        .find(|l| l.starts_with(&format!("acemq_plugin_fuel_total{{queue=\"{queue}\"}}")))
        .unwrap_or_else(|| panic!("no fuel counted:\n{rendered}"));
    let fuel: u64 = fuel_line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(fuel > 0, "{fuel_line}");
    host.stop().await.unwrap();
}

/// A message lent to a handler is the handler's for its own call only: a
/// plugin that keeps it and reads it during a later call traps, and that
/// call fails with a reason that says so; the next message is served by a
/// fresh instance and reads its own message.
#[test]
fn a_message_read_after_its_call_returned_traps_with_a_reason() {
    let engine = PluginEngine::new(EngineSettings::default()).unwrap();
    let context = ConsumerContext {
        queue: "lent".into(),
        config: BTreeMap::from([("out_exchange".to_string(), "out".to_string())]),
        publish_to: BTreeSet::from(["out".to_string()]),
        ..ConsumerContext::default()
    };
    let faults = HandlerVersion::load(&engine, &plugin_path("faults"), Arc::new(context)).unwrap();
    let input = |body: &str| Input {
        envelope: Arc::new(Envelope::new("test", envelope::default_origin(), 0)),
        properties: Arc::new(BasicProperties::default().with_content_type("text/plain".into())),
        exchange: String::new(),
        routing_key: "lent".into(),
        redelivered: false,
        stream_offset: None,
        decoded_content_type: None,
        headers: vec![("tenant".into(), envelope::HeaderValue::Text("acme".into()))],
        body: body.as_bytes().to_vec().into(),
        trace_id: None,
    };

    // Pooled, one call at a time: both calls meet the same instance.
    let kept = block_on(faults.invoke(input("stale")));
    assert!(
        matches!(&kept.result, Ok(Outcome::Retry(why)) if why.starts_with("kept this message")),
        "{kept:?}"
    );
    let stale = block_on(faults.invoke(input("stale")));
    let fault = stale.result.unwrap_err();
    assert_eq!(fault.kind, FaultKind::Trap, "{fault}");
    assert_eq!(
        fault.reason,
        "trap: the plugin used a message after the handle call it was given to returned"
    );
    assert_eq!(
        faults.idle_instances(),
        0,
        "the trapped instance was reused"
    );

    let healthy = block_on(faults.invoke(input("hello")));
    assert_eq!(healthy.result, Ok(Outcome::Accept));
    let [output] = &healthy.outputs[..] else {
        panic!("one output expected: {:?}", healthy.outputs)
    };
    assert_eq!(output.body, b"hello");
    assert_eq!(output.content_type.as_deref(), Some("text/plain"));
    assert_eq!(
        output.headers,
        [(
            "tenant".to_string(),
            envelope::HeaderValue::Text("acme".into())
        )]
    );
}

/// What the stamp plugin compiled as `compiled` stamps on its output:
/// `"v1"` or `"v2"`, whatever its hash says.
fn stamped_version(engine: &PluginEngine, compiled: CompiledPlugin) -> String {
    let context = ConsumerContext {
        queue: "stamp".into(),
        config: BTreeMap::from([("out_exchange".to_string(), "out".to_string())]),
        publish_to: BTreeSet::from(["out".to_string()]),
        ..ConsumerContext::default()
    };
    let version = HandlerVersion::from_compiled(engine, compiled, Arc::new(context)).unwrap();
    let done = block_on(version.invoke(Input {
        envelope: Arc::new(Envelope::new("test", envelope::default_origin(), 0)),
        properties: Arc::new(BasicProperties::default().with_content_type("text/plain".into())),
        exchange: String::new(),
        routing_key: "stamp".into(),
        redelivered: false,
        stream_offset: None,
        decoded_content_type: None,
        headers: Vec::new(),
        body: b"hello".to_vec().into(),
        trace_id: None,
    }));
    assert_eq!(done.result, Ok(Outcome::Accept));
    let stamped: serde_json::Value = serde_json::from_slice(&done.outputs[0].body).unwrap();
    stamped["version"].as_str().unwrap().to_string()
}

/// Plugin A's compiled entry copied over plugin B's (B's file name kept)
/// must not run as B: the entry's MAC binds it to A's source, so loading B
/// refuses it, compiles B from its source and overwrites the entry. Whether
/// B comes at start (compile_file) or by hot swap (compile_bytes), and
/// whether the planted entry carries A's MAC or none (as hosts before the
/// MAC wrote them), B runs as B under B's hash.
#[test]
fn another_plugins_cache_entry_is_refused_and_the_plugin_compiled_from_its_source() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let engine = || {
        PluginEngine::new(EngineSettings {
            cache: CacheChoice::Folder(cache.clone()),
            ..EngineSettings::default()
        })
        .unwrap()
    };
    let host = engine();
    let (a_path, b_path) = (plugin_path("stamp-v1"), plugin_path("stamp-v2"));
    let a = host.compile_file(&a_path).unwrap();
    let b = host.compile_file(&b_path).unwrap();
    assert!(!a.from_cache && !b.from_cache);
    assert_ne!(a.sha256, b.sha256);
    // The cache works: a restart (a new engine, the same key) takes B from it.
    let restarted = engine();
    let b_again = restarted.compile_file(&b_path).unwrap();
    assert!(b_again.from_cache, "a sealed entry was not used");
    assert_eq!(stamped_version(&restarted, b_again), "v2");

    let (a_entry, b_entry) = (
        cache_entry(&cache, &a.sha256),
        cache_entry(&cache, &b.sha256),
    );
    let b_bytes = std::fs::read(&b_path).unwrap();
    let a_unsealed = a.component.serialize().unwrap();
    type Load<'a> = Box<dyn Fn(&PluginEngine) -> CompiledPlugin + 'a>;
    let loads: [(&str, Load); 2] = [
        ("at start", Box::new(|e| e.compile_file(&b_path).unwrap())),
        (
            "by hot swap",
            Box::new(|e| e.compile_bytes(&b_path, &b_bytes).unwrap()),
        ),
    ];
    for (how, load) in &loads {
        for (planted, bytes) in [
            ("A's sealed entry", std::fs::read(&a_entry).unwrap()),
            ("A's code without a MAC", a_unsealed.clone()),
        ] {
            std::fs::write(&b_entry, &bytes).unwrap();
            let host = engine();
            let loaded = load(&host);
            assert!(
                !loaded.from_cache,
                "{how}, {planted}: the planted entry was used"
            );
            assert_eq!(loaded.sha256, b.sha256, "{how}, {planted}");
            assert_eq!(
                stamped_version(&host, loaded),
                "v2",
                "{how}, {planted}: ran A's code"
            );
            // The entry was overwritten with B's own, sealed: used next time.
            let next = load(&host);
            assert!(
                next.from_cache,
                "{how}, {planted}: the entry was not rewritten"
            );
            assert_eq!(stamped_version(&host, next), "v2", "{how}, {planted}");
        }
    }
}

fn msgpack_codec() -> CodecSet {
    let engine = PluginEngine::new(EngineSettings::default()).unwrap();
    let codec =
        CodecVersion::load(&engine, &plugin_path("msgpack-codec"), Limits::default()).unwrap();
    let mut set = CodecSet::new();
    set.add(&["application/msgpack".to_string()], codec);
    set
}

#[test]
fn the_msgpack_codec_round_trips_and_refuses_garbage_by_name() {
    let codecs = msgpack_codec();
    let json = br#"{"id":"o-1","customer":"ada","total":12.5}"#;
    let Conversion::Converted {
        content_type,
        body: packed,
    } = block_on(codecs.encode(Some("application/msgpack"), json))
    else {
        panic!("encode refused");
    };
    assert_eq!(content_type, "application/msgpack");
    assert_ne!(packed.as_slice(), json.as_slice());
    let Conversion::Converted { content_type, body } =
        block_on(codecs.decode(Some("application/msgpack"), &packed))
    else {
        panic!("decode refused");
    };
    assert_eq!(content_type, "application/json");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
        serde_json::from_slice::<serde_json::Value>(json).unwrap()
    );
    assert_eq!(
        block_on(codecs.decode(Some("text/plain"), b"hi")),
        Conversion::Unclaimed
    );
    let Conversion::Refused(why) = block_on(codecs.decode(Some("application/msgpack"), &[0xc1]))
    else {
        panic!("garbage was decoded");
    };
    assert!(
        why.starts_with("msgpack-codec: not valid MessagePack"),
        "{why}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_codec_decodes_before_the_handler_and_undecodable_bodies_are_parked() {
    let broker = shared_broker();
    let orders = unique_name("codec.orders");
    let events = unique_name("codec.events");
    let events_queue = unique_name("codec.accepted");
    let config = format!(
        r#"
[broker]
url = "{url}"

[[exchanges]]
name = "{events}"
kind = "topic"

[[queues]]
name = "{orders}"
dead_letter = true

[[queues]]
name = "{events_queue}"

[[bindings]]
queue = "{events_queue}"
exchange = "{events}"
routing_key = "order.accepted"

[[codecs]]
plugin = "{codec}"
content_types = ["application/msgpack"]

[[consumers]]
queue = "{orders}"
plugin = "{router}"
publish_to = ["{events}"]

[consumers.config]
events_exchange = "{events}"
"#,
        url = broker.amqp_url(),
        codec = plugin_path("msgpack-codec").display(),
        router = plugin_path("order-router").display(),
    );
    let host = InProcessHost::start(&config).await.unwrap();
    let Conversion::Converted { body: packed, .. } = msgpack_codec()
        .encode(
            Some("application/msgpack"),
            br#"{"id":"m-1","customer":"ada","total":3}"#,
        )
        .await
    else {
        panic!("encode refused");
    };
    let msgpack = BasicProperties::default().with_content_type("application/msgpack".into());
    broker
        .publish("", &orders, &packed, msgpack.clone())
        .await
        .unwrap();
    broker
        .publish("", &orders, b"\xc1 not msgpack", msgpack)
        .await
        .unwrap();

    let accepted = broker
        .drain(&events_queue, 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(accepted.len(), 1);
    let event: serde_json::Value = serde_json::from_slice(&accepted[0].body).unwrap();
    assert_eq!(event["id"], "m-1");

    let parked = broker
        .drain(&format!("{orders}.parked"), 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].body.as_slice(), b"\xc1 not msgpack".as_slice());
    let reason = parked[0].acemq_error();
    assert!(
        reason.starts_with("could not be decoded: msgpack-codec: not valid MessagePack"),
        "{reason}"
    );
    host.stop().await.unwrap();
}

/// A handler that spins until its deadline holds no runtime worker: plugin
/// calls yield between epoch ticks, so while a consumer's every call spins
/// (as many at once as the host has cores), another consumer keeps
/// consuming, the admin endpoint answers and the connection stays up.
#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_spinning_to_its_deadline_holds_back_no_other_consumer() {
    let broker = shared_broker();
    let spin = unique_name("spin.in");
    let flow = unique_name("spin.flow");
    let admin = format!("127.0.0.1:{}", free_port());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let config = format!(
        r#"
[broker]
url = "{url}"

[host]
admin_listen = "{admin}"

[[queues]]
name = "{spin}"

[[queues]]
name = "{flow}"

[[consumers]]
queue = "{spin}"
plugin = "{faults}"
deadline = "2s"
concurrency = {cores}

[[consumers]]
queue = "{flow}"
plugin = "{echo}"
"#,
        url = broker.amqp_url(),
        faults = plugin_path("faults").display(),
        echo = plugin_path("echo").display(),
    );
    let host = HostProcess::start(&config, 2).unwrap();
    // Four rounds of spinners on every core: at least 8 s of spinning.
    let spinners = 4 * cores;
    broker
        .publish_many("", &spin, (0..spinners).map(|_| ("loop", text())))
        .await
        .unwrap();
    let metrics = format!("http://{admin}/metrics");
    let count = |outcome: &str, queue: &str| {
        let (_, text) = http_get(&metrics).expect("/metrics answers");
        metric_sum(
            &text,
            "acemq_consume_total",
            &[("queue", queue), ("outcome", outcome)],
        )
    };
    // Spinning on every core before the other consumer's messages arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let flowing = 1000;
    broker
        .publish_many("", &flow, (0..flowing).map(|i| (format!("m{i}"), text())))
        .await
        .unwrap();
    let settled_spinners = tokio::task::block_in_place(|| {
        loop {
            let (status, health) =
                http_get(&format!("http://{admin}/health")).expect("/health answers");
            assert_eq!(status, 200, "{health}");
            if count("acked", &flow) as usize == flowing {
                break count("dead_lettered", &spin) as usize;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    assert!(
        settled_spinners < spinners,
        "the other consumer finished only after every spinner: {settled_spinners} of {spinners} were settled"
    );
    // Each spinner ends at its deadline, and nothing was lost meanwhile.
    let dead = broker
        .drain(&format!("{spin}.dlq"), spinners, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(dead.len(), spinners);
    for message in &dead {
        let reason = message.acemq_error();
        assert!(reason.contains("deadline of 2s exceeded"), "{reason}");
    }
    let (_, text) = tokio::task::block_in_place(|| http_get(&metrics)).unwrap();
    assert_eq!(
        metric_sum(&text, "acemq_connection_recoveries_total", &[]),
        0.0,
        "a connection was lost while plugins spun:\n{text}"
    );
    host.terminate(Duration::from_secs(30)).unwrap();
}

fn text() -> BasicProperties {
    BasicProperties::default().with_content_type("text/plain".into())
}

/// Drives a plugin call as the host does: on a tokio runtime with timers
/// (a call's deadline is a tokio timer as well as the epoch check).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(future)
}

/// A host running the `sleeper` plugin on `queue` (dead-lettering), one
/// call at a time, with `consumer` as more lines of its `[[consumers]]`.
fn sleeper_host(queue: &str, consumer: &str) -> HostProcess {
    let config = format!(
        "[broker]\nurl = \"{url}\"\n\n[[queues]]\nname = \"{queue}\"\ndead_letter = true\n\n[[consumers]]\nqueue = \"{queue}\"\nplugin = \"{plugin}\"\nconcurrency = 1\n{consumer}\n",
        url = shared_broker().amqp_url(),
        plugin = plugin_path("sleeper").display(),
    );
    HostProcess::start(&config, 1).unwrap()
}

/// A call that waits inside the host (a WASI sleep: no wasm runs, so the
/// epoch check never comes) is cut at its deadline by the host's own timer:
/// its message is dead-lettered naming the deadline, and the message behind
/// it (one call at a time) is handled. Before, the sleep held the call, its
/// slot and the message for its full length (here a minute).
#[tokio::test(flavor = "multi_thread")]
async fn a_call_sleeping_inside_the_host_is_cut_at_its_deadline_and_the_next_message_is_handled() {
    let broker = shared_broker();
    let queue = unique_name("sleeper.call");
    let host = sleeper_host(&queue, "deadline = \"1s\"");
    let started = std::time::Instant::now();
    broker
        .publish_many(
            "",
            &queue,
            ["sleep:60000", "accept", "accept"].map(|b| (b, text())),
        )
        .await
        .unwrap();
    let failed = broker
        .drain(&format!("{queue}.dlq"), 1, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(failed.len(), 1, "the sleeping call was not cut");
    assert_eq!(failed[0].body.as_slice(), b"sleep:60000".as_slice());
    let reason = failed[0].acemq_error();
    assert_eq!(
        reason,
        "exhausted 1 attempt: deadline of 1s exceeded while the plugin waited inside the host (a WASI sleep or poll)"
    );
    broker
        .wait_for_message_count(&queue, 0, Duration::from_secs(20))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "{took:?}");
    let (status, log) = host.terminate_with_log(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
    assert!(
        log.iter().any(|line| line.contains("handler failed")
            && line
                .contains("fault=deadline of 1s exceeded while the plugin waited inside the host")),
        "{log:#?}"
    );
}

/// A plugin's log text holding a newline and a forged host line (and a
/// terminal escape) stays inside its own log line in the host's text log:
/// the control characters are escaped, no line of the log is the forgery.
#[tokio::test(flavor = "multi_thread")]
async fn a_plugins_log_text_cannot_forge_a_host_log_line() {
    let broker = shared_broker();
    let queue = unique_name("sleeper.log");
    let mut host = sleeper_host(&queue, "");
    let forged = "2026-12-01T00:00:00.000000Z  INFO acemq_host::app: forged by a plugin";
    let body = format!("log:hello\n{forged}\r\n\u{1b}[31mred");
    broker
        .publish("", &queue, body.as_bytes(), text())
        .await
        .unwrap();
    host.wait_for_log("forged by a plugin", 1, Duration::from_secs(20))
        .unwrap();
    let (status, log) = host.terminate_with_log(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
    let logged: Vec<&String> = log
        .iter()
        .filter(|line| line.contains("forged by a plugin"))
        .collect();
    assert_eq!(logged.len(), 1, "{log:#?}");
    // The escape character itself tracing-subscriber already writes as
    // `\x1b`; line ends it did not.
    assert!(
        logged[0].contains(&format!("hello\\n{forged}\\r\\n")),
        "{}",
        logged[0]
    );
    assert!(logged[0].contains(&queue), "{}", logged[0]);
    assert!(
        log.iter()
            .all(|line| !line.starts_with("2026-12-01T00:00:00") && !line.contains('\u{1b}')),
        "{log:#?}"
    );
}

/// `replay --compare` decodes with the config's codecs, as production
/// does: MessagePack orders reach the order router as the JSON it reads,
/// and it accepts every one. Without the codecs it saw the MessagePack
/// bytes, which production never shows it, and rejected them all.
#[tokio::test(flavor = "multi_thread")]
async fn shadow_replay_decodes_with_the_configured_codecs_as_production_does() {
    const ORDERS: usize = 20;
    let broker = shared_broker();
    let stream = unique_name("replay.codec");
    let events = unique_name("replay.codec.events");
    let consumer = format!("projection-{stream}");
    broker.declare_queue(&stream, "stream", &[]).await.unwrap();
    let codecs = msgpack_codec();
    let mut orders = Vec::new();
    for n in 0..ORDERS {
        let json = format!(r#"{{"id":"o-{n}","customer":"acme","total":{n}.5}}"#);
        let Conversion::Converted { body, .. } = codecs
            .encode(Some("application/msgpack"), json.as_bytes())
            .await
        else {
            panic!("encode refused");
        };
        orders.push((
            body,
            BasicProperties::default().with_content_type("application/msgpack".into()),
        ));
    }
    broker.publish_many("", &stream, orders).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("host.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[broker]
url = "{url}"

[[exchanges]]
name = "{events}"
kind = "topic"

[[queues]]
name = "{stream}"
type = "stream"

[[codecs]]
plugin = "{codec}"
content_types = ["application/msgpack"]

[[consumers]]
queue = "{stream}"
consumer_name = "{consumer}"
checkpoint = "none"
plugin = "{router}"
publish_to = ["{events}"]

[consumers.config]
events_exchange = "{events}"
"#,
            url = broker.amqp_url(),
            codec = plugin_path("msgpack-codec").display(),
            router = plugin_path("order-router").display(),
        ),
    )
    .unwrap();
    let output = tokio::task::block_in_place(|| {
        std::process::Command::new(acemq_tests::host::host_binary())
            .args(["replay", "--consumer", &consumer, "--compare", "--config"])
            .arg(&config)
            // The router stamps the time it routed at: outputs differ by it.
            .args(["--max-diff", &ORDERS.to_string()])
            .arg("--plugin")
            .arg(plugin_path("order-router"))
            .env_remove("ACEMQ_URL")
            .output()
            .unwrap()
    });
    let table = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{table}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        table.contains(&format!("messages read: {ORDERS}")),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|line| line == format!("{:<24} {:>10} {:>10}", "accept", ORDERS, ORDERS)),
        "every order accepted by both versions: {table}"
    );
    assert!(!table.contains("reject"), "{table}");
    assert!(
        table.contains("candidate, median time per message: "),
        "{table}"
    );
    broker.delete_queue(&stream).await.unwrap();
}
