//! Topology per the AceMQ contract (§1, §2, §7 and the interop invariants),
//! against a real RabbitMQ: what `acemq_host::topology::apply` declares is
//! read back from the broker and compared with the contract fixture, and
//! declared again the way another AceMQ library would.
//!
//! Every test renames the fixture's own names (`orders`, `orders.new`, ...)
//! under a unique prefix, because the tests share one broker. The managed
//! exchanges `acemq.dlx` and `acemq.retry` keep their names: every library
//! hard-codes them, and every test declares them identically.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use acemq_host::config::LoadedConfig;
use acemq_host::topology::{self, ApplyError, ApplyReport, QueueType, Topology};
use acemq_tests::{Broker, shared_broker, unique_name};
use anyhow::{Context, Result, anyhow, bail, ensure};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Connection, ExchangeKind};
use serde_json::{Map, Value, json};

/// The AceMQ contract fixture, kept byte-for-byte in `tests/fixtures/acemq/`
/// (see `tests/fixtures/README.md`).
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/fixtures/acemq/contract-fixtures.json"
);

/// The fixture's own prefix, replaced by a unique one in every test.
const FIXTURE_PREFIX: &str = "orders";

/// How the fixture describes the retry policy the config below spells out.
const FIXTURE_POLICY: &str = "exponential(6, 10s, 5m) at the default threshold";

const APPLY_TIMEOUT: Duration = Duration::from_secs(60);

// ---- the fixture, renamed ------------------------------------------------------

struct ExpectedExchange {
    name: String,
    kind: String,
    durable: bool,
}

struct ExpectedQueue {
    name: String,
    /// `quorum` or `classic`, as the management API reports it.
    queue_type: String,
    durable: bool,
    /// The exact table on the wire: the fixture's arguments plus
    /// `x-queue-type` for a quorum queue (classic sends none).
    arguments: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Binding {
    exchange: String,
    queue: String,
    routing_key: String,
}

/// The fixture's `topology` section with its names under a unique prefix.
struct Expected {
    prefix: String,
    exchanges: Vec<ExpectedExchange>,
    queues: Vec<ExpectedQueue>,
    bindings: Vec<Binding>,
}

impl Expected {
    fn new() -> Result<Self> {
        let text = std::fs::read_to_string(FIXTURE)
            .with_context(|| format!("reading the contract fixture {FIXTURE}"))?;
        let fixture: Value = serde_json::from_str(&text).context("the contract fixture")?;
        let section = &fixture["topology"];
        ensure!(
            section["policy"] == FIXTURE_POLICY && section["sourceQueue"] == "orders.new",
            "the fixture's topology changed; update the config in Expected::config: {section}"
        );
        let mut expected = Expected {
            prefix: unique_name(FIXTURE_PREFIX),
            exchanges: Vec::new(),
            queues: Vec::new(),
            bindings: Vec::new(),
        };
        for e in list(section, "exchanges")? {
            expected.exchanges.push(ExpectedExchange {
                name: expected.rename(text_of(e, "name")?),
                kind: text_of(e, "type")?.to_string(),
                durable: flag_of(e, "durable")?,
            });
        }
        for q in list(section, "queues")? {
            let queue_type = text_of(q, "type")?.to_string();
            let mut arguments = Map::new();
            let listed = q["arguments"]
                .as_object()
                .ok_or_else(|| anyhow!("queue without arguments in the fixture: {q}"))?;
            for (key, value) in listed {
                let value = match value {
                    Value::String(s) => Value::String(expected.rename(s)),
                    Value::Number(n) if n.is_i64() => value.clone(),
                    other => bail!("unexpected fixture argument {key}={other}"),
                };
                arguments.insert(key.clone(), value);
            }
            if queue_type != "classic" {
                arguments.insert("x-queue-type".into(), json!(queue_type));
            }
            expected.queues.push(ExpectedQueue {
                name: expected.rename(text_of(q, "name")?),
                queue_type,
                durable: flag_of(q, "durable")?,
                arguments,
            });
        }
        for b in list(section, "bindings")? {
            expected.bindings.push(Binding {
                exchange: expected.rename(text_of(b, "exchange")?),
                queue: expected.rename(text_of(b, "queue")?),
                routing_key: expected.rename(text_of(b, "routingKey")?),
            });
        }
        Ok(expected)
    }

