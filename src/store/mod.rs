//! Lease stores behind one trait. Each backend judges expiry by its own clock
//! (the database's, or the server's TTLs), never the caller's wall clock.
//!
//! A backend answers four batched calls per instance (claim, snapshot,
//! release, register), each one round trip whatever the number of roles, and
//! offers a change feed that wakes contenders when a term changes.
//!
//! Between full reads a coordinator reads only what changed
//! ([`LeaseStore::changes`]): the terms begun or ended since its cursor, and
//! the terms near or past their end. What it reads per tick then grows with
//! the changes, not with the number of roles.

pub(crate) mod config;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod feed;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;
mod tls;

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
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "redis",
    feature = "etcd"
))]
pub(crate) use config::check_table_name;
pub use config::{BadTableName, StoreConfig, StoreKind};
pub use error::{BoxError, StoreError};
pub(crate) use tls::{check_tls_files, check_tls_rules};
pub use tls::{ClientCertFiles, StoreTls, TlsFileError, TlsRuleError};

/// Who is asking: the instance id and the address others forward to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceInfo {
    /// The instance id (`{name}-{8 random hex}`), written as the holder.
    pub id: String,
    /// The base URL other instances forward to.
    pub address: String,
}

/// One role in a batched claim. `held_token` is the term this instance
/// believes it holds; `None` asks for a new term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The role.
    pub role: RoleName,
    /// The term the caller believes it holds, if any.
    pub held_token: Option<u64>,
    /// How long the store keeps the term without renewal.
    pub duration: Duration,
    /// A one-shot claim: granted only when the role is free, released or
    /// expired, never over an unexpired term of this same instance (two
    /// tasks of one process must not both run a one-shot job).
    pub one_shot: bool,
}

impl Claim {
    /// A heartbeat claim: renews `held_token` if it is still the current
    /// term, else asks for a new term.
    pub fn renewable(role: RoleName, held_token: Option<u64>, duration: Duration) -> Self {
        Self {
            role,
            held_token,
            duration,
            one_shot: false,
        }
    }

    /// A one-shot claim of `role` for `duration` (see [`Claim::one_shot`]).
    pub fn one_shot(role: RoleName, duration: Duration) -> Self {
        Self {
            role,
            held_token: None,
            duration,
            one_shot: true,
        }
    }
}

/// A role granted to the caller by a claim: renewed (same token) or a new term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The role.
    pub role: String,
    /// The fencing token of the term now held.
    pub token: u64,
}

/// A live instance, as its presence record says (partition balancing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The instance id.
    pub id: String,
    /// Its advertise address.
    pub address: String,
    /// Whether it contends for roles.
    pub candidate: bool,
    /// The fingerprint of its route table (empty when it published none).
    pub routes: String,
}

/// A partition's definition as the store records it: what decides which
/// role owns a key. Instances whose configuration disagrees with it neither
/// hold nor serve the partition's roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRecord {
    /// The partition's name.
    pub name: String,
    /// The definition text (count, hash version, scopes), compared as is.
    pub definition: String,
    /// 1 for the first record; each change adds one.
    pub epoch: u64,
    /// Time left, by the store's clock, before any instance may serve the
    /// partition after its last change (zero once settled): long enough
    /// that every term begun under the previous definition has ended.
    pub settling: Duration,
}

/// A row of the lease table as the store sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The role.
    pub role: String,
    /// `None` when released or never held. An expired holder is still named;
    /// `remaining` is then zero.
    pub holder: Option<String>,
    /// The holder's forwarding address, when there is a holder.
    pub holder_address: Option<String>,
    /// The fencing token of the current (or last) term; 0 before the first.
    pub token: u64,
    /// Time left on the term by the store's clock.
    pub remaining: Duration,
}

/// Where a reader of a store's changes stands. `epoch` names the store's
/// history of changes (a store that lost it, such as a restarted Redis
/// without persistence, begins another, and a cursor of the old one reads
/// everything again); `position` is how far into it the reader has read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cursor {
    /// The history the position belongs to.
    pub epoch: u64,
    /// The position within it.
    pub position: u64,
}

