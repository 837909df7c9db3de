//! Sizes the broker enforces on what the host writes, checked before it is
//! written.
//!
//! A content header (the properties, headers included) larger than the
//! connection's negotiated `frame_max` is not a refused message but a
//! protocol error: the broker closes the whole connection, every consumer
//! stops, and on restart the same message does it again. So nothing here
//! trusts a size it did not measure: reasons are cut to
//! [`MAX_REASON_BYTES`] before they are written or logged, and properties
//! are measured before a publish ([`check_frame`]), counted byte for byte
//! as lapin's encoder writes them ([`super::wire_size`]). A set-aside copy
//! is made to fit ([`set_aside_within_frame`]) rather than refused, because
//! it is where a message goes when nothing else can be done with it.

use std::borrow::Cow;

use lapin::BasicProperties;
use lapin::types::FieldTable;

use super::Envelope;
use super::properties::set_aside_properties;

/// Most bytes of a reason the host writes into `x-acemq-error` or a log
/// line (contract §4/§5). Longer ones keep their start and end around a
/// marker naming how much was cut: the start says what went wrong, the end
/// is where a chained cause or a quoted value usually finishes.
pub const MAX_REASON_BYTES: usize = 4096;

/// Bytes of a content header frame besides the encoded properties: the
/// frame header (type 1, channel 2, size 4), class id 2, weight 2, body
/// size 8, and the frame end 1.
pub const HEADER_FRAME_OVERHEAD: usize = 7 + 2 + 2 + 8 + 1;

/// `text` itself when it is at most `max` bytes; otherwise its start and
/// its end around `… [cut N bytes] …`, at most `max` bytes in all, cut on
/// character boundaries. A `max` too small for the marker keeps only the
/// start.
#[must_use]
pub fn truncate_middle(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    // The marker's own length depends on the count it names, which depends
    // on the marker's length: the count is at most text.len(), so a marker
    // naming that many digits is never shorter than the real one.
    let widest = cut_marker(text.len()).len();
    let Some(kept) = max.checked_sub(widest) else {
        return Cow::Owned(text[..floor_boundary(text, max)].to_owned());
    };
    let head = floor_boundary(text, kept - kept / 2);
    let tail = ceil_boundary(text, text.len() - kept / 2);
    let mut out = String::with_capacity(max);
    out.push_str(&text[..head]);
    out.push_str(&cut_marker(tail - head));
    out.push_str(&text[tail..]);
    Cow::Owned(out)
}

/// A reason as the host writes and logs it: [`truncate_middle`] to
/// [`MAX_REASON_BYTES`].
#[must_use]
pub fn bound_reason(reason: &str) -> Cow<'_, str> {
    truncate_middle(reason, MAX_REASON_BYTES)
}

fn cut_marker(cut: usize) -> String {
    format!(" \u{2026} [cut {} bytes] \u{2026} ", thousands(cut))
}

/// `195904` as `195,904`: a count an operator reads at a glance.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn floor_boundary(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn ceil_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

/// Bytes the content header frame carrying `properties` takes on the wire,
/// as the encoder lapin writes it with would write them.
#[must_use]
pub fn header_frame_size(properties: &BasicProperties) -> usize {
    super::wire_size::encoded_properties_len(properties).saturating_add(HEADER_FRAME_OVERHEAD)
}

/// A message whose properties would not fit in one frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "its properties and headers take {size} bytes, more than the {frame_max}-byte frame the broker allows"
)]
pub struct FrameTooSmall {
    pub size: usize,
    pub frame_max: usize,
}

/// Whether `properties` fit in a content header frame of `frame_max` bytes
/// (the connection's negotiated maximum).
pub fn check_frame(properties: &BasicProperties, frame_max: u32) -> Result<(), FrameTooSmall> {
    let size = header_frame_size(properties);
    let frame_max = usize::try_from(frame_max).unwrap_or(usize::MAX);
    if size <= frame_max {
        Ok(())
    } else {
        Err(FrameTooSmall { size, frame_max })
    }
}