    /// A fixture name (or routing key, or argument value) under this test's
    /// prefix: `orders` and `orders.*` move, `acemq.*` and `order.*` stay.
    fn rename(&self, name: &str) -> String {
        match name.strip_prefix(FIXTURE_PREFIX) {
            Some(rest) if rest.is_empty() || rest.starts_with('.') => {
                format!("{}{rest}", self.prefix)
            }
            _ => name.to_string(),
        }
    }

    /// `orders.new`, renamed.
    fn source(&self) -> String {
        self.rename("orders.new")
    }

    fn queue(&self, fixture_name: &str) -> &ExpectedQueue {
        let name = self.rename(fixture_name);
        self.queues
            .iter()
            .find(|q| q.name == name)
            .unwrap_or_else(|| panic!("the fixture has no queue {fixture_name}"))
    }

    /// The fixture's topology as this host's config, with a consumer whose
    /// plugin is never loaded (only its topology is used here).
    fn config(&self) -> String {
        let exchange = self.rename("orders");
        let topic = self
            .exchanges
            .iter()
            .find(|e| e.name == exchange)
            .expect("the fixture's exchange orders");
        let source = self.source();
        let route = self
            .bindings
            .iter()
            .find(|b| b.exchange == exchange && b.queue == source)
            .expect("the fixture's binding orders.new <- orders");
        format!(
            r#"
[[exchanges]]
name = "{exchange}"
kind = "{kind}"

[[queues]]
name = "{source}"
dead_letter = true

[[bindings]]
queue = "{source}"
exchange = "{exchange}"
routing_key = "{routing_key}"

[retry.orders]
kind = "exponential"
attempts = 6
initial = "10s"
max = "5m"

[[consumers]]
queue = "{source}"
plugin = "never-loaded.wasm"
retry = "orders"
"#,
            kind = topic.kind,
            routing_key = route.routing_key,
        )
    }

    fn topology(&self) -> Result<Topology> {
        topology_of(&self.config())
    }

    /// Every fixture binding that ends at `queue`.
    fn bindings_to(&self, queue: &str) -> BTreeSet<Binding> {
        self.bindings
            .iter()
            .filter(|b| b.queue == queue)
            .cloned()
            .collect()
    }
}

fn list<'a>(section: &'a Value, key: &str) -> Result<&'a Vec<Value>> {
    section[key]
        .as_array()
        .ok_or_else(|| anyhow!("fixture topology.{key} is not a list"))
}

fn text_of<'a>(item: &'a Value, key: &str) -> Result<&'a str> {
    item[key]
        .as_str()
        .ok_or_else(|| anyhow!("fixture entry without {key}: {item}"))
}

fn flag_of(item: &Value, key: &str) -> Result<bool> {
    item[key]
        .as_bool()
        .ok_or_else(|| anyhow!("fixture entry without {key}: {item}"))
}

// ---- the host's side --------------------------------------------------------------

/// Config text to declarations, the way `acemq-host run` reads them.
fn topology_of(text: &str) -> Result<Topology> {
    let loaded = LoadedConfig::parse(Path::new("topology-test.toml"), text.to_string())
        .map_err(|e| anyhow!("{e}"))?;
    Topology::from_config(&loaded.config).map_err(|problems| anyhow!("{problems}"))
}

/// Applies `topology` on `connection`, bounded in time.
async fn apply_on(
    connection: &Connection,
    topology: &Topology,
) -> Result<Result<ApplyReport, ApplyError>> {
    tokio::time::timeout(APPLY_TIMEOUT, topology::apply(connection, topology))
        .await
        .map_err(|_| anyhow!("apply did not finish within {APPLY_TIMEOUT:?}"))
}

