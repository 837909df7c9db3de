//! `acemq-host plugin run FILE.wasm --body ...`: one message through a
//! handler component, without a broker, through the very code a consumer
//! uses: the message is built as a delivery would be (`Envelope::read`,
//! `delivery::handler_input`), the plugin is loaded as a `HandlerVersion`
//! and called through a `HandlerSlot` by `delivery::run_plugins`, under the
//! default consumer limits, with fuel metering on.
//!
//! Nothing is published: the outputs are shown. The plugin's log lines,
//! which the host writes to its log, are captured and shown too.
//!
//! Exit codes: 0 when the call completed, whatever the handler decided;
//! 1 when it did not (a trap, a panic, the deadline, memory, or a publish
//! outside `--publish-to`, which the host treats as a fault); 2 when the
//! input cannot be used (an argument, the body file, the plugin file).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};
use bytes::Bytes;
use lapin::BasicProperties;
use lapin::types::AMQPValue;

use super::Failure;
use super::captured::{self, CapturedDelivery};
use crate::delivery::{self, PluginRun};
use crate::dlq;
use crate::envelope::{self, Envelope};
use crate::plugin::{
    CacheChoice, CodecSet, ConsumerContext, EngineSettings, HandlerSlot, HandlerVersion, Limits,
    Outcome, Outgoing, PluginEngine,
};

/// The queue the message seems to come from (the consumer's queue, as the
/// plugin sees it in `delivery().queue` and the host tags logs with).
pub const QUEUE: &str = "plugin-run";
/// The routing key a message seems to have been published with when
/// neither a flag nor a captured message says.
pub const DEFAULT_ROUTING_KEY: &str = "plugin.run";
/// Body bytes shown per output.
const BODY_PREVIEW: usize = 200;

/// What `plugin run` was asked for.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub plugin: PathBuf,
    /// A captured delivery (see [`captured`]): its properties, payload and
    /// route, which the flags below override one by one.
    pub message: Option<PathBuf>,
    /// `@FILE` (`@-`: standard input) or the text itself; required
    /// unless `message` carries a payload.
    pub body: Option<String>,
    pub headers: Vec<(String, String)>,
    pub config: Vec<(String, String)>,
    pub content_type: Option<String>,
    /// Default: the captured message's, else `""` (the default exchange).
    pub exchange: Option<String>,
    /// Default: the captured message's, else [`DEFAULT_ROUTING_KEY`].
    pub routing_key: Option<String>,
    /// Default: the captured message's, else a random one.
    pub message_id: Option<String>,
    /// The exchanges the handler may publish to (`publish_to`).
    pub publish_to: Vec<String>,
    pub deadline: Duration,
}

/// `KEY=VALUE`, split at the first `=`; the key may not be empty.
pub fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_string(), value.to_string()))
        }
        _ => Err(format!("expected KEY=VALUE, got '{text}'")),
    }
}

/// The body `--body` names: the file after `@` (`@-`: standard input), or
/// the text as given.
pub fn read_body(arg: &str) -> anyhow::Result<Vec<u8>> {
    match arg.strip_prefix('@') {
        Some("-") => {
            let mut body = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut body)
                .context("cannot read the body from standard input")?;
            Ok(body)
        }
        Some(path) => {
            std::fs::read(path).with_context(|| format!("cannot read the body file {path}"))
        }
        None => Ok(arg.as_bytes().to_vec()),
    }
}

/// The message to run: its body, properties and route, from the captured
/// delivery when there is one, each overridden by its flag.
#[derive(Debug)]
struct Message {
    body: Vec<u8>,
    properties: BasicProperties,
    exchange: String,
    routing_key: String,
}

fn message(request: &RunRequest) -> anyhow::Result<Message> {
    let captured = match &request.message {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the message file {}", path.display()))?;
            captured::parse(&text).map_err(|why| anyhow!("{}: {why}", path.display()))?
        }
        None => CapturedDelivery::default(),
    };
    let body = match (&request.body, captured.body) {
        (Some(arg), _) => read_body(arg)?,
        (None, Some(body)) => body,
        (None, None) => {
            return Err(anyhow!(match &request.message {
                Some(path) => format!(
                    "no body: {} has no payload, and there is no --body",
                    path.display()
                ),
                None => "no body: give --body (or --message with a captured delivery)".into(),
            }));
        }
    };
    Ok(Message {
        body,
        properties: with_flags(captured.properties, request),
        exchange: request
            .exchange
            .clone()
            .or(captured.exchange)
            .unwrap_or_default(),
        routing_key: request
            .routing_key
            .clone()
            .or(captured.routing_key)
            .unwrap_or_else(|| DEFAULT_ROUTING_KEY.to_string()),
    })
}

