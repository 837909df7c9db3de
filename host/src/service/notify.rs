//! systemd's notification protocol (`sd_notify(3)`), for a unit of
//! `Type=notify`: `READY=1` once every consumer holds its subscription,
//! `STOPPING=1` when shutdown begins, `STATUS=` lines saying what the host
//! is doing, and `WATCHDOG=1` from the liveness watchdog while the runtime
//! makes progress ([`super::liveness`]).
//!
//! Nothing is sent unless the service manager set `NOTIFY_SOCKET`; a send
//! that fails is logged once and never stops the host.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sd_notify::NotifyState;

/// The process's line to its service manager.
#[derive(Debug, Default)]
pub struct Notifier {
    /// A send failed and was logged: later failures are not.
    failed_once: AtomicBool,
}

impl Notifier {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a service manager listens (`NOTIFY_SOCKET` is set).
    pub fn listening() -> bool {
        std::env::var_os("NOTIFY_SOCKET").is_some()
    }

    /// How often the manager wants `WATCHDOG=1` (`WatchdogSec=`): half of
    /// its limit, as `sd_watchdog_enabled(3)` advises, or `None` when it set
    /// none for this process.
    pub fn watchdog_interval() -> Option<Duration> {
        sd_notify::watchdog_enabled().map(|limit| limit / 2)
    }

    /// The host is serving: every consumer reads (or stands by for another
    /// host).
    pub fn ready(&self, status: &str) {
        self.send(&[NotifyState::Ready, NotifyState::Status(status)]);
    }

    /// Shutdown has begun: the host drains its deliveries, then exits.
    pub fn stopping(&self, status: &str) {
        self.send(&[NotifyState::Stopping, NotifyState::Status(status)]);
    }

    /// The runtime made progress within the watchdog's time.
    pub fn watchdog(&self) {
        self.send(&[NotifyState::Watchdog]);
    }

    /// What the host is doing now, for `systemctl status`.
    pub fn status(&self, status: &str) {
        self.send(&[NotifyState::Status(status)]);
    }

    fn send(&self, states: &[NotifyState<'_>]) {
        if let Err(e) = sd_notify::notify(states)
            && !self.failed_once.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(error = %e, "cannot notify the service manager (NOTIFY_SOCKET); it may take the host for stuck");
        }
    }
}