/// Applies `topology` on a connection of its own.
async fn apply(broker: &Broker, topology: &Topology) -> Result<Result<ApplyReport, ApplyError>> {
    let connection = broker.connect().await?;
    let result = apply_on(&connection, topology).await;
    let _ = connection.close(200, "done".into()).await;
    result
}

/// Applies `topology` and insists it succeeds.
async fn apply_ok(broker: &Broker, topology: &Topology) -> Result<ApplyReport> {
    apply(broker, topology)
        .await?
        .map_err(|e| anyhow!("apply failed: {e}"))
}

// ---- what the broker says ---------------------------------------------------------

/// A queue as the management API reports it, reduced to what the contract pins.
fn queue_readback(broker: &Broker, name: &str) -> Result<Value> {
    let info = broker.queue_info(name)?;
    Ok(json!({
        "type": info["type"],
        "durable": info["durable"],
        "exclusive": info["exclusive"],
        "auto_delete": info["auto_delete"],
        "arguments": info["arguments"],
    }))
}

/// What [`queue_readback`] must give for a fixture queue.
fn expected_readback(q: &ExpectedQueue) -> Value {
    json!({
        "type": q.queue_type,
        "durable": q.durable,
        "exclusive": false,
        "auto_delete": false,
        "arguments": q.arguments,
    })
}

/// The bindings ending at `queue`, without the default exchange's implicit one;
/// fails on a binding with arguments or to something else than a queue.
fn bindings_of(broker: &Broker, queue: &str) -> Result<BTreeSet<Binding>> {
    let mut found = BTreeSet::new();
    for b in broker.bindings(queue)? {
        if b["source"] == "" {
            continue;
        }
        ensure!(
            b["destination_type"] == "queue" && b["arguments"] == json!({}),
            "unexpected binding to {queue}: {b}"
        );
        found.insert(Binding {
            exchange: b["source"].as_str().unwrap_or_default().to_string(),
            queue: b["destination"].as_str().unwrap_or_default().to_string(),
            routing_key: b["routing_key"].as_str().unwrap_or_default().to_string(),
        });
    }
    Ok(found)
}

/// Names of every queue (or exchange: `what` = `exchanges`) starting with `prefix`.
fn names_under(broker: &Broker, what: &str, prefix: &str) -> Result<BTreeSet<String>> {
    let listed = broker.management_get(&format!("/api/{what}?columns=name"))?;
    let listed = listed
        .as_array()
        .ok_or_else(|| anyhow!("/api/{what}: not a list: {listed}"))?;
    Ok(listed
        .iter()
        .filter_map(|item| item["name"].as_str())
        .filter(|name| name.starts_with(prefix))
        .map(str::to_string)
        .collect())
}

/// Whether `queue` exists, by a passive declare on a channel of its own.
async fn queue_exists(connection: &Connection, queue: &str) -> Result<bool> {
    let channel = connection.create_channel().await?;
    let options = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    match channel
        .queue_declare(queue.into(), options, FieldTable::default())
        .await
    {
        Ok(_) => {
            let _ = channel.close(200, "done".into()).await;
            Ok(true)
        }
        Err(error) if error.to_string().contains("NOT_FOUND") => Ok(false),
        Err(error) => Err(error).with_context(|| format!("passive declare of {queue}")),
    }
}

