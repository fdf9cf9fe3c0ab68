//! Work never outlives its term: a stream, tunnel or request admitted under
//! a term ends no later than the term, so two instances never do a role's
//! work at once.
//!
//! Real gateway processes on PostgreSQL (and on a Redis of the test's own,
//! frozen with SIGSTOP, for a fail-close), real apps streaming ticks that
//! carry the role, the token and the moment the app made them
//! (CLOCK_MONOTONIC), and each gateway's `--events` log for when terms began.
//! The check, for every tick a client received: no other term of its role
//! with a greater token began before the app made the tick.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use futures_util::StreamExt;
use http::Request;
use http_body_util::BodyExt;
use support::cluster::{self, ClusterSpec, GatewayProcess, TestApp};
use support::events::{monotonic_ns, Event};

/// One tick a client received.
#[derive(Debug, Clone)]
struct Tick {
    app: String,
    role: String,
    token: u64,
    /// When the app made it.
    made: u64,
}

fn parse_tick(text: &str) -> Option<Tick> {
    let mut parts = text.trim().trim_start_matches("data: ").split(' ');
    Some(Tick {
        app: parts.next()?.to_string(),
        role: parts.next()?.to_string(),
        token: parts.next()?.parse().ok()?,
        made: parts.next()?.parse().ok()?,
    })
}

/// What a client saw of one stream.
#[derive(Debug, Default)]
struct Seen {
    ticks: Vec<Tick>,
    /// How the stream ended, once it did.
    end: Option<String>,
}

type Shared = Arc<Mutex<Seen>>;

/// Reads an SSE stream at `url` (HTTP/1.1, or HTTP/2 with prior knowledge)
/// into `seen` until it ends.
fn read_sse(url: String, http2: bool) -> Shared {
    let seen: Shared = Arc::default();
    let out = seen.clone();
    tokio::spawn(async move {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .http2_only(http2)
                .build_http::<Body>();
        let req = Request::get(&url).body(Body::empty()).unwrap();
        let resp = match client.request(req).await {
            Ok(r) => r,
            Err(e) => {
                out.lock().unwrap().end = Some(format!("request failed: {e}"));
                return;
            }
        };
        if resp.status() != 200 {
            out.lock().unwrap().end = Some(format!("status {}", resp.status()));
            return;
        }
        let mut body = resp.into_body();
        let mut pending = String::new();
        loop {
            match body.frame().await {
                Some(Ok(frame)) => {
                    let Some(data) = frame.data_ref() else {
                        continue;
                    };
                    pending.push_str(&String::from_utf8_lossy(data));
                    while let Some(end) = pending.find("\n\n") {
                        let event: String = pending.drain(..end + 2).collect();
                        if let Some(t) = parse_tick(&event) {
                            out.lock().unwrap().ticks.push(t);
                        }
                    }
                }
                Some(Err(e)) => {
                    out.lock().unwrap().end = Some(reset_reason(&e));
                    return;
                }
                None => {
                    out.lock().unwrap().end = Some("eof".into());
                    return;
                }
            }
        }
    });
    seen
}

/// "reset CANCEL" when an HTTP/2 stream was reset with CANCEL, else the error.
fn reset_reason(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(h2) = c.downcast_ref::<h2::Error>() {
            if let Some(reason) = h2.reason() {
                return format!("reset {reason:?}");
            }
        }
        cause = c.source();
    }
    format!("error: {e}")
}

/// Every term that began, by role: (token, when), from the gateways' logs.
fn terms_began(gws: &[&GatewayProcess]) -> HashMap<String, Vec<(u64, u64)>> {
    let mut out: HashMap<String, Vec<(u64, u64)>> = HashMap::new();
    for g in gws {
        for e in g.events() {
            if let Event::Began { role, token, t, .. } = e {
                out.entry(role).or_default().push((token, t));
            }
        }
    }
    out
}

/// Ticks made after a newer term of their role began somewhere.
fn overlaps(ticks: &[Tick], began: &HashMap<String, Vec<(u64, u64)>>) -> Vec<String> {
    let mut out = Vec::new();
    for tick in ticks {
        for (token, at) in began.get(&tick.role).into_iter().flatten() {
            if *token > tick.token && tick.made >= *at {
                out.push(format!(
                    "{} made a tick of {} under token {} {:.1} ms after token {token} began",
                    tick.app,
                    tick.role,
                    tick.token,
                    (tick.made - at) as f64 / 1e6
                ));
            }
        }
    }
    out
}

