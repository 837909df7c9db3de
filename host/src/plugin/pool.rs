//! Warm instances of one plugin version, and the one way a call gets and
//! gives back an instance. Handler and codec versions both call through a
//! [`Pool`]; they differ only in how an instance is made and what a call does
//! with it.
//!
//! The rules:
//!
//! - A call leases an idle instance when it may reuse one, and instantiates a
//!   fresh one when it may not or when none is idle. The idle list's lock is
//!   held only to pop and to push, never during a call, so concurrent calls
//!   each get their own instance and the pool grows to the concurrency seen.
//! - An instance goes back to the pool only after a call that succeeded
//!   ([`Lease::finish`]). After a trap, or any error from the call, it is
//!   dropped: its linear memory may be half-updated, and the component model
//!   forbids re-entering an instance that trapped. A lease dropped without
//!   `finish` (its call's future was dropped half-way, at shutdown or by a
//!   panic around it) drops its instance too: the guest stopped mid-call.
//! - Calls are futures on the async runtime (wasmtime's `call_async`), never
//!   a task on tokio's blocking pool: handing every delivery to another
//!   thread and back cost more than the call itself (futex waits and
//!   wake-ups dominated a profile of the host). A call that runs long does
//!   not hold its worker: every [`EPOCH_TICK`] the epoch callback either ends
//!   it (its deadline has passed: a trap, [`Trap::Interrupt`]) or yields to
//!   the runtime, so acks, heartbeats, the admin endpoint and other consumers
//!   run between its slices.
//! - The deadline is armed before every call, not once per instance: it is a
//!   wall-clock instant the epoch callback compares against, so one set when
//!   the instance was made would have run out while the instance sat idle.
//! - The epoch check only ends a guest that is running wasm. One waiting
//!   inside the host (a WASI sleep, a poll of a clock: every Python build
//!   imports WASI) runs no wasm, so every call and every instantiation is
//!   also bounded by a host-side timer ([`Deadline::bound`]): past its
//!   deadline the wait is dropped, the call fails as a deadline fault and
//!   its instance is discarded like any failed one. The timer fires one
//!   epoch tick after the deadline, so a guest computing is still ended by
//!   its own epoch check, with the usual reason.
//! - An instantiation that finds no free slot in the engine's instance pool
//!   waits for one (calls ending free theirs) until its deadline, and then
//!   fails as the host's fault ([`FaultKind::NoInstanceSlot`]), never the
//!   message's. The engine is sized so this does not happen
//!   (`capacity.rs`).
//! - A version that hot swap replaced is retired ([`Pool::retire`]): its
//!   idle instances are dropped at once and the calls still running on it
//!   drop theirs when they end, so the slots a swap needs are bounded by the
//!   consumer's concurrency, however many swaps follow each other.
//! - A failure is classified ([`fault::classify`]) while the failed instance
//!   is still at hand, so what the host saw during the call (a refused memory
//!   growth, the panic message the guest logged) names the fault.
//! - A version warms one instance when it loads: one real instantiation proves
//!   the plugin's start-up code runs, and leaves an instance ready for the
//!   first message.
//!
//! [`EPOCH_TICK`]: super::engine::EPOCH_TICK
//! [`Trap::Interrupt`]: wasmtime::Trap::Interrupt
//! [`FaultKind::NoInstanceSlot`]: super::FaultKind::NoInstanceSlot

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use wasmtime::{Engine, Store, UpdateDeadline};

use super::engine::EPOCH_TICK;
use super::fault::{self, CallEvidence, Fault, WaitedPastDeadline};
use super::limiter::MemoryLimiter;

/// How long after its deadline the host's timer cuts a call or an
/// instantiation still waiting inside the host: one epoch tick, so that a
/// guest running wasm meets its epoch check (and the reason that names
/// it) first.
const HOST_TIMER_GRACE: Duration = EPOCH_TICK;
/// How often an instantiation that found the instance pool full tries
/// again, until its deadline.
const SLOT_RETRY: Duration = Duration::from_millis(5);

