//! Settlements against a real broker: each test drives one path of the
//! AceMQ contract (§3–§5) with the `outcomes` plugin and asserts the exact
//! headers of what lands where, and the counters.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use acemq_host::envelope::{self, Envelope};
use acemq_tests::host::{InProcessHost, plugin_path};
use acemq_tests::{ReceivedMessage, shared_broker, unique_name};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// One test's queue and the config around it.
struct Scenario {
    queue: String,
}

impl Scenario {
    fn new() -> Self {
        Self {
            queue: unique_name("settle"),
        }
    }

    fn dlq(&self) -> String {
        format!("{}.dlq", self.queue)
    }

    fn parked(&self) -> String {
        format!("{}.parked", self.queue)
    }

    /// A config with the `outcomes` plugin on the queue and `policy` (a
    /// `[retry.p]` body, or none).
    fn config(&self, plugin: &str, policy: Option<&str>) -> String {
        let (retry_table, retry_key) = match policy {
            Some(body) => (format!("[retry.p]\n{body}\n"), "retry = \"p\"\n"),
            None => (String::new(), ""),
        };
        format!(
            r#"
[broker]
url = "{url}"

[[queues]]
name = "{queue}"
dead_letter = true

{retry_table}
[[consumers]]
queue = "{queue}"
plugin = "{plugin}"
{retry_key}"#,
            url = shared_broker().amqp_url(),
            queue = self.queue,
            plugin = plugin_path(plugin).display(),
        )
    }

    /// Publishes `body` to the queue as an AceMQ message with a trace header;
    /// returns its envelope.
    async fn send(&self, body: &str, first_seen_ms: u64) -> Envelope {
        let mut envelope = Envelope::new("test.message", "acemq@test", first_seen_ms);
        envelope.first_seen_ms = first_seen_ms;
        let mut app = FieldTable::default();
        app.insert(
            "traceparent".into(),
            AMQPValue::LongString(LongString::from(TRACEPARENT)),
        );
        let properties = BasicProperties::default()
            .with_content_type("text/plain".into())
            .with_delivery_mode(2)
            .with_message_id(envelope.id.as_str().into())
            .with_headers(envelope.to_headers(&app));
        shared_broker()
            .publish("", &self.queue, body.as_bytes(), properties)
            .await
            .unwrap();
        envelope
    }

    async fn one_from(&self, queue: &str, timeout: Duration) -> ReceivedMessage {
        let mut got = shared_broker().drain(queue, 1, timeout).await.unwrap();
        assert_eq!(
            got.len(),
            1,
            "nothing arrived on {queue} within {timeout:?}"
        );
        got.remove(0)
    }
}

fn int(message: &ReceivedMessage, name: &str) -> Option<i64> {
    match message.header(name)? {
        AMQPValue::LongLongInt(v) => Some(*v),
        AMQPValue::LongInt(v) => Some(i64::from(*v)),
        AMQPValue::LongUInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortInt(v) => Some(i64::from(*v)),
        other => panic!("{name} is not an integer: {other:?}"),
    }
}

fn text(message: &ReceivedMessage, name: &str) -> Option<String> {
    match message.header(name)? {
        AMQPValue::LongString(v) => Some(v.to_string()),
        other => panic!("{name} is not a string: {other:?}"),
    }
}

