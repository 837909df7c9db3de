//! Progress of a `replay` or `purge` on stderr: a bar on a terminal, and a
//! plain line every [`LINE_EVERY`] messages otherwise, so a log or a CI job
//! keeps a readable record instead of a bar's control codes.

use std::io::IsTerminal as _;

use super::summary::Summary;

/// Messages examined between two plain progress lines.
const LINE_EVERY: usize = 1000;

pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: usize,
}

impl Progress {
    /// Progress over at most `total` messages (the queue's count at start).
    pub fn new(total: usize) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} examined, {per_sec}, {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
        Self { bar, total }
    }

    /// After each message examined.
    pub fn update(&self, summary: &Summary) {
        match &self.bar {
            Some(bar) => {
                bar.set_position(summary.examined as u64);
                bar.set_message(summary.progress_line());
            }
            None if summary.examined.is_multiple_of(LINE_EVERY) => self.line(summary),
            None => {}
        }
    }

    /// At the end, whatever the outcome: the bar is cleared (the summary
    /// table follows on stdout); without one, a last line unless the last
    /// update just wrote it.
    pub fn finish(&self, summary: &Summary) {
        match &self.bar {
            Some(bar) => bar.finish_and_clear(),
            None if summary.examined == 0 || !summary.examined.is_multiple_of(LINE_EVERY) => {
                self.line(summary)
            }
            None => {}
        }
    }

    fn line(&self, summary: &Summary) {
        eprintln!(
            "{}: {} of {} examined ({})",
            summary.queue,
            summary.examined,
            self.total,
            summary.progress_line()
        );
    }
}
