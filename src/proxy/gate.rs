//! The holder decision (docs/proxy.md), shared by the gateway and the tower
//! layers: missing key → 400; held here → local; already forwarded → 503;
//! holder unknown or this instance → 503; else forward one hop.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use http::{HeaderMap, Request, Response, Uri};

#[cfg(feature = "gateway")]
use super::forward::HopContext;
use super::forward::{add_forwarding_fields, ForwardError, Forwarder, HopProtocol};
use super::headers::{HOP, REFUSED};
use super::hold::{HeldSlot, Holds};
use super::hop::{HopRefusal, HopSigner};
use super::keys::{FormBody, KeyError, KeyExtractor};
use super::problem::{is_grpc, Problem, Reason};
use super::trust::{is_trusted, Cidr};
use crate::lease::{HeldLease, LocalWork, RoleLease, RolePartition};

/// Counts a refused hop marker and warns at most once a minute (any client
/// can send a bad marker, so the log must not grow with them).
fn refused_hop(why: HopRefusal, client: Option<SocketAddr>) {
    metrics::counter!(crate::telemetry::HOPS_REFUSED, "reason" => why.as_str()).increment(1);
    let gate = crate::telemetry::request_warnings();
    let every = std::time::Duration::from_secs(60);
    if let Some(suppressed) = gate.admit("hop-refused", every, std::time::Instant::now()) {
        let peer = client.map_or_else(|| "unknown".to_string(), |c| c.to_string());
        tracing::warn!(
            peer = %peer,
            reason = why.as_str(),
            suppressed,
            "refused a hop marker from {peer} ({}); the request is served as a fresh one. Is proxy.cluster_secret the same on every gateway?",
            why.as_str()
        );
    }
}

/// What a route is gated by.
#[derive(Clone)]
pub(crate) enum GateTarget {
    Role(RoleLease),
    Partition {
        partition: RolePartition,
        scope: Option<Arc<str>>,
        key: KeyExtractor,
        /// Whether a form body is read for a query key.
        body: FormBody,
    },
}

/// The outcome of the decision for one request.
#[derive(Debug)]
pub(crate) enum Decision {
    Local(HeldLease, LocalWork),
    Forward { address: Arc<str>, role: Arc<str> },
    Reject(Problem),
}

impl GateTarget {
    /// Why this instance does not contend, when it was withdrawn with a reason.
    fn withdrawal(&self) -> Option<Arc<str>> {
        match self {
            GateTarget::Role(lease) => lease.withdrawal(),
            GateTarget::Partition { partition, .. } => partition.withdrawal(),
        }
    }

    /// Wakes on every snapshot the coordinator publishes.
    fn subscribe_published(&self) -> tokio::sync::watch::Receiver<u64> {
        match self {
            GateTarget::Role(lease) => lease.subscribe_published(),
            GateTarget::Partition { partition, .. } => partition.subscribe_published(),
        }
    }

    fn store_unread(&self) -> Option<Option<Arc<str>>> {
        match self {
            GateTarget::Role(lease) => lease.store_unread(),
            GateTarget::Partition { partition, .. } => partition.store_unread(),
        }
    }

    /// Why no holder is known: the store not read yet (with its last
    /// error), this instance withdrawn, or simply none live.
    fn no_holder(&self, role: &str) -> String {
        if let Some(last) = self.store_unread() {
            let last = last
                .as_deref()
                .unwrap_or("none yet, the first call is under way");
            return format!(
                "this gateway has not read the lease store yet (last error: {last}); role `{role}` has no holder it knows of"
            );
        }
        match self.withdrawal() {
            Some(why) => format!(
                "role `{role}` has no live holder right now; this instance does not contend for it: {why}"
            ),
            None => format!("role `{role}` has no live holder right now"),
        }
    }

    /// The role's or the partition's name.
    #[cfg(feature = "gateway")]
    pub(crate) fn name(&self) -> Arc<str> {
        match self {
            GateTarget::Role(lease) => lease.name().clone(),
            GateTarget::Partition { partition, .. } => partition.name().clone(),
        }
    }

