//! What `/health` says, from the state of the host's connections and
//! subscriptions: pure, so every case is a unit test.
//!
//! - `DOWN` (503): not serving and not going to by itself: the host is
//!   starting (what it waits for is said) or shutting down.
//! - `DEGRADED` (200): running, and recovering by itself from something: a
//!   connection lost or being recovered, a connection the broker blocked
//!   (the contract's sentence `the broker has blocked this connection;
//!   publishing is paused[: reason]`), or consumers that stopped reading
//!   and are being restarted (`these consumers have stopped reading: a, b`);
//!   or running with a part in trouble ([`with_troubles`]: a state store
//!   that cannot be reached, a consumer whose plugin fails most calls).
//!   It answers 200 so that a liveness probe does not restart a host that is
//!   recovering on its own; alert on the status word instead.
//! - `UP` (200): every connection up and every consumer reading.

use crate::broker::{Phase, Reading};

/// The three words of the AceMQ health contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Up,
    Degraded,
    Down,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Up => "UP",
            Status::Degraded => "DEGRADED",
            Status::Down => "DOWN",
        }
    }
}

/// The verdict, with one sentence per thing that is not right.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assessment {
    pub status: Status,
    pub details: Vec<String>,
    /// Consumers reading, of all.
    pub consuming: (usize, usize),
}

/// Assesses the host from its connections (`role`, phase) and its
/// consumers (queue, reading).
pub fn assess(
    shutting_down: bool,
    links: &[(&str, Phase)],
    consumers: &[(String, Reading)],
) -> Assessment {
    let reading = consumers
        .iter()
        .filter(|(_, r)| *r == Reading::Consuming)
        .count();
    let consuming = (reading, consumers.len());
    if shutting_down {
        return Assessment {
            status: Status::Down,
            details: vec!["the host is shutting down".to_string()],
            consuming,
        };
    }
    let mut details: Vec<String> = links
        .iter()
        .filter_map(|(role, phase)| phase.detail().map(|d| format!("{role} connection: {d}")))
        .collect();
    let starting = links
        .iter()
        .any(|(_, phase)| matches!(phase, Phase::Starting { .. }));
    if starting {
        return Assessment {
            status: Status::Down,
            details,
            consuming,
        };
    }
    let stopped: Vec<&str> = consumers
        .iter()
        .filter(|(_, r)| !r.is_settled())
        .map(|(q, _)| q.as_str())
        .collect();
    if !stopped.is_empty() {
        details.push(format!(
            "these consumers have stopped reading: {}",
            stopped.join(", ")
        ));
    }
    let status = if details.is_empty() {
        Status::Up
    } else {
        Status::Degraded
    };
    Assessment {
        status,
        details,
        consuming,
    }
}

/// The assessment with the troubles of a running host's parts, one
/// sentence each: a state store that cannot be reached (its consumers with
/// state wait; the others go on), a consumer whose plugin fails most calls
/// (its messages are retried and dead-lettered, the others flow). Each makes
/// an `UP` host `DEGRADED`, never `DOWN`.
pub fn with_troubles(
    mut assessment: Assessment,
    troubles: impl IntoIterator<Item = String>,
) -> Assessment {
    assessment.details.extend(troubles);
    if assessment.status == Status::Up && !assessment.details.is_empty() {
        assessment.status = Status::Degraded;
    }
    assessment
}

/// What `/health/ready` says: whether this host should count as one of the
/// service's serving instances (an orchestrator's readiness, a rolling
/// update's progress).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// Why not, one sentence each.
    NotReady(Vec<String>),
}

