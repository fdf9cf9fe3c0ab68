//! The lease contract every store must keep (terms, tokens, expiry,
//! release, presence, one-shot claims), as one body of checks:
//! `tests/store_conformance.rs` runs each as its own test against every
//! backend, and `tests/store_tls.rs` runs them all against stores
//! opened over TLS. Each check takes a fresh store (its own table or key
//! namespace).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rolegate::store::{Changes, Claim, Cursor, InstanceInfo, LeaseStore, MemberChanges, RoleName};
use rolegate::{Coordinator, CoordinatorBuilder, LeaseTimings};

/// `for_each_check!(m!(args))` calls `m!(args; check, check, ...)` with the
/// name of every check.
macro_rules! for_each_check {
    ($m:ident ! ($($args:tt)*)) => {
        $m! { $($args)*;
            first_acquire_is_granted,
            concurrent_acquirers_have_exactly_one_winner,
            renew_keeps_the_token,
            renew_after_expiry_is_refused_once_taken_over,
            renewal_of_an_expired_term_starts_a_new_term,
            release_lets_another_acquire_with_a_greater_token,
            snapshot_reports_holders_tokens_and_time_left,
            release_notification_reaches_a_waiting_instance,
            names_over_128_bytes_are_refused,
            batched_claims_cover_many_roles_in_one_call,
            presence_lists_live_members_and_forgets_gone_ones,
            one_shot_claims_from_one_instance_have_exactly_one_winner,
            one_shot_claim_is_refused_while_the_first_is_valid,
            one_shot_lease_expires_and_the_next_claim_gets_a_greater_token,
            partition_definition_has_one_first_record_and_changes_only_from_its_epoch,
            partition_definition_change_settles_by_the_store_clock_and_wakes_subscribers,
            presence_carries_each_members_route_fingerprint,
            changes_name_term_changes_and_ending_holders_only,
            presence_changes_name_joins_changes_and_departures_only
        }
    };
}
#[allow(unused_imports)]
pub(crate) use for_each_check;

/// Runs every check in turn, each on a fresh store from `make`.
pub async fn run_all<F, Fut>(mut make: F, scale: Scale)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Arc<dyn LeaseStore>>,
{
    macro_rules! run {
        (; $($name:ident),*) => {
            $(
                eprintln!("conformance: {}", stringify!($name));
                $name(make().await, scale).await;
            )*
        };
    }
    for_each_check!(run!());
}

/// Short test durations, scaled for stores whose TTLs are coarse (etcd grants
/// whole seconds, at least 2 s, and revokes expired leases every ~0.5 s).
#[derive(Clone, Copy)]
pub struct Scale {
    pub factor: u64,
    /// Extra wait before a term counts as expired.
    pub slack_ms: u64,
}

impl Scale {
    pub const FINE: Scale = Scale {
        factor: 1,
        slack_ms: 0,
    };
    pub const SECONDS: Scale = Scale {
        factor: 10,
        slack_ms: 1_000,
    };

    pub fn ms(self, ms: u64) -> u64 {
        ms * self.factor
    }

    /// Sleeps until a term of `ms` (unscaled) has surely expired.
    pub async fn past(self, ms: u64) {
        tokio::time::sleep(Duration::from_millis(ms * self.factor + self.slack_ms)).await;
    }

