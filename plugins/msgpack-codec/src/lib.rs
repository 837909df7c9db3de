//! MessagePack on the wire, JSON for handlers.
//!
//! Configure it for the MessagePack content types:
//!
//! ```toml
//! [[codecs]]
//! plugin = "target/plugins/msgpack-codec.wasm"
//! content_types = ["application/msgpack", "application/x-msgpack"]
//! ```
//!
//! - **decode** (a delivery labelled `application/msgpack` or
//!   `application/x-msgpack`, before the handler runs): one MessagePack
//!   value becomes its JSON text, labelled `application/json`. Map keys keep
//!   their order.
//! - **encode** (an output the handler labelled with a MessagePack content
//!   type, and wrote as JSON): the JSON becomes MessagePack, keeping the
//!   handler's content type. An output labelled `application/json` is
//!   encoded too and relabelled `application/msgpack`, for a codec
//!   configured to claim that type on publish.
//!
//! Integers are written in their smallest MessagePack form, other numbers
//! as float 64. Refused, with a reason the host puts in the park reason:
//! bodies that are not exactly one well-formed value (`not valid
//! MessagePack: ...`, `not valid JSON: ...`), and MessagePack that JSON
//! cannot hold (`no JSON equivalent: ...`): binary and extension values,
//! map keys that are not strings, duplicate keys, NaN and infinities, and
//! arrays and maps nested more than 127 deep (serde_json's own limit, so
//! what this codec decodes it can always encode back). Offsets in reasons count bytes from
//! the start of the body.

use std::collections::BTreeSet;
use std::fmt;

use acemq_guest::serde_json;
use acemq_guest::{Body, Codec, CodecError};
use rmp::Marker;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The content type of decoded bodies.
const JSON: &str = "application/json";
/// The content type of bodies encoded from `application/json`.
const MSGPACK: &str = "application/msgpack";
/// The MessagePack content types, the registered one first.
const MSGPACK_TYPES: [&str; 2] = [MSGPACK, "application/x-msgpack"];
/// The deepest nesting of arrays and maps decoded: serde_json parses no
/// deeper (its recursion limit, 128, counts one more), so anything decoded
/// can be encoded back.
const MAX_DEPTH: usize = 127;

struct MsgpackCodec;

impl Codec for MsgpackCodec {
    fn decode(wire: Body) -> Result<Body, CodecError> {
        if !is_msgpack(&wire.content_type) {
            return Err(CodecError::new(format_args!(
                "cannot decode content type `{}`: this codec reads {}",
                wire.content_type,
                MSGPACK_TYPES.join(" or ")
            )));
        }
        let json = msgpack_to_json(&wire.bytes).map_err(CodecError::new)?;
        Ok(Body::new(JSON, json))
    }

    fn encode(plain: Body) -> Result<Body, CodecError> {
        let content_type = if is_msgpack(&plain.content_type) {
            plain.content_type
        } else if media_type(&plain.content_type) == JSON {
            MSGPACK.to_owned()
        } else {
            return Err(CodecError::new(format_args!(
                "cannot encode content type `{}`: this codec writes {} from JSON \
                 (or {JSON} as {MSGPACK})",
                plain.content_type,
                MSGPACK_TYPES.join(" or ")
            )));
        };
        let msgpack = json_to_msgpack(&plain.bytes).map_err(CodecError::new)?;
        Ok(Body::new(content_type, msgpack))
    }
}

acemq_guest::export_codec!(MsgpackCodec);

/// `Application/MsgPack; charset=binary` -> `application/msgpack`.
fn media_type(content_type: &str) -> String {
    let essence = content_type.split(';').next().unwrap_or_default();
    essence.trim().to_ascii_lowercase()
}

fn is_msgpack(content_type: &str) -> bool {
    MSGPACK_TYPES.contains(&media_type(content_type).as_str())
}

// --- MessagePack -> JSON -------------------------------------------------

