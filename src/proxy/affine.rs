//! Connection-affine HTTP/1.1 upstream connections: a client connection owns
//! the upstream connection its requests go out on (one to the app, one to a
//! peer gateway), so a keep-alive client's requests skip the shared pool:
//! no checkout, no pool key hashed, no pool lock. A request that finds its
//! connection busy (another HTTP/2 stream is on it, or the last response is
//! still streaming), kept for another address, or closed goes through the
//! worker's pool instead, and so does a request on a connection idle longer
//! than the pool's idle timeout (the app may be closing it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use axum::body::Body;
use http::{header, Request, Response, Uri};
use hyper::client::conn::http1::SendRequest;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use tower::ServiceExt;

use super::h2pool::H2Failure;

/// Idle pooled connections are closed after this, below the 5 s keep-alive
/// common in app servers, so a reused connection is rarely one the peer
/// closes; a client connection's own upstream connection idle this long is
/// replaced rather than reused.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// Which upstream a kept connection goes to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Side {
    /// The local app.
    App = 0,
    /// A peer gateway (the holder).
    Peer = 1,
}

/// Request extension set by the listener: the upstream connections its
/// client connection owns. Requests without it use the pool.
#[derive(Clone)]
pub(crate) struct Affinity {
    slots: Arc<Mutex<[Slot; 2]>>,
    /// Kept connections the worker may hold open at once; with none left,
    /// requests use the pool (the open-files budget counts them).
    kept: Arc<Semaphore>,
}

impl std::fmt::Debug for Affinity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Affinity").finish_non_exhaustive()
    }
}

#[derive(Default)]
enum Slot {
    #[default]
    Empty,
    /// A request is on the connection (its future owns the sender).
    InUse,
    Idle(Kept),
}

struct Kept {
    base: Box<str>,
    sender: SendRequest<Body>,
    /// When its last response head came.
    since: Instant,
    /// Which connection (its driver looks for it to close it when idle).
    id: u64,
}

/// Connection ids, so a driver finds its own connection in a slot.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A kept connection's sender and id.
type Owned = (SendRequest<Body>, u64);

/// Why [`Affinity::send`] did not answer.
pub(crate) enum NotSent {
    /// The request never left: send it through the pool (rare; boxed).
    UsePool(Box<Request<Body>>),
    /// The exchange failed.
    Failed(H2Failure),
}

/// A slot taken for one exchange; emptied when dropped unkept (the
/// exchange failed or was cancelled, which closes the connection).
struct Lease<'a> {
    owner: &'a Affinity,
    side: Side,
    kept: bool,
}

impl Lease<'_> {
    fn keep(mut self, base: &str, (sender, id): (SendRequest<Body>, u64)) {
        self.kept = true;
        self.owner.slots()[self.side as usize] = Slot::Idle(Kept {
            base: base.into(),
            sender,
            since: Instant::now(),
            id,
        });
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.owner.slots()[self.side as usize] = Slot::Empty;
        }
    }
}

impl Affinity {
    /// A client connection's slots, drawing kept connections from `kept`
    /// (one per worker).
    pub(crate) fn new(kept: Arc<Semaphore>) -> Self {
        Self {
            slots: Arc::default(),
            kept,
        }
    }

    fn slots(&self) -> MutexGuard<'_, [Slot; 2]> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The kept connection to `base` if it is ready now; `Ok(None)` when
    /// there is none to reuse and one should be opened; `Err` when the slot
    /// is busy or kept for another live address (use the pool).
    fn begin(&self, side: Side, base: &str) -> Result<(Lease<'_>, Option<Owned>), ()> {
        let mut slots = self.slots();
        let slot = &mut slots[side as usize];
        let reuse = match std::mem::take(slot) {
            Slot::InUse => {
                *slot = Slot::InUse;
                return Err(());
            }
            Slot::Empty => None,
            Slot::Idle(k) if k.sender.is_closed() => None,
            // Still streaming a response (another HTTP/2 stream's), or kept
            // for another address.
            Slot::Idle(k) if *k.base != *base || !k.sender.is_ready() => {
                *slot = Slot::Idle(k);
                return Err(());
            }
            Slot::Idle(k) if k.since.elapsed() >= POOL_IDLE_TIMEOUT => None,
            Slot::Idle(k) => Some((k.sender, k.id)),
        };
        *slot = Slot::InUse;
        let lease = Lease {
            owner: self,
            side,
            kept: false,
        };
        Ok((lease, reuse))
    }

