//! The conformance cases of the state stores: what every
//! [`Backend`](acemq_host::state::Backend) must do (docs/state.md), written
//! once for any store.
//!
//! Each case takes a connected store and uses namespaces and queues of its
//! own ([`crate::unique_name`]), so cases may share one store and run at
//! once. A test binary runs them all on one store with
//! [`state_conformance!`](crate::state_conformance):
//!
//! ```text
//! mod redis_conformance {
//!     acemq_tests::state_conformance!(super::shared_redis_store().await);
//! }
//! ```
//!
//! (as `tests/tests/state_store.rs` does, for each store).
//!
//! The cases panic (with what was expected) when the store does otherwise.
//! The ones about expiry sleep past short TTLs, leases and retentions (a
//! few hundred milliseconds), on the real clock.

use crate::unique_name;
use acemq_host::state::{
    ABSENT, Backend, Claim, Commit, Committed, Entry, InputKey, KeyWrite, Quota, Reserved, Usage,
    Write,
};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Generates one `#[tokio::test]` per conformance case, each on the store
/// that `$store` (an expression, awaited inside the test: `connect().await`)
/// gives.
#[macro_export]
macro_rules! state_conformance {
    ($store:expr) => {
        $crate::state_conformance!(@cases $store;
            get_of_missing,
            commit_applies_puts_and_deletes,
            versions_are_never_reused,
            ttl_expiry_for_get_and_list,
            expected_version_conflict_applies_nothing,
            absent_expectation,
            reservation_holds_keys_until_commit,
            reservation_conflict_holds_nothing,
            reservation_released_by_release_reservation,
            reservation_expires_after_its_lease,
            plain_write_to_a_reserved_key_conflicts,
            quota_of_keys_refuses_and_applies_nothing,
            quota_of_bytes_refuses_and_applies_nothing,
            quota_ignores_expired_keys,
            quota_lets_an_over_quota_namespace_shrink,
            usage_counts_and_drops_after_expiry,
            done_record_makes_a_second_commit_already_done,
            done_record_expires_after_its_retention,
            claims,
            claim_expires_after_its_lease,
            claim_of_a_done_input_is_done,
            commit_releases_the_claim_of_its_holder_only,
            commit_without_namespace_keeps_the_done_record,
            namespaces_are_isolated,
            binary_keys_and_values,
            list_with_prefix_and_limit_in_key_order,
            list_past_one_page,
            delete_now,
            increments_under_contention,
        );
    };
    (@cases $store:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let store = $store;
                $crate::state_cases::$case(&store).await;
            }
        )*
    };
}

// ---- helpers ----

/// The real clock, epoch ms.
pub fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("the clock is after 1970")
            .as_millis(),
    )
    .expect("epoch ms fit in u64")
}

/// A quota no case reaches unless it means to.
pub const ROOMY: Quota = Quota {
    max_keys: 1_000_000,
    max_bytes: 1 << 30,
};

/// A last-writer-wins put.
pub fn put(key: &[u8], value: &[u8]) -> KeyWrite {
    KeyWrite {
        key: key.to_vec(),
        write: Write::Put {
            value: value.to_vec(),
            expires_at_ms: None,
        },
        expect: None,
    }
}

/// A put that expires at `expires_at_ms`.
pub fn put_until(key: &[u8], value: &[u8], expires_at_ms: u64) -> KeyWrite {
    KeyWrite {
        key: key.to_vec(),
        write: Write::Put {
            value: value.to_vec(),
            expires_at_ms: Some(expires_at_ms),
        },
        expect: None,
    }
}

/// A last-writer-wins delete.
pub fn delete(key: &[u8]) -> KeyWrite {
    KeyWrite {
        key: key.to_vec(),
        write: Write::Delete,
        expect: None,
    }
}

/// `write`, applied only if the key still has `version`.
pub fn expecting(mut write: KeyWrite, version: u64) -> KeyWrite {
    write.expect = Some(version);
    write
}

/// A new input of `queue` (a fresh envelope id).
pub fn input(queue: &str) -> InputKey {
    InputKey {
        queue: queue.to_owned(),
        id: uuid::Uuid::new_v4().to_string(),
    }
}

/// The commit of a new input of a queue of its own writing `writes` to
/// `namespace`: roomy quota, 60 s retention, no claim, no reservation.
pub fn commit_of(namespace: &str, writes: Vec<KeyWrite>) -> Commit {
    Commit {
        namespace: Some(namespace.to_owned()),
        quota: ROOMY,
        writes,
        done: input(&unique_name("queue")),
        retention: Duration::from_secs(60),
        claim_holder: None,
        reservation: None,
        now_ms: now_ms(),
    }
}

/// Commits and expects it applied.
pub async fn apply(store: &impl Backend, commit: &Commit) {
    let committed = store.commit(commit).await.expect("the store answers");
    assert_eq!(
        committed,
        Committed::Applied,
        "commit of {:?}",
        commit.writes
    );
}

/// Commits `writes` to `namespace` as a new input, expecting it applied.
pub async fn write(store: &impl Backend, namespace: &str, writes: Vec<KeyWrite>) {
    apply(store, &commit_of(namespace, writes)).await;
}

