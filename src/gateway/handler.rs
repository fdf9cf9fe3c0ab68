//! The request handler of the public listener: refuse what cannot be
//! routed safely, find the route, settle a gated request (here, forwarded,
//! or refused), and pass everything else to the app.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use http::{Request, Response};
use http_body::Body as _;
use hyper::body::Incoming;

use super::GatewayError;
use crate::config::{Config, RouteTarget};
use crate::events::EventLog;
use crate::lease::Coordinator;
use crate::lease::LocalWork;
use crate::proxy::forward::{prepare_headers, sanitize_headers, ArrivedOverTls, TunnelWork};
use crate::proxy::gate::{GateSettings, GateTarget, Outcome};
use crate::proxy::headers::{carries_hop_marker, REFUSED, ROLE, TOKEN};
use crate::proxy::hold::Holds;
use crate::proxy::hop::HopSigner;
use crate::proxy::problem::{grpc_answer, is_grpc, Problem, Reason};
use crate::proxy::routes::{RouteError, RouteTable};
use crate::proxy::term_body::TermBody;
use crate::proxy::{failure_problem, Forwarder, HopProtocol, KeyExtractor, NextHop, Settled};
use crate::telemetry::{self, TrackedBody};

/// What the gateway knows of a connection, from the socket and the TLS
/// session only (never from a header).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionFacts {
    /// The peer's address.
    pub(crate) client: SocketAddr,
    /// The connection is TLS (the forwarding fields say `https`).
    pub(crate) tls: bool,
    /// The client presented a certificate that chains to `peers.ca_file`.
    pub(crate) verified_peer: bool,
}

impl ConnectionFacts {
    /// A connection without TLS: no certificate, so never a verified peer.
    pub(crate) fn plain(client: SocketAddr) -> Self {
        Self {
            client,
            tls: false,
            verified_peer: false,
        }
    }
}

/// Everything a request needs, shared by all connections.
pub(crate) struct GatewayState {
    routes: RouteTable<GateTarget>,
    settings: GateSettings,
    upstream: String,
    /// `peers.require_client_cert`: hop-marked requests need a verified peer.
    hops_need_peer_cert: bool,
    upstream_protocol: HopProtocol,
    /// `upstream.close_after_body`.
    close_after_body: bool,
    /// `--events`: local admissions are logged here.
    events: Option<Arc<EventLog>>,
}

impl GatewayState {
    /// Builds the route table from the config against a started coordinator.
    pub(crate) fn new(
        config: &Config,
        coordinator: &Coordinator,
        forwarder: Forwarder,
        holds: Arc<Holds>,
        events: Option<Arc<EventLog>>,
    ) -> Result<Self, GatewayError> {
        let mut routes = RouteTable::new(config.proxy.case_insensitive_paths);
        for r in &config.routes {
            let target = match &r.target {
                RouteTarget::Role(name) => GateTarget::Role(
                    coordinator
                        .role(name)
                        .ok_or_else(|| GatewayError::NotRegistered(name.to_string()))?,
                ),
                RouteTarget::Partition { name, scope, key } => GateTarget::Partition {
                    partition: coordinator
                        .partition(name)
                        .ok_or_else(|| GatewayError::NotRegistered(name.to_string()))?,
                    scope: scope.as_deref().map(Arc::from),
                    key: KeyExtractor::from_source(key),
                },
            };
            routes.add(&r.prefixes, target);
        }
        let (upstream, upstream_protocol, close_after_body) = config
            .upstream
            .as_ref()
            .map(|u| (u.url.clone(), u.protocol, u.close_after_body))
            .ok_or(GatewayError::NoUpstream)?;
        Ok(Self {
            routes,
            settings: GateSettings {
                instance_id: coordinator.instance_id().into(),
                signer: HopSigner::new(config.proxy.cluster_secret.as_deref()),
                retry_after_secs: config.retry_after_secs(),
                forwarder,
                upgrades: config.proxy.upgrades.clone().into(),
                trusted_proxies: config.proxy.trusted_proxies.clone().into(),
                peer_protocol: config.peers.protocol,
                holds,
            },
            upstream,
            hops_need_peer_cert: config.peers.require_client_cert,
            upstream_protocol,
            close_after_body,
            events,
        })
    }

