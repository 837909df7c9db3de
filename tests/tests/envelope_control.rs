//! Envelope control on a plugin's outputs (contract §4), on a real broker:
//! the fields a plugin chooses reach a plain AMQP client with the
//! contract's header types; an output keeps its id when its input is
//! handled again after the host died between the output's confirm and the
//! input's ack, whether the input named an id or not; and a plugin built
//! against the 0.3 contract still loads and handles messages.

use std::time::Duration;

use acemq_tests::host::{HostOptions, HostProcess, InProcessHost, host_binary, plugin_path};
use acemq_tests::{FaultProxy, ReceivedMessage, shared_broker, unique_name};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString};

const CHOSEN_ID: &str = "6f1c0c1e-3b5a-4c8e-9d2f-0a1b2c3d4e5f";
const WAIT: Duration = Duration::from_secs(60);

/// Names of one run: an input queue, an output exchange bound to an
/// output queue with the routing key `envelope.output`.
struct Names {
    input: String,
    out_exchange: String,
    output: String,
}

impl Names {
    fn new(prefix: &str) -> Self {
        Self {
            input: unique_name(&format!("{prefix}.in")),
            out_exchange: unique_name(&format!("{prefix}.x")),
            output: unique_name(&format!("{prefix}.out")),
        }
    }

    /// A host config reaching the broker at `url`, one consumer running
    /// `plugin` on the input queue (of `queue_type`).
    fn config(&self, url: &str, plugin: &str, queue_type: &str, broker_extra: &str) -> String {
        format!(
            r##"[broker]
url = "{url}"
{broker_extra}

[[exchanges]]
name = "{out}"
kind = "topic"

[[queues]]
name = "{input}"
type = "{queue_type}"
dead_letter = true

[[queues]]
name = "{output}"

[[bindings]]
queue = "{output}"
exchange = "{out}"
routing_key = "#"

[[consumers]]
queue = "{input}"
plugin = "{plugin}"
publish_to = ["{out}"]
concurrency = 1

[consumers.config]
exchange = "{out}"
"##,
            out = self.out_exchange,
            input = self.input,
            output = self.output,
            plugin = plugin_path(plugin).display(),
        )
    }
}

fn ls(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// An input with `body`, the envelope id `id` (or none at all) and one
/// application header.
fn input(id: Option<&str>) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert("tenant".into(), ls("acme"));
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    match id {
        Some(id) => {
            headers.insert("x-acemq-correlation".into(), ls("conversation-1"));
            properties.with_message_id(id.into()).with_headers(headers)
        }
        None => properties.with_headers(headers),
    }
}

/// The header `name`, as written on the wire (its AMQP type kept).
fn raw<'a>(message: &'a ReceivedMessage, name: &str) -> &'a AMQPValue {
    message
        .header(name)
        .unwrap_or_else(|| panic!("no {name} header on {:?}", message.headers))
}

