//! Which store to open and how: the part of the configuration the store
//! layer owns. The config file produces a [`StoreConfig`]; library users can
//! build one directly.

/// Default table name of the SQL stores (and key namespace of Redis and etcd).
pub const DEFAULT_TABLE: &str = "rolegate_role_leases";

/// The store backends rolegate knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// In-process only; for tests and a single process.
    Memory,
    /// An embedded SQLite file, for one machine.
    Sqlite,
    /// PostgreSQL, the default for a cluster.
    Postgres,
    /// Redis (one primary).
    Redis,
    /// etcd v3.
    Etcd,
}

impl StoreKind {
    /// The name used in the config file (`store.kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Sqlite => "sqlite",
            StoreKind::Postgres => "postgres",
            StoreKind::Redis => "redis",
            StoreKind::Etcd => "etcd",
        }
    }

    /// Whether this binary was built with the backend (cargo feature).
    pub fn is_built(self) -> bool {
        match self {
            StoreKind::Memory => true,
            StoreKind::Sqlite => cfg!(feature = "sqlite"),
            StoreKind::Postgres => cfg!(feature = "postgres"),
            StoreKind::Redis => cfg!(feature = "redis"),
            StoreKind::Etcd => cfg!(feature = "etcd"),
        }
    }
}

/// Where the leases live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// The backend.
    pub kind: StoreKind,
    /// Connection URL (a file path or `sqlite:` URL for SQLite; comma-separated
    /// endpoints for etcd).
    pub url: String,
    /// Apply the schema when the store is opened.
    pub migrate: bool,
    /// SQL table name; key namespace for Redis and etcd.
    pub table: String,
    /// etcd user name.
    pub username: Option<String>,
    /// etcd password.
    pub password: Option<String>,
    /// TLS files for Redis (`rediss://`) and etcd (`https://`); PostgreSQL
    /// takes `sslmode` and friends in `url`.
    pub tls: Option<super::StoreTls>,
}

/// A table name or key namespace that is not 1-63 characters of `[a-z0-9_]`
/// starting with a letter or `_`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("table `{0}` must be 1-63 characters of [a-z0-9_], not starting with a digit")]
pub struct BadTableName(pub String);

/// Checks a table name or key namespace. It is pasted into SQL and keys, so
/// every store constructor checks it, whoever built the name.
pub fn check_table_name(table: &str) -> Result<(), BadTableName> {
    let ok = !table.is_empty()
        && table.len() <= 63
        && table
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !table.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(BadTableName(table.to_string()))
    }
}
