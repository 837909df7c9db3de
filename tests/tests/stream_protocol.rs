//! Stream consumers and replay over RabbitMQ's stream protocol, on a real
//! broker with the `rabbitmq_stream` plugin: what a plugin sees is what it
//! sees over AMQP 0-9-1, positions kept by the broker's offset tracking,
//! the choice of protocol, and recovery.

use std::collections::BTreeMap;
use std::time::Duration;

use acemq_host::broker::offset::StreamOffset;
use acemq_host::broker::stream_read::{StoredMessage, StreamRead};
use acemq_tests::host::{HostOptions, HostProcess, plugin_path};
use acemq_tests::stamp::{StampConfig, stamped_until};
use acemq_tests::{Broker, shared_broker, unique_name};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, ByteArray, FieldArray, FieldTable, LongString, ShortString};
use serde_json::Value;

async fn declare_stream(broker: &Broker, name: &str) {
    broker.declare_queue(name, "stream", &[]).await.unwrap();
}

async fn append(broker: &Broker, stream: &str, ids: impl IntoIterator<Item = String>) {
    let messages = ids.into_iter().map(|id| {
        let properties = BasicProperties::default().with_message_id(id.as_str().into());
        (id.into_bytes(), properties)
    });
    broker.publish_many("", stream, messages).await.unwrap();
}

fn ids(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i}")).collect()
}

/// The stream listeners of `broker`, as a host configured with its URL and
/// `stream_port` derives them.
fn endpoints_of(broker: &Broker) -> acemq_host::broker::stream_protocol::StreamEndpoints {
    let url = acemq_host::broker::BrokerUrl::parse(broker.amqp_url()).unwrap();
    acemq_host::broker::stream_protocol::StreamEndpoints::new(
        &[url],
        Some(broker.stream_port()),
        None,
        "acemq-tests".into(),
    )
    .unwrap()
}

/// Every message of `stream` read through the host's stream reader, over
/// AMQP 0-9-1 or over the stream protocol.
async fn read_all(broker: &Broker, stream: &str, stream_protocol: bool) -> Vec<StoredMessage> {
    let mut read = if stream_protocol {
        StreamRead::open_stream_protocol(&endpoints_of(broker), stream, StreamOffset::First, "test")
            .await
            .unwrap()
    } else {
        let config = acemq_host::config::LoadedConfig::parse(
            std::path::Path::new("read.toml"),
            format!("[broker]\nurl = \"{}\"\n", broker.amqp_url()),
        )
        .unwrap();
        let oneoff = acemq_host::app::connect_once(&config, "test")
            .await
            .unwrap();
        let read = StreamRead::open(&oneoff, stream, StreamOffset::First, 100, "test")
            .await
            .unwrap();
        // The connection stays open for the read: leaked on purpose, the
        // broker closes it when the test process ends.
        std::mem::forget(oneoff);
        read
    };
    let mut messages = Vec::new();
    while let Some(message) = read.next(Duration::from_secs(2)).await.unwrap() {
        messages.push(message);
    }
    read.close().await;
    messages
}

