//! PostgreSQL store: the app's own database. Expiry is judged by the
//! database clock (`clock_timestamp()`); every term change and release fires
//! a trigger that `pg_notify`s, so contenders wake and snapshots refresh
//! within milliseconds. Each batched call is one statement (`sql/postgres/`).

use std::str::FromStr;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{stream, FutureExt};
use sqlx::postgres::{
    PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions, PgSslMode,
};
use sqlx::Connection;

use super::sql::{
    self, ChangeRow, Dialect, GrantRow, LeaseRow, MemberChangeRow, PartitionRow, TallyRow, Target,
};
use super::tls::PgTlsParams;
use super::{
    check_table_name, feed, millis, ChangeFeed, Changes, Claim, Cursor, Grant, InstanceInfo,
    LeaseRecord, LeaseStore, Member, MemberChanges, PartitionRecord, RoleName, StoreError, Tally,
};

/// How long the direct connection attempt that explains a pool timeout may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Lease table in PostgreSQL (default name `rolegate_role_leases`).
pub struct PostgresStore {
    pool: PgPool,
    target: Target,
    channel: String,
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
    changes_all: String,
    presence_changes: String,
    leave: String,
    partitions: String,
    partition: String,
    define_partition: String,
    redefine_partition: String,
}

impl Statements {
    fn new(table: &str) -> Self {
        let fragments = [
            ("lease_row", include_str!("sql/postgres/lease_row.sql")),
            (
                "partition_row",
                include_str!("sql/postgres/partition_row.sql"),
            ),
        ];
        let render = |template| sql::render(template, table, &fragments);
        Self {
            migrate: render(include_str!("sql/postgres/migrate.sql")),
            register: render(include_str!("sql/postgres/register.sql")),
            claim: render(include_str!("sql/postgres/claim.sql")),
            release: render(include_str!("sql/postgres/release.sql")),
            snapshot: render(include_str!("sql/postgres/snapshot.sql")),
            snapshot_all: render(include_str!("sql/postgres/snapshot_all.sql")),
            changes: render(include_str!("sql/postgres/changes.sql")),
            tally: render(include_str!("sql/postgres/tally.sql")),
            // By name (an index lookup each), or every row: one statement
            // for both would read every row and search the names for each.
            changes_full: render(include_str!("sql/postgres/changes_full.sql"))
                .replace("{roles}", "role = ANY($1::text[])"),
            changes_all: render(include_str!("sql/postgres/changes_full.sql"))
                .replace("{roles}", "cardinality($1::text[]) = 0"),
            presence_changes: render(include_str!("sql/postgres/presence_changes.sql")),
            leave: render(include_str!("sql/postgres/leave.sql")),
            partitions: render(include_str!("sql/postgres/partitions.sql")),
            partition: render(include_str!("sql/postgres/partition.sql")),
            define_partition: render(include_str!("sql/postgres/define_partition.sql")),
            redefine_partition: render(include_str!("sql/postgres/redefine_partition.sql")),
        }
    }
}

