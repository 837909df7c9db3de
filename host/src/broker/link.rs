//! A broker connection the host keeps up itself, for one role (consuming or
//! publishing), and what everyone else may know of it: its [`Phase`].
//!
//! Why not lapin's own recovery: it does not reopen a channel after a
//! channel-level error, its backoff ends after a number of tries, and it
//! replays whatever was declared on a channel rather than the host's
//! topology. Here a lost connection is replaced by a new one, forever, with
//! capped exponential backoff and jitter, walking the configured addresses;
//! whatever depends on the connection (topology, subscriptions, publishing
//! channels) starts again on the new one, which the [`Link`] announces with
//! a new generation.
//!
//! The phases follow the AceMQ publishing contract: after a loss the link is
//! `Lost` for `network_recovery_interval` (publishes are declined with the
//! "waiting to be recovered" sentence), then `Reconnecting` while the socket
//! and the topology come back ("its channels are not open yet"), then `Up`.
//! `Blocked` is a connection the broker stopped reading (a resource alarm):
//! still connected, but nothing may be written to it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use lapin::{Connection, ErrorKind, Event};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::connection::{Addresses, ConnectError};

/// The contract's sentence for a connection the broker has blocked.
pub const BLOCKED: &str = "the broker has blocked this connection; publishing is paused";

/// What a link is doing now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Not connected yet since the host started; what it is waiting for.
    Starting { waiting_for: String },
    /// Connected, and everything that depends on the connection is set up.
    Up,
    /// Connected, but the broker has stopped reading it (a resource alarm).
    Blocked { reason: Option<String> },
    /// The connection was lost; the next attempt waits for the recovery
    /// interval.
    Lost { reason: String },
    /// A new connection is being opened and set up.
    Reconnecting { reason: String },
    /// Shutdown: no new connection will be made.
    Stopped,
}

impl Phase {
    /// The word `/health` and the status page show for it.
    pub fn word(&self) -> &'static str {
        match self {
            Phase::Up => "up",
            Phase::Blocked { .. } => "blocked",
            Phase::Starting { .. } => "starting",
            Phase::Lost { .. } => "lost",
            Phase::Reconnecting { .. } => "reconnecting",
            Phase::Stopped => "stopped",
        }
    }

    /// The sentence `/health` shows for a link that is not simply up.
    pub fn detail(&self) -> Option<String> {
        match self {
            Phase::Up => None,
            Phase::Starting { waiting_for } => Some(format!("waiting for {waiting_for}")),
            Phase::Blocked { reason } => Some(blocked_sentence(reason.as_deref())),
            Phase::Lost { reason } => Some(format!(
                "the connection was lost ({reason}) and is waiting to be recovered"
            )),
            Phase::Reconnecting { reason } => {
                Some(format!("the connection is being recovered after: {reason}"))
            }
            Phase::Stopped => Some("stopped".to_string()),
        }
    }
}

/// `the broker has blocked this connection; publishing is paused[: reason]`.
pub fn blocked_sentence(reason: Option<&str>) -> String {
    match reason {
        Some(reason) if !reason.is_empty() => format!("{BLOCKED}: {reason}"),
        _ => BLOCKED.to_string(),
    }
}

/// A link's phase, with the connection while there is one.
#[derive(Clone)]
pub struct LinkState {
    pub phase: Phase,
    /// Present while connected (`Up` or `Blocked`).
    pub connection: Option<Arc<Connection>>,
    /// Increases with each new connection, so that a user of an old one
    /// can tell it was replaced.
    pub generation: u64,
}

/// How a link reconnects.
#[derive(Debug, Clone)]
pub struct Recovery {
    /// The wait before the first reconnection attempt after a loss (the
    /// contract's `network_recovery_interval`).
    pub interval: Duration,
    /// The longest wait between attempts; the wait doubles up to it.
    pub backoff_max: Duration,
    /// How long one connection attempt may take.
    pub attempt_timeout: Duration,
}

/// Runs on every new connection before the link is `Up` (the consume link
/// applies the topology). An error closes that connection and counts as a
/// failed attempt.
pub type OnConnected =
    Arc<dyn Fn(Arc<Connection>) -> BoxFuture<'static, anyhow::Result<()>> + Send + Sync>;

/// Counters a link keeps for the metrics endpoint.
pub trait LinkObserver: Send + Sync {
    fn phase_changed(&self, role: &str, phase: &Phase);
    fn recovered(&self, role: &str, took: Duration);
}

