//! Helpers of the plugin-state tests (tests/tests/state.rs): a queue, a
//! state namespace and an output queue of their own, the host config around
//! them on the embedded store or the shared Redis, AceMQ messages with an
//! envelope id a test may publish twice, and reads of the store.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Result, bail};
use lapin::BasicProperties;
use lapin::types::FieldTable;

use acemq_host::config::state::{RedisLocation, StoreLocation};
use acemq_host::envelope::Envelope;
use acemq_host::state::Backend;
use acemq_host::state::embedded::Opener;

use crate::host::{free_port, plugin_path};
use crate::redis::shared_redis;
use crate::{shared_broker, unique_name};

/// The routing key of the `tally` plugin's output.
pub const TALLY_ROUTING_KEY: &str = "tally";

/// The real clock, epoch ms.
pub fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("the clock is after 1970")
            .as_millis(),
    )
    .expect("epoch ms fit in u64")
}

/// Which store a scenario's hosts use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// A redb file in the scenario's own temporary folder.
    Embedded,
    /// The test binary's shared Redis ([`shared_redis`]).
    Redis,
}

/// One test's names and files: its input queue (with `.dlq` and `.parked`),
/// its namespace, an output exchange bound to an output queue with
/// [`TALLY_ROUTING_KEY`], and a folder for the embedded store's file.
pub struct Scenario {
    pub queue: String,
    pub namespace: String,
    pub out_exchange: String,
    pub out_queue: String,
    pub store: StoreKind,
    dir: tempfile::TempDir,
}

/// One `[[consumers]]` entry of a [`Scenario`]'s config, and what goes
/// around it.
#[derive(Debug, Clone)]
pub struct Consumer {
    plugin: String,
    state: bool,
    lines: Vec<String>,
    config: Vec<(String, String)>,
    tables: Vec<String>,
    host_lines: Vec<String>,
}

impl Consumer {
    /// `plugin` (a name under target/plugins) with `state = NS`.
    pub fn new(plugin: &str) -> Self {
        Self {
            plugin: plugin.to_string(),
            state: true,
            lines: Vec::new(),
            config: Vec::new(),
            tables: Vec::new(),
            host_lines: Vec::new(),
        }
    }

    /// The `tally` plugin with `state = NS`.
    pub fn tally() -> Self {
        Self::new("tally")
    }

    /// Without `state =` (and no `[state]` table).
    pub fn without_state(mut self) -> Self {
        self.state = false;
        self
    }

    /// A line of the consumer's entry, such as `idempotent = true`.
    pub fn line(mut self, line: impl Into<String>) -> Self {
        self.lines.push(line.into());
        self
    }

    /// A key of its `[consumers.config]`.
    pub fn config(mut self, key: &str, value: impl Into<String>) -> Self {
        self.config.push((key.to_string(), value.into()));
        self
    }

    /// A whole table of the config file, such as `[retry.p]` and its keys
    /// (it is named `p`: [`Consumer::retry`]).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.tables.push(table.into());
        self
    }

    /// `[retry.p]` with `body`, and `retry = "p"`.
    pub fn retry(self, body: &str) -> Self {
        self.table(format!("[retry.p]\n{body}"))
            .line("retry = \"p\"")
    }

    /// A line of `[host]`.
    pub fn host_line(mut self, line: impl Into<String>) -> Self {
        self.host_lines.push(line.into());
        self
    }
}

impl Scenario {
    pub fn new(prefix: &str, store: StoreKind) -> Self {
        Self {
            queue: unique_name(prefix),
            namespace: unique_name(prefix),
            out_exchange: unique_name(&format!("{prefix}.out")),
            out_queue: unique_name(&format!("{prefix}.out")),
            store,
            dir: tempfile::tempdir().expect("a temporary folder"),
        }
    }

    pub fn dlq(&self) -> String {
        format!("{}.dlq", self.queue)
    }

    pub fn parked(&self) -> String {
        format!("{}.parked", self.queue)
    }

    /// The scenario's own folder (the embedded store's file is in it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The embedded store's file.
    pub fn store_file(&self) -> PathBuf {
        self.dir.path().join("state.redb")
    }

    /// Where the store is, as the host resolves `[state]`.
    pub fn location(&self) -> StoreLocation {
        match self.store {
            StoreKind::Embedded => StoreLocation::Embedded(self.store_file()),
            StoreKind::Redis => StoreLocation::Redis(RedisLocation::plain(shared_redis().url())),
        }
    }

    /// A host config with `consumer` on the scenario's queue (naming its
    /// namespace unless [`Consumer::without_state`]), the output exchange
    /// and queue declared and bound, and `publish_to` the output exchange.
    pub fn config(&self, consumer: &Consumer) -> String {
        self.config_with(consumer, None)
    }

