//! A small TCP fault-injection proxy for integration tests.
//!
//! Tests put a [`FaultProxy`] between the host and its RabbitMQ broker (point
//! the host at [`FaultProxy::addr`] instead of the broker) and then break the
//! link on purpose, to check how the host copes with:
//!
//! - connection loss: [`FaultProxy::cut_all`] closes every open connection,
//!   as a broker restart or a dropped network would;
//! - refusals: [`FaultProxy::set_refusing`] makes the port refuse new
//!   connections (ECONNREFUSED), as a broker that is down would;
//! - partitions: [`FaultProxy::set_blackhole`] keeps connections open but
//!   forwards nothing, so heartbeats time out;
//! - latency: [`FaultProxy::set_latency`] delays every chunk in both
//!   directions.
//!
//! The proxy runs on its own thread with its own current-thread tokio
//! runtime, so it can be used from plain `#[test]`s and from any
//! `#[tokio::test]` runtime, and it outlives the runtime that started it.
//!
//! Linux semantics are assumed (SO_REUSEADDR on a bound but not listening
//! socket keeps the port reserved while refusing); that is what CI runs.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::thread;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Largest chunk read from one side at a time.
const CHUNK_SIZE: usize = 16 * 1024;

/// Chunks in flight per direction between a reader and its (delayed) writer.
/// Bounding this keeps memory bounded under latency: when it is full the
/// reader stops reading and TCP flow control pushes back on the sender. At
/// most `CHUNK_SIZE * CHUNKS_IN_FLIGHT` (1 MiB) is queued per direction, which
/// also caps throughput at about that much per latency period.
const CHUNKS_IN_FLIGHT: usize = 64;

/// Backlog of the listening socket.
const BACKLOG: u32 = 1024;

/// A TCP proxy on 127.0.0.1 that forwards to one upstream address and can
/// inject faults on demand. See the module docs.
///
/// Dropping it stops its thread and closes every connection.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    commands: mpsc::UnboundedSender<Command>,
    thread: Option<thread::JoinHandle<()>>,
}

/// State read by the connection tasks and written from the test's thread.
/// Plain atomics and a watch channel, so setters need no round trip.
struct Shared {
    accepted: AtomicU64,
    open: AtomicUsize,
    latency_nanos: AtomicU64,
    /// A watch channel rather than an atomic so that closes held back during
    /// a partition can wait for it to heal without polling.
    blackhole: watch::Sender<bool>,
}

impl Shared {
    fn latency(&self) -> Duration {
        Duration::from_nanos(self.latency_nanos.load(Ordering::Relaxed))
    }

    fn blackholed(&self) -> bool {
        *self.blackhole.borrow()
    }
}

/// Requests that must run on the proxy's thread. Each carries an ack so that
/// the effect is complete when the public method returns; tests can then act
/// right away without sleeping.
enum Command {
    CutAll(std_mpsc::Sender<()>),
    SetRefusing(bool, std_mpsc::Sender<io::Result<()>>),
    Shutdown,
}

