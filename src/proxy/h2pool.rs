//! HTTP/2 hops: one multiplexed connection per address, opened on first use
//! and replaced once it closes. The request's own authority (the client's
//! `Host`) travels as `:authority`, while the connection goes to the
//! address, so the app sees the same authority over HTTP/2 as over HTTP/1.1.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::{header, Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tower::ServiceExt;

/// An HTTP/2 connection is pinged this often, so a peer that vanished is
/// noticed before a request waits on it.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// A ping unanswered for this long closes the connection.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an exchange failed, over either protocol.
#[derive(Debug)]
pub(crate) enum H2Failure {
    /// No connection (TCP, TLS or the HTTP/2 handshake failed or timed out).
    Connect(BoxError),
    /// The connection was up; the exchange broke.
    Exchange(BoxError),
}

/// The connections, keyed by base URL.
#[derive(Clone)]
pub(crate) struct H2Pool {
    connector: HttpsConnector<HttpConnector>,
    connect_timeout: Duration,
    open: Arc<Mutex<HashMap<String, SendRequest<Body>>>>,
}

impl H2Pool {
    pub(crate) fn new(connector: HttpsConnector<HttpConnector>, connect_timeout: Duration) -> Self {
        Self {
            connector,
            connect_timeout,
            open: Arc::default(),
        }
    }

    /// Sends `req`, whose URI is `base` + path and query, on the connection
    /// to `base`. `:authority` is the request's `Host` when it has a valid
    /// one (the field itself is dropped: HTTP/2 carries it as `:authority`).
    pub(crate) async fn send(
        &self,
        base: &str,
        mut req: Request<Body>,
    ) -> Result<Response<Incoming>, H2Failure> {
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
        let mut sender = self.sender(base).await?;
        sender
            .send_request(req)
            .await
            .map_err(|e| H2Failure::Exchange(Box::new(e)))
    }

    /// The open connection to `base`, or a new one.
    async fn sender(&self, base: &str) -> Result<SendRequest<Body>, H2Failure> {
        if let Some(s) = self.lookup(base) {
            return Ok(s);
        }
        let fresh = tokio::time::timeout(self.connect_timeout * 2, self.connect(base))
            .await
            .map_err(|_| H2Failure::Connect("connect timed out".into()))??;
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        // Two requests may have connected at once: keep the first.
        match open.get(base) {
            Some(s) if !s.is_closed() => Ok(s.clone()),
            _ => {
                open.insert(base.to_string(), fresh.clone());
                Ok(fresh)
            }
        }
    }

    fn lookup(&self, base: &str) -> Option<SendRequest<Body>> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        match open.get(base) {
            Some(s) if !s.is_closed() => Some(s.clone()),
            Some(_) => {
                open.remove(base);
                None
            }
            None => None,
        }
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
