//! A stream consumer's subscription over the stream protocol: the same
//! mechanics as an AMQP subscription (`broker/subscription.rs`: a window of
//! `prefetch` messages in hand, `concurrency` worked on at once, a stop that
//! drains), on a stream connection of its own.
//!
//! Nothing is acknowledged to the broker: a stream keeps every message, the
//! broker sends chunks for the credit the reader gives (`reader.rs`), and a
//! message's work done moves the consumer's position, which the checkpoint
//! keeps (the broker's offset tracking on this path). A message read again
//! ([`super::super::subscription::Receipt::read_again`]) ends the
//! subscription, and the next one starts at the lowest offset not done, as
//! on the AMQP path.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::amqp10::{self, Amqp091View};
use super::endpoint::StreamEndpoints;
use super::reader::ChunkReader;
use crate::broker::offset::{OFFSET_ARGUMENT, StreamOffset};
use crate::broker::placement::Placement;
use crate::broker::stream::SubscriptionPosition;
use crate::broker::subscription::{Reading, Received, Slot, SubscriptionEnv, SubscriptionSpec};

/// Reads `spec.queue` from `start` over the stream protocol, handing each
/// message to `handle`, until shutdown, `ends_after`, a message to be read
/// again, or the subscription failing (the error says why). Whatever ends
/// it, what is running finishes (up to the drain timeout) before this
/// returns.
///
/// `amqp_lost` completes when the host's consume connection is lost: it
/// holds a named consumer's lease (`lease.rs`), so the subscription ends
/// then as it does on the AMQP path, and resumes once it is back.
pub async fn consume<H, F>(
    endpoints: &StreamEndpoints,
    spec: &SubscriptionSpec,
    env: &SubscriptionEnv,
    handle: &H,
    start: StreamOffset,
    reading: SubscriptionPosition,
    amqp_lost: impl Future<Output = ()>,
) -> anyhow::Result<()>
where
    H: Fn(Received) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let queue = spec.queue.as_str();
    let opened = tokio::select! {
        biased;
        _ = env.shutdown.cancelled() => return Ok(()),
        opened = open(endpoints, queue, start) => opened,
    };
    let reader = match opened {
        Ok(reader) => reader,
        Err(why) => {
            env.board.set(
                queue,
                Reading::Stopped {
                    reason: why.clone(),
                },
            );
            anyhow::bail!(why);
        }
    };
    env.board.set(queue, Reading::Consuming);
    tracing::info!(
        queue,
        prefetch = spec.prefetch,
        concurrency = spec.concurrency,
        protocol = "stream",
        listener = %endpoints.shown(),
        "consuming"
    );
    let (decoded, mut chunks) = mpsc::channel(1);
    let decoder = tokio::spawn(decode_chunks(reader, queue.to_owned(), decoded));
    let mut receiving = Receiving::new(spec, reading);
    let failure = tokio::select! {
        failure = receiving.receive(&mut chunks, handle, &env.shutdown, spec.ends_after) => failure,
        _ = amqp_lost => Some(anyhow::anyhow!(
            "the host's consume connection was lost; the stream '{queue}' is read again once it is back"
        )),
    };
    if let Some(failure) = &failure {
        env.board.set(
            queue,
            Reading::Stopped {
                reason: format!("{failure:#}"),
            },
        );
    }
    receiving.drain(queue, env.drain_timeout).await;
    // The decoder sees its receiver gone, and closes the reader.
    drop(chunks);
    let _ = decoder.await;
    tracing::info!(queue, "stream consumer stopped");
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

async fn open(
    endpoints: &StreamEndpoints,
    queue: &str,
    start: StreamOffset,
) -> Result<ChunkReader, String> {
    let connection = endpoints
        .connect_to_read(&format!("stream.{queue}"), queue)
        .await?;
    ChunkReader::open(connection, queue, start).await
}

/// The receive phase: each message takes a place in the window of
/// `prefetch` in hand, then one of `concurrency`, and runs (see
/// [`Running`]); while it waits for a place or a chunk, what runs inline
/// runs.
struct Receiving {
    queue: String,
    reading: SubscriptionPosition,
    permits: Arc<Semaphore>,
    in_hand: Arc<Semaphore>,
    /// Cancelled when a message is to be read again.
    read_again: CancellationToken,
    /// Cancelled when the subscription ends by a failure: work still
    /// running stops waiting on what it cannot finish, and is read again.
    lost: CancellationToken,
    running: Running,
}

