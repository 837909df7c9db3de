//! One subscription: consume a queue with manual acks and a prefetch, hand
//! each delivery to a function, and stop in the order that keeps every
//! settlement.
//!
//! This file knows AMQP and nothing of what a delivery means: the function
//! it is given (the message pipeline, `crate::delivery`) decides and carries
//! out each delivery's settlement through the delivery's [`Receipt`]. What
//! it guarantees is the mechanics around that:
//! - at most `concurrency` deliveries are worked on at once (the function
//!   gets a [`Slot`] and frees it when its concurrency-bound part is done);
//! - acks are coalesced ([`super::acks`]), and a requeue is never passed over
//!   by a `multiple` ack;
//! - shutdown settles every delivery exactly once: drain, flush acks, cancel,
//!   close (see [`run`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{Acker, BasicProperties, Channel, Connection};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::acks::{AckBatcher, OldestUnsettled};
use super::driver_wake::DriverWoken;
use super::lost::until_lost;
use super::placement::Placement;
use super::stream::{OFFSET_ARGUMENT, StreamOffset, StreamPosition, SubscriptionPosition};

/// What to consume, and how much at once.
#[derive(Debug, Clone)]
pub struct SubscriptionSpec {
    pub queue: String,
    /// Deliveries the broker may send ahead of their acks.
    pub prefetch: u16,
    /// Deliveries worked on at once.
    pub concurrency: usize,
    /// Stop cleanly after this long, as at shutdown but for this
    /// subscription alone (a careful one, replaced by a normal one).
    pub ends_after: Option<Duration>,
    /// For a stream: where to start, and where the next subscription
    /// resumes (see `stream.rs`).
    pub stream: Option<Arc<StreamPosition>>,
    /// The consumer tag, when the consumer has a stable name; a unique one
    /// otherwise.
    pub consumer_tag: Option<String>,
    /// For a stream read over the stream protocol: its listeners (`None`:
    /// over AMQP 0-9-1). See `stream_protocol/`.
    pub stream_protocol: Option<Arc<super::stream_protocol::StreamEndpoints>>,
}

/// Shared by every subscription of the host.
#[derive(Clone)]
pub struct SubscriptionEnv {
    /// Cancelled when the host shuts down: no delivery starts after it.
    pub shutdown: CancellationToken,
    /// How long running deliveries may take to finish at shutdown.
    pub drain_timeout: Duration,
    /// What each subscription is doing: `/health` is UP only when every
    /// one holds its consumer (consume-ok received, not yet cancelled).
    pub board: Arc<Board>,
}

/// Whether each queue's subscription is reading, and if not, why.
#[derive(Debug, Default)]
pub struct Board {
    queues: Mutex<BTreeMap<String, Reading>>,
    /// Each subscribed queue's oldest unsettled delivery.
    oldest: Mutex<BTreeMap<String, Arc<OldestUnsettled>>>,
    /// Each stream consumer's position.
    streams: Mutex<BTreeMap<String, Arc<StreamPosition>>>,
}

/// A stream consumer's progress, for the metrics.
#[derive(Debug, Clone)]
pub struct StreamProgress {
    pub queue: String,
    /// The offset it resumes from.
    pub position: Option<u64>,
    /// Since its checkpoint was last saved.
    pub checkpoint_age: Option<Duration>,
    /// Messages between its position and the newest probed.
    pub lag: Option<u64>,
    /// Checkpoint reads and saves that failed.
    pub checkpoint_failures: u64,
}

/// One subscription's state on the [`Board`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    /// Holds its consumer.
    Consuming,
    /// Not reading now; why (waiting for the connection, restarting after
    /// a failure).
    Stopped { reason: String },
    /// A stream consumer that another host reads under the same consumer
    /// name (it holds the lease): this one takes over when that one stops.
    /// Nothing is wrong with it.
    StandingBy { reason: String },
}