    fn partition_name(&self) -> Option<Arc<str>> {
        match self {
            GateTarget::Role(_) => None,
            GateTarget::Partition { partition, .. } => Some(partition.name().clone()),
        }
    }

    /// Decides from the local snapshot only; no I/O.
    pub(crate) fn decide(&self, uri: &Uri, headers: &HeaderMap, forwarded: bool) -> Decision {
        let (role, holder) = match self {
            GateTarget::Role(lease) => {
                if let Some((held, work)) = lease.begin_local() {
                    return Decision::Local(held, work);
                }
                let holder = lease
                    .current_holder()
                    .filter(|h| !h.here)
                    .map(|h| h.address);
                (lease.name().clone(), holder)
            }
            GateTarget::Partition {
                partition,
                scope,
                key,
                ..
            } => {
                if let Some(problem) = mismatch_problem(partition) {
                    return Decision::Reject(problem);
                }
                let k = match key.extract(uri, headers) {
                    Ok(k) => k,
                    Err(e) => return Decision::Reject(key_problem(partition, key, e)),
                };
                let r = match scope {
                    Some(s) => partition.resolve_scoped(s, &k),
                    None => partition.resolve(&k),
                };
                // Every reading the app might apply must land here too.
                let count = partition.count();
                let elsewhere = key.readings(uri, &k).into_iter().find(|other| {
                    crate::lease::partition_index(scope.as_deref(), other, count) != r.index
                });
                if let Some(other) = elsewhere {
                    let detail = format!(
                        "partition `{}` key ({key:?}): `{k}` and `{other}` (the same text read another way, as some apps read it) land in different roles",
                        partition.name()
                    );
                    return Decision::Reject(
                        Problem::new(Reason::AmbiguousKey, detail)
                            .partition(Some(partition.name().clone())),
                    );
                }
                if r.held {
                    if let Some((held, work)) = partition.begin_local(r.index) {
                        return Decision::Local(held, work);
                    }
                    // A handover began since the look: no holder to name yet.
                    (r.role, None)
                } else {
                    (r.role, r.holder_address)
                }
            }
        };
        let problem = |reason, detail: String| {
            Decision::Reject(
                Problem::new(reason, detail)
                    .role(Some(role.clone()))
                    .partition(self.partition_name()),
            )
        };
        if forwarded {
            return problem(
                Reason::AlreadyForwarded,
                format!(
                    "role `{role}` is not held here and the request was already forwarded once"
                ),
            );
        }
        match holder {
            Some(address) => Decision::Forward { address, role },
            None => problem(Reason::HolderUnknown, self.no_holder(&role)),
        }
    }
}

/// The 503 of a partition this instance defines differently from the
/// store's record: its keys would land on other roles than the fleet's.
fn mismatch_problem(partition: &RolePartition) -> Option<Problem> {
    let def = partition.definition()?;
    let crate::lease::DefinitionState::Mismatch { epoch, recorded } = &def.state else {
        return None;
    };
    let name = partition.name();
    let detail = format!(
        "partition `{name}` is defined here as `{}` but the lease store records `{recorded}` (epoch {epoch}); this instance neither holds nor serves its roles until it is deployed with the recorded definition",
        def.configured
    );
    Some(Problem::new(Reason::PartitionMismatch, detail).partition(Some(name.clone())))
}

/// The 400 for a partition route whose key is missing or unusable.
fn key_problem(partition: &RolePartition, key: &KeyExtractor, e: KeyError) -> Problem {
    let (reason, detail) = match e {
        KeyError::Missing => (
            Reason::MissingKey,
            format!("partition `{}` needs a key ({key:?})", partition.name()),
        ),
        KeyError::Ambiguous => (
            Reason::AmbiguousKey,
            format!("partition `{}` key ({key:?}): {e}", partition.name()),
        ),
        other => (
            Reason::BadKey,
            format!("partition `{}` key ({key:?}): {other}", partition.name()),
        ),
    };
    Problem::new(reason, detail).partition(Some(partition.name().clone()))
}

