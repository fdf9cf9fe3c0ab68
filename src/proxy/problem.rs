//! `application/problem+json` (RFC 9457) answers: 400 for a bad request or
//! key, 403 for a hop without a peer certificate (mutual TLS), 405 for
//! `CONNECT`, 503
//! (always with an integer `Retry-After`) when this instance must not serve
//! and cannot forward, 502/504 when the local upstream fails.

use std::sync::Arc;

use axum::body::Body;
use http::{header, HeaderValue, Response, StatusCode};

/// Why a request was not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// Partition route without its key.
    MissingKey,
    /// No live holder is known, or the snapshot names this instance but it
    /// does not hold the role (expired, draining).
    HolderUnknown,
    /// Connecting to the holder failed.
    HolderUnreachable,
    /// The holder did not send a response head in time.
    HolderTimeout,
    /// The request was already forwarded once and this instance does not hold the role.
    AlreadyForwarded,
    /// The local app did not answer.
    UpstreamUnreachable,
    /// The local app did not send a response head in time.
    UpstreamTimeout,
    /// The next hop answered 101 Switching Protocols without completing the
    /// upgrade the request asked for; both connections are closed.
    UpstreamBadUpgrade,
    /// The request itself is unusable (e.g. no leading slash, a control
    /// byte in the decoded path, two `Host` fields).
    BadRequest,
    /// The partition key is given twice, or is not text once decoded.
    BadKey,
    /// The app could read the key another way and land in another
    /// partition: its readings (as sent, percent-decoded, form-decoded)
    /// disagree, a form body or a cookie names it too, an escape is
    /// malformed, or a path splits differently.
    AmbiguousKey,
    /// The path reads as two different gated routes.
    AmbiguousPath,
    /// The client's request body was malformed or cut off.
    BadBody,
    /// `CONNECT` is not proxied.
    MethodNotAllowed,
    /// This instance's definition of the partition (count, hash, scopes)
    /// differs from the one the store records: it neither holds nor serves
    /// the partition's roles.
    PartitionMismatch,
    /// The role moved (its term ended) while a local request was running.
    TermEnded,
    /// A hop-marked request came on a connection without a peer gateway's
    /// client certificate while `peers.require_client_cert` is set.
    PeerCertificateRequired,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 17] = [
        Reason::MissingKey,
        Reason::HolderUnknown,
        Reason::HolderUnreachable,
        Reason::HolderTimeout,
        Reason::AlreadyForwarded,
        Reason::UpstreamUnreachable,
        Reason::UpstreamTimeout,
        Reason::UpstreamBadUpgrade,
        Reason::BadRequest,
        Reason::BadKey,
        Reason::AmbiguousKey,
        Reason::AmbiguousPath,
        Reason::BadBody,
        Reason::MethodNotAllowed,
        Reason::PeerCertificateRequired,
        Reason::TermEnded,
        Reason::PartitionMismatch,
    ];

    /// The reason's name, as in the problem body and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::MissingKey => "missing-key",
            Reason::HolderUnknown => "holder-unknown",
            Reason::HolderUnreachable => "holder-unreachable",
            Reason::HolderTimeout => "holder-timeout",
            Reason::AlreadyForwarded => "already-forwarded",
            Reason::UpstreamUnreachable => "upstream-unreachable",
            Reason::UpstreamTimeout => "upstream-timeout",
            Reason::UpstreamBadUpgrade => "upstream-bad-upgrade",
            Reason::BadRequest => "bad-request",
            Reason::BadKey => "bad-key",
            Reason::AmbiguousKey => "ambiguous-key",
            Reason::AmbiguousPath => "ambiguous-path",
            Reason::BadBody => "bad-body",
            Reason::MethodNotAllowed => "method-not-allowed",
            Reason::PeerCertificateRequired => "peer-certificate-required",
            Reason::TermEnded => "term-ended",
            Reason::PartitionMismatch => "partition-mismatch",
        }
    }

    /// The HTTP status it is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            Reason::MissingKey
            | Reason::BadRequest
            | Reason::BadKey
            | Reason::AmbiguousKey
            | Reason::AmbiguousPath
            | Reason::BadBody => StatusCode::BAD_REQUEST,
            Reason::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Reason::PeerCertificateRequired => StatusCode::FORBIDDEN,
            Reason::UpstreamUnreachable | Reason::UpstreamBadUpgrade => StatusCode::BAD_GATEWAY,
            Reason::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn title(self) -> &'static str {
        match self {
            Reason::MissingKey => "Partition key missing",
            Reason::HolderUnknown => "No holder for this role",
            Reason::HolderUnreachable => "Role holder unreachable",
            Reason::HolderTimeout => "Role holder did not answer in time",
            Reason::AlreadyForwarded => "Request already forwarded once",
            Reason::UpstreamUnreachable => "Upstream app unreachable",
            Reason::UpstreamTimeout => "Upstream app did not answer in time",
            Reason::UpstreamBadUpgrade => "Upstream switched protocols unsafely",
            Reason::BadRequest => "Bad request",
            Reason::BadKey => "Partition key unusable",
            Reason::AmbiguousKey => "Partition key ambiguous",
            Reason::AmbiguousPath => "Path ambiguous",
            Reason::BadBody => "Request body malformed",
            Reason::MethodNotAllowed => "Method not allowed",
            Reason::PeerCertificateRequired => "Peer certificate required",
            Reason::TermEnded => "Role moved while the request ran",
            Reason::PartitionMismatch => "Partition defined differently here",
        }
    }
}

