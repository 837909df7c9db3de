//! Warm instances of one plugin version, and the one way a call gets and
//! gives back an instance. Handler and codec versions both call through a
//! [`Pool`]; they differ only in how an instance is made and what a call does
//! with it.
//!
//! The rules:
//!
//! - A call takes an idle instance when it may reuse one, and instantiates a
//!   fresh one when it may not or when none is idle. The idle list's lock is
//!   held only to pop and to push, never during a call, so concurrent calls
//!   each get their own instance and the pool grows to the concurrency seen.
//! - An instance goes back to the pool only after a call that succeeded. After
//!   a trap, or any error from the call, it is dropped: its linear memory may
//!   be half-updated, and the component model forbids re-entering an instance
//!   that trapped. The next call gets a fresh instance.
//! - The epoch deadline is set before every call, not once per instance: it is
//!   an epoch count relative to the engine's epoch when it is set, so one set
//!   when the instance was made (or before its previous call) would have run
//!   down while the instance sat idle.
//! - A failure is classified ([`fault::classify`]) while the failed instance
//!   is still at hand, so what the host saw during the call (a refused memory
//!   growth, the panic message the guest logged) names the fault.
//! - A version warms one instance when it loads: one real instantiation proves
//!   the plugin's start-up code runs, and leaves an instance ready for the
//!   first message.

use std::sync::Mutex;
use std::time::Duration;

use wasmtime::Store;

use super::engine::PluginEngine;
use super::fault::{self, CallEvidence, Fault};

/// What the pool holds: something that can be armed with a deadline before a
/// call and questioned after one failed.
pub(super) trait Instance {
    /// Sets the call's deadline, `ticks` epoch ticks from now.
    fn set_deadline(&mut self, ticks: u64);
    /// What the host observed during the call that just failed.
    fn evidence(&self) -> CallEvidence;
}

/// Makes the instances of one version (its engine, pre-linked code, limits).
pub(super) trait Instantiate {
    type Instance: Instance;
    fn instantiate(&self) -> wasmtime::Result<Self::Instance>;
}

/// The data of a plugin store that can report what it observed during a call.
pub(super) trait Observed: 'static {
    fn evidence(&self) -> CallEvidence;
}

/// A wasmtime instance ready to take a call: its bindings, with the store
/// they live in.
pub(super) struct Warm<D: 'static, B> {
    pub store: Store<D>,
    pub bindings: B,
}

impl<D: Observed, B> Instance for Warm<D, B> {
    fn set_deadline(&mut self, ticks: u64) {
        self.store.set_epoch_deadline(ticks);
    }

    fn evidence(&self) -> CallEvidence {
        self.store.data().evidence()
    }
}

/// The warm instances of one version, and what a call of it is allowed.
pub(super) struct Pool<S: Instantiate> {
    source: S,
    idle: Mutex<Vec<S::Instance>>,
    deadline: Duration,
    /// `deadline` in epoch ticks, worked out once rather than on every call.
    deadline_ticks: u64,
    /// The linear-memory limit, named in an out-of-memory fault's reason.
    memory_limit: u64,
}

impl<S: Instantiate> Pool<S> {
    /// An empty pool; [`Pool::warm`] fills it.
    pub fn new(source: S, deadline: Duration, memory_limit: u64) -> Self {
        Self {
            source,
            idle: Mutex::new(Vec::new()),
            deadline,
            deadline_ticks: PluginEngine::deadline_ticks(deadline),
            memory_limit,
        }
    }

    /// What makes this pool's instances.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// Instantiates one instance and leaves it idle.
    pub fn warm(&self) -> wasmtime::Result<()> {
        let instance = self.source.instantiate()?;
        self.idle.lock().expect("idle pool poisoned").push(instance);
        Ok(())
    }

    /// Idle instances currently pooled.
    pub fn idle(&self) -> usize {
        self.idle.lock().expect("idle pool poisoned").len()
    }

