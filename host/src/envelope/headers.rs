//! The headers a plugin sees and sets (the WIT `header-value`), and what it
//! may not set: a name in AceMQ's reserved namespace, or one longer than
//! AMQP allows. A plugin that sets one is refused with a [`HeaderError`] it
//! is told about, rather than having its message silently altered;
//! [`plugin_headers_to_table`] skips such names only as a backstop.

use lapin::types::{AMQPValue, ByteArray, FieldTable, ShortString};

use super::amqp::{integer_value, long_string};
use super::is_reserved;

/// AMQP short strings (header names, exchange and routing key,
/// `message-id`, `content-type`) carry a one-byte length.
pub const MAX_SHORT_STRING: usize = 255;

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

/// Bytes the table of `headers` takes on the wire: each name with its
/// length byte and type tag, and each value in the form
/// [`HeaderValue::to_amqp`] writes (strings and bytes with a 4-byte
/// length). What a plugin's headers cost counts toward what it may publish,
/// like its bodies.
#[must_use]
pub fn plugin_headers_size(headers: &[(String, HeaderValue)]) -> usize {
    headers
        .iter()
        .map(|(name, value)| {
            let value = match value {
                HeaderValue::Text(s) => 4 + s.len(),
                HeaderValue::Bytes(b) => 4 + b.len(),
                HeaderValue::Int(_) | HeaderValue::Float(_) => 8,
                HeaderValue::Bool(_) => 1,
            };
            1 + name.len() + 1 + value
        })
        .sum()
}

/// The start of a long name for an error message, cut on a character
/// boundary so the message stays valid UTF-8.
pub fn preview(value: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::split_table;
    use crate::envelope::test_support::*;

    #[test]
    fn the_size_of_plugin_headers_is_their_encoded_size() {
        let headers = vec![
            ("a".to_owned(), HeaderValue::Text("xyz".into())),
            ("b".to_owned(), HeaderValue::Int(1)),
            ("c".to_owned(), HeaderValue::Float(1.0)),
            ("d".to_owned(), HeaderValue::Bool(true)),
            ("e".to_owned(), HeaderValue::Bytes(vec![1, 2])),
        ];
        let table = plugin_headers_to_table(&headers);
        let written =
            lapin::types::generation::gen_field_table::<Vec<u8>>(&table)(Vec::new().into())
                .unwrap();
        // The table's own 4-byte length is not the plugin's doing.
        assert_eq!(plugin_headers_size(&headers), written.write.len() - 4);
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
}
