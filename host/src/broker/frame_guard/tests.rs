//! The guard against the parser lapin reads frames with (amq-protocol):
//! what it lets through is byte for byte what arrived, what it rewrites is
//! always readable, and nothing a producer sends makes it panic.

use std::pin::Pin;
use std::task::{Context, Poll};

use amq_protocol::frame::{AMQPFrame, parse_frame};
use amq_protocol::protocol::{AMQPClass, basic};
use amq_protocol::types::{AMQPValue, FieldTable};
use futures::io::{AsyncRead, AsyncReadExt as _};
use proptest::prelude::*;

use super::repair::{MAX_DEPTH, quoted};
use super::transport::Guarded;
use super::*;

// ------------------------------------------------------- frames by hand

fn short(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(bytes.len() as u8);
    out.extend_from_slice(bytes);
}

fn long(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
    frame_of(kind, channel, payload)
}

/// A header table's entries: (name, encoded value with its tag).
fn entries(items: &[(&[u8], Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in items {
        short(&mut out, name);
        out.extend_from_slice(value);
    }
    out
}

fn long_string(text: &[u8]) -> Vec<u8> {
    let mut out = vec![b'S'];
    long(&mut out, text);
    out
}

fn nested_table(entries: &[u8]) -> Vec<u8> {
    let mut out = vec![b'F'];
    long(&mut out, entries);
    out
}

fn array(items: &[Vec<u8>]) -> Vec<u8> {
    let mut out = vec![b'A'];
    long(&mut out, &items.concat());
    out
}

#[derive(Default, Clone)]
struct Props {
    content_type: Option<Vec<u8>>,
    headers: Option<Vec<u8>>,
    delivery_mode: Option<u8>,
    message_id: Option<Vec<u8>>,
    timestamp: Option<u64>,
}

fn content_header(channel: u16, body_size: u64, props: &Props) -> Vec<u8> {
    let mut payload = Vec::new();
    payload.extend_from_slice(&60u16.to_be_bytes());
    payload.extend_from_slice(&0u16.to_be_bytes());
    payload.extend_from_slice(&body_size.to_be_bytes());
    let mut flags = 0u16;
    let mut rest = Vec::new();
    if let Some(ct) = &props.content_type {
        flags |= 1 << 15;
        short(&mut rest, ct);
    }
    if let Some(h) = &props.headers {
        flags |= 1 << 13;
        long(&mut rest, h);
    }
    if let Some(mode) = props.delivery_mode {
        flags |= 1 << 12;
        rest.push(mode);
    }
    if let Some(id) = &props.message_id {
        flags |= 1 << 7;
        short(&mut rest, id);
    }
    if let Some(ts) = props.timestamp {
        flags |= 1 << 6;
        rest.extend_from_slice(&ts.to_be_bytes());
    }
    payload.extend_from_slice(&flags.to_be_bytes());
    payload.extend_from_slice(&rest);
    frame(2, channel, &payload)
}

fn deliver(channel: u16, tag: u64, exchange: &[u8], routing_key: &[u8]) -> Vec<u8> {
    let mut payload = Vec::new();
    payload.extend_from_slice(&60u16.to_be_bytes());
    payload.extend_from_slice(&60u16.to_be_bytes());
    short(&mut payload, b"ctag-1");
    payload.extend_from_slice(&tag.to_be_bytes());
    payload.push(0);
    short(&mut payload, exchange);
    short(&mut payload, routing_key);
    frame(1, channel, &payload)
}

fn body(channel: u16, bytes: &[u8]) -> Vec<u8> {
    frame(3, channel, bytes)
}

fn tune(frame_max: u32) -> Vec<u8> {
    let mut payload = Vec::new();
    payload.extend_from_slice(&10u16.to_be_bytes());
    payload.extend_from_slice(&30u16.to_be_bytes());
    payload.extend_from_slice(&2047u16.to_be_bytes());
    payload.extend_from_slice(&frame_max.to_be_bytes());
    payload.extend_from_slice(&10u16.to_be_bytes());
    frame(1, 0, &payload)
}

const HEARTBEAT: [u8; 8] = [8, 0, 0, 0, 0, 0, 0, 0xCE];

// ------------------------------------------------------------- running

/// A socket that hands out its bytes in the given sizes, round and round.
struct Chunked {
    data: Vec<u8>,
    at: usize,
    sizes: Vec<usize>,
    turn: usize,
}

impl AsyncRead for Chunked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        out: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        let size = self.sizes[self.turn % self.sizes.len()].max(1);
        self.turn += 1;
        let n = size.min(out.len()).min(self.data.len() - self.at);
        let at = self.at;
        out[..n].copy_from_slice(&self.data[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(n))
    }
}

/// What lapin reads through a guard from a socket sending `input` in
/// pieces of `sizes`, with reads of at most `read_size`.
fn through_guard(input: &[u8], sizes: &[usize], read_size: usize, frame_max: u32) -> Vec<u8> {
    let socket = Chunked {
        data: input.to_vec(),
        at: 0,
        sizes: sizes.to_vec(),
        turn: 0,
    };
    let mut guarded = Guarded::new(socket, frame_max);
    let mut out = Vec::new();
    let mut buf = vec![0u8; read_size.max(1)];
    futures::executor::block_on(async {
        loop {
            let n = guarded.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
    });
    out
}

fn guarded(input: &[u8]) -> Vec<u8> {
    through_guard(input, &[input.len()], 1 << 20, 0)
}

/// Every frame amq-protocol reads from `bytes`; fails on what it cannot.
fn parse_all(mut bytes: &[u8]) -> Vec<AMQPFrame> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        match parse_frame(bytes) {
            Ok((rest, frame)) => {
                frames.push(frame);
                bytes = rest;
            }
            Err(e) => panic!("lapin could not read what the guard passed: {e:?}"),
        }
    }
    frames
}