    /// Answers one request.
    pub(crate) async fn handle(
        &self,
        req: Request<Incoming>,
        conn: ConnectionFacts,
    ) -> Response<Body> {
        let mut req = req.map(Body::new);
        let grpc = is_grpc(req.headers());
        let client = conn.client;
        if let Some(problem) = self.unverified_hop(&req, conn) {
            let (resp, outcome) = self.settings.reject(problem);
            return finish(grpc, resp, outcome, None);
        }
        if conn.tls {
            req.extensions_mut().insert(ArrivedOverTls);
        }
        if req.method() == http::Method::OPTIONS && req.uri().path() == "*" {
            // A server-wide capability probe: answered here, gating nothing.
            let mut resp = Response::new(Body::empty());
            resp.headers_mut().insert(
                http::header::ALLOW,
                http::HeaderValue::from_static("GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS"),
            );
            return finish(grpc, resp, Outcome::Passthrough, None);
        }
        if let Some(problem) = authority_to_host(&mut req).or_else(|| refuse_request(&req)) {
            let (resp, outcome) = self.settings.reject(problem);
            return finish(grpc, resp, outcome, None);
        }
        let target = match self.routes.find(req.uri().path()) {
            Ok(target) => target,
            Err(e) => {
                let reason = match e {
                    RouteError::Ambiguous => Reason::AmbiguousPath,
                    RouteError::BadPath(_) => Reason::BadRequest,
                };
                let (resp, outcome) = self.settings.reject(Problem::new(reason, e.to_string()));
                return finish(grpc, resp, outcome, None);
            }
        };
        let Some(target) = target else {
            // Remember a verified hop (its forwarding fields are trusted).
            self.settings.take_hop(&mut req, Some(client));
            let (resp, outcome) = self.to_upstream(req, client, None).await;
            return finish(grpc, resp, outcome, None);
        };
        let forwarded = self.settings.take_hop(&mut req, Some(client));
        // Decide on the headers the app will see.
        let trusted = self.settings.trusts(&req, Some(client));
        sanitize_headers(req.headers_mut(), trusted, &self.settings.upgrades);
        let (resp, outcome) = match self
            .settings
            .settle(target, req, Some(client), forwarded)
            .await
        {
            Settled::Local(mut req, lease, work) => {
                if let Some(log) = &self.events {
                    log.admitted(
                        &self.settings.instance_id,
                        &lease.role,
                        lease.token,
                        lease.checked_at,
                    );
                }
                // The work ends with its term: while the app has not answered,
                // the exchange is dropped (the app sees its connection close);
                // a body is cut; an upgrade takes the work into its tunnel.
                let over = work.over();
                let slot = TunnelWork::new(work);
                req.extensions_mut().insert(slot.clone());
                let role = lease.role.clone();
                let upstream = self.to_upstream(req, client, Some((lease.role, lease.token)));
                let (resp, outcome) = tokio::select! {
                    answer = upstream => answer,
                    _ = over => self.settings.reject(term_ended(role, slot.reason())),
                };
                // The work counts as running until its body has streamed.
                return finish(grpc, resp, outcome, slot.take());
            }
            Settled::Answered(resp, outcome) => (resp, outcome),
        };
        tracing::debug!(
            ?outcome,
            status = resp.status().as_u16(),
            "role route answered"
        );
        finish(grpc, resp, outcome, None)
    }

    /// With `peers.require_client_cert`, a request carrying a hop marker on a
    /// connection without a peer certificate is refused before any hop
    /// handling: no signature check, no forwarding, never the app.
    fn unverified_hop(&self, req: &Request<Body>, conn: ConnectionFacts) -> Option<Problem> {
        if !self.hops_need_peer_cert || conn.verified_peer || !carries_hop_marker(req.headers()) {
            return None;
        }
        tracing::debug!(client = %conn.client, "hop-marked request without a peer certificate refused");
        Some(Problem::new(
            Reason::PeerCertificateRequired,
            "a request marked as a gateway hop must come with a peer gateway's client certificate",
        ))
    }

