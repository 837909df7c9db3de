//! Host-side bindings generated from the contract: `wit/plugin.wit` (0.4,
//! this host's own) and `wit/v0.3/plugin.wit` (the frozen 0.3, so a plugin
//! built before the host was upgraded still loads: see `host/v0_3.rs`).
//!
//! Each world gets its own module because both generate the shared
//! `acemq:plugin/types` interface; keeping them apart avoids name clashes.

/// The `handler-plugin` world: imports `host` and `state`, exports `handler`.
pub mod handler_world {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "handler-plugin",
        // Every import may trap: the message methods do when a plugin uses a
        // message after its `handle` call returned (see `host/message.rs`).
        // State calls are async: they may wait on the store (a Redis round
        // trip) without holding a runtime thread.
        imports: { "acemq:plugin/state": async | trappable, default: trappable },
        // Calls are futures on the async runtime (see `pool.rs`); the other
        // imports stay synchronous: they only read and buffer.
        exports: { default: async },
        with: {
            // The message lent to a call is kept in the store's state, not in
            // a resource table: the handle only names the call it belongs to.
            "acemq:plugin/types.message": crate::plugin::host::message::LentMessage,
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

/// The worlds of contract 0.3, generated the same way: a 0.3 plugin's calls
/// are mapped onto the 0.4 internals by `host/v0_3.rs`.
pub mod v0_3 {
    /// 0.3's `handler-plugin` world: imports `host`, exports `handler`.
    pub mod handler_world {
        wasmtime::component::bindgen!({
            path: "../wit/v0.3",
            world: "handler-plugin",
            imports: { default: trappable },
            exports: { default: async },
            with: {
                // The same lent message as 0.4's: one lending serves both.
                "acemq:plugin/types.message": crate::plugin::host::message::LentMessage,
            },
        });
    }

    /// 0.3's `codec-plugin` world (the same shape as 0.4's).
    pub mod codec_world {
        wasmtime::component::bindgen!({
            path: "../wit/v0.3",
            world: "codec-plugin",
            exports: { default: async },
        });
    }
}
