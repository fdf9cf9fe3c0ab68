//! The request path the gateway and the layers share, as two tower services:
//!
//! - [`Route`] finds what gates a request (a role, a partition, or nothing);
//! - [`Gate`] settles a gated request: forwarded one hop to the holder,
//!   held until one can serve it, refused, or run here under the lease.
//!
//! Below them sits the local service ([`Local`]): the gateway's upstream
//! client, or the app a layer wraps. The gate runs it inside its own boxed
//! future (the one allocation the stack makes per request), and hands it the
//! term a request was admitted under as an argument. The holder decision and the lifetime of local work
//! exist only here: local work counts as running until the response body
//! has streamed (or, in the gateway, an upgrade's tunnel closes), and ends
//! with its term. A layer's app that upgrades keeps no count past its 101:
//! its own upgraded task learns of the term's end from the `TermWatch`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::ConnectInfo;
use futures_util::future::{BoxFuture, Either, Ready};
use http::{Request, Response};
use tower::Service;

use super::canonical::{match_readings, prefix_matches};
use super::forward::{sanitize_headers, TunnelWork};
use super::gate::{GateNote, GateSettings, GateTarget, Outcome, Settled};
use super::problem::{Problem, Reason};
use super::routes::{RouteError, RouteTable};
use super::term_body::TermBody;
use crate::lease::{HeldLease, LocalWork, TermWatch};

/// The term a local request runs under: the lease it was admitted by, the
/// watch that says when the term ends, and the slot an upgrade's tunnel
/// takes the work from.
pub(crate) struct Term {
    pub(crate) lease: HeldLease,
    pub(crate) watch: TermWatch,
    #[cfg_attr(not(feature = "gateway"), allow(dead_code))] // only the gateway's tunnel takes it
    /// For the gateway's upgrade tunnel only: a layer's app never gets it
    /// (it could keep the work alive past its term by holding it).
    pub(crate) tunnel: TunnelWork,
}

impl Term {
    /// Puts the lease and the watch in `req`'s extensions, where an
    /// in-process app reads them.
    pub(crate) fn mark(self, req: &mut Request<Body>) {
        req.extensions_mut().insert(self.watch);
        req.extensions_mut().insert(self.lease);
    }
}

/// The service below the gate: runs a request here, admitted under `term`
/// (`None`: an ungated request). The gate drives it to readiness in its own
/// `poll_ready` (so a service with backpressure pushes back on the
/// connection, before anything is admitted), then moves the ready service
/// into the request's future and leaves a clone, as tower services are used.
pub(crate) trait Local: Clone + Send + 'static {
    /// Ready to take a request; the default is always.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<()> {
        Poll::Ready(())
    }

    /// Answers `req`; never fails (a failure is an answer).
    fn serve(
        self,
        req: Request<Body>,
        term: Option<Term>,
    ) -> impl Future<Output = Response<Body>> + Send + 'static;
}

/// What gates requests: the gateway's route table, or one layer's target
/// and prefixes.
pub(crate) enum Routes {
    #[cfg_attr(not(feature = "gateway"), allow(dead_code))] // only the gateway builds it
    /// The gateway's `routes`: the longest matching prefix picks the target.
    Table(RouteTable<Arc<GateTarget>>),
    /// A layer: every request under one of `prefixes` (all of them when
    /// empty) is gated on `target`; `None` gates nothing.
    Prefixes {
        target: Option<Arc<GateTarget>>,
        /// Canonical prefixes.
        prefixes: Arc<[Vec<u8>]>,
        fold_case: bool,
    },
}

impl Routes {
    /// The target gating `path`, if any; a path that cannot be read safely
    /// (or, for the gateway, whose readings route differently) is refused.
    /// The role or partition gating `path`, if any (for the access log).
    #[cfg(feature = "gateway")]
    pub(crate) fn target_name(&self, path: &str) -> Option<Arc<str>> {
        self.find(path).ok().flatten().map(|t| t.name())
    }

    /// The target gating `path` (the HTTP/1.1 fast path routes by it).
    #[cfg(feature = "gateway")]
    pub(crate) fn lookup(&self, path: &str) -> Result<Option<Arc<GateTarget>>, Problem> {
        self.find(path)
    }

