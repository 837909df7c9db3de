//! A reader between the socket and lapin that no producer's bytes can make
//! close the connection.
//!
//! lapin (through amq-protocol) reads every AMQP short string as UTF-8 and
//! refuses a frame it cannot parse by closing the whole connection: every
//! consumer on it is interrupted, and the broker delivers the same message
//! again, first, for ever on a queue without a delivery limit. RabbitMQ
//! passes on whatever bytes a producer put in a routing key, a property or a
//! header name. So the host reads the broker's bytes through [`FrameGuard`]:
//! it follows the frame boundaries, lets every frame lapin can read through
//! as it is, and rewrites the few that it could not (see [`repair`]) into
//! frames it can, marked with [`UNREADABLE_HEADER`] so the consumer parks
//! the message (bytes of its body untouched) before any plugin runs.
//!
//! This file is the pure part: which bytes may be handed on, which frame
//! must be whole before it can be judged, and what replaces a frame.
//! [`transport`] puts it on a socket for lapin.
//!
//! Only frames that carry a producer's strings are looked at: basic.deliver,
//! basic.get-ok and basic.return (exchange, routing key) and content headers
//! (properties and headers). Body frames, heartbeats and every other method
//! pass as they arrive, without waiting for the frame's end. A rewritten
//! frame is never larger than the `frame_max` of the connection, which lapin
//! checks on every frame it reads.

pub mod repair;
pub mod transport;

pub use repair::UNREADABLE_HEADER;
use repair::{Method, Notes};

/// type (1), channel (2), size (4).
const FRAME_HEADER_BYTES: usize = 7;
/// The frame-end octet after every payload.
const FRAME_END_BYTES: usize = 1;
const FRAME_METHOD: u8 = 1;
const FRAME_CONTENT_HEADER: u8 = 2;
/// A server that refuses the protocol version answers with its own
/// 8-byte protocol header instead of a frame.
const PROTOCOL_HEADER_START: u8 = b'A';
const PROTOCOL_HEADER_BYTES: usize = 8;
/// The smallest `frame_max` AMQP allows; lapin never negotiates below it.
const FRAME_MIN_SIZE: u32 = 4096;
/// What a frame to be judged may weigh before `connection.tune` says the
/// real limit (the broker's frames before it are a few hundred bytes).
const BEFORE_TUNE_MAX: u32 = 1 << 20;

/// What to do with the bytes at the front of what has been read.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Hand on this many bytes as they are.
    Pass(usize),
    /// Nothing can be handed on until at least this many bytes (counted
    /// from the front) have been read.
    NeedMore(usize),
    /// Replace the first `consumed` bytes (one whole frame) with `with`.
    Replace { consumed: usize, with: Vec<u8> },
}

/// The state of one connection's inbound bytes.
#[derive(Debug)]
pub struct FrameGuard {
    /// Bytes of the current frame still to pass unchanged; 0 at a frame
    /// boundary.
    passing: usize,
    /// `frame_max` as the client asks for it (0: whatever the server says).
    client_frame_max: u32,
    /// `frame_max` from the server's connection.tune, once seen.
    server_frame_max: Option<u32>,
    /// Per channel: what was wrong in the method frame of a delivery whose
    /// content header has not arrived yet (where the note is written).
    pending: Vec<(u16, Notes)>,
    /// Frames rewritten on this connection.
    rewritten: u64,
}

impl FrameGuard {
    /// A guard for a new connection whose client asks for `frame_max`
    /// (0 when the URL sets none).
    pub fn new(client_frame_max: u32) -> Self {
        Self {
            passing: 0,
            client_frame_max,
            server_frame_max: None,
            pending: Vec::new(),
            rewritten: 0,
        }
    }

    /// How many frames were rewritten so far.
    pub fn rewritten(&self) -> u64 {
        self.rewritten
    }

    /// Bytes of the current frame that may be handed on unread (read
    /// straight into the caller's buffer); 0 when the next bytes must be
    /// looked at.
    pub fn passing(&self) -> usize {
        self.passing
    }

    /// Notes that `n` of [`FrameGuard::passing`] bytes were handed on.
    pub fn passed(&mut self, n: usize) {
        self.passing -= n.min(self.passing);
    }

    /// The largest frame lapin accepts on this connection, as negotiated:
    /// the smaller of the client's and the server's, at least the minimum.
    fn frame_max(&self) -> u32 {
        let negotiated = match (self.client_frame_max, self.server_frame_max) {
            (0, None) => BEFORE_TUNE_MAX,
            (0, Some(0)) => u32::MAX,
            (0, Some(server)) => server,
            (client, None | Some(0)) => client,
            (client, Some(server)) => client.min(server),
        };
        negotiated.max(FRAME_MIN_SIZE)
    }

