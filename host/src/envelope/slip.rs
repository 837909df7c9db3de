//! Routing slips (contract §11): reading the slip a delivery carries, in
//! either of its two wire forms, and the copy that forwards it to its next
//! step once the step handling it now has accepted it.
//!
//! The two forms, both readable by every AceMQ library, and answered in the
//! form received:
//!
//! * **JSON** (the default writer of Python, Go and Ruby): the application
//!   header `acemq-routing-slip` =
//!   `{"steps":[{"exchange":…,"routingKey":…,"name":…}],"done":[…]}`. The
//!   first of `steps` is the step handling the message now; after an accept
//!   it moves to the end of `done` with `completedAt`, and the message goes
//!   to the new first step's exchange and routing key. No step left: the
//!   slip has ended.
//! * **Declared** (Java's pipelines): `x-acemq-route` (step names,
//!   comma-joined), `x-acemq-route-position` (from 0, the step handling it
//!   now) and `x-acemq-route-id`, read into the [`Envelope`]. The next step
//!   is at position + 1, published to the pipeline's (direct) exchange with
//!   the step's name as routing key; past the last step the slip has ended.
//!
//! Everything is checked when the delivery is read, before any plugin runs
//! ([`Slip::read`]): a slip that cannot be followed is a [`SlipError`]
//! naming what is wrong, and such a message is set aside before its handler
//! runs, so that no step does work (or publishes outputs) for a message
//! that could not then be forwarded. What remains once the handler has
//! accepted, [`Slip::next_hop`], cannot fail.
//!
//! Pure functions over lapin's types, unit-tested below; the settlement
//! publishes the hop (`delivery/settle.rs`).

use std::fmt;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use serde_json::{Map, Value};

use super::amqp::long_string;
use super::headers::HeaderValue;
use super::{Envelope, MAX_SHORT_STRING, header, republish_properties, rfc3339_millis};
use crate::topology::naming::{DEAD_LETTER_EXCHANGE, RETRY_EXCHANGE};

/// The application header of the JSON routing slip.
pub const ROUTING_SLIP_HEADER: &str = "acemq-routing-slip";

/// The slip a delivery carries, checked: every step it still has to take
/// can be published to.
#[derive(Debug, Clone, PartialEq)]
pub enum Slip {
    /// The `acemq-routing-slip` header, as read.
    Json(JsonSlip),
    /// Java's declared route, as read from the envelope.
    Declared(DeclaredRoute),
}

/// A JSON slip. The document is kept whole: fields this host does not know
/// (on the slip or on a step, from a newer library) ride along unchanged,
/// as every other application header does.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonSlip {
    document: Map<String, Value>,
    /// The steps still to take, the first being handled now; each one
    /// checked to have a text `exchange` and `routingKey`.
    steps: Vec<Map<String, Value>>,
    /// The steps taken, kept as written (they are history, not directions).
    done: Vec<Value>,
}

/// A declared route, checked: its position names one of its steps, and
/// the pipeline's exchange is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredRoute {
    pub steps: Vec<String>,
    pub position: usize,
    /// The pipeline's exchange the next step is published to.
    pub exchange: String,
}

/// Where the forwarded copy goes and what it carries that the delivery did
/// not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    pub exchange: String,
    pub routing_key: String,
    /// The name of the step it goes to (the routing key when a JSON step
    /// has no `name`), for logs.
    pub step: String,
    change: HopChange,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HopChange {
    /// The new `acemq-routing-slip` text.
    Json(String),
    /// The new `x-acemq-route-position`.
    Position(i64),
}

