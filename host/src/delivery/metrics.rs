//! One consumer's metric handles, built once for its queue.
//!
//! The registry's families are keyed by label sets (owned strings); looking
//! one up per delivery would build and hash them on the hot path. A
//! consumer's labels never change, so its handles are resolved once: the
//! in-flight gauge when the consumer is built, each other series on first
//! use (so a series appears in `/metrics` when it first counts something,
//! as before).

use std::sync::OnceLock;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::decide::Outcome;
use super::settle::{Report, RetryPlace};
use crate::plugin::FaultKind;
use crate::telemetry::{
    Metrics, Place, PluginFaultLabels, QueueLabel, QueueOutcome, QueueRung, QueueTarget, QueueWhere,
};

/// A consumer's handles into the host's [`Metrics`].
pub struct ConsumerMetrics {
    queue: String,
    metrics: std::sync::Arc<Metrics>,
    in_flight: Gauge,
    consumed: [OnceLock<Counter>; Outcome::ALL.len()],
    retried: [OnceLock<Counter>; RetryPlace::ALL.len()],
    /// `dead_lettered` and `parked` copies.
    set_aside: [OnceLock<Counter>; 2],
    fuel: OnceLock<Counter>,
}

impl ConsumerMetrics {
    pub fn new(metrics: std::sync::Arc<Metrics>, queue: &str) -> Self {
        let in_flight = metrics
            .in_flight
            .get_or_create(&QueueLabel {
                queue: queue.to_string(),
            })
            .clone();
        Self {
            queue: queue.to_string(),
            metrics,
            in_flight,
            consumed: Default::default(),
            retried: Default::default(),
            set_aside: Default::default(),
            fuel: OnceLock::new(),
        }
    }

    /// Counts a delivery as in flight until the guard is dropped.
    pub fn in_flight(&self) -> InFlight<'_> {
        self.in_flight.inc();
        InFlight(&self.in_flight)
    }

    /// Counts one settled delivery: everything its report says, once.
    pub fn count(&self, report: &Report) {
        self.consumed(report.outcome).inc();
        if let Some(place) = report.retried {
            self.retried(place).inc();
        }
        if report.set_aside {
            // A rejected message goes to `.dlq` like an exhausted one.
            let parked = report.outcome == Outcome::Parked;
            let word = if parked { "parked" } else { "dead_lettered" };
            self.set_aside[usize::from(parked)]
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

    /// Adds the fuel a handler call burned.
    pub fn fuel(&self, fuel: u64) {
        self.fuel
            .get_or_init(|| {
                self.metrics
                    .plugin_fuel
                    .get_or_create(&QueueLabel {
                        queue: self.queue.clone(),
                    })
                    .clone()
            })
            .inc_by(fuel);
    }

    fn consumed(&self, outcome: Outcome) -> &Counter {
        let index = Outcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .expect("every outcome is in ALL");
        self.consumed[index].get_or_init(|| {
            self.metrics
                .consume_total
                .get_or_create(&QueueOutcome {
                    queue: self.queue.clone(),
                    outcome: outcome.as_str().to_string(),
                })
                .clone()
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
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_report_is_counted_in_every_series_it_concerns() {
        let metrics = Arc::new(Metrics::new());
        let consumer = ConsumerMetrics::new(metrics.clone(), "orders.new");
        consumer.count(&Report::new(Outcome::Acked));
        consumer.count(&Report::new(Outcome::Acked));
        consumer.count(&Report {
            retried: Some(RetryPlace::Consumer),
            rung_missing: Some("orders.new.retry.40s".into()),
            ..Report::new(Outcome::Retried)
        });
        consumer.count(&Report {
            set_aside: true,
            ..Report::new(Outcome::Parked)
        });
        consumer.count(&Report {
            set_aside: true,
            ..Report::new(Outcome::Rejected)
        });
        consumer.count(&Report {
            retried: Some(RetryPlace::Requeued),
            set_aside_failed: Some("orders.new.dlq".into()),
            ..Report::new(Outcome::Retried)
        });
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
