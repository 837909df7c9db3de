//! A consumer's rollout while the host runs: which version each delivery
//! goes to ([`Rollout::route`]), what each call came to
//! ([`Rollout::record`]), and the decisions that follow: the next step, a
//! promotion (the candidate becomes the version, as a hot swap does) or a
//! rollback, each logged in one sentence with its figures, counted, and
//! kept in the consumer's record ([`super::record`]).
//!
//! The consumer holds a [`RolloutSlot`]: empty, or the rollout under way;
//! the admin endpoint starts and aborts one through it.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use arc_swap::ArcSwapOption;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::judge::{self, Call, Verdict, Window};
use super::plan::{ConsumerDefaults, Mode, Plan, PlanSpec, Share};
use super::record::{Record, Records, Resumption, Status};
use super::share;
use crate::envelope::MessageId;
use crate::plugin::{ConsumerContext, HandlerSlot, HandlerVersion, PluginEngine, PluginError};
use crate::telemetry::{
    Metrics, PluginVersionLabels, QueueLabel, RolloutCallLabels, RolloutDecisionLabels,
    ShadowResultLabels,
};

/// Which version a call was of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Current,
    Candidate,
    Shadow,
}

impl Role {
    pub fn word(self) -> &'static str {
        match self {
            Role::Current => "current",
            Role::Candidate => "candidate",
            Role::Shadow => "shadow",
        }
    }
}

/// Where one delivery goes.
pub enum Route {
    /// The current version handles it.
    Current,
    /// The canary's candidate handles it, for real.
    Candidate(Arc<HandlerVersion>),
    /// The current version handles it, and the shadow runs on a copy.
    Shadowed(Arc<HandlerVersion>),
}

/// A difference a shadow found, kept for inspection.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    pub message_id: String,
    pub at: SystemTime,
    pub what: String,
}

/// A shadow's comparisons so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShadowTally {
    pub compared: u64,
    pub different: u64,
    /// Not shadowed: every shadow place was taken.
    pub skipped: u64,
    /// The first differences, up to the plan's `keep_differences`.
    pub examples: Vec<Difference>,
}

/// What `/rollouts` and `/plugins` show of a rollout.
#[derive(Debug, Clone)]
pub struct RolloutView {
    pub queue: String,
    pub mode: Mode,
    pub candidate_path: String,
    pub candidate_sha256: String,
    pub status: Status,
    pub step: usize,
    pub steps: Vec<Share>,
    /// The share it takes now (none once it has ended).
    pub share: Option<Share>,
    pub current: Window,
    pub candidate: Window,
    pub reason: Option<String>,
    pub shadow: ShadowTally,
}

impl RolloutView {
    pub fn to_json(&self) -> serde_json::Value {
        let window = |w: &Window| {
            serde_json::json!({
                "calls": w.calls,
                "faults": w.faults,
                "fault_rate": w.fault_rate(),
                "set_aside": w.set_aside,
                "set_aside_rate": w.set_aside_rate(),
                "outputs_per_call": w.outputs_per_call(),
                "p99_ms": w.p99().map(|us| us as f64 / 1000.0),
            })
        };
        let shadow = &self.shadow;
        serde_json::json!({
            "queue": self.queue,
            "mode": self.mode.to_string(),
            "status": self.status.word(),
            "step": self.step + 1,
            "of": self.steps.len(),
            "steps": self.steps.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "share": self.share.map(|s| s.to_string()),
            "candidate": {"path": self.candidate_path, "sha256": self.candidate_sha256},
            "window": {"current": window(&self.current), "candidate": window(&self.candidate)},
            "reason": self.reason,
            "shadow": (self.mode == Mode::Shadow).then(|| serde_json::json!({
                "compared": shadow.compared,
                "different": shadow.different,
                "difference_rate": if shadow.compared == 0 { 0.0 } else { shadow.different as f64 / shadow.compared as f64 },
                "skipped": shadow.skipped,
                "examples": shadow.examples.iter().map(|d| serde_json::json!({
                    "message_id": d.message_id,
                    "at": humantime::format_rfc3339_seconds(d.at).to_string(),
                    "difference": d.what,
                })).collect::<Vec<_>>(),
            })),
        })
    }
}

