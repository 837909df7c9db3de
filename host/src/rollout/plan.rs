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
