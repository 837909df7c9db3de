//! What one consumer's deliveries ask of the store, in their order
//! (docs/state.md): before the call, whether the input is done or claimed
//! elsewhere (and the claim, for an `idempotent` consumer); after an accept
//! with checked writes, the reservation of those keys before any output is
//! published; after the outputs are confirmed, the commit, before the ack;
//! and for an input not accepted, the release of its claim and reservation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::call::{Changes, show_key};
use super::{
    Backend, Claim, Commit, Committed, InputKey, Quota, Reserved, Store, StoreError, StoreHealth,
};
use crate::telemetry::{CommitLabel, QueueLabel, StateMetrics};

/// How long a reservation of checked keys holds them: from before the
/// outputs are published to the commit after their confirm.
pub const RESERVATION_LEASE: Duration = Duration::from_secs(30);
/// How many times a call runs again after a conflict before the input
/// fails with it.
pub const MAX_RERUNS: u32 = 5;
/// How long an input another host holds a claim on waits before it is
/// republished (Python's `in_progress` delay).
pub const IN_PROGRESS_WAIT: Duration = Duration::from_secs(5);

/// The crash point of the tests of what a crash between the steps does
/// (tests/tests/state.rs): with `ACEMQ_CRASH_AT=after-outputs-confirmed` in
/// its environment, the host aborts (as a kill -9 would end it) right after
/// the outputs of an accept with state are confirmed, before its commit and
/// ack. Read once; nothing else reads it.
pub fn crash_after_outputs_confirmed() {
    static CRASH: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let crash = *CRASH.get_or_init(|| {
        std::env::var("ACEMQ_CRASH_AT").is_ok_and(|at| at == "after-outputs-confirmed")
    });
    if crash {
        eprintln!("ACEMQ_CRASH_AT=after-outputs-confirmed: aborting before the commit");
        std::process::abort();
    }
}

/// A consumer's use of the store.
pub struct ConsumerState {
    store: Arc<Store>,
    queue: String,
    namespace: Option<String>,
    quota: Quota,
    retention: Duration,
    claims: Option<Claims>,
    metrics: StateMetrics,
    health: Arc<StoreHealth>,
}

/// An `idempotent` consumer's claims: whose, and for how long.
#[derive(Debug, Clone)]
pub struct Claims {
    pub holder: Arc<str>,
    pub lease: Duration,
}

/// What to do with an input before its call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Before {
    /// Call the plugin (for an `idempotent` consumer, the claim is this host's).
    Run,
    /// Already done: ack without a call.
    Duplicate,
    /// Another host holds a live claim: answer in progress.
    InProgress { reason: String },
    /// The store cannot answer now: the input waits.
    Unavailable { reason: String },
}

/// How an accept's commit ended, for the settlement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Committed, or done already by another run: ack.
    Ack { duplicate: bool },
    /// Refused (a conflict after the reservation lapsed, a quota): the
    /// input fails with this reason, and the retry policy decides.
    Refused(String),
    /// The store could not commit now: the input waits, not counted.
    Unavailable(String),
}

