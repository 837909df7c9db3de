//! What a service manager, an orchestrator and an operator's browser see
//! of a real `acemq-host run`: systemd's notifications on a socket this
//! test listens on, the liveness and readiness probes through a start, a
//! lost connection and a drain, and the status page in headless Chromium.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
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

    proxy.set_refusing(true);
    proxy.cut_all();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, word) = tokio::task::block_in_place(|| probe(&admin, "/health/ready"));
        if status == 503 {
            assert_eq!(word, "NOT_READY");
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
