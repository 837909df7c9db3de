//! The config of the pipeline most tests and benchmarks run: a queue
//! consumed by a `stamp` plugin, each output published through a direct
//! exchange (routing key `stamped`) into an output queue.
//!
//! ```
//! use acemq_tests::stamp::StampConfig;
//! let config = StampConfig {
//!     broker: "url = \"amqp://guest:guest@127.0.0.1:5672/%2f\"",
//!     consumer: "prefetch = 100",
//!     ..StampConfig::new("orders.in", "orders.out", "orders.x")
//! };
//! assert!(config.toml().contains("routing_key = \"stamped\""));
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::broker::Broker;
use crate::host::plugin_path;

/// How many times each input was stamped among the outputs `output` holds
/// now (taken off it): the `input` field of each stamped body.
pub async fn drain_stamped(broker: &Broker, output: &str) -> BTreeMap<String, usize> {
    let count = broker.message_count(output).await.unwrap() as usize;
    let mut seen = BTreeMap::new();
    for message in broker
        .drain(output, count, Duration::from_secs(10))
        .await
        .unwrap()
    {
        let body: serde_json::Value = serde_json::from_slice(&message.body).unwrap();
        *seen
            .entry(body["input"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    seen
}

/// Like [`drain_stamped`], again and again until `distinct` different
/// inputs were stamped (duplicates make the output count alone
/// misleading), or a minute passed.
pub async fn stamped_until(
    broker: &Broker,
    output: &str,
    distinct: usize,
) -> BTreeMap<String, usize> {
    stamped_within(broker, output, distinct, Duration::from_secs(60)).await
}

/// [`stamped_until`] with a wait of `within`.
pub async fn stamped_within(
    broker: &Broker,
    output: &str,
    distinct: usize,
    within: Duration,
) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + within;
    while seen.len() < distinct && tokio::time::Instant::now() < deadline {
        let _ = broker
            .wait_for_message_count(output, 1, Duration::from_secs(5))
            .await;
        for (input, times) in drain_stamped(broker, output).await {
            *seen.entry(input).or_insert(0) += times;
        }
    }
    seen
}

/// What varies between the tests that run the stamp pipeline; every field
/// holding lines is pasted into its TOML table as it is.
#[derive(Debug, Clone)]
pub struct StampConfig<'a> {
    /// The `[broker]` table's lines (`url`, recovery settings), and any
    /// `[broker.tls]` table after them.
    pub broker: &'a str,
    /// The `[host]` table's lines; empty: no `[host]` table.
    pub host: &'a str,
    /// The queue consumed.
    pub input: &'a str,
    /// More lines of the input's `[[queues]]` entry (`type`, `dead_letter`).
    pub input_queue: &'a str,
    /// The queue the outputs reach.
    pub output: &'a str,
    /// More lines of the output's `[[queues]]` entry.
    pub output_queue: &'a str,
    /// The direct exchange the plugin publishes to (`out_exchange`).
    pub exchange: &'a str,
    /// The handler: `stamp-v1` unless said otherwise.
    pub plugin: PathBuf,
    /// More lines of the `[[consumers]]` entry (`prefetch`, `concurrency`,
    /// a stream's `offset`).
    pub consumer: &'a str,
}

impl<'a> StampConfig<'a> {
    /// `input` -> `stamp-v1` -> `exchange` -> `output`, with nothing else
    /// set: fill in at least `broker`.
    pub fn new(input: &'a str, output: &'a str, exchange: &'a str) -> Self {
        Self {
            broker: "",
            host: "",
            input,
            input_queue: "",
            output,
            output_queue: "",
            exchange,
            plugin: plugin_path("stamp-v1"),
            consumer: "",
        }
    }

    /// The config file's text.
    pub fn toml(&self) -> String {
        let host = if self.host.is_empty() {
            String::new()
        } else {
            format!("[host]\n{}\n\n", self.host)
        };
        format!(
            r#"[broker]
{broker}

{host}[[exchanges]]
name = "{exchange}"
kind = "direct"

[[queues]]
name = "{input}"
{input_queue}

[[queues]]
name = "{output}"
{output_queue}

[[bindings]]
queue = "{output}"
exchange = "{exchange}"
routing_key = "stamped"

[[consumers]]
queue = "{input}"
plugin = {plugin}
publish_to = ["{exchange}"]
{consumer}

[consumers.config]
out_exchange = "{exchange}"
"#,
            broker = self.broker,
            exchange = self.exchange,
            input = self.input,
            input_queue = self.input_queue,
            output = self.output,
            output_queue = self.output_queue,
            plugin = toml_string(&self.plugin.to_string_lossy()),
            consumer = self.consumer,
        )
    }
}

/// `text` as a TOML string, quoted and escaped.
fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}
