//! An allocator wrapper that counts allocations, for benchmarks that report
//! allocations per message beside CPU per message: a count is exact and
//! free of the machine's noise, so a change that removes allocations shows
//! in one run, where its CPU effect may hide in the noise of several.
//!
//! Cheap enough to leave on in a measuring binary: each thread counts on a
//! cache line of its own with a plain load and store (no locked
//! read-modify-write, no line shared between cores). Threads beyond
//! [`SLOTS`] share one overflow counter, which they add to atomically.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Threads with a counter of their own.
const SLOTS: usize = 256;

/// One thread's count, alone on its cache line.
#[repr(align(64))]
struct Slot(AtomicU64);

static COUNTS: [Slot; SLOTS] = [const { Slot(AtomicU64::new(0)) }; SLOTS];
static OVERFLOW: AtomicU64 = AtomicU64::new(0);
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's slot; `usize::MAX` until its first allocation.
    /// A `const` thread-local without a destructor: safe to touch from the
    /// allocator, at any point of a thread's life.
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// `A`, counting every allocation (`alloc`, `alloc_zeroed` and `realloc`).
pub struct Counting<A>(pub A);

impl<A> Counting<A> {
    fn count() {
        // `try_with` fails only while the thread's locals are torn down;
        // such an allocation goes to the overflow counter.
        let slot = SLOT
            .try_with(|slot| {
                if slot.get() == usize::MAX {
                    slot.set(NEXT_SLOT.fetch_add(1, Ordering::Relaxed));
                }
                slot.get()
            })
            .unwrap_or(usize::MAX);
        match COUNTS.get(slot) {
            // Only this thread writes its slot: load and store suffice.
            Some(Slot(count)) => count.store(count.load(Ordering::Relaxed) + 1, Ordering::Relaxed),
            None => {
                OVERFLOW.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

// SAFETY: every call is passed to `A` unchanged; counting allocates nothing.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::count();
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::count();
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::count();
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.dealloc(ptr, layout) }
    }
}

/// Allocations made so far by every thread of the process (when its global
/// allocator is a [`Counting`]; zero otherwise). A thread's latest counts
/// may be read a moment late, which a span of thousands of messages does
/// not notice.
pub fn allocations() -> u64 {
    COUNTS
        .iter()
        .map(|Slot(count)| count.load(Ordering::Relaxed))
        .sum::<u64>()
        + OVERFLOW.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    static COUNTED: Counting<std::alloc::System> = Counting(std::alloc::System);

    #[test]
    fn counts_each_allocation_on_every_thread() {
        let layout = Layout::from_size_align(32, 8).unwrap();
        let allocate = |times: usize| {
            for _ in 0..times {
                // SAFETY: a valid layout; the block is freed at once.
                unsafe {
                    let block = COUNTED.alloc(layout);
                    assert!(!block.is_null());
                    COUNTED.dealloc(block, layout);
                }
            }
        };
        let before = allocations();
        allocate(10);
        std::thread::scope(|s| {
            s.spawn(|| allocate(5));
            s.spawn(|| allocate(7));
        });
        // Other tests of this binary allocate through the system allocator
        // directly (it is not the global one here), so the count is exact.
        assert_eq!(allocations() - before, 22);
    }
}
