//! The host's TOML configuration: its model, how it is read, and the checks
//! that need only the file (references between tables, value ranges).
//!
//! Every error names the file, the line and the key, so an operator can fix
//! a config without guessing. Unknown keys are errors: a misspelt option that
//! is silently ignored is worse than a refusal.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

pub mod admin_keys;
pub mod rollout;
pub mod state;
use crate::broker::address::{BrokerUrl, redact_url};
pub use admin_keys::{ANY_HOST, TOKEN_ENV, check_allowed_host, check_listen, is_remote};

/// Environment variable that overrides `[broker] url`.
pub const URL_ENV: &str = "ACEMQ_URL";

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub broker: BrokerConfig,
    #[serde(default)]
    pub host: HostConfig,
    #[serde(default)]
    pub topology: TopologyConfig,
    #[serde(default)]
    pub exchanges: Vec<ExchangeConfig>,
    #[serde(default)]
    pub queues: Vec<QueueConfig>,
    #[serde(default)]
    pub bindings: Vec<BindingConfig>,
    /// Named retry policies, referred to by queues and consumers.
    #[serde(default)]
    pub retry: BTreeMap<String, RetryConfig>,
    #[serde(default)]
    pub consumers: Vec<ConsumerConfig>,
    #[serde(default)]
    pub codecs: Vec<CodecConfig>,
    #[serde(default)]
    pub tracing: TracingConfig,
    #[serde(default)]
    pub scheduler: SchedulerConfig,
    #[serde(default)]
    pub state: state::StateConfig,
}

/// `[scheduler]`: the AceMQ scheduler (delayed publishing), which the host
/// declares and whose control consumer it runs. See `crate::scheduler`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    /// Declare the scheduler's topology and run its control consumer. When
    /// unset: on exactly when some consumer has `publish_delayed = true`.
    pub enabled: Option<Spanned<bool>>,
    /// The longest delay a plugin may ask for (`deliver-at-ms` this far
    /// ahead at most).
    #[serde(default = "defaults::max_delay", with = "humantime_serde")]
    pub max_delay: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            enabled: None,
            max_delay: defaults::max_delay(),
        }
    }
}

impl Config {
    /// Whether the host runs the scheduler: as `[scheduler] enabled` says,
    /// else when a consumer may publish delayed.
    pub fn scheduler_enabled(&self) -> bool {
        match &self.scheduler.enabled {
            Some(enabled) => *enabled.get_ref(),
            None => self.consumers.iter().any(|c| c.publish_delayed),
        }
    }
}

/// `[tracing]`: where spans are exported. The propagation of `traceparent`
/// runs without it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// The OTLP collector's base URL (`http://localhost:4318`); spans go to
    /// its `/v1/traces`. Without it, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` when set; otherwise nothing is exported.
    pub otlp_endpoint: Option<String>,
    /// `http/protobuf` (the default) or `http/json`.
    pub otlp_protocol: Option<String>,
}

/// `[broker]`: where to connect.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// AMQP URL; `ACEMQ_URL` wins when set. Holds the password: read it
    /// through [`LoadedConfig::broker_urls`], which shows it masked.
    pub url: Option<Spanned<String>>,
    /// Several addresses (the nodes of a cluster), tried in order at start
    /// and round robin after a loss; instead of `url`.
    #[serde(default)]
    pub urls: Vec<Spanned<String>>,
    /// How long to keep trying to reach the broker at start before giving up.
    #[serde(default = "defaults::connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Name shown for the connections in the broker's management UI, with
    /// `.consume` and `.publish` appended.
    #[serde(default = "defaults::connection_name")]
    pub connection_name: String,
    /// The wait before reconnecting after a lost connection (the contract's
    /// `network_recovery_interval`); it doubles after each failed attempt.
    #[serde(
        default = "defaults::network_recovery_interval",
        with = "humantime_serde"
    )]
    pub network_recovery_interval: Duration,
    /// The longest wait between reconnection attempts.
    #[serde(default = "defaults::recovery_backoff_max", with = "humantime_serde")]
    pub recovery_backoff_max: Duration,
    /// Publishes that may wait for a broker confirm at once.
    #[serde(default = "defaults::max_unconfirmed")]
    pub max_unconfirmed: usize,
    /// How long a confirm, or a place among the unconfirmed, is waited for.
    #[serde(default = "defaults::confirm_timeout", with = "humantime_serde")]
    pub confirm_timeout: Duration,
    /// TLS for `amqps://` addresses (and the stream protocol's listener
    /// behind an `amqps://` address).
    pub tls: Option<TlsConfig>,
    /// The port of the stream protocol's listener (the `rabbitmq_stream`
    /// plugin) on each node, at the AMQP address's host: by default 5552,
    /// or 5551 for `amqps://`.
    pub stream_port: Option<u16>,
}

/// `[broker.tls]`: how `amqps://` addresses are reached. Paths are relative
/// to the config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file of the CA certificates to trust; only these are trusted.
    /// Without it, the built-in Mozilla roots.
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate, for brokers that require one.
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    pub key_file: Option<PathBuf>,
    /// The name the broker's certificate must carry, when it is not the
    /// URL's host.
    pub server_name: Option<String>,
}

// By hand, so that a config printed with `{:?}` never shows the password.
impl fmt::Debug for BrokerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BrokerConfig")
            .field(
                "url",
                &self.url.as_ref().map(|url| redact_url(url.get_ref())),
            )
            .field(
                "urls",
                &self
                    .urls
                    .iter()
                    .map(|url| redact_url(url.get_ref()))
                    .collect::<Vec<_>>(),
            )
            .field("connect_timeout", &self.connect_timeout)
            .field("connection_name", &self.connection_name)
            .field("network_recovery_interval", &self.network_recovery_interval)
            .field("recovery_backoff_max", &self.recovery_backoff_max)
            .field("max_unconfirmed", &self.max_unconfirmed)
            .field("confirm_timeout", &self.confirm_timeout)
            .field("tls", &self.tls)
            .field("stream_port", &self.stream_port)
            .finish()
    }
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            url: None,
            urls: Vec::new(),
            connect_timeout: defaults::connect_timeout(),
            connection_name: defaults::connection_name(),
            network_recovery_interval: defaults::network_recovery_interval(),
            recovery_backoff_max: defaults::recovery_backoff_max(),
            max_unconfirmed: defaults::max_unconfirmed(),
            confirm_timeout: defaults::confirm_timeout(),
            tls: None,
            stream_port: None,
        }
    }
}

