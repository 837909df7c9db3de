//! Says so when the config file changes while the host runs: the host reads
//! it once, at start. Hot swap (SIGHUP, a plugin file replaced, `POST
//! /plugins/reload`) reloads plugins only, so an operator who edits the file
//! and waits for it to apply is told it will not, until a restart.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode, Watcher as _};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Editors write a file in several steps; one line per burst of changes.
const SETTLE: Duration = Duration::from_millis(300);

/// The sentence logged for a changed config file.
pub const NOT_APPLIED: &str = "the config file changed; changes to it are not applied until the host restarts (SIGHUP and plugin file changes reload plugins only)";

/// Watches `path` (whose content at start was `text`) until `stop`.
/// Watching is a courtesy: when it cannot start, that is logged at debug.
pub fn spawn(path: &Path, text: &str, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut last = digest(text.as_bytes());
    let (changed, mut changes) = mpsc::unbounded_channel();
    let watcher = watch(&path, changed);
    tokio::spawn(async move {
        let _watcher = watcher;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                Some(()) = changes.recv() => {}
            }
            tokio::time::sleep(SETTLE).await;
            while changes.try_recv().is_ok() {}
            // Only a change of content counts (touching it, or saving it
            // unchanged, is not worth a warning).
            let Ok(bytes) = tokio::fs::read(&path).await else {
                continue;
            };
            let now = digest(&bytes);
            if now != last {
                last = now;
                tracing::warn!(config = %path.display(), "{NOT_APPLIED}");
            }
        }
    })
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Watches the file's folder (a save by rename replaces the file's inode)
/// and signals each event that names the file.
fn watch(path: &Path, changed: mpsc::UnboundedSender<()>) -> Option<RecommendedWatcher> {
    let file: PathBuf = path.to_path_buf();
    let folder = path.parent()?.to_path_buf();
    let handler = move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event
            && !matches!(event.kind, notify::EventKind::Access(_))
            && event.paths.contains(&file)
        {
            let _ = changed.send(());
        }
    };
    let mut watcher = notify::recommended_watcher(handler)
        .map_err(|e| tracing::debug!(error = %e, "cannot watch the config file"))
        .ok()?;
    watcher
        .watch(&folder, RecursiveMode::NonRecursive)
        .map_err(|e| tracing::debug!(error = %e, "cannot watch the config file"))
        .ok()?;
    Some(watcher)
}
