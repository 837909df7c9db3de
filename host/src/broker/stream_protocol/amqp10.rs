//! One message as RabbitMQ stores it in a stream — a run of AMQP 1.0
//! sections — turned into exactly what RabbitMQ 3.10 hands an AMQP 0-9-1
//! consumer of that stream for it: basic.deliver's exchange and routing key,
//! the content header's properties and the body. A host reading over the
//! stream protocol runs each stored message through [`to_amqp091`], so its
//! handlers see the same fields as a host reading over AMQP 0-9-1.
//!
//! The rules are RabbitMQ 3.10's, as its last patch releases behave (a
//! message with no data section reads as an empty body, a null application
//! property as a void header). Where RabbitMQ 3.10 cannot hand a message to
//! a 0-9-1 consumer at all — it stops the consumer's channel instead — this
//! says so with [`DecodeError::Undeliverable`], and the caller decides what
//! a message the other path never delivers becomes. Pure: no I/O.
//!
//! Stricter than RabbitMQ 3.10 in two places, both about malformed input: a
//! list or map whose count disagrees with the elements its size holds is an
//! error (3.10's later patch releases go by the size and ignore the count),
//! and values nested more than 64 deep are refused.

use std::fmt;

use base64::Engine as _;
use bytes::Bytes;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, ByteArray, FieldTable, LongString, ShortString};

/// What an AMQP 0.9.1 consumer of the stream receives for one stored message.
#[derive(Debug, Clone, PartialEq)]
pub struct Amqp091View {
    pub exchange: String,
    pub routing_key: String,
    pub properties: lapin::BasicProperties,
    /// A slice of the stored message: the body is not copied.
    pub body: Bytes,
}

/// Where in a stored message something is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// Between sections, or in a section's descriptor before its kind is known.
    Envelope,
    Header,
    DeliveryAnnotations,
    MessageAnnotations,
    Properties,
    ApplicationProperties,
    Data,
    AmqpSequence,
    AmqpValue,
    Footer,
}

/// Each section's descriptor code and symbol.
const SECTION_DESCRIPTORS: [(Section, u64, &str); 9] = [
    (Section::Header, 0x70, "amqp:header:list"),
    (
        Section::DeliveryAnnotations,
        0x71,
        "amqp:delivery-annotations:map",
    ),
    (
        Section::MessageAnnotations,
        0x72,
        "amqp:message-annotations:map",
    ),
    (Section::Properties, 0x73, "amqp:properties:list"),
    (
        Section::ApplicationProperties,
        0x74,
        "amqp:application-properties:map",
    ),
    (Section::Data, 0x75, "amqp:data:binary"),
    (Section::AmqpSequence, 0x76, "amqp:amqp-sequence:list"),
    (Section::AmqpValue, 0x77, "amqp:amqp-value:*"),
    (Section::Footer, 0x78, "amqp:footer:map"),
];

impl Section {
    /// The section a descriptor names, by code or by symbol. RabbitMQ 3.10
    /// takes a code of any integer type.
    fn named_by(descriptor: &Kind<'_>) -> Option<Self> {
        let code = descriptor.as_integer();
        let symbol = match descriptor {
            Kind::Symbol(name) => Some(*name),
            _ => None,
        };
        SECTION_DESCRIPTORS
            .iter()
            .find(|(_, c, s)| code == Some(i128::from(*c)) || symbol == Some(s.as_bytes()))
            .map(|(section, _, _)| *section)
    }
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Section::Envelope => "section envelope",
            Section::Header => "header section",
            Section::DeliveryAnnotations => "delivery-annotations section",
            Section::MessageAnnotations => "message-annotations section",
            Section::Properties => "properties section",
            Section::ApplicationProperties => "application-properties section",
            Section::Data => "data section",
            Section::AmqpSequence => "amqp-sequence section",
            Section::AmqpValue => "amqp-value section",
            Section::Footer => "footer section",
        })
    }
}

/// Why a stored message gives no AMQP 0-9-1 view. Offsets count bytes from
/// the start of the stored message.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// A value runs past the end of the message or of its enclosing value.
    #[error("{section}: {what} at byte {offset} needs {needed} byte(s), only {available} left")]
    Truncated {
        section: Section,
        what: &'static str,
        offset: usize,
        needed: usize,
        available: usize,
    },
    /// A byte where a constructor belongs is none of AMQP 1.0's.
    #[error("{section}: unknown AMQP 1.0 constructor 0x{code:02x} at byte {offset}")]
    UnknownConstructor {
        section: Section,
        code: u8,
        offset: usize,
    },
    /// A one-byte boolean (0x56) holds neither 0 nor 1.
    #[error("{section}: boolean at byte {offset} holds 0x{byte:02x}, neither 0 nor 1")]
    InvalidBoolean {
        section: Section,
        byte: u8,
        offset: usize,
    },
    /// A list, map or array holds a different number of elements than its
    /// count says.
    #[error(
        "{section}: {compound} at byte {offset} declares {declared} element(s) but its bytes hold {found}"
    )]
    CountMismatch {
        section: Section,
        compound: &'static str,
        offset: usize,
        declared: usize,
        found: usize,
    },
    /// A map's elements do not pair into keys and values.
    #[error("{section}: map at byte {offset} holds an odd number of elements ({count})")]
    OddMapElements {
        section: Section,
        offset: usize,
        count: usize,
    },
    /// Values nest deeper than this reader follows.
    #[error("{section}: values nest deeper than {max} levels at byte {offset}", max = MAX_DEPTH)]
    NestedTooDeep { section: Section, offset: usize },
    /// A message holds a value that is not a section.
    #[error("byte {offset} starts a {found}, not a section (a described type)")]
    NotASection { offset: usize, found: &'static str },
    /// A section's descriptor names none of the nine message sections.
    #[error(
        "section at byte {offset} has descriptor {descriptor}, which names no AMQP 1.0 message section"
    )]
    UnknownSection { offset: usize, descriptor: String },
    /// A section holds a value of the wrong type (a data section that is
    /// not a binary, say).
    #[error("{section} at byte {offset} holds {found} where AMQP 1.0 puts {expected}")]
    WrongSectionBody {
        section: Section,
        offset: usize,
        expected: &'static str,
        found: String,
    },
    /// A well-formed message RabbitMQ 3.10 does not hand to a 0-9-1
    /// consumer: its consumer's channel stops on it instead.
    #[error(
        "RabbitMQ 3.10 cannot hand this message to an AMQP 0-9-1 consumer ({section}, byte {offset}): {reason}"
    )]
    Undeliverable {
        section: Section,
        offset: usize,
        reason: String,
    },
    /// A value bound for a 0-9-1 short string is not UTF-8: RabbitMQ 3.10
    /// would send it, but lapin cannot read it.
    #[error(
        "{section}: {what} at byte {offset} is not UTF-8, which an AMQP 0-9-1 short string must be for lapin"
    )]
    NotUtf8 {
        section: Section,
        offset: usize,
        what: String,
    },
}

/// `stream` is the stream's name (the routing key when the message carries
/// none), `offset` the message's offset (added as the `x-stream-offset`
/// header, a signed long, as the broker does for 0.9.1 consumers).
///
/// A malformed message is an error naming what is wrong and where; one that
/// RabbitMQ 3.10 would not deliver to a 0-9-1 consumer is
/// [`DecodeError::Undeliverable`].
pub fn to_amqp091(message: &Bytes, stream: &str, offset: u64) -> Result<Amqp091View, DecodeError> {
    let sections = read_sections(message)?;
    let kept = KeptSections::from_sections(&sections)?;
    // Without the annotations the message most likely came in over the
    // stream protocol: RabbitMQ 3.10 then delivers it as if published to the
    // default exchange with the stream's name as routing key.
    let exchange = kept
        .address_annotation(EXCHANGE_ANNOTATION)?
        .unwrap_or_default();
    let routing_key = kept
        .address_annotation(ROUTING_KEY_ANNOTATION)?
        .unwrap_or_else(|| stream.to_owned());
    let properties = kept.basic_properties(offset)?;
    let body = kept
        .body
        .map(|body| message.slice_ref(body))
        .unwrap_or_default();
    Ok(Amqp091View {
        exchange,
        routing_key,
        properties,
        body,
    })
}

// ---------------------------------------------------------------------------
// The sections RabbitMQ 3.10 keeps of a message.

const EXCHANGE_ANNOTATION: &str = "x-exchange";
const ROUTING_KEY_ANNOTATION: &str = "x-routing-key";
const PRIORITY_ANNOTATION: &str = "x-basic-priority";
const DELIVERY_MODE_ANNOTATION: &str = "x-basic-delivery-mode";
const EXPIRATION_ANNOTATION: &str = "x-basic-expiration";
const TYPE_APPLICATION_PROPERTY: &str = "x-basic-type";
const APP_ID_APPLICATION_PROPERTY: &str = "x-basic-app-id";
const STREAM_OFFSET_HEADER: &str = "x-stream-offset";
/// Headers RabbitMQ 3.10 reads as sender-selected routing keys.
const ROUTING_HEADERS: [&str; 2] = ["CC", "BCC"];
/// The fields of the properties section, in order.
const PROPERTIES_FIELDS: [&str; 13] = [
    "message-id",
    "user-id",
    "to",
    "subject",
    "reply-to",
    "correlation-id",
    "content-type",
    "content-encoding",
    "absolute-expiry-time",
    "creation-time",
    "group-id",
    "group-sequence",
    "reply-to-group-id",
];

