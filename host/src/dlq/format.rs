//! How `list` and `show` print set-aside messages: a table of one row per
//! message, and one message in full. Pure text, so every layout is tested
//! without a broker.

use std::fmt::Write as _;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};

use super::message::SetAside;
use crate::envelope::{Envelope, HeaderValue, is_reserved, rfc3339_millis, truncate_middle};

/// The widest a reason is shown in the `list` table; `show` prints it whole.
const LIST_REASON_BYTES: usize = 100;

/// An age as an operator reads it: the two largest units, `0s` below a
/// second (`45s`, `5m 3s`, `3h 5m`, `2d 4h`).
#[must_use]
pub fn age(ms: u64) -> String {
    let seconds = ms / 1000;
    let units = [(86_400, "d"), (3600, "h"), (60, "m"), (1, "s")];
    let Some(first) = units.iter().position(|(size, _)| seconds >= *size) else {
        return "0s".to_owned();
    };
    let (size, unit) = units[first];
    let mut out = format!("{}{unit}", seconds / size);
    if let Some((next, next_unit)) = units.get(first + 1) {
        let rest = (seconds % size) / next;
        if rest > 0 {
            write!(out, " {rest}{next_unit}").expect("writing to a String");
        }
    }
    out
}

/// One row of `list`: where the message stands in its queue (1 is the head)
/// and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub position: usize,
    pub message: SetAside,
}

/// The `list` table: position, id, type, attempt, replays, first seen,
/// age and reason, columns aligned, the reason last and cut to
/// [`LIST_REASON_BYTES`].
#[must_use]
pub fn list_table(rows: &[Row], now_ms: u64) -> String {
    let header = [
        "#",
        "ID",
        "TYPE",
        "ATTEMPT",
        "REPLAYS",
        "FIRST SEEN",
        "AGE",
        "REASON",
    ];
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|row| {
            let m = &row.message;
            let reason = m.reason.as_deref().unwrap_or("-");
            [
                row.position.to_string(),
                m.id.clone(),
                m.message_type.clone(),
                m.attempt.to_string(),
                m.replays.count.to_string(),
                m.first_seen_ms.map_or_else(|| "-".into(), rfc3339_millis),
                m.first_seen_ms
                    .map_or_else(|| "-".into(), |seen| age(now_ms.saturating_sub(seen))),
                one_line(&truncate_middle(reason, LIST_REASON_BYTES)),
            ]
        })
        .collect();
    aligned(header, &cells)
}

/// A table of `rows` under `header`: every column but the last padded to
/// its widest cell and followed by two spaces, the last (free text, such
/// as a reason) written as it is, so a long one does not widen the others.
#[must_use]
pub fn aligned<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(|name| name.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: [&str; N]| {
        for (column, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if column + 1 == N {
                out.push_str(cell);
            } else {
                write!(out, "{cell:<width$}  ").expect("writing to a String");
            }
        }
        out.push('\n');
    };
    line(header);
    for row in rows {
        line(row.each_ref().map(String::as_str));
    }
    out
}

/// A reason on one line of a table: line breaks (a stack trace's) shown as
/// spaces.
#[must_use]
pub fn one_line(text: &str) -> String {
    text.replace(['\r', '\n'], " ")
}

/// Everything about one message for `show`: the envelope, the replay
/// stamps, the properties, every other header, and at most
/// `max_body_bytes` of the body (text when it is UTF-8, a hex dump
/// otherwise).
#[must_use]
pub fn show(
    position: usize,
    queue: &str,
    properties: &BasicProperties,
    body: &[u8],
    max_body_bytes: usize,
    source_queue: &str,
    now_ms: u64,
) -> String {
    let envelope = Envelope::read(properties, source_queue, now_ms);
    let message = SetAside::of(&envelope, properties);
    let mut out = format!("message {position} of {queue}\n\nenvelope\n");
    envelope_lines(&mut out, &envelope, &message, now_ms);
    replay_lines(&mut out, &message);
    out.push_str("\nproperties\n");
    for (name, value) in property_lines(properties) {
        field(&mut out, name, &value);
    }
    header_lines(&mut out, properties);
    out.push('\n');
    out.push_str(&body_preview(body, max_body_bytes));
    out
}

