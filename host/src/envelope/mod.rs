//! AceMQ envelope headers (contract §4): reading them off a delivery without
//! ever failing, keeping the application's own headers apart from them, and
//! writing them onto retries, set-asides and new messages.
//!
//! Everything here is a pure function over lapin's property and table types,
//! so the wire rules are unit-tested without a broker. The rules are the ones
//! the Java, Go, Python, Ruby and .NET libraries share (the contract's
//! interop invariants 6-8): a queue this host shares with them must see
//! byte-compatible headers.
//!
//! The folder is split by who reads each part. Every public item is
//! re-exported from here, so callers write `envelope::X` and never name a
//! file:
//!
//! * `mod.rs` (this file), for whoever handles a message: the [`Envelope`]
//!   itself, the reserved names ([`header`], [`is_reserved`]), and how one
//!   envelope is derived from another (new, child, retry, set-aside).
//! * `read.rs`, for the consumer: [`Envelope::read`] takes the envelope off a
//!   delivery, tolerantly, and [`split_headers`] keeps the application's
//!   headers apart from it.
//! * `headers.rs`, for plugins: [`HeaderValue`] is what a plugin sees and
//!   sets, and [`check_plugin_headers`] refuses what it may not set.
//! * `properties.rs`, for the publisher: the AMQP properties of every
//!   republish ([`retry_properties`], [`set_aside_properties`]) and of every
//!   plugin output ([`outgoing_properties`]), and [`Envelope::to_headers`],
//!   which writes the envelope into them.
//! * `derived_id.rs`, for the consumer: the id of a delivery that names
//!   none, the same at every delivery of it ([`derived_input_id`]);
//!   `message_id.rs` holds an id, deriving it only once something reads
//!   it ([`MessageId`]).
//! * `fields.rs`, for plugins: the envelope fields a plugin may choose for
//!   what it sends ([`ChosenFields`], checked strictly), and the envelope
//!   of an output built from them ([`Envelope::output_of`]).
//! * `bounds.rs`, for whoever publishes: the sizes the broker enforces
//!   ([`MAX_REASON_BYTES`], [`check_frame`]), and a set-aside copy made to
//!   fit them ([`set_aside_within_frame`]); `wire_size.rs` counts the
//!   bytes of a message's properties as lapin's encoder writes them.
//! * `replay.rs`, for the set-aside tools (`acemq-host dlq`): the replay
//!   stamps ([`stamp`], [`ReplayStamps`]) and the properties of a message
//!   moved back to its queue ([`replay_properties`]).
//! * `reply.rs`, for request/reply: where a request wants its answer
//!   ([`Request`]), the reply's envelope and properties, and the host's
//!   error reply ([`error_reply`]).
//! * `slip.rs`, for routing slips: the slip a delivery carries in either
//!   form ([`Slip`]) and the copy forwarded to its next step
//!   ([`hop_properties`]).
//! * `amqp.rs`, for the three above: the AMQP value conversions they share
//!   (integers of any width, long and short strings), so none of them
//!   depends on another in a circle.
//!
//! Reading is tolerant and writing is strict; `read.rs` and `properties.rs`
//! each say why.

use std::sync::OnceLock;

mod amqp;
mod bounds;
mod derived_id;
mod fields;
#[cfg(test)]
mod fuzz;
mod headers;
mod message_id;
mod properties;
mod read;
mod replay;
mod reply;
mod slip;
#[cfg(test)]
mod test_support;
mod wire_size;

