//! One subscription to a stream over the stream protocol, read a chunk at a
//! time.
//!
//! The broker sends a stream in chunks (the batches its writer stored) and
//! only as many as the subscription has credits for. The reader keeps one
//! credit out: when the host takes a chunk it gives the credit back at once,
//! so the broker reads the next chunk while the host works on this one, and
//! no more than two chunks are ever in the host's memory for a subscription
//! (one in hand, one on its way).
//!
//! A chunk starts at the chunk boundary at or before the offset asked for:
//! the reader drops what lies before that offset, so the host sees exactly
//! the messages from it on.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::connection::{StreamConnection, SubscriptionEvent};
use super::wire::{self, Start};
use crate::broker::offset::StreamOffset;

/// The one subscription a reader's connection holds.
const SUBSCRIPTION_ID: u8 = 1;

/// A run of messages as the broker stored them: the first one's offset, and
/// each message's bytes (an AMQP 1.0 message), in order.
pub struct Chunk {
    pub first_offset: u64,
    pub messages: Vec<Bytes>,
}

impl Chunk {
    /// Each message with its offset.
    pub fn into_offsets(self) -> impl Iterator<Item = (u64, Bytes)> {
        (self.first_offset..).zip(self.messages)
    }
}

/// Reads one stream on a connection of its own.
pub struct ChunkReader {
    connection: StreamConnection,
    events: mpsc::Receiver<SubscriptionEvent>,
    stream: String,
    /// Messages below it are dropped (see the module's comment).
    from: Option<u64>,
}

impl ChunkReader {
    /// Subscribes on `connection` (closing the reader closes it) to
    /// `stream` from `from`.
    pub async fn open(
        connection: StreamConnection,
        stream: &str,
        from: StreamOffset,
    ) -> Result<Self, String> {
        // Room for the chunk the credit lets the broker send and the end
        // of the subscription.
        let (sender, events) = mpsc::channel(2);
        let subscribed = connection
            .subscribe(SUBSCRIPTION_ID, stream, start_of(from), 1, sender)
            .await;
        if let Err(why) = subscribed {
            connection.close().await;
            return Err(format!("cannot subscribe to the stream '{stream}': {why}"));
        }
        Ok(Self {
            connection,
            events,
            stream: stream.to_string(),
            from: match from {
                StreamOffset::At(offset) => Some(offset),
                _ => None,
            },
        })
    }

    /// The next chunk (its messages from the offset asked for on), or why
    /// the subscription ended (the connection lost, the stream deleted or
    /// moved to another node).
    pub async fn next(&mut self) -> Result<Chunk, String> {
        loop {
            let chunk = match self.events.recv().await {
                Some(SubscriptionEvent::Chunk(chunk)) => chunk,
                Some(SubscriptionEvent::Ended(why)) => return Err(why),
                None => {
                    return Err(format!(
                        "the stream connection reading '{}' closed",
                        self.stream
                    ));
                }
            };
            // The next chunk is read while this one is worked on.
            self.connection.credit(SUBSCRIPTION_ID, 1).await?;
            if let Some(chunk) = usable(chunk, self.from) {
                return Ok(chunk);
            }
        }
    }

    /// Ends the subscription and closes its connection, each step bounded.
    pub async fn close(self) {
        let Self {
            connection, events, ..
        } = self;
        // Nothing more is read: a chunk still coming is dropped at once
        // rather than wait for room, so the answers below get through.
        drop(events);
        if !connection.is_closed() {
            let _ = connection.unsubscribe(SUBSCRIPTION_ID).await;
        }
        connection.close().await;
    }
}

/// What of `chunk` the host reads: nothing of a chunk that holds no
/// messages (offset tracking's), and nothing before `from` (the offset a
/// reader started from, if it started from one); `None` when nothing is
/// left.
fn usable(chunk: wire::Chunk, from: Option<u64>) -> Option<Chunk> {
    if chunk.kind != 0 {
        return None;
    }
    let mut chunk = Chunk {
        first_offset: chunk.first_offset,
        messages: chunk.records,
    };
    let before = from.map_or(0, |from| from.saturating_sub(chunk.first_offset));
    let before = usize::try_from(before).unwrap_or(usize::MAX);
    if before >= chunk.messages.len() {
        return (before == 0 && !chunk.messages.is_empty()).then_some(chunk);
    }
    chunk.messages.drain(..before);
    chunk.first_offset += before as u64;
    Some(chunk)
}

/// Where the stream protocol starts for a configured position. A point in
/// time is milliseconds on this protocol (seconds over AMQP 0-9-1).
pub fn start_of(from: StreamOffset) -> Start {
    let millis = |at: std::time::Duration| i64::try_from(at.as_millis()).unwrap_or(i64::MAX);
    match from {
        StreamOffset::First => Start::First,
        StreamOffset::Last => Start::Last,
        StreamOffset::Next => Start::Next,
        StreamOffset::At(offset) => Start::Offset(offset),
        StreamOffset::Since(seconds) => {
            Start::Timestamp(millis(std::time::Duration::from_secs(seconds)))
        }
        StreamOffset::Ago(interval) => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            Start::Timestamp(millis(now.saturating_sub(interval)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(first_offset: u64, count: usize, kind: u8) -> wire::Chunk {
        wire::Chunk {
            first_offset,
            kind,
            records: (0..count).map(|i| Bytes::from(vec![i as u8])).collect(),
        }
    }

    fn offsets(chunk: Option<Chunk>) -> Vec<u64> {
        chunk
            .map(|c| c.into_offsets().map(|(offset, _)| offset).collect())
            .unwrap_or_default()
    }

    #[test]
    fn what_lies_before_the_offset_asked_for_is_dropped() {
        let starting_at = |from: Option<u64>, c| offsets(usable(c, from));
        assert_eq!(starting_at(Some(103), chunk(100, 5, 0)), vec![103, 104]);
        assert_eq!(starting_at(Some(100), chunk(100, 2, 0)), vec![100, 101]);
        assert_eq!(starting_at(Some(110), chunk(100, 5, 0)), Vec::<u64>::new());
        assert_eq!(starting_at(Some(50), chunk(100, 2, 0)), vec![100, 101]);
        assert_eq!(starting_at(None, chunk(7, 2, 0)), vec![7, 8]);
        assert!(usable(chunk(7, 0, 0), None).is_none(), "an empty chunk");
        assert!(usable(chunk(7, 2, 1), None).is_none(), "offset tracking's");
    }

    #[test]
    fn a_time_is_milliseconds_on_the_stream_protocol() {
        assert_eq!(
            start_of(StreamOffset::Since(1_700_000_000)),
            Start::Timestamp(1_700_000_000_000)
        );
        assert_eq!(start_of(StreamOffset::At(42)), Start::Offset(42));
        assert_eq!(start_of(StreamOffset::First), Start::First);
    }
}
