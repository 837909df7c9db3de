//! The message a handler receives, its headers, and reading its body.

use core::cell::OnceCell;
use core::fmt;

use serde::Deserialize;

use crate::bindings::wit_types::Message as HostMessage;
pub use crate::bindings::wit_types::{DeclaredRoute, Delivery, Envelope, HeaderValue};
use crate::outcome::Outcome;
use crate::slip::{ROUTING_SLIP_HEADER, RoutingSlip, SlipError};

/// The application header in which an AceMQ request names its reply queue
/// (the AMQP `reply-to` property carries the same value).
pub const REPLY_TO_HEADER: &str = "acemq-reply-to";

/// One message handed to a [`Handler`](crate::Handler).
///
/// The message stays in the host until a part of it is asked for: the first
/// call of [`envelope`](Self::envelope), [`headers`](Self::headers),
/// [`body`](Self::body), ... copies that part into the plugin, and later
/// calls return the same copy. A handler pays only for what it reads: a
/// router that looks at one header never copies the body.
///
/// Take the body out with [`into_body`](Self::into_body) (to move it into a
/// publish without copying), or change parts in place with the `_mut`
/// methods (tests build messages with [`testing::message`](crate::testing)
/// and adjust them that way).
pub struct Message {
    /// The host's handle; `None` for a message built in a test, whose parts
    /// are all set.
    host: Option<HostMessage>,
    envelope: OnceCell<Envelope>,
    delivery: OnceCell<Delivery>,
    content_type: OnceCell<Option<String>>,
    headers: OnceCell<Headers>,
    body: OnceCell<Vec<u8>>,
}

impl Message {
    /// The AceMQ envelope: id, type, version, correlation, attempt, ...
    /// The host fills in defaults for missing headers, so it is always complete.
    pub fn envelope(&self) -> &Envelope {
        self.envelope.get_or_init(|| self.host().envelope())
    }

    /// Where the broker delivered it from: queue, exchange, routing key, ...
    pub fn delivery(&self) -> &Delivery {
        self.delivery.get_or_init(|| self.host().delivery())
    }

    /// The AMQP content type, after any codec has decoded the body.
    pub fn content_type(&self) -> Option<&str> {
        self.content_type
            .get_or_init(|| self.host().content_type())
            .as_deref()
    }

    /// Application headers, in delivery order (never the `x-acemq-*` ones,
    /// which are in the [`envelope`](Self::envelope)).
    pub fn headers(&self) -> &Headers {
        self.headers.get_or_init(|| Headers(self.host().headers()))
    }

    /// The body bytes, after any codec has decoded them.
    pub fn body(&self) -> &[u8] {
        self.body.get_or_init(|| self.host().body())
    }

    /// The body, moved out of the message.
    pub fn into_body(mut self) -> Vec<u8> {
        std::mem::take(self.body_mut())
    }

    /// The envelope, to change.
    pub fn envelope_mut(&mut self) -> &mut Envelope {
        part_mut(&mut self.envelope, &self.host, HostMessage::envelope)
    }

    /// The delivery details, to change.
    pub fn delivery_mut(&mut self) -> &mut Delivery {
        part_mut(&mut self.delivery, &self.host, HostMessage::delivery)
    }

    /// The content type, to change.
    pub fn content_type_mut(&mut self) -> &mut Option<String> {
        part_mut(
            &mut self.content_type,
            &self.host,
            HostMessage::content_type,
        )
    }

    /// The headers, to change.
    pub fn headers_mut(&mut self) -> &mut Headers {
        part_mut(&mut self.headers, &self.host, |host| {
            Headers(host.headers())
        })
    }

    /// The body, to change.
    pub fn body_mut(&mut self) -> &mut Vec<u8> {
        part_mut(&mut self.body, &self.host, HostMessage::body)
    }

