//! AceMQ envelope headers (contract §4): reading them off a delivery without
//! ever failing, keeping the application's own headers apart from them, and
//! writing them onto retries, set-asides and new messages.
//!
//! Everything here is a pure function over lapin's property and table types,
//! so the wire rules are unit-tested without a broker. The rules are the ones
//! the Java, Go, Python, Ruby and .NET libraries share ("Interop invariants"
//! 6-8): a queue this host shares with them must see byte-compatible headers.
//!
//! Reading is tolerant because a message from another producer is still a
//! message: a header written with another integer width, as a numeric string
//! or as bytes is accepted, and anything missing or unreadable takes the
//! contract's default. Writing is strict: always the same six headers,
//! strings as long strings, integers as 64-bit integers, absent optional
//! fields omitted rather than written empty.

use std::sync::OnceLock;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, ByteArray, FieldTable, LongString, ShortString};

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

/// Content type of a plugin's outgoing message when it names none.
pub const DEFAULT_CONTENT_TYPE: &str = "application/json";

/// `x-acemq-error` of a set-aside copy whose reason is empty: a set-aside
/// copy always says why, so an operator never finds a dead letter with no
/// explanation (Python's wording).
pub const NO_REASON: &str = "no reason given";

/// AMQP `delivery-mode` of a message the broker writes to disk.
pub const PERSISTENT: u8 = 2;
/// AMQP `delivery-mode` of a message the broker may keep in memory only.
pub const TRANSIENT: u8 = 1;

/// Client name in the default origin, as Java and Python write it.
const CLIENT_NAME: &str = "acemq";
/// Host part of the default origin when the host name cannot be read (Java).
const UNKNOWN_HOST: &str = "unknown-host";
/// AMQP short strings (header names, `message-id`, `content-type`) carry a
/// one-byte length.
const MAX_SHORT_STRING: usize = 255;

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

/// One flat header value a plugin can see and set (the WIT `header-value`).
///
/// Nested tables and arrays (the broker's `x-death`), decimals and voids have
/// no form here; the host carries them through republishes untouched instead.
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderValue {
    /// A UTF-8 string, written as an AMQP long string.
    Text(String),
    /// Any AMQP integer, widened to 64 bits; written as a long-long int.
    Int(i64),
    /// An AMQP float or double; written as a double.
    Float(f64),
    /// An AMQP boolean.
    Bool(bool),
    /// An AMQP byte array, or a long string that is not UTF-8; written as a
    /// byte array.
    Bytes(Vec<u8>),
}

impl HeaderValue {
    /// The plugin-visible form of an AMQP value, or `None` for the shapes a
    /// plugin is not shown (tables, arrays, decimals, voids, and timestamps
    /// beyond the range of `i64`).
    #[must_use]
    pub fn from_amqp(value: &AMQPValue) -> Option<Self> {
        Some(match value {
            AMQPValue::Boolean(b) => Self::Bool(*b),
            AMQPValue::Float(f) => Self::Float(f64::from(*f)),
            AMQPValue::Double(d) => Self::Float(*d),
            AMQPValue::ShortString(s) => Self::Text(s.as_str().to_owned()),
            AMQPValue::LongString(s) => match std::str::from_utf8(s.as_bytes()) {
                Ok(text) => Self::Text(text.to_owned()),
                // Long strings are bytes on the wire; some producers put
                // binary in them, and a lossy conversion would corrupt it.
                Err(_) => Self::Bytes(s.as_bytes().to_vec()),
            },
            AMQPValue::ByteArray(b) => Self::Bytes(b.as_slice().to_vec()),
            other => Self::Int(i64::try_from(integer_value(other)?).ok()?),
        })
    }

    /// The AMQP value written for this header. Strings are long strings
    /// because a short string has no type tag in a field table (lapin writes
    /// `_`, which no broker accepts).
    #[must_use]
    pub fn to_amqp(&self) -> AMQPValue {
        match self {
            Self::Text(s) => long_string(s),
            Self::Int(n) => AMQPValue::LongLongInt(*n),
            Self::Float(f) => AMQPValue::Double(*f),
            Self::Bool(b) => AMQPValue::Boolean(*b),
            Self::Bytes(b) => AMQPValue::ByteArray(ByteArray::from(b.clone())),
        }
    }
}

/// Why headers or properties a plugin asked for cannot be published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The name is in AceMQ's namespace. Such a header would be dropped by
    /// every AceMQ consumer (contract §4), so it is refused rather than sent.
    #[error(
        "header '{name}' is in the reserved 'x-acemq-' namespace, which belongs to AceMQ; \
         use a namespace of your own, such as x-yourcompany-"
    )]
    Reserved {
        /// The header name as the plugin spelled it.
        name: String,
    },
    /// AMQP header names are short strings (at most 255 bytes).
    #[error("header name '{shown}' is {len} bytes long; AMQP allows at most 255")]
    NameTooLong {
        /// The start of the name, enough to recognise it.
        shown: String,
        /// Its length in bytes.
        len: usize,
    },
    /// The AMQP `content-type` property is a short string (at most 255 bytes).
    #[error("content type '{shown}' is {len} bytes long; AMQP allows at most 255")]
    ContentTypeTooLong {
        /// The start of the content type, enough to recognise it.
        shown: String,
        /// Its length in bytes.
        len: usize,
    },
}

/// Checks the headers a plugin asked to publish: no `x-acemq-*` name (any
/// ASCII case) and no name longer than AMQP allows. The first offending
/// header is named.
pub fn check_plugin_headers(headers: &[(String, HeaderValue)]) -> Result<(), HeaderError> {
    for (name, _) in headers {
        if is_reserved(name) {
            return Err(HeaderError::Reserved { name: name.clone() });
        }
        if name.len() > MAX_SHORT_STRING {
            return Err(HeaderError::NameTooLong {
                shown: preview(name),
                len: name.len(),
            });
        }
    }
    Ok(())
}

/// The AMQP table of a plugin's headers. A later duplicate name wins, as it
/// would in a map.
///
/// Headers [`check_plugin_headers`] refuses are skipped rather than written:
/// callers check first and report the refusal, and this skip is the backstop
/// that keeps a reserved name off the wire (and a too-long name from
/// panicking lapin's short-string conversion) even when they do not.
#[must_use]
pub fn plugin_headers_to_table(headers: &[(String, HeaderValue)]) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in headers {
        if is_reserved(name) {
            continue;
        }
        if let Ok(key) = ShortString::try_new(name.as_str()) {
            table.insert(key, value.to_amqp());
        }
    }
    table
}

/// What a plugin sees of a delivery's headers: the envelope taken out.
///
/// A republish (retry, set-aside) needs no copy of its own: it writes the
/// delivery's headers through [`Envelope::to_headers`], which drops the old
/// envelope on the way.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppHeaders {
    /// The flat non-`x-acemq-*` headers, in table order. Tables, arrays,
    /// decimals and voids are left out (a republish still carries them).
    pub visible: Vec<(String, HeaderValue)>,
    /// The broker's `x-stream-offset`, read tolerantly; `None` when absent,
    /// negative or unreadable.
    pub stream_offset: Option<u64>,
}

/// Splits a delivery's headers into the application's part (see
/// [`AppHeaders`]). Every `x-acemq-*` header, known or not, is left out:
/// [`Envelope::read`] turns the known ones into fields and the rest are
/// dropped, as every AceMQ library does.
#[must_use]
pub fn split_headers(properties: &BasicProperties) -> AppHeaders {
    split_table(properties.headers().as_ref())
}