/// One supervised connection.
pub struct Link {
    /// `consume` or `publish`: what the logs and metrics call it.
    role: &'static str,
    addresses: Addresses,
    state: watch::Sender<LinkState>,
    observer: Arc<dyn LinkObserver>,
    /// When a frame from the broker last could not be parsed.
    unparsable_at: std::sync::Mutex<Option<Instant>>,
}

impl Link {
    pub fn new(
        role: &'static str,
        addresses: Addresses,
        observer: Arc<dyn LinkObserver>,
    ) -> Arc<Self> {
        let waiting_for = format!("the {role} connection to {}", addresses.at(0));
        let state = LinkState {
            phase: Phase::Starting { waiting_for },
            connection: None,
            generation: 0,
        };
        observer.phase_changed(role, &state.phase);
        Arc::new(Self {
            role,
            addresses,
            state: watch::Sender::new(state),
            observer,
            unparsable_at: std::sync::Mutex::new(None),
        })
    }

    /// How much is left of `window` since the link was last lost to a frame
    /// it could not parse; `None` when that is longer ago (or never).
    /// Consumers subscribe carefully meanwhile (see `resubscribe.rs`).
    pub fn unparsable_within(&self, window: Duration) -> Option<Duration> {
        let at = (*self.unparsable_at.lock().expect("link poisoned"))?;
        window
            .checked_sub(at.elapsed())
            .filter(|left| !left.is_zero())
    }

