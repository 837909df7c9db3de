//! The broker's address: its URL, parsed once and shown only with the
//! password masked.
//!
//! Two parsers read it. The `url` crate (WHATWG rules) finds the parts, so
//! the password is masked wherever it sits, however it is written; lapin's
//! own parser (`lapin::uri`) then builds what lapin connects with, so a URL
//! accepted here is a URL lapin accepts. lapin is handed the parsed URI and
//! never parses the text itself: its parse errors repeat the whole URL.
//!
//! Nothing here prints the URL's text: an error says what is wrong with it,
//! and `Display`/`Debug` show the masked form.

use std::fmt;
use std::str::FromStr;

use ::url::{Host, Url};
use lapin::uri::AMQPUri;

/// What a password is shown as.
const MASK: &str = "***";

/// A broker URL that lapin can connect with.
#[derive(Clone)]
pub struct BrokerUrl {
    /// What lapin connects with; holds the password.
    uri: AMQPUri,
    /// The URL with its password masked: the only form that is ever shown.
    shown: String,
    /// The password as written and percent-decoded, so that a foreign error
    /// text repeating it can be scrubbed. Empty without a password.
    password: Vec<String>,
}

/// Why a broker URL is refused. No variant carries any of the URL's text:
/// the password could be anywhere in it, including where a parser stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// The `url` crate's own kinds (`invalid port number`, `empty host`...)
    /// are fixed texts.
    #[error("{0}{hint}", hint = port_hint(*.0))]
    Syntax(::url::ParseError),
    #[error("the scheme must be amqp:// or amqps://")]
    Scheme,
    #[error("there is no '//' after the scheme (expected amqp://user:password@host:port/vhost)")]
    NoAuthority,
    #[error(
        "an '@' follows the host: a '/', '?', '#' or '@' in the user name or password must be percent-encoded (%2F, %3F, %23, %40)"
    )]
    AtAfterHost,
    #[error("the query parameter '{0}' has an invalid value")]
    Query(String),
    #[error("the user name, password, host or vhost is not UTF-8 once percent-decoded")]
    Encoding,
}

impl BrokerUrl {
    /// Parses `text`; the error never repeats any of it.
    pub fn parse(text: &str) -> Result<Self, UrlError> {
        let url = Url::parse(text).map_err(UrlError::Syntax)?;
        if !matches!(url.scheme(), "amqp" | "amqps") {
            return Err(UrlError::Scheme);
        }
        // `amqp:u:pw@h` and `amqp:/u:pw@h` parse, as a path: lapin would
        // connect to localhost with the credentials in the vhost.
        if !url.has_authority() {
            return Err(UrlError::NoAuthority);
        }
        // What follows the host can be shown, so it must hold no part of a
        // password: `amqp://u:12/34@h` is host `u`, port 12, vhost `34@h`.
        let after_host = [Some(url.path()), url.query(), url.fragment()];
        if after_host
            .into_iter()
            .flatten()
            .any(|part| part.contains('@'))
        {
            return Err(UrlError::AtAfterHost);
        }
        let mut uri = AMQPUri::from_str(text).map_err(|_| amqp_error(&url))?;
        // lapin takes only a domain as the host and falls back to localhost
        // for an IP address; IPv4 is a domain to it in an amqp:// URL, IPv6
        // is not.
        if let Some(Host::Ipv6(address)) = url.host() {
            uri.authority.host = address.to_string();
        }
        let password = match url.password() {
            Some(written) => vec![written.to_string(), uri.authority.userinfo.password.clone()],
            None => Vec::new(),
        };
        Ok(Self {
            shown: masked(url),
            uri,
            password,
        })
    }

    /// What lapin connects with.
    pub fn amqp_uri(&self) -> AMQPUri {
        self.uri.clone()
    }

    /// `text` (an error from a library that saw the URL) with the password,
    /// as written or decoded, masked: a repeated URL becomes its shown form.
    pub fn scrub(&self, text: &str) -> String {
        self.password
            .iter()
            .filter(|secret| !secret.is_empty())
            .fold(text.to_string(), |text, secret| {
                text.replace(secret.as_str(), MASK)
            })
    }
}

impl fmt::Display for BrokerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for BrokerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BrokerUrl").field(&self.shown).finish()
    }
}

/// The URL, safe for logs: the password masked, or, when the URL cannot be
/// parsed, only what is wrong with it.
pub fn redact_url(text: &str) -> String {
    match BrokerUrl::parse(text) {
        Ok(url) => url.to_string(),
        Err(e) => format!("<unparseable URL> ({e})"),
    }
}

/// A password holding a '/', '?' or '#' ends the host part there, so what
/// follows its ':' is read as the port: say so, since that is the usual cause.
fn port_hint(error: ::url::ParseError) -> &'static str {
    match error {
        ::url::ParseError::InvalidPort => {
            " (a '/', '?' or '#' in the password must be percent-encoded: %2F, %3F, %23)"
        }
        _ => "",
    }
}

/// `url` with its password, if any, replaced by [`MASK`].
fn masked(mut url: Url) -> String {
    if url.password().is_some() {
        // Cannot fail: a URL with a password has a host, and it is not `file:`.
        let _ = url.set_password(Some(MASK));
    }
    url.to_string()
}

