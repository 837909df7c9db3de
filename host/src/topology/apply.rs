//! Declares a topology on a live broker: exchanges, then queues, then
//! bindings, each on a short-lived channel of its own
//! ([`crate::broker::declare`]), stopping at the first
//! refusal, except for a queue that exists but is unavailable (see
//! [`unavailable_queue`]).
//!
//! One channel per declaration because a refused declaration (406
//! PRECONDITION_FAILED for an existing queue with other arguments, say) closes
//! its channel, and lapin 4 does not reopen a channel the broker closed: on a
//! shared channel every later declaration would fail with a misleading
//! "invalid channel state". It also keeps these declarations out of the
//! topology lapin records per channel and replays on connection recovery,
//! where a 406 would fail the recovery instead of the start.

use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::{Connection, ErrorKind};

use super::model::{
    ArgValue, Arguments, BindingDecl, ExchangeDecl, ExchangeKind, QueueDecl, Topology,
};
use super::plan;
use crate::broker::declare;

/// What [`apply`] declared.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ApplyReport {
    pub exchanges: usize,
    pub queues: usize,
    pub bindings: usize,
    /// Declarations skipped because their queue exists but is unavailable
    /// (its node is down): what was being declared, and the broker's reply.
    pub unavailable: Vec<(String, String)>,
}

/// Whether the broker's reply says the queue exists but cannot be reached
/// now: a classic queue whose node is down or stopping (`NOT_FOUND - home
/// node '...' of durable queue '...' is down or inaccessible`, `NOT_FOUND -
/// queue '...' process is stopped by supervisor`). On a cluster the
/// contract's classic queues (`.dlq`, `.parked`, retry rungs) live on one
/// node; while it is down the queue's metadata is there, its process is
/// not. That must not stop the host reconnecting and consuming its quorum
/// queues on the nodes that are up: the declaration is skipped and made
/// again at the next connection, and what the host publishes to such a
/// queue meanwhile is returned unroutable, so its input is held or
/// retried, never lost.
pub fn unavailable_queue(reply: &str) -> bool {
    reply.starts_with("NOT_FOUND - ")
        && (reply.contains("is down or inaccessible")
            || reply.contains("process is stopped by supervisor"))
}

/// The declaration the broker (or the connection) refused, and why.
#[derive(Debug, thiserror::Error)]
#[error("{action}: {reply}")]
pub struct ApplyError {
    /// What was being declared: `declare queue orders.new`,
    /// `declare binding orders.new (from orders on order.*)`.
    pub action: String,
    /// The broker's own reply text (`PRECONDITION_FAILED - inequivalent arg
    /// 'x-queue-type' ...`), or the client's error when the broker never answered.
    pub reply: String,
    #[source]
    pub source: Option<lapin::Error>,
}

/// Declares every exchange, queue and binding of `topology`, in that order.
/// Declarations are idempotent, so applying a topology that is already in
/// place changes nothing. Wrap it in a timeout if the broker may hang.
pub async fn apply(conn: &Connection, topology: &Topology) -> Result<ApplyReport, ApplyError> {
    apply_with(&OnBroker(conn), topology).await
}

/// An argument table as lapin sends it.
///
/// Strings go as long strings (a short string has no field-table type and
/// would not encode), integers as signed 64-bit, floats as doubles.
///
/// # Panics
/// If a key is longer than 255 bytes, which AMQP cannot carry; topology
/// validation refuses such keys before anything is applied.
pub fn to_field_table(arguments: &Arguments) -> FieldTable {
    let mut table = FieldTable::default();
    for (key, value) in arguments {
        table.insert(ShortString::from(key.as_str()), to_amqp_value(value));
    }
    table
}