impl Receiving {
    fn new(spec: &SubscriptionSpec, reading: SubscriptionPosition) -> Self {
        Self {
            queue: spec.queue.clone(),
            reading,
            permits: Arc::new(Semaphore::new(spec.concurrency)),
            in_hand: Arc::new(Semaphore::new(usize::from(spec.prefetch.max(1)))),
            read_again: CancellationToken::new(),
            lost: CancellationToken::new(),
            running: Running::new(spec.concurrency),
        }
    }

    async fn receive<H, F>(
        &mut self,
        chunks: &mut mpsc::Receiver<Result<DecodedChunk, String>>,
        handle: &H,
        shutdown: &CancellationToken,
        ends_after: Option<Duration>,
    ) -> Option<anyhow::Error>
    where
        H: Fn(Received) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let time_up = tokio::time::sleep(ends_after.unwrap_or(Duration::MAX / 4));
        tokio::pin!(time_up);
        loop {
            let read_again = self.read_again.clone();
            let running = &mut self.running;
            let next = loop {
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return None,
                    _ = &mut time_up => return None,
                    _ = read_again.cancelled() => return Some(self.read_again_error()),
                    Some(()) = running.next(), if !running.is_empty() => continue,
                    next = chunks.recv() => break next.unwrap_or_else(|| Err(format!(
                        "the reader of the stream '{}' stopped", self.queue
                    ))),
                }
            };
            match next {
                Ok(chunk) => {
                    if let Some(stop) = self.admit(chunk, handle, shutdown, &mut time_up).await {
                        return stop;
                    }
                }
                Err(why) => {
                    self.lost.cancel();
                    return Some(anyhow::anyhow!(
                        "the subscription to stream '{}' failed: {why}",
                        self.queue
                    ));
                }
            }
        }
    }

    fn read_again_error(&self) -> anyhow::Error {
        anyhow::anyhow!(
            "a message of the stream '{}' is to be read again; resubscribing from offset {:?}, the lowest not done",
            self.queue,
            self.reading.resume()
        )
    }

    /// Starts `handle` on each message of `chunk` as places free up; or
    /// the receiving stops (`Some`, with the failure if it is one).
    async fn admit<H, F>(
        &mut self,
        chunk: DecodedChunk,
        handle: &H,
        shutdown: &CancellationToken,
        time_up: &mut std::pin::Pin<&mut tokio::time::Sleep>,
    ) -> Option<Option<anyhow::Error>>
    where
        H: Fn(Received) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        for (offset, view) in chunk {
            // Not yet received: a message left unstarted at a stop is read
            // again by the next subscription.
            let (in_hand, permits) = (self.in_hand.clone(), self.permits.clone());
            let read_again = self.read_again.clone();
            let running = &mut self.running;
            let places = places_of(in_hand, permits);
            tokio::pin!(places);
            let places = loop {
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return Some(None),
                    _ = time_up.as_mut() => return Some(None),
                    _ = read_again.cancelled() => return Some(Some(self.read_again_error())),
                    places = &mut places => break places,
                    Some(()) = running.next(), if !running.is_empty() => continue,
                }
            };
            self.reading.received(offset, offset);
            self.running
                .push(handle(Received::from_stream_protocol(
                    view,
                    offset,
                    self.reading.clone(),
                    places,
                    self.read_again.clone(),
                    self.lost.clone(),
                )))
                .await;
        }
        None
    }
}

/// The messages being handled. At concurrency 1 (a stream's default) they
/// run on the subscription's own task: a task of their own each cost the
/// host about half its CPU per message in wake-ups and moves of the
/// delivery's future (`cargo bench -p acemq-tests --bench stream_protocol`,
/// full chunks: 88,939 msg/s at 14.0 µs a message, 171,821 at 6.2 µs
/// inline). With more, each starts as an AMQP delivery does (first poll
/// here while that is short, the rest on a task of its own: see
/// `broker/placement.rs`), so that plugin calls that take long use every
/// core.
enum Running {
    Inline(FuturesUnordered<BoxFuture<'static, ()>>),
    Spawned(JoinSet<()>, Placement),
}

impl Running {
    fn new(concurrency: usize) -> Self {
        match concurrency {
            1 => Running::Inline(FuturesUnordered::new()),
            _ => Running::Spawned(JoinSet::new(), Placement::default()),
        }
    }

