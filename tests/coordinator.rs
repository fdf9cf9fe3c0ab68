//! The coordinator's guarantees with short real timings (duration 900 ms,
//! renew 200 ms, margin 200 ms) on real stores: no overlapping holders,
//! increasing tokens, fast graceful handover, crash takeover within
//! duration + renew interval, fail closed while PostgreSQL is down, and store
//! work per tick that does not grow with the number of roles.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rolegate::lease::LeaseEvent;
use rolegate::store::LeaseStore;
use rolegate::{Coordinator, CoordinatorBuilder, LeaseTimings};
use support::intervals::{self, Held, Overlaps};

const TIMINGS: LeaseTimings = LeaseTimings {
    duration: Duration::from_millis(900),
    renew_interval: Duration::from_millis(200),
    safety_margin: Duration::from_millis(200),
};

/// Every Began/Ended event of every coordinator in a test.
#[derive(Clone, Default)]
struct EventLog(Arc<Mutex<Vec<LeaseEvent>>>);

impl EventLog {
    fn push(&self, e: LeaseEvent) {
        self.0.lock().unwrap().push(e);
    }

    /// Closes the open intervals of an aborted coordinator at their deadlines.
    fn close_aborted(&self, c: &Coordinator) {
        let snap = c.snapshot();
        for r in &snap.roles {
            if let Some(until) = r.held_until {
                self.push(LeaseEvent::Ended {
                    instance: c.instance_id().into(),
                    role: r.name.clone(),
                    token: r.token,
                    at: until,
                });
            }
        }
    }

    /// Checks the one-holder promise; returns the number of terms seen.
    fn check(&self) -> usize {
        let verdict = intervals::check(&self.intervals(), Overlaps::AnyTwo);
        verdict.assert_clean();
        verdict.terms
    }

    /// Pairs every Began with its Ended; each term begins once, ends once.
    fn intervals(&self) -> Vec<Held<Instant>> {
        intervals::from_events(&self.0.lock().unwrap())
    }
}

fn roles(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("role-{i}")).collect()
}

fn start(store: &Arc<dyn LeaseStore>, names: &[String], log: &EventLog, n: usize) -> Coordinator {
    start_with(store, names, log, n, TIMINGS)
}

fn start_with(
    store: &Arc<dyn LeaseStore>,
    names: &[String],
    log: &EventLog,
    n: usize,
    t: LeaseTimings,
) -> Coordinator {
    let mut b = CoordinatorBuilder::new(store.clone())
        .instance_name(format!("c{n}"))
        .advertise(format!("http://127.0.0.1:{}", 20_000 + n));
    for name in names {
        b = b.role(name.clone(), t);
    }
    let log = log.clone();
    b.on_lease_event(move |e| log.push(e))
        .start()
        .expect("start coordinator")
}

fn holders(cs: &[Coordinator], role: &str) -> usize {
    cs.iter()
        .filter(|c| c.role(role).unwrap().is_held())
        .count()
}

async fn memory() -> Arc<dyn LeaseStore> {
    Arc::new(rolegate::store::MemoryStore::new())
}

async fn sqlite() -> Arc<dyn LeaseStore> {
    let dir = support::test_dir("coord");
    let url = format!("sqlite://{}/leases.db", dir.display());
    let s = rolegate::store::SqliteStore::connect(&url, "rolegate_role_leases")
        .await
        .unwrap();
    s.migrate().await.unwrap();
    Arc::new(s)
}

async fn postgres_at(url: &str) -> Arc<dyn LeaseStore> {
    let s = rolegate::store::PostgresStore::connect(url, &support::unique_table("coord"))
        .await
        .unwrap();
    s.migrate().await.unwrap();
    Arc::new(s)
}

async fn postgres() -> Arc<dyn LeaseStore> {
    postgres_at(&support::postgres_url()).await
}

