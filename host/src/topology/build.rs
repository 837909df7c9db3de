//! From the config to the declarations, following contract §2 and §7.
//!
//! Two halves are built, as every AceMQ library splits them:
//! * the topology half, from `[[exchanges]]`, `[[queues]]` and `[[bindings]]`
//!   (with the dead-letter and rung queues `dead_letter` and `retry` ask for);
//! * the consumer half, what each `[[consumers]]` entry declares when it starts
//!   (Java's consumer, Python's `consume()`): `acemq.dlx`, `{q}.dlq`,
//!   `{q}.parked` and their bindings, plus `acemq.retry`, the rungs and the
//!   home binding when its policy waits in the broker. It never declares the
//!   source queue, which may belong to another service.
//!
//! A thing both halves declare identically is declared once and tagged
//! [`DeclaredBy::Both`]; one name with two different settings is a problem.
//! Every problem is collected; nothing is returned unless there are none.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use super::model::{
    ArgValue, Arguments, BindingDecl, DeclaredBy, ExchangeDecl, ExchangeKind, QueueDecl, QueueType,
    Topology, arguments_from_toml,
};
use super::naming::{self, DEAD_LETTER_EXCHANGE, RETRY_EXCHANGE};
use super::plan;
use super::validate::{self, Entry, Problems};
use crate::config::{BindingConfig, Config, ConsumerConfig, ExchangeConfig, QueueConfig};
use crate::retry::RetryPolicy;
use crate::scheduler;

impl Topology {
    /// Everything the config declares, both halves, in declaration order; or
    /// every reason it cannot be applied.
    pub fn from_config(config: &Config) -> Result<Topology, Problems> {
        let mut builder = Builder::new(config);
        let item = |table, index| Some(Entry::Item { table, index });
        // Where each name was written, for problems found once the
        // topology is finished; the first entry of a name wins.
        let mut origins = validate::Origins::default();
        for (index, exchange) in config.exchanges.iter().enumerate() {
            builder.problems.reading(item("exchanges", index));
            origins.note("exchange", &exchange.name, item("exchanges", index));
            builder.exchange(exchange);
        }
        for (index, queue) in config.queues.iter().enumerate() {
            builder.problems.reading(item("queues", index));
            origins.note("queue", &queue.name, item("queues", index));
            builder.queue(queue);
        }
        for (index, binding) in config.bindings.iter().enumerate() {
            builder.problems.reading(item("bindings", index));
            let shown = format!(
                "{} -> {} ({})",
                binding.exchange, binding.queue, binding.routing_key
            );
            origins.note("binding", &shown, item("bindings", index));
            builder.binding(binding);
        }
        for (index, consumer) in config.consumers.iter().enumerate() {
            builder.problems.reading(item("consumers", index));
            builder.consumer(consumer);
        }
        builder
            .problems
            .reading(Some(Entry::Table("scheduler".into())));
        if config.scheduler_enabled() {
            builder.scheduler_half();
        }
        builder.problems.reading(None);
        builder.finish(&origins)
    }
}

/// The rung queue `{source}.retry.{delay}`: classic, durable, and exactly
/// three arguments (interop invariant 3). When its TTL expires the broker
/// dead-letters the message to `acemq.retry` with the source queue's name as
/// key, and the home binding delivers it back to the source.
pub(crate) fn rung_queue(
    source: &str,
    delay: Duration,
    by: DeclaredBy,
) -> Result<QueueDecl, String> {
    let name = naming::retry_queue(source, delay)?;
    let ttl = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
    let arguments = Arguments::from([
        ("x-message-ttl".to_string(), ArgValue::Int(ttl)),
        ("x-dead-letter-exchange".to_string(), RETRY_EXCHANGE.into()),
        ("x-dead-letter-routing-key".to_string(), source.into()),
    ]);
    Ok(QueueDecl {
        arguments,
        ..holding_queue(name, by)
    })
}

/// A queue AceMQ keeps messages in for it (`.dlq`, `.parked`, rungs):
/// durable and classic, so it never depends on the broker's quorum support
/// and never dead-letters by itself.
pub(crate) fn holding_queue(name: String, by: DeclaredBy) -> QueueDecl {
    QueueDecl {
        name,
        queue_type: QueueType::Classic,
        durable: true,
        exclusive: false,
        auto_delete: false,
        arguments: Arguments::new(),
        declared_by: by,
    }
}

/// `acemq.dlx` / `acemq.retry`: direct, durable, no arguments, in every library.
fn managed_exchange(name: &str, by: DeclaredBy) -> ExchangeDecl {
    ExchangeDecl {
        name: name.to_string(),
        kind: ExchangeKind::Direct,
        durable: true,
        auto_delete: false,
        arguments: Arguments::new(),
        declared_by: by,
    }
}

struct Builder<'a> {
    dead_letter_exchange: &'a str,
    /// Every `[retry.NAME]`; `None` when the policy is unusable (already reported).
    policies: BTreeMap<&'a str, Option<RetryPolicy>>,
    /// How often each `(what, name)` appeared in `[[exchanges]]` / `[[queues]]`.
    listed: HashMap<(&'static str, &'a str), u32>,
    /// Listed but left out for a problem already reported; references to
    /// them are not reported again as references to nothing.
    refused: HashSet<(&'static str, &'a str)>,
    topology: Topology,
    problems: Problems,
}

