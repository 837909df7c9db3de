//! {{name}}: an acemq-host codec plugin.
//!
//! Handlers read `text/plain`; on the wire the body is `text/x-{{name}}`,
//! here simply the same text reversed. Replace both directions with your
//! format, and configure the codec for its content type:
//!
//! ```toml
//! [[codecs]]
//! plugin = "path/to/{{name}}.wasm"
//! content_types = ["text/x-{{name}}"]
//! ```
//!
//! - `cargo test`: runs the tests below natively.
//! - `acemq-host plugin build`: builds the WebAssembly component.

use acemq_guest::{Body, Codec, CodecError};

/// The content type of bodies on the wire.
const WIRE: &str = "text/x-{{name}}";

struct {{type_name}};

impl Codec for {{type_name}} {
    fn decode(wire: Body) -> Result<Body, CodecError> {
        // A refusal parks the message, with this reason.
        let text = String::from_utf8(wire.bytes)?;
        Ok(Body::new("text/plain", text.chars().rev().collect::<String>()))
    }

    fn encode(plain: Body) -> Result<Body, CodecError> {
        let text = String::from_utf8(plain.bytes)?;
        Ok(Body::new(WIRE, text.chars().rev().collect::<String>()))
    }
}

acemq_guest::export_codec!({{type_name}});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_survives_the_round_trip() {
        let wire = {{type_name}}::encode(Body::new("text/plain", "hello")).unwrap();
        assert_eq!(wire, Body::new(WIRE, "olleh"));
        let plain = {{type_name}}::decode(wire).unwrap();
        assert_eq!(plain, Body::new("text/plain", "hello"));
    }

    #[test]
    fn a_body_that_is_not_utf8_is_refused() {
        assert!({{type_name}}::decode(Body::new(WIRE, vec![0xff])).is_err());
    }
}