    fn find(&self, path: &str) -> Result<Option<Arc<GateTarget>>, Problem> {
        match self {
            Routes::Table(table) => match table.find(path) {
                Ok(target) => Ok(target.cloned()),
                Err(e) => {
                    let reason = match e {
                        RouteError::Ambiguous => Reason::AmbiguousPath,
                        RouteError::BadPath(_) => Reason::BadRequest,
                    };
                    Err(Problem::new(reason, e.to_string()))
                }
            },
            Routes::Prefixes { target: None, .. } => Ok(None),
            Routes::Prefixes {
                target: Some(target),
                prefixes,
                fold_case,
            } => {
                let readings = match_readings(path, *fold_case)
                    .map_err(|e| Problem::new(Reason::BadRequest, e.to_string()))?;
                let gated = prefixes.is_empty()
                    || readings
                        .iter()
                        .any(|r| prefixes.iter().any(|p| prefix_matches(p, r, *fold_case)));
                Ok(gated.then(|| target.clone()))
            }
        }
    }
}

/// A request as [`Route`] passes it on: with the target that gates it, if
/// any.
pub(crate) struct Routed {
    pub(crate) req: Request<Body>,
    pub(crate) target: Option<Arc<GateTarget>>,
}

/// Finds what gates each request and passes it on with it ([`Routed`]);
/// answers 400 for a path it cannot route safely.
#[derive(Clone)]
pub(crate) struct Route<S> {
    inner: S,
    routes: Arc<Routes>,
    settings: Arc<GateSettings>,
}

impl<S> Route<S> {
    pub(crate) fn new(routes: Arc<Routes>, settings: Arc<GateSettings>, inner: S) -> Self {
        Self {
            inner,
            routes,
            settings,
        }
    }
}

impl<S> Service<Request<Body>> for Route<S>
where
    S: Service<Routed, Response = Response<Body>, Error = Infallible>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response<Body>, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        match self.routes.find(req.uri().path()) {
            Ok(target) => Either::Right(self.inner.call(Routed { req, target })),
            Err(p) => Either::Left(futures_util::future::ready(Ok(answer(&self.settings, p)))),
        }
    }
}

/// Which form runs the stack: it decides how a gated request's forwarding
/// fields (`Forwarded`, `X-Forwarded-*`) are judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Edge {
    #[cfg_attr(not(feature = "gateway"), allow(dead_code))] // only the gateway builds it
    /// The gateway, which faces clients: forwarding fields are kept only
    /// from a trusted proxy or a verified hop.
    Gateway,
    /// A layer, behind whatever the app's server already trusts: forwarding
    /// fields are kept.
    Layer,
}

/// Settles each gated request; an ungated one goes to the local service as
/// is (a verified hop marker is remembered for inner layers). Ready when the
/// local service is. Whatever the local service answers loses the
/// hop-refusal field: only a gateway refuses a hop, and from an app it would
/// make the forwarding gateway send the request again after it ran here.
#[derive(Clone)]
pub(crate) struct Gate<S> {
    inner: S,
    settings: Arc<GateSettings>,
    edge: Edge,
}

impl<S> Gate<S> {
    pub(crate) fn new(settings: Arc<GateSettings>, edge: Edge, inner: S) -> Self {
        Self {
            inner,
            settings,
            edge,
        }
    }
}

impl<S: Local> Service<Routed> for Gate<S> {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx).map(Ok)
    }

    fn call(&mut self, Routed { mut req, target }: Routed) -> Self::Future {
        let client = connect_info(&req);
        let settings = &self.settings;
        // Take the service that was driven to readiness; leave a fresh clone.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let Some(target) = target else {
            settings.take_hop(&mut req, client);
            return Box::pin(async move { Ok(from_local(inner.serve(req, None).await)) });
        };
        let settings = settings.clone();
        let edge = self.edge;
        Box::pin(async move {
            let forwarded = settings.take_hop(&mut req, client);
            // Decide on the forwarding fields the app or a peer will see.
            let trusted = match edge {
                Edge::Gateway => settings.trusts(&req, client),
                Edge::Layer => true,
            };
            sanitize_headers(req.headers_mut(), trusted, &settings.upgrades);
            if let Some(name) = target.form_key() {
                match super::form_body::check(req, name).await {
                    Ok(checked) => req = checked,
                    Err(refusal) => {
                        let reason = match refusal {
                            super::form_body::FormRefusal::Broken => Reason::BadBody,
                            _ => Reason::AmbiguousKey,
                        };
                        let partition = target.partition_label();
                        let detail = format!(
                            "partition `{}` key (query {name}): {refusal}",
                            partition.as_deref().unwrap_or("?")
                        );
                        let problem = Problem::new(reason, detail).partition(partition.clone());
                        let (resp, outcome) = settings.reject(problem);
                        let resp = with_outcome(resp, outcome);
                        return Ok(match settings.note {
                            true => with_note(
                                resp,
                                GateNote {
                                    partition,
                                    ..GateNote::default()
                                },
                            ),
                            false => resp,
                        });
                    }
                }
            }
            let mut note = settings.note.then(|| GateNote {
                partition: target.partition_label(),
                ..GateNote::default()
            });
            let resp = match settings
                .settle(&target, req, client, forwarded, note.as_mut())
                .await
            {
                Settled::Local(req, lease, work) => {
                    run_local(inner, req, (lease, work), &settings).await
                }
                Settled::Answered(resp, outcome) => {
                    tracing::debug!(
                        ?outcome,
                        status = resp.status().as_u16(),
                        "role route answered"
                    );
                    with_outcome(resp, outcome)
                }
            };
            Ok(match note {
                Some(note) => with_note(resp, note),
                None => resp,
            })
        })
    }
}