/// `[host]`: process-wide behaviour.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// How long running deliveries may take to finish at shutdown.
    #[serde(default = "defaults::drain_timeout", with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Where the admin HTTP endpoint listens (`/health`, `/metrics`,
    /// `/plugins`); off when absent. Loopback only, unless `admin_allow_remote`.
    pub admin_listen: Option<Spanned<String>>,
    /// Lets `admin_listen` be reachable from other machines; then a token is required.
    #[serde(default)]
    pub admin_allow_remote: bool,
    /// File holding the admin endpoint's bearer token, relative to the config
    /// file; `ACEMQ_ADMIN_TOKEN` wins when set.
    pub admin_token_file: Option<Spanned<PathBuf>>,
    /// Host headers (`name:port`) the admin endpoint answers besides its own address.
    #[serde(default)]
    pub admin_allowed_hosts: Vec<Spanned<String>>,
    /// Never accepted (configs get copied, committed and pasted into
    /// tickets); parsed only so that a token written here is refused with a
    /// sentence saying where it goes instead of "unknown field".
    #[serde(default)]
    admin_token: Option<Spanned<toml::Value>>,
    /// `false` compiles every plugin at every start; cached by default.
    pub plugin_cache: Option<Spanned<bool>>,
    /// Where compiled plugins are cached; the user's cache folder
    /// (`~/.cache/acemq-host/plugins`) when absent.
    pub plugin_cache_dir: Option<PathBuf>,
    /// The key that authenticates cache entries (created when missing);
    /// `<cache folder>.key`, beside the folder, when absent.
    pub plugin_cache_key_file: Option<Spanned<PathBuf>>,
    /// Where each consumer's rollout record is kept (a restart resumes or
    /// abandons a rollout from it); the user's cache folder
    /// (`~/.cache/acemq-host/rollouts`) when absent.
    pub rollout_state_dir: Option<PathBuf>,
    /// Count the fuel (roughly, instructions) every handler call burns and
    /// report it as `acemq_plugin_fuel_total`. Costs some speed.
    #[serde(default)]
    pub fuel_metering: bool,
    /// `text` or `json`; `--log-format` and `ACEMQ_LOG_FORMAT` win.
    pub log_format: Option<crate::logging::LogFormat>,
    /// The async runtime's workers; one per core when absent (see
    /// `crate::runtime`). At least 1.
    pub worker_threads: Option<Spanned<usize>>,
}

impl HostConfig {
    /// Whether compiled plugins are cached (`plugin_cache`, on by default).
    pub fn caches_plugins(&self) -> bool {
        self.plugin_cache.as_ref().is_none_or(|on| *on.get_ref())
    }

    /// `worker_threads`, when set (and valid: the config's check refuses 0).
    pub fn worker_threads(&self) -> Option<std::num::NonZeroUsize> {
        self.worker_threads
            .as_ref()
            .and_then(|n| std::num::NonZeroUsize::new(*n.get_ref()))
    }
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            drain_timeout: defaults::drain_timeout(),
            admin_listen: None,
            admin_allow_remote: false,
            admin_token_file: None,
            admin_allowed_hosts: Vec::new(),
            admin_token: None,
            plugin_cache: None,
            plugin_cache_dir: None,
            plugin_cache_key_file: None,
            rollout_state_dir: None,
            fuel_metering: false,
            log_format: None,
            worker_threads: None,
        }
    }
}

/// `[topology]`: settings for the whole topology.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyConfig {
    /// Dead-letter exchange used by `dead_letter = true` queues (default `acemq.dlx`).
    /// The retry exchange cannot be renamed: every AceMQ library hard-codes `acemq.retry`.
    pub dead_letter_exchange: Option<String>,
}

/// `[[exchanges]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExchangeConfig {
    #[serde(default)]
    pub name: String,
    /// direct, topic, fanout or headers; required.
    pub kind: Option<String>,
    #[serde(default = "defaults::yes")]
    pub durable: bool,
    #[serde(default)]
    pub auto_delete: bool,
    #[serde(default)]
    pub arguments: toml::Table,
}

/// `[[queues]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    #[serde(default)]
    pub name: String,
    #[serde(default = "defaults::yes")]
    pub durable: bool,
    /// quorum, classic or stream; when absent, durable queues are quorum.
    #[serde(rename = "type")]
    pub queue_type: Option<String>,
    /// Declare `{name}.dlq`, `{name}.parked` and route broker dead letters there.
    #[serde(default)]
    pub dead_letter: bool,
    /// Name of a `[retry.NAME]` policy whose broker rungs are declared for this queue.
    pub retry: Option<Spanned<String>>,
    #[serde(default)]
    pub exclusive: bool,
    #[serde(default)]
    pub auto_delete: bool,
    #[serde(default)]
    pub arguments: toml::Table,
    /// Streams: retention by age (`x-max-age`).
    #[serde(default, with = "humantime_serde")]
    pub max_age: Option<Duration>,
    /// Streams: retention by size (`x-max-length-bytes`).
    pub max_length_bytes: Option<u64>,
    /// Streams: segment size (`x-stream-max-segment-size-bytes`), only sent when set.
    pub max_segment_size_bytes: Option<u64>,
    /// Quorum queues and streams on a cluster: how many nodes get a replica
    /// when the queue is created (`x-quorum-initial-group-size`, or
    /// `x-initial-cluster-size` for a stream), only sent when set. Unset,
    /// the broker puts one on every node, as every AceMQ library leaves it.
    pub replicas: Option<u32>,
}

/// `[[bindings]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingConfig {
    pub queue: String,
    pub exchange: String,
    #[serde(default)]
    pub routing_key: String,
    #[serde(default)]
    pub arguments: toml::Table,
}

/// `[retry.NAME]`: one retry policy (AceMQ contract §3).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// none, fixed or exponential.
    pub kind: String,
    /// Total deliveries including the first; 1 means no retry.
    pub attempts: Option<u32>,
    /// First delay (fixed: every delay).
    #[serde(default, with = "humantime_serde")]
    pub initial: Option<Duration>,
    /// Cap of exponential delays.
    #[serde(default, with = "humantime_serde")]
    pub max: Option<Duration>,
    /// Jitter factor in [0, 1] for waits held in the consumer.
    pub jitter: Option<f64>,
    /// Give up once a message is this old (no limit when absent).
    #[serde(default, with = "humantime_serde")]
    pub give_up_after: Option<Duration>,
    /// Delays at or above this wait on a broker rung queue (default 30s; 0 = never).
    #[serde(default, with = "humantime_serde")]
    pub wait_in_broker_from: Option<Duration>,
}

