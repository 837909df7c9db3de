//! A minimal raw AMQP 0-9-1 publisher, for tests only.
//!
//! AMQP short strings (exchange, routing key, field-table keys, and basic
//! properties such as message-id and content-type) are a length octet plus
//! raw octets: nothing on the wire makes them UTF-8. lapin models them as
//! Rust `String`s, so it cannot send a non-UTF-8 one. Other clients do
//! (Python's pika writes a `bytes` value as-is), and RabbitMQ (3.10) passes
//! them on: basic.publish's exchange and routing key and the whole content
//! header (properties, header tables) are not checked, and are delivered byte
//! for byte. (Other methods' short strings are: a non-UTF-8 queue name or
//! binding key gets connection.close 501 FRAME_ERROR.) So a consumer host
//! must cope with such poison messages, and this module writes the frames by
//! hand so tests can publish exactly those bytes.
//!
//! Scope: one connection, channel 1, publisher confirms, publish only. No TLS
//! and no heartbeats (we ask for none). Each message is confirmed before the
//! next one is sent, so an error names the message that caused it.

use anyhow::{Context, Result, anyhow, bail, ensure};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A header value as written on the wire.
#[derive(Clone, Debug)]
pub enum RawValue {
    LongString(Vec<u8>),
    I32(i32),
    I64(i64),
    /// A nested table ('F'), its names as raw bytes too.
    Table(Vec<(Vec<u8>, RawValue)>),
}

/// One message with every short-string field given as raw bytes.
#[derive(Clone, Debug)]
pub struct RawMessage {
    pub exchange: Vec<u8>,
    pub routing_key: Vec<u8>,
    pub message_id: Option<Vec<u8>>,
    pub content_type: Option<Vec<u8>>,
    /// Field-table keys as raw bytes. Left out of the frame when empty.
    pub headers: Vec<(Vec<u8>, RawValue)>,
    pub body: Vec<u8>,
}

const FRAME_METHOD: u8 = 1;
const FRAME_HEADER: u8 = 2;
const FRAME_BODY: u8 = 3;
const FRAME_HEARTBEAT: u8 = 8;
const FRAME_END: u8 = 0xCE;
/// type (1) + channel (2) + size (4) + frame-end (1): a body frame carries at
/// most frame_max - 8 bytes of the body.
const FRAME_OVERHEAD: u32 = 8;
const DEFAULT_FRAME_MAX: u32 = 131_072;
/// Bound on inbound frames before tune; the broker's frames are tiny.
const MAX_INBOUND: u32 = 1 << 24;
const CHANNEL: u16 = 1;
/// Bound on the whole call, so a test never hangs on a silent broker.
const TIMEOUT: Duration = Duration::from_secs(30);
const PRODUCT: &[u8] = b"acemq-tests raw publisher";

// Basic property flags, most significant bit first; the present properties
// follow the flags word in this same order.
const PROP_CONTENT_TYPE: u16 = 0x8000;
const PROP_HEADERS: u16 = 0x2000;
const PROP_DELIVERY_MODE: u16 = 0x1000;
const PROP_MESSAGE_ID: u16 = 0x0080;

/// Connects (PLAIN auth, vhost), opens channel 1, enables publisher confirms,
/// publishes each message and waits for its basic.ack, then closes cleanly.
/// Fails on basic.nack and on a connection.close or channel.close from the
/// broker (the error holds its reply code and text).
pub async fn publish_raw(
    host: &str,
    port: u16,
    user: &str,
    password: &str,
    vhost: &str,
    messages: &[RawMessage],
) -> Result<()> {
    let run = async {
        let mut conn = Conn::open(host, port, user, password, vhost).await?;
        for (i, message) in messages.iter().enumerate() {
            let tag = i as u64 + 1; // confirm delivery tags count from 1
            if let Err(e) = conn.publish(message, tag).await {
                conn.abort().await;
                return Err(e.context(format!("message {tag} of {}", messages.len())));
            }
        }
        conn.close().await
    };
    tokio::time::timeout(TIMEOUT, run)
        .await
        .map_err(|_| anyhow!("timed out after {TIMEOUT:?}"))?
        .with_context(|| format!("raw AMQP publish to {host}:{port} vhost {vhost:?}"))
}

struct Conn {
    io: BufReader<TcpStream>,
    frame_max: u32,
    /// The broker closed the connection: nothing more may be sent.
    closed: bool,
}

