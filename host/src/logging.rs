//! Log lines on stderr: text for people or JSON for a log pipeline, and
//! which of them are written (`RUST_LOG`, or the host's default filter).

use tracing_subscriber::EnvFilter;

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

/// Installs the process's log subscriber (once; later calls do nothing).
pub fn init(format: LogFormat) {
    let rust_log = std::env::var(EnvFilter::DEFAULT_ENV).ok();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(log_filter(rust_log.as_deref()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
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
    fn an_explicit_rust_log_wins() {
        let log = logged_through(log_filter(Some("warn")));
        assert!(log.contains("Server returned us a message"), "{log}");
        let log = logged_through(log_filter(Some("error")));
        assert!(!log.contains("outputs were not confirmed"), "{log}");
    }
}
