//! W3C trace context (`traceparent`, `tracestate`): pure parsing, writing
//! and the ids of new spans. The AceMQ contract carries both as unprefixed
//! application headers; every library continues the trace of the message it
//! consumes, and so does the host, whether it exports spans or not.

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

/// A `traceparent`: the trace, the span that is the parent of whatever
/// reads it, and the trace flags (bit 0: sampled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

/// The flags of a trace the host starts: sampled. Nothing is recorded
/// unless export is on, and a downstream service that exports keeps it.
const SAMPLED: u8 = 0x01;

impl TraceParent {
    /// Reads a `traceparent` header as W3C Trace Context level 1 says:
    /// `00-{32 hex}-{16 hex}-{2 hex}`, lowercase, neither id all zeros,
    /// version `ff` invalid. A later version is read by its first four
    /// fields when what follows them starts with `-`. `None` when the value
    /// is not one: the delivery then starts a trace of its own.
    ///
    /// Read as bytes, by position: any text a producer sends (a character
    /// of several bytes where a digit belongs, say) is simply not one.
    pub fn parse(text: &str) -> Option<Self> {
        Self::parse_bytes(text.trim().as_bytes())
    }

    /// [`TraceParent::parse`] over the header's bytes (already trimmed).
    pub fn parse_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < 55 {
            return None;
        }
        let version = &bytes[0..2];
        if bytes.len() > 55 && (version == b"00" || bytes[55] != b'-') {
            return None;
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' || version == b"ff" {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        let mut flag = [0u8; 1];
        let mut version_byte = [0u8; 1];
        lower_hex(version, &mut version_byte)?;
        lower_hex(&bytes[3..35], &mut trace_id)?;
        lower_hex(&bytes[36..52], &mut span_id)?;
        lower_hex(&bytes[53..55], &mut flag)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            flags: flag[0],
        })
    }

    /// A new trace, its first span: what a delivery without a (valid)
    /// `traceparent` continues from.
    pub fn new_trace() -> Self {
        Self {
            trace_id: nonzero(random_id),
            span_id: nonzero(random_id),
            flags: SAMPLED,
        }
    }

    /// A new span of the same trace, with the same flags.
    pub fn child(&self) -> Self {
        Self {
            trace_id: self.trace_id,
            span_id: nonzero(random_id),
            flags: self.flags,
        }
    }

    /// Whether the trace is sampled (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// The header value, version `00`: `00-<trace id>-<span id>-<flags>`.
    /// Written into one buffer: formatted through `fmt`, a byte at a time,
    /// it was about 1 % of the host's CPU on the transform path (one per
    /// output).
    pub fn header(&self) -> String {
        let mut text = [b'-'; HEADER_LEN];
        text[..2].copy_from_slice(b"00");
        put_hex(&self.trace_id, &mut text[3..35]);
        put_hex(&self.span_id, &mut text[36..52]);
        put_hex(&[self.flags], &mut text[53..]);
        text.iter().copied().map(char::from).collect()
    }

    /// The trace id as 32 lowercase hex digits (as logs and backends show it).
    pub fn trace_id_hex(&self) -> TraceIdHex {
        TraceIdHex(self.trace_id)
    }
}

/// Decodes lowercase hex of exactly `out`'s length (the W3C format allows
/// no uppercase).
fn lower_hex(digits: &[u8], out: &mut [u8]) -> Option<()> {
    if digits.len() != out.len() * 2 || digits.iter().any(u8::is_ascii_uppercase) {
        return None;
    }
    hex::decode_to_slice(digits, out).ok()
}

/// Random ids are never all zeros (an invalid id); one draw in 2^64 retries.
fn nonzero<const N: usize>(draw: fn() -> [u8; N]) -> [u8; N] {
    loop {
        let id = draw();
        if id != [0; N] {
            return id;
        }
    }
}

thread_local! {
    /// Ids only need to be unique and unguessable enough to keep traces
    /// apart, not secret (W3C Trace Context asks for random, not for
    /// cryptographic): a small generator seeded from the OS per thread, as
    /// OpenTelemetry's own SDK does. `rand::random`'s ChaCha, reseeded, was
    /// 1 % of the host's CPU on the echo path (a trace and a span id per
    /// delivery).
    static IDS: std::cell::RefCell<SmallRng> = std::cell::RefCell::new(SmallRng::from_os_rng());
}