impl Cursor {
    /// `position` in a store whose history keeps one name (epoch 0).
    pub fn at(position: u64) -> Self {
        Self { epoch: 0, position }
    }
}

/// What [`LeaseStore::changes`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changes {
    /// A full read: `records` holds every role asked for, and replaces what
    /// the reader knew. Otherwise `records` holds only the roles that
    /// changed since the cursor or whose term ends within the horizon; every
    /// other role is as the reader last saw it, and its holder (if any) has
    /// at least the horizon left.
    pub full: bool,
    /// The records. A full read holds the roles asked for (every role when
    /// none were named); a read of changes may also name roles not asked
    /// for, which the reader ignores.
    pub records: Vec<LeaseRecord>,
    /// Where the next read starts.
    pub cursor: Cursor,
}

impl Changes {
    /// A full read: `records` is every role asked for.
    pub fn full(records: Vec<LeaseRecord>, cursor: Cursor) -> Self {
        Self {
            full: true,
            records,
            cursor,
        }
    }

    /// A read of changes: `records` is what changed since the cursor.
    pub fn changed(records: Vec<LeaseRecord>, cursor: Cursor) -> Self {
        Self {
            full: false,
            records,
            cursor,
        }
    }
}

/// What a store holds for a set of roles, in three numbers: the check
/// that a reader's view, built from reads of changes, still matches the
/// store without reading every record ([`LeaseStore::tally`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tally {
    /// Records found.
    pub records: u64,
    /// Records naming a holder (expired or not).
    pub holders: u64,
    /// The sum of their tokens. Tokens only grow, so a new term the view
    /// missed shows here; a missed release shows in `holders`.
    pub tokens: u64,
}

/// What [`LeaseStore::presence_changes`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberChanges {
    /// A full read: `members` is every live member, and replaces what the
    /// reader knew. Otherwise every member not named is as the reader last
    /// saw it.
    pub full: bool,
    /// Live members: every one on a full read, else the ones that joined,
    /// came back, or changed their address, candidacy or route table since
    /// the cursor.
    pub members: Vec<Member>,
    /// Members gone since the cursor (left, or their record expired).
    pub gone: Vec<String>,
    /// Where the next read starts.
    pub cursor: Cursor,
}

impl MemberChanges {
    /// A full read: `members` is every live member.
    pub fn full(members: Vec<Member>, cursor: Cursor) -> Self {
        Self {
            full: true,
            members,
            gone: Vec::new(),
            cursor,
        }
    }

