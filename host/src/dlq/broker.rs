//! The broker side of `acemq-host dlq`: peeking, moving and purging the
//! messages of a set-aside queue over one connection.
//!
//! Every command reads with `basic.get` in one [`Pass`]: a message is either
//! taken (acknowledged, once it is safely elsewhere or purged) or held
//! (left unacknowledged until the pass ends, then requeued all at once). A
//! held message is not handed out again, so a pass never meets the same
//! message twice, and it is bounded by the queue's count at its start, so
//! messages set aside while it runs (a replayed message failing again)
//! wait for the next run instead of going round in a loop. Requeued
//! messages go back to where they stood in the (classic) set-aside queue,
//! so a `list` or a filtered `replay` leaves the others in their order.
//!
//! If the command dies, the broker requeues whatever it held: nothing is
//! lost. A replay publishes each message with confirms and `mandatory` and
//! acknowledges the original only after the confirm, one message at a time,
//! so a replay killed half-way leaves at most the one message in flight in
//! both queues (at-least-once, as the contract's "publish, then ack").

use std::time::Duration;

use anyhow::{Context as _, anyhow};
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Confirmation, Connection};

use super::filter::Filters;
use super::format::{self, Row};
use super::message::SetAside;
use super::progress::Progress;
use super::summary::{Action, Summary};
use super::{Selection, Target};
use crate::config::LoadedConfig;
use crate::envelope::{self, Envelope, check_frame, replay_properties};

/// The connection of one command and the channel it reads on.
struct Session {
    connection: Connection,
    channel: Channel,
}

impl Session {
    async fn open(config: &LoadedConfig) -> anyhow::Result<Self> {
        let connection = crate::app::connect_once(config, "dlq").await?;
        let channel = connection.create_channel().await?;
        Ok(Self {
            connection,
            channel,
        })
    }

    /// Messages ready in `queue` now. A passive declare of a missing queue
    /// closes its channel, so it gets one of its own.
    async fn ready(&self, queue: &str) -> anyhow::Result<usize> {
        let channel = self.connection.create_channel().await?;
        let declared = channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                anyhow!(
                    "the queue '{queue}' cannot be read: {e} (a host running this config \
                     declares it when the consumer's queue has dead_letter = true)"
                )
            })?;
        let _ = channel.close(200, "counted".into()).await;
        Ok(declared.message_count() as usize)
    }

    async fn close(self) {
        let _ = self.channel.close(200, "done".into()).await;
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// One pass over the messages a queue held when it started (see the
/// module's comment).
struct Pass<'a> {
    channel: &'a Channel,
    queue: &'a str,
    remaining: usize,
    /// Position of the last message got, 1 for the queue's head.
    position: usize,
    /// The highest delivery tag held: one `basic.nack` with `multiple`
    /// requeues them all, since every message not held has been acked.
    held: Option<u64>,
}

impl<'a> Pass<'a> {
    fn new(channel: &'a Channel, queue: &'a str, bound: usize) -> Self {
        Self {
            channel,
            queue,
            remaining: bound,
            position: 0,
            held: None,
        }
    }

    /// The next message, or `None` once the bound is reached or the queue
    /// has nothing more to hand out.
    async fn next(&mut self) -> anyhow::Result<Option<lapin::message::Delivery>> {
        if self.remaining == 0 {
            return Ok(None);
        }
        self.remaining -= 1;
        let got = self
            .channel
            .basic_get(self.queue.into(), BasicGetOptions { no_ack: false })
            .await
            .with_context(|| format!("reading the queue '{}'", self.queue))?;
        Ok(got.map(|got| {
            self.position += 1;
            got.delivery
        }))
    }

    /// Leaves the message to be requeued when the pass ends.
    fn hold(&mut self, delivery: &lapin::message::Delivery) {
        self.held = Some(delivery.delivery_tag);
    }

    /// Removes the message from the queue.
    async fn take(&self, delivery: &lapin::message::Delivery) -> anyhow::Result<()> {
        self.channel
            .basic_ack(delivery.delivery_tag, BasicAckOptions::default())
            .await
            .with_context(|| format!("acknowledging a message of '{}'", self.queue))
    }

