//! What the fault tallies and the soak share: the stamp pipeline they run
//! the host on, inputs published with known ids, the outputs held against
//! them (lost, duplicated), the host's rate sampled from its `/metrics`,
//! and its timed log lines, from which a fault's effect and recovery are
//! read.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel, Confirmation};
use serde_json::Value;
use tokio::runtime::Runtime;

use crate::host::{free_port, http_get, metric_sum};
use crate::stamp::StampConfig;
use crate::{Broker, ReceivedMessage, median, unique_name};

/// The size of each input's JSON body.
pub const BODY_BYTES: usize = 1024;

/// Input `i`: a 1 KiB JSON body, message id `in-{i}`.
pub fn input(i: usize) -> (Vec<u8>, BasicProperties) {
    input_attempt(i, 0)
}

/// Input `i` as its producer publishes it the `attempt`-th time after the
/// first (0): the same message id, and above 0 the attempt in the body, so
/// that an input whose first publish landed although its producer could
/// not learn it (a connection lost before the confirm) and that was
/// published again is told from one the host handled twice ([`Tally`]).
pub fn input_attempt(i: usize, attempt: u32) -> (Vec<u8>, BasicProperties) {
    let head = match attempt {
        0 => format!(r#"{{"n":{i},"pad":""#),
        _ => format!(r#"{{"n":{i},"attempt":{attempt},"pad":""#),
    };
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
    /// Outputs of a publish of an input seen before (the stamp pipeline
    /// makes one output per input, with an id derived from the input's):
    /// the host handled that input again.
    pub duplicated: usize,
    /// Outputs of another publish of an input seen before
    /// ([`input_attempt`]): the producer published the input twice and both
    /// landed; not the host's doing.
    pub published_twice: usize,
    /// Inputs with at least one output.
    pub distinct: usize,
}

impl Tally {
    pub fn of(outputs: &[ReceivedMessage], inputs: usize) -> Self {
        let mut counter = OutputCounter::default();
        for output in outputs {
            counter.record(&output.body, false);
        }
        counter.tally(inputs)
    }
}

/// Outputs of the stamp pipeline counted as they are read, by the input
/// and the publish of it each names, in little memory (a byte per input),
/// for a run too long to keep its outputs.
#[derive(Debug, Default)]
pub struct OutputCounter {
    /// Outputs of input `n`'s first publish (attempt 0), at index `n`.
    first: Vec<u8>,
    /// Outputs of later publishes, by input and attempt (few: only inputs
    /// whose producer lost the confirm are published again).
    again: HashMap<(usize, u64), u32>,
    /// Outputs that name no input of the `in-{n}` form.
    pub unnamed: usize,
}

impl OutputCounter {
    /// Counts one output from its body; false if it was not counted: it
    /// names no input, or it came `redelivered` (read before, its ack lost
    /// with a connection) and its input's publish was counted already.
    ///
    /// That rule is exact but in one case nothing here creates: the host's
    /// second output of one publish delivered to the reader, then
    /// redelivered after a lost connection, before the reader saw it; a
    /// second copy is published after the loss that made it and read within
    /// moments, long before the next one.
    pub fn record(&mut self, body: &[u8], redelivered: bool) -> bool {
        let Some((n, attempt)) = input_of(body) else {
            self.unnamed += 1;
            return false;
        };
        if redelivered && self.copies(n, attempt) > 0 {
            return false;
        }
        if attempt == 0 {
            if self.first.len() <= n {
                self.first.resize(n + 1, 0);
            }
            self.first[n] = self.first[n].saturating_add(1);
        } else {
            *self.again.entry((n, attempt)).or_default() += 1;
        }
        true
    }

    fn copies(&self, n: usize, attempt: u64) -> u32 {
        match attempt {
            0 => self.first.get(n).copied().map_or(0, u32::from),
            _ => self.again.get(&(n, attempt)).copied().unwrap_or(0),
        }
    }

    /// The tally of inputs `in-0` to `in-{inputs - 1}`.
    pub fn tally(&self, inputs: usize) -> Tally {
        // Per input: the publishes of it seen, and the outputs of them.
        let mut publishes: HashMap<usize, (usize, u32)> = HashMap::new();
        for (n, &copies) in self.first.iter().enumerate() {
            if copies > 0 {
                publishes.insert(n, (1, u32::from(copies)));
            }
        }
        for (&(n, _), &copies) in &self.again {
            let entry = publishes.entry(n).or_default();
            entry.0 += 1;
            entry.1 += copies;
        }
        let lost = (0..inputs).filter(|n| !publishes.contains_key(n)).collect();
        let (mut duplicated, mut published_twice) = (0, 0);
        for (seen, copies) in publishes.values() {
            published_twice += seen - 1;
            duplicated += *copies as usize - seen;
        }
        Tally {
            lost,
            duplicated,
            published_twice,
            distinct: publishes.len(),
        }
    }
}

/// The input number and publish an output of the stamp pipeline names:
/// `n` of its `input_id` (`in-{n}`), the attempt from its input's body.
fn input_of(body: &[u8]) -> Option<(usize, u64)> {
    let body: Value = serde_json::from_slice(body).ok()?;
    let n = body["input_id"]
        .as_str()?
        .strip_prefix("in-")?
        .parse()
        .ok()?;
    let input = body["input"].as_str().unwrap_or_default();
    let attempt = serde_json::from_str::<Value>(input)
        .ok()
        .and_then(|input| input["attempt"].as_u64())
        .unwrap_or(0);
    Some((n, attempt))
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

/// The host's consumer settings in the tallied runs, spelt out in the
/// config because the duplicates' bound is made of them.
pub const PREFETCH: u16 = 100;
pub const CONCURRENCY: usize = 4;
/// Publishes the host keeps waiting for a confirm (its default).
pub const MAX_UNCONFIRMED: usize = 1000;

/// The queues, the exchange and the admin endpoint of one tallied run of
/// the stamp pipeline.
pub struct Pipeline {
    pub input: String,
    pub output: String,
    pub exchange: String,
    /// The host's admin endpoint, `127.0.0.1:PORT`.
    pub admin: String,
}

impl Pipeline {
    /// Fresh names, `{prefix}.in.*`, `{prefix}.out.*` and `{prefix}.x.*`.
    pub fn new(prefix: &str) -> Self {
        Self {
            input: unique_name(&format!("{prefix}.in")),
            output: unique_name(&format!("{prefix}.out")),
            exchange: unique_name(&format!("{prefix}.x")),
            admin: format!("127.0.0.1:{}", free_port()),
        }
    }

    /// The host's config: consume → stamp → confirmed publish, with
    /// [`PREFETCH`], [`CONCURRENCY`] and [`MAX_UNCONFIRMED`]. The output
    /// queue is a quorum queue too, so that a broker restart keeps its
    /// outputs. The host waits `network_recovery_interval = "1s"` before
    /// reconnecting, not the default 5 s, which would add 5 s to every
    /// recovery and hide the reconnecting itself; `recovery_backoff_max =
    /// "5s"` caps the waits while the broker's application is down.
    pub fn host_config(&self, broker: &Broker) -> String {
        let broker = format!(
            "url = \"{}\"\nnetwork_recovery_interval = \"1s\"\nrecovery_backoff_max = \"5s\"\nmax_unconfirmed = {MAX_UNCONFIRMED}",
            broker.amqp_url()
        );
        let host = format!("admin_listen = \"{}\"", self.admin);
        let consumer = format!("prefetch = {PREFETCH}\nconcurrency = {CONCURRENCY}");
        StampConfig {
            broker: &broker,
            host: &host,
            input_queue: "type = \"quorum\"\ndead_letter = true",
            output_queue: "type = \"quorum\"",
            consumer: &consumer,
            ..StampConfig::new(&self.input, &self.output, &self.exchange)
        }
        .toml()
    }

    /// The input's dead-letter queue.
    pub fn dlq(&self) -> String {
        format!("{}.dlq", self.input)
    }

    /// `GET path` of the host's admin endpoint; an error unless 200.
    pub fn admin_get(&self, path: &str) -> Result<String> {
        let (status, body) = http_get(&format!("http://{}{path}", self.admin))?;
        anyhow::ensure!(status == 200, "GET {path}: {status}: {body}");
        Ok(body)
    }

    /// Inputs the host has acked, from its `/metrics` text.
    pub fn acked(&self, metrics: &str) -> f64 {
        metric_sum(
            metrics,
            "acemq_consume_total",
            &[("queue", &self.input), ("outcome", "acked")],
        )
    }

    /// Waits until every input is handled: none ready or in flight, and at
    /// least `outputs()` (the outputs so far) as many as the `published`
    /// inputs (then a moment more for stragglers). Returns when, or `None`
    /// after `timeout`.
    pub fn wait_until_handled(
        &self,
        runtime: &Runtime,
        broker: &Broker,
        published: usize,
        outputs: impl Fn() -> Result<usize>,
        timeout: Duration,
    ) -> Result<Option<Instant>> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let ready = runtime.block_on(broker.message_count(&self.input))?;
            let metrics = self.admin_get("/metrics")?;
            let in_flight = metric_sum(
                &metrics,
                "acemq_consume_in_flight",
                &[("queue", &self.input)],
            );
            if ready == 0 && in_flight == 0.0 && outputs()? >= published {
                let done = Instant::now();
                // Duplicates, if any, arrive with the rest.
                std::thread::sleep(Duration::from_secs(1));
                return Ok(Some(done));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Ok(None)
    }
}

/// How often a [`Sampler`] reads the host's `/metrics`.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// The host's `/metrics` read every [`SAMPLE_EVERY`] on a thread of its
/// own: the inputs it acked over time.
pub struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Since the bench's start.
    pub at: Duration,
    /// Inputs acked so far.
    pub acked: f64,
}

impl Sampler {
    pub fn start(pipeline: &Pipeline, start: Instant) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let url = format!("http://{}/metrics", pipeline.admin);
        let input = pipeline.input.clone();
        let thread = std::thread::spawn({
            let (samples, stop) = (samples.clone(), stop.clone());
            move || {
                // On a fixed grid, so that a slow read does not shift the rest.
                let mut next = start;
                while !stop.load(Ordering::Relaxed) {
                    next += SAMPLE_EVERY;
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                    // A failed read is a gap in the timeline; whether the host
                    // stayed up is checked on the process itself.
                    if let Ok((200, body)) = http_get(&url) {
                        let acked = metric_sum(
                            &body,
                            "acemq_consume_total",
                            &[("queue", &input), ("outcome", "acked")],
                        );
                        let at = start.elapsed();
                        samples.lock().unwrap().push(Sample { at, acked });
                    }
                }
            }
        });
        Self {
            samples,
            stop,
            thread,
        }
    }

    /// The samples so far.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().unwrap().clone()
    }

    /// The host's usual rate among the samples taken within `during`
    /// (since the bench's start): the median of its rates over 1 s while it
    /// was handling inputs at all; 0 when none.
    pub fn usual_rate(&self, during: Range<Duration>) -> f64 {
        let samples: Vec<Sample> = self
            .samples()
            .into_iter()
            .filter(|sample| during.contains(&sample.at))
            .collect();
        let mut busy: Vec<f64> = per_second(&samples).filter(|rate| *rate > 0.0).collect();
        let rate = median(&mut busy);
        if rate.is_nan() { 0.0 } else { rate }
    }

    pub fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        self.samples.lock().unwrap().clone()
    }
}

