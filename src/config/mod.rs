//! The YAML configuration: parsing, `${VAR}` expansion, defaults and every
//! refusal described in docs/configuration.md. A file either resolves into a [`Config`] whose
//! invariants hold, or is refused with one [`ConfigError`] naming the file,
//! the line where known, and the key.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

mod file;
mod instance;
mod print;
mod proxy;
mod resolve;
mod roles;
mod routes;
mod store;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_transport;
mod transport;

pub use crate::lease::LeaseTimings;
pub use crate::proxy::{HopProtocol, KeySource};
pub use crate::store::{StoreConfig, StoreKind, DEFAULT_TABLE};
pub use crate::tls::{PeersConfig, TlsConfig};
pub use print::{CLUSTER_SECRET_VAR, STORE_PASSWORD_VAR};
pub use resolve::{expand_env, EnvError};

use std::sync::Arc;

use crate::lease::{CoordinatorBuilder, PartitionSpec, RoleSpec};
use crate::proxy::Cidr;
use crate::role::RoleName;
use crate::store::LeaseStore;
use resolve::Resolver;

/// A refused configuration: file, line (when known), key and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file, as named when loading.
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<u64>,
    /// Dotted key, e.g. `routes[0].key.header`; empty for file-level errors.
    pub key: String,
    /// What is wrong.
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

/// The `instance` section: who this gateway is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceConfig {
    /// Stable instance name; a random id is used when unset.
    pub name: Option<String>,
    /// The URL other gateways forward to; derived from `listen` when unset.
    pub advertise: Option<String>,
}

/// `upstream.health`: the app's health check, which gates candidacy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    /// Path probed on the app, e.g. `/healthz`.
    pub path: String,
    /// Time between probes.
    pub interval: Duration,
    /// Failed probes in a row before the instance stops being a candidate.
    pub unhealthy_after: u32,
}

/// The `upstream` section: the app behind this gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// Base URL of the app.
    pub url: String,
    /// `http1` (default) or `h2c` (HTTP/2 with prior knowledge, for gRPC apps).
    pub protocol: HopProtocol,
    /// Optional health check.
    pub health: Option<HealthConfig>,
    /// Send `Connection: close` to the app on every request with a body, so
    /// an app server that leaves a body unread never reads its bytes as the
    /// next request (HTTP/1.1 upstreams only).
    pub close_after_body: bool,
}

/// The `proxy` section: forwarding timeouts and the request rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Time to open a connection to the app or a peer.
    pub connect_timeout: Duration,
    /// Time for a response head after the request body was sent.
    pub response_header_timeout: Duration,
    /// `Retry-After` seconds on 503s; computed from the renew intervals when unset.
    pub retry_after: Option<u64>,
    /// Shared secret that signs the hop marker between gateways.
    pub cluster_secret: Option<String>,
    /// No byte either way on a connection or tunnel for this long closes it.
    pub idle_timeout: Duration,
    /// Match route prefixes ignoring ASCII case.
    pub case_insensitive_paths: bool,
    /// `Upgrade` protocols passed through (lowercase); others are stripped.
    pub upgrades: Vec<String>,
    /// Networks whose `X-Forwarded-*`/`Forwarded` fields are kept.
    pub trusted_proxies: Vec<Cidr>,
    /// Public-listener connections served at once.
    pub max_connections: usize,
    /// How long a role request with no servable holder waits for one (0:
    /// answered 503 at once).
    pub hold_timeout: Duration,
    /// Requests held at once; beyond it, 503 at once (default `max_connections`).
    pub max_held: usize,
    /// HTTP/2 on the public listener.
    pub http2: Http2Config,
}

/// `proxy.http2`: HTTP/2 on the public listener (h2c with prior knowledge,
/// h2 by ALPN over TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Config {
    /// Serve HTTP/2 at all (HTTP/1.1 is always served).
    pub enabled: bool,
    /// Streams a client may have open at once on one connection.
    pub max_concurrent_streams: u32,
}

/// The `shutdown` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownConfig {
    /// Longest wait for in-flight requests before roles are released anyway.
    pub drain_timeout: Duration,
}

/// What a route is gated by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteTarget {
    /// A declared role: only its holder executes the route.
    Role(RoleName),
    /// A declared partition: the key picks one of its roles.
    Partition {
        /// The partition's name.
        name: RoleName,
        /// Optional scope hashed before the key.
        scope: Option<String>,
        /// Where the key is found.
        key: KeySource,
    },
}

/// One entry of `routes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteConfig {
    /// Path prefixes, as written (canonicalized by the route table).
    pub prefixes: Vec<String>,
    /// The role or partition that owns them.
    pub target: RouteTarget,
}

/// One entry of `roles`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleConfig {
    /// The role's name.
    pub name: RoleName,
    /// Its timings (the `lease` defaults, overridden per role).
    pub lease: LeaseTimings,
}

