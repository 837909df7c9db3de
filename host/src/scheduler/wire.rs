//! A scheduled message on the wire (contract §11): the four `x-schedule-*`
//! headers that say where and when it goes, how a message to publish later
//! becomes one, and how one becomes its final delivery again. Pure.

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};

use super::{DUE_QUEUE, EXCHANGE, SCHEDULED_TYPE, header, rungs};
use crate::broker::publisher::Publication;
use crate::envelope::{self, DEFAULT_CONTENT_TYPE, PERSISTENT};

/// Where and when a scheduled message is delivered, as its headers say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub exchange: String,
    pub routing_key: String,
    /// Epoch milliseconds.
    pub due_at_ms: i64,
    /// The final delivery's content type; `None`: `application/json`.
    pub content_type: Option<String>,
    /// The final delivery's envelope type, when this host scheduled it
    /// (see [`header::MESSAGE_TYPE`]).
    pub message_type: Option<String>,
}

/// Why a message on the scheduler's queues cannot be scheduled: a header
/// that is missing or not of its type. The control consumer rejects it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unschedulable {
    #[error("it has no {0} header, so the scheduler does not know where or when to deliver it")]
    Missing(&'static str),
    #[error("its {header} header is {found}, not {wanted}")]
    Invalid {
        header: &'static str,
        found: String,
        wanted: &'static str,
    },
}

impl Unschedulable {
    /// The `reason` label of `acemq_scheduler_refused_total`.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Missing(_) => "missing_header",
            Self::Invalid { .. } => "invalid_header",
        }
    }
}

/// How a header value reads for a refusal: its AMQP type, and a short
/// preview of a text.
fn describe(value: &AMQPValue) -> String {
    match text_of(value) {
        Some(text) => format!("the text '{}'", envelope::preview(&text)),
        None => format!("a value of AMQP type {:?}", value.get_type()),
    }
}

fn text_of(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok().map(str::to_owned),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

impl Schedule {
    /// Reads the schedule off a message's headers. The due time is any AMQP
    /// integer (Java writes a 64-bit long, pika the narrowest that fits);
    /// the content type may be absent (then `application/json`, as every
    /// library delivers it).
    pub fn read(headers: Option<&FieldTable>) -> Result<Self, Unschedulable> {
        let empty = FieldTable::default();
        let headers = headers.unwrap_or(&empty);
        let get = |name: &'static str| headers.inner().get(name);
        let text = |name: &'static str| -> Result<Option<String>, Unschedulable> {
            get(name)
                .map(|value| {
                    text_of(value).ok_or_else(|| Unschedulable::Invalid {
                        header: name,
                        found: describe(value),
                        wanted: "a text",
                    })
                })
                .transpose()
        };
        let required = |name| text(name)?.ok_or(Unschedulable::Missing(name));
        let exchange = required(header::EXCHANGE)?;
        let routing_key = required(header::ROUTING_KEY)?;
        let due = get(header::DUE_AT).ok_or(Unschedulable::Missing(header::DUE_AT))?;
        let due_at_ms = envelope::integer_value(due)
            .and_then(|ms| i64::try_from(ms).ok())
            .ok_or_else(|| Unschedulable::Invalid {
                header: header::DUE_AT,
                found: describe(due),
                wanted: "an integer (epoch milliseconds)",
            })?;
        Ok(Self {
            exchange,
            routing_key,
            due_at_ms,
            content_type: text(header::CONTENT_TYPE)?,
            message_type: text(header::MESSAGE_TYPE)?,
        })
    }

    /// Milliseconds until it is due at `now_ms` (negative: overdue).
    #[must_use]
    pub fn left_ms(&self, now_ms: u64) -> i64 {
        self.due_at_ms
            .saturating_sub(i64::try_from(now_ms).unwrap_or(i64::MAX))
    }
}

