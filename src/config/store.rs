//! The `store` section.

use super::raw::{RawStore, Text};
use super::resolve::Resolver;
use super::{ConfigError, StoreConfig, StoreKind, DEFAULT_TABLE};
use crate::store::check_table_name;

impl Resolver<'_> {
    pub(super) fn store(&self, raw: Option<&RawStore>) -> Result<StoreConfig, ConfigError> {
        let Some(raw) = raw else {
            return Ok(StoreConfig {
                kind: StoreKind::Sqlite,
                url: "sqlite://rolegate.db".into(),
                migrate: true,
                table: DEFAULT_TABLE.into(),
                username: None,
                password: None,
            });
        };
        let kind = self.store_kind(raw.kind.as_ref())?;
        let url = match &raw.url {
            Some(t) => self.text(t, "store.url")?,
            None => match kind {
                StoreKind::Memory => "memory://".into(),
                StoreKind::Sqlite => "sqlite://rolegate.db".into(),
                _ => {
                    return Err(self.err(
                        raw.kind.as_ref().map(|k| &k.referenced),
                        "store.url",
                        format!("store.url is required for store.kind {}", kind.as_str()),
                    ))
                }
            },
        };
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
        Ok(StoreConfig {
            kind,
            url,
            migrate: raw.migrate.unwrap_or(true),
            table,
            username,
            password,
        })
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
