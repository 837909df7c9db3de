//! Bad input at the command line: every refusal names what was wrong and
//! exits non-zero before anything is consumed.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use acemq_tests::host::{host_binary, plugin_path, workspace_root};
use acemq_tests::scheduler_peer::Vhost;

fn acemq_host(args: &[&str], config: Option<&str>) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(host_binary());
    command
        .args(args)
        .env_remove("ACEMQ_URL")
        .env("RUST_LOG", "info");
    if let Some(config) = config {
        let path = dir.path().join("host.toml");
        std::fs::write(&path, config).unwrap();
        command.arg("--config").arg(&path);
    }
    (command.output().unwrap(), dir)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn consumer_config(plugin: &Path) -> String {
    format!(
        "[broker]\nurl = \"amqp://guest:guest@127.0.0.1:1/%2f\"\n\n[[consumers]]\nqueue = \"q\"\nplugin = \"{}\"\n",
        plugin.display()
    )
}

#[test]
fn a_malformed_config_names_the_file_line_and_key() {
    let (output, _dir) = acemq_host(
        &["validate"],
        Some("[broker]\nurl = \"amqp://x\"\n\n[host]\ndrain_timeot = \"5s\"\n"),
    );
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(err.contains("host.toml:5:"), "{err}");
    assert!(err.contains("drain_timeot"), "{err}");
}

#[test]
fn a_missing_config_file_is_named() {
    let output = Command::new(host_binary())
        .args(["run", "--config", "/nonexistent/acemq.toml"])
        .output()
        .unwrap();
    let err = stderr(&output);
    assert_ne!(output.status.code(), Some(0));
    assert!(
        err.contains("/nonexistent/acemq.toml") && err.contains("cannot read"),
        "{err}"
    );
}

#[test]
fn a_missing_plugin_file_is_refused_before_connecting() {
    let (output, _dir) = acemq_host(
        &["run"],
        Some(&consumer_config(Path::new("/nonexistent/p.wasm"))),
    );
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(
        err.contains("/nonexistent/p.wasm") && err.contains("cannot read it"),
        "{err}"
    );
    assert!(
        !err.contains("connect"),
        "it must not have tried the broker: {err}"
    );
}

#[test]
fn garbage_a_core_module_and_a_wrong_world_are_each_named() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"this is not wasm").unwrap();
    let core = dir.path().join("core.wasm");
    // The smallest valid core module: magic and version.
    std::fs::write(&core, [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00]).unwrap();
    let codec = plugin_path("msgpack-codec");

    for (plugin, expected) in [
        (&garbage, "is not a WebAssembly component"),
        (&core, "is a core WebAssembly module, not a component"),
        (&codec, "does not export the handler world"),
    ] {
        let (output, _dir) = acemq_host(&["validate"], Some(&consumer_config(plugin)));
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{err}");
        assert!(err.contains(&plugin.display().to_string()), "{err}");
        assert!(err.contains(expected), "expected {expected:?} in: {err}");
    }
}

/// A plugin in a folder its group can write is refused at start, naming
/// the folder, its mode and its owner, before the plugin is even read.
#[test]
fn a_plugin_folder_others_can_write_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let plugin = plugins.join("echo.wasm");
    std::fs::copy(plugin_path("echo"), &plugin).unwrap();
    std::fs::set_permissions(&plugins, std::fs::Permissions::from_mode(0o775)).unwrap();

    let (output, _dir) = acemq_host(&["run"], Some(&consumer_config(&plugin)));
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "plugin folder {}: is writable by its group (mode 0775, owner uid ",
            plugins.display()
        )),
        "{err}"
    );
    assert!(
        !err.contains("connect"),
        "it must not have tried the broker: {err}"
    );
}

/// A config with a compiled-plugin cache in `cache` and the echo plugin.
fn cached_config(cache: &Path) -> String {
    format!(
        "[host]\nplugin_cache_dir = \"{}\"\n\n{}",
        cache.display(),
        consumer_config(&plugin_path("echo"))
    )
}

