//! `--filter`: which set-aside messages a command acts on. Every filter
//! given must match (they are ANDed); none given matches everything.

use std::fmt;
use std::str::FromStr;

use super::message::SetAside;

/// One `--filter` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    /// `reason~=TEXT`: the set-aside reason contains TEXT (case-sensitive).
    ReasonContains(String),
    /// `type=NAME`: the envelope type is exactly NAME.
    TypeIs(String),
    /// `id=ID`: the envelope id is exactly ID.
    IdIs(String),
}

/// What an operator may write, for the refusal of anything else.
pub const FORMS: &str = "'reason~=TEXT', 'type=NAME' or 'id=ID'";

/// Why a `--filter` cannot be used; names the filter as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--filter '{written}': {problem}; a filter is {FORMS}")]
pub struct FilterError {
    written: String,
    problem: String,
}

impl FromStr for Filter {
    type Err = FilterError;

    fn from_str(written: &str) -> Result<Self, FilterError> {
        let refuse = |problem: &str| FilterError {
            written: written.to_owned(),
            problem: problem.to_owned(),
        };
        // `~=` is looked for first: `reason~=a=b` is a substring with an
        // `=` in it, not the key `reason~` equal to `a=b`.
        let (key, operator, value) = if let Some((key, value)) = written.split_once("~=") {
            (key, "~=", value)
        } else if let Some((key, value)) = written.split_once('=') {
            (key, "=", value)
        } else {
            return Err(refuse("no '=' or '~='"));
        };
        if value.is_empty() {
            return Err(refuse("nothing after the operator"));
        }
        let value = value.to_owned();
        match (key.trim(), operator) {
            ("reason", "~=") => Ok(Self::ReasonContains(value)),
            ("type", "=") => Ok(Self::TypeIs(value)),
            ("id", "=") => Ok(Self::IdIs(value)),
            ("reason", _) => Err(refuse("a reason is matched by substring, with '~='")),
            ("type" | "id", _) => Err(refuse("a type or an id is matched exactly, with '='")),
            (other, _) => Err(refuse(&format!("unknown key '{other}'"))),
        }
    }
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ReasonContains(text) => write!(f, "reason~={text}"),
            Self::TypeIs(name) => write!(f, "type={name}"),
            Self::IdIs(id) => write!(f, "id={id}"),
        }
    }
}

impl Filter {
    /// Whether `message` meets this condition. A message without a reason
    /// matches no `reason~=`.
    #[must_use]
    pub fn matches(&self, message: &SetAside) -> bool {
        match self {
            Self::ReasonContains(text) => message
                .reason
                .as_deref()
                .is_some_and(|reason| reason.contains(text.as_str())),
            Self::TypeIs(name) => message.message_type == *name,
            Self::IdIs(id) => message.id == *id,
        }
    }
}

/// Every `--filter` of a command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filters(pub Vec<Filter>);

impl Filters {
    /// Parses each `--filter` as written; the first that cannot be used is
    /// the error.
    pub fn parse<S: AsRef<str>>(written: &[S]) -> Result<Self, FilterError> {
        written
            .iter()
            .map(|w| w.as_ref().parse())
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether `message` meets every condition.
    #[must_use]
    pub fn matches(&self, message: &SetAside) -> bool {
        self.0.iter().all(|filter| filter.matches(message))
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Filters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let written: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&written.join(" and "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: &str, message_type: &str, reason: Option<&str>) -> SetAside {
        SetAside {
            id: id.into(),
            message_type: message_type.into(),
            reason: reason.map(Into::into),
            ..SetAside::default()
        }
    }

    #[test]
    fn parses_the_three_forms() {
        assert_eq!(
            "reason~=timeout".parse(),
            Ok(Filter::ReasonContains("timeout".into()))
        );
        assert_eq!(
            "reason~=a=b".parse(),
            Ok(Filter::ReasonContains("a=b".into()))
        );
        assert_eq!(
            "type=order.placed".parse(),
            Ok(Filter::TypeIs("order.placed".into()))
        );
        assert_eq!("id=42".parse(), Ok(Filter::IdIs("42".into())));
        assert_eq!(
            Filter::ReasonContains("x y".into()).to_string(),
            "reason~=x y"
        );
    }

    #[test]
    fn refusals_name_the_filter_and_what_is_accepted() {
        for (written, problem) in [
            ("colour=red", "unknown key 'colour'"),
            ("reason=boom", "substring, with '~='"),
            ("type~=order", "matched exactly"),
            ("type=", "nothing after the operator"),
            ("timeout", "no '=' or '~='"),
        ] {
            let error = written.parse::<Filter>().unwrap_err().to_string();
            assert!(error.contains(&format!("'{written}'")), "{error}");
            assert!(error.contains(problem), "{error}");
            assert!(error.contains(FORMS), "{error}");
        }
        let error = Filters::parse(&["type=a", "nope"]).unwrap_err();
        assert!(error.to_string().contains("'nope'"));
    }

    #[test]
    fn every_filter_must_match() {
        let timeout = message("1", "order.placed", Some("exhausted 3 attempts: timeout"));
        let parked = message("2", "order.cancelled", None);
        assert!(Filters::default().matches(&timeout));
        assert!(Filters::default().matches(&parked));
        let filters = Filters::parse(&["reason~=timeout", "type=order.placed"]).unwrap();
        assert!(filters.matches(&timeout));
        assert!(!filters.matches(&parked));
        let filters = Filters::parse(&["reason~=timeout", "type=order.cancelled"]).unwrap();
        assert!(!filters.matches(&timeout));
        assert!(!Filters::parse(&["reason~=x"]).unwrap().matches(&parked));
        assert!(Filters::parse(&["id=2"]).unwrap().matches(&parked));
        assert!(!Filters::parse(&["id=22"]).unwrap().matches(&parked));
        // Case matters: reasons quote errors, whose case is part of them.
        assert!(
            !Filters::parse(&["reason~=Timeout"])
                .unwrap()
                .matches(&timeout)
        );
        assert_eq!(
            Filters::parse(&["reason~=a", "type=b"])
                .unwrap()
                .to_string(),
            "reason~=a and type=b"
        );
    }
}
