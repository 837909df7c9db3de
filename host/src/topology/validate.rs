//! Why a topology cannot be applied: the problem list, every sentence a
//! refusal uses, and the checks that need the whole finished topology.
//!
//! All problems are collected before anything is refused (as Ruby's
//! `Topology#problems` does), so one run of the host shows an operator
//! everything to fix. Wordings follow the Python/Go libraries where the
//! contract gives one, with their option names replaced by this host's
//! config keys.

use std::collections::HashSet;
use std::fmt;

use super::model::{ArgValue, Arguments, BindingDecl, DeclaredBy, QueueType, Topology};

/// The longest name AMQP can carry (a short string): queue, exchange and
/// argument names and routing keys.
pub const MAX_NAME_BYTES: usize = 255;

/// Every reason a topology cannot be applied, in the order they were found,
/// each with the config entry it was found in (when it has one), so that
/// the operator is shown the file's line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Problems {
    list: Vec<Problem>,
    /// The entry being read: problems pushed now are found in it.
    current: Option<Entry>,
}

/// One problem, and where in the config it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub at: Option<Entry>,
    pub text: String,
}

/// Where a problem was found: a place in the config file (the config's
/// own type, so that it reads a line for it without knowing topologies).
pub use crate::config::Entry;

impl Problems {
    pub fn push(&mut self, problem: impl Into<String>) {
        self.list.push(Problem {
            at: self.current.clone(),
            text: problem.into(),
        });
    }

