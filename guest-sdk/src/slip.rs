//! Reading the routing slip a message is on, in either of its wire forms.
//!
//! A routing slip lists the steps a message goes through. The host does
//! the forwarding: after the handler of a step accepts, it marks the step
//! done and sends the message on to the next one, in the form the message
//! arrived in. A plugin only reads the slip (to log where the message is,
//! say); it cannot change where the message goes next.

use core::fmt;

use serde::Deserialize;

use crate::bindings::wit_types::DeclaredRoute;
use crate::message::HeaderValue;
use crate::outcome::Outcome;

/// The application header of the JSON slip (the default writer of the
/// Python, Go and Ruby libraries).
pub const ROUTING_SLIP_HEADER: &str = "acemq-routing-slip";

/// A message's routing slip, read-only: the steps still to do (the first
/// is the one handling the message now) and those done.
/// See [`Message::routing_slip`](crate::Message::routing_slip).
#[derive(Clone, Debug, PartialEq)]
pub struct RoutingSlip {
    form: SlipForm,
    to_do: Vec<SlipStep>,
    done: Vec<DoneStep>,
}

/// Which of the two wire forms a slip came in; the host forwards it in the
/// same form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlipForm {
    /// The JSON header `acemq-routing-slip`:
    /// `{"steps":[{"exchange":..,"routingKey":..,"name":..}],"done":[..]}`.
    Json,
    /// Java's declared route (`x-acemq-route`, `x-acemq-route-position`,
    /// `x-acemq-route-id`), with the run's id when it has one.
    Declared {
        /// The pipeline run (`x-acemq-route-id`).
        id: Option<String>,
    },
}

/// One step of a slip.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlipStep {
    /// The step's name.
    pub name: String,
    /// The exchange the step is reached through, as the JSON slip names
    /// it. A declared route names its steps only (its pipeline's exchange
    /// is the pipeline name, the routing key the step name): `None`.
    pub exchange: Option<String>,
    /// The routing key the step is reached with (see `exchange`).
    pub routing_key: Option<String>,
}

/// A step the slip marks done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoneStep {
    /// The step.
    pub step: SlipStep,
    /// When it completed, as the slip wrote it (`completedAt`: the text of
    /// a string, or of a number); a declared route keeps no times: `None`.
    pub completed_at: Option<String>,
}

impl SlipStep {
    /// A step of a JSON slip, reached through `exchange` with `routing_key`.
    pub fn new(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        SlipStep {
            name: name.into(),
            exchange: Some(exchange.into()),
            routing_key: Some(routing_key.into()),
        }
    }
}

impl RoutingSlip {
    /// The form it came in.
    pub fn form(&self) -> &SlipForm {
        &self.form
    }

    /// The step handling the message now; `None` when the slip has no step
    /// left (the host then ends it without forwarding).
    pub fn current(&self) -> Option<&SlipStep> {
        self.to_do.first()
    }

    /// The step the host forwards the message to once this one accepts;
    /// `None` when the current step is the last.
    pub fn next(&self) -> Option<&SlipStep> {
        self.to_do.get(1)
    }

    /// The steps still to do, the current one first.
    pub fn steps(&self) -> &[SlipStep] {
        &self.to_do
    }

    /// The steps already done, oldest first.
    pub fn done(&self) -> &[DoneStep] {
        &self.done
    }

    /// The declared route of an envelope, as a slip: the steps before its
    /// position are done, the one at its position is current.
    pub(crate) fn from_declared(route: &DeclaredRoute) -> Self {
        let named = |name: &String| SlipStep {
            name: name.clone(),
            exchange: None,
            routing_key: None,
        };
        let position = (route.position as usize).min(route.steps.len());
        let (done, to_do) = route.steps.split_at(position);
        RoutingSlip {
            form: SlipForm::Declared {
                id: route.id.clone(),
            },
            to_do: to_do.iter().map(named).collect(),
            done: done
                .iter()
                .map(|name| DoneStep {
                    step: named(name),
                    completed_at: None,
                })
                .collect(),
        }
    }

    /// The JSON slip of the `acemq-routing-slip` header. Reading is
    /// tolerant, as the contract asks: a missing list is empty, a missing
    /// field absent, unknown fields are ignored.
    pub(crate) fn from_header(value: &HeaderValue) -> Result<Self, SlipError> {
        let bytes = value.as_bytes().ok_or_else(|| SlipError {
            problem: format!("header '{ROUTING_SLIP_HEADER}' is not text"),
        })?;
        let wire: WireSlip = serde_json::from_slice(bytes).map_err(|e| SlipError {
            problem: format!("header '{ROUTING_SLIP_HEADER}' is not a routing slip: {e}"),
        })?;
        Ok(RoutingSlip {
            form: SlipForm::Json,
            to_do: wire.steps.into_iter().map(WireStep::into_step).collect(),
            done: wire
                .done
                .into_iter()
                .map(|mut step| DoneStep {
                    completed_at: completed_at_text(step.completed_at.take()),
                    step: step.into_step(),
                })
                .collect(),
        })
    }
}