/// The live entry of `key`, if any.
pub async fn get(store: &impl Backend, namespace: &str, key: &[u8]) -> Option<Entry> {
    store
        .get(namespace, key, now_ms())
        .await
        .expect("the store answers")
}

/// The version of `key`, which must be there.
pub async fn version(store: &impl Backend, namespace: &str, key: &[u8]) -> u64 {
    get(store, namespace, key)
        .await
        .unwrap_or_else(|| panic!("{} is there", String::from_utf8_lossy(key)))
        .version
}

/// The namespace's usage now.
pub async fn usage(store: &impl Backend, namespace: &str) -> Usage {
    store
        .usage(namespace, now_ms())
        .await
        .expect("the store answers")
}

/// The keys `list` gives.
pub async fn list_keys(
    store: &impl Backend,
    namespace: &str,
    prefix: &[u8],
    limit: usize,
) -> Vec<Vec<u8>> {
    store
        .list(namespace, prefix, limit, now_ms())
        .await
        .expect("the store answers")
        .into_iter()
        .map(|(key, _)| key)
        .collect()
}

async fn reserve(
    store: &impl Backend,
    namespace: &str,
    checks: &[(&[u8], u64)],
    token: &str,
    lease: Duration,
) -> Reserved {
    let checks: Vec<(Vec<u8>, u64)> = checks.iter().map(|(k, v)| (k.to_vec(), *v)).collect();
    store
        .reserve(namespace, &checks, token, lease, now_ms())
        .await
        .expect("the store answers")
}

async fn claim(store: &impl Backend, input: &InputKey, holder: &str, lease: Duration) -> Claim {
    store
        .claim(input, holder, lease, now_ms())
        .await
        .expect("the store answers")
}

async fn is_done(store: &impl Backend, input: &InputKey) -> bool {
    store
        .is_done(input, now_ms())
        .await
        .expect("the store answers")
}

/// Polls `usage` until it is `expected` (a store may sweep expired keys in
/// the background), for up to 5 s.
async fn usage_becomes(store: &impl Backend, namespace: &str, expected: Usage) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = usage(store, namespace).await;
        if now == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "usage of {namespace} is {now:?}, expected {expected:?} within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const SHORT: Duration = Duration::from_millis(300);
/// Well past [`SHORT`].
const PAST_SHORT: Duration = Duration::from_millis(700);
const LONG: Duration = Duration::from_secs(60);

// ---- cases ----

/// A namespace nobody wrote is empty.
pub async fn get_of_missing(store: &impl Backend) {
    let ns = unique_name("missing");
    assert_eq!(get(store, &ns, b"nothing").await, None);
    assert!(list_keys(store, &ns, b"", 10).await.is_empty());
    assert_eq!(usage(store, &ns).await, Usage::default());
    assert!(!store.delete_now(&ns, b"nothing", now_ms()).await.unwrap());
}

/// Puts and deletes of one commit all apply; each put gets a new version.
pub async fn commit_applies_puts_and_deletes(store: &impl Backend) {
    let ns = unique_name("apply");
    write(store, &ns, vec![put(b"a", b"1"), put(b"b", b"2")]).await;
    let a = get(store, &ns, b"a").await.expect("a is there");
    let b = get(store, &ns, b"b").await.expect("b is there");
    assert_eq!(
        (a.value.as_slice(), b.value.as_slice()),
        (&b"1"[..], &b"2"[..])
    );
    assert_eq!((a.expires_at_ms, b.expires_at_ms), (None, None));
    assert_ne!(a.version, ABSENT);
    assert_ne!(b.version, ABSENT);
    assert_ne!(a.version, b.version, "versions are unique in a namespace");

    write(
        store,
        &ns,
        vec![delete(b"a"), put(b"b", b"3"), put(b"c", b"4")],
    )
    .await;
    assert_eq!(get(store, &ns, b"a").await, None);
    let b2 = get(store, &ns, b"b").await.expect("b is there");
    assert_eq!(b2.value, b"3");
    assert!(b2.version > b.version, "{} > {}", b2.version, b.version);
    assert_eq!(get(store, &ns, b"c").await.expect("c").value, b"4");
    assert_eq!(
        list_keys(store, &ns, b"", 10).await,
        vec![b"b".to_vec(), b"c".to_vec()]
    );
    // Deleting what is not there is no error.
    write(store, &ns, vec![delete(b"never")]).await;
}

/// A key deleted (by a commit or `delete_now`) and written again gets a
/// version it never had.
pub async fn versions_are_never_reused(store: &impl Backend) {
    let ns = unique_name("versions");
    let mut seen = Vec::new();
    for round in 0..3 {
        write(store, &ns, vec![put(b"k", b"v")]).await;
        seen.push(version(store, &ns, b"k").await);
        if round % 2 == 0 {
            write(store, &ns, vec![delete(b"k")]).await;
        } else {
            assert!(store.delete_now(&ns, b"k", now_ms()).await.unwrap());
        }
        assert_eq!(get(store, &ns, b"k").await, None);
    }
    write(store, &ns, vec![put(b"k", b"v")]).await;
    seen.push(version(store, &ns, b"k").await);
    let mut sorted = seen.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted, seen, "versions grow and never repeat");
}

