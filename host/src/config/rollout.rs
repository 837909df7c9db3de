//! `[consumers.candidate]`: a new version of a consumer's handler rolled
//! out beside the current one (docs/rollout.md), and the checks of it that
//! need only the file. What it becomes is a `rollout::plan::Plan`.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::{ConfigError, ConsumerConfig, LoadedConfig};
use crate::rollout::plan::{
    DEFAULT_KEEP_DIFFERENCES, DEFAULT_MESSAGES_PER_STEP, DEFAULT_STEPS, Mode, OnRestart, Plan,
    Share, Thresholds, parse_rate,
};

/// `[consumers.candidate]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CandidateConfig {
    /// The candidate's component, relative to the config file.
    pub plugin: Spanned<PathBuf>,
    /// `"canary"` (the default) or `"shadow"`.
    pub mode: Option<Spanned<Mode>>,
    /// A canary's shares, increasing (default 1%, 10%, 50%, 100%).
    pub steps: Option<Spanned<Vec<String>>>,
    /// A shadow's share (default 100%).
    pub share: Option<Spanned<String>>,
    /// A canary's calls judged at each step.
    pub messages_per_step: Option<u64>,
    /// Largest rise of the fault rate over the current version's, `"1%"`.
    pub max_fault_rate_increase: Option<Spanned<String>>,
    /// Largest rise of the rate of messages rejected or parked, `"5%"`.
    pub max_set_aside_rate_increase: Option<Spanned<String>>,
    /// Largest ratio of the candidate's 99th-percentile call time to the
    /// current version's (3).
    pub max_call_time_ratio: Option<f64>,
    /// `"resume"` (the default) or `"abandon"`.
    #[serde(default)]
    pub on_restart: OnRestart,
    /// A shadow's calls at once (the consumer's concurrency).
    pub shadow_concurrency: Option<usize>,
    /// A shadow call's deadline (the consumer's).
    #[serde(default, with = "humantime_serde::option")]
    pub shadow_deadline: Option<Duration>,
    /// Differences a shadow keeps for inspection.
    pub keep_differences: Option<usize>,
}

impl CandidateConfig {
    pub fn mode(&self) -> Mode {
        self.mode.as_ref().map_or(Mode::Canary, |m| *m.get_ref())
    }
}

impl LoadedConfig {
    /// The rollout `consumer` (entry `index`) asks for, checked; `None`
    /// without a `[consumers.candidate]`.
    pub fn rollout_plan(
        &self,
        index: usize,
        consumer: &ConsumerConfig,
    ) -> Result<Option<Plan>, ConfigError> {
        let Some(candidate) = &consumer.candidate else {
            return Ok(None);
        };
        let key = |name: &str| format!("consumers[{index}].candidate.{name}");
        let at = |span: std::ops::Range<usize>| Some(span.start);
        let mode = candidate.mode();
        let steps: Vec<Share> = match (mode, &candidate.steps, &candidate.share) {
            (Mode::Canary, Some(steps), None) => steps
                .get_ref()
                .iter()
                .map(|s| Share::parse(s))
                .collect::<Result<_, _>>()
                .map_err(|e| self.error_at(at(steps.span()), format!("{}: {e}", key("steps"))))?,
            (Mode::Canary, None, None) => DEFAULT_STEPS
                .iter()
                .map(|s| Share::parse(s).expect("the default steps parse"))
                .collect(),
            (Mode::Shadow, None, share) => vec![match share {
                Some(share) => Share::parse(share.get_ref()).map_err(|e| {
                    self.error_at(at(share.span()), format!("{}: {e}", key("share")))
                })?,
                None => Share::ALL,
            }],
            (Mode::Canary, _, Some(share)) => {
                return Err(self.error_at(
                    at(share.span()),
                    format!(
                        "{}: a canary steps through `steps`; `share` is a shadow's",
                        key("share")
                    ),
                ));
            }
            (Mode::Shadow, Some(steps), _) => {
                return Err(self.error_at(
                    at(steps.span()),
                    format!(
                        "{}: a shadow runs on one `share`; `steps` are a canary's",
                        key("steps")
                    ),
                ));
            }
        };
        Plan::check_steps(mode, &steps).map_err(|e| {
            let span = candidate.steps.as_ref().map(Spanned::span);
            self.error_at(span.map(|s| s.start), format!("{}: {e}", key("steps")))
        })?;
        let rate = |value: &Option<Spanned<String>>, name: &str, default: f64| match value {
            None => Ok(default),
            Some(text) => parse_rate(text.get_ref())
                .map_err(|e| self.error_at(at(text.span()), format!("{}: {e}", key(name)))),
        };
        let defaults = Thresholds::default();
        let thresholds = Thresholds {
            max_fault_rate_increase: rate(
                &candidate.max_fault_rate_increase,
                "max_fault_rate_increase",
                defaults.max_fault_rate_increase,
            )?,
            max_set_aside_rate_increase: rate(
                &candidate.max_set_aside_rate_increase,
                "max_set_aside_rate_increase",
                defaults.max_set_aside_rate_increase,
            )?,
            max_call_time_ratio: match candidate.max_call_time_ratio {
                Some(ratio) if ratio >= 1.0 => ratio,
                Some(ratio) => {
                    return Err(self.error_at(
                        at(candidate.plugin.span()),
                        format!("{}: {ratio} is below 1: the candidate could not be as fast as the current version", key("max_call_time_ratio")),
                    ));
                }
                None => defaults.max_call_time_ratio,
            },
        };
        let messages_per_step = candidate
            .messages_per_step
            .unwrap_or(DEFAULT_MESSAGES_PER_STEP);
        if messages_per_step == 0 {
            return Err(self.error_at(
                at(candidate.plugin.span()),
                format!("{}: must be at least 1", key("messages_per_step")),
            ));
        }
        let concurrency = self.concurrency_of(consumer, false);
        Ok(Some(Plan {
            candidate: self.resolve(candidate.plugin.get_ref()),
            mode,
            steps,
            messages_per_step,
            thresholds,
            on_restart: candidate.on_restart,
            shadow_concurrency: candidate.shadow_concurrency.unwrap_or(concurrency).max(1),
            shadow_deadline: candidate.shadow_deadline.unwrap_or(consumer.deadline),
            keep_differences: candidate
                .keep_differences
                .unwrap_or(DEFAULT_KEEP_DIFFERENCES),
        }))
    }
}
