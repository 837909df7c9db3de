//! The admin HTTP endpoint, on `[host] admin_listen` (plain HTTP/1.1; bind it
//! to loopback or a private interface: it has no authentication).
//!
//! - `GET /health`: `{"status": "UP"|"DOWN", "consuming": "n/m", "consumers":
//!   [{queue, sha256}]}`: UP (200) once every consumer holds its
//!   subscription, DOWN (503) before that and from the start of shutdown.
//! - `GET /metrics`: every metric, in the Prometheus (OpenMetrics) text format.
//! - `GET /plugins`: each consumer's plugin: queue, path, sha256, size,
//!   loaded_at, from_cache, and the last refused reload with its reason.
//! - `POST /plugins/reload[?queue=NAME]`: reloads every consumer's plugin (or
//!   one), answering each consumer's result: 200 when each was swapped or
//!   unchanged, 422 when one was refused (its reason is in the body), 404 for
//!   a queue no consumer reads.

pub mod policy;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::plugin::swap::{Cause, Reloader, Trigger};
use crate::telemetry::Metrics;

/// A client must send its request head within this time.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open requests may take to finish once the endpoint stops.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// What the endpoint serves from.
pub struct Admin {
    pub reloader: Arc<Reloader>,
    pub metrics: Arc<Metrics>,
    /// Cancelled when the host begins shutting down: `/health` turns DOWN.
    pub shutdown: CancellationToken,
    /// Consumers holding a subscription right now (the reloader knows them all).
    pub consuming: Arc<AtomicUsize>,
}

/// Binds the endpoint's address. Done before the host connects anywhere, so
/// an address in use fails the start rather than the first health check.
pub async fn bind(address: &str) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(address)
        .await
        .with_context(|| format!("[host] admin_listen: cannot listen on {address}"))?;
    Ok(listener)
}

/// Serves on `listener` until `stop` is cancelled, then lets open requests
/// finish (for at most [`CLOSE_GRACE`]).
pub fn spawn(
    listener: TcpListener,
    admin: Arc<Admin>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    if let Ok(address) = listener.local_addr() {
        tracing::info!(address = %address, "admin endpoint listening");
    }
    tokio::spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            let accepted = tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, usually: wait rather than spin.
                    tracing::warn!(error = %e, "admin endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let admin = admin.clone();
            let stop = stop.clone();
            connections.spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let admin = admin.clone();
                    async move { Ok::<_, Infallible>(admin.route(request).await) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                tokio::pin!(connection);
                let served = tokio::select! {
                    served = connection.as_mut() => served,
                    _ = stop.cancelled() => {
                        // Finish the request in progress, then close.
                        connection.as_mut().graceful_shutdown();
                        connection.await
                    }
                };
                if let Err(e) = served {
                    tracing::debug!(error = %e, "admin endpoint connection");
                }
            });
            while connections.try_join_next().is_some() {}
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

impl Admin {
    async fn route(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = request.uri().path();
        let method = request.method();
        match (path, method) {
            ("/health", &Method::GET) => self.health(),
            ("/metrics", &Method::GET) => text(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                self.metrics.render(),
            ),
            ("/plugins", &Method::GET) => json(
                StatusCode::OK,
                &serde_json::Value::Array(
                    self.reloader
                        .status()
                        .iter()
                        .map(|status| status.to_json())
                        .collect(),
                ),
            ),
            ("/plugins/reload", &Method::POST) => {
                let queue = request.uri().query().and_then(|query| {
                    form_urlencoded::parse(query.as_bytes())
                        .find(|(key, _)| key == "queue")
                        .map(|(_, value)| value.into_owned())
                });
                self.reload(queue.as_deref()).await
            }
            ("/health" | "/metrics" | "/plugins", _) => not_allowed("GET"),
            ("/plugins/reload", _) => not_allowed("POST"),
            _ => json(
                StatusCode::NOT_FOUND,
                &serde_json::json!({
                    "error": format!("no such endpoint: {path}"),
                    "endpoints": ["GET /health", "GET /metrics", "GET /plugins", "POST /plugins/reload[?queue=NAME]"],
                }),
            ),
        }
    }

    fn health(&self) -> Response<Full<Bytes>> {
        // UP means serving: every consumer subscribed (not merely started)
        // and no shutdown under way.
        let consumers: Vec<_> = self
            .reloader
            .status()
            .iter()
            .map(|s| serde_json::json!({"queue": s.queue, "sha256": s.sha256}))
            .collect();
        let consuming = self.consuming.load(Ordering::SeqCst);
        let up = !self.shutdown.is_cancelled() && consuming == consumers.len();
        json(
            if up {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            },
            &serde_json::json!({
                "status": if up { "UP" } else { "DOWN" },
                "consuming": format!("{consuming}/{}", consumers.len()),
                "consumers": consumers,
            }),
        )
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

fn json(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut text_body = body.to_string();
    text_body.push('\n');
    text(status, "application/json", text_body)
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
