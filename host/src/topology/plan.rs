//! The dry-run text of a topology: what would be declared, in order, without
//! a connection. The shape follows the Python and Go libraries' `plan()`
//! (plan text is not a cross-language contract, but operators who know one
//! AceMQ library can read it).

use super::model::{
    ArgValue, Arguments, BindingDecl, DeclaredBy, ExchangeDecl, QueueDecl, Topology,
};

/// The plan: a header, then one `declare ...` line per declaration in the
/// order [`super::apply::apply`] sends them. Lines end with a marker when a
/// consumer (rather than the topology alone) declares the thing.
pub fn plan(topology: &Topology) -> String {
    let mut text = format!(
        "Topology: {} exchanges, {} queues, {} bindings",
        topology.exchanges.len(),
        topology.queues.len(),
        topology.bindings.len()
    );
    let exchanges = topology.exchanges.iter().map(|e| {
        let line = format!("declare exchange {} ({})", e.name, exchange_detail(e));
        with_marker(line, e.declared_by)
    });
    let queues = topology.queues.iter().map(|q| {
        let line = format!("declare queue {} ({})", q.name, queue_detail(q));
        with_marker(line, q.declared_by)
    });
    let bindings = topology.bindings.iter().map(|b| {
        let line = format!("declare binding {} ({})", b.queue, binding_detail(b));
        with_marker(line, b.declared_by)
    });
    for line in exchanges.chain(queues).chain(bindings) {
        text.push_str("\n  ");
        text.push_str(&line);
    }
    text
}

fn with_marker(line: String, by: DeclaredBy) -> String {
    match by {
        DeclaredBy::Topology => line,
        DeclaredBy::Consumer => format!("{line} [consumer]"),
        DeclaredBy::Both => format!("{line} [topology and consumer]"),
    }
}

/// `topic, durable[, auto-delete][, key=value...]`.
pub(crate) fn exchange_detail(e: &ExchangeDecl) -> String {
    let mut parts = vec![
        e.kind.as_str().to_string(),
        durability(e.durable).to_string(),
    ];
    if e.auto_delete {
        parts.push("auto-delete".into());
    }
    parts.extend(rendered_arguments(&e.arguments));
    parts.join(", ")
}

/// `quorum, durable[, auto-delete][, exclusive][, key=value...]`, the
/// arguments being the exact table sent, sorted by key.
pub(crate) fn queue_detail(q: &QueueDecl) -> String {
    let mut parts = vec![
        q.queue_type.as_str().to_string(),
        durability(q.durable).to_string(),
    ];
    if q.auto_delete {
        parts.push("auto-delete".into());
    }
    if q.exclusive {
        parts.push("exclusive".into());
    }
    parts.extend(rendered_arguments(&q.arguments));
    parts.join(", ")
}

/// `from {exchange} on {routing_key}[, key=value...]`.
pub(crate) fn binding_detail(b: &BindingDecl) -> String {
    let key = if b.routing_key.is_empty() {
        "''"
    } else {
        &b.routing_key
    };
    let mut parts = vec![format!("from {} on {key}", b.exchange)];
    parts.extend(rendered_arguments(&b.arguments));
    parts.join(", ")
}

fn durability(durable: bool) -> &'static str {
    if durable { "durable" } else { "transient" }
}

fn rendered_arguments(arguments: &Arguments) -> impl Iterator<Item = String> + '_ {
    arguments
        .iter()
        .map(|(key, value)| format!("{key}={}", rendered(value)))
}

