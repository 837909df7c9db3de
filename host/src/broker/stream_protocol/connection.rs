//! One connection of the stream protocol: TCP (and TLS, as for AMQP), the
//! opening handshake, requests matched to their answers, chunks passed to
//! their subscription, heartbeats, and a close that is always bounded.
//!
//! One task reads the connection. It answers what the broker asks of it
//! (tune, close), hands each answer to the request waiting for it, and each
//! chunk to its subscription's channel, waiting while that channel is full:
//! a subscription's credit bounds how many chunks the broker sends, so the
//! wait is short, and it is what keeps a slow consumer's memory bounded.
//! When the connection ends (an error, the broker's close, silence past
//! three heartbeats) every waiting request fails and every subscription is
//! told why.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::io::{AsyncReadExt, AsyncWriteExt, BufReader, ReadHalf, WriteHalf};
use lapin::tcp::AsyncTcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::wire::{self, Incoming, code};
use crate::broker::Tls;
use crate::broker::frame_guard::transport::Inner;

/// The longest a request (or connecting) waits for the broker.
pub const REQUEST_LIMIT: Duration = Duration::from_secs(10);

/// The heartbeat the host asks for (the broker may ask for less).
const HEARTBEAT_SECONDS: u32 = 60;

/// The largest frame the host accepts (the broker's own default is 1 MiB;
/// a chunk is at most that).
const FRAME_MAX: u32 = 8 * 1024 * 1024;

/// Where to connect, and as whom.
#[derive(Clone)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub vhost: String,
    pub tls: Option<Tls>,
    /// The connection's name in the management UI.
    pub name: String,
}

/// What a subscription receives.
#[derive(Debug)]
pub enum SubscriptionEvent {
    Chunk(wire::Chunk),
    /// The subscription is over; why.
    Ended(String),
}

/// A request's answer: its code and what follows it.
struct Reply {
    code: u16,
    rest: Bytes,
}

/// What the reading task and the requests share.
#[derive(Default)]
struct Shared {
    pending: Mutex<HashMap<u32, oneshot::Sender<Reply>>>,
    subscriptions: Mutex<HashMap<u8, mpsc::Sender<SubscriptionEvent>>>,
    next_correlation: AtomicU32,
    /// Seconds without a frame after which the connection counts as dead.
    silence_limit: AtomicU64,
    closed: CancellationToken,
    why_closed: Mutex<Option<String>>,
}

type Writer = Arc<tokio::sync::Mutex<WriteHalf<Inner>>>;

