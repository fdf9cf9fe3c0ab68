//! Tower layers for axum apps: `RoleHolderLayer` and `PartitionHolderLayer`,
//! mounted around the router (before routing). On the holder the inner
//! service runs with a [`HeldLease`] request extension; elsewhere the request
//! is forwarded one hop to the holder's app or answered 503/400.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::ConnectInfo;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use tower::{Layer, Service};

use super::forward::{ForwardError, Forwarder};
use super::gate::{Decision, GateSettings, GateTarget};
use super::headers::strip_rolegate;
use super::hop::HopSigner;
use super::keys::KeyExtractor;
use super::routes::prefix_matches;
use crate::lease::{Coordinator, HeldLease};

/// Options shared by both layers.
#[derive(Clone)]
pub struct LayerOptions {
    pub forwarder: Forwarder,
    pub cluster_secret: Option<String>,
    pub retry_after_secs: u64,
}

impl LayerOptions {
    /// Defaults: connect timeout 1 s, response-head timeout 30 s, Retry-After 5 s.
    pub fn new() -> Result<Self, ForwardError> {
        Ok(Self {
            forwarder: Forwarder::new(
                std::time::Duration::from_secs(1),
                std::time::Duration::from_secs(30),
            )?,
            cluster_secret: None,
            retry_after_secs: 5,
        })
    }
}

#[derive(Clone)]
struct Gate {
    /// `None`: the role is not registered; the layer installs nothing.
    target: Option<GateTarget>,
    prefixes: Arc<[String]>,
    settings: GateSettings,
}

impl Gate {
    fn new(coordinator: &Coordinator, target: Option<GateTarget>, options: LayerOptions) -> Self {
        Self {
            target,
            prefixes: Arc::from(Vec::new()),
            settings: GateSettings {
                instance_id: coordinator.instance_id().into(),
                signer: HopSigner::new(options.cluster_secret.as_deref()),
                retry_after_secs: options.retry_after_secs,
                forwarder: options.forwarder,
            },
        }
    }

    fn applies(&self, path: &str) -> bool {
        self.target.is_some()
            && (self.prefixes.is_empty() || self.prefixes.iter().any(|p| prefix_matches(p, path)))
    }
}

/// Gates requests on one role. Without `prefixes`, every request through the
/// layer is gated (use it with `route_layer` or on a nested router).
#[derive(Clone)]
pub struct RoleHolderLayer {
    gate: Gate,
}

impl RoleHolderLayer {
    pub fn new(coordinator: &Coordinator, role: &str, options: LayerOptions) -> Self {
        let target = coordinator.role(role).map(GateTarget::Role);
        if target.is_none() {
            tracing::warn!(
                role,
                "RoleHolderLayer for an unregistered role installs nothing"
            );
        }
        Self {
            gate: Gate::new(coordinator, target, options),
        }
    }

    /// Only paths under these prefixes (segment boundaries) are gated.
    pub fn prefixes<I: IntoIterator<Item = S>, S: Into<String>>(mut self, prefixes: I) -> Self {
        self.gate.prefixes = prefixes
            .into_iter()
            .map(Into::into)
            .collect::<Vec<_>>()
            .into();
        self
    }
}

/// Gates requests on a partition: the key picks the role.
#[derive(Clone)]
pub struct PartitionHolderLayer {
    gate: Gate,
}

impl PartitionHolderLayer {
    pub fn new(
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
            });
        if target.is_none() {
            tracing::warn!(
                partition,
                "PartitionHolderLayer for an unregistered partition installs nothing"
            );
        }
        Self {
            gate: Gate::new(coordinator, target, options),
        }
    }

    /// Hash `scope ++ 0x00 ++ key` instead of the key alone.
    pub fn scope(mut self, scope: &str) -> Self {
        if let Some(GateTarget::Partition { scope: s, .. }) = &mut self.gate.target {
            *s = Some(scope.into());
        }
        self
    }

    pub fn prefixes<I: IntoIterator<Item = S>, S: Into<String>>(mut self, prefixes: I) -> Self {
        self.gate.prefixes = prefixes
            .into_iter()
            .map(Into::into)
            .collect::<Vec<_>>()
            .into();
        self
    }
}

impl<S> Layer<S> for RoleHolderLayer {
    type Service = HolderService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        HolderService {
            inner,
            gate: self.gate.clone(),
        }
    }
}

impl<S> Layer<S> for PartitionHolderLayer {
    type Service = HolderService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        HolderService {
            inner,
            gate: self.gate.clone(),
        }
    }
}

/// The service both layers produce.
#[derive(Clone)]
pub struct HolderService<S> {
    inner: S,
    gate: Gate,
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
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        // Take the service that was driven to readiness; leave a fresh clone.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let gate = self.gate.clone();
        Box::pin(async move {
            let target = match &gate.target {
                Some(target) if gate.applies(req.uri().path()) => target,
                _ => {
                    // Not gated here: remember a verified hop for inner layers,
                    // then strip, since only rolegate sets X-Rolegate-* for the app.
                    gate.settings.take_hop(&mut req);
                    strip_rolegate(req.headers_mut());
                    return inner.call(req).await;
                }
            };
            let forwarded = gate.settings.take_hop(&mut req);
            match target.decide(req.uri(), req.headers(), forwarded) {
                Decision::Local(lease) => {
                    strip_rolegate(req.headers_mut());
                    req.extensions_mut().insert::<HeldLease>(lease);
                    inner.call(req).await
                }
                Decision::Forward { address, role } => {
                    let client = req
                        .extensions()
                        .get::<ConnectInfo<SocketAddr>>()
                        .map(|c| c.0);
                    let partition = target.partition_label();
                    Ok(gate
                        .settings
                        .forward_to_holder(req, client, &address, role, partition)
                        .await
                        .0)
                }
                Decision::Reject(p) => Ok(gate.settings.reject(p).0),
            }
        })
    }
}