impl Reading {
    /// The word `/health` and the status page show.
    pub fn word(&self) -> &'static str {
        match self {
            Reading::Consuming => "consuming",
            Reading::Stopped { .. } => "stopped",
            Reading::StandingBy { .. } => "standing_by",
        }
    }

    /// Why it is not reading, when it is not.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Reading::Consuming => None,
            Reading::Stopped { reason } | Reading::StandingBy { reason } => Some(reason),
        }
    }

    /// Settled: reading, or standing by for another host (what a start
    /// waits for before it says it is ready).
    pub fn is_settled(&self) -> bool {
        !matches!(self, Reading::Stopped { .. })
    }
}

impl Board {
    /// Puts `queue` on the board, not reading yet.
    pub fn expect(&self, queue: &str) {
        self.set(
            queue,
            Reading::Stopped {
                reason: "not subscribed yet".to_string(),
            },
        );
    }

    pub fn set(&self, queue: &str, reading: Reading) {
        self.queues
            .lock()
            .expect("board poisoned")
            .insert(queue.to_string(), reading);
    }

    /// How long each subscribed queue's oldest unsettled delivery has
    /// waited (`None`: everything settled).
    pub fn oldest_unsettled(&self) -> Vec<(String, Option<Duration>)> {
        let oldest = self.oldest.lock().expect("board poisoned");
        oldest.iter().map(|(q, o)| (q.clone(), o.age())).collect()
    }

    /// Each stream consumer's position: where it would resume, and how
    /// long ago its checkpoint was saved.
    pub fn stream_progress(&self) -> Vec<StreamProgress> {
        let streams = self.streams.lock().expect("board poisoned");
        streams
            .iter()
            .map(|(queue, p)| {
                let (position, checkpoint_age) = p.progress();
                StreamProgress {
                    queue: queue.clone(),
                    position,
                    checkpoint_age,
                    lag: p.lag(),
                    checkpoint_failures: p.checkpoint_failures(),
                }
            })
            .collect()
    }

    fn track_stream(&self, queue: &str, position: &Arc<StreamPosition>) {
        self.streams
            .lock()
            .expect("board poisoned")
            .insert(queue.to_string(), position.clone());
    }

    fn track_oldest(&self, queue: &str, oldest: Option<Arc<OldestUnsettled>>) {
        let mut map = self.oldest.lock().expect("board poisoned");
        match oldest {
            Some(oldest) => map.insert(queue.to_string(), oldest),
            None => map.remove(queue),
        };
    }

    /// Every queue and its state, by name.
    pub fn snapshot(&self) -> Vec<(String, Reading)> {
        let queues = self.queues.lock().expect("board poisoned");
        queues.iter().map(|(q, r)| (q.clone(), r.clone())).collect()
    }
}

/// A delivery as the subscription hands it over: the message's parts,
/// moved out of lapin's delivery, and the means to settle it.
pub struct Received {
    pub exchange: ShortString,
    pub routing_key: ShortString,
    pub redelivered: bool,
    pub properties: BasicProperties,
    /// Not copied: lapin's buffer, or a slice of a stream chunk.
    pub body: bytes::Bytes,
    /// The only way to settle it.
    pub receipt: Receipt,
    /// One of the subscription's `concurrency` places, held until dropped.
    pub slot: Slot,
}

impl Received {
    fn new(
        delivery: lapin::message::Delivery,
        acks: Arc<AckBatcher>,
        slot: Slot,
        in_hand: Option<OwnedSemaphorePermit>,
        read_again: Option<CancellationToken>,
        channel_lost: CancellationToken,
    ) -> Self {
        Self {
            exchange: delivery.exchange,
            routing_key: delivery.routing_key,
            redelivered: delivery.redelivered,
            properties: delivery.properties,
            body: delivery.data.into(),
            receipt: Receipt {
                tag: delivery.delivery_tag,
                _in_hand: in_hand,
                read_again,
                settle: Settle::Amqp {
                    acks,
                    acker: delivery.acker,
                },
                channel_lost,
                settled: AtomicBool::new(false),
            },
            slot,
        }
    }

