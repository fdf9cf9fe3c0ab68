//! The `rolegate run` binary's wiring: open the store, start the
//! coordinator, bind both listeners, serve until a signal, then drain and
//! release. The request handler (`handler.rs`), the accept loop
//! (`server.rs`) and the health probe (`health.rs`) live beside it.

mod access_log;
mod advertise;
mod h1;
mod handler;
mod health;
mod refuse;
mod server;
mod tls;
#[cfg(feature = "otel")]
mod trace;
mod unread;
mod upstream;
mod watched;
mod workers;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::events::EventLog;
use crate::lease::{Coordinator, CoordinatorError};
use crate::listener::{connection_cap, raise_nofile_limit};
use crate::proxy::hold::Holds;
use crate::proxy::{ForwardError, Forwarder};
use crate::store::{LeaseStore, StoreError};
use crate::telemetry;
use access_log::AccessLog;
use handler::GatewayState;
use server::{ConnectionTracker, ServeLimits};
use workers::Workers;

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GatewayError {
    /// `upstream.url` is missing.
    #[error("upstream.url is required to run the gateway")]
    NoUpstream,
    /// A route names a role or partition the coordinator does not know.
    #[error("`{0}` is not registered with the coordinator")]
    NotRegistered(String),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}{which}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// `""`, `" (admin)"` or `" (worker)"`.
        which: &'static str,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// The store could not be opened.
    #[error("cannot open the lease store")]
    Store(#[from] StoreError),
    /// The coordinator refused the registrations.
    #[error("cannot start the coordinator")]
    Coordinator(#[from] CoordinatorError),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client")]
    Client(#[from] ForwardError),
    /// A certificate, key or CA file of `tls` or `peers` is unusable.
    #[error("cannot set up TLS")]
    Tls(#[from] crate::tls::TlsError),
    /// The access log's writer thread could not start.
    #[error("cannot start the access log")]
    AccessLog(#[source] std::io::Error),
    /// The trace exporter (`telemetry.otlp`) could not be built.
    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    #[error("cannot start the trace exporter: {0}")]
    Traces(String),
}

impl GatewayError {
    /// Whether the configuration is refused (exit 2, as `check-config`):
    /// only an edit fixes it, so a service manager should stop restarting.
    pub(crate) fn is_config(&self) -> bool {
        match self {
            GatewayError::Store(e) => e.is_config(),
            GatewayError::NoUpstream
            | GatewayError::NotRegistered(_)
            | GatewayError::Coordinator(_)
            | GatewayError::Tls(_)
            | GatewayError::Traces(_) => true,
            GatewayError::Listen { .. } | GatewayError::Client(_) | GatewayError::AccessLog(_) => {
                false
            }
        }
    }
}

/// The public listeners (one per worker), the bound public address, and the
/// admin listener.
async fn bind_all(
    config: &Config,
    workers: usize,
) -> Result<(Vec<std::net::TcpListener>, SocketAddr, TcpListener), GatewayError> {
    let listen_error = |addr, which| {
        move |source| GatewayError::Listen {
            addr,
            which,
            source,
        }
    };
    let (listeners, bound) =
        workers::bind(config.listen, workers).map_err(listen_error(config.listen, ""))?;
    let admin = TcpListener::bind(config.admin_listen)
        .await
        .map_err(listen_error(config.admin_listen, " (admin)"))?;
    Ok((listeners, bound, admin))
}

/// Runs the gateway until SIGTERM/SIGINT, then drains and releases.
pub(crate) async fn run(
    config: Config,
    events: Option<Arc<EventLog>>,
    workers: usize,
) -> Result<(), GatewayError> {
    let workers = workers.max(1);
    let limits = ServeLimits {
        // Each worker takes its share of the cap.
        max_connections: connection_limit(&config).div_ceil(workers),
        idle_timeout: config.proxy.idle_timeout,
        http2: config.proxy.http2,
        unread: unread::UnreadBudget::new(config.proxy.max_unread_mib.saturating_mul(1 << 20)),
    };
    // Metrics first, so every handle created below reports to the recorder.
    telemetry::set_per_role_metrics(config.telemetry.per_role_metrics);
    if let Some(warning) = config.per_role_series_warning() {
        tracing::warn!("{warning}");
    }
    let metrics = install_metrics();
    let (listeners, bound, admin) = bind_all(&config, workers).await?;
    // Before anything contends: bad TLS files are refused at start.
    let tls = config
        .tls
        .as_ref()
        .map(|t| tls::ListenerTls::start(t, &config.peers, config.proxy.http2.enabled));
    let tls = tls.transpose()?.map(Arc::new);
    let advertise = advertise::advertise_address(
        config.instance.advertise.as_deref(),
        bound,
        config.tls.is_some(),
    );
    let (coordinator, store) = start_coordinator(&config, advertise.clone(), &events).await?;
    // One bound on held requests for the whole process.
    let holds = Holds::new(config.proxy.hold_timeout, config.proxy.max_held);
    #[cfg(feature = "otel")]
    let traces = match &config.telemetry.otlp {
        Some(c) => Some(trace::Traces::start(
            c,
            coordinator.instance_id(),
            tokio::runtime::Handle::current(),
        )?),
        None => None,
    };
    let states = worker_states(
        &config,
        &coordinator,
        &holds,
        &events,
        workers,
        #[cfg(feature = "otel")]
        traces.as_ref(),
    )?;
    tracing::info!(
        instance = coordinator.instance_id(),
        listen = %bound,
        workers,
        tls = config.tls.is_some(),
        admin = %admin.local_addr().unwrap_or(config.admin_listen),
        advertise = %advertise,
        store = coordinator.store_kind(),
        roles = coordinator.role_names().len(),
        "rolegate gateway started"
    );
    start_health(&config, &coordinator)?;

    let tracker = ConnectionTracker::default();
    let (admin_stop, admin_shutdown) = crate::shutdown::channel();
    let admin_task = tokio::spawn(crate::admin::serve(
        admin,
        coordinator.clone(),
        metrics,
        config.proxy.cluster_secret.is_some(),
        holds,
        admin_shutdown,
    ));
    let workers = Workers::start(listeners, states, &tracker, limits, tls).map_err(|source| {
        GatewayError::Listen {
            addr: bound,
            which: " (worker)",
            source,
        }
    })?;

    crate::shutdown::signal().await;
    drain(&config, &coordinator, &tracker, workers).await;
    admin_stop.fire();
    let _ = admin_task.await;
    tracing::info!("stopped; leases released");
    #[cfg(feature = "otel")]
    if let Some(t) = &traces {
        t.shutdown(Duration::from_secs(5)).await;
    }
    store.close().await;
    Ok(())
}

/// Opens the store and starts the coordinator, logging lease events to `events`.
async fn start_coordinator(
    config: &Config,
    advertise: String,
    events: &Option<Arc<EventLog>>,
) -> Result<(Coordinator, Arc<dyn LeaseStore>), GatewayError> {
    let (store, failure) = open_store(config).await?;
    let mut builder = config.coordinator(store.clone()).advertise(advertise);
    if let Some(log) = events {
        let log = log.clone();
        builder = builder.on_lease_event(move |e| log.lease(&e));
    }
    let coordinator = builder.start()?;
    if let Some(failure) = failure {
        coordinator.note_store_error(&failure);
    }
    if let Some(log) = events {
        log.started(coordinator.instance_id());
    }
    Ok((coordinator, store))
}

/// One state per worker: each has its own forwarder, so its upstream and
/// peer connections belong to that worker's thread.
fn worker_states(
    config: &Config,
    coordinator: &Coordinator,
    holds: &Arc<Holds>,
    events: &Option<Arc<EventLog>>,
    workers: usize,
    #[cfg(feature = "otel")] traces: Option<&trace::Traces>,
) -> Result<Vec<Arc<GatewayState>>, GatewayError> {
    let access = match &config.telemetry.access_log {
        Some(c) => Some(AccessLog::start(c).map_err(GatewayError::AccessLog)?),
        None => None,
    };
    let observe = handler::Observers {
        access,
        #[cfg(feature = "otel")]
        traces: traces.cloned(),
    };
    (0..workers)
        .map(|_| {
            let f = forwarder(config)?;
            let state = GatewayState::new(
                config,
                coordinator,
                f,
                holds.clone(),
                events.clone(),
                observe.clone(),
            )?;
            Ok(Arc::new(state))
        })
        .collect()
}

/// The client for the app and for hops to peers (`peers`: CA, client certificate).
fn forwarder(config: &Config) -> Result<Forwarder, GatewayError> {
    let peer_tls = crate::tls::peer_client_config(&config.peers)?;
    Ok(Forwarder::new(
        config.proxy.connect_timeout,
        config.proxy.response_header_timeout,
    )?
    .with_idle_timeout(config.proxy.idle_timeout)
    .with_peer_tls(peer_tls))
}

/// `proxy.max_connections`, lowered to fit the open-files limit.
fn connection_limit(config: &Config) -> usize {
    let nofile = raise_nofile_limit();
    let max_connections = connection_cap(config.proxy.max_connections, nofile);
    if max_connections < config.proxy.max_connections {
        let configured = config.proxy.max_connections;
        if lowering_needs_warning(configured, max_connections) {
            tracing::warn!(
                configured,
                open_files_limit = nofile,
                using = max_connections,
                "proxy.max_connections lowered to fit a low open-files limit; raise the hard limit (LimitNOFILE=, ulimit -Hn)"
            );
        } else {
            tracing::info!(
                configured,
                open_files_limit = nofile,
                using = max_connections,
                "proxy.max_connections lowered to fit the open-files limit"
            );
        }
    }
    max_connections
}

/// Fewer connections than the default is routine on most machines (the
/// default asks for more descriptors than a usual hard limit gives); it is
/// worth a WARN when an explicit `max_connections` cannot be had, or when
/// the hard limit leaves fewer than [`FEW_CONNECTIONS`].
fn lowering_needs_warning(configured: usize, using: usize) -> bool {
    using < configured
        && (configured != crate::proxy::defaults::MAX_CONNECTIONS || using < FEW_CONNECTIONS)
}

/// Below this many connections, a lowered limit is a WARN.
const FEW_CONNECTIONS: usize = 1024;

fn install_metrics() -> Option<PrometheusHandle> {
    match telemetry::install() {
        Ok(handle) => {
            // Histograms keep raw samples until summarized: summarize them
            // regularly, not only when /metrics is scraped.
            let upkeep = handle.clone();
            tokio::spawn(async move {
                let mut every = tokio::time::interval(Duration::from_secs(5));
                loop {
                    every.tick().await;
                    upkeep.run_upkeep();
                }
            });
            Some(handle)
        }
        Err(e) => {
            tracing::warn!(error = %e, "metrics recorder not installed; /metrics will be empty");
            None
        }
    }
}

/// Opens the store. With `store.migrate`, the schema is applied; if the
/// store does not answer at once, that keeps being retried in the
/// background while the coordinator retries and readiness says 503.
/// The store, and the first call's failure (said in 503s until the
/// coordinator has read the store).
async fn open_store(config: &Config) -> Result<(Arc<dyn LeaseStore>, Option<String>), StoreError> {
    let store = crate::store::connect(&config.store).await?;
    // The first call, timed and logged at once either way: the operator sees
    // the store answer (or why not) before the first heartbeat's retries.
    // The bound leaves a pool's connect attempts time to name their cause.
    let started = std::time::Instant::now();
    let what = if config.store.migrate {
        "applying the schema"
    } else {
        "reading the lease table"
    };
    let call = async {
        if config.store.migrate {
            store.migrate().await
        } else {
            store.snapshot(&[]).await.map(|_| ())
        }
    };
    let first = tokio::time::timeout(FIRST_CALL_BOUND, call).await;
    match &first {
        Ok(Ok(())) => tracing::info!(
            store = store.kind(),
            round_trip_ms = started.elapsed().as_secs_f64() * 1000.0,
            "lease store answered ({what})"
        ),
        Ok(Err(e)) => {
            tracing::warn!(store = store.kind(), error = %e, "lease store call failed at start ({what}); failing closed and retrying")
        }
        Err(_) => tracing::warn!(
            store = store.kind(),
            "lease store did not answer within {} at start ({what}); failing closed and retrying",
            humantime::format_duration(FIRST_CALL_BOUND)
        ),
    }
    let failure = match first {
        Ok(Ok(())) => return Ok((store, None)),
        Ok(Err(e)) => format!("{what}: {e}"),
        Err(_) => format!(
            "{what}: no answer within {}",
            humantime::format_duration(FIRST_CALL_BOUND)
        ),
    };
    if !config.store.migrate {
        return Ok((store, Some(failure)));
    }
    let migrating = store.clone();
    tokio::spawn(async move {
        let mut delay = Duration::from_millis(200);
        loop {
            match migrating.migrate().await {
                Ok(()) => {
                    tracing::info!("store schema applied");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "applying the store schema failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    });
    Ok((store, Some(failure)))
}

/// How long start waits for the store's first answer (a pool's 3 s wait for
/// a connection, then one direct attempt that names the cause).
const FIRST_CALL_BOUND: Duration = Duration::from_millis(4500);

/// Starts the health probe when `upstream.health` is set.
fn start_health(config: &Config, coordinator: &Coordinator) -> Result<(), GatewayError> {
    metrics::gauge!(telemetry::CANDIDATE).set(1.0);
    let Some(upstream) = &config.upstream else {
        return Ok(());
    };
    if let Some(health) = upstream.health.clone() {
        let probe = Forwarder::new(
            config.proxy.connect_timeout,
            config.proxy.response_header_timeout,
        )?;
        tokio::spawn(health::watch_health(
            coordinator.clone(),
            probe,
            upstream.url.clone(),
            upstream.protocol,
            health,
        ));
    }
    Ok(())
}

/// The graceful stop: no new local work, in-flight requests drain (up to
/// `drain_timeout`), what is left is ended (streams cut, WebSockets closed
/// with 1012), then every held role is released in one store call.
/// A second signal exits at once.
async fn drain(
    config: &Config,
    coordinator: &Coordinator,
    tracker: &ConnectionTracker,
    mut workers: Workers,
) {
    tracing::info!(drain_timeout = ?config.shutdown.drain_timeout, "stopping: no new local work, draining in-flight requests");
    tokio::spawn(async {
        crate::shutdown::signal().await;
        tracing::warn!("second signal: exiting now");
        std::process::exit(1);
    });
    // The listener stays open through the drain: new requests for this
    // gateway's roles are held (it admits no new local work) and go to the
    // successor once it is known, so clients that still send here see no
    // error while the deploy rolls on.
    coordinator.begin_drain();
    let started = tokio::time::Instant::now();
    if !coordinator
        .wait_local_idle(config.shutdown.drain_timeout)
        .await
    {
        tracing::info!("drain timeout reached; ending the local work still running");
    }
    // End what runs under a term (an HTTP/2 stream is reset with CANCEL, a
    // WebSocket gets 1012), then hand every role on. The loop keeps reading
    // the store, so this gateway learns the successors and forwards to them.
    coordinator.end_local_work().await;
    coordinator.withdraw("this instance is stopping");
    coordinator.wait_released(RELEASE_LIMIT).await;
    // Other gateways learn of the release from the store's notification;
    // until they do they still forward here, and get a signed refusal (safe
    // to send elsewhere) rather than a connection closed under the request.
    tokio::time::sleep(HAND_ON_PAUSE).await;
    // Now close: no new connections, idle ones close, busy ones (requests
    // held for a successor among them) finish within what is left of the
    // drain bound, while the loop still reads the store.
    tracker.begin_shutdown();
    workers.stopped_accepting().await;
    let left = config
        .shutdown
        .drain_timeout
        .saturating_sub(started.elapsed())
        .max(RELEASE_LIMIT);
    if !tracker.wait_idle(left).await {
        tracing::warn!(
            open = tracker.open(),
            "drain timeout reached; closing remaining connections"
        );
    }
    workers.end().await;
    coordinator.shutdown_now().await;
}

/// How long a stopping gateway keeps serving (refusing hops for roles it no
/// longer holds) after its release, before it closes its connections.
const HAND_ON_PAUSE: Duration = Duration::from_millis(500);

/// How long a stopping gateway waits for the loop to release its roles
/// (one store round trip) before it closes its listener anyway.
const RELEASE_LIMIT: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lowered_default_is_routine_and_a_lowered_explicit_limit_is_a_warning() {
        let default = crate::proxy::defaults::MAX_CONNECTIONS;
        // The default within a 20000 hard limit: routine.
        assert!(!lowering_needs_warning(default, 6645));
        // A low hard limit (1024 descriptors): few connections.
        assert!(lowering_needs_warning(default, 320));
        // An explicit value that cannot be had.
        assert!(lowering_needs_warning(50_000, 6645));
        assert!(!lowering_needs_warning(500, 500));
    }
}