pub(crate) use amqp::{integer_value, long_string};
pub use bounds::{
    FrameTooSmall, HEADER_FRAME_OVERHEAD, MAX_REASON_BYTES, bound_reason, check_frame,
    header_frame_size, set_aside_within_frame, truncate_middle,
};
pub use derived_id::{derived_input_id, stream_message_id};
pub use fields::{ChosenFields, MAX_FIELD_BYTES, OutputFields, check_length, parse_id};
pub use headers::{
    HeaderError, HeaderValue, MAX_SHORT_STRING, check_plugin_headers, plugin_headers_size,
    plugin_headers_to_table, preview,
};
pub use message_id::MessageId;
pub use properties::{
    DEFAULT_CONTENT_TYPE, PERSISTENT, TRANSIENT, outgoing_properties, republish_properties,
    retry_properties, set_aside_properties,
};
pub use read::{AppHeaders, split_headers, split_table, stream_offset};
pub use replay::{ReplayStamps, parse_rfc3339_ms, replay_properties, rfc3339_millis, stamp};
pub use reply::{
    DEFAULT_REPLY_TYPE, ErrorType, NO_REPLY_ADDRESS, Reply, Request, error_reply, error_reply_id,
    error_text, reply_header, reply_id, reply_properties,
};
pub use slip::{
    Arrival, DeclaredRoute, Hop, JsonSlip, ROUTING_SLIP_HEADER, Slip, SlipError, hop_properties,
};

/// The wire names of the envelope (contract §4). They are a contract between
/// languages, so they are spelled exactly as the other libraries spell them.
pub mod header {
    /// Every name under this prefix belongs to AceMQ (compared without regard
    /// to ASCII case, see [`super::is_reserved`]).
    pub const RESERVED_PREFIX: &str = "x-acemq-";
    /// Unique message id; also written as the AMQP `message-id` property.
    pub const ID: &str = "x-acemq-id";
    /// Logical message type; defaults to the routing key.
    pub const TYPE: &str = "x-acemq-type";
    /// Schema version of the body, an integer from 1.
    pub const VERSION: &str = "x-acemq-version";
    /// Business correlation id, propagated across hops; defaults to the id.
    pub const CORRELATION: &str = "x-acemq-correlation";
    /// Id of the message that caused this one; omitted when there was none.
    pub const CAUSATION: &str = "x-acemq-causation";
    /// Delivery attempt, an integer from 1.
    pub const ATTEMPT: &str = "x-acemq-attempt";
    /// When the message was first published, integer epoch milliseconds.
    pub const FIRST_SEEN: &str = "x-acemq-first-seen";
    /// Publishing process, `client@host`.
    pub const ORIGIN: &str = "x-acemq-origin";
    /// Why a copy was set aside; only on `.dlq` / `.parked` copies.
    pub const ERROR: &str = "x-acemq-error";
    /// Claim-check reference, set by applications only.
    pub const CLAIM: &str = "x-acemq-claim";
    /// Declared-pipeline slip: step names, comma-joined.
    pub const ROUTE: &str = "x-acemq-route";
    /// Position in [`ROUTE`], an integer from 0.
    pub const ROUTE_POSITION: &str = "x-acemq-route-position";
    /// Id of one run of a pipeline.
    pub const ROUTE_ID: &str = "x-acemq-route-id";
    /// Added by the broker to every delivery from a stream. Not reserved: it is
    /// an application header like `x-death`, carried through republishes.
    pub const STREAM_OFFSET: &str = "x-stream-offset";
}

/// Envelope type used when neither the header nor the routing key names one
/// (Java's rule; Python would write an empty string, which reads as absent).
pub const DEFAULT_MESSAGE_TYPE: &str = "message";

/// `x-acemq-error` of a set-aside copy whose reason is empty: a set-aside
/// copy always says why, so an operator never finds a dead letter with no
/// explanation (Python's wording).
pub const NO_REASON: &str = "no reason given";

/// Client name in the default origin, as Java and Python write it.
const CLIENT_NAME: &str = "acemq";
/// Host part of the default origin when the host name cannot be read (Java).
const UNKNOWN_HOST: &str = "unknown-host";

/// Whether a header name belongs to AceMQ rather than to the application.
///
/// Matched on the prefix, not on the known names: a header from a newer
/// library version is still not the application's, and handing it back would
/// let a plugin copy it onto a message it publishes. ASCII case is ignored
/// because the refusal on write ignores it too, and a name that is refused
/// on the way out must not be offered on the way in.
#[must_use]
pub fn is_reserved(name: &str) -> bool {
    let prefix = header::RESERVED_PREFIX.as_bytes();
    name.len() >= prefix.len() && name.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix)
}

