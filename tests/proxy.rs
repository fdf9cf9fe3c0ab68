//! The proxy contract (SPEC 6) pinned against three real `rolegate run`
//! processes in front of three recording test apps, on PostgreSQL.

mod support;

use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use support::cluster::{self, ClusterSpec, GatewayProcess, TestApp};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Cluster {
    apps: Vec<TestApp>,
    gws: Vec<GatewayProcess>,
}

impl Cluster {
    /// Three apps and three gateways; gateway 0 starts first and so holds every role.
    async fn start(spec: ClusterSpec) -> Cluster {
        let mut apps = Vec::new();
        for n in 0..3 {
            apps.push(TestApp::start(n).await);
        }
        let mut gws = Vec::new();
        gws.push(GatewayProcess::start(0, &spec, &apps[0]).await);
        support::wait_for_async("gateway 0 holds maintenance", Duration::from_secs(10), || async {
            gws[0].held().await.get("maintenance").is_some_and(|h| h.0)
        })
        .await;
        for n in 1..3 {
            gws.push(GatewayProcess::start(n, &spec, &apps[n]).await);
        }
        let holder = cluster::wait_holder(&gws, "maintenance").await;
        assert_eq!(holder, 0);
        Cluster { apps, gws }
    }

    fn total_executed(&self, path_part: &str) -> Vec<usize> {
        self.apps
            .iter()
            .map(|a| a.executed_paths().iter().filter(|p| p.contains(path_part)).count())
            .collect()
    }
}

