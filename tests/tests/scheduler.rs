//! The AceMQ scheduler on the real broker (contract §11), each test on a
//! vhost of its own (the scheduler's queues are vhost-wide):
//! - the `reminder` plugin's delayed outputs, 0.5 s, 3 s, 75 s and 11 min
//!   ahead, each delivered once, not before its due time and within the
//!   rung resolution after it, the `x-schedule-*` headers stripped and the
//!   content type carried (the 11-minute one goes down the real 10-minute
//!   rung: this binary takes 11 minutes, and `scripts/test` runs it beside
//!   the others);
//! - interop both ways: a message scheduled in Java's or Python's style is
//!   delivered by the host, and one the host scheduled is delivered by a
//!   control consumer that does only what the contract says;
//! - a host killed mid-hop loses nothing;
//! - a message on the control queue without its headers is rejected, and
//!   dead-lettered where an operator policy on the queue says;
//! - a due message nothing is bound for, or one whose next rung was
//!   deleted, waits on the 10 s rung and is delivered later, not lost.

use std::collections::BTreeMap;
use std::time::Duration;

use acemq_tests::host::{HostProcess, InProcessHost, metric_sum, plugin_path};
use acemq_tests::scheduler_peer::{
    self, Arrivals, DUE_QUEUE, Scheduled, Style, Vhost, now_ms, run_contract_control_consumer,
    schedule_as, scheduler_only_config,
};
use acemq_tests::{ReceivedMessage, shared_broker};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};
use tokio_util::sync::CancellationToken;

/// How late a delivery may be: the hops' own time on a busy machine (the
/// contract's resolution is a second; the host holds the last part of it).
const LATE_AT_MOST_MS: i64 = 2_500;

/// A host with the `reminder` plugin on `inputs`, publishing to the direct
/// exchange `reminders`, whose queue `reminders.due` takes every key.
fn reminder_config(vhost: &Vhost<'_>) -> String {
    format!(
        r#"
[broker]
url = "{url}"

[[exchanges]]
name = "reminders"
kind = "direct"

[[queues]]
name = "inputs"
dead_letter = true

[[queues]]
name = "reminders.due"

[[bindings]]
exchange = "reminders"
queue = "reminders.due"
routing_key = "reminder"

[[consumers]]
queue = "inputs"
plugin = "{plugin}"
publish_to = ["reminders"]
publish_delayed = true
[consumers.config]
to = "reminders"
"#,
        url = vhost.url,
        plugin = plugin_path("reminder").display(),
    )
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// An input asking for a reminder `delay_ms` from now.
fn remind_in(delay_ms: u64) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert("delay-ms".into(), AMQPValue::LongLongInt(delay_ms as i64));
    BasicProperties::default()
        .with_content_type("text/plain".into())
        .with_headers(headers)
}

fn header_names(message: &ReceivedMessage) -> Vec<String> {
    message
        .headers
        .inner()
        .keys()
        .map(|k| k.to_string())
        .collect()
}

fn assert_delivered_as_final(message: &ReceivedMessage) {
    let names = header_names(message);
    assert!(
        names.iter().all(|n| !n.starts_with("x-schedule-")),
        "x-schedule-* headers stripped: {names:?}"
    );
}