    pub fn role(&self) -> &'static str {
        self.role
    }

    /// The link's state now.
    pub fn state(&self) -> LinkState {
        self.state.borrow().clone()
    }

    /// What `read` takes from the state now, without copying the state (a
    /// copy clones the phase's text and the connection's handle: measurable
    /// on a path taken for every message).
    pub fn read_state<T>(&self, read: impl FnOnce(&LinkState) -> T) -> T {
        read(&self.state.borrow())
    }

    pub fn phase(&self) -> Phase {
        self.state.borrow().phase.clone()
    }

    /// Follows every change of state.
    pub fn watch(&self) -> watch::Receiver<LinkState> {
        self.state.subscribe()
    }

    /// Waits until the link is `Up`, and returns its connection and
    /// generation; `None` once `stop` is cancelled or the link stopped.
    pub async fn up(&self, stop: &CancellationToken) -> Option<(Arc<Connection>, u64)> {
        self.up_after(None, stop).await
    }

    /// [`Link::up`], on a connection newer than generation `after` when
    /// given: for a user whose connection of that generation failed,
    /// before the link itself noticed (its state still says `Up` then, and
    /// asking again would hand back the dead connection at once).
    pub async fn up_after(
        &self,
        after: Option<u64>,
        stop: &CancellationToken,
    ) -> Option<(Arc<Connection>, u64)> {
        let mut states = self.watch();
        let ready = states.wait_for(|s| match s.phase {
            Phase::Up => after.is_none_or(|dead| s.generation > dead),
            Phase::Stopped => true,
            _ => false,
        });
        let state = tokio::select! {
            biased;
            _ = stop.cancelled() => return None,
            state = ready => state.ok()?.clone(),
        };
        match state.phase {
            Phase::Up => state.connection.map(|c| (c, state.generation)),
            _ => None,
        }
    }

    fn set(&self, phase: Phase, connection: Option<Arc<Connection>>, new_generation: bool) {
        self.observer.phase_changed(self.role, &phase);
        self.state.send_modify(|state| {
            state.phase = phase;
            state.connection = connection;
            if new_generation {
                state.generation += 1;
            }
        });
    }

    fn set_phase(&self, phase: Phase) {
        self.observer.phase_changed(self.role, &phase);
        self.state.send_modify(|state| state.phase = phase);
    }

    /// One round over the addresses, each attempt bounded by
    /// `attempt_timeout`, for a one-off command ([`super::oneoff`]): no
    /// retry and no supervision, so a failure is reported at once.
    pub async fn connect_once(
        &self,
        attempt_timeout: Duration,
    ) -> Result<Arc<Connection>, ConnectError> {
        let (connection, _) = self.addresses.connect_round(0, attempt_timeout).await?;
        let connection = Arc::new(connection);
        self.set(Phase::Up, Some(connection.clone()), true);
        Ok(connection)
    }

    /// The first connection, at start: attempts with backoff until
    /// `timeout`, and the broker's refusal of the credentials or vhost is
    /// reported at once (retrying cannot fix it).
    pub async fn connect_first(
        &self,
        recovery: &Recovery,
        on_connected: &OnConnected,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let started = Instant::now();
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        let mut attempt = 1u32;
        loop {
            let left = timeout.saturating_sub(started.elapsed());
            let attempt_timeout = recovery
                .attempt_timeout
                .min(left)
                .max(Duration::from_millis(100));
            let error = match self.addresses.connect_round(0, attempt_timeout).await {
                Ok((connection, index)) => {
                    let connection = Arc::new(connection);
                    // A start whose topology is refused is a configuration
                    // problem: it is reported, not retried.
                    on_connected(connection.clone()).await?;
                    tracing::info!(connection = self.role, broker = %self.addresses.at(index), attempt, "connected to the broker");
                    self.set(Phase::Up, Some(connection), true);
                    return Ok(());
                }
                Err(refused @ ConnectError::Refused { .. }) => {
                    return Err(anyhow::anyhow!(
                        "{refused}; check the user name, password and vhost"
                    ));
                }
                Err(unreachable) => unreachable,
            };
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                anyhow::bail!(
                    "could not connect to the broker at {} within {} ({attempt} attempts); the last error was: {error}",
                    self.addresses,
                    humantime::format_duration(timeout)
                );
            }
            // The last attempt is made at the deadline, not a backoff early.
            let wait = backoff.next_wait(1.0).min(left);
            tracing::warn!(connection = self.role, attempt, error = %error, retry_in_ms = wait.as_millis() as u64, "cannot reach the broker yet");
            self.set_phase(Phase::Starting {
                waiting_for: format!(
                    "the {} connection; the last attempt failed: {error}",
                    self.role
                ),
            });
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    /// Keeps the link up until `stop` is cancelled: notices a loss, waits
    /// the recovery interval, reconnects with backoff forever, runs
    /// `on_connected` on each new connection, and announces it.
    pub async fn supervise(
        self: Arc<Self>,
        recovery: Recovery,
        on_connected: OnConnected,
        stop: CancellationToken,
    ) {
        let mut preferred = 0usize;
        loop {
            let Some(connection) = self.state().connection else {
                break;
            };
            let Some(loss) = self.watch_connection(&connection, &stop).await else {
                break;
            };
            let lost_at = Instant::now();
            let reason = loss.reason;
            // The network is fine when a frame could not be parsed: waiting
            // would only stop every consumer of the connection for longer.
            let first_wait = if loss.unparsable {
                *self.unparsable_at.lock().expect("link poisoned") = Some(lost_at);
                tracing::error!(connection = self.role, reason = %reason, "the broker sent a frame that cannot be parsed, most likely a message whose header names, message-id, content type or routing key are not UTF-8 (another client published it); the connection is reopened at once and the broker delivers the message again. Give its queue a delivery limit (a quorum queue's x-delivery-limit, by a policy) so that the broker dead-letters it after a few tries");
                UNPARSABLE_RECOVERY_WAIT.min(recovery.interval)
            } else {
                recovery.interval
            };
            tracing::warn!(connection = self.role, reason = %reason, recovery_interval_ms = first_wait.as_millis() as u64, "connection lost; recovering");
            // The old connection is dropped from the state at once: its
            // channels fail, and whoever waits on them ends.
            self.set(
                Phase::Lost {
                    reason: reason.clone(),
                },
                None,
                false,
            );
            let mut backoff = Backoff::new(first_wait, recovery.backoff_max);
            let mut attempt = 1u32;
            let recovered = loop {
                let wait = backoff.next_wait(rand::random::<f64>());
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => break None,
                    _ = tokio::time::sleep(wait) => {}
                }
                self.set_phase(Phase::Reconnecting {
                    reason: reason.clone(),
                });
                // A stop ends an attempt too: a connection it made is
                // dropped, and lapin closes it.
                let attempt_made = tokio::select! {
                    biased;
                    _ = stop.cancelled() => break None,
                    made = self.reconnect(preferred, &recovery, &on_connected) => made,
                };
                match attempt_made {
                    Ok((connection, index)) => {
                        preferred = index;
                        break Some(connection);
                    }
                    Err(error) => {
                        tracing::warn!(connection = self.role, attempt, error = %format!("{error:#}"), "reconnection failed; trying again");
                        self.set_phase(Phase::Lost {
                            reason: format!("{reason}; the last attempt failed: {error:#}"),
                        });
                        attempt += 1;
                    }
                }
            };
            let Some(connection) = recovered else {
                break;
            };
            let took = lost_at.elapsed();
            tracing::info!(connection = self.role, broker = %self.addresses.at(preferred), attempts = attempt, took_ms = took.as_millis() as u64, "connection recovered");
            self.observer.recovered(self.role, took);
            self.set(Phase::Up, Some(connection), true);
        }
        self.set(Phase::Stopped, self.state().connection, false);
    }

    /// One round over the addresses, starting with the one that answered
    /// last, then `on_connected`.
    async fn reconnect(
        &self,
        preferred: usize,
        recovery: &Recovery,
        on_connected: &OnConnected,
    ) -> anyhow::Result<(Arc<Connection>, usize)> {
        let (connection, index) = self
            .addresses
            .connect_round(preferred, recovery.attempt_timeout)
            .await?;
        let connection = Arc::new(connection);
        if let Err(e) = on_connected(connection.clone()).await {
            let _ = connection
                .close(200, "acemq-host: setup failed".into())
                .await;
            return Err(e);
        }
        Ok((connection, index))
    }

    /// Follows one connection until it is lost (returns why) or `stop` is
    /// cancelled (returns `None`). Tracks blocked and unblocked on the way.
    async fn watch_connection(
        &self,
        connection: &Connection,
        stop: &CancellationToken,
    ) -> Option<Loss> {
        let mut events = connection.events_listener();
        // lapin reports a broker's connection.close and a socket failure as
        // events, but not every way a connection can end; the status is
        // checked as well.
        let mut check = tokio::time::interval(Duration::from_millis(250));
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return None,
                event = events.next() => match event {
                    Some(Event::ConnectionBlocked(reason)) => {
                        tracing::warn!(connection = self.role, reason = %reason, "the broker blocked the connection");
                        let reason = (!reason.is_empty()).then_some(reason);
                        self.set_phase(Phase::Blocked { reason });
                    }
                    Some(Event::ConnectionUnblocked) => {
                        tracing::info!(connection = self.role, "the broker unblocked the connection");
                        self.set_phase(Phase::Up);
                    }
                    // A channel's error is an event too; only a connection
                    // that is no longer connected is lost.
                    Some(Event::Error(error)) if !connection.status().connected() => {
                        return Some(Loss {
                            reason: error.to_string(),
                            unparsable: matches!(error.kind(), ErrorKind::ParsingError(_)),
                        });
                    }
                    Some(_) => {}
                    None => return Some(Loss::plain("the connection ended")),
                },
                _ = check.tick() => {
                    if !connection.status().connected() {
                        return Some(Loss::plain("the connection closed"));
                    }
                }
            }
        }
    }
}

