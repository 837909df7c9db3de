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
//! ack). What still waits after it (outputs waiting for their confirms, the
//! state store, a call that yielded at an epoch tick) stays on the
//! receiving task too, among its kept work ([`Running`]), which the receive
//! loop polls whenever it waits: confirms that arrive together then wake
//! one task once, as in a hand-written loop that awaits its confirms in
//! order, instead of one task each (a spawn, a wake from lapin's thread and
//! often a steal by the other worker, for every delivery).
//!
//! A plugin whose calls spend real CPU time (Python, JavaScript: tens to
//! hundreds of microseconds) would then run every call of its subscription
//! on one worker, so while first polls take longer than [`INLINE_LIMIT`] on
//! average, work is spawned whole and the calls spread over the workers
//! again; one delivery in [`PROBE_EVERY`] still starts inline, to notice
//! when they become short again, and goes on a task of its own if it waits.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::task::JoinSet;

/// The longest first poll, on average, that stays on the receiving task: a
/// few times what handing the work to another worker costs. Past it, a
/// subscription's calls are better spread over the workers.
const INLINE_LIMIT: Duration = Duration::from_micros(25);

/// While work is spawned whole, one delivery in this many still starts on
/// the receiving task, to measure its first poll.
const PROBE_EVERY: u32 = 32;

/// A delivery's work, boxed once (see [`Placement::start`]).
type Work = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The average of recent first polls, and when to measure one again.
#[derive(Debug, Default)]
pub(super) struct Placement {
    /// Exponentially weighted (1/8 for the newest), in nanoseconds.
    typical_nanos: u64,
    /// Deliveries spawned whole since the last one measured.
    since_probe: u32,
}

/// The work of a subscription's deliveries that did not finish in its
/// first poll: kept on the receiving task, or on tasks of their own.
#[derive(Default)]
pub(super) struct Running {
    /// Polled by the receiving task, through [`Running::settle_kept`] and
    /// [`Running::while_settling`]. A panic in one drops that work alone,
    /// as a spawned task's panic would.
    kept: FuturesUnordered<futures::future::CatchUnwind<AssertUnwindSafe<Work>>>,
    spawned: JoinSet<()>,
}

impl Running {
    /// Drives the kept work until one finishes; never returns while there
    /// is none (so that it can be one branch of a `select!`).
    pub(super) async fn settle_kept(&mut self) {
        if self.kept.next().await.is_none() {
            std::future::pending::<()>().await;
        }
    }

    /// `wait`'s output, the kept work driven meanwhile: the receiving task
    /// must not wait on anything (a free place, room in a window) without
    /// it, since the kept work may be what frees it.
    pub(super) async fn while_settling<T>(&mut self, wait: impl Future<Output = T>) -> T {
        tokio::pin!(wait);
        loop {
            tokio::select! {
                biased;
                output = &mut wait => return output,
                () = self.settle_kept() => {}
            }
        }
    }

    /// Drives the kept work until one of all the running work finishes,
    /// kept or spawned; `None` when none runs.
    pub(super) async fn next(&mut self) -> Option<()> {
        if self.kept.is_empty() {
            return self.spawned.join_next().await.map(drop);
        }
        if self.spawned.is_empty() {
            return self.kept.next().await.map(drop);
        }
        tokio::select! {
            done = self.kept.next() => done.map(drop),
            done = self.spawned.join_next() => done.map(drop),
        }
    }

    /// How much work is running, kept or spawned.
    pub(super) fn len(&self) -> usize {
        self.kept.len() + self.spawned.len()
    }

    /// Drops the kept work and aborts the spawned.
    pub(super) fn stop_all(&mut self) {
        self.kept.clear();
        self.spawned.abort_all();
    }

    /// Forgets the spawned work that has finished.
    pub(super) fn reap(&mut self) {
        while self.spawned.try_join_next().is_some() {}
    }

    /// Everything still running, each on a task of its own: for a
    /// subscription that stops receiving, whose kept work must go on
    /// without the receive loop until it is drained.
    pub(super) fn into_tasks(self) -> JoinSet<()> {
        let Self { kept, mut spawned } = self;
        for work in kept {
            spawned.spawn(work.map(|_| ()));
        }
        spawned
    }

    fn keep(&mut self, work: Work) {
        self.kept.push(AssertUnwindSafe(work).catch_unwind());
    }
}