/// When a call or an instantiation must end: the instant the epoch check
/// compares against, and the limit it came from (named in the fault).
#[derive(Debug, Clone, Copy)]
pub(super) struct Deadline {
    pub at: Instant,
    pub length: Duration,
}

impl Deadline {
    /// A deadline `length` from now.
    pub fn starting_now(length: Duration) -> Self {
        Self {
            at: Instant::now() + length,
            length,
        }
    }

    /// Runs `work` (a call into the plugin, or its instantiation) and ends
    /// it should it still be waiting inside the host once the deadline has
    /// passed: `work` is dropped there (wasmtime unwinds the guest's
    /// suspended stack) and the result is [`WaitedPastDeadline`], a
    /// deadline fault. Needs a tokio runtime with timers, as every caller
    /// has ([`block_on_loading`] makes one for loading).
    pub async fn bound<T>(
        self,
        work: impl Future<Output = wasmtime::Result<T>>,
    ) -> wasmtime::Result<T> {
        let cut_at = tokio::time::Instant::from_std(self.at + HOST_TIMER_GRACE);
        match tokio::time::timeout_at(cut_at, work).await {
            Ok(result) => result,
            Err(_elapsed) => Err(wasmtime::Error::new(WaitedPastDeadline {
                deadline: self.length,
            })),
        }
    }
}

/// What the pool holds: something that can be armed with a deadline before a
/// call and questioned after one failed.
pub(super) trait Instance: Send {
    /// Sets the call's deadline: the call traps once `at` has passed.
    fn arm(&mut self, at: Instant);
    /// What the host observed during the call that just failed.
    fn evidence(&self) -> CallEvidence;
    /// Bytes of linear memory the instance holds.
    fn memory_bytes(&self) -> usize;
}

/// Makes the instances of one version (its engine, pre-linked code, limits).
pub(super) trait Instantiate: Send + Sync {
    type Instance: Instance;
    /// Instantiates; start-up code in the plugin runs under `deadline` (the
    /// epoch check; the pool bounds the whole with [`Deadline::bound`]).
    fn instantiate(
        &self,
        deadline: Instant,
    ) -> impl Future<Output = wasmtime::Result<Self::Instance>> + Send;
}

/// What every plugin store's data holds for the pool: the instance's memory
/// limiter and the running call's deadline.
pub(super) struct CallBounds {
    pub limiter: MemoryLimiter,
    /// When the running call must end.
    pub deadline: Instant,
}

impl CallBounds {
    pub fn new(max_memory_bytes: u64) -> Self {
        Self {
            limiter: MemoryLimiter::new(usize::try_from(max_memory_bytes).unwrap_or(usize::MAX)),
            deadline: Instant::now(),
        }
    }
}

/// The data of a plugin store: its [`CallBounds`], and what it observed
/// during a call.
pub(super) trait Observed: Send + 'static {
    fn evidence(&self) -> CallEvidence;
    fn bounds(&mut self) -> &mut CallBounds;
    fn bounds_ref(&self) -> &CallBounds;
}