/// Everything the fixture pins, read back from the broker: each queue's type,
/// flags and exact argument table; no other queue or exchange under the
/// prefix; each exchange's kind and flags; each queue's bindings, exactly.
fn assert_fixture_on_broker(broker: &Broker, expected: &Expected) -> Result<()> {
    for q in &expected.queues {
        assert_eq!(
            queue_readback(broker, &q.name)?,
            expected_readback(q),
            "queue {}",
            q.name
        );
    }
    let want: BTreeSet<String> = expected.queues.iter().map(|q| q.name.clone()).collect();
    assert_eq!(
        names_under(broker, "queues", &expected.prefix)?,
        want,
        "queues under {}",
        expected.prefix
    );

    for e in &expected.exchanges {
        let info = broker.exchange_info(&e.name)?;
        assert_eq!(
            json!({
                "type": info["type"],
                "durable": info["durable"],
                "auto_delete": info["auto_delete"],
                "internal": info["internal"],
                "arguments": info["arguments"],
            }),
            json!({
                "type": e.kind,
                "durable": e.durable,
                "auto_delete": false,
                "internal": false,
                "arguments": {},
            }),
            "exchange {}",
            e.name
        );
    }
    let own_exchanges: BTreeSet<String> = expected
        .exchanges
        .iter()
        .filter(|e| e.name.starts_with(&expected.prefix))
        .map(|e| e.name.clone())
        .collect();
    assert_eq!(
        names_under(broker, "exchanges", &expected.prefix)?,
        own_exchanges,
        "exchanges under {}",
        expected.prefix
    );

    for q in &expected.queues {
        assert_eq!(
            bindings_of(broker, &q.name)?,
            expected.bindings_to(&q.name),
            "bindings to {}",
            q.name
        );
    }
    Ok(())
}

// ---- another AceMQ library's side -------------------------------------------------

/// How another library's client encodes an integer argument. RabbitMQ
/// compares argument values by type class, so both must be accepted.
#[derive(Debug, Clone, Copy)]
enum IntWire {
    /// `l`, signed 64-bit: Java's `long` (`delay.toMillis()`), Go's `int64`.
    LongLong,
    /// `I`, signed 32-bit: Python's `int` as pika encodes a small one, Go's `int32`.
    Long,
}

/// An argument table as another library's client would put it on the wire.
fn library_table(arguments: &Map<String, Value>, ints: IntWire) -> Result<FieldTable> {
    let mut table = FieldTable::default();
    for (key, value) in arguments {
        let value = match (value, ints) {
            (Value::String(s), _) => AMQPValue::LongString(LongString::from(s.as_str())),
            (Value::Number(n), IntWire::LongLong) => {
                AMQPValue::LongLongInt(n.as_i64().context("an integer argument")?)
            }
            (Value::Number(n), IntWire::Long) => AMQPValue::LongInt(
                i32::try_from(n.as_i64().context("an integer argument")?)
                    .context("a 32-bit argument")?,
            ),
            (other, _) => bail!("no wire form for {key}={other}"),
        };
        table.insert(ShortString::from(key.as_str()), value);
    }
    Ok(table)
}

fn exchange_kind(kind: &str) -> Result<ExchangeKind> {
    Ok(match kind {
        "direct" => ExchangeKind::Direct,
        "topic" => ExchangeKind::Topic,
        "fanout" => ExchangeKind::Fanout,
        "headers" => ExchangeKind::Headers,
        other => bail!("unknown exchange kind {other}"),
    })
}

/// Declares one queue with raw lapin, durable, on a fresh channel.
async fn declare_queue_raw(
    connection: &Connection,
    name: &str,
    durable: bool,
    table: FieldTable,
) -> lapin::Result<()> {
    let channel = connection.create_channel().await?;
    let options = QueueDeclareOptions {
        durable,
        ..QueueDeclareOptions::default()
    };
    channel.queue_declare(name.into(), options, table).await?;
    let _ = channel.close(200, "done".into()).await;
    Ok(())
}

