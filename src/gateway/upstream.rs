//! The gateway's local service, below the gate: the app behind this
//! gateway. A request admitted under a lease carries the role and fencing
//! token to the app; any other passes through.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use http_body::Body as _;
use tower::Service;

use crate::events::EventLog;
use crate::lease::HeldLease;
use crate::proxy::forward::prepare_headers;
use crate::proxy::gate::{GateSettings, Outcome};
use crate::proxy::headers::{REFUSED, ROLE, TOKEN};
use crate::proxy::stack::{answer, connect_info, with_outcome};
use crate::proxy::{failure_problem, HopProtocol, NextHop};
use crate::telemetry;

/// Sends requests to the app (`upstream.url`).
#[derive(Clone)]
pub(crate) struct Upstream {
    shared: Arc<Shared>,
}

struct Shared {
    settings: Arc<GateSettings>,
    url: String,
    protocol: HopProtocol,
    /// `upstream.close_after_body`.
    close_after_body: bool,
    /// `--events`: local admissions are logged here.
    events: Option<Arc<EventLog>>,
}

impl Upstream {
    pub(crate) fn new(
        settings: Arc<GateSettings>,
        url: String,
        protocol: HopProtocol,
        close_after_body: bool,
        events: Option<Arc<EventLog>>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                settings,
                url,
                protocol,
                close_after_body,
                events,
            }),
        }
    }
}

impl Service<Request<Body>> for Upstream {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let shared = self.shared.clone();
        Box::pin(async move { Ok(shared.send(req).await) })
    }
}

impl Shared {
    async fn send(&self, mut req: Request<Body>) -> Response<Body> {
        let settings = &self.settings;
        let client = connect_info(&req);
        let lease = req
            .extensions()
            .get::<HeldLease>()
            .map(|l| (l.role.clone(), l.token, l.checked_at));
        let trusted = settings.trusts(&req, client);
        prepare_headers(&mut req, settings.hop_context(trusted, client, false));
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
            Some((role, token, checked_at)) => {
                if let Some(log) = &self.events {
                    log.admitted(&settings.instance_id, role, *token, *checked_at);
                }
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
        let sent = (settings.forwarder)
            .proxy_over(req, &self.url, self.protocol)
            .await;
        telemetry::request_metrics()
            .forward_upstream
            .record(started.elapsed().as_secs_f64());
        match sent {
            Ok(mut resp) => {
                // Only a gateway refuses a hop: an app's answer carrying the
                // refusal field would make the forwarding gateway send the
                // request again, after this app ran it.
                resp.headers_mut().remove(REFUSED);
                with_outcome(resp, outcome)
            }
            Err(e) => {
                let hop = NextHop::App {
                    upstream: &self.url,
                };
                let p = failure_problem(&e, hop).role(lease.map(|(r, _, _)| r));
                answer(settings, p)
            }
        }
    }
}