impl Conn {
    async fn open(host: &str, port: u16, user: &str, pass: &str, vhost: &str) -> Result<Conn> {
        let stream = TcpStream::connect((host, port))
            .await
            .with_context(|| format!("connecting to {host}:{port}"))?;
        stream.set_nodelay(true)?;
        let mut c = Conn {
            io: BufReader::new(stream),
            frame_max: MAX_INBOUND,
            closed: false,
        };
        // "AMQP", then protocol id 0 and version 0-9-1.
        c.write(b"AMQP\0\x00\x09\x01").await?;
        c.expect(0, 10, 10).await.context("connection.start")?;

        // start-ok: client-properties, mechanism, response, locale.
        let mut caps = Vec::new();
        for cap in [&b"publisher_confirms"[..], b"authentication_failure_close"] {
            put_short(&mut caps, cap)?;
            caps.extend([b't', 1]);
        }
        let mut props = Vec::new();
        put_short(&mut props, b"product")?;
        props.push(b'S');
        put_long(&mut props, PRODUCT)?;
        put_short(&mut props, b"capabilities")?;
        props.push(b'F');
        put_long(&mut props, &caps)?; // a table is a u32 byte count + entries
        let mut args = Vec::new();
        put_long(&mut args, &props)?;
        put_short(&mut args, b"PLAIN")?;
        put_long(&mut args, format!("\0{user}\0{pass}").as_bytes())?;
        put_short(&mut args, b"en_US")?;
        c.send(0, 10, 11, &args).await?;

        // With the authentication_failure_close capability a bad login gets
        // connection.close 403 here, not just a dropped socket.
        let tune = c.expect(0, 10, 30).await.context("connection.tune")?;
        let mut r = &tune[..];
        let channel_max = get_u16(&mut r)?;
        let frame_max = get_u32(&mut r)?;
        // 0 means "no limit" for both; we use only channel 1 anyway.
        let channel_max = if channel_max == 0 { 1 } else { channel_max };
        c.frame_max = if frame_max == 0 {
            DEFAULT_FRAME_MAX
        } else {
            frame_max
        };
        ensure!(
            c.frame_max > FRAME_OVERHEAD,
            "frame_max {frame_max} too small"
        );
        let mut args = channel_max.to_be_bytes().to_vec();
        args.extend(c.frame_max.to_be_bytes());
        args.extend(0u16.to_be_bytes()); // heartbeat: none
        c.send(0, 10, 31, &args).await?;

        // connection.open: vhost, reserved shortstr, reserved bit (insist).
        let mut args = Vec::new();
        put_short(&mut args, vhost.as_bytes())?;
        args.extend([0, 0]);
        c.send(0, 10, 40, &args).await?;
        c.expect(0, 10, 41).await.context("connection.open")?;

        c.send(CHANNEL, 20, 10, &[0]).await?; // reserved shortstr ""
        c.expect(CHANNEL, 20, 11).await.context("channel.open")?;
        c.send(CHANNEL, 85, 10, &[0]).await?; // nowait = false
        c.expect(CHANNEL, 85, 11).await.context("confirm.select")?;
        Ok(c)
    }

    /// Sends one message as basic.publish + content header + body frames, in
    /// one write, then waits for the broker's confirm of `tag`.
    async fn publish(&mut self, m: &RawMessage, tag: u64) -> Result<()> {
        let mut args = vec![0, 0]; // reserved (ticket)
        put_short(&mut args, &m.exchange).context("exchange")?;
        put_short(&mut args, &m.routing_key).context("routing key")?;
        args.push(0); // mandatory = immediate = false

        let mut out = Vec::new();
        put_frame(&mut out, FRAME_METHOD, CHANNEL, &method(60, 40, &args));
        put_frame(&mut out, FRAME_HEADER, CHANNEL, &content_header(m)?);
        // An empty body has no body frame at all.
        for chunk in m.body.chunks((self.frame_max - FRAME_OVERHEAD) as usize) {
            put_frame(&mut out, FRAME_BODY, CHANNEL, chunk);
        }
        self.write(&out).await?;

        loop {
            let (ch, class, id, args) = self.next_method().await?;
            let mut r = &args[..];
            match (ch, class, id) {
                (CHANNEL, 60, 80) => {
                    // basic.ack: delivery-tag, then bit "multiple". Tags
                    // below ours would be for earlier, already-acked ones.
                    if get_u64(&mut r)? >= tag {
                        return Ok(());
                    }
                }
                (CHANNEL, 60, 120) => bail!("broker nacked it (basic.nack)"),
                _ => bail!("unexpected method {class}.{id} on channel {ch} awaiting confirm"),
            }
        }
    }

