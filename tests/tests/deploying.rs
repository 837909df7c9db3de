//! What a service manager, an orchestrator and an operator's browser see
//! of a real `acemq-host run`: systemd's notifications on a socket this
//! test listens on, the liveness and readiness probes through a start, a
//! lost connection and a drain, and the status page in headless Chromium.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_tests::browser::{self, Browser};
use acemq_tests::host::{
    HostOptions, HostProcess, free_port, http_get, plugin_path, workspace_root,
};
use acemq_tests::{FaultProxy, shared_broker, unique_name};

/// What the host sent to its `NOTIFY_SOCKET`, in order, with when.
#[derive(Clone, Default)]
struct Notifications(Arc<Mutex<Vec<(Instant, String)>>>);

impl Notifications {
    /// Listens on a datagram socket at `path` until the test ends.
    fn listen(path: &Path) -> Self {
        let socket = UnixDatagram::bind(path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let heard = Self::default();
        let log = heard.0.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match socket.recv(&mut buf) {
                    Ok(n) => log.lock().unwrap().push((
                        Instant::now(),
                        String::from_utf8_lossy(&buf[..n]).into_owned(),
                    )),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                    Err(_) => return,
                }
            }
        });
        heard
    }

    fn messages(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// Index of the first message holding `line`, waiting up to `within`.
    fn wait_for(&self, line: &str, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            if let Some(at) = self
                .messages()
                .iter()
                .position(|m| m.lines().any(|l| l == line))
            {
                return at;
            }
            assert!(
                Instant::now() < deadline,
                "no {line} within {within:?}: {:?}",
                self.messages()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn count_after(&self, index: usize, line: &str) -> usize {
        self.messages()[index..]
            .iter()
            .filter(|m| m.lines().any(|l| l == line))
            .count()
    }
}

/// `acemq-host probe WHAT --address ADMIN`: its exit code and what it
/// printed.
fn probe_command(what: &str, admin: &str) -> (Option<i32>, String) {
    let output = std::process::Command::new(acemq_tests::host::host_binary())
        .args(["probe", what, "--address", admin])
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).trim().to_string(),
    )
}

/// `GET http://ADMIN{path}`: status and the status word of its JSON.
fn probe(admin: &str, path: &str) -> (u16, String) {
    let (status, body) = http_get(&format!("http://{admin}{path}")).unwrap();
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    (
        status,
        body["status"].as_str().unwrap_or_default().to_string(),
    )
}

fn config(url: &str, admin: &str, queue: &str) -> String {
    format!(
        "[broker]\nurl = \"{url}\"\nconnect_timeout = \"10s\"\nnetwork_recovery_interval = \"1s\"\n\n[host]\nadmin_listen = \"{admin}\"\ndrain_timeout = \"15s\"\n\n[[queues]]\nname = \"{queue}\"\n\n[[consumers]]\nqueue = \"{queue}\"\nplugin = \"{plugin}\"\n",
        plugin = plugin_path("sleeper").display()
    )
}

fn start(config: &str, env: Vec<(String, String)>) -> HostProcess {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.toml");
    std::fs::write(&path, config).unwrap();
    HostProcess::start_with(
        &path,
        dir,
        &HostOptions {
            env,
            ..HostOptions::default()
        },
    )
    .unwrap()
}

fn sigterm(host: &HostProcess) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(
        unsafe { libc::kill(libc::pid_t::try_from(host.pid()).unwrap(), libc::SIGTERM) },
        0
    );
}