    /// Requeues every message held. Should this fail, the broker requeues
    /// them anyway when the channel or connection closes.
    async fn put_back(&mut self) {
        if let Some(tag) = self.held.take() {
            let requeue = BasicNackOptions {
                multiple: true,
                requeue: true,
            };
            if let Err(e) = self.channel.basic_nack(tag, requeue).await {
                tracing::warn!(
                    queue = self.queue,
                    "requeueing held messages: {e}; the broker requeues them when the connection closes"
                );
            }
        }
    }
}

/// `dlq list`: one row per matching message, at most `selection.limit`,
/// and how many messages the queue held; nothing is consumed.
pub async fn list(
    config: &LoadedConfig,
    target: &Target,
    selection: &Selection,
) -> anyhow::Result<(Vec<Row>, usize)> {
    let session = Session::open(config).await?;
    let total = session.ready(&target.set_aside).await?;
    let mut pass = Pass::new(&session.channel, &target.set_aside, total);
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
                    position: pass.position,
                    message,
                });
            }
        }
        anyhow::Ok(())
    }
    .await;
    pass.put_back().await;
    session.close().await;
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
    let session = Session::open(config).await?;
    let total = session.ready(&target.set_aside).await?;
    let bound = match which {
        Shown::Id(_) => total,
        Shown::Position(position) => (*position).min(total),
    };
    let mut pass = Pass::new(&session.channel, &target.set_aside, bound);
    let result = async {
        while let Some(delivery) = pass.next().await? {
            pass.hold(&delivery);
            let now = envelope::now_ms();
            let found = match which {
                Shown::Id(id) => {
                    SetAside::read(&delivery.properties, &target.source, now).id == *id
                }
                Shown::Position(position) => pass.position == *position,
            };
            if found {
                return Ok(format::show(
                    pass.position,
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
    pass.put_back().await;
    session.close().await;
    result
}

/// Why one message was not moved.
enum NotMoved {
    /// The broker returned or refused the copy: the original stays, and
    /// the replay goes on with the next message.
    Failed(String),
    /// The channel or connection cannot be trusted any more: the replay
    /// stops (the original stays too).
    Broken(String),
}

/// `dlq replay`: moves the matching messages of `target.set_aside` back to
/// `target.source`, stamped ([`replay_properties`]), each confirmed before
/// its original is acknowledged.
pub async fn replay(
    config: &LoadedConfig,
    target: &Target,
    selection: &Selection,
) -> anyhow::Result<Summary> {
    let session = Session::open(config).await?;
    let total = session.ready(&target.set_aside).await?;
    // Publishing has a channel of its own: a channel error there must not
    // take the messages held on the reading channel with it.
    let publisher = match selection.dry_run {
        true => None,
        false => {
            let channel = session.connection.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            Some(channel)
        }
    };
    let mover = Mover {
        channel: publisher.as_ref(),
        target,
        confirm_timeout: config.config.broker.confirm_timeout,
        frame_max: session.connection.configuration().frame_max(),
    };
    let mut summary = Summary::new(
        Action::Replay,
        selection.dry_run,
        &target.set_aside,
        &target.source,
    );
    let progress = Progress::new(total);
    let mut pass = Pass::new(&session.channel, &target.set_aside, total);
    let result = async {
        while selection
            .limit
            .is_none_or(|limit| summary.done + summary.failed < limit)
        {
            let Some(delivery) = pass.next().await? else {
                break;
            };
            summary.examined += 1;
            let now = envelope::now_ms();
            let envelope = Envelope::read(&delivery.properties, &target.source, now);
            let message = SetAside::of(&envelope, &delivery.properties);
            if !selection.filters.matches(&message) {
                summary.skipped += 1;
                pass.hold(&delivery);
            } else if selection.dry_run {
                summary.done += 1;
                pass.hold(&delivery);
            } else {
                match mover.publish(&delivery, &envelope, now).await {
                    Ok(()) => {
                        pass.take(&delivery).await?;
                        summary.done += 1;
                    }
                    Err(NotMoved::Failed(reason)) => {
                        pass.hold(&delivery);
                        summary.fail(format!("{}: {reason}", message.id));
                    }
                    Err(NotMoved::Broken(reason)) => {
                        pass.hold(&delivery);
                        summary.fail(format!("{}: {reason}", message.id));
                        anyhow::bail!("{reason}");
                    }
                }
            }
            progress.update(&summary);
        }
        anyhow::Ok(())
    }
    .await;
    progress.finish(&summary);
    if let Err(e) = result {
        summary.stopped = Some(format!("{e:#}"));
    }
    pass.put_back().await;
    if let Some(channel) = publisher {
        let _ = channel.close(200, "done".into()).await;
    }
    session.close().await;
    Ok(summary)
}

/// Publishes replay copies, one at a time, waiting for each confirm.
struct Mover<'a> {
    channel: Option<&'a Channel>,
    target: &'a Target,
    confirm_timeout: Duration,
    frame_max: u32,
}

impl Mover<'_> {
    async fn publish(
        &self,
        delivery: &lapin::message::Delivery,
        envelope: &Envelope,
        now_ms: u64,
    ) -> Result<(), NotMoved> {
        let channel = self
            .channel
            .ok_or_else(|| NotMoved::Broken("no publishing channel".into()))?;
        let source = self.target.source.as_str();
        let properties = replay_properties(
            &delivery.properties,
            envelope,
            &self.target.set_aside,
            now_ms,
        );
        // Headers too big for a frame would close the whole connection.
        if let Err(too_big) = check_frame(&properties, self.frame_max) {
            return Err(NotMoved::Failed(format!(
                "its properties take {} bytes with the replay stamps, more than the broker's frame of {} bytes",
                too_big.size, too_big.frame_max
            )));
        }
        let mandatory = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        // Through the default exchange, by the queue's name (contract §11).
        let confirm = channel
            .basic_publish(
                "".into(),
                source.into(),
                mandatory,
                &delivery.data,
                properties,
            )
            .await
            .map_err(|e| NotMoved::Broken(format!("publishing to '{source}' failed: {e}")))?;
        match tokio::time::timeout(self.confirm_timeout, confirm).await {
            Ok(Ok(Confirmation::Ack(None))) => Ok(()),
            Ok(Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)))) => {
                Err(NotMoved::Failed(format!(
                    "the broker returned it ({} {}): is the queue '{source}' declared?",
                    returned.reply_code, returned.reply_text
                )))
            }
            Ok(Ok(Confirmation::Nack(None))) => Err(NotMoved::Failed(
                "the broker refused to confirm the copy, so it must be treated as not sent".into(),
            )),
            Ok(Ok(Confirmation::NotRequested)) => Err(NotMoved::Broken(
                "the publishing channel is not in confirm mode".into(),
            )),
            Ok(Err(e)) => Err(NotMoved::Broken(format!(
                "the copy to '{source}' may not have been sent: {e}"
            ))),
            // The copy may still land: the original is requeued, so at
            // worst it is in both queues, never in neither.
            Err(_) => Err(NotMoved::Broken(format!(
                "no confirm for the copy to '{source}' within {}",
                humantime::format_duration(self.confirm_timeout)
            ))),
        }
    }
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
    let session = Session::open(config).await?;
    let total = session.ready(&target.set_aside).await?;
    let mut summary = Summary::new(
        Action::Purge,
        selection.dry_run,
        &target.set_aside,
        &target.source,
    );
    if everything(selection) {
        let purged = session
            .channel
            .queue_purge(
                target.set_aside.as_str().into(),
                QueuePurgeOptions::default(),
            )
            .await
            .with_context(|| format!("purging '{}'", target.set_aside))?;
        summary.examined = purged as usize;
        summary.done = purged as usize;
        session.close().await;
        return Ok(summary);
    }
    let progress = Progress::new(total);
    let mut pass = Pass::new(&session.channel, &target.set_aside, total);
    let result = async {
        while selection.limit.is_none_or(|limit| summary.done < limit) {
            let Some(delivery) = pass.next().await? else {
                break;
            };
            summary.examined += 1;
            let message = SetAside::read(&delivery.properties, &target.source, envelope::now_ms());
            if !selection.filters.matches(&message) {
                summary.skipped += 1;
                pass.hold(&delivery);
            } else if selection.dry_run {
                summary.done += 1;
                pass.hold(&delivery);
            } else {
                pass.take(&delivery).await?;
                summary.done += 1;
            }
            progress.update(&summary);
        }
        anyhow::Ok(())
    }
    .await;
    progress.finish(&summary);
    if let Err(e) = result {
        summary.stopped = Some(format!("{e:#}"));
    }
    pass.put_back().await;
    session.close().await;
    Ok(summary)
}

/// Whether a purge takes the whole queue, so `queue.purge` can do it.
fn everything(selection: &Selection) -> bool {
    selection.filters == Filters::default() && selection.limit.is_none() && !selection.dry_run
}
