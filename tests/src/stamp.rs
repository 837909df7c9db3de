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

use std::path::PathBuf;

use crate::host::plugin_path;

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
