//! Tower layers for axum apps: `RoleHolderLayer` and `PartitionHolderLayer`,
//! mounted around the router (before routing). On the holder the inner
//! service runs with a [`HeldLease`](crate::HeldLease) request extension; elsewhere the request
//! is forwarded one hop to the holder's app or answered 503/400.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use futures_util::future::{BoxFuture, Either, Ready};
use http::{Request, Response};
use tower::{Layer, Service};

use super::defaults as proxy_defaults;
use super::forward::{ForwardError, Forwarder, HopProtocol};
use super::gate::{GateSettings, GateTarget};
use super::headers::{strip_rolegate, UpgradeAsk};
use super::hop::HopSigner;
use super::keys::KeyExtractor;
use super::problem::{Problem, Reason};
use super::routes::canonical_prefix;
use super::stack::{Edge, Gate, Local, Route, Routes, Term};
use super::trust::Cidr;
use crate::lease::Coordinator;

/// Why a layer could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayerError {
    /// The role is not registered with the coordinator (a typo, or a
    /// registration missing from the builder).
    #[error(
        "role `{role}` is not registered with this coordinator; registered roles: {}",
        list(registered)
    )]
    UnknownRole {
        /// The role asked for.
        role: String,
        /// The roles the coordinator knows (partition roles left out).
        registered: Vec<String>,
    },
    /// The partition is not registered with the coordinator.
    #[error("partition `{partition}` is not registered with this coordinator; registered partitions: {}", list(registered))]
    UnknownPartition {
        /// The partition asked for.
        partition: String,
        /// The partitions the coordinator knows.
        registered: Vec<String>,
    },
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        return "(none)".into();
    }
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The registered roles that are not roles of a partition.
fn plain_roles(coordinator: &Coordinator) -> Vec<String> {
    let partitions = coordinator.partitions();
    coordinator
        .role_names()
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            !partitions
                .iter()
                .any(|p| (p.first_index()..p.first_index() + p.count() as usize).contains(i))
        })
        .map(|(_, name)| name.to_string())
        .collect()
}

/// Options shared by both layers.
#[derive(Clone)]
#[non_exhaustive]
pub struct LayerOptions {
    /// The HTTP client used to forward to holders.
    pub forwarder: Forwarder,
    /// Signs hop markers; set the same secret on every instance.
    pub cluster_secret: Option<String>,
    /// `Retry-After` seconds on 503 answers.
    pub retry_after_secs: u64,
    /// Match `prefixes` ignoring ASCII case (default true).
    pub case_insensitive_paths: bool,
    /// `Upgrade` protocols passed on a forwarded hop (default `websocket`).
    pub upgrades: Vec<String>,
    /// Networks whose `X-Forwarded-*`/`Forwarded` are kept on a forwarded hop.
    pub trusted_proxies: Vec<Cidr>,
    /// How hops to holders are spoken (default HTTP/1.1; gRPC always HTTP/2).
    pub peer_protocol: HopProtocol,
    /// How long a gated request with no servable holder waits for one
    /// (default 1 s; zero answers 503 at once), as the gateway's `proxy.hold_timeout`.
    pub hold_timeout: std::time::Duration,
    /// Requests a layer holds at once; beyond it, 503 at once.
    pub max_held: usize,
}

impl LayerOptions {
    /// The gateway's defaults: connect timeout 1 s, response-head timeout
    /// 30 s, Retry-After 5 s, case-insensitive prefixes, `websocket` upgrades.
    pub fn new() -> Result<Self, ForwardError> {
        Ok(Self {
            forwarder: Forwarder::new(
                proxy_defaults::CONNECT_TIMEOUT,
                proxy_defaults::RESPONSE_HEADER_TIMEOUT,
            )?,
            cluster_secret: None,
            // The gateway's default: the default renew interval, in seconds.
            retry_after_secs: crate::lease::LeaseTimings::default()
                .renew_interval
                .as_secs()
                .max(1),
            case_insensitive_paths: proxy_defaults::CASE_INSENSITIVE_PATHS,
            peer_protocol: HopProtocol::Http1,
            upgrades: proxy_defaults::UPGRADES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            trusted_proxies: Vec::new(),
            hold_timeout: proxy_defaults::HOLD_TIMEOUT,
            max_held: proxy_defaults::MAX_CONNECTIONS,
        })
    }
}

/// What a layer was built with; each `layer()` call makes its stack.
#[derive(Clone)]
struct LayerConfig {
    /// `None`: the role is not registered; the layer gates nothing (requests
    /// still pass the app's edge: client `X-Rolegate-*` fields removed).
    target: Option<GateTarget>,
    /// Canonical prefixes; empty gates every request.
    prefixes: Arc<[Vec<u8>]>,
    fold_case: bool,
    settings: GateSettings,
}