/// The properties fields RabbitMQ 3.10 reads (it drops to, subject,
/// absolute-expiry-time and the group fields).
#[derive(Clone, Copy)]
enum Field {
    MessageId = 0,
    UserId = 1,
    ReplyTo = 4,
    CorrelationId = 5,
    ContentType = 6,
    ContentEncoding = 7,
    CreationTime = 9,
}

impl Field {
    fn name(self) -> &'static str {
        PROPERTIES_FIELDS[self as usize]
    }
}

/// The longest AMQP 0-9-1 short string.
const MAX_SHORT_STRING: usize = 255;
/// RabbitMQ 3.10 moves a message or correlation id to a header when it is
/// longer than this (one byte more than a short string holds: an id of
/// exactly 256 bytes reaches the 0-9-1 encoder, which refuses it).
const LONGEST_ID_PROPERTY: usize = 256;
/// How deep values may nest before the reader refuses them (the stack is
/// finite; no real message comes near).
const MAX_DEPTH: usize = 64;

type Entry<'a> = (Value<'a>, Value<'a>);

/// A section as stored: its kind, where it starts, its value.
struct StoredSection<'a> {
    section: Section,
    offset: usize,
    body: Value<'a>,
}

/// The four sections RabbitMQ 3.10 reads; of each, the last one wins.
#[derive(Default)]
struct KeptSections<'s, 'a> {
    annotations: &'s [Entry<'a>],
    properties: &'s [Value<'a>],
    application_properties: &'s [Entry<'a>],
    body: Option<&'a [u8]>,
}

fn read_sections(message: &[u8]) -> Result<Vec<StoredSection<'_>>, DecodeError> {
    let mut reader = Reader::new(message);
    let mut sections = Vec::new();
    while !reader.is_empty() {
        reader.section = Section::Envelope;
        let offset = reader.pos;
        let code = reader.byte("section constructor")?;
        if code != DESCRIBED {
            return Err(DecodeError::NotASection {
                offset,
                found: constructor_name(code).unwrap_or("value of unknown type"),
            });
        }
        let descriptor = reader.value()?;
        let section =
            Section::named_by(&descriptor.kind).ok_or_else(|| DecodeError::UnknownSection {
                offset,
                descriptor: descriptor.kind.describe(),
            })?;
        reader.section = section;
        let body = reader.value()?;
        sections.push(StoredSection {
            section,
            offset,
            body,
        });
    }
    Ok(sections)
}

impl<'s, 'a> KeptSections<'s, 'a> {
    fn from_sections(sections: &'s [StoredSection<'a>]) -> Result<Self, DecodeError> {
        let mut kept = KeptSections::default();
        for stored in sections {
            match stored.section {
                Section::MessageAnnotations => kept.annotations = stored.map()?,
                Section::Properties => kept.properties = stored.properties()?,
                Section::ApplicationProperties => kept.application_properties = stored.map()?,
                // Several data sections: RabbitMQ 3.10 keeps the last.
                Section::Data => kept.body = Some(stored.binary()?),
                other => {
                    return Err(DecodeError::Undeliverable {
                        section: other,
                        offset: stored.offset,
                        reason: "only message-annotations, properties, application-properties \
                                 and data sections are read; any other stops the consumer's \
                                 channel"
                            .to_owned(),
                    });
                }
            }
        }
        Ok(kept)
    }

    /// `x-exchange` or `x-routing-key`, looked up as RabbitMQ 3.10 does: the
    /// first annotation of that name, which must be a string; every key
    /// passed on the way must be a symbol (it assumes so, and fails
    /// otherwise).
    fn address_annotation(&self, name: &str) -> Result<Option<String>, DecodeError> {
        for (key, value) in self.annotations {
            let Kind::Symbol(symbol) = &key.kind else {
                return Err(undeliverable(
                    Section::MessageAnnotations,
                    key.offset,
                    format!(
                        "an annotation key is a {}, and {name} is looked up assuming every \
                         key before it is a symbol",
                        key.kind.type_name()
                    ),
                ));
            };
            if *symbol != name.as_bytes() {
                continue;
            }
            let spot = Spot::new(Section::MessageAnnotations, value, name);
            return match &value.kind {
                Kind::Utf8(text) => short_string(text, spot).map(|s| Some(String::from(s))),
                other => Err(spot.undeliverable(format!(
                    "is a {}; only a string is taken",
                    other.type_name()
                ))),
            };
        }
        Ok(None)
    }

    fn basic_properties(&self, offset: u64) -> Result<BasicProperties, DecodeError> {
        let mut application_properties: Vec<&Entry<'a>> =
            self.application_properties.iter().collect();
        // RabbitMQ 3.10 keeps 0-9-1's type and app-id, which AMQP 1.0 lacks,
        // as two application properties, and takes them back out.
        let kind = take_entry(&mut application_properties, TYPE_APPLICATION_PROPERTY);
        let app_id = take_entry(&mut application_properties, APP_ID_APPLICATION_PROPERTY);
        let mut headers = Headers::from_application_properties(&application_properties)?;

        let properties = BasicProperties::default();
        let properties = self.with_properties_fields(properties, &mut headers)?;
        let properties = self.with_annotations(properties)?;
        let properties = set(
            properties,
            application_property(kind, TYPE_APPLICATION_PROPERTY)?,
            BasicProperties::with_type,
        );
        let properties = set(
            properties,
            application_property(app_id, APP_ID_APPLICATION_PROPERTY)?,
            BasicProperties::with_app_id,
        );
        // As RabbitMQ 3.10 does for 0-9-1 consumers of a stream, so a handler
        // sees the offset on both paths: it replaces any header of that name.
        headers.store(STREAM_OFFSET_HEADER, AMQPValue::LongLongInt(offset as i64));
        Ok(properties.with_headers(headers.into_field_table()))
    }

    /// What RabbitMQ 3.10 reads of the properties section; the ids may add
    /// headers.
    fn with_properties_fields(
        &self,
        properties: BasicProperties,
        headers: &mut Headers,
    ) -> Result<BasicProperties, DecodeError> {
        let properties = set(
            properties,
            self.id_property(IdProperty::Message, headers)?,
            BasicProperties::with_message_id,
        );
        let properties = set(
            properties,
            self.id_property(IdProperty::Correlation, headers)?,
            BasicProperties::with_correlation_id,
        );
        let properties = set(
            properties,
            self.string_field(Field::UserId)?,
            BasicProperties::with_user_id,
        );
        let properties = set(
            properties,
            self.string_field(Field::ReplyTo)?,
            BasicProperties::with_reply_to,
        );
        let properties = set(
            properties,
            self.string_field(Field::ContentType)?,
            BasicProperties::with_content_type,
        );
        let properties = set(
            properties,
            self.string_field(Field::ContentEncoding)?,
            BasicProperties::with_content_encoding,
        );
        Ok(set(
            properties,
            self.creation_time()?,
            BasicProperties::with_timestamp,
        ))
    }

    /// The 0-9-1 properties AMQP 1.0 has no field for, which RabbitMQ 3.10
    /// keeps as message annotations.
    fn with_annotations(
        &self,
        properties: BasicProperties,
    ) -> Result<BasicProperties, DecodeError> {
        let properties = set(
            properties,
            self.annotation(PRIORITY_ANNOTATION, octet)?,
            BasicProperties::with_priority,
        );
        let properties = set(
            properties,
            self.annotation(DELIVERY_MODE_ANNOTATION, delivery_mode)?,
            BasicProperties::with_delivery_mode,
        );
        Ok(set(
            properties,
            self.annotation(EXPIRATION_ANNOTATION, string_value)?,
            BasicProperties::with_expiration,
        ))
    }

    /// A properties field RabbitMQ 3.10 copies into a 0-9-1 short string.
    fn string_field(&self, field: Field) -> Result<Option<ShortString>, DecodeError> {
        match self.field(field) {
            Some(value) => string_value(value, Spot::new(Section::Properties, value, field.name())),
            None => Ok(None),
        }
    }

    /// A properties field; one past the end of the list is null.
    fn field(&self, field: Field) -> Option<&'s Value<'a>> {
        self.properties.get(field as usize)
    }

    /// creation-time is milliseconds; 0-9-1's timestamp is seconds, and
    /// RabbitMQ 3.10 divides, truncating toward zero.
    fn creation_time(&self) -> Result<Option<u64>, DecodeError> {
        let Some(value) = self.field(Field::CreationTime) else {
            return Ok(None);
        };
        let spot = Spot::new(Section::Properties, value, Field::CreationTime.name());
        match &value.kind {
            Kind::Null => Ok(None),
            kind => match kind.as_integer() {
                Some(millis) => Ok(Some(seconds_as_timestamp(millis))),
                None => Err(spot.undeliverable(format!("is a {}, not a number", kind.type_name()))),
            },
        }
    }

    fn id_property(
        &self,
        id: IdProperty,
        headers: &mut Headers,
    ) -> Result<Option<ShortString>, DecodeError> {
        match self.field(id.field()) {
            Some(value) => id_value(value, id, headers),
            None => Ok(None),
        }
    }

    /// The first message annotation with this symbol key, read by `read`.
    fn annotation<T>(
        &self,
        name: &'static str,
        read: fn(&Value<'a>, Spot<'_>) -> Result<Option<T>, DecodeError>,
    ) -> Result<Option<T>, DecodeError> {
        match self
            .annotations
            .iter()
            .find(|(key, _)| is_symbol_key(key, name))
        {
            Some((_, value)) => read(value, Spot::new(Section::MessageAnnotations, value, name)),
            None => Ok(None),
        }
    }
}

