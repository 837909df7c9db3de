//! The Redis store (`[state] url`): namespaces, done records and claims
//! shared by several hosts.
//!
//! Every operation that writes is one Lua script (`EVALSHA`,
//! loaded on first use and again after a Redis restart), so it is atomic on
//! the server. The connection is made on first use ([`RedisStore::lazy`])
//! or at once ([`RedisStore::connect`]); it is a [`ConnectionManager`],
//! which reconnects by itself after Redis goes away. While it cannot, every
//! call fails with a [`StoreError`] (the input waits); refused credentials
//! drop the connection, so the next call tries afresh.
//!
//! # Keys
//!
//! Everything is under `acemq:`. `{ns}` and `{queue}` are escaped (`%` as
//! `%25`, `:` as `%3A`) so that no namespace or queue name can run into
//! the next part; a state key and an envelope id come last and are kept as
//! they are (any bytes).
//!
//! | Redis key | type | what |
//! |---|---|---|
//! | `acemq:state:{ns}:k:{key}` | hash | `v` the value, `n` its version, `x` its expiry (epoch ms) when it has one, which is also the key's `PEXPIREAT` |
//! | `acemq:state:{ns}:index` | sorted set | every key of the namespace, scored by its expiry in epoch ms (`+inf` for none): which keys to purge |
//! | `acemq:state:{ns}:keys` | sorted set | the same keys, all scored 0: in key (byte) order, for `list` |
//! | `acemq:state:{ns}:sizes` | hash | each key's size in bytes (key plus value) |
//! | `acemq:state:{ns}:usage` | hash | `keys` and `bytes`: the sums over `index` |
//! | `acemq:state:{ns}:version` | string | the namespace's version counter (`INCR`) |
//! | `acemq:state:{ns}:lock:{key}` | string | the reservation token holding the key, with the lease as TTL |
//! | `acemq:done:{queue}:{id}` | string | a done record (the commit's `now_ms`), with the retention as TTL |
//! | `acemq:claim:{queue}:{id}` | string | a claim: its holder's name, with the lease as TTL |
//!
//! # Clocks
//!
//! Expiry of entries is by the host's clock (the `now_ms` each call is
//! given, as for the embedded store): an entry whose `x` is at or before
//! `now_ms` reads as absent, counts as absent for version checks, and is
//! purged (from the sets, the sizes and the usage) by the next commit or
//! [`Backend::usage`] of its namespace. Its `PEXPIREAT` lets Redis free the
//! memory by Redis's clock too. Leases and retention (`PX`) are by
//! Redis's clock: they are durations, so the clocks need not agree.
//!
//! # A commit
//!
//! One script, in this order, and nothing is written unless it gets to the
//! end: a done record of the input → `AlreadyDone`; a write whose
//! `expect` is not the key's live version, or a written key (checked or
//! not) locked by another token than the commit's `reservation` →
//! `Conflict`; expired keys purged; the usage after the writes past
//! `max_keys` or `max_bytes` → `OverQuota` (only when the writes grow that
//! measure, so a namespace over a lowered quota may still shrink); then
//! the writes (each put a new version from the counter; a put replaces the
//! whole entry, its TTL too), the usage, the locks of `reservation` on the
//! written keys deleted, the done record set, the claim deleted if
//! `claim_holder` holds it. With `namespace: None` only the done record and
//! the claim.
//!
//! Purging is done in rounds of [`PURGE_ROUND`] keys: a commit purges one
//! round, and more only while its quota check fails and more are expired,
//! so a mass expiry never stalls Redis in one script.
//!
//! Not for Redis Cluster: a commit's keys are in several hash slots.
//!
//! # TLS
//!
//! A `rediss://` URL is TLS (rustls), checked against the public (Mozilla)
//! roots unless [`TlsFiles::ca_file`] names the CAs to trust instead, and
//! with a client certificate when [`TlsFiles::client`] gives one (Redis's
//! `tls-auth-clients`). The files are read and parsed when the store is
//! made ([`RedisStore::lazy_with_tls`]): one that cannot be is an error
//! naming it and its `[state]` key, not a failure of every later call.

use super::{
    Backend, Claim, Commit, Committed, Entry, InputKey, Reserved, StoreError, Usage, Write,
    over_bytes, over_keys,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script, Value};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::Duration;

/// How many expired keys one purge round removes.
pub const PURGE_ROUND: usize = 1000;

/// How many rounds [`Backend::usage`] purges at most before it answers.
const USAGE_PURGE_ROUNDS: usize = 10;

/// The most keys of the `keys` set one `list` script reads.
const LIST_PAGE: usize = 1000;

/// The longest TTL given to Redis (100 years): a longer `PX` would
/// overflow Redis's clock arithmetic and be refused.
const MAX_TTL_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

/// The Redis store.
pub struct RedisStore {
    /// Boxed: a client is some 300 bytes, and [`super::Store`] holds this
    /// store beside the embedded one.
    client: Box<redis::Client>,
    /// The connection, once one was made: a [`ConnectionManager`] that
    /// reconnects by itself after I/O errors. `None` before the first call
    /// and after a failure it does not recover from by itself (refused
    /// credentials): the next call connects afresh.
    conn: tokio::sync::Mutex<Option<ConnectionManager>>,
    /// The address without the password.
    described: String,
    /// The password, only to scrub it from error texts.
    password: Option<String>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("address", &self.described)
            .finish_non_exhaustive()
    }
}

/// The TLS files of `[state]` (`tls_ca_file`, `tls_cert_file`,
/// `tls_key_file`), paths resolved: none for the public roots and no client
/// certificate. Only for a `rediss://` URL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM file of the CA certificates to trust instead of the public
    /// roots (a private CA).
    pub ca_file: Option<PathBuf>,
    /// A client certificate, for a Redis with `tls-auth-clients yes`.
    pub client: Option<ClientCertFiles>,
}

/// A client certificate and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertFiles {
    /// PEM file of the client certificate (then any intermediates).
    pub cert_file: PathBuf,
    /// PEM file of its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

