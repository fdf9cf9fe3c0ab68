//! The HTTP/1.1 fast path: one task owns a plain client connection, the
//! connections it uses onward (to the app, and to a holder's gateway), and
//! their buffers, for the bodiless requests the stack would send on at
//! once.
//!
//! A request head is read into a pooled buffer and parsed in place with the
//! gateway's codec (`crate::http1`, held to hyper by the differential fuzz
//! targets). The path takes a request when it is HTTP/1.1 with no body and
//! the gate's decision is to run it here, pass it through, or forward it to
//! the role's holder. A request whose fields all pass on as sent has its
//! head written from the bytes received plus what the stack adds; any other
//! goes through the stack's own steps (hop check, sanitizer, decision,
//! forwarding fields) on a `HeaderMap` first. The head goes onward with one
//! write, the answer's head is parsed the same way, and its body is moved
//! as framed, never re-chunked.
//!
//! Anything else is **declined** before a byte of it is sent: the
//! connection, with the bytes read so far, goes to hyper and the full stack
//! for the rest of its life (see `Prefixed`). So the fast path never has
//! to hold or refuse a request; it only answers the next hop's failures
//! (the stack's problems) and the end of a term (503 `term-ended` before
//! the answer, a cut connection during its body). A hop that the holder
//! refuses unread is declined then too, and the stack holds it.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use tokio::sync::Semaphore;

use super::unread::UnreadBudget;
use crate::events::EventLog;
use crate::http1::head::{self, Asked, Framing, Parsed, Version};
use crate::lease::{HeldLease, LocalWork};
use crate::listener::HEADER_READ_TIMEOUT;
use crate::proxy::forward::ForwardError;
use crate::proxy::forward::{add_forwarding_fields, sanitize_headers};
use crate::proxy::gate::{Decision, ForwardedHop, GateSettings, GateTarget};
use crate::proxy::headers::{
    carries_hop_marker, is_upgrade_request, passes_unchanged, write_forwarding, HOP, ROLE, TOKEN,
};
use crate::proxy::problem::is_grpc;
use crate::proxy::problem::{Problem, Reason};
use crate::proxy::stack::{term_ended, ConnectionFacts, Routes};
use crate::proxy::{failure_problem, NextHop};
use crate::shutdown::Shutdown;
use crate::telemetry;

/// What the fast path needs of the gateway: set when the app is plain
/// HTTP/1.1 at a URL without a path and no observer is on.
pub(crate) struct FastPath {
    pub(crate) routes: Arc<Routes>,
    pub(crate) settings: Arc<GateSettings>,
    /// `upstream.url`, for the problems that name it.
    pub(crate) url: String,
    /// `host:port` of the app.
    pub(crate) address: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) events: Option<Arc<EventLog>>,
    /// Hops to holders are plain HTTP/1.1 (`peers`: no TLS, `http1`), so
    /// this path may take them.
    pub(crate) forwards: bool,
    /// `peers.require_client_cert`: a hop-marked request is the stack's.
    pub(crate) hops_need_peer_cert: bool,
}

/// How long an answer may take before the client's connection is watched
/// for its end while waiting for it.
const WATCH_AFTER: Duration = Duration::from_millis(50);

/// Bytes read from the client at a time, and the start of a buffer.
const CHUNK: usize = 8 * 1024;

/// How one exchange ended for the client connection.
enum Next {
    /// Ready for the next request.
    KeepAlive,
    /// Close the client connection.
    Close,
    /// Hand the connection to hyper (nothing of this request was sent).
    Decline,
}

/// What the head asked for, owned, once it is known the path takes it.
struct Plan {
    /// Bytes of the client's head.
    head_len: usize,
    asked: Asked,
    /// The method allows sending again on a fresh connection when a kept
    /// one turns out closed before answering.
    idempotent: bool,
    keep_alive: bool,
    dest: Dest,
}

/// Where a request goes next.
enum Dest {
    /// The app: under the lease when gated (local work), else passed through.
    App(Option<(HeldLease, LocalWork)>),
    /// The role's holder, one hop away.
    Holder {
        role: Arc<str>,
        partition: Option<Arc<str>>,
        /// As the holder advertises itself, for the problems that name it.
        address: Arc<str>,
        /// `host:port` to connect to.
        at: String,
        /// The method and target, which a holder's refusal is signed over.
        signed: (String, String),
    },
}

impl Dest {
    fn local(&self) -> Option<&(HeldLease, LocalWork)> {
        match self {
            Dest::App(local) => local.as_ref(),
            Dest::Holder { .. } => None,
        }
    }
}

/// The one valid `Host` of a head; None (declined) for none, several, or
/// one the stack would read otherwise.
fn one_host<'a>(fields: &[httparse::Header<'a>]) -> Option<&'a [u8]> {
    let mut hosts = fields
        .iter()
        .filter(|f| f.name.eq_ignore_ascii_case("host"));
    let host = hosts.next()?.value;
    if hosts.next().is_some()
        || host.is_empty()
        || host.contains(&b'@')
        || http::uri::Authority::try_from(host).is_err()
    {
        return None;
    }
    Some(host)
}

