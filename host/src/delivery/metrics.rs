//! One consumer's metric handles, built once for its queue.
//!
//! The registry's families are keyed by label sets (owned strings); looking
//! one up per delivery would build and hash them on the hot path. A
//! consumer's labels never change, so its handles are resolved once: the
//! in-flight gauge when the consumer is built, each other series on first
//! use (so a series appears in `/metrics` when it first counts something,
//! as before).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use super::decide::ConsumeOutcome;
use super::settle::{Report, RetryPlace};
use crate::plugin::FaultKind;
use crate::telemetry::activity::QueueActivity;
use crate::telemetry::{
    Metrics, Place, PluginFaultLabels, PluginVersionLabels, QueueLabel, QueueOutcome, QueueRung,
    QueueTarget, QueueWhere,
};

/// A consumer's handles into the host's [`Metrics`].
pub struct ConsumerMetrics {
    queue: String,
    metrics: std::sync::Arc<Metrics>,
    in_flight: Gauge,
    consumed: [OnceLock<Settled>; ConsumeOutcome::ALL.len()],
    attempts: OnceLock<Histogram>,
    retried: [OnceLock<Counter>; RetryPlace::ALL.len()],
    set_aside: SetAsideSeries,
    fuel: OnceLock<Counter>,
    scheduled: OnceLock<Counter>,
    /// The series of the plugin version that made the last call: a swap
    /// changes it once, every other call finds it here.
    calls: Mutex<Option<VersionSeries>>,
    /// What the status page shows of this consumer.
    activity: Arc<QueueActivity>,
}

/// Where `outcome` is in [`ConsumeOutcome::ALL`] (and its words).
fn outcome_index(outcome: ConsumeOutcome) -> usize {
    ConsumeOutcome::ALL
        .iter()
        .position(|o| *o == outcome)
        .expect("every outcome is in ALL")
}

/// `acemq.messages.dead.lettered.total`'s series, one per place a copy
/// is set aside in.
#[derive(Default)]
struct SetAsideSeries {
    dead_lettered: OnceLock<Counter>,
    parked: OnceLock<Counter>,
}

impl SetAsideSeries {
    /// The series of a delivery set aside with `outcome`, and its outcome
    /// word. A rejected message goes to `.dlq` like an exhausted one.
    fn of(&self, outcome: ConsumeOutcome) -> (&OnceLock<Counter>, &'static str) {
        match outcome {
            ConsumeOutcome::Parked => (&self.parked, "parked"),
            _ => (&self.dead_lettered, "dead_lettered"),
        }
    }
}

/// One outcome's series of `acemq.consume.*`.
struct Settled {
    total: Counter,
    duration: Histogram,
}

/// One plugin version's call series.
#[derive(Clone)]
struct VersionSeries {
    version: Arc<str>,
    duration: Histogram,
    fuel: Histogram,
}

impl ConsumerMetrics {
    pub fn new(metrics: std::sync::Arc<Metrics>, queue: &str) -> Self {
        let in_flight = metrics
            .in_flight
            .get_or_create(&QueueLabel {
                queue: queue.to_string(),
            })
            .clone();
        let activity = metrics.activity.queue(queue, &ConsumeOutcome::WORDS);
        Self {
            queue: queue.to_string(),
            metrics,
            activity,
            in_flight,
            consumed: Default::default(),
            attempts: OnceLock::new(),
            retried: Default::default(),
            set_aside: Default::default(),
            fuel: OnceLock::new(),
            scheduled: OnceLock::new(),
            calls: Mutex::new(None),
        }
    }

