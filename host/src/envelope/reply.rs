//! Request/reply (contract §11): where a request wants its answer, and the
//! properties of the answer, a success or the error reply of a request the
//! host set aside.
//!
//! The wire rules every AceMQ library shares: a request names its reply
//! queue in the header `acemq-reply-to` and in the AMQP `reply-to` property
//! (same value); a responder reads the header first. The reply goes through
//! the default exchange with routing key = that queue, not mandatory (a
//! reply queue that has gone means the caller has gone), and is paired on
//! the envelope correlation: correlation = the request's, causation = the
//! request's id. A plain AMQP RPC client (pika, amqplib) pairs on the AMQP
//! `correlation-id` property instead, so a request that has one gets it
//! echoed on the reply as well. A failed request is answered with the
//! header `acemq-error: "{ErrType}: {message}"`.
//!
//! Pure functions; the settlement publishes what they build.

use lapin::BasicProperties;
use lapin::types::{FieldTable, ShortString};

use super::amqp::short_string;
use super::headers::{HeaderError, HeaderValue};
use super::{Envelope, outgoing_properties, output_id};

/// The wire names of request/reply, ordinary application headers (`acemq-`,
/// not the reserved `x-acemq-`): a requester's library reads them.
pub mod reply_header {
    /// The reply queue a request names; read before the `reply-to` property.
    pub const REPLY_TO: &str = "acemq-reply-to";
    /// On a reply: the request failed, `{ErrType}: {message}`.
    pub const ERROR: &str = "acemq-error";
}

/// `x-acemq-type` of a reply whose plugin names none (the WIT's default):
/// the request's type would mislead a router that dispatches on types, and
/// the reply queue's name says nothing about what it carries.
pub const DEFAULT_REPLY_TYPE: &str = "reply";

/// The part of a delivery that makes it a request: where to answer, and
/// how a plain AMQP client pairs the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The reply queue: `acemq-reply-to`, else the `reply-to` property.
    pub reply_to: String,
    /// The AMQP `correlation-id` property, echoed on the reply.
    pub amqp_correlation_id: Option<ShortString>,
}

impl Request {
    /// The request a delivery makes, `None` when it names no reply queue in
    /// either place. The header wins (the contract's reading order); a
    /// header that is empty or not text counts as absent, so a property
    /// behind it is still found. A queue name longer than AMQP allows
    /// cannot be routed to, and counts as absent too.
    #[must_use]
    pub fn of(properties: &BasicProperties) -> Option<Self> {
        let header = properties
            .headers()
            .as_ref()
            .and_then(|table| header_text(table, reply_header::REPLY_TO));
        let property = properties
            .reply_to()
            .as_ref()
            .map(|queue| queue.as_str().to_owned())
            .filter(|queue| !queue.is_empty());
        let reply_to = header.or(property)?;
        short_string(&reply_to)?;
        Some(Self {
            reply_to,
            amqp_correlation_id: properties
                .correlation_id()
                .clone()
                .filter(|id| !id.as_str().is_empty()),
        })
    }
}

fn header_text(table: &FieldTable, name: &str) -> Option<String> {
    let text = match HeaderValue::from_amqp(table.inner().get(name)?)? {
        HeaderValue::Text(text) => text,
        HeaderValue::Bytes(bytes) => String::from_utf8(bytes).ok()?,
        _ => return None,
    };
    (!text.is_empty()).then_some(text)
}

/// The refusal of an accepted request that names no reply queue: the
/// `x-acemq-error` reason it is set aside with. Both places are named, so
/// the requester's author sees where the address was looked for.
pub const NO_REPLY_ADDRESS: &str = "its handler replied, but the request names no reply queue: \
     neither the acemq-reply-to header nor the reply-to property is set";

/// An answer a handler buffered (the WIT's `outgoing-reply`, checked).
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub body: Vec<u8>,
    pub content_type: Option<String>,
    pub headers: Vec<(String, HeaderValue)>,
    /// The plugin's own id, when it chose one.
    pub id: Option<String>,
    pub message_type: Option<String>,
    pub version: Option<u32>,
}

