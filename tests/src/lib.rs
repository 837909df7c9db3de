//! Integration-test harness for acemq-host.
//!
//! The [`broker`] module runs a throwaway RabbitMQ node per test binary (or
//! uses the one named by `ACEMQ_TEST_URL`) and offers the assertions the
//! tests need: exact message counts, draining queues, management API reads.
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use acemq_tests::{shared_broker, unique_name};
//! let broker = shared_broker();
//! let queue = unique_name("orders");
//! // ... declare `queue` through lapin, run the host against broker.amqp_url() ...
//! assert_eq!(broker.message_count(&queue).await?, 0);
//! # Ok(())
//! # }
//! ```

pub mod broker;
pub mod host;

pub use broker::{Broker, ReceivedMessage, shared_broker, unique_name};

/// A setting from the environment (benchmarks' knobs), or `default` when
/// unset or blank; a value that does not parse is an error naming it.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Ok(text) if !text.trim().is_empty() => text
            .trim()
            .parse()
            .map_err(|e| anyhow::anyhow!("{name}={text:?}: {e}")),
        _ => Ok(default),
    }
}