/// `properties` (a captured message's, or none) with what the flags say on
/// top: `--header` adds or replaces a header, `--content-type` and
/// `--message-id` replace theirs. A message without an id gets a random
/// one, as a publisher's library would give it.
fn with_flags(properties: BasicProperties, request: &RunRequest) -> BasicProperties {
    let mut headers = properties.headers().clone().unwrap_or_default();
    for (key, value) in &request.headers {
        headers.insert(
            key.as_str().into(),
            AMQPValue::LongString(value.as_str().into()),
        );
    }
    let message_id = request
        .message_id
        .clone()
        .or_else(|| properties.message_id().as_ref().map(|id| id.to_string()))
        .unwrap_or_else(|| format!("plugin-run-{}", uuid::Uuid::new_v4().simple()));
    let mut properties = properties
        .with_headers(headers)
        .with_message_id(message_id.into());
    if let Some(content_type) = &request.content_type {
        properties = properties.with_content_type(content_type.as_str().into());
    }
    properties
}

/// One plugin log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub level: String,
    pub text: String,
}

/// Where a run's compiled plugin came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    FromCache,
    /// Compiled, and kept in the cache for the next run.
    Compiled,
    /// Compiled; there is no cache to keep it in (the log says why).
    CompiledUncached,
}

impl Load {
    fn describe(self) -> &'static str {
        match self {
            Load::FromCache => "from the compiled-plugin cache",
            Load::Compiled => "compiled, and cached for the next run",
            Load::CompiledUncached => "compiled; no cache to keep it in",
        }
    }
}

/// What one run came to.
#[derive(Debug)]
pub struct RunReport {
    pub run: PluginRun,
    pub logs: Vec<LogLine>,
    pub load_time: Duration,
    /// Where the plugin's machine code came from.
    pub load: Load,
    pub call_time: Duration,
    /// The message's envelope as the host read it: the parent of every
    /// output's.
    pub envelope: Arc<Envelope>,
    /// When the outputs would be published (their envelopes' time).
    pub at_ms: u64,
}

impl RunReport {
    /// Whether the call completed (exit 0) or not (exit 1).
    pub fn completed(&self) -> bool {
        matches!(self.run, PluginRun::Decided { .. })
    }
}