    /// Counts a delivery as in flight until the guard is dropped.
    pub fn in_flight(&self) -> InFlight<'_> {
        self.in_flight.inc();
        InFlight(&self.in_flight)
    }

    /// Counts one settled delivery: everything its report says, once; it
    /// arrived with `attempt` and was settled `took` after it arrived.
    pub fn count(&self, report: &Report, attempt: u32, took: Duration) {
        self.activity.settled(outcome_index(report.outcome));
        let settled = self.consumed(report.outcome);
        settled.total.inc();
        settled.duration.observe(took.as_secs_f64());
        self.attempts
            .get_or_init(|| {
                self.metrics
                    .consume_attempts
                    .get_or_create(&self.label())
                    .clone()
            })
            .observe(f64::from(attempt));
        if let Some(place) = report.retried {
            self.retried(place).inc();
        }
        if report.set_aside {
            let (series, word) = self.set_aside.of(report.outcome);
            series
                .get_or_init(|| {
                    self.metrics
                        .dead_lettered_total
                        .get_or_create(&QueueOutcome {
                            queue: self.queue.clone(),
                            outcome: word.to_string(),
                        })
                        .clone()
                })
                .inc();
        }
        // Rare, and labelled by more than the queue: looked up when they happen.
        if let Some(rung) = &report.rung_missing {
            self.metrics
                .rung_missing
                .get_or_create(&QueueRung {
                    queue: self.queue.clone(),
                    rung: rung.clone(),
                })
                .inc();
        }
        if let Some(target) = &report.set_aside_failed {
            self.metrics
                .set_aside_failed
                .get_or_create(&QueueTarget {
                    queue: self.queue.clone(),
                    target: target.clone(),
                })
                .inc();
        }
    }

    /// Counts a handler call that failed.
    pub fn fault(&self, kind: FaultKind) {
        self.metrics
            .plugin_faults
            .get_or_create(&PluginFaultLabels {
                queue: self.queue.clone(),
                fault: kind.label().to_string(),
            })
            .inc();
    }

    /// Counts `count` delayed outputs confirmed into the scheduler.
    pub fn scheduled(&self, count: usize) {
        if count == 0 {
            return;
        }
        self.scheduled
            .get_or_init(|| {
                self.metrics
                    .scheduler
                    .scheduled
                    .get_or_create(&self.label())
                    .clone()
            })
            .inc_by(count as u64);
    }

    /// Counts one handler call that `version` made, how long it took and
    /// the fuel it burned (when metering is on).
    pub fn plugin_call(&self, version: &Arc<str>, took: Duration, fuel: Option<u64>) {
        let series = self.version_series(version);
        series.duration.observe(took.as_secs_f64());
        if let Some(fuel) = fuel {
            series.fuel.observe(fuel as f64);
            self.fuel
                .get_or_init(|| {
                    self.metrics
                        .plugin_fuel
                        .get_or_create(&self.label())
                        .clone()
                })
                .inc_by(fuel);
        }
    }

    fn version_series(&self, version: &Arc<str>) -> VersionSeries {
        let mut last = self.calls.lock().expect("plugin call series poisoned");
        match &*last {
            Some(series) if series.version == *version => series.clone(),
            _ => {
                let labels = PluginVersionLabels {
                    queue: self.queue.clone(),
                    sha256: version.to_string(),
                };
                let series = VersionSeries {
                    version: version.clone(),
                    duration: self
                        .metrics
                        .plugin_call_duration
                        .get_or_create(&labels)
                        .clone(),
                    fuel: self.metrics.plugin_call_fuel.get_or_create(&labels).clone(),
                };
                *last = Some(series.clone());
                series
            }
        }
    }

    fn label(&self) -> QueueLabel {
        QueueLabel {
            queue: self.queue.clone(),
        }
    }

    /// Notes why a delivery was set aside, for the status page.
    pub fn note_set_aside(&self, outcome: ConsumeOutcome, reason: &str, message_id: &str) {
        self.activity
            .set_aside(outcome.as_str(), reason, message_id);
    }

    fn consumed(&self, outcome: ConsumeOutcome) -> &Settled {
        self.consumed[outcome_index(outcome)].get_or_init(|| {
            let labels = QueueOutcome {
                queue: self.queue.clone(),
                outcome: outcome.as_str().to_string(),
            };
            Settled {
                total: self.metrics.consume_total.get_or_create(&labels).clone(),
                duration: self.metrics.consume_duration.get_or_create(&labels).clone(),
            }
        })
    }

    fn retried(&self, place: RetryPlace) -> &Counter {
        let index = RetryPlace::ALL
            .iter()
            .position(|p| *p == place)
            .expect("every place is in ALL");
        self.retried[index].get_or_init(|| {
            self.metrics
                .retried_total
                .get_or_create(&QueueWhere {
                    queue: self.queue.clone(),
                    place: Place(place.as_str()),
                })
                .clone()
        })
    }
}

