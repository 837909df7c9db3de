//! Plugins written in Python and JavaScript, on the real broker: they
//! decide as the Rust one does, and the locked-down WASI they run on denies
//! files, environment and sockets while their `print` reaches the host log.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use acemq_tests::host::{HostProcess, free_port, http_get, metric_sum, plugin_path};
use acemq_tests::{ReceivedMessage, shared_broker, unique_name};
use lapin::BasicProperties;

/// Loading a Python or JavaScript component compiles megabytes of
/// interpreter: give the host time to start.
const START: Duration = Duration::from_secs(240);

fn json() -> BasicProperties {
    BasicProperties::default().with_content_type("application/json".into())
}

/// One consumer's part of a config: `queue` (dead-lettering) run by
/// `plugin`, its outputs through the direct exchange `exchange` (key
/// `order.accepted`) into `sink`.
fn router(queue: &str, plugin: &str, exchange: &str, sink: &str) -> String {
    format!(
        r#"
[[exchanges]]
name = "{exchange}"
kind = "direct"

[[queues]]
name = "{queue}"
dead_letter = true

[[queues]]
name = "{sink}"

[[bindings]]
queue = "{sink}"
exchange = "{exchange}"
routing_key = "order.accepted"

[[consumers]]
queue = "{queue}"
plugin = "{plugin}"
publish_to = ["{exchange}"]

[consumers.config]
events_exchange = "{exchange}"
"#,
        plugin = plugin_path(plugin).display(),
    )
}

/// What one router made of the inputs: each event published (without the
/// time it was routed at), and each set-aside reason, both sorted.
#[derive(Debug, PartialEq)]
struct Decisions {
    events: Vec<String>,
    reasons: Vec<String>,
}

/// A host running `sandbox-probe-py` on `queue` (dead-lettering), with
/// `consumer` as more lines of its `[[consumers]]` entry.
fn probe_host(queue: &str, consumer: &str) -> HostProcess {
    let config = format!(
        "[broker]\nurl = \"{url}\"\n\n[[queues]]\nname = \"{queue}\"\ndead_letter = true\n\n[[consumers]]\nqueue = \"{queue}\"\nplugin = \"{plugin}\"\n{consumer}\n",
        url = shared_broker().amqp_url(),
        plugin = plugin_path("sandbox-probe-py").display(),
    );
    HostProcess::start_within(&config, 1, START).unwrap()
}

