//! Leased work rows: claim, lease-guarded finalize and recovery by expiry for
//! an app's own queue-shaped table (outbound e-mail, webhook dispatches, a
//! durable retry table), on PostgreSQL or SQLite through the app's own pool.
//!
//! The app adds two columns to its table: a lock id and a locked-until time
//! (judged by the database clock). A claim is an unlocked select of candidates
//! followed by one conditional `UPDATE` that restates the whole predicate and
//! stamps a fresh lock id, returning only the rows that carry it. Every
//! finalize (complete, fail, release, renew) matches only while the caller's
//! lock id is still on the row, so a worker that stalled past its lease learns
//! it lost the row instead of overwriting the new owner. No statement holds a
//! row lock or a transaction across the work; an expired lock is simply
//! claimable again: no reaper, nothing to leak.
//!
//! `docs/work-rows.md` gives every statement as plain SQL.

mod backoff;
mod enqueue;
mod sql;
mod worker;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use backoff::{parse_retry_after, Backoff, RetryLadder, MAX_RETRY_AFTER};
pub use enqueue::{Enqueue, Value};
pub use sql::Dialect;
pub use worker::{Finalized, Job, JobError, JobRow, Outcome, RowValue, Worker, WorkerReport};

use crate::lease::RolePartition;

/// What went wrong with a work table or a statement.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkError {
    /// An identifier (table, column) the app passed is not a plain SQL name.
    #[error(
        "`{0}` is not a valid SQL identifier (letters, digits, `_`, optionally `schema.name`)"
    )]
    BadIdentifier(String),
    /// A lease, batch or time the app passed is out of range.
    #[error("{0}")]
    BadArgument(&'static str),
    /// The database refused or failed the statement.
    #[error("work-row statement failed: {0}")]
    Database(#[from] sqlx::Error),
    /// The table is missing, or its id column cannot carry the work's id.
    /// Checked before the first claim, so no row is ever locked by a claim
    /// whose ids could not be read back.
    #[error("work table: {0}")]
    Schema(String),
    /// `on_complete` left the completed row eligible: it would be claimed
    /// and run again. Fix the `SET` list or the predicate.
    #[error("on_complete leaves the row eligible (`{0}` is still true after complete): the row would run again; make on_complete end it, or use delete_on_complete")]
    StillEligible(String),
    /// The lease store behind `claim_held`'s partition was never read (an
    /// unmigrated or unreachable store): no role can be held. Retryable: a
    /// store that is starting up or electing a leader passes.
    #[error("claim_held: the lease store has not been read ({0}); run the store's migrate and check that it is reachable")]
    LeaseStore(String),
}

/// Whether `s` is a plain SQL identifier, optionally schema-qualified.
pub(crate) fn valid_identifier(s: &str) -> bool {
    let part = |p: &str| {
        let mut b = p.bytes();
        matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
            && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
            && p.len() <= 63
    };
    match s.split_once('.') {
        Some((schema, name)) => part(schema) && part(name),
        None => part(s),
    }
}

fn ident(s: &str) -> Result<String, WorkError> {
    if valid_identifier(s) {
        Ok(s.to_string())
    } else {
        Err(WorkError::BadIdentifier(s.to_string()))
    }
}

/// The shape of the app's table: names are validated identifiers; the
/// predicates and SET lists are SQL fragments **the app writes in code**
/// (never text from a request), pasted into the statements as they are.
#[derive(Debug, Clone)]
pub struct WorkTable {
    pub(crate) table: String,
    pub(crate) id: String,
    pub(crate) lock_id: String,
    pub(crate) locked_until: String,
    pub(crate) eligible: String,
    pub(crate) order_by: Vec<String>,
    pub(crate) on_claim: Option<String>,
    pub(crate) on_complete: Option<String>,
    pub(crate) delete_on_complete: bool,
    pub(crate) retry_column: Option<String>,
    pub(crate) on_fail: Option<String>,
    pub(crate) partition_column: Option<String>,
    pub(crate) attempts: Option<String>,
    pub(crate) on_dead: Option<String>,
    pub(crate) concurrency_key: Option<(String, u32)>,
}

impl WorkTable {
    /// A table with an integer `id` column and the lock columns `lock_id`
    /// and `locked_until`; every row is eligible until `eligible` says
    /// otherwise; queue order is the id.
    pub fn new(table: &str) -> Result<Self, WorkError> {
        Ok(Self {
            table: ident(table)?,
            id: "id".into(),
            lock_id: "lock_id".into(),
            locked_until: "locked_until".into(),
            eligible: "TRUE".into(),
            order_by: Vec::new(),
            on_claim: None,
            on_complete: None,
            delete_on_complete: false,
            retry_column: None,
            on_fail: None,
            partition_column: None,
            attempts: None,
            on_dead: None,
            concurrency_key: None,
        })
    }

    /// The integer primary key column (also the idempotency key of the work).
    pub fn id_column(mut self, column: &str) -> Result<Self, WorkError> {
        self.id = ident(column)?;
        Ok(self)
    }

    /// The two columns rolegate owns: a text lock id and a locked-until time
    /// (`timestamptz` on PostgreSQL, integer Unix milliseconds on SQLite).
    pub fn lock_columns(mut self, lock_id: &str, locked_until: &str) -> Result<Self, WorkError> {
        self.lock_id = ident(lock_id)?;
        self.locked_until = ident(locked_until)?;
        Ok(self)
    }

    /// Which rows are work: an SQL predicate written by the app, e.g.
    /// `status = 'pending' AND run_at <= now()`. Restated in every claim.
    pub fn eligible(mut self, predicate: &str) -> Self {
        self.eligible = predicate.to_string();
        self
    }

    /// Queue order (columns, each optionally followed by `ASC`/`DESC`); the
    /// id is always the last tie-breaker.
    pub fn order_by(mut self, columns: &[&str]) -> Result<Self, WorkError> {
        let mut out = Vec::new();
        for c in columns {
            let mut words = c.split_whitespace();
            let name = ident(words.next().unwrap_or_default())?;
            let dir = match words.next().map(|w| w.to_ascii_uppercase()) {
                None => String::new(),
                Some(d) if d == "ASC" || d == "DESC" => format!(" {d}"),
                Some(_) => return Err(WorkError::BadIdentifier((*c).to_string())),
            };
            if words.next().is_some() {
                return Err(WorkError::BadIdentifier((*c).to_string()));
            }
            out.push(format!("{name}{dir}"));
        }
        self.order_by = out;
        Ok(self)
    }

    /// Extra assignments applied by the claim, e.g. `claimed_by = 'web-1'`.
    /// Count attempts with [`attempts`](Self::attempts), not here: the two
    /// together assign the column twice, which PostgreSQL refuses.
    pub fn on_claim(mut self, set: &str) -> Self {
        self.on_claim = Some(set.to_string());
        self
    }

    /// Assignments applied by `complete`, e.g. `status = 'done'`; they must
    /// make the row ineligible.
    pub fn on_complete(mut self, set: &str) -> Self {
        self.on_complete = Some(set.to_string());
        self.delete_on_complete = false;
        self
    }

    /// `complete` deletes the row instead of updating it.
    pub fn delete_on_complete(mut self) -> Self {
        self.delete_on_complete = true;
        self
    }

    /// The column `fail(retry_at)` sets to the retry time (same type as the
    /// lock column's time), plus optional extra assignments.
    pub fn on_fail(
        mut self,
        retry_column: &str,
        extra_set: Option<&str>,
    ) -> Result<Self, WorkError> {
        self.retry_column = Some(ident(retry_column)?);
        self.on_fail = extra_set.map(str::to_string);
        Ok(self)
    }

    /// The integer column counting a row's attempts: every claim adds one
    /// (so a crash uses an attempt up), and a [`Worker`] reads it to know
    /// when a row has used its `max_attempts`.
    pub fn attempts(mut self, column: &str) -> Result<Self, WorkError> {
        self.attempts = Some(ident(column)?);
        Ok(self)
    }

    /// Assignments applied by [`WorkQueue::discard`] (a dead row: its
    /// attempts are used up, or the handler said it can never succeed),
    /// e.g. `status = 'dead'`; they must make the row ineligible.
    pub fn on_dead(mut self, set: &str) -> Self {
        self.on_dead = Some(set.to_string());
        self
    }

    /// At most `limit` rows with the same value in `column` (a customer, an
    /// order, an API) run at once, across every worker and process: a claim
    /// never takes a row whose key already has `limit` rows under a live
    /// lease, and takes a key's rows in queue order. A lease that runs out
    /// frees its key's slot at once, so a crashed worker blocks its key for
    /// no longer than its lease. Rows whose key is NULL have no limit. An
    /// index on `column` keeps the claim's count of running rows cheap.
    pub fn concurrency_key(mut self, column: &str, limit: u32) -> Result<Self, WorkError> {
        if limit == 0 {
            return Err(WorkError::BadArgument(
                "concurrency_key: the limit must be at least 1",
            ));
        }
        // A column of the table itself: the statements qualify it.
        if column.contains('.') {
            return Err(WorkError::BadIdentifier(column.to_string()));
        }
        self.concurrency_key = Some((ident(column)?, limit));
        Ok(self)
    }

    /// Strict order per key: one row of a key runs at a time, the first in
    /// queue order (`concurrency_key(column, 1)`). A row that waits for its
    /// retry time is not eligible meanwhile, so the key's next row may run
    /// before it unless the `eligible` predicate says otherwise.
    pub fn fifo_key(self, column: &str) -> Result<Self, WorkError> {
        self.concurrency_key(column, 1)
    }

    /// The integer column holding each row's partition number (computed at
    /// insert with [`crate::lease::partition_index`]), for [`WorkQueue::claim_held`].
    pub fn partition_column(mut self, column: &str) -> Result<Self, WorkError> {
        self.partition_column = Some(ident(column)?);
        Ok(self)
    }
}

/// A row this worker holds: its id, the lock id stamped by the claim, and
/// the app's own row as the database returned it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Claimed<R> {
    /// The row's id.
    pub id: i64,
    /// The claim's lock id: pass it back to complete, fail or release.
    pub lock_id: Arc<str>,
    /// The row as read.
    pub row: R,
}

