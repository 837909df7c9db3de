//! The AceMQ scheduler as the other libraries use it, for interop tests:
//! a vhost of its own per test (the scheduler's queues are vhost-wide, and a
//! test's control consumer must not take another test's messages), a
//! publisher that writes a scheduled message the way a contract library
//! does (its headers written by hand, in Java's or Python's style), a
//! control consumer that does exactly what the contract says and no more,
//! and a watcher that notes when each final delivery arrives.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{Broker, ReceivedMessage, unique_name};

/// The contract's names (§11), written out here rather than taken from the
/// host: these tests hold the host to them.
pub const EXCHANGE: &str = "acemq.schedule";
pub const DUE_QUEUE: &str = "acemq.schedule.due";
/// Longest first, with their TTLs in ms.
pub const RUNGS: [(&str, u64); 5] = [
    ("acemq.schedule.1h", 3_600_000),
    ("acemq.schedule.10m", 600_000),
    ("acemq.schedule.1m", 60_000),
    ("acemq.schedule.10s", 10_000),
    ("acemq.schedule.1s", 1_000),
];

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_millis() as u64
}

/// The queue a scheduled message with `left_ms` to go waits on next.
pub fn next_queue(left_ms: i64) -> &'static str {
    RUNGS
        .iter()
        .find(|(_, ttl)| left_ms >= *ttl as i64)
        .map_or(DUE_QUEUE, |(name, _)| name)
}

/// A vhost of its own on `base`, with the guest user allowed everything;
/// deleted, with everything in it, when dropped.
pub struct Vhost<'a> {
    pub name: String,
    /// Its AMQP URL.
    pub url: String,
    /// The test helpers (publish, drain, counts) on this vhost.
    pub broker: Broker,
    base: &'a Broker,
}

impl<'a> Vhost<'a> {
    pub fn create(base: &'a Broker, prefix: &str) -> Result<Self> {
        let name = unique_name(prefix);
        base.rabbitmqctl(&["add_vhost", &name])?;
        base.rabbitmqctl(&["set_permissions", "-p", &name, "guest", ".*", ".*", ".*"])?;
        let url = format!(
            "amqp://guest:guest@{}:{}/{name}",
            base.amqp_host(),
            base.amqp_port()
        );
        let mgmt = base
            .mgmt_url()
            .replacen("http://", "http://guest:guest@", 1);
        let broker = Broker::external(&url, Some(&mgmt))?;
        Ok(Self {
            name,
            url,
            broker,
            base,
        })
    }

    /// The scheduler's exchange, six queues and bindings, declared by the
    /// host's own topology code for a config that runs the scheduler (and
    /// nothing else): as a deployment's topology step would.
    pub async fn declare_scheduler(&self) -> Result<()> {
        let text = format!(
            "[broker]\nurl = \"{}\"\n\n[scheduler]\nenabled = true\n",
            self.url
        );
        let config =
            acemq_host::config::LoadedConfig::parse(std::path::Path::new("scheduler.toml"), text)
                .map_err(|e| anyhow!("{e}"))?;
        let topology = acemq_host::topology::Topology::from_config(&config.config)
            .map_err(|e| anyhow!("{e}"))?;
        let connection = connect(&self.url).await?;
        acemq_host::topology::apply(&connection, &topology)
            .await
            .map_err(|e| anyhow!("{e}"))?;
        let _ = connection.close(200, "declared".into()).await;
        Ok(())
    }
}

impl Drop for Vhost<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.base.rabbitmqctl(&["delete_vhost", &self.name]) {
            eprintln!("deleting the vhost {}: {e:#}", self.name);
        }
    }
}

/// A host config that runs the scheduler and no consumer, with the direct
/// exchange `exchange` whose queue `queue` takes `routing_key`: where the
/// final deliveries of a test's scheduled messages go.
pub fn scheduler_only_config(url: &str, exchange: &str, queue: &str, routing_key: &str) -> String {
    format!(
        r#"
[broker]
url = "{url}"

[scheduler]
enabled = true

[[exchanges]]
name = "{exchange}"
kind = "direct"

[[queues]]
name = "{queue}"

[[bindings]]
exchange = "{exchange}"
queue = "{queue}"
routing_key = "{routing_key}"
"#
    )
}