    /// Problems pushed from now on were found in `entry` (`None`: in the
    /// topology as a whole).
    pub fn reading(&mut self, entry: Option<Entry>) {
        self.current = entry;
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Problem> {
        self.list.iter()
    }

    /// The sentences alone, in order.
    pub fn texts(&self) -> Vec<String> {
        self.list.iter().map(|p| p.text.clone()).collect()
    }

    /// One line per problem, each led by `file:line` where it was found in
    /// `config`.
    pub fn located_in(&self, config: &crate::config::LoadedConfig) -> String {
        self.located(&config.path.display().to_string(), |entry| {
            config.line_of_entry(entry)
        })
    }

    /// One line per problem, each led by `where(entry)` (such as
    /// `host.toml:12`) when the problem has an entry and it is found, else
    /// by `file`.
    pub fn located(&self, file: &str, line_of: impl Fn(&Entry) -> Option<usize>) -> String {
        let mut out = String::from("this topology cannot be applied:");
        for problem in &self.list {
            match problem.at.as_ref().and_then(&line_of) {
                Some(line) => out.push_str(&format!("\n  {file}:{line}: {}", problem.text)),
                None => out.push_str(&format!("\n  {file}: {}", problem.text)),
            }
        }
        out
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "this topology cannot be applied:")?;
        for problem in &self.list {
            write!(f, "\n  {}", problem.text)?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

/// A binding as the contract's messages show it: `{exchange} -> {queue} ({routing_key})`.
pub(crate) fn binding_shown(b: &BindingDecl) -> String {
    format!("{} -> {} ({})", b.exchange, b.queue, b.routing_key)
}

// ---- Sentences used while the config is read (build.rs) -------------------

pub(crate) fn no_name(what: &str) -> String {
    format!(
        "acemq: {} {what} in the topology has no name",
        article(what)
    )
}

pub(crate) fn declared_twice(what: &str, name: &str) -> String {
    format!("acemq: the topology declares {what} '{name}' twice")
}

/// The same name asked for with two different settings, typically a queue in
/// `[[queues]]` that AceMQ also declares itself (`{q}.dlq`, a rung).
pub(crate) fn declared_differently(what: &str, name: &str, first: &str, second: &str) -> String {
    format!(
        "acemq: {what} '{name}' is declared twice with different settings, ({first}) and \
         ({second}); the broker keeps only the first, so the second would fail with \
         PRECONDITION_FAILED"
    )
}

pub(crate) fn exchange_without_kind(name: &str) -> String {
    format!("acemq: exchange '{name}' has no kind (direct, topic, fanout or headers)")
}

pub(crate) fn unknown_exchange_kind(name: &str, kind: &str) -> String {
    format!(
        "acemq: exchange '{name}' has kind '{kind}', which is not one of direct, topic, fanout or headers"
    )
}

pub(crate) fn unusable_arguments(what: &str, name: &str, error: &str) -> String {
    format!("acemq: {what} '{name}' has an unusable {error}")
}

/// `asked` is how the config spelt it, e.g. `type = "fancy"` or `x-queue-type=5`.
pub(crate) fn unknown_queue_type(name: &str, asked: &str) -> String {
    format!("acemq: queue '{name}' asks for {asked}, which is not quorum, classic or stream")
}

pub(crate) fn queue_type_conflict(name: &str, argument: &str, field: QueueType) -> String {
    format!(
        "acemq: queue '{name}' sets x-queue-type='{argument}' and also type = \"{}\"; pick one",
        field.as_str()
    )
}

/// A quorum queue or a stream asked to be exclusive, auto-delete or
/// transient, which RabbitMQ refuses for both. `flags` are the config keys.
pub(crate) fn owned_by_the_broker(name: &str, queue_type: QueueType, flags: &[&str]) -> String {
    let (asks, a_thing) = match queue_type {
        QueueType::Stream => ("a stream", "a stream"),
        _ => ("quorum", "a quorum queue"),
    };
    format!(
        "acemq: queue '{name}' asks for {asks} and also {}; {a_thing} belongs to the broker \
         rather than to a connection, so it can be none of those",
        listed(flags)
    )
}

pub(crate) fn dead_letter_conflict(name: &str, keys: &[&str]) -> String {
    format!(
        "acemq: queue '{name}' asks for dead_letter = true and also sets {}; pick one",
        listed(keys)
    )
}

pub(crate) fn stream_dead_letter(name: &str) -> String {
    format!(
        "acemq: queue '{name}' is a stream and asks for dead_letter = true; a stream never \
         dead-letters (it keeps every message in its log), so it takes no x-dead-letter-* \
         arguments. A consumer of the stream still declares {name}.dlq and {name}.parked for \
         what it rejects or parks"
    )
}

/// Python's `StreamRetryError` reasoning, given when the config is read
/// rather than when the first message fails.
pub(crate) fn stream_retry(name: &str, policy: &str) -> String {
    format!(
        "acemq: stream '{name}' is given retry policy '{policy}'; a stream never removes a \
         message, so retrying one means appending a second copy of it to the log for every \
         other consumer to read as well. Park or reject failures instead, and leave retry out"
    )
}

pub(crate) fn stream_only(name: &str, key: &str) -> String {
    format!("acemq: queue '{name}' sets {key}, which only applies to a stream (type = \"stream\")")
}

pub(crate) fn replicated_only(name: &str) -> String {
    format!(
        "acemq: queue '{name}' sets replicas, which only applies to a quorum queue or a stream; \
         a classic queue lives on one node"
    )
}

pub(crate) fn no_replicas(name: &str) -> String {
    format!("acemq: queue '{name}' sets replicas = 0; a queue needs at least one")
}

pub(crate) fn argument_twice(name: &str, argument: &str, key: &str) -> String {
    format!("acemq: queue '{name}' sets {argument} in arguments and also {key}; pick one")
}

pub(crate) fn max_age_under_a_second(name: &str) -> String {
    format!(
        "acemq: queue '{name}' has a max_age under one second; x-max-age counts whole seconds, \
         so the stream would keep nothing"
    )
}

pub(crate) fn too_large_for_amqp(name: &str, key: &str, value: u64) -> String {
    format!(
        "acemq: queue '{name}' sets {key} = {value}, more than the signed 64-bit integer AMQP \
         sends it as"
    )
}

/// `who` is e.g. `queue 'orders'` or `the consumer of 'orders'`.
pub(crate) fn undefined_policy(who: &str, policy: &str) -> String {
    format!(
        "acemq: {who} names retry policy '{policy}', which is not defined (add [retry.{policy}])"
    )
}

pub(crate) fn blank_dead_letter_exchange() -> String {
    "acemq: [topology] dead_letter_exchange is empty; leave it out to use acemq.dlx".to_string()
}

pub(crate) fn consumer_without_queue() -> String {
    "acemq: a consumer in the config names no queue".to_string()
}

pub(crate) fn rung_without_name(policy: &str, error: &str) -> String {
    format!("acemq: retry policy '{policy}': {error}")
}

// ---- Checks over the finished topology -------------------------------------

/// Checks that need every declaration in place: bindings must name what the
/// topology declares, and every name must fit AMQP and the broker's rules.
///
/// Bindings only a consumer declares are not resolved: a consumer's home
/// binding names its source queue, which may belong to another service.
/// Nor are references to `refused` `(what, name)`s, listed in the config
/// but left out for a problem already reported.
pub(crate) fn check_finished(
    topology: &Topology,
    refused: &HashSet<(&'static str, &str)>,
    origins: &Origins,
    problems: &mut Problems,
) {
    for e in &topology.exchanges {
        problems.reading(origins.of("exchange", &e.name));
        check_name("exchange", &e.name, problems);
        check_argument_names("exchange", &e.name, &e.arguments, problems);
    }
    for q in &topology.queues {
        problems.reading(origins.of("queue", &q.name));
        check_name("queue", &q.name, problems);
        check_argument_names("queue", &q.name, &q.arguments, problems);
    }
    for b in &topology.bindings {
        let shown = binding_shown(b);
        problems.reading(origins.of("binding", &shown));
        if b.declared_by != DeclaredBy::Consumer {
            if b.exchange.is_empty() {
                problems.push(format!(
                    "acemq: binding {shown} names the default exchange, which cannot be bound to"
                ));
            } else if topology.exchange(&b.exchange).is_none()
                && !refused.contains(&("exchange", b.exchange.as_str()))
            {
                problems.push(format!(
                    "acemq: binding {shown} names exchange '{}', which this topology does not declare",
                    b.exchange
                ));
            }
            if topology.queue(&b.queue).is_none() && !refused.contains(&("queue", b.queue.as_str()))
            {
                problems.push(format!(
                    "acemq: binding {shown} names queue '{}', which this topology does not declare",
                    b.queue
                ));
            }
        }
        if b.routing_key.len() > MAX_NAME_BYTES {
            problems.push(format!(
                "acemq: binding {shown} has a routing key of {} bytes; AMQP allows at most {MAX_NAME_BYTES}",
                b.routing_key.len()
            ));
        }
        check_argument_names("binding", &shown, &b.arguments, problems);
    }
    problems.reading(None);
}

/// The config entry each exchange, queue and binding (as
/// [`binding_shown`] writes it) was first written in. Declarations AceMQ
/// adds itself (`.dlq`, rungs) have none.
#[derive(Debug, Default)]
pub(crate) struct Origins(std::collections::HashMap<(&'static str, String), Entry>);

impl Origins {
    pub(crate) fn note(&mut self, what: &'static str, name: &str, entry: Option<Entry>) {
        if let Some(entry) = entry {
            self.0.entry((what, name.to_string())).or_insert(entry);
        }
    }

    fn of(&self, what: &'static str, name: &str) -> Option<Entry> {
        self.0.get(&(what, name.to_string())).cloned()
    }
}

fn check_name(what: &str, name: &str, problems: &mut Problems) {
    if name.len() > MAX_NAME_BYTES {
        problems.push(format!(
            "acemq: {what} '{name}' has a name of {} bytes; AMQP allows at most {MAX_NAME_BYTES}",
            name.len()
        ));
    }
    // RabbitMQ answers ACCESS_REFUSED to declaring such a name.
    if name.starts_with("amq.") {
        problems.push(format!(
            "acemq: {what} '{name}' cannot be declared: the broker reserves names starting with 'amq.'"
        ));
    }
}

/// Argument names travel as AMQP short strings too, nested tables included.
fn check_argument_names(what: &str, name: &str, arguments: &Arguments, problems: &mut Problems) {
    for (key, value) in arguments {
        if key.len() > MAX_NAME_BYTES {
            problems.push(format!(
                "acemq: {what} '{name}' has an argument named '{key}' of {} bytes; AMQP allows at most {MAX_NAME_BYTES}",
                key.len()
            ));
        }
        if let ArgValue::Table(nested) = value {
            check_argument_names(what, name, nested, problems);
        }
    }
}

fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// `a`, `a and b`, `a, b and c`.
fn listed(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::topology::build::tests::build;

    fn problems(text: &str) -> Vec<String> {
        build(text).expect_err("should be refused").texts()
    }

    #[test]
    fn problems_display_one_per_indented_line() {
        let mut problems = Problems::default();
        problems.reading(Some(Entry::Item {
            table: "queues",
            index: 1,
        }));
        problems.push("first");
        problems.reading(None);
        problems.push("second");
        assert_eq!(
            problems.to_string(),
            "this topology cannot be applied:\n  first\n  second"
        );
        let located = problems.located("host.toml", |entry| match entry {
            Entry::Item { index, .. } => Some(10 + index),
            Entry::Table(_) => None,
        });
        assert_eq!(
            located,
            "this topology cannot be applied:\n  host.toml:11: first\n  host.toml: second"
        );
    }

    #[test]
    fn lists_read_as_english() {
        assert_eq!(listed(&["exclusive"]), "exclusive");
        assert_eq!(
            listed(&["exclusive", "auto_delete"]),
            "exclusive and auto_delete"
        );
        assert_eq!(listed(&["a", "b", "c"]), "a, b and c");
    }

    #[test]
    fn blank_names_use_the_go_wording() {
        assert_eq!(
            no_name("queue"),
            "acemq: a queue in the topology has no name"
        );
        assert_eq!(
            no_name("exchange"),
            "acemq: an exchange in the topology has no name"
        );
    }

    #[test]
    fn each_problem_is_worded_for_the_operator() {
        let cases: &[(&str, &str)] = &[
            (
                "[[queues]]\nname = \"\"",
                "acemq: a queue in the topology has no name",
            ),
            (
                "[[exchanges]]\nkind = \"topic\"",
                "acemq: an exchange in the topology has no name",
            ),
            (
                "[[queues]]\nname = \"q\"\n[[queues]]\nname = \"q\"",
                "acemq: the topology declares queue 'q' twice",
            ),
            (
                "[[exchanges]]\nname = \"e\"\nkind = \"topic\"\n[[exchanges]]\nname = \"e\"\nkind = \"topic\"",
                "acemq: the topology declares exchange 'e' twice",
            ),
            (
                "[[exchanges]]\nname = \"e\"",
                "acemq: exchange 'e' has no kind (direct, topic, fanout or headers)",
            ),
            (
                "[[exchanges]]\nname = \"e\"\nkind = \"x-delayed-message\"",
                "acemq: exchange 'e' has kind 'x-delayed-message', which is not one of direct, topic, fanout or headers",
            ),
            (
                "[[queues]]\nname = \"q\"\n[[bindings]]\nqueue = \"q\"\nexchange = \"missing\"\nrouting_key = \"k\"",
                "acemq: binding missing -> q (k) names exchange 'missing', which this topology does not declare",
            ),
            (
                "[[exchanges]]\nname = \"e\"\nkind = \"topic\"\n[[bindings]]\nqueue = \"missing\"\nexchange = \"e\"\nrouting_key = \"k\"",
                "acemq: binding e -> missing (k) names queue 'missing', which this topology does not declare",
            ),
            (
                "[[queues]]\nname = \"q\"\n[[bindings]]\nqueue = \"q\"\nexchange = \"\"\nrouting_key = \"q\"",
                "acemq: binding  -> q (q) names the default exchange, which cannot be bound to",
            ),
            (
                "[[queues]]\nname = \"q\"\ntype = \"quorum\"\nexclusive = true",
                "acemq: queue 'q' asks for quorum and also exclusive; a quorum queue belongs to the broker rather than to a connection, so it can be none of those",
            ),
            (
                "[[queues]]\nname = \"q\"\narguments = { x-queue-type = \"quorum\" }\nauto_delete = true\ndurable = false",
                "acemq: queue 'q' asks for quorum and also auto_delete and durable = false; a quorum queue belongs to the broker rather than to a connection, so it can be none of those",
            ),
            (
                "[[queues]]\nname = \"s\"\ntype = \"stream\"\nexclusive = true",
                "acemq: queue 's' asks for a stream and also exclusive; a stream belongs to the broker rather than to a connection, so it can be none of those",
            ),
            (
                "[[queues]]\nname = \"q\"\ntype = \"quorum\"\narguments = { x-queue-type = \"stream\" }",
                "acemq: queue 'q' sets x-queue-type='stream' and also type = \"quorum\"; pick one",
            ),
            (
                "[[queues]]\nname = \"q\"\ntype = \"lazy\"",
                "acemq: queue 'q' asks for type = \"lazy\", which is not quorum, classic or stream",
            ),
            (
                "[[queues]]\nname = \"q\"\narguments = { x-queue-type = 1 }",
                "acemq: queue 'q' asks for x-queue-type=1, which is not quorum, classic or stream",
            ),
            (
                "[[queues]]\nname = \"q\"\ndead_letter = true\narguments = { x-dead-letter-exchange = \"mine\" }",
                "acemq: queue 'q' asks for dead_letter = true and also sets x-dead-letter-exchange; pick one",
            ),
            (
                "[[queues]]\nname = \"s\"\ntype = \"stream\"\ndead_letter = true",
                "acemq: queue 's' is a stream and asks for dead_letter = true;",
            ),
            (
                "[[queues]]\nname = \"q\"\nmax_age = \"1day\"",
                "acemq: queue 'q' sets max_age, which only applies to a stream (type = \"stream\")",
            ),
            (
                "[[queues]]\nname = \"s\"\ntype = \"stream\"\nmax_age = \"1h\"\narguments = { x-max-age = \"2h\" }",
                "acemq: queue 's' sets x-max-age in arguments and also max_age; pick one",
            ),
            (
                "[[queues]]\nname = \"s\"\ntype = \"stream\"\nmax_age = \"500ms\"",
                "acemq: queue 's' has a max_age under one second",
            ),
            (
                "[[queues]]\nname = \"c\"\ntype = \"classic\"\nreplicas = 2",
                "acemq: queue 'c' sets replicas, which only applies to a quorum queue or a stream",
            ),
            (
                "[[queues]]\nname = \"q\"\nreplicas = 0",
                "acemq: queue 'q' sets replicas = 0; a queue needs at least one",
            ),
            (
                "[[queues]]\nname = \"q\"\nreplicas = 3\narguments = { x-quorum-initial-group-size = 5 }",
                "acemq: queue 'q' sets x-quorum-initial-group-size in arguments and also replicas; pick one",
            ),
            (
                "[retry.r]\nkind = \"fixed\"\nattempts = 3\ninitial = \"1m\"\n[[queues]]\nname = \"s\"\ntype = \"stream\"\nretry = \"r\"",
                "acemq: stream 's' is given retry policy 'r'; a stream never removes a message",
            ),
            (
                "[retry.r]\nkind = \"fixed\"\nattempts = 3\ninitial = \"1s\"\n[[queues]]\nname = \"s\"\ntype = \"stream\"\n[[consumers]]\nqueue = \"s\"\nplugin = \"p.wasm\"\nretry = \"r\"",
                "acemq: stream 's' is given retry policy 'r';",
            ),
            (
                "[[queues]]\nname = \"q\"\nretry = \"nope\"",
                "acemq: queue 'q' names retry policy 'nope', which is not defined (add [retry.nope])",
            ),
            (
                "[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\nretry = \"nope\"",
                "acemq: the consumer of 'q' names retry policy 'nope', which is not defined (add [retry.nope])",
            ),
            (
                "[[consumers]]\nqueue = \" \"\nplugin = \"p.wasm\"",
                "acemq: a consumer in the config names no queue",
            ),
            (
                "[retry.fast]\nkind = \"fixed\"\nattempts = 0\ninitial = \"1s\"",
                "[retry.fast] attempts: must be at least 1",
            ),
            (
                "[[queues]]\nname = \"q\"\narguments = { when = 2026-01-01T00:00:00Z }",
                "acemq: queue 'q' has an unusable argument when: the date-time",
            ),
            (
                "[[exchanges]]\nname = \"amq.mine\"\nkind = \"topic\"",
                "acemq: exchange 'amq.mine' cannot be declared: the broker reserves names starting with 'amq.'",
            ),
            (
                "[topology]\ndead_letter_exchange = \"\"",
                "acemq: [topology] dead_letter_exchange is empty",
            ),
            (
                "[[exchanges]]\nname = \"acemq.dlx\"\nkind = \"topic\"\n[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"",
                "acemq: exchange 'acemq.dlx' is declared twice with different settings, (topic, durable) and (direct, durable);",
            ),
            (
                "[[queues]]\nname = \"q.dlq\"\n[[queues]]\nname = \"q\"\ndead_letter = true",
                "acemq: queue 'q.dlq' is declared twice with different settings, (quorum, durable, x-queue-type='quorum') and (classic, durable);",
            ),
        ];
        for (config, expected) in cases {
            let found = problems(config);
            assert_eq!(found.len(), 1, "{config}\n{found:#?}");
            assert!(
                found[0].starts_with(expected),
                "{config}\ngot:  {}\nwant: {expected}",
                found[0]
            );
        }
    }

    #[test]
    fn long_names_are_refused_before_they_reach_the_broker() {
        let long = "q".repeat(250);
        let found = problems(&format!(
            "[[queues]]\nname = \"{long}\"\ndead_letter = true\n"
        ));
        // The queue and its .dlq fit; the parked queue (and the routing key
        // binding it, its own name) are 257 bytes.
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(found[0].contains(".parked' has a name of 257 bytes; AMQP allows at most 255"));
        assert!(found[1].contains("has a routing key of 257 bytes"));
    }

    #[test]
    fn sizes_beyond_a_signed_long_are_refused() {
        // TOML integers are signed, so only a config built in code gets here.
        let mut config: Config =
            toml::from_str("[[queues]]\nname = \"s\"\ntype = \"stream\"\n").unwrap();
        config.queues[0].max_length_bytes = Some(u64::MAX);
        let found = Topology::from_config(&config).unwrap_err().texts();
        assert_eq!(
            found,
            [
                "acemq: queue 's' sets max_length_bytes = 18446744073709551615, more than the signed 64-bit integer AMQP sends it as"
            ]
        );
    }

    #[test]
    fn all_problems_are_reported_together() {
        let error = build(
            r#"
            [retry.bad]
            kind = "fixed"
            attempts = 3
            initial = "1s"
            jitter = 2.0

            [[exchanges]]
            name = "orders"

            [[exchanges]]
            name = ""
            kind = "topic"

            [[queues]]
            name = "orders.new"
            type = "quorum"
            exclusive = true

            [[queues]]
            name = "orders.new"

            [[bindings]]
            queue = "orders.new"
            exchange = "nowhere"
            routing_key = "order.*"
            "#,
        )
        .unwrap_err();
        let expected = [
            "[retry.bad] jitter: 2 is outside [0, 1]; it is the fraction by which a wait held in the consumer may be shortened or lengthened",
            "acemq: exchange 'orders' has no kind (direct, topic, fanout or headers)",
            "acemq: an exchange in the topology has no name",
            "acemq: queue 'orders.new' asks for quorum and also exclusive; a quorum queue belongs to the broker rather than to a connection, so it can be none of those",
            "acemq: the topology declares queue 'orders.new' twice",
            // Only the exchange nothing declares: the queue's own problem is reported above.
            "acemq: binding nowhere -> orders.new (order.*) names exchange 'nowhere', which this topology does not declare",
        ];
        assert_eq!(error.texts(), expected);
        let text = error.to_string();
        assert!(
            text.starts_with("this topology cannot be applied:\n  [retry.bad] jitter"),
            "{text}"
        );
        assert_eq!(text.lines().count(), expected.len() + 1);
    }
}
