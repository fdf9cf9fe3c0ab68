//! Forwarding one hop: a pooled HTTP/1.1 client (http and https peers),
//! bodies streamed both ways frame by frame (trailers included), upgrades
//! (WebSocket) bridged by copying bytes both ways. No retries, no queues.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use http::{header, Request, Response, StatusCode, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use super::affine::{Affinity, NotSent, Side};
use super::h2pool::{BoxError, H2Failure, H2Pool};
use super::headers::{
    add_forwarding, is_upgrade_request, strip_hop_by_hop, strip_rolegate,
    strip_untrusted_forwarding, upgrade_allowed, BadUpgrade, UpgradeAsk,
};
use super::idle::{Progress, ProgressIo};
use crate::lease::{LocalWork, TermWatch};

pub(crate) use super::affine::POOL_IDLE_TIMEOUT;

/// Bytes of a health-probe answer read before the connection is dropped.
const PROBE_BODY_LIMIT: usize = 64 * 1024;

/// Why a forwarded request got no response, with the underlying cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForwardError {
    /// No connection could be made (refused, unreachable, connect timeout).
    #[error("cannot connect to {target}: {}", error_chain(source.as_ref()))]
    Connect {
        /// The base URL.
        target: String,
        /// What the client reported.
        #[source]
        source: BoxError,
    },
    /// The response head did not come within `response_header_timeout`.
    #[error("no response head from {target} within {after:?}")]
    Timeout {
        /// The base URL.
        target: String,
        /// The timeout that passed.
        after: Duration,
    },
    /// The exchange broke after connecting.
    #[error("request to {target} failed: {}", error_chain(source.as_ref()))]
    Failed {
        /// The base URL.
        target: String,
        /// What the client reported.
        #[source]
        source: BoxError,
    },
    /// The next hop answered 101 without completing the upgrade the
    /// request asked for (or to a request that asked for none).
    #[error("{target} switched protocols unsafely: {why}")]
    BadUpgrade {
        /// The base URL.
        target: String,
        /// What is wrong with the 101.
        why: BadUpgrade,
    },
    /// Base URL plus path is not a URI.
    #[error("bad target URL {target}")]
    BadTarget {
        /// The base URL.
        target: String,
        /// The parse error.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// The TLS client could not be set up.
    #[error("TLS setup failed: {0}")]
    Tls(#[source] rustls::Error),
    /// The client's request body broke off or was malformed (bad chunk
    /// framing): the client's fault, answered 400.
    #[error("the client's request body was malformed or cut off")]
    ClientBody,
}

/// Default `proxy.idle_timeout`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = super::defaults::IDLE_TIMEOUT;

pub use crate::protocol::HopProtocol;

type PooledClient = Client<HttpsConnector<HttpConnector>, Body>;

/// One TLS setup's clients: pooled HTTP/1.1, its connector (for the
/// connections client connections own), and one multiplexed HTTP/2
/// connection per address.
#[derive(Clone)]
struct Transport {
    client: PooledClient,
    connector: HttpsConnector<HttpConnector>,
    h2: H2Pool,
}

impl Transport {
    /// Both clients over `tls` (its ALPN unset; each client sets its own).
    fn new(tls: rustls::ClientConfig, connect_timeout: Duration) -> Self {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        http.enforce_http(false);
        let h1 = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(http.clone());
        let connector = h1.clone();
        let h2 = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http2()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .pool_max_idle_per_host(256)
            .http1_max_buf_size(super::defaults::UPSTREAM_READ_BUFFER)
            .timer(TokioTimer::new())
            .build(h1);
        Self {
            client,
            connector,
            h2: H2Pool::new(h2, connect_timeout),
        }
    }
}

/// The pooled clients every forwarded request goes through.
#[derive(Clone)]
pub struct Forwarder {
    /// The app, and peers unless `peers` sets TLS of its own.
    app: Transport,
    /// Hops to peer gateways, when `peers` sets a CA or a client certificate.
    peers: Option<Transport>,
    connect_timeout: Duration,
    response_header_timeout: Duration,
    idle_timeout: Duration,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder").finish_non_exhaustive()
    }
}

