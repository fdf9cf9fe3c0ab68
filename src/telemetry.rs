//! Metric names (Prometheus style, `rolegate_` prefix) and the recorder the
//! binary installs. The library emits through the `metrics` facade; without
//! a recorder installed, emitting costs next to nothing.

#[cfg(feature = "gateway")]
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Gauge per role: 1 while held here.
pub(crate) const LEASE_HELD: &str = "rolegate_lease_held";
/// Counter per role: new terms started here.
pub(crate) const TERM_CHANGES: &str = "rolegate_lease_term_changes_total";
/// Counter: lease operations by `op` (acquire, renew, release) and `outcome`
/// (granted, denied, late, error).
pub(crate) const LEASE_OPS: &str = "rolegate_lease_operations_total";
/// Histogram: store round-trip latency by `op` (claim, snapshot, release, register).
pub(crate) const STORE_LATENCY: &str = "rolegate_store_round_trip_seconds";
/// Counter: store failures (errors and timeouts) by `op`.
pub(crate) const STORE_ERRORS: &str = "rolegate_store_errors_total";
#[cfg(feature = "gateway")]
/// Counter: proxied requests by `outcome`: local, forwarded, passthrough,
/// or the refusal's reason (the `reason` of its problem body: missing-key,
/// bad-key, holder-unknown, ...).
pub(crate) const PROXY_REQUESTS: &str = "rolegate_proxy_requests_total";
/// Histogram: time to the response head, by `target` (holder, upstream).
pub(crate) const FORWARD_LATENCY: &str = "rolegate_forward_seconds";
#[cfg(feature = "gateway")]
/// Counter: requests the gateway's HTTP/1.1 fast path answered (the rest
/// of `rolegate_proxy_requests_total` went through the full stack).
pub(crate) const FAST_PATH_REQUESTS: &str = "rolegate_fast_path_requests_total";
#[cfg(feature = "gateway")]
/// Gauge: response bodies still streaming.
pub(crate) const OPEN_STREAMS: &str = "rolegate_open_streams";
/// Gauge: upgraded (WebSocket) connections open.
pub(crate) const OPEN_UPGRADES: &str = "rolegate_open_upgrades";
#[cfg(feature = "gateway")]
/// Gauge: 1 while this instance contends for roles.
pub(crate) const CANDIDATE: &str = "rolegate_candidate";
/// Gauge: 1 while the store answers and a snapshot is loaded.
pub(crate) const READY: &str = "rolegate_ready";
/// Gauge: roles of each balanced partition held here, by `partition`.
pub(crate) const PARTITION_ROLES_HELD: &str = "rolegate_partition_roles_held";
/// Gauge: 1 while this instance's definition of a partition differs from
/// the one the store records (it then neither holds nor serves the
/// partition), by `partition`.
pub(crate) const PARTITION_MISMATCH: &str = "rolegate_partition_mismatch";
/// Gauge: live members whose route-table fingerprint differs from this
/// instance's.
pub(crate) const ROUTE_MISMATCH: &str = "rolegate_route_mismatch_members";
/// Counter: partition roles that moved by `cause`: `join` (handed to a new
/// member), `surplus` (handed over to even the shares), `leave` (taken from
/// a member that left).
pub(crate) const PARTITION_MOVES: &str = "rolegate_partition_moves_total";
/// Counter: local streams, tunnels and requests ended because the term they
/// were admitted under ended, by `role` and `reason` (handover, stop,
/// fail-close, lost, redefined).
pub(crate) const STREAMS_ENDED: &str = "rolegate_streams_ended_total";
/// Gauge: role requests held now, waiting for a servable holder.
pub(crate) const HELD_REQUESTS: &str = "rolegate_held_requests";
/// Histogram: how long held requests waited.
pub(crate) const HOLD_SECONDS: &str = "rolegate_hold_seconds";
/// Counter: how holds ended, by `outcome` (held_then_local,
/// held_then_forwarded, held_then_refused, hold_timeout, hold_full).
pub(crate) const HOLD_OUTCOMES: &str = "rolegate_hold_outcomes_total";
#[cfg(feature = "gateway")]
/// Counter: times this instance stopped contending because its app failed
/// `unhealthy_after` health probes in a row.
pub(crate) const HEALTH_WITHDRAWALS: &str = "rolegate_health_withdrawals_total";
#[cfg(feature = "gateway")]
/// Counter: upstream health probes by `outcome` (ok, fail).
pub(crate) const HEALTH_PROBES: &str = "rolegate_health_probes_total";