impl ConsumerState {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Arc<Store>,
        queue: &str,
        namespace: Option<String>,
        quota: Quota,
        retention: Duration,
        claims: Option<Claims>,
        metrics: StateMetrics,
        health: Arc<StoreHealth>,
    ) -> Self {
        Self {
            store,
            queue: queue.to_string(),
            namespace,
            quota,
            retention,
            claims,
            metrics,
            health,
        }
    }

    fn input(&self, id: &str) -> InputKey {
        InputKey {
            queue: self.queue.clone(),
            id: id.to_string(),
        }
    }

    /// Whether the input with envelope id `id` runs, and for an
    /// `idempotent` consumer its claim.
    pub async fn before_call(&self, id: &str, now_ms: u64) -> Before {
        let input = self.input(id);
        let answer = match &self.claims {
            Some(claims) => self
                .store
                .claim(&input, &claims.holder, claims.lease, now_ms)
                .await
                .map(|claim| match claim {
                    Claim::Taken => Before::Run,
                    Claim::Done => Before::Duplicate,
                    Claim::HeldElsewhere { holder, expires_in } => Before::InProgress {
                        reason: format!(
                            "in progress: {holder} holds a claim on it for {} more; tried again in {}",
                            humantime::format_duration(round_to_seconds(expires_in)),
                            humantime::format_duration(IN_PROGRESS_WAIT)
                        ),
                    },
                }),
            None => self.store.is_done(&input, now_ms).await.map(|done| {
                if done {
                    Before::Duplicate
                } else {
                    Before::Run
                }
            }),
        };
        self.health.note(&answer);
        let before = answer.unwrap_or_else(|e| Before::Unavailable {
            reason: e.to_string(),
        });
        let label = || QueueLabel {
            queue: self.queue.clone(),
        };
        let counter = match &before {
            Before::Duplicate => Some(&self.metrics.duplicates),
            Before::InProgress { .. } => Some(&self.metrics.claims_waited),
            Before::Run | Before::Unavailable { .. } => None,
        };
        if let Some(counter) = counter {
            counter.get_or_create(&label()).inc();
        }
        before
    }

    /// Reserves the keys whose versions `changes` depend on, for `token`;
    /// `Ok(None)` when held (or there is nothing to check), else the key
    /// that conflicts.
    pub async fn reserve(
        &self,
        changes: &Changes,
        token: &str,
        now_ms: u64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let checks = changes.checks();
        let Some(namespace) = self.namespace.as_deref().filter(|_| !checks.is_empty()) else {
            return Ok(None);
        };
        Ok(
            match self
                .store
                .reserve(namespace, &checks, token, RESERVATION_LEASE, now_ms)
                .await?
            {
                Reserved::Held => None,
                Reserved::Conflict { key } => Some(key),
            },
        )
    }

    /// Counts a call run again after a conflict on `key`.
    pub fn rerun(&self, key: &[u8], id: &str) {
        tracing::debug!(queue = self.queue.as_str(), message_id = id, key = %show_key(key), "state conflict; running the call again");
        self.metrics
            .reruns
            .get_or_create(&QueueLabel {
                queue: self.queue.clone(),
            })
            .inc();
        self.count_commit("conflict");
    }

    /// The reason of an input whose calls conflicted [`MAX_RERUNS`] times.
    pub fn conflicted(key: &[u8]) -> String {
        format!(
            "its state kept changing under it: {} changed before its commit on each of {} runs",
            show_key(key),
            MAX_RERUNS + 1
        )
    }

    /// Commits an accepted input: its writes, its done record, the release
    /// of its claim and reservation.
    pub async fn commit(
        &self,
        id: &str,
        changes: &Changes,
        reservation: Option<&str>,
        now_ms: u64,
    ) -> Outcome {
        crash_after_outputs_confirmed();
        let commit = Commit {
            namespace: self.namespace.clone().filter(|_| !changes.is_empty()),
            quota: self.quota,
            writes: changes.writes.clone(),
            done: self.input(id),
            retention: self.retention,
            claim_holder: self.claims.as_ref().map(|c| c.holder.to_string()),
            reservation: reservation.map(str::to_string),
            now_ms,
        };
        let started = Instant::now();
        let committed = self.store.commit(&commit).await;
        self.health.note(&committed);
        self.metrics
            .commit_seconds
            .observe(started.elapsed().as_secs_f64());
        let (result, outcome) = match committed {
            Ok(Committed::Applied) => ("committed", Outcome::Ack { duplicate: false }),
            Ok(Committed::AlreadyDone) => {
                self.metrics
                    .duplicates
                    .get_or_create(&QueueLabel {
                        queue: self.queue.clone(),
                    })
                    .inc();
                ("duplicate", Outcome::Ack { duplicate: true })
            }
            Ok(Committed::Conflict { key }) => (
                "conflict",
                Outcome::Refused(format!(
                    "its state changed before its commit: {} (its reservation ran out)",
                    show_key(&key)
                )),
            ),
            Ok(Committed::OverQuota { reason }) => ("quota", Outcome::Refused(reason)),
            Err(e) => ("failed", Outcome::Unavailable(e.to_string())),
        };
        self.count_commit(result);
        outcome
    }

    /// An input that was not accepted gives up its claim and reservation
    /// (best effort: both run out by themselves).
    pub async fn abandon(&self, id: &str, changes: &Changes, reservation: Option<&str>) {
        if let (Some(namespace), Some(token)) = (&self.namespace, reservation) {
            let keys: Vec<Vec<u8>> = changes.checks().into_iter().map(|(k, _)| k).collect();
            if let Err(e) = self
                .store
                .release_reservation(namespace, &keys, token)
                .await
            {
                tracing::debug!(error = %e, "a reservation could not be released; it runs out by itself");
            }
        }
        if let Some(claims) = &self.claims
            && let Err(e) = self
                .store
                .release_claim(&self.input(id), &claims.holder)
                .await
        {
            tracing::debug!(error = %e, "a claim could not be released; it runs out after its lease");
        }
    }

    fn count_commit(&self, result: &str) {
        self.metrics
            .commits
            .get_or_create(&CommitLabel {
                namespace: self.namespace.clone().unwrap_or_else(|| "-".to_string()),
                result: result.to_string(),
            })
            .inc();
    }
}

fn round_to_seconds(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs().max(1))
}
