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
pub mod broker_faults;
pub mod browser;
pub mod collector;
pub mod counting_alloc;
pub mod fault_proxy;
pub mod host;
pub mod machine;
pub mod node_faults;
pub mod pki;
pub mod raw_amqp;
pub mod redis;
pub mod scheduler_peer;
pub mod stamp;
pub mod state_cases;
pub mod state_host;
pub mod stream_reader;
pub mod tally;
pub mod watchdog;

pub use broker::{Broker, Cluster, ReceivedMessage, shared_broker, shared_cluster, unique_name};
pub use fault_proxy::FaultProxy;

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

/// The median of `values` (sorted in place; the mean of the middle two for
/// an even count), NaN for none: the benches' summary of repeated runs.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// `key=value` from the `RESULT` line of a `loadgen` run's output (see
/// `src/bin/loadgen.rs`), as a number.
pub fn loadgen_result(stdout: &str, key: &str) -> anyhow::Result<f64> {
    use anyhow::Context as _;
    let line = stdout
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .with_context(|| format!("no RESULT line in:\n{stdout}"))?;
    let value = line
        .split_whitespace()
        .find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
        .with_context(|| format!("no {key}= in {line:?}"))?;
    value.parse().with_context(|| format!("{key}={value:?}"))
}

/// A connected publish link to `broker`, as the host builds one (the
/// contract's publishing limits, metrics kept in a registry of its own),
/// for tests of the publisher on its own. Not supervised: nothing
/// reconnects it.
pub async fn publish_link(broker: &Broker) -> std::sync::Arc<acemq_host::broker::PublishLink> {
    publish_link_to(broker.amqp_url(), Default::default()).await
}

/// A connected publish link to the broker at `url` (a [`FaultProxy`] in
/// front of it, say) with the publishing limits `settings`; otherwise as
/// [`publish_link`].
pub async fn publish_link_to(
    url: &str,
    settings: acemq_host::broker::PublishSettings,
) -> std::sync::Arc<acemq_host::broker::PublishLink> {
    use acemq_host::broker::{Addresses, BrokerUrl, Link, OnConnected, PublishLink, Recovery};
    use std::sync::Arc;
    use std::time::Duration;
    let metrics = Arc::new(acemq_host::telemetry::Metrics::new());
    let url = BrokerUrl::parse(url).expect("the test broker's URL parses");
    let link = Link::new(
        "publish",
        Addresses::new(vec![url], "acemq-tests.publish"),
        metrics.clone(),
    );
    let recovery = Recovery {
        interval: Duration::from_secs(1),
        backoff_max: Duration::from_secs(5),
        attempt_timeout: Duration::from_secs(10),
    };
    let nothing: OnConnected = Arc::new(|_| Box::pin(async { Ok(()) }));
    link.connect_first(&recovery, &nothing, Duration::from_secs(30))
        .await
        .expect("the test broker accepts a connection");
    PublishLink::new(link, settings, metrics)
}