impl FaultProxy {
    /// Listens on 127.0.0.1 on a free port and forwards each accepted
    /// connection to `upstream`.
    ///
    /// Runs on its own thread ("fault-proxy") with its own current-thread
    /// tokio runtime, so it works from sync tests and from any
    /// `#[tokio::test]` runtime (and keeps working when that runtime ends).
    ///
    /// If `upstream` cannot be reached, an accepted connection is closed
    /// right away, as a client talking to a dead broker would see it.
    pub fn start(upstream: SocketAddr) -> anyhow::Result<FaultProxy> {
        let shared = Arc::new(Shared {
            accepted: AtomicU64::new(0),
            open: AtomicUsize::new(0),
            latency_nanos: AtomicU64::new(0),
            blackhole: watch::Sender::new(false),
        });
        let (commands, command_rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std_mpsc::channel::<anyhow::Result<SocketAddr>>();

        let thread_shared = Arc::clone(&shared);
        let thread = thread::Builder::new()
            .name("fault-proxy".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .enable_time()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e).context("building the proxy's runtime"));
                        return;
                    }
                };
                runtime.block_on(async move {
                    // Sockets are bound here because a tokio listener must be
                    // registered with the runtime that will drive it.
                    let (reserve, listener) = match bind_initial() {
                        Ok(bound) => bound,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let addr = match listener.local_addr() {
                        Ok(addr) => addr,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e).context("reading the proxy's address"));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(addr));
                    run(listener, reserve, addr, upstream, thread_shared, command_rx).await;
                });
                // Dropping the runtime here drops every connection task, and
                // with them every socket.
            })
            .context("spawning the fault-proxy thread")?;

        let addr = match ready_rx.recv() {
            Ok(Ok(addr)) => addr,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                anyhow::bail!("the fault-proxy thread died while starting");
            }
        };
        Ok(FaultProxy {
            addr,
            shared,
            commands,
            thread: Some(thread),
        })
    }

    /// The address to connect to instead of the upstream. The port stays the
    /// same for the whole life of the proxy, across [`set_refusing`] toggles.
    ///
    /// [`set_refusing`]: FaultProxy::set_refusing
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port of [`addr`](FaultProxy::addr).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Closes every open connection now, on both sides, as a broker restart
    /// or a dropped network would. When this returns the sockets are closed
    /// and [`open_connections`](FaultProxy::open_connections) no longer counts
    /// them. New connections are still accepted afterwards (including any a
    /// client had started but the proxy had not accepted yet).
    ///
    /// # Panics
    ///
    /// If the proxy's thread has died.
    pub fn cut_all(&self) {
        let (ack, done) = std_mpsc::channel();
        self.send(Command::CutAll(ack));
        done.recv().expect("the fault-proxy thread is gone");
    }

    /// While on, the port refuses new connections for real (ECONNREFUSED):
    /// the proxy stops listening. Turning it off listens again on the same
    /// port. Existing connections are not affected either way. The change is
    /// in effect when this returns.
    ///
    /// # Panics
    ///
    /// If the port cannot be listened on again, or the proxy's thread has
    /// died. A test cannot go on meaningfully in either case.
    pub fn set_refusing(&self, on: bool) {
        let (ack, done) = std_mpsc::channel();
        self.send(Command::SetRefusing(on, ack));
        done.recv()
            .expect("the fault-proxy thread is gone")
            .unwrap_or_else(|e| panic!("fault proxy: listening again on {}: {e}", self.addr));
    }

    /// While on, connections stay open but no byte is forwarded in either
    /// direction: bytes read from either side are discarded (as are bytes
    /// still queued for delivery under latency), like a network partition, so
    /// heartbeats time out. A close from one side is held back and passed on
    /// only when the partition heals, as the peer of a partitioned link would
    /// not see it either; the proxy itself never closes a blackholed
    /// connection.
    ///
    /// Turning it off resumes forwarding on connections that are still open.
    /// Bytes dropped meanwhile stay dropped, so the protocol stream is then
    /// corrupt: expect the host or the broker to close such a connection,
    /// much as after a real partition. New connections accepted while on are
    /// blackholed too (the TCP connect succeeds but nothing passes).
    pub fn set_blackhole(&self, on: bool) {
        self.shared.blackhole.send_replace(on);
    }

    /// Delay added to every chunk forwarded in each direction (zero for
    /// none), so a request/response round trip takes at least twice this.
    /// Byte order is preserved. A new value applies to chunks read after the
    /// call; chunks already queued keep their delay.
    pub fn set_latency(&self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.shared.latency_nanos.store(nanos, Ordering::Relaxed);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Connections currently open (accepted and not yet closed).
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::Relaxed)
    }

    fn send(&self, command: Command) {
        // Fails only once the thread has exited; the ack's recv reports it.
        let _ = self.commands.send(command);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.send(Command::Shutdown);
        if let Some(thread) = self.thread.take() {
            // A panic on the proxy thread was already printed; re-raising it
            // from drop could abort the test process.
            let _ = thread.join();
        }
    }
}

/// Binds the listener on a free port, plus a second, never-listening socket on
/// the same port. The second socket keeps the port ours while refusing (no
/// listener): otherwise another socket, e.g. an outgoing connection picking
/// an ephemeral port, could take it and the rebind would fail. A bound socket
/// that does not listen still gets connections refused. Both need
/// SO_REUSEADDR to share the port; if the platform will not allow that, the
/// proxy goes on without the reservation. (Another socket that also sets
/// SO_REUSEADDR could still bind this exact port while refusing; only one
/// asking for it by number would, as Linux hands out port 0 binds from ports
/// nobody has bound.)
fn bind_initial() -> anyhow::Result<(Option<TcpSocket>, TcpListener)> {
    let any_port = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0));
    let reserve = TcpSocket::new_v4().context("creating the reserving socket")?;
    reserve
        .set_reuseaddr(true)
        .context("setting SO_REUSEADDR on the reserving socket")?;
    reserve.bind(any_port).context("binding a free port")?;
    let addr = reserve.local_addr().context("reading the bound port")?;
    match listen_on(addr) {
        Ok(listener) => Ok((Some(reserve), listener)),
        Err(_) => {
            drop(reserve);
            let listener = listen_on(addr).context("listening on the proxy's port")?;
            Ok((None, listener))
        }
    }
}

