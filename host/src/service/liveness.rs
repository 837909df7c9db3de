//! Whether the host's runtime still makes progress: a task on the runtime
//! beats every [`BEAT`]; a thread of its own ([`Watchdog`]) reads the beat,
//! and while it is recent feeds the service manager's watchdog. A beat
//! silent for [`STALLED_AFTER`] means the runtime's workers no longer run
//! its tasks (each stuck in one call that never yields, say): the host is
//! not alive, whatever the broker does, and only a restart helps.
//!
//! What a runtime that is merely busy looks like: every delivery, plugin
//! call (which yields every epoch tick) and broker wait shares the workers
//! with the beat, so under the heaviest load the beat is late by
//! milliseconds, not seconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::notify::Notifier;

/// How often the runtime's task beats.
pub const BEAT: Duration = Duration::from_secs(1);
/// A beat silent this long means the runtime is stuck.
pub const STALLED_AFTER: Duration = Duration::from_secs(10);
/// How often the watchdog thread looks, at most.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// When the runtime last ran its beat task.
#[derive(Debug)]
pub struct Heartbeat {
    origin: Instant,
    /// Milliseconds from `origin` to the last beat.
    last: AtomicU64,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last: AtomicU64::new(0),
        }
    }
}

impl Heartbeat {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Notes that the runtime ran the beat task now.
    pub fn beat(&self) {
        let since = self.origin.elapsed().as_millis();
        self.last
            .store(u64::try_from(since).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// How long since the last beat, at `now`.
    pub fn silent_for(&self, now: Instant) -> Duration {
        let last = self.origin + Duration::from_millis(self.last.load(Ordering::Relaxed));
        now.saturating_duration_since(last)
    }

    /// The verdict now.
    pub fn liveness(&self) -> Liveness {
        judge(self.silent_for(Instant::now()))
    }

    /// The beat: a task on the current runtime, until `stop`.
    pub fn spawn_beat(self: &Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let heartbeat = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(BEAT);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => return,
                    _ = ticks.tick() => heartbeat.beat(),
                }
            }
        })
    }
}

/// Whether the runtime makes progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Live,
    /// The beat has been silent this long.
    Stalled {
        silent_for: Duration,
    },
}

impl Liveness {
    /// The sentence `/health/live` and the log give for a stalled runtime.
    pub fn sentence(&self) -> Option<String> {
        match self {
            Liveness::Live => None,
            Liveness::Stalled { silent_for } => Some(format!(
                "the runtime has run none of its tasks for {} s (a worker stuck in a call that never yields?); restart the host",
                silent_for.as_secs()
            )),
        }
    }
}

/// The verdict for a beat silent for `silent_for`.
pub fn judge(silent_for: Duration) -> Liveness {
    if silent_for >= STALLED_AFTER {
        Liveness::Stalled { silent_for }
    } else {
        Liveness::Live
    }
}

/// The thread that watches the heartbeat: it logs when the runtime stalls
/// and when it runs again, and feeds the service manager's watchdog
/// (`WATCHDOG=1` every `feed_every`) only while the runtime is live. It
/// stops when dropped.
pub struct Watchdog {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    pub fn spawn(
        heartbeat: Arc<Heartbeat>,
        notifier: Arc<Notifier>,
        feed_every: Option<Duration>,
    ) -> std::io::Result<Self> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("acemq-liveness".into())
            .spawn(move || watch(&heartbeat, &notifier, feed_every, &stopped))?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn watch(
    heartbeat: &Heartbeat,
    notifier: &Notifier,
    feed_every: Option<Duration>,
    stopped: &mpsc::Receiver<()>,
) {
    let look_every = feed_every.map_or(LOOK_EVERY, |every| every.min(LOOK_EVERY));
    let mut last_fed: Option<Instant> = None;
    let mut stalled = false;
    // A disconnected channel is the stop; a timeout, the next look.
    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(look_every) {
        let verdict = heartbeat.liveness();
        match (verdict.sentence(), stalled) {
            (Some(sentence), false) => {
                tracing::error!("{sentence}");
                notifier.status(&sentence);
                stalled = true;
            }
            (None, true) => {
                tracing::warn!("the runtime runs its tasks again");
                stalled = false;
            }
            _ => {}
        }
        if let (Some(every), false) = (feed_every, stalled)
            && last_fed.is_none_or(|fed| fed.elapsed() >= every)
        {
            notifier.watchdog();
            last_fed = Some(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_beat_silent_past_the_limit_is_a_stall_named_with_its_length() {
        assert_eq!(judge(Duration::from_millis(900)), Liveness::Live);
        assert_eq!(
            judge(STALLED_AFTER - Duration::from_millis(1)),
            Liveness::Live
        );
        let stalled = judge(Duration::from_secs(12));
        assert_eq!(
            stalled,
            Liveness::Stalled {
                silent_for: Duration::from_secs(12)
            }
        );
        let sentence = stalled.sentence().unwrap();
        assert!(sentence.contains("for 12 s"), "{sentence}");
        assert_eq!(Liveness::Live.sentence(), None);
    }

    #[test]
    fn silence_is_measured_from_the_last_beat() {
        let heartbeat = Heartbeat::default();
        std::thread::sleep(Duration::from_millis(30));
        heartbeat.beat();
        let now = Instant::now();
        assert!(heartbeat.silent_for(now) < Duration::from_millis(20));
        assert!(heartbeat.silent_for(now + Duration::from_secs(11)) >= Duration::from_secs(11));
    }

    /// A runtime whose every worker is stuck stops the beat: the stall is
    /// seen within the limit plus a look.
    #[test]
    fn a_runtime_whose_workers_are_all_stuck_is_seen_stalled() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let heartbeat = Heartbeat::new();
        let stop = CancellationToken::new();
        runtime.block_on(async {
            heartbeat.spawn_beat(stop.clone());
            tokio::time::sleep(Duration::from_millis(50)).await;
        });
        assert_eq!(heartbeat.liveness(), Liveness::Live);
        // Both workers blocked (never yielding), as a stuck call would.
        let release = Arc::new(std::sync::Barrier::new(3));
        for _ in 0..2 {
            let release = release.clone();
            runtime.spawn(async move {
                release.wait();
            });
        }
        let silent = |h: &Heartbeat| h.silent_for(Instant::now());
        let started = Instant::now();
        while silent(&heartbeat) < Duration::from_millis(2500) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the beat went on with every worker blocked"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        release.wait();
        // Released: the runtime beats again.
        let started = Instant::now();
        while silent(&heartbeat) > Duration::from_millis(1500) {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "no beat after the release"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.cancel();
    }
}