    /// [`Scenario::config`] with the admin endpoint on `admin`.
    pub fn config_with(&self, consumer: &Consumer, admin: Option<&str>) -> String {
        let mut host_lines = consumer.host_lines.clone();
        if let Some(admin) = admin {
            host_lines.push(format!("admin_listen = \"{admin}\""));
        }
        let host = if host_lines.is_empty() {
            String::new()
        } else {
            format!("[host]\n{}\n", host_lines.join("\n"))
        };
        let state = match (consumer.state, self.location()) {
            (false, _) => String::new(),
            (true, StoreLocation::Embedded(path)) => {
                format!(
                    "[state]\npath = {}\n",
                    toml_string(&path.display().to_string())
                )
            }
            (true, StoreLocation::Redis(redis)) => {
                format!("[state]\nurl = {}\n", toml_string(&redis.url))
            }
        };
        let state_key = if consumer.state {
            format!("state = \"{}\"\n", self.namespace)
        } else {
            String::new()
        };
        let plugin_config: String = consumer
            .config
            .iter()
            .map(|(k, v)| format!("{k} = {}\n", toml_string(v)))
            .collect();
        format!(
            r#"
[broker]
url = "{url}"

{host}
{state}
[[queues]]
name = "{queue}"
dead_letter = true

[[exchanges]]
name = "{out_exchange}"
kind = "direct"

[[queues]]
name = "{out_queue}"

[[bindings]]
queue = "{out_queue}"
exchange = "{out_exchange}"
routing_key = "{TALLY_ROUTING_KEY}"

{tables}

[[consumers]]
queue = "{queue}"
plugin = {plugin}
{state_key}publish_to = ["{out_exchange}"]
{lines}

[consumers.config]
{plugin_config}"#,
            url = shared_broker().amqp_url(),
            queue = self.queue,
            out_exchange = self.out_exchange,
            out_queue = self.out_queue,
            tables = consumer.tables.join("\n\n"),
            plugin = toml_string(&plugin_path(&consumer.plugin).display().to_string()),
            lines = consumer.lines.join("\n"),
        )
    }

    /// Writes `config` to `name` in the scenario's folder; returns its path.
    pub fn write_config(&self, name: &str, config: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, config).expect("the config is written");
        path
    }

    /// Publishes `body` to the queue as an AceMQ message with `envelope`
    /// (its id as `x-acemq-id` and the message-id): publishing one envelope
    /// twice delivers the same input twice.
    pub async fn send_envelope(&self, envelope: &Envelope, body: &[u8]) {
        let properties = BasicProperties::default()
            .with_content_type("text/plain".into())
            .with_delivery_mode(2)
            .with_message_id(envelope.id.as_str().into())
            .with_headers(envelope.to_headers(&FieldTable::default()));
        shared_broker()
            .publish("", &self.queue, body, properties)
            .await
            .expect("the broker confirms the input");
    }

    /// Publishes `body` as a new AceMQ message; returns its envelope.
    pub async fn send(&self, body: &[u8]) -> Envelope {
        let envelope = new_envelope();
        self.send_envelope(&envelope, body).await;
        envelope
    }

    /// The value of `key` in the namespace, read from the store (for the
    /// embedded store, with the host stopped or beside it, as `acemq-host
    /// state get` does).
    pub async fn get(&self, key: &str) -> Option<Vec<u8>> {
        let store = acemq_host::state::open(&self.location(), Opener::Tool)
            .unwrap_or_else(|e| panic!("the store opens: {e}"));
        store
            .get(&self.namespace, key.as_bytes(), now_ms())
            .await
            .unwrap_or_else(|e| panic!("the store answers: {e}"))
            .map(|entry| entry.value)
    }

    /// [`Scenario::get`] as text.
    pub async fn get_text(&self, key: &str) -> Option<String> {
        self.get(key)
            .await
            .map(|v| String::from_utf8(v).expect("the value is text"))
    }
}

/// A new AceMQ envelope of type `state.test`.
pub fn new_envelope() -> Envelope {
    Envelope::new("state.test", "acemq@test", now_ms())
}

/// `text` as a TOML basic string.
pub fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

/// A loopback address on a free port, for `admin_listen`.
pub fn free_admin_address() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// `GET http://{admin}/metrics`: the exposition text.
pub fn scrape(admin: &str) -> Result<String> {
    let (status, body) = crate::host::http_get(&format!("http://{admin}/metrics"))?;
    if status != 200 {
        bail!("GET /metrics answered {status}: {body}");
    }
    Ok(body)
}

/// Polls `done` every 50 ms until it holds; fails naming `what` after
/// `timeout`.
pub async fn wait_until(timeout: Duration, what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done().await {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