    /// Sends `req` (path and query in its URI, headers prepared) to `base`
    /// on this client connection's own upstream connection, opening it with
    /// `connector` if there is none.
    pub(crate) async fn send(
        &self,
        side: Side,
        connector: &HttpsConnector<HttpConnector>,
        base: &str,
        mut req: Request<Body>,
    ) -> Result<Response<Body>, NotSent> {
        let Ok((lease, reuse)) = self.begin(side, base) else {
            return Err(NotSent::UsePool(Box::new(req)));
        };
        let (mut sender, id) = match reuse {
            Some(owned) => owned,
            None => {
                let Ok(permit) = self.kept.clone().try_acquire_owned() else {
                    // The worker keeps as many as it may: the pool it is.
                    return Err(NotSent::UsePool(Box::new(req)));
                };
                // Boxed: the connect future is large and rarely run; unboxed
                // it would be copied with every request's future.
                Box::pin(self.connect(side, connector, base, permit))
                    .await
                    .map_err(NotSent::Failed)?
            }
        };
        // The pool takes the client's URI, should the request come back.
        let client_uri = req.uri().clone();
        if !to_origin_form(&mut req, base) {
            // The pool answers what cannot be addressed (`BadTarget`); this
            // connection is let go (the lease empties its slot).
            return Err(NotSent::UsePool(Box::new(req)));
        }
        match sender.try_send_request(req).await {
            Ok(resp) => {
                lease.keep(base, (sender, id));
                Ok(resp.map(Body::new))
            }
            Err(mut e) => match e.take_message() {
                Some(mut req) => {
                    *req.uri_mut() = client_uri;
                    Err(NotSent::UsePool(Box::new(req)))
                }
                None => Err(NotSent::Failed(H2Failure::Exchange(Box::new(
                    e.into_error(),
                )))),
            },
        }
    }
    /// Opens an HTTP/1.1 connection to `base` (TCP, TLS for https) and
    /// spawns its driver. The connection lives until its sender is dropped
    /// (the client connection closed, or it was replaced) or either side
    /// closes it; idle in its slot for [`POOL_IDLE_TIMEOUT`], it is dropped
    /// from there, as the pool would close it.
    async fn connect(
        &self,
        side: Side,
        connector: &HttpsConnector<HttpConnector>,
        base: &str,
        permit: OwnedSemaphorePermit,
    ) -> Result<Owned, H2Failure> {
        let uri: Uri = base.parse().map_err(|e| H2Failure::Connect(Box::new(e)))?;
        let io = connector
            .clone()
            .oneshot(uri)
            .await
            .map_err(H2Failure::Connect)?;
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .handshake(io)
            .await
            .map_err(|e| H2Failure::Connect(Box::new(e)))?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let owner = Arc::downgrade(&self.slots);
        tokio::spawn(async move {
            // Counted against the worker's kept connections while open.
            let _permit = permit;
            tokio::pin!(conn);
            let mut next = POOL_IDLE_TIMEOUT;
            loop {
                tokio::select! {
                    ended = &mut conn => {
                        if let Err(e) = ended {
                            tracing::debug!(error = %e, "upstream connection ended");
                        }
                        return;
                    }
                    _ = tokio::time::sleep(next) => next = drop_if_idle(&owner, side, id),
                }
            }
        });
        Ok((sender, id))
    }
}

