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
    let broker = match &checkpoint {
        Checkpoint::File(_) => None,
        Checkpoint::Broker(_) => Some(app::connect_once(config, "reset").await?),
    };
    let result = checkpoint
        .reset(broker.as_ref().map(OneOff::connection), to)
        .await;
    if let Some(broker) = broker {
        broker.close("checkpoint reset").await;
    }
    result.map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(format!(
        "the checkpoint of '{consumer_name}' (queue '{}') now says: {to}",
        consumer.queue.get_ref()
    ))
}