struct Progress {
    status: Status,
    step: usize,
    /// The current version's calls since the rollout (re)started: the
    /// baseline each step is judged against.
    current: Window,
    /// The candidate's calls in this step.
    candidate: Window,
    reason: Option<String>,
    shadow: ShadowTally,
}

/// One consumer's rollout.
pub struct Rollout {
    queue: String,
    plan: Plan,
    candidate: Arc<HandlerVersion>,
    slot: Arc<HandlerSlot>,
    /// SHA-256 of the version that served when it began.
    current_sha256: String,
    records: Option<Records>,
    metrics: Arc<Metrics>,
    /// Told the candidate's path when it is promoted (the reloader's file
    /// for the consumer becomes it).
    on_promoted: Box<dyn Fn(&Path) + Send + Sync>,
    /// The share in basis points deliveries are routed by; 0 once ended.
    share: AtomicU32,
    shadow_places: Arc<Semaphore>,
    progress: Mutex<Progress>,
}

/// What [`Rollout::begin`] needs besides the plan and the candidate.
pub struct Setting {
    pub queue: String,
    pub slot: Arc<HandlerSlot>,
    pub records: Option<Records>,
    pub metrics: Arc<Metrics>,
    pub on_promoted: Box<dyn Fn(&Path) + Send + Sync>,
}

fn lock(progress: &Mutex<Progress>) -> MutexGuard<'_, Progress> {
    progress.lock().unwrap_or_else(|e| e.into_inner())
}

impl Rollout {
    /// A rollout of `candidate` starting at `step`, recorded as running.
    pub fn begin(
        plan: Plan,
        candidate: Arc<HandlerVersion>,
        step: usize,
        setting: Setting,
    ) -> Arc<Self> {
        let Setting {
            queue,
            slot,
            records,
            metrics,
            on_promoted,
        } = setting;
        let step = step.min(plan.steps.len() - 1);
        let rollout = Arc::new(Self {
            current_sha256: slot.current().sha256.to_string(),
            shadow_places: Arc::new(Semaphore::new(plan.shadow_concurrency.max(1))),
            share: AtomicU32::new(plan.share(step).basis_points()),
            progress: Mutex::new(Progress {
                status: Status::Running { step },
                step,
                current: Window::default(),
                candidate: Window::default(),
                reason: None,
                shadow: ShadowTally::default(),
            }),
            queue,
            plan,
            candidate,
            slot,
            records,
            metrics,
            on_promoted,
        });
        rollout.set_share_gauge();
        rollout.keep(&lock(&rollout.progress));
        tracing::info!(
            queue = %rollout.queue,
            mode = %rollout.plan.mode,
            candidate = %rollout.plan.candidate.display(),
            sha256 = %rollout.candidate.sha256,
            share = %rollout.plan.share(step),
            step = step + 1,
            of = rollout.plan.steps.len(),
            "rollout under way"
        );
        rollout
    }

