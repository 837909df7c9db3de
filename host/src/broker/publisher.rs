//! Confirmed, mandatory publishing, in rounds on shared channels, over the
//! host's publish connection ([`super::link`]).
//!
//! Batches (a handler's outputs, or one set-aside copy) that arrive while a
//! round is open join it: they publish on its channel, and the broker
//! coalesces their confirms. Why rounds and not simply a shared channel:
//! lapin hands a `basic.return` to whichever confirm it resolves next, and
//! expands multiple-acks in no particular order, so a return can land on
//! another batch's confirm. Every return on a round's channel belongs to a
//! member of that round, and the broker sends it before the ack of its own
//! message; so once every member's confirms are in, every return has been
//! seen by some member. Members pool what they saw (from acks and nacks
//! alike), and each matches its messages against the pool by (message-id,
//! exchange, routing key).
//!
//! A round takes members until the first of them has all its confirms (about
//! one broker round trip), then the next batch opens a new round, on a
//! channel of its own. The channel goes back to the pool when the round
//! ends, unless a member left before its confirms were in: a channel that
//! still owes confirms is never reused, or its late returns would land in
//! another round.
//!
//! Isolation: each consumer has its own [`Publisher`] (its own rounds and
//! channels), so a channel error (a publish to an exchange that does not
//! exist) fails only the unconfirmed messages of that consumer's round. They
//! fail as "may not have been sent", and the deliveries behind them are
//! retried: nothing is lost, some outputs are published again.
//!
//! Broker trouble is told apart from failure, as the AceMQ publishing
//! contract does: a publish while the connection is lost, recovering or
//! blocked is declined before anything is written ([`PublishError::Declined`],
//! counted `refused`), and a publish whose connection dropped before its
//! confirm is [`PublishError::Interrupted`]. Neither is the message's fault;
//! [`PublishError::is_broker_trouble`] lets the caller hold its input and try
//! again once the connection is back.
//!
//! Places: at most `max_unconfirmed` publishes of the whole host wait for a
//! confirm. A batch takes all the places it needs in one step, before it
//! writes anything, and gives each back as that message's confirm arrives.
//! Taking them one message at a time let two batches whose sum passed the
//! free places each hold part and wait for the rest, neither writing its
//! confirms' worth of progress, while every other publish of the host
//! starved. A batch never needs more than `max_unconfirmed` places: the
//! config refuses a `max_outputs` above it (and a larger batch is refused
//! here, unsent). The wait for places and for confirms share one deadline,
//! `confirm_timeout` from the batch's start, which does not run while the
//! broker blocks the connection.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use futures::future::Either;
use futures::stream::FuturesUnordered;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Confirmation, Connection, PublisherConfirm};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use super::link::{Link, Phase, blocked_sentence};
use super::lost::until_lost;

/// The contract's refusal while a lost connection waits for its recovery.
pub const LOST: &str = "the connection has been lost and is waiting to be recovered; this message was not sent, and a retry once the recovery completes will go down the recovered connection.";
/// The contract's refusal while the connection is being reopened.
pub const RECOVERING: &str = "the connection is being recovered and its channels are not open yet. Publishing now would be refused by the broker and would close the connection again; this message was not sent, and a retry once the recovery completes will go down the recovered connection.";

/// One message to publish.
#[derive(Debug, Clone)]
pub struct Publication {
    pub exchange: String,
    pub routing_key: String,
    /// Shared, not copied, when the same body is published again.
    pub body: Bytes,
    pub properties: BasicProperties,
    /// The broker must route it to a queue, or return it (then it fails
    /// as unroutable); without, an unroutable message is dropped unseen.
    pub mandatory: bool,
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
    /// Written, and no confirm came: the connection dropped first, or the
    /// broker did not confirm it within `confirm_timeout`. It may or may not
    /// have arrived (a timed-out publish is usually delivered later). Not
    /// the message's fault.
    #[error(
        "message {id} to exchange '{exchange}' with key '{routing_key}' may not have been sent: {reason}"
    )]
    Interrupted {
        id: String,
        exchange: String,
        routing_key: String,
        reason: String,
    },
    /// Declined before anything was written: the connection is lost,
    /// recovering or blocked, too many publishes wait for confirms, or no
    /// channel opened in time.
    #[error("message {id} to exchange '{exchange}' with key '{routing_key}': {reason}")]
    Declined {
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
        /// Every failure was declined or interrupted.
        broker_trouble: bool,
    },
}