    /// A message read over the stream protocol, at `offset` (its tag in
    /// `position`), as an AMQP 0-9-1 consumer would have received it.
    pub(super) fn from_stream_protocol(
        view: super::stream_protocol::amqp10::Amqp091View,
        offset: u64,
        position: SubscriptionPosition,
        places: (Slot, OwnedSemaphorePermit),
        read_again: CancellationToken,
        connection_lost: CancellationToken,
    ) -> Self {
        let (slot, in_hand) = places;
        Self {
            exchange: view.exchange.into(),
            routing_key: view.routing_key.into(),
            redelivered: false,
            properties: view.properties,
            body: view.body,
            receipt: Receipt {
                tag: offset,
                _in_hand: Some(in_hand),
                read_again: Some(read_again),
                settle: Settle::StreamProtocol { position },
                channel_lost: connection_lost,
                settled: AtomicBool::new(false),
            },
            slot,
        }
    }
}

/// A place among the deliveries worked on at once. Dropping it lets the
/// next delivery start.
pub struct Slot(#[allow(dead_code)] OwnedSemaphorePermit);

impl Slot {
    pub(super) fn new(permit: OwnedSemaphorePermit) -> Self {
        Self(permit)
    }
}

/// Settles one delivery: an ack (coalesced with others) or a requeue.
pub struct Receipt {
    tag: u64,
    /// A stream delivery's place in the subscription's window of
    /// `prefetch` deliveries in hand, given up when the receipt is dropped.
    _in_hand: Option<OwnedSemaphorePermit>,
    /// For a stream delivery: its subscription's signal that a delivery is
    /// to be read again ([`Receipt::read_again`]).
    read_again: Option<CancellationToken>,
    settle: Settle,
    /// Cancelled when the channel it came on fails: it can no longer be
    /// settled, and the broker delivers it again.
    channel_lost: CancellationToken,
    /// Acked, requeued or left to be read again. A receipt dropped
    /// unsettled (the work around it panicked, or was cancelled) requeues
    /// its delivery (a stream delivery: leaves it to be read again):
    /// otherwise it would stay unacknowledged, and hold back every
    /// `multiple` ack above it.
    settled: AtomicBool,
}

/// How a delivery's settlement reaches the broker.
enum Settle {
    /// Acked (coalesced with others) or nacked on its AMQP channel.
    Amqp { acks: Arc<AckBatcher>, acker: Acker },
    /// Read over the stream protocol: nothing goes back to the broker (the
    /// credit is per chunk, see `stream_protocol/reader.rs`); its work done
    /// moves the consumer's position.
    StreamProtocol { position: SubscriptionPosition },
}

impl Receipt {
    /// Its channel failed: an ack or requeue would go nowhere.
    pub fn is_lost(&self) -> bool {
        self.channel_lost.is_cancelled()
    }

    /// Completes when its channel fails.
    pub async fn lost(&self) {
        self.channel_lost.cancelled().await;
    }

    /// The delivery's work is done: it is acked with the next batch.
    pub async fn ack(&self) {
        self.settled.store(true, Ordering::Relaxed);
        match &self.settle {
            Settle::Amqp { acks, .. } => acks.ready(self.tag).await,
            Settle::StreamProtocol { position } => position.done(self.tag),
        }
    }

    /// Gives the delivery back to its queue now; it comes back as a new
    /// delivery. Only once the nack is written may a `multiple` ack pass
    /// over it (see acks.rs). Not for a stream delivery: the broker does
    /// not deliver a requeued stream message again, and closes the channel
    /// (see [`Receipt::read_again`]).
    pub async fn requeue(&self) {
        match &self.settle {
            Settle::Amqp { acks, acker } => {
                self.settled.store(true, Ordering::Relaxed);
                requeue(acker, acks, self.tag).await;
            }
            Settle::StreamProtocol { .. } => self.read_again(),
        }
    }

    /// Refuses the delivery for good (`basic.reject`, no requeue): the
    /// broker dead-letters it where its queue says, or drops it. Only for
    /// a message that can never be handled (the scheduler's, missing the
    /// headers that say where it goes).
    pub async fn reject(&self) {
        let Settle::Amqp { acks, acker } = &self.settle else {
            // A stream keeps every message: there is nothing to refuse.
            tracing::error!(
                offset = self.tag,
                "a stream message cannot be rejected; it is read again"
            );
            self.read_again();
            return;
        };
        self.settled.store(true, Ordering::Relaxed);
        let options = BasicNackOptions {
            multiple: false,
            requeue: false,
        };
        if let Err(e) = acker.nack(options).await {
            tracing::warn!(delivery_tag = self.tag, error = %e, "reject failed; the broker will redeliver");
        }
        acks.forget(self.tag);
    }

    /// Whether it came from a stream.
    pub fn is_stream(&self) -> bool {
        self.read_again.is_some()
    }

    /// A stream delivery's way back: neither acked nor requeued, its work
    /// counts as not done, so the stream's position stays at or below its
    /// offset. Its subscription ends (unless it is ending already, at
    /// shutdown or with its channel) and the next one starts reading at
    /// the lowest offset not done: this one again.
    pub fn read_again(&self) {
        self.settled.store(true, Ordering::Relaxed);
        // Never acked now, and never to be nacked: no `multiple` ack may
        // wait for it (a stream's acks only give the broker credit).
        if let Settle::Amqp { acks, .. } = &self.settle {
            acks.forget(self.tag);
        }
        if let Some(read_again) = &self.read_again {
            read_again.cancel();
        }
    }
}

impl Drop for Receipt {
    fn drop(&mut self) {
        if self.settled.load(Ordering::Relaxed) || self.channel_lost.is_cancelled() {
            return;
        }
        if self.is_stream() {
            tracing::error!(
                delivery_tag = self.tag,
                "a stream delivery was dropped unsettled (its handling panicked or was cancelled); it is read again"
            );
            self.read_again();
            return;
        }
        tracing::error!(
            delivery_tag = self.tag,
            "a delivery was dropped unsettled (its handling panicked or was cancelled); requeueing it"
        );
        let Settle::Amqp { acks, acker } = &self.settle else {
            return;
        };
        let (acker, acks, tag) = (acker.clone(), acks.clone(), self.tag);
        // Drop cannot wait: the nack goes out on the runtime, if it still
        // runs (at exit, closing the channel gives the delivery back).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { requeue(&acker, &acks, tag).await });
        }
    }
}