/// Why a MessagePack body was refused.
#[derive(Debug, PartialEq, Eq)]
enum DecodeError {
    /// Not well-formed MessagePack.
    Invalid { at: usize, problem: String },
    /// Well-formed, but JSON has no way to say it.
    NoJson { at: usize, problem: String },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Invalid { at, problem } => {
                write!(f, "not valid MessagePack: {problem} (at byte {at})")
            }
            DecodeError::NoJson { at, problem } => {
                write!(f, "no JSON equivalent: {problem} (at byte {at})")
            }
        }
    }
}

/// The JSON text of the one MessagePack value `input` holds.
fn msgpack_to_json(input: &[u8]) -> Result<Vec<u8>, DecodeError> {
    if input.is_empty() {
        return Err(DecodeError::Invalid {
            at: 0,
            problem: "the body is empty".into(),
        });
    }
    let mut decoder = Decoder {
        input,
        pos: 0,
        // JSON is usually somewhat longer than MessagePack.
        out: Vec::with_capacity(input.len() + input.len() / 2),
    };
    decoder.value(0)?;
    let left = input.len() - decoder.pos;
    if left > 0 {
        return Err(DecodeError::Invalid {
            at: decoder.pos,
            problem: format!(
                "{left} byte(s) follow the first value; a body holds exactly one value"
            ),
        });
    }
    Ok(decoder.out)
}

/// Reads MessagePack from `input` and writes the JSON text to `out`, in
/// one pass.
struct Decoder<'a> {
    input: &'a [u8],
    pos: usize,
    out: Vec<u8>,
}

