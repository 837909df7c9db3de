//! `amqps://`: the host reaches a broker that requires TLS and a client
//! certificate, trusting only the configured CA, and handles messages over
//! it (a queue over AMQP, a stream over the stream protocol's TLS
//! listener); a broker whose certificate that CA did not sign is refused.

use std::time::Duration;

use acemq_tests::host::{HostOptions, HostProcess, free_port};
use acemq_tests::pki::{ExtendedKeyUsagePurpose, Pki};
use acemq_tests::stamp::StampConfig;
use acemq_tests::{Broker, unique_name};
use lapin::BasicProperties;

fn host_config(url: &str, tls: &str, input: &str, output: &str, exchange: &str) -> String {
    let broker = format!("url = \"{url}\"\nconnect_timeout = \"3s\"\n\n[broker.tls]\n{tls}");
    StampConfig {
        broker: &broker,
        ..StampConfig::new(input, output, exchange)
    }
    .toml()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_host_handles_messages_over_mutual_tls_and_refuses_a_broker_its_ca_did_not_sign() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "acemq-test-ca");
    let (server_cert, server_key) = pki.leaf(
        dir.path(),
        "broker",
        &["localhost", "127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client_cert, client_key) = pki.leaf(
        dir.path(),
        "acemq-host",
        &[],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let ssl_port = free_port();
    let stream_ssl_port = free_port();
    let broker = Broker::start_with_config(&format!(
        "listeners.ssl.default = 127.0.0.1:{ssl_port}\n\
         stream.listeners.ssl.1 = 127.0.0.1:{stream_ssl_port}\n\
         ssl_options.cacertfile = {ca}\n\
         ssl_options.certfile = {cert}\n\
         ssl_options.keyfile = {key}\n\
         ssl_options.verify = verify_peer\n\
         ssl_options.fail_if_no_peer_cert = true\n",
        ca = pki.ca.display(),
        cert = server_cert.display(),
        key = server_key.display(),
    ))
    .unwrap();
    let url = format!("amqps://guest:guest@localhost:{ssl_port}/%2f");
    let (input, output, exchange) = (
        unique_name("tls.in"),
        unique_name("tls.out"),
        unique_name("tls.x"),
    );
    let tls = format!(
        "ca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"",
        pki.ca.display(),
        client_cert.display(),
        client_key.display()
    );
    let config = dir.path().join("host.toml");
    std::fs::write(&config, host_config(&url, &tls, &input, &output, &exchange)).unwrap();
    let host = HostProcess::start_with(
        &config,
        tempfile::tempdir().unwrap(),
        &HostOptions::default(),
    )
    .expect("the host connects over TLS");
    let inputs = (0..50).map(|i| (format!("{i}").into_bytes(), BasicProperties::default()));
    broker.publish_many("", &input, inputs).await.unwrap();
    let count = broker
        .wait_for_message_count(&output, 50, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(count, 50);
    // Both of the host's connections (consume, publish) are TLS
    // connections that presented its certificate.
    let connections = broker
        .rabbitmqctl(&["list_connections", "ssl", "peer_cert_subject"])
        .unwrap();
    let ours = connections
        .lines()
        .filter(|l| *l == "true\tCN=acemq-host")
        .count();
    assert_eq!(ours, 2, "{connections}");
    assert!(host.terminate(Duration::from_secs(30)).unwrap().success());

    // A stream read over the stream protocol's TLS listener, with the same
    // CA and client certificate.
    let stream = unique_name("tls.stream");
    let stream_output = unique_name("tls.stream.out");
    let streamed = StampConfig {
        broker: &format!(
            "url = \"{url}\"\nstream_port = {stream_ssl_port}\nconnect_timeout = \"3s\"\n\n[broker.tls]\n{tls}"
        ),
        input_queue: "type = \"stream\"",
        consumer: "offset = \"first\"\nconsumer_name = \"tls-projection\"\nstream_protocol = \"stream\"",
        ..StampConfig::new(&stream, &stream_output, &exchange)
    }
    .toml();
    std::fs::write(&config, streamed).unwrap();
    let host = HostProcess::start_with(
        &config,
        tempfile::tempdir().unwrap(),
        &HostOptions::default(),
    )
    .expect("the host reads the stream over TLS");
    let inputs = (0..50).map(|i| (format!("{i}").into_bytes(), BasicProperties::default()));
    broker.publish_many("", &stream, inputs).await.unwrap();
    broker
        .wait_for_message_count(&stream_output, 50, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        host.log_text()
            .contains("listener=rabbitmq-stream+tls://localhost:"),
        "{}",
        host.log_text()
    );
    assert!(host.terminate(Duration::from_secs(30)).unwrap().success());

    // A CA that did not sign the broker's certificate: refused, and said so.
    let rogue = Pki::new(dir.path(), "some-other-ca");
    let tls = format!(
        "ca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"",
        rogue.ca.display(),
        client_cert.display(),
        client_key.display()
    );
    std::fs::write(&config, host_config(&url, &tls, &input, &output, &exchange)).unwrap();
    let (status, log) = HostProcess::refuses(&config).unwrap();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("invalid peer certificate: UnknownIssuer"),
        "{log}"
    );
    broker.stop().unwrap();
}
