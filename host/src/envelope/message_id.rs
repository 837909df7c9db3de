//! A message's id, named by the message or derived from it only when read.
//!
//! A delivery that names no id gets one derived from its body and
//! properties ([`derived_input_id`](super::derived_input_id)): a SHA-256
//! over them, about a microsecond for a 1 KiB message, which was 8 % of the
//! host's CPU on the ack-only path in `perf` (`loadgen consume-host`, echo,
//! messages without ids). Most deliveries never need it: the id names a
//! message's outputs, its set-aside and retry copies, its state and its
//! share of a rollout, and a plugin can ask for it, but a handler that only
//! acks reads none of those. So the derived id is made the first time
//! something reads it, once, and every clone of the id shares that one
//! derivation (the correlation id of a message that names none is the same
//! value).

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, LazyLock};

/// A message id: text, compared and shown as text. Read through
/// [`MessageId::as_str`] (or `Deref` to `str`, `Display`).
#[derive(Clone)]
pub struct MessageId(Id);

#[derive(Clone)]
enum Id {
    Known(String),
    /// Shared by every clone, so the derivation runs once. One allocation
    /// holds the derivation (its closure, unboxed) and then its result: a
    /// boxed closure behind the shared cell was a second allocation for
    /// every delivery without an id, read or not.
    Derived(Arc<dyn Deref<Target = String> + Send + Sync>),
}

impl MessageId {
    /// An id made by `derive` the first time it is read.
    pub fn derived(derive: impl FnOnce() -> String + Send + 'static) -> Self {
        Self(Id::Derived(Arc::new(LazyLock::new(derive))))
    }

    #[must_use]
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Id::Known(id) => id,
            Id::Derived(id) => id,
        }
    }
}

impl Deref for MessageId {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<String> for MessageId {
    fn from(id: String) -> Self {
        Self(Id::Known(id))
    }
}

impl From<&str> for MessageId {
    fn from(id: &str) -> Self {
        Self(Id::Known(id.to_owned()))
    }
}

impl From<MessageId> for String {
    fn from(id: MessageId) -> Self {
        match id.0 {
            Id::Known(id) => id,
            Id::Derived(id) => id.as_str().to_owned(),
        }
    }
}

impl PartialEq for MessageId {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for MessageId {}

impl PartialEq<str> for MessageId {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for MessageId {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for MessageId {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<MessageId> for String {
    fn eq(&self, other: &MessageId) -> bool {
        self == other.as_str()
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counted(derivations: &Arc<AtomicUsize>) -> MessageId {
        let derivations = derivations.clone();
        MessageId::derived(move || {
            derivations.fetch_add(1, Ordering::Relaxed);
            "derived-1".to_owned()
        })
    }

    #[test]
    fn a_derived_id_is_made_only_when_read_and_only_once_for_every_clone() {
        let derivations = Arc::new(AtomicUsize::new(0));
        let id = counted(&derivations);
        let correlation = id.clone();
        assert_eq!(derivations.load(Ordering::Relaxed), 0, "not read yet");
        assert_eq!(id.as_str(), "derived-1");
        assert_eq!(correlation, "derived-1");
        assert_eq!(id.to_string(), "derived-1");
        assert_eq!(derivations.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn ids_compare_as_text_whichever_way_they_were_made() {
        let derivations = Arc::new(AtomicUsize::new(0));
        assert_eq!(counted(&derivations), MessageId::from("derived-1"));
        assert_ne!(MessageId::from("a"), MessageId::from("b"));
        assert_eq!(String::from(counted(&derivations)), "derived-1");
        assert_eq!(format!("{:?}", MessageId::from("a")), "\"a\"");
    }
}