/// Now, in milliseconds since the Unix epoch: the unit of every time an
/// envelope carries (`x-acemq-created-at`, retry due times).
#[must_use]
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The origin this process stamps on what it publishes: `acemq@{hostname}`,
/// `acemq@unknown-host` when the host name cannot be read. Computed once,
/// because the host name does not change under a running process and this is
/// read on every publish.
#[must_use]
pub fn default_origin() -> &'static str {
    static ORIGIN: OnceLock<String> = OnceLock::new();
    ORIGIN.get_or_init(|| origin_for(&gethostname::gethostname().to_string_lossy()))
}

fn origin_for(hostname: &str) -> String {
    let host = match hostname.trim() {
        "" => UNKNOWN_HOST,
        host => host,
    };
    format!("{CLIENT_NAME}@{host}")
}

/// The AceMQ envelope of one message (contract §4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// `x-acemq-id`, also the AMQP `message-id`.
    pub id: MessageId,
    /// `x-acemq-type`; never empty.
    pub message_type: String,
    /// `x-acemq-version`, at least 1.
    pub version: u32,
    /// `x-acemq-correlation`; never empty.
    pub correlation_id: MessageId,
    /// `x-acemq-causation`.
    pub causation_id: Option<String>,
    /// `x-acemq-attempt`, at least 1.
    pub attempt: u32,
    /// `x-acemq-first-seen`, epoch milliseconds.
    pub first_seen_ms: u64,
    /// `x-acemq-origin`, `client@host`.
    pub origin: Option<String>,
    /// `x-acemq-error`, only on set-aside copies.
    pub error: Option<String>,
    /// `x-acemq-claim`.
    pub claim: Option<String>,
    /// `x-acemq-route`, step names comma-joined.
    pub route: Option<String>,
    /// `x-acemq-route-position`, from 0.
    pub route_position: Option<i64>,
    /// `x-acemq-route-id`.
    pub route_id: Option<String>,
}

/// The id of output `position` of a handler run on message `input_id` by
/// the plugin version `version` (its sha256).
///
/// Derived, not random: a redelivered input handled by the same version
/// publishes its outputs with the same ids again, so a reader can drop the
/// duplicates that at-least-once publishing makes after a connection loss
/// (the direction Kafka's idempotent producer takes). A UUID (version 8,
/// RFC 9562's custom layout) made of the first bytes of a SHA-256 of the
/// three parts, so it looks like every other AceMQ id.
pub fn output_id(input_id: &str, version: &str, position: usize) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for part in [
        input_id.as_bytes(),
        version.as_bytes(),
        &position.to_be_bytes(),
    ] {
        derived_id::part(&mut hash, part);
    }
    derived_id::uuid_of(hash)
}

impl Envelope {
    /// The envelope of a brand-new message: fresh UUID v4 id, correlation =
    /// id, version 1, attempt 1, first seen now. An empty `message_type`
    /// becomes [`DEFAULT_MESSAGE_TYPE`] and an empty `origin` is omitted,
    /// so neither is ever written empty.
    #[must_use]
    pub fn new(message_type: impl Into<String>, origin: &str, now_ms: u64) -> Self {
        let id = fresh_id();
        let correlation_id = id.clone();
        Self::made(
            id,
            correlation_id,
            None,
            message_type.into(),
            origin,
            now_ms,
        )
    }

    /// A new message's envelope with its ids given: version 1, attempt 1,
    /// first seen now, the type and origin as [`Envelope::new`] writes them.
    fn made(
        id: MessageId,
        correlation_id: MessageId,
        causation_id: Option<String>,
        message_type: String,
        origin: &str,
        now_ms: u64,
    ) -> Self {
        Self {
            id,
            correlation_id,
            message_type: or_default_type(message_type),
            version: 1,
            causation_id,
            attempt: 1,
            first_seen_ms: now_ms,
            origin: non_empty(origin),
            error: None,
            claim: None,
            route: None,
            route_position: None,
            route_id: None,
        }
    }

