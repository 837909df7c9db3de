//! Shadow replay: read a stream's history through a candidate plugin before
//! it goes live (`acemq-host replay`), and, with `--compare`, through the
//! version that runs now as well, to see where the two part ways.
//!
//! Nothing is published and no checkpoint moves: the plugins' outputs are
//! captured and compared, never sent, and the stream is read under a
//! consumer tag of its own. The stream is read from `--from` (default
//! `first`) until `--to` (an offset, inclusive) or until nothing new has
//! arrived for a moment (the end of what the stream holds).
//!
//! Each message goes through the plugins as production runs them: decoded
//! by the config's `[[codecs]]` before the handler sees it, the outputs
//! encoded after, so the candidate is judged on the bodies it will get.
//! Times and fuel are summarized in fixed-size histograms
//! ([`Histogram`]): a replay of millions of messages holds no
//! figure per message.

pub use crate::telemetry::histogram::Histogram;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::broker::stream::StreamOffset;
use crate::broker::stream_read::{StoredMessage, StreamRead};
use crate::config::{ConsumerConfig, LoadedConfig, StreamProtocol};
use crate::delivery;
use crate::envelope::{self, Envelope};
use crate::plugin::{CodecSet, HandlerSlot, HandlerVersion, PluginEngine};
use crate::rollout::decision::Decision;

/// How long the stream may stay silent before the replay counts it read.
const QUIET_END: Duration = Duration::from_secs(2);
/// Differing messages shown in the report.
const EXAMPLES: usize = 5;

/// What to replay.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    /// The stream consumer's `consumer_name`, or its queue.
    pub consumer: String,
    pub candidate: PathBuf,
    pub from: String,
    pub to: Option<u64>,
    pub compare: bool,
    /// How to read the stream; `None`: as the consumer's `stream_protocol`
    /// says.
    pub stream_protocol: Option<StreamProtocol>,
}

/// What a replay found.
#[derive(Debug, Default)]
pub struct ReplayReport {
    pub read: usize,
    /// The candidate's outcomes, by word.
    pub candidate: BTreeMap<String, usize>,
    /// The running version's outcomes, with `--compare`.
    pub current: BTreeMap<String, usize>,
    /// Messages whose outcome, reason or outputs differ, with `--compare`
    /// (compared as a live shadow compares them: `rollout::decision`).
    pub differing: usize,
    /// The first few of them: offset, and how they differ.
    pub examples: Vec<(u64, String)>,
    /// The candidate's time per message, in microseconds.
    pub candidate_micros: Histogram,
    /// The candidate's fuel per message, when `[host] fuel_metering` is on.
    pub candidate_fuel: Histogram,
}

impl ReplayReport {
    /// The candidate faulted on at least one message.
    pub fn faults(&self) -> usize {
        self.candidate
            .iter()
            .filter(|(word, _)| word.starts_with("fault"))
            .map(|(_, n)| n)
            .sum()
    }

    /// The report as the command prints it.
    pub fn table(&self) -> String {
        let mut out = format!("messages read: {}\n", self.read);
        let times = &self.candidate_micros;
        let at = |q| times.quantile(q).unwrap_or(0);
        out.push_str(&format!(
            "candidate, median time per message: {} µs (p99 {} µs, max {} µs)\n",
            at(0.5),
            at(0.99),
            times.max().unwrap_or(0)
        ));
        if let Some(median) = self.candidate_fuel.quantile(0.5) {
            out.push_str(&format!("candidate, median fuel per message: {median}\n"));
        }
        let words: std::collections::BTreeSet<&String> =
            self.candidate.keys().chain(self.current.keys()).collect();
        out.push_str(&format!(
            "{:<24} {:>10} {:>10}\n",
            "outcome", "candidate", "current"
        ));
        for word in words {
            let current = if self.current.is_empty() {
                "-".to_string()
            } else {
                self.current.get(word).copied().unwrap_or(0).to_string()
            };
            out.push_str(&format!(
                "{:<24} {:>10} {:>10}\n",
                word,
                self.candidate.get(word).copied().unwrap_or(0),
                current
            ));
        }
        if !self.current.is_empty() {
            out.push_str(&format!("differing: {} of {}\n", self.differing, self.read));
            for (offset, how) in &self.examples {
                out.push_str(&format!("  offset {offset}: {how}\n"));
            }
        }
        out
    }
}