    /// A read of changes: members joined or changed, and members gone.
    pub fn changed(members: Vec<Member>, gone: Vec<String>, cursor: Cursor) -> Self {
        Self {
            full: false,
            members,
            gone,
            cursor,
        }
    }
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
    /// unexpired term, and starts a new term (a greater token) otherwise. A
    /// [one-shot](Claim::one_shot) claim is granted only when the role is
    /// free, released or expired: an unexpired term of this instance counts
    /// as taken, and two such claims racing have one winner. Roles not in
    /// the answer were denied.
    fn claim<'a>(
        &'a self,
        instance: &'a InstanceInfo,
        claims: &'a [Claim],
    ) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>>;

    /// Releases the given terms if this instance still holds them, in one round
    /// trip, and announces the change: exactly the term each token names, never
    /// a later one of the same role. Returns the roles released.
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

    /// Reads what changed since `since`, in one round trip: the records of
    /// roles whose term began or ended after that cursor, and of roles
    /// whose holder has less than `horizon` left (or is named with its term
    /// expired). With `since` `None`, or when the store cannot answer from
    /// the cursor (its history was lost, trimmed, or the feed behind it
    /// broke), it answers a full read of `roles` instead, with a new
    /// cursor. A change is never lost between two reads: a change committed
    /// after this read's cursor was taken is in a later read, the next one
    /// as soon as the store has it (etcd: once its watch delivered it,
    /// which wakes the change feed). A record may
    /// be named again unchanged (PostgreSQL names again the changes of
    /// transactions still running somewhere when the cursor was taken).
    ///
    /// The default reads everything every time (a store without a change
    /// history).
    fn changes<'a>(
        &'a self,
        roles: &'a [RoleName],
        since: Option<Cursor>,
        horizon: Duration,
    ) -> BoxFuture<'a, Result<Changes, StoreError>> {
        let _ = (since, horizon);
        Box::pin(async move {
            Ok(Changes::full(
                self.snapshot(roles).await?,
                Cursor::default(),
            ))
        })
    }

    /// Counts the records of `roles` in one round trip, changing nothing
    /// ([`Tally`]), so a reader of changes can check its view without
    /// reading every record. `None`: this store keeps no such count (its
    /// tokens are too large to sum, or reading them costs as much as a full
    /// read); the reader then reads everything instead. The default: `None`.
    fn tally<'a>(
        &'a self,
        roles: &'a [RoleName],
    ) -> BoxFuture<'a, Result<Option<Tally>, StoreError>> {
        let _ = roles;
        Box::pin(async { Ok(None) })
    }

    /// Starts the change feed. It survives connection loss by reconnecting.
    fn subscribe(&self) -> BoxFuture<'_, Result<ChangeFeed, StoreError>>;

    /// Writes this instance's presence record (expiring `ttl` from now by the
    /// store's clock, with its route-table fingerprint `routes`) and reads
    /// every unexpired one, itself included, in one round trip. Records
    /// expired long ago are removed on the way.
    fn presence<'a>(
        &'a self,
        me: &'a InstanceInfo,
        candidate: bool,
        routes: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Member>, StoreError>>;

    /// [`presence`](Self::presence), reading only what changed since
    /// `since`: members that joined, came back, changed, left or expired.
    /// A record that ends within `horizon` is not yet gone; one renewed on
    /// time never comes that close to its end. With `since` `None`, or when
    /// the store cannot answer from the cursor, a full read. As with
    /// [`changes`](Self::changes), a member may be named again unchanged,
    /// never missed.
    ///
    /// The default reads every member every time.
    fn presence_changes<'a>(
        &'a self,
        me: &'a InstanceInfo,
        candidate: bool,
        routes: &'a str,
        ttl: Duration,
        since: Option<Cursor>,
        horizon: Duration,
    ) -> BoxFuture<'a, Result<MemberChanges, StoreError>> {
        let _ = (since, horizon);
        Box::pin(async move {
            Ok(MemberChanges::full(
                self.presence(me, candidate, routes, ttl).await?,
                Cursor::default(),
            ))
        })
    }

    /// Removes this instance's presence record (graceful stop), so the others
    /// rebalance at once instead of at its expiry.
    fn leave<'a>(&'a self, me: &'a InstanceInfo) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Reads every recorded partition definition in one round trip.
    fn partitions(&self) -> BoxFuture<'_, Result<Vec<PartitionRecord>, StoreError>>;

    /// Records `definition` for partition `name` unless one is recorded
    /// already (first registration: no settling), and returns the record in
    /// force, whichever instance wrote it. Two instances racing with
    /// different definitions see the same winner.
    fn define_partition<'a>(
        &'a self,
        name: &'a str,
        definition: &'a str,
    ) -> BoxFuture<'a, Result<PartitionRecord, StoreError>>;

    /// Replaces the record of partition `name` with `definition` if its
    /// epoch is still `from_epoch` (0: no record yet), in one atomic step:
    /// the epoch goes up by one and the partition settles for `settle` by
    /// the store's clock. Wakes every subscriber. `None` when the epoch had
    /// moved on (someone else changed it first).
    fn redefine_partition<'a>(
        &'a self,
        name: &'a str,
        from_epoch: u64,
        definition: &'a str,
        settle: Duration,
    ) -> BoxFuture<'a, Result<Option<PartitionRecord>, StoreError>>;

    /// Checks, changing nothing, that a gateway could run against the store
    /// as it is: the schema is applied and readable, and (where the store
    /// keeps grants) this user may write it. `rolegate check-config
    /// --connect` reports it. The default reads every lease record and
    /// every partition definition.
    fn check_access(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            self.snapshot(&[]).await?;
            self.partitions().await.map(|_| ())
        })
    }

    /// Called once after the last call (the gateway's clean stop): a store
    /// that owns its connections may flush and close them. Default: nothing.
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Opens the store a config names, applying the schema when
/// `config.migrate` is set (one attempt: a store that is down fails the
/// call). The constructors refuse a bad `config.table`.
pub async fn open(config: &StoreConfig) -> Result<Arc<dyn LeaseStore>, StoreError> {
    let store = connect(config).await?;
    if config.migrate {
        store.migrate().await?;
    }
    Ok(store)
}