/// `Type=notify` with `WatchdogSec=`: READY=1 once the consumer reads,
/// WATCHDOG=1 at half the watchdog's time while it runs, STOPPING=1 as
/// soon as SIGTERM starts the drain (while a delivery still runs and
/// `/health/ready` says NOT_READY), and nothing claims readiness after it.
#[tokio::test(flavor = "multi_thread")]
async fn a_service_manager_hears_ready_then_watchdog_then_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("notify.sock");
    let heard = Notifications::listen(&socket);
    let admin = format!("127.0.0.1:{}", free_port());
    let queue = unique_name("deploying.notify");
    let broker = shared_broker();
    let host = tokio::task::block_in_place(|| {
        start(
            &config(broker.amqp_url(), &admin, &queue),
            vec![
                ("NOTIFY_SOCKET".into(), socket.display().to_string()),
                // One second: WATCHDOG=1 every half second.
                ("WATCHDOG_USEC".into(), "1000000".into()),
            ],
        )
    });
    let ready = tokio::task::block_in_place(|| heard.wait_for("READY=1", Duration::from_secs(30)));
    assert!(
        heard.messages()[ready]
            .lines()
            .any(|l| l.starts_with("STATUS=ready: 1 consumers reading")),
        "{:?}",
        heard.messages()
    );
    assert_eq!(
        tokio::task::block_in_place(|| probe(&admin, "/health/ready")),
        (200, "READY".to_string())
    );
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let fed = heard.count_after(ready, "WATCHDOG=1");
    assert!((3..=6).contains(&fed), "{fed} WATCHDOG=1 in 2.2 s");

    // A delivery that takes 4 s is running when SIGTERM comes.
    broker
        .publish_many("", &queue, [(b"sleep:4000".to_vec(), Default::default())])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    sigterm(&host);
    let stopping =
        tokio::task::block_in_place(|| heard.wait_for("STOPPING=1", Duration::from_secs(2)));
    assert_eq!(
        tokio::task::block_in_place(|| probe(&admin, "/health/ready")),
        (503, "NOT_READY".to_string()),
        "draining"
    );
    assert_eq!(
        tokio::task::block_in_place(|| probe(&admin, "/health/live")),
        (200, "LIVE".to_string()),
        "a draining host is alive"
    );
    let (status, log) =
        tokio::task::block_in_place(|| host.wait_with_log(Duration::from_secs(30))).unwrap();
    assert!(status.success(), "{}", log.join("\n"));
    let messages = heard.messages();
    assert!(ready < stopping, "{messages:?}");
    assert_eq!(
        messages.iter().filter(|m| m.contains("READY=1")).count(),
        1,
        "{messages:?}"
    );
    assert_eq!(
        broker.message_count(&queue).await.unwrap(),
        0,
        "the running delivery finished"
    );
}

