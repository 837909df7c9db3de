//! The `acemq-host` binary: everything lives in the library; see `cli`.

/// mimalloc rather than glibc's malloc: every delivery allocates and frees
/// across the runtime's threads (bodies, frames, headers), and glibc's
/// arena consolidation took about a sixth of the host's CPU on the
/// consume -> transform -> publish path; with mimalloc the host's CPU per
/// message there fell from about 51 to 37 µs (tests/benches/end_to_end.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    acemq_host::cli::main()
}
