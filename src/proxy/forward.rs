//! Forwarding one hop: a pooled HTTP/1.1 client (http and https peers),
//! bodies streamed both ways frame by frame (trailers included), upgrades
//! (WebSocket) bridged by copying bytes both ways. No retries, no queues.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{header, Request, Response, StatusCode, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use super::headers::{add_forwarding, is_upgrade_request, strip_hop_by_hop};

/// Idle pooled connections are closed after this, below the 5 s keep-alive
/// common in app servers, so a reused connection is rarely one the peer closes.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// Bytes of a health-probe answer read before the connection is dropped.
const PROBE_BODY_LIMIT: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("cannot connect to {0}: {1}")]
    Connect(String, String),
    #[error("no response head from {0} within {1:?}")]
    Timeout(String, Duration),
    #[error("request to {0} failed: {1}")]
    Failed(String, String),
    #[error("bad target URL {0}")]
    BadTarget(String),
    #[error("TLS setup failed: {0}")]
    Tls(String),
}

/// The pooled client every forwarded request goes through.
#[derive(Clone)]
pub struct Forwarder {
    client: Client<HttpsConnector<HttpConnector>, Body>,
    response_header_timeout: Duration,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder").finish_non_exhaustive()
    }
}

impl Forwarder {
    pub fn new(
        connect_timeout: Duration,
        response_header_timeout: Duration,
    ) -> Result<Self, ForwardError> {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        http.enforce_http(false);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(provider)
            .map_err(|e| ForwardError::Tls(e.to_string()))?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(256)
            .timer(TokioTimer::new())
            .build(https);
        Ok(Self {
            client,
            response_header_timeout,
        })
    }

    /// A GET of `url`: true for a 2xx answer within `timeout` (health probes).
    pub async fn probe(&self, url: &str, timeout: Duration) -> bool {
        let Ok(uri) = url.parse::<Uri>() else {
            return false;
        };
        let Ok(req) = Request::get(uri)
            .header(header::USER_AGENT, "rolegate-health")
            .body(Body::empty())
        else {
            return false;
        };
        let answer = tokio::time::timeout(timeout, async {
            let resp = self.client.request(req).await.ok()?;
            let ok = resp.status().is_success();
            // Drain the body frame by frame (never held whole) so the
            // connection returns to the pool; give up on a huge one.
            let mut body = resp.into_body();
            let mut seen = 0usize;
            while let Some(Ok(frame)) = http_body_util::BodyExt::frame(&mut body).await {
                seen += frame.data_ref().map_or(0, |d| d.len());
                if seen > PROBE_BODY_LIMIT {
                    break;
                }
            }
            Some(ok)
        })
        .await;
        matches!(answer, Ok(Some(true)))
    }

    /// Sends `req` (headers already prepared) to `base` + its path and query,
    /// streaming bodies. Upgrades are bridged when both sides switch.
    pub async fn proxy(
        &self,
        mut req: Request<Body>,
        base: &str,
    ) -> Result<Response<Body>, ForwardError> {
        let path = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let target: Uri = format!("{base}{path}")
            .parse()
            .map_err(|_| ForwardError::BadTarget(base.to_string()))?;
        *req.uri_mut() = target;
        *req.version_mut() = http::Version::HTTP_11;
        let upgrade = is_upgrade_request(req.headers());
        let client_side = upgrade.then(|| hyper::upgrade::on(&mut req));

        let sent =
            tokio::time::timeout(self.response_header_timeout, self.client.request(req)).await;
        let mut resp = match sent {
            Err(_) => {
                return Err(ForwardError::Timeout(
                    base.to_string(),
                    self.response_header_timeout,
                ))
            }
            Ok(Err(e)) if e.is_connect() => {
                return Err(ForwardError::Connect(base.to_string(), error_chain(&e)));
            }
            Ok(Err(e)) => return Err(ForwardError::Failed(base.to_string(), error_chain(&e))),
            Ok(Ok(resp)) => resp,
        };

        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            let Some(client_side) = client_side else {
                return Err(ForwardError::Failed(
                    base.to_string(),
                    "peer switched protocols unasked".into(),
                ));
            };
            let peer_side = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                let (client, peer) = match tokio::try_join!(client_side, peer_side) {
                    Ok(pair) => pair,
                    Err(e) => {
                        tracing::debug!(error = %e, "upgrade failed on one side");
                        return;
                    }
                };
                let _open = crate::telemetry::OpenGuard::upgrade();
                let mut client = TokioIo::new(client);
                let mut peer = TokioIo::new(peer);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut peer).await;
            });
            strip_hop_by_hop(resp.headers_mut(), true);
        } else {
            strip_hop_by_hop(resp.headers_mut(), false);
        }
        Ok(resp.map(Body::new))
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// Prepares a request's headers for the next hop: hop-by-hop removed (upgrade
/// kept when asked), forwarding headers appended.
pub fn prepare_headers(req: &mut Request<Body>, client: Option<SocketAddr>, by: &str) {
    let upgrade = is_upgrade_request(req.headers());
    strip_hop_by_hop(req.headers_mut(), upgrade);
    add_forwarding(req.headers_mut(), client, by, "http");
    // HTTP/1.0 clients may send no Host; the URI authority fills it later.
    if let Some(h) = req.headers().get(header::HOST) {
        if h.is_empty() {
            req.headers_mut().remove(header::HOST);
        }
    }
}
