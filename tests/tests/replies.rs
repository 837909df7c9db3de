//! Request/reply on the real broker (contract §11): a consumer running the
//! `responder` plugin answers requests as the AceMQ libraries and a plain
//! AMQP RPC client expect, read back by a plain lapin client.
//!
//! One host per plugin build (Rust `responder`, Python `responder-py`),
//! each through the same requests:
//! - an AceMQ request (`acemq-reply-to` and `reply-to`, envelope
//!   correlation) answered through the default exchange to the reply queue,
//!   paired on `x-acemq-correlation`, causation = the request's id;
//! - a request whose body is `fail`, rejected: answered with `acemq-error`,
//!   and set aside to `.dlq`;
//! - a pika-style request (only the `reply-to` and `correlation-id`
//!   properties), answered with its `correlation-id` echoed;
//! - a request with no reply address, rejected naming both places;
//! - a request whose reply queue has gone: the reply is not mandatory, so
//!   the request is still done (acked, nothing set aside).
//!
//! And the trace of an answered request: its process span's outcome is
//! `answered`, and the reply has its own publish span.

use std::time::Duration;

use acemq_tests::collector::Collector;
use acemq_tests::host::{InProcessHost, metric_sum, plugin_path};
use acemq_tests::{ReceivedMessage, shared_broker, unique_name};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};

const WAIT: Duration = Duration::from_secs(60);

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

fn request(headers: &[(&str, &str)]) -> BasicProperties {
    let mut table = FieldTable::default();
    for (name, value) in headers {
        table.insert((*name).into(), text(value));
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

async fn replies_as_the_contract_says(plugin: &str) {
    let broker = shared_broker();
    let queue = unique_name("replies.requests");
    let replies = unique_name("replies.to");
    let gone = unique_name("replies.gone");
    let config = format!(
        r#"
[broker]
url = "{url}"

[[queues]]
name = "{queue}"
dead_letter = true

[[queues]]
name = "{replies}"

[[consumers]]
queue = "{queue}"
plugin = "{plugin}"
"#,
        url = broker.amqp_url(),
        plugin = plugin_path(plugin).display(),
    );
    let host = InProcessHost::start(&config).await.unwrap();

    // An AceMQ request: both addresses, the envelope's own pairing.
    let asked_id = uuid::Uuid::new_v4().to_string();
    let acemq = request(&[
        ("acemq-reply-to", &replies),
        ("x-acemq-id", &asked_id),
        ("x-acemq-correlation", "conversation-1"),
        ("x-acemq-type", "echo.request"),
    ])
    .with_reply_to(replies.as_str().into())
    .with_message_id(asked_id.as_str().into());
    broker.publish("", &queue, b"hello", acemq).await.unwrap();
    let [answer] = &broker.drain(&replies, 1, WAIT).await.unwrap()[..] else {
        panic!("one reply");
    };
    assert_eq!(answer.exchange, "", "through the default exchange");
    assert_eq!(answer.routing_key, replies, "routing key = the reply queue");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&answer.body).unwrap(),
        serde_json::json!({"echo": "hello"})
    );
    assert_eq!(answer.content_type.as_deref(), Some("application/json"));
    assert_eq!(header(answer, "x-acemq-correlation"), "conversation-1");
    assert_eq!(header(answer, "x-acemq-causation"), asked_id);
    assert_eq!(header(answer, "x-acemq-type"), "echo.reply");
    assert_eq!(
        answer.message_id.as_deref(),
        Some(header(answer, "x-acemq-id").as_str())
    );
    assert_ne!(
        header(answer, "x-acemq-id"),
        asked_id,
        "a reply is a new message"
    );
    assert_eq!(
        answer.header("x-acemq-version"),
        Some(&AMQPValue::LongInt(1))
    );
    assert_eq!(answer.header("acemq-error"), None);
    assert_eq!(answer.properties.reply_to(), &None, "a reply is no request");
    assert_eq!(answer.properties.correlation_id(), &None, "none to echo");

    // A failing request: answered with acemq-error, and set aside.
    let failing_id = uuid::Uuid::new_v4().to_string();
    let failing = request(&[
        ("acemq-reply-to", &replies),
        ("x-acemq-id", &failing_id),
        ("x-acemq-correlation", "conversation-2"),
    ])
    .with_reply_to(replies.as_str().into());
    broker.publish("", &queue, b"fail", failing).await.unwrap();
    let [error] = &broker.drain(&replies, 1, WAIT).await.unwrap()[..] else {
        panic!("one error reply");
    };
    let acemq_error = header(error, "acemq-error");
    assert!(
        acemq_error.starts_with("Rejected: the handler rejected it: "),
        "{acemq_error}"
    );
    assert_eq!(header(error, "x-acemq-correlation"), "conversation-2");
    assert_eq!(header(error, "x-acemq-causation"), failing_id);
    let set_aside = broker
        .drain(&format!("{queue}.dlq"), 1, WAIT)
        .await
        .unwrap();
    assert_eq!(set_aside[0].body, b"fail");
    assert_eq!(
        acemq_error,
        format!("Rejected: {}", set_aside[0].acemq_error()),
        "the reply says what the set-aside copy says"
    );

    // A plain AMQP RPC client: reply-to and correlation-id properties only.
    let pika = BasicProperties::default()
        .with_reply_to(replies.as_str().into())
        .with_correlation_id("rpc-7".into());
    broker.publish("", &queue, b"ping", pika).await.unwrap();
    let [rpc] = &broker.drain(&replies, 1, WAIT).await.unwrap()[..] else {
        panic!("one reply to the plain client");
    };
    assert_eq!(
        rpc.properties.correlation_id().as_ref().map(|c| c.as_str()),
        Some("rpc-7"),
        "its correlation-id echoed"
    );
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&rpc.body).unwrap(),
        serde_json::json!({"echo": "ping"})
    );

    // No reply address at all: the answer has nowhere to go.
    broker
        .publish("", &queue, b"orphan", request(&[]))
        .await
        .unwrap();
    let [orphan] = &broker
        .drain(&format!("{queue}.dlq"), 1, WAIT)
        .await
        .unwrap()[..]
    else {
        panic!("the orphan set aside");
    };
    assert_eq!(orphan.body, b"orphan");
    let reason = orphan.acemq_error();
    assert!(
        reason.contains("acemq-reply-to") && reason.contains("reply-to property"),
        "{reason}"
    );

    // The caller has gone: its reply queue does not exist. Not mandatory,
    // so the request is done all the same.
    let before = acked(&host, &queue);
    broker
        .publish(
            "",
            &queue,
            b"anyone?",
            request(&[("acemq-reply-to", &gone)]),
        )
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while acked(&host, &queue) < before + 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the request was not acked"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        broker.message_count(&format!("{queue}.dlq")).await.unwrap(),
        0
    );
    assert_eq!(broker.message_count(&queue).await.unwrap(), 0);
    let metrics = host.metrics.render();
    assert_eq!(
        metric_sum(&metrics, "acemq_consume_total", &[("queue", &queue)]),
        5.0,
        "{metrics}"
    );
    host.stop().await.unwrap();
    for q in [
        format!("{queue}.dlq"),
        format!("{queue}.parked"),
        queue,
        replies,
    ] {
        let _ = broker.delete_queue(&q).await;
    }
}

