//! The YAML configuration. The structs below are its one schema: a file is
//! read into them (`${VAR}` expanded, each value's default and check in its
//! field's serde attributes) and `check-config --print` writes them back.
//! Then the checks between settings run (the resolver). A file either
//! becomes a [`Config`] whose invariants hold, or is refused with one
//! [`ConfigError`] naming the file, the line where known, and the key;
//! docs/configuration.md describes every refusal.

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

pub(crate) use crate::lease::LeaseTimings;
pub(crate) use crate::proxy::{FormBody, HopProtocol, KeySource};
pub(crate) use crate::store::{StoreConfig, StoreKind};
pub(crate) use crate::tls::{PeersConfig, TlsConfig};
pub(crate) use print::CLUSTER_SECRET_VAR;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::lease::{CoordinatorBuilder, PartitionSpec, RoleSpec};
use crate::proxy::Cidr;
use crate::role::RoleName;
use crate::store::LeaseStore;
use crate::value;
use resolve::Checker;

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
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceConfig {
    /// Stable instance name, 1-64 characters of `[A-Za-z0-9._-]`; a random
    /// id is used when unset.
    #[serde(
        default,
        with = "instance::name",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<String>,
    /// The URL other gateways forward to; derived from `listen` when unset.
    #[serde(
        default,
        with = "value::opt_http_url",
        skip_serializing_if = "Option::is_none"
    )]
    pub advertise: Option<String>,
}

/// `upstream.health`: the app's health check, which gates candidacy.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Path probed on the app, e.g. `/healthz`.
    #[serde(with = "instance::health_path")]
    pub path: String,
    /// Time between probes.
    #[serde(with = "value::positive")]
    pub interval: Duration,
    /// Failed probes in a row before the instance stops being a candidate
    /// (1 to 1000).
    #[serde(deserialize_with = "value::count::<_, u32, 1, 1000>")]
    pub unhealthy_after: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            path: "/healthz".into(),
            interval: Duration::from_secs(2),
            unhealthy_after: 3,
        }
    }
}

/// The `upstream` section: the app behind this gateway.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Base URL of the app.
    #[serde(with = "value::http_url")]
    pub url: String,
    /// `http1` (default) or `h2c` (HTTP/2 with prior knowledge, for gRPC apps).
    #[serde(default, with = "instance::upstream_protocol")]
    pub protocol: HopProtocol,
    /// Optional health check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthConfig>,
    /// Send `Connection: close` to the app on every request with a body, so
    /// an app server that leaves a body unread never reads its bytes as the
    /// next request (HTTP/1.1 upstreams only).
    #[serde(default)]
    pub close_after_body: bool,
}