/// The JSON slip as the libraries write it.
#[derive(Deserialize)]
struct WireSlip {
    #[serde(default)]
    steps: Vec<WireStep>,
    #[serde(default)]
    done: Vec<WireStep>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireStep {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    exchange: Option<String>,
    #[serde(default)]
    routing_key: Option<String>,
    #[serde(default)]
    completed_at: Option<serde_json::Value>,
}

impl WireStep {
    fn into_step(self) -> SlipStep {
        SlipStep {
            name: self.name.unwrap_or_default(),
            exchange: self.exchange,
            routing_key: self.routing_key,
        }
    }
}

/// Libraries write `completedAt` as RFC 3339 text or epoch milliseconds.
fn completed_at_text(value: Option<serde_json::Value>) -> Option<String> {
    match value? {
        serde_json::Value::String(text) => Some(text),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A JSON slip that could not be read. Converts into [`Outcome::Reject`]:
/// the same header fails the same way on every retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlipError {
    problem: String,
}

impl fmt::Display for SlipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.problem)
    }
}

impl std::error::Error for SlipError {}

impl From<SlipError> for Outcome {
    fn from(e: SlipError) -> Self {
        Outcome::Reject(e.problem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn a_json_slip_shows_its_current_next_and_done_steps() {
        let header = HeaderValue::Text(
            r#"{"steps":[{"exchange":"work","routingKey":"enrich","name":"enrich"},
                        {"exchange":"work","routingKey":"store","name":"store","extra":1}],
                "done":[{"exchange":"work","routingKey":"check","name":"check",
                         "completedAt":"2026-02-03T04:05:06.789Z"},
                        {"name":"legacy","completedAt":1700000000000}]}"#
                .into(),
        );
        let slip = RoutingSlip::from_header(&header).unwrap();
        assert_eq!(slip.form(), &SlipForm::Json);
        assert_eq!(
            slip.current(),
            Some(&SlipStep::new("work", "enrich", "enrich"))
        );
        assert_eq!(slip.next(), Some(&SlipStep::new("work", "store", "store")));
        assert_eq!(slip.done()[0].step.name, "check");
        assert_eq!(
            slip.done()[0].completed_at.as_deref(),
            Some("2026-02-03T04:05:06.789Z")
        );
        assert_eq!(slip.done()[1].step.exchange, None);
        assert_eq!(
            slip.done()[1].completed_at.as_deref(),
            Some("1700000000000")
        );
    }

    #[test]
    fn a_declared_route_is_split_at_its_position() {
        let route = DeclaredRoute {
            steps: vec!["a".into(), "b".into(), "c".into()],
            position: 1,
            id: Some("run-1".into()),
        };
        let slip = RoutingSlip::from_declared(&route);
        assert_eq!(
            slip.form(),
            &SlipForm::Declared {
                id: Some("run-1".into())
            }
        );
        assert_eq!(slip.current().map(|s| s.name.as_str()), Some("b"));
        assert_eq!(slip.next().map(|s| s.name.as_str()), Some("c"));
        assert_eq!(slip.done().len(), 1);
        assert_eq!(slip.done()[0].step.name, "a");

        let past_the_end = DeclaredRoute {
            position: 7,
            ..route
        };
        let slip = RoutingSlip::from_declared(&past_the_end);
        assert_eq!((slip.current(), slip.done().len()), (None, 3));
    }

    #[test]
    fn an_unreadable_slip_is_a_reject_naming_the_header() {
        let err = RoutingSlip::from_header(&HeaderValue::Text("{steps".into())).unwrap_err();
        let outcome = Outcome::from(err);
        assert!(
            outcome
                .to_string()
                .starts_with("reject: header 'acemq-routing-slip' is not a routing slip: "),
            "{outcome}"
        );
        let err = RoutingSlip::from_header(&HeaderValue::Int(1)).unwrap_err();
        assert_eq!(err.to_string(), "header 'acemq-routing-slip' is not text");
    }

    #[test]
    fn a_message_shows_either_form_and_none_without_a_slip() {
        assert_eq!(testing::message("x").routing_slip(), Ok(None));
        let steps = [
            SlipStep::new("work", "one", "one"),
            SlipStep::new("work", "two", "two"),
        ];
        let msg = testing::on_json_slip(testing::message("x"), &steps, &[]);
        let slip = msg.routing_slip().unwrap().unwrap();
        assert_eq!(slip.steps(), steps);
        let msg = testing::on_declared_route(testing::message("x"), &["one", "two"], 0, None);
        let slip = msg.routing_slip().unwrap().unwrap();
        assert_eq!(slip.form(), &SlipForm::Declared { id: None });
        assert_eq!(slip.next().map(|s| s.name.as_str()), Some("two"));
    }
}
