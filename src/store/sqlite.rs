//! SQLite store: the embedded default, one file in WAL mode shared by several
//! processes on one machine. Expiry is judged by SQLite's clock (`julianday
//! ('now')`, the one machine's clock). A trigger bumps a generation counter on
//! every term change; subscribers poll that one integer every few
//! milliseconds, which is how a release wakes the other processes.

use std::str::FromStr;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::Row;
use tokio::sync::mpsc;

use super::{
    millis, ChangeFeed, Claim, Grant, InstanceInfo, LeaseRecord, LeaseStore, RoleName, StoreError,
};

/// How often subscribers look at the generation counter.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// Milliseconds since the Unix epoch by SQLite's clock.
const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

pub struct SqliteStore {
    pool: SqlitePool,
    table: String,
}

fn unavailable(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Database(db) if db.message().contains("no such table") => {
            StoreError::Schema(db.message().to_string())
        }
        _ => StoreError::Unavailable(e.to_string()),
    }
}

impl SqliteStore {
    /// Opens (creating if missing) the database file named by `url`
    /// (`sqlite://path/to/file.db` or `sqlite::memory:`).
    pub async fn connect(url: &str, table: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| {
                StoreError::Config(format!(
                    "store.url: {}",
                    crate::redact::redact_text(&e.to_string())
                ))
            })?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(2));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(3))
            .connect_with(options)
            .await
            .map_err(unavailable)?;
        Ok(Self {
            pool,
            table: table.to_string(),
        })
    }
}

impl LeaseStore for SqliteStore {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    fn migrate(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        async move {
            let t = &self.table;
            let script = format!(
                r#"
CREATE TABLE IF NOT EXISTS {t} (
    role            TEXT PRIMARY KEY CHECK (length(CAST(role AS BLOB)) BETWEEN 1 AND 128),
    holder_id       TEXT,
    holder_address  TEXT,
    token           INTEGER NOT NULL DEFAULT 0,
    duration_ms     INTEGER NOT NULL DEFAULT 0,
    acquired_at_ms  INTEGER,
    renewed_at_ms   INTEGER,
    expires_at_ms   INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS {t}_changes (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    generation  INTEGER NOT NULL
);
INSERT OR IGNORE INTO {t}_changes (id, generation) VALUES (1, 0);
CREATE TRIGGER IF NOT EXISTS {t}_term_change AFTER UPDATE ON {t} FOR EACH ROW
WHEN NEW.token IS NOT OLD.token OR NEW.holder_id IS NOT OLD.holder_id
BEGIN
    UPDATE {t}_changes SET generation = generation + 1 WHERE id = 1;
END;
"#
            );
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
            let t = &self.table;
            let json =
                serde_json::to_string(roles).map_err(|e| StoreError::Unavailable(e.to_string()))?;
            sqlx::query(&format!(
                "INSERT OR IGNORE INTO {t} (role) SELECT value FROM json_each(?1)"
            ))
            .bind(json)
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
            let t = &self.table;
            let batch: Vec<serde_json::Value> = claims
                .iter()
                .map(|c| serde_json::json!({"role": c.role, "held": c.held_token, "ms": millis(c.duration)}))
                .collect();
            let json = serde_json::Value::Array(batch).to_string();
            // One statement: SQLite takes the database write lock for it, so the
            // check and the update cannot interleave with another process.
            let sql = format!(
                r#"UPDATE {t} SET
    token = CASE WHEN {t}.holder_id = ?1 AND {t}.token = r.held AND {t}.expires_at_ms > r.now
                 THEN {t}.token ELSE {t}.token + 1 END,
    acquired_at_ms = CASE WHEN {t}.holder_id = ?1 AND {t}.token = r.held AND {t}.expires_at_ms > r.now
                 THEN {t}.acquired_at_ms ELSE r.now END,
    renewed_at_ms = r.now,
    expires_at_ms = r.now + r.ms,
    duration_ms = r.ms,
    holder_id = ?1,
    holder_address = ?2
FROM (SELECT json_extract(value, '$.role') AS role,
             json_extract(value, '$.held') AS held,
             json_extract(value, '$.ms') AS ms,
             {NOW_MS} AS now
      FROM json_each(?3)) AS r
WHERE {t}.role = r.role
  AND ({t}.holder_id IS NULL OR {t}.holder_id = ?1 OR {t}.expires_at_ms <= r.now)
RETURNING role, token"#
            );
            let rows = sqlx::query(&sql)
                .bind(&instance.id)
                .bind(&instance.address)
                .bind(json)
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
            let t = &self.table;
            let batch: Vec<serde_json::Value> = held
                .iter()
                .map(|(role, token)| serde_json::json!({"role": role, "token": token}))
                .collect();
            let json = serde_json::Value::Array(batch).to_string();
            let sql = format!(
                r#"UPDATE {t} SET holder_id = NULL, holder_address = NULL, expires_at_ms = {NOW_MS}
FROM (SELECT json_extract(value, '$.role') AS role, json_extract(value, '$.token') AS token FROM json_each(?2)) AS r
WHERE {t}.role = r.role AND {t}.token = r.token AND {t}.holder_id = ?1
RETURNING role"#
            );
            let rows = sqlx::query(&sql)
                .bind(&instance.id)
                .bind(json)
                .fetch_all(&self.pool)
                .await
                .map_err(unavailable)?;
            rows.iter().map(|r| r.try_get("role").map_err(unavailable)).collect()
        }
        .boxed()
    }

    fn snapshot<'a>(
        &'a self,
        roles: &'a [RoleName],
    ) -> BoxFuture<'a, Result<Vec<LeaseRecord>, StoreError>> {
        async move {
            let t = &self.table;
            let columns = format!(
                "role, holder_id, holder_address, token, \
                 CASE WHEN holder_id IS NOT NULL AND expires_at_ms > {NOW_MS} THEN expires_at_ms - {NOW_MS} ELSE 0 END AS remaining_ms"
            );
            let rows = if roles.is_empty() {
                sqlx::query(&format!("SELECT {columns} FROM {t} ORDER BY role"))
                    .fetch_all(&self.pool)
                    .await
            } else {
                let json = serde_json::to_string(roles).map_err(|e| StoreError::Unavailable(e.to_string()))?;
                sqlx::query(&format!(
                    "SELECT {columns} FROM {t} WHERE role IN (SELECT value FROM json_each(?1))"
                ))
                .bind(json)
                .fetch_all(&self.pool)
                .await
            }
            .map_err(unavailable)?;
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
            let sql = format!("SELECT generation FROM {}_changes WHERE id = 1", self.table);
            let read = |pool: SqlitePool, sql: String| async move {
                sqlx::query_scalar::<_, i64>(&sql)
                    .fetch_optional(&pool)
                    .await
            };
            let mut seen = read(self.pool.clone(), sql.clone())
                .await
                .map_err(unavailable)?;
            let pool = self.pool.clone();
            let (tx, feed) = mpsc::channel(1);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(POLL_EVERY);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tx.closed() => return,
                        _ = tick.tick() => {}
                    }
                    if let Ok(now) = read(pool.clone(), sql.clone()).await {
                        if now != seen {
                            seen = now;
                            let _ = tx.try_send(());
                        }
                    }
                }
            });
            Ok(feed)
        }
        .boxed()
    }
}
