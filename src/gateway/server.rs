//! The public listener: accept with a connection cap and backoff, serve
//! each connection with head limits and an idle timeout, and track open
//! connections so a stop can drain them.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::handler::GatewayState;
use super::tls::ListenerTls;
use super::unread::UnreadBudget;
use crate::body::Holding;
use crate::config::Http2Config;
use crate::listener::{
    next_connection, AcceptBackoff, HEADER_READ_TIMEOUT, MAX_HEADERS, MAX_HEAD_BYTES,
};
use crate::proxy::idle::{Progress, ProgressIo};
use crate::proxy::stack::ConnectionFacts;
use crate::proxy::Affinity;
use crate::shutdown::{self, Shutdown, ShutdownTrigger};

/// Open connections, so shutdown can wait for them to finish.
#[derive(Clone)]
pub(crate) struct ConnectionTracker {
    active: Arc<AtomicUsize>,
    idle: Arc<Notify>,
    stop: Arc<ShutdownTrigger>,
}

impl Default for ConnectionTracker {
    fn default() -> Self {
        Self {
            active: Arc::new(AtomicUsize::new(0)),
            idle: Arc::new(Notify::new()),
            stop: Arc::new(shutdown::channel().0),
        }
    }
}

impl ConnectionTracker {
    /// Asks every connection to finish its in-flight request and close.
    pub(crate) fn begin_shutdown(&self) {
        self.stop.fire();
    }

    /// Counts a connection open until the guard drops.
    fn enter(&self) -> OpenConnection {
        self.active.fetch_add(1, Ordering::AcqRel);
        OpenConnection(self.clone())
    }

    /// Waits until no connection is open, or `limit` passes. True if all closed.
    pub(crate) async fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.idle.notified();
            if self.active.load(Ordering::Acquire) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.active.load(Ordering::Acquire) == 0;
            }
        }
    }

    pub(crate) fn open(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }
}

/// One open connection; dropping it counts the connection closed.
struct OpenConnection(ConnectionTracker);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Connection limits of the public listener.
#[derive(Clone)]
pub(crate) struct ServeLimits {
    /// Connections served at once; beyond it new ones wait in the backlog.
    pub(crate) max_connections: usize,
    /// Response bytes the process may have handed to clients that have not
    /// asked for more (shared by every worker).
    pub(crate) unread: Arc<UnreadBudget>,
    /// No byte either way for this long closes the connection.
    pub(crate) idle_timeout: Duration,
    /// HTTP/2 beside HTTP/1.1.
    pub(crate) http2: Http2Config,
}

