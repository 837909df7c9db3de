//! `[consumers.candidate]`: a new version of a consumer's handler rolled
//! out beside the current one (docs/rollout.md), and the checks of it that
//! need only the file. What it becomes is a `rollout::plan::Plan`, through
//! the same `PlanSpec` an admin request fills in.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::{ConfigError, ConsumerConfig, LoadedConfig};
use crate::rollout::plan::{ConsumerDefaults, Mode, OnRestart, Plan, PlanSpec};

/// `[consumers.candidate]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CandidateConfig {
    /// The candidate's component, relative to the config file.
    pub plugin: Spanned<PathBuf>,
    /// `"canary"` (the default) or `"shadow"`.
    pub mode: Option<Mode>,
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
    pub on_restart: Option<OnRestart>,
    /// A shadow's calls at once (the consumer's concurrency).
    pub shadow_concurrency: Option<usize>,
    /// A shadow call's deadline (the consumer's).
    #[serde(default, with = "humantime_serde::option")]
    pub shadow_deadline: Option<Duration>,
    /// Differences a shadow keeps for inspection.
    pub keep_differences: Option<usize>,
}

impl CandidateConfig {
    fn spec(&self) -> PlanSpec {
        PlanSpec {
            mode: self.mode,
            steps: self.steps.as_ref().map(|s| s.get_ref().clone()),
            share: self.share.as_ref().map(|s| s.get_ref().clone()),
            messages_per_step: self.messages_per_step,
            max_fault_rate_increase: self
                .max_fault_rate_increase
                .as_ref()
                .map(|s| s.get_ref().clone()),
            max_set_aside_rate_increase: self
                .max_set_aside_rate_increase
                .as_ref()
                .map(|s| s.get_ref().clone()),
            max_call_time_ratio: self.max_call_time_ratio,
            on_restart: self.on_restart,
            shadow_concurrency: self.shadow_concurrency,
            shadow_deadline: self.shadow_deadline,
            keep_differences: self.keep_differences,
        }
    }

    /// Where a field was written, for an error's line.
    fn span_of(&self, field: &str) -> usize {
        let spanned = match field {
            "steps" => self.steps.as_ref().map(Spanned::span),
            "share" => self.share.as_ref().map(Spanned::span),
            "max_fault_rate_increase" => self.max_fault_rate_increase.as_ref().map(Spanned::span),
            "max_set_aside_rate_increase" => {
                self.max_set_aside_rate_increase.as_ref().map(Spanned::span)
            }
            _ => None,
        };
        spanned.unwrap_or_else(|| self.plugin.span()).start
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
        let defaults = ConsumerDefaults {
            concurrency: self.concurrency_of(consumer, false),
            deadline: consumer.deadline,
        };
        candidate
            .spec()
            .plan(self.resolve(candidate.plugin.get_ref()), defaults)
            .map(Some)
            .map_err(|bad| {
                self.error_at(
                    Some(candidate.span_of(bad.field)),
                    format!("consumers[{index}].candidate.{}: {}", bad.field, bad.reason),
                )
            })
    }
}
