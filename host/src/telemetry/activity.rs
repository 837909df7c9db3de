//! What the status page shows that the Prometheus registry cannot answer
//! without a Prometheus: each consumer's recent rates per outcome, and the
//! latest reasons it set messages aside for.
//!
//! A consumer counts each settled delivery here too (one relaxed atomic
//! add); a task samples the counts every [`SAMPLE_EVERY`] and keeps
//! [`HISTORY`] of samples; a rate is the difference between the counts now
//! and those of the sample a window ago, over the time between them
//! ([`rates`], pure). Everything is bounded: samples by age, set-aside notes
//! by number ([`KEPT_SET_ASIDES`]) and length ([`REASON_CHARS`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// How often the counts are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// How far back samples are kept: the longest window shown, and a sample.
pub const HISTORY: Duration = Duration::from_secs(5 * 60 + 5);
/// The windows the status page shows rates over.
pub const WINDOWS: [Duration; 2] = [Duration::from_secs(60), Duration::from_secs(5 * 60)];
/// Set-aside notes kept per consumer, newest first.
pub const KEPT_SET_ASIDES: usize = 5;
/// Longest reason kept in a note, in characters.
pub const REASON_CHARS: usize = 300;

/// Every consumer's activity.
#[derive(Debug, Default)]
pub struct Activity {
    queues: Mutex<BTreeMap<String, Arc<QueueActivity>>>,
}

/// One consumer's activity: what its deliveries were settled as.
#[derive(Debug)]
pub struct QueueActivity {
    /// The outcome words, in the order of `settled`.
    outcomes: &'static [&'static str],
    settled: Box<[AtomicU64]>,
    history: Mutex<VecDeque<Sample>>,
    set_asides: Mutex<VecDeque<SetAsideNote>>,
}

/// The counts at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub at: Instant,
    pub counts: Vec<u64>,
}

/// A message set aside: when, as what, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAsideNote {
    pub at: SystemTime,
    /// The outcome word (`dead_lettered`, `rejected`, `parked`).
    pub outcome: &'static str,
    pub reason: String,
    pub message_id: String,
}

/// A consumer's activity as the status page shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueReport {
    pub queue: String,
    /// Each outcome's total since the host started.
    pub totals: Vec<(&'static str, u64)>,
    /// Per window of [`WINDOWS`]; `None` before the first sample.
    pub rates: Vec<Option<WindowRates>>,
    /// Newest first.
    pub set_asides: Vec<SetAsideNote>,
}

/// The rates over one window: the span they were measured over (shorter
/// while the host is young), and each outcome's rate per second.
pub type WindowRates = (Duration, Vec<(&'static str, f64)>);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Activity {
    /// The activity of consumer `queue`, whose deliveries settle as one of
    /// `outcomes` (created on first use, with a first sample of nothing
    /// counted: what it counts from then on shows in its rates at once).
    pub fn queue(&self, queue: &str, outcomes: &'static [&'static str]) -> Arc<QueueActivity> {
        lock(&self.queues)
            .entry(queue.to_string())
            .or_insert_with(|| {
                let first = Sample {
                    at: Instant::now(),
                    counts: vec![0; outcomes.len()],
                };
                Arc::new(QueueActivity {
                    outcomes,
                    settled: outcomes.iter().map(|_| AtomicU64::new(0)).collect(),
                    history: Mutex::new(VecDeque::from([first])),
                    set_asides: Mutex::new(VecDeque::new()),
                })
            })
            .clone()
    }

    /// Takes a sample of every consumer's counts at `now`, and forgets
    /// those older than [`HISTORY`].
    pub fn sample(&self, now: Instant) {
        for queue in lock(&self.queues).values() {
            let mut history = lock(&queue.history);
            history.push_back(Sample {
                at: now,
                counts: queue.counts(),
            });
            while history
                .front()
                .is_some_and(|s| now.saturating_duration_since(s.at) > HISTORY)
            {
                history.pop_front();
            }
        }
    }

    /// Every consumer's report at `now`, by queue name.
    pub fn report(&self, now: Instant) -> Vec<QueueReport> {
        lock(&self.queues)
            .iter()
            .map(|(name, queue)| queue.report(name, now))
            .collect()
    }
}

