//! `check-config --print`: the resolved config written back in the file's
//! own schema ([`File`], the structs a file is read into), every default
//! filled in, so it can be read again. Secrets never appear: URL passwords
//! become `<redacted>`, and the cluster secret and the etcd password become
//! `${VAR}` references to set at run time.

use std::path::Path;
use std::time::Duration;

use super::file::{self, printed, File, Spanned, Text};
use super::{Config, HopProtocol, KeySource, RouteTarget};
use crate::lease::LeaseTimings;

/// The variable `--print` writes in place of `proxy.cluster_secret`.
pub const CLUSTER_SECRET_VAR: &str = "ROLEGATE_CLUSTER_SECRET";
/// The variable `--print` writes in place of `store.password`.
pub const STORE_PASSWORD_VAR: &str = "ROLEGATE_STORE_PASSWORD";

/// A resolved string as the file writes it: `$` doubled, so reading it
/// again expands no `${VAR}` the resolved value happens to contain.
fn text(s: impl Into<String>) -> Text {
    printed(s.into().replace('$', "$$"))
}

/// A `${VAR}` reference to set at run time, in place of a secret.
fn reference(var: &str) -> Text {
    printed(format!("${{{var}}}"))
}

fn duration(d: Duration) -> Option<Text> {
    Some(text(humantime::format_duration(d).to_string()))
}

fn path(p: &Path) -> Text {
    text(p.display().to_string())
}

fn number(n: impl Into<u64>) -> Option<Spanned<u64>> {
    Some(printed(n.into()))
}

fn timings(t: &LeaseTimings) -> file::Timings {
    file::Timings {
        duration: duration(t.duration),
        renew_interval: duration(t.renew_interval),
        safety_margin: duration(t.safety_margin),
    }
}

fn route(r: &super::RouteConfig) -> file::Route {
    let mut out = file::Route {
        prefixes: printed(r.prefixes.iter().map(text).collect()),
        role: None,
        partition: None,
        scope: None,
        key: None,
    };
    match &r.target {
        RouteTarget::Role(name) => out.role = Some(text(name.as_str())),
        RouteTarget::Partition { name, scope, key } => {
            out.partition = Some(text(name.as_str()));
            out.scope = scope.as_deref().map(text);
            let mut k = file::Key {
                header: None,
                query: None,
                path_segment: None,
            };
            match key {
                KeySource::Header(h) => k.header = Some(text(h)),
                KeySource::Query(q) => k.query = Some(text(q)),
                KeySource::PathSegment(n) => {
                    k.path_segment = Some(printed(file::SegmentIndex::Number(*n as u64)))
                }
                KeySource::PathSegmentLast => {
                    k.path_segment = Some(printed(file::SegmentIndex::Word("last".into())))
                }
            }
            out.key = Some(printed(k));
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
            instance: file::Instance {
                name: self.instance.name.as_deref().map(text),
                advertise: self.instance.advertise.as_deref().map(text),
            },
            listen: Some(text(self.listen.to_string())),
            admin_listen: Some(text(self.admin_listen.to_string())),
            upstream: self.upstream.as_ref().map(|u| file::Upstream {
                url: text(crate::redact::redact_url(&u.url)),
                protocol: Some(text(match u.protocol {
                    HopProtocol::Http1 => "http1",
                    HopProtocol::Http2 => "h2c",
                })),
                health: u.health.as_ref().map(|h| file::Health {
                    path: Some(text(&h.path)),
                    interval: duration(h.interval),
                    unhealthy_after: number(h.unhealthy_after),
                }),
                close_after_body: Some(u.close_after_body),
            }),
            store: Some(self.printed_store()),
            lease: timings(&self.lease),
            roles: (self.roles.iter())
                .map(|r| {
                    let t = timings(&r.lease);
                    file::Role {
                        name: text(r.name.as_str()),
                        duration: t.duration,
                        renew_interval: t.renew_interval,
                        safety_margin: t.safety_margin,
                    }
                })
                .collect(),
            partitions: (self.partitions.iter())
                .map(|p| {
                    let t = timings(&p.lease);
                    file::Partition {
                        name: text(p.name.as_str()),
                        count: printed(u64::from(p.count)),
                        duration: t.duration,
                        renew_interval: t.renew_interval,
                        safety_margin: t.safety_margin,
                        balance: Some(p.balance),
                        rebalance_delay: duration(p.rebalance_delay),
                        handover_drain: duration(p.handover_drain),
                    }
                })
                .collect(),
            routes: self.routes.iter().map(route).collect(),
            proxy: self.printed_proxy(),
            shutdown: file::Shutdown {
                drain_timeout: duration(self.shutdown.drain_timeout),
            },
            tls: self.tls.as_ref().map(|t| {
                printed(file::Tls {
                    cert_file: Some(path(&t.cert_file)),
                    key_file: Some(path(&t.key_file)),
                    client_ca_file: t.client_ca_file.as_deref().map(path),
                })
            }),
            peers: file::Peers {
                ca_file: self.peers.ca_file.as_deref().map(path),
                cert_file: self.peers.cert_file.as_deref().map(path),
                key_file: self.peers.key_file.as_deref().map(path),
                require_client_cert: Some(printed(self.peers.require_client_cert)),
                protocol: Some(text(match self.peers.protocol {
                    HopProtocol::Http1 => "http1",
                    HopProtocol::Http2 => "h2",
                })),
            },
        };
        file::render(&file)
    }

    fn printed_store(&self) -> file::Store {
        let s = &self.store;
        file::Store {
            kind: Some(text(s.kind.as_str())),
            url: Some(text(crate::redact::redact_url(&s.url))),
            migrate: Some(s.migrate),
            table: Some(text(&s.table)),
            username: s.username.as_deref().map(text),
            password: (s.password.as_ref()).map(|_| reference(STORE_PASSWORD_VAR)),
            tls: s.tls.as_ref().map(|tls| {
                printed(file::StoreTls {
                    ca_file: tls.ca_file.as_deref().map(path),
                    cert_file: tls.client_cert.as_ref().map(|c| path(&c.cert_file)),
                    key_file: tls.client_cert.as_ref().map(|c| path(&c.key_file)),
                })
            }),
        }
    }

    fn printed_proxy(&self) -> file::Proxy {
        let p = &self.proxy;
        file::Proxy {
            connect_timeout: duration(p.connect_timeout),
            response_header_timeout: duration(p.response_header_timeout),
            retry_after: number(self.retry_after_secs()),
            cluster_secret: (p.cluster_secret.as_ref()).map(|_| reference(CLUSTER_SECRET_VAR)),
            idle_timeout: duration(p.idle_timeout),
            case_insensitive_paths: Some(p.case_insensitive_paths),
            upgrades: Some(p.upgrades.iter().map(text).collect()),
            trusted_proxies: Some(
                p.trusted_proxies
                    .iter()
                    .map(|c| text(c.to_string()))
                    .collect(),
            ),
            max_connections: number(p.max_connections as u64),
            hold_timeout: duration(p.hold_timeout),
            max_held: number(p.max_held as u64),
            http2: file::Http2 {
                enabled: Some(p.http2.enabled),
                max_concurrent_streams: number(p.http2.max_concurrent_streams),
            },
        }
    }
}