    /// The candidate, promoted at once (a host restarted after it decided
    /// so): it serves as the version, as after a hot swap.
    pub fn promote_now(plan: &Plan, candidate: Arc<HandlerVersion>, setting: &Setting) {
        let old = setting.slot.swap(candidate.clone());
        set_version_gauges(
            &setting.metrics,
            &setting.queue,
            &old.sha256,
            &candidate.sha256,
        );
        (setting.on_promoted)(&plan.candidate);
        tracing::info!(queue = %setting.queue, candidate = %plan.candidate.display(), sha256 = %candidate.sha256, "the candidate was promoted before this host restarted: it serves as the version");
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Where the delivery with envelope id `id` goes.
    pub fn route(&self, id: &str) -> Route {
        let share = self.share.load(Ordering::Relaxed);
        if share == 0 || share::bucket(id) >= share {
            return Route::Current;
        }
        match self.plan.mode {
            Mode::Canary => Route::Candidate(self.candidate.clone()),
            Mode::Shadow => Route::Shadowed(self.candidate.clone()),
        }
    }

    /// A place for a shadow call, or `None` (counted as skipped) when every
    /// one is taken: the shadow never waits, so never holds up a delivery.
    pub fn shadow_place(&self) -> Option<OwnedSemaphorePermit> {
        let place = self.shadow_places.clone().try_acquire_owned().ok();
        if place.is_none() {
            self.shadow_not_run();
        }
        place
    }

    /// A delivery the shadow did not run on (no place, or the host could
    /// not run it): skipped, not compared.
    pub fn shadow_not_run(&self) {
        lock(&self.progress).shadow.skipped += 1;
        self.shadow_metric("skipped");
    }

    /// A shadow call compared with the current version's decision: `None`
    /// when they agreed, else how they differ.
    pub fn shadow_compared(&self, message_id: &str, difference: Option<String>) {
        let mut progress = lock(&self.progress);
        progress.shadow.compared += 1;
        let result = match difference {
            None => "same",
            Some(what) => {
                progress.shadow.different += 1;
                if progress.shadow.examples.len() < self.plan.keep_differences {
                    progress.shadow.examples.push(Difference {
                        message_id: message_id.to_string(),
                        at: SystemTime::now(),
                        what,
                    });
                }
                "different"
            }
        };
        drop(progress);
        self.shadow_metric(result);
    }

    /// Counts one call of `role`, and decides what follows a canary step.
    pub fn record(&self, role: Role, call: Call) {
        self.metrics
            .rollout
            .calls
            .get_or_create(&RolloutCallLabels {
                queue: self.queue.clone(),
                role: role.word(),
                result: if call.faulted { "faulted" } else { "decided" },
            })
            .inc();
        let mut progress = lock(&self.progress);
        if !matches!(progress.status, Status::Running { .. }) {
            return;
        }
        match role {
            Role::Current => progress.current.record(call),
            Role::Candidate => progress.candidate.record(call),
            Role::Shadow => return,
        }
        if role != Role::Candidate || self.plan.mode != Mode::Canary {
            return;
        }
        let share = self.plan.share(progress.step);
        match judge::judge(
            share,
            &progress.current,
            &progress.candidate,
            self.plan.messages_per_step,
            &self.plan.thresholds,
        ) {
            Verdict::Undecided => {}
            Verdict::Failed(why) => self.roll_back(&mut progress, why),
            Verdict::Passed if progress.step + 1 < self.plan.steps.len() => {
                self.step_up(&mut progress)
            }
            Verdict::Passed => self.promote(&mut progress),
        }
    }

    /// Stops the rollout on an operator's word: the current version serves.
    pub fn abort(&self, why: &str) -> bool {
        let mut progress = lock(&self.progress);
        if !matches!(progress.status, Status::Running { .. }) {
            return false;
        }
        self.end(&mut progress, Status::Aborted, why.to_string());
        tracing::warn!(queue = %self.queue, sha256 = %self.candidate.sha256, reason = %why, "rollout aborted; the current version serves every delivery");
        true
    }

    pub fn view(&self) -> RolloutView {
        let progress = lock(&self.progress);
        let running = matches!(progress.status, Status::Running { .. });
        RolloutView {
            queue: self.queue.clone(),
            mode: self.plan.mode,
            candidate_path: self.plan.candidate.display().to_string(),
            candidate_sha256: self.candidate.sha256.to_string(),
            status: progress.status,
            step: progress.step,
            steps: self.plan.steps.clone(),
            share: running.then(|| self.plan.share(progress.step)),
            current: progress.current.clone(),
            candidate: progress.candidate.clone(),
            reason: progress.reason.clone(),
            shadow: progress.shadow.clone(),
        }
    }

    fn step_up(&self, progress: &mut Progress) {
        let passed = self.plan.share(progress.step);
        let figures = figures(&progress.candidate);
        progress.step += 1;
        progress.status = Status::Running {
            step: progress.step,
        };
        progress.candidate = Window::default();
        let share = self.plan.share(progress.step);
        self.share.store(share.basis_points(), Ordering::Relaxed);
        self.set_share_gauge();
        self.decision("stepped");
        self.keep(progress);
        tracing::info!(queue = %self.queue, sha256 = %self.candidate.sha256, "the candidate passed its step at {passed} ({figures}); it now takes {share}");
    }

    fn promote(&self, progress: &mut Progress) {
        let why = format!(
            "passed every step up to {} ({}; the current version: {})",
            self.plan.share(progress.step),
            figures(&progress.candidate),
            figures(&progress.current)
        );
        let old = self.slot.swap(self.candidate.clone());
        set_version_gauges(
            &self.metrics,
            &self.queue,
            &old.sha256,
            &self.candidate.sha256,
        );
        (self.on_promoted)(&self.plan.candidate);
        self.end(progress, Status::Promoted, why.clone());
        tracing::info!(queue = %self.queue, from = %old.sha256, to = %self.candidate.sha256, candidate = %self.plan.candidate.display(), "candidate promoted: it {why}; it serves every delivery as the version");
    }

    fn roll_back(&self, progress: &mut Progress, why: String) {
        self.end(progress, Status::RolledBack, why.clone());
        self.candidate.retire();
        tracing::warn!(queue = %self.queue, sha256 = %self.candidate.sha256, candidate = %self.plan.candidate.display(), "candidate rolled back: {why}; the current version serves every delivery");
    }

    fn end(&self, progress: &mut Progress, status: Status, why: String) {
        progress.status = status;
        progress.reason = Some(why);
        self.share.store(0, Ordering::Relaxed);
        self.set_share_gauge();
        self.decision(status.word());
        self.keep(progress);
    }

    fn keep(&self, progress: &Progress) {
        let Some(records) = &self.records else {
            return;
        };
        let record = Record {
            queue: self.queue.clone(),
            current: self.current_sha256.clone(),
            candidate: self.candidate.sha256.to_string(),
            candidate_path: self.plan.candidate.clone(),
            status: progress.status,
            reason: progress.reason.clone(),
            at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        };
        if let Err(e) = records.save(&record) {
            tracing::warn!(queue = %self.queue, folder = %records.dir().display(), error = %e, "cannot keep the rollout's record; a restart would start it afresh");
        }
    }

    fn set_share_gauge(&self) {
        let share = f64::from(self.share.load(Ordering::Relaxed)) / 10_000.0;
        self.metrics
            .rollout
            .share
            .get_or_create(&QueueLabel {
                queue: self.queue.clone(),
            })
            .set(share);
    }

    fn decision(&self, word: &'static str) {
        self.metrics
            .rollout
            .decisions
            .get_or_create(&RolloutDecisionLabels {
                queue: self.queue.clone(),
                decision: word,
            })
            .inc();
    }

    fn shadow_metric(&self, result: &'static str) {
        self.metrics
            .rollout
            .shadow
            .get_or_create(&ShadowResultLabels {
                queue: self.queue.clone(),
                result,
            })
            .inc();
    }
}

/// `acemq_plugin_version` after a version replaced another.
fn set_version_gauges(metrics: &Metrics, queue: &str, from: &str, to: &str) {
    for (sha256, value) in [(from, 0), (to, 1)] {
        metrics
            .plugin_version
            .get_or_create(&PluginVersionLabels {
                queue: queue.to_string(),
                sha256: sha256.to_string(),
            })
            .set(value);
    }
}

/// A window's figures in words: calls, faults, set-asides, the 99th
/// percentile.
fn figures(window: &Window) -> String {
    format!(
        "{} calls, {} faulted ({:.1}%), {} rejected or parked ({:.1}%), 99th percentile {}",
        window.calls,
        window.faults,
        window.fault_rate() * 100.0,
        window.set_aside,
        window.set_aside_rate() * 100.0,
        window.p99().map_or("-".to_string(), |us| format!(
            "{:.1} ms",
            us as f64 / 1000.0
        ))
    )
}

/// A consumer's rollout, if one is under way or has ended since the host
/// started; replaced by a start, cleared by nothing (its view stays for
/// `/rollouts`).
#[derive(Default)]
pub struct RolloutSlot {
    rollout: ArcSwapOption<Rollout>,
}

impl RolloutSlot {
    pub fn get(&self) -> Option<Arc<Rollout>> {
        self.rollout.load_full()
    }

