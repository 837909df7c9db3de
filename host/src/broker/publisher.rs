//! Confirmed, mandatory publishing, in rounds on shared channels.
//!
//! Batches (a handler's outputs, or one set-aside copy) that arrive while a
//! round is open join it: they publish on its channel, and the broker
//! coalesces their confirms. Why rounds and not simply a shared channel:
//! lapin hands a `basic.return` to whichever confirm it resolves next, and
//! expands multiple-acks in no particular order, so a return can land on
//! another batch's confirm. Every return on a round's channel belongs to a
//! member of that round, and the broker sends it before the ack of its own
//! message; so once every member's confirms are in, every return has been
//! seen by some member. Members pool what they saw, and each matches its
//! messages against the pool by (message-id, exchange, routing key).
//!
//! A round takes members until the first of them has all its confirms (about
//! one broker round trip), then the next batch opens a new round, on a
//! channel of its own. The channel goes back to the pool when the round ends.
//!
//! Isolation: a channel error (a publish to an exchange that does not exist)
//! fails every message of the round that was not yet confirmed. Those
//! messages fail as "may not have been sent", and the deliveries behind
//! them are retried: nothing is lost, some outputs are published again.

use std::sync::{Arc, Mutex};

use futures::future::join_all;
use lapin::Confirmation;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Connection};
use tokio::sync::watch;

/// One message to publish.
#[derive(Debug, Clone)]
pub struct Publication {
    pub exchange: String,
    pub routing_key: String,
    pub body: Vec<u8>,
    pub properties: BasicProperties,
}

impl Publication {
    fn message_id(&self) -> String {
        self.properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string())
            .unwrap_or_default()
    }
}

/// Why a publish was not confirmed. Wordings follow the contract (§6).
#[derive(Debug, Clone, thiserror::Error)]
pub enum PublishError {
    #[error(
        "message {id} to exchange '{exchange}' with key '{routing_key}' reached no queue: {reason}"
    )]
    Unroutable {
        id: String,
        exchange: String,
        routing_key: String,
        reason: String,
    },
    #[error(
        "message {id} to exchange '{exchange}' with key '{routing_key}': the broker refused to confirm it. \
         The message reached the broker and the broker has not taken responsibility for it, so it must be treated as not sent"
    )]
    Refused {
        id: String,
        exchange: String,
        routing_key: String,
    },
    #[error(
        "message {id} to exchange '{exchange}' with key '{routing_key}' may not have been sent: {reason}"
    )]
    Unknown {
        id: String,
        exchange: String,
        routing_key: String,
        reason: String,
    },
    #[error(
        "{failed} of {total} messages were not confirmed; {confirmed} were. The first failure was: {first}"
    )]
    Batch {
        failed: usize,
        total: usize,
        confirmed: usize,
        first: Box<PublishError>,
    },
}

/// Publishes with confirms, in rounds on pooled confirm-mode channels.
pub struct Publisher {
    connection: Arc<Connection>,
    idle: Arc<Mutex<Vec<Channel>>>,
    /// The round a new batch joins, while it takes members.
    open: Mutex<Option<Arc<Round>>>,
}

/// A message the broker returned: no queue took it.
#[derive(Debug)]
struct Returned {
    id: String,
    exchange: String,
    routing_key: String,
    reply_text: String,
}

/// Batches publishing on one channel, and what the broker returned to them.
struct Round {
    channel: Channel,
    state: Mutex<RoundState>,
    /// Members that have not yet pooled their returns.
    busy: watch::Sender<usize>,
    /// Where the channel goes back when the round ends.
    idle: Arc<Mutex<Vec<Channel>>>,
}

#[derive(Default)]
struct RoundState {
    /// No new members: the first member's confirms are all in.
    sealed: bool,
    returned: Vec<Returned>,
}

