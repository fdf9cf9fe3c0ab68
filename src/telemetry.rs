//! Metric names (Prometheus style, `rolegate_` prefix) and the recorder the
//! binary installs. The library emits through the `metrics` facade; without
//! a recorder installed, emitting costs next to nothing.

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Gauge per role: 1 while held here.
pub const LEASE_HELD: &str = "rolegate_lease_held";
/// Counter per role: new terms started here.
pub const TERM_CHANGES: &str = "rolegate_lease_term_changes_total";
/// Counter: lease operations by `op` (acquire, renew, release) and `outcome`
/// (granted, denied, late, error).
pub const LEASE_OPS: &str = "rolegate_lease_operations_total";
/// Histogram: store round-trip latency by `op` (claim, snapshot, release, register).
pub const STORE_LATENCY: &str = "rolegate_store_round_trip_seconds";
/// Counter: store failures (errors and timeouts) by `op`.
pub const STORE_ERRORS: &str = "rolegate_store_errors_total";
/// Counter: proxied requests by `outcome` (local, forwarded, passthrough,
/// bad_request, and each 503/502/504 reason).
pub const PROXY_REQUESTS: &str = "rolegate_proxy_requests_total";
/// Histogram: time to the response head, by `target` (holder, upstream).
pub const FORWARD_LATENCY: &str = "rolegate_forward_seconds";
/// Gauge: response bodies still streaming.
pub const OPEN_STREAMS: &str = "rolegate_open_streams";
/// Gauge: upgraded (WebSocket) connections open.
pub const OPEN_UPGRADES: &str = "rolegate_open_upgrades";
/// Gauge: 1 while this instance contends for roles.
pub const CANDIDATE: &str = "rolegate_candidate";
/// Gauge: 1 while the store answers and a snapshot is loaded.
pub const READY: &str = "rolegate_ready";
/// Counter: upstream health probes by `outcome` (ok, fail).
pub const HEALTH_PROBES: &str = "rolegate_health_probes_total";

/// Installs the Prometheus recorder for this process.
pub fn install() -> Result<PrometheusHandle, String> {
    let buckets = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets(&buckets)
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| e.to_string())?;
    describe();
    Ok(handle)
}

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
    describe_gauge!(OPEN_STREAMS, "response bodies still streaming");
    describe_gauge!(OPEN_UPGRADES, "upgraded connections open");
    describe_gauge!(CANDIDATE, "1 while this instance contends for roles");
    describe_gauge!(READY, "1 while the store answers and a snapshot is loaded");
    describe_counter!(HEALTH_PROBES, "upstream health probes by outcome");
}

/// Counts something open for as long as the guard lives (streams, upgrades).
#[derive(Debug)]
pub struct OpenGuard {
    name: &'static str,
}

impl OpenGuard {
    pub fn new(name: &'static str) -> Self {
        metrics::gauge!(name).increment(1.0);
        Self { name }
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        metrics::gauge!(self.name).decrement(1.0);
    }
}

/// A response body counted in `rolegate_open_streams` until it ends or is dropped.
pub struct TrackedBody {
    inner: axum::body::Body,
    _open: OpenGuard,
}

impl TrackedBody {
    pub fn wrap(inner: axum::body::Body) -> axum::body::Body {
        axum::body::Body::new(TrackedBody {
            inner,
            _open: OpenGuard::new(OPEN_STREAMS),
        })
    }
}

impl http_body::Body for TrackedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