impl Placement {
    /// Starts `work`: its first poll here (when first polls are short) and
    /// what remains of it kept in `running`; or all of it on a task of its
    /// own.
    ///
    /// A panic in the first poll drops the work, as a spawned task's panic
    /// would: the delivery's receipt, dropped with it, gives the delivery
    /// back and says so.
    pub(super) async fn start(
        &mut self,
        running: &mut Running,
        work: impl Future<Output = ()> + Send + 'static,
    ) {
        // Boxed once, before the first poll: the future is over a kilobyte,
        // and a task keeps its future inline, so spawning it unboxed moved
        // the whole of it several times (5.1 % of the host's CPU on echo).
        let mut work: Work = Box::pin(work);
        if self.starts_inline() {
            let started = Instant::now();
            // The receiving task's waker is what the first poll registers;
            // a future wakes the waker of its latest poll, so whoever polls
            // it next (the kept work's set, or a task of its own) takes over.
            let first = std::future::poll_fn(|cx| {
                Poll::Ready(catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx))))
            })
            .await;
            self.record(started.elapsed());
            match first {
                Ok(Poll::Pending) => {}
                Ok(Poll::Ready(())) | Err(_) => return,
            }
            if self.is_short() {
                running.keep(work);
                return;
            }
        }
        running.spawned.spawn(work);
    }

    /// Whether first polls are short enough, on average, to stay on the
    /// receiving task.
    fn is_short(&self) -> bool {
        self.typical_nanos <= nanos(INLINE_LIMIT)
    }

    /// Whether the next delivery's first poll runs on the receiving task.
    fn starts_inline(&mut self) -> bool {
        if self.is_short() {
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

    /// Work that waits on `rx` after its first poll, then says so on the
    /// returned receiver.
    fn waiting_work(
        rx: tokio::sync::oneshot::Receiver<()>,
    ) -> (
        impl Future<Output = ()> + Send + 'static,
        tokio::sync::oneshot::Receiver<()>,
    ) {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let work = async move {
            rx.await.unwrap();
            done_tx.send(()).unwrap();
        };
        (work, done_rx)
    }

    #[tokio::test]
    async fn short_work_that_waits_is_kept_and_finishes_when_the_receiving_task_settles() {
        let mut placement = Placement::default();
        let mut running = Running::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (work, mut done_rx) = waiting_work(rx);
        placement.start(&mut running, work).await;
        assert_eq!(
            (running.kept.len(), running.spawned.len()),
            (1, 0),
            "pending after a short first poll: kept, not spawned"
        );
        tx.send(()).unwrap();
        // Nothing else polls kept work: it waits for the receiving task.
        tokio::task::yield_now().await;
        assert!(done_rx.try_recv().is_err(), "kept work ran on its own");
        running.settle_kept().await;
        done_rx.await.expect("the kept work finished");
        assert_eq!(running.len(), 0);
        // Work done in its first poll is neither kept nor spawned.
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = done.clone();
        placement
            .start(&mut running, async move {
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
            })
            .await;
        assert!(done.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(running.len(), 0);
    }

    #[tokio::test]
    async fn a_wait_of_the_receiving_task_drives_the_kept_work_that_frees_it() {
        let mut placement = Placement::default();
        let mut running = Running::default();
        let places = std::sync::Arc::new(tokio::sync::Semaphore::new(1));
        let held = places.clone().acquire_owned().await.unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        // Holds the only place until it is woken, as a delivery holds its
        // window's place until its outputs are confirmed.
        placement
            .start(&mut running, async move {
                rx.await.unwrap();
                drop(held);
            })
            .await;
        tx.send(()).unwrap();
        let place = tokio::time::timeout(
            Duration::from_secs(5),
            running.while_settling(places.acquire_owned()),
        )
        .await
        .expect("the wait drove the work that frees the place");
        assert!(place.is_ok());
    }

    #[tokio::test]
    async fn long_work_that_waits_goes_on_a_task_of_its_own_and_finishes_there() {
        let mut placement = Placement::default();
        placement.record(Duration::from_millis(5));
        while placement.since_probe + 1 < PROBE_EVERY {
            assert!(!placement.starts_inline());
        }
        let mut running = Running::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (work, done_rx) = waiting_work(rx);
        // The probe: polled here first, then spawned, since the average is
        // still long.
        placement.start(&mut running, work).await;
        assert_eq!((running.kept.len(), running.spawned.len()), (0, 1));
        tx.send(()).unwrap();
        done_rx.await.expect("the spawned work finished by itself");
        running.next().await.expect("one finished");
    }

    #[tokio::test]
    async fn kept_work_goes_on_tasks_of_its_own_when_the_receiving_stops() {
        let mut placement = Placement::default();
        let mut running = Running::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (work, done_rx) = waiting_work(rx);
        placement.start(&mut running, work).await;
        let mut tasks = running.into_tasks();
        assert_eq!(tasks.len(), 1);
        tx.send(()).unwrap();
        done_rx.await.expect("it finished without the receive loop");
        tasks.join_next().await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_panic_in_kept_work_drops_that_work_alone() {
        let mut placement = Placement::default();
        let mut running = Running::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        placement
            .start(&mut running, async move {
                rx.await.unwrap();
                panic!("the work's own bug, after its first poll");
            })
            .await;
        let (other_tx, other_rx) = tokio::sync::oneshot::channel::<()>();
        let (other, other_done) = waiting_work(other_rx);
        placement.start(&mut running, other).await;
        tx.send(()).unwrap();
        other_tx.send(()).unwrap();
        running.settle_kept().await;
        running.settle_kept().await;
        other_done.await.expect("the other work finished");
        assert_eq!(running.len(), 0);
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
        let mut running = Running::default();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let guard = Dropped(Some(tx));
        placement
            .start(&mut running, async move {
                let _guard = guard;
                panic!("the work's own bug");
            })
            .await;
        assert_eq!(running.len(), 0);
        rx.await.expect("the work was dropped, with what it held");
    }
}