    /// Sleeps as `past(ms)`, then reads with `read` until `done` holds,
    /// for up to 10 s more (scaled): on a busy machine a store may act on
    /// an expiry a moment late, and etcd counts leases in whole seconds.
    /// Gives the last value read, for the caller's assertion.
    pub async fn read_past<T, F, Fut>(self, ms: u64, mut read: F, done: impl Fn(&T) -> bool) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        self.past(ms).await;
        let deadline = std::time::Instant::now() + Duration::from_millis(10_000 * self.factor);
        loop {
            let value = read().await;
            if done(&value) || std::time::Instant::now() >= deadline {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

pub fn instance(n: u32) -> InstanceInfo {
    InstanceInfo {
        id: format!("inst-{n}-{:08x}", rand_suffix()),
        address: format!("http://127.0.0.1:{}", 10_000 + n),
    }
}

pub fn rand_suffix() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(1);
    N.fetch_add(1, Ordering::Relaxed)
        .wrapping_mul(2_654_435_761)
}

pub fn role(name: &str) -> RoleName {
    RoleName::new(name).expect("a valid role name")
}

pub fn roles(names: &[&str]) -> Vec<RoleName> {
    names.iter().map(|n| role(n)).collect()
}

pub fn claim(name: &str, held: Option<u64>, ms: u64) -> Claim {
    Claim::renewable(role(name), held, Duration::from_millis(ms))
}

pub async fn grant(
    store: &dyn LeaseStore,
    who: &InstanceInfo,
    role: &str,
    held: Option<u64>,
    ms: u64,
) -> Option<u64> {
    let grants = store
        .claim(who, &[claim(role, held, ms)])
        .await
        .expect("claim");
    assert!(grants.len() <= 1);
    grants.into_iter().find(|g| g.role == role).map(|g| g.token)
}

pub async fn registered(store: &Arc<dyn LeaseStore>, roles: &[&str]) {
    let roles = self::roles(roles);
    store.register(&roles).await.expect("register");
    // Registering twice is harmless.
    store.register(&roles).await.expect("register again");
}

pub async fn first_acquire_is_granted(store: Arc<dyn LeaseStore>, _scale: Scale) {
    registered(&store, &["alpha"]).await;
    let a = instance(1);
    let t = grant(&*store, &a, "alpha", None, 5_000)
        .await
        .expect("free role granted");
    assert!(t >= 1);
}

pub async fn concurrent_acquirers_have_exactly_one_winner(
    store: Arc<dyn LeaseStore>,
    scale: Scale,
) {
    registered(&store, &["contested"]).await;
    let rounds = if scale.factor > 1 { 3 } else { 5 };
    for round in 0..rounds {
        let role = "contested";
        let mut tasks = Vec::new();
        for n in 0..8 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let who = instance(n);
                grant(&*store, &who, role, None, scale.ms(400)).await
            }));
        }
        let mut winners = 0;
        for t in tasks {
            if t.await.expect("task").is_some() {
                winners += 1;
            }
        }
        assert_eq!(
            winners, 1,
            "round {round}: exactly one of 8 concurrent acquirers wins"
        );
        scale.past(450).await;
    }
}

pub async fn renew_keeps_the_token(store: Arc<dyn LeaseStore>, _scale: Scale) {
    registered(&store, &["r"]).await;
    let a = instance(1);
    let t = grant(&*store, &a, "r", None, 2_000).await.unwrap();
    for _ in 0..3 {
        assert_eq!(grant(&*store, &a, "r", Some(t), 2_000).await, Some(t));
    }
    let b = instance(2);
    assert_eq!(
        grant(&*store, &b, "r", None, 2_000).await,
        None,
        "held role is not granted to another"
    );
}

pub async fn renew_after_expiry_is_refused_once_taken_over(
    store: Arc<dyn LeaseStore>,
    scale: Scale,
) {
    registered(&store, &["x"]).await;
    let (a, b) = (instance(1), instance(2));
    let t1 = grant(&*store, &a, "x", None, scale.ms(200)).await.unwrap();
    scale.past(300).await;
    let t2 = grant(&*store, &b, "x", None, 5_000)
        .await
        .expect("expired role taken over");
    assert!(t2 > t1, "takeover bumps the token: {t1} -> {t2}");
    assert_eq!(
        grant(&*store, &a, "x", Some(t1), 5_000).await,
        None,
        "late renewal refused"
    );
}

pub async fn renewal_of_an_expired_term_starts_a_new_term(
    store: Arc<dyn LeaseStore>,
    scale: Scale,
) {
    registered(&store, &["y"]).await;
    let a = instance(1);
    let t1 = grant(&*store, &a, "y", None, scale.ms(150)).await.unwrap();
    scale.past(250).await;
    let t2 = grant(&*store, &a, "y", Some(t1), 1_000)
        .await
        .expect("free again");
    assert!(t2 > t1, "an expired term is never extended: {t1} -> {t2}");
    // A wrong token on an unexpired term of our own also starts a new term.
    let t3 = grant(&*store, &a, "y", Some(t2 + 100), 1_000)
        .await
        .unwrap();
    assert!(t3 > t2);
}