/// Whether every field passes on as sent: `Connection` only as
/// `keep-alive` or `close` (naming no field), no gRPC content (the stack
/// answers its failures in gRPC's own statuses), and no other field the
/// stack removes, rewrites or reads.
fn all_plain(fields: &[httparse::Header<'_>]) -> bool {
    let mut name = [0u8; 64];
    fields.iter().all(|f| {
        let n = f.name.len();
        if n > name.len() {
            return false;
        }
        name[..n].copy_from_slice(f.name.as_bytes());
        name[..n].make_ascii_lowercase();
        match std::str::from_utf8(&name[..n]) {
            Ok("host") => true,
            Ok("connection") => {
                f.value.eq_ignore_ascii_case(b"keep-alive")
                    || f.value.eq_ignore_ascii_case(b"close")
            }
            Ok("content-type") => !f
                .value
                .get(..16)
                .is_some_and(|v| v.eq_ignore_ascii_case(b"application/grpc")),
            Ok(other) => passes_unchanged(other),
            Err(_) => false,
        }
    })
}

/// `METHOD target HTTP/1.1\r\n`.
fn write_request_line(out: &mut Vec<u8>, method: &str, target: &str) {
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
}

/// Serves a plain connection on the fast path until it closes (None), or
/// gives it back for hyper, with the bytes read from it in front.
/// `budget` is the process's unread-bytes budget, `kept` the worker's
/// share of kept app connections.
pub(crate) async fn serve(
    mut client: TcpStream,
    conn: ConnectionFacts,
    fast: &FastPath,
    (budget, kept): (Arc<UnreadBudget>, Arc<Semaphore>),
    stop: &mut Shutdown,
) -> Option<Prefixed> {
    let meter = Meter {
        id: budget.new_id(),
        budget,
        evict: Arc::new(tokio::sync::Notify::new()),
    };
    let mut inbuf = BytesMut::new();
    let mut hops = Hops::default();
    let mut first = true;
    loop {
        // A head: the first within the header read timeout; the next after
        // at most the idle timeout, then within the header read timeout.
        let wait = if first {
            HEADER_READ_TIMEOUT
        } else {
            fast.idle_timeout
        };
        match read_head(&mut client, &mut inbuf, wait, stop, &mut hops).await {
            HeadRead::Ready => {}
            HeadRead::Close => return None,
            HeadRead::Decline => break,
        }
        first = false;
        let mut out = Vec::with_capacity(512);
        let Some(plan) = fast.plan(&inbuf, conn.client, &mut out) else {
            break;
        };
        // Boxed for the exchange only: an idle connection's task does not
        // carry the exchange's state (4.3 -> 3.5 KiB per idle connection;
        // no throughput difference measured).
        let exchange = fast.exchange(
            &mut client,
            &mut inbuf,
            (&mut hops, &kept),
            plan,
            &out,
            (stop, &meter),
        );
        // An exchange gives the buffer back once it has taken the head.
        let next = Box::pin(exchange).await;
        match next {
            Next::KeepAlive if !stopping(stop) => {}
            Next::KeepAlive | Next::Close => return None,
            Next::Decline => break,
        }
    }
    drop(hops);
    Some(Prefixed {
        head: inbuf.freeze(),
        io: client,
        served: !first,
    })
}

/// Reads what the client sent into `buf`, which takes a pooled buffer only
/// once there is something to read.
async fn read_into(client: &mut TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    if buf.capacity() == 0 {
        client.readable().await?;
        *buf = pool::take();
    } else if buf.capacity() - buf.len() < CHUNK / 2 {
        buf.reserve(CHUNK);
    }
    client.read_buf(buf).await
}

/// Read buffers, per thread: a connection takes one when bytes arrive and
/// gives it back when it has nothing left in it, so an idle keep-alive
/// connection (and a stream waiting for its next event) holds none.
mod pool {
    use std::cell::RefCell;

    use bytes::BytesMut;

    use super::CHUNK;

    /// The size of a large buffer, for moving large bodies.
    pub(super) const BIG: usize = 64 * 1024;
    /// Free buffers kept per thread at most: small ones, and large ones
    /// (2 MiB in all).
    const KEPT: usize = 256;
    const KEPT_BIG: usize = 32;

    thread_local! {
        static FREE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
        static FREE_BIG: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
    }

    pub(super) fn take() -> BytesMut {
        FREE.with(|f| f.borrow_mut().pop())
            .unwrap_or_else(|| BytesMut::with_capacity(CHUNK))
    }

    pub(super) fn take_big() -> BytesMut {
        FREE_BIG
            .with(|f| f.borrow_mut().pop())
            .unwrap_or_else(|| BytesMut::with_capacity(BIG))
    }

    /// Gives back `buf` (emptied) to the list its size belongs to; one
    /// grown past a large buffer is freed.
    pub(super) fn give(buf: &mut BytesMut) {
        let mut b = std::mem::take(buf);
        b.clear();
        if b.capacity() < CHUNK {
            // Reclaims the room `advance` left behind, without allocating.
            b.reserve(CHUNK);
        }
        let (list, kept) = match b.capacity() {
            c if c <= 4 * CHUNK => (&FREE, KEPT),
            c if c <= 2 * BIG => (&FREE_BIG, KEPT_BIG),
            _ => return,
        };
        list.with(|f| {
            let mut f = f.borrow_mut();
            if f.len() < kept {
                f.push(b);
            }
        });
    }
}

fn stopping(stop: &Shutdown) -> bool {
    stop.is_fired()
}

enum HeadRead {
    Ready,
    Close,
    Decline,
}

/// Reads until `buf` holds a whole head, or what is read is for hyper (a
/// head the codec refuses or declines, or one past its size limit).
async fn read_head(
    client: &mut TcpStream,
    buf: &mut BytesMut,
    wait: Duration,
    stop: &mut Shutdown,
    hops: &mut Hops,
) -> HeadRead {
    let mut deadline = tokio::time::Instant::now() + wait;
    // A kept connection is let go when its peer closes it, or when it has
    // been idle for as long as the pool keeps one.
    let app_idle = tokio::time::Instant::now() + crate::proxy::affine::POOL_IDLE_TIMEOUT;
    let mut started = !buf.is_empty();
    loop {
        if !buf.is_empty() {
            if !started {
                started = true;
                deadline = tokio::time::Instant::now() + HEADER_READ_TIMEOUT;
            }
            let mut slots = head::header_slots();
            match head::parse_request(buf, &mut slots) {
                Ok(Parsed::Complete(_)) => return HeadRead::Ready,
                Ok(Parsed::Partial) if buf.len() < crate::http1::MAX_REQUEST_HEAD => {}
                // Refused, declined or too large: hyper answers it.
                _ => return HeadRead::Decline,
            }
        }
        let read = tokio::select! {
            r = read_into(client, buf) => r,
            _ = stop.recv(), if buf.is_empty() => return HeadRead::Close,
            _ = tokio::time::sleep_until(deadline) => return HeadRead::Close,
            closed = app_closed(hops.app.as_ref()), if hops.app.is_some() => {
                if closed {
                    hops.app = None;
                }
                continue;
            }
            closed = app_closed(hops.holder.as_ref()), if hops.holder.is_some() => {
                if closed {
                    hops.holder = None;
                }
                continue;
            }
            _ = tokio::time::sleep_until(app_idle), if hops.app.is_some() || hops.holder.is_some() => {
                *hops = Hops::default();
                continue;
            }
        };
        match read {
            Ok(0) | Err(_) => return HeadRead::Close,
            Ok(_) => {}
        }
    }
}

/// Waits until an idle kept connection has something to read: true when
/// it closed or sent bytes nobody asked for (it is then no use), false
/// when the wake was spurious.
async fn app_closed(app: Option<&AppConn>) -> bool {
    let Some(app) = app else {
        return std::future::pending().await;
    };
    if app.stream.readable().await.is_err() {
        return true;
    }
    let mut byte = [0u8; 1];
    !matches!(app.stream.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

impl FastPath {
    /// The plan for the head at the start of `buf` and its next hop's head
    /// in `out`, or None to decline it.
    fn plan(&self, buf: &[u8], client: SocketAddr, out: &mut Vec<u8>) -> Option<Plan> {
        let mut slots = head::header_slots();
        let Ok(Parsed::Complete(head::Request::Head(h))) = head::parse_request(buf, &mut slots)
        else {
            return None;
        };
        if h.version != Version::Http11 || h.framing != Framing::Empty || h.length_ignored {
            return None;
        }
        let target = h.path_and_query;
        // What hyper's `Uri` reads as the path: a fragment or a byte it
        // would read differently is left to it.
        if !target.starts_with('/') || !target.bytes().all(|b| b.is_ascii_graphic() && b != b'#') {
            return None;
        }
        let path = target.split('?').next().unwrap_or(target);
        // A repeated `Content-Length` (hyper hands the app only the first).
        let lengths = h
            .headers
            .iter()
            .filter(|f| f.name.eq_ignore_ascii_case("content-length"));
        if lengths.count() > 1 {
            return None;
        }
        let host = one_host(h.headers)?;
        let gate = self.routes.lookup(path).ok()?;
        let gate = gate.as_deref();
        let plain = !matches!(gate, Some(GateTarget::Partition { .. })) && all_plain(h.headers);
        let dest = if plain {
            self.plain(&h, host, gate, client, out)?
        } else {
            self.prepared(&h, gate, client, out)?
        };
        let method = h.method;
        Some(Plan {
            head_len: h.len,
            asked: if method == "HEAD" {
                Asked::Head
            } else {
                Asked::Other
            },
            idempotent: matches!(method, "GET" | "HEAD" | "OPTIONS"),
            keep_alive: h.keep_alive,
            dest,
        })
    }

    /// A request whose fields all pass on as sent: its head is written
    /// from the bytes received, with `Connection` dropped (hop-by-hop) and
    /// what the stack adds after them. The stack would change nothing
    /// else of it (`passes_unchanged`, held to the stack's sanitizer by a
    /// property test).
    fn plain(
        &self,
        h: &head::RequestHead<'_, '_>,
        host: &[u8],
        gate: Option<&GateTarget>,
        client: SocketAddr,
        out: &mut Vec<u8>,
    ) -> Option<Dest> {
        let dest = match gate {
            None => Dest::App(None),
            Some(GateTarget::Role(lease)) => match lease.begin_local() {
                Some(local) => Dest::App(Some(local)),
                None => {
                    let holder = lease.current_holder().filter(|h| !h.here)?;
                    self.holder((lease.name().clone(), None), holder.address, h)?
                }
            },
            Some(GateTarget::Partition { .. }) => return None,
        };
        write_request_line(out, h.method, h.path_and_query);
        for f in h.headers {
            if !f.name.eq_ignore_ascii_case("connection") {
                push_field(out, f.name.as_bytes(), f.value);
            }
        }
        let to_peer = matches!(dest, Dest::Holder { .. });
        let by = &self.settings.instance_id;
        write_forwarding(out, client, by, host, to_peer);
        self.write_marks(out, &dest, h.method, h.path_and_query);
        out.extend_from_slice(b"\r\n");
        Some(dest)
    }

    /// Any other request the path takes: its fields go through the same
    /// steps as on the stack (the hop marker verified, the fields
    /// sanitized, the gate's decision, the forwarding fields added), and
    /// the head is written from the result, as hyper would write it.
    fn prepared(
        &self,
        h: &head::RequestHead<'_, '_>,
        gate: Option<&GateTarget>,
        client: SocketAddr,
        out: &mut Vec<u8>,
    ) -> Option<Dest> {
        let mut headers = http::HeaderMap::with_capacity(h.headers.len() + 8);
        for f in h.headers {
            let name = http::HeaderName::from_bytes(f.name.as_bytes()).ok()?;
            headers.append(name, http::HeaderValue::from_bytes(f.value).ok()?);
        }
        let mut req = http::Request::builder()
            .method(h.method)
            .uri(h.path_and_query)
            .body(axum::body::Body::empty())
            .ok()?;
        *req.headers_mut() = headers;
        let fields = req.headers();
        // Refused, answered or judged by the stack alone: a request it
        // refuses, an upgrade, `Expect`, gRPC (answered in its own
        // statuses), a hop marker that does not verify (counted there) or
        // that needs a peer certificate.
        if super::refuse::refuse_request(&req).is_some()
            || fields.contains_key(http::header::EXPECT)
            || is_upgrade_request(fields)
            || is_grpc(fields)
            || (self.hops_need_peer_cert && carries_hop_marker(fields))
        {
            return None;
        }
        let settings = &self.settings;
        if let Some(marker) = fields.get(HOP) {
            settings
                .signer
                .check(marker, h.method, h.path_and_query)
                .ok()?;
        }
        let client = Some(client);
        let marked = req.headers().contains_key(HOP);
        let forwarded = settings.take_hop(&mut req, client);
        // The marker verified above; one that expired in between is the
        // stack's to judge, once.
        if marked && req.extensions().get::<ForwardedHop>().is_none() {
            return None;
        }
        let trusted = settings.trusts(&req, client);
        sanitize_headers(req.headers_mut(), trusted, &settings.upgrades);
        let dest = match gate {
            None => Dest::App(None),
            Some(gate) if gate.form_key().is_some() => return None,
            Some(gate) => match gate.decide(req.uri(), req.headers(), forwarded) {
                Decision::Local(lease, work) => Dest::App(Some((lease, work))),
                Decision::Forward { address, role } => {
                    self.holder((role, gate.partition_label()), address, h)?
                }
                Decision::Reject(_) => return None,
            },
        };
        let to_peer = matches!(dest, Dest::Holder { .. });
        add_forwarding_fields(&mut req, client, &settings.instance_id, to_peer);
        write_request_line(out, h.method, h.path_and_query);
        for (n, v) in req.headers() {
            push_field(out, n.as_str().as_bytes(), v.as_bytes());
        }
        // Last, as the stack inserts them (the client's were removed).
        self.write_marks(out, &dest, h.method, h.path_and_query);
        out.extend_from_slice(b"\r\n");
        Some(dest)
    }

    /// The hop to `role`'s holder at `address` (as it advertises itself),
    /// when this path can take it: plain HTTP/1.1 between gateways.
    fn holder(
        &self,
        (role, partition): (Arc<str>, Option<Arc<str>>),
        address: Arc<str>,
        h: &head::RequestHead<'_, '_>,
    ) -> Option<Dest> {
        if !self.forwards {
            return None;
        }
        let at = plain_http_address(&address)?;
        Some(Dest::Holder {
            role,
            partition,
            address,
            at,
            signed: (h.method.to_owned(), h.path_and_query.to_owned()),
        })
    }

    /// What the gate adds for the next hop: the role and token of local
    /// work, or the hop marker to a holder.
    fn write_marks(&self, out: &mut Vec<u8>, dest: &Dest, method: &str, target: &str) {
        match dest {
            Dest::App(Some((lease, _))) => {
                // As `HeaderValue::from_str` takes it (a role name always is).
                let role = lease.role.as_bytes();
                if role
                    .iter()
                    .all(|b| *b == b'\t' || (b' '..=b'~').contains(b))
                {
                    push_field(out, ROLE.as_str().as_bytes(), role);
                }
                out.extend_from_slice(TOKEN.as_str().as_bytes());
                out.extend_from_slice(b": ");
                push_u64(out, lease.token);
                out.extend_from_slice(b"\r\n");
            }
            Dest::App(None) => {}
            Dest::Holder { .. } => {
                let id = &self.settings.instance_id;
                if let Some(marker) = self.settings.signer.marker(id, method, target) {
                    push_field(out, HOP.as_str().as_bytes(), marker.as_bytes());
                }
            }
        }
    }

    /// One request and its answer.
    async fn exchange(
        &self,
        client: &mut TcpStream,
        inbuf: &mut BytesMut,
        (hops, kept): (&mut Hops, &Arc<Semaphore>),
        plan: Plan,
        out: &[u8],
        (stop, meter): (&Shutdown, &Meter),
    ) -> Next {
        let started = Instant::now();
        // A client that sent more than this head (a pipelined request) and
        // then closed its side is not gone: its requests are answered in
        // order, as hyper answers them. Its connection is not watched.
        let pipelined = inbuf.len() > plan.head_len;
        let to = match &plan.dest {
            Dest::App(_) => None,
            Dest::Holder { at, .. } => Some(at.as_str()),
        };
        let app = match to {
            None => &mut hops.app,
            Some(_) => &mut hops.holder,
        };
        if app.as_ref().is_some_and(|c| c.to.as_deref() != to) {
            *app = None;
        }
        let reused = app.is_some();
        if app.is_none() {
            match self.connect(kept, to).await {
                Ok(c) => *app = Some(c),
                // Nothing was sent: the stack tries, and answers, itself.
                Err(_) => return Next::Decline,
            }
        }
        // A hop to a holder stays declinable until its answer is read: a
        // holder that refuses it unread leaves it to the stack, which holds
        // it for the next holder.
        let hop = to.is_some();
        if !hop {
            commit(inbuf, plan.head_len);
        }
        if let (Some(log), Some((lease, _))) = (&self.events, plan.dest.local()) {
            log.admitted(
                &self.settings.instance_id,
                &lease.role,
                lease.token,
                lease.checked_at,
            );
        }
        let over = plan.dest.local().map(|(_, work)| work.over());
        let over = async move {
            match over {
                Some(o) => o.await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(over);
        let mut attempt = Some(reused && plan.idempotent);
        let answered = loop {
            let Some(may_retry) = attempt.take() else {
                break Err(Failure::Broken("the app closed the connection".into()));
            };
            let conn = app.as_mut().expect("connected");
            // The term first: a term that ended before the head went out
            // (during the connect) sends nothing.
            let (mut watched, _) = client.split();
            let got = tokio::select! {
                biased;
                _ = &mut over => Err(Failure::TermEnded),
                r = conn.ask(out, plan.asked, self.response_timeout) => r,
                // Watched only once the answer is slow in coming: a quick
                // answer costs no extra read of the client's connection.
                _ = async {
                    tokio::time::sleep(WATCH_AFTER).await;
                    client_gone(&mut watched).await
                }, if !pipelined => Err(Failure::ClientGone),
            };
            match got {
                Err(Failure::ClosedUnanswered) if may_retry => {
                    *app = None;
                    match self.connect(kept, to).await {
                        Ok(c) => *app = Some(c),
                        Err(e) => break Err(Failure::Broken(e.to_string())),
                    }
                    attempt = Some(false);
                }
                other => break other,
            }
        };
        let metrics = telemetry::request_metrics();
        let spent = started.elapsed().as_secs_f64();
        match hop {
            true => metrics.forward_holder.record(spent),
            false => metrics.forward_upstream.record(spent),
        }
        if let (Ok(resp), Some(refused)) = (&answered, self.refused_unread(&answered, &plan)) {
            debug_assert_eq!(resp.status, 503);
            tracing::debug!(role = %refused, "the holder refused the hop unread; the stack holds it");
            *app = None;
            return Next::Decline;
        }
        if hop {
            commit(inbuf, plan.head_len);
        }
        metrics.fast_path.increment(1);
        let resp = match answered {
            Ok(resp) => resp,
            Err(Failure::ClientGone) => {
                tracing::debug!("the client closed its connection before the answer");
                *app = None;
                return Next::Close;
            }
            Err(failure) => {
                *app = None;
                let problem = self.problem(failure, &plan);
                metrics.count(problem.reason.as_str());
                drop(plan.dest);
                let closing = !plan.keep_alive || stopping(stop);
                let head_only = plan.asked == Asked::Head;
                let retry_after = self.settings.retry_after_secs;
                let answer = write_answer(client, problem, retry_after, (closing, head_only));
                return match answer.await {
                    Ok(()) if !closing => Next::KeepAlive,
                    _ => Next::Close,
                };
            }
        };
        metrics.count(match &plan.dest {
            Dest::App(Some(_)) => "local",
            Dest::App(None) => "passthrough",
            Dest::Holder { .. } => "forwarded",
        });
        let conn = app.as_mut().expect("connected");
        let until_close = resp.framing == Framing::UntilClose;
        let closing = !plan.keep_alive || until_close || stopping(stop);
        let mut head = Vec::with_capacity(resp.head.len() + 64);
        client_head(&mut head, &resp, closing);
        let streamed = {
            let _open = (resp.framing != Framing::Empty).then(telemetry::OpenGuard::stream);
            // A body that may be large holds what waits for the client
            // against the process's unread budget, as the stack's do.
            let metered = match resp.framing {
                Framing::Empty => false,
                Framing::Length(n) => n > super::unread::UNMETERED_BELOW,
                Framing::Chunked | Framing::UntilClose => true,
            };
            let open_ended = matches!(resp.framing, Framing::Chunked | Framing::UntilClose);
            let (mut watched, client) = client.split();
            let client = Within {
                io: client,
                idle: self.idle_timeout,
                meter: metered.then_some(meter),
            };
            let moving = conn.relay(client, head, resp.framing, self.idle_timeout);
            tokio::select! {
                biased;
                _ = &mut over => {
                    if let Some((_, work)) = plan.dest.local() {
                        let watch = work.watch();
                        let reason = watch.reason().map_or("lost", |r| r.as_str());
                        metrics::counter!(telemetry::STREAMS_ENDED, "role" => watch.metric_label(), "reason" => reason)
                            .increment(1);
                    }
                    Err(io::Error::other("the term ended"))
                }
                _ = meter.evict.notified() => {
                    tracing::debug!("the unread-bytes budget is full and this client waited longest; closing");
                    Err(io::Error::other("evicted"))
                }
                r = moving => r,
                // A stream's client may leave between events; a body of a
                // known length finds it gone at its next write.
                _ = client_gone(&mut watched), if open_ended && !pipelined => Err(io::Error::other("the client left")),
            }
        };
        // An eviction told as this body's last write ended is for no one.
        let _ = futures_util::FutureExt::now_or_never(meter.evict.notified());
        drop(plan.dest);
        if conn.buf.is_empty() {
            pool::give(&mut conn.buf);
        }
        match streamed {
            // Bytes past the answer would be read as the next one's.
            Ok(())
                if resp.reusable && !until_close && conn.buf.is_empty() && conn.kept.is_some() => {}
            Ok(()) => *app = None,
            Err(_) => {
                // A body cut short: both connections end, as the stack ends them.
                *app = None;
                return Next::Close;
            }
        }
        if closing {
            Next::Close
        } else {
            Next::KeepAlive
        }
    }

    /// The role whose holder refused this hop before reading it (a 503
    /// carrying the holder's signed `X-Rolegate-Refused`), when holding is
    /// on: the stack holds such a request for the next holder. With holding
    /// off the refusal is the client's answer, as on the stack.
    fn refused_unread(&self, answered: &Result<Answer, Failure>, plan: &Plan) -> Option<Arc<str>> {
        let (Ok(resp), Dest::Holder { role, signed, .. }) = (answered, &plan.dest) else {
            return None;
        };
        let value = resp.refused.as_ref()?;
        if resp.status != 503 || self.settings.holds.timeout.is_zero() {
            return None;
        }
        let value = http::HeaderValue::from_bytes(value).ok()?;
        let verified = self.settings.verify_refusal(&value, &signed.0, &signed.1);
        verified.then(|| role.clone())
    }

    /// A new connection to the app (`to` None) or a holder, kept past its
    /// exchange only while the worker's share of kept connections has room.
    async fn connect(&self, kept: &Arc<Semaphore>, to: Option<&str>) -> io::Result<AppConn> {
        let connect = TcpStream::connect(to.unwrap_or(self.address.as_str()));
        let stream = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
        let _ = stream.set_nodelay(true);
        Ok(AppConn {
            stream,
            to: to.map(str::to_owned),
            buf: BytesMut::new(),
            kept: kept.clone().try_acquire_owned().ok(),
        })
    }

    /// The stack's answer to the app failing this request.
    fn problem(&self, failure: Failure, plan: &Plan) -> Problem {
        let (target, hop) = match &plan.dest {
            Dest::App(_) => (
                self.url.clone(),
                NextHop::App {
                    upstream: &self.url,
                },
            ),
            Dest::Holder { role, address, .. } => {
                (address.to_string(), NextHop::Holder { role, address })
            }
        };
        let e = match failure {
            Failure::TermEnded => {
                if let Some((lease, work)) = plan.dest.local() {
                    let watch = work.watch();
                    let reason = watch.reason().map_or("lost", |r| r.as_str());
                    return term_ended(lease.role.clone(), watch.metric_label(), reason);
                }
                return Problem::new(Reason::TermEnded, "the term ended");
            }
            Failure::Timeout => ForwardError::Timeout {
                target,
                after: self.response_timeout,
            },
            Failure::Unasked101 => ForwardError::BadUpgrade {
                target,
                why: crate::proxy::headers::BadUpgrade::Unasked,
            },
            Failure::ClosedUnanswered => ForwardError::Failed {
                target,
                source: "the app closed the connection before answering".into(),
            },
            Failure::Broken(why) => ForwardError::Failed {
                target,
                source: why.into(),
            },
            Failure::ClientGone => ForwardError::Failed {
                target,
                source: "the client left".into(),
            },
        };
        let problem = failure_problem(&e, hop);
        match &plan.dest {
            Dest::App(local) => problem.role(local.as_ref().map(|(l, _)| l.role.clone())),
            Dest::Holder {
                role, partition, ..
            } => problem
                .role(Some(role.clone()))
                .partition(partition.clone()),
        }
    }
}

/// Why the app gave no usable answer.
enum Failure {
    TermEnded,
    Timeout,
    Unasked101,
    /// Writing the head to a kept connection failed: the app had closed
    /// it, so it read none of this request (sent again on a new one).
    ClosedUnanswered,
    /// The client closed its connection first: nothing is answered.
    ClientGone,
    Broken(String),
}

/// Resolves when the client has closed its connection, or it broke: an
/// exchange whose client left is dropped (its app or hop connection
/// closed), as hyper's server drops it when a read finds the connection's
/// end. Bytes the client sent ahead (a pipelined request) leave it
/// pending: they are the next request's.
async fn client_gone(client: &mut tokio::net::tcp::ReadHalf<'_>) {
    let mut byte = [0u8; 1];
    match client.peek(&mut byte).await {
        Ok(0) | Err(_) => {}
        Ok(_) => std::future::pending().await,
    }
}

/// The head is this path's now: it leaves the read buffer.
fn commit(inbuf: &mut BytesMut, len: usize) {
    inbuf.advance(len);
    if inbuf.is_empty() {
        pool::give(inbuf);
    }
}

/// `host:port` of a plain `http://` URL without a path (the app's, or a
/// holder's as it advertises itself); None for any other.
pub(crate) fn plain_http_address(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    if uri.scheme_str() != Some("http") || !matches!(uri.path(), "" | "/") {
        return None;
    }
    let authority = uri.authority()?;
    let port = authority.port_u16().unwrap_or(80);
    Some(format!("{}:{port}", authority.host()))
}

/// `n` in decimal.
fn push_u64(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// `name: value\r\n`.
fn push_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The app's answer head, owned.
struct Answer {
    status: u16,
    /// The fields the client gets, each `name: value\r\n`.
    head: Vec<u8>,
    has_date: bool,
    framing: Framing,
    /// The app keeps the connection open after it.
    reusable: bool,
    /// A holder's `X-Rolegate-Refused` (never passed on).
    refused: Option<Vec<u8>>,
}

/// The client's response head: the status line, the app's fields but the
/// hop-by-hop ones, `Date` when the app sent none (as hyper adds it), and
/// `Connection: close` when the connection ends after it.
fn client_head(out: &mut Vec<u8>, resp: &Answer, closing: bool) {
    let status = http::StatusCode::from_u16(resp.status).ok();
    out.extend_from_slice(b"HTTP/1.1 ");
    push_u64(out, u64::from(resp.status));
    out.push(b' ');
    out.extend_from_slice(
        status
            .and_then(|s| s.canonical_reason())
            .unwrap_or("<none>")
            .as_bytes(),
    );
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&resp.head);
    if !resp.has_date {
        push_field(
            out,
            b"date",
            httpdate::fmt_http_date(std::time::SystemTime::now()).as_bytes(),
        );
    }
    if closing {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The connections a client connection keeps for its next requests: one
/// to the app, one to a holder's gateway.
#[derive(Default)]
struct Hops {
    app: Option<AppConn>,
    holder: Option<AppConn>,
}

/// A connection to the app or a holder, and its read buffer.
struct AppConn {
    stream: TcpStream,
    /// The holder's `host:port` it goes to; None for the app.
    to: Option<String>,
    buf: BytesMut,
    /// Its place among the worker's kept connections; without one it
    /// closes after its exchange.
    kept: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Gives back what a write held of the budget, however it ended.
struct Release<'a>(&'a Meter);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.budget.release(self.0.id);
    }
}

/// A connection's share of the process's unread-bytes budget.
struct Meter {
    budget: Arc<UnreadBudget>,
    /// Told when this connection has waited longest with the budget full.
    evict: Arc<tokio::sync::Notify>,
    id: u64,
}

impl AppConn {
    /// Sends `head` and reads the answer's head (skipping interim answers).
    async fn ask(&mut self, head: &[u8], asked: Asked, limit: Duration) -> Result<Answer, Failure> {
        if let Err(e) = self.stream.write_all(head).await {
            return Err(match e.kind() {
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                    Failure::ClosedUnanswered
                }
                _ => Failure::Broken(e.to_string()),
            });
        }
        let deadline = tokio::time::Instant::now() + limit;
        let mut any = false;
        loop {
            if !self.buf.is_empty() {
                let mut slots = head::header_slots();
                match head::parse_response(&self.buf, &mut slots, asked) {
                    Ok(Parsed::Complete(head::Response::Interim(n))) => {
                        self.buf.advance(n);
                        continue;
                    }
                    Ok(Parsed::Complete(head::Response::Head(r))) => {
                        if r.status == 101 {
                            return Err(Failure::Unasked101);
                        }
                        let answer = answer_of(&r);
                        self.buf.advance(r.len);
                        return Ok(answer);
                    }
                    Ok(Parsed::Partial) if self.buf.len() < crate::http1::MAX_RESPONSE_HEAD => {}
                    Ok(Parsed::Partial) => {
                        return Err(Failure::Broken("the answer's head is too large".into()))
                    }
                    Err(e) => return Err(Failure::Broken(format!("bad answer head: {e:?}"))),
                }
            }
            self.room(false);
            let read = tokio::select! {
                r = self.stream.read_buf(&mut self.buf) => r,
                _ = tokio::time::sleep_until(deadline) => return Err(Failure::Timeout),
            };
            match read {
                // The head was written: the app may have run it, so it is
                // never sent again, whatever the method.
                Ok(0) if !any => {
                    return Err(Failure::Broken(
                        "the app closed the connection before answering".into(),
                    ))
                }
                Ok(0) => return Err(Failure::Broken("the app closed mid-answer".into())),
                Err(e) => return Err(Failure::Broken(e.to_string())),
                Ok(_) => any = true,
            }
        }
    }

    /// Writes `head` to the client, then the body as framed.
    async fn relay(
        &mut self,
        mut client: Within<'_>,
        mut head: Vec<u8>,
        framing: Framing,
        idle: Duration,
    ) -> io::Result<()> {
        let client = &mut client;
        match framing {
            Framing::Empty => client.write_all(&head).await,
            Framing::Length(n) => {
                let mut left = n;
                let now = (self.buf.len() as u64).min(left) as usize;
                head.extend_from_slice(&self.buf[..now]);
                self.buf.advance(now);
                left -= now as u64;
                client.write_all(&head).await?;
                drop(head);
                while left > 0 {
                    self.fill(idle, left > CHUNK as u64).await?;
                    let now = (self.buf.len() as u64).min(left) as usize;
                    client.write_all(&self.buf[..now]).await?;
                    self.buf.advance(now);
                    left -= now as u64;
                }
                Ok(())
            }
            Framing::Chunked => {
                client.write_all(&head).await?;
                drop(head);
                let mut decoder = crate::http1::chunked::Decoder::new();
                loop {
                    if !self.buf.is_empty() {
                        let step = decoder
                            .step(&self.buf)
                            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.0))?;
                        if step.used > 0 {
                            client.write_all(&self.buf[..step.used]).await?;
                            self.buf.advance(step.used);
                        }
                        if step.done {
                            return Ok(());
                        }
                        if step.used > 0 {
                            continue;
                        }
                    }
                    self.fill(idle, true).await?;
                }
            }
            Framing::UntilClose => {
                client.write_all(&head).await?;
                drop(head);
                loop {
                    if !self.buf.is_empty() {
                        client.write_all(&self.buf).await?;
                        self.buf.clear();
                    }
                    match self.fill(idle, true).await {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }

    /// Room to read into: a pooled buffer when it has none, a large one
    /// when `big` (a body that has more to come than a small buffer holds:
    /// one read and one write move up to 64 KiB of it, where 8 KiB at a
    /// time cost eight of each).
    fn room(&mut self, big: bool) {
        if self.buf.capacity() == 0 {
            self.buf = if big { pool::take_big() } else { pool::take() };
        } else if self.buf.capacity() - self.buf.len() < CHUNK / 2 {
            self.buf.reserve(if big { pool::BIG } else { CHUNK });
        }
    }

    /// Reads more of the answer; the end of the stream is an error here.
    async fn fill(&mut self, idle: Duration, big: bool) -> io::Result<()> {
        if self.buf.is_empty() {
            // Nothing held while waiting: a stream between events keeps
            // no buffer.
            pool::give(&mut self.buf);
            tokio::time::timeout(idle, self.stream.readable())
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "idle"))??;
        }
        self.room(big);
        let n = tokio::time::timeout(idle, self.stream.read_buf(&mut self.buf))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "idle"))??;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the app closed",
            ));
        }
        Ok(())
    }
}

