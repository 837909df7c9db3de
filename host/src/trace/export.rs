//! Sending finished spans to an OpenTelemetry collector (OTLP over HTTP),
//! when configured. Off by default: the propagation of `traceparent`
//! (`super::DeliveryTrace`) runs either way, and costs no export.
//!
//! The host decides its spans' ids itself (it writes them into the
//! `traceparent` of what it publishes before the span ends), so it builds
//! finished `SpanData` and hands them to the SDK's batch processor, which
//! queues them (dropping, never blocking, when the collector falls behind)
//! and exports from a thread of its own.

use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::InstrumentationScope;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SpanData, SpanProcessor as _};

use crate::config::TracingConfig;

/// The instrumentation scope every AceMQ library reports its spans under.
pub const SCOPE: &str = "org.acemq.amqp";

/// The standard variables that switch export on without a config key.
const ENDPOINT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// Where spans go: nowhere, or a collector.
pub struct Tracer {
    export: Option<Export>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("endpoint", &self.endpoint())
            .finish()
    }
}

struct Export {
    processor: BatchSpanProcessor,
    scope: InstrumentationScope,
    /// Where, for the log.
    endpoint: String,
}

impl Tracer {
    /// Exports nothing.
    pub fn off() -> Self {
        Self { export: None }
    }

    /// Export as `config` says, or as the standard `OTEL_EXPORTER_OTLP_*`
    /// variables say when it names no endpoint; off when neither does.
    ///
    /// Builds a blocking HTTP client: call it outside the async runtime
    /// (the host prepares everything before it starts one).
    pub fn from_config(config: &TracingConfig) -> anyhow::Result<Self> {
        let from_env = ENDPOINT_VARIABLES
            .iter()
            .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()));
        let endpoint = match (&config.otlp_endpoint, from_env) {
            // Like OTEL_EXPORTER_OTLP_ENDPOINT: the collector's base URL.
            (Some(base), _) => Some(format!("{}/v1/traces", base.trim_end_matches('/'))),
            (None, Some(_)) => None,
            (None, None) => return Ok(Self::off()),
        };
        let protocol = match config.otlp_protocol.as_deref().unwrap_or("http/protobuf") {
            "http/protobuf" => Protocol::HttpBinary,
            "http/json" => Protocol::HttpJson,
            other => anyhow::bail!(
                "[tracing] otlp_protocol = {other:?} is not one the host speaks: use \"http/protobuf\" or \"http/json\""
            ),
        };
        let mut builder = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(protocol)
            .with_timeout(Duration::from_secs(10));
        if let Some(endpoint) = &endpoint {
            builder = builder.with_endpoint(endpoint.clone());
        }
        let exporter = builder
            .build()
            .context("the OTLP trace exporter could not be set up")?;
        let mut processor = BatchSpanProcessor::builder(exporter).build();
        processor.set_resource(&resource());
        let scope = InstrumentationScope::builder(SCOPE)
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let endpoint = endpoint.unwrap_or_else(|| "from OTEL_EXPORTER_OTLP_* variables".into());
        Ok(Self {
            export: Some(Export {
                processor,
                scope,
                endpoint,
            }),
        })
    }

    /// Whether spans are exported: only then are they built.
    pub fn exporting(&self) -> bool {
        self.export.is_some()
    }

    /// The collector spans go to, when exporting.
    pub fn endpoint(&self) -> Option<&str> {
        self.export.as_ref().map(|e| e.endpoint.as_str())
    }

    /// The scope a span is reported under.
    pub(super) fn scope(&self) -> Option<&InstrumentationScope> {
        self.export.as_ref().map(|e| &e.scope)
    }

    /// Queues a finished span for export.
    pub(super) fn record(&self, span: SpanData) {
        if let Some(export) = &self.export {
            export.processor.on_end(span);
        }
    }

    /// Exports what is queued and stops, waiting at most `timeout`. Blocks:
    /// call it outside the async runtime's workers.
    pub fn shutdown(&self, timeout: Duration) {
        if let Some(export) = &self.export
            && let Err(e) = export.processor.shutdown_with_timeout(timeout)
        {
            tracing::warn!(error = %e, "spans still queued at shutdown were not all exported");
        }
    }
}

/// `service.name` from `OTEL_SERVICE_NAME` (or `OTEL_RESOURCE_ATTRIBUTES`)
/// when set, `acemq-host` otherwise.
fn resource() -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder.with_service_name("acemq-host").build()
    }
}