/// Empties `side`'s slot if it still keeps connection `id`, ready and idle
/// for [`POOL_IDLE_TIMEOUT`]: the dropped sender lets the connection close.
/// Returns when to look again: when it would have been idle that long.
fn drop_if_idle(owner: &Weak<Mutex<[Slot; 2]>>, side: Side, id: u64) -> Duration {
    let Some(slots) = owner.upgrade() else {
        return POOL_IDLE_TIMEOUT;
    };
    let mut slots = slots.lock().unwrap_or_else(|p| p.into_inner());
    let slot = &mut slots[side as usize];
    if let Slot::Idle(k) = slot {
        let idle = k.since.elapsed();
        if k.id == id && k.sender.is_ready() {
            if idle >= POOL_IDLE_TIMEOUT {
                *slot = Slot::Empty;
            } else {
                return POOL_IDLE_TIMEOUT - idle;
            }
        }
    }
    POOL_IDLE_TIMEOUT
}

/// Points `req` (its URI the client's path and query) at `base` for an
/// HTTP/1.1 connection already open to it: origin form, with the path of
/// `base` in front (`http://app:8080/prefix` + `/a?b` is `/prefix/a?b`, as
/// through the pool), and `Host` from `base` when the client sent none (an
/// HTTP/1.0 client may not). False, and `req` untouched, when no such URI
/// can be built: the request is never sent to another path than asked.
fn to_origin_form(req: &mut Request<Body>, base: &str) -> bool {
    let (scheme, rest) = base.split_once("://").unwrap_or(("http", base));
    let (authority, prefix) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let Some(path) = req.uri().path_and_query() else {
        return false;
    };
    let origin = if prefix.is_empty() {
        Uri::from(path.clone())
    } else {
        match format!("{prefix}{path}").parse() {
            Ok(origin) => origin,
            Err(_) => return false,
        }
    };
    *req.uri_mut() = origin;
    if !req.headers().contains_key(header::HOST) {
        if let Ok(host) = http::HeaderValue::from_str(host_of(scheme, authority)) {
            req.headers_mut().insert(header::HOST, host);
        }
    }
    true
}

/// `Host` for an authority, as the pool writes it: no user information,
/// no default port.
fn host_of<'a>(scheme: &str, authority: &'a str) -> &'a str {
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let default = if scheme.eq_ignore_ascii_case("https") {
        ":443"
    } else {
        ":80"
    };
    host.strip_suffix(default).unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(base: &str, uri: &str, host: Option<&str>) -> (String, String) {
        let mut req = Request::get(uri);
        if let Some(h) = host {
            req = req.header(header::HOST, h);
        }
        let mut req = req.body(Body::empty()).unwrap();
        assert!(to_origin_form(&mut req, base), "{base} + {uri}");
        let host = req.headers()[header::HOST].to_str().unwrap().to_string();
        (req.uri().to_string(), host)
    }

    #[test]
    fn a_uri_without_a_path_is_left_to_the_pool_untouched() {
        // Authority form (CONNECT's): refused before forwarding, and here too.
        let mut req = Request::get("app.test:443").body(Body::empty()).unwrap();
        assert!(req.uri().path_and_query().is_none());
        assert!(!to_origin_form(&mut req, "http://127.0.0.1:8080/pre"));
        assert_eq!(req.uri(), "app.test:443");
        assert!(!req.headers().contains_key(header::HOST));
    }

    #[test]
    fn origin_form_keeps_the_base_path_and_fills_a_missing_host() {
        let plain = origin("http://127.0.0.1:8080", "/a/b?c=1", Some("app.test"));
        assert_eq!(plain, ("/a/b?c=1".into(), "app.test".into()));
        let prefixed = origin("http://127.0.0.1:8080/gwA", "/r/who", None);
        assert_eq!(prefixed, ("/gwA/r/who".into(), "127.0.0.1:8080".into()));
        let tls = origin("https://app.internal/v1/", "/x", Some("h"));
        assert_eq!(tls, ("/v1//x".into(), "h".into()));
        let user = origin("http://user:pw@app.internal:80", "/y", None);
        assert_eq!(user, ("/y".into(), "app.internal".into()));
        let port = origin("https://app.internal:8443", "/z", None);
        assert_eq!(port, ("/z".into(), "app.internal:8443".into()));
    }
}