/// An entry reads as absent (and is not listed) once it expires.
pub async fn ttl_expiry_for_get_and_list(store: &impl Backend) {
    let ns = unique_name("ttl");
    let expires = now_ms() + SHORT.as_millis() as u64;
    write(
        store,
        &ns,
        vec![put_until(b"short", b"v", expires), put(b"stays", b"v")],
    )
    .await;
    let entry = get(store, &ns, b"short")
        .await
        .expect("live before its expiry");
    assert_eq!(entry.expires_at_ms, Some(expires));
    assert_eq!(
        list_keys(store, &ns, b"", 10).await,
        vec![b"short".to_vec(), b"stays".to_vec()]
    );
    // The store answers by the clock it is given.
    assert_eq!(store.get(&ns, b"short", expires).await.unwrap(), None);
    assert!(
        store
            .get(&ns, b"short", expires - 1)
            .await
            .unwrap()
            .is_some()
    );

    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(get(store, &ns, b"short").await, None);
    assert_eq!(
        list_keys(store, &ns, b"", 10).await,
        vec![b"stays".to_vec()]
    );
    // An expired key is absent for version checks too.
    write(store, &ns, vec![expecting(put(b"short", b"again"), ABSENT)]).await;
    assert_eq!(get(store, &ns, b"short").await.unwrap().expires_at_ms, None);
}

/// A write expecting a version the key no longer has applies nothing of
/// its commit, not even the done record.
pub async fn expected_version_conflict_applies_nothing(store: &impl Backend) {
    let ns = unique_name("conflict");
    write(store, &ns, vec![put(b"k", b"1")]).await;
    let v1 = version(store, &ns, b"k").await;
    write(store, &ns, vec![expecting(put(b"k", b"2"), v1)]).await;
    let v2 = version(store, &ns, b"k").await;
    assert!(v2 > v1);

    let stale = commit_of(
        &ns,
        vec![put(b"other", b"x"), expecting(put(b"k", b"3"), v1)],
    );
    assert_eq!(
        store.commit(&stale).await.unwrap(),
        Committed::Conflict { key: b"k".to_vec() }
    );
    assert_eq!(get(store, &ns, b"k").await.unwrap().value, b"2");
    assert_eq!(get(store, &ns, b"other").await, None);
    assert!(
        !is_done(store, &stale.done).await,
        "a conflict writes no done record"
    );
    // A delete may expect a version too.
    let stale_delete = commit_of(&ns, vec![expecting(delete(b"k"), v1)]);
    assert_eq!(
        store.commit(&stale_delete).await.unwrap(),
        Committed::Conflict { key: b"k".to_vec() }
    );
    write(store, &ns, vec![expecting(delete(b"k"), v2)]).await;
    assert_eq!(get(store, &ns, b"k").await, None);
}

/// Version ABSENT: only if the key does not exist.
pub async fn absent_expectation(store: &impl Backend) {
    let ns = unique_name("absent");
    write(store, &ns, vec![expecting(put(b"k", b"first"), ABSENT)]).await;
    let second = commit_of(&ns, vec![expecting(put(b"k", b"second"), ABSENT)]);
    assert_eq!(
        store.commit(&second).await.unwrap(),
        Committed::Conflict { key: b"k".to_vec() }
    );
    assert_eq!(get(store, &ns, b"k").await.unwrap().value, b"first");
}

/// A reservation holds its keys against another token's reserve and
/// commit, and its own commit releases them.
pub async fn reservation_holds_keys_until_commit(store: &impl Backend) {
    let ns = unique_name("reserve");
    write(store, &ns, vec![put(b"k", b"1")]).await;
    let v = version(store, &ns, b"k").await;

    assert_eq!(
        reserve(store, &ns, &[(b"k", v), (b"new", ABSENT)], "t1", LONG).await,
        Reserved::Held
    );
    // Its own again: still held.
    assert_eq!(
        reserve(store, &ns, &[(b"k", v)], "t1", LONG).await,
        Reserved::Held
    );
    assert_eq!(
        reserve(store, &ns, &[(b"k", v)], "t2", LONG).await,
        Reserved::Conflict { key: b"k".to_vec() }
    );
    let mut other = commit_of(&ns, vec![expecting(put(b"k", b"2"), v)]);
    other.reservation = Some("t2".into());
    assert_eq!(
        store.commit(&other).await.unwrap(),
        Committed::Conflict { key: b"k".to_vec() }
    );
    assert!(!is_done(store, &other.done).await);

    let mut own = commit_of(
        &ns,
        vec![
            expecting(put(b"k", b"3"), v),
            expecting(put(b"new", b"n"), ABSENT),
        ],
    );
    own.reservation = Some("t1".into());
    apply(store, &own).await;
    assert_eq!(get(store, &ns, b"k").await.unwrap().value, b"3");

    let v3 = version(store, &ns, b"k").await;
    let vn = version(store, &ns, b"new").await;
    assert_eq!(
        reserve(store, &ns, &[(b"k", v3), (b"new", vn)], "t2", LONG).await,
        Reserved::Held,
        "the commit released t1's keys"
    );
    store
        .release_reservation(&ns, &[b"k".to_vec(), b"new".to_vec()], "t2")
        .await
        .unwrap();
}

