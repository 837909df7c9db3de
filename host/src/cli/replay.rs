//! `acemq-host replay`: its arguments, and the exit code that gates a
//! deploy on the candidate ([`crate::replay`] does the replay).

use std::path::PathBuf;
use std::process::ExitCode;

use super::{Exit, with_broker_task};
use crate::replay::{self, ReplayRequest};

/// `replay`'s arguments as typed.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    #[arg(long, short)]
    config: PathBuf,
    /// The consumer's `consumer_name` (or its queue).
    #[arg(long)]
    consumer: String,
    /// The candidate plugin file.
    #[arg(long)]
    plugin: PathBuf,
    /// Where to start: `first`, an offset, a time, an interval (`1h`).
    #[arg(long, default_value = "first")]
    from: String,
    /// The last offset to read, or `last` (the default): whatever the
    /// stream holds.
    #[arg(long, default_value = "last", value_parser = parse_up_to)]
    to: UpTo,
    /// Run the consumer's current plugin too, and compare.
    #[arg(long)]
    compare: bool,
    /// With --compare: how many differing messages still exit 0.
    #[arg(long, default_value_t = 0)]
    max_diff: usize,
    /// How to read the stream: `auto`, `stream` or `amqp`. By default, as
    /// the consumer's `stream_protocol` says.
    #[arg(long, value_enum)]
    stream_protocol: Option<crate::config::StreamProtocol>,
}

/// `replay --to`: an offset, or `None` for the end of what the stream holds.
#[derive(Debug, Clone, Copy)]
struct UpTo(Option<u64>);

fn parse_up_to(text: &str) -> Result<UpTo, String> {
    match text.trim() {
        "last" => Ok(UpTo(None)),
        offset => offset
            .parse()
            .map(|n| UpTo(Some(n)))
            .map_err(|_| format!("{text:?} is neither an offset nor \"last\"")),
    }
}

pub fn run(args: ReplayArgs) -> ExitCode {
    let ReplayArgs {
        config,
        consumer,
        plugin,
        from,
        to,
        compare,
        max_diff,
        stream_protocol,
    } = args;
    let request = ReplayRequest {
        consumer,
        candidate: plugin,
        from,
        to: to.0,
        compare,
        stream_protocol,
    };
    with_broker_task(&config, |config| async move {
        let report = replay::replay(&config, &request).await?;
        print!("{}", report.table());
        // A candidate that faults, or differs more than allowed, is not
        // ready to go live: scripts can gate a deploy on this.
        let ready = report.faults() == 0 && (!request.compare || report.differing <= max_diff);
        Ok(match ready {
            true => Exit::Done.into(),
            false => Exit::NotReady.into(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_reads_up_to_an_offset_or_the_last_message() {
        assert_eq!(parse_up_to("last").unwrap().0, None);
        assert_eq!(parse_up_to("9999").unwrap().0, Some(9999));
        assert!(
            parse_up_to("soon")
                .unwrap_err()
                .contains("neither an offset nor \"last\"")
        );
    }
}