/// The queue a scheduled message waits on next, `left_ms` before it is due:
/// the largest rung not longer than that, else the control queue.
#[must_use]
pub fn next_queue(left_ms: i64) -> &'static str {
    rungs::rung_for(left_ms).map_or(DUE_QUEUE, |rung| rung.name)
}

/// `message`, a publication meant for now, as the scheduled message that
/// delivers it at `due_at_ms`: to `acemq.schedule` on the rung for the time
/// left at `now_ms`, mandatory, persistent, envelope type
/// `ScheduledMessage`, with the `x-schedule-*` headers. Body, id and every
/// other property and header travel unchanged; the final delivery gets its
/// content type and its own envelope type back ([`final_delivery`]).
#[must_use]
pub fn scheduled(message: Publication, due_at_ms: u64, now_ms: u64) -> Publication {
    let properties = message.properties;
    let mut headers = properties.headers().clone().unwrap_or_default();
    let own_type = headers
        .inner()
        .get(envelope::header::TYPE)
        .and_then(text_of);
    let due_at_ms = i64::try_from(due_at_ms).unwrap_or(i64::MAX);
    let content_type = properties
        .content_type()
        .as_ref()
        .map_or(DEFAULT_CONTENT_TYPE.to_string(), |ct| ct.to_string());
    let mut put_text = |name: &str, value: &str| {
        headers.insert(name.into(), envelope::long_string(value));
    };
    put_text(header::EXCHANGE, &message.exchange);
    put_text(header::ROUTING_KEY, &message.routing_key);
    put_text(header::CONTENT_TYPE, &content_type);
    if let Some(own_type) = &own_type {
        put_text(header::MESSAGE_TYPE, own_type);
    }
    put_text(envelope::header::TYPE, SCHEDULED_TYPE);
    headers.insert(header::DUE_AT.into(), AMQPValue::LongLongInt(due_at_ms));
    let schedule_left = due_at_ms.saturating_sub(i64::try_from(now_ms).unwrap_or(i64::MAX));
    Publication {
        exchange: EXCHANGE.to_string(),
        routing_key: next_queue(schedule_left).to_string(),
        body: message.body,
        properties: properties
            .with_headers(headers)
            .with_delivery_mode(PERSISTENT),
        mandatory: true,
    }
}

/// The same scheduled message, sent on to wait on `queue` (a rung, or the
/// control queue): nothing about it changes but its routing key.
#[must_use]
pub fn hop(properties: &BasicProperties, body: &bytes::Bytes, queue: &'static str) -> Publication {
    Publication {
        exchange: EXCHANGE.to_string(),
        routing_key: queue.to_string(),
        body: body.clone(),
        properties: properties.clone(),
        mandatory: true,
    }
}

