//! A handler of contract 0.3 (`acemq:plugin@0.3.0`, `wit/v0.3/plugin.wit`),
//! written with plain `wit-bindgen` rather than the guest SDK (which moves
//! with the host): a stand-in for a plugin built before the host was
//! upgraded, which must still load and run unchanged.
//!
//! Echoes every message: publishes its body, content type and headers to
//! the exchange in config key `exchange` (default `legacy.out`) with the
//! input's routing key and the message type `legacy.echo` (0.3's one
//! envelope field), logs `echoed <id>`, and accepts. A publish the host
//! refuses becomes a retry with its reason.
//!
//! Only the wasm build has anything in it: natively (`cargo test` in this
//! workspace) the host's imports have nothing to link against, and the SDK's
//! native stand-ins are exactly what this plugin does without.
#![cfg(target_family = "wasm")]

wit_bindgen::generate!({
    world: "handler-plugin",
    path: "../../wit/v0.3",
});

use acemq::plugin::host::{self, Level};
use acemq::plugin::types::{Message, Outcome, Outgoing};

const EXCHANGE_KEY: &str = "exchange";
const DEFAULT_EXCHANGE: &str = "legacy.out";
const MESSAGE_TYPE: &str = "legacy.echo";

struct LegacyEcho;

impl exports::acemq::plugin::handler::Guest for LegacyEcho {
    fn handle(msg: Message) -> Outcome {
        let envelope = msg.envelope();
        let delivery = msg.delivery();
        let exchange = host::config(EXCHANGE_KEY).unwrap_or_else(|| DEFAULT_EXCHANGE.to_string());
        let echo = Outgoing {
            exchange,
            routing_key: delivery.routing_key,
            body: msg.body(),
            content_type: msg.content_type(),
            headers: msg.headers(),
            message_type: Some(MESSAGE_TYPE.to_string()),
            persistent: true,
            mandatory: None,
        };
        if let Err(why) = host::publish(&echo) {
            return Outcome::Retry(why);
        }
        host::log(Level::Info, &format!("echoed {}", envelope.id));
        Outcome::Accept
    }
}

export!(LegacyEcho);