/// Runs a request here under its term. While the local service has not
/// answered, the exchange is dropped when the term ends (a gateway's app
/// sees its connection close; a layer's handler future is dropped) and the
/// client gets 503 `term-ended`; the response body is cut when the term
/// ends; the gateway's upgrade tunnel takes the work and ends with it; a
/// layer's app that upgrades ends its own work from the watch.
async fn run_local<S: Local>(
    inner: S,
    req: Request<Body>,
    (lease, work): (HeldLease, LocalWork),
    settings: &GateSettings,
) -> Response<Body> {
    let over = work.over();
    let role = lease.role.clone();
    // The app's own long work (a WebSocket task, a loop) learns of the
    // term's end from the watch.
    let watch = work.watch().clone();
    let slot = TunnelWork::new(work);
    let term = Term {
        lease,
        watch,
        tunnel: slot.clone(),
    };
    let resp = tokio::select! {
        resp = inner.serve(req, Some(term)) => from_local(resp),
        _ = over => {
            drop(slot.take());
            return answer(settings, term_ended(role, slot.metric_label(), slot.reason()));
        }
    };
    // The work counts as running until its body has streamed.
    match slot.take() {
        Some(work) if !http_body::Body::is_end_stream(resp.body()) => {
            resp.map(|body| Body::new(TermBody::new(body, work)))
        }
        _ => resp,
    }
}

/// An answer of the local service, as the client may see it: without the
/// hop-refusal field (see [`Gate`]).
fn from_local(mut resp: Response<Body>) -> Response<Body> {
    resp.headers_mut().remove(super::headers::REFUSED);
    resp
}

/// The 503 for a local request whose term ended before it was answered.
pub(crate) fn term_ended(role: Arc<str>, label: String, reason: &'static str) -> Problem {
    metrics::counter!(crate::telemetry::STREAMS_ENDED, "role" => label, "reason" => reason)
        .increment(1);
    Problem::new(
        Reason::TermEnded,
        format!("role `{role}` moved while this request ran here; it was cut off and may have partly run"),
    )
    .role(Some(role))
}

#[cfg_attr(not(feature = "gateway"), allow(dead_code))] // only the gateway reads `tls` and `verified_peer`
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
    #[cfg(feature = "gateway")]
    /// A connection without TLS: no certificate, so never a verified peer.
    pub(crate) fn plain(client: SocketAddr) -> Self {
        Self {
            client,
            tls: false,
            verified_peer: false,
        }
    }
}

/// The peer's address: from the gateway's [`ConnectionFacts`], or from
/// axum's `ConnectInfo` when the app serves with it.
pub(crate) fn connect_info(req: &Request<Body>) -> Option<SocketAddr> {
    let extensions = req.extensions();
    match extensions.get::<ConnectionFacts>() {
        Some(facts) => Some(facts.client),
        None => extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0),
    }
}

/// A response that carries how the request ended (a response extension the
/// gateway counts by; a layer leaves it).
pub(crate) fn with_outcome(mut resp: Response<Body>, outcome: Outcome) -> Response<Body> {
    resp.extensions_mut().insert(outcome);
    resp
}
/// A gated answer with what the gate learned of it (for its trace span).
fn with_note(mut resp: Response<Body>, note: GateNote) -> Response<Body> {
    resp.extensions_mut().insert(note);
    resp
}

