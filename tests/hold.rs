//! Role moves invisible to clients: a role request that has no servable
//! holder right now waits at the gateway (up to `proxy.hold_timeout`) and is
//! then served by the new holder, and no request is ever sent twice.
//!
//! Real gateway processes on PostgreSQL in front of recording apps; steady
//! load through the gateway that does not stop; the apps' records say where
//! each request ran, and how often.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::Request;
use support::cluster::{self, ClusterSpec, GatewayProcess, TestApp};

const ROUTES: &str = "roles:
  - name: maintenance
routes:
  - prefixes: [/maintenance]
    role: maintenance
";

/// Gateway 0 holds `maintenance`, gateway 1 waits.
async fn pair(tag: &str, proxy: &str) -> ([TestApp; 2], [GatewayProcess; 2]) {
    let apps = [TestApp::start(0).await, TestApp::start(1).await];
    let spec = ClusterSpec::postgres(tag)
        .with_proxy(proxy)
        .with_extra("shutdown:\n  drain_timeout: 1s\n");
    let g0 = GatewayProcess::start_for_upstream(0, &spec, apps[0].port, ROUTES).await;
    support::wait_for_async("gateway 0 holds", Duration::from_secs(10), || async {
        g0.held().await.get("maintenance").is_some_and(|h| h.0)
    })
    .await;
    let g1 = GatewayProcess::start_for_upstream(1, &spec, apps[1].port, ROUTES).await;
    let gws = [g0, g1];
    assert_eq!(cluster::wait_holder(&gws, "maintenance").await, 0);
    (apps, gws)
}

/// Starts a slow local request at `holder`, sends it SIGTERM once the app
/// runs that request, and waits until it drains: the request keeps it
/// draining for its full drain bound. Returns the slow request.
async fn drain_behind_a_slow_request(
    app: &TestApp,
    holder: &GatewayProcess,
) -> tokio::task::JoinHandle<Result<(http::StatusCode, http::HeaderMap, bytes::Bytes), String>> {
    let slow_url = format!("{}/maintenance/slow", holder.url());
    let slow = tokio::spawn(async move { cluster::get(&slow_url).await });
    support::wait_for("the slow request runs", Duration::from_secs(5), || {
        app.executed_paths()
            .iter()
            .any(|p| p == "/maintenance/slow")
    })
    .await;
    holder.signal("TERM");
    support::wait_for_async("the holder drains", Duration::from_secs(5), || async {
        holder.leases().await["instance"]["draining"] == true
    })
    .await;
    slow
}

/// What the load saw: status per request id.
#[derive(Default)]
struct Load {
    answers: Mutex<Vec<(u64, u16)>>,
}

/// Waits until `answered()` has grown by `n`: the load runs through a step
/// of the test, not for a guessed time.
async fn more_answers(n: usize, answered: impl Fn() -> usize) {
    let from = answered();
    support::wait_for("more requests answered", Duration::from_secs(30), || {
        answered() >= from + n
    })
    .await;
}

