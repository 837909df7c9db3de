//! Connecting to the broker: retry with backoff until a deadline, logging the
//! address (never the password) so an operator sees what is being tried.

use std::time::{Duration, Instant};

use lapin::{Connection, ConnectionProperties};

use super::BrokerUrl;

/// First and largest pause between connection attempts.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Connects, retrying with exponential backoff until `timeout` has passed.
pub async fn connect(url: &BrokerUrl, name: &str, timeout: Duration) -> anyhow::Result<Connection> {
    let started = Instant::now();
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 1u32;
    loop {
        let properties = ConnectionProperties::default().with_connection_name(name.into());
        // The parsed URI, never the text: lapin's parse errors repeat the URL.
        match Connection::connect_uri(url.amqp_uri(), properties).await {
            Ok(connection) => {
                tracing::info!(broker = %url, attempt, "connected to the broker");
                return Ok(connection);
            }
            Err(error) => {
                // No lapin error is known to hold the password once it has
                // the parsed URI; scrubbing keeps it so should one start to.
                let error = url.scrub(&error.to_string());
                let waited = started.elapsed();
                if waited + backoff > timeout {
                    anyhow::bail!(
                        "could not connect to the broker at {url} within {} ({attempt} attempts); the last error was: {error}",
                        humantime::format_duration(timeout)
                    );
                }
                tracing::warn!(
                    broker = %url,
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