impl LayerConfig {
    fn new(coordinator: &Coordinator, target: Option<GateTarget>, options: LayerOptions) -> Self {
        Self {
            target,
            prefixes: Arc::from(Vec::new()),
            fold_case: options.case_insensitive_paths,
            settings: GateSettings {
                instance_id: coordinator.instance_id().into(),
                signer: HopSigner::new(options.cluster_secret.as_deref()),
                retry_after_secs: options.retry_after_secs,
                forwarder: options.forwarder,
                upgrades: options.upgrades.into(),
                trusted_proxies: options.trusted_proxies.into(),
                peer_protocol: options.peer_protocol,
                holds: super::hold::Holds::new(options.hold_timeout, options.max_held),
                note: false,
            },
        }
    }

    fn set_prefixes<I: IntoIterator<Item = S>, S: Into<String>>(&mut self, prefixes: I) {
        let mut canonical = Vec::new();
        for p in prefixes {
            let p = p.into();
            match canonical_prefix(&p, self.fold_case) {
                Ok(c) => canonical.push(c.into_bytes()),
                // A prefix that cannot be canonicalized would gate nothing:
                // gate everything instead and say so.
                Err(e) => {
                    tracing::warn!(prefix = %p, error = %e, "bad layer prefix; gating every request");
                    canonical.clear();
                    break;
                }
            }
        }
        self.prefixes = canonical.into();
    }

    /// The shared stack around the app: route, gate, then the app's edge.
    fn stack<S>(&self, inner: S) -> HolderService<S> {
        if self.fold_case && self.target.is_some() {
            // Built here, not on the first request with a non-ASCII path.
            super::canonical::prepare_folds();
        }
        let routes = Routes::Prefixes {
            target: self.target.clone().map(Arc::new),
            prefixes: self.prefixes.clone(),
            fold_case: self.fold_case,
        };
        let settings = Arc::new(self.settings.clone());
        let app = AppEdge {
            inner,
            settings: settings.clone(),
        };
        let gate = Gate::new(settings.clone(), Edge::Layer, app);
        HolderService {
            stack: Route::new(Arc::new(routes), settings, gate),
        }
    }
}

/// Gates requests on one role. Without `prefixes`, every request through the
/// layer is gated (use it with `route_layer` or on a nested router).
#[derive(Clone)]
pub struct RoleHolderLayer {
    config: LayerConfig,
}

impl RoleHolderLayer {
    /// Gates every request (or only `prefixes`) on `role`. A role the
    /// coordinator does not know is an error, never an open gate: a typo
    /// must not let every request through.
    pub fn new(
        coordinator: &Coordinator,
        role: &str,
        options: LayerOptions,
    ) -> Result<Self, LayerError> {
        let Some(lease) = coordinator.role(role) else {
            return Err(LayerError::UnknownRole {
                role: role.into(),
                registered: plain_roles(coordinator),
            });
        };
        Ok(Self {
            config: LayerConfig::new(coordinator, Some(GateTarget::Role(lease)), options),
        })
    }

    /// Like [`RoleHolderLayer::new`], but a role the coordinator does not
    /// know installs a layer that gates nothing (passes every request to the
    /// inner service). Only for a single-instance development setup that
    /// registers no roles on purpose.
    pub fn if_registered(coordinator: &Coordinator, role: &str, options: LayerOptions) -> Self {
        let target = coordinator.role(role).map(GateTarget::Role);
        if target.is_none() {
            tracing::info!(
                role,
                "RoleHolderLayer::if_registered: role not registered; gating nothing"
            );
        }
        Self {
            config: LayerConfig::new(coordinator, target, options),
        }
    }

    /// Only paths under these prefixes (segment boundaries, matched on every
    /// decoded and normalized reading of the path, as the gateway does) are gated.
    pub fn prefixes<I: IntoIterator<Item = S>, S: Into<String>>(mut self, prefixes: I) -> Self {
        self.config.set_prefixes(prefixes);
        self
    }
}

/// Gates requests on a partition: the key picks the role.
#[derive(Clone)]
pub struct PartitionHolderLayer {
    config: LayerConfig,
}

impl PartitionHolderLayer {
    /// Gates requests on `partition`; `key` finds each request's key. A
    /// partition the coordinator does not know is an error, never an open gate.
    pub fn new(
        coordinator: &Coordinator,
        partition: &str,
        key: KeyExtractor,
        options: LayerOptions,
    ) -> Result<Self, LayerError> {
        match Self::if_registered(coordinator, partition, key, options) {
            layer if layer.config.target.is_some() => Ok(layer),
            _ => Err(LayerError::UnknownPartition {
                partition: partition.into(),
                registered: coordinator
                    .partitions()
                    .iter()
                    .map(|p| p.name().to_string())
                    .collect(),
            }),
        }
    }

