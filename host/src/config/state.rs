//! `[state]` and the state keys of `[[consumers]]`: where plugin state and
//! done records are kept (docs/state.md), and the checks of them that need
//! only the file.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use toml::Spanned;

use super::{ConfigError, LoadedConfig};
use crate::state::Quota;
use crate::state::redis::{ClientCertFiles, TlsFiles};

/// The embedded store's file when `[state] path` is not set: beside the
/// config file.
pub const DEFAULT_FILE: &str = "acemq-state.redb";

/// `[state]`: the store.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// The embedded store's file, relative to the config file.
    pub path: Option<PathBuf>,
    /// A Redis URL (`redis://`, `rediss://`): the shared store, instead of
    /// the embedded one.
    pub url: Option<Spanned<String>>,
    /// PEM file of the CA(s) a `rediss://` Redis's certificate must chain
    /// to, instead of the public roots; relative to the config file.
    pub tls_ca_file: Option<Spanned<PathBuf>>,
    /// PEM file of a client certificate for `rediss://` (Redis's
    /// `tls-auth-clients`), with `tls_key_file`.
    pub tls_cert_file: Option<Spanned<PathBuf>>,
    /// PEM file of `tls_cert_file`'s private key.
    pub tls_key_file: Option<Spanned<PathBuf>>,
    /// Most keys in each namespace.
    #[serde(default = "default_max_keys")]
    pub max_keys: u64,
    /// Most bytes (keys plus values) in each namespace: a number, or text
    /// such as `"64MiB"`.
    #[serde(default = "default_max_bytes", deserialize_with = "size")]
    pub max_bytes: u64,
    /// A namespace's own quotas.
    #[serde(default)]
    pub namespaces: BTreeMap<String, Spanned<NamespaceConfig>>,
}

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            path: None,
            url: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            max_keys: default_max_keys(),
            max_bytes: default_max_bytes(),
            namespaces: BTreeMap::new(),
        }
    }
}

// The URL may carry a password.
impl fmt::Debug for StateConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateConfig")
            .field("path", &self.path)
            .field(
                "url",
                &self.url.as_ref().map(|u| {
                    crate::state::redis::RedisUrl::parse(u.get_ref())
                        .map(|u| u.describe().to_string())
                        .unwrap_or_else(|_| "(not a Redis URL)".to_string())
                }),
            )
            .field(
                "tls_ca_file",
                &self.tls_ca_file.as_ref().map(Spanned::get_ref),
            )
            .field(
                "tls_cert_file",
                &self.tls_cert_file.as_ref().map(Spanned::get_ref),
            )
            .field(
                "tls_key_file",
                &self.tls_key_file.as_ref().map(Spanned::get_ref),
            )
            .field("max_keys", &self.max_keys)
            .field("max_bytes", &self.max_bytes)
            .field("namespaces", &self.namespaces)
            .finish()
    }
}

/// `[state.namespaces.NAME]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceConfig {
    pub max_keys: Option<u64>,
    #[serde(default, deserialize_with = "optional_size")]
    pub max_bytes: Option<u64>,
}

fn default_max_keys() -> u64 {
    100_000
}

fn default_max_bytes() -> u64 {
    64 << 20
}

/// The default retention of done records.
pub fn default_done_retention() -> Duration {
    Duration::from_secs(24 * 3600)
}

/// The contract's claim lease (Java's `claimTimeout`).
pub fn default_claim_lease() -> Duration {
    Duration::from_secs(5 * 60)
}

/// Where the store is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    Embedded(PathBuf),
    Redis(RedisLocation),
}

/// A Redis store: its URL (which may hold a password: never logged) and
/// its TLS files, paths resolved.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisLocation {
    pub url: String,
    pub tls: TlsFiles,
}

impl RedisLocation {
    /// `url` with no TLS files: the public roots, no client certificate.
    pub fn plain(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            tls: TlsFiles::default(),
        }
    }
}

// The URL may carry a password.
impl fmt::Debug for RedisLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLocation")
            .field(
                "url",
                &crate::state::redis::RedisUrl::parse(&self.url)
                    .map(|u| u.describe().to_string())
                    .unwrap_or_else(|_| "(not a Redis URL)".to_string()),
            )
            .field("tls", &self.tls)
            .finish()
    }
}

