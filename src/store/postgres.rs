//! PostgreSQL store: the app's own database. Expiry is judged by the
//! database clock (`clock_timestamp()`); every term change and release fires
//! a trigger that `pg_notify`s, so contenders wake and snapshots refresh
//! within milliseconds. Each batched call is one statement.

use std::str::FromStr;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::Row;
use tokio::sync::mpsc;

use super::{
    millis, ChangeFeed, Claim, Grant, InstanceInfo, LeaseRecord, LeaseStore, RoleName, StoreError,
};

/// Lease table in PostgreSQL (default name `rolegate_role_leases`).
pub struct PostgresStore {
    pool: PgPool,
    table: String,
    channel: String,
    sql: Statements,
}

struct Statements {
    claim: String,
    release: String,
    register: String,
    snapshot: String,
    snapshot_all: String,
}

fn unavailable(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("42P01") => {
            StoreError::Schema(db.message().to_string())
        }
        _ => StoreError::Unavailable(e.to_string()),
    }
}

impl PostgresStore {
    /// Creates a lazily connecting pool: a database that is down at start is
    /// reported by the first call, and retried by the coordinator.
    pub async fn connect(url: &str, table: &str) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| {
                StoreError::Config(format!(
                    "store.url: {}",
                    crate::redact::redact_text(&e.to_string())
                ))
            })?
            .application_name("rolegate");
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(3))
            .connect_lazy_with(options);
        Ok(Self::with_pool(pool, table))
    }

    /// Uses an existing pool (library users sharing their app's pool).
    pub fn with_pool(pool: PgPool, table: &str) -> Self {
        let t = table;
        let sql = Statements {
            claim: format!(
                r#"WITH req AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS r(role, held_token, duration_ms)
), now AS MATERIALIZED (
    SELECT clock_timestamp() AS ts
), locked AS MATERIALIZED (
    -- Lock only rows this instance may take; never wait on another claimer.
    SELECT l.role FROM {t} l JOIN req r ON r.role = l.role CROSS JOIN now
    WHERE l.holder_id IS NULL OR l.holder_id = $4 OR l.expires_at <= now.ts
    ORDER BY l.role
    FOR UPDATE OF l SKIP LOCKED
)
UPDATE {t} l SET
    token = CASE WHEN l.holder_id = $4 AND l.token = r.held_token AND l.expires_at > now.ts
                 THEN l.token ELSE l.token + 1 END,
    acquired_at = CASE WHEN l.holder_id = $4 AND l.token = r.held_token AND l.expires_at > now.ts
                 THEN l.acquired_at ELSE now.ts END,
    renewed_at = now.ts,
    expires_at = now.ts + r.duration_ms * interval '1 millisecond',
    duration_ms = r.duration_ms,
    holder_id = $4,
    holder_address = $5
FROM req r, now
WHERE l.role = r.role
  AND l.role IN (SELECT role FROM locked)
  AND (l.holder_id IS NULL OR l.holder_id = $4 OR l.expires_at <= now.ts)
RETURNING l.role, l.token"#
            ),
            release: format!(
                r#"UPDATE {t} l SET holder_id = NULL, holder_address = NULL, expires_at = clock_timestamp()
FROM unnest($1::text[], $2::bigint[]) AS r(role, token)
WHERE l.role = r.role AND l.token = r.token AND l.holder_id = $3
RETURNING l.role"#
            ),
            register: format!(
                "INSERT INTO {t} (role) SELECT x FROM unnest($1::text[]) AS x ORDER BY x ON CONFLICT (role) DO NOTHING"
            ),
            snapshot: format!(
                r#"SELECT role, holder_id, holder_address, token,
       CASE WHEN holder_id IS NOT NULL AND expires_at > clock_timestamp()
            THEN ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint ELSE 0 END AS remaining_ms
FROM {t} WHERE role = ANY($1::text[])"#
            ),
            snapshot_all: format!(
                r#"SELECT role, holder_id, holder_address, token,
       CASE WHEN holder_id IS NOT NULL AND expires_at > clock_timestamp()
            THEN ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint ELSE 0 END AS remaining_ms
FROM {t} ORDER BY role"#
            ),
        };
        Self {
            pool,
            table: table.to_string(),
            channel: table.to_string(),
            sql,
        }
    }

    fn migration(&self) -> String {
        let t = &self.table;
        let ch = &self.channel;
        format!(
            r#"
SELECT pg_advisory_xact_lock(hashtext('rolegate-migrate:{t}'));
CREATE TABLE IF NOT EXISTS {t} (
    role            text PRIMARY KEY CHECK (octet_length(role) BETWEEN 1 AND 128),
    holder_id       text,
    holder_address  text,
    token           bigint NOT NULL DEFAULT 0,
    duration_ms     bigint NOT NULL DEFAULT 0,
    acquired_at     timestamptz,
    renewed_at      timestamptz,
    expires_at      timestamptz NOT NULL DEFAULT 'epoch'
);
CREATE OR REPLACE FUNCTION {t}_notify() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('{ch}', NEW.role);
    RETURN NULL;
END
$fn$;
DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = '{t}_term_change' AND tgrelid = '{t}'::regclass) THEN
        CREATE TRIGGER {t}_term_change AFTER UPDATE ON {t} FOR EACH ROW
        WHEN (NEW.token IS DISTINCT FROM OLD.token OR NEW.holder_id IS DISTINCT FROM OLD.holder_id)
        EXECUTE FUNCTION {t}_notify();
    END IF;
END
$do$;
"#
        )
    }
}

