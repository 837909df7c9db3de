//! A bound on how long one write to a client may wait: a client that stops
//! reading (its socket's buffers full) would otherwise hold its connection,
//! and the request being answered on it, for as long as it likes.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// A stream whose writes fail with `TimedOut` once one has made no
/// progress for `limit`.
pub struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    /// Started when a write could not proceed; cleared when one does.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteDeadline<S> {
    pub fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            stalled: None,
        }
    }

    /// After the inner stream said it cannot proceed: pending, or the
    /// error once it has not for `limit`.
    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client read nothing for {}",
                    humantime::format_duration(limit)
                ),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progressed<T>(&mut self, result: io::Result<T>) -> Poll<io::Result<T>> {
        self.stalled = None;
        Poll::Ready(result)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(result) => this.progressed(result),
            Poll::Pending => this.pending(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(result) => this.progressed(result),
            Poll::Pending => this.pending(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Ready(result) => this.progressed(result),
            Poll::Pending => this.pending(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_shutdown(cx) {
            Poll::Ready(result) => this.progressed(result),
            Poll::Pending => this.pending(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt as _;

    use super::*;

    #[tokio::test]
    async fn a_write_the_peer_never_reads_fails_after_the_limit() {
        // A pipe whose other end is never read: writes stop once it is full.
        let (client, _server) = tokio::io::duplex(64);
        let limit = Duration::from_millis(200);
        let mut stream = WriteDeadline::new(client, limit);
        let started = tokio::time::Instant::now();
        let error = stream.write_all(&[0u8; 1024]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= limit, "{:?}", started.elapsed());
        assert!(
            error.to_string().contains("read nothing for 200ms"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn writes_that_progress_never_time_out() {
        let (client, mut server) = tokio::io::duplex(64);
        let mut stream = WriteDeadline::new(client, Duration::from_millis(500));
        let reader = tokio::spawn(async move {
            let mut sink = Vec::new();
            let mut buf = [0u8; 16];
            use tokio::io::AsyncReadExt as _;
            loop {
                // A slow reader, but one that reads: 16 bytes every 50 ms
                // (a whole write takes far longer than the limit).
                tokio::time::sleep(Duration::from_millis(50)).await;
                let n = server.read(&mut buf).await.unwrap();
                if n == 0 {
                    return sink;
                }
                sink.extend_from_slice(&buf[..n]);
            }
        });
        stream.write_all(&[7u8; 256]).await.unwrap();
        stream.shutdown().await.unwrap();
        drop(stream);
        assert_eq!(reader.await.unwrap().len(), 256);
    }
}
