//! What each `dlq` command does with the messages of a set-aside queue,
//! over one pass of the broker's peek/take reading
//! ([`crate::broker::set_aside`]): what is listed, shown, moved or purged,
//! and what stays.
//!
//! A replay publishes each copy with confirms and `mandatory` through the
//! host's publisher and acknowledges the original only after the confirm,
//! one message at a time, so a replay killed half-way leaves at most the one
//! message in flight in both queues (at-least-once, as the contract's
//! "publish, then ack").

use anyhow::anyhow;
use bytes::Bytes;
use lapin::message::Delivery;

use super::filter::Filters;
use super::format::{self, Row};
use super::message::SetAside;
use super::progress::Progress;
use super::summary::{Action, Summary};
use super::{Selection, Target};
use crate::broker::publisher::Publication;
use crate::broker::set_aside::{self, Pass};
use crate::broker::{OneOff, PublishError, PublishSettings, Publisher};
use crate::config::LoadedConfig;
use crate::envelope::{self, Envelope, check_frame, replay_properties};

/// The command's connection, and how many messages its set-aside queue
/// holds now (the bound of its pass).
async fn open(config: &LoadedConfig, target: &Target) -> anyhow::Result<(OneOff, usize)> {
    let broker = crate::app::connect_once(config, "dlq").await?;
    let queue = &target.set_aside;
    let total = set_aside::ready(&broker, queue).await.map_err(|e| {
        anyhow!(
            "the queue '{queue}' cannot be read: {e} (a host running this config \
             declares it when the consumer's queue has dead_letter = true)"
        )
    })?;
    Ok((broker, total))
}

/// `dlq list`: one row per matching message, at most `selection.limit`,
/// and how many messages the queue held; nothing is consumed.
pub async fn list(
    config: &LoadedConfig,
    target: &Target,
    selection: &Selection,
) -> anyhow::Result<(Vec<Row>, usize)> {
    let (broker, total) = open(config, target).await?;
    let mut pass = Pass::open(&broker, &target.set_aside, total).await?;
    let mut rows = Vec::new();
    let result = async {
        while selection.limit.is_none_or(|limit| rows.len() < limit) {
            let Some(delivery) = pass.next().await? else {
                break;
            };
            pass.hold(&delivery);
            let message = SetAside::read(&delivery.properties, &target.source, envelope::now_ms());
            if selection.filters.matches(&message) {
                rows.push(Row {
                    position: pass.position(),
                    message,
                });
            }
        }
        anyhow::Ok(())
    }
    .await;
    pass.finish().await;
    broker.close("done").await;
    result.map(|()| (rows, total))
}

/// Which message `dlq show` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shown {
    /// The first with this envelope id.
    Id(String),
    /// The one at this position, 1 for the head (as `list` numbers them).
    Position(usize),
}

/// `dlq show`: the page of one message, at most `max_body_bytes` of its
/// body; nothing is consumed.
pub async fn show(
    config: &LoadedConfig,
    target: &Target,
    which: &Shown,
    max_body_bytes: usize,
) -> anyhow::Result<String> {
    let (broker, total) = open(config, target).await?;
    let bound = match which {
        Shown::Id(_) => total,
        Shown::Position(position) => (*position).min(total),
    };
    let mut pass = Pass::open(&broker, &target.set_aside, bound).await?;
    let result = async {
        while let Some(delivery) = pass.next().await? {
            pass.hold(&delivery);
            let now = envelope::now_ms();
            let found = match which {
                Shown::Id(id) => {
                    SetAside::read(&delivery.properties, &target.source, now).id == *id
                }
                Shown::Position(position) => pass.position() == *position,
            };
            if found {
                return Ok(format::show(
                    pass.position(),
                    &target.set_aside,
                    &delivery.properties,
                    &delivery.data,
                    max_body_bytes,
                    &target.source,
                    now,
                ));
            }
        }
        Err(match which {
            Shown::Id(id) => anyhow!(
                "no message with id '{id}' among the {total} messages of '{}'",
                target.set_aside
            ),
            Shown::Position(position) => anyhow!(
                "'{}' holds {total} messages, so there is no message {position}",
                target.set_aside
            ),
        })
    }
    .await;
    pass.finish().await;
    broker.close("done").await;
    result
}

