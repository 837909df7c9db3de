//! What a rollout is asked to do, checked: the candidate, its mode, its
//! shares, how many of its calls make a step, and how much worse than the
//! current version it may be. Pure: the config's `[consumers.candidate]`
//! and the admin endpoint's start request both end here.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// A share of deliveries, in basis points (1 % = 100).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Share(u32);

impl Share {
    pub const ALL: Share = Share(10_000);

    /// `"10%"`, `"0.5%"` or `"100%"`: more than 0 and at most 100 %, to a
    /// hundredth of a percent.
    pub fn parse(text: &str) -> Result<Self, String> {
        let number = text
            .trim()
            .strip_suffix('%')
            .ok_or_else(|| format!("\"{text}\" is not a percentage (write it as \"10%\")"))?;
        let value: f64 = number
            .trim()
            .parse()
            .map_err(|_| format!("\"{text}\" is not a percentage (write it as \"10%\")"))?;
        let basis_points = (value * 100.0).round();
        if !(1.0..=10_000.0).contains(&basis_points) {
            return Err(format!(
                "\"{text}\" is out of range: a share is more than 0% and at most 100%"
            ));
        }
        Ok(Share(basis_points as u32))
    }

    pub fn basis_points(self) -> u32 {
        self.0
    }

    /// As a fraction of 1.
    pub fn fraction(self) -> f64 {
        f64::from(self.0) / 10_000.0
    }
}

impl fmt::Display for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(100) {
            write!(f, "{}%", self.0 / 100)
        } else {
            write!(f, "{}%", f64::from(self.0) / 100.0)
        }
    }
}

/// A rate allowed as an increase (`max_fault_rate_increase = "1%"`): a
/// fraction from 0 to 1.
pub fn parse_rate(text: &str) -> Result<f64, String> {
    if text.trim() == "0%" {
        return Ok(0.0);
    }
    Share::parse(text).map(Share::fraction)
}

/// How the candidate meets live deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// It handles its share of deliveries for real, step by step, and is
    /// promoted or rolled back.
    Canary,
    /// It runs on a copy of its share beside the current version, publishes
    /// nothing, changes no state, and is compared call by call.
    Shadow,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Canary => "canary",
            Mode::Shadow => "shadow",
        })
    }
}

/// What a host restarted in the middle of a canary does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnRestart {
    /// Carries on at the step it had reached (a promotion or a rollback it
    /// had decided stands).
    #[default]
    Resume,
    /// Gives it up: the current version serves, and the rollout is
    /// recorded as abandoned (a promotion it had decided still stands).
    Abandon,
}

/// How much worse than the current version a canary may be over a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// Its fault rate (traps, deadlines, memory) minus the current's.
    pub max_fault_rate_increase: f64,
    /// Its rate of messages rejected or parked, minus the current's.
    pub max_set_aside_rate_increase: f64,
    /// Its 99th-percentile call time over the current's.
    pub max_call_time_ratio: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            max_fault_rate_increase: 0.01,
            max_set_aside_rate_increase: 0.05,
            max_call_time_ratio: 3.0,
        }
    }
}

/// A rollout to run on one consumer.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub candidate: PathBuf,
    pub mode: Mode,
    /// Canary: the shares it steps through, increasing; shadow: one share.
    pub steps: Vec<Share>,
    /// A canary's calls over which each step is judged.
    pub messages_per_step: u64,
    pub thresholds: Thresholds,
    pub on_restart: OnRestart,
    /// A shadow's calls running at once at most; a delivery that finds
    /// them all taken is not shadowed (counted), so the shadow never holds
    /// up the current version.
    pub shadow_concurrency: usize,
    /// A shadow call's own deadline.
    pub shadow_deadline: Duration,
    /// Differences a shadow keeps for inspection (the first ones).
    pub keep_differences: usize,
}

/// The steps a canary takes when none are configured.
pub const DEFAULT_STEPS: [&str; 4] = ["1%", "10%", "50%", "100%"];
pub const DEFAULT_MESSAGES_PER_STEP: u64 = 500;
pub const DEFAULT_KEEP_DIFFERENCES: usize = 20;

impl Plan {
    /// Checks steps: at least one, each a share, increasing. A shadow has
    /// exactly one.
    pub fn check_steps(mode: Mode, steps: &[Share]) -> Result<(), String> {
        if steps.is_empty() {
            return Err("no steps: give at least one share".to_string());
        }
        if mode == Mode::Shadow && steps.len() != 1 {
            return Err(format!(
                "a shadow runs on one share, not {} steps",
                steps.len()
            ));
        }
        if let Some(pair) = steps.windows(2).find(|pair| pair[0] >= pair[1]) {
            return Err(format!(
                "steps must increase: {} comes after {}",
                pair[1], pair[0]
            ));
        }
        Ok(())
    }