/// The headers every republished copy must carry: the original envelope
/// (attempt as given), the original body, content type, and the trace
/// continued: same trace and flags, the span of the host's republish.
fn assert_copy_of(message: &ReceivedMessage, original: &Envelope, body: &str, attempt: i64) {
    assert_eq!(message.body_str(), body);
    assert_eq!(message.content_type.as_deref(), Some("text/plain"));
    assert_eq!(message.properties.delivery_mode(), &Some(2));
    assert_eq!(message.message_id.as_deref(), Some(original.id.as_str()));
    assert_eq!(
        text(message, "x-acemq-id").as_deref(),
        Some(original.id.as_str())
    );
    assert_eq!(
        text(message, "x-acemq-type").as_deref(),
        Some("test.message")
    );
    assert_eq!(int(message, "x-acemq-version"), Some(1));
    assert_eq!(
        text(message, "x-acemq-correlation").as_deref(),
        Some(original.id.as_str())
    );
    assert_eq!(int(message, "x-acemq-attempt"), Some(attempt));
    assert_eq!(
        int(message, "x-acemq-first-seen"),
        Some(original.first_seen_ms as i64)
    );
    let traceparent = text(message, "traceparent").expect("a traceparent");
    let (trace, span) = (&TRACEPARENT[..36], &TRACEPARENT[36..52]);
    assert!(
        traceparent.starts_with(trace) && traceparent.ends_with("-01"),
        "{traceparent} does not continue {TRACEPARENT}"
    );
    assert_ne!(
        &traceparent[36..52],
        span,
        "{traceparent} is not a new span"
    );
}

