//! Turning a failed plugin call into a reason that names the fault.
//!
//! A guest that panics, runs out of memory or overflows its stack usually
//! shows up as a bare trap; the raw "wasm `unreachable` instruction executed"
//! tells an operator nothing. The host knows more (its memory limiter saw the
//! refused growth, the guest logged its panic message just before aborting),
//! and puts that into the reason that ends up in `x-acemq-error`.

use std::fmt;
use std::time::Duration;

use wasmtime::Trap;

/// The kinds of failure a handler call can end in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The call ran past its wall-clock deadline.
    Deadline,
    /// The guest asked for more linear memory than its limit.
    OutOfMemory,
    /// The guest's call stack overflowed.
    StackOverflow,
    /// The guest panicked (a Rust panic aborts, which traps).
    Panic,
    /// Any other trap.
    Trap,
    /// Fuel ran out.
    OutOfFuel,
    /// The instance could not be created.
    Instantiation,
    /// No instance could be made because the host's instance pool had no
    /// free slot for it (until the call's deadline): the host's shortage,
    /// not the message's fault, so the delivery is given back rather than
    /// counted as a failed attempt.
    NoInstanceSlot,
}

impl FaultKind {
    /// A short stable word for metrics labels.
    pub fn label(self) -> &'static str {
        match self {
            FaultKind::Deadline => "deadline",
            FaultKind::OutOfMemory => "out_of_memory",
            FaultKind::StackOverflow => "stack_overflow",
            FaultKind::Panic => "panic",
            FaultKind::Trap => "trap",
            FaultKind::OutOfFuel => "out_of_fuel",
            FaultKind::Instantiation => "instantiation",
            FaultKind::NoInstanceSlot => "no_instance_slot",
        }
    }

    /// A fault of the host, not of the plugin or the message: whatever the
    /// message, another try later may well succeed.
    pub fn is_the_hosts(self) -> bool {
        self == FaultKind::NoInstanceSlot
    }
}

/// What a call or an instantiation fails with when its deadline passes
/// while it waits inside the host: in a WASI sleep, in a poll of a clock,
/// in any host function that awaits. No wasm runs there, so the epoch
/// check that ends a running guest never comes; the host's own timer
/// ([`super::pool::Deadline::bound`]) ends the wait instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "deadline of {} exceeded while the plugin waited inside the host (a WASI sleep or poll)",
    humantime::format_duration(*deadline)
)]
pub struct WaitedPastDeadline {
    pub deadline: Duration,
}

/// A failed handler call: what kind, and the reason text for the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    pub reason: String,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// What the host observed around a failed call, besides the error itself.
#[derive(Debug, Default, Clone)]
pub struct CallEvidence {
    /// The total linear memory the limiter refused to let the instance
    /// reach (all its memories together), if it refused.
    pub refused_memory: Option<usize>,
    /// The last error-level line the guest logged (the SDK logs panics there).
    pub last_error_log: Option<String>,
    /// What the guest printed to stderr as the cause of its failure: an
    /// uncaught Python or JavaScript exception, a Rust panic without the
    /// SDK (`guest_error.rs`).
    pub guest_error: Option<String>,
}

/// Names the fault behind a failed call.
pub fn classify(
    error: &wasmtime::Error,
    evidence: &CallEvidence,
    deadline: Duration,
    memory_limit: u64,
) -> Fault {
    if let Some(waited) = error.downcast_ref::<WaitedPastDeadline>() {
        return Fault {
            kind: FaultKind::Deadline,
            reason: waited.to_string(),
        };
    }
    let trap = error.downcast_ref::<Trap>().copied();
    let (kind, reason) = match trap {
        Some(Trap::Interrupt) => (
            FaultKind::Deadline,
            format!(
                "deadline of {} exceeded",
                humantime::format_duration(deadline)
            ),
        ),
        Some(Trap::StackOverflow) => (
            FaultKind::StackOverflow,
            "stack overflow: the plugin exhausted its call stack".to_string(),
        ),
        Some(Trap::OutOfFuel) => (
            FaultKind::OutOfFuel,
            "the plugin ran out of fuel".to_string(),
        ),
        _ if evidence.refused_memory.is_some() => (
            FaultKind::OutOfMemory,
            out_of_memory_reason(evidence.refused_memory.unwrap_or_default(), memory_limit),
        ),
        Some(Trap::UnreachableCodeReached) if is_panic(evidence) => (
            FaultKind::Panic,
            evidence.last_error_log.clone().unwrap_or_default(),
        ),
        // An interpreter's uncaught exception: it printed the cause, then
        // trapped (unreachable, or whatever its runtime does to abort).
        Some(_) if evidence.guest_error.is_some() => (
            FaultKind::Panic,
            evidence.guest_error.clone().unwrap_or_default(),
        ),
        Some(trap) => {
            // wasmtime's Display says "wasm trap: ..."; say "trap: ..." once.
            let text = trap.to_string();
            let text = text
                .strip_prefix("wasm trap: ")
                .unwrap_or(&text)
                .to_string();
            (FaultKind::Trap, format!("trap: {text}"))
        }
        // An error a host function raised (wasmtime wraps it in the wasm
        // backtrace): its own words are what names the fault.
        None => (FaultKind::Trap, format!("trap: {}", error.root_cause())),
    };
    Fault { kind, reason }
}

/// The reason for a refused allocation of linear memory: `asked` is what all
/// the instance's memories would have held together.
pub fn out_of_memory_reason(asked: usize, limit: impl fmt::Display) -> String {
    format!(
        "out of memory: the plugin asked for {asked} bytes of linear memory, over its limit of {limit} bytes"
    )
}