impl<'a> Decoder<'a> {
    /// The next `n` bytes, which `what` needs.
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], DecodeError> {
        let left = self.input.len() - self.pos;
        if n > left {
            return Err(DecodeError::Invalid {
                at: self.pos,
                problem: format!("truncated: {what} needs {n} byte(s), {left} left"),
            });
        }
        let bytes = &self.input[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N, what)?.try_into().expect("took N bytes"))
    }

    /// A big-endian length of `N` bytes.
    fn len<const N: usize>(&mut self, what: &str) -> Result<usize, DecodeError> {
        let bytes = self.array::<N>(what)?;
        let mut n = 0usize;
        for b in bytes {
            n = n << 8 | usize::from(b);
        }
        Ok(n)
    }

    fn write_json<T: serde::Serialize + ?Sized>(&mut self, value: &T) {
        serde_json::to_writer(&mut self.out, value).expect("strings and numbers serialize");
    }

    fn write_int(&mut self, n: impl fmt::Display) {
        use std::io::Write;
        write!(self.out, "{n}").expect("writing to a Vec cannot fail");
    }

    fn write_float(
        &mut self,
        at: usize,
        f: f64,
        json: impl FnOnce(&mut Self),
    ) -> Result<(), DecodeError> {
        if !f.is_finite() {
            return Err(DecodeError::NoJson {
                at,
                problem: format!("the float {f} (JSON numbers are finite)"),
            });
        }
        json(self);
        Ok(())
    }

    /// Reads one value, starting with its marker, and writes it as JSON.
    /// `depth` counts the arrays and maps it is inside of.
    fn value(&mut self, depth: usize) -> Result<(), DecodeError> {
        let at = self.pos;
        let [byte] = self.array::<1>("a value")?;
        let marker = Marker::from_u8(byte);
        match marker {
            Marker::Null => self.out.extend_from_slice(b"null"),
            Marker::True => self.out.extend_from_slice(b"true"),
            Marker::False => self.out.extend_from_slice(b"false"),
            Marker::FixPos(n) => self.write_int(n),
            Marker::FixNeg(n) => self.write_int(n),
            Marker::U8 => {
                let n = u8::from_be_bytes(self.array("a uint 8")?);
                self.write_int(n)
            }
            Marker::U16 => {
                let n = u16::from_be_bytes(self.array("a uint 16")?);
                self.write_int(n)
            }
            Marker::U32 => {
                let n = u32::from_be_bytes(self.array("a uint 32")?);
                self.write_int(n)
            }
            Marker::U64 => {
                let n = u64::from_be_bytes(self.array("a uint 64")?);
                self.write_int(n)
            }
            Marker::I8 => {
                let n = i8::from_be_bytes(self.array("an int 8")?);
                self.write_int(n)
            }
            Marker::I16 => {
                let n = i16::from_be_bytes(self.array("an int 16")?);
                self.write_int(n)
            }
            Marker::I32 => {
                let n = i32::from_be_bytes(self.array("an int 32")?);
                self.write_int(n)
            }
            Marker::I64 => {
                let n = i64::from_be_bytes(self.array("an int 64")?);
                self.write_int(n)
            }
            Marker::F32 => {
                let f = f32::from_be_bytes(self.array("a float 32")?);
                // Written as the shortest text that reads back as this f32
                // (1.1, not 1.100000023841858).
                self.write_float(at, f64::from(f), |d| d.write_json(&f))?
            }
            Marker::F64 => {
                let f = f64::from_be_bytes(self.array("a float 64")?);
                self.write_float(at, f, |d| d.write_json(&f))?
            }
            Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
                let s = self.str_body(at, marker)?;
                self.write_json(s)
            }
            Marker::FixArray(n) => self.array_items(at, usize::from(n), depth)?,
            Marker::Array16 => {
                let n = self.len::<2>("an array 16 length")?;
                self.array_items(at, n, depth)?
            }
            Marker::Array32 => {
                let n = self.len::<4>("an array 32 length")?;
                self.array_items(at, n, depth)?
            }
            Marker::FixMap(n) => self.map_entries(at, usize::from(n), depth)?,
            Marker::Map16 => {
                let n = self.len::<2>("a map 16 length")?;
                self.map_entries(at, n, depth)?
            }
            Marker::Map32 => {
                let n = self.len::<4>("a map 32 length")?;
                self.map_entries(at, n, depth)?
            }
            Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => {
                // Checked for truncation first: malformed input is named
                // as such before what JSON lacks.
                let n = match marker {
                    Marker::Bin8 => self.len::<1>("a bin 8 length")?,
                    Marker::Bin16 => self.len::<2>("a bin 16 length")?,
                    _ => self.len::<4>("a bin 32 length")?,
                };
                self.take(n, "binary data")?;
                return Err(DecodeError::NoJson {
                    at,
                    problem: format!("binary data ({n} byte(s)); JSON has no bytes type"),
                });
            }
            Marker::FixExt1
            | Marker::FixExt2
            | Marker::FixExt4
            | Marker::FixExt8
            | Marker::FixExt16
            | Marker::Ext8
            | Marker::Ext16
            | Marker::Ext32 => {
                let n = match marker {
                    Marker::FixExt1 => 1,
                    Marker::FixExt2 => 2,
                    Marker::FixExt4 => 4,
                    Marker::FixExt8 => 8,
                    Marker::FixExt16 => 16,
                    Marker::Ext8 => self.len::<1>("an ext 8 length")?,
                    Marker::Ext16 => self.len::<2>("an ext 16 length")?,
                    _ => self.len::<4>("an ext 32 length")?,
                };
                let [ty] = self.array::<1>("an extension type")?;
                self.take(n, "extension data")?;
                let ty = ty as i8;
                let what = if ty == -1 {
                    "a timestamp (extension type -1)".to_owned()
                } else {
                    format!("an extension value of type {ty}")
                };
                return Err(DecodeError::NoJson {
                    at,
                    problem: format!("{what}; JSON has no extension types"),
                });
            }
            Marker::Reserved => {
                return Err(DecodeError::Invalid {
                    at,
                    problem: "byte 0xc1 is reserved and never used".into(),
                });
            }
        }
        Ok(())
    }

    /// The text of a string whose marker (at `at`) was just read.
    fn str_body(&mut self, at: usize, marker: Marker) -> Result<&'a str, DecodeError> {
        let n = match marker {
            Marker::FixStr(n) => usize::from(n),
            Marker::Str8 => self.len::<1>("a str 8 length")?,
            Marker::Str16 => self.len::<2>("a str 16 length")?,
            _ => self.len::<4>("a str 32 length")?,
        };
        let bytes = self.take(n, "a string")?;
        std::str::from_utf8(bytes).map_err(|e| DecodeError::Invalid {
            at,
            problem: format!("a string that is not UTF-8 ({e})"),
        })
    }

    /// Checks a container at `at` with `n` items of at least `min_item`
    /// bytes each, inside `depth` others, before any item is read.
    fn open(&self, at: usize, n: usize, min_item: usize, depth: usize) -> Result<(), DecodeError> {
        if depth >= MAX_DEPTH {
            return Err(DecodeError::NoJson {
                at,
                problem: format!("arrays and maps nested deeper than {MAX_DEPTH}"),
            });
        }
        let left = self.input.len() - self.pos;
        // Every item takes at least one byte per value: a length larger than
        // what is left is found at once, not after reading all the rest.
        if n.saturating_mul(min_item) > left {
            return Err(DecodeError::Invalid {
                at,
                problem: format!(
                    "truncated: {n} item(s) announced, only {left} byte(s) left to hold them"
                ),
            });
        }
        Ok(())
    }

    fn array_items(&mut self, at: usize, n: usize, depth: usize) -> Result<(), DecodeError> {
        self.open(at, n, 1, depth)?;
        self.out.push(b'[');
        for i in 0..n {
            if i > 0 {
                self.out.push(b',');
            }
            self.value(depth + 1)?;
        }
        self.out.push(b']');
        Ok(())
    }

    fn map_entries(&mut self, at: usize, n: usize, depth: usize) -> Result<(), DecodeError> {
        self.open(at, n, 2, depth)?;
        let mut seen = BTreeSet::new();
        self.out.push(b'{');
        for i in 0..n {
            if i > 0 {
                self.out.push(b',');
            }
            let key_at = self.pos;
            let [byte] = self.array::<1>("a map key")?;
            let marker = Marker::from_u8(byte);
            let key = match marker {
                Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
                    self.str_body(key_at, marker)?
                }
                Marker::Reserved => {
                    return Err(DecodeError::Invalid {
                        at: key_at,
                        problem: "byte 0xc1 is reserved and never used".into(),
                    });
                }
                other => {
                    return Err(DecodeError::NoJson {
                        at: key_at,
                        problem: format!(
                            "a map key that is {}; JSON object keys are strings",
                            kind(other)
                        ),
                    });
                }
            };
            if !seen.insert(key) {
                return Err(DecodeError::NoJson {
                    at: key_at,
                    problem: format!("the map key {key:?} appears twice in one map"),
                });
            }
            self.write_json(key);
            self.out.push(b':');
            self.value(depth + 1)?;
        }
        self.out.push(b'}');
        Ok(())
    }
}