/// Gives delivery `tag` back to its queue. Only once the nack is written may
/// a `multiple` ack pass over it (see acks.rs).
async fn requeue(acker: &Acker, acks: &AckBatcher, tag: u64) {
    let options = BasicNackOptions {
        multiple: false,
        requeue: true,
    };
    if let Err(e) = acker.nack(options).await {
        tracing::warn!(delivery_tag = tag, error = %e, "requeue failed; the broker will redeliver");
    }
    acks.forget(tag);
}

/// Subscribes and hands every delivery to `handle` until shutdown or until
/// the subscription fails; then stops without losing a settlement.
///
/// A stream subscription first finds where to start (its lease, its
/// checkpoint; see `stream.rs`): when that fails, nothing is opened and
/// the error is a [`StartError`] (a standby, or a checkpoint that cannot be
/// read). Whatever way it ends, its position is saved and its lease given
/// up before this returns.
pub async fn run<H, F>(
    connection: &Connection,
    spec: SubscriptionSpec,
    env: SubscriptionEnv,
    handle: &H,
) -> anyhow::Result<()>
where
    H: Fn(Received) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let Some(position) = spec.stream.clone() else {
        return consume(connection, spec, env, handle, None).await;
    };
    let queue = spec.queue.as_str();
    env.board.track_stream(queue, &position);
    let (start, reading) = match position.start(connection).await {
        Ok(started) => started,
        Err(e) => {
            let reason = e.to_string();
            let reading = match &e {
                super::stream::StartError::StandBy(_) => Reading::StandingBy { reason },
                super::stream::StartError::Failed(_) => Reading::Stopped { reason },
            };
            env.board.set(queue, reading);
            return Err(e.into());
        }
    };
    tracing::info!(queue, offset = ?start, protocol = if spec.stream_protocol.is_some() { "stream" } else { "amqp" }, "reading the stream");
    let result = match spec.stream_protocol.clone() {
        Some(endpoints) => {
            // The consume connection holds the consumer name's lease: once
            // it is gone another host may read, so this one stops too.
            let lease_lost = async {
                while connection.status().connected() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            };
            super::stream_protocol::subscription::consume(
                &endpoints, &spec, &env, handle, start, reading, lease_lost,
            )
            .await
        }
        None => consume(connection, spec, env, handle, Some((start, reading))).await,
    };
    // Every delivery that could finish did: where the next run resumes.
    position.finish().await;
    result
}

