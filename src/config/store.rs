//! The `store` section.

use std::path::PathBuf;

use super::file::{self, Spanned, Text};
use super::resolve::Resolver;
use super::{ConfigError, StoreConfig, StoreKind, DEFAULT_TABLE};
use crate::store::{check_table_name, check_tls_rules, ClientCertFiles, StoreTls};

/// The store when the file names none, or names `sqlite` without a URL.
const DEFAULT_SQLITE_URL: &str = "sqlite://rolegate.db";

impl Resolver<'_> {
    pub(super) fn store(&self, raw: Option<&file::Store>) -> Result<StoreConfig, ConfigError> {
        let Some(raw) = raw else {
            return Ok(StoreConfig {
                kind: StoreKind::Sqlite,
                url: DEFAULT_SQLITE_URL.into(),
                migrate: true,
                table: DEFAULT_TABLE.into(),
                username: None,
                password: None,
                tls: None,
            });
        };
        let kind = self.store_kind(raw.kind.as_ref())?;
        let url = match &raw.url {
            Some(t) => self.text(t, "store.url")?,
            None => match kind {
                StoreKind::Memory => "memory://".into(),
                StoreKind::Sqlite => DEFAULT_SQLITE_URL.into(),
                _ => {
                    return Err(self.err(
                        raw.kind.as_ref().map(|k| &k.referenced),
                        "store.url",
                        format!("store.url is required for store.kind {}", kind.as_str()),
                    ))
                }
            },
        };
        if let Err(why) = check_scheme(kind, &url) {
            return Err(self.err(raw.url.as_ref().map(|t| &t.referenced), "store.url", why));
        }
        let table = match &raw.table {
            Some(t) => {
                let s = self.text(t, "store.table")?;
                if check_table_name(&s).is_err() {
                    return Err(self.err(
                        Some(&t.referenced),
                        "store.table",
                        "must be 1-63 characters of [a-z0-9_], not starting with a digit",
                    ));
                }
                s
            }
            None => DEFAULT_TABLE.into(),
        };
        let username = self.opt_text(&raw.username, "store.username")?;
        let password = self.opt_text(&raw.password, "store.password")?;
        if username.is_some() != password.is_some() {
            let at = raw
                .username
                .as_ref()
                .or(raw.password.as_ref())
                .map(|t| &t.referenced);
            return Err(self.err(at, "store.username", "username and password go together"));
        }
        if username.is_some() && kind != StoreKind::Etcd {
            return Err(self.err(
                raw.username.as_ref().map(|t| &t.referenced),
                "store.username",
                "only the etcd store takes username/password (put credentials in store.url for the others)",
            ));
        }
        let tls = self.store_tls(raw.tls.as_ref())?;
        let at = raw.tls.as_ref().map(|t| &t.referenced);
        if let Err(e) = check_tls_rules(kind, &url, tls.as_ref()) {
            let at = match e.field() {
                "store.tls" => at,
                _ => raw.url.as_ref().map(|t| &t.referenced),
            };
            return Err(self.err(at, e.field(), e.to_string()));
        }
        Ok(StoreConfig {
            kind,
            url,
            migrate: raw.migrate.unwrap_or(true),
            table,
            username,
            password,
            tls,
        })
    }

    /// `store.tls`: a CA file and an optional client certificate with its key.
    fn store_tls(
        &self,
        raw: Option<&Spanned<file::StoreTls>>,
    ) -> Result<Option<StoreTls>, ConfigError> {
        let Some(raw) = raw else {
            return Ok(None);
        };
        let path = |t: &Option<Text>, key| {
            self.opt_text(t, key)
                .map(|p| p.filter(|p| !p.is_empty()).map(PathBuf::from))
        };
        let ca_file = path(&raw.value.ca_file, "store.tls.ca_file")?;
        let cert_file = path(&raw.value.cert_file, "store.tls.cert_file")?;
        let key_file = path(&raw.value.key_file, "store.tls.key_file")?;
        let client_cert = match (cert_file, key_file) {
            (Some(cert_file), Some(key_file)) => Some(ClientCertFiles {
                cert_file,
                key_file,
            }),
            (None, None) => None,
            (cert, _) => {
                let (key, other) = match cert {
                    Some(_) => ("store.tls.cert_file", "key_file"),
                    None => ("store.tls.key_file", "cert_file"),
                };
                let set = raw.value.cert_file.as_ref().or(raw.value.key_file.as_ref());
                return Err(self.err(
                    set.map(|t| &t.referenced).or(Some(&raw.referenced)),
                    key,
                    format!("cert_file and key_file go together: set {other} too"),
                ));
            }
        };
        Ok(Some(StoreTls {
            ca_file,
            client_cert,
        }))
    }

    fn store_kind(&self, raw: Option<&Text>) -> Result<StoreKind, ConfigError> {
        let Some(t) = raw else {
            return Ok(StoreKind::Sqlite);
        };
        let kind = match self.text(t, "store.kind")?.as_str() {
            "memory" => StoreKind::Memory,
            "sqlite" => StoreKind::Sqlite,
            "postgres" | "postgresql" => StoreKind::Postgres,
            "redis" => StoreKind::Redis,
            "etcd" => StoreKind::Etcd,
            other => {
                return Err(self.err(
                    Some(&t.referenced),
                    "store.kind",
                    format!("unknown store `{other}`; use sqlite, postgres, redis, etcd or memory"),
                ))
            }
        };
        if !(self.built)(kind) {
            let name = kind.as_str();
            return Err(self.err(
                Some(&t.referenced),
                "store.kind",
                format!("store `{name}` is not built into this binary; rebuild with `cargo install --features {name}`"),
            ));
        }
        Ok(kind)
    }
}

/// The URL schemes each store kind reads. A URL of another kind is refused
/// here: PostgreSQL's client reads `mysql://` as its own, SQLite's fails
/// only at run.
fn check_scheme(kind: StoreKind, url: &str) -> Result<(), String> {
    let (expected, example): (&[&str], &str) = match kind {
        StoreKind::Memory => return Ok(()),
        StoreKind::Sqlite => (&["sqlite:"], DEFAULT_SQLITE_URL),
        StoreKind::Postgres => (
            &["postgres://", "postgresql://"],
            "postgres://USER@HOST:5432/DB",
        ),
        StoreKind::Redis => (
            &["redis://", "rediss://", "redis+unix://", "unix://"],
            "redis://HOST:6379",
        ),
        StoreKind::Etcd => {
            // Endpoints, comma-separated: `http(s)://host:port` or `host:port`.
            for endpoint in url.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                if let Some((scheme, _)) = endpoint.split_once("://") {
                    if !["http", "https", "etcd"]
                        .iter()
                        .any(|s| s.eq_ignore_ascii_case(scheme))
                    {
                        return Err(format!(
                            "`{scheme}://` is not an etcd endpoint; store.kind is etcd, so write http://HOST:2379 or https://HOST:2379 (comma-separated for several)"
                        ));
                    }
                }
            }
            return Ok(());
        }
    };
    let starts = |prefix: &str| {
        url.get(..prefix.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
    };
    if expected.iter().any(|p| starts(p)) {
        return Ok(());
    }
    let given = match url.split_once("://") {
        Some((scheme, _)) => format!("`{scheme}://`"),
        None => "a URL without a scheme".into(),
    };
    Err(format!(
        "{given} does not match store.kind {}; write {} (or change store.kind)",
        kind.as_str(),
        expected
            .iter()
            .map(|p| format!("`{p}`"))
            .collect::<Vec<_>>()
            .join(" or ")
            + &format!(", e.g. {example}")
    ))
}