impl StateConfig {
    /// The quotas of `namespace`.
    pub fn quota(&self, namespace: &str) -> Quota {
        let own = self.namespaces.get(namespace).map(Spanned::get_ref);
        Quota {
            max_keys: own.and_then(|n| n.max_keys).unwrap_or(self.max_keys),
            max_bytes: own.and_then(|n| n.max_bytes).unwrap_or(self.max_bytes),
        }
    }
}

/// Calls in progress at once, per core, of a consumer whose calls wait on
/// the shared store (a Redis round trip for each read, each claim): a call
/// waiting holds its place but no CPU. Measured (docs/benchmarks.md,
/// State): one per core leaves the cores idle while calls wait, and
/// reaches 0.3x of the same handler without state; four per core, about
/// 0.9x.
pub const WAITING_CALLS_PER_CORE: usize = 4;

impl LoadedConfig {
    /// The concurrency of `consumer`: as configured, else
    /// [`ConsumerConfig::concurrency_for`]'s default, or for a queue
    /// consumer with state on Redis [`WAITING_CALLS_PER_CORE`] per core.
    pub fn concurrency_of(&self, consumer: &super::ConsumerConfig, stream: bool) -> usize {
        let waits_on_the_network = consumer.concurrency.is_none()
            && !stream
            && (consumer.state.is_some() || consumer.idempotent)
            && self.config.state.url.is_some();
        if waits_on_the_network {
            WAITING_CALLS_PER_CORE * super::defaults::concurrency()
        } else {
            consumer.concurrency_for(stream)
        }
    }

    /// Whether any consumer keeps state or done records.
    pub fn state_needed(&self) -> bool {
        self.config
            .consumers
            .iter()
            .any(|c| c.state.is_some() || c.idempotent)
    }

    /// Where the store is: Redis when `[state] url` is set (with its TLS
    /// files), else the embedded file (paths resolved against the config
    /// file's folder).
    pub fn store_location(&self) -> StoreLocation {
        let state = &self.config.state;
        let resolved =
            |path: &Option<Spanned<PathBuf>>| path.as_ref().map(|p| self.resolve(p.get_ref()));
        match &state.url {
            Some(url) => StoreLocation::Redis(RedisLocation {
                url: url.get_ref().clone(),
                tls: TlsFiles {
                    ca_file: resolved(&state.tls_ca_file),
                    // Both or neither: check() refuses one alone.
                    client: resolved(&state.tls_cert_file)
                        .zip(resolved(&state.tls_key_file))
                        .map(|(cert_file, key_file)| ClientCertFiles {
                            cert_file,
                            key_file,
                        }),
                },
            }),
            None => StoreLocation::Embedded(
                self.resolve(state.path.as_deref().unwrap_or(DEFAULT_FILE.as_ref())),
            ),
        }
    }

    /// The state keys' problems.
    pub(super) fn state_problems(&self) -> Vec<ConfigError> {
        let c = &self.config;
        let mut found = Vec::new();
        if let Some(url) = &c.state.url
            && let Err(e) = crate::state::redis::RedisUrl::parse(url.get_ref())
        {
            found.push(self.error_at(Some(url.span().start), format!("state.url: {e}")));
        }
        if let Some(url) = &c.state.url
            && c.state.path.is_some()
        {
            found.push(self.error_at(
                Some(url.span().start),
                "state.url and state.path: one store or the other: path is the embedded store's file, url a Redis",
            ));
        }
        found.extend(self.state_tls_problems());
        if c.state.max_keys == 0 || c.state.max_bytes == 0 {
            found.push(self.error_at(
                None,
                "state.max_keys and state.max_bytes: must be more than 0: no write could be committed",
            ));
        }
        let named: std::collections::BTreeSet<&str> = c
            .consumers
            .iter()
            .filter_map(|c| c.state.as_ref().map(|s| s.get_ref().as_str()))
            .collect();
        for (name, namespace) in &c.state.namespaces {
            if !named.contains(name.as_str()) {
                found.push(self.error_at(
                    Some(namespace.span().start),
                    format!("state.namespaces.{name}: no consumer has state = \"{name}\""),
                ));
            }
        }
        for (i, consumer) in c.consumers.iter().enumerate() {
            if let Some(name) = &consumer.state
                && let Err(why) = check_namespace(name.get_ref())
            {
                found.push(self.error_at(
                    Some(name.span().start),
                    format!("consumers[{i}].state: {why}"),
                ));
            }
            if consumer.claim_lease.is_zero() {
                found.push(self.error_at(
                    Some(consumer.queue.span().start),
                    format!("consumers[{i}].claim_lease: must be more than 0"),
                ));
            }
            if consumer.done_retention.is_zero() {
                found.push(self.error_at(
                    Some(consumer.queue.span().start),
                    format!(
                        "consumers[{i}].done_retention: must be more than 0: a redelivered input would run again"
                    ),
                ));
            }
        }
        found
    }
}

