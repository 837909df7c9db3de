//! The lag probe of a consumer that reads over the stream protocol: the
//! stream's newest offset, from the last chunk the broker holds.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::endpoint::StreamEndpoints;
use super::reader::ChunkReader;
use crate::broker::offset::StreamOffset;
use crate::broker::stream::{PROBE_EVERY, PROBE_LIMIT, StreamPosition};

/// How long the probe waits for the last chunk: an empty stream sends none.
const EMPTY_AFTER: Duration = Duration::from_millis(500);

/// The newest offset `stream` holds (`None` for an empty stream): the end
/// of the last chunk, which a subscription at `last` receives first.
pub async fn newest_offset(
    endpoints: &StreamEndpoints,
    stream: &str,
) -> Result<Option<u64>, String> {
    let connection = endpoints.connect(&format!("probe.{stream}")).await?;
    let mut reader = ChunkReader::open(connection, stream, StreamOffset::Last).await?;
    let newest = match tokio::time::timeout(EMPTY_AFTER, reader.next()).await {
        Ok(Ok(chunk)) => Ok((chunk.messages.len() as u64)
            .checked_sub(1)
            .map(|last| chunk.first_offset + last)),
        Ok(Err(why)) => Err(why),
        Err(_) => Ok(None),
    };
    reader.close().await;
    newest
}

/// Probes `stream`'s newest offset every [`PROBE_EVERY`], for `position`'s
/// lag, until `stop` is cancelled.
pub async fn probe_newest(
    endpoints: Arc<StreamEndpoints>,
    stream: String,
    position: Arc<StreamPosition>,
    stop: CancellationToken,
) {
    loop {
        let probed = tokio::select! {
            _ = stop.cancelled() => return,
            probed = tokio::time::timeout(PROBE_LIMIT * 2, newest_offset(&endpoints, &stream)) => probed,
        };
        match probed {
            Ok(Ok(Some(newest))) => position.set_newest(newest),
            Ok(Ok(None)) => {}
            Ok(Err(why)) => {
                tracing::debug!(stream = %stream, error = %why, "cannot probe the stream's newest offset now")
            }
            Err(_) => {
                tracing::debug!(stream = %stream, "the stream's newest offset probe timed out")
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(PROBE_EVERY) => {}
        }
    }
}
