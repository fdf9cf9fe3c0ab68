//! The `routes` section: how a partition key's source is read, and the
//! checks that tie each route to a declared role or partition.

use std::collections::HashMap;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::resolve::Checker;
use super::value;
use super::{Config, ConfigError, KeySource};

/// `routes[].role` and `routes[].partition`.
pub(super) mod opt_name {
    use super::*;
    use crate::role::RoleName;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<RoleName>, D::Error> {
        value::opt_text::deserialize(d)?
            .map(|n| RoleName::new(&n).map_err(D::Error::custom))
            .transpose()
    }
    pub(crate) fn serialize<S: Serializer>(v: &Option<RoleName>, s: S) -> Result<S::Ok, S::Error> {
        v.as_ref()
            .map(|n| n.as_str().replace('$', "$$"))
            .serialize(s)
    }
}

/// `key.header`: a header name the app sees as the client sent it.
pub(super) mod key_header {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        let Some(name) = value::opt_text::deserialize(d)? else {
            return Ok(None);
        };
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(D::Error::custom(format!(
                "`{name}` is not a valid header name"
            )));
        }
        let lower = name.to_ascii_lowercase();
        if !crate::proxy::headers::usable_key_header(&lower) {
            return Err(D::Error::custom(format!(
                "`{name}` cannot be a key: the gateway removes or rewrites it (hop-by-hop, forwarding, Host, X-Rolegate-*, or a name with `_`)"
            )));
        }
        Ok(Some(lower))
    }
    pub(crate) use value::opt_text::serialize;
}

/// `key.query`: a parameter name, not empty.
pub(super) mod key_query {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        let Some(name) = value::opt_text::deserialize(d)? else {
            return Ok(None);
        };
        if name.is_empty() {
            return Err(D::Error::custom("must not be empty"));
        }
        Ok(Some(name))
    }
    pub(crate) use value::opt_text::serialize;
}

/// `key.body`: `check` or `ignore`.
pub(super) mod form_body {
    use super::*;
    use crate::proxy::FormBody;
    const WORDS: &[(&str, FormBody)] = &[("check", FormBody::Check), ("ignore", FormBody::Ignore)];
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<FormBody, D::Error> {
        value::word(d, WORDS, "a body rule")
    }
    pub(crate) fn serialize<S: Serializer>(v: &FormBody, s: S) -> Result<S::Ok, S::Error> {
        value::write_word(v, WORDS, s)
    }
    pub(crate) fn is_default(v: &FormBody) -> bool {
        *v == FormBody::Check
    }
}

/// `key.path_segment`: a segment number from 1 to 1024, or `last`.
pub(super) mod segment {
    use super::*;

    #[derive(Deserialize, Serialize)]
    #[serde(untagged)]
    enum Index {
        Number(u64),
        Word(String),
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<KeySource>, D::Error> {
        match Option::<Index>::deserialize(d)? {
            None => Ok(None),
            Some(Index::Number(n)) if (1..=1024).contains(&n) => {
                Ok(Some(KeySource::PathSegment(n as usize)))
            }
            Some(Index::Word(w)) if w == "last" => Ok(Some(KeySource::PathSegmentLast)),
            _ => Err(D::Error::custom(
                "must be a segment number from 1 (the first segment after the leading /) or `last`",
            )),
        }
    }

    pub(crate) fn serialize<S: Serializer>(v: &Option<KeySource>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(KeySource::PathSegment(n)) => Index::Number(*n as u64).serialize(s),
            Some(KeySource::PathSegmentLast) => Index::Word("last".into()).serialize(s),
            _ => s.serialize_none(),
        }
    }
}

impl Checker {
    /// Each route's prefixes (two that canonicalize alike are refused) and
    /// what owns them.
    pub(super) fn routes(&self, c: &Config) -> Result<(), ConfigError> {
        let fold_case = c.proxy.case_insensitive_paths;
        let mut claimed: HashMap<String, usize> = HashMap::new();
        for (i, r) in c.routes.iter().enumerate() {
            let at = format!("routes[{i}]");
            if r.prefixes.is_empty() {
                return Err(self.err(&format!("{at}.prefixes"), "needs at least one prefix"));
            }
            for (j, p) in r.prefixes.iter().enumerate() {
                let key = format!("{at}.prefixes[{j}]");
                let normal = crate::proxy::routes::canonical_prefix(p, fold_case)
                    .map_err(|e| self.err(&key, e.to_string()))?;
                if let Some(prev) = claimed.insert(normal.clone(), i) {
                    return Err(self.err(
                        &key,
                        format!("prefix `{p}` is `{normal}` once canonicalized, already claimed by routes[{prev}]"),
                    ));
                }
            }
            self.route_target(c, i)?;
        }
        Ok(())
    }

    fn route_target(&self, c: &Config, i: usize) -> Result<(), ConfigError> {
        let r = &c.routes[i];
        let at = format!("routes[{i}]");
        let key = |k: &str| format!("{at}.{k}");
        match (&r.role, &r.partition) {
            (Some(_), Some(_)) => Err(self.err_at(
                &key("partition"),
                &at,
                "names both a role and a partition; choose one",
            )),
            (None, None) => Err(self.err_at(
                &key("prefixes"),
                &at,
                "names neither `role` nor `partition`",
            )),
            (Some(role), None) => {
                if !c.roles.iter().any(|x| &x.name == role) {
                    return Err(self.err(
                        &key("role"),
                        format!("role `{role}` is not declared under `roles`"),
                    ));
                }
                if r.key.is_some() {
                    return Err(self.err(&key("key"), "only partition routes take a key"));
                }
                if r.scope.is_some() {
                    return Err(self.err(&key("scope"), "only partition routes take a scope"));
                }
                Ok(())
            }
            (None, Some(part)) => {
                if !c.partitions.iter().any(|x| &x.name == part) {
                    return Err(self.err(
                        &key("partition"),
                        format!("partition `{part}` is not declared under `partitions`"),
                    ));
                }
                let Some(k) = &r.key else {
                    return Err(self.err_at(
                        &key("partition"),
                        &key("key"),
                        "a partition route needs `key: {header: NAME}`, `{query: NAME}` or `{path_segment: N|last}`",
                    ));
                };
                if k.source().is_none() {
                    return Err(self.err(
                        &key("key"),
                        "needs exactly one of `header`, `query`, `path_segment`",
                    ));
                }
                if k.query.is_none() && k.body != crate::proxy::FormBody::Check {
                    return Err(self.err(&key("key.body"), "only a `query` key reads form bodies"));
                }
                Ok(())
            }
        }
    }
}
