//! The host's services: configuration, clock, logging. Publishing is in
//! [`publish`](crate::publish()), replying in [`reply`](crate::reply()),
//! key-value state in [`state`](crate::state).
//!
//! Handler plugins only: the `codec-plugin` world imports nothing, so a codec
//! that calls any of these is refused by the host when it loads.

/// A value from the consumer's `[consumers.config]` table in the host's
/// configuration, `None` when the key is not set.
///
/// ```
/// # fn f() {
/// let exchange = acemq_guest::config("events_exchange")
///     .unwrap_or_else(|| "orders.events".into());
/// # }
/// ```
pub fn config(key: &str) -> Option<String> {
    sys::config(key)
}

/// The host's wall clock, in milliseconds since the Unix epoch. A plugin has
/// no clock of its own.
pub fn now_ms() -> u64 {
    sys::now_ms()
}

/// Writing to the host's log. Lines are tagged by the host with the consumer
/// and the message id, so there is no need to repeat them.
///
/// The macros [`info!`](crate::info) and friends take `format!` arguments;
/// the functions here take a ready string.
pub mod log {
    pub use crate::bindings::wit_host::Level;

    /// Logs `text` at `level`.
    pub fn log(level: Level, text: impl AsRef<str>) {
        super::sys::log(level, text.as_ref());
    }

    /// Logs at [`Level::Trace`].
    pub fn trace(text: impl AsRef<str>) {
        log(Level::Trace, text)
    }
    /// Logs at [`Level::Debug`].
    pub fn debug(text: impl AsRef<str>) {
        log(Level::Debug, text)
    }
    /// Logs at [`Level::Info`].
    pub fn info(text: impl AsRef<str>) {
        log(Level::Info, text)
    }
    /// Logs at [`Level::Warn`].
    pub fn warn(text: impl AsRef<str>) {
        log(Level::Warn, text)
    }
    /// Logs at [`Level::Error`].
    pub fn error(text: impl AsRef<str>) {
        log(Level::Error, text)
    }

    /// Used by the macros: a message without arguments is passed through
    /// without allocating.
    #[doc(hidden)]
    pub fn __log_args(level: Level, args: core::fmt::Arguments<'_>) {
        match args.as_str() {
            Some(text) => super::sys::log(level, text),
            None => super::sys::log(level, &args.to_string()),
        }
    }
}

/// Logs a `format!`-style line at `trace` level. See [`log`](crate::log).
#[macro_export]
macro_rules! trace {
    ($($arg:tt)+) => { $crate::log::__log_args($crate::log::Level::Trace, ::core::format_args!($($arg)+)) };
}

/// Logs a `format!`-style line at `debug` level. See [`log`](crate::log).
#[macro_export]
macro_rules! debug {
    ($($arg:tt)+) => { $crate::log::__log_args($crate::log::Level::Debug, ::core::format_args!($($arg)+)) };
}

/// Logs a `format!`-style line at `info` level. See [`log`](crate::log).
///
/// ```
/// # fn f(id: &str) {
/// acemq_guest::info!("order {id} routed");
/// # }
/// ```
#[macro_export]
macro_rules! info {
    ($($arg:tt)+) => { $crate::log::__log_args($crate::log::Level::Info, ::core::format_args!($($arg)+)) };
}

/// Logs a `format!`-style line at `warn` level. See [`log`](crate::log).
#[macro_export]
macro_rules! warn {
    ($($arg:tt)+) => { $crate::log::__log_args($crate::log::Level::Warn, ::core::format_args!($($arg)+)) };
}

/// Logs a `format!`-style line at `error` level. See [`log`](crate::log).
#[macro_export]
macro_rules! error {
    ($($arg:tt)+) => { $crate::log::__log_args($crate::log::Level::Error, ::core::format_args!($($arg)+)) };
}

/// The one place that calls the host's imports.
///
/// Inside a component (wasm32) these are the WIT imports. Natively there is
/// no host, so they go to the [`testing`](crate::testing) double installed
/// by `TestHost::handle`, which is what lets plugin authors unit-test a
/// handler with a plain `cargo test`.
pub(crate) mod sys {
    #[cfg(target_arch = "wasm32")]
    pub(crate) use crate::bindings::wit_host::{config, log, now_ms, publish, reply};

    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) use crate::testing::sys::{config, log, now_ms, publish, reply};

    /// The `state` interface's imports (see [`state`](crate::state)).
    pub(crate) mod state {
        #[cfg(target_arch = "wasm32")]
        pub(crate) use crate::bindings::wit_state::{
            delete, get, get_versioned, increment, set, set_if_version,
        };

        #[cfg(not(target_arch = "wasm32"))]
        pub(crate) use crate::testing::sys::state::{
            delete, get, get_versioned, increment, set, set_if_version,
        };
    }
}