pub async fn release_lets_another_acquire_with_a_greater_token(
    store: Arc<dyn LeaseStore>,
    _scale: Scale,
) {
    registered(&store, &["rel"]).await;
    let (a, b) = (instance(1), instance(2));
    let t1 = grant(&*store, &a, "rel", None, 60_000).await.unwrap();
    // A release by someone else, or with the wrong token, does nothing.
    assert!(store
        .release(&b, &[(role("rel"), t1)])
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .release(&a, &[(role("rel"), t1 + 1)])
        .await
        .unwrap()
        .is_empty());
    assert_eq!(grant(&*store, &b, "rel", None, 60_000).await, None);
    assert_eq!(
        store.release(&a, &[(role("rel"), t1)]).await.unwrap(),
        vec!["rel".to_string()]
    );
    let t2 = grant(&*store, &b, "rel", None, 60_000)
        .await
        .expect("released role granted at once");
    assert!(t2 > t1);
}

pub async fn snapshot_reports_holders_tokens_and_time_left(
    store: Arc<dyn LeaseStore>,
    _scale: Scale,
) {
    registered(&store, &["s1", "s2", "s3"]).await;
    let (a, b) = (instance(1), instance(2));
    let t1 = grant(&*store, &a, "s1", None, 10_000).await.unwrap();
    let t2 = grant(&*store, &b, "s2", None, 10_000).await.unwrap();
    let names = roles(&["s1", "s2", "s3"]);
    let mut snap = store.snapshot(&names).await.unwrap();
    snap.sort_by(|x, y| x.role.cmp(&y.role));
    assert_eq!(snap.len(), 3);
    assert_eq!(snap[0].holder.as_deref(), Some(a.id.as_str()));
    assert_eq!(snap[0].holder_address.as_deref(), Some(a.address.as_str()));
    assert_eq!(snap[0].token, t1);
    assert!(
        snap[0].remaining > Duration::from_millis(8_000)
            && snap[0].remaining <= Duration::from_millis(10_000)
    );
    assert_eq!(snap[1].holder.as_deref(), Some(b.id.as_str()));
    assert_eq!(snap[1].token, t2);
    assert_eq!(snap[2].holder, None);
    assert_eq!(snap[2].remaining, Duration::ZERO);
    let all = store.snapshot(&[]).await.unwrap();
    assert!(all.len() >= 3);
}

pub async fn release_notification_reaches_a_waiting_instance(
    store: Arc<dyn LeaseStore>,
    _scale: Scale,
) {
    registered(&store, &["n"]).await;
    let a = instance(1);
    let t = grant(&*store, &a, "n", None, 60_000).await.unwrap();
    let mut feed = store.subscribe().await.expect("subscribe");
    // Drain anything queued before.
    tokio::time::sleep(Duration::from_millis(100)).await;
    while feed.try_recv().is_ok() {}
    store.release(&a, &[(role("n"), t)]).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), feed.recv())
        .await
        .expect("notification within 2s")
        .expect("feed open");
}

pub async fn names_over_128_bytes_are_refused(store: Arc<dyn LeaseStore>, _scale: Scale) {
    let a = instance(1);
    // A name over the limit cannot even be made, so no store ever sees one.
    let long = "r".repeat(129);
    assert!(RoleName::new(&long).is_err());
    let ok = "r".repeat(128);
    registered(&store, &[ok.as_str()]).await;
    assert!(grant(&*store, &a, &ok, None, 1_000).await.is_some());
}

pub async fn batched_claims_cover_many_roles_in_one_call(
    store: Arc<dyn LeaseStore>,
    _scale: Scale,
) {
    let names: Vec<RoleName> = (0..300)
        .map(|i| role(&format!("batch:partition-{i}")))
        .collect();
    store.register(&names).await.unwrap();
    let a = instance(1);
    let claims: Vec<Claim> = names.iter().map(|n| claim(n, None, 5_000)).collect();
    let grants = store.claim(&a, &claims).await.unwrap();
    assert_eq!(grants.len(), 300);
    let renew: Vec<Claim> = grants
        .iter()
        .map(|g| claim(&g.role, Some(g.token), 5_000))
        .collect();
    let again = store.claim(&a, &renew).await.unwrap();
    assert_eq!(again.len(), 300);
    for g in &grants {
        let renewed = again
            .iter()
            .find(|x| x.role == g.role)
            .expect("every role renewed");
        assert_eq!(
            renewed.token, g.token,
            "renewal keeps the token of {}",
            g.role
        );
    }
    let b = instance(2);
    assert!(store.claim(&b, &claims).await.unwrap().is_empty());
}

