//! HTTP/2 on the public listener and to the app, against three real
//! `rolegate run` processes on PostgreSQL: h2c with prior knowledge is gated,
//! forwarded and answered like HTTP/1.1; `Host` and `:authority` may not
//! disagree; `upstream.protocol: h2c` speaks HTTP/2 to the app; the stream
//! limit caps what reaches the app; a connection with no request is closed
//! at the header timeout; `peers.protocol: h2` multiplexes hops; HTTP/2 can
//! be turned off.

mod support;

use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, Version};
use http_body_util::BodyExt;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::cluster::{self, Cluster, ClusterSpec, GatewayProcess, TestApp};

/// An h2c (prior knowledge) connection to `port`.
async fn h2c(port: u16) -> Result<SendRequest<Body>, String> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(sender)
}

/// One exchange: status, headers, body and trailers.
async fn exchange(sender: &mut SendRequest<Body>, req: Request<Body>) -> Exchanged {
    sender.ready().await.map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let (parts, body) = resp.into_parts();
    let collected = body.collect().await.map_err(|e| e.to_string())?;
    let trailers = collected.trailers().cloned();
    Ok((parts.status, parts.headers, collected.to_bytes(), trailers))
}

/// Releases `app`'s slow handlers until every call has finished (20 s at most).
async fn release_until_done<T>(app: &TestApp, calls: &[tokio::task::JoinHandle<T>]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while calls.iter().any(|c| !c.is_finished()) && std::time::Instant::now() < deadline {
        app.release_slow();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Status, head, body and trailers of one exchange.
type Exchanged = Result<(StatusCode, HeaderMap, Bytes, Option<HeaderMap>), String>;

/// Ten concurrent `/maintenance/{i}/slow` streams on `h2`, each in a task.
fn ten_slow_streams(h2: &SendRequest<Body>) -> Vec<tokio::task::JoinHandle<Exchanged>> {
    (0..10)
        .map(|i| {
            let mut s = h2.clone();
            tokio::spawn(async move {
                let uri = format!("http://app.test/maintenance/{i}/slow");
                exchange(&mut s, get(&uri)).await
            })
        })
        .collect()
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_requests_are_gated_forwarded_and_answered_like_http1() {
    let c = Cluster::start(ClusterSpec::postgres("h2_fwd")).await;
    let mut h2 = h2c(c.gws[2].port).await.expect("h2c handshake");
    let req = Request::post("http://app.test/maintenance/job?via=h2")
        .header("content-type", "text/plain")
        .body(Body::from("payload"))
        .unwrap();
    let (status, headers, body, _) = exchange(&mut h2, req).await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["x-app"], "0", "executed by the holder's app");
    assert_eq!(body, "app0 POST /maintenance/job?via=h2");
    let seen = c.apps[0].executed();
    let job = seen.iter().find(|e| e.path.contains("via=h2")).unwrap();
    assert_eq!(
        job.headers["host"], "app.test",
        "the app sees :authority as Host"
    );
    assert_eq!(
        job.version,
        Version::HTTP_11,
        "upstream.protocol defaults to http1"
    );
    assert_eq!(job.headers["x-rolegate-role"], "maintenance");

    // Encoded and case-folded spellings are gated the same way.
    for path in [
        "/%6Daintenance/a",
        "/MAINTENANCE/b",
        "//maintenance/c",
        "/x/../maintenance/d",
    ] {
        let (status, headers, _, _) = exchange(&mut h2, get(&format!("http://app.test{path}")))
            .await
            .unwrap();
        assert_eq!(
            (status, &headers["x-app"]),
            (StatusCode::CREATED, &"0".parse().unwrap()),
            "{path}"
        );
    }
    assert_eq!(
        c.executed_with("aintenance/")[1..],
        [0, 0],
        "no non-holder ran role work"
    );

    // Host and :authority must agree; the request is refused before any app.
    let spoof = Request::get("http://app.test/maintenance/host")
        .header("host", "other.test")
        .body(Body::empty())
        .unwrap();
    let (status, _, body, _) = exchange(&mut h2, spoof).await.unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body:?}");
    assert_eq!(c.executed_with("maintenance/host"), [0, 0, 0]);

    // A partition key read from a header lands on the partition's holder.
    let keyed = Request::get("http://app.test/device-api/status")
        .header("x-device-id", "d-17")
        .body(Body::empty())
        .unwrap();
    let (status, headers, _, _) = exchange(&mut h2, keyed).await.unwrap();
    assert_eq!(
        (status, headers["x-app"].to_str().unwrap()),
        (StatusCode::CREATED, "0")
    );
    let seen = c.apps[0].executed();
    let e = seen
        .iter()
        .find(|e| e.path == "/device-api/status")
        .unwrap();
    let role = e.headers["x-rolegate-role"].to_str().unwrap();
    assert!(role.starts_with("devices:partition-"), "{role}");

    // Cookie fields split by HTTP/2 reach an HTTP/1.1 app as one field.
    let cookies = Request::get("http://app.test/plain/cookies")
        .header("cookie", "a=1")
        .header("cookie", "b=2")
        .body(Body::empty())
        .unwrap();
    exchange(&mut h2, cookies).await.unwrap();
    let seen = c.apps[2].executed();
    let e = seen.iter().find(|e| e.path == "/plain/cookies").unwrap();
    let all: Vec<_> = e.headers.get_all("cookie").iter().collect();
    assert_eq!(all, ["a=1; b=2"]);

    // Paths outside every route go to the local app; trailers come through.
    let (_, headers, body, _) = exchange(&mut h2, get("http://app.test/plain/page"))
        .await
        .unwrap();
    assert_eq!(
        (headers["x-app"].to_str().unwrap(), &body[..]),
        ("2", &b"app2 GET /plain/page"[..])
    );
    let (status, _, _, trailers) = exchange(&mut h2, get("http://app.test/maintenance/trailers"))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    let trailers = trailers.expect("trailers forwarded over HTTP/2");
    assert!(!trailers.is_empty(), "{trailers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_protocol_h2c_speaks_http2_to_the_app() {
    let mut spec = ClusterSpec::postgres("h2_up");
    spec.upstream_yaml.push_str("  protocol: h2c\n");
    let c = Cluster::start(spec).await;
    // An HTTP/1.1 client at a non-holder: forwarded, then HTTP/2 to the app.
    let (status, headers, body) = cluster::request(
        Request::get(format!("{}/maintenance/over-h2c", c.gws[1].url()))
            .header("host", "app.test")
            .body(Body::empty())
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(
        (status, headers["x-app"].to_str().unwrap()),
        (StatusCode::CREATED, "0")
    );
    assert_eq!(body, "app0 GET /maintenance/over-h2c");
    let seen = c.apps[0].executed();
    let e = seen.iter().find(|e| e.path.ends_with("over-h2c")).unwrap();
    assert_eq!(e.version, Version::HTTP_2);
    assert_eq!(e.headers["x-rolegate-role"], "maintenance");
    // Streaming answers (SSE) work over the HTTP/2 upstream too.
    let resp = cluster::send(get(&format!("{}/maintenance/sse", c.gws[2].url())))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    c.apps[0].sse_next();
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("first SSE event while the stream is open")
        .unwrap()
        .unwrap();
    assert!(first.data_ref().is_some_and(|d| !d.is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_limit_caps_the_streams_an_app_sees_at_once() {
    let spec =
        ClusterSpec::postgres("h2_streams").with_proxy("  http2:\n    max_concurrent_streams: 4\n");
    let c = Cluster::start(spec).await;
    let mut h2 = h2c(c.gws[1].port).await.expect("h2c handshake");
    // One exchange first, so the client has the server's SETTINGS: hyper's
    // client then honours the limit and queues. (Streams sent before the
    // SETTINGS arrive are refused; tests/hostile_clients.rs checks that.)
    let _ = exchange(&mut h2, get("http://app.test/plain/first"))
        .await
        .unwrap();
    let calls = ten_slow_streams(&h2);
    support::wait_for(
        "4 slow requests at the holder's app",
        Duration::from_secs(10),
        || c.executed_with("/slow")[0] == 4,
    )
    .await;
    // Then a moment for a fifth to arrive, were one let through.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        c.executed_with("/slow"),
        [4, 0, 0],
        "no more than 4 streams at once"
    );
    release_until_done(&c.apps[0], &calls).await;
    for call in calls {
        let (status, _, _, _) = call
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("not served once a slot was free: {e}"));
        assert_eq!(status, StatusCode::OK);
    }
    let _ = exchange(&mut h2, get("http://app.test/plain"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_http2_off_prior_knowledge_is_refused_and_http1_still_served() {
    let app = TestApp::start(0).await;
    let spec = ClusterSpec::postgres("h2_off").with_proxy("  http2:\n    enabled: false\n");
    let gw = GatewayProcess::start(0, &spec, &app).await;
    match h2c(gw.port).await {
        Err(_) => {}
        Ok(mut s) => {
            let r = exchange(&mut s, get("http://app.test/plain")).await;
            assert!(r.is_err(), "HTTP/2 was served although turned off: {r:?}");
        }
    }
    let (status, _, _) = cluster::get(&format!("{}/plain", gw.url())).await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
    assert!(app.executed_paths().iter().all(|p| p == "/plain"));
}

/// Reads until the peer closes; how long that took.
async fn closed_after(mut s: tokio::net::TcpStream, limit: Duration) -> Option<Duration> {
    use tokio::io::AsyncReadExt;
    let start = std::time::Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((start + limit).into(), s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_no_request_is_closed_at_the_header_timeout() {
    use tokio::io::AsyncWriteExt;
    let app = TestApp::start(0).await;
    let gw = GatewayProcess::start(0, &ClusterSpec::postgres("h2_silent"), &app).await;
    let connect = || tokio::net::TcpStream::connect(("127.0.0.1", gw.port));
    // Silent from the first byte, and silent after the HTTP/2 preface and
    // SETTINGS (a client that only holds a slot).
    let silent = connect().await.unwrap();
    let mut preface = connect().await.unwrap();
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let limit = Duration::from_secs(45);
    let (a, b) = tokio::join!(closed_after(silent, limit), closed_after(preface, limit));
    for (what, t) in [("silent", a), ("preface only", b)] {
        let t = t.unwrap_or_else(|| panic!("{what}: still open after {limit:?}"));
        assert!(
            t >= Duration::from_secs(29),
            "{what}: closed too early, after {t:?}"
        );
    }
    // A connection that made a request is not cut by it.
    let (status, _, _) = cluster::get(&format!("{}/plain", gw.url())).await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
}

/// Established TCP connections to `port` on loopback (`ss`, iproute2).
fn connections_to(port: u16) -> usize {
    let out = std::process::Command::new("ss")
        .args([
            "-Htn",
            "state",
            "established",
            &format!("( dport = :{port} )"),
        ])
        .output()
        .expect("ss (iproute2) is needed to count connections");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_hops_over_http2_share_one_connection_and_keep_every_rule() {
    // One worker: each worker keeps connections of its own.
    let spec = ClusterSpec::postgres("h2_peers")
        .with_workers(1)
        .with_extra("peers:\n  protocol: h2\n")
        .with_proxy("  cluster_secret: an-h2-hop-secret-of-32-bytes!!!!\n");
    let c = Cluster::start(spec).await;
    // Twenty requests at once through a non-holder: all at the holder's app,
    // each with the holder's role and token, over one connection to it.
    let mut calls = Vec::new();
    for i in 0..20 {
        let url = format!("{}/maintenance/job/{i}", c.gws[2].url());
        calls.push(tokio::spawn(async move { cluster::get(&url).await }));
    }
    for call in calls {
        let (status, headers, _) = call.await.unwrap().unwrap();
        assert_eq!(
            (status, headers["x-app"].to_str().unwrap()),
            (StatusCode::CREATED, "0")
        );
    }
    let token = c.gws[0].held().await["maintenance"].1.to_string();
    let jobs: Vec<_> = c.apps[0]
        .executed()
        .into_iter()
        .filter(|e| e.path.contains("/job/"))
        .collect();
    assert_eq!(jobs.len(), 20);
    for e in &jobs {
        assert_eq!(e.headers["x-rolegate-token"], token.as_str());
        let via = e.headers["via"].to_str().unwrap();
        assert!(
            via.contains("rolegate"),
            "one signed hop, marked in Via: {via}"
        );
    }
    assert_eq!(c.executed_with("/job/")[1..], [0, 0]);
    assert_eq!(
        connections_to(c.gws[0].port),
        1,
        "one multiplexed hop connection"
    );
    // Bodies stream both ways, and SSE events arrive while the stream is open.
    let req = Request::post(format!("{}/maintenance/echo-body", c.gws[1].url()))
        .body(Body::from(vec![7u8; 300_000]))
        .unwrap();
    let (status, _, body) = cluster::request(req).await.unwrap();
    assert_eq!((status, body.len()), (StatusCode::OK, 300_000));
    let resp = cluster::send(get(&format!("{}/maintenance/sse", c.gws[2].url())))
        .await
        .unwrap();
    let mut body = resp.into_body();
    c.apps[0].sse_next();
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame()).await;
    assert!(
        first.is_ok_and(|f| f.is_some_and(|f| f.is_ok_and(|f| f.is_data()))),
        "SSE over an h2 hop"
    );
    // An upgrade (WebSocket) still works: it takes an HTTP/1.1 hop.
    cluster::websocket_client_echo(&format!("ws://127.0.0.1:{}/maintenance/ws", c.gws[2].port))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_streams_beyond_one_connections_limit_open_another_hop_connection() {
    let spec = ClusterSpec::postgres("h2_many")
        .with_workers(1)
        .with_extra("peers:\n  protocol: h2\n");
    let c = Cluster::start(spec).await;
    // 120 requests that stay open (as SSE or gRPC streams do) through one
    // non-holder: the holder serves at most 100 streams per connection, so
    // the 101st must not wait behind them.
    let mut calls = Vec::new();
    for i in 0..120 {
        let url = format!("{}/maintenance/{i}/slow", c.gws[2].url());
        calls.push(tokio::spawn(async move { cluster::get(&url).await }));
    }
    support::wait_for(
        "120 open streams at the holder's app",
        Duration::from_secs(20),
        || c.executed_with("/slow")[0] == 120,
    )
    .await;
    assert_eq!(
        connections_to(c.gws[0].port),
        2,
        "100 streams on one, 20 on another"
    );
    release_until_done(&c.apps[0], &calls).await;
    for call in calls {
        let (status, _, _) = call.await.unwrap().unwrap();
        assert_eq!(status, StatusCode::OK);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_over_http2_count_against_max_connections() {
    // One worker with 4 connections' worth of descriptors: one HTTP/2
    // connection may not open more than 4 exchanges upstream at once.
    let app = TestApp::start(0).await;
    let spec = ClusterSpec::postgres("h2_budget")
        .with_workers(1)
        .with_proxy("  max_connections: 4\n");
    let gw = GatewayProcess::start(0, &spec, &app).await;
    let mut h2 = h2c(gw.port).await.expect("h2c handshake");
    let _ = exchange(&mut h2, get("http://app.test/plain/first"))
        .await
        .unwrap();
    let calls = ten_slow_streams(&h2);
    let slow = || {
        app.executed_paths()
            .iter()
            .filter(|p| p.ends_with("/slow"))
            .count()
    };
    support::wait_for(
        "4 slow requests at the app",
        Duration::from_secs(10),
        || slow() == 4,
    )
    .await;
    // Then a moment for a fifth to arrive, were one let through.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(slow(), 4, "no more exchanges than max_connections allows");
    release_until_done(&app, &calls).await;
    for call in calls {
        let (status, _, _, _) = call.await.unwrap().expect("served once a slot is free");
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(slow(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_trailers_lose_the_fields_the_head_would_lose() {
    // h2c both ways, so trailers reach the app as the client sent them
    // unless the gateway removes them.
    let app = TestApp::start(0).await;
    let mut spec = ClusterSpec::postgres("h2_trailers");
    spec.upstream_yaml.push_str("  protocol: h2c\n");
    let gw = GatewayProcess::start(0, &spec, &app).await;
    let mut h2 = h2c(gw.port).await.expect("h2c handshake");
    let mut trailers = HeaderMap::new();
    for (k, v) in [
        ("x-rolegate-role", "maintenance"),
        ("x-rolegate-token", "4242"),
        ("x_rolegate_role", "maintenance"),
        ("x-forwarded-for", "6.6.6.6"),
        ("x-original-url", "/maintenance/run"),
        ("x-kept", "yes"),
    ] {
        trailers.insert(http::HeaderName::from_static(k), v.parse().unwrap());
    }
    let frames = futures_util::stream::iter([
        Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from("body"))),
        Ok(http_body::Frame::trailers(trailers)),
    ]);
    let req = Request::post("http://app.test/plain/echo-trailers")
        .body(Body::new(http_body_util::StreamBody::new(frames)))
        .unwrap();
    let (status, _, body, _) = exchange(&mut h2, req).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "x-kept", "only the harmless trailer reaches the app");
}