/// The id of the reply to `request_id` by the handler version `version`
/// when its plugin chose none: derived like an output's, so a redelivered
/// request answers with the same id (a caller drops the duplicate), and
/// never one of the outputs' ids (a separate tag, not a position).
#[must_use]
pub fn reply_id(request_id: &str, version: &str) -> String {
    output_id(request_id, &format!("reply/{version}"), 0)
}

/// The id of the host's error reply to `request_id`: derived, so a request
/// whose set-aside is carried out twice (a copy confirmed, the ack lost)
/// answers twice with the same id.
#[must_use]
pub fn error_reply_id(request_id: &str) -> String {
    output_id(request_id, "acemq-host/error-reply", 0)
}

impl Envelope {
    /// The envelope of the reply to `request`: a new message in its
    /// conversation (correlation = the request's, causation = the request's
    /// id), with `id`, the type ([`DEFAULT_REPLY_TYPE`] when `None`) and the
    /// version (1 when `None`).
    #[must_use]
    pub fn reply_to(
        request: &Envelope,
        id: String,
        message_type: Option<&str>,
        version: Option<u32>,
        origin: &str,
        now_ms: u64,
    ) -> Self {
        let message_type = message_type
            .filter(|t| !t.is_empty())
            .unwrap_or(DEFAULT_REPLY_TYPE);
        Self {
            id: id.into(),
            version: version.unwrap_or(1).max(1),
            ..Envelope::child_of(request, message_type.to_owned(), origin, now_ms)
        }
    }
}

/// The properties of a reply carrying `envelope` to `request`: those of any
/// new message ([`outgoing_properties`], persistent as the contract's
/// default, headers checked), plus the request's AMQP `correlation-id`
/// echoed. No `reply-to`: a reply is not a request.
pub fn reply_properties(
    envelope: &Envelope,
    request: &Request,
    content_type: Option<&str>,
    headers: &[(String, HeaderValue)],
) -> Result<BasicProperties, HeaderError> {
    let properties = outgoing_properties(envelope, content_type, true, headers, [])?;
    Ok(match &request.amqp_correlation_id {
        Some(id) => properties.with_correlation_id(id.clone()),
        None => properties,
    })
}

/// Why the host answered a request with an error: the `{ErrType}` of
/// `acemq-error`. Words in the libraries' style (an exception's class
/// name, `UpperCamelCase`), one per way the host sets a request aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    /// The handler rejected it.
    Rejected,
    /// The handler parked it.
    Parked,
    /// Its retries ran out (or its age limit, or it was not to be retried).
    RetriesExhausted,
    /// Its plugin faulted (trap, panic, deadline, memory) until the retries
    /// ran out, or published outside `publish_to`.
    PluginFault,
    /// Its body could not be decoded, or it could not be read as sent.
    Undecodable,
    /// Its body is over the consumer's `max_body_bytes`.
    TooLarge,
    /// Its routing slip cannot be followed.
    InvalidRoutingSlip,
}

impl ErrorType {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::Rejected => "Rejected",
            ErrorType::Parked => "Parked",
            ErrorType::RetriesExhausted => "RetriesExhausted",
            ErrorType::PluginFault => "PluginFault",
            ErrorType::Undecodable => "Undecodable",
            ErrorType::TooLarge => "TooLarge",
            ErrorType::InvalidRoutingSlip => "InvalidRoutingSlip",
        }
    }
}

/// The `acemq-error` text: `{ErrType}: {message}`.
#[must_use]
pub fn error_text(error: ErrorType, message: &str) -> String {
    format!("{}: {message}", error.as_str())
}

