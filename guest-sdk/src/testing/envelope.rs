//! The envelope fields of what a handler sends: the host's checks of the
//! fields a plugin sets, and the defaults of those it leaves out.
//!
//! **The ids are stand-ins.** The real host derives an output's id from
//! the input's id, the plugin's version and the output's position, so that
//! a redelivered input republishes the same ids. The test host has no
//! plugin version: it derives a UUID-shaped id from the input's id and the
//! output's position alone. It is deterministic (the same input handled the
//! same way gives the same ids, run after run), which is what a test can
//! rely on; its exact value is not the host's, so compare ids between two
//! runs, or with an id the handler chose, never with a literal.

use crate::bindings::wit_types::{EnvelopeFields, Sent};

/// What the outputs of one call inherit from the message being handled.
#[derive(Clone, Debug)]
pub(crate) struct Input {
    pub(crate) id: String,
    pub(crate) correlation_id: String,
    /// Where the host would send a reply ([`Message::reply_to`](crate::Message::reply_to)).
    pub(crate) reply_to: Option<String>,
}

impl Input {
    pub(crate) fn of(msg: &crate::Message) -> Self {
        Input {
            id: msg.envelope().id.clone(),
            correlation_id: msg.envelope().correlation_id.clone(),
            reply_to: msg.reply_to().map(str::to_owned),
        }
    }
}

/// Refuses a field set to what the host would refuse: an id that is not a
/// UUID or is already used in this call (`used`: the ids of the messages
/// buffered so far), a version below 1.
pub(crate) fn check_fields<'a>(
    fields: &EnvelopeFields,
    mut used: impl Iterator<Item = &'a str>,
) -> Result<(), String> {
    if let Some(id) = &fields.id {
        if !is_uuid_text(id) {
            return Err(format!(
                "envelope id '{id}' is not a UUID in its 36-character text form \
                 (8-4-4-4-12 hexadecimal digits)"
            ));
        }
        if used.any(|other| other.eq_ignore_ascii_case(id)) {
            return Err(format!(
                "envelope id '{id}' is already the id of another message of this call; \
                 each message needs an id of its own"
            ));
        }
    }
    if fields.version == Some(0) {
        return Err("envelope version 0 is refused: versions start at 1".into());
    }
    Ok(())
}

/// The id and correlation a message will carry: those the plugin set, else
/// the defaults (`slot` names the message among the call's, e.g. `output 0`).
pub(crate) fn sent(fields: &EnvelopeFields, input: &Input, slot: &str) -> Sent {
    Sent {
        id: fields
            .id
            .clone()
            .unwrap_or_else(|| derived_id(&input.id, slot)),
        correlation_id: fields
            .correlation_id
            .clone()
            .unwrap_or_else(|| input.correlation_id.clone()),
    }
}

/// A UUID-shaped (version 8, RFC 9562 variant) id from the input's id and
/// the slot: two FNV-1a hashes of both, with different offset bases.
fn derived_id(input_id: &str, slot: &str) -> String {
    let hash = |basis: u64| {
        let mut h = basis;
        for byte in input_id.bytes().chain([0]).chain(slot.bytes()) {
            h ^= u64::from(byte);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    };
    let high = hash(0xcbf2_9ce4_8422_2325);
    let low = hash(0x6c62_272e_07bb_0142);
    let bits = (u128::from(high) << 64 | u128::from(low)) & !(0xf << 76 | 0x3 << 62)
        | (0x8 << 76 | 0x2 << 62);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

fn is_uuid_text(id: &str) -> bool {
    id.len() == 36
        && id.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_uuids_stable_and_distinct() {
        let a = derived_id("m-1", "output 0");
        assert!(is_uuid_text(&a), "{a}");
        assert_eq!(&a[14..15], "8", "version 8: {a}");
        assert!("89ab".contains(&a[19..20]), "RFC 9562 variant: {a}");
        assert_eq!(a, derived_id("m-1", "output 0"));
        assert_ne!(a, derived_id("m-1", "output 1"));
        assert_ne!(a, derived_id("m-2", "output 0"));
    }

    #[test]
    fn uuid_text_is_checked_exactly() {
        assert!(is_uuid_text("0190b3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6d"));
        assert!(is_uuid_text("0190B3C4-5E6F-7A8B-9C0D-1E2F3A4B5C6D"));
        assert!(!is_uuid_text("0190b3c45e6f7a8b9c0d1e2f3a4b5c6d"));
        assert!(!is_uuid_text("order-1"));
        assert!(!is_uuid_text("0190b3c4-5e6f-7a8b-9c0d-1e2f3a4b5c6g"));
    }
}