/// A fault for an instance that could not even be created: its start-up
/// code ran or waited past `deadline` (a deadline fault like a call's), the
/// host's instance pool had no free slot (the host's fault), or anything
/// else (the plugin's).
pub fn instantiation_failed(error: &wasmtime::Error, deadline: Duration) -> Fault {
    let past_deadline = error.downcast_ref::<WaitedPastDeadline>().is_some()
        || error.downcast_ref::<Trap>() == Some(&Trap::Interrupt);
    if past_deadline {
        return Fault {
            kind: FaultKind::Deadline,
            reason: format!(
                "deadline of {} exceeded while the plugin was being instantiated (its start-up code)",
                humantime::format_duration(deadline)
            ),
        };
    }
    if is_out_of_slots(error) {
        return Fault {
            kind: FaultKind::NoInstanceSlot,
            reason: format!(
                "the host had no free plugin instance slot for {}: {}",
                humantime::format_duration(deadline),
                first_line(error)
            ),
        };
    }
    Fault {
        kind: FaultKind::Instantiation,
        reason: format!(
            "the plugin could not be instantiated: {}",
            first_line(error)
        ),
    }
}

/// Whether an instantiation failed because the pooling allocator had no
/// free slot of some kind (instances, memories, tables, stacks) left.
pub fn is_out_of_slots(error: &wasmtime::Error) -> bool {
    error
        .chain()
        .any(|cause| cause.is::<wasmtime::PoolConcurrencyLimitError>())
}

fn is_panic(evidence: &CallEvidence) -> bool {
    evidence
        .last_error_log
        .as_deref()
        .is_some_and(|line| line.starts_with("panic"))
}

fn first_line(error: &wasmtime::Error) -> String {
    format!("{error:#}")
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trap(t: Trap) -> wasmtime::Error {
        wasmtime::Error::from(t)
    }

    #[test]
    fn deadline_names_the_limit() {
        let f = classify(
            &trap(Trap::Interrupt),
            &CallEvidence::default(),
            Duration::from_secs(2),
            0,
        );
        assert_eq!(f.kind, FaultKind::Deadline);
        assert_eq!(f.reason, "deadline of 2s exceeded");
    }

    /// A wait cut by the host's own timer is a deadline fault, named so an
    /// operator knows the plugin was waiting rather than computing.
    #[test]
    fn a_wait_past_the_deadline_is_a_deadline_fault() {
        let error = wasmtime::Error::new(WaitedPastDeadline {
            deadline: Duration::from_secs(2),
        });
        let f = classify(&error, &CallEvidence::default(), Duration::from_secs(2), 0);
        assert_eq!(f.kind, FaultKind::Deadline);
        assert_eq!(
            f.reason,
            "deadline of 2s exceeded while the plugin waited inside the host (a WASI sleep or poll)"
        );
        let f = instantiation_failed(&error, Duration::from_secs(2));
        assert_eq!(f.kind, FaultKind::Deadline);
        assert!(
            f.reason
                .starts_with("deadline of 2s exceeded while the plugin was being instantiated"),
            "{}",
            f.reason
        );
        let f = instantiation_failed(&trap(Trap::Interrupt), Duration::from_secs(2));
        assert_eq!(f.kind, FaultKind::Deadline);
    }

    #[test]
    fn refused_growth_is_out_of_memory_whatever_the_trap() {
        let evidence = CallEvidence {
            refused_memory: Some(128 << 20),
            last_error_log: None,
            guest_error: None,
        };
        let f = classify(
            &trap(Trap::UnreachableCodeReached),
            &evidence,
            Duration::from_secs(1),
            64 << 20,
        );
        assert_eq!(f.kind, FaultKind::OutOfMemory);
        assert!(f.reason.starts_with("out of memory:"), "{}", f.reason);
    }

    #[test]
    fn a_logged_panic_becomes_the_reason() {
        let evidence = CallEvidence {
            refused_memory: None,
            last_error_log: Some("panic: boom at src/lib.rs:3:5".into()),
            guest_error: None,
        };
        let f = classify(
            &trap(Trap::UnreachableCodeReached),
            &evidence,
            Duration::from_secs(1),
            0,
        );
        assert_eq!(f.kind, FaultKind::Panic);
        assert_eq!(f.reason, "panic: boom at src/lib.rs:3:5");
    }

    #[test]
    fn an_exception_the_guest_printed_becomes_the_reason() {
        let evidence = CallEvidence {
            guest_error: Some(
                "uncaught exception: NameError: name 'x' is not defined (app.py, line 3, in handle)"
                    .into(),
            ),
            ..CallEvidence::default()
        };
        let f = classify(
            &trap(Trap::UnreachableCodeReached),
            &evidence,
            Duration::from_secs(1),
            0,
        );
        assert_eq!(f.kind, FaultKind::Panic);
        assert_eq!(
            f.reason,
            "uncaught exception: NameError: name 'x' is not defined (app.py, line 3, in handle)"
        );
        // A deadline stays a deadline, whatever was printed before it.
        let f = classify(&trap(Trap::Interrupt), &evidence, Duration::from_secs(1), 0);
        assert_eq!(f.kind, FaultKind::Deadline);
    }

    #[test]
    fn other_traps_keep_wasmtimes_words() {
        let f = classify(
            &trap(Trap::UnreachableCodeReached),
            &CallEvidence::default(),
            Duration::from_secs(1),
            0,
        );
        assert_eq!(f.kind, FaultKind::Trap);
        assert_eq!(f.reason, "trap: wasm `unreachable` instruction executed");
        let f = classify(
            &trap(Trap::StackOverflow),
            &CallEvidence::default(),
            Duration::from_secs(1),
            0,
        );
        assert_eq!(f.kind, FaultKind::StackOverflow);
    }
}