impl<'a> Builder<'a> {
    fn new(config: &'a Config) -> Self {
        let mut problems = Problems::default();
        let policies = config
            .retry
            .iter()
            .map(|(name, cfg)| {
                problems.reading(Some(Entry::Table(format!("retry.{name}"))));
                let policy = RetryPolicy::from_config(name, cfg)
                    .map_err(|problem| problems.push(problem))
                    .ok();
                (name.as_str(), policy)
            })
            .collect();
        let dead_letter_exchange = match config.topology.dead_letter_exchange.as_deref() {
            Some(name) if name.trim().is_empty() => {
                problems.reading(Some(Entry::Table("topology".into())));
                problems.push(validate::blank_dead_letter_exchange());
                DEAD_LETTER_EXCHANGE
            }
            Some(name) => name,
            None => DEAD_LETTER_EXCHANGE,
        };
        Self {
            dead_letter_exchange,
            policies,
            listed: HashMap::new(),
            refused: HashSet::new(),
            topology: Topology::default(),
            problems,
        }
    }

    fn finish(mut self, origins: &validate::Origins) -> Result<Topology, Problems> {
        validate::check_finished(&self.topology, &self.refused, origins, &mut self.problems);
        if self.problems.is_empty() {
            Ok(self.topology)
        } else {
            Err(self.problems)
        }
    }

    // ---- the topology half ----

    fn exchange(&mut self, e: &'a ExchangeConfig) {
        if !self.named_once("exchange", &e.name) {
            return;
        }
        let kind = match e.kind.as_deref() {
            None => {
                self.problems.push(validate::exchange_without_kind(&e.name));
                None
            }
            Some(kind) => ExchangeKind::parse(kind).or_else(|| {
                self.problems
                    .push(validate::unknown_exchange_kind(&e.name, kind));
                None
            }),
        };
        let arguments = self.arguments("exchange", &e.name, &e.arguments);
        let (Some(kind), Some(arguments)) = (kind, arguments) else {
            self.refused.insert(("exchange", &e.name));
            return;
        };
        self.add_exchange(ExchangeDecl {
            name: e.name.clone(),
            kind,
            durable: e.durable,
            auto_delete: e.auto_delete,
            arguments,
            declared_by: DeclaredBy::Topology,
        });
    }

    fn queue(&mut self, q: &'a QueueConfig) {
        if !self.named_once("queue", &q.name) {
            return;
        }
        let problems_before = self.problems.len();
        let mut arguments = self
            .arguments("queue", &q.name, &q.arguments)
            .unwrap_or_default();
        let queue_type = self.queue_type(q, &arguments);
        // The resolved type alone decides x-queue-type, sent once, and never
        // as "classic": omitting it is how every library declares classic.
        arguments.remove("x-queue-type");
        if let Some(name) = queue_type.and_then(QueueType::argument) {
            arguments.insert("x-queue-type".into(), name.into());
        }
        if let Some(queue_type) = queue_type {
            self.stream_arguments(q, queue_type, &mut arguments);
            self.replica_arguments(q, queue_type, &mut arguments);
        }
        let is_stream = queue_type == Some(QueueType::Stream);
        if q.dead_letter {
            self.dead_letter_arguments(q, is_stream, &mut arguments);
        }
        let policy = q.retry.as_ref().and_then(|policy| {
            let name = policy.get_ref().as_str();
            let found = self.policy(&format!("queue '{}'", q.name), name)?;
            if is_stream && found.max_attempts > 1 {
                self.problems.push(validate::stream_retry(&q.name, name));
                return None;
            }
            Some((name, found))
        });
        // A queue with any problem is left out, so nothing derived from a
        // half-understood queue adds noise to the problem list.
        let clean = self.problems.len() == problems_before;
        let Some(queue_type) = queue_type.filter(|_| clean) else {
            self.refused.insert(("queue", &q.name));
            return;
        };
        self.add_queue(QueueDecl {
            name: q.name.clone(),
            queue_type,
            // RabbitMQ keeps an exclusive queue only as long as its
            // connection, and stores it as transient whatever `durable`
            // said; the plan says what the broker will hold.
            durable: q.durable && !q.exclusive,
            exclusive: q.exclusive,
            auto_delete: q.auto_delete,
            arguments,
            declared_by: DeclaredBy::Topology,
        });
        if q.dead_letter {
            self.dead_letter_half(&q.name, DeclaredBy::Topology);
        }
        if let Some((name, policy)) = policy {
            self.retry_half(&q.name, name, &policy, DeclaredBy::Topology);
        }
    }

    /// Contract §2: a durable named queue is quorum; exclusive, auto-delete
    /// and transient queues are classic, and asking for quorum (or a stream)
    /// with one of those is refused, as RabbitMQ would refuse it.
    fn queue_type(&mut self, q: &QueueConfig, arguments: &Arguments) -> Option<QueueType> {
        let name = &q.name;
        let from_field = match q.queue_type.as_deref() {
            None => None,
            Some(asked) => match QueueType::parse(asked) {
                Some(t) => Some(t),
                None => {
                    let asked = format!("type = \"{asked}\"");
                    self.problems
                        .push(validate::unknown_queue_type(name, &asked));
                    return None;
                }
            },
        };
        let from_argument = match arguments.get("x-queue-type") {
            None => None,
            Some(value) => {
                let parsed = match value {
                    ArgValue::Str(asked) => QueueType::parse(asked).map(|t| (t, asked.as_str())),
                    _ => None,
                };
                if parsed.is_none() {
                    let asked = format!("x-queue-type={}", plan::rendered(value));
                    self.problems
                        .push(validate::unknown_queue_type(name, &asked));
                    return None;
                }
                parsed
            }
        };
        let asked = match (from_field, from_argument) {
            (Some(field), Some((argument, spelt))) if field != argument => {
                self.problems
                    .push(validate::queue_type_conflict(name, spelt, field));
                return None;
            }
            (field, argument) => field.or(argument.map(|(t, _)| t)),
        };
        let connection_bound: Vec<&str> = [
            (q.exclusive, "exclusive"),
            (q.auto_delete, "auto_delete"),
            (!q.durable, "durable = false"),
        ]
        .into_iter()
        .filter_map(|(set, flag)| set.then_some(flag))
        .collect();
        match asked {
            Some(t @ (QueueType::Quorum | QueueType::Stream)) if !connection_bound.is_empty() => {
                self.problems
                    .push(validate::owned_by_the_broker(name, t, &connection_bound));
                None
            }
            Some(t) => Some(t),
            None if connection_bound.is_empty() => Some(QueueType::Quorum),
            None => Some(QueueType::Classic),
        }
    }