    async fn close(mut self) -> Result<()> {
        // reply-code 200, reply-text "", failing class 0, method 0.
        let args = [0, 200, 0, 0, 0, 0, 0];
        self.send(CHANNEL, 20, 40, &args).await?;
        self.expect(CHANNEL, 20, 41)
            .await
            .context("channel.close")?;
        self.send(0, 10, 50, &args).await?;
        self.expect(0, 10, 51).await.context("connection.close")?;
        Ok(())
    }

    /// Best-effort connection.close after an error, so the broker does not
    /// log an abrupt disconnect.
    async fn abort(mut self) {
        if !self.closed {
            let close = async {
                self.send(0, 10, 50, &[0, 200, 0, 0, 0, 0, 0]).await?;
                self.expect(0, 10, 51).await
            };
            let _ = tokio::time::timeout(Duration::from_secs(2), close).await;
        }
    }

    async fn send(&mut self, ch: u16, class: u16, id: u16, args: &[u8]) -> Result<()> {
        let mut out = Vec::new();
        put_frame(&mut out, FRAME_METHOD, ch, &method(class, id, args));
        self.write(&out).await
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let Err(e) = self.io.get_mut().write_all(bytes).await else {
            return Ok(());
        };
        // A broker that closed the connection may have sent its reason
        // first; that says more than a broken pipe does.
        let reason = tokio::time::timeout(Duration::from_secs(1), self.next_method()).await;
        match reason {
            Ok(Err(reason)) => Err(reason.context(format!("writing to the broker: {e}"))),
            _ => Err(anyhow::Error::new(e).context("writing to the broker")),
        }
    }

    async fn expect(&mut self, ch: u16, class: u16, id: u16) -> Result<Vec<u8>> {
        let (got_ch, got_class, got_id, args) = self.next_method().await?;
        ensure!(
            (got_ch, got_class, got_id) == (ch, class, id),
            "expected method {class}.{id} on channel {ch}, got {got_class}.{got_id} on channel {got_ch}"
        );
        Ok(args)
    }

    /// The next method frame as (channel, class, method, arguments). Skips
    /// heartbeats; turns a connection.close or channel.close from the broker
    /// into an error, after answering it with close-ok as the spec asks.
    async fn next_method(&mut self) -> Result<(u16, u16, u16, Vec<u8>)> {
        loop {
            let (kind, ch, payload) = self.read_frame().await?;
            match kind {
                FRAME_HEARTBEAT => continue,
                FRAME_METHOD => {}
                _ => bail!("unexpected frame type {kind} on channel {ch}"),
            }
            let mut r = &payload[..];
            let (class, id) = (get_u16(&mut r)?, get_u16(&mut r)?);
            if (class, id) != (10, 50) && (class, id) != (20, 40) {
                return Ok((ch, class, id, r.to_vec()));
            }
            let code = get_u16(&mut r)?;
            let text = String::from_utf8_lossy(get_short(&mut r)?).into_owned();
            let (cause_class, cause_id) = (get_u16(&mut r)?, get_u16(&mut r)?);
            let what = if class == 10 { "connection" } else { "channel" };
            self.closed |= class == 10;
            // close-ok is method 51 (connection) or 41 (channel).
            let mut ok = Vec::new();
            put_frame(&mut ok, FRAME_METHOD, ch, &method(class, id + 1, &[]));
            let _ = self.io.get_mut().write_all(&ok).await;
            bail!("broker closed the {what}: {code} {text} (on method {cause_class}.{cause_id})");
        }
    }

    async fn read_frame(&mut self) -> Result<(u8, u16, Vec<u8>)> {
        let mut head = [0u8; 7];
        self.io
            .read_exact(&mut head)
            .await
            .context("reading a frame (did the broker close the connection?)")?;
        // A broker that refuses our protocol version answers with its own
        // protocol header and closes.
        ensure!(
            &head[..4] != b"AMQP",
            "broker rejected the protocol header: {head:?}"
        );
        let ch = u16::from_be_bytes([head[1], head[2]]);
        let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]);
        ensure!(
            size <= self.frame_max,
            "frame of {size} bytes exceeds frame_max"
        );
        let mut payload = vec![0; size as usize + 1];
        self.io
            .read_exact(&mut payload)
            .await
            .context("reading a frame")?;
        ensure!(
            payload.pop() == Some(FRAME_END),
            "frame does not end with 0xCE"
        );
        Ok((head[0], ch, payload))
    }
}

