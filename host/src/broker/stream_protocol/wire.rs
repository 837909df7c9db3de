//! The stream protocol's frames: the requests a reader sends, the frames it
//! receives, and the osiris chunk a delivery carries. Pure: bytes in, bytes
//! out.
//!
//! Only what a reader needs is here (no publishing, no super streams), in
//! the protocol's first version of each command, which every broker since
//! 3.9 speaks. The host does not send `ExchangeCommandVersions` (RabbitMQ
//! 3.13 and later): RabbitMQ 3.10 does not know it and closes the
//! connection, which is why the host has its own small client rather than
//! `rabbitmq-stream-client`, whose every version since 0.5 sends it when it
//! connects.
//!
//! Layouts (big endian throughout): a frame is a `uint32` size and then the
//! size's bytes; a request is `key uint16, version uint16, correlation
//! uint32, ...`; a response sets the key's top bit and carries `correlation
//! uint32, code uint16, ...`; a string is an `int16` length and UTF-8; bytes
//! are an `int32` length and the bytes; an array is an `int32` count.

use bytes::{Buf, BufMut, Bytes};

/// The commands a reader uses, by key.
pub mod key {
    pub const SUBSCRIBE: u16 = 0x0007;
    pub const DELIVER: u16 = 0x0008;
    pub const CREDIT: u16 = 0x0009;
    pub const STORE_OFFSET: u16 = 0x000a;
    pub const QUERY_OFFSET: u16 = 0x000b;
    pub const UNSUBSCRIBE: u16 = 0x000c;
    pub const METADATA: u16 = 0x000f;
    pub const METADATA_UPDATE: u16 = 0x0010;
    pub const PEER_PROPERTIES: u16 = 0x0011;
    pub const SASL_HANDSHAKE: u16 = 0x0012;
    pub const SASL_AUTHENTICATE: u16 = 0x0013;
    pub const TUNE: u16 = 0x0014;
    pub const OPEN: u16 = 0x0015;
    pub const CLOSE: u16 = 0x0016;
    pub const HEARTBEAT: u16 = 0x0017;
    /// Set on the key of a response.
    pub const RESPONSE: u16 = 0x8000;
}

/// Response codes the host tells apart.
pub mod code {
    pub const OK: u16 = 0x01;
    pub const STREAM_DOES_NOT_EXIST: u16 = 0x02;
    pub const STREAM_NOT_AVAILABLE: u16 = 0x06;
    pub const AUTHENTICATION_FAILURE: u16 = 0x08;
    pub const VIRTUAL_HOST_ACCESS_FAILURE: u16 = 0x0c;
    pub const ACCESS_REFUSED: u16 = 0x10;
    pub const NO_OFFSET: u16 = 0x13;
}

/// A response code in words.
pub fn code_text(code: u16) -> String {
    let text = match code {
        0x01 => "ok",
        0x02 => "stream does not exist",
        0x03 => "subscription id already exists",
        0x04 => "subscription id does not exist",
        0x06 => "stream not available",
        0x07 => "SASL mechanism not supported",
        0x08 => "authentication failure",
        0x09 => "SASL error",
        0x0b => "SASL authentication failure loopback",
        0x0c => "virtual host access failure",
        0x0d => "unknown frame",
        0x0e => "frame too large",
        0x0f => "internal error",
        0x10 => "access refused",
        0x11 => "precondition failed",
        0x13 => "no offset",
        other => return format!("response code {other:#04x}"),
    };
    text.to_string()
}

/// Where a subscription starts, as the protocol says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    First,
    Last,
    Next,
    Offset(u64),
    /// Milliseconds since the epoch.
    Timestamp(i64),
}

/// Builds one frame: its size is filled in by [`Frame::done`].
struct Frame(Vec<u8>);

impl Frame {
    fn command(key: u16) -> Self {
        let mut buffer = Vec::with_capacity(64);
        buffer.put_u32(0);
        buffer.put_u16(key);
        buffer.put_u16(1);
        Frame(buffer)
    }

    fn request(key: u16, correlation: u32) -> Self {
        let mut frame = Self::command(key);
        frame.0.put_u32(correlation);
        frame
    }