impl LoadedConfig {
    /// The TLS keys' problems: they are for a `rediss://` URL, and a
    /// client certificate needs its key (and the key its certificate).
    fn state_tls_problems(&self) -> Vec<ConfigError> {
        let state = &self.config.state;
        let mut found = Vec::new();
        let set: Vec<(&str, usize)> = [
            ("state.tls_ca_file", &state.tls_ca_file),
            ("state.tls_cert_file", &state.tls_cert_file),
            ("state.tls_key_file", &state.tls_key_file),
        ]
        .into_iter()
        .filter_map(|(key, value)| value.as_ref().map(|v| (key, v.span().start)))
        .collect();
        let Some(&(_, first)) = set.first() else {
            return found;
        };
        let keys = set
            .iter()
            .map(|(key, _)| *key)
            .collect::<Vec<_>>()
            .join(", ");
        match &state.url {
            None => found.push(self.error_at(
                Some(first),
                format!(
                    "{keys}: TLS for the Redis store, and there is none: set state.url to a rediss:// URL, or remove {}",
                    if set.len() == 1 { "it" } else { "them" }
                ),
            )),
            Some(url) => {
                if let Ok(parsed) = crate::state::redis::RedisUrl::parse(url.get_ref())
                    && !parsed.is_tls()
                {
                    found.push(self.error_at(
                        Some(first),
                        format!(
                            "{keys}: state.url is redis:// (no TLS); these files are for a rediss:// URL"
                        ),
                    ));
                }
            }
        }
        match (&state.tls_cert_file, &state.tls_key_file) {
            (Some(cert), None) => found.push(self.error_at(
                Some(cert.span().start),
                "state.tls_cert_file: a client certificate needs its key: set state.tls_key_file too",
            )),
            (None, Some(key)) => found.push(self.error_at(
                Some(key.span().start),
                "state.tls_key_file: a key without its certificate: set state.tls_cert_file too",
            )),
            _ => {}
        }
        found
    }
}

/// A namespace name: it is part of the store's keys.
pub fn check_namespace(name: &str) -> Result<(), String> {
    let fits = !name.is_empty()
        && name.len() <= 100
        && name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '_' | '-'));
    if fits {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a namespace name: 1 to 100 of A-Z, a-z, 0-9, '.', '_' and '-'"
        ))
    }
}

/// A size: a number of bytes, or text with a unit (`B`, `KiB`, `MiB`,
/// `GiB`, or `KB`, `MB`, `GB` in powers of ten).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size: a number of bytes, or such as \"64MiB\""))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => {
            return Err(format!(
                "{text:?}: {other:?} is not a unit of size (B, KiB, MiB, GiB, KB, MB, GB)"
            ));
        }
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeSetting {
    Number(u64),
    Text(String),
}

fn size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match SizeSetting::deserialize(d)? {
        SizeSetting::Number(n) => Ok(n),
        SizeSetting::Text(text) => parse_size(&text).map_err(serde::de::Error::custom),
    }
}

