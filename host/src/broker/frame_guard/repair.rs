//! Checking and rewriting the payload of one frame: pure, no I/O.
//!
//! What lapin (amq-protocol) refuses in a frame the broker passes on from
//! a producer: a short string that is not UTF-8 (a routing key, a property
//! such as `message-id`, a header name at any depth), and a header table it
//! cannot walk (an unknown field type, a value that runs past its table,
//! properties cut short or followed by stray bytes). Any of these closes
//! the whole connection, so a frame holding one is rewritten into one lapin
//! reads:
//!
//! - a short string that is not UTF-8 keeps its length, each byte of an
//!   invalid sequence becoming `?` (a method frame never grows);
//! - a header table is kept up to what cannot be read and the rest dropped;
//! - the content header gets the header [`UNREADABLE_HEADER`], a sentence
//!   per problem saying what was wrong and where, so the consumer can set
//!   the message aside before any plugin runs.
//!
//! [`content_header_is_clean`] and [`method_is_clean`] are the hot path:
//! one walk over the bytes, no allocation. Only a frame that fails them is
//! rewritten.

use std::fmt::Write as _;

/// The header the guard adds to a delivery it had to rewrite: what could
/// not be read, and where. A reserved name (`x-acemq-*`): the pipeline
/// drops it from what plugins see and from every copy it republishes, and
/// the guard removes it from deliveries that arrive with it, so no producer
/// can forge one.
pub const UNREADABLE_HEADER: &str = "x-acemq-unreadable";

/// Deeper nesting of tables and arrays is not followed: lapin's parser
/// recurses once per level, and a producer's ten thousand nested tables
/// would overflow its thread's stack. AMQP's own deepest (`x-death`) is 3.
pub const MAX_DEPTH: usize = 32;

/// At most this many problems are described, then how many more there were.
const MAX_NOTES: usize = 8;
/// Bytes of a bad string quoted in a note.
const QUOTE_BYTES: usize = 48;

/// The basic properties in the order of their flag bits, from bit 15 down.
const PROPERTIES: [(&str, Kind); 14] = [
    ("content-type", Kind::Short),
    ("content-encoding", Kind::Short),
    ("headers", Kind::Table),
    ("delivery-mode", Kind::Fixed(1)),
    ("priority", Kind::Fixed(1)),
    ("correlation-id", Kind::Short),
    ("reply-to", Kind::Short),
    ("expiration", Kind::Short),
    ("message-id", Kind::Short),
    ("timestamp", Kind::Fixed(8)),
    ("type", Kind::Short),
    ("user-id", Kind::Short),
    ("app-id", Kind::Short),
    ("cluster-id", Kind::Short),
];
const HEADERS_INDEX: usize = 2;
/// class-id (2), weight (2), body size (8), property flags (2).
const CONTENT_HEADER_FIXED: usize = 14;

#[derive(Clone, Copy)]
enum Kind {
    Short,
    Table,
    Fixed(usize),
}

fn flag_bit(index: usize) -> u16 {
    1 << (15 - index)
}

/// The methods whose short strings come from producers (exchange, routing
/// key; a return's reply text can quote them), with their fields in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// basic.deliver (60, 60)
    Deliver,
    /// basic.get-ok (60, 71)
    GetOk,
    /// basic.return (60, 50)
    Return,
}

#[derive(Clone, Copy)]
enum Field {
    Short(&'static str),
    Fixed(usize),
}

impl Method {
    /// The method of a method frame's class and method ids, when it is one
    /// of those checked.
    pub fn of(class: u16, method: u16) -> Option<Self> {
        match (class, method) {
            (60, 60) => Some(Self::Deliver),
            (60, 71) => Some(Self::GetOk),
            (60, 50) => Some(Self::Return),
            _ => None,
        }
    }

