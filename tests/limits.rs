//! Limits, timeouts and edge rules of the public and admin listeners, against
//! real `rolegate run` processes on PostgreSQL: slow uploads, clients that stop
//! reading, connection caps, file-descriptor limits, readiness that follows the
//! store's freshness, malformed bodies, Host rules, the Via loop guard and
//! problem bodies that keep internal addresses out.

mod support;

use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::{Request, StatusCode};
use support::cluster::{self, raw_exchange, status_of, ClusterSpec, GatewayProcess, TestApp};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "proxy-test-secret-0123456789";

/// Two apps and two gateways; gateway 0 starts first and holds every role.
async fn pair(spec: ClusterSpec) -> (Vec<TestApp>, Vec<GatewayProcess>) {
    let apps = vec![TestApp::start(0).await, TestApp::start(1).await];
    let mut gws = vec![GatewayProcess::start(0, &spec, &apps[0]).await];
    support::wait_for_async(
        "gateway 0 holds maintenance",
        Duration::from_secs(10),
        || async { gws[0].held().await.get("maintenance").is_some_and(|h| h.0) },
    )
    .await;
    gws.push(GatewayProcess::start(1, &spec, &apps[1]).await);
    support::wait_for_async(
        "gateway 1 sees gateway 0 as the holder",
        Duration::from_secs(10),
        || async {
            gws[1].leases().await["roles"]
                .as_array()
                .is_some_and(|roles| {
                    roles.iter().any(|r| {
                        r["role"] == "maintenance"
                            && r["holder"].as_str().is_some_and(|h| h.starts_with("gw0"))
                    })
                })
        },
    )
    .await;
    (apps, gws)
}