/// A problem answer under construction.
#[derive(Debug, Clone)]
pub struct Problem {
    /// Why.
    pub reason: Reason,
    /// A sentence for humans.
    pub detail: String,
    /// The role involved, when known.
    pub role: Option<Arc<str>>,
    /// The partition involved, when known.
    pub partition: Option<Arc<str>>,
}

impl Problem {
    /// A problem with a reason and a detail.
    pub fn new(reason: Reason, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
            role: None,
            partition: None,
        }
    }

    /// Names the role.
    pub fn role(mut self, role: Option<Arc<str>>) -> Self {
        self.role = role;
        self
    }

    /// Names the partition.
    pub fn partition(mut self, partition: Option<Arc<str>>) -> Self {
        self.partition = partition;
        self
    }

    /// The response; 503s carry `Retry-After: retry_after_secs`.
    pub fn into_response(self, retry_after_secs: u64) -> Response<Body> {
        let status = self.reason.status();
        let mut body = serde_json::json!({
            "type": format!("urn:rolegate:problem:{}", self.reason.as_str()),
            "title": self.reason.title(),
            "status": status.as_u16(),
            "detail": self.detail,
            "reason": self.reason.as_str(),
        });
        if let Some(role) = &self.role {
            body["role"] = serde_json::Value::String(role.to_string());
        }
        if let Some(p) = &self.partition {
            body["partition"] = serde_json::Value::String(p.to_string());
        }
        let mut resp = Response::new(Body::from(body.to_string()));
        *resp.status_mut() = status;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::METHOD_NOT_ALLOWED {
            resp.headers_mut().insert(
                header::ALLOW,
                HeaderValue::from_static("GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS"),
            );
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after_secs.max(1)),
            );
        }
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if self.reason == Reason::UpstreamBadUpgrade {
            // The client may have sent bytes meant for the tunnel after its
            // request: they must never be read as requests. (HTTP/2 servers
            // drop this field; only HTTP/1.1 upgrades a connection.)
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        let text = format!("{}: {}", self.reason.title(), self.detail);
        resp.extensions_mut().insert(ProblemText(text));
        resp
    }
}

/// The one-line text of a problem answer, kept for [`grpc_answer`].
#[cfg_attr(not(feature = "gateway"), allow(dead_code))] // only the gateway reads it
#[derive(Debug, Clone)]
struct ProblemText(String);

/// True for a gRPC request (`content-type: application/grpc[+proto|...]`).
pub(crate) fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let v = v.to_ascii_lowercase();
            v == "application/grpc"
                || v.starts_with("application/grpc+")
                || v.starts_with("application/grpc;")
        })
}

#[cfg(any(test, feature = "gateway"))]
/// A problem answer recast for a gRPC client: HTTP 200 with no body and the
/// status in `grpc-status`/`grpc-message` (a "trailers-only" response), so
/// the client sees e.g. `UNAVAILABLE` at once rather than a protocol error.
/// The code follows gRPC's own HTTP-to-gRPC table (503, 502, 504 and 429
/// are `UNAVAILABLE`); `Retry-After` and the other headers are kept.
pub(crate) fn grpc_answer(resp: Response<Body>) -> Response<Body> {
    let (mut parts, _) = resp.into_parts();
    let code: u16 = match parts.status.as_u16() {
        400 => 13,                   // INTERNAL
        401 => 16,                   // UNAUTHENTICATED
        403 => 7,                    // PERMISSION_DENIED
        404 | 405 => 12,             // UNIMPLEMENTED
        429 | 502 | 503 | 504 => 14, // UNAVAILABLE
        _ => 2,                      // UNKNOWN
    };
    let text = parts
        .extensions
        .get::<ProblemText>()
        .map(|t| t.0.clone())
        .unwrap_or_else(|| parts.status.to_string());
    parts.status = StatusCode::OK;
    let h = &mut parts.headers;
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert("grpc-status", HeaderValue::from(code));
    if let Ok(v) = HeaderValue::from_str(&grpc_percent_encode(&text)) {
        h.insert("grpc-message", v);
    }
    h.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::empty())
}

#[cfg(any(test, feature = "gateway"))]
/// gRPC's percent-encoding of `grpc-message`: every byte outside
/// printable ASCII, and `%`, as `%XX`.
fn grpc_percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_becomes_a_trailers_only_grpc_status() {
        let p = Problem::new(Reason::HolderUnknown, "no instance holds role `x` – 100%");
        let resp = grpc_answer(p.into_response(3));
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["grpc-status"], "14");
        assert_eq!(resp.headers()["content-type"], "application/grpc");
        assert_eq!(resp.headers()["retry-after"], "3");
        let msg = resp.headers()["grpc-message"].to_str().unwrap();
        assert!(
            msg.ends_with("no instance holds role `x` %E2%80%93 100%25"),
            "{msg}"
        );
        assert!(http_body::Body::is_end_stream(resp.body()));
        let mut h = http::HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc+proto"),
        );
        assert!(is_grpc(&h));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpcx"),
        );
        assert!(!is_grpc(&h));
    }

    #[test]
    fn every_reason_has_its_own_outcome_label() {
        for r in Reason::ALL {
            assert!(
                crate::telemetry::OUTCOMES.contains(&r.as_str()),
                "{} is not counted under its own label",
                r.as_str()
            );
        }
        assert_eq!(crate::telemetry::OUTCOMES.len(), 3 + Reason::ALL.len());
    }
}