#[tokio::test(flavor = "multi_thread")]
async fn chosen_envelope_fields_reach_a_plain_client_with_the_contracts_header_types() {
    let broker = shared_broker();
    let names = Names::new("envelope.fields");
    let config = names.config(broker.amqp_url(), "envelope-fields", "classic", "");
    let host = InProcessHost::start(&config).await.unwrap();

    let body = format!(
        r#"{{"outputs":[
            {{"id":"{CHOSEN_ID}","message_type":"invoice.raised","version":3,
              "correlation_id":"conversation-9","causation_id":"cause-7"}},
            {{"routing_key":"order.billed"}}
        ]}}"#
    );
    broker
        .publish(
            "",
            &names.input,
            body.as_bytes(),
            input(Some("in-fields-1")),
        )
        .await
        .unwrap();
    let outputs = broker.drain(&names.output, 2, WAIT).await.unwrap();
    assert_eq!(outputs.len(), 2, "both outputs arrive");
    let (chosen, defaulted) = if outputs[0].body_str().contains("\"n\":0") {
        (&outputs[0], &outputs[1])
    } else {
        (&outputs[1], &outputs[0])
    };

    // What the plugin chose, with the contract's types: strings as long
    // strings, the version a signed 32-bit integer, message-id = id.
    assert_eq!(raw(chosen, "x-acemq-id"), &ls(CHOSEN_ID));
    assert_eq!(chosen.message_id.as_deref(), Some(CHOSEN_ID));
    assert_eq!(raw(chosen, "x-acemq-type"), &ls("invoice.raised"));
    assert_eq!(raw(chosen, "x-acemq-version"), &AMQPValue::LongInt(3));
    assert_eq!(raw(chosen, "x-acemq-correlation"), &ls("conversation-9"));
    assert_eq!(raw(chosen, "x-acemq-causation"), &ls("cause-7"));

    // The defaults: an id of the host's (a UUID, message-id too), type =
    // routing key, version 1, the input's correlation, causation = its id.
    let id = defaulted.string_header("x-acemq-id").unwrap();
    assert!(uuid::Uuid::try_parse(&id).is_ok(), "{id}");
    assert_ne!(id, CHOSEN_ID);
    assert!(matches!(
        raw(defaulted, "x-acemq-id"),
        AMQPValue::LongString(_)
    ));
    assert_eq!(defaulted.message_id.as_deref(), Some(id.as_str()));
    assert_eq!(raw(defaulted, "x-acemq-type"), &ls("order.billed"));
    assert_eq!(raw(defaulted, "x-acemq-version"), &AMQPValue::LongInt(1));
    assert_eq!(raw(defaulted, "x-acemq-correlation"), &ls("conversation-1"));
    assert_eq!(raw(defaulted, "x-acemq-causation"), &ls("in-fields-1"));

    // A field the host refuses fails the publish; the plugin rejects with
    // the host's reason, which the dead-letter copy carries.
    broker
        .publish(
            "",
            &names.input,
            br#"{"outputs":[{"version":0}]}"#,
            input(Some("in-fields-2")),
        )
        .await
        .unwrap();
    let dead = broker
        .drain(&format!("{}.dlq", names.input), 1, WAIT)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1, "the refused input is dead-lettered");
    let reason = dead[0].acemq_error();
    assert!(
        reason.contains("the version 0 is not allowed: versions start at 1"),
        "{reason}"
    );
    assert_eq!(broker.message_count(&names.output).await.unwrap(), 0);
    host.stop().await.unwrap();
}

