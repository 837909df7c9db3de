//! Routing slips on the real broker (contract §11): three consumers of one
//! host, each running the `slip-step` plugin (which only accepts, and logs
//! its `[consumers.config] step`), carry a message through its slip: the
//! forwarding is the host's alone. Both wire forms, each answered in the
//! form received:
//! - the JSON `acemq-routing-slip` header: each step handled moves to
//!   `done` with its `completedAt`;
//! - Java's declared route (`x-acemq-route`, `x-acemq-route-position`,
//!   `x-acemq-route-id`) across a declared pipeline's queues
//!   `{pipeline}.{step}` on the direct exchange `{pipeline}`.
//!
//! The slip's last step is a queue the test reads, so the message can be
//! seen after the three consumers; a slip whose step just handled was the
//! last is forwarded nowhere.
//!
//! Each test runs for the Rust build and the Python one (`slip-step-py`).

use std::time::Duration;

use acemq_host::envelope::parse_rfc3339_ms;
use acemq_tests::host::{InProcessHost, metric_sum, plugin_path};
use acemq_tests::{ReceivedMessage, shared_broker, unique_name};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};

const WAIT: Duration = Duration::from_secs(60);
const STEPS: [&str; 3] = ["validate", "price", "ship"];

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// A host with a direct exchange `exchange`, one queue per step (and the
/// collecting queue `{prefix}.collect`), and three slip-step consumers.
fn config(plugin: &str, exchange: &str, prefix: &str) -> String {
    let url = shared_broker().amqp_url();
    let mut config = format!(
        r#"
[broker]
url = "{url}"

[[exchanges]]
name = "{exchange}"
kind = "direct"

[[queues]]
name = "{prefix}.collect"

[[bindings]]
queue = "{prefix}.collect"
exchange = "{exchange}"
routing_key = "collect"
"#
    );
    for step in STEPS {
        config.push_str(&format!(
            r#"
[[queues]]
name = "{prefix}.{step}"
dead_letter = true

[[bindings]]
queue = "{prefix}.{step}"
exchange = "{exchange}"
routing_key = "{step}"

[[consumers]]
queue = "{prefix}.{step}"
plugin = "{plugin}"

[consumers.config]
step = "{step}"
"#,
            plugin = plugin_path(plugin).display(),
        ));
    }
    config
}

fn with_headers(entries: Vec<(&str, AMQPValue)>) -> BasicProperties {
    let mut table = FieldTable::default();
    for (name, value) in entries {
        table.insert(name.into(), value);
    }
    BasicProperties::default()
        .with_content_type("text/plain".into())
        .with_headers(table)
}

fn header(message: &ReceivedMessage, name: &str) -> String {
    message
        .string_header(name)
        .unwrap_or_else(|| panic!("{name} missing on {message:?}"))
}

