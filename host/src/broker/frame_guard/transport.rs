//! The guard on a socket: [`Guarded`] wraps the stream lapin reads (plain
//! or TLS, after the handshake, so it sees AMQP bytes) and hands on what
//! [`FrameGuard`] lets through; [`GuardedReactor`] is the runtime piece
//! through which lapin's `Connection::connector` accepts such a stream (its
//! connect closure must return the reactor's own stream type).
//!
//! Writes pass straight through. Reads are copied once into a buffer of
//! the guard's (frames must be whole to be judged), except the bytes of a
//! frame that needs no judging when nothing else is buffered (a large
//! body's), which are read straight into lapin's buffer.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use async_rs::Tokio;
use async_rs::traits::Reactor;
use futures::Stream;
use futures::io::{AsyncRead, AsyncWrite};
use lapin::tcp::AsyncTcpStream;

use super::{FrameGuard, Step};

/// The socket's stream before the guard: tokio's, maybe inside TLS.
pub type Inner = AsyncTcpStream<<Tokio as Reactor>::TcpStream>;

/// What the guard first reserves for what it reads; it grows to the
/// largest frame it must hold whole.
const INITIAL_BUFFER: usize = 64 * 1024;

/// A stream whose inbound bytes pass through a [`FrameGuard`].
pub struct Guarded<S> {
    inner: S,
    guard: FrameGuard,
    /// Bytes read: `buf[released..checked]` may be handed on,
    /// `buf[checked..filled]` wait to be judged. Its length is its
    /// capacity, zeroed once, so reads do not clear it again.
    buf: Vec<u8>,
    released: usize,
    checked: usize,
    filled: usize,
    /// Bytes past `checked` the guard needs before it can judge more.
    needed: usize,
}

impl<S> Guarded<S> {
    pub fn new(inner: S, client_frame_max: u32) -> Self {
        Self {
            inner,
            guard: FrameGuard::new(client_frame_max),
            buf: Vec::new(),
            released: 0,
            checked: 0,
            filled: 0,
            needed: 1,
        }
    }

    /// Judges what was read, as far as it can be judged now.
    fn judge_buffered(&mut self) {
        self.needed = 1;
        while self.checked < self.filled {
            match self.guard.step(&self.buf[self.checked..self.filled]) {
                Step::Pass(n) => self.checked += n,
                Step::NeedMore(n) => {
                    self.needed = n;
                    return;
                }
                Step::Replace { consumed, with } => {
                    let (start, end) = (self.checked, self.checked + consumed);
                    let mut rebuilt =
                        Vec::with_capacity(self.buf.len().max(self.filled + with.len()));
                    rebuilt.extend_from_slice(&self.buf[..start]);
                    rebuilt.extend_from_slice(&with);
                    rebuilt.extend_from_slice(&self.buf[end..self.filled]);
                    self.filled = rebuilt.len();
                    rebuilt.resize(rebuilt.capacity(), 0);
                    self.buf = rebuilt;
                    self.checked = start + with.len();
                    tracing::warn!(
                        rewritten_on_this_connection = self.guard.rewritten(),
                        "a delivery from the broker holds bytes lapin cannot read (not UTF-8, or a header table it cannot walk); it was made readable and marked, and its consumer sets it aside"
                    );
                }
            }
        }
    }

    /// Room to read at least up to `needed` bytes past `checked`: what was
    /// handed on is dropped from the front, and the buffer grows if need be.
    fn make_room(&mut self, needed: usize) {
        if self.released == self.checked && self.checked > 0 {
            self.buf.copy_within(self.checked..self.filled, 0);
            self.filled -= self.checked;
            self.released = 0;
            self.checked = 0;
        }
        let want = (self.checked + needed).max(INITIAL_BUFFER);
        if self.buf.len() < want || self.filled == self.buf.len() {
            let grown = want.max(self.buf.len() * 2).max(INITIAL_BUFFER);
            self.buf.resize(grown, 0);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if out.is_empty() {
            return Poll::Ready(Ok(0));
        }
        loop {
            if this.released < this.checked {
                let n = (this.checked - this.released).min(out.len());
                out[..n].copy_from_slice(&this.buf[this.released..this.released + n]);
                this.released += n;
                return Poll::Ready(Ok(n));
            }
            // Nothing judged waits; a frame that needs no judging is read
            // straight into the caller's buffer.
            let passing = this.guard.passing();
            if passing > 0 && this.checked == this.filled {
                let limit = passing.min(out.len());
                let n = ready!(Pin::new(&mut this.inner).poll_read(cx, &mut out[..limit]))?;
                this.guard.passed(n);
                return Poll::Ready(Ok(n));
            }
            this.make_room(this.needed);
            let filled = this.filled;
            let n = ready!(Pin::new(&mut this.inner).poll_read(cx, &mut this.buf[filled..]))?;
            if n == 0 {
                // The end: hand on whatever is left as it is, then the end.
                if this.checked < this.filled {
                    this.checked = this.filled;
                    continue;
                }
                return Poll::Ready(Ok(0));
            }
            this.filled += n;
            this.judge_buffered();
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_close(cx)
    }
}

/// lapin's default tokio reactor, except that its TCP stream is a
/// [`Guarded`] one. The host's connect closure builds the stream itself
/// (TCP, then TLS for `amqps://`, then the guard);
/// [`Reactor::tcp_connect_addr`] guards a plain connection the same way,
/// should lapin ever connect through it.
#[derive(Debug, Clone)]
pub struct GuardedReactor {
    tokio: Tokio,
    client_frame_max: u32,
}

/// The runtime lapin is given: tokio's executor, the guarded reactor.
pub type GuardedRuntime = async_rs::Runtime<async_rs::util::RuntimeParts<Tokio, GuardedReactor>>;

impl GuardedReactor {
    /// A reactor on the current tokio runtime for connections that ask for
    /// `client_frame_max` (0: the server's).
    pub fn new(client_frame_max: u32) -> Self {
        Self {
            tokio: Tokio::current(),
            client_frame_max,
        }
    }

    /// The runtime to give lapin: tokio's executor and this reactor.
    pub fn runtime(&self) -> GuardedRuntime {
        async_rs::Runtime::new(async_rs::util::RuntimeParts::new(
            self.tokio.clone(),
            self.clone(),
        ))
    }

    /// Guards a connected stream.
    pub fn guard(&self, stream: Inner) -> Guarded<Inner> {
        Guarded::new(stream, self.client_frame_max)
    }

    /// The unguarded tokio reactor, to connect and shake hands through.
    pub fn tokio(&self) -> &Tokio {
        &self.tokio
    }
}

impl Reactor for GuardedReactor {
    type TcpStream = Guarded<Inner>;
    type Sleep = <Tokio as Reactor>::Sleep;

    fn register<H: io::Read + io::Write + AsFd + AsRawFd + Send + 'static>(
        &self,
        socket: H,
    ) -> io::Result<impl AsyncRead + AsyncWrite + Send + Unpin + 'static> {
        self.tokio.register(socket)
    }

    fn sleep(&self, dur: Duration) -> Self::Sleep {
        self.tokio.sleep(dur)
    }

    fn interval(&self, dur: Duration) -> impl Stream<Item = Instant> + Send + 'static {
        self.tokio.interval(dur)
    }

    fn tcp_connect_addr(
        &self,
        addr: SocketAddr,
    ) -> impl Future<Output = io::Result<Self::TcpStream>> + Send + 'static {
        let connecting = self.tokio.tcp_connect_addr(addr);
        let reactor = self.clone();
        async move { Ok(reactor.guard(AsyncTcpStream::Plain(connecting.await?))) }
    }
}
