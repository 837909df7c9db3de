//! An OpenTelemetry collector inside the test process: it accepts OTLP over
//! HTTP (protobuf, `POST /v1/traces`) on a loopback port and keeps every
//! span it is sent, so a test can follow one trace across hosts.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message as _;
use tokio::net::TcpListener;

/// One span as received.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectedSpan {
    /// Hex, as `traceparent` writes it.
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// The OTLP kind: 4 producer, 5 consumer.
    pub kind: i32,
    /// String, integer and boolean attributes, as text.
    pub attributes: BTreeMap<String, String>,
    /// The instrumentation scope's name.
    pub scope: String,
    /// The resource's `service.name`.
    pub service: String,
}

impl CollectedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// The running collector; it stops when dropped.
pub struct Collector {
    /// The base URL to configure as `otlp_endpoint`.
    pub endpoint: String,
    spans: Arc<Mutex<Vec<CollectedSpan>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Collector {
    pub async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let kept = kept.clone();
                        async move { Ok::<_, Infallible>(receive(request, &kept).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            endpoint,
            spans,
            server,
        })
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<CollectedSpan> {
        self.spans.lock().unwrap().clone()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn receive(
    request: Request<Incoming>,
    kept: &Mutex<Vec<CollectedSpan>>,
) -> Response<Full<Bytes>> {
    let answer = |status: StatusCode, body: &'static str| {
        let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *response.status_mut() = status;
        response
    };
    if request.uri().path() != "/v1/traces" {
        return answer(StatusCode::NOT_FOUND, "only /v1/traces");
    }
    let Ok(body) = request.into_body().collect().await else {
        return answer(StatusCode::BAD_REQUEST, "unreadable body");
    };
    let Ok(export) = ExportTraceServiceRequest::decode(body.to_bytes()) else {
        return answer(StatusCode::BAD_REQUEST, "not an OTLP protobuf trace export");
    };
    let mut spans = kept.lock().unwrap();
    for resource_spans in export.resource_spans {
        let service = resource_spans
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
            .unwrap_or_default();
        for scope_spans in resource_spans.scope_spans {
            let scope = scope_spans.scope.map(|s| s.name).unwrap_or_default();
            for span in scope_spans.spans {
                spans.push(CollectedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    kind: span.kind,
                    attributes: span
                        .attributes
                        .iter()
                        .filter_map(|kv| {
                            Some((kv.key.clone(), text(kv.value.as_ref()?.value.as_ref()?)?))
                        })
                        .collect(),
                    scope: scope.clone(),
                    service: service.clone(),
                });
            }
        }
    }
    // An empty ExportTraceServiceResponse: everything accepted.
    let mut response = answer(StatusCode::OK, "");
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/x-protobuf"),
    );
    response
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        Value::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