/// [`run`] once the start is known: `stream` is where a stream subscription
/// starts and its handle on the position. Three phases: subscribe, receive
/// until something ends the subscription, stop.
async fn consume<H, F>(
    connection: &Connection,
    spec: SubscriptionSpec,
    env: SubscriptionEnv,
    handle: &H,
    stream: Option<(StreamOffset, SubscriptionPosition)>,
) -> anyhow::Result<()>
where
    H: Fn(Received) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let queue = spec.queue.as_str();
    let tag = spec
        .consumer_tag
        .clone()
        .unwrap_or_else(|| format!("acemq-host.{}.{}", queue, uuid::Uuid::new_v4().simple()));
    let (start, reading) = stream.unzip();
    let Some((channel, deliveries)) = subscribe(connection, &spec, &env, &tag, start).await? else {
        return Ok(());
    };
    let mut deliveries = DriverWoken::new(deliveries);
    env.board.set(queue, Reading::Consuming);
    tracing::info!(
        queue,
        prefetch = spec.prefetch,
        concurrency = spec.concurrency,
        "consuming"
    );
    let subscribed = Subscribed::start(queue, channel, tag, spec.prefetch, reading.clone());
    env.board
        .track_oldest(queue, Some(subscribed.acks.oldest()));
    let mut receiving = Receiving::new(&spec, &subscribed, reading);
    let failure = receiving
        .receive(&mut deliveries, handle, &env.shutdown, spec.ends_after)
        .await;
    if let Some(failure) = &failure {
        env.board.set(
            queue,
            Reading::Stopped {
                reason: format!("{failure:#}"),
            },
        );
        // Running deliveries stop waiting on a channel that is gone; what
        // they would still publish, the redelivery will.
        if !subscribed.channel.status().connected() {
            receiving.channel_lost.cancel();
        }
    }
    subscribed.stop(receiving.running, env.drain_timeout).await;
    env.board.track_oldest(queue, None);
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Opens the consumer of `spec.queue` as `tag` (a stream's from `start`);
/// `None` when shutdown came first.
///
/// Subscribing waits on the broker with no bound of its own: on a
/// connection that is up but does not answer (a silent broker, a partition
/// the heartbeat has not noticed yet) it would wait until the connection
/// fails, and a stop meanwhile would wait with it. Nothing is subscribed
/// until consume-ok, so a shutdown may simply leave: a channel opened on the
/// way, and anything the broker delivers on it, goes back when the host
/// closes the connection (or the process exits).
async fn subscribe(
    connection: &Connection,
    spec: &SubscriptionSpec,
    env: &SubscriptionEnv,
    tag: &str,
    start: Option<StreamOffset>,
) -> anyhow::Result<Option<(Channel, lapin::Consumer)>> {
    let queue = spec.queue.as_str();
    let mut arguments = FieldTable::default();
    if let Some(start) = start {
        arguments.insert(OFFSET_ARGUMENT.into(), start.to_amqp());
    }
    tokio::select! {
        biased;
        _ = env.shutdown.cancelled() => {
            tracing::info!(queue, "stopped while subscribing; nothing was consumed yet");
            Ok(None)
        }
        opened = open_consumer(connection, queue, spec.prefetch, tag, arguments) => opened.map(Some),
    }
}

/// The receive phase of one subscription: each delivery is admitted (a
/// place in a stream's window, then a free place among `concurrency`) and
/// started, here or on a task of its own (see `placement.rs`).
struct Receiving<'a> {
    queue: &'a str,
    channel: Channel,
    acks: Arc<AckBatcher>,
    /// A stream subscription's position.
    reading: Option<SubscriptionPosition>,
    permits: Arc<Semaphore>,
    /// A stream's deliveries in hand (received, their receipt not yet
    /// dropped): at most the prefetch. The broker keeps to the prefetch on
    /// classic and quorum queues, but sends a stream's chunks whole, past
    /// it; without this window a stream consumer would have a chunk's worth
    /// of outputs awaiting confirms, all read again after a crash.
    in_hand: Option<Arc<Semaphore>>,
    /// Cancelled when the channel fails: see [`Receipt::is_lost`].
    channel_lost: CancellationToken,
    /// Cancelled when a stream delivery is left to be read again (see
    /// [`Receipt::read_again`]): the subscription ends, and the next one
    /// starts at the lowest offset not done.
    read_again: CancellationToken,
    /// Where each delivery's work runs (see `placement.rs`).
    placement: Placement,
    running: JoinSet<()>,
}

