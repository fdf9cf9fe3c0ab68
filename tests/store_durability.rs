//! Fencing tokens never go back: a store stopped and started again (with
//! its files, where it has any) grants tokens above every token before, while
//! claims keep coming; Redis keeps that without persistence too. And a
//! gateway on a Redis that keeps nothing, or that has replicas attached,
//! says so once at start; a reader of a Redis's changes whose history was
//! lost reads everything again.
//!
//! The memory store is exempt: it lives and dies with its process.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rolegate::store::{Claim, InstanceInfo, LeaseStore, RoleName};
use tokio::task::JoinHandle;

/// The store the claims go to; a SQLite "restart" swaps in a store opened
/// again on the same file.
type StoreSlot = Arc<Mutex<Arc<dyn LeaseStore>>>;

const ROLES: [&str; 3] = ["fence-a", "fence-b", "fence-c"];

/// One role's grants, in the order they were answered.
type Grants = Arc<Mutex<Vec<u64>>>;

/// Claims `role` again and again from one instance, each claim asking for a
/// new term, until `stop`; failures (the store is down) are retried.
fn claim_loop(
    slot: StoreSlot,
    role: &'static str,
    duration: Duration,
    grants: Grants,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let me = InstanceInfo {
            id: format!("fence-{}", support::unique_table("i")),
            address: "http://127.0.0.1:1".into(),
        };
        let claim = [Claim::renewable(
            RoleName::new(role).expect("role name"),
            None,
            duration,
        )];
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let store = slot.lock().unwrap().clone();
            let answer = tokio::time::timeout(Duration::from_secs(3), store.claim(&me, &claim));
            if let Ok(Ok(granted)) = answer.await {
                if let Some(g) = granted.first() {
                    grants.lock().unwrap().push(g.token);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// Runs claims on [`ROLES`] while `restart` stops and starts the store, and
/// checks every role's tokens only ever went up.
async fn tokens_keep_increasing_across<F, Fut>(slot: StoreSlot, duration: Duration, restart: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let names: Vec<RoleName> = ROLES.iter().map(|r| RoleName::new(r).unwrap()).collect();
    let store = slot.lock().unwrap().clone();
    store.register(&names).await.expect("register");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let grants: Vec<Grants> = ROLES.iter().map(|_| Grants::default()).collect();
    let loops: Vec<JoinHandle<()>> = ROLES
        .iter()
        .zip(&grants)
        .map(|(role, g)| claim_loop(slot.clone(), role, duration, g.clone(), stop.clone()))
        .collect();
    let count = |g: &Grants| g.lock().unwrap().len();
    support::wait_for(
        "3 grants per role before the restart",
        Duration::from_secs(20),
        || grants.iter().all(|g| count(g) >= 3),
    )
    .await;
    restart().await;
    let at_restart: Vec<usize> = grants.iter().map(count).collect();
    support::wait_for(
        "3 grants per role after the restart",
        Duration::from_secs(30),
        || {
            grants
                .iter()
                .zip(&at_restart)
                .all(|(g, n)| count(g) >= n + 3)
        },
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in loops {
        l.await.expect("claim loop");
    }
    for ((role, g), n) in ROLES.iter().zip(&grants).zip(&at_restart) {
        let tokens = g.lock().unwrap().clone();
        for (i, w) in tokens.windows(2).enumerate() {
            assert!(
                w[1] > w[0],
                "{role}: token {} granted after token {} (grant {} of {}, the store restarted after grant {n}): {tokens:?}",
                w[1],
                w[0],
                i + 2,
                tokens.len()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_tokens_never_go_back_when_the_database_is_opened_again() {
    let dir = support::test_dir("fence_sqlite");
    let url = format!("sqlite://{}/leases.db", dir.display());
    let open = || async {
        let store = rolegate::store::SqliteStore::connect(&url, "rolegate_role_leases")
            .await
            .expect("open sqlite");
        store.migrate().await.expect("migrate sqlite");
        Arc::new(store) as Arc<dyn LeaseStore>
    };
    let slot: StoreSlot = Arc::new(Mutex::new(open().await));
    let swap = slot.clone();
    tokens_keep_increasing_across(slot, Duration::from_secs(1), || async move {
        let fresh = open().await;
        *swap.lock().unwrap() = fresh;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tokens_never_go_back_across_a_server_restart() {
    let pg = support::PrivatePostgres::start();
    let store = rolegate::store::PostgresStore::connect(&pg.url(), "rolegate_role_leases")
        .await
        .expect("postgres config");
    store.migrate().await.expect("migrate postgres");
    let slot: StoreSlot = Arc::new(Mutex::new(Arc::new(store)));
    tokens_keep_increasing_across(slot, Duration::from_secs(1), || async {
        pg.stop_server();
        tokio::time::sleep(Duration::from_millis(300)).await;
        pg.start_server();
    })
    .await;
}

#[cfg(feature = "redis")]
async fn redis_slot(url: &str) -> StoreSlot {
    let store = rolegate::store::RedisStore::connect(url, &support::unique_table("fence"))
        .await
        .expect("redis config");
    store.migrate().await.expect("redis answers");
    Arc::new(Mutex::new(Arc::new(store)))
}

/// The case that matters: a Redis run with `--save '' --appendonly no`
/// forgets its counters when killed; tokens must still go up.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_without_persistence_tokens_never_go_back_across_a_kill_and_restart() {
    let mut redis = support::PrivateServer::redis_without_persistence();
    let slot = redis_slot(&redis.redis_url()).await;
    tokens_keep_increasing_across(slot, Duration::from_secs(1), || async {
        redis.stop_server();
        tokio::time::sleep(Duration::from_millis(300)).await;
        redis.start_server();
    })
    .await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_with_an_append_only_file_tokens_never_go_back_across_a_kill_and_restart() {
    let mut redis = support::PrivateServer::redis();
    let slot = redis_slot(&redis.redis_url()).await;
    tokens_keep_increasing_across(slot, Duration::from_secs(1), || async {
        redis.stop_server();
        tokio::time::sleep(Duration::from_millis(300)).await;
        redis.start_server();
    })
    .await;
}

/// Redis reads changes from its change log, not from the leases: a write
/// made around the scripts is not named, and a cursor from a lost history
/// (its epoch key gone, as after a restart without persistence) reads
/// everything again, that write included.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_changes_come_from_the_change_log_and_a_lost_history_reads_everything() {
    let ns = support::unique_table("log");
    let store = rolegate::store::RedisStore::connect(&support::redis_url(), &ns)
        .await
        .expect("redis config");
    let names = ["log-a", "log-b"].map(|r| RoleName::new(r).unwrap());
    store.register(&names).await.expect("register");
    let me = InstanceInfo {
        id: "log-holder".into(),
        address: "http://127.0.0.1:1".into(),
    };
    let hour = Duration::from_secs(3_600);
    let claim = [Claim::renewable(names[0].clone(), None, hour)];
    assert_eq!(store.claim(&me, &claim).await.expect("claim").len(), 1);
    let horizon = Duration::from_secs(1);
    let first = store.changes(&names, None, horizon).await.expect("read");
    assert!(first.full);

    let client = redis::Client::open(support::redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("HSET")
        .arg(format!("{ns}:lease:log-a"))
        .arg("holder")
        .arg("intruder")
        .query_async(&mut conn)
        .await
        .unwrap();
    let quiet = store.changes(&names, Some(first.cursor), horizon).await;
    let quiet = quiet.expect("read");
    assert!(!quiet.full, "{quiet:?}");
    assert!(quiet.records.is_empty(), "not in the log: {quiet:?}");

    let _: () = redis::cmd("DEL")
        .arg(format!("{ns}:epoch"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let lost = store.changes(&names, Some(quiet.cursor), horizon).await;
    let lost = lost.expect("read");
    assert!(
        lost.full,
        "a cursor of a lost history reads everything: {lost:?}"
    );
    assert_ne!(lost.cursor.epoch, quiet.cursor.epoch);
    let a = lost.records.iter().find(|r| r.role == "log-a");
    assert_eq!(a.and_then(|r| r.holder.as_deref()), Some("intruder"));
    assert_eq!(lost.records.len(), 2);
    let next = store.changes(&names, Some(lost.cursor), horizon).await;
    assert!(!next.expect("read").full, "the new history is read from");
}

/// etcd's tokens are revisions, kept in its data directory.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_tokens_never_go_back_across_a_kill_and_restart() {
    let mut etcd = support::PrivateServer::etcd();
    let store = rolegate::store::EtcdStore::connect(
        &etcd.etcd_url(),
        &support::unique_table("fence"),
        None,
    )
    .await
    .expect("etcd config");
    store.migrate().await.expect("etcd answers");
    let slot: StoreSlot = Arc::new(Mutex::new(Arc::new(store)));
    tokens_keep_increasing_across(slot, Duration::from_secs(2), || async {
        etcd.stop_server();
        tokio::time::sleep(Duration::from_millis(300)).await;
        etcd.start_server();
    })
    .await;
}

/// The lines a gateway logged at WARN that contain `marker`.
#[cfg(feature = "redis")]
fn warnings(log: &str, marker: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("WARN") && l.contains(marker))
        .count()
}

/// How the two warnings can be told apart in the log.
#[cfg(feature = "redis")]
const NO_PERSISTENCE: &str = "keeps no data across a restart";
#[cfg(feature = "redis")]
const REPLICAS: &str = "replicas attached";

/// Starts a gateway on the Redis at `url`, waits until it has logged
/// `marker` at WARN, and a few more ticks so a repeat would show.
#[cfg(feature = "redis")]
async fn gateway_log_on_redis(url: &str, marker: &str) -> String {
    use support::cluster::{ClusterSpec, GatewayProcess, TestApp};
    let spec = ClusterSpec::store("redis", url, "durability");
    let app = TestApp::start(0).await;
    let gw = GatewayProcess::start(0, &spec, &app).await;
    support::wait_for(
        &format!("a WARN with `{marker}`"),
        Duration::from_secs(10),
        || warnings(&gw.log(), marker) > 0,
    )
    .await;
    // Ten renew intervals: the store is asked once, not per connection or tick.
    tokio::time::sleep(Duration::from_secs(5)).await;
    gw.log()
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_without_persistence_is_warned_about_once_at_start() {
    let redis = support::PrivateServer::redis_without_persistence();
    let log = gateway_log_on_redis(&redis.redis_url(), NO_PERSISTENCE).await;
    assert_eq!(warnings(&log, NO_PERSISTENCE), 1, "{log}");
    assert!(log.contains("tokens stay monotonic"), "{log}");
    assert_eq!(warnings(&log, REPLICAS), 0, "{log}");
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_with_replicas_attached_is_warned_about_once_at_start() {
    let primary = support::PrivateServer::redis();
    let _replica = support::PrivateServer::redis_replica_of(primary.port);
    let client = redis::Client::open(primary.redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    support::wait_for_async("the replica is attached", Duration::from_secs(10), || {
        let mut conn = conn.clone();
        async move {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            info.lines().any(|l| l.trim() == "connected_slaves:1")
        }
    })
    .await;
    let _ = &mut conn;
    let log = gateway_log_on_redis(&primary.redis_url(), REPLICAS).await;
    assert_eq!(warnings(&log, REPLICAS), 1, "{log}");
    assert!(log.contains("asynchronous"), "{log}");
    assert_eq!(warnings(&log, NO_PERSISTENCE), 0, "{log}");
}