/// [`split_headers`] over a bare header table.
#[must_use]
pub fn split_table(headers: Option<&FieldTable>) -> AppHeaders {
    let mut out = AppHeaders::default();
    let Some(headers) = headers else {
        return out;
    };
    for (name, value) in headers {
        if is_reserved(name.as_str()) {
            continue;
        }
        if name.as_str() == header::STREAM_OFFSET {
            out.stream_offset = integer(value).and_then(|n| u64::try_from(n).ok());
        }
        if let Some(visible) = HeaderValue::from_amqp(value) {
            out.visible.push((name.as_str().to_owned(), visible));
        }
    }
    out
}

/// The known `x-acemq-*` entries of a header table, found in one ordered
/// scan: a delivery is read once per message, and a dozen separate lookups
/// in the table cost more than the handler call they precede.
#[derive(Default)]
struct ReservedHeaders<'a> {
    id: Option<&'a AMQPValue>,
    message_type: Option<&'a AMQPValue>,
    version: Option<&'a AMQPValue>,
    correlation: Option<&'a AMQPValue>,
    causation: Option<&'a AMQPValue>,
    attempt: Option<&'a AMQPValue>,
    first_seen: Option<&'a AMQPValue>,
    origin: Option<&'a AMQPValue>,
    error: Option<&'a AMQPValue>,
    claim: Option<&'a AMQPValue>,
    route: Option<&'a AMQPValue>,
    route_position: Option<&'a AMQPValue>,
    route_id: Option<&'a AMQPValue>,
}

impl<'a> ReservedHeaders<'a> {
    fn collect(headers: Option<&'a FieldTable>) -> Self {
        use std::ops::Bound;
        let mut found = Self::default();
        let Some(table) = headers else {
            return found;
        };
        // Every name with the prefix sorts between "x-acemq-" and "x-acemq."
        // ('.' follows '-' in ASCII).
        let upper = "x-acemq.";
        let reserved = table.inner().range::<str, _>((
            Bound::Included(header::RESERVED_PREFIX),
            Bound::Excluded(upper),
        ));
        for (name, value) in reserved {
            let slot = match name.as_str() {
                header::ID => &mut found.id,
                header::TYPE => &mut found.message_type,
                header::VERSION => &mut found.version,
                header::CORRELATION => &mut found.correlation,
                header::CAUSATION => &mut found.causation,
                header::ATTEMPT => &mut found.attempt,
                header::FIRST_SEEN => &mut found.first_seen,
                header::ORIGIN => &mut found.origin,
                header::ERROR => &mut found.error,
                header::CLAIM => &mut found.claim,
                header::ROUTE => &mut found.route,
                header::ROUTE_POSITION => &mut found.route_position,
                header::ROUTE_ID => &mut found.route_id,
                // Unknown names (a newer library's) are dropped unread.
                _ => continue,
            };
            *slot = Some(value);
        }
        found
    }
}

/// The AceMQ envelope of one message (contract §4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// `x-acemq-id`, also the AMQP `message-id`.
    pub id: String,
    /// `x-acemq-type`; never empty.
    pub message_type: String,
    /// `x-acemq-version`, at least 1.
    pub version: u32,
    /// `x-acemq-correlation`; never empty.
    pub correlation_id: String,
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

impl Envelope {
    /// The envelope of a brand-new message: fresh UUID v4 id, correlation =
    /// id, version 1, attempt 1, first seen now. An empty `message_type`
    /// becomes [`DEFAULT_MESSAGE_TYPE`] and an empty `origin` is omitted,
    /// so neither is ever written empty.
    #[must_use]
    pub fn new(message_type: impl Into<String>, origin: &str, now_ms: u64) -> Self {
        let id = uuid::Uuid::new_v4().to_string();
        Self {
            correlation_id: id.clone(),
            id,
            message_type: or_default_type(message_type.into()),
            version: 1,
            causation_id: None,
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
        Self {
            correlation_id: parent.correlation_id.clone(),
            causation_id: Some(parent.id.clone()),
            ..Self::new(message_type, origin, now_ms)
        }
    }

    /// Reads the envelope of a delivery. Never fails: missing, empty or
    /// unreadable headers take the contract's defaults (id <= `message-id`
    /// property <= new UUID v4; type <= routing key <= `message`;
    /// correlation <= id; version and attempt at least 1; first seen <= now).
    ///
    /// Known names are matched exactly as every library writes them; another
    /// spelling of the prefix (`X-AceMQ-Id`) is not read, only dropped by
    /// [`split_headers`].
    #[must_use]
    pub fn read(properties: &BasicProperties, routing_key: &str, now_ms: u64) -> Self {
        Self::from_headers(
            properties.headers().as_ref(),
            properties.message_id().as_ref().map(ShortString::as_str),
            routing_key,
            now_ms,
        )
    }

    /// [`Envelope::read`] over a bare header table and `message-id`.
    #[must_use]
    pub fn from_headers(
        headers: Option<&FieldTable>,
        message_id: Option<&str>,
        routing_key: &str,
        now_ms: u64,
    ) -> Self {
        let reserved = ReservedHeaders::collect(headers);

        // Java falls back to the AMQP property; a message nobody stamped
        // still needs an id, and the republish writes it so later attempts
        // keep it.
        let id = reserved
            .id
            .and_then(text)
            .or_else(|| message_id.and_then(non_empty))
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let message_type = reserved
            .message_type
            .and_then(text)
            .unwrap_or_else(|| or_default_type(routing_key));
        let correlation_id = reserved
            .correlation
            .and_then(text)
            .unwrap_or_else(|| id.clone());
        // Below 1 is not a version or an attempt; 1 is what a message that
        // never said reads as. Beyond u32 saturates: it is still a large
        // number, and for the attempt that means "give up", not "start over".
        let at_least_one = |value: Option<&AMQPValue>| {
            value
                .and_then(integer)
                .map_or(1, |n| u32::try_from(n.max(1)).unwrap_or(u32::MAX))
        };
        let first_seen_ms = reserved.first_seen.and_then(epoch_millis).unwrap_or(now_ms);

        Self {
            version: at_least_one(reserved.version),
            attempt: at_least_one(reserved.attempt),
            first_seen_ms,
            causation_id: reserved.causation.and_then(text),
            origin: reserved.origin.and_then(text),
            error: reserved.error.and_then(text),
            claim: reserved.claim.and_then(text),
            route: reserved.route.and_then(text),
            // Kept as read, even negative: judging a slip is the pipeline's
            // business, and it can only do so if it sees what was written.
            route_position: reserved
                .route_position
                .and_then(integer)
                .and_then(|n| i64::try_from(n).ok()),
            route_id: reserved.route_id.and_then(text),
            id,
            message_type,
            correlation_id,
        }
    }

    /// The headers of a message carrying this envelope: `app` first, then the
    /// envelope. Id, type, version, correlation, attempt and first-seen are
    /// always written; absent optional fields are omitted (never empty or
    /// void). Any `x-acemq-*` entry in `app` is dropped, so the envelope is
    /// the only source of reserved headers.
    #[must_use]
    pub fn to_headers(&self, app: &FieldTable) -> FieldTable {
        let mut table = FieldTable::default();
        for (name, value) in app {
            if !is_reserved(name.as_str()) {
                table.insert(name.clone(), value.clone());
            }
        }
        self.stamp(&mut table);
        table
    }

    fn stamp(&self, table: &mut FieldTable) {
        let mut put_text = |name: &str, value: &str| {
            table.insert(name.into(), long_string(value));
        };
        put_text(header::ID, &self.id);
        // Fields are public, so an envelope built by hand may hold empty
        // strings; the defaults are applied again rather than written empty.
        put_text(header::TYPE, &or_default_type(self.message_type.as_str()));
        let correlation = match self.correlation_id.as_str() {
            "" => self.id.as_str(),
            correlation => correlation,
        };
        put_text(header::CORRELATION, correlation);
        for (name, value) in [
            (header::CAUSATION, &self.causation_id),
            (header::ORIGIN, &self.origin),
            (header::ERROR, &self.error),
            (header::CLAIM, &self.claim),
            (header::ROUTE, &self.route),
            (header::ROUTE_ID, &self.route_id),
        ] {
            if let Some(value) = value.as_deref().filter(|v| !v.is_empty()) {
                put_text(name, value);
            }
        }

        let mut put_int = |name: &str, value: i64| {
            table.insert(name.into(), AMQPValue::LongLongInt(value));
        };
        put_int(header::VERSION, i64::from(self.version.max(1)));
        put_int(header::ATTEMPT, i64::from(self.attempt.max(1)));
        put_int(
            header::FIRST_SEEN,
            i64::try_from(self.first_seen_ms).unwrap_or(i64::MAX),
        );
        if let Some(position) = self.route_position {
            put_int(header::ROUTE_POSITION, position);
        }
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
    /// unchanged, `x-acemq-error` = `reason` ([`NO_REASON`] when empty).
    #[must_use]
    pub fn for_set_aside(&self, reason: &str) -> Self {
        Self {
            error: Some(non_empty(reason).unwrap_or_else(|| NO_REASON.to_owned())),
            ..self.clone()
        }
    }

    /// Milliseconds since the message was first seen; 0 when first-seen lies
    /// in the future (another machine's clock), so a skewed clock reads as a
    /// young message rather than an old one.
    #[must_use]
    pub fn age_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.first_seen_ms)
    }
}