/// Presence: a record is listed while it lives, with its address and
/// candidacy; `leave` removes it at once; one not refreshed expires.
pub async fn presence_lists_live_members_and_forgets_gone_ones(
    store: Arc<dyn LeaseStore>,
    scale: Scale,
) {
    let (a, b, c) = (instance(1), instance(2), instance(3));
    let ttl = Duration::from_millis(scale.ms(300));
    let ids = |ms: &[rolegate::store::Member]| -> Vec<String> {
        let mut ids: Vec<String> = ms.iter().map(|m| m.id.clone()).collect();
        ids.sort();
        ids
    };
    let seen = store.presence(&a, true, "", ttl).await.expect("presence");
    assert!(ids(&seen).contains(&a.id), "{seen:?}");
    let seen = store.presence(&b, false, "", ttl).await.expect("presence");
    let mine = seen.iter().find(|m| m.id == b.id).expect("b listed");
    assert_eq!(mine.address, b.address);
    assert!(!mine.candidate);
    let other = seen.iter().find(|m| m.id == a.id).expect("a listed");
    assert!(other.candidate);
    store.leave(&b).await.expect("leave");
    let seen = store.presence(&a, true, "", ttl).await.unwrap();
    assert!(!ids(&seen).contains(&b.id), "b left: {seen:?}");
    // a stops refreshing: expired, it is no longer listed.
    let seen = scale
        .read_past(
            400,
            || store.presence(&c, true, "", ttl),
            |seen| seen.as_ref().is_ok_and(|seen| !ids(seen).contains(&a.id)),
        )
        .await
        .unwrap();
    assert!(!ids(&seen).contains(&a.id), "a expired: {seen:?}");
    assert!(ids(&seen).contains(&c.id));
}

/// Presence records carry the route-table fingerprint each member wrote,
/// and a member without one reads back as empty.
pub async fn presence_carries_each_members_route_fingerprint(
    store: Arc<dyn LeaseStore>,
    scale: Scale,
) {
    let (a, b) = (instance(1), instance(2));
    let ttl = Duration::from_millis(scale.ms(2_000));
    let fp = r#"{"fold":true,"routes":{"/a b":"0badf00d"}}"#;
    store.presence(&a, true, fp, ttl).await.expect("presence");
    let seen = store.presence(&b, true, "", ttl).await.expect("presence");
    let of = |id: &str| seen.iter().find(|m| m.id == id).expect("listed");
    assert_eq!(of(&a.id).routes, fp);
    assert_eq!(of(&a.id).address, a.address);
    assert_eq!(of(&b.id).routes, "");
    assert!(of(&b.id).candidate);
}

/// Two instances recording different definitions of one partition see the
/// same winner; a change applies only from the epoch it was read at, so of
/// two racing changes one wins.
pub async fn partition_definition_has_one_first_record_and_changes_only_from_its_epoch(
    store: Arc<dyn LeaseStore>,
    _scale: Scale,
) {
    assert!(store.partitions().await.expect("read").is_empty());
    let (x, y) = tokio::join!(
        store.define_partition("devices", "count=12"),
        store.define_partition("devices", "count=16"),
    );
    let (x, y) = (x.expect("define"), y.expect("define"));
    assert_eq!(x, y, "both see the same record");
    assert_eq!(x.epoch, 1);
    assert!(
        x.settling.is_zero(),
        "a first record does not settle: {x:?}"
    );
    let winner = x.definition.clone();
    // Defining again changes nothing.
    let again = store.define_partition("devices", "count=99").await.unwrap();
    assert_eq!(again.definition, winner);
    // A change from a stale epoch is refused; from the current one it
    // applies, once.
    let settle = Duration::from_secs(30);
    assert_eq!(
        store
            .redefine_partition("devices", 7, "count=20", settle)
            .await
            .unwrap(),
        None
    );
    let (a, b) = tokio::join!(
        store.redefine_partition("devices", 1, "count=20", settle),
        store.redefine_partition("devices", 1, "count=24", settle),
    );
    let won: Vec<_> = [a.unwrap(), b.unwrap()].into_iter().flatten().collect();
    assert_eq!(won.len(), 1, "one of two racing changes wins: {won:?}");
    assert_eq!(won[0].epoch, 2);
    let all = store.partitions().await.unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0].definition, won[0].definition);
    assert_eq!(all[0].epoch, 2);
    // A partition with no record yet is changed from epoch 0.
    let other = store
        .redefine_partition("orders", 0, "count=4", settle)
        .await
        .unwrap()
        .expect("recorded");
    assert_eq!(other.epoch, 1);
    assert_eq!(store.partitions().await.unwrap().len(), 2);
}

