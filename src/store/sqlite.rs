//! SQLite store: the embedded default, one file in WAL mode shared by several
//! processes on one machine. Expiry is judged by SQLite's clock (`julianday
//! ('now')`, the one machine's clock). A trigger bumps a generation counter on
//! every term change; subscribers poll that one integer every few
//! milliseconds, which is how a release wakes the other processes. The
//! statements are in `sql/sqlite/`.

use std::str::FromStr;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{stream, FutureExt};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::sql::{
    self, ChangeRow, Dialect, GrantRow, LeaseRow, MemberChangeRow, PartitionRow, TallyRow, Target,
};
use super::{
    check_table_name, feed, millis, ChangeFeed, Changes, Claim, Cursor, Grant, InstanceInfo,
    LeaseRecord, LeaseStore, Member, MemberChanges, PartitionRecord, RoleName, StoreError, Tally,
};

/// How often subscribers look at the generation counter.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// Lease table in one SQLite file (default name `rolegate_role_leases`).
pub struct SqliteStore {
    pool: SqlitePool,
    target: Target,
    table: String,
    sql: Statements,
}

/// The statements, rendered for one table.
struct Statements {
    migrate: String,
    register: String,
    claim: String,
    release: String,
    snapshot: String,
    snapshot_all: String,
    changes: String,
    changes_full: String,
    tally: String,
    mark: String,
    generation: String,
    presence_write: String,
    presence_prune: String,
    presence_changes: String,
    leave: String,
    wake: String,
    partitions: String,
    partition: String,
    define_partition: String,
    insert_partition: String,
    redefine_partition: String,
}

impl Statements {
    fn new(table: &str) -> Self {
        let fragments = [
            ("lease_row", include_str!("sql/sqlite/lease_row.sql")),
            ("now_ms", include_str!("sql/sqlite/now_ms.sql")),
        ];
        let render = |template| sql::render(template, table, &fragments);
        Self {
            migrate: render(include_str!("sql/sqlite/migrate.sql")),
            register: render(include_str!("sql/sqlite/register.sql")),
            claim: render(include_str!("sql/sqlite/claim.sql")),
            release: render(include_str!("sql/sqlite/release.sql")),
            snapshot: render(include_str!("sql/sqlite/snapshot.sql")),
            snapshot_all: render(include_str!("sql/sqlite/snapshot_all.sql")),
            changes: render(include_str!("sql/sqlite/changes.sql")),
            tally: render(include_str!("sql/sqlite/tally.sql")),
            changes_full: render(include_str!("sql/sqlite/changes_full.sql")),
            mark: render(include_str!("sql/sqlite/mark.sql")),
            generation: render(include_str!("sql/sqlite/generation.sql")),
            presence_write: render(include_str!("sql/sqlite/presence_write.sql")),
            presence_prune: render(include_str!("sql/sqlite/presence_prune.sql")),
            presence_changes: render(include_str!("sql/sqlite/presence_changes.sql")),
            leave: render(include_str!("sql/sqlite/leave.sql")),
            wake: render(include_str!("sql/sqlite/wake.sql")),
            partitions: render(include_str!("sql/sqlite/partitions.sql")),
            partition: render(include_str!("sql/sqlite/partition.sql")),
            define_partition: render(include_str!("sql/sqlite/define_partition.sql")),
            insert_partition: render(include_str!("sql/sqlite/insert_partition.sql")),
            redefine_partition: render(include_str!("sql/sqlite/redefine_partition.sql")),
        }
    }
}

impl SqliteStore {
    /// Opens (creating if missing) the database file named by `url`
    /// (`sqlite://path/to/file.db` or `sqlite::memory:`). Refuses a bad table
    /// name or URL.
    pub async fn connect(url: &str, table: &str) -> Result<Self, StoreError> {
        check_table_name(table)?;
        check_directory(url)?;
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::config("store.url", e))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(2));
        let target = Target {
            dialect: Dialect::Sqlite,
            at: options.get_filename().display().to_string(),
            acquire_timeout: sql::ACQUIRE_TIMEOUT,
        };
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(sql::ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(|e| target.error(sql::CONNECT, e))?;
        Ok(Self {
            pool,
            target,
            table: table.to_string(),
            sql: Statements::new(table),
        })
    }

    fn error(&self, op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError + '_ {
        move |e| self.target.error(op, e)
    }
}