/// What a value of this marker is, for refusals: "an integer", "nil", ...
fn kind(marker: Marker) -> &'static str {
    match marker {
        Marker::Null => "nil",
        Marker::True | Marker::False => "a boolean",
        Marker::FixPos(_)
        | Marker::FixNeg(_)
        | Marker::U8
        | Marker::U16
        | Marker::U32
        | Marker::U64
        | Marker::I8
        | Marker::I16
        | Marker::I32
        | Marker::I64 => "an integer",
        Marker::F32 | Marker::F64 => "a float",
        Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => "a string",
        Marker::Bin8 | Marker::Bin16 | Marker::Bin32 => "binary data",
        Marker::FixArray(_) | Marker::Array16 | Marker::Array32 => "an array",
        Marker::FixMap(_) | Marker::Map16 | Marker::Map32 => "a map",
        Marker::FixExt1
        | Marker::FixExt2
        | Marker::FixExt4
        | Marker::FixExt8
        | Marker::FixExt16
        | Marker::Ext8
        | Marker::Ext16
        | Marker::Ext32 => "an extension value",
        Marker::Reserved => "the reserved byte 0xc1",
    }
}

// --- JSON -> MessagePack -------------------------------------------------

/// The MessagePack of the one JSON value `input` holds.
fn json_to_msgpack(input: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(input.len());
    let mut json = serde_json::Deserializer::from_slice(input);
    Transcode { out: &mut out }
        .deserialize(&mut json)
        .and_then(|()| json.end())
        .map_err(|e| format!("not valid JSON: {e}"))?;
    Ok(out)
}