/// The properties of a set-aside copy ([`set_aside_properties`]) made to
/// fit a frame of `frame_max` bytes, so the copy lands instead of taking the
/// connection down:
///
/// 1. as they are, when they fit;
/// 2. else with `reason` cut further, to what the frame has room for;
/// 3. else (the original's own headers are too big) with the envelope
///    only, and `x-acemq-error` saying the headers were dropped.
///
/// `None` when even the last does not fit (an envelope field alone larger
/// than the frame): the caller cannot set the copy aside.
#[must_use]
pub fn set_aside_within_frame(
    original: &BasicProperties,
    envelope: &Envelope,
    reason: &str,
    frame_max: u32,
) -> Option<BasicProperties> {
    let reason = bound_reason(reason);
    let full = set_aside_properties(original, envelope, &reason);
    if check_frame(&full, frame_max).is_ok() {
        return Some(full);
    }
    let frame = usize::try_from(frame_max).unwrap_or(usize::MAX);
    if let Some(room) = reason_room(original, envelope, frame) {
        let shorter = set_aside_properties(original, envelope, &truncate_middle(&reason, room));
        if check_frame(&shorter, frame_max).is_ok() {
            return Some(shorter);
        }
    }
    let bare = without_headers(original);
    let header_bytes = header_frame_size(&full).saturating_sub(reason.len());
    let note = format!(
        "the original headers were dropped from this copy: with them it took over {header_bytes} bytes, \
         more than the {frame_max}-byte frame the broker allows; "
    );
    let room = reason_room(&bare, envelope, frame)?;
    let reason = truncate_middle(&reason, room.saturating_sub(note.len()));
    let stripped = set_aside_properties(&bare, envelope, &format!("{note}{reason}"));
    check_frame(&stripped, frame_max).ok().map(|()| stripped)
}

/// Bytes of `x-acemq-error` a set-aside copy of `original` has room for in
/// a frame of `frame` bytes; `None` when there is none.
fn reason_room(original: &BasicProperties, envelope: &Envelope, frame: usize) -> Option<usize> {
    // Measured with a one-byte reason, which the real one replaces.
    let base = header_frame_size(&set_aside_properties(original, envelope, "-"));
    frame.checked_sub(base)?.checked_add(1).filter(|&n| n > 1)
}

/// `original` without its application headers: [`set_aside_properties`]
/// then writes the envelope alone.
fn without_headers(original: &BasicProperties) -> BasicProperties {
    original.clone().with_headers(FieldTable::default())
}

#[cfg(test)]
mod tests {
    use lapin::types::{AMQPValue, LongString};

    use super::*;
    use crate::envelope::test_support::NOW;

    #[test]
    fn short_text_is_kept_whole() {
        assert_eq!(truncate_middle("db down", 4096), "db down");
        assert!(matches!(truncate_middle("", 0), Cow::Borrowed("")));
        let exact = "x".repeat(4096);
        assert_eq!(bound_reason(&exact), exact);
    }

