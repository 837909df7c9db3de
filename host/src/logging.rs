//! Log lines on stderr: text for people or JSON for a log pipeline, and
//! which of them are written (`RUST_LOG`, or the host's default filter).
//!
//! One event is one line. Much of what the host logs comes from outside it:
//! a plugin's log text and what it prints, a handler's reject reason, a
//! panic message, a producer's message id. In the text format every control
//! character in the message and the fields is escaped ([`escape_control`]),
//! so none of them can end a line and forge the next one (or recolour a
//! terminal); the JSON format escapes them by its own rules.

use std::borrow::Cow;
use std::fmt::Write as _;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::{DefaultFields, Writer};

/// How log lines are written: `--log-format`, `ACEMQ_LOG_FORMAT` or the
/// config's `[host] log_format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The log filter without `RUST_LOG`: `info`, except lapin's warning for
/// every message the broker returns, which dumps its properties, headers
/// and body (`lapin::returned_messages`). The host logs each unroutable
/// output itself, naming its id, exchange, routing key and the broker's
/// reason, never its content.
pub const DEFAULT_LOG_FILTER: &str = "info,lapin::returned_messages=error";

/// `RUST_LOG` (`rust_log`) when set and valid: the operator's choice wins
/// whole, so `RUST_LOG=info` shows lapin's dumps again. Otherwise
/// [`DEFAULT_LOG_FILTER`].
fn log_filter(rust_log: Option<&str>) -> EnvFilter {
    rust_log
        .filter(|directives| !directives.trim().is_empty())
        .and_then(|directives| EnvFilter::try_new(directives).ok())
        .unwrap_or_else(|| EnvFilter::new(DEFAULT_LOG_FILTER))
}

/// `text` with every control character (and the Unicode line and paragraph
/// separators) written as an escape: `\n`, `\r`, `\t`, `\u{1b}`. What
/// has none is returned as it is.
pub fn escape_control(text: &str) -> Cow<'_, str> {
    fn escaped(c: char) -> bool {
        c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
    }
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if escaped(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// The text format's fields (the message among them), formatted as
/// tracing-subscriber does and then escaped by [`escape_control`]: one
/// event stays one line whatever its fields hold.
#[derive(Debug, Default)]
struct EscapedFields(DefaultFields);

impl<'writer> FormatFields<'writer> for EscapedFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> std::fmt::Result {
        let mut formatted = String::new();
        self.0.format_fields(Writer::new(&mut formatted), fields)?;
        writer.write_str(&escape_control(&formatted))
    }
}

/// Installs the process's log subscriber (once; later calls do nothing).
pub fn init(format: LogFormat) {
    let rust_log = std::env::var(EnvFilter::DEFAULT_ENV).ok();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(log_filter(rust_log.as_deref()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .fmt_fields(EscapedFields::default())
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        // Fields at the top level beside `message`, as log pipelines expect,
        // and no colour codes inside the strings.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_ansi(false)
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Log output kept in memory.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl tracing_subscriber::fmt::MakeWriter<'_> for Captured {
        type Writer = Self;
        fn make_writer(&self) -> Self {
            self.clone()
        }
    }

    /// What `filter` lets through of lapin's returned-message warning, one
    /// of lapin's connection warnings, and the host's unroutable-output line.
    fn logged_through(filter: EnvFilter) -> String {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(captured.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "lapin::returned_messages", "Server returned us a message");
            tracing::warn!(target: "lapin::io_loop", "connection lost");
            tracing::warn!(target: "acemq_host::delivery::settle", "outputs were not confirmed");
        });
        let bytes = captured.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn by_default_lapin_does_not_dump_returned_messages_and_the_host_line_stays() {
        for rust_log in [None, Some(""), Some("  "), Some("not a =filter= at all")] {
            let log = logged_through(log_filter(rust_log));
            assert!(
                !log.contains("Server returned us a message"),
                "{rust_log:?}: {log}"
            );
            assert!(log.contains("connection lost"), "{rust_log:?}: {log}");
            assert!(
                log.contains("outputs were not confirmed"),
                "{rust_log:?}: {log}"
            );
        }
    }

    #[test]
    fn control_characters_are_escaped_and_plain_text_is_left_alone() {
        assert!(matches!(escape_control("plain ünïcode"), Cow::Borrowed(_)));
        assert_eq!(
            escape_control("a\nb\r\tc\u{1b}[31md\u{7f}\u{2028}"),
            "a\\nb\\r\\tc\\u{1b}[31md\\u{7f}\\u{2028}"
        );
    }

    /// A plugin's log text with a newline and a forged host line in it: in
    /// the text format the event stays on one line, the forged part
    /// escaped inside it; fields (a panic reason) are held the same way.
    #[test]
    fn a_text_log_line_cannot_be_split_by_what_it_quotes() {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(EscapedFields::default())
            .with_writer(captured.clone())
            .with_ansi(false)
            .finish();
        let forged = "hello\n2026-01-01T00:00:00.000000Z  INFO acemq_host::app: host stopping";
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "plugin", queue = "orders", "{forged}");
            tracing::warn!(reason = %"boom\r\nERROR forged", "handler failed");
        });
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 2, "{log}");
        assert!(
            lines[0].ends_with(
                "hello\\n2026-01-01T00:00:00.000000Z  INFO acemq_host::app: host stopping queue=\"orders\""
            ),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].contains("reason=boom\\r\\nERROR forged"),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn an_explicit_rust_log_wins() {
        let log = logged_through(log_filter(Some("warn")));
        assert!(log.contains("Server returned us a message"), "{log}");
        let log = logged_through(log_filter(Some("error")));
        assert!(!log.contains("outputs were not confirmed"), "{log}");
    }
}