/// A reservation that finds a key changed (or held) holds none of its keys.
pub async fn reservation_conflict_holds_nothing(store: &impl Backend) {
    let ns = unique_name("reserve-none");
    write(store, &ns, vec![put(b"b", b"1")]).await;
    let vb = version(store, &ns, b"b").await;
    assert_eq!(
        reserve(store, &ns, &[(b"a", ABSENT), (b"b", vb + 1000)], "t1", LONG).await,
        Reserved::Conflict { key: b"b".to_vec() }
    );
    assert_eq!(
        reserve(store, &ns, &[(b"a", ABSENT)], "t2", LONG).await,
        Reserved::Held
    );
    // Held by t2 now: t3's reservation of a and c holds neither.
    assert_eq!(
        reserve(store, &ns, &[(b"c", ABSENT), (b"a", ABSENT)], "t3", LONG).await,
        Reserved::Conflict { key: b"a".to_vec() }
    );
    assert_eq!(
        reserve(store, &ns, &[(b"c", ABSENT)], "t4", LONG).await,
        Reserved::Held
    );
    // A key that exists does not match ABSENT.
    assert_eq!(
        reserve(store, &ns, &[(b"b", ABSENT)], "t5", LONG).await,
        Reserved::Conflict { key: b"b".to_vec() }
    );
}

/// `release_reservation` frees the keys of its token, and only of it.
pub async fn reservation_released_by_release_reservation(store: &impl Backend) {
    let ns = unique_name("release");
    let keys = [b"a".to_vec(), b"b".to_vec()];
    assert_eq!(
        reserve(store, &ns, &[(b"a", ABSENT), (b"b", ABSENT)], "t1", LONG).await,
        Reserved::Held
    );
    store.release_reservation(&ns, &keys, "t2").await.unwrap();
    assert_eq!(
        reserve(store, &ns, &[(b"a", ABSENT)], "t3", LONG).await,
        Reserved::Conflict { key: b"a".to_vec() },
        "another token's release leaves the reservation"
    );
    store.release_reservation(&ns, &keys, "t1").await.unwrap();
    assert_eq!(
        reserve(store, &ns, &[(b"a", ABSENT), (b"b", ABSENT)], "t3", LONG).await,
        Reserved::Held
    );
    // A commit of t1 (released) does not touch t3's hold.
    let mut late = commit_of(&ns, vec![put(b"a", b"x")]);
    late.reservation = Some("t1".into());
    assert_eq!(
        store.commit(&late).await.unwrap(),
        Committed::Conflict { key: b"a".to_vec() }
    );
}

/// A reservation nobody commits ends with its lease.
pub async fn reservation_expires_after_its_lease(store: &impl Backend) {
    let ns = unique_name("lease");
    assert_eq!(
        reserve(store, &ns, &[(b"k", ABSENT)], "t1", SHORT).await,
        Reserved::Held
    );
    assert_eq!(
        reserve(store, &ns, &[(b"k", ABSENT)], "t2", LONG).await,
        Reserved::Conflict { key: b"k".to_vec() }
    );
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(
        reserve(store, &ns, &[(b"k", ABSENT)], "t2", LONG).await,
        Reserved::Held
    );
    store
        .release_reservation(&ns, &[b"k".to_vec()], "t2")
        .await
        .unwrap();
    // And a commit without a reservation may then write it.
    write(store, &ns, vec![put(b"k", b"v")]).await;
}

/// A plain (unchecked) write to a key another input reserves waits for it:
/// the commit conflicts, so that the reserving input's checked version
/// still holds at its commit.
pub async fn plain_write_to_a_reserved_key_conflicts(store: &impl Backend) {
    let ns = unique_name("plain");
    assert_eq!(
        reserve(store, &ns, &[(b"k", ABSENT)], "t1", LONG).await,
        Reserved::Held
    );
    let plain = commit_of(&ns, vec![put(b"free", b"x"), put(b"k", b"plain")]);
    assert_eq!(
        store.commit(&plain).await.unwrap(),
        Committed::Conflict { key: b"k".to_vec() }
    );
    assert_eq!(get(store, &ns, b"free").await, None);
    store
        .release_reservation(&ns, &[b"k".to_vec()], "t1")
        .await
        .unwrap();
    apply(store, &plain).await;
}

