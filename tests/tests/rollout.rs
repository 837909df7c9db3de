//! Rolling out a candidate version on the real broker (docs/rollout.md):
//! a canary that faults on 5 % of its messages is rolled back with nothing
//! lost and only its share affected; a good one is promoted through its
//! steps, and a restart keeps the promotion; two hosts on one queue give
//! the candidate the same messages; a shadow started from the command line
//! reports exactly the 10 % of messages it decides differently on, while the
//! current version's outputs are unchanged.
//!
//! The versions are the stamp handlers: `stamp-v1` (current), `stamp-v2`
//! (a good candidate), `stamp-flaky` (traps on bodies that are multiples of
//! 20) and `stamp-quirky` (stamps multiples of 10 `v1-varied`). Bodies are
//! numbers, message ids `msg-N`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use lapin::BasicProperties;
use serde_json::Value;
use sha2::{Digest, Sha256};

use acemq_tests::host::{HostOptions, HostProcess, free_port, host_binary, plugin_path};
use acemq_tests::stamp::StampConfig;
use acemq_tests::{shared_broker, unique_name};

const TOKEN: &str = "rollout-test-token-0123456789";

/// The bucket the host puts envelope id `id` in (docs/rollout.md, "Which
/// deliveries the candidate gets"), computed here from its definition.
fn bucket(id: &str) -> u64 {
    let digest = Sha256::digest(id.as_bytes());
    u64::from_be_bytes(digest[..8].try_into().unwrap()) % 10_000
}

/// One test's queues, folder and admin address.
struct Scene {
    input: String,
    exchange: String,
    output: String,
    dir: tempfile::TempDir,
    admin: String,
}

impl Scene {
    fn new(prefix: &str) -> Self {
        Self {
            input: unique_name(&format!("{prefix}.in")),
            exchange: unique_name(&format!("{prefix}.x")),
            output: unique_name(&format!("{prefix}.out")),
            dir: tempfile::tempdir().unwrap(),
            admin: format!("127.0.0.1:{}", free_port()),
        }
    }

    /// The host's config, the current version `stamp-v1`, and `candidate`
    /// (lines of a `[consumers.candidate]`, or none).
    fn config(&self, candidate: &str) -> PathBuf {
        // A retry table is a table of its own: it goes after the broker's
        // lines, as a `[broker.tls]` would.
        let broker = format!(
            "url = \"{}\"\n\n[retry.quick]\nkind = \"fixed\"\nattempts = 4\ninitial = \"300ms\"",
            shared_broker().amqp_url()
        );
        let host = format!(
            "admin_listen = \"{}\"\nrollout_state_dir = \"rollouts\"",
            self.admin
        );
        let mut scene = StampConfig::new(&self.input, &self.output, &self.exchange);
        scene.broker = &broker;
        scene.host = &host;
        scene.input_queue = "dead_letter = true";
        scene.consumer = "retry = \"quick\"\nprefetch = 20\nconcurrency = 2";
        // `[consumers.candidate]` belongs to the consumer above it.
        let config = format!("{}{candidate}\n", scene.toml());
        let path = self.dir.path().join("host.toml");
        std::fs::write(&path, config).unwrap();
        path
    }

    fn start(&self, config: &Path) -> HostProcess {
        // The config's folder stays with the scene (its rollout records).
        let scratch = tempfile::tempdir().unwrap();
        HostProcess::start_with(
            config,
            scratch,
            &HostOptions {
                admin_token: Some(TOKEN.into()),
                ..HostOptions::default()
            },
        )
        .unwrap()
    }

    /// Publishes messages `range` (body `N`, message id `msg-N`).
    async fn publish(&self, range: std::ops::Range<u32>) {
        shared_broker()
            .publish_many(
                "",
                &self.input,
                range.map(|i| {
                    let properties = BasicProperties::default()
                        .with_message_id(format!("msg-{i}").as_str().into());
                    (i.to_string().into_bytes(), properties)
                }),
            )
            .await
            .unwrap();
    }

