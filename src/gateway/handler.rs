//! The public listener's request path: the stack the layers run too,
//! wired for the gateway. A request walks down it once:
//!
//! `Refuse` (what cannot be routed safely) → `Route` (which role or
//! partition gates it) → `Gate` (forward, hold, refuse, or run here under
//! the lease) → `Upstream` (the app).
//!
//! Around it, each answer is counted by outcome, a gRPC client gets the
//! gateway's refusals as a gRPC status, and the body is tracked while it
//! streams.

use std::sync::Arc;

use axum::body::Body;
use http::{Request, Response};
use http_body::Body as _;
use hyper::body::Incoming;
use tower::ServiceExt;

use super::access_log::AccessLog;
use super::refuse::Refuse;
use super::upstream::Upstream;
use super::GatewayError;
use crate::config::{Config, RouteTarget};
use crate::events::EventLog;
use crate::lease::Coordinator;
use crate::proxy::forward::ArrivedOverTls;
use crate::proxy::gate::{GateSettings, GateTarget, Outcome};
use crate::proxy::hold::Holds;
use crate::proxy::hop::HopSigner;
use crate::proxy::problem::{grpc_answer, is_grpc};
use crate::proxy::routes::RouteTable;
use crate::proxy::stack::ConnectionFacts;
use crate::proxy::stack::{Edge, Gate, Route, Routes};
use crate::proxy::{Forwarder, KeyExtractor};
use crate::telemetry::{self, TrackedBody};

/// What is written about each request once it has ended (both off by
/// default).
#[derive(Clone, Default)]
pub(crate) struct Observers {
    /// `telemetry.access_log`.
    pub(crate) access: Option<AccessLog>,
    /// `telemetry.otlp`.
    #[cfg(feature = "otel")]
    pub(crate) traces: Option<super::trace::Traces>,
}

impl Observers {
    fn any(&self) -> bool {
        #[cfg(feature = "otel")]
        if self.traces.is_some() {
            return true;
        }
        self.access.is_some()
    }
}

/// The request path, shared by all connections.
pub(crate) struct GatewayState {
    stack: Refuse<Route<Gate<Upstream>>>,
    /// The observers, with the routes they name requests by and the
    /// settings a trace's parent is trusted by; `None` when all are off.
    observe: Option<(Observers, Arc<Routes>, Arc<GateSettings>)>,
    /// The HTTP/1.1 fast path, when it can serve this configuration.
    fast: Option<Arc<super::h1::FastPath>>,
}

impl GatewayState {
    /// Builds the route table from the config against a started coordinator.
    pub(crate) fn new(
        config: &Config,
        coordinator: &Coordinator,
        forwarder: Forwarder,
        holds: Arc<Holds>,
        events: Option<Arc<EventLog>>,
        observers: Observers,
    ) -> Result<Self, GatewayError> {
        let mut routes = RouteTable::new(config.proxy.case_insensitive_paths);
        for r in &config.routes {
            // A read config has a target on every route; one built by hand
            // without one is refused, never left ungated.
            let target = r
                .target()
                .ok_or_else(|| GatewayError::NotRegistered(r.prefixes.join(", ")))?;
            let target = match target {
                RouteTarget::Role(name) => GateTarget::Role(
                    coordinator
                        .role(&name)
                        .ok_or_else(|| GatewayError::NotRegistered(name.to_string()))?,
                ),
                RouteTarget::Partition {
                    name,
                    scope,
                    key,
                    body,
                } => GateTarget::Partition {
                    partition: coordinator
                        .partition(&name)
                        .ok_or_else(|| GatewayError::NotRegistered(name.to_string()))?,
                    scope: scope.as_deref().map(Arc::from),
                    key: KeyExtractor::from_source(&key),
                    body,
                },
            };
            routes.add(&r.prefixes, Arc::new(target));
        }
        let upstream = config.upstream.as_ref().ok_or(GatewayError::NoUpstream)?;
        let settings = Arc::new(GateSettings {
            instance_id: coordinator.instance_id().into(),
            signer: HopSigner::new(config.proxy.cluster_secret.as_deref()),
            retry_after_secs: config.retry_after_secs(),
            forwarder,
            upgrades: config.proxy.upgrades.clone().into(),
            trusted_proxies: config.proxy.trusted_proxies.clone().into(),
            peer_protocol: config.peers.protocol,
            holds,
            note: cfg!(feature = "otel") && config.telemetry.otlp.is_some(),
        });
        let events_again = events.clone();
        let app = Upstream::new(
            settings.clone(),
            upstream.url.clone(),
            upstream.protocol,
            upstream.close_after_body,
            events,
        );
        let gate = Gate::new(settings.clone(), Edge::Gateway, app);
        let routes = Arc::new(Routes::Table(routes));
        let route = Route::new(routes.clone(), settings.clone(), gate);
        let fast = (!observers.any())
            .then(|| fast_path(config, &routes, &settings, upstream, events_again))
            .flatten()
            .map(Arc::new);
        let observe = observers
            .any()
            .then(|| (observers, routes, settings.clone()));
        let stack = Refuse::new(settings, config.peers.require_client_cert, route);
        Ok(Self {
            stack,
            observe,
            fast,
        })
    }

