//! The binary's wiring: config → store → coordinator → the public listener
//! (every request of this app instance passes through it) and the admin
//! listener. Requests for held roles and all non-role paths go to the local
//! upstream; others are forwarded one hop to the holder's gateway.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

use crate::cli::{EXIT_CONFIG, EXIT_RUNTIME};
use crate::config::{Config, RouteTarget};
use crate::lease::Coordinator;
use crate::listener::{
    connection_cap, raise_nofile_limit, stopped, AcceptBackoff, HEADER_READ_TIMEOUT, MAX_HEADERS,
    MAX_HEAD_BYTES,
};
use crate::proxy::forward::prepare_headers;
use crate::proxy::gate::{Decision, GateSettings, GateTarget, Outcome};
use crate::proxy::headers::{ROLE, TOKEN};
use crate::proxy::hop::HopSigner;
use crate::proxy::idle::{Progress, ProgressIo};
use crate::proxy::problem::{Problem, Reason};
use crate::proxy::routes::{RouteError, RouteTable};
use crate::proxy::{ForwardError, Forwarder, KeyExtractor};
use crate::telemetry::{self, TrackedBody};
use http_body::Body as _;

/// Everything a request needs, shared by all connections.
pub struct GatewayState {
    routes: RouteTable<GateTarget>,
    settings: GateSettings,
    upstream: String,
    pub coordinator: Coordinator,
    /// `--events`: local admissions are logged here.
    pub events: Option<Arc<crate::events::EventLog>>,
}

impl GatewayState {
    /// Builds the route table from the config against a started coordinator.
    pub fn new(
        config: &Config,
        coordinator: Coordinator,
        forwarder: Forwarder,
    ) -> Result<Self, String> {
        let mut routes = RouteTable::new(config.proxy.case_insensitive_paths);
        for r in &config.routes {
            let target = match &r.target {
                RouteTarget::Role(name) => GateTarget::Role(
                    coordinator
                        .role(name)
                        .ok_or_else(|| format!("role `{name}` is not registered"))?,
                ),
                RouteTarget::Partition { name, scope, key } => GateTarget::Partition {
                    partition: coordinator
                        .partition(name)
                        .ok_or_else(|| format!("partition `{name}` is not registered"))?,
                    scope: scope.as_deref().map(Arc::from),
                    key: KeyExtractor::from_source(key),
                },
            };
            routes.add(&r.prefixes, target);
        }
        let upstream = config
            .upstream
            .as_ref()
            .map(|u| u.url.clone())
            .ok_or_else(|| "upstream.url is required to run the gateway".to_string())?;
        Ok(Self {
            routes,
            settings: GateSettings {
                instance_id: coordinator.instance_id().into(),
                signer: HopSigner::new(config.proxy.cluster_secret.as_deref()),
                retry_after_secs: config.retry_after_secs(),
                forwarder,
                upgrades: config.proxy.upgrades.clone().into(),
                trusted_proxies: config.proxy.trusted_proxies.clone().into(),
            },
            upstream,
            coordinator,
            events: None,
        })
    }

    /// Answers one request.
    pub async fn handle(&self, req: Request<Incoming>, client: SocketAddr) -> Response<Body> {
        let mut req = req.map(Body::new);
        if req.method() == http::Method::OPTIONS && req.uri().path() == "*" {
            // A server-wide capability probe: answered here, gating nothing.
            let mut resp = Response::new(Body::empty());
            resp.headers_mut().insert(
                http::header::ALLOW,
                http::HeaderValue::from_static("GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS"),
            );
            return finish(resp, Outcome::Passthrough);
        }
        if let Some(problem) = refuse_request(&req) {
            let (resp, outcome) = self.settings.reject(problem);
            return finish(resp, outcome);
        }
        let target = match self.routes.find(req.uri().path()) {
            Ok(target) => target,
            Err(e) => {
                let reason = match e {
                    RouteError::Ambiguous => Reason::AmbiguousPath,
                    RouteError::BadPath(_) => Reason::BadRequest,
                };
                let (resp, outcome) = self.settings.reject(Problem::new(reason, e.to_string()));
                return finish(resp, outcome);
            }
        };
        let Some(target) = target else {
            // Remember a verified hop (its forwarding fields are trusted).
            self.settings.take_hop(&mut req);
            let (resp, outcome) = self.to_upstream(req, client, None).await;
            return finish(resp, outcome);
        };
        let forwarded = self.settings.take_hop(&mut req);
        // Decide on the headers the app will see.
        let trusted = self.settings.trusts(&req, Some(client));
        crate::proxy::forward::sanitize_headers(
            req.headers_mut(),
            trusted,
            &self.settings.upgrades,
        );
        let (resp, outcome) = match target.decide(req.uri(), req.headers(), forwarded) {
            Decision::Local(lease) => {
                if let Some(log) = &self.events {
                    log.admitted(
                        &self.settings.instance_id,
                        &lease.role,
                        lease.token,
                        lease.checked_at,
                    );
                }
                self.to_upstream(req, client, Some((lease.role, lease.token)))
                    .await
            }
            Decision::Forward { address, role } => {
                let started = std::time::Instant::now();
                let partition = target.partition_label();
                let answer = self
                    .settings
                    .forward_to_holder(req, Some(client), &address, role, partition)
                    .await;
                telemetry::request_metrics()
                    .forward_holder
                    .record(started.elapsed().as_secs_f64());
                answer
            }
            Decision::Reject(p) => self.settings.reject(p),
        };
        tracing::debug!(
            ?outcome,
            status = resp.status().as_u16(),
            "role route answered"
        );
        finish(resp, outcome)
    }

