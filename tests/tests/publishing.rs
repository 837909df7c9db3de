//! Confirmed publishing against a real broker. Batches published at the
//! same time share a round (one channel, coalesced confirms), and each
//! batch still learns exactly which of its own messages no queue took.
//! Batches take their places among the unconfirmed in one step, so batches
//! that together need more places than there are go out one after the
//! other instead of each holding part; a confirm that does not come in
//! time is the broker's trouble, not the message's.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_host::broker::publisher::Publication;
use acemq_host::broker::{PublishError, PublishSettings, Publisher};
use acemq_tests::host::{InProcessHost, metric_sum, plugin_path};
use acemq_tests::{Broker, FaultProxy, publish_link, publish_link_to};
use acemq_tests::{shared_broker, unique_name};
use lapin::BasicProperties;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use tokio::task::JoinSet;

const BATCHES: usize = 100;
const PER_BATCH: usize = 5;
/// Unroutable messages in an odd batch (its odd-numbered ones).
const UNROUTABLE: usize = PER_BATCH / 2;

/// Message `j` of batch `i`: the odd-numbered messages of every odd batch
/// go where no queue is bound; every other one goes to `queue`.
fn publication(queue: &str, nowhere: &str, i: usize, j: usize) -> Publication {
    let routing_key = if i % 2 == 1 && j % 2 == 1 {
        nowhere
    } else {
        queue
    };
    Publication {
        exchange: String::new(),
        routing_key: routing_key.to_string(),
        body: format!("{i}/{j}").into_bytes().into(),
        properties: BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(format!("m-{i}-{j}").into()),
        mandatory: true,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_batches_each_learn_which_of_their_messages_were_unroutable() {
    let broker = shared_broker();
    let connection = Arc::new(broker.connect().await.unwrap());
    let queue = unique_name("publishing.in");
    let nowhere = unique_name("publishing.nowhere");
    connection
        .create_channel()
        .await
        .unwrap()
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();

    let publisher = Arc::new(Publisher::new(publish_link(broker).await));
    let mut batches = JoinSet::new();
    for i in 0..BATCHES {
        let publisher = publisher.clone();
        let batch: Vec<Publication> = (0..PER_BATCH)
            .map(|j| publication(&queue, &nowhere, i, j))
            .collect();
        batches.spawn(async move { (i, publisher.publish_all(&batch).await) });
    }
    let mut results = Vec::new();
    while let Some(done) = batches.join_next().await {
        results.push(done.unwrap());
    }
    results.sort_by_key(|(i, _)| *i);

    for (i, result) in results {
        if i % 2 == 0 {
            assert!(result.is_ok(), "batch {i}: {result:?}");
            continue;
        }
        let Err(PublishError::Batch {
            failed,
            total,
            confirmed,
            first,
            broker_trouble,
        }) = result
        else {
            panic!("batch {i}: unroutable messages expected, got {result:?}")
        };
        assert_eq!(
            (failed, total, confirmed),
            (UNROUTABLE, PER_BATCH, PER_BATCH - UNROUTABLE),
            "batch {i}"
        );
        assert!(
            !broker_trouble,
            "batch {i}: unroutable is the message's fault"
        );
        match *first {
            PublishError::Unroutable {
                id,
                routing_key,
                reason,
                ..
            } => {
                assert_eq!(id, format!("m-{i}-1"), "batch {i}");
                assert_eq!(routing_key, nowhere);
                assert_eq!(reason, "no queue is bound to receive it");
            }
            other => panic!("batch {i}: {other}"),
        }
    }
    // Every routable message arrived, once.
    let routable = BATCHES * PER_BATCH - BATCHES / 2 * UNROUTABLE;
    let arrived = broker
        .drain(&queue, routable, std::time::Duration::from_secs(20))
        .await
        .unwrap();
    let mut ids: Vec<String> = arrived.iter().map(|m| m.body_str().into_owned()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), routable);
    assert_eq!(broker.message_count(&queue).await.unwrap(), 0);
    broker.delete_queue(&queue).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_optional_message_that_reaches_no_queue_is_confirmed_and_a_mandatory_one_fails() {
    let broker = shared_broker();
    let publisher = Publisher::new(publish_link(broker).await);
    let nowhere = unique_name("publishing.unbound");
    let message = |mandatory| Publication {
        exchange: String::new(),
        routing_key: nowhere.clone(),
        body: b"{}".to_vec().into(),
        properties: BasicProperties::default().with_message_id("m-1".into()),
        mandatory,
    };
    assert!(publisher.publish(&message(false)).await.is_ok());
    match publisher.publish(&message(true)).await {
        Err(PublishError::Unroutable { id, reason, .. }) => {
            assert_eq!(id, "m-1");
            assert_eq!(reason, "no queue is bound to receive it");
        }
        other => panic!("a mandatory message to no queue must fail as unroutable: {other:?}"),
    }
}

/// Declares a durable classic queue named `queue`.
async fn declare_queue(broker: &Broker, queue: &str) {
    broker.declare_queue(queue, "classic", &[]).await.unwrap();
}

fn to_queue(queue: &str, id: String) -> Publication {
    Publication {
        exchange: String::new(),
        routing_key: queue.to_string(),
        body: id.clone().into_bytes().into(),
        properties: BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(id.into()),
        mandatory: true,
    }
}

/// Four batches of 950 (under the default `max_outputs` of 1000), on two
/// consumers' publishers at once, against the default 1000 places: any two
/// of them need more places than there are. Taken one message at a time,
/// each batch held part of the places and waited for the rest, none
/// confirmed anything (confirms were read only once a batch was written),
/// and after 10 s each declined what it had not written. Taken whole, they
/// go out one after the other, each message once.
#[tokio::test(flavor = "multi_thread")]
async fn batches_that_together_need_more_places_than_there_are_each_go_out_whole() {
    const BATCHES: usize = 4;
    const PER_BATCH: usize = 950;
    let broker = shared_broker();
    let queue = unique_name("publishing.places");
    declare_queue(broker, &queue).await;
    let link = publish_link(broker).await;
    let publishers = [
        Arc::new(Publisher::new(link.clone())),
        Arc::new(Publisher::new(link.clone())),
    ];
    let mut batches = JoinSet::new();
    for i in 0..BATCHES {
        let publisher = publishers[i % 2].clone();
        let batch: Vec<Publication> = (0..PER_BATCH)
            .map(|j| to_queue(&queue, format!("m-{i}-{j}")))
            .collect();
        batches.spawn(async move { (i, publisher.publish_all(&batch).await) });
    }
    while let Some(done) = batches.join_next().await {
        let (i, result) = done.unwrap();
        assert!(result.is_ok(), "batch {i}: {result:?}");
    }
    let total = BATCHES * PER_BATCH;
    let arrived = broker
        .drain(&queue, total + 1, Duration::from_secs(5))
        .await
        .unwrap();
    let ids: BTreeSet<String> = arrived.iter().map(|m| m.body_str().into_owned()).collect();
    assert_eq!(arrived.len(), total, "each message once");
    assert_eq!(ids.len(), total);
    broker.delete_queue(&queue).await.unwrap();
}

/// A batch larger than every place there is could never hold its places
/// at once: it is refused unsent, as the message's (the config's) fault,
/// not held as broker trouble for ever. The config keeps plugin outputs
/// below this; see `max_outputs`.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_larger_than_max_unconfirmed_is_refused_unsent() {
    let broker = shared_broker();
    let queue = unique_name("publishing.toolarge");
    declare_queue(broker, &queue).await;
    let settings = PublishSettings {
        max_unconfirmed: 10,
        ..PublishSettings::default()
    };
    let publisher = Publisher::new(publish_link_to(broker.amqp_url(), settings).await);
    let batch: Vec<Publication> = (0..11)
        .map(|j| to_queue(&queue, format!("m-{j}")))
        .collect();
    let started = Instant::now();
    let error = publisher.publish_all(&batch).await.unwrap_err();
    assert!(!error.is_broker_trouble(), "{error}");
    assert!(
        error.to_string().contains(
            "its batch of 11 messages is larger than the 10 publishes that may wait for a confirm at once ([broker] max_unconfirmed)"
        ),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused at once"
    );
    assert_eq!(broker.message_count(&queue).await.unwrap(), 0);
    // Ten fit.
    publisher.publish_all(&batch[..10]).await.unwrap();
    broker.delete_queue(&queue).await.unwrap();
}

/// A confirm that does not come within `confirm_timeout` (the broker is
/// slow: here, every byte to and from it is delayed past the timeout) is
/// broker trouble: the message most likely arrives, and its input must be
/// held and published again, not failed. It did arrive.
#[tokio::test(flavor = "multi_thread")]
async fn a_confirm_that_times_out_is_broker_trouble_and_the_message_still_arrives() {
    let broker = shared_broker();
    let queue = unique_name("publishing.slow");
    declare_queue(broker, &queue).await;
    let proxy = FaultProxy::start(broker.amqp_addr()).unwrap();
    let settings = PublishSettings {
        confirm_timeout: Duration::from_millis(500),
        ..PublishSettings::default()
    };
    let publisher =
        Publisher::new(publish_link_to(&broker.amqp_url_via(proxy.port()), settings).await);
    // Opens and pools the publishing channel while the broker is quick.
    publisher
        .publish(&to_queue(&queue, "quick".into()))
        .await
        .unwrap();
    proxy.set_latency(Duration::from_millis(800));
    let error = publisher
        .publish(&to_queue(&queue, "slow".into()))
        .await
        .unwrap_err();
    assert!(
        matches!(error, PublishError::Interrupted { .. }),
        "a confirm timeout is an interruption: {error:?}"
    );
    assert!(error.is_broker_trouble(), "{error}");
    assert!(
        error.to_string().ends_with(
            "may not have been sent: no confirm came within 500ms; the broker is not keeping up"
        ),
        "{error}"
    );
    proxy.set_latency(Duration::ZERO);
    let arrived = broker
        .wait_for_message_count(&queue, 2, Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(arrived, 2, "the publish that timed out still arrived");
    broker.delete_queue(&queue).await.unwrap();
}

/// The host's config for the consumer `queue` of the `outcomes` plugin,
/// publishing to `out`, whose `o` key routes to `sink`; `extra` is added to
/// the consumer's table and `broker` to `[broker]`.
fn outcomes_host(
    url: &str,
    queue: &str,
    out: &str,
    sink: &str,
    broker: &str,
    extra: &str,
) -> String {
    format!(
        r#"
[broker]
url = "{url}"
{broker}

[[exchanges]]
name = "{out}"
kind = "direct"

[[queues]]
name = "{queue}"

[[queues]]
name = "{sink}"
type = "classic"

[[bindings]]
queue = "{sink}"
exchange = "{out}"
routing_key = "o"

[[consumers]]
queue = "{queue}"
plugin = "{plugin}"
publish_to = ["{out}"]
{extra}

[consumers.config]
out_exchange = "{out}"
"#,
        plugin = plugin_path("outcomes").display(),
    )
}

fn text() -> BasicProperties {
    BasicProperties::default().with_content_type("text/plain".into())
}

/// The measured scenario of the places defect: four inputs of 950 outputs
/// each, two handler calls at a time, the default 1000 places. Before, 1000
/// of the 3800 outputs were out after 90 s and the inputs sat unacked; now
/// every input is handled and every output published exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn four_inputs_of_950_outputs_two_at_a_time_are_all_published_exactly_once() {
    const INPUTS: usize = 4;
    const OUTPUTS: usize = 950;
    let broker = shared_broker();
    let queue = unique_name("publishing.fanout");
    let out = unique_name("publishing.fanout.out");
    let sink = unique_name("publishing.fanout.sink");
    let config = outcomes_host(
        broker.amqp_url(),
        &queue,
        &out,
        &sink,
        "",
        "concurrency = 2",
    );
    let host = InProcessHost::start(&config).await.unwrap();
    let body = format!("publish-to:{}", vec!["o"; OUTPUTS].join(","));
    let started = Instant::now();
    broker
        .publish_many(
            "",
            &queue,
            (0..INPUTS).map(|i| {
                (
                    body.as_str(),
                    text().with_message_id(format!("input-{i}").into()),
                )
            }),
        )
        .await
        .unwrap();
    let total = INPUTS * OUTPUTS;
    // A bound against a hang, not a speed: it takes about a second.
    let count = broker
        .wait_for_message_count(&sink, total as u32, Duration::from_secs(90))
        .await
        .unwrap();
    assert_eq!(count as usize, total, "after {:?}", started.elapsed());
    eprintln!(
        "{total} outputs of {INPUTS} inputs published in {:?}",
        started.elapsed()
    );
    let settled = tokio::time::Instant::now() + Duration::from_secs(30);
    while host.metrics.consumed_count(&queue, "acked") < INPUTS as u64 {
        assert!(
            tokio::time::Instant::now() < settled,
            "every input is acked"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics = host.metrics.render();
    host.stop().await.unwrap();
    let outputs = broker
        .drain(&sink, total + 1, Duration::from_secs(3))
        .await
        .unwrap();
    let ids: BTreeSet<String> = outputs
        .iter()
        .map(|m| m.message_id.clone().expect("an output has an id"))
        .collect();
    assert_eq!(outputs.len(), total, "no output published twice");
    assert_eq!(ids.len(), total);
    assert_eq!(broker.message_count(&queue).await.unwrap(), 0);
    let publish = |outcome| {
        metric_sum(
            &metrics,
            "acemq_publish_total",
            &[("exchange", out.as_str()), ("outcome", outcome)],
        )
    };
    assert_eq!(publish("confirmed"), total as f64, "{metrics}");
    assert_eq!(publish("refused"), 0.0, "{metrics}");
    assert_eq!(
        metric_sum(
            &metrics,
            "acemq_consume_total",
            &[("queue", &queue), ("outcome", "dead_lettered")]
        ),
        0.0
    );
}

/// A confirm that does not come in time (every byte to and from the broker
/// delayed past `confirm_timeout`) no longer fails the input: with no retry
/// policy it was dead-lettered at once, although its output had most likely
/// landed. It is held and published again once the broker keeps up, then
/// acked; nothing is dead-lettered.
#[tokio::test(flavor = "multi_thread")]
async fn an_input_whose_confirm_times_out_is_held_not_dead_lettered() {
    let broker = shared_broker();
    let queue = unique_name("publishing.timeout");
    let out = unique_name("publishing.timeout.out");
    let sink = unique_name("publishing.timeout.sink");
    let proxy = FaultProxy::start(broker.amqp_addr()).unwrap();
    let config = outcomes_host(
        &broker.amqp_url_via(proxy.port()),
        &queue,
        &out,
        &sink,
        "confirm_timeout = \"500ms\"",
        "",
    );
    let host = InProcessHost::start(&config).await.unwrap();
    // A first input while the broker is quick: the publishing channel is
    // open and pooled before the delay begins.
    broker
        .publish(
            "",
            &queue,
            b"publish-to:o",
            text().with_message_id("quick".into()),
        )
        .await
        .unwrap();
    assert_eq!(
        broker
            .wait_for_message_count(&sink, 1, Duration::from_secs(30))
            .await
            .unwrap(),
        1
    );
    proxy.set_latency(Duration::from_millis(800));
    broker
        .publish(
            "",
            &queue,
            b"publish-to:o",
            text().with_message_id("slow".into()),
        )
        .await
        .unwrap();
    // Delivered (0.8 s), published, and not confirmed within 0.5 s: the
    // first timeout comes about 2.5 s after the input was sent.
    let timed_out = tokio::time::Instant::now() + Duration::from_secs(30);
    while metric_sum(
        &host.metrics.render(),
        "acemq_publish_total",
        &[("outcome", "failed")],
    ) < 1.0
    {
        assert!(
            tokio::time::Instant::now() < timed_out,
            "a confirm timed out"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.set_latency(Duration::ZERO);
    let acked = tokio::time::Instant::now() + Duration::from_secs(30);
    while host.metrics.consumed_count(&queue, "acked") < 2 {
        assert!(
            tokio::time::Instant::now() < acked,
            "the held input is acked once the broker keeps up:\n{}",
            host.metrics.render()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics = host.metrics.render();
    host.stop().await.unwrap();
    assert_eq!(
        metric_sum(
            &metrics,
            "acemq_consume_total",
            &[("queue", &queue), ("outcome", "dead_lettered")]
        ),
        0.0,
        "{metrics}"
    );
    assert_eq!(
        broker
            .message_count(&format!("{queue}.dlq"))
            .await
            .unwrap_or(0),
        0
    );
    assert_eq!(broker.message_count(&queue).await.unwrap(), 0);
    // The slow input's output arrived, once or more (at least once).
    assert!(broker.message_count(&sink).await.unwrap() >= 2);
}