impl QueueActivity {
    /// Counts one delivery settled as the outcome at `index` of its words.
    pub fn settled(&self, index: usize) {
        if let Some(count) = self.settled.get(index) {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Notes a message set aside as `outcome` for `reason`.
    pub fn set_aside(&self, outcome: &'static str, reason: &str, message_id: &str) {
        let mut notes = lock(&self.set_asides);
        notes.push_front(SetAsideNote {
            at: SystemTime::now(),
            outcome,
            reason: bounded(reason),
            message_id: bounded(message_id),
        });
        notes.truncate(KEPT_SET_ASIDES);
    }

    fn counts(&self) -> Vec<u64> {
        self.settled
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    fn report(&self, queue: &str, now: Instant) -> QueueReport {
        let counts = self.counts();
        let history: Vec<Sample> = lock(&self.history).iter().cloned().collect();
        let latest = Sample {
            at: now,
            counts: counts.clone(),
        };
        QueueReport {
            queue: queue.to_string(),
            totals: self.outcomes.iter().copied().zip(counts).collect(),
            rates: WINDOWS
                .iter()
                .map(|window| {
                    rates(&history, &latest, *window).map(|(span, per_second)| {
                        (
                            span,
                            self.outcomes.iter().copied().zip(per_second).collect(),
                        )
                    })
                })
                .collect(),
            set_asides: lock(&self.set_asides).iter().cloned().collect(),
        }
    }
}

/// Each count's rate per second from the sample nearest to `window` before
/// `latest` (the oldest one, while the history is shorter) to `latest`,
/// with the span it was measured over; `None` without an older sample.
pub fn rates(
    history: &[Sample],
    latest: &Sample,
    window: Duration,
) -> Option<(Duration, Vec<f64>)> {
    let since = latest.at.checked_sub(window);
    let from = history
        .iter()
        .filter(|s| s.at < latest.at)
        .find(|s| since.is_none_or(|since| s.at >= since))?;
    let span = latest.at.duration_since(from.at);
    let seconds = span.as_secs_f64();
    let per_second = latest
        .counts
        .iter()
        .zip(&from.counts)
        .map(|(now, then)| now.saturating_sub(*then) as f64 / seconds)
        .collect();
    Some((span, per_second))
}

/// `text` cut to [`REASON_CHARS`] characters, marked when cut.
fn bounded(text: &str) -> String {
    match text.char_indices().nth(REASON_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORDS: [&str; 2] = ["acked", "parked"];

    fn sample(at: Instant, counts: &[u64]) -> Sample {
        Sample {
            at,
            counts: counts.to_vec(),
        }
    }

    #[test]
    fn a_rate_is_the_change_since_the_sample_a_window_ago() {
        let t0 = Instant::now();
        let s = |secs: u64, counts: &[u64]| sample(t0 + Duration::from_secs(secs), counts);
        let history = [
            s(0, &[0, 0]),
            s(30, &[300, 1]),
            s(60, &[900, 1]),
            s(90, &[1200, 4]),
        ];
        let latest = s(120, &[1500, 4]);
        // A minute: from the sample at 60 s.
        let (span, per_second) = rates(&history, &latest, Duration::from_secs(60)).unwrap();
        assert_eq!(span, Duration::from_secs(60));
        assert_eq!(per_second, [10.0, 0.05]);
        // Five minutes, with two of history: from the oldest.
        let (span, per_second) = rates(&history, &latest, Duration::from_secs(300)).unwrap();
        assert_eq!(span, Duration::from_secs(120));
        assert_eq!(per_second, [12.5, 4.0 / 120.0]);
        assert_eq!(rates(&[], &latest, Duration::from_secs(60)), None);
    }

    #[test]
    fn samples_older_than_the_history_are_forgotten_and_notes_are_bounded() {
        let activity = Activity::default();
        let queue = activity.queue("q", &WORDS);
        let t0 = Instant::now();
        for step in 0..100u64 {
            queue.settled(0);
            activity.sample(t0 + SAMPLE_EVERY * u32::try_from(step).unwrap());
        }
        let kept = lock(&queue.history).len();
        let most = usize::try_from(HISTORY.as_secs() / SAMPLE_EVERY.as_secs()).unwrap() + 1;
        assert!(kept <= most, "{kept} samples kept");
        for i in 0..(KEPT_SET_ASIDES + 3) {
            queue.set_aside("parked", &format!("reason {i} {}", "x".repeat(500)), "id");
        }
        let now = t0 + SAMPLE_EVERY * 100;
        let [report] = &activity.report(now)[..] else {
            panic!("one queue")
        };
        assert_eq!(report.totals, [("acked", 100), ("parked", 0)]);
        assert_eq!(report.set_asides.len(), KEPT_SET_ASIDES);
        let newest = &report.set_asides[0];
        assert!(
            newest
                .reason
                .starts_with(&format!("reason {} ", KEPT_SET_ASIDES + 2))
        );
        assert_eq!(newest.reason.chars().count(), REASON_CHARS + 1);
        let (span, rates) = report.rates[0].clone().unwrap();
        assert_eq!(span, Duration::from_secs(60));
        // The sample a minute back (88th) had counted 89 of the 100.
        assert_eq!(rates[0], ("acked", 11.0 / 60.0));
    }

    #[test]
    fn what_was_counted_before_the_first_sample_shows_in_the_rates() {
        let activity = Activity::default();
        let queue = activity.queue("q", &WORDS);
        queue.settled(1);
        std::thread::sleep(Duration::from_millis(20));
        activity.sample(Instant::now());
        let report = &activity.report(Instant::now())[0];
        let (_, rates) = report.rates[0].clone().unwrap();
        assert!(rates[1].1 > 0.0, "{rates:?}");
    }

    #[test]
    fn one_consumer_is_one_activity_whoever_asks() {
        let activity = Activity::default();
        let a = activity.queue("q", &WORDS);
        let b = activity.queue("q", &WORDS);
        a.settled(1);
        b.settled(1);
        assert_eq!(activity.report(Instant::now())[0].totals[1], ("parked", 2));
    }
}