    async fn push(&mut self, work: impl Future<Output = ()> + Send + 'static) {
        let work = Box::pin(work);
        match self {
            Running::Inline(running) => running.push(work),
            Running::Spawned(running, placement) => {
                placement.start(running, work).await;
                while running.try_join_next().is_some() {}
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn len(&self) -> usize {
        match self {
            Running::Inline(running) => running.len(),
            Running::Spawned(running, _) => running.len(),
        }
    }

    /// Runs what runs inline until one message is done (`None`: none
    /// runs). Must be polled for inline work to progress.
    async fn next(&mut self) -> Option<()> {
        match self {
            Running::Inline(running) => running.next().await,
            Running::Spawned(running, _) => running.join_next().await.map(drop),
        }
    }

    /// Drops (inline) or aborts (spawned) what still runs.
    fn stop_all(&mut self) {
        match self {
            Running::Inline(running) => running.clear(),
            Running::Spawned(running, _) => running.abort_all(),
        }
    }
}

/// A place in the window, then one among `concurrency`.
async fn places_of(
    in_hand: Arc<Semaphore>,
    permits: Arc<Semaphore>,
) -> (Slot, tokio::sync::OwnedSemaphorePermit) {
    let held = in_hand.acquire_owned().await;
    let permit = permits.acquire_owned().await;
    (
        Slot::new(permit.expect("semaphore never closed")),
        held.expect("semaphore never closed"),
    )
}

/// A chunk's messages with their offsets, each as an AMQP 0-9-1 consumer of
/// the stream receives it.
type DecodedChunk = Vec<(u64, Amqp091View)>;

/// Reads `reader`'s chunks and maps their messages ([`view_of`]) on a task
/// of its own, handing each chunk over once the one before is taken: the
/// mapping (about a seventh of the host's work on a message) runs on one
/// core while the plugin calls run on the other. Ends with the chunk that
/// says why the subscription ended, or when its receiver is gone; either
/// way it closes the reader. At most three chunks of a subscription are in
/// memory: the one worked on, the one handed over, the one on its way.
async fn decode_chunks(
    mut reader: ChunkReader,
    stream: String,
    decoded: mpsc::Sender<Result<DecodedChunk, String>>,
) {
    loop {
        let next = tokio::select! {
            _ = decoded.closed() => break,
            next = reader.next() => next,
        };
        let ended = next.is_err();
        let chunk = next.map(|chunk| {
            chunk
                .into_offsets()
                .map(|(offset, message)| (offset, view_of(&stream, &message, offset)))
                .collect()
        });
        if decoded.send(chunk).await.is_err() || ended {
            break;
        }
    }
    reader.close().await;
}

/// `message` as an AMQP 0-9-1 consumer of the stream receives it.
fn view_of(stream: &str, message: &bytes::Bytes, offset: u64) -> Amqp091View {
    amqp10::to_amqp091(message, stream, offset).unwrap_or_else(|why| {
        // Handed over all the same, as the broker hands over a body it
        // cannot map: its AMQP 1.0 bytes, typed so. Never dropped.
        tracing::error!(queue = %stream, offset, error = %why, "a stream message could not be read as AMQP 0-9-1 would see it; the plugin gets its AMQP 1.0 bytes");
        undecodable(stream, offset, message.clone())
    })
}

impl Receiving {
    /// What is running finishes, up to `drain_timeout`.
    async fn drain(&mut self, queue: &str, drain_timeout: Duration) {
        let drained = tokio::time::timeout(drain_timeout, async {
            while self.running.next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                queue,
                stranded = self.running.len(),
                drain_timeout_ms = drain_timeout.as_millis() as u64,
                "stream messages still running at the drain timeout; they are read again"
            );
            self.running.stop_all();
        }
    }
}

/// A message the host could not map: its bytes as the body, typed
/// `amqp-1.0`, with its offset.
fn undecodable(stream: &str, offset: u64, bytes: bytes::Bytes) -> Amqp091View {
    let mut headers = FieldTable::default();
    headers.insert(
        OFFSET_ARGUMENT.into(),
        AMQPValue::LongLongInt(i64::try_from(offset).unwrap_or(i64::MAX)),
    );
    Amqp091View {
        exchange: String::new(),
        routing_key: stream.to_string(),
        properties: BasicProperties::default()
            .with_type(ShortString::from("amqp-1.0"))
            .with_headers(headers),
        body: bytes,
    }
}
