//! What the two SQL stores share: statement templates (the `.sql` files
//! under `sql/`), row decoding, and the mapping of `sqlx` errors.
//!
//! A template names the table as `{table}` and may include a shared fragment
//! as `{name}`; both are substituted once, when the store is built, after the
//! table name has been checked.

use std::borrow::Cow;
use std::time::Duration;

use super::{Grant, LeaseRecord, Member, PartitionRecord, StoreError, Tally};

/// The `op` of a failed connection attempt, for [`Target::error`].
pub(super) const CONNECT: &str = "connect";

/// How long a call waits for a pooled connection (pools rolegate builds).
pub(super) const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Substitutes the fragments, then the table name, into a statement template.
pub(super) fn render(template: &str, table: &str, fragments: &[(&str, &str)]) -> String {
    let mut sql = template.to_string();
    for (name, text) in fragments {
        sql = sql.replace(&format!("{{{name}}}"), text.trim_end());
    }
    sql.replace("{table}", table)
}

/// A lease row as the snapshot statements return it.
#[derive(sqlx::FromRow)]
pub(super) struct LeaseRow {
    role: String,
    holder_id: Option<String>,
    holder_address: Option<String>,
    token: i64,
    remaining_ms: i64,
}

impl From<LeaseRow> for LeaseRecord {
    fn from(row: LeaseRow) -> Self {
        LeaseRecord {
            role: row.role,
            holder: row.holder_id,
            holder_address: row.holder_address,
            token: row.token as u64,
            remaining: Duration::from_millis(row.remaining_ms.max(0) as u64),
        }
    }
}

/// A row of a read of changes: the cursor to read from next, and a lease
/// row, or none when nothing changed (the statement returns the cursor
/// alone then).
#[derive(sqlx::FromRow)]
pub(super) struct ChangeRow {
    pub(super) next: i64,
    role: Option<String>,
    holder_id: Option<String>,
    holder_address: Option<String>,
    token: Option<i64>,
    remaining_ms: Option<i64>,
}

impl ChangeRow {
    /// The lease row, if the row carries one.
    pub(super) fn record(self) -> Option<LeaseRecord> {
        Some(LeaseRecord::from(LeaseRow {
            role: self.role?,
            holder_id: self.holder_id,
            holder_address: self.holder_address,
            token: self.token.unwrap_or(0),
            remaining_ms: self.remaining_ms.unwrap_or(0),
        }))
    }
}

/// The cursor and records of a read of changes: the cursor is the same on
/// every row. `None` when the statement returned no row at all.
pub(super) fn changes_from_rows(rows: Vec<ChangeRow>) -> Option<(u64, Vec<LeaseRecord>)> {
    let next = rows.first()?.next.max(0) as u64;
    Some((
        next,
        rows.into_iter().filter_map(ChangeRow::record).collect(),
    ))
}

/// What the tally statements return.
#[derive(sqlx::FromRow)]
pub(super) struct TallyRow {
    records: i64,
    holders: i64,
    tokens: i64,
}

impl From<TallyRow> for Tally {
    fn from(row: TallyRow) -> Self {
        Tally {
            records: row.records.max(0) as u64,
            holders: row.holders.max(0) as u64,
            tokens: row.tokens as u64,
        }
    }
}

/// A granted role as the claim statements return it.
#[derive(sqlx::FromRow)]
pub(super) struct GrantRow {
    role: String,
    token: i64,
}

impl From<GrantRow> for Grant {
    fn from(row: GrantRow) -> Self {
        Grant {
            role: row.role,
            token: row.token as u64,
        }
    }
}

/// A row of a read of presence changes: the cursor to read from next, and
/// a presence record (none when nothing changed), live or gone.
#[derive(sqlx::FromRow)]
pub(super) struct MemberChangeRow {
    next: i64,
    instance_id: Option<String>,
    address: Option<String>,
    candidate: Option<bool>,
    routes: Option<String>,
    live: Option<bool>,
}

