//! The admin endpoint's defences, end to end: a real `acemq-host run` with
//! its endpoint on a free loopback port, spoken to over raw HTTP/1.1 so each
//! test sends exactly the headers it means (Host, Origin, Authorization,
//! Content-Length), and start-up refusals seen as the host's exit status and
//! stderr.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use acemq_host::admin::MAX_CONNECTIONS;
use acemq_tests::host::{HostOptions, HostProcess, free_port, plugin_path};
use acemq_tests::{shared_broker, unique_name};

const TOKEN: &str = "admin-test-token-0123456789";

/// A host config in a temporary folder, with `[host]` lines of the test's own.
struct Setup {
    dir: tempfile::TempDir,
    admin: String,
}

impl Setup {
    /// `admin_listen` on a free loopback port, plus `host_lines`.
    fn new(host_lines: &str) -> Self {
        Self::listening_on(&format!("127.0.0.1:{}", free_port()), host_lines)
    }

    fn listening_on(admin: &str, host_lines: &str) -> Self {
        let setup = Self {
            dir: tempfile::tempdir().unwrap(),
            admin: admin.to_string(),
        };
        let queue = unique_name("admin.in");
        let config = format!(
            r#"
[broker]
url = "{url}"
connect_timeout = "10s"

[host]
admin_listen = "{admin}"
{host_lines}

[[queues]]
name = "{queue}"

[[consumers]]
queue = "{queue}"
plugin = "{plugin}"
"#,
            url = shared_broker().amqp_url(),
            plugin = plugin_path("echo").display(),
        );
        std::fs::write(setup.config(), config).unwrap();
        setup
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("host.toml")
    }

    /// Writes a file beside the config (for `admin_token_file`).
    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.dir.path().join(name), text).unwrap();
    }

    fn start(self, admin_token: Option<&str>) -> (HostProcess, String) {
        let options = options(admin_token);
        let host =
            HostProcess::start_with(&self.config(), self.dir, &options).expect("host starts");
        (host, self.admin)
    }

    /// The host's exit status and log, when it refuses to start.
    fn refused(self, admin_token: Option<&str>) -> (ExitStatus, String) {
        let config = self.config();
        HostProcess::run_refused(
            &config,
            self.dir,
            &options(admin_token),
            Duration::from_secs(30),
        )
        .unwrap()
    }
}

fn options(admin_token: Option<&str>) -> HostOptions {
    HostOptions {
        admin_token: admin_token.map(str::to_string),
        ..HostOptions::default()
    }
}

/// An answer: status, headers (lowercase names) and body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn error(&self) -> String {
        let body: serde_json::Value =
            serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body));
        body["error"].as_str().unwrap_or_default().to_string()
    }
}

/// One request on its own connection. `Host: ADMIN` is sent unless
/// `headers` has a Host of its own.
fn call(admin: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {admin}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut stream = TcpStream::connect(admin).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    parse(&raw).unwrap_or_else(|| panic!("not an HTTP answer: {:?}", String::from_utf8_lossy(&raw)))
}

