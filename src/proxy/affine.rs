//! Connection-affine HTTP/1.1 upstream connections: a client connection owns
//! the upstream connection its requests go out on (one to the app, one to a
//! peer gateway), so a keep-alive client's requests skip the shared pool:
//! no checkout, no pool key hashed, no pool lock. The client connection's
//! task drives them ([`Drive`]), so a response is read, handed over and
//! written back in one task, with no task of their own to wake. A request
//! that finds its connection busy (another HTTP/2 stream is on it, or the
//! last response is still streaming), kept for another address, or closed
//! goes through the worker's pool instead, and so does a request on a
//! connection idle longer than the pool's idle timeout (the app may be
//! closing it).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
#[cfg(any(test, feature = "gateway"))]
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
#[cfg(any(test, feature = "gateway"))]
use tokio::time::Sleep;

use axum::body::Body;
use http::{header, Request, Response, Uri};
use hyper::client::conn::http1::SendRequest;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use tower::ServiceExt;

use super::h2pool::H2Failure;
#[cfg(any(test, feature = "gateway"))]
use super::turns::Turns;

/// Idle pooled connections are closed after this, below the 5 s keep-alive
/// common in app servers, so a reused connection is rarely one the peer
/// closes; a client connection's own upstream connection idle this long is
/// replaced rather than reused.
pub(crate) const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

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
#[cfg_attr(not(feature = "gateway"), allow(dead_code))] // only the gateway's connections build one
pub(crate) struct Affinity {
    owner: Arc<Owner>,
    /// Kept connections the worker may hold open at once; with none left,
    /// requests use the pool (the open-files budget counts them).
    kept: Arc<Semaphore>,
}

impl std::fmt::Debug for Affinity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Affinity").finish_non_exhaustive()
    }
}

/// What a client connection's requests and its task share.
#[derive(Default)]
struct Owner {
    slots: Mutex<[Slot; 2]>,
    drivers: Mutex<Drivers>,
}

