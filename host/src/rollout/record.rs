//! Where a rollout stands, kept on disk so that a host restarted in the
//! middle never half-applies it: a promotion it decided stands, a rollback
//! it decided stands, and a rollout under way resumes at its step or is
//! abandoned, as the consumer's `on_restart` says ([`resume`], pure).
//!
//! One small JSON file per consumer, in the host's rollout folder
//! (`[host] rollout_state_dir`), written whole to a temporary file and
//! renamed over the last.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::plan::OnRestart;

/// What a consumer's rollout came to, or where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Under way, at this step.
    Running { step: usize },
    /// The candidate became the version.
    Promoted,
    /// It was worse beyond a threshold, and the current version kept serving.
    RolledBack,
    /// An operator stopped it.
    Aborted,
    /// A restart gave it up (`on_restart = "abandon"`).
    Abandoned,
}

impl Status {
    /// The word logs, `/rollouts` and the decision metric use.
    pub fn word(self) -> &'static str {
        match self {
            Status::Running { .. } => "running",
            Status::Promoted => "promoted",
            Status::RolledBack => "rolled_back",
            Status::Aborted => "aborted",
            Status::Abandoned => "abandoned",
        }
    }
}

/// The record of one consumer's rollout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub queue: String,
    /// SHA-256 of the version that served when the rollout began.
    pub current: String,
    /// SHA-256 of the candidate.
    pub candidate: String,
    pub candidate_path: PathBuf,
    pub status: Status,
    /// Why it ended as it did, in one sentence.
    pub reason: Option<String>,
    /// RFC 3339, when the status was last set.
    pub at: String,
}

/// What a starting host does with a configured candidate, given the record.
#[derive(Debug, Clone, PartialEq)]
pub enum Resumption {
    /// No rollout of this candidate happened: start one at the first step.
    Fresh,
    /// Carry on at this step.
    At(usize),
    /// It was promoted: the candidate serves as the version, no canary.
    Promoted,
    /// It ended (rolled back, aborted, abandoned) and is not run again
    /// until the candidate changes; the status and why.
    Ended(Status, Option<String>),
}

/// The resumption for a candidate hashing to `candidate` on a consumer whose
/// configured version hashes to `current`.
pub fn resume(
    record: Option<&Record>,
    current: &str,
    candidate: &str,
    on_restart: OnRestart,
) -> Resumption {
    let Some(record) = record.filter(|r| r.candidate == candidate) else {
        return Resumption::Fresh;
    };
    match record.status {
        Status::Promoted if current == candidate => {
            Resumption::Ended(Status::Promoted, record.reason.clone())
        }
        Status::Promoted => Resumption::Promoted,
        Status::Running { step } => match on_restart {
            OnRestart::Resume => Resumption::At(step),
            OnRestart::Abandon => Resumption::Ended(
                Status::Abandoned,
                Some("the host restarted during it, and on_restart = \"abandon\"".to_string()),
            ),
        },
        ended => Resumption::Ended(ended, record.reason.clone()),
    }
}

/// The rollout folder of a host: one record file per consumer.
#[derive(Debug, Clone)]
pub struct Records {
    dir: PathBuf,
}

impl Records {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of the consumer of `queue`: its name made safe, and a hash
    /// of it so that two names made alike do not share a file.
    fn file(&self, queue: &str) -> PathBuf {
        let safe: String = queue
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(100)
            .collect();
        let hash = hex::encode(&Sha256::digest(queue.as_bytes())[..6]);
        self.dir.join(format!("{safe}-{hash}.json"))
    }

    /// The consumer's record, if one was kept (an unreadable one is logged
    /// and taken as none: the rollout starts afresh).
    pub fn load(&self, queue: &str) -> Option<Record> {
        let path = self.file(queue);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot read a rollout record; the rollout starts afresh");
                return None;
            }
        };
        serde_json::from_str(&text)
            .inspect_err(|e| tracing::warn!(file = %path.display(), error = %e, "a rollout record is not one this host wrote; the rollout starts afresh"))
            .ok()
    }

    /// Keeps `record`, whole (a crash leaves the old one or the new one).
    pub fn save(&self, record: &Record) -> std::io::Result<()> {
        use std::io::Write as _;
        std::fs::create_dir_all(&self.dir)?;
        let mut file = tempfile::NamedTempFile::new_in(&self.dir)?;
        file.write_all(serde_json::to_string_pretty(record)?.as_bytes())?;
        file.as_file().sync_all()?;
        file.persist(self.file(&record.queue))
            .map_err(|e| e.error)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: Status) -> Record {
        Record {
            queue: "orders".into(),
            current: "v1".into(),
            candidate: "v2".into(),
            candidate_path: "v2.wasm".into(),
            status,
            reason: Some("why".into()),
            at: "2026-12-04T00:00:00Z".into(),
        }
    }

    #[test]
    fn a_restart_never_half_applies_a_rollout() {
        let resume =
            |status, current, on_restart| resume(Some(&record(status)), current, "v2", on_restart);
        assert_eq!(
            resume(Status::Running { step: 2 }, "v1", OnRestart::Resume),
            Resumption::At(2)
        );
        assert!(matches!(
            resume(Status::Running { step: 2 }, "v1", OnRestart::Abandon),
            Resumption::Ended(Status::Abandoned, Some(_))
        ));
        // A promotion stands, whichever way restarts are configured.
        assert_eq!(
            resume(Status::Promoted, "v1", OnRestart::Abandon),
            Resumption::Promoted
        );
        assert!(matches!(
            resume(Status::Promoted, "v2", OnRestart::Resume),
            Resumption::Ended(Status::Promoted, _)
        ));
        assert_eq!(
            resume(Status::RolledBack, "v1", OnRestart::Resume),
            Resumption::Ended(Status::RolledBack, Some("why".into()))
        );
        // Another candidate is another rollout.
        assert_eq!(
            super::resume(
                Some(&record(Status::RolledBack)),
                "v1",
                "v3",
                OnRestart::Resume
            ),
            Resumption::Fresh
        );
        assert_eq!(
            super::resume(None, "v1", "v2", OnRestart::Resume),
            Resumption::Fresh
        );
    }

    #[test]
    fn a_record_is_kept_whole_under_a_safe_name_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::new(dir.path().join("rollouts"));
        let mut kept = record(Status::Running { step: 1 });
        kept.queue = "orders/new:eu".into();
        records.save(&kept).unwrap();
        assert_eq!(records.load("orders/new:eu"), Some(kept));
        assert_eq!(records.load("orders.new.eu"), None);
        let names: Vec<_> = std::fs::read_dir(records.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
        assert!(
            names[0].to_string_lossy().starts_with("orders_new_eu-"),
            "{names:?}"
        );
    }
}