async fn instance_id(gw: &GatewayProcess) -> String {
    gw.leases().await["instance"]["id"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn bad_body_count(gw: &GatewayProcess) -> f64 {
    let (_, _, body) = cluster::get(&format!("{}/metrics", gw.admin_url()))
        .await
        .unwrap();
    String::from_utf8_lossy(&body)
        .lines()
        .find(|l| l.starts_with("rolegate_proxy_requests_total{outcome=\"bad-body\"}"))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_is_never_cut_by_the_response_header_timeout() {
    let spec = ClusterSpec::postgres("lim_upload").with_proxy("  response_header_timeout: 500ms\n");
    let (_apps, gws) = pair(spec).await;
    // 20 chunks of 30 KiB, one every 100 ms: 2 s of upload against a 500 ms
    // response-head timeout, through both hops.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    tokio::spawn(async move {
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if tx
                .send(Ok(Bytes::from(vec![b'u'; 30 * 1024])))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let body = Body::from_stream(tokio_stream_from(rx));
    let req = Request::post(format!("{}/maintenance/upload", gws[1].url()))
        .body(body)
        .unwrap();
    let started = Instant::now();
    let (status, _, body) = cluster::request(req).await.unwrap();
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(body, format!("received {}", 20 * 30 * 1024));
    assert!(started.elapsed() >= Duration::from_millis(1900));

    // The timeout still applies once the body is in: /slow never answers.
    let started = Instant::now();
    let (status, headers, _) = cluster::get(&format!("{}/maintenance/slow", gws[1].url()))
        .await
        .unwrap();
    assert!(
        status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::GATEWAY_TIMEOUT,
        "{status}"
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        assert!(headers.contains_key("retry-after"));
    }
    assert!(started.elapsed() < Duration::from_secs(4));

    // A GET with a chunked body (which hyper drops unread) still gets the
    // response-head timeout, on the holder's own path.
    let started = Instant::now();
    let answer = raw_exchange(
        gws[0].port,
        b"GET /maintenance/slow HTTP/1.1\r\nHost: t\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&answer), 504, "{answer}");
    assert!(started.elapsed() < Duration::from_secs(4));
}

/// A body stream over an mpsc receiver.
fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_after_the_idle_timeout() {
    let spec = ClusterSpec::postgres("lim_idle").with_proxy("  idle_timeout: 1s\n");
    let (_apps, gws) = pair(spec).await;
    // 200 MB that the client never reads: the stream stalls, and the gateway
    // closes it rather than pinning the app's connection.
    let total: u64 = 200_000_000;
    let mut s = TcpStream::connect(("127.0.0.1", gws[1].port))
        .await
        .unwrap();
    let req = format!("GET /maintenance/download?bytes={total} HTTP/1.1\r\nHost: t\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut buf = vec![0u8; 1 << 20];
    let mut got: u64 = 0;
    let started = Instant::now();
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => got += n as u64,
            Err(_) => break false,
        }
    };
    assert!(ended, "the stalled stream was not closed");
    assert!(got < total / 2, "read {got} bytes: the stream was not cut");
    assert!(started.elapsed() < Duration::from_secs(10));

    // A stream that goes quiet (SSE after its first event) is closed too.
    let mut s = TcpStream::connect(("127.0.0.1", gws[1].port))
        .await
        .unwrap();
    s.write_all(b"GET /maintenance/sse HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut seen = Vec::new();
    let closed = loop {
        match tokio::time::timeout(Duration::from_secs(8), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
            Err(_) => break false,
        }
    };
    assert!(closed, "quiet stream stayed open");
    assert!(String::from_utf8_lossy(&seen).contains("data: 1"));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(6),
        "{took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_503_no_later_than_the_roles_fail_closed_when_the_store_freezes() {
    let pg = support::PrivatePostgres::start();
    let app = TestApp::start(0).await;
    let gw =
        GatewayProcess::start(0, &ClusterSpec::postgres_at(&pg.url(), "lim_ready"), &app).await;
    support::wait_for_async("maintenance held", Duration::from_secs(10), || async {
        gw.held().await.get("maintenance").is_some_and(|h| h.0)
    })
    .await;
    // Frozen, not dead: calls hang instead of failing fast.
    pg.signal_all("STOP");
    let frozen = Instant::now();
    let mut first_503: Option<(Duration, String)> = None;
    let held_until = loop {
        let (status, _, body) = cluster::get(&format!("{}/readyz", gw.admin_url()))
            .await
            .unwrap();
        if status == StatusCode::SERVICE_UNAVAILABLE && first_503.is_none() {
            first_503 = Some((frozen.elapsed(), String::from_utf8_lossy(&body).into()));
        }
        let held = gw.held().await.values().filter(|h| h.0).count();
        if held == 0 {
            break frozen.elapsed();
        }
        assert!(
            frozen.elapsed() < Duration::from_secs(10),
            "roles never failed closed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    pg.signal_all("CONT");
    let (ready_ended, why) = first_503.expect("readyz still 200 when every role had failed closed");
    assert!(
        ready_ended <= held_until,
        "{ready_ended:?} > {held_until:?}"
    );
    assert!(why.contains("lease store round trip"), "{why}");
    gw.wait_ready().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_answers_while_the_public_listener_is_full() {
    // One worker: the cap is split over workers, and the kernel picks the
    // worker of each connection.
    let spec = ClusterSpec::postgres("lim_cap")
        .with_workers(1)
        .with_proxy("  max_connections: 4\n");
    let app = TestApp::start(0).await;
    let gw = GatewayProcess::start(0, &spec, &app).await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap());
    }
    // A fifth connection waits in the backlog: no answer while four are open.
    let fifth = tokio::spawn(raw_exchange(
        gw.port,
        b"GET /plain HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!fifth.is_finished(), "served beyond max_connections");
    let started = Instant::now();
    let (status, _, _) = cluster::get(&format!("{}/readyz", gw.admin_url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(started.elapsed() < Duration::from_secs(2));
    drop(idle);
    let answer = tokio::time::timeout(Duration::from_secs(5), fifth)
        .await
        .expect("the waiting connection was served once slots freed")
        .unwrap();
    assert_eq!(status_of(&answer), 201, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_closes_a_client_that_never_finishes_its_head() {
    let app = TestApp::start(0).await;
    let gw = GatewayProcess::start(0, &ClusterSpec::postgres("lim_admin_slow"), &app).await;
    let mut s = TcpStream::connect(("127.0.0.1", gw.admin_port))
        .await
        .unwrap();
    s.write_all(b"GET /readyz HTTP/1.1\r\nHost: a\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 256];
    let closed = tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf)).await;
    assert!(
        closed.is_ok(),
        "the admin listener kept a half-sent head open for 20 s"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Meanwhile, and after, /readyz answers.
    let (status, _, _) = cluster::get(&format!("{}/readyz", gw.admin_url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soft_open_files_limit_is_raised_to_the_hard_limit_at_start() {
    let mut spec = ClusterSpec::postgres("lim_nofile");
    spec.ulimit = Some("-S -n 256".into());
    let app = TestApp::start(0).await;
    let gw = GatewayProcess::start(0, &spec, &app).await;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", gw.pid())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let nums: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(nums[0], nums[1], "soft limit not raised: {line}");
    assert_ne!(nums[0], "256", "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_max_connections_lowered_by_a_usual_hard_limit_is_an_info_not_a_warn() {
    let mut spec = ClusterSpec::postgres("lim_nofile_info");
    // 8192 descriptors fit about 2700 connections of the default 10000.
    spec.ulimit = Some("-n 8192".into());
    let app = TestApp::start(0).await;
    let gw = GatewayProcess::start(0, &spec, &app).await;
    let log = gw.log();
    let line = log
        .lines()
        .find(|l| l.contains("proxy.max_connections lowered"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains(" INFO "), "{line}");
    assert!(!log.lines().any(|l| l.contains(" WARN ")), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_low_hard_open_files_limit_the_admin_answers_and_the_log_stays_quiet() {
    let mut spec = ClusterSpec::postgres("lim_fd");
    spec.ulimit = Some("-n 256".into());
    let app = TestApp::start(0).await;
    let gw = GatewayProcess::start(0, &spec, &app).await;
    assert!(
        gw.log()
            .lines()
            .any(|l| l.contains(" WARN ") && l.contains("proxy.max_connections lowered")),
        "a low hard limit is worth a WARN: {}",
        gw.log()
    );
    let mut held = Vec::new();
    for _ in 0..400 {
        match tokio::time::timeout(
            Duration::from_millis(200),
            TcpStream::connect(("127.0.0.1", gw.port)),
        )
        .await
        {
            Ok(Ok(s)) => held.push(s),
            _ => break,
        }
    }
    for _ in 0..5 {
        let started = Instant::now();
        let (status, _, _) = cluster::get(&format!("{}/readyz", gw.admin_url()))
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
        assert!(started.elapsed() < Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(held);
    let warns = gw.log().lines().filter(|l| l.contains("WARN")).count();
    assert!(warns < 10, "{warns} warnings:\n{}", gw.log());
    let (status, _, _) = cluster::get(&format!("{}/plain", gw.url())).await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_request_body_is_400_and_counted_as_bad_body_not_a_holder_failure() {
    let (apps, gws) = pair(ClusterSpec::postgres("lim_chunk")).await;
    for (gw, label) in [(&gws[0], "local"), (&gws[1], "forwarded")] {
        let before = bad_body_count(gw).await;
        let req = format!(
            "POST /maintenance/{label}/echo-body HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nbroken\r\n0\r\n\r\n"
        );
        let answer = raw_exchange(gw.port, req.as_bytes()).await;
        assert_eq!(status_of(&answer), 400, "{label}: {answer}");
        assert!(answer.contains("bad-body"), "{label}: {answer}");
        let after = bad_body_count(gw).await;
        assert!(after >= before + 1.0, "{label}: {before} -> {after}");
    }
    for gw in &gws {
        let log = gw.log();
        assert!(
            !log.contains("forwarding to the role holder failed")
                && !log.contains("upstream request failed"),
            "a client fault was logged as a holder/upstream failure:\n{log}"
        );
    }
    assert!(apps[1]
        .executed_paths()
        .iter()
        .all(|p| !p.contains("echo-body")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_rules_connect_and_options_star_are_answered_at_the_edge() {
    let app = TestApp::start(0).await;
    let gw = GatewayProcess::start(0, &ClusterSpec::postgres("lim_host"), &app).await;
    for (req, want) in [
        (
            &b"GET /plain HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"[..],
            400,
        ),
        (
            b"GET /maintenance/x HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n",
            400,
        ),
        (b"GET /plain HTTP/1.1\r\nConnection: close\r\n\r\n", 400),
        (
            b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
            405,
        ),
        (
            b"OPTIONS * HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            200,
        ),
        (
            b"GET /maintenance%00/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            400,
        ),
        (b"GET /plain HTTP/1.0\r\n\r\n", 201),
        (
            b"GET /plain HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n",
            400,
        ),
        (
            b"GET /plain HTTP/1.1\r\nHost: a\r\nConnection: host\r\n\r\n",
            400,
        ),
        (
            b"GET /plain HTTP/1.1\r\nHost: a\r\nConnection: close, Content-Length\r\n\r\n",
            400,
        ),
    ] {
        let answer = raw_exchange(gw.port, req).await;
        assert_eq!(
            status_of(&answer),
            want,
            "{}\n{answer}",
            String::from_utf8_lossy(req)
        );
    }
    // HTTP/2 with prior knowledge: the public listener speaks HTTP/1.1 only,
    // so the preface never reaches the app as a request.
    let mut h2 = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    h2.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // an empty SETTINGS frame
    let answer = raw_exchange(gw.port, &h2).await;
    assert!(!(200..300).contains(&status_of(&answer)), "{answer}");
    assert!(
        app.executed_paths().iter().all(|p| p == "/plain"),
        "{:?}",
        app.executed_paths()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_cluster_secret_client_via_entries_never_force_a_503() {
    let spec =
        ClusterSpec::postgres("lim_via").with_proxy(&format!("  cluster_secret: {SECRET}\n"));
    let (apps, gws) = pair(spec).await;
    let req = Request::get(format!("{}/maintenance/via-spoof", gws[1].url()))
        .header("via", "1.1 rolegate, 1.1 rolegate")
        .body(Body::empty())
        .unwrap();
    let (status, _, _) = cluster::request(req).await.unwrap();
    assert_eq!(
        status,
        StatusCode::CREATED,
        "forwarded and served by the holder"
    );
    assert!(apps[0]
        .executed_paths()
        .iter()
        .any(|p| p.ends_with("via-spoof")));

    // The loop guard: a request that already passed this very gateway (its id
    // in a Via comment) is never forwarded again.
    let id = instance_id(&gws[1]).await;
    let req = Request::get(format!("{}/maintenance/looped", gws[1].url()))
        .header("via", format!("1.1 rolegate ({id})"))
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = cluster::request(req).await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(String::from_utf8_lossy(&body).contains("already-forwarded"));
    assert!(apps
        .iter()
        .all(|a| a.executed_paths().iter().all(|p| !p.ends_with("looped"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_headers_from_untrusted_clients_are_replaced_and_from_trusted_ones_kept() {
    for (trusted, want) in [
        ("", "127.0.0.1"),
        ("  trusted_proxies: [127.0.0.1/32]\n", "6.6.6.6, 127.0.0.1"),
    ] {
        let app = TestApp::start(0).await;
        let spec = ClusterSpec::postgres("lim_xff").with_proxy(trusted);
        let gw = GatewayProcess::start(0, &spec, &app).await;
        let req = Request::get(format!("{}/plain-xff", gw.url()))
            .header("x-forwarded-for", "6.6.6.6")
            .header("x-forwarded-proto", "https")
            .header("x_forwarded_for", "7.7.7.7")
            .header("forwarded", "for=6.6.6.6")
            .body(Body::empty())
            .unwrap();
        let (status, _, _) = cluster::request(req).await.unwrap();
        assert_eq!(status, StatusCode::CREATED);
        let e = app.executed().into_iter().last().unwrap();
        assert_eq!(e.headers["x-forwarded-for"], want, "trusted: {trusted:?}");
        assert!(!e.headers.contains_key("x_forwarded_for"));
        if trusted.is_empty() {
            assert_eq!(e.headers["x-forwarded-proto"], "http");
            assert!(!e.headers["forwarded"].to_str().unwrap().contains("6.6.6.6"));
        } else {
            assert_eq!(e.headers["x-forwarded-proto"], "https");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn problem_bodies_name_no_internal_address_or_library_error() {
    // An upstream that is not listening: 502 on a plain path.
    let closed = support::closed_port();
    let spec = ClusterSpec::postgres("lim_leak");
    let gw = GatewayProcess::start_on(0, &spec, closed.port, 0, 0).await;
    let (status, _, body) = cluster::get(&format!("{}/plain", gw.url())).await.unwrap();
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let text = String::from_utf8_lossy(&body);
    for leak in [
        "127.0.0.1",
        &closed.port.to_string(),
        "refused",
        "tcp connect",
        "hyper",
    ] {
        assert!(!text.contains(leak), "problem body leaks `{leak}`: {text}");
    }
    assert!(
        gw.log().contains(&closed.port.to_string()),
        "the log keeps the detail"
    );
    assert!(!gw.log().contains('\u{1b}'), "colour codes in a log file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_0_answer_from_the_app_is_relayed_as_http_1_1() {
    // An app that answers every request in HTTP/1.0 and closes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app_port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nold-1")
                    .await;
            });
        }
    });
    let spec = ClusterSpec::postgres("lim_http10");
    let gw = GatewayProcess::start_on(0, &spec, app_port, 0, 0).await;
    let answer = raw_exchange(
        gw.port,
        b"GET /plain HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("old-1"), "{answer}");
}