    fn fields(self) -> &'static [Field] {
        match self {
            Self::Deliver => &[
                Field::Short("consumer tag"),
                Field::Fixed(8),
                Field::Fixed(1),
                Field::Short("exchange"),
                Field::Short("routing key"),
            ],
            Self::GetOk => &[
                Field::Fixed(8),
                Field::Fixed(1),
                Field::Short("exchange"),
                Field::Short("routing key"),
                Field::Fixed(4),
            ],
            Self::Return => &[
                Field::Fixed(2),
                Field::Short("reply text"),
                Field::Short("exchange"),
                Field::Short("routing key"),
            ],
        }
    }
}

/// What was wrong with one delivery, as sentences for [`UNREADABLE_HEADER`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Notes {
    notes: Vec<String>,
    /// Problems found past [`MAX_NOTES`].
    more: usize,
}

impl Notes {
    pub fn is_empty(&self) -> bool {
        self.notes.is_empty()
    }

    fn push(&mut self, note: String) {
        if self.notes.len() < MAX_NOTES {
            self.notes.push(note);
        } else {
            self.more += 1;
        }
    }

    /// Adds `other`'s notes after these.
    pub fn extend(&mut self, other: Notes) {
        for note in other.notes {
            self.push(note);
        }
        self.more += other.more;
    }

    /// The sentences, joined with `; `.
    pub fn text(&self) -> String {
        let mut text = self.notes.join("; ");
        if self.more > 0 {
            let _ = write!(text, "; and {} more", self.more);
        }
        text
    }
}

// ---------------------------------------------------------------- methods

/// Whether a method's arguments (after class and method ids) are all
/// readable. Broken structure counts as clean: the broker writes these
/// frames itself, and nothing could be repaired in one it garbled.
pub fn method_is_clean(method: Method, args: &[u8]) -> bool {
    let mut rest = args;
    for field in method.fields() {
        match field {
            Field::Fixed(n) => match rest.get(*n..) {
                Some(after) => rest = after,
                None => return true,
            },
            Field::Short(_) => match short_string(rest) {
                Some((text, after)) => {
                    if std::str::from_utf8(text).is_err() {
                        return false;
                    }
                    rest = after;
                }
                None => return true,
            },
        }
    }
    true
}

/// Makes every short string of a method's arguments UTF-8 in place (same
/// length), and says what was wrong.
pub fn repair_method(method: Method, args: &mut [u8]) -> Notes {
    let mut notes = Notes::default();
    let mut at = 0;
    for field in method.fields() {
        match field {
            Field::Fixed(n) => at += n,
            Field::Short(name) => {
                let Some(&len) = args.get(at) else { break };
                let (start, end) = (at + 1, at + 1 + usize::from(len));
                let Some(text) = args.get_mut(start..end) else {
                    break;
                };
                if std::str::from_utf8(text).is_err() {
                    notes.push(format!("the {name} is not UTF-8: {}", quoted(text)));
                    make_utf8(text);
                }
                at = end;
            }
        }
    }
    notes
}

// -------------------------------------------------------- content headers

/// Whether a content header's payload is one lapin reads as it is, with no
/// [`UNREADABLE_HEADER`] of a producer's in it.
pub fn content_header_is_clean(payload: &[u8]) -> bool {
    let Some(flags) = payload.get(12..14) else {
        return false;
    };
    let flags = u16::from_be_bytes([flags[0], flags[1]]);
    let mut rest = &payload[CONTENT_HEADER_FIXED..];
    for (index, (_, kind)) in PROPERTIES.iter().enumerate() {
        if flags & flag_bit(index) == 0 {
            continue;
        }
        rest = match kind {
            Kind::Fixed(n) => match rest.get(*n..) {
                Some(after) => after,
                None => return false,
            },
            Kind::Short => match short_string(rest) {
                Some((text, after)) if std::str::from_utf8(text).is_ok() => after,
                _ => return false,
            },
            Kind::Table => match long_bytes(rest) {
                Some((table, after)) if table_is_clean(table, 0) => after,
                _ => return false,
            },
        };
    }
    rest.is_empty()
}