impl Forwarder {
    /// A client with these timeouts (TLS via rustls and the web PKI roots).
    pub fn new(
        connect_timeout: Duration,
        response_header_timeout: Duration,
    ) -> Result<Self, ForwardError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(ForwardError::Tls)?;
        let tls = hyper_rustls::ConfigBuilderExt::with_webpki_roots(tls).with_no_client_auth();
        Ok(Self {
            app: Transport::new(tls, connect_timeout),
            peers: None,
            connect_timeout,
            response_header_timeout,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        })
    }

    /// Hops to peer gateways use `tls` (the cluster CA, a client
    /// certificate) instead of the web PKI roots; `None` keeps the default.
    /// Requests to the local app are unaffected.
    pub fn with_peer_tls(mut self, tls: Option<rustls::ClientConfig>) -> Self {
        if let Some(tls) = tls {
            self.peers = Some(Transport::new(tls, self.connect_timeout));
        }
        self
    }

    /// How long a hop with a body waits for the holder's `100 Continue`
    /// before sending the body anyway.
    pub(crate) fn admission_patience(&self) -> Duration {
        self.response_header_timeout.min(Duration::from_secs(1))
    }

    /// Sets how long an upgraded tunnel may move no byte either way.
    pub fn with_idle_timeout(mut self, idle: Duration) -> Self {
        self.idle_timeout = idle;
        self
    }

    /// A GET of `url` over `protocol`: true for a 2xx answer within
    /// `timeout` (health probes).
    pub async fn probe(&self, url: &str, protocol: HopProtocol, timeout: Duration) -> bool {
        let Ok(uri) = url.parse::<Uri>() else {
            return false;
        };
        let Ok(req) = Request::get(uri.clone())
            .header(header::USER_AGENT, "rolegate-health")
            .body(Body::empty())
        else {
            return false;
        };
        let answer = tokio::time::timeout(timeout, async {
            let resp = (self.send(&self.app, req, &base_of(&uri)?, protocol).await).ok()?;
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
    /// streaming bodies. The response-head timeout runs from the end of the
    /// request body, so a slow upload is never cut by it. Upgrades are bridged
    /// when both sides switch.
    pub async fn proxy(
        &self,
        req: Request<Body>,
        base: &str,
    ) -> Result<Response<Body>, ForwardError> {
        self.proxy_over(req, base, HopProtocol::Http1).await
    }

    /// One exchange over `protocol`; `req`'s URI is `base` + path.
    async fn send(
        &self,
        transport: &Transport,
        req: Request<Body>,
        base: &str,
        protocol: HopProtocol,
    ) -> Result<Response<Body>, H2Failure> {
        match protocol {
            HopProtocol::Http1 => match transport.client.request(req).await {
                Ok(resp) => Ok(resp.map(Body::new)),
                Err(e) if e.is_connect() => Err(H2Failure::Connect(Box::new(e))),
                Err(e) => Err(H2Failure::Exchange(Box::new(e))),
            },
            HopProtocol::Http2 => transport.h2.send(base, req).await,
        }
    }

    /// [`Forwarder::proxy`] over `protocol`. An upgrade request always goes
    /// over HTTP/1.1, the only version that upgrades a connection.
    pub async fn proxy_over(
        &self,
        req: Request<Body>,
        base: &str,
        protocol: HopProtocol,
    ) -> Result<Response<Body>, ForwardError> {
        self.exchange((&self.app, Side::App), req, base, protocol)
            .await
    }

    /// [`Forwarder::proxy_over`] to a peer gateway: through the peer TLS
    /// clients when `peers` configured them.
    pub async fn proxy_to_peer(
        &self,
        req: Request<Body>,
        base: &str,
        protocol: HopProtocol,
    ) -> Result<Response<Body>, ForwardError> {
        let transport = self.peers.as_ref().unwrap_or(&self.app);
        self.exchange((transport, Side::Peer), req, base, protocol)
            .await
    }

    /// Sends `req` on the client connection's own upstream connection when
    /// it has one to give, else through the pools.
    async fn dispatch(
        &self,
        (transport, side): (&Transport, Side),
        affinity: Option<Affinity>,
        mut req: Request<Body>,
        base: &str,
        protocol: HopProtocol,
    ) -> Result<Response<Body>, H2Failure> {
        if let Some(affinity) = affinity {
            match affinity.send(side, &transport.connector, base, req).await {
                Ok(resp) => return Ok(resp),
                Err(NotSent::Failed(e)) => return Err(e),
                Err(NotSent::UsePool(back)) => req = *back,
            }
            *req.uri_mut() =
                target_uri(base, req.uri()).map_err(|e| H2Failure::Exchange(Box::new(e)))?;
        }
        // Boxed: the pools' futures are large, and every request's future
        // would be as large (and copied) if they were inline.
        Box::pin(self.send(transport, req, base, protocol)).await
    }

    async fn exchange(
        &self,
        (transport, side): (&Transport, Side),
        mut req: Request<Body>,
        base: &str,
        protocol: HopProtocol,
    ) -> Result<Response<Body>, ForwardError> {
        let ask = UpgradeAsk::of(req.headers());
        let upgrade = ask.is_some();
        let tunnel_work = req.extensions_mut().remove::<TunnelWork>();
        let affinity = own_connection(&mut req, upgrade, protocol);
        if affinity.is_none() {
            *req.uri_mut() = target_uri(base, req.uri())?;
        }
        // Only HTTP/1.1 upgrades a connection.
        let protocol = if upgrade {
            HopProtocol::Http1
        } else {
            protocol
        };
        *req.version_mut() = match protocol {
            HopProtocol::Http1 => http::Version::HTTP_11,
            HopProtocol::Http2 => http::Version::HTTP_2,
        };
        let client_side = upgrade.then(|| hyper::upgrade::on(&mut req));
        let watch = Arc::new(BodyWatch::default());
        let req = req.map(|b| Body::new(WatchedBody::new(b, watch.clone())));

        let send = self.dispatch((transport, side), affinity, req, base, protocol);
        let head_deadline = async {
            watch.ended().await;
            tokio::time::sleep(self.response_header_timeout).await;
        };
        let sent = tokio::select! {
            r = send => Some(r),
            _ = head_deadline => None,
        };
        let mut resp = match sent {
            None => {
                return Err(ForwardError::Timeout {
                    target: base.to_string(),
                    after: self.response_header_timeout,
                })
            }
            Some(Err(_)) if watch.failed.load(Ordering::Acquire) => {
                return Err(ForwardError::ClientBody)
            }
            Some(Err(H2Failure::Connect(source))) => {
                return Err(ForwardError::Connect {
                    target: base.to_string(),
                    source,
                });
            }
            Some(Err(H2Failure::Exchange(source))) => {
                return Err(ForwardError::Failed {
                    target: base.to_string(),
                    source,
                })
            }
            Some(Ok(resp)) => resp,
        };

        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            // Dropping `resp` here drops the upgraded upstream connection.
            let checked = UpgradeAsk::check(ask.as_ref(), resp.headers());
            let (Ok(()), Some(client_side)) = (checked, client_side) else {
                return Err(ForwardError::BadUpgrade {
                    target: base.to_string(),
                    why: checked.err().unwrap_or(BadUpgrade::Unasked),
                });
            };
            let peer_side = hyper::upgrade::on(&mut resp);
            // Local work: the tunnel ends with the term it runs under.
            let term = tunnel_work.and_then(|t| t.take()).map(|work| TunnelTerm {
                work,
                websocket: ask.as_ref().is_some_and(UpgradeAsk::is_websocket),
            });
            tokio::spawn(bridge_upgrade(
                client_side,
                peer_side,
                self.idle_timeout,
                term,
            ));
            strip_hop_by_hop(resp.headers_mut(), true);
        } else {
            strip_hop_by_hop(resp.headers_mut(), false);
        }
        // The client talks HTTP/1.1 to this gateway, whatever the app spoke.
        *resp.version_mut() = http::Version::HTTP_11;
        Ok(resp)
    }
}

/// Request extension: the local work a request runs under. An upgrade that
/// succeeds takes it into its tunnel, which then counts as that work and
/// ends with its term; otherwise the gate takes it back for the body.
#[derive(Clone)]
pub(crate) struct TunnelWork {
    work: Arc<std::sync::Mutex<Option<LocalWork>>>,
    watch: TermWatch,
}

impl TunnelWork {
    pub(crate) fn new(work: LocalWork) -> Self {
        let watch = work.watch().clone();
        Self {
            work: Arc::new(std::sync::Mutex::new(Some(work))),
            watch,
        }
    }

    /// The work, unless a tunnel took it.
    pub(crate) fn take(&self) -> Option<LocalWork> {
        self.work.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Why the term ended (a metric label).
    /// The `role` label of the metrics of the work's role.
    pub(crate) fn metric_label(&self) -> String {
        self.watch.metric_label()
    }

    pub(crate) fn reason(&self) -> &'static str {
        self.watch.reason().map_or("lost", |r| r.as_str())
    }
}

/// The term a local tunnel runs under.
struct TunnelTerm {
    work: LocalWork,
    /// A WebSocket gets a close frame (1012) when the term ends.
    websocket: bool,
}

/// Copies bytes both ways once client and peer have switched protocols,
/// until either side closes or nothing moves for `idle`; a local tunnel
/// also ends with its term.
async fn bridge_upgrade(
    client_side: hyper::upgrade::OnUpgrade,
    peer_side: hyper::upgrade::OnUpgrade,
    idle: Duration,
    term: Option<TunnelTerm>,
) {
    let (client, peer) = match tokio::try_join!(client_side, peer_side) {
        Ok(pair) => pair,
        Err(e) => {
            tracing::debug!(error = %e, "upgrade failed on one side");
            return;
        }
    };
    let _open = crate::telemetry::OpenGuard::upgrade();
    let progress = Progress::new();
    progress.touch();
    let mut client = ProgressIo::new(TokioIo::new(client), progress.clone());
    let mut peer = ProgressIo::new(TokioIo::new(peer), progress.clone());
    match term {
        None => {
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut peer) => {}
                _ = progress.idle_for(idle) => {
                    tracing::debug!(?idle, "upgraded tunnel idle; closing");
                }
            }
        }
        Some(term) => {
            super::tunnel::bridge_until_over(
                client,
                peer,
                &progress,
                idle,
                term.work,
                term.websocket,
            )
            .await
        }
    }
}