/// Past `max_keys`: refused, the limit named, nothing applied.
pub async fn quota_of_keys_refuses_and_applies_nothing(store: &impl Backend) {
    let ns = unique_name("quota-keys");
    let quota = Quota {
        max_keys: 2,
        max_bytes: 1 << 20,
    };
    let mut first = commit_of(&ns, vec![put(b"a", b"1"), put(b"b", b"2")]);
    first.quota = quota;
    apply(store, &first).await;

    let mut third = commit_of(&ns, vec![put(b"a", b"11"), put(b"c", b"3")]);
    third.quota = quota;
    match store.commit(&third).await.unwrap() {
        Committed::OverQuota { reason } => {
            assert!(reason.contains(&format!("\"{ns}\"")), "{reason}");
            assert!(reason.contains("max_keys"), "{reason}");
            assert!(reason.contains("3 keys"), "{reason}");
            assert!(reason.contains('2'), "{reason}");
        }
        other => panic!("expected OverQuota, got {other:?}"),
    }
    assert_eq!(get(store, &ns, b"c").await, None);
    assert_eq!(get(store, &ns, b"a").await.unwrap().value, b"1");
    assert!(
        !is_done(store, &third.done).await,
        "a refusal writes no done record"
    );
    assert_eq!(usage(store, &ns).await, Usage { keys: 2, bytes: 4 });

    // Replacing a key, or deleting one to make room, is within it.
    let mut swap = commit_of(&ns, vec![put(b"a", b"11"), delete(b"b"), put(b"c", b"3")]);
    swap.quota = quota;
    apply(store, &swap).await;
    assert_eq!(usage(store, &ns).await, Usage { keys: 2, bytes: 5 });
}

/// Past `max_bytes` (keys plus values): refused, the limit named, nothing
/// applied.
pub async fn quota_of_bytes_refuses_and_applies_nothing(store: &impl Backend) {
    let ns = unique_name("quota-bytes");
    let quota = Quota {
        max_keys: 100,
        max_bytes: 20,
    };
    let mut first = commit_of(&ns, vec![put(b"a", &[7; 10])]);
    first.quota = quota;
    apply(store, &first).await;
    assert_eq!(usage(store, &ns).await, Usage { keys: 1, bytes: 11 });

    let mut second = commit_of(&ns, vec![put(b"b", &[7; 10])]);
    second.quota = quota;
    match store.commit(&second).await.unwrap() {
        Committed::OverQuota { reason } => {
            assert!(reason.contains(&format!("\"{ns}\"")), "{reason}");
            assert!(reason.contains("max_bytes"), "{reason}");
            assert!(reason.contains("22 bytes"), "{reason}");
            assert!(reason.contains("20"), "{reason}");
        }
        other => panic!("expected OverQuota, got {other:?}"),
    }
    assert_eq!(get(store, &ns, b"b").await, None);
    assert!(!is_done(store, &second.done).await);
    assert_eq!(usage(store, &ns).await, Usage { keys: 1, bytes: 11 });

    // Exactly at the limit is within it.
    let mut exact = commit_of(&ns, vec![put(b"b", &[7; 8])]);
    exact.quota = quota;
    apply(store, &exact).await;
    assert_eq!(usage(store, &ns).await, Usage { keys: 2, bytes: 20 });
}

/// Keys that expired no longer count against the quota at commit.
pub async fn quota_ignores_expired_keys(store: &impl Backend) {
    let ns = unique_name("quota-expired");
    let quota = Quota {
        max_keys: 1,
        max_bytes: 1 << 20,
    };
    let mut first = commit_of(
        &ns,
        vec![put_until(b"a", b"1", now_ms() + SHORT.as_millis() as u64)],
    );
    first.quota = quota;
    apply(store, &first).await;
    let mut early = commit_of(&ns, vec![put(b"b", b"2")]);
    early.quota = quota;
    assert!(matches!(
        store.commit(&early).await.unwrap(),
        Committed::OverQuota { .. }
    ));
    tokio::time::sleep(PAST_SHORT).await;
    let mut late = commit_of(&ns, vec![put(b"b", b"2")]);
    late.quota = quota;
    apply(store, &late).await;
    assert_eq!(usage(store, &ns).await, Usage { keys: 1, bytes: 2 });
}

/// A namespace over a quota that was lowered may still shrink (and keep
/// its size), but not grow.
pub async fn quota_lets_an_over_quota_namespace_shrink(store: &impl Backend) {
    let ns = unique_name("quota-lowered");
    write(
        store,
        &ns,
        vec![put(b"a", b"1"), put(b"b", b"2"), put(b"c", b"3")],
    )
    .await;
    let lowered = Quota {
        max_keys: 1,
        max_bytes: 1 << 20,
    };
    let mut grow = commit_of(&ns, vec![put(b"d", b"4")]);
    grow.quota = lowered;
    assert!(matches!(
        store.commit(&grow).await.unwrap(),
        Committed::OverQuota { .. }
    ));
    let mut shrink = commit_of(&ns, vec![delete(b"a"), put(b"b", b"22")]);
    shrink.quota = lowered;
    apply(store, &shrink).await;
    assert_eq!(usage(store, &ns).await, Usage { keys: 2, bytes: 5 });
}

/// Usage counts keys and bytes (key plus value) and drops as keys are
/// deleted and expire.
pub async fn usage_counts_and_drops_after_expiry(store: &impl Backend) {
    let ns = unique_name("usage");
    let soon = now_ms() + SHORT.as_millis() as u64;
    write(
        store,
        &ns,
        vec![
            put(b"aa", b"123"),
            put_until(b"b", b"12345", soon),
            put_until(b"c", b"1", soon),
        ],
    )
    .await;
    assert_eq!(usage(store, &ns).await, Usage { keys: 3, bytes: 13 });
    write(store, &ns, vec![put(b"aa", b"1234567")]).await;
    assert_eq!(usage(store, &ns).await, Usage { keys: 3, bytes: 17 });
    write(store, &ns, vec![delete(b"c")]).await;
    assert_eq!(usage(store, &ns).await, Usage { keys: 2, bytes: 15 });
    tokio::time::sleep(PAST_SHORT).await;
    usage_becomes(store, &ns, Usage { keys: 1, bytes: 9 }).await;
    assert!(store.delete_now(&ns, b"aa", now_ms()).await.unwrap());
    assert_eq!(usage(store, &ns).await, Usage::default());
}