fn readable(bytes: &[u8]) -> bool {
    let mut bytes = bytes;
    while !bytes.is_empty() {
        match parse_frame(bytes) {
            Ok((rest, _)) => bytes = rest,
            Err(_) => return false,
        }
    }
    true
}

fn headers_of(frame: &AMQPFrame) -> FieldTable {
    match frame {
        AMQPFrame::Header(_, header) => header.properties.headers().clone().unwrap_or_default(),
        other => panic!("not a content header: {other:?}"),
    }
}

fn note_of(frame: &AMQPFrame) -> Option<String> {
    match headers_of(frame).inner().get(UNREADABLE_HEADER) {
        Some(AMQPValue::LongString(text)) => {
            Some(String::from_utf8(text.as_bytes().to_vec()).unwrap())
        }
        None => None,
        Some(other) => panic!("the note is {other:?}"),
    }
}

fn a_delivery(routing_key: &[u8], props: &Props, body_bytes: &[u8]) -> Vec<u8> {
    [
        deliver(1, 7, b"", routing_key),
        content_header(1, body_bytes.len() as u64, props),
        body(1, body_bytes),
    ]
    .concat()
}

fn valid_props() -> Props {
    Props {
        content_type: Some(b"application/json".to_vec()),
        headers: Some(entries(&[
            (b"x-acemq-id", long_string(b"id-1")),
            (
                b"x-death",
                array(&[nested_table(&entries(&[
                    (b"queue", long_string(b"orders")),
                    (b"count", vec![b'l', 0, 0, 0, 0, 0, 0, 0, 1]),
                ]))]),
            ),
        ])),
        delivery_mode: Some(2),
        message_id: Some(b"id-1".to_vec()),
        timestamp: Some(1_770_000_000),
    }
}

// --------------------------------------------------------------- tests