fn optional_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    size(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_and_decimal_units() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("10 KB"), Ok(10_000));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(
            parse_size("64 furlongs")
                .unwrap_err()
                .contains("not a unit of size")
        );
        assert!(parse_size("lots").unwrap_err().contains("not a size"));
    }

    #[test]
    fn namespace_names_are_what_store_keys_can_hold() {
        assert!(check_namespace("orders.velocity-v2_eu").is_ok());
        for bad in ["", "has space", "a:b", &"x".repeat(101)] {
            assert!(check_namespace(bad).is_err(), "{bad}");
        }
    }

    fn parse(text: &str) -> Result<LoadedConfig, ConfigError> {
        LoadedConfig::parse(
            std::path::Path::new("/etc/acemq/host.toml"),
            text.to_string(),
        )
    }

    #[test]
    fn the_store_is_embedded_beside_the_config_unless_a_redis_url_is_given() {
        let embedded =
            parse("[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\nstate = \"orders\"\n")
                .unwrap();
        assert!(embedded.state_needed());
        assert_eq!(
            embedded.store_location(),
            StoreLocation::Embedded("/etc/acemq/acemq-state.redb".into())
        );
        let shared = parse(
            "[state]\nurl = \"redis://:pw@127.0.0.1:6379/0\"\n[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\nidempotent = true\n",
        )
        .unwrap();
        assert_eq!(
            shared.store_location(),
            StoreLocation::Redis(RedisLocation::plain("redis://:pw@127.0.0.1:6379/0"))
        );
        assert!(!format!("{:?}", shared.config.state).contains("pw@"));
        assert!(!format!("{:?}", shared.store_location()).contains("pw@"));
        let none = parse("[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\n").unwrap();
        assert!(!none.state_needed());
    }

    #[test]
    fn a_consumer_waiting_on_redis_runs_more_calls_at_once_unless_told() {
        let cores = super::super::defaults::concurrency();
        let consumer =
            |keys: &str| format!("[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\n{keys}");
        let redis = "[state]\nurl = \"redis://127.0.0.1/0\"\n";
        let of = |text: String| {
            let loaded = parse(&text).unwrap();
            let c = &loaded.config.consumers[0];
            (
                loaded.concurrency_of(c, false),
                loaded.concurrency_of(c, true),
            )
        };
        assert_eq!(
            of(format!("{redis}{}", consumer("state = \"n\"\n"))),
            (4 * cores, 1)
        );
        assert_eq!(
            of(format!("{redis}{}", consumer("idempotent = true\n"))).0,
            4 * cores
        );
        assert_eq!(
            of(format!(
                "{redis}{}",
                consumer("state = \"n\"\nconcurrency = 3\n")
            ))
            .0,
            3
        );
        assert_eq!(
            of(consumer("state = \"n\"\n")).0,
            cores,
            "the embedded store does not wait"
        );
        assert_eq!(
            of(format!("{redis}{}", consumer(""))).0,
            cores,
            "no state, no waiting"
        );
    }

    #[test]
    fn quotas_are_the_namespaces_own_else_the_defaults() {
        let loaded = parse(
            "[state]\nmax_keys = 10\nmax_bytes = \"1KiB\"\n[state.namespaces.orders]\nmax_keys = 3\n\
             [[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\nstate = \"orders\"\n",
        )
        .unwrap();
        let quota = loaded.config.state.quota("orders");
        assert_eq!((quota.max_keys, quota.max_bytes), (3, 1024));
        let other = loaded.config.state.quota("other");
        assert_eq!((other.max_keys, other.max_bytes), (10, 1024));
    }

    #[test]
    fn state_settings_are_checked_with_the_key_named() {
        let refused = |text: &str| parse(text).unwrap_err().to_string();
        let consumer = "[[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\n";
        assert!(
            refused(&format!("{consumer}state = \"a:b\"\n"))
                .contains("consumers[0].state: \"a:b\" is not a namespace name")
        );
        assert!(
            refused(&format!("[state]\nurl = \"http://x\"\n{consumer}")).contains(
                "state.url: the state store (Redis) has an invalid URL: the scheme is \"http\""
            )
        );
        assert!(
            refused(&format!(
                "[state.namespaces.typo]\nmax_keys = 1\n{consumer}state = \"orders\"\n"
            ))
            .contains("state.namespaces.typo: no consumer has state = \"typo\"")
        );
        assert!(
            refused(&format!(
                "{consumer}idempotent = true\nclaim_lease = \"0s\"\n"
            ))
            .contains("consumers[0].claim_lease: must be more than 0")
        );
        assert!(refused(&format!("[state]\nmax_keys = 0\n{consumer}")).contains("state.max_keys"));
    }

    #[test]
    fn redis_tls_files_are_resolved_beside_the_config() {
        let loaded = parse(
            "[state]\nurl = \"rediss://:pw@redis.internal:6380/0\"\ntls_ca_file = \"tls/ca.pem\"\n\
             tls_cert_file = \"/etc/pki/client.pem\"\ntls_key_file = \"tls/client.key\"\n\
             [[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\nidempotent = true\n",
        )
        .unwrap();
        assert_eq!(
            loaded.store_location(),
            StoreLocation::Redis(RedisLocation {
                url: "rediss://:pw@redis.internal:6380/0".into(),
                tls: TlsFiles {
                    ca_file: Some("/etc/acemq/tls/ca.pem".into()),
                    client: Some(ClientCertFiles {
                        cert_file: "/etc/pki/client.pem".into(),
                        key_file: "/etc/acemq/tls/client.key".into(),
                    }),
                },
            })
        );
        let ca_only =
            parse("[state]\nurl = \"rediss://127.0.0.1:6380/0\"\ntls_ca_file = \"ca.pem\"\n")
                .unwrap();
        let StoreLocation::Redis(redis) = ca_only.store_location() else {
            panic!("a Redis store");
        };
        assert_eq!(redis.tls.ca_file, Some("/etc/acemq/ca.pem".into()));
        assert_eq!(redis.tls.client, None);
    }

    #[test]
    fn redis_tls_files_are_refused_without_rediss_or_half_a_client_certificate() {
        let refused = |text: &str| parse(text).unwrap_err().to_string();
        // Without a Redis at all: named with the line of the first key.
        let error = refused("[state]\npath = \"s.redb\"\ntls_ca_file = \"ca.pem\"\n");
        assert!(error.contains("host.toml:3"), "{error}");
        assert!(
            error.contains(
                "state.tls_ca_file: TLS for the Redis store, and there is none: set state.url to a rediss:// URL"
            ),
            "{error}"
        );
        // A plain redis:// URL.
        let error = refused(
            "[state]\nurl = \"redis://:pw@127.0.0.1/0\"\ntls_cert_file = \"c.pem\"\ntls_key_file = \"c.key\"\n",
        );
        assert!(error.contains("host.toml:3"), "{error}");
        assert!(
            error.contains(
                "state.tls_cert_file, state.tls_key_file: state.url is redis:// (no TLS); these files are for a rediss:// URL"
            ),
            "{error}"
        );
        assert!(!error.contains("pw"), "{error}");
        // Half a client certificate, with a TLS URL.
        let tls = "[state]\nurl = \"rediss://127.0.0.1/0\"\n";
        let error = refused(&format!("{tls}tls_cert_file = \"c.pem\"\n"));
        assert!(error.contains("host.toml:3"), "{error}");
        assert!(
            error.contains(
                "state.tls_cert_file: a client certificate needs its key: set state.tls_key_file too"
            ),
            "{error}"
        );
        let error = refused(&format!(
            "{tls}tls_ca_file = \"ca.pem\"\ntls_key_file = \"c.key\"\n"
        ));
        assert!(error.contains("host.toml:4"), "{error}");
        assert!(
            error.contains(
                "state.tls_key_file: a key without its certificate: set state.tls_cert_file too"
            ),
            "{error}"
        );
        // Both at once: no URL, and half a certificate.
        let error = refused("[state]\ntls_key_file = \"c.key\"\n");
        assert!(
            error.contains("set state.url to a rediss:// URL, or remove it"),
            "{error}"
        );
        assert!(error.contains("set state.tls_cert_file too"), "{error}");
        // Accepted: a CA alone, a client certificate alone, or all three.
        for keys in [
            "tls_ca_file = \"ca.pem\"\n",
            "tls_cert_file = \"c.pem\"\ntls_key_file = \"c.key\"\n",
            "tls_ca_file = \"ca.pem\"\ntls_cert_file = \"c.pem\"\ntls_key_file = \"c.key\"\n",
        ] {
            parse(&format!("{tls}{keys}")).unwrap();
        }
    }
}