/// Declares the whole fixture topology as another AceMQ library would, with
/// raw lapin, each declaration on a fresh channel; fails naming the refused one.
async fn declare_as_library(broker: &Broker, expected: &Expected, ints: IntWire) -> Result<()> {
    let connection = broker.connect().await?;
    let result: Result<()> = async {
        for e in &expected.exchanges {
            let channel = connection.create_channel().await?;
            let options = ExchangeDeclareOptions {
                durable: e.durable,
                ..ExchangeDeclareOptions::default()
            };
            channel
                .exchange_declare(
                    e.name.as_str().into(),
                    exchange_kind(&e.kind)?,
                    options,
                    FieldTable::default(),
                )
                .await
                .with_context(|| format!("declaring exchange {} ({ints:?})", e.name))?;
            let _ = channel.close(200, "done".into()).await;
        }
        for q in &expected.queues {
            let table = library_table(&q.arguments, ints)?;
            declare_queue_raw(&connection, &q.name, q.durable, table)
                .await
                .with_context(|| format!("declaring queue {} ({ints:?})", q.name))?;
        }
        for b in &expected.bindings {
            let channel = connection.create_channel().await?;
            channel
                .queue_bind(
                    b.queue.as_str().into(),
                    b.exchange.as_str().into(),
                    b.routing_key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .with_context(|| format!("binding {b:?} ({ints:?})"))?;
            let _ = channel.close(200, "done".into()).await;
        }
        Ok(())
    }
    .await;
    let _ = connection.close(200, "done".into()).await;
    result
}

// ---- acceptance 1 and 2: the fixture, exactly, and idempotent ---------------------

/// Acceptance 1: after `apply`, every queue's type, flags and argument table,
/// every exchange and every binding on the broker are the fixture's, exactly.
#[tokio::test(flavor = "multi_thread")]
async fn applied_topology_reads_back_as_the_fixture() -> Result<()> {
    let broker = shared_broker();
    let expected = Expected::new()?;
    let topology = expected.topology()?;

    let report = apply_ok(broker, &topology).await?;
    assert_eq!(
        report,
        ApplyReport {
            exchanges: expected.exchanges.len(),
            queues: expected.queues.len(),
            bindings: expected.bindings.len(),
            unavailable: Vec::new(),
        }
    );
    assert_fixture_on_broker(broker, &expected)?;

    // The rungs' TTLs are integers on the broker, never strings.
    let rungs: Vec<&ExpectedQueue> = expected
        .queues
        .iter()
        .filter(|q| q.name.contains(".retry."))
        .collect();
    assert_eq!(rungs.len(), 3);
    for rung in rungs {
        let arguments = &broker.queue_info(&rung.name)?["arguments"];
        assert!(
            arguments["x-message-ttl"].is_i64(),
            "{}: {arguments}",
            rung.name
        );
    }
    Ok(())
}

/// Acceptance 2: applying the same topology again succeeds and changes nothing,
/// whether on a new connection or on the one that applied it first.
#[tokio::test(flavor = "multi_thread")]
async fn applying_twice_is_a_no_op() -> Result<()> {
    let broker = shared_broker();
    let expected = Expected::new()?;
    let topology = expected.topology()?;

    let connection = broker.connect().await?;
    let first = apply_on(&connection, &topology)
        .await?
        .map_err(|e| anyhow!("first apply: {e}"))?;
    let again = apply_on(&connection, &topology)
        .await?
        .map_err(|e| anyhow!("second apply on the same connection: {e}"))?;
    let _ = connection.close(200, "done".into()).await;
    assert_eq!(first, again);

    // A topology built anew from the same config, on another connection.
    let third = apply_ok(broker, &expected.topology()?).await?;
    assert_eq!(first, third);
    assert_fixture_on_broker(broker, &expected)?;
    Ok(())
}

// ---- acceptance 3: interop with the other libraries --------------------------------

/// Acceptance 3: once the host has applied the topology, another library
/// declaring the same queues with its own wire table (Java's 64-bit TTLs,
/// Python's and Go's 32-bit ones) is accepted, and changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn another_library_can_declare_what_the_host_declared() -> Result<()> {
    let broker = shared_broker();
    let expected = Expected::new()?;
    apply_ok(broker, &expected.topology()?).await?;

    // Exchanges, then the source queue, dlq, parked and each rung, then the
    // bindings, each on a fresh channel; a refusal names what was refused.
    for ints in [IntWire::LongLong, IntWire::Long] {
        declare_as_library(broker, &expected, ints).await?;
    }

    assert_fixture_on_broker(broker, &expected)?;
    Ok(())
}

