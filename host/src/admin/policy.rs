//! Who may use the admin endpoint, decided from a request's head alone.
//!
//! Pure: no sockets, files or environment. The server (`admin/mod.rs`)
//! hands [`authorize`] each request's head and answers the [`Refusal`];
//! config checks call [`check_listen`] and [`check_allowed_host`]; the token's
//! text comes from a file or the environment and is checked by
//! [`Token::new`].

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use hyper::header::{AUTHORIZATION, CONTENT_LENGTH, HOST, HeaderMap, ORIGIN, TRANSFER_ENCODING};
use hyper::http::request::Parts;
use hyper::{Method, StatusCode};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

// The checks of the admin keys in the config file live with the config
// (the config is checked before anything runs, and imports nothing of the
// running host); the endpoint uses the same rules.
use crate::config::admin_keys::port_of;
pub use crate::config::{ANY_HOST, TOKEN_ENV, check_allowed_host, check_listen, is_remote};

/// Shortest token accepted: 16 random characters are out of reach of
/// guessing over HTTP, and a shorter one is more likely a placeholder.
pub const MIN_TOKEN_CHARS: usize = 16;

/// Largest request body accepted. No route reads a body, so this only
/// bounds what a client can make the server receive and throw away.
pub const MAX_BODY_BYTES: u64 = 1024;

/// The admin token. Only its SHA-256 is kept: the token itself cannot end up
/// in a log or a `Debug` print, and comparing digests of equal length takes
/// the same time whatever the length of the guess.
#[derive(Clone)]
pub struct Token {
    digest: [u8; 32],
}

impl Token {
    /// Checks a token's text; surrounding whitespace (a file's trailing
    /// newline) is not part of it. The refusal never quotes the token.
    pub fn new(text: &str) -> Result<Self, String> {
        let token = text.trim();
        if token.is_empty() {
            return Err("the token is empty".into());
        }
        // It travels in an HTTP header; anything else could never match.
        if !token.chars().all(|c| c.is_ascii_graphic()) {
            return Err(
                "the token has a space, a control character or a non-ASCII character; \
                 use printable ASCII only (for example `openssl rand -hex 32`)"
                    .into(),
            );
        }
        if token.len() < MIN_TOKEN_CHARS {
            return Err(format!(
                "the token is {} characters long; use at least {MIN_TOKEN_CHARS} \
                 (for example `openssl rand -hex 32`)",
                token.len()
            ));
        }
        Ok(Self {
            digest: Sha256::digest(token).into(),
        })
    }

    fn matches(&self, presented: &[u8]) -> bool {
        let presented: [u8; 32] = Sha256::digest(presented).into();
        self.digest.ct_eq(&presented).into()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(redacted)")
    }
}

/// An authority as compared with the allowed hosts: lowercase, and with the
/// port HTTP implies when a client leaves it out.
fn normalize(authority: &str) -> String {
    let lower = authority.to_ascii_lowercase();
    if port_of(&lower).is_some() {
        lower
    } else {
        format!("{lower}:80")
    }
}

/// What the endpoint lets through.
#[derive(Debug)]
pub struct Policy {
    /// Normalized authorities a request may name (see [`normalize`]).
    hosts: Vec<String>,
    /// [`ANY_HOST`] was configured: every authority passes.
    any_host: bool,
    token: Option<Token>,
}