    /// The share of step `index`.
    pub fn share(&self, index: usize) -> Share {
        self.steps[index.min(self.steps.len() - 1)]
    }
}

/// A rollout as asked for, in words (the config's `[consumers.candidate]`,
/// the admin endpoint's query), before it is checked: everything but the
/// candidate is optional, and [`PlanSpec::plan`] fills in the defaults.
#[derive(Debug, Clone, Default)]
pub struct PlanSpec {
    pub mode: Option<Mode>,
    pub steps: Option<Vec<String>>,
    pub share: Option<String>,
    pub messages_per_step: Option<u64>,
    pub max_fault_rate_increase: Option<String>,
    pub max_set_aside_rate_increase: Option<String>,
    pub max_call_time_ratio: Option<f64>,
    pub on_restart: Option<OnRestart>,
    pub shadow_concurrency: Option<usize>,
    pub shadow_deadline: Option<Duration>,
    pub keep_differences: Option<usize>,
}

/// A field of a [`PlanSpec`] that cannot be used: its name and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadField {
    pub field: &'static str,
    pub reason: String,
}

/// What the consumer gives a plan that does not say: its concurrency (a
/// shadow's calls at once) and its deadline (a shadow call's).
#[derive(Debug, Clone, Copy)]
pub struct ConsumerDefaults {
    pub concurrency: usize,
    pub deadline: Duration,
}

impl PlanSpec {
    /// The spec an admin request's query fields say (`steps` comma
    /// separated); a field that does not parse is refused, named.
    pub fn from_query(
        fields: &std::collections::BTreeMap<String, String>,
    ) -> Result<Self, BadField> {
        fn parsed<T: std::str::FromStr>(
            fields: &std::collections::BTreeMap<String, String>,
            field: &'static str,
        ) -> Result<Option<T>, BadField> {
            fields
                .get(field)
                .map(|text| {
                    text.trim().parse().map_err(|_| BadField {
                        field,
                        reason: format!("\"{text}\" is not a number"),
                    })
                })
                .transpose()
        }
        let mode = match fields.get("mode").map(String::as_str) {
            None | Some("canary") => Mode::Canary,
            Some("shadow") => Mode::Shadow,
            Some(other) => {
                return Err(BadField {
                    field: "mode",
                    reason: format!("\"{other}\" is neither canary nor shadow"),
                });
            }
        };
        Ok(Self {
            mode: Some(mode),
            steps: fields
                .get("steps")
                .map(|steps| steps.split(',').map(|s| s.trim().to_string()).collect()),
            share: fields.get("share").cloned(),
            messages_per_step: parsed(fields, "messages_per_step")?,
            max_fault_rate_increase: fields.get("max_fault_rate_increase").cloned(),
            max_set_aside_rate_increase: fields.get("max_set_aside_rate_increase").cloned(),
            max_call_time_ratio: parsed(fields, "max_call_time_ratio")?,
            // Started by hand while the host runs: a restart resumes it.
            on_restart: None,
            shadow_concurrency: parsed(fields, "shadow_concurrency")?,
            shadow_deadline: None,
            keep_differences: parsed(fields, "keep_differences")?,
        })
    }