/// Acceptance 3, the other way round: a service using another library
/// declared the topology first; the host starts and applies its own.
#[tokio::test(flavor = "multi_thread")]
async fn the_host_can_declare_what_another_library_declared() -> Result<()> {
    let broker = shared_broker();
    for ints in [IntWire::Long, IntWire::LongLong] {
        let expected = Expected::new()?;
        declare_as_library(broker, &expected, ints).await?;
        apply_ok(broker, &expected.topology()?)
            .await
            .with_context(|| format!("applying over a topology declared with {ints:?} ints"))?;
        assert_fixture_on_broker(broker, &expected)?;
    }
    Ok(())
}

// ---- acceptance 4: a different table is refused, and apply stops there -------------

/// Pre-declares `fixture_queue` (renamed) with `arguments` as another party
/// would have, applies the fixture topology, and checks that apply fails on
/// that queue with the broker's PRECONDITION_FAILED naming the queue and
/// `argument`, that the queue is left as it was, and that nothing declared
/// after it in the host's order exists.
async fn refused_when_predeclared(
    fixture_queue: &str,
    arguments: impl FnOnce(&Expected) -> Value,
    argument: &str,
) -> Result<()> {
    let broker = shared_broker();
    let expected = Expected::new()?;
    let topology = expected.topology()?;
    let failing = expected.queue(fixture_queue).name.clone();
    let Value::Object(table) = arguments(&expected) else {
        bail!("pre-declared arguments must be a table");
    };

    let connection = broker.connect().await?;
    declare_queue_raw(
        &connection,
        &failing,
        true,
        library_table(&table, IntWire::LongLong)?,
    )
    .await
    .with_context(|| format!("pre-declaring {failing}"))?;

    let error = match apply(broker, &topology).await? {
        Ok(report) => bail!("apply succeeded over a different {failing}: {report:?}"),
        Err(error) => error,
    };
    let text = error.to_string();
    assert_eq!(error.action, format!("declare queue {failing}"), "{text}");
    assert!(text.contains("PRECONDITION_FAILED"), "{text}");
    assert!(text.contains(&format!("'{failing}'")), "{text}");
    assert!(
        text.contains(&format!("inequivalent arg '{argument}'")),
        "{text}"
    );

    // The queue is as it was: apply never changes what it is refused.
    let info = broker.queue_info(&failing)?;
    assert_eq!(info["arguments"], Value::Object(table), "{failing}");

    // Exchanges come first, so they were all declared; then the queues in
    // order up to the refused one, and nothing after it.
    for e in &topology.exchanges {
        broker
            .exchange_info(&e.name)
            .with_context(|| format!("exchange {} was declared before {failing}", e.name))?;
    }
    let at = topology
        .queues
        .iter()
        .position(|q| q.name == failing)
        .context("the refused queue is in the topology")?;
    for (i, q) in topology.queues.iter().enumerate() {
        let exists = queue_exists(&connection, &q.name).await?;
        assert_eq!(
            exists,
            i <= at,
            "queue {} ({i}) exists = {exists}; the refused one is {failing} ({at})",
            q.name
        );
    }
    let _ = connection.close(200, "done".into()).await;
    // Bindings come after every queue: none of them was declared.
    for q in topology.queues.iter().take(at + 1) {
        assert_eq!(bindings_of(broker, &q.name)?, BTreeSet::new(), "{}", q.name);
    }
    Ok(())
}

/// Acceptance 4: the source queue exists as classic (another service, or a
/// library from before quorum); the host, which wants quorum, is refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_classic_source_queue_refuses_apply() -> Result<()> {
    refused_when_predeclared(
        "orders.new",
        |e| {
            json!({
                "x-dead-letter-exchange": "acemq.dlx",
                "x-dead-letter-routing-key": e.rename("orders.new.dlq"),
            })
        },
        "x-queue-type",
    )
    .await
}