impl TlsFiles {
    /// Whether any file is given (else the client is Redis's default).
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.client.is_none()
    }

    /// The files' contents, checked: each holds what its key says (PEM
    /// certificates, a private key). The error names the key and the file.
    fn read(&self) -> Result<redis::TlsCertificates, String> {
        let root_cert = match &self.ca_file {
            Some(path) => Some(certificates("state.tls_ca_file", path)?),
            None => None,
        };
        let client_tls = match &self.client {
            Some(client) => {
                let client_cert = certificates("state.tls_cert_file", &client.cert_file)?;
                let client_key = private_key("state.tls_key_file", &client.key_file)?;
                check_pair(client, &client_cert, &client_key)?;
                Some(redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                })
            }
            None => None,
        };
        Ok(redis::TlsCertificates {
            client_tls,
            root_cert,
        })
    }
}

fn read_file(key: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {key} {}: {e}", path.display()))
}

/// A PEM file of one or more certificates, as read.
fn certificates(key: &str, path: &Path) -> Result<Vec<u8>, String> {
    let pem = read_file(key, path)?;
    let count = CertificateDer::pem_slice_iter(&pem)
        .try_fold(0usize, |n, cert| cert.map(|_| n + 1))
        .map_err(|e| format!("{key} {} is not PEM: {e}", path.display()))?;
    if count == 0 {
        return Err(format!(
            "{key} {} holds no certificate (PEM, -----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(pem)
}

/// A PEM file of a private key, as read.
fn private_key(key: &str, path: &Path) -> Result<Vec<u8>, String> {
    let pem = read_file(key, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        format!(
            "{key} {} holds no private key (PEM: PKCS#8, PKCS#1 or SEC1): {e}",
            path.display()
        )
    })?;
    Ok(pem)
}

/// Whether the certificate and key fit together, as rustls will check
/// when the client connects (the same rustls, through lapin's connector):
/// here, so that a key of another certificate is refused at open, not at
/// every call.
fn check_pair(client: &ClientCertFiles, cert: &[u8], key: &[u8]) -> Result<(), String> {
    let fits = || -> Result<(), String> {
        let chain = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| e.to_string())?;
        lapin::tcp::RustlsConnectorConfig::new_with_webpki_root_certs()
            .connector_with_single_cert(chain, key)
            .map(drop)
            .map_err(|e| e.to_string())
    };
    fits().map_err(|e| {
        format!(
            "state.tls_cert_file {} and state.tls_key_file {} do not fit together: {e}",
            client.cert_file.display(),
            client.key_file.display()
        )
    })
}

/// A checked Redis URL: what [`RedisStore::connect`] accepts.
#[derive(Clone)]
pub struct RedisUrl {
    url: String,
    described: String,
    password: Option<String>,
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.described)
    }
}

impl RedisUrl {
    /// Checks `url`: `redis://` or `rediss://` (TLS), `user:password@` or
    /// `:password@`, a host, a port (6379 when none), a database number as
    /// the path (0 when none), no query and no fragment. The error says
    /// what is wrong and never contains the password.
    pub fn parse(url: &str) -> Result<RedisUrl, StoreError> {
        let invalid = |store: &str, what: String| StoreError {
            store: store.to_owned(),
            reason: format!("has an invalid URL: {what}"),
        };
        // The url crate's errors never quote the input.
        let parsed = url::Url::parse(url.trim()).map_err(|e| {
            let hint = if url.contains("://") {
                ""
            } else {
                "; write it as redis://host:6379/0 (or rediss:// for TLS)"
            };
            invalid("Redis", format!("it does not parse ({e}){hint}"))
        })?;
        let scheme = parsed.scheme();
        if scheme != "redis" && scheme != "rediss" {
            return Err(invalid(
                "Redis",
                format!("the scheme is \"{scheme}\"; use redis:// or rediss:// (TLS)"),
            ));
        }
        let host = match parsed.host_str() {
            Some(host) if !host.is_empty() => host,
            _ => return Err(invalid("Redis", "it names no host".to_owned())),
        };
        let port = parsed.port().unwrap_or(6379);
        let user = percent_decoded(parsed.username())
            .ok_or_else(|| invalid("Redis", "the user name is not UTF-8".to_owned()))?;
        let password = match parsed.password() {
            Some(p) => Some(
                percent_decoded(p)
                    .ok_or_else(|| invalid("Redis", "the password is not UTF-8".to_owned()))?,
            ),
            None => None,
        };
        let user_part = if user.is_empty() {
            String::new()
        } else {
            format!("{}@", parsed.username())
        };
        let path = parsed.path();
        let db_text = path.trim_start_matches('/');
        let db: u32 = if db_text.is_empty() {
            0
        } else {
            // Described without a database: the path is what is wrong.
            let store = format!("{scheme}://{user_part}{host}:{port}");
            db_text.parse().map_err(|_| {
                invalid(
                    &store,
                    format!("the path \"{path}\" is not a database number (such as /0)"),
                )
            })?
        };
        let described = format!("{scheme}://{user_part}{host}:{port}/{db}");
        if parsed.query().is_some() {
            return Err(invalid(
                &described,
                "it has a query (?...); none is supported".to_owned(),
            ));
        }
        if parsed.fragment().is_some() {
            return Err(invalid(
                &described,
                "it has a fragment (#...); none is supported".to_owned(),
            ));
        }
        Ok(RedisUrl {
            url: url.trim().to_owned(),
            described,
            password: password.filter(|p| !p.is_empty()),
        })
    }

    /// The address without the password, e.g. `redis://127.0.0.1:6379/0`
    /// (with the user name when there is one).
    pub fn describe(&self) -> &str {
        &self.described
    }

    /// Whether it is a `rediss://` (TLS) URL.
    pub fn is_tls(&self) -> bool {
        self.described.starts_with("rediss://")
    }
}

