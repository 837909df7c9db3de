//! The admin HTTP endpoint, on `[host] admin_listen` (plain HTTP/1.1).
//!
//! - `GET /health`: `{"status": "UP"|"DEGRADED"|"DOWN", "details": [...],
//!   "consuming": "n/m", "consumers": [{queue, sha256, reading, reason}],
//!   "connections": {consume, publish}}`; what each status means is in
//!   [`health`].
//! - `GET /metrics`: every metric, in the Prometheus (OpenMetrics) text format.
//! - `GET /plugins`: each consumer's plugin: queue, path, sha256, size,
//!   loaded_at, from_cache, its instances (idle, memory_bytes each,
//!   instantiation_ms), and the last refused reload with its reason.
//! - `POST /plugins/reload[?queue=NAME]`: reloads every consumer's plugin (or
//!   one), answering each consumer's result: 200 when each was swapped or
//!   unchanged, 422 when one was refused (its reason is in the body), 404 for
//!   a queue no consumer reads.
//!
//! What it enforces (the rules are pure, in [`policy`]; this file does the
//! I/O): it listens on loopback unless `admin_allow_remote`; each request
//! must name this endpoint in its `Host` (421 otherwise: DNS rebinding);
//! a POST from another origin is refused (403: a web page's form); with an
//! admin token configured every request needs `Authorization: Bearer TOKEN`
//! (401), without one reads are open and POSTs refused (403), so that
//! orchestrators' health checks need no secret. Request bodies are refused
//! over [`policy::MAX_BODY_BYTES`] (413); at most [`MAX_CONNECTIONS`]
//! connections are open at once, a new one taking the place of the one idle
//! the longest ([`places`]); a connection that sends no request head for
//! [`HEADER_READ_TIMEOUT`] (a new one, or an idle kept-alive one) is closed,
//! and so is one whose client reads nothing of an answer for
//! [`WRITE_TIMEOUT`] ([`write_deadline`]).

pub mod health;
pub mod places;
pub mod policy;
pub mod status;
pub mod write_deadline;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{
    ALLOW, CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, HeaderValue, REFERRER_POLICY,
    WWW_AUTHENTICATE, X_CONTENT_TYPE_OPTIONS,
};
use hyper::http::request::Parts;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::broker::{Board, Link, Phase};
use crate::config::{ConfigError, LoadedConfig};
use crate::plugin::swap::{Cause, Reloader, Trigger};
use crate::service::liveness::Liveness;
use crate::telemetry::Metrics;
use health::Readiness;
use policy::{Policy, Refusal, TOKEN_ENV, Token};

/// A client must send a request head within this time, on a new connection
/// and between requests on a kept-alive one (hyper restarts the timer once a
/// response is written), so it also bounds how long an idle connection stays.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open requests may take to finish once the endpoint stops.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Connections served at once. Orchestrators and scrapers hold a few; this
/// many means something is wrong. A new connection past it takes the place
/// of the one idle the longest ([`places`]), so idle or slow clients cannot
/// keep a health probe out.
pub const MAX_CONNECTIONS: usize = 64;
/// How long one write of an answer may wait for the client to read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// At most one warning per this time about connections closed over the cap.
const CAP_WARN_EVERY: Duration = Duration::from_secs(10);

/// The endpoint's settings from `[host]`, checked, with the token read.
#[derive(Debug)]
pub struct Settings {
    pub listen: String,
    pub allow_remote: bool,
    /// Host headers accepted besides the bound address's.
    pub allowed_hosts: Vec<String>,
    pub token: Option<Token>,
}

