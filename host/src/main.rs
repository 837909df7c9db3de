//! The `acemq-host` binary: everything lives in the library; see `cli`.

use std::ffi::c_long;

use libmimalloc_sys::{mi_option_set, mi_option_t};

/// mimalloc rather than glibc's malloc: every delivery allocates and frees
/// across the runtime's threads (bodies, frames, headers), and glibc's
/// arena consolidation took about a sixth of the host's CPU on the
/// consume -> transform -> publish path; with mimalloc the host's CPU per
/// message there fell from about 51 to 37 µs (tests/benches/end_to_end.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_arena_max_object_size` (its place in the
/// `mi_option_e` enum of mimalloc 3, which `libmimalloc-sys` does not name):
/// blocks larger than this many KiB are mapped from the OS for themselves,
/// and unmapped when freed, instead of being carved from mimalloc's arena.
/// Checked against the option's default by a test below.
const MI_OPTION_ARENA_MAX_OBJECT_SIZE: mi_option_t = 45;

/// Blocks above 1 MiB come from the OS, so that a connection's buffers are
/// never resident beyond what traffic touched, however many reconnects.
///
/// lapin gives each connection two buffers of 32 frames, 4 MiB each at
/// RabbitMQ's `frame_max` of 128 KiB, allocated zeroed. The first ones are
/// fresh pages, and only what traffic writes becomes resident. After a
/// reconnect, though, the new buffers were carved from the old ones' freed
/// arena memory, and zeroing them made every page resident: the soak's
/// resident set rose about 10 MiB over its first two recoveries and stayed
/// there (16 MiB for the two connections' four buffers, less what traffic
/// had already touched). Mapped for themselves, the buffers start untouched
/// again after every reconnect. So few blocks are this large (connection
/// buffers, a very large body, a plugin compiling) that one mapping each
/// costs nothing measurable.
const LARGEST_ARENA_BLOCK_KIB: c_long = 1024;

/// Has mimalloc map every block above [`LARGEST_ARENA_BLOCK_KIB`] for
/// itself. Called first thing in `main`, before the host starts any thread.
fn map_large_blocks_for_themselves() {
    // SAFETY: sets one of mimalloc's options, read on each large allocation;
    // `main` calls this before any other thread exists, so no read races it.
    unsafe { mi_option_set(MI_OPTION_ARENA_MAX_OBJECT_SIZE, LARGEST_ARENA_BLOCK_KIB) };
}

fn main() -> std::process::ExitCode {
    map_large_blocks_for_themselves();
    acemq_host::cli::main()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process's anonymous resident memory, in bytes.
    fn resident_anonymous() -> usize {
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        let kib: usize = status
            .lines()
            .find_map(|line| line.strip_prefix("RssAnon:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("RssAnon in /proc/self/status");
        kib << 10
    }

    /// Four buffers like a connection pair's, zeroed, with their first
    /// 256 KiB written as traffic would.
    fn connection_buffers() -> Vec<Vec<u8>> {
        let mut buffers: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; 4 << 20]).collect();
        for buffer in &mut buffers {
            for page in (0..256 << 10).step_by(4096) {
                buffer[page] = 1;
            }
        }
        buffers
    }

    #[test]
    fn the_option_set_is_the_arena_block_limit() {
        // SAFETY: reads an option.
        let default = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_ARENA_MAX_OBJECT_SIZE) };
        // mimalloc 3's default for this option alone: 2 GiB, in KiB. Another
        // index (the enum changed) would read another option's value.
        if std::env::var_os("MIMALLOC_ARENA_MAX_OBJECT_SIZE").is_none() {
            assert!(
                default == 2 << 20 || default == LARGEST_ARENA_BLOCK_KIB,
                "option {MI_OPTION_ARENA_MAX_OBJECT_SIZE} reads {default}: not mimalloc's arena_max_object_size"
            );
        }
    }

    /// The reconnect the soak showed: buffers freed, and new ones allocated
    /// zeroed. With the limit, the new ones cost no more resident memory
    /// than the old (without it, about 15 MiB more: every page zeroed).
    #[test]
    fn buffers_allocated_again_after_a_reconnect_start_untouched() {
        map_large_blocks_for_themselves();
        let first = connection_buffers();
        let before = resident_anonymous();
        drop(first);
        let again = connection_buffers();
        let after = resident_anonymous();
        let grew = after.saturating_sub(before);
        assert!(
            grew < 4 << 20,
            "the buffers made again added {} KiB resident (from {} to {} KiB)",
            grew >> 10,
            before >> 10,
            after >> 10
        );
        drop(again);
    }
}