impl Round {
    fn new(channel: Channel, idle: Arc<Mutex<Vec<Channel>>>) -> Self {
        Self {
            channel,
            state: Mutex::new(RoundState::default()),
            busy: watch::Sender::new(0),
            idle,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RoundState> {
        self.state.lock().expect("publish round poisoned")
    }
}

impl Drop for Round {
    fn drop(&mut self) {
        // A channel the broker closed (it happens on a publish to a missing
        // exchange) is dropped rather than pooled.
        if self.channel.status().connected() {
            self.idle
                .lock()
                .expect("publisher pool poisoned")
                .push(self.channel.clone());
        }
    }
}

/// A member's place in its round. Leaving (also when the publishing future
/// is dropped half-way) tells the others not to wait for it.
struct Membership {
    round: Arc<Round>,
    left: bool,
}

impl Membership {
    fn leave(&mut self) {
        if !self.left {
            self.left = true;
            self.round.busy.send_modify(|busy| *busy -= 1);
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.leave();
    }
}

impl Publisher {
    pub fn new(connection: Arc<Connection>) -> Self {
        Self {
            connection,
            idle: Arc::new(Mutex::new(Vec::new())),
            open: Mutex::new(None),
        }
    }

    /// The largest frame the broker accepts on this connection, negotiated
    /// when it opened. A content header (properties and headers) larger
    /// than this is a protocol error that closes the whole connection, so
    /// callers measure theirs against it before publishing.
    pub fn frame_max(&self) -> u32 {
        self.connection.configuration().frame_max()
    }

    /// Publishes one message, mandatory, and waits for its confirm.
    pub async fn publish(&self, publication: Publication) -> Result<(), PublishError> {
        self.publish_all(vec![publication]).await
    }

    /// Writes every message before awaiting any confirm, then waits for all
    /// of them, even after a failure (contract §6 batch semantics).
    pub async fn publish_all(&self, publications: Vec<Publication>) -> Result<(), PublishError> {
        if publications.is_empty() {
            return Ok(());
        }
        // Checked before anything is written: lapin panics on a name too
        // long for an AMQP short string, and a batch is all or nothing.
        for p in &publications {
            for (what, name) in [("exchange", &p.exchange), ("routing key", &p.routing_key)] {
                if ShortString::try_new(name.as_str()).is_err() {
                    return Err(PublishError::Unknown {
                        id: p.message_id(),
                        exchange: preview(&p.exchange),
                        routing_key: preview(&p.routing_key),
                        reason: format!(
                            "its {what} is {} bytes long; AMQP allows at most 255, so it was not sent",
                            name.len()
                        ),
                    });
                }
            }
        }
        let mut membership = match self.join().await {
            Ok(membership) => membership,
            Err(e) => return Err(unknown(&publications[0], &e)),
        };
        let round = membership.round.clone();
        let mut pending = Vec::with_capacity(publications.len());
        for publication in &publications {
            let sent = round
                .channel
                .basic_publish(
                    publication.exchange.as_str().into(),
                    publication.routing_key.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &publication.body,
                    publication.properties.clone(),
                )
                .await;
            pending.push(sent);
        }
        let mut confirmations = Vec::with_capacity(pending.len());
        let mut waiting = Vec::new();
        for (index, sent) in pending.into_iter().enumerate() {
            match sent {
                Ok(confirm) => waiting.push((index, confirm)),
                Err(e) => confirmations.push((index, Err(unknown(&publications[index], &e)))),
            }
        }
        let (indices, confirms): (Vec<_>, Vec<_>) = waiting.into_iter().unzip();
        let results = join_all(confirms).await;
        let mut seen = Vec::new();
        for (index, result) in indices.into_iter().zip(results) {
            let outcome = match result {
                Ok(Confirmation::Ack(returned)) => {
                    seen.extend(returned.map(|ret| returned_of(&ret)));
                    Ok(())
                }
                Ok(Confirmation::Nack(_)) => Err(refused(&publications[index])),
                Ok(Confirmation::NotRequested) => Ok(()),
                Err(e) => Err(unknown(&publications[index], &e)),
            };
            confirmations.push((index, outcome));
        }

        // Pool what this member saw, close the round to newcomers, and wait
        // until every member has pooled its returns.
        {
            let mut state = round.state();
            state.returned.extend(seen);
            state.sealed = true;
        }
        self.close(&round);
        let mut others = round.busy.subscribe();
        membership.leave();
        // Every member leaves, even a dropped one: this cannot wait forever
        // unless a member's confirms never arrive, and those end with the
        // channel.
        let _ = others.wait_for(|busy| *busy == 0).await;

        // Matched under the round's lock (no await below): nothing is copied.
        let state = round.state();
        for (index, outcome) in &mut confirmations {
            let p = &publications[*index];
            if outcome.is_err() {
                continue;
            }
            if let Some(ret) = state.returned.iter().find(|r| r.is_of(p)) {
                *outcome = Err(PublishError::Unroutable {
                    id: ret.id.clone(),
                    exchange: p.exchange.clone(),
                    routing_key: p.routing_key.clone(),
                    reason: if ret.reply_text == "NO_ROUTE" {
                        "no queue is bound to receive it".to_string()
                    } else {
                        ret.reply_text.clone()
                    },
                });
            }
        }
        drop(state);
        confirmations.sort_by_key(|(index, _)| *index);
        batch_result(confirmations)
    }

    /// A place in the open round, or in a new one on a pooled channel.
    async fn join(&self) -> lapin::Result<Membership> {
        if let Some(membership) = self.join_open() {
            return Ok(membership);
        }
        let channel = self.channel().await?;
        let round = Arc::new(Round::new(channel, self.idle.clone()));
        let mut open = self.open.lock().expect("publisher rounds poisoned");
        // Another batch may have opened one meanwhile: this one opens its own
        // anyway (its channel is already here), and becomes the open one.
        round.busy.send_modify(|busy| *busy += 1);
        *open = Some(round.clone());
        Ok(Membership { round, left: false })
    }

    fn join_open(&self) -> Option<Membership> {
        let open = self.open.lock().expect("publisher rounds poisoned");
        let round = open.as_ref()?;
        let state = round.state();
        if state.sealed || !round.channel.status().connected() {
            return None;
        }
        // Joined under the round's lock: a member that seals it afterwards
        // sees this one as busy and waits for it.
        round.busy.send_modify(|busy| *busy += 1);
        drop(state);
        Some(Membership {
            round: round.clone(),
            left: false,
        })
    }

    /// Stops `round` taking members, if it is still the open one.
    fn close(&self, round: &Arc<Round>) {
        let mut open = self.open.lock().expect("publisher rounds poisoned");
        if open.as_ref().is_some_and(|o| Arc::ptr_eq(o, round)) {
            *open = None;
        }
    }

    async fn channel(&self) -> lapin::Result<Channel> {
        let idle = self.idle.lock().expect("publisher pool poisoned").pop();
        if let Some(channel) = idle {
            return Ok(channel);
        }
        let channel = self.connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(channel)
    }
}

impl Returned {
    fn is_of(&self, p: &Publication) -> bool {
        self.exchange == p.exchange
            && self.routing_key == p.routing_key
            && self.id == p.message_id()
    }
}

fn returned_of(ret: &lapin::message::BasicReturnMessage) -> Returned {
    Returned {
        id: returned_message_id(ret),
        exchange: ret.delivery.exchange.to_string(),
        routing_key: ret.delivery.routing_key.to_string(),
        reply_text: ret.reply_text.to_string(),
    }
}

fn returned_message_id(ret: &lapin::message::BasicReturnMessage) -> String {
    ret.delivery
        .properties
        .message_id()
        .as_ref()
        .map(|id| id.to_string())
        .unwrap_or_default()
}

fn batch_result(confirmations: Vec<(usize, Result<(), PublishError>)>) -> Result<(), PublishError> {
    let total = confirmations.len();
    let mut failures = confirmations
        .into_iter()
        .filter_map(|(_, r)| r.err())
        .peekable();
    let Some(first) = failures.next() else {
        return Ok(());
    };
    let failed = 1 + failures.count();
    if total == 1 {
        return Err(first);
    }
    Err(PublishError::Batch {
        failed,
        total,
        confirmed: total - failed,
        first: Box::new(first),
    })
}

/// The start of a name too long to quote whole in an error.
fn preview(name: &str) -> String {
    const SHOWN: usize = 64;
    match name.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{}...", &name[..end]),
        None => name.to_string(),
    }
}

fn refused(p: &Publication) -> PublishError {
    PublishError::Refused {
        id: p.message_id(),
        exchange: p.exchange.clone(),
        routing_key: p.routing_key.clone(),
    }
}

fn unknown(p: &Publication, error: &lapin::Error) -> PublishError {
    PublishError::Unknown {
        id: p.message_id(),
        exchange: p.exchange.clone(),
        routing_key: p.routing_key.clone(),
        reason: error.to_string(),
    }
}
