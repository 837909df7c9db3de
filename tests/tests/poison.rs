//! Poison messages against a real broker: no message and no plugin output
//! can stop the host by its size. Each test sends one poison message in the
//! middle of other traffic on the same consumer, while a second consumer
//! has traffic of its own, and asserts that every message is settled
//! exactly once (the poison set aside with its reason, bounded), that the
//! traffic on both consumers kept flowing, and that the host is still
//! running at the end.
//!
//! Without the bounds, each of these closes the host's connection (a
//! content header over the broker's `frame_max` is a FRAME_ERROR) or
//! panics inside the publisher, and the traffic behind the poison stops.

use std::time::Duration;

use acemq_host::envelope::{Envelope, MAX_REASON_BYTES};
use acemq_tests::host::{InProcessHost, plugin_path};
use acemq_tests::{ReceivedMessage, shared_broker, unique_name};
use lapin::BasicProperties;

/// Traffic messages sent before and after the poison, on each consumer.
const TRAFFIC: usize = 10;
const WAIT: Duration = Duration::from_secs(60);
/// The poison consumer's `max_body_bytes` (the default is far bigger).
const MAX_BODY: usize = 1 << 20;

/// Sends `poison` to a consumer running the `outcomes` plugin, between
/// traffic that it parks, while a second consumer parks traffic of its own.
/// Returns the poison as set aside to `{queue}.{poison_lands_in}`.
/// How long one poison scenario may take in all: a stall fails the test
/// with a message instead of holding up the whole run.
const SCENARIO_LIMIT: Duration = Duration::from_secs(240);

async fn poison_among_traffic(poison: &[u8], poison_lands_in: &str) -> ReceivedMessage {
    let poison_text = String::from_utf8_lossy(&poison[..poison.len().min(40)]).into_owned();
    tokio::time::timeout(SCENARIO_LIMIT, poison_scenario(poison, poison_lands_in))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the poison scenario for {poison_text:?} did not finish within {SCENARIO_LIMIT:?}"
            )
        })
}

async fn poison_scenario(poison: &[u8], poison_lands_in: &str) -> ReceivedMessage {
    let broker = shared_broker();
    let queue = unique_name("poison");
    let other = unique_name("poison.other");
    let out = unique_name("poison.out");
    let config = format!(
        r#"
[broker]
url = "{url}"

[[exchanges]]
name = "{out}"
kind = "direct"

[[queues]]
name = "{queue}"
dead_letter = true

[[queues]]
name = "{other}"
dead_letter = true

[[bindings]]
queue = "{other}"
exchange = "{out}"
routing_key = "out"

[[consumers]]
queue = "{queue}"
plugin = "{plugin}"
publish_to = ["{out}"]
max_body_bytes = {MAX_BODY}

[consumers.config]
out_exchange = "{out}"

[[consumers]]
queue = "{other}"
plugin = "{plugin}"
"#,
        url = broker.amqp_url(),
        plugin = plugin_path("outcomes").display(),
    );
    let host = InProcessHost::start(&config).await.unwrap();

    let traffic = |q: &str, from: usize| -> Vec<(Vec<u8>, BasicProperties)> {
        (from..from + TRAFFIC)
            .map(|i| (format!("park:traffic {q} {i}").into_bytes(), properties()))
            .collect()
    };
    let send = |q: String, messages: Vec<(Vec<u8>, BasicProperties)>| async move {
        broker.publish_many("", &q, messages).await.unwrap();
    };
    // The other consumer's traffic flows while the poison is handled.
    let (_, _) = tokio::join!(
        send(other.clone(), traffic(&other, 0)),
        send(queue.clone(), traffic(&queue, 0)),
    );
    broker
        .publish("", &queue, poison, properties())
        .await
        .unwrap();
    let (_, _) = tokio::join!(
        send(queue.clone(), traffic(&queue, TRAFFIC)),
        send(other.clone(), traffic(&other, TRAFFIC)),
    );

    // Every traffic message, before and after the poison, on both consumers.
    let parked_poison = poison_lands_in == "parked";
    let expected = 2 * TRAFFIC + usize::from(parked_poison);
    let parked = broker
        .drain(&format!("{queue}.parked"), expected, WAIT)
        .await
        .unwrap();
    assert_eq!(parked.len(), expected, "the poison's consumer stopped");
    let others = broker
        .drain(&format!("{other}.parked"), 2 * TRAFFIC, WAIT)
        .await
        .unwrap();
    assert_eq!(others.len(), 2 * TRAFFIC, "the other consumer stopped");
    let (mut poisons, traffic): (Vec<_>, Vec<_>) = parked
        .into_iter()
        .partition(|m| !m.body_str().starts_with("park:traffic"));
    assert_eq!(traffic.len(), 2 * TRAFFIC);
    if !parked_poison {
        poisons = broker
            .drain(&format!("{queue}.{poison_lands_in}"), 1, WAIT)
            .await
            .unwrap();
    }
    assert_eq!(poisons.len(), 1, "the poison was not set aside");

    // Settled exactly once: nothing left behind or set aside twice.
    for q in [
        queue.clone(),
        format!("{queue}.dlq"),
        format!("{queue}.parked"),
        other.clone(),
        format!("{other}.dlq"),
        format!("{other}.parked"),
    ] {
        assert_eq!(broker.message_count(&q).await.unwrap(), 0, "{q}");
    }
    // Still running: stopping returns what the run returned.
    host.stop()
        .await
        .expect("the host ran until it was stopped");
    poisons.remove(0)
}

