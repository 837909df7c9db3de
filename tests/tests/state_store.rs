//! The state stores' conformance suite (`acemq_tests::state_cases`) on each
//! store, and what only the Redis store does: its URL, its credentials, its
//! reconnection, its key layout, TLS with a private CA and client
//! certificates (docs/state.md).
//!
//! Redis is a throwaway `redis-server` shared by the binary
//! (`acemq_tests::redis`); every case uses namespaces and queues of its own.

use acemq_host::config::LoadedConfig;
use acemq_host::state::embedded::{EmbeddedStore, Opener};
use acemq_host::state::redis::{ClientCertFiles, RedisStore, TlsFiles};
use acemq_host::state::{ABSENT, Backend, Quota, Reserved, StoreError, Usage};
use acemq_tests::pki::{ExtendedKeyUsagePurpose, Pki};
use acemq_tests::redis::{RedisServer, ServerTls, shared_redis};
use acemq_tests::state_cases::{
    commit_of, expecting, now_ms, put, put_until, write as commit_writes,
};
use acemq_tests::unique_name;
use std::path::Path;
use std::time::{Duration, Instant};

/// A store on the shared Redis. Each test has a runtime of its own, and the
/// store's connection lives on the runtime that opened it, so each test
/// connects its own.
async fn shared_redis_store() -> RedisStore {
    RedisStore::connect(shared_redis().url())
        .await
        .expect("the shared Redis accepts a connection")
}

mod redis_conformance {
    acemq_tests::state_conformance!(super::shared_redis_store().await);
}

/// An embedded store in a file of its own. Its folder is removed at once:
/// the store keeps the open file (Linux unlinks it when the store closes),
/// so nothing is left behind.
async fn embedded_store() -> EmbeddedStore {
    let dir = tempfile::tempdir().expect("a temporary folder");
    EmbeddedStore::open(&dir.path().join("state.redb"), Opener::Host)
        .expect("a new embedded store opens")
}

mod embedded_conformance {
    acemq_tests::state_conformance!(super::embedded_store().await);
}

/// A plain client on the same Redis, to read what the store wrote.
async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("the test URL parses")
        .get_multiplexed_async_connection()
        .await
        .expect("the test Redis accepts a connection")
}

#[tokio::test]
async fn describe_is_the_address() {
    let store = shared_redis_store().await;
    assert_eq!(store.describe(), shared_redis().url());
    assert!(store.describe().starts_with("redis://127.0.0.1:"));
    assert!(store.describe().ends_with("/0"));
}

#[tokio::test]
async fn a_password_in_the_url_is_used() {
    let redis = RedisServer::start_with_password("s3cret-pw").expect("redis-server starts");
    let store = RedisStore::connect(redis.url())
        .await
        .expect("the password in the URL is accepted");
    assert_eq!(
        store.describe(),
        format!("redis://127.0.0.1:{}/0", redis.port()),
        "described without the password"
    );
    assert!(!format!("{store:?}").contains("s3cret-pw"));
    let ns = unique_name("auth");
    commit_writes(&store, &ns, vec![put(b"k", b"v")]).await;
    assert_eq!(
        store.get(&ns, b"k", now_ms()).await.unwrap().unwrap().value,
        b"v"
    );
}