impl Policy {
    /// The policy of an endpoint bound to `bound`: requests may name the
    /// bound address (or loopback and `localhost` when it is loopback or
    /// every interface) or one of `configured` (each passed
    /// [`check_allowed_host`]).
    pub fn new(bound: SocketAddr, configured: &[String], token: Option<Token>) -> Self {
        let port = bound.port();
        let ip = bound.ip();
        let mut hosts = Vec::new();
        if ip.is_loopback() || ip.is_unspecified() {
            hosts.push(format!("localhost:{port}"));
        }
        // An unspecified address is never what a client connects to; the
        // loopback addresses it also covers are.
        match ip {
            IpAddr::V4(v4) if v4.is_unspecified() => {
                hosts.push(authority(Ipv4Addr::LOCALHOST, port))
            }
            IpAddr::V6(v6) if v6.is_unspecified() => {
                hosts.push(authority(Ipv6Addr::LOCALHOST, port));
                hosts.push(authority(Ipv4Addr::LOCALHOST, port));
            }
            _ => hosts.push(bound.to_string()),
        }
        hosts.extend(
            configured
                .iter()
                .filter(|host| *host != ANY_HOST)
                .map(|host| normalize(host)),
        );
        Self {
            hosts,
            any_host: configured.iter().any(|host| host == ANY_HOST),
            token,
        }
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    fn allows_host(&self, authority: &str) -> bool {
        self.any_host || self.hosts.contains(&normalize(authority))
    }
}

fn authority(ip: impl Into<IpAddr>, port: u16) -> String {
    SocketAddr::new(ip.into(), port).to_string()
}

/// Why a request was refused; its status and a sentence for the body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Another host's name: DNS rebinding (a web page whose name now
    /// resolves to loopback) or a proxy sending the wrong name.
    #[error(
        "this endpoint does not answer for host \"{0}\"; if clients reach it by that name, add it to admin_allowed_hosts in [host]"
    )]
    UnknownHost(String),
    #[error("the request names no host; send a Host header")]
    NoHost,
    #[error("a request body of undeclared length is refused: this endpoint takes no body")]
    LengthRequired,
    #[error(
        "a request body of {0} bytes is over the limit of {MAX_BODY_BYTES}: this endpoint takes no body"
    )]
    BodyTooLarge(u64),
    /// A web page's form or script: without this a page in an operator's
    /// browser could reload plugins on a loopback endpoint.
    #[error(
        "a {method} from origin \"{origin}\" is refused: only same-origin requests may change state"
    )]
    CrossOrigin { method: Method, origin: String },
    #[error(
        "send the admin token as Authorization: Bearer TOKEN (the token in admin_token_file or {TOKEN_ENV})"
    )]
    MissingToken,
    #[error("the bearer token is wrong")]
    WrongToken,
    #[error(
        "a token must be configured to reload over HTTP (or to send any other {0}): set admin_token_file in [host] or the {TOKEN_ENV} environment variable; SIGHUP and plugin file changes still reload"
    )]
    NoTokenConfigured(Method),
}

impl Refusal {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::UnknownHost(_) | Self::NoHost => StatusCode::MISDIRECTED_REQUEST,
            Self::LengthRequired => StatusCode::LENGTH_REQUIRED,
            Self::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::CrossOrigin { .. } | Self::NoTokenConfigured(_) => StatusCode::FORBIDDEN,
            Self::MissingToken | Self::WrongToken => StatusCode::UNAUTHORIZED,
        }
    }

    /// Whether the answer carries `WWW-Authenticate: Bearer`.
    pub fn challenges(&self) -> bool {
        self.status() == StatusCode::UNAUTHORIZED
    }
}

/// Longest refused host or origin quoted back, so a refusal stays small.
const QUOTE_MAX: usize = 100;

/// The paths an orchestrator's probes ask: liveness and readiness.
pub const PROBES: [&str; 2] = ["/health/live", "/health/ready"];

/// Whether `head` is a probe: `GET` or `HEAD` of one of [`PROBES`]. Their
/// answer is one status word and its HTTP status, nothing a reader could
/// use, so they are open to anyone who can connect: no token (a kubelet
/// cannot take one from a Secret) and any `Host` (a kubelet names the pod's
/// address, which no config can know). Every other route keeps every check.
pub fn is_probe(head: &Parts) -> bool {
    matches!(head.method, Method::GET | Method::HEAD) && PROBES.contains(&head.uri.path())
}

/// Lets a request through or says why not. Checks, in order: the host it
/// names, its body, where it comes from (state-changing methods), the token.
/// A probe ([`is_probe`]) is checked for its body only, the status page's
/// files for all but the token.
pub fn authorize(head: &Parts, policy: &Policy) -> Result<(), Refusal> {
    if is_probe(head) {
        return check_body(&head.headers);
    }
    check_host(head, policy)?;
    check_body(&head.headers)?;
    // The status page and its script and style hold no data (the page reads
    // `/status`, which needs the token, with the token it asks for), and a
    // browser's address bar cannot send a token.
    if head.method == Method::GET && super::status::ASSETS.contains(&head.uri.path()) {
        return Ok(());
    }
    let changes_state = !head.method.is_safe();
    if changes_state {
        check_origin(head)?;
    }
    match &policy.token {
        Some(token) => check_token(&head.headers, token),
        None if changes_state => Err(Refusal::NoTokenConfigured(head.method.clone())),
        None => Ok(()),
    }
}