async fn settle_one(scenario: &Scenario, host: &InProcessHost, outcome: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while host.metrics.consumed_count(&scenario.queue, outcome) == 0 {
        assert!(
            Instant::now() < deadline,
            "no {outcome} settlement within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn accept_acks_and_counts_once() {
    let s = Scenario::new();
    let host = InProcessHost::start(&s.config("outcomes", None))
        .await
        .unwrap();
    s.send("accept", now_ms()).await;
    settle_one(&s, &host, "acked").await;
    let broker = shared_broker();
    assert_eq!(broker.message_count(&s.queue).await.unwrap(), 0);
    assert_eq!(broker.message_count(&s.dlq()).await.unwrap(), 0);
    for other in ["retried", "dead_lettered", "rejected", "parked"] {
        assert_eq!(host.metrics.consumed_count(&s.queue, other), 0, "{other}");
    }
    assert_eq!(host.metrics.consumed_count(&s.queue, "acked"), 1);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn reject_dead_letters_with_the_reason() {
    let s = Scenario::new();
    let host = InProcessHost::start(&s.config("outcomes", None))
        .await
        .unwrap();
    let original = s.send("reject:bad input", now_ms()).await;
    let dead = s.one_from(&s.dlq(), Duration::from_secs(20)).await;
    assert_copy_of(&dead, &original, "reject:bad input", 1);
    assert_eq!(
        text(&dead, "x-acemq-error").as_deref(),
        Some("the handler rejected it: bad input")
    );
    settle_one(&s, &host, "rejected").await;
    assert_eq!(host.metrics.consumed_count(&s.queue, "rejected"), 1);
    assert_eq!(host.metrics.consumed_count(&s.queue, "acked"), 0);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn park_sets_the_message_aside() {
    let s = Scenario::new();
    let host = InProcessHost::start(&s.config("outcomes", None))
        .await
        .unwrap();
    let original = s.send("park:needs a person", now_ms()).await;
    let parked = s.one_from(&s.parked(), Duration::from_secs(20)).await;
    assert_copy_of(&parked, &original, "park:needs a person", 1);
    assert_eq!(
        text(&parked, "x-acemq-error").as_deref(),
        Some("the handler parked it: needs a person")
    );
    settle_one(&s, &host, "parked").await;
    assert_eq!(host.metrics.consumed_count(&s.queue, "parked"), 1);
    assert_eq!(shared_broker().message_count(&s.dlq()).await.unwrap(), 0);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_without_a_policy_is_dead_lettered() {
    let s = Scenario::new();
    let host = InProcessHost::start(&s.config("outcomes", None))
        .await
        .unwrap();
    let original = s.send("retry:db down", now_ms()).await;
    let dead = s.one_from(&s.dlq(), Duration::from_secs(20)).await;
    assert_copy_of(&dead, &original, "retry:db down", 1);
    assert_eq!(
        text(&dead, "x-acemq-error").as_deref(),
        Some("exhausted 1 attempt: db down")
    );
    settle_one(&s, &host, "dead_lettered").await;
    assert_eq!(host.metrics.consumed_count(&s.queue, "dead_lettered"), 1);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn consumer_waits_retry_then_exhaust_to_the_dlq() {
    let s = Scenario::new();
    // 3 deliveries, 1 s apart, waited in the consumer (below the 30 s threshold).
    let config = s.config(
        "outcomes",
        Some("kind = \"fixed\"\nattempts = 3\ninitial = \"1s\""),
    );
    let host = InProcessHost::start(&config).await.unwrap();
    let started = Instant::now();
    let original = s.send("retry:still down", now_ms()).await;
    let dead = s.one_from(&s.dlq(), Duration::from_secs(30)).await;
    // Two fixed waits of 1 s (no jitter on a fixed policy).
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        started.elapsed()
    );
    assert_copy_of(&dead, &original, "retry:still down", 3);
    assert_eq!(
        text(&dead, "x-acemq-error").as_deref(),
        Some("exhausted 3 attempts: still down")
    );
    assert_eq!(host.metrics.consumed_count(&s.queue, "retried"), 2);
    settle_one(&s, &host, "dead_lettered").await;
    assert_eq!(host.metrics.consumed_count(&s.queue, "dead_lettered"), 1);
    let rendered = host.metrics.render();
    assert!(
        rendered.contains(&format!(
            "acemq_messages_retried_total{{queue=\"{}\",where=\"consumer\"}} 2",
            s.queue
        )),
        "{rendered}"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_that_succeeds_is_acked_after_its_wait() {
    let s = Scenario::new();
    let config = s.config(
        "outcomes",
        Some("kind = \"fixed\"\nattempts = 3\ninitial = \"1s\""),
    );
    let host = InProcessHost::start(&config).await.unwrap();
    s.send("retry-until:2:flaky", now_ms()).await;
    // Both settlements, in whichever order they are counted: the first
    // delivery's task counts "retried" once its ack is settled, which can
    // come after the republished copy was handled and counted "acked".
    settle_one(&s, &host, "acked").await;
    settle_one(&s, &host, "retried").await;
    assert_eq!(host.metrics.consumed_count(&s.queue, "acked"), 1);
    assert_eq!(host.metrics.consumed_count(&s.queue, "retried"), 1);
    assert_eq!(shared_broker().message_count(&s.dlq()).await.unwrap(), 0);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_wait_round_trips_through_the_rung() {
    let s = Scenario::new();
    // A 2 s delay waited on a broker rung: the threshold is lowered to 1 s.
    let config = s.config(
        "outcomes",
        Some("kind = \"fixed\"\nattempts = 2\ninitial = \"2s\"\nwait_in_broker_from = \"1s\""),
    );
    let host = InProcessHost::start(&config).await.unwrap();
    let rung = format!("{}.retry.2s", s.queue);
    let info = shared_broker().queue_info(&rung).unwrap();
    assert_eq!(
        info["arguments"],
        serde_json::json!({
            "x-message-ttl": 2000,
            "x-dead-letter-exchange": "acemq.retry",
            "x-dead-letter-routing-key": s.queue,
        })
    );

    let original = s.send("retry:not yet", now_ms()).await;
    let dead = s.one_from(&s.dlq(), Duration::from_secs(30)).await;
    assert_copy_of(&dead, &original, "retry:not yet", 2);
    assert_eq!(
        text(&dead, "x-acemq-error").as_deref(),
        Some("exhausted 2 attempts: not yet")
    );
    // The broker's own record of the rung trip rides along untouched.
    let Some(AMQPValue::FieldArray(deaths)) = dead.header("x-death") else {
        panic!("x-death missing: {:?}", dead.headers);
    };
    let AMQPValue::FieldTable(death) = &deaths.as_slice()[0] else {
        panic!("x-death entry is not a table");
    };
    let queue_of_death = death.inner().get("queue").cloned();
    assert_eq!(
        queue_of_death,
        Some(AMQPValue::LongString(LongString::from(rung.as_str())))
    );
    settle_one(&s, &host, "dead_lettered").await;
    let rendered = host.metrics.render();
    assert!(
        rendered.contains(&format!(
            "acemq_messages_retried_total{{queue=\"{}\",where=\"broker\"}} 1",
            s.queue
        )),
        "{rendered}"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_older_than_the_age_limit_is_not_retried() {
    let s = Scenario::new();
    let config = s.config(
        "outcomes",
        Some("kind = \"fixed\"\nattempts = 5\ninitial = \"1s\"\ngive_up_after = \"1m\""),
    );
    let host = InProcessHost::start(&config).await.unwrap();
    let two_minutes_ago = now_ms() - 120_000;
    let original = s.send("retry:slow", two_minutes_ago).await;
    let dead = s.one_from(&s.dlq(), Duration::from_secs(20)).await;
    assert_copy_of(&dead, &original, "retry:slow", 1);
    assert_eq!(
        text(&dead, "x-acemq-error").as_deref(),
        Some("exceeded the maximum message age of 1m: slow")
    );
    settle_one(&s, &host, "dead_lettered").await;
    assert_eq!(host.metrics.consumed_count(&s.queue, "retried"), 0);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_rung_falls_back_to_a_consumer_wait() {
    let s = Scenario::new();
    let config = s.config(
        "outcomes",
        Some("kind = \"fixed\"\nattempts = 2\ninitial = \"2s\"\nwait_in_broker_from = \"1s\""),
    );
    let host = InProcessHost::start(&config).await.unwrap();
    let rung = format!("{}.retry.2s", s.queue);
    shared_broker().delete_queue(&rung).await.unwrap();
    s.send("retry-until:2:later", now_ms()).await;
    settle_one(&s, &host, "acked").await;
    let rendered = host.metrics.render();
    assert!(
        rendered.contains(&format!(
            "acemq_retry_rung_missing_total{{queue=\"{}\",rung=\"{rung}\"}} 1",
            s.queue
        )),
        "{rendered}"
    );
    assert!(
        rendered.contains(&format!(
            "acemq_messages_retried_total{{queue=\"{}\",where=\"consumer\"}} 1",
            s.queue
        )),
        "{rendered}"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_during_a_consumer_wait_requeues_without_advancing_the_attempt() {
    let s = Scenario::new();
    let config = s.config(
        "outcomes",
        Some("kind = \"fixed\"\nattempts = 3\ninitial = \"20s\"\nwait_in_broker_from = \"0s\""),
    );
    let host = InProcessHost::start(&config).await.unwrap();
    let original = s.send("retry:wait for me", now_ms()).await;
    // Wait until the host holds the delivery (no longer ready in the queue).
    let deadline = Instant::now() + Duration::from_secs(20);
    while shared_broker().message_count(&s.queue).await.unwrap() > 0 {
        assert!(Instant::now() < deadline, "the host never took the message");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the handler run and the 20 s wait begin.
    tokio::time::sleep(Duration::from_millis(500)).await;
    host.stop().await.unwrap();
    let back = s.one_from(&s.queue, Duration::from_secs(10)).await;
    assert_eq!(
        text(&back, "x-acemq-id").as_deref(),
        Some(original.id.as_str())
    );
    assert_eq!(
        int(&back, "x-acemq-attempt"),
        Some(1),
        "the attempt must not advance"
    );
    assert!(back.redelivered);
}

#[test]
fn reserved_prefix_is_what_the_envelope_module_strips() {
    // Guards the assumption the header assertions above rely on.
    assert!(envelope::is_reserved("x-acemq-attempt"));
    assert!(!envelope::is_reserved("traceparent"));
}