/// A change settles for the time asked, by the store's clock (the time
/// left goes down and reaches zero), and wakes a subscriber.
pub async fn partition_definition_change_settles_by_the_store_clock_and_wakes_subscribers(
    store: Arc<dyn LeaseStore>,
    scale: Scale,
) {
    store.define_partition("devices", "count=12").await.unwrap();
    let mut feed = store.subscribe().await.expect("subscribe");
    // Only notices from here on count: drain until the feed has been quiet
    // for a while (a store may still deliver the first record's notice).
    while let Ok(Some(())) = tokio::time::timeout(Duration::from_millis(300), feed.recv()).await {}
    let settle = Duration::from_millis(scale.ms(1_000));
    let changed = store
        .redefine_partition("devices", 1, "count=16", settle)
        .await
        .unwrap()
        .expect("changed");
    assert!(!changed.settling.is_zero() && changed.settling <= settle + Duration::from_secs(1));
    tokio::time::timeout(Duration::from_secs(5), feed.recv())
        .await
        .expect("a change notice within 5 s")
        .expect("the feed is open");
    let read = store.partitions().await.unwrap();
    assert!(!read[0].settling.is_zero(), "still settling: {read:?}");
    assert_eq!(read[0].definition, "count=16");
    let read = scale
        .read_past(
            1_300,
            || store.partitions(),
            |read| read.as_ref().is_ok_and(|r| r[0].settling.is_zero()),
        )
        .await
        .unwrap();
    assert!(read[0].settling.is_zero(), "settled: {read:?}");
}

/// A coordinator (one instance) on `store`, its loop holding a role of its
/// own, for the one-shot checks: `try_acquire` is what a user calls.
async fn one_shot_coordinator(store: &Arc<dyn LeaseStore>, scale: Scale) -> Coordinator {
    let timings = LeaseTimings {
        duration: Duration::from_millis(scale.ms(1_000)),
        renew_interval: Duration::from_millis(scale.ms(300)),
        safety_margin: Duration::from_millis(scale.ms(200)),
    };
    let c = CoordinatorBuilder::new(store.clone())
        .instance_name("once")
        .advertise("http://127.0.0.1:10999")
        .role("loop-held", timings)
        .start()
        .expect("coordinator starts");
    c.ready(Duration::from_secs(10 * scale.factor))
        .await
        .expect("coordinator ready");
    c
}

/// Several one-shot claims of one free role from tasks of one instance at
/// once: exactly one wins (a timer firing twice must not run the job twice).
pub async fn one_shot_claims_from_one_instance_have_exactly_one_winner(
    store: Arc<dyn LeaseStore>,
    scale: Scale,
) {
    let c = one_shot_coordinator(&store, scale).await;
    let ttl = Duration::from_millis(scale.ms(5_000));
    for round in 0..3 {
        let job = format!("job-{round}");
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (c, job) = (c.clone(), job.clone());
                tokio::spawn(async move { c.try_acquire(&job, ttl).await })
            })
            .collect();
        let mut tokens = Vec::new();
        for t in tasks {
            if let Some(lease) = t.await.expect("task").expect("one-shot claim") {
                tokens.push(lease.lease.token);
            }
        }
        assert_eq!(
            tokens.len(),
            1,
            "round {round}: exactly one of 4 concurrent one-shot claims from one instance wins, \
             got tokens {tokens:?}"
        );
    }
    c.shutdown().await;
}

