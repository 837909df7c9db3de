//! Connecting to the broker: retry with backoff until a deadline, logging the
//! address (never the password) so an operator sees what is being tried.

use std::time::{Duration, Instant};

use lapin::{Connection, ConnectionProperties};

use crate::config::redact_url;

/// First and largest pause between connection attempts.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Connects, retrying with exponential backoff until `timeout` has passed.
pub async fn connect(url: &str, name: &str, timeout: Duration) -> anyhow::Result<Connection> {
    let shown = redact_url(url);
    let started = Instant::now();
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 1u32;
    loop {
        let properties = ConnectionProperties::default().with_connection_name(name.into());
        match Connection::connect(url, properties).await {
            Ok(connection) => {
                tracing::info!(broker = %shown, attempt, "connected to the broker");
                return Ok(connection);
            }
            Err(error) => {
                let waited = started.elapsed();
                if waited + backoff > timeout {
                    anyhow::bail!(
                        "could not connect to the broker at {shown} within {} ({attempt} attempts); the last error was: {error}",
                        humantime::format_duration(timeout)
                    );
                }
                tracing::warn!(
                    broker = %shown,
                    attempt,
                    error = %error,
                    retry_in = %humantime::format_duration(backoff),
                    "cannot reach the broker yet"
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                attempt += 1;
            }
        }
    }
}
