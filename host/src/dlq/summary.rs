//! What a `replay` or `purge` did, counted, and the table it ends with.

use std::fmt::Write as _;

/// Failures named under the table; the rest are only counted.
const FAILURES_SHOWN: usize = 5;

/// Which command the counts belong to, for the table's wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Replay,
    Purge,
}

/// The counts of one pass over a set-aside queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub action: Action,
    /// Nothing was changed: the counts say what would have been.
    pub dry_run: bool,
    /// The set-aside queue read.
    pub queue: String,
    /// Where replayed messages go.
    pub to: String,
    /// Messages looked at.
    pub examined: usize,
    /// Moved back (replay) or removed (purge); with `dry_run`, would be.
    pub done: usize,
    /// Left in place because a `--filter` did not match them.
    pub skipped: usize,
    /// Not moved, and left in place: the publish was refused or returned.
    pub failed: usize,
    /// Why, for the first [`FAILURES_SHOWN`] failures.
    pub failures: Vec<String>,
    /// Why the pass ended before it went through the queue, if it did.
    pub stopped: Option<String>,
}

impl Summary {
    #[must_use]
    pub fn new(action: Action, dry_run: bool, queue: &str, to: &str) -> Self {
        Self {
            action,
            dry_run,
            queue: queue.to_owned(),
            to: to.to_owned(),
            examined: 0,
            done: 0,
            skipped: 0,
            failed: 0,
            failures: Vec::new(),
            stopped: None,
        }
    }

    /// Counts a failure, keeping its reason while there are few.
    pub fn fail(&mut self, reason: String) {
        self.failed += 1;
        if self.failures.len() < FAILURES_SHOWN {
            self.failures.push(reason);
        }
    }

    /// Whether the command succeeded: nothing failed and the pass was not
    /// cut short by the broker.
    #[must_use]
    pub fn succeeded(&self) -> bool {
        self.failed == 0 && self.stopped.is_none()
    }

    /// The counts so far on one line, for progress.
    #[must_use]
    pub fn progress_line(&self) -> String {
        format!(
            "{} {}, skipped by filter {}, failed {}",
            self.done_word(),
            self.done,
            self.skipped,
            self.failed
        )
    }

    fn done_word(&self) -> &'static str {
        match (self.action, self.dry_run) {
            (Action::Replay, false) => "moved",
            (Action::Replay, true) => "would move",
            (Action::Purge, false) => "purged",
            (Action::Purge, true) => "would purge",
        }
    }

    /// The table printed at the end: a title, the three counts, and what
    /// failed or stopped the pass.
    #[must_use]
    pub fn table(&self) -> String {
        let mut out = match self.action {
            Action::Replay => format!("replay {} -> {}", self.queue, self.to),
            Action::Purge => format!("purge {}", self.queue),
        };
        if self.dry_run {
            out.push_str(" (dry run: nothing changed)");
        }
        out.push('\n');
        let rows = [
            (self.done_word(), self.done),
            ("skipped by filter", self.skipped),
            ("failed", self.failed),
        ];
        for (label, count) in rows {
            writeln!(out, "  {label:<18}{count:>8}").expect("writing to a String");
        }
        for failure in &self.failures {
            writeln!(out, "  failed: {failure}").expect("writing to a String");
        }
        if self.failed > self.failures.len() {
            writeln!(
                out,
                "  ... and {} more failures",
                self.failed - self.failures.len()
            )
            .expect("writing to a String");
        }
        if let Some(reason) = &self.stopped {
            writeln!(out, "  stopped early: {reason}").expect("writing to a String");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_counts_moved_skipped_and_failed() {
        let mut summary = Summary::new(Action::Replay, false, "q.dlq", "q");
        summary.done = 1200;
        summary.skipped = 3;
        assert!(summary.succeeded());
        assert_eq!(
            summary.table(),
            "replay q.dlq -> q\n  moved                 1200\n  skipped by filter        3\n  failed                   0\n"
        );
        for i in 0..7 {
            summary.fail(format!("returned {i}"));
        }
        assert!(!summary.succeeded());
        let table = summary.table();
        assert!(table.contains("  failed                   7\n"), "{table}");
        assert!(table.contains("  failed: returned 4\n"), "{table}");
        assert!(!table.contains("returned 5"), "{table}");
        assert!(table.contains("... and 2 more failures"), "{table}");
        assert_eq!(
            summary.progress_line(),
            "moved 1200, skipped by filter 3, failed 7"
        );
    }

    #[test]
    fn dry_runs_and_purges_say_so() {
        let summary = Summary::new(Action::Replay, true, "q.parked", "q");
        let table = summary.table();
        assert!(table.starts_with("replay q.parked -> q (dry run: nothing changed)\n"));
        assert!(table.contains("  would move "));
        let mut summary = Summary::new(Action::Purge, false, "q.dlq", "q");
        assert!(summary.table().starts_with("purge q.dlq\n  purged "));
        summary.stopped = Some("the connection was lost".into());
        assert!(!summary.succeeded());
        assert!(
            summary
                .table()
                .contains("stopped early: the connection was lost")
        );
        summary.dry_run = true;
        assert!(summary.table().contains("  would purge "));
    }
}