impl<'a> Receiving<'a> {
    fn new(
        spec: &SubscriptionSpec,
        subscribed: &Subscribed<'a>,
        reading: Option<SubscriptionPosition>,
    ) -> Self {
        let in_hand = spec
            .stream
            .is_some()
            .then(|| Arc::new(Semaphore::new(usize::from(spec.prefetch.max(1)))));
        Self {
            queue: subscribed.queue,
            channel: subscribed.channel.clone(),
            acks: subscribed.acks.clone(),
            reading,
            permits: Arc::new(Semaphore::new(spec.concurrency)),
            in_hand,
            channel_lost: CancellationToken::new(),
            read_again: CancellationToken::new(),
            placement: Placement::default(),
            running: JoinSet::new(),
        }
    }

    /// Hands every delivery to `handle` until shutdown, `ends_after`, a
    /// delivery to be read again, or the subscription failing: the failure
    /// (`None` for a stop that is not one).
    async fn receive<H, F>(
        &mut self,
        deliveries: &mut DriverWoken<lapin::Consumer>,
        handle: &H,
        shutdown: &CancellationToken,
        ends_after: Option<Duration>,
    ) -> Option<anyhow::Error>
    where
        H: Fn(Received) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let queue = self.queue;
        let time_up = tokio::time::sleep(ends_after.unwrap_or(Duration::MAX / 4));
        // Made once, not once a delivery: each new wait on a token is
        // registered with it and taken off again when dropped (two locks
        // and a list update a delivery, in `perf`).
        let stopping = shutdown.cancelled();
        let read_again = self.read_again.clone().cancelled_owned();
        tokio::pin!(time_up, stopping, read_again);
        loop {
            let next = tokio::select! {
                biased;
                _ = &mut stopping => return None,
                _ = &mut time_up => return None,
                _ = &mut read_again => {
                    return Some(anyhow::anyhow!(
                        "a delivery of the stream '{queue}' is to be read again; resubscribing from offset {:?}, the lowest not done",
                        self.reading.as_ref().and_then(SubscriptionPosition::resume)
                    ));
                }
                next = deliveries.next() => next,
            };
            match next {
                Some(Ok(delivery)) => {
                    if let ControlFlow::Break(failure) =
                        self.admit(delivery, handle, shutdown).await
                    {
                        return failure;
                    }
                }
                Some(Err(e)) => {
                    return Some(anyhow::anyhow!(
                        "the subscription to queue '{queue}' failed: {e}"
                    ));
                }
                None if shutdown.is_cancelled() => return None,
                None => {
                    return Some(anyhow::anyhow!(
                        "the broker cancelled the consumer of queue '{queue}'"
                    ));
                }
            }
            while self.running.try_join_next().is_some() {}
        }
    }

    /// Notes `delivery` as received, waits for its places and starts
    /// `handle` on it; or breaks off the receiving (with its failure, if it
    /// is one).
    async fn admit<H, F>(
        &mut self,
        delivery: lapin::message::Delivery,
        handle: &H,
        shutdown: &CancellationToken,
    ) -> ControlFlow<Option<anyhow::Error>>
    where
        H: Fn(Received) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        self.acks.received(delivery.delivery_tag);
        if let Some(position) = &self.reading
            && let Some(offset) = StreamOffset::of_delivery(delivery.properties.headers().as_ref())
        {
            position.received(delivery.delivery_tag, offset);
        }
        // Wait for room in a stream's window, then for a free place. A
        // delivery that shutdown overtakes never starts: it is left
        // unsettled, and closing the channel gives it back (see
        // Subscribed::stop). While the window is full no delivery comes to
        // report a failed channel, so its state is watched too.
        let held = match &self.in_hand {
            None => None,
            Some(window) => tokio::select! {
                biased;
                _ = shutdown.cancelled() => return ControlFlow::Break(None),
                held = window.clone().acquire_owned() => Some(held.expect("semaphore never closed")),
                _ = closed(&self.channel) => {
                    return ControlFlow::Break(Some(anyhow::anyhow!(
                        "the subscription to queue '{}' failed: its channel closed",
                        self.queue
                    )));
                }
            },
        };
        // A free place is taken at once (the common case, and without a
        // wait on the shutdown token); otherwise shutdown may overtake the
        // wait for one.
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => tokio::select! {
                biased;
                _ = shutdown.cancelled() => return ControlFlow::Break(None),
                permit = self.permits.clone().acquire_owned() => permit.expect("semaphore never closed"),
            },
        };
        let stream = self.reading.as_ref().map(|_| self.read_again.clone());
        // Boxed where it is made (see `Placement::start`).
        let work = Box::pin(handle(Received::new(
            delivery,
            self.acks.clone(),
            Slot(permit),
            held,
            stream,
            self.channel_lost.clone(),
        )));
        self.placement.start(&mut self.running, work).await;
        ControlFlow::Continue(())
    }
}