/// Drives `future` to its end, blocking this thread: how a plugin's warm-up
/// instantiation runs while it loads (loading is blocking work).
///
/// On a tokio runtime of its own (current-thread, with timers): the
/// instantiation's deadline is a tokio timer ([`Deadline::bound`]), and a
/// plugin's start-up code may sleep through WASI, whose clocks are tokio
/// timers too. Never on a thread inside another runtime: a runtime cannot
/// be started there, and the epoch callback of [`new_store`] yields through
/// `tokio::task::yield_now`, whose wake-up a worker of that runtime defers
/// until it next polls its own tasks, which a worker stuck here never does
/// (an instantiation that outlasted one epoch tick then hung for good:
/// `replay --compare` loading plugins on a worker, under load). Inside a
/// runtime it runs on a thread of its own instead.
pub(super) fn block_on_loading<F>(future: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    let run = |future: F| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("cannot start a runtime to load a plugin on")
            .block_on(future)
    };
    if tokio::runtime::Handle::try_current().is_err() {
        return run(future);
    }
    std::thread::scope(|scope| {
        scope
            .spawn(|| run(future))
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// A store for one plugin instance, with `data`: memory bounded by its
/// limiter, and calls bounded by the deadline in its data (see the module
/// doc: they yield between epoch ticks and trap once it has passed).
pub(super) fn new_store<D: Observed>(engine: &Engine, data: D, deadline: Instant) -> Store<D> {
    let mut store = Store::new(engine, data);
    store.limiter(|data| &mut data.bounds().limiter);
    store.epoch_deadline_callback(|mut context| {
        Ok(if Instant::now() >= context.data_mut().bounds().deadline {
            UpdateDeadline::Interrupt
        } else {
            // One more tick, after letting the runtime run everything else.
            // tokio's own yield, not wasmtime's plain one: a task that wakes
            // itself is merely queued behind the others, and the I/O driver
            // is polled only every few dozen polls, which with every worker
            // running a long call is once every few hundred milliseconds;
            // `yield_now` is deferred until the worker has polled I/O, so
            // deliveries, acks and heartbeats move between two slices.
            UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now()))
        })
    });
    arm_store(&mut store, deadline);
    store
}

fn arm_store<D: Observed>(store: &mut Store<D>, at: Instant) {
    store.data_mut().bounds().deadline = at;
    // The callback runs at the next tick, and decides then.
    store.set_epoch_deadline(1);
}

/// A wasmtime instance ready to take a call: its bindings, with the store
/// they live in.
pub(super) struct Warm<D: 'static, B> {
    pub store: Store<D>,
    pub bindings: B,
}

impl<D: Observed, B: Send> Instance for Warm<D, B> {
    fn arm(&mut self, at: Instant) {
        arm_store(&mut self.store, at);
    }

    fn evidence(&self) -> CallEvidence {
        self.store.data().evidence()
    }

    fn memory_bytes(&self) -> usize {
        self.store.data().bounds_ref().limiter.total()
    }
}

/// The warm instances of one version, and what a call of it is allowed.
pub(super) struct Pool<S: Instantiate> {
    source: S,
    idle: Mutex<Idle<S::Instance>>,
    deadline: Duration,
    /// The linear-memory limit, named in an out-of-memory fault's reason.
    memory_limit: u64,
    /// The most linear memory an instance held, in bytes (see
    /// [`InstanceCost`]). Atomics, not a lock: updated after every call.
    largest_memory: AtomicUsize,
    /// How long the last instantiation took, in nanoseconds.
    last_instantiation_nanos: AtomicU64,
}

/// What one instance of a version costs the host: the figures an operator
/// sizes `max_memory_bytes`, `concurrency` and `isolation` by (an
/// interpreter's instance is megabytes and milliseconds, a Rust guest's
/// kilobytes and microseconds), shown on `GET /plugins`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InstanceCost {
    /// How long the last instantiation took (the warm-up's, until a call
    /// instantiates).
    pub instantiation: Duration,
    /// The most linear memory any instance held after a successful call
    /// (or its instantiation): what each pooled instance keeps.
    pub memory_bytes: usize,
}

/// A pool's idle instances, and whether the pool still takes any back.
struct Idle<I> {
    instances: Vec<I>,
    /// Set by [`Pool::retire`]: instances are dropped after their call.
    retired: bool,
}

/// One call's instance, taken from its pool or made for it. Give it back
/// with [`Lease::finish`]; dropped otherwise, it is never reused.
pub(super) struct Lease<'p, S: Instantiate> {
    pool: &'p Pool<S>,
    instance: S::Instance,
    /// Whether a successful call returns the instance to the pool.
    reuse: bool,
    /// The call's deadline, armed in the instance; bound the call with it.
    deadline: Deadline,
}

