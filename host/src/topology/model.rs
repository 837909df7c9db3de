//! The declarations a topology is made of, as plain data: what will be sent
//! to the broker, exactly, with no lapin types, so building, validating and
//! planning need no connection.

use std::collections::BTreeMap;

/// A value in an AMQP argument table.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgValue {
    /// Sent as a long string (the only string type a field table has).
    Str(String),
    /// Sent as a signed 64-bit integer, which RabbitMQ reads for every integer argument.
    Int(i64),
    Float(f64),
    Bool(bool),
    Table(BTreeMap<String, ArgValue>),
    Array(Vec<ArgValue>),
}

/// An argument table, sorted by key (the order plans print them in).
pub type Arguments = BTreeMap<String, ArgValue>;

impl From<&str> for ArgValue {
    fn from(value: &str) -> Self {
        ArgValue::Str(value.to_string())
    }
}

impl From<String> for ArgValue {
    fn from(value: String) -> Self {
        ArgValue::Str(value)
    }
}

impl From<i64> for ArgValue {
    fn from(value: i64) -> Self {
        ArgValue::Int(value)
    }
}

impl TryFrom<&toml::Value> for ArgValue {
    type Error = String;

    /// TOML values map one to one, except date-times: AMQP's timestamp is
    /// whole seconds and no broker argument takes one, so a date-time is more
    /// likely a mistake than an intent.
    fn try_from(value: &toml::Value) -> Result<Self, String> {
        Ok(match value {
            toml::Value::String(s) => ArgValue::Str(s.clone()),
            toml::Value::Integer(i) => ArgValue::Int(*i),
            toml::Value::Float(f) => ArgValue::Float(*f),
            toml::Value::Boolean(b) => ArgValue::Bool(*b),
            toml::Value::Array(items) => ArgValue::Array(
                items
                    .iter()
                    .map(ArgValue::try_from)
                    .collect::<Result<_, _>>()?,
            ),
            toml::Value::Table(table) => ArgValue::Table(arguments_from_toml(table)?),
            toml::Value::Datetime(d) => {
                return Err(format!(
                    "the date-time {d} cannot be sent as an argument; quote it if a string is meant"
                ));
            }
        })
    }
}

/// A config `arguments` table as an argument table; an error names the key.
pub fn arguments_from_toml(table: &toml::Table) -> Result<Arguments, String> {
    table
        .iter()
        .map(|(key, value)| {
            ArgValue::try_from(value)
                .map(|v| (key.clone(), v))
                .map_err(|e| format!("argument {key}: {e}"))
        })
        .collect()
}

/// The four exchange kinds every AceMQ library accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeKind {
    Direct,
    Topic,
    Fanout,
    Headers,
}

impl ExchangeKind {
    pub fn parse(kind: &str) -> Option<Self> {
        match kind {
            "direct" => Some(Self::Direct),
            "topic" => Some(Self::Topic),
            "fanout" => Some(Self::Fanout),
            "headers" => Some(Self::Headers),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Topic => "topic",
            Self::Fanout => "fanout",
            Self::Headers => "headers",
        }
    }
}

/// The queue types a topology can declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueType {
    Quorum,
    Classic,
    Stream,
}

impl QueueType {
    pub fn parse(kind: &str) -> Option<Self> {
        match kind {
            "quorum" => Some(Self::Quorum),
            "classic" => Some(Self::Classic),
            "stream" => Some(Self::Stream),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Quorum => "quorum",
            Self::Classic => "classic",
            Self::Stream => "stream",
        }
    }

    /// The `x-queue-type` argument sent for this type. Classic sends none:
    /// that is how every AceMQ library declares one (contract §2).
    pub fn argument(self) -> Option<&'static str> {
        match self {
            Self::Classic => None,
            other => Some(other.as_str()),
        }
    }
}

/// Which half of AceMQ declares a thing. The contract splits a topology in
/// two: what the topology itself declares up front, and what a consumer
/// declares when it starts (its dead-letter queues and retry rungs). The
/// fixture pins the split, so the host keeps it visible in plans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeclaredBy {
    Topology,
    Consumer,
    Both,
}

impl DeclaredBy {
    /// The fixture's `declaredBy` word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Topology => "topology",
            Self::Consumer => "consumer",
            Self::Both => "both",
        }
    }

    /// Who declares a thing that both `self` and `other` ask for.
    pub fn merge(self, other: Self) -> Self {
        if self == other { self } else { Self::Both }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ExchangeDecl {
    pub name: String,
    pub kind: ExchangeKind,
    pub durable: bool,
    pub auto_delete: bool,
    pub arguments: Arguments,
    pub declared_by: DeclaredBy,
}

#[derive(Debug, Clone, PartialEq)]
pub struct QueueDecl {
    pub name: String,
    pub queue_type: QueueType,
    pub durable: bool,
    pub exclusive: bool,
    pub auto_delete: bool,
    /// The exact table sent, `x-queue-type` included when quorum or stream.
    pub arguments: Arguments,
    pub declared_by: DeclaredBy,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BindingDecl {
    pub queue: String,
    pub exchange: String,
    pub routing_key: String,
    pub arguments: Arguments,
    pub declared_by: DeclaredBy,
}

/// Everything to declare, each list in order of first appearance; applied
/// exchanges first, then queues, then bindings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Topology {
    pub exchanges: Vec<ExchangeDecl>,
    pub queues: Vec<QueueDecl>,
    pub bindings: Vec<BindingDecl>,
}

impl Topology {
    pub fn exchange(&self, name: &str) -> Option<&ExchangeDecl> {
        self.exchanges.iter().find(|e| e.name == name)
    }

    pub fn queue(&self, name: &str) -> Option<&QueueDecl> {
        self.queues.iter().find(|q| q.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_arguments_convert_with_their_types() {
        let table: toml::Table = toml::from_str(
            "ttl = 5\nname = \"x\"\nratio = 0.5\non = true\nlist = [1, \"a\"]\n[nested]\nk = 2\n",
        )
        .unwrap();
        let args = arguments_from_toml(&table).unwrap();
        assert_eq!(args["ttl"], ArgValue::Int(5));
        assert_eq!(args["name"], ArgValue::Str("x".into()));
        assert_eq!(args["ratio"], ArgValue::Float(0.5));
        assert_eq!(args["on"], ArgValue::Bool(true));
        assert_eq!(
            args["list"],
            ArgValue::Array(vec![ArgValue::Int(1), "a".into()])
        );
        assert_eq!(
            args["nested"],
            ArgValue::Table(BTreeMap::from([("k".to_string(), ArgValue::Int(2))]))
        );
    }

    #[test]
    fn date_times_are_refused_with_their_key() {
        let table: toml::Table = toml::from_str("when = 2026-01-02T03:04:05Z\n").unwrap();
        let error = arguments_from_toml(&table).unwrap_err();
        assert!(error.starts_with("argument when: the date-time"), "{error}");
    }

    #[test]
    fn classic_sends_no_queue_type() {
        assert_eq!(QueueType::Classic.argument(), None);
        assert_eq!(QueueType::Quorum.argument(), Some("quorum"));
        assert_eq!(QueueType::Stream.argument(), Some("stream"));
    }

    #[test]
    fn declared_by_merges_into_both() {
        let (topology, consumer, both) =
            (DeclaredBy::Topology, DeclaredBy::Consumer, DeclaredBy::Both);
        assert_eq!(topology.merge(topology), topology);
        assert_eq!(consumer.merge(consumer), consumer);
        assert_eq!(topology.merge(consumer), both);
        assert_eq!(both.merge(consumer), both);
    }
}