/// The done record: `is_done`, and a second commit of the same input is
/// AlreadyDone with none of its writes applied.
pub async fn done_record_makes_a_second_commit_already_done(store: &impl Backend) {
    let ns = unique_name("done");
    let first = commit_of(&ns, vec![put(b"k", b"1")]);
    assert!(!is_done(store, &first.done).await);
    apply(store, &first).await;
    assert!(is_done(store, &first.done).await);

    let mut again = commit_of(&ns, vec![put(b"k", b"2"), put(b"other", b"x")]);
    again.done = first.done.clone();
    assert_eq!(store.commit(&again).await.unwrap(), Committed::AlreadyDone);
    assert_eq!(get(store, &ns, b"k").await.unwrap().value, b"1");
    assert_eq!(get(store, &ns, b"other").await, None);

    // Done is per queue: the same id on another queue is not done.
    let elsewhere = InputKey {
        queue: unique_name("queue"),
        id: first.done.id.clone(),
    };
    assert!(!is_done(store, &elsewhere).await);
}

/// A done record is kept for its retention, then forgotten.
pub async fn done_record_expires_after_its_retention(store: &impl Backend) {
    let ns = unique_name("retention");
    let mut first = commit_of(&ns, vec![put(b"k", b"1")]);
    first.retention = SHORT;
    apply(store, &first).await;
    assert!(is_done(store, &first.done).await);
    tokio::time::sleep(PAST_SHORT).await;
    assert!(!is_done(store, &first.done).await);
    let mut again = commit_of(&ns, vec![put(b"k", b"2")]);
    again.done = first.done.clone();
    apply(store, &again).await;
    assert_eq!(get(store, &ns, b"k").await.unwrap().value, b"2");
}

/// Claims: taken, taken again by its holder, held elsewhere for another,
/// released by its holder only.
pub async fn claims(store: &impl Backend) {
    let id = input(&unique_name("claims"));
    assert_eq!(claim(store, &id, "host-a", LONG).await, Claim::Taken);
    assert_eq!(claim(store, &id, "host-a", LONG).await, Claim::Taken);
    match claim(store, &id, "host-b", LONG).await {
        Claim::HeldElsewhere { holder, expires_in } => {
            assert_eq!(holder, "host-a");
            assert!(expires_in <= LONG, "{expires_in:?}");
            assert!(
                expires_in > LONG - Duration::from_secs(10),
                "{expires_in:?}"
            );
        }
        other => panic!("expected HeldElsewhere, got {other:?}"),
    }
    store.release_claim(&id, "host-b").await.unwrap();
    assert!(
        matches!(
            claim(store, &id, "host-b", LONG).await,
            Claim::HeldElsewhere { .. }
        ),
        "another holder's release leaves the claim"
    );
    store.release_claim(&id, "host-a").await.unwrap();
    assert_eq!(claim(store, &id, "host-b", LONG).await, Claim::Taken);
    // Claims are per queue.
    let elsewhere = InputKey {
        queue: unique_name("claims"),
        id: id.id.clone(),
    };
    assert_eq!(claim(store, &elsewhere, "host-a", LONG).await, Claim::Taken);
}

/// A claim ends with its lease; a holder's re-claim renews it.
pub async fn claim_expires_after_its_lease(store: &impl Backend) {
    let id = input(&unique_name("claim-lease"));
    assert_eq!(claim(store, &id, "host-a", SHORT).await, Claim::Taken);
    match claim(store, &id, "host-b", LONG).await {
        Claim::HeldElsewhere { expires_in, .. } => assert!(expires_in <= SHORT, "{expires_in:?}"),
        other => panic!("expected HeldElsewhere, got {other:?}"),
    }
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(claim(store, &id, "host-b", SHORT).await, Claim::Taken);
    // Renewed halfway through: still held after the first lease would end.
    tokio::time::sleep(SHORT / 2).await;
    assert_eq!(claim(store, &id, "host-b", LONG).await, Claim::Taken);
    tokio::time::sleep(SHORT).await;
    assert!(matches!(
        claim(store, &id, "host-a", LONG).await,
        Claim::HeldElsewhere { .. }
    ));
}

/// An input already done is a duplicate to whoever claims it.
pub async fn claim_of_a_done_input_is_done(store: &impl Backend) {
    let ns = unique_name("claim-done");
    let commit = commit_of(&ns, vec![]);
    apply(store, &commit).await;
    assert_eq!(
        claim(store, &commit.done, "host-a", LONG).await,
        Claim::Done
    );
}