impl PublishError {
    /// The broker or the connection is in trouble, not the message: it was
    /// declined unsent, or no confirm came (its connection dropped, or the
    /// broker did not confirm in time). The host holds its input and
    /// publishes again once publishing is back, without counting an attempt.
    pub fn is_broker_trouble(&self) -> bool {
        match self {
            PublishError::Declined { .. } | PublishError::Interrupted { .. } => true,
            PublishError::Batch { broker_trouble, .. } => *broker_trouble,
            _ => false,
        }
    }
}

/// How a publish ended, as `acemq.publish.total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishOutcome {
    Confirmed,
    Unroutable,
    Failed,
    Refused,
}

impl PublishOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            PublishOutcome::Confirmed => "confirmed",
            PublishOutcome::Unroutable => "unroutable",
            PublishOutcome::Failed => "failed",
            PublishOutcome::Refused => "refused",
        }
    }

    /// How `result` counts.
    pub fn of(result: &Result<(), PublishError>) -> Self {
        match result {
            Ok(()) => PublishOutcome::Confirmed,
            Err(PublishError::Unroutable { .. }) => PublishOutcome::Unroutable,
            Err(PublishError::Declined { .. }) => PublishOutcome::Refused,
            Err(_) => PublishOutcome::Failed,
        }
    }
}

/// Where publishing is counted (the metrics endpoint).
///
/// By exchange and outcome only: routing keys are chosen by plugins (an
/// order or tenant id in each), and a metric series per key would grow
/// memory and `/metrics` without bound. Exchanges are bounded by config
/// (each consumer's `publish_to`, and the default exchange).
pub trait PublishObserver: Send + Sync {
    /// One publish to `exchange` ended in `outcome`, `took` after it was
    /// started.
    fn published(&self, exchange: &str, outcome: PublishOutcome, took: Duration);
    /// Publishes waiting for a confirm changed by `delta`.
    fn unconfirmed(&self, delta: i64);
}

/// Bounds on publishing.
#[derive(Debug, Clone)]
pub struct PublishSettings {
    /// Publishes that may wait for a confirm at once, host-wide.
    pub max_unconfirmed: usize,
    /// How long a batch waits for its places among the unconfirmed and its
    /// confirms, together (not while the broker blocks the connection).
    pub confirm_timeout: Duration,
}

impl Default for PublishSettings {
    fn default() -> Self {
        // The contract's values: 1000 outstanding publishes, 10 s.
        Self {
            max_unconfirmed: 1000,
            confirm_timeout: Duration::from_secs(10),
        }
    }
}

/// What every publisher of the host shares: the publish connection and the
/// bound on unconfirmed publishes.
pub struct PublishLink {
    link: Arc<Link>,
    permits: Arc<Semaphore>,
    settings: PublishSettings,
    observer: Arc<dyn PublishObserver>,
}

impl PublishLink {
    pub fn new(
        link: Arc<Link>,
        settings: PublishSettings,
        observer: Arc<dyn PublishObserver>,
    ) -> Arc<Self> {
        Arc::new(Self {
            permits: Arc::new(Semaphore::new(settings.max_unconfirmed.max(1))),
            link,
            settings,
            observer,
        })
    }

    pub fn link(&self) -> &Arc<Link> {
        &self.link
    }

    /// The largest frame the broker accepts on the publish connection (its
    /// last one, or AMQP's default before the first). A content header
    /// (properties and headers) larger than this closes the whole
    /// connection, so callers measure theirs against it before publishing.
    pub fn frame_max(&self) -> u32 {
        self.link.read_state(|state| match &state.connection {
            Some(connection) => connection.configuration().frame_max(),
            None => 131_072,
        })
    }

    /// Waits until publishing may be tried again: the link is up and not
    /// blocked.
    pub async fn ready(&self) {
        let mut states = self.link.watch();
        let _ = states
            .wait_for(|s| matches!(s.phase, Phase::Up | Phase::Stopped))
            .await;
    }

    fn count(&self, publication: &Publication, result: &Result<(), PublishError>, took: Duration) {
        self.observer
            .published(&publication.exchange, PublishOutcome::of(result), took);
    }
}

/// A place among the unconfirmed publishes, held until its confirm is in.
struct Unconfirmed {
    _permit: OwnedSemaphorePermit,
    observer: Arc<dyn PublishObserver>,
}

impl Drop for Unconfirmed {
    fn drop(&mut self) {
        self.observer.unconfirmed(-1);
    }
}

/// The places a batch took in one step, handed out one per message as it
/// is written; those never handed out go back when it is dropped.
struct Places {
    permit: OwnedSemaphorePermit,
    observer: Arc<dyn PublishObserver>,
}