fn without_routed_at(message: &ReceivedMessage) -> String {
    let mut event: serde_json::Value = serde_json::from_slice(&message.body).unwrap();
    assert!(event["routed_at_ms"].as_u64().is_some(), "{event}");
    event.as_object_mut().unwrap().remove("routed_at_ms");
    event.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_and_javascript_routers_decide_as_the_rust_one() {
    let broker = shared_broker();
    let inputs: [&[u8]; 6] = [
        br#"{"id":"o-1","customer":"acme","total":12.5}"#,
        br#"{"id":"o-2","customer":"zed","total":3,"note":"extra fields are ignored"}"#,
        br#"{"id":"o-3","customer":"acme"}"#,
        b"<order id='o-4'/>",
        br#"{"id":"o-5","customer":"acme","total":-3}"#,
        br#"{"id":"o-6","customer":"acme","total":0}"#,
    ];
    let mut config = format!("[broker]\nurl = \"{}\"\n", broker.amqp_url());
    let mut routers = BTreeMap::new();
    for plugin in ["order-router", "order-router-py", "order-router-js"] {
        let queue = unique_name(&format!("{plugin}.in"));
        let sink = unique_name(&format!("{plugin}.events"));
        let exchange = unique_name(&format!("{plugin}.x"));
        config.push_str(&router(&queue, plugin, &exchange, &sink));
        routers.insert(plugin, (queue, sink));
    }
    let host = HostProcess::start_within(&config, routers.len(), START).unwrap();
    for (queue, _) in routers.values() {
        broker
            .publish_many("", queue, inputs.iter().map(|body| (*body, json())))
            .await
            .unwrap();
    }
    let mut decided = BTreeMap::new();
    for (plugin, (queue, sink)) in &routers {
        let wait = Duration::from_secs(60);
        let events = broker.drain(sink, 2, wait).await.unwrap();
        let set_aside = broker
            .drain(&format!("{queue}.dlq"), 4, wait)
            .await
            .unwrap();
        let mut decisions = Decisions {
            events: events.iter().map(without_routed_at).collect(),
            reasons: set_aside.iter().map(|m| m.acemq_error()).collect(),
        };
        decisions.events.sort();
        decisions.reasons.sort();
        decided.insert(*plugin, decisions);
    }
    host.terminate(Duration::from_secs(30)).unwrap();

    let rust = &decided["order-router"];
    assert_eq!(rust.events.len(), 2, "{rust:#?}");
    assert!(
        rust.reasons
            .iter()
            .any(|r| r.contains("order o-5: total must be positive")),
        "{rust:#?}"
    );
    for other in ["order-router-py", "order-router-js"] {
        assert_eq!(
            &decided[other], rust,
            "{other} decided otherwise than the Rust router"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_plugin_is_denied_files_environment_and_sockets_and_its_print_is_logged() {
    let broker = shared_broker();
    let queue = unique_name("sandbox");
    let mut host = probe_host(&queue, "");
    let amqp_port = broker
        .amqp_url()
        .rsplit(':')
        .next()
        .and_then(|tail| tail.split('/').next())
        .unwrap()
        .to_string();
    let probes = [
        "file:/etc/hostname".to_string(),
        // Set in the host's own environment: the plugin's is empty.
        "env:PATH".to_string(),
        format!("socket:127.0.0.1:{amqp_port}"),
    ];
    let text = || BasicProperties::default().with_content_type("text/plain".into());
    let bodies = probes.iter().cloned().chain([
        "print:hello from the sandbox".to_string(),
        "accept".to_string(),
    ]);
    broker
        .publish_many("", &queue, bodies.map(|b| (b, text())))
        .await
        .unwrap();
    let denied = broker
        .drain(
            &format!("{queue}.dlq"),
            probes.len(),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    host.wait_for_log("stdout: hello from the sandbox", 1, Duration::from_secs(30))
        .unwrap();
    // Still serving after every denial.
    broker
        .wait_for_message_count(&queue, 0, Duration::from_secs(30))
        .await
        .unwrap();
    let (status, log) = host.terminate_with_log(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");

    let mut reasons: Vec<String> = denied.iter().map(|m| m.acemq_error()).collect();
    reasons.sort();
    assert_eq!(reasons.len(), 3, "{reasons:#?}");
    for (reason, what) in
        reasons
            .iter()
            .zip(["No such file", "KeyError: 'PATH'", "PermissionError"])
    {
        assert!(
            reason.contains("denied: ") && reason.contains(what),
            "expected a denial naming {what:?}, got {reason:?}"
        );
    }
    let printed = log
        .iter()
        .find(|line| line.contains("stdout: hello from the sandbox"))
        .unwrap();
    assert!(printed.contains(&queue), "{printed}");
    assert!(
        log.iter().all(|line| !line.contains("allowed:")),
        "{log:#?}"
    );
}

/// The Rust router swapped for the Python one while orders keep coming:
/// every order is routed exactly once, nothing is set aside, and the Python
/// version is the one routing after the swap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swapping_the_rust_router_for_the_python_one_under_load_loses_nothing() {
    const BATCH: u32 = 50;
    const AFTER_SWAP_BATCHES: u32 = 5;
    let broker = shared_broker();
    let dir = tempfile::tempdir().unwrap();
    let deployed = dir.path().join("router.wasm");
    std::fs::copy(plugin_path("order-router"), &deployed).unwrap();
    let (queue, sink, exchange) = (
        unique_name("swap-lang.in"),
        unique_name("swap-lang.events"),
        unique_name("swap-lang.x"),
    );
    let config = format!(
        "[broker]\nurl = \"{}\"\n{}",
        broker.amqp_url(),
        router(&queue, "order-router", &exchange, &sink)
    )
    .replace(
        &format!("plugin = \"{}\"", plugin_path("order-router").display()),
        &format!("plugin = \"{}\"", deployed.display()),
    );
    let mut host = HostProcess::start_within(&config, 1, START).unwrap();

    // Orders at a steady pace while the Python version compiles and swaps
    // in, and for a few batches after.
    let swapped = Arc::new(AtomicBool::new(false));
    let publishing = tokio::spawn({
        let (queue, swapped) = (queue.clone(), swapped.clone());
        async move {
            let (mut published, mut after_swap) = (0u32, 0);
            while after_swap < AFTER_SWAP_BATCHES {
                let orders = (published..published + BATCH).map(|n| {
                    let body = format!(r#"{{"id":"o-{n}","customer":"acme","total":{n}.5}}"#);
                    (body.into_bytes(), json())
                });
                shared_broker()
                    .publish_many("", &queue, orders)
                    .await
                    .unwrap();
                published += BATCH;
                if swapped.load(Ordering::Relaxed) {
                    after_swap += 1;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            published
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let staged = dir.path().join("router.wasm.new");
    std::fs::copy(plugin_path("order-router-py"), &staged).unwrap();
    std::fs::rename(&staged, &deployed).unwrap();
    host.wait_for_log("plugin swapped", 1, START).unwrap();
    swapped.store(true, Ordering::Relaxed);
    let orders = publishing.await.unwrap();

    let events = broker
        .drain(&sink, orders as usize, Duration::from_secs(120))
        .await
        .unwrap();
    let mut ids: Vec<String> = events
        .iter()
        .map(|m| {
            let event: serde_json::Value = serde_json::from_slice(&m.body).unwrap();
            event["id"].as_str().unwrap().to_string()
        })
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), orders as usize, "every order routed");
    assert_eq!(events.len(), orders as usize, "none routed twice");
    assert_eq!(
        broker.message_count(&format!("{queue}.dlq")).await.unwrap(),
        0
    );
    let (status, log) = host.terminate_with_log(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
    let swapped = log.iter().find(|l| l.contains("plugin swapped")).unwrap();
    let python = swapped
        .split("to=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the swap names the new version")
        .to_string();
    assert!(
        log.iter()
            .any(|l| l.contains("accepted: order.accepted") && l.contains(&python)),
        "no order was routed by the Python version {python}"
    );
}

/// A Python call is bounded like a Rust one: one past its deadline (busy,
/// or asleep in `time.sleep`, where no wasm runs and only the host's own
/// timer can end it), and one past its memory limit, each fail alone
/// (dead-lettered, naming the limit), and the next message is handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_call_past_its_deadline_or_memory_limit_fails_alone() {
    let broker = shared_broker();
    let queue = unique_name("sandbox-bounds");
    let host = probe_host(&queue, "deadline = \"1s\"");
    let text = || BasicProperties::default().with_content_type("text/plain".into());
    // 200 MB is over the default limit of 64 MiB per instance.
    let bodies = ["spin", "sleep:30", "hog:200", "accept"];
    broker
        .publish_many("", &queue, bodies.iter().map(|b| (*b, text())))
        .await
        .unwrap();
    let failed = broker
        .drain(&format!("{queue}.dlq"), 3, Duration::from_secs(20))
        .await
        .unwrap();
    broker
        .wait_for_message_count(&queue, 0, Duration::from_secs(30))
        .await
        .unwrap();
    let (status, log) = host.terminate_with_log(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
    let mut reasons: Vec<String> = failed.iter().map(|m| m.acemq_error()).collect();
    reasons.sort();
    assert_eq!(reasons.len(), 3, "{reasons:#?}");
    assert!(
        reasons[0].ends_with("deadline of 1s exceeded"),
        "{reasons:#?}"
    );
    assert!(
        reasons[1].ends_with(
            "deadline of 1s exceeded while the plugin waited inside the host (a WASI sleep or poll)"
        ),
        "{reasons:#?}"
    );
    assert!(reasons[2].contains("out of memory"), "{reasons:#?}");
    assert!(
        log.iter().all(|line| !line.contains("allowed:")),
        "{log:#?}"
    );
}

/// An uncaught Python exception is named where the author looks: the
/// dead letter's reason says the exception, its message and its line (not
/// wasmtime's `unreachable`); while every call faults, `/health` says
/// `DEGRADED` with that reason and `acemq_plugin_faulting` is 1; once a
/// good version is deployed, both clear before any message has proved it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_exception_is_named_in_the_dead_letter_and_health_degrades_until_a_good_version() {
    const RAISED: usize = 6;
    let broker = shared_broker();
    let queue = unique_name("raising");
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("handler.wasm");
    std::fs::copy(plugin_path("sandbox-probe-py"), &plugin).unwrap();
    let admin = format!("127.0.0.1:{}", free_port());
    let config = format!(
        "[broker]\nurl = \"{url}\"\n\n[host]\nadmin_listen = \"{admin}\"\n\n[[queues]]\nname = \"{queue}\"\ndead_letter = true\n\n[[consumers]]\nqueue = \"{queue}\"\nplugin = \"{plugin}\"\n",
        url = broker.amqp_url(),
        plugin = plugin.display(),
    );
    let host = HostProcess::start_within(&config, 1, START).unwrap();
    let get = |path: &str| {
        let url = format!("http://{admin}{path}");
        tokio::task::block_in_place(|| http_get(&url)).unwrap()
    };
    let text = || BasicProperties::default().with_content_type("text/plain".into());
    broker
        .publish_many("", &queue, (0..RAISED).map(|_| ("raise", text())))
        .await
        .unwrap();
    let dead = broker
        .drain(&format!("{queue}.dlq"), RAISED, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(dead.len(), RAISED);
    let reason = dead[0].acemq_error();
    assert!(
        reason.contains(
            "uncaught exception: NameError: name 'undefined_name' is not defined (app.py, line "
        ) && reason.ends_with(", in handle)"),
        "{reason}"
    );
    assert!(!reason.contains("unreachable"), "{reason}");

    let (_, health) = get("/health");
    let health: serde_json::Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["status"], "DEGRADED", "{health}");
    let details = health["details"].to_string();
    assert!(
        details.contains(&format!(
            "the plugin of consumer {queue} fails most calls: {RAISED} of its last {RAISED} calls faulted (last: uncaught exception: NameError"
        )),
        "{health}"
    );
    let faulting =
        |metrics: &str| metric_sum(metrics, "acemq_plugin_faulting", &[("queue", &queue)]);
    assert_eq!(faulting(&get("/metrics").1), 1.0);

    // A good version, deployed as a deploy tool does (renamed into place).
    let staged = dir.path().join(".handler.wasm.tmp");
    std::fs::copy(plugin_path("outcomes"), &staged).unwrap();
    std::fs::rename(&staged, &plugin).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let health = loop {
        let (_, body) = get("/health");
        let health: serde_json::Value = serde_json::from_str(&body).unwrap();
        if health["status"] == "UP" || std::time::Instant::now() > deadline {
            break health;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(health["status"], "UP", "{health}");
    assert_eq!(faulting(&get("/metrics").1), 0.0);
    let (status, _) = host.terminate_with_log(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
}