#[test]
fn a_valid_stream_passes_byte_for_byte_however_it_is_cut() {
    let input = [
        tune(131_072),
        a_delivery(b"orders.new", &valid_props(), b"{\"id\":1}"),
        HEARTBEAT.to_vec(),
        a_delivery(b"orders.new", &Props::default(), &[0xff; 300_000]),
    ]
    .concat();
    assert!(readable(&input));
    for sizes in [
        vec![input.len()],
        vec![1],
        vec![3, 7, 1, 4096],
        vec![65_536],
    ] {
        for read_size in [1, 5, 8192, 1 << 20] {
            assert!(
                through_guard(&input, &sizes, read_size, 0) == input,
                "changed with pieces {sizes:?}, reads of {read_size}"
            );
        }
    }
}

#[test]
fn a_routing_key_that_is_not_utf8_is_made_readable_and_noted_in_its_content_header() {
    let input = a_delivery(b"orders.\xff\xfe", &valid_props(), b"body");
    assert!(!readable(&input));
    let out = guarded(&input);
    let frames = parse_all(&out);
    let AMQPFrame::Method(1, AMQPClass::Basic(basic::AMQPMethod::Deliver(d))) = &frames[0] else {
        panic!("{:?}", frames[0]);
    };
    assert_eq!(d.routing_key.as_str(), "orders.??");
    assert_eq!(d.delivery_tag, 7);
    assert_eq!(
        note_of(&frames[1]).unwrap(),
        r#"the routing key is not UTF-8: "orders.\xff\xfe""#
    );
    // The other headers are kept, and the body is untouched.
    assert!(headers_of(&frames[1]).inner().contains_key("x-death"));
    assert_eq!(frames[2], AMQPFrame::Body(1, b"body".to_vec()));
}

#[test]
fn a_property_or_header_name_that_is_not_utf8_is_noted_where_it_is() {
    let props = Props {
        message_id: Some(b"\xffid".to_vec()),
        headers: Some(entries(&[
            (b"good", long_string(b"v")),
            (b"bad\xc3", long_string(b"v")),
            (
                b"outer",
                nested_table(&entries(&[(b"in\xff", long_string(b"v"))])),
            ),
            (
                b"list",
                array(&[
                    long_string(b"a"),
                    nested_table(&entries(&[(b"\xfe", long_string(b"v"))])),
                ]),
            ),
        ])),
        ..Props::default()
    };
    let out = guarded(&a_delivery(b"k", &props, b""));
    let frames = parse_all(&out);
    let note = note_of(&frames[1]).unwrap();
    assert_eq!(
        note,
        [
            r#"the header name "bad\xc3" is not UTF-8"#,
            r#"the header name "in\xff" in the header "outer" is not UTF-8"#,
            r#"the header name "\xfe" in the header "list"[1] is not UTF-8"#,
            r#"its message-id property is not UTF-8: "\xffid""#,
        ]
        .join("; ")
    );
    let AMQPFrame::Header(_, header) = &frames[1] else {
        unreachable!()
    };
    assert_eq!(
        header.properties.message_id().as_ref().unwrap().as_str(),
        "?id"
    );
    let headers = headers_of(&frames[1]);
    assert!(headers.inner().contains_key("good"));
    assert!(headers.inner().contains_key("bad?"));
}

#[test]
fn a_table_it_cannot_walk_keeps_what_came_before_and_says_so() {
    let mut unknown = entries(&[(b"first", long_string(b"v"))]);
    short(&mut unknown, b"second");
    unknown.extend_from_slice(b"Z123");
    let props = Props {
        headers: Some(unknown),
        delivery_mode: Some(2),
        ..Props::default()
    };
    let frames = parse_all(&guarded(&a_delivery(b"k", &props, b"x")));
    let headers = headers_of(&frames[1]);
    assert!(headers.inner().contains_key("first"));
    assert!(!headers.inner().contains_key("second"));
    assert_eq!(
        note_of(&frames[1]).unwrap(),
        r#"the headers could not be read after "first": unknown field type "Z"; the rest of that table was dropped"#
    );
    let AMQPFrame::Header(_, header) = &frames[1] else {
        unreachable!()
    };
    assert_eq!(*header.properties.delivery_mode(), Some(2));
}