impl<'a> StoredSection<'a> {
    fn map(&self) -> Result<&[Entry<'a>], DecodeError> {
        match &self.body.kind {
            Kind::Map(entries) => {
                for (key, value) in entries {
                    self.no_described(key)?;
                    self.no_described(value)?;
                }
                Ok(entries)
            }
            other => Err(self.wrong_body("a map", format!("a {}", other.type_name()))),
        }
    }

    fn properties(&self) -> Result<&[Value<'a>], DecodeError> {
        match &self.body.kind {
            Kind::List(fields) if fields.len() <= PROPERTIES_FIELDS.len() => {
                for field in fields {
                    self.no_described(field)?;
                }
                Ok(fields)
            }
            Kind::List(fields) => Err(self.wrong_body(
                "a list of at most 13 fields",
                format!("a list of {} fields", fields.len()),
            )),
            other => Err(self.wrong_body("a list", format!("a {}", other.type_name()))),
        }
    }

    fn binary(&self) -> Result<&'a [u8], DecodeError> {
        match &self.body.kind {
            Kind::Binary(bytes) => Ok(bytes),
            other => Err(self.wrong_body("a binary", format!("a {}", other.type_name()))),
        }
    }

    /// RabbitMQ 3.10 reads a described value in these places as an AMQP 1.0
    /// frame of its own, and stops the channel on one it cannot read.
    fn no_described(&self, value: &Value<'_>) -> Result<(), DecodeError> {
        match value.kind {
            Kind::Described => Err(undeliverable(
                self.section,
                value.offset,
                "a described value here is read as an AMQP 1.0 frame of its own".to_owned(),
            )),
            _ => Ok(()),
        }
    }

    fn wrong_body(&self, expected: &'static str, found: String) -> DecodeError {
        DecodeError::WrongSectionBody {
            section: self.section,
            offset: self.offset,
            expected,
            found,
        }
    }
}

/// Sets `value` on `properties` with `with`, when there is one.
fn set<T>(
    properties: BasicProperties,
    value: Option<T>,
    with: fn(BasicProperties, T) -> BasicProperties,
) -> BasicProperties {
    match value {
        Some(value) => with(properties, value),
        None => properties,
    }
}

// RabbitMQ 3.10 looks keys up by type as well as name: x-basic-type and
// x-basic-app-id as strings, annotations as symbols.

fn is_string_key(key: &Value<'_>, name: &str) -> bool {
    matches!(key.kind, Kind::Utf8(bytes) if bytes == name.as_bytes())
}

fn is_symbol_key(key: &Value<'_>, name: &str) -> bool {
    matches!(key.kind, Kind::Symbol(bytes) if bytes == name.as_bytes())
}

/// Removes the first entry with the string key `name`, and gives its value.
fn take_entry<'e, 'a>(entries: &mut Vec<&'e Entry<'a>>, name: &str) -> Option<&'e Value<'a>> {
    let position = entries
        .iter()
        .position(|(key, _)| is_string_key(key, name))?;
    Some(&entries.remove(position).1)
}

fn application_property(
    value: Option<&Value<'_>>,
    name: &str,
) -> Result<Option<ShortString>, DecodeError> {
    match value {
        Some(value) => string_value(
            value,
            Spot::new(Section::ApplicationProperties, value, name),
        ),
        None => Ok(None),
    }
}

// ---------------------------------------------------------------------------
// Values into 0-9-1 properties.

/// A value being mapped, for error messages: its section, offset and name.
#[derive(Clone, Copy)]
struct Spot<'w> {
    section: Section,
    offset: usize,
    what: &'w str,
}

impl<'w> Spot<'w> {
    fn new(section: Section, value: &Value<'_>, what: &'w str) -> Self {
        Spot {
            section,
            offset: value.offset,
            what,
        }
    }

    fn undeliverable(self, reason: String) -> DecodeError {
        undeliverable(self.section, self.offset, format!("{} {reason}", self.what))
    }

    fn not_utf8(self) -> DecodeError {
        DecodeError::NotUtf8 {
            section: self.section,
            offset: self.offset,
            what: self.what.to_owned(),
        }
    }
}

fn undeliverable(section: Section, offset: usize, reason: String) -> DecodeError {
    DecodeError::Undeliverable {
        section,
        offset,
        reason,
    }
}

/// Bytes RabbitMQ 3.10 writes into a 0-9-1 short string: it refuses any of
/// 256 bytes or more (stopping the channel); lapin reads only UTF-8.
fn short_string(bytes: &[u8], spot: Spot<'_>) -> Result<ShortString, DecodeError> {
    if bytes.len() > MAX_SHORT_STRING {
        return Err(spot.undeliverable(format!(
            "is {} bytes, more than a 0-9-1 short string holds",
            bytes.len()
        )));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| spot.not_utf8())?;
    ShortString::try_new(text).map_err(|e| spot.undeliverable(e.to_string()))
}

/// A value for a 0-9-1 short-string property: RabbitMQ 3.10 copies the
/// bytes of any value it holds as plain bytes (string, symbol, binary, uuid,
/// char), and a null is no property.
fn string_value(value: &Value<'_>, spot: Spot<'_>) -> Result<Option<ShortString>, DecodeError> {
    match (&value.kind, value.kind.as_bytes()) {
        (Kind::Null, _) => Ok(None),
        (_, Some(bytes)) => short_string(bytes, spot).map(Some),
        (kind, None) => Err(spot.undeliverable(format!(
            "is a {}, which cannot be written as a 0-9-1 string",
            kind.type_name()
        ))),
    }
}

/// A value for a 0-9-1 octet property (priority): RabbitMQ 3.10 writes any
/// integer, keeping its low eight bits.
fn octet(value: &Value<'_>, spot: Spot<'_>) -> Result<Option<u8>, DecodeError> {
    match (&value.kind, value.kind.as_integer()) {
        (Kind::Null, _) => Ok(None),
        (_, Some(number)) => Ok(Some(number as u8)),
        (kind, None) => Err(spot.undeliverable(format!(
            "is a {}, which cannot be written as a 0-9-1 octet",
            kind.type_name()
        ))),
    }
}

/// RabbitMQ 3.10 accepts only 1 (transient) or 2 (persistent) as a delivery
/// mode, and stops the channel on anything else.
fn delivery_mode(value: &Value<'_>, spot: Spot<'_>) -> Result<Option<u8>, DecodeError> {
    match (&value.kind, value.kind.as_integer()) {
        (Kind::Null, _) => Ok(None),
        (_, Some(mode @ (1 | 2))) => Ok(Some(mode as u8)),
        (_, Some(mode)) => Err(spot.undeliverable(format!("is {mode}; only 1 or 2 is accepted"))),
        (kind, None) => Err(spot.undeliverable(format!(
            "is a {}; only 1 or 2 is accepted",
            kind.type_name()
        ))),
    }
}

/// Milliseconds to a 0-9-1 timestamp: seconds, truncated toward zero, as
/// the 64 bits RabbitMQ 3.10 writes (a time before 1970 wraps around).
fn seconds_as_timestamp(millis: i128) -> u64 {
    (millis / 1000) as u64
}

/// message-id or correlation-id: AMQP 1.0 allows four types where 0-9-1 has
/// a short string.
#[derive(Clone, Copy)]
enum IdProperty {
    Message,
    Correlation,
}

impl IdProperty {
    fn field(self) -> Field {
        match self {
            IdProperty::Message => Field::MessageId,
            IdProperty::Correlation => Field::CorrelationId,
        }
    }

    /// The header naming the AMQP 1.0 type of an id that is not a string.
    fn type_header(self) -> &'static str {
        match self {
            IdProperty::Message => "x-message-id-type",
            IdProperty::Correlation => "x-correlation-id-type",
        }
    }

    /// The header holding an id too long for the property.
    fn value_header(self) -> &'static str {
        match self {
            IdProperty::Message => "x-message-id",
            IdProperty::Correlation => "x-correlation-id",
        }
    }
}

/// An id as RabbitMQ 3.10 maps it: a uuid as its canonical lowercase text,
/// a ulong in decimal and a binary in base64, each with a header naming the
/// type; a string or base64 text longer than 256 bytes goes, as it was
/// stored, to a long-string header instead of the property.
fn id_value(
    value: &Value<'_>,
    id: IdProperty,
    headers: &mut Headers,
) -> Result<Option<ShortString>, DecodeError> {
    let spot = Spot::new(Section::Properties, value, id.field().name());
    let typed = |headers: &mut Headers, type_name: &str, text: &str| {
        headers.prepend(id.type_header(), long_string(type_name.as_bytes()));
        short_string(text.as_bytes(), spot).map(Some)
    };
    match &value.kind {
        Kind::Uuid(bytes) => typed(
            headers,
            "uuid",
            &uuid::Uuid::from_bytes(*bytes).hyphenated().to_string(),
        ),
        Kind::Ulong(number) => typed(headers, "ulong", &number.to_string()),
        Kind::Binary(bytes) => {
            let text = base64::engine::general_purpose::STANDARD.encode(bytes);
            if text.len() > LONGEST_ID_PROPERTY {
                headers.prepend(id.value_header(), long_string(bytes));
                return Ok(None);
            }
            typed(headers, "binary", &text)
        }
        Kind::Utf8(text) if text.len() > LONGEST_ID_PROPERTY => {
            headers.prepend(id.value_header(), long_string(text));
            Ok(None)
        }
        _ => string_value(value, spot),
    }
}

