//! Reads of changes, end to end: a coordinator that reads only changes
//! between its checks still ends up with the store's view when a change
//! never reaches its reads of changes. Each store gets the gap it can
//! have:
//!
//! - PostgreSQL, SQLite: a row rewritten by hand, its change mark put back
//!   in the same transaction (a trigger disabled, a restored backup);
//! - Redis: a lease hash written around the scripts (no change log entry);
//! - etcd: the member carrying the coordinator's watch killed, and the
//!   change made through the others while its watch is gone.
//!
//! In every case the view must show the change within one check interval
//! (60 reads) and a little more, never later, by a full read.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rolegate::store::{Claim, InstanceInfo, LeaseStore, RoleName};
use rolegate::{Coordinator, CoordinatorBuilder, LeaseTimings};

/// Ticks every 50 ms: a check interval is 60 reads, about 3 s.
const T: LeaseTimings = LeaseTimings {
    duration: Duration::from_millis(600),
    renew_interval: Duration::from_millis(50),
    safety_margin: Duration::from_millis(100),
};
/// One check interval, and slack for a loaded machine.
const BOUND: Duration = Duration::from_secs(3 + 3);
const ROLE: &str = "gap-role";

fn holder(id: &str) -> InstanceInfo {
    InstanceInfo {
        id: id.to_string(),
        address: format!("http://127.0.0.1:1/{id}"),
    }
}

/// Another instance takes the role for an hour (the coordinator under test
/// never can), and the coordinator starts and sees it.
async fn observed(store: Arc<dyn LeaseStore>) -> (Coordinator, u64) {
    let role = RoleName::new(ROLE).unwrap();
    store
        .register(std::slice::from_ref(&role))
        .await
        .expect("register");
    let hour = Duration::from_secs(3_600);
    let grants = (store.claim(&holder("first"), &[Claim::renewable(role, None, hour)]))
        .await
        .expect("claim");
    let token = grants[0].token;
    let coordinator = CoordinatorBuilder::new(store)
        .role(ROLE, T)
        .start()
        .expect("coordinator");
    let seen = wait_for(&coordinator, "first", Duration::from_secs(5)).await;
    assert!(seen.is_some(), "the coordinator sees the first holder");
    (coordinator, token)
}

/// Waits until the coordinator's view names `who` as the role's holder;
/// returns how long that took.
async fn wait_for(coordinator: &Coordinator, who: &str, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        let snapshot = coordinator.snapshot();
        let state = snapshot.roles.iter().find(|r| &*r.name == ROLE);
        if state.and_then(|r| r.holder.as_deref()) == Some(who) {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// After the write around the history: the view shows the ghost within the
/// bound, and a full read (after the `before`th, counted before the write)
/// did it.
async fn healed(coordinator: Coordinator, before: u64) {
    let took = wait_for(&coordinator, "ghost", BOUND).await;
    let stats = coordinator.stats();
    coordinator.shutdown().await;
    let took = took.unwrap_or_else(|| panic!("the view still misses the change after {BOUND:?}"));
    assert!(
        stats.full_reads > before,
        "a full read healed the view: {stats:?}"
    );
    eprintln!("healed in {took:?} ({} full reads)", stats.full_reads);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_change_around_the_history_is_healed_within_one_check() {
    let url = support::postgres_url();
    let table = support::unique_table("gap");
    let store = rolegate::store::PostgresStore::connect(&url, &table)
        .await
        .expect("postgres config");
    store.migrate().await.expect("migrate");
    let (coordinator, token) = observed(Arc::new(store)).await;
    let before = coordinator.stats().full_reads;
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let mut tx = pool.begin().await.unwrap();
    let rewrite = format!(
        "UPDATE {table} SET holder_id = 'ghost', token = $1, \
         expires_at = clock_timestamp() + interval '1 hour' WHERE role = $2"
    );
    sqlx::query(&rewrite)
        .bind(token as i64 + 1)
        .bind(ROLE)
        .execute(&mut *tx)
        .await
        .unwrap();
    let unmark = format!("UPDATE {table} SET changed = 0 WHERE role = $1");
    sqlx::query(&unmark)
        .bind(ROLE)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    healed(coordinator, before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_change_around_the_history_is_healed_within_one_check() {
    let dir = support::test_dir("gap");
    let url = format!("sqlite://{}/leases.db", dir.display());
    let table = "rolegate_role_leases";
    let store = rolegate::store::SqliteStore::connect(&url, table)
        .await
        .expect("open sqlite");
    store.migrate().await.expect("migrate");
    let (coordinator, token) = observed(Arc::new(store)).await;
    let before = coordinator.stats().full_reads;
    let pool = sqlx::SqlitePool::connect(&url).await.expect("connect");
    let mut tx = pool.begin().await.unwrap();
    let rewrite = format!(
        "UPDATE {table} SET holder_id = 'ghost', token = ?1, \
         expires_at_ms = expires_at_ms + 3600000 WHERE role = ?2"
    );
    sqlx::query(&rewrite)
        .bind(token as i64 + 1)
        .bind(ROLE)
        .execute(&mut *tx)
        .await
        .unwrap();
    let unmark = format!("UPDATE {table} SET changed = 0 WHERE role = ?1");
    sqlx::query(&unmark)
        .bind(ROLE)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    healed(coordinator, before).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_change_around_the_log_is_healed_within_one_check() {
    let ns = support::unique_table("gap");
    let store = rolegate::store::RedisStore::connect(&support::redis_url(), &ns)
        .await
        .expect("redis config");
    store.migrate().await.expect("redis answers");
    let (coordinator, token) = observed(Arc::new(store)).await;
    let before = coordinator.stats().full_reads;
    let client = redis::Client::open(support::redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("HSET")
        .arg(format!("{ns}:lease:{ROLE}"))
        .arg("holder")
        .arg("ghost")
        .arg("token")
        .arg(token + 1)
        .query_async(&mut conn)
        .await
        .unwrap();
    healed(coordinator, before).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_change_while_the_watch_is_gone_is_healed_within_one_check() {
    let mut cluster = support::etcd::EtcdCluster::start(3).await;
    let ns = support::unique_table("gap");
    let connect = |endpoints: String| {
        let ns = ns.clone();
        async move {
            let store = rolegate::store::EtcdStore::connect(&endpoints, &ns, None)
                .await
                .expect("etcd config");
            store.migrate().await.expect("etcd answers");
            Arc::new(store) as Arc<dyn LeaseStore>
        }
    };
    // The coordinator's calls, and so its watch, go to member 0 first. The
    // other holders use the same client (an etcd client releases only the
    // terms on its own leases), through the members left.
    let store = connect(cluster.endpoints()).await;
    let (coordinator, token) = observed(store.clone()).await;
    let before = coordinator.stats().full_reads;
    cluster.kill(0);
    let others = store;
    let role = RoleName::new(ROLE).unwrap();
    let released = (others.release(&holder("first"), &[(role.clone(), token)]))
        .await
        .expect("release");
    assert_eq!(released, [ROLE]);
    let hour = Duration::from_secs(3_600);
    let grants = (others.claim(&holder("ghost"), &[Claim::renewable(role, None, hour)]))
        .await
        .expect("claim");
    assert_eq!(grants.len(), 1);
    healed(coordinator, before).await;
}
