//! The `acemq-host` binary: everything lives in the library; see `cli`.

fn main() -> std::process::ExitCode {
    acemq_host::cli::main()
}