    #[test]
    fn long_text_keeps_its_start_and_end_and_names_the_cut() {
        let text = format!("START{}END", "x".repeat(200_000));
        let cut = bound_reason(&text);
        assert!(cut.len() <= MAX_REASON_BYTES, "{}", cut.len());
        assert!(cut.starts_with("STARTxxx"), "{cut}");
        assert!(cut.ends_with("xxxEND"), "{cut}");
        assert!(cut.contains(" \u{2026} [cut 19"), "{cut}");
        // The bytes kept plus the bytes cut are the whole text.
        let marker_start = cut.find(" \u{2026} [cut ").unwrap();
        let marker_end = cut.rfind(" bytes] \u{2026} ").unwrap() + " bytes] \u{2026} ".len();
        let kept = marker_start + (cut.len() - marker_end);
        let named: usize = cut[marker_start..marker_end]
            .chars()
            .filter(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap();
        assert_eq!(kept + named, text.len());
    }

    #[test]
    fn cuts_fall_on_character_boundaries() {
        for len in [10, 50, 99, 100, 101, 4095, 4096] {
            let text = "\u{e9}\u{1f600}a".repeat(3000);
            let cut = truncate_middle(&text, len);
            assert!(cut.len() <= len, "{len}: {}", cut.len());
            // A &str: had the cut split a character, building it would
            // have panicked; also check nothing was lost to replacement.
            assert!(!cut.contains('\u{fffd}'));
        }
    }

    #[test]
    fn a_limit_smaller_than_the_marker_keeps_only_the_start() {
        assert_eq!(truncate_middle("\u{e9}\u{e9}\u{e9}", 3), "\u{e9}");
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(195_904), "195,904");
        assert_eq!(thousands(10_000_000), "10,000,000");
    }

    fn delivered(app_header_bytes: usize) -> (BasicProperties, Envelope) {
        let mut app = FieldTable::default();
        app.insert(
            "x-big".into(),
            AMQPValue::LongString(LongString::from("h".repeat(app_header_bytes))),
        );
        let envelope = Envelope::new("order.created", "acemq@test", NOW);
        let properties = BasicProperties::default().with_headers(envelope.to_headers(&app));
        (properties, envelope)
    }

    fn error_of(properties: &BasicProperties) -> String {
        Envelope::read(properties, "", NOW)
            .error
            .unwrap_or_default()
    }

    #[test]
    fn the_frame_size_is_measured_with_lapins_encoder() {
        let (properties, _) = delivered(1000);
        let size = header_frame_size(&properties);
        assert!(size > 1000 && size < 1400, "{size}");
        assert_eq!(check_frame(&properties, size as u32), Ok(()));
        assert_eq!(
            check_frame(&properties, size as u32 - 1),
            Err(FrameTooSmall {
                size,
                frame_max: size - 1
            })
        );
    }

    #[test]
    fn a_set_aside_that_fits_is_unchanged() {
        let (original, envelope) = delivered(100);
        let copy = set_aside_within_frame(&original, &envelope, "bad total", 131_072).unwrap();
        assert_eq!(
            copy,
            set_aside_properties(&original, &envelope, "bad total")
        );
    }

    #[test]
    fn a_reason_too_long_for_the_frame_is_cut_further() {
        let (original, envelope) = delivered(3000);
        let reason = "r".repeat(3000);
        let copy = set_aside_within_frame(&original, &envelope, &reason, 4096).unwrap();
        assert!(header_frame_size(&copy) <= 4096);
        let error = error_of(&copy);
        assert!(error.contains("[cut "), "{error}");
        let headers = copy.headers().as_ref().unwrap();
        assert!(headers.inner().contains_key("x-big"), "headers kept");
    }

    #[test]
    fn headers_too_big_for_the_frame_are_dropped_and_the_copy_says_so() {
        let (original, envelope) = delivered(10_000);
        let copy = set_aside_within_frame(&original, &envelope, "bad total", 4096).unwrap();
        assert!(header_frame_size(&copy) <= 4096);
        let read = Envelope::read(&copy, "", NOW);
        assert_eq!(read.id, envelope.id, "the envelope is kept");
        let error = read.error.unwrap_or_default();
        assert!(
            error.starts_with("the original headers were dropped from this copy")
                && error.ends_with("bad total"),
            "{error}"
        );
        assert!(
            !copy
                .headers()
                .as_ref()
                .unwrap()
                .inner()
                .contains_key("x-big")
        );
    }

    #[test]
    fn an_envelope_too_big_for_any_frame_cannot_be_set_aside() {
        let (original, mut envelope) = delivered(0);
        envelope.id = "i".repeat(10_000).into();
        assert_eq!(
            set_aside_within_frame(&original, &envelope, "x", 4096),
            None
        );
    }
}