#[test]
fn a_cache_folder_or_key_others_could_reach_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let chmod = |path: &Path, mode| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    chmod(&cache, 0o770);
    let (output, _dir) = acemq_host(&["validate"], Some(&cached_config(&cache)));
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "plugin cache folder {}: is writable by its group (mode 0770, owner uid ",
            cache.display()
        )),
        "{err}"
    );

    chmod(&cache, 0o700);
    let key = dir.path().join("cache.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    chmod(&key, 0o640);
    let (output, _dir) = acemq_host(&["validate"], Some(&cached_config(&cache)));
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "plugin cache key file {}: is accessible to its group or others (mode 0640",
            key.display()
        )),
        "{err}"
    );
}

/// A changed cache entry is named in a warning and compiled again from the
/// plugin; the next start uses the rewritten entry without a word.
#[test]
fn a_tampered_cache_entry_is_named_and_compiled_again() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let config = cached_config(&cache);
    let validate = || {
        let (output, _dir) = acemq_host(&["validate"], Some(&config));
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(0), "{err}");
        err
    };
    assert!(validate().contains("from_cache=false"));
    // The compiled plugins (`*.cwasm`); the compiled functions' file
    // (`functions.redb`) sits beside them.
    let [entry] = &std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "cwasm"))
        .collect::<Vec<_>>()[..]
    else {
        panic!("one cache entry expected")
    };
    let mut bytes = std::fs::read(entry).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(entry, bytes).unwrap();

    let err = validate();
    let warning = err
        .lines()
        .find(|line| line.contains("WARN"))
        .unwrap_or_else(|| panic!("no warning:\n{err}"));
    assert!(
        warning.contains("compiled-plugin cache entry is not trusted: its MAC does not match"),
        "{warning}"
    );
    assert!(warning.contains(&entry.display().to_string()), "{warning}");
    assert!(err.contains("from_cache=false"), "{err}");
    let err = validate();
    assert!(
        !err.contains("WARN") && err.contains("from_cache=true"),
        "{err}"
    );
}

#[test]
fn an_unreachable_broker_is_retried_then_gives_up_without_showing_the_password() {
    let config = format!(
        "[broker]\nurl = \"amqp://guest:s3cret@127.0.0.1:1/%2f\"\nconnect_timeout = \"2s\"\n\n[[consumers]]\nqueue = \"q\"\nplugin = \"{}\"\n",
        plugin_path("echo").display()
    );
    let started = Instant::now();
    let (output, _dir) = acemq_host(&["run"], Some(&config));
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "it gave up without retrying"
    );
    assert!(err.contains("cannot reach the broker yet"), "{err}");
    assert!(
        err.contains("could not connect to the broker at amqp://guest:***@127.0.0.1:1/%2f"),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "the password leaked: {err}");
}

#[test]
fn plan_prints_every_declaration_of_the_example_config() {
    let example = workspace_root().join("host/examples/orders.toml");
    let output = Command::new(host_binary())
        .args(["plan", "--config"])
        .arg(&example)
        .output()
        .unwrap();
    let plan = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", stderr(&output));
    for line in [
        "declare exchange orders (topic, durable)",
        "declare queue orders.new (quorum, durable, x-dead-letter-exchange='acemq.dlx', x-dead-letter-routing-key='orders.new.dlq', x-queue-type='quorum')",
        "declare queue orders.new.dlq (classic, durable)",
        "declare queue orders.new.parked (classic, durable)",
        "declare binding orders.new (from orders on order.*)",
    ] {
        assert!(plan.contains(line), "missing {line:?} in:\n{plan}");
    }
}

#[test]
fn the_stream_example_validates_with_its_plugin() {
    let example = workspace_root().join("host/examples/order-log.toml");
    let output = Command::new(host_binary())
        .args(["validate", "--config"])
        .arg(&example)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let plan = Command::new(host_binary())
        .args(["plan", "--config"])
        .arg(&example)
        .output()
        .unwrap();
    let plan = String::from_utf8_lossy(&plan.stdout);
    assert!(
        plan.contains(
            "declare queue orders.log (stream, durable, x-max-age='7D', x-queue-type='stream')"
        ),
        "{plan}"
    );
}