    /// The envelope of a message a handler publishes while handling `parent`:
    /// a new message ([`Envelope::new`]) in the parent's conversation —
    /// correlation = the parent's correlation, causation = the parent's id.
    ///
    /// Pipeline fields and the claim are not inherited: a handler's output is
    /// a new message, and whoever continues a declared pipeline sets them on
    /// purpose rather than by accident.
    #[must_use]
    pub fn child_of(parent: &Envelope, message_type: String, origin: &str, now_ms: u64) -> Self {
        Self::child_with(parent, fresh_id(), None, None, message_type, origin, now_ms)
    }

    /// [`Envelope::child_of`] with its id given, and a correlation or
    /// causation id that, when given, replaces the parent's.
    pub(super) fn child_with(
        parent: &Envelope,
        id: MessageId,
        correlation_id: Option<&str>,
        causation_id: Option<&str>,
        message_type: String,
        origin: &str,
        now_ms: u64,
    ) -> Self {
        let correlation_id =
            correlation_id.map_or_else(|| parent.correlation_id.clone(), MessageId::from);
        let causation_id = causation_id.map_or_else(|| parent.id.to_string(), str::to_owned);
        Self::made(
            id,
            correlation_id,
            Some(causation_id),
            message_type,
            origin,
            now_ms,
        )
    }

    /// The envelope of the retry copy: attempt + 1, everything else kept
    /// (first-seen above all, since the age limit counts from it). A previous
    /// `x-acemq-error` (a message replayed out of a dead-letter queue) is
    /// cleared: the copy is going back to work, not to a set-aside queue.
    #[must_use]
    pub fn for_retry(&self) -> Self {
        Self {
            attempt: self.attempt.saturating_add(1),
            error: None,
            ..self.clone()
        }
    }

    /// The envelope of a copy set aside to `.dlq` or `.parked`: attempt
    /// unchanged, `x-acemq-error` = `reason` ([`NO_REASON`] when empty),
    /// cut to [`MAX_REASON_BYTES`] so no reason can make the copy too big
    /// to publish.
    #[must_use]
    pub fn for_set_aside(&self, reason: &str) -> Self {
        Self {
            error: Some(non_empty(&bound_reason(reason)).unwrap_or_else(|| NO_REASON.to_owned())),
            ..self.clone()
        }
    }

    // Only the tests ask an envelope its age (the dispatcher measures it
    // from `first_seen_ms` itself), so only they compile it.
    /// Milliseconds since the message was first seen; 0 when first-seen lies
    /// in the future (another machine's clock), so a skewed clock reads as a
    /// young message rather than an old one.
    #[must_use]
    pub fn age_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.first_seen_ms)
    }
}

// The defaults of an empty field, used wherever an envelope is built, read
// (`read.rs`) or written (`properties.rs`), so the three never disagree on
// what an empty field means. Child modules see these private items.
fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

/// A new message's id: a random UUID (version 4).
fn fresh_id() -> MessageId {
    MessageId::from(uuid::Uuid::new_v4().to_string())
}