impl<S: Instantiate> Lease<'_, S> {
    pub fn instance(&mut self) -> &mut S::Instance {
        &mut self.instance
    }

    /// The call's deadline: the caller bounds the call with
    /// [`Deadline::bound`], so a call waiting inside the host ends too.
    pub fn deadline(&self) -> Deadline {
        self.deadline
    }

    /// Ends the call with what it returned: a success gives a reusable
    /// instance back to the pool; a failure is classified and the instance
    /// dropped (see the module doc).
    pub fn finish<R>(self, result: wasmtime::Result<R>) -> Result<R, Fault> {
        let Lease {
            pool,
            instance,
            reuse,
            ..
        } = self;
        match result {
            Ok(answer) => {
                pool.saw_memory(instance.memory_bytes());
                if reuse {
                    pool.give_back(instance);
                }
                Ok(answer)
            }
            Err(e) => Err(fault::classify(
                &e,
                &instance.evidence(),
                pool.deadline,
                pool.memory_limit,
            )),
        }
    }
}

impl<S: Instantiate> Pool<S> {
    /// An empty pool; [`Pool::warm`] fills it.
    pub fn new(source: S, deadline: Duration, memory_limit: u64) -> Self {
        Self {
            source,
            idle: Mutex::new(Idle {
                instances: Vec::new(),
                retired: false,
            }),
            deadline,
            memory_limit,
            largest_memory: AtomicUsize::new(0),
            last_instantiation_nanos: AtomicU64::new(0),
        }
    }

    /// What an instance of this version costs, as last seen.
    pub fn cost(&self) -> InstanceCost {
        InstanceCost {
            instantiation: Duration::from_nanos(
                self.last_instantiation_nanos.load(Ordering::Relaxed),
            ),
            memory_bytes: self.largest_memory.load(Ordering::Relaxed),
        }
    }

    fn saw_memory(&self, bytes: usize) {
        self.largest_memory.fetch_max(bytes, Ordering::Relaxed);
    }