/// A key of `devices` in each of its `count` partitions.
fn key_per_partition(count: u32) -> Vec<String> {
    (0..count)
        .map(|p| {
            (0..)
                .map(|i| format!("k{i}"))
                .find(|k| rolegate::lease::partition_index(None, k, count) == p)
                .unwrap()
        })
        .collect()
}

const PARTITION_ROUTES: &str = "partitions:
  - name: devices
    count: 12
    rebalance_delay: 1s
    handover_drain: 300ms
routes:
  - prefixes: [/dev]
    partition: devices
    key: { path_segment: 2 }
";

async fn held_count(gw: &GatewayProcess) -> usize {
    gw.held().await.values().filter(|h| h.0).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_balance_move_ends_the_old_holders_streams_before_the_successor_begins() {
    let apps = [
        TestApp::start(0).await,
        TestApp::start(1).await,
        TestApp::start(2).await,
    ];
    let spec = ClusterSpec::postgres("te_balance").with_events();
    let (g0, g1) = tokio::join!(
        GatewayProcess::start_for_upstream(0, &spec, apps[0].port, PARTITION_ROUTES),
        GatewayProcess::start_for_upstream(1, &spec, apps[1].port, PARTITION_ROUTES)
    );
    let two = [g0, g1];
    for p in 0..12 {
        cluster::wait_holder(&two, &format!("devices:partition-{p}")).await;
    }
    support::wait_for_async("both hold 6", Duration::from_secs(20), || async {
        held_count(&two[0]).await == 6 && held_count(&two[1]).await == 6
    })
    .await;
    // One long stream per partition, all through gateway 0, each served by
    // its holder's app.
    let streams: Vec<Shared> = key_per_partition(12)
        .iter()
        .map(|k| read_sse(format!("{}/dev/{k}/ticks", two[0].url()), false))
        .collect();
    support::wait_for("every stream flows", Duration::from_secs(10), || {
        streams.iter().all(|s| !s.lock().unwrap().ticks.is_empty())
    })
    .await;
    // Gateway 2 joins: balance moves four partitions to it.
    let joined = monotonic_ns();
    let g2 = GatewayProcess::start_for_upstream(2, &spec, apps[2].port, PARTITION_ROUTES).await;
    support::wait_for_async("gateway 2 holds 4", Duration::from_secs(30), || async {
        held_count(&g2).await == 4
    })
    .await;
    let moved_roles = || -> Vec<String> {
        terms_began(&[&two[0], &two[1], &g2])
            .into_iter()
            .filter(|(_, terms)| terms.iter().any(|(_, t)| *t > joined))
            .map(|(role, _)| role)
            .collect()
    };
    support::wait_for("four moves logged", Duration::from_secs(10), || {
        moved_roles().len() >= 4
    })
    .await;
    let moved = moved_roles();
    let stream_of = |role: &str| -> usize {
        role.rsplit('-')
            .next()
            .and_then(|k| k.parse().ok())
            .unwrap()
    };
    // A moved stream ends (its client reconnects, to the new holder): had
    // the old holder gone on streaming, this would time out.
    support::wait_for("the moved streams end", Duration::from_secs(10), || {
        moved
            .iter()
            .all(|r| streams[stream_of(r)].lock().unwrap().end.is_some())
    })
    .await;
    // The others are untouched: still open, still ticking.
    let unmoved: Vec<usize> = (0..12)
        .filter(|k| !moved.iter().any(|r| stream_of(r) == *k))
        .collect();
    let counts: Vec<usize> = unmoved
        .iter()
        .map(|&k| streams[k].lock().unwrap().ticks.len())
        .collect();
    support::wait_for("the other streams go on", Duration::from_secs(10), || {
        unmoved.iter().zip(&counts).all(|(&k, &n)| {
            let s = streams[k].lock().unwrap();
            s.end.is_none() && s.ticks.len() > n + 2
        })
    })
    .await;

    let began = terms_began(&[&two[0], &two[1], &g2]);
    let ticks: Vec<Tick> = streams
        .iter()
        .flat_map(|s| s.lock().unwrap().ticks.clone())
        .collect();
    let bad = overlaps(&ticks, &began);
    assert!(
        bad.is_empty(),
        "{} ticks after a successor began:\n{}\n--- gw0 ---\n{}",
        bad.len(),
        bad.join("\n"),
        two[0].log()
    );
}

/// Waits until the standby's log shows its term of `maintenance` began.
async fn successor_logged(gws: &[GatewayProcess; 2]) {
    support::wait_for(
        "the successor's term is logged",
        Duration::from_secs(5),
        || {
            gws[1]
                .events()
                .iter()
                .any(|e| matches!(e, Event::Began { role, .. } if role == "maintenance"))
        },
    )
    .await;
}

const ROLE_ROUTES: &str = "roles:
  - name: maintenance
routes:
  - prefixes: [/maintenance]
    role: maintenance
";

/// Gateway 0 holds `maintenance`, gateway 1 waits; both log their terms.
async fn holder_and_standby(tag: &str) -> ([TestApp; 2], [GatewayProcess; 2]) {
    let apps = [TestApp::start(0).await, TestApp::start(1).await];
    let spec = ClusterSpec::postgres(tag)
        .with_events()
        .with_extra("shutdown:\n  drain_timeout: 1s\n");
    let g0 = GatewayProcess::start_for_upstream(0, &spec, apps[0].port, ROLE_ROUTES).await;
    support::wait_for_async("gateway 0 holds", Duration::from_secs(10), || async {
        held_count(&g0).await == 1
    })
    .await;
    let g1 = GatewayProcess::start_for_upstream(1, &spec, apps[1].port, ROLE_ROUTES).await;
    let gws = [g0, g1];
    assert_eq!(cluster::wait_holder(&gws, "maintenance").await, 0);
    (apps, gws)
}

/// Stops the holder (SIGTERM) and waits until the standby holds the role.
async fn stop_holder(gws: &[GatewayProcess; 2]) {
    gws[0].signal("TERM");
    support::wait_for_async("gateway 1 holds", Duration::from_secs(20), || async {
        held_count(&gws[1]).await == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_holder_closes_its_websockets_with_1012_before_the_successor_begins() {
    let (apps, gws) = holder_and_standby("te_ws").await;
    // Through the standby: forwarded to the holder, whose gateway runs the
    // tunnel to its app under the term.
    let url = format!("ws://127.0.0.1:{}/maintenance/ws-ticks", gws[1].port);
    let (mut ws, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let seen: Shared = Arc::default();
    let out = seen.clone();
    tokio::spawn(async move {
        use tokio_tungstenite::tungstenite::Message;
        while let Some(msg) = ws.next().await {
            match msg {
                Ok(Message::Text(t)) => {
                    if let Some(t) = parse_tick(&t) {
                        out.lock().unwrap().ticks.push(t);
                    }
                }
                Ok(Message::Close(frame)) => {
                    out.lock().unwrap().end =
                        Some(format!("close {:?}", frame.map(|f| u16::from(f.code))));
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    out.lock().unwrap().end = Some(format!("error: {e}"));
                    return;
                }
            }
        }
        out.lock().unwrap().end = Some("eof".into());
    });
    support::wait_for("ticks flow", Duration::from_secs(10), || {
        seen.lock().unwrap().ticks.len() >= 3
    })
    .await;
    stop_holder(&gws).await;
    support::wait_for("the WebSocket ends", Duration::from_secs(10), || {
        seen.lock().unwrap().end.is_some()
    })
    .await;
    successor_logged(&gws).await;
    let began = terms_began(&[&gws[0], &gws[1]]);
    let seen = seen.lock().unwrap();
    let bad = overlaps(&seen.ticks, &began);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert_eq!(
        seen.end.as_deref(),
        Some("close Some(1012)"),
        "{}",
        gws[0].log()
    );
    runs_once(&apps, "/maintenance/ws-ticks");
}

/// The cut request reached an app once in all: nothing sent it again to
/// the successor's app.
fn runs_once(apps: &[TestApp; 2], path: &str) {
    let runs: Vec<usize> = (apps.iter())
        .map(|a| a.executed_paths().iter().filter(|p| *p == path).count())
        .collect();
    assert_eq!(runs, [1, 0], "executions of {path} at app 0 and app 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_holder_resets_its_http2_streams_with_cancel_before_the_successor_begins() {
    let (apps, gws) = holder_and_standby("te_h2").await;
    let stream = read_sse(format!("{}/maintenance/ticks", gws[0].url()), true);
    support::wait_for("ticks flow", Duration::from_secs(10), || {
        stream.lock().unwrap().ticks.len() >= 3
    })
    .await;
    stop_holder(&gws).await;
    support::wait_for("the stream ends", Duration::from_secs(10), || {
        stream.lock().unwrap().end.is_some()
    })
    .await;
    successor_logged(&gws).await;
    let began = terms_began(&[&gws[0], &gws[1]]);
    let seen = stream.lock().unwrap();
    let bad = overlaps(&seen.ticks, &began);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert_eq!(
        seen.end.as_deref(),
        Some("reset CANCEL"),
        "{}",
        gws[0].log()
    );
    runs_once(&apps, "/maintenance/ticks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_store_ends_the_holders_streams_at_the_trust_deadline() {
    let redis = support::PrivateServer::redis_without_persistence();
    let app = TestApp::start(0).await;
    let spec = ClusterSpec::store("redis", &redis.redis_url(), "te_frozen").with_events();
    let gw = GatewayProcess::start_for_upstream(0, &spec, app.port, ROLE_ROUTES).await;
    support::wait_for_async("the gateway holds", Duration::from_secs(10), || async {
        held_count(&gw).await == 1
    })
    .await;
    let stream = read_sse(format!("{}/maintenance/ticks", gw.url()), false);
    support::wait_for("ticks flow", Duration::from_secs(10), || {
        stream.lock().unwrap().ticks.len() >= 3
    })
    .await;
    redis.signal("STOP");
    let frozen = monotonic_ns();
    // The trust window is 2 s (duration 3 s - safety margin 1 s).
    let waited = std::panic::AssertUnwindSafe(support::wait_for(
        "the stream ends",
        Duration::from_secs(10),
        || stream.lock().unwrap().end.is_some(),
    ));
    let outcome = futures_util::FutureExt::catch_unwind(waited).await;
    redis.signal("CONT");
    outcome.expect("the stream must end while the store is frozen");
    // The last trust deadline the gateway had for its term.
    let until = gw
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Began { until, .. } | Event::Renewed { until, .. } => Some(until),
            _ => None,
        })
        .max()
        .unwrap();
    assert!(
        until > frozen,
        "a renewal after the freeze? {until} {frozen}"
    );
    let seen = stream.lock().unwrap();
    let late: Vec<&Tick> = seen.ticks.iter().filter(|t| t.made >= until).collect();
    assert!(
        late.is_empty(),
        "{} ticks made after the trust deadline: {late:?}",
        late.len()
    );
}

// ---------------------------------------------------------------------------
// The library: the layers' bodies and `begin_local()` end with their term
// ---------------------------------------------------------------------------

mod library {
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use axum::body::Body;
    use axum::extract::Extension;
    use axum::response::Response;
    use axum::routing::get;
    use axum::Router;
    use bytes::Bytes;
    use http_body_util::BodyExt;
    use rolegate::lease::{HeldLease, LeaseEvent};
    use rolegate::store::{LeaseStore, MemoryStore};
    use rolegate::{Coordinator, CoordinatorBuilder, LeaseTimings};
    use rolegate::{KeyExtractor, LayerOptions, PartitionHolderLayer, RoleHolderLayer};
    use tower::ServiceBuilder;

    use super::support;

    const T: LeaseTimings = LeaseTimings {
        duration: Duration::from_millis(900),
        renew_interval: Duration::from_millis(200),
        safety_margin: Duration::from_millis(200),
    };

    /// Terms that began (role, token, when), from every coordinator.
    type Began = Arc<Mutex<Vec<(String, u64, Instant)>>>;
    /// Ticks an app made (role, token, when).
    type Made = Arc<Mutex<Vec<(String, u64, Instant)>>>;

    fn coordinator(store: &Arc<dyn LeaseStore>, name: &str, began: &Began) -> CoordinatorBuilder {
        let began = began.clone();
        CoordinatorBuilder::new(store.clone())
            .instance_name(name)
            .role("reports", T)
            .partition("accounts", 2, T)
            .balance("accounts", Some(Duration::from_millis(300)))
            .handover_drain("accounts", Duration::from_millis(200))
            .drain_timeout(Duration::from_millis(300))
            .on_lease_event(move |e| {
                if let LeaseEvent::Began {
                    role, token, at, ..
                } = e
                {
                    began.lock().unwrap().push((role.to_string(), token, at));
                }
            })
    }

    /// An SSE stream of ticks every 20 ms, each recorded in `made` as the
    /// app produces it, under the lease the layer gave the request.
    fn ticks(lease: HeldLease, made: Made) -> Response {
        let stream = futures_util::stream::unfold(0u64, move |i| {
            let (lease, made) = (lease.clone(), made.clone());
            async move {
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                made.lock()
                    .unwrap()
                    .push((lease.role.to_string(), lease.token, Instant::now()));
                Some((
                    Ok::<_, std::io::Error>(Bytes::from("data: tick\n\n")),
                    i + 1,
                ))
            }
        });
        Response::new(Body::from_stream(stream))
    }

    /// An app with both layers in front of `/reports/ticks` and
    /// `/accounts/{id}/ticks`.
    async fn serve(coordinator: &Coordinator, made: &Made) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let made = made.clone();
        let handler = move |Extension(lease): Extension<HeldLease>| {
            let made = made.clone();
            async move { ticks(lease, made) }
        };
        let routes = Router::new()
            .route("/reports/ticks", get(handler.clone()))
            .route("/accounts/{id}/ticks", get(handler));
        let options = LayerOptions::new().unwrap();
        let gated = ServiceBuilder::new()
            .layer(
                RoleHolderLayer::new(coordinator, "reports", options.clone())
                    .unwrap()
                    .prefixes(["/reports"]),
            )
            .layer(
                PartitionHolderLayer::new(
                    coordinator,
                    "accounts",
                    KeyExtractor::PathSegment(2),
                    options,
                )
                .unwrap()
                .prefixes(["/accounts"]),
            )
            .service(routes);
        let app = Router::new().fallback_service(gated);
        tokio::spawn(async move {
            let _ = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await;
        });
        port
    }

    /// Reads `url` until the stream ends; `Some(true)` once it has.
    fn read(url: String) -> Arc<Mutex<Option<bool>>> {
        let ended = Arc::new(Mutex::new(Some(false)));
        let out = ended.clone();
        tokio::spawn(async move {
            let req = http::Request::get(&url).body(Body::empty()).unwrap();
            if let Ok(resp) = support::cluster::client().request(req).await {
                let mut body = resp.into_body();
                while let Some(Ok(_)) = body.frame().await {}
            }
            *out.lock().unwrap() = Some(true);
        });
        ended
    }

    /// Ticks made under a token after a newer term of their role began.
    fn overlaps(made: &Made, began: &Began) -> Vec<String> {
        let began = began.lock().unwrap();
        let mut out = Vec::new();
        for (role, token, at) in made.lock().unwrap().iter() {
            for (r, t, b) in began.iter() {
                if r == role && t > token && at >= b {
                    out.push(format!(
                        "a tick of {role} under token {token} {:?} after token {t} began",
                        *at - *b
                    ));
                }
            }
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_balance_handover_waits_for_and_ends_a_layers_streaming_body() {
        let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
        let (began, made): (Began, Made) = Default::default();
        let a = coordinator(&store, "a", &began).start().unwrap();
        support::wait_for("a holds both", Duration::from_secs(5), || {
            a.partition("accounts").unwrap().held_here() == 2
        })
        .await;
        let port = serve(&a, &made).await;
        let keys: Vec<String> = (0..2)
            .map(|p| {
                (0..)
                    .map(|i| format!("k{i}"))
                    .find(|k| rolegate::lease::partition_index(None, k, 2) == p)
                    .unwrap()
            })
            .collect();
        let streams: Vec<_> = keys
            .iter()
            .map(|k| read(format!("http://127.0.0.1:{port}/accounts/{k}/ticks")))
            .collect();
        support::wait_for("ticks flow", Duration::from_secs(5), || {
            made.lock().unwrap().len() >= 6
        })
        .await;
        // b joins: one of the two roles moves to it.
        let b = coordinator(&store, "b", &began).start().unwrap();
        support::wait_for("b holds one", Duration::from_secs(10), || {
            b.partition("accounts").unwrap().held_here() == 1
        })
        .await;
        // The moved role's stream ends; the other goes on ticking.
        let ended = || {
            streams
                .iter()
                .filter(|s| *s.lock().unwrap() == Some(true))
                .count()
        };
        support::wait_for("the moved stream ends", Duration::from_secs(5), || {
            ended() >= 1
        })
        .await;
        let so_far = made.lock().unwrap().len();
        support::wait_for("the other stream goes on", Duration::from_secs(5), || {
            made.lock().unwrap().len() > so_far + 3
        })
        .await;
        let bad = overlaps(&made, &began);
        assert!(bad.is_empty(), "{}", bad.join("\n"));
        let ended = streams
            .iter()
            .filter(|s| *s.lock().unwrap() == Some(true))
            .count();
        assert_eq!(ended, 1, "the moved role's stream ends, the other goes on");
        a.shutdown_now().await;
        b.shutdown_now().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_drains_then_ends_a_layers_streaming_body_before_releasing() {
        let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
        let (began, made): (Began, Made) = Default::default();
        let a = coordinator(&store, "a", &began).start().unwrap();
        support::wait_for("a holds reports", Duration::from_secs(5), || {
            a.role("reports").unwrap().is_held()
        })
        .await;
        let b = coordinator(&store, "b", &began).start().unwrap();
        let port = serve(&a, &made).await;
        let stream = read(format!("http://127.0.0.1:{port}/reports/ticks"));
        support::wait_for("ticks flow", Duration::from_secs(5), || {
            made.lock().unwrap().len() >= 3
        })
        .await;
        a.shutdown().await;
        support::wait_for("b holds reports", Duration::from_secs(5), || {
            b.role("reports").unwrap().is_held()
        })
        .await;
        support::wait_for("the stream ends", Duration::from_secs(5), || {
            *stream.lock().unwrap() == Some(true)
        })
        .await;
        let bad = overlaps(&made, &began);
        assert!(bad.is_empty(), "{}", bad.join("\n"));
        b.shutdown_now().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_begin_local_user_that_listens_for_the_ending_stops_in_time() {
        let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
        let (began, made): (Began, Made) = Default::default();
        // A long drain bound: the loop stops on the ending signal, not at the bound.
        let a = coordinator(&store, "a", &began)
            .drain_timeout(Duration::from_secs(30))
            .start()
            .unwrap();
        support::wait_for("a holds reports", Duration::from_secs(5), || {
            a.role("reports").unwrap().is_held()
        })
        .await;
        let b = coordinator(&store, "b", &began).start().unwrap();
        let (lease, work) = a.role("reports").unwrap().begin_local().unwrap();
        let log = made.clone();
        let worker = tokio::spawn(async move {
            let ending = work.ending();
            tokio::pin!(ending);
            loop {
                tokio::select! {
                    _ = &mut ending => break,
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {
                        log.lock().unwrap().push((lease.role.to_string(), lease.token, Instant::now()));
                    }
                }
            }
            // Stopped because the term is ending, before it was over.
            work.is_over()
        });
        support::wait_for("the loop runs", Duration::from_secs(5), || {
            made.lock().unwrap().len() >= 3
        })
        .await;
        let shutdown = tokio::spawn(async move { a.shutdown().await });
        assert!(
            !worker.await.unwrap(),
            "the loop stopped only once the term was over"
        );
        tokio::time::timeout(Duration::from_secs(10), shutdown)
            .await
            .expect("shutdown returns once the work stopped, not at the 30 s bound")
            .unwrap();
        support::wait_for("b holds reports", Duration::from_secs(5), || {
            b.role("reports").unwrap().is_held()
        })
        .await;
        let bad = overlaps(&made, &began);
        assert!(bad.is_empty(), "{}", bad.join("\n"));
        b.shutdown_now().await;
    }
}