    fn string(mut self, text: &str) -> Self {
        // The protocol's strings are at most i16::MAX bytes; names and
        // vhosts are far below it (the broker refuses longer ones anyway).
        let bytes = &text.as_bytes()[..text.len().min(i16::MAX as usize)];
        self.0.put_i16(bytes.len() as i16);
        self.0.put_slice(bytes);
        self
    }

    fn bytes(mut self, bytes: &[u8]) -> Self {
        self.0.put_i32(bytes.len() as i32);
        self.0.put_slice(bytes);
        self
    }

    fn u8(mut self, value: u8) -> Self {
        self.0.put_u8(value);
        self
    }

    fn u16(mut self, value: u16) -> Self {
        self.0.put_u16(value);
        self
    }

    fn u32(mut self, value: u32) -> Self {
        self.0.put_u32(value);
        self
    }

    fn u64(mut self, value: u64) -> Self {
        self.0.put_u64(value);
        self
    }

    fn pairs(mut self, pairs: &[(&str, &str)]) -> Self {
        self.0.put_i32(pairs.len() as i32);
        for (key, value) in pairs {
            self = self.string(key).string(value);
        }
        self
    }

    fn done(mut self) -> Vec<u8> {
        let size = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&size.to_be_bytes());
        self.0
    }
}

pub fn peer_properties(correlation: u32, properties: &[(&str, &str)]) -> Vec<u8> {
    Frame::request(key::PEER_PROPERTIES, correlation)
        .pairs(properties)
        .done()
}

pub fn sasl_handshake(correlation: u32) -> Vec<u8> {
    Frame::request(key::SASL_HANDSHAKE, correlation).done()
}

/// PLAIN: `\0user\0password`.
pub fn sasl_plain(correlation: u32, user: &str, password: &str) -> Vec<u8> {
    let mut data = Vec::with_capacity(user.len() + password.len() + 2);
    data.push(0);
    data.extend_from_slice(user.as_bytes());
    data.push(0);
    data.extend_from_slice(password.as_bytes());
    Frame::request(key::SASL_AUTHENTICATE, correlation)
        .string("PLAIN")
        .bytes(&data)
        .done()
}

/// The client's answer to the broker's tune.
pub fn tune(frame_max: u32, heartbeat_seconds: u32) -> Vec<u8> {
    Frame::command(key::TUNE)
        .u32(frame_max)
        .u32(heartbeat_seconds)
        .done()
}

pub fn open(correlation: u32, vhost: &str) -> Vec<u8> {
    Frame::request(key::OPEN, correlation).string(vhost).done()
}

pub fn close(correlation: u32, reason: &str) -> Vec<u8> {
    Frame::request(key::CLOSE, correlation)
        .u16(code::OK)
        .string(reason)
        .done()
}

/// The answer to the broker's close.
pub fn close_ok(correlation: u32) -> Vec<u8> {
    Frame::command(key::CLOSE | key::RESPONSE)
        .u32(correlation)
        .u16(code::OK)
        .done()
}

pub fn heartbeat() -> Vec<u8> {
    Frame::command(key::HEARTBEAT).done()
}

pub fn subscribe(correlation: u32, id: u8, stream: &str, start: Start, credit: u16) -> Vec<u8> {
    let frame = Frame::request(key::SUBSCRIBE, correlation)
        .u8(id)
        .string(stream);
    let frame = match start {
        Start::First => frame.u16(1),
        Start::Last => frame.u16(2),
        Start::Next => frame.u16(3),
        Start::Offset(offset) => frame.u16(4).u64(offset),
        Start::Timestamp(ms) => frame.u16(5).u64(ms as u64),
    };
    frame.u16(credit).pairs(&[]).done()
}

pub fn credit(id: u8, credit: u16) -> Vec<u8> {
    Frame::command(key::CREDIT).u8(id).u16(credit).done()
}

pub fn store_offset(reference: &str, stream: &str, offset: u64) -> Vec<u8> {
    Frame::command(key::STORE_OFFSET)
        .string(reference)
        .string(stream)
        .u64(offset)
        .done()
}

pub fn query_offset(correlation: u32, reference: &str, stream: &str) -> Vec<u8> {
    Frame::request(key::QUERY_OFFSET, correlation)
        .string(reference)
        .string(stream)
        .done()
}

pub fn unsubscribe(correlation: u32, id: u8) -> Vec<u8> {
    Frame::request(key::UNSUBSCRIBE, correlation).u8(id).done()
}