fn listen_on(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    // SO_REUSEADDR lets the port be bound again right after refusing, even
    // with closed connections of it still in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Resolves when a connection is accepted; never while refusing.
async fn accept(listener: &Option<TcpListener>) -> io::Result<TcpStream> {
    match listener {
        Some(listener) => listener.accept().await.map(|(stream, _)| stream),
        None => std::future::pending().await,
    }
}

/// The proxy's main loop: accepts connections and runs commands.
async fn run(
    listener: TcpListener,
    // Held only to keep the port reserved; see `bind_initial`.
    _reserve: Option<TcpSocket>,
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut listener = Some(listener);
    // Every connection is one task in this set, so cut_all can abort them
    // all; aborting drops the task's sockets, which closes both sides even
    // when the connection is idle.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            command = commands.recv() => match command {
                None | Some(Command::Shutdown) => break,
                Some(Command::CutAll(ack)) => {
                    connections.abort_all();
                    // Aborted tasks are dropped before they are joined, so
                    // once this drains every socket is closed.
                    while connections.join_next().await.is_some() {}
                    let _ = ack.send(());
                }
                Some(Command::SetRefusing(on, ack)) => {
                    let result = if on {
                        // Dropping the listener is what makes the kernel
                        // answer SYNs with RST; its backlog is reset too.
                        listener = None;
                        Ok(())
                    } else if listener.is_none() {
                        listen_on(addr).map(|l| listener = Some(l))
                    } else {
                        Ok(())
                    };
                    let _ = ack.send(result);
                }
            },
            accepted = accept(&listener) => match accepted {
                Ok(client) => {
                    shared.accepted.fetch_add(1, Ordering::Relaxed);
                    let open = OpenGuard::new(&shared);
                    connections.spawn(proxy_connection(client, upstream, Arc::clone(&shared), open));
                }
                Err(_) => {
                    // E.g. out of file descriptors: the error would repeat at
                    // once, so pause instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Counts a connection as open for as long as its task lives, including when
/// the task is aborted (drop runs then too).
struct OpenGuard(Arc<Shared>);

impl OpenGuard {
    fn new(shared: &Arc<Shared>) -> OpenGuard {
        shared.open.fetch_add(1, Ordering::Relaxed);
        OpenGuard(Arc::clone(shared))
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn proxy_connection(
    client: TcpStream,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    _open: OpenGuard,
) {
    // Returning drops `client`, so a dead upstream closes the client at once.
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    // Small AMQP frames should not wait for Nagle on top of injected latency.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // An error in either direction ends both: returning drops all four
    // halves, so the other side sees the connection close too.
    let _ = tokio::try_join!(
        forward(client_read, server_write, &shared),
        forward(server_read, client_write, &shared),
    );
}

/// Forwards one direction. The reader and the writer are separate so that
/// latency delays delivery without delaying reading, with a bounded queue
/// between them that keeps the byte order.
async fn forward(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: &Shared,
) -> io::Result<()> {
    let (queue, mut queued) = mpsc::channel::<(Vec<u8>, Instant)>(CHUNKS_IN_FLIGHT);

    let read = async move {
        let mut buf = vec![0; CHUNK_SIZE];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(n) => n,
                Err(e) => {
                    wait_until_healed(shared).await;
                    return Err(e);
                }
            };
            if n == 0 {
                // End of stream: dropping `queue` lets the writer finish what
                // is queued and then pass the half-close on.
                wait_until_healed(shared).await;
                return Ok(());
            }
            if shared.blackholed() {
                continue;
            }
            let due = Instant::now() + shared.latency();
            if queue.send((buf[..n].to_vec(), due)).await.is_err() {
                // The writer failed; its error ends the connection.
                return Ok(());
            }
        }
    };

    let write = async move {
        while let Some((chunk, due)) = queued.recv().await {
            // Skipping the timer when nothing is due keeps the no-latency
            // path cheap.
            if due > Instant::now() {
                tokio::time::sleep_until(due).await;
            }
            // Checked again at delivery: bytes queued before a partition
            // started must not get through it.
            if shared.blackholed() {
                continue;
            }
            to.write_all(&chunk).await?;
        }
        to.shutdown().await
    };

    tokio::try_join!(read, write).map(|_| ())
}

/// Returns once the proxy is not blackholed; at once if it is not.
async fn wait_until_healed(shared: &Shared) {
    let mut blackhole = shared.blackhole.subscribe();
    // Errs only if the sender is gone, which cannot happen while `shared`
    // is borrowed.
    let _ = blackhole.wait_for(|on| !*on).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};
    use tokio::time::timeout;

    /// A generous bound for things that should happen in milliseconds, so a
    /// loaded CI machine does not make the tests flaky.
    const SOON: Duration = Duration::from_secs(5);

    /// Echo server on the calling runtime. Returns its address and a counter
    /// of connections it has seen closed by the peer.
    async fn echo_server() -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let closed = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&closed);
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                    counter.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        (addr, closed)
    }

    /// Echo server on a plain thread, for tests without a tokio runtime.
    fn std_echo_server() -> SocketAddr {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                thread::spawn(move || {
                    let mut buf = [0; 4096];
                    while let Ok(n @ 1..) = stream.read(&mut buf) {
                        if stream.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream, message: &[u8]) {
        stream.write_all(message).await.unwrap();
        let mut back = vec![0; message.len()];
        timeout(SOON, stream.read_exact(&mut back))
            .await
            .expect("echo timed out")
            .unwrap();
        assert_eq!(back, message);
    }

    /// Polls `condition` until it holds, failing the test after `SOON`.
    async fn eventually(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + SOON;
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// True if the peer has closed: a read gives end of stream or an error.
    async fn is_closed(stream: &mut TcpStream) -> bool {
        let mut byte = [0; 1];
        matches!(
            timeout(SOON, stream.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn bytes_flow_both_ways() {
        let (echo, _) = echo_server().await;
        let proxy = FaultProxy::start(echo).unwrap();
        assert_eq!(proxy.addr().port(), proxy.port());
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut client, b"hello").await;

        // More than the proxy's chunk and queue sizes, written while reading
        // so neither side blocks the other.
        let payload: Vec<u8> = (0..2 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
        let (mut read, mut write) = client.split();
        let (_, back) = tokio::join!(
            async {
                write.write_all(&payload).await.unwrap();
            },
            async {
                let mut back = vec![0; payload.len()];
                timeout(SOON, read.read_exact(&mut back))
                    .await
                    .unwrap()
                    .unwrap();
                back
            },
        );
        assert!(back == payload, "payload came back altered");
        assert_eq!(proxy.accepted(), 1);
        assert_eq!(proxy.open_connections(), 1);

        drop(client);
        eventually("the connection to be closed", || {
            proxy.open_connections() == 0
        })
        .await;
    }

    #[tokio::test]
    async fn cut_all_closes_both_sides_and_new_connections_work() {
        let (echo, echo_closed) = echo_server().await;
        let proxy = FaultProxy::start(echo).unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut client, b"before").await;

        // The connection is idle now; cut_all must still close it.
        let started = Instant::now();
        proxy.cut_all();
        assert_eq!(proxy.open_connections(), 0);
        assert!(is_closed(&mut client).await, "client side still open");
        assert!(started.elapsed() < Duration::from_millis(500));
        eventually("the upstream side to be closed", || {
            echo_closed.load(Ordering::SeqCst) == 1
        })
        .await;

        let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut again, b"after").await;
        assert_eq!(proxy.accepted(), 2);
        assert_eq!(proxy.open_connections(), 1);
    }

    #[tokio::test]
    async fn refusing_refuses_for_real_and_reopens_same_port() {
        let (echo, _) = echo_server().await;
        let proxy = FaultProxy::start(echo).unwrap();
        let addr = proxy.addr();
        let mut existing = TcpStream::connect(addr).await.unwrap();
        round_trip(&mut existing, b"x").await;

        for _ in 0..3 {
            proxy.set_refusing(true);
            let err = TcpStream::connect(addr).await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
            // Existing connections are not affected.
            round_trip(&mut existing, b"still here").await;

            proxy.set_refusing(false);
            assert_eq!(proxy.addr(), addr);
            let mut fresh = TcpStream::connect(addr).await.unwrap();
            round_trip(&mut fresh, b"accepted again").await;
        }
        // Repeated calls with the same value are harmless.
        proxy.set_refusing(false);
        proxy.set_refusing(true);
        proxy.set_refusing(true);
        assert!(TcpStream::connect(addr).await.is_err());
        proxy.set_refusing(false);
        assert_eq!(proxy.accepted(), 4);
    }

    #[tokio::test]
    async fn port_stays_reserved_while_refusing() {
        let (echo, _) = echo_server().await;
        let proxy = FaultProxy::start(echo).unwrap();
        proxy.set_refusing(true);
        // A socket without SO_REUSEADDR (like an outgoing connection picking
        // an ephemeral port) cannot take the port meanwhile, so turning
        // refusing off does not fail for that reason.
        let other = TcpSocket::new_v4().unwrap();
        let err = other.bind(proxy.addr()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        drop(other);
        proxy.set_refusing(false);
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut client, b"ok").await;
    }

    #[tokio::test]
    async fn blackhole_drops_bytes_keeps_connection_and_heals() {
        let (echo, _) = echo_server().await;
        let proxy = FaultProxy::start(echo).unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut client, b"before").await;

        proxy.set_blackhole(true);
        client.write_all(b"lost").await.unwrap();
        let mut buf = [0; 16];
        let read = timeout(Duration::from_millis(300), client.read(&mut buf)).await;
        assert!(read.is_err(), "got {read:?} through a blackhole");
        assert_eq!(proxy.open_connections(), 1);

        proxy.set_blackhole(false);
        // "lost" stays lost: only the new bytes come back.
        round_trip(&mut client, b"found").await;
        assert_eq!(proxy.accepted(), 1);
    }

    #[tokio::test]
    async fn blackhole_holds_back_a_close_until_healed() {
        let (echo, echo_closed) = echo_server().await;
        let proxy = FaultProxy::start(echo).unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut client, b"up").await;

        proxy.set_blackhole(true);
        client.shutdown().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(echo_closed.load(Ordering::SeqCst), 0);
        assert_eq!(proxy.open_connections(), 1);

        proxy.set_blackhole(false);
        eventually("the close to reach upstream", || {
            echo_closed.load(Ordering::SeqCst) == 1
        })
        .await;
        assert!(is_closed(&mut client).await);
        eventually("the connection to be closed", || {
            proxy.open_connections() == 0
        })
        .await;
    }

    #[tokio::test]
    async fn latency_delays_each_direction_and_keeps_order() {
        let (echo, _) = echo_server().await;
        let proxy = FaultProxy::start(echo).unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        round_trip(&mut client, b"warm").await;

        proxy.set_latency(Duration::from_millis(100));
        let started = Instant::now();
        round_trip(&mut client, b"slow").await;
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(200), "took {elapsed:?}");

        // Many separate writes, each its own chunk, must arrive in order.
        let messages: Vec<Vec<u8>> = (0..50u8).map(|i| vec![i; 1 + usize::from(i)]).collect();
        let expected = messages.concat();
        let (mut read, mut write) = client.split();
        let (_, back) = tokio::join!(
            async {
                for message in &messages {
                    write.write_all(message).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            },
            async {
                let mut back = vec![0; expected.len()];
                timeout(SOON, read.read_exact(&mut back))
                    .await
                    .unwrap()
                    .unwrap();
                back
            },
        );
        assert_eq!(back, expected);

        proxy.set_latency(Duration::ZERO);
        let started = Instant::now();
        round_trip(&mut client, b"fast").await;
        assert!(started.elapsed() < Duration::from_millis(200));
    }

    #[tokio::test]
    async fn unreachable_upstream_closes_the_client() {
        // A port that nothing listens on.
        let dead = {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
            listener.local_addr().unwrap()
        };
        let proxy = FaultProxy::start(dead).unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        assert!(is_closed(&mut client).await);
        assert_eq!(proxy.accepted(), 1);
    }

    /// Works from a sync test, outlives the runtime it was started in, and
    /// closes its connections when dropped.
    #[test]
    fn sync_use_outliving_the_starting_runtime_and_drop() {
        let echo = std_echo_server();
        let proxy = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(async { FaultProxy::start(echo) })
            .unwrap();
        // That runtime is gone now.
        let mut client = std::net::TcpStream::connect(proxy.addr()).unwrap();
        client.set_read_timeout(Some(SOON)).unwrap();
        client.write_all(b"sync").unwrap();
        let mut back = [0; 4];
        client.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"sync");

        let addr = proxy.addr();
        drop(proxy);
        let mut byte = [0; 1];
        assert!(matches!(client.read(&mut byte), Ok(0) | Err(_)));
        assert!(std::net::TcpStream::connect(addr).is_err());
    }
}