/// Loads the plugin and runs the message through it.
pub fn run(request: &RunRequest) -> Result<RunReport, Failure> {
    let message = message(request).map_err(Failure::input)?;
    let engine = PluginEngine::new(EngineSettings {
        max_instances: 4,
        // The user's cache, as a host's: a Python or JavaScript plugin
        // compiles for seconds, the call takes milliseconds. Fuel metering
        // makes other machine code than a host's default, so the first run
        // after `plugin build` compiles once more.
        cache: CacheChoice::UserDefault,
        fuel_metering: true,
        ..EngineSettings::default()
    })
    .map_err(Failure::failed)?;
    let context = Arc::new(ConsumerContext {
        queue: QUEUE.to_string(),
        config: request.config.iter().cloned().collect::<BTreeMap<_, _>>(),
        publish_to: request.publish_to.iter().cloned().collect::<BTreeSet<_>>(),
        // A trial run may try delayed publishing: the report shows when
        // each output would be delivered.
        delayed: Some(crate::config::SchedulerConfig::default().max_delay),
        state: None,
        limits: Limits {
            deadline: request.deadline,
            ..Limits::default()
        },
    });
    let logs = Captured::default();
    let subscriber = {
        use tracing_subscriber::layer::SubscriberExt as _;
        tracing_subscriber::registry().with(logs.clone())
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Failure::failed)?;
    // The plugin logs through `tracing` (target "plugin"), on this thread:
    // loading warms an instance here, and the call runs on this thread's
    // runtime, so a thread-local subscriber sees every line.
    let (slot, load_time, load, envelope, run, call_time) =
        tracing::subscriber::with_default(subscriber, || -> Result<_, Failure> {
            let started = Instant::now();
            let version = HandlerVersion::load(&engine, &request.plugin, context)
                .map_err(|e| Failure::input(anyhow!(e)))?;
            let load = match (version.from_cache, engine.cache_dir()) {
                (true, _) => Load::FromCache,
                (false, Some(_)) => Load::Compiled,
                (false, None) => Load::CompiledUncached,
            };
            let slot = HandlerSlot::new(version);
            let load_time = started.elapsed();
            let Message {
                body,
                properties,
                exchange,
                routing_key,
            } = message;
            let envelope = Arc::new(Envelope::read(
                &properties,
                &routing_key,
                envelope::now_ms(),
            ));
            let input = delivery::handler_input(
                envelope.clone(),
                Arc::new(properties),
                &exchange,
                &routing_key,
                false,
                Bytes::from(body),
            );
            let codecs = CodecSet::new();
            let started = Instant::now();
            let run = runtime.block_on(delivery::run_plugins(&slot, &codecs, input));
            Ok((slot, load_time, load, envelope, run, started.elapsed()))
        })?;
    drop(slot);
    Ok(RunReport {
        run,
        logs: logs.lines(),
        load_time,
        load,
        call_time,
        envelope,
        at_ms: envelope::now_ms(),
    })
}

/// The report as the command prints it.
pub fn render(report: &RunReport) -> String {
    let mut out = String::new();
    let none = Vec::new();
    let (outcome, outputs) = match &report.run {
        PluginRun::Decided {
            outcome, outputs, ..
        } => (
            match outcome {
                Outcome::Accept => "accept: the message would be acknowledged".to_string(),
                Outcome::Retry(reason) => format!(
                    "retry: {reason} (the consumer's retry policy decides when; without one it is dead-lettered)"
                ),
                Outcome::Reject(reason) => {
                    format!("reject: {reason} (dead-lettered to {QUEUE}.dlq)")
                }
                Outcome::Park(reason) => format!("park: {reason} (set aside in {QUEUE}.parked)"),
            },
            outputs,
        ),
        PluginRun::Faulted { fault, .. } => (
            format!(
                "fault ({}): {fault} (the host retries it as the consumer's policy allows, then sets it aside)",
                fault.kind.label()
            ),
            &none,
        ),
        PluginRun::Misconfigured { reason, .. } => (
            format!(
                "fault (configuration): {reason} (the host would park it at once in \
                 {QUEUE}.parked; allow the exchange with --publish-to)"
            ),
            &none,
        ),
        PluginRun::OutputsRefused { reason, .. } => (format!("outputs refused: {reason}"), &none),
        PluginRun::Undecodable { reason } => (format!("undecodable: {reason}"), &none),
        PluginRun::CodecFaulted { reason } => (format!("codec fault: {reason}"), &none),
        PluginRun::HostFailed { reason } => (format!("host failure: {reason}"), &none),
        PluginRun::HostBusy { reason } => (format!("host busy: {reason}"), &none),
        PluginRun::StoreUnavailable { reason } => {
            (format!("state store unavailable: {reason}"), &none)
        }
        PluginRun::StateConflicted { reason, .. } => (format!("state conflict: {reason}"), &none),
    };
    out.push_str(&format!("outcome: {outcome}\n"));
    out.push_str(&format!("outputs: {}\n", outputs.len()));
    for (n, output) in outputs.iter().enumerate() {
        out.push_str(&render_output(
            n + 1,
            output,
            &report.envelope,
            report.at_ms,
        ));
    }
    if let PluginRun::Decided {
        reply: Some(reply), ..
    } = &report.run
    {
        out.push_str(&render_reply(reply));
    }
    out.push_str(&format!("logs: {}\n", report.logs.len()));
    for line in &report.logs {
        out.push_str(&format!("  {:<5} {}\n", line.level, line.text));
    }
    out.push_str(&format!(
        "time: {:.3} ms for the call ({:.1} ms to load the plugin, {})\n",
        report.call_time.as_secs_f64() * 1e3,
        report.load_time.as_secs_f64() * 1e3,
        report.load.describe()
    ));
    match report.run.fuel() {
        Some(fuel) => out.push_str(&format!("fuel: {fuel}\n")),
        None => out.push_str("fuel: -\n"),
    }
    out
}