/// The claim's rows, each with its id and the claim's lock id.
fn claimed<R: sqlx::Row>(
    rows: Vec<R>,
    id_col: &str,
    lock: &Arc<str>,
) -> Result<Vec<Claimed<R>>, WorkError>
where
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i32: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i16: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    rows.into_iter()
        .map(|row| {
            // `bigint`, `integer` or `smallint` (the schema check allows no other).
            let id = row
                .try_get::<i64, _>(id_col)
                .or_else(|_| row.try_get::<i32, _>(id_col).map(i64::from))
                .or_else(|_| row.try_get::<i16, _>(id_col).map(i64::from))?;
            Ok(Claimed {
                id,
                lock_id: lock.clone(),
                row,
            })
        })
        .collect()
}

/// A fresh random lock id (128 bits, hex).
fn new_lock_id() -> Arc<str> {
    let bytes: [u8; 16] = rand::random();
    hex::encode(bytes).into()
}

fn lease_secs(lease: Duration) -> Result<f64, WorkError> {
    if lease < Duration::from_millis(1) || lease > Duration::from_secs(7 * 24 * 3600) {
        return Err(WorkError::BadArgument(
            "lease must be between 1 ms and 7 days",
        ));
    }
    Ok(lease.as_secs_f64())
}

fn unix_ms(t: SystemTime) -> Result<i64, WorkError> {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .map_err(|_| WorkError::BadArgument("retry time before 1970"))
}