/// Three coordinators share 20 roles while members stop gracefully, crash
/// and restart; no two believed-held intervals of a role overlap and tokens
/// increase across terms.
async fn holders_never_overlap_under_churn(store: Arc<dyn LeaseStore>, t: LeaseTimings) {
    let names = roles(20);
    let log = EventLog::default();
    let mut cs: Vec<Coordinator> = (0..3)
        .map(|n| start_with(&store, &names, &log, n, t))
        .collect();
    support::wait_for("every role held by someone", Duration::from_secs(5), || {
        names.iter().all(|r| holders(&cs, r) == 1)
    })
    .await;
    for (round, next_id) in (0..6).zip(3..) {
        // Sample the invariant as a reader would, between churn steps.
        for _ in 0..20 {
            for r in &names {
                assert!(holders(&cs, r) <= 1, "two holders of {r}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let victim = cs.remove(round % cs.len());
        if round % 2 == 0 {
            victim.shutdown().await;
        } else {
            victim.abort();
            log.close_aborted(&victim);
        }
        cs.push(start_with(&store, &names, &log, next_id, t));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    support::wait_for("every role held again", Duration::from_secs(5), || {
        names.iter().all(|r| holders(&cs, r) == 1)
    })
    .await;
    for c in &cs {
        c.shutdown().await;
    }
    let terms = log.check();
    assert!(
        terms >= 40,
        "expected churn to produce many terms, saw {terms}"
    );
}

/// The holder stops gracefully: another instance holds the role well within
/// one renew interval, woken by the store's notification, not its next poll.
async fn graceful_stop_hands_over_within_one_renew_interval(
    store: Arc<dyn LeaseStore>,
    t: LeaseTimings,
) {
    let names = roles(1);
    let log = EventLog::default();
    let a = start_with(&store, &names, &log, 0, t);
    support::wait_for("a holds", Duration::from_secs(3), || {
        a.role("role-0").unwrap().is_held()
    })
    .await;
    let b = start_with(&store, &names, &log, 1, t);
    // After its second tick b has a snapshot and its change feed (subscribed
    // after the first tick), so the release can wake it.
    support::wait_for("b subscribed", Duration::from_secs(3), || {
        b.is_ready() && b.stats().ticks >= 2
    })
    .await;
    let t0 = Instant::now();
    a.shutdown().await;
    support::wait_for("b takes over", Duration::from_secs(3), || {
        b.role("role-0").unwrap().is_held()
    })
    .await;
    let took = t0.elapsed();
    assert!(
        took < t.renew_interval,
        "handover took {took:?}, more than one renew interval"
    );
    b.shutdown().await;
    log.check();
}

/// The holder dies without releasing: another instance takes over within
/// duration + renew interval of the crash.
async fn crashed_holder_is_replaced_within_duration_plus_renew(
    store: Arc<dyn LeaseStore>,
    t: LeaseTimings,
) {
    let names = roles(3);
    let log = EventLog::default();
    let a = start_with(&store, &names, &log, 0, t);
    support::wait_for("a holds all", Duration::from_secs(3), || {
        names.iter().all(|r| a.role(r).unwrap().is_held())
    })
    .await;
    let b = start_with(&store, &names, &log, 1, t);
    support::wait_for("b subscribed", Duration::from_secs(3), || {
        b.is_ready() && b.stats().ticks >= 2
    })
    .await;
    let t0 = Instant::now();
    a.abort();
    log.close_aborted(&a);
    support::wait_for("b holds all", Duration::from_secs(5), || {
        names.iter().all(|r| b.role(r).unwrap().is_held())
    })
    .await;
    let took = t0.elapsed();
    assert!(
        took <= t.duration + t.renew_interval,
        "crash takeover took {took:?} > duration + renew interval"
    );
    assert!(
        took >= t.duration - t.renew_interval - t.safety_margin,
        "takeover before expiry? {took:?}"
    );
    b.shutdown().await;
    log.check();
}

/// Round trips per tick do not grow with roles: 1 role and 256 partition roles
/// cost the same store calls per tick.
async fn store_calls_per_tick_do_not_grow_with_roles(store: Arc<dyn LeaseStore>, t: LeaseTimings) {
    async fn calls_per_tick(
        store: &Arc<dyn LeaseStore>,
        partitions: Option<u32>,
        t: LeaseTimings,
    ) -> u64 {
        let mut b = CoordinatorBuilder::new(store.clone()).advertise("http://127.0.0.1:1");
        b = match partitions {
            None => b.role(support::unique_table("solo"), t),
            Some(n) => {
                // Unbalanced: balancing adds its one presence call.
                let name = support::unique_table("part");
                b.partition(&name, n, t).balance(&name, None)
            }
        };
        let c = b.start().unwrap();
        let n = c.role_names().len();
        support::wait_for("all held", Duration::from_secs(5), || {
            c.snapshot()
                .roles
                .iter()
                .filter(|r| r.held_now(Instant::now()))
                .count()
                == n
        })
        .await;
        tokio::time::sleep(t.renew_interval * 6).await;
        let stats = c.stats();
        c.shutdown().await;
        assert!(
            stats.ticks >= 5,
            "expected several ticks, saw {}",
            stats.ticks
        );
        stats.max_calls_per_tick
    }
    let role = calls_per_tick(&store, None, t).await;
    assert_eq!(role, 2, "one snapshot read and one claim per tick");
    let one = calls_per_tick(&store, Some(1), t).await;
    let many = calls_per_tick(&store, Some(256), t).await;
    assert_eq!(
        one, 3,
        "with a partition, one definitions read, one snapshot read and one claim per tick"
    );
    assert_eq!(
        many, one,
        "256 roles cost the same round trips per tick as 1"
    );
}

/// One member of a balanced partition, on `store`.
/// Its held intervals go to `log`, so handovers are checked for overlaps.
fn member(
    store: &Arc<dyn LeaseStore>,
    partition: &str,
    n: u32,
    t: LeaseTimings,
    log: &EventLog,
) -> Coordinator {
    let log = log.clone();
    CoordinatorBuilder::new(store.clone())
        .instance_name("bal")
        // Published in presence only; nothing connects to it.
        .advertise("http://127.0.0.1:1")
        .partition(partition, n, t)
        .on_lease_event(move |e| log.push(e))
        .start()
        .unwrap()
}

/// Roles of the partition each live coordinator holds now, sorted.
fn shares(cs: &[Coordinator]) -> Vec<usize> {
    let mut out: Vec<usize> = cs.iter().map(|c| c.partitions()[0].held_here()).collect();
    out.sort();
    out
}

/// Waits until the shares are `want`, within `bound`; says how long it took.
async fn settles(cs: &[Coordinator], want: &[usize], bound: Duration, what: &str) -> Duration {
    let start = Instant::now();
    loop {
        if shares(cs) == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < bound,
            "{what}: shares {:?}, want {want:?} within {bound:?}; stats {:?}",
            shares(cs),
            cs.iter().map(|c| c.stats()).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every role's token: unchanged tokens over a window mean no role moved.
fn tokens(cs: &[Coordinator]) -> Vec<u64> {
    let snaps: Vec<_> = cs.iter().map(|c| c.snapshot()).collect();
    (0..snaps[0].roles.len())
        .map(|i| snaps.iter().map(|s| s.roles[i].token).max().unwrap_or(0))
        .collect()
}

/// 12 roles over 3 → 4/4/4; a graceful leave → 6/6; a join → 4/4/4; a
/// crash → 6/6 after expiry; a rejoin → 4/4/4; then a steady cluster makes
/// no move. Each within `rebalance_delay + N/C × renew_interval` (plus the
/// duration after the crash), with slack for a loaded machine.
async fn partitions_spread_evenly_and_settle_through_joins_leaves_and_crashes(
    store: Arc<dyn LeaseStore>,
    t: LeaseTimings,
) {
    let p = support::unique_table("bal");
    let bound = t.renew_interval * 2 + t.renew_interval * 6 + Duration::from_secs(2);
    let log = EventLog::default();
    let mut cs: Vec<Coordinator> = (0..3).map(|_| member(&store, &p, 12, t, &log)).collect();
    settles(&cs, &[4, 4, 4], bound, "three members").await;
    cs.remove(0).shutdown().await;
    settles(&cs, &[6, 6], bound, "after a graceful leave").await;
    cs.push(member(&store, &p, 12, t, &log));
    settles(&cs, &[4, 4, 4], bound, "after a join").await;
    let crashed = cs.remove(0);
    crashed.abort();
    log.close_aborted(&crashed);
    settles(&cs, &[6, 6], bound + t.duration * 2, "after a crash").await;
    cs.push(member(&store, &p, 12, t, &log));
    settles(&cs, &[4, 4, 4], bound, "after a rejoin").await;
    // Steady: no term changes anywhere for a while.
    tokio::time::sleep(t.renew_interval * 2).await;
    let before = tokens(&cs);
    tokio::time::sleep(t.renew_interval * 25).await;
    assert_eq!(tokens(&cs), before, "a steady cluster moves nothing");
    assert_eq!(shares(&cs), vec![4, 4, 4]);
    for c in cs {
        c.shutdown().await;
    }
    // Every handover ended one holder's belief before the next one's began.
    log.check();
}

macro_rules! coordinator_suite {
    ($backend:ident, $make:expr) => {
        coordinator_suite!($backend, $make, TIMINGS);
    };
    ($backend:ident, $make:expr, $t:expr) => {
        mod $backend {
            use super::*;
            coordinator_suite!(@tests $make, $t;
                holders_never_overlap_under_churn,
                graceful_stop_hands_over_within_one_renew_interval,
                crashed_holder_is_replaced_within_duration_plus_renew,
                store_calls_per_tick_do_not_grow_with_roles,
                partitions_spread_evenly_and_settle_through_joins_leaves_and_crashes
            );
        }
    };
    (@tests $make:expr, $t:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name($make.await, $t).await;
            }
        )*
    };
}

coordinator_suite!(memory, memory());
coordinator_suite!(sqlite, sqlite());
coordinator_suite!(postgres, postgres());

/// etcd grants whole-second TTLs (at least 2 s) and revokes expired leases
/// about every 0.5 s, so its suite runs with second-scale timings.
#[cfg(feature = "etcd")]
const ETCD_TIMINGS: LeaseTimings = LeaseTimings {
    duration: Duration::from_secs(2),
    renew_interval: Duration::from_millis(700),
    safety_margin: Duration::from_millis(500),
};

#[cfg(feature = "redis")]
async fn redis_at(url: &str) -> Arc<dyn LeaseStore> {
    let s = rolegate::store::RedisStore::connect(url, &support::unique_table("coord"))
        .await
        .unwrap();
    s.migrate().await.unwrap();
    Arc::new(s)
}

#[cfg(feature = "etcd")]
async fn etcd_at(url: &str) -> Arc<dyn LeaseStore> {
    let s = rolegate::store::EtcdStore::connect(url, &support::unique_table("coord"), None)
        .await
        .unwrap();
    s.migrate().await.unwrap();
    Arc::new(s)
}

#[cfg(feature = "redis")]
coordinator_suite!(redis, redis_at(&support::redis_url()));
#[cfg(feature = "etcd")]
coordinator_suite!(etcd, etcd_at(&support::etcd_url()), ETCD_TIMINGS);

/// The store stops: every instance reports not-held within duration - margin,
/// keeps running and retrying; when the store returns, roles are held again.
async fn outage_fails_closed_then_recovers(
    store: Arc<dyn LeaseStore>,
    t: LeaseTimings,
    stop: impl FnOnce(),
    restart: impl FnOnce(),
) {
    let names = roles(20);
    let log = EventLog::default();
    let cs: Vec<Coordinator> = (0..3)
        .map(|n| start_with(&store, &names, &log, n, t))
        .collect();
    support::wait_for("all roles held", Duration::from_secs(10), || {
        names.iter().all(|r| holders(&cs, r) == 1)
    })
    .await;

    let t0 = Instant::now();
    stop();
    let stopped_after = t0.elapsed();
    let bound = t.duration - t.safety_margin;
    let took = support::wait_for(
        "no instance holds anything",
        Duration::from_secs(10),
        || names.iter().all(|r| holders(&cs, r) == 0),
    )
    .await;
    // Measured from the moment the stop began; the last successful send was earlier.
    assert!(
        took + stopped_after <= bound + Duration::from_millis(50),
        "fail-closed took {:?}, bound {bound:?}",
        took + stopped_after
    );
    // Keep running through the outage.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for c in &cs {
        assert!(!c.is_ready(), "readiness follows the store");
    }
    for r in &names {
        assert_eq!(holders(&cs, r), 0);
    }

    restart();
    support::wait_for(
        "roles held again after the store returns",
        Duration::from_secs(20),
        || names.iter().all(|r| holders(&cs, r) == 1),
    )
    .await;
    support::wait_for(
        "every instance ready again",
        Duration::from_secs(10),
        || cs.iter().all(|c| c.is_ready()),
    )
    .await;
    for c in &cs {
        c.shutdown().await;
    }
    log.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_outage_fails_closed_then_recovers() {
    let pg = support::PrivatePostgres::start();
    let store = postgres_at(&pg.url()).await;
    outage_fails_closed_then_recovers(store, TIMINGS, || pg.stop_server(), || pg.start_server())
        .await;
}

/// The outage test on a Redis or etcd server this test owns.
#[cfg(any(feature = "redis", feature = "etcd"))]
async fn private_server_outage(
    server: support::PrivateServer,
    store: Arc<dyn LeaseStore>,
    t: LeaseTimings,
) {
    let server = std::sync::Mutex::new(server);
    outage_fails_closed_then_recovers(
        store,
        t,
        || server.lock().unwrap().stop_server(),
        || server.lock().unwrap().start_server(),
    )
    .await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_fails_closed_then_recovers() {
    let server = support::PrivateServer::redis();
    let store = redis_at(&server.redis_url()).await;
    private_server_outage(server, store, TIMINGS).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_outage_fails_closed_then_recovers() {
    let server = support::PrivateServer::etcd();
    let store = etcd_at(&server.etcd_url()).await;
    private_server_outage(server, store, ETCD_TIMINGS).await;
}

/// Roles released by a non-candidate are taken by another; it contends again later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_candidate_releases_and_contends_again() {
    let store = memory().await;
    let names = roles(4);
    let log = EventLog::default();
    let a = start(&store, &names, &log, 0);
    support::wait_for("a holds", Duration::from_secs(3), || {
        names.iter().all(|r| a.role(r).unwrap().is_held())
    })
    .await;
    let b = start(&store, &names, &log, 1);
    support::wait_for("b ready", Duration::from_secs(3), || b.is_ready()).await;
    a.set_candidate(false);
    support::wait_for("b takes all", Duration::from_secs(1), || {
        names.iter().all(|r| b.role(r).unwrap().is_held())
    })
    .await;
    a.set_candidate(true);
    b.shutdown().await;
    support::wait_for("a takes all back", Duration::from_secs(1), || {
        names.iter().all(|r| a.role(r).unwrap().is_held())
    })
    .await;
    a.shutdown().await;
    log.check();
}

/// Partition resolution reads the snapshot: the holder's address, held here or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_resolution_follows_holders() {
    let store = memory().await;
    let a = CoordinatorBuilder::new(store.clone())
        .advertise("http://a:1")
        .partition("devices", 8, TIMINGS)
        .start()
        .unwrap();
    let p = a.partition("devices").unwrap();
    support::wait_for("a holds all", Duration::from_secs(3), || {
        (0..8).all(|i| p.resolve_index(i).held)
    })
    .await;
    let b = CoordinatorBuilder::new(store.clone())
        .advertise("http://b:1")
        .partition("devices", 8, TIMINGS)
        .start()
        .unwrap();
    let pb = b.partition("devices").unwrap();
    support::wait_for("b sees a", Duration::from_secs(3), || b.is_ready()).await;
    let r = pb.resolve("device-42");
    assert_eq!(&*r.role, "devices:partition-1");
    assert!(!r.held);
    assert_eq!(r.holder_address.as_deref(), Some("http://a:1"));
    let ra = p.resolve_scoped("Order", "7");
    assert_eq!(
        ra.index,
        rolegate::lease::partition_index(Some("Order"), "7", 8)
    );
    assert!(ra.held && ra.token.is_some());
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn bad_registrations_are_refused() {
    let store = memory().await;
    let err = CoordinatorBuilder::new(store.clone())
        .role("r".repeat(129), TIMINGS)
        .start()
        .unwrap_err();
    assert!(err.to_string().contains("128"), "{err}");
    let err = CoordinatorBuilder::new(store.clone())
        .role("p:partition-0", TIMINGS)
        .partition("p", 2, TIMINGS)
        .start()
        .unwrap_err();
    assert!(err.to_string().contains("twice"), "{err}");
    let bad = LeaseTimings {
        duration: Duration::from_millis(300),
        ..TIMINGS
    };
    assert!(CoordinatorBuilder::new(store)
        .role("x", bad)
        .start()
        .is_err());
}

/// The shared checker reports what it must: overlaps (also with an earlier,
/// longer interval that is not the previous one), own-instance overlaps only
/// when they count, and tokens that do not increase.
#[test]
fn interval_checker_catches_overlaps_and_token_regressions() {
    let held = |instance: &str, role: &str, token: u64, start: u64, end: u64| Held {
        instance: instance.into(),
        role: role.into(),
        token,
        start,
        end,
    };
    let touching = [
        held("a", "r", 1, 0, 10),
        held("b", "r", 2, 10, 20),
        held("a", "s", 1, 0, 20),
    ];
    let v = intervals::check(&touching, Overlaps::AnyTwo);
    assert!(
        v.overlaps.is_empty() && v.token_regressions.is_empty(),
        "{v:?}"
    );
    assert_eq!(v.terms, 3);

    let nested = [
        held("a", "r", 1, 0, 100),
        held("b", "r", 2, 10, 20),
        held("c", "r", 3, 30, 40),
    ];
    for mode in [Overlaps::AnyTwo, Overlaps::AcrossInstances] {
        let v = intervals::check(&nested, mode);
        assert_eq!(v.overlaps.len(), 2, "{v:?}");
        assert!(v.token_regressions.is_empty(), "{v:?}");
    }

    let own = [held("a", "r", 1, 0, 10), held("a", "r", 2, 5, 20)];
    assert_eq!(intervals::check(&own, Overlaps::AnyTwo).overlaps.len(), 1);
    assert!(intervals::check(&own, Overlaps::AcrossInstances)
        .overlaps
        .is_empty());

    let regressing = [
        held("a", "r", 2, 0, 10),
        held("b", "r", 2, 10, 20),
        held("a", "r", 1, 20, 30),
    ];
    let v = intervals::check(&regressing, Overlaps::AnyTwo);
    assert!(v.overlaps.is_empty(), "{v:?}");
    assert_eq!(v.token_regressions.len(), 2, "{v:?}");

    // A term resumed after a store gap: the same token, the same instance.
    let resumed = [held("a", "r", 4, 0, 10), held("a", "r", 4, 15, 20)];
    let v = intervals::check(&resumed, Overlaps::AnyTwo);
    assert!(v.token_regressions.is_empty(), "{v:?}");
}

/// `EventLog::check` fails when a second instance begins a term before the
/// first one's belief ended.
#[test]
#[should_panic(expected = "overlapping held intervals")]
fn event_log_check_fails_on_overlapping_terms() {
    let log = EventLog::default();
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let role: Arc<str> = "role-0".into();
    for (instance, token, start, end) in [("c0", 1, 0, 10), ("c1", 2, 5, 20)] {
        let instance: Arc<str> = instance.into();
        log.push(LeaseEvent::Began {
            instance: instance.clone(),
            role: role.clone(),
            token,
            at: t0 + ms(start),
            until: t0 + ms(end),
        });
        log.push(LeaseEvent::Ended {
            instance,
            role: role.clone(),
            token,
            at: t0 + ms(end),
        });
    }
    log.check();
}

/// The library snippet: `start()` then `ready()` then `guard()`, no sleep.
/// Run on PostgreSQL, where the first tick takes real round trips.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_returns_once_the_first_tick_took_the_free_roles() {
    let store = postgres().await;
    let c = CoordinatorBuilder::new(store)
        .instance_name("ready")
        .advertise("http://127.0.0.1:9")
        .role(format!("ready-{}", std::process::id()), TIMINGS)
        .start()
        .unwrap();
    let name = c.role_names()[0].to_string();
    assert!(
        c.role(&name).unwrap().guard().is_none(),
        "nothing is held before the first tick"
    );
    c.ready(Duration::from_secs(5))
        .await
        .expect("ready within 5 s");
    assert!(
        c.role(&name).unwrap().guard().is_some(),
        "a free role is held as soon as ready() returns"
    );
    c.shutdown().await;
}

/// A PostgreSQL store of its own on `table`, as each gateway has (one pool
/// per process).
async fn own_pg(table: &str) -> Arc<dyn LeaseStore> {
    let s = rolegate::store::PostgresStore::connect(&support::postgres_url(), table)
        .await
        .unwrap();
    s.migrate().await.unwrap();
    Arc::new(s)
}

/// Terms begun so far across the partition's roles (each move begins one).
fn terms(cs: &[Coordinator]) -> u64 {
    tokens(cs).iter().sum()
}

/// A rolling restart of C instances moves O(N) roles in total (each restart
/// moves about N/C away and back), not O(N·C).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_moves_o_n_roles_not_o_n_times_c() {
    let table = support::unique_table("roll");
    let (t, n) = (TIMINGS, 24);
    let p = support::unique_table("roll");
    let bound = t.renew_interval * 16 + Duration::from_secs(3);
    let log = EventLog::default();
    let mut cs = Vec::new();
    for _ in 0..4 {
        cs.push(member(&own_pg(&table).await, &p, n, t, &log));
    }
    settles(&cs, &[6, 6, 6, 6], bound, "four members").await;
    let before = terms(&cs);
    for k in 0..4 {
        cs.remove(0).shutdown().await;
        settles(&cs, &[8, 8, 8], bound, &format!("restart {k}: stopped")).await;
        cs.push(member(&own_pg(&table).await, &p, n, t, &log));
        settles(&cs, &[6, 6, 6, 6], bound, &format!("restart {k}: back")).await;
    }
    let moves = terms(&cs) - before;
    eprintln!("rolling restart of 4 instances, {n} roles: {moves} moves");
    assert!(
        moves <= 3 * u64::from(n),
        "{moves} moves for a rolling restart of 4 over {n} roles: a reshuffle, not O(N)"
    );
    for c in cs {
        c.shutdown().await;
    }
    log.check();
}

/// Settled, a balanced cluster makes no move for a whole minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_balanced_cluster_makes_no_moves_for_a_minute() {
    let table = support::unique_table("steady");
    let p = support::unique_table("steady");
    let log = EventLog::default();
    let mut cs = Vec::new();
    for _ in 0..3 {
        cs.push(member(&own_pg(&table).await, &p, 12, TIMINGS, &log));
    }
    settles(&cs, &[4, 4, 4], Duration::from_secs(10), "three members").await;
    tokio::time::sleep(TIMINGS.renew_interval * 4).await;
    let before = tokens(&cs);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(tokens(&cs), before, "no term changed in a steady minute");
    assert_eq!(shares(&cs), vec![4, 4, 4]);
    for c in cs {
        c.shutdown().await;
    }
}

/// A coordinator whose every handle is dropped without `shutdown()`
/// releases its roles in the background: the store names no holder well
/// before the term would have expired, another coordinator takes the role,
/// and no two terms overlap. (Before, the dropped coordinator's loop renewed
/// the role for as long as the process lived.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_coordinator_releases_its_roles_to_another() {
    let store = sqlite().await;
    let t = LeaseTimings {
        duration: Duration::from_secs(3),
        renew_interval: Duration::from_secs(1),
        safety_margin: Duration::from_secs(1),
    };
    let log = EventLog::default();
    let names = vec!["solo".to_string()];
    let a = start_with(&store, &names, &log, 1, t);
    let role = a.role("solo").unwrap();
    support::wait_for("a holds solo", Duration::from_secs(10), || role.is_held()).await;
    let partition_free = a.partitions();
    drop((a, role, partition_free));
    let dropped = Instant::now();
    let solo = [rolegate::RoleName::new("solo").unwrap()];
    support::wait_for_async("the store names no holder", Duration::from_secs(15), || {
        let (store, solo) = (store.clone(), solo.clone());
        async move {
            let records = store.snapshot(&solo).await.unwrap_or_default();
            records.iter().all(|r| r.holder.is_none())
        }
    })
    .await;
    let released_in = dropped.elapsed();
    assert!(
        released_in < t.duration,
        "released by the dropped coordinator, not expired: {released_in:?}"
    );
    let b = start_with(&store, &names, &log, 2, t);
    let role = b.role("solo").unwrap();
    support::wait_for(
        "b holds solo",
        t.duration + t.renew_interval + Duration::from_secs(5),
        || role.is_held(),
    )
    .await;
    b.shutdown().await;
    log.check();
}

/// A role handle keeps its coordinator running after the coordinator
/// handle itself is dropped: the role stays held while the handle lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_handle_keeps_its_coordinator_running() {
    let store = memory().await;
    let log = EventLog::default();
    let names = vec!["kept".to_string()];
    let a = start(&store, &names, &log, 1);
    let role = a.role("kept").unwrap();
    support::wait_for("a holds kept", Duration::from_secs(10), || role.is_held()).await;
    drop(a);
    let dropped = Instant::now();
    // The store's term reaches past two durations after the drop: only
    // renewals after it can put it there.
    let kept = [rolegate::RoleName::new("kept").unwrap()];
    support::wait_for_async("renewals after the drop", Duration::from_secs(20), || {
        let (store, kept) = (store.clone(), kept.clone());
        async move {
            let records = store.snapshot(&kept).await.unwrap_or_default();
            records.iter().any(|r| {
                r.holder.is_some() && Instant::now() + r.remaining > dropped + TIMINGS.duration * 2
            })
        }
    })
    .await;
    assert!(role.is_held(), "the handle's coordinator stopped");
}