/// Why a delivery's slip cannot be followed. Each names the header and
/// what in it is wrong, for the `x-acemq-error` of the set-aside copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlipError {
    /// Both forms at once: following either could be the wrong one.
    BothForms,
    /// `acemq-routing-slip` is not text (an integer, a table…).
    NotText,
    /// `acemq-routing-slip` is not JSON.
    NotJson(String),
    /// Valid JSON, but not an object.
    NotAnObject,
    /// `steps` missing or not a list, or `done` not a list.
    NotAList(&'static str),
    /// `steps` is a list, but entry `index` is not an object.
    StepNotAnObject { index: usize },
    /// Step `index` lacks a text `field` (`exchange` or `routingKey`).
    StepField { index: usize, field: &'static str },
    /// Step `index`'s `field` is longer than AMQP allows.
    StepFieldTooLong { index: usize, field: &'static str },
    /// `x-acemq-route` names an empty step.
    EmptyRouteStep { route: String },
    /// `x-acemq-route` without a readable `x-acemq-route-position`.
    NoPosition { route: String },
    /// The position is negative or past the last step.
    PositionOutside {
        position: i64,
        route: String,
        steps: usize,
    },
    /// Neither the delivery's exchange nor its queue's name says which
    /// pipeline's exchange the next step is on.
    NoPipelineExchange {
        exchange: String,
        queue: String,
        step: String,
    },
}

impl fmt::Display for SlipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let slip = ROUTING_SLIP_HEADER;
        match self {
            SlipError::BothForms => write!(
                f,
                "it carries both a routing slip ({slip}) and a declared route ({}); which one \
                 to follow is not clear",
                header::ROUTE
            ),
            SlipError::NotText => write!(f, "the {slip} header is not text"),
            SlipError::NotJson(why) => write!(f, "the {slip} header is not valid JSON: {why}"),
            SlipError::NotAnObject => write!(f, "the {slip} header is not a JSON object"),
            SlipError::NotAList(field) => {
                write!(f, "the {slip} header's \"{field}\" is not a list")
            }
            SlipError::StepNotAnObject { index } => {
                write!(f, "step {index} of the {slip} header is not an object")
            }
            SlipError::StepField { index, field } => write!(
                f,
                "step {index} of the {slip} header has no \"{field}\" text"
            ),
            SlipError::StepFieldTooLong { index, field } => write!(
                f,
                "step {index} of the {slip} header has a \"{field}\" longer than \
                 {MAX_SHORT_STRING} bytes"
            ),
            SlipError::EmptyRouteStep { route } => write!(
                f,
                "the declared route {} = '{route}' names an empty step",
                header::ROUTE
            ),
            SlipError::NoPosition { route } => write!(
                f,
                "the declared route {} = '{route}' comes without a readable {}",
                header::ROUTE,
                header::ROUTE_POSITION
            ),
            SlipError::PositionOutside {
                position,
                route,
                steps,
            } => write!(
                f,
                "{} = {position} is not a step of the declared route {} = '{route}' \
                 ({steps} steps, positions from 0)",
                header::ROUTE_POSITION,
                header::ROUTE
            ),
            SlipError::NoPipelineExchange {
                exchange,
                queue,
                step,
            } => write!(
                f,
                "the declared route's exchange is not known: the message came through \
                 exchange '{exchange}', not a pipeline's, and its queue '{queue}' is not named \
                 {{pipeline}}.{step}"
            ),
        }
    }
}

impl std::error::Error for SlipError {}

/// Where the delivery was consumed, which a declared route needs to find
/// its pipeline's exchange.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'a> {
    /// The exchange the delivery came through.
    pub exchange: &'a str,
    /// The queue it was consumed from.
    pub queue: &'a str,
}

impl Slip {
    /// The slip of a delivery, checked; `None` when it carries none.
    ///
    /// Reading is strict here, unlike the envelope's: the envelope's
    /// defaults keep a message readable, but a guessed step would send it
    /// somewhere nobody asked for.
    pub fn read(
        headers: Option<&FieldTable>,
        envelope: &Envelope,
        arrival: Arrival<'_>,
    ) -> Result<Option<Self>, SlipError> {
        let json = headers.and_then(|table| table.inner().get(ROUTING_SLIP_HEADER));
        match (json, envelope.route.as_deref()) {
            (None, None) => Ok(None),
            (Some(_), Some(_)) => Err(SlipError::BothForms),
            (Some(value), None) => JsonSlip::read(value).map(|slip| Some(Slip::Json(slip))),
            (None, Some(route)) => DeclaredRoute::read(route, envelope.route_position, arrival)
                .map(|route| Some(Slip::Declared(route))),
        }
    }