impl Places {
    fn take_one(&mut self) -> Unconfirmed {
        let permit = self
            .permit
            .split(1)
            .expect("a batch takes a place for each of its messages");
        self.observer.unconfirmed(1);
        Unconfirmed {
            _permit: permit,
            observer: self.observer.clone(),
        }
    }
}

/// One batch's deadline: `confirm_timeout` from its start, for its places,
/// its channel and its confirms together. It does not run while the broker
/// blocks the connection: found blocked when it passes, it moves a whole
/// timeout later.
struct Deadline<'a> {
    link: &'a Link,
    timeout: Duration,
    at: tokio::time::Instant,
}

impl<'a> Deadline<'a> {
    fn new(link: &'a Link, timeout: Duration) -> Self {
        Self {
            link,
            timeout,
            at: tokio::time::Instant::now() + timeout,
        }
    }

    /// What `work` gives, or `None` when the deadline passes first.
    async fn within<F: std::future::Future>(&mut self, work: F) -> Option<F::Output> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                biased;
                output = &mut work => return Some(output),
                _ = tokio::time::sleep_until(self.at) => {
                    if matches!(self.link.phase(), Phase::Blocked { .. }) {
                        self.at = tokio::time::Instant::now() + self.timeout;
                    } else {
                        return None;
                    }
                }
            }
        }
    }
}

/// Publishes with confirms, in rounds on its own confirm-mode channels.
/// One per consumer: see the module's note on isolation.
pub struct Publisher {
    shared: Arc<PublishLink>,
    idle: Arc<Mutex<Vec<Pooled>>>,
    /// The round a new batch joins, while it takes members.
    open: Mutex<Option<Arc<Round>>>,
    /// Held while a round is being opened. Opening one may take two broker
    /// round trips (a new channel, confirm mode); batches arriving meanwhile
    /// wait for it and join it, instead of each opening a channel of its
    /// own: a burst of deliveries once left hundreds of channels on the
    /// connection, and lapin walks every channel for every frame it writes.
    opening: tokio::sync::Mutex<()>,
}

/// A channel waiting for its next round, and the connection it belongs to.
struct Pooled {
    channel: Channel,
    generation: u64,
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
    generation: u64,
    state: Mutex<RoundState>,
    /// Members that have not yet pooled their returns.
    busy: Busy,
    /// Where the channel goes back when the round ends.
    idle: Arc<Mutex<Vec<Pooled>>>,
}

#[derive(Default)]
struct RoundState {
    /// No new members: the first member's confirms are all in.
    sealed: bool,
    /// A member left before its confirms were in: the channel may still
    /// owe confirms and returns, and is not reused.
    abandoned: bool,
    returned: Vec<Returned>,
}

/// How many members of a round have not yet pooled their returns, and a
/// wake-up for those waiting once none is left.
///
/// Only the last leave wakes anyone. When every leave woke every member
/// still waiting, a round of n members cost about n² polls of delivery
/// tasks that found others still busy and went back to sleep (a round
/// takes every batch that joins while its first member's confirms are
/// out, so under load it is many).
#[derive(Debug)]
struct Busy(watch::Sender<usize>);

impl Default for Busy {
    fn default() -> Self {
        Self(watch::Sender::new(0))
    }
}

impl Busy {
    /// One more member. Nobody waits for the count to rise.
    fn join(&self) {
        self.0.send_if_modified(|busy| {
            *busy += 1;
            false
        });
    }

    /// One member fewer; the waiting are woken when it was the last.
    fn leave(&self) {
        self.0.send_if_modified(|busy| {
            *busy -= 1;
            *busy == 0
        });
    }

    /// A view of the count, taken before this member leaves so that the
    /// last leave (its own included) cannot be missed.
    fn watch(&self) -> watch::Receiver<usize> {
        self.0.subscribe()
    }

    /// Waits until no member is left.
    async fn all_left(mut view: watch::Receiver<usize>) {
        // The sender lives in the round, which the caller holds: the wait
        // ends only with the count.
        let _ = view.wait_for(|busy| *busy == 0).await;
    }
}