/// The host's error reply to `request`, set aside with `reason` (the
/// `x-acemq-error` of its set-aside copy, which is the message here too):
/// header `acemq-error` = `{ErrType}: {reason}`, and a JSON body
/// `{"error": ErrType, "message": reason}` so that a plain AMQP client that
/// knows nothing of the header still reads why. Its type is
/// [`DEFAULT_REPLY_TYPE`].
pub fn error_reply(
    request_envelope: &Envelope,
    request: &Request,
    error: ErrorType,
    reason: &str,
    origin: &str,
    now_ms: u64,
) -> (BasicProperties, Vec<u8>) {
    let envelope = Envelope::reply_to(
        request_envelope,
        error_reply_id(&request_envelope.id),
        None,
        None,
        origin,
        now_ms,
    );
    let headers = [(
        reply_header::ERROR.to_owned(),
        HeaderValue::Text(error_text(error, reason)),
    )];
    let body = serde_json::json!({ "error": error.as_str(), "message": reason }).to_string();
    // The header name is fixed and the reason is bounded by the caller
    // (MAX_REASON_BYTES), so the only refusal left is unreachable; were it
    // reached, the envelope alone still answers.
    let properties = reply_properties(&envelope, request, None, &headers)
        .or_else(|_| reply_properties(&envelope, request, None, &[]))
        .unwrap_or_default();
    (properties, body.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::test_support::{NOW, get, headers_of, ls, table};
    use crate::envelope::{DEFAULT_CONTENT_TYPE, header};
    use lapin::types::AMQPValue;

    fn request_envelope() -> Envelope {
        Envelope {
            correlation_id: "conv-1".into(),
            ..Envelope::new("echo", "", NOW - 1_000)
        }
    }

    fn request(
        header: Option<&str>,
        property: Option<&str>,
        corr: Option<&str>,
    ) -> BasicProperties {
        let mut properties = BasicProperties::default();
        if let Some(queue) = header {
            properties = properties.with_headers(table(vec![(reply_header::REPLY_TO, ls(queue))]));
        }
        if let Some(queue) = property {
            properties = properties.with_reply_to(queue.into());
        }
        if let Some(id) = corr {
            properties = properties.with_correlation_id(id.into());
        }
        properties
    }

    #[test]
    fn the_header_is_read_before_the_property() {
        let of = |h, p| Request::of(&request(h, p, None)).map(|r| r.reply_to);
        assert_eq!(
            of(Some("from-header"), Some("from-property")).as_deref(),
            Some("from-header")
        );
        assert_eq!(
            of(None, Some("from-property")).as_deref(),
            Some("from-property")
        );
        assert_eq!(
            of(Some("from-header"), None).as_deref(),
            Some("from-header")
        );
        // An empty header does not hide the property.
        assert_eq!(
            of(Some(""), Some("from-property")).as_deref(),
            Some("from-property")
        );
        assert_eq!(of(None, None), None);
        assert_eq!(of(Some(""), Some("")), None);
        // A header that is not text does not either.
        let properties = BasicProperties::default()
            .with_headers(table(vec![(
                reply_header::REPLY_TO,
                AMQPValue::LongLongInt(3),
            )]))
            .with_reply_to("q".into());
        assert_eq!(Request::of(&properties).unwrap().reply_to, "q");
        // A queue name no AMQP publish can carry is no address.
        assert_eq!(of(Some(&"q".repeat(256)), None), None);
    }

    #[test]
    fn the_amqp_correlation_id_is_kept_for_the_echo() {
        let pika = Request::of(&request(None, Some("amq.gen-1"), Some("c-7"))).unwrap();
        assert_eq!(
            pika.amqp_correlation_id.as_ref().map(ShortString::as_str),
            Some("c-7")
        );
        let empty = Request::of(&request(None, Some("amq.gen-1"), Some(""))).unwrap();
        assert_eq!(empty.amqp_correlation_id, None);
    }

    #[test]
    fn a_reply_is_paired_on_the_requests_correlation_and_names_the_request() {
        let asked = request_envelope();
        let reply = Envelope::reply_to(&asked, "r-1".into(), None, None, "acemq@h", NOW);
        assert_eq!(reply.id, "r-1");
        assert_eq!(reply.correlation_id, "conv-1");
        assert_eq!(reply.causation_id.as_deref(), Some(asked.id.as_str()));
        assert_eq!(reply.message_type, DEFAULT_REPLY_TYPE);
        assert_eq!((reply.version, reply.attempt), (1, 1));
        assert_eq!(reply.origin.as_deref(), Some("acemq@h"));
        assert_eq!(reply.route, None);
        let typed = Envelope::reply_to(&asked, "r-2".into(), Some("echo.reply"), Some(3), "", NOW);
        assert_eq!(
            (typed.message_type.as_str(), typed.version),
            ("echo.reply", 3)
        );
    }

    #[test]
    fn reply_properties_echo_the_amqp_correlation_id_and_carry_no_reply_to() {
        let asked = request_envelope();
        let pika = Request::of(&request(Some("replies"), Some("replies"), Some("c-7"))).unwrap();
        let envelope = Envelope::reply_to(&asked, "r-1".into(), None, None, "", NOW);
        let properties = reply_properties(&envelope, &pika, None, &[]).unwrap();
        assert_eq!(
            properties.correlation_id().as_ref().unwrap().as_str(),
            "c-7"
        );
        assert_eq!(properties.reply_to(), &None);
        assert_eq!(properties.message_id().as_ref().unwrap().as_str(), "r-1");
        assert_eq!(
            properties.content_type().as_ref().unwrap().as_str(),
            DEFAULT_CONTENT_TYPE
        );
        assert_eq!(
            properties.delivery_mode(),
            &Some(crate::envelope::PERSISTENT)
        );
        let headers = headers_of(&properties);
        assert_eq!(get(headers, header::CORRELATION), Some(&ls("conv-1")));
        assert_eq!(get(headers, header::CAUSATION), Some(&ls(&asked.id)));

        let acemq = Request::of(&request(Some("replies"), None, None)).unwrap();
        let properties = reply_properties(&envelope, &acemq, None, &[]).unwrap();
        assert_eq!(properties.correlation_id(), &None);
        // Reserved headers are refused here as on any output.
        let reserved = [("x-acemq-id".to_owned(), HeaderValue::Text("x".into()))];
        assert!(reply_properties(&envelope, &acemq, None, &reserved).is_err());
    }

    #[test]
    fn derived_reply_ids_are_stable_and_apart_from_the_outputs() {
        assert_eq!(reply_id("req", "v1"), reply_id("req", "v1"));
        assert_ne!(reply_id("req", "v1"), reply_id("req", "v2"));
        assert_ne!(reply_id("req", "v1"), output_id("req", "v1", 0));
        assert_eq!(error_reply_id("req"), error_reply_id("req"));
        assert_ne!(error_reply_id("req"), error_reply_id("other"));
        assert!(uuid::Uuid::parse_str(&error_reply_id("req")).is_ok());
    }

    #[test]
    fn the_error_reply_says_what_failed_in_the_header_and_the_body() {
        let asked = request_envelope();
        let pika = Request::of(&request(None, Some("amq.gen-1"), Some("c-7"))).unwrap();
        let reason = "the handler rejected it: fail";
        let (properties, body) =
            error_reply(&asked, &pika, ErrorType::Rejected, reason, "acemq@h", NOW);
        let headers = headers_of(&properties);
        assert_eq!(
            get(headers, reply_header::ERROR),
            Some(&ls("Rejected: the handler rejected it: fail"))
        );
        assert_eq!(get(headers, header::CORRELATION), Some(&ls("conv-1")));
        assert_eq!(get(headers, header::CAUSATION), Some(&ls(&asked.id)));
        assert_eq!(get(headers, header::TYPE), Some(&ls(DEFAULT_REPLY_TYPE)));
        assert_eq!(
            get(headers, header::ID),
            Some(&ls(&error_reply_id(&asked.id)))
        );
        assert_eq!(
            properties.correlation_id().as_ref().unwrap().as_str(),
            "c-7"
        );
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": "Rejected", "message": reason})
        );
    }

    #[test]
    fn error_types_are_the_documented_words() {
        let words = [
            (ErrorType::Rejected, "Rejected"),
            (ErrorType::Parked, "Parked"),
            (ErrorType::RetriesExhausted, "RetriesExhausted"),
            (ErrorType::PluginFault, "PluginFault"),
            (ErrorType::Undecodable, "Undecodable"),
            (ErrorType::TooLarge, "TooLarge"),
            (ErrorType::InvalidRoutingSlip, "InvalidRoutingSlip"),
        ];
        for (error, word) in words {
            assert_eq!(error.as_str(), word);
        }
        assert_eq!(error_text(ErrorType::Parked, "x"), "Parked: x");
    }

    #[test]
    fn the_refusal_without_an_address_names_both_places() {
        assert!(NO_REPLY_ADDRESS.contains("acemq-reply-to"));
        assert!(NO_REPLY_ADDRESS.contains("reply-to property"));
    }
}