/// Writes the MessagePack of the JSON value it is handed to `out`, as
/// serde_json parses it: object keys keep their order, and nothing but the
/// output is built.
struct Transcode<'o> {
    out: &'o mut Vec<u8>,
}

impl Transcode<'_> {
    /// `out[start..]` holds `n` encoded items; puts the container's header,
    /// whose size depends on `n`, in front of them.
    fn prefix_header<E: de::Error>(
        &mut self,
        start: usize,
        n: usize,
        write_len: fn(&mut Vec<u8>, u32) -> Result<Marker, rmp::encode::ValueWriteError>,
    ) -> Result<(), E> {
        let n = u32::try_from(n)
            .map_err(|_| E::custom(format_args!("{n} items are more than MessagePack allows")))?;
        let mut header = Vec::with_capacity(5);
        write_len(&mut header, n).map_err(E::custom)?;
        self.out.splice(start..start, header);
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Transcode<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, json: D) -> Result<(), D::Error> {
        json.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Transcode<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        rmp::encode::write_nil(self.out).map_err(E::custom)
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<(), E> {
        rmp::encode::write_bool(self.out, b).map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<(), E> {
        rmp::encode::write_uint(self.out, n)
            .map(drop)
            .map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<(), E> {
        rmp::encode::write_sint(self.out, n)
            .map(drop)
            .map_err(E::custom)
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<(), E> {
        rmp::encode::write_f64(self.out, f).map_err(E::custom)
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        rmp::encode::write_str(self.out, s).map_err(E::custom)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut items: A) -> Result<(), A::Error> {
        let start = self.out.len();
        let mut n = 0;
        while items
            .next_element_seed(Transcode {
                out: &mut *self.out,
            })?
            .is_some()
        {
            n += 1;
        }
        self.prefix_header(start, n, rmp::encode::write_array_len)
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut entries: A) -> Result<(), A::Error> {
        let start = self.out.len();
        let mut n = 0;
        while entries
            .next_key_seed(Transcode {
                out: &mut *self.out,
            })?
            .is_some()
        {
            entries.next_value_seed(Transcode {
                out: &mut *self.out,
            })?;
            n += 1;
        }
        self.prefix_header(start, n, rmp::encode::write_map_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_guest::json;
    use serde_json::Value;

    fn decode(content_type: &str, bytes: impl Into<Vec<u8>>) -> Result<Body, String> {
        MsgpackCodec::decode(Body::new(content_type, bytes)).map_err(|e| e.to_string())
    }

    fn encode(content_type: &str, bytes: impl Into<Vec<u8>>) -> Result<Body, String> {
        MsgpackCodec::encode(Body::new(content_type, bytes)).map_err(|e| e.to_string())
    }

    fn decode_err(bytes: &[u8]) -> String {
        decode(MSGPACK, bytes).unwrap_err()
    }

    fn sample() -> Value {
        json!({
            "id": "o-1",
            "total": 12.5,
            "qty": 3,
            "neg": -129,
            "big": u64::MAX,
            "min": i64::MIN,
            "ok": true,
            "none": null,
            "lines": [{"sku": "a", "n": 1}, [], {}],
            "text": "quote \" backslash \\ newline \n unicode ✓ \u{1}",
        })
    }

    #[test]
    fn json_round_trips_through_msgpack() {
        let json_text = serde_json::to_vec(&sample()).unwrap();
        let wire = encode(MSGPACK, json_text).unwrap();
        assert_eq!(wire.content_type, MSGPACK);
        let plain = decode(MSGPACK, wire.bytes).unwrap();
        assert_eq!(plain.content_type, JSON);
        assert_eq!(
            serde_json::from_slice::<Value>(&plain.bytes).unwrap(),
            sample()
        );
    }

    #[test]
    fn encoding_is_compact_msgpack() {
        let wire = encode(MSGPACK, r#"{"a":[1,-1,300,null,true,"x",0.5]}"#).unwrap();
        assert_eq!(
            wire.bytes,
            [
                0x81, 0xa1, b'a', // map of 1, key "a"
                0x97, // array of 7
                0x01, 0xff, 0xcd, 0x01, 0x2c, 0xc0, 0xc3, 0xa1, b'x', // 1 -1 300 nil true "x"
                0xcb, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0, // f64 0.5
            ]
        );
    }

    #[test]
    fn key_order_survives_both_ways() {
        let text = r#"{"z":1,"a":{"y":2,"b":3},"m":[]}"#;
        let wire = encode(MSGPACK, text).unwrap();
        let plain = decode(MSGPACK, wire.bytes).unwrap();
        assert_eq!(String::from_utf8(plain.bytes).unwrap(), text);
    }

    #[test]
    fn large_containers_get_wider_headers() {
        let items: Vec<Value> = (0..70_000).map(|i| json!(i % 7)).collect();
        let object: serde_json::Map<String, Value> =
            (0..20).map(|i| (format!("k{i:02}"), json!(i))).collect();
        let value = json!({"items": items, "object": object, "s": "é".repeat(40_000)});
        let wire = encode(MSGPACK, serde_json::to_vec(&value).unwrap()).unwrap();
        assert_eq!(wire.bytes[0], 0x83);
        let plain = decode(MSGPACK, wire.bytes).unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&plain.bytes).unwrap(),
            value
        );
    }

    #[test]
    fn decodes_what_other_encoders_write() {
        // Fixed-width ints and an f32, which this codec never writes.
        let wire = [
            0x94, // array of 4
            0xcc, 0x05, // uint 8: 5
            0xd1, 0xff, 0x00, // int 16: -256
            0xca, 0x3f, 0x8c, 0xcc, 0xcd, // f32 1.1
            0xd9, 0x02, b'h', b'i', // str 8 "hi"
        ];
        let plain = decode("application/x-msgpack", wire).unwrap();
        assert_eq!(plain.bytes, br#"[5,-256,1.1,"hi"]"#);
    }

    #[test]
    fn content_types_are_matched_on_their_essence() {
        assert!(decode("Application/MsgPack; charset=binary", [0xc0]).is_ok());
        let wire = encode("application/x-msgpack", "1").unwrap();
        assert_eq!(
            (wire.content_type.as_str(), wire.bytes),
            ("application/x-msgpack", vec![0x01])
        );
        let wire = encode("application/json; charset=utf-8", "[]").unwrap();
        assert_eq!(
            (wire.content_type.as_str(), wire.bytes),
            (MSGPACK, vec![0x90])
        );
    }

    #[test]
    fn other_content_types_are_refused_by_name() {
        assert_eq!(
            decode("application/json", "{}").unwrap_err(),
            "cannot decode content type `application/json`: \
             this codec reads application/msgpack or application/x-msgpack"
        );
        assert_eq!(
            encode("text/plain", "hi").unwrap_err(),
            "cannot encode content type `text/plain`: this codec writes \
             application/msgpack or application/x-msgpack from JSON \
             (or application/json as application/msgpack)"
        );
    }

    #[test]
    fn garbage_is_not_valid_msgpack() {
        // "hello": 'h' is the integer 104, and four bytes follow it.
        assert_eq!(
            decode_err(b"hello"),
            "not valid MessagePack: 4 byte(s) follow the first value; \
             a body holds exactly one value (at byte 1)"
        );
        assert_eq!(
            decode_err(b""),
            "not valid MessagePack: the body is empty (at byte 0)"
        );
        assert_eq!(
            decode_err(&[0xc1]),
            "not valid MessagePack: byte 0xc1 is reserved and never used (at byte 0)"
        );
        assert_eq!(
            decode_err(&[0x92, 0x91, 0x01]),
            "not valid MessagePack: truncated: a value needs 1 byte(s), 0 left (at byte 3)"
        );
        assert_eq!(
            decode_err(&[0xa5, b'a', b'b']),
            "not valid MessagePack: truncated: a string needs 5 byte(s), 2 left (at byte 1)"
        );
        assert_eq!(
            decode_err(&[0xcd, 0x01]),
            "not valid MessagePack: truncated: a uint 16 needs 2 byte(s), 1 left (at byte 1)"
        );
        // A 4-billion-item array announced by 5 bytes is refused at once,
        // without reserving anything.
        assert_eq!(
            decode_err(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0x01]),
            "not valid MessagePack: truncated: 4294967295 item(s) announced, \
             only 1 byte(s) left to hold them (at byte 0)"
        );
        assert_eq!(
            decode_err(&[0xa2, 0xc3, 0x28]),
            "not valid MessagePack: a string that is not UTF-8 \
             (invalid utf-8 sequence of 1 bytes from index 0) (at byte 0)"
        );
        // JSON text is not MessagePack either.
        assert!(decode_err(br#"{"a":1}"#).starts_with("not valid MessagePack: "));
    }

    #[test]
    fn what_json_cannot_hold_is_refused_by_name() {
        assert_eq!(
            decode_err(&[0x91, 0xc4, 0x02, 0xde, 0xad]),
            "no JSON equivalent: binary data (2 byte(s)); JSON has no bytes type (at byte 1)"
        );
        assert_eq!(
            decode_err(&[0xd6, 0xff, 0, 0, 0, 0]),
            "no JSON equivalent: a timestamp (extension type -1); \
             JSON has no extension types (at byte 0)"
        );
        assert_eq!(
            decode_err(&[0xd4, 0x05, 0x00]),
            "no JSON equivalent: an extension value of type 5; \
             JSON has no extension types (at byte 0)"
        );
        assert_eq!(
            decode_err(&[0x81, 0x01, 0x02]),
            "no JSON equivalent: a map key that is an integer; \
             JSON object keys are strings (at byte 1)"
        );
        assert_eq!(
            decode_err(&[0x82, 0xa1, b'k', 0x01, 0xa1, b'k', 0x02]),
            "no JSON equivalent: the map key \"k\" appears twice in one map (at byte 4)"
        );
        let nan = [0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0];
        assert_eq!(
            decode_err(&nan),
            "no JSON equivalent: the float NaN (JSON numbers are finite) (at byte 0)"
        );
        let inf = [0xca, 0xff, 0x80, 0x00, 0x00];
        assert_eq!(
            decode_err(&inf),
            "no JSON equivalent: the float -inf (JSON numbers are finite) (at byte 0)"
        );
    }

    #[test]
    fn nesting_is_limited_to_what_json_parses() {
        let ok = [&[0x91; MAX_DEPTH][..], &[0xc0]].concat();
        let plain = decode(MSGPACK, ok).unwrap();
        // ... and what was decoded encodes back.
        assert!(encode(MSGPACK, plain.bytes).is_ok());
        let too_deep_json = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(
            encode(MSGPACK, too_deep_json)
                .unwrap_err()
                .contains("recursion limit exceeded")
        );
        let deep = [&[0x91; MAX_DEPTH + 1][..], &[0xc0]].concat();
        assert_eq!(
            decode_err(&deep),
            "no JSON equivalent: arrays and maps nested deeper than 127 (at byte 127)"
        );
    }

    #[test]
    fn encode_refuses_what_is_not_one_json_value() {
        assert_eq!(
            encode(MSGPACK, [0x81, 0xa1, b'a', 0x01]).unwrap_err(),
            "not valid JSON: expected value at line 1 column 1"
        );
        assert_eq!(
            encode(MSGPACK, "{} {}").unwrap_err(),
            "not valid JSON: trailing characters at line 1 column 4"
        );
        assert_eq!(
            encode(MSGPACK, "").unwrap_err(),
            "not valid JSON: EOF while parsing a value at line 1 column 0"
        );
    }
}
