//! Confirmed publishing against a real broker. Batches published at the
//! same time share a round (one channel, coalesced confirms), and each
//! batch still learns exactly which of its own messages no queue took.

use std::sync::Arc;

use acemq_host::broker::publisher::Publication;
use acemq_host::broker::{PublishError, Publisher};
use acemq_tests::publish_link;
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