fn or_default_type(message_type: impl Into<String>) -> String {
    let message_type = message_type.into();
    if message_type.is_empty() {
        DEFAULT_MESSAGE_TYPE.to_owned()
    } else {
        message_type
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{EARLIER, NOW, full_envelope};
    use super::*;

    #[test]
    fn header_names_are_the_contracts() {
        let names = [
            (header::ID, "x-acemq-id"),
            (header::TYPE, "x-acemq-type"),
            (header::VERSION, "x-acemq-version"),
            (header::CORRELATION, "x-acemq-correlation"),
            (header::CAUSATION, "x-acemq-causation"),
            (header::ATTEMPT, "x-acemq-attempt"),
            (header::FIRST_SEEN, "x-acemq-first-seen"),
            (header::ORIGIN, "x-acemq-origin"),
            (header::ERROR, "x-acemq-error"),
            (header::CLAIM, "x-acemq-claim"),
            (header::ROUTE, "x-acemq-route"),
            (header::ROUTE_POSITION, "x-acemq-route-position"),
            (header::ROUTE_ID, "x-acemq-route-id"),
        ];
        for (constant, expected) in names {
            assert_eq!(constant, expected);
            assert!(is_reserved(constant));
        }
        assert_eq!(header::RESERVED_PREFIX, "x-acemq-");
        assert!(!is_reserved(header::STREAM_OFFSET));
    }

    #[test]
    fn reserved_prefix_ignores_ascii_case_and_nothing_else() {
        assert!(is_reserved("x-acemq-id"));
        assert!(is_reserved("X-AceMQ-Id"));
        assert!(is_reserved("X-ACEMQ-"));
        assert!(is_reserved("x-acemq-anything-new"));
        assert!(!is_reserved("x-acemq"));
        assert!(!is_reserved("x-acemqid"));
        assert!(!is_reserved("acemq-reply-to"));
        assert!(!is_reserved("x-death"));
        assert!(!is_reserved(""));
        // A multi-byte character straddling the prefix length must not panic.
        assert!(!is_reserved("x-acem\u{e9}-id"));
    }

    #[test]
    fn output_ids_are_the_same_for_the_same_input_version_and_position_only() {
        let id = output_id("in-1", "sha-a", 0);
        assert_eq!(id, output_id("in-1", "sha-a", 0));
        let parsed = uuid::Uuid::parse_str(&id).unwrap();
        assert_eq!(parsed.get_version_num(), 8);
        assert_ne!(id, output_id("in-1", "sha-a", 1));
        assert_ne!(id, output_id("in-1", "sha-b", 0));
        assert_ne!(id, output_id("in-2", "sha-a", 0));
        // The parts cannot run into each other.
        assert_ne!(output_id("ab", "c", 0), output_id("a", "bc", 0));
    }

    #[test]
    fn new_and_child_envelopes() {
        let parent = full_envelope();
        let child = Envelope::child_of(&parent, "invoice.raised".into(), "acemq@here", NOW);
        assert_eq!(
            uuid::Uuid::parse_str(&child.id).unwrap().get_version_num(),
            4
        );
        assert_ne!(child.id, parent.id);
        assert_eq!(child.message_type, "invoice.raised");
        assert_eq!(child.version, 1);
        assert_eq!(child.correlation_id, parent.correlation_id);
        assert_eq!(child.causation_id.as_deref(), Some(parent.id.as_str()));
        assert_eq!(child.attempt, 1);
        assert_eq!(child.first_seen_ms, NOW);
        assert_eq!(child.origin.as_deref(), Some("acemq@here"));
        assert_eq!(
            (
                &child.error,
                &child.claim,
                &child.route,
                &child.route_position,
                &child.route_id
            ),
            (&None, &None, &None, &None, &None)
        );

        let child = Envelope::child_of(&parent, String::new(), "", NOW);
        assert_eq!(child.message_type, DEFAULT_MESSAGE_TYPE);
        assert_eq!(child.origin, None);

        let fresh = Envelope::new("t", "o", NOW);
        assert_eq!(fresh.correlation_id, fresh.id);
        assert_eq!(fresh.causation_id, None);
    }

    #[test]
    fn default_origin_is_acemq_at_the_host_name() {
        let origin = default_origin();
        let host = origin.strip_prefix("acemq@").expect("acemq@ prefix");
        assert!(!host.is_empty());
        assert!(std::ptr::eq(origin, default_origin()), "computed once");
        assert_eq!(origin_for(""), "acemq@unknown-host");
        assert_eq!(origin_for("  "), "acemq@unknown-host");
        assert_eq!(origin_for("box-1"), "acemq@box-1");
    }

    #[test]
    fn age_counts_from_first_seen_and_never_goes_negative() {
        let envelope = Envelope::new("t", "", EARLIER);
        assert_eq!(envelope.age_ms(EARLIER + 120_000), 120_000);
        assert_eq!(envelope.age_ms(EARLIER - 1), 0);
    }
}
