//! A captured delivery for `plugin run --message FILE`: a message as
//! RabbitMQ's own tools print it, so an author replays the very message that
//! misbehaved instead of retyping its headers as flags.
//!
//! The format is the one of the management UI's "Get messages" and
//! `rabbitmqadmin get ... --format=raw_json` (a JSON object, or an array
//! whose first object is used):
//!
//! ```json
//! {"exchange": "orders", "routing_key": "order.placed",
//!  "payload": "{\"id\":\"A-1\"}", "payload_encoding": "string",
//!  "properties": {"content_type": "application/json",
//!                 "message_id": "m-1", "headers": {"x-acemq-attempt": 2}}}
//! ```
//!
//! Every member is optional. `payload_encoding` is `string` (the default)
//! or `base64`. Header values become the AMQP types a JSON value can say:
//! text a long string, a whole number a signed 64-bit integer (the envelope
//! reads any integer width), `true`/`false` a boolean, a fraction a double,
//! an array a field array, an object a nested table, `null` void.
//!
//! Pure: text in, properties out.

use base64::Engine as _;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray, FieldTable};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

use crate::envelope::MAX_SHORT_STRING;

/// What the file says about the message.
#[derive(Debug, Clone, Default)]
pub struct CapturedDelivery {
    pub properties: BasicProperties,
    pub body: Option<Vec<u8>>,
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Message {
    payload: Option<String>,
    payload_encoding: Option<String>,
    #[serde(default)]
    properties: Properties,
    exchange: Option<String>,
    routing_key: Option<String>,
    // Printed by the tools; they say nothing the run needs, and are
    // accepted so that a typo anywhere else is still refused.
    #[serde(rename = "payload_bytes", default)]
    _payload_bytes: IgnoredAny,
    #[serde(rename = "redelivered", default)]
    _redelivered: IgnoredAny,
    #[serde(rename = "message_count", default)]
    _message_count: IgnoredAny,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Properties {
    content_type: Option<String>,
    content_encoding: Option<String>,
    #[serde(default)]
    headers: serde_json::Map<String, Value>,
    delivery_mode: Option<u8>,
    priority: Option<u8>,
    correlation_id: Option<String>,
    reply_to: Option<String>,
    expiration: Option<String>,
    message_id: Option<String>,
    timestamp: Option<u64>,
    #[serde(rename = "type")]
    kind: Option<String>,
    user_id: Option<String>,
    app_id: Option<String>,
}

/// Reads a captured delivery from the file's text. Errors say what is
/// wrong and where (serde's line and column, or the header's name).
pub fn parse(text: &str) -> Result<CapturedDelivery, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let value = match value {
        Value::Array(mut messages) if !messages.is_empty() => messages.swap_remove(0),
        Value::Array(_) => return Err("an empty list: no message in it".into()),
        other => other,
    };
    let message: Message = serde_json::from_value(value).map_err(|e| {
        format!(
            "not a captured message ({e}); expected the JSON of the management UI's \"Get \
             messages\" or `rabbitmqadmin get --format=raw_json`"
        )
    })?;
    let body = match (message.payload, message.payload_encoding.as_deref()) {
        (None, _) => None,
        (Some(text), None | Some("string")) => Some(text.into_bytes()),
        (Some(text), Some("base64")) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|e| format!("payload: not base64 ({e})"))?,
        ),
        (Some(_), Some(other)) => {
            return Err(format!(
                "payload_encoding: '{other}' is not one of 'string' or 'base64'"
            ));
        }
    };
    Ok(CapturedDelivery {
        properties: properties(message.properties)?,
        body,
        exchange: message.exchange,
        routing_key: message.routing_key,
    })
}

fn properties(p: Properties) -> Result<BasicProperties, String> {
    let mut headers = FieldTable::default();
    for (name, value) in &p.headers {
        headers.insert(
            name.as_str().into(),
            amqp_value(value).map_err(|e| format!("header '{name}': {e}"))?,
        );
    }
    let mut properties = BasicProperties::default().with_headers(headers);
    let text = |name: &str, value: String| -> Result<lapin::types::ShortString, String> {
        if value.len() > MAX_SHORT_STRING {
            return Err(format!(
                "properties.{name}: {} bytes, longer than the {MAX_SHORT_STRING} an AMQP property holds",
                value.len()
            ));
        }
        Ok(value.into())
    };
    if let Some(v) = p.content_type {
        properties = properties.with_content_type(text("content_type", v)?);
    }
    if let Some(v) = p.content_encoding {
        properties = properties.with_content_encoding(text("content_encoding", v)?);
    }
    if let Some(v) = p.delivery_mode {
        properties = properties.with_delivery_mode(v);
    }
    if let Some(v) = p.priority {
        properties = properties.with_priority(v);
    }
    if let Some(v) = p.correlation_id {
        properties = properties.with_correlation_id(text("correlation_id", v)?);
    }
    if let Some(v) = p.reply_to {
        properties = properties.with_reply_to(text("reply_to", v)?);
    }
    if let Some(v) = p.expiration {
        properties = properties.with_expiration(text("expiration", v)?);
    }
    if let Some(v) = p.message_id {
        properties = properties.with_message_id(text("message_id", v)?);
    }
    if let Some(v) = p.timestamp {
        properties = properties.with_timestamp(v);
    }
    if let Some(v) = p.kind {
        properties = properties.with_type(text("type", v)?);
    }
    if let Some(v) = p.user_id {
        properties = properties.with_user_id(text("user_id", v)?);
    }
    if let Some(v) = p.app_id {
        properties = properties.with_app_id(text("app_id", v)?);
    }
    Ok(properties)
}