/// The reply the call buffered: sent to the request's reply queue, with the
/// request's correlation, when the handler accepts.
fn render_reply(reply: &crate::envelope::Reply) -> String {
    let mut out = format!(
        "reply: {} bytes{} (sent to the request's reply queue on accept)\n",
        reply.body.len(),
        reply
            .content_type
            .as_deref()
            .map(|c| format!(", {c}"))
            .unwrap_or_default()
    );
    let id = reply
        .id
        .as_deref()
        .unwrap_or("derived from the request's id");
    out.push_str(&format!("     id: {id}\n"));
    if let Some(message_type) = &reply.message_type {
        out.push_str(&format!("     type: {message_type}\n"));
    }
    if let Some(version) = reply.version {
        out.push_str(&format!("     version: {version}\n"));
    }
    out
}

fn render_output(n: usize, output: &Outgoing, parent: &Envelope, at_ms: u64) -> String {
    let mut out = format!(
        "  {n}. exchange '{}', routing key '{}', {} bytes{}\n",
        output.exchange,
        output.routing_key,
        output.body.len(),
        output
            .content_type
            .as_deref()
            .map(|c| format!(", {c}"))
            .unwrap_or_default()
    );
    if let Some(due_at_ms) = output.deliver_at_ms {
        out.push_str(&format!("     {}\n", due_line(due_at_ms, at_ms)));
    }
    // What a host publishes: the properties and headers come from the
    // function the host's settlement uses, the envelope's `x-acemq-*`
    // headers after the plugin's own.
    match delivery::settle::output_properties(parent, output, at_ms, []) {
        Ok(properties) => {
            for (name, value) in dlq::format::property_lines(&properties) {
                out.push_str(&format!("     {name}: {value}\n"));
            }
            if let Some(headers) = properties.headers() {
                for (name, value) in headers.inner() {
                    out.push_str(&format!(
                        "     header {name}: {}\n",
                        dlq::format::header_value(value)
                    ));
                }
            }
        }
        Err(refused) => out.push_str(&format!("     not publishable: {refused}\n")),
    }
    out.push_str(&format!("     body: {}\n", body_preview(&output.body)));
    out
}

/// When a delayed output would be delivered, seen from `now_ms`.
fn due_line(due_at_ms: u64, now_ms: u64) -> String {
    let when = crate::envelope::rfc3339_millis(due_at_ms);
    let relative = if due_at_ms > now_ms {
        let left = std::time::Duration::from_secs((due_at_ms - now_ms).div_ceil(1000));
        format!("in {}", humantime::format_duration(left))
    } else {
        "already due".to_string()
    };
    format!("delivered at: {when} ({relative}, through the scheduler)")
}

/// The start of a body: as text when it is UTF-8, else in hex.
pub fn body_preview(body: &[u8]) -> String {
    let shown = &body[..body.len().min(BODY_PREVIEW)];
    let more = if body.len() > shown.len() { "..." } else { "" };
    match std::str::from_utf8(body) {
        Ok(text) => {
            let end = (0..=text.len().min(BODY_PREVIEW))
                .rev()
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(0);
            format!("{}{more}", &text[..end])
        }
        Err(_) => format!(
            "(binary) {}{more}",
            hex::encode(&shown[..shown.len().min(32)])
        ),
    }
}

/// The plugin's log lines (target `plugin`), kept in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<LogLine>>>);