/// Waits until `queue`'s consumer has acked `count` deliveries.
async fn acked(host: &InProcessHost, queue: &str, count: f64) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let acked = metric_sum(
            &host.metrics.render(),
            "acemq_consume_total",
            &[("queue", queue), ("outcome", "acked")],
        );
        if acked >= count {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{queue} acked {acked} of {count}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn cleanup(prefix: &str, exchange: &str) {
    let broker = shared_broker();
    let mut queues = vec![format!("{prefix}.collect")];
    for step in STEPS {
        for suffix in ["", ".dlq", ".parked"] {
            queues.push(format!("{prefix}.{step}{suffix}"));
        }
    }
    for queue in queues {
        let _ = broker.delete_queue(&queue).await;
    }
    let _ = broker.delete_exchange(exchange).await;
}

async fn a_json_slip_goes_through_three_consumers(plugin: &str) {
    let broker = shared_broker();
    let exchange = unique_name("slips.json");
    let prefix = exchange.clone();
    let host = InProcessHost::start(&config(plugin, &exchange, &prefix))
        .await
        .unwrap();

    let step =
        |name: &str| serde_json::json!({"exchange": exchange, "routingKey": name, "name": name});
    let slip = serde_json::json!({
        "steps": [step("validate"), step("price"), step("ship"), step("collect")],
        "done": [],
    });
    let id = uuid::Uuid::new_v4().to_string();
    let sent_at = acemq_host::envelope::now_ms();
    let properties = with_headers(vec![
        ("acemq-routing-slip", text(&slip.to_string())),
        ("x-acemq-id", text(&id)),
        ("x-acemq-correlation", text("order-42")),
        ("x-acemq-attempt", AMQPValue::LongInt(2)),
    ]);
    broker
        .publish(&exchange, "validate", b"the order", properties)
        .await
        .unwrap();

    let [arrived] = &broker
        .drain(&format!("{prefix}.collect"), 1, WAIT)
        .await
        .unwrap()[..]
    else {
        panic!("the message at the slip's end");
    };
    assert_eq!(
        (arrived.exchange.as_str(), arrived.routing_key.as_str()),
        (exchange.as_str(), "collect")
    );
    assert_eq!(arrived.body, b"the order", "body as sent");
    assert_eq!(arrived.content_type.as_deref(), Some("text/plain"));
    assert_eq!(header(arrived, "x-acemq-id"), id, "the same message");
    assert_eq!(header(arrived, "x-acemq-correlation"), "order-42");
    assert_eq!(
        arrived.header("x-acemq-attempt"),
        Some(&AMQPValue::LongInt(1))
    );
    let slip: serde_json::Value =
        serde_json::from_str(&header(arrived, "acemq-routing-slip")).unwrap();
    assert_eq!(slip["steps"], serde_json::json!([step("collect")]));
    let done = slip["done"].as_array().unwrap();
    let names: Vec<&str> = done.iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(names, STEPS, "every step done, in order");
    let mut last = sent_at.saturating_sub(1_000);
    for entry in done {
        let at = entry["completedAt"].as_str().unwrap();
        assert!(
            at.ends_with('Z') && at.len() == 24,
            "RFC 3339 UTC with ms: {at}"
        );
        let at = parse_rfc3339_ms(at).unwrap();
        assert!(at >= last, "steps done in order: {done:?}");
        last = at;
        assert_eq!(entry["exchange"], exchange.as_str());
    }

    // A slip whose step just handled was its last is forwarded nowhere.
    let last_step = serde_json::json!({"steps": [step("ship")], "done": []});
    broker
        .publish(
            &exchange,
            "ship",
            b"the end",
            with_headers(vec![("acemq-routing-slip", text(&last_step.to_string()))]),
        )
        .await
        .unwrap();
    acked(&host, &format!("{prefix}.ship"), 2.0).await;
    assert_eq!(
        broker
            .message_count(&format!("{prefix}.collect"))
            .await
            .unwrap(),
        0
    );

    // A slip that cannot be followed is set aside before any step works.
    broker
        .publish(
            &exchange,
            "validate",
            b"lost?",
            with_headers(vec![(
                "acemq-routing-slip",
                text(r#"{"steps":[{"name":"x"}]}"#),
            )]),
        )
        .await
        .unwrap();
    let [refused] = &broker
        .drain(&format!("{prefix}.validate.dlq"), 1, WAIT)
        .await
        .unwrap()[..]
    else {
        panic!("the unfollowable slip set aside");
    };
    assert_eq!(
        refused.acemq_error(),
        "its routing slip cannot be followed: step 0 of the acemq-routing-slip header has no \
         \"exchange\" text"
    );
    host.stop().await.unwrap();
    cleanup(&prefix, &exchange).await;
}

async fn a_declared_route_goes_through_three_consumers(plugin: &str) {
    let broker = shared_broker();
    // The pipeline: exchange `{pipeline}`, queues `{pipeline}.{step}`.
    let pipeline = unique_name("slips.pipeline");
    let host = InProcessHost::start(&config(plugin, &pipeline, &pipeline))
        .await
        .unwrap();
    let id = uuid::Uuid::new_v4().to_string();
    let properties = with_headers(vec![
        ("x-acemq-id", text(&id)),
        ("x-acemq-route", text("validate,price,ship,collect")),
        ("x-acemq-route-position", AMQPValue::LongLongInt(0)),
        ("x-acemq-route-id", text("run-1")),
    ]);
    broker
        .publish(&pipeline, "validate", b"the order", properties)
        .await
        .unwrap();
    let [arrived] = &broker
        .drain(&format!("{pipeline}.collect"), 1, WAIT)
        .await
        .unwrap()[..]
    else {
        panic!("the message at the route's end");
    };
    assert_eq!(
        (arrived.exchange.as_str(), arrived.routing_key.as_str()),
        (pipeline.as_str(), "collect")
    );
    assert_eq!(arrived.body, b"the order");
    assert_eq!(header(arrived, "x-acemq-id"), id);
    assert_eq!(
        header(arrived, "x-acemq-route"),
        "validate,price,ship,collect"
    );
    assert_eq!(
        arrived.header("x-acemq-route-position"),
        Some(&AMQPValue::LongLongInt(3)),
        "three steps done"
    );
    assert_eq!(header(arrived, "x-acemq-route-id"), "run-1");
    assert_eq!(
        arrived.header("acemq-routing-slip"),
        None,
        "the form received"
    );
    for step in STEPS {
        acked(&host, &format!("{pipeline}.{step}"), 1.0).await;
    }
    // Each hop is a publish of the host's own, counted as any publish is.
    let hops = metric_sum(
        &host.metrics.render(),
        "acemq_publish_total",
        &[("exchange", &pipeline), ("outcome", "confirmed")],
    );
    assert_eq!(hops, 3.0, "three hops, each confirmed");
    host.stop().await.unwrap();
    cleanup(&pipeline, &pipeline).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_json_slip_goes_through_three_rust_consumers() {
    a_json_slip_goes_through_three_consumers("slip-step").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_json_slip_goes_through_three_python_consumers() {
    a_json_slip_goes_through_three_consumers("slip-step-py").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_declared_route_goes_through_three_rust_consumers() {
    a_declared_route_goes_through_three_consumers("slip-step").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_declared_route_goes_through_three_python_consumers() {
    a_declared_route_goes_through_three_consumers("slip-step-py").await;
}
