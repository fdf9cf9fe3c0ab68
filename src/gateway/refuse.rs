//! The gateway's first layer: requests that cannot be routed safely are
//! refused before routing (the gateway and the app must never read one
//! request two ways), and `OPTIONS *` is answered here.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use futures_util::future::{ready, Either, Ready};
use http::{Request, Response};
use tower::Service;

use crate::proxy::gate::{GateSettings, Outcome};
use crate::proxy::headers::carries_hop_marker;
use crate::proxy::problem::{Problem, Reason};
use crate::proxy::stack::ConnectionFacts;
use crate::proxy::stack::{answer, with_outcome};

/// Refuses what cannot be routed safely (400/405), and, with
/// `peers.require_client_cert`, a hop marker without a peer certificate.
#[derive(Clone)]
pub(crate) struct Refuse<S> {
    inner: S,
    settings: Arc<GateSettings>,
    /// `peers.require_client_cert`: hop-marked requests need a verified peer.
    hops_need_peer_cert: bool,
}

impl<S> Refuse<S> {
    pub(crate) fn new(settings: Arc<GateSettings>, hops_need_peer_cert: bool, inner: S) -> Self {
        Self {
            inner,
            settings,
            hops_need_peer_cert,
        }
    }

    /// With `peers.require_client_cert`, a request carrying a hop marker on a
    /// connection without a peer certificate is refused before any hop
    /// handling: no signature check, no forwarding, never the app.
    fn unverified_hop(&self, req: &Request<Body>) -> Option<Problem> {
        if !self.hops_need_peer_cert || !carries_hop_marker(req.headers()) {
            return None;
        }
        // No facts about the connection: no certificate to go by (closed).
        let facts = req.extensions().get::<ConnectionFacts>();
        if facts.is_some_and(|f| f.verified_peer) {
            return None;
        }
        tracing::debug!(client = ?facts.map(|f| f.client), "hop-marked request without a peer certificate refused");
        Some(Problem::new(
            Reason::PeerCertificateRequired,
            "a request marked as a gateway hop must come with a peer gateway's client certificate",
        ))
    }
}

impl<S> Service<Request<Body>> for Refuse<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Either<Ready<Result<Response<Body>, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        if let Some(problem) = self.unverified_hop(&req) {
            return Either::Left(ready(Ok(answer(&self.settings, problem))));
        }
        if req.method() == http::Method::OPTIONS && req.uri().path() == "*" {
            // A server-wide capability probe: answered here, gating nothing.
            let mut resp = Response::new(Body::empty());
            resp.headers_mut().insert(
                http::header::ALLOW,
                http::HeaderValue::from_static("GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS"),
            );
            return Either::Left(ready(Ok(with_outcome(resp, Outcome::Passthrough))));
        }
        if let Some(problem) = authority_to_host(&mut req).or_else(|| refuse_request(&req)) {
            return Either::Left(ready(Ok(answer(&self.settings, problem))));
        }
        Either::Right(self.inner.call(req))
    }
}

/// An HTTP/2 request names its authority in `:authority`; the app behind
/// may speak HTTP/1.1 and read `Host`. So `Host` is filled from
/// `:authority`, and a request whose two differ (compared ignoring ASCII
/// case), or whose authority carries user information, is refused: the
/// gateway and the app must not see two different hosts.
fn authority_to_host(req: &mut Request<Body>) -> Option<Problem> {
    if req.version() != http::Version::HTTP_2 {
        return None;
    }
    // HTTP/2 may split Cookie into several fields; an HTTP/1.1 app expects
    // one (RFC 9113 8.2.3), joined with "; ".
    join_cookies(req.headers_mut());
    // An HTTP/2 client always takes trailers (gRPC needs them), so the next
    // hop may send them even when it speaks HTTP/1.1.
    req.headers_mut()
        .insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    let authority = req.uri().authority().map(|a| a.as_str().to_owned());
    let Some(authority) = authority else {
        return None; // refuse_request wants a Host, as for HTTP/1.1
    };
    if authority.contains('@') || authority.is_empty() {
        return Some(Problem::new(
            Reason::BadRequest,
            ":authority may not carry user information",
        ));
    }
    let mut hosts = req.headers().get_all(http::header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (None, _) => {
            let value = http::HeaderValue::from_str(&authority).ok()?;
            req.headers_mut().insert(http::header::HOST, value);
            None
        }
        (Some(h), None) if h.as_bytes().eq_ignore_ascii_case(authority.as_bytes()) => None,
        (Some(_), None) => Some(Problem::new(
            Reason::BadRequest,
            "Host and :authority name different hosts",
        )),
        // Two Host fields: refuse_request answers.
        (Some(_), Some(_)) => None,
    }
}