    /// Contract §7: retention settings become stream arguments, and only
    /// when set (no library sends a segment size it was not given).
    fn stream_arguments(
        &mut self,
        q: &QueueConfig,
        queue_type: QueueType,
        arguments: &mut Arguments,
    ) {
        let name = &q.name;
        let bytes = |key: &str, value: u64| {
            i64::try_from(value)
                .map(ArgValue::Int)
                .map_err(|_| validate::too_large_for_amqp(name, key, value))
        };
        let settings = [
            (
                "max_age",
                "x-max-age",
                q.max_age.map(|age| {
                    if age < Duration::from_secs(1) {
                        Err(validate::max_age_under_a_second(name))
                    } else {
                        Ok(ArgValue::Str(naming::max_age_argument(age)))
                    }
                }),
            ),
            (
                "max_length_bytes",
                "x-max-length-bytes",
                q.max_length_bytes.map(|n| bytes("max_length_bytes", n)),
            ),
            (
                "max_segment_size_bytes",
                "x-stream-max-segment-size-bytes",
                q.max_segment_size_bytes
                    .map(|n| bytes("max_segment_size_bytes", n)),
            ),
        ];
        for (key, argument, value) in settings {
            let Some(value) = value else { continue };
            if queue_type != QueueType::Stream {
                self.problems.push(validate::stream_only(name, key));
            } else if arguments.contains_key(argument) {
                self.problems
                    .push(validate::argument_twice(name, argument, key));
            } else {
                match value {
                    Ok(value) => {
                        arguments.insert(argument.to_string(), value);
                    }
                    Err(problem) => self.problems.push(problem),
                }
            }
        }
    }

    /// `replicas` becomes the initial replica count of a quorum queue or a
    /// stream, and only when set: left out, RabbitMQ gives the queue a
    /// replica on every node, and the queue's arguments stay exactly those
    /// every AceMQ library declares.
    fn replica_arguments(
        &mut self,
        q: &QueueConfig,
        queue_type: QueueType,
        arguments: &mut Arguments,
    ) {
        let Some(replicas) = q.replicas else { return };
        let name = &q.name;
        let argument = match queue_type {
            QueueType::Quorum => "x-quorum-initial-group-size",
            QueueType::Stream => "x-initial-cluster-size",
            QueueType::Classic => {
                self.problems.push(validate::replicated_only(name));
                return;
            }
        };
        if replicas == 0 {
            self.problems.push(validate::no_replicas(name));
        } else if arguments.contains_key(argument) {
            self.problems
                .push(validate::argument_twice(name, argument, "replicas"));
        } else {
            arguments.insert(argument.to_string(), ArgValue::Int(i64::from(replicas)));
        }
    }

    /// `dead_letter = true` adds exactly the two dead-letter arguments
    /// (interop invariant 2); arguments the caller set are never merged with
    /// them (Python's rule; Ruby merges, which hides a mistake).
    fn dead_letter_arguments(
        &mut self,
        q: &QueueConfig,
        is_stream: bool,
        arguments: &mut Arguments,
    ) {
        if is_stream {
            self.problems.push(validate::stream_dead_letter(&q.name));
            return;
        }
        let set_by_caller: Vec<&str> = ["x-dead-letter-exchange", "x-dead-letter-routing-key"]
            .into_iter()
            .filter(|key| arguments.contains_key(*key))
            .collect();
        if !set_by_caller.is_empty() {
            self.problems
                .push(validate::dead_letter_conflict(&q.name, &set_by_caller));
            return;
        }
        arguments.insert(
            "x-dead-letter-exchange".into(),
            self.dead_letter_exchange.into(),
        );
        arguments.insert(
            "x-dead-letter-routing-key".into(),
            naming::dead_letter_queue(&q.name).into(),
        );
    }

    fn binding(&mut self, b: &BindingConfig) {
        let mut decl = BindingDecl {
            queue: b.queue.clone(),
            exchange: b.exchange.clone(),
            routing_key: b.routing_key.clone(),
            arguments: Arguments::new(),
            declared_by: DeclaredBy::Topology,
        };
        match arguments_from_toml(&b.arguments) {
            Ok(arguments) => {
                decl.arguments = arguments;
                self.add_binding(decl);
            }
            Err(error) => {
                let shown = validate::binding_shown(&decl);
                self.problems
                    .push(validate::unusable_arguments("binding", &shown, &error));
            }
        }
    }

    // ---- the consumer half ----