/// A gated request, settled: answered already, or to be run here under the lease.
#[derive(Debug)]
pub(crate) enum Settled {
    /// The response to send (forwarded answer, or a refusal).
    Answered(Response<Body>, Outcome),
    /// Held here: run the request locally under this lease; the work
    /// counts as running until `LocalWork` drops.
    Local(Request<Body>, HeldLease, LocalWork),
}

/// Where a failed forward was going.
#[derive(Debug, Clone, Copy)]
pub(crate) enum NextHop<'a> {
    #[cfg_attr(not(feature = "gateway"), allow(dead_code))] // only the gateway builds it
    /// The app behind this gateway.
    App {
        /// The app's base URL (logged redacted).
        upstream: &'a str,
    },
    /// The gateway of the role's holder.
    Holder {
        /// The role.
        role: &'a str,
        /// The holder's address.
        address: &'a str,
    },
}

/// The one mapping of a forwarding failure to a problem answer: the client's
/// broken body is a 400 (logged at debug), a timeout and an unreachable next
/// hop are 503s of their own reasons (logged at warn).
pub(crate) fn failure_problem(e: &ForwardError, hop: NextHop<'_>) -> Problem {
    let timeout = matches!(e, ForwardError::Timeout { .. });
    let (reason, detail) = match (e, hop) {
        (ForwardError::ClientBody, _) => {
            tracing::debug!(error = %e, "client request body failed");
            return Problem::new(Reason::BadBody, "the request body was malformed or cut off");
        }
        (ForwardError::BadUpgrade { why, .. }, NextHop::App { .. }) => (
            Reason::UpstreamBadUpgrade,
            format!("the app switched protocols unsafely: {why}; the connection is closed"),
        ),
        (ForwardError::BadUpgrade { why, .. }, NextHop::Holder { role, .. }) => (
            Reason::UpstreamBadUpgrade,
            format!(
                "the holder of role `{role}` switched protocols unsafely: {why}; the connection is closed"
            ),
        ),
        (_, NextHop::App { .. }) if timeout => (
            Reason::UpstreamTimeout,
            "the app did not answer in time".to_string(),
        ),
        (_, NextHop::App { .. }) => (
            Reason::UpstreamUnreachable,
            "the app could not be reached".to_string(),
        ),
        (_, NextHop::Holder { role, .. }) if timeout => (
            Reason::HolderTimeout,
            format!("the holder of role `{role}` did not answer in time"),
        ),
        (_, NextHop::Holder { role, .. }) => (
            Reason::HolderUnreachable,
            format!("the holder of role `{role}` could not be reached"),
        ),
    };
    // One line per cause every few seconds: a failover must not flood the log.
    let cause = match hop {
        NextHop::App { .. } => "upstream request failed",
        NextHop::Holder { .. } => "forwarding to the role holder failed",
    };
    let gate = crate::telemetry::request_warnings();
    let every = crate::telemetry::REQUEST_WARN_EVERY;
    if let Some(suppressed) = gate.admit(cause, every, std::time::Instant::now()) {
        let error = crate::redact::redact_text(&e.to_string());
        match hop {
            NextHop::App { upstream } => {
                let upstream = crate::redact::redact_url(upstream);
                tracing::warn!(%upstream, %error, suppressed, "upstream request failed");
            }
            NextHop::Holder { role, address } => {
                tracing::warn!(%role, holder = address, %error, suppressed, "forwarding to the role holder failed");
            }
        }
    }
    Problem::new(reason, detail)
}

#[cfg_attr(not(feature = "gateway"), allow(dead_code))] // only the gateway builds it
/// How a request ended, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Local,
    Forwarded,
    Passthrough,
    Rejected(Reason),
}

/// Response extension, when [`GateSettings::note`] is on: what the gate
/// learned of a gated request, for its trace span.
#[cfg_attr(not(feature = "otel"), allow(dead_code))] // only traces read it
#[derive(Debug, Clone, Default)]
pub(crate) struct GateNote {
    /// The role that gates it (a partition's role for a partition route).
    pub role: Option<Arc<str>>,
    /// The partition, for a partition route.
    pub partition: Option<Arc<str>>,
    /// Who served it: this instance's id when run here, the holder's
    /// address when forwarded.
    pub holder: Option<Arc<str>>,
    /// The fencing token it ran under here.
    pub token: Option<u64>,
    /// How long it was held waiting for a holder.
    pub held: Option<std::time::Duration>,
}