/// Lateness of an arrival at `at` for a reminder asked for at `asked` with
/// `delay_ms`: never negative (the host holds the last second), and within
/// the resolution.
fn assert_on_time(what: &str, asked: u64, delay_ms: u64, at: u64) {
    let late = at as i64 - (asked + delay_ms) as i64;
    assert!(late >= 0, "{what}: delivered {}ms early", -late);
    assert!(late <= LATE_AT_MOST_MS, "{what}: delivered {late}ms late");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_delays_are_delivered_once_on_their_due_time() {
    let vhost = Vhost::create(shared_broker(), "sched.delays").unwrap();
    let host = InProcessHost::start(&reminder_config(&vhost))
        .await
        .unwrap();
    let mut arrivals = Arrivals::watch(&vhost.url, "reminders.due").await.unwrap();

    let delays = [500u64, 3_000, 75_000, 660_000];
    let mut asked = BTreeMap::new();
    for delay in delays {
        let body = format!("in {delay} ms");
        asked.insert(body.clone(), (now_ms(), delay));
        vhost
            .broker
            .publish("", "inputs", body.as_bytes(), remind_in(delay))
            .await
            .unwrap();
    }
    // Every input is acked once its reminder is in the scheduler.
    vhost
        .broker
        .wait_for_message_count("inputs", 0, Duration::from_secs(30))
        .await
        .unwrap();

    let mut seen = Vec::new();
    for _ in delays {
        let (at, message) = arrivals.next(Duration::from_secs(700)).await.unwrap();
        let body = message.body_str().to_string();
        let (sent, delay) = asked[&body];
        println!("{body}: arrived {} ms after it was asked for", at - sent);
        assert_on_time(&body, sent, delay, at);
        assert_delivered_as_final(&message);
        assert_eq!(message.content_type.as_deref(), Some("text/plain"));
        assert_eq!(
            message.string_header("x-acemq-type").as_deref(),
            Some("reminder"),
            "the output's own type is back"
        );
        assert_eq!(message.routing_key, "reminder");
        seen.push(body);
    }
    let mut expected: Vec<String> = asked.keys().cloned().collect();
    seen.sort();
    expected.sort();
    assert_eq!(seen, expected, "each delivered once");
    assert!(
        arrivals
            .more_within(Duration::from_secs(3))
            .await
            .is_empty()
    );

    let rendered = host.metrics.render();
    assert_eq!(
        metric_sum(
            &rendered,
            "acemq_scheduler_scheduled_total",
            &[("queue", "inputs")]
        ),
        4.0
    );
    assert_eq!(
        metric_sum(&rendered, "acemq_scheduler_delivered_total", &[]),
        4.0
    );
    // The plugin's publish takes the first rung; the control consumer made
    // the rest of the way: the 75 s and 11 min ones went 10 s, then 1 s at
    // a time (around 20 hops in all).
    assert!(metric_sum(&rendered, "acemq_scheduler_hops_total", &[]) >= 10.0);
    assert!(
        metric_sum(
            &rendered,
            "acemq_scheduler_hops_total",
            &[("rung", "acemq.schedule.1s")]
        ) >= 5.0
    );
    host.stop().await.unwrap();
}

/// A host that runs the scheduler and no consumer of its own; final
/// deliveries to `orders` with `order.close` land in `orders.closing`.
fn scheduler_only(vhost: &Vhost<'_>) -> String {
    scheduler_only_config(&vhost.url, "orders", "orders.closing", "order.close")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_scheduled_in_java_and_python_style_are_delivered_by_the_host() {
    let vhost = Vhost::create(shared_broker(), "sched.foreign").unwrap();
    let host = InProcessHost::start(&scheduler_only(&vhost)).await.unwrap();
    let mut arrivals = Arrivals::watch(&vhost.url, "orders.closing").await.unwrap();
    let cases = [
        (Style::Java, Some("application/x-msgpack"), 2_500u64),
        (Style::Python, None, 1_500),
        // Overdue already (a scheduler that was down): delivered at once.
        (Style::Java, Some("text/plain"), 0),
    ];
    let mut asked = BTreeMap::new();
    for (index, (style, content_type, delay)) in cases.iter().enumerate() {
        let id = uuid::Uuid::new_v4().to_string();
        let due = if *delay == 0 {
            now_ms() - 30_000
        } else {
            now_ms() + delay
        };
        let body = format!("case {index}");
        schedule_as(
            &vhost.url,
            *style,
            &Scheduled {
                exchange: "orders",
                routing_key: "order.close",
                due_at_ms: due,
                body: body.as_bytes(),
                content_type: *content_type,
                id: &id,
            },
        )
        .await
        .unwrap();
        asked.insert(body, (due, *content_type, id));
    }
    for _ in cases {
        let (at, message) = arrivals.next(Duration::from_secs(30)).await.unwrap();
        let body = message.body_str().to_string();
        let (due, content_type, id) = &asked[&body];
        let late = at as i64 - *due as i64;
        if *due > now_ms() - 20_000 {
            assert!((0..=LATE_AT_MOST_MS).contains(&late), "{body}: {late}ms");
        }
        assert_delivered_as_final(&message);
        assert_eq!(
            message.content_type.as_deref(),
            Some(content_type.unwrap_or("application/json")),
            "{body}: the carried content type, JSON when none was carried"
        );
        assert_eq!(message.message_id.as_deref(), Some(id.as_str()));
        assert_eq!(
            message.string_header("x-acemq-type").as_deref(),
            Some("ScheduledMessage"),
            "delivered with the type its library gave it"
        );
    }
    assert!(
        arrivals
            .more_within(Duration::from_secs(2))
            .await
            .is_empty()
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_host_schedules_a_contract_control_consumer_delivers() {
    let vhost = Vhost::create(shared_broker(), "sched.tothem").unwrap();
    let host = InProcessHost::start(&reminder_config(&vhost))
        .await
        .unwrap();
    vhost
        .broker
        .publish("", "inputs", b"for them", remind_in(4_000))
        .await
        .unwrap();
    let asked = now_ms();
    vhost
        .broker
        .wait_for_message_count("inputs", 0, Duration::from_secs(30))
        .await
        .unwrap();
    // The host is gone before the message is due: another library's
    // control consumer takes over.
    host.stop().await.unwrap();
    let mut arrivals = Arrivals::watch(&vhost.url, "reminders.due").await.unwrap();
    let stop = CancellationToken::new();
    let url = vhost.url.clone();
    let theirs = tokio::spawn(run_contract_control_consumer_until(url, stop.clone()));
    let (at, message) = match arrivals.next(Duration::from_secs(30)).await {
        Ok(arrival) => arrival,
        Err(e) if theirs.is_finished() => {
            panic!("{e}; the contract consumer ended: {:?}", theirs.await)
        }
        Err(e) => {
            let mut counts = Vec::new();
            for (queue, _) in scheduler_peer::RUNGS.iter().chain([&(DUE_QUEUE, 0)]) {
                counts.push((queue, vhost.broker.message_count(queue).await.ok()));
            }
            panic!("{e}; the scheduler's queues hold {counts:?}")
        }
    };
    let late = at as i64 - (asked + 4_000) as i64;
    // A contract consumer delivers when under a second is left.
    assert!((-1_000..=LATE_AT_MOST_MS).contains(&late), "{late}ms");
    assert_eq!(message.body_str(), "for them");
    assert_delivered_as_final(&message);
    assert_eq!(message.content_type.as_deref(), Some("text/plain"));
    stop.cancel();
    theirs.await.unwrap().unwrap();
}

async fn run_contract_control_consumer_until(
    url: String,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    run_contract_control_consumer(&url, stop).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_mid_hop_loses_nothing() {
    const MESSAGES: usize = 300;
    let vhost = Vhost::create(shared_broker(), "sched.kill").unwrap();
    let config = scheduler_only(&vhost);
    let first = HostProcess::start(&config, 1).unwrap();
    let mut arrivals = Arrivals::watch(&vhost.url, "orders.closing").await.unwrap();
    // Due over the next few seconds: each goes down the 1 s rung a few
    // times, so the kill lands in the middle of hops.
    let mut ids = std::collections::BTreeSet::new();
    for index in 0..MESSAGES {
        let id = uuid::Uuid::new_v4().to_string();
        schedule_as(
            &vhost.url,
            Style::Java,
            &Scheduled {
                exchange: "orders",
                routing_key: "order.close",
                due_at_ms: now_ms() + 2_000 + (index as u64 % 40) * 100,
                body: b"{}",
                content_type: None,
                id: &id,
            },
        )
        .await
        .unwrap();
        ids.insert(id);
    }
    let (_, first_delivered) = arrivals.next(Duration::from_secs(30)).await.unwrap();
    // SIGKILL, with hops and deliveries in flight.
    drop(first);
    let second = HostProcess::start(&config, 1).unwrap();
    let mut seen = std::collections::BTreeSet::from([first_delivered.message_id.unwrap()]);
    let mut delivered = 1;
    while seen.len() < MESSAGES {
        let (_, message) = arrivals.next(Duration::from_secs(60)).await.unwrap();
        delivered += 1;
        seen.insert(message.message_id.unwrap());
    }
    delivered += arrivals.more_within(Duration::from_secs(3)).await.len();
    assert_eq!(seen, ids, "every scheduled message delivered");
    println!("{MESSAGES} scheduled, {delivered} deliveries (duplicates allowed after a kill)");
    second.terminate(Duration::from_secs(30)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_without_its_headers_is_rejected_to_where_the_queue_says() {
    let base = shared_broker();
    let vhost = Vhost::create(base, "sched.reject").unwrap();
    // An operator's policy gives the control queue a dead-letter exchange
    // (a policy, not an argument: the queue's declaration stays the
    // contract's, so every library can still declare it).
    base.rabbitmqctl(&[
        "set_policy",
        "-p",
        &vhost.name,
        "--apply-to",
        "queues",
        "schedule-rejects",
        "^acemq\\.schedule\\.due$",
        r#"{"dead-letter-exchange":"ops.rejected"}"#,
    ])
    .unwrap();
    let config = format!(
        "{}\n[[exchanges]]\nname = \"ops.rejected\"\nkind = \"fanout\"\n\n[[queues]]\nname = \"ops.rejected\"\n\n[[bindings]]\nexchange = \"ops.rejected\"\nqueue = \"ops.rejected\"\n",
        scheduler_only(&vhost)
    );
    let host = InProcessHost::start(&config).await.unwrap();
    let mut headers = FieldTable::default();
    headers.insert("x-schedule-exchange".into(), text("orders"));
    headers.insert(
        "x-schedule-due-at".into(),
        AMQPValue::LongLongInt(now_ms() as i64),
    );
    put_on_the_control_queue(&vhost, "no-routing-key", b"where to?", headers).await;
    let rejected = vhost
        .broker
        .drain("ops.rejected", 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(rejected[0].body_str(), "where to?");
    let Some(AMQPValue::FieldArray(deaths)) = rejected[0].header("x-death") else {
        panic!("dead-lettered by the broker: {:?}", rejected[0].headers);
    };
    let Some(AMQPValue::FieldTable(death)) = deaths.as_slice().first() else {
        panic!("one death: {deaths:?}");
    };
    assert_eq!(
        death.inner().get("reason"),
        Some(&text("rejected")),
        "{death:?}"
    );
    assert_eq!(death.inner().get("queue"), Some(&text(DUE_QUEUE)));
    let rendered = host.metrics.render();
    assert_eq!(
        metric_sum(
            &rendered,
            "acemq_scheduler_refused_total",
            &[("reason", "missing_header")]
        ),
        1.0
    );
    // And the scheduler goes on with the next message.
    let mut arrivals = Arrivals::watch(&vhost.url, "orders.closing").await.unwrap();
    schedule_as(
        &vhost.url,
        Style::Python,
        &Scheduled {
            exchange: "orders",
            routing_key: "order.close",
            due_at_ms: now_ms() + 1_200,
            body: b"{}",
            content_type: None,
            id: &uuid::Uuid::new_v4().to_string(),
        },
    )
    .await
    .unwrap();
    arrivals.next(Duration::from_secs(30)).await.unwrap();
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_message_nothing_is_bound_for_waits_and_is_delivered_once_it_can_be() {
    let vhost = Vhost::create(shared_broker(), "sched.unroutable").unwrap();
    let host = InProcessHost::start(&scheduler_only(&vhost)).await.unwrap();
    let id = uuid::Uuid::new_v4().to_string();
    let due = now_ms() + 1_200;
    schedule_as(
        &vhost.url,
        Style::Python,
        &Scheduled {
            exchange: "orders",
            routing_key: "order.nowhere",
            due_at_ms: due,
            body: b"{}",
            content_type: None,
            id: &id,
        },
    )
    .await
    .unwrap();
    // Due, and nothing takes it: counted, kept on the 10 s rung, overdue.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while metric_sum(
        &host.metrics.render(),
        "acemq_scheduler_undeliverable_total",
        &[("reason", "unroutable")],
    ) < 1.0
    {
        assert!(std::time::Instant::now() < deadline, "never undeliverable");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    vhost
        .broker
        .wait_for_message_count("acemq.schedule.10s", 1, Duration::from_secs(10))
        .await
        .unwrap();
    let overdue = host
        .metrics
        .scheduler
        .overdue
        .oldest(std::time::SystemTime::now());
    assert!(overdue.is_some_and(|d| d > Duration::ZERO), "{overdue:?}");

    // An operator binds a queue: the next try delivers it.
    let mut arrivals = Arrivals::watch(&vhost.url, "orders.closing").await.unwrap();
    bind(&vhost.url, "orders.closing", "orders", "order.nowhere").await;
    let (at, message) = arrivals.next(Duration::from_secs(30)).await.unwrap();
    assert_eq!(message.message_id.as_deref(), Some(id.as_str()));
    assert!(at > due + 5_000, "it waited on the 10 s rung");
    assert_delivered_as_final(&message);
    // Counted once its publish is confirmed, a moment after it arrived.
    let overdue = || {
        host.metrics
            .scheduler
            .overdue
            .oldest(std::time::SystemTime::now())
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while overdue().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "still overdue after its delivery: {:?}",
            overdue()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        arrivals
            .more_within(Duration::from_secs(2))
            .await
            .is_empty()
    );
    host.stop().await.unwrap();
}

async fn bind(url: &str, queue: &str, exchange: &str, routing_key: &str) {
    let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            routing_key.into(),
            lapin::options::QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    connection.close(200, "done".into()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_next_rung_was_deleted_waits_on_the_ten_second_rung() {
    let vhost = Vhost::create(shared_broker(), "sched.norung").unwrap();
    let host = InProcessHost::start(&scheduler_only(&vhost)).await.unwrap();
    let mut arrivals = Arrivals::watch(&vhost.url, "orders.closing").await.unwrap();
    vhost
        .broker
        .delete_queue("acemq.schedule.1s")
        .await
        .unwrap();
    // Three seconds left: its next stop would be the 1 s rung.
    let mut headers = FieldTable::default();
    headers.insert("x-schedule-exchange".into(), text("orders"));
    headers.insert("x-schedule-routing-key".into(), text("order.close"));
    let due = now_ms() + 3_000;
    headers.insert(
        "x-schedule-due-at".into(),
        AMQPValue::LongLongInt(due as i64),
    );
    put_on_the_control_queue(&vhost, "rung-gone", b"{}", headers).await;
    let (at, message) = arrivals.next(Duration::from_secs(30)).await.unwrap();
    assert_eq!(message.message_id.as_deref(), Some("rung-gone"));
    assert!(at >= due + 5_000, "it waited on the 10 s rung, not lost");
    assert_delivered_as_final(&message);
    host.stop().await.unwrap();
}

/// Puts a message with `headers`, written by hand, straight on the control
/// queue, as a rung's dead-lettering would.
async fn put_on_the_control_queue(vhost: &Vhost<'_>, id: &str, body: &[u8], headers: FieldTable) {
    vhost
        .broker
        .publish(
            scheduler_peer::EXCHANGE,
            DUE_QUEUE,
            body,
            BasicProperties::default()
                .with_message_id(id.into())
                .with_headers(headers),
        )
        .await
        .unwrap();
}