/// An open connection. Dropping it stops its tasks (the broker sees the
/// socket close); [`StreamConnection::close`] closes it politely first.
pub struct StreamConnection {
    writer: Writer,
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for StreamConnection {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl StreamConnection {
    /// Connects to `target` and opens its vhost, each step bounded.
    pub async fn open(target: &Target) -> Result<Self, String> {
        let stream = tokio::time::timeout(REQUEST_LIMIT, connect(target))
            .await
            .map_err(|_| format!("no connection within {} s", REQUEST_LIMIT.as_secs()))?
            .map_err(|e| e.to_string())?;
        let (reader, writer) = stream.split();
        let writer: Writer = Arc::new(tokio::sync::Mutex::new(writer));
        let shared = Arc::new(Shared::default());
        shared
            .silence_limit
            .store(REQUEST_LIMIT.as_secs() * 3, Ordering::Relaxed);
        let (tuned_tx, tuned_rx) = oneshot::channel();
        let reading = tokio::spawn(read_frames(
            BufReader::with_capacity(256 * 1024, reader),
            shared.clone(),
            writer.clone(),
            tuned_tx,
        ));
        let mut connection = Self {
            writer,
            shared,
            tasks: vec![reading],
        };
        connection.handshake(target, tuned_rx).await?;
        Ok(connection)
    }

    async fn handshake(
        &mut self,
        target: &Target,
        tuned: oneshot::Receiver<u32>,
    ) -> Result<(), String> {
        let version = env!("CARGO_PKG_VERSION");
        let properties = [
            ("connection_name", target.name.as_str()),
            ("product", "acemq-host"),
            ("version", version),
        ];
        self.expect_ok("peer properties", |c| wire::peer_properties(c, &properties))
            .await?;
        let offered = self.request(wire::sasl_handshake).await?;
        let mechanisms = wire::mechanisms(offered.rest).map_err(|e| e.to_string())?;
        if !mechanisms.iter().any(|m| m == "PLAIN") {
            return Err(format!(
                "the broker offers no PLAIN login (it offers {})",
                mechanisms.join(", ")
            ));
        }
        let login = self
            .request(|c| wire::sasl_plain(c, &target.user, &target.password))
            .await?;
        match login.code {
            code::OK => {}
            code::AUTHENTICATION_FAILURE => {
                return Err(format!(
                    "the broker refused the login of user '{}' (wrong user name or password)",
                    target.user
                ));
            }
            other => return Err(format!("login failed: {}", wire::code_text(other))),
        }
        let heartbeat = tokio::time::timeout(REQUEST_LIMIT, tuned)
            .await
            .map_err(|_| "the broker did not tune the connection".to_string())?
            .map_err(|_| self.why_closed())?;
        let opened = self.request(|c| wire::open(c, &target.vhost)).await?;
        match opened.code {
            code::OK => {}
            code::VIRTUAL_HOST_ACCESS_FAILURE => {
                return Err(format!(
                    "user '{}' may not use the vhost '{}'",
                    target.user, target.vhost
                ));
            }
            other => {
                return Err(format!(
                    "opening the vhost failed: {}",
                    wire::code_text(other)
                ));
            }
        }
        if heartbeat > 0 {
            let every = Duration::from_secs(u64::from(heartbeat)) / 2;
            self.shared
                .silence_limit
                .store(u64::from(heartbeat) * 3, Ordering::Relaxed);
            self.tasks.push(tokio::spawn(beat(
                self.writer.clone(),
                self.shared.closed.clone(),
                every,
            )));
        }
        Ok(())
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.is_cancelled()
    }

    /// Completes when the connection has ended.
    pub async fn closed(&self) {
        self.shared.closed.cancelled().await;
    }

    fn why_closed(&self) -> String {
        self.shared
            .why_closed
            .lock()
            .expect("why_closed poisoned")
            .clone()
            .unwrap_or_else(|| "the stream connection closed".to_string())
    }

    async fn send(&self, frame: &[u8]) -> Result<(), String> {
        if self.is_closed() {
            return Err(self.why_closed());
        }
        let mut writer = self.writer.lock().await;
        let written = async {
            writer.write_all(frame).await?;
            writer.flush().await
        };
        match tokio::time::timeout(REQUEST_LIMIT, written).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("writing to the stream connection failed: {e}")),
            Err(_) => Err(format!(
                "the stream connection took over {} s to take a frame",
                REQUEST_LIMIT.as_secs()
            )),
        }
    }

    /// Sends the request `build` makes with a correlation id, and waits
    /// (at most [`REQUEST_LIMIT`]) for its answer.
    async fn request(&self, build: impl FnOnce(u32) -> Vec<u8>) -> Result<Reply, String> {
        let correlation = self.shared.next_correlation.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.shared
            .pending
            .lock()
            .expect("pending poisoned")
            .insert(correlation, tx);
        let answered = async {
            self.send(&build(correlation)).await?;
            rx.await.map_err(|_| self.why_closed())
        };
        let result = tokio::time::timeout(REQUEST_LIMIT, answered).await;
        self.shared
            .pending
            .lock()
            .expect("pending poisoned")
            .remove(&correlation);
        result.unwrap_or_else(|_| {
            Err(format!(
                "the broker did not answer within {} s",
                REQUEST_LIMIT.as_secs()
            ))
        })
    }

    async fn expect_ok(
        &self,
        what: &str,
        build: impl FnOnce(u32) -> Vec<u8>,
    ) -> Result<Bytes, String> {
        let reply = self.request(build).await?;
        match reply.code {
            code::OK => Ok(reply.rest),
            other => Err(format!("{what}: {}", wire::code_text(other))),
        }
    }

    /// Subscribes as `id` to `stream` from `start` with `credit` chunks;
    /// its chunks and its end go to `events`. The error is the broker's
    /// refusal, in words.
    pub async fn subscribe(
        &self,
        id: u8,
        stream: &str,
        start: wire::Start,
        credit: u16,
        events: mpsc::Sender<SubscriptionEvent>,
    ) -> Result<(), String> {
        self.shared
            .subscriptions
            .lock()
            .expect("subscriptions poisoned")
            .insert(id, events);
        let reply = self
            .request(|c| wire::subscribe(c, id, stream, start, credit))
            .await;
        let refused = match reply {
            Ok(reply) if reply.code == code::OK => return Ok(()),
            Ok(reply) => refusal(stream, reply.code),
            Err(why) => why,
        };
        self.shared
            .subscriptions
            .lock()
            .expect("subscriptions poisoned")
            .remove(&id);
        Err(refused)
    }