/// The `proxy` section: forwarding timeouts and the request rules.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// Time to open a connection to the app or a peer.
    #[serde(with = "value::positive")]
    pub connect_timeout: Duration,
    /// Time for a response head after the request body was sent.
    #[serde(with = "value::positive")]
    pub response_header_timeout: Duration,
    /// `Retry-After` seconds on 503s; computed from the renew intervals when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
    /// Shared secret that signs the hop marker between gateways (at least
    /// 16 bytes).
    #[serde(
        with = "proxy::cluster_secret",
        skip_serializing_if = "Option::is_none"
    )]
    pub cluster_secret: Option<String>,
    /// No byte either way on a connection or tunnel for this long closes it.
    #[serde(with = "value::positive")]
    pub idle_timeout: Duration,
    /// Match route prefixes ignoring ASCII case.
    pub case_insensitive_paths: bool,
    /// `Upgrade` protocols passed through (lowercase); others are stripped.
    #[serde(with = "proxy::upgrades")]
    pub upgrades: Vec<String>,
    /// Networks whose `X-Forwarded-*`/`Forwarded` fields are kept.
    #[serde(with = "proxy::cidrs")]
    pub trusted_proxies: Vec<Cidr>,
    /// Public-listener connections served at once (1 to 1,000,000).
    #[serde(deserialize_with = "value::count::<_, usize, 1, 1_000_000>")]
    pub max_connections: usize,
    /// How long a role request with no servable holder waits for one (0:
    /// answered 503 at once; at most an hour).
    #[serde(with = "proxy::hold_timeout")]
    pub hold_timeout: Duration,
    /// Requests held at once; beyond it, 503 at once (0 to 1,000,000;
    /// default `max_connections`).
    #[serde(deserialize_with = "value::inherited_count::<_, usize, 0, 1_000_000>")]
    pub max_held: usize,
    /// HTTP/2 on the public listener.
    #[serde(deserialize_with = "value::section")]
    pub http2: Http2Config,
    /// MiB of response the process may have handed to client connections
    /// that have not asked for more (1 to 1,000,000); beyond it the
    /// connection whose client has waited longest is closed.
    #[serde(deserialize_with = "value::count::<_, usize, 1, 1_000_000>")]
    pub max_unread_mib: usize,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        use crate::proxy::defaults as d;
        Self {
            connect_timeout: d::CONNECT_TIMEOUT,
            response_header_timeout: d::RESPONSE_HEADER_TIMEOUT,
            retry_after: None,
            cluster_secret: None,
            idle_timeout: d::IDLE_TIMEOUT,
            case_insensitive_paths: d::CASE_INSENSITIVE_PATHS,
            upgrades: d::UPGRADES.iter().map(|s| s.to_string()).collect(),
            trusted_proxies: Vec::new(),
            max_connections: d::MAX_CONNECTIONS,
            max_unread_mib: d::MAX_UNREAD_MIB,
            hold_timeout: d::HOLD_TIMEOUT,
            max_held: d::MAX_CONNECTIONS,
            http2: Http2Config::default(),
        }
    }
}

/// `proxy.http2`: HTTP/2 on the public listener (h2c with prior knowledge,
/// h2 by ALPN over TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Http2Config {
    /// Serve HTTP/2 at all (HTTP/1.1 is always served).
    pub enabled: bool,
    /// Streams a client may have open at once on one connection (1 to 10,000).
    #[serde(deserialize_with = "value::count::<_, u32, 1, 10_000>")]
    pub max_concurrent_streams: u32,
}

impl Default for Http2Config {
    fn default() -> Self {
        Self {
            enabled: true,
            max_concurrent_streams: crate::proxy::defaults::HTTP2_MAX_CONCURRENT_STREAMS,
        }
    }
}

/// The `shutdown` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// Longest wait for in-flight requests before roles are released anyway.
    #[serde(with = "value::duration")]
    pub drain_timeout: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        Self {
            drain_timeout: crate::lease::DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

/// The `telemetry` section: what `/metrics` exposes, and the access log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// One series per role of a partition (`rolegate_lease_held`, the
    /// `role` label of the counters) instead of one per partition.
    pub per_role_metrics: bool,
    /// One line per request, when set (off by default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_log: Option<AccessLogConfig>,
    /// OpenTelemetry traces over OTLP/HTTP, when set (off by default; the
    /// binary must be built with the `otel` feature).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp: Option<OtlpConfig>,
}

/// `telemetry.otlp`: one span per request, exported over OTLP/HTTP
/// (protobuf) in batches from a bounded queue.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`); spans
    /// are sent to `/v1/traces` under it.
    #[serde(with = "value::http_url")]
    pub endpoint: String,
    /// The share of new traces recorded, from 0 to 1 (default 1). A trusted
    /// parent's decision is followed instead.
    #[serde(default)]
    pub sample_ratio: SampleRatio,
    /// Whose incoming `traceparent` continues as the parent of the
    /// gateway's span (default `trusted`); any other is kept as a link.
    #[serde(default)]
    pub parent: TraceParentTrust,
    /// `service.name` of the spans (default `rolegate`).
    #[serde(default = "default_service_name", with = "value::text")]
    pub service_name: String,
    /// Finished spans waiting for export at most (default 2048); more are
    /// dropped and counted, never waited for.
    #[serde(
        default = "default_otlp_queue",
        deserialize_with = "value::count::<_, usize, 1, 1_000_000>"
    )]
    pub queue: usize,
    /// The longest one export may take (default 10s).
    #[serde(default = "default_otlp_timeout", with = "value::positive")]
    pub timeout: Duration,
}

