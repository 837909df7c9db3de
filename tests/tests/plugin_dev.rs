//! The plugin author's loop, as a new user runs it, outside this repository:
//! `acemq-host plugin new` -> `plugin build` (the real wasm toolchain) ->
//! `plugin run` -> the component in a host on the real broker. One native
//! build of the crate's tests and one wasm build, both from scratch (std
//! included on the Debian toolchain): two to three minutes on two cores.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use acemq_tests::host::{HostProcess, host_binary, workspace_root};
use acemq_tests::{shared_broker, unique_name};
use lapin::BasicProperties;

fn acemq_host(args: &[&str], cwd: &Path) -> Output {
    Command::new(host_binary())
        .args(args)
        .current_dir(cwd)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_plugin_builds_runs_and_handles_a_message_on_the_broker() {
    let outside = tempfile::tempdir().unwrap();
    assert!(
        !outside.path().starts_with(workspace_root()),
        "the crate must live outside the repository"
    );
    let dir = outside.path();

    // new: the crate, and what to do next.
    let created = acemq_host(&["plugin", "new", "audit-probe"], dir);
    assert_eq!(created.status.code(), Some(0), "{}", text(&created));
    let stdout = String::from_utf8_lossy(&created.stdout);
    assert!(
        stdout.contains("acemq-host plugin build audit-probe"),
        "{stdout}"
    );
    let crate_dir = dir.join("audit-probe");
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).unwrap();
    assert!(manifest.contains("[workspace]"), "{manifest}");

    // Its tests pass natively, offline: the SDK by path, the versions from
    // the lockfile that came with it.
    let tested = Command::new("cargo")
        .args(["test", "--offline", "--quiet"])
        .current_dir(&crate_dir)
        .output()
        .unwrap();
    assert!(tested.status.success(), "{}", text(&tested));
    assert!(
        String::from_utf8_lossy(&tested.stdout).contains("3 passed"),
        "{}",
        text(&tested)
    );

    // new again: the folder exists (2), and a bad name is refused (2).
    let again = acemq_host(&["plugin", "new", "audit-probe"], dir);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));
    let bad = acemq_host(&["plugin", "new", "Audit.Probe"], dir);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(
        text(&bad).contains("'Audit.Probe' cannot be a plugin name"),
        "{}",
        text(&bad)
    );

    // build: the component, and where it is.
    let built = acemq_host(&["plugin", "build", "audit-probe"], dir);
    assert_eq!(built.status.code(), Some(0), "{}", text(&built));
    let component = crate_dir.join("target/plugins/audit-probe.wasm");
    assert!(component.is_file(), "{}", text(&built));
    let stdout = String::from_utf8_lossy(&built.stdout);
    assert!(
        stdout.contains("audit-probe/target/plugins/audit-probe.wasm")
            && stdout.contains("written"),
        "{stdout}"
    );
    // Nothing changed: nothing is rewritten.
    let rebuilt = acemq_host(&["plugin", "build", "audit-probe"], dir);
    assert_eq!(rebuilt.status.code(), Some(0), "{}", text(&rebuilt));
    assert!(text(&rebuilt).contains("up to date"), "{}", text(&rebuilt));

    // run: one message, no broker.
    let component_arg = component.to_string_lossy().into_owned();
    let ran = acemq_host(
        &[
            "plugin",
            "run",
            &component_arg,
            "--body",
            "hello",
            "--config",
            "forward_to=out",
            "--publish-to",
            "out",
        ],
        dir,
    );
    assert_eq!(ran.status.code(), Some(0), "{}", text(&ran));
    let report = String::from_utf8_lossy(&ran.stdout);
    for expected in [
        "outcome: accept",
        "1. exchange 'out', routing key 'plugin.run', 5 bytes",
        "body: HELLO",
        "INFO  5 bytes with routing key 'plugin.run'",
        "fuel: ",
    ] {
        assert!(report.contains(expected), "{expected}: {report}");
    }
    let rejected = acemq_host(&["plugin", "run", &component_arg, "--body", " "], dir);
    assert_eq!(rejected.status.code(), Some(0), "{}", text(&rejected));
    assert!(
        text(&rejected).contains("outcome: reject: the body is empty"),
        "{}",
        text(&rejected)
    );
    let refused = acemq_host(
        &[
            "plugin",
            "run",
            &component_arg,
            "--body",
            "x",
            "--config",
            "forward_to=out",
        ],
        dir,
    );
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));

    // In a host, on the broker: the body comes out of the exchange in capitals.
    let broker = shared_broker();
    let (input, output, exchange) = (
        unique_name("probe.in"),
        unique_name("probe.out"),
        unique_name("probe.x"),
    );
    let config = format!(
        r#"[broker]
url = "{url}"

[[exchanges]]
name = "{exchange}"
kind = "direct"

[[queues]]
name = "{input}"
dead_letter = true

[[queues]]
name = "{output}"

[[bindings]]
queue = "{output}"
exchange = "{exchange}"
routing_key = "{input}"

[[consumers]]
queue = "{input}"
plugin = "{plugin}"
publish_to = ["{exchange}"]

[consumers.config]
forward_to = "{exchange}"
"#,
        url = broker.amqp_url(),
        plugin = component.display(),
    );
    let host = HostProcess::start(&config, 1).unwrap();
    broker
        .publish("", &input, b"hello broker", BasicProperties::default())
        .await
        .unwrap();
    let received = broker
        .drain(&output, 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(received.len(), 1, "the output did not arrive");
    assert_eq!(received[0].body_str(), "HELLO BROKER");
    let dead = broker.message_count(&format!("{input}.dlq")).await.unwrap();
    assert_eq!(dead, 0, "the message was dead-lettered");
    let status = host.terminate(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
}