    fn consumer(&mut self, c: &ConsumerConfig) {
        let queue = c.queue.get_ref();
        if queue.trim().is_empty() {
            self.problems.push(validate::consumer_without_queue());
            return;
        }
        // `declare = false`: a login without configure permission; what the
        // consumer sets aside to must already exist. Its policy is still
        // checked.
        if c.declare {
            self.dead_letter_half(queue, DeclaredBy::Consumer);
        }
        let Some(name) = c.retry.as_ref().map(|p| p.get_ref().as_str()) else {
            return;
        };
        let Some(policy) = self.policy(&format!("the consumer of '{queue}'"), name) else {
            return;
        };
        // A stream declared here, or one declared elsewhere that the
        // consumer reads from an offset.
        let is_stream = c.offset.is_some()
            || self
                .topology
                .queue(queue)
                .is_some_and(|q| q.queue_type == QueueType::Stream);
        if is_stream && policy.max_attempts > 1 {
            self.problems.push(validate::stream_retry(queue, name));
            return;
        }
        if c.declare {
            self.retry_half(queue, name, &policy, DeclaredBy::Consumer);
        }
    }

    // ---- the managed pieces, shared by both halves ----

    /// The dead-letter exchange, `{q}.dlq`, `{q}.parked`, each bound to the
    /// exchange on its own name.
    fn dead_letter_half(&mut self, queue: &str, by: DeclaredBy) {
        let exchange = self.dead_letter_exchange;
        self.add_exchange(managed_exchange(exchange, by));
        let targets = [
            naming::dead_letter_queue(queue),
            naming::parked_queue(queue),
        ];
        for target in &targets {
            self.add_queue(holding_queue(target.clone(), by));
        }
        for target in targets {
            self.add_binding(BindingDecl {
                queue: target.clone(),
                exchange: exchange.to_string(),
                routing_key: target,
                arguments: Arguments::new(),
                declared_by: by,
            });
        }
    }

    /// `acemq.retry`, one rung per distinct broker-waited delay and the home
    /// binding back to `queue`; nothing at all when the policy never waits in
    /// the broker.
    fn retry_half(&mut self, queue: &str, policy_name: &str, policy: &RetryPolicy, by: DeclaredBy) {
        let rungs = policy.broker_rungs();
        if rungs.is_empty() {
            return;
        }
        self.add_exchange(managed_exchange(RETRY_EXCHANGE, by));
        for delay in rungs {
            match rung_queue(queue, delay, by) {
                Ok(rung) => self.add_queue(rung),
                Err(error) => self
                    .problems
                    .push(validate::rung_without_name(policy_name, &error)),
            }
        }
        self.add_binding(BindingDecl {
            queue: queue.to_string(),
            exchange: RETRY_EXCHANGE.to_string(),
            routing_key: queue.to_string(),
            arguments: Arguments::new(),
            declared_by: by,
        });
    }

    // ---- the scheduler, when the host runs it ----

    /// `acemq.schedule` (direct), its five rungs and control queue, each
    /// bound on its own name (contract §11): the scheduler's topology,
    /// declared here as a deployment's topology step declares it in every
    /// library (their control consumers declare nothing).
    fn scheduler_half(&mut self) {
        let by = DeclaredBy::Topology;
        self.add_exchange(managed_exchange(scheduler::EXCHANGE, by));
        for queue in scheduler::topology_queues() {
            let name = queue.name.clone();
            self.add_queue(queue);
            self.add_binding(BindingDecl {
                queue: name.clone(),
                exchange: scheduler::EXCHANGE.to_string(),
                routing_key: name,
                arguments: Arguments::new(),
                declared_by: by,
            });
        }
    }

    // ---- helpers ----

    /// Whether `name` is usable and this is its first `[[exchanges]]` /
    /// `[[queues]]` entry; reports a blank name, and a repeat once.
    fn named_once(&mut self, what: &'static str, name: &'a str) -> bool {
        if name.trim().is_empty() {
            self.problems.push(validate::no_name(what));
            return false;
        }
        let seen = self.listed.entry((what, name)).or_insert(0);
        *seen += 1;
        if *seen == 2 {
            self.problems.push(validate::declared_twice(what, name));
        }
        *seen == 1
    }

    fn arguments(&mut self, what: &str, name: &str, table: &toml::Table) -> Option<Arguments> {
        arguments_from_toml(table)
            .map_err(|error| {
                self.problems
                    .push(validate::unusable_arguments(what, name, &error))
            })
            .ok()
    }

    /// A policy by name; reports one that is not defined. An unusable one
    /// was reported when the policies were read.
    fn policy(&mut self, who: &str, name: &str) -> Option<RetryPolicy> {
        match self.policies.get(name) {
            Some(policy) => policy.clone(),
            None => {
                self.problems.push(validate::undefined_policy(who, name));
                None
            }
        }
    }

    fn add_exchange(&mut self, decl: ExchangeDecl) {
        merge(&mut self.topology.exchanges, decl, &mut self.problems);
    }

    fn add_queue(&mut self, decl: QueueDecl) {
        merge(&mut self.topology.queues, decl, &mut self.problems);
    }

    fn add_binding(&mut self, decl: BindingDecl) {
        merge(&mut self.topology.bindings, decl, &mut self.problems);
    }
}

/// What [`merge`] needs to know about a declaration.
trait Declaration: Clone + PartialEq {
    const WHAT: &'static str;
    /// Whether both declare the same broker object (for bindings: the same binding).
    fn same_object(&self, other: &Self) -> bool;
    fn name(&self) -> &str;
    fn detail(&self) -> String;
    fn declared_by(&mut self) -> &mut DeclaredBy;
}