impl Settings {
    /// The endpoint's settings, or `None` when `admin_listen` is absent.
    /// Reads the token (`ACEMQ_ADMIN_TOKEN`, else `admin_token_file`), so an
    /// unusable one fails the start before anything connects.
    pub fn from_config(config: &LoadedConfig) -> Result<Option<Self>, ConfigError> {
        let host = &config.config.host;
        let Some(listen) = &host.admin_listen else {
            return Ok(None);
        };
        let token = read_token(config)?;
        let any_host = host
            .admin_allowed_hosts
            .iter()
            .find(|entry| entry.get_ref() == crate::config::ANY_HOST);
        if let (Some(entry), None) = (any_host, &token) {
            return Err(config.error_at(
                Some(entry.span().start),
                format!(
                    "host.admin_allowed_hosts: \"{}\" (any Host) needs a token, which every \
                     request must then send; set admin_token_file in [host] or the {TOKEN_ENV} \
                     environment variable",
                    crate::config::ANY_HOST
                ),
            ));
        }
        if host.admin_allow_remote && token.is_none() {
            return Err(config.error_at(
                Some(listen.span().start),
                format!(
                    "host.admin_allow_remote: an admin endpoint reachable from other machines \
                     needs a token; set admin_token_file in [host] or the {TOKEN_ENV} \
                     environment variable"
                ),
            ));
        }
        Ok(Some(Self {
            listen: listen.get_ref().clone(),
            allow_remote: host.admin_allow_remote,
            allowed_hosts: host
                .admin_allowed_hosts
                .iter()
                .map(|entry| entry.get_ref().clone())
                .collect(),
            token,
        }))
    }
}

/// The token from `ACEMQ_ADMIN_TOKEN` (set but empty is refused, not
/// ignored: it is usually a deploy's missing secret) or `admin_token_file`.
fn read_token(config: &LoadedConfig) -> Result<Option<Token>, ConfigError> {
    match std::env::var(TOKEN_ENV) {
        Ok(text) => {
            let token = Token::new(&text)
                .map_err(|reason| config.error_at(None, format!("{TOKEN_ENV}: {reason}")))?;
            tracing::info!(source = TOKEN_ENV, "admin endpoint: token read");
            return Ok(Some(token));
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(config.error_at(None, format!("{TOKEN_ENV}: the token is not valid UTF-8")));
        }
        Err(std::env::VarError::NotPresent) => {}
    }
    let Some(file) = &config.config.host.admin_token_file else {
        return Ok(None);
    };
    let path = config.resolve(file.get_ref());
    let at = Some(file.span().start);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        config.error_at(
            at,
            format!("host.admin_token_file: cannot read {}: {e}", path.display()),
        )
    })?;
    let token = Token::new(&text).map_err(|reason| {
        config.error_at(
            at,
            format!("host.admin_token_file: {}: {reason}", path.display()),
        )
    })?;
    warn_if_readable_by_all(&path);
    tracing::info!(source = %path.display(), "admin endpoint: token read");
    Ok(Some(token))
}

fn warn_if_readable_by_all(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt as _;
    if let Ok(metadata) = std::fs::metadata(path)
        && metadata.permissions().mode() & 0o004 != 0
    {
        tracing::warn!(file = %path.display(), "the admin token file is readable by every user; chmod 600 it");
    }
}

/// What the endpoint serves from.
pub struct Admin {
    pub reloader: Arc<Reloader>,
    pub metrics: Arc<Metrics>,
    /// Cancelled when the host begins shutting down: `/health` turns DOWN.
    pub shutdown: CancellationToken,
    /// What each consumer's subscription is doing.
    pub board: Arc<Board>,
    /// The host's broker connections.
    pub links: Vec<Arc<Link>>,
    /// The state store's health, when the host has one.
    pub store: Option<Arc<crate::state::StoreHealth>>,
    /// The runtime's heartbeat: `/health/live`.
    pub heartbeat: Arc<crate::service::liveness::Heartbeat>,
    /// When the host started (the status page's uptime).
    pub started: std::time::SystemTime,
    /// Every consumer's rollout: `/rollouts`, `/plugins`.
    pub rollouts: Arc<crate::rollout::live::Rollouts>,
}

/// A bound endpoint and the policy for its address.
pub struct Bound {
    listener: TcpListener,
    address: SocketAddr,
    policy: Policy,
}