async fn connect(url: &str) -> Result<Connection> {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .with_context(|| format!("connecting to {url}"))
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// Whose habits a scheduled message is written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Java: every header, texts as long strings, the due time a 64-bit
    /// long, the envelope's headers beside them.
    Java,
    /// Python (pika): texts as short-string-sized long strings, the due
    /// time the narrowest integer it fits (a long for epoch ms), and no
    /// content-type header when the payload is JSON.
    Python,
}

/// One scheduled message as a contract library publishes it.
pub struct Scheduled<'a> {
    pub exchange: &'a str,
    pub routing_key: &'a str,
    pub due_at_ms: u64,
    pub body: &'a [u8],
    /// `None`: JSON (Python leaves the header out).
    pub content_type: Option<&'a str>,
    pub id: &'a str,
}

/// The rung `message` goes to now, and its properties as `style` writes them.
fn scheduled_properties(style: Style, message: &Scheduled<'_>) -> (&'static str, BasicProperties) {
    let mut headers = FieldTable::default();
    headers.insert("x-schedule-exchange".into(), text(message.exchange));
    headers.insert("x-schedule-routing-key".into(), text(message.routing_key));
    headers.insert(
        "x-schedule-due-at".into(),
        AMQPValue::LongLongInt(message.due_at_ms as i64),
    );
    let content_type = message.content_type.unwrap_or("application/json");
    if style == Style::Java || message.content_type.is_some() {
        headers.insert("x-schedule-content-type".into(), text(content_type));
    }
    headers.insert("x-acemq-id".into(), text(message.id));
    headers.insert("x-acemq-type".into(), text("ScheduledMessage"));
    headers.insert("x-acemq-version".into(), AMQPValue::LongInt(1));
    headers.insert("x-acemq-correlation".into(), text(message.id));
    let properties = BasicProperties::default()
        .with_message_id(ShortString::from(message.id))
        .with_content_type(ShortString::from(content_type))
        .with_delivery_mode(2)
        .with_headers(headers);
    let left = message.due_at_ms as i64 - now_ms() as i64;
    (next_queue(left), properties)
}

/// Publishes `message` to `acemq.schedule` on the rung for its time left,
/// mandatory and confirmed, with the headers `style` writes.
pub async fn schedule_as(url: &str, style: Style, message: &Scheduled<'_>) -> Result<()> {
    schedule_all(url, style, std::slice::from_ref(message), 1).await
}