fn amqp_value(value: &Value) -> Result<AMQPValue, String> {
    Ok(match value {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::String(s) => AMQPValue::LongString(s.as_str().into()),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => AMQPValue::LongLongInt(i),
            (None, Some(_)) if n.is_u64() => {
                return Err(format!("{n} is larger than a signed 64-bit integer"));
            }
            (None, Some(f)) => AMQPValue::Double(f),
            (None, None) => return Err(format!("{n} is not a number AMQP can carry")),
        },
        Value::Array(items) => {
            let mut array = FieldArray::default();
            for item in items {
                array.push(amqp_value(item)?);
            }
            AMQPValue::FieldArray(array)
        }
        Value::Object(members) => {
            let mut table = FieldTable::default();
            for (name, item) in members {
                table.insert(name.as_str().into(), amqp_value(item)?);
            }
            AMQPValue::FieldTable(table)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'p>(properties: &'p BasicProperties, name: &str) -> Option<&'p AMQPValue> {
        properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(name))
    }

    #[test]
    fn a_message_from_rabbitmqadmin_gives_body_properties_and_route() {
        let captured = parse(
            r#"[{"payload_bytes": 12, "redelivered": true, "exchange": "orders",
                 "routing_key": "order.placed", "message_count": 3,
                 "properties": {"content_type": "application/json", "message_id": "m-1",
                                "delivery_mode": 2, "type": "order.placed",
                                "headers": {"x-acemq-attempt": 2, "tenant": "acme",
                                            "x-death": [{"count": 1, "reason": "rejected"}],
                                            "vip": true, "score": 0.5, "none": null}},
                 "payload": "{\"id\":\"A-1\"}", "payload_encoding": "string"}]"#,
        )
        .unwrap();
        assert_eq!(captured.body.as_deref(), Some(&b"{\"id\":\"A-1\"}"[..]));
        assert_eq!(captured.exchange.as_deref(), Some("orders"));
        assert_eq!(captured.routing_key.as_deref(), Some("order.placed"));
        let p = &captured.properties;
        assert_eq!(
            p.content_type().as_ref().unwrap().as_str(),
            "application/json"
        );
        assert_eq!(p.message_id().as_ref().unwrap().as_str(), "m-1");
        assert_eq!(p.kind().as_ref().unwrap().as_str(), "order.placed");
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(
            header(p, "x-acemq-attempt"),
            Some(&AMQPValue::LongLongInt(2))
        );
        assert_eq!(
            header(p, "tenant"),
            Some(&AMQPValue::LongString("acme".into()))
        );
        assert_eq!(header(p, "vip"), Some(&AMQPValue::Boolean(true)));
        assert_eq!(header(p, "score"), Some(&AMQPValue::Double(0.5)));
        assert_eq!(header(p, "none"), Some(&AMQPValue::Void));
        let Some(AMQPValue::FieldArray(deaths)) = header(p, "x-death") else {
            panic!("x-death: {:?}", header(p, "x-death"));
        };
        assert!(matches!(deaths.as_slice(), [AMQPValue::FieldTable(_)]));
    }

    #[test]
    fn a_base64_payload_is_decoded_and_every_member_is_optional() {
        let captured = parse(r#"{"payload": "AAH/", "payload_encoding": "base64"}"#).unwrap();
        assert_eq!(captured.body.as_deref(), Some(&[0u8, 1, 255][..]));
        let empty = parse("{}").unwrap();
        assert!(empty.body.is_none() && empty.exchange.is_none());
    }

    #[test]
    fn what_is_wrong_is_named() {
        for (text, named) in [
            ("{", "not JSON"),
            ("[]", "an empty list"),
            (r#"{"body": "x"}"#, "unknown field `body`"),
            (
                r#"{"payload": "x", "payload_encoding": "hex"}"#,
                "'hex' is not one of",
            ),
            (
                r#"{"payload": "!!", "payload_encoding": "base64"}"#,
                "payload: not base64",
            ),
            (
                r#"{"properties": {"headers": {"big": 18446744073709551615}}}"#,
                "header 'big': 18446744073709551615 is larger",
            ),
            (
                r#"{"properties": {"delivery_mode": "two"}}"#,
                "not a captured message",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(named), "{text}: {err}");
        }
        let long = format!(
            r#"{{"properties": {{"message_id": "{}"}}}}"#,
            "x".repeat(300)
        );
        assert!(
            parse(&long)
                .unwrap_err()
                .contains("properties.message_id: 300 bytes")
        );
    }
}