/// `N` random bytes for an id.
fn random_id<const N: usize>() -> [u8; N] {
    IDS.with(|ids| {
        let mut id = [0u8; N];
        ids.borrow_mut().fill_bytes(&mut id);
        id
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_header_is_read_and_written_back_unchanged() {
        let parent = TraceParent::parse(EXAMPLE).unwrap();
        assert_eq!(
            parent.trace_id_hex().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(hex::encode(parent.span_id), "00f067aa0ba902b7");
        assert!(parent.sampled());
        assert_eq!(parent.header(), EXAMPLE);
    }

    #[test]
    fn invalid_headers_are_not_continued() {
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn characters_of_several_bytes_anywhere_are_not_a_traceparent() {
        // Where the old reader sliced text by byte position and panicked.
        // 55 bytes each, a two-byte character across a field's edge.
        for bad in [
            "0é4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473é00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bé01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-é",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\u{1F600}",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }

    proptest::proptest! {
        /// No text panics the reader; what it reads writes back the same.
        #[test]
        fn any_text_is_read_without_panicking(text in "\\PC{0,70}", bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..70)) {
            if let Some(parent) = TraceParent::parse(&text) {
                proptest::prop_assert_eq!(TraceParent::parse(&parent.header()), Some(parent));
            }
            let _ = TraceParent::parse_bytes(&bytes);
        }

        /// A valid header with any characters in place of some of its own
        /// is read or refused, never a panic (the same length in bytes
        /// puts a character across every field edge in turn).
        #[test]
        fn a_valid_header_with_characters_replaced_never_panics(
            at in 0usize..55,
            c in proptest::prelude::any::<char>(),
        ) {
            let width = c.len_utf8().min(55 - at);
            let mut text = EXAMPLE.as_bytes().to_vec();
            let mut encoded = [0u8; 4];
            let encoded = c.encode_utf8(&mut encoded).as_bytes();
            if width == encoded.len() {
                text.splice(at..at + width, encoded.iter().copied());
            }
            if let Ok(text) = String::from_utf8(text) {
                let _ = TraceParent::parse(&text);
            }
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_first_fields() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more";
        let parent = TraceParent::parse(later).unwrap();
        assert!(!parent.sampled());
        assert_eq!(
            parent.header(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
        );
    }

    #[test]
    fn a_child_keeps_the_trace_and_flags_with_a_new_span() {
        let parent = TraceParent::parse(EXAMPLE).unwrap();
        let child = parent.child();
        assert_eq!(child.trace_id, parent.trace_id);
        assert_eq!(child.flags, parent.flags);
        assert_ne!(child.span_id, parent.span_id);
        assert_eq!(TraceParent::parse(&child.header()), Some(child));
    }

    #[test]
    fn new_traces_differ_and_are_sampled() {
        let (a, b) = (TraceParent::new_trace(), TraceParent::new_trace());
        assert_ne!(a.trace_id, b.trace_id);
        assert!(a.sampled());
        assert_eq!(TraceParent::parse(&a.header()), Some(a));
    }
}

/// A trace id shown as 32 lowercase hex digits, written only when a log
/// line is (no string per delivery).
#[derive(Debug, Clone, Copy)]
pub struct TraceIdHex(pub [u8; 16]);

impl std::fmt::Display for TraceIdHex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut digits = [0_u8; 32];
        put_hex(&self.0, &mut digits);
        digits
            .iter()
            .try_for_each(|&digit| std::fmt::Write::write_char(f, char::from(digit)))
    }
}

/// Characters of a version-00 `traceparent`: 2 + 1 + 32 + 1 + 16 + 1 + 2.
const HEADER_LEN: usize = 55;

/// Writes `bytes` as lowercase hex into `out`, two digits a byte (`out`
/// holds exactly that many).
fn put_hex(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    debug_assert_eq!(out.len(), bytes.len() * 2);
    for (byte, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0x0f)];
    }
}