/// Refuses a database file whose directory does not exist, in words: SQLite
/// itself only says "(code: 14) unable to open database file".
pub(crate) fn check_directory(url: &str) -> Result<(), StoreError> {
    let options =
        SqliteConnectOptions::from_str(url).map_err(|e| StoreError::config("store.url", e))?;
    let file = options.get_filename();
    if file.as_os_str() == ":memory:" {
        return Ok(());
    }
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.is_dir() => Err(StoreError::config(
            "store.url",
            format!(
                "the directory `{}` of the SQLite database `{}` does not exist; create it or change store.url",
                dir.display(),
                file.display()
            ),
        )),
        _ => Ok(()),
    }
}

/// A JSON parameter (SQLite has no arrays).
fn json(op: &'static str, value: &impl serde::Serialize) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::unavailable(format!("SQLite {op}: encoding the batch"), e))
}

impl SqliteStore {
    /// Write, prune and read in one transaction: one visit to the file.
    /// Reads every live record (`since` `None`) or the changes after
    /// generation `since`; returns the generation, live and gone members.
    async fn presence_call(
        &self,
        me: &InstanceInfo,
        (candidate, routes, ttl): (bool, &str, Duration),
        since: Option<i64>,
        horizon: Duration,
    ) -> Result<(u64, Vec<Member>, Vec<String>), StoreError> {
        let mut tx = self.pool.begin().await.map_err(self.error("presence"))?;
        sqlx::query(&self.sql.presence_write)
            .bind(&me.id)
            .bind(&me.address)
            .bind(candidate)
            .bind(millis(ttl))
            .bind(routes)
            .execute(&mut *tx)
            .await
            .map_err(self.error("presence"))?;
        sqlx::query(&self.sql.presence_prune)
            .execute(&mut *tx)
            .await
            .map_err(self.error("presence"))?;
        let rows = sqlx::query_as::<_, MemberChangeRow>(&self.sql.presence_changes)
            .bind(since)
            .bind(millis(horizon))
            .fetch_all(&mut *tx)
            .await
            .map_err(self.error("presence"))?;
        tx.commit().await.map_err(self.error("presence"))?;
        Ok(sql::member_changes_from_rows(rows).unwrap_or_default())
    }

    /// Adds `column` (declared `decl`) to the table `{table}{suffix}` made
    /// before it (SQLite has no `ADD COLUMN IF NOT EXISTS`; a concurrent
    /// migrate that added it first is fine).
    async fn add_column(&self, suffix: &str, column: &str, decl: &str) -> Result<(), StoreError> {
        let table = format!("{}{suffix}", self.table);
        let has: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM pragma_table_info('{table}') WHERE name = '{column}'"
        ))
        .fetch_one(&self.pool)
        .await
        .map_err(self.error("migrate"))?;
        if has > 0 {
            return Ok(());
        }
        let alter = format!("ALTER TABLE {table} ADD COLUMN {column} {decl}");
        match sqlx::query(&alter).execute(&self.pool).await {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(db)) if db.message().contains("duplicate column") => Ok(()),
            Err(e) => Err(self.target.error("migrate", e)),
        }
    }

    async fn redefine_call(
        &self,
        name: &str,
        from_epoch: u64,
        definition: &str,
        settle: Duration,
    ) -> Result<Option<PartitionRecord>, StoreError> {
        let op = "redefine_partition";
        let mut tx = self.pool.begin().await.map_err(self.error(op))?;
        let change = if from_epoch == 0 {
            sqlx::query(&self.sql.insert_partition)
                .bind(name)
                .bind(definition)
                .bind(millis(settle))
        } else {
            sqlx::query(&self.sql.redefine_partition)
                .bind(name)
                .bind(definition)
                .bind(from_epoch as i64)
                .bind(millis(settle))
        };
        let changed = change.execute(&mut *tx).await.map_err(self.error(op))?;
        if changed.rows_affected() == 0 {
            return Ok(None);
        }
        let row = sqlx::query_as::<_, PartitionRow>(&self.sql.partition)
            .bind(name)
            .fetch_one(&mut *tx)
            .await
            .map_err(self.error(op))?;
        sqlx::query(&self.sql.wake)
            .execute(&mut *tx)
            .await
            .map_err(self.error(op))?;
        tx.commit().await.map_err(self.error(op))?;
        Ok(Some(row.into()))
    }

    async fn leave_call(&self, me: &InstanceInfo) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(self.error("leave"))?;
        sqlx::query(&self.sql.leave)
            .bind(&me.id)
            .execute(&mut *tx)
            .await
            .map_err(self.error("leave"))?;
        sqlx::query(&self.sql.wake)
            .execute(&mut *tx)
            .await
            .map_err(self.error("leave"))?;
        tx.commit().await.map_err(self.error("leave"))?;
        Ok(())
    }
}