/// The wait before reconnecting after a frame could not be parsed.
const UNPARSABLE_RECOVERY_WAIT: Duration = Duration::from_millis(100);

/// Why a connection was lost.
struct Loss {
    reason: String,
    /// lapin could not parse a frame from the broker: the data, not the
    /// network, is at fault.
    unparsable: bool,
}

impl Loss {
    fn plain(reason: &str) -> Self {
        Self {
            reason: reason.to_string(),
            unparsable: false,
        }
    }
}

/// Capped exponential backoff. Jitter takes up to a fifth off each wait,
/// so hosts that lost the broker together do not return together.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            next: first.min(max),
            max,
        }
    }

    /// The next wait; `sample` in `[0, 1]` picks the jitter (1 = none).
    pub fn next_wait(&mut self, sample: f64) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait.mul_f64(0.8 + 0.2 * sample.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap_and_jitter_only_shortens() {
        let mut backoff = Backoff::new(Duration::from_secs(5), Duration::from_secs(30));
        let waits: Vec<_> = (0..5).map(|_| backoff.next_wait(1.0)).collect();
        assert_eq!(waits, [5, 10, 20, 30, 30].map(Duration::from_secs).to_vec());
        let mut jittered = Backoff::new(Duration::from_secs(5), Duration::from_secs(30));
        assert_eq!(jittered.next_wait(0.0), Duration::from_secs(4));
    }

    #[test]
    fn health_sentences_name_what_the_link_waits_for() {
        assert_eq!(
            Phase::Blocked {
                reason: Some("low on memory".into())
            }
            .detail()
            .unwrap(),
            "the broker has blocked this connection; publishing is paused: low on memory"
        );
        assert_eq!(Phase::Blocked { reason: None }.detail().unwrap(), BLOCKED);
        assert_eq!(Phase::Up.detail(), None);
        assert!(
            Phase::Lost {
                reason: "CONNECTION_FORCED".into()
            }
            .detail()
            .unwrap()
            .contains("CONNECTION_FORCED")
        );
    }
}