/// Answer fields the client never gets: the hop-by-hop ones (but
/// `Transfer-Encoding`, which frames what is moved) and the hop refusal,
/// which only a gateway may send.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "upgrade",
    "proxy-authenticate",
    "proxy-authorization",
    "http2-settings",
];

/// Writes that fail when the client takes nothing for `idle` (a client
/// that never reads holds no connection past the idle timeout).
struct Within<'a> {
    io: tokio::net::tcp::WriteHalf<'a>,
    idle: Duration,
    meter: Option<&'a Meter>,
}

impl Within<'_> {
    async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        let Some(meter) = self.meter else {
            return self.write_unmetered(bytes).await;
        };
        // What the connection takes at once waits on no client: only the
        // rest is held against the budget, while it waits. (A client that
        // reads is then seldom a holder, so not the one closed when
        // clients that never read fill the budget.)
        let taken = match self.io.try_write(bytes) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(e),
        };
        let left = &bytes[taken..];
        if left.is_empty() {
            return Ok(());
        }
        meter.budget.hold(meter.id, left.len(), &meter.evict);
        let _held = Release(meter);
        let mut left = left;
        while !left.is_empty() {
            let n = self.write_some(left).await?;
            left = &left[n..];
            if n > 0 && !left.is_empty() {
                // The client took some: it has waited only since now (a
                // client that reads, however slowly, is not the longest
                // waiting; one that never reads stays it).
                meter.budget.hold(meter.id, left.len(), &meter.evict);
            }
        }
        Ok(())
    }

    /// One write, failing when the client takes nothing for `idle`.
    async fn write_some(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let n = tokio::time::timeout(self.idle, self.io.write(bytes))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the client read nothing"))??;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        Ok(n)
    }

    async fn write_unmetered(&mut self, bytes: &[u8]) -> io::Result<()> {
        let mut left = bytes;
        while !left.is_empty() {
            let n = self.write_some(left).await?;
            left = &left[n..];
        }
        Ok(())
    }
}