fn percent_decoded(text: &str) -> Option<String> {
    // `url` leaves userinfo percent-encoded; Redis clients decode it.
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex_digit(bytes[i + 1]), hex_digit(bytes[i + 2]))
        {
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn hex_digit(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

impl RedisStore {
    /// Checks `url` (see [`RedisUrl::parse`]) and connects. Fails when the
    /// URL is invalid (the error says what is wrong) or when Redis cannot be
    /// reached or refuses the credentials (the caller waits and retries).
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        Self::connect_to(&RedisUrl::parse(url)?).await
    }

    /// [`RedisStore::connect`] with the TLS files of `tls` (see
    /// [`RedisStore::lazy_with_tls`]).
    pub async fn connect_with_tls(url: &str, tls: &TlsFiles) -> Result<RedisStore, StoreError> {
        let store = Self::lazy_with_tls(url, tls)?;
        store.connection().await?;
        Ok(store)
    }

    /// [`RedisStore::connect`] to an already checked URL.
    pub async fn connect_to(url: &RedisUrl) -> Result<RedisStore, StoreError> {
        let store = Self::lazy_to(url)?;
        store.connection().await?;
        Ok(store)
    }

    /// Checks `url` (see [`RedisUrl::parse`]) without connecting: the
    /// store connects on first use, and again on the next use after any
    /// failure (while it cannot, each call fails with a [`StoreError`]).
    /// Needs no runtime.
    pub fn lazy(url: &str) -> Result<RedisStore, StoreError> {
        Self::lazy_to(&RedisUrl::parse(url)?)
    }

    /// [`RedisStore::lazy`] with the TLS files of `tls` (see [`TlsFiles`]),
    /// read and checked now: a file that cannot be read, or does not hold
    /// what its key says, is an error naming the key and the file. Files
    /// are refused for a `redis://` (plain) URL.
    pub fn lazy_with_tls(url: &str, tls: &TlsFiles) -> Result<RedisStore, StoreError> {
        Self::lazy_to_with_tls(&RedisUrl::parse(url)?, tls)
    }

    /// [`RedisStore::lazy`] of an already checked URL.
    pub fn lazy_to(url: &RedisUrl) -> Result<RedisStore, StoreError> {
        Self::lazy_to_with_tls(url, &TlsFiles::default())
    }

    /// [`RedisStore::lazy_with_tls`] of an already checked URL.
    pub fn lazy_to_with_tls(url: &RedisUrl, tls: &TlsFiles) -> Result<RedisStore, StoreError> {
        let refused = |reason: String| StoreError {
            store: url.described.clone(),
            reason,
        };
        let scrubbed = |e: RedisError| scrub(&e.to_string(), url.password.as_deref());
        let client = if tls.is_empty() {
            redis::Client::open(url.url.as_str())
                .map_err(|e| refused(format!("has an invalid URL: {}", scrubbed(e))))?
        } else if !url.is_tls() {
            return Err(refused(
                "is not TLS (redis://): TLS files are for a rediss:// URL".to_owned(),
            ));
        } else {
            let certificates = tls.read().map_err(refused)?;
            // The files parse (checked above); what is left is the URL, or
            // a certificate rustls cannot take as a trust anchor.
            redis::Client::build_with_tls(url.url.as_str(), certificates).map_err(|e| {
                refused(format!(
                    "cannot be set up with its URL and TLS files: {}",
                    scrubbed(e)
                ))
            })?
        };
        Ok(RedisStore {
            client: Box::new(client),
            conn: tokio::sync::Mutex::new(None),
            described: url.described.clone(),
            password: url.password.clone(),
        })
    }

    /// The connection, made now if there is none.
    async fn connection(&self) -> Result<ConnectionManager, StoreError> {
        let mut conn = self.conn.lock().await;
        if let Some(conn) = conn.as_ref() {
            return Ok(conn.clone());
        }
        // Few retries inside the client: the caller's own retry loop
        // (inputs wait and come back) is the one that waits long.
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(100))
            .set_max_delay(Duration::from_secs(1))
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(10)));
        let made = ConnectionManager::new_with_config((*self.client).clone(), config)
            .await
            .map_err(|e| self.error("connecting", &e))?;
        *conn = Some(made.clone());
        Ok(made)
    }

    /// The error of a call that failed with `e`. A connection whose
    /// credentials were refused is dropped (the manager would keep failing
    /// with it): the next call connects afresh.
    async fn failed(&self, doing: &str, e: &RedisError) -> StoreError {
        if refused_credentials(e) {
            *self.conn.lock().await = None;
        }
        self.error(doing, e)
    }

    fn error(&self, doing: &str, e: &RedisError) -> StoreError {
        StoreError {
            store: self.described.clone(),
            reason: reason_of(doing, e, self.password.as_deref()),
        }
    }

    fn malformed(&self, what: impl std::fmt::Display) -> StoreError {
        StoreError {
            store: self.described.clone(),
            reason: format!("answered in a way this host does not understand: {what}"),
        }
    }

    async fn run(
        &self,
        doing: &str,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<Value, StoreError> {
        let mut conn = self.connection().await?;
        match invocation.invoke_async(&mut conn).await {
            Ok(value) => Ok(value),
            Err(e) => Err(self.failed(doing, &e).await),
        }
    }

    async fn query<T: redis::FromRedisValue>(
        &self,
        doing: &str,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        let mut conn = self.connection().await?;
        match cmd.query_async(&mut conn).await {
            Ok(value) => Ok(value),
            Err(e) => Err(self.failed(doing, &e).await),
        }
    }
}

fn refused_credentials(e: &RedisError) -> bool {
    let text = e.to_string();
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || text.contains("WRONGPASS")
        || text.contains("NOAUTH")
}