/// One cycle of `RoleLease::every`, as the cycle itself saw it.
#[derive(Debug, Clone)]
struct Cycle {
    instance: String,
    token: u64,
    start: std::time::Instant,
    end: Option<std::time::Instant>,
    finished: bool,
}

/// Records a cycle's end when its future is dropped (finished or cut).
struct CycleEnd {
    log: Arc<Mutex<Vec<Cycle>>>,
    at: usize,
}

impl Drop for CycleEnd {
    fn drop(&mut self) {
        self.log.lock().unwrap()[self.at].end = Some(std::time::Instant::now());
    }
}

fn run_every(
    c: &Coordinator,
    log: &Arc<Mutex<Vec<Cycle>>>,
    cycle: Duration,
) -> tokio::task::JoinHandle<()> {
    let role = c.role("role-0").unwrap();
    let instance = c.instance_id().to_string();
    let log = log.clone();
    tokio::spawn(async move {
        role.every(Duration::from_millis(50), move |lease, _watch| {
            let log = log.clone();
            let instance = instance.clone();
            async move {
                let at = {
                    let mut l = log.lock().unwrap();
                    l.push(Cycle {
                        instance,
                        token: lease.token,
                        start: std::time::Instant::now(),
                        end: None,
                        finished: false,
                    });
                    l.len() - 1
                };
                let _end = CycleEnd {
                    log: log.clone(),
                    at,
                };
                tokio::time::sleep(cycle).await;
                log.lock().unwrap()[at].finished = true;
            }
        })
        .await
    })
}