/// The final delivery of a scheduled message: to its exchange and routing
/// key, mandatory, every `x-schedule-*` header stripped, the carried content
/// type (default `application/json`) and, when this host scheduled it, its
/// own envelope type. Everything else (id, correlation, body) as it came.
#[must_use]
pub fn final_delivery(
    properties: &BasicProperties,
    body: &bytes::Bytes,
    schedule: &Schedule,
) -> Publication {
    let mut headers = FieldTable::default();
    for (name, value) in properties.headers().as_ref().into_iter().flatten() {
        if !name.as_str().starts_with(header::PREFIX) {
            headers.insert(name.clone(), value.clone());
        }
    }
    if let Some(own_type) = &schedule.message_type {
        headers.insert(
            envelope::header::TYPE.into(),
            envelope::long_string(own_type),
        );
    }
    let content_type = schedule
        .content_type
        .as_deref()
        .unwrap_or(DEFAULT_CONTENT_TYPE);
    let mut properties = properties.clone().with_headers(headers);
    // A content type too long for the property (only a foreign producer
    // could write one) is left out rather than cut.
    if let Ok(content_type) = ShortString::try_new(content_type) {
        properties = properties.with_content_type(content_type);
    }
    Publication {
        exchange: schedule.exchange.clone(),
        routing_key: schedule.routing_key.clone(),
        body: body.clone(),
        properties,
        mandatory: true,
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::LongString;

    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    fn message() -> Publication {
        let mut headers = FieldTable::default();
        headers.insert("tenant".into(), envelope::long_string("acme"));
        headers.insert(envelope::header::ID.into(), envelope::long_string("id-1"));
        headers.insert(
            envelope::header::TYPE.into(),
            envelope::long_string("ReminderDue"),
        );
        Publication {
            exchange: "reminders".to_string(),
            routing_key: "reminder.due".to_string(),
            body: bytes::Bytes::from_static(b"{\"remind\":true}"),
            properties: BasicProperties::default()
                .with_message_id("id-1".into())
                .with_content_type("application/x-msgpack".into())
                .with_delivery_mode(1)
                .with_headers(headers),
            mandatory: false,
        }
    }

    fn text(properties: &BasicProperties, name: &str) -> Option<String> {
        properties
            .headers()
            .as_ref()?
            .inner()
            .get(name)
            .and_then(text_of)
    }

    #[test]
    fn a_message_for_later_goes_to_the_rung_for_its_time_left_with_the_contract_headers() {
        let scheduled = scheduled(message(), NOW + 75_000, NOW);
        assert_eq!(scheduled.exchange, "acemq.schedule");
        assert_eq!(scheduled.routing_key, "acemq.schedule.1m");
        assert!(scheduled.mandatory);
        assert_eq!(scheduled.body, message().body);
        let p = &scheduled.properties;
        assert_eq!(*p.delivery_mode(), Some(PERSISTENT));
        assert_eq!(text(p, "x-schedule-exchange").as_deref(), Some("reminders"));
        assert_eq!(
            text(p, "x-schedule-routing-key").as_deref(),
            Some("reminder.due")
        );
        assert_eq!(
            text(p, "x-schedule-content-type").as_deref(),
            Some("application/x-msgpack")
        );
        assert_eq!(
            p.headers()
                .as_ref()
                .unwrap()
                .inner()
                .get("x-schedule-due-at"),
            Some(&AMQPValue::LongLongInt((NOW + 75_000) as i64))
        );
        assert_eq!(text(p, "x-acemq-type").as_deref(), Some("ScheduledMessage"));
        assert_eq!(
            text(p, "x-schedule-message-type").as_deref(),
            Some("ReminderDue")
        );
        assert_eq!(text(p, "tenant").as_deref(), Some("acme"));
        assert_eq!(p.message_id().as_ref().map(|m| m.as_str()), Some("id-1"));
    }

    #[test]
    fn under_a_second_left_or_overdue_goes_straight_to_the_control_queue() {
        assert_eq!(
            scheduled(message(), NOW + 500, NOW).routing_key,
            "acemq.schedule.due"
        );
        assert_eq!(
            scheduled(message(), NOW - 60_000, NOW).routing_key,
            "acemq.schedule.due"
        );
    }

    #[test]
    fn what_the_host_writes_it_reads_back() {
        let scheduled = scheduled(message(), NOW + 3_000, NOW);
        let schedule = Schedule::read(scheduled.properties.headers().as_ref()).unwrap();
        assert_eq!(
            schedule,
            Schedule {
                exchange: "reminders".to_string(),
                routing_key: "reminder.due".to_string(),
                due_at_ms: (NOW + 3_000) as i64,
                content_type: Some("application/x-msgpack".to_string()),
                message_type: Some("ReminderDue".to_string()),
            }
        );
        assert_eq!(schedule.left_ms(NOW + 1_000), 2_000);
        assert_eq!(schedule.left_ms(NOW + 4_000), -1_000);
    }

    #[test]
    fn the_final_delivery_strips_the_schedule_and_restores_type_and_content_type() {
        let scheduled = scheduled(message(), NOW + 3_000, NOW);
        let schedule = Schedule::read(scheduled.properties.headers().as_ref()).unwrap();
        let delivered = final_delivery(&scheduled.properties, &scheduled.body, &schedule);
        assert_eq!(delivered.exchange, "reminders");
        assert_eq!(delivered.routing_key, "reminder.due");
        assert!(delivered.mandatory);
        let p = &delivered.properties;
        let names: Vec<&str> = p
            .headers()
            .as_ref()
            .unwrap()
            .inner()
            .keys()
            .map(|k| k.as_str())
            .collect();
        assert!(
            names.iter().all(|n| !n.starts_with("x-schedule-")),
            "{names:?}"
        );
        assert_eq!(text(p, "x-acemq-type").as_deref(), Some("ReminderDue"));
        assert_eq!(text(p, "tenant").as_deref(), Some("acme"));
        assert_eq!(
            p.content_type().as_ref().map(|c| c.as_str()),
            Some("application/x-msgpack")
        );
        assert_eq!(p.message_id().as_ref().map(|m| m.as_str()), Some("id-1"));
        assert_eq!(delivered.body, message().body);
    }

    /// A message another library scheduled: the due time in whatever
    /// integer width its client wrote, short strings, no content type.
    fn foreign(due: AMQPValue) -> FieldTable {
        let mut headers = FieldTable::default();
        headers.insert(
            "x-schedule-exchange".into(),
            AMQPValue::ShortString("orders".into()),
        );
        headers.insert(
            "x-schedule-routing-key".into(),
            AMQPValue::LongString(LongString::from("order.close")),
        );
        headers.insert("x-schedule-due-at".into(), due);
        headers.insert(
            "x-acemq-type".into(),
            envelope::long_string("ScheduledMessage"),
        );
        headers
    }

    #[test]
    fn a_foreign_schedule_reads_with_any_integer_width_and_defaults_to_json() {
        for due in [
            AMQPValue::LongLongInt(NOW as i64),
            AMQPValue::Timestamp(NOW),
        ] {
            let schedule = Schedule::read(Some(&foreign(due))).unwrap();
            assert_eq!(schedule.due_at_ms, NOW as i64);
            assert_eq!(schedule.content_type, None);
        }
        let headers = foreign(AMQPValue::LongInt(5));
        let schedule = Schedule::read(Some(&headers)).unwrap();
        let delivered = final_delivery(
            &BasicProperties::default().with_headers(headers),
            &bytes::Bytes::new(),
            &schedule,
        );
        assert_eq!(
            delivered
                .properties
                .content_type()
                .as_ref()
                .map(|c| c.as_str()),
            Some("application/json")
        );
        // Scheduled elsewhere: delivered with the type that library gave it.
        assert_eq!(
            text(&delivered.properties, "x-acemq-type").as_deref(),
            Some("ScheduledMessage")
        );
    }

    #[test]
    fn a_missing_or_mistyped_header_is_named() {
        let mut headers = FieldTable::default();
        for (name, value) in &foreign(AMQPValue::LongLongInt(1)) {
            if name.as_str() != "x-schedule-routing-key" {
                headers.insert(name.clone(), value.clone());
            }
        }
        let refused = Schedule::read(Some(&headers)).unwrap_err();
        assert_eq!(refused, Unschedulable::Missing("x-schedule-routing-key"));
        assert!(
            refused
                .to_string()
                .contains("no x-schedule-routing-key header")
        );
        assert_eq!(refused.label(), "missing_header");

        let refused = Schedule::read(Some(&foreign(envelope::long_string("soon")))).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "its x-schedule-due-at header is the text 'soon', not an integer (epoch milliseconds)"
        );
        assert_eq!(refused.label(), "invalid_header");
        assert_eq!(
            Schedule::read(Some(&foreign(AMQPValue::Double(1.5))))
                .unwrap_err()
                .label(),
            "invalid_header"
        );
        assert_eq!(
            Schedule::read(None).unwrap_err(),
            Unschedulable::Missing("x-schedule-exchange")
        );
    }
}