/// The kept connections' futures, polled by the client connection's task.
#[derive(Default)]
struct Drivers {
    running: Vec<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// The client connection's task, woken to drive a new connection.
    task: Option<Waker>,
    /// The client connection has ended: nothing would drive a new one.
    closed: bool,
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
}

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
    fn keep(mut self, base: &str, sender: SendRequest<Body>) {
        self.kept = true;
        self.owner.slots()[self.side as usize] = Slot::Idle(Kept {
            base: base.into(),
            sender,
            since: Instant::now(),
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
    #[cfg(any(test, feature = "gateway"))]
    /// A client connection's slots, drawing kept connections from `kept`
    /// (one per worker), and the future its task must poll, beside the
    /// connection itself, to drive them.
    pub(crate) fn new(kept: Arc<Semaphore>) -> (Self, Drive) {
        let owner = Arc::new(Owner::default());
        let drive = Drive {
            owner: owner.clone(),
            idle_check: None,
            turns: Turns::default(),
        };
        (Self { owner, kept }, drive)
    }

    fn slots(&self) -> MutexGuard<'_, [Slot; 2]> {
        self.owner.slots()
    }

    /// The kept connection to `base` if it is ready now; `Ok(None)` when
    /// there is none to reuse and one should be opened; `Err` when the slot
    /// is busy or kept for another live address (use the pool).
    fn begin(&self, side: Side, base: &str) -> Result<(Lease<'_>, Option<SendRequest<Body>>), ()> {
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
            Slot::Idle(k) => Some(k.sender),
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
        let mut sender = match reuse {
            Some(owned) => owned,
            None => {
                let Ok(permit) = self.kept.clone().try_acquire_owned() else {
                    // The worker keeps as many as it may: the pool it is.
                    return Err(NotSent::UsePool(Box::new(req)));
                };
                // Boxed: the connect future is large and rarely run; unboxed
                // it would be copied with every request's future.
                Box::pin(self.connect(connector, base, permit))
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
        // Queued for the connection, which wakes the drive: an HTTP/1.1
        // client connection's task writes it out in this same turn (an
        // HTTP/2 stream's task wakes the connection's).
        match sender.try_send_request(req).await {
            Ok(resp) => {
                lease.keep(base, sender);
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
    /// Opens an HTTP/1.1 connection to `base` (TCP, TLS for https) for
    /// the client connection's task to drive. It lives until its sender is
    /// dropped (the client connection closed, or it was replaced) or either
    /// side closes it; idle in its slot for [`POOL_IDLE_TIMEOUT`], it is
    /// dropped from there, as the pool would close it.
    async fn connect(
        &self,
        connector: &HttpsConnector<HttpConnector>,
        base: &str,
        permit: OwnedSemaphorePermit,
    ) -> Result<SendRequest<Body>, H2Failure> {
        let uri: Uri = base.parse().map_err(|e| H2Failure::Connect(Box::new(e)))?;
        let io = connector
            .clone()
            .oneshot(uri)
            .await
            .map_err(H2Failure::Connect)?;
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(super::defaults::UPSTREAM_READ_BUFFER)
            .handshake(io)
            .await
            .map_err(|e| H2Failure::Connect(Box::new(e)))?;
        let adopted = self.owner.adopt(Box::pin(async move {
            // Counted against the worker's kept connections while open.
            let _permit = permit;
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended");
            }
        }));
        if !adopted {
            let ended = std::io::Error::other("the client connection has ended");
            return Err(H2Failure::Exchange(Box::new(ended)));
        }
        Ok(sender)
    }
}

impl Owner {
    fn slots(&self) -> MutexGuard<'_, [Slot; 2]> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn drivers(&self) -> MutexGuard<'_, Drivers> {
        self.drivers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands a new connection to the client connection's task; false,
    /// and the connection dropped, if that task has ended (an HTTP/2
    /// stream's request can still be connecting then).
    fn adopt(&self, driver: Pin<Box<dyn Future<Output = ()> + Send>>) -> bool {
        let mut drivers = self.drivers();
        if drivers.closed {
            return false;
        }
        drivers.running.push(driver);
        // The request that opened it may run in another task (an HTTP/2
        // stream's), or ahead of the driving in this one.
        if let Some(task) = &drivers.task {
            task.wake_by_ref();
        }
        true
    }

    #[cfg(any(test, feature = "gateway"))]
    /// Polls every kept connection; true while any is open.
    fn poll_drivers(&self, cx: &mut Context<'_>) -> bool {
        let mut drivers = self.drivers();
        if !drivers
            .task
            .as_ref()
            .is_some_and(|t| t.will_wake(cx.waker()))
        {
            drivers.task = Some(cx.waker().clone());
        }
        drivers
            .running
            .retain_mut(|d| d.as_mut().poll(cx).is_pending());
        !drivers.running.is_empty()
    }

    #[cfg(any(test, feature = "gateway"))]
    /// Empties each slot whose connection has been ready and idle for
    /// [`POOL_IDLE_TIMEOUT`]: the dropped sender lets the connection close.
    /// Returns when to look again: when the next would have been idle that
    /// long.
    fn drop_idle(&self) -> Duration {
        let mut next = POOL_IDLE_TIMEOUT;
        for slot in self.slots().iter_mut() {
            if let Slot::Idle(k) = slot {
                let idle = k.since.elapsed();
                if !k.sender.is_ready() {
                    // Still streaming: look again in a while.
                } else if idle >= POOL_IDLE_TIMEOUT {
                    *slot = Slot::Empty;
                } else {
                    next = next.min(POOL_IDLE_TIMEOUT - idle);
                }
            }
        }
        next
    }
}

#[cfg(any(test, feature = "gateway"))]
/// Drives a client connection's kept upstream connections in the client
/// connection's own task, which polls them with the connection
/// ([`Drive::around`]), and drops one idle for [`POOL_IDLE_TIMEOUT`].
/// Dropped with the client connection, it closes them (a request still
/// waiting on one, in an HTTP/2 stream's task, gets an error rather than
/// waiting forever).
pub(crate) struct Drive {
    owner: Arc<Owner>,
    /// The next look for idle connections, while any is open.
    idle_check: Option<Pin<Box<Sleep>>>,
    /// The wakers of the kept connections and of the client connection.
    turns: Turns,
}

#[cfg(any(test, feature = "gateway"))]
/// Polls every kept connection, and drops those idle too long.
fn poll_kept(owner: &Owner, idle_check: &mut Option<Pin<Box<Sleep>>>, cx: &mut Context<'_>) {
    loop {
        if !owner.poll_drivers(cx) {
            *idle_check = None;
            return;
        }
        let check =
            idle_check.get_or_insert_with(|| Box::pin(tokio::time::sleep(POOL_IDLE_TIMEOUT)));
        if check.as_mut().poll(cx).is_pending() {
            return;
        }
        let next = owner.drop_idle();
        check.as_mut().reset(tokio::time::Instant::now() + next);
        // A connection let go closes when next polled.
    }
}

#[cfg(any(test, feature = "gateway"))]
impl Drive {
    /// `conn` (the client connection) and the kept connections polled in
    /// turns ([`Turns`]): each only when its waker fired, and again within
    /// the same turn of the task while one hands over to the other (a
    /// request queued for a kept connection, a response read from it).
    pub(crate) fn around<'a, F: Future>(&'a mut self, conn: Pin<&'a mut F>) -> Around<'a, F> {
        // Polled at once, whatever happened to `conn` in between.
        self.turns.wake_both();
        Around { drive: self, conn }
    }
}

#[cfg(any(test, feature = "gateway"))]
/// See [`Drive::around`].
pub(crate) struct Around<'a, F> {
    drive: &'a mut Drive,
    conn: Pin<&'a mut F>,
}

#[cfg(any(test, feature = "gateway"))]
impl<F: Future> Future for Around<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let Drive {
            owner,
            idle_check,
            turns,
        } = &mut *this.drive;
        let conn = &mut this.conn;
        turns.poll(
            cx,
            |cx| poll_kept(owner, idle_check, cx),
            |cx| conn.as_mut().poll(cx),
        )
    }
}

#[cfg(any(test, feature = "gateway"))]
impl Drop for Drive {
    fn drop(&mut self) {
        let running = {
            let mut drivers = self.owner.drivers();
            drivers.closed = true;
            std::mem::take(&mut drivers.running)
        };
        let slots = std::mem::take(&mut *self.owner.slots());
        drop((running, slots));
    }
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
    use std::io::{BufRead, BufReader, Write};

    /// An app on a plain thread (outside the runtime, so the runtime's
    /// tasks are rolegate's alone): answers each request on a connection
    /// with `ok`, and reports each connection it accepted and each it saw
    /// closed.
    fn thread_app() -> (String, std::sync::mpsc::Receiver<&'static str>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let (mut conn, tx) = (conn.unwrap(), tx.clone());
                tx.send("accepted").unwrap();
                // A thread per connection: a second one is accepted (and
                // reported) even while the first stays open.
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(conn.try_clone().unwrap());
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            let _ = tx.send("closed");
                            break;
                        }
                        if line == "\r\n" {
                            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            let _ = conn.write_all(ok);
                        }
                    }
                });
            }
        });
        (base, rx)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn kept_connections_are_driven_by_the_client_connection_task_alone() {
        let (base, app) = thread_app();
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(HttpConnector::new());
        let (affinity, mut drive) = Affinity::new(Arc::new(Semaphore::new(4)));
        let tasks = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        for _ in 0..3 {
            let req = Request::get("/x").body(Body::empty()).unwrap();
            // This task plays the client connection's: it polls the drive
            // around a connection (here one that never ends), in turns, as
            // the listener does.
            let conn = std::pin::pin!(std::future::pending::<()>());
            let sent = tokio::select! {
                () = drive.around(conn) => unreachable!("a pending connection"),
                sent = affinity.send(Side::App, &connector, &base, req) => sent,
            };
            let Ok(resp) = sent else {
                panic!("the exchange failed")
            };
            assert_eq!(resp.status(), 200);
            // The connection stays open with no task of its own.
            assert_eq!(tasks(), 0, "a kept connection was given a task");
        }
        // One connection, reused (a second would have been accepted before
        // its answer); closed with the client connection's task.
        assert_eq!(app.recv().unwrap(), "accepted");
        assert!(app.try_recv().is_err(), "the connection was not reused");
        drop(drive);
        let next = app.recv_timeout(Duration::from_secs(10));
        assert_eq!(
            next,
            Ok("closed"),
            "dropping the drive closes the connection"
        );
    }

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
