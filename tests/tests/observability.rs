//! What the host tells an operator about a known run: the exact counts of
//! `GET /metrics`, and the spans of a trace across hosts.

use std::time::{Duration, Instant};

use acemq_tests::collector::Collector;
use acemq_tests::host::{HostProcess, free_port, http_get, metric_sum, plugin_path};
use acemq_tests::stamp::StampConfig;
use acemq_tests::{shared_broker, unique_name};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};

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

/// One trace from a producer's `traceparent` through two hosts: the first
/// consumes and publishes, the second consumes that output and publishes
/// again; the collector holds four spans, each the child of the one before,
/// and the last output carries the last publish span as its parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_runs_from_the_input_through_two_hosts_to_the_last_output() {
    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const PRODUCER_SPAN: &str = "00f067aa0ba902b7";
    let broker = shared_broker();
    let collector = Collector::start().await.unwrap();
    let (input, middle, last) = (
        unique_name("traced.in"),
        unique_name("traced.mid"),
        unique_name("traced.last"),
    );
    let (first_exchange, second_exchange) = (unique_name("traced.x1"), unique_name("traced.x2"));
    let broker_lines = format!("url = \"{}\"", broker.amqp_url());
    let traced = |config: StampConfig| {
        format!(
            "{}\n[tracing]\notlp_endpoint = \"{}\"\n",
            config.toml(),
            collector.endpoint
        )
    };
    let first = HostProcess::start(
        &traced(StampConfig {
            broker: &broker_lines,
            ..StampConfig::new(&input, &middle, &first_exchange)
        }),
        1,
    )
    .unwrap();
    let second = HostProcess::start(
        &traced(StampConfig {
            broker: &broker_lines,
            ..StampConfig::new(&middle, &last, &second_exchange)
        }),
        1,
    )
    .unwrap();

    let mut headers = FieldTable::default();
    headers.insert(
        "traceparent".into(),
        AMQPValue::LongString(format!("00-{TRACE}-{PRODUCER_SPAN}-01").into()),
    );
    headers.insert(
        "tracestate".into(),
        AMQPValue::LongString("vendor=7".into()),
    );
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_headers(headers);
    broker
        .publish("", &input, br#"{"order":1}"#, properties)
        .await
        .unwrap();
    let out = broker
        .drain(&last, 1, Duration::from_secs(30))
        .await
        .unwrap();
    // Stopping flushes each host's spans to the collector.
    first.terminate(Duration::from_secs(30)).unwrap();
    second.terminate(Duration::from_secs(30)).unwrap();

    let spans = collector.spans();
    let named = |name: &str| {
        spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no span {name:?} among {spans:#?}"))
    };
    let first_process = named(&format!("{input} process"));
    let first_publish = named(&format!("{first_exchange} publish"));
    let second_process = named(&format!("{middle} process"));
    let second_publish = named(&format!("{second_exchange} publish"));
    let chain = [first_process, first_publish, second_process, second_publish];
    for span in chain {
        assert_eq!(span.trace_id, TRACE, "{span:#?}");
        assert_eq!(span.scope, "org.acemq.amqp");
        assert_eq!(span.service, "acemq-host");
        assert_eq!(span.attribute("messaging.system"), Some("rabbitmq"));
    }
    assert_eq!(first_process.parent_span_id, PRODUCER_SPAN);
    for pair in chain.windows(2) {
        assert_eq!(
            pair[1].parent_span_id, pair[0].span_id,
            "{} is not the child of {}",
            pair[1].name, pair[0].name
        );
    }
    // Consumer and producer kinds, and the contract's attributes.
    assert_eq!((first_process.kind, first_publish.kind), (5, 4));
    assert_eq!(
        first_process.attribute("messaging.operation"),
        Some("process")
    );
    assert_eq!(
        first_process.attribute("messaging.destination.name"),
        Some(input.as_str())
    );
    assert_eq!(
        first_process.attribute("messaging.acemq.outcome"),
        Some("acked")
    );
    assert_eq!(
        first_process.attribute("messaging.acemq.attempt"),
        Some("1")
    );
    assert_eq!(
        first_publish.attribute("messaging.operation"),
        Some("publish")
    );
    assert_eq!(
        first_publish.attribute("messaging.acemq.outcome"),
        Some("confirmed")
    );
    assert_eq!(
        first_publish.attribute("messaging.rabbitmq.destination.routing_key"),
        Some("stamped")
    );

    // The last output continues the trace from the last publish span.
    let traceparent = out[0].string_header("traceparent").expect("a traceparent");
    assert_eq!(
        traceparent,
        format!("00-{TRACE}-{}-01", second_publish.span_id)
    );
    assert_eq!(
        out[0].string_header("tracestate").as_deref(),
        Some("vendor=7")
    );
}

/// Every metric the Grafana dashboard in `docs/grafana` queries is one the
/// host declares (as a sample name: a counter's `_total`, a histogram's
/// `_bucket`, `_sum` and `_count`); a family shows on `/metrics` once it
/// has a series, and what a running host shows is within the declared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_queries_is_exposed() {
    let broker = shared_broker();
    let queue = unique_name("dashboard");
    let admin = format!("127.0.0.1:{}", free_port());
    let config = format!(
        "[broker]\nurl = \"{url}\"\n\n[host]\nadmin_listen = \"{admin}\"\n\n[[queues]]\nname = \"{queue}\"\n\n[[consumers]]\nqueue = \"{queue}\"\nplugin = \"{plugin}\"\n",
        url = broker.amqp_url(),
        plugin = plugin_path("echo").display(),
    );
    let host = HostProcess::start(&config, 1).unwrap();
    broker
        .publish_many("", &queue, (0..5).map(|_| ("hello", text())))
        .await
        .unwrap();
    let url = format!("http://{admin}/metrics");
    let exposition = tokio::task::block_in_place(|| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, text) = http_get(&url).expect("/metrics answers");
            if metric_sum(&text, "acemq_consume_total", &[]) >= 5.0 || Instant::now() > deadline {
                break text;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    host.terminate(Duration::from_secs(30)).unwrap();

    let declared = acemq_host::telemetry::Metrics::new().sample_names().clone();
    let shown: Vec<&str> = exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap())
        .collect();
    assert!(
        shown.contains(&"acemq_consume_duration_seconds_bucket"),
        "{exposition}"
    );
    for name in shown {
        assert!(
            declared.contains(name),
            "/metrics shows {name}, which is not declared"
        );
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            acemq_tests::host::workspace_root().join("docs/grafana/acemq-host.json"),
        )
        .unwrap(),
    )
    .expect("the dashboard is JSON");
    let mut queried = Vec::new();
    collect_exprs(&dashboard, &mut queried);
    assert!(queried.len() >= 20, "{queried:?}");
    let catalogue = acemq_host::telemetry::Metrics::new().catalogue().to_vec();
    for expr in &queried {
        for name in metric_names(expr) {
            assert!(
                declared.contains(&name),
                "the dashboard queries {name} ({expr}), which the host does not expose"
            );
            // And only labels that metric carries.
            let entry = catalogue
                .iter()
                .find(|e| {
                    name == e.name
                        || ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|suffix| name == format!("{}{suffix}", e.name))
                })
                .unwrap_or_else(|| panic!("{name} is not in the catalogue"));
            for label in label_names(expr) {
                assert!(
                    entry.labels.contains(&label.as_str())
                        || (label == "le" && name.ends_with("_bucket")),
                    "the dashboard uses the label {label} of {name} ({expr}), which it does not carry"
                );
            }
        }
    }
}

