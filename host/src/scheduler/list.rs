//! `acemq-host schedule list`: what the scheduler's six queues hold, peeked
//! with the `dlq` commands' pass ([`crate::broker::set_aside::Pass`]):
//! every message is read with `basic.get` and held, and all of them are
//! requeued at the end in their order, so nothing is consumed.
//!
//! A held message does not expire: a rung's TTL takes it only once it is
//! back in its queue, so a peek delays a hop by as long as the peek lasts,
//! never loses one. Messages a running control consumer holds (up to its
//! prefetch, on `acemq.schedule.due`) are not ready, so no peek sees them.
//!
//! Reading a message ([`Scheduled::read`]) and the text printed
//! ([`report`]) are pure; only [`list`] talks to the broker.

use anyhow::{Context as _, anyhow};
use lapin::BasicProperties;
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};

use super::queue_names;
use super::wire::{Schedule, Unschedulable};
use crate::broker::set_aside::{self, Pass};
use crate::config::LoadedConfig;
use crate::dlq::{age, aligned, one_line};
use crate::envelope::{self, Envelope, MessageId, header, rfc3339_millis};

/// One message on a scheduler queue, as `schedule list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduled {
    /// The queue it waits on.
    pub queue: &'static str,
    /// Where it stands there, 1 for the head.
    pub position: usize,
    /// `x-acemq-id`, else the `message-id` property; `None` when it has
    /// neither.
    pub id: Option<String>,
    /// The type it is delivered with: `x-schedule-message-type` (this
    /// host's extension), else `x-acemq-type`.
    pub message_type: Option<String>,
    /// When it was first seen (`x-acemq-first-seen`), else when it was
    /// published (the `timestamp` property, in seconds), epoch ms.
    pub since_ms: Option<u64>,
    /// Where and when it is delivered, or why the scheduler cannot tell.
    pub schedule: Result<Schedule, Unschedulable>,
}

impl Scheduled {
    /// Reads the message at `position` of `queue` off its properties.
    /// Never fails: a message whose `x-schedule-*` headers are missing or
    /// invalid is one with the reason the control consumer will refuse it.
    #[must_use]
    pub fn read(
        queue: &'static str,
        position: usize,
        properties: &BasicProperties,
        now_ms: u64,
    ) -> Self {
        let headers = properties.headers().as_ref();
        let has = |name: &str| headers.is_some_and(|table| table.inner().contains_key(name));
        // The envelope's own tolerant reading; a message that names no id
        // is shown without one rather than with one made up for the read.
        let envelope = Envelope::from_headers_or(
            headers,
            properties.message_id().as_ref().map(|id| id.as_str()),
            "",
            now_ms,
            || MessageId::from(""),
        );
        let schedule = Schedule::read(headers);
        let published_ms = properties
            .timestamp()
            .map(|seconds| seconds.saturating_mul(1000));
        Self {
            queue,
            position,
            id: (!envelope.id.is_empty()).then(|| envelope.id.into()),
            message_type: schedule
                .as_ref()
                .ok()
                .and_then(|schedule| schedule.message_type.clone())
                .or_else(|| has(header::TYPE).then_some(envelope.message_type)),
            since_ms: has(header::FIRST_SEEN)
                .then_some(envelope.first_seen_ms)
                .or(published_ms),
            schedule,
        }
    }
}

/// How many messages one scheduler queue holds ready; `None` when the
/// broker has no such queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueCount {
    pub queue: &'static str,
    pub ready: Option<usize>,
}

/// What one `schedule list` found: each queue's count, in
/// [`queue_names`] order, and the messages peeked, at most the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    pub queues: Vec<QueueCount>,
    pub messages: Vec<Scheduled>,
}