/// The app's pool behind a work table.
#[derive(Debug, Clone)]
pub enum WorkPool {
    #[cfg(feature = "postgres")]
    /// A PostgreSQL pool.
    Postgres(sqlx::PgPool),
    #[cfg(feature = "sqlite")]
    /// A SQLite pool.
    Sqlite(sqlx::SqlitePool),
}

/// Claims and finalizes rows of one work table.
#[derive(Debug, Clone)]
pub struct WorkQueue {
    pool: WorkPool,
    table: Arc<WorkTable>,
    sql: Arc<sql::Statements>,
    /// Set once the table and its id column passed [`WorkQueue::check_schema`].
    checked: Arc<tokio::sync::OnceCell<()>>,
}

/// The rows a claim returned, as the backend's own row type (read the app's
/// columns with `sqlx::Row::try_get`).
pub enum ClaimedRows {
    #[cfg(feature = "postgres")]
    /// Rows from PostgreSQL.
    Postgres(Vec<Claimed<sqlx::postgres::PgRow>>),
    #[cfg(feature = "sqlite")]
    /// Rows from SQLite.
    Sqlite(Vec<Claimed<sqlx::sqlite::SqliteRow>>),
}

impl std::fmt::Debug for ClaimedRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.ids()).finish()
    }
}