    async fn to_upstream(
        &self,
        mut req: Request<Body>,
        client: SocketAddr,
        lease: Option<(Arc<str>, u64)>,
    ) -> (Response<Body>, Outcome) {
        let trusted = self.settings.trusts(&req, Some(client));
        prepare_headers(
            &mut req,
            self.settings.hop_context(trusted, Some(client), false),
        );
        let outcome = match &lease {
            Some((role, token)) => {
                if let Ok(v) = http::HeaderValue::from_str(role) {
                    req.headers_mut().insert(ROLE, v);
                }
                req.headers_mut()
                    .insert(TOKEN, http::HeaderValue::from(*token));
                Outcome::Local
            }
            None => Outcome::Passthrough,
        };
        let started = std::time::Instant::now();
        let answer = self.settings.forwarder.proxy(req, &self.upstream).await;
        telemetry::request_metrics()
            .forward_upstream
            .record(started.elapsed().as_secs_f64());
        match answer {
            Ok(resp) => (resp, outcome),
            Err(e) => {
                let (reason, detail) = match e {
                    ForwardError::ClientBody => {
                        // The client's fault: not an upstream failure.
                        tracing::debug!(error = %e, "client request body failed");
                        (Reason::BadBody, "the request body was malformed or cut off")
                    }
                    ForwardError::Timeout(..) => {
                        (Reason::UpstreamTimeout, "the app did not answer in time")
                    }
                    _ => (Reason::UpstreamUnreachable, "the app could not be reached"),
                };
                if reason != Reason::BadBody {
                    tracing::warn!(upstream = %crate::redact::redact_url(&self.upstream), error = %crate::redact::redact_text(&e.to_string()), "upstream request failed");
                }
                let p = Problem::new(reason, detail).role(lease.map(|(r, _)| r));
                self.settings.reject(p)
            }
        }
    }
}

/// Requests refused before routing: `CONNECT` (405), a target that is not a
/// path (400; `OPTIONS *` is answered earlier, by the gateway), two `Host`
/// fields, or an HTTP/1.1 request without one (400).
fn refuse_request(req: &Request<Body>) -> Option<Problem> {
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
    let http11 = req.version() == http::Version::HTTP_11;
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
                "an HTTP/1.1 request needs a Host field",
            ))
        }
        (Some(h), None) if http11 && h.is_empty() => {
            return Some(Problem::new(
                Reason::BadRequest,
                "an HTTP/1.1 request needs a non-empty Host field",
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

/// Counts the outcome and tracks the body while it streams.
fn finish(resp: Response<Body>, outcome: Outcome) -> Response<Body> {
    let label = match outcome {
        Outcome::Local => "local",
        Outcome::Forwarded => "forwarded",
        Outcome::Passthrough => "passthrough",
        Outcome::Rejected(r) if r.status().is_client_error() => "bad_request",
        Outcome::Rejected(r) => r.as_str(),
    };
    telemetry::request_metrics().count(label);
    if resp.body().is_end_stream() {
        return resp;
    }
    resp.map(TrackedBody::wrap)
}

/// Open connections, so shutdown can wait for them to finish.
#[derive(Clone)]
pub struct ConnectionTracker {
    active: Arc<AtomicUsize>,
    idle: Arc<Notify>,
    stop: watch::Sender<bool>,
}

impl Default for ConnectionTracker {
    fn default() -> Self {
        Self {
            active: Arc::new(AtomicUsize::new(0)),
            idle: Arc::new(Notify::new()),
            stop: watch::channel(false).0,
        }
    }
}

impl ConnectionTracker {
    /// Asks every connection to finish its in-flight request and close.
    pub fn begin_shutdown(&self) {
        self.stop.send_replace(true);
    }

    /// Waits until no connection is open, or `limit` passes. True if all closed.
    pub async fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.idle.notified();
            if self.active.load(Ordering::Acquire) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.active.load(Ordering::Acquire) == 0;
            }
        }
    }

    pub fn open(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }
}