/// Peeks at most `limit` messages of the scheduler's queues on the broker
/// `config` names, longest rung first, each queue from its head. A queue
/// the broker does not have is counted as missing; only a broker that
/// cannot be used fails the listing.
pub async fn list(config: &LoadedConfig, limit: usize) -> anyhow::Result<Listing> {
    let broker = crate::app::connect_once(config, "schedule").await?;
    let result = async {
        let mut queues = Vec::new();
        for queue in queue_names() {
            let ready = match set_aside::ready(&broker, queue).await {
                Ok(ready) => Some(ready),
                Err(e) if no_such_queue(&e) => None,
                Err(e) => {
                    return Err(anyhow!(e).context(format!("counting the messages of '{queue}'")));
                }
            };
            queues.push(QueueCount { queue, ready });
        }
        let mut messages = Vec::new();
        for &QueueCount { queue, ready } in &queues {
            let bound = ready.unwrap_or(0).min(limit - messages.len());
            if bound == 0 {
                continue;
            }
            let mut pass = Pass::open(&broker, queue, bound).await?;
            let peeked = async {
                while let Some(delivery) = pass.next().await? {
                    pass.hold(&delivery);
                    messages.push(Scheduled::read(
                        queue,
                        pass.position(),
                        &delivery.properties,
                        envelope::now_ms(),
                    ));
                }
                anyhow::Ok(())
            }
            .await;
            pass.finish().await;
            peeked.with_context(|| format!("peeking at '{queue}'"))?;
        }
        Ok(Listing { queues, messages })
    }
    .await;
    broker.close("done").await;
    result
}

/// Whether the broker refused a passive declare because the queue is not
/// there (404 NOT_FOUND), rather than because it could not be asked.
fn no_such_queue(error: &lapin::Error) -> bool {
    matches!(error.kind(), lapin::ErrorKind::ProtocolError(e)
        if matches!(e.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND)))
}

/// When the time left is under a second either way, it is due now.
const NOW_WINDOW_MS: i64 = 1000;

/// The time left until a due time, as an operator reads it: `due in 9m
/// 58s`, `overdue by 3s`, `due now` within a second.
#[must_use]
pub fn due_in(left_ms: i64) -> String {
    if left_ms >= NOW_WINDOW_MS {
        format!("due in {}", age(left_ms.unsigned_abs()))
    } else if left_ms <= -NOW_WINDOW_MS {
        format!("overdue by {}", age(left_ms.unsigned_abs()))
    } else {
        "due now".to_owned()
    }
}

/// Where a scheduled message goes: `exchange / routing key`, the default
/// exchange and an empty key spelled out so neither reads as missing.
#[must_use]
pub fn target(schedule: &Schedule) -> String {
    let exchange = match schedule.exchange.as_str() {
        "" => "(default exchange)",
        name => name,
    };
    let routing_key = match schedule.routing_key.as_str() {
        "" => "\"\"",
        key => key,
    };
    format!("{exchange} / {routing_key}")
}

/// The table of messages: queue, position, due time (RFC 3339, UTC), time
/// left, age, id, type, and target last; an unschedulable message has its
/// reason where its target would be.
#[must_use]
pub fn table(messages: &[Scheduled], now_ms: u64) -> String {
    let header = ["QUEUE", "#", "DUE AT", "DUE", "AGE", "ID", "TYPE", "TARGET"];
    let dash = || "-".to_owned();
    let rows: Vec<[String; 8]> = messages
        .iter()
        .map(|m| {
            let (due_at, due, target) = match &m.schedule {
                Ok(schedule) => (
                    u64::try_from(schedule.due_at_ms).map_or_else(|_| dash(), rfc3339_millis),
                    due_in(schedule.left_ms(now_ms)),
                    target(schedule),
                ),
                Err(why) => (
                    dash(),
                    dash(),
                    one_line(&format!("cannot be scheduled: {why}")),
                ),
            };
            [
                m.queue.to_owned(),
                m.position.to_string(),
                due_at,
                due,
                m.since_ms
                    .map_or_else(dash, |since| age(now_ms.saturating_sub(since))),
                m.id.clone().unwrap_or_else(dash),
                m.message_type.clone().unwrap_or_else(dash),
                target,
            ]
        })
        .collect();
    aligned(header, &rows)
}

