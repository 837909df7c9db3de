//! What the host tells an operator about a known run: the exact counts of
//! `GET /metrics`.

use std::time::{Duration, Instant};

use acemq_tests::host::{HostProcess, free_port, http_get, metric_sum, plugin_path};
use acemq_tests::{shared_broker, unique_name};
use lapin::BasicProperties;

fn text() -> BasicProperties {
    BasicProperties::default().with_content_type("text/plain".into())
}

/// Every series a known mix of outcomes moves, counted exactly: thirteen
/// deliveries of which two are second attempts, three outputs, four
/// republishes (two retries, a park, a reject).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_run_is_counted_exactly_in_metrics() {
    let broker = shared_broker();
    let queue = unique_name("counted");
    let out = unique_name("counted.out");
    let sink = unique_name("counted.sink");
    let admin = format!("127.0.0.1:{}", free_port());
    let config = format!(
        r#"
[broker]
url = "{url}"

[host]
admin_listen = "{admin}"

[[exchanges]]
name = "{out}"
kind = "direct"

[[queues]]
name = "{queue}"
dead_letter = true

[[queues]]
name = "{sink}"

[[bindings]]
queue = "{sink}"
exchange = "{out}"
routing_key = "routed"

[retry.quick]
kind = "fixed"
attempts = 3
initial = "100ms"

[[consumers]]
queue = "{queue}"
plugin = "{plugin}"
publish_to = ["{out}"]
retry = "quick"

[consumers.config]
out_exchange = "{out}"
"#,
        url = broker.amqp_url(),
        plugin = plugin_path("outcomes").display(),
    );
    let host = HostProcess::start(&config, 1).unwrap();
    let bodies = [
        vec!["accept"; 4],
        vec!["retry-until:2:not yet"; 2],
        vec!["park:looks wrong"],
        vec!["reject:never valid"],
        vec!["publish-to:routed"; 3],
    ]
    .concat();
    broker
        .publish_many("", &queue, bodies.iter().map(|b| (*b, text())))
        .await
        .unwrap();

    let url = format!("http://{admin}/metrics");
    let deliveries = 13.0;
    let deadline = Instant::now() + Duration::from_secs(60);
    let metrics = tokio::task::block_in_place(|| {
        loop {
            let (_, text) = http_get(&url).expect("/metrics answers");
            let settled = metric_sum(&text, "acemq_consume_total", &[("queue", &queue)]);
            if settled >= deliveries || Instant::now() > deadline {
                break text;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let q = ("queue", queue.as_str());
    let count = |name: &str, labels: &[(&str, &str)]| metric_sum(&metrics, name, labels);
    for (outcome, expected) in [
        ("acked", 9.0),
        ("retried", 2.0),
        ("parked", 1.0),
        ("rejected", 1.0),
    ] {
        let labels = [q, ("outcome", outcome)];
        assert_eq!(
            count("acemq_consume_total", &labels),
            expected,
            "{outcome}:\n{metrics}"
        );
        assert_eq!(
            count("acemq_consume_duration_seconds_count", &labels),
            expected,
            "{outcome} durations:\n{metrics}"
        );
    }
    assert_eq!(count("acemq_consume_total", &[q]), deliveries);
    // Eleven first attempts and two second ones.
    assert_eq!(count("acemq_consume_attempts_count", &[q]), deliveries);
    assert_eq!(count("acemq_consume_attempts_sum", &[q]), 15.0);
    assert_eq!(
        count("acemq_consume_attempts_bucket", &[q, ("le", "1.0")]),
        11.0
    );
    assert_eq!(count("acemq_consume_in_flight", &[q]), 0.0);
    assert_eq!(
        count(
            "acemq_messages_dead_lettered_total",
            &[q, ("outcome", "parked")]
        ),
        1.0
    );
    assert_eq!(
        count(
            "acemq_messages_dead_lettered_total",
            &[q, ("outcome", "dead_lettered")]
        ),
        1.0
    );
    assert_eq!(count("acemq_messages_retried_total", &[q]), 2.0);
    assert_eq!(count("acemq_plugin_faults_total", &[q]), 0.0);

    // Every handler call, under the one version that served them.
    assert_eq!(
        count("acemq_plugin_call_duration_seconds_count", &[q]),
        deliveries
    );
    let version = metrics
        .lines()
        .find(|l| l.starts_with("acemq_plugin_version{") && l.contains(&queue))
        .and_then(|l| l.split("sha256=\"").nth(1)?.split('"').next())
        .expect("the plugin version is exposed")
        .to_string();
    assert_eq!(
        count(
            "acemq_plugin_call_duration_seconds_count",
            &[q, ("sha256", &version)]
        ),
        deliveries
    );

    // Outputs to the exchange, and republishes to the default exchange.
    let out_confirmed = [("exchange", out.as_str()), ("outcome", "confirmed")];
    assert_eq!(count("acemq_publish_total", &out_confirmed), 3.0);
    assert_eq!(
        count("acemq_publish_duration_seconds_count", &out_confirmed),
        3.0
    );
    let republished = [("exchange", ""), ("outcome", "confirmed")];
    assert_eq!(count("acemq_publish_total", &republished), 4.0);
    assert_eq!(
        count("acemq_publish_duration_seconds_count", &republished),
        4.0
    );
    for outcome in ["unroutable", "failed", "refused"] {
        assert_eq!(
            count("acemq_publish_total", &[("outcome", outcome)]),
            0.0,
            "{outcome}:\n{metrics}"
        );
    }
    assert_eq!(broker.message_count(&sink).await.unwrap(), 3);
    host.terminate(Duration::from_secs(30)).unwrap();
}