    /// Takes `count` outputs: message id -> the version that stamped it.
    async fn outputs(&self, count: usize) -> BTreeMap<String, String> {
        let got = shared_broker()
            .drain(&self.output, count, Duration::from_secs(120))
            .await
            .unwrap();
        assert_eq!(got.len(), count, "outputs missing");
        got.iter()
            .map(|m| {
                let v: Value = serde_json::from_slice(&m.body).unwrap();
                (
                    v["input_id"].as_str().unwrap().to_string(),
                    v["version"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    /// `GET /rollouts`'s entry for the consumer.
    fn rollout(&self) -> Value {
        let (status, body) = get_with_token(&format!("http://{}/rollouts", self.admin));
        assert_eq!(status, 200, "{body}");
        let all: Value = serde_json::from_str(&body).unwrap();
        all.as_array()
            .unwrap()
            .iter()
            .find(|r| r["queue"] == self.input.as_str())
            .cloned()
            .unwrap_or(Value::Null)
    }

    fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let (_, text) = get_with_token(&format!("http://{}/metrics", self.admin));
        acemq_tests::host::metric_sum(&text, name, labels)
    }

    /// `acemq-host rollout ARGS --config ...`: exit code and what it printed.
    fn rollout_command(&self, args: &[&str]) -> (Option<i32>, String) {
        let output = Command::new(host_binary())
            .arg("rollout")
            .args(args)
            .arg("--config")
            .arg(self.dir.path().join("host.toml"))
            .env("ACEMQ_ADMIN_TOKEN", TOKEN)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.code(), text)
    }
}

fn get_with_token(url: &str) -> (u16, String) {
    let agent = ureq::Agent::config_builder()
        .proxy(None)
        .http_status_as_error(false)
        .build()
        .new_agent();
    let mut response = agent
        .get(url)
        .header("Authorization", &format!("Bearer {TOKEN}"))
        .call()
        .unwrap();
    (
        response.status().as_u16(),
        response.body_mut().read_to_string().unwrap(),
    )
}

fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Call times are not what these tests judge: with the other test binaries
/// running beside them, a few slow calls among a step's 30 once made a good
/// candidate's 99th percentile 4 times the current version's (7.5 against
/// 1.9 ms) and rolled it back. The judge's unit tests hold that rule.
const CALL_TIME_NOT_JUDGED: &str = "max_call_time_ratio = 1000\n";

/// A canary that traps on 5 % of its messages, against 1 % allowed over
/// steps of 100 calls: rolled back at its second fault, long before its
/// step ends. Its faulted messages are retried on the current version once
/// it is rolled back: every message is stamped, none is dead-lettered, the
/// candidate stamped only messages of its 20 % share, and only it faulted.
#[tokio::test(flavor = "multi_thread")]
async fn a_candidate_faulting_on_five_percent_is_rolled_back_and_nothing_is_lost() {
    const MESSAGES: u32 = 1000;
    let s = Scene::new("rollout.bad");
    let config = s.config(&format!(
        "[consumers.candidate]\nplugin = \"{}\"\nsteps = [\"20%\", \"100%\"]\nmessages_per_step = 100\nmax_fault_rate_increase = \"1%\"\n{CALL_TIME_NOT_JUDGED}",
        plugin_path("stamp-flaky").display()
    ));
    let mut host = tokio::task::block_in_place(|| s.start(&config));
    s.publish(0..MESSAGES).await;
    let stamped = s.outputs(MESSAGES as usize).await;
    tokio::task::block_in_place(|| {
        host.wait_for_log("candidate rolled back", 1, Duration::from_secs(30))
    })
    .unwrap();
    assert_eq!(
        stamped.len(),
        MESSAGES as usize,
        "every message stamped once"
    );
    let dead = shared_broker()
        .message_count(&format!("{}.dlq", s.input))
        .await
        .unwrap();
    assert_eq!(dead, 0, "nothing dead-lettered");
    for (id, version) in &stamped {
        if version == "v2" {
            assert!(bucket(id) < 2000, "{id} is outside the candidate's 20%");
        }
    }
    assert!(
        stamped.values().any(|v| v == "v2"),
        "the candidate served some"
    );
    let faulted = |role| {
        s.metric(
            "acemq_rollout_calls_total",
            &[("role", role), ("result", "faulted")],
        )
    };
    assert_eq!(faulted("current"), 0.0);
    assert!(faulted("candidate") >= 2.0);
    let rollout = tokio::task::block_in_place(|| s.rollout());
    assert_eq!(rollout["status"], "rolled_back", "{rollout}");
    let reason = rollout["reason"].as_str().unwrap();
    assert!(
        reason.contains("the candidate faulted on")
            && reason.contains("more than the 1.0% increase allowed"),
        "{reason}"
    );
    assert_eq!(s.metric("acemq_rollout_share", &[("queue", &s.input)]), 0.0);
    let (code, shown) = tokio::task::block_in_place(|| s.rollout_command(&["status"]));
    assert_eq!(code, Some(0), "{shown}");
    assert!(
        shown.contains("rolled_back") && shown.contains("why: at 20% the candidate faulted"),
        "{shown}"
    );
    host.terminate(Duration::from_secs(30)).unwrap();
}

/// A good candidate steps through 10 %, 50 % and 100 % and is promoted:
/// every later message is its; and a restart of the host keeps the
/// promotion from its record.
#[tokio::test(flavor = "multi_thread")]
async fn a_good_candidate_is_promoted_through_its_steps_and_a_restart_keeps_it() {
    let s = Scene::new("rollout.good");
    let config = s.config(&format!(
        "[consumers.candidate]\nplugin = \"{}\"\nsteps = [\"10%\", \"50%\", \"100%\"]\nmessages_per_step = 30\n{CALL_TIME_NOT_JUDGED}",
        plugin_path("stamp-v2").display()
    ));
    let mut host = tokio::task::block_in_place(|| s.start(&config));
    s.publish(0..600).await;
    let stamped = s.outputs(600).await;
    tokio::task::block_in_place(|| {
        host.wait_for_log("candidate promoted", 1, Duration::from_secs(30))
    })
    .unwrap();
    assert!(stamped.values().any(|v| v == "v1") && stamped.values().any(|v| v == "v2"));
    let steps = host
        .log_lines()
        .iter()
        .filter(|l| l.contains("passed its step"))
        .count();
    assert_eq!(steps, 2, "two steps passed before the last");
    s.publish(600..620).await;
    let after: Vec<String> = s.outputs(20).await.into_values().collect();
    assert!(after.iter().all(|v| v == "v2"), "{after:?}");
    assert_eq!(
        tokio::task::block_in_place(|| s.rollout())["status"],
        "promoted"
    );
    host.terminate(Duration::from_secs(30)).unwrap();

    let mut again = tokio::task::block_in_place(|| s.start(&config));
    tokio::task::block_in_place(|| {
        again.wait_for_log(
            "was promoted before this host restarted",
            1,
            Duration::from_secs(10),
        )
    })
    .unwrap();
    s.publish(620..640).await;
    let restarted: Vec<String> = s.outputs(20).await.into_values().collect();
    assert!(restarted.iter().all(|v| v == "v2"), "{restarted:?}");
    again.terminate(Duration::from_secs(30)).unwrap();
}

/// Two hosts on one queue route by the same hash: every message stamped by
/// the candidate is in its 30 % share, every other one by the current
/// version, whichever host took it.
#[tokio::test(flavor = "multi_thread")]
async fn two_hosts_on_one_queue_give_the_candidate_the_same_messages() {
    let s = Scene::new("rollout.two");
    let config = s.config(&format!(
        "[consumers.candidate]\nplugin = \"{}\"\nsteps = [\"30%\"]\nmessages_per_step = 1000000\n",
        plugin_path("stamp-v2").display()
    ));
    let first = tokio::task::block_in_place(|| s.start(&config));
    let second_admin = format!("127.0.0.1:{}", free_port());
    let second_config = s.dir.path().join("second.toml");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace(&s.admin, &second_admin)
        .replace(
            "rollout_state_dir = \"rollouts\"",
            "rollout_state_dir = \"rollouts-2\"",
        );
    std::fs::write(&second_config, text).unwrap();
    let second = tokio::task::block_in_place(|| s.start(&second_config));
    s.publish(0..400).await;
    let stamped = s.outputs(400).await;
    for (id, version) in &stamped {
        let expected = if bucket(id) < 3000 { "v2" } else { "v1" };
        assert_eq!(version, expected, "{id} (bucket {})", bucket(id));
    }
    for admin in [&s.admin, &second_admin] {
        let (_, text) = get_with_token(&format!("http://{admin}/metrics"));
        let handled =
            acemq_tests::host::metric_sum(&text, "acemq_consume_total", &[("queue", &s.input)]);
        assert!(
            handled > 0.0,
            "the host at {admin} handled none: the test proves little"
        );
    }
    first.terminate(Duration::from_secs(30)).unwrap();
    second.terminate(Duration::from_secs(30)).unwrap();
}

/// A shadow on a running host: the current version's outputs are all there
/// and all its own, and the shadow's comparison counts exactly the 10 % of
/// messages its candidate stamps otherwise, naming the first ones.
#[tokio::test(flavor = "multi_thread")]
async fn a_shadow_reports_its_differences_exactly_and_changes_nothing() {
    const MESSAGES: u32 = 200;
    let s = Scene::new("rollout.shadow");
    // Room for every shadow call at once: none is skipped, so the count is
    // exact.
    let config = s.config(&format!(
        "[consumers.candidate]\nplugin = \"{}\"\nmode = \"shadow\"\nshadow_concurrency = 16\n",
        plugin_path("stamp-quirky").display()
    ));
    let host = tokio::task::block_in_place(|| s.start(&config));
    s.publish(0..MESSAGES).await;
    let stamped = s.outputs(MESSAGES as usize).await;
    assert!(
        stamped.values().all(|v| v == "v1"),
        "only the current version publishes"
    );
    tokio::task::block_in_place(|| {
        wait_until(
            "every shadow call compared",
            Duration::from_secs(30),
            || {
                let shadow = &s.rollout()["shadow"];
                shadow["compared"].as_u64().unwrap_or(0) + shadow["skipped"].as_u64().unwrap_or(0)
                    == u64::from(MESSAGES)
            },
        )
    });
    let rollout = tokio::task::block_in_place(|| s.rollout());
    let shadow = &rollout["shadow"];
    assert_eq!(shadow["skipped"], 0, "{shadow}");
    assert_eq!(shadow["compared"], MESSAGES, "{shadow}");
    assert_eq!(shadow["different"], MESSAGES / 10, "{shadow}");
    assert_eq!(shadow["difference_rate"], 0.1, "{shadow}");
    let examples = shadow["examples"].as_array().unwrap();
    assert_eq!(examples.len(), 20, "the first 20 kept");
    for example in examples {
        let n: u32 = example["message_id"].as_str().unwrap()["msg-".len()..]
            .parse()
            .unwrap();
        assert_eq!(n % 10, 0, "{example}");
        assert!(
            example["difference"]
                .as_str()
                .unwrap()
                .contains("v1-varied"),
            "{example}"
        );
    }
    assert_eq!(
        shared_broker().message_count(&s.output).await.unwrap(),
        0,
        "no more outputs than the current version's"
    );
    host.terminate(Duration::from_secs(30)).unwrap();
}

/// A rollout started and aborted from the command line on a running host
/// configured without one: its status shows it, an abort ends it (the
/// current version serves every message again), and a second abort is
/// refused, saying why; a candidate that is no component is refused at
/// start.
#[tokio::test(flavor = "multi_thread")]
async fn a_rollout_is_started_watched_and_aborted_from_the_command_line() {
    let s = Scene::new("rollout.cli");
    let config = s.config("");
    let host = tokio::task::block_in_place(|| s.start(&config));
    let garbage = s.dir.path().join("garbage.wasm");
    std::fs::write(&garbage, b"not a component").unwrap();
    let start = |plugin: &Path| {
        s.rollout_command(&[
            "start",
            "--queue",
            &s.input,
            "--plugin",
            plugin.to_str().unwrap(),
            "--steps",
            "50%,100%",
            "--messages-per-step",
            "100000",
        ])
    };
    let (code, shown) = tokio::task::block_in_place(|| start(&garbage));
    assert_eq!(code, Some(1), "{shown}");
    assert!(
        shown.contains("422") && shown.contains("garbage.wasm"),
        "{shown}"
    );
    let (code, shown) = tokio::task::block_in_place(|| start(&plugin_path("stamp-v2")));
    assert_eq!(code, Some(0), "{shown}");
    assert!(
        shown.contains("(canary): running, step 1 of 2 (50%)"),
        "{shown}"
    );
    s.publish(0..100).await;
    let stamped = s.outputs(100).await;
    assert!(stamped.values().any(|v| v == "v2") && stamped.values().any(|v| v == "v1"));
    let (code, shown) =
        tokio::task::block_in_place(|| s.rollout_command(&["status", "--queue", &s.input]));
    assert_eq!(code, Some(0), "{shown}");
    assert!(
        shown.contains("candidate:") && shown.contains("calls"),
        "{shown}"
    );
    let (code, shown) =
        tokio::task::block_in_place(|| s.rollout_command(&["abort", "--queue", &s.input]));
    assert_eq!(code, Some(0), "{shown}");
    assert!(shown.contains("aborted"), "{shown}");
    s.publish(100..150).await;
    let after = s.outputs(50).await;
    assert!(after.values().all(|v| v == "v1"), "{after:?}");
    let (code, shown) =
        tokio::task::block_in_place(|| s.rollout_command(&["abort", "--queue", &s.input]));
    assert_eq!(code, Some(1), "{shown}");
    assert!(shown.contains("no rollout under way"), "{shown}");
    host.terminate(Duration::from_secs(30)).unwrap();
}