/// One `name value` line of a `show` section.
fn field(out: &mut String, name: &str, value: &str) {
    writeln!(out, "  {name:<18}{value}").expect("writing to a String");
}

/// `show`'s envelope section: what the contract's headers say.
fn envelope_lines(out: &mut String, envelope: &Envelope, message: &SetAside, now_ms: u64) {
    field(out, "id", &envelope.id);
    field(out, "type", &envelope.message_type);
    field(out, "version", &envelope.version.to_string());
    field(out, "correlation", &envelope.correlation_id);
    let optional = [
        ("causation", &envelope.causation_id),
        ("origin", &envelope.origin),
        ("claim", &envelope.claim),
        ("route", &envelope.route),
        ("route id", &envelope.route_id),
    ];
    field(out, "attempt", &envelope.attempt.to_string());
    match message.first_seen_ms {
        Some(seen) => field(
            out,
            "first seen",
            &format!(
                "{} ({} ago)",
                rfc3339_millis(seen),
                age(now_ms.saturating_sub(seen))
            ),
        ),
        None => field(out, "first seen", "-"),
    }
    for (name, value) in optional {
        if let Some(value) = value {
            field(out, name, value);
        }
    }
    if let Some(position) = envelope.route_position {
        field(out, "route position", &position.to_string());
    }
    field(out, "reason", message.reason.as_deref().unwrap_or("-"));
}

/// `show`'s replays section, for a message replayed before.
fn replay_lines(out: &mut String, message: &SetAside) {
    let replays = &message.replays;
    if replays.count > 0 || replays.from.is_some() {
        out.push_str("\nreplays\n");
        field(out, "count", &replays.count.to_string());
        if let Some(from) = &replays.from {
            field(out, "last from", from);
        }
        if let Some(at) = replays.at_ms {
            field(out, "last at", &rfc3339_millis(at));
        }
    }
}

/// `show`'s headers section: every header the envelope does not read.
fn header_lines(out: &mut String, properties: &BasicProperties) {
    let others: Vec<_> = properties
        .headers()
        .iter()
        .flat_map(FieldTable::inner)
        .filter(|(name, _)| !is_reserved(name.as_str()))
        .collect();
    if !others.is_empty() {
        out.push_str("\nheaders\n");
        for (name, value) in others {
            writeln!(out, "  {name} = {}", header_value(value)).expect("writing to a String");
        }
    }
}

/// The AMQP properties that are set, by their wire names.
pub(crate) fn property_lines(p: &BasicProperties) -> Vec<(&'static str, String)> {
    let mut lines = Vec::new();
    let mut text = |name, value: Option<String>| {
        if let Some(value) = value {
            lines.push((name, value));
        }
    };
    text(
        "content-type",
        p.content_type().as_ref().map(|v| v.to_string()),
    );
    text(
        "content-encoding",
        p.content_encoding().as_ref().map(|v| v.to_string()),
    );
    text("delivery-mode", p.delivery_mode().map(|v| v.to_string()));
    text("priority", p.priority().map(|v| v.to_string()));
    text(
        "correlation-id",
        p.correlation_id().as_ref().map(|v| v.to_string()),
    );
    text("reply-to", p.reply_to().as_ref().map(|v| v.to_string()));
    text("expiration", p.expiration().as_ref().map(|v| v.to_string()));
    text("message-id", p.message_id().as_ref().map(|v| v.to_string()));
    text("timestamp", p.timestamp().map(|v| v.to_string()));
    text("type", p.kind().as_ref().map(|v| v.to_string()));
    text("user-id", p.user_id().as_ref().map(|v| v.to_string()));
    text("app-id", p.app_id().as_ref().map(|v| v.to_string()));
    text("cluster-id", p.cluster_id().as_ref().map(|v| v.to_string()));
    if lines.is_empty() {
        lines.push(("(none)", String::new()));
    }
    lines
}