/// How a stream consumer reads its stream (`[[consumers]] stream_protocol`,
/// `replay --stream-protocol`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum StreamProtocol {
    /// The stream protocol when the broker offers it (its listener answers
    /// when the host starts), AMQP 0-9-1 otherwise; the choice is logged.
    #[default]
    Auto,
    /// The stream protocol only: the host does not start without a usable
    /// stream listener configuration, and waits for the listener as for
    /// the broker.
    Stream,
    /// AMQP 0-9-1 (`x-stream-offset`), as the AceMQ libraries read streams.
    Amqp,
}

impl StreamProtocol {
    pub fn word(self) -> &'static str {
        match self {
            StreamProtocol::Auto => "auto",
            StreamProtocol::Stream => "stream",
            StreamProtocol::Amqp => "amqp",
        }
    }
}

/// How a consumer gets plugin instances.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Isolation {
    /// Reuse warm instances from a pool (default).
    #[default]
    Pooled,
    /// A fresh instance for every message.
    PerMessage,
}

/// `[[consumers]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerConfig {
    pub queue: Spanned<String>,
    /// Path of the handler component (`.wasm`), relative to the config file.
    pub plugin: Spanned<PathBuf>,
    /// Name of a `[retry.NAME]` policy; none means failures are dead-lettered.
    pub retry: Option<Spanned<String>>,
    /// Unacknowledged deliveries the broker sends ahead; see
    /// [`ConsumerConfig::prefetch_for`] for the default.
    pub prefetch: Option<u16>,
    /// Handler calls in progress at once; see
    /// [`ConsumerConfig::concurrency_for`] for the default.
    pub concurrency: Option<usize>,
    /// Where a stream consumer starts: `"first"`, `"last"`, `"next"` (the
    /// default), an offset number, an RFC 3339 time, or an interval back
    /// from now (`"1h"`).
    pub offset: Option<Spanned<OffsetSetting>>,
    /// Whether the consumer declares what it sets aside to (`.dlq`,
    /// `.parked`, `acemq.dlx`, retry rungs). False for a login without
    /// configure permission: they must exist already.
    #[serde(default = "defaults::yes")]
    pub declare: bool,
    /// A stable name for a stream consumer: its consumer tag, and what its
    /// checkpoint is kept under.
    pub consumer_name: Option<String>,
    /// Where a stream consumer keeps its position across restarts:
    /// `"none"` (the default) or `"file:PATH"` (relative to this file).
    pub checkpoint: Option<Spanned<String>>,
    /// Save the checkpoint after this many acks...
    #[serde(default = "defaults::checkpoint_every")]
    pub checkpoint_every: u64,
    /// ...or once this long has passed since the last save.
    #[serde(default = "defaults::checkpoint_interval", with = "humantime_serde")]
    pub checkpoint_interval: Duration,
    /// How a stream consumer reads: `"auto"` (the default), `"stream"` or
    /// `"amqp"`; see [`StreamProtocol`].
    #[serde(default)]
    pub stream_protocol: StreamProtocol,
    /// Exchanges the plugin may publish to.
    #[serde(default)]
    pub publish_to: Vec<String>,
    /// Whether the plugin may publish for later (`deliver-at-ms`), through
    /// the scheduler; turns the scheduler on unless `[scheduler] enabled`
    /// says otherwise (which is then refused).
    #[serde(default)]
    pub publish_delayed: bool,
    #[serde(default)]
    pub isolation: Isolation,
    /// Wall-clock limit of one handler call.
    #[serde(default = "defaults::deadline", with = "humantime_serde")]
    pub deadline: Duration,
    /// Linear-memory cap of one plugin instance, in bytes.
    #[serde(default = "defaults::max_memory_bytes")]
    pub max_memory_bytes: u64,
    /// Largest body a delivery may have; a bigger one is parked before any
    /// plugin runs.
    #[serde(default = "defaults::max_body_bytes")]
    pub max_body_bytes: usize,
    /// Most outputs one handler call may publish; see
    /// [`ConsumerConfig::max_outputs`] for the default. At most
    /// `[broker] max_unconfirmed`: a call's outputs take their places among
    /// the unconfirmed publishes in one step.
    #[serde(rename = "max_outputs")]
    pub max_outputs_setting: Option<Spanned<usize>>,
    /// Whether a plugin output must reach a queue when the plugin does not
    /// say (`publish(..).mandatory(b)` in the guest SDK). True: an
    /// unroutable output fails the input, which is retried or set aside, as
    /// Java and .NET publish by default. Set false for events that may have
    /// no subscriber yet (Python's and Ruby's default): the broker drops
    /// them and the input is acked.
    #[serde(default = "defaults::yes")]
    pub mandatory_outputs: bool,
    /// The state namespace its plugin reads and writes (docs/state.md);
    /// consumers that name the same one share it.
    pub state: Option<Spanned<String>>,
    /// Claims each input's envelope id before its call and skips those
    /// already done: the AceMQ idempotency rule, for any plugin.
    #[serde(default)]
    pub idempotent: bool,
    /// How long a done record is kept (consumers with `state` or
    /// `idempotent`).
    #[serde(default = "state::default_done_retention", with = "humantime_serde")]
    pub done_retention: Duration,
    /// How long a claim holds an input against other hosts (`idempotent`).
    #[serde(default = "state::default_claim_lease", with = "humantime_serde")]
    pub claim_lease: Duration,
    /// Handed to the plugin through `config(key)`.
    #[serde(default)]
    pub config: BTreeMap<String, String>,
    /// A new version rolled out beside the plugin (canary or shadow).
    pub candidate: Option<rollout::CandidateConfig>,
}

/// A stream offset as written in the config: a number, or a word, a time or
/// an interval.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OffsetSetting {
    Number(i64),
    Text(String),
}

impl OffsetSetting {
    pub fn parse(&self) -> Result<crate::broker::stream::StreamOffset, String> {
        use crate::broker::stream::StreamOffset;
        match self {
            OffsetSetting::Number(n) => u64::try_from(*n)
                .map(StreamOffset::At)
                .map_err(|_| format!("the offset {n} is negative")),
            OffsetSetting::Text(text) => StreamOffset::parse(text),
        }
    }
}

