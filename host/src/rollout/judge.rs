//! Whether a canary's step passed: its calls over the step against the
//! current version's calls since the rollout began, on the thresholds of
//! its [`Thresholds`]. Pure, so every verdict and its sentence is a unit
//! test.
//!
//! A step is judged once the candidate has made `messages_per_step` calls;
//! a fault or set-aside count that can no longer pass, whatever its
//! remaining calls do, fails it at once (a candidate failing on 5 % of its
//! messages is rolled back after its first few failures, not after 500).

use super::plan::{Share, Thresholds};
use crate::telemetry::histogram::Histogram;

/// One version's calls over a window.
#[derive(Debug, Clone, Default)]
pub struct Window {
    pub calls: u64,
    /// Traps, deadlines, memory: the call did not decide.
    pub faults: u64,
    /// Decided to reject or park the message.
    pub set_aside: u64,
    /// Outputs its accepted calls published.
    pub outputs: u64,
    /// Call times, in microseconds.
    pub micros: Histogram,
}

/// What one call came to, for its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    pub faulted: bool,
    pub set_aside: bool,
    pub outputs: u64,
    pub micros: u64,
}

impl Window {
    pub fn record(&mut self, call: Call) {
        self.calls += 1;
        self.faults += u64::from(call.faulted);
        self.set_aside += u64::from(call.set_aside);
        self.outputs += call.outputs;
        self.micros.record(call.micros);
    }

    fn rate(count: u64, calls: u64) -> f64 {
        if calls == 0 {
            0.0
        } else {
            count as f64 / calls as f64
        }
    }

    pub fn fault_rate(&self) -> f64 {
        Self::rate(self.faults, self.calls)
    }

    pub fn set_aside_rate(&self) -> f64 {
        Self::rate(self.set_aside, self.calls)
    }

    pub fn outputs_per_call(&self) -> f64 {
        Self::rate(self.outputs, self.calls)
    }

    /// The 99th-percentile call time in microseconds.
    pub fn p99(&self) -> Option<u64> {
        self.micros.quantile(0.99)
    }
}

/// A step's verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Not enough calls yet.
    Undecided,
    Passed,
    /// Worse beyond a threshold: why, in one sentence with the figures.
    Failed(String),
}

/// The current version's calls below which its call times are not
/// compared: too few to have a 99th percentile.
pub const MIN_CALLS_FOR_TIMES: u64 = 20;

/// The verdict on a step at `share` whose window is `candidate`, against
/// the current version's `current`, when a step is `messages_per_step`
/// calls of the candidate.
pub fn judge(
    share: Share,
    current: &Window,
    candidate: &Window,
    messages_per_step: u64,
    thresholds: &Thresholds,
) -> Verdict {
    let rates = [
        (
            "faulted on",
            candidate.faults,
            current.faults,
            thresholds.max_fault_rate_increase,
        ),
        (
            "rejected or parked",
            candidate.set_aside,
            current.set_aside,
            thresholds.max_set_aside_rate_increase,
        ),
    ];
    for (what, count, current_count, allowed) in rates {
        let current_rate = Window::rate(current_count, current.calls);
        // The most it may reach over the whole step and still pass.
        let ceiling = ((current_rate + allowed) * messages_per_step as f64).floor() as u64;
        let over_already = count > ceiling;
        let at_end = candidate.calls >= messages_per_step;
        let rate = Window::rate(count, candidate.calls);
        if over_already || (at_end && rate - current_rate > allowed + f64::EPSILON) {
            return Verdict::Failed(format!(
                "at {share} the candidate {what} {count} of its {} calls ({}) against {current_count} of {} ({}) for the current version: more than the {} increase allowed",
                candidate.calls,
                percent(rate),
                current.calls,
                percent(current_rate),
                percent(allowed),
            ));
        }
    }
    if candidate.calls < messages_per_step {
        return Verdict::Undecided;
    }
    if let (Some(theirs), Some(ours), true) = (
        candidate.p99(),
        current.p99(),
        current.calls >= MIN_CALLS_FOR_TIMES,
    ) {
        let ratio = theirs as f64 / ours.max(1) as f64;
        if ratio > thresholds.max_call_time_ratio {
            return Verdict::Failed(format!(
                "at {share} the candidate's calls took {} at the 99th percentile against {} for the current version: {ratio:.1} times, more than the {} allowed",
                millis(theirs),
                millis(ours),
                thresholds.max_call_time_ratio,
            ));
        }
    }
    Verdict::Passed
}

fn percent(rate: f64) -> String {
    format!("{:.1}%", rate * 100.0)
}

fn millis(micros: u64) -> String {
    format!("{:.1} ms", micros as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(calls: u64, faults: u64, set_aside: u64, micros: u64) -> Window {
        let mut w = Window::default();
        for i in 0..calls {
            w.record(Call {
                faulted: i < faults,
                set_aside: i >= faults && i < faults + set_aside,
                outputs: 1,
                micros,
            });
        }
        w
    }

    fn share() -> Share {
        Share::parse("10%").unwrap()
    }

    #[test]
    fn a_step_passes_once_its_calls_are_made_within_every_threshold() {
        let t = Thresholds::default();
        let current = window(2000, 4, 20, 1000);
        assert_eq!(
            judge(share(), &current, &window(499, 1, 5, 1200), 500, &t),
            Verdict::Undecided
        );
        assert_eq!(
            judge(share(), &current, &window(500, 1, 5, 1200), 500, &t),
            Verdict::Passed
        );
    }

    #[test]
    fn a_candidate_failing_on_five_percent_is_failed_as_soon_as_it_cannot_pass() {
        let t = Thresholds::default();
        let current = window(1000, 0, 0, 1000);
        // 1% allowed over 500 calls: 5 faults at most; the 6th fails it,
        // long before 500 calls.
        assert_eq!(
            judge(share(), &current, &window(100, 5, 0, 1000), 500, &t),
            Verdict::Undecided
        );
        let Verdict::Failed(why) = judge(share(), &current, &window(120, 6, 0, 1000), 500, &t)
        else {
            panic!("six faults cannot pass")
        };
        assert_eq!(
            why,
            "at 10% the candidate faulted on 6 of its 120 calls (5.0%) against 0 of 1000 (0.0%) for the current version: more than the 1.0% increase allowed"
        );
    }

    #[test]
    fn rejects_and_parks_and_slowness_fail_a_step_with_their_figures() {
        let t = Thresholds::default();
        let current = window(1000, 0, 10, 1000);
        let Verdict::Failed(why) = judge(share(), &current, &window(500, 0, 60, 1000), 500, &t)
        else {
            panic!("12% set aside against 1%")
        };
        assert!(
            why.contains("rejected or parked 60 of its 500 calls (12.0%)"),
            "{why}"
        );
        let Verdict::Failed(why) = judge(share(), &current, &window(500, 0, 5, 4000), 500, &t)
        else {
            panic!("four times slower")
        };
        assert!(why.contains("4.0 times, more than the 3 allowed"), "{why}");
        // The current version's faults are its baseline, not the candidate's fault.
        let flaky = window(1000, 30, 0, 1000);
        assert_eq!(
            judge(share(), &flaky, &window(500, 18, 0, 1000), 500, &t),
            Verdict::Passed
        );
    }
}