pub fn metadata(correlation: u32, streams: &[&str]) -> Vec<u8> {
    let mut frame = Frame::request(key::METADATA, correlation);
    frame.0.put_i32(streams.len() as i32);
    streams
        .iter()
        .fold(frame, |frame, stream| frame.string(stream))
        .done()
}

/// Where a stream's members are: the stream listeners (host, port) of its
/// leader's node and of its replicas' nodes, as the broker advertises them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Members {
    /// The stream's own code (`ok`, or why it has no members).
    pub code: u16,
    pub leader: Option<(String, u16)>,
    pub replicas: Vec<(String, u16)>,
}

/// Reads a metadata response (after its code) for `stream`.
pub fn members_of(mut rest: Bytes, stream: &str) -> Result<Members, WireError> {
    let brokers = get_u32(&mut rest, "the brokers")? as i32;
    let mut listeners = std::collections::HashMap::new();
    for _ in 0..brokers.max(0) {
        let reference = get_u16(&mut rest, "a broker")?;
        let host = get_string(&mut rest, "a broker's host")?;
        let port = get_u32(&mut rest, "a broker's port")?;
        listeners.insert(reference, (host, u16::try_from(port).unwrap_or(0)));
    }
    let streams = get_u32(&mut rest, "the streams")? as i32;
    for _ in 0..streams.max(0) {
        let name = get_string(&mut rest, "a stream's name")?;
        let code = get_u16(&mut rest, "a stream's code")?;
        let leader = get_u16(&mut rest, "a stream's leader")?;
        let replicas = get_u32(&mut rest, "a stream's replicas")? as i32;
        let replicas = (0..replicas.max(0))
            .map(|_| get_u16(&mut rest, "a replica"))
            .collect::<Result<Vec<_>, _>>()?;
        if name == stream {
            return Ok(Members {
                code,
                leader: listeners.get(&leader).cloned(),
                replicas: replicas
                    .iter()
                    .filter_map(|r| listeners.get(r).cloned())
                    .collect(),
            });
        }
    }
    Ok(Members {
        code: code::STREAM_DOES_NOT_EXIST,
        ..Members::default()
    })
}

/// Why received bytes cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("a frame of the stream protocol ends early: {0} is cut off")]
    Truncated(&'static str),
    #[error("a string of the stream protocol is not UTF-8 ({0})")]
    NotUtf8(&'static str),
    #[error(
        "chunk at offset {first_offset} holds a compressed sub-batch (compression {compression}), which the host does not read; its publisher batched with compression"
    )]
    Compressed { first_offset: u64, compression: u8 },
}

/// A frame from the broker (its size already taken off).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// The answer to a request of ours: `rest` is what follows the code.
    Response {
        key: u16,
        correlation: u32,
        code: u16,
        rest: Bytes,
    },
    /// The broker's proposed frame size and heartbeat (seconds).
    Tune {
        frame_max: u32,
        heartbeat: u32,
    },
    Heartbeat,
    /// A chunk for subscription `subscription` (see [`parse_chunk`]).
    Deliver {
        subscription: u8,
        chunk: Bytes,
    },
    /// The stream changed (deleted, its member here gone): subscriptions
    /// to it are over.
    MetadataUpdate {
        code: u16,
        stream: String,
    },
    /// A credit the broker refused (an unknown subscription).
    CreditRefused {
        code: u16,
        subscription: u8,
    },
    /// The broker closes the connection.
    Close {
        correlation: u32,
        code: u16,
        reason: String,
    },
    /// Anything else (a reader has no use for it).
    Other {
        key: u16,
    },
}

fn need(buffer: &Bytes, bytes: usize, what: &'static str) -> Result<(), WireError> {
    if buffer.remaining() < bytes {
        return Err(WireError::Truncated(what));
    }
    Ok(())
}

fn get_u8(buffer: &mut Bytes, what: &'static str) -> Result<u8, WireError> {
    need(buffer, 1, what)?;
    Ok(buffer.get_u8())
}

fn get_u16(buffer: &mut Bytes, what: &'static str) -> Result<u16, WireError> {
    need(buffer, 2, what)?;
    Ok(buffer.get_u16())
}

fn get_u32(buffer: &mut Bytes, what: &'static str) -> Result<u32, WireError> {
    need(buffer, 4, what)?;
    Ok(buffer.get_u32())
}