/// One entry of `partitions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionConfig {
    /// The partition's name; its roles are `{name}:partition-{i}`.
    pub name: RoleName,
    /// Number of roles, 1 to 65536.
    pub count: u32,
    /// Timings of every role of the partition.
    pub lease: LeaseTimings,
    /// Spread the roles over the live candidates (default true).
    pub balance: bool,
    /// How long membership must be stable before surplus roles are handed
    /// over (default 2 × `renew_interval`).
    pub rebalance_delay: Duration,
    /// How long a balance move waits for the local work under a role before
    /// ending it and releasing the role (default `renew_interval`).
    pub handover_drain: Duration,
}

/// A resolved, validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Who this gateway is.
    pub instance: InstanceConfig,
    /// Public listener address.
    pub listen: SocketAddr,
    /// Admin listener address (health, metrics, `/leases`).
    pub admin_listen: SocketAddr,
    /// The app behind the gateway; none for a forward-only gateway.
    pub upstream: Option<UpstreamConfig>,
    /// Where the leases live.
    pub store: StoreConfig,
    /// Default lease timings.
    pub lease: LeaseTimings,
    /// Declared roles.
    pub roles: Vec<RoleConfig>,
    /// Declared partitions.
    pub partitions: Vec<PartitionConfig>,
    /// Gated routes.
    pub routes: Vec<RouteConfig>,
    /// Forwarding and request rules.
    pub proxy: ProxyConfig,
    /// Graceful stop.
    pub shutdown: ShutdownConfig,
    /// TLS on the public listener; plain TCP when unset.
    pub tls: Option<TlsConfig>,
    /// TLS between gateways (cluster CA, mutual TLS).
    pub peers: PeersConfig,
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

    /// Reads only the `store` section of a config file: the other sections
    /// must parse as YAML, but their `${VAR}`s need not be set. For the
    /// commands that only talk to the store (`status`, `check-config
    /// --connect`), from any machine that can reach it.
    pub fn load_store(path: &Path) -> Result<StoreConfig, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: None,
            key: String::new(),
            message: format!("cannot read the file: {e}"),
        })?;
        let env = |name: &str| std::env::var(name).ok();
        let raw = Self::parse_raw(&text, &file)?;
        Resolver {
            file: &file,
            env: &env,
            built: StoreKind::is_built,
        }
        .store(raw.store.as_ref())
    }

    fn parse_raw(text: &str, file: &str) -> Result<file::File, ConfigError> {
        file::parse(text, file)
    }

    /// Parses YAML text; `file` names it in errors; `env` answers `${VAR}`.
    pub fn parse(
        text: &str,
        file: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        Self::parse_built(text, file, env, StoreKind::is_built)
    }

    /// [`parse`](Self::parse) for a binary with the store kinds `built` says.
    fn parse_built(
        text: &str,
        file: &str,
        env: &dyn Fn(&str) -> Option<String>,
        built: fn(StoreKind) -> bool,
    ) -> Result<Config, ConfigError> {
        let raw = Self::parse_raw(text, file)?;
        Resolver { file, env, built }.resolve(raw)
    }

    /// A coordinator builder with this config's instance name, roles and
    /// partitions, for `store`.
    pub fn coordinator(&self, store: Arc<dyn LeaseStore>) -> CoordinatorBuilder {
        let builder = CoordinatorBuilder::new(store);
        let builder = match &self.instance.name {
            Some(name) => builder.instance_name(name),
            None => builder,
        };
        builder
            .specs(&self.role_specs(), &self.partition_specs())
            .routes_fingerprint(self.routes_fingerprint())
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
                balance: p.balance.then_some(p.rebalance_delay),
                handover_drain: Some(p.handover_drain),
                scopes: self.partition_scopes(&p.name),
            })
            .collect()
    }

    /// The scopes the routes of partition `name` hash keys with (`None`:
    /// unscoped), part of its recorded definition.
    pub fn partition_scopes(&self, name: &RoleName) -> Vec<Option<String>> {
        self.routes
            .iter()
            .filter_map(|r| match &r.target {
                RouteTarget::Partition { name: n, scope, .. } if n == name => Some(scope.clone()),
                _ => None,
            })
            .collect()
    }

    /// The fingerprint of the route table, published with the presence
    /// record so members can tell that they route alike: compact JSON with
    /// the case folding and, per canonical prefix, a short hash of what
    /// owns it (role, or partition with its key source and scope).
    pub fn routes_fingerprint(&self) -> String {
        let fold = self.proxy.case_insensitive_paths;
        let mut routes = std::collections::BTreeMap::new();
        for r in &self.routes {
            let owner = match &r.target {
                RouteTarget::Role(role) => format!("role {role}"),
                RouteTarget::Partition { name, scope, key } => {
                    format!("partition {name} key {key:?} scope {scope:?}")
                }
            };
            let hash = xxhash_rust::xxh64::xxh64(owner.as_bytes(), 0);
            for prefix in &r.prefixes {
                let prefix = crate::proxy::routes::canonical_prefix(prefix, fold)
                    .unwrap_or_else(|_| prefix.clone());
                routes.insert(prefix, format!("{:08x}", hash >> 32));
            }
        }
        serde_json::json!({ "fold": fold, "routes": routes }).to_string()
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
}