/// One argument value as lapin sends it; see [`to_field_table`].
fn to_amqp_value(value: &ArgValue) -> AMQPValue {
    match value {
        ArgValue::Str(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        ArgValue::Int(i) => AMQPValue::LongLongInt(*i),
        ArgValue::Float(f) => AMQPValue::Double(*f),
        ArgValue::Bool(b) => AMQPValue::Boolean(*b),
        ArgValue::Table(t) => AMQPValue::FieldTable(to_field_table(t)),
        ArgValue::Array(items) => AMQPValue::FieldArray(FieldArray::from(
            items.iter().map(to_amqp_value).collect::<Vec<_>>(),
        )),
    }
}

/// Sends declarations somewhere: the broker in production, a recorder in tests.
trait Declare {
    async fn exchange(&self, decl: &ExchangeDecl) -> Result<(), Declined>;
    async fn queue(&self, decl: &QueueDecl) -> Result<(), Declined>;
    async fn binding(&self, decl: &BindingDecl) -> Result<(), Declined>;
}

/// Why one declaration failed, before we know which declaration it was.
struct Declined {
    reply: String,
    source: Option<lapin::Error>,
}

impl Declined {
    fn during(self, action: String) -> ApplyError {
        ApplyError {
            action,
            reply: self.reply,
            source: self.source,
        }
    }
}

impl From<lapin::Error> for Declined {
    fn from(error: lapin::Error) -> Self {
        // The broker's reply text already names the code and the reason;
        // lapin's own rendering would repeat the code in another spelling.
        let reply = match error.kind() {
            ErrorKind::ProtocolError(amqp) => amqp.get_message().to_string(),
            _ => error.to_string(),
        };
        Declined {
            reply,
            source: Some(error),
        }
    }
}

async fn apply_with(
    declare: &impl Declare,
    topology: &Topology,
) -> Result<ApplyReport, ApplyError> {
    for e in &topology.exchanges {
        declare
            .exchange(e)
            .await
            .map_err(|r| r.during(format!("declare exchange {}", e.name)))?;
    }
    let mut unavailable = Vec::new();
    for q in &topology.queues {
        if let Err(declined) = declare.queue(q).await
            && let Some(error) = skip_if_unavailable(
                &mut unavailable,
                declined,
                format!("declare queue {}", q.name),
            )
        {
            return Err(error);
        }
    }
    for b in &topology.bindings {
        if let Err(declined) = declare.binding(b).await {
            let action = format!("declare binding {} ({})", b.queue, plan::binding_detail(b));
            if let Some(error) = skip_if_unavailable(&mut unavailable, declined, action) {
                return Err(error);
            }
        }
    }
    Ok(ApplyReport {
        exchanges: topology.exchanges.len(),
        queues: topology.queues.len(),
        bindings: topology.bindings.len(),
        unavailable,
    })
}

/// Notes a declaration refused because its queue is unavailable in
/// `unavailable`; any other refusal comes back as the error to stop with.
fn skip_if_unavailable(
    unavailable: &mut Vec<(String, String)>,
    declined: Declined,
    action: String,
) -> Option<ApplyError> {
    if unavailable_queue(&declined.reply) {
        unavailable.push((action, declined.reply));
        None
    } else {
        Some(declined.during(action))
    }
}

/// The broker, one declaration at a time ([`crate::broker::declare`]).
struct OnBroker<'a>(&'a Connection);

/// A name as an AMQP short string, refused (rather than panicking in lapin)
/// when it is longer than 255 bytes.
fn short(what: &str, value: &str) -> Result<ShortString, Declined> {
    ShortString::try_new(value).map_err(|error| Declined {
        reply: format!("the {what} cannot be sent: {error}"),
        source: None,
    })
}

fn lapin_kind(kind: ExchangeKind) -> lapin::ExchangeKind {
    match kind {
        ExchangeKind::Direct => lapin::ExchangeKind::Direct,
        ExchangeKind::Topic => lapin::ExchangeKind::Topic,
        ExchangeKind::Fanout => lapin::ExchangeKind::Fanout,
        ExchangeKind::Headers => lapin::ExchangeKind::Headers,
    }
}

