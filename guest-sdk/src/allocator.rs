//! The memory allocator of a plugin (feature `allocator`, on by default).
//!
//! Rust's default allocator on wasm32 grows linear memory for its very first
//! allocation, and for every later one that does not fit. Growing is cheap for
//! the guest but not for the host: with `isolation = "per-message"` every
//! message gets a fresh instance, and each grow makes the host map pages in
//! (and, when the slot is reused, map them out again), which was about half of
//! what a fresh instance cost.
//!
//! So allocations are served first from an arena in the module's
//! zero-initialised data, which is part of the memory every instance starts
//! with: a handler that needs less than [`ARENA_BYTES`] never grows memory,
//! and arena pages it never touches cost nothing. Past the arena, memory
//! grows as usual, at least [`MIN_GROWTH_BYTES`] at a time. The allocator
//! itself is talc's; only where its memory comes from is decided here.

use core::alloc::Layout;
use core::mem::MaybeUninit;

use talc::base::Talc;
use talc::base::binning::Binning;
use talc::cell::TalcSyncCell;
use talc::source::Source;
use talc::wasm::WasmBinning;

/// Size of the arena in the module's data section.
pub const ARENA_BYTES: usize = 512 << 10;
/// Smallest growth once the arena is used up, so a busy plugin grows rarely.
pub const MIN_GROWTH_BYTES: usize = 1 << 20;
const WASM_PAGE_BYTES: usize = 64 << 10;

static mut ARENA: [MaybeUninit<u8>; ARENA_BYTES] = [MaybeUninit::uninit(); ARENA_BYTES];

/// Where talc gets memory: the arena once, then `memory.grow`.
#[derive(Debug)]
pub struct ArenaThenGrow {
    arena_claimed: bool,
}

// SAFETY: `acquire` hands talc only memory nothing else uses (the arena,
// claimed once, and pages just grown) and allocates nothing itself.
unsafe impl Source for ArenaThenGrow {
    fn acquire<B: Binning>(talc: &mut Talc<Self, B>, layout: Layout) -> Result<(), ()> {
        if !talc.source.arena_claimed {
            talc.source.arena_claimed = true;
            // SAFETY: the arena is used by nothing but this allocator, and
            // claimed exactly once.
            if unsafe { talc.claim((&raw mut ARENA).cast::<u8>(), ARENA_BYTES) }.is_some() {
                return Ok(());
            }
        }
        // Room for the allocation, its alignment and talc's bookkeeping.
        let needed = layout.size() + layout.align() + 64;
        let pages = needed.max(MIN_GROWTH_BYTES).div_ceil(WASM_PAGE_BYTES);
        let previous_pages = core::arch::wasm32::memory_grow::<0>(pages);
        if previous_pages == usize::MAX {
            return Err(());
        }
        let base = (previous_pages * WASM_PAGE_BYTES) as *mut u8;
        // SAFETY: the pages were just grown and belong to no one else.
        unsafe { talc.claim(base, pages * WASM_PAGE_BYTES) }
            .map(|_| ())
            .ok_or(())
    }
}

#[global_allocator]
static ALLOCATOR: TalcSyncCell<ArenaThenGrow, WasmBinning> =
    TalcSyncCell::new_wasm(ArenaThenGrow {
        arena_claimed: false,
    });
