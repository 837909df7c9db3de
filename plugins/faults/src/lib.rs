//! A handler that misbehaves on request, for testing how the host contains
//! faulty plugins. The body, as trimmed UTF-8 text, picks what happens, so
//! one consumer can mix faulty and healthy messages:
//!
//! | body        | what the handler does                                        |
//! |-------------|--------------------------------------------------------------|
//! | `trap`      | executes a bare wasm `unreachable`: no panic, nothing logged  |
//! | `panic`     | `panic!("boom: the faults plugin was asked to panic")`        |
//! | `loop`      | spins forever (until the host's deadline interrupts it)       |
//! | `oom`       | allocates 1 MiB chunks, and keeps them, until memory runs out |
//! | `recurse`   | recurses without bound until the wasm call stack overflows    |
//! | `stale`     | the first time (in an instance), keeps the message past its call and asks for a retry; the next time, reads the kept message, which the host refuses with a trap: a message is lent for its own call only |
//! | `forbidden` | publishes to `forbidden.exchange`, which the consumer's `publish_to` should not list: the host refuses, and the SDK turns the refusal into a retry whose reason carries the host's words; the host then parks the message at once, as a configuration fault |
//! | anything else (or not UTF-8) | healthy: publishes the body unchanged (same content type, same application headers) to the exchange in config key `out_exchange` with routing key `healthy`, and accepts |
//!
//! Every deliberate fault logs one `info` line first
//! (`faults: <kind> as the message asked`); a healthy message logs nothing.
//! Nothing is logged at error level before a trap, so the host sees the
//! `trap` fault as a bare trap, and the `panic` fault only through the SDK's
//! panic hook.

use acemq_guest::prelude::*;

/// Consumer config key naming the exchange healthy messages go to.
const OUT_EXCHANGE_KEY: &str = "out_exchange";
/// Routing key of the healthy messages.
const HEALTHY_ROUTING_KEY: &str = "healthy";
/// The exchange the `forbidden` fault publishes to; a consumer running this
/// plugin must not list it in `publish_to`.
const FORBIDDEN_EXCHANGE: &str = "forbidden.exchange";

/// The misbehaviours a body can ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Trap,
    Panic,
    Loop,
    Oom,
    Recurse,
    Stale,
    Forbidden,
}