/// The authority a request names: its target's when absolute (which, per
/// RFC 9112, overrides Host), else its one Host header.
fn requested_host(head: &Parts) -> Result<String, Refusal> {
    if let Some(authority) = head.uri.authority() {
        return Ok(authority.as_str().to_string());
    }
    let mut values = head.headers.get_all(HOST).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => Ok(String::from_utf8_lossy(value.as_bytes()).into_owned()),
        (None, _) => Err(Refusal::NoHost),
        (Some(first), Some(_)) => Err(Refusal::UnknownHost(quote(first.as_bytes()))),
    }
}

fn check_host(head: &Parts, policy: &Policy) -> Result<(), Refusal> {
    let host = requested_host(head)?;
    if policy.allows_host(&host) {
        Ok(())
    } else {
        Err(Refusal::UnknownHost(quote(host.as_bytes())))
    }
}

fn check_body(headers: &HeaderMap) -> Result<(), Refusal> {
    // A chunked body's size is only known once it has all been read.
    if headers.contains_key(TRANSFER_ENCODING) {
        return Err(Refusal::LengthRequired);
    }
    let Some(length) = headers.get(CONTENT_LENGTH) else {
        return Ok(());
    };
    // hyper refuses a malformed Content-Length before a request gets here.
    let length = length
        .to_str()
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    if length > MAX_BODY_BYTES {
        return Err(Refusal::BodyTooLarge(length));
    }
    Ok(())
}

fn check_origin(head: &Parts) -> Result<(), Refusal> {
    let Some(origin) = head.headers.get(ORIGIN) else {
        // Not from a browser's cross-origin request: browsers always send
        // Origin on a cross-origin POST.
        return Ok(());
    };
    let same = origin
        .to_str()
        .ok()
        .and_then(|origin| origin.strip_prefix("http://"))
        .zip(requested_host(head).ok())
        .is_some_and(|(origin, host)| normalize(origin) == normalize(&host));
    if same {
        Ok(())
    } else {
        Err(Refusal::CrossOrigin {
            method: head.method.clone(),
            origin: quote(origin.as_bytes()),
        })
    }
}

fn check_token(headers: &HeaderMap, token: &Token) -> Result<(), Refusal> {
    let presented = headers.get(AUTHORIZATION).and_then(|value| {
        let value = value.as_bytes();
        let space = value.iter().position(|b| *b == b' ')?;
        let (scheme, rest) = value.split_at(space);
        scheme
            .eq_ignore_ascii_case(b"bearer")
            .then_some(rest.trim_ascii())
    });
    match presented {
        None => Err(Refusal::MissingToken),
        Some(presented) if token.matches(presented) => Ok(()),
        Some(_) => Err(Refusal::WrongToken),
    }
}