    async fn to_upstream(
        &self,
        mut req: Request<Body>,
        client: SocketAddr,
        lease: Option<(Arc<str>, u64)>,
    ) -> (Response<Body>, Outcome) {
        let trusted = self.settings.trusts(&req, Some(client));
        prepare_headers(
            &mut req,
            self.settings.hop_context(trusted, Some(client), false),
        );
        if self.close_after_body && !req.body().is_end_stream() {
            // An app server that leaves this body unread must not read its
            // bytes as the next request: there is no next request. An
            // upgrade with a body (no WebSocket handshake has one) loses its
            // upgrade: servers read `Connection: upgrade, close` as keep-alive.
            req.headers_mut().remove(http::header::UPGRADE);
            req.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
        }
        let outcome = match &lease {
            Some((role, token)) => {
                if let Ok(v) = http::HeaderValue::from_str(role) {
                    req.headers_mut().insert(ROLE, v);
                }
                req.headers_mut()
                    .insert(TOKEN, http::HeaderValue::from(*token));
                Outcome::Local
            }
            None => Outcome::Passthrough,
        };
        let started = std::time::Instant::now();
        let answer = (self.settings.forwarder)
            .proxy_over(req, &self.upstream, self.upstream_protocol)
            .await;
        telemetry::request_metrics()
            .forward_upstream
            .record(started.elapsed().as_secs_f64());
        match answer {
            Ok(mut resp) => {
                // Only a gateway refuses a hop: an app's answer carrying the
                // refusal field would make the forwarding gateway send the
                // request again, after this app ran it.
                resp.headers_mut().remove(REFUSED);
                (resp, outcome)
            }
            Err(e) => {
                let hop = NextHop::App {
                    upstream: &self.upstream,
                };
                let p = failure_problem(&e, hop).role(lease.map(|(r, _)| r));
                self.settings.reject(p)
            }
        }
    }
}

/// An HTTP/2 request names its authority in `:authority`; the app behind
/// may speak HTTP/1.1 and read `Host`. So `Host` is filled from
/// `:authority`, and a request whose two differ (compared ignoring ASCII
/// case), or whose authority carries user information, is refused: the
/// gateway and the app must not see two different hosts.
fn authority_to_host(req: &mut Request<Body>) -> Option<Problem> {
    if req.version() != http::Version::HTTP_2 {
        return None;
    }
    // HTTP/2 may split Cookie into several fields; an HTTP/1.1 app expects
    // one (RFC 9113 8.2.3), joined with "; ".
    join_cookies(req.headers_mut());
    // An HTTP/2 client always takes trailers (gRPC needs them), so the next
    // hop may send them even when it speaks HTTP/1.1.
    req.headers_mut()
        .insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    let authority = req.uri().authority().map(|a| a.as_str().to_owned());
    let Some(authority) = authority else {
        return None; // refuse_request wants a Host, as for HTTP/1.1
    };
    if authority.contains('@') || authority.is_empty() {
        return Some(Problem::new(
            Reason::BadRequest,
            ":authority may not carry user information",
        ));
    }
    let mut hosts = req.headers().get_all(http::header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (None, _) => {
            let value = http::HeaderValue::from_str(&authority).ok()?;
            req.headers_mut().insert(http::header::HOST, value);
            None
        }
        (Some(h), None) if h.as_bytes().eq_ignore_ascii_case(authority.as_bytes()) => None,
        (Some(_), None) => Some(Problem::new(
            Reason::BadRequest,
            "Host and :authority name different hosts",
        )),
        // Two Host fields: refuse_request answers.
        (Some(_), Some(_)) => None,
    }
}

/// Joins several `Cookie` fields into one, separated by `"; "`.
fn join_cookies(headers: &mut http::HeaderMap) {
    let mut all = headers.get_all(http::header::COOKIE).iter();
    let (Some(_), Some(_)) = (all.next(), all.next()) else {
        return;
    };
    let joined: Vec<&[u8]> = (headers.get_all(http::header::COOKIE).iter())
        .map(|v| v.as_bytes())
        .collect();
    if let Ok(v) = http::HeaderValue::from_bytes(&joined.join(&b"; "[..])) {
        headers.insert(http::header::COOKIE, v);
    }
}