/// A header value on one line: flat values as a plugin sees them (text
/// quoted, bytes in hex), tables and arrays (the broker's `x-death`)
/// spelled out.
#[must_use]
pub fn header_value(value: &AMQPValue) -> String {
    match value {
        AMQPValue::FieldTable(table) => {
            let entries: Vec<String> = table
                .inner()
                .iter()
                .map(|(name, value)| format!("{name}: {}", header_value(value)))
                .collect();
            format!("{{{}}}", entries.join(", "))
        }
        AMQPValue::FieldArray(array) => {
            let items: Vec<String> = array.as_slice().iter().map(header_value).collect();
            format!("[{}]", items.join(", "))
        }
        other => match HeaderValue::from_amqp(other) {
            Some(HeaderValue::Text(text)) => format!("{text:?}"),
            Some(HeaderValue::Int(n)) => n.to_string(),
            Some(HeaderValue::Float(f)) => f.to_string(),
            Some(HeaderValue::Bool(b)) => b.to_string(),
            Some(HeaderValue::Bytes(bytes)) => format!("0x{}", hex::encode(bytes)),
            None => format!("{other:?}"),
        },
    }
}

/// At most `max` bytes of a body: text when they are UTF-8 (a character
/// cut at the bound does not count against it), a hex dump of 16 bytes a
/// line otherwise; the bytes not shown are counted.
#[must_use]
pub fn body_preview(body: &[u8], max: usize) -> String {
    let shown = &body[..body.len().min(max)];
    let text = match std::str::from_utf8(shown) {
        Ok(text) => Some(text),
        // Only the bound cut a character: the rest is text.
        Err(e) if e.error_len().is_none() => std::str::from_utf8(&shown[..e.valid_up_to()]).ok(),
        Err(_) => None,
    };
    let (kind, shown_len, mut out) = match text {
        Some(text) => ("text", text.len(), format!("{text}\n")),
        None => ("binary", shown.len(), hex_dump(shown)),
    };
    let mut heading = format!("body ({} bytes, {kind})\n", body.len());
    if shown_len < body.len() {
        writeln!(
            out,
            "... {} more bytes not shown (--bytes)",
            body.len() - shown_len
        )
        .expect("writing to a String");
    }
    heading.push_str(&out);
    heading
}

fn hex_dump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (line, chunk) in bytes.chunks(16).enumerate() {
        let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
        let printable: String = chunk
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() || b == b' ' {
                    b as char
                } else {
                    '.'
                }
            })
            .collect();
        writeln!(
            out,
            "{:08x}  {:<47}  |{printable}|",
            line * 16,
            hex.join(" ")
        )
        .expect("writing to a String");
    }
    out
}

#[cfg(test)]
mod tests {
    use lapin::types::FieldArray;

    use super::*;
    use crate::envelope::{ReplayStamps, header, set_aside_properties};

    const NOW: u64 = 1_770_091_506_789;

    #[test]
    fn ages_read_at_a_glance() {
        assert_eq!(age(0), "0s");
        assert_eq!(age(999), "0s");
        assert_eq!(age(45_000), "45s");
        assert_eq!(age(60_000), "1m");
        assert_eq!(age(303_000), "5m 3s");
        assert_eq!(age(3 * 3_600_000 + 5 * 60_000 + 9_000), "3h 5m");
        assert_eq!(age(2 * 86_400_000 + 4 * 3_600_000), "2d 4h");
        assert_eq!(age(86_400_000 + 59_000), "1d");
    }

