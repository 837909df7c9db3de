//! Tests of the test harness itself: the throwaway broker and its helpers.

use acemq_tests::host::InProcessHost;
use acemq_tests::stamp::StampConfig;
use acemq_tests::{Broker, shared_broker, unique_name, watchdog};
use anyhow::Result;
use lapin::BasicProperties;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use serde_json::json;
use std::time::Duration;

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut table = FieldTable::default();
    for (key, value) in entries {
        table.insert(ShortString::from(*key), value.clone());
    }
    table
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

async fn declare_queue(broker: &Broker, name: &str, arguments: FieldTable) -> Result<()> {
    let connection = broker.connect().await?;
    let channel = connection.create_channel().await?;
    channel
        .queue_declare(name.into(), QueueDeclareOptions::durable(), arguments)
        .await?;
    connection.close(200, "bye".into()).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn broker_answers_on_amqp_management_and_cli() -> Result<()> {
    let broker = shared_broker();

    let overview = broker.management_get("/api/overview")?;
    assert!(
        overview["rabbitmq_version"].as_str().is_some(),
        "{overview}"
    );
    if !broker.is_external() {
        assert_eq!(overview["rabbitmq_version"], "3.10.8");
        let node = broker.node_name().expect("own node has a name");
        assert!(node.starts_with("acemq-test-"), "{node}");
        assert!(
            broker
                .amqp_url()
                .starts_with("amqp://guest:guest@127.0.0.1:")
        );
        // The CLI reaches the node with the node's cookie.
        let status = broker.rabbitmqctl(&["-q", "list_feature_flags", "name", "state"])?;
        assert!(status.contains("quorum_queue"), "{status}");
        assert!(status.contains("stream_queue"), "{status}");
    }

    let connection = broker.connect().await?;
    assert!(connection.status().connected());
    connection.close(200, "bye".into()).await?;

    // The helpers' futures are Send, so tests may spawn them.
    let queue = unique_name("harness.spawned");
    declare_queue(broker, &queue, FieldTable::default()).await?;
    let spawned = tokio::spawn({
        let queue = queue.clone();
        async move { shared_broker().message_count(&queue).await }
    });
    assert_eq!(spawned.await??, 0);
    broker.delete_queue(&queue).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn quorum_queue_reads_back_with_exact_arguments() -> Result<()> {
    let broker = shared_broker();
    let queue = unique_name("harness.qq");
    let arguments = table(&[
        ("x-queue-type", text("quorum")),
        ("x-delivery-limit", AMQPValue::LongInt(3)),
        ("x-dead-letter-exchange", text("harness.dlx")),
        ("x-dead-letter-strategy", text("at-least-once")),
        ("x-overflow", text("reject-publish")),
        ("x-max-length", AMQPValue::LongLongInt(10_000)),
    ]);
    declare_queue(broker, &queue, arguments).await?;

    let info = broker.queue_info(&queue)?;
    assert_eq!(info["name"], queue.as_str());
    assert_eq!(info["type"], "quorum");
    assert_eq!(info["durable"], true);
    assert_eq!(info["auto_delete"], false);
    assert_eq!(
        info["arguments"],
        json!({
            "x-queue-type": "quorum",
            "x-delivery-limit": 3,
            "x-dead-letter-exchange": "harness.dlx",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
            "x-max-length": 10_000,
        })
    );

    broker.delete_queue(&queue).await?;
    let missing = broker.queue_info(&queue).unwrap_err();
    assert!(format!("{missing:#}").contains("404"), "{missing:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_count_and_drain_round_trip() -> Result<()> {
    let broker = shared_broker();
    let queue = unique_name("harness.roundtrip");
    declare_queue(broker, &queue, table(&[("x-queue-type", text("quorum"))])).await?;

    for i in 0..3 {
        let properties = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id(format!("m-{i}").into())
            .with_headers(table(&[
                ("x-index", AMQPValue::LongLongInt(i)),
                ("x-origin", text("harness")),
            ]));
        let body = format!(r#"{{"n":{i}}}"#);
        broker
            .publish("", &queue, body.as_bytes(), properties)
            .await?;
    }
    // Confirmed means enqueued: the passive-declare count is exact at once.
    assert_eq!(broker.message_count(&queue).await?, 3);

    let messages = broker.drain(&queue, 3, Duration::from_secs(10)).await?;
    assert_eq!(messages.len(), 3);
    for (i, message) in (0i64..).zip(&messages) {
        assert_eq!(message.body_str(), format!(r#"{{"n":{i}}}"#));
        assert_eq!(message.content_type.as_deref(), Some("application/json"));
        assert_eq!(
            message.message_id.as_deref(),
            Some(format!("m-{i}").as_str())
        );
        assert_eq!(message.routing_key, queue);
        assert_eq!(message.exchange, "");
        assert!(!message.redelivered);
        assert_eq!(message.header("x-index"), Some(&AMQPValue::LongLongInt(i)));
        assert_eq!(message.header("x-origin"), Some(&text("harness")));
    }
    assert_eq!(broker.message_count(&queue).await?, 0);

    // An empty queue: the timeout ends the drain with nothing.
    let started = std::time::Instant::now();
    let nothing = broker.drain(&queue, 1, Duration::from_millis(300)).await?;
    assert!(nothing.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(300));

    // Asking for more than there is returns what there is, and no message
    // stays behind unacked or requeued.
    broker
        .publish("", &queue, b"only", BasicProperties::default())
        .await?;
    let some = broker.drain(&queue, 5, Duration::from_millis(500)).await?;
    assert_eq!(some.len(), 1);
    assert_eq!(some[0].body, b"only");
    assert!(some[0].header("x-delivery-count").is_none());
    assert_eq!(broker.message_count(&queue).await?, 0);

    broker.delete_queue(&queue).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn publish_many_and_wait_for_count() -> Result<()> {
    let broker = shared_broker();
    let queue = unique_name("harness.many");
    declare_queue(broker, &queue, FieldTable::default()).await?;

    let messages = (0..2_000).map(|i| {
        (
            format!("message {i}").into_bytes(),
            BasicProperties::default().with_message_id(format!("{i}").into()),
        )
    });
    assert_eq!(broker.publish_many("", &queue, messages).await?, 2_000);
    let count = broker
        .wait_for_message_count(&queue, 2_000, Duration::from_secs(10))
        .await?;
    assert_eq!(count, 2_000);

    // The drain hands back exactly what was asked for and leaves the rest.
    let first = broker.drain(&queue, 1_500, Duration::from_secs(20)).await?;
    assert_eq!(first.len(), 1_500);
    assert_eq!(first[0].body_str(), "message 0");
    assert_eq!(first[1_499].message_id.as_deref(), Some("1499"));
    assert_eq!(broker.message_count(&queue).await?, 500);

    broker.delete_queue(&queue).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn unroutable_publish_fails() -> Result<()> {
    let broker = shared_broker();
    let missing = unique_name("harness.nowhere");
    let error = broker
        .publish("", &missing, b"lost", BasicProperties::default())
        .await
        .unwrap_err();
    assert!(format!("{error:#}").contains("NO_ROUTE"), "{error:#}");

    let error = broker.message_count(&missing).await.unwrap_err();
    assert!(format!("{error:#}").contains("NOT_FOUND"), "{error:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn exchanges_and_bindings_read_back() -> Result<()> {
    let broker = shared_broker();
    let exchange = unique_name("harness.x");
    let queue = unique_name("harness.bound");
    declare_queue(broker, &queue, FieldTable::default()).await?;
    let connection = broker.connect().await?;
    let channel = connection.create_channel().await?;
    channel
        .exchange_declare(
            exchange.as_str().into(),
            lapin::ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            "orders.*".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    connection.close(200, "bye".into()).await?;

    let info = broker.exchange_info(&exchange)?;
    assert_eq!(info["type"], "topic");
    assert_eq!(info["durable"], true);

    let bindings = broker.bindings(&queue)?;
    assert!(
        bindings
            .iter()
            .any(|b| b["source"] == exchange.as_str() && b["routing_key"] == "orders.*"),
        "{bindings:?}"
    );

    broker
        .publish(&exchange, "orders.new", b"{}", BasicProperties::default())
        .await?;
    let delivered = broker.drain(&queue, 1, Duration::from_secs(10)).await?;
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].exchange, exchange);
    assert_eq!(delivered[0].routing_key, "orders.new");

    broker.delete_exchange(&exchange).await?;
    broker.delete_queue(&queue).await?;
    assert!(broker.exchange_info(&exchange).is_err());
    Ok(())
}

/// A second, private node: started and stopped by the test itself, as tests
/// that restart or break the broker will do.
#[tokio::test(flavor = "multi_thread")]
async fn own_broker_stops_cleanly() -> Result<()> {
    if std::env::var_os("ACEMQ_TEST_URL").is_some() {
        return Ok(()); // external-broker runs start nothing
    }
    let broker = Broker::start()?;
    let dir = broker
        .data_dir()
        .expect("own node has a directory")
        .to_owned();
    assert!(dir.join("rabbitmq.conf").exists());
    let url = broker.amqp_url().to_owned();
    assert_ne!(url, shared_broker().amqp_url());

    let queue = unique_name("harness.own");
    declare_queue(&broker, &queue, FieldTable::default()).await?;
    broker
        .publish("", &queue, b"x", BasicProperties::default())
        .await?;
    assert_eq!(broker.message_count(&queue).await?, 1);

    broker.stop()?;
    assert!(!dir.exists(), "{} survived stop()", dir.display());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", broker.amqp_port())).is_err(),
        "AMQP port still open after stop()"
    );
    // Idempotent; Drop calls it again.
    broker.stop()?;
    Ok(())
}

/// During a resource alarm the broker blocks a connection at its first
/// publish, and lapin then writes nothing on it, not even a close: the
/// publish's confirm and the helper's close would wait for ever. The helper
/// says so instead (a test that hung with no host left ended this way).
#[tokio::test(flavor = "multi_thread")]
async fn a_publish_the_broker_blocks_fails_naming_the_alarm_instead_of_hanging() -> Result<()> {
    if std::env::var_os("ACEMQ_TEST_URL").is_some() {
        return Ok(()); // the alarm is broker-wide: only on a node of its own
    }
    let broker = Broker::start()?;
    let queue = unique_name("harness.blocked");
    declare_queue(&broker, &queue, FieldTable::default()).await?;
    broker.rabbitmqctl(&["set_vm_memory_high_watermark", "0"])?;
    let published = tokio::time::timeout(
        Duration::from_secs(60),
        broker.publish("", &queue, b"x", BasicProperties::default()),
    )
    .await;
    broker.rabbitmqctl(&["set_vm_memory_high_watermark", "0.4"])?;
    let error = published
        .expect("the publish ended within 60 s")
        .expect_err("a blocked publish is an error");
    assert!(
        format!("{error:#}").contains("the broker blocked the connection"),
        "{error:#}"
    );
    broker.stop()?;
    Ok(())
}

/// The watchdog's report of a stuck wait carries what each in-process
/// host is doing: its queues' readings and where its deliveries are.
#[tokio::test(flavor = "multi_thread")]
async fn a_stuck_waits_report_says_what_an_in_process_host_is_doing() -> Result<()> {
    let broker = shared_broker();
    let queue = unique_name("harness.reported");
    let (output, exchange) = (format!("{queue}.out"), format!("{queue}.x"));
    let broker_line = format!("url = \"{}\"", broker.amqp_url());
    let config = StampConfig {
        broker: &broker_line,
        ..StampConfig::new(&queue, &output, &exchange)
    }
    .toml();
    let host = InProcessHost::start(&config).await?;
    let said = watchdog::states();
    host.stop().await?;
    assert!(said.contains("state of an in-process host:"), "{said}");
    assert!(
        said.contains(&format!("queue {queue}: Consuming")),
        "{said}"
    );
    assert!(
        said.contains(r#"acemq_connection_up{connection="consume"} 1"#),
        "{said}"
    );
    assert!(
        said.contains(&format!(r#"acemq_consume_in_flight{{queue="{queue}"}} 0"#)),
        "{said}"
    );
    // Gone with the host.
    assert!(
        !watchdog::states().contains(&format!("queue {queue}:")),
        "{}",
        watchdog::states()
    );
    Ok(())
}
