//! Host-side bindings generated from `wit/plugin.wit`.
//!
//! Each world gets its own module because both generate the shared
//! `acemq:plugin/types` interface; keeping them apart avoids name clashes.

/// The `handler-plugin` world: imports `host`, exports `handler`.
pub mod handler_world {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "handler-plugin",
        // Messages are lent to the guest, not built for it: the host lowers
        // its own strings and body straight into guest memory.
        ownership: Borrowing { duplicate_if_necessary: true },
    });
}

/// The `codec-plugin` world: exports `codec`, imports nothing.
pub mod codec_world {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "codec-plugin",
    });
}