/// The properties of a copy of a delivery republished for a retry or a
/// set-aside (contract §5): persistent, `message-id` = envelope id, headers =
/// the original's application headers verbatim followed by `envelope`.
///
/// The body is republished unchanged, so what describes it is kept
/// (content type and encoding), as is what describes the conversation
/// (correlation-id, reply-to, priority, timestamp, type, app-id). Two
/// properties are dropped on purpose:
/// * `expiration`: a per-message TTL on a copy would let a dead letter expire
///   out of `.dlq` unseen and would stall a retry rung behind it; the
///   contract never uses per-message TTLs.
/// * `user-id`: the broker refuses a publish whose user-id is not the
///   publishing connection's user, with a channel error that would take the
///   host's publishing channel down with it.
///
/// `message-id` is left unset when the id is longer than an AMQP short
/// string allows; the `x-acemq-id` header still carries it.
#[must_use]
pub fn republish_properties(original: &BasicProperties, envelope: &Envelope) -> BasicProperties {
    let headers = match original.headers() {
        Some(delivered) => envelope.to_headers(delivered),
        None => envelope.to_headers(&FieldTable::default()),
    };
    let mut properties = BasicProperties::default()
        .with_delivery_mode(PERSISTENT)
        .with_headers(headers);
    if let Some(id) = short_string(&envelope.id) {
        properties = properties.with_message_id(id);
    }
    if let Some(v) = original.content_type() {
        properties = properties.with_content_type(v.clone());
    }
    if let Some(v) = original.content_encoding() {
        properties = properties.with_content_encoding(v.clone());
    }
    if let Some(v) = original.priority() {
        properties = properties.with_priority(*v);
    }
    if let Some(v) = original.correlation_id() {
        properties = properties.with_correlation_id(v.clone());
    }
    if let Some(v) = original.reply_to() {
        properties = properties.with_reply_to(v.clone());
    }
    if let Some(v) = original.timestamp() {
        properties = properties.with_timestamp(*v);
    }
    if let Some(v) = original.kind() {
        properties = properties.with_type(v.clone());
    }
    if let Some(v) = original.app_id() {
        properties = properties.with_app_id(v.clone());
    }
    if let Some(v) = original.cluster_id() {
        properties = properties.with_cluster_id(v.clone());
    }
    properties
}

/// [`republish_properties`] for a retry: [`Envelope::for_retry`].
#[must_use]
pub fn retry_properties(original: &BasicProperties, envelope: &Envelope) -> BasicProperties {
    republish_properties(original, &envelope.for_retry())
}

/// [`republish_properties`] for a set-aside to `.dlq` / `.parked`:
/// [`Envelope::for_set_aside`].
#[must_use]
pub fn set_aside_properties(
    original: &BasicProperties,
    envelope: &Envelope,
    reason: &str,
) -> BasicProperties {
    republish_properties(original, &envelope.for_set_aside(reason))
}

/// The properties of a new message a plugin publishes: `content-type` (empty
/// or absent means [`DEFAULT_CONTENT_TYPE`]), `message-id` = envelope id,
/// delivery mode 2 when `persistent` else 1, headers = the plugin's headers
/// followed by the envelope.
///
/// The headers are checked here as well as when the plugin buffered them:
/// a refusal is an answer for the plugin, never a silently altered message.
pub fn outgoing_properties(
    envelope: &Envelope,
    content_type: Option<&str>,
    persistent: bool,
    headers: &[(String, HeaderValue)],
) -> Result<BasicProperties, HeaderError> {
    check_plugin_headers(headers)?;
    let content_type = content_type
        .filter(|c| !c.is_empty())
        .unwrap_or(DEFAULT_CONTENT_TYPE);
    let content_type =
        short_string(content_type).ok_or_else(|| HeaderError::ContentTypeTooLong {
            shown: preview(content_type),
            len: content_type.len(),
        })?;
    let mut properties = BasicProperties::default()
        .with_content_type(content_type)
        .with_delivery_mode(if persistent { PERSISTENT } else { TRANSIENT })
        .with_headers(envelope.to_headers(&plugin_headers_to_table(headers)));
    if let Some(id) = short_string(&envelope.id) {
        properties = properties.with_message_id(id);
    }
    Ok(properties)
}

fn long_string(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

fn short_string(value: &str) -> Option<ShortString> {
    ShortString::try_new(value).ok()
}

fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

fn or_default_type(message_type: impl Into<String>) -> String {
    let message_type = message_type.into();
    if message_type.is_empty() {
        DEFAULT_MESSAGE_TYPE.to_owned()
    } else {
        message_type
    }
}

/// The start of a long name for an error message, cut on a character
/// boundary so the message stays valid UTF-8.
fn preview(value: &str) -> String {
    const SHOWN: usize = 64;
    if value.len() <= SHOWN {
        return value.to_owned();
    }
    let mut end = SHOWN;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &value[..end])
}

/// A string header, tolerantly: long and short strings and byte arrays
/// (invalid UTF-8 replaced, as Python decodes them), integers in decimal.
/// Empty reads as absent, so a default applies.
fn text(value: &AMQPValue) -> Option<String> {
    let text = match value {
        AMQPValue::LongString(s) => utf8_or_replaced(s.as_bytes()),
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::ByteArray(b) => utf8_or_replaced(b.as_slice()),
        other => integer_value(other)?.to_string(),
    };
    (!text.is_empty()).then_some(text)
}