/// The owned answer of a parsed head: its fields but the hop-by-hop ones
/// and those `Connection` names.
fn answer_of(r: &head::ResponseHead<'_, '_>) -> Answer {
    let mut named: Vec<&[u8]> = Vec::new();
    let mut reusable = r.version == Version::Http11;
    for f in r.headers {
        if f.name.eq_ignore_ascii_case("connection") {
            for token in f.value.split(|b| *b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    reusable = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && r.version == Version::Http10
                {
                    reusable = true;
                } else if !token.is_empty()
                    && !token.eq_ignore_ascii_case(b"content-length")
                    && !token.eq_ignore_ascii_case(b"transfer-encoding")
                {
                    // The framing fields stay as framing says (below): the
                    // body is moved as they frame it.
                    named.push(token);
                }
            }
        }
    }
    let mut head = Vec::with_capacity(256);
    let mut has_date = false;
    let mut refused = None;
    let chunked = r.framing == Framing::Chunked;
    for f in r.headers {
        let name = f.name;
        // The body is moved as framed: a chunked one keeps its chunks and
        // its `Transfer-Encoding`, and a `Content-Length` beside it (which
        // chunked framing overrides) is dropped, as hyper drops it.
        let framing_field = if name.eq_ignore_ascii_case("transfer-encoding") {
            !chunked
        } else {
            chunked && name.eq_ignore_ascii_case("content-length")
        };
        if name.eq_ignore_ascii_case("x-rolegate-refused") {
            refused.get_or_insert_with(|| f.value.to_vec());
            continue;
        }
        if framing_field
            || HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
            || named
                .iter()
                .any(|n| n.eq_ignore_ascii_case(name.as_bytes()))
        {
            continue;
        }
        has_date |= name.eq_ignore_ascii_case("date");
        push_field(&mut head, name.as_bytes(), f.value);
    }
    Answer {
        status: r.status,
        head,
        has_date,
        framing: r.framing,
        reusable,
        refused,
    }
}

