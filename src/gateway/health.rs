//! Candidacy from the app's health: the `upstream.health` probe loop.

use std::time::Duration;

use crate::config::HealthConfig;
use crate::lease::Coordinator;
use crate::proxy::{Forwarder, HopProtocol};
use crate::telemetry;

/// Candidacy follows the app's health: after `unhealthy_after` consecutive
/// failed probes this instance releases its roles and stops contending; the
/// first good probe after that makes it contend again.
pub(crate) async fn watch_health(
    coordinator: Coordinator,
    probe: Forwarder,
    upstream: String,
    protocol: HopProtocol,
    health: HealthConfig,
) {
    let url = format!("{upstream}{}", health.path);
    let shown = crate::redact::redact_url(&url);
    let timeout = health
        .interval
        .clamp(Duration::from_millis(100), Duration::from_secs(2));
    let mut failures = 0u32;
    let mut ticker = tokio::time::interval(health.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let ok = probe.probe(&url, protocol, timeout).await;
        metrics::counter!(telemetry::HEALTH_PROBES, "outcome" => if ok { "ok" } else { "fail" })
            .increment(1);
        if ok {
            failures = 0;
            // A stopping instance withdrew for good: a healthy app must not
            // make it contend again while it hands its roles on.
            if !coordinator.is_candidate() && !coordinator.is_draining() {
                tracing::info!(url = %shown, "upstream healthy again; contending for roles");
                coordinator.set_candidate(true);
            }
        } else {
            failures = failures.saturating_add(1);
            if coordinator.is_candidate() && failures >= health.unhealthy_after {
                tracing::warn!(url = %shown, failures, "upstream unhealthy; releasing roles and not contending");
                metrics::counter!(telemetry::HEALTH_WITHDRAWALS).increment(1);
                coordinator.withdraw(format!(
                    "the app failed {failures} health probes of {} in a row",
                    health.path
                ));
            }
        }
        metrics::gauge!(telemetry::CANDIDATE).set(if coordinator.is_candidate() {
            1.0
        } else {
            0.0
        });
    }
}
