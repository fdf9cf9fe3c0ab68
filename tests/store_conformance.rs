//! One body of tests run against every store: the lease contract each
//! backend must keep. The checks are in
//! `support/conformance.rs`; `tests/store_tls.rs` runs them over TLS.

mod support;

use std::sync::Arc;

use rolegate::store::LeaseStore;
use support::conformance::*;

macro_rules! conformance {
    ($backend:ident, $make:expr) => {
        conformance!($backend, $make, Scale::FINE);
    };
    ($backend:ident, $make:expr, $scale:expr) => {
        mod $backend {
            use super::*;
            for_each_check!(conformance!(@tests $make, $scale));
        }
    };
    (@tests $make:expr, $scale:expr; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let store: Arc<dyn LeaseStore> = $make.await;
                super::$name(store, $scale).await;
            }
        )*
    };
}

async fn memory_store() -> Arc<dyn LeaseStore> {
    Arc::new(rolegate::store::MemoryStore::new())
}

async fn sqlite_store() -> Arc<dyn LeaseStore> {
    let dir = support::test_dir("conf");
    let url = format!("sqlite://{}/leases.db", dir.display());
    let store = rolegate::store::SqliteStore::connect(&url, "rolegate_role_leases")
        .await
        .expect("open sqlite");
    store.migrate().await.expect("migrate sqlite");
    Arc::new(store)
}

async fn postgres_store() -> Arc<dyn LeaseStore> {
    let url = support::postgres_url();
    let store = rolegate::store::PostgresStore::connect(&url, &support::unique_table("conf"))
        .await
        .expect("postgres config");
    store.migrate().await.expect("migrate postgres");
    Arc::new(store)
}

conformance!(memory, memory_store());
conformance!(sqlite, sqlite_store());
conformance!(postgres, postgres_store());

#[cfg(feature = "redis")]
async fn redis_store() -> Arc<dyn LeaseStore> {
    let store =
        rolegate::store::RedisStore::connect(&support::redis_url(), &support::unique_table("conf"))
            .await
            .expect("redis config");
    store.migrate().await.expect("redis answers");
    Arc::new(store)
}

#[cfg(feature = "etcd")]
async fn etcd_store() -> Arc<dyn LeaseStore> {
    let store = rolegate::store::EtcdStore::connect(
        &support::etcd_url(),
        &support::unique_table("conf"),
        None,
    )
    .await
    .expect("etcd config");
    store.migrate().await.expect("etcd answers");
    Arc::new(store)
}

#[cfg(feature = "redis")]
conformance!(redis, redis_store());
#[cfg(feature = "etcd")]
conformance!(etcd, etcd_store(), Scale::SECONDS);