/// Opens a channel with `prefetch` and starts consuming `queue` as `tag`.
/// A channel that failed on the way is not left open.
async fn open_consumer(
    connection: &Connection,
    queue: &str,
    prefetch: u16,
    tag: &str,
    arguments: FieldTable,
) -> anyhow::Result<(Channel, lapin::Consumer)> {
    // Each step raced against the connection's end: see `lost.rs`.
    let channel = until_lost(connection, connection.create_channel()).await?;
    // Quorum queues and streams refuse global QoS: prefetch is per consumer.
    if let Err(e) = until_lost(
        connection,
        channel.basic_qos(prefetch, BasicQosOptions { global: false }),
    )
    .await
    {
        let _ = tokio::time::timeout(STEP_LIMIT, channel.close(200, "qos refused".into())).await;
        return Err(e.into());
    }
    let consumed = until_lost(
        connection,
        channel.basic_consume(
            queue.into(),
            tag.into(),
            BasicConsumeOptions::default(),
            arguments,
        ),
    )
    .await;
    match consumed {
        Ok(deliveries) => Ok((channel, deliveries)),
        Err(e) => {
            // A refused consume closes the channel; one that failed another
            // way must not leave it open.
            if channel.status().connected() {
                let _ =
                    tokio::time::timeout(STEP_LIMIT, channel.close(200, "consume failed".into()))
                        .await;
            }
            anyhow::bail!("cannot consume from queue '{queue}': {e}");
        }
    }
}

