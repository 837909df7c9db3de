//! What the fault tallies share: inputs published with known ids, the
//! outputs drained and held against them (lost, duplicated), and the host's
//! timed log lines, from which a fault's effect and recovery are read.

use std::collections::HashSet;
use std::ops::Range;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel, Confirmation};
use serde_json::Value;

use crate::{Broker, ReceivedMessage};

/// The size of each input's JSON body.
pub const BODY_BYTES: usize = 1024;

/// Input `i`: a 1 KiB JSON body, message id `in-{i}`.
pub fn input(i: usize) -> (Vec<u8>, BasicProperties) {
    let head = format!(r#"{{"n":{i},"pad":""#);
    let pad = "x".repeat(BODY_BYTES.saturating_sub(head.len() + 2));
    let properties = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id(format!("in-{i}").into());
    (format!(r#"{head}{pad}"}}"#).into_bytes(), properties)
}

/// Publishes inputs `ids` to `queue`, confirmed (see [`input`]); fails on
/// a nack.
pub async fn publish_inputs(broker: &Broker, queue: &str, ids: Range<usize>) -> Result<()> {
    broker.publish_many("", queue, ids.map(input)).await?;
    Ok(())
}

/// Publishes inputs `ids` to `queue` on `channel` (in confirm mode) until
/// the broker has acked every one: those it nacks (a quorum queue nacks
/// what it could not take while its leader moves) are published again.
/// Returns how many were published again: a nacked message is normally
/// not enqueued, but if one was, its input is there twice.
pub async fn publish_inputs_until_confirmed(
    channel: &Channel,
    queue: &str,
    ids: Range<usize>,
) -> Result<usize> {
    let mut pending: Vec<usize> = ids.collect();
    let mut again = 0;
    loop {
        let mut confirms = Vec::with_capacity(pending.len());
        for &i in &pending {
            let (body, properties) = input(i);
            let confirm = channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    &body,
                    properties,
                )
                .await
                .with_context(|| format!("publishing input {i}"))?;
            confirms.push((i, confirm));
        }
        let mut nacked = Vec::new();
        for (i, confirm) in confirms {
            let confirmation = confirm
                .await
                .with_context(|| format!("confirming input {i}"))?;
            if let Confirmation::Nack(_) = confirmation {
                nacked.push(i);
            }
        }
        if nacked.is_empty() {
            return Ok(again);
        }
        again += nacked.len();
        pending = nacked;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn drain_all(broker: &Broker, queue: &str) -> Result<Vec<ReceivedMessage>> {
    let count = broker.message_count(queue).await? as usize;
    let messages = broker.drain(queue, count, Duration::from_secs(120)).await?;
    anyhow::ensure!(
        messages.len() == count,
        "drained {} of {count} outputs",
        messages.len()
    );
    Ok(messages)
}

/// What the outputs say about the inputs.
#[derive(Debug)]
pub struct Tally {
    /// Inputs without an output, by number.
    pub lost: Vec<usize>,
    /// Outputs whose message id was seen before.
    pub duplicated: usize,
    /// Inputs with at least one output.
    pub distinct: usize,
}

impl Tally {
    pub fn of(outputs: &[ReceivedMessage], inputs: usize) -> Self {
        let mut ids = HashSet::new();
        let mut seen = HashSet::new();
        let mut duplicated = 0;
        for output in outputs {
            if let Some(id) = &output.message_id
                && !ids.insert(id.clone())
            {
                duplicated += 1;
            }
            let body: Value = serde_json::from_slice(&output.body).unwrap_or_default();
            if let Some(input) = body["input_id"].as_str() {
                seen.insert(input.to_string());
            }
        }
        let lost = (0..inputs)
            .filter(|i| !seen.contains(&format!("in-{i}")))
            .collect();
        Self {
            lost,
            duplicated,
            distinct: seen.len(),
        }
    }
}

/// The host's log lines with their times (each line starts with an RFC
/// 3339 timestamp; the few without one are left out).
pub struct HostLog {
    lines: Vec<(SystemTime, String)>,
    /// The bench's start, on the wall clock.
    start: SystemTime,
}

impl HostLog {
    pub fn new(lines: &[String], start: SystemTime) -> Self {
        let time = |line: &str| humantime::parse_rfc3339(line.split_whitespace().next()?).ok();
        let lines = lines
            .iter()
            .filter_map(|line| Some((time(line)?, line.clone())))
            .collect();
        Self { lines, start }
    }

    /// The first line containing `needle` logged at or after `after` (and
    /// before `before`, if given), with its time.
    fn find(
        &self,
        needle: &str,
        after: SystemTime,
        before: Option<SystemTime>,
    ) -> Option<&(SystemTime, String)> {
        self.lines.iter().find(|(at, line)| {
            *at >= after && before.is_none_or(|before| *at < before) && line.contains(needle)
        })
    }

    /// The time of that line (see [`HostLog::line`]).
    pub fn first(
        &self,
        needle: &str,
        after: SystemTime,
        before: Option<SystemTime>,
    ) -> Option<SystemTime> {
        self.find(needle, after, before).map(|(at, _)| *at)
    }

    /// The first line containing `needle` logged at or after `after` (and
    /// before `before`, if given).
    pub fn line(
        &self,
        needle: &str,
        after: SystemTime,
        before: Option<SystemTime>,
    ) -> Option<String> {
        self.find(needle, after, before)
            .map(|(_, line)| line.clone())
    }

    /// From the first line containing `from` between `after` and `before`
    /// to the first line containing `to` after that.
    pub fn span(
        &self,
        from: &str,
        to: &str,
        after: SystemTime,
        before: Option<SystemTime>,
    ) -> Option<Duration> {
        let began = self.first(from, after, before)?;
        let ended = self.first(to, began, None)?;
        ended.duration_since(began).ok()
    }

    pub fn count(&self, needle: &str) -> usize {
        self.lines
            .iter()
            .filter(|(_, line)| line.contains(needle))
            .count()
    }

    /// Seconds from the bench's start to `at`.
    pub fn secs(&self, at: SystemTime) -> f64 {
        at.duration_since(self.start)
            .map_or(0.0, |d| d.as_secs_f64())
    }
}

/// Lines of `log` containing `needle`.
pub fn count_lines(log: &[String], needle: &str) -> usize {
    log.iter().filter(|line| line.contains(needle)).count()
}