fn default_service_name() -> String {
    "rolegate".to_string()
}

fn default_otlp_queue() -> usize {
    2048
}

fn default_otlp_timeout() -> Duration {
    Duration::from_secs(10)
}

/// A sampling ratio from 0 to 1.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SampleRatio(pub f64);

impl Eq for SampleRatio {}

impl Default for SampleRatio {
    fn default() -> Self {
        Self(1.0)
    }
}

impl<'de> Deserialize<'de> for SampleRatio {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if !(0.0..=1.0).contains(&v) {
            return Err(serde::de::Error::custom(format!(
                "{v} is not a ratio from 0 to 1 (0.1 records one new trace in ten)"
            )));
        }
        Ok(Self(v))
    }
}

/// Whose `traceparent` the gateway continues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceParentTrust {
    /// A client in `proxy.trusted_proxies`, or a peer gateway's hop
    /// verified with `proxy.cluster_secret`: the peers whose forwarding
    /// fields are kept.
    #[default]
    Trusted,
    /// Every client.
    Always,
    /// No client: every request starts a trace of its own.
    Never,
}

/// `telemetry.access_log`: one line per request, written once its response
/// has streamed (or the client left).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccessLogConfig {
    /// `json` (default) or `common`.
    pub format: AccessLogFormat,
    /// `stdout` (default) or `stderr`.
    pub to: AccessLogTo,
}

/// How access log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessLogFormat {
    /// One JSON object per line.
    #[default]
    Json,
    /// The common log format, with route, decision, duration and trace id
    /// after it.
    Common,
}

/// Where access log lines go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessLogTo {
    /// The process's standard output.
    #[default]
    Stdout,
    /// The process's standard error (beside the log).
    Stderr,
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
        /// Whether a form body is read for a query key.
        body: FormBody,
    },
}

/// One entry of `routes`: prefixes and exactly one of `role` and
/// `partition` (a partition route with its `key`, and maybe a `scope`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Path prefixes, as written (canonicalized by the route table).
    #[serde(with = "value::texts")]
    pub prefixes: Vec<String>,
    /// The role that owns them.
    #[serde(
        default,
        with = "routes::opt_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub role: Option<RoleName>,
    /// The partition that owns them.
    #[serde(
        default,
        with = "routes::opt_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub partition: Option<RoleName>,
    /// A partition route's scope, hashed before the key.
    #[serde(
        default,
        with = "value::opt_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub scope: Option<String>,
    /// Where a partition route finds its key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<KeyConfig>,
}

impl RouteConfig {
    /// The role or partition that owns the route (`None` only for a route
    /// that names neither, or one without its key, which a read file never
    /// has).
    pub fn target(&self) -> Option<RouteTarget> {
        match (&self.role, &self.partition) {
            (Some(role), None) => Some(RouteTarget::Role(role.clone())),
            (None, Some(name)) => Some(RouteTarget::Partition {
                name: name.clone(),
                scope: self.scope.clone(),
                key: self.key.as_ref()?.source()?,
                body: self.key.as_ref()?.body,
            }),
            _ => None,
        }
    }
}

