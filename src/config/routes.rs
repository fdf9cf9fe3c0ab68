//! The `routes` section: prefixes, targets and partition keys.

use std::collections::HashMap;

use super::file::{self, Location};
use super::resolve::Resolver;
use super::{ConfigError, KeySource, PartitionConfig, RoleConfig, RouteConfig, RouteTarget};

impl Resolver<'_> {
    pub(super) fn routes(
        &self,
        raw: &[file::Route],
        roles: &[RoleConfig],
        partitions: &[PartitionConfig],
        fold_case: bool,
    ) -> Result<Vec<RouteConfig>, ConfigError> {
        let mut claimed: HashMap<String, usize> = HashMap::new();
        let mut out = Vec::new();
        for (i, r) in raw.iter().enumerate() {
            let at = format!("routes[{i}]");
            let route_loc = Some(&r.prefixes.referenced);
            if r.prefixes.value.is_empty() {
                return Err(self.err(
                    route_loc,
                    &format!("{at}.prefixes"),
                    "needs at least one prefix",
                ));
            }
            let prefixes = self.route_prefixes(r, i, &at, fold_case, &mut claimed)?;
            let target = self.route_target(r, &at, roles, partitions)?;
            out.push(RouteConfig { prefixes, target });
        }
        Ok(out)
    }

    /// The prefixes of `routes[i]`, kept as written (the route table
    /// canonicalizes them, once); two that canonicalize alike are refused.
    fn route_prefixes(
        &self,
        r: &file::Route,
        i: usize,
        at: &str,
        fold_case: bool,
        claimed: &mut HashMap<String, usize>,
    ) -> Result<Vec<String>, ConfigError> {
        let mut prefixes = Vec::new();
        for (j, p) in r.prefixes.value.iter().enumerate() {
            let key = format!("{at}.prefixes[{j}]");
            let s = self.text(p, &key)?;
            let normal = crate::proxy::routes::canonical_prefix(&s, fold_case)
                .map_err(|e| self.err(Some(&p.referenced), &key, e.to_string()))?;
            if let Some(prev) = claimed.insert(normal.clone(), i) {
                return Err(self.err(
                    Some(&p.referenced),
                    &key,
                    format!("prefix `{s}` is `{normal}` once canonicalized, already claimed by routes[{prev}]"),
                ));
            }
            prefixes.push(s);
        }
        Ok(prefixes)
    }

    fn route_target(
        &self,
        r: &file::Route,
        at: &str,
        roles: &[RoleConfig],
        partitions: &[PartitionConfig],
    ) -> Result<RouteTarget, ConfigError> {
        let route_loc = Some(&r.prefixes.referenced);
        match (&r.role, &r.partition) {
            (Some(_), Some(p)) => Err(self.err(
                Some(&p.referenced),
                at,
                "names both a role and a partition; choose one",
            )),
            (None, None) => Err(self.err(route_loc, at, "names neither `role` nor `partition`")),
            (Some(role), None) => {
                let name = self.text(role, &format!("{at}.role"))?;
                let Some(declared) = roles.iter().find(|x| x.name.as_str() == name) else {
                    return Err(self.err(
                        Some(&role.referenced),
                        &format!("{at}.role"),
                        format!("role `{name}` is not declared under `roles`"),
                    ));
                };
                if let Some(k) = &r.key {
                    return Err(self.err(
                        Some(&k.referenced),
                        &format!("{at}.key"),
                        "only partition routes take a key",
                    ));
                }
                if let Some(s) = &r.scope {
                    return Err(self.err(
                        Some(&s.referenced),
                        &format!("{at}.scope"),
                        "only partition routes take a scope",
                    ));
                }
                Ok(RouteTarget::Role(declared.name.clone()))
            }
            (None, Some(part)) => {
                let name = self.text(part, &format!("{at}.partition"))?;
                let Some(declared) = partitions.iter().find(|x| x.name.as_str() == name) else {
                    return Err(self.err(
                        Some(&part.referenced),
                        &format!("{at}.partition"),
                        format!("partition `{name}` is not declared under `partitions`"),
                    ));
                };
                let scope = self.opt_text(&r.scope, &format!("{at}.scope"))?;
                let Some(key) = &r.key else {
                    return Err(self.err(
                        Some(&part.referenced),
                        &format!("{at}.key"),
                        "a partition route needs `key: {header: NAME}`, `{query: NAME}` or `{path_segment: N|last}`",
                    ));
                };
                let key = self.key(&key.value, &key.referenced, &format!("{at}.key"))?;
                Ok(RouteTarget::Partition {
                    name: declared.name.clone(),
                    scope,
                    key,
                })
            }
        }
    }

    fn key(&self, k: &file::Key, loc: &Location, at: &str) -> Result<KeySource, ConfigError> {
        let set =
            k.header.is_some() as u8 + k.query.is_some() as u8 + k.path_segment.is_some() as u8;
        if set != 1 {
            return Err(self.err(
                Some(loc),
                at,
                "needs exactly one of `header`, `query`, `path_segment`",
            ));
        }
        if let Some(h) = &k.header {
            let name = self.text(h, &format!("{at}.header"))?;
            http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                self.err(
                    Some(&h.referenced),
                    &format!("{at}.header"),
                    format!("`{name}` is not a valid header name"),
                )
            })?;
            let lower = name.to_ascii_lowercase();
            if !crate::proxy::headers::usable_key_header(&lower) {
                return Err(self.err(
                    Some(&h.referenced),
                    &format!("{at}.header"),
                    format!("`{name}` cannot be a key: the gateway removes or rewrites it (hop-by-hop, forwarding, Host, X-Rolegate-*, or a name with `_`)"),
                ));
            }
            return Ok(KeySource::Header(lower));
        }
        if let Some(q) = &k.query {
            let name = self.text(q, &format!("{at}.query"))?;
            if name.is_empty() {
                return Err(self.err(
                    Some(&q.referenced),
                    &format!("{at}.query"),
                    "must not be empty",
                ));
            }
            return Ok(KeySource::Query(name));
        }
        let Some(seg) = k.path_segment.as_ref() else {
            return Err(self.err(
                Some(loc),
                at,
                "needs exactly one of `header`, `query`, `path_segment`",
            ));
        };
        match &seg.value {
            file::SegmentIndex::Number(n) if *n >= 1 && *n <= 1024 => {
                Ok(KeySource::PathSegment(*n as usize))
            }
            file::SegmentIndex::Word(w) if w == "last" => Ok(KeySource::PathSegmentLast),
            _ => Err(self.err(
                Some(&seg.referenced),
                &format!("{at}.path_segment"),
                "must be a segment number from 1 (the first segment after the leading /) or `last`",
            )),
        }
    }
}
