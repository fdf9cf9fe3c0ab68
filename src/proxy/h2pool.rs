//! HTTP/2 hops: one multiplexed connection per address, opened on first use
//! and replaced once it closes; another is opened when every open one
//! carries [`STREAMS_PER_CONNECTION`] streams. The request's own authority (the client's
//! `Host`) travels as `:authority`, while the connection goes to the
//! address, so the app sees the same authority over HTTP/2 as over HTTP/1.1.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::{header, Request, Response, Uri};
use hyper::client::conn::http2::SendRequest;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tower::ServiceExt;

use crate::body::Holding;

/// An HTTP/2 connection is pinged this often, so a peer that vanished is
/// noticed before a request waits on it.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// A ping unanswered for this long closes the connection.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest DATA frame the other side may send: large bodies cross in a few
/// frames rather than one per 16 KiB (the protocol's default).
pub(crate) const MAX_FRAME_SIZE: u32 = 256 * 1024;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an exchange failed, over either protocol.
#[derive(Debug)]
pub(crate) enum H2Failure {
    /// No connection (TCP, TLS or the HTTP/2 handshake failed or timed out).
    Connect(BoxError),
    /// The connection was up; the exchange broke.
    Exchange(BoxError),
}

/// Streams one hop connection carries at once before another is opened (the
/// default `proxy.http2.max_concurrent_streams` of a peer gateway). Long
/// streams (SSE, gRPC streams) so never queue behind a full connection.
pub(crate) const STREAMS_PER_CONNECTION: usize = 100;

/// One connection and the streams open on it.
struct Conn {
    sender: SendRequest<Body>,
    streams: Arc<AtomicUsize>,
}

/// The connections, keyed by base URL.
#[derive(Clone)]
pub(crate) struct H2Pool {
    connector: HttpsConnector<HttpConnector>,
    connect_timeout: Duration,
    open: Arc<Mutex<HashMap<String, Vec<Conn>>>>,
    /// One connect at a time per address: requests that find no free
    /// stream wait for it rather than each opening a connection.
    connecting: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    /// When a connect to an address last failed: requests that waited
    /// behind it fail at once for `connect_timeout` rather than each trying
    /// in turn (a dead peer must give 503s in one connect timeout, not in N).
    failed: Arc<Mutex<HashMap<String, std::time::Instant>>>,
}

impl H2Pool {
    pub(crate) fn new(connector: HttpsConnector<HttpConnector>, connect_timeout: Duration) -> Self {
        Self {
            connector,
            connect_timeout,
            open: Arc::default(),
            connecting: Arc::default(),
            failed: Arc::default(),
        }
    }

    /// Sends `req`, whose URI is `base` + path and query, on the connection
    /// to `base`. `:authority` is the request's `Host` when it has a valid
    /// one (the field itself is dropped: HTTP/2 carries it as `:authority`).
    pub(crate) async fn send(
        &self,
        base: &str,
        mut req: Request<Body>,
    ) -> Result<Response<Body>, H2Failure> {
        let authority = req
            .headers_mut()
            .remove(header::HOST)
            .and_then(|h| http::uri::Authority::try_from(h.as_bytes()).ok());
        if let Some(authority) = authority {
            let mut parts = req.uri().clone().into_parts();
            parts.authority = Some(authority);
            if let Ok(uri) = Uri::from_parts(parts) {
                *req.uri_mut() = uri;
            }
        }
        *req.version_mut() = http::Version::HTTP_2;
        let (mut sender, stream) = self.sender(base).await?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| H2Failure::Exchange(Box::new(e)))?;
        // The stream stays counted until its response body is done or dropped.
        Ok(resp.map(|body| Body::new(Holding::new(body, stream))))
    }

    /// A connection to `base` with a free stream (one is opened if none
    /// has), and the stream counted on it.
    async fn sender(&self, base: &str) -> Result<(SendRequest<Body>, OpenStream), H2Failure> {
        if let Some(found) = self.pick(base) {
            return Ok(found);
        }
        let gate = {
            let mut c = self.connecting.lock().unwrap_or_else(|p| p.into_inner());
            c.entry(base.to_string()).or_default().clone()
        };
        let _connecting = gate.lock().await;
        if let Some(found) = self.pick(base) {
            return Ok(found);
        }
        if let Some(at) = self.lock_failed().get(base) {
            if at.elapsed() < self.connect_timeout {
                return Err(H2Failure::Connect(
                    "the last connect failed moments ago".into(),
                ));
            }
        }
        let attempt = tokio::time::timeout(self.connect_timeout * 2, self.connect(base)).await;
        let fresh = match attempt {
            Ok(Ok(sender)) => {
                self.lock_failed().remove(base);
                sender
            }
            failed => {
                self.lock_failed()
                    .insert(base.to_string(), std::time::Instant::now());
                return Err(match failed {
                    Ok(Err(e)) => e,
                    _ => H2Failure::Connect("connect timed out".into()),
                });
            }
        };
        let streams = Arc::new(AtomicUsize::new(1));
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.entry(base.to_string()).or_default().push(Conn {
            sender: fresh.clone(),
            streams: streams.clone(),
        });
        Ok((fresh, OpenStream(streams)))
    }

    fn lock_failed(&self) -> std::sync::MutexGuard<'_, HashMap<String, std::time::Instant>> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn pick(&self, base: &str) -> Option<(SendRequest<Body>, OpenStream)> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let conns = open.get_mut(base)?;
        conns.retain(|c| !c.sender.is_closed());
        let c = conns
            .iter()
            .find(|c| c.streams.load(Ordering::Acquire) < STREAMS_PER_CONNECTION)?;
        c.streams.fetch_add(1, Ordering::AcqRel);
        Some((c.sender.clone(), OpenStream(c.streams.clone())))
    }

    async fn connect(&self, base: &str) -> Result<SendRequest<Body>, H2Failure> {
        let uri: Uri = base.parse().map_err(|e| H2Failure::Connect(Box::new(e)))?;
        let io = self
            .connector
            .clone()
            .oneshot(uri)
            .await
            .map_err(H2Failure::Connect)?;
        let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            .max_frame_size(MAX_FRAME_SIZE)
            .handshake(io)
            .await
            .map_err(|e| H2Failure::Connect(Box::new(e)))?;
        let base = base.to_string();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%base, error = %e, "HTTP/2 hop connection ended");
            }
        });
        Ok(sender)
    }
}

/// One counted stream; dropping it frees the slot.
struct OpenStream(Arc<AtomicUsize>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