/// Adds `decl` in order of first appearance. Asked for again with the same
/// settings, it is declared once by whoever asked (maybe [`DeclaredBy::Both`]);
/// with other settings, it is a problem: the broker would refuse the second.
fn merge<T: Declaration>(list: &mut Vec<T>, mut decl: T, problems: &mut Problems) {
    let Some(existing) = list.iter_mut().find(|d| d.same_object(&decl)) else {
        list.push(decl);
        return;
    };
    let mut with_same_tag = decl.clone();
    *with_same_tag.declared_by() = *existing.declared_by();
    if with_same_tag == *existing {
        let by = existing.declared_by().merge(*decl.declared_by());
        *existing.declared_by() = by;
    } else {
        problems.push(validate::declared_differently(
            T::WHAT,
            existing.name(),
            &existing.detail(),
            &decl.detail(),
        ));
    }
}

impl Declaration for ExchangeDecl {
    const WHAT: &'static str = "exchange";
    fn same_object(&self, other: &Self) -> bool {
        self.name == other.name
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn detail(&self) -> String {
        plan::exchange_detail(self)
    }
    fn declared_by(&mut self) -> &mut DeclaredBy {
        &mut self.declared_by
    }
}

impl Declaration for QueueDecl {
    const WHAT: &'static str = "queue";
    fn same_object(&self, other: &Self) -> bool {
        self.name == other.name
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn detail(&self) -> String {
        plan::queue_detail(self)
    }
    fn declared_by(&mut self) -> &mut DeclaredBy {
        &mut self.declared_by
    }
}

impl Declaration for BindingDecl {
    const WHAT: &'static str = "binding";
    /// AMQP tells bindings apart by all four parts, so two that differ in
    /// any are two bindings, never a conflict.
    fn same_object(&self, other: &Self) -> bool {
        self.queue == other.queue
            && self.exchange == other.exchange
            && self.routing_key == other.routing_key
            && self.arguments == other.arguments
    }
    fn name(&self) -> &str {
        &self.queue
    }
    fn detail(&self) -> String {
        plan::binding_detail(self)
    }
    fn declared_by(&mut self) -> &mut DeclaredBy {
        &mut self.declared_by
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::retry::contract_fixture::{load, millis, millis_list};
    use serde_json::Value;

    pub(crate) fn build(text: &str) -> Result<Topology, Problems> {
        let config: Config = toml::from_str(text).expect("test config parses");
        Topology::from_config(&config)
    }

    /// The fixture's topology, written as this host's config.
    pub(crate) const FIXTURE_CONFIG: &str = r#"
        [[exchanges]]
        name = "orders"
        kind = "topic"

        [[queues]]
        name = "orders.new"
        dead_letter = true

        [[bindings]]
        queue = "orders.new"
        exchange = "orders"
        routing_key = "order.*"

        [retry.orders]
        kind = "exponential"
        attempts = 6
        initial = "10s"
        max = "5m"

        [[consumers]]
        queue = "orders.new"
        plugin = "orders.wasm"
        retry = "orders"
    "#;

    /// A fixture argument table (numbers are integer milliseconds).
    fn fixture_arguments(value: &Value) -> Arguments {
        value
            .as_object()
            .unwrap()
            .iter()
            .map(|(key, v)| {
                let v = match v {
                    Value::String(s) => ArgValue::Str(s.clone()),
                    Value::Number(n) => ArgValue::Int(n.as_i64().unwrap()),
                    other => panic!("unexpected fixture argument {other}"),
                };
                (key.clone(), v)
            })
            .collect()
    }

    fn declared_by(value: &Value) -> DeclaredBy {
        match value.as_str().unwrap() {
            "topology" => DeclaredBy::Topology,
            "consumer" => DeclaredBy::Consumer,
            "both" => DeclaredBy::Both,
            other => panic!("unknown declaredBy {other}"),
        }
    }

    #[test]
    fn fixture_topology() {
        let fixture = load();
        let expected = &fixture["topology"];
        let topology = build(FIXTURE_CONFIG).unwrap();

        let policy = RetryPolicy::exponential(6, Duration::from_secs(10), Duration::from_secs(300));
        assert_eq!(
            policy.schedule(),
            millis_list(&expected["policyScheduleMillis"])
        );
        assert_eq!(
            policy.broker_rungs(),
            millis_list(&expected["policyRungDelaysMillis"])
        );

        let exchanges = expected["exchanges"].as_array().unwrap();
        assert_eq!(topology.exchanges.len(), exchanges.len());
        for (got, want) in topology.exchanges.iter().zip(exchanges) {
            assert_eq!(got.name, want["name"].as_str().unwrap());
            assert_eq!(
                got.kind.as_str(),
                want["type"].as_str().unwrap(),
                "{}",
                got.name
            );
            assert_eq!(
                got.durable,
                want["durable"].as_bool().unwrap(),
                "{}",
                got.name
            );
            assert!(!got.auto_delete && got.arguments.is_empty(), "{}", got.name);
            assert_eq!(
                got.declared_by,
                declared_by(&want["declaredBy"]),
                "{}",
                got.name
            );
        }

        let queues = expected["queues"].as_array().unwrap();
        assert_eq!(topology.queues.len(), queues.len());
        for (got, want) in topology.queues.iter().zip(queues) {
            let name = want["name"].as_str().unwrap();
            assert_eq!(got.name, name);
            assert_eq!(
                got.queue_type.as_str(),
                want["type"].as_str().unwrap(),
                "{name}"
            );
            assert_eq!(got.durable, want["durable"].as_bool().unwrap(), "{name}");
            assert!(!got.exclusive && !got.auto_delete, "{name}");
            // The fixture lists arguments apart from the type; what is sent
            // is both, and classic sends no x-queue-type at all.
            let mut sent = fixture_arguments(&want["arguments"]);
            if let Some(t) = got.queue_type.argument() {
                sent.insert("x-queue-type".into(), t.into());
            }
            assert_eq!(got.arguments, sent, "{name}");
            assert_eq!(got.declared_by, declared_by(&want["declaredBy"]), "{name}");
        }

        let bindings = expected["bindings"].as_array().unwrap();
        assert_eq!(topology.bindings.len(), bindings.len());
        for (got, want) in topology.bindings.iter().zip(bindings) {
            assert_eq!(got.queue, want["queue"].as_str().unwrap());
            assert_eq!(
                got.exchange,
                want["exchange"].as_str().unwrap(),
                "{}",
                got.queue
            );
            assert_eq!(
                got.routing_key,
                want["routingKey"].as_str().unwrap(),
                "{}",
                got.queue
            );
            assert!(got.arguments.is_empty());
            assert_eq!(
                got.declared_by,
                declared_by(&want["declaredBy"]),
                "{}",
                got.queue
            );
        }
        assert_eq!(expected["sourceQueue"], "orders.new");
    }

    #[test]
    fn fixture_rung_arguments() {
        let fixture = load();
        for row in fixture["rungArguments"].as_array().unwrap() {
            let delay = millis(&row["delayMillis"]);
            let expected_name = row["queue"].as_str().unwrap();
            match rung_queue("orders.new", delay, DeclaredBy::Consumer) {
                Ok(rung) => {
                    assert_eq!(rung.name, expected_name);
                    assert_eq!(rung.arguments.len(), 3, "{expected_name}");
                    assert_eq!(rung.arguments, fixture_arguments(&row["arguments"]));
                    assert!(matches!(rung.arguments["x-message-ttl"], ArgValue::Int(_)));
                    assert_eq!(rung.queue_type, QueueType::Classic);
                    assert!(rung.durable && !rung.exclusive && !rung.auto_delete);
                }
                // Only the sub-second row, whose name the libraries disagree on.
                Err(_) => assert_eq!(delay, Duration::from_millis(500)),
            }
        }
    }

    /// The fixture has no scheduler rows; what it has that applies: the
    /// rung arguments' names and value types (a TTL as an integer, the
    /// dead-letter exchange and key as strings), the rung queue type, and
    /// "every declared queue is durable".
    #[test]
    fn the_scheduler_half_is_exactly_the_contract_and_shaped_as_the_fixture_rungs() {
        let fixture = load();
        let retry_rung = fixture_arguments(&fixture["rungArguments"][0]["arguments"]);
        let topology = build("[scheduler]\nenabled = true\n").unwrap();
        let exchange = topology.exchange("acemq.schedule").unwrap();
        assert_eq!(exchange.kind, ExchangeKind::Direct);
        assert!(exchange.durable && !exchange.auto_delete && exchange.arguments.is_empty());
        let names: Vec<&str> = topology.queues.iter().map(|q| q.name.as_str()).collect();
        assert_eq!(names, scheduler::queue_names());
        let rung_type = fixture["queueTypeDefaults"]["retryRung"].as_str().unwrap();
        for queue in &topology.queues {
            assert_eq!(queue.queue_type.as_str(), rung_type, "{}", queue.name);
            assert_eq!(
                queue.durable,
                fixture["queueTypeDefaults"]["durability"]["everyDeclaredQueueIsDurable"]
                    .as_bool()
                    .unwrap()
            );
            if queue.name == scheduler::DUE_QUEUE {
                assert!(queue.arguments.is_empty());
                continue;
            }
            let keys: Vec<&String> = queue.arguments.keys().collect();
            assert_eq!(
                keys,
                retry_rung.keys().collect::<Vec<_>>(),
                "{}",
                queue.name
            );
            for (key, value) in &queue.arguments {
                assert_eq!(
                    std::mem::discriminant(value),
                    std::mem::discriminant(&retry_rung[key]),
                    "{} {key}",
                    queue.name
                );
            }
            assert_eq!(
                queue.arguments["x-dead-letter-exchange"],
                "acemq.schedule".into()
            );
            assert_eq!(
                queue.arguments["x-dead-letter-routing-key"],
                "acemq.schedule.due".into()
            );
        }
        let ttls: Vec<&ArgValue> = topology
            .queues
            .iter()
            .filter_map(|q| q.arguments.get("x-message-ttl"))
            .collect();
        assert_eq!(
            ttls,
            [3_600_000, 600_000, 60_000, 10_000, 1_000]
                .map(ArgValue::Int)
                .iter()
                .collect::<Vec<_>>()
        );
        for binding in &topology.bindings {
            assert_eq!(binding.exchange, "acemq.schedule");
            assert_eq!(binding.routing_key, binding.queue, "bound on its own name");
        }
        assert_eq!(topology.bindings.len(), 6);
        // Off unless asked for, or implied by a consumer.
        assert!(build("").unwrap().queues.is_empty());
    }

    #[test]
    fn fixture_queue_type_defaults() {
        let fixture = load();
        let defaults = &fixture["queueTypeDefaults"];
        let topology = build(
            r#"
            [[queues]]
            name = "source"
            [[queues]]
            name = "with-dl"
            dead_letter = true
            [[queues]]
            name = "classic"
            type = "classic"
            [[queues]]
            name = "classic-with-dl"
            type = "classic"
            dead_letter = true
            [retry.slow]
            kind = "fixed"
            attempts = 2
            initial = "1m"
            [[consumers]]
            queue = "source"
            plugin = "p.wasm"
            retry = "slow"
            "#,
        )
        .unwrap();
        let type_of = |name: &str| topology.queue(name).unwrap().queue_type.as_str();
        for (key, queue) in [
            ("sourceQueue", "source"),
            ("sourceQueueWithDeadLetter", "with-dl"),
            ("explicitClassicQueue", "classic"),
            ("explicitClassicQueueWithDeadLetter", "classic-with-dl"),
            ("deadLetterQueue", "source.dlq"),
            ("parkedQueue", "source.parked"),
            ("retryRung", "source.retry.1m"),
        ] {
            assert_eq!(type_of(queue), defaults[key].as_str().unwrap(), "{key}");
        }
        assert!(
            defaults["durability"]["everyDeclaredQueueIsDurable"]
                .as_bool()
                .unwrap()
        );
        for q in &topology.queues {
            assert!(q.durable, "{}", q.name);
            // Invariant 1: classic never sends x-queue-type; quorum always does.
            let sent = q.arguments.get("x-queue-type");
            assert_eq!(
                sent,
                q.queue_type.argument().map(ArgValue::from).as_ref(),
                "{}",
                q.name
            );
        }
        let classic_dl = topology.queue("classic-with-dl").unwrap();
        assert_eq!(
            classic_dl.arguments,
            Arguments::from([
                ("x-dead-letter-exchange".to_string(), "acemq.dlx".into()),
                (
                    "x-dead-letter-routing-key".to_string(),
                    "classic-with-dl.dlq".into()
                ),
            ])
        );
    }

    #[test]
    fn exclusive_auto_delete_and_transient_queues_stay_classic() {
        let topology = build(
            r#"
            [[queues]]
            name = "mine"
            exclusive = true
            [[queues]]
            name = "gone"
            auto_delete = true
            [[queues]]
            name = "light"
            durable = false
            "#,
        )
        .unwrap();
        for q in &topology.queues {
            assert_eq!(q.queue_type, QueueType::Classic, "{}", q.name);
            assert!(q.arguments.is_empty(), "{}", q.name);
        }
    }

    #[test]
    fn classic_is_never_sent_even_when_written() {
        let topology = build(
            "[[queues]]\nname = \"q\"\narguments = { x-queue-type = \"classic\", x-max-length = 10 }\n",
        )
        .unwrap();
        let q = topology.queue("q").unwrap();
        assert_eq!(q.queue_type, QueueType::Classic);
        assert_eq!(
            q.arguments,
            Arguments::from([("x-max-length".to_string(), ArgValue::Int(10))])
        );
    }

    #[test]
    fn replicas_are_sent_only_when_set_under_each_types_name() {
        let topology = build(
            r#"
            [[queues]]
            name = "everywhere"
            [[queues]]
            name = "two"
            replicas = 2
            [[queues]]
            name = "log"
            type = "stream"
            replicas = 3
            "#,
        )
        .unwrap();
        let everywhere = topology.queue("everywhere").unwrap();
        assert_eq!(
            everywhere.arguments,
            Arguments::from([("x-queue-type".to_string(), "quorum".into())])
        );
        let two = topology.queue("two").unwrap();
        assert_eq!(
            two.arguments.get("x-quorum-initial-group-size"),
            Some(&ArgValue::Int(2))
        );
        let log = topology.queue("log").unwrap();
        assert_eq!(
            log.arguments.get("x-initial-cluster-size"),
            Some(&ArgValue::Int(3))
        );
    }

    #[test]
    fn streams_send_their_retention_only_when_set() {
        let topology = build(
            r#"
            [[queues]]
            name = "events"
            type = "stream"
            max_age = "7days"
            max_length_bytes = 20000000000

            [[queues]]
            name = "audit"
            arguments = { x-queue-type = "stream" }
            max_age = "90m 500ms"
            max_segment_size_bytes = 100000000

            [[consumers]]
            queue = "events"
            plugin = "p.wasm"
            "#,
        )
        .unwrap();
        let events = topology.queue("events").unwrap();
        assert_eq!(events.queue_type, QueueType::Stream);
        assert!(events.durable && !events.exclusive && !events.auto_delete);
        assert_eq!(
            events.arguments,
            Arguments::from([
                ("x-queue-type".to_string(), "stream".into()),
                ("x-max-age".to_string(), "7D".into()),
                (
                    "x-max-length-bytes".to_string(),
                    ArgValue::Int(20_000_000_000)
                ),
            ])
        );
        let audit = topology.queue("audit").unwrap();
        assert_eq!(
            audit.arguments,
            Arguments::from([
                ("x-queue-type".to_string(), "stream".into()),
                ("x-max-age".to_string(), "90m".into()),
                (
                    "x-stream-max-segment-size-bytes".to_string(),
                    ArgValue::Int(100_000_000)
                ),
            ])
        );
        // A stream consumer still gets its dead-letter and parked queues (§7).
        assert!(
            topology.queue("events.dlq").is_some() && topology.queue("events.parked").is_some()
        );
    }

    #[test]
    fn the_consumer_half_alone_is_tagged_consumer() {
        // The consumer's queue belongs to another service: that is fine.
        let topology = build(
            r#"
            [retry.slow]
            kind = "fixed"
            attempts = 3
            initial = "45s"
            [[consumers]]
            queue = "elsewhere"
            plugin = "p.wasm"
            retry = "slow"
            "#,
        )
        .unwrap();
        assert!(topology.queue("elsewhere").is_none());
        let names: Vec<&str> = topology.queues.iter().map(|q| q.name.as_str()).collect();
        assert_eq!(
            names,
            ["elsewhere.dlq", "elsewhere.parked", "elsewhere.retry.45s"]
        );
        let exchanges: Vec<&str> = topology.exchanges.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(exchanges, ["acemq.dlx", "acemq.retry"]);
        assert_eq!(topology.bindings.len(), 3);
        assert!(
            topology
                .exchanges
                .iter()
                .all(|e| e.declared_by == DeclaredBy::Consumer)
        );
        assert!(
            topology
                .queues
                .iter()
                .all(|q| q.declared_by == DeclaredBy::Consumer)
        );
        assert!(
            topology
                .bindings
                .iter()
                .all(|b| b.declared_by == DeclaredBy::Consumer)
        );
    }

    #[test]
    fn a_consumer_reading_an_offset_is_a_stream_consumer_and_takes_no_retry_policy() {
        // The stream is another service's: only the offset says it is one.
        let problems = build(
            r#"
            [retry.r]
            kind = "fixed"
            attempts = 3
            initial = "1s"
            [[consumers]]
            queue = "s"
            plugin = "p.wasm"
            offset = "first"
            retry = "r"
            "#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            problems.contains(
                "acemq: stream 's' is given retry policy 'r'; a stream never removes a message"
            ),
            "{problems}"
        );
    }

