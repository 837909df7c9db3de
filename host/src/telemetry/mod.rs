//! Metrics with the contract's names and outcome words (AceMQ contract §8),
//! kept in one registry that the admin endpoint renders for Prometheus. A
//! consumer counts into them through handles built once for its queue
//! (`crate::delivery::metrics`).
//!
//! Prometheus names cannot hold dots, so `acemq.consume.total` is exposed as
//! `acemq_consume_total` (the renderer adds `_total` to counters), as every
//! AceMQ library's Prometheus renderer does.
//!
//! [`activity`] keeps what the status page shows beside them: recent rates
//! and set-aside reasons per consumer. [`histogram`] is a fixed-size one for
//! figures kept outside the registry (a replay's, a rollout's windows).

pub mod activity;
pub mod histogram;

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueOutcome {
    pub queue: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueWhere {
    pub queue: String,
    /// consumer, broker or requeued.
    #[prometheus(flatten)]
    pub place: Place,
}

/// `where` is a Rust keyword, so the label is spelt through this wrapper.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Place(pub &'static str);

impl EncodeLabelSet for Place {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelSetEncoder<'_>,
    ) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeLabel;
        ("where", self.0).encode(encoder.encode_label())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueTarget {
    pub queue: String,
    pub target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueRung {
    pub queue: String,
    pub rung: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RungLabel {
    pub rung: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    pub queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginFaultLabels {
    pub queue: String,
    pub fault: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginSwapLabels {
    pub queue: String,
    /// swapped or refused.
    pub result: String,
}

/// A stream consumer and the protocol it reads over (`stream`, `amqp`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamProtocolLabels {
    pub queue: String,
    pub protocol: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginVersionLabels {
    pub queue: String,
    pub sha256: String,
}

/// A publish's labels. No routing key: plugins choose those (an order or a
/// tenant id in each), and a series per key would grow without bound. The
/// exchange is bounded by config: a consumer's `publish_to`, an exchange of
/// `[[exchanges]]`, or the default exchange `""` (retries, set-asides,
/// replies); any other (a routing slip's next step names its exchange, and
/// the producer wrote the slip) is counted as [`UNCONFIGURED_EXCHANGE`].
/// The `exchange` label of a publish to an exchange the config does not
/// name (see [`PublishLabels`]).
pub const UNCONFIGURED_EXCHANGE: &str = "(unconfigured)";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PublishLabels {
    pub exchange: String,
    /// confirmed, unroutable, failed or refused.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionLabel {
    /// consume or publish.
    pub connection: String,
}

/// The scheduler's series; see [`Metrics::declare_scheduler`] for each.
#[derive(Clone)]
pub struct SchedulerMetrics {
    pub scheduled: Family<QueueLabel, Counter>,
    pub hops: Family<RungLabel, Counter>,
    pub delivered: Counter,
    pub lateness: Histogram,
    pub refused: Family<ReasonLabel, Counter>,
    pub undeliverable: Family<ReasonLabel, Counter>,
    /// Set at scrape time from [`crate::scheduler::control::Overdue`].
    pub oldest_overdue_seconds: Gauge<f64, AtomicU64>,
    pub overdue: std::sync::Arc<crate::scheduler::control::Overdue>,
}

impl Default for SchedulerMetrics {
    fn default() -> Self {
        Self {
            scheduled: Family::default(),
            hops: Family::default(),
            delivered: Counter::default(),
            // The contract's resolution is a second: buckets from a
            // millisecond (a hold that ended on time) to a minute (a
            // control consumer that was down).
            lateness: seconds_histogram(),
            refused: Family::default(),
            undeliverable: Family::default(),
            oldest_overdue_seconds: Gauge::default(),
            overdue: std::sync::Arc::default(),
        }
    }
}

/// A rollout's series (`crate::rollout`): the candidate's share, the
/// calls of each version by role, the decisions, and a shadow's comparisons.
#[derive(Default)]
pub struct RolloutMetrics {
    /// The share of deliveries the candidate takes now (0 without one).
    pub share: Family<QueueLabel, Gauge<f64, AtomicU64>>,
    /// Calls by role (`current`, `candidate`, `shadow`) and result
    /// (`decided`, `faulted`).
    pub calls: Family<RolloutCallLabels, Counter>,
    /// `stepped`, `promoted`, `rolled_back`, `aborted`, `abandoned`.
    pub decisions: Family<RolloutDecisionLabels, Counter>,
    /// A shadow's calls: `same`, `different`, `skipped` (no room: every
    /// shadow place was taken).
    pub shadow: Family<ShadowResultLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutCallLabels {
    pub queue: String,
    pub role: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RolloutDecisionLabels {
    pub queue: String,
    pub decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShadowResultLabels {
    pub queue: String,
    pub result: &'static str,
}

/// A state namespace's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabel {
    pub namespace: String,
}

/// A state operation of a plugin, in a namespace.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateOpLabel {
    pub namespace: String,
    pub op: String,
}

/// How a state commit ended, in a namespace.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommitLabel {
    pub namespace: String,
    pub result: String,
}

/// Plugin state and idempotency (`crate::state`); see
/// [`Metrics::declare_state`] for each.
#[derive(Clone)]
pub struct StateMetrics {
    pub operations: Family<StateOpLabel, Counter>,
    pub commits: Family<CommitLabel, Counter>,
    pub commit_seconds: Histogram,
    /// Set at scrape time from the store.
    pub keys: Family<NamespaceLabel, Gauge>,
    pub bytes: Family<NamespaceLabel, Gauge>,
    pub reruns: Family<QueueLabel, Counter>,
    pub duplicates: Family<QueueLabel, Counter>,
    pub claims_waited: Family<QueueLabel, Counter>,
}

impl Default for StateMetrics {
    fn default() -> Self {
        Self {
            operations: Family::default(),
            commits: Family::default(),
            commit_seconds: seconds_histogram(),
            keys: Family::default(),
            bytes: Family::default(),
            reruns: Family::default(),
            duplicates: Family::default(),
            claims_waited: Family::default(),
        }
    }
}

/// A family of histograms, each made with the buckets of its kind.
pub type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Buckets of the timers (`acemq.consume.duration`,
/// `acemq.publish.duration`, plugin calls), in seconds: from half a
/// millisecond (an echo call) to a minute (a delivery held through a
/// broker alarm).
const SECONDS_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

fn seconds_histogram() -> Histogram {
    Histogram::new(SECONDS_BUCKETS)
}

/// `acemq.consume.attempts`: the attempt a delivery arrived with. The
/// contract's ladder has five rungs, so every attempt up to ten is a bucket
/// of its own.
fn attempts_histogram() -> Histogram {
    Histogram::new([
        1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 20.0, 50.0,
    ])
}

/// Fuel of one handler call: powers of four from a thousand (a trivial
/// call) to about a billion (a call near the default deadline).
fn fuel_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        1_000.0, 4.0, 11,
    ))
}

/// One publish destination's series for one outcome.
#[derive(Clone)]
struct PublishSeries {
    total: Counter,
    duration: Histogram,
}

/// One publish destination's series, by [`PublishOutcome`] (as an index),
/// each made at its first count.
///
/// [`PublishOutcome`]: crate::broker::publisher::PublishOutcome
type PublishOutcomeSeries = [Option<PublishSeries>; 4];

/// Every metric the host keeps.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Recent rates and set-aside reasons, for the status page.
    pub activity: activity::Activity,
    /// `acemq.consume.total{queue,outcome}`: exactly one per delivery.
    pub consume_total: Family<QueueOutcome, Counter>,
    /// `acemq.consume.duration{queue,outcome}`: from the delivery to its
    /// settlement, in seconds.
    pub consume_duration: Histograms<QueueOutcome>,
    /// `acemq.consume.attempts{queue}`: the attempt each delivery arrived with.
    pub consume_attempts: Histograms<QueueLabel>,
    /// `acemq.consume.in.flight{queue}`.
    pub in_flight: Family<QueueLabel, Gauge>,
    /// `acemq.messages.retried.total{queue,where}`.
    pub retried_total: Family<QueueWhere, Counter>,
    /// `acemq.messages.dead.lettered.total{queue,outcome}` (dead_lettered or parked).
    pub dead_lettered_total: Family<QueueOutcome, Counter>,
    /// `acemq.messages.set.aside.failed{queue,target}`.
    pub set_aside_failed: Family<QueueTarget, Counter>,
    /// `acemq.retry.rung.missing{queue,rung}`.
    pub rung_missing: Family<QueueRung, Counter>,
    /// Host-specific: handler faults by kind.
    pub plugin_faults: Family<PluginFaultLabels, Counter>,
    /// Host-specific: hot-swap attempts by result.
    pub plugin_swaps: Family<PluginSwapLabels, Counter>,
    /// Host-specific: the version serving each consumer (1 for the current one).
    pub plugin_version: Family<PluginVersionLabels, Gauge>,
    /// Host-specific: fuel burned by handler calls, when metering is on.
    pub plugin_fuel: Family<QueueLabel, Counter>,
    /// Host-specific: how long each handler call took (decode, handle,
    /// encode), by the plugin version that ran it, in seconds.
    pub plugin_call_duration: Histograms<PluginVersionLabels>,
    /// Host-specific: fuel of each handler call, by plugin version, when
    /// metering is on.
    pub plugin_call_fuel: Histograms<PluginVersionLabels>,
    /// `acemq.publish.total{exchange,outcome}` (the contract's
    /// `routing.key` label is left out: see [`PublishLabels`]).
    pub publish_total: Family<PublishLabels, Counter>,
    /// `acemq.publish.duration{exchange,outcome}`: from the publish to its
    /// confirm (or failure), in seconds.
    pub publish_duration: Histograms<PublishLabels>,
    /// Publishes waiting for a broker confirm.
    pub publish_unconfirmed: Gauge,
    /// 1 while the connection is up (blocked included), else 0.
    pub connection_up: Family<ConnectionLabel, Gauge>,
    /// 1 while the broker blocks the connection.
    pub connection_blocked: Family<ConnectionLabel, Gauge>,
    /// Time spent blocked, counted when the block ends.
    pub connection_blocked_seconds: Family<ConnectionLabel, Counter<f64, AtomicU64>>,
    /// Connections lost and recovered.
    pub connection_recoveries: Family<ConnectionLabel, Counter>,
    /// Age of each queue's oldest delivery not yet acked, set at scrape time.
    pub oldest_unacked_seconds: Family<QueueLabel, Gauge<f64, AtomicU64>>,
    /// 1 while most recent calls of a consumer's plugin fault (set at scrape).
    pub plugin_faulting: Family<QueueLabel, Gauge>,
    /// Each stream consumer's position: the offset it resumes from.
    pub stream_position: Family<QueueLabel, Gauge>,
    /// 1 for the protocol each stream consumer reads over.
    pub stream_protocol: Family<StreamProtocolLabels, Gauge>,
    /// Messages between each stream consumer's position and the newest
    /// offset of its stream (probed every 30 s).
    pub stream_lag: Family<QueueLabel, Gauge>,
    /// Seconds since each stream consumer's checkpoint was last saved.
    pub stream_checkpoint_age_seconds: Family<QueueLabel, Gauge<f64, AtomicU64>>,
    /// Stream checkpoint reads and saves that failed (a consumer that
    /// cannot read its checkpoint does not start), per consumer queue.
    pub stream_checkpoint_failures: Family<QueueLabel, Counter>,
    /// The scheduler's series (`crate::scheduler`).
    pub scheduler: SchedulerMetrics,
    /// Canary and shadow rollouts (`crate::rollout`).
    pub rollout: RolloutMetrics,
    /// Plugin state and idempotency (`crate::state`).
    pub state: StateMetrics,
    /// When each blocked connection was blocked.
    blocked_since: Mutex<HashMap<String, Instant>>,
    /// `publish_total`'s series by exchange and outcome, found without
    /// building a label set (two strings) for every publish.
    publish_series: Mutex<HashMap<String, PublishOutcomeSeries>>,
    /// The exchanges publishes are labelled with by name
    /// ([`Metrics::label_exchanges`]); `None` until a host names them (a
    /// registry not tied to a config, in tests and benches, labels all).
    labelled_exchanges: std::sync::RwLock<Option<std::collections::HashSet<String>>>,
    /// See [`Metrics::sample_names`].
    sample_names: BTreeSet<String>,
    /// See [`Metrics::catalogue`].
    catalogue: Vec<MetricEntry>,
}

/// One metric as `/metrics` shows it, for operators (the metric table of
/// `docs/operating.md`) and for checks of what the dashboard queries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricEntry {
    /// The name a query uses: a counter's with `_total`, a histogram's
    /// base name (its samples add `_bucket`, `_sum` and `_count`).
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Every label its series carry (a histogram's buckets add `le`). None
    /// takes a value that a plugin or a producer chooses: each is bounded
    /// by the config (queues, exchanges, rungs), the plugin versions loaded
    /// or a fixed set of words.
    pub labels: &'static [&'static str],
}

/// Registers metrics and notes the sample names each will show, and its
/// labels.
struct Declare<'a> {
    registry: &'a mut Registry,
    names: &'a mut BTreeSet<String>,
    catalogue: &'a mut Vec<MetricEntry>,
}