/// Connection limits of the public listener.
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// Connections served at once; beyond it new ones wait in the backlog.
    pub max_connections: usize,
    /// No byte either way for this long closes the connection.
    pub idle_timeout: Duration,
}

/// Accepts connections until the tracker's shutdown begins.
pub async fn serve(
    listener: TcpListener,
    state: Arc<GatewayState>,
    tracker: ConnectionTracker,
    limits: ServeLimits,
) {
    let mut stop = tracker.stop.subscribe();
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let mut accept_errors = AcceptBackoff::default();
    loop {
        // Take a slot first: at the cap, connections wait in the kernel's
        // backlog and file descriptors stay free for the admin listener.
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => s,
            _ = stopped(&mut stop) => return,
        };
        let Ok(slot) = slot else { return };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stopped(&mut stop) => return,
        };
        let (stream, client) = match accepted {
            Ok(pair) => {
                accept_errors.reset();
                pair
            }
            Err(e) => {
                // Out of file descriptors and the like: back off, never exit.
                accept_errors.failed(&e).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let tracker = tracker.clone();
        tracker.active.fetch_add(1, Ordering::AcqRel);
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(state.handle(req, client).await) }
            });
            let progress = Progress::new();
            progress.touch();
            let io = ProgressIo::new(stream, progress.clone());
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .max_headers(MAX_HEADERS)
                .serve_connection(TokioIo::new(io), service)
                .with_upgrades();
            tokio::pin!(conn);
            let mut stop = tracker.stop.subscribe();
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = progress.idle_for(limits.idle_timeout) => {
                    tracing::debug!(%client, idle = ?limits.idle_timeout, "connection idle; closing");
                    Ok(())
                }
                _ = stopped(&mut stop) => {
                    conn.as_mut().graceful_shutdown();
                    tokio::select! {
                        r = conn.as_mut() => r,
                        _ = progress.idle_for(limits.idle_timeout) => Ok(()),
                    }
                }
            };
            if let Err(e) = result {
                tracing::debug!(%client, error = %e, "connection ended with an error");
            }
            if tracker.active.fetch_sub(1, Ordering::AcqRel) == 1 {
                tracker.idle.notify_waiters();
            }
        });
    }
}