impl PostgresStore {
    /// Creates a lazily connecting pool: a database that is down at start is
    /// reported by the first call, and retried by the coordinator. Refuses a
    /// bad table name or URL.
    ///
    /// TLS follows libpq's URL parameters `sslmode` (`disable`, `prefer`,
    /// `require`, `verify-ca`, `verify-full`), `sslrootcert`, `sslcert` and
    /// `sslkey`; the files are checked here, so a bad one is refused at
    /// start, and read again by every new connection.
    pub async fn connect(url: &str, table: &str) -> Result<Self, StoreError> {
        check_table_name(table)?;
        let tls = PgTlsParams::parse(url).map_err(|e| StoreError::config("store.url", e))?;
        tls.check_files()?;
        let mut options = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::config("store.url", e))?
            .application_name("rolegate");
        if tls.require_means_verify_ca() {
            options = options.ssl_mode(PgSslMode::VerifyCa);
        }
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .min_connections(0)
            .acquire_timeout(sql::ACQUIRE_TIMEOUT)
            .connect_lazy_with(options);
        Self::with_pool(pool, table)
    }

    /// Uses an existing pool (library users sharing their app's pool).
    /// Refuses a bad table name.
    pub fn with_pool(pool: PgPool, table: &str) -> Result<Self, StoreError> {
        check_table_name(table)?;
        let target = Target {
            dialect: Dialect::Postgres,
            at: endpoint(&pool.connect_options()),
            acquire_timeout: pool.options().get_acquire_timeout(),
        };
        Ok(Self {
            pool,
            target,
            channel: table.to_string(),
            sql: Statements::new(table),
        })
    }

    /// The store error for a failed `op`. A pool that timed out waiting for a
    /// connection hides why: one direct connection attempt names the cause
    /// (refused, unknown host, bad password) or shows the pool was only busy.
    async fn fail(&self, op: &'static str, e: sqlx::Error) -> StoreError {
        if !matches!(e, sqlx::Error::PoolTimedOut) {
            return self.target.error(op, e);
        }
        let options = self.pool.connect_options();
        match tokio::time::timeout(PROBE_TIMEOUT, PgConnection::connect_with(&options)).await {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                self.target.error(op, e)
            }
            Ok(Err(cause)) => self.target.error(sql::CONNECT, cause),
            Err(_) => StoreError::timeout(
                format!("connecting to PostgreSQL at {}", self.target.at),
                self.target.acquire_timeout + PROBE_TIMEOUT,
            ),
        }
    }

    /// Runs one call; maps its failure with [`Self::fail`].
    async fn run<T>(
        &self,
        op: &'static str,
        call: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, StoreError> {
        match call.await {
            Ok(v) => Ok(v),
            Err(e) => Err(self.fail(op, e).await),
        }
    }
}

/// `host:port` or the socket path the options connect to (never credentials).
fn endpoint(options: &PgConnectOptions) -> String {
    match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    }
}