impl ConsumerConfig {
    /// Most outputs one handler call may publish: as configured, else 1000.
    pub fn max_outputs(&self) -> usize {
        self.max_outputs_setting
            .as_ref()
            .map_or(defaults::max_outputs(), |m| *m.get_ref())
    }

    /// The prefetch: as configured, else the contract's defaults: 10 for a
    /// stream (Python's and Go's), 20 for a queue.
    pub fn prefetch_for(&self, stream: bool) -> u16 {
        self.prefetch
            .unwrap_or(if stream { 10 } else { defaults::prefetch() })
    }

    /// The concurrency: as configured, else one call per core for a queue
    /// and one call at a time for a stream. A stream is an ordered log read
    /// by projections that expect its order, and its position is the lowest
    /// offset not acked: deliveries finishing out of order would leave
    /// acked ones above it, read again after a crash beyond the
    /// `checkpoint_every` + 2 × `prefetch` `docs/streams.md` promises.
    pub fn concurrency_for(&self, stream: bool) -> usize {
        self.concurrency
            .unwrap_or(if stream { 1 } else { defaults::concurrency() })
    }
}

/// `[[codecs]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodecConfig {
    pub plugin: Spanned<PathBuf>,
    /// Content types this codec decodes on consume and encodes on publish.
    pub content_types: Vec<String>,
}

pub(crate) mod defaults {
    use std::time::Duration;

    pub fn yes() -> bool {
        true
    }
    pub fn connect_timeout() -> Duration {
        Duration::from_secs(30)
    }
    pub fn connection_name() -> String {
        "acemq-host".to_string()
    }
    pub fn checkpoint_every() -> u64 {
        1000
    }
    pub fn checkpoint_interval() -> Duration {
        Duration::from_secs(5)
    }
    pub fn network_recovery_interval() -> Duration {
        // The contract's default (bunny's network_recovery_interval).
        Duration::from_secs(5)
    }
    pub fn recovery_backoff_max() -> Duration {
        Duration::from_secs(30)
    }
    pub fn max_unconfirmed() -> usize {
        // The contract's bound on outstanding publishes per connection.
        1000
    }
    pub fn max_outputs() -> usize {
        1000
    }
    pub fn confirm_timeout() -> Duration {
        // The contract's wait for a publish permit.
        Duration::from_secs(10)
    }
    pub fn drain_timeout() -> Duration {
        // The contract's DrainTimeout (Go, Java, .NET and Ruby agree on 20 s).
        Duration::from_secs(20)
    }
    pub fn prefetch() -> u16 {
        // The contract's default prefetch (Python and Go).
        20
    }
    /// One handler call per core: calls are futures on the runtime, which
    /// has one worker per core, so more calls at once than cores only
    /// queue, and fewer leave cores idle when a handler is CPU-heavy. (The
    /// AceMQ libraries default to 1; concurrency is the host's own, invisible
    /// on the wire.)
    pub fn concurrency() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
    pub fn deadline() -> Duration {
        Duration::from_secs(2)
    }
    pub fn max_memory_bytes() -> u64 {
        64 << 20
    }
    pub fn max_delay() -> Duration {
        // A month: far beyond "remind me tomorrow", short enough that a
        // due time a producer got wrong by years is refused, not kept.
        Duration::from_secs(30 * 24 * 3600)
    }
    pub fn max_body_bytes() -> usize {
        // Generous: far above any message a handler is meant for, yet a
        // body of this size is copied into a plugin's memory at most once.
        16 << 20
    }
}

/// A config that could not be used: where, and what was wrong.
#[derive(Debug, thiserror::Error)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based line, when the problem has a place in the file.
    pub line: Option<usize>,
    pub message: String,
}