/// Request extension: this request arrived as a verified forwarded hop;
/// `signed` when it was verified with the cluster secret.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ForwardedHop {
    pub signed: bool,
}

/// Per-process settings shared by every gated request.
#[derive(Clone)]
pub(crate) struct GateSettings {
    pub instance_id: Arc<str>,
    pub signer: HopSigner,
    pub retry_after_secs: u64,
    pub forwarder: Forwarder,
    /// `proxy.upgrades`.
    pub upgrades: Arc<[String]>,
    /// `proxy.trusted_proxies`.
    pub trusted_proxies: Arc<[Cidr]>,
    /// How hops to peer gateways are spoken. gRPC always takes HTTP/2: its
    /// trailers cannot cross an HTTP/1.1 hop undeclared.
    pub peer_protocol: HopProtocol,
    /// Holding requests that have no servable holder right now.
    pub holds: Arc<Holds>,
    /// Whether gated answers carry a [`GateNote`] (traces are on).
    pub note: bool,
}

/// How one attempt to forward a request ended.
enum Attempt {
    /// Answered (by the holder, or with a refusal of our own).
    Answered(Response<Body>, Outcome),
    /// Nothing of the request left this gateway, or the holder refused it
    /// before reading any of it: it may go to the next holder.
    NotSent(Request<Body>, Problem),
}

/// The method a refusal is signed over (the hop marker signs the method).
fn refusal_method(method: &http::Method) -> String {
    format!("REFUSED {method}")
}

impl GateSettings {
    /// Whether the peer's forwarding fields may be kept: it is a trusted
    /// proxy, or the request is a hop verified with the cluster secret.
    pub(crate) fn trusts(&self, req: &Request<Body>, client: Option<SocketAddr>) -> bool {
        req.extensions()
            .get::<ForwardedHop>()
            .is_some_and(|h| h.signed)
            || is_trusted(&self.trusted_proxies, client.map(|c| c.ip()))
    }