/// A message carrying the whole AceMQ envelope and every property, with
/// headers of every type AMQP 0-9-1 producers write.
fn enveloped(i: usize) -> (Vec<u8>, BasicProperties) {
    let mut headers = FieldTable::default();
    let mut put = |key: &str, value: AMQPValue| {
        headers.insert(key.into(), value);
    };
    put(
        "x-acemq-id",
        AMQPValue::LongString(format!("id-{i}").into()),
    );
    put(
        "x-acemq-type",
        AMQPValue::LongString("order.created".into()),
    );
    put("x-acemq-version", AMQPValue::LongString("2".into()));
    put(
        "x-acemq-correlation",
        AMQPValue::LongString(format!("corr-{i}").into()),
    );
    put("x-acemq-causation", AMQPValue::LongString("cause-1".into()));
    put("x-acemq-attempt", AMQPValue::LongLongInt(1));
    put(
        "x-acemq-first-seen",
        AMQPValue::LongLongInt(1_764_000_000_000),
    );
    put(
        "x-acemq-origin",
        AMQPValue::LongString("orders-service".into()),
    );
    put("a-bool", AMQPValue::Boolean(true));
    put("a-byte", AMQPValue::ShortShortInt(-5));
    put("a-short", AMQPValue::ShortInt(-300));
    put("an-int", AMQPValue::LongInt(-70_000));
    put("a-long", AMQPValue::LongLongInt(-5_000_000_000));
    put("a-float", AMQPValue::Float(1.5));
    put("a-double", AMQPValue::Double(2.25));
    put("a-timestamp", AMQPValue::Timestamp(1_764_000_000));
    put(
        "bytes",
        AMQPValue::ByteArray(ByteArray::from(vec![0u8, 1, 255])),
    );
    put("nothing", AMQPValue::Void);
    put(
        "a-list",
        AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongString("x".into())])),
    );
    put("a-table", AMQPValue::FieldTable(FieldTable::default()));
    let properties = BasicProperties::default()
        .with_content_type(ShortString::from("application/json"))
        .with_content_encoding(ShortString::from("utf-8"))
        .with_headers(headers)
        .with_delivery_mode(2)
        .with_priority(3)
        .with_correlation_id(ShortString::from(format!("corr-{i}")))
        .with_reply_to(ShortString::from("replies"))
        .with_expiration(ShortString::from("60000"))
        .with_message_id(ShortString::from(format!("id-{i}")))
        .with_timestamp(1_764_000_000 + i as u64)
        .with_type(ShortString::from("order.created"))
        .with_user_id(ShortString::from("guest"))
        .with_app_id(ShortString::from("orders-service"));
    (format!("{{\"order\":{i}}}").into_bytes(), properties)
}

#[tokio::test(flavor = "multi_thread")]
async fn one_stream_read_both_ways_gives_plugins_the_same_fields() {
    let broker = shared_broker();
    let stream = unique_name("sp.fields");
    declare_stream(broker, &stream).await;
    broker
        .publish_many("", &stream, (0..20).map(enveloped))
        .await
        .unwrap();
    // Through an exchange too: the delivery's exchange and routing key.
    let exchange = unique_name("sp.fields.x");
    {
        use lapin::options::{ExchangeDeclareOptions, QueueBindOptions};
        let connection = broker.connect().await.unwrap();
        let channel = connection.create_channel().await.unwrap();
        channel
            .exchange_declare(
                exchange.as_str().into(),
                lapin::ExchangeKind::Direct,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_bind(
                stream.as_str().into(),
                exchange.as_str().into(),
                "orders.key".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let _ = connection.close(200, "done".into()).await;
    }
    broker
        .publish_many(&exchange, "orders.key", (20..25).map(enveloped))
        .await
        .unwrap();
    // A body that is not UTF-8, and a message with no properties at all.
    broker
        .publish_many(
            "",
            &stream,
            [
                (vec![0u8, 159, 146, 150], BasicProperties::default()),
                (Vec::new(), BasicProperties::default()),
            ],
        )
        .await
        .unwrap();

    let over_amqp = read_all(broker, &stream, false).await;
    let over_stream = read_all(broker, &stream, true).await;
    assert_eq!(over_amqp.len(), 27);
    assert_eq!(over_stream.len(), 27);
    for (amqp, stream) in over_amqp.iter().zip(&over_stream) {
        let at = amqp.offset;
        assert_eq!(stream.offset, amqp.offset);
        assert_eq!(stream.exchange, amqp.exchange, "exchange at {at}");
        assert_eq!(stream.routing_key, amqp.routing_key, "routing key at {at}");
        assert_eq!(stream.body, amqp.body, "body at {at}");
        assert_eq!(stream.redelivered, amqp.redelivered, "redelivered at {at}");
        // Field by field first, for a message that names the field.
        let (s, a) = (&stream.properties, &amqp.properties);
        assert_eq!(s.content_type(), a.content_type(), "content type at {at}");
        assert_eq!(
            s.content_encoding(),
            a.content_encoding(),
            "encoding at {at}"
        );
        assert_eq!(
            s.delivery_mode(),
            a.delivery_mode(),
            "delivery mode at {at}"
        );
        assert_eq!(s.priority(), a.priority(), "priority at {at}");
        assert_eq!(
            s.correlation_id(),
            a.correlation_id(),
            "correlation at {at}"
        );
        assert_eq!(s.reply_to(), a.reply_to(), "reply to at {at}");
        assert_eq!(s.expiration(), a.expiration(), "expiration at {at}");
        assert_eq!(s.message_id(), a.message_id(), "message id at {at}");
        assert_eq!(s.timestamp(), a.timestamp(), "timestamp at {at}");
        assert_eq!(s.kind(), a.kind(), "type at {at}");
        assert_eq!(s.user_id(), a.user_id(), "user id at {at}");
        assert_eq!(s.app_id(), a.app_id(), "app id at {at}");
        let headers = |p: &BasicProperties| -> BTreeMap<String, AMQPValue> {
            p.headers()
                .as_ref()
                .map(|h| {
                    h.inner()
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.clone()))
                        .collect()
                })
                .unwrap_or_default()
        };
        let (sh, ah) = (headers(s), headers(a));
        for key in sh.keys().chain(ah.keys()) {
            assert_eq!(sh.get(key), ah.get(key), "header {key} at {at}");
        }
        assert_eq!(s, a, "properties at {at}");
    }
    // What the envelope reader makes of it: the same envelope.
    let first = &over_stream[0];
    assert_eq!(
        first
            .properties
            .headers()
            .as_ref()
            .unwrap()
            .inner()
            .get("x-acemq-id"),
        Some(&AMQPValue::LongString(LongString::from("id-0")))
    );
    assert_eq!(over_stream[20].exchange, exchange);
    broker.delete_queue(&stream).await.unwrap();
    broker.delete_exchange(&exchange).await.unwrap();
}