/// A lost connection takes the host out of rotation until it has recovered
/// and resubscribed; the runtime stays live throughout, so no orchestrator
/// restarts a host that heals by itself.
#[tokio::test(flavor = "multi_thread")]
async fn readiness_falls_while_a_connection_recovers_and_liveness_holds() {
    let broker = shared_broker();
    let proxy = FaultProxy::start(broker.amqp_addr()).unwrap();
    let url = broker.amqp_url_via(proxy.port());
    let admin = format!("127.0.0.1:{}", free_port());
    let queue = unique_name("deploying.recover");
    let host = tokio::task::block_in_place(|| start(&config(&url, &admin, &queue), vec![]));
    assert_eq!(
        tokio::task::block_in_place(|| probe(&admin, "/health/ready")),
        (200, "READY".to_string())
    );
    // What a container's HEALTHCHECK runs says the same.
    assert_eq!(probe_command("ready", &admin), (Some(0), "READY".into()));
    assert_eq!(probe_command("live", &admin), (Some(0), "LIVE".into()));
    let nobody = format!("127.0.0.1:{}", free_port());
    assert_eq!(probe_command("live", &nobody).0, Some(1));

    proxy.set_refusing(true);
    proxy.cut_all();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, word) = tokio::task::block_in_place(|| probe(&admin, "/health/ready"));
        if status == 503 {
            assert_eq!(word, "NOT_READY");
            assert_eq!(
                probe_command("ready", &admin),
                (Some(1), "NOT_READY".into())
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still ready with its connections cut"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..10 {
        assert_eq!(
            tokio::task::block_in_place(|| probe(&admin, "/health/live")),
            (200, "LIVE".to_string())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    proxy.set_refusing(false);
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::task::block_in_place(|| probe(&admin, "/health/ready")).0 != 200 {
        assert!(
            Instant::now() < deadline,
            "not ready again after the broker came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::task::block_in_place(|| host.terminate(Duration::from_secs(30))).unwrap();
}

const TOKEN: &str = "status-page-test-token-0123456789";

/// The page in a real browser, against a host on the broker whose admin
/// endpoint has a token: the page asks for it, then shows the consumer's
/// acked rate moving while messages flow (redrawn in place, never
/// reloaded), and the reason of a message the plugin rejected, as text.
/// Leaves a screenshot in `target/test-artifacts/status-page.png`.
#[tokio::test(flavor = "multi_thread")]
async fn the_status_page_shows_rates_moving_and_a_rejected_messages_reason() {
    if let Some(why) = browser::missing() {
        eprintln!(
            "SKIPPED the_status_page_shows_rates_moving_and_a_rejected_messages_reason: {why}"
        );
        return;
    }
    let broker = shared_broker();
    let admin = format!("127.0.0.1:{}", free_port());
    let queue = unique_name("deploying.page");
    let config = format!(
        "[broker]\nurl = \"{url}\"\n\n[host]\nadmin_listen = \"{admin}\"\n\n[[queues]]\nname = \"{queue}\"\ndead_letter = true\n\n[[consumers]]\nqueue = \"{queue}\"\nplugin = \"{plugin}\"\n",
        url = broker.amqp_url(),
        plugin = plugin_path("outcomes").display()
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.toml");
    std::fs::write(&path, config).unwrap();
    let host = tokio::task::block_in_place(|| {
        HostProcess::start_with(
            &path,
            dir,
            &HostOptions {
                admin_token: Some(TOKEN.into()),
                ..HostOptions::default()
            },
        )
    })
    .unwrap();
    let page = tokio::task::block_in_place(Browser::start).unwrap();
    let root = format!("http://{admin}/");
    tokio::task::block_in_place(|| -> anyhow::Result<()> {
        page.goto(&root)?;
        page.wait_for(
            "return !document.getElementById('token').hidden",
            Duration::from_secs(15),
        )?;
        page.script(
            "document.getElementById('token-input').value = arguments[0]; \
             document.getElementById('token-use').click(); window.acemqMarker = 'same page';",
            vec![TOKEN.into()],
        )?;
        page.wait_for(
            "return document.body.dataset.loaded === 'true' && document.getElementById('token').hidden",
            Duration::from_secs(15),
        )?;
        Ok(())
    })
    .unwrap();

    // Messages flow: 300 accepted over about six seconds, one rejected.
    let acked_cell = format!(
        "const row = document.querySelector('#consumers tr[data-queue=\"{queue}\"]'); \
         if (!row) return null; const cell = row.querySelector('td.rate[data-outcome=\"acked\"]'); \
         const rejected = row.querySelector('td.rate[data-outcome=\"rejected\"] .one').textContent; \
         return {{ rate: cell.querySelector('.one').textContent, totals: cell.title, rejected, marker: window.acemqMarker }};"
    );
    let mut seen = Vec::new();
    for round in 0..6 {
        let batch = (0..50).map(|_| (b"accept".to_vec(), Default::default()));
        broker.publish_many("", &queue, batch).await.unwrap();
        if round == 2 {
            broker
                .publish_many(
                    "",
                    &queue,
                    [(
                        b"reject:customer 42 has <b>no</b> account".to_vec(),
                        Default::default(),
                    )],
                )
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        seen.push(tokio::task::block_in_place(|| page.script(&acked_cell, vec![])).unwrap());
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let last = tokio::task::block_in_place(|| page.script(&acked_cell, vec![])).unwrap();
    let rate = |v: &serde_json::Value| {
        v["rate"]
            .as_str()
            .unwrap_or("–")
            .parse::<f64>()
            .unwrap_or(0.0)
    };
    assert!(rate(&last) > 0.0, "no acked rate shown: {seen:?} {last}");
    let rejected = last["rejected"].as_str().unwrap().parse::<f64>().unwrap();
    assert!(rejected > 0.0, "no rejected rate shown: {last}");
    let totals: std::collections::BTreeSet<String> = seen
        .iter()
        .chain([&last])
        .filter_map(|v| v["totals"].as_str().map(str::to_string))
        .collect();
    assert!(
        totals.len() >= 3,
        "the counts did not move on the page: {seen:?}"
    );
    assert_eq!(last["marker"], "same page", "the page was reloaded");
    assert!(
        last["totals"].as_str().unwrap().starts_with("300 "),
        "{last}"
    );

    let reason = tokio::task::block_in_place(|| {
        page.wait_for(
            &format!(
                "const block = document.querySelector('#set-aside .set-aside[data-queue=\"{queue}\"]'); \
                 return block && block.querySelector('.reason').textContent;"
            ),
            Duration::from_secs(10),
        )
    })
    .unwrap();
    assert_eq!(
        reason, "the handler rejected it: customer 42 has <b>no</b> account",
        "shown as text, not markup"
    );
    let shot = workspace_root().join("target/test-artifacts/status-page.png");
    tokio::task::block_in_place(|| page.screenshot(&shot)).unwrap();
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "a screenshot of a page"
    );
    drop(page);
    tokio::task::block_in_place(|| host.terminate(Duration::from_secs(30))).unwrap();
}

/// The repository's systemd unit, as `systemd-analyze` judges it offline:
/// no warning at all from `verify` (an unknown or misspelt key is only a
/// warning there), and a `security` exposure of at most 2 of 10. The binary
/// path is the test build's (verify checks it is executable).
#[test]
fn the_systemd_unit_verifies_cleanly_and_is_locked_down() {
    let analyze = "/usr/bin/systemd-analyze";
    if !Path::new(analyze).exists() {
        eprintln!(
            "SKIPPED the_systemd_unit_verifies_cleanly_and_is_locked_down: {analyze} is not installed (Debian's systemd package)"
        );
        return;
    }
    let unit = std::fs::read_to_string(workspace_root().join("deploy/systemd/acemq-host.service"))
        .unwrap();
    assert!(
        unit.contains("ExecStart=/usr/local/bin/acemq-host run --config /etc/acemq-host/host.toml")
    );
    for line in [
        "Type=notify",
        "WatchdogSec=",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
    ] {
        assert!(unit.lines().any(|l| l.starts_with(line)), "{line}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("acemq-host.service");
    let binary = acemq_tests::host::host_binary();
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/acemq-host", &binary.display().to_string()),
    )
    .unwrap();
    let verify = std::process::Command::new(analyze)
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&verify.stderr).into_owned();
    assert!(verify.status.success(), "{said}");
    assert_eq!(said.trim(), "", "systemd-analyze verify warned");
    let security = std::process::Command::new(analyze)
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&security.stdout).into_owned();
    let exposure: f64 = text
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for acemq-host.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no exposure in: {text}"))
        .parse()
        .unwrap();
    assert!(exposure <= 2.0, "exposure {exposure}: {text}");
}

/// `buildah` with a storage of the test's own (vfs, so no kernel overlay
/// is needed), and what it printed.
fn buildah(storage: &Path, args: &[&str]) -> String {
    let output = std::process::Command::new("buildah")
        .args(buildah_flags(storage).split(' '))
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "buildah {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn buildah_flags(storage: &Path) -> String {
    format!(
        "--root {0}/root --runroot {0}/run --storage-driver vfs",
        storage.display()
    )
}

/// The image `deploy/container/build-image` builds (from the dev binary the
/// tests use): exactly the binary, the libraries it links, its user, its
/// folders and its licences; a non-root user, the liveness HEALTHCHECK
/// through the binary itself; and the binary runs from it, loading a config
/// and a plugin placed where the docs say. (Built with buildah, isolation
/// chroot; podman cannot run containers on the build machines, see
/// deploy/container/README.md, so the binary is run with `buildah run`.)
#[test]
fn the_container_image_holds_only_the_host_and_runs_it() {
    if !Path::new("/usr/bin/buildah").exists() {
        eprintln!(
            "SKIPPED the_container_image_holds_only_the_host_and_runs_it: /usr/bin/buildah is not installed (scripts/ensure-deploy-tools.sh installs it)"
        );
        return;
    }
    let storage = tempfile::tempdir().unwrap();
    let tag = format!("localhost/{}:test", unique_name("acemq-host"));
    let built = std::process::Command::new(workspace_root().join("deploy/container/build-image"))
        .args(["--dev", "--tag", &tag])
        .env("BUILDAH_FLAGS", buildah_flags(storage.path()))
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&built.stdout).trim(), tag);

    let config: serde_json::Value = serde_json::from_str(&buildah(
        storage.path(),
        &["inspect", "--type", "image", &tag],
    ))
    .unwrap();
    let config = &config["Docker"]["config"];
    assert_eq!(config["User"], "10001:10001", "{config}");
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/acemq-host"])
    );
    let check = config["Healthcheck"]["Test"].to_string();
    assert!(check.contains("\"probe\",\"live\""), "{check}");

    let container = buildah(storage.path(), &["from", &tag]);
    let mount = PathBuf::from(buildah(storage.path(), &["mount", &container]));
    let mut files: Vec<String> = walk(&mount)
        .into_iter()
        .filter(|f| !f.starts_with("usr/share/licenses/acemq-host/"))
        .collect();
    files.sort();
    let expected = [
        "etc/acemq-host/",
        "etc/group",
        "etc/passwd",
        "lib/x86_64-linux-gnu/libc.so.6",
        "lib/x86_64-linux-gnu/libgcc_s.so.1",
        "lib/x86_64-linux-gnu/libm.so.6",
        "lib64/ld-linux-x86-64.so.2",
        "tmp/",
        "usr/local/bin/acemq-host",
        "var/cache/acemq-host/",
        "var/lib/acemq-host/plugins/",
    ];
    assert_eq!(files, expected, "the image holds something else");
    let licences = mount.join("usr/share/licenses/acemq-host");
    let third_party = std::fs::read_to_string(licences.join("THIRD-PARTY.txt")).unwrap();
    for crate_name in ["wasmtime-", "lapin-", "tokio-"] {
        assert!(
            third_party.contains(crate_name),
            "{crate_name} not in THIRD-PARTY.txt"
        );
    }
    assert!(licences.join("debian/libc6/copyright").exists());
    let cache = std::fs::metadata(mount.join("var/cache/acemq-host")).unwrap();
    use std::os::unix::fs::MetadataExt as _;
    // The host's to write, and nobody else's (its cache trust check).
    assert_eq!((cache.uid(), cache.mode() & 0o022), (10001, 0));

    // The binary runs from the image, as its user, and loads a plugin from
    // where the docs put it.
    let dir = tempfile::tempdir().unwrap();
    let host_toml = dir.path().join("host.toml");
    std::fs::write(
        &host_toml,
        "[broker]\nurl = \"amqp://guest:guest@127.0.0.1:1/%2f\"\n\n[host]\nadmin_listen = \"127.0.0.1:9090\"\n\n[[consumers]]\nqueue = \"orders\"\nplugin = \"/var/lib/acemq-host/plugins/echo.wasm\"\n",
    )
    .unwrap();
    let plugin = plugin_path("echo");
    buildah(
        storage.path(),
        &[
            "copy",
            &container,
            host_toml.to_str().unwrap(),
            "/etc/acemq-host/host.toml",
        ],
    );
    buildah(
        storage.path(),
        &[
            "copy",
            &container,
            plugin.to_str().unwrap(),
            "/var/lib/acemq-host/plugins/echo.wasm",
        ],
    );
    // `buildah run`, isolation chroot: the image's binary, its libraries.
    let run = |args: &[&str]| {
        let mut all = vec!["run", "--isolation", "chroot", container.as_str(), "--"];
        all.push("/usr/local/bin/acemq-host");
        all.extend(args);
        buildah(storage.path(), &all)
    };
    let version = run(&["--version"]);
    assert!(version.starts_with("acemq-host "), "{version}");
    let valid = run(&["validate", "--config", "/etc/acemq-host/host.toml"]);
    assert!(
        valid.contains("valid (") && valid.contains("1 consumers"),
        "{valid}"
    );
    buildah(storage.path(), &["umount", &container]);
    buildah(storage.path(), &["rm", &container]);
    buildah(storage.path(), &["rmi", &tag]);
}

/// Every file and empty folder under `root`, relative, folders ending in `/`.
fn walk(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(folder) = todo.pop() {
        let entries: Vec<_> = std::fs::read_dir(&folder)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        if entries.is_empty() && folder != root {
            found.push(format!("{}/", folder.strip_prefix(root).unwrap().display()));
        }
        for path in entries {
            if path.is_dir() && !path.is_symlink() {
                todo.push(path);
            } else {
                found.push(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    found
}

/// Every YAML document of a file under deploy/kubernetes.
fn manifests(name: &str) -> Vec<yaml_rust2::Yaml> {
    let path = workspace_root().join("deploy/kubernetes").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    yaml_rust2::YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn text(yaml: &yaml_rust2::Yaml) -> &str {
    yaml.as_str()
        .unwrap_or_else(|| panic!("not text: {yaml:?}"))
}

/// The Kubernetes manifests, at the level of their schema: every object
/// parses and names its kind; the Deployment has the probes on the port the
/// config listens on, a grace period above the drain, the token from the
/// Secret, the plugins from a read-only ConfigMap volume where the config
/// looks for them, the cache as its one writable place, the image's user,
/// and measured resource requests; KEDA scales that Deployment on a queue
/// the config consumes, with the Secret's URL; and the config itself is
/// one the host accepts.
#[test]
fn the_kubernetes_manifests_hold_together_with_the_config_and_the_image() {
    let kustomization = &manifests("kustomization.yaml")[0];
    let mut objects = Vec::new();
    for resource in kustomization["resources"].as_vec().unwrap() {
        for object in manifests(text(resource)) {
            assert!(
                object["apiVersion"].as_str().is_some(),
                "{resource:?}: {object:?}"
            );
            assert!(
                object["metadata"]["name"].as_str().is_some(),
                "{resource:?}"
            );
            objects.push(object);
        }
    }
    let kind = |k: &str| {
        objects
            .iter()
            .find(|o| o["kind"].as_str() == Some(k))
            .unwrap_or_else(|| panic!("no {k}"))
    };
    let root = workspace_root().join("deploy/kubernetes");
    let host_toml = std::fs::read_to_string(root.join("host.toml")).unwrap();
    let config: toml::Table = host_toml.parse().unwrap();
    let host = &config["host"];

    let deployment = kind("Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let port = container["ports"][0]["containerPort"].as_i64().unwrap();
    assert!(
        host["admin_listen"]
            .as_str()
            .unwrap()
            .ends_with(&format!(":{port}")),
        "the probes' port is where the config listens"
    );
    for (probe, path) in [
        ("startupProbe", "/health/live"),
        ("livenessProbe", "/health/live"),
        ("readinessProbe", "/health/ready"),
    ] {
        assert_eq!(text(&container[probe]["httpGet"]["path"]), path, "{probe}");
        assert_eq!(
            text(&container[probe]["httpGet"]["port"]),
            "admin",
            "{probe}"
        );
    }
    let drain = humantime::parse_duration(host["drain_timeout"].as_str().unwrap()).unwrap();
    let grace = pod["terminationGracePeriodSeconds"].as_i64().unwrap() as u64;
    assert!(
        grace >= drain.as_secs() + 10,
        "grace {grace} s, drain {drain:?}"
    );
    let env = container["env"].as_vec().unwrap();
    let secret_of = |name: &str| {
        env.iter()
            .find(|e| e["name"].as_str() == Some(name))
            .map(|e| text(&e["valueFrom"]["secretKeyRef"]["name"]).to_string())
            .unwrap_or_else(|| panic!("{name} not from a Secret"))
    };
    let secret = secret_of("ACEMQ_ADMIN_TOKEN");
    assert_eq!(secret_of("ACEMQ_URL"), secret);
    let generated = kustomization["secretGenerator"][0]["name"]
        .as_str()
        .unwrap();
    assert_eq!(secret, generated);

    let mounts = container["volumeMounts"].as_vec().unwrap();
    let volumes = pod["volumes"].as_vec().unwrap();
    let volume_at = |path: &str| {
        let mount = mounts
            .iter()
            .find(|m| Path::new(path).starts_with(text(&m["mountPath"])))
            .unwrap_or_else(|| panic!("nothing mounted at {path}"));
        let volume = volumes.iter().find(|v| v["name"] == mount["name"]).unwrap();
        (mount.clone(), volume.clone())
    };
    let plugin = config["consumers"][0]["plugin"].as_str().unwrap();
    let (mount, volume) = volume_at(plugin);
    assert_eq!(
        mount["readOnly"].as_bool(),
        Some(true),
        "plugins mounted read-only"
    );
    let plugins_map = text(&volume["configMap"]["name"]);
    let generators = kustomization["configMapGenerator"].as_vec().unwrap();
    let generator = generators
        .iter()
        .find(|g| text(&g["name"]) == plugins_map)
        .unwrap();
    assert_eq!(
        generator["options"]["disableNameSuffixHash"].as_bool(),
        Some(true),
        "a plugin ConfigMap updated in place, so hosts hot-swap"
    );
    let (mount, volume) = volume_at("/etc/acemq-host/host.toml");
    assert_eq!(mount["readOnly"].as_bool(), Some(true));
    assert!(volume["configMap"]["name"].as_str().is_some());
    let (_, cache) = volume_at("/var/cache/acemq-host/acemq-host/plugins");
    assert!(!cache["emptyDir"].is_badvalue(), "the cache is an emptyDir");
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(security["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    let containerfile =
        std::fs::read_to_string(workspace_root().join("deploy/container/Containerfile")).unwrap();
    let user = pod["securityContext"]["runAsUser"].as_i64().unwrap();
    assert!(
        containerfile.contains(&format!("USER {user}:{user}")),
        "the image's user"
    );
    let requests = &container["resources"]["requests"];
    assert!(requests["cpu"].as_str().is_some() && requests["memory"].as_str().is_some());
    assert!(
        container["resources"]["limits"]["memory"]
            .as_str()
            .is_some()
    );

    let scaled = kind("ScaledObject");
    assert_eq!(
        scaled["spec"]["scaleTargetRef"]["name"],
        deployment["metadata"]["name"]
    );
    let trigger = &scaled["spec"]["triggers"][0];
    assert_eq!(text(&trigger["type"]), "rabbitmq");
    let consumed: Vec<&str> = config["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["queue"].as_str().unwrap())
        .collect();
    assert!(consumed.contains(&text(&trigger["metadata"]["queueName"])));
    let auth = kind("TriggerAuthentication");
    assert_eq!(
        trigger["authenticationRef"]["name"],
        auth["metadata"]["name"]
    );
    assert_eq!(text(&auth["spec"]["secretTargetRef"][0]["name"]), secret);
    assert_eq!(
        kind("PodDisruptionBudget")["spec"]["selector"],
        deployment["spec"]["selector"]
    );

    // The config itself: what the host accepts, with the plugin where the
    // test build keeps it.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("host.toml");
    std::fs::write(
        &copy,
        host_toml.replace(plugin, &plugin_path("order-router").display().to_string()),
    )
    .unwrap();
    let output = std::process::Command::new(acemq_tests::host::host_binary())
        .args(["validate", "--config"])
        .arg(&copy)
        .env("ACEMQ_ADMIN_TOKEN", "kubernetes-test-token-0123456789")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