/// The bytes as text, invalid UTF-8 replaced. Valid text (the usual case)
/// takes the validator's fast path and one copy.
fn utf8_or_replaced(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// An integer header, tolerantly: every AMQP integer width and timestamps,
/// and decimal strings in any string form (surrounding blanks ignored).
/// Booleans and floats are not integers (Python reads them as unreadable
/// too). `i128` holds every width without loss; each field narrows it.
fn integer(value: &AMQPValue) -> Option<i128> {
    let digits = match value {
        AMQPValue::LongString(s) => s.as_bytes(),
        AMQPValue::ByteArray(b) => b.as_slice(),
        AMQPValue::ShortString(s) => s.as_str().as_bytes(),
        other => return integer_value(other),
    };
    std::str::from_utf8(digits).ok()?.trim().parse().ok()
}

/// The value of an AMQP integer type, `None` for every other type.
fn integer_value(value: &AMQPValue) -> Option<i128> {
    Some(match *value {
        AMQPValue::ShortShortInt(n) => n.into(),
        AMQPValue::ShortShortUInt(n) => n.into(),
        AMQPValue::ShortInt(n) => n.into(),
        AMQPValue::ShortUInt(n) => n.into(),
        AMQPValue::LongInt(n) => n.into(),
        AMQPValue::LongUInt(n) => n.into(),
        AMQPValue::LongLongInt(n) => n.into(),
        AMQPValue::Timestamp(n) => n.into(),
        _ => return None,
    })
}

/// `x-acemq-first-seen` as epoch milliseconds. An AMQP timestamp counts
/// seconds (a producer handing its client a date gets one), so it is scaled;
/// every other integer is taken as milliseconds, as written. Negative is
/// unreadable.
fn epoch_millis(value: &AMQPValue) -> Option<u64> {
    match *value {
        AMQPValue::Timestamp(seconds) => Some(seconds.saturating_mul(1000)),
        _ => u64::try_from(integer(value)?).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::protocol::basic::{gen_properties, parse_properties};
    use lapin::types::generation::gen_field_table;
    use lapin::types::parsing::parse_field_table;
    use lapin::types::{DecimalValue, FieldArray};

    const NOW: u64 = 1_770_091_506_789;
    const EARLIER: u64 = 1_770_000_000_000;

    fn table(entries: Vec<(&str, AMQPValue)>) -> FieldTable {
        let mut table = FieldTable::default();
        for (name, value) in entries {
            table.insert(name.into(), value);
        }
        table
    }

    fn ls(s: &str) -> AMQPValue {
        long_string(s)
    }

    fn with_headers(entries: Vec<(&str, AMQPValue)>) -> BasicProperties {
        BasicProperties::default().with_headers(table(entries))
    }

    fn read(entries: Vec<(&str, AMQPValue)>) -> Envelope {
        Envelope::read(&with_headers(entries), "orders.new", NOW)
    }

    fn headers_of(properties: &BasicProperties) -> &FieldTable {
        properties.headers().as_ref().expect("headers are set")
    }

    fn get<'a>(table: &'a FieldTable, name: &str) -> Option<&'a AMQPValue> {
        table.inner().get(name)
    }

    fn reserved_names(table: &FieldTable) -> Vec<&str> {
        table
            .inner()
            .keys()
            .map(ShortString::as_str)
            .filter(|name| is_reserved(name))
            .collect()
    }

    /// Encodes a table as it goes on the wire and parses it back, as a
    /// consumer's client would: what survives this is what another library
    /// sees.
    fn over_the_wire(table: &FieldTable) -> FieldTable {
        let written = gen_field_table::<Vec<u8>>(table)(Vec::new().into())
            .expect("the table can be written to the wire");
        let (rest, parsed) = parse_field_table(&written.write[..]).expect("the table parses back");
        assert!(rest.is_empty());
        parsed
    }

    /// A realistic broker-added `x-death`: a list of tables, newest first,
    /// with a nested array and a timestamp.
    fn x_death() -> AMQPValue {
        let mut death = FieldTable::default();
        death.insert("count".into(), AMQPValue::LongLongInt(2));
        death.insert("reason".into(), ls("expired"));
        death.insert("queue".into(), ls("orders.new.retry.30s"));
        death.insert("exchange".into(), ls("acemq.retry"));
        death.insert(
            "routing-keys".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![ls("orders.new")])),
        );
        death.insert("time".into(), AMQPValue::Timestamp(1_770_091_506));
        AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(death)]))
    }

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn full_envelope() -> Envelope {
        Envelope {
            id: "6f0b6c8e-0a49-4c8e-9d3e-6b1f3f2f8a11".into(),
            message_type: "order.placed".into(),
            version: 3,
            correlation_id: "corr-1".into(),
            causation_id: Some("cause-1".into()),
            attempt: 2,
            first_seen_ms: EARLIER,
            origin: Some("billing@host-a".into()),
            error: Some("the handler parked it: bad".into()),
            claim: Some("s3://bucket/key".into()),
            route: Some("validate,price,ship".into()),
            route_position: Some(1),
            route_id: Some("run-7".into()),
        }
    }

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
    fn reads_every_field_written_the_usual_way() {
        let envelope = read(vec![
            (header::ID, ls("id-1")),
            (header::TYPE, ls("order.placed")),
            (header::VERSION, AMQPValue::LongLongInt(3)),
            (header::CORRELATION, ls("corr-1")),
            (header::CAUSATION, ls("cause-1")),
            (header::ATTEMPT, AMQPValue::LongLongInt(4)),
            (header::FIRST_SEEN, AMQPValue::LongLongInt(EARLIER as i64)),
            (header::ORIGIN, ls("billing@host-a")),
            (header::ERROR, ls("exhausted 4 attempts: E: x")),
            (header::CLAIM, ls("s3://b/k")),
            (header::ROUTE, ls("a,b,c")),
            (header::ROUTE_POSITION, AMQPValue::LongLongInt(2)),
            (header::ROUTE_ID, ls("run-1")),
        ]);
        assert_eq!(
            envelope,
            Envelope {
                id: "id-1".into(),
                message_type: "order.placed".into(),
                version: 3,
                correlation_id: "corr-1".into(),
                causation_id: Some("cause-1".into()),
                attempt: 4,
                first_seen_ms: EARLIER,
                origin: Some("billing@host-a".into()),
                error: Some("exhausted 4 attempts: E: x".into()),
                claim: Some("s3://b/k".into()),
                route: Some("a,b,c".into()),
                route_position: Some(2),
                route_id: Some("run-1".into()),
            }
        );
    }

    #[test]
    fn reads_integers_of_every_width() {
        let widths = [
            AMQPValue::ShortShortInt(3),
            AMQPValue::ShortShortUInt(3),
            AMQPValue::ShortInt(3),
            AMQPValue::ShortUInt(3),
            AMQPValue::LongInt(3),
            AMQPValue::LongUInt(3),
            AMQPValue::LongLongInt(3),
            AMQPValue::Timestamp(3),
        ];
        for value in widths {
            let envelope = read(vec![
                (header::ATTEMPT, value.clone()),
                (header::VERSION, value.clone()),
                (header::ROUTE_POSITION, value.clone()),
            ]);
            assert_eq!(envelope.attempt, 3, "attempt from {value:?}");
            assert_eq!(envelope.version, 3, "version from {value:?}");
            assert_eq!(envelope.route_position, Some(3), "position from {value:?}");
        }
        for value in [
            AMQPValue::LongInt(1_000_000),
            AMQPValue::LongUInt(123_456),
            AMQPValue::LongLongInt(EARLIER as i64),
        ] {
            let expected = integer_value(&value).unwrap() as u64;
            assert_eq!(
                read(vec![(header::FIRST_SEEN, value)]).first_seen_ms,
                expected
            );
        }
    }

    #[test]
    fn reads_numeric_strings_and_bytes() {
        let forms = [
            ls("5"),
            ls(" 5 "),
            ls("+5"),
            AMQPValue::ShortString("5".into()),
            AMQPValue::ByteArray(ByteArray::from(&b"5"[..])),
        ];
        for value in forms {
            let envelope = read(vec![
                (header::ATTEMPT, value.clone()),
                (header::VERSION, value.clone()),
                (header::ROUTE_POSITION, value.clone()),
            ]);
            assert_eq!(envelope.attempt, 5, "attempt from {value:?}");
            assert_eq!(envelope.version, 5, "version from {value:?}");
            assert_eq!(envelope.route_position, Some(5), "position from {value:?}");
        }
        let envelope = read(vec![(header::FIRST_SEEN, ls(&EARLIER.to_string()))]);
        assert_eq!(envelope.first_seen_ms, EARLIER);
    }

    #[test]
    fn reads_strings_in_every_form() {
        for value in [
            ls("id-9"),
            AMQPValue::ShortString("id-9".into()),
            AMQPValue::ByteArray(ByteArray::from(&b"id-9"[..])),
        ] {
            assert_eq!(
                read(vec![(header::ID, value.clone())]).id,
                "id-9",
                "{value:?}"
            );
        }
        // An integer where a string belongs is still readable (as Python's
        // str() reads it).
        assert_eq!(read(vec![(header::ID, AMQPValue::LongInt(42))]).id, "42");
        // Invalid UTF-8 is replaced, not refused: the message still has an id.
        let bytes = AMQPValue::LongString(LongString::from(vec![b'a', 0xff, b'b']));
        assert_eq!(read(vec![(header::ID, bytes)]).id, "a\u{fffd}b");
    }

    #[test]
    fn first_seen_as_an_amqp_timestamp_is_seconds() {
        let envelope = read(vec![(
            header::FIRST_SEEN,
            AMQPValue::Timestamp(1_770_000_000),
        )]);
        assert_eq!(envelope.first_seen_ms, 1_770_000_000_000);
    }

    #[test]
    fn missing_headers_take_the_defaults() {
        let properties = BasicProperties::default().with_message_id("from-property".into());
        let envelope = Envelope::read(&properties, "orders.new", NOW);
        assert_eq!(
            envelope,
            Envelope {
                id: "from-property".into(),
                message_type: "orders.new".into(),
                version: 1,
                correlation_id: "from-property".into(),
                causation_id: None,
                attempt: 1,
                first_seen_ms: NOW,
                origin: None,
                error: None,
                claim: None,
                route: None,
                route_position: None,
                route_id: None,
            }
        );
    }

    #[test]
    fn no_id_anywhere_gets_a_fresh_uuid_v4_used_for_correlation_too() {
        let first = Envelope::read(&BasicProperties::default(), "", NOW);
        let second = Envelope::read(&BasicProperties::default(), "", NOW);
        let uuid = uuid::Uuid::parse_str(&first.id).expect("a UUID");
        assert_eq!(uuid.get_version_num(), 4);
        assert_eq!(first.id, uuid.hyphenated().to_string());
        assert_eq!(first.correlation_id, first.id);
        assert_ne!(first.id, second.id);
        // Empty routing key: Java's literal `message`.
        assert_eq!(first.message_type, DEFAULT_MESSAGE_TYPE);
    }

    #[test]
    fn the_header_id_wins_over_the_message_id_property() {
        let properties = with_headers(vec![(header::ID, ls("from-header"))])
            .with_message_id("from-property".into());
        assert_eq!(Envelope::read(&properties, "k", NOW).id, "from-header");
    }

    #[test]
    fn empty_strings_read_as_absent() {
        let properties = with_headers(vec![
            (header::ID, ls("")),
            (header::TYPE, ls("")),
            (header::CORRELATION, ls("")),
            (header::CAUSATION, ls("")),
            (header::ORIGIN, ls("")),
            (header::ERROR, ls("")),
            (header::CLAIM, ls("")),
            (header::ROUTE, ls("")),
            (header::ROUTE_ID, ls("")),
            (header::ATTEMPT, ls("")),
            (header::VERSION, ls("")),
            (header::FIRST_SEEN, ls("")),
            (header::ROUTE_POSITION, ls("")),
        ])
        .with_message_id("mid".into());
        let envelope = Envelope::read(&properties, "orders.new", NOW);
        assert_eq!(envelope.id, "mid");
        assert_eq!(envelope.message_type, "orders.new");
        assert_eq!(envelope.correlation_id, "mid");
        assert_eq!(envelope.causation_id, None);
        assert_eq!(envelope.origin, None);
        assert_eq!(envelope.error, None);
        assert_eq!(envelope.claim, None);
        assert_eq!(envelope.route, None);
        assert_eq!(envelope.route_id, None);
        assert_eq!(envelope.attempt, 1);
        assert_eq!(envelope.version, 1);
        assert_eq!(envelope.first_seen_ms, NOW);
        assert_eq!(envelope.route_position, None);

        // An empty message-id property is no id either.
        let properties = BasicProperties::default().with_message_id("".into());
        let envelope = Envelope::read(&properties, "k", NOW);
        assert!(uuid::Uuid::parse_str(&envelope.id).is_ok());
    }

    #[test]
    fn unreadable_values_take_the_defaults() {
        let unreadable = [
            ls("four"),
            ls("4.0"),
            AMQPValue::Boolean(true),
            AMQPValue::Double(4.0),
            AMQPValue::Float(4.0),
            AMQPValue::DecimalValue(DecimalValue { scale: 0, value: 4 }),
            AMQPValue::Void,
            AMQPValue::FieldTable(FieldTable::default()),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongLongInt(4)])),
            AMQPValue::ByteArray(ByteArray::from(vec![0xff])),
        ];
        for value in unreadable {
            let envelope = read(vec![
                (header::ATTEMPT, value.clone()),
                (header::VERSION, value.clone()),
                (header::FIRST_SEEN, value.clone()),
                (header::ROUTE_POSITION, value.clone()),
                (header::TYPE, value.clone()),
                (header::CAUSATION, value.clone()),
            ]);
            assert_eq!(envelope.attempt, 1, "{value:?}");
            assert_eq!(envelope.version, 1, "{value:?}");
            assert_eq!(envelope.first_seen_ms, NOW, "{value:?}");
            assert_eq!(envelope.route_position, None, "{value:?}");
            if !matches!(value, AMQPValue::LongString(_) | AMQPValue::ByteArray(_)) {
                assert_eq!(envelope.message_type, "orders.new", "{value:?}");
                assert_eq!(envelope.causation_id, None, "{value:?}");
            }
        }
    }

    #[test]
    fn version_and_attempt_below_one_read_as_one_and_saturate_above_u32() {
        for low in [0, -1, i64::MIN] {
            let envelope = read(vec![
                (header::ATTEMPT, AMQPValue::LongLongInt(low)),
                (header::VERSION, AMQPValue::LongLongInt(low)),
            ]);
            assert_eq!((envelope.attempt, envelope.version), (1, 1), "{low}");
        }
        let envelope = read(vec![
            (header::ATTEMPT, AMQPValue::LongLongInt(i64::MAX)),
            (header::VERSION, ls("99999999999999999999")),
        ]);
        assert_eq!((envelope.attempt, envelope.version), (u32::MAX, u32::MAX));
        // And the next retry does not wrap round to attempt 0.
        assert_eq!(envelope.for_retry().attempt, u32::MAX);
    }

    #[test]
    fn negative_first_seen_is_unreadable() {
        let envelope = read(vec![(header::FIRST_SEEN, AMQPValue::LongLongInt(-5))]);
        assert_eq!(envelope.first_seen_ms, NOW);
    }

    #[test]
    fn unknown_and_differently_cased_reserved_headers_are_dropped() {
        let properties = with_headers(vec![
            (header::ID, ls("id-1")),
            (header::ATTEMPT, AMQPValue::LongLongInt(2)),
            ("x-acemq-foo", ls("from a newer library")),
            ("X-AceMQ-Bar", ls("odd case")),
            ("x-acemq-replayed-at", AMQPValue::LongLongInt(1)),
            ("acemq-reply-to", ls("replies")),
            ("traceparent", ls(TRACEPARENT)),
        ]);
        let app = split_headers(&properties);
        let names: Vec<&str> = app.visible.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["acemq-reply-to", "traceparent"]);
        // The known ones became fields.
        let envelope = Envelope::read(&properties, "k", NOW);
        assert_eq!((envelope.id.as_str(), envelope.attempt), ("id-1", 2));
        // A republish carries the same two, and of the reserved names only
        // those of the envelope it writes.
        let copy = republish_properties(&properties, &envelope);
        let copied = headers_of(&copy);
        assert_eq!(
            reserved_names(copied),
            reserved_names(&envelope.to_headers(&FieldTable::default()))
        );
        assert_eq!(copied.inner().len() - reserved_names(copied).len(), 2);
        assert_eq!(get(copied, "traceparent"), Some(&ls(TRACEPARENT)));
        assert_eq!(get(copied, "acemq-reply-to"), Some(&ls("replies")));
    }

    #[test]
    fn split_keeps_everything_else_verbatim_and_shows_the_flat_ones() {
        let nested = AMQPValue::FieldTable(table(vec![("k", ls("v"))]));
        let properties = with_headers(vec![
            (header::ID, ls("id-1")),
            ("x-death", x_death()),
            ("x-first-death-queue", ls("orders.new")),
            ("traceparent", ls(TRACEPARENT)),
            ("x-stream-offset", AMQPValue::LongLongInt(42)),
            ("nested", nested.clone()),
            ("t-bool", AMQPValue::Boolean(true)),
            ("t-short", AMQPValue::ShortInt(-7)),
            ("t-float", AMQPValue::Float(1.5)),
            ("t-double", AMQPValue::Double(2.25)),
            (
                "t-bytes",
                AMQPValue::ByteArray(ByteArray::from(vec![0, 1, 2])),
            ),
            (
                "t-binary",
                AMQPValue::LongString(LongString::from(vec![0xff, 0xfe])),
            ),
            ("t-stamp", AMQPValue::Timestamp(1_770_000_000)),
            (
                "t-decimal",
                AMQPValue::DecimalValue(DecimalValue { scale: 2, value: 5 }),
            ),
            ("t-void", AMQPValue::Void),
        ]);
        let app = split_headers(&properties);

        // A republish carries the delivery's headers, minus the old
        // envelope, value for value.
        let envelope = Envelope::read(&properties, "k", NOW);
        let mut expected = headers_of(&properties).inner().clone();
        expected.remove(header::ID);
        let copy = republish_properties(&properties, &envelope);
        let mut carried = headers_of(&copy).inner().clone();
        carried.retain(|name, _| !is_reserved(name.as_str()));
        assert_eq!(&carried, &expected);

        assert_eq!(app.stream_offset, Some(42));
        let visible: std::collections::BTreeMap<&str, &HeaderValue> =
            app.visible.iter().map(|(n, v)| (n.as_str(), v)).collect();
        assert_eq!(
            visible.keys().copied().collect::<Vec<_>>(),
            [
                "t-binary",
                "t-bool",
                "t-bytes",
                "t-double",
                "t-float",
                "t-short",
                "t-stamp",
                "traceparent",
                "x-first-death-queue",
                "x-stream-offset",
            ]
        );
        assert_eq!(
            visible["traceparent"],
            &HeaderValue::Text(TRACEPARENT.into())
        );
        assert_eq!(visible["t-bool"], &HeaderValue::Bool(true));
        assert_eq!(visible["t-short"], &HeaderValue::Int(-7));
        assert_eq!(visible["t-float"], &HeaderValue::Float(1.5));
        assert_eq!(visible["t-double"], &HeaderValue::Float(2.25));
        assert_eq!(visible["t-bytes"], &HeaderValue::Bytes(vec![0, 1, 2]));
        assert_eq!(visible["t-binary"], &HeaderValue::Bytes(vec![0xff, 0xfe]));
        assert_eq!(visible["t-stamp"], &HeaderValue::Int(1_770_000_000));
        assert_eq!(visible["x-stream-offset"], &HeaderValue::Int(42));
    }

    #[test]
    fn stream_offset_is_read_tolerantly() {
        let offset = |value: AMQPValue| {
            split_table(Some(&table(vec![("x-stream-offset", value)]))).stream_offset
        };
        assert_eq!(offset(AMQPValue::LongLongInt(7)), Some(7));
        assert_eq!(offset(AMQPValue::LongUInt(7)), Some(7));
        assert_eq!(offset(AMQPValue::ShortShortUInt(7)), Some(7));
        assert_eq!(offset(ls("7")), Some(7));
        assert_eq!(offset(AMQPValue::LongLongInt(-1)), None);
        assert_eq!(offset(ls("next")), None);
        assert_eq!(split_table(None), AppHeaders::default());
        assert_eq!(
            split_headers(&BasicProperties::default()).stream_offset,
            None
        );
    }

    #[test]
    fn writes_the_six_headers_always_as_strings_and_integers() {
        let envelope = Envelope::new("order.placed", "", NOW);
        let headers = envelope.to_headers(&FieldTable::default());
        assert_eq!(
            reserved_names(&headers),
            [
                header::ATTEMPT,
                header::CORRELATION,
                header::FIRST_SEEN,
                header::ID,
                header::TYPE,
                header::VERSION,
            ]
        );
        assert_eq!(get(&headers, header::ID), Some(&ls(&envelope.id)));
        assert_eq!(get(&headers, header::TYPE), Some(&ls("order.placed")));
        assert_eq!(get(&headers, header::CORRELATION), Some(&ls(&envelope.id)));
        assert_eq!(
            get(&headers, header::VERSION),
            Some(&AMQPValue::LongLongInt(1))
        );
        assert_eq!(
            get(&headers, header::ATTEMPT),
            Some(&AMQPValue::LongLongInt(1))
        );
        assert_eq!(
            get(&headers, header::FIRST_SEEN),
            Some(&AMQPValue::LongLongInt(NOW as i64))
        );
    }

    #[test]
    fn writes_present_optionals_and_omits_absent_or_empty_ones() {
        let headers = full_envelope().to_headers(&FieldTable::default());
        assert_eq!(reserved_names(&headers).len(), 13);
        assert_eq!(get(&headers, header::CAUSATION), Some(&ls("cause-1")));
        assert_eq!(get(&headers, header::ORIGIN), Some(&ls("billing@host-a")));
        assert_eq!(
            get(&headers, header::ERROR),
            Some(&ls("the handler parked it: bad"))
        );
        assert_eq!(get(&headers, header::CLAIM), Some(&ls("s3://bucket/key")));
        assert_eq!(
            get(&headers, header::ROUTE),
            Some(&ls("validate,price,ship"))
        );
        assert_eq!(get(&headers, header::ROUTE_ID), Some(&ls("run-7")));
        assert_eq!(
            get(&headers, header::ROUTE_POSITION),
            Some(&AMQPValue::LongLongInt(1))
        );

        // Hand-built envelopes with empty strings still write no empty header.
        let hand_built = Envelope {
            message_type: String::new(),
            correlation_id: String::new(),
            causation_id: Some(String::new()),
            origin: Some(String::new()),
            version: 0,
            attempt: 0,
            ..full_envelope()
        };
        let headers = hand_built.to_headers(&FieldTable::default());
        assert_eq!(get(&headers, header::CAUSATION), None);
        assert_eq!(get(&headers, header::ORIGIN), None);
        assert_eq!(get(&headers, header::TYPE), Some(&ls(DEFAULT_MESSAGE_TYPE)));
        assert_eq!(
            get(&headers, header::CORRELATION),
            Some(&ls(&hand_built.id))
        );
        assert_eq!(
            get(&headers, header::VERSION),
            Some(&AMQPValue::LongLongInt(1))
        );
        assert_eq!(
            get(&headers, header::ATTEMPT),
            Some(&AMQPValue::LongLongInt(1))
        );
    }

    #[test]
    fn written_envelope_reads_back_identically_over_the_wire() {
        let envelope = full_envelope();
        let headers = over_the_wire(&envelope.to_headers(&FieldTable::default()));
        let properties = BasicProperties::default().with_headers(headers);
        assert_eq!(Envelope::read(&properties, "other.key", NOW), envelope);
    }

    #[test]
    fn to_headers_puts_app_headers_first_and_drops_reserved_ones_from_them() {
        let app = table(vec![
            ("traceparent", ls(TRACEPARENT)),
            (header::ID, ls("forged")),
            ("X-ACEMQ-ATTEMPT", AMQPValue::LongLongInt(99)),
        ]);
        let envelope = full_envelope();
        let headers = envelope.to_headers(&app);
        assert_eq!(get(&headers, "traceparent"), Some(&ls(TRACEPARENT)));
        assert_eq!(get(&headers, header::ID), Some(&ls(&envelope.id)));
        assert_eq!(get(&headers, "X-ACEMQ-ATTEMPT"), None);
    }

    /// A delivery as a Java or Python producer sends it, after one trip
    /// round a retry rung (so with the broker's x-death).
    fn delivered_on_attempt_two() -> BasicProperties {
        BasicProperties::default()
            .with_content_type("application/json".into())
            .with_content_encoding("gzip".into())
            .with_delivery_mode(TRANSIENT)
            .with_priority(5)
            .with_correlation_id("rpc-1".into())
            .with_reply_to("replies".into())
            .with_expiration("60000".into())
            .with_message_id("id-1".into())
            .with_timestamp(1_770_000_000)
            .with_type("legacy-type".into())
            .with_user_id("someone-else".into())
            .with_app_id("billing".into())
            .with_headers(table(vec![
                (header::ID, ls("id-1")),
                (header::TYPE, ls("order.placed")),
                (header::VERSION, AMQPValue::LongInt(2)),
                (header::CORRELATION, ls("corr-1")),
                (header::ATTEMPT, AMQPValue::LongInt(2)),
                (header::FIRST_SEEN, AMQPValue::LongLongInt(EARLIER as i64)),
                (header::ORIGIN, ls("acemq@java-host")),
                (header::ERROR, ls("replayed from the dlq")),
                ("x-acemq-future", ls("dropped")),
                ("x-death", x_death()),
                ("x-first-death-reason", ls("expired")),
                ("traceparent", ls(TRACEPARENT)),
                ("tracestate", ls("vendor=1")),
                ("acemq-reply-to", ls("replies")),
            ]))
    }

    #[test]
    fn retry_republish_advances_the_attempt_and_carries_app_headers_exactly() {
        let original = delivered_on_attempt_two();
        let envelope = Envelope::read(&original, "orders.new", NOW);
        let copy = retry_properties(&original, &envelope);

        // Encoded and parsed as the broker would relay it.
        let headers = over_the_wire(headers_of(&copy));
        for name in [
            "x-death",
            "x-first-death-reason",
            "traceparent",
            "tracestate",
            "acemq-reply-to",
        ] {
            assert_eq!(
                get(&headers, name),
                get(headers_of(&original), name),
                "{name}"
            );
        }
        assert_eq!(get(&headers, "x-death"), Some(&x_death()));
        assert_eq!(get(&headers, "x-acemq-future"), None);
        assert_eq!(get(&headers, header::ERROR), None);
        assert_eq!(
            get(&headers, header::ATTEMPT),
            Some(&AMQPValue::LongLongInt(3))
        );
        assert_eq!(
            get(&headers, header::FIRST_SEEN),
            Some(&AMQPValue::LongLongInt(EARLIER as i64))
        );

        let reread = Envelope::read(&copy, "orders.new", NOW + 60_000);
        assert_eq!(
            reread,
            Envelope {
                attempt: 3,
                error: None,
                ..envelope.clone()
            }
        );
    }

    #[test]
    fn republish_properties_keep_the_body_description_and_drop_ttl_and_user_id() {
        let original = delivered_on_attempt_two();
        let envelope = Envelope::read(&original, "orders.new", NOW);
        let copy = retry_properties(&original, &envelope);

        assert_eq!(
            copy.message_id().as_ref().map(ShortString::as_str),
            Some("id-1")
        );
        assert_eq!(copy.delivery_mode(), &Some(PERSISTENT));
        assert_eq!(copy.content_type(), original.content_type());
        assert_eq!(copy.content_encoding(), original.content_encoding());
        assert_eq!(copy.priority(), original.priority());
        assert_eq!(copy.correlation_id(), original.correlation_id());
        assert_eq!(copy.reply_to(), original.reply_to());
        assert_eq!(copy.timestamp(), original.timestamp());
        assert_eq!(copy.kind(), original.kind());
        assert_eq!(copy.app_id(), original.app_id());
        assert_eq!(copy.expiration(), &None);
        assert_eq!(copy.user_id(), &None);

        // The properties as a whole encode and parse back unchanged.
        let written = gen_properties::<Vec<u8>>(&copy)(Vec::new().into()).expect("encodes");
        let (rest, parsed) = parse_properties(&written.write[..]).expect("parses");
        assert!(rest.is_empty());
        assert_eq!(parsed, copy);
    }

    #[test]
    fn message_id_is_the_envelope_id_even_when_the_property_differed() {
        let original =
            with_headers(vec![(header::ID, ls("header-id"))]).with_message_id("property-id".into());
        let envelope = Envelope::read(&original, "q", NOW);
        let copy = retry_properties(&original, &envelope);
        assert_eq!(
            copy.message_id().as_ref().map(ShortString::as_str),
            Some("header-id")
        );

        // A delivery with no id at all: the new id is written both ways, so
        // every later attempt keeps it.
        let original = BasicProperties::default();
        let envelope = Envelope::read(&original, "q", NOW);
        let copy = retry_properties(&original, &envelope);
        assert_eq!(
            copy.message_id().as_ref().map(ShortString::as_str),
            Some(envelope.id.as_str())
        );
        assert_eq!(Envelope::read(&copy, "q", NOW + 1).id, envelope.id);
        assert_eq!(copy.content_type(), &None);
    }

    #[test]
    fn an_id_too_long_for_message_id_is_carried_by_the_header_alone() {
        let envelope = Envelope {
            id: "i".repeat(300),
            ..full_envelope()
        };
        let copy = retry_properties(&BasicProperties::default(), &envelope);
        assert_eq!(copy.message_id(), &None);
        assert_eq!(get(headers_of(&copy), header::ID), Some(&ls(&envelope.id)));
        let out = outgoing_properties(&envelope, None, true, &[]).expect("accepted");
        assert_eq!(out.message_id(), &None);
    }

    #[test]
    fn set_aside_adds_the_reason_and_keeps_the_attempt() {
        let original = delivered_on_attempt_two();
        let envelope = Envelope::read(&original, "orders.new", NOW);
        let reason = "exhausted 2 attempts: ValueError: no such customer";
        let copy = set_aside_properties(&original, &envelope, reason);

        let headers = over_the_wire(headers_of(&copy));
        assert_eq!(get(&headers, header::ERROR), Some(&ls(reason)));
        assert_eq!(
            get(&headers, header::ATTEMPT),
            Some(&AMQPValue::LongLongInt(2))
        );
        assert_eq!(get(&headers, "x-death"), Some(&x_death()));
        assert_eq!(get(&headers, "traceparent"), Some(&ls(TRACEPARENT)));
        assert_eq!(copy.delivery_mode(), &Some(PERSISTENT));
        assert_eq!(
            copy.message_id().as_ref().map(ShortString::as_str),
            Some("id-1")
        );
        let reread = Envelope::read(&copy, "orders.new", NOW);
        assert_eq!(reread.error.as_deref(), Some(reason));
        assert_eq!(reread.first_seen_ms, EARLIER);

        assert_eq!(envelope.for_set_aside("").error.as_deref(), Some(NO_REASON));
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
    fn reserved_plugin_headers_are_refused_by_name() {
        let headers = vec![
            (
                "x-yourcompany-tenant".to_owned(),
                HeaderValue::Text("t".into()),
            ),
            ("x-acemq-id".to_owned(), HeaderValue::Text("forged".into())),
        ];
        let refused = check_plugin_headers(&headers).unwrap_err();
        assert_eq!(
            refused,
            HeaderError::Reserved {
                name: "x-acemq-id".into()
            }
        );
        assert_eq!(
            refused.to_string(),
            "header 'x-acemq-id' is in the reserved 'x-acemq-' namespace, which belongs to \
             AceMQ; use a namespace of your own, such as x-yourcompany-"
        );

        let shouted = vec![("X-AceMQ-Attempt".to_owned(), HeaderValue::Int(1))];
        assert!(
            check_plugin_headers(&shouted)
                .unwrap_err()
                .to_string()
                .starts_with("header 'X-AceMQ-Attempt' is in the reserved")
        );

        let fine = vec![
            ("acemq-reply-to".to_owned(), HeaderValue::Text("q".into())),
            (
                "traceparent".to_owned(),
                HeaderValue::Text(TRACEPARENT.into()),
            ),
            ("x-acemqish".to_owned(), HeaderValue::Bool(true)),
        ];
        assert_eq!(check_plugin_headers(&fine), Ok(()));
        assert_eq!(check_plugin_headers(&[]), Ok(()));
    }

    #[test]
    fn over_long_plugin_header_names_are_refused_not_panicked_on() {
        let name = "n".repeat(256);
        let headers = vec![(name.clone(), HeaderValue::Int(1))];
        let refused = check_plugin_headers(&headers).unwrap_err();
        assert!(matches!(refused, HeaderError::NameTooLong { len: 256, .. }));
        assert!(refused.to_string().contains("256 bytes"));
        assert!(plugin_headers_to_table(&headers).inner().is_empty());
        assert_eq!(
            check_plugin_headers(&[("n".repeat(255), HeaderValue::Int(1))]),
            Ok(())
        );
        // The preview in the message is cut on a character boundary.
        let wide = "\u{e9}".repeat(200);
        let refused = check_plugin_headers(&[(wide, HeaderValue::Int(1))]).unwrap_err();
        assert!(refused.to_string().contains("..."));
    }

    #[test]
    fn plugin_headers_become_wire_types() {
        let headers = vec![
            ("text".to_owned(), HeaderValue::Text("hello".into())),
            ("int".to_owned(), HeaderValue::Int(-3)),
            ("float".to_owned(), HeaderValue::Float(0.5)),
            ("bool".to_owned(), HeaderValue::Bool(false)),
            ("bytes".to_owned(), HeaderValue::Bytes(vec![1, 2])),
            ("dup".to_owned(), HeaderValue::Int(1)),
            ("dup".to_owned(), HeaderValue::Int(2)),
            (
                "x-acemq-type".to_owned(),
                HeaderValue::Text("skipped".into()),
            ),
        ];
        let table = over_the_wire(&plugin_headers_to_table(&headers));
        assert_eq!(get(&table, "text"), Some(&ls("hello")));
        assert_eq!(get(&table, "int"), Some(&AMQPValue::LongLongInt(-3)));
        assert_eq!(get(&table, "float"), Some(&AMQPValue::Double(0.5)));
        assert_eq!(get(&table, "bool"), Some(&AMQPValue::Boolean(false)));
        assert_eq!(
            get(&table, "bytes"),
            Some(&AMQPValue::ByteArray(ByteArray::from(vec![1, 2])))
        );
        assert_eq!(get(&table, "dup"), Some(&AMQPValue::LongLongInt(2)));
        assert_eq!(get(&table, "x-acemq-type"), None);

        // And what a plugin set, it reads back the same on the next hop.
        let visible = split_table(Some(&table)).visible;
        let mut expected = headers[..5].to_vec();
        expected.push(("dup".to_owned(), HeaderValue::Int(2)));
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(visible, expected);
    }

    #[test]
    fn outgoing_properties_for_a_plugin_message() {
        let parent = full_envelope();
        let envelope = Envelope::child_of(&parent, "invoice.raised".into(), default_origin(), NOW);
        let headers = vec![(
            "traceparent".to_owned(),
            HeaderValue::Text(TRACEPARENT.into()),
        )];

        let persistent = outgoing_properties(&envelope, None, true, &headers).unwrap();
        assert_eq!(
            persistent.content_type().as_ref().map(ShortString::as_str),
            Some(DEFAULT_CONTENT_TYPE)
        );
        assert_eq!(persistent.delivery_mode(), &Some(PERSISTENT));
        assert_eq!(
            persistent.message_id().as_ref().map(ShortString::as_str),
            Some(envelope.id.as_str())
        );
        let table = over_the_wire(headers_of(&persistent));
        assert_eq!(get(&table, "traceparent"), Some(&ls(TRACEPARENT)));
        assert_eq!(get(&table, header::CAUSATION), Some(&ls(&parent.id)));
        assert_eq!(get(&table, header::ORIGIN), Some(&ls(default_origin())));
        assert_eq!(Envelope::read(&persistent, "ignored", NOW + 5), envelope);

        let transient = outgoing_properties(&envelope, Some("text/plain"), false, &[]).unwrap();
        assert_eq!(transient.delivery_mode(), &Some(TRANSIENT));
        assert_eq!(
            transient.content_type().as_ref().map(ShortString::as_str),
            Some("text/plain")
        );
        let empty = outgoing_properties(&envelope, Some(""), true, &[]).unwrap();
        assert_eq!(
            empty.content_type().as_ref().map(ShortString::as_str),
            Some(DEFAULT_CONTENT_TYPE)
        );
    }

    #[test]
    fn outgoing_properties_refuse_reserved_headers_and_long_content_types() {
        let envelope = Envelope::new("t", "", NOW);
        let forged = vec![("x-acemq-attempt".to_owned(), HeaderValue::Int(9))];
        assert_eq!(
            outgoing_properties(&envelope, None, true, &forged),
            Err(HeaderError::Reserved {
                name: "x-acemq-attempt".into()
            })
        );
        let long = "a".repeat(256);
        assert!(matches!(
            outgoing_properties(&envelope, Some(&long), true, &[]),
            Err(HeaderError::ContentTypeTooLong { len: 256, .. })
        ));
    }

    #[test]
    fn header_values_convert_both_ways() {
        let values = [
            HeaderValue::Text("é".into()),
            HeaderValue::Int(i64::MIN),
            HeaderValue::Float(-0.25),
            HeaderValue::Bool(true),
            HeaderValue::Bytes(vec![0xff]),
        ];
        for value in values {
            assert_eq!(
                HeaderValue::from_amqp(&value.to_amqp()),
                Some(value.clone())
            );
        }
        assert_eq!(
            HeaderValue::from_amqp(&AMQPValue::Timestamp(u64::MAX)),
            None
        );
        assert_eq!(HeaderValue::from_amqp(&AMQPValue::Void), None);
        assert_eq!(HeaderValue::from_amqp(&x_death()), None);
        assert_eq!(
            HeaderValue::from_amqp(&AMQPValue::ShortString("s".into())),
            Some(HeaderValue::Text("s".into()))
        );
        assert_eq!(
            HeaderValue::from_amqp(&AMQPValue::LongUInt(u32::MAX)),
            Some(HeaderValue::Int(i64::from(u32::MAX)))
        );
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