fn problem(body: &Bytes) -> serde_json::Value {
    serde_json::from_slice(body).unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(body)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_route_sent_to_any_instance_executes_once_at_the_holder_and_returns_unchanged() {
    let c = Cluster::start(ClusterSpec::postgres("px_once")).await;
    for (i, gw) in c.gws.iter().enumerate() {
        let req = Request::post(format!("{}/maintenance/job?via={i}", gw.url()))
            .header("content-type", "text/plain")
            .body(Body::from(format!("payload {i}")))
            .unwrap();
        let (status, headers, body) = cluster::request(req).await.unwrap();
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(headers["x-app"], "0", "executed by the holder's app");
        let multi: Vec<_> = headers.get_all("x-multi").iter().collect();
        assert_eq!(multi, vec!["a", "b"], "multi-valued headers intact");
        assert_eq!(headers["set-cookie"], "s=1; Path=/");
        assert_eq!(headers["content-type"], "text/plain; charset=utf-8");
        assert_eq!(body, format!("app0 POST /maintenance/job?via={i}"));
    }
    assert_eq!(c.total_executed("/maintenance/job"), vec![3, 0, 0]);
    // Each execution happened once and carried the holder's role and token.
    let token = c.gws[0].held().await["maintenance"].1;
    for e in c.apps[0].executed() {
        assert_eq!(e.headers["x-rolegate-role"], "maintenance");
        assert_eq!(e.headers["x-rolegate-token"], token.to_string().as_str());
    }
    // Paths outside every route go to the local app directly.
    let (_, headers, body) = cluster::get(&format!("{}/plain/page", c.gws[2].url())).await.unwrap();
    assert_eq!(headers["x-app"], "2");
    assert_eq!(body, "app2 GET /plain/page");
    let plain = c.apps[2].executed().into_iter().find(|e| e.path == "/plain/page").unwrap();
    assert!(!plain.headers.contains_key("x-rolegate-role"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_routes_reach_each_partitions_holder_with_its_role_and_token() {
    let spec = ClusterSpec::postgres("px_part");
    let mut apps = Vec::new();
    for n in 0..3 {
        apps.push(TestApp::start(n).await);
    }
    // Start all three at once so the partitions spread over several holders.
    let (a, b, c) = tokio::join!(
        GatewayProcess::start(0, &spec, &apps[0]),
        GatewayProcess::start(1, &spec, &apps[1]),
        GatewayProcess::start(2, &spec, &apps[2])
    );
    let gws = vec![a, b, c];
    for i in 0..8 {
        cluster::wait_holder(&gws, &format!("devices:partition-{i}")).await;
    }
    let mut holders = std::collections::HashSet::new();
    for k in 0..40 {
        let key = format!("device-{k}");
        let role = format!("devices:partition-{}", rolegate::lease::partition_index(None, &key, 8));
        let holder = cluster::holder_of(&gws, &role).await.expect("holder");
        holders.insert(holder);
        let token = gws[holder].held().await[&role].1;
        let via = &gws[k % 3];
        let req = Request::get(format!("{}/device-api/ping/{k}", via.url()))
            .header("x-device-id", &key)
            .body(Body::empty())
            .unwrap();
        let (status, headers, _) = cluster::request(req).await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "key {key}");
        assert_eq!(headers["x-app"], holder.to_string().as_str(), "key {key} runs at its partition's holder");
        let e = apps[holder]
            .executed()
            .into_iter()
            .find(|e| e.path == format!("/device-api/ping/{k}"))
            .expect("executed at holder");
        assert_eq!(e.headers["x-rolegate-role"], role.as_str());
        assert_eq!(e.headers["x-rolegate-token"], token.to_string().as_str());
    }
    eprintln!("partition holders seen: {holders:?}");
    // Scoped route, key from the last path segment.
    let role = format!("devices:partition-{}", rolegate::lease::partition_index(Some("Order"), "77", 8));
    let holder = cluster::holder_of(&gws, &role).await.unwrap();
    let (status, headers, _) = cluster::get(&format!("{}/orders/77", gws[(holder + 1) % 3].url())).await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["x-app"], holder.to_string().as_str());

    // No key: 400 problem+json naming the partition; nothing executed.
    let before: usize = apps.iter().map(|a| a.executed().len()).sum();
    let (status, headers, body) = cluster::get(&format!("{}/device-api/ping", gws[1].url())).await.unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(headers["content-type"], "application/problem+json");
    let p = problem(&body);
    assert_eq!(p["status"], 400);
    assert_eq!(p["reason"], "missing-key");
    assert_eq!(p["partition"], "devices");
    let after: usize = apps.iter().map(|a| a.executed().len()).sum();
    assert_eq!(before, after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_holder_gives_503_with_retry_after_quickly_and_is_not_retried_elsewhere() {
    let mut c = Cluster::start(ClusterSpec::postgres("px_dead")).await;
    c.gws[0].child.kill().unwrap();
    c.gws[0].child.wait().unwrap();
    let t0 = Instant::now();
    let (status, headers, body) = cluster::get(&format!("{}/maintenance/after-crash", c.gws[1].url())).await.unwrap();
    let took = t0.elapsed();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().expect("integer Retry-After");
    assert!(retry >= 1);
    let p = problem(&body);
    assert_eq!(p["reason"], "holder-unreachable");
    assert_eq!(p["role"], "maintenance");
    assert!(took < Duration::from_millis(1_500), "503 took {took:?}; connect timeout is 500ms");
    assert_eq!(c.total_executed("after-crash"), vec![0, 0, 0], "never retried elsewhere");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_marked_request_at_a_non_holder_is_503_and_never_forwarded_or_executed() {
    let c = Cluster::start(ClusterSpec::postgres("px_hop")).await;
    let req = Request::get(format!("{}/maintenance/spoof", c.gws[1].url()))
        .header("x-rolegate-hop", "gw-elsewhere-00000000")
        .body(Body::empty())
        .unwrap();
    let (status, headers, body) = cluster::request(req).await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.contains_key("retry-after"));
    assert_eq!(problem(&body)["reason"], "already-forwarded");
    assert_eq!(c.total_executed("spoof"), vec![0, 0, 0]);
    // At the holder a marked request is simply served; the app never sees the marker.
    let req = Request::get(format!("{}/maintenance/at-holder", c.gws[0].url()))
        .header("x-rolegate-hop", "gw-elsewhere-00000000")
        .body(Body::empty())
        .unwrap();
    assert_eq!(cluster::request(req).await.unwrap().0, StatusCode::CREATED);
    let e = c.apps[0].executed().into_iter().find(|e| e.path.contains("at-holder")).unwrap();
    assert!(!e.headers.contains_key("x-rolegate-hop"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_cluster_secret_a_spoofed_hop_marker_is_dropped_and_the_request_served() {
    let c = Cluster::start(ClusterSpec::postgres("px_sig").with_proxy("  cluster_secret: 0123456789abcdef-test\n")).await;
    for marker in ["gw-elsewhere-00000000", "gw-1;t=1;sig=00", ""] {
        let mut req = Request::get(format!("{}/maintenance/signed", c.gws[1].url()));
        if !marker.is_empty() {
            req = req.header("x-rolegate-hop", marker);
        }
        let (status, headers, _) = cluster::request(req.body(Body::empty()).unwrap()).await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "marker {marker:?}");
        assert_eq!(headers["x-app"], "0");
    }
    assert_eq!(c.total_executed("signed"), vec![3, 0, 0]);
    for e in c.apps[0].executed() {
        assert!(!e.headers.contains_key("x-rolegate-hop"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_events_reach_the_client_through_the_forwarded_path_while_the_stream_is_open() {
    let c = Cluster::start(ClusterSpec::postgres("px_sse")).await;
    let resp = cluster::send(Request::get(format!("{}/maintenance/sse", c.gws[2].url())).body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("event 1 arrives before the app writes event 2")
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), Bytes::from_static(b"data: 1\n\n"));
    c.apps[0].sse_next();
    let second = tokio::time::timeout(Duration::from_secs(5), body.frame()).await.unwrap().unwrap().unwrap();
    assert_eq!(second.into_data().unwrap(), Bytes::from_static(b"data: 2\n\n"));
    assert!(tokio::time::timeout(Duration::from_secs(5), body.frame()).await.unwrap().is_none());
}
