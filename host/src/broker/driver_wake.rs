//! A lapin consumer whose wake-ups reach the runtime through its I/O
//! driver instead of through the scheduler's shared queue.
//!
//! Why: lapin hands deliveries over on its I/O thread, outside the runtime.
//! A task woken from outside goes on the runtime's shared queue, and an
//! idle worker is unparked to look for it; that worker finds it as the last
//! "searching" worker, and tokio then unparks another one to keep
//! searching, which finds nothing and parks again. On the consume-only path
//! every burst of deliveries to an idle subscription paid that second
//! worker's wake-up and park (docs/benchmarks.md, "Where echo's second
//! worker goes"). Here lapin's wake-up writes to an eventfd registered with
//! the runtime's I/O driver instead: the worker parked on the driver sees
//! it, schedules the subscription's task on itself, and nobody else is
//! woken. Measured on echo (`loadgen consume-host`, 60,000 messages, 5
//! interleaved pairs, two workers): 8.0–8.5 µs of CPU a message against
//! 9.0–10.6 (medians 8.2 and 9.3), and 14,300–16,100 context switches
//! against 20,300–23,700; lapin's I/O thread too spends less signalling
//! an eventfd than unparking a worker (3.4–3.7 µs a message against
//! 3.8–4.3).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::Stream;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A non-blocking eventfd: signalled by the waker lapin is given, read by
/// the runtime's driver.
struct EventFd(OwnedFd);

impl EventFd {
    fn new() -> std::io::Result<Self> {
        // SAFETY: eventfd takes no pointers; it returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Adds one to the counter, which makes the descriptor readable.
    fn signal(&self) {
        let one: u64 = 1;
        // Non-blocking: it fails only when the counter would overflow,
        // and then a wake-up is waiting to be read anyway.
        // SAFETY: writes 8 bytes from a live u64 to a descriptor this owns.
        let _ = unsafe {
            libc::write(
                self.0.as_raw_fd(),
                (&raw const one).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// Resets the counter to zero, so that the next signal is seen anew.
    fn drain(&self) {
        let mut count: u64 = 0;
        // Non-blocking: on a counter already zero it fails, harmlessly.
        // SAFETY: reads at most 8 bytes into a live u64.
        let _ = unsafe {
            libc::read(
                self.0.as_raw_fd(),
                (&raw mut count).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

impl Wake for EventFd {
    fn wake(self: Arc<Self>) {
        self.signal();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.signal();
    }
}

/// The eventfd as registered with the driver: shared with the waker, so
/// the descriptor stays open while either is alive.
struct Registered(Arc<EventFd>);

impl AsRawFd for Registered {
    fn as_raw_fd(&self) -> RawFd {
        self.0.0.as_raw_fd()
    }
}

/// A stream polled with a waker that signals an eventfd, and awaited
/// through the runtime's I/O driver.
pub struct DriverWoken<S> {
    inner: S,
    /// `None` when no eventfd could be made or registered: the stream is
    /// then polled plainly, woken through the scheduler.
    signalled: Option<(Waker, AsyncFd<Registered>)>,
}

impl<S> DriverWoken<S> {
    /// Wraps `inner`. Must be called inside the tokio runtime (with I/O
    /// enabled) whose driver is to carry the wake-ups.
    pub fn new(inner: S) -> Self {
        let signalled = signalled().inspect_err(|error| {
            tracing::warn!(
                %error,
                "no eventfd for a subscription's wake-ups (out of descriptors?); it is woken \
                 through the scheduler instead, at some more CPU a message"
            )
        });
        Self {
            inner,
            signalled: signalled.ok(),
        }
    }
}

/// A waker that signals a new eventfd, and the eventfd registered with the
/// current runtime's driver.
fn signalled() -> std::io::Result<(Waker, AsyncFd<Registered>)> {
    let eventfd = Arc::new(EventFd::new()?);
    // SAFETY: the descriptor is valid, stays open as long as the `AsyncFd`
    // holds its `Arc`, and `as_raw_fd` always returns it.
    let ready =
        unsafe { AsyncFd::register_with_interest(Registered(eventfd.clone()), Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
    Ok((Waker::from(eventfd), ready))
}

impl<S: Stream + Unpin> Stream for DriverWoken<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = self.get_mut();
        let Some((waker, ready)) = &this.signalled else {
            return Pin::new(&mut this.inner).poll_next(cx);
        };
        loop {
            let mut signalling = Context::from_waker(waker);
            if let Poll::Ready(item) = Pin::new(&mut this.inner).poll_next(&mut signalling) {
                return Poll::Ready(item);
            }
            match ready.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(mut guard)) => {
                    // Both before the stream is polled again: a signal
                    // after this point makes the descriptor ready anew.
                    guard.clear_ready();
                    guard.get_inner().0.drain();
                }
                // The driver is gone (the runtime is shutting down): wait
                // the plain way.
                Poll::Ready(Err(_)) => return Pin::new(&mut this.inner).poll_next(cx),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use super::*;

    /// What `work` gives, failing the test if it has not finished within
    /// 10 s. The deadline is checked before `work` is polled (unlike
    /// `tokio::time::timeout`): the timer's own wake-up must not be what
    /// rescues a stream whose wake-up was lost.
    async fn within_a_while<F: Future>(work: F) -> F::Output {
        tokio::select! {
            biased;
            _ = tokio::time::sleep(Duration::from_secs(10)) => {
                panic!("a wake-up was lost: the stream stalled")
            }
            output = work => output,
        }
    }

    /// Items sent from a thread outside the runtime, some while the
    /// receiver waits and some in bursts, all arrive, in order, and the
    /// end of the stream with them: no wake-up is lost between the stream
    /// and the driver.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_item_sent_from_outside_the_runtime_arrives_in_order() {
        let (sender, receiver) = futures::channel::mpsc::unbounded::<u32>();
        let mut woken = DriverWoken::new(receiver);
        let feeder = std::thread::spawn(move || {
            for i in 0..20_000u32 {
                sender.unbounded_send(i).unwrap();
                if i % 1_000 == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        });
        let all = async {
            let mut received = Vec::new();
            while let Some(item) = woken.next().await {
                received.push(item);
            }
            received
        };
        let received = within_a_while(all).await;
        feeder.join().unwrap();
        assert_eq!(received, (0..20_000).collect::<Vec<_>>());
    }

    /// A receiver that waits alone (nothing ready) is woken by a single
    /// item sent later from another thread.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_single_late_item_wakes_the_waiting_receiver() {
        let (sender, receiver) = futures::channel::mpsc::unbounded::<&str>();
        let mut woken = DriverWoken::new(receiver);
        let feeder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            sender.unbounded_send("late").unwrap();
            sender
        });
        assert_eq!(within_a_while(woken.next()).await, Some("late"));
        drop(feeder.join().unwrap());
        assert_eq!(woken.next().await, None);
    }
}