/// Whether the TLS handshake failed as `text` says (rustls's words), and
/// what to set then, if a setting is the likely cause.
fn tls_refusal_hint(text: &str) -> Option<&'static str> {
    /// The alerts a server sends about the client's certificate.
    const CLIENT_CERTIFICATE_ALERTS: [&str; 5] = [
        "CertificateRequired",
        "UnknownCA",
        "BadCertificate",
        "CertificateUnknown",
        "AccessDenied",
    ];
    if text.contains("invalid peer certificate") {
        Some(
            "Redis's certificate is not trusted: set state.tls_ca_file to the CA that signed it (without it, only the public roots are trusted)",
        )
    } else if let Some((_, alert)) = text.split_once("received fatal alert: ") {
        if CLIENT_CERTIFICATE_ALERTS
            .iter()
            .any(|name| alert.starts_with(name))
        {
            Some(
                "Redis refused this host's certificate or its lack of one: a Redis with tls-auth-clients needs state.tls_cert_file and state.tls_key_file, of a certificate its tls-ca-cert-file signed",
            )
        } else {
            Some("the TLS handshake failed on Redis's side (see Redis's log)")
        }
    } else {
        None
    }
}

fn reason_of(doing: &str, e: &RedisError, password: Option<&str>) -> String {
    let text = scrub(&e.to_string(), password);
    if refused_credentials(e) {
        format!("refused the credentials ({doing}): {text}")
    } else if let Some(hint) = tls_refusal_hint(&text) {
        format!("refused the TLS handshake ({doing}): {text}; {hint}")
    } else if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_connection_dropped()
    {
        format!("cannot be reached ({doing}): {text}")
    } else {
        format!("failed ({doing}): {text}")
    }
}

/// `text` with every occurrence of the password masked.
fn scrub(text: &str, password: Option<&str>) -> String {
    match password {
        Some(p) if !p.is_empty() => text.replace(p, "****"),
        _ => text.to_owned(),
    }
}

// ---- Redis keys ----

/// `name` with `%` and `:` escaped, so that it cannot run into the next
/// part of a key.
fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            ':' => out.push_str("%3A"),
            c => out.push(c),
        }
    }
    out
}

/// `acemq:state:{ns}:`: the prefix of every key of a namespace.
fn ns_prefix(namespace: &str) -> Vec<u8> {
    format!("acemq:state:{}:", escape(namespace)).into_bytes()
}

/// `acemq:state:{ns}:k:{key}`: an entry (the scripts build the same).
fn entry_key(namespace: &str, key: &[u8]) -> Vec<u8> {
    let mut out = ns_prefix(namespace);
    out.extend_from_slice(b"k:");
    out.extend_from_slice(key);
    out
}

/// `acemq:done:{queue}:{id}`.
fn done_key(input: &InputKey) -> Vec<u8> {
    format!("acemq:done:{}:{}", escape(&input.queue), input.id).into_bytes()
}

/// `acemq:claim:{queue}:{id}`.
fn claim_key(input: &InputKey) -> Vec<u8> {
    format!("acemq:claim:{}:{}", escape(&input.queue), input.id).into_bytes()
}

/// The `ZRANGEBYLEX` bounds of the keys that start with `prefix`.
fn lex_range(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    if prefix.is_empty() {
        return (b"-".to_vec(), b"+".to_vec());
    }
    let mut min = b"[".to_vec();
    min.extend_from_slice(prefix);
    // The first byte string after every string starting with `prefix`:
    // drop trailing 0xff bytes, then add one to the last.
    let mut succ = prefix.to_vec();
    while succ.last() == Some(&0xff) {
        succ.pop();
    }
    let max = match succ.last_mut() {
        Some(last) => {
            *last += 1;
            let mut max = b"(".to_vec();
            max.extend_from_slice(&succ);
            max
        }
        None => b"+".to_vec(),
    };
    (min, max)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, MAX_TTL_MS)
}

// ---- scripts ----

/// Helpers every script starts with.
const COMMON: &str = r#"
local function fmt(n) return string.format('%d', n) end
-- The version of `key` live at `now` (a number), '0' (ABSENT) for none.
local function version_of(p, key, now)
  local e = redis.call('HMGET', p .. 'k:' .. key, 'n', 'x')
  if not e[1] then return '0' end
  if e[2] and tonumber(e[2]) <= now then return '0' end
  return e[1]
