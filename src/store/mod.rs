//! Lease stores behind one trait. Each backend judges expiry by its own clock
//! (the database's, or the server's TTLs), never the caller's wall clock.
//!
//! A backend answers four batched calls per instance (claim, snapshot,
//! release, register), each one round trip whatever the number of roles, and
//! offers a change feed that wakes contenders when a term changes.

mod config;
#[cfg(feature = "etcd")]
mod etcd;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

#[cfg(feature = "etcd")]
pub use etcd::EtcdStore;
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::PostgresStore;
#[cfg(feature = "redis")]
pub use redis::RedisStore;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;

pub use crate::role::RoleName;
pub use config::{check_table_name, BadTableName, StoreConfig, StoreKind, DEFAULT_TABLE};

/// Who is asking: the instance id and the address others forward to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceInfo {
    pub id: String,
    pub address: String,
}

/// One role in a batched claim. `held_token` is the term this instance
/// believes it holds; `None` asks for a new term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub role: RoleName,
    pub held_token: Option<u64>,
    pub duration: Duration,
}

/// A role granted to the caller by a claim: renewed (same token) or a new term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub role: String,
    pub token: u64,
}

/// A row of the lease table as the store sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    pub role: String,
    /// `None` when released or never held. An expired holder is still named;
    /// `remaining` is then zero.
    pub holder: Option<String>,
    pub holder_address: Option<String>,
    pub token: u64,
    /// Time left on the term by the store's clock.
    pub remaining: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store unreachable or failing: {0}")]
    Unavailable(String),
    #[error("bad store configuration: {0}")]
    Config(String),
    #[error("schema missing or outdated ({0}); run `rolegate migrate` or set store.migrate: true")]
    Schema(String),
    #[error("store kind `{0}` is not built into this binary (cargo feature `{0}`)")]
    NotBuilt(&'static str),
}

/// Wakes the coordinator when a term may have changed somewhere. Notices are
/// hints: the coordinator always re-reads the store after one.
pub type ChangeFeed = mpsc::Receiver<()>;

/// The lease store contract. Every backend passes `tests/store_conformance.rs`.
pub trait LeaseStore: Send + Sync + 'static {
    /// `memory`, `sqlite`, `postgres`, ...
    fn kind(&self) -> &'static str;

    /// Creates or updates the schema. Idempotent.
    fn migrate(&self) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Makes sure every role has a record (with no holder), so later claims are
    /// plain conditional updates. Idempotent.
    fn register<'a>(&'a self, roles: &'a [RoleName]) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Acquires or renews each role in one round trip. For each claim the store
    /// grants when the role is free, released, expired, or already held by this
    /// instance; it keeps the token only when `held_token` equals the current
    /// unexpired term, and starts a new term (token + 1) otherwise. Roles not in
    /// the answer were denied.
    fn claim<'a>(
        &'a self,
        instance: &'a InstanceInfo,
        claims: &'a [Claim],
    ) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>>;

    /// Releases the given terms if this instance still holds them, in one round
    /// trip, and announces the change. Returns the roles released.
    fn release<'a>(
        &'a self,
        instance: &'a InstanceInfo,
        held: &'a [(RoleName, u64)],
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>>;

    /// Reads the records of the given roles (all of them when empty) in one round trip.
    fn snapshot<'a>(
        &'a self,
        roles: &'a [RoleName],
    ) -> BoxFuture<'a, Result<Vec<LeaseRecord>, StoreError>>;

    /// Starts the change feed. It survives connection loss by reconnecting.
    fn subscribe(&self) -> BoxFuture<'_, Result<ChangeFeed, StoreError>>;
}

/// Opens the store a config names, applying the schema when `migrate` is set.
pub async fn open(config: &StoreConfig) -> Result<Arc<dyn LeaseStore>, StoreError> {
    let store = connect(config).await?;
    if config.migrate {
        store.migrate().await?;
    }
    Ok(store)
}

/// Opens the store a config names without touching the schema, whatever
/// `migrate` says (`rolegate status`, or a caller that migrates itself).
pub async fn connect(config: &StoreConfig) -> Result<Arc<dyn LeaseStore>, StoreError> {
    let store: Arc<dyn LeaseStore> = match config.kind {
        StoreKind::Memory => Arc::new(MemoryStore::new()),
        #[cfg(feature = "sqlite")]
        StoreKind::Sqlite => Arc::new(SqliteStore::connect(&config.url, &config.table).await?),
        #[cfg(not(feature = "sqlite"))]
        StoreKind::Sqlite => return Err(StoreError::NotBuilt("sqlite")),
        #[cfg(feature = "postgres")]
        StoreKind::Postgres => Arc::new(PostgresStore::connect(&config.url, &config.table).await?),
        #[cfg(not(feature = "postgres"))]
        StoreKind::Postgres => return Err(StoreError::NotBuilt("postgres")),
        #[cfg(feature = "redis")]
        StoreKind::Redis => Arc::new(RedisStore::connect(&config.url, &config.table).await?),
        #[cfg(not(feature = "redis"))]
        StoreKind::Redis => return Err(StoreError::NotBuilt("redis")),
        #[cfg(feature = "etcd")]
        StoreKind::Etcd => {
            let user = match (&config.username, &config.password) {
                (Some(u), Some(p)) => Some((u.as_str(), p.as_str())),
                _ => None,
            };
            Arc::new(EtcdStore::connect(&config.url, &config.table, user).await?)
        }
        #[cfg(not(feature = "etcd"))]
        StoreKind::Etcd => return Err(StoreError::NotBuilt("etcd")),
    };
    Ok(store)
}

/// Milliseconds, rounded up (a store term is never shorter than asked),
/// saturating, for SQL parameters.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
}