#[tokio::test]
async fn a_wrong_or_missing_password_is_a_store_error_without_the_password() {
    let redis = RedisServer::start_with_password("s3cret-pw").expect("redis-server starts");
    let described = format!("redis://127.0.0.1:{}/0", redis.port());

    let started = Instant::now();
    let error = RedisStore::connect(&redis.url_with_password("wrong-pw"))
        .await
        .expect_err("a wrong password is refused");
    assert_eq!(error.store, described);
    let text = error.to_string();
    assert!(text.contains(&described), "{text}");
    assert!(text.contains("refused the credentials"), "{text}");
    assert!(!text.contains("wrong-pw"), "{text}");
    assert!(!text.contains("s3cret-pw"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    // Without a password the connection may open, but nothing is allowed.
    let error = match RedisStore::connect(&described).await {
        Err(error) => error,
        Ok(store) => store
            .get("ns", b"k", now_ms())
            .await
            .expect_err("no command without the password"),
    };
    assert_eq!(error.store, described);
    assert!(
        error.to_string().contains("refused the credentials"),
        "{error}"
    );
}

#[tokio::test]
async fn an_unreachable_redis_is_a_store_error() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://:pw@127.0.0.1:{port}/3");
    let started = Instant::now();
    let error = RedisStore::connect(&url)
        .await
        .expect_err("nothing listens there");
    assert_eq!(error.store, format!("redis://127.0.0.1:{port}/3"));
    let text = error.to_string();
    assert!(text.contains("cannot be reached"), "{text}");
    assert!(!text.contains(":pw@"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_bad_url_says_what_is_wrong() {
    for (url, expected) in [
        ("http://127.0.0.1:6379/0", "use redis:// or rediss://"),
        ("redis://:pw@127.0.0.1:6379/x", "is not a database number"),
        ("127.0.0.1:6379", "write it as redis://host:6379/0"),
        ("redis:///0", "names no host"),
    ] {
        let error = RedisStore::connect(url).await.expect_err(url).to_string();
        assert!(error.contains("has an invalid URL"), "{url}: {error}");
        assert!(error.contains(expected), "{url}: {error}");
        assert!(!error.contains(":pw@"), "{url}: {error}");
    }
}

/// While Redis is down every call is a StoreError (the input waits); once
/// it is back the same store works again without being reopened.
#[tokio::test]
async fn the_store_reconnects_after_redis_restarts() {
    let redis = RedisServer::start().expect("redis-server starts");
    let store = RedisStore::connect(redis.url()).await.unwrap();
    let ns = unique_name("restart");
    commit_writes(&store, &ns, vec![put(b"k", b"v")]).await;

    redis.kill();
    let error = store
        .get(&ns, b"k", now_ms())
        .await
        .expect_err("Redis is down");
    assert_eq!(error.store, store.describe());
    let error = store
        .commit(&commit_of(&ns, vec![put(b"k", b"w")]))
        .await
        .expect_err("Redis is down");
    assert!(error.to_string().contains(&store.describe()), "{error}");

    redis.restart().expect("redis-server starts again");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match store.get(&ns, b"k", now_ms()).await {
            // Nothing is persisted: the restarted server is empty, and the
            // scripts are loaded again on first use.
            Ok(entry) => {
                assert_eq!(entry, None);
                break;
            }
            Err(error) => {
                assert!(Instant::now() < deadline, "still failing: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    commit_writes(&store, &ns, vec![put(b"k", b"again")]).await;
    assert_eq!(
        store.get(&ns, b"k", now_ms()).await.unwrap().unwrap().value,
        b"again"
    );
}

/// The Redis keys are the ones docs/state.md lists.
#[tokio::test]
async fn the_key_layout_is_as_documented() {
    use redis::AsyncCommands as _;
    let store = shared_redis_store().await;
    let mut conn = raw(shared_redis().url()).await;
    let ns = unique_name("layout");
    let expires = now_ms() + 600_000;
    let mut commit = commit_of(
        &ns,
        vec![put(b"plain", b"value"), put_until(b"ttl", b"v", expires)],
    );
    commit.done.queue = "orders:new".into();
    commit.claim_holder = Some("host-a".into());
    assert_eq!(
        store
            .claim(&commit.done, "host-a", Duration::from_secs(60), now_ms())
            .await
            .unwrap(),
        acemq_host::state::Claim::Taken
    );
    store.commit(&commit).await.unwrap();
    let v = store
        .get(&ns, b"ttl", now_ms())
        .await
        .unwrap()
        .unwrap()
        .version;
    assert_eq!(
        store
            .reserve(
                &ns,
                &[(b"ttl".to_vec(), v)],
                "token-1",
                Duration::from_secs(60),
                now_ms()
            )
            .await
            .unwrap(),
        Reserved::Held
    );
    let other = acemq_tests::state_cases::input("orders:new");
    store
        .claim(&other, "host-b", Duration::from_secs(60), now_ms())
        .await
        .unwrap();

    let p = format!("acemq:state:{ns}:");
    let mut keys: Vec<String> = conn.keys(format!("{p}*")).await.unwrap();
    keys.sort();
    let expected: Vec<String> = [
        "index", "k:plain", "k:ttl", "keys", "lock:ttl", "sizes", "usage", "version",
    ]
    .iter()
    .map(|suffix| format!("{p}{suffix}"))
    .collect();
    assert_eq!(keys, expected);

    let entry: Vec<(String, String)> = conn.hgetall(format!("{p}k:ttl")).await.unwrap();
    let mut entry = entry;
    entry.sort();
    assert_eq!(
        entry,
        vec![
            ("n".to_owned(), v.to_string()),
            ("v".to_owned(), "v".to_owned()),
            ("x".to_owned(), expires.to_string()),
        ]
    );
    let expire_time: i64 = redis::cmd("PEXPIRETIME")
        .arg(format!("{p}k:ttl"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(expire_time, expires as i64);
    let plain_ttl: i64 = conn.pttl(format!("{p}k:plain")).await.unwrap();
    assert_eq!(plain_ttl, -1, "no expiry, no TTL");

    let index: Vec<(String, f64)> = conn
        .zrange_withscores(format!("{p}index"), 0, -1)
        .await
        .unwrap();
    assert_eq!(
        index,
        vec![
            ("ttl".to_owned(), expires as f64),
            ("plain".to_owned(), f64::INFINITY)
        ]
    );
    let lex: Vec<String> = conn.zrange(format!("{p}keys"), 0, -1).await.unwrap();
    assert_eq!(lex, vec!["plain", "ttl"]);
    let sizes: Vec<(String, u64)> = conn.hgetall(format!("{p}sizes")).await.unwrap();
    let mut sizes = sizes;
    sizes.sort();
    assert_eq!(sizes, vec![("plain".to_owned(), 10), ("ttl".to_owned(), 4)]);
    let usage: (u64, u64) = redis::cmd("HMGET")
        .arg(format!("{p}usage"))
        .arg("keys")
        .arg("bytes")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(usage, (2, 14));
    let counter: u64 = conn.get(format!("{p}version")).await.unwrap();
    assert!(counter >= v);
    let lock: String = conn.get(format!("{p}lock:ttl")).await.unwrap();
    assert_eq!(lock, "token-1");
    let lock_ttl: i64 = conn.pttl(format!("{p}lock:ttl")).await.unwrap();
    assert!(lock_ttl > 0 && lock_ttl <= 60_000, "{lock_ttl}");

    // The queue's `:` is escaped; the id comes last as it is.
    let done = format!("acemq:done:orders%3Anew:{}", commit.done.id);
    let done_ttl: i64 = conn.pttl(&done).await.unwrap();
    assert!(done_ttl > 0 && done_ttl <= 60_000, "{done}: {done_ttl}");
    let claim_of_done: bool = conn
        .exists(format!("acemq:claim:orders%3Anew:{}", commit.done.id))
        .await
        .unwrap();
    assert!(!claim_of_done, "the commit released its claim");
    let claim: String = conn
        .get(format!("acemq:claim:orders%3Anew:{}", other.id))
        .await
        .unwrap();
    assert_eq!(claim, "host-b");

    store
        .release_reservation(&ns, &[b"ttl".to_vec()], "token-1")
        .await
        .unwrap();
    let lock_left: bool = conn.exists(format!("{p}lock:ttl")).await.unwrap();
    assert!(!lock_left);
}

/// A mass expiry is purged in rounds: a commit purges one round, or more
/// while its quota would otherwise refuse it, and `usage` several.
#[tokio::test]
async fn expired_keys_are_purged_in_rounds() {
    let store = shared_redis_store().await;
    let ns = unique_name("purge");
    let total = 2 * acemq_host::state::redis::PURGE_ROUND + 500;
    let soon = now_ms() + 300;
    let writes = (0..total)
        .map(|i| put_until(format!("k{i:05}").as_bytes(), b"v", soon))
        .collect();
    commit_writes(&store, &ns, writes).await;
    tokio::time::sleep(Duration::from_millis(700)).await;

    // A quota that counts the expired keys would refuse this commit.
    let mut one_more = commit_of(&ns, vec![expecting(put(b"new", b"v"), ABSENT)]);
    one_more.quota = Quota {
        max_keys: 10,
        max_bytes: 1 << 20,
    };
    assert_eq!(
        store.commit(&one_more).await.unwrap(),
        acemq_host::state::Committed::Applied
    );
    assert_eq!(
        store.usage(&ns, now_ms()).await.unwrap(),
        Usage { keys: 1, bytes: 4 }
    );
}

// ---- TLS (rediss://) ----

/// A client certificate `pki` signed, as the store's TLS settings take it.
fn client_cert(pki: &Pki, dir: &Path, file: &str) -> ClientCertFiles {
    let (cert_file, key_file) = pki.leaf(dir, file, &[], ExtendedKeyUsagePurpose::ClientAuth);
    ClientCertFiles {
        cert_file,
        key_file,
    }
}

const TLS_PASSWORD: &str = "tls-s3cret";

/// A TLS-only Redis whose certificate (for 127.0.0.1 and localhost) a
/// private CA signed, with a password; and that CA, in `dir`.
fn tls_redis(dir: &Path, auth_clients: bool) -> (RedisServer, Pki) {
    let pki = Pki::new(dir, "private-ca");
    let (cert_file, key_file) = pki.leaf(
        dir,
        "redis-server",
        &["127.0.0.1", "localhost"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let redis = RedisServer::start_tls(ServerTls {
        cert_file,
        key_file,
        ca_file: pki.ca.clone(),
        auth_clients,
        password: Some(TLS_PASSWORD.to_owned()),
    })
    .expect("a TLS redis-server starts");
    assert!(redis.url().starts_with("rediss://"), "{}", redis.url());
    (redis, pki)
}

/// How a store is refused: at connecting, or (when the connection opens
/// and the refusal comes with the first answer, as for a client
/// certificate under TLS 1.3) at its first call.
async fn refusal(url: &str, tls: &TlsFiles) -> StoreError {
    match RedisStore::connect_with_tls(url, tls).await {
        Err(error) => error,
        Ok(store) => store
            .get("ns", b"k", now_ms())
            .await
            .expect_err("the store is refused"),
    }
}

/// A refusal names the store, without the password.
fn assert_refused(error: &StoreError, redis: &RedisServer) {
    assert_eq!(
        error.store,
        format!("rediss://127.0.0.1:{}/0", redis.port())
    );
    let text = error.to_string();
    assert!(text.contains(&error.store), "{text}");
    assert!(!text.contains(TLS_PASSWORD), "{text}");
}

/// `[state] url = "rediss://..."` with `tls_ca_file` (relative to the
/// config file) reaches a Redis whose certificate a private CA signed, as
/// the host opens it; without the CA (the public roots), or with another
/// CA, the same server is refused.
#[tokio::test]
async fn a_rediss_store_trusts_the_configured_ca_and_only_it() {
    let dir = tempfile::tempdir().unwrap();
    let (redis, pki) = tls_redis(dir.path(), false);

    let config = LoadedConfig::parse(
        &dir.path().join("host.toml"),
        format!(
            "[state]\nurl = \"{}\"\ntls_ca_file = \"{}\"\n\
             [[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\nstate = \"orders\"\n",
            redis.url(),
            pki.ca.file_name().unwrap().to_str().unwrap(),
        ),
    )
    .expect("the config is accepted");
    let store = acemq_host::state::open(&config.store_location(), Opener::Host)
        .expect("the store opens with the CA file");
    assert_eq!(
        store.describe(),
        format!("rediss://127.0.0.1:{}/0", redis.port())
    );
    let ns = unique_name("tls");
    commit_writes(&store, &ns, vec![put(b"k", b"over tls")]).await;
    assert_eq!(
        store.get(&ns, b"k", now_ms()).await.unwrap().unwrap().value,
        b"over tls"
    );

    // The public roots do not trust the private CA.
    let started = Instant::now();
    let error = refusal(redis.url(), &TlsFiles::default()).await;
    assert_refused(&error, &redis);
    let text = error.to_string();
    assert!(text.contains("refused the TLS handshake"), "{text}");
    assert!(text.contains("invalid peer certificate"), "{text}");
    assert!(text.contains("set state.tls_ca_file"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    // Nor does another CA: only the configured one is trusted.
    let other = Pki::new(dir.path(), "other-ca");
    let error = refusal(
        redis.url(),
        &TlsFiles {
            ca_file: Some(other.ca.clone()),
            client: None,
        },
    )
    .await;
    assert_refused(&error, &redis);
    assert!(
        error.to_string().contains("invalid peer certificate"),
        "{error}"
    );
}

/// With `tls-auth-clients yes` a store without a client certificate, or
/// with one another CA signed, is refused; with one the server's CA signed
/// (`tls_cert_file`, `tls_key_file`) it works.
#[tokio::test]
async fn a_redis_that_requires_client_certificates_takes_the_configured_one() {
    let dir = tempfile::tempdir().unwrap();
    let (redis, pki) = tls_redis(dir.path(), true);
    let trusting = |client: Option<ClientCertFiles>| TlsFiles {
        ca_file: Some(pki.ca.clone()),
        client,
    };

    let error = refusal(redis.url(), &trusting(None)).await;
    assert_refused(&error, &redis);
    assert!(
        error
            .to_string()
            .contains("needs state.tls_cert_file and state.tls_key_file"),
        "{error}"
    );

    let stranger = client_cert(&Pki::new(dir.path(), "stranger-ca"), dir.path(), "stranger");
    let error = refusal(redis.url(), &trusting(Some(stranger))).await;
    assert_refused(&error, &redis);
    assert!(
        error.to_string().contains("refused the TLS handshake"),
        "{error}"
    );

    let config = LoadedConfig::parse(
        &dir.path().join("host.toml"),
        format!(
            "[state]\nurl = \"{}\"\ntls_ca_file = \"private-ca.pem\"\n\
             tls_cert_file = \"client.pem\"\ntls_key_file = \"client.key\"\n\
             [[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\nidempotent = true\n",
            redis.url(),
        ),
    )
    .expect("the config is accepted");
    client_cert(&pki, dir.path(), "client");
    let store = acemq_host::state::open(&config.store_location(), Opener::Host)
        .expect("the store opens with the client certificate");
    let ns = unique_name("mtls");
    commit_writes(&store, &ns, vec![put(b"k", b"mutual")]).await;
    assert_eq!(
        store.get(&ns, b"k", now_ms()).await.unwrap().unwrap().value,
        b"mutual"
    );
}

/// A TLS file that cannot be used is refused when the store is opened,
/// naming the file and its key (not at every call).
#[tokio::test]
async fn an_unreadable_tls_file_is_refused_at_open_naming_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = LoadedConfig::parse(
        &dir.path().join("host.toml"),
        format!(
            "[state]\nurl = \"rediss://:{TLS_PASSWORD}@127.0.0.1:6380/0\"\ntls_ca_file = \"ca.pem\"\n\
             tls_cert_file = \"client.pem\"\ntls_key_file = \"client.key\"\n\
             [[consumers]]\nqueue = \"q\"\nplugin = \"p.wasm\"\nidempotent = true\n"
        ),
    )
    .unwrap();
    let open = || match acemq_host::state::open(&config.store_location(), Opener::Host) {
        Ok(_) => panic!("the store opens"),
        Err(error) => {
            assert_eq!(error.store, "rediss://127.0.0.1:6380/0");
            assert!(!error.to_string().contains(TLS_PASSWORD), "{error}");
            error.to_string()
        }
    };
    let ca = dir.path().join("ca.pem");
    let error = open();
    assert!(
        error.contains(&format!("cannot read state.tls_ca_file {}", ca.display())),
        "{error}"
    );
    let pki = Pki::new(dir.path(), "ca");
    let client = client_cert(&pki, dir.path(), "client");
    std::fs::write(&client.key_file, std::fs::read(&pki.ca).unwrap()).unwrap();
    let error = open();
    assert!(
        error.contains(&format!(
            "state.tls_key_file {} holds no private key",
            client.key_file.display()
        )),
        "{error}"
    );
    // Another certificate's key.
    let other = client_cert(&pki, dir.path(), "other");
    std::fs::copy(&other.key_file, &client.key_file).unwrap();
    let error = open();
    assert!(
        error.contains(&format!(
            "state.tls_cert_file {} and state.tls_key_file {} do not fit together",
            client.cert_file.display(),
            client.key_file.display()
        )),
        "{error}"
    );
    // The right one.
    std::fs::copy(&other.cert_file, &client.cert_file).unwrap();
    acemq_host::state::open(&config.store_location(), Opener::Host)
        .expect("a certificate and its own key");
}