end
-- Removes up to `cap` keys of the namespace expired at `now_s`; how many.
local function purge(p, now_s, cap)
  local expired = redis.call('ZRANGEBYSCORE', p .. 'index', '-inf', now_s, 'LIMIT', 0, cap)
  if #expired == 0 then return 0 end
  local sizes = redis.call('HMGET', p .. 'sizes', unpack(expired))
  local bytes = 0
  for i, key in ipairs(expired) do
    bytes = bytes + (tonumber(sizes[i]) or 0)
    redis.call('DEL', p .. 'k:' .. key)
  end
  redis.call('ZREM', p .. 'index', unpack(expired))
  redis.call('ZREM', p .. 'keys', unpack(expired))
  redis.call('HDEL', p .. 'sizes', unpack(expired))
  redis.call('HINCRBY', p .. 'usage', 'keys', fmt(-#expired))
  redis.call('HINCRBY', p .. 'usage', 'bytes', fmt(-bytes))
  return #expired
end
"#;

/// ARGV: prefix, token, lease ms, now ms, then (key, version) pairs.
const RESERVE: &str = r#"
local p, token, lease, now = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
for i = 5, #ARGV, 2 do
  local key = ARGV[i]
  if version_of(p, key, now) ~= ARGV[i + 1] then return {'conflict', key} end
  local holder = redis.call('GET', p .. 'lock:' .. key)
  if holder and holder ~= token then return {'conflict', key} end
end
for i = 5, #ARGV, 2 do
  redis.call('SET', p .. 'lock:' .. ARGV[i], token, 'PX', lease)
end
return {'held'}
"#;

/// ARGV: prefix, token, then keys.
const RELEASE_RESERVATION: &str = r#"
local p, token = ARGV[1], ARGV[2]
for i = 3, #ARGV do
  local lock = p .. 'lock:' .. ARGV[i]
  if redis.call('GET', lock) == token then redis.call('DEL', lock) end
end
return 0
"#;

/// KEYS: done, claim. ARGV: now ms, retention ms, has holder, holder, has
/// reservation, token, prefix ('' for no namespace), max keys, max bytes,
/// purge round, then 5 per write: key, 'p' or 'd', expected version ('' for
/// none), value, expiry ('' for none).
const COMMIT: &str = r#"
local now_s, retention = ARGV[1], ARGV[2]
local now = tonumber(now_s)
local has_holder, holder = ARGV[3] == '1', ARGV[4]
local has_token, token = ARGV[5] == '1', ARGV[6]
local p = ARGV[7]
local max_keys, max_bytes, cap = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local W = 11
if redis.call('EXISTS', KEYS[1]) == 1 then return {'done'} end
if p ~= '' then
  for i = W, #ARGV, 5 do
    local key, expect = ARGV[i], ARGV[i + 2]
    if expect ~= '' and version_of(p, key, now) ~= expect then return {'conflict', key} end
    local lock = redis.call('GET', p .. 'lock:' .. key)
    if lock and not (has_token and lock == token) then return {'conflict', key} end
  end
  -- Usage before and after the writes, applied in order.
  local function plan()
    local u = redis.call('HMGET', p .. 'usage', 'keys', 'bytes')
    local bk, bb = tonumber(u[1]) or 0, tonumber(u[2]) or 0
    local k, b = bk, bb
    local seen = {}
    for i = W, #ARGV, 5 do
      local key, op = ARGV[i], ARGV[i + 1]
      local old = seen[key]
      if old == nil then
        local s = redis.call('HGET', p .. 'sizes', key)
        old = s and tonumber(s) or false
      end
      if old then k = k - 1; b = b - old end
      if op == 'p' then
        local size = #key + #ARGV[i + 3]
        k = k + 1; b = b + size; seen[key] = size
      else
        seen[key] = false
      end
    end
    return bk, bb, k, b
  end
  local bk, bb, k, b
  while true do
    local purged = purge(p, now_s, cap)
    bk, bb, k, b = plan()
    local over = (k > max_keys and k > bk) or (b > max_bytes and b > bb)
    if not over or purged < cap then break end
  end
  -- A namespace already over a (lowered) quota may still shrink.
  if k > max_keys and k > bk then return {'quota', 'keys', k} end
  if b > max_bytes and b > bb then return {'quota', 'bytes', b} end
  for i = W, #ARGV, 5 do
    local key, op, value, exp = ARGV[i], ARGV[i + 1], ARGV[i + 3], ARGV[i + 4]
    local entry = p .. 'k:' .. key
    redis.call('DEL', entry)
    if op == 'p' then
      local version = fmt(redis.call('INCR', p .. 'version'))
      if exp ~= '' then
        redis.call('HSET', entry, 'v', value, 'n', version, 'x', exp)
        redis.call('PEXPIREAT', entry, exp)
        redis.call('ZADD', p .. 'index', exp, key)
      else
        redis.call('HSET', entry, 'v', value, 'n', version)
        redis.call('ZADD', p .. 'index', '+inf', key)
      end
      redis.call('ZADD', p .. 'keys', 0, key)
      redis.call('HSET', p .. 'sizes', key, fmt(#key + #value))
    else
      redis.call('ZREM', p .. 'index', key)
      redis.call('ZREM', p .. 'keys', key)
      redis.call('HDEL', p .. 'sizes', key)
    end
    if has_token then
      local lock = p .. 'lock:' .. key
      if redis.call('GET', lock) == token then redis.call('DEL', lock) end
    end
  end
  redis.call('HSET', p .. 'usage', 'keys', fmt(k), 'bytes', fmt(b))
end
redis.call('SET', KEYS[1], now_s, 'PX', retention)
if has_holder and redis.call('GET', KEYS[2]) == holder then redis.call('DEL', KEYS[2]) end
return {'applied'}
"#;

/// KEYS: done, claim. ARGV: holder, lease ms.
const CLAIM: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return {'done'} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {'taken'} end
local holder = redis.call('GET', KEYS[2])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return {'taken'}
end
return {'held', holder, redis.call('PTTL', KEYS[2])}
"#;

/// KEYS: claim. ARGV: holder.
const RELEASE_CLAIM: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"#;

/// ARGV: prefix, key, now ms. 1 when the key was there (live).
const DELETE_NOW: &str = r#"
local p, key, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local live = version_of(p, key, now) ~= '0'
local size = redis.call('HGET', p .. 'sizes', key)
redis.call('DEL', p .. 'k:' .. key)
if size then
  redis.call('ZREM', p .. 'index', key)
  redis.call('ZREM', p .. 'keys', key)
  redis.call('HDEL', p .. 'sizes', key)
  redis.call('HINCRBY', p .. 'usage', 'keys', -1)
  redis.call('HINCRBY', p .. 'usage', 'bytes', fmt(-tonumber(size)))
end
if live then return 1 else return 0 end
"#;

/// ARGV: prefix, now ms, purge round, rounds. {keys, bytes}.
const USAGE: &str = r#"
local p, now_s, cap, rounds = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
for _ = 1, rounds do
  if purge(p, now_s, cap) < cap then break end
end
local u = redis.call('HMGET', p .. 'usage', 'keys', 'bytes')
return {tonumber(u[1]) or 0, tonumber(u[2]) or 0}
"#;

/// ARGV: prefix, min, max, count, now ms. {members read, last member read,
/// {key, value, version, expiry or '', ...} of the live ones}.
const LIST: &str = r#"
local p, now = ARGV[1], tonumber(ARGV[5])
local members = redis.call('ZRANGEBYLEX', p .. 'keys', ARGV[2], ARGV[3], 'LIMIT', 0, ARGV[4])
local out = {}
for _, key in ipairs(members) do
  local e = redis.call('HMGET', p .. 'k:' .. key, 'v', 'n', 'x')
  if e[1] and not (e[3] and tonumber(e[3]) <= now) then
    out[#out + 1] = key
    out[#out + 1] = e[1]
    out[#out + 1] = e[2]
    out[#out + 1] = e[3] or ''
  end
end
return {#members, members[#members] or '', out}
"#;

struct Scripts {
    reserve: Script,
    release_reservation: Script,
    commit: Script,
    claim: Script,
    release_claim: Script,
    delete_now: Script,
    usage: Script,
    list: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let script = |body: &str| Script::new(&format!("{COMMON}{body}"));
    Scripts {
        reserve: script(RESERVE),
        release_reservation: script(RELEASE_RESERVATION),
        commit: script(COMMIT),
        claim: script(CLAIM),
        release_claim: script(RELEASE_CLAIM),
        delete_now: script(DELETE_NOW),
        usage: script(USAGE),
        list: script(LIST),
    }
});

// ---- replies ----

fn bytes_of(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn int_of(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        other => std::str::from_utf8(bytes_of(other)?).ok()?.parse().ok(),
    }
}

fn u64_of(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// A script's `{tag, ...}` reply.
fn tagged(value: &Value) -> Option<(&[u8], &[Value])> {
    match value {
        Value::Array(items) => {
            let (tag, rest) = items.split_first()?;
            Some((bytes_of(tag)?, rest))
        }
        _ => None,
    }
}

/// The entry an `HMGET v n x` answered, if any.
fn entry_of(
    value: Option<Vec<u8>>,
    version: Option<Vec<u8>>,
    expiry: Option<Vec<u8>>,
) -> Result<Option<Entry>, String> {
    let (Some(value), Some(version)) = (value, version) else {
        return Ok(None);
    };
    let version = u64_of(&version).ok_or("an entry's version is not a number")?;
    let expires_at_ms = match expiry {
        Some(x) if !x.is_empty() => Some(u64_of(&x).ok_or("an entry's expiry is not a number")?),
        _ => None,
    };
    Ok(Some(Entry {
        value,
        version,
        expires_at_ms,
    }))
}

impl Backend for RedisStore {
    fn describe(&self) -> String {
        self.described.clone()
    }

    async fn get(
        &self,
        namespace: &str,
        key: &[u8],
        now_ms: u64,
    ) -> Result<Option<Entry>, StoreError> {
        let [value, version, expiry]: [Option<Vec<u8>>; 3] = self
            .query(
                "reading a key",
                redis::cmd("HMGET")
                    .arg(entry_key(namespace, key))
                    .arg("v")
                    .arg("n")
                    .arg("x"),
            )
            .await?;
        let entry = entry_of(value, version, expiry).map_err(|e| self.malformed(e))?;
        Ok(entry.filter(|e| e.live_at(now_ms)))
    }

    async fn reserve(
        &self,
        namespace: &str,
        checks: &[(Vec<u8>, u64)],
        token: &str,
        lease: Duration,
        now_ms: u64,
    ) -> Result<Reserved, StoreError> {
        if checks.is_empty() {
            return Ok(Reserved::Held);
        }
        let mut call = SCRIPTS.reserve.prepare_invoke();
        call.arg(ns_prefix(namespace))
            .arg(token)
            .arg(millis(lease))
            .arg(now_ms);
        for (key, version) in checks {
            call.arg(key.as_slice()).arg(*version);
        }
        let reply = self.run("reserving keys", &call).await?;
        match tagged(&reply) {
            Some((b"held", _)) => Ok(Reserved::Held),
            Some((b"conflict", [key])) => Ok(Reserved::Conflict {
                key: bytes_of(key).unwrap_or_default().to_vec(),
            }),
            _ => Err(self.malformed(format!("reserve: {reply:?}"))),
        }
    }

    async fn release_reservation(
        &self,
        namespace: &str,
        keys: &[Vec<u8>],
        token: &str,
    ) -> Result<(), StoreError> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut call = SCRIPTS.release_reservation.prepare_invoke();
        call.arg(ns_prefix(namespace)).arg(token);
        for key in keys {
            call.arg(key.as_slice());
        }
        self.run("releasing a reservation", &call).await?;
        Ok(())
    }

    async fn commit(&self, commit: &Commit) -> Result<Committed, StoreError> {
        let mut call = SCRIPTS.commit.prepare_invoke();
        call.key(done_key(&commit.done))
            .key(claim_key(&commit.done))
            .arg(commit.now_ms)
            .arg(millis(commit.retention))
            .arg(if commit.claim_holder.is_some() {
                "1"
            } else {
                "0"
            })
            .arg(commit.claim_holder.as_deref().unwrap_or(""))
            .arg(if commit.reservation.is_some() {
                "1"
            } else {
                "0"
            })
            .arg(commit.reservation.as_deref().unwrap_or(""))
            .arg(
                commit
                    .namespace
                    .as_deref()
                    .map(ns_prefix)
                    .unwrap_or_default(),
            )
            .arg(commit.quota.max_keys)
            .arg(commit.quota.max_bytes)
            .arg(PURGE_ROUND);
        if commit.namespace.is_some() {
            for write in &commit.writes {
                call.arg(write.key.as_slice());
                match &write.write {
                    Write::Put {
                        value,
                        expires_at_ms,
                    } => call
                        .arg("p")
                        .arg(write.expect.map(|v| v.to_string()).unwrap_or_default())
                        .arg(value.as_slice())
                        .arg(expires_at_ms.map(|x| x.to_string()).unwrap_or_default()),
                    Write::Delete => call
                        .arg("d")
                        .arg(write.expect.map(|v| v.to_string()).unwrap_or_default())
                        .arg("")
                        .arg(""),
                };
            }
        }
        let reply = self.run("committing an input", &call).await?;
        match tagged(&reply) {
            Some((b"applied", _)) => Ok(Committed::Applied),
            Some((b"done", _)) => Ok(Committed::AlreadyDone),
            Some((b"conflict", [key])) => Ok(Committed::Conflict {
                key: bytes_of(key).unwrap_or_default().to_vec(),
            }),
            Some((b"quota", [which, count])) => {
                let namespace = commit.namespace.as_deref().unwrap_or_default();
                let count = int_of(count).unwrap_or_default();
                let reason = match bytes_of(which) {
                    Some(b"keys") => over_keys(namespace, count, commit.quota.max_keys),
                    _ => over_bytes(namespace, count, commit.quota.max_bytes),
                };
                Ok(Committed::OverQuota { reason })
            }
            _ => Err(self.malformed(format!("commit: {reply:?}"))),
        }
    }

    async fn is_done(&self, input: &InputKey, _now_ms: u64) -> Result<bool, StoreError> {
        let exists: bool = self
            .query(
                "reading a done record",
                redis::cmd("EXISTS").arg(done_key(input)),
            )
            .await?;
        Ok(exists)
    }

    async fn claim(
        &self,
        input: &InputKey,
        holder: &str,
        lease: Duration,
        _now_ms: u64,
    ) -> Result<Claim, StoreError> {
        let mut call = SCRIPTS.claim.prepare_invoke();
        call.key(done_key(input))
            .key(claim_key(input))
            .arg(holder)
            .arg(millis(lease));
        let reply = self.run("claiming an input", &call).await?;
        match tagged(&reply) {
            Some((b"taken", _)) => Ok(Claim::Taken),
            Some((b"done", _)) => Ok(Claim::Done),
            Some((b"held", [who, pttl])) => Ok(Claim::HeldElsewhere {
                holder: String::from_utf8_lossy(bytes_of(who).unwrap_or_default()).into_owned(),
                expires_in: Duration::from_millis(
                    int_of(pttl).unwrap_or_default().max(0).unsigned_abs(),
                ),
            }),
            _ => Err(self.malformed(format!("claim: {reply:?}"))),
        }
    }

    async fn release_claim(&self, input: &InputKey, holder: &str) -> Result<(), StoreError> {
        let mut call = SCRIPTS.release_claim.prepare_invoke();
        call.key(claim_key(input)).arg(holder);
        self.run("releasing a claim", &call).await?;
        Ok(())
    }

    async fn list(
        &self,
        namespace: &str,
        prefix: &[u8],
        limit: usize,
        now_ms: u64,
    ) -> Result<Vec<(Vec<u8>, Entry)>, StoreError> {
        let mut found = Vec::new();
        let (mut min, max) = lex_range(prefix);
        let ns = ns_prefix(namespace);
        while found.len() < limit {
            let count = (limit - found.len()).min(LIST_PAGE);
            let mut call = SCRIPTS.list.prepare_invoke();
            call.arg(ns.as_slice())
                .arg(min.as_slice())
                .arg(max.as_slice())
                .arg(count)
                .arg(now_ms);
            let reply = self.run("listing keys", &call).await?;
            let Value::Array(parts) = &reply else {
                return Err(self.malformed(format!("list: {reply:?}")));
            };
            let (Some(read), Some(last), Some(Value::Array(entries))) = (
                parts.first().and_then(int_of),
                parts.get(1).and_then(bytes_of),
                parts.get(2),
            ) else {
                return Err(self.malformed(format!("list: {reply:?}")));
            };
            for quad in entries.chunks(4) {
                let [key, value, version, expiry] = quad else {
                    return Err(self.malformed("list: an entry of fewer than 4 parts"));
                };
                let field = |v: &Value| bytes_of(v).map(<[u8]>::to_vec);
                let entry = entry_of(field(value), field(version), field(expiry))
                    .map_err(|e| self.malformed(e))?;
                if let (Some(key), Some(entry)) = (bytes_of(key), entry) {
                    found.push((key.to_vec(), entry));
                }
            }
            if usize::try_from(read).unwrap_or(0) < count {
                break;
            }
            min = b"(".to_vec();
            min.extend_from_slice(last);
        }
        found.truncate(limit);
        Ok(found)
    }

    async fn delete_now(
        &self,
        namespace: &str,
        key: &[u8],
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let mut call = SCRIPTS.delete_now.prepare_invoke();
        call.arg(ns_prefix(namespace)).arg(key).arg(now_ms);
        let reply = self.run("deleting a key", &call).await?;
        match int_of(&reply) {
            Some(n) => Ok(n == 1),
            None => Err(self.malformed(format!("delete: {reply:?}"))),
        }
    }

    async fn usage(&self, namespace: &str, now_ms: u64) -> Result<Usage, StoreError> {
        let mut call = SCRIPTS.usage.prepare_invoke();
        call.arg(ns_prefix(namespace))
            .arg(now_ms)
            .arg(PURGE_ROUND)
            .arg(USAGE_PURGE_ROUNDS);
        let reply = self.run("reading the usage", &call).await?;
        match &reply {
            Value::Array(parts) => match (
                parts.first().and_then(int_of),
                parts.get(1).and_then(int_of),
            ) {
                (Some(keys), Some(bytes)) => Ok(Usage {
                    keys: keys.max(0).unsigned_abs(),
                    bytes: bytes.max(0).unsigned_abs(),
                }),
                _ => Err(self.malformed(format!("usage: {reply:?}"))),
            },
            _ => Err(self.malformed(format!("usage: {reply:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_the_address_without_the_password() {
        let cases = [
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            ("redis://127.0.0.1", "redis://127.0.0.1:6379/0"),
            ("redis://:s3cret@10.0.0.1:6380/2", "redis://10.0.0.1:6380/2"),
            (
                "rediss://acemq:s3cret@redis.example:6380/1",
                "rediss://acemq@redis.example:6380/1",
            ),
            ("redis://[::1]:7000/", "redis://[::1]:7000/0"),
        ];
        for (url, described) in cases {
            let parsed = RedisUrl::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(parsed.describe(), described, "{url}");
            assert!(!format!("{parsed:?}").contains("s3cret"));
        }
    }

    #[test]
    fn decodes_the_password_for_scrubbing() {
        let parsed = RedisUrl::parse("redis://u:p%40ss%3Aword@h/0").unwrap();
        assert_eq!(parsed.password.as_deref(), Some("p@ss:word"));
        assert_eq!(parsed.describe(), "redis://u@h:6379/0");
        assert_eq!(
            scrub("WRONGPASS p@ss:word is wrong", parsed.password.as_deref()),
            "WRONGPASS **** is wrong"
        );
    }

    #[test]
    fn a_bad_url_says_what_is_wrong_without_the_password() {
        let cases = [
            ("not a url", "does not parse"),
            (
                "http://h:6379/0",
                "the scheme is \"http\"; use redis:// or rediss://",
            ),
            (
                "redis://:s3cret@h/zero",
                "the path \"/zero\" is not a database number",
            ),
            ("redis://:s3cret@h/0?protocol=resp3", "it has a query"),
            ("rediss://:s3cret@h/0#insecure", "it has a fragment"),
            ("redis://:s3cret@h:99999/0", "does not parse"),
        ];
        for (url, expected) in cases {
            let error = RedisUrl::parse(url).expect_err(url).to_string();
            assert!(error.contains(expected), "{url}: {error}");
            assert!(error.contains("has an invalid URL"), "{url}: {error}");
            assert!(!error.contains("s3cret"), "{url}: {error}");
        }
        let error = RedisUrl::parse("redis://:s3cret@h/zero").unwrap_err();
        assert_eq!(error.store, "redis://h:6379");
    }

    #[test]
    fn keys_are_bytes_and_names_cannot_run_into_the_next_part() {
        assert_eq!(
            entry_key("orders", b"\xff\x00a:b"),
            b"acemq:state:orders:k:\xff\x00a:b".to_vec()
        );
        // Without escaping, these two would be the same Redis key.
        assert_ne!(entry_key("a", b"b:k:c"), entry_key("a:k:b", b"c"));
        assert_eq!(ns_prefix("a:k%b"), b"acemq:state:a%3Ak%25b:".to_vec());
        let input = |queue: &str, id: &str| InputKey {
            queue: queue.into(),
            id: id.into(),
        };
        assert_eq!(
            done_key(&input("orders.new", "id-1")),
            b"acemq:done:orders.new:id-1"
        );
        assert_eq!(claim_key(&input("q", "x:y")), b"acemq:claim:q:x:y");
        assert_ne!(done_key(&input("a:b", "c")), done_key(&input("a", "b:c")));
    }

    #[test]
    fn tls_files_that_cannot_be_used_are_named_with_their_key() {
        let dir = tempfile::tempdir().unwrap();
        let not_pem = dir.path().join("notes.txt");
        std::fs::write(&not_pem, "not a certificate\n").unwrap();
        let missing = dir.path().join("missing.pem");
        let url = "rediss://:s3cret@127.0.0.1:6380/0";
        let refusal = |tls: TlsFiles| {
            let error = RedisStore::lazy_with_tls(url, &tls).unwrap_err();
            assert_eq!(error.store, "rediss://127.0.0.1:6380/0");
            let text = error.to_string();
            assert!(!text.contains("s3cret"), "{text}");
            text
        };
        let text = refusal(TlsFiles {
            ca_file: Some(missing.clone()),
            client: None,
        });
        assert!(
            text.contains(&format!(
                "cannot read state.tls_ca_file {}",
                missing.display()
            )),
            "{text}"
        );
        let text = refusal(TlsFiles {
            ca_file: Some(not_pem.clone()),
            client: None,
        });
        assert!(
            text.contains(&format!(
                "state.tls_ca_file {} holds no certificate",
                not_pem.display()
            )),
            "{text}"
        );
        let text = refusal(TlsFiles {
            ca_file: None,
            client: Some(ClientCertFiles {
                cert_file: not_pem.clone(),
                key_file: not_pem.clone(),
            }),
        });
        assert!(
            text.contains(&format!("state.tls_cert_file {}", not_pem.display())),
            "{text}"
        );
        // A plain URL takes no TLS files.
        let error = RedisStore::lazy_with_tls(
            "redis://127.0.0.1/0",
            &TlsFiles {
                ca_file: Some(not_pem),
                client: None,
            },
        )
        .unwrap_err();
        assert!(error.to_string().contains("is not TLS"), "{error}");
        // No files: as `lazy`, for either scheme.
        RedisStore::lazy_with_tls(url, &TlsFiles::default()).unwrap();
    }

    #[test]
    fn tls_refusals_say_what_to_set() {
        let ca = tls_refusal_hint("invalid peer certificate: UnknownIssuer").unwrap();
        assert!(ca.contains("set state.tls_ca_file"), "{ca}");
        for alert in ["CertificateRequired", "UnknownCA", "BadCertificate"] {
            let hint = tls_refusal_hint(&format!("received fatal alert: {alert}")).unwrap();
            assert!(hint.contains("state.tls_cert_file"), "{alert}: {hint}");
        }
        let other = tls_refusal_hint("received fatal alert: ProtocolVersion").unwrap();
        assert!(!other.contains("tls_cert_file"), "{other}");
        assert_eq!(tls_refusal_hint("Connection refused (os error 111)"), None);
    }

    #[test]
    fn lex_ranges_cover_exactly_the_prefix() {
        assert_eq!(lex_range(b""), (b"-".to_vec(), b"+".to_vec()));
        assert_eq!(lex_range(b"ab"), (b"[ab".to_vec(), b"(ac".to_vec()));
        assert_eq!(
            lex_range(b"a\xff\xff"),
            (b"[a\xff\xff".to_vec(), b"(b".to_vec())
        );
        assert_eq!(lex_range(b"\xff"), (b"[\xff".to_vec(), b"+".to_vec()));
    }

    #[test]
    fn durations_become_positive_bounded_milliseconds() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::MAX), MAX_TTL_MS);
    }

    #[test]
    fn quota_refusals_name_the_limit() {
        assert_eq!(
            over_keys("orders", 1001, 1000),
            "namespace \"orders\" would hold 1001 keys, over its quota of 1000 (max_keys)"
        );
        assert_eq!(
            over_bytes("orders", 70, 64),
            "namespace \"orders\" would hold 70 bytes, over its quota of 64 (max_bytes)"
        );
    }
}