/// Accepts connections until the tracker's shutdown begins.
pub(crate) async fn serve(
    listener: TcpListener,
    state: Arc<GatewayState>,
    tracker: ConnectionTracker,
    limits: ServeLimits,
    tls: Option<Arc<ListenerTls>>,
) {
    let mut stop = tracker.stop.subscribe();
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    // Requests in flight, over every connection: an HTTP/2 connection carries
    // many, each with its own connection upstream, so the descriptor budget
    // behind `max_connections` (one client and one upstream descriptor each)
    // needs them counted apart from connections.
    let exchanges = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    // Upstream connections kept by client connections (`proxy::affine`),
    // the third descriptor per connection of the open-files budget.
    let kept = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let mut accept_errors = AcceptBackoff::default();
    loop {
        let next = next_connection(&listener, &slots, &mut accept_errors, &mut stop);
        let Some((stream, client, slot)) = next.await else {
            return;
        };
        let _ = stream.set_nodelay(true);
        let open = tracker.enter();
        let (state, tls, mut conn_stop) = (state.clone(), tls.clone(), stop.clone());
        let exchanges = (exchanges.clone(), kept.clone());
        // One task per connection; a plain connection's task is sized for
        // plain serving only (the TLS handshake would more than double it).
        match tls {
            None => {
                let facts = ConnectionFacts::plain(client);
                let serving = (state, exchanges, limits.clone());
                if let Some(fast) = serving.0.fast().cloned() {
                    tokio::spawn(async move {
                        let _held = (slot, open);
                        let shared = (serving.2.unread.clone(), serving.1 .1.clone());
                        let fast = super::h1::serve(stream, facts, &fast, shared, &mut conn_stop);
                        if let Some(declined) = fast.await {
                            let mut serving = serving;
                            if declined.served() {
                                // Past its first request, a connection is
                                // HTTP/1.1 for good: an HTTP/2 preface now is
                                // bytes smuggled behind an HTTP/1.1 request,
                                // refused as such, never a new protocol.
                                serving.2.http2.enabled = false;
                            }
                            // Boxed: a connection on the fast path does not
                            // carry the full path's (larger) state.
                            let full = serve_connection(declined, facts, serving, conn_stop);
                            Box::pin(full).await
                        }
                    });
                    continue;
                }
                let fut = async move {
                    let _held = (slot, open);
                    serve_connection(stream, facts, serving, conn_stop).await
                };
                tokio::spawn(fut);
            }
            Some(tls) => {
                let limits = limits.clone();
                tokio::spawn(async move {
                    let _held = (slot, open);
                    // The handshake runs here, in the connection's task, never in the accept loop.
                    let handshake = tls.handshake(stream, client, &mut conn_stop).await;
                    if let Some((stream, facts)) = handshake {
                        let serving = (state, exchanges, limits);
                        serve_connection(stream, facts, serving, conn_stop).await
                    }
                });
            }
        }
    }
}

/// Runs a served connection, and the upstream connections it owns, until it
/// ends, idles out, or shutdown drains it, in one task (see
/// `Drive::around`). (A macro: hyper's two connection types share no trait for
/// `graceful_shutdown`.)
macro_rules! drive {
    ($conn:expr, $upstream:expr, $progress:expr, $idle:expr, $stop:expr, $first:expr, $evict:expr) => {{
        let conn = $conn;
        tokio::pin!(conn);
        let upstream = &mut $upstream;
        tokio::select! {
            r = upstream.around(conn.as_mut()) => r.map_err(|e| e.to_string()),
            _ = $evict.notified() => {
                tracing::debug!("the unread-bytes budget is full and this client waited longest; closing");
                Ok(())
            }
            _ = no_request_within(&$first, HEADER_READ_TIMEOUT) => {
                tracing::debug!("no request head within the header read timeout; closing");
                Ok(())
            }
            _ = $progress.idle_for($idle) => {
                tracing::debug!(idle = ?$idle, "connection idle; closing");
                Ok(())
            }
            _ = $stop.recv() => {
                conn.as_mut().graceful_shutdown();
                tokio::select! {
                    r = upstream.around(conn.as_mut()) => r.map_err(|e| e.to_string()),
                    _ = $progress.idle_for($idle) => Ok(()),
                }
            }
        }
    }};
}

/// What serving a connection shares with the others: the request path,
/// the semaphores of in-flight exchanges and of kept upstream connections,
/// and the limits.
pub(crate) type Serving = (
    Arc<GatewayState>,
    (Arc<Semaphore>, Arc<Semaphore>),
    ServeLimits,
);

