//! A handler that waits inside the host, for testing that the host's
//! deadlines hold where no wasm runs: a guest blocked in a WASI sleep is
//! never interrupted by the epoch check that ends a busy loop.
//!
//! It imports `wasi:clocks/monotonic-clock` (see `wit/`), as every Python or
//! JavaScript component imports WASI, and sleeps by blocking on a pollable
//! of that clock. The body, as trimmed UTF-8 text (quotes around it are
//! ignored, so a codec's JSON string works too), picks what happens:
//!
//! | body       | what the handler does                                    |
//! |------------|----------------------------------------------------------|
//! | `sleep:MS` | sleeps MS milliseconds in the host, then accepts          |
//! | `log:TEXT` | logs TEXT at info level exactly as given, then accepts    |
//! | anything else | accepts                                               |
//!
//! Start-up: when the consumer's config has `startup_sleep_ms`, every
//! instantiation sleeps that long in the plugin's `_initialize` (which the
//! component runs while it is instantiated), before any call.

use acemq_guest::prelude::*;

acemq_guest::config_keys!["startup_sleep_ms"];

mod wasi_clock {
    wit_bindgen::generate!({
        world: "sleeper",
        path: "wit",
        generate_all,
    });
}

use wasi_clock::wasi::clocks::monotonic_clock;

/// Blocks in the host for `ms` milliseconds.
fn sleep_ms(ms: u64) {
    monotonic_clock::subscribe_duration(ms.saturating_mul(1_000_000)).block();
}

/// Run by the component at instantiation (wit-component turns a module's
/// `_initialize` export into the component's start).
#[unsafe(no_mangle)]
pub extern "C" fn _initialize() {
    if let Some(ms) = acemq_guest::config("startup_sleep_ms").and_then(|ms| ms.trim().parse().ok())
    {
        sleep_ms(ms);
    }
}

struct Sleeper;

impl Handler for Sleeper {
    fn handle(msg: Message) -> Result {
        let body = String::from_utf8_lossy(msg.body()).into_owned();
        let body = body.trim().trim_matches('"');
        let (verb, rest) = body.split_once(':').unwrap_or((body, ""));
        match verb {
            "sleep" => {
                let ms = rest.trim().parse().unwrap_or(0);
                sleep_ms(ms);
            }
            "log" => acemq_guest::log::info(rest),
            _ => {}
        }
        accept()
    }
}

acemq_guest::export_handler!(Sleeper);