/// A value as Python's `repr` would show it, strings in single quotes, so a
/// string `'5'` is told apart from the integer `5`.
pub(crate) fn rendered(value: &ArgValue) -> String {
    match value {
        ArgValue::Str(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        ArgValue::Int(i) => i.to_string(),
        ArgValue::Float(f) => format!("{f:?}"),
        ArgValue::Bool(b) => b.to_string(),
        ArgValue::Table(table) => format!(
            "{{{}}}",
            rendered_arguments(table).collect::<Vec<_>>().join(", ")
        ),
        ArgValue::Array(items) => format!(
            "[{}]",
            items.iter().map(rendered).collect::<Vec<_>>().join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn fixture_topology_plan() {
        use crate::topology::build::tests::{FIXTURE_CONFIG, build};
        let text = plan(&build(FIXTURE_CONFIG).unwrap());
        let expected = "\
Topology: 3 exchanges, 6 queues, 4 bindings
  declare exchange orders (topic, durable)
  declare exchange acemq.dlx (direct, durable) [topology and consumer]
  declare exchange acemq.retry (direct, durable) [consumer]
  declare queue orders.new (quorum, durable, x-dead-letter-exchange='acemq.dlx', x-dead-letter-routing-key='orders.new.dlq', x-queue-type='quorum')
  declare queue orders.new.dlq (classic, durable) [topology and consumer]
  declare queue orders.new.parked (classic, durable) [topology and consumer]
  declare queue orders.new.retry.40s (classic, durable, x-dead-letter-exchange='acemq.retry', x-dead-letter-routing-key='orders.new', x-message-ttl=40000) [consumer]
  declare queue orders.new.retry.80s (classic, durable, x-dead-letter-exchange='acemq.retry', x-dead-letter-routing-key='orders.new', x-message-ttl=80000) [consumer]
  declare queue orders.new.retry.160s (classic, durable, x-dead-letter-exchange='acemq.retry', x-dead-letter-routing-key='orders.new', x-message-ttl=160000) [consumer]
  declare binding orders.new.dlq (from acemq.dlx on orders.new.dlq) [topology and consumer]
  declare binding orders.new.parked (from acemq.dlx on orders.new.parked) [topology and consumer]
  declare binding orders.new (from orders on order.*)
  declare binding orders.new (from acemq.retry on orders.new) [consumer]";
        assert_eq!(text, expected);
    }

    #[test]
    fn an_empty_topology_plans_nothing() {
        assert_eq!(
            plan(&Topology::default()),
            "Topology: 0 exchanges, 0 queues, 0 bindings"
        );
    }

    #[test]
    fn values_render_like_python_repr() {
        assert_eq!(rendered(&"it's".into()), r"'it\'s'");
        assert_eq!(rendered(&ArgValue::Int(5)), "5");
        assert_eq!(rendered(&ArgValue::Float(1.0)), "1.0");
        assert_eq!(rendered(&ArgValue::Bool(true)), "true");
        let table = BTreeMap::from([
            ("b".to_string(), ArgValue::Int(1)),
            ("a".to_string(), "x".into()),
        ]);
        assert_eq!(rendered(&ArgValue::Table(table)), "{a='x', b=1}");
        assert_eq!(
            rendered(&ArgValue::Array(vec![ArgValue::Int(1), "y".into()])),
            "[1, 'y']"
        );
    }

    #[test]
    fn flags_and_arguments_in_order() {
        let queue = QueueDecl {
            name: "tmp".into(),
            queue_type: super::super::model::QueueType::Classic,
            durable: false,
            exclusive: true,
            auto_delete: true,
            arguments: BTreeMap::from([
                ("x-max-length".to_string(), ArgValue::Int(10)),
                ("x-expires".to_string(), ArgValue::Int(600_000)),
            ]),
            declared_by: DeclaredBy::Topology,
        };
        assert_eq!(
            queue_detail(&queue),
            "classic, transient, auto-delete, exclusive, x-expires=600000, x-max-length=10"
        );
        let binding = BindingDecl {
            queue: "q".into(),
            exchange: "fan".into(),
            routing_key: String::new(),
            arguments: Arguments::new(),
            declared_by: DeclaredBy::Topology,
        };
        assert_eq!(binding_detail(&binding), "from fan on ''");
    }
}