/// A content header payload rewritten so that lapin reads it (see the
/// module's notes), with [`UNREADABLE_HEADER`] saying what was wrong:
/// `earlier` (from the delivery's method frame) and whatever this header
/// had. The result is at most `max_payload` bytes when it can be: if the
/// repaired headers do not fit, they are replaced by the note alone, and
/// that says so.
pub fn repair_content_header(payload: &[u8], earlier: Notes, max_payload: usize) -> Vec<u8> {
    let mut notes = earlier;
    let properties = RepairedProperties::read(payload, &mut notes);
    let repaired = properties.write(properties.headers.as_deref(), &notes, payload.len());
    if repaired.len() <= max_payload || properties.headers.is_none() {
        return repaired;
    }
    notes.push(
        "its other headers were dropped: with this note they were over the frame size the \
         connection allows"
            .to_string(),
    );
    properties.write(None, &notes, payload.len())
}

/// A content header's start and properties as they will be written.
struct RepairedProperties {
    /// class-id, weight, body size and flags, zeros where it was cut short
    /// (lapin reads the body size from it, so what there is is kept).
    fixed: [u8; CONTENT_HEADER_FIXED],
    flags: u16,
    /// Each property but the headers as it will be written (its encoded
    /// bytes), or absent.
    properties: [Option<Vec<u8>>; 14],
    /// The header table's entries, without their length.
    headers: Option<Vec<u8>>,
}

impl RepairedProperties {
    /// Reads every property the flags announce, repairing each, until the
    /// payload ends; what was wrong goes to `notes`.
    fn read(payload: &[u8], notes: &mut Notes) -> Self {
        let mut fixed = [0u8; CONTENT_HEADER_FIXED];
        let known = payload.len().min(CONTENT_HEADER_FIXED);
        fixed[..known].copy_from_slice(&payload[..known]);
        if payload.len() < CONTENT_HEADER_FIXED {
            // Too short to hold even its flags: no properties can be read.
            notes.push("its content header is cut short".to_string());
        }
        let flags = u16::from_be_bytes([fixed[12], fixed[13]]);
        let mut read = Self {
            fixed,
            flags,
            properties: Default::default(),
            headers: None,
        };
        let mut rest = payload.get(CONTENT_HEADER_FIXED..).unwrap_or_default();
        for (index, (name, kind)) in PROPERTIES.iter().enumerate() {
            if flags & flag_bit(index) == 0 {
                continue;
            }
            let Some(after) = read.read_property(index, name, *kind, rest, notes) else {
                notes.push(format!(
                    "its {name} property and those after it are cut short"
                ));
                rest = &[];
                break;
            };
            rest = after;
        }
        if !rest.is_empty() {
            notes.push(format!("{} stray bytes follow its properties", rest.len()));
        }
        read
    }