    /// Like [`PartitionHolderLayer::new`], but a partition the coordinator
    /// does not know installs a layer that gates nothing. Only for a
    /// single-instance development setup.
    pub fn if_registered(
        coordinator: &Coordinator,
        partition: &str,
        key: KeyExtractor,
        options: LayerOptions,
    ) -> Self {
        let target = coordinator
            .partition(partition)
            .map(|p| GateTarget::Partition {
                partition: p,
                scope: None,
                key,
                body: super::FormBody::Check,
            });
        if target.is_none() {
            tracing::info!(
                partition,
                "PartitionHolderLayer::if_registered: partition not registered; gating nothing"
            );
        }
        Self {
            config: LayerConfig::new(coordinator, target, options),
        }
    }

    /// Hash `scope ++ 0x00 ++ key` instead of the key alone. Declare the
    /// scope with `CoordinatorBuilder::partition_scopes` too, so the
    /// partition's recorded definition covers it; otherwise a WARN says so.
    pub fn scope(mut self, scope: &str) -> Self {
        if let Some(GateTarget::Partition {
            scope: s,
            partition,
            ..
        }) = &mut self.config.target
        {
            if !partition.declares_scope(Some(scope)) {
                tracing::warn!(partition = %partition.name(), scope, "this layer hashes keys with a scope not declared for the partition (CoordinatorBuilder::partition_scopes): instances that hash it differently would not be detected");
            }
            *s = Some(scope.into());
        }
        self
    }

    /// Only paths under these prefixes are gated (see [`RoleHolderLayer::prefixes`]).
    pub fn prefixes<I: IntoIterator<Item = S>, S: Into<String>>(mut self, prefixes: I) -> Self {
        self.config.set_prefixes(prefixes);
        self
    }
}

impl<S> Layer<S> for RoleHolderLayer {
    type Service = HolderService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        self.config.stack(inner)
    }
}

impl<S> Layer<S> for PartitionHolderLayer {
    type Service = HolderService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        self.config.stack(inner)
    }
}

/// The service both layers produce: the request path the gateway runs too
/// (route, then gate), with the app below it.
#[derive(Clone)]
pub struct HolderService<S> {
    stack: Route<Gate<AppEdge<S>>>,
}

impl<S> Service<Request<Body>> for HolderService<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    /// Settled at once (a refused path), or as the gate settles it (the
    /// app runs inside that future).
    type Future = Either<
        Ready<Result<Response<Body>, Infallible>>,
        BoxFuture<'static, Result<Response<Body>, Infallible>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.stack.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        self.stack.call(req)
    }
}

/// The edge between the gate and the app: only rolegate sets
/// `X-Rolegate-*` for the app, so a client's are removed; an upgrade the
/// gate does not allow (h2c) is removed; the app's answer is checked as the
/// gateway checks an app's.
#[derive(Clone)]
struct AppEdge<S> {
    inner: S,
    settings: Arc<GateSettings>,
}

impl<S> Local for AppEdge<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.inner.poll_ready(cx).map(|ready| match ready {
            Ok(()) => (),
            Err(never) => match never {},
        })
    }

    async fn serve(mut self, mut req: Request<Body>, term: Option<Term>) -> Response<Body> {
        strip_rolegate(req.headers_mut());
        strip_disallowed_upgrade(req.headers_mut(), &self.settings.upgrades);
        if let Some(term) = term {
            term.mark(&mut req);
        }
        let ask = UpgradeAsk::of(req.headers());
        // The gate drove this service to readiness before moving it here.
        let resp = match self.inner.call(req).await {
            Ok(resp) => resp,
            Err(never) => match never {},
        };
        app_answer(resp, ask.as_ref(), &self.settings)
    }
}

/// What the in-process app answered, passed on as the gateway passes on an
/// app's answer: a 101 passes only when it completes the upgrade the
/// request asked for; any other is answered 502 `upstream-bad-upgrade`
/// (hyper then switches nothing). The gate removes the hop-refusal field
/// from every local answer.
fn app_answer(
    resp: Response<Body>,
    ask: Option<&UpgradeAsk>,
    settings: &GateSettings,
) -> Response<Body> {
    if resp.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        return resp;
    }
    match UpgradeAsk::check(ask, resp.headers()) {
        Ok(()) => resp,
        Err(why) => {
            let p = Problem::new(
                Reason::UpstreamBadUpgrade,
                format!("the app switched protocols unsafely: {why}"),
            );
            settings.reject(p).0
        }
    }
}

/// Removes an `Upgrade` the gate does not allow (and `HTTP2-Settings`), so an
/// in-process app cannot be switched to a protocol that bypasses the layer.
fn strip_disallowed_upgrade(headers: &mut http::HeaderMap, allowed: &[String]) {
    if headers.contains_key(http::header::UPGRADE)
        && !super::headers::upgrade_allowed(headers, allowed)
    {
        headers.remove(http::header::UPGRADE);
    }
    headers.remove("http2-settings");
}