impl Declare for OnBroker<'_> {
    async fn exchange(&self, e: &ExchangeDecl) -> Result<(), Declined> {
        let name = short("exchange name", &e.name)?;
        let options = ExchangeDeclareOptions {
            durable: e.durable,
            auto_delete: e.auto_delete,
            ..Default::default()
        };
        let arguments = to_field_table(&e.arguments);
        Ok(declare::exchange(self.0, name, lapin_kind(e.kind), options, arguments).await?)
    }

    async fn queue(&self, q: &QueueDecl) -> Result<(), Declined> {
        let name = short("queue name", &q.name)?;
        let options = QueueDeclareOptions {
            durable: q.durable,
            exclusive: q.exclusive,
            auto_delete: q.auto_delete,
            ..Default::default()
        };
        Ok(declare::queue(self.0, name, options, to_field_table(&q.arguments)).await?)
    }

    async fn binding(&self, b: &BindingDecl) -> Result<(), Declined> {
        let queue = short("queue name", &b.queue)?;
        let exchange = short("exchange name", &b.exchange)?;
        let routing_key = short("routing key", &b.routing_key)?;
        let arguments = to_field_table(&b.arguments);
        Ok(declare::binding(self.0, queue, exchange, routing_key, arguments).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::build::tests::{FIXTURE_CONFIG, build};
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    const INEQUIVALENT: &str = "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for \
        queue 'orders.new' in vhost '/': received 'quorum' but current is 'classic'";

    /// Records what would be declared and refuses one named declaration
    /// with `reply` (a 406 unless said otherwise).
    struct Recorder {
        sent: RefCell<Vec<String>>,
        refuse: &'static str,
        reply: &'static str,
    }

    impl Recorder {
        fn refusing(refuse: &'static str) -> Self {
            Self {
                sent: RefCell::default(),
                refuse,
                reply: INEQUIVALENT,
            }
        }

        fn record(&self, what: String) -> Result<(), Declined> {
            let refused = what == self.refuse;
            self.sent.borrow_mut().push(what);
            if refused {
                return Err(Declined {
                    reply: self.reply.into(),
                    source: None,
                });
            }
            Ok(())
        }
    }

    impl Declare for Recorder {
        async fn exchange(&self, e: &ExchangeDecl) -> Result<(), Declined> {
            self.record(format!("exchange {}", e.name))
        }
        async fn queue(&self, q: &QueueDecl) -> Result<(), Declined> {
            self.record(format!("queue {}", q.name))
        }
        async fn binding(&self, b: &BindingDecl) -> Result<(), Declined> {
            self.record(format!("binding {} <- {}", b.queue, b.exchange))
        }
    }

    #[test]
    fn declares_exchanges_then_queues_then_bindings() {
        let topology = build(FIXTURE_CONFIG).unwrap();
        let recorder = Recorder::refusing("");
        let report = futures::executor::block_on(apply_with(&recorder, &topology))
            .ok()
            .unwrap();
        assert_eq!(
            report,
            ApplyReport {
                exchanges: 3,
                queues: 6,
                bindings: 4,
                unavailable: Vec::new(),
            }
        );
        assert_eq!(
            recorder.sent.into_inner(),
            [
                "exchange orders",
                "exchange acemq.dlx",
                "exchange acemq.retry",
                "queue orders.new",
                "queue orders.new.dlq",
                "queue orders.new.parked",
                "queue orders.new.retry.40s",
                "queue orders.new.retry.80s",
                "queue orders.new.retry.160s",
                "binding orders.new.dlq <- acemq.dlx",
                "binding orders.new.parked <- acemq.dlx",
                "binding orders.new <- orders",
                "binding orders.new <- acemq.retry",
            ]
        );
    }

    #[test]
    fn stops_at_the_first_refusal_and_names_it() {
        let topology = build(FIXTURE_CONFIG).unwrap();
        let recorder = Recorder::refusing("queue orders.new");
        let error = futures::executor::block_on(apply_with(&recorder, &topology)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "declare queue orders.new: PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for \
             queue 'orders.new' in vhost '/': received 'quorum' but current is 'classic'"
        );
        assert_eq!(recorder.sent.borrow().last().unwrap(), "queue orders.new");
        assert_eq!(recorder.sent.borrow().len(), 4);
    }

    #[test]
    fn a_refused_binding_is_named_by_all_its_parts() {
        let topology = build(FIXTURE_CONFIG).unwrap();
        let recorder = Recorder::refusing("binding orders.new <- orders");
        let error = futures::executor::block_on(apply_with(&recorder, &topology)).unwrap_err();
        assert_eq!(
            error.action,
            "declare binding orders.new (from orders on order.*)"
        );
    }

    /// A classic queue whose node is down is skipped and named; everything
    /// after it is still declared.
    #[test]
    fn a_queue_whose_node_is_down_is_skipped_and_named() {
        let topology = build(FIXTURE_CONFIG).unwrap();
        let reply = "NOT_FOUND - home node 'rabbit@n1' of durable queue 'orders.new.dlq' in \
                     vhost '/' is down or inaccessible";
        let recorder = Recorder {
            reply,
            ..Recorder::refusing("queue orders.new.dlq")
        };
        let report = futures::executor::block_on(apply_with(&recorder, &topology))
            .ok()
            .unwrap();
        assert_eq!(
            report.unavailable,
            [(
                "declare queue orders.new.dlq".to_string(),
                reply.to_string()
            )]
        );
        assert_eq!(recorder.sent.borrow().len(), 13, "the rest was declared");
    }

    #[test]
    fn only_a_down_or_stopping_queue_counts_as_unavailable() {
        assert!(unavailable_queue(
            "NOT_FOUND - queue 'q.dlq' in vhost '/' process is stopped by supervisor"
        ));
        assert!(!unavailable_queue(
            "NOT_FOUND - no exchange 'orders' in vhost '/'"
        ));
        assert!(!unavailable_queue(INEQUIVALENT));
    }

    #[test]
    fn arguments_keep_their_wire_types() {
        let arguments = Arguments::from([
            ("x-queue-type".to_string(), ArgValue::from("quorum")),
            ("x-message-ttl".to_string(), ArgValue::Int(40_000)),
            ("ratio".to_string(), ArgValue::Float(0.5)),
            ("flag".to_string(), ArgValue::Bool(true)),
            (
                "nested".to_string(),
                ArgValue::Table(BTreeMap::from([("k".to_string(), ArgValue::from("v"))])),
            ),
            (
                "list".to_string(),
                ArgValue::Array(vec![ArgValue::Int(1), ArgValue::from("a")]),
            ),
        ]);
        let table = to_field_table(&arguments);
        let get = |key: &str| table.inner().get(key).unwrap().clone();
        assert_eq!(get("x-queue-type"), AMQPValue::LongString("quorum".into()));
        assert_eq!(get("x-message-ttl"), AMQPValue::LongLongInt(40_000));
        assert_eq!(get("ratio"), AMQPValue::Double(0.5));
        assert_eq!(get("flag"), AMQPValue::Boolean(true));
        let mut nested = FieldTable::default();
        nested.insert("k".into(), AMQPValue::LongString("v".into()));
        assert_eq!(get("nested"), AMQPValue::FieldTable(nested));
        assert_eq!(
            get("list"),
            AMQPValue::FieldArray(FieldArray::from(vec![
                AMQPValue::LongLongInt(1),
                AMQPValue::LongString("a".into()),
            ]))
        );
    }

    #[test]
    fn overlong_names_are_refused_not_panicked_on() {
        let refusal = short("queue name", &"q".repeat(256)).err().unwrap();
        assert!(
            refusal.reply.starts_with("the queue name cannot be sent:"),
            "{}",
            refusal.reply
        );
    }

    /// Callers spawn `apply` on a multi-threaded runtime, so its future must be Send.
    #[allow(dead_code)]
    fn apply_is_send(conn: &Connection, topology: &Topology) {
        fn is_send<T: Send>(_: &T) {}
        is_send(&apply(conn, topology));
    }
}