/// The answer to a problem found on the way down the stack, marked with its
/// outcome.
pub(crate) fn answer(settings: &GateSettings, p: Problem) -> Response<Body> {
    let (resp, outcome) = settings.reject(p);
    with_outcome(resp, outcome)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;
    use crate::lease::{Coordinator, CoordinatorBuilder, LeaseTimings};
    use crate::proxy::{defaults, Forwarder};
    use crate::store::MemoryStore;

    const T: LeaseTimings = LeaseTimings {
        duration: Duration::from_millis(600),
        renew_interval: Duration::from_millis(100),
        safety_margin: Duration::from_millis(150),
    };

    fn settings(coordinator: &Coordinator) -> Arc<GateSettings> {
        Arc::new(GateSettings {
            instance_id: coordinator.instance_id().into(),
            signer: crate::proxy::hop::HopSigner::new(None),
            retry_after_secs: 1,
            forwarder: Forwarder::new(defaults::CONNECT_TIMEOUT, defaults::RESPONSE_HEADER_TIMEOUT)
                .unwrap(),
            upgrades: Arc::from(Vec::new()),
            trusted_proxies: Arc::from(Vec::new()),
            peer_protocol: crate::proxy::HopProtocol::Http1,
            holds: crate::proxy::hold::Holds::new(Duration::ZERO, 16),
            note: false,
        })
    }

    async fn held_coordinator() -> Coordinator {
        let c = CoordinatorBuilder::new(Arc::new(MemoryStore::new()))
            .role("jobs", T)
            .drain_timeout(Duration::from_millis(300))
            .start()
            .unwrap();
        let role = c.role("jobs").unwrap();
        for _ in 0..200 {
            if role.is_held() {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the role was never held");
    }

    fn get(path: &str) -> Request<Body> {
        Request::get(path).body(Body::empty()).unwrap()
    }

    /// The local service: says whether it ran under a lease, and streams
    /// a body that never ends on its own.
    #[derive(Clone)]
    struct App;

    impl Local for App {
        async fn serve(self, mut req: Request<Body>, term: Option<Term>) -> Response<Body> {
            if let Some(term) = term {
                term.mark(&mut req);
            }
            let held = req.extensions().get::<HeldLease>().is_some();
            let body = if held {
                let stream = futures_util::stream::unfold((), |()| async {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Some((Ok::<_, Infallible>(bytes::Bytes::from_static(b"tick")), ()))
                });
                Body::from_stream(stream)
            } else {
                Body::from(format!("held={held}"))
            };
            Response::new(body)
        }
    }

    #[tokio::test]
    async fn route_passes_what_it_does_not_gate_and_refuses_an_unreadable_path() {
        let c = held_coordinator().await;
        let settings = settings(&c);
        let target = Arc::new(GateTarget::Role(c.role("jobs").unwrap()));
        let routes = Arc::new(Routes::Prefixes {
            target: Some(target),
            prefixes: Arc::from(vec![b"/jobs".to_vec()]),
            fold_case: true,
        });
        // No gate below: what the route passes on is all there is.
        let seen = tower::service_fn(|r: Routed| async move {
            let said = format!("{} gated={}", r.req.uri().path(), r.target.is_some());
            Ok::<_, Infallible>(Response::new(Body::from(said)))
        });
        let route = Route::new(routes, settings, seen);
        for (path, said) in [
            ("/other", "/other gated=false"),
            ("/JOBS/run", "/JOBS/run gated=true"),
            ("/x/../jobs", "/x/../jobs gated=true"),
        ] {
            let resp = route.clone().oneshot(get(path)).await.unwrap();
            let text = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&text[..], said.as_bytes());
        }
        let resp = route.oneshot(get("/jobs/a%00b")).await.unwrap();
        assert_eq!(resp.status(), http::StatusCode::BAD_REQUEST);
        c.shutdown_now().await;
    }

    #[tokio::test]
    async fn gate_runs_local_work_until_its_body_ends_and_cuts_it_with_the_term() {
        let c = held_coordinator().await;
        let settings = settings(&c);
        let target = Arc::new(GateTarget::Role(c.role("jobs").unwrap()));
        let routes = Arc::new(Routes::Prefixes {
            target: Some(target),
            prefixes: Arc::from(Vec::new()),
            fold_case: true,
        });
        let gate = Gate::new(settings.clone(), Edge::Layer, App);
        let stack = Route::new(routes, settings, gate);
        let resp = stack.oneshot(get("/jobs/run")).await.unwrap();
        assert_eq!(resp.status(), http::StatusCode::OK);
        let mut body = resp.into_body();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.data_ref().unwrap().as_ref(), b"tick");
        // The stream is local work: the stop waits for it (up to its drain
        // bound), ends the term, and the body fails at its next poll.
        let stopping = std::time::Instant::now();
        let stop = tokio::spawn(async move { c.shutdown().await });
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match body.frame().await {
                    Some(Ok(_)) => continue,
                    // Cut, not ended cleanly: the client must not take a
                    // cut stream for a whole one.
                    Some(Err(_)) => return true,
                    None => return false,
                }
            }
        })
        .await;
        assert_eq!(
            ended,
            Ok(true),
            "the body outlived its term, or ended as if whole"
        );
        // Not cut at once: the stop waited its drain bound for the stream,
        // which it does only while the stream counts as the role's work.
        let waited = stopping.elapsed();
        assert!(waited >= Duration::from_millis(300), "cut after {waited:?}");
        stop.await.unwrap();
    }
}