impl Captured {
    fn lines(&self) -> Vec<LogLine> {
        self.0.lock().map(|lines| lines.clone()).unwrap_or_default()
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Captured {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _context: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if event.metadata().target() != "plugin" {
            return;
        }
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        if let Ok(mut lines) = self.0.lock() {
            lines.push(LogLine {
                level: event.metadata().level().to_string(),
                text: message.0,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::envelope::HeaderValue;
    use crate::plugin::{Fault, FaultKind};

    #[test]
    fn key_values_split_at_the_first_equals_sign() {
        assert_eq!(
            parse_key_value("tenant=acme").unwrap(),
            ("tenant".into(), "acme".into())
        );
        assert_eq!(
            parse_key_value("q=a=b").unwrap(),
            ("q".into(), "a=b".into())
        );
        assert_eq!(
            parse_key_value("empty=").unwrap(),
            ("empty".into(), "".into())
        );
        for bad in ["tenant", "=acme", ""] {
            assert!(
                parse_key_value(bad)
                    .unwrap_err()
                    .contains(&format!("'{bad}'")),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_body_is_text_or_a_file() {
        assert_eq!(read_body("hello").unwrap(), b"hello");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("body.json");
        std::fs::write(&file, b"{\"a\":1}").unwrap();
        assert_eq!(
            read_body(&format!("@{}", file.display())).unwrap(),
            b"{\"a\":1}"
        );
        let error = read_body("@/nonexistent/body").unwrap_err();
        assert!(
            format!("{error:#}").contains("/nonexistent/body"),
            "{error:#}"
        );
    }

    #[test]
    fn bodies_are_previewed_as_text_or_hex() {
        assert_eq!(body_preview(b"HELLO"), "HELLO");
        assert_eq!(body_preview(&[0xff, 0x00]), "(binary) ff00");
        let long = "é".repeat(150);
        let preview = body_preview(long.as_bytes());
        assert!(
            preview.ends_with("...") && preview.len() <= BODY_PREVIEW + 3,
            "{preview}"
        );
    }

    fn request(message: Option<PathBuf>, body: Option<&str>) -> RunRequest {
        RunRequest {
            plugin: PathBuf::from("p.wasm"),
            message,
            body: body.map(str::to_string),
            headers: vec![("tenant".into(), "globex".into())],
            config: Vec::new(),
            content_type: None,
            exchange: None,
            routing_key: Some("flagged.key".into()),
            message_id: None,
            publish_to: Vec::new(),
            deadline: Duration::from_secs(2),
        }
    }

    #[test]
    fn a_captured_message_gives_what_the_flags_do_not_override() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("captured.json");
        std::fs::write(
            &file,
            r#"{"exchange": "orders", "routing_key": "order.placed", "payload": "{}",
                "properties": {"message_id": "m-7", "content_type": "application/json",
                               "headers": {"tenant": "acme", "x-acemq-attempt": 3}}}"#,
        )
        .unwrap();
        let m = message(&request(Some(file.clone()), None)).unwrap();
        assert_eq!(m.body, b"{}");
        assert_eq!(
            (m.exchange.as_str(), m.routing_key.as_str()),
            ("orders", "flagged.key")
        );
        assert_eq!(m.properties.message_id().as_ref().unwrap().as_str(), "m-7");
        let headers = m.properties.headers().clone().unwrap();
        // --header replaces the captured one; the rest stays as captured.
        assert_eq!(
            headers.inner().get("tenant"),
            Some(&AMQPValue::LongString("globex".into()))
        );
        assert_eq!(
            headers.inner().get("x-acemq-attempt"),
            Some(&AMQPValue::LongLongInt(3))
        );
        let envelope = Envelope::read(&m.properties, &m.routing_key, 0);
        assert_eq!(envelope.attempt, 3);

        // --body wins over the payload.
        let flagged = message(&request(Some(file), Some("text"))).unwrap();
        assert_eq!(flagged.body, b"text");
        // Without either, the error says what is missing.
        let err = message(&request(None, None)).unwrap_err().to_string();
        assert!(err.starts_with("no body: give --body"), "{err}");
        let bare = dir.path().join("bare.json");
        std::fs::write(&bare, "{}").unwrap();
        let err = message(&request(Some(bare), None)).unwrap_err().to_string();
        assert!(err.contains("bare.json has no payload"), "{err}");
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{\"payload\": 3}").unwrap();
        let err = message(&request(Some(bad), None)).unwrap_err().to_string();
        assert!(err.contains("bad.json: not a captured message"), "{err}");
    }

    fn report(run: PluginRun) -> RunReport {
        RunReport {
            run,
            logs: vec![LogLine {
                level: "INFO".into(),
                text: "5 bytes".into(),
            }],
            load_time: Duration::from_millis(120),
            load: Load::Compiled,
            call_time: Duration::from_micros(250),
            envelope: Arc::new(Envelope::read(
                &BasicProperties::default()
                    .with_message_id("in-1".into())
                    .with_type("order.placed".into()),
                "k",
                1_800_000_000_000,
            )),
            at_ms: 1_800_000_000_500,
        }
    }

    #[test]
    fn the_report_shows_outcome_outputs_logs_time_and_fuel() {
        let done = report(PluginRun::Decided {
            outcome: Outcome::Accept,
            outputs: vec![Outgoing {
                exchange: "out".into(),
                routing_key: "k".into(),
                body: b"HELLO".to_vec(),
                content_type: Some("text/plain".into()),
                headers: vec![("tenant".into(), HeaderValue::Text("acme".into()))],
                envelope: crate::envelope::OutputFields::with_id(
                    "6f1c0c1e-3b5a-4c8e-9d2f-0a1b2c3d4e5f",
                ),
                persistent: true,
                mandatory: None,
                deliver_at_ms: None,
            }],
            version: Arc::from("abc"),
            fuel: Some(1234),
            reply: None,
        });
        assert!(done.completed());
        let text = render(&done);
        for expected in [
            "outcome: accept",
            "outputs: 1",
            "1. exchange 'out', routing key 'k', 5 bytes, text/plain",
            "header tenant: \"acme\"",
            // The envelope the host writes: the output's own id, caused by
            // the message, in its conversation.
            "message-id: 6f1c0c1e-3b5a-4c8e-9d2f-0a1b2c3d4e5f",
            "delivery-mode: 2",
            "header x-acemq-id: \"6f1c0c1e-3b5a-4c8e-9d2f-0a1b2c3d4e5f\"",
            "header x-acemq-causation: \"in-1\"",
            "header x-acemq-correlation: \"in-1\"",
            "header x-acemq-attempt: 1",
            "body: HELLO",
            "INFO  5 bytes",
            "time: 0.250 ms for the call (120.0 ms to load the plugin, compiled, and cached for the next run)",
            "fuel: 1234",
        ] {
            assert!(text.contains(expected), "{expected}: {text}");
        }
    }

    #[test]
    fn a_delayed_output_shows_when_it_would_be_delivered() {
        let due = 1_800_000_060_000;
        assert_eq!(
            due_line(due, due - 60_000),
            "delivered at: 2027-01-15T08:01:00.000Z (in 1m, through the scheduler)"
        );
        assert_eq!(
            due_line(due, due + 5),
            "delivered at: 2027-01-15T08:01:00.000Z (already due, through the scheduler)"
        );
    }

    #[test]
    fn the_report_shows_the_reply_a_call_buffered() {
        let answered = report(PluginRun::Decided {
            outcome: Outcome::Accept,
            outputs: Vec::new(),
            version: Arc::from("abc"),
            fuel: None,
            reply: Some(crate::envelope::Reply {
                body: br#"{"echo":"hi"}"#.to_vec(),
                content_type: Some("application/json".into()),
                headers: Vec::new(),
                id: None,
                message_type: Some("echo.reply".into()),
                version: None,
            }),
        });
        let text = render(&answered);
        for expected in [
            "outputs: 0",
            "reply: 13 bytes, application/json (sent to the request's reply queue on accept)",
            "id: derived from the request's id",
            "type: echo.reply",
        ] {
            assert!(text.contains(expected), "{expected}: {text}");
        }
    }

    #[test]
    fn a_fault_is_not_a_completed_call() {
        let faulted = report(PluginRun::Faulted {
            fault: Fault {
                kind: FaultKind::Panic,
                reason: "panic: boom".into(),
            },
            version: Arc::from("abc"),
            fuel: None,
        });
        assert!(!faulted.completed());
        assert!(render(&faulted).contains("outcome: fault (panic): panic: boom"));
        let rejected = report(PluginRun::Decided {
            outcome: Outcome::Reject("empty".into()),
            outputs: Vec::new(),
            version: Arc::from("abc"),
            fuel: None,
            reply: None,
        });
        assert!(rejected.completed());
        assert!(render(&rejected).contains("outcome: reject: empty"));
    }
}