/// A delivery counted in `acemq.consume.in.flight` while this lives.
pub struct InFlight<'a>(&'a Gauge);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_counted_in_every_series_it_concerns() {
        let metrics = Arc::new(Metrics::new());
        let consumer = ConsumerMetrics::new(metrics.clone(), "orders.new");
        consumer.count(&Report::new(ConsumeOutcome::Acked), 1, MS);
        consumer.count(&Report::new(ConsumeOutcome::Acked), 1, MS);
        consumer.count(
            &Report {
                retried: Some(RetryPlace::Consumer),
                rung_missing: Some("orders.new.retry.40s".into()),
                ..Report::new(ConsumeOutcome::Retried)
            },
            2,
            MS,
        );
        consumer.count(
            &Report {
                set_aside: true,
                ..Report::new(ConsumeOutcome::Parked)
            },
            1,
            MS,
        );
        consumer.count(
            &Report {
                set_aside: true,
                ..Report::new(ConsumeOutcome::Rejected)
            },
            3,
            MS,
        );
        consumer.count(
            &Report {
                retried: Some(RetryPlace::Requeued),
                set_aside_failed: Some("orders.new.dlq".into()),
                ..Report::new(ConsumeOutcome::Retried)
            },
            12,
            MS,
        );
        assert_eq!(metrics.consumed_count("orders.new", "acked"), 2);
        assert_eq!(metrics.consumed_count("orders.new", "retried"), 2);
        let text = metrics.render();
        for line in [
            "acemq_messages_retried_total{queue=\"orders.new\",where=\"consumer\"} 1",
            "acemq_messages_retried_total{queue=\"orders.new\",where=\"requeued\"} 1",
            "acemq_retry_rung_missing_total{queue=\"orders.new\",rung=\"orders.new.retry.40s\"} 1",
            "acemq_messages_dead_lettered_total{queue=\"orders.new\",outcome=\"parked\"} 1",
            "acemq_messages_dead_lettered_total{queue=\"orders.new\",outcome=\"dead_lettered\"} 1",
            "acemq_messages_set_aside_failed_total{queue=\"orders.new\",target=\"orders.new.dlq\"} 1",
            "acemq_consume_duration_seconds_count{queue=\"orders.new\",outcome=\"acked\"} 2",
            "acemq_consume_duration_seconds_count{queue=\"orders.new\",outcome=\"retried\"} 2",
            // Attempts 1, 1, 2, 1, 3 and 12.
            "acemq_consume_attempts_count{queue=\"orders.new\"} 6",
            "acemq_consume_attempts_sum{queue=\"orders.new\"} 20.0",
            "acemq_consume_attempts_bucket{le=\"1.0\",queue=\"orders.new\"} 3",
            "acemq_consume_attempts_bucket{le=\"10.0\",queue=\"orders.new\"} 5",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn plugin_calls_are_counted_by_version_and_a_swap_starts_new_series() {
        let metrics = Arc::new(Metrics::new());
        let consumer = ConsumerMetrics::new(metrics.clone(), "orders.new");
        let (v1, v2): (Arc<str>, Arc<str>) = ("aaa".into(), "bbb".into());
        consumer.plugin_call(&v1, MS, Some(5_000));
        consumer.plugin_call(&v1, MS, Some(7_000));
        consumer.plugin_call(&v2, MS, None);
        let text = metrics.render();
        for line in [
            "acemq_plugin_call_duration_seconds_count{queue=\"orders.new\",sha256=\"aaa\"} 2",
            "acemq_plugin_call_duration_seconds_count{queue=\"orders.new\",sha256=\"bbb\"} 1",
            "acemq_plugin_call_fuel_count{queue=\"orders.new\",sha256=\"aaa\"} 2",
            "acemq_plugin_call_fuel_sum{queue=\"orders.new\",sha256=\"aaa\"} 12000.0",
            "acemq_plugin_call_fuel_count{queue=\"orders.new\",sha256=\"bbb\"} 0",
            "acemq_plugin_fuel_total{queue=\"orders.new\"} 12000",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn in_flight_counts_while_the_guard_lives() {
        let metrics = Arc::new(Metrics::new());
        let consumer = ConsumerMetrics::new(metrics.clone(), "orders.new");
        let gauge = "acemq_consume_in_flight{queue=\"orders.new\"}";
        let first = consumer.in_flight();
        let second = consumer.in_flight();
        assert!(metrics.render().contains(&format!("{gauge} 2")));
        drop(first);
        drop(second);
        assert!(metrics.render().contains(&format!("{gauge} 0")));
    }
}