    /// Reads property `index` (`name`, of `kind`) from the start of `rest`,
    /// repaired; the bytes after it, or `None` when it is cut short.
    fn read_property<'r>(
        &mut self,
        index: usize,
        name: &str,
        kind: Kind,
        rest: &'r [u8],
        notes: &mut Notes,
    ) -> Option<&'r [u8]> {
        match kind {
            Kind::Fixed(n) => {
                let (value, after) = (rest.get(..n)?, rest.get(n..)?);
                self.properties[index] = Some(value.to_vec());
                Some(after)
            }
            Kind::Short => {
                let (text, after) = short_string(rest)?;
                let mut value = text.to_vec();
                if std::str::from_utf8(text).is_err() {
                    notes.push(format!(
                        "its {name} property is not UTF-8: {}",
                        quoted(text)
                    ));
                    make_utf8(&mut value);
                }
                let mut encoded = Vec::with_capacity(value.len() + 1);
                encoded.push(value.len() as u8);
                encoded.extend_from_slice(&value);
                self.properties[index] = Some(encoded);
                Some(after)
            }
            Kind::Table => {
                let (table, after) = long_bytes(rest)?;
                let mut entries = Vec::with_capacity(table.len() + 64);
                repair_table(table, &Path::Top, 0, &mut entries, notes);
                self.headers = Some(entries);
                Some(after)
            }
        }
    }

    /// The payload with `headers` as the header table's entries and the
    /// [`UNREADABLE_HEADER`] entry, when there are `notes`, after them.
    fn write(&self, headers: Option<&[u8]>, notes: &Notes, size_hint: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(size_hint + 128);
        out.extend_from_slice(&self.fixed[..12]);
        let mut flags = self.flags & 0b11; // the bits lapin ignores, kept
        let mut body = Vec::new();
        for (index, property) in self.properties.iter().enumerate() {
            if index == HEADERS_INDEX {
                let note = (!notes.is_empty()).then(|| notes.text());
                if headers.is_some() || note.is_some() {
                    flags |= flag_bit(index);
                    let mut table = headers.unwrap_or_default().to_vec();
                    if let Some(note) = note {
                        write_marker(&mut table, &note);
                    }
                    body.extend_from_slice(&(table.len() as u32).to_be_bytes());
                    body.extend_from_slice(&table);
                }
            } else if let Some(encoded) = property {
                flags |= flag_bit(index);
                body.extend_from_slice(encoded);
            }
        }
        out.extend_from_slice(&flags.to_be_bytes());
        out.extend_from_slice(&body);
        out
    }
}

/// Appends the [`UNREADABLE_HEADER`] entry (a long string) to a table's
/// entries.
fn write_marker(table: &mut Vec<u8>, note: &str) {
    table.push(UNREADABLE_HEADER.len() as u8);
    table.extend_from_slice(UNREADABLE_HEADER.as_bytes());
    table.push(b'S');
    table.extend_from_slice(&(note.len() as u32).to_be_bytes());
    table.extend_from_slice(note.as_bytes());
}

// ----------------------------------------------------------------- tables

/// What a field value is, from its type tag, as amq-protocol reads it.
enum Shape {
    Fixed(usize),
    /// A long string or byte array: a u32 length, then bytes.
    Bytes,
    Table,
    Array,
}

fn shape(tag: u8) -> Option<Shape> {
    Some(match tag {
        b't' | b'b' | b'B' => Shape::Fixed(1),
        b's' | b'U' | b'u' => Shape::Fixed(2),
        b'I' | b'i' | b'f' => Shape::Fixed(4),
        b'D' => Shape::Fixed(5),
        b'L' | b'l' | b'd' | b'T' => Shape::Fixed(8),
        b'V' => Shape::Fixed(0),
        b'S' | b'x' => Shape::Bytes,
        b'F' => Shape::Table,
        b'A' => Shape::Array,
        _ => return None,
    })
}

/// Whether a table's entries (without their length) read as they are.
/// `depth` counts the tables and arrays around it; at the top, a
/// producer's [`UNREADABLE_HEADER`] counts as unclean.
fn table_is_clean(mut entries: &[u8], depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    while !entries.is_empty() {
        let Some((name, after)) = short_string(entries) else {
            return false;
        };
        if std::str::from_utf8(name).is_err()
            || (depth == 0 && name == UNREADABLE_HEADER.as_bytes())
        {
            return false;
        }
        match value_is_clean(after, depth) {
            Some(after) => entries = after,
            None => return false,
        }
    }
    true
}

/// The bytes after one clean value, or `None`.
fn value_is_clean(value: &[u8], depth: usize) -> Option<&[u8]> {
    let (&tag, rest) = value.split_first()?;
    match shape(tag)? {
        Shape::Fixed(n) => rest.get(n..),
        Shape::Bytes => long_bytes(rest).map(|(_, after)| after),
        Shape::Table => {
            let (inner, after) = long_bytes(rest)?;
            table_is_clean(inner, depth + 1).then_some(after)
        }
        Shape::Array => {
            let (mut inner, after) = long_bytes(rest)?;
            if depth + 1 > MAX_DEPTH {
                return None;
            }
            while !inner.is_empty() {
                inner = value_is_clean(inner, depth + 1)?;
            }
            Some(after)
        }
    }
}