/// A one-shot lease is exclusive while it is valid, against this instance
/// and others; `release` frees exactly the grant it names, and the next
/// claim gets a greater token.
pub async fn one_shot_claim_is_refused_while_the_first_is_valid(
    store: Arc<dyn LeaseStore>,
    scale: Scale,
) {
    let c = one_shot_coordinator(&store, scale).await;
    let other = one_shot_coordinator(&store, scale).await;
    let ttl = Duration::from_millis(scale.ms(30_000));
    let before = std::time::Instant::now();
    let first = c
        .try_acquire("bootstrap", ttl)
        .await
        .expect("claim")
        .expect("a free role is granted");
    let after = std::time::Instant::now();
    // Trusted for 80 % of ttl, measured from before the claim was sent.
    assert!(
        first.valid_until >= before + ttl.mul_f64(0.8)
            && first.valid_until <= after + ttl.mul_f64(0.8),
        "valid_until is 80 % of ttl after the claim was sent"
    );
    assert!(first.is_valid());
    let again = c.try_acquire("bootstrap", ttl).await.expect("claim");
    assert!(
        again.is_none(),
        "a second one-shot claim by the same instance while the first is valid is refused, \
         got token {:?} (first {})",
        again.map(|l| l.lease.token),
        first.lease.token
    );
    assert!(other
        .try_acquire("bootstrap", ttl)
        .await
        .expect("claim")
        .is_none());
    assert!(c.release(first.clone()).await.expect("release"));
    let second = c
        .try_acquire("bootstrap", ttl)
        .await
        .expect("claim")
        .expect("a released role is granted at once");
    assert!(
        second.lease.token > first.lease.token,
        "{} -> {}",
        first.lease.token,
        second.lease.token
    );
    // Releasing the first grant again frees nothing: the second stays taken.
    assert!(!c.release(first).await.expect("release"));
    assert!(other
        .try_acquire("bootstrap", ttl)
        .await
        .expect("claim")
        .is_none());
    assert!(c
        .try_acquire("bootstrap", ttl)
        .await
        .expect("claim")
        .is_none());
    assert!(c.release(second).await.expect("release"));
    c.shutdown().await;
    other.shutdown().await;
}

/// A one-shot lease is not renewed: once its ttl has passed in the store,
/// the role is free again, and the next claim (by the same instance) begins
/// a new term with a greater token.
pub async fn one_shot_lease_expires_and_the_next_claim_gets_a_greater_token(
    store: Arc<dyn LeaseStore>,
    scale: Scale,
) {
    let c = one_shot_coordinator(&store, scale).await;
    let ttl = Duration::from_millis(scale.ms(300));
    let first = c
        .try_acquire("nightly", ttl)
        .await
        .expect("claim")
        .expect("a free role is granted");
    assert!(c
        .try_acquire("nightly", ttl)
        .await
        .expect("claim")
        .is_none());
    scale.past(400).await;
    assert!(!first.is_valid(), "not trusted past its ttl");
    let next = c
        .try_acquire("nightly", ttl)
        .await
        .expect("claim")
        .expect("an expired one-shot lease frees the role");
    assert!(
        next.lease.token > first.lease.token,
        "{} -> {}",
        first.lease.token,
        next.lease.token
    );
    c.shutdown().await;
}

/// Asserts that `later` names no record other than as the reads before
/// (newest first, down to a full read) last showed it: no change since.
fn assert_unchanged(later: &Changes, earlier: &[&Changes]) {
    for r in &later.records {
        let before = (earlier.iter()).find_map(|c| c.records.iter().find(|e| e.role == r.role));
        let same = before.is_some_and(|e| (&e.holder, e.token) == (&r.holder, r.token));
        assert!(same, "{} changed: {r:?}", r.role);
    }
}