    /// Deserializes the JSON body into `T`.
    ///
    /// The error converts into a [`reject`](crate::reject) whose reason names
    /// the type and what was wrong, so `msg.json()?` is all a handler needs:
    /// `body is not a valid Order: missing field `total` at line 1 column 24`.
    /// `T` may borrow from the body (`&str` fields).
    pub fn json<'a, T: Deserialize<'a>>(&'a self) -> Result<T, BodyError> {
        serde_json::from_slice(self.body()).map_err(|e| BodyError {
            problem: format!("body is not a valid {}: {e}", short_type_name::<T>()),
        })
    }

    /// Where a reply to this message goes, as the host resolves it: the
    /// `acemq-reply-to` header (which AceMQ callers write) when it is
    /// text and not empty, else the AMQP `reply-to` property (all a plain
    /// AMQP RPC client sets). `None`: not a request. See
    /// [`reply`](crate::reply()).
    pub fn reply_to(&self) -> Option<&str> {
        let header = self.headers().get_str(REPLY_TO_HEADER);
        let property = self.delivery().reply_to.as_deref();
        header
            .filter(|h| !h.is_empty())
            .or(property.filter(|p| !p.is_empty()))
    }

    /// The AMQP `correlation-id` property: how a plain AMQP RPC client
    /// (pika, amqplib) pairs its replies; the host echoes it on the reply.
    /// AceMQ pairs on the envelope's
    /// [`correlation_id`](Envelope::correlation_id) instead.
    pub fn amqp_correlation_id(&self) -> Option<&str> {
        self.delivery().amqp_correlation_id.as_deref()
    }

    /// The routing slip the message is on, in either wire form: Java's
    /// declared route ([`envelope().route`](Envelope::route)) or the JSON
    /// `acemq-routing-slip` header; `Ok(None)` when it is on neither.
    /// Read-only: the host forwards the message to the next step after an
    /// accept. A JSON slip that cannot be read, or a message carrying both
    /// forms, is an error that converts into a [`reject`](crate::reject)
    /// naming the header (the host sets such a message aside before its
    /// handler runs, so a handler meets one only in a test).
    ///
    /// ```
    /// # use acemq_guest::prelude::*;
    /// # fn f(msg: Message) -> Result {
    /// if let Some(slip) = msg.routing_slip()? {
    ///     let next = slip.next().map_or("none", |step| step.name.as_str());
    ///     acemq_guest::info!("{} steps done, next: {next}", slip.done().len());
    /// }
    /// # accept()
    /// # }
    /// ```
    pub fn routing_slip(&self) -> Result<Option<RoutingSlip>, SlipError> {
        let json = self.headers().get(ROUTING_SLIP_HEADER);
        match (&self.envelope().route, json) {
            (Some(_), Some(_)) => Err(SlipError::both_forms()),
            (Some(route), None) => Ok(Some(RoutingSlip::from_declared(route))),
            (None, json) => json.map(RoutingSlip::from_header).transpose(),
        }
    }

    /// The body as UTF-8 text; not UTF-8 converts into a
    /// [`reject`](crate::reject).
    pub fn text(&self) -> Result<&str, BodyError> {
        core::str::from_utf8(self.body()).map_err(|e| BodyError {
            problem: format!("body is not UTF-8 text: {e}"),
        })
    }

    /// The message the host lent to this call.
    pub(crate) fn from_host(host: HostMessage) -> Self {
        Message {
            host: Some(host),
            envelope: OnceCell::new(),
            delivery: OnceCell::new(),
            content_type: OnceCell::new(),
            headers: OnceCell::new(),
            body: OnceCell::new(),
        }
    }

    /// A message with every part given, for tests.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn local(
        envelope: Envelope,
        delivery: Delivery,
        content_type: Option<String>,
        headers: Headers,
        body: Vec<u8>,
    ) -> Self {
        Message {
            host: None,
            envelope: envelope.into(),
            delivery: delivery.into(),
            content_type: content_type.into(),
            headers: headers.into(),
            body: body.into(),
        }
    }

    fn host(&self) -> &HostMessage {
        host_of(&self.host)
    }
}

