//! AMQP and management-API helpers for assertions.
//!
//! Every AMQP helper opens its own connection and closes it before
//! returning: lapin connections belong to the tokio runtime that opened them
//! and each `#[tokio::test]` has its own runtime; and a failed declaration
//! closes its channel, which must not poison anything shared.

use super::{Broker, encode_path_segment};
use crate::watchdog;
use acemq_host::broker::lost::{ended, until_lost};
use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use serde_json::Value;
use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

/// Confirms in flight in [`Broker::publish_many`]. Awaiting each confirm
/// before the next publish gives ~800 msg/s on a quorum queue here; a window
/// of hundreds gives the broker's full rate.
const CONFIRM_WINDOW: usize = 500;
/// How long [`Broker::publish_many`] waits for one confirm before it
/// publishes what was not confirmed again.
const CONFIRM_WAIT: Duration = Duration::from_secs(30);
/// How many times [`Broker::publish_many`] publishes what is not confirmed.
const PUBLISH_ATTEMPTS: usize = 3;
/// Poll interval of [`Broker::wait_for_message_count`].
const COUNT_POLL: Duration = Duration::from_millis(50);
/// How long [`Broker::drain`] waits for the consumer to wind down after
/// `basic.cancel`; only a broken connection makes it matter.
const CANCEL_GRACE: Duration = Duration::from_secs(5);
/// How long [`Broker::start`] probes the listeners after `rabbitmqctl wait`.
const ENDPOINT_TIMEOUT: Duration = Duration::from_secs(30);

/// A message taken off a queue by [`Broker::drain`].
#[derive(Debug, Clone)]
pub struct ReceivedMessage {
    pub body: Vec<u8>,
    pub exchange: String,
    pub routing_key: String,
    pub redelivered: bool,
    pub content_type: Option<String>,
    pub message_id: Option<String>,
    /// Empty when the message had no headers.
    pub headers: FieldTable,
    /// Everything else (correlation id, delivery mode, expiration...).
    pub properties: BasicProperties,
}

impl ReceivedMessage {
    /// The body as text (invalid UTF-8 replaced), for assertions.
    pub fn body_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }

    /// One header by name.
    pub fn header(&self, name: &str) -> Option<&AMQPValue> {
        self.headers.inner().get(name)
    }

    /// The reason the host wrote on a message it set aside
    /// (`x-acemq-error`); panics, naming what it found, when there is none.
    pub fn acemq_error(&self) -> String {
        self.string_header("x-acemq-error").unwrap_or_else(|| {
            panic!(
                "x-acemq-error missing or not a string: {:?}",
                self.header("x-acemq-error")
            )
        })
    }

    /// A header written as a (long) string, as text.
    pub fn string_header(&self, name: &str) -> Option<String> {
        match self.header(name)? {
            AMQPValue::LongString(s) => Some(s.to_string()),
            AMQPValue::ShortString(s) => Some(s.to_string()),
            _ => None,
        }
    }

    fn from_delivery(delivery: Delivery) -> ReceivedMessage {
        let properties = delivery.properties;
        ReceivedMessage {
            body: delivery.data,
            exchange: delivery.exchange.to_string(),
            routing_key: delivery.routing_key.to_string(),
            redelivered: delivery.redelivered,
            content_type: properties.content_type().as_ref().map(|s| s.to_string()),
            message_id: properties.message_id().as_ref().map(|s| s.to_string()),
            headers: properties.headers().clone().unwrap_or_default(),
            properties,
        }
    }
}

/// How long one connection attempt of the harness may take, and how many.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(20);
const CONNECT_ATTEMPTS: u32 = 3;

impl Broker {
    /// A new AMQP connection (default properties, named `acemq-tests` in the
    /// management UI). Must be called inside a tokio runtime.
    ///
    /// Each attempt is bounded and tried again: a connection attempt that
    /// lapin never completed (no socket at the broker, nothing pending) once
    /// held a test for good under load.
    pub async fn connect(&self) -> Result<Connection> {
        let mut attempt = 1;
        loop {
            let connecting = Connection::connect(
                &self.amqp_url,
                ConnectionProperties::default().with_connection_name("acemq-tests".into()),
            );
            match tokio::time::timeout(CONNECT_ATTEMPT, connecting).await {
                Ok(connected) => {
                    return connected.with_context(|| format!("connecting to {}", self.amqp_url));
                }
                Err(_) if attempt < CONNECT_ATTEMPTS => attempt += 1,
                Err(_) => bail!(
                    "connecting to {} did not complete in {CONNECT_ATTEMPTS} attempts of {CONNECT_ATTEMPT:?}",
                    self.amqp_url
                ),
            }
        }
    }

