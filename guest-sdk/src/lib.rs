//! Write acemq-host plugins in Rust.
//!
//! A handler plugin decides what happens to each message a consumer receives
//! (accept, retry, reject, park) and what it publishes. The host does
//! everything else: connection, acknowledgements, retries, dead-lettering,
//! publisher confirms. A plugin is a WebAssembly component with no access to
//! the machine; it reaches the outside only through the host: [`publish`](publish()),
//! [`reply`](reply()) (to answer a request), [`config`], [`now_ms`],
//! [logging](log), and the consumer's key-value [`state`], kept between
//! calls and committed with the input. A message on a routing slip shows it
//! ([`Message::routing_slip`]); the host forwards it to the next step.
//!
//! # A handler
//!
//! ```
//! use acemq_guest::prelude::*;
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct Order {
//!     id: String,
//!     total: f64,
//! }
//!
//! struct OrderRouter;
//!
//! impl Handler for OrderRouter {
//!     fn handle(msg: Message) -> Result {
//!         // A malformed body ends here with
//!         // `reject: body is not a valid Order: missing field `total` at line 1 column 12`.
//!         let order: Order = msg.json()?;
//!         if order.total <= 0.0 {
//!             return reject(format_args!("order {}: total must be positive", order.id));
//!         }
//!         // Buffered by the host, published only once this handler accepts.
//!         // A refused publish ends here with a `retry`.
//!         publish("orders.events", "order.accepted")
//!             .json(&json!({ "id": order.id, "total": order.total }))
//!             .send()?;
//!         info!("order {} routed", order.id);
//!         accept()
//!     }
//! }
//!
//! acemq_guest::export_handler!(OrderRouter);
//! #
//! # // The same handler, run natively (see `testing`):
//! # use acemq_guest::testing::{self, TestHost};
//! # let done = TestHost::new().handle::<OrderRouter>(testing::message(r#"{"id":"o-1"}"#));
//! # assert_eq!(done.outcome, Outcome::Reject(
//! #     "body is not a valid Order: missing field `total` at line 1 column 12".into()));
//! # let done = TestHost::new().handle::<OrderRouter>(testing::message(r#"{"id":"o-1","total":2}"#));
//! # assert_eq!((done.outcome, done.published.len()), (Outcome::Accept, 1));
//! ```
//!
//! [`Handler::handle`] returns [`Result`], whose both sides are an
//! [`Outcome`]: `Ok` is the decision reached at the end, `Err` a decision
//! that cut the handler short. That is what lets `?` decide:
//!
//! | error                        | becomes                                      |
//! |------------------------------|----------------------------------------------|
//! | [`BodyError`] ([`Message::json`], [`Message::text`]) | [`Outcome::Reject`]: the body will never be readable |
//! | [`PublishError`] ([`Publish::send`]), [`ReplyError`] ([`Reply::send`]) | [`Outcome::Retry`]: the refusal is usually configuration |
//! | [`StateError`] (any [`state`] call)                   | [`Outcome::Retry`]: usually configuration (no `state`) or a store out of reach |
//! | [`SlipError`] ([`Message::routing_slip`])             | [`Outcome::Reject`]: the slip will never be readable |
//! | any `Option` / `Result`, via [`OrOutcome`]            | the outcome you name: `.or_reject("no tenant")?` |
//!
//! # Building
//!
//! A plugin is a `cdylib` crate depending on this one (and on `serde` for
//! its derives). Build it for `wasm32-unknown-unknown` and turn the core
//! module into a component: `acemq-host plugin build` does both and prints
//! where the component is (`acemq-host plugin new NAME` makes such a crate).
//! In this repository `scripts/build-plugins` does it for every crate in
//! `plugins/` and writes `target/plugins/NAME.wasm`.
//! Use `panic = "abort"` in the release profile: a panic then traps (the
//! instance is discarded), and the delivery fails with the reason
//! `panic: <message> at <file>:<line>:<col>`, which the SDK logs through the
//! host just before the trap.
//!
//! # Testing
//!
//! Natively, the host functions talk to a [`testing::TestHost`] instead, so
//! `cargo test` runs handlers without wasm or a broker.
//!
//! # Codecs
//!
//! A codec plugin implements [`Codec`] and is exported with
//! [`export_codec!`].

#[doc(hidden)]
// Plugins are single-threaded wasm32; elsewhere (native tests) the
// platform's allocator stays.
#[cfg(all(
    feature = "allocator",
    target_arch = "wasm32",
    not(target_feature = "atomics")
))]
mod allocator;
pub mod bindings;
mod codec;
mod host;
mod message;
mod outcome;
mod outgoing;
mod publish;
mod reply;
mod slip;
pub mod state;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;

