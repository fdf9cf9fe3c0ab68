//! The gateway's local service, below the gate: the app behind this
//! gateway. A request admitted under a lease carries the role and fencing
//! token to the app; any other passes through.

use std::sync::Arc;

use axum::body::Body;
use http::{Request, Response};
use http_body::Body as _;

use crate::events::EventLog;
use crate::lease::HeldLease;
use crate::proxy::forward::{add_forwarding_fields, prepare_headers};
use crate::proxy::gate::{GateSettings, Outcome};
use crate::proxy::headers::{ROLE, TOKEN};
use crate::proxy::stack::{answer, connect_info, with_outcome, Local, Term};
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

impl Local for Upstream {
    async fn serve(self, mut req: Request<Body>, term: Option<Term>) -> Response<Body> {
        let lease = term.map(|t| {
            // An upgrade's tunnel takes the work from here.
            req.extensions_mut().insert(t.tunnel);
            t.lease
        });
        self.shared.send(req, lease).await
    }
}

impl Shared {
    async fn send(&self, mut req: Request<Body>, lease: Option<HeldLease>) -> Response<Body> {
        let settings = &self.settings;
        let client = connect_info(&req);
        if lease.is_some() {
            // Gated: the gate sanitized the fields before it admitted it.
            add_forwarding_fields(&mut req, client, &settings.instance_id, false);
        } else {
            let trusted = settings.trusts(&req, client);
            prepare_headers(&mut req, settings.hop_context(trusted, client, false));
        }
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
            Some(lease) => {
                if let Some(log) = &self.events {
                    log.admitted(
                        &settings.instance_id,
                        &lease.role,
                        lease.token,
                        lease.checked_at,
                    );
                }
                if let Ok(v) = http::HeaderValue::from_str(&lease.role) {
                    req.headers_mut().insert(ROLE, v);
                }
                req.headers_mut()
                    .insert(TOKEN, http::HeaderValue::from(lease.token));
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
            Ok(resp) => with_outcome(resp, outcome),
            Err(e) => {
                let hop = NextHop::App {
                    upstream: &self.url,
                };
                let p = failure_problem(&e, hop).role(lease.map(|l| l.role));
                answer(settings, p)
            }
        }
    }
}