/// `routes[].key`: exactly one of `header`, `query` and `path_segment`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// A request header, by name (kept lowercase); not one the gateway
    /// removes or rewrites.
    #[serde(
        default,
        with = "routes::key_header",
        skip_serializing_if = "Option::is_none"
    )]
    pub header: Option<String>,
    /// A query parameter, by name.
    #[serde(
        default,
        with = "routes::key_query",
        skip_serializing_if = "Option::is_none"
    )]
    pub query: Option<String>,
    /// A path segment: its number from 1, or `last`.
    #[serde(
        default,
        with = "routes::segment",
        skip_serializing_if = "Option::is_none"
    )]
    pub path_segment: Option<KeySource>,
    /// With `query`: `check` (the default) reads a form body for the key
    /// parameter and refuses a request whose body names it; `ignore` leaves
    /// bodies alone, for an app that reads the key from the URL only.
    #[serde(
        default,
        with = "routes::form_body",
        skip_serializing_if = "routes::form_body::is_default"
    )]
    pub body: FormBody,
}

impl KeyConfig {
    /// Where the key is found, when exactly one source is set.
    pub fn source(&self) -> Option<KeySource> {
        match (&self.header, &self.query, &self.path_segment) {
            (Some(h), None, None) => Some(KeySource::Header(h.clone())),
            (None, Some(q), None) => Some(KeySource::Query(q.clone())),
            (None, None, Some(s)) => Some(s.clone()),
            _ => None,
        }
    }
}

/// One entry of `roles`. A timing left out takes the `lease` section's.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RoleConfig {
    /// The role's name.
    #[serde(with = "value::role_name")]
    pub name: RoleName,
    /// How long a term lasts in the store without renewal.
    #[serde(default, with = "value::inherited_duration")]
    pub duration: Duration,
    /// How often the holder renews.
    #[serde(default, with = "value::inherited_duration")]
    pub renew_interval: Duration,
    /// How much earlier than expiry the holder stops trusting its term.
    #[serde(default, with = "value::inherited_duration")]
    pub safety_margin: Duration,
}

impl RoleConfig {
    /// Its timings.
    pub fn lease(&self) -> LeaseTimings {
        LeaseTimings {
            duration: self.duration,
            renew_interval: self.renew_interval,
            safety_margin: self.safety_margin,
        }
    }
}

/// One entry of `partitions`. A timing left out takes the `lease`
/// section's.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionConfig {
    /// The partition's name; its roles are `{name}:partition-{i}`.
    #[serde(with = "value::role_name")]
    pub name: RoleName,
    /// Number of roles, 1 to 65536.
    #[serde(deserialize_with = "roles::count")]
    pub count: u32,
    /// How long a term lasts in the store without renewal.
    #[serde(default, with = "value::inherited_duration")]
    pub duration: Duration,
    /// How often the holder renews.
    #[serde(default, with = "value::inherited_duration")]
    pub renew_interval: Duration,
    /// How much earlier than expiry the holder stops trusting its term.
    #[serde(default, with = "value::inherited_duration")]
    pub safety_margin: Duration,
    /// Spread the roles over the live candidates (default true).
    #[serde(default = "roles::yes")]
    pub balance: bool,
    /// How long membership must be stable before surplus roles are handed
    /// over (default 2 × `renew_interval`).
    #[serde(default, with = "value::inherited_duration")]
    pub rebalance_delay: Duration,
    /// How long a balance move waits for the local work under a role before
    /// ending it and releasing the role (default `renew_interval`, at most
    /// an hour).
    #[serde(default, with = "roles::handover_drain")]
    pub handover_drain: Duration,
}

impl PartitionConfig {
    /// The timings of every role of the partition.
    pub fn lease(&self) -> LeaseTimings {
        LeaseTimings {
            duration: self.duration,
            renew_interval: self.renew_interval,
            safety_margin: self.safety_margin,
        }
    }
}