    #[test]
    fn a_consumer_that_may_not_declare_adds_nothing_but_is_still_checked() {
        let topology = build(
            r#"
            [retry.r]
            kind = "exponential"
            attempts = 5
            initial = "1m"
            max = "10m"
            [[consumers]]
            queue = "q"
            plugin = "p.wasm"
            retry = "r"
            declare = false
            "#,
        )
        .unwrap();
        assert!(
            topology.queues.is_empty() && topology.exchanges.is_empty(),
            "{topology:?}"
        );
        let problems = build(
            r#"
            [retry.r]
            kind = "fixed"
            attempts = 3
            initial = "1s"
            [[consumers]]
            queue = "s"
            plugin = "p.wasm"
            offset = "first"
            retry = "r"
            declare = false
            "#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            problems.contains("stream 's' is given retry policy 'r'"),
            "{problems}"
        );
    }

    #[test]
    fn a_policy_without_broker_waits_declares_no_rungs() {
        let topology = build(
            r#"
            [retry.quick]
            kind = "exponential"
            attempts = 5
            initial = "1s"
            max = "24h"
            [[consumers]]
            queue = "q"
            plugin = "p.wasm"
            retry = "quick"
            "#,
        )
        .unwrap();
        assert!(topology.exchange(RETRY_EXCHANGE).is_none());
        assert_eq!(topology.queues.len(), 2);
        assert_eq!(topology.bindings.len(), 2);
    }