    /// Lets the broker send `credit` more chunks to subscription `id`.
    pub async fn credit(&self, id: u8, credit: u16) -> Result<(), String> {
        self.send(&wire::credit(id, credit)).await
    }

    pub async fn unsubscribe(&self, id: u8) -> Result<(), String> {
        let result = self
            .expect_ok("unsubscribing", |c| wire::unsubscribe(c, id))
            .await;
        self.shared
            .subscriptions
            .lock()
            .expect("subscriptions poisoned")
            .remove(&id);
        result.map(drop)
    }

    /// Stores `offset` for `reference` on `stream` (the broker does not
    /// answer: see [`StreamConnection::query_offset`]).
    pub async fn store_offset(
        &self,
        reference: &str,
        stream: &str,
        offset: u64,
    ) -> Result<(), String> {
        self.send(&wire::store_offset(reference, stream, offset))
            .await
    }

    /// The offset stored for `reference` on `stream`; `None` when none is.
    pub async fn query_offset(&self, reference: &str, stream: &str) -> Result<Option<u64>, String> {
        let reply = self
            .request(|c| wire::query_offset(c, reference, stream))
            .await?;
        match reply.code {
            code::OK => wire::offset_of(reply.rest)
                .map(Some)
                .map_err(|e| e.to_string()),
            code::NO_OFFSET => Ok(None),
            other => Err(refusal(stream, other)),
        }
    }

    /// Where `stream`'s members are (see [`wire::Members`]).
    pub async fn members(&self, stream: &str) -> Result<wire::Members, String> {
        let rest = self
            .expect_ok("asking for the stream's metadata", |c| {
                wire::metadata(c, &[stream])
            })
            .await?;
        wire::members_of(rest, stream).map_err(|e| e.to_string())
    }

    /// Closes the connection: the broker's close handshake, bounded; the
    /// socket goes with `self` in any case.
    pub async fn close(self) {
        if !self.is_closed() {
            let _ = self.request(|c| wire::close(c, "acemq-host done")).await;
        }
    }
}

/// The broker's refusal of a request about `stream`, in words.
pub fn refusal(stream: &str, refused: u16) -> String {
    match refused {
        code::STREAM_DOES_NOT_EXIST => format!("the stream '{stream}' does not exist"),
        code::STREAM_NOT_AVAILABLE => format!(
            "the stream '{stream}' is not available now (its leader is being elected, or its members are down)"
        ),
        code::ACCESS_REFUSED => {
            format!("the broker refused access to the stream '{stream}' (permissions)")
        }
        other => format!(
            "the broker refused a request about the stream '{stream}': {}",
            wire::code_text(other)
        ),
    }
}

/// TCP, then TLS when the target has it: the AMQP connection's own steps.
async fn connect(target: &Target) -> std::io::Result<Inner> {
    let runtime = async_rs::Runtime::tokio_current();
    let addresses = runtime.to_socket_addrs((target.host.clone(), target.port));
    let stream = AsyncTcpStream::connect(&runtime, addresses).await?;
    match &target.tls {
        None => Ok(stream),
        Some(tls) => tls.handshake(stream, &target.host).await,
    }
}

