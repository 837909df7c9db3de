//! Host-side bindings generated from `wit/plugin.wit`.
//!
//! Each world gets its own module because both generate the shared
//! `acemq:plugin/types` interface; keeping them apart avoids name clashes.

/// The `handler-plugin` world: imports `host`, exports `handler`.
pub mod handler_world {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "handler-plugin",
        // Every import may trap: the message methods do when a plugin uses a
        // message after its `handle` call returned (see `host/message.rs`).
        imports: { default: trappable },
        // Calls are futures on the async runtime (see `pool.rs`); the
        // imports stay synchronous: they only read and buffer.
        exports: { default: async },
        with: {
            // The message lent to a call is kept in the store's state, not in
            // a resource table: the handle only names the call it belongs to.
            "acemq:plugin/types.message": super::super::host::message::LentMessage,
        },
    });
}

/// The `codec-plugin` world: exports `codec`, imports nothing.
pub mod codec_world {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "codec-plugin",
        exports: { default: async },
    });
}
