//! The walking skeleton end to end: the order-router plugin in the host,
//! against a real RabbitMQ.

use std::collections::BTreeSet;
use std::time::Duration;

use acemq_tests::host::{HostOptions, HostProcess, plugin_path};
use acemq_tests::{shared_broker, unique_name};
use lapin::BasicProperties;
use lapin::types::AMQPValue;

/// Names of one test's topology, unique so tests can share the broker.
struct Names {
    orders_exchange: String,
    events_exchange: String,
    orders_queue: String,
    accepted_queue: String,
}

impl Names {
    fn new() -> Self {
        Self {
            orders_exchange: unique_name("orders"),
            events_exchange: unique_name("orders.events"),
            orders_queue: unique_name("orders.new"),
            accepted_queue: unique_name("orders.accepted"),
        }
    }

    fn config(&self, extra: &str) -> String {
        format!(
            r#"
[broker]
url = "{url}"
connect_timeout = "10s"

[[exchanges]]
name = "{orders}"
kind = "topic"

[[exchanges]]
name = "{events}"
kind = "topic"

[[queues]]
name = "{orders_q}"
dead_letter = true

[[queues]]
name = "{accepted_q}"

[[bindings]]
queue = "{orders_q}"
exchange = "{orders}"
routing_key = "order.*"

[[bindings]]
queue = "{accepted_q}"
exchange = "{events}"
routing_key = "order.accepted"

[[consumers]]
queue = "{orders_q}"
plugin = "{plugin}"
publish_to = ["{events}"]
{extra}

[consumers.config]
events_exchange = "{events}"
"#,
            url = shared_broker().amqp_url(),
            orders = self.orders_exchange,
            events = self.events_exchange,
            orders_q = self.orders_queue,
            accepted_q = self.accepted_queue,
            plugin = plugin_path("order-router").display(),
        )
    }
}

fn json_properties() -> BasicProperties {
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
}

/// The log lines that mention any of `ids`, and those about no message in
/// particular, for a failure message.
fn lines_naming<'a>(ids: &[String], log: impl Iterator<Item = &'a String>) -> String {
    let names_one = |line: &str| {
        line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .any(|word| ids.iter().any(|id| id == word))
    };
    log.filter(|line| names_one(line) || !line.contains("message_id="))
        .cloned()
        .collect::<Vec<_>>()
        .join("\n")
}