fn get_u64(buffer: &mut Bytes, what: &'static str) -> Result<u64, WireError> {
    need(buffer, 8, what)?;
    Ok(buffer.get_u64())
}

fn get_string(buffer: &mut Bytes, what: &'static str) -> Result<String, WireError> {
    let length = get_u16(buffer, what)? as i16;
    if length < 0 {
        return Ok(String::new());
    }
    need(buffer, length as usize, what)?;
    let bytes = buffer.split_to(length as usize);
    String::from_utf8(bytes.to_vec()).map_err(|_| WireError::NotUtf8(what))
}

/// Reads one frame from the broker.
pub fn parse(mut frame: Bytes) -> Result<Incoming, WireError> {
    let key = get_u16(&mut frame, "the key")?;
    let _version = get_u16(&mut frame, "the version")?;
    Ok(match key {
        key::TUNE => Incoming::Tune {
            frame_max: get_u32(&mut frame, "the tune")?,
            heartbeat: get_u32(&mut frame, "the tune")?,
        },
        key::HEARTBEAT => Incoming::Heartbeat,
        key::DELIVER => Incoming::Deliver {
            subscription: get_u8(&mut frame, "the delivery")?,
            chunk: frame,
        },
        key::METADATA_UPDATE => Incoming::MetadataUpdate {
            code: get_u16(&mut frame, "the metadata update")?,
            stream: get_string(&mut frame, "the metadata update")?,
        },
        key::CLOSE => Incoming::Close {
            correlation: get_u32(&mut frame, "the close")?,
            code: get_u16(&mut frame, "the close")?,
            reason: get_string(&mut frame, "the close")?,
        },
        // The one response without a code: each stream has its own.
        k if k == key::METADATA | key::RESPONSE => Incoming::Response {
            key: key::METADATA,
            correlation: get_u32(&mut frame, "the metadata")?,
            code: code::OK,
            rest: frame,
        },
        // The one response without a correlation id.
        k if k == key::CREDIT | key::RESPONSE => Incoming::CreditRefused {
            code: get_u16(&mut frame, "the credit response")?,
            subscription: get_u8(&mut frame, "the credit response")?,
        },
        k if k & key::RESPONSE != 0 => Incoming::Response {
            key: k & !key::RESPONSE,
            correlation: get_u32(&mut frame, "the response")?,
            code: get_u16(&mut frame, "the response")?,
            rest: frame,
        },
        other => Incoming::Other { key: other },
    })
}

/// The offset a query-offset response carries.
pub fn offset_of(mut rest: Bytes) -> Result<u64, WireError> {
    get_u64(&mut rest, "the offset")
}

/// The mechanisms a SASL handshake response offers.
pub fn mechanisms(mut rest: Bytes) -> Result<Vec<String>, WireError> {
    let count = get_u32(&mut rest, "the mechanisms")? as i32;
    (0..count.max(0))
        .map(|_| get_string(&mut rest, "a mechanism"))
        .collect()
}

/// A chunk's messages: the first one's offset, and each message's bytes
/// (an AMQP 1.0 message as stored), sharing the frame's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub first_offset: u64,
    /// 0 for a chunk of messages; other kinds (offset tracking) carry none
    /// for a reader.
    pub kind: u8,
    pub records: Vec<Bytes>,
}