pub use codec::{Body, Codec, CodecError};
pub use host::{config, log, now_ms};
pub use message::{
    BodyError, DeclaredRoute, Delivery, Envelope, HeaderValue, Headers, Message, REPLY_TO_HEADER,
};
pub use outcome::{OrOutcome, Outcome, Result, accept, park, reject, retry};
pub use publish::{Publish, PublishError, Sent, publish};
pub use reply::{Reply, ReplyError, reply};
/// Re-exported so plugins can build JSON with [`json!`] without depending on
/// `serde_json` themselves.
pub use serde_json::{self, json};
pub use slip::{DoneStep, ROUTING_SLIP_HEADER, RoutingSlip, SlipError, SlipForm, SlipStep};
pub use state::StateError;

/// A handler plugin. Export it with [`export_handler!`].
///
/// The host calls [`handle`](Handler::handle) once per delivery, one message
/// at a time per instance. Instances are reused between messages (statics
/// survive from one call to the next) but never after a trap, and the host
/// may create several, so do not rely on statics to see every message.
pub trait Handler {
    /// Decides what happens to `msg`. See [`Result`] for why both sides of
    /// the result are an [`Outcome`].
    fn handle(msg: Message) -> Result;
}

/// Exports a [`Handler`] as the plugin's `acemq:plugin/handler` export. Use
/// it once, at the top level of the plugin crate.
///
/// ```
/// # use acemq_guest::prelude::*;
/// struct Echo;
/// impl Handler for Echo {
///     fn handle(_: Message) -> Result {
///         accept()
///     }
/// }
/// acemq_guest::export_handler!(Echo);
/// ```
#[macro_export]
macro_rules! export_handler {
    ($handler:ty) => {
        // Private type implementing wit-bindgen's trait: `$handler` needs no
        // trait but ours, and may be any type path (wit-bindgen's export
        // macro accepts only a plain identifier).
        const _: () = {
            struct __AcemqHandlerExport;
            impl $crate::__private::HandlerGuest for __AcemqHandlerExport {
                fn handle(msg: $crate::__private::WitMessage) -> $crate::Outcome {
                    $crate::__private::handle::<$handler>(msg)
                }
            }
            $crate::bindings::handler::export!(
                __AcemqHandlerExport with_types_in $crate::bindings::handler
            );
        };
    };
}

/// Exports a [`Codec`] as the plugin's `acemq:plugin/codec` export. Use it
/// once, at the top level of the plugin crate. See [`Codec`] for an example.
#[macro_export]
macro_rules! export_codec {
    ($codec:ty) => {
        const _: () = {
            struct __AcemqCodecExport;
            impl $crate::__private::CodecGuest for __AcemqCodecExport {
                fn decode(
                    content_type: ::std::string::String,
                    body: ::std::vec::Vec<u8>,
                ) -> $crate::__private::CodecResult {
                    $crate::__private::decode::<$codec>(content_type, body)
                }
                fn encode(
                    content_type: ::std::string::String,
                    body: ::std::vec::Vec<u8>,
                ) -> $crate::__private::CodecResult {
                    $crate::__private::encode::<$codec>(content_type, body)
                }
            }
            $crate::bindings::codec::export!(
                __AcemqCodecExport with_types_in $crate::bindings::codec
            );
        };
    };
}

/// Declares the `[consumers.config]` keys the plugin reads, so that the
/// host warns of any other key in its consumer's config: usually a typo,
/// which would otherwise leave the plugin on its default without a word.
/// Use it once, at the top level of the plugin crate. The keys travel in a
/// custom section of the plugin file (`acemq:config-keys`); the host reads
/// them without running the plugin, and `acemq-host plugin inspect` shows
/// them.
///
/// ```
/// acemq_guest::config_keys!["out_exchange", "tenant"];
/// ```
#[macro_export]
macro_rules! config_keys {
    ($($key:literal),+ $(,)?) => {
        const _: () = {
            const KEYS: &str = concat!($($key, "\n"),+);
            #[used]
            #[unsafe(link_section = "acemq:config-keys")]
            static CONFIG_KEYS: [u8; KEYS.len()] = $crate::__private::bytes_of(KEYS);
        };
    };
}

