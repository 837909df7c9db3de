//! Names what a stuck test is waiting on.
//!
//! A test that hangs shows only parked threads in a stack dump: the await
//! it is stuck on lives in a future, not on a stack. So the harness's
//! waits (each broker helper, an in-process host's start and stop, a child
//! command) register themselves here while they run, and a watchdog thread
//! writes every one older than [`STALL`] to the process's stderr, once a
//! minute, until it ends. It writes to the file descriptor itself: the
//! test runner captures `eprintln!` of a test, which would hide the report
//! of a test that never finishes.
//!
//! A wait names where a test is stuck, not why: so what is running beside
//! it (an in-process host) can register a [`Reporter`] too, whose state the
//! report carries (its consumers, deliveries in flight, unconfirmed
//! publishes, connections), as seen when the report was written.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a wait runs before the watchdog names it. Longer than any
/// bounded wait in the harness (a drain's, a host's stop), so what it
/// names is a wait nothing bounds.
pub const STALL: Duration = Duration::from_secs(120);
/// How often the watchdog looks.
const LOOK_EVERY: Duration = Duration::from_secs(60);
/// How long a wait may run before the watchdog ends the test process, with
/// its report and every thread's stack (when `gdb` is installed), so that a
/// hang fails the run with a diagnosis instead of holding it until the CI
/// limit. No test waits this long on purpose.
pub const GIVE_UP: Duration = Duration::from_secs(600);

struct Pending {
    label: String,
    since: Instant,
}

/// What a report says of something that runs beside the waits.
type StateOf = std::sync::Arc<dyn Fn() -> String + Send + Sync>;

struct Registers {
    waits: HashMap<u64, Pending>,
    reporters: HashMap<u64, (String, StateOf)>,
}

fn registers() -> &'static Mutex<Registers> {
    static REGISTERS: OnceLock<Mutex<Registers>> = OnceLock::new();
    REGISTERS.get_or_init(|| {
        std::thread::Builder::new()
            .name("acemq-tests-watchdog".into())
            .spawn(watch)
            .expect("start the test watchdog thread");
        Mutex::new(Registers {
            waits: HashMap::new(),
            reporters: HashMap::new(),
        })
    })
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A wait in progress; it leaves the register when dropped.
#[must_use = "the wait is registered only while the step is alive"]
pub struct Step(u64);

impl Drop for Step {
    fn drop(&mut self) {
        lock().waits.remove(&self.0);
    }
}

/// Something whose state the reports carry; it leaves the register when
/// dropped.
#[must_use = "the state is reported only while the reporter is alive"]
pub struct Reporter(u64);

impl Drop for Reporter {
    fn drop(&mut self) {
        lock().reporters.remove(&self.0);
    }
}

/// Registers `state_of` (called on the watchdog's thread, so it must not
/// wait on the test's runtime) under `label` until the returned
/// [`Reporter`] is dropped: every report of a stuck wait carries what it
/// says then.
pub fn reporter(
    label: impl Into<String>,
    state_of: impl Fn() -> String + Send + Sync + 'static,
) -> Reporter {
    let id = next_id();
    lock()
        .reporters
        .insert(id, (label.into(), std::sync::Arc::new(state_of)));
    Reporter(id)
}

/// What every registered reporter says now, as report lines.
pub fn states() -> String {
    // Taken out of the register first: a reporter reads its own locks,
    // which must never wait behind this one.
    let reporters: Vec<(String, StateOf)> = lock()
        .reporters
        .values()
        .map(|(label, state_of)| (label.clone(), state_of.clone()))
        .collect();
    let mut out = String::new();
    for (label, state_of) in reporters {
        out.push_str(&format!("  state of {label}:\n"));
        for line in state_of().lines() {
            out.push_str("    ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Registers a wait named `label` (say what and on which queue) until the
/// returned [`Step`] is dropped.
pub fn step(label: impl Into<String>) -> Step {
    let id = next_id();
    lock().waits.insert(
        id,
        Pending {
            label: label.into(),
            since: Instant::now(),
        },
    );
    Step(id)
}

/// Runs `future` registered as `label`.
pub async fn watched<F: Future>(label: impl Into<String>, future: F) -> F::Output {
    let _step = step(label);
    future.await
}

/// The waits older than `older_than`, oldest first, as report lines.
pub fn stalled(older_than: Duration) -> Vec<String> {
    let now = Instant::now();
    let mut found: Vec<(Duration, String)> = lock()
        .waits
        .values()
        .map(|p| (now.duration_since(p.since), p.label.clone()))
        .filter(|(age, _)| *age >= older_than)
        .collect();
    found.sort_by_key(|(age, _)| std::cmp::Reverse(*age));
    found
        .into_iter()
        .map(|(age, label)| format!("waiting for {} s: {label}", age.as_secs()))
        .collect()
}

fn lock() -> std::sync::MutexGuard<'static, Registers> {
    // A panicking test must not take the register down with it.
    registers().lock().unwrap_or_else(|e| e.into_inner())
}

fn watch() {
    loop {
        std::thread::sleep(LOOK_EVERY);
        let lines = stalled(STALL);
        if lines.is_empty() {
            continue;
        }
        let give_up = !stalled(GIVE_UP).is_empty();
        let mut report = String::from(if give_up {
            "acemq-tests watchdog: a test is stuck; ending the process\n"
        } else {
            "acemq-tests watchdog: a test seems stuck\n"
        });
        for line in lines {
            report.push_str("  ");
            report.push_str(&line);
            report.push('\n');
        }
        report.push_str(&states());
        let _ = std::io::stderr().write_all(report.as_bytes());
        if give_up {
            dump_threads();
            std::process::abort();
        }
    }
}

/// Every thread's stack, from `gdb` when it is installed.
fn dump_threads() {
    let pid = std::process::id().to_string();
    // Yama's ptrace scope 1 lets a process be traced only by its ancestors
    // unless it names a tracer: gdb is its child.
    // SAFETY: prctl with these arguments only changes who may trace us.
    unsafe {
        libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0);
    }
    let dumped = std::process::Command::new("gdb")
        .args(["-p", &pid, "-batch", "-ex", "thread apply all bt"])
        .stdin(std::process::Stdio::null())
        .output();
    let text = match dumped {
        Ok(output) => String::from_utf8_lossy(&output.stdout).into_owned(),
        Err(e) => format!("(no thread dump: gdb: {e})\n"),
    };
    let _ = std::io::stderr().write_all(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_listed_while_it_lives_and_gone_after() {
        let label = format!("unit-test wait {:?}", Instant::now());
        let step = step(label.clone());
        assert!(stalled(Duration::ZERO).iter().any(|l| l.ends_with(&label)));
        assert!(
            !stalled(Duration::from_secs(3600))
                .iter()
                .any(|l| l.ends_with(&label))
        );
        drop(step);
        assert!(!stalled(Duration::ZERO).iter().any(|l| l.ends_with(&label)));
    }

    #[test]
    fn a_reporter_says_its_state_while_it_lives_and_nothing_after() {
        let label = format!("unit-test reporter {:?}", Instant::now());
        let reporter = reporter(label.clone(), || "in flight 3\nunconfirmed 2".into());
        let said = states();
        assert!(
            said.contains(&format!(
                "  state of {label}:\n    in flight 3\n    unconfirmed 2\n"
            )),
            "{said}"
        );
        drop(reporter);
        assert!(!states().contains(&label));
    }
}