impl ClaimedRows {
    /// (id, lock id) of every claimed row, in queue order.
    pub fn ids(&self) -> Vec<(i64, Arc<str>)> {
        match self {
            #[cfg(feature = "postgres")]
            ClaimedRows::Postgres(v) => v.iter().map(|c| (c.id, c.lock_id.clone())).collect(),
            #[cfg(feature = "sqlite")]
            ClaimedRows::Sqlite(v) => v.iter().map(|c| (c.id, c.lock_id.clone())).collect(),
        }
    }

    /// How many rows were claimed.
    pub fn len(&self) -> usize {
        match self {
            #[cfg(feature = "postgres")]
            ClaimedRows::Postgres(v) => v.len(),
            #[cfg(feature = "sqlite")]
            ClaimedRows::Sqlite(v) => v.len(),
        }
    }

    /// Whether none were.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The PostgreSQL rows (`None` for a SQLite queue).
    #[cfg(feature = "postgres")]
    pub fn into_postgres(self) -> Option<Vec<Claimed<sqlx::postgres::PgRow>>> {
        match self {
            ClaimedRows::Postgres(v) => Some(v),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The SQLite rows (`None` for a PostgreSQL queue).
    #[cfg(feature = "sqlite")]
    pub fn into_sqlite(self) -> Option<Vec<Claimed<sqlx::sqlite::SqliteRow>>> {
        match self {
            ClaimedRows::Sqlite(v) => Some(v),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

impl WorkQueue {
    /// A queue over `table` on the app's PostgreSQL pool.
    #[cfg(feature = "postgres")]
    pub fn postgres(pool: sqlx::PgPool, table: WorkTable) -> Self {
        let sql = sql::Statements::new(&table, Dialect::Postgres);
        Self {
            pool: WorkPool::Postgres(pool),
            table: Arc::new(table),
            sql: Arc::new(sql),
            checked: Arc::default(),
        }
    }

    /// A queue over `table` on the app's SQLite pool.
    #[cfg(feature = "sqlite")]
    pub fn sqlite(pool: sqlx::SqlitePool, table: WorkTable) -> Self {
        let sql = sql::Statements::new(&table, Dialect::Sqlite);
        Self {
            pool: WorkPool::Sqlite(pool),
            table: Arc::new(table),
            sql: Arc::new(sql),
            checked: Arc::default(),
        }
    }

    /// The statements this queue runs (for logs, docs and `EXPLAIN`).
    pub fn statements(&self) -> &sql::Statements {
        &self.sql
    }

    /// `CREATE INDEX IF NOT EXISTS` for the partial claim index over live rows
    /// (`live` is the app's predicate for rows that may still become work,
    /// e.g. `status = 'pending'`): queue order, then id.
    pub fn claim_index_ddl(&self, index_name: &str, live: &str) -> Result<String, WorkError> {
        let name = ident(index_name)?;
        let mut cols = self.table.order_by.clone();
        cols.push(self.table.id.clone());
        Ok(format!(
            "CREATE INDEX IF NOT EXISTS {name} ON {} ({}) WHERE {live}",
            self.table.table,
            cols.join(", ")
        ))
    }

    /// Claims up to `batch` eligible rows for `lease` (store clock).
    pub async fn claim(&self, batch: u32, lease: Duration) -> Result<ClaimedRows, WorkError> {
        self.claim_in(batch, lease, None).await
    }

    /// Like [`claim`](Self::claim), limited to rows whose partition column
    /// names a partition role of `partition` held here right now: the holder
    /// of `outbox:partition-3` delivers only partition 3's rows, and a
    /// handover moves the delivery with the role.
    pub async fn claim_held(
        &self,
        partition: &RolePartition,
        batch: u32,
        lease: Duration,
    ) -> Result<ClaimedRows, WorkError> {
        if self.table.partition_column.is_none() {
            return Err(WorkError::BadArgument(
                "claim_held needs WorkTable::partition_column",
            ));
        }
        if let Some(Some(error)) = partition.store_unread() {
            // Failing, not starting: say so instead of claiming nothing forever.
            return Err(WorkError::LeaseStore(error.to_string()));
        }
        let held: Vec<i64> = (0..partition.count())
            .filter(|&i| partition.role(i).is_some_and(|r| r.is_held()))
            .map(i64::from)
            .collect();
        if held.is_empty() {
            return Ok(self.empty());
        }
        self.claim_in(batch, lease, Some(held)).await
    }

    fn empty(&self) -> ClaimedRows {
        match &self.pool {
            #[cfg(feature = "postgres")]
            WorkPool::Postgres(_) => ClaimedRows::Postgres(Vec::new()),
            #[cfg(feature = "sqlite")]
            WorkPool::Sqlite(_) => ClaimedRows::Sqlite(Vec::new()),
        }
    }

    async fn claim_in(
        &self,
        batch: u32,
        lease: Duration,
        partitions: Option<Vec<i64>>,
    ) -> Result<ClaimedRows, WorkError> {
        if batch == 0 || batch > 10_000 {
            return Err(WorkError::BadArgument("batch must be between 1 and 10000"));
        }
        let secs = lease_secs(lease)?;
        self.checked.get_or_try_init(|| self.check_schema()).await?;
        let lock = new_lock_id();
        let text = match partitions {
            Some(_) => &self.sql.claim_partitions,
            None => &self.sql.claim,
        };
        let id_col = self.table.id.as_str();
        match &self.pool {
            #[cfg(feature = "postgres")]
            WorkPool::Postgres(pool) => {
                let mut q = sqlx::query(text)
                    .bind(i64::from(batch))
                    .bind(lock.as_ref())
                    .bind(secs);
                if let Some(p) = partitions {
                    q = q.bind(p);
                }
                let rows = q.fetch_all(pool).await?;
                Ok(ClaimedRows::Postgres(claimed(rows, id_col, &lock)?))
            }
            #[cfg(feature = "sqlite")]
            WorkPool::Sqlite(pool) => {
                let mut q = sqlx::query(text)
                    .bind(i64::from(batch))
                    .bind(lock.as_ref())
                    .bind((secs * 1000.0) as i64);
                if let Some(p) = partitions {
                    q = q.bind(serde_json::to_string(&p).unwrap_or_else(|_| "[]".into()));
                }
                let rows = q.fetch_all(pool).await?;
                Ok(ClaimedRows::Sqlite(claimed(rows, id_col, &lock)?))
            }
        }
    }

    /// Runs a finalize statement bound to (id, lock id, extra); true when the
    /// row still carried the lock id.
    async fn finalize(
        &self,
        text: &str,
        id: i64,
        lock: &str,
        extra: Option<i64>,
    ) -> Result<bool, WorkError> {
        let affected = match &self.pool {
            #[cfg(feature = "postgres")]
            WorkPool::Postgres(pool) => {
                let mut q = sqlx::query(text).bind(id).bind(lock);
                if let Some(x) = extra {
                    q = q.bind(x);
                }
                q.execute(pool).await?.rows_affected()
            }
            #[cfg(feature = "sqlite")]
            WorkPool::Sqlite(pool) => {
                let mut q = sqlx::query(text).bind(id).bind(lock);
                if let Some(x) = extra {
                    q = q.bind(x);
                }
                q.execute(pool).await?.rows_affected()
            }
        };
        Ok(affected == 1)
    }

    /// The work is done: applies `on_complete` (or deletes the row) and
    /// clears the lock. False if the lock id is no longer on the row.
    /// [`WorkError::StillEligible`] if the completed row still satisfies
    /// `eligible` (it would run again): the completion itself is committed,
    /// the error is about the table's configuration. The predicate is
    /// evaluated on the completed row as the statement returns it (on
    /// PostgreSQL a subquery in it sees the table as it was before the
    /// statement).
    pub async fn complete(&self, id: i64, lock_id: &str) -> Result<bool, WorkError> {
        self.finish_row(&self.sql.complete, id, lock_id).await
    }

    /// Runs a statement that ends one row's run (`complete`, `dead`): bound
    /// to the row's id and lock id, it returns whether the row is still
    /// eligible, or nothing when the lock id is no longer on the row.
    async fn finish_row(&self, text: &str, id: i64, lock_id: &str) -> Result<bool, WorkError> {
        let still: Option<Option<bool>> = match &self.pool {
            #[cfg(feature = "postgres")]
            WorkPool::Postgres(pool) => {
                sqlx::query_scalar(text)
                    .bind(id)
                    .bind(lock_id)
                    .fetch_optional(pool)
                    .await?
            }
            #[cfg(feature = "sqlite")]
            WorkPool::Sqlite(pool) => {
                sqlx::query_scalar(text)
                    .bind(id)
                    .bind(lock_id)
                    .fetch_optional(pool)
                    .await?
            }
        };
        match still {
            None => Ok(false),
            Some(Some(true)) => Err(self.still_eligible()),
            Some(_) => Ok(true),
        }
    }

    fn still_eligible(&self) -> WorkError {
        WorkError::StillEligible(self.table.eligible.clone())
    }

    /// Completes several rows of one claim in one statement (fast work);
    /// returns the ids that still carried `lock_id` and are now complete,
    /// or [`WorkError::StillEligible`] as [`complete`](Self::complete) does
    /// (the rows are completed all the same).
    pub async fn complete_all(&self, ids: &[i64], lock_id: &str) -> Result<Vec<i64>, WorkError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let text = &self.sql.complete_many;
        let done: Vec<(i64, Option<bool>)> = match &self.pool {
            #[cfg(feature = "postgres")]
            WorkPool::Postgres(pool) => {
                sqlx::query_as(text)
                    .bind(ids.to_vec())
                    .bind(lock_id)
                    .fetch_all(pool)
                    .await?
            }
            #[cfg(feature = "sqlite")]
            WorkPool::Sqlite(pool) => {
                let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".into());
                sqlx::query_as(text)
                    .bind(list)
                    .bind(lock_id)
                    .fetch_all(pool)
                    .await?
            }
        };
        if done.iter().any(|(_, still)| *still == Some(true)) {
            return Err(self.still_eligible());
        }
        Ok(done.into_iter().map(|(id, _)| id).collect())
    }

    /// The work failed: sets the retry column to `retry_at`, applies
    /// `on_fail`'s extra assignments, clears the lock.
    pub async fn fail(
        &self,
        id: i64,
        lock_id: &str,
        retry_at: SystemTime,
    ) -> Result<bool, WorkError> {
        let Some(text) = &self.sql.fail else {
            return Err(WorkError::BadArgument("fail needs WorkTable::on_fail"));
        };
        self.finalize(text, id, lock_id, Some(unix_ms(retry_at)?))
            .await
    }

    /// The work failed: like [`fail`](Self::fail), with the retry time
    /// `delay` from now by the **database clock** (the clock the leases and
    /// the eligible predicate use), not the app's.
    pub async fn fail_after(
        &self,
        id: i64,
        lock_id: &str,
        delay: Duration,
    ) -> Result<bool, WorkError> {
        let Some(text) = &self.sql.fail_after else {
            return Err(WorkError::BadArgument(
                "fail_after needs WorkTable::on_fail",
            ));
        };
        if delay > backoff::MAX_RETRY_AFTER {
            return Err(WorkError::BadArgument("retry delay must be under a year"));
        }
        let ms = delay.as_millis() as i64;
        self.finalize(text, id, lock_id, Some(ms)).await
    }

    /// Checks, once, that the table exists and that its id column is an
    /// integer the claim can read back (`bigint`, `integer` or `smallint`
    /// on PostgreSQL; an `INT` type on SQLite). Without it, a claim would
    /// lock rows and then fail to read their ids: stranded until the lease
    /// runs out, an attempt used up, and no caller knowing the lock id.
    async fn check_schema(&self) -> Result<(), WorkError> {
        let (table, id) = (&self.table.table, &self.table.id);
        let found: Option<String> = match &self.pool {
            #[cfg(feature = "postgres")]
            WorkPool::Postgres(pool) => {
                let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
                    .bind(table)
                    .fetch_one(pool)
                    .await?;
                if !exists {
                    return Err(WorkError::Schema(format!("table `{table}` does not exist")));
                }
                sqlx::query_scalar(
                    "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
                     WHERE a.attrelid = to_regclass($1) AND a.attname = lower($2) \
                     AND a.attnum > 0 AND NOT a.attisdropped",
                )
                .bind(table)
                .bind(id)
                .fetch_optional(pool)
                .await?
            }
            #[cfg(feature = "sqlite")]
            WorkPool::Sqlite(pool) => {
                // Unqualified, SQLite looks in temp, main, then attached
                // databases (a NULL schema does the same).
                let (schema, name) = match table.split_once('.') {
                    Some((schema, name)) => (Some(schema), name),
                    None => (None, table.as_str()),
                };
                let columns: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM pragma_table_info(?1, ?2)")
                        .bind(name)
                        .bind(schema)
                        .fetch_one(pool)
                        .await?;
                if columns == 0 {
                    return Err(WorkError::Schema(format!("table `{table}` does not exist")));
                }
                sqlx::query_scalar(
                    "SELECT type FROM pragma_table_info(?1, ?2) WHERE name = ?3 COLLATE NOCASE",
                )
                .bind(name)
                .bind(schema)
                .bind(id)
                .fetch_optional(pool)
                .await?
            }
        };
        let Some(ty) = found else {
            return Err(WorkError::Schema(format!(
                "table `{table}` has no id column `{id}` (WorkTable::id_column names it)"
            )));
        };
        let integer = match &self.pool {
            #[cfg(feature = "postgres")]
            WorkPool::Postgres(_) => matches!(ty.as_str(), "bigint" | "integer" | "smallint"),
            // By SQLite's affinity rules: refuse TEXT and REAL affinity,
            // allow INTEGER, NUMERIC and none (their values decode as integers).
            #[cfg(feature = "sqlite")]
            WorkPool::Sqlite(_) => {
                let t = ty.to_ascii_uppercase();
                t.contains("INT")
                    || !["CHAR", "CLOB", "TEXT", "REAL", "FLOA", "DOUB"]
                        .iter()
                        .any(|a| t.contains(a))
            }
        };
        if integer {
            Ok(())
        } else {
            Err(WorkError::Schema(format!(
                "the id column `{id}` of `{table}` is `{ty}`; it must be an integer (bigint, integer or smallint on PostgreSQL, INTEGER on SQLite)"
            )))
        }
    }

    /// The row is dead (its attempts are used up, or it can never succeed):
    /// applies `on_dead` and clears the lock. False if the lock id is no
    /// longer on the row; [`WorkError::StillEligible`] if the dead row is
    /// still eligible.
    pub async fn discard(&self, id: i64, lock_id: &str) -> Result<bool, WorkError> {
        let Some(text) = &self.sql.dead else {
            return Err(WorkError::BadArgument("discard needs WorkTable::on_dead"));
        };
        self.finish_row(text, id, lock_id).await
    }

    /// How many rows are claimable now (eligible, no live lock), and how
    /// old the oldest is by `age_column` (a time column of the lock
    /// column's type), by the database clock.
    pub async fn depth(
        &self,
        age_column: Option<&str>,
    ) -> Result<(i64, Option<Duration>), WorkError> {
        let age = age_column.map(ident).transpose()?;
        let text = self.sql.depth(age.as_deref());
        let (count, age): (i64, Option<f64>) = match &self.pool {
            #[cfg(feature = "postgres")]
            WorkPool::Postgres(pool) => sqlx::query_as(&text).fetch_one(pool).await?,
            #[cfg(feature = "sqlite")]
            WorkPool::Sqlite(pool) => sqlx::query_as(&text).fetch_one(pool).await?,
        };
        // A timestamp the database reads as infinite gives no age, not a panic.
        let age = age.and_then(|s| Duration::try_from_secs_f64(s.max(0.0)).ok());
        Ok((count, age))
    }

    /// Deletes up to `limit` rows matching `finished` (an SQL predicate the
    /// app writes, e.g. `status IN ('done', 'dead')`) whose `time_column` is
    /// older than `older_than` by the database clock, never a locked row.
    /// Returns how many went; call it again while it returns `limit`.
    pub async fn prune(
        &self,
        finished: &str,
        time_column: &str,
        older_than: Duration,
        limit: u32,
    ) -> Result<u64, WorkError> {
        let column = ident(time_column)?;
        if limit == 0 {
            return Err(WorkError::BadArgument("prune limit must be at least 1"));
        }
        let text = self.sql.prune(finished, &column);
        let ms = older_than.as_millis().min(i64::MAX as u128) as i64;
        let gone = match &self.pool {
            #[cfg(feature = "postgres")]
            WorkPool::Postgres(pool) => sqlx::query(&text)
                .bind(ms)
                .bind(i64::from(limit))
                .execute(pool)
                .await?
                .rows_affected(),
            #[cfg(feature = "sqlite")]
            WorkPool::Sqlite(pool) => sqlx::query(&text)
                .bind(ms)
                .bind(i64::from(limit))
                .execute(pool)
                .await?
                .rows_affected(),
        };
        Ok(gone)
    }

    /// PostgreSQL: the DDL of a trigger that notifies `channel` whenever a
    /// row is inserted, so a [`Worker`] listening on it wakes at once
    /// instead of at its next poll. (Rows inserted with
    /// [`enqueue`](Self::enqueue) notify without it.) Three statements:
    /// run them with `sqlx::raw_sql`.
    pub fn notify_trigger_ddl(&self, channel: &str) -> Result<String, WorkError> {
        let channel = ident(channel)?;
        let table = &self.table.table;
        let base = table.replace('.', "_");
        Ok(format!(
            "CREATE OR REPLACE FUNCTION {base}_wake() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN PERFORM pg_notify('{channel}', ''); RETURN NULL; END $$;\n\
             DROP TRIGGER IF EXISTS {base}_wake ON {table};\n\
             CREATE TRIGGER {base}_wake AFTER INSERT ON {table} \
             FOR EACH STATEMENT EXECUTE FUNCTION {base}_wake();"
        ))
    }

    /// Starts an insert of one row: `.set(column, value)` for the app's
    /// columns, `.run_after(column, delay)` for a time column set by the
    /// database clock, `.unique_on(column)` to skip a duplicate, then
    /// `.execute()`.
    pub fn enqueue(&self) -> Enqueue<'_> {
        Enqueue {
            queue: self,
            values: Vec::new(),
            run_after: None,
            unique_on: None,
            notify: None,
            error: None,
        }
    }

    pub(crate) fn table(&self) -> &WorkTable {
        &self.table
    }

    pub(crate) fn pool(&self) -> &WorkPool {
        &self.pool
    }

    /// Gives the row back at once (claimable again now; the attempt counted
    /// at claim stays counted).
    pub async fn release(&self, id: i64, lock_id: &str) -> Result<bool, WorkError> {
        self.finalize(&self.sql.release, id, lock_id, None).await
    }

    /// Sends an empty notification on `channel` (PostgreSQL's `pg_notify`),
    /// waking the workers that listen on it; nothing on SQLite, which has no
    /// notifications.
    pub(crate) async fn notify(&self, channel: &str) -> Result<(), WorkError> {
        match &self.pool {
            #[cfg(feature = "postgres")]
            WorkPool::Postgres(pool) => {
                sqlx::query("SELECT pg_notify($1, '')")
                    .bind(channel)
                    .execute(pool)
                    .await?;
                Ok(())
            }
            // SQLite has no notifications: its workers poll.
            #[cfg(feature = "sqlite")]
            WorkPool::Sqlite(_) => {
                let _ = channel;
                Ok(())
            }
        }
    }

    /// Extends the lock to `lease` from now (store clock), for long work.
    pub async fn renew(&self, id: i64, lock_id: &str, lease: Duration) -> Result<bool, WorkError> {
        let ms = (lease_secs(lease)? * 1000.0) as i64;
        self.finalize(&self.sql.renew, id, lock_id, Some(ms)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_under_a_millisecond_is_refused() {
        // A 1 ns lease used to be accepted: on SQLite it rounded to a lock
        // that expired at once, and the row was handed out again.
        for lease in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_micros(999),
        ] {
            assert!(lease_secs(lease).is_err(), "{lease:?}");
        }
        assert!(lease_secs(Duration::from_millis(1)).is_ok());
    }

    #[test]
    fn identifiers_are_validated() {
        assert!(valid_identifier("outbox"));
        assert!(valid_identifier("app.outbox_2"));
        assert!(valid_identifier("_x"));
        for bad in [
            "", "1x", "a-b", "a b", "a;drop", "a.b.c", "\"x\"", "a.", ".a",
        ] {
            assert!(!valid_identifier(bad), "{bad}");
        }
        assert!(WorkTable::new("outbox; DROP TABLE x").is_err());
        assert!(WorkTable::new("t")
            .unwrap()
            .order_by(&["run_at DESC"])
            .is_ok());
        assert!(WorkTable::new("t")
            .unwrap()
            .order_by(&["run_at; x"])
            .is_err());
        assert!(WorkTable::new("t")
            .unwrap()
            .order_by(&["run_at DESC x"])
            .is_err());
        assert!(WorkTable::new("t")
            .unwrap()
            .lock_columns("l", "u u")
            .is_err());
    }
}