/// The config of a host reading `stream` through `stamp-v1` into `output`
/// over `protocol` (`auto`, `stream` or `amqp`), from `first`, as the named
/// consumer `projection-{stream}`; `more` adds consumer lines.
fn config(broker: &Broker, stream: &str, output: &str, protocol: &str, more: &str) -> String {
    let broker_lines = format!(
        "url = \"{}\"\nstream_port = {}\nnetwork_recovery_interval = \"200ms\"",
        broker.amqp_url(),
        broker.stream_port()
    );
    let consumer = format!(
        "offset = \"first\"\nconsumer_name = \"projection-{stream}\"\nstream_protocol = \"{protocol}\"\n{more}"
    );
    let exchange = format!("{output}.x");
    StampConfig {
        broker: &broker_lines,
        input_queue: "type = \"stream\"",
        consumer: &consumer,
        ..StampConfig::new(stream, output, &exchange)
    }
    .toml()
}

/// A host process on `config`, written to a folder of its own.
fn host(config: &str) -> HostProcess {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.toml");
    std::fs::write(&path, config).unwrap();
    HostProcess::start_with(&path, dir, &HostOptions::default()).unwrap()
}

/// The offset the broker tracks for `reference` on `stream`.
async fn tracked_offset(broker: &Broker, stream: &str, reference: &str) -> Option<u64> {
    let connection = endpoints_of(broker).connect("test").await.unwrap();
    let offset = connection.query_offset(reference, stream).await.unwrap();
    connection.close().await;
    offset
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_on_the_stream_protocol_keeps_its_offset_in_the_broker_and_resumes_after_a_kill() {
    const MESSAGES: usize = 5000;
    const EVERY: usize = 100;
    const PREFETCH: usize = 10;
    let broker = shared_broker();
    let stream = unique_name("sp.kill");
    let output = unique_name("sp.kill.out");
    declare_stream(broker, &stream).await;
    append(broker, &stream, ids("m", 0..MESSAGES)).await;
    let config = config(
        broker,
        &stream,
        &output,
        "stream",
        &format!("checkpoint_every = {EVERY}\nprefetch = {PREFETCH}"),
    );
    let first = host(&config);
    assert!(
        first
            .log_text()
            .contains("this stream consumer reads over the stream protocol"),
        "{}",
        first.log_text()
    );
    broker
        .wait_for_message_count(&output, (MESSAGES / 3) as u32, Duration::from_secs(60))
        .await
        .unwrap();
    drop(first); // SIGKILL: no shutdown, no last save
    let reference = format!("projection-{stream}");
    let saved = tracked_offset(broker, &stream, &reference).await;
    assert!(saved.is_some_and(|s| s > 0), "the broker tracks {saved:?}");

    let second = host(&config);
    let seen = stamped_until(broker, &output, MESSAGES).await;
    assert_eq!(seen.len(), MESSAGES, "no offset was skipped");
    let again: usize = seen.values().map(|n| n - 1).sum();
    // As on the AMQP path (tests/streams.rs): since the last save, out of
    // order above it, outputs out but not done, and a save in flight.
    let bound = EVERY + 2 * PREFETCH + EVERY / 4;
    assert!(again <= bound, "{again} read twice (bound {bound})");
    // A clean stop stores the position: one past the last message.
    assert!(second.terminate(Duration::from_secs(30)).unwrap().success());
    assert_eq!(
        tracked_offset(broker, &stream, &reference).await,
        Some(MESSAGES as u64)
    );
    broker.delete_queue(&stream).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_moved_from_amqp_to_the_stream_protocol_resumes_where_it_was() {
    let broker = shared_broker();
    let stream = unique_name("sp.move");
    let output = unique_name("sp.move.out");
    declare_stream(broker, &stream).await;
    append(broker, &stream, ids("old", 0..300)).await;
    // Over AMQP, with the checkpoint queue of the AMQP path.
    let amqp = host(&config(broker, &stream, &output, "amqp", ""));
    assert_eq!(stamped_until(broker, &output, 300).await.len(), 300);
    assert!(amqp.terminate(Duration::from_secs(30)).unwrap().success());
    append(broker, &stream, ids("new", 0..200)).await;
    // Over the stream protocol: the broker tracks nothing yet, so the
    // checkpoint queue says where to resume; nothing old is read again.
    let moved = host(&config(broker, &stream, &output, "stream", ""));
    let seen = stamped_until(broker, &output, 200).await;
    let expected: Vec<String> = ids("new", 0..200);
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(seen.keys().cloned().collect::<Vec<_>>(), expected_sorted);
    assert!(moved.terminate(Duration::from_secs(30)).unwrap().success());
    assert_eq!(
        tracked_offset(broker, &stream, &format!("projection-{stream}")).await,
        Some(500)
    );
    broker
        .delete_queue(&format!("acemq.checkpoint.projection-{stream}"))
        .await
        .unwrap();
    broker.delete_queue(&stream).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn auto_reads_over_amqp_when_no_stream_listener_answers() {
    let broker = shared_broker();
    let stream = unique_name("sp.auto");
    let output = unique_name("sp.auto.out");
    declare_stream(broker, &stream).await;
    append(broker, &stream, ids("m", 0..50)).await;
    // A port nothing listens on.
    let lines = config(broker, &stream, &output, "auto", "").replace(
        &format!("stream_port = {}", broker.stream_port()),
        &format!("stream_port = {}", acemq_tests::host::free_port()),
    );
    let host = host(&lines);
    assert_eq!(stamped_until(broker, &output, 50).await.len(), 50);
    let log = host.log_text();
    assert!(
        log.contains(
            "this stream consumer reads over AMQP 0-9-1: the stream protocol is not available"
        ),
        "{log}"
    );
    assert!(host.terminate(Duration::from_secs(30)).unwrap().success());
    // And with the listener: the stream protocol.
    let host_2 = host_on_stream(broker, &stream, &output);
    assert!(host_2.terminate(Duration::from_secs(30)).unwrap().success());
    broker
        .delete_queue(&format!("acemq.checkpoint.projection-{stream}"))
        .await
        .unwrap();
    broker.delete_queue(&stream).await.unwrap();
}

/// A host with `stream_protocol = "auto"` and the broker's stream listener:
/// it says it reads over the stream protocol.
fn host_on_stream(broker: &Broker, stream: &str, output: &str) -> HostProcess {
    let host = host(&config(broker, stream, output, "auto", ""));
    let log = host.log_text();
    assert!(
        log.contains("this stream consumer reads over the stream protocol"),
        "{log}"
    );
    host
}

#[tokio::test(flavor = "multi_thread")]
async fn stream_reset_moves_the_broker_offset_tracking_and_replay_reads_either_way() {
    const MESSAGES: usize = 100;
    let broker = shared_broker();
    let stream = unique_name("sp.reset");
    let output = unique_name("sp.reset.out");
    declare_stream(broker, &stream).await;
    append(broker, &stream, ids("m", 0..MESSAGES)).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.toml");
    std::fs::write(&path, config(broker, &stream, &output, "stream", "")).unwrap();
    let first =
        HostProcess::start_with(&path, tempfile::tempdir().unwrap(), &HostOptions::default())
            .unwrap();
    assert_eq!(
        stamped_until(broker, &output, MESSAGES).await.len(),
        MESSAGES
    );
    assert!(first.terminate(Duration::from_secs(30)).unwrap().success());

    let consumer = format!("projection-{stream}");
    let run = |args: &[&str]| {
        let output = std::process::Command::new(acemq_tests::host::host_binary())
            .args(args)
            .arg("--config")
            .arg(&path)
            .env_remove("ACEMQ_URL")
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, said, err) = tokio::task::block_in_place(|| {
        run(&["stream", "reset", "--consumer", &consumer, "--to", "50"])
    });
    assert_eq!(code, Some(0), "{said}{err}");
    assert!(
        said.contains("the broker's offset tracking holds 50"),
        "{said}"
    );
    assert_eq!(tracked_offset(broker, &stream, &consumer).await, Some(50));

    // Restarted, it reads from offset 50 again: m50 to m99.
    let second =
        HostProcess::start_with(&path, tempfile::tempdir().unwrap(), &HostOptions::default())
            .unwrap();
    let again = stamped_until(broker, &output, MESSAGES / 2).await;
    let mut expected = ids("m", 50..MESSAGES);
    expected.sort();
    assert_eq!(again.keys().cloned().collect::<Vec<_>>(), expected);
    assert!(second.terminate(Duration::from_secs(30)).unwrap().success());

    // Replay reads the same history over either protocol.
    let stamp_v2 = plugin_path("stamp-v2");
    let replay = |protocol: &str| {
        let (code, table, err) = run(&[
            "replay",
            "--consumer",
            &consumer,
            "--compare",
            "--stream-protocol",
            protocol,
            "--plugin",
            stamp_v2.to_str().unwrap(),
        ]);
        assert_eq!(code, Some(3), "a candidate that differs: {table}{err}");
        assert!(
            table.contains(&format!("messages read: {MESSAGES}")),
            "{table}{err}"
        );
        assert!(
            table.contains(&format!("differing: {MESSAGES} of {MESSAGES}")),
            "{table}"
        );
        err
    };
    let over_stream = tokio::task::block_in_place(|| replay("stream"));
    assert!(
        over_stream.contains("replaying over the stream protocol"),
        "{over_stream}"
    );
    let over_amqp = tokio::task::block_in_place(|| replay("amqp"));
    assert!(
        !over_amqp.contains("replaying over the stream protocol"),
        "{over_amqp}"
    );
    broker
        .delete_queue(&format!("acemq.checkpoint.{consumer}"))
        .await
        .unwrap();
    broker.delete_queue(&stream).await.unwrap();
}

/// `config` with the stream listener at `port` (a proxy's, say) and, when
/// given, an admin endpoint at `admin`.
fn with_stream_port_and_admin(
    broker: &Broker,
    config: &str,
    port: u16,
    admin: Option<&str>,
) -> String {
    let mut config = config.replacen(
        &format!("stream_port = {}", broker.stream_port()),
        &format!("stream_port = {port}"),
        1,
    );
    if let Some(admin) = admin {
        config = format!("[host]\nadmin_listen = \"{admin}\"\n\n{config}");
    }
    config
}

fn get(url: &str) -> String {
    tokio::task::block_in_place(|| acemq_tests::host::http_get(url))
        .unwrap()
        .1
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_stream_connection_is_reopened_and_reading_resumes_skipping_nothing() {
    const MESSAGES: usize = 3000;
    const PREFETCH: usize = 10;
    let broker = shared_broker();
    let stream = unique_name("sp.lost");
    let output = unique_name("sp.lost.out");
    declare_stream(broker, &stream).await;
    append(broker, &stream, ids("m", 0..MESSAGES)).await;
    let upstream = format!("127.0.0.1:{}", broker.stream_port())
        .parse()
        .unwrap();
    let proxy = acemq_tests::FaultProxy::start(upstream).unwrap();
    let admin = format!("127.0.0.1:{}", acemq_tests::host::free_port());
    let config = with_stream_port_and_admin(
        broker,
        &config(
            broker,
            &stream,
            &output,
            "stream",
            &format!("prefetch = {PREFETCH}"),
        ),
        proxy.port(),
        Some(&admin),
    );
    let host = host(&config);
    broker
        .wait_for_message_count(&output, (MESSAGES / 3) as u32, Duration::from_secs(60))
        .await
        .unwrap();
    proxy.cut_all();
    let seen = stamped_until(broker, &output, MESSAGES).await;
    assert_eq!(seen.len(), MESSAGES, "no offset was skipped");
    // What was in hand when the connection dropped, no more: the next
    // subscription starts at the lowest offset not done.
    let again: usize = seen.values().map(|n| n - 1).sum();
    assert!(again <= PREFETCH, "{again} read twice");
    assert!(
        proxy.accepted() >= 2,
        "the stream connection was opened again"
    );
    let log = host.log_text();
    assert!(log.contains("the subscription to stream"), "{log}");
    // Back to normal: /health UP, the position at the end.
    let health: Value = serde_json::from_str(&get(&format!("http://{admin}/health"))).unwrap();
    assert_eq!(health["status"], "UP", "{health}");
    let metrics = get(&format!("http://{admin}/metrics"));
    let position =
        acemq_tests::host::metric_sum(&metrics, "acemq_stream_position", &[("queue", &stream)]);
    assert_eq!(position as usize, MESSAGES, "{metrics}");
    let labels = [("queue", stream.as_str()), ("protocol", "stream")];
    assert_eq!(
        acemq_tests::host::metric_sum(&metrics, "acemq_stream_protocol", &labels),
        1.0,
        "{metrics}"
    );
    assert!(host.terminate(Duration::from_secs(30)).unwrap().success());
    broker.delete_queue(&stream).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn on_the_stream_protocol_set_asides_go_beside_the_stream_and_a_retry_is_dead_lettered() {
    let broker = shared_broker();
    let stream = unique_name("sp.aside");
    let output = unique_name("sp.aside.out");
    declare_stream(broker, &stream).await;
    let config = config(broker, &stream, &output, "stream", "").replacen(
        &format!("plugin = \"{}\"", plugin_path("stamp-v1").display()),
        &format!("plugin = \"{}\"", plugin_path("outcomes").display()),
        1,
    );
    assert!(config.contains("outcomes"), "{config}");
    let host = host(&config);
    append(
        broker,
        &stream,
        ["reject:bad order", "park:later", "retry:db down", "accept"].map(String::from),
    )
    .await;
    let dead = broker
        .drain(&format!("{stream}.dlq"), 2, Duration::from_secs(30))
        .await
        .unwrap();
    let reasons: Vec<String> = dead.iter().map(|m| m.acemq_error()).collect();
    assert_eq!(dead.len(), 2, "{reasons:?}");
    assert!(
        reasons.iter().any(|r| r.contains("bad order")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.starts_with(&format!(
            "a handler reading the stream '{stream}' asked to retry message"
        ))),
        "{reasons:?}"
    );
    let parked = broker
        .drain(&format!("{stream}.parked"), 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(parked.len(), 1);
    assert!(parked[0].acemq_error().contains("later"));
    // Each set-aside done: the position passed all four.
    assert!(host.terminate(Duration::from_secs(30)).unwrap().success());
    assert_eq!(
        tracked_offset(broker, &stream, &format!("projection-{stream}")).await,
        Some(4)
    );
    for queue in [format!("{stream}.dlq"), format!("{stream}.parked"), stream] {
        broker.delete_queue(&queue).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hosts_with_one_consumer_name_on_the_stream_protocol_read_one_at_a_time() {
    const MESSAGES: usize = 1000;
    const LATER: usize = 200;
    let broker = shared_broker();
    let stream = unique_name("sp.pair");
    let output = unique_name("sp.pair.out");
    declare_stream(broker, &stream).await;
    append(broker, &stream, ids("m", 0..MESSAGES)).await;
    let config = config(broker, &stream, &output, "stream", "");
    let a = host(&config);
    let mut b = {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.toml");
        std::fs::write(&path, &config).unwrap();
        let options = HostOptions {
            consumers: 0,
            ..HostOptions::default()
        };
        HostProcess::start_with(&path, dir, &options).unwrap()
    };
    b.wait_for_log("standing by", 1, Duration::from_secs(60))
        .unwrap();
    let seen = stamped_until(broker, &output, MESSAGES).await;
    assert_eq!(seen.len(), MESSAGES);
    assert!(seen.values().all(|n| *n == 1), "read by one host only");
    assert!(a.terminate(Duration::from_secs(30)).unwrap().success());
    b.wait_for_log(acemq_tests::host::SUBSCRIBED, 1, Duration::from_secs(30))
        .unwrap();
    append(broker, &stream, ids("later", 0..LATER)).await;
    let seen = stamped_until(broker, &output, LATER).await;
    let mut expected = ids("later", 0..LATER);
    expected.sort();
    assert_eq!(seen.keys().cloned().collect::<Vec<_>>(), expected);
    assert!(seen.values().all(|n| *n == 1), "{seen:?}");
    assert!(b.terminate(Duration::from_secs(30)).unwrap().success());
    broker.delete_queue(&stream).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_broker_restart_a_stream_protocol_reader_resumes_and_skips_nothing() {
    const MESSAGES: usize = 3000;
    const PREFETCH: usize = 10;
    // A node of its own: it is restarted.
    let broker = tokio::task::block_in_place(Broker::start).unwrap();
    let stream = unique_name("sp.restart");
    let output = unique_name("sp.restart.out");
    declare_stream(&broker, &stream).await;
    append(&broker, &stream, ids("m", 0..MESSAGES)).await;
    let host = host(&config(
        &broker,
        &stream,
        &output,
        "stream",
        &format!("prefetch = {PREFETCH}"),
    ));
    broker
        .wait_for_message_count(&output, (MESSAGES / 3) as u32, Duration::from_secs(60))
        .await
        .unwrap();
    // Counted before the restart.
    let before = stamped_until(&broker, &output, 1).await;
    // The broker restarted as an operator restarts it (its application
    // stopped and started: every connection closes, the node's data stays).
    tokio::task::block_in_place(|| {
        broker.rabbitmqctl(&["stop_app"])?;
        broker.rabbitmqctl(&["start_app"])
    })
    .unwrap();
    let mut seen = stamped_until(&broker, &output, MESSAGES).await;
    for (input, times) in before {
        *seen.entry(input).or_insert(0) += times;
    }
    let missing: Vec<String> = ids("m", 0..MESSAGES)
        .into_iter()
        .filter(|id| !seen.contains_key(id))
        .collect();
    assert!(
        missing.is_empty(),
        "skipped {} ({:?}...)\n{}\n{}",
        missing.len(),
        missing.first(),
        host.log_text(),
        broker.log_tail(40)
    );
    assert!(host.terminate(Duration::from_secs(60)).unwrap().success());
    tokio::task::block_in_place(|| broker.stop()).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_lag_probe_finds_the_newest_offset_over_the_stream_protocol() {
    use acemq_host::broker::stream_protocol::probe::newest_offset;
    let broker = shared_broker();
    let stream = unique_name("sp.newest");
    declare_stream(broker, &stream).await;
    let endpoints = endpoints_of(broker);
    assert_eq!(
        newest_offset(&endpoints, &stream).await.unwrap(),
        None,
        "empty"
    );
    append(broker, &stream, ids("m", 0..25)).await;
    // Offsets count from 0: 25 messages end at 24.
    assert_eq!(newest_offset(&endpoints, &stream).await.unwrap(), Some(24));
    let missing = newest_offset(&endpoints, "sp.no-such-stream")
        .await
        .unwrap_err();
    assert!(missing.contains("does not exist"), "{missing}");
    broker.delete_queue(&stream).await.unwrap();
}