/// What `schedule list` prints: a heading (with a note when the config
/// does not run the scheduler), the table of messages, each queue's count,
/// and how many messages are shown of how many.
#[must_use]
pub fn report(listing: &Listing, not_run: Option<&str>, now_ms: u64) -> String {
    let mut out = String::from(
        "Messages waiting in the AceMQ scheduler's queues (peeked: nothing consumed)\n",
    );
    if let Some(note) = not_run {
        out.push_str(&format!("note: {note}\n"));
    }
    out.push('\n');
    let present: Vec<&QueueCount> = listing
        .queues
        .iter()
        .filter(|q| q.ready.is_some())
        .collect();
    if present.is_empty() {
        out.push_str(
            "None of the scheduler's queues exists on this broker: nothing has declared its \
             topology yet (a host whose config runs the scheduler declares it at start).\n",
        );
        return out;
    }
    if !listing.messages.is_empty() {
        out.push_str(&table(&listing.messages, now_ms));
        out.push('\n');
    }
    let counts: Vec<[String; 2]> = listing
        .queues
        .iter()
        .map(|q| {
            [
                q.queue.to_owned(),
                q.ready
                    .map_or_else(|| "no such queue".to_owned(), |ready| ready.to_string()),
            ]
        })
        .collect();
    out.push_str(&aligned(["QUEUE", "READY"], &counts));
    let total: usize = present.iter().filter_map(|q| q.ready).sum();
    out.push_str(&format!(
        "\n{} of the {total} messages ready shown\n",
        listing.messages.len()
    ));
    out
}

#[cfg(test)]
mod tests {
    use lapin::types::{AMQPValue, FieldTable};

    use super::*;
    use crate::envelope::long_string;

    const NOW: u64 = 1_800_000_000_000;

    fn headers(entries: &[(&str, AMQPValue)]) -> FieldTable {
        let mut table = FieldTable::default();
        for (name, value) in entries {
            table.insert((*name).into(), value.clone());
        }
        table
    }

    /// A message as this host schedules one, due `left_ms` from [`NOW`].
    fn scheduled(left_ms: i64) -> BasicProperties {
        BasicProperties::default()
            .with_message_id("m-1".into())
            .with_headers(headers(&[
                ("x-acemq-id", long_string("id-1")),
                ("x-acemq-type", long_string("ScheduledMessage")),
                (
                    "x-acemq-first-seen",
                    AMQPValue::LongLongInt(NOW as i64 - 65_000),
                ),
                ("x-schedule-exchange", long_string("reminders")),
                ("x-schedule-routing-key", long_string("reminder.due")),
                (
                    "x-schedule-due-at",
                    AMQPValue::LongLongInt(NOW as i64 + left_ms),
                ),
                ("x-schedule-content-type", long_string("application/json")),
                ("x-schedule-message-type", long_string("ReminderDue")),
            ]))
    }

    #[test]
    fn a_scheduled_message_reads_with_its_own_type_and_first_seen() {
        let read = Scheduled::read("acemq.schedule.10m", 2, &scheduled(598_000), NOW);
        assert_eq!(read.queue, "acemq.schedule.10m");
        assert_eq!(read.position, 2);
        assert_eq!(read.id.as_deref(), Some("id-1"));
        assert_eq!(read.message_type.as_deref(), Some("ReminderDue"));
        assert_eq!(read.since_ms, Some(NOW - 65_000));
        let schedule = read.schedule.unwrap();
        assert_eq!(schedule.due_at_ms, NOW as i64 + 598_000);
        assert_eq!(target(&schedule), "reminders / reminder.due");
    }

    #[test]
    fn a_foreign_message_falls_back_to_message_id_timestamp_and_its_envelope_type() {
        // Another library's: no first-seen, no type of its own, an id only
        // in the property, the publish time in seconds.
        let properties = BasicProperties::default()
            .with_message_id("m-9".into())
            .with_timestamp(NOW / 1000 - 30)
            .with_headers(headers(&[
                ("x-acemq-type", long_string("ScheduledMessage")),
                ("x-schedule-exchange", AMQPValue::ShortString("".into())),
                ("x-schedule-routing-key", long_string("orders.close")),
                ("x-schedule-due-at", AMQPValue::LongInt(7)),
            ]));
        let read = Scheduled::read("acemq.schedule.due", 1, &properties, NOW);
        assert_eq!(read.id.as_deref(), Some("m-9"));
        assert_eq!(read.message_type.as_deref(), Some("ScheduledMessage"));
        assert_eq!(read.since_ms, Some(NOW - 30_000));
        let schedule = read.schedule.unwrap();
        assert_eq!(target(&schedule), "(default exchange) / orders.close");

        // Nothing at all to go by: no id is made up, no age guessed.
        let bare = Scheduled::read("acemq.schedule.1s", 1, &BasicProperties::default(), NOW);
        assert_eq!(
            (bare.id, bare.message_type, bare.since_ms),
            (None, None, None)
        );
        assert_eq!(
            bare.schedule,
            Err(Unschedulable::Missing("x-schedule-exchange"))
        );
    }