/// Which part lapin's parser refused, found by asking it again about each
/// part alone (its own error texts can repeat the URL).
fn amqp_error(url: &Url) -> UrlError {
    for (key, value) in url.query_pairs() {
        let mut alone = Url::parse("amqp://localhost/").expect("a valid URL");
        alone.query_pairs_mut().append_pair(&key, &value);
        if AMQPUri::from_str(alone.as_str()).is_err() {
            return UrlError::Query(key.into_owned());
        }
    }
    UrlError::Encoding
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(text: &str) -> String {
        BrokerUrl::parse(text)
            .unwrap_or_else(|e| panic!("{e}"))
            .to_string()
    }

    #[test]
    fn the_password_is_masked_and_the_rest_kept() {
        assert_eq!(
            shown("amqp://guest:secret@localhost:5672/%2f"),
            "amqp://guest:***@localhost:5672/%2f"
        );
    }

    #[test]
    fn a_url_without_a_password_is_shown_as_it_is() {
        assert_eq!(shown("amqp://localhost"), "amqp://localhost");
        assert_eq!(
            shown("amqp://guest@localhost/v"),
            "amqp://guest@localhost/v"
        );
        // An empty password is no password.
        assert_eq!(shown("amqp://guest:@localhost/"), "amqp://guest@localhost/");
    }

    #[test]
    fn odd_characters_in_the_password_are_masked_with_it() {
        for (text, expected) in [
            ("amqp://u:p@ss@h/", "amqp://u:***@h/"),
            ("amqp://u:p:ss@h/", "amqp://u:***@h/"),
            ("amqp://u:p%2Fss%40x@h:5672/%2f", "amqp://u:***@h:5672/%2f"),
            ("amqp://:pw@h/", "amqp://:***@h/"),
        ] {
            assert_eq!(shown(text), expected, "{text}");
        }
    }

    #[test]
    fn the_password_reaches_lapin_decoded() {
        let url = BrokerUrl::parse("amqp://u:p%2Fss%40x@h/%2f").unwrap();
        assert_eq!(url.amqp_uri().authority.userinfo.password, "p/ss@x");
        assert_eq!(url.amqp_uri().vhost, "/");
    }

    #[test]
    fn amqps_keeps_its_scheme_and_port() {
        let url = BrokerUrl::parse("amqps://u:pw@broker.example").unwrap();
        assert_eq!(url.to_string(), "amqps://u:***@broker.example");
        assert_eq!(url.amqp_uri().authority.port, 5671);
    }

    #[test]
    fn ip_hosts_reach_lapin_as_written() {
        let v6 = BrokerUrl::parse("amqp://u:pw@[::1]:5673/%2f").unwrap();
        assert_eq!(v6.to_string(), "amqp://u:***@[::1]:5673/%2f");
        assert_eq!(v6.amqp_uri().authority.host, "::1");
        assert_eq!(v6.amqp_uri().authority.port, 5673);
        let v4 = BrokerUrl::parse("amqp://u:pw@10.0.0.7/").unwrap();
        assert_eq!(v4.to_string(), "amqp://u:***@10.0.0.7/");
        assert_eq!(v4.amqp_uri().authority.host, "10.0.0.7");
    }

    /// Each refusal says what is wrong, and none repeats the password.
    #[test]
    fn refusals_name_the_problem_without_the_text() {
        for (text, expected) in [
            // The '/' ends the host part, so "pa" is read as the port.
            (
                "amqp://guest:pa/ss@h/",
                UrlError::Syntax(::url::ParseError::InvalidPort),
            ),
            ("amqp:u:pw@h", UrlError::NoAuthority),
            ("amqp:/u:pw@h/", UrlError::NoAuthority),
            ("http://u:pw@h/", UrlError::Scheme),
            ("u:pw@h", UrlError::Scheme),
            ("amqp://u:12/pw@h/", UrlError::AtAfterHost),
            ("amqp://u:12?pw@h/", UrlError::AtAfterHost),
            ("amqp://u:12#pw@h/", UrlError::AtAfterHost),
            (
                "amqp://u:pw@h/?heartbeat=soon",
                UrlError::Query("heartbeat".into()),
            ),
            ("amqp://u:%FFpw@h/", UrlError::Encoding),
        ] {
            let error = BrokerUrl::parse(text).err();
            assert_eq!(error.as_ref(), Some(&expected), "{text}");
            assert!(!expected.to_string().contains("pw"), "{expected}");
        }
    }

    #[test]
    fn redact_url_never_shows_an_unparseable_url() {
        assert_eq!(
            redact_url("amqp://guest:pa/ss-s3cret@127.0.0.1:1/%2f"),
            "<unparseable URL> (invalid port number (a '/', '?' or '#' in the password must be percent-encoded: %2F, %3F, %23))"
        );
        assert!(redact_url("amqp:u:s3cret@h").starts_with("<unparseable URL> (there is no '//'"));
        assert_eq!(redact_url("amqp://u:s3cret@h/"), "amqp://u:***@h/");
    }

    #[test]
    fn debug_shows_the_masked_url() {
        let url = BrokerUrl::parse("amqp://u:s3cret@h/").unwrap();
        assert_eq!(format!("{url:?}"), r#"BrokerUrl("amqp://u:***@h/")"#);
    }

    #[test]
    fn scrub_masks_the_password_as_written_and_decoded() {
        let url = BrokerUrl::parse("amqp://u:s3%2Fcret@h/").unwrap();
        assert_eq!(
            url.scrub("refused for s3%2Fcret and s3/cret"),
            "refused for *** and ***"
        );
        let none = BrokerUrl::parse("amqp://u@h/").unwrap();
        assert_eq!(none.scrub("nothing to hide"), "nothing to hide");
    }
}
