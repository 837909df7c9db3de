//! Unit-testing handlers natively, with `cargo test`, without a host.
//!
//! Natively (not on wasm32) the SDK's host functions ([`publish`](crate::publish()),
//! [`reply`](crate::reply()), [`config`](crate::config), [`now_ms`](crate::now_ms),
//! logging, [`state`](crate::state)) talk to a [`TestHost`] instead of
//! `acemq-host`. It records what the handler published, replied, logged and
//! wrote, with the [`Sent`] id and correlation the host would answer
//! (`envelope` below says how its ids stand in for the host's), answers
//! `config` and `now_ms` from what the test set, and keeps the consumer's
//! state in memory from one call to the next. Outside [`TestHost::handle`] /
//! [`TestHost::run`] they panic.
//!
//! Each interface of the host has its part here, named as the host names
//! its file (`host/src/plugin/host/`): `message` (the messages a test
//! hands in: [`message()`], [`json_message`], a [`request`], a message
//! [`on_json_slip`] or [`on_declared_route`]), `log`, `publish`
//! ([`TestHost::publish_to`], and for delayed publishing
//! [`TestHost::publish_delayed`] and [`TestHost::max_delay`]), `reply`,
//! `envelope` (the envelope fields both check and default), `config`
//! ([`TestHost::config`]), `clock` ([`TestHost::now_ms`] and
//! [`TestHost::advance`], which [`delay`](crate::Publish::delay) and state
//! TTLs count from) and `state` (the consumer's key-value namespace, shared
//! by a host and its clones: seeded and read with [`TestHost::state_set`],
//! [`TestHost::state_get`], [`TestHost::state_keys`] and the like, committed
//! only when a call accepts, with [`Handled::state_writes`] and
//! [`Handled::conflict`] to say what a call wrote and whether its commit
//! conflicted, [`TestHost::state_changes_during_next_call`] to make it
//! conflict, and [`TestHost::without_state`] for a consumer without a
//! store).
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

mod clock;
mod config;
mod envelope;
mod log;
mod message;
mod publish;
mod reply;
mod state;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::Sent;
pub use crate::bindings::wit_types::{EnvelopeFields, Outgoing, OutgoingReply};
use crate::log::Level;
use crate::{Handler, Message, Outcome};
pub use clock::DEFAULT_NOW_MS;
use envelope::Input;
pub use message::{json_message, message, on_declared_route, on_json_slip, request};
pub use publish::DEFAULT_MAX_DELAY;
pub use state::StateWrite;

/// A stand-in for `acemq-host` in native tests.
#[derive(Clone, Debug)]
pub struct TestHost {
    config: BTreeMap<String, String>,
    now_ms: u64,
    publish_to: Option<BTreeSet<String>>,
    publish_delayed: bool,
    max_delay: Duration,
    /// The consumer's namespace, shared by clones; `None`: no `state`.
    state: Option<state::Shared>,
}

impl Default for TestHost {
    fn default() -> Self {
        TestHost {
            config: BTreeMap::new(),
            now_ms: DEFAULT_NOW_MS,
            publish_to: None,
            publish_delayed: true,
            max_delay: DEFAULT_MAX_DELAY,
            state: Some(state::new_namespace()),
        }
    }
}

/// A message a handler buffered with [`publish`](crate::publish), and the
/// [`Sent`] the host answered with (see the module `envelope` above for the
/// id). Derefs to the [`Outgoing`] record, so `done.published[0].body`
/// reads it, and `done.published[0].deliver_at_ms` the due time of a
/// delayed message.
#[derive(Clone, Debug, PartialEq)]
pub struct Published {
    /// What the handler asked for, as the host receives it (`envelope`
    /// holds only the fields the handler set).
    pub message: Outgoing,
    /// The id and correlation it will carry.
    pub sent: Sent,
    /// For a delayed message, how long after the test's clock
    /// ([`TestHost::now_ms`]) it is due: its `deliver_at_ms` minus now, zero
    /// for a time already past (the host delivers it as soon as it can).
    /// `None` for a message published now.
    pub due_in: Option<Duration>,
}

impl core::ops::Deref for Published {
    type Target = Outgoing;
    fn deref(&self) -> &Outgoing {
        &self.message
    }
}

/// The reply a handler buffered with [`reply`](crate::reply()), the
/// [`Sent`] the host answered with (its correlation is the request's) and
/// where the host would send it. Derefs to the [`OutgoingReply`] record.
#[derive(Clone, Debug, PartialEq)]
pub struct Replied {
    /// What the handler asked for, as the host receives it.
    pub message: OutgoingReply,
    /// The id and correlation it will carry.
    pub sent: Sent,
    /// The reply queue, as the host resolves it from the request
    /// (`acemq-reply-to`, else the `reply-to` property); `None` when the
    /// request had neither, which the real host rejects on accept.
    pub to: Option<String>,
}

impl core::ops::Deref for Replied {
    type Target = OutgoingReply;
    fn deref(&self) -> &OutgoingReply {
        &self.message
    }
}