/// The labels a PromQL expression groups by or selects on.
fn label_names(expr: &str) -> Vec<String> {
    let mut labels = Vec::new();
    for (open, close) in [("by (", ')'), ("{", '}')] {
        let mut rest = expr;
        while let Some(start) = rest.find(open) {
            let tail = &rest[start + open.len()..];
            let end = tail.find(close).unwrap_or(tail.len());
            for part in tail[..end].split(',') {
                let label: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !label.is_empty() && !label.starts_with("__") {
                    labels.push(label);
                }
            }
            rest = &tail[end..];
        }
    }
    labels
}

/// The metric table of `docs/operating.md` names exactly the metrics the
/// host declares, each with exactly its labels (a label's values may follow
/// it in parentheses, a description after a colon).
#[test]
fn the_documented_metric_table_says_exactly_which_labels_exist() {
    let page =
        std::fs::read_to_string(acemq_tests::host::workspace_root().join("docs/operating.md"))
            .unwrap();
    let section = page
        .split("\n## Metrics\n")
        .nth(1)
        .expect("docs/operating.md has a Metrics section")
        .split("\n## ")
        .next()
        .unwrap();
    let mut documented = Vec::new();
    for row in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`').to_string();
        let kind = cells[2].to_string();
        // Values in parentheses, then the description after a colon.
        let mut bare = String::new();
        let mut depth = 0;
        for c in cells[3].chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ if depth == 0 => bare.push(c),
                _ => {}
            }
        }
        let listed = bare.split(':').next().unwrap();
        let labels: Vec<String> = listed
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        documented.push((name, kind, labels));
    }
    let declared: Vec<(String, String, Vec<String>)> = acemq_host::telemetry::Metrics::new()
        .catalogue()
        .iter()
        .map(|e| {
            (
                e.name.clone(),
                e.kind.to_string(),
                e.labels.iter().map(|l| l.to_string()).collect(),
            )
        })
        .collect();
    assert_eq!(documented, declared);
}

/// Outputs with hundreds of distinct routing keys (an order id in each, as
/// plugins do) add no metric series: `/metrics` is as long after 500 keys
/// as after 5. Before, each key added its own `acemq_publish_total` and
/// `acemq_publish_duration_seconds` series, about 20 lines a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_keys_chosen_by_a_plugin_add_no_metric_series() {
    let broker = shared_broker();
    let queue = unique_name("keys");
    let out = unique_name("keys.out");
    let sink = unique_name("keys.sink");
    let admin = format!("127.0.0.1:{}", free_port());
    let config = format!(
        r#"
[broker]
url = "{url}"

[host]
admin_listen = "{admin}"

[[exchanges]]
name = "{out}"
kind = "topic"

[[queues]]
name = "{queue}"

[[queues]]
name = "{sink}"
type = "classic"

[[bindings]]
queue = "{sink}"
exchange = "{out}"
routing_key = "order.#"

[[consumers]]
queue = "{queue}"
plugin = "{plugin}"
publish_to = ["{out}"]

[consumers.config]
out_exchange = "{out}"
"#,
        url = broker.amqp_url(),
        plugin = plugin_path("outcomes").display(),
    );
    let host = HostProcess::start(&config, 1).unwrap();
    let url = format!("http://{admin}/metrics");
    // Lines of /metrics once `outputs` outputs in all have been confirmed.
    let lines_after = |outputs: f64| {
        let deadline = Instant::now() + Duration::from_secs(60);
        tokio::task::block_in_place(|| {
            loop {
                let (_, text) = http_get(&url).expect("/metrics answers");
                let confirmed = metric_sum(
                    &text,
                    "acemq_publish_total",
                    &[("exchange", out.as_str()), ("outcome", "confirmed")],
                );
                if confirmed >= outputs {
                    break text.lines().count();
                }
                assert!(
                    Instant::now() < deadline,
                    "{confirmed} of {outputs} outputs confirmed:\n{text}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let keys = |from: usize, to: usize| {
        let keys: Vec<String> = (from..to).map(|i| format!("order.{i}")).collect();
        format!("publish-to:{}", keys.join(","))
    };
    broker
        .publish("", &queue, keys(0, 5).as_bytes(), text())
        .await
        .unwrap();
    let few = lines_after(5.0);
    broker
        .publish("", &queue, keys(5, 505).as_bytes(), text())
        .await
        .unwrap();
    let many = lines_after(505.0);
    host.terminate(Duration::from_secs(30)).unwrap();
    assert_eq!(
        many, few,
        "500 more routing keys changed the length of /metrics"
    );
    assert_eq!(broker.message_count(&sink).await.unwrap(), 505);
}

/// Every `expr` of the dashboard's panels (and its variables' queries).
fn collect_exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "definition", serde_json::Value::String(expr)) => {
                        out.push(expr.clone())
                    }
                    _ => collect_exprs(value, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// The `acemq_*` names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find("acemq_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}