    /// Runs `call` on an instance, under the deadline. With `reuse`, the
    /// instance comes from the pool when one is idle and goes back to it if
    /// `call` succeeds; without, it is made for this call alone and the pool
    /// is not touched. An instance whose call failed is dropped either way.
    //
    // `#[inline]` places each use in its caller's codegen unit, with the
    // wasmtime call its closure makes. Compiled apart, in this module's unit,
    // the handler's pooled call ran ~90 instructions (~4%) slower: wasmtime's
    // trap-catching wrapper was no longer inlined into its call path.
    #[inline]
    pub fn with_instance<R>(
        &self,
        reuse: bool,
        call: impl FnOnce(&mut S::Instance) -> wasmtime::Result<R>,
    ) -> Result<R, Fault> {
        let idle = if reuse {
            self.idle.lock().expect("idle pool poisoned").pop()
        } else {
            None
        };
        let mut instance = match idle.map(Ok).unwrap_or_else(|| self.source.instantiate()) {
            Ok(instance) => instance,
            Err(e) => return Err(fault::instantiation_failed(&e)),
        };
        instance.set_deadline(self.deadline_ticks);
        match call(&mut instance) {
            Ok(answer) => {
                if reuse {
                    self.idle.lock().expect("idle pool poisoned").push(instance);
                }
                Ok(answer)
            }
            // `instance` is dropped on return, never reused (see the module doc).
            Err(e) => Err(fault::classify(
                &e,
                &instance.evidence(),
                self.deadline,
                self.memory_limit,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use wasmtime::Trap;

    use super::*;
    use crate::plugin::FaultKind;

    /// An instance that needs no wasm: it knows which one it is, counts its
    /// calls and remembers its deadline and a refused memory growth.
    #[derive(Debug)]
    struct Counter {
        id: usize,
        calls: u32,
        deadline: Option<u64>,
        refused: Option<usize>,
    }

    impl Instance for Counter {
        fn set_deadline(&mut self, ticks: u64) {
            self.deadline = Some(ticks);
        }

        fn evidence(&self) -> CallEvidence {
            CallEvidence {
                refused_memory: self.refused,
                last_error_log: None,
            }
        }
    }

    /// Numbers the instances it makes; fails to make one when told to.
    #[derive(Default)]
    struct Counters {
        made: AtomicUsize,
        failing: AtomicBool,
    }

    impl Instantiate for Counters {
        type Instance = Counter;

        fn instantiate(&self) -> wasmtime::Result<Counter> {
            if self.failing.load(Ordering::Relaxed) {
                return Err(wasmtime::Error::msg("no slot left"));
            }
            Ok(Counter {
                id: self.made.fetch_add(1, Ordering::Relaxed),
                calls: 0,
                deadline: None,
                refused: None,
            })
        }
    }

    const DEADLINE: Duration = Duration::from_millis(25);
    const TICKS: u64 = 3; // 25 ms in 10 ms ticks, rounded up

    fn pool() -> Pool<Counters> {
        Pool::new(Counters::default(), DEADLINE, 1 << 20)
    }

    fn made(pool: &Pool<Counters>) -> usize {
        pool.source().made.load(Ordering::Relaxed)
    }

    /// A successful call: which instance served it, and how many calls that
    /// instance had taken before.
    fn serve(counter: &mut Counter) -> wasmtime::Result<(usize, u32)> {
        counter.calls += 1;
        Ok((counter.id, counter.calls - 1))
    }

    fn trap(_: &mut Counter) -> wasmtime::Result<()> {
        Err(Trap::UnreachableCodeReached.into())
    }

    #[test]
    fn warming_leaves_one_instance_idle() {
        let pool = pool();
        assert_eq!((pool.idle(), made(&pool)), (0, 0));
        pool.warm().unwrap();
        assert_eq!((pool.idle(), made(&pool)), (1, 1));
    }

    #[test]
    fn a_warming_that_cannot_instantiate_fails_and_pools_nothing() {
        let pool = pool();
        pool.source().failing.store(true, Ordering::Relaxed);
        assert!(pool.warm().is_err());
        assert_eq!(pool.idle(), 0);
    }

    #[test]
    fn after_a_success_the_instance_is_returned_and_reused() {
        let pool = pool();
        pool.warm().unwrap();
        assert_eq!(pool.with_instance(true, serve).unwrap(), (0, 0));
        assert_eq!(pool.idle(), 1);
        assert_eq!(pool.with_instance(true, serve).unwrap(), (0, 1));
        assert_eq!(made(&pool), 1, "a call instantiated beside the warm one");
    }

    #[test]
    fn an_empty_pool_instantiates_and_keeps_the_instance() {
        let pool = pool();
        assert_eq!(pool.with_instance(true, serve).unwrap(), (0, 0));
        assert_eq!(pool.idle(), 1);
        assert_eq!(pool.with_instance(true, serve).unwrap(), (0, 1));
    }

    #[test]
    fn after_a_failure_the_instance_is_dropped_and_the_next_call_gets_a_fresh_one() {
        let pool = pool();
        pool.warm().unwrap();
        let fault = pool.with_instance(true, trap).unwrap_err();
        assert_eq!(fault.kind, FaultKind::Trap, "{fault}");
        assert_eq!(pool.idle(), 0, "the instance that trapped was pooled");
        assert_eq!(pool.with_instance(true, serve).unwrap(), (1, 0));
        assert_eq!(pool.idle(), 1);
    }

    #[test]
    fn without_reuse_every_call_gets_a_fresh_instance_and_the_pool_is_left_alone() {
        let pool = pool();
        pool.warm().unwrap();
        assert_eq!(pool.with_instance(false, serve).unwrap(), (1, 0));
        assert_eq!(pool.with_instance(false, serve).unwrap(), (2, 0));
        assert_eq!(
            pool.with_instance(false, trap).unwrap_err().kind,
            FaultKind::Trap
        );
        assert_eq!(pool.idle(), 1, "only the warm instance is idle");
        assert_eq!(made(&pool), 4);
        // The warm instance is still the one a reusing call gets.
        assert_eq!(pool.with_instance(true, serve).unwrap(), (0, 0));
    }

    #[test]
    fn the_deadline_is_set_before_every_call() {
        let pool = pool();
        pool.warm().unwrap();
        for _ in 0..2 {
            pool.with_instance(true, |counter| {
                assert_eq!(counter.deadline, Some(TICKS));
                // Spent: the next call must arm it again.
                counter.deadline = None;
                Ok(())
            })
            .unwrap();
        }
        pool.with_instance(false, |counter| {
            assert_eq!(counter.deadline, Some(TICKS));
            Ok(())
        })
        .unwrap();
    }

    #[test]
    fn a_failure_is_named_from_the_failed_instances_evidence_and_the_pools_limits() {
        let pool = pool();
        let fault = pool
            .with_instance(true, |counter| -> wasmtime::Result<()> {
                counter.refused = Some(2 << 20);
                Err(Trap::UnreachableCodeReached.into())
            })
            .unwrap_err();
        assert_eq!(fault.kind, FaultKind::OutOfMemory, "{fault}");
        assert!(
            fault.reason.contains("2097152 bytes") && fault.reason.contains("1048576 bytes"),
            "{fault}"
        );
        let fault = pool
            .with_instance(true, |_| -> wasmtime::Result<()> {
                Err(Trap::Interrupt.into())
            })
            .unwrap_err();
        assert_eq!(fault.kind, FaultKind::Deadline);
        assert_eq!(fault.reason, "deadline of 25ms exceeded");
        assert_eq!(pool.idle(), 0);
    }

    #[test]
    fn an_instance_that_cannot_be_made_is_an_instantiation_fault_and_the_call_never_runs() {
        let pool = pool();
        pool.source().failing.store(true, Ordering::Relaxed);
        let mut ran = false;
        let fault = pool
            .with_instance(true, |_| {
                ran = true;
                Ok(())
            })
            .unwrap_err();
        assert_eq!(fault.kind, FaultKind::Instantiation);
        assert_eq!(
            fault.reason,
            "the plugin could not be instantiated: no slot left"
        );
        assert!(!ran);
    }

    /// The idle list is not locked during a call: a call made while another
    /// is running gets an instance of its own, and both come back.
    #[test]
    fn overlapping_calls_each_get_an_instance_and_both_are_pooled() {
        let pool = pool();
        pool.warm().unwrap();
        let (outer, inner) = pool
            .with_instance(true, |outer| {
                let inner = pool.with_instance(true, serve).unwrap();
                Ok((serve(outer)?, inner))
            })
            .unwrap();
        assert_eq!(outer, (0, 0));
        assert_eq!(inner, (1, 0));
        assert_eq!(pool.idle(), 2);
    }
}