    /// Where the message goes once the current step accepted it, the step
    /// marked done at `now_ms`; `None` when that was the last step.
    #[must_use]
    pub fn next_hop(&self, now_ms: u64) -> Option<Hop> {
        match self {
            Slip::Json(slip) => slip.next_hop(now_ms),
            Slip::Declared(route) => route.next_hop(),
        }
    }
}

impl JsonSlip {
    fn read(value: &AMQPValue) -> Result<Self, SlipError> {
        let text = match HeaderValue::from_amqp(value) {
            Some(HeaderValue::Text(text)) => text,
            Some(HeaderValue::Bytes(bytes)) => {
                String::from_utf8(bytes).map_err(|_| SlipError::NotText)?
            }
            _ => return Err(SlipError::NotText),
        };
        let document: Value =
            serde_json::from_str(&text).map_err(|e| SlipError::NotJson(e.to_string()))?;
        let Value::Object(mut document) = document else {
            return Err(SlipError::NotAnObject);
        };
        let steps = match document.remove("steps") {
            Some(Value::Array(steps)) => steps,
            _ => return Err(SlipError::NotAList("steps")),
        };
        let done = match document.remove("done") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(done)) => done,
            Some(_) => return Err(SlipError::NotAList("done")),
        };
        let steps = steps
            .into_iter()
            .enumerate()
            .map(|(index, step)| checked_step(index, step))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            document,
            steps,
            done,
        })
    }

    fn next_hop(&self, now_ms: u64) -> Option<Hop> {
        let (handled, rest) = self.steps.split_first()?;
        let next = rest.first()?;
        let mut finished = handled.clone();
        finished.insert("completedAt".into(), Value::String(rfc3339_millis(now_ms)));
        let mut done = self.done.clone();
        done.push(Value::Object(finished));
        let mut document = self.document.clone();
        document.insert(
            "steps".into(),
            Value::Array(rest.iter().cloned().map(Value::Object).collect()),
        );
        document.insert("done".into(), Value::Array(done));
        let text = |field: &str| next[field].as_str().unwrap_or_default().to_owned();
        let routing_key = text("routingKey");
        Some(Hop {
            exchange: text("exchange"),
            step: next
                .get("name")
                .and_then(Value::as_str)
                .map_or_else(|| routing_key.clone(), str::to_owned),
            routing_key,
            change: HopChange::Json(Value::Object(document).to_string()),
        })
    }
}

/// Step `index` of a JSON slip, when it has a text `exchange` (the default
/// exchange's empty name included) and `routingKey`, each short enough to
/// publish with.
fn checked_step(index: usize, step: Value) -> Result<Map<String, Value>, SlipError> {
    let Value::Object(step) = step else {
        return Err(SlipError::StepNotAnObject { index });
    };
    for field in ["exchange", "routingKey"] {
        let value = step
            .get(field)
            .and_then(Value::as_str)
            .ok_or(SlipError::StepField { index, field })?;
        if value.len() > MAX_SHORT_STRING {
            return Err(SlipError::StepFieldTooLong { index, field });
        }
    }
    Ok(step)
}

impl DeclaredRoute {
    fn read(route: &str, position: Option<i64>, arrival: Arrival<'_>) -> Result<Self, SlipError> {
        let steps: Vec<String> = route.split(',').map(|s| s.trim().to_owned()).collect();
        if steps
            .iter()
            .any(|s| s.is_empty() || s.len() > MAX_SHORT_STRING)
        {
            return Err(SlipError::EmptyRouteStep {
                route: route.to_owned(),
            });
        }
        let position = position.ok_or_else(|| SlipError::NoPosition {
            route: route.to_owned(),
        })?;
        let index = usize::try_from(position)
            .ok()
            .filter(|&p| p < steps.len())
            .ok_or_else(|| SlipError::PositionOutside {
                position,
                route: route.to_owned(),
                steps: steps.len(),
            })?;
        let exchange = pipeline_exchange(arrival, &steps[index])?;
        Ok(Self {
            steps,
            position: index,
            exchange,
        })
    }