fn properties() -> BasicProperties {
    let envelope = Envelope::new("test.message", "acemq@test", 0);
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(envelope.id.as_str().into())
        .with_headers(envelope.to_headers(&Default::default()))
}

fn assert_bounded(error: &str) {
    assert!(error.len() <= MAX_REASON_BYTES, "{} bytes", error.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_200_000_character_reject_reason_is_cut_and_traffic_flows() {
    let poison = format!("reject:order {} is bad", "7".repeat(200_000));
    let copy = poison_among_traffic(poison.as_bytes(), "dlq").await;
    let error = copy.acemq_error();
    assert_bounded(&error);
    assert!(
        error.starts_with("the handler rejected it: order 777")
            && error.contains(" bytes] \u{2026} ")
            && error.ends_with("777 is bad"),
        "{error}"
    );
    assert_eq!(copy.body.len(), poison.len(), "the body is kept whole");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_10_mb_reject_reason_is_cut_and_traffic_flows() {
    let copy = poison_among_traffic(b"reject-long:10000000", "dlq").await;
    let error = copy.acemq_error();
    assert_bounded(&error);
    assert!(
        error.starts_with("the handler rejected it: long reason rrr")
            && error.contains("[cut 9,99")
            && error.ends_with("rrr end"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_output_with_200_kb_of_headers_fails_its_delivery_only() {
    let copy = poison_among_traffic(b"publish-headers:200000", "dlq").await;
    let error = copy.acemq_error();
    assert_bounded(&error);
    assert!(
        error.starts_with(
            "exhausted 1 attempt: publishing its outputs failed: the output to exchange"
        ) && error.contains("-byte frame the broker allows"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_output_with_a_300_byte_routing_key_is_refused_to_the_plugin() {
    let copy = poison_among_traffic(b"publish-key:300", "dlq").await;
    let error = copy.acemq_error();
    assert!(
        error.starts_with("exhausted 1 attempt: ")
            && error.contains("the routing key 'kkk")
            && error.contains("is 300 bytes long; at most 255 are allowed"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_input_over_max_body_bytes_is_parked_before_any_plugin_runs() {
    // A body the plugin would reject: parking it proves no plugin ran.
    let poison = format!("reject:{}", "b".repeat(MAX_BODY));
    let copy = poison_among_traffic(poison.as_bytes(), "parked").await;
    assert_eq!(
        copy.acemq_error(),
        format!(
            "its body is {} bytes, more than the {MAX_BODY} bytes this consumer accepts (max_body_bytes)",
            poison.len()
        )
    );
}

/// Bytes another client may put in a short string (a header name, the
/// message-id, the routing key) that are not UTF-8.
const NOT_UTF8: &[u8] = &[0xff, 0xfe];

/// Messages lapin could not parse (short strings that are not UTF-8) on a
/// queue of `queue_type` with no delivery limit, ahead of valid traffic,
/// while another queue of the same host has traffic of its own: each
/// poison is parked at its first delivery with its body and a reason
/// naming what was not UTF-8 and where, the traffic behind it flows, and
/// no connection of the host is closed for it.
async fn unreadable_poisons_are_parked_and_nothing_else_is_disturbed(queue_type: &str) {
    use acemq_tests::host::{free_port, http_get, metric_sum};
    use acemq_tests::raw_amqp::{RawMessage, RawValue, publish_raw};
    const ORDERS: usize = 200;
    let broker = shared_broker();
    let queue = unique_name("poison.utf8");
    let other = unique_name("poison.utf8.other");
    let fanout = unique_name("poison.utf8.fanout");
    let admin = format!("127.0.0.1:{}", free_port());
    let config = format!(
        r#"
[broker]
url = "{url}"

[host]
admin_listen = "{admin}"

[[exchanges]]
name = "{fanout}"
kind = "fanout"

[[queues]]
name = "{queue}"
type = "{queue_type}"
dead_letter = true

[[queues]]
name = "{other}"
dead_letter = true

[[bindings]]
queue = "{queue}"
exchange = "{fanout}"

[[consumers]]
queue = "{queue}"
plugin = "{plugin}"

[[consumers]]
queue = "{other}"
plugin = "{plugin}"
"#,
        url = broker.amqp_url(),
        plugin = plugin_path("outcomes").display(),
    );
    let host = InProcessHost::start(&config).await.unwrap();
    let poison = |exchange: &str, routing_key: &[u8]| RawMessage {
        exchange: exchange.as_bytes().to_vec(),
        routing_key: routing_key.to_vec(),
        message_id: Some(b"poison".to_vec()),
        content_type: None,
        headers: Vec::new(),
        body: b"park:poison, bytes kept \x00\xff".to_vec(),
    };
    let to_queue = || poison("", queue.as_bytes());
    let poisons = [
        RawMessage {
            headers: vec![(NOT_UTF8.to_vec(), RawValue::LongString(b"x".to_vec()))],
            ..to_queue()
        },
        RawMessage {
            headers: vec![(
                b"outer".to_vec(),
                RawValue::Table(vec![(NOT_UTF8.to_vec(), RawValue::I32(1))]),
            )],
            ..to_queue()
        },
        RawMessage {
            message_id: Some(NOT_UTF8.to_vec()),
            ..to_queue()
        },
        // The default exchange routes by queue name, which cannot be
        // anything but UTF-8: the fanout takes any routing key.
        poison(&fanout, NOT_UTF8),
    ];
    let reasons = [
        r#"the header name "\xff\xfe" is not UTF-8"#,
        r#"the header name "\xff\xfe" in the header "outer" is not UTF-8"#,
        r#"its message-id property is not UTF-8: "\xff\xfe""#,
        r#"the routing key is not UTF-8: "\xff\xfe""#,
    ];
    // The poison first: the orders wait behind it.
    publish_raw(
        broker.amqp_host(),
        broker.amqp_port(),
        "guest",
        "guest",
        "/",
        &poisons,
    )
    .await
    .unwrap();
    let orders = |q: &str| {
        (0..ORDERS)
            .map(|i| (format!("park:order {q} {i}").into_bytes(), properties()))
            .collect::<Vec<_>>()
    };
    let (_, _) = tokio::join!(
        async {
            broker
                .publish_many("", &other, orders(&other))
                .await
                .unwrap()
        },
        async {
            broker
                .publish_many("", &queue, orders(&queue))
                .await
                .unwrap()
        },
    );

    let parked = broker
        .drain(&format!("{queue}.parked"), ORDERS + poisons.len(), WAIT)
        .await
        .unwrap();
    let (set_aside, handled): (Vec<_>, Vec<_>) = parked
        .into_iter()
        .partition(|m| m.body.starts_with(b"park:poison"));
    assert_eq!(handled.len(), ORDERS, "the orders behind the poison");
    let mut errors: Vec<String> = set_aside.iter().map(|m| m.acemq_error()).collect();
    errors.sort();
    let mut expected: Vec<String> = reasons
        .iter()
        .map(|r| format!("it could not be read as it was sent: {r}"))
        .collect();
    expected.sort();
    assert_eq!(
        errors, expected,
        "each poison parked once, saying what and where"
    );
    for copy in &set_aside {
        assert_eq!(copy.body, poisons[0].body, "the body is kept byte for byte");
    }
    let others = broker
        .drain(&format!("{other}.parked"), ORDERS, WAIT)
        .await
        .unwrap();
    assert_eq!(others.len(), ORDERS, "the other consumer's traffic");
    for q in [&queue, &other] {
        assert_eq!(broker.message_count(q).await.unwrap(), 0, "{q}");
        assert_eq!(
            broker.message_count(&format!("{q}.dlq")).await.unwrap(),
            0,
            "{q}.dlq"
        );
    }
    // No connection was closed for it: nothing to recover from.
    let metrics = tokio::task::block_in_place(|| http_get(&format!("http://{admin}/metrics")))
        .unwrap()
        .1;
    for connection in ["consume", "publish"] {
        assert_eq!(
            metric_sum(
                &metrics,
                "acemq_connection_recoveries_total",
                &[("connection", connection)]
            ),
            0.0,
            "{connection}"
        );
    }
    host.stop()
        .await
        .expect("the host ran until it was stopped");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_header_name_message_id_or_routing_key_that_is_not_utf8_is_parked_from_a_quorum_queue_without_a_delivery_limit()
 {
    unreadable_poisons_are_parked_and_nothing_else_is_disturbed("quorum").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_header_name_message_id_or_routing_key_that_is_not_utf8_is_parked_from_a_classic_queue() {
    unreadable_poisons_are_parked_and_nothing_else_is_disturbed("classic").await;
}

/// The config of two consumers running the `outcomes` plugin: `queue`,
/// whose plugin publishes to `out_exchange` (which may not exist), and
/// `other`, with traffic of its own; `extra` is appended.
fn two_consumers(queue: &str, other: &str, out_exchange: &str, extra: &str) -> String {
    format!(
        r#"
[broker]
url = "{url}"

[[queues]]
name = "{queue}"
dead_letter = true

[[queues]]
name = "{other}"
dead_letter = true

[[consumers]]
queue = "{queue}"
plugin = "{plugin}"
publish_to = ["{out_exchange}"]

[consumers.config]
out_exchange = "{out_exchange}"

[[consumers]]
queue = "{other}"
plugin = "{plugin}"
{extra}
"#,
        url = shared_broker().amqp_url(),
        plugin = plugin_path("outcomes").display(),
    )
}

/// Sends `poison` among `park:` traffic on `queue`, and traffic to `other`;
/// returns once both consumers parked all their traffic.
async fn poison_between_traffic(queue: &str, other: &str, poison: &str) {
    let broker = shared_broker();
    let traffic = |from: usize| {
        (from..from + TRAFFIC)
            .map(|i| (format!("park:traffic {i}").into_bytes(), properties()))
            .collect::<Vec<_>>()
    };
    broker.publish_many("", other, traffic(0)).await.unwrap();
    broker.publish_many("", queue, traffic(0)).await.unwrap();
    broker
        .publish("", queue, poison.as_bytes(), properties())
        .await
        .unwrap();
    broker
        .publish_many("", queue, traffic(TRAFFIC))
        .await
        .unwrap();
    for (q, expected) in [(queue, 2 * TRAFFIC), (other, TRAFFIC)] {
        let parked = broker
            .drain(&format!("{q}.parked"), expected, WAIT)
            .await
            .unwrap();
        assert_eq!(parked.len(), expected, "the consumer of {q} stopped");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_output_to_a_missing_exchange_fails_its_delivery_only() {
    let broker = shared_broker();
    let (queue, other) = (
        unique_name("poison.missing"),
        unique_name("poison.missing.other"),
    );
    let missing = unique_name("poison.no-such-exchange");
    let host = InProcessHost::start(&two_consumers(&queue, &other, &missing, ""))
        .await
        .unwrap();
    poison_between_traffic(&queue, &other, "publish-to:anything").await;
    let dead = broker
        .drain(&format!("{queue}.dlq"), 1, WAIT)
        .await
        .unwrap();
    assert_eq!(
        dead.len(),
        1,
        "the delivery that published to nowhere is set aside"
    );
    let error = dead[0].acemq_error();
    assert!(error.contains("publishing its outputs failed"), "{error}");
    assert!(error.contains("NOT_FOUND - no exchange"), "{error}");
    assert_eq!(broker.message_count(&queue).await.unwrap(), 0);
    host.stop()
        .await
        .expect("the host ran until it was stopped");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unroutable_output_beside_a_nacked_one_fails_its_delivery_and_nothing_is_lost() {
    let broker = shared_broker();
    let (queue, other) = (unique_name("poison.nack"), unique_name("poison.nack.other"));
    let (out, full) = (
        unique_name("poison.nack.out"),
        unique_name("poison.nack.full"),
    );
    // `full` holds one message and refuses more (reject-publish: the broker
    // nacks a publish to it); key `nowhere` reaches no queue.
    let extra = format!(
        r#"
[[exchanges]]
name = "{out}"
kind = "direct"

[[queues]]
name = "{full}"
type = "classic"
arguments = {{ "x-max-length" = 1, "x-overflow" = "reject-publish" }}

[[bindings]]
queue = "{full}"
exchange = "{out}"
routing_key = "full"
"#
    );
    let host = InProcessHost::start(&two_consumers(&queue, &other, &out, &extra))
        .await
        .unwrap();
    broker
        .publish("", &full, b"the one it holds", properties())
        .await
        .unwrap();
    poison_between_traffic(&queue, &other, "publish-to:full,nowhere").await;
    let dead = broker
        .drain(&format!("{queue}.dlq"), 1, WAIT)
        .await
        .unwrap();
    assert_eq!(
        dead.len(),
        1,
        "the delivery whose outputs were not taken is set aside"
    );
    let error = dead[0].acemq_error();
    // Both failures are seen: the nack, and the return, whatever confirm it
    // came with.
    assert!(
        error.contains("2 of 2 messages were not confirmed; 0 were"),
        "{error}"
    );
    assert!(
        error.contains("the broker refused to confirm it"),
        "{error}"
    );
    assert_eq!(broker.message_count(&full).await.unwrap(), 1);
    host.stop()
        .await
        .expect("the host ran until it was stopped");
}

/// A `traceparent` whose bytes put a character of several bytes across the
/// edge of one of its fields: the host once sliced it by byte position and
/// panicked while reading the delivery, before its fault boundary, so the
/// delivery was requeued and panicked again, in a hot loop. Now it is not
/// a traceparent: the delivery starts a trace of its own, its handler runs
/// (it parks it, as its body says), and the traffic behind it flows.
#[tokio::test(flavor = "multi_thread")]
async fn a_traceparent_holding_characters_of_several_bytes_starts_a_new_trace_and_traffic_flows() {
    use lapin::types::{AMQPValue, LongString};
    const BAD: &str = "00-4bf92f3577b34da6a3ce929d0e0e473\u{e9}00f067aa0ba902b7-01";
    assert_eq!(BAD.len(), 55);
    let broker = shared_broker();
    let (queue, other) = (
        unique_name("poison.trace"),
        unique_name("poison.trace.other"),
    );
    let host = InProcessHost::start(&two_consumers(&queue, &other, "amq.direct", ""))
        .await
        .unwrap();
    let mut headers = properties().headers().clone().unwrap_or_default();
    headers.insert(
        "traceparent".into(),
        AMQPValue::LongString(LongString::from(BAD)),
    );
    let bad = properties().with_headers(headers);
    let traffic = |from: usize| {
        (from..from + TRAFFIC)
            .map(|i| (format!("park:traffic {i}").into_bytes(), properties()))
            .collect::<Vec<_>>()
    };
    broker.publish_many("", &other, traffic(0)).await.unwrap();
    broker.publish_many("", &queue, traffic(0)).await.unwrap();
    broker
        .publish("", &queue, b"park:its handler ran", bad)
        .await
        .unwrap();
    broker
        .publish_many("", &queue, traffic(TRAFFIC))
        .await
        .unwrap();
    let parked = broker
        .drain(&format!("{queue}.parked"), 2 * TRAFFIC + 1, WAIT)
        .await
        .unwrap();
    assert_eq!(
        parked.len(),
        2 * TRAFFIC + 1,
        "the consumer of {queue} stopped"
    );
    let copy = parked
        .iter()
        .find(|m| m.body == b"park:its handler ran")
        .expect("the delivery with the bad traceparent was handled");
    assert_eq!(copy.acemq_error(), "the handler parked it: its handler ran");
    // The copy's traceparent is the host's own publish span, of a new trace.
    let Some(AMQPValue::LongString(written)) = copy.header("traceparent") else {
        panic!(
            "no traceparent on the copy: {:?}",
            copy.header("traceparent")
        );
    };
    let written = String::from_utf8(written.as_bytes().to_vec()).unwrap();
    let parent = acemq_host::trace::TraceParent::parse(&written).expect("a valid traceparent");
    assert_ne!(
        parent.trace_id_hex().to_string(),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    let others = broker
        .drain(&format!("{other}.parked"), TRAFFIC, WAIT)
        .await
        .unwrap();
    assert_eq!(others.len(), TRAFFIC, "the other consumer stopped");
    assert_eq!(broker.message_count(&queue).await.unwrap(), 0);
    host.stop()
        .await
        .expect("the host ran until it was stopped");
}