    #[test]
    fn rungs_asked_by_the_queue_and_its_consumer_are_declared_once() {
        let topology = build(
            r#"
            [retry.slow]
            kind = "exponential"
            attempts = 4
            initial = "30s"
            max = "1m"
            [retry.slower]
            kind = "fixed"
            attempts = 2
            initial = "2h"
            [[queues]]
            name = "q"
            retry = "slow"
            [[consumers]]
            queue = "q"
            plugin = "p.wasm"
            retry = "slower"
            "#,
        )
        .unwrap();
        let rungs: Vec<(&str, DeclaredBy)> = topology
            .queues
            .iter()
            .filter(|q| q.name.contains(".retry."))
            .map(|q| (q.name.as_str(), q.declared_by))
            .collect();
        assert_eq!(
            rungs,
            [
                ("q.retry.30s", DeclaredBy::Topology),
                ("q.retry.1m", DeclaredBy::Topology),
                ("q.retry.2h", DeclaredBy::Consumer),
            ]
        );
        assert_eq!(
            topology.exchange(RETRY_EXCHANGE).unwrap().declared_by,
            DeclaredBy::Both
        );
        let home: Vec<_> = topology
            .bindings
            .iter()
            .filter(|b| b.exchange == RETRY_EXCHANGE)
            .collect();
        assert_eq!(home.len(), 1);
        assert_eq!(home[0].declared_by, DeclaredBy::Both);
        // The topology half declares no dead-letter queues unless asked; the consumer does.
        assert_eq!(
            topology.queue("q.dlq").unwrap().declared_by,
            DeclaredBy::Consumer
        );
    }