/// Binds the endpoint's address. Done before the host connects anywhere, so
/// an address in use fails the start rather than the first health check.
pub async fn bind(settings: Settings) -> anyhow::Result<Bound> {
    let address = &settings.listen;
    let listener = TcpListener::bind(address)
        .await
        .with_context(|| format!("host.admin_listen: cannot listen on {address}"))?;
    let bound = listener.local_addr()?;
    // The config check trusts `localhost` to be loopback; a resolver that
    // says otherwise must not open the endpoint to the network.
    if !settings.allow_remote && !bound.ip().is_loopback() {
        anyhow::bail!(
            "host.admin_listen: \"{address}\" resolved to {bound}, which is reachable from \
             other machines; bind to 127.0.0.1 or [::1], or set admin_allow_remote = true in [host]"
        );
    }
    Ok(Bound {
        listener,
        address: bound,
        policy: Policy::new(bound, &settings.allowed_hosts, settings.token),
    })
}

/// Serves on `bound` until `stop` is cancelled, then lets open requests
/// finish (for at most [`CLOSE_GRACE`]).
pub fn spawn(
    bound: Bound,
    admin: Arc<Admin>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let Bound {
        listener,
        address,
        policy,
    } = bound;
    if policy.has_token() {
        tracing::info!(address = %address, "admin endpoint listening (bearer token required)");
    } else {
        tracing::warn!(
            address = %address,
            "admin endpoint listening without a token: anyone who can connect may read it, and POST /plugins/reload is refused"
        );
    }
    let policy = Arc::new(policy);
    tokio::spawn(async move {
        let mut connections = JoinSet::new();
        let mut gate = Gate::new();
        loop {
            let accepted = tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, usually: wait rather than spin.
                    tracing::warn!(error = %e, "admin endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            while connections.try_join_next().is_some() {}
            let Some(place) = gate.admit(peer) else {
                drop(stream);
                continue;
            };
            connections.spawn(serve_connection(
                stream,
                place,
                admin.clone(),
                policy.clone(),
                stop.clone(),
            ));
        }
        drop(listener);
        let closed = tokio::time::timeout(CLOSE_GRACE, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if closed.is_err() {
            connections.abort_all();
        }
    })
}

/// The endpoint's connection places, and the warnings when they run out.
struct Gate {
    places: Arc<places::Places>,
    made_room: Throttle,
    refused: Throttle,
}

impl Gate {
    fn new() -> Self {
        Self {
            places: places::Places::new(MAX_CONNECTIONS),
            made_room: Throttle::new(CAP_WARN_EVERY),
            refused: Throttle::new(CAP_WARN_EVERY),
        }
    }

    /// A place for a connection from `peer`, or `None`: it is to be closed
    /// at once.
    fn admit(&mut self, peer: SocketAddr) -> Option<places::Place> {
        match self.places.admit(Instant::now()) {
            places::Admission::Admitted {
                place,
                made_room: false,
            } => Some(place),
            places::Admission::Admitted {
                place,
                made_room: true,
            } => {
                if let Some(closed) = self.made_room.note(Instant::now()) {
                    tracing::warn!(
                        peer = %peer,
                        closed,
                        limit = MAX_CONNECTIONS,
                        "admin endpoint: every connection place is taken; closing the one idle the longest for each new one"
                    );
                }
                Some(place)
            }
            places::Admission::Refused => {
                if let Some(closed) = self.refused.note(Instant::now()) {
                    tracing::warn!(
                        peer = %peer,
                        closed,
                        limit = MAX_CONNECTIONS,
                        "admin endpoint: too many connections, every one answering a request; closing new ones at once"
                    );
                }
                None
            }
        }
    }
}

/// Answers the requests of one connection, in `place`, until it closes,
/// another connection takes its place, or `stop` (then the request in
/// progress finishes first).
async fn serve_connection(
    stream: tokio::net::TcpStream,
    place: places::Place,
    admin: Arc<Admin>,
    policy: Arc<Policy>,
    stop: CancellationToken,
) {
    let activity = place.activity();
    let service = hyper::service::service_fn(move |request| {
        let admin = admin.clone();
        let policy = policy.clone();
        // Busy while answering: not the one to close for a newcomer.
        let busy = activity.busy();
        async move {
            let response = admin.serve(&policy, request).await;
            drop(busy);
            Ok::<_, Infallible>(response)
        }
    });
    let stream = write_deadline::WriteDeadline::new(stream, WRITE_TIMEOUT);
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        // Another connection took its place: close it now.
        _ = place.close.cancelled() => Ok(()),
        _ = stop.cancelled() => {
            // Finish the request in progress, then close.
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = served {
        tracing::debug!(error = %e, "admin endpoint connection");
    }
    drop(place);
}

/// Counts events and says when to log them: the first at once, later ones
/// at most once per period, with how many there were since the last log.
struct Throttle {
    every: Duration,
    last: Option<Instant>,
    unlogged: u64,
}

impl Throttle {
    fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            unlogged: 0,
        }
    }

    /// Notes one event at `now`; `Some(count)` when it is time to log `count`.
    fn note(&mut self, now: Instant) -> Option<u64> {
        self.unlogged += 1;
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < self.every)
        {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

impl Admin {
    /// Answers one request: refused by the policy, or routed. The body is
    /// never read (no route takes one; the policy bounds its size).
    async fn serve(&self, policy: &Policy, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let (head, _body) = request.into_parts();
        match policy::authorize(&head, policy) {
            Ok(()) => self.route(&head).await,
            Err(refusal) => {
                tracing::debug!(method = %head.method, path = head.uri.path(), %refusal, "admin endpoint: request refused");
                refused(&refusal)
            }
        }
    }

    async fn route(&self, head: &Parts) -> Response<Full<Bytes>> {
        let path = head.uri.path();
        let method = &head.method;
        match (path, method) {
            ("/health", &Method::GET) => self.health(),
            ("/", &Method::GET) => page(status::PAGE, "text/html; charset=utf-8"),
            ("/status.js", &Method::GET) => page(status::SCRIPT, "text/javascript; charset=utf-8"),
            ("/status.css", &Method::GET) => page(status::STYLE, "text/css; charset=utf-8"),
            ("/status", &Method::GET) => self.status(),
            ("/health/live", &Method::GET | &Method::HEAD) => self.live(),
            ("/health/ready", &Method::GET | &Method::HEAD) => self.ready(),
            ("/metrics", &Method::GET) => {
                // Ages are measured now, not when something last changed.
                let scheduler = &self.metrics.scheduler;
                scheduler.oldest_overdue_seconds.set(
                    scheduler
                        .overdue
                        .oldest(std::time::SystemTime::now())
                        .map_or(0.0, |d| d.as_secs_f64()),
                );
                for plugin in self.reloader.status().into_iter().filter(|p| !p.codec) {
                    self.metrics
                        .plugin_faulting
                        .get_or_create(&crate::telemetry::QueueLabel {
                            queue: plugin.queue,
                        })
                        .set(i64::from(plugin.faulting.is_some()));
                }
                for (queue, age) in self.board.oldest_unsettled() {
                    self.metrics
                        .oldest_unacked_seconds
                        .get_or_create(&crate::telemetry::QueueLabel { queue })
                        .set(age.map_or(0.0, |a| a.as_secs_f64()));
                }
                for progress in self.board.stream_progress() {
                    let label = crate::telemetry::QueueLabel {
                        queue: progress.queue,
                    };
                    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                    if let Some(position) = progress.position {
                        self.metrics
                            .stream_position
                            .get_or_create(&label)
                            .set(count(position));
                    }
                    if let Some(lag) = progress.lag {
                        self.metrics
                            .stream_lag
                            .get_or_create(&label)
                            .set(count(lag));
                    }
                    let failures = self
                        .metrics
                        .stream_checkpoint_failures
                        .get_or_create(&label);
                    let counted = failures.get();
                    if progress.checkpoint_failures > counted {
                        failures.inc_by(progress.checkpoint_failures - counted);
                    }
                    if let Some(age) = progress.checkpoint_age {
                        self.metrics
                            .stream_checkpoint_age_seconds
                            .get_or_create(&label)
                            .set(age.as_secs_f64());
                    }
                }
                text(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    self.metrics.render(),
                )
            }
            ("/plugins", &Method::GET) => json(
                StatusCode::OK,
                &serde_json::Value::Array(
                    self.reloader
                        .status()
                        .iter()
                        .map(|status| {
                            let mut entry = status.to_json();
                            if let Some(view) = self.rollouts.view(&status.queue) {
                                entry["rollout"] = view.to_json();
                            }
                            entry
                        })
                        .collect(),
                ),
            ),
            ("/rollouts", &Method::GET) => json(
                StatusCode::OK,
                &serde_json::Value::Array(
                    self.rollouts
                        .views()
                        .iter()
                        .map(|view| view.to_json())
                        .collect(),
                ),
            ),
            ("/rollouts/start", &Method::POST) => self.start_rollout(head.uri.query()).await,
            ("/rollouts/abort", &Method::POST) => {
                let query = rollout_query(head.uri.query());
                match query.get("queue") {
                    None => json(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        &serde_json::json!({"error": "name the consumer: ?queue=NAME"}),
                    ),
                    Some(queue) => rollout_answer(self.rollouts.abort(queue)),
                }
            }
            ("/plugins/reload", &Method::POST) => {
                let queue = head.uri.query().and_then(|query| {
                    form_urlencoded::parse(query.as_bytes())
                        .find(|(key, _)| key == "queue")
                        .map(|(_, value)| value.into_owned())
                });
                self.reload(queue.as_deref()).await
            }
            (
                "/health" | "/metrics" | "/plugins" | "/status" | "/" | "/status.js"
                | "/status.css",
                _,
            ) => not_allowed("GET"),
            ("/health/live" | "/health/ready", _) => not_allowed("GET, HEAD"),
            ("/plugins/reload", _) => not_allowed("POST"),
            ("/rollouts", _) => not_allowed("GET"),
            ("/rollouts/start" | "/rollouts/abort", _) => not_allowed("POST"),
            _ => json(
                StatusCode::NOT_FOUND,
                &serde_json::json!({
                    "error": format!("no such endpoint: {path}"),
                    "endpoints": ["GET /", "GET /status", "GET /health", "GET /health/live", "GET /health/ready", "GET /metrics", "GET /plugins", "POST /plugins/reload[?queue=NAME]", "GET /rollouts", "POST /rollouts/start?queue=NAME&plugin=PATH[&mode=...]", "POST /rollouts/abort?queue=NAME"],
                }),
            ),
        }
    }

    /// `/health/live`: the status word only (the probe is open to all).
    fn live(&self) -> Response<Full<Bytes>> {
        match self.heartbeat.liveness() {
            Liveness::Live => json(StatusCode::OK, &serde_json::json!({"status": "LIVE"})),
            Liveness::Stalled { .. } => json(
                StatusCode::SERVICE_UNAVAILABLE,
                &serde_json::json!({"status": "STALLED"}),
            ),
        }
    }

    /// `/health/ready`: the status word only (the probe is open to all;
    /// `/health` says why).
    fn ready(&self) -> Response<Full<Bytes>> {
        match self.readiness() {
            Readiness::Ready => json(StatusCode::OK, &serde_json::json!({"status": "READY"})),
            Readiness::NotReady(_) => json(
                StatusCode::SERVICE_UNAVAILABLE,
                &serde_json::json!({"status": "NOT_READY"}),
            ),
        }
    }

    fn readiness(&self) -> Readiness {
        let links: Vec<(&str, Phase)> = self.links.iter().map(|l| (l.role(), l.phase())).collect();
        health::readiness(self.shutdown.is_cancelled(), &links, &self.board.snapshot())
    }

    /// The assessment `/health` answers with.
    fn assessment(
        &self,
        links: &[(&str, Phase)],
        board: &[(String, crate::broker::Reading)],
    ) -> health::Assessment {
        let faulting: Vec<String> = self
            .reloader
            .status()
            .iter()
            .filter_map(|plugin| Some(plugin.faulting.as_ref()?.sentence(&plugin.queue)))
            .collect();
        let troubles = self
            .store
            .as_ref()
            .and_then(|store| store.trouble())
            .into_iter()
            .chain(faulting);
        health::with_troubles(
            health::assess(self.shutdown.is_cancelled(), links, board),
            troubles,
        )
    }

    /// `/status`: the status page's data.
    fn status(&self) -> Response<Full<Bytes>> {
        let links: Vec<(&str, Phase)> = self.links.iter().map(|l| (l.role(), l.phase())).collect();
        let board = self.board.snapshot();
        let health = self.assessment(&links, &board);
        let plugins = self.reloader.status();
        let activity = self.metrics.activity.report(Instant::now());
        let in_flight = board
            .iter()
            .map(|(queue, _)| {
                let label = crate::telemetry::QueueLabel {
                    queue: queue.clone(),
                };
                (
                    queue.clone(),
                    self.metrics.in_flight.get_or_create(&label).get(),
                )
            })
            .collect();
        let document = status::document(&status::Parts {
            version: env!("CARGO_PKG_VERSION"),
            commit: crate::build_info::COMMIT,
            started: self.started,
            now: std::time::SystemTime::now(),
            health: &health,
            links: &links,
            board: &board,
            plugins: &plugins,
            activity: &activity,
            in_flight: &in_flight,
            oldest_unacked: &self.board.oldest_unsettled(),
            streams: &self.board.stream_progress(),
            rollouts: &self.rollouts.views(),
        });
        json(StatusCode::OK, &document)
    }

    fn health(&self) -> Response<Full<Bytes>> {
        let links: Vec<(&str, Phase)> = self.links.iter().map(|l| (l.role(), l.phase())).collect();
        let board = self.board.snapshot();
        let assessment = self.assessment(&links, &board);
        let status = self.reloader.status();
        let plugins: std::collections::BTreeMap<String, String> =
            status.into_iter().map(|s| (s.queue, s.sha256)).collect();
        let consumers: Vec<_> = board
            .iter()
            .map(|(queue, reading)| {
                serde_json::json!({"queue": queue, "sha256": plugins.get(queue), "reading": reading.word(), "reason": reading.reason()})
            })
            .collect();
        let connections: serde_json::Map<String, serde_json::Value> = links
            .iter()
            .map(|(role, phase)| {
                (
                    role.to_string(),
                    serde_json::json!({"state": phase.word(), "detail": phase.detail()}),
                )
            })
            .collect();
        let (reading, all) = assessment.consuming;
        json(
            if assessment.status == health::Status::Down {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            },
            &serde_json::json!({
                "status": assessment.status.as_str(),
                "details": assessment.details,
                "consuming": format!("{reading}/{all}"),
                "consumers": consumers,
                "connections": connections,
                "readiness": match self.readiness() {
                    Readiness::Ready => serde_json::json!({"status": "READY", "details": []}),
                    Readiness::NotReady(why) => serde_json::json!({"status": "NOT_READY", "details": why}),
                },
                "liveness": match self.heartbeat.liveness() {
                    live @ Liveness::Live => serde_json::json!({"status": "LIVE", "details": live.sentence()}),
                    stalled => serde_json::json!({"status": "STALLED", "details": stalled.sentence()}),
                },
            }),
        )
    }

    /// `POST /rollouts/start?queue=Q&plugin=ABSOLUTE_PATH[&mode=..&steps=1%,10%,100%&share=..&messages_per_step=..&max_fault_rate_increase=..&max_set_aside_rate_increase=..&max_call_time_ratio=..&shadow_concurrency=..&keep_differences=..]`.
    async fn start_rollout(&self, query: Option<&str>) -> Response<Full<Bytes>> {
        let query = rollout_query(query);
        let unusable = |why: String| {
            json(
                StatusCode::UNPROCESSABLE_ENTITY,
                &serde_json::json!({ "error": why }),
            )
        };
        let (Some(queue), Some(plugin)) = (query.get("queue"), query.get("plugin")) else {
            return unusable(
                "name the consumer and the candidate: ?queue=NAME&plugin=/path/to/candidate.wasm"
                    .into(),
            );
        };
        let plugin = std::path::PathBuf::from(plugin);
        if !plugin.is_absolute() {
            return unusable(format!(
                "plugin: give the candidate's absolute path, not {}",
                plugin.display()
            ));
        }
        let spec = match crate::rollout::plan::PlanSpec::from_query(&query) {
            Ok(spec) => spec,
            Err(bad) => return unusable(format!("{}: {}", bad.field, bad.reason)),
        };
        rollout_answer(self.rollouts.start_spec(queue, &spec, plugin).await)
    }

    async fn reload(&self, queue: Option<&str>) -> Response<Full<Bytes>> {
        match self
            .reloader
            .reload(queue, Trigger::now(Cause::Admin))
            .await
        {
            Ok(reports) => {
                let refused = reports.iter().any(|r| r.result.is_refused());
                json(
                    if refused {
                        StatusCode::UNPROCESSABLE_ENTITY
                    } else {
                        StatusCode::OK
                    },
                    &serde_json::json!({
                        "results": reports.iter().map(|r| r.to_json()).collect::<Vec<_>>(),
                    }),
                )
            }
            Err(unknown) => json(
                StatusCode::NOT_FOUND,
                &serde_json::json!({ "error": unknown.to_string() }),
            ),
        }
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The fields of a rollout request's query.
fn rollout_query(query: Option<&str>) -> std::collections::BTreeMap<String, String> {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .map(|(key, value)| (key.into_owned(), value.into_owned()))
        .collect()
}

/// A rollout's view, or why it was refused, with its status code.
fn rollout_answer(
    result: Result<crate::rollout::live::RolloutView, crate::rollout::live::Refusal>,
) -> Response<Full<Bytes>> {
    use crate::rollout::live::Refusal;
    match result {
        Ok(view) => json(StatusCode::OK, &view.to_json()),
        Err(refusal) => {
            let status = match refusal {
                Refusal::UnknownQueue(_) => StatusCode::NOT_FOUND,
                Refusal::UnderWay(_) | Refusal::NoneUnderWay(_) => StatusCode::CONFLICT,
                Refusal::Unusable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            };
            json(status, &serde_json::json!({ "error": refusal.to_string() }))
        }
    }
}

/// The status page or one of its files, with the page's security headers.
fn page(body: &'static str, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(status::CONTENT_SECURITY_POLICY),
    );
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn json(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut text_body = body.to_string();
    text_body.push('\n');
    text(status, "application/json", text_body)
}

fn refused(refusal: &Refusal) -> Response<Full<Bytes>> {
    let mut response = json(
        refusal.status(),
        &serde_json::json!({ "error": refusal.to_string() }),
    );
    if refusal.challenges() {
        response
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

fn not_allowed(allow: &'static str) -> Response<Full<Bytes>> {
    let mut response = json(
        StatusCode::METHOD_NOT_ALLOWED,
        &serde_json::json!({ "error": format!("use {allow}") }),
    );
    response
        .headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_over_cap_warning_comes_once_per_period_with_its_count() {
        let start = Instant::now();
        let mut throttle = Throttle::new(Duration::from_secs(10));
        assert_eq!(throttle.note(start), Some(1));
        for ms in [1, 500, 9_999] {
            assert_eq!(throttle.note(start + Duration::from_millis(ms)), None);
        }
        assert_eq!(throttle.note(start + Duration::from_secs(10)), Some(4));
        assert_eq!(throttle.note(start + Duration::from_secs(11)), None);
        assert_eq!(throttle.note(start + Duration::from_secs(20)), Some(2));
    }
}
