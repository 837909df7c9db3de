//! What a handler decides, and the `Result` shape that lets `?` decide early.

use core::fmt;

pub use crate::bindings::wit_types::Outcome;

/// The return type of [`Handler::handle`](crate::Handler::handle), and of any
/// helper that may end the handling of a message early.
///
/// Both sides carry an [`Outcome`], and the host treats them the same way:
/// `Ok` is the outcome a handler reached at its end (usually [`accept()`]),
/// `Err` is one that cut it short through `?` or `return` (a [`reject()`]ed
/// body, a [`retry()`] after a refused publish). The split exists only so that
/// `?` works.
///
/// `E` has a default rather than being fixed so that `use
/// acemq_guest::prelude::*` (which brings this `Result` into scope) leaves
/// two-parameter `Result<T, E>` in the rest of a plugin working as usual.
pub type Result<T = Outcome, E = Outcome> = core::result::Result<T, E>;

/// Done: publish what was buffered, then acknowledge the message.
///
/// ```
/// # use acemq_guest::prelude::*;
/// fn handle(_msg: Message) -> Result {
///     accept()
/// }
/// ```
pub fn accept() -> Result {
    Ok(Outcome::Accept)
}

/// Failed for a reason that may pass (a dependency is down, a publish was
/// refused): the consumer's retry policy decides when to try again, or
/// dead-letters the message once the attempts are spent.
///
/// Returns `Err`, so both `return retry(..)` and `retry(..)?` end the handler.
pub fn retry<T>(reason: impl fmt::Display) -> Result<T> {
    Err(Outcome::retry(reason))
}

/// Never processable (malformed, invalid): the message goes to the
/// consumer's dead-letter queue `{queue}.dlq` with this reason. Retrying would
/// not help, so none is attempted.
///
/// Returns `Err`, so it ends the handler wherever it is returned from:
///
/// ```
/// # use acemq_guest::prelude::*;
/// fn check_total(total: f64) -> Result<f64> {
///     if total <= 0.0 {
///         return reject(format_args!("total must be positive, got {total}"));
///     }
///     Ok(total)
/// }
/// assert_eq!(
///     check_total(-1.0),
///     Err(Outcome::Reject("total must be positive, got -1".into()))
/// );
/// ```
pub fn reject<T>(reason: impl fmt::Display) -> Result<T> {
    Err(Outcome::reject(reason))
}

/// Set aside for a person to look at: the message goes to `{queue}.parked`
/// with this reason, and stays there until someone replays it.
pub fn park<T>(reason: impl fmt::Display) -> Result<T> {
    Err(Outcome::park(reason))
}

impl Outcome {
    /// [`Outcome::Retry`] with a reason built from anything printable.
    pub fn retry(reason: impl fmt::Display) -> Self {
        Outcome::Retry(reason.to_string())
    }

    /// [`Outcome::Reject`] with a reason built from anything printable.
    pub fn reject(reason: impl fmt::Display) -> Self {
        Outcome::Reject(reason.to_string())
    }

    /// [`Outcome::Park`] with a reason built from anything printable.
    pub fn park(reason: impl fmt::Display) -> Self {
        Outcome::Park(reason.to_string())
    }

    /// The reason given, `None` for [`Outcome::Accept`].
    pub fn reason(&self) -> Option<&str> {
        match self {
            Outcome::Accept => None,
            Outcome::Retry(r) | Outcome::Reject(r) | Outcome::Park(r) => Some(r),
        }
    }
}

/// `accept`, or `retry: <reason>`, `reject: <reason>`, `park: <reason>`:
/// the form a log line wants.
impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Accept => f.write_str("accept"),
            Outcome::Retry(r) => write!(f, "retry: {r}"),
            Outcome::Reject(r) => write!(f, "reject: {r}"),
            Outcome::Park(r) => write!(f, "park: {r}"),
        }
    }
}

/// Turns a missing value or a foreign error into an outcome, so `?` can end
/// the handler with it.
///
/// For a `Result`, the reason is `"<reason>: <error>"`; for an `Option`, it is
/// the reason alone.
///
/// ```
/// # use acemq_guest::prelude::*;
/// fn handle(msg: Message) -> Result {
///     let tenant = msg.headers().get_str("tenant").or_reject("no `tenant` header")?;
///     let qty: u32 = msg.text()?.trim().parse().or_reject("quantity")?;
///     // `"abc"` would be rejected with "quantity: invalid digit found in string".
/// #   let _ = (tenant, qty);
///     accept()
/// }
/// ```
pub trait OrOutcome<T> {
    /// `Err(`[`Outcome::Retry`]`)` when the value is missing or an error.
    fn or_retry(self, reason: impl fmt::Display) -> Result<T>;
    /// `Err(`[`Outcome::Reject`]`)` when the value is missing or an error.
    fn or_reject(self, reason: impl fmt::Display) -> Result<T>;
    /// `Err(`[`Outcome::Park`]`)` when the value is missing or an error.
    fn or_park(self, reason: impl fmt::Display) -> Result<T>;
}

impl<T> OrOutcome<T> for Option<T> {
    fn or_retry(self, reason: impl fmt::Display) -> Result<T> {
        self.ok_or_else(|| Outcome::retry(reason))
    }
    fn or_reject(self, reason: impl fmt::Display) -> Result<T> {
        self.ok_or_else(|| Outcome::reject(reason))
    }
    fn or_park(self, reason: impl fmt::Display) -> Result<T> {
        self.ok_or_else(|| Outcome::park(reason))
    }
}

impl<T, E: fmt::Display> OrOutcome<T> for core::result::Result<T, E> {
    fn or_retry(self, reason: impl fmt::Display) -> Result<T> {
        self.map_err(|e| Outcome::Retry(format!("{reason}: {e}")))
    }
    fn or_reject(self, reason: impl fmt::Display) -> Result<T> {
        self.map_err(|e| Outcome::Reject(format!("{reason}: {e}")))
    }
    fn or_park(self, reason: impl fmt::Display) -> Result<T> {
        self.map_err(|e| Outcome::Park(format!("{reason}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_end_early_except_accept() {
        assert_eq!(accept(), Ok(Outcome::Accept));
        assert_eq!(retry::<()>("later"), Err(Outcome::Retry("later".into())));
        assert_eq!(reject::<()>(42), Err(Outcome::Reject("42".into())));
        assert_eq!(park::<()>("look"), Err(Outcome::Park("look".into())));
    }

    #[test]
    fn display_is_a_log_line() {
        assert_eq!(Outcome::Accept.to_string(), "accept");
        assert_eq!(Outcome::reject("bad").to_string(), "reject: bad");
        assert_eq!(Outcome::park("odd").reason(), Some("odd"));
        assert_eq!(Outcome::Accept.reason(), None);
    }

    #[test]
    fn or_outcome_names_the_cause() {
        let parsed: core::result::Result<u8, _> = "300".parse::<u8>();
        assert_eq!(
            parsed.or_reject("quantity"),
            Err(Outcome::Reject(
                "quantity: number too large to fit in target type".into()
            ))
        );
        assert_eq!(
            None::<u8>.or_park("no tenant"),
            Err(Outcome::Park("no tenant".into()))
        );
        assert_eq!(Some(1).or_retry("unused"), Ok(1));
    }
}