    #[test]
    fn a_renamed_dead_letter_exchange_is_used_everywhere() {
        let topology = build(
            r#"
            [topology]
            dead_letter_exchange = "shop.dlx"
            [[queues]]
            name = "q"
            dead_letter = true
            [[consumers]]
            queue = "q"
            plugin = "p.wasm"
            "#,
        )
        .unwrap();
        assert_eq!(topology.exchanges.len(), 1);
        assert_eq!(topology.exchanges[0].name, "shop.dlx");
        assert_eq!(topology.exchanges[0].declared_by, DeclaredBy::Both);
        assert_eq!(
            topology.queue("q").unwrap().arguments["x-dead-letter-exchange"],
            ArgValue::from("shop.dlx")
        );
        assert!(topology.bindings.iter().all(|b| b.exchange == "shop.dlx"));
    }

    #[test]
    fn an_identical_explicit_declaration_merges() {
        let topology = build(
            r#"
            [[exchanges]]
            name = "acemq.dlx"
            kind = "direct"
            [[queues]]
            name = "q.dlq"
            type = "classic"
            [[consumers]]
            queue = "q"
            plugin = "p.wasm"
            "#,
        )
        .unwrap();
        assert_eq!(
            topology.exchange("acemq.dlx").unwrap().declared_by,
            DeclaredBy::Both
        );
        assert_eq!(
            topology.queue("q.dlq").unwrap().declared_by,
            DeclaredBy::Both
        );
    }
}