/// Reads an osiris chunk (version 1 of `Deliver`, after the subscription
/// id): its header, then `NumEntries` entries, each a simple entry (a
/// `uint32` whose top bit is 0, the size; then the message) or a sub-batch
/// (top bit 1: compression in the next 3 bits, `uint16` records, `uint32`
/// uncompressed size, `uint32` size, then the records, each size-prefixed).
/// Uncompressed sub-batches are read; compressed ones are an error.
pub fn parse_chunk(mut chunk: Bytes) -> Result<Chunk, WireError> {
    let _magic = get_u8(&mut chunk, "the chunk's magic")?;
    let kind = get_u8(&mut chunk, "the chunk's type")?;
    let entries = get_u16(&mut chunk, "the chunk's entry count")?;
    let records = get_u32(&mut chunk, "the chunk's record count")?;
    let _timestamp = get_u64(&mut chunk, "the chunk's timestamp")?;
    let _epoch = get_u64(&mut chunk, "the chunk's epoch")?;
    let first_offset = get_u64(&mut chunk, "the chunk's first offset")?;
    let _crc = get_u32(&mut chunk, "the chunk's checksum")?;
    let _data_length = get_u32(&mut chunk, "the chunk's data length")?;
    let _trailer_length = get_u32(&mut chunk, "the chunk's trailer length")?;
    let _reserved = get_u32(&mut chunk, "the chunk's reserved bytes")?;
    let mut messages = Vec::with_capacity(records.min(65_536) as usize);
    for _ in 0..entries {
        let head = get_u32(&mut chunk, "an entry's header")?;
        if head & 0x8000_0000 == 0 {
            let size = head as usize;
            need(&chunk, size, "an entry")?;
            messages.push(chunk.split_to(size));
            continue;
        }
        // A sub-batch header: 1 bit type, 3 bits compression, 4 reserved,
        // uint16 records, uint32 uncompressed size, uint32 size. The head
        // read its first 4 bytes (through the uncompressed size's first).
        let compression = ((head >> 28) & 0x7) as u8;
        let in_batch = ((head >> 8) & 0xffff) as u16;
        need(&chunk, 3, "a sub-batch header")?;
        chunk.advance(3);
        let size = get_u32(&mut chunk, "a sub-batch size")? as usize;
        need(&chunk, size, "a sub-batch")?;
        let mut batch = chunk.split_to(size);
        if compression != 0 {
            return Err(WireError::Compressed {
                first_offset,
                compression,
            });
        }
        for _ in 0..in_batch {
            let size = get_u32(&mut batch, "a record of a sub-batch")? as usize;
            need(&batch, size, "a record of a sub-batch")?;
            messages.push(batch.split_to(size));
        }
    }
    Ok(Chunk {
        first_offset,
        kind,
        records: messages,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk of `messages` as simple entries, starting at `first_offset`.
    pub(crate) fn chunk_bytes(first_offset: u64, messages: &[&[u8]]) -> Vec<u8> {
        let mut data = Vec::new();
        for message in messages {
            data.put_u32(message.len() as u32);
            data.put_slice(message);
        }
        let mut chunk = Vec::new();
        chunk.put_u8(0x05); // magic
        chunk.put_u8(0); // user chunk
        chunk.put_u16(messages.len() as u16);
        chunk.put_u32(messages.len() as u32);
        chunk.put_u64(1_764_000_000_000);
        chunk.put_u64(1);
        chunk.put_u64(first_offset);
        chunk.put_u32(0);
        chunk.put_u32(data.len() as u32);
        chunk.put_u32(0);
        chunk.put_u32(0);
        chunk.extend_from_slice(&data);
        chunk
    }

    #[test]
    fn requests_are_framed_with_their_size_key_version_and_fields() {
        let frame = query_offset(7, "projection", "orders");
        let mut bytes = Bytes::from(frame);
        assert_eq!(bytes.get_u32() as usize, bytes.remaining());
        assert_eq!(bytes.get_u16(), key::QUERY_OFFSET);
        assert_eq!(bytes.get_u16(), 1);
        assert_eq!(bytes.get_u32(), 7);
        assert_eq!(get_string(&mut bytes, "t").unwrap(), "projection");
        assert_eq!(get_string(&mut bytes, "t").unwrap(), "orders");
        assert!(!bytes.has_remaining());

        let mut bytes = Bytes::from(subscribe(3, 1, "orders", Start::Offset(42), 1));
        bytes.advance(4 + 2 + 2 + 4);
        assert_eq!(bytes.get_u8(), 1);
        assert_eq!(get_string(&mut bytes, "t").unwrap(), "orders");
        assert_eq!(bytes.get_u16(), 4);
        assert_eq!(bytes.get_u64(), 42);
        assert_eq!(bytes.get_u16(), 1);
        assert_eq!(bytes.get_i32(), 0, "no properties");

        let mut bytes = Bytes::from(sasl_plain(1, "guest", "pw"));
        bytes.advance(12);
        assert_eq!(get_string(&mut bytes, "t").unwrap(), "PLAIN");
        assert_eq!(bytes.get_i32(), 9);
        assert_eq!(&bytes[..], b"\0guest\0pw");
    }

    #[test]
    fn frames_from_the_broker_are_told_apart() {
        let response = {
            let mut b = Vec::new();
            b.put_u16(key::QUERY_OFFSET | key::RESPONSE);
            b.put_u16(1);
            b.put_u32(9);
            b.put_u16(code::OK);
            b.put_u64(1234);
            Bytes::from(b)
        };
        let Incoming::Response {
            key: k,
            correlation,
            code: c,
            rest,
        } = parse(response).unwrap()
        else {
            panic!("a response")
        };
        assert_eq!((k, correlation, c), (key::QUERY_OFFSET, 9, code::OK));
        assert_eq!(offset_of(rest).unwrap(), 1234);

        let credit = Bytes::from(vec![0x80, 0x09, 0, 1, 0, 0x04, 3]);
        assert_eq!(
            parse(credit).unwrap(),
            Incoming::CreditRefused {
                code: 4,
                subscription: 3
            }
        );
        let update = {
            let mut b = vec![0x00, 0x10, 0, 1, 0, 0x06];
            b.put_i16(6);
            b.put_slice(b"orders");
            Bytes::from(b)
        };
        assert_eq!(
            parse(update).unwrap(),
            Incoming::MetadataUpdate {
                code: code::STREAM_NOT_AVAILABLE,
                stream: "orders".into()
            }
        );
        assert_eq!(
            parse(Bytes::from_static(&[0x00, 0x17, 0, 1])).unwrap(),
            Incoming::Heartbeat
        );
        assert_eq!(
            parse(Bytes::from_static(&[0x00, 0x14, 0])).unwrap_err(),
            WireError::Truncated("the version")
        );
    }

    #[test]
    fn metadata_names_the_listeners_of_a_streams_members() {
        let mut b = Vec::new();
        b.put_u32(2);
        for (reference, host, port) in [(0u16, "node-a", 5552u32), (1, "node-b", 5553)] {
            b.put_u16(reference);
            b.put_i16(host.len() as i16);
            b.put_slice(host.as_bytes());
            b.put_u32(port);
        }
        b.put_u32(1);
        b.put_i16(6);
        b.put_slice(b"orders");
        b.put_u16(code::OK);
        b.put_u16(1);
        b.put_u32(1);
        b.put_u16(0);
        let members = members_of(Bytes::from(b.clone()), "orders").unwrap();
        assert_eq!(members.leader, Some(("node-b".into(), 5553)));
        assert_eq!(members.replicas, vec![("node-a".into(), 5552)]);
        let other = members_of(Bytes::from(b), "invoices").unwrap();
        assert_eq!(other.code, code::STREAM_DOES_NOT_EXIST);
    }

    #[test]
    fn a_chunk_yields_its_messages_in_order_with_their_first_offset() {
        let chunk = parse_chunk(Bytes::from(chunk_bytes(100, &[b"a", b"bc", b""]))).unwrap();
        assert_eq!(chunk.first_offset, 100);
        assert_eq!(chunk.kind, 0);
        assert_eq!(
            chunk.records,
            vec![
                Bytes::from_static(b"a"),
                Bytes::from_static(b"bc"),
                Bytes::new()
            ]
        );
        // Cut anywhere, it is an error naming what was cut, never a panic.
        let whole = chunk_bytes(100, &[b"abc", b"de"]);
        for cut in 0..whole.len() {
            assert!(
                parse_chunk(Bytes::from(whole[..cut].to_vec())).is_err(),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn an_uncompressed_sub_batch_is_read_and_a_compressed_one_named() {
        let batch = |compression: u8| {
            let mut records = Vec::new();
            for message in [&b"x"[..], b"yz"] {
                records.put_u32(message.len() as u32);
                records.put_slice(message);
            }
            let mut chunk = chunk_bytes(7, &[]);
            // One entry: the sub-batch.
            chunk[2..4].copy_from_slice(&1u16.to_be_bytes());
            chunk.put_u8(0x80 | (compression << 4));
            chunk.put_u16(2);
            chunk.put_u32(records.len() as u32);
            chunk.put_u32(records.len() as u32);
            chunk.extend_from_slice(&records);
            Bytes::from(chunk)
        };
        let read = parse_chunk(batch(0)).unwrap();
        assert_eq!(
            read.records,
            vec![Bytes::from_static(b"x"), Bytes::from_static(b"yz")]
        );
        assert_eq!(
            parse_chunk(batch(1)).unwrap_err(),
            WireError::Compressed {
                first_offset: 7,
                compression: 1
            }
        );
    }
}
