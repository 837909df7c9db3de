//! The scheduler's ladder (contract §11): five fixed rungs, and which one a
//! message waits on next. Pure: every decision takes the time as an argument.

use std::time::Duration;

/// A queue a scheduled message waits on: its name (also its binding key on
/// `acemq.schedule`) and its `x-message-ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rung {
    pub name: &'static str,
    pub ttl_ms: u64,
}

/// Longest first: the next rung is the first one not longer than the time
/// left. The names are every AceMQ library's, rendered from the TTL in the
/// largest whole unit (the Java and Python renderers agree on these five).
pub const RUNGS: [Rung; 5] = [
    Rung {
        name: "acemq.schedule.1h",
        ttl_ms: 3_600_000,
    },
    Rung {
        name: "acemq.schedule.10m",
        ttl_ms: 600_000,
    },
    Rung {
        name: "acemq.schedule.1m",
        ttl_ms: 60_000,
    },
    Rung {
        name: "acemq.schedule.10s",
        ttl_ms: 10_000,
    },
    Rung {
        name: "acemq.schedule.1s",
        ttl_ms: 1_000,
    },
];

/// The shortest rung: with less than this left, a message is due.
pub const RESOLUTION: Duration = Duration::from_millis(1_000);

/// Where a message goes when `left_ms` (negative: overdue) remain until it
/// is due: the largest rung not longer than that, or `None` when less than
/// the shortest rung is left (it is delivered).
#[must_use]
pub fn rung_for(left_ms: i64) -> Option<&'static Rung> {
    let left = u64::try_from(left_ms).ok()?;
    RUNGS.iter().find(|rung| rung.ttl_ms <= left)
}

/// The rung whose queue is `name`.
#[must_use]
pub fn rung_named(name: &str) -> Option<&'static Rung> {
    RUNGS.iter().find(|rung| rung.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_rung_not_longer_than_the_time_left_is_taken() {
        let name = |left| rung_for(left).map(|r| r.name);
        assert_eq!(name(7_200_000), Some("acemq.schedule.1h"));
        assert_eq!(name(3_600_000), Some("acemq.schedule.1h"));
        assert_eq!(name(3_599_999), Some("acemq.schedule.10m"));
        assert_eq!(name(660_000), Some("acemq.schedule.10m"));
        assert_eq!(name(75_000), Some("acemq.schedule.1m"));
        assert_eq!(name(59_999), Some("acemq.schedule.10s"));
        assert_eq!(name(10_000), Some("acemq.schedule.10s"));
        assert_eq!(name(9_999), Some("acemq.schedule.1s"));
        assert_eq!(name(1_000), Some("acemq.schedule.1s"));
    }

    #[test]
    fn under_a_second_left_or_overdue_is_due() {
        assert_eq!(rung_for(999), None);
        assert_eq!(rung_for(0), None);
        assert_eq!(rung_for(-5_000), None);
    }

    #[test]
    fn the_names_render_the_ttls_in_their_largest_unit() {
        for rung in RUNGS {
            let ms = rung.ttl_ms;
            let unit = if ms % 3_600_000 == 0 {
                format!("{}h", ms / 3_600_000)
            } else if ms % 60_000 == 0 {
                format!("{}m", ms / 60_000)
            } else {
                format!("{}s", ms / 1_000)
            };
            assert_eq!(rung.name, format!("acemq.schedule.{unit}"));
            assert_eq!(rung_named(rung.name), Some(&rung));
        }
        assert_eq!(rung_named("acemq.schedule.due"), None);
    }
}