/// A control consumer that does what the contract says (§11), and only
/// that: prefetch 50; a message with at least a second left goes back to
/// `acemq.schedule` on the largest rung not longer than that; one with less
/// is published to its `x-schedule-exchange` and `x-schedule-routing-key`
/// with every `x-schedule-*` header stripped and the carried content type;
/// each is acked after its publish is confirmed. Runs until `stop`.
pub async fn run_contract_control_consumer(url: &str, stop: CancellationToken) -> Result<()> {
    let connection = connect(url).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    channel.basic_qos(50, BasicQosOptions::default()).await?;
    let mut deliveries = channel
        .basic_consume(
            DUE_QUEUE.into(),
            "contract-control-consumer".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    loop {
        let delivery = tokio::select! {
            _ = stop.cancelled() => break,
            next = deliveries.next() => match next {
                Some(delivery) => delivery?,
                None => break,
            },
        };
        let headers = delivery.properties.headers().clone().unwrap_or_default();
        let get_text = |name: &str| match headers.inner().get(name) {
            Some(AMQPValue::LongString(s)) => {
                Some(String::from_utf8_lossy(s.as_bytes()).into_owned())
            }
            Some(AMQPValue::ShortString(s)) => Some(s.as_str().to_owned()),
            _ => None,
        };
        let due = match headers.inner().get("x-schedule-due-at") {
            Some(AMQPValue::LongLongInt(n)) => *n,
            Some(AMQPValue::LongInt(n)) => i64::from(*n),
            other => bail!("a due time the contract consumer cannot read: {other:?}"),
        };
        let (exchange, routing_key, properties) = if due - now_ms() as i64 >= 1_000 {
            (
                EXCHANGE.to_string(),
                next_queue(due - now_ms() as i64).to_string(),
                delivery.properties.clone(),
            )
        } else {
            let mut kept = FieldTable::default();
            for (name, value) in &headers {
                if !name.as_str().starts_with("x-schedule-") {
                    kept.insert(name.clone(), value.clone());
                }
            }
            let content_type =
                get_text("x-schedule-content-type").unwrap_or_else(|| "application/json".into());
            (
                get_text("x-schedule-exchange").ok_or_else(|| anyhow!("no exchange header"))?,
                get_text("x-schedule-routing-key")
                    .ok_or_else(|| anyhow!("no routing key header"))?,
                delivery
                    .properties
                    .clone()
                    .with_headers(kept)
                    .with_content_type(content_type.as_str().into()),
            )
        };
        let confirm = channel
            .basic_publish(
                exchange.as_str().into(),
                routing_key.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &delivery.data,
                properties,
            )
            .await?
            .await?;
        if !confirm.is_ack() {
            bail!("the contract consumer's publish was not confirmed");
        }
        delivery.acker.ack(BasicAckOptions::default()).await?;
    }
    let _ = connection.close(200, "done".into()).await;
    Ok(())
}

/// Final deliveries on a queue, each with the time (epoch ms) it arrived.
pub struct Arrivals {
    received: mpsc::UnboundedReceiver<(u64, ReceivedMessage)>,
    stop: CancellationToken,
}

impl Arrivals {
    /// Starts consuming `queue` (auto-ack) on `url`.
    pub async fn watch(url: &str, queue: &str) -> Result<Self> {
        let connection = connect(url).await?;
        let channel = connection.create_channel().await?;
        let mut deliveries = channel
            .basic_consume(
                queue.into(),
                "arrivals".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        let (tx, received) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            loop {
                let delivery = tokio::select! {
                    _ = stopped.cancelled() => break,
                    next = deliveries.next() => match next {
                        Some(Ok(delivery)) => delivery,
                        _ => break,
                    },
                };
                let at = now_ms();
                let message = ReceivedMessage {
                    body: delivery.data,
                    exchange: delivery.exchange.to_string(),
                    routing_key: delivery.routing_key.to_string(),
                    redelivered: delivery.redelivered,
                    content_type: delivery
                        .properties
                        .content_type()
                        .as_ref()
                        .map(|c| c.to_string()),
                    message_id: delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .map(|m| m.to_string()),
                    headers: delivery.properties.headers().clone().unwrap_or_default(),
                    properties: delivery.properties,
                };
                if tx.send((at, message)).is_err() {
                    break;
                }
            }
            let _ = connection.close(200, "done".into()).await;
        });
        Ok(Self { received, stop })
    }

    /// The next arrival, within `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Result<(u64, ReceivedMessage)> {
        tokio::time::timeout(timeout, self.received.recv())
            .await
            .map_err(|_| anyhow!("nothing arrived within {timeout:?}"))?
            .ok_or_else(|| anyhow!("the watcher stopped"))
    }

    /// Whatever arrives within `window` (to show nothing more does).
    pub async fn more_within(&mut self, window: Duration) -> Vec<(u64, ReceivedMessage)> {
        let mut more = Vec::new();
        while let Ok(Some(arrival)) = tokio::time::timeout(window, self.received.recv()).await {
            more.push(arrival);
        }
        more
    }
}

impl Drop for Arrivals {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Publishes every message of `messages` to `acemq.schedule` on the rung
/// for its time left, mandatory, over one channel with up to `window`
/// confirms in flight: each must be confirmed into a rung.
pub async fn schedule_all(
    url: &str,
    style: Style,
    messages: &[Scheduled<'_>],
    window: usize,
) -> Result<()> {
    let connection = connect(url).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut pending = std::collections::VecDeque::new();
    for message in messages {
        let (routing_key, properties) = scheduled_properties(style, message);
        let confirm = channel
            .basic_publish(
                EXCHANGE.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                message.body,
                properties,
            )
            .await?;
        pending.push_back(confirm);
        if pending.len() >= window {
            confirmed_into_a_rung(pending.pop_front().expect("one pending").await?)?;
        }
    }
    for confirm in pending {
        confirmed_into_a_rung(confirm.await?)?;
    }
    let _ = connection.close(200, "done".into()).await;
    Ok(())
}

/// A scheduled message's confirm: acked, and not returned unroutable.
fn confirmed_into_a_rung(confirm: lapin::Confirmation) -> Result<()> {
    if !confirm.is_ack() {
        bail!("a scheduled message was not confirmed: {confirm:?}");
    }
    if let Some(returned) = confirm.take_message() {
        bail!(
            "a scheduled message reached no rung: {}",
            returned.reply_text
        );
    }
    Ok(())
}