    fn next_hop(&self) -> Option<Hop> {
        let next = self.steps.get(self.position + 1)?;
        Some(Hop {
            exchange: self.exchange.clone(),
            routing_key: next.clone(),
            step: next.clone(),
            change: HopChange::Position(i64::try_from(self.position + 1).unwrap_or(i64::MAX)),
        })
    }
}

/// The exchange of the pipeline a declared route runs on: the delivery's
/// own exchange, which is the pipeline's when a step forwarded it there.
///
/// Not when it came through the default exchange or one of the
/// dead-letter exchanges: then it is a retry or replay copy, republished
/// straight to the queue (contract §5). The contract names a pipeline's
/// queues `{pipeline}.{step}`, so the queue's name, less the current step,
/// is the pipeline.
fn pipeline_exchange(arrival: Arrival<'_>, current: &str) -> Result<String, SlipError> {
    let republished = ["", RETRY_EXCHANGE, DEAD_LETTER_EXCHANGE].contains(&arrival.exchange);
    if !republished {
        return Ok(arrival.exchange.to_owned());
    }
    arrival
        .queue
        .strip_suffix(current)
        .and_then(|rest| rest.strip_suffix('.'))
        .filter(|pipeline| !pipeline.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| SlipError::NoPipelineExchange {
            exchange: arrival.exchange.to_owned(),
            queue: arrival.queue.to_owned(),
            step: current.to_owned(),
        })
}

impl Envelope {
    /// The envelope of the copy forwarded to a slip's next step: the same
    /// message going on to its next piece of work, so the same id (each
    /// step's consumer de-duplicates on it), correlation, causation, type
    /// and first-seen (the age limit counts from the first publish); the
    /// attempt back to 1, since the next step has not tried it yet, and any
    /// `x-acemq-error` cleared, as on a retry copy.
    #[must_use]
    pub fn for_hop(&self) -> Self {
        Self {
            attempt: 1,
            error: None,
            ..self.clone()
        }
    }
}