/// Writes a problem answer to the client; to a `HEAD`, its head only.
async fn write_answer(
    client: &mut TcpStream,
    problem: Problem,
    retry_after: u64,
    (closing, head_only): (bool, bool),
) -> io::Result<()> {
    use http_body_util::BodyExt;
    let resp = problem.into_response(retry_after);
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(parts.status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (n, v) in &parts.headers {
        push_field(&mut out, n.as_str().as_bytes(), v.as_bytes());
    }
    push_field(
        &mut out,
        b"content-length",
        body.len().to_string().as_bytes(),
    );
    push_field(
        &mut out,
        b"date",
        httpdate::fmt_http_date(std::time::SystemTime::now()).as_bytes(),
    );
    if closing {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !head_only {
        out.extend_from_slice(&body);
    }
    client.write_all(&out).await
}

/// A connection handed to hyper with the bytes already read from it in
/// front: hyper reads them first, as if nothing had been read.
pub(crate) struct Prefixed {
    head: bytes::Bytes,
    io: TcpStream,
    /// A whole HTTP/1.1 request head was read on it: it is HTTP/1.1.
    served: bool,
}

impl Prefixed {
    /// Whether a whole HTTP/1.1 request head was read on this connection
    /// before it was handed on (the fast path may have answered it).
    pub(crate) fn served(&self) -> bool {
        self.served
    }
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.head.is_empty() {
            let n = self.head.len().min(buf.remaining());
            buf.put_slice(&self.head[..n]);
            self.head.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
