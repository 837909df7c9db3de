//! What the host writes (stdout and stderr, whole) holds no password and no
//! message content: with an invalid broker URL, with an unreachable broker,
//! and when an output is returned as unroutable. The host runs as an
//! operator runs it, without `RUST_LOG`, so its default log filter applies.

use std::time::Duration;

use acemq_tests::host::{HostOptions, HostProcess, plugin_path};
use acemq_tests::{shared_broker, unique_name};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};

/// The part of every test password that must never be logged; it is in
/// each password as written and percent-decoded.
const PASSWORD_MARK: &str = "s3cret";
const BODY_MARKER: &str = "BODY-MARKER-7f3a";
const HEADER_MARKER: &str = "HEADER-MARKER-9c1e";

/// Starts `acemq-host run` on `config` with `options`, its default log
/// filter unless `options` sets one.
fn start(config: &str, options: HostOptions) -> HostProcess {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.toml");
    std::fs::write(&path, config).unwrap();
    HostProcess::start_with(&path, dir, &options).expect("host starts")
}

/// Runs a host that must give up by itself, and checks that all it wrote
/// holds no password and every one of `expected`, and that it exited `code`.
fn exits_without_the_password(config: &str, url: Option<&str>, expected: &[&str], code: i32) {
    let host = start(
        config,
        HostOptions {
            consumers: 0,
            url: url.map(str::to_string),
            rust_log: None,
            ..HostOptions::default()
        },
    );
    let (status, log) = host.wait_with_log(Duration::from_secs(60)).unwrap();
    let log = log.join("\n");
    assert_absent(&log, PASSWORD_MARK, "password");
    for line in expected {
        assert!(log.contains(line), "{line:?} is missing:\n{log}");
    }
    assert_eq!(status.code(), Some(code), "{log}");
}

/// `text` as it can appear in a log: as text, and as the list of byte
/// values a `{:?}` of the bytes prints (lapin's message dump does that).
fn renderings(text: &str) -> [String; 2] {
    let bytes = format!("{:?}", text.as_bytes());
    [text.to_string(), bytes.trim_matches(['[', ']']).to_string()]
}

fn assert_absent(log: &str, secret: &str, what: &str) {
    for rendering in renderings(secret) {
        assert!(
            !log.contains(&rendering),
            "the {what} is in the log (as {rendering:?}):\n{log}"
        );
    }
}

/// A short timeout, so that a host that does try to connect gives up soon.
const BROKER_SECTION: &str = "[broker]\nconnect_timeout = \"2s\"\n";

#[test]
fn an_invalid_url_is_refused_before_connecting_naming_where_it_came_from_not_the_password() {
    // The '/' ends the host part: "pa" is read as the port. An invalid URL
    // is an invalid config: exit 2.
    exits_without_the_password(
        BROKER_SECTION,
        Some("amqp://guest:pa/ss-s3cret@127.0.0.1:1/%2f"),
        &["ACEMQ_URL: the broker URL is invalid: invalid port number"],
        2,
    );
    // No '//': lapin's own parser would repeat the whole URL in its error.
    exits_without_the_password(
        &format!("{BROKER_SECTION}url = \"amqp:guest:s3cret@127.0.0.1:1\"\n"),
        None,
        &["host.toml:3: broker.url: the broker URL is invalid: there is no '//'"],
        2,
    );
}

#[test]
fn an_unreachable_broker_is_named_with_the_password_masked() {
    // A '/' and an '@' in the password, percent-encoded as they must be.
    exits_without_the_password(
        BROKER_SECTION,
        Some("amqp://guest:pa%2Fss%40s3cret@127.0.0.1:1/%2f"),
        &[
            "cannot reach the broker yet",
            "could not connect to the broker at amqp://guest:***@127.0.0.1:1/%2f",
        ],
        1,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unroutable_output_is_logged_by_the_host_without_its_body_or_headers() {
    let broker = shared_broker();
    let queue = unique_name("secrets.in");
    // A fanout with no binding: every output to it comes back unroutable.
    let nowhere = unique_name("secrets.nowhere");
    let config = format!(
        r#"
[broker]
connect_timeout = "10s"

[[exchanges]]
name = "{nowhere}"
kind = "fanout"

[[queues]]
name = "{queue}"
dead_letter = true

[[consumers]]
queue = "{queue}"
plugin = "{plugin}"
publish_to = ["{nowhere}"]

[consumers.config]
out_exchange = "{nowhere}"
"#,
        plugin = plugin_path("faults").display(),
    );
    let host = tokio::task::block_in_place(|| {
        start(
            &config,
            HostOptions {
                url: Some(broker.amqp_url().to_string()),
                rust_log: None,
                ..HostOptions::default()
            },
        )
    });

    // The faults plugin republishes a body it does not recognise unchanged,
    // with the same application headers.
    let mut headers = FieldTable::default();
    headers.insert("x-note".into(), AMQPValue::LongString(HEADER_MARKER.into()));
    broker
        .publish(
            "",
            &queue,
            BODY_MARKER.as_bytes(),
            BasicProperties::default().with_headers(headers),
        )
        .await
        .unwrap();
    // Without a retry policy the failed delivery is dead-lettered at once.
    let dead = broker
        .drain(&format!("{queue}.dlq"), 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(dead.len(), 1, "{}", host.log_text());

    let (_, log) =
        tokio::task::block_in_place(|| host.terminate_with_log(Duration::from_secs(30))).unwrap();
    let log = log.join("\n");
    assert_absent(&log, BODY_MARKER, "body");
    assert_absent(&log, HEADER_MARKER, "header value");
    assert!(
        log.lines()
            .any(|line| line.contains("outputs were not confirmed")
                && line.contains(&format!("to exchange '{nowhere}'"))
                && line.contains("reached no queue")),
        "the host's own line about the unroutable output is missing:\n{log}"
    );
}