/// What a handler did under [`TestHost::handle`].
#[derive(Clone, Debug, PartialEq)]
pub struct Handled {
    /// The handler's decision (`Ok` or `Err`, it is the same to the host).
    pub outcome: Outcome,
    /// Every message `send` buffered, in order. The real host publishes them
    /// only when `outcome` is [`Outcome::Accept`] (and `conflict` is `None`).
    pub published: Vec<Published>,
    /// The reply `reply().send()` buffered, if any; the real host sends it
    /// only when `outcome` is [`Outcome::Accept`] (and then rejects a
    /// message that had no reply address: [`Replied::to`] `None`).
    pub reply: Option<Replied>,
    /// Every line logged, in order.
    pub logs: Vec<(Level, String)>,
    /// Every state write the call made, in order, committed or not: they
    /// are committed (and [`TestHost::state_get`] shows them) only when
    /// `outcome` is [`Outcome::Accept`] and `conflict` is `None`.
    pub state_writes: Vec<StateWrite>,
    /// The key whose change made the commit conflict, when it did: a key
    /// that an `increment` or a `set_if_version` of the call depended on
    /// changed before the commit (see
    /// [`TestHost::state_changes_during_next_call`]), or a `set_if_version`
    /// named a version the key did not have. Nothing of the call was
    /// committed, and the real host publishes none of its outputs: it runs
    /// the call again on fresh state (up to 5 times), which the test host
    /// leaves to the test (handle the message again).
    pub conflict: Option<Vec<u8>>,
}

/// What a closure did under [`TestHost::run`].
#[derive(Clone, Debug, PartialEq)]
pub struct Ran<T> {
    /// What the closure returned.
    pub value: T,
    /// Every message `send` buffered, in order.
    pub published: Vec<Published>,
    /// The reply buffered, if any.
    pub reply: Option<Replied>,
    /// Every line logged, in order.
    pub logs: Vec<(Level, String)>,
    /// Every state write made, in order. A run has no outcome: they are
    /// committed as if it accepted, unless `conflict` says otherwise.
    pub state_writes: Vec<StateWrite>,
    /// As [`Handled::conflict`].
    pub conflict: Option<Vec<u8>>,
}

impl TestHost {
    /// No configuration, the clock at [`DEFAULT_NOW_MS`], every exchange
    /// allowed, delayed publishing allowed up to [`DEFAULT_MAX_DELAY`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs handler `H` on `msg`, as the host would call it.
    pub fn handle<H: Handler>(&self, msg: Message) -> Handled {
        let ran = self.run_with(
            Input::of(&msg),
            || crate::__private::decide::<H>(msg),
            |outcome| *outcome == Outcome::Accept,
        );
        Handled {
            outcome: ran.value,
            published: ran.published,
            reply: ran.reply,
            logs: ran.logs,
            state_writes: ran.state_writes,
            conflict: ran.conflict,
        }
    }

    /// Runs any code that uses the host functions (a helper of a handler,
    /// say) against this host, as if it handled [`message()`]'s default
    /// message (its id and correlation are what outputs inherit). Its
    /// state writes are committed at the end, as if it accepted.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> Ran<T> {
        self.run_with(Input::of(&message(Vec::new())), f, |_| true)
    }

    /// Runs `f` as a call, then settles its state writes (committed when
    /// `accepted` says so of what `f` returned).
    fn run_with<T>(
        &self,
        input: Input,
        f: impl FnOnce() -> T,
        accepted: impl FnOnce(&T) -> bool,
    ) -> Ran<T> {
        let state = State {
            host: self.clone(),
            input,
            published: Vec::new(),
            reply: None,
            logs: Vec::new(),
            kv: state::Call::default(),
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
        let mut kv = state.kv;
        let state_writes = std::mem::take(&mut kv.writes);
        let conflict = state::settle(self, kv, accepted(&value));
        Ran {
            value,
            published: state.published,
            reply: state.reply,
            logs: state.logs,
            state_writes,
            conflict,
        }
    }
}

struct State {
    host: TestHost,
    input: Input,
    published: Vec<Published>,
    reply: Option<Replied>,
    logs: Vec<(Level, String)>,
    /// The call's state writes, not yet committed.
    kv: state::Call,
}

impl State {
    /// The ids of every message buffered so far in this call.
    fn sent_ids(&self) -> impl Iterator<Item = &str> {
        let outputs = self.published.iter().map(|p| &p.sent);
        outputs
            .chain(self.reply.as_ref().map(|r| &r.sent))
            .map(|sent| sent.id.as_str())
    }
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

/// The native side of `host::sys`: same signatures as the WIT imports,
/// one per interface's part.
pub(crate) mod sys {
    pub(crate) use super::clock::now_ms;
    pub(crate) use super::config::config;
    pub(crate) use super::log::log;
    pub(crate) use super::publish::publish;
    pub(crate) use super::reply::reply;

    pub(crate) mod state {
        pub(crate) use super::super::state::{
            delete, get, get_versioned, increment, set, set_if_version,
        };
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