    #[test]
    fn the_list_table_is_aligned_with_the_reason_last() {
        let rows = vec![
            Row {
                position: 1,
                message: SetAside {
                    id: "a".into(),
                    message_type: "order.placed".into(),
                    attempt: 3,
                    reason: Some("exhausted 3 attempts:\nboom".into()),
                    first_seen_ms: Some(NOW - 65_000),
                    replays: ReplayStamps {
                        count: 2,
                        ..ReplayStamps::default()
                    },
                },
            },
            Row {
                position: 12,
                message: SetAside {
                    id: "longer-id".into(),
                    message_type: "t".into(),
                    attempt: 1,
                    reason: Some("x".repeat(500)),
                    first_seen_ms: None,
                    replays: ReplayStamps::default(),
                },
            },
        ];
        let table = list_table(&rows, NOW);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("#   ID         TYPE          ATTEMPT  REPLAYS  FIRST SEEN"));
        assert!(lines[0].ends_with("AGE    REASON"), "{}", lines[0]);
        assert!(lines[1].starts_with("1   a          order.placed  3        2        2026-02-03T04:04:01.789Z  1m 5s  exhausted 3 attempts: boom"), "{}", lines[1]);
        assert!(lines[2].starts_with("12  longer-id  t             1        0        -"));
        assert!(
            lines[2].contains("[cut"),
            "long reasons are cut: {}",
            lines[2]
        );
        assert!(lines[2].len() < 200);
    }

    #[test]
    fn header_values_are_spelled_out_nested_or_flat() {
        let mut death = FieldTable::default();
        death.insert("count".into(), AMQPValue::LongLongInt(1));
        death.insert("reason".into(), AMQPValue::LongString("rejected".into()));
        let array = AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(death)]));
        assert_eq!(header_value(&array), "[{count: 1, reason: \"rejected\"}]");
        assert_eq!(header_value(&AMQPValue::Boolean(true)), "true");
        assert_eq!(
            header_value(&AMQPValue::ByteArray(vec![0xde, 0xad].into())),
            "0xdead"
        );
    }

    #[test]
    fn bodies_show_as_text_or_hex_within_the_bound() {
        assert_eq!(
            body_preview(b"{\"a\":1}", 100),
            "body (7 bytes, text)\n{\"a\":1}\n"
        );
        // A cut inside a character still shows text, one byte short.
        let text = body_preview("h\u{e9}llo".as_bytes(), 2);
        assert_eq!(
            text,
            "body (6 bytes, text)\nh\n... 5 more bytes not shown (--bytes)\n"
        );
        let binary = body_preview(&[0xff, 0x00, b'a', 0x10], 3);
        assert_eq!(
            binary,
            format!(
                "body (4 bytes, binary)\n00000000  {:<47}  |..a|\n... 1 more bytes not shown (--bytes)\n",
                "ff 00 61"
            )
        );
    }

    #[test]
    fn show_prints_the_envelope_properties_headers_and_body() {
        let mut envelope = Envelope::new("order.placed", "acemq@here", NOW - 5_000);
        envelope.attempt = 3;
        let mut app = FieldTable::default();
        app.insert("traceparent".into(), AMQPValue::LongString("00-ab".into()));
        let properties = set_aside_properties(
            &BasicProperties::default()
                .with_content_type("application/json".into())
                .with_headers(app),
            &envelope,
            "rejected: bad total",
        );
        let text = show(
            2,
            "orders.new.dlq",
            &properties,
            b"{}",
            100,
            "orders.new",
            NOW,
        );
        let field = |name: &str, value: &str| format!("  {name:<18}{value}\n");
        for expected in [
            "message 2 of orders.new.dlq\n".to_owned(),
            field("id", &envelope.id),
            field("type", "order.placed"),
            field("attempt", "3"),
            field("first seen", "2026-02-03T04:05:01.789Z (5s ago)"),
            field("origin", "acemq@here"),
            field("reason", "rejected: bad total"),
            field("content-type", "application/json"),
            "  traceparent = \"00-ab\"\n".to_owned(),
            "body (2 bytes, text)\n{}\n".to_owned(),
        ] {
            assert!(text.contains(&expected), "{expected:?} in\n{text}");
        }
        assert!(
            !text.contains(header::ATTEMPT),
            "the envelope is not repeated as headers"
        );
        assert!(!text.contains("replays"));
    }
}