fn long_string(bytes: &[u8]) -> AMQPValue {
    AMQPValue::LongString(LongString::from(bytes.to_vec()))
}

// ---------------------------------------------------------------------------
// Application properties into 0-9-1 headers.

/// The headers in the order RabbitMQ 3.10 writes them. lapin keeps the last
/// of two equal keys, so the order decides what a duplicate reads as.
struct Headers(Vec<(ShortString, AMQPValue)>);

impl Headers {
    fn from_application_properties(entries: &[&Entry<'_>]) -> Result<Self, DecodeError> {
        let mut headers = Vec::with_capacity(entries.len() + 3);
        for (key, value) in entries {
            headers.push((header_name(key)?, header_value(key, value)?));
        }
        Ok(Headers(headers))
    }

    /// Adds a header in front, as RabbitMQ 3.10 adds the id headers.
    fn prepend(&mut self, name: &'static str, value: AMQPValue) {
        self.0.insert(0, (ShortString::from(name), value));
    }

    /// Replaces the first header of that name, or adds one at the end.
    fn store(&mut self, name: &'static str, value: AMQPValue) {
        match self.0.iter_mut().find(|(key, _)| key.as_str() == name) {
            Some(entry) => entry.1 = value,
            None => self.0.push((ShortString::from(name), value)),
        }
    }

    /// RabbitMQ 3.10 sorts the headers by name (stably) when it adds the
    /// offset; lapin then reads them in that order.
    fn into_field_table(mut self) -> FieldTable {
        self.0.sort_by(|(a, _), (b, _)| a.as_str().cmp(b.as_str()));
        let mut table = FieldTable::default();
        for (name, value) in self.0 {
            table.insert(name, value);
        }
        table
    }
}

fn header_name(key: &Value<'_>) -> Result<ShortString, DecodeError> {
    let spot = Spot::new(
        Section::ApplicationProperties,
        key,
        "application property key",
    );
    let Some(name) = key.kind.as_bytes() else {
        return Err(spot.undeliverable(format!(
            "is a {}, which cannot be a 0-9-1 header name",
            key.kind.type_name()
        )));
    };
    let name = short_string(name, spot)?;
    if ROUTING_HEADERS.contains(&name.as_str()) {
        return Err(spot.undeliverable(format!(
            "{name}: a header of that name is read as extra routing keys, and any value \
             but an array (which an application property cannot be) is refused"
        )));
    }
    Ok(name)
}

/// The header type RabbitMQ 3.10 picks for each AMQP 1.0 type; the types it
/// has none for (ulong, symbol, uuid, char, decimals, NaN or infinite
/// floats, lists, maps, arrays, described values) stop the channel.
fn header_value(key: &Value<'_>, value: &Value<'_>) -> Result<AMQPValue, DecodeError> {
    let converted = match &value.kind {
        Kind::Utf8(text) => Some(long_string(text)),
        Kind::Long(n) => Some(AMQPValue::LongLongInt(*n)),
        Kind::Int(n) => Some(AMQPValue::LongInt(*n)),
        Kind::Short(n) => Some(AMQPValue::ShortInt(*n)),
        Kind::Byte(n) => Some(AMQPValue::ShortShortInt(*n)),
        Kind::Ubyte(n) => Some(AMQPValue::ShortShortUInt(*n)),
        Kind::Ushort(n) => Some(AMQPValue::ShortUInt(*n)),
        Kind::Uint(n) => Some(AMQPValue::LongUInt(*n)),
        Kind::Double(x) if x.is_finite() => Some(AMQPValue::Double(*x)),
        Kind::Float(x) if x.is_finite() => Some(AMQPValue::Float(*x)),
        Kind::Timestamp(millis) => Some(AMQPValue::Timestamp(seconds_as_timestamp(i128::from(
            *millis,
        )))),
        Kind::Binary(bytes) => Some(AMQPValue::ByteArray(ByteArray::from(*bytes))),
        Kind::Bool(b) => Some(AMQPValue::Boolean(*b)),
        Kind::Null => Some(AMQPValue::Void),
        _ => None,
    };
    converted.ok_or_else(|| {
        let name = String::from_utf8_lossy(key.kind.as_bytes().unwrap_or_default());
        undeliverable(
            Section::ApplicationProperties,
            value.offset,
            format!(
                "application property \"{name}\" is a {}, which has no 0-9-1 header type",
                value.kind.type_name()
            ),
        )
    })
}

// ---------------------------------------------------------------------------
// The AMQP 1.0 type system, as far as a message needs it.

/// The constructor of a described type.
const DESCRIBED: u8 = 0x00;

/// A decoded value and the offset of its constructor.
struct Value<'a> {
    offset: usize,
    kind: Kind<'a>,
}