impl LeaseStore for PostgresStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn migrate(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        async move {
            // One simple-query message: PostgreSQL runs it as one implicit
            // transaction, so the advisory lock serializes concurrent migrations.
            let script = self.migration();
            sqlx::raw_sql(&script)
                .execute(&self.pool)
                .await
                .map_err(unavailable)?;
            Ok(())
        }
        .boxed()
    }

    fn register<'a>(&'a self, roles: &'a [RoleName]) -> BoxFuture<'a, Result<(), StoreError>> {
        async move {
            sqlx::query(&self.sql.register)
                .bind(names(roles))
                .execute(&self.pool)
                .await
                .map_err(unavailable)?;
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
            let rows = sqlx::query(&self.sql.claim)
                .bind(&roles)
                .bind(&held)
                .bind(&durations)
                .bind(&instance.id)
                .bind(&instance.address)
                .fetch_all(&self.pool)
                .await
                .map_err(unavailable)?;
            rows.iter()
                .map(|row| {
                    Ok(Grant {
                        role: row.try_get("role").map_err(unavailable)?,
                        token: row.try_get::<i64, _>("token").map_err(unavailable)? as u64,
                    })
                })
                .collect()
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
            let rows = sqlx::query(&self.sql.release)
                .bind(&roles)
                .bind(&tokens)
                .bind(&instance.id)
                .fetch_all(&self.pool)
                .await
                .map_err(unavailable)?;
            rows.iter()
                .map(|r| r.try_get("role").map_err(unavailable))
                .collect()
        }
        .boxed()
    }

    fn snapshot<'a>(
        &'a self,
        roles: &'a [RoleName],
    ) -> BoxFuture<'a, Result<Vec<LeaseRecord>, StoreError>> {
        async move {
            let query = if roles.is_empty() {
                sqlx::query(&self.sql.snapshot_all)
            } else {
                sqlx::query(&self.sql.snapshot).bind(names(roles))
            };
            let rows = query.fetch_all(&self.pool).await.map_err(unavailable)?;
            rows.iter()
                .map(|row| {
                    let remaining: i64 = row.try_get("remaining_ms").map_err(unavailable)?;
                    Ok(LeaseRecord {
                        role: row.try_get("role").map_err(unavailable)?,
                        holder: row.try_get("holder_id").map_err(unavailable)?,
                        holder_address: row.try_get("holder_address").map_err(unavailable)?,
                        token: row.try_get::<i64, _>("token").map_err(unavailable)? as u64,
                        remaining: Duration::from_millis(remaining.max(0) as u64),
                    })
                })
                .collect()
        }
        .boxed()
    }

    fn subscribe(&self) -> BoxFuture<'_, Result<ChangeFeed, StoreError>> {
        async move {
            let mut listener = PgListener::connect_with(&self.pool)
                .await
                .map_err(unavailable)?;
            listener.listen(&self.channel).await.map_err(unavailable)?;
            let (tx, feed) = mpsc::channel(1);
            tokio::spawn(async move {
                // Any loss of the LISTEN connection ends the feed: the coordinator
                // polls meanwhile and subscribes anew, so no gap goes unnoticed.
                loop {
                    tokio::select! {
                        _ = tx.closed() => return,
                        next = listener.try_recv() => match next {
                            Ok(Some(_)) => {
                                let _ = tx.try_send(());
                            }
                            Ok(None) => return,
                            Err(e) => {
                                tracing::debug!(error = %e, "LISTEN connection failed; the feed ends");
                                return;
                            }
                        }
                    }
                }
            });
            Ok(feed)
        }
        .boxed()
    }
}

/// Role names as a text array parameter.
fn names(roles: &[RoleName]) -> Vec<&str> {
    roles.iter().map(|r| r.as_str()).collect()
}