/// Requests refused before routing: `CONNECT` (405), a target that is not a
/// path (400; `OPTIONS *` is answered earlier, by the gateway), two `Host`
/// fields, or an HTTP/1.1 request without one (400).
fn refuse_request(req: &Request<Body>) -> Option<Problem> {
    if req.method() == http::Method::CONNECT {
        return Some(Problem::new(
            Reason::MethodNotAllowed,
            "CONNECT is not supported",
        ));
    }
    if !req.uri().path().starts_with('/') {
        return Some(Problem::new(
            Reason::BadRequest,
            "the request target must be a path starting with /",
        ));
    }
    let mut hosts = req.headers().get_all(http::header::HOST).iter();
    // An HTTP/2 request got its Host from `:authority` above.
    let http11 = matches!(
        req.version(),
        http::Version::HTTP_11 | http::Version::HTTP_2
    );
    match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => {
            return Some(Problem::new(
                Reason::BadRequest,
                "the request has more than one Host field",
            ))
        }
        (None, _) if http11 => {
            return Some(Problem::new(
                Reason::BadRequest,
                "an HTTP/1.1 request needs a Host field (HTTP/2: :authority)",
            ))
        }
        (Some(h), None) if http11 && h.is_empty() => {
            return Some(Problem::new(
                Reason::BadRequest,
                "an HTTP/1.1 request needs a non-empty Host field",
            ))
        }
        // A Host that is no authority would reach the app as sent over an
        // HTTP/1.1 hop but be replaced over an HTTP/2 one: refused either way.
        (Some(h), None)
            if !h.is_empty()
                && (h.as_bytes().contains(&b'@')
                    || http::uri::Authority::try_from(h.as_bytes()).is_err()) =>
        {
            return Some(Problem::new(
                Reason::BadRequest,
                "Host is not a host[:port] authority",
            ))
        }
        _ => {}
    }
    // `Connection` may not name the fields that frame or address the request:
    // stripping them would change what the app sees (its Host above all).
    let framing = [
        http::header::HOST,
        http::header::CONTENT_LENGTH,
        http::header::TRANSFER_ENCODING,
    ];
    let names_framing = req
        .headers()
        .get_all(http::header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .filter_map(|t| http::HeaderName::from_bytes(t.trim_ascii()).ok())
        .any(|n| framing.contains(&n));
    names_framing.then(|| {
        Problem::new(
            Reason::BadRequest,
            "Connection may not name Host, Content-Length or Transfer-Encoding",
        )
    })
}

/// The 503 for a local request whose term ended before the app answered.
fn term_ended(role: Arc<str>, reason: &'static str) -> Problem {
    metrics::counter!(telemetry::STREAMS_ENDED, "role" => role.to_string(), "reason" => reason)
        .increment(1);
    Problem::new(
        Reason::TermEnded,
        format!("role `{role}` moved while this request ran here; it was cut off and may have partly run"),
    )
    .role(Some(role))
}

/// Counts the outcome and tracks the body while it streams; local work
/// counts as running until its body has streamed, and ends with its term.
fn finish(
    grpc: bool,
    resp: Response<Body>,
    outcome: Outcome,
    work: Option<LocalWork>,
) -> Response<Body> {
    let label = match outcome {
        Outcome::Local => "local",
        Outcome::Forwarded => "forwarded",
        Outcome::Passthrough => "passthrough",
        Outcome::Rejected(r) => r.as_str(),
    };
    telemetry::request_metrics().count(label);
    // A gRPC client gets the gateway's own refusals as a gRPC status.
    let resp = match outcome {
        Outcome::Rejected(_) if grpc => grpc_answer(resp),
        _ => resp,
    };
    if resp.body().is_end_stream() {
        return resp;
    }
    resp.map(|body| match work {
        Some(work) => TrackedBody::holding(Body::new(TermBody::new(body, work)), None),
        None => TrackedBody::holding(body, None),
    })
}