#[test]
fn properties_cut_short_or_followed_by_stray_bytes_are_dropped_and_said() {
    let mut header = content_header(
        1,
        0,
        &Props {
            message_id: Some(b"abc".to_vec()),
            ..Props::default()
        },
    );
    // Claim a cluster-id that is not there.
    let flags_at = FRAME_HEADER_BYTES + 12;
    header[flags_at + 1] |= 1 << 2;
    let frames = parse_all(&guarded(&[deliver(1, 1, b"", b"k"), header].concat()));
    assert_eq!(
        note_of(&frames[1]).unwrap(),
        "its cluster-id property and those after it are cut short"
    );

    let mut stray = content_header(1, 0, &Props::default());
    let end = stray.pop().unwrap();
    stray.extend_from_slice(b"xyz");
    stray.push(end);
    let len = (stray.len() - 8) as u32;
    stray[3..7].copy_from_slice(&len.to_be_bytes());
    let frames = parse_all(&guarded(&stray));
    assert_eq!(
        note_of(&frames[0]).unwrap(),
        "3 stray bytes follow its properties"
    );
}

#[test]
fn a_producers_unreadable_header_is_removed_not_believed() {
    let props = Props {
        headers: Some(entries(&[
            (UNREADABLE_HEADER.as_bytes(), long_string(b"forged")),
            (b"kept", long_string(b"v")),
        ])),
        ..Props::default()
    };
    let frames = parse_all(&guarded(&a_delivery(b"k", &props, b"")));
    let headers = headers_of(&frames[1]);
    assert!(!headers.inner().contains_key(UNREADABLE_HEADER));
    assert!(headers.inner().contains_key("kept"));
}