    #[cfg(feature = "gateway")]
    /// Header preparation for the next hop.
    pub(crate) fn hop_context<'a>(
        &'a self,
        trusted: bool,
        client: Option<SocketAddr>,
        to_peer: bool,
    ) -> HopContext<'a> {
        HopContext {
            client,
            by: &self.instance_id,
            trusted,
            upgrades: &self.upgrades,
            to_peer,
        }
    }

    #[cfg(feature = "gateway")]
    /// Whether `value` is the signed refusal of the holder a request with
    /// `method` and `target` went to (it did not read the request).
    pub(crate) fn verify_refusal(
        &self,
        value: &http::HeaderValue,
        method: &str,
        target: &str,
    ) -> bool {
        let method = http::Method::from_bytes(method.as_bytes());
        method.is_ok_and(|m| self.signer.verify(value, &refusal_method(&m), target))
    }

    /// Whether the request carries a hop marker that counts; a marker that
    /// does not verify is removed, and the request is treated as fresh.
    /// A refused marker is counted and, at most once a minute, logged with
    /// the peer (`client`): a `cluster_secret` that differs between gateways
    /// shows here, not only as hops treated as fresh requests.
    pub(crate) fn take_hop(&self, req: &mut Request<Body>, client: Option<SocketAddr>) -> bool {
        // Seen already by an outer layer of this process (the marker is gone).
        if req.extensions().get::<ForwardedHop>().is_some() {
            return true;
        }
        // This instance already passed the request on (its id in a `Via`
        // comment): a loop, whatever the secrets say; never forward again.
        // Without a secret, two rolegate hops behind us count as a loop too.
        let looped = super::headers::passed_through(req.headers(), &self.instance_id)
            || (!self.signer.is_signed() && super::headers::rolegate_hops(req.headers()) >= 2);
        let Some(value) = req.headers().get(HOP) else {
            return looped;
        };
        let path = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let checked = self.signer.check(value, req.method().as_str(), path);
        let ok = checked.is_ok();
        match checked {
            Ok(()) => {
                let signed = self.signer.is_signed();
                req.extensions_mut().insert(ForwardedHop { signed });
            }
            Err(why) => {
                refused_hop(why, client);
                req.headers_mut().remove(HOP);
            }
        }
        ok || looped
    }

    /// Forwards one hop to the holder's gateway. With holding on, a request
    /// that provably did not leave (the connection failed, or the holder
    /// refused it unread) comes back to be held and sent elsewhere.
    async fn forward_once(
        &self,
        req: Request<Body>,
        client: Option<SocketAddr>,
        address: &str,
        role: Arc<str>,
        partition: Option<Arc<str>>,
    ) -> Attempt {
        if self.holds.timeout.is_zero() {
            let (resp, outcome) = self
                .forward_to_holder(req, client, address, role, partition)
                .await;
            return Attempt::Answered(resp, outcome);
        }
        // What is needed to send the request again, taken before the hop's
        // headers are added.
        let (parts, body) = req.into_parts();
        let again = Request::builder()
            .method(parts.method.clone())
            .uri(parts.uri.clone())
            .version(parts.version);
        let headers = parts.headers.clone();
        let extensions = (
            parts
                .extensions
                .get::<super::forward::ArrivedOverTls>()
                .copied(),
            parts.extensions.get::<ForwardedHop>().copied(),
        );
        let method = parts.method.clone();
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/".into());
        // A hop with a body waits for the holder's admission (`100 Continue`).
        let await_admission = !http_body::Body::is_end_stream(&body)
            && self.peer_protocol == HopProtocol::Http1
            && !is_grpc(&parts.headers);
        let patience = self.forwarder.admission_patience();
        let (body, reclaim) = super::hold::Reclaim::new(body, await_admission, patience);
        let mut req = Request::from_parts(parts, Body::new(body));
        if await_admission {
            req.headers_mut().insert(
                http::header::EXPECT,
                http::HeaderValue::from_static("100-continue"),
            );
            let admitted = reclaim.clone();
            hyper::ext::on_informational(&mut req, move |res| {
                if res.status() == http::StatusCode::CONTINUE {
                    admitted.admit();
                }
            });
        }
        let answer = self.forward_raw(req, client, address).await;
        let unsent = |problem: Problem| {
            let body = reclaim.take_back()?;
            let mut req = again.body(body).ok()?;
            *req.headers_mut() = headers.clone();
            if let Some(tls) = extensions.0 {
                req.extensions_mut().insert(tls);
            }
            if let Some(hop) = extensions.1 {
                req.extensions_mut().insert(hop);
            }
            Some(Attempt::NotSent(req, problem))
        };
        let hop = NextHop::Holder {
            role: &role,
            address,
        };
        match answer {
            Err(e @ ForwardError::Connect { .. }) if !reclaim.is_taken() => {
                let problem = failure_problem(&e, hop)
                    .role(Some(role.clone()))
                    .partition(partition.clone());
                if let Some(a) = unsent(problem.clone()) {
                    return a;
                }
                let (resp, outcome) = self.reject(problem);
                Attempt::Answered(resp, outcome)
            }
            Err(e) => {
                tracing::debug!(error = %e, sent = reclaim.is_taken(), "hop failed; not sent again");
                let (resp, outcome) = self.reject(
                    failure_problem(&e, hop)
                        .role(Some(role.clone()))
                        .partition(partition),
                );
                Attempt::Answered(resp, outcome)
            }
            Ok(mut resp) => {
                let refused = resp.headers_mut().remove(REFUSED);
                let verified = refused
                    .is_some_and(|v| self.signer.verify(&v, &refusal_method(&method), &path));
                if verified && resp.status() == http::StatusCode::SERVICE_UNAVAILABLE {
                    let problem = Problem::new(
                        Reason::HolderUnknown,
                        format!("role `{role}` is moving; its last holder no longer admits it"),
                    )
                    .role(Some(role.clone()))
                    .partition(partition);
                    if let Some(a) = unsent(problem) {
                        return a;
                    }
                }
                Attempt::Answered(resp, Outcome::Forwarded)
            }
        }
    }

    /// One hop to `address`, as prepared for a peer: the gate sanitized
    /// the request's fields before it settled (for a layer, keeping the
    /// forwarding fields, which are judged again here).
    async fn forward_raw(
        &self,
        mut req: Request<Body>,
        client: Option<SocketAddr>,
        address: &str,
    ) -> Result<Response<Body>, ForwardError> {
        // The gate sanitized the fields; a layer kept the client's
        // forwarding fields for its own app, which a peer must not take on
        // an untrusted client's word.
        if !self.trusts(&req, client) {
            super::headers::strip_untrusted_forwarding(req.headers_mut());
        }
        add_forwarding_fields(&mut req, client, &self.instance_id, true);
        let path = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
            .to_owned();
        if let Some(marker) = self
            .signer
            .marker(&self.instance_id, req.method().as_str(), &path)
        {
            req.headers_mut().insert(HOP, marker);
        }
        let protocol = if is_grpc(req.headers()) {
            HopProtocol::Http2
        } else {
            self.peer_protocol
        };
        self.forwarder.proxy_to_peer(req, address, protocol).await
    }

    /// Forwards one hop to the holder's gateway; failures become 503s.
    pub(crate) async fn forward_to_holder(
        &self,
        req: Request<Body>,
        client: Option<SocketAddr>,
        address: &str,
        role: Arc<str>,
        partition: Option<Arc<str>>,
    ) -> (Response<Body>, Outcome) {
        match self.forward_raw(req, client, address).await {
            Ok(mut resp) => {
                // Holding is off: a refusal is answered as it came, unmarked.
                resp.headers_mut().remove(REFUSED);
                (resp, Outcome::Forwarded)
            }
            Err(e) => {
                let hop = NextHop::Holder {
                    role: &role,
                    address,
                };
                self.reject(
                    failure_problem(&e, hop)
                        .role(Some(role.clone()))
                        .partition(partition),
                )
            }
        }
    }

    /// Settles a gated request: answers it (forwarded to the holder, or
    /// refused), or hands it back with the lease to run it here. A request
    /// with no servable holder right now is held until the view names one
    /// (see [`super::hold`]).
    pub(crate) async fn settle(
        &self,
        target: &GateTarget,
        mut req: Request<Body>,
        client: Option<SocketAddr>,
        forwarded: bool,
        mut note: Option<&mut GateNote>,
    ) -> Settled {
        let mut held: Option<HeldSlot> = None;
        let mut held_since: Option<std::time::Instant> = None;
        let mut views = target.subscribe_published();
        let deadline = crate::lease::deadline_after(self.holds.timeout);
        loop {
            // Seen before deciding: a change after this wakes the hold below.
            views.borrow_and_update();
            let decision = target.decide(req.uri(), req.headers(), forwarded);
            if let Some(n) = note.as_deref_mut() {
                n.note(&decision, self, held_since);
            }
            let problem = match decision {
                Decision::Local(lease, work) => {
                    if let Some(h) = held.take() {
                        h.done("held_then_local");
                    }
                    return Settled::Local(req, lease, work);
                }
                Decision::Forward { address, role } => {
                    let started = std::time::Instant::now();
                    let partition = target.partition_label();
                    let attempt = self
                        .forward_once(req, client, &address, role, partition)
                        .await;
                    crate::telemetry::request_metrics()
                        .forward_holder
                        .record(started.elapsed().as_secs_f64());
                    match attempt {
                        Attempt::Answered(resp, outcome) => {
                            if let Some(h) = held.take() {
                                h.done("held_then_forwarded");
                            }
                            return Settled::Answered(resp, outcome);
                        }
                        Attempt::NotSent(back, problem) => {
                            req = back;
                            problem
                        }
                    }
                }
                Decision::Reject(p) if p.reason == Reason::HolderUnknown => p,
                Decision::Reject(p) => {
                    if let Some(h) = held.take() {
                        h.done("held_then_refused");
                    }
                    let (p, refused) = self.refusal(p, &req);
                    let (mut resp, outcome) = self.reject(p);
                    if let Some(v) = refused {
                        resp.headers_mut().insert(REFUSED, v);
                    }
                    return Settled::Answered(resp, outcome);
                }
            };
            if self.holds.timeout.is_zero() {
                let (resp, outcome) = self.reject(problem);
                return Settled::Answered(resp, outcome);
            }
            if held.is_none() {
                let role = problem.role.clone().unwrap_or_else(|| Arc::from("?"));
                match self.holds.enter(role) {
                    Some(slot) => {
                        held = Some(slot);
                        held_since = Some(std::time::Instant::now());
                    }
                    None => {
                        metrics::counter!(crate::telemetry::HOLD_OUTCOMES, "outcome" => "hold_full")
                            .increment(1);
                        let (resp, outcome) = self.reject(problem);
                        return Settled::Answered(resp, outcome);
                    }
                }
            }
            tokio::select! {
                changed = views.changed() => {
                    if changed.is_err() {
                        if let Some(n) = note.as_deref_mut() {
                            n.held = held_since.map(|t| t.elapsed());
                        }
                        if let Some(h) = held.take() {
                            h.done("held_then_refused");
                        }
                        let (resp, outcome) = self.reject(problem);
                        return Settled::Answered(resp, outcome);
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    if let Some(n) = note.as_deref_mut() {
                        n.held = held_since.map(|t| t.elapsed());
                    }
                    if let Some(h) = held.take() {
                        h.done("hold_timeout");
                    }
                    let (resp, outcome) = self.reject(problem);
                    return Settled::Answered(resp, outcome);
                }
            }
        }
    }

    /// A refusal of a forwarded hop this instance did not admit carries the
    /// signed `X-Rolegate-Refused`: the body was not read, so the forwarding
    /// gateway may hold the request for the next holder.
    fn refusal(&self, p: Problem, req: &Request<Body>) -> (Problem, Option<http::HeaderValue>) {
        let hop = req.extensions().get::<ForwardedHop>().is_some();
        if p.reason != Reason::AlreadyForwarded || !hop {
            return (p, None);
        }
        let path = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let marker = self
            .signer
            .marker(&self.instance_id, &refusal_method(req.method()), path);
        (p, marker)
    }

    /// Answers with a problem, counted as rejected for its reason.
    pub(crate) fn reject(&self, p: Problem) -> (Response<Body>, Outcome) {
        let reason = p.reason;
        (
            p.into_response(self.retry_after_secs),
            Outcome::Rejected(reason),
        )
    }
}

impl GateNote {
    /// Notes one decision (a held request is noted again each time the
    /// view changes; the last decision is the one that answered).
    fn note(
        &mut self,
        decision: &Decision,
        settings: &GateSettings,
        held_since: Option<std::time::Instant>,
    ) {
        self.held = held_since.map(|t| t.elapsed());
        match decision {
            Decision::Local(lease, _) => {
                self.role = Some(lease.role.clone());
                self.holder = Some(settings.instance_id.clone());
                self.token = Some(lease.token);
            }
            Decision::Forward { address, role } => {
                self.role = Some(role.clone());
                self.holder = Some(address.clone());
                self.token = None;
            }
            Decision::Reject(p) => {
                self.role.clone_from(&p.role);
                self.holder = None;
                self.token = None;
            }
        }
    }
}

impl GateTarget {
    pub(crate) fn partition_label(&self) -> Option<Arc<str>> {
        self.partition_name()
    }

    /// The query parameter a form body must not name, on a query-keyed
    /// route that checks bodies.
    pub(crate) fn form_key(&self) -> Option<&str> {
        match self {
            GateTarget::Partition {
                key: KeyExtractor::Query(name),
                body: FormBody::Check,
                ..
            } => Some(name),
            _ => None,
        }
    }
}