#[test]
fn plan_reports_every_problem_of_an_invalid_topology() {
    let config = r#"
[[exchanges]]
name = "events"

[[queues]]
name = "a"

[[queues]]
name = "a"

[[bindings]]
queue = "missing"
exchange = "events"
routing_key = "x"
"#;
    let (output, _dir) = acemq_host(&["plan"], Some(config));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        stderr(&output)
    );
    assert_eq!(output.status.code(), Some(2), "{text}");
    for problem in [
        "exchange 'events' has no kind",
        "declares queue 'a' twice",
        "names queue 'missing', which this topology does not declare",
    ] {
        assert!(text.contains(problem), "missing {problem:?} in:\n{text}");
    }
}

#[test]
fn inspect_describes_a_plugin() {
    let output = Command::new(host_binary())
        .args(["plugin", "inspect"])
        .arg(plugin_path("order-router"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        text.contains("contract: acemq:plugin@0.4.0 (this host's own)"),
        "{text}"
    );
    assert!(
        text.contains("world:   acemq:plugin/handler-plugin@0.4.0"),
        "{text}"
    );
    assert!(
        text.contains("exports: acemq:plugin/handler@0.4.0"),
        "{text}"
    );
    assert!(text.contains("sha256:  "), "{text}");
    assert!(text.contains("config:  not declared"), "{text}");
    let output = Command::new(host_binary())
        .args(["plugin", "inspect"])
        .arg(plugin_path("outcomes"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("config:  out_exchange\n"), "{text}");
}

/// A `[consumers.config]` key the plugin does not declare is warned about
/// at validate (and at start), naming the key and the ones it reads.
#[test]
fn a_config_key_the_plugin_does_not_read_is_warned_about() {
    let config = format!(
        "{}\n[consumers.config]\nout_exchnage = \"orders\"\n",
        consumer_config(&plugin_path("outcomes"))
    );
    let (output, _dir) = acemq_host(&["validate"], Some(&config));
    let log = stderr(&output);
    assert!(output.status.success(), "{log}");
    assert!(
        log.contains("[consumers.config] key 'out_exchnage' is not one this plugin reads; it reads: out_exchange"),
        "{log}"
    );
}

/// The cells of a row of `schedule list`'s tables: columns are two spaces
/// apart at least, and no cell holds two spaces in a row.
fn cells(line: &str) -> Vec<&str> {
    line.split("  ")
        .map(str::trim)
        .filter(|cell| !cell.is_empty())
        .collect()
}

/// `schedule list` peeks at the scheduler's queues: each message with its
/// queue, due time, time left, age, id, type and target, read off the
/// contract's headers (one written as this host writes them, one as
/// another library does, with only a publish timestamp to age it by), and
/// every message still where it was afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn schedule_list_shows_each_scheduled_message_and_consumes_none() {
    use acemq_host::envelope::rfc3339_millis;
    use lapin::BasicProperties;
    use lapin::types::{AMQPValue, FieldTable, LongString};

    let vhost = Vhost::create(acemq_tests::shared_broker(), "cli.schedule").unwrap();
    vhost.declare_scheduler().await.unwrap();
    let now = acemq_host::envelope::now_ms();
    let text = |value: &str| AMQPValue::LongString(LongString::from(value));
    let headers = |entries: Vec<(&str, AMQPValue)>| {
        let mut table = FieldTable::default();
        for (name, value) in entries {
            table.insert(name.into(), value);
        }
        table
    };

    let reminder_due = now + 12 * 60_000 + 30_000;
    let reminder = BasicProperties::default()
        .with_message_id("reminder-1".into())
        .with_delivery_mode(2)
        .with_headers(headers(vec![
            ("x-acemq-id", text("reminder-1")),
            ("x-acemq-type", text("ScheduledMessage")),
            (
                "x-acemq-first-seen",
                AMQPValue::LongLongInt(now as i64 - 120_000),
            ),
            ("x-schedule-exchange", text("reminders")),
            ("x-schedule-routing-key", text("reminder.due")),
            (
                "x-schedule-due-at",
                AMQPValue::LongLongInt(reminder_due as i64),
            ),
            ("x-schedule-content-type", text("application/json")),
            ("x-schedule-message-type", text("ReminderDue")),
        ]));
    let closing_due = now + 90 * 60_000 + 30_000;
    let closing = BasicProperties::default()
        .with_message_id("order-close-7".into())
        .with_timestamp(now / 1000 - 300)
        .with_headers(headers(vec![
            ("x-acemq-type", text("ScheduledMessage")),
            ("x-schedule-exchange", text("orders")),
            ("x-schedule-routing-key", text("order.close")),
            (
                "x-schedule-due-at",
                AMQPValue::LongLongInt(closing_due as i64),
            ),
        ]));
    // Through the scheduler's exchange, as every library publishes: the
    // bindings route each to its rung (mandatory: unrouted would fail).
    vhost
        .broker
        .publish(
            "acemq.schedule",
            "acemq.schedule.10m",
            b"{\"remind\":1}",
            reminder,
        )
        .await
        .unwrap();
    vhost
        .broker
        .publish(
            "acemq.schedule",
            "acemq.schedule.1h",
            b"{\"order\":7}",
            closing,
        )
        .await
        .unwrap();

    let config = format!("[broker]\nurl = \"{}\"\n", vhost.broker.amqp_url());
    let (output, _dir) =
        tokio::task::block_in_place(|| acemq_host(&["schedule", "list"], Some(&config)));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", stderr(&output));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        "Messages waiting in the AceMQ scheduler's queues (peeked: nothing consumed)"
    );
    // This config runs no scheduler; the heading says so.
    assert!(
        lines[1].starts_with("note: ") && lines[1].contains("host.toml does not run the scheduler"),
        "{stdout}"
    );
    assert_eq!(
        cells(lines[3]),
        ["QUEUE", "#", "DUE AT", "DUE", "AGE", "ID", "TYPE", "TARGET"],
        "{stdout}"
    );
    // The longest rung first.
    let row = cells(lines[4]);
    assert_eq!(
        row[..3],
        ["acemq.schedule.1h", "1", &rfc3339_millis(closing_due)]
    );
    assert!(row[3].starts_with("due in 1h 30m"), "{stdout}");
    assert!(row[4].starts_with("5m"), "aged by its timestamp: {stdout}");
    assert_eq!(
        row[5..],
        ["order-close-7", "ScheduledMessage", "orders / order.close"],
        "{stdout}"
    );
    let row = cells(lines[5]);
    assert_eq!(
        row[..3],
        ["acemq.schedule.10m", "1", &rfc3339_millis(reminder_due)]
    );
    assert!(row[3].starts_with("due in 12m "), "{stdout}");
    assert!(row[4].starts_with("2m"), "aged by its first-seen: {stdout}");
    assert_eq!(
        row[5..],
        ["reminder-1", "ReminderDue", "reminders / reminder.due"],
        "{stdout}"
    );
    let counts: Vec<Vec<&str>> = lines[7..14].iter().map(|line| cells(line)).collect();
    assert_eq!(
        counts,
        [
            vec!["QUEUE", "READY"],
            vec!["acemq.schedule.1h", "1"],
            vec!["acemq.schedule.10m", "1"],
            vec!["acemq.schedule.1m", "0"],
            vec!["acemq.schedule.10s", "0"],
            vec!["acemq.schedule.1s", "0"],
            vec!["acemq.schedule.due", "0"],
        ],
        "{stdout}"
    );
    assert!(
        stdout.ends_with("\n2 of the 2 messages ready shown\n"),
        "{stdout}"
    );

    // A config that runs the scheduler: no note; --limit counts rows in all.
    let config = format!("{config}\n[scheduler]\nenabled = true\n");
    let (output, _dir) = tokio::task::block_in_place(|| {
        acemq_host(&["schedule", "list", "--limit", "1"], Some(&config))
    });
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", stderr(&output));
    assert!(!stdout.contains("note:"), "{stdout}");
    let rows: Vec<&str> = stdout.lines().filter(|l| l.contains(" due in ")).collect();
    assert_eq!(rows.len(), 1, "{stdout}");
    assert!(rows[0].contains("order-close-7"), "{stdout}");
    assert!(
        stdout.ends_with("\n1 of the 2 messages ready shown\n"),
        "{stdout}"
    );

    // Peeked twice, consumed never: each is still on its rung.
    for (queue, id) in [
        ("acemq.schedule.1h", "order-close-7"),
        ("acemq.schedule.10m", "reminder-1"),
    ] {
        assert_eq!(
            vhost.broker.message_count(queue).await.unwrap(),
            1,
            "{queue}"
        );
        let left = vhost
            .broker
            .drain(queue, 1, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(left[0].message_id.as_deref(), Some(id), "{queue}");
    }
}

/// Where the broker has none of the scheduler's queues, `schedule list`
/// says so and succeeds; a broker it cannot reach fails it (exit 1).
#[test]
fn schedule_list_names_missing_queues_and_fails_without_a_broker() {
    let vhost = Vhost::create(acemq_tests::shared_broker(), "cli.schedule.none").unwrap();
    let config = format!("[broker]\nurl = \"{}\"\n", vhost.broker.amqp_url());
    let (output, _dir) = acemq_host(&["schedule", "list"], Some(&config));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", stderr(&output));
    assert!(
        stdout.contains("None of the scheduler's queues exists on this broker"),
        "{stdout}"
    );

    let unreachable =
        "[broker]\nurl = \"amqp://guest:guest@127.0.0.1:1/%2f\"\nconnect_timeout = \"2s\"\n";
    let (output, _dir) = acemq_host(&["schedule", "list"], Some(unreachable));
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(output.stdout.is_empty());
}

/// A config whose consumer keeps state in the embedded store at `file`.
fn state_config(file: &Path) -> String {
    format!(
        "{}state = \"orders\"\n\n[state]\npath = \"{}\"\n",
        consumer_config(&plugin_path("velocity")),
        file.display()
    )
}

#[test]
fn validate_neither_creates_nor_opens_the_state_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state.redb");
    let (output, _config_dir) = acemq_host(&["validate"], Some(&state_config(&file)));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!file.exists(), "validate created {}", file.display());
}