    /// The plan, checked, with the defaults for what it does not say.
    pub fn plan(&self, candidate: PathBuf, consumer: ConsumerDefaults) -> Result<Plan, BadField> {
        let bad = |field: &'static str| move |reason: String| BadField { field, reason };
        let mode = self.mode.unwrap_or(Mode::Canary);
        let steps: Vec<Share> = match (mode, &self.steps, &self.share) {
            (Mode::Canary, Some(steps), None) => steps
                .iter()
                .map(|s| Share::parse(s))
                .collect::<Result<_, _>>()
                .map_err(bad("steps"))?,
            (Mode::Canary, None, None) => DEFAULT_STEPS
                .iter()
                .map(|s| Share::parse(s).expect("the default steps parse"))
                .collect(),
            (Mode::Shadow, None, share) => vec![match share {
                Some(share) => Share::parse(share).map_err(bad("share"))?,
                None => Share::ALL,
            }],
            (Mode::Canary, _, Some(_)) => {
                return Err(bad("share")(
                    "a canary steps through `steps`; `share` is a shadow's".to_string(),
                ));
            }
            (Mode::Shadow, Some(_), _) => {
                return Err(bad("steps")(
                    "a shadow runs on one `share`; `steps` are a canary's".to_string(),
                ));
            }
        };
        Plan::check_steps(mode, &steps).map_err(bad("steps"))?;
        let rate = |value: &Option<String>, field, default| match value {
            None => Ok(default),
            Some(text) => parse_rate(text).map_err(bad(field)),
        };
        let defaults = Thresholds::default();
        let max_call_time_ratio = self
            .max_call_time_ratio
            .unwrap_or(defaults.max_call_time_ratio);
        if max_call_time_ratio < 1.0 {
            return Err(bad("max_call_time_ratio")(format!(
                "{max_call_time_ratio} is below 1: the candidate could not be as fast as the current version"
            )));
        }
        let messages_per_step = self.messages_per_step.unwrap_or(DEFAULT_MESSAGES_PER_STEP);
        if messages_per_step == 0 {
            return Err(bad("messages_per_step")("must be at least 1".to_string()));
        }
        Ok(Plan {
            candidate,
            mode,
            steps,
            messages_per_step,
            thresholds: Thresholds {
                max_fault_rate_increase: rate(
                    &self.max_fault_rate_increase,
                    "max_fault_rate_increase",
                    defaults.max_fault_rate_increase,
                )?,
                max_set_aside_rate_increase: rate(
                    &self.max_set_aside_rate_increase,
                    "max_set_aside_rate_increase",
                    defaults.max_set_aside_rate_increase,
                )?,
                max_call_time_ratio,
            },
            on_restart: self.on_restart.unwrap_or_default(),
            shadow_concurrency: self
                .shadow_concurrency
                .unwrap_or(consumer.concurrency)
                .max(1),
            shadow_deadline: self.shadow_deadline.unwrap_or(consumer.deadline),
            keep_differences: self.keep_differences.unwrap_or(DEFAULT_KEEP_DIFFERENCES),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_read_as_percentages_to_a_hundredth() {
        assert_eq!(Share::parse("1%").unwrap().basis_points(), 100);
        assert_eq!(Share::parse(" 0.5% ").unwrap().basis_points(), 50);
        assert_eq!(Share::parse("100%").unwrap(), Share::ALL);
        assert_eq!(Share::parse("0.5%").unwrap().to_string(), "0.5%");
        assert_eq!(Share::parse("10%").unwrap().to_string(), "10%");
        for bad in ["10", "0%", "101%", "x%", "-1%", "0.001%"] {
            assert!(Share::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_rate("0%").unwrap(), 0.0);
        assert_eq!(parse_rate("2.5%").unwrap(), 0.025);
    }

    #[test]
    fn a_spec_fills_in_the_defaults_and_names_the_field_at_fault() {
        let consumer = ConsumerDefaults {
            concurrency: 4,
            deadline: Duration::from_secs(2),
        };
        let plan = PlanSpec::default().plan("c.wasm".into(), consumer).unwrap();
        assert_eq!(plan.mode, Mode::Canary);
        assert_eq!(plan.steps.len(), DEFAULT_STEPS.len());
        assert_eq!(plan.messages_per_step, DEFAULT_MESSAGES_PER_STEP);
        assert_eq!(plan.shadow_concurrency, 4);
        let shadow = PlanSpec {
            mode: Some(Mode::Shadow),
            share: Some("25%".into()),
            ..PlanSpec::default()
        }
        .plan("c.wasm".into(), consumer)
        .unwrap();
        assert_eq!(shadow.steps, [Share::parse("25%").unwrap()]);
        let bad = PlanSpec {
            steps: Some(vec!["10%".into(), "5%".into()]),
            ..PlanSpec::default()
        }
        .plan("c.wasm".into(), consumer)
        .unwrap_err();
        assert_eq!(bad.field, "steps");
        let bad = PlanSpec {
            share: Some("10%".into()),
            ..PlanSpec::default()
        }
        .plan("c.wasm".into(), consumer)
        .unwrap_err();
        assert_eq!(bad.field, "share");
    }

    #[test]
    fn steps_increase_and_a_shadow_has_one() {
        let s = |t: &str| Share::parse(t).unwrap();
        assert!(Plan::check_steps(Mode::Canary, &[s("1%"), s("10%"), s("100%")]).is_ok());
        let err = Plan::check_steps(Mode::Canary, &[s("10%"), s("5%")]).unwrap_err();
        assert_eq!(err, "steps must increase: 5% comes after 10%");
        assert!(Plan::check_steps(Mode::Canary, &[]).is_err());
        assert!(Plan::check_steps(Mode::Shadow, &[s("100%")]).is_ok());
        assert!(Plan::check_steps(Mode::Shadow, &[s("1%"), s("2%")]).is_err());
    }
}