    pub fn set(&self, rollout: Arc<Rollout>) {
        self.rollout.store(Some(rollout));
    }

    /// Where the delivery with envelope id `id` goes. `id` is read only
    /// while a rollout runs: a message without one of its own then has it
    /// derived ([`MessageId`]).
    pub fn route(&self, id: &MessageId) -> (Route, Option<Arc<Rollout>>) {
        match self.rollout.load_full() {
            Some(rollout) => (rollout.route(id.as_str()), Some(rollout)),
            None => (Route::Current, None),
        }
    }
}

/// Loads a candidate for `plan` on a consumer of `context`: compiled,
/// type-checked and warmed like a hot swap's version. A shadow's calls get
/// its own deadline.
pub fn load_candidate(
    engine: &PluginEngine,
    plan: &Plan,
    context: &Arc<ConsumerContext>,
) -> Result<Arc<HandlerVersion>, PluginError> {
    let context = match plan.mode {
        Mode::Canary => context.clone(),
        Mode::Shadow => {
            let mut shadow = ConsumerContext::clone(context);
            shadow.limits.deadline = plan.shadow_deadline;
            Arc::new(shadow)
        }
    };
    HandlerVersion::load(engine, &plan.candidate, context)
}

/// Told a consumer's queue and its promoted candidate's path.
pub type OnPromoted = Arc<dyn Fn(&str, &Path) + Send + Sync>;

/// One consumer's rollout slot, and what starting a rollout on it needs.
struct Consumer {
    slot: Arc<RolloutSlot>,
    handler: Arc<HandlerSlot>,
    defaults: ConsumerDefaults,
}

/// Every consumer's rollout, for the admin endpoint: what it shows, and
/// starting and aborting one.
pub struct Rollouts {
    consumers: std::collections::BTreeMap<String, Consumer>,
    engine: Arc<PluginEngine>,
    records: Option<Records>,
    metrics: Arc<Metrics>,
    /// Told the consumer and the candidate's path when one is promoted.
    on_promoted: OnPromoted,
}

/// Why a rollout could not be started or aborted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no consumer reads queue '{0}'")]
    UnknownQueue(String),
    #[error("the consumer of '{0}' has a rollout under way; abort it first")]
    UnderWay(String),
    #[error("the consumer of '{0}' has no rollout under way")]
    NoneUnderWay(String),
    #[error("{0}")]
    Unusable(String),
}