impl Fault {
    /// The fault `body` asks for; `None` for a healthy message.
    fn asked_by(body: &[u8]) -> Option<Fault> {
        let Ok(text) = core::str::from_utf8(body) else {
            return None;
        };
        Some(match text.trim() {
            "trap" => Fault::Trap,
            "panic" => Fault::Panic,
            "loop" => Fault::Loop,
            "oom" => Fault::Oom,
            "recurse" => Fault::Recurse,
            "stale" => Fault::Stale,
            "forbidden" => Fault::Forbidden,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Fault::Trap => "trap",
            Fault::Panic => "panic",
            Fault::Loop => "loop",
            Fault::Oom => "oom",
            Fault::Recurse => "recurse",
            Fault::Stale => "stale",
            Fault::Forbidden => "forbidden",
        }
    }
}

struct Faults;

impl Handler for Faults {
    fn handle(msg: Message) -> Result {
        let Some(fault) = Fault::asked_by(msg.body()) else {
            return healthy(msg);
        };
        info!("faults: {} as the message asked", fault.name());
        match fault {
            Fault::Trap => trap(),
            Fault::Panic => panic!("boom: the faults plugin was asked to panic"),
            Fault::Loop => spin_forever(),
            Fault::Oom => exhaust_memory(),
            Fault::Recurse => {
                recurse(0);
                unreachable!("the recursion has no base case that can be reached")
            }
            Fault::Stale => read_a_message_kept_past_its_call(msg),
            Fault::Forbidden => {
                // Refused by the host; `?` makes the refusal a retry whose
                // reason quotes the host's.
                publish(FORBIDDEN_EXCHANGE, "forbidden")
                    .text("the faults plugin was asked to publish where it may not")
                    .send()?;
                // Only a host that allows the exchange gets here.
                accept()
            }
        }
    }
}

/// Forwards the message unchanged.
fn healthy(msg: Message) -> Result {
    let exchange = config(OUT_EXCHANGE_KEY).or_retry(format_args!(
        "the consumer's config sets no `{OUT_EXCHANGE_KEY}`, the exchange healthy messages go to"
    ))?;
    let mut out = publish(&exchange, HEALTHY_ROUTING_KEY).headers(msg.headers().clone());
    if let Some(content_type) = msg.content_type() {
        out = out.content_type(content_type);
    }
    out = out.body(msg.into_body());
    out.send()?;
    accept()
}

thread_local! {
    /// A message kept past its call by the `stale` fault.
    static KEPT: core::cell::RefCell<Option<Message>> = const { core::cell::RefCell::new(None) };
}

/// Keeps `msg` past its call; on the next `stale` message, reads the kept one.
fn read_a_message_kept_past_its_call(msg: Message) -> Result {
    match KEPT.take() {
        Some(kept) => {
            // Inside the host this traps: the kept handle names a call
            // that has returned. (A test message reads its own copy.)
            let id = kept.envelope().id.clone();
            retry(format_args!("read message {id} after its call returned"))
        }
        None => {
            KEPT.set(Some(msg));
            retry("kept this message past its call; the next `stale` message reads it")
        }
    }
}

/// A bare trap: the wasm `unreachable` instruction, without the panic
/// machinery (and so without the SDK's panic hook logging anything).
fn trap() -> ! {
    #[cfg(target_arch = "wasm32")]
    {
        core::arch::wasm32::unreachable()
    }
    // Natively there is no such instruction; a panic is what a test can see.
    #[cfg(not(target_arch = "wasm32"))]
    {
        panic!("trap: the faults plugin executed `unreachable` (a wasm trap in the host)")
    }
}

/// Read with volatile loads, which the optimiser must perform every time;
/// never written.
static NEVER_SET: u8 = 0;

/// An infinite loop the optimiser cannot remove or shorten: each iteration
/// performs a volatile load, an observable effect. Wasmtime's epoch checks at
/// the loop header let the host's deadline interrupt it.
fn spin_forever() -> ! {
    loop {
        // SAFETY: a plain read of a valid, aligned, initialised static.
        unsafe { core::ptr::read_volatile(&NEVER_SET) };
    }
}

/// Allocates and keeps 1 MiB chunks, each filled with data, until the
/// allocator fails: every chunk grows linear memory by 16 pages, until the
/// host's memory limit refuses a `memory.grow`. The failed allocation then
/// aborts (`handle_alloc_error`), which traps.
fn exhaust_memory() -> ! {
    const CHUNK: usize = 1 << 20;
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        let chunk = vec![hoard.len() as u8 | 1; CHUNK];
        hoard.push(chunk);
        // The optimiser must assume the chunks are read: none of the
        // allocations (or the filling) may be elided.
        core::hint::black_box(&mut hoard);
    }
}

/// Written after every recursive call returns (which none does).
static mut RECURSION_SINK: u64 = 0;

/// Unbounded recursion that stays recursion. The call is not in tail
/// position (a volatile store follows it), and its result is not combined
/// with an associative operation, so neither tail-call elimination nor
/// accumulator rewriting can turn it into a loop. The base case depends on a
/// volatile load and is never taken.
///
/// No `black_box` on purpose: it spills its operand to Rust's shadow stack in
/// linear memory, and overflowing that (1 MiB, at the bottom of memory) ends
/// in an out-of-bounds access rather than in wasmtime's stack-overflow trap.
/// These frames hold only wasm locals, so it is the wasm call stack, the one
/// the host limits, that overflows.
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    // SAFETY: plain reads and writes of statics; the plugin is single-threaded.
    unsafe {
        if core::ptr::read_volatile(&NEVER_SET) != 0 {
            return depth;
        }
        let below = recurse(depth + 1);
        core::ptr::write_volatile(&raw mut RECURSION_SINK, below);
        below.rotate_left(1) ^ depth
    }
}

