//! `check-config --print`: the resolved config written back in the file's
//! own schema, every default filled in, so it can be read again. Secrets
//! never appear: URL passwords become `<redacted>`, and the cluster secret
//! and the etcd password become `${VAR}` references to set at run time.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::{Config, KeySource, RouteTarget};

/// The variable `--print` writes in place of `proxy.cluster_secret`.
pub const CLUSTER_SECRET_VAR: &str = "ROLEGATE_CLUSTER_SECRET";
/// The variable `--print` writes in place of `store.password`.
pub const STORE_PASSWORD_VAR: &str = "ROLEGATE_STORE_PASSWORD";

#[derive(Serialize)]
struct File {
    instance: Instance,
    listen: String,
    admin_listen: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream: Option<Upstream>,
    store: Store,
    lease: Timings,
    roles: Vec<Role>,
    partitions: Vec<Partition>,
    routes: Vec<Route>,
    proxy: Proxy,
    shutdown: Shutdown,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls: Option<Tls>,
    peers: Peers,
}

#[derive(Serialize)]
struct Tls {
    cert_file: String,
    key_file: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_ca_file: Option<String>,
}

#[derive(Serialize)]
struct Peers {
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cert_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_file: Option<String>,
    require_client_cert: bool,
    protocol: &'static str,
}

#[derive(Serialize)]
struct Instance {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    advertise: Option<String>,
}

#[derive(Serialize)]
struct Upstream {
    url: String,
    protocol: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    health: Option<Health>,
    close_after_body: bool,
}

#[derive(Serialize)]
struct Health {
    path: String,
    interval: String,
    unhealthy_after: u32,
}

#[derive(Serialize)]
struct Store {
    kind: &'static str,
    url: String,
    migrate: bool,
    table: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    username: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    password: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls: Option<StoreTls>,
}

#[derive(Serialize)]
struct StoreTls {
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cert_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_file: Option<String>,
}

fn store_tls(tls: &crate::store::StoreTls) -> StoreTls {
    let text = |p: &std::path::Path| p.display().to_string();
    StoreTls {
        ca_file: tls.ca_file.as_deref().map(text),
        cert_file: tls.client_cert.as_ref().map(|c| text(&c.cert_file)),
        key_file: tls.client_cert.as_ref().map(|c| text(&c.key_file)),
    }
}

#[derive(Serialize)]
struct Timings {
    duration: String,
    renew_interval: String,
    safety_margin: String,
}

#[derive(Serialize)]
struct Role {
    name: String,
    #[serde(flatten)]
    lease: Timings,
}

#[derive(Serialize)]
struct Partition {
    name: String,
    count: u32,
    #[serde(flatten)]
    lease: Timings,
    balance: bool,
    rebalance_delay: String,
    handover_drain: String,
}

#[derive(Serialize)]
struct Route {
    prefixes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    partition: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<BTreeMap<&'static str, serde_json::Value>>,
}

#[derive(Serialize)]
struct Proxy {
    connect_timeout: String,
    response_header_timeout: String,
    retry_after: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster_secret: Option<String>,
    idle_timeout: String,
    case_insensitive_paths: bool,
    upgrades: Vec<String>,
    trusted_proxies: Vec<String>,
    max_connections: usize,
    hold_timeout: String,
    max_held: usize,
    http2: Http2,
}

#[derive(Serialize)]
struct Http2 {
    enabled: bool,
    max_concurrent_streams: u32,
}

#[derive(Serialize)]
struct Shutdown {
    drain_timeout: String,
}

