//! The proxy contract (docs/proxy.md) pinned against three real `rolegate run`
//! processes in front of three recording test apps, on PostgreSQL.

mod support;

use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use support::cluster::{
    self, raw_exchange, status_of, Cluster, ClusterSpec, GatewayProcess, TestApp,
};

fn problem(body: &Bytes) -> serde_json::Value {
    serde_json::from_slice(body)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(body)))
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
    let (_, headers, body) = cluster::get(&format!("{}/plain/page", c.gws[2].url()))
        .await
        .unwrap();
    assert_eq!(headers["x-app"], "2");
    assert_eq!(body, "app2 GET /plain/page");
    let plain = c.apps[2]
        .executed()
        .into_iter()
        .find(|e| e.path == "/plain/page")
        .unwrap();
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
        let role = format!(
            "devices:partition-{}",
            rolegate::lease::partition_index(None, &key, 8)
        );
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
        assert_eq!(
            headers["x-app"],
            holder.to_string().as_str(),
            "key {key} runs at its partition's holder"
        );
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
    let role = format!(
        "devices:partition-{}",
        rolegate::lease::partition_index(Some("Order"), "77", 8)
    );
    let holder = cluster::holder_of(&gws, &role).await.unwrap();
    let (status, headers, _) = cluster::get(&format!("{}/orders/77", gws[(holder + 1) % 3].url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["x-app"], holder.to_string().as_str());

    // No key: 400 problem+json naming the partition; nothing executed.
    let before: usize = apps.iter().map(|a| a.executed().len()).sum();
    let (status, headers, body) = cluster::get(&format!("{}/device-api/ping", gws[1].url()))
        .await
        .unwrap();
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
    let (status, headers, body) =
        cluster::get(&format!("{}/maintenance/after-crash", c.gws[1].url()))
            .await
            .unwrap();
    let took = t0.elapsed();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let retry: u64 = headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .expect("integer Retry-After");
    assert!(retry >= 1);
    let p = problem(&body);
    assert_eq!(p["reason"], "holder-unreachable");
    assert_eq!(p["role"], "maintenance");
    assert!(
        took < Duration::from_millis(1_500),
        "503 took {took:?}; connect timeout is 500ms"
    );
    assert_eq!(
        c.total_executed("after-crash"),
        vec![0, 0, 0],
        "never retried elsewhere"
    );
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
    // A request that already passed two rolegate gateways (a loop, e.g. with
    // mismatched cluster secrets) is never forwarded again.
    let req = Request::get(format!("{}/maintenance/looped", c.gws[1].url()))
        .header("via", "1.1 rolegate, 1.1 rolegate")
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = cluster::request(req).await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(problem(&body)["reason"], "already-forwarded");
    assert_eq!(c.total_executed("looped"), vec![0, 0, 0]);
    // At the holder a marked request is simply served; the app never sees the marker.
    let req = Request::get(format!("{}/maintenance/at-holder", c.gws[0].url()))
        .header("x-rolegate-hop", "gw-elsewhere-00000000")
        .body(Body::empty())
        .unwrap();
    assert_eq!(cluster::request(req).await.unwrap().0, StatusCode::CREATED);
    let e = c.apps[0]
        .executed()
        .into_iter()
        .find(|e| e.path.contains("at-holder"))
        .unwrap();
    assert!(!e.headers.contains_key("x-rolegate-hop"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_cluster_secret_a_spoofed_hop_marker_is_dropped_and_the_request_served() {
    let c = Cluster::start(
        ClusterSpec::postgres("px_sig").with_proxy("  cluster_secret: 0123456789abcdef-test\n"),
    )
    .await;
    for marker in ["gw-elsewhere-00000000", "gw-1;t=1;sig=00", ""] {
        let mut req = Request::get(format!("{}/maintenance/signed", c.gws[1].url()));
        if !marker.is_empty() {
            req = req.header("x-rolegate-hop", marker);
        }
        let (status, headers, _) = cluster::request(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(status, StatusCode::CREATED, "marker {marker:?}");
        assert_eq!(headers["x-app"], "0");
    }
    assert_eq!(c.total_executed("signed"), vec![3, 0, 0]);
    for e in c.apps[0].executed() {
        assert!(!e.headers.contains_key("x-rolegate-hop"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hop_signed_with_another_cluster_secret_is_counted_and_warned_once_naming_the_peer() {
    let spec = ClusterSpec::postgres("px_badsig")
        .with_proxy("  cluster_secret: the-holders-secret-0123456789\n");
    let apps = [TestApp::start(0).await, TestApp::start(1).await];
    let holder = GatewayProcess::start(0, &spec, &apps[0]).await;
    support::wait_for_async(
        "gateway 0 holds maintenance",
        Duration::from_secs(10),
        || async { holder.held().await.get("maintenance").is_some_and(|h| h.0) },
    )
    .await;
    // The same store and routes, another secret: the operator's typo.
    let mut other = spec.clone();
    other.proxy_yaml = "  cluster_secret: another-secret-0123456789abc\n".into();
    let peer = GatewayProcess::start(1, &other, &apps[1]).await;
    for _ in 0..3 {
        let req = Request::get(format!("{}/maintenance/mismatch", peer.url()))
            .body(Body::empty())
            .unwrap();
        let (status, headers, _) = cluster::request(req).await.unwrap();
        // The refused marker is dropped; the holder serves it as fresh.
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(headers["x-app"], "0");
    }
    let (_, _, body) = cluster::get(&format!("{}/metrics", holder.admin_url()))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.lines()
            .any(|l| l == "rolegate_hops_refused_total{reason=\"bad-signature\"} 3"),
        "{text}"
    );
    let log = holder.log();
    let warns: Vec<_> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("refused a hop marker from 127.0.0.1:"))
        .collect();
    assert_eq!(warns.len(), 1, "one WARN a minute at most:\n{log}");
    assert!(warns[0].contains("cluster_secret"), "{}", warns[0]);
    assert_eq!(holder.leases().await["instance"]["hops_signed"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_events_reach_the_client_through_the_forwarded_path_while_the_stream_is_open() {
    let c = Cluster::start(ClusterSpec::postgres("px_sse")).await;
    let resp = cluster::send(
        Request::get(format!("{}/maintenance/sse", c.gws[2].url()))
            .body(Body::empty())
            .unwrap(),
    )
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
    assert_eq!(
        first.into_data().unwrap(),
        Bytes::from_static(b"data: 1\n\n")
    );
    c.apps[0].sse_next();
    let second = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        second.into_data().unwrap(),
        Bytes::from_static(b"data: 2\n\n")
    );
    assert!(tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .unwrap()
        .is_none());
}

/// Bytes of gateway memory growth allowed while 200 MB stream through it.
const STREAM_RSS_LIMIT_KIB: u64 = 16 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200mb_upload_and_download_stream_through_the_forwarded_path_in_bounded_memory() {
    let c = Cluster::start(ClusterSpec::postgres("px_big")).await;
    const SIZE: u64 = 200 * 1024 * 1024;
    // Warm up both gateways so pools and buffers exist before measuring.
    let warm = cluster::get(&format!(
        "{}/maintenance/download?bytes=1048576",
        c.gws[1].url()
    ))
    .await
    .unwrap();
    assert_eq!(warm.2.len(), 1_048_576);
    let rss_before = [c.gws[0].rss_kib(), c.gws[1].rss_kib()];

    // Upload: a generated stream, never held in memory by the test either.
    let chunk = Bytes::from(vec![b'u'; 256 * 1024]);
    let chunks = (SIZE / chunk.len() as u64) as usize;
    let stream = futures_util::stream::iter(
        (0..chunks).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
    );
    let req = Request::post(format!("{}/maintenance/upload", c.gws[1].url()))
        .body(Body::from_stream(stream))
        .unwrap();
    let (status, _, body) = cluster::request(req).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, format!("received {SIZE}"));

    // Download: count bytes as they arrive.
    let resp = cluster::send(
        Request::get(format!(
            "{}/maintenance/download?bytes={SIZE}",
            c.gws[1].url()
        ))
        .body(Body::empty())
        .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(resp.headers()["content-length"], SIZE.to_string().as_str());
    let mut body = resp.into_body();
    let mut got = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(d) = frame.unwrap().into_data() {
            got += d.len() as u64;
        }
    }
    assert_eq!(got, SIZE);
    let rss_after = [c.gws[0].rss_kib(), c.gws[1].rss_kib()];
    for i in 0..2 {
        let grew = rss_after[i].saturating_sub(rss_before[i]);
        eprintln!(
            "gateway {i}: RSS {} KiB -> {} KiB",
            rss_before[i], rss_after[i]
        );
        assert!(
            grew < STREAM_RSS_LIMIT_KIB,
            "gateway {i} grew by {grew} KiB while streaming 400 MB"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_and_connection_named_headers_are_removed_and_framing_is_preserved() {
    let c = Cluster::start(ClusterSpec::postgres("px_hdr")).await;
    for (via, label) in [(&c.gws[0], "local"), (&c.gws[1], "forwarded")] {
        let req = Request::post(format!("{}/maintenance/headers-{label}", via.url()))
            .header("connection", "x-private-hop")
            .header("x-private-hop", "secret")
            .header("keep-alive", "timeout=5")
            .header("proxy-connection", "keep-alive")
            .header("te", "trailers")
            .header("x-rolegate-role", "admin")
            .header("x-rolegate-token", "999999")
            .header("x-rolegate-anything", "1")
            .header("content-length", "0")
            .body(Body::empty())
            .unwrap();
        let (status, _, _) = cluster::request(req).await.unwrap();
        assert_eq!(status, StatusCode::CREATED);
        let e = c.apps[0]
            .executed()
            .into_iter()
            .find(|e| e.path.ends_with(label))
            .unwrap();
        let h = &e.headers;
        for gone in [
            "x-private-hop",
            "keep-alive",
            "proxy-connection",
            "x-rolegate-anything",
            "transfer-encoding",
        ] {
            assert!(
                !h.contains_key(gone),
                "{label}: {gone} reached the app: {h:?}"
            );
        }
        assert_eq!(h["te"], "trailers");
        assert_eq!(
            h["content-length"], "0",
            "{label}: Content-Length: 0 preserved"
        );
        assert_eq!(h["x-rolegate-role"], "maintenance");
        assert_ne!(h["x-rolegate-token"], "999999");
        assert!(h["via"].to_str().unwrap().contains("1.1 rolegate"));
        assert!(h.contains_key("forwarded") && h.contains_key("x-forwarded-for"));
        if label == "forwarded" {
            assert_eq!(h.get_all("via").iter().count(), 1);
            let via = h["via"].to_str().unwrap();
            assert!(
                via.starts_with("1.1 rolegate (") && via.ends_with("), 1.1 rolegate"),
                "two hops recorded, the peer hop naming its gateway (loop guard): {via}"
            );
        }

        // A bodiless GET gets neither Content-Length nor Transfer-Encoding added.
        let (status, _, _) = cluster::get(&format!("{}/maintenance/bodiless-{label}", via.url()))
            .await
            .unwrap();
        assert_eq!(status, StatusCode::CREATED);
        let e = c.apps[0]
            .executed()
            .into_iter()
            .find(|e| e.path.ends_with(&format!("bodiless-{label}")))
            .unwrap();
        assert!(
            !e.headers.contains_key("transfer-encoding"),
            "{label}: {:?}",
            e.headers
        );
        assert!(
            !e.headers.contains_key("content-length"),
            "{label}: {:?}",
            e.headers
        );

        // HEAD: the GET's headers, no body.
        let (status, headers, body) = cluster::request(
            Request::head(format!("{}/maintenance/head-{label}", via.url()))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(headers["x-app"], "0");
        assert!(body.is_empty());
    }
    // 204 and 304 keep their status and carry no body, on a plain path.
    for (path, code) in [("/status/204", 204), ("/status/304", 304)] {
        let (status, headers, body) = cluster::get(&format!("{}{path}", c.gws[1].url()))
            .await
            .unwrap();
        assert_eq!(status.as_u16(), code);
        assert!(body.is_empty());
        assert!(!headers.contains_key("transfer-encoding"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_echo_works_through_a_forwarded_route_and_a_plain_path() {
    let c = Cluster::start(ClusterSpec::postgres("px_ws")).await;
    cluster::websocket_client_echo(&format!("ws://127.0.0.1:{}/maintenance/ws", c.gws[2].port))
        .await;
    cluster::websocket_client_echo(&format!("ws://127.0.0.1:{}/chat/ws", c.gws[1].port)).await;
    assert_eq!(c.total_executed("/maintenance/ws"), vec![1, 0, 0]);
    assert_eq!(c.total_executed("/chat/ws"), vec![0, 1, 0]);
    // A refused upgrade is an ordinary error response, and the gateway goes on.
    let req = Request::get(format!("{}/maintenance/not-ws", c.gws[2].url()))
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .body(Body::empty())
        .unwrap();
    let (status, _, _) = cluster::request(req).await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
    cluster::websocket_client_echo(&format!("ws://127.0.0.1:{}/maintenance/ws", c.gws[2].port))
        .await;
}

/// Counts accepted connections and relays bytes to `target`.
/// `target` is the port relayed to, set once the relayed gateway is up.
async fn counting_relay(
    target: std::sync::Arc<std::sync::atomic::AtomicU16>,
) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                continue;
            };
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let target = target.load(std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut outbound) =
                    tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (port, count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_and_upstream_connections_are_reused_across_sequential_requests() {
    let spec = ClusterSpec::postgres("px_pool");
    let apps = [TestApp::start(0).await, TestApp::start(1).await];
    // Gateway 0 advertises a relay in front of itself, so the test can count
    // the TCP connections other gateways open to it.
    let target = std::sync::Arc::new(std::sync::atomic::AtomicU16::new(0));
    let (relay, accepts) = counting_relay(target.clone()).await;
    let spec0 = ClusterSpec {
        extra_yaml: String::new(),
        ..spec.clone()
    };
    let g0 = GatewayProcess::start_on_advertised(
        0,
        &spec0,
        apps[0].port,
        0,
        0,
        &format!("http://127.0.0.1:{relay}"),
    )
    .await;
    target.store(g0.port, std::sync::atomic::Ordering::SeqCst);
    support::wait_for_async("g0 holds", Duration::from_secs(10), || async {
        g0.held().await.get("maintenance").is_some_and(|h| h.0)
    })
    .await;
    let g1 = GatewayProcess::start(1, &spec, &apps[1]).await;
    let gws = vec![g0, g1];
    cluster::wait_holder(&gws, "maintenance").await;
    let app_accepts_before = apps[0].accepts();
    let client = cluster::client();
    for i in 0..100 {
        let req = Request::get(format!("{}/maintenance/seq/{i}", gws[1].url()))
            .body(Body::empty())
            .unwrap();
        let resp = client.request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED);
        resp.into_body().collect().await.unwrap();
    }
    let peer = accepts.load(std::sync::atomic::Ordering::SeqCst);
    let upstream = apps[0].accepts() - app_accepts_before;
    eprintln!("100 forwarded requests: {peer} peer connections, {upstream} upstream connections");
    // Each client connection owns its peer and upstream connections, and
    // the test's pooled client may open a second or, rarely, a third (a
    // request sent before the last one's connection was back in its pool):
    // one per request would be 100.
    assert!(
        peer <= 3,
        "expected pooled peer connections, saw {peer} accepts for 100 requests"
    );
    assert!(
        upstream <= 3,
        "expected pooled upstream connections, saw {upstream}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_4xx_and_the_gateway_keeps_serving() {
    let c = Cluster::start(ClusterSpec::postgres("px_bad")).await;
    let port = c.gws[1].port;
    let bad_bytes = raw_exchange(
        port,
        b"GET /maintenance/x HTTP/1.1\r\nHost: a\r\nX-Bad: a\x01b\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&bad_bytes), 400, "{bad_bytes}");
    let huge = format!(
        "GET /maintenance/x HTTP/1.1\r\nHost: a\r\nX-Huge: {}\r\n\r\n",
        "h".repeat(200 * 1024)
    );
    let huge = raw_exchange(port, huge.as_bytes()).await;
    assert!((400..500).contains(&status_of(&huge)), "{huge}");
    let no_slash = raw_exchange(
        port,
        b"GET maintenance/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!((400..500).contains(&status_of(&no_slash)), "{no_slash}");
    let garbage = raw_exchange(
        port,
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03garbage\r\n\r\n",
    )
    .await;
    assert!(
        garbage.is_empty() || (400..500).contains(&status_of(&garbage)),
        "{garbage}"
    );
    assert_eq!(c.total_executed("/maintenance/x"), vec![0, 0, 0]);
    // Still serving.
    let (status, headers, _) = cluster::get(&format!("{}/maintenance/after", c.gws[1].url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["x-app"], "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_work_finish_then_hands_over_and_exits_0() {
    let mut c = Cluster::start(ClusterSpec::postgres("px_term")).await;
    let url = format!("{}/maintenance/slow", c.gws[1].url());
    let in_flight = tokio::spawn(async move { cluster::get(&url).await });
    support::wait_for(
        "slow request reached the holder's app",
        Duration::from_secs(5),
        || {
            c.apps[0]
                .executed_paths()
                .iter()
                .any(|p| p.ends_with("/slow"))
        },
    )
    .await;
    c.gws[0].signal("TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Still draining: the role stays with gateway 0 while its request runs.
    assert!(
        c.gws[0].child.try_wait().unwrap().is_none(),
        "exited before in-flight work finished"
    );
    c.apps[0].release_slow();
    let (status, _, body) = in_flight.await.unwrap().unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "slow done by app0");
    let t0 = Instant::now();
    let code = loop {
        if let Some(code) = c.gws[0].child.try_wait().unwrap() {
            break code;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "gateway did not exit"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(code.success(), "exit status {code:?}");
    let gws = &c.gws[1..];
    let took = support::wait_for_async(
        "another gateway holds maintenance",
        Duration::from_secs(5),
        || async { cluster::holder_of(gws, "maintenance").await.is_some() },
    )
    .await;
    // The renew interval is 500ms: the release wakes the others at once.
    assert!(took < Duration::from_millis(500), "handover took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_trailers_pass_through_the_forwarded_path() {
    let c = Cluster::start(ClusterSpec::postgres("px_trl")).await;
    for via in [&c.gws[0], &c.gws[2]] {
        let req = Request::get(format!("{}/maintenance/trailers", via.url()))
            .header("te", "trailers")
            .body(Body::empty())
            .unwrap();
        let resp = cluster::send(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let mut body = resp.into_body();
        let mut data = Vec::new();
        let mut trailers = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.unwrap();
            match frame.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        assert_eq!(data, b"part-1 part-2");
        let trailers = trailers.expect("trailers arrive");
        assert_eq!(trailers["x-checksum"], "abc123");
    }
}

/// One HTTP/1.1 client connection to `port`.
async fn one_connection(port: u16) -> hyper::client::conn::http1::SendRequest<Body> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

/// The ports the app saw requests for `prefix` come from, in order.
fn from_ports(app: &TestApp, prefix: &str) -> Vec<u16> {
    app.executed()
        .into_iter()
        .filter(|e| e.path.starts_with(prefix))
        .map(|e| e.from_port)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_client_connection_keeps_its_own_upstream_and_peer_connections() {
    let c = Cluster::start(ClusterSpec::postgres("px_affine")).await;
    // Two keep-alive clients of a non-holder, taking turns: a shared pool
    // would hand both the one idle connection; here each keeps its own, on
    // the forwarded path (peer hop, then the holder's app) and on a plain
    // path (this gateway's app).
    let mut clients = [
        one_connection(c.gws[1].port).await,
        one_connection(c.gws[1].port).await,
    ];
    for round in 0..10 {
        for (who, client) in clients.iter_mut().enumerate() {
            for path in [
                format!("/maintenance/affine/{who}/{round}"),
                format!("/plain/affine/{who}/{round}"),
            ] {
                client.ready().await.unwrap();
                let req = Request::get(path.as_str())
                    .header("host", "gateway.test")
                    .body(Body::empty())
                    .unwrap();
                let resp = client.send_request(req).await.unwrap();
                assert!(resp.status().is_success(), "{path}: {}", resp.status());
                resp.into_body().collect().await.unwrap();
            }
        }
    }
    for (app, prefix) in [
        (&c.apps[0], "/maintenance/affine/"),
        (&c.apps[1], "/plain/affine/"),
    ] {
        let mut per_client = Vec::new();
        for who in 0..2 {
            let ports = from_ports(app, &format!("{prefix}{who}/"));
            assert_eq!(ports.len(), 10, "{prefix}{who}: {ports:?}");
            assert!(
                ports.iter().all(|p| *p == ports[0]),
                "client {who}'s requests under {prefix} came on one connection: {ports:?}"
            );
            per_client.push(ports[0]);
        }
        assert_ne!(
            per_client[0], per_client[1],
            "the two clients share an upstream connection under {prefix}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_client_connection_lets_its_own_upstream_connection_close() {
    let app = TestApp::start(0).await;
    let gw = GatewayProcess::start(0, &ClusterSpec::postgres("px_idle"), &app).await;
    let mut client = one_connection(gw.port).await;
    let mut get = |path: &'static str| {
        let req = Request::get(path).header("host", "gateway.test");
        let sent = client.send_request(req.body(Body::empty()).unwrap());
        async move {
            let resp = sent.await.unwrap();
            assert!(resp.status().is_success(), "{path}: {}", resp.status());
            resp.into_body().collect().await.unwrap();
        }
    };
    get("/plain/idle/first").await;
    let first = from_ports(&app, "/plain/idle/first")[0];
    assert!(app.is_open_from(first));
    // Idle past the pool's 4 s limit, the gateway lets it go while the
    // client connection stays open, as the pool closes its idle connections.
    support::wait_for(
        "the idle upstream connection closes",
        Duration::from_secs(12),
        || !app.is_open_from(first),
    )
    .await;
    get("/plain/idle/second").await;
    let second = from_ports(&app, "/plain/idle/second")[0];
    assert_ne!(
        second, first,
        "a new upstream connection for the next request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_closes_idle_client_connections_at_once_not_at_the_drain_bound() {
    // A long drain bound, so closing at once and closing at the bound differ.
    let spec =
        ClusterSpec::postgres("px_stop_idle").with_extra("shutdown:\n  drain_timeout: 60s\n");
    let app = TestApp::start(0).await;
    let gw = GatewayProcess::start(0, &spec, &app).await;
    // Idle keep-alive clients that each sent a request through an upstream
    // connection of their own: HTTP/1.1, and h2c with prior knowledge.
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", gw.port)).await;
    let (mut h1, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp.unwrap()))
        .await
        .unwrap();
    let h1_open = tokio::spawn(conn);
    get_ok(&mut h1, "/plain/stop/h1").await;
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", gw.port)).await;
    let executor = hyper_util::rt::TokioExecutor::new();
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(executor, TokioIo::new(tcp.unwrap()))
            .await
            .unwrap();
    let h2_open = tokio::spawn(conn);
    let req = Request::get("http://gateway.test/plain/stop/h2").body(Body::empty());
    let resp = h2.send_request(req.unwrap()).await.unwrap();
    assert!(resp.status().is_success(), "h2: {}", resp.status());
    resp.into_body().collect().await.unwrap();
    assert_eq!(app.executed_paths().len(), 2);

    gw.signal("TERM");
    // The gateway closes an idle HTTP/1.1 connection, and sends GOAWAY on
    // an idle HTTP/2 one, as soon as the stop begins.
    for (which, open) in [("HTTP/1.1", h1_open), ("HTTP/2", h2_open)] {
        let closed = tokio::time::timeout(Duration::from_secs(10), open).await;
        assert!(
            closed.is_ok(),
            "the idle {which} connection still open 10 s after SIGTERM"
        );
    }
}

/// POST a small body to `path` on `client`, expecting a success.
async fn post_ok(client: &mut hyper::client::conn::http1::SendRequest<Body>, path: &str) {
    client.ready().await.unwrap();
    let req = Request::post(path).header("host", "gateway.test");
    let resp = client
        .send_request(req.body(Body::from("x")).unwrap())
        .await;
    let resp = resp.unwrap();
    assert!(resp.status().is_success(), "{path}: {}", resp.status());
    resp.into_body().collect().await.unwrap();
}

/// GET `path` on `client`, expecting a success.
async fn get_ok(client: &mut hyper::client::conn::http1::SendRequest<Body>, path: &str) {
    client.ready().await.unwrap();
    let req = Request::get(path).header("host", "gateway.test");
    let resp = client.send_request(req.body(Body::empty()).unwrap()).await;
    let resp = resp.unwrap();
    assert!(resp.status().is_success(), "{path}: {}", resp.status());
    resp.into_body().collect().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_its_kept_connection_cap_a_worker_sends_through_the_pool() {
    // One worker that may keep one upstream connection (max_connections 1).
    let spec = ClusterSpec::postgres("px_cap")
        .with_workers(1)
        .with_proxy("  max_connections: 1\n");
    let c = Cluster::start(spec).await;
    // Client A of the non-holder: its app request keeps the one connection,
    // so its forwarded request finds none left and takes the pool's hop to
    // the holder, which outlives A (a kept hop would close with A). (A POST
    // with a body: the full path's; a bodiless GET would take the fast
    // path, which keeps its connection under the same cap.)
    let mut a = one_connection(c.gws[1].port).await;
    post_ok(&mut a, "/plain/cap/a").await;
    get_ok(&mut a, "/maintenance/cap/a").await;
    drop(a);
    let kept = from_ports(&c.apps[1], "/plain/cap/a")[0];
    support::wait_for(
        "client A's kept app connection closes with it",
        Duration::from_secs(10),
        || !c.apps[1].is_open_from(kept),
    )
    .await;
    // Client B, the same way: its forwarded request reuses the pooled hop,
    // so the holder (serving that hop as one client connection) answers it
    // on the same app connection as A's.
    let mut b = one_connection(c.gws[1].port).await;
    post_ok(&mut b, "/plain/cap/b").await;
    get_ok(&mut b, "/maintenance/cap/b").await;
    let holder_a = from_ports(&c.apps[0], "/maintenance/cap/a");
    let holder_b = from_ports(&c.apps[0], "/maintenance/cap/b");
    assert_eq!(
        holder_a, holder_b,
        "A's and B's forwarded requests shared the pool's hop to the holder"
    );
    // B's app request kept a connection of its own (A's closed).
    assert_ne!(from_ports(&c.apps[1], "/plain/cap/b")[0], kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_in_the_upstream_url_prefixes_every_request_on_every_connection_kind() {
    let spec = ClusterSpec {
        upstream_path: "/base".into(),
        ..ClusterSpec::postgres("px_prefix")
    };
    let c = Cluster::start(spec).await;
    // Each client connection's own upstream connection: keep-alive
    // requests, an HTTP/1.0 request without Host, and a forwarded one
    // through a non-holder (its own peer connection, then the holder's).
    let mut client = one_connection(c.gws[0].port).await;
    for path in ["/maintenance/p/1", "/plain/p/2"] {
        client.ready().await.unwrap();
        let req = Request::get(path).header("host", "gateway.test");
        let resp = client
            .send_request(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
        resp.into_body().collect().await.unwrap();
    }
    let raw = raw_exchange(c.gws[0].port, b"GET /plain/p/3 HTTP/1.0\r\n\r\n").await;
    assert!(
        raw.starts_with("HTTP/1.0 2") || raw.starts_with("HTTP/1.1 2"),
        "{raw}"
    );
    let (status, _, _) = cluster::get(&format!("{}/maintenance/p/4", c.gws[2].url()))
        .await
        .unwrap();
    assert!(status.is_success(), "{status}");
    let seen: Vec<String> = c
        .apps
        .iter()
        .flat_map(|a| a.executed())
        .map(|e| e.path)
        .filter(|p| p.contains("/p/"))
        .collect();
    for n in 1..=4 {
        assert!(
            seen.iter()
                .any(|p| p.starts_with("/base/") && p.ends_with(&format!("/p/{n}"))),
            "request {n} reached the app under /base: {seen:?}"
        );
    }
    assert!(seen.iter().all(|p| p.starts_with("/base/")), "{seen:?}");
}
