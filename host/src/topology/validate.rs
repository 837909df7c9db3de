//! Why a topology cannot be applied: the problem list, every sentence a
//! refusal uses, and the checks that need the whole finished topology.
//!
//! All problems are collected before anything is refused (as Ruby's
//! `Topology#problems` does), so one run of the host shows an operator
//! everything to fix. Wordings follow the Python/Go libraries where the
//! contract gives one, with their option names replaced by this host's
//! config keys.

use std::fmt;

use super::model::{ArgValue, Arguments, BindingDecl, DeclaredBy, QueueType, Topology};

/// The longest name AMQP can carry (a short string): queue, exchange and
/// argument names and routing keys.
pub const MAX_NAME_BYTES: usize = 255;

/// Every reason a topology cannot be applied, in the order they were found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Problems(pub Vec<String>);

impl Problems {
    pub fn push(&mut self, problem: impl Into<String>) {
        self.0.push(problem.into());
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "this topology cannot be applied:")?;
        for problem in &self.0 {
            write!(f, "\n  {problem}")?;
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
pub(crate) fn check_finished(topology: &Topology, problems: &mut Problems) {
    for e in &topology.exchanges {
        check_name("exchange", &e.name, problems);
        check_argument_names("exchange", &e.name, &e.arguments, problems);
    }
    for q in &topology.queues {
        check_name("queue", &q.name, problems);
        check_argument_names("queue", &q.name, &q.arguments, problems);
    }
    for b in &topology.bindings {
        let shown = binding_shown(b);
        if b.declared_by != DeclaredBy::Consumer {
            if b.exchange.is_empty() {
                problems.push(format!(
                    "acemq: binding {shown} names the default exchange, which cannot be bound to"
                ));
            } else if topology.exchange(&b.exchange).is_none() {
                problems.push(format!(
                    "acemq: binding {shown} names exchange '{}', which this topology does not declare",
                    b.exchange
                ));
            }
            if topology.queue(&b.queue).is_none() {
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

    #[test]
    fn problems_display_one_per_indented_line() {
        let problems = Problems(vec!["first".into(), "second".into()]);
        assert_eq!(
            problems.to_string(),
            "this topology cannot be applied:\n  first\n  second"
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
}