fn parse(raw: &[u8]) -> Option<Answer> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some(Answer {
        status,
        headers,
        body: body.to_string(),
    })
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[test]
fn with_a_token_every_request_needs_it_and_the_token_is_never_logged() {
    let (host, admin) = Setup::new("").start(Some(TOKEN));
    let auth = bearer(TOKEN);

    for path in ["/health", "/metrics", "/plugins"] {
        let answer = call(&admin, "GET", path, &[]);
        assert_eq!(answer.status, 401, "GET {path}: {answer:?}");
        assert_eq!(
            answer.header("www-authenticate"),
            Some("Bearer"),
            "{answer:?}"
        );
        assert!(
            answer.error().contains("Authorization: Bearer"),
            "{answer:?}"
        );
    }
    let wrong = call(
        &admin,
        "GET",
        "/health",
        &[("Authorization", "Bearer admin-test-token-012345678X")],
    );
    assert_eq!(wrong.status, 401, "{wrong:?}");
    assert!(wrong.error().contains("wrong"), "{wrong:?}");
    let reload = call(
        &admin,
        "POST",
        "/plugins/reload",
        &[("Content-Length", "0")],
    );
    assert_eq!(reload.status, 401, "{reload:?}");

    let health = call(&admin, "GET", "/health", &[("Authorization", &auth)]);
    assert_eq!(health.status, 200, "{health:?}");
    assert!(health.body.contains("\"UP\""), "{health:?}");
    let reload = call(
        &admin,
        "POST",
        "/plugins/reload",
        &[("Authorization", &auth), ("Content-Length", "0")],
    );
    assert_eq!(reload.status, 200, "{reload:?}");
    assert!(reload.body.contains("\"unchanged\""), "{reload:?}");

    let (status, log) = host.terminate_with_log(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
    assert!(
        log.iter().any(|l| l.contains("admin endpoint: token read")),
        "{log:?}"
    );
    assert!(
        !log.iter().any(|l| l.contains(TOKEN)),
        "the token was logged: {log:?}"
    );
}

#[test]
fn a_token_file_beside_the_config_is_read() {
    let setup = Setup::new("admin_token_file = \"admin.token\"");
    setup.write("admin.token", &format!("{TOKEN}\n"));
    let (host, admin) = setup.start(None);
    assert_eq!(call(&admin, "GET", "/plugins", &[]).status, 401);
    let plugins = call(
        &admin,
        "GET",
        "/plugins",
        &[("Authorization", &bearer(TOKEN))],
    );
    assert_eq!(plugins.status, 200, "{plugins:?}");
    drop(host);
}

#[test]
fn without_a_token_reads_are_open_and_reloads_are_refused() {
    let (host, admin) = Setup::new("").start(None);
    for path in ["/health", "/metrics", "/plugins"] {
        let answer = call(&admin, "GET", path, &[]);
        assert_eq!(answer.status, 200, "GET {path}: {answer:?}");
    }
    let reload = call(
        &admin,
        "POST",
        "/plugins/reload",
        &[("Content-Length", "0")],
    );
    assert_eq!(reload.status, 403, "{reload:?}");
    let error = reload.error();
    assert!(
        error.contains("a token must be configured to reload over HTTP")
            && error.contains("admin_token_file")
            && error.contains("ACEMQ_ADMIN_TOKEN")
            && error.contains("SIGHUP"),
        "{error}"
    );
    assert!(
        host.log_text()
            .contains("admin endpoint listening without a token"),
        "{}",
        host.log_text()
    );
}

#[test]
fn a_foreign_host_header_is_refused_and_named() {
    // DNS rebinding: a page at evil.example:PORT whose name now resolves to
    // 127.0.0.1 reaches the endpoint with its own name in Host.
    let (_host, admin) = Setup::new("").start(None);
    let port = admin.rsplit_once(':').unwrap().1;
    let evil = format!("evil.example:{port}");
    let answer = call(&admin, "GET", "/plugins", &[("Host", &evil)]);
    assert_eq!(answer.status, 421, "{answer:?}");
    assert!(
        answer.error().contains(&format!("\"{evil}\"")),
        "{answer:?}"
    );
    // The names the endpoint is reached by pass.
    for host in [admin.clone(), format!("localhost:{port}")] {
        let answer = call(&admin, "GET", "/plugins", &[("Host", &host)]);
        assert_eq!(answer.status, 200, "{host}: {answer:?}");
    }
}

#[test]
fn configured_hosts_pass_and_others_do_not() {
    let (_host, admin) =
        Setup::new("admin_allowed_hosts = [\"acemq-1.internal:9090\"]").start(Some(TOKEN));
    let auth = bearer(TOKEN);
    let answer = call(
        &admin,
        "GET",
        "/health",
        &[("Host", "ACEMQ-1.internal:9090"), ("Authorization", &auth)],
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    // Checked before the token: the right token does not make a wrong host right.
    let answer = call(
        &admin,
        "GET",
        "/health",
        &[("Host", "acemq-2.internal:9090"), ("Authorization", &auth)],
    );
    assert_eq!(answer.status, 421, "{answer:?}");
}

#[test]
fn a_cross_origin_post_and_an_oversize_body_are_refused() {
    let (_host, admin) = Setup::new("").start(Some(TOKEN));
    let auth = bearer(TOKEN);
    // A web page's form posted from the operator's browser.
    let answer = call(
        &admin,
        "POST",
        "/plugins/reload",
        &[
            ("Origin", "http://evil.example"),
            ("Authorization", &auth),
            ("Content-Length", "0"),
        ],
    );
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(
        answer.error().contains("\"http://evil.example\""),
        "{answer:?}"
    );
    let origin = format!("http://{admin}");
    let answer = call(
        &admin,
        "POST",
        "/plugins/reload",
        &[
            ("Origin", &origin),
            ("Authorization", &auth),
            ("Content-Length", "0"),
        ],
    );
    assert_eq!(answer.status, 200, "same origin: {answer:?}");

    // The body is declared but never sent: it is refused unread.
    let answer = call(
        &admin,
        "POST",
        "/plugins/reload",
        &[("Authorization", &auth), ("Content-Length", "2048")],
    );
    assert_eq!(answer.status, 413, "{answer:?}");
    assert!(answer.error().contains("2048 bytes"), "{answer:?}");
}

/// `GET /health` on a connection of its own: the status line, and how
/// long the answer took.
fn health_within(admin: &str, limit: Duration) -> (String, Duration) {
    let started = Instant::now();
    let mut stream = TcpStream::connect(admin).unwrap();
    stream.set_read_timeout(Some(limit)).unwrap();
    let _ = write!(
        stream,
        "GET /health HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n"
    );
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    let status = text.lines().next().unwrap_or_default().to_string();
    (status, started.elapsed())
}

/// Opens a connection that is seen to be served once, then kept alive idle.
fn served_and_kept(admin: &str) -> TcpStream {
    let mut stream = TcpStream::connect(admin).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(stream, "GET /health HTTP/1.1\r\nHost: {admin}\r\n\r\n").unwrap();
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    stream
}

#[test]
fn health_is_answered_while_idle_and_slow_connections_hold_every_place() {
    let (host, admin) = Setup::new("").start(None);
    // Past the cap: connections that say nothing, kept-alive ones served
    // once and now idle, and ones that send a request head a byte at a time
    // (a slowloris).
    let mut silent = Vec::new();
    let mut kept = Vec::new();
    let mut slow = Vec::new();
    for i in 0..MAX_CONNECTIONS + 36 {
        match i % 3 {
            0 => silent.push(TcpStream::connect(&admin).unwrap()),
            1 => kept.push(served_and_kept(&admin)),
            _ => {
                let mut stream = TcpStream::connect(&admin).unwrap();
                stream.write_all(b"GET /health HTTP/1.1\r\nHo").unwrap();
                slow.push(stream);
            }
        }
    }
    // The slow ones go on dripping while the probes come.
    let dripping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let drip = {
        let dripping = dripping.clone();
        std::thread::spawn(move || {
            while dripping.load(std::sync::atomic::Ordering::Relaxed) {
                for stream in &mut slow {
                    let _ = stream.write_all(b"x");
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            slow
        })
    };
    for probe in 0..10 {
        let (status, took) = health_within(&admin, Duration::from_secs(10));
        assert!(
            status.starts_with("HTTP/1.1 200"),
            "probe {probe}: {status:?} after {took:?}"
        );
        assert!(took < Duration::from_secs(2), "probe {probe} took {took:?}");
        // Connections the probes pushed out are replaced, as an attacker would.
        silent.push(TcpStream::connect(&admin).unwrap());
    }
    dripping.store(false, std::sync::atomic::Ordering::Relaxed);
    let slow = drip.join().unwrap();
    drop((silent, kept, slow));
    let status = host.terminate(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn a_client_that_does_not_read_its_answers_is_closed_after_the_write_timeout() {
    let (host, admin) = Setup::new("").start(None);
    // Thousands of pipelined requests whose answers are never read: the
    // socket's buffers fill and the endpoint's writes stop.
    const REQUESTS: usize = 4000;
    let mut stream = TcpStream::connect(&admin).unwrap();
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {admin}\r\n\r\n");
    stream
        .write_all(request.repeat(REQUESTS).as_bytes())
        .unwrap();
    std::thread::sleep(Duration::from_secs(15));
    // Now read all there is: the endpoint gave up on the connection, so
    // its answers end well before the last request's.
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut raw = Vec::new();
    let ended = stream.read_to_end(&mut raw);
    let answers = String::from_utf8_lossy(&raw)
        .matches("HTTP/1.1 200")
        .count();
    assert!(
        ended.is_ok() || answers < REQUESTS,
        "{ended:?} after {answers} answers"
    );
    assert!(
        answers < REQUESTS,
        "every one of {answers} answers was written"
    );
    // And the endpoint is still there for others.
    let (status, _) = health_within(&admin, Duration::from_secs(10));
    assert!(status.starts_with("HTTP/1.1 200"), "{status:?}");
    let status = host.terminate(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn when_every_place_is_taken_the_longest_idle_connection_makes_room_and_idle_ones_time_out() {
    let (mut host, admin) = Setup::new("").start(None);
    // Fill the cap with kept-alive connections, each seen to be served.
    let mut held: Vec<TcpStream> = (0..MAX_CONNECTIONS)
        .map(|_| served_and_kept(&admin))
        .collect();
    // One more is served: the connection idle the longest (the first) is
    // closed to make room for it.
    let (status, _) = health_within(&admin, Duration::from_secs(10));
    assert!(status.starts_with("HTTP/1.1 200"), "{status:?}");
    let mut oldest = held.remove(0);
    oldest
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut rest = Vec::new();
    let closed = oldest.read_to_end(&mut rest);
    assert!(closed.is_ok() && rest.is_empty(), "{closed:?} {rest:?}");
    host.wait_for_log(
        "closing the one idle the longest",
        1,
        Duration::from_secs(5),
    )
    .unwrap();
    // Idle kept-alive connections are closed by the server (10 s without a
    // request head), which frees the cap without the clients' help.
    let mut idle = held.pop().unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    let closed = idle.read_to_end(&mut rest);
    assert!(
        closed.is_ok() && rest.is_empty() && started.elapsed() < Duration::from_secs(15),
        "{closed:?} after {:?}",
        started.elapsed()
    );
}

#[test]
fn a_remote_address_without_admin_allow_remote_is_refused_at_start() {
    let address = format!("0.0.0.0:{}", free_port());
    let (status, log) = Setup::listening_on(&address, "").refused(Some(TOKEN));
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains(&format!("host.toml:7: host.admin_listen: \"{address}\""))
            && log.contains("admin_allow_remote = true"),
        "{log}"
    );
    assert!(!log.contains("consuming"), "{log}");
}

#[test]
fn a_remote_address_needs_a_token_even_when_allowed() {
    let address = format!("0.0.0.0:{}", free_port());
    let (status, log) = Setup::listening_on(&address, "admin_allow_remote = true").refused(None);
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("host.admin_allow_remote") && log.contains("needs a token"),
        "{log}"
    );
}

#[test]
fn a_short_or_empty_token_is_refused_at_start_without_showing_it() {
    let (status, log) = Setup::new("").refused(Some("tooshort123"));
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("ACEMQ_ADMIN_TOKEN: the token is 11 characters long; use at least 16"),
        "{log}"
    );
    assert!(!log.contains("tooshort123"), "{log}");

    let setup = Setup::new("admin_token_file = \"admin.token\"");
    setup.write("admin.token", "\n");
    let (status, log) = setup.refused(None);
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("host.admin_token_file:") && log.contains("admin.token: the token is empty"),
        "{log}"
    );
}

#[test]
fn a_token_written_in_the_config_is_refused_with_where_it_goes() {
    let (status, log) = Setup::new(&format!("admin_token = \"{TOKEN}\"")).refused(None);
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("host.toml:8: host.admin_token:")
            && log.contains("admin_token_file")
            && log.contains("ACEMQ_ADMIN_TOKEN"),
        "{log}"
    );
    assert!(!log.contains(TOKEN), "{log}");
}

/// An orchestrator's probes reach `/health/live` and `/health/ready` with
/// neither the token nor a Host the config knows (a kubelet names the pod's
/// address), and learn a status word and nothing else; every other route
/// still needs both.
#[test]
fn probes_answer_any_host_without_the_token_with_a_status_word_only() {
    let (host, admin) = Setup::new("").start(Some(TOKEN));
    let kubelet = [("Host", "10.244.1.7:9090")];
    let live = call(&admin, "GET", "/health/live", &kubelet);
    assert_eq!(live.status, 200, "{live:?}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&live.body).unwrap(),
        serde_json::json!({"status": "LIVE"})
    );
    let ready = call(&admin, "GET", "/health/ready", &kubelet);
    assert_eq!(ready.status, 200, "{ready:?}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&ready.body).unwrap(),
        serde_json::json!({"status": "READY"})
    );
    let head = call(&admin, "HEAD", "/health/ready", &kubelet);
    assert_eq!(head.status, 200, "{head:?}");
    assert_eq!(head.body, "", "HEAD has no body");
    let health = call(&admin, "GET", "/health", &kubelet);
    assert_eq!(health.status, 421, "{health:?}");
    let health = call(&admin, "GET", "/health", &[]);
    assert_eq!(health.status, 401, "{health:?}");
    let posted = call(
        &admin,
        "POST",
        "/health/ready",
        &[("Content-Length", "0"), ("Authorization", &bearer(TOKEN))],
    );
    assert_eq!(posted.status, 405, "{posted:?}");
    // With the token, /health says the same in its own words.
    let health = call(
        &admin,
        "GET",
        "/health",
        &[("Authorization", &bearer(TOKEN))],
    );
    let body: serde_json::Value = serde_json::from_str(&health.body).unwrap();
    assert_eq!(body["readiness"]["status"], "READY", "{body}");
    assert_eq!(body["liveness"]["status"], "LIVE", "{body}");
    host.terminate(Duration::from_secs(30)).unwrap();
}

/// `admin_allowed_hosts = ["*"]` (a pod scraped at its IP) answers any Host,
/// only to the token; without a token the host refuses to start, naming
/// the key.
#[test]
fn any_host_needs_a_token_and_then_answers_every_host_that_sends_it() {
    let (status, log) = Setup::new("admin_allowed_hosts = [\"*\"]").refused(None);
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(
        log.contains("host.admin_allowed_hosts: \"*\" (any Host) needs a token"),
        "{log}"
    );
    let (host, admin) = Setup::new("admin_allowed_hosts = [\"*\"]").start(Some(TOKEN));
    let pod = [
        ("Host", "10.244.3.17:9090"),
        ("Authorization", &bearer(TOKEN) as &str),
    ];
    let metrics = call(&admin, "GET", "/metrics", &pod);
    assert_eq!(metrics.status, 200, "{metrics:?}");
    let anonymous = call(&admin, "GET", "/metrics", &[("Host", "10.244.3.17:9090")]);
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    host.terminate(Duration::from_secs(30)).unwrap();
}