/// A commit releases the claim of the holder it names, and no other.
pub async fn commit_releases_the_claim_of_its_holder_only(store: &impl Backend) {
    let ns = unique_name("claim-commit");
    // (The done record hides the claim from `claim`; a short retention
    // lets the claim itself be seen afterwards.)
    let mut own = commit_of(&ns, vec![put(b"k", b"v")]);
    own.retention = SHORT;
    own.claim_holder = Some("host-a".into());
    assert_eq!(claim(store, &own.done, "host-a", LONG).await, Claim::Taken);
    apply(store, &own).await;

    let mut others = commit_of(&ns, vec![]);
    others.retention = SHORT;
    others.claim_holder = Some("host-b".into());
    assert_eq!(
        claim(store, &others.done, "host-a", LONG).await,
        Claim::Taken
    );
    apply(store, &others).await;

    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(claim(store, &own.done, "host-c", LONG).await, Claim::Taken);
    match claim(store, &others.done, "host-c", LONG).await {
        Claim::HeldElsewhere { holder, .. } => assert_eq!(holder, "host-a"),
        other => panic!("expected host-a's claim left alone, got {other:?}"),
    }
}

/// A commit without a namespace (`idempotent` without `state`) keeps the
/// done record and releases the claim.
pub async fn commit_without_namespace_keeps_the_done_record(store: &impl Backend) {
    let mut commit = commit_of("unused", vec![]);
    commit.namespace = None;
    commit.claim_holder = Some("host-a".into());
    assert_eq!(
        claim(store, &commit.done, "host-a", LONG).await,
        Claim::Taken
    );
    apply(store, &commit).await;
    assert!(is_done(store, &commit.done).await);
    assert_eq!(store.commit(&commit).await.unwrap(), Committed::AlreadyDone);
}

/// Namespaces never see each other's keys, even when their names and keys
/// would run together.
pub async fn namespaces_are_isolated(store: &impl Backend) {
    let base = unique_name("iso");
    let one = base.clone();
    let two = format!("{base}:k:b");
    write(store, &one, vec![put(b"b:k:c", b"one")]).await;
    write(store, &two, vec![put(b"c", b"two")]).await;
    assert_eq!(get(store, &one, b"b:k:c").await.unwrap().value, b"one");
    assert_eq!(get(store, &two, b"c").await.unwrap().value, b"two");
    assert_eq!(get(store, &two, b"b:k:c").await, None);
    assert_eq!(get(store, &one, b"c").await, None);
    assert_eq!(
        list_keys(store, &one, b"", 10).await,
        vec![b"b:k:c".to_vec()]
    );
    assert_eq!(list_keys(store, &two, b"", 10).await, vec![b"c".to_vec()]);
    assert_eq!(usage(store, &one).await.keys, 1);
    assert_eq!(usage(store, &two).await.keys, 1);
    // A reservation in one does not hold the same key in another.
    let three = unique_name("iso");
    assert_eq!(
        reserve(store, &one, &[(b"x", ABSENT)], "t1", LONG).await,
        Reserved::Held
    );
    assert_eq!(
        reserve(store, &three, &[(b"x", ABSENT)], "t2", LONG).await,
        Reserved::Held
    );
    assert!(store.delete_now(&two, b"c", now_ms()).await.unwrap());
    assert_eq!(get(store, &one, b"b:k:c").await.unwrap().value, b"one");
}

/// Keys and values are bytes, not text.
pub async fn binary_keys_and_values(store: &impl Backend) {
    let ns = unique_name("binary");
    let key: &[u8] = b"\xff\x00\xfe:k:\x80";
    let value: &[u8] = b"\x00\xff\x00\r\n";
    write(store, &ns, vec![put(key, value), put(b"\xff", b"")]).await;
    let entry = get(store, &ns, key).await.expect("the binary key");
    assert_eq!(entry.value, value);
    assert_eq!(get(store, &ns, b"\xff").await.unwrap().value, b"");
    assert_eq!(get(store, &ns, b"\xff\x00\xfe").await, None);
    let listed = store.list(&ns, b"\xff", 10, now_ms()).await.unwrap();
    assert_eq!(
        listed,
        vec![
            (b"\xff".to_vec(), get(store, &ns, b"\xff").await.unwrap()),
            (key.to_vec(), entry.clone()),
        ]
    );
    let v = entry.version;
    assert_eq!(
        reserve(store, &ns, &[(key, v)], "t1", LONG).await,
        Reserved::Held
    );
    let mut checked = commit_of(&ns, vec![expecting(put(key, b"2"), v)]);
    checked.reservation = Some("t1".into());
    apply(store, &checked).await;
    assert_eq!(
        usage(store, &ns).await,
        Usage {
            keys: 2,
            bytes: 7 + 1 + 1
        }
    );
    assert!(store.delete_now(&ns, key, now_ms()).await.unwrap());
    assert_eq!(get(store, &ns, key).await, None);
}

