//! What the benches say about the machine and the processes they run on
//! it: broker, host and load share its cores, so each bench prints the
//! load beside its figures.

use anyhow::{Context, Result};

/// The CPUs this process may run on.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The 1, 5 and 15 minute load averages, from /proc/loadavg.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |e| format!("unknown ({e})"),
        |text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        },
    )
}

/// The resident set of process `pid` in bytes: `VmRSS` of
/// `/proc/PID/status`, what the kernel counts against the process's memory.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    vm_rss(&status).with_context(|| format!("no VmRSS in {path}"))
}

/// The CPU time process `pid` has used so far, user and system, all its
/// threads: fields 14 and 15 of `/proc/PID/stat`, in clock ticks.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
    cpu_ticks(&stat)
        .map(|used| used as f64 / ticks)
        .with_context(|| format!("no CPU times in {path}"))
}

/// utime + stime of a `/proc/PID/stat` line. The command name (field 2)
/// is in parentheses and may hold spaces, so fields are counted after it.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// `VmRSS:   12345 kB` of a `/proc/PID/status` text, in bytes.
fn vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::vm_rss;

    #[test]
    fn vm_rss_is_read_in_bytes() {
        let status = "Name:\tacemq-host\nVmHWM:\t  99999 kB\nVmRSS:\t   51200 kB\nThreads:\t9\n";
        assert_eq!(vm_rss(status), Some(50 * 1024 * 1024));
        assert_eq!(vm_rss("Name:\tkthreadd\n"), None);
    }

    #[test]
    fn this_process_has_a_resident_set() {
        assert!(super::rss_bytes(std::process::id()).unwrap() > 0);
    }

    #[test]
    fn cpu_ticks_are_counted_after_the_command_name() {
        let stat = "4242 (acemq host) S 1 4242 4242 0 -1 4194560 100 0 0 0 350 25 0 0 20 0 9 0";
        assert_eq!(super::cpu_ticks(stat), Some(375));
        assert!(super::cpu_seconds(std::process::id()).is_ok());
    }
}
