//! Where a delivery's work runs: on the task that received it, or on a task
//! of its own.
//!
//! A task of its own for every delivery lets plugin calls spread over the
//! runtime's workers, but for short work the hand-over costs more than the
//! work: the spawned task waits in the receiving worker's queue, an idle
//! worker is woken to steal it (a futex wake, then a park again), and the
//! delivery's state moves between cores. On the echo path, two cores, that
//! churn made the host's CPU per message a quarter higher with two
//! runtime workers than with one.
//!
//! So each delivery's work is polled once on the receiving task first. For
//! most deliveries that one poll is all of it (the plugin call and the
//! ack); whatever still waits after it (outputs waiting for their
//! confirms, the state store, a call that yielded at an epoch tick) goes on
//! a task of its own, as before. A plugin whose calls spend real CPU time
//! (Python, JavaScript: tens to hundreds of microseconds) would then run
//! every call of its subscription on one worker, so while first polls take
//! longer than [`INLINE_LIMIT`] on average, work is spawned whole and the
//! calls spread over the workers again; one delivery in [`PROBE_EVERY`]
//! still starts inline, to notice when they become short again.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

/// The longest first poll, on average, that stays on the receiving task: a
/// few times what handing the work to another worker costs. Past it, a
/// subscription's calls are better spread over the workers.
const INLINE_LIMIT: Duration = Duration::from_micros(25);

/// While work is spawned whole, one delivery in this many still starts on
/// the receiving task, to measure its first poll.
const PROBE_EVERY: u32 = 32;

/// The average of recent first polls, and when to measure one again.
#[derive(Debug, Default)]
pub(super) struct Placement {
    /// Exponentially weighted (1/8 for the newest), in nanoseconds.
    typical_nanos: u64,
    /// Deliveries spawned whole since the last one measured.
    since_probe: u32,
}

impl Placement {
    /// Starts `work`: its first poll here (when first polls are short), and
    /// what remains of it, or all of it, on a task of its own in `running`.
    ///
    /// A panic in the first poll drops the work, as a spawned task's panic
    /// would: the delivery's receipt, dropped with it, gives the delivery
    /// back and says so.
    ///
    /// `work` comes boxed, by its maker: a delivery's future is kilobytes
    /// (its plugin call and settling inline), and a task keeps its future
    /// inline, so spawning it unboxed moved the whole of it several times
    /// (5.1 % of the host's CPU on echo); boxed where it is made, it is not
    /// copied on its way here either.
    pub(super) async fn start(
        &mut self,
        running: &mut JoinSet<()>,
        mut work: Pin<Box<impl Future<Output = ()> + Send + 'static>>,
    ) {
        if self.starts_inline() {
            let started = Instant::now();
            // The receiving task's waker is what the first poll registers;
            // a future wakes the waker of its latest poll, so the spawned
            // task's own first poll takes over.
            let first = std::future::poll_fn(|cx| {
                Poll::Ready(catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx))))
            })
            .await;
            self.record(started.elapsed());
            match first {
                Ok(Poll::Pending) => {}
                Ok(Poll::Ready(())) | Err(_) => return,
            }
        }
        running.spawn(work);
    }

    /// Whether the next delivery's first poll runs on the receiving task.
    fn starts_inline(&mut self) -> bool {
        if self.typical_nanos <= nanos(INLINE_LIMIT) {
            self.since_probe = 0;
            return true;
        }
        self.since_probe += 1;
        if self.since_probe >= PROBE_EVERY {
            self.since_probe = 0;
            return true;
        }
        false
    }

    /// Counts one first poll into the average.
    fn record(&mut self, took: Duration) {
        self.typical_nanos = self.typical_nanos - self.typical_nanos / 8 + nanos(took) / 8;
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many of `n` deliveries start inline, each first poll taking `took`.
    fn inline_of(placement: &mut Placement, n: usize, took: Duration) -> usize {
        (0..n)
            .filter(|_| {
                let inline = placement.starts_inline();
                if inline {
                    placement.record(took);
                }
                inline
            })
            .count()
    }

    #[test]
    fn short_work_always_starts_inline() {
        let mut placement = Placement::default();
        assert_eq!(
            inline_of(&mut placement, 1000, Duration::from_micros(3)),
            1000
        );
    }

    #[test]
    fn long_work_is_spawned_whole_but_measured_again_now_and_then() {
        let mut placement = Placement::default();
        let inline = inline_of(&mut placement, 1000, Duration::from_micros(400));
        // The first few, until the average passes the limit, then the probes.
        assert!(inline < 1000 / PROBE_EVERY as usize + 5, "{inline}");
        assert!(inline >= 1000 / PROBE_EVERY as usize, "{inline}");
    }

    #[test]
    fn work_that_becomes_short_comes_back_inline() {
        let mut placement = Placement::default();
        // A slow start (the first call compiles, a cold cache).
        inline_of(&mut placement, 1, Duration::from_millis(5));
        assert!(!placement.starts_inline());
        // Short probes bring the average down within a few hundred
        // deliveries, and then every delivery starts inline.
        inline_of(&mut placement, 2000, Duration::from_micros(3));
        assert_eq!(
            inline_of(&mut placement, 100, Duration::from_micros(3)),
            100
        );
    }

    #[tokio::test]
    async fn work_that_waits_goes_on_a_task_of_its_own_and_finishes_there() {
        let mut placement = Placement::default();
        let mut running = JoinSet::new();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        placement
            .start(
                &mut running,
                Box::pin(async move {
                    rx.await.unwrap();
                    done_tx.send(()).unwrap();
                }),
            )
            .await;
        assert_eq!(running.len(), 1, "pending after its first poll: spawned");
        tx.send(()).unwrap();
        done_rx.await.unwrap();
        running.join_next().await.unwrap().unwrap();
        // Work done in its first poll never becomes a task.
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = done.clone();
        placement
            .start(
                &mut running,
                Box::pin(async move {
                    flag.store(true, std::sync::atomic::Ordering::SeqCst);
                }),
            )
            .await;
        assert!(done.load(std::sync::atomic::Ordering::SeqCst));
        assert!(running.is_empty());
    }

    #[tokio::test]
    async fn a_panic_in_the_first_poll_drops_the_work_and_nothing_else() {
        struct Dropped(Option<tokio::sync::oneshot::Sender<()>>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                let _ = self.0.take().unwrap().send(());
            }
        }
        let mut placement = Placement::default();
        let mut running = JoinSet::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let guard = Dropped(Some(tx));
        placement
            .start(
                &mut running,
                Box::pin(async move {
                    let _guard = guard;
                    panic!("the work's own bug");
                }),
            )
            .await;
        assert!(running.is_empty());
        rx.await.expect("the work was dropped, with what it held");
    }
}
