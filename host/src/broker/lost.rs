//! A broker conversation that cannot outlive its connection.
//!
//! lapin (4.12) leaves the promise of a step that awaits the broker's reply
//! (a channel's opening, a declaration, qos, consume, a close) pending for
//! ever when the connection fails while the reply is awaited: its io loop
//! ends, and what it had not yet sent is never settled. Measured with
//! `tests/tests/resilience.rs`
//! `a_step_whose_connection_is_cut_ends_with_it_instead_of_waiting_for_ever`
//! run without the race: a socket cut while channels were being opened and
//! closed in a loop left `create_channel` pending (over 5 s, for good) in
//! 10 of 300 cuts, the connection's state already `Error`. A subscription
//! (re)starting at that moment waited until shutdown, its queue never read
//! again, every thread idle; a recovered connection declaring its topology
//! kept its link from ever coming back.
//!
//! So each such step runs [`until_lost`]: raced against the end of its
//! connection, seen in the connection's status, which lapin sets before
//! its io loop ends (looked at every [`LOOK_EVERY`]: lapin's events do not
//! cover every way a connection ends).

use std::future::Future;
use std::time::Duration;

use lapin::{Connection, ConnectionState, ErrorKind};

/// How often a step's connection is looked at: the longest a step outlives
/// its connection.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// `step`'s own result, or an error naming the connection's end when the
/// connection ends first.
pub async fn until_lost<T>(
    connection: &Connection,
    step: impl Future<Output = lapin::Result<T>>,
) -> lapin::Result<T> {
    tokio::select! {
        biased;
        done = step => done,
        state = ended(connection) => Err(ErrorKind::InvalidConnectionState(state).into()),
    }
}

/// Resolves once `connection` has failed or closed, with that state.
pub async fn ended(connection: &Connection) -> ConnectionState {
    let mut look = tokio::time::interval(LOOK_EVERY);
    loop {
        look.tick().await;
        let status = connection.status();
        if status.errored() {
            return ConnectionState::Error;
        }
        if status.closed() {
            return ConnectionState::Closed;
        }
    }
}