/// A resolved, validated configuration, read from the file with the same
/// shape (each field's serde attributes say how its value is read and
/// written).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Who this gateway is.
    #[serde(default, deserialize_with = "value::section")]
    pub instance: InstanceConfig,
    /// Public listener address.
    #[serde(default = "instance::listen", with = "value::socket")]
    pub listen: SocketAddr,
    /// Admin listener address (health, metrics, `/leases`).
    #[serde(default = "instance::admin_listen", with = "value::socket")]
    pub admin_listen: SocketAddr,
    /// The app behind the gateway; none for a forward-only gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamConfig>,
    /// Where the leases live.
    #[serde(default, deserialize_with = "value::section")]
    pub store: StoreConfig,
    /// Default lease timings.
    #[serde(default, deserialize_with = "value::section")]
    pub lease: LeaseTimings,
    /// Declared roles.
    #[serde(default, deserialize_with = "value::section")]
    pub roles: Vec<RoleConfig>,
    /// Declared partitions.
    #[serde(default, deserialize_with = "value::section")]
    pub partitions: Vec<PartitionConfig>,
    /// Gated routes.
    #[serde(default, deserialize_with = "value::section")]
    pub routes: Vec<RouteConfig>,
    /// Forwarding and request rules.
    #[serde(default, deserialize_with = "value::section")]
    pub proxy: ProxyConfig,
    /// Graceful stop.
    #[serde(default, deserialize_with = "value::section")]
    pub shutdown: ShutdownConfig,
    /// What `/metrics` exposes.
    #[serde(default, deserialize_with = "value::section")]
    pub telemetry: TelemetryConfig,
    /// TLS on the public listener; plain TCP when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// TLS between gateways (cluster CA, mutual TLS).
    #[serde(default, deserialize_with = "value::section")]
    pub peers: PeersConfig,
}

/// Partition roles past which `telemetry.per_role_metrics` is warned about.
#[cfg(any(test, feature = "gateway"))]
const PER_ROLE_SERIES_WARN: u64 = 4_096;

impl Config {
    /// A warning when `telemetry.per_role_metrics` would put more series on
    /// `/metrics` than a Prometheus target usually carries.
    #[cfg(any(test, feature = "gateway"))]
    pub(crate) fn per_role_series_warning(&self) -> Option<String> {
        let partition_roles: u64 = self.partitions.iter().map(|p| u64::from(p.count)).sum();
        (self.telemetry.per_role_metrics && partition_roles > PER_ROLE_SERIES_WARN).then(|| {
            format!(
                "telemetry.per_role_metrics gives each of the {partition_roles} partition roles series of its own \
                 (at least {} on /metrics); a Prometheus target is usually kept to a few thousand",
                2 * partition_roles
            )
        })
    }

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
        /// The file with every section but `store` read as any YAML.
        #[derive(Deserialize)]
        struct StoreOnly {
            #[serde(default)]
            store: StoreConfig,
        }
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: None,
            key: String::new(),
            message: format!("cannot read the file: {e}"),
        })?;
        let env = |name: &str| std::env::var(name).ok();
        let built = |name: &str| StoreKind::from_name(name).is_some_and(StoreKind::is_built);
        let context = value::Context::new(&text, &env, built);
        let mut only: StoreOnly = value::with_context(context, || file::parse(&text, &file))?;
        Checker::new(&text, &file)?.store(&mut only.store)?;
        Ok(only.store)
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
        let built = move |name: &str| StoreKind::from_name(name).is_some_and(built);
        let context = value::Context::new(text, env, built);
        let mut config: Config = value::with_context(context, || file::parse(text, file))?;
        Checker::new(text, file)?.config(&mut config)?;
        Ok(config)
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
                timings: r.lease(),
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
                timings: p.lease(),
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
            .filter(|r| r.partition.as_ref() == Some(name))
            .map(|r| r.scope.clone())
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
            let owner = match r.target() {
                Some(RouteTarget::Role(role)) => format!("role {role}"),
                Some(RouteTarget::Partition {
                    name, scope, key, ..
                }) => {
                    format!("partition {name} key {key:?} scope {scope:?}")
                }
                None => continue,
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
            .map(|r| r.renew_interval)
            .chain(self.partitions.iter().map(|p| p.renew_interval))
            .min()
            .unwrap_or(self.lease.renew_interval);
        let ms = shortest.as_millis() as u64;
        ms.div_ceil(1000).max(1)
    }
}