/// Acceptance 4: the source queue dead-letters somewhere else.
#[tokio::test(flavor = "multi_thread")]
async fn another_dead_letter_routing_key_refuses_apply() -> Result<()> {
    refused_when_predeclared(
        "orders.new",
        |e| {
            json!({
                "x-queue-type": "quorum",
                "x-dead-letter-exchange": "acemq.dlx",
                "x-dead-letter-routing-key": e.rename("orders.new.dead"),
            })
        },
        "x-dead-letter-routing-key",
    )
    .await
}

/// Acceptance 4, in the middle of the queues: a rung left by Python <= 0.1,
/// which dead-lettered rungs through the default exchange. The queues before
/// it exist, the rung after it and every binding do not.
#[tokio::test(flavor = "multi_thread")]
async fn a_legacy_rung_refuses_apply_midway() -> Result<()> {
    refused_when_predeclared(
        "orders.new.retry.80s",
        |e| {
            json!({
                "x-message-ttl": 80000,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": e.source(),
            })
        },
        "x-dead-letter-exchange",
    )
    .await
}

// ---- acceptance 5: streams --------------------------------------------------------

/// Acceptance 5: a stream with a 7-day age and a byte limit reads back with
/// exactly `x-queue-type`, `x-max-age` "7D" and an integer
/// `x-max-length-bytes`; no segment size. Its consumer's dead-letter and
/// parked queues are ordinary classic ones.
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_reads_back_with_the_contract_arguments() -> Result<()> {
    let broker = shared_broker();
    let stream = unique_name("events");
    // Above 2^31: the byte limit must go as a 64-bit integer.
    let max_bytes: u64 = 5_000_000_000;
    let topology = topology_of(&format!(
        r#"
[[queues]]
name = "{stream}"
type = "stream"
max_age = "7days"
max_length_bytes = {max_bytes}

[[consumers]]
queue = "{stream}"
plugin = "never-loaded.wasm"
"#
    ))?;
    assert_eq!(
        topology.queue(&stream).map(|q| q.queue_type),
        Some(QueueType::Stream)
    );
    apply_ok(broker, &topology).await?;

    let arguments = json!({
        "x-queue-type": "stream",
        "x-max-age": "7D",
        "x-max-length-bytes": max_bytes,
    });
    assert_eq!(
        queue_readback(broker, &stream)?,
        json!({
            "type": "stream",
            "durable": true,
            "exclusive": false,
            "auto_delete": false,
            "arguments": arguments,
        })
    );
    let info = broker.queue_info(&stream)?;
    assert!(
        info["arguments"]
            .get("x-stream-max-segment-size-bytes")
            .is_none(),
        "{info}"
    );
    assert!(info["arguments"]["x-max-length-bytes"].is_u64(), "{info}");

    for held in [format!("{stream}.dlq"), format!("{stream}.parked")] {
        assert_eq!(
            queue_readback(broker, &held)?,
            json!({
                "type": "classic",
                "durable": true,
                "exclusive": false,
                "auto_delete": false,
                "arguments": {},
            }),
            "{held}"
        );
        let bound = Binding {
            exchange: "acemq.dlx".into(),
            queue: held.clone(),
            routing_key: held.clone(),
        };
        assert_eq!(bindings_of(broker, &held)?, BTreeSet::from([bound]));
    }

    // Again, and as another library declares a stream: both accepted.
    apply_ok(broker, &topology).await?;
    let connection = broker.connect().await?;
    let Value::Object(table) = arguments else {
        unreachable!()
    };
    // Java's long; the byte limit does not fit the 32-bit form.
    let wire = library_table(&table, IntWire::LongLong)?;
    declare_queue_raw(&connection, &stream, true, wire)
        .await
        .with_context(|| format!("another library declaring {stream}"))?;
    let _ = connection.close(200, "done".into()).await;
    assert_eq!(
        broker.queue_info(&stream)?["arguments"],
        Value::Object(table)
    );
    Ok(())
}

