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
    /// The request itself is unusable (e.g. no leading slash, a control
    /// byte in the decoded path, two `Host` fields).
    BadRequest,
    /// The partition key is given twice, or reads differently depending on
    /// how the app parses the request.
    BadKey,
    /// The path reads as two different gated routes.
    AmbiguousPath,
    /// The client's request body was malformed or cut off.
    BadBody,
    /// `CONNECT` is not proxied.
    MethodNotAllowed,
    /// A hop-marked request came on a connection without a peer gateway's
    /// client certificate while `peers.require_client_cert` is set.
    PeerCertificateRequired,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 13] = [
        Reason::MissingKey,
        Reason::HolderUnknown,
        Reason::HolderUnreachable,
        Reason::HolderTimeout,
        Reason::AlreadyForwarded,
        Reason::UpstreamUnreachable,
        Reason::UpstreamTimeout,
        Reason::BadRequest,
        Reason::BadKey,
        Reason::AmbiguousPath,
        Reason::BadBody,
        Reason::MethodNotAllowed,
        Reason::PeerCertificateRequired,
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
            Reason::BadRequest => "bad-request",
            Reason::BadKey => "bad-key",
            Reason::AmbiguousPath => "ambiguous-path",
            Reason::BadBody => "bad-body",
            Reason::MethodNotAllowed => "method-not-allowed",
            Reason::PeerCertificateRequired => "peer-certificate-required",
        }
    }

    /// The HTTP status it is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            Reason::MissingKey
            | Reason::BadRequest
            | Reason::BadKey
            | Reason::AmbiguousPath
            | Reason::BadBody => StatusCode::BAD_REQUEST,
            Reason::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Reason::PeerCertificateRequired => StatusCode::FORBIDDEN,
            Reason::UpstreamUnreachable => StatusCode::BAD_GATEWAY,
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
            Reason::BadRequest => "Bad request",
            Reason::BadKey => "Partition key ambiguous",
            Reason::AmbiguousPath => "Path ambiguous",
            Reason::BadBody => "Request body malformed",
            Reason::MethodNotAllowed => "Method not allowed",
            Reason::PeerCertificateRequired => "Peer certificate required",
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
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