/// Handles one input (with envelope id `id`, or none) with a host that is
/// killed after its output is confirmed and before its ack reaches the
/// broker; a second host handles the redelivered input. Returns the ids of
/// the two outputs, as `x-acemq-id` and as message-id.
async fn output_ids_across_a_crash(prefix: &str, id: Option<&str>) -> Vec<(String, String)> {
    let broker = shared_broker();
    let names = Names::new(prefix);
    let proxy = FaultProxy::start(broker.amqp_addr()).unwrap();
    // A quorum queue: its redelivery carries an x-delivery-count the first
    // delivery had not, which a derived id must not depend on.
    let config = names.config(
        &broker.amqp_url_via(proxy.port()),
        "envelope-fields",
        "quorum",
        "network_recovery_interval = \"300ms\"",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.toml");
    std::fs::write(&path, &config).unwrap();
    let start = || {
        HostProcess::start_with(&path, tempfile::tempdir().unwrap(), &HostOptions::default())
            .expect("the host starts")
    };

    let host = start();
    // Slow the link once the host is up: the output reaches its queue a
    // latency before the confirm reaches the host, and its ack one more
    // latency later; the test blackholes the link in between.
    proxy.set_latency(Duration::from_millis(1500));
    broker
        .publish("", &names.input, br#"{"outputs":[{}]}"#, input(id))
        .await
        .unwrap();
    let queued = broker
        .wait_for_message_count(&names.output, 1, WAIT)
        .await
        .unwrap();
    proxy.set_blackhole(true);
    assert_eq!(queued, 1, "the first output arrived\n{}", host.log_text());
    let pid = i32::try_from(host.pid()).unwrap();
    // SAFETY: plain kill(2) on the host process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let (status, _) = host.wait_with_log(Duration::from_secs(30)).unwrap();
    assert!(!status.success(), "the host was killed: {status}");
    // The partition heals: the broker now sees the connection close with
    // the input unacked, and delivers it again.
    proxy.set_latency(Duration::ZERO);
    proxy.set_blackhole(false);

    let host = start();
    let arrived = broker
        .wait_for_message_count(&names.output, 2, WAIT)
        .await
        .unwrap();
    assert_eq!(
        arrived,
        2,
        "the input was handled again\n{}",
        host.log_text()
    );
    let outputs = broker.drain(&names.output, 2, WAIT).await.unwrap();
    // The second handling acked the input: nothing is left of it.
    let deadline = std::time::Instant::now() + WAIT;
    while broker.message_count(&names.input).await.unwrap() > 0
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(broker.message_count(&names.input).await.unwrap(), 0);
    host.terminate(Duration::from_secs(30)).unwrap();
    outputs
        .iter()
        .map(|m| {
            (
                m.string_header("x-acemq-id").expect("an x-acemq-id"),
                m.message_id.clone().expect("a message-id"),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_output_keeps_its_id_when_its_input_with_an_id_is_handled_again_after_a_crash() {
    let ids = output_ids_across_a_crash("envelope.crash.named", Some("in-named-1")).await;
    assert_eq!(ids.len(), 2);
    assert_eq!(
        ids[0], ids[1],
        "the redelivered input's output has the same id"
    );
    assert_eq!(ids[0].0, ids[0].1, "message-id = x-acemq-id");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_output_keeps_its_id_when_its_input_without_an_id_is_handled_again_after_a_crash() {
    let ids = output_ids_across_a_crash("envelope.crash.unnamed", None).await;
    assert_eq!(ids.len(), 2);
    assert_eq!(
        ids[0], ids[1],
        "the input's derived id, and so its output's, survive the redelivery"
    );
    assert_eq!(ids[0].0, ids[0].1, "message-id = x-acemq-id");
}

/// A plugin built with plain wit-bindgen against `wit/v0.3` loads into this
/// host and handles a message: its output carries 0.3's one envelope field
/// (the message type) and the host's defaults for the rest.
#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_built_against_the_0_3_contract_loads_and_handles_a_message() {
    let broker = shared_broker();
    let names = Names::new("envelope.legacy");
    let config = names.config(broker.amqp_url(), "legacy-v0_3-echo", "classic", "");
    let host = InProcessHost::start(&config).await.unwrap();
    broker
        .publish(
            "",
            &names.input,
            br#"{"hello":"0.3"}"#,
            input(Some("in-legacy-1")),
        )
        .await
        .unwrap();
    let outputs = broker.drain(&names.output, 1, WAIT).await.unwrap();
    assert_eq!(outputs.len(), 1, "the 0.3 plugin echoed its input");
    let echo = &outputs[0];
    assert_eq!(echo.body_str(), r#"{"hello":"0.3"}"#);
    assert_eq!(echo.routing_key, names.input);
    assert_eq!(raw(echo, "x-acemq-type"), &ls("legacy.echo"));
    assert_eq!(raw(echo, "x-acemq-causation"), &ls("in-legacy-1"));
    assert_eq!(raw(echo, "x-acemq-correlation"), &ls("conversation-1"));
    assert_eq!(raw(echo, "x-acemq-version"), &AMQPValue::LongInt(1));
    assert_eq!(raw(echo, "tenant"), &ls("acme"));
    let id = echo.string_header("x-acemq-id").unwrap();
    assert!(uuid::Uuid::try_parse(&id).is_ok(), "{id}");
    host.stop().await.unwrap();
}

/// `plugin inspect` names the contract a plugin was built against.
#[test]
fn inspect_names_the_contract_a_plugin_was_built_against() {
    for (plugin, expected) in [
        ("legacy-v0_3-echo", "contract: acemq:plugin@0.3.0"),
        ("envelope-fields", "contract: acemq:plugin@0.4.0"),
    ] {
        let out = std::process::Command::new(host_binary())
            .args(["plugin", "inspect"])
            .arg(plugin_path(plugin))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains(expected), "{text}");
    }
}