fn text(value: Option<&AMQPValue>) -> Option<String> {
    match value? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_valid_order_produces_an_event_and_an_invalid_one_is_dead_lettered_with_its_reason() {
    let broker = shared_broker();
    let names = Names::new();
    let host = HostProcess::start(&names.config(""), 1).expect("host starts");

    broker
        .publish(
            &names.orders_exchange,
            "order.created",
            br#"{"id":"o-1","customer":"ada","total":12.5}"#,
            json_properties().with_message_id("input-1".into()),
        )
        .await
        .unwrap();
    broker
        .publish(
            &names.orders_exchange,
            "order.created",
            br#"{"id":"o-2","customer":"bob"}"#,
            json_properties().with_message_id("input-2".into()),
        )
        .await
        .unwrap();

    let events = broker
        .drain(&names.accepted_queue, 1, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(events.len(), 1, "host log:\n{}", host.log_text());
    let event: serde_json::Value = serde_json::from_slice(&events[0].body).unwrap();
    assert_eq!(event["id"], "o-1");
    assert_eq!(event["customer"], "ada");
    assert_eq!(events[0].routing_key, "order.accepted");
    // A new AceMQ message caused by the input: its own id, the input as cause.
    assert_eq!(
        text(events[0].header("x-acemq-causation")).as_deref(),
        Some("input-1")
    );
    assert_eq!(
        text(events[0].header("x-acemq-type")).as_deref(),
        Some("order.accepted")
    );
    assert_eq!(events[0].message_id, text(events[0].header("x-acemq-id")));

    let dlq = format!("{}.dlq", names.orders_queue);
    let dead = broker
        .drain(&dlq, 1, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(dead.len(), 1, "host log:\n{}", host.log_text());
    assert_eq!(dead[0].body_str(), r#"{"id":"o-2","customer":"bob"}"#);
    assert_eq!(dead[0].message_id.as_deref(), Some("input-2"));
    let reason = text(dead[0].header("x-acemq-error")).expect("x-acemq-error is set");
    assert!(
        reason.starts_with("the handler rejected it: ") && reason.contains("missing field `total`"),
        "{reason}"
    );

    // Nothing is left behind, nothing was published twice.
    assert_eq!(broker.message_count(&names.orders_queue).await.unwrap(), 0);
    assert_eq!(
        broker.message_count(&names.accepted_queue).await.unwrap(),
        0
    );
    let status = host.terminate(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_with_a_thousand_messages_in_flight_loses_nothing() {
    const ORDERS: usize = 3000;
    let broker = shared_broker();
    let names = Names::new();
    // Up to 1000 deliveries in flight (unacked) when the signal comes.
    let config = names.config("prefetch = 1000\nconcurrency = 4");

    // Declare everything and stop, so the orders wait in the queue.
    let host = HostProcess::start(&config, 1).expect("host starts");
    host.terminate(Duration::from_secs(30)).unwrap();

    // Every third order is invalid, so both the event path and the
    // dead-letter path are in flight when the signal comes.
    let orders: Vec<(Vec<u8>, BasicProperties)> = (0..ORDERS)
        .map(|i| {
            let body = if i % 3 == 0 {
                format!(r#"{{"id":"o-{i}","customer":"c"}}"#)
            } else {
                format!(r#"{{"id":"o-{i}","customer":"c","total":{}}}"#, i + 1)
            };
            let properties = json_properties().with_message_id(format!("o-{i}").into());
            (body.into_bytes(), properties)
        })
        .collect();
    broker
        .publish_many(&names.orders_exchange, "order.created", orders)
        .await
        .unwrap();

    let first = HostProcess::start(&config, 1).expect("host starts");
    broker
        .wait_for_message_count(&names.accepted_queue, 100, Duration::from_secs(30))
        .await
        .unwrap();
    let (status, first_log) = first.terminate_with_log(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "exit after SIGTERM: {status}");
    let left = broker.message_count(&names.orders_queue).await.unwrap() as usize;
    assert!(
        left > 0,
        "the signal came after everything was handled; the test proves nothing"
    );

    // A second run finishes the rest.
    let host = HostProcess::start(&config, 1).expect("host restarts");
    let dlq = format!("{}.dlq", names.orders_queue);
    let invalid = ORDERS.div_ceil(3);
    broker
        .wait_for_message_count(
            &names.accepted_queue,
            (ORDERS - invalid) as u32,
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    broker
        .wait_for_message_count(&dlq, invalid as u32, Duration::from_secs(60))
        .await
        .unwrap();
    let (_, second_log) = host.terminate_with_log(Duration::from_secs(30)).unwrap();

    // Every order ended somewhere exactly once: the shutdown settled what it
    // started and gave back what it did not.
    let events = broker
        .drain(&names.accepted_queue, 2 * ORDERS, Duration::from_secs(10))
        .await
        .unwrap();
    let dead = broker
        .drain(&dlq, 2 * ORDERS, Duration::from_secs(10))
        .await
        .unwrap();
    let mut seen = BTreeSet::new();
    let mut repeated = Vec::new();
    for message in events.iter().chain(&dead) {
        let v: serde_json::Value = serde_json::from_slice(&message.body).unwrap();
        let id = v["id"].as_str().unwrap().to_string();
        if !seen.insert(id.clone()) {
            repeated.push(id);
        }
    }
    assert_eq!(seen.len(), ORDERS, "lost: {}", ORDERS - seen.len());
    assert!(
        repeated.is_empty(),
        "handled twice: {repeated:?}\nwhat the hosts said of them:\n{}",
        lines_naming(&repeated, first_log.iter().chain(&second_log))
    );
    assert_eq!(broker.message_count(&names.orders_queue).await.unwrap(), 0);
    // A clean stop closes every channel before its connection: lapin, whose
    // own close of a dropped channel otherwise races the connection's,
    // reports no connection error.
    let errors: Vec<_> = first_log
        .iter()
        .chain(&second_log)
        .filter(|line| line.contains("Connection error"))
        .collect();
    assert!(errors.is_empty(), "a clean stop reported: {errors:?}");
}

/// `--log-format json` (here `ACEMQ_LOG_FORMAT=json`): every line the host
/// writes is one JSON object, and a set-aside names its queue and message
/// id as fields a log pipeline can filter on.
#[tokio::test(flavor = "multi_thread")]
async fn json_logs_are_one_object_per_line_with_the_messages_fields() {
    const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
    let traced = || {
        let mut headers = lapin::types::FieldTable::default();
        headers.insert(
            "traceparent".into(),
            lapin::types::AMQPValue::LongString(
                format!("00-{TRACE_ID}-b7ad6b7169203331-01").into(),
            ),
        );
        headers
    };
    let broker = shared_broker();
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.toml");
    std::fs::write(&path, names.config("")).unwrap();
    let options = HostOptions {
        consumers: 0,
        log_format: Some("json".to_string()),
        ..HostOptions::default()
    };
    let mut host = HostProcess::start_with(&path, tempfile::tempdir().unwrap(), &options).unwrap();
    host.wait_for_log(r#""message":"consuming""#, 1, Duration::from_secs(60))
        .unwrap();
    broker
        .publish(
            &names.orders_exchange,
            "order.created",
            br#"{"id":"o-9","customer":"eve"}"#,
            json_properties()
                .with_message_id("input-9".into())
                .with_headers(traced()),
        )
        .await
        .unwrap();
    host.wait_for_log(r#""message":"set aside""#, 1, Duration::from_secs(30))
        .unwrap();
    let (status, log) = host.terminate_with_log(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");

    let lines: Vec<serde_json::Value> = log
        .iter()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not one JSON object ({e}): {line}"))
        })
        .collect();
    let set_aside = lines
        .iter()
        .find(|line| line["message"] == "set aside")
        .expect("a set-aside line");
    assert_eq!(set_aside["level"], "WARN");
    assert_eq!(set_aside["queue"], names.orders_queue.as_str());
    assert_eq!(set_aside["message_id"], "input-9");
    assert_eq!(set_aside["to"], format!("{}.dlq", names.orders_queue));
    assert_eq!(set_aside["trace_id"], TRACE_ID);
    assert!(set_aside["timestamp"].is_string(), "{set_aside}");
    // The plugin's own line for the same message: its version named.
    let plugin_line = lines
        .iter()
        .find(|line| line["target"] == "plugin" && line["message_id"] == "input-9")
        .unwrap_or_else(|| panic!("no plugin line for input-9 in {lines:?}"));
    assert_eq!(plugin_line["queue"], names.orders_queue.as_str());
    assert_eq!(plugin_line["trace_id"], TRACE_ID);
    let sha = plugin_line["plugin"].as_str().unwrap_or_default();
    assert!(
        sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()),
        "plugin is not a sha256: {plugin_line}"
    );
    assert!(
        lines
            .iter()
            .any(|line| line["message"] == "stopped cleanly"),
        "{lines:?}"
    );
}

/// The config file is read once: an edit while the host runs is logged as
/// not applied, and the host goes on as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_config_file_is_logged_as_not_applied_until_restart() {
    let names = Names::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.toml");
    let text = names.config("");
    std::fs::write(&path, &text).unwrap();
    let options = HostOptions {
        consumers: 0,
        ..HostOptions::default()
    };
    let mut host = HostProcess::start_with(&path, tempfile::tempdir().unwrap(), &options).unwrap();
    host.wait_for_log("consuming", 1, Duration::from_secs(60))
        .unwrap();
    // Saved unchanged: nothing to say.
    std::fs::write(&path, &text).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    std::fs::write(&path, format!("{text}\n# prefetch raised\n")).unwrap();
    host.wait_for_log(
        acemq_host::config_watch::NOT_APPLIED,
        1,
        Duration::from_secs(30),
    )
    .unwrap();
    let (status, log) = host.terminate_with_log(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
    let warnings = log
        .iter()
        .filter(|line| line.contains(acemq_host::config_watch::NOT_APPLIED))
        .count();
    assert_eq!(warnings, 1, "{log:#?}");
}