    /// Declares a durable queue of `queue_type` (`classic`, `quorum`,
    /// `stream`) with `x-queue-type` and the `extra` arguments, as a test
    /// sets one up outside the host. Fails with the broker's refusal.
    pub async fn declare_queue(
        &self,
        name: &str,
        queue_type: &str,
        extra: &[(&str, AMQPValue)],
    ) -> Result<()> {
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString(queue_type.into()),
        );
        for (key, value) in extra {
            arguments.insert((*key).into(), value.clone());
        }
        let options = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        self.on_channel(
            format!("declaring the {queue_type} queue {name}"),
            async |channel| {
                channel
                    .queue_declare(name.into(), options, arguments)
                    .await?;
                Ok(())
            },
        )
        .await
    }

    /// Ready messages in `queue` (unacknowledged ones are not counted), from
    /// a passive `queue.declare`: exact and current, unlike the management
    /// API's counts, which lag 5-8 s. Fails if the queue does not exist.
    pub async fn message_count(&self, queue: &str) -> Result<u32> {
        self.on_channel(format!("counting queue {queue:?}"), async |channel| {
            passive_count(&channel, queue).await
        })
        .await
    }

    /// Polls [`Broker::message_count`] until the queue holds at least
    /// `expected` ready messages or `timeout` passes; returns the last count
    /// seen, for the caller to assert on.
    pub async fn wait_for_message_count(
        &self,
        queue: &str,
        expected: u32,
        timeout: Duration,
    ) -> Result<u32> {
        let deadline = Instant::now() + timeout;
        self.on_channel(
            format!("waiting for {expected} messages in queue {queue:?}"),
            async |channel| loop {
                let count = passive_count(&channel, queue).await?;
                if count >= expected || Instant::now() >= deadline {
                    return Ok(count);
                }
                tokio::time::sleep(COUNT_POLL).await;
            },
        )
        .await
    }

    /// Consumes up to `expected` messages from `queue`, acknowledging them,
    /// and returns them in delivery order. Returns fewer if `timeout` passes
    /// first (assert on the length). Returns at once for `expected == 0`.
    ///
    /// Prefetch is `expected` and acks are sent only at the end, so the
    /// broker never hands out a message beyond the ones asked for: nothing
    /// is requeued behind the caller's back (which on a quorum queue would
    /// bump `x-delivery-count`). Above 65 535 the prefetch is capped and
    /// acks go out per batch. Classic and quorum queues; a stream needs its
    /// own consumer with an `x-stream-offset`.
    pub async fn drain(
        &self,
        queue: &str,
        expected: usize,
        timeout: Duration,
    ) -> Result<Vec<ReceivedMessage>> {
        if expected == 0 {
            return Ok(Vec::new());
        }
        let deadline = Instant::now() + timeout;
        self.on_channel(format!("draining queue {queue:?}"), async |channel| {
            drain_on(&channel, queue, expected, deadline).await
        })
        .await
    }

    /// Publishes one message with publisher confirms, `mandatory` set:
    /// fails if the broker returns it as unroutable or nacks it.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<()> {
        self.publish_many(exchange, routing_key, [(body, properties)])
            .await
            .map(drop)
    }

    /// Publishes many messages like [`Broker::publish`] over one channel,
    /// keeping up to 500 confirms in flight; returns how many were confirmed
    /// (all of them, or an error).
    ///
    /// A confirm the broker withholds (RabbitMQ 3.10 can, for a stream
    /// whose leader's node went down while messages were on their way to
    /// it: seen once, the publish waiting 11 minutes) is waited for
    /// [`CONFIRM_WAIT`]; then what was not confirmed is published again on a
    /// new channel, at most [`PUBLISH_ATTEMPTS`] times in all. At least
    /// once, as the host publishes.
    pub async fn publish_many<B, I>(
        &self,
        exchange: &str,
        routing_key: &str,
        messages: I,
    ) -> Result<usize>
    where
        B: AsRef<[u8]>,
        I: IntoIterator<Item = (B, BasicProperties)>,
    {
        let messages: Vec<(B, BasicProperties)> = messages.into_iter().collect();
        let mut from = 0;
        for attempt in 1..=PUBLISH_ATTEMPTS {
            let what = format!(
                "publishing to exchange {exchange:?} with routing key {routing_key:?} (attempt {attempt})"
            );
            let left = &messages[from..];
            let confirmed = self
                .on_channel(what, async |channel| {
                    publish_in_order(&channel, exchange, routing_key, left).await
                })
                .await?;
            from += confirmed;
            if from == messages.len() {
                return Ok(messages.len());
            }
        }
        bail!(
            "publishing to exchange {exchange:?} with routing key {routing_key:?}: the broker \
             confirmed none of messages {from}.. of {} within {} s, {PUBLISH_ATTEMPTS} times",
            messages.len(),
            CONFIRM_WAIT.as_secs()
        )
    }

    /// Deletes a queue (whatever it holds). Deleting a missing queue is not
    /// an error in RabbitMQ 3.10.
    pub async fn delete_queue(&self, name: &str) -> Result<()> {
        self.on_channel(format!("deleting queue {name:?}"), async |channel| {
            channel
                .queue_delete(name.into(), QueueDeleteOptions::default())
                .await?;
            Ok(())
        })
        .await
    }

    /// Deletes an exchange (and its bindings). Deleting a missing exchange
    /// is not an error in RabbitMQ 3.10.
    pub async fn delete_exchange(&self, name: &str) -> Result<()> {
        self.on_channel(format!("deleting exchange {name:?}"), async |channel| {
            channel
                .exchange_delete(name.into(), ExchangeDeleteOptions::default())
                .await?;
            Ok(())
        })
        .await
    }

    /// Runs `work` on a channel of a connection of its own, registered with
    /// the [`watchdog`] as `what` (also the context of its error), then
    /// closes the channel and the connection, in that order.
    ///
    /// The channel is closed first, waiting for its close-ok, for two
    /// reasons. The broker has then settled every ack sent on it (closing
    /// only the connection once left a drained quorum queue counting its 3
    /// messages ready again under load). And a channel dropped while the
    /// connection closes races lapin's own close of it against the
    /// connection's: the broker then logs "client unexpectedly closed TCP
    /// connection" and lapin reports a connection error after the close.
    ///
    /// The work is raced against the broker blocking the connection (a
    /// resource alarm; see [`blocked`]), which would leave it waiting for
    /// ever.
    async fn on_channel<T>(
        &self,
        what: String,
        work: impl AsyncFnOnce(Channel) -> Result<T>,
    ) -> Result<T> {
        let _step = watchdog::step(what.clone());
        let connection = self.connect().await.with_context(|| what.clone())?;
        let result: Result<T> = async {
            // lapin's steps are raced against the connection's end: see
            // `acemq_host::broker::lost`.
            let channel = until_lost(&connection, connection.create_channel()).await?;
            let done = tokio::select! {
                biased;
                done = work(channel.clone()) => done,
                blocked = blocked(&connection) => Err(blocked),
                state = ended(&connection) => Err(anyhow!("the connection ended ({state:?}) while the helper waited on the broker")),
            };
            if channel.status().connected() && !connection.status().blocked() {
                let closing = channel.close(200, "acemq-tests helper done".into());
                let _ = until_lost(&connection, closing).await;
            }
            done
        }
        .await;
        close(&connection).await;
        result.with_context(|| what)
    }

    /// `GET {mgmt_url}{path}` as `guest` (or the external broker's user),
    /// e.g. `/api/overview`, `/api/consumers/%2F`. Fails on a non-2xx status
    /// with the response body. Blocking (a few ms on loopback).
    pub fn management_get(&self, path: &str) -> Result<Value> {
        let url = format!("{}{path}", self.mgmt_url);
        let mut response = self
            .http
            .get(&url)
            .header("Authorization", self.mgmt_auth.as_str())
            .call()
            .with_context(|| format!("GET {url}"))?;
        let status = response.status();
        let body = response
            .body_mut()
            .read_to_string()
            .with_context(|| format!("GET {url}: reading the body"))?;
        if !status.is_success() {
            bail!("GET {url}: {status}: {body}");
        }
        serde_json::from_str(&body).with_context(|| format!("GET {url}: invalid JSON: {body}"))
    }

    /// `GET /api/queues/{vhost}/{name}`: `type` (classic/quorum/stream),
    /// `durable`, `auto_delete`, `exclusive`, `arguments` (exactly as
    /// declared), `consumers`... Its message counts lag: use
    /// [`Broker::message_count`] for those. Fails if the queue is missing.
    pub fn queue_info(&self, name: &str) -> Result<Value> {
        self.management_get(&format!(
            "/api/queues/{}/{}",
            self.vhost_path,
            encode_path_segment(name)
        ))
    }

    /// `GET /api/exchanges/{vhost}/{name}`: `type`, `durable`, `auto_delete`,
    /// `internal`, `arguments`.
    pub fn exchange_info(&self, name: &str) -> Result<Value> {
        self.management_get(&format!(
            "/api/exchanges/{}/{}",
            self.vhost_path,
            encode_path_segment(name)
        ))
    }

    /// `GET /api/queues/{vhost}/{queue}/bindings`: one object per binding
    /// (`source`, `destination`, `routing_key`, `arguments`), including the
    /// default exchange's implicit binding (`source` "").
    pub fn bindings(&self, queue: &str) -> Result<Vec<Value>> {
        let value = self.management_get(&format!(
            "/api/queues/{}/{}/bindings",
            self.vhost_path,
            encode_path_segment(queue)
        ))?;
        match value {
            Value::Array(bindings) => Ok(bindings),
            other => Err(anyhow!(
                "bindings of {queue:?}: expected an array, got {other}"
            )),
        }
    }

    /// After `rabbitmqctl wait` the listeners should be up already (it waits
    /// for the plugins too); probing them makes "started" mean "usable".
    pub(super) fn wait_for_endpoints(&self) -> Result<()> {
        let deadline = std::time::Instant::now() + ENDPOINT_TIMEOUT;
        loop {
            let amqp = std::net::TcpStream::connect((self.amqp_host.as_str(), self.amqp_port))
                .map(drop)
                .context("AMQP port");
            let probe = amqp.and_then(|()| self.management_get("/api/overview").map(drop));
            match probe {
                Ok(()) => return Ok(()),
                Err(error) if std::time::Instant::now() >= deadline => {
                    return Err(error.context(format!(
                        "listeners not reachable {ENDPOINT_TIMEOUT:?} after `rabbitmqctl wait`"
                    )));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

async fn passive_count(channel: &Channel, queue: &str) -> Result<u32> {
    Ok(passive_declare(channel, queue).await?.message_count())
}

/// A passive `queue.declare`: the queue's exact ready and consumer counts.
/// Fails (and the broker closes `channel`) if the queue does not exist.
pub async fn passive_declare(channel: &Channel, queue: &str) -> Result<lapin::Queue> {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("passive declare of queue {queue:?}"))
}

async fn drain_on(
    channel: &Channel,
    queue: &str,
    expected: usize,
    deadline: Instant,
) -> Result<Vec<ReceivedMessage>> {
    let prefetch = u16::try_from(expected).unwrap_or(u16::MAX);
    // Per consumer (global QoS is rejected by quorum queues).
    channel
        .basic_qos(prefetch, BasicQosOptions { global: false })
        .await?;
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut received = Vec::with_capacity(expected);
    let mut last_tag = None;
    let mut unacked = 0usize;
    while received.len() < expected {
        let delivery = match tokio::time::timeout_at(deadline, consumer.next()).await {
            Err(_elapsed) => break,
            Ok(None) => bail!("the broker cancelled the consumer"),
            Ok(Some(delivery)) => delivery?,
        };
        last_tag = Some(delivery.delivery_tag);
        received.push(ReceivedMessage::from_delivery(delivery));
        unacked += 1;
        // Only for expected > 65 535: free the window for the next batch.
        if unacked == usize::from(prefetch) && received.len() < expected {
            ack_up_to(channel, last_tag).await?;
            unacked = 0;
        }
    }
    channel
        .basic_cancel(consumer.tag(), BasicCancelOptions::default())
        .await?;
    // Deliveries that crossed the cancel (after a timeout) are kept and
    // acked too, rather than requeued with a bumped delivery count.
    while let Ok(Some(delivery)) = tokio::time::timeout(CANCEL_GRACE, consumer.next()).await {
        let delivery = delivery?;
        last_tag = Some(delivery.delivery_tag);
        received.push(ReceivedMessage::from_delivery(delivery));
    }
    ack_up_to(channel, last_tag).await?;
    Ok(received)
}

async fn ack_up_to(channel: &Channel, tag: Option<u64>) -> Result<()> {
    if let Some(tag) = tag {
        channel
            .basic_ack(tag, lapin::options::BasicAckOptions { multiple: true })
            .await?;
    }
    Ok(())
}

/// Publishes `messages` on `channel` (in confirm mode), up to
/// [`CONFIRM_WINDOW`] awaiting their confirms; how many were confirmed, in
/// order, before one was withheld for [`CONFIRM_WAIT`] (all of them when
/// none was). A nack or a return is an error.
async fn publish_in_order<B: AsRef<[u8]>>(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    messages: &[(B, BasicProperties)],
) -> Result<usize> {
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let mut pending = VecDeque::new();
    let mut confirmed = 0;
    let settle = async |confirm| -> Result<bool> {
        let Ok(confirmation) = tokio::time::timeout(CONFIRM_WAIT, confirm_result(confirm)).await
        else {
            return Ok(false);
        };
        check_confirmation(confirmation?, exchange, routing_key)?;
        Ok(true)
    };
    for (body, properties) in messages {
        if pending.len() >= CONFIRM_WINDOW
            && let Some(confirm) = pending.pop_front()
        {
            if !settle(confirm).await? {
                return Ok(confirmed);
            }
            confirmed += 1;
        }
        let confirm = channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                options,
                body.as_ref(),
                properties.clone(),
            )
            .await?;
        pending.push_back(confirm);
    }
    for confirm in pending {
        if !settle(confirm).await? {
            return Ok(confirmed);
        }
        confirmed += 1;
    }
    Ok(confirmed)
}

async fn confirm_result(confirm: lapin::PublisherConfirm) -> Result<Confirmation> {
    confirm.await.context("waiting for the publisher confirm")
}

fn check_confirmation(confirmation: Confirmation, exchange: &str, routing_key: &str) -> Result<()> {
    match confirmation {
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        // lapin may pair a return with a different confirm than its own
        // publish, so the error names the returned message, not an index.
        Confirmation::Ack(Some(returned)) => bail!(
            "the broker returned a message (message id {:?}) published to exchange \
             {exchange:?} with routing key {routing_key:?}: {} {}",
            returned.delivery.properties.message_id(),
            returned.reply_code,
            returned.reply_text
        ),
        Confirmation::Nack(_) => bail!(
            "the broker nacked a message published to exchange {exchange:?} with \
             routing key {routing_key:?}"
        ),
    }
}

/// Closes a helper's connection; a failure only means it is gone already.
/// A blocked connection is left to be dropped: its close would never be
/// written (see [`blocked`]).
async fn close(connection: &Connection) {
    if connection.status().blocked() {
        return;
    }
    let closing = connection.close(200, "acemq-tests helper done".into());
    let _ = until_lost(connection, closing).await;
}

/// Completes, with the error to report, once the broker has blocked
/// `connection` (a memory or disk alarm, at its first publish).
///
/// Why a wait on such a connection never ends: lapin writes no frame at all
/// on a connection the broker blocked (not a confirm's publish, not a
/// channel or connection close, not a heartbeat: its io loop only writes
/// while the connection is not blocked), and the broker reads nothing from
/// it until the alarm ends. A broker that simply closes a channel or the
/// connection is no such case: lapin then fails every call waiting on it.
/// Tests on the shared broker never raise an alarm, so one there is a fault
/// of the machine (a full disk): named, rather than a test that hangs.
/// (A connection that fails while a step awaits the broker's reply is
/// another case, where lapin may leave the step pending: [`ended`] races
/// those.)
async fn blocked(connection: &Connection) -> anyhow::Error {
    while !connection.status().blocked() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow!(
        "the broker blocked the connection (a resource alarm: memory or disk, see its log); \
         nothing can be published, or even closed, on it until the alarm ends"
    )
}