#[cfg(feature = "gateway")]
/// Counter: reloads of the public listener's certificate by `outcome`
/// (ok, refused: the new pair was bad and the previous one kept).
pub(crate) const TLS_RELOADS: &str = "rolegate_tls_certificate_reloads_total";
#[cfg(feature = "gateway")]
/// Counter: TLS handshakes on the public listener that failed or timed out.
pub(crate) const TLS_HANDSHAKE_FAILURES: &str = "rolegate_tls_handshake_failures_total";

/// Counter: hop markers refused by `reason`: `bad-signature` (another
/// `proxy.cluster_secret`, or a forgery), `unsigned` (the sender has no
/// secret), `stale` (signed more than 30 s from now).
pub(crate) const HOPS_REFUSED: &str = "rolegate_hops_refused_total";

#[cfg(feature = "gateway")]
/// Counter: client connections closed because the process's budget of
/// unread response bytes (`proxy.max_unread_mib`) was reached and theirs had
/// waited longest.
pub(crate) const SLOW_READERS_CLOSED: &str = "rolegate_slow_readers_closed_total";
#[cfg(feature = "gateway")]
/// Gauge: response bytes handed to client connections that have not asked
/// for more.
pub(crate) const UNREAD_BYTES: &str = "rolegate_unread_response_bytes";

/// Installs the Prometheus recorder for this process.
#[cfg(feature = "gateway")]
pub(crate) fn install() -> Result<PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    let buckets = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets(&buckets)?
        .install_recorder()?;
    describe();
    // Resolve the per-request handles against this recorder now, and show
    // every outcome at zero from the start.
    let _ = request_metrics();
    Ok(handle)
}

#[cfg(feature = "gateway")]
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(LEASE_HELD, "1 while this instance holds the role");
    describe_counter!(TERM_CHANGES, "new terms started by this instance");
    describe_counter!(LEASE_OPS, "lease operations by op and outcome");
    describe_histogram!(
        STORE_LATENCY,
        Unit::Seconds,
        "store round-trip latency by op"
    );
    describe_counter!(STORE_ERRORS, "store calls that failed or timed out, by op");
    describe_counter!(PROXY_REQUESTS, "requests by outcome");
    describe_histogram!(
        FORWARD_LATENCY,
        Unit::Seconds,
        "time to the response head, by target"
    );
    #[cfg(feature = "gateway")]
    describe_counter!(
        FAST_PATH_REQUESTS,
        "requests answered by the HTTP/1.1 fast path"
    );
    describe_gauge!(OPEN_STREAMS, "response bodies still streaming");
    describe_gauge!(OPEN_UPGRADES, "upgraded connections open");
    describe_gauge!(CANDIDATE, "1 while this instance contends for roles");
    describe_gauge!(READY, "1 while the store answers and a snapshot is loaded");
    describe_counter!(HEALTH_PROBES, "upstream health probes by outcome");
    describe_gauge!(
        PARTITION_ROLES_HELD,
        "roles of each balanced partition held here"
    );
    describe_gauge!(
        PARTITION_MISMATCH,
        "1 while this instance's definition of the partition differs from the store's record"
    );
    describe_gauge!(
        ROUTE_MISMATCH,
        "live members whose route table differs from this instance's"
    );
    describe_counter!(
        PARTITION_MOVES,
        "partition roles moved, by cause (join, surplus, leave)"
    );
    describe_gauge!(
        HELD_REQUESTS,
        "role requests held now, waiting for a servable holder"
    );
    describe_histogram!(HOLD_SECONDS, "how long held role requests waited");
    describe_counter!(HOLD_OUTCOMES, "how holds ended, by outcome");
    describe_counter!(
        STREAMS_ENDED,
        "local streams, tunnels and requests ended with their term, by role and reason"
    );
    describe_counter!(
        HEALTH_WITHDRAWALS,
        "times this instance stopped contending because its app failed its health check"
    );
    describe_counter!(
        SLOW_READERS_CLOSED,
        "client connections closed as the slowest readers when the unread-bytes budget was reached"
    );
    describe_gauge!(
        UNREAD_BYTES,
        Unit::Bytes,
        "response bytes handed to client connections that have not asked for more"
    );
    describe_counter!(
        HOPS_REFUSED,
        "hop markers refused, by reason (bad-signature, unsigned, stale)"
    );
    describe_counter!(
        TLS_RELOADS,
        "reloads of the listener certificate, by outcome (ok, refused)"
    );
    describe_counter!(
        TLS_HANDSHAKE_FAILURES,
        "TLS handshakes on the public listener that failed or timed out"
    );
}

