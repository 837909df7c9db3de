//! The async runtime the host runs on, and how many workers it has.
//!
//! One worker per core unless `[host] worker_threads` says otherwise. The
//! host's broker I/O does not run on the runtime's workers: each AMQP
//! connection (the host has two, one to consume and one to publish) reads
//! and writes its socket on a thread of lapin's own, busy under load (about
//! a third of the host's CPU on the echo path); only the socket's readiness
//! comes through the runtime's I/O driver. So at high rates of light
//! messages a worker per core means more busy threads than cores, and the
//! workers keep waking each other to steal work (see
//! `broker/placement.rs`, which removes most of that). What remains is
//! tokio's own: a worker woken for a task that lapin's thread scheduled
//! wakes another to keep searching, which finds nothing and parks
//! (measured in docs/benchmarks.md). A subscription's deliveries avoid it
//! by waking their task through the runtime's I/O driver
//! (`broker/driver_wake.rs`); lapin's other wake-ups (confirms, acks
//! written) still come through the scheduler. At low rates of heavy messages (a
//! Python or JavaScript plugin) those threads are idle and every worker
//! runs calls. Measured on two cores (`cargo bench -p acemq-tests --bench
//! end_to_end`, medians of 3; docs/benchmarks.md): one worker instead of
//! two cut the echo path's CPU per message by about a fifth before the
//! subscriptions' wake-ups went through the driver; since, one and two
//! cost the same there. One worker still costs the JavaScript order
//! router a third of its rate, so the default keeps every core.

use std::num::NonZeroUsize;

/// The runtime's workers when `[host] worker_threads` does not say: one per
/// core.
fn default_worker_threads() -> NonZeroUsize {
    std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN)
}

/// The multi-threaded runtime with `workers` workers (the default when
/// `None`), timers and I/O enabled.
///
/// # Errors
/// When the operating system refuses the threads.
pub fn build(workers: Option<NonZeroUsize>) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.unwrap_or_else(default_worker_threads).get())
        .enable_all()
        .build()
}
