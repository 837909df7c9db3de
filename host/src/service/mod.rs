//! What the host tells the software that runs it: a service manager
//! (systemd's readiness, stopping and watchdog notifications, [`notify`])
//! and an orchestrator (liveness: whether the process's runtime still makes
//! progress, [`liveness`]; readiness is `admin::health::readiness`).
//!
//! Both say only what the host knows of itself. A host that is recovering
//! from the broker's trouble on its own is alive, so neither a watchdog nor
//! a liveness probe restarts it; a host whose runtime has stopped running
//! its tasks is not, and both let the manager restart it.

pub mod liveness;
pub mod notify;