/// Ready when both connections are up (a connection the broker blocked is
/// up: every other instance is blocked as well, and a new one would be
/// too) and every consumer holds its subscription or stands by for another
/// host; not while starting, draining, or recovering a connection or a
/// consumer. A part in trouble that the host works around (a state store,
/// a faulting plugin) leaves it ready: another instance would fare no
/// better.
pub fn readiness(
    shutting_down: bool,
    links: &[(&str, Phase)],
    consumers: &[(String, Reading)],
) -> Readiness {
    if shutting_down {
        return Readiness::NotReady(vec![
            "the host is shutting down: draining its deliveries".to_string(),
        ]);
    }
    let mut why: Vec<String> = links
        .iter()
        .filter(|(_, phase)| !matches!(phase, Phase::Up | Phase::Blocked { .. }))
        .filter_map(|(role, phase)| phase.detail().map(|d| format!("{role} connection: {d}")))
        .collect();
    why.extend(
        consumers
            .iter()
            .filter(|(_, reading)| !reading.is_settled())
            .map(|(queue, reading)| {
                format!(
                    "consumer {queue} is not reading: {}",
                    reading.reason().unwrap_or("not subscribed yet")
                )
            }),
    );
    if why.is_empty() {
        Readiness::Ready
    } else {
        Readiness::NotReady(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_in_trouble_degrades_a_running_host_and_says_why() {
        let up = assess(false, &[("consume", Phase::Up)], &consumers(&[("q", true)]));
        assert_eq!(with_troubles(up.clone(), None), up);
        let store = "state store redis://127.0.0.1:6379/0: cannot be reached (connection refused)";
        let plugin = "the plugin of consumer q fails most calls: 5 of its last 5 calls faulted (last: trap: unreachable)";
        let degraded = with_troubles(up, [store.to_string(), plugin.to_string()]);
        assert_eq!(degraded.status, Status::Degraded);
        assert_eq!(degraded.details, [store, plugin]);
        let down = assess(true, &[("consume", Phase::Up)], &consumers(&[("q", true)]));
        assert_eq!(
            with_troubles(down, Some(store.to_string())).status,
            Status::Down,
            "shutting down stays DOWN"
        );
    }

    fn consumers(states: &[(&str, bool)]) -> Vec<(String, Reading)> {
        states
            .iter()
            .map(|(q, reading)| {
                let state = if *reading {
                    Reading::Consuming
                } else {
                    Reading::Stopped {
                        reason: "the broker cancelled the consumer".into(),
                    }
                };
                (q.to_string(), state)
            })
            .collect()
    }

    #[test]
    fn up_when_every_connection_is_up_and_every_consumer_reads() {
        let a = assess(
            false,
            &[("consume", Phase::Up), ("publish", Phase::Up)],
            &consumers(&[("a", true), ("b", true)]),
        );
        assert_eq!(a.status, Status::Up);
        assert!(a.details.is_empty());
        assert_eq!(a.consuming, (2, 2));
    }

    #[test]
    fn down_while_starting_with_what_it_waits_for() {
        let starting = Phase::Starting {
            waiting_for: "the consume connection to amqp://h".into(),
        };
        let a = assess(
            false,
            &[("consume", starting), ("publish", Phase::Up)],
            &consumers(&[("a", false)]),
        );
        assert_eq!(a.status, Status::Down);
        assert_eq!(
            a.details,
            ["consume connection: waiting for the consume connection to amqp://h"]
        );
    }

    #[test]
    fn degraded_names_a_blocked_connection_with_the_contract_sentence() {
        let blocked = Phase::Blocked {
            reason: Some("low on memory".into()),
        };
        let a = assess(
            false,
            &[("consume", Phase::Up), ("publish", blocked)],
            &consumers(&[("a", true)]),
        );
        assert_eq!(a.status, Status::Degraded);
        assert_eq!(
            a.details,
            [
                "publish connection: the broker has blocked this connection; publishing is paused: low on memory"
            ]
        );
    }

    #[test]
    fn degraded_lists_the_consumers_that_stopped_reading() {
        let a = assess(
            false,
            &[("consume", Phase::Up), ("publish", Phase::Up)],
            &consumers(&[("a", true), ("b", false), ("c", false)]),
        );
        assert_eq!(a.status, Status::Degraded);
        assert_eq!(a.details, ["these consumers have stopped reading: b, c"]);
        assert_eq!(a.consuming, (1, 3));
    }

    #[test]
    fn a_lost_connection_is_degraded_and_shutdown_is_down() {
        let lost = Phase::Lost {
            reason: "CONNECTION_FORCED".into(),
        };
        let a = assess(
            false,
            &[("consume", lost.clone()), ("publish", Phase::Up)],
            &consumers(&[("a", false)]),
        );
        assert_eq!(a.status, Status::Degraded);
        assert!(
            a.details[0]
                .starts_with("consume connection: the connection was lost (CONNECTION_FORCED)"),
            "{:?}",
            a.details
        );
        let a = assess(true, &[("consume", lost)], &consumers(&[("a", false)]));
        assert_eq!(a.status, Status::Down);
    }

    #[test]
    fn ready_once_both_connections_are_up_and_every_consumer_reads() {
        let up = [("consume", Phase::Up), ("publish", Phase::Up)];
        assert_eq!(
            readiness(false, &up, &consumers(&[("a", true), ("b", true)])),
            Readiness::Ready
        );
        let starting = [
            (
                "consume",
                Phase::Starting {
                    waiting_for: "the consume connection to amqp://h".into(),
                },
            ),
            ("publish", Phase::Up),
        ];
        assert_eq!(
            readiness(false, &starting, &consumers(&[("a", false)])),
            Readiness::NotReady(vec![
                "consume connection: waiting for the consume connection to amqp://h".into(),
                "consumer a is not reading: the broker cancelled the consumer".into(),
            ])
        );
        assert_eq!(
            readiness(true, &up, &consumers(&[("a", true)])),
            Readiness::NotReady(vec![
                "the host is shutting down: draining its deliveries".into()
            ])
        );
    }

    #[test]
    fn a_recovering_connection_is_not_ready_and_a_blocked_one_is() {
        let lost = [
            ("consume", Phase::Up),
            (
                "publish",
                Phase::Lost {
                    reason: "connection reset".into(),
                },
            ),
        ];
        let Readiness::NotReady(why) = readiness(false, &lost, &consumers(&[("a", true)])) else {
            panic!("a lost connection is not ready")
        };
        assert_eq!(
            why,
            [
                "publish connection: the connection was lost (connection reset) and is waiting to be recovered"
            ]
        );
        let blocked = [
            ("consume", Phase::Up),
            ("publish", Phase::Blocked { reason: None }),
        ];
        assert_eq!(
            readiness(false, &blocked, &consumers(&[("a", true)])),
            Readiness::Ready
        );
    }

    #[test]
    fn a_consumer_standing_by_for_another_host_is_neither_trouble_nor_unready() {
        let up = [("consume", Phase::Up), ("publish", Phase::Up)];
        let standing_by = vec![
            ("a".to_string(), Reading::Consuming),
            (
                "s".to_string(),
                Reading::StandingBy {
                    reason: "another host holds the lease".into(),
                },
            ),
        ];
        assert_eq!(readiness(false, &up, &standing_by), Readiness::Ready);
        let assessment = assess(false, &up, &standing_by);
        assert_eq!(assessment.status, Status::Up, "{assessment:?}");
        assert_eq!(assessment.consuming, (1, 2));
    }
}