/// Completes once `channel` is no longer open, checked every 100 ms.
async fn closed(channel: &Channel) {
    while channel.status().connected() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The longest a step of stopping a subscription may wait on the broker or
/// on its own tasks: a stop must end, whatever state the channel is in.
const STEP_LIMIT: Duration = Duration::from_secs(5);

/// A subscription holding its consumer, with the acks it sends.
struct Subscribed<'a> {
    queue: &'a str,
    channel: Channel,
    consumer_tag: String,
    acks: Arc<AckBatcher>,
    /// Sends ready acks every few milliseconds until stopped.
    linger: tokio::task::JoinHandle<()>,
    linger_stop: CancellationToken,
}

impl<'a> Subscribed<'a> {
    fn start(
        queue: &'a str,
        channel: Channel,
        consumer_tag: String,
        prefetch: u16,
        stream: Option<SubscriptionPosition>,
    ) -> Self {
        let acks = Arc::new(AckBatcher::new(channel.clone(), prefetch, stream));
        let linger_stop = CancellationToken::new();
        let linger = tokio::spawn({
            let acks = acks.clone();
            let stop = linger_stop.clone();
            async move { acks.run_linger(stop).await }
        });
        Self {
            queue,
            channel,
            consumer_tag,
            acks,
            linger,
            linger_stop,
        }
    }

    /// Stops in the order that keeps every settlement. Nothing new starts
    /// (the receive loop is left); deliveries that arrive meanwhile wait
    /// unread.
    async fn stop(mut self, mut running: JoinSet<()>, drain_timeout: Duration) {
        let queue = self.queue;
        // 1. The running deliveries finish, up to the drain timeout; their
        //    acks and republishes go out on this channel.
        let drained = tokio::time::timeout(drain_timeout, async {
            while running.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                queue,
                stranded = running.len(),
                drain_timeout_ms = drain_timeout.as_millis() as u64,
                "deliveries still running at the drain timeout; the broker requeues them"
            );
            running.abort_all();
        }
        // The acks of everything that finished go out now, not after the linger.
        self.linger_stop.cancel();
        if tokio::time::timeout(STEP_LIMIT, &mut self.linger)
            .await
            .is_err()
        {
            tracing::warn!(
                queue,
                "the ack linger did not stop in time; stopping anyway"
            );
            self.linger.abort();
        }
        if !self.channel.status().connected() {
            // Nothing can be settled on a channel that is gone: the broker
            // has already given back everything unacked.
            tracing::info!(
                queue,
                "consumer stopped; its channel had closed, so the broker redelivers what it had not acked"
            );
            return;
        }
        if tokio::time::timeout(STEP_LIMIT, self.acks.flush(true))
            .await
            .is_err()
        {
            tracing::warn!(
                queue,
                "the last acks were not written in time; the broker redelivers those deliveries"
            );
        }
        // 2. Only then is the consumer cancelled. An ack written to the
        //    socket is not yet an ack applied by the queue: RabbitMQ's
        //    quorum-queue client holds settlements back while 32 or more of
        //    its commands are in flight, and a channel closed meanwhile loses
        //    them, so the messages come back although they were handled.
        //    basic.cancel is synchronous: newer brokers send what they held
        //    back before cancelling, and on 3.10 the round trip gives the
        //    queue time to apply it (the SIGTERM test in tests/skeleton.rs
        //    checks exactly-once).
        let cancel = self.channel.basic_cancel(
            self.consumer_tag.as_str().into(),
            BasicCancelOptions::default(),
        );
        match tokio::time::timeout(STEP_LIMIT, cancel).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(queue, error = %e, "cancelling the consumer failed"),
            Err(_) => tracing::warn!(queue, "the broker did not confirm the cancel in time"),
        }
        // 3. Closing the channel gives back, in one step, every delivery
        //    that arrived and never started. (One nack each would be the
        //    same requeue, as a burst of commands that could hold back the
        //    acks.)
        let close = self.channel.close(200, "acemq-host shutting down".into());
        match tokio::time::timeout(STEP_LIMIT, close).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(queue, error = %e, "closing the consumer's channel"),
            Err(_) => tracing::warn!(
                queue,
                "the broker did not confirm the channel's close in time"
            ),
        }
        tracing::info!(queue, "consumer stopped");
    }
}