impl Declare<'_> {
    fn register<M: Metric + TypedMetric>(
        &mut self,
        name: &str,
        help: &str,
        labels: &'static [&'static str],
        metric: M,
    ) {
        self.note(name, None, M::TYPE, labels);
        self.registry.register(name, help, metric);
    }

    fn register_with_unit<M: Metric + TypedMetric>(
        &mut self,
        name: &str,
        help: &str,
        unit: Unit,
        labels: &'static [&'static str],
        metric: M,
    ) {
        self.note(name, Some(&unit), M::TYPE, labels);
        self.registry.register_with_unit(name, help, unit, metric);
    }

    /// The names the text encoder writes: `name[_unit]` and the type's suffixes.
    fn note(
        &mut self,
        name: &str,
        unit: Option<&Unit>,
        kind: MetricType,
        labels: &'static [&'static str],
    ) {
        let base = match unit {
            Some(unit) => format!("{name}_{}", unit.as_str()),
            None => name.to_string(),
        };
        let (suffixes, kind, queried): (&[&str], _, _) = match kind {
            MetricType::Counter => (&["_total"], "counter", format!("{base}_total")),
            MetricType::Histogram => (&["_bucket", "_sum", "_count"], "histogram", base.clone()),
            _ => (&[""], "gauge", base.clone()),
        };
        self.names
            .extend(suffixes.iter().map(|suffix| format!("{base}{suffix}")));
        self.catalogue.push(MetricEntry {
            name: queried,
            kind,
            labels,
        });
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut metrics = Self::unregistered();
        let mut sample_names = BTreeSet::new();
        let mut catalogue = Vec::new();
        {
            let mut registry = metrics.registry.lock().expect("registry poisoned");
            let mut declare = Declare {
                registry: &mut registry,
                names: &mut sample_names,
                catalogue: &mut catalogue,
            };
            // In this order on `/metrics` and in the catalogue.
            metrics.declare_consume(&mut declare);
            metrics.declare_plugin(&mut declare);
            metrics.declare_publish(&mut declare);
            metrics.declare_connection(&mut declare);
            metrics.declare_stream(&mut declare);
            metrics.declare_rollout(&mut declare);
            metrics.declare_scheduler(&mut declare);
            metrics.declare_state(&mut declare);
            metrics.declare_scraped(&mut declare);
        }
        metrics.sample_names = sample_names;
        metrics.catalogue = catalogue;
        metrics
    }

    /// Every family empty, none registered yet.
    fn unregistered() -> Self {
        Self {
            registry: Mutex::new(Registry::default()),
            activity: activity::Activity::default(),
            consume_total: Family::default(),
            consume_duration: Family::new_with_constructor(seconds_histogram),
            consume_attempts: Family::new_with_constructor(attempts_histogram),
            in_flight: Family::default(),
            retried_total: Family::default(),
            dead_lettered_total: Family::default(),
            set_aside_failed: Family::default(),
            rung_missing: Family::default(),
            plugin_faults: Family::default(),
            plugin_swaps: Family::default(),
            plugin_version: Family::default(),
            plugin_fuel: Family::default(),
            plugin_call_duration: Family::new_with_constructor(seconds_histogram),
            plugin_call_fuel: Family::new_with_constructor(fuel_histogram),
            publish_total: Family::default(),
            publish_duration: Family::new_with_constructor(seconds_histogram),
            publish_unconfirmed: Gauge::default(),
            connection_up: Family::default(),
            connection_blocked: Family::default(),
            connection_blocked_seconds: Family::default(),
            connection_recoveries: Family::default(),
            oldest_unacked_seconds: Family::default(),
            plugin_faulting: Family::default(),
            stream_position: Family::default(),
            stream_protocol: Family::default(),
            stream_lag: Family::default(),
            stream_checkpoint_age_seconds: Family::default(),
            stream_checkpoint_failures: Family::default(),
            scheduler: SchedulerMetrics::default(),
            rollout: RolloutMetrics::default(),
            state: StateMetrics::default(),
            blocked_since: Mutex::new(HashMap::new()),
            publish_series: Mutex::new(HashMap::new()),
            labelled_exchanges: std::sync::RwLock::new(None),
            sample_names: BTreeSet::new(),
            catalogue: Vec::new(),
        }
    }

    /// The consume path: one series set per delivery settled.
    fn declare_consume(&self, declare: &mut Declare<'_>) {
        declare.register(
            "acemq_consume",
            "Deliveries settled, by outcome",
            &["queue", "outcome"],
            self.consume_total.clone(),
        );
        declare.register_with_unit(
            "acemq_consume_duration",
            "From a delivery to its settlement, by outcome",
            Unit::Seconds,
            &["queue", "outcome"],
            self.consume_duration.clone(),
        );
        declare.register(
            "acemq_consume_attempts",
            "The attempt each delivery arrived with",
            &["queue"],
            self.consume_attempts.clone(),
        );
        declare.register(
            "acemq_consume_in_flight",
            "Deliveries being handled",
            &["queue"],
            self.in_flight.clone(),
        );
        declare.register(
            "acemq_messages_retried",
            "Retries, by where the wait happens",
            &["queue", "where"],
            self.retried_total.clone(),
        );
        declare.register(
            "acemq_messages_dead_lettered",
            "Messages set aside to .dlq or .parked",
            &["queue", "outcome"],
            self.dead_lettered_total.clone(),
        );
        declare.register(
            "acemq_messages_set_aside_failed",
            "Set-aside publishes that failed (the delivery was requeued)",
            &["queue", "target"],
            self.set_aside_failed.clone(),
        );
        declare.register(
            "acemq_retry_rung_missing",
            "Retries that found no rung queue and waited in the consumer",
            &["queue", "rung"],
            self.rung_missing.clone(),
        );
    }

    /// The handler calls and the plugin versions behind them.
    fn declare_plugin(&self, declare: &mut Declare<'_>) {
        declare.register(
            "acemq_plugin_faults",
            "Handler calls that failed, by fault",
            &["queue", "fault"],
            self.plugin_faults.clone(),
        );
        declare.register(
            "acemq_plugin_swaps",
            "Plugin hot-swap attempts, by result",
            &["queue", "result"],
            self.plugin_swaps.clone(),
        );
        declare.register(
            "acemq_plugin_version",
            "The plugin version serving a consumer",
            &["queue", "sha256"],
            self.plugin_version.clone(),
        );
        declare.register(
            "acemq_plugin_fuel",
            "Fuel burned by handler calls",
            &["queue"],
            self.plugin_fuel.clone(),
        );
        declare.register_with_unit(
            "acemq_plugin_call_duration",
            "Handler calls (decode, handle, encode), by plugin version",
            Unit::Seconds,
            &["queue", "sha256"],
            self.plugin_call_duration.clone(),
        );
        declare.register(
            "acemq_plugin_call_fuel",
            "Fuel of each handler call, by plugin version (when metering is on)",
            &["queue", "sha256"],
            self.plugin_call_fuel.clone(),
        );
    }

    /// Publishing and its confirms.
    fn declare_publish(&self, declare: &mut Declare<'_>) {
        declare.register(
            "acemq_publish",
            "Publishes, by outcome (refused: declined unsent while the connection was lost, recovering or blocked)",
            &["exchange", "outcome"],
            self.publish_total.clone(),
        );
        declare.register_with_unit(
            "acemq_publish_duration",
            "From a publish to its confirm or failure, by outcome",
            Unit::Seconds,
            &["exchange", "outcome"],
            self.publish_duration.clone(),
        );
        declare.register(
            "acemq_publish_unconfirmed",
            "Publishes waiting for a broker confirm",
            &[],
            self.publish_unconfirmed.clone(),
        );
    }

    /// The broker connections' state.
    fn declare_connection(&self, declare: &mut Declare<'_>) {
        declare.register(
            "acemq_connection_up",
            "1 while the connection is open",
            &["connection"],
            self.connection_up.clone(),
        );
        declare.register(
            "acemq_connection_blocked",
            "1 while the broker blocks the connection (a resource alarm)",
            &["connection"],
            self.connection_blocked.clone(),
        );
        declare.register(
            "acemq_connection_blocked_seconds",
            "Seconds the broker kept the connection blocked",
            &["connection"],
            self.connection_blocked_seconds.clone(),
        );
        declare.register(
            "acemq_connection_recoveries",
            "Connections lost and recovered",
            &["connection"],
            self.connection_recoveries.clone(),
        );
    }

    /// Stream consumers' positions and checkpoints.
    fn declare_stream(&self, declare: &mut Declare<'_>) {
        declare.register(
            "acemq_stream_position",
            "The offset each stream consumer resumes from",
            &["queue"],
            self.stream_position.clone(),
        );
        declare.register(
            "acemq_stream_protocol",
            "1 for the protocol each stream consumer reads over, chosen at start (stream or amqp)",
            &["queue", "protocol"],
            self.stream_protocol.clone(),
        );
        declare.register(
            "acemq_stream_lag",
            "Messages a stream consumer is behind the newest (probed every 30 s)",
            &["queue"],
            self.stream_lag.clone(),
        );
        declare.register(
            "acemq_stream_checkpoint_age_seconds",
            "Seconds since a stream consumer's checkpoint was last saved",
            &["queue"],
            self.stream_checkpoint_age_seconds.clone(),
        );
        declare.register(
            "acemq_stream_checkpoint_failures",
            "Stream checkpoint reads and saves that failed",
            &["queue"],
            self.stream_checkpoint_failures.clone(),
        );
    }

    /// The scheduler: what plugins scheduled, and what its control consumer
    /// did with each message it read.
    /// Rolling out a candidate version: canary and shadow.
    fn declare_rollout(&self, declare: &mut Declare<'_>) {
        let r = &self.rollout;
        declare.register(
            "acemq_rollout_share",
            "The share of a consumer's deliveries its candidate version takes now (0 without one)",
            &["queue"],
            r.share.clone(),
        );
        declare.register(
            "acemq_rollout_calls",
            "Handler calls during a rollout, by version role (current, candidate, shadow) and result (decided, faulted)",
            &["queue", "role", "result"],
            r.calls.clone(),
        );
        declare.register(
            "acemq_rollout_decisions",
            "Rollout decisions: stepped, promoted, rolled_back, aborted, abandoned",
            &["queue", "decision"],
            r.decisions.clone(),
        );
        declare.register(
            "acemq_shadow_calls",
            "A shadow candidate's calls, compared with the current version's decision: same, different, or skipped (no free shadow place)",
            &["queue", "result"],
            r.shadow.clone(),
        );
    }

    fn declare_scheduler(&self, declare: &mut Declare<'_>) {
        let s = &self.scheduler;
        declare.register(
            "acemq_scheduler_scheduled",
            "Delayed outputs confirmed into the scheduler, by the consumer that published them",
            &["queue"],
            s.scheduled.clone(),
        );
        declare.register(
            "acemq_scheduler_hops",
            "Scheduled messages sent down to their next rung, by rung",
            &["rung"],
            s.hops.clone(),
        );
        declare.register(
            "acemq_scheduler_delivered",
            "Scheduled messages published to their final exchange",
            &[],
            s.delivered.clone(),
        );
        declare.register_with_unit(
            "acemq_scheduler_lateness",
            "How long after its due time each scheduled message was delivered",
            Unit::Seconds,
            &[],
            s.lateness.clone(),
        );
        declare.register(
            "acemq_scheduler_refused",
            "Messages on the control queue rejected, by reason (missing_header, invalid_header)",
            &["reason"],
            s.refused.clone(),
        );
        declare.register(
            "acemq_scheduler_undeliverable",
            "Final publishes that failed (the message waits 10 s and is tried again), by reason",
            &["reason"],
            s.undeliverable.clone(),
        );
        declare.register(
            "acemq_scheduler_oldest_overdue_seconds",
            "How long the most overdue message this host is trying to deliver is past its due time (0 when none)",
            &[],
            s.oldest_overdue_seconds.clone(),
        );
    }

    /// Plugin state: what plugins asked of it, its commits and usage, and
    /// what idempotency saved.
    fn declare_state(&self, declare: &mut Declare<'_>) {
        let s = &self.state;
        declare.register(
            "acemq_state_operations",
            "State calls by plugins, by namespace and operation (get, set, delete, increment, get_versioned, set_if_version)",
            &["namespace", "op"],
            s.operations.clone(),
        );
        declare.register(
            "acemq_state_commits",
            "Commits of accepted inputs, by namespace (- for done records only) and result (committed, duplicate, conflict, quota, failed)",
            &["namespace", "result"],
            s.commits.clone(),
        );
        declare.register_with_unit(
            "acemq_state_commit",
            "How long each commit took, the store's round trip included",
            Unit::Seconds,
            &[],
            s.commit_seconds.clone(),
        );
        declare.register(
            "acemq_state_keys",
            "Keys in each namespace (read from the store at scrape)",
            &["namespace"],
            s.keys.clone(),
        );
        declare.register(
            "acemq_state_bytes",
            "Bytes (keys plus values) in each namespace (read from the store at scrape)",
            &["namespace"],
            s.bytes.clone(),
        );
        declare.register(
            "acemq_state_reruns",
            "Handler calls run again because a value they read changed before their commit",
            &["queue"],
            s.reruns.clone(),
        );
        declare.register(
            "acemq_state_duplicates",
            "Inputs already done (by envelope id), acked without a call",
            &["queue"],
            s.duplicates.clone(),
        );
        declare.register(
            "acemq_state_claims_waited",
            "Inputs answered in progress: another host holds a live claim on their id",
            &["queue"],
            s.claims_waited.clone(),
        );
    }

    /// Set when `/metrics` is scraped, not as deliveries go.
    fn declare_scraped(&self, declare: &mut Declare<'_>) {
        declare.register(
            "acemq_consume_oldest_unacked_seconds",
            "Age of the oldest delivery not yet acked (0 when none)",
            &["queue"],
            self.oldest_unacked_seconds.clone(),
        );
        declare.register(
            "acemq_plugin_faulting",
            "1 while most of the latest calls of the consumer's plugin version fault (as /health says), else 0",
            &["queue"],
            self.plugin_faulting.clone(),
        );
    }

    /// Every metric the host keeps, with its kind and labels, in the order
    /// of `/metrics`.
    pub fn catalogue(&self) -> &[MetricEntry] {
        &self.catalogue
    }

    /// Every sample name `/metrics` may show (a counter's `_total`, a
    /// histogram's `_bucket`, `_sum` and `_count`, ...), series or not: a
    /// family appears in the exposition only once it has a series.
    pub fn sample_names(&self) -> &BTreeSet<String> {
        &self.sample_names
    }

    /// The count of one `acemq.consume.total` series (for tests and summaries).
    pub fn consumed_count(&self, queue: &str, outcome: &str) -> u64 {
        self.consume_total
            .get_or_create(&QueueOutcome {
                queue: queue.to_string(),
                outcome: outcome.to_string(),
            })
            .get()
    }

    /// The registry in Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().expect("registry poisoned");
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String cannot fail");
        out
    }
}