static PER_ROLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Series for every role of a partition (`telemetry.per_role_metrics`)
/// instead of one per partition. Process-wide: the metrics recorder is.
pub(crate) fn set_per_role_metrics(on: bool) {
    PER_ROLE.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether a partition's roles get series of their own.
pub(crate) fn per_role_metrics() -> bool {
    PER_ROLE.load(std::sync::atomic::Ordering::Relaxed)
}

/// Handles for the metrics recorded on every request, resolved once: a
/// handle records with a few atomic operations, where a macro call would
/// build a key and look it up in the registry each time.
pub(crate) struct RequestMetrics {
    #[cfg(feature = "gateway")]
    outcomes: Vec<(&'static str, metrics::Counter)>,
    pub forward_holder: metrics::Histogram,
    #[cfg(feature = "gateway")]
    pub forward_upstream: metrics::Histogram,
    #[cfg(feature = "gateway")]
    pub fast_path: metrics::Counter,
    #[cfg(feature = "gateway")]
    pub open_streams: metrics::Gauge,
    pub open_upgrades: metrics::Gauge,
}

/// Every value of the `outcome` label of `rolegate_proxy_requests_total`.
#[cfg(any(test, feature = "gateway"))]
pub(crate) const OUTCOMES: [&str; 20] = [
    "local",
    "forwarded",
    "passthrough",
    "missing-key",
    "bad-key",
    "ambiguous-key",
    "bad-request",
    "bad-body",
    "ambiguous-path",
    "method-not-allowed",
    "holder-unknown",
    "holder-unreachable",
    "holder-timeout",
    "already-forwarded",
    "peer-certificate-required",
    "upstream-unreachable",
    "upstream-timeout",
    "upstream-bad-upgrade",
    "term-ended",
    "partition-mismatch",
];

static REQUEST_METRICS: std::sync::OnceLock<RequestMetrics> = std::sync::OnceLock::new();

/// The per-request handles (bound to the recorder installed at first use).
pub(crate) fn request_metrics() -> &'static RequestMetrics {
    REQUEST_METRICS.get_or_init(|| RequestMetrics {
        #[cfg(feature = "gateway")]
        outcomes: OUTCOMES
            .iter()
            .map(|o| (*o, metrics::counter!(PROXY_REQUESTS, "outcome" => *o)))
            .collect(),
        forward_holder: metrics::histogram!(FORWARD_LATENCY, "target" => "holder"),
        #[cfg(feature = "gateway")]
        forward_upstream: metrics::histogram!(FORWARD_LATENCY, "target" => "upstream"),
        #[cfg(feature = "gateway")]
        fast_path: metrics::counter!(FAST_PATH_REQUESTS),
        #[cfg(feature = "gateway")]
        open_streams: metrics::gauge!(OPEN_STREAMS),
        open_upgrades: metrics::gauge!(OPEN_UPGRADES),
    })
}

#[cfg(feature = "gateway")]
impl RequestMetrics {
    /// Counts one request with its outcome label.
    pub(crate) fn count(&self, outcome: &str) {
        if let Some((_, c)) = self.outcomes.iter().find(|(o, _)| *o == outcome) {
            c.increment(1);
        }
    }
}

/// Rate limits WARN lines per cause: at most one per cause every
/// `every`; the ones in between are counted, and the next line that goes
/// out says how many were suppressed. A failover or an outage then costs a
/// few lines, not one per request.
#[derive(Default)]
pub(crate) struct WarnGate {
    slots: std::sync::Mutex<std::collections::HashMap<&'static str, WarnSlot>>,
}

struct WarnSlot {
    last: std::time::Instant,
    suppressed: u64,
}

impl WarnGate {
    /// `Some(suppressed since the last line)` when a line for `cause` may go
    /// out now; `None` (and one more suppressed) otherwise.
    pub(crate) fn admit(
        &self,
        cause: &'static str,
        every: std::time::Duration,
        now: std::time::Instant,
    ) -> Option<u64> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        match slots.get_mut(cause) {
            Some(slot) if now.saturating_duration_since(slot.last) < every => {
                slot.suppressed += 1;
                None
            }
            Some(slot) => {
                slot.last = now;
                Some(std::mem::take(&mut slot.suppressed))
            }
            None => {
                slots.insert(
                    cause,
                    WarnSlot {
                        last: now,
                        suppressed: 0,
                    },
                );
                Some(0)
            }
        }
    }
}