/// Joins several `Cookie` fields into one, separated by `"; "`.
fn join_cookies(headers: &mut http::HeaderMap) {
    let mut all = headers.get_all(http::header::COOKIE).iter();
    let (Some(_), Some(_)) = (all.next(), all.next()) else {
        return;
    };
    let joined: Vec<&[u8]> = (headers.get_all(http::header::COOKIE).iter())
        .map(|v| v.as_bytes())
        .collect();
    if let Ok(v) = http::HeaderValue::from_bytes(&joined.join(&b"; "[..])) {
        headers.insert(http::header::COOKIE, v);
    }
}

/// Requests refused before routing: `CONNECT` (405), a target that is not a
/// path (400; `OPTIONS *` is answered before this, in `Refuse::call`), two `Host`
/// fields, or an HTTP/1.1 request without one (400).
pub(super) fn refuse_request(req: &Request<Body>) -> Option<Problem> {
    if req.method() == http::Method::CONNECT {
        return Some(Problem::new(
            Reason::MethodNotAllowed,
            "CONNECT is not supported",
        ));
    }
    if !req.uri().path().starts_with('/') {
        return Some(Problem::new(
            Reason::BadRequest,
            "the request target must be a path starting with /",
        ));
    }
    let mut hosts = req.headers().get_all(http::header::HOST).iter();
    // An HTTP/2 request got its Host from `:authority` above.
    let http11 = matches!(
        req.version(),
        http::Version::HTTP_11 | http::Version::HTTP_2
    );
    match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => {
            return Some(Problem::new(
                Reason::BadRequest,
                "the request has more than one Host field",
            ))
        }
        (None, _) if http11 => {
            return Some(Problem::new(
                Reason::BadRequest,
                "an HTTP/1.1 request needs a Host field (HTTP/2: :authority)",
            ))
        }
        (Some(h), None) if http11 && h.is_empty() => {
            return Some(Problem::new(
                Reason::BadRequest,
                "an HTTP/1.1 request needs a non-empty Host field",
            ))
        }
        // A Host that is no authority would reach the app as sent over an
        // HTTP/1.1 hop but be replaced over an HTTP/2 one: refused either way.
        (Some(h), None)
            if !h.is_empty()
                && (h.as_bytes().contains(&b'@')
                    || http::uri::Authority::try_from(h.as_bytes()).is_err()) =>
        {
            return Some(Problem::new(
                Reason::BadRequest,
                "Host is not a host[:port] authority",
            ))
        }
        _ => {}
    }
    // `Connection` may not name the fields that frame or address the request:
    // stripping them would change what the app sees (its Host above all).
    let framing = [
        http::header::HOST,
        http::header::CONTENT_LENGTH,
        http::header::TRANSFER_ENCODING,
    ];
    let names_framing = req
        .headers()
        .get_all(http::header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .filter_map(|t| http::HeaderName::from_bytes(t.trim_ascii()).ok())
        .any(|n| framing.contains(&n));
    names_framing.then(|| {
        Problem::new(
            Reason::BadRequest,
            "Connection may not name Host, Content-Length or Transfer-Encoding",
        )
    })
}