// ---- acceptance 6: connection-bound queues stay classic ----------------------------

/// Acceptance 6: exclusive, auto-delete and transient queues are declared
/// classic, with no `x-queue-type` at all, and the broker accepts them; it
/// would refuse each of them as quorum, which is why the rule exists.
#[tokio::test(flavor = "multi_thread")]
async fn connection_bound_queues_are_classic() -> Result<()> {
    let broker = shared_broker();
    let exclusive = unique_name("mine");
    let auto_delete = unique_name("gone");
    let transient = unique_name("light");
    let topology = topology_of(&format!(
        r#"
[[queues]]
name = "{exclusive}"
exclusive = true

[[queues]]
name = "{auto_delete}"
auto_delete = true

[[queues]]
name = "{transient}"
durable = false
"#
    ))?;

    // The exclusive queue belongs to the applying connection: keep it open.
    let connection = broker.connect().await?;
    let report = apply_on(&connection, &topology)
        .await?
        .map_err(|e| anyhow!("apply: {e}"))?;
    assert_eq!(report.queues, 3);

    // RabbitMQ stores an exclusive queue as transient whatever `durable`
    // said (it dies with its connection), so it reads back non-durable.
    for (name, durable, is_exclusive, is_auto_delete) in [
        (&exclusive, false, true, false),
        (&auto_delete, true, false, true),
        (&transient, false, false, false),
    ] {
        assert_eq!(
            queue_readback(broker, name)?,
            json!({
                "type": "classic",
                "durable": durable,
                "exclusive": is_exclusive,
                "auto_delete": is_auto_delete,
                "arguments": {},
            }),
            "{name}"
        );
    }
    // Applying again (the exclusive queue's owner redeclaring it) is fine too.
    apply_on(&connection, &topology)
        .await?
        .map_err(|e| anyhow!("second apply: {e}"))?;

    // The premise: RabbitMQ refuses each of these as a quorum queue.
    let mut quorum = FieldTable::default();
    quorum.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    for (what, options) in [
        (
            "exclusive",
            QueueDeclareOptions {
                durable: true,
                exclusive: true,
                ..QueueDeclareOptions::default()
            },
        ),
        (
            "auto-delete",
            QueueDeclareOptions {
                durable: true,
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
        ),
        ("non-durable", QueueDeclareOptions::default()),
    ] {
        let name = unique_name("refused");
        let channel = connection.create_channel().await?;
        let refused = channel
            .queue_declare(name.as_str().into(), options, quorum.clone())
            .await;
        match refused {
            Ok(_) => bail!("RabbitMQ accepted a {what} quorum queue {name}"),
            Err(error) => {
                let text = error.to_string();
                assert!(text.contains("PRECONDITION_FAILED"), "{what}: {text}");
            }
        }
    }
    let _ = connection.close(200, "done".into()).await;
    Ok(())
}

/// Sanity of the fixture renaming every test relies on.
#[test]
fn fixture_names_move_under_the_prefix() -> Result<()> {
    let expected = Expected::new()?;
    let p = &expected.prefix;
    assert!(p.starts_with("orders."), "{p}");
    assert_eq!(expected.rename("orders"), *p);
    assert_eq!(expected.rename("orders.new.dlq"), format!("{p}.new.dlq"));
    assert_eq!(expected.rename("order.*"), "order.*");
    assert_eq!(expected.rename("ordersx"), "ordersx");
    assert_eq!(expected.rename("acemq.dlx"), "acemq.dlx");
    assert_eq!(
        expected.queue("orders.new").arguments,
        *json!({
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": "acemq.dlx",
            "x-dead-letter-routing-key": format!("{p}.new.dlq"),
        })
        .as_object()
        .unwrap()
    );
    Ok(())
}
