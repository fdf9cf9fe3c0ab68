//! The YAML configuration: parsing, `${VAR}` expansion, defaults and every
//! refusal of SPEC section 2. A file either resolves into a [`Config`] whose
//! invariants hold, or is refused with one [`ConfigError`] naming the file,
//! the line where known, and the key.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_saphyr::{Location, Spanned};

use crate::lease::{validate_role_name, PartitionSpec, RoleSpec};

/// Largest partition count a config may declare.
pub const MAX_PARTITION_COUNT: u64 = 65_536;
/// Default table name of the SQL stores.
pub const DEFAULT_TABLE: &str = "rolegate_role_leases";

/// A refused configuration: file, line (when known), key and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub file: String,
    pub line: Option<u64>,
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if self.key.is_empty() {
            write!(f, ": {}", self.message)
        } else {
            write!(f, ": {}: {}", self.key, self.message)
        }
    }
}

/// Lease timings: a default for all roles, overridable per role or partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LeaseTimings {
    #[serde(with = "duration_text")]
    pub duration: Duration,
    #[serde(with = "duration_text")]
    pub renew_interval: Duration,
    #[serde(with = "duration_text")]
    pub safety_margin: Duration,
}

impl Default for LeaseTimings {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(15),
            renew_interval: Duration::from_secs(5),
            safety_margin: Duration::from_secs(2),
        }
    }
}

