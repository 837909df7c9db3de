//! Whether a plugin version's recent calls mostly fail: what turns its
//! consumer `DEGRADED` on `/health` (a plugin that traps on every message
//! dead-letters the whole queue while the host's connections look fine).
//!
//! Each [`HandlerVersion`](super::handler::HandlerVersion) keeps its own
//! window, so a hot swap to a good version starts from a clean one: the
//! consumer is `UP` again as soon as the swap is in, before any message
//! has proved it. Only faults count (traps, panics, deadlines, memory):
//! a handler that rejects or retries a message has decided, not failed.

use std::sync::Mutex;

/// How many of a version's latest calls are weighed.
pub const WINDOW: usize = 20;
/// Fewer calls than this are too few to judge by.
pub const MIN_CALLS: usize = 5;
/// The most of a fault's reason quoted in the verdict.
const MAX_REASON_CHARS: usize = 300;

/// The latest calls of one plugin version, faulted or not.
#[derive(Debug, Default)]
pub struct FaultWindow(Mutex<Calls>);

#[derive(Debug, Default)]
struct Calls {
    /// Bit `i` set: the `i`-th latest call faulted (bit 0 the newest).
    faults: u32,
    /// Calls seen, up to [`WINDOW`].
    seen: usize,
    /// The newest fault's reason.
    last_reason: Option<String>,
}

/// A version whose recent calls mostly faulted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Faulting {
    pub faulted: usize,
    pub of: usize,
    pub last_reason: String,
}

impl Faulting {
    /// The `/health` sentence for the consumer of `queue`.
    pub fn sentence(&self, queue: &str) -> String {
        format!(
            "the plugin of consumer {queue} fails most calls: {} of its last {} calls faulted (last: {})",
            self.faulted, self.of, self.last_reason
        )
    }
}

impl FaultWindow {
    /// Counts one call: `fault` is its reason when it faulted.
    pub fn record(&self, fault: Option<&str>) {
        let mut calls = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mask = (1u32 << WINDOW) - 1;
        calls.faults = ((calls.faults << 1) | u32::from(fault.is_some())) & mask;
        calls.seen = (calls.seen + 1).min(WINDOW);
        if let Some(reason) = fault {
            calls.last_reason = Some(bounded(reason));
        }
    }

    /// `Some` while more than half of at least [`MIN_CALLS`] recent calls
    /// faulted.
    pub fn faulting(&self) -> Option<Faulting> {
        let calls = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let faulted = calls.faults.count_ones() as usize;
        (calls.seen >= MIN_CALLS && faulted * 2 > calls.seen).then(|| Faulting {
            faulted,
            of: calls.seen,
            last_reason: calls.last_reason.clone().unwrap_or_default(),
        })
    }
}

fn bounded(reason: &str) -> String {
    let line = reason.lines().next().unwrap_or_default();
    if line.chars().count() <= MAX_REASON_CHARS {
        return line.to_string();
    }
    let cut: String = line.chars().take(MAX_REASON_CHARS).collect();
    format!("{cut}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calls(window: &FaultWindow, pattern: &str) {
        for c in pattern.chars() {
            window.record((c == 'F').then_some("trap: unreachable"));
        }
    }

    #[test]
    fn too_few_calls_are_not_judged() {
        let window = FaultWindow::default();
        calls(&window, "FFFF");
        assert_eq!(window.faulting(), None);
        calls(&window, "F");
        assert_eq!(
            window.faulting(),
            Some(Faulting {
                faulted: 5,
                of: 5,
                last_reason: "trap: unreachable".into()
            })
        );
    }

    #[test]
    fn half_or_fewer_faults_is_not_faulting() {
        let window = FaultWindow::default();
        calls(&window, "FOFOFOFOFO");
        assert_eq!(window.faulting(), None);
        calls(&window, "F");
        assert_eq!(window.faulting().map(|f| (f.faulted, f.of)), Some((6, 11)));
    }

    #[test]
    fn only_the_latest_calls_count() {
        let window = FaultWindow::default();
        calls(&window, &"F".repeat(100));
        assert_eq!(window.faulting().map(|f| f.of), Some(WINDOW));
        // Eleven good calls push eleven faults out of the twenty.
        calls(&window, &"O".repeat(11));
        assert_eq!(window.faulting(), None);
    }

    #[test]
    fn the_sentence_names_the_consumer_the_share_and_the_last_reason_bounded() {
        let window = FaultWindow::default();
        calls(&window, "FFFFF");
        window.record(Some(&format!("{}\nsecond line", "x".repeat(1000))));
        let faulting = window.faulting().unwrap();
        let sentence = faulting.sentence("orders");
        assert!(
            sentence.starts_with(
                "the plugin of consumer orders fails most calls: 6 of its last 6 calls faulted (last: xxx"
            ),
            "{sentence}"
        );
        assert!(sentence.ends_with("x…)"), "{sentence}");
        assert!(!sentence.contains("second line"));
    }
}