/// Content header: class, weight (always 0), body size, property flags, then
/// the present properties in flag order (content-type, headers,
/// delivery-mode, message-id here).
fn content_header(m: &RawMessage) -> Result<Vec<u8>> {
    let mut h = 60u16.to_be_bytes().to_vec();
    h.extend(0u16.to_be_bytes());
    h.extend((m.body.len() as u64).to_be_bytes());
    let mut flags = PROP_DELIVERY_MODE;
    for (on, flag) in [
        (m.content_type.is_some(), PROP_CONTENT_TYPE),
        (!m.headers.is_empty(), PROP_HEADERS),
        (m.message_id.is_some(), PROP_MESSAGE_ID),
    ] {
        if on {
            flags |= flag;
        }
    }
    h.extend(flags.to_be_bytes());
    if let Some(ct) = &m.content_type {
        put_short(&mut h, ct).context("content-type")?;
    }
    if !m.headers.is_empty() {
        put_table(&mut h, &m.headers)?;
    }
    h.push(2); // delivery-mode: persistent
    if let Some(id) = &m.message_id {
        put_short(&mut h, id).context("message-id")?;
    }
    Ok(h)
}

fn method(class: u16, id: u16, args: &[u8]) -> Vec<u8> {
    let mut p = class.to_be_bytes().to_vec();
    p.extend(id.to_be_bytes());
    p.extend_from_slice(args);
    p
}

fn put_frame(out: &mut Vec<u8>, kind: u8, ch: u16, payload: &[u8]) {
    out.push(kind);
    out.extend(ch.to_be_bytes());
    out.extend((payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.push(FRAME_END);
}

/// Short string: u8 length, then the bytes, unchecked (that is the point).
fn put_short(out: &mut Vec<u8>, s: &[u8]) -> Result<()> {
    let len =
        u8::try_from(s.len()).map_err(|_| anyhow!("short string of {} bytes > 255", s.len()))?;
    out.push(len);
    out.extend_from_slice(s);
    Ok(())
}

/// Long string (and table): u32 length, then the bytes.
fn put_long(out: &mut Vec<u8>, s: &[u8]) -> Result<()> {
    out.extend(u32::try_from(s.len())?.to_be_bytes());
    out.extend_from_slice(s);
    Ok(())
}

fn put_table(out: &mut Vec<u8>, entries: &[(Vec<u8>, RawValue)]) -> Result<()> {
    let mut t = Vec::new();
    for (key, value) in entries {
        put_short(&mut t, key).context("header name")?;
        match value {
            RawValue::LongString(s) => {
                t.push(b'S');
                put_long(&mut t, s)?;
            }
            RawValue::I32(n) => {
                t.push(b'I');
                t.extend(n.to_be_bytes());
            }
            // 'l': the signed 64-bit tag RabbitMQ uses (its 0-9-1 errata).
            RawValue::I64(n) => {
                t.push(b'l');
                t.extend(n.to_be_bytes());
            }
            RawValue::Table(entries) => {
                t.push(b'F');
                put_table(&mut t, entries)?;
            }
        }
    }
    put_long(out, &t)
}

fn take<'a>(r: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
    ensure!(r.len() >= n, "method frame too short");
    let (head, rest) = r.split_at(n);
    *r = rest;
    Ok(head)
}

fn get_u16(r: &mut &[u8]) -> Result<u16> {
    Ok(u16::from_be_bytes(take(r, 2)?.try_into()?))
}

fn get_u32(r: &mut &[u8]) -> Result<u32> {
    Ok(u32::from_be_bytes(take(r, 4)?.try_into()?))
}

fn get_u64(r: &mut &[u8]) -> Result<u64> {
    Ok(u64::from_be_bytes(take(r, 8)?.try_into()?))
}

fn get_short<'a>(r: &mut &'a [u8]) -> Result<&'a [u8]> {
    let len = take(r, 1)?[0] as usize;
    take(r, len)
}