fn connection(role: &str) -> ConnectionLabel {
    ConnectionLabel {
        connection: role.to_string(),
    }
}

impl crate::broker::LinkObserver for Metrics {
    fn phase_changed(&self, role: &str, phase: &crate::broker::Phase) {
        use crate::broker::Phase;
        let label = connection(role);
        let up = matches!(phase, Phase::Up | Phase::Blocked { .. });
        self.connection_up.get_or_create(&label).set(i64::from(up));
        let blocked = matches!(phase, Phase::Blocked { .. });
        self.connection_blocked
            .get_or_create(&label)
            .set(i64::from(blocked));
        let mut since = self.blocked_since.lock().expect("blocked_since poisoned");
        if blocked {
            since.entry(role.to_string()).or_insert_with(Instant::now);
        } else if let Some(start) = since.remove(role) {
            self.connection_blocked_seconds
                .get_or_create(&label)
                .inc_by(start.elapsed().as_secs_f64());
        }
    }

    fn recovered(&self, role: &str, _took: Duration) {
        self.connection_recoveries
            .get_or_create(&connection(role))
            .inc();
    }
}

impl Metrics {
    /// Publishes to `exchanges` (and to the default exchange) are labelled
    /// with their names from now on, every other one as
    /// [`UNCONFIGURED_EXCHANGE`]: the host names those of its config, so no
    /// producer can add series.
    pub fn label_exchanges(&self, exchanges: impl IntoIterator<Item = String>) {
        let mut named: std::collections::HashSet<String> = exchanges.into_iter().collect();
        named.insert(String::new());
        *self
            .labelled_exchanges
            .write()
            .expect("labelled exchanges poisoned") = Some(named);
    }