impl Rollouts {
    pub fn new(
        engine: Arc<PluginEngine>,
        records: Option<Records>,
        metrics: Arc<Metrics>,
        on_promoted: OnPromoted,
    ) -> Self {
        Self {
            consumers: Default::default(),
            engine,
            records,
            metrics,
            on_promoted,
        }
    }

    /// Registers the consumer of `queue`; its pipeline routes through the
    /// slot returned.
    pub fn add(
        &mut self,
        queue: &str,
        handler: Arc<HandlerSlot>,
        concurrency: usize,
    ) -> Arc<RolloutSlot> {
        let slot = Arc::new(RolloutSlot::default());
        let defaults = ConsumerDefaults {
            concurrency,
            deadline: handler.current().context().limits.deadline,
        };
        self.consumers.insert(
            queue.to_string(),
            Consumer {
                slot: slot.clone(),
                handler,
                defaults,
            },
        );
        slot
    }

    /// [`start`](Self::start) for a rollout asked for in words (the admin
    /// endpoint's query): the consumer's defaults fill in what it does not
    /// say, and a field that cannot be used is refused, named.
    pub async fn start_spec(
        &self,
        queue: &str,
        spec: &PlanSpec,
        candidate: std::path::PathBuf,
    ) -> Result<RolloutView, Refusal> {
        let consumer = self
            .consumers
            .get(queue)
            .ok_or_else(|| Refusal::UnknownQueue(queue.to_string()))?;
        let mut plan = spec
            .plan(candidate, consumer.defaults)
            .map_err(|bad| Refusal::Unusable(format!("{}: {}", bad.field, bad.reason)))?;
        // The engine keeps room for a candidate as wide as the consumer
        // (plugin/capacity.rs); a wider shadow is configured, not asked for.
        plan.shadow_concurrency = plan.shadow_concurrency.min(consumer.defaults.concurrency);
        self.start(queue, plan).await
    }

    fn setting(&self, queue: &str, handler: &Arc<HandlerSlot>) -> Setting {
        let hook = self.on_promoted.clone();
        let name = queue.to_string();
        Setting {
            queue: queue.to_string(),
            slot: handler.clone(),
            records: self.records.clone(),
            metrics: self.metrics.clone(),
            on_promoted: Box::new(move |path| hook(&name, path)),
        }
    }