/// What the forwarding path learns from the client's request body.
#[derive(Debug, Default)]
struct BodyWatch {
    ended: AtomicBool,
    failed: AtomicBool,
    changed: tokio::sync::Notify,
}

impl BodyWatch {
    fn end(&self, failed: bool) {
        if failed {
            self.failed.store(true, Ordering::Release);
        }
        if !self.ended.swap(true, Ordering::AcqRel) {
            self.changed.notify_waiters();
        }
    }

    /// Resolves once the request body has been sent whole (or failed).
    async fn ended(&self) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.ended.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

/// The client's request body, reporting its end and any error to a [`BodyWatch`].
struct WatchedBody {
    inner: Body,
    watch: Arc<BodyWatch>,
}

impl WatchedBody {
    fn new(inner: Body, watch: Arc<BodyWatch>) -> Self {
        if http_body::Body::is_end_stream(&inner) {
            watch.end(false);
        }
        Self { inner, watch }
    }
}

impl Drop for WatchedBody {
    // A body dropped unread (a GET whose body hyper discards) has ended as far
    // as the response-head timeout is concerned.
    fn drop(&mut self) {
        self.watch.end(false);
    }
}

impl http_body::Body for WatchedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let mut polled = Pin::new(&mut self.inner).poll_frame(cx);
        // Request trailers are headers too: the same fields are removed
        // (forwarding fields, rolegate fields and `_` look-alikes, hop-by-hop).
        if let Poll::Ready(Some(Ok(frame))) = &mut polled {
            if let Some(trailers) = frame.trailers_mut() {
                strip_untrusted_forwarding(trailers);
                strip_hop_by_hop(trailers, false);
            }
        }
        match &polled {
            Poll::Ready(None) => self.watch.end(false),
            Poll::Ready(Some(Err(_))) => self.watch.end(true),
            Poll::Ready(Some(Ok(_))) if http_body::Body::is_end_stream(&self.inner) => {
                self.watch.end(false)
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The client connection's own upstream connections, for a plain HTTP/1.1
/// exchange; everything else goes through the pools.
fn own_connection(
    req: &mut Request<Body>,
    upgrade: bool,
    protocol: HopProtocol,
) -> Option<Affinity> {
    let affinity = req.extensions_mut().remove::<Affinity>()?;
    (!upgrade && protocol == HopProtocol::Http1).then_some(affinity)
}

/// `base` + the path and query of `uri`.
fn target_uri(base: &str, uri: &Uri) -> Result<Uri, ForwardError> {
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    format!("{base}{path}")
        .parse()
        .map_err(|source| ForwardError::BadTarget {
            target: base.to_string(),
            source,
        })
}

/// `scheme://authority` of an absolute URI.
fn base_of(uri: &Uri) -> Option<String> {
    Some(format!("{}://{}", uri.scheme_str()?, uri.authority()?))
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

/// Removes what the client may not send on: client-sent rolegate fields,
/// names with `_` and URL-rewrite fields, the forwarding fields unless
/// `trusted`, hop-by-hop fields (an allowed upgrade kept). Runs **before**
/// the gate decides, so the decision reads the headers the app will see (a
/// key header named in `Connection` is gone for both), and again when the
/// request is prepared (it is idempotent).
pub fn sanitize_headers(headers: &mut http::HeaderMap, trusted: bool, upgrades: &[String]) {
    if trusted {
        strip_rolegate(headers);
    } else {
        strip_untrusted_forwarding(headers);
    }
    let upgrade = is_upgrade_request(headers) && upgrade_allowed(headers, upgrades);
    strip_hop_by_hop(headers, upgrade);
}

#[cfg(any(test, feature = "gateway", fuzzing))]
/// Who a request is being prepared for, and what the gateway knows of it.
#[derive(Debug, Clone, Copy)]
pub struct HopContext<'a> {
    /// The peer that sent the request to this gateway.
    pub client: Option<SocketAddr>,
    /// This instance's id (`Forwarded: by=`, the loop guard in `Via`).
    pub by: &'a str,
    /// The peer's `X-Forwarded-*`/`Forwarded` are kept (trusted proxy, or a
    /// hop verified with the cluster secret).
    pub trusted: bool,
    /// `proxy.upgrades`: protocols `Upgrade` may ask for.
    pub upgrades: &'a [String],
    /// The next hop is a peer gateway (not the local app).
    pub to_peer: bool,
}

/// Request extension: the request came to this gateway over TLS, so the
/// forwarding fields say `proto=https`. Set by the listener only.
#[derive(Debug, Clone, Copy)]
pub struct ArrivedOverTls;

#[cfg(any(test, feature = "gateway", fuzzing))]
/// Prepares a request's headers for the next hop: client-sent rolegate
/// fields and look-alikes removed, forwarding fields replaced unless trusted,
/// hop-by-hop removed (an allowed upgrade kept), forwarding headers appended.
pub fn prepare_headers(req: &mut Request<Body>, hop: HopContext<'_>) {
    sanitize_headers(req.headers_mut(), hop.trusted, hop.upgrades);
    add_forwarding_fields(req, hop.client, hop.by, hop.to_peer);
}

/// The second half of [`prepare_headers`], for a request whose fields were
/// already sanitized (a gated request: the gate sanitizes before it
/// settles, and a held request gets its sanitized fields back for each
/// attempt). The gateway's gate judged the forwarding fields as a hop does;
/// a layer's kept them, so its hop to a peer judges them again first.
pub fn add_forwarding_fields(
    req: &mut Request<Body>,
    client: Option<SocketAddr>,
    by: &str,
    to_peer: bool,
) {
    let proto = if req.extensions().get::<ArrivedOverTls>().is_some() {
        "https"
    } else {
        "http"
    };
    let headers = req.headers_mut();
    add_forwarding(headers, client, by, proto, to_peer);
    // HTTP/1.0 clients may send no Host; the URI authority fills it later.
    if let Some(h) = headers.get(header::HOST) {
        if h.is_empty() {
            headers.remove(header::HOST);
        }
    }
}