/// `RoleLease::every` runs its cycle only on the holder, with the holder's
/// token; a graceful stop lets the running cycle finish before the role
/// moves, a crash cuts it at the term's trust deadline; no two cycles ever
/// overlap, and cycles go on at the new holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_runs_on_the_holder_only_and_never_overlaps_across_moves() {
    let store = sqlite().await;
    let names = roles(1);
    let events = EventLog::default();
    let log = Arc::new(Mutex::new(Vec::<Cycle>::new()));
    let cycles_of = |id: &str| {
        log.lock()
            .unwrap()
            .iter()
            .filter(|c| c.instance == id && c.finished)
            .count()
    };
    let a = start(&store, &names, &events, 0);
    support::wait_for("a holds", Duration::from_secs(5), || {
        a.role("role-0").unwrap().is_held()
    })
    .await;
    let b = start(&store, &names, &events, 1);
    let c = start(&store, &names, &events, 2);
    let loops: Vec<_> = [&a, &b, &c]
        .into_iter()
        .map(|x| {
            (
                x.instance_id().to_string(),
                run_every(x, &log, Duration::from_millis(120)),
            )
        })
        .collect();
    let a_id = a.instance_id().to_string();
    support::wait_for("a ran cycles", Duration::from_secs(10), || {
        cycles_of(&a_id) >= 3
    })
    .await;
    // A graceful stop: the cycle in hand finishes, then the role moves.
    a.shutdown().await;
    let next = |cs: [&Coordinator; 2]| {
        let held: Vec<_> = cs
            .into_iter()
            .filter(|x| x.role("role-0").unwrap().is_held())
            .collect();
        held.first().map(|x| x.instance_id().to_string())
    };
    support::wait_for("b or c holds", Duration::from_secs(10), || {
        next([&b, &c]).is_some()
    })
    .await;
    let second = next([&b, &c]).unwrap();
    support::wait_for("the new holder ran cycles", Duration::from_secs(10), || {
        cycles_of(&second) >= 3
    })
    .await;
    // A crash of the new holder mid-cycle: its cycle is cut at the deadline.
    let (crashed, survivor) = if b.instance_id() == second {
        (&b, &c)
    } else {
        (&c, &b)
    };
    crashed.abort();
    let third = survivor.instance_id().to_string();
    support::wait_for("the survivor ran cycles", Duration::from_secs(10), || {
        cycles_of(&third) >= 3
    })
    .await;
    survivor.shutdown().await;
    // `every` returns once its coordinator has stopped.
    support::wait_for(
        "the stopped coordinators' loops returned",
        Duration::from_secs(10),
        || {
            loops
                .iter()
                .filter(|(id, _)| *id == a_id || *id == third)
                .all(|(_, l)| l.is_finished())
        },
    )
    .await;

    let cycles = log.lock().unwrap().clone();
    let mut ends: Vec<&Cycle> = cycles.iter().collect();
    ends.sort_by_key(|c| c.start);
    for pair in ends.windows(2) {
        let end = pair[0].end.expect("every cycle ended");
        assert!(
            end <= pair[1].start,
            "cycles overlap: {:?} then {:?}",
            pair[0],
            pair[1]
        );
    }
    // Each instance's cycles carry the tokens of its terms, in order.
    let tokens = |id: &str| -> Vec<u64> {
        cycles
            .iter()
            .filter(|c| c.instance == id)
            .map(|c| c.token)
            .collect()
    };
    let (ta, t2, t3) = (tokens(&a_id), tokens(&second), tokens(&third));
    assert!(ta.iter().max() < t2.iter().min(), "{ta:?} {t2:?}");
    assert!(t2.iter().max() < t3.iter().min(), "{t2:?} {t3:?}");
    // The graceful stop let a's last cycle finish.
    assert!(
        cycles
            .iter()
            .filter(|c| c.instance == a_id)
            .all(|c| c.finished),
        "{cycles:#?}"
    );
}