/// `rolegate run`: runs until SIGTERM/SIGINT, then drains and releases.
pub async fn run(path: &Path, events: Option<&Path>) -> ExitCode {
    let config = match crate::cli::load_config(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if config.upstream.is_none() {
        eprintln!(
            "error: {}: upstream.url is required to run the gateway",
            path.display()
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    let events = match events.map(crate::events::EventLog::create).transpose() {
        Ok(e) => e.map(Arc::new),
        Err(e) => {
            eprintln!("error: cannot open the event log: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    match run_config(config, events).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

async fn run_config(
    config: Config,
    events: Option<Arc<crate::events::EventLog>>,
) -> Result<(), String> {
    let nofile = raise_nofile_limit();
    let max_connections = connection_cap(config.proxy.max_connections, nofile);
    if max_connections < config.proxy.max_connections {
        tracing::warn!(
            configured = config.proxy.max_connections,
            open_files_limit = nofile,
            using = max_connections,
            "proxy.max_connections lowered to fit the open-files limit"
        );
    }
    // Metrics first, so every handle created below reports to the recorder.
    let metrics = match telemetry::install() {
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
    };
    let listener = bind_listener(config.listen)
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let admin = TcpListener::bind(config.admin_listen)
        .await
        .map_err(|e| format!("cannot listen on {} (admin): {e}", config.admin_listen))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let advertise = crate::identity::advertise_address(config.instance.advertise.as_deref(), bound);

    let mut store_config = config.store.clone();
    store_config.migrate = false;
    let store = crate::store::open(&store_config)
        .await
        .map_err(|e| e.to_string())?;
    if config.store.migrate {
        // Usually the store answers at once; if not, keep trying in the
        // background while the coordinator retries and readiness says 503.
        let first = tokio::time::timeout(Duration::from_secs(3), store.migrate()).await;
        if !matches!(first, Ok(Ok(()))) {
            let store = store.clone();
            tokio::spawn(async move {
                let mut delay = Duration::from_millis(200);
                loop {
                    match store.migrate().await {
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
        }
    }
    let mut builder = config.coordinator(store).advertise(advertise.clone());
    if let Some(log) = &events {
        let log = log.clone();
        builder = builder.on_lease_event(move |e| log.lease(&e));
    }
    let coordinator = builder.start().map_err(|e| e.to_string())?;
    if let Some(log) = &events {
        log.started(coordinator.instance_id());
    }
    let forwarder = Forwarder::new(
        config.proxy.connect_timeout,
        config.proxy.response_header_timeout,
    )
    .map_err(|e| e.to_string())?
    .with_idle_timeout(config.proxy.idle_timeout);
    let mut state = GatewayState::new(&config, coordinator.clone(), forwarder)?;
    state.events = events;
    let state = Arc::new(state);
    tracing::info!(
        instance = coordinator.instance_id(),
        listen = %bound,
        admin = %admin.local_addr().map_err(|e| e.to_string())?,
        advertise = %advertise,
        store = coordinator.store_kind(),
        roles = coordinator.role_names().len(),
        "rolegate gateway started"
    );

    metrics::gauge!(telemetry::CANDIDATE).set(1.0);
    if let Some(upstream) = &config.upstream {
        if let Some(health) = upstream.health.clone() {
            let probe = Forwarder::new(
                config.proxy.connect_timeout,
                config.proxy.response_header_timeout,
            )
            .map_err(|e| e.to_string())?;
            tokio::spawn(watch_health(
                coordinator.clone(),
                probe,
                upstream.url.clone(),
                health,
            ));
        }
    }

    let tracker = ConnectionTracker::default();
    let admin_stop = watch::channel(false);
    let admin_task = tokio::spawn(crate::admin::serve(
        admin,
        coordinator.clone(),
        metrics,
        admin_stop.1,
    ));
    let limits = ServeLimits {
        max_connections,
        idle_timeout: config.proxy.idle_timeout,
    };
    let server = tokio::spawn(serve(listener, state, tracker.clone(), limits));

    shutdown_signal().await;
    tracing::info!(drain_timeout = ?config.shutdown.drain_timeout, "stopping: no new local work, draining in-flight requests");
    // A second signal exits at once.
    tokio::spawn(async {
        shutdown_signal().await;
        tracing::warn!("second signal: exiting now");
        std::process::exit(1);
    });
    coordinator.begin_drain();
    tracker.begin_shutdown();
    let _ = server.await;
    if !tracker.wait_idle(config.shutdown.drain_timeout).await {
        tracing::warn!(
            open = tracker.open(),
            "drain timeout reached; closing remaining connections"
        );
    }
    coordinator.shutdown().await;
    let _ = admin_stop.0.send(true);
    let _ = admin_task.await;
    tracing::info!("stopped; leases released");
    Ok(())
}

/// Candidacy follows the app's health: after `unhealthy_after` consecutive
/// failed probes this instance releases its roles and stops contending; the
/// first good probe after that makes it contend again.
async fn watch_health(
    coordinator: Coordinator,
    probe: Forwarder,
    upstream: String,
    health: crate::config::HealthConfig,
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
        let ok = probe.probe(&url, timeout).await;
        metrics::counter!(telemetry::HEALTH_PROBES, "outcome" => if ok { "ok" } else { "fail" })
            .increment(1);
        if ok {
            failures = 0;
            if !coordinator.is_candidate() {
                tracing::info!(url = %shown, "upstream healthy again; contending for roles");
                coordinator.set_candidate(true);
            }
        } else {
            failures = failures.saturating_add(1);
            if coordinator.is_candidate() && failures >= health.unhealthy_after {
                tracing::warn!(url = %shown, failures, "upstream unhealthy; releasing roles and not contending");
                coordinator.set_candidate(false);
            }
        }
        metrics::gauge!(telemetry::CANDIDATE).set(if coordinator.is_candidate() {
            1.0
        } else {
            0.0
        });
    }
}

/// Binds the public listener with a deep accept backlog, so a burst of new
/// connections is queued rather than dropped (a dropped SYN costs the client
/// a 1 s retransmit, as long as a default connect timeout).
fn bind_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