/// `dlq replay`: moves the matching messages of `target.set_aside` back to
/// `target.source`, stamped ([`replay_properties`]), each confirmed before
/// its original is acknowledged.
pub async fn replay(
    config: &LoadedConfig,
    target: &Target,
    selection: &Selection,
) -> anyhow::Result<Summary> {
    let (broker, total) = open(config, target).await?;
    let mover = Mover {
        // One copy in flight at a time (see the module's comment).
        publisher: (!selection.dry_run).then(|| {
            broker.publisher(PublishSettings {
                max_unconfirmed: 1,
                confirm_timeout: config.config.broker.confirm_timeout,
            })
        }),
        target,
    };
    let summary = Summary::new(
        Action::Replay,
        selection.dry_run,
        &target.set_aside,
        &target.source,
    );
    let mut run = SummarizedPass::open(&broker, target, total, summary).await?;
    let result = async {
        while selection
            .limit
            .is_none_or(|limit| run.summary.done + run.summary.failed < limit)
        {
            let Some(delivery) = run.pass.next().await? else {
                break;
            };
            let now = envelope::now_ms();
            let envelope = Envelope::read(&delivery.properties, &target.source, now);
            let message = SetAside::of(&envelope, &delivery.properties);
            if run.left_alone(selection, &message, &delivery) {
                continue;
            }
            let moved = mover.publish(&delivery, &envelope, now).await;
            run.moved(&delivery, &message, moved).await?;
        }
        anyhow::Ok(())
    }
    .await;
    Ok(run.finish(result, broker).await)
}

/// `dlq purge`: removes the matching messages (at most `selection.limit`)
/// for good, or with `dry_run` counts what it would remove. With neither a
/// filter nor a limit nor a dry run, the queue is purged in one
/// `queue.purge`.
pub async fn purge(
    config: &LoadedConfig,
    target: &Target,
    selection: &Selection,
) -> anyhow::Result<Summary> {
    let (broker, total) = open(config, target).await?;
    let mut summary = Summary::new(
        Action::Purge,
        selection.dry_run,
        &target.set_aside,
        &target.source,
    );
    if everything(selection) {
        let purged = set_aside::purge(&broker, &target.set_aside)
            .await
            .map_err(|e| anyhow!(e).context(format!("purging '{}'", target.set_aside)))?;
        summary.examined = purged as usize;
        summary.done = purged as usize;
        broker.close("done").await;
        return Ok(summary);
    }
    let mut run = SummarizedPass::open(&broker, target, total, summary).await?;
    let result = async {
        while selection.limit.is_none_or(|limit| run.summary.done < limit) {
            let Some(delivery) = run.pass.next().await? else {
                break;
            };
            let message = SetAside::read(&delivery.properties, &target.source, envelope::now_ms());
            if run.left_alone(selection, &message, &delivery) {
                continue;
            }
            run.pass.take(&delivery).await?;
            run.summary.done += 1;
            run.progress.update(&run.summary);
        }
        anyhow::Ok(())
    }
    .await;
    Ok(run.finish(result, broker).await)
}

/// Whether a purge takes the whole queue, so `queue.purge` can do it.
fn everything(selection: &Selection) -> bool {
    selection.filters == Filters::default() && selection.limit.is_none() && !selection.dry_run
}

/// The pass of a `replay` or `purge`, counted in its summary as it goes,
/// with progress on stderr.
struct SummarizedPass {
    pass: Pass,
    summary: Summary,
    progress: Progress,
}