#[tokio::test]
async fn state_get_list_and_delete_work_beside_a_host_holding_the_store() {
    use acemq_host::state::embedded::{EmbeddedStore, Opener};
    use acemq_host::state::{Backend, Commit, InputKey, KeyWrite, Quota, Write};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("state.redb");
    // This test process holds the store as a running host does.
    let held = EmbeddedStore::open(&file, Opener::Host).unwrap();
    let put = |key: &[u8], value: &[u8]| KeyWrite {
        key: key.to_vec(),
        write: Write::Put {
            value: value.to_vec(),
            expires_at_ms: None,
        },
        expect: None,
    };
    let commit = Commit {
        namespace: Some("orders".into()),
        quota: Quota {
            max_keys: 100,
            max_bytes: 10_000,
        },
        writes: vec![
            put(b"customer/c-1", b"[1]"),
            put(b"customer/c-2", &[0xff, 0]),
        ],
        done: InputKey {
            queue: "q".into(),
            id: "m1".into(),
        },
        retention: Duration::from_secs(60),
        claim_holder: None,
        reservation: None,
        now_ms: acemq_tests::state_cases::now_ms(),
    };
    held.commit(&commit).await.unwrap();
    // A second host is refused, naming the file.
    let second = EmbeddedStore::open(&file, Opener::Host)
        .err()
        .expect("refused");
    assert!(
        second.to_string().contains("is in use by another host"),
        "{second}"
    );
    let config = state_config(&file);
    let run = |args: &[&str]| acemq_host(args, Some(&config)).0;
    let listed = run(&["state", "list", "--namespace", "orders"]);
    let out = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert!(out.contains("2 keys"), "{out}");
    assert!(
        out.contains("customer/c-1\n") && out.contains("  [1]\n"),
        "{out}"
    );
    assert!(
        out.contains("  0xff00\n"),
        "a binary value is shown in hex: {out}"
    );
    let got = run(&["state", "get", "--namespace", "orders", "customer/c-2"]);
    assert_eq!(got.status.code(), Some(0), "{}", stderr(&got));
    let deleted = run(&["state", "delete", "--namespace", "orders", "customer/c-2"]);
    assert_eq!(deleted.status.code(), Some(0), "{}", stderr(&deleted));
    let gone = run(&["state", "get", "--namespace", "orders", "customer/c-2"]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(
        stderr(&gone).contains("is not in the namespace \"orders\""),
        "{}",
        stderr(&gone)
    );
    // The host sees the tool's delete.
    let now = acemq_tests::state_cases::now_ms();
    assert_eq!(
        held.get("orders", b"customer/c-2", now).await.unwrap(),
        None
    );
    assert!(
        held.get("orders", b"customer/c-1", now)
            .await
            .unwrap()
            .is_some()
    );
    let bad = run(&["state", "list", "--namespace", "a:b"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("--namespace: \"a:b\" is not a namespace name"),
        "{}",
        stderr(&bad)
    );
}

/// `--version` says what a deployed binary is: the commit it was built
/// from (this checkout's), the wasmtime it links (the lockfile's) and the
/// plugin contract (the WIT's), each read here from its own source.
#[test]
fn version_names_the_commit_the_wasmtime_and_the_contract() {
    let (output, _dir) = acemq_host(&["--version"], None);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let root = workspace_root();
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(&root)
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    // The binary may predate the newest commit; it must name a commit of
    // this checkout, abbreviated as git does.
    let commit = text
        .lines()
        .find_map(|l| l.strip_prefix("commit: "))
        .unwrap_or_else(|| panic!("no commit line: {text}"));
    assert_eq!(commit.len(), head.len(), "{text}");
    let known = Command::new("git")
        .args(["cat-file", "-e", &format!("{commit}^{{commit}}")])
        .current_dir(&root)
        .status()
        .unwrap();
    assert!(known.success(), "{commit} is no commit of this checkout");
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap();
    let wasmtime = lock
        .split("name = \"wasmtime\"\nversion = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap();
    assert!(text.contains(&format!("wasmtime: {wasmtime}\n")), "{text}");
    let wit = std::fs::read_to_string(root.join("wit/plugin.wit")).unwrap();
    let contract = wit
        .lines()
        .find_map(|l| l.trim().strip_prefix("package "))
        .unwrap()
        .trim_end_matches(';');
    assert!(
        text.contains(&format!("plugin contract: {contract} ")),
        "{text}"
    );
}

/// A Kubernetes ConfigMap volume as the kubelet mounts it: a folder of mode
/// 0777 owned by root, read-only in the container, whose plugin is a link
/// through `..data`. Read-only, the host trusts it (nobody in the container
/// can write it); the same folder writable is refused. Built in a mount
/// namespace of its own (`unshare --mount`, as root), with a tmpfs.
#[test]
fn a_configmap_style_volume_is_trusted_read_only_and_refused_writable() {
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("plugins");
    std::fs::create_dir(&volume).unwrap();
    let config = dir.path().join("host.toml");
    std::fs::write(&config, consumer_config(&volume.join("handler.wasm"))).unwrap();
    let script = r#"set -e
mount -t tmpfs -o mode=0777 acemq-test "$1"
mkdir "$1/..2026_12_04_18_00_00.1"
cp "$2" "$1/..2026_12_04_18_00_00.1/handler.wasm"
ln -s ..2026_12_04_18_00_00.1 "$1/..data"
ln -s ..data/handler.wasm "$1/handler.wasm"
if [ "$3" = ro ]; then mount -o remount,ro "$1"; fi
exec "$4" validate --config "$5""#;
    let run = |mode: &str| {
        Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
            ])
            .arg(&volume)
            .arg(plugin_path("echo"))
            .arg(mode)
            .arg(host_binary())
            .arg(&config)
            .output()
            .unwrap()
    };
    let read_only = run("ro");
    if String::from_utf8_lossy(&read_only.stderr).contains("unshare failed") {
        eprintln!(
            "SKIPPED a_configmap_style_volume_is_trusted_read_only_and_refused_writable: \
             no mount namespace here (it needs root): {}",
            stderr(&read_only)
        );
        return;
    }
    assert!(
        read_only.status.success(),
        "{}{}",
        String::from_utf8_lossy(&read_only.stdout),
        stderr(&read_only)
    );
    let writable = run("rw");
    assert_eq!(writable.status.code(), Some(2), "{}", stderr(&writable));
    assert!(
        stderr(&writable).contains("is writable by its group and others (mode 0777"),
        "{}",
        stderr(&writable)
    );
}
