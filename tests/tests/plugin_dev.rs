//! The plugin author's loop, as a new user runs it, outside this repository:
//! `acemq-host plugin new` -> `plugin build` (the real wasm toolchain) ->
//! `plugin run` -> the component in a host on the real broker, in Rust,
//! Python and JavaScript. The Rust case builds the crate's tests and its
//! wasm from scratch (std included on the Debian toolchain): two to three
//! minutes on two cores. The Python and JavaScript cases install their
//! pinned tools from PyPI and npm into [`cache_home`] the first time (about
//! a minute), then build a component in 10 to 20 s.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use acemq_tests::host::{HostProcess, host_binary, workspace_root};
use acemq_tests::{shared_broker, unique_name};
use lapin::BasicProperties;

/// The `XDG_CACHE_HOME` of every command here: the guest toolchains
/// `plugin build` installs, and the compiled plugins, kept in the
/// repository's target folder between runs instead of the user's cache.
fn cache_home() -> PathBuf {
    workspace_root().join("target").join("plugin-dev-cache")
}

fn acemq_host(args: &[&str], cwd: &Path) -> Output {
    acemq_host_with(args, cwd, &[])
}

/// `acemq-host ARGS` in `cwd`, with `env` set too.
fn acemq_host_with(args: &[&str], cwd: &Path, env: &[(&str, &str)]) -> Output {
    Command::new(host_binary())
        .args(args)
        .current_dir(cwd)
        .env("RUST_LOG", "warn")
        .env("XDG_CACHE_HOME", cache_home())
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// A folder for a new plugin, outside the repository.
fn outside_the_repository() -> tempfile::TempDir {
    let outside = tempfile::tempdir().unwrap();
    assert!(
        !outside.path().starts_with(workspace_root()),
        "the plugin must live outside the repository"
    );
    outside
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
    let outside = outside_the_repository();
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

    runs_as_the_template_says(&component, dir);
    forwards_on_the_broker(&component, Duration::from_secs(60)).await;
}

/// `plugin run` of a starter handler (every language's does the same): a
/// body is accepted and forwarded in capitals, a blank one rejected, and a
/// forward to an exchange the consumer may not publish to fails the run.
fn runs_as_the_template_says(component: &Path, dir: &Path) {
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
}

/// `component` in a host on the shared broker, forwarding to an exchange
/// bound to an output queue: a body published to its input comes out in
/// capitals and nothing is dead-lettered. `start`: how long the host may
/// take to load it (an interpreter compiles for a while).
async fn forwards_on_the_broker(component: &Path, start: Duration) {
    let broker = shared_broker();
    let (input, output, exchange) = (
        unique_name("probe.in"),
        unique_name("probe.out"),
        unique_name("probe.x"),
    );
    // The cache `plugin build` precompiled into (the user's, under this
    // test's XDG_CACHE_HOME): the host finds the component compiled.
    let config = format!(
        r#"[broker]
url = "{url}"

[host]
plugin_cache_dir = "{cache}"

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
        cache = cache_home().join("acemq-host/plugins").display(),
    );
    let host = HostProcess::start_within(&config, 1, start).unwrap();
    let log = host.log_text();
    assert!(
        log.contains("plugin taken from the compiled-plugin cache")
            && log.contains("from_cache=true")
            && !log.contains("compiling the plugin"),
        "the host compiled what plugin build had precompiled: {log}"
    );
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

/// What differs between the Python and JavaScript cases.
struct Language {
    /// The `--lang` value.
    flag: &'static str,
    /// The tests' command in the plugin's folder, and what it prints when
    /// it ran the starter's three tests.
    test: &'static [&'static str],
    ran_three: &'static str,
    /// The starter's handler, the file a change of makes the component stale.
    source: &'static str,
    /// The environment that keeps its package manager off the network.
    offline: &'static [(&'static str, &'static str)],
}

const PYTHON: Language = Language {
    flag: "python",
    test: &["python3", "-m", "unittest"],
    ran_three: "Ran 3 tests",
    source: "src/app.py",
    offline: &[("PIP_NO_INDEX", "1")],
};

const JAVASCRIPT: Language = Language {
    flag: "js",
    test: &["node", "--test", "test/"],
    ran_three: "# pass 3",
    source: "app.js",
    offline: &[("npm_config_offline", "true")],
};

#[tokio::test(flavor = "multi_thread")]
async fn a_new_python_plugin_tests_builds_runs_and_handles_a_message_on_the_broker() {
    a_new_plugin_in(&PYTHON).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_javascript_plugin_tests_builds_runs_and_handles_a_message_on_the_broker() {
    a_new_plugin_in(&JAVASCRIPT).await;
}

/// The loop in `language`: new, its native tests, build (and a rebuild
/// that does nothing, and one after a change), run, the broker; then a
/// second plugin elsewhere built with the package manager kept offline,
/// on the tools the first build installed. The build must produce the
/// component: a machine without python3 or node fails here, not skips.
async fn a_new_plugin_in(language: &Language) {
    let outside = outside_the_repository();
    let dir = outside.path();

    let created = acemq_host(&["plugin", "new", "probe", "--lang", language.flag], dir);
    assert_eq!(created.status.code(), Some(0), "{}", text(&created));
    let stdout = String::from_utf8_lossy(&created.stdout);
    assert!(stdout.contains("acemq-host plugin build probe"), "{stdout}");
    let plugin = dir.join("probe");
    for file in ["wit/plugin.wit", "README.md", ".gitignore", language.source] {
        assert!(plugin.join(file).is_file(), "no {file}: {stdout}");
    }
    let codec = acemq_host(
        &["plugin", "new", "codec", "--lang", language.flag, "--codec"],
        dir,
    );
    assert_eq!(codec.status.code(), Some(2), "{}", text(&codec));
    assert!(
        text(&codec).contains(&format!(
            "--codec is for Rust plugins only, not with --lang {}",
            language.flag
        )),
        "{}",
        text(&codec)
    );
    assert!(!dir.join("codec").exists());

    // Its tests pass natively, with nothing installed.
    let tested = Command::new(language.test[0])
        .args(&language.test[1..])
        .current_dir(&plugin)
        .output()
        .unwrap();
    assert!(tested.status.success(), "{}", text(&tested));
    assert!(
        text(&tested).contains(language.ran_three),
        "{}",
        text(&tested)
    );

    // build: the component, where it is, its size and the time it took.
    let built = acemq_host(&["plugin", "build", "probe"], dir);
    assert_eq!(built.status.code(), Some(0), "{}", text(&built));
    let component = plugin.join("target/plugins/probe.wasm");
    assert!(component.is_file(), "no component: {}", text(&built));
    let stdout = String::from_utf8_lossy(&built.stdout);
    assert!(
        stdout.contains("probe/target/plugins/probe.wasm")
            && stdout.contains(" bytes  written in ")
            && stdout.contains("probe.wasm: precompiled in "),
        "{stdout}"
    );
    let rebuilt = acemq_host(&["plugin", "build", "probe"], dir);
    assert_eq!(rebuilt.status.code(), Some(0), "{}", text(&rebuilt));
    assert!(text(&rebuilt).contains("up to date"), "{}", text(&rebuilt));
    // A changed source is built again.
    let source = plugin.join(language.source);
    let handler = std::fs::read_to_string(&source).unwrap();
    std::fs::write(&source, format!("{handler}\n")).unwrap();
    let changed = acemq_host(&["plugin", "build", "probe"], dir);
    assert_eq!(changed.status.code(), Some(0), "{}", text(&changed));
    assert!(text(&changed).contains("written in"), "{}", text(&changed));

    runs_as_the_template_says(&component, dir);
    forwards_on_the_broker(&component, Duration::from_secs(240)).await;

    // Another plugin, elsewhere, with the registry out of reach: the tools
    // installed by the first build serve it.
    let elsewhere = outside_the_repository();
    let created = acemq_host(
        &["plugin", "new", "second", "--lang", language.flag],
        elsewhere.path(),
    );
    assert_eq!(created.status.code(), Some(0), "{}", text(&created));
    let offline = acemq_host_with(
        &["plugin", "build", "second"],
        elsewhere.path(),
        language.offline,
    );
    assert_eq!(offline.status.code(), Some(0), "{}", text(&offline));
    assert!(
        elsewhere
            .path()
            .join("second/target/plugins/second.wasm")
            .is_file(),
        "{}",
        text(&offline)
    );
    assert!(!text(&offline).contains("installing"), "{}", text(&offline));
}
