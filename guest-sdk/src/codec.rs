//! Codec plugins: converting bodies between the wire and handlers.

use core::fmt;

/// A codec plugin: converts bodies between what travels on the wire and what
/// handlers read. Export it with [`export_codec!`](crate::export_codec).
///
/// The host calls [`decode`](Codec::decode) on a delivery whose content type
/// the consumer's configuration gives to this codec, before the handler runs
/// (a failure parks the message with the reason), and
/// [`encode`](Codec::encode) on each message the handler publishes through
/// it. Codecs see only bodies: the `codec-plugin` world imports nothing, so
/// they cannot log, read configuration or publish.
///
/// ```
/// use acemq_guest::{Body, Codec, CodecError};
///
/// /// `text/x-shout` on the wire, plain text for handlers.
/// struct Shout;
///
/// impl Codec for Shout {
///     fn decode(wire: Body) -> Result<Body, CodecError> {
///         let text = String::from_utf8(wire.bytes)?; // error -> CodecError
///         Ok(Body::new("text/plain", text.to_lowercase()))
///     }
///     fn encode(plain: Body) -> Result<Body, CodecError> {
///         let text = String::from_utf8(plain.bytes)?;
///         Ok(Body::new("text/x-shout", text.to_uppercase()))
///     }
/// }
///
/// acemq_guest::export_codec!(Shout);
/// ```
pub trait Codec {
    /// Wire format to handler format.
    fn decode(wire: Body) -> Result<Body, CodecError>;
    /// Handler format to wire format.
    fn encode(plain: Body) -> Result<Body, CodecError>;
}

/// A body and its content type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Body {
    /// The AMQP content type.
    pub content_type: String,
    /// The bytes.
    pub bytes: Vec<u8>,
}

impl Body {
    /// A body of `bytes` labelled `content_type`.
    pub fn new(content_type: impl Into<String>, bytes: impl Into<Vec<u8>>) -> Self {
        Body {
            content_type: content_type.into(),
            bytes: bytes.into(),
        }
    }
}

/// Why a codec refused a body; the host puts it in the park reason
/// (`could not be decoded: <reason>`).
///
/// Any standard error converts into it, so `?` works on parsers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodecError(String);

impl CodecError {
    /// A refusal with this reason.
    pub fn new(reason: impl fmt::Display) -> Self {
        CodecError(reason.to_string())
    }
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// Deliberately no `impl std::error::Error for CodecError`: it would make this
// blanket impl overlap with `From<T> for T`.
impl<E: std::error::Error> From<E> for CodecError {
    fn from(e: E) -> Self {
        CodecError(e.to_string())
    }
}

/// The WIT shape of both codec functions.
pub type WitResult = Result<(String, Vec<u8>), String>;

pub(crate) fn call(
    f: fn(Body) -> Result<Body, CodecError>,
    content_type: String,
    bytes: Vec<u8>,
) -> WitResult {
    f(Body {
        content_type,
        bytes,
    })
    .map(|b| (b.content_type, b.bytes))
    .map_err(|e| e.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Utf8Check;
    impl Codec for Utf8Check {
        fn decode(wire: Body) -> Result<Body, CodecError> {
            std::str::from_utf8(&wire.bytes)?;
            Ok(Body::new("text/plain", wire.bytes))
        }
        fn encode(_: Body) -> Result<Body, CodecError> {
            Err(CodecError::new("encode is not supported"))
        }
    }

    #[test]
    fn adapter_maps_bodies_and_errors() {
        assert_eq!(
            call(Utf8Check::decode, "x/y".into(), b"ok".to_vec()),
            Ok(("text/plain".into(), b"ok".to_vec()))
        );
        assert_eq!(
            call(Utf8Check::decode, "x/y".into(), vec![0xff]),
            Err("invalid utf-8 sequence of 1 bytes from index 0".into())
        );
        assert_eq!(
            call(Utf8Check::encode, "x/y".into(), vec![]),
            Err("encode is not supported".into())
        );
    }
}