    #[test]
    fn time_left_reads_as_due_in_overdue_by_or_now() {
        assert_eq!(due_in(598_000), "due in 9m 58s");
        assert_eq!(due_in(3_600_000), "due in 1h");
        assert_eq!(due_in(-3_400), "overdue by 3s");
        assert_eq!(due_in(999), "due now");
        assert_eq!(due_in(-999), "due now");
        assert_eq!(
            due_in(i64::MIN),
            format!("overdue by {}", age(i64::MIN.unsigned_abs()))
        );
    }

    #[test]
    fn the_table_shows_due_time_time_left_age_id_type_and_target_or_why_not() {
        let mut invalid = scheduled(0);
        let mut table_headers = invalid.headers().clone().unwrap();
        table_headers.insert("x-schedule-due-at".into(), long_string("soon\nish"));
        invalid = invalid.with_headers(table_headers);
        let messages = [
            Scheduled::read("acemq.schedule.10m", 1, &scheduled(598_000), NOW),
            Scheduled::read("acemq.schedule.due", 1, &scheduled(-3_000), NOW),
            Scheduled::read("acemq.schedule.due", 2, &invalid, NOW),
        ];
        let text = table(&messages, NOW);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "QUEUE               #  DUE AT                    DUE            AGE    ID    TYPE              TARGET",
                "acemq.schedule.10m  1  2027-01-15T08:09:58.000Z  due in 9m 58s  1m 5s  id-1  ReminderDue       reminders / reminder.due",
                "acemq.schedule.due  1  2027-01-15T07:59:57.000Z  overdue by 3s  1m 5s  id-1  ReminderDue       reminders / reminder.due",
                "acemq.schedule.due  2  -                         -              1m 5s  id-1  ScheduledMessage  cannot be scheduled: its x-schedule-due-at header is the text 'soon ish', not an integer (epoch milliseconds)",
            ]
        );
    }

    #[test]
    fn the_report_counts_every_queue_and_says_which_are_missing() {
        let queues = |ready: [Option<usize>; 6]| {
            queue_names()
                .into_iter()
                .zip(ready)
                .map(|(queue, ready)| QueueCount { queue, ready })
                .collect::<Vec<_>>()
        };
        let listing = Listing {
            queues: queues([Some(1), Some(2), Some(0), Some(0), Some(0), None]),
            messages: vec![Scheduled::read(
                "acemq.schedule.1h",
                1,
                &scheduled(3_000_000),
                NOW,
            )],
        };
        let text = report(&listing, Some("host.toml does not run the scheduler"), NOW);
        assert!(
            text.starts_with(
                "Messages waiting in the AceMQ scheduler's queues (peeked: nothing consumed)\n\
                 note: host.toml does not run the scheduler\n\nQUEUE "
            ),
            "{text}"
        );
        assert!(
            text.contains("acemq.schedule.1h  1  2027-01-15T08:50:00.000Z  due in 50m  1m 5s  id-1  ReminderDue  reminders / reminder.due\n"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "QUEUE               READY\n\
                 acemq.schedule.1h   1\n\
                 acemq.schedule.10m  2\n\
                 acemq.schedule.1m   0\n\
                 acemq.schedule.10s  0\n\
                 acemq.schedule.1s   0\n\
                 acemq.schedule.due  no such queue\n\
                 \n1 of the 3 messages ready shown\n"
            ),
            "{text}"
        );

        let empty = report(
            &Listing {
                queues: queues([None; 6]),
                messages: Vec::new(),
            },
            None,
            NOW,
        );
        assert!(
            empty.ends_with("\n\nNone of the scheduler's queues exists on this broker: nothing has declared its topology yet (a host whose config runs the scheduler declares it at start).\n"),
            "{empty}"
        );
        assert!(!empty.contains("note:"));
    }
}