/// Everything a handler usually needs: `use acemq_guest::prelude::*;`.
///
/// Brings [`Result`] into scope; it still takes an error type
/// (`Result<T, E>`), so other code in the plugin is unaffected. The logging
/// macros are not included (their names are common); call them as
/// `acemq_guest::info!` or import them.
pub mod prelude {
    pub use crate::{
        Handler, Message, OrOutcome, Outcome, Result, accept, config, json, now_ms, park, publish,
        reject, reply, retry, state,
    };
    // Macros, by name, so `info!(..)` works after the glob import.
    pub use crate::{debug, error, info, trace, warn};
}

/// Called by the code the export macros generate; not part of the API.
#[doc(hidden)]
pub mod __private {
    use crate::{Codec, Handler, Message, Outcome};

    pub use crate::bindings::codec::exports::acemq::plugin::codec::Guest as CodecGuest;
    pub use crate::bindings::handler::exports::acemq::plugin::handler::Guest as HandlerGuest;
    pub use crate::bindings::wit_types::Message as WitMessage;
    pub use crate::codec::WitResult as CodecResult;

    /// `text`'s bytes as an array of its length (`config_keys!`'s section).
    pub const fn bytes_of<const N: usize>(text: &str) -> [u8; N] {
        let bytes = text.as_bytes();
        let mut out = [0u8; N];
        let mut i = 0;
        while i < N {
            out[i] = bytes[i];
            i += 1;
        }
        out
    }

    /// The body of the handler export.
    pub fn handle<H: Handler>(msg: WitMessage) -> Outcome {
        #[cfg(target_arch = "wasm32")]
        log_panics();
        decide::<H>(Message::from_host(msg))
    }

    pub(crate) fn decide<H: Handler>(msg: Message) -> Outcome {
        match H::handle(msg) {
            Ok(outcome) | Err(outcome) => outcome,
        }
    }

    pub fn decode<C: Codec>(content_type: String, body: Vec<u8>) -> CodecResult {
        crate::codec::call(C::decode, content_type, body)
    }

    pub fn encode<C: Codec>(content_type: String, body: Vec<u8>) -> CodecResult {
        crate::codec::call(C::encode, content_type, body)
    }

    /// With `panic = "abort"` a panic becomes a wasm trap, and the host sees
    /// only `unreachable`. The hook first logs the panic at error level as
    /// `panic: <message> at <file>:<line>:<col>`; the host (plugin/fault.rs)
    /// takes an error line starting with `panic` just before an
    /// `unreachable` trap as the reason of the failed delivery. Handler
    /// plugins only: codecs have no log import.
    #[cfg(target_arch = "wasm32")]
    fn log_panics() {
        static HOOK: std::sync::Once = std::sync::Once::new();
        HOOK.call_once(|| {
            std::panic::set_hook(Box::new(|info| {
                let line = crate::__private::panic_line(info.payload_as_str(), info.location());
                crate::host::sys::log(crate::log::Level::Error, &line);
            }))
        });
    }

    /// The log line for a panic; see `log_panics`.
    #[cfg(any(target_arch = "wasm32", test))]
    pub(crate) fn panic_line(
        message: Option<&str>,
        location: Option<&std::panic::Location<'_>>,
    ) -> String {
        let message = message.unwrap_or("Box<dyn Any>");
        match location {
            Some(at) => format!("panic: {message} at {at}"),
            None => format!("panic: {message}"),
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn panic_line_is_what_the_host_recognises() {
            let at = std::panic::Location::caller();
            let line = super::panic_line(Some("boom"), Some(at));
            assert_eq!(
                line,
                format!("panic: boom at {}:{}:{}", at.file(), at.line(), at.column())
            );
            assert_eq!(super::panic_line(None, None), "panic: Box<dyn Any>");
        }
    }
}