fn acked(host: &InProcessHost, queue: &str) -> f64 {
    metric_sum(
        &host.metrics.render(),
        "acemq_consume_total",
        &[("queue", queue), ("outcome", "acked")],
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rust_responder_answers_as_the_contract_says() {
    replies_as_the_contract_says("responder").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_responder_answers_as_the_contract_says() {
    replies_as_the_contract_says("responder-py").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answered_request_ends_its_span_as_answered() {
    let broker = shared_broker();
    let collector = Collector::start().await.unwrap();
    let queue = unique_name("replies.traced");
    let replies = unique_name("replies.traced.to");
    let config = format!(
        r#"
[broker]
url = "{url}"

[[queues]]
name = "{queue}"
dead_letter = true

[[queues]]
name = "{replies}"

[[consumers]]
queue = "{queue}"
plugin = "{plugin}"

[tracing]
otlp_endpoint = "{endpoint}"
"#,
        url = broker.amqp_url(),
        plugin = plugin_path("responder").display(),
        endpoint = collector.endpoint,
    );
    let host = InProcessHost::start(&config).await.unwrap();
    for body in [&b"traced"[..], b"fail"] {
        broker
            .publish("", &queue, body, request(&[("acemq-reply-to", &replies)]))
            .await
            .unwrap();
    }
    broker.drain(&replies, 2, WAIT).await.unwrap();
    // Stopping flushes the host's spans to the collector.
    host.stop().await.unwrap();
    let spans = collector.spans();
    let outcomes: Vec<Option<&str>> = spans
        .iter()
        .filter(|s| s.name == format!("{queue} process"))
        .map(|s| s.attribute("messaging.acemq.outcome"))
        .collect();
    assert_eq!(outcomes.len(), 2, "{spans:#?}");
    assert!(outcomes.contains(&Some("answered")), "{outcomes:?}");
    assert!(outcomes.contains(&Some("rejected")), "{outcomes:?}");
    let reply_spans = spans
        .iter()
        .filter(|s| s.name == format!("{replies} publish"))
        .count();
    assert_eq!(reply_spans, 2, "the reply and the error reply: {spans:#?}");
    for q in [
        format!("{queue}.dlq"),
        format!("{queue}.parked"),
        queue,
        replies,
    ] {
        let _ = broker.delete_queue(&q).await;
    }
}
