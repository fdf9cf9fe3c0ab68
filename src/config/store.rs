//! The `store` section's checks between settings. How its values are read
//! is with [`StoreConfig`] itself.

use super::resolve::Checker;
use super::{ConfigError, StoreConfig, StoreKind};
use crate::store::check_tls_rules;
use crate::store::config::DEFAULT_SQLITE_URL;

impl Checker {
    /// Fills the URL a kind has by default, and refuses what cannot work
    /// together.
    pub(super) fn store(&self, s: &mut StoreConfig) -> Result<(), ConfigError> {
        if s.url.is_empty() && !self.keys.has("store.url") {
            s.url = match s.kind {
                StoreKind::Memory => "memory://".into(),
                StoreKind::Sqlite => DEFAULT_SQLITE_URL.into(),
                kind => {
                    return Err(self.err_at(
                        "store.kind",
                        "store.url",
                        format!("store.url is required for store.kind {}", kind.as_str()),
                    ))
                }
            };
        }
        if let Err(why) = check_scheme(s.kind, &s.url) {
            return Err(self.err("store.url", why));
        }
        if s.username.is_some() != s.password.is_some() {
            let at = match self.keys.has("store.username") {
                true => "store.username",
                false => "store.password",
            };
            return Err(self.err_at(at, "store.username", "username and password go together"));
        }
        if s.username.is_some() && s.kind != StoreKind::Etcd {
            return Err(self.err(
                "store.username",
                "only the etcd store takes username/password (put credentials in store.url for the others)",
            ));
        }
        if let Err(e) = check_tls_rules(s.kind, &s.url, s.tls.as_ref()) {
            let at = match e.field() {
                "store.tls" => "store.tls",
                _ => "store.url",
            };
            return Err(self.err_at(at, e.field(), e.to_string()));
        }
        Ok(())
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
