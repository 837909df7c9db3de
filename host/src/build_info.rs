//! What `acemq-host --version` says: the release, the commit it was built
//! from, the wasmtime release it links and the plugin contracts it loads
//! (facts gathered by `host/build.rs`).

/// The long form of `--version`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ncommit: ",
    env!("ACEMQ_BUILD_COMMIT"),
    "\nwasmtime: ",
    env!("ACEMQ_WASMTIME_VERSION"),
    "\nplugin contract: acemq:plugin@",
    contract_version!(),
    " (also loads acemq:plugin@",
    legacy_contract_version!(),
    ")",
);

/// The commit the binary was built from (`unknown` outside a git checkout).
pub const COMMIT: &str = env!("ACEMQ_BUILD_COMMIT");
/// The wasmtime release the host links.
pub const WASMTIME: &str = env!("ACEMQ_WASMTIME_VERSION");