/// A part of the message, fetched from the host first if it was not yet.
fn part_mut<'a, T>(
    cell: &'a mut OnceCell<T>,
    host: &Option<HostMessage>,
    fetch: impl FnOnce(&HostMessage) -> T,
) -> &'a mut T {
    if cell.get().is_none() {
        // Cannot fail: the cell was just seen empty and is borrowed mutably.
        let _ = cell.set(fetch(host_of(host)));
    }
    cell.get_mut().expect("the part was just set")
}

fn host_of(host: &Option<HostMessage>) -> &HostMessage {
    host.as_ref()
        .expect("a message built in a test has every part set, so it never asks the host")
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("envelope", self.envelope())
            .field("delivery", self.delivery())
            .field("content_type", &self.content_type())
            .field("headers", self.headers())
            .field("body", &String::from_utf8_lossy(self.body()))
            .finish()
    }
}

/// A body that could not be read as asked ([`Message::json`],
/// [`Message::text`]). Converts into [`Outcome::Reject`]: the same body
/// would fail the same way on every retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BodyError {
    problem: String,
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.problem)
    }
}

impl std::error::Error for BodyError {}

impl From<BodyError> for Outcome {
    fn from(e: BodyError) -> Self {
        Outcome::Reject(e.problem)
    }
}

/// `my_plugin::Order` -> `Order`, `alloc::vec::Vec<my_plugin::Line>` ->
/// `Vec<Line>`: what a person reading a dead-letter reason wants, without the
/// crate paths `type_name` includes.
pub(crate) fn short_type_name<T: ?Sized>() -> String {
    let full = core::any::type_name::<T>();
    let mut out = String::with_capacity(full.len());
    let mut segment_start = 0;
    for (i, c) in full.char_indices() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            continue;
        }
        out.push_str(last_path_segment(&full[segment_start..i]));
        out.push(c);
        segment_start = i + c.len_utf8();
    }
    out.push_str(last_path_segment(&full[segment_start..]));
    out
}

fn last_path_segment(path: &str) -> &str {
    path.rsplit("::").next().unwrap_or(path)
}

/// Application headers of a message, in delivery order.
///
/// AMQP header names are case-sensitive; so is [`get`](Self::get).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Headers(Vec<(String, HeaderValue)>);

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Headers(Vec::new())
    }

    /// The value of the header `name`, if present.
    pub fn get(&self, name: &str) -> Option<&HeaderValue> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// The value of the header `name` if it is text.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(HeaderValue::as_str)
    }

    /// Sets `name` to `value`, replacing an earlier value of the same name.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<HeaderValue>) {
        let name = name.into();
        let value = value.into();
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => *v = value,
            None => self.0.push((name, value)),
        }
    }

    /// Every header, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &HeaderValue)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v))
    }

    /// How many headers there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'a> IntoIterator for &'a Headers {
    type Item = &'a (String, HeaderValue);
    type IntoIter = core::slice::Iter<'a, (String, HeaderValue)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl IntoIterator for Headers {
    type Item = (String, HeaderValue);
    type IntoIter = std::vec::IntoIter<(String, HeaderValue)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<K: Into<String>, V: Into<HeaderValue>> FromIterator<(K, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut headers = Headers::new();
        headers.extend(iter);
        headers
    }
}

impl<K: Into<String>, V: Into<HeaderValue>> Extend<(K, V)> for Headers {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        for (k, v) in iter {
            self.insert(k, v);
        }
    }
}