    /// Makes an instance, timing it, within the pool's deadline: the
    /// plugin's start-up code is bounded like a call, whether it computes
    /// (the epoch check) or waits inside the host (the host's timer). An
    /// engine pool with no free slot is tried again until the deadline;
    /// what then fails still says so ([`fault::is_out_of_slots`]).
    async fn instantiate(&self) -> wasmtime::Result<S::Instance> {
        let deadline = Deadline::starting_now(self.deadline);
        loop {
            let started = Instant::now();
            let attempt = deadline.bound(self.source.instantiate(deadline.at)).await;
            match attempt {
                Ok(instance) => {
                    let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    self.last_instantiation_nanos.store(took, Ordering::Relaxed);
                    self.saw_memory(instance.memory_bytes());
                    return Ok(instance);
                }
                Err(e)
                    if fault::is_out_of_slots(&e) && Instant::now() + SLOT_RETRY < deadline.at =>
                {
                    tracing::debug!(error = %e, "no free plugin instance slot; waiting for one");
                    tokio::time::sleep(SLOT_RETRY).await;
                }
                Err(e) => {
                    if fault::is_out_of_slots(&e) {
                        tracing::warn!(error = %e, deadline = %humantime::format_duration(self.deadline),
                            "no free plugin instance slot until the deadline; the delivery is given back");
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Returns an instance after a successful call, unless the pool retired.
    fn give_back(&self, instance: S::Instance) {
        let mut idle = self.idle.lock().expect("idle pool poisoned");
        if !idle.retired {
            idle.instances.push(instance);
        }
    }

    /// Retires the pool (its version was swapped out): the idle instances
    /// are dropped now, and those of calls still running when they end, so
    /// an old version holds no instance slot but its running calls'.
    pub fn retire(&self) {
        let dropped = {
            let mut idle = self.idle.lock().expect("idle pool poisoned");
            idle.retired = true;
            std::mem::take(&mut idle.instances)
        };
        drop(dropped);
    }

    /// What makes this pool's instances.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// Instantiates one instance and leaves it idle.
    pub async fn warm(&self) -> wasmtime::Result<()> {
        let instance = self.instantiate().await?;
        self.give_back(instance);
        Ok(())
    }

    /// Idle instances currently pooled.
    pub fn idle(&self) -> usize {
        self.idle
            .lock()
            .expect("idle pool poisoned")
            .instances
            .len()
    }

    /// An instance for one call, armed with the call's deadline. With
    /// `reuse`, it comes from the pool when one is idle and goes back to it
    /// after a successful call; without, it is made for this call alone and
    /// the pool is not touched.
    pub async fn lease(&self, reuse: bool) -> Result<Lease<'_, S>, Fault> {
        let idle = if reuse {
            self.idle
                .lock()
                .expect("idle pool poisoned")
                .instances
                .pop()
        } else {
            None
        };
        let mut instance = match idle {
            Some(instance) => instance,
            // Boxed: instantiating's future is kilobytes (wasmtime's, and
            // the deadline's timer), and inline it would be part of every
            // call's future, which each delivery's future holds and moves
            // whether or not an instance is made (see `CodecSet::convert`).
            None => Box::pin(self.instantiate())
                .await
                .map_err(|e| fault::instantiation_failed(&e, self.deadline))?,
        };
        // The call's own deadline starts now, whatever instantiating took.
        let deadline = Deadline::starting_now(self.deadline);
        instance.arm(deadline.at);
        Ok(Lease {
            pool: self,
            instance,
            reuse,
            deadline,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use wasmtime::Trap;

    use super::*;
    use crate::plugin::FaultKind;

    /// An instance that needs no wasm: it knows which one it is, counts its
    /// calls and remembers its deadline and a refused memory growth.
    #[derive(Debug)]
    struct Counter {
        id: usize,
        calls: u32,
        deadline: Option<Instant>,
        refused: Option<usize>,
    }

    impl Instance for Counter {
        fn arm(&mut self, at: Instant) {
            self.deadline = Some(at);
        }

        fn evidence(&self) -> CallEvidence {
            CallEvidence {
                refused_memory: self.refused,
                last_error_log: None,
                guest_error: None,
            }
        }

        /// Grows by a page with every call, so the pool's view of it shows.
        fn memory_bytes(&self) -> usize {
            (self.calls as usize + 1) << 16
        }
    }

    /// Numbers the instances it makes; fails to make one when told to, or
    /// waits for ever (a start-up sleeping inside the host) when told to.
    #[derive(Default)]
    struct Counters {
        made: AtomicUsize,
        failing: AtomicBool,
        hanging: AtomicBool,
    }

    impl Instantiate for Counters {
        type Instance = Counter;

        async fn instantiate(&self, _deadline: Instant) -> wasmtime::Result<Counter> {
            if self.failing.load(Ordering::Relaxed) {
                return Err(wasmtime::Error::msg("no slot left"));
            }
            if self.hanging.load(Ordering::Relaxed) {
                std::future::pending::<()>().await;
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

    fn pool() -> Pool<Counters> {
        Pool::new(Counters::default(), DEADLINE, 1 << 20)
    }

    fn made(pool: &Pool<Counters>) -> usize {
        pool.source().made.load(Ordering::Relaxed)
    }

    /// Drives `future` on a runtime with timers, as the host's calls run.
    fn block_on<F: Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(future)
    }

    /// One call through a lease, as handler and codec calls are made.
    fn call<R>(
        pool: &Pool<Counters>,
        reuse: bool,
        body: impl FnOnce(&mut Counter) -> wasmtime::Result<R>,
    ) -> Result<R, Fault> {
        block_on(async {
            let mut lease = pool.lease(reuse).await?;
            let result = body(lease.instance());
            lease.finish(result)
        })
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

    /// Inside a runtime, what loading drives may yield through tokio (as a
    /// plugin's start code past an epoch tick does) and still completes.
    #[test]
    fn loading_inside_a_runtime_completes_across_tokio_yields() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            runtime.block_on(async {
                block_on_loading(async {
                    for _ in 0..3 {
                        tokio::task::yield_now().await;
                    }
                });
            });
            let _ = done.send(());
        });
        finished
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("loading on a runtime thread hung on tokio's yield");
    }

    /// Outside any runtime too (the host loads its plugins before it starts
    /// one): what loading drives may use tokio's timers.
    #[test]
    fn loading_outside_a_runtime_has_timers() {
        block_on_loading(async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            tokio::task::yield_now().await;
        });
    }

    /// A call waiting inside the host (a WASI sleep: no wasm runs, so no
    /// epoch check) is cut by the host's timer soon after its deadline, as
    /// a deadline fault; its instance is not pooled, and the next call
    /// gets a fresh one.
    #[test]
    fn a_call_waiting_inside_the_host_ends_at_its_deadline_and_its_instance_is_dropped() {
        let pool = pool();
        block_on(pool.warm()).unwrap();
        let started = Instant::now();
        let fault = block_on(async {
            let mut lease = pool.lease(true).await?;
            let deadline = lease.deadline();
            lease.instance().calls += 1;
            let waited = deadline
                .bound(std::future::pending::<wasmtime::Result<()>>())
                .await;
            lease.finish(waited)
        })
        .unwrap_err();
        let took = started.elapsed();
        assert_eq!(fault.kind, FaultKind::Deadline, "{fault}");
        assert_eq!(
            fault.reason,
            "deadline of 25ms exceeded while the plugin waited inside the host (a WASI sleep or poll)"
        );
        assert!(took >= DEADLINE && took < DEADLINE * 20, "{took:?}");
        assert_eq!(pool.idle(), 0, "the instance that timed out was pooled");
        assert_eq!(call(&pool, true, serve).unwrap(), (1, 0));
    }

    /// Start-up code that waits inside the host is bounded the same way:
    /// warming (what loading and hot swap do) fails at the deadline, and so
    /// does a call that has to instantiate, as a deadline fault.
    #[test]
    fn an_instantiation_waiting_inside_the_host_ends_at_its_deadline() {
        let pool = pool();
        pool.source().hanging.store(true, Ordering::Relaxed);
        let started = Instant::now();
        let error = block_on_loading(pool.warm()).unwrap_err();
        assert!(started.elapsed() < DEADLINE * 20, "{:?}", started.elapsed());
        assert!(
            error.to_string().starts_with("deadline of 25ms exceeded"),
            "{error:#}"
        );
        assert_eq!(pool.idle(), 0);
        let fault = call(&pool, true, serve).unwrap_err();
        assert_eq!(fault.kind, FaultKind::Deadline, "{fault}");
        assert!(
            fault
                .reason
                .contains("while the plugin was being instantiated"),
            "{fault}"
        );
    }

    /// A retired pool (its version swapped out) holds no idle instance, and
    /// takes back none from calls that were still running on it.
    #[test]
    fn a_retired_pool_drops_its_idle_instances_and_keeps_none_after_a_call() {
        let pool = pool();
        block_on(pool.warm()).unwrap();
        block_on(async {
            let mut running = pool.lease(true).await.unwrap();
            pool.warm().await.unwrap();
            assert_eq!(pool.idle(), 1);
            pool.retire();
            assert_eq!(pool.idle(), 0);
            let served = serve(running.instance());
            running.finish(served).unwrap();
        });
        assert_eq!(pool.idle(), 0, "a retired pool took an instance back");
        // Still callable: a call that had loaded the old version finishes.
        call(&pool, true, serve).unwrap();
        assert_eq!(pool.idle(), 0);
    }

    /// What the host's engine makes of a component with one memory: enough
    /// to take one of its pool's slots.
    struct OneMemory {
        engine: Engine,
        component: wasmtime::component::Component,
    }

    struct Bounds(CallBounds);

    impl Observed for Bounds {
        fn evidence(&self) -> CallEvidence {
            CallEvidence::default()
        }
        fn bounds(&mut self) -> &mut CallBounds {
            &mut self.0
        }
        fn bounds_ref(&self) -> &CallBounds {
            &self.0
        }
    }

    impl Instantiate for OneMemory {
        type Instance = Warm<Bounds, ()>;

        async fn instantiate(&self, deadline: Instant) -> wasmtime::Result<Self::Instance> {
            let mut store = new_store(&self.engine, Bounds(CallBounds::new(1 << 20)), deadline);
            wasmtime::component::Linker::new(&self.engine)
                .instantiate_async(&mut store, &self.component)
                .await?;
            Ok(Warm {
                store,
                bindings: (),
            })
        }
    }

    /// On the host's engine sized for one instance: an instantiation that
    /// finds the pool full waits for the slot and gets it when the running
    /// call lets go; one that waits out its deadline fails as the host's
    /// fault, not as the plugin's.
    #[test]
    fn an_instantiation_waits_for_a_slot_and_a_full_pool_is_the_hosts_fault() {
        let engine = crate::plugin::PluginEngine::new(crate::plugin::EngineSettings {
            max_instances: 1,
            max_memory_bytes: 1 << 20,
            ..crate::plugin::EngineSettings::default()
        })
        .unwrap();
        if !engine.uses_pooling() {
            return; // No address space for a pool here: nothing runs out.
        }
        let wat = "(component (core module $m (memory 1)) (core instance $i (instantiate $m)))";
        let component =
            wasmtime::component::Component::new(engine.engine(), wat::parse_str(wat).unwrap())
                .unwrap();
        let deadline = Duration::from_millis(300);
        let pool = Pool::new(
            OneMemory {
                engine: engine.engine().clone(),
                component,
            },
            deadline,
            1 << 20,
        );
        block_on(async {
            let first = pool.lease(false).await.unwrap();
            let let_go = async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                drop(first);
            };
            let (second, ()) = tokio::join!(pool.lease(false), let_go);
            let _second = second.expect("the slot the first call let go");
            let started = Instant::now();
            let fault = pool.lease(false).await.err().expect("a third instance");
            assert_eq!(fault.kind, FaultKind::NoInstanceSlot, "{fault}");
            assert!(fault.kind.is_the_hosts());
            // It gives up once another try would end past the deadline.
            let waited = started.elapsed();
            assert!(waited >= deadline - SLOT_RETRY, "{waited:?}");
            assert!(
                fault
                    .reason
                    .starts_with("the host had no free plugin instance slot for 300ms"),
                "{fault}"
            );
        });
    }

    #[test]
    fn warming_leaves_one_instance_idle() {
        let pool = pool();
        assert_eq!((pool.idle(), made(&pool)), (0, 0));
        block_on(pool.warm()).unwrap();
        assert_eq!((pool.idle(), made(&pool)), (1, 1));
    }

    #[test]
    fn a_warming_that_cannot_instantiate_fails_and_pools_nothing() {
        let pool = pool();
        pool.source().failing.store(true, Ordering::Relaxed);
        assert!(block_on(pool.warm()).is_err());
        assert_eq!(pool.idle(), 0);
    }

    #[test]
    fn after_a_success_the_instance_is_returned_and_reused() {
        let pool = pool();
        block_on(pool.warm()).unwrap();
        assert_eq!(call(&pool, true, serve).unwrap(), (0, 0));
        assert_eq!(pool.idle(), 1);
        assert_eq!(call(&pool, true, serve).unwrap(), (0, 1));
        assert_eq!(made(&pool), 1, "a call instantiated beside the warm one");
    }

    #[test]
    fn an_empty_pool_instantiates_and_keeps_the_instance() {
        let pool = pool();
        assert_eq!(call(&pool, true, serve).unwrap(), (0, 0));
        assert_eq!(pool.idle(), 1);
        assert_eq!(call(&pool, true, serve).unwrap(), (0, 1));
    }

    #[test]
    fn after_a_failure_the_instance_is_dropped_and_the_next_call_gets_a_fresh_one() {
        let pool = pool();
        block_on(pool.warm()).unwrap();
        let fault = call(&pool, true, trap).unwrap_err();
        assert_eq!(fault.kind, FaultKind::Trap, "{fault}");
        assert_eq!(pool.idle(), 0, "the instance that trapped was pooled");
        assert_eq!(call(&pool, true, serve).unwrap(), (1, 0));
        assert_eq!(pool.idle(), 1);
    }

    /// A call abandoned half-way (its future dropped) leaves its instance
    /// in an unknown state: it must not be reused.
    #[test]
    fn a_lease_dropped_without_finishing_never_returns_its_instance() {
        let pool = pool();
        block_on(pool.warm()).unwrap();
        {
            let _abandoned = block_on(pool.lease(true)).unwrap();
        }
        assert_eq!(pool.idle(), 0);
        assert_eq!(call(&pool, true, serve).unwrap(), (1, 0));
    }

    #[test]
    fn without_reuse_every_call_gets_a_fresh_instance_and_the_pool_is_left_alone() {
        let pool = pool();
        block_on(pool.warm()).unwrap();
        assert_eq!(call(&pool, false, serve).unwrap(), (1, 0));
        assert_eq!(call(&pool, false, serve).unwrap(), (2, 0));
        assert_eq!(call(&pool, false, trap).unwrap_err().kind, FaultKind::Trap);
        assert_eq!(pool.idle(), 1, "only the warm instance is idle");
        assert_eq!(made(&pool), 4);
        // The warm instance is still the one a reusing call gets.
        assert_eq!(call(&pool, true, serve).unwrap(), (0, 0));
    }

    #[test]
    fn the_deadline_is_armed_before_every_call() {
        let pool = pool();
        block_on(pool.warm()).unwrap();
        for reuse in [true, true, false] {
            let before = Instant::now();
            call(&pool, reuse, |counter| {
                let at = counter.deadline.expect("armed");
                assert!(at >= before + DEADLINE && at <= Instant::now() + DEADLINE);
                // Spent: the next call must arm it again.
                counter.deadline = None;
                Ok(())
            })
            .unwrap();
        }
    }

    #[test]
    fn a_failure_is_named_from_the_failed_instances_evidence_and_the_pools_limits() {
        let pool = pool();
        let fault = call(&pool, true, |counter| -> wasmtime::Result<()> {
            counter.refused = Some(2 << 20);
            Err(Trap::UnreachableCodeReached.into())
        })
        .unwrap_err();
        assert_eq!(fault.kind, FaultKind::OutOfMemory, "{fault}");
        assert!(
            fault.reason.contains("2097152 bytes") && fault.reason.contains("1048576 bytes"),
            "{fault}"
        );
        let fault = call(&pool, true, |_| -> wasmtime::Result<()> {
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
        let fault = call(&pool, true, |_| {
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
        block_on(pool.warm()).unwrap();
        block_on(async {
            let mut outer = pool.lease(true).await.unwrap();
            let mut inner = pool.lease(true).await.unwrap();
            let inner_served = serve(inner.instance());
            assert_eq!(inner.finish(inner_served).unwrap(), (1, 0));
            let outer_served = serve(outer.instance());
            assert_eq!(outer.finish(outer_served).unwrap(), (0, 0));
        });
        assert_eq!(pool.idle(), 2);
    }

    /// The cost is the largest memory any instance held after a successful
    /// call; a failed call's instance is dropped and not counted.
    #[test]
    fn the_cost_names_the_largest_memory_an_instance_kept() {
        let pool = pool();
        block_on(pool.warm()).unwrap();
        assert_eq!(pool.cost().memory_bytes, 1 << 16, "after instantiating");
        call(&pool, true, serve).unwrap();
        call(&pool, true, serve).unwrap();
        assert_eq!(pool.cost().memory_bytes, 3 << 16);
        call(&pool, false, serve).unwrap();
        assert_eq!(pool.cost().memory_bytes, 3 << 16, "a smaller fresh one");
        let _ = call(&pool, true, |counter| {
            counter.calls += 10;
            trap(counter)
        });
        assert_eq!(
            pool.cost().memory_bytes,
            3 << 16,
            "a failed call's instance"
        );
    }
}
