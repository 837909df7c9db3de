//! The subscription's promise on a real broker: every delivery is settled
//! once, even when the work around it panics.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use acemq_host::broker::subscription::{self, Board, SubscriptionEnv, SubscriptionSpec};
use acemq_tests::{shared_broker, unique_name};
use lapin::BasicProperties;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_whose_handling_panics_is_requeued_and_handled_again() {
    let broker = shared_broker();
    let queue = unique_name("subscription.panics");
    let connection = broker.connect().await.unwrap();
    connection
        .create_channel()
        .await
        .unwrap()
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let messages = (0..3).map(|i| (format!("{i}").into_bytes(), BasicProperties::default()));
    broker.publish_many("", &queue, messages).await.unwrap();

    let env = SubscriptionEnv {
        shutdown: CancellationToken::new(),
        drain_timeout: Duration::from_secs(5),
        board: Arc::new(Board::default()),
    };
    let (first_tries, acked) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let handle = {
        let (first_tries, acked) = (first_tries.clone(), acked.clone());
        move |received: subscription::Received| {
            let (first_tries, acked) = (first_tries.clone(), acked.clone());
            async move {
                if !received.redelivered {
                    first_tries.fetch_add(1, Ordering::SeqCst);
                    panic!("a bug around delivery {:?}", received.body);
                }
                received.receipt.ack().await;
                acked.fetch_add(1, Ordering::SeqCst);
            }
        }
    };
    let spec = SubscriptionSpec {
        queue: queue.clone(),
        prefetch: 10,
        concurrency: 2,
        ends_after: None,
        stream: None,
        consumer_tag: None,
        stream_protocol: None,
    };
    let running = {
        let env = env.clone();
        tokio::spawn(async move { subscription::run(&connection, spec, env, &handle).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while acked.load(Ordering::SeqCst) < 3 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    env.shutdown.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(first_tries.load(Ordering::SeqCst), 3, "each panicked once");
    assert_eq!(
        acked.load(Ordering::SeqCst),
        3,
        "each was requeued and handled again"
    );
    assert_eq!(broker.message_count(&queue).await.unwrap(), 0);
    broker.delete_queue(&queue).await.unwrap();
}
