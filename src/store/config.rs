//! Which store to open and how: the part of the configuration the store
//! layer owns. The config file produces a [`StoreConfig`]; library users can
//! build one directly.

use serde::{Deserialize, Serialize};

/// Default table name of the SQL stores (and key namespace of Redis and etcd).
pub(crate) const DEFAULT_TABLE: &str = "rolegate_role_leases";

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
    /// The kind a config file's `store.kind` names (`postgresql` is
    /// `postgres` too).
    pub fn from_name(name: &str) -> Option<StoreKind> {
        Some(match name {
            "memory" => StoreKind::Memory,
            "sqlite" => StoreKind::Sqlite,
            "postgres" | "postgresql" => StoreKind::Postgres,
            "redis" => StoreKind::Redis,
            "etcd" => StoreKind::Etcd,
            _ => return None,
        })
    }

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

/// The variable `check-config --print` writes in place of `store.password`.
pub(crate) const STORE_PASSWORD_VAR: &str = "ROLEGATE_STORE_PASSWORD";

/// The store when a config file names none, or names `sqlite` without a URL.
pub(crate) const DEFAULT_SQLITE_URL: &str = "sqlite://rolegate.db";

/// Where the leases live: the config file's `store` section (each field's
/// serde attributes say how the file's value is read and written).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// The backend.
    #[serde(default = "read::sqlite", with = "read::kind")]
    pub kind: StoreKind,
    /// Connection URL (a file path or `sqlite:` URL for SQLite; comma-separated
    /// endpoints for etcd). A file that sets none gets the kind's default
    /// (SQLite and memory have one).
    #[serde(default, with = "crate::value::redacted_url")]
    pub url: String,
    /// Apply the schema when the store is opened.
    #[serde(default = "read::yes")]
    pub migrate: bool,
    /// SQL table name; key namespace for Redis and etcd.
    #[serde(default = "read::table", with = "read::table_name")]
    pub table: String,
    /// etcd user name.
    #[serde(
        default,
        with = "crate::value::opt_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub username: Option<String>,
    /// etcd password.
    #[serde(
        default,
        with = "read::password",
        skip_serializing_if = "Option::is_none"
    )]
    pub password: Option<String>,
    /// TLS files for Redis (`rediss://`) and etcd (`https://`); PostgreSQL
    /// takes `sslmode` and friends in `url`.
    #[serde(default, with = "read::tls", skip_serializing_if = "Option::is_none")]
    pub tls: Option<super::StoreTls>,
}

impl Default for StoreConfig {
    /// The embedded SQLite file `rolegate.db`, schema applied on open.
    fn default() -> Self {
        Self {
            kind: StoreKind::Sqlite,
            url: DEFAULT_SQLITE_URL.into(),
            migrate: true,
            table: DEFAULT_TABLE.into(),
            username: None,
            password: None,
            tls: None,
        }
    }
}

/// How the `store` section's own values are read and written.
mod read {
    use std::path::PathBuf;

    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{check_table_name, StoreKind, DEFAULT_TABLE};
    use crate::store::{ClientCertFiles, StoreTls};
    use crate::value;

    /// `store.kind`: one this binary has.
    pub(super) mod kind {
        use super::*;
        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<StoreKind, D::Error> {
            let s = value::read_text(d)?;
            let Some(kind) = StoreKind::from_name(&s) else {
                return Err(D::Error::custom(format!(
                    "unknown store `{s}`; use sqlite, postgres, redis, etcd or memory"
                )));
            };
            let name = kind.as_str();
            if !value::built(name).unwrap_or_else(|| kind.is_built()) {
                return Err(D::Error::custom(format!(
                    "store `{name}` is not built into this binary; rebuild with `cargo install --features {name}`"
                )));
            }
            Ok(kind)
        }
        pub(crate) fn serialize<S: Serializer>(v: &StoreKind, s: S) -> Result<S::Ok, S::Error> {
            v.as_str().serialize(s)
        }
    }

    /// `store.password`: written as `${ROLEGATE_STORE_PASSWORD}`.
    pub(super) mod password {
        use super::*;
        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<String>, D::Error> {
            value::read_opt_text(d)
        }
        pub(crate) fn serialize<S: Serializer>(
            v: &Option<String>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            value::write_secret(v, super::super::STORE_PASSWORD_VAR, s)
        }
    }

    pub(super) fn sqlite() -> StoreKind {
        StoreKind::Sqlite
    }

    pub(super) fn yes() -> bool {
        true
    }

    pub(super) fn table() -> String {
        DEFAULT_TABLE.into()
    }

    /// `store.table`: pasted into SQL and keys, so checked.
    pub(super) mod table_name {
        use super::*;
        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
            let s = value::text::deserialize(d)?;
            check_table_name(&s).map_err(|_| {
                D::Error::custom("must be 1-63 characters of [a-z0-9_], not starting with a digit")
            })?;
            Ok(s)
        }
        pub(crate) use value::text::serialize;
    }

    /// `store.tls` as the file writes it: the client certificate's two
    /// files side by side.
    #[derive(Deserialize, Serialize)]
    #[serde(deny_unknown_fields)]
    struct Files {
        #[serde(
            default,
            with = "value::opt_text",
            skip_serializing_if = "Option::is_none"
        )]
        ca_file: Option<String>,
        #[serde(
            default,
            with = "value::opt_text",
            skip_serializing_if = "Option::is_none"
        )]
        cert_file: Option<String>,
        #[serde(
            default,
            with = "value::opt_text",
            skip_serializing_if = "Option::is_none"
        )]
        key_file: Option<String>,
    }

    /// `store.tls`: a CA file and an optional client certificate with its
    /// key (an empty path is no path).
    pub(super) mod tls {
        use super::*;
        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<StoreTls>, D::Error> {
            let Some(f) = Option::<Files>::deserialize(d)? else {
                return Ok(None);
            };
            let path = |p: Option<String>| p.filter(|p| !p.is_empty()).map(PathBuf::from);
            let client_cert = match (path(f.cert_file), path(f.key_file)) {
                (Some(cert_file), Some(key_file)) => Some(ClientCertFiles {
                    cert_file,
                    key_file,
                }),
                (None, None) => None,
                (Some(_), None) => {
                    return Err(D::Error::custom(
                        "cert_file and key_file go together: set key_file too",
                    ))
                }
                (None, Some(_)) => {
                    return Err(D::Error::custom(
                        "cert_file and key_file go together: set cert_file too",
                    ))
                }
            };
            Ok(Some(StoreTls {
                ca_file: path(f.ca_file),
                client_cert,
            }))
        }
        pub(crate) fn serialize<S: Serializer>(
            v: &Option<StoreTls>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            let text = |p: &std::path::Path| p.display().to_string();
            v.as_ref()
                .map(|t| Files {
                    ca_file: t.ca_file.as_deref().map(text),
                    cert_file: t.client_cert.as_ref().map(|c| text(&c.cert_file)),
                    key_file: t.client_cert.as_ref().map(|c| text(&c.key_file)),
                })
                .serialize(s)
        }
    }
}

/// A table name or key namespace that is not 1-63 characters of `[a-z0-9_]`
/// starting with a letter or `_`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("table `{0}` must be 1-63 characters of [a-z0-9_], not starting with a digit")]
pub struct BadTableName(pub String);

/// Checks a table name or key namespace. It is pasted into SQL and keys, so
/// every store constructor checks it, whoever built the name.
pub(crate) fn check_table_name(table: &str) -> Result<(), BadTableName> {
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
