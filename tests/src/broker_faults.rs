//! Faults of a whole broker, injected with `rabbitmqctl` (shared by the
//! fault tally and the soak bench), and the host's log lines that show them.

use std::time::{Duration, SystemTime};

use anyhow::Result;

use crate::Broker;

/// What the host logs when it lost a connection.
pub const LOST: &str = "connection lost; recovering";
/// What the host logs when the broker blocks its publishing (an alarm).
pub const BLOCKED: &str = "the broker blocked the connection";
/// ... and when the broker lets it publish again.
pub const UNBLOCKED: &str = "the broker unblocked the connection";

/// A broker fault, injected with `rabbitmqctl`.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// `close_all_connections`: every client's connections at once (the
    /// host's two, and a load generator's).
    CloseConnections,
    /// A memory alarm held this long (the high watermark set to 0, then
    /// back to RabbitMQ's default 0.4): the broker blocks publishers.
    MemoryAlarm(Duration),
    /// `stop_app`, the application down this long, `start_app`: every
    /// connection closed and none accepted meanwhile.
    Restart(Duration),
}

impl Fault {
    /// Injects the fault; returns once it is over (the alarm cleared, the
    /// application started again), not once the host is back.
    pub fn inject(self, broker: &Broker) -> Result<Timing> {
        let called = SystemTime::now();
        let (first, then): (&[&str], Option<(Duration, &[&str])>) = match self {
            Fault::CloseConnections => (&["close_all_connections", "injected fault"], None),
            Fault::MemoryAlarm(held) => (
                &["set_vm_memory_high_watermark", "0"],
                Some((held, &["set_vm_memory_high_watermark", "0.4"])),
            ),
            Fault::Restart(down) => (&["stop_app"], Some((down, &["start_app"]))),
        };
        broker.rabbitmqctl(first)?;
        let began = SystemTime::now();
        if let Some((wait, args)) = then {
            std::thread::sleep(wait);
            broker.rabbitmqctl(args)?;
        }
        Ok(Timing {
            called,
            began,
            ended: SystemTime::now(),
        })
    }

    pub fn cuts_connections(self) -> bool {
        !matches!(self, Fault::MemoryAlarm(_))
    }

    /// What the host logs when this fault reaches it.
    pub fn felt_as(self) -> &'static str {
        if self.cuts_connections() {
            LOST
        } else {
            BLOCKED
        }
    }
}

/// When a fault's `rabbitmqctl` calls were made and returned, on the wall
/// clock (the host's log's).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// The first call was made: the host may log the fault from here on.
    pub called: SystemTime,
    /// The first call returned: the fault is in effect.
    pub began: SystemTime,
    /// The last call returned: the alarm is cleared, the application
    /// started again (`began` for a fault of one call).
    pub ended: SystemTime,
}