impl LeaseStore for SqliteStore {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        async move {
            // Fold the WAL into the database and close every connection:
            // the last close removes the -wal and -shm files.
            let checkpoint = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(&self.pool);
            if let Err(e) = checkpoint.await {
                tracing::debug!(error = %e, "SQLite checkpoint at stop failed");
            }
            self.pool.close().await;
            // The pool's connections close at once, each on its own thread,
            // and each may see another still open and leave the files to
            // the next opener (seen on a busy machine). One more connection,
            // closed alone, is the last for certain: it checkpoints and
            // removes them.
            use sqlx::{ConnectOptions, Connection};
            let options = (*self.pool.connect_options()).clone();
            if let Ok(last) = options.connect().await {
                if let Err(e) = last.close().await {
                    tracing::debug!(error = %e, "closing SQLite's last connection at stop failed");
                }
            }
        }
        .boxed()
    }

    fn migrate(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        async move {
            sqlx::raw_sql(&self.sql.migrate)
                .execute(&self.pool)
                .await
                .map_err(self.error("migrate"))?;
            self.add_column("_members", "routes", "TEXT NOT NULL DEFAULT ''")
                .await?;
            self.add_column("", "changed", "INTEGER NOT NULL DEFAULT 0")
                .await?;
            self.add_column("_members", "changed", "INTEGER NOT NULL DEFAULT 0")
                .await?;
            sqlx::raw_sql(&self.sql.mark)
                .execute(&self.pool)
                .await
                .map_err(self.error("migrate"))?;
            Ok(())
        }
        .boxed()
    }

    fn register<'a>(&'a self, roles: &'a [RoleName]) -> BoxFuture<'a, Result<(), StoreError>> {
        async move {
            sqlx::query(&self.sql.register)
                .bind(json("register", &roles)?)
                .execute(&self.pool)
                .await
                .map_err(self.error("register"))?;
            Ok(())
        }
        .boxed()
    }

    fn claim<'a>(
        &'a self,
        instance: &'a InstanceInfo,
        claims: &'a [Claim],
    ) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>> {
        async move {
            let batch: Vec<serde_json::Value> = claims
                .iter()
                .map(|c| {
                    let once = u8::from(c.one_shot);
                    serde_json::json!({"role": c.role, "held": c.held_token, "ms": millis(c.duration), "once": once})
                })
                .collect();
            let rows = sqlx::query_as::<_, GrantRow>(&self.sql.claim)
                .bind(&instance.id)
                .bind(&instance.address)
                .bind(json("claim", &batch)?)
                .fetch_all(&self.pool)
                .await
                .map_err(self.error("claim"))?;
            Ok(rows.into_iter().map(Grant::from).collect())
        }
        .boxed()
    }

    fn release<'a>(
        &'a self,
        instance: &'a InstanceInfo,
        held: &'a [(RoleName, u64)],
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        async move {
            let batch: Vec<serde_json::Value> = held
                .iter()
                .map(|(role, token)| serde_json::json!({"role": role, "token": token}))
                .collect();
            sqlx::query_scalar::<_, String>(&self.sql.release)
                .bind(&instance.id)
                .bind(json("release", &batch)?)
                .fetch_all(&self.pool)
                .await
                .map_err(self.error("release"))
        }
        .boxed()
    }

    fn snapshot<'a>(
        &'a self,
        roles: &'a [RoleName],
    ) -> BoxFuture<'a, Result<Vec<LeaseRecord>, StoreError>> {
        async move {
            let query = if roles.is_empty() {
                sqlx::query_as::<_, LeaseRow>(&self.sql.snapshot_all)
            } else {
                sqlx::query_as::<_, LeaseRow>(&self.sql.snapshot).bind(json("snapshot", &roles)?)
            };
            let rows = query
                .fetch_all(&self.pool)
                .await
                .map_err(self.error("snapshot"))?;
            Ok(rows.into_iter().map(LeaseRecord::from).collect())
        }
        .boxed()
    }

    fn changes<'a>(
        &'a self,
        roles: &'a [RoleName],
        since: Option<Cursor>,
        horizon: Duration,
    ) -> BoxFuture<'a, Result<Changes, StoreError>> {
        async move {
            if let Some(since) = since {
                let rows = sqlx::query_as::<_, ChangeRow>(&self.sql.changes)
                    .bind(since.position as i64)
                    .bind(millis(horizon))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(self.error("snapshot"))?;
                // The generation goes back only with another database file
                // (restored, replaced): read everything then.
                if let Some((next, records)) = sql::changes_from_rows(rows) {
                    if next >= since.position {
                        return Ok(Changes::changed(records, Cursor::at(next)));
                    }
                }
            }
            let rows = sqlx::query_as::<_, ChangeRow>(&self.sql.changes_full)
                .bind(json("snapshot", &roles)?)
                .fetch_all(&self.pool)
                .await
                .map_err(self.error("snapshot"))?;
            let (next, records) = sql::changes_from_rows(rows).unwrap_or_default();
            Ok(Changes::full(records, Cursor::at(next)))
        }
        .boxed()
    }

    fn tally<'a>(
        &'a self,
        roles: &'a [RoleName],
    ) -> BoxFuture<'a, Result<Option<Tally>, StoreError>> {
        async move {
            let row = sqlx::query_as::<_, TallyRow>(&self.sql.tally)
                .bind(json("tally", &roles)?)
                .fetch_one(&self.pool)
                .await
                .map_err(self.error("tally"))?;
            Ok(Some(Tally::from(row)))
        }
        .boxed()
    }

    fn subscribe(&self) -> BoxFuture<'_, Result<ChangeFeed, StoreError>> {
        async move {
            let pool = self.pool.clone();
            let sql = self.sql.generation.clone();
            let read = move || {
                let (pool, sql) = (pool.clone(), sql.clone());
                async move {
                    sqlx::query_scalar::<_, i64>(&sql)
                        .fetch_optional(&pool)
                        .await
                }
            };
            let seen = read().await.map_err(self.error("subscribe"))?;
            let mut tick = tokio::time::interval(POLL_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // A notice whenever the counter moves; read failures are skipped.
            let notices = stream::unfold((seen, tick), move |(mut seen, mut tick)| {
                let read = read.clone();
                async move {
                    loop {
                        tick.tick().await;
                        if let Ok(now) = read().await {
                            if now != seen {
                                seen = now;
                                return Some(((), (seen, tick)));
                            }
                        }
                    }
                }
            });
            Ok(feed::spawn(notices))
        }
        .boxed()
    }

    fn presence<'a>(
        &'a self,
        me: &'a InstanceInfo,
        candidate: bool,
        routes: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Member>, StoreError>> {
        async move {
            let record = (candidate, routes, ttl);
            let (_, members, _) = self.presence_call(me, record, None, Duration::ZERO).await?;
            Ok(members)
        }
        .boxed()
    }

    fn presence_changes<'a>(
        &'a self,
        me: &'a InstanceInfo,
        candidate: bool,
        routes: &'a str,
        ttl: Duration,
        since: Option<Cursor>,
        horizon: Duration,
    ) -> BoxFuture<'a, Result<MemberChanges, StoreError>> {
        async move {
            let record = (candidate, routes, ttl);
            if let Some(since) = since {
                let position = since.position as i64;
                let read = self.presence_call(me, record, Some(position), horizon);
                let (next, members, gone) = read.await?;
                // The generation goes back only with another database file.
                if next >= since.position {
                    return Ok(MemberChanges::changed(members, gone, Cursor::at(next)));
                }
            }
            let (next, members, _) = self.presence_call(me, record, None, horizon).await?;
            Ok(MemberChanges::full(members, Cursor::at(next)))
        }
        .boxed()
    }

    fn partitions(&self) -> BoxFuture<'_, Result<Vec<PartitionRecord>, StoreError>> {
        async move {
            let rows = sqlx::query_as::<_, PartitionRow>(&self.sql.partitions)
                .fetch_all(&self.pool)
                .await
                .map_err(self.error("partitions"))?;
            Ok(rows.into_iter().map(PartitionRecord::from).collect())
        }
        .boxed()
    }

    fn define_partition<'a>(
        &'a self,
        name: &'a str,
        definition: &'a str,
    ) -> BoxFuture<'a, Result<PartitionRecord, StoreError>> {
        async move {
            let op = "define_partition";
            let mut tx = self.pool.begin().await.map_err(self.error(op))?;
            sqlx::query(&self.sql.define_partition)
                .bind(name)
                .bind(definition)
                .execute(&mut *tx)
                .await
                .map_err(self.error(op))?;
            let row = sqlx::query_as::<_, PartitionRow>(&self.sql.partition)
                .bind(name)
                .fetch_one(&mut *tx)
                .await
                .map_err(self.error(op))?;
            tx.commit().await.map_err(self.error(op))?;
            Ok(row.into())
        }
        .boxed()
    }

    fn redefine_partition<'a>(
        &'a self,
        name: &'a str,
        from_epoch: u64,
        definition: &'a str,
        settle: Duration,
    ) -> BoxFuture<'a, Result<Option<PartitionRecord>, StoreError>> {
        self.redefine_call(name, from_epoch, definition, settle)
            .boxed()
    }

    fn leave<'a>(&'a self, me: &'a InstanceInfo) -> BoxFuture<'a, Result<(), StoreError>> {
        self.leave_call(me).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_rendered_whole() {
        let s = Statements::new("leases");
        for sql in [
            &s.migrate,
            &s.register,
            &s.claim,
            &s.release,
            &s.snapshot,
            &s.snapshot_all,
            &s.changes,
            &s.tally,
            &s.changes_full,
            &s.mark,
            &s.generation,
            &s.partitions,
            &s.partition,
            &s.define_partition,
            &s.insert_partition,
            &s.redefine_partition,
        ] {
            assert!(!sql.contains('{') && !sql.contains('}'), "{sql}");
            assert!(sql.contains("leases"), "{sql}");
        }
    }

    #[tokio::test]
    async fn a_bad_table_name_is_refused_by_the_constructor() {
        let e = SqliteStore::connect("sqlite::memory:", "x; DROP TABLE y")
            .await
            .err()
            .expect("refused");
        assert!(matches!(e, StoreError::BadTableName(_)), "{e}");
    }

    #[tokio::test]
    async fn a_missing_table_is_a_schema_error() {
        let store = SqliteStore::connect("sqlite::memory:", "leases")
            .await
            .unwrap();
        let e = store.snapshot(&[]).await.unwrap_err();
        assert!(e.is_schema(), "{e}");
        assert!(e.to_string().contains("rolegate migrate"), "{e}");
    }
}