impl HeaderValue {
    /// The text, if this is [`HeaderValue::Text`].
    pub fn as_str(&self) -> Option<&str> {
        match self {
            HeaderValue::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, if this is [`HeaderValue::Int`].
    pub fn as_int(&self) -> Option<i64> {
        match self {
            HeaderValue::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The number, if this is [`HeaderValue::Float`] or [`HeaderValue::Int`]
    /// (a publisher may send `2` for `2.0`).
    pub fn as_float(&self) -> Option<f64> {
        match self {
            HeaderValue::Float(f) => Some(*f),
            HeaderValue::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// The flag, if this is [`HeaderValue::Boolean`].
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            HeaderValue::Boolean(b) => Some(*b),
            _ => None,
        }
    }

    /// The bytes of [`HeaderValue::Bytes`], or of the text of
    /// [`HeaderValue::Text`].
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            HeaderValue::Bytes(b) => Some(b),
            HeaderValue::Text(s) => Some(s.as_bytes()),
            _ => None,
        }
    }
}

macro_rules! header_value_from {
    ($($ty:ty => $variant:ident via $conv:expr),* $(,)?) => {$(
        impl From<$ty> for HeaderValue {
            fn from(v: $ty) -> Self {
                HeaderValue::$variant($conv(v))
            }
        }
    )*};
}

header_value_from! {
    &str => Text via String::from,
    String => Text via core::convert::identity,
    &String => Text via String::clone,
    i64 => Int via core::convert::identity,
    i32 => Int via i64::from,
    u32 => Int via i64::from,
    f64 => Float via core::convert::identity,
    bool => Boolean via core::convert::identity,
    Vec<u8> => Bytes via core::convert::identity,
    &[u8] => Bytes via <[u8]>::to_vec,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code, reason = "fields are read through Debug only")]
    struct Order {
        id: String,
        total: f64,
    }

    #[test]
    fn json_error_names_type_and_field() {
        let msg = testing::message(r#"{"id": "o-1"}"#);
        let err = msg.json::<Order>().unwrap_err();
        assert_eq!(
            Outcome::from(err),
            Outcome::Reject(
                "body is not a valid Order: missing field `total` at line 1 column 13".into()
            )
        );
    }

    #[test]
    fn json_borrows_from_the_body() {
        #[derive(Deserialize)]
        struct Ref<'a> {
            id: &'a str,
        }
        let msg = testing::message(r#"{"id": "o-1"}"#);
        assert_eq!(msg.json::<Ref>().unwrap().id, "o-1");
    }

    #[test]
    fn text_rejects_non_utf8() {
        let msg = testing::message(vec![0xff, 0xfe]);
        let reason = Outcome::from(msg.text().unwrap_err()).to_string();
        assert!(
            reason.starts_with("reject: body is not UTF-8 text"),
            "{reason}"
        );
        assert_eq!(testing::message("hi").text(), Ok("hi"));
    }

    #[test]
    fn short_type_names_drop_paths() {
        assert_eq!(short_type_name::<Order>(), "Order");
        assert_eq!(short_type_name::<Vec<Order>>(), "Vec<Order>");
        assert_eq!(
            short_type_name::<std::collections::HashMap<String, (u8, Order)>>(),
            "HashMap<String, (u8, Order)>"
        );
        assert_eq!(short_type_name::<&[u8]>(), "&[u8]");
    }

    #[test]
    fn reply_to_reads_the_header_first_then_the_property() {
        let mut msg = testing::request("q", "from-header");
        msg.delivery_mut().reply_to = Some("from-property".into());
        assert_eq!(msg.reply_to(), Some("from-header"));
        msg.headers_mut().insert(REPLY_TO_HEADER, "");
        assert_eq!(
            msg.reply_to(),
            Some("from-property"),
            "empty reads as absent"
        );
        msg.delivery_mut().reply_to = None;
        assert_eq!(msg.reply_to(), None);

        let mut pika = testing::message("q");
        pika.delivery_mut().reply_to = Some("amq.gen-x".into());
        pika.delivery_mut().amqp_correlation_id = Some("rpc-1".into());
        assert_eq!(
            (pika.reply_to(), pika.amqp_correlation_id()),
            (Some("amq.gen-x"), Some("rpc-1"))
        );
    }

    #[test]
    fn headers_get_insert_iterate() {
        let mut h: Headers = [("tenant", HeaderValue::from("acme")), ("n", 3.into())]
            .into_iter()
            .collect();
        h.insert("n", 4);
        assert_eq!(h.len(), 2);
        assert_eq!(h.get_str("tenant"), Some("acme"));
        assert_eq!(h.get("Tenant"), None, "names are case-sensitive");
        assert_eq!(h.get("n").and_then(HeaderValue::as_int), Some(4));
        assert_eq!(h.get("n").and_then(HeaderValue::as_float), Some(4.0));
        let names: Vec<&str> = h.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["tenant", "n"]);
    }
}