    /// At start: the rollout the config asks for on `queue`, as its record
    /// says it stands (`record::resume`): begun, resumed, applied as
    /// promoted, or left as it ended.
    pub fn configured(&self, queue: &str, plan: Plan, candidate: Arc<HandlerVersion>) {
        let Some(consumer) = self.consumers.get(queue) else {
            return;
        };
        let setting = self.setting(queue, &consumer.handler);
        let current = consumer.handler.current().sha256.to_string();
        let record = self.records.as_ref().and_then(|r| r.load(queue));
        match super::record::resume(
            record.as_ref(),
            &current,
            &candidate.sha256,
            plan.on_restart,
        ) {
            Resumption::Fresh => consumer
                .slot
                .set(Rollout::begin(plan, candidate, 0, setting)),
            Resumption::At(step) => consumer
                .slot
                .set(Rollout::begin(plan, candidate, step, setting)),
            Resumption::Promoted => Rollout::promote_now(&plan, candidate, &setting),
            Resumption::Ended(status, reason) => {
                if let (Status::Abandoned, Some(records), Some(mut record)) =
                    (status, &self.records, record)
                {
                    record.status = Status::Abandoned;
                    record.reason = reason.clone();
                    let _ = records.save(&record);
                    self.metrics
                        .rollout
                        .decisions
                        .get_or_create(&RolloutDecisionLabels {
                            queue: queue.to_string(),
                            decision: "abandoned",
                        })
                        .inc();
                }
                tracing::warn!(
                    queue,
                    candidate = %plan.candidate.display(),
                    sha256 = %candidate.sha256,
                    ended = status.word(),
                    reason = reason.as_deref().unwrap_or("-"),
                    "the configured candidate's rollout ended before this start ({}); it is not run again until the candidate changes (or `acemq-host rollout start`)",
                    status.word()
                );
                candidate.retire();
            }
        }
    }

    /// Starts a rollout of `plan` on `queue` now (the admin endpoint): the
    /// candidate is checked, compiled and warmed on a blocking thread
    /// first, and refused with the reason when it cannot serve.
    pub async fn start(&self, queue: &str, plan: Plan) -> Result<RolloutView, Refusal> {
        let consumer = self
            .consumers
            .get(queue)
            .ok_or_else(|| Refusal::UnknownQueue(queue.to_string()))?;
        if consumer
            .slot
            .get()
            .is_some_and(|r| matches!(r.view().status, Status::Running { .. }))
        {
            return Err(Refusal::UnderWay(queue.to_string()));
        }
        let engine = self.engine.clone();
        let context = consumer.handler.current().context().clone();
        let loading = plan.clone();
        let candidate = tokio::task::spawn_blocking(move || {
            crate::fs_trust::check_plugin(&loading.candidate)
                .map_err(|refused| refused.to_string())?;
            load_candidate(&engine, &loading, &context).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| Refusal::Unusable(format!("loading the candidate panicked: {e}")))?
        .map_err(Refusal::Unusable)?;
        let rollout = Rollout::begin(plan, candidate, 0, self.setting(queue, &consumer.handler));
        consumer.slot.set(rollout.clone());
        Ok(rollout.view())
    }

    /// Aborts the rollout under way on `queue`.
    pub fn abort(&self, queue: &str) -> Result<RolloutView, Refusal> {
        let consumer = self
            .consumers
            .get(queue)
            .ok_or_else(|| Refusal::UnknownQueue(queue.to_string()))?;
        let rollout = consumer
            .slot
            .get()
            .ok_or_else(|| Refusal::NoneUnderWay(queue.to_string()))?;
        if !rollout.abort("an operator aborted it") {
            return Err(Refusal::NoneUnderWay(queue.to_string()));
        }
        Ok(rollout.view())
    }

    /// Every consumer's rollout since the host started, by queue.
    pub fn views(&self) -> Vec<RolloutView> {
        self.consumers
            .values()
            .filter_map(|c| c.slot.get())
            .map(|r| r.view())
            .collect()
    }

    /// The rollout of `queue`, if it has had one.
    pub fn view(&self, queue: &str) -> Option<RolloutView> {
        self.consumers.get(queue)?.slot.get().map(|r| r.view())
    }
}