/// Replays the stream of `request.consumer` as configured in `config`.
pub async fn replay(
    config: &LoadedConfig,
    request: &ReplayRequest,
) -> anyhow::Result<ReplayReport> {
    let consumer = consumer_of(config, &request.consumer)?;
    let from =
        StreamOffset::parse_position(&request.from).map_err(|e| anyhow::anyhow!("--from: {e}"))?;
    let plugins = Plugins::load(config, consumer, request)?;
    let stream = consumer.queue.get_ref();
    let setting = request.stream_protocol.unwrap_or(consumer.stream_protocol);
    if let Some(endpoints) = stream_protocol_endpoints(config, setting).await? {
        let read = StreamRead::open_stream_protocol(&endpoints, stream, from, "replay").await?;
        return read_through(read, &plugins, request.to).await;
    }
    let broker = crate::app::connect_once(config, "replay").await?;
    let read = StreamRead::open(&broker, stream, from, 100, "acemq-host.replay").await;
    let report = match read {
        Ok(read) => read_through(read, &plugins, request.to).await,
        Err(e) => Err(e),
    };
    broker.close("replay done").await;
    report
}

/// The stream listeners to replay through, or `None` to read over AMQP
/// 0-9-1, as `setting` asks; the choice is logged, as a host's is.
async fn stream_protocol_endpoints(
    config: &LoadedConfig,
    setting: StreamProtocol,
) -> anyhow::Result<Option<Arc<crate::broker::stream_protocol::StreamEndpoints>>> {
    if setting == StreamProtocol::Amqp {
        return Ok(None);
    }
    use crate::app::StreamOffer;
    match crate::app::stream_offer(config).await? {
        StreamOffer::Answered(endpoints) => {
            tracing::info!(protocol = "stream", listener = %endpoints.shown(), "replaying over the stream protocol");
            Ok(Some(endpoints))
        }
        StreamOffer::Silent(_, why) | StreamOffer::Unusable(why)
            if setting == StreamProtocol::Stream =>
        {
            anyhow::bail!("the stream protocol was asked for, but {why}")
        }
        StreamOffer::Silent(_, why) | StreamOffer::Unusable(why) => {
            tracing::info!(protocol = "amqp", reason = %why, "replaying over AMQP 0-9-1: the stream protocol is not available");
            Ok(None)
        }
    }
}

/// The consumer named `name`, or reading the queue `name`.
fn consumer_of<'a>(config: &'a LoadedConfig, name: &str) -> anyhow::Result<&'a ConsumerConfig> {
    config
        .config
        .consumers
        .iter()
        .find(|c| c.consumer_name.as_deref() == Some(name) || c.queue.get_ref() == name)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{}: no consumer is named '{name}' or reads a queue of that name",
                config.path.display(),
            )
        })
}

/// Reads the stream up to offset `to` (inclusive), or to its quiet end,
/// running each message through the plugins.
async fn read_through(
    mut read: StreamRead,
    plugins: &Plugins,
    to: Option<u64>,
) -> anyhow::Result<ReplayReport> {
    let mut report = ReplayReport::default();
    let progress = Progress::new();
    while let Some(next) = read.next(QUIET_END).await? {
        let offset = next.offset;
        if to.is_some_and(|to| offset > to) {
            break;
        }
        plugins.run(&next, offset, &mut report).await;
        report.read += 1;
        progress.read(report.read, offset);
        if to == Some(offset) {
            break;
        }
    }
    progress.done(report.read);
    read.close().await;
    Ok(report)
}