/// Sends requests to `url` one after another (GETs, and POSTs with a small
/// body, alternating) until `stop`; each carries its id in the path.
fn steady_load(url: String, stop: Arc<AtomicBool>) -> (Arc<Load>, tokio::task::JoinHandle<()>) {
    let load = Arc::new(Load::default());
    let out = load.clone();
    let next = Arc::new(AtomicU64::new(0));
    let task = tokio::spawn(async move {
        while !stop.load(Ordering::SeqCst) {
            let id = next.fetch_add(1, Ordering::SeqCst);
            let req = if id.is_multiple_of(2) {
                Request::get(format!("{url}/maintenance/req-{id}"))
                    .body(Body::empty())
                    .unwrap()
            } else {
                Request::post(format!("{url}/maintenance/req-{id}"))
                    .body(Body::from(format!("body of {id}")))
                    .unwrap()
            };
            let status = match cluster::request(req).await {
                Ok((s, _, body)) => {
                    if s != 201 {
                        eprintln!("req-{id}: {s} {}", String::from_utf8_lossy(&body));
                    }
                    s.as_u16()
                }
                Err(e) => {
                    eprintln!("req-{id}: {e}");
                    0
                }
            };
            out.answers.lock().unwrap().push((id, status));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    (load, task)
}

/// How many times each request id ran, over every app.
fn runs(apps: &[TestApp]) -> HashMap<u64, usize> {
    let mut out = HashMap::new();
    for app in apps {
        for e in app.executed() {
            if let Some(id) = e
                .path
                .strip_prefix("/maintenance/req-")
                .and_then(|s| s.parse::<u64>().ok())
            {
                *out.entry(id).or_insert(0) += 1;
            }
        }
    }
    out
}

/// Runs steady load through the standby while `fault` moves the role away
/// from gateway 0; returns (answers, runs per id).
async fn load_across(
    apps: &[TestApp; 2],
    gws: &[GatewayProcess; 2],
    fault: &str,
) -> (Vec<(u64, u16)>, HashMap<u64, usize>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (load, task) = steady_load(gws[1].url(), stop.clone());
    let answered = || load.answers.lock().unwrap().len();
    more_answers(30, answered).await;
    gws[0].signal(fault);
    support::wait_for_async("gateway 1 holds", Duration::from_secs(20), || async {
        gws[1].held().await.get("maintenance").is_some_and(|h| h.0)
    })
    .await;
    more_answers(30, answered).await;
    stop.store(true, Ordering::SeqCst);
    task.await.unwrap();
    let answers = load.answers.lock().unwrap().clone();
    (answers, runs(apps))
}

/// Every request answered 201 and ran exactly once, but for at most
/// `in_flight` requests that were on their way to a holder as it crashed or
/// closed its connections: those may have run, so they are answered 503
/// and never sent again.
fn assert_each_ran_once_and_none_failed(
    answers: &[(u64, u16)],
    runs: &HashMap<u64, usize>,
    in_flight: usize,
) {
    assert!(answers.len() > 50, "too little load: {}", answers.len());
    let failed: Vec<&(u64, u16)> = answers.iter().filter(|(_, s)| *s != 201).collect();
    assert!(
        failed.len() <= in_flight && failed.iter().all(|(_, s)| *s == 503),
        "{} of {} failed: {failed:?}",
        failed.len(),
        answers.len()
    );
    for (id, _) in answers.iter().filter(|(_, s)| *s == 201) {
        assert_eq!(
            runs.get(id),
            Some(&1),
            "request {id} ran {:?} times",
            runs.get(id)
        );
    }
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "requests run twice: {twice:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_of_the_holder_fails_no_request_and_runs_each_once() {
    let (apps, gws) = pair("hold_stop", "").await;
    let (answers, runs) = load_across(&apps, &gws, "TERM").await;
    assert_each_ran_once_and_none_failed(&answers, &runs, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_of_the_holder_fails_no_request_with_a_covering_hold_timeout() {
    // duration 3 s + renew 500 ms + 1 s.
    let (apps, gws) = pair("hold_crash", "  hold_timeout: 4500ms\n").await;
    let (answers, runs) = load_across(&apps, &gws, "KILL").await;
    // The load is sequential: one request at most was on its way to the
    // holder when it died (it may have run there, so it is not sent again),
    // and one more may have reached its sockets as they closed.
    assert_each_ran_once_and_none_failed(&answers, &runs, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_timeout_zero_answers_503_at_once_as_before() {
    let (apps, gws) = pair("hold_zero", "  hold_timeout: 0s\n").await;
    let (answers, runs) = load_across(&apps, &gws, "KILL").await;
    let failed: Vec<&(u64, u16)> = answers.iter().filter(|(_, s)| *s == 503).collect();
    assert!(
        !failed.is_empty(),
        "a crash without holding must fail some requests"
    );
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "requests run twice: {twice:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_past_their_bounds_are_503s_with_retry_after() {
    let (_apps, gws) = pair("hold_bound", "  hold_timeout: 300ms\n  max_held: 1\n").await;
    // The holder dies; its term lasts 3 s more, far past the hold bound.
    gws[0].signal("KILL");
    support::wait_for("the holder is gone", Duration::from_secs(5), || {
        !gws[0].child_alive()
    })
    .await;
    // Its listening sockets may take a moment longer to go than the process.
    let port = gws[0].port;
    support::wait_for(
        "its port refuses connections",
        Duration::from_secs(5),
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
    )
    .await;
    let url = format!("{}/maintenance/x", gws[1].url());
    let started = std::time::Instant::now();
    let (a, b) = tokio::join!(cluster::get(&url), cluster::get(&url));
    let waited = started.elapsed();
    for (status, headers, body) in [a.unwrap(), b.unwrap()] {
        let _ = body;
        assert_eq!(status, 503);
        assert!(headers.contains_key("retry-after"));
    }
    assert!(
        waited >= Duration::from_millis(300),
        "answered after {waited:?}, before the hold bound\n{}",
        gws[1].log()
    );
    let metrics = cluster::get(&format!("{}/metrics", gws[1].admin_url()))
        .await
        .unwrap()
        .2;
    let metrics = String::from_utf8_lossy(&metrics);
    for outcome in ["hold_timeout", "hold_full"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("rolegate_hold_outcomes_total")
                    && l.contains(outcome)
                    && !l.ends_with(" 0")),
            "{outcome} not counted:\n{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_requests_show_per_role_and_each_move_logs_one_line() {
    let (apps, gws) = pair("hold_seen", "  hold_timeout: 6s\n").await;
    gws[0].signal("KILL");
    let port = gws[0].port;
    support::wait_for(
        "the dead holder's port refuses connections",
        Duration::from_secs(5),
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
    )
    .await;
    // Held at gateway 1 until the dead holder's term runs out.
    let url = format!("{}/maintenance/held", gws[1].url());
    let request = tokio::spawn(async move { cluster::get(&url).await });
    let held = || async {
        let v = gws[1].leases().await;
        v["roles"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["role"] == "maintenance")
            .map(|r| r["held_requests"].as_u64().unwrap())
    };
    support::wait_for_async(
        "/leases counts the held request",
        Duration::from_secs(3),
        || async { held().await == Some(1) },
    )
    .await;
    let page = cluster::get(&format!("{}/", gws[1].admin_url()))
        .await
        .unwrap()
        .2;
    let page = String::from_utf8_lossy(&page);
    assert!(page.contains("1 requests held"), "{page}");
    let (status, _, _) = request.await.unwrap().unwrap();
    assert_eq!(status, 201, "{}", gws[1].log());
    assert_eq!(apps[1].executed().len(), 1, "run once, at the successor");
    assert_eq!(held().await, Some(0));
    let log = gws[1].log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("requests held while the role had no servable holder"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    for part in ["role=maintenance", "held=1", "served_here=1", "timed_out=0"] {
        assert!(lines[0].contains(part), "{part}: {}", lines[0]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1mb_upload_held_across_a_move_arrives_intact_at_the_successor() {
    // The hold covers the holder's 1 s drain bound.
    let (apps, gws) = pair("hold_upload", "  hold_timeout: 3s\n").await;
    // The holder drains (a slow request keeps it draining for its full 1 s
    // bound): it no longer admits, the standby still sees it as the holder,
    // forwards, is refused unread, holds, then serves it itself.
    let slow = drain_behind_a_slow_request(&apps[0], &gws[0]).await;
    let body: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let req = Request::post(format!("{}/maintenance/echo-body", gws[1].url()))
        .body(Body::from(body.clone()))
        .unwrap();
    let (status, _, echoed) = cluster::request(req).await.unwrap();
    assert_eq!(
        status,
        200,
        "{}\n{}",
        String::from_utf8_lossy(&echoed[..echoed.len().min(300)]),
        gws[1].log()
    );
    assert_eq!(echoed.len(), body.len());
    assert!(
        echoed.as_ref() == body.as_slice(),
        "the body changed on the way"
    );
    slow.abort();
    let ran: usize = apps
        .iter()
        .map(|a| {
            a.executed_paths()
                .iter()
                .filter(|p| p.ends_with("/echo-body"))
                .count()
        })
        .sum();
    assert_eq!(ran, 1, "the upload ran once");
    // It was held (refused by or unable to reach the draining holder), not
    // merely forwarded before the drain began.
    let metrics = cluster::get(&format!("{}/metrics", gws[1].admin_url()))
        .await
        .unwrap()
        .2;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("rolegate_hold_outcomes_total")
                && l.contains("held_then_")
                && !l.ends_with(" 0")),
        "the upload was not held:\n{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balance_moves_under_load_fail_no_request_and_run_each_once() {
    let routes = "partitions:
  - name: devices
    count: 6
    rebalance_delay: 500ms
routes:
  - prefixes: [/maintenance]
    partition: devices
    key: { path_segment: 2 }
";
    let apps = [
        TestApp::start(0).await,
        TestApp::start(1).await,
        TestApp::start(2).await,
    ];
    let spec = ClusterSpec::postgres("hold_balance");
    let (g0, g1) = tokio::join!(
        GatewayProcess::start_for_upstream(0, &spec, apps[0].port, routes),
        GatewayProcess::start_for_upstream(1, &spec, apps[1].port, routes)
    );
    let two = [g0, g1];
    for p in 0..6 {
        cluster::wait_holder(&two, &format!("devices:partition-{p}")).await;
    }
    // Each request's id is its key: requests spread over the six partitions,
    // and go to gateway 0 whether it holds their partition or not.
    let stop = Arc::new(AtomicBool::new(false));
    let (load, task) = steady_load(two[0].url(), stop.clone());
    let answered = || load.answers.lock().unwrap().len();
    more_answers(30, answered).await;
    // A third gateway joins (partitions move to it), then leaves.
    let g2 = GatewayProcess::start_for_upstream(2, &spec, apps[2].port, routes).await;
    support::wait_for_async("gateway 2 holds 2", Duration::from_secs(20), || async {
        g2.held().await.values().filter(|h| h.0).count() == 2
    })
    .await;
    more_answers(30, answered).await;
    g2.signal("TERM");
    support::wait_for("gateway 2 is gone", Duration::from_secs(20), || {
        !g2.child_alive()
    })
    .await;
    for p in 0..6 {
        cluster::wait_holder(&two, &format!("devices:partition-{p}")).await;
    }
    more_answers(30, answered).await;
    stop.store(true, Ordering::SeqCst);
    task.await.unwrap();
    let answers = load.answers.lock().unwrap().clone();
    assert_each_ran_once_and_none_failed(&answers, &runs(&apps), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_gateway_keeps_its_listener_and_hands_its_new_requests_to_the_successor() {
    let (apps, gws) = pair("hold_stopping", "  hold_timeout: 3s\n").await;
    // A slow local request keeps gateway 0 draining for its 1 s bound.
    let slow = drain_behind_a_slow_request(&apps[0], &gws[0]).await;
    // Sent to the stopping gateway itself, during its drain: held, then
    // served by the successor.
    let (status, headers, body) = cluster::get(&format!("{}/maintenance/late", gws[0].url()))
        .await
        .unwrap();
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers["x-app"], "1", "served by the successor's app");
    let late: usize = apps
        .iter()
        .map(|a| {
            a.executed_paths()
                .iter()
                .filter(|p| *p == "/maintenance/late")
                .count()
        })
        .sum();
    assert_eq!(late, 1);
    // The slow request was cut at the bound: its term ended.
    apps[0].release_slow();
    let _ = slow.await;
}

/// Three gateways restarted one at a time under steady load on role and
/// partition routes, requests sent only to gateways in rotation: every
/// request answered 201 and run exactly once.
async fn rolling_restart(spec: ClusterSpec) {
    let routes = "roles:
  - name: maintenance
partitions:
  - name: devices
    count: 6
    rebalance_delay: 500ms
routes:
  - prefixes: [/maintenance]
    role: maintenance
  - prefixes: [/dev]
    partition: devices
    key: { path_segment: 2 }
";
    let apps = [
        TestApp::start(0).await,
        TestApp::start(1).await,
        TestApp::start(2).await,
    ];
    let (g0, g1, g2) = tokio::join!(
        GatewayProcess::start_for_upstream(0, &spec, apps[0].port, routes),
        GatewayProcess::start_for_upstream(1, &spec, apps[1].port, routes),
        GatewayProcess::start_for_upstream(2, &spec, apps[2].port, routes)
    );
    let mut gws = vec![g0, g1, g2];
    let converge = |gws: &[GatewayProcess]| {
        let urls: Vec<String> = gws.iter().map(|g| g.admin_url()).collect();
        async move {
            support::wait_for_async("every role held", Duration::from_secs(30), || {
                let urls = urls.clone();
                async move {
                    let mut held = 0;
                    for u in &urls {
                        let Ok((_, _, body)) = cluster::get(&format!("{u}/leases")).await else {
                            return false;
                        };
                        let v: serde_json::Value =
                            serde_json::from_slice(&body).unwrap_or_default();
                        held += v["roles"]
                            .as_array()
                            .map_or(0, |r| r.iter().filter(|r| r["held_here"] == true).count());
                    }
                    held == 7
                }
            })
            .await;
        }
    };
    converge(&gws).await;
    let rotation: Arc<Mutex<Vec<String>>> =
        Arc::new(Mutex::new(gws.iter().map(|g| g.url()).collect()));
    let stop = Arc::new(AtomicBool::new(false));
    let answers: Arc<Mutex<Vec<(String, u16)>>> = Arc::default();
    let mut loads = Vec::new();
    for l in 0..2u64 {
        let (rotation, stop, answers) = (rotation.clone(), stop.clone(), answers.clone());
        loads.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let base = {
                    let r = rotation.lock().unwrap();
                    r[(n as usize) % r.len()].clone()
                };
                let id = format!("l{l}-{n}");
                let path = if n.is_multiple_of(2) {
                    format!("/maintenance/{id}")
                } else {
                    format!("/dev/{id}")
                };
                let req = Request::post(format!("{base}{path}"))
                    .body(Body::from(id.clone()))
                    .unwrap();
                let status = match cluster::request(req).await {
                    Ok((s, _, body)) => {
                        if s != 201 {
                            eprintln!("{id} via {base}: {s} {}", String::from_utf8_lossy(&body));
                        }
                        s.as_u16()
                    }
                    Err(e) => {
                        eprintln!("{id} via {base}: {e}");
                        0
                    }
                };
                answers.lock().unwrap().push((id, status));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    let answered = || answers.lock().unwrap().len();
    // Each load loop's answers so far: one more from each means every
    // request picked before a change of the rotation has been answered.
    let per_loop = |l: u64| {
        let prefix = format!("l{l}-");
        answers
            .lock()
            .unwrap()
            .iter()
            .filter(|(id, _)| id.starts_with(&prefix))
            .count()
    };
    for i in 0..3 {
        more_answers(40, answered).await;
        // Out of rotation first, as a load balancer would take it out.
        let url = gws[i].url();
        rotation.lock().unwrap().retain(|u| *u != url);
        let before = [per_loop(0), per_loop(1)];
        support::wait_for("requests to it answered", Duration::from_secs(10), || {
            per_loop(0) > before[0] && per_loop(1) > before[1]
        })
        .await;
        gws[i].signal("TERM");
        support::wait_for("the gateway exits", Duration::from_secs(20), || {
            !gws[i].child_alive()
        })
        .await;
        gws[i] = GatewayProcess::start_for_upstream(i, &spec, apps[i].port, routes).await;
        converge(&gws).await;
        rotation.lock().unwrap().push(gws[i].url());
    }
    more_answers(40, answered).await;
    stop.store(true, Ordering::SeqCst);
    for l in loads {
        l.await.unwrap();
    }
    let answers = answers.lock().unwrap().clone();
    let mut ran: HashMap<String, usize> = HashMap::new();
    for app in &apps {
        for e in app.executed() {
            let id = e.path.rsplit('/').next().unwrap_or_default().to_string();
            *ran.entry(id).or_insert(0) += 1;
        }
    }
    assert!(answers.len() > 100, "too little load: {}", answers.len());
    let failed: Vec<_> = answers.iter().filter(|(_, s)| *s != 201).collect();
    let why: Vec<String> = gws
        .iter()
        .flat_map(|g| {
            g.log()
                .lines()
                .filter(|l| l.contains("WARN"))
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {failed:?}\n{}",
        failed.len(),
        answers.len(),
        why.join("\n")
    );
    for (id, _) in &answers {
        assert_eq!(ran.get(id), Some(&1), "{id} ran {:?} times", ran.get(id));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_three_gateways_on_postgres_fails_no_request() {
    rolling_restart(ClusterSpec::postgres("hold_rolling_pg")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_three_gateways_on_redis_fails_no_request() {
    rolling_restart(ClusterSpec::store(
        "redis",
        &support::redis_url(),
        "hold_rolling_redis",
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_three_gateways_on_etcd_fails_no_request() {
    rolling_restart(ClusterSpec::store(
        "etcd",
        &support::etcd_url(),
        "hold_rolling_etcd",
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apps_503_that_looks_like_a_hop_refusal_is_not_sent_again() {
    // Without a cluster secret the refusal is not signed: only the holder's
    // gateway may set it, never its app.
    let (apps, gws) = pair("hold_forged_refusal", "  hold_timeout: 2s\n").await;
    let (status, headers, _) =
        cluster::get(&format!("{}/maintenance/forged-refusal", gws[1].url()))
            .await
            .unwrap();
    assert_eq!(status, 503);
    assert!(!headers.contains_key("x-rolegate-refused"), "{headers:?}");
    let ran: usize = apps
        .iter()
        .map(|a| {
            a.executed_paths()
                .iter()
                .filter(|p| p.ends_with("/forged-refusal"))
                .count()
        })
        .sum();
    assert_eq!(ran, 1, "the request ran {ran} times");
}