impl LeaseTimings {
    /// The rule of SPEC 2: `duration > renew_interval + safety_margin`.
    pub fn check(&self) -> Result<(), String> {
        if self.renew_interval.is_zero() {
            return Err("renew_interval must be greater than 0".into());
        }
        if self.safety_margin.is_zero() {
            return Err(
                "safety_margin must be greater than 0 (it absorbs clock drift and delays)".into(),
            );
        }
        if self.duration > crate::lease::MAX_DURATION {
            return Err("duration must be at most 24h".into());
        }
        if self.duration <= self.renew_interval + self.safety_margin {
            return Err(format!(
                "duration ({}) must be greater than renew_interval ({}) + safety_margin ({})",
                humantime::format_duration(self.duration),
                humantime::format_duration(self.renew_interval),
                humantime::format_duration(self.safety_margin)
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Memory,
    Sqlite,
    Postgres,
    Redis,
    Etcd,
}

impl StoreKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Sqlite => "sqlite",
            StoreKind::Postgres => "postgres",
            StoreKind::Redis => "redis",
            StoreKind::Etcd => "etcd",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoreConfig {
    pub kind: StoreKind,
    #[serde(serialize_with = "redact_url")]
    pub url: String,
    pub migrate: bool,
    /// SQL table name; key namespace for Redis and etcd.
    pub table: String,
    /// etcd authentication.
    pub username: Option<String>,
    #[serde(serialize_with = "redacted")]
    pub password: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstanceConfig {
    pub name: Option<String>,
    pub advertise: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HealthConfig {
    pub path: String,
    #[serde(with = "duration_text")]
    pub interval: Duration,
    pub unhealthy_after: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UpstreamConfig {
    #[serde(serialize_with = "redact_url")]
    pub url: String,
    pub health: Option<HealthConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProxyConfig {
    #[serde(with = "duration_text")]
    pub connect_timeout: Duration,
    #[serde(with = "duration_text")]
    pub response_header_timeout: Duration,
    pub retry_after: Option<u64>,
    #[serde(serialize_with = "redacted")]
    pub cluster_secret: Option<String>,
    /// No byte either way on a connection or tunnel for this long closes it.
    #[serde(with = "duration_text")]
    pub idle_timeout: Duration,
    /// Match route prefixes ignoring ASCII case.
    pub case_insensitive_paths: bool,
    /// `Upgrade` protocols passed through (lowercase); others are stripped.
    pub upgrades: Vec<String>,
    /// Networks whose `X-Forwarded-*`/`Forwarded` fields are kept.
    #[serde(serialize_with = "cidrs")]
    pub trusted_proxies: Vec<crate::proxy::trust::Cidr>,
    /// Public-listener connections served at once.
    pub max_connections: usize,
}

fn cidrs<S: serde::Serializer>(v: &[crate::proxy::trust::Cidr], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(|c| c.to_string()))
}

/// Defaults of the `proxy` section, used by the config loader and the layers.
pub mod proxy_defaults {
    use std::time::Duration;
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
    pub const RESPONSE_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
    pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
    pub const CASE_INSENSITIVE_PATHS: bool = true;
    pub const UPGRADES: &[&str] = &["websocket"];
    pub const MAX_CONNECTIONS: usize = 10_000;
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShutdownConfig {
    #[serde(with = "duration_text")]
    pub drain_timeout: Duration,
}

/// Where a partition route finds its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeySource {
    Header(String),
    Query(String),
    /// 1-based index of a path segment (`/a/b` has segment 1 = `a`).
    PathSegment(usize),
    PathSegmentLast,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteTarget {
    Role(String),
    Partition {
        name: String,
        scope: Option<String>,
        key: KeySource,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouteConfig {
    pub prefixes: Vec<String>,
    pub target: RouteTarget,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RoleConfig {
    pub name: String,
    pub lease: LeaseTimings,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionConfig {
    pub name: String,
    pub count: u32,
    pub lease: LeaseTimings,
}

/// A resolved, validated configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Config {
    pub instance: InstanceConfig,
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub upstream: Option<UpstreamConfig>,
    pub store: StoreConfig,
    pub lease: LeaseTimings,
    pub roles: Vec<RoleConfig>,
    pub partitions: Vec<PartitionConfig>,
    pub routes: Vec<RouteConfig>,
    pub proxy: ProxyConfig,
    pub shutdown: ShutdownConfig,
}

impl Config {
    /// Reads and resolves a file, expanding `${VAR}` from the process environment.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.display().to_string(),
            line: None,
            key: String::new(),
            message: format!("cannot read the file: {e}"),
        })?;
        Self::parse(&text, &path.display().to_string(), &|name| {
            std::env::var(name).ok()
        })
    }

    /// Parses YAML text; `file` names it in errors; `env` answers `${VAR}`.
    pub fn parse(
        text: &str,
        file: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let options = serde_saphyr::Options {
            with_snippet: false,
            ..serde_saphyr::Options::default()
        };
        let raw: RawConfig = match serde_saphyr::from_str_with_options(text, options) {
            Ok(raw) => raw,
            Err(e) => return Err(yaml_error(text, file, &e)),
        };
        Resolver { file, env }.resolve(raw)
    }

    /// The coordinator's view: every role with its timings.
    pub fn role_specs(&self) -> Vec<RoleSpec> {
        self.roles
            .iter()
            .map(|r| RoleSpec {
                name: r.name.clone(),
                timings: r.lease,
            })
            .collect()
    }

    /// The coordinator's view: every partition with its timings.
    pub fn partition_specs(&self) -> Vec<PartitionSpec> {
        self.partitions
            .iter()
            .map(|p| PartitionSpec {
                name: p.name.clone(),
                count: p.count,
                timings: p.lease,
            })
            .collect()
    }

    /// `Retry-After` seconds for 503s: configured, else ceil(shortest renew interval).
    pub fn retry_after_secs(&self) -> u64 {
        if let Some(s) = self.proxy.retry_after {
            return s;
        }
        let shortest = self
            .roles
            .iter()
            .map(|r| r.lease.renew_interval)
            .chain(self.partitions.iter().map(|p| p.lease.renew_interval))
            .min()
            .unwrap_or(self.lease.renew_interval);
        let ms = shortest.as_millis() as u64;
        ms.div_ceil(1000).max(1)
    }

    /// The resolved config as YAML, with the cluster secret redacted.
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }
}

/// Turns a parse error into a [`ConfigError`]; for an unknown key, points at
/// the key's own line (the parser reports the enclosing mapping).
fn yaml_error(text: &str, file: &str, e: &serde_saphyr::Error) -> ConfigError {
    let mut line = e.location().map(|l| l.line()).filter(|l| *l > 0);
    let mut message = e.to_string();
    if let Some(at) = message.rfind(" at line ") {
        message.truncate(at);
    }
    let mut key = String::new();
    if let Some(rest) = message.strip_prefix("unknown field `") {
        if let Some(name) = rest.split('`').next() {
            key = name.to_string();
            let from = line.unwrap_or(1) as usize;
            let found = text
                .lines()
                .enumerate()
                .skip(from.saturating_sub(1))
                .find(|(_, l)| {
                    let l = l.trim_start().trim_start_matches("- ");
                    l.strip_prefix(name)
                        .is_some_and(|r| r.trim_start().starts_with(':'))
                });
            if let Some((i, _)) = found {
                line = Some(i as u64 + 1);
            }
            message = format!(
                "unknown key{}",
                message
                    .strip_prefix(&format!("unknown field `{name}`"))
                    .unwrap_or("")
            );
        }
    }
    ConfigError {
        file: file.to_string(),
        line,
        key,
        message,
    }
}

/// Hides secrets in a URL (userinfo password, `password=`-like parameters).
fn redact_url<S: serde::Serializer>(url: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&crate::redact::redact_url(url))
}

fn redacted<S: serde::Serializer>(v: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(_) => s.serialize_some("<redacted>"),
        None => s.serialize_none(),
    }
}

mod duration_text {
    use std::time::Duration;
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }
}

// ---------------------------------------------------------------------------
// Raw, span-carrying shapes straight from YAML.

type Text = Spanned<String>;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    instance: RawInstance,
    listen: Option<Text>,
    admin_listen: Option<Text>,
    upstream: Option<RawUpstream>,
    store: Option<RawStore>,
    #[serde(default)]
    lease: RawTimings,
    #[serde(default)]
    roles: Vec<RawRole>,
    #[serde(default)]
    partitions: Vec<RawPartition>,
    #[serde(default)]
    routes: Vec<RawRoute>,
    #[serde(default)]
    proxy: RawProxy,
    #[serde(default)]
    shutdown: RawShutdown,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawInstance {
    name: Option<Text>,
    advertise: Option<Text>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstream {
    url: Text,
    health: Option<RawHealth>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    path: Option<Text>,
    interval: Option<Text>,
    unhealthy_after: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    kind: Option<Text>,
    url: Option<Text>,
    migrate: Option<bool>,
    table: Option<Text>,
    username: Option<Text>,
    password: Option<Text>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTimings {
    duration: Option<Text>,
    renew_interval: Option<Text>,
    safety_margin: Option<Text>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRole {
    name: Text,
    duration: Option<Text>,
    renew_interval: Option<Text>,
    safety_margin: Option<Text>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPartition {
    name: Text,
    count: Spanned<u64>,
    duration: Option<Text>,
    renew_interval: Option<Text>,
    safety_margin: Option<Text>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    prefixes: Spanned<Vec<Text>>,
    role: Option<Text>,
    partition: Option<Text>,
    scope: Option<Text>,
    key: Option<Spanned<RawKey>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    header: Option<Text>,
    query: Option<Text>,
    path_segment: Option<Spanned<SegmentIndex>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SegmentIndex {
    Number(u64),
    Word(String),
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawProxy {
    connect_timeout: Option<Text>,
    response_header_timeout: Option<Text>,
    retry_after: Option<Spanned<u64>>,
    cluster_secret: Option<Text>,
    idle_timeout: Option<Text>,
    case_insensitive_paths: Option<bool>,
    upgrades: Option<Vec<Text>>,
    trusted_proxies: Option<Vec<Text>>,
    max_connections: Option<Spanned<u64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawShutdown {
    drain_timeout: Option<Text>,
}

// ---------------------------------------------------------------------------

struct Resolver<'a> {
    file: &'a str,
    env: &'a dyn Fn(&str) -> Option<String>,
}

fn line_of(loc: &Location) -> Option<u64> {
    Some(loc.line()).filter(|l| *l > 0)
}

impl Resolver<'_> {
    fn err(&self, loc: Option<&Location>, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_string(),
            line: loc.and_then(line_of),
            key: key.to_string(),
            message: message.into(),
        }
    }

    /// Expands `${VAR}` in a string value; `$$` is a literal `$`.
    fn text(&self, t: &Text, key: &str) -> Result<String, ConfigError> {
        expand_env(&t.value, self.env).map_err(|m| self.err(Some(&t.referenced), key, m))
    }

    fn opt_text(&self, t: &Option<Text>, key: &str) -> Result<Option<String>, ConfigError> {
        t.as_ref().map(|t| self.text(t, key)).transpose()
    }

    fn duration(
        &self,
        t: &Option<Text>,
        key: &str,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        let Some(t) = t else { return Ok(default) };
        let s = self.text(t, key)?;
        humantime::parse_duration(s.trim()).map_err(|e| {
            self.err(
                Some(&t.referenced),
                key,
                format!("`{s}` is not a duration ({e}); write e.g. 500ms, 15s, 2m"),
            )
        })
    }

    fn timings(
        &self,
        base: LeaseTimings,
        duration: &Option<Text>,
        renew: &Option<Text>,
        margin: &Option<Text>,
        prefix: &str,
        loc: Option<&Location>,
    ) -> Result<LeaseTimings, ConfigError> {
        let t = LeaseTimings {
            duration: self.duration(duration, &format!("{prefix}.duration"), base.duration)?,
            renew_interval: self.duration(
                renew,
                &format!("{prefix}.renew_interval"),
                base.renew_interval,
            )?,
            safety_margin: self.duration(
                margin,
                &format!("{prefix}.safety_margin"),
                base.safety_margin,
            )?,
        };
        let loc = duration
            .as_ref()
            .or(renew.as_ref())
            .or(margin.as_ref())
            .map(|t| &t.referenced)
            .or(loc);
        t.check().map_err(|m| self.err(loc, prefix, m))?;
        Ok(t)
    }

    fn socket(
        &self,
        t: &Option<Text>,
        key: &str,
        default: &str,
    ) -> Result<SocketAddr, ConfigError> {
        let (s, loc) = match t {
            Some(t) => (self.text(t, key)?, Some(&t.referenced)),
            None => (default.to_string(), None),
        };
        s.trim().parse().map_err(|e| {
            self.err(
                loc,
                key,
                format!("`{s}` is not a socket address like 0.0.0.0:8080 ({e})"),
            )
        })
    }

    fn resolve(&self, raw: RawConfig) -> Result<Config, ConfigError> {
        let instance = InstanceConfig {
            name: self.opt_text(&raw.instance.name, "instance.name")?,
            advertise: match &raw.instance.advertise {
                Some(t) => {
                    let s = self.text(t, "instance.advertise")?;
                    check_http_url(&s)
                        .map_err(|m| self.err(Some(&t.referenced), "instance.advertise", m))?;
                    Some(s.trim_end_matches('/').to_string())
                }
                None => None,
            },
        };
        if let (Some(name), Some(t)) = (&instance.name, &raw.instance.name) {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
                || name.len() > 64
            {
                return Err(self.err(
                    Some(&t.referenced),
                    "instance.name",
                    "must be 1-64 characters of [A-Za-z0-9._-]",
                ));
            }
        }
        let listen = self.socket(&raw.listen, "listen", "0.0.0.0:8080")?;
        let admin_listen = self.socket(&raw.admin_listen, "admin_listen", "127.0.0.1:9090")?;

        let upstream = match &raw.upstream {
            None => None,
            Some(u) => {
                let url = self.text(&u.url, "upstream.url")?;
                check_http_url(&url)
                    .map_err(|m| self.err(Some(&u.url.referenced), "upstream.url", m))?;
                let health = match &u.health {
                    None => None,
                    Some(h) => {
                        let path = self
                            .opt_text(&h.path, "upstream.health.path")?
                            .unwrap_or_else(|| "/healthz".into());
                        if !path.starts_with('/') {
                            return Err(self.err(
                                h.path.as_ref().map(|p| &p.referenced),
                                "upstream.health.path",
                                "must start with /",
                            ));
                        }
                        let interval = self.duration(
                            &h.interval,
                            "upstream.health.interval",
                            Duration::from_secs(2),
                        )?;
                        if interval.is_zero() {
                            return Err(self.err(
                                h.interval.as_ref().map(|p| &p.referenced),
                                "upstream.health.interval",
                                "must be greater than 0",
                            ));
                        }
                        let unhealthy_after = match &h.unhealthy_after {
                            None => 3,
                            Some(n) if n.value >= 1 && n.value <= 1000 => n.value as u32,
                            Some(n) => {
                                return Err(self.err(
                                    Some(&n.referenced),
                                    "upstream.health.unhealthy_after",
                                    "must be between 1 and 1000",
                                ))
                            }
                        };
                        Some(HealthConfig {
                            path,
                            interval,
                            unhealthy_after,
                        })
                    }
                };
                Some(UpstreamConfig {
                    url: url.trim_end_matches('/').to_string(),
                    health,
                })
            }
        };

        let store = self.store(raw.store.as_ref())?;

        let lease = self.timings(
            LeaseTimings::default(),
            &raw.lease.duration,
            &raw.lease.renew_interval,
            &raw.lease.safety_margin,
            "lease",
            None,
        )?;

        // Every role name, declared or generated, with where it came from.
        let mut names: HashMap<String, Option<Location>> = HashMap::new();
        let mut roles = Vec::new();
        for (i, r) in raw.roles.iter().enumerate() {
            let key = format!("roles[{i}].name");
            let name = self.text(&r.name, &key)?;
            validate_role_name(&name)
                .map_err(|e| self.err(Some(&r.name.referenced), &key, e.to_string()))?;
            if names
                .insert(name.clone(), Some(r.name.referenced))
                .is_some()
            {
                return Err(self.err(
                    Some(&r.name.referenced),
                    &key,
                    format!("role `{name}` is declared twice"),
                ));
            }
            let timings = self.timings(
                lease,
                &r.duration,
                &r.renew_interval,
                &r.safety_margin,
                &format!("roles[{i}]"),
                Some(&r.name.referenced),
            )?;
            roles.push(RoleConfig {
                name,
                lease: timings,
            });
        }
        let mut partitions = Vec::new();
        let mut partition_names = HashSet::new();
        for (i, p) in raw.partitions.iter().enumerate() {
            let key = format!("partitions[{i}].name");
            let name = self.text(&p.name, &key)?;
            validate_role_name(&name)
                .map_err(|e| self.err(Some(&p.name.referenced), &key, e.to_string()))?;
            if !partition_names.insert(name.clone()) {
                return Err(self.err(
                    Some(&p.name.referenced),
                    &key,
                    format!("partition `{name}` is declared twice"),
                ));
            }
            let count = p.count.value;
            if count == 0 || count > MAX_PARTITION_COUNT {
                return Err(self.err(
                    Some(&p.count.referenced),
                    &format!("partitions[{i}].count"),
                    format!("must be between 1 and {MAX_PARTITION_COUNT}, got {count}"),
                ));
            }
            let count = count as u32;
            // Generated names are checked before anything starts.
            let longest = crate::lease::partition_role_name(&name, count - 1);
            validate_role_name(&longest).map_err(|e| {
                self.err(
                    Some(&p.name.referenced),
                    &key,
                    format!("generated role `{longest}`: {e}"),
                )
            })?;
            for idx in 0..count {
                let generated = crate::lease::partition_role_name(&name, idx);
                if let Some(prev) = names.insert(generated.clone(), Some(p.name.referenced)) {
                    let at = prev
                        .and_then(|l| line_of(&l))
                        .map(|l| format!(" (line {l})"))
                        .unwrap_or_default();
                    return Err(self.err(
                        Some(&p.name.referenced),
                        &key,
                        format!("generated role `{generated}` is already declared{at}"),
                    ));
                }
            }
            let timings = self.timings(
                lease,
                &p.duration,
                &p.renew_interval,
                &p.safety_margin,
                &format!("partitions[{i}]"),
                Some(&p.name.referenced),
            )?;
            partitions.push(PartitionConfig {
                name,
                count,
                lease: timings,
            });
        }

        let proxy = self.proxy(&raw.proxy)?;
        let routes = self.routes(
            &raw.routes,
            &roles,
            &partitions,
            proxy.case_insensitive_paths,
        )?;

        let shutdown = ShutdownConfig {
            drain_timeout: self.duration(
                &raw.shutdown.drain_timeout,
                "shutdown.drain_timeout",
                Duration::from_secs(10),
            )?,
        };

        Ok(Config {
            instance,
            listen,
            admin_listen,
            upstream,
            store,
            lease,
            roles,
            partitions,
            routes,
            proxy,
            shutdown,
        })
    }

    fn store(&self, raw: Option<&RawStore>) -> Result<StoreConfig, ConfigError> {
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
        let kind = match &raw.kind {
            None => StoreKind::Sqlite,
            Some(t) => match self.text(t, "store.kind")?.as_str() {
                "memory" => StoreKind::Memory,
                "sqlite" => StoreKind::Sqlite,
                "postgres" | "postgresql" => StoreKind::Postgres,
                "redis" => StoreKind::Redis,
                "etcd" => StoreKind::Etcd,
                other => {
                    return Err(self.err(
                        Some(&t.referenced),
                        "store.kind",
                        format!(
                            "unknown store `{other}`; use sqlite, postgres, redis, etcd or memory"
                        ),
                    ))
                }
            },
        };
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
                let ok = !s.is_empty()
                    && s.len() <= 63
                    && s.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                    && !s.as_bytes()[0].is_ascii_digit();
                if !ok {
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

    fn routes(
        &self,
        raw: &[RawRoute],
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
            let mut prefixes = Vec::new();
            for (j, p) in r.prefixes.value.iter().enumerate() {
                let key = format!("{at}.prefixes[{j}]");
                let s = self.text(p, &key)?;
                let normal = crate::proxy::routes::canonical_prefix(&s, fold_case)
                    .map_err(|m| self.err(Some(&p.referenced), &key, m))?;
                if let Some(prev) = claimed.insert(normal.clone(), i) {
                    return Err(self.err(
                        Some(&p.referenced),
                        &key,
                        format!("prefix `{s}` is `{normal}` once canonicalized, already claimed by routes[{prev}]"),
                    ));
                }
                // Kept as written: the route table canonicalizes it (once).
                prefixes.push(s);
            }
            let target = match (&r.role, &r.partition) {
                (Some(_), Some(p)) => {
                    return Err(self.err(
                        Some(&p.referenced),
                        &at,
                        "names both a role and a partition; choose one",
                    ))
                }
                (None, None) => {
                    return Err(self.err(route_loc, &at, "names neither `role` nor `partition`"))
                }
                (Some(role), None) => {
                    let name = self.text(role, &format!("{at}.role"))?;
                    if !roles.iter().any(|x| x.name == name) {
                        return Err(self.err(
                            Some(&role.referenced),
                            &format!("{at}.role"),
                            format!("role `{name}` is not declared under `roles`"),
                        ));
                    }
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
                    RouteTarget::Role(name)
                }
                (None, Some(part)) => {
                    let name = self.text(part, &format!("{at}.partition"))?;
                    if !partitions.iter().any(|x| x.name == name) {
                        return Err(self.err(
                            Some(&part.referenced),
                            &format!("{at}.partition"),
                            format!("partition `{name}` is not declared under `partitions`"),
                        ));
                    }
                    let scope = self.opt_text(&r.scope, &format!("{at}.scope"))?;
                    let Some(key) = &r.key else {
                        return Err(self.err(
                            Some(&part.referenced),
                            &format!("{at}.key"),
                            "a partition route needs `key: {header: NAME}`, `{query: NAME}` or `{path_segment: N|last}`",
                        ));
                    };
                    let key = self.key(&key.value, &key.referenced, &format!("{at}.key"))?;
                    RouteTarget::Partition { name, scope, key }
                }
            };
            out.push(RouteConfig { prefixes, target });
        }
        Ok(out)
    }

    fn proxy(&self, raw: &RawProxy) -> Result<ProxyConfig, ConfigError> {
        use proxy_defaults as d;
        let connect_timeout = self.duration(
            &raw.connect_timeout,
            "proxy.connect_timeout",
            d::CONNECT_TIMEOUT,
        )?;
        let response_header_timeout = self.duration(
            &raw.response_header_timeout,
            "proxy.response_header_timeout",
            d::RESPONSE_HEADER_TIMEOUT,
        )?;
        let idle_timeout =
            self.duration(&raw.idle_timeout, "proxy.idle_timeout", d::IDLE_TIMEOUT)?;
        for (v, t, key) in [
            (
                connect_timeout,
                &raw.connect_timeout,
                "proxy.connect_timeout",
            ),
            (
                response_header_timeout,
                &raw.response_header_timeout,
                "proxy.response_header_timeout",
            ),
            (idle_timeout, &raw.idle_timeout, "proxy.idle_timeout"),
        ] {
            if v.is_zero() {
                return Err(self.err(
                    t.as_ref().map(|t| &t.referenced),
                    key,
                    "must be greater than 0",
                ));
            }
        }
        let cluster_secret = self.opt_text(&raw.cluster_secret, "proxy.cluster_secret")?;
        if let (Some(s), Some(t)) = (&cluster_secret, &raw.cluster_secret) {
            if s.len() < 16 {
                return Err(self.err(
                    Some(&t.referenced),
                    "proxy.cluster_secret",
                    "must be at least 16 bytes (use a random string)",
                ));
            }
        }
        let mut upgrades = Vec::new();
        for (i, u) in raw.upgrades.iter().flatten().enumerate() {
            let key = format!("proxy.upgrades[{i}]");
            let name = self.text(u, &key)?.to_ascii_lowercase();
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
            {
                return Err(self.err(
                    Some(&u.referenced),
                    &key,
                    format!("`{name}` is not a protocol name"),
                ));
            }
            if name == "h2c" {
                return Err(self.err(
                    Some(&u.referenced),
                    &key,
                    "h2c cannot be passed through: the tunnel would carry requests past the gate",
                ));
            }
            upgrades.push(name);
        }
        if raw.upgrades.is_none() {
            upgrades = d::UPGRADES.iter().map(|s| s.to_string()).collect();
        }
        let mut trusted_proxies = Vec::new();
        for (i, t) in raw.trusted_proxies.iter().flatten().enumerate() {
            let key = format!("proxy.trusted_proxies[{i}]");
            let text = self.text(t, &key)?;
            trusted_proxies.push(
                text.parse()
                    .map_err(|m: String| self.err(Some(&t.referenced), &key, m))?,
            );
        }
        let max_connections = match &raw.max_connections {
            None => d::MAX_CONNECTIONS,
            Some(m) if m.value == 0 || m.value > 1_000_000 => {
                return Err(self.err(
                    Some(&m.referenced),
                    "proxy.max_connections",
                    "must be between 1 and 1000000",
                ))
            }
            Some(m) => m.value as usize,
        };
        Ok(ProxyConfig {
            connect_timeout,
            response_header_timeout,
            retry_after: raw.retry_after.as_ref().map(|s| s.value),
            cluster_secret,
            idle_timeout,
            case_insensitive_paths: raw
                .case_insensitive_paths
                .unwrap_or(d::CASE_INSENSITIVE_PATHS),
            upgrades,
            trusted_proxies,
            max_connections,
        })
    }

    fn key(&self, k: &RawKey, loc: &Location, at: &str) -> Result<KeySource, ConfigError> {
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
            SegmentIndex::Number(n) if *n >= 1 && *n <= 1024 => {
                Ok(KeySource::PathSegment(*n as usize))
            }
            SegmentIndex::Word(w) if w == "last" => Ok(KeySource::PathSegmentLast),
            _ => Err(self.err(
                Some(&seg.referenced),
                &format!("{at}.path_segment"),
                "must be a segment number from 1 (the first segment after the leading /) or `last`",
            )),
        }
    }
}

fn check_http_url(s: &str) -> Result<(), String> {
    let uri: Result<http::Uri, _> = s.parse();
    // Messages quote the URL with its secrets redacted.
    let shown = crate::redact::redact_url(s);
    let s = shown.as_str();
    let uri = uri.map_err(|e| format!("`{s}` is not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(format!("`{s}` must start with http:// or https://")),
    }
    if uri.host().is_none() {
        return Err(format!("`{s}` has no host"));
    }
    Ok(())
}

/// Expands `${NAME}`; an unset variable is an error. `$$` stands for `$`.
pub fn expand_env(input: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| format!("unterminated `${{` in `{input}`"))?;
            let name = &body[..end];
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(format!("`${{{name}}}` is not a valid variable name"));
            }
            let value =
                env(name).ok_or_else(|| format!("environment variable `{name}` is not set"))?;
            out.push_str(&value);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "DB" => Some("postgres://x@127.0.0.1/db".into()),
            "SECRET" => Some("0123456789abcdef0123".into()),
            _ => None,
        }
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "test.yaml", &env)
    }

    fn refused(text: &str) -> ConfigError {
        match parse(text) {
            Ok(c) => panic!("expected a refusal, got {c:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = parse("{}").unwrap();
        assert_eq!(c.store.kind, StoreKind::Sqlite);
        assert_eq!(c.lease, LeaseTimings::default());
        assert_eq!(c.listen.port(), 8080);
        assert_eq!(c.shutdown.drain_timeout, Duration::from_secs(10));
        assert_eq!(c.retry_after_secs(), 5);
    }

    #[test]
    fn env_vars_expand_in_string_values() {
        let c =
            parse("store:\n  kind: postgres\n  url: ${DB}\nproxy:\n  cluster_secret: ${SECRET}\n")
                .unwrap();
        assert_eq!(c.store.url, "postgres://x@127.0.0.1/db");
        assert_eq!(
            c.proxy.cluster_secret.as_deref(),
            Some("0123456789abcdef0123")
        );
        assert_eq!(expand_env("a$$b", &env).unwrap(), "a$b");
    }

    #[test]
    fn unset_env_var_is_refused_with_line_and_key() {
        let e = refused("listen: 0.0.0.0:1\nstore:\n  kind: postgres\n  url: ${NOPE}\n");
        assert_eq!(e.line, Some(4));
        assert_eq!(e.key, "store.url");
        assert!(e.message.contains("NOPE"), "{e}");
        assert!(e.to_string().starts_with("test.yaml:4: store.url:"), "{e}");
    }

    #[test]
    fn unknown_key_is_refused_with_its_name() {
        let e = refused("lease:\n  duration: 15s\n  renew_interal: 5s\n");
        assert_eq!(e.key, "renew_interal", "{e}");
        assert!(e.message.contains("expected one of"), "{e}");
        assert_eq!(e.line, Some(3), "{e}");
    }

    #[test]
    fn route_to_undeclared_role_is_refused() {
        let e = refused("roles:\n  - name: a\nroutes:\n  - prefixes: [/x]\n    role: b\n");
        assert_eq!(e.key, "routes[0].role");
        assert_eq!(e.line, Some(5));
    }

    #[test]
    fn route_to_undeclared_partition_is_refused() {
        let e = refused("routes:\n  - prefixes: [/x]\n    partition: p\n    key: {header: X-Id}\n");
        assert_eq!(e.key, "routes[0].partition");
    }

    #[test]
    fn duplicate_role_is_refused() {
        let e = refused("roles:\n  - name: a\n  - name: a\n");
        assert_eq!(e.line, Some(3));
        assert!(e.message.contains("twice"));
    }

    #[test]
    fn role_equal_to_generated_partition_role_is_refused() {
        let e =
            refused("roles:\n  - name: p:partition-1\npartitions:\n  - name: p\n    count: 4\n");
        assert!(e.message.contains("p:partition-1"), "{e}");
        assert_eq!(e.line, Some(4));
    }

    #[test]
    fn prefix_claimed_twice_is_refused() {
        let e = refused(
            "roles:\n  - name: a\n  - name: b\nroutes:\n  - prefixes: [/x]\n    role: a\n  - prefixes: [/y, /x/]\n    role: b\n",
        );
        assert_eq!(e.key, "routes[1].prefixes[1]");
        assert!(e.message.contains("routes[0]"));
    }

    #[test]
    fn timing_rule_is_enforced_globally_and_per_role() {
        let e = refused("lease:\n  duration: 5s\n  renew_interval: 3s\n  safety_margin: 2s\n");
        assert_eq!(e.key, "lease");
        let e = refused("roles:\n  - name: a\n    duration: 6s\n");
        assert_eq!(e.key, "roles[0]");
        assert_eq!(e.line, Some(3));
        assert!(refused("lease:\n  safety_margin: 0s\n")
            .message
            .contains("safety_margin"));
        assert!(refused("lease:\n  duration: 2d\n").message.contains("24h"));
        let c = parse("roles:\n  - name: a\n    duration: 30s\n    renew_interval: 10s\n").unwrap();
        assert_eq!(c.roles[0].lease.duration, Duration::from_secs(30));
        assert_eq!(c.roles[0].lease.safety_margin, Duration::from_secs(2));
    }

    #[test]
    fn bad_duration_is_refused() {
        let e = refused("lease:\n  duration: fifteen\n");
        assert_eq!(e.key, "lease.duration");
        assert_eq!(e.line, Some(2));
    }

    #[test]
    fn long_names_are_refused_including_generated_ones() {
        let long = "a".repeat(129);
        let e = refused(&format!("roles:\n  - name: {long}\n"));
        assert!(e.message.contains("128"), "{e}");
        let name = "b".repeat(115); // 115 + ":partition-10" = 128 is fine, "-100" is not
        assert!(parse(&format!("partitions:\n  - name: {name}\n    count: 11\n")).is_ok());
        let e = refused(&format!("partitions:\n  - name: {name}\n    count: 101\n"));
        assert!(e.message.contains("generated"), "{e}");
        let e = refused("roles:\n  - name: 'bad name'\n");
        assert!(e.message.contains("A-Za-z0-9"), "{e}");
    }

    #[test]
    fn partition_count_bounds() {
        assert_eq!(
            refused("partitions:\n  - name: p\n    count: 0\n").key,
            "partitions[0].count"
        );
        assert_eq!(
            refused("partitions:\n  - name: p\n    count: 65537\n").key,
            "partitions[0].count"
        );
        assert!(parse("partitions:\n  - name: p\n    count: 65536\n").is_ok());
    }

    #[test]
    fn keys_parse_in_all_forms() {
        let c = parse(
            "partitions:\n  - name: p\n    count: 4\nroutes:\n  - prefixes: [/a]\n    partition: p\n    key: {header: X-Id}\n  - prefixes: [/b]\n    partition: p\n    key: {query: id}\n  - prefixes: [/c]\n    partition: p\n    key: {path_segment: 2}\n  - prefixes: [/d]\n    partition: p\n    scope: Order\n    key: {path_segment: last}\n",
        )
        .unwrap();
        let keys: Vec<_> = c
            .routes
            .iter()
            .map(|r| match &r.target {
                RouteTarget::Partition { key, .. } => key.clone(),
                _ => panic!(),
            })
            .collect();
        assert_eq!(
            keys,
            vec![
                KeySource::Header("x-id".into()),
                KeySource::Query("id".into()),
                KeySource::PathSegment(2),
                KeySource::PathSegmentLast
            ]
        );
        let e = refused("partitions:\n  - name: p\n    count: 4\nroutes:\n  - prefixes: [/a]\n    partition: p\n");
        assert_eq!(e.key, "routes[0].key");
        let e = refused("partitions:\n  - name: p\n    count: 4\nroutes:\n  - prefixes: [/a]\n    partition: p\n    key: {path_segment: first}\n");
        assert_eq!(e.key, "routes[0].key.path_segment");
    }

    #[test]
    fn bad_listen_and_upstream_are_refused() {
        assert_eq!(refused("listen: nowhere\n").key, "listen");
        assert_eq!(refused("upstream:\n  url: ftp://x\n").key, "upstream.url");
        assert_eq!(refused("store:\n  kind: mongo\n").key, "store.kind");
        assert_eq!(refused("store:\n  kind: postgres\n").key, "store.url");
    }

    #[test]
    fn yaml_syntax_error_names_the_line() {
        let e = refused("roles:\n  - name: a\n   bad: [\n");
        assert!(e.line.is_some(), "{e}");
    }

    #[test]
    fn secret_is_redacted_when_printed() {
        let c = parse("proxy:\n  cluster_secret: ${SECRET}\n").unwrap();
        let y = c.to_yaml();
        assert!(y.contains("<redacted>"), "{y}");
        assert!(!y.contains("0123456789abcdef"), "{y}");
    }

    #[test]
    fn proxy_hardening_keys_parse_with_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.proxy.idle_timeout, Duration::from_secs(300));
        assert!(c.proxy.case_insensitive_paths);
        assert_eq!(c.proxy.upgrades, vec!["websocket".to_string()]);
        assert!(c.proxy.trusted_proxies.is_empty());
        assert_eq!(c.proxy.max_connections, 10_000);
        let c = parse(
            "proxy:\n  idle_timeout: 2s\n  case_insensitive_paths: false\n  upgrades: [WebSocket, foo]\n  trusted_proxies: [10.0.0.0/8, ::1]\n  max_connections: 5\n",
        )
        .unwrap();
        assert_eq!(c.proxy.idle_timeout, Duration::from_secs(2));
        assert!(!c.proxy.case_insensitive_paths);
        assert_eq!(
            c.proxy.upgrades,
            vec!["websocket".to_string(), "foo".to_string()]
        );
        assert_eq!(c.proxy.trusted_proxies.len(), 2);
        assert_eq!(c.proxy.max_connections, 5);
        assert!(c.to_yaml().contains("10.0.0.0/8"));
    }

    #[test]
    fn unsafe_or_bad_proxy_values_are_refused_with_their_key() {
        let e = refused("proxy:\n  upgrades: [websocket, h2c]\n");
        assert_eq!(e.key, "proxy.upgrades[1]");
        assert!(e.message.contains("h2c"), "{e}");
        let e = refused("proxy:\n  trusted_proxies: [10.0.0.0/99]\n");
        assert_eq!(e.key, "proxy.trusted_proxies[0]");
        let e = refused("proxy:\n  max_connections: 0\n");
        assert_eq!(e.key, "proxy.max_connections");
        let e = refused("proxy:\n  idle_timeout: 0s\n");
        assert_eq!(e.key, "proxy.idle_timeout");
    }

    #[test]
    fn prefixes_colliding_once_canonicalized_are_refused() {
        let e = refused(
            "roles:\n  - name: a\n  - name: b\nroutes:\n  - prefixes: [/Maintenance]\n    role: a\n  - prefixes: [//maintenance/]\n    role: b\n",
        );
        assert_eq!(e.key, "routes[1].prefixes[0]");
        assert!(e.message.contains("/maintenance"), "{e}");
        let ok = parse(
            "proxy:\n  case_insensitive_paths: false\nroles:\n  - name: a\n  - name: b\nroutes:\n  - prefixes: [/Maintenance]\n    role: a\n  - prefixes: [/maintenance]\n    role: b\n",
        );
        assert!(ok.is_ok(), "case-sensitive prefixes do not collide");
        let e = refused("roles:\n  - name: a\nroutes:\n  - prefixes: [/a;b]\n    role: a\n");
        assert_eq!(e.key, "routes[0].prefixes[0]");
    }

    #[test]
    fn key_headers_the_gateway_rewrites_are_refused() {
        for h in [
            "Connection",
            "X-Forwarded-For",
            "Forwarded",
            "Host",
            "X-Rolegate-Token",
            "X_Device",
            "TE",
            "True-Client-IP",
        ] {
            let e = refused(&format!(
                "partitions:\n  - name: p\n    count: 4\nroutes:\n  - prefixes: [/a]\n    partition: p\n    key: {{header: {h}}}\n"
            ));
            assert_eq!(e.key, "routes[0].key.header", "{h}");
        }
    }

    #[test]
    fn prefixes_are_decoded_once_not_twice() {
        let c = parse("roles:\n  - name: a\nroutes:\n  - prefixes: [/%2541dmin]\n    role: a\n")
            .unwrap();
        let mut t = crate::proxy::routes::RouteTable::new(true);
        t.add(&c.routes[0].prefixes, "a");
        assert_eq!(
            t.find("/%2541dmin"),
            Ok(Some(&"a")),
            "the path the prefix describes"
        );
        assert_eq!(t.find("/admin"), Ok(None), "not a second decoding of it");
        // Dot segments hidden behind an encoded `%` stay literal, never dropped.
        let c = parse("roles:\n  - name: a\nroutes:\n  - prefixes: [/%252e%252e/x]\n    role: a\n")
            .unwrap();
        let mut t = crate::proxy::routes::RouteTable::new(true);
        t.add(&c.routes[0].prefixes, "a");
        assert_eq!(t.find("/%252e%252e/x"), Ok(Some(&"a")));
    }

    #[test]
    fn url_secrets_are_redacted_when_printed() {
        let c = parse(
            "store:\n  kind: postgres\n  url: postgres://app:hunter2@db/app?password=hunter3&sslmode=require\nupstream:\n  url: http://u:hunter4@127.0.0.1:3000\n",
        )
        .unwrap();
        let y = c.to_yaml();
        for secret in ["hunter2", "hunter3", "hunter4"] {
            assert!(!y.contains(secret), "{secret} in {y}");
        }
        assert!(y.contains("sslmode=require"), "{y}");
    }
}
