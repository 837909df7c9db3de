//! Unit-testing handlers natively, with `cargo test`, without a host.
//!
//! Natively (not on wasm32) the SDK's host functions ([`publish`](crate::publish),
//! [`config`](crate::config), [`now_ms`](crate::now_ms), logging) talk to a
//! [`TestHost`] instead of `acemq-host`. It records what the handler
//! published and logged, and answers `config` and `now_ms` from what the test
//! set. Outside [`TestHost::handle`] / [`TestHost::run`] they panic.
//!
//! ```
//! use acemq_guest::prelude::*;
//! use acemq_guest::testing::{self, TestHost};
//!
//! struct Greeter;
//! impl Handler for Greeter {
//!     fn handle(msg: Message) -> Result {
//!         let name = msg.text()?;
//!         let greeting = config("greeting").unwrap_or_else(|| "hello".into());
//!         publish("greetings", "greeting").text(format!("{greeting}, {name}")).send()?;
//!         accept()
//!     }
//! }
//!
//! let host = TestHost::new().config("greeting", "hi").publish_to(["greetings"]);
//! let done = host.handle::<Greeter>(testing::message("Ada"));
//! assert_eq!(done.outcome, Outcome::Accept);
//! assert_eq!(done.published[0].body, b"hi, Ada");
//!
//! let done = host.handle::<Greeter>(testing::message(vec![0xff]));
//! assert!(matches!(done.outcome, Outcome::Reject(_)));
//! ```

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

pub use crate::bindings::wit_types::Outgoing;
use crate::log::Level;
use crate::{Delivery, Envelope, Handler, Headers, Message, Outcome};

/// `now_ms` of a [`TestHost`] unless set: 2023-11-14T22:13:20Z. Also the
/// `first_seen_ms` of [`message`].
pub const DEFAULT_NOW_MS: u64 = 1_700_000_000_000;

/// A stand-in for `acemq-host` in native tests.
#[derive(Clone, Debug)]
pub struct TestHost {
    config: BTreeMap<String, String>,
    now_ms: u64,
    publish_to: Option<BTreeSet<String>>,
}

impl Default for TestHost {
    fn default() -> Self {
        TestHost {
            config: BTreeMap::new(),
            now_ms: DEFAULT_NOW_MS,
            publish_to: None,
        }
    }
}

/// What a handler did under [`TestHost::handle`].
#[derive(Clone, Debug, PartialEq)]
pub struct Handled {
    /// The handler's decision (`Ok` or `Err`, it is the same to the host).
    pub outcome: Outcome,
    /// Every message `send` buffered, in order. The real host publishes them
    /// only when `outcome` is [`Outcome::Accept`].
    pub published: Vec<Outgoing>,
    /// Every line logged, in order.
    pub logs: Vec<(Level, String)>,
}

/// What a closure did under [`TestHost::run`].
#[derive(Clone, Debug, PartialEq)]
pub struct Ran<T> {
    /// What the closure returned.
    pub value: T,
    /// Every message `send` buffered, in order.
    pub published: Vec<Outgoing>,
    /// Every line logged, in order.
    pub logs: Vec<(Level, String)>,
}

impl TestHost {
    /// No configuration, the clock at [`DEFAULT_NOW_MS`], every exchange
    /// allowed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets a `[consumers.config]` value.
    pub fn config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.insert(key.into(), value.into());
        self
    }

    /// Sets what `now_ms()` returns.
    pub fn now_ms(mut self, now_ms: u64) -> Self {
        self.now_ms = now_ms;
        self
    }

    /// Refuses publishes to exchanges not listed, as the host does with the
    /// consumer's `publish_to`. Without it every exchange is allowed (the
    /// real host allows none that `publish_to` does not list).
    pub fn publish_to<S: Into<String>>(mut self, exchanges: impl IntoIterator<Item = S>) -> Self {
        self.publish_to = Some(exchanges.into_iter().map(Into::into).collect());
        self
    }

    /// Runs handler `H` on `msg`, as the host would call it.
    pub fn handle<H: Handler>(&self, msg: Message) -> Handled {
        let ran = self.run(|| crate::__private::decide::<H>(msg));
        Handled {
            outcome: ran.value,
            published: ran.published,
            logs: ran.logs,
        }
    }

    /// Runs any code that uses the host functions (a helper of a handler,
    /// say) against this host.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> Ran<T> {
        let state = State {
            host: self.clone(),
            published: Vec::new(),
            logs: Vec::new(),
        };
        let previous = ACTIVE.with(|a| a.borrow_mut().replace(state));
        // Restores the previous state even if `f` panics (a failing assert in
        // a nested run), so one failure does not poison the thread.
        struct Restore(Option<Option<State>>);
        impl Drop for Restore {
            fn drop(&mut self) {
                if let Some(previous) = self.0.take() {
                    ACTIVE.with(|a| *a.borrow_mut() = previous);
                }
            }
        }
        let mut restore = Restore(Some(previous));
        let value = f();
        let previous = restore.0.take().expect("restored only once");
        let state = ACTIVE
            .with(|a| std::mem::replace(&mut *a.borrow_mut(), previous))
            .expect("state installed above");
        Ran {
            value,
            published: state.published,
            logs: state.logs,
        }
    }
}