/// Opens the store a config names without touching its schema, whatever
/// `config.migrate` says (for `status`, or for callers that apply the schema
/// on their own schedule). The SQL and Redis stores connect lazily: a store
/// that is down is reported by the first call.
pub async fn connect(config: &StoreConfig) -> Result<Arc<dyn LeaseStore>, StoreError> {
    check_tls_rules(config.kind, &config.url, config.tls.as_ref())
        .map_err(|e| StoreError::config(e.field(), e))?;
    Ok(match config.kind {
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
        StoreKind::Redis => Arc::new(
            RedisStore::connect_with_tls(&config.url, &config.table, config.tls.as_ref()).await?,
        ),
        #[cfg(not(feature = "redis"))]
        StoreKind::Redis => return Err(StoreError::NotBuilt("redis")),
        #[cfg(feature = "etcd")]
        StoreKind::Etcd => {
            let user = match (&config.username, &config.password) {
                (Some(u), Some(p)) => Some((u.as_str(), p.as_str())),
                _ => None,
            };
            let tls = config.tls.as_ref();
            Arc::new(EtcdStore::connect_with_tls(&config.url, &config.table, user, tls).await?)
        }
        #[cfg(not(feature = "etcd"))]
        StoreKind::Etcd => return Err(StoreError::NotBuilt("etcd")),
    })
}

/// Checks what opening the store would read from this machine's disk, without
/// opening it: the TLS files, and the directory of a SQLite database.
pub fn check_files(config: &StoreConfig) -> Result<(), StoreError> {
    check_tls_files(config)?;
    #[cfg(feature = "sqlite")]
    if config.kind == StoreKind::Sqlite {
        sqlite::check_directory(&config.url)?;
    }
    Ok(())
}

/// Milliseconds, rounded up (a store term is never shorter than asked),
/// saturating, for SQL parameters.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "redis"))]
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
}

/// The value of a presence record in the key-value stores (Redis, etcd):
/// `{0|1} {address}`, then a newline and the route-table fingerprint when
/// there is one. (Redis's presence script writes the same in Lua.)
#[cfg(feature = "etcd")]
pub(crate) fn member_value(candidate: bool, address: &str, routes: &str) -> String {
    let mut value = format!("{} {address}", u8::from(candidate));
    if !routes.is_empty() {
        value.push('\n');
        value.push_str(routes);
    }
    value
}

/// Reads a presence value written by [`member_value`] (or by a version
/// without fingerprints).
#[cfg(any(feature = "redis", feature = "etcd"))]
pub(crate) fn parse_member(id: &str, value: &str) -> Option<Member> {
    let (head, routes) = value.split_once('\n').unwrap_or((value, ""));
    let (flag, address) = head.split_once(' ')?;
    Some(Member {
        id: id.to_string(),
        address: address.to_string(),
        candidate: flag == "1",
        routes: routes.to_string(),
    })
}