/// Writes a heartbeat every `every` until the connection closes.
async fn beat(writer: Writer, closed: CancellationToken, every: Duration) {
    let frame = wire::heartbeat();
    loop {
        tokio::select! {
            _ = closed.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let mut writer = writer.lock().await;
        if writer.write_all(&frame).await.is_err() || writer.flush().await.is_err() {
            return;
        }
    }
}

/// Reads one frame: its size, then its bytes.
async fn read_frame(reader: &mut BufReader<ReadHalf<Inner>>) -> std::io::Result<Bytes> {
    let mut size = [0u8; 4];
    reader.read_exact(&mut size).await?;
    let size = u32::from_be_bytes(size);
    if size > FRAME_MAX {
        return Err(std::io::Error::other(format!(
            "the broker sent a frame of {size} bytes, over the {FRAME_MAX} the host accepts"
        )));
    }
    let mut frame = BytesMut::zeroed(size as usize);
    reader.read_exact(&mut frame).await?;
    Ok(frame.freeze())
}

/// The connection's reading task (see the module's comment).
async fn read_frames(
    mut reader: BufReader<ReadHalf<Inner>>,
    shared: Arc<Shared>,
    writer: Writer,
    tuned: oneshot::Sender<u32>,
) {
    let mut tuned = Some(tuned);
    let why = loop {
        let limit = Duration::from_secs(shared.silence_limit.load(Ordering::Relaxed));
        let frame = match tokio::time::timeout(limit, read_frame(&mut reader)).await {
            Ok(Ok(frame)) => frame,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                break "the broker closed the stream connection".to_string();
            }
            Ok(Err(e)) => break format!("the stream connection failed: {e}"),
            Err(_) => {
                break format!(
                    "nothing came from the broker for {} s, not even a heartbeat",
                    limit.as_secs()
                );
            }
        };
        let incoming = match wire::parse(frame) {
            Ok(incoming) => incoming,
            Err(e) => break format!("the broker sent a frame the host cannot read: {e}"),
        };
        match incoming {
            Incoming::Response {
                correlation,
                code,
                rest,
                ..
            } => {
                let waiting = shared
                    .pending
                    .lock()
                    .expect("pending poisoned")
                    .remove(&correlation);
                if let Some(waiting) = waiting {
                    let _ = waiting.send(Reply { code, rest });
                }
            }
            Incoming::Tune {
                frame_max,
                heartbeat,
            } => {
                let frame_max = if frame_max == 0 {
                    FRAME_MAX
                } else {
                    frame_max.min(FRAME_MAX)
                };
                let heartbeat = match heartbeat {
                    0 => HEARTBEAT_SECONDS,
                    theirs => theirs.min(HEARTBEAT_SECONDS),
                };
                let answer = wire::tune(frame_max, heartbeat);
                let written = {
                    let mut writer = writer.lock().await;
                    writer.write_all(&answer).await.and(writer.flush().await)
                };
                if let Err(e) = written {
                    break format!("answering the broker's tune failed: {e}");
                }
                if let Some(tuned) = tuned.take() {
                    let _ = tuned.send(heartbeat);
                }
            }
            Incoming::Heartbeat | Incoming::Other { .. } => {}
            Incoming::Deliver {
                subscription,
                chunk,
            } => {
                let event = match wire::parse_chunk(chunk) {
                    Ok(chunk) => SubscriptionEvent::Chunk(chunk),
                    Err(e) => SubscriptionEvent::Ended(e.to_string()),
                };
                tell(&shared, Some(subscription), event).await;
            }
            Incoming::MetadataUpdate { code, stream } => {
                let why = format!(
                    "the broker ended the subscription: the stream '{stream}' changed ({}: deleted, or its member on this node moved)",
                    wire::code_text(code)
                );
                tell(&shared, None, SubscriptionEvent::Ended(why)).await;
            }
            Incoming::CreditRefused { code, subscription } => {
                let why = format!("the broker refused a credit: {}", wire::code_text(code));
                tell(&shared, Some(subscription), SubscriptionEvent::Ended(why)).await;
            }
            Incoming::Close {
                correlation,
                code,
                reason,
            } => {
                let answer = wire::close_ok(correlation);
                let mut writer = writer.lock().await;
                let _ = writer.write_all(&answer).await;
                let _ = writer.flush().await;
                break format!(
                    "the broker closed the stream connection: {reason} ({})",
                    wire::code_text(code)
                );
            }
        }
    };
    *shared.why_closed.lock().expect("why_closed poisoned") = Some(why.clone());
    shared.closed.cancel();
    // Requests waiting fail now (their senders dropped)...
    shared.pending.lock().expect("pending poisoned").clear();
    // ...and every subscription hears why it is over.
    tell(&shared, None, SubscriptionEvent::Ended(why)).await;
    shared
        .subscriptions
        .lock()
        .expect("subscriptions poisoned")
        .clear();
}

/// Passes `event` to subscription `to` (every subscription: `None`),
/// waiting for room: a subscription reading nothing any more has dropped
/// its receiver, and the send fails at once.
async fn tell(shared: &Shared, to: Option<u8>, event: SubscriptionEvent) {
    let targets: Vec<mpsc::Sender<SubscriptionEvent>> = {
        let subscriptions = shared.subscriptions.lock().expect("subscriptions poisoned");
        match to {
            Some(id) => subscriptions.get(&id).cloned().into_iter().collect(),
            None => subscriptions.values().cloned().collect(),
        }
    };
    match (targets.as_slice(), event) {
        ([one], event) => {
            let _ = one.send(event).await;
        }
        (many, SubscriptionEvent::Ended(why)) => {
            for target in many {
                let _ = target.send(SubscriptionEvent::Ended(why.clone())).await;
            }
        }
        // A chunk for no known subscription (one just unsubscribed).
        (_, SubscriptionEvent::Chunk(_)) => {}
    }
}