/// Where a value sits, for the notes.
enum Path<'a> {
    Top,
    /// In the table or array that is this value.
    In {
        parent: &'a Path<'a>,
        step: Step,
    },
}

enum Step {
    Name(String),
    Index(usize),
}

impl Path<'_> {
    fn is_top(&self) -> bool {
        matches!(self, Path::Top)
    }

    /// ` in the header "a" > "b"[2]`, or nothing at the top.
    fn describe(&self) -> String {
        let mut steps = Vec::new();
        let mut at = self;
        while let Path::In { parent, step } = at {
            steps.push(step);
            at = parent;
        }
        if steps.is_empty() {
            return String::new();
        }
        let mut text = String::from(" in the header ");
        for (i, step) in steps.iter().rev().enumerate() {
            match step {
                Step::Name(name) => {
                    if i > 0 {
                        text.push_str(" > ");
                    }
                    let _ = write!(text, "{}", quoted(name.as_bytes()));
                }
                Step::Index(index) => {
                    let _ = write!(text, "[{index}]");
                }
            }
        }
        text
    }
}

/// Writes a table's entries (without their length) as lapin reads them:
/// names made UTF-8, a producer's [`UNREADABLE_HEADER`] dropped, nested
/// tables and arrays repaired, and what cannot be walked (an unknown type,
/// a value past the end, nesting past [`MAX_DEPTH`]) dropped with the rest
/// of its table.
fn repair_table(
    mut entries: &[u8],
    path: &Path<'_>,
    depth: usize,
    out: &mut Vec<u8>,
    notes: &mut Notes,
) {
    let mut last: Option<String> = None;
    while !entries.is_empty() {
        let unreadable = |what: &str, last: &Option<String>| {
            let after = match last {
                Some(name) => format!(" after {}", quoted(name.as_bytes())),
                None => String::new(),
            };
            format!(
                "the headers{} could not be read{after}: {what}; the rest of that table was dropped",
                path.describe()
            )
        };
        let Some((name, after)) = short_string(entries) else {
            notes.push(unreadable(
                "a header name runs past the end of the table",
                &last,
            ));
            return;
        };
        let mut fixed_name = name.to_vec();
        if std::str::from_utf8(name).is_err() {
            notes.push(format!(
                "the header name {}{} is not UTF-8",
                quoted(name),
                path.describe()
            ));
            make_utf8(&mut fixed_name);
        }
        let name_text = String::from_utf8(fixed_name).expect("made UTF-8");
        let forged = path.is_top() && name == UNREADABLE_HEADER.as_bytes();
        let mut value = Vec::new();
        let child = Path::In {
            parent: path,
            step: Step::Name(name_text.clone()),
        };
        match repair_value(after, &child, depth, &mut value, notes) {
            Ok(after) => entries = after,
            Err(what) => {
                notes.push(unreadable(&what, &last));
                return;
            }
        }
        if !forged {
            out.push(name_text.len() as u8);
            out.extend_from_slice(name_text.as_bytes());
            out.extend_from_slice(&value);
        }
        last = Some(name_text);
    }
}