    fn exchange_label<'a>(&self, exchange: &'a str) -> &'a str {
        match &*self
            .labelled_exchanges
            .read()
            .expect("labelled exchanges poisoned")
        {
            Some(named) if !named.contains(exchange) => UNCONFIGURED_EXCHANGE,
            _ => exchange,
        }
    }
}

impl crate::broker::PublishObserver for Metrics {
    fn published(
        &self,
        exchange: &str,
        outcome: crate::broker::publisher::PublishOutcome,
        took: Duration,
    ) {
        let exchange = self.exchange_label(exchange);
        let mut series = self.publish_series.lock().expect("publish series poisoned");
        let outcomes = match series.get_mut(exchange) {
            Some(outcomes) => outcomes,
            None => series.entry(exchange.to_string()).or_default(),
        };
        let series = outcomes[outcome as usize].get_or_insert_with(|| {
            let labels = PublishLabels {
                exchange: exchange.to_string(),
                outcome: outcome.as_str().to_string(),
            };
            PublishSeries {
                total: self.publish_total.get_or_create(&labels).clone(),
                duration: self.publish_duration.get_or_create(&labels).clone(),
            }
        });
        series.total.inc();
        series.duration.observe(took.as_secs_f64());
    }

    fn unconfirmed(&self, delta: i64) {
        self.publish_unconfirmed.inc_by(delta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_to_an_exchange_the_config_does_not_name_adds_no_series_of_its_own() {
        use crate::broker::PublishObserver;
        use crate::broker::publisher::PublishOutcome;
        let m = Metrics::new();
        m.label_exchanges(["orders".to_string()]);
        let ms = Duration::from_millis(1);
        m.published("orders", PublishOutcome::Confirmed, ms);
        m.published("", PublishOutcome::Confirmed, ms);
        m.published("chosen-by-a-producer-1", PublishOutcome::Confirmed, ms);
        m.published("chosen-by-a-producer-2", PublishOutcome::Confirmed, ms);
        let text = m.render();
        assert!(
            text.contains("acemq_publish_total{exchange=\"orders\",outcome=\"confirmed\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("acemq_publish_total{exchange=\"\",outcome=\"confirmed\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "acemq_publish_total{exchange=\"(unconfigured)\",outcome=\"confirmed\"} 2"
            ),
            "{text}"
        );
        assert!(!text.contains("chosen-by-a-producer"), "{text}");
    }

    #[test]
    fn publishes_are_counted_by_exchange_and_outcome() {
        use crate::broker::PublishObserver;
        use crate::broker::publisher::PublishOutcome;
        let m = Metrics::new();
        let ms = Duration::from_millis(3);
        m.published("orders", PublishOutcome::Confirmed, ms);
        m.published("orders", PublishOutcome::Confirmed, ms);
        m.published("orders", PublishOutcome::Refused, ms);
        m.published("", PublishOutcome::Confirmed, ms);
        let text = m.render();
        for line in [
            "acemq_publish_total{exchange=\"orders\",outcome=\"confirmed\"} 2",
            "acemq_publish_total{exchange=\"orders\",outcome=\"refused\"} 1",
            "acemq_publish_total{exchange=\"\",outcome=\"confirmed\"} 1",
            "acemq_publish_duration_seconds_count{exchange=\"orders\",outcome=\"confirmed\"} 2",
            "acemq_publish_duration_seconds_bucket{le=\"0.005\",exchange=\"orders\",outcome=\"confirmed\"} 2",
            "acemq_publish_duration_seconds_bucket{le=\"0.0025\",exchange=\"orders\",outcome=\"confirmed\"} 0",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(
            !text.contains("outcome=\"failed\""),
            "no series before its first count: {text}"
        );
    }

    #[test]
    fn sample_names_are_what_the_exposition_writes() {
        use crate::broker::PublishObserver;
        let m = Metrics::new();
        m.published(
            "x",
            crate::broker::publisher::PublishOutcome::Confirmed,
            Duration::from_millis(1),
        );
        let names = m.sample_names();
        for name in [
            "acemq_consume_total",
            "acemq_consume_in_flight",
            "acemq_consume_duration_seconds_bucket",
            "acemq_publish_duration_seconds_count",
            "acemq_plugin_call_fuel_sum",
            "acemq_connection_blocked_seconds_total",
        ] {
            assert!(names.contains(name), "{name} in {names:?}");
        }
        // Every sample actually written is among them.
        for line in m.render().lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(names.contains(name), "{name} written but not declared");
        }
    }

    #[test]
    fn renders_contract_names_with_underscores() {
        let m = Metrics::new();
        m.consume_total
            .get_or_create(&QueueOutcome {
                queue: "orders.new".into(),
                outcome: "acked".into(),
            })
            .inc();
        m.retried_total
            .get_or_create(&QueueWhere {
                queue: "orders.new".into(),
                place: Place("broker"),
            })
            .inc();
        let text = m.render();
        assert!(
            text.contains("acemq_consume_total{queue=\"orders.new\",outcome=\"acked\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("acemq_messages_retried_total{queue=\"orders.new\",where=\"broker\"} 1"),
            "{text}"
        );
        assert_eq!(m.consumed_count("orders.new", "acked"), 1);
    }

    /// Every family given one series; what `/metrics` then writes.
    fn every_family_shown(m: &Metrics) -> String {
        use crate::broker::PublishObserver;
        let qo = QueueOutcome {
            queue: "q".into(),
            outcome: "acked".into(),
        };
        let q = QueueLabel { queue: "q".into() };
        let version = PluginVersionLabels {
            queue: "q".into(),
            sha256: "ab".into(),
        };
        let c = connection("publish");
        m.consume_total.get_or_create(&qo).inc();
        m.consume_duration.get_or_create(&qo).observe(0.1);
        m.consume_attempts.get_or_create(&q).observe(1.0);
        m.in_flight.get_or_create(&q).set(1);
        m.retried_total
            .get_or_create(&QueueWhere {
                queue: "q".into(),
                place: Place("broker"),
            })
            .inc();
        m.dead_lettered_total.get_or_create(&qo).inc();
        m.set_aside_failed
            .get_or_create(&QueueTarget {
                queue: "q".into(),
                target: "q.dlq".into(),
            })
            .inc();
        m.rung_missing
            .get_or_create(&QueueRung {
                queue: "q".into(),
                rung: "q.retry.30s".into(),
            })
            .inc();
        m.plugin_faults
            .get_or_create(&PluginFaultLabels {
                queue: "q".into(),
                fault: "trap".into(),
            })
            .inc();
        m.plugin_swaps
            .get_or_create(&PluginSwapLabels {
                queue: "q".into(),
                result: "swapped".into(),
            })
            .inc();
        m.plugin_version.get_or_create(&version).set(1);
        m.plugin_fuel.get_or_create(&q).inc();
        m.plugin_call_duration.get_or_create(&version).observe(0.1);
        m.plugin_call_fuel.get_or_create(&version).observe(10.0);
        m.rollout.share.get_or_create(&q).set(0.1);
        m.rollout
            .calls
            .get_or_create(&RolloutCallLabels {
                queue: "q".into(),
                role: "candidate",
                result: "decided",
            })
            .inc();
        m.rollout
            .decisions
            .get_or_create(&RolloutDecisionLabels {
                queue: "q".into(),
                decision: "stepped",
            })
            .inc();
        m.rollout
            .shadow
            .get_or_create(&ShadowResultLabels {
                queue: "q".into(),
                result: "same",
            })
            .inc();
        m.published(
            "x",
            crate::broker::publisher::PublishOutcome::Confirmed,
            Duration::from_millis(1),
        );
        m.publish_unconfirmed.set(1);
        m.connection_up.get_or_create(&c).set(1);
        m.connection_blocked.get_or_create(&c).set(0);
        m.connection_blocked_seconds.get_or_create(&c).inc_by(1.0);
        m.connection_recoveries.get_or_create(&c).inc();
        m.oldest_unacked_seconds.get_or_create(&q).set(1.0);
        m.plugin_faulting.get_or_create(&q).set(1);
        m.stream_position.get_or_create(&q).set(1);
        m.stream_protocol
            .get_or_create(&StreamProtocolLabels {
                queue: "q".into(),
                protocol: "stream",
            })
            .set(1);
        m.stream_lag.get_or_create(&q).set(1);
        m.stream_checkpoint_age_seconds.get_or_create(&q).set(1.0);
        m.stream_checkpoint_failures.get_or_create(&q).inc();
        let s = &m.scheduler;
        s.scheduled.get_or_create(&q).inc();
        s.hops
            .get_or_create(&RungLabel {
                rung: "acemq.schedule.1s".into(),
            })
            .inc();
        let reason = ReasonLabel {
            reason: "missing_header".into(),
        };
        s.refused.get_or_create(&reason).inc();
        s.undeliverable.get_or_create(&reason).inc();
        let st = &m.state;
        let namespace = NamespaceLabel {
            namespace: "orders".into(),
        };
        st.operations
            .get_or_create(&StateOpLabel {
                namespace: "orders".into(),
                op: "get".into(),
            })
            .inc();
        st.commits
            .get_or_create(&CommitLabel {
                namespace: "orders".into(),
                result: "committed".into(),
            })
            .inc();
        st.keys.get_or_create(&namespace).set(1);
        st.bytes.get_or_create(&namespace).set(10);
        st.reruns.get_or_create(&q).inc();
        st.duplicates.get_or_create(&q).inc();
        st.claims_waited.get_or_create(&q).inc();
        m.render()
    }

    /// The catalogue (the metric table of `docs/operating.md`) says exactly which labels
    /// each metric's samples carry.
    #[test]
    fn the_catalogue_names_every_metric_and_exactly_its_labels() {
        let m = Metrics::new();
        let text = every_family_shown(&m);
        let mut seen = BTreeSet::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (sample, rest) = line
                .split_once('{')
                .unwrap_or((line.split(' ').next().unwrap(), ""));
            let labels: BTreeSet<&str> = rest
                .split_once('}')
                .map(|(set, _)| set)
                .unwrap_or("")
                .split(',')
                .filter(|pair| !pair.is_empty())
                .map(|pair| pair.split('=').next().unwrap())
                .filter(|label| *label != "le")
                .collect();
            let entry = m
                .catalogue()
                .iter()
                .find(|e| {
                    sample == e.name
                        || (e.kind == "histogram"
                            && sample
                                .strip_prefix(e.name.as_str())
                                .is_some_and(|s| ["_bucket", "_sum", "_count"].contains(&s)))
                })
                .unwrap_or_else(|| panic!("{sample} is not in the catalogue"));
            let declared: BTreeSet<&str> = entry.labels.iter().copied().collect();
            assert_eq!(labels, declared, "{line}");
            seen.insert(entry.name.clone());
        }
        let all: BTreeSet<String> = m.catalogue().iter().map(|e| e.name.clone()).collect();
        assert_eq!(seen, all, "every family was shown");
        for entry in m.catalogue() {
            assert!(
                !entry.labels.contains(&"routing_key"),
                "{}: routing keys are chosen by plugins",
                entry.name
            );
        }
    }
}