/// Inputs acked per second over each 1 s window of `samples`.
pub fn per_second(samples: &[Sample]) -> impl Iterator<Item = f64> + '_ {
    let n = (Duration::from_secs(1).as_millis() / SAMPLE_EVERY.as_millis()) as usize;
    samples
        .windows(n + 1)
        .map(move |w| (w[n].acked - w[0].acked) / (w[n].at - w[0].at).as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::{OutputCounter, input_attempt};
    use serde_json::json;

    /// What `stamp-v1` makes of input `n`'s `attempt`-th publish.
    fn output(n: usize, attempt: u32) -> Vec<u8> {
        let (body, _) = input_attempt(n, attempt);
        let input = String::from_utf8(body).unwrap();
        serde_json::to_vec(&json!({"input": input, "version": "v1", "input_id": format!("in-{n}")}))
            .unwrap()
    }

    #[test]
    fn outputs_are_held_against_their_inputs_and_publishes() {
        let mut counter = OutputCounter::default();
        for body in [
            output(0, 0),
            output(1, 0),
            output(1, 0), // the host handled in-1 again
            output(3, 0),
            output(3, 1), // the producer published in-3 again, both landed
            output(4, 2), // in-4 landed on its third publish only
        ] {
            assert!(counter.record(&body, false));
        }
        assert!(!counter.record(b"{\"input_id\":\"other\"}", false));
        let tally = counter.tally(5);
        assert_eq!(tally.lost, vec![2]);
        assert_eq!(tally.duplicated, 1);
        assert_eq!(tally.published_twice, 1);
        assert_eq!(tally.distinct, 4);
        assert_eq!(counter.unnamed, 1);
    }

    #[test]
    fn a_redelivered_output_counts_only_if_its_publish_was_not_seen() {
        let mut counter = OutputCounter::default();
        assert!(counter.record(&output(0, 0), false));
        // Its ack was lost with the connection: read again, not counted.
        assert!(!counter.record(&output(0, 0), true));
        // Read for the first time only after the loss: counted.
        assert!(counter.record(&output(1, 0), true));
        assert!(counter.record(&output(1, 1), true));
        let tally = counter.tally(2);
        assert!(tally.lost.is_empty());
        assert_eq!((tally.duplicated, tally.published_twice), (0, 1));
    }

    #[test]
    fn the_first_publish_keeps_the_body_it_always_had() {
        let (body, properties) = input_attempt(7, 0);
        assert_eq!(body.len(), super::BODY_BYTES);
        assert!(body.starts_with(br#"{"n":7,"pad":"x"#));
        assert_eq!(properties.message_id().as_ref().unwrap().as_str(), "in-7");
        let (again, _) = input_attempt(7, 2);
        assert_eq!(again.len(), super::BODY_BYTES);
        assert!(again.starts_with(br#"{"n":7,"attempt":2,"pad":"#));
    }
}