#[test]
fn nesting_past_the_limit_is_cut_without_recursing_through_it() {
    // Far deeper than any stack would take recursively.
    let mut value = long_string(b"bottom");
    for _ in 0..20_000 {
        value = array(&[value]);
    }
    let props = Props {
        headers: Some(entries(&[(b"deep", value)])),
        ..Props::default()
    };
    let input = a_delivery(b"k", &props, b"");
    let out = through_guard(&input, &[input.len()], 1 << 20, 1 << 20);
    let frames = parse_all(&out);
    let note = note_of(&frames[1]).unwrap();
    assert!(
        note.starts_with(r#"the headers in the header "deep"[0][0]"#)
            && note.ends_with(&format!(
                "nest deeper than {MAX_DEPTH} levels; what is deeper was dropped"
            )),
        "{note}"
    );
}

#[test]
fn a_rewrite_never_passes_the_connections_frame_max() {
    let frame_max = 4096;
    // Headers that fill the frame, with one bad name: the note cannot be
    // added beside them.
    let filler = vec![b'a'; 4040];
    let props = Props {
        headers: Some(entries(&[(b"\xff", long_string(&filler))])),
        ..Props::default()
    };
    let header = content_header(1, 0, &props);
    assert!(header.len() <= frame_max as usize);
    let input = [tune(frame_max), deliver(1, 1, b"", b"k"), header].concat();
    let out = through_guard(&input, &[input.len()], 1 << 20, 0);
    let frames = parse_all(&out);
    let rewritten = &out[tune(frame_max).len() + deliver(1, 1, b"", b"k").len()..];
    assert!(rewritten.len() <= frame_max as usize, "{}", rewritten.len());
    let headers = headers_of(&frames[2]);
    assert_eq!(headers.inner().len(), 1, "only the note is left");
    assert!(
        note_of(&frames[2])
            .unwrap()
            .contains("its other headers were dropped")
    );
}

#[test]
fn a_note_belongs_to_its_own_channels_delivery() {
    // Channel 1's bad routing key; channel 2's delivery in between is clean.
    let input = [
        deliver(1, 1, b"", b"\xff"),
        deliver(2, 1, b"", b"fine"),
        content_header(2, 0, &Props::default()),
        content_header(1, 0, &Props::default()),
    ]
    .concat();
    let out = guarded(&input);
    let frames = parse_all(&out);
    assert_eq!(note_of(&frames[2]), None);
    assert!(note_of(&frames[3]).unwrap().contains("routing key"));
    // Channel 2's frames passed as they were.
    let two = [
        deliver(2, 1, b"", b"fine"),
        content_header(2, 0, &Props::default()),
    ]
    .concat();
    assert!(out.windows(two.len()).any(|w| w == two));
}

#[test]
fn quoted_bytes_show_text_as_text_and_the_rest_escaped() {
    assert_eq!(quoted(b"ab\"c"), r#""ab\"c""#);
    assert_eq!(quoted("é\u{1}".as_bytes()), r#""é\u{1}""#);
    assert_eq!(quoted(&[b'a', 0xff]), r#""a\xff""#);
    assert!(quoted(&[b'x'; 100]).ends_with("(and 52 more bytes)"));
}

// ---------------------------------------------------------- properties

/// A field value, valid or not, as bytes with its tag.
fn any_value(depth: u32) -> impl Strategy<Value = Vec<u8>> {
    let leaf = prop_oneof![
        any::<Vec<u8>>().prop_map(|b| long_string(&b)),
        any::<[u8; 8]>().prop_map(|b| [&[b'l'][..], &b].concat()),
        any::<u8>().prop_map(|b| vec![b't', b]),
        Just(vec![b'V']),
        // Anything at all, an unknown tag included.
        proptest::collection::vec(any::<u8>(), 0..6),
    ];
    leaf.prop_recursive(depth, 64, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(
                (proptest::collection::vec(any::<u8>(), 0..6), inner.clone()),
                0..4
            )
            .prop_map(|items| {
                let mut table = Vec::new();
                for (name, value) in items {
                    short(&mut table, &name);
                    table.extend_from_slice(&value);
                }
                nested_table(&table)
            }),
            proptest::collection::vec(inner, 0..4).prop_map(|items| array(&items)),
        ]
    })
}

fn any_table() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        (
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..8),
                "[a-z-]{1,12}".prop_map(String::into_bytes),
            ],
            any_value(3),
        ),
        0..5,
    )
    .prop_map(|items| {
        let mut table = Vec::new();
        for (name, value) in items {
            short(&mut table, &name);
            table.extend_from_slice(&value);
        }
        table
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever a producer puts in the headers and properties: no panic,
    /// and lapin reads what comes out; what lapin could read already
    /// passes unchanged.
    #[test]
    fn any_content_header_comes_out_readable_and_a_readable_one_unchanged(
        table in any_table(),
        routing_key in proptest::collection::vec(any::<u8>(), 0..10),
        message_id in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..10)),
        cut in 0usize..4,
        sizes in proptest::collection::vec(1usize..50, 1..4),
    ) {
        let props = Props { headers: Some(table), message_id, ..Props::default() };
        let mut header = content_header(1, 3, &props);
        // Sometimes a payload that stops early (its size fixed to match).
        if cut > 0 && header.len() > 8 + 14 + cut {
            let end = header.pop().unwrap();
            header.truncate(header.len() - cut);
            header.push(end);
            let len = (header.len() - 8) as u32;
            header[3..7].copy_from_slice(&len.to_be_bytes());
        }
        let input = [deliver(1, 9, b"", &routing_key), header, body(1, b"abc")].concat();
        let out = through_guard(&input, &sizes, 7, 0);
        let frames = parse_all(&out);
        prop_assert_eq!(frames.len(), 3);
        prop_assert_eq!(&frames[2], &AMQPFrame::Body(1, b"abc".to_vec()));
        if readable(&input) {
            prop_assert!(out == input, "a readable delivery was changed");
        } else {
            prop_assert!(note_of(&frames[1]).is_some(), "a rewrite without a note");
        }
    }

    /// Random bytes as a whole stream: the guard never panics and hands on
    /// exactly as many frames' worth of bytes as it judged.
    #[test]
    fn random_bytes_never_make_the_guard_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
        sizes in proptest::collection::vec(1usize..64, 1..4),
    ) {
        let _ = through_guard(&bytes, &sizes, 13, 0);
    }
}