/// The properties of the copy forwarded on `hop`: the delivery's
/// ([`republish_properties`], so its application headers, content type and
/// conversation properties ride along, body unchanged) with
/// [`Envelope::for_hop`] and the slip advanced in the form received.
#[must_use]
pub fn hop_properties(
    original: &BasicProperties,
    envelope: &Envelope,
    hop: &Hop,
) -> BasicProperties {
    let mut envelope = envelope.for_hop();
    let mut headers = original.headers().clone().unwrap_or_default();
    match &hop.change {
        HopChange::Json(slip) => {
            headers.insert(ROUTING_SLIP_HEADER.into(), long_string(slip));
        }
        HopChange::Position(position) => envelope.route_position = Some(*position),
    }
    republish_properties(&original.clone().with_headers(headers), &envelope)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::test_support::{NOW, get, headers_of, ls, table};
    use crate::envelope::{parse_rfc3339_ms, split_headers};
    use lapin::types::{ByteArray, LongString};

    const PIPELINE: Arrival<'static> = Arrival {
        exchange: "orders",
        queue: "orders.validate",
    };

    fn plain() -> Envelope {
        Envelope::new("order", "", NOW - 5_000)
    }

    fn declared(route: &str, position: Option<i64>) -> Envelope {
        Envelope {
            route: Some(route.into()),
            route_position: position,
            route_id: Some("run-1".into()),
            ..plain()
        }
    }

    fn json_headers(slip: &str) -> FieldTable {
        table(vec![
            (ROUTING_SLIP_HEADER, ls(slip)),
            ("traceparent", ls("tp")),
        ])
    }

    fn read_json(slip: &str) -> Result<Option<Slip>, SlipError> {
        Slip::read(Some(&json_headers(slip)), &plain(), PIPELINE)
    }

    const THREE_STEPS: &str = r#"{"steps":[
        {"exchange":"ex-a","routingKey":"a","name":"first"},
        {"exchange":"ex-b","routingKey":"b","name":"second","extra":7},
        {"exchange":"","routingKey":"queue-c"}],
        "done":[], "owner":"someone"}"#;

    fn slip_of(properties: &BasicProperties) -> Value {
        match get(headers_of(properties), ROUTING_SLIP_HEADER) {
            Some(AMQPValue::LongString(s)) => serde_json::from_slice(s.as_bytes()).unwrap(),
            other => panic!("no slip header: {other:?}"),
        }
    }

    #[test]
    fn no_slip_in_either_form_is_none() {
        let headers = table(vec![("traceparent", ls("tp"))]);
        assert_eq!(Slip::read(Some(&headers), &plain(), PIPELINE), Ok(None));
        assert_eq!(Slip::read(None, &plain(), PIPELINE), Ok(None));
    }

    #[test]
    fn a_json_slip_forwards_to_the_next_step_and_marks_the_handled_one_done() {
        let slip = read_json(THREE_STEPS).unwrap().unwrap();
        let hop = slip.next_hop(NOW).unwrap();
        assert_eq!(
            (
                hop.exchange.as_str(),
                hop.routing_key.as_str(),
                hop.step.as_str()
            ),
            ("ex-b", "b", "second")
        );
        let delivered = BasicProperties::default()
            .with_headers(json_headers(THREE_STEPS))
            .with_content_type("text/plain".into());
        let properties = hop_properties(&delivered, &plain(), &hop);
        let written = slip_of(&properties);
        assert_eq!(
            written["steps"],
            serde_json::json!([
                {"exchange":"ex-b","routingKey":"b","name":"second","extra":7},
                {"exchange":"","routingKey":"queue-c"}
            ])
        );
        assert_eq!(
            written["done"],
            serde_json::json!([{"exchange":"ex-a","routingKey":"a","name":"first",
                "completedAt":"2026-02-03T04:05:06.789Z"}])
        );
        // What the host does not know rides along.
        assert_eq!(written["owner"], "someone");
        assert_eq!(
            parse_rfc3339_ms(written["done"][0]["completedAt"].as_str().unwrap()),
            Some(NOW)
        );
        // The other headers and properties go on as on any republish.
        assert_eq!(get(headers_of(&properties), "traceparent"), Some(&ls("tp")));
        assert_eq!(
            properties.content_type().as_ref().unwrap().as_str(),
            "text/plain"
        );
    }

    #[test]
    fn the_next_hop_of_a_json_slip_appends_to_what_is_done_and_ends_after_the_last_step() {
        let slip = read_json(THREE_STEPS).unwrap().unwrap();
        let mut properties = BasicProperties::default().with_headers(json_headers(THREE_STEPS));
        let mut hops = Vec::new();
        let mut at = NOW;
        loop {
            let slip = Slip::read(properties.headers().as_ref(), &plain(), PIPELINE)
                .unwrap()
                .unwrap();
            let Some(hop) = slip.next_hop(at) else { break };
            properties = hop_properties(&properties, &plain(), &hop);
            hops.push(hop.routing_key);
            at += 1_000;
        }
        assert_eq!(hops, ["b", "queue-c"]);
        let written = slip_of(&properties);
        assert_eq!(
            written["steps"],
            serde_json::json!([{"exchange":"","routingKey":"queue-c"}])
        );
        let done: Vec<&str> = written["done"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["routingKey"].as_str().unwrap())
            .collect();
        assert_eq!(done, ["a", "b"]);
        assert_eq!(
            written["done"][1]["completedAt"],
            "2026-02-03T04:05:07.789Z"
        );
        // The first read slip says the same about its own next hop.
        assert_eq!(slip.next_hop(NOW).unwrap().routing_key, "b");
    }

    #[test]
    fn a_json_slip_without_steps_left_or_on_its_last_step_has_ended() {
        let last = r#"{"steps":[{"exchange":"x","routingKey":"k"}],"done":[]}"#;
        assert_eq!(read_json(last).unwrap().unwrap().next_hop(NOW), None);
        let finished = r#"{"steps":[],"done":[{"exchange":"x","routingKey":"k"}]}"#;
        assert_eq!(read_json(finished).unwrap().unwrap().next_hop(NOW), None);
        // `done` may be absent or null: nothing done yet.
        let fresh =
            r#"{"steps":[{"exchange":"x","routingKey":"k"},{"exchange":"y","routingKey":"j"}]}"#;
        let hop = read_json(fresh).unwrap().unwrap().next_hop(NOW).unwrap();
        assert_eq!(hop.step, "j", "a step without a name is named by its key");
    }

    #[test]
    fn a_json_slip_is_read_from_bytes_too() {
        let headers = table(vec![(
            ROUTING_SLIP_HEADER,
            AMQPValue::ByteArray(ByteArray::from(THREE_STEPS.as_bytes())),
        )]);
        assert!(matches!(
            Slip::read(Some(&headers), &plain(), PIPELINE),
            Ok(Some(Slip::Json(_)))
        ));
    }

    #[test]
    fn an_unreadable_json_slip_says_what_is_wrong() {
        let cases: [(&str, &str); 9] = [
            (
                "not json",
                "the acemq-routing-slip header is not valid JSON: expected ident at line 1 column 2",
            ),
            ("[1]", "the acemq-routing-slip header is not a JSON object"),
            (
                r#"{"done":[]}"#,
                "the acemq-routing-slip header's \"steps\" is not a list",
            ),
            (
                r#"{"steps":{}}"#,
                "the acemq-routing-slip header's \"steps\" is not a list",
            ),
            (
                r#"{"steps":[],"done":3}"#,
                "the acemq-routing-slip header's \"done\" is not a list",
            ),
            (
                r#"{"steps":["a"]}"#,
                "step 0 of the acemq-routing-slip header is not an object",
            ),
            (
                r#"{"steps":[{"exchange":"x","routingKey":"k"},{"routingKey":"k"}]}"#,
                "step 1 of the acemq-routing-slip header has no \"exchange\" text",
            ),
            (
                r#"{"steps":[{"exchange":"x","routingKey":5}]}"#,
                "step 0 of the acemq-routing-slip header has no \"routingKey\" text",
            ),
            (
                r#"{"steps":[{"exchange":"x"}]}"#,
                "step 0 of the acemq-routing-slip header has no \"routingKey\" text",
            ),
        ];
        for (slip, expected) in cases {
            assert_eq!(read_json(slip).unwrap_err().to_string(), expected, "{slip}");
        }
        let long = format!(
            r#"{{"steps":[{{"exchange":"{}","routingKey":"k"}}]}}"#,
            "x".repeat(256)
        );
        assert_eq!(
            read_json(&long).unwrap_err(),
            SlipError::StepFieldTooLong {
                index: 0,
                field: "exchange"
            }
        );
        let not_text = table(vec![(ROUTING_SLIP_HEADER, AMQPValue::LongLongInt(1))]);
        assert_eq!(
            Slip::read(Some(&not_text), &plain(), PIPELINE)
                .unwrap_err()
                .to_string(),
            "the acemq-routing-slip header is not text"
        );
        let not_utf8 = table(vec![(
            ROUTING_SLIP_HEADER,
            AMQPValue::LongString(LongString::from(vec![0xff])),
        )]);
        assert_eq!(
            Slip::read(Some(&not_utf8), &plain(), PIPELINE),
            Err(SlipError::NotText)
        );
    }

    #[test]
    fn both_forms_at_once_are_refused() {
        let error = Slip::read(
            Some(&json_headers(THREE_STEPS)),
            &declared("validate,price", Some(0)),
            PIPELINE,
        )
        .unwrap_err();
        assert_eq!(error, SlipError::BothForms);
        assert!(error.to_string().contains("acemq-routing-slip"));
        assert!(error.to_string().contains("x-acemq-route"));
    }

    #[test]
    fn a_declared_route_goes_on_to_the_next_step_on_the_pipelines_exchange() {
        let envelope = declared("validate,price,ship", Some(0));
        let slip = Slip::read(None, &envelope, PIPELINE).unwrap().unwrap();
        let hop = slip.next_hop(NOW).unwrap();
        assert_eq!(
            (
                hop.exchange.as_str(),
                hop.routing_key.as_str(),
                hop.step.as_str()
            ),
            ("orders", "price", "price")
        );
        let delivered = BasicProperties::default()
            .with_headers(envelope.to_headers(&table(vec![("traceparent", ls("tp"))])));
        let properties = hop_properties(&delivered, &envelope, &hop);
        let forwarded = Envelope::read(&properties, "price", NOW);
        assert_eq!(forwarded.route.as_deref(), Some("validate,price,ship"));
        assert_eq!(forwarded.route_position, Some(1));
        assert_eq!(forwarded.route_id.as_deref(), Some("run-1"));
        assert_eq!(forwarded.id, envelope.id);
        assert_eq!(
            get(headers_of(&properties), header::ROUTE_POSITION),
            Some(&AMQPValue::LongLongInt(1))
        );
        // No JSON slip appears on a declared route's copy.
        assert!(
            split_headers(&properties)
                .visible
                .iter()
                .all(|(name, _)| name != ROUTING_SLIP_HEADER)
        );

        let last = declared("validate,price,ship", Some(2));
        let slip = Slip::read(
            None,
            &last,
            Arrival {
                exchange: "orders",
                queue: "orders.ship",
            },
        );
        assert_eq!(slip.unwrap().unwrap().next_hop(NOW), None);
    }

    #[test]
    fn a_retried_declared_route_finds_its_pipeline_from_the_queue_name() {
        // A retry or replay copy arrives through the default exchange, a
        // broker retry through acemq.retry: neither is the pipeline's.
        for exchange in ["", "acemq.retry", "acemq.dlx"] {
            let arrival = Arrival {
                exchange,
                queue: "orders.price",
            };
            let slip = Slip::read(None, &declared("validate, price ,ship", Some(1)), arrival)
                .unwrap()
                .unwrap();
            let hop = slip.next_hop(NOW).unwrap();
            assert_eq!(
                (hop.exchange.as_str(), hop.routing_key.as_str()),
                ("orders", "ship")
            );
        }
        let arrival = Arrival {
            exchange: "",
            queue: "somewhere",
        };
        let error = Slip::read(None, &declared("validate,price", Some(0)), arrival).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the declared route's exchange is not known: the message came through exchange '', \
             not a pipeline's, and its queue 'somewhere' is not named {pipeline}.validate"
        );
    }

    #[test]
    fn an_unfollowable_declared_route_says_what_is_wrong() {
        let read = |route: &str, position| Slip::read(None, &declared(route, position), PIPELINE);
        assert_eq!(
            read("a,b", None).unwrap_err().to_string(),
            "the declared route x-acemq-route = 'a,b' comes without a readable x-acemq-route-position"
        );
        assert_eq!(
            read("a,b", Some(2)).unwrap_err().to_string(),
            "x-acemq-route-position = 2 is not a step of the declared route x-acemq-route = 'a,b' \
             (2 steps, positions from 0)"
        );
        assert!(matches!(
            read("a,b", Some(-1)),
            Err(SlipError::PositionOutside { position: -1, .. })
        ));
        assert_eq!(
            read("a,,b", Some(0)).unwrap_err().to_string(),
            "the declared route x-acemq-route = 'a,,b' names an empty step"
        );
    }

    #[test]
    fn the_forwarded_copy_starts_its_attempts_again_and_keeps_the_rest() {
        let envelope = Envelope {
            attempt: 3,
            error: Some("old".into()),
            causation_id: Some("cause".into()),
            ..plain()
        };
        let hop_copy = envelope.for_hop();
        assert_eq!(hop_copy.attempt, 1);
        assert_eq!(hop_copy.error, None);
        assert_eq!(
            Envelope {
                attempt: 3,
                error: Some("old".into()),
                ..hop_copy
            },
            envelope
        );
    }
}