/// The cursor, live members and gone ids of a read of presence changes.
/// `None` when the statement returned no row at all.
pub(super) fn member_changes_from_rows(
    rows: Vec<MemberChangeRow>,
) -> Option<(u64, Vec<Member>, Vec<String>)> {
    let next = rows.first()?.next.max(0) as u64;
    let (mut live, mut gone) = (Vec::new(), Vec::new());
    for row in rows {
        let Some(id) = row.instance_id else { continue };
        if row.live != Some(true) {
            gone.push(id);
            continue;
        }
        live.push(Member {
            id,
            address: row.address.unwrap_or_default(),
            candidate: row.candidate.unwrap_or(false),
            routes: row.routes.unwrap_or_default(),
        });
    }
    Some((next, live, gone))
}

/// A partition definition as the partition statements return it.
#[derive(sqlx::FromRow)]
pub(super) struct PartitionRow {
    name: String,
    definition: String,
    epoch: i64,
    settling_ms: i64,
}

impl From<PartitionRow> for PartitionRecord {
    fn from(row: PartitionRow) -> Self {
        PartitionRecord {
            name: row.name,
            definition: row.definition,
            epoch: row.epoch.max(0) as u64,
            settling: Duration::from_millis(row.settling_ms.max(0) as u64),
        }
    }
}

/// The SQL dialects, for telling a missing table from other failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dialect {
    #[cfg(feature = "postgres")]
    Postgres,
    #[cfg(feature = "sqlite")]
    Sqlite,
}

/// Which database a store talks to, named in its error messages.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub(super) dialect: Dialect,
    /// `host:port`, a socket path, or a file name: never credentials.
    pub(super) at: String,
    /// The pool's wait for a connection.
    pub(super) acquire_timeout: Duration,
}

impl Target {
    /// `PostgreSQL` or `SQLite`.
    pub(super) fn system(&self) -> &'static str {
        match self.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => "PostgreSQL",
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => "SQLite",
        }
    }

    /// `PostgreSQL at db:5432: {op}`.
    pub(super) fn context(&self, op: &str) -> Cow<'static, str> {
        format!("{} at {}: {op}", self.system(), self.at).into()
    }

    /// The store error for a failed `op` (the one error mapping of the SQL
    /// stores): a missing table is a schema error; undecodable rows and
    /// exhausted pools have their own variants; a failure to [`CONNECT`]
    /// names the server and the I/O error itself.
    pub(super) fn error(&self, op: &str, e: sqlx::Error) -> StoreError {
        if op == CONNECT {
            let context = format!("cannot connect to {} at {}", self.system(), self.at);
            return match e {
                sqlx::Error::Io(io) => StoreError::unavailable(context, io),
                e => StoreError::unavailable(context, e),
            };
        }
        match e {
            sqlx::Error::Database(db) if self.missing_table(&*db) => StoreError::Schema {
                detail: db.message().to_string(),
                source: Box::new(sqlx::Error::Database(db)),
            },
            sqlx::Error::ColumnDecode { .. }
            | sqlx::Error::ColumnNotFound(_)
            | sqlx::Error::ColumnIndexOutOfBounds { .. }
            | sqlx::Error::Decode(_)
            | sqlx::Error::TypeNotFound { .. } => StoreError::decode(self.context(op), e),
            sqlx::Error::PoolTimedOut => StoreError::timeout(
                self.context(&format!("{op} waiting for a connection")),
                self.acquire_timeout,
            ),
            e => StoreError::unavailable(self.context(&format!("{op} failed")), e),
        }
    }

    fn missing_table(&self, db: &dyn sqlx::error::DatabaseError) -> bool {
        match self.dialect {
            // undefined_table
            #[cfg(feature = "postgres")]
            Dialect::Postgres => db.code().as_deref() == Some("42P01"),
            // SQLite has no code of its own for it.
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => db.message().contains("no such table"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments_then_the_table_are_substituted() {
        let sql = render(
            "SELECT {cols} FROM {table} -- {table}",
            "leases",
            &[("cols", "role, {table}.token\n")],
        );
        assert_eq!(sql, "SELECT role, leases.token FROM leases -- leases");
    }
}