acemq_guest::export_handler!(Faults);

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_guest::HeaderValue;
    use acemq_guest::testing::{self, TestHost};

    fn host() -> TestHost {
        TestHost::new()
            .config(OUT_EXCHANGE_KEY, "faults.out")
            .publish_to(["faults.out"])
    }

    #[test]
    fn bodies_pick_faults_after_trimming() {
        for (body, fault) in [
            (&b"trap"[..], Some(Fault::Trap)),
            (b" panic\n", Some(Fault::Panic)),
            (b"\tloop ", Some(Fault::Loop)),
            (b"oom", Some(Fault::Oom)),
            (b"recurse\r\n", Some(Fault::Recurse)),
            (b"stale", Some(Fault::Stale)),
            (b"forbidden", Some(Fault::Forbidden)),
            (b"TRAP", None),
            (b"trap now", None),
            (b"", None),
            (b"\xfftrap", None),
        ] {
            assert_eq!(Fault::asked_by(body), fault, "{body:?}");
            if let Some(fault) = fault {
                assert_eq!(Fault::asked_by(fault.name().as_bytes()), Some(fault));
            }
        }
    }

    #[test]
    fn stale_keeps_one_message_then_reads_it() {
        let first = host().handle::<Faults>(testing::message("stale"));
        assert!(
            matches!(&first.outcome, Outcome::Retry(why) if why.starts_with("kept this message")),
            "{first:?}"
        );
        // Natively the kept message reads its own copy; the host would trap.
        let second = host().handle::<Faults>(testing::message("stale"));
        assert_eq!(
            second.outcome,
            Outcome::Retry("read message test-message-1 after its call returned".into())
        );
    }

    #[test]
    fn other_bodies_are_forwarded_unchanged() {
        let mut msg = testing::message(b"  hello \xff".to_vec());
        *msg.content_type_mut() = Some("application/octet-stream".into());
        msg.headers_mut().insert("x-test-seq", 7);
        let done = host().handle::<Faults>(msg);
        assert_eq!(done.outcome, Outcome::Accept);
        let [out] = &done.published[..] else {
            panic!("one message expected: {:?}", done.published)
        };
        assert_eq!(
            (out.exchange.as_str(), out.routing_key.as_str()),
            ("faults.out", "healthy")
        );
        assert_eq!(out.body, b"  hello \xff");
        assert_eq!(
            out.content_type.as_deref(),
            Some("application/octet-stream")
        );
        assert_eq!(out.headers, [("x-test-seq".into(), HeaderValue::Int(7))]);
        assert!(out.persistent);
        assert!(done.logs.is_empty(), "{:?}", done.logs);
    }

    #[test]
    fn no_content_type_stays_none() {
        let done = host().handle::<Faults>(testing::message("{}"));
        assert_eq!(done.outcome, Outcome::Accept);
        assert_eq!(done.published[0].content_type, None);
    }

    #[test]
    fn missing_out_exchange_is_a_retry_naming_the_key() {
        let done = TestHost::new().handle::<Faults>(testing::message("hello"));
        assert_eq!(
            done.outcome,
            Outcome::Retry(
                "the consumer's config sets no `out_exchange`, the exchange healthy messages go to"
                    .into()
            )
        );
        assert!(done.published.is_empty());
    }

    #[test]
    fn forbidden_is_a_retry_carrying_the_hosts_refusal() {
        let done = host().handle::<Faults>(testing::message("forbidden"));
        assert_eq!(
            done.outcome,
            Outcome::Retry(
                "publish to exchange `forbidden.exchange` with routing key `forbidden` failed: \
                 publishing to exchange 'forbidden.exchange' is not allowed for this consumer \
                 (publish_to = ['faults.out'])"
                    .into()
            )
        );
        assert!(done.published.is_empty());
    }

    #[test]
    #[should_panic(expected = "boom: the faults plugin was asked to panic")]
    fn panic_panics_with_its_message() {
        host().handle::<Faults>(testing::message("panic"));
    }

    #[test]
    #[should_panic(expected = "trap: the faults plugin executed `unreachable`")]
    fn trap_natively_panics() {
        host().handle::<Faults>(testing::message("trap"));
    }

    // `loop`, `oom` and `recurse` are not run natively: they would hang, eat
    // the machine's memory, or kill the test process with a stack overflow.
    // The host's integration tests run them inside wasm, under its limits.
}
