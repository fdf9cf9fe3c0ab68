//! Inserting work: one row per call, with times by the database clock, an
//! optional uniqueness key, and (on PostgreSQL) a notification that wakes
//! listening workers in the same statement.

use std::time::Duration;

use super::{ident, WorkError, WorkPool, WorkQueue};

/// A column value for [`Enqueue::set`].
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL (written into the statement, so it fits a column of any
    /// type).
    Null,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// Text.
    Text(String),
    /// A JSON document, as text: cast to `jsonb` on PostgreSQL (text does
    /// not go into a `jsonb` column without it); stored as text on SQLite.
    Json(String),
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_string())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}

impl From<i32> for Value {
    fn from(v: i32) -> Self {
        Value::Int(v.into())
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Int(v.into())
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float(v)
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

/// One row on its way in (see [`WorkQueue::enqueue`]).
#[derive(Debug)]
#[must_use = "an enqueue does nothing until `execute`"]
pub struct Enqueue<'q> {
    pub(super) queue: &'q WorkQueue,
    pub(super) values: Vec<(String, Value)>,
    pub(super) run_after: Option<(String, Duration)>,
    pub(super) unique_on: Option<String>,
    pub(super) notify: Option<String>,
    pub(super) error: Option<WorkError>,
}

impl Enqueue<'_> {
    fn column(&mut self, column: &str) -> Option<String> {
        match ident(column) {
            Ok(c) => Some(c),
            Err(e) => {
                self.error.get_or_insert(e);
                None
            }
        }
    }

    /// Sets one of the app's columns.
    pub fn set(mut self, column: &str, value: impl Into<Value>) -> Self {
        if let Some(c) = self.column(column) {
            self.values.push((c, value.into()));
        }
        self
    }

    /// Sets a time column (the lock column's type: `timestamptz` on
    /// PostgreSQL, Unix milliseconds on SQLite) to `delay` from now by the
    /// database clock: the row becomes eligible then, if the app's
    /// `eligible` predicate compares it with the database's now.
    pub fn run_after(mut self, column: &str, delay: Duration) -> Self {
        if let Some(c) = self.column(column) {
            self.run_after = Some((c, delay));
        }
        self
    }

    /// Skips the insert when a row with the same value in `column` exists
    /// (the column needs a unique index or constraint): `execute` then
    /// returns `None`.
    pub fn unique_on(mut self, column: &str) -> Self {
        if let Some(c) = self.column(column) {
            self.unique_on = Some(c);
        }
        self
    }

    /// PostgreSQL: notifies `channel` in the same statement, so a
    /// [`Worker`](super::Worker) listening on it wakes at once (ignored on
    /// SQLite, whose workers poll).
    pub fn notify(mut self, channel: &str) -> Self {
        if let Some(c) = self.column(channel) {
            self.notify = Some(c);
        }
        self
    }

    /// Inserts the row; returns its id, or `None` when `unique_on` found a
    /// duplicate.
    pub async fn execute(self) -> Result<Option<i64>, WorkError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let table = &self.queue.table().table;
        let id = &self.queue.table().id;
        let postgres = match self.queue.pool() {
            #[cfg(feature = "postgres")]
            WorkPool::Postgres(_) => true,
            #[cfg(feature = "sqlite")]
            WorkPool::Sqlite(_) => false,
        };
        let p = |n: usize| {
            if postgres {
                format!("${n}")
            } else {
                format!("?{n}")
            }
        };
        let mut columns: Vec<&str> = self.values.iter().map(|(c, _)| c.as_str()).collect();
        // One parameter per value but NULL, which is written as is.
        let mut n = 0;
        let mut params: Vec<String> = (self.values.iter())
            .map(|(_, v)| match v {
                Value::Null => "NULL".to_string(),
                Value::Json(_) if postgres => {
                    n += 1;
                    format!("CAST({} AS jsonb)", p(n))
                }
                _ => {
                    n += 1;
                    p(n)
                }
            })
            .collect();
        let mut delay_ms = None;
        if let Some((column, delay)) = &self.run_after {
            let n = n + 1;
            columns.push(column);
            params.push(if postgres {
                format!("clock_timestamp() + make_interval(secs => ${n}::float8 / 1000.0)")
            } else {
                format!("CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + ?{n}")
            });
            delay_ms = Some(delay.as_millis().min(i64::MAX as u128) as i64);
        }
        let conflict = match &self.unique_on {
            Some(c) => format!(" ON CONFLICT ({c}) DO NOTHING"),
            None => String::new(),
        };
        let insert = format!(
            "INSERT INTO {table} ({}) VALUES ({}){conflict} RETURNING CAST({id} AS BIGINT) AS rg_id",
            columns.join(", "),
            params.join(", ")
        );
        let text = match (&self.notify, postgres) {
            (Some(channel), true) => format!(
                "WITH ins AS ({insert}), woken AS (SELECT pg_notify('{channel}', '') FROM ins) \
                 SELECT rg_id FROM ins WHERE (SELECT count(*) FROM woken) >= 0"
            ),
            _ => insert,
        };
        // The same binds for each backend (sqlx types them per database).
        macro_rules! run {
            ($pool:expr) => {{
                let mut q = sqlx::query_scalar::<_, i64>(&text);
                for (_, v) in &self.values {
                    q = match v {
                        Value::Null => q,
                        Value::Bool(b) => q.bind(*b),
                        Value::Int(i) => q.bind(*i),
                        Value::Float(f) => q.bind(*f),
                        Value::Text(t) | Value::Json(t) => q.bind(t.clone()),
                    };
                }
                if let Some(ms) = delay_ms {
                    q = q.bind(ms);
                }
                Ok(q.fetch_optional($pool).await?)
            }};
        }
        match self.queue.pool() {
            #[cfg(feature = "postgres")]
            WorkPool::Postgres(pool) => run!(pool),
            #[cfg(feature = "sqlite")]
            WorkPool::Sqlite(pool) => run!(pool),
        }
    }
}