impl Round {
    fn new(channel: Channel, generation: u64, idle: Arc<Mutex<Vec<Pooled>>>) -> Self {
        Self {
            channel,
            generation,
            state: Mutex::new(RoundState::default()),
            busy: Busy::default(),
            idle,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, RoundState> {
        self.state.lock().expect("publish round poisoned")
    }
}

impl Drop for Round {
    fn drop(&mut self) {
        // A channel the broker closed (a publish to a missing exchange) is
        // dropped rather than pooled, and so is one that may owe confirms.
        let abandoned = self.state().abandoned;
        if self.channel.status().connected() && !abandoned {
            self.idle
                .lock()
                .expect("publisher pool poisoned")
                .push(Pooled {
                    channel: self.channel.clone(),
                    generation: self.generation,
                });
        } else if abandoned && self.channel.status().connected() {
            let channel = self.channel.clone();
            tokio::spawn(async move {
                let _ = channel
                    .close(200, "acemq-host: confirms abandoned".into())
                    .await;
            });
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
            self.round.busy.leave();
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        if !self.left {
            // Dropped before its confirms were all in.
            self.round.state().abandoned = true;
        }
        self.leave();
    }
}

/// How waiting for one confirm ended, short of a confirmation.
enum NoConfirm {
    Failed(lapin::Error),
    TimedOut,
    ConnectionLost,
}

impl NoConfirm {
    /// The same ending, for another message of the batch.
    fn again(&self) -> Self {
        match self {
            NoConfirm::Failed(e) => NoConfirm::Failed(e.clone()),
            NoConfirm::TimedOut => NoConfirm::TimedOut,
            NoConfirm::ConnectionLost => NoConfirm::ConnectionLost,
        }
    }
}

impl Publisher {
    pub fn new(shared: Arc<PublishLink>) -> Self {
        Self {
            shared,
            idle: Arc::new(Mutex::new(Vec::new())),
            open: Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
        }
    }

    /// The shared publish connection and limits.
    pub fn link(&self) -> &Arc<PublishLink> {
        &self.shared
    }

    /// Closes the channels waiting for a next round, each waiting at most
    /// `limit` for the broker's close-ok. For a publisher whose work is
    /// done, before its connection is closed: a pooled channel that is only
    /// dropped is closed by lapin on its own, and when that close meets the
    /// connection's (the host's stop closes the connection right after its
    /// consumers end), lapin removes the channel twice or closes it on a
    /// closing connection, and reports a connection error ("invalid
    /// channel", "invalid connection state") at a clean stop.
    pub async fn close_idle(&self, limit: Duration) {
        let pooled = std::mem::take(&mut *self.idle.lock().expect("publisher pool poisoned"));
        let closes = pooled
            .into_iter()
            .filter(|pooled| pooled.channel.status().connected())
            .map(|pooled| async move {
                let close = pooled.channel.close(200, "acemq-host stopped".into());
                match tokio::time::timeout(limit, close).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => tracing::debug!(%error, "closing a publishing channel"),
                    Err(_) => tracing::debug!(
                        "the broker did not confirm a publishing channel's close in time"
                    ),
                }
            });
        futures::future::join_all(closes).await;
    }

    /// See [`PublishLink::frame_max`].
    pub fn frame_max(&self) -> u32 {
        self.shared.frame_max()
    }

    /// Publishes one message, mandatory, and waits for its confirm (at most
    /// `confirm_timeout`, not counting a time the broker blocks the
    /// connection).
    pub async fn publish(&self, publication: &Publication) -> Result<(), PublishError> {
        self.publish_all(std::slice::from_ref(publication)).await
    }

    /// Writes every message before awaiting any confirm, then waits for all
    /// of them, even after a failure (contract §6 batch semantics).
    pub async fn publish_all(&self, publications: &[Publication]) -> Result<(), PublishError> {
        batch_result(self.publish_batch(publications).await)
    }

    /// As [`Publisher::publish_all`], with each message's own result, in
    /// order: what a caller needs to publish again only what failed.
    pub async fn publish_batch(
        &self,
        publications: &[Publication],
    ) -> Vec<Result<(), PublishError>> {
        let started = Instant::now();
        let results = self.publish_each(publications).await;
        // A batch's confirms are awaited together: each of its messages
        // took as long as the batch.
        let took = started.elapsed();
        for (publication, result) in publications.iter().zip(&results) {
            self.shared.count(publication, result, took);
        }
        results
    }

    /// One batch, in phases: refuse what cannot be sent, take places and a
    /// round, write, wait for the confirms, leave the round once every
    /// member pooled its returns, and match the returns to the messages.
    async fn publish_each(&self, publications: &[Publication]) -> Vec<Result<(), PublishError>> {
        if let Some(refused) = self.refuse_unsendable(publications) {
            return refused;
        }
        let mut deadline = Deadline::new(&self.shared.link, self.shared.settings.confirm_timeout);
        let entered = match self.enter_round(publications, &mut deadline).await {
            Ok(entered) => entered,
            Err(declined) => return declined,
        };
        let Entered {
            mut places,
            membership,
            connection,
            generation,
        } = entered;
        let round = membership.round.clone();
        let (mut results, waiting) = write(&round, &connection, publications, &mut places).await;
        let confirmations = self.confirmations(waiting, generation, &mut deadline).await;
        // Confirms still owed when the deadline passed: the channel may yet
        // carry their returns, which must not land in another round.
        let owed = confirmations
            .iter()
            .any(|(_, outcome)| matches!(outcome, Err(NoConfirm::TimedOut)));
        let mut seen = Vec::new();
        for (index, outcome) in confirmations {
            let result = self.confirmed(&publications[index], outcome, &connection, &mut seen);
            results[index] = Some(result);
        }
        self.leave_round(&round, membership, seen, owed).await;
        let results = results
            .into_iter()
            .map(|r| r.expect("every publication has a result"))
            .collect();
        match_returns(&round, publications, results)
    }

    /// Each message's refusal, when the batch cannot be sent at all: empty,
    /// a name AMQP cannot carry, more messages than may wait for confirms,
    /// or the link not up.
    fn refuse_unsendable(
        &self,
        publications: &[Publication],
    ) -> Option<Vec<Result<(), PublishError>>> {
        if publications.is_empty() {
            return Some(Vec::new());
        }
        // Checked before anything is written: lapin panics on a name too
        // long for an AMQP short string, and a batch is all or nothing.
        if let Some(error) = publications.iter().find_map(name_too_long) {
            return Some(publications.iter().map(|_| Err(error.clone())).collect());
        }
        let bound = self.shared.settings.max_unconfirmed.max(1);
        if publications.len() > bound {
            // It could never hold its places at once; the config keeps
            // plugin outputs below this (`max_outputs`).
            let reason = format!(
                "its batch of {} messages is larger than the {bound} publishes that may wait \
                 for a confirm at once ([broker] max_unconfirmed), so it was not sent",
                publications.len()
            );
            return Some(
                publications
                    .iter()
                    .map(|p| Err(unknown(p, &reason)))
                    .collect(),
            );
        }
        self.paused(publications)
    }

    /// The batch's places (every one, in one step: see the module's note on
    /// places) and its membership of a round; or each message declined,
    /// unsent.
    async fn enter_round(
        &self,
        publications: &[Publication],
        deadline: &mut Deadline<'_>,
    ) -> Result<Entered, Vec<Result<(), PublishError>>> {
        let Some(places) = deadline.within(self.places(publications.len())).await else {
            return Err(decline_all(publications, &self.no_places_sentence()));
        };
        // The link may have changed while the batch waited for places; on a
        // blocked connection lapin would hold every write until the block
        // ends.
        if let Some(declined) = self.paused(publications) {
            return Err(declined);
        }
        let Some((connection, generation)) = self
            .shared
            .link
            .read_state(|state| Some((state.connection.clone()?, state.generation)))
        else {
            return Err(decline_all(publications, LOST));
        };
        let joined = deadline.within(self.join(&connection, generation)).await;
        match joined {
            Some(Ok(membership)) => Ok(Entered {
                places,
                membership,
                connection,
                generation,
            }),
            // Nothing was written: a channel that cannot open on a
            // connection that just dropped is the recovery's business.
            Some(Err(_)) if !connection.status().connected() => {
                Err(decline_all(publications, LOST))
            }
            Some(Err(e)) => Err(publications
                .iter()
                .map(|p| Err(unknown(p, &e.to_string())))
                .collect()),
            None => Err(decline_all(publications, &self.no_channel_sentence())),
        }
    }

    /// One message's result from how waiting for its confirm ended; a
    /// return riding on the confirm goes to `seen`.
    fn confirmed(
        &self,
        p: &Publication,
        outcome: Result<Confirmation, NoConfirm>,
        connection: &Connection,
        seen: &mut Vec<Returned>,
    ) -> Result<(), PublishError> {
        match outcome {
            Ok(Confirmation::Ack(returned)) => {
                seen.extend(returned.map(|ret| returned_of(&ret)));
                Ok(())
            }
            Ok(Confirmation::Nack(returned)) => {
                // A return may ride on a nack: it belongs to another
                // member's message as much as one on an ack does.
                seen.extend(returned.map(|ret| returned_of(&ret)));
                Err(refused(p))
            }
            Ok(Confirmation::NotRequested) => Ok(()),
            Err(NoConfirm::Failed(e)) if !connection.status().connected() => Err(interrupted(
                p,
                &format!("the connection dropped before the broker confirmed it ({e})"),
            )),
            Err(NoConfirm::Failed(e)) => Err(unknown(p, &e.to_string())),
            Err(NoConfirm::ConnectionLost) => Err(interrupted(
                p,
                "the connection was lost before the broker confirmed it",
            )),
            // The broker is slow, not the message wrong: it most likely
            // arrives (a timeout does not cancel a publish), and its input
            // is held and published again, not failed.
            Err(NoConfirm::TimedOut) => Err(interrupted(
                p,
                &format!(
                    "no confirm came within {}; the broker is not keeping up",
                    humantime::format_duration(self.shared.settings.confirm_timeout)
                ),
            )),
        }
    }

    /// Pools what this member saw, closes the round to newcomers, and waits
    /// until every member has pooled its returns.
    async fn leave_round(
        &self,
        round: &Arc<Round>,
        mut membership: Membership,
        seen: Vec<Returned>,
        owed: bool,
    ) {
        {
            let mut round_state = round.state();
            round_state.returned.extend(seen);
            round_state.sealed = true;
            round_state.abandoned |= owed;
        }
        self.close(round);
        let others = round.busy.watch();
        membership.leave();
        // Every member leaves, even a dropped one: this cannot wait forever
        // unless a member's confirms never arrive, and those end with its
        // deadline. A member joins only once it holds its places, so none
        // waits for places while others wait for it.
        Busy::all_left(others).await;
    }

    /// Every message declined, unsent, while the link is not up.
    fn paused(&self, publications: &[Publication]) -> Option<Vec<Result<(), PublishError>>> {
        let paused =
            self.shared
                .link
                .read_state(|state| match (&state.phase, &state.connection) {
                    (Phase::Up, Some(_)) => None,
                    (phase, _) => Some(paused_sentence(phase)),
                })?;
        Some(decline_all(publications, &paused))
    }

    /// `count` places among the host's unconfirmed publishes, taken
    /// together (the semaphore is fair: a batch waiting at its head is
    /// served before any later one, large or small).
    async fn places(&self, count: usize) -> Places {
        let permits = &self.shared.permits;
        let count_u32 = u32::try_from(count).expect("a batch is at most max_unconfirmed");
        // Places are nearly always free: take them without queueing.
        let permit = match permits.clone().try_acquire_many_owned(count_u32) {
            Ok(permit) => permit,
            Err(_) => permits
                .clone()
                .acquire_many_owned(count_u32)
                .await
                .expect("the semaphore is never closed"),
        };
        Places {
            permit,
            observer: self.shared.observer.clone(),
        }
    }

    /// The contract's sentence for a batch that found no places in time.
    fn no_places_sentence(&self) -> String {
        let settings = &self.shared.settings;
        format!(
            "{} publishes are already waiting for a confirm and none completed within {}. \
             The broker is not keeping up; publish more slowly rather than buffering more.",
            settings.max_unconfirmed,
            humantime::format_duration(settings.confirm_timeout)
        )
    }

    fn no_channel_sentence(&self) -> String {
        format!(
            "no publishing channel could be opened within {}; the broker is not answering. Nothing was sent",
            humantime::format_duration(self.shared.settings.confirm_timeout)
        )
    }

    /// Waits for the confirms of one batch, until its `deadline` (which is
    /// pushed back while the broker has blocked the connection: a publish
    /// written before a block is confirmed after it), and no longer than
    /// the connection. Each place is given back as its own confirm arrives.
    /// One timer and one watch for the whole batch, not one per message:
    /// this runs for every output the host publishes.
    async fn confirmations(
        &self,
        waiting: Vec<(usize, PublisherConfirm, Unconfirmed)>,
        generation: u64,
        deadline: &mut Deadline<'_>,
    ) -> Vec<(usize, Result<Confirmation, NoConfirm>)> {
        // Which of the batch's positions still wait (positions are small).
        let size = waiting
            .iter()
            .map(|(index, ..)| index + 1)
            .max()
            .unwrap_or(0);
        let mut outstanding = vec![false; size];
        for (index, ..) in &waiting {
            outstanding[*index] = true;
        }
        let count = waiting.len();
        let mut confirms = waiting
            .into_iter()
            .map(|(index, confirm, place)| async move {
                let result = confirm.await;
                drop(place);
                (index, result)
            });
        let mut done = Vec::with_capacity(count);
        let cut_short = {
            // Most batches are one delivery's one output: its confirm is
            // awaited as it is, without the set that lets several arrive in
            // any order (an allocation for the set and one for each of its
            // futures).
            let mut pending = std::pin::pin!(match (count, confirms.next()) {
                (1, Some(only)) => Either::Left(futures::stream::once(only)),
                (_, first) => Either::Right(
                    first
                        .into_iter()
                        .chain(confirms)
                        .collect::<FuturesUnordered<_>>(),
                ),
            });
            let link = &self.shared.link;
            let mut states = link.watch();
            let all_in = async {
                while let Some((index, result)) = pending.next().await {
                    outstanding[index] = false;
                    done.push((index, result.map_err(NoConfirm::Failed)));
                }
            };
            // A link whose state can no longer change is gone too.
            let lost = states.wait_for(|s| {
                s.generation != generation
                    || matches!(s.phase, Phase::Lost { .. } | Phase::Reconnecting { .. })
            });
            deadline
                .within(async {
                    tokio::select! {
                        _ = all_in => None,
                        _ = lost => Some(NoConfirm::ConnectionLost),
                    }
                })
                .await
                .unwrap_or(Some(NoConfirm::TimedOut))
            // Places of confirms still owed go back here, with `pending`.
        };
        if let Some(why) = cut_short {
            let left = outstanding.iter().enumerate().filter(|(_, waits)| **waits);
            done.extend(left.map(|(index, _)| (index, Err(why.again()))));
        }
        done
    }

    /// A place in the open round, or in a new one on a pooled channel.
    async fn join(
        &self,
        connection: &Arc<Connection>,
        generation: u64,
    ) -> lapin::Result<Membership> {
        if let Some(membership) = self.join_open(generation) {
            return Ok(membership);
        }
        let _opening = self.opening.lock().await;
        // Opened by another batch while this one waited.
        if let Some(membership) = self.join_open(generation) {
            return Ok(membership);
        }
        let channel = self.channel(connection, generation).await?;
        let round = Arc::new(Round::new(channel, generation, self.idle.clone()));
        let mut open = self.open.lock().expect("publisher rounds poisoned");
        round.busy.join();
        *open = Some(round.clone());
        Ok(Membership { round, left: false })
    }

    fn join_open(&self, generation: u64) -> Option<Membership> {
        let open = self.open.lock().expect("publisher rounds poisoned");
        let round = open.as_ref()?;
        let state = round.state();
        if state.sealed || round.generation != generation || !round.channel.status().connected() {
            return None;
        }
        // Joined under the round's lock: a member that seals it afterwards
        // sees this one as busy and waits for it.
        round.busy.join();
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

    async fn channel(
        &self,
        connection: &Arc<Connection>,
        generation: u64,
    ) -> lapin::Result<Channel> {
        let pooled = {
            let mut idle = self.idle.lock().expect("publisher pool poisoned");
            // Channels of a connection that was replaced are dead.
            idle.retain(|p| p.generation == generation && p.channel.status().connected());
            idle.pop()
        };
        if let Some(pooled) = pooled {
            return Ok(pooled.channel);
        }
        // Opened on a task of its own: a batch that stops waiting for it
        // (its deadline passed, the broker blocks the connection) leaves the
        // channel to the pool when it opens, instead of an open channel
        // nobody uses or closes.
        let (opened, receive) = tokio::sync::oneshot::channel();
        let connection = connection.clone();
        let idle = self.idle.clone();
        tokio::spawn(async move {
            // Raced against the connection's end (see `lost.rs`): this task
            // must not outlive a connection that failed while it waited.
            let channel = until_lost(&connection, async {
                let channel = connection.create_channel().await?;
                channel
                    .confirm_select(ConfirmSelectOptions::default())
                    .await?;
                Ok::<_, lapin::Error>(channel)
            })
            .await;
            if let Err(Ok(channel)) = opened.send(channel) {
                idle.lock().expect("publisher pool poisoned").push(Pooled {
                    channel,
                    generation,
                });
            }
        });
        receive.await.unwrap_or_else(|_| {
            Err(lapin::Error::from(
                lapin::ErrorKind::InvalidConnectionState(lapin::ConnectionState::Closed),
            ))
        })
    }
}

/// A batch's places and its round, once it may write.
struct Entered {
    places: Places,
    membership: Membership,
    connection: Arc<Connection>,
    /// The connection's generation (see [`Round`]).
    generation: u64,
}

/// Writes every message of the batch on its round's channel: the confirms
/// to wait for (each with its place), and the results of those that could
/// not be written.
async fn write(
    round: &Round,
    connection: &Connection,
    publications: &[Publication],
    places: &mut Places,
) -> (
    Vec<Option<Result<(), PublishError>>>,
    Vec<(usize, PublisherConfirm, Unconfirmed)>,
) {
    let mut results: Vec<Option<Result<(), PublishError>>> = vec![None; publications.len()];
    let mut waiting = Vec::with_capacity(publications.len());
    for (index, publication) in publications.iter().enumerate() {
        let place = places.take_one();
        let sent = round
            .channel
            .basic_publish(
                publication.exchange.as_str().into(),
                publication.routing_key.as_str().into(),
                BasicPublishOptions {
                    mandatory: publication.mandatory,
                    ..BasicPublishOptions::default()
                },
                &publication.body,
                publication.properties.clone(),
            )
            .await;
        match sent {
            Ok(confirm) => waiting.push((index, confirm, place)),
            // lapin refuses to write on a channel that is not open: the
            // connection closed between the check and the write.
            Err(_) if !round.channel.status().connected() && !connection.status().connected() => {
                results[index] = Some(Err(declined(publication, LOST)));
            }
            Err(e) => results[index] = Some(Err(unknown(publication, &e.to_string()))),
        }
    }
    (results, waiting)
}

/// `results` with each confirmed message the round's returns name failed as
/// unroutable. Matched under the round's lock (no await): nothing is copied.
fn match_returns(
    round: &Round,
    publications: &[Publication],
    mut results: Vec<Result<(), PublishError>>,
) -> Vec<Result<(), PublishError>> {
    let round_state = round.state();
    for (p, result) in publications.iter().zip(&mut results) {
        if result.is_err() {
            continue;
        }
        if let Some(ret) = round_state.returned.iter().find(|r| r.is_of(p)) {
            *result = Err(PublishError::Unroutable {
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
    results
}

/// The contract's sentence for publishing while the link is in `phase`.
fn paused_sentence(phase: &Phase) -> String {
    match phase {
        Phase::Blocked { reason } => format!(
            "{}. Nothing was sent; back off and retry once the broker unblocks",
            blocked_sentence(reason.as_deref())
        ),
        Phase::Lost { .. } => LOST.to_string(),
        Phase::Stopped => "the host is stopping; this message was not sent".to_string(),
        Phase::Up | Phase::Starting { .. } | Phase::Reconnecting { .. } => RECOVERING.to_string(),
    }
}

fn decline_all(publications: &[Publication], reason: &str) -> Vec<Result<(), PublishError>> {
    publications
        .iter()
        .map(|p| Err(declined(p, reason)))
        .collect()
}

/// An exchange or routing key AMQP cannot carry (over 255 bytes).
fn name_too_long(p: &Publication) -> Option<PublishError> {
    [("exchange", &p.exchange), ("routing key", &p.routing_key)]
        .into_iter()
        .find(|(_, name)| ShortString::try_new(name.as_str()).is_err())
        .map(|(what, name)| PublishError::Unknown {
            id: p.message_id(),
            exchange: preview(&p.exchange),
            routing_key: preview(&p.routing_key),
            reason: format!(
                "its {what} is {} bytes long; AMQP allows at most 255, so it was not sent",
                name.len()
            ),
        })
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

/// One result for a batch's results: `Ok` when every message was
/// confirmed, the single error of a batch of one, else the contract's batch
/// sentence naming the first failure.
pub fn batch_result(results: Vec<Result<(), PublishError>>) -> Result<(), PublishError> {
    let total = results.len();
    let failures: Vec<PublishError> = results.into_iter().filter_map(Result::err).collect();
    let failed = failures.len();
    let broker_trouble = failures.iter().all(PublishError::is_broker_trouble);
    let Some(first) = failures.into_iter().next() else {
        return Ok(());
    };
    if total == 1 {
        return Err(first);
    }
    Err(PublishError::Batch {
        failed,
        total,
        confirmed: total - failed,
        first: Box::new(first),
        broker_trouble,
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

fn unknown(p: &Publication, reason: &str) -> PublishError {
    PublishError::Unknown {
        id: p.message_id(),
        exchange: p.exchange.clone(),
        routing_key: p.routing_key.clone(),
        reason: reason.to_string(),
    }
}

fn interrupted(p: &Publication, reason: &str) -> PublishError {
    PublishError::Interrupted {
        id: p.message_id(),
        exchange: p.exchange.clone(),
        routing_key: p.routing_key.clone(),
        reason: reason.to_string(),
    }
}

fn declined(p: &Publication, reason: &str) -> PublishError {
    PublishError::Declined {
        id: p.message_id(),
        exchange: p.exchange.clone(),
        routing_key: p.routing_key.clone(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn members_waiting_for_a_round_are_woken_once_by_the_last_to_leave() {
        let busy = Busy::default();
        for _ in 0..3 {
            busy.join();
        }
        let view = busy.watch();
        busy.leave();
        busy.leave();
        assert!(
            !view.has_changed().unwrap(),
            "a leave that is not the last wakes no one"
        );
        let waiting = tokio::spawn(Busy::all_left(busy.watch()));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "one member is still busy");
        busy.leave();
        assert!(view.has_changed().unwrap(), "the last leave wakes");
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the wait ends with the last leave")
            .unwrap();
        // A member that looks after everyone left does not wait.
        Busy::all_left(busy.watch()).await;
    }
}
