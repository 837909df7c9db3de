//! `acemq-host stream reset`: moves a stopped stream consumer's checkpoint.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use super::{Exit, with_broker_task};
use crate::app;
use crate::broker::OneOff;
use crate::broker::checkpoint::Checkpoint;
use crate::broker::stream::StreamOffset;
use crate::config::LoadedConfig;

#[derive(Debug, Subcommand)]
pub enum StreamCommand {
    /// Move a stopped stream consumer's checkpoint: it resumes from there.
    Reset {
        #[arg(long, short)]
        config: PathBuf,
        /// The consumer's `consumer_name`.
        #[arg(long)]
        consumer: String,
        /// `first`, `last`, `next`, an offset, an RFC 3339 time or an
        /// interval back from now (`1h`).
        #[arg(long)]
        to: String,
    },
}

pub fn run(command: StreamCommand) -> ExitCode {
    let StreamCommand::Reset {
        config,
        consumer,
        to,
    } = command;
    with_broker_task(&config, |config| async move {
        println!("{}", reset_checkpoint(&config, &consumer, &to).await?);
        Ok(Exit::Done.into())
    })
}

/// `acemq-host stream reset`: moves the checkpoint of the stream consumer
/// named `consumer_name` to `to` (`first`, `last`, `next`, an offset, a
/// time). Meant for a stopped consumer: a running host overwrites the
/// checkpoint at its next save. Returns what was done, for the operator.
async fn reset_checkpoint(
    config: &LoadedConfig,
    consumer_name: &str,
    to: &str,
) -> anyhow::Result<String> {
    StreamOffset::parse_position(to).map_err(|e| anyhow::anyhow!("--to: {e}"))?;
    let consumers = &config.config.consumers;
    let Some((index, consumer)) = consumers
        .iter()
        .enumerate()
        .find(|(_, c)| c.consumer_name.as_deref() == Some(consumer_name))
    else {
        let names: Vec<&str> = consumers
            .iter()
            .filter_map(|c| c.consumer_name.as_deref())
            .collect();
        anyhow::bail!(
            "{}: no consumer is named '{consumer_name}' (named consumers: {})",
            config.path.display(),
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        );
    };
    let Some(checkpoint) = app::stream_checkpoint(config, index, consumer, true)? else {
        anyhow::bail!("the consumer '{consumer_name}' keeps no checkpoint (checkpoint = \"none\")");
    };
    // On the stream protocol the broker's offset tracking is the checkpoint
    // (and the configured one is read only while it holds nothing): both
    // move, so the consumer resumes at `to` whichever way it reads next.
    let tracked = match consumer.stream_protocol {
        crate::config::StreamProtocol::Amqp => None,
        _ => reset_tracked_offset(config, consumer, consumer_name, &checkpoint, to).await?,
    };
    let broker = match &checkpoint {
        Checkpoint::Broker(_) => Some(app::connect_once(config, "reset").await?),
        Checkpoint::File(_) | Checkpoint::Tracked(_) => None,
    };
    let result = checkpoint
        .reset(broker.as_ref().map(OneOff::connection), to)
        .await;
    if let Some(broker) = broker {
        broker.close("checkpoint reset").await;
    }
    result.map_err(|e| anyhow::anyhow!("{e}"))?;
    let tracked = match tracked {
        Some(offset) => format!("; the broker's offset tracking holds {offset}"),
        None => String::new(),
    };
    Ok(format!(
        "the checkpoint of '{consumer_name}' (queue '{}') now says: {to}{tracked}",
        consumer.queue.get_ref()
    ))
}

/// Moves the broker's offset tracking of `consumer_name` to `to`, when the
/// broker offers the stream protocol; the offset stored, or `None` when it
/// does not. A position that is not an offset is resolved first: `first`
/// is 0, `last` the newest offset and `next` one past it; a time cannot be
/// resolved without reading the stream, and is refused.
async fn reset_tracked_offset(
    config: &LoadedConfig,
    consumer: &crate::config::ConsumerConfig,
    consumer_name: &str,
    checkpoint: &Checkpoint,
    to: &str,
) -> anyhow::Result<Option<u64>> {
    use crate::broker::stream_protocol::{probe, tracking::TrackedCheckpoint};
    let app::StreamOffer::Answered(endpoints) = app::stream_offer(config).await? else {
        return Ok(None);
    };
    let stream = consumer.queue.get_ref();
    let newest = || async {
        probe::newest_offset(&endpoints, stream)
            .await
            .map_err(|why| anyhow::anyhow!("{why}"))
    };
    let offset = match StreamOffset::parse_position(to).map_err(|e| anyhow::anyhow!("--to: {e}"))? {
        StreamOffset::At(offset) => offset,
        StreamOffset::First => 0,
        StreamOffset::Last => newest().await?.unwrap_or(0),
        StreamOffset::Next => newest().await?.map_or(0, |newest| newest + 1),
        StreamOffset::Since(_) | StreamOffset::Ago(_) => anyhow::bail!(
            "--to: the broker's offset tracking holds an offset number, and a time cannot be turned into one without reading the stream: give an offset, first, last or next (`acemq-host replay --from TIME --to last` shows the offsets of that time)"
        ),
    };
    let tracked =
        TrackedCheckpoint::new(consumer_name, stream, endpoints, checkpoint.cadence(), None);
    let stored = tracked.reset(&offset.to_string()).await;
    tracked.close().await;
    stored.map_err(|e| anyhow::anyhow!("moving the broker's offset tracking: {e}"))?;
    Ok(Some(offset))
}