fn text(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn path(p: &std::path::Path) -> String {
    p.display().to_string()
}

fn timings(t: &crate::lease::LeaseTimings) -> Timings {
    Timings {
        duration: text(t.duration),
        renew_interval: text(t.renew_interval),
        safety_margin: text(t.safety_margin),
    }
}

fn route(r: &super::RouteConfig) -> Route {
    let mut out = Route {
        prefixes: r.prefixes.clone(),
        role: None,
        partition: None,
        scope: None,
        key: None,
    };
    match &r.target {
        RouteTarget::Role(name) => out.role = Some(name.to_string()),
        RouteTarget::Partition { name, scope, key } => {
            out.partition = Some(name.to_string());
            out.scope = scope.clone();
            let (field, value) = match key {
                KeySource::Header(h) => ("header", serde_json::Value::from(h.as_str())),
                KeySource::Query(q) => ("query", serde_json::Value::from(q.as_str())),
                KeySource::PathSegment(n) => ("path_segment", serde_json::Value::from(*n)),
                KeySource::PathSegmentLast => ("path_segment", serde_json::Value::from("last")),
            };
            out.key = Some(BTreeMap::from([(field, value)]));
        }
    }
    out
}

impl Config {
    /// The resolved config as YAML in the file's own schema: every default
    /// filled in, `retry_after` computed, secrets redacted (see the module
    /// doc). `check-config` accepts it again.
    pub fn to_yaml(&self) -> String {
        let file = File {
            instance: Instance {
                name: self.instance.name.clone(),
                advertise: self.instance.advertise.clone(),
            },
            listen: self.listen.to_string(),
            admin_listen: self.admin_listen.to_string(),
            upstream: self.upstream.as_ref().map(|u| Upstream {
                url: crate::redact::redact_url(&u.url),
                protocol: match u.protocol {
                    super::HopProtocol::Http1 => "http1",
                    super::HopProtocol::Http2 => "h2c",
                },
                health: u.health.as_ref().map(|h| Health {
                    path: h.path.clone(),
                    interval: text(h.interval),
                    unhealthy_after: h.unhealthy_after,
                }),
                close_after_body: u.close_after_body,
            }),
            store: Store {
                kind: self.store.kind.as_str(),
                url: crate::redact::redact_url(&self.store.url),
                migrate: self.store.migrate,
                table: self.store.table.clone(),
                username: self.store.username.clone(),
                password: self
                    .store
                    .password
                    .as_ref()
                    .map(|_| format!("${{{STORE_PASSWORD_VAR}}}")),
                tls: self.store.tls.as_ref().map(store_tls),
            },
            lease: timings(&self.lease),
            roles: (self.roles.iter())
                .map(|r| Role {
                    name: r.name.to_string(),
                    lease: timings(&r.lease),
                })
                .collect(),
            partitions: (self.partitions.iter())
                .map(|p| Partition {
                    name: p.name.to_string(),
                    count: p.count,
                    lease: timings(&p.lease),
                    balance: p.balance,
                    rebalance_delay: text(p.rebalance_delay),
                    handover_drain: text(p.handover_drain),
                })
                .collect(),
            routes: self.routes.iter().map(route).collect(),
            proxy: self.printed_proxy(),
            shutdown: Shutdown {
                drain_timeout: text(self.shutdown.drain_timeout),
            },
            tls: self.tls.as_ref().map(|t| Tls {
                cert_file: path(&t.cert_file),
                key_file: path(&t.key_file),
                client_ca_file: t.client_ca_file.as_deref().map(path),
            }),
            peers: Peers {
                ca_file: self.peers.ca_file.as_deref().map(path),
                cert_file: self.peers.cert_file.as_deref().map(path),
                key_file: self.peers.key_file.as_deref().map(path),
                require_client_cert: self.peers.require_client_cert,
                protocol: match self.peers.protocol {
                    super::HopProtocol::Http1 => "http1",
                    super::HopProtocol::Http2 => "h2",
                },
            },
        };
        serde_saphyr::to_string(&file).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }

    fn printed_proxy(&self) -> Proxy {
        let p = &self.proxy;
        Proxy {
            connect_timeout: text(p.connect_timeout),
            response_header_timeout: text(p.response_header_timeout),
            retry_after: self.retry_after_secs(),
            cluster_secret: (p.cluster_secret.as_ref())
                .map(|_| format!("${{{CLUSTER_SECRET_VAR}}}")),
            idle_timeout: text(p.idle_timeout),
            case_insensitive_paths: p.case_insensitive_paths,
            upgrades: p.upgrades.clone(),
            trusted_proxies: p.trusted_proxies.iter().map(|c| c.to_string()).collect(),
            max_connections: p.max_connections,
            hold_timeout: text(p.hold_timeout),
            max_held: p.max_held,
            http2: Http2 {
                enabled: p.http2.enabled,
                max_concurrent_streams: p.http2.max_concurrent_streams,
            },
        }
    }
}