/// A message with `body` and test defaults: id `test-message-1`, type `test`,
/// version 1, attempt 1, from queue `test.queue`; no content type, no
/// headers. Change any part before handling it, with the `_mut` methods:
///
/// ```
/// let mut msg = acemq_guest::testing::message("hi");
/// msg.envelope_mut().attempt = 3;
/// msg.headers_mut().insert("tenant", "acme");
/// *msg.content_type_mut() = Some("text/plain".into());
/// assert_eq!(msg.envelope().attempt, 3);
/// ```
pub fn message(body: impl Into<Vec<u8>>) -> Message {
    Message::local(
        Envelope {
            id: "test-message-1".into(),
            message_type: "test".into(),
            version: 1,
            correlation_id: "test-correlation-1".into(),
            causation_id: None,
            attempt: 1,
            first_seen_ms: DEFAULT_NOW_MS,
            origin: None,
        },
        Delivery {
            queue: "test.queue".into(),
            exchange: "test.exchange".into(),
            routing_key: "test".into(),
            redelivered: false,
            stream_offset: None,
        },
        None,
        Headers::new(),
        body.into(),
    )
}

/// [`message`] with `value` serialized as JSON and content type
/// `application/json`.
pub fn json_message<T: Serialize + ?Sized>(value: &T) -> Message {
    let mut msg = message(serde_json::to_vec(value).expect("test value serializes to JSON"));
    *msg.content_type_mut() = Some("application/json".into());
    msg
}

struct State {
    host: TestHost,
    published: Vec<Outgoing>,
    logs: Vec<(Level, String)>,
}

thread_local! {
    static ACTIVE: RefCell<Option<State>> = const { RefCell::new(None) };
}

fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    ACTIVE.with(|a| {
        let mut active = a.borrow_mut();
        let state = active.as_mut().expect(
            "acemq-guest: host functions only work inside acemq-host, or natively \
             inside acemq_guest::testing::TestHost::handle/run",
        );
        f(state)
    })
}

/// The native side of `host::sys`: same signatures as the WIT imports.
pub(crate) mod sys {
    use super::*;

    const RESERVED_PREFIX: &str = "x-acemq-";

    pub(crate) fn log(level: Level, text: &str) {
        with_state(|s| s.logs.push((level, text.to_owned())));
    }

    pub(crate) fn publish(msg: &Outgoing) -> Result<(), String> {
        with_state(|s| {
            // The same checks, in the same order and words, as the host's
            // `host_state.rs`; its output limits are not modelled.
            if let Some(allowed) = &s.host.publish_to
                && !allowed.contains(&msg.exchange)
            {
                let allowed: Vec<String> = allowed.iter().map(|e| format!("'{e}'")).collect();
                return Err(format!(
                    "publishing to exchange '{}' is not allowed for this consumer (publish_to = [{}])",
                    msg.exchange,
                    allowed.join(", ")
                ));
            }
            let reserved = msg.headers.iter().find(|(name, _)| {
                name.get(..RESERVED_PREFIX.len())
                    .is_some_and(|p| p.eq_ignore_ascii_case(RESERVED_PREFIX))
            });
            if let Some((name, _)) = reserved {
                return Err(format!(
                    "header '{name}' is in the reserved '{RESERVED_PREFIX}' namespace, which belongs to AceMQ; \
                     use a namespace of your own, such as x-yourcompany-"
                ));
            }
            s.published.push(msg.clone());
            Ok(())
        })
    }

    pub(crate) fn config(key: &str) -> Option<String> {
        with_state(|s| s.host.config.get(key).cloned())
    }

    pub(crate) fn now_ms() -> u64 {
        with_state(|s| s.host.now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config, now_ms, publish};

    #[test]
    fn host_functions_answer_from_the_test_host() {
        let host = TestHost::new().config("k", "v").now_ms(5);
        let ran = host.run(|| {
            crate::info!("n = {}", 1);
            crate::log::warn("plain");
            (config("k"), config("missing"), now_ms())
        });
        assert_eq!(ran.value, (Some("v".into()), None, 5));
        assert_eq!(
            ran.logs,
            [(Level::Info, "n = 1".into()), (Level::Warn, "plain".into())]
        );
    }

    #[test]
    fn reserved_headers_are_refused() {
        let ran = TestHost::new().run(|| publish("ex", "rk").header("X-AceMQ-Id", "1").send());
        assert!(ran.value.unwrap_err().reason().contains("reserved"));
        assert!(ran.published.is_empty());
    }

    #[test]
    fn runs_nest_and_restore() {
        let outer = TestHost::new().now_ms(1);
        let ran = outer.run(|| {
            let inner = TestHost::new().now_ms(2).run(now_ms);
            (inner.value, now_ms())
        });
        assert_eq!(ran.value, (2, 1));
    }

    #[test]
    #[should_panic(expected = "only work inside acemq-host")]
    fn host_functions_panic_outside_a_test_host() {
        now_ms();
    }
}