/// Reads changes from `since` until `done` says what they named so far is
/// enough: at once on every store but etcd, whose watch delivers a change a
/// moment after its commit (there, for at most 3 s). Returns the last read,
/// with every record named on the way (the latest of each role), and the
/// roles named.
async fn changes_until(
    store: &dyn LeaseStore,
    names: &[RoleName],
    since: Cursor,
    horizon_ms: u64,
    done: impl Fn(&Changes) -> bool,
) -> (Changes, Vec<String>) {
    let start = std::time::Instant::now();
    let (mut last, _) = changes_from(store, names, since, horizon_ms).await;
    let mut seen = last.records.clone();
    loop {
        let so_far = Changes {
            full: false,
            records: seen.clone(),
            cursor: last.cursor,
        };
        let patience = match store.kind() {
            "etcd" => Duration::from_secs(3),
            _ => Duration::ZERO,
        };
        if done(&so_far) || start.elapsed() >= patience {
            let mut named: Vec<String> = seen.iter().map(|r| r.role.clone()).collect();
            named.sort();
            named.dedup();
            named.retain(|r| names.iter().any(|n| n.as_str() == r));
            return (so_far, named);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (next, _) = changes_from(store, names, last.cursor, horizon_ms).await;
        for r in &next.records {
            seen.retain(|s| s.role != r.role);
            seen.push(r.clone());
        }
        last = next;
    }
}

/// Reads changes from `since` and returns them with the roles they name, sorted.
async fn changes_from(
    store: &dyn LeaseStore,
    names: &[RoleName],
    since: Cursor,
    horizon_ms: u64,
) -> (Changes, Vec<String>) {
    let horizon = Duration::from_millis(horizon_ms);
    let changes = store
        .changes(names, Some(since), horizon)
        .await
        .expect("changes");
    assert!(
        !changes.full,
        "a read from a fresh cursor reads only changes"
    );
    let mut named: Vec<String> = changes.records.iter().map(|r| r.role.clone()).collect();
    named.sort();
    named.retain(|r| names.iter().any(|n| n.as_str() == r));
    (changes, named)
}

pub async fn changes_name_term_changes_and_ending_holders_only(
    store: Arc<dyn LeaseStore>,
    scale: Scale,
) {
    let names = roles(&["c1", "c2", "c3"]);
    registered(&store, &["c1", "c2", "c3"]).await;
    let (a, b) = (instance(1), instance(2));
    let long = scale.ms(60_000);
    let t1 = grant(&*store, &a, "c1", None, long).await.unwrap();
    grant(&*store, &b, "c2", None, long).await.unwrap();
    let horizon = scale.ms(1_000);

    let first = store
        .changes(&names, None, Duration::from_millis(horizon))
        .await
        .expect("full read");
    assert!(first.full, "no cursor: a full read");
    assert_eq!(first.records.len(), 3);

    // A renewal is no change (a store may name a record again unchanged,
    // never with anything new).
    assert_eq!(grant(&*store, &a, "c1", Some(t1), long).await, Some(t1));
    let (quiet, _) = changes_from(&*store, &names, first.cursor, horizon).await;
    assert_unchanged(&quiet, &[&first]);

    // A release and a new term are named, with what they did.
    store.release(&a, &[(role("c1"), t1)]).await.unwrap();
    let t3 = grant(&*store, &b, "c3", None, long).await.unwrap();
    let both = |c: &Changes| {
        ["c1", "c3"]
            .iter()
            .all(|n| c.records.iter().any(|r| r.role == *n))
    };
    let (moved, named) = changes_until(&*store, &names, quiet.cursor, horizon, both).await;
    // c1 and c3 are named; c2 only ever as a repeat, unchanged (a store may
    // name a record again, never with anything new: PostgreSQL's cursor
    // stays behind a transaction still open elsewhere, as on a busy server).
    assert!(
        named
            .iter()
            .all(|n| ["c1", "c2", "c3"].contains(&n.as_str()))
            && named.iter().any(|n| n == "c1")
            && named.iter().any(|n| n == "c3"),
        "{named:?}"
    );
    for r in moved.records.iter().filter(|r| r.role == "c2") {
        let before = first.records.iter().find(|e| e.role == "c2");
        let same = before.is_some_and(|e| (&e.holder, e.token) == (&r.holder, r.token));
        assert!(same, "c2 named as changed: {r:?}");
    }
    let c1 = moved.records.iter().find(|r| r.role == "c1").unwrap();
    assert_eq!(c1.holder, None, "released");
    let c3 = moved.records.iter().find(|r| r.role == "c3").unwrap();
    assert_eq!((c3.holder.as_deref(), c3.token), (Some(b.id.as_str()), t3));
    let (again, _) = changes_from(&*store, &names, moved.cursor, horizon).await;
    assert_unchanged(&again, &[&moved, &quiet, &first]);

    // A holder that stops renewing is named by the time its term is over
    // (a fresh instance: an etcd instance's terms last as long as its
    // longest role's).
    let short = 600;
    grant(&*store, &instance(3), "c1", None, scale.ms(short))
        .await
        .unwrap();
    let (begun, _) = changes_from(&*store, &names, again.cursor, horizon).await;
    scale.past(short).await;
    let over = |c: &Changes| {
        (c.records.iter()).any(|r| r.role == "c1" && (r.holder.is_none() || r.remaining.is_zero()))
    };
    let (ending, named) = changes_until(&*store, &names, begun.cursor, horizon, over).await;
    assert!(over(&ending), "the ended term is named: {named:?}");

    // A cursor the store cannot answer from is answered by a full read.
    let ahead = Cursor {
        epoch: begun.cursor.epoch,
        position: begun.cursor.position + (1 << 40),
    };
    let gap = store
        .changes(&names, Some(ahead), Duration::from_millis(horizon))
        .await
        .expect("changes");
    assert!(
        gap.full,
        "a cursor from beyond the store's history reads everything"
    );
    assert_eq!(gap.records.len(), 3);
}

/// Whether a read of presence changes says `id` is gone: named gone, or
/// missing from a full read (a store may answer a departure with one).
fn departed(read: &MemberChanges, id: &str) -> bool {
    if read.full {
        !read.members.iter().any(|m| m.id == id)
    } else {
        read.gone.iter().any(|g| g == id)
    }
}

pub async fn presence_changes_name_joins_changes_and_departures_only(
    store: Arc<dyn LeaseStore>,
    scale: Scale,
) {
    let (a, b, c) = (instance(1), instance(2), instance(3));
    let ttl = Duration::from_millis(scale.ms(30_000));
    let horizon = Duration::from_millis(scale.ms(1_000));
    let read = |who: InstanceInfo, since: Option<Cursor>| {
        let store = store.clone();
        async move {
            store
                .presence_changes(&who, true, "", ttl, since, horizon)
                .await
                .expect("presence changes")
        }
    };
    let ids = |m: &MemberChanges| {
        let mut ids: Vec<String> = m.members.iter().map(|m| m.id.clone()).collect();
        ids.sort();
        ids
    };
    let b_first = read(b.clone(), None).await;
    let first = read(a.clone(), None).await;
    assert!(first.full, "no cursor: a full read");
    let mut both = vec![a.id.clone(), b.id.clone()];
    both.sort();
    assert_eq!(ids(&first), both);

    // Renewals are no change (a store may name a member again unchanged).
    read(b.clone(), Some(b_first.cursor)).await;
    let quiet = read(a.clone(), Some(first.cursor)).await;
    assert!(!quiet.full, "a read from a fresh cursor reads only changes");
    assert!(quiet.gone.is_empty(), "{quiet:?}");
    for m in &quiet.members {
        assert!(first.members.contains(m), "{} changed: {quiet:?}", m.id);
    }

    // A join, a change of candidacy and a leave are named.
    read(c.clone(), None).await;
    store.presence(&b, false, "", ttl).await.unwrap();
    store.leave(&b).await.unwrap();
    let moved = read(a.clone(), Some(quiet.cursor)).await;
    assert!(ids(&moved).contains(&c.id), "the join is named: {moved:?}");
    assert!(departed(&moved, &b.id), "the leave is named: {moved:?}");

    // A member that stops renewing is gone by the time its record ends.
    let short = 600;
    let d = instance(4);
    (store.presence(&d, true, "", Duration::from_millis(scale.ms(short))))
        .await
        .unwrap();
    let joined = read(a.clone(), Some(moved.cursor)).await;
    assert!(ids(&joined).contains(&d.id), "{joined:?}");
    let ended = scale
        .read_past(
            short,
            || read(a.clone(), Some(joined.cursor)),
            |ended| departed(ended, &d.id),
        )
        .await;
    assert!(
        departed(&ended, &d.id),
        "the ended record is named: {ended:?}"
    );

    // A cursor the store cannot answer from is answered by a full read.
    let ahead = Cursor {
        epoch: ended.cursor.epoch,
        position: ended.cursor.position + (1 << 40),
    };
    let gap = read(a.clone(), Some(ahead)).await;
    assert!(
        gap.full,
        "a cursor from beyond the history reads everything"
    );
    let mut live = vec![a.id.clone(), c.id.clone()];
    live.sort();
    assert_eq!(ids(&gap), live);
}
