//! Routes orders: validates each JSON order and, for a valid one, publishes
//! an `order.accepted` event.
//!
//! - Body `{ "id": string, "customer": string, "total": number, ... }`; other
//!   fields are ignored.
//! - Not JSON, or a field missing or of the wrong type: reject, with serde's
//!   description (`missing field `total``).
//! - `total` zero or negative: reject, naming the order id.
//! - Otherwise: publish `{ id, customer, total, routed_at_ms }` to the
//!   exchange in config key `events_exchange` (default `orders.events`) with
//!   routing key `order.accepted`, and accept.
//!
//! One log line per decision.

use acemq_guest::prelude::*;
use serde::{Deserialize, Serialize};

/// Consumer config key naming the exchange events are published to.
const EVENTS_EXCHANGE_KEY: &str = "events_exchange";
const DEFAULT_EVENTS_EXCHANGE: &str = "orders.events";
const ACCEPTED_ROUTING_KEY: &str = "order.accepted";

/// The part of an order this plugin reads.
#[derive(Deserialize)]
struct Order {
    id: String,
    customer: String,
    total: f64,
}

/// The event published for an accepted order.
#[derive(Serialize)]
struct OrderAccepted<'a> {
    id: &'a str,
    customer: &'a str,
    total: f64,
    routed_at_ms: u64,
}

struct OrderRouter;

impl Handler for OrderRouter {
    fn handle(msg: Message) -> Result {
        // `route` logs an acceptance with its details; every decision that
        // ends it early (reject, or retry on a refused publish) is logged
        // here, so each message gets exactly one line.
        let decision = route(&msg);
        if let Err(outcome) = &decision {
            warn!("{outcome}");
        }
        decision
    }
}

fn route(msg: &Message) -> Result {
    let order: Order = msg.json()?;
    // JSON has no NaN, so `<=` catches every non-positive total.
    if order.total <= 0.0 {
        return reject(format_args!(
            "order {}: total must be positive, got {}",
            order.id, order.total
        ));
    }
    let exchange = config(EVENTS_EXCHANGE_KEY).unwrap_or_else(|| DEFAULT_EVENTS_EXCHANGE.into());
    publish(&exchange, ACCEPTED_ROUTING_KEY)
        .json(&OrderAccepted {
            id: &order.id,
            customer: &order.customer,
            total: order.total,
            routed_at_ms: now_ms(),
        })
        .send()?;
    info!(
        "order {} from {} (total {}) accepted: {ACCEPTED_ROUTING_KEY} to {exchange}",
        order.id, order.customer, order.total
    );
    accept()
}

acemq_guest::export_handler!(OrderRouter);

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_guest::log::Level;
    use acemq_guest::serde_json;
    use acemq_guest::testing::{self, Handled, TestHost};

    fn route(host: &TestHost, body: &str) -> Handled {
        host.handle::<OrderRouter>(testing::message(body))
    }

    #[test]
    fn valid_order_publishes_an_event_and_accepts() {
        let host = TestHost::new().now_ms(42);
        let done = route(
            &host,
            r#"{"id":"o-1","customer":"acme","total":12.5,"lines":[]}"#,
        );
        assert_eq!(done.outcome, Outcome::Accept);
        let [event] = &done.published[..] else {
            panic!("one event expected: {:?}", done.published)
        };
        assert_eq!(
            (event.exchange.as_str(), event.routing_key.as_str()),
            ("orders.events", "order.accepted")
        );
        assert_eq!(event.content_type.as_deref(), Some("application/json"));
        assert!(event.persistent);
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&event.body).unwrap(),
            json!({"id": "o-1", "customer": "acme", "total": 12.5, "routed_at_ms": 42})
        );
        assert_eq!(
            done.logs,
            [(
                Level::Info,
                "order o-1 from acme (total 12.5) accepted: order.accepted to orders.events".into()
            )]
        );
    }

    #[test]
    fn events_exchange_comes_from_config() {
        let host = TestHost::new().config("events_exchange", "shop.events");
        let done = route(&host, r#"{"id":"o-1","customer":"acme","total":1}"#);
        assert_eq!(done.outcome, Outcome::Accept);
        assert_eq!(done.published[0].exchange, "shop.events");
    }

    #[test]
    fn missing_field_is_rejected_by_name() {
        let done = route(&TestHost::new(), r#"{"id":"o-1","total":3}"#);
        assert_eq!(
            done.outcome,
            Outcome::Reject(
                "body is not a valid Order: missing field `customer` at line 1 column 22".into()
            )
        );
        assert!(done.published.is_empty());
        assert_eq!(done.logs.len(), 1);
        assert_eq!(done.logs[0].0, Level::Warn);
    }

    #[test]
    fn non_positive_total_is_rejected_with_the_id() {
        for total in ["0", "-4.5"] {
            let body = format!(r#"{{"id":"o-7","customer":"acme","total":{total}}}"#);
            let done = route(&TestHost::new(), &body);
            assert_eq!(
                done.outcome,
                Outcome::Reject(format!(
                    "order o-7: total must be positive, got {}",
                    total.parse::<f64>().unwrap()
                ))
            );
            assert!(done.published.is_empty());
            assert_eq!(
                done.logs,
                [(
                    Level::Warn,
                    format!("reject: {}", done.outcome.reason().unwrap())
                )]
            );
        }
    }

    #[test]
    fn not_json_is_rejected() {
        let done = route(&TestHost::new(), "<order/>");
        assert!(
            matches!(&done.outcome, Outcome::Reject(r) if r.starts_with("body is not a valid Order: expected value")),
            "{:?}",
            done.outcome
        );
    }

    #[test]
    fn refused_publish_is_retried() {
        let host = TestHost::new().publish_to(["elsewhere"]);
        let done = route(&host, r#"{"id":"o-1","customer":"acme","total":1}"#);
        assert!(
            matches!(&done.outcome, Outcome::Retry(r) if r.contains("`orders.events`")),
            "{:?}",
            done.outcome
        );
        assert_eq!(done.logs.len(), 1);
    }
}