/// Serves one connection until it closes, idles out, or shutdown drains it.
pub(crate) async fn serve_connection<S>(
    stream: S,
    conn: ConnectionFacts,
    (state, (exchanges, kept), limits): Serving,
    mut stop: Shutdown,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let client = conn.client;
    // Until a first request head arrives, the connection is held to the
    // header read timeout, whatever the protocol: hyper times HTTP/1.1 heads
    // but not the wait for the first bytes, nor an HTTP/2 client that sends
    // its preface and then nothing.
    let first = Arc::new(AtomicBool::new(false));
    let seen = first.clone();
    // The upstream connections this client connection owns, driven here.
    let (affinity, mut upstream) = Affinity::new(kept);
    // Told when this connection holds the oldest unread bytes of a full budget.
    let evict = Arc::new(Notify::new());
    let (unread, evicts) = (limits.unread.clone(), evict.clone());
    let service = hyper::service::service_fn(move |mut req: http::Request<_>| {
        seen.store(true, Ordering::Release);
        req.extensions_mut().insert(affinity.clone());
        let (state, exchanges) = (state.clone(), exchanges.clone());
        let (unread, evict) = (unread.clone(), evicts.clone());
        async move {
            // Never closed, so acquiring only waits.
            let exchange = exchanges.acquire_owned().await.ok();
            // Boxed for the request's lifetime only: hyper keeps the slot
            // for a request's future as long as the connection, and this
            // one is 4.4 KB (the forwarding futures in it).
            let resp = Box::pin(state.handle(req, conn)).await;
            let resp = resp.map(|body| unread.meter(body, &evict));
            Ok::<_, Infallible>(hold_until_streamed(resp, exchange))
        }
    });
    let progress = Progress::new();
    progress.touch();
    let io = ProgressIo::new(stream, progress.clone());
    let io = TokioIo::new(io);
    let result = if limits.http2.enabled {
        let builder = connection_builder(limits.http2);
        let conn = builder.serve_connection_with_upgrades(io, service);
        drive!(
            conn,
            upstream,
            progress,
            limits.idle_timeout,
            stop,
            first,
            evict
        )
    } else {
        // auto::Builder::http1_only is ignored once upgrades are served.
        let conn = http1_builder()
            .serve_connection(io, service)
            .with_upgrades();
        drive!(
            conn,
            upstream,
            progress,
            limits.idle_timeout,
            stop,
            first,
            evict
        )
    };
    if let Err(e) = result {
        tracing::debug!(%client, error = %e, "connection ended with an error");
    }
}

/// Resolves once `limit` has passed with no request seen; never after one.
async fn no_request_within(first: &AtomicBool, limit: Duration) {
    tokio::time::sleep(limit).await;
    if first.load(Ordering::Acquire) {
        std::future::pending::<()>().await;
    }
}

fn http1_builder() -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS);
    builder
}

/// Keeps `permit` until `resp`'s body has streamed (at once if it has none).
fn hold_until_streamed(
    resp: http::Response<axum::body::Body>,
    permit: Option<OwnedSemaphorePermit>,
) -> http::Response<axum::body::Body> {
    use http_body::Body as _;
    match permit {
        Some(p) if !resp.body().is_end_stream() => {
            resp.map(|body| axum::body::Body::new(Holding::new(body, p)))
        }
        _ => resp,
    }
}

/// Fewest streams a client may reset before the server has answered them,
/// per connection, before it is sent GOAWAY (the HTTP/2 rapid-reset attack,
/// CVE-2023-44487: each reset would otherwise cost the server a request).
pub(crate) const H2_MAX_PENDING_RESETS: usize = 20;
/// Streams this server may reset for protocol errors on one connection
/// before it sends GOAWAY (a client that keeps provoking errors).
pub(crate) const H2_MAX_LOCAL_ERROR_RESETS: usize = 256;

/// HTTP/1.1 with head limits and, unless turned off, HTTP/2 (h2c with prior
/// knowledge, or h2 chosen by ALPN over TLS) with stream and header limits.
fn connection_builder(http2: Http2Config) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(http2.max_concurrent_streams)
        .max_header_list_size(MAX_HEAD_BYTES as u32)
        .max_pending_accept_reset_streams(H2_MAX_PENDING_RESETS)
        .max_local_error_reset_streams(H2_MAX_LOCAL_ERROR_RESETS)
        .max_frame_size(crate::proxy::h2pool::MAX_FRAME_SIZE)
        .max_send_buf_size(crate::proxy::defaults::H2_STREAM_SEND_BUFFER);
    builder
}