impl ConfigError {
    /// Every error of `found`, first to last, as one: the first's place,
    /// and each further one on a line of its own with its own place.
    pub fn all(found: Vec<ConfigError>) -> Result<(), ConfigError> {
        let mut found = found.into_iter();
        let Some(mut first) = found.next() else {
            return Ok(());
        };
        for more in found {
            first.message.push_str(&format!("\n{more}"));
        }
        Err(first)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file.display(), line, self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

/// A loaded config with where it came from, so later checks can point at lines.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub path: PathBuf,
    pub text: String,
    pub config: Config,
}

impl LoadedConfig {
    /// Reads, parses and checks a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_path_buf(),
            line: None,
            message: format!("cannot read the config file: {e}"),
        })?;
        let loaded = Self::parse(path, text)?;
        // The URL is checked here, before anything connects, so a bad one
        // is a config error (exit 2) rather than a connection that fails
        // over and over.
        loaded.configured_broker_urls(url_from_env())?;
        Ok(loaded)
    }

    /// Parses and checks config text; `path` is used for messages and to
    /// resolve plugin paths.
    pub fn parse(path: &Path, text: String) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(&text).map_err(|e| ConfigError {
            file: path.to_path_buf(),
            line: e.span().map(|s| line_of(&text, s.start)),
            message: e.message().trim_end().to_string(),
        })?;
        let loaded = Self {
            path: path.to_path_buf(),
            text,
            config,
        };
        loaded.check()?;
        Ok(loaded)
    }

    /// An error pointing at the byte offset `at` of the file.
    pub fn error_at(&self, at: Option<usize>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.path.clone(),
            line: at.map(|offset| line_of(&self.text, offset)),
            message: message.into(),
        }
    }

    /// The 1-based line where `entry` starts in the file, when it is there.
    pub fn line_of_entry(&self, entry: &Entry) -> Option<usize> {
        use toml::de::{DeTable, DeValue};
        let document = DeTable::parse(&self.text).ok()?;
        fn child<'i>(table: &DeTable<'i>, key: &str) -> Option<toml::Spanned<DeValue<'i>>> {
            table
                .iter()
                .find(|(name, _)| name.get_ref().as_ref() == key)
                .map(|(_, value)| value.clone())
        }
        let found = match entry {
            Entry::Item { table, index } => match child(document.get_ref(), table)?.into_inner() {
                DeValue::Array(items) => items.get(*index)?.span(),
                _ => return None,
            },
            Entry::Table(path) => {
                let mut parts = path.split('.');
                let mut value = child(document.get_ref(), parts.next()?)?;
                for part in parts {
                    let DeValue::Table(table) = value.get_ref() else {
                        return None;
                    };
                    value = child(table, part)?;
                }
                value.span()
            }
        };
        Some(line_of(&self.text, found.start))
    }

    /// A path from the config, resolved against the config file's folder.
    pub fn resolve(&self, relative: &Path) -> PathBuf {
        if relative.is_absolute() {
            return relative.to_path_buf();
        }
        match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.join(relative),
            _ => relative.to_path_buf(),
        }
    }

    /// The TLS settings of `[broker.tls]`, paths resolved; `None` without
    /// the table.
    pub fn tls_settings(&self) -> Option<crate::broker::TlsSettings> {
        let tls = self.config.broker.tls.as_ref()?;
        Some(crate::broker::TlsSettings {
            ca_file: tls.ca_file.as_ref().map(|p| self.resolve(p)),
            cert_file: tls.cert_file.as_ref().map(|p| self.resolve(p)),
            key_file: tls.key_file.as_ref().map(|p| self.resolve(p)),
            server_name: tls.server_name.clone(),
        })
    }

    /// The broker addresses: `ACEMQ_URL` (several separated by commas),
    /// else `[broker] urls`, else `[broker] url`.
    pub fn broker_urls(&self) -> Result<Vec<BrokerUrl>, ConfigError> {
        let urls = self.configured_broker_urls(url_from_env())?;
        if urls.is_empty() {
            return Err(self.error_at(
                None,
                format!("broker.url: no broker URL; set [broker] url (or urls) or the {URL_ENV} environment variable"),
            ));
        }
        Ok(urls)
    }

    /// The broker URLs from `env` (the value of `ACEMQ_URL`), else from
    /// `[broker] urls` or `url`; empty when none is set. An invalid URL is
    /// an error naming where it came from, never its text.
    fn configured_broker_urls(&self, env: Option<String>) -> Result<Vec<BrokerUrl>, ConfigError> {
        let broker = &self.config.broker;
        let written: Vec<(String, String, Option<usize>)> = match env {
            Some(text) => {
                let parts: Vec<&str> = text
                    .split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .collect();
                let several = parts.len() > 1;
                parts
                    .into_iter()
                    .enumerate()
                    .map(|(i, t)| {
                        let key = if several {
                            format!("{URL_ENV} (address {})", i + 1)
                        } else {
                            URL_ENV.to_string()
                        };
                        (t.to_string(), key, None)
                    })
                    .collect()
            }
            None => {
                if let (Some(url), false) = (&broker.url, broker.urls.is_empty()) {
                    return Err(self.error_at(
                        Some(url.span().start),
                        "broker.url: set either url or urls, not both",
                    ));
                }
                let list = broker.urls.iter().enumerate().map(|(i, url)| {
                    (
                        url.get_ref().clone(),
                        format!("broker.urls[{i}]"),
                        Some(url.span().start),
                    )
                });
                let single = broker.url.iter().map(|url| {
                    (
                        url.get_ref().clone(),
                        "broker.url".to_string(),
                        Some(url.span().start),
                    )
                });
                list.chain(single).collect()
            }
        };
        written
            .into_iter()
            .map(|(text, key, at)| {
                BrokerUrl::parse(&text).map_err(|e| {
                    self.error_at(
                        at,
                        format!("{key}: the broker URL is invalid: {e} (the URL is not shown, as it may hold a password)"),
                    )
                })
            })
            .collect()
    }

    /// Checks that only need the file: references between tables and value ranges.
    fn check(&self) -> Result<(), ConfigError> {
        let mut found = self.state_problems();
        if let Err(e) = self.check_admin() {
            found.push(e);
        }
        let c = &self.config;
        if let Some(off) = c.host.plugin_cache.as_ref().filter(|on| !*on.get_ref()) {
            if c.host.plugin_cache_dir.is_some() {
                found.push(self.error_at(
                    Some(off.span().start),
                    "host.plugin_cache: false turns the compiled-plugin cache off, but \
                     plugin_cache_dir names a folder for it: remove one of the two",
                ));
            }
            if c.host.plugin_cache_key_file.is_some() {
                found.push(self.error_at(
                    Some(off.span().start),
                    "host.plugin_cache: false turns the compiled-plugin cache off, but \
                     plugin_cache_key_file names a key to protect it: remove one of the two",
                ));
            }
        }
        if let Some(zero) = c.host.worker_threads.as_ref().filter(|n| *n.get_ref() == 0) {
            found.push(self.error_at(
                Some(zero.span().start),
                "host.worker_threads: must be at least 1: no delivery could be handled without a worker",
            ));
        }
        if c.broker.max_unconfirmed == 0 {
            found.push(self.error_at(
                None,
                "broker.max_unconfirmed: must be at least 1: no output, retry or set-aside could be published",
            ));
        }
        for (i, consumer) in c.consumers.iter().enumerate() {
            if let Some(problem) = self.outputs_beyond_unconfirmed(i, consumer) {
                found.push(problem);
            }
            if let Some(name) = &consumer.retry
                && !c.retry.contains_key(name.get_ref())
            {
                found.push(self.error_at(
                    Some(name.span().start),
                    format!(
                        "consumers[{i}].retry: no retry policy named '{}' (define [retry.{}])",
                        name.get_ref(),
                        name.get_ref()
                    ),
                ));
            }
            if consumer.prefetch == Some(0) {
                found.push(self.error_at(
                    Some(consumer.queue.span().start),
                    format!("consumers[{i}].prefetch: must be at least 1: RabbitMQ sends nothing to a consumer without one, and refuses to let a stream consumer start with none"),
                ));
            }
            if let Some(offset) = &consumer.offset
                && let Err(e) = offset.get_ref().parse()
            {
                found.push(self.error_at(
                    Some(offset.span().start),
                    format!("consumers[{i}].offset: {e}"),
                ));
            }
            if consumer.concurrency == Some(0) {
                found.push(self.error_at(
                    Some(consumer.queue.span().start),
                    format!("consumers[{i}].concurrency: must be at least 1"),
                ));
            }
            if let Err(e) = self.rollout_plan(i, consumer) {
                found.push(e);
            }
            if consumer.queue.get_ref().trim().is_empty() {
                found.push(self.error_at(
                    Some(consumer.queue.span().start),
                    format!("consumers[{i}].queue: must name a queue"),
                ));
            }
        }
        found.extend(self.shared_consumer_names());
        found.extend(self.delayed_without_scheduler());
        for (i, queue) in c.queues.iter().enumerate() {
            if let Some(name) = &queue.retry
                && !c.retry.contains_key(name.get_ref())
            {
                found.push(self.error_at(
                    Some(name.span().start),
                    format!(
                        "queues[{i}].retry: no retry policy named '{}' (define [retry.{}])",
                        name.get_ref(),
                        name.get_ref()
                    ),
                ));
            }
        }
        ConfigError::all(found)
    }

    /// Consumers that share a `consumer_name`: one stream consumer under
    /// two entries would read the whole stream twice and each overwrite the
    /// other's checkpoint. Each later entry is named with the first one.
    fn shared_consumer_names(&self) -> Vec<ConfigError> {
        let mut first_of: BTreeMap<&str, usize> = BTreeMap::new();
        let mut found = Vec::new();
        let line = |index| {
            self.line_of_entry(&Entry::Item {
                table: "consumers",
                index,
            })
        };
        for (i, consumer) in self.config.consumers.iter().enumerate() {
            let Some(name) = consumer.consumer_name.as_deref() else {
                continue;
            };
            let Some(&first) = first_of.get(name) else {
                first_of.insert(name, i);
                continue;
            };
            let first_line = line(first).map_or(String::new(), |l| format!(" (line {l})"));
            found.push(ConfigError {
                file: self.path.clone(),
                line: line(i),
                message: format!(
                    "consumers[{i}].consumer_name: '{name}' is already the name of consumers[{first}]{first_line}; two consumers of one name would each read the whole stream and overwrite each other's checkpoint: give each its own consumer_name"
                ),
            });
        }
        found
    }

    /// `[scheduler]` against the consumers: a `max_delay` of 0, and consumers
    /// that may publish delayed while `enabled = false` (their delayed
    /// outputs would wait in rungs nobody here declared).
    fn delayed_without_scheduler(&self) -> Vec<ConfigError> {
        let c = &self.config;
        let mut found = Vec::new();
        if c.scheduler.max_delay.is_zero() {
            found.push(self.error_at(
                None,
                "scheduler.max_delay: must be more than 0: no delayed publish could be accepted",
            ));
        }
        let Some(enabled) = c.scheduler.enabled.as_ref().filter(|e| !*e.get_ref()) else {
            return found;
        };
        for (i, consumer) in c.consumers.iter().enumerate() {
            if consumer.publish_delayed {
                found.push(self.error_at(
                    Some(enabled.span().start),
                    format!(
                        "consumers[{i}].publish_delayed: the consumer of '{}' may publish delayed, but [scheduler] enabled = false: \
                         its delayed messages go through the scheduler this host would not declare or run. \
                         Remove enabled = false, or publish_delayed",
                        consumer.queue.get_ref()
                    ),
                ));
            }
        }
        found
    }

    /// A consumer whose calls may publish more outputs than may wait for a
    /// confirm at once: such a batch could never take its places.
    fn outputs_beyond_unconfirmed(
        &self,
        index: usize,
        consumer: &ConsumerConfig,
    ) -> Option<ConfigError> {
        let unconfirmed = self.config.broker.max_unconfirmed;
        let outputs = consumer.max_outputs();
        if unconfirmed == 0 || outputs <= unconfirmed {
            return None;
        }
        let (at, set) = match &consumer.max_outputs_setting {
            Some(setting) => (setting.span().start, ""),
            None => (consumer.queue.span().start, " (the default)"),
        };
        Some(self.error_at(
            Some(at),
            format!(
                "consumers[{index}].max_outputs: {outputs}{set} is more than broker.max_unconfirmed = {unconfirmed}. \
                 A handler call's outputs are published as one batch, which takes its places among the \
                 unconfirmed publishes in one step, so a call with more outputs than that could never be \
                 published. Set max_outputs to at most {unconfirmed}, or raise max_unconfirmed"
            ),
        ))
    }

    /// The admin endpoint's keys; the token itself is read at start (see
    /// `admin::Settings`), as it lives outside the file.
    fn check_admin(&self) -> Result<(), ConfigError> {
        let host = &self.config.host;
        if let Some(inline) = &host.admin_token {
            return Err(self.error_at(
                Some(inline.span().start),
                format!(
                    "host.admin_token: the admin token does not belong in the config \
                     (configs get copied, committed and shared); put it in a file named by \
                     admin_token_file in [host], or in the {} environment variable",
                    TOKEN_ENV
                ),
            ));
        }
        if let Some(listen) = &host.admin_listen {
            check_listen(listen.get_ref(), host.admin_allow_remote).map_err(|reason| {
                self.error_at(
                    Some(listen.span().start),
                    format!("host.admin_listen: {reason}"),
                )
            })?;
        }
        for (i, entry) in host.admin_allowed_hosts.iter().enumerate() {
            check_allowed_host(entry.get_ref()).map_err(|reason| {
                self.error_at(
                    Some(entry.span().start),
                    format!("host.admin_allowed_hosts[{i}]: {reason}"),
                )
            })?;
        }
        Ok(())
    }
}