impl SummarizedPass {
    async fn open(
        broker: &OneOff,
        target: &Target,
        total: usize,
        summary: Summary,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            pass: Pass::open(broker, &target.set_aside, total).await?,
            summary,
            progress: Progress::new(total),
        })
    }

    /// Counts a message examined, and holds it (counted) when the filters
    /// skip it or the run is dry; false when it is to be acted on.
    fn left_alone(
        &mut self,
        selection: &Selection,
        message: &SetAside,
        delivery: &Delivery,
    ) -> bool {
        self.summary.examined += 1;
        let counted = if !selection.filters.matches(message) {
            &mut self.summary.skipped
        } else if selection.dry_run {
            &mut self.summary.done
        } else {
            return false;
        };
        *counted += 1;
        self.pass.hold(delivery);
        self.progress.update(&self.summary);
        true
    }

    /// Takes the original of a copy moved; holds it when the copy was not.
    /// A broken publisher stops the replay.
    async fn moved(
        &mut self,
        delivery: &Delivery,
        message: &SetAside,
        moved: Result<(), NotMoved>,
    ) -> anyhow::Result<()> {
        let stop = match moved {
            Ok(()) => {
                self.pass.take(delivery).await?;
                self.summary.done += 1;
                None
            }
            Err(NotMoved::Failed(reason)) => {
                self.pass.hold(delivery);
                self.summary.fail(format!("{}: {reason}", message.id));
                None
            }
            Err(NotMoved::Broken(reason)) => {
                self.pass.hold(delivery);
                self.summary.fail(format!("{}: {reason}", message.id));
                Some(reason)
            }
        };
        self.progress.update(&self.summary);
        match stop {
            Some(reason) => Err(anyhow!("{reason}")),
            None => Ok(()),
        }
    }

    /// Ends the run: the progress, why it stopped early (if it did), the
    /// held messages requeued, the connection closed.
    async fn finish(mut self, result: anyhow::Result<()>, broker: OneOff) -> Summary {
        self.progress.finish(&self.summary);
        if let Err(e) = result {
            self.summary.stopped = Some(format!("{e:#}"));
        }
        self.pass.finish().await;
        broker.close("done").await;
        self.summary
    }
}

/// Why one message was not moved.
enum NotMoved {
    /// The broker returned or refused the copy: the original stays, and
    /// the replay goes on with the next message.
    Failed(String),
    /// The publishing channel or the connection cannot be trusted any more:
    /// the replay stops (the original stays too).
    Broken(String),
}

/// Publishes replay copies, one at a time, each confirmed.
struct Mover<'a> {
    /// None for a dry run.
    publisher: Option<Publisher>,
    target: &'a Target,
}

impl Mover<'_> {
    async fn publish(
        &self,
        delivery: &Delivery,
        envelope: &Envelope,
        now_ms: u64,
    ) -> Result<(), NotMoved> {
        let publisher = self
            .publisher
            .as_ref()
            .ok_or_else(|| NotMoved::Broken("no publishing channel".into()))?;
        let source = self.target.source.as_str();
        let properties = replay_properties(
            &delivery.properties,
            envelope,
            &self.target.set_aside,
            now_ms,
        );
        // Headers too big for a frame would close the whole connection.
        if let Err(too_big) = check_frame(&properties, publisher.frame_max()) {
            return Err(NotMoved::Failed(format!(
                "its properties take {} bytes with the replay stamps, more than the broker's frame of {} bytes",
                too_big.size, too_big.frame_max
            )));
        }
        // Through the default exchange, by the queue's name (contract §11).
        let copy = Publication {
            exchange: String::new(),
            routing_key: source.to_owned(),
            body: Bytes::copy_from_slice(&delivery.data),
            properties,
            mandatory: true,
        };
        publisher.publish(&copy).await.map_err(|e| match e {
            // RabbitMQ returns a mandatory message for one reason: no queue
            // took it.
            PublishError::Unroutable { .. } => NotMoved::Failed(format!(
                "the broker returned it (312 NO_ROUTE): is the queue '{source}' declared?"
            )),
            PublishError::Refused { .. } => NotMoved::Failed(
                "the broker refused to confirm the copy, so it must be treated as not sent".into(),
            ),
            // Unconfirmed, the copy may still land: the original is
            // requeued, so at worst it is in both queues, never in neither.
            broken => NotMoved::Broken(broken.to_string()),
        })
    }
}