impl LeaseStore for PostgresStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn migrate(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        async move {
            // One simple-query message: one implicit transaction.
            let script = sqlx::raw_sql(&self.sql.migrate).execute(&self.pool);
            self.run("migrate", script).await?;
            Ok(())
        }
        .boxed()
    }

    fn register<'a>(&'a self, roles: &'a [RoleName]) -> BoxFuture<'a, Result<(), StoreError>> {
        async move {
            let query = sqlx::query(&self.sql.register)
                .bind(names(roles))
                .execute(&self.pool);
            self.run("register", query).await?;
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
            let roles: Vec<&str> = claims.iter().map(|c| c.role.as_str()).collect();
            let held: Vec<Option<i64>> = claims
                .iter()
                .map(|c| c.held_token.map(|t| t as i64))
                .collect();
            let durations: Vec<i64> = claims.iter().map(|c| millis(c.duration)).collect();
            let one_shot: Vec<bool> = claims.iter().map(|c| c.one_shot).collect();
            let query = sqlx::query_as::<_, GrantRow>(&self.sql.claim)
                .bind(&roles)
                .bind(&held)
                .bind(&durations)
                .bind(&instance.id)
                .bind(&instance.address)
                .bind(&one_shot)
                .fetch_all(&self.pool);
            let rows = self.run("claim", query).await?;
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
            let roles: Vec<&str> = held.iter().map(|(r, _)| r.as_str()).collect();
            let tokens: Vec<i64> = held.iter().map(|(_, t)| *t as i64).collect();
            let query = sqlx::query_scalar::<_, String>(&self.sql.release)
                .bind(&roles)
                .bind(&tokens)
                .bind(&instance.id)
                .fetch_all(&self.pool);
            self.run("release", query).await
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
                sqlx::query_as::<_, LeaseRow>(&self.sql.snapshot).bind(names(roles))
            };
            let rows = self.run("snapshot", query.fetch_all(&self.pool)).await?;
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
                let query = sqlx::query_as::<_, ChangeRow>(&self.sql.changes)
                    .bind(since.position as i64)
                    .bind(millis(horizon));
                let rows = self.run("snapshot", query.fetch_all(&self.pool)).await?;
                // Transaction ids never go back, unless the database was
                // restored or replaced: read everything then.
                if let Some((next, records)) = sql::changes_from_rows(rows) {
                    if next >= since.position {
                        let cursor = Cursor::at(next);
                        return Ok(Changes::changed(records, cursor));
                    }
                }
            }
            let full = match roles.is_empty() {
                true => &self.sql.changes_all,
                false => &self.sql.changes_full,
            };
            let query = sqlx::query_as::<_, ChangeRow>(full).bind(names(roles));
            let rows = self.run("snapshot", query.fetch_all(&self.pool)).await?;
            let (next, records) = sql::changes_from_rows(rows).unwrap_or_default();
            Ok(Changes::full(records, Cursor::at(next)))
        }
        .boxed()
    }

    fn check_access(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        async move {
            self.snapshot(&[]).await?;
            self.partitions().await?;
            // What a gateway needs (see deploy/postgres/grants.sql): no
            // DELETE on the lease table, whose rows are never deleted.
            // `has_table_privilege` with a list answers "any of them": ask
            // one by one.
            let table = &self.channel;
            let sql = format!(
                "SELECT t || ': ' || p FROM (VALUES \
                 ('{table}', 'SELECT'), ('{table}', 'INSERT'), ('{table}', 'UPDATE'), \
                 ('{table}_members', 'SELECT'), ('{table}_members', 'INSERT'), \
                 ('{table}_members', 'UPDATE'), ('{table}_members', 'DELETE'), \
                 ('{table}_partitions', 'SELECT'), ('{table}_partitions', 'INSERT'), \
                 ('{table}_partitions', 'UPDATE')) \
                 AS need(t, p) \
                 WHERE NOT has_table_privilege(t, p)"
            );
            let query = sqlx::query_scalar::<_, String>(&sql).fetch_all(&self.pool);
            let missing = self.run("check_access", query).await?;
            if missing.is_empty() {
                Ok(())
            } else {
                Err(StoreError::Privileges {
                    missing: missing.join(", "),
                })
            }
        }
        .boxed()
    }

    fn tally<'a>(
        &'a self,
        roles: &'a [RoleName],
    ) -> BoxFuture<'a, Result<Option<Tally>, StoreError>> {
        async move {
            let query = sqlx::query_as::<_, TallyRow>(&self.sql.tally).bind(names(roles));
            let row = self.run("tally", query.fetch_one(&self.pool)).await?;
            Ok(Some(Tally::from(row)))
        }
        .boxed()
    }

    fn subscribe(&self) -> BoxFuture<'_, Result<ChangeFeed, StoreError>> {
        async move {
            let mut listener = self
                .run("subscribe", PgListener::connect_with(&self.pool))
                .await?;
            self.run("subscribe", listener.listen(&self.channel))
                .await?;
            let notices = stream::unfold(listener, |mut listener| async move {
                match listener.try_recv().await {
                    Ok(Some(_)) => Some(((), listener)),
                    Ok(None) => None,
                    Err(e) => {
                        tracing::debug!(error = %e, "LISTEN connection failed; the feed ends");
                        None
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
            let read = self.presence_changes(me, candidate, routes, ttl, None, Duration::ZERO);
            Ok(read.await?.members)
        }
        .boxed()
    }

    fn partitions(&self) -> BoxFuture<'_, Result<Vec<PartitionRecord>, StoreError>> {
        async move {
            let query = sqlx::query_as::<_, PartitionRow>(&self.sql.partitions);
            let rows = self.run("partitions", query.fetch_all(&self.pool)).await?;
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
            let insert = sqlx::query(&self.sql.define_partition)
                .bind(name)
                .bind(definition)
                .execute(&self.pool);
            self.run("define_partition", insert).await?;
            let read = sqlx::query_as::<_, PartitionRow>(&self.sql.partition)
                .bind(name)
                .fetch_one(&self.pool);
            Ok(self.run("define_partition", read).await?.into())
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
        async move {
            let change = sqlx::query_scalar::<_, i64>(&self.sql.redefine_partition)
                .bind(name)
                .bind(definition)
                .bind(from_epoch as i64)
                .bind(millis(settle))
                .fetch_one(&self.pool);
            if self.run("redefine_partition", change).await? == 0 {
                return Ok(None);
            }
            let read = sqlx::query_as::<_, PartitionRow>(&self.sql.partition)
                .bind(name)
                .fetch_optional(&self.pool);
            let row = self.run("redefine_partition", read).await?;
            Ok(row.map(PartitionRecord::from))
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
            let read = |since: Option<i64>| {
                sqlx::query_as::<_, MemberChangeRow>(&self.sql.presence_changes)
                    .bind(&me.id)
                    .bind(&me.address)
                    .bind(candidate)
                    .bind(millis(ttl))
                    .bind(routes)
                    .bind(since)
                    .bind(millis(horizon))
                    .fetch_all(&self.pool)
            };
            if let Some(since) = since {
                let position = since.position as i64;
                let rows = self.run("presence", read(Some(position))).await?;
                // Transaction ids go back only in another (restored)
                // database: read everything then.
                let answer = sql::member_changes_from_rows(rows);
                if let Some((next, members, gone)) = answer.filter(|a| a.0 as i64 >= position) {
                    return Ok(MemberChanges::changed(members, gone, Cursor::at(next)));
                }
            }
            let rows = self.run("presence", read(None)).await?;
            let (next, members, _) = sql::member_changes_from_rows(rows).unwrap_or_default();
            Ok(MemberChanges::full(members, Cursor::at(next)))
        }
        .boxed()
    }

    fn leave<'a>(&'a self, me: &'a InstanceInfo) -> BoxFuture<'a, Result<(), StoreError>> {
        async move {
            let query = sqlx::query(&self.sql.leave)
                .bind(&me.id)
                .execute(&self.pool);
            self.run("leave", query).await?;
            Ok(())
        }
        .boxed()
    }
}

/// Role names as a text array parameter.
fn names(roles: &[RoleName]) -> Vec<&str> {
    roles.iter().map(|r| r.as_str()).collect()
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
            &s.changes_all,
            &s.presence_changes,
            &s.leave,
            &s.partitions,
            &s.partition,
            &s.define_partition,
            &s.redefine_partition,
        ] {
            assert!(!sql.contains('{') && !sql.contains('}'), "{sql}");
            assert!(sql.contains("leases"), "{sql}");
        }
    }

    #[tokio::test]
    async fn a_bad_table_name_is_refused_by_the_constructor() {
        let e = PostgresStore::connect("postgres://u:p@127.0.0.1:1/db", "Robert'); DROP")
            .await
            .err()
            .expect("refused");
        assert!(matches!(e, StoreError::BadTableName(_)), "{e}");
        let pool = PgPoolOptions::new()
            .connect_lazy("postgres://127.0.0.1:1/db")
            .unwrap();
        assert!(matches!(
            PostgresStore::with_pool(pool, "1abc"),
            Err(StoreError::BadTableName(_))
        ));
    }

    #[tokio::test]
    async fn an_unreachable_server_is_named_with_its_refusal() {
        // Port 1 on loopback: nothing listens there.
        let store = PostgresStore::connect("postgres://app:s3cret@127.0.0.1:1/db", "leases")
            .await
            .unwrap();
        let e = store.snapshot(&[]).await.unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("cannot connect to PostgreSQL at 127.0.0.1:1: "),
            "{text}"
        );
        assert!(text.to_lowercase().contains("refused"), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
        assert!(std::error::Error::source(&e).is_some());
    }
}