/// `list`: live keys starting with the prefix, in byte order, at most
/// `limit`.
pub async fn list_with_prefix_and_limit_in_key_order(store: &impl Backend) {
    let ns = unique_name("list");
    let keys: [&[u8]; 8] = [b"b", b"a2", b"a1", b"a10", b"a\xff", b"ab", b"c", b"a"];
    write(store, &ns, keys.iter().map(|k| put(k, b"v")).collect()).await;
    write(
        store,
        &ns,
        vec![put_until(b"a3", b"v", now_ms() + SHORT.as_millis() as u64)],
    )
    .await;
    tokio::time::sleep(PAST_SHORT).await;
    let bytes = |keys: &[&[u8]]| keys.iter().map(|k| k.to_vec()).collect::<Vec<_>>();
    assert_eq!(
        list_keys(store, &ns, b"a", 10).await,
        bytes(&[b"a", b"a1", b"a10", b"a2", b"ab", b"a\xff"])
    );
    assert_eq!(list_keys(store, &ns, b"a", 2).await, bytes(&[b"a", b"a1"]));
    assert_eq!(
        list_keys(store, &ns, b"a1", 10).await,
        bytes(&[b"a1", b"a10"])
    );
    assert_eq!(
        list_keys(store, &ns, b"a\xff", 10).await,
        bytes(&[b"a\xff"])
    );
    assert_eq!(list_keys(store, &ns, b"d", 10).await, bytes(&[]));
    assert_eq!(list_keys(store, &ns, b"a", 0).await, bytes(&[]));
    assert_eq!(
        list_keys(store, &ns, b"", 100).await,
        bytes(&[b"a", b"a1", b"a10", b"a2", b"ab", b"a\xff", b"b", b"c"])
    );
    let entries = store.list(&ns, b"c", 10, now_ms()).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].1, get(store, &ns, b"c").await.unwrap());
}

/// `list` of more keys than a store may read at once, expired ones among
/// them.
pub async fn list_past_one_page(store: &impl Backend) {
    let ns = unique_name("list-many");
    let soon = now_ms() + SHORT.as_millis() as u64;
    let mut writes = Vec::new();
    for i in 0..2500u32 {
        let key = format!("k{i:05}");
        // Every third key expires.
        writes.push(if i % 3 == 0 {
            put_until(key.as_bytes(), b"v", soon)
        } else {
            put(key.as_bytes(), b"v")
        });
    }
    write(store, &ns, writes).await;
    tokio::time::sleep(PAST_SHORT).await;
    let live: Vec<Vec<u8>> = (0..2500u32)
        .filter(|i| i % 3 != 0)
        .map(|i| format!("k{i:05}").into_bytes())
        .collect();
    assert_eq!(list_keys(store, &ns, b"k", 5000).await, live);
    assert_eq!(
        list_keys(store, &ns, b"", 1200).await,
        live[..1200].to_vec()
    );
}

/// `delete_now`: removes a key at once, saying whether it was there.
pub async fn delete_now(store: &impl Backend) {
    let ns = unique_name("delete-now");
    write(
        store,
        &ns,
        vec![
            put(b"k", b"value"),
            put_until(b"gone", b"v", now_ms() + SHORT.as_millis() as u64),
        ],
    )
    .await;
    let before = usage(store, &ns).await;
    assert!(store.delete_now(&ns, b"k", now_ms()).await.unwrap());
    assert_eq!(get(store, &ns, b"k").await, None);
    assert_eq!(
        usage(store, &ns).await,
        Usage {
            keys: before.keys - 1,
            bytes: before.bytes - 6
        }
    );
    assert!(!store.delete_now(&ns, b"k", now_ms()).await.unwrap());
    tokio::time::sleep(PAST_SHORT).await;
    assert!(
        !store.delete_now(&ns, b"gone", now_ms()).await.unwrap(),
        "an expired key was not there"
    );
    assert_eq!(usage(store, &ns).await, Usage::default());
}

/// Concurrent read-check-write increments, as the host runs them (read,
/// reserve the read version, commit expecting it, again on conflict):
/// none is lost and none is applied twice.
pub async fn increments_under_contention(store: &impl Backend) {
    let ns = unique_name("contention");
    const WORKERS: u64 = 16;
    let one = |worker: u64| {
        let ns = ns.clone();
        async move {
            let token = format!("worker-{worker}");
            let mut attempts = 0;
            loop {
                attempts += 1;
                assert!(attempts < 1000, "worker {worker} never committed");
                let entry = get(store, &ns, b"n").await;
                let (seen, n) = match &entry {
                    Some(e) => (
                        e.version,
                        std::str::from_utf8(&e.value).unwrap().parse().unwrap(),
                    ),
                    None => (ABSENT, 0u64),
                };
                let checks = [(b"n".to_vec(), seen)];
                let held = store
                    .reserve(&ns, &checks, &token, LONG, now_ms())
                    .await
                    .unwrap();
                if held != Reserved::Held {
                    tokio::task::yield_now().await;
                    continue;
                }
                let mut commit = commit_of(
                    &ns,
                    vec![expecting(put(b"n", (n + 1).to_string().as_bytes()), seen)],
                );
                commit.reservation = Some(token.clone());
                match store.commit(&commit).await.unwrap() {
                    Committed::Applied => return,
                    Committed::Conflict { .. } => {
                        store
                            .release_reservation(&ns, &[b"n".to_vec()], &token)
                            .await
                            .unwrap();
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
    };
    futures::future::join_all((0..WORKERS).map(one)).await;
    assert_eq!(
        get(store, &ns, b"n").await.unwrap().value,
        WORKERS.to_string().as_bytes()
    );
}