/// A client's header value, safe to quote back: lossy text, at most
/// [`QUOTE_MAX`] characters.
fn quote(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    match text.char_indices().nth(QUOTE_MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef-secret";
    const BOUND: &str = "127.0.0.1:9090";

    fn policy(token: Option<&str>) -> Policy {
        Policy::new(
            BOUND.parse().unwrap(),
            &["ACEMQ-1.internal:9090".to_string()],
            token.map(|t| Token::new(t).unwrap()),
        )
    }

    /// A request head; `headers` are (name, value) pairs.
    fn head(method: Method, headers: &[(&str, &str)]) -> Parts {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri("/plugins/reload");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    fn bearer(token: &str) -> String {
        format!("Bearer {token}")
    }

    fn at(method: Method, path: &str, headers: &[(&str, &str)]) -> Parts {
        let mut request = hyper::Request::builder().method(method).uri(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn any_host_lets_every_host_through_and_still_asks_for_the_token() {
        let p = Policy::new(
            "0.0.0.0:9090".parse().unwrap(),
            &[ANY_HOST.to_string()],
            Some(Token::new(TOKEN).unwrap()),
        );
        let auth = bearer(TOKEN);
        let scrape = at(
            Method::GET,
            "/metrics",
            &[("host", "10.244.3.17:9090"), ("authorization", &auth)],
        );
        assert_eq!(authorize(&scrape, &p), Ok(()));
        let anonymous = at(Method::GET, "/metrics", &[("host", "10.244.3.17:9090")]);
        assert_eq!(authorize(&anonymous, &p), Err(Refusal::MissingToken));
    }

    #[test]
    fn the_status_page_files_need_no_token_but_their_data_and_host_do() {
        let p = policy(Some(TOKEN));
        for path in ["/", "/status.js", "/status.css"] {
            assert_eq!(
                authorize(&at(Method::GET, path, &[("host", BOUND)]), &p),
                Ok(())
            );
            let rebound = at(Method::GET, path, &[("host", "evil.example:9090")]);
            assert!(matches!(
                authorize(&rebound, &p),
                Err(Refusal::UnknownHost(_))
            ));
        }
        let data = at(Method::GET, "/status", &[("host", BOUND)]);
        assert_eq!(authorize(&data, &p), Err(Refusal::MissingToken));
    }

    #[test]
    fn probes_are_open_to_any_host_without_the_token_and_nothing_else_is() {
        let p = policy(Some(TOKEN));
        for path in PROBES {
            for method in [Method::GET, Method::HEAD] {
                let kubelet = at(method, path, &[("host", "10.1.2.3:9090")]);
                assert_eq!(authorize(&kubelet, &p), Ok(()), "{path}");
            }
            let post = at(Method::POST, path, &[("host", BOUND)]);
            assert_eq!(authorize(&post, &p), Err(Refusal::MissingToken));
            let big = at(
                Method::GET,
                path,
                &[("host", BOUND), ("content-length", "5000")],
            );
            assert_eq!(authorize(&big, &p), Err(Refusal::BodyTooLarge(5000)));
        }
        for path in [
            "/health",
            "/health/",
            "/health/live/x",
            "/status",
            "/metrics",
        ] {
            let other = at(Method::GET, path, &[("host", BOUND)]);
            assert_eq!(authorize(&other, &p), Err(Refusal::MissingToken), "{path}");
            let elsewhere = at(Method::GET, path, &[("host", "10.1.2.3:9090")]);
            assert!(
                matches!(authorize(&elsewhere, &p), Err(Refusal::UnknownHost(_))),
                "{path}"
            );
        }
    }

    #[test]
    fn a_request_with_the_token_passes() {
        let auth = bearer(TOKEN);
        for method in [Method::GET, Method::POST] {
            let request = head(method, &[("host", BOUND), ("authorization", &auth)]);
            assert_eq!(authorize(&request, &policy(Some(TOKEN))), Ok(()));
        }
    }

    #[test]
    fn with_a_token_configured_every_request_needs_it() {
        for method in [Method::GET, Method::POST] {
            let request = head(method, &[("host", BOUND)]);
            let refusal = authorize(&request, &policy(Some(TOKEN))).unwrap_err();
            assert_eq!(refusal, Refusal::MissingToken);
            assert_eq!(refusal.status(), StatusCode::UNAUTHORIZED);
            assert!(refusal.challenges());
        }
    }

    #[test]
    fn a_wrong_token_or_another_scheme_is_refused() {
        let p = policy(Some(TOKEN));
        let wrong = bearer("0123456789abcdef-secreT");
        let request = head(Method::GET, &[("host", BOUND), ("authorization", &wrong)]);
        assert_eq!(authorize(&request, &p), Err(Refusal::WrongToken));
        let prefix = bearer(&TOKEN[..TOKEN.len() - 1]);
        let request = head(Method::GET, &[("host", BOUND), ("authorization", &prefix)]);
        assert_eq!(authorize(&request, &p), Err(Refusal::WrongToken));
        let basic = format!("Basic {TOKEN}");
        let request = head(Method::GET, &[("host", BOUND), ("authorization", &basic)]);
        assert_eq!(authorize(&request, &p), Err(Refusal::MissingToken));
    }

    #[test]
    fn the_scheme_is_case_insensitive() {
        let auth = format!("bearer  {TOKEN}");
        let request = head(Method::GET, &[("host", BOUND), ("authorization", &auth)]);
        assert_eq!(authorize(&request, &policy(Some(TOKEN))), Ok(()));
    }

    #[test]
    fn without_a_token_reads_pass_and_changes_are_refused() {
        let p = policy(None);
        assert_eq!(
            authorize(&head(Method::GET, &[("host", BOUND)]), &p),
            Ok(())
        );
        let refusal = authorize(&head(Method::POST, &[("host", BOUND)]), &p).unwrap_err();
        assert_eq!(refusal, Refusal::NoTokenConfigured(Method::POST));
        assert_eq!(refusal.status(), StatusCode::FORBIDDEN);
        let text = refusal.to_string();
        assert!(
            text.contains("a token must be configured to reload over HTTP")
                && text.contains("SIGHUP"),
            "{text}"
        );
    }

    #[test]
    fn a_foreign_host_is_refused_and_named() {
        // DNS rebinding: the page's own name, now resolving to 127.0.0.1.
        let request = head(Method::GET, &[("host", "evil.example:9090")]);
        let refusal = authorize(&request, &policy(None)).unwrap_err();
        assert_eq!(refusal, Refusal::UnknownHost("evil.example:9090".into()));
        assert_eq!(refusal.status(), StatusCode::MISDIRECTED_REQUEST);
        assert!(refusal.to_string().contains("\"evil.example:9090\""));
        // The right name on another port is another origin.
        let request = head(Method::GET, &[("host", "127.0.0.1:9091")]);
        assert!(authorize(&request, &policy(None)).is_err());
        // It is checked before the token: a rebinding page learns nothing.
        let request = head(Method::GET, &[("host", "evil.example:9090")]);
        assert!(matches!(
            authorize(&request, &policy(Some(TOKEN))),
            Err(Refusal::UnknownHost(_))
        ));
    }

    #[test]
    fn bound_loopback_localhost_and_configured_hosts_pass() {
        let p = policy(None);
        for host in [
            "127.0.0.1:9090",
            "localhost:9090",
            "LocalHost:9090",
            "acemq-1.internal:9090",
        ] {
            assert_eq!(
                authorize(&head(Method::GET, &[("host", host)]), &p),
                Ok(()),
                "{host}"
            );
        }
    }

    #[test]
    fn a_request_without_a_host_or_with_two_is_refused() {
        assert_eq!(
            authorize(&head(Method::GET, &[]), &policy(None)),
            Err(Refusal::NoHost)
        );
        let request = head(
            Method::GET,
            &[("host", BOUND), ("host", "evil.example:9090")],
        );
        assert!(matches!(
            authorize(&request, &policy(None)),
            Err(Refusal::UnknownHost(_))
        ));
    }

    #[test]
    fn an_absolute_target_names_the_host() {
        let mut request = head(Method::GET, &[("host", BOUND)]);
        request.uri = "http://evil.example:9090/plugins".parse().unwrap();
        assert_eq!(
            authorize(&request, &policy(None)),
            Err(Refusal::UnknownHost("evil.example:9090".into()))
        );
    }

    #[test]
    fn hosts_follow_the_bound_address() {
        let on = |bound: &str, host: &str| {
            let p = Policy::new(bound.parse().unwrap(), &[], None);
            authorize(&head(Method::GET, &[("host", host)]), &p).is_ok()
        };
        assert!(on("[::1]:9090", "[::1]:9090"));
        assert!(on("[::1]:9090", "localhost:9090"));
        assert!(!on("[::1]:9090", "127.0.0.1:9090"));
        assert!(on("0.0.0.0:9090", "127.0.0.1:9090"));
        assert!(!on("0.0.0.0:9090", "0.0.0.0:9090"));
        assert!(on("[::]:9090", "[::1]:9090"));
        assert!(on("10.1.2.3:9090", "10.1.2.3:9090"));
        assert!(!on("10.1.2.3:9090", "localhost:9090"));
        // Without a port, a Host names port 80.
        assert!(on("127.0.0.1:80", "127.0.0.1"));
        assert!(!on("127.0.0.1:9090", "127.0.0.1"));
    }

    #[test]
    fn a_cross_origin_post_is_refused_even_with_the_token() {
        let auth = bearer(TOKEN);
        for origin in ["http://evil.example", "null", "https://127.0.0.1:9090"] {
            let request = head(
                Method::POST,
                &[
                    ("host", BOUND),
                    ("origin", origin),
                    ("authorization", &auth),
                ],
            );
            let refusal = authorize(&request, &policy(Some(TOKEN))).unwrap_err();
            assert_eq!(
                refusal,
                Refusal::CrossOrigin {
                    method: Method::POST,
                    origin: origin.into()
                }
            );
            assert_eq!(refusal.status(), StatusCode::FORBIDDEN);
        }
        // And without a token configured, the origin is what is named.
        let request = head(
            Method::POST,
            &[("host", BOUND), ("origin", "http://evil.example")],
        );
        assert!(matches!(
            authorize(&request, &policy(None)),
            Err(Refusal::CrossOrigin { .. })
        ));
    }

    #[test]
    fn a_same_origin_post_and_a_cross_origin_get_pass() {
        let auth = bearer(TOKEN);
        let request = head(
            Method::POST,
            &[
                ("host", BOUND),
                ("origin", "http://127.0.0.1:9090"),
                ("authorization", &auth),
            ],
        );
        assert_eq!(authorize(&request, &policy(Some(TOKEN))), Ok(()));
        // A cross-origin GET cannot read the answer (no CORS headers) and
        // changes nothing.
        let request = head(
            Method::GET,
            &[("host", BOUND), ("origin", "http://evil.example")],
        );
        assert_eq!(authorize(&request, &policy(None)), Ok(()));
    }

    #[test]
    fn bodies_over_the_limit_or_of_unknown_length_are_refused() {
        let auth = bearer(TOKEN);
        let p = policy(Some(TOKEN));
        let with = |extra: (&str, &str)| {
            authorize(
                &head(
                    Method::POST,
                    &[("host", BOUND), ("authorization", &auth), extra],
                ),
                &p,
            )
        };
        assert_eq!(with(("content-length", "1024")), Ok(()));
        let refusal = with(("content-length", "1025")).unwrap_err();
        assert_eq!(refusal, Refusal::BodyTooLarge(1025));
        assert_eq!(refusal.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let refusal = with(("transfer-encoding", "chunked")).unwrap_err();
        assert_eq!(refusal, Refusal::LengthRequired);
        assert_eq!(refusal.status(), StatusCode::LENGTH_REQUIRED);
        // Before the token: an oversize request is refused unread, whoever sends it.
        let request = head(Method::GET, &[("host", BOUND), ("content-length", "4096")]);
        assert_eq!(authorize(&request, &p), Err(Refusal::BodyTooLarge(4096)));
    }

    #[test]
    fn a_refused_host_is_quoted_short() {
        let long = format!("{}:9090", "a".repeat(500));
        let Err(Refusal::UnknownHost(quoted)) =
            authorize(&head(Method::GET, &[("host", &long)]), &policy(None))
        else {
            panic!("not refused");
        };
        assert_eq!(quoted.len(), QUOTE_MAX + 3, "{quoted}");
    }

    #[test]
    fn tokens_are_checked_and_never_shown() {
        let short = Token::new("  short-token\n").unwrap_err();
        assert!(
            short.contains("11 characters long") && short.contains("at least 16"),
            "{short}"
        );
        assert!(!short.contains("short-token"), "{short}");
        assert!(Token::new("\n").unwrap_err().contains("empty"));
        assert!(
            Token::new("0123456789 abcdef")
                .unwrap_err()
                .contains("space")
        );
        assert!(Token::new("0123456789abcdéf0").is_err());
        let token = Token::new(&format!("{TOKEN}\n")).unwrap();
        assert!(token.matches(TOKEN.as_bytes()));
        assert_eq!(format!("{token:?}"), "Token(redacted)");
    }

    #[test]
    fn loopback_addresses_are_local_and_the_rest_remote() {
        for local in [
            "127.0.0.1:9090",
            "127.3.4.5:1",
            "[::1]:9090",
            "localhost:9090",
            "LOCALHOST:0",
        ] {
            assert_eq!(is_remote(local), Ok(false), "{local}");
        }
        for remote in [
            "0.0.0.0:9090",
            "[::]:9090",
            "10.0.0.5:9090",
            "acemq-1.internal:9090",
            "[::ffff:127.0.0.1]:9090",
        ] {
            assert_eq!(is_remote(remote), Ok(true), "{remote}");
        }
        assert!(is_remote("127.0.0.1").unwrap_err().contains("HOST:PORT"));
        assert!(is_remote("localhost:http").unwrap_err().contains("port"));
    }

    #[test]
    fn a_remote_address_needs_admin_allow_remote() {
        let refusal = check_listen("0.0.0.0:9090", false).unwrap_err();
        assert!(
            refusal.contains("\"0.0.0.0:9090\"") && refusal.contains("admin_allow_remote = true"),
            "{refusal}"
        );
        assert_eq!(check_listen("0.0.0.0:9090", true), Ok(()));
        assert_eq!(check_listen("127.0.0.1:9090", false), Ok(()));
    }

    #[test]
    fn allowed_hosts_must_look_like_a_host_header() {
        assert_eq!(check_allowed_host("ACEMQ-1.internal:9090"), Ok(()));
        assert_eq!(check_allowed_host("[fd00::1]:9090"), Ok(()));
        for bad in [
            "acemq-1.internal",
            "acemq-1:http",
            "http://acemq-1:9090",
            "acemq-1:9090/x",
            "",
            "a b:1",
            "[fd00::1]",
        ] {
            assert!(check_allowed_host(bad).is_err(), "{bad}");
        }
    }
}