/// A place in the config file, for messages that give its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// The `index`th (from 0) `[[table]]` entry: `exchanges`, `queues`,
    /// `bindings` or `consumers`.
    Item { table: &'static str, index: usize },
    /// A table by its dotted path (`retry.fast`, `topology`).
    Table(String),
}

/// 1-based line number of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The value of `ACEMQ_URL`, unless it is unset or blank.
fn url_from_env() -> Option<String> {
    std::env::var(URL_ENV)
        .ok()
        .filter(|url| !url.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<LoadedConfig, ConfigError> {
        LoadedConfig::parse(Path::new("host.toml"), text.to_string())
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let err = parse("[broker]\nurl = \"amqp://x\"\nurll = 1\n").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("host.toml:3: "), "{text}");
        assert!(text.contains("unknown field `urll`"), "{text}");
    }

    #[test]
    fn wrong_type_names_line() {
        let err = parse("[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\nprefetch = \"many\"\n")
            .unwrap_err();
        assert_eq!(err.line, Some(4), "{err}");
    }

    #[test]
    fn topology_problems_name_the_line_of_their_entry() {
        let text = "[retry.slow]\nkind = \"sometimes\"\n\n[[exchanges]]\nname = \"good\"\nkind = \"direct\"\n\n[[exchanges]]\nname = \"bad\"\n\n[[bindings]]\nqueue = \"nowhere\"\nexchange = \"good\"\n";
        let loaded = parse(text).unwrap();
        let problems = crate::topology::Topology::from_config(&loaded.config).unwrap_err();
        let shown = problems.located_in(&loaded);
        assert!(
            shown.contains("host.toml:1: ") && shown.contains("sometimes"),
            "{shown}"
        );
        assert!(
            shown.contains("host.toml:8: acemq: exchange 'bad' has no kind"),
            "{shown}"
        );
        assert!(shown.contains("host.toml:11: "), "the binding: {shown}");
    }

    #[test]
    fn two_consumers_of_one_consumer_name_are_refused_naming_both() {
        let consumer = |queue: &str, name: &str| {
            format!(
                "[[consumers]]\nqueue = \"{queue}\"\nplugin = \"p.wasm\"\nconsumer_name = \"{name}\"\n\n"
            )
        };
        let text = [
            consumer("orders.log", "projection"),
            consumer("orders.log", "other"),
            consumer("orders.log", "projection"),
        ]
        .concat();
        let err = parse(&text).unwrap_err();
        assert_eq!(err.line, Some(11), "the second of the two: {err}");
        let shown = err.to_string();
        assert!(
            shown.contains(
                "consumers[2].consumer_name: 'projection' is already the name of consumers[0] (line 1)"
            ),
            "{shown}"
        );
        assert!(parse(&[consumer("a", "one"), consumer("b", "two")].concat()).is_ok());
    }

    #[test]
    fn max_outputs_above_max_unconfirmed_is_refused_naming_both_keys() {
        // The default max_outputs (1000) against a lowered max_unconfirmed.
        let err = parse(
            "[broker]\nmax_unconfirmed = 500\n\n[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\n",
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(
                "host.toml:5: consumers[0].max_outputs: 1000 (the default) is more than broker.max_unconfirmed = 500."
            ),
            "{text}"
        );
        assert!(
            text.contains("Set max_outputs to at most 500, or raise max_unconfirmed"),
            "{text}"
        );
        // Set explicitly: its own line.
        let err = parse(
            "[broker]\nmax_unconfirmed = 500\n\n[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\nmax_outputs = 501\n",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("host.toml:7: consumers[0].max_outputs: 501 is more than broker.max_unconfirmed = 500."),
            "{err}"
        );
        // Equal is enough, and the limit reaches the plugin's limits.
        let loaded = parse(
            "[broker]\nmax_unconfirmed = 500\n\n[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\nmax_outputs = 500\n",
        )
        .unwrap();
        assert_eq!(loaded.config.consumers[0].max_outputs(), 500);
        assert!(
            parse("[broker]\nmax_unconfirmed = 0\n")
                .unwrap_err()
                .to_string()
                .contains("broker.max_unconfirmed: must be at least 1")
        );
    }

    #[test]
    fn worker_threads_are_read_and_zero_is_refused_where_it_is_written() {
        let loaded = parse("[host]\nworker_threads = 3\n").unwrap();
        assert_eq!(
            loaded.config.host.worker_threads().map(|n| n.get()),
            Some(3)
        );
        assert_eq!(parse("").unwrap().config.host.worker_threads(), None);
        let refused = parse("[host]\nworker_threads = 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("host.worker_threads: must be at least 1"),
            "{refused}"
        );
        assert!(refused.contains(":2"), "the line is named: {refused}");
    }

    #[test]
    fn every_problem_of_the_file_is_reported_at_once() {
        let err = parse(
            "[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\nretry = \"fast\"\nprefetch = 0\n\n[[queues]]\nname = \"q\"\nretry = \"slow\"\n",
        )
        .unwrap_err();
        let text = err.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[0].starts_with("host.toml:4: consumers[0].retry"),
            "{text}"
        );
        assert!(
            lines[1].starts_with("host.toml:2: consumers[0].prefetch"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("host.toml:9: queues[0].retry"),
            "{text}"
        );
    }

    #[test]
    fn log_format_and_tracing_are_read_and_a_wrong_format_is_named() {
        let config = parse(
            "[host]\nlog_format = \"json\"\n[tracing]\notlp_endpoint = \"http://collector:4318\"\n",
        )
        .unwrap();
        assert_eq!(
            config.config.host.log_format,
            Some(crate::logging::LogFormat::Json)
        );
        assert_eq!(
            config.config.tracing.otlp_endpoint.as_deref(),
            Some("http://collector:4318")
        );
        let err = parse("[host]\nlog_format = \"xml\"\n").unwrap_err();
        assert_eq!(err.line, Some(2), "{err}");
        assert!(err.message.contains("xml"), "{err}");
    }

    #[test]
    fn malformed_duration_is_refused() {
        let err = parse("[host]\ndrain_timeout = \"soon\"\n").unwrap_err();
        assert_eq!(err.line, Some(2), "{err}");
    }

    #[test]
    fn undefined_retry_policy_points_at_its_line() {
        let err = parse("[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\nretry = \"fast\"\n")
            .unwrap_err();
        assert_eq!(err.line, Some(4));
        assert!(
            err.message.contains("no retry policy named 'fast'"),
            "{err}"
        );
    }

    #[test]
    fn the_scheduler_is_on_when_a_consumer_may_publish_delayed_unless_refused() {
        let consumer =
            "[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\npublish_delayed = true\n";
        let loaded = parse(consumer).unwrap();
        assert!(loaded.config.scheduler_enabled());
        assert_eq!(
            loaded.config.scheduler.max_delay,
            Duration::from_secs(30 * 24 * 3600)
        );
        let plain = "[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\n";
        assert!(!parse(plain).unwrap().config.scheduler_enabled());
        let asked = parse(&format!(
            "[scheduler]\nenabled = true\nmax_delay = \"2h\"\n\n{plain}"
        ))
        .unwrap();
        assert!(asked.config.scheduler_enabled());
        assert_eq!(asked.config.scheduler.max_delay, Duration::from_secs(7200));

        let refused = parse(&format!("[scheduler]\nenabled = false\n\n{consumer}"))
            .unwrap_err()
            .to_string();
        assert!(
            refused.starts_with("host.toml:2: consumers[0].publish_delayed: the consumer of 'q' may publish delayed, but [scheduler] enabled = false"),
            "{refused}"
        );
        let zero = parse(&format!("[scheduler]\nmax_delay = \"0s\"\n\n{consumer}"))
            .unwrap_err()
            .to_string();
        assert!(
            zero.contains("scheduler.max_delay: must be more than 0"),
            "{zero}"
        );
    }

    #[test]
    fn defaults_follow_the_contract() {
        let loaded = parse("[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\n").unwrap();
        let consumer = &loaded.config.consumers[0];
        assert_eq!(consumer.prefetch_for(false), 20);
        assert_eq!(consumer.prefetch_for(true), 10);
        assert_eq!(
            consumer.concurrency_for(false),
            std::thread::available_parallelism().unwrap().get()
        );
        assert_eq!(consumer.concurrency_for(true), 1);
        assert_eq!(loaded.config.host.drain_timeout, Duration::from_secs(20));
    }

    #[test]
    fn plugin_paths_resolve_against_the_config_folder() {
        let loaded = LoadedConfig::parse(
            Path::new("/etc/acemq/host.toml"),
            "[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\n".into(),
        )
        .unwrap();
        assert_eq!(
            loaded.resolve(loaded.config.consumers[0].plugin.get_ref()),
            PathBuf::from("/etc/acemq/p.wasm")
        );
    }

    #[test]
    fn the_environment_url_wins_over_the_file() {
        let loaded = parse("[broker]\nurl = \"amqp://file-host\"\n").unwrap();
        let urls = loaded
            .configured_broker_urls(Some("amqp://u:pw@env-host/".into()))
            .unwrap();
        assert_eq!(urls[0].to_string(), "amqp://u:***@env-host/");
        let urls = loaded.configured_broker_urls(None).unwrap();
        assert_eq!(urls[0].to_string(), "amqp://file-host");
    }

    #[test]
    fn several_addresses_keep_their_order_from_the_file_or_the_environment() {
        let loaded = parse("[broker]\nurls = [\"amqp://a\", \"amqp://b:5673\"]\n").unwrap();
        let shown: Vec<String> = loaded
            .configured_broker_urls(None)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(shown, ["amqp://a", "amqp://b:5673"]);
        let from_env = loaded
            .configured_broker_urls(Some("amqp://x, amqp://y".into()))
            .unwrap();
        assert_eq!(from_env.len(), 2);
        assert_eq!(from_env[1].to_string(), "amqp://y");
        let both = parse("[broker]\nurl = \"amqp://a\"\nurls = [\"amqp://b\"]\n").unwrap();
        let err = both.configured_broker_urls(None).unwrap_err().to_string();
        assert!(err.contains("set either url or urls, not both"), "{err}");
        let bad = parse("[broker]\nurls = [\"amqp://a\", \"http://s3cret@b\"]\n").unwrap();
        let err = bad.configured_broker_urls(None).unwrap_err().to_string();
        assert!(
            err.contains("broker.urls[1]: the broker URL is invalid"),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
    }

    /// The refusal of the URL `loaded` and `env` configure, which must not
    /// repeat the password (every test password holds "s3cret").
    fn url_refusal(loaded: &LoadedConfig, env: Option<&str>) -> String {
        let err = loaded
            .configured_broker_urls(env.map(str::to_string))
            .unwrap_err()
            .to_string();
        assert!(!err.contains("s3cret"), "{err}");
        err
    }

    #[test]
    fn an_invalid_url_in_the_file_names_its_key_and_line_not_its_text() {
        let loaded =
            parse("[broker]\nconnection_name = \"x\"\nurl = \"amqp:guest:s3cret@h\"\n").unwrap();
        let err = url_refusal(&loaded, None);
        let expected = "host.toml:3: broker.url: the broker URL is invalid: there is no '//'";
        assert!(err.starts_with(expected), "{err}");
        assert!(!format!("{:?}", loaded.config.broker).contains("s3cret"));
    }

    #[test]
    fn an_invalid_url_in_the_environment_names_the_variable_not_its_text() {
        let loaded = parse("").unwrap();
        let err = url_refusal(&loaded, Some("amqp://guest:pa/ss-s3cret@127.0.0.1:1/%2f"));
        let expected = "host.toml: ACEMQ_URL: the broker URL is invalid: invalid port number";
        assert!(err.starts_with(expected), "{err}");
    }

    #[test]
    fn no_url_at_all_is_not_an_error_until_one_is_needed() {
        let loaded = parse("").unwrap();
        assert!(loaded.configured_broker_urls(None).unwrap().is_empty());
    }

    #[test]
    fn an_inline_admin_token_is_refused_with_where_it_goes() {
        let err = parse(
            "[host]\nadmin_listen = \"127.0.0.1:9090\"\nadmin_token = \"s3cret-s3cret-s3cret\"\n",
        )
        .unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("host.admin_token:")
                && text.contains("admin_token_file")
                && text.contains("ACEMQ_ADMIN_TOKEN"),
            "{text}"
        );
        assert!(!text.contains("s3cret"), "{text}");
    }

    #[test]
    fn a_remote_admin_address_needs_admin_allow_remote() {
        let err = parse("[host]\n\nadmin_listen = \"0.0.0.0:9090\"\n").unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("host.admin_listen: \"0.0.0.0:9090\"")
                && text.contains("admin_allow_remote = true"),
            "{text}"
        );
        let loaded =
            parse("[host]\nadmin_listen = \"0.0.0.0:9090\"\nadmin_allow_remote = true\n").unwrap();
        assert!(loaded.config.host.admin_allow_remote);
        let loaded = parse("[host]\nadmin_listen = \"localhost:9090\"\n").unwrap();
        assert!(!loaded.config.host.admin_allow_remote);
    }

    #[test]
    fn a_malformed_allowed_host_is_named() {
        let err = parse("[host]\nadmin_allowed_hosts = [\"a:1\",\n  \"http://acemq-1:9090\"]\n")
            .unwrap_err();
        assert_eq!(err.line, Some(3), "{err}");
        assert!(
            err.message.starts_with("host.admin_allowed_hosts[1]: "),
            "{err}"
        );
    }

    #[test]
    fn the_cache_is_on_by_default_and_off_only_without_a_folder_or_key() {
        assert!(parse("").unwrap().config.host.caches_plugins());
        // A key alone protects the user's default cache folder.
        let keyed = parse("[host]\nplugin_cache_key_file = \"k\"\n").unwrap();
        assert!(keyed.config.host.caches_plugins());
        let off = parse("[host]\nplugin_cache = false\n").unwrap();
        assert!(!off.config.host.caches_plugins());
        for (setting, named) in [
            (
                "plugin_cache_dir = \"c\"",
                "plugin_cache_dir names a folder",
            ),
            (
                "plugin_cache_key_file = \"k\"",
                "plugin_cache_key_file names a key",
            ),
        ] {
            let err = parse(&format!("[host]\nplugin_cache = false\n{setting}\n")).unwrap_err();
            assert_eq!(err.line, Some(2), "{err}");
            assert!(err.message.starts_with("host.plugin_cache: false"), "{err}");
            assert!(err.message.contains(named), "{err}");
        }
    }
}