/// The plugins a replay runs, as production would run them.
struct Plugins {
    candidate: HandlerSlot,
    /// The consumer's running version, with `--compare`.
    current: Option<HandlerSlot>,
    /// The codecs production decodes and encodes with: without them the
    /// candidate would see bodies it never sees live.
    codecs: Arc<CodecSet>,
    /// Kept for as long as its plugins run.
    _engine: PluginEngine,
}

impl Plugins {
    fn load(
        config: &LoadedConfig,
        consumer: &ConsumerConfig,
        request: &ReplayRequest,
    ) -> anyhow::Result<Self> {
        let engine = PluginEngine::new(crate::app::engine_settings(config))?;
        let context = crate::app::consumer_context(consumer, &config.config.scheduler, None);
        let candidate = HandlerSlot::new(HandlerVersion::load(
            &engine,
            &request.candidate,
            context.clone(),
        )?);
        let current = match request.compare {
            true => Some(HandlerSlot::new(HandlerVersion::load(
                &engine,
                &config.resolve(consumer.plugin.get_ref()),
                context,
            )?)),
            false => None,
        };
        let codecs = Arc::new(crate::app::load_codecs(config, &engine)?);
        Ok(Self {
            candidate,
            current,
            codecs,
            _engine: engine,
        })
    }

    /// Runs one message through the candidate (timed), and through the
    /// current version to compare, into `report`.
    async fn run(&self, next: &StoredMessage, offset: u64, report: &mut ReplayReport) {
        let envelope = Arc::new(Envelope::read(
            &next.properties,
            next.routing_key.as_str(),
            envelope::now_ms(),
        ));
        let body = next.body.clone();
        let properties = Arc::new(next.properties.clone());
        let input = |body: Bytes| {
            delivery::handler_input(
                envelope.clone(),
                properties.clone(),
                next.exchange.as_str(),
                next.routing_key.as_str(),
                next.redelivered,
                body,
            )
        };
        let started = Instant::now();
        let candidate_run =
            delivery::run_plugins(&self.candidate, &self.codecs, input(body.clone())).await;
        let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        report.candidate_micros.record(took);
        if let Some(fuel) = candidate_run.fuel() {
            report.candidate_fuel.record(fuel);
        }
        let candidate_seen = candidate_run.decision();
        *report
            .candidate
            .entry(candidate_seen.word.clone())
            .or_default() += 1;
        if let Some(current) = &self.current {
            let current_seen = delivery::run_plugins(current, &self.codecs, input(body))
                .await
                .decision();
            report.compare(offset, &current_seen, &candidate_seen);
        }
    }
}

impl ReplayReport {
    /// Counts the current version's outcome, and a difference from the
    /// candidate's (the first few as examples).
    fn compare(&mut self, offset: u64, current: &Decision, candidate: &Decision) {
        *self.current.entry(current.word.clone()).or_default() += 1;
        if !current.same_as(candidate) {
            self.differing += 1;
            if self.examples.len() < EXAMPLES {
                self.examples.push((offset, current.difference(candidate)));
            }
        }
    }
}

/// Progress on stderr: a spinner with the count on a terminal, a plain line
/// every thousand messages otherwise (a log keeps every line of it).
struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    fn new() -> Self {
        use std::io::IsTerminal as _;
        Self(std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} {pos} messages read, {per_sec} {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            bar
        }))
    }

    fn read(&self, count: usize, offset: u64) {
        match &self.0 {
            Some(bar) => {
                bar.set_position(count as u64);
                bar.set_message(format!("(offset {offset})"));
            }
            None if count.is_multiple_of(1000) => {
                eprintln!("replay: {count} messages read (offset {offset})")
            }
            None => {}
        }
    }

    fn done(&self, count: usize) {
        match &self.0 {
            Some(bar) => bar.finish_with_message("done"),
            None => eprintln!("replay: {count} messages read in all"),
        }
    }
}