/// Writes one value (tag and all) as lapin reads it; the bytes after it, or
/// why this table cannot be walked further.
fn repair_value<'v>(
    value: &'v [u8],
    path: &Path<'_>,
    depth: usize,
    out: &mut Vec<u8>,
    notes: &mut Notes,
) -> Result<&'v [u8], String> {
    let past_end = || "a value runs past the end of its table".to_string();
    let Some((&tag, rest)) = value.split_first() else {
        return Err(past_end());
    };
    let Some(shape) = shape(tag) else {
        return Err(format!("unknown field type {}", quoted(&[tag])));
    };
    match shape {
        Shape::Fixed(n) => {
            let fixed = rest.get(..n).ok_or_else(past_end)?;
            out.push(tag);
            out.extend_from_slice(fixed);
            Ok(&rest[n..])
        }
        Shape::Bytes => {
            let (bytes, after) = long_bytes(rest).ok_or_else(past_end)?;
            out.push(tag);
            out.extend_from_slice(&rest[..4 + bytes.len()]);
            Ok(after)
        }
        Shape::Table | Shape::Array => {
            let (inner, after) = long_bytes(rest).ok_or_else(past_end)?;
            let mut written = Vec::with_capacity(inner.len());
            if depth + 1 > MAX_DEPTH {
                notes.push(format!(
                    "the headers{} nest deeper than {MAX_DEPTH} levels; what is deeper was dropped",
                    path.describe()
                ));
            } else if matches!(shape, Shape::Table) {
                repair_table(inner, path, depth + 1, &mut written, notes);
            } else {
                repair_array(inner, path, depth + 1, &mut written, notes);
            }
            out.push(tag);
            out.extend_from_slice(&(written.len() as u32).to_be_bytes());
            out.extend_from_slice(&written);
            Ok(after)
        }
    }
}

fn repair_array(
    mut items: &[u8],
    path: &Path<'_>,
    depth: usize,
    out: &mut Vec<u8>,
    notes: &mut Notes,
) {
    let mut index = 0;
    while !items.is_empty() {
        let child = Path::In {
            parent: path,
            step: Step::Index(index),
        };
        match repair_value(items, &child, depth, out, notes) {
            Ok(after) => items = after,
            Err(what) => {
                notes.push(format!(
                    "the headers{} could not be read from item {index}: {what}; the rest of that \
                     array was dropped",
                    path.describe()
                ));
                return;
            }
        }
        index += 1;
    }
}

// ---------------------------------------------------------------- helpers

/// A short string: its bytes and what follows.
fn short_string(input: &[u8]) -> Option<(&[u8], &[u8])> {
    let (&len, rest) = input.split_first()?;
    let len = usize::from(len);
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// A u32-length-prefixed run of bytes and what follows.
fn long_bytes(input: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u32::from_be_bytes(input.get(..4)?.try_into().ok()?) as usize;
    let rest = &input[4..];
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// Replaces each byte of every invalid UTF-8 sequence with `?`: the text
/// keeps its length, so no frame grows.
fn make_utf8(bytes: &mut [u8]) {
    let mut at = 0;
    while at < bytes.len() {
        match std::str::from_utf8(&bytes[at..]) {
            Ok(_) => return,
            Err(e) => {
                let bad_start = at + e.valid_up_to();
                let bad_len = e.error_len().unwrap_or(bytes.len() - bad_start);
                bytes[bad_start..bad_start + bad_len].fill(b'?');
                at = bad_start + bad_len;
            }
        }
    }
}

/// The bytes in double quotes, valid text as it is and every other byte
/// (and `"`, `\` and control characters) escaped, at most [`QUOTE_BYTES`].
pub fn quoted(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(QUOTE_BYTES)];
    let mut text = String::with_capacity(shown.len() + 8);
    text.push('"');
    for chunk in shown.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' | '\\' => {
                    text.push('\\');
                    text.push(c);
                }
                c if c.is_control() => {
                    let _ = write!(text, "\\u{{{:x}}}", c as u32);
                }
                c => text.push(c),
            }
        }
        for byte in chunk.invalid() {
            let _ = write!(text, "\\x{byte:02x}");
        }
    }
    text.push('"');
    if bytes.len() > shown.len() {
        let _ = write!(text, " (and {} more bytes)", bytes.len() - shown.len());
    }
    text
}