enum Kind<'a> {
    Null,
    Bool(bool),
    Ubyte(u8),
    Ushort(u16),
    Uint(u32),
    Ulong(u64),
    Byte(i8),
    Short(i16),
    Int(i32),
    Long(i64),
    Float(f32),
    Double(f64),
    /// decimal32/64/128: nothing here reads one.
    Decimal,
    /// A UTF-32BE code point, as stored.
    Char(&'a [u8]),
    /// Milliseconds since the epoch.
    Timestamp(i64),
    Uuid([u8; 16]),
    Binary(&'a [u8]),
    /// A string's bytes, not checked for UTF-8 (RabbitMQ 3.10 does not).
    Utf8(&'a [u8]),
    Symbol(&'a [u8]),
    List(Vec<Value<'a>>),
    Map(Vec<Entry<'a>>),
    /// Read and checked; nothing here looks inside one.
    Array,
    /// Read and checked; nothing here looks inside one.
    Described,
}

impl<'a> Kind<'a> {
    /// The value as an integer, for the places RabbitMQ 3.10 takes any
    /// integer type.
    fn as_integer(&self) -> Option<i128> {
        match *self {
            Kind::Ubyte(n) => Some(n.into()),
            Kind::Ushort(n) => Some(n.into()),
            Kind::Uint(n) => Some(n.into()),
            Kind::Ulong(n) => Some(n.into()),
            Kind::Byte(n) => Some(n.into()),
            Kind::Short(n) => Some(n.into()),
            Kind::Int(n) => Some(n.into()),
            Kind::Long(n) | Kind::Timestamp(n) => Some(n.into()),
            _ => None,
        }
    }

    /// The bytes of a value RabbitMQ 3.10 holds as plain bytes, which it
    /// writes into a 0-9-1 string as they are.
    fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Kind::Binary(bytes) | Kind::Utf8(bytes) | Kind::Symbol(bytes) | Kind::Char(bytes) => {
                Some(bytes)
            }
            Kind::Uuid(bytes) => Some(bytes.as_slice()),
            _ => None,
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Bool(_) => "boolean",
            Kind::Ubyte(_) => "ubyte",
            Kind::Ushort(_) => "ushort",
            Kind::Uint(_) => "uint",
            Kind::Ulong(_) => "ulong",
            Kind::Byte(_) => "byte",
            Kind::Short(_) => "short",
            Kind::Int(_) => "int",
            Kind::Long(_) => "long",
            Kind::Float(x) if !x.is_finite() => "NaN or infinite float",
            Kind::Float(_) => "float",
            Kind::Double(x) if !x.is_finite() => "NaN or infinite double",
            Kind::Double(_) => "double",
            Kind::Decimal => "decimal",
            Kind::Char(_) => "char",
            Kind::Timestamp(_) => "timestamp",
            Kind::Uuid(_) => "uuid",
            Kind::Binary(_) => "binary",
            Kind::Utf8(_) => "string",
            Kind::Symbol(_) => "symbol",
            Kind::List(_) => "list",
            Kind::Map(_) => "map",
            Kind::Array => "array",
            Kind::Described => "described value",
        }
    }

    /// A descriptor, for an error message.
    fn describe(&self) -> String {
        match (self, self.as_integer()) {
            (_, Some(code)) => format!("0x{code:x}"),
            (Kind::Symbol(name), None) => format!("\"{}\"", String::from_utf8_lossy(name)),
            (other, None) => format!("of type {}", other.type_name()),
        }
    }
}

/// The name of the type a constructor starts; `None` for a byte that is
/// no AMQP 1.0 constructor.
fn constructor_name(code: u8) -> Option<&'static str> {
    Some(match code {
        0x40 => "null",
        0x41 | 0x42 | 0x56 => "boolean",
        0x43 | 0x52 | 0x70 => "uint",
        0x44 | 0x53 | 0x80 => "ulong",
        0x45 | 0xc0 | 0xd0 => "list",
        0x50 => "ubyte",
        0x51 => "byte",
        0x54 | 0x71 => "int",
        0x55 | 0x81 => "long",
        0x60 => "ushort",
        0x61 => "short",
        0x72 => "float",
        0x73 => "char",
        0x74 | 0x84 | 0x94 => "decimal",
        0x82 => "double",
        0x83 => "timestamp",
        0x98 => "uuid",
        0xa0 | 0xb0 => "binary",
        0xa1 | 0xb1 => "string",
        0xa3 | 0xb3 => "symbol",
        0xc1 | 0xd1 => "map",
        0xe0 | 0xf0 => "array",
        _ => return None,
    })
}

/// The array element constructors RabbitMQ 3.10 can read; it stops on an
/// array of any other type.
const ARRAY_ELEMENT_CONSTRUCTORS: [u8; 15] = [
    0x40, 0x56, 0x50, 0x51, 0x60, 0x61, 0x70, 0x71, 0x80, 0x81, 0xa1, 0xb1, 0xa3, 0xb3, 0xf0,
];

/// How wide a compound's size and count are.
#[derive(Clone, Copy)]
enum Width {
    One,
    Four,
}

/// Reads values from `message[pos..end]`, checking every length against
/// what is left; offsets in errors are from the message's start.
struct Reader<'a> {
    message: &'a [u8],
    pos: usize,
    end: usize,
    section: Section,
    depth: usize,
}

impl<'a> Reader<'a> {
    fn new(message: &'a [u8]) -> Self {
        Reader {
            message,
            pos: 0,
            end: message.len(),
            section: Section::Envelope,
            depth: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.pos >= self.end
    }

    fn take(&mut self, needed: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let available = self.end - self.pos;
        if needed > available {
            return Err(DecodeError::Truncated {
                section: self.section,
                what,
                offset: self.pos,
                needed,
                available,
            });
        }
        let bytes = &self.message[self.pos..self.pos + needed];
        self.pos += needed;
        Ok(bytes)
    }

    fn fixed<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn byte(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.fixed::<1>(what)?[0])
    }

    fn size(&mut self, width: Width, what: &'static str) -> Result<usize, DecodeError> {
        match width {
            Width::One => self.byte(what).map(usize::from),
            Width::Four => Ok(u32::from_be_bytes(self.fixed(what)?) as usize),
        }
    }

    /// The next `size` bytes as a reader of their own, one level deeper.
    fn nested(
        &mut self,
        size: usize,
        what: &'static str,
        offset: usize,
    ) -> Result<Reader<'a>, DecodeError> {
        let start = self.pos;
        self.take(size, what)?;
        Ok(Reader {
            message: self.message,
            pos: start,
            end: start + size,
            section: self.section,
            depth: self.deeper(offset)?,
        })
    }

    fn deeper(&self, offset: usize) -> Result<usize, DecodeError> {
        if self.depth >= MAX_DEPTH {
            return Err(DecodeError::NestedTooDeep {
                section: self.section,
                offset,
            });
        }
        Ok(self.depth + 1)
    }

    fn value(&mut self) -> Result<Value<'a>, DecodeError> {
        let offset = self.pos;
        let code = self.byte("constructor")?;
        let kind = if code == DESCRIBED {
            self.described(offset)?
        } else {
            self.primitive(code, offset)?
        };
        Ok(Value { offset, kind })
    }

    /// A described value: its descriptor, then its value.
    fn described(&mut self, offset: usize) -> Result<Kind<'a>, DecodeError> {
        let outer = self.depth;
        self.depth = self.deeper(offset)?;
        self.value()?;
        self.value()?;
        self.depth = outer;
        Ok(Kind::Described)
    }

    /// The value after constructor `code`.
    fn primitive(&mut self, code: u8, offset: usize) -> Result<Kind<'a>, DecodeError> {
        Ok(match code {
            0x40 => Kind::Null,
            0x41 => Kind::Bool(true),
            0x42 => Kind::Bool(false),
            0x43 => Kind::Uint(0),
            0x44 => Kind::Ulong(0),
            0x45 => Kind::List(Vec::new()),
            0x50 => Kind::Ubyte(self.byte("ubyte")?),
            0x51 => Kind::Byte(i8::from_be_bytes(self.fixed("byte")?)),
            0x52 => Kind::Uint(self.byte("smalluint")?.into()),
            0x53 => Kind::Ulong(self.byte("smallulong")?.into()),
            0x54 => Kind::Int(i8::from_be_bytes(self.fixed("smallint")?).into()),
            0x55 => Kind::Long(i8::from_be_bytes(self.fixed("smalllong")?).into()),
            0x56 => Kind::Bool(self.boolean_byte()?),
            0x60 => Kind::Ushort(u16::from_be_bytes(self.fixed("ushort")?)),
            0x61 => Kind::Short(i16::from_be_bytes(self.fixed("short")?)),
            0x70 => Kind::Uint(u32::from_be_bytes(self.fixed("uint")?)),
            0x71 => Kind::Int(i32::from_be_bytes(self.fixed("int")?)),
            0x72 => Kind::Float(f32::from_be_bytes(self.fixed("float")?)),
            0x73 => Kind::Char(self.take(4, "char")?),
            0x74 => self.take(4, "decimal32").map(|_| Kind::Decimal)?,
            0x80 => Kind::Ulong(u64::from_be_bytes(self.fixed("ulong")?)),
            0x81 => Kind::Long(i64::from_be_bytes(self.fixed("long")?)),
            0x82 => Kind::Double(f64::from_be_bytes(self.fixed("double")?)),
            0x83 => Kind::Timestamp(i64::from_be_bytes(self.fixed("timestamp")?)),
            0x84 => self.take(8, "decimal64").map(|_| Kind::Decimal)?,
            0x94 => self.take(16, "decimal128").map(|_| Kind::Decimal)?,
            0x98 => Kind::Uuid(self.fixed("uuid")?),
            0xa0 => Kind::Binary(self.variable(Width::One, "vbin8")?),
            0xa1 => Kind::Utf8(self.variable(Width::One, "str8")?),
            0xa3 => Kind::Symbol(self.variable(Width::One, "sym8")?),
            0xb0 => Kind::Binary(self.variable(Width::Four, "vbin32")?),
            0xb1 => Kind::Utf8(self.variable(Width::Four, "str32")?),
            0xb3 => Kind::Symbol(self.variable(Width::Four, "sym32")?),
            0xc0 => Kind::List(self.compound(Width::One, "list8", offset)?),
            0xd0 => Kind::List(self.compound(Width::Four, "list32", offset)?),
            0xc1 => Kind::Map(self.map(Width::One, "map8", offset)?),
            0xd1 => Kind::Map(self.map(Width::Four, "map32", offset)?),
            0xe0 => self.array(Width::One, "array8", offset)?,
            0xf0 => self.array(Width::Four, "array32", offset)?,
            code => {
                return Err(DecodeError::UnknownConstructor {
                    section: self.section,
                    code,
                    offset,
                });
            }
        })
    }

    fn boolean_byte(&mut self) -> Result<bool, DecodeError> {
        let offset = self.pos;
        match self.byte("boolean")? {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(DecodeError::InvalidBoolean {
                section: self.section,
                byte,
                offset,
            }),
        }
    }

    fn variable(&mut self, width: Width, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let size = self.size(width, what)?;
        self.take(size, what)
    }

    /// A list's or map's elements: as many values as its size holds, which
    /// must be as many as its count says.
    fn compound(
        &mut self,
        width: Width,
        what: &'static str,
        offset: usize,
    ) -> Result<Vec<Value<'a>>, DecodeError> {
        let size = self.size(width, what)?;
        let mut inner = self.nested(size, what, offset)?;
        let declared = inner.size(width, "element count")?;
        let mut elements = Vec::new();
        while !inner.is_empty() {
            elements.push(inner.value()?);
        }
        inner.check_count(what, offset, declared, elements.len())?;
        Ok(elements)
    }

    fn map(
        &mut self,
        width: Width,
        what: &'static str,
        offset: usize,
    ) -> Result<Vec<Entry<'a>>, DecodeError> {
        let elements = self.compound(width, what, offset)?;
        if elements.len() % 2 != 0 {
            return Err(DecodeError::OddMapElements {
                section: self.section,
                offset,
                count: elements.len(),
            });
        }
        let mut elements = elements.into_iter();
        let mut entries = Vec::with_capacity(elements.len() / 2);
        while let (Some(key), Some(value)) = (elements.next(), elements.next()) {
            entries.push((key, value));
        }
        Ok(entries)
    }

    /// An array: its element constructor (after any descriptors), then the
    /// elements' values without constructors.
    fn array(
        &mut self,
        width: Width,
        what: &'static str,
        offset: usize,
    ) -> Result<Kind<'a>, DecodeError> {
        let size = self.size(width, what)?;
        let mut inner = self.nested(size, what, offset)?;
        let declared = inner.size(width, "element count")?;
        let element_code = inner.array_element_constructor()?;
        let mut found = 0;
        while !inner.is_empty() {
            inner.array_element(element_code)?;
            found += 1;
        }
        inner.check_count(what, offset, declared, found)?;
        Ok(Kind::Array)
    }

    fn array_element_constructor(&mut self) -> Result<u8, DecodeError> {
        loop {
            let offset = self.pos;
            let code = self.byte("array element constructor")?;
            if code == DESCRIBED {
                self.value()?;
                continue;
            }
            if ARRAY_ELEMENT_CONSTRUCTORS.contains(&code) {
                return Ok(code);
            }
            if constructor_name(code).is_none() {
                return Err(DecodeError::UnknownConstructor {
                    section: self.section,
                    code,
                    offset,
                });
            }
            return Err(undeliverable(
                self.section,
                offset,
                format!("an array of elements with constructor 0x{code:02x} cannot be read"),
            ));
        }
    }

    fn array_element(&mut self, code: u8) -> Result<(), DecodeError> {
        if code == 0x40 {
            // RabbitMQ 3.10 reads one byte for each null element.
            return self.take(1, "null array element").map(drop);
        }
        let offset = self.pos;
        self.primitive(code, offset).map(drop)
    }

    fn check_count(
        &self,
        compound: &'static str,
        offset: usize,
        declared: usize,
        found: usize,
    ) -> Result<(), DecodeError> {
        if declared == found {
            return Ok(());
        }
        Err(DecodeError::CountMismatch {
            section: self.section,
            compound,
            offset,
            declared,
            found,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`super::to_amqp091`] of bytes the test built.
    fn to_amqp091(message: &[u8], stream: &str, offset: u64) -> Result<Amqp091View, DecodeError> {
        super::to_amqp091(&Bytes::copy_from_slice(message), stream, offset)
    }

    // A tiny AMQP 1.0 encoder, enough to write the messages under test.

    fn fixed(code: u8, bytes: &[u8]) -> Vec<u8> {
        [&[code][..], bytes].concat()
    }

    /// vbin/str/sym: the 8-bit-size form when it fits, else the 32-bit one.
    fn variable(code8: u8, bytes: &[u8]) -> Vec<u8> {
        match u8::try_from(bytes.len()) {
            Ok(size) => [&[code8, size][..], bytes].concat(),
            Err(_) => {
                let size = (bytes.len() as u32).to_be_bytes();
                [&[code8 + 0x10][..], &size, bytes].concat()
            }
        }
    }

    fn str8(text: &str) -> Vec<u8> {
        variable(0xa1, text.as_bytes())
    }

    fn sym(text: &str) -> Vec<u8> {
        variable(0xa3, text.as_bytes())
    }

    fn bin(bytes: &[u8]) -> Vec<u8> {
        variable(0xa0, bytes)
    }

    fn ulong(n: u64) -> Vec<u8> {
        fixed(0x80, &n.to_be_bytes())
    }

    fn long(n: i64) -> Vec<u8> {
        fixed(0x81, &n.to_be_bytes())
    }

    fn timestamp(millis: i64) -> Vec<u8> {
        fixed(0x83, &millis.to_be_bytes())
    }

    fn uuid(bytes: [u8; 16]) -> Vec<u8> {
        fixed(0x98, &bytes)
    }

    fn null() -> Vec<u8> {
        vec![0x40]
    }

    /// list8/map8 when they fit, else list32/map32.
    fn compound(code8: u8, items: &[Vec<u8>]) -> Vec<u8> {
        let body = items.concat();
        match (u8::try_from(body.len() + 1), u8::try_from(items.len())) {
            (Ok(size), Ok(count)) => [&[code8, size, count][..], &body].concat(),
            _ => {
                let size = ((body.len() + 4) as u32).to_be_bytes();
                let count = (items.len() as u32).to_be_bytes();
                [&[code8 + 0x10][..], &size, &count, &body].concat()
            }
        }
    }

    fn list(items: &[Vec<u8>]) -> Vec<u8> {
        compound(0xc0, items)
    }

    fn map(entries: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        let items: Vec<Vec<u8>> = entries
            .iter()
            .flat_map(|(k, v)| [k.clone(), v.clone()])
            .collect();
        compound(0xc1, &items)
    }

    fn section(code: u8, body: Vec<u8>) -> Vec<u8> {
        [&[0x00, 0x53, code][..], &body].concat()
    }

    fn data(bytes: &[u8]) -> Vec<u8> {
        section(0x75, bin(bytes))
    }

    /// A properties section with these fields set, by index; null before.
    fn properties(fields: &[(Field, Vec<u8>)]) -> Vec<u8> {
        let last = fields.iter().map(|(f, _)| *f as usize).max().unwrap_or(0);
        let mut list_fields = vec![null(); last + 1];
        for (field, value) in fields {
            list_fields[*field as usize] = value.clone();
        }
        section(0x73, list(&list_fields))
    }

    fn application_properties(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let entries: Vec<_> = entries.iter().map(|(k, v)| (str8(k), v.clone())).collect();
        section(0x74, map(&entries))
    }

    fn annotations(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let entries: Vec<_> = entries.iter().map(|(k, v)| (sym(k), v.clone())).collect();
        section(0x72, map(&entries))
    }

    const STREAM: &str = "orders";
    const OFFSET: u64 = 42;

    fn deliver(sections: &[Vec<u8>]) -> Amqp091View {
        to_amqp091(&sections.concat(), STREAM, OFFSET).expect("the message maps")
    }

    fn error(sections: &[Vec<u8>]) -> DecodeError {
        match to_amqp091(&sections.concat(), STREAM, OFFSET) {
            Ok(view) => panic!("expected an error, got {view:?}"),
            Err(e) => e,
        }
    }

    /// The offset header and these.
    fn headers(entries: &[(&str, AMQPValue)]) -> FieldTable {
        let mut table = FieldTable::default();
        table.insert(
            STREAM_OFFSET_HEADER.into(),
            AMQPValue::LongLongInt(OFFSET as i64),
        );
        for (name, value) in entries {
            table.insert((*name).into(), value.clone());
        }
        table
    }

    fn with_headers(entries: &[(&str, AMQPValue)]) -> BasicProperties {
        BasicProperties::default().with_headers(headers(entries))
    }

    fn longstr(text: &str) -> AMQPValue {
        long_string(text.as_bytes())
    }

    fn assert_undeliverable(e: DecodeError, at_section: Section, at_offset: usize) {
        match e {
            DecodeError::Undeliverable {
                section, offset, ..
            } => assert_eq!((section, offset), (at_section, at_offset), "{e}"),
            other => panic!("expected Undeliverable, got {other}"),
        }
    }

    /// Where `needle` first occurs in the message.
    fn offset_of(message: &[Vec<u8>], needle: &[u8]) -> usize {
        let bytes = message.concat();
        bytes
            .windows(needle.len())
            .position(|w| w == needle)
            .expect("needle in message")
    }

    #[test]
    fn a_data_body_with_content_type() {
        let view = deliver(&[
            properties(&[(Field::ContentType, sym("text/plain"))]),
            data(b"hello"),
        ]);
        assert_eq!(view.exchange, "");
        assert_eq!(view.routing_key, STREAM);
        assert_eq!(view.body, &b"hello"[..]);
        assert_eq!(
            view.properties,
            with_headers(&[]).with_content_type("text/plain".into())
        );
    }

    #[test]
    fn an_empty_message_is_an_empty_body_with_only_the_offset_header() {
        let view = deliver(&[]);
        assert_eq!(view.body, &b""[..]);
        assert_eq!(view.properties, with_headers(&[]));
        assert_eq!(
            (view.exchange.as_str(), view.routing_key.as_str()),
            ("", STREAM)
        );
    }

    #[test]
    fn the_offset_header_is_a_signed_long_and_replaces_a_property_of_its_name() {
        let message = [application_properties(&[("x-stream-offset", str8("mine"))])];
        let view = to_amqp091(&message.concat(), STREAM, u64::MAX).unwrap();
        let table = view.properties.headers().clone().unwrap();
        assert_eq!(
            table.inner().get("x-stream-offset"),
            Some(&AMQPValue::LongLongInt(-1))
        );
        assert_eq!(table.inner().len(), 1);
    }

    #[test]
    fn every_application_property_type_with_a_header_type() {
        let view = deliver(&[application_properties(&[
            ("string", str8("text")),
            ("long", long(-5_000_000_000)),
            ("smalllong", vec![0x55, 0xfe]),
            ("int", fixed(0x71, &(-70_000i32).to_be_bytes())),
            ("smallint", vec![0x54, 0x07]),
            ("short", fixed(0x61, &(-300i16).to_be_bytes())),
            ("byte", vec![0x51, 0x80]),
            ("ubyte", vec![0x50, 0xff]),
            ("ushort", fixed(0x60, &65_535u16.to_be_bytes())),
            ("uint", fixed(0x70, &4_000_000_000u32.to_be_bytes())),
            ("smalluint", vec![0x52, 0x09]),
            ("uint0", vec![0x43]),
            ("double", fixed(0x82, &1.5f64.to_be_bytes())),
            ("float", fixed(0x72, &(-2.25f32).to_be_bytes())),
            ("timestamp", timestamp(1_650_000_123_999)),
            ("before-1970", timestamp(-1_500)),
            ("binary", bin(&[0, 159, 255])),
            ("true", vec![0x41]),
            ("false", vec![0x42]),
            ("boolean", vec![0x56, 0x01]),
            ("null", null()),
        ])]);
        let expected = with_headers(&[
            ("string", longstr("text")),
            ("long", AMQPValue::LongLongInt(-5_000_000_000)),
            ("smalllong", AMQPValue::LongLongInt(-2)),
            ("int", AMQPValue::LongInt(-70_000)),
            ("smallint", AMQPValue::LongInt(7)),
            ("short", AMQPValue::ShortInt(-300)),
            ("byte", AMQPValue::ShortShortInt(-128)),
            ("ubyte", AMQPValue::ShortShortUInt(255)),
            ("ushort", AMQPValue::ShortUInt(65_535)),
            ("uint", AMQPValue::LongUInt(4_000_000_000)),
            ("smalluint", AMQPValue::LongUInt(9)),
            ("uint0", AMQPValue::LongUInt(0)),
            ("double", AMQPValue::Double(1.5)),
            ("float", AMQPValue::Float(-2.25)),
            ("timestamp", AMQPValue::Timestamp(1_650_000_123)),
            // -1500 ms is -1 s (truncated toward zero), written as 64 bits.
            ("before-1970", AMQPValue::Timestamp(u64::MAX)),
            (
                "binary",
                AMQPValue::ByteArray(ByteArray::from(&[0u8, 159, 255][..])),
            ),
            ("true", AMQPValue::Boolean(true)),
            ("false", AMQPValue::Boolean(false)),
            ("boolean", AMQPValue::Boolean(true)),
            ("null", AMQPValue::Void),
        ]);
        assert_eq!(view.properties, expected);
    }

    #[test]
    fn application_property_types_without_a_header_type_are_undeliverable() {
        let unsupported = [
            ulong(7),
            sym("a-symbol"),
            uuid([7; 16]),
            fixed(0x73, &[0, 0, 0, 0x61]),
            fixed(0x74, &[0; 4]),
            list(&[null()]),
            map(&[(str8("k"), str8("v"))]),
            vec![0xe0, 0x03, 0x01, 0x50, 0x01],
            fixed(0x72, &f32::NAN.to_be_bytes()),
            fixed(0x82, &f64::INFINITY.to_be_bytes()),
        ];
        for value in unsupported {
            let message = [application_properties(&[("k", value.clone())])];
            let at = offset_of(&message, &[&str8("k")[..], &value].concat()) + 3;
            assert_undeliverable(error(&message), Section::ApplicationProperties, at);
        }
    }

    #[test]
    fn x_basic_type_and_app_id_application_properties_become_properties() {
        let symbol_keyed_type = section(0x74, map(&[(sym("x-basic-type"), str8("kept"))]));
        let view = deliver(&[
            application_properties(&[
                ("x-basic-type", str8("order.created")),
                ("x-basic-app-id", str8("shop")),
                ("tenant", str8("acme")),
            ]),
            data(b"{}"),
        ]);
        assert_eq!(
            view.properties,
            with_headers(&[("tenant", longstr("acme"))])
                .with_type("order.created".into())
                .with_app_id("shop".into())
        );
        // Only a string key is looked up: a symbol one stays a header.
        let symbol_view = deliver(&[symbol_keyed_type]);
        assert_eq!(
            symbol_view.properties,
            with_headers(&[("x-basic-type", longstr("kept"))])
        );
    }

    #[test]
    fn a_string_message_id_is_the_property() {
        let view = deliver(&[properties(&[(Field::MessageId, str8("order-1"))])]);
        assert_eq!(
            view.properties,
            with_headers(&[]).with_message_id("order-1".into())
        );
    }

    #[test]
    fn typed_ids_are_text_with_a_header_naming_the_type() {
        let id = [
            0x12, 0x3e, 0x45, 0x67, 0xe8, 0x9b, 0x12, 0xd3, 0xa4, 0x56, 0x42, 0x66, 0x14, 0x17,
            0x40, 0x00,
        ];
        let view = deliver(&[properties(&[
            (Field::MessageId, uuid(id)),
            (Field::CorrelationId, ulong(1_234_567_890_123)),
        ])]);
        assert_eq!(
            view.properties,
            with_headers(&[
                ("x-message-id-type", longstr("uuid")),
                ("x-correlation-id-type", longstr("ulong")),
            ])
            .with_message_id("123e4567-e89b-12d3-a456-426614174000".into())
            .with_correlation_id("1234567890123".into())
        );

        let binary = deliver(&[properties(&[(Field::MessageId, bin(&[0, 1, 2, 0xff]))])]);
        assert_eq!(
            binary.properties,
            with_headers(&[("x-message-id-type", longstr("binary"))])
                .with_message_id("AAEC/w==".into())
        );
    }

    #[test]
    fn a_symbol_id_is_the_property_without_a_type_header() {
        let view = deliver(&[properties(&[(Field::CorrelationId, sym("corr"))])]);
        assert_eq!(
            view.properties,
            with_headers(&[]).with_correlation_id("corr".into())
        );
    }

    #[test]
    fn ids_longer_than_256_bytes_go_to_a_header_as_stored() {
        let long_text = "i".repeat(300);
        let view = deliver(&[properties(&[(Field::MessageId, str8(&long_text))])]);
        assert_eq!(
            view.properties,
            with_headers(&[("x-message-id", longstr(&long_text))])
        );

        // 200 bytes are 268 in base64: the raw bytes go to the header.
        let long_binary = vec![0xab; 200];
        let view = deliver(&[properties(&[(Field::CorrelationId, bin(&long_binary))])]);
        assert_eq!(
            view.properties,
            with_headers(&[("x-correlation-id", long_string(&long_binary))])
        );

        let at_limit = "i".repeat(255);
        let view = deliver(&[properties(&[(Field::MessageId, str8(&at_limit))])]);
        assert_eq!(
            view.properties,
            with_headers(&[]).with_message_id(at_limit.as_str().into())
        );
    }

    #[test]
    fn an_id_of_exactly_256_bytes_is_undeliverable() {
        // Not over 256, so it stays the property, which holds at most 255.
        for id in [str8(&"i".repeat(256)), bin(&[1; 192])] {
            // (192 bytes are exactly 256 in base64.)
            let message = [properties(&[(Field::MessageId, id.clone())])];
            let at = offset_of(&message, &id);
            assert_undeliverable(error(&message), Section::Properties, at);
        }
    }

    #[test]
    fn a_duplicate_header_reads_as_the_later_one_after_sorting() {
        // The type header goes in front of the application properties, and a
        // stable sort keeps it there: lapin keeps the later value.
        let view = deliver(&[
            application_properties(&[("x-message-id-type", str8("custom"))]),
            properties(&[(Field::MessageId, ulong(9))]),
        ]);
        assert_eq!(
            view.properties,
            with_headers(&[("x-message-id-type", longstr("custom"))]).with_message_id("9".into())
        );
    }

    #[test]
    fn the_other_properties_fields() {
        let view = deliver(&[properties(&[
            (Field::UserId, bin(b"alice")),
            (Field::ReplyTo, str8("replies")),
            (Field::ContentType, sym("application/json")),
            (Field::ContentEncoding, sym("gzip")),
            (Field::CreationTime, timestamp(1_700_000_000_999)),
        ])]);
        assert_eq!(
            view.properties,
            with_headers(&[])
                .with_user_id("alice".into())
                .with_reply_to("replies".into())
                .with_content_type("application/json".into())
                .with_content_encoding("gzip".into())
                .with_timestamp(1_700_000_000)
        );
    }

    #[test]
    fn to_subject_expiry_and_group_fields_are_dropped() {
        let view = deliver(&[section(
            0x73,
            list(&[
                null(),
                null(),
                str8("/queues/x"),
                str8("subject"),
                null(),
                null(),
                null(),
                null(),
                timestamp(5),
                null(),
                str8("group"),
                fixed(0x70, &3u32.to_be_bytes()),
                str8("reply-group"),
            ]),
        )]);
        assert_eq!(view.properties, with_headers(&[]));
    }

    #[test]
    fn x_basic_annotations_are_priority_delivery_mode_and_expiration() {
        let view = deliver(&[annotations(&[
            ("x-basic-priority", vec![0x50, 7]),
            ("x-basic-delivery-mode", vec![0x50, 2]),
            ("x-basic-expiration", str8("60000")),
            ("x-opt-other", str8("not a header")),
        ])]);
        assert_eq!(
            view.properties,
            with_headers(&[])
                .with_priority(7)
                .with_delivery_mode(2)
                .with_expiration("60000".into())
        );
    }

    #[test]
    fn a_priority_keeps_its_low_eight_bits() {
        let view = deliver(&[annotations(&[(
            "x-basic-priority",
            fixed(0x60, &300u16.to_be_bytes()),
        )])]);
        assert_eq!(view.properties, with_headers(&[]).with_priority(44));
    }

    #[test]
    fn a_delivery_mode_other_than_1_or_2_is_undeliverable() {
        for mode in [vec![0x50, 3], str8("2")] {
            let message = [annotations(&[("x-basic-delivery-mode", mode)])];
            let at = offset_of(&message, &sym("x-basic-delivery-mode"))
                + sym("x-basic-delivery-mode").len();
            assert_undeliverable(error(&message), Section::MessageAnnotations, at);
        }
    }

    #[test]
    fn exchange_and_routing_key_annotations_address_the_delivery() {
        let view = deliver(&[
            annotations(&[
                ("x-exchange", str8("orders-x")),
                ("x-routing-key", str8("eu.created")),
            ]),
            data(b"x"),
        ]);
        assert_eq!(view.exchange, "orders-x");
        assert_eq!(view.routing_key, "eu.created");
        // They are not headers.
        assert_eq!(view.properties, with_headers(&[]));

        let only_exchange = deliver(&[annotations(&[("x-exchange", str8("x"))])]);
        assert_eq!(only_exchange.exchange, "x");
        assert_eq!(only_exchange.routing_key, STREAM);
    }

    #[test]
    fn an_exchange_annotation_must_be_a_string() {
        let message = [annotations(&[("x-exchange", sym("orders-x"))])];
        let at = offset_of(&message, &sym("orders-x"));
        assert_undeliverable(error(&message), Section::MessageAnnotations, at);
    }

    #[test]
    fn an_annotation_key_that_is_not_a_symbol_stops_the_lookup_unless_after_both() {
        let numeric_key = (ulong(99), str8("v"));
        let before = section(
            0x72,
            map(&[numeric_key.clone(), (sym("x-exchange"), str8("x"))]),
        );
        assert_undeliverable(error(&[before]), Section::MessageAnnotations, 6);

        let after = section(
            0x72,
            map(&[
                (sym("x-exchange"), str8("x")),
                (sym("x-routing-key"), str8("rk")),
                numeric_key,
            ]),
        );
        let view = deliver(&[after]);
        assert_eq!(
            (view.exchange.as_str(), view.routing_key.as_str()),
            ("x", "rk")
        );
    }

    #[test]
    fn the_last_of_several_data_sections_is_the_body() {
        let view = deliver(&[data(b"first"), data(b"second")]);
        assert_eq!(view.body, &b"second"[..]);
    }

    #[test]
    fn sections_other_than_the_four_read_are_undeliverable() {
        let others = [
            (Section::Header, section(0x70, list(&[vec![0x41]]))),
            (Section::DeliveryAnnotations, section(0x71, map(&[]))),
            (Section::AmqpSequence, section(0x76, list(&[str8("a")]))),
            (Section::AmqpValue, section(0x77, str8("a value"))),
            (Section::Footer, section(0x78, map(&[]))),
        ];
        for (kind, other) in others {
            let message = [data(b"body"), other];
            assert_undeliverable(error(&message), kind, message[0].len());
        }
    }

    #[test]
    fn symbolic_descriptors_name_sections() {
        let described = |name: &str, body: Vec<u8>| [&[0x00][..], &sym(name), &body].concat();
        let view = deliver(&[
            described("amqp:properties:list", list(&[str8("id")])),
            described("amqp:data:binary", bin(b"body")),
        ]);
        assert_eq!(view.body, &b"body"[..]);
        assert_eq!(
            view.properties,
            with_headers(&[]).with_message_id("id".into())
        );
    }

    #[test]
    fn a_cc_application_property_is_undeliverable() {
        for name in ["CC", "BCC"] {
            let message = [application_properties(&[(name, str8("elsewhere"))])];
            assert_undeliverable(error(&message), Section::ApplicationProperties, 6);
        }
    }

    #[test]
    fn a_described_annotation_value_is_undeliverable() {
        let value = [&[0x00][..], &sym("com.example:thing"), &str8("v")].concat();
        let message = [annotations(&[("x-opt-thing", value.clone())])];
        let at = offset_of(&message, &value);
        assert_undeliverable(error(&message), Section::MessageAnnotations, at);
    }

    #[test]
    fn an_array_of_a_type_the_broker_cannot_read_is_undeliverable_even_unread() {
        // An array of binaries in an annotation nothing reads.
        let array = vec![0xe0, 0x05, 0x01, 0xa0, 0x02, b'h', b'i'];
        let message = [annotations(&[("x-opt-list", array.clone())])];
        let at = offset_of(&message, &array) + 3;
        assert_undeliverable(error(&message), Section::MessageAnnotations, at);
        // One of symbols reads.
        let symbols = vec![0xe0, 0x06, 0x02, 0xa3, 0x01, b'a', 0x01, b'b'];
        deliver(&[annotations(&[("x-opt-list", symbols)])]);
    }

    #[test]
    fn a_short_string_that_is_not_utf8_is_named() {
        let message = [properties(&[(
            Field::ContentType,
            vec![0xa3, 0x02, 0xc3, 0x28],
        )])];
        match error(&message) {
            DecodeError::NotUtf8 {
                section,
                offset,
                what,
            } => assert_eq!(
                (section, offset, what.as_str()),
                (Section::Properties, 12, "content-type")
            ),
            other => panic!("expected NotUtf8, got {other}"),
        }
    }

    #[test]
    fn a_truncated_message_names_what_was_cut() {
        let message = [data(b"hello")].concat();
        let e = to_amqp091(&message[..message.len() - 2], STREAM, OFFSET).unwrap_err();
        assert!(
            matches!(
                e,
                DecodeError::Truncated {
                    section: Section::Data,
                    what: "vbin8",
                    offset: 5,
                    needed: 5,
                    available: 3,
                }
            ),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "data section: vbin8 at byte 5 needs 5 byte(s), only 3 left"
        );
    }

    #[test]
    fn every_prefix_of_a_message_decodes_only_at_a_section_boundary() {
        let sections = [
            annotations(&[
                ("x-exchange", str8("x")),
                ("x-basic-priority", vec![0x50, 1]),
            ]),
            properties(&[
                (Field::MessageId, uuid([1; 16])),
                (Field::CreationTime, timestamp(1)),
            ]),
            application_properties(&[("k", long(1)), ("l", str8("v"))]),
            data(b"body"),
        ];
        let boundaries: Vec<usize> = (0..=sections.len())
            .map(|n| sections[..n].concat().len())
            .collect();
        let message = sections.concat();
        for end in 0..=message.len() {
            let result = to_amqp091(&message[..end], STREAM, OFFSET);
            assert_eq!(
                result.is_ok(),
                boundaries.contains(&end),
                "prefix of {end} bytes"
            );
        }
    }

    #[test]
    fn an_unknown_constructor_is_named_with_its_offset() {
        let e = error(&[vec![0x00, 0x53, 0x75, 0x99]]);
        assert!(
            matches!(
                e,
                DecodeError::UnknownConstructor {
                    section: Section::Data,
                    code: 0x99,
                    offset: 3,
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_list_count_larger_than_its_bytes_is_a_count_mismatch() {
        // list8 of size 2: a count of 5, then one null.
        let e = error(&[section(0x73, vec![0xc0, 0x02, 0x05, 0x40])]);
        assert!(
            matches!(
                e,
                DecodeError::CountMismatch {
                    section: Section::Properties,
                    compound: "list8",
                    offset: 3,
                    declared: 5,
                    found: 1,
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_size_larger_than_the_message_is_truncated_not_allocated() {
        let e = error(&[section(
            0x74,
            vec![0xd1, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0],
        )]);
        assert!(
            matches!(
                e,
                DecodeError::Truncated {
                    section: Section::ApplicationProperties,
                    what: "map32",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_map_with_an_odd_element_count_is_named() {
        let e = error(&[section(0x74, vec![0xc1, 0x03, 0x01, 0xa1, 0x00])]);
        assert!(
            matches!(
                e,
                DecodeError::OddMapElements {
                    section: Section::ApplicationProperties,
                    offset: 3,
                    count: 1,
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_boolean_byte_other_than_0_or_1_is_named() {
        let message = [application_properties(&[("b", vec![0x56, 0x02])])];
        let e = error(&message);
        assert!(
            matches!(
                e,
                DecodeError::InvalidBoolean {
                    section: Section::ApplicationProperties,
                    byte: 2,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_value_that_is_not_a_section_is_named() {
        let e = error(&[data(b"x"), str8("loose")]);
        assert!(
            matches!(
                e,
                DecodeError::NotASection {
                    offset: 6,
                    found: "string"
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_descriptor_of_no_message_section_is_named() {
        let e = error(&[vec![0x00, 0x53, 0x10, 0x45]]);
        assert!(
            matches!(e, DecodeError::UnknownSection { offset: 0, ref descriptor } if descriptor == "0x10"),
            "{e}"
        );
    }

    #[test]
    fn a_section_body_of_the_wrong_type_is_named() {
        let e = error(&[section(0x75, str8("text"))]);
        assert!(
            matches!(
                e,
                DecodeError::WrongSectionBody {
                    section: Section::Data,
                    expected: "a binary",
                    ..
                }
            ),
            "{e}"
        );
        let e = error(&[section(0x73, map(&[]))]);
        assert!(
            matches!(
                e,
                DecodeError::WrongSectionBody {
                    section: Section::Properties,
                    expected: "a list",
                    ..
                }
            ),
            "{e}"
        );
        let e = error(&[section(0x73, list(&vec![null(); 14]))]);
        assert!(
            matches!(
                e,
                DecodeError::WrongSectionBody {
                    section: Section::Properties,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn values_nested_too_deep_are_refused() {
        let mut value = null();
        for _ in 0..MAX_DEPTH + 5 {
            value = list(&[value]);
        }
        let e = error(&[annotations(&[("x-opt-deep", value)])]);
        assert!(
            matches!(
                e,
                DecodeError::NestedTooDeep {
                    section: Section::MessageAnnotations,
                    ..
                }
            ),
            "{e}"
        );
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let _ = to_amqp091(&bytes, STREAM, OFFSET);
        }

        #[test]
        fn a_corrupted_message_never_panics(position in 0usize..64, byte in proptest::prelude::any::<u8>()) {
            let mut message = [
                annotations(&[("x-exchange", str8("x"))]),
                properties(&[(Field::MessageId, bin(&[1, 2, 3]))]),
                application_properties(&[("k", list(&[long(1)]))]),
                data(b"body"),
            ]
            .concat();
            let position = position % message.len();
            message[position] = byte;
            let _ = to_amqp091(&message, STREAM, OFFSET);
        }
    }
}