    /// The HTTP/1.1 fast path, when this configuration has one.
    pub(crate) fn fast(&self) -> Option<&Arc<super::h1::FastPath>> {
        self.fast.as_ref()
    }

    /// Answers one request.
    pub(crate) async fn handle(
        &self,
        req: Request<Incoming>,
        conn: ConnectionFacts,
    ) -> Response<Body> {
        let req = req.map(Body::new);
        match &self.observe {
            None => self.respond(req, conn).await.0,
            // Boxed: the entries are not carried in every request's future
            // when the observers are off.
            Some((observers, routes, _settings)) => {
                Box::pin(async move {
                    #[allow(unused_mut)] // traces rewrite `traceparent`
                    let mut req = req;
                    let route = routes.target_name(req.uri().path());
                    // First: the access log names the trace the span is in.
                    #[cfg(feature = "otel")]
                    let span = observers
                        .traces
                        .as_ref()
                        .map(|t| t.begin(&mut req, conn.client, route.clone(), _settings));
                    let entry = observers
                        .access
                        .as_ref()
                        .map(|log| log.begin(&req, conn.client, route));
                    let (resp, label) = self.respond(req, conn).await;
                    #[cfg(feature = "otel")]
                    let resp = match span {
                        Some(span) => span.finish(label, resp),
                        None => resp,
                    };
                    match entry {
                        Some(entry) => entry.finish(label, resp),
                        None => resp,
                    }
                })
                .await
            }
        }
    }

    /// The answer through the stack, counted, and its outcome label.
    async fn respond(
        &self,
        mut req: Request<Body>,
        conn: ConnectionFacts,
    ) -> (Response<Body>, &'static str) {
        let grpc = is_grpc(req.headers());
        let extensions = req.extensions_mut();
        extensions.insert(conn);
        if conn.tls {
            extensions.insert(ArrivedOverTls);
        }
        let answer = async {
            match self.stack.clone().oneshot(req).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            }
        };
        let mut resp = answer.await;
        // Every service that answers marks how the request ended.
        let outcome = resp.extensions_mut().remove::<Outcome>();
        debug_assert!(outcome.is_some(), "an answer without its outcome");
        let outcome = outcome.unwrap_or(Outcome::Passthrough);
        let label = match outcome {
            Outcome::Local => "local",
            Outcome::Forwarded => "forwarded",
            Outcome::Passthrough => "passthrough",
            Outcome::Rejected(r) => r.as_str(),
        };
        (finish(grpc, resp, outcome, label), label)
    }
}

/// Counts the outcome and tracks the body while it streams (local work was
/// wrapped by the gate: it counts until its body has streamed).
fn finish(grpc: bool, resp: Response<Body>, outcome: Outcome, label: &str) -> Response<Body> {
    telemetry::request_metrics().count(label);
    // A gRPC client gets the gateway's own refusals as a gRPC status.
    let resp = match outcome {
        Outcome::Rejected(_) if grpc => grpc_answer(resp),
        _ => resp,
    };
    if resp.body().is_end_stream() {
        return resp;
    }
    resp.map(|body| TrackedBody::holding(body, None))
}

/// The fast path for an app spoken to in plain HTTP/1.1 at a URL without
/// a path (any other app is served by the stack alone).
fn fast_path(
    config: &Config,
    routes: &Arc<Routes>,
    settings: &Arc<GateSettings>,
    upstream: &crate::config::UpstreamConfig,
    events: Option<Arc<EventLog>>,
) -> Option<super::h1::FastPath> {
    if upstream.protocol != crate::proxy::HopProtocol::Http1 {
        return None;
    }
    let address = super::h1::plain_http_address(&upstream.url)?;
    Some(super::h1::FastPath {
        routes: routes.clone(),
        settings: settings.clone(),
        url: upstream.url.clone(),
        address,
        connect_timeout: config.proxy.connect_timeout,
        response_timeout: config.proxy.response_header_timeout,
        idle_timeout: config.proxy.idle_timeout,
        events,
        forwards: config.peers.protocol == crate::proxy::HopProtocol::Http1
            && config.peers.ca_file.is_none()
            && config.peers.cert_file.is_none(),
        hops_need_peer_cert: config.peers.require_client_cert,
    })
}