/// Request-path warnings (forwarding failures): one line per cause every 5 s.
pub(crate) const REQUEST_WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The process-wide gate for request-path warnings.
pub(crate) fn request_warnings() -> &'static WarnGate {
    static GATE: std::sync::OnceLock<WarnGate> = std::sync::OnceLock::new();
    GATE.get_or_init(WarnGate::default)
}

/// Counts something open for as long as the guard lives (streams, upgrades).
pub(crate) struct OpenGuard {
    gauge: &'static metrics::Gauge,
}

impl OpenGuard {
    #[cfg(feature = "gateway")]
    pub(crate) fn stream() -> Self {
        Self::new(&request_metrics().open_streams)
    }

    pub(crate) fn upgrade() -> Self {
        Self::new(&request_metrics().open_upgrades)
    }

    fn new(gauge: &'static metrics::Gauge) -> Self {
        gauge.increment(1.0);
        Self { gauge }
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.gauge.decrement(1.0);
    }
}

/// Response bodies counted in `rolegate_open_streams` until they end or are dropped.
#[cfg(feature = "gateway")]
pub(crate) struct TrackedBody;

#[cfg(feature = "gateway")]
impl TrackedBody {
    /// Counts `inner` in `rolegate_open_streams` while it streams, and keeps
    /// `hold` (e.g. the count of local work under a role) alive until it ends.
    pub(crate) fn holding(
        inner: axum::body::Body,
        hold: Option<Box<dyn Send + Sync>>,
    ) -> axum::body::Body {
        axum::body::Body::new(crate::body::Holding::new(
            inner,
            (OpenGuard::stream(), hold),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn warnings_are_limited_per_cause_and_report_what_they_suppressed() {
        let gate = WarnGate::default();
        let every = Duration::from_secs(5);
        let t0 = Instant::now();
        assert_eq!(gate.admit("a", every, t0), Some(0));
        // Ten more within the interval: suppressed.
        for i in 1..=10 {
            assert_eq!(
                gate.admit("a", every, t0 + Duration::from_millis(i * 100)),
                None
            );
        }
        // Another cause is not held back by the first.
        assert_eq!(gate.admit("b", every, t0 + Duration::from_secs(1)), Some(0));
        // After the interval, the next line goes out and says how many were held back.
        assert_eq!(gate.admit("a", every, t0 + every), Some(10));
        assert_eq!(gate.admit("a", every, t0 + every * 2), Some(0));
    }
}