    /// What to do with `input`, the bytes read and not yet handed on.
    pub fn step(&mut self, input: &[u8]) -> Step {
        if input.is_empty() {
            return Step::NeedMore(1);
        }
        if self.passing > 0 {
            let n = self.passing.min(input.len());
            self.passing -= n;
            return Step::Pass(n);
        }
        if input[0] == PROTOCOL_HEADER_START {
            return self.pass_whole(PROTOCOL_HEADER_BYTES, input.len());
        }
        if input.len() < FRAME_HEADER_BYTES {
            return Step::NeedMore(FRAME_HEADER_BYTES);
        }
        let kind = input[0];
        let channel = u16::from_be_bytes([input[1], input[2]]);
        let size = u32::from_be_bytes([input[3], input[4], input[5], input[6]]) as usize;
        let total = FRAME_HEADER_BYTES + size + FRAME_END_BYTES;
        let judged = match kind {
            FRAME_CONTENT_HEADER => true,
            // Class and method ids decide; they follow the frame header.
            FRAME_METHOD => {
                if input.len() < FRAME_HEADER_BYTES + 4 && size >= 4 {
                    return Step::NeedMore(FRAME_HEADER_BYTES + 4);
                }
                size >= 4 && {
                    let ids = &input[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + 4];
                    let (class, method) = (
                        u16::from_be_bytes([ids[0], ids[1]]),
                        u16::from_be_bytes([ids[2], ids[3]]),
                    );
                    Method::of(class, method).is_some() || is_tune(class, method)
                }
            }
            _ => false,
        };
        // A frame over the limit is lapin's to refuse (FRAME_ERROR); it is
        // not held in memory to be judged.
        if !judged || total > self.frame_max() as usize {
            return self.pass_whole(total, input.len());
        }
        if input.len() < total {
            return Step::NeedMore(total);
        }
        let frame = &input[..total];
        match self.judge(kind, channel, frame) {
            Some(with) => {
                self.rewritten += 1;
                Step::Replace {
                    consumed: total,
                    with,
                }
            }
            None => Step::Pass(total),
        }
    }

    /// Passes a frame of `total` bytes of which `available` have been read.
    fn pass_whole(&mut self, total: usize, available: usize) -> Step {
        let now = total.min(available);
        self.passing = total - now;
        Step::Pass(now)
    }

    /// A replacement for a whole frame, or `None` when it passes as it is.
    fn judge(&mut self, kind: u8, channel: u16, frame: &[u8]) -> Option<Vec<u8>> {
        let payload = &frame[FRAME_HEADER_BYTES..frame.len() - FRAME_END_BYTES];
        if kind == FRAME_METHOD {
            let class = u16::from_be_bytes([payload[0], payload[1]]);
            let method = u16::from_be_bytes([payload[2], payload[3]]);
            if is_tune(class, method) {
                // channel-max (2), then frame-max (4).
                if let Some(max) = payload.get(6..10) {
                    self.server_frame_max = Some(u32::from_be_bytes(max.try_into().ok()?));
                }
                return None;
            }
            let method = Method::of(class, method)?;
            // A new delivery on this channel: an earlier one's note is stale.
            self.pending.retain(|(c, _)| *c != channel);
            if repair::method_is_clean(method, &payload[4..]) {
                return None;
            }
            let mut rewritten = frame.to_vec();
            let end = rewritten.len() - FRAME_END_BYTES;
            let notes = repair::repair_method(method, &mut rewritten[FRAME_HEADER_BYTES + 4..end]);
            self.pending.push((channel, notes));
            return Some(rewritten);
        }
        let earlier = self
            .pending
            .iter()
            .position(|(c, _)| *c == channel)
            .map(|at| self.pending.swap_remove(at).1);
        if earlier.is_none() && repair::content_header_is_clean(payload) {
            return None;
        }
        let max_payload = self.frame_max() as usize - FRAME_HEADER_BYTES - FRAME_END_BYTES;
        let payload =
            repair::repair_content_header(payload, earlier.unwrap_or_default(), max_payload);
        Some(frame_of(FRAME_CONTENT_HEADER, channel, &payload))
    }
}

/// connection.tune (10, 30): says the server's `frame_max`.
fn is_tune(class: u16, method: u16) -> bool {
    (class, method) == (10, 30)
}

/// A whole frame around `payload`.
fn frame_of(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(payload.len() + FRAME_HEADER_BYTES + FRAME_END_BYTES);
    frame.push(kind);
    frame.extend_from_slice(&channel.to_be_bytes());
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(payload);
    frame.push(0xCE);
    frame
}

#[cfg(test)]
mod tests;
