//! What an operator relies on: readiness that follows the store, metrics that
//! move with traffic, `/leases` and the status page matching the store, and
//! candidacy that follows the app's health. Real gateway processes, real
//! PostgreSQL.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use support::cluster::{self, ClusterSpec, GatewayProcess, TestApp};

/// Two apps and two gateways; gateway 0 starts first and holds every role,
/// and both agree on the holder.
async fn two_gateways(spec: &ClusterSpec) -> ([TestApp; 2], Vec<GatewayProcess>) {
    let apps = [TestApp::start(0).await, TestApp::start(1).await];
    let g0 = GatewayProcess::start(0, spec, &apps[0]).await;
    support::wait_for_async("g0 holds", Duration::from_secs(10), || async {
        g0.held().await["maintenance"].0
    })
    .await;
    let g1 = GatewayProcess::start(1, spec, &apps[1]).await;
    let gws = vec![g0, g1];
    cluster::wait_holder(&gws, "maintenance").await;
    (apps, gws)
}

async fn readyz(gw: &GatewayProcess) -> StatusCode {
    cluster::get(&format!("{}/readyz", gw.admin_url()))
        .await
        .map(|r| r.0)
        .unwrap_or(StatusCode::BAD_GATEWAY)
}

async fn wait_readyz(gw: &GatewayProcess, want: StatusCode, limit: Duration) {
    let start = std::time::Instant::now();
    loop {
        if readyz(gw).await == want {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "readyz never became {want} in {limit:?}; log:\n{}",
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_before_the_first_snapshot_and_while_postgres_is_down() {
    let pg = support::PrivatePostgres::start();
    pg.stop_server();
    let app = TestApp::start(0).await;
    let spec = ClusterSpec {
        wait_ready: false,
        ..ClusterSpec::postgres_at(&pg.url(), "op_ready")
    };
    // The store is down at start: the process runs, healthy but not ready.
    let gw = GatewayProcess::start(0, &spec, &app).await;
    assert_eq!(readyz(&gw).await, StatusCode::SERVICE_UNAVAILABLE);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(readyz(&gw).await, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _, body) = cluster::get(&format!("{}/maintenance/x", gw.url()))
        .await
        .unwrap();
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        String::from_utf8_lossy(&body)
    );

    pg.start_server();
    wait_readyz(&gw, StatusCode::OK, Duration::from_secs(20)).await;
    support::wait_for_async(
        "role held once the store is back",
        Duration::from_secs(10),
        || async { gw.held().await["maintenance"].0 },
    )
    .await;

    pg.stop_server();
    wait_readyz(&gw, StatusCode::SERVICE_UNAVAILABLE, Duration::from_secs(5)).await;
    assert!(
        gw.child_alive(),
        "the gateway keeps running through a store outage"
    );
    pg.start_server();
    wait_readyz(&gw, StatusCode::OK, Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_the_first_snapshot_a_role_request_says_the_store_was_not_read_and_why() {
    let app = TestApp::start(0).await;
    let closed = support::closed_port();
    let down = format!("postgres://postgres@127.0.0.1:{}/postgres", closed.port);
    let spec = ClusterSpec {
        wait_ready: false,
        ..ClusterSpec::postgres_at(&down, "op_unread")
    };
    let gw = GatewayProcess::start(0, &spec, &app).await;
    let started = std::time::Instant::now();
    let mut last;
    loop {
        let (status, _, body) = cluster::get(&format!("{}/maintenance/x", gw.url()))
            .await
            .unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        last = String::from_utf8_lossy(&body).into_owned();
        assert!(
            last.contains("this gateway has not read the lease store yet (last error: "),
            "{last}"
        );
        if last.to_lowercase().contains("connection refused") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the 503 never named the store's error: {last}\n{}",
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        last.contains(&format!("127.0.0.1:{}", closed.port)),
        "{last}"
    );
    // The first failure was logged as it happened, before the heartbeat's.
    let log = gw.log();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("lease store call failed at start")),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_logs_the_stores_first_round_trip() {
    let app = TestApp::start(0).await;
    let gw = GatewayProcess::start(0, &ClusterSpec::postgres("op_first_rt"), &app).await;
    let log = gw.log();
    let line = log
        .lines()
        .find(|l| l.contains("lease store answered (applying the schema)"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains("round_trip_ms="), "{line}");
}

/// Parses Prometheus text: every sample line is `name{labels} value`.
fn parse_metrics(text: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.trim_start();
            assert!(
                rest.starts_with("HELP ") || rest.starts_with("TYPE "),
                "bad comment line: {line}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad sample line: {line}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':'),
            "bad metric name in: {line}"
        );
        if name_end < series.len() {
            assert!(series.ends_with('}'), "bad labels in: {line}");
        }
        let v: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in: {line}"));
        out.insert(series.to_string(), v);
    }
    out
}

async fn metrics(gw: &GatewayProcess) -> HashMap<String, f64> {
    let (status, headers, body) = cluster::get(&format!("{}/metrics", gw.admin_url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    parse_metrics(&String::from_utf8_lossy(&body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_as_prometheus_text_and_counters_move_with_traffic() {
    let spec = ClusterSpec::postgres("op_metrics");
    let (_apps, gws) = two_gateways(&spec).await;

    let fwd = r#"rolegate_proxy_requests_total{outcome="forwarded"}"#;
    let local = r#"rolegate_proxy_requests_total{outcome="local"}"#;
    let bad = r#"rolegate_proxy_requests_total{outcome="missing-key"}"#;
    let before = (metrics(&gws[1]).await, metrics(&gws[0]).await);
    for i in 0..5 {
        let (status, _, _) = cluster::get(&format!("{}/maintenance/m{i}", gws[1].url()))
            .await
            .unwrap();
        assert_eq!(status, StatusCode::CREATED);
    }
    let (status, _, _) = cluster::get(&format!("{}/device-api/nokey", gws[1].url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let after = (metrics(&gws[1]).await, metrics(&gws[0]).await);
    let get = |m: &HashMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(0.0);
    assert_eq!(get(&after.0, fwd) - get(&before.0, fwd), 5.0);
    assert_eq!(get(&after.1, local) - get(&before.1, local), 5.0);
    assert_eq!(get(&after.0, bad) - get(&before.0, bad), 1.0);
    let m = &after.1;
    assert_eq!(get(m, r#"rolegate_lease_held{role="maintenance"}"#), 1.0);
    assert_eq!(
        get(&after.0, r#"rolegate_lease_held{role="maintenance"}"#),
        0.0
    );
    assert_eq!(get(m, "rolegate_ready"), 1.0);
    assert_eq!(get(m, "rolegate_candidate"), 1.0);
    assert!(get(m, r#"rolegate_store_round_trip_seconds_count{op="claim"}"#) > 0.0);
    assert!(
        get(
            &after.0,
            r#"rolegate_forward_seconds_count{target="holder"}"#
        ) >= 5.0
    );
    assert!(m.contains_key("rolegate_open_streams"));
    // Renewals happen every renew interval; wait for the first one.
    let renewed = r#"rolegate_lease_operations_total{op="renew",outcome="granted"}"#;
    support::wait_for_async("a renewal is counted", Duration::from_secs(5), || async {
        metrics(&gws[0]).await.get(renewed).copied().unwrap_or(0.0) > 0.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_the_status_page_match_the_store() {
    let spec = ClusterSpec::postgres("op_leases");
    let (_apps, gws) = two_gateways(&spec).await;

    // `rolegate status --json` reads the store directly.
    let out = std::process::Command::new(cluster::bin())
        .args(["status", "--json", "--config"])
        .arg(gws[1].config_path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let store: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let store: HashMap<String, (Option<String>, u64)> = store
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["role"].as_str().unwrap().to_string(),
                (
                    r["holder"].as_str().map(str::to_owned),
                    r["token"].as_u64().unwrap(),
                ),
            )
        })
        .collect();
    for gw in &gws {
        let v = gw.leases().await;
        let id = v["instance"]["id"].as_str().unwrap().to_string();
        assert_eq!(v["instance"]["store"], "postgres");
        assert_eq!(v["instance"]["candidate"], true);
        let roles = v["roles"].as_array().unwrap();
        assert_eq!(roles.len(), 9, "every role and partition role is listed");
        for r in roles {
            let name = r["role"].as_str().unwrap();
            let (holder, token) = &store[name];
            assert_eq!(r["token"].as_u64().unwrap(), *token, "{name}");
            assert_eq!(r["holder"].as_str(), holder.as_deref(), "{name}");
            assert_eq!(
                r["held_here"].as_bool().unwrap(),
                holder.as_deref() == Some(id.as_str()),
                "{name}"
            );
            if r["held_here"].as_bool().unwrap() {
                assert!(r["valid_for_ms"].as_u64().unwrap() > 0);
            }
        }
        let (status, headers, body) = cluster::get(&format!("{}/", gw.admin_url())).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert!(headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html"));
        let html = String::from_utf8_lossy(&body);
        assert!(
            html.contains("http-equiv=\"refresh\""),
            "the page refreshes itself"
        );
        assert!(html.contains("name=\"viewport\""), "readable on a phone");
        for name in store.keys() {
            assert!(
                html.contains(&format!("<td>{name}</td>")),
                "status page names {name}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhealthy_upstream_hands_roles_to_a_healthy_instance_and_contends_again_when_recovered() {
    let spec = ClusterSpec {
        upstream_yaml:
            "  health:\n    path: /healthz\n    interval: 100ms\n    unhealthy_after: 2\n".into(),
        ..ClusterSpec::postgres("op_health")
    };
    let (apps, gws) = two_gateways(&spec).await;

    apps[0].set_healthy(false);
    support::wait_for_async(
        "g1 takes every role from the unhealthy g0",
        Duration::from_secs(5),
        || async { gws[1].held().await.values().all(|h| h.0) },
    )
    .await;
    let v = gws[0].leases().await;
    assert_eq!(v["instance"]["candidate"], false);
    assert!(v["roles"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["held_here"] == false));
    let m = metrics(&gws[0]).await;
    assert_eq!(m.get("rolegate_candidate").copied(), Some(0.0));
    // Requests still work: forwarded to the healthy holder, once g0's view
    // (refreshed every renew interval) names it.
    support::wait_for_async(
        "g0 sees g1 holding maintenance",
        Duration::from_secs(5),
        || async {
            gws[0].leases().await["roles"]
                .as_array()
                .is_some_and(|roles| {
                    roles.iter().any(|r| {
                        r["role"] == "maintenance"
                            && r["holder"].as_str().is_some_and(|h| h.starts_with("gw1"))
                    })
                })
        },
    )
    .await;
    let (status, headers, _) = cluster::get(&format!("{}/maintenance/while-sick", gws[0].url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["x-app"], "1");

    apps[0].set_healthy(true);
    support::wait_for_async("g0 contends again", Duration::from_secs(5), || async {
        gws[0].leases().await["instance"]["candidate"] == true
    })
    .await;
    // Once g1 stops, the recovered g0 takes the roles.
    gws[1].signal("TERM");
    support::wait_for_async("g0 holds again", Duration::from_secs(5), || async {
        gws[0].held().await.values().all(|h| h.0)
    })
    .await;
}

/// Two gateways split a balanced partition 4/4, and every view shows it:
/// `/leases` (members, share, preferred holders), the status page, the
/// metric and `rolegate status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_balanced_partition_spreads_over_the_gateways_and_every_view_shows_it() {
    let spec = ClusterSpec {
        balance: true,
        ..ClusterSpec::postgres("op_spread")
    };
    let (_apps, gws) = two_gateways(&spec).await;
    support::wait_for_async("devices split 4/4", Duration::from_secs(10), || async {
        let mut held = Vec::new();
        for g in &gws {
            held.push(g.leases().await["partitions"][0]["held_here"].as_u64());
        }
        held == [Some(4), Some(4)]
    })
    .await;
    let v = gws[0].leases().await;
    let id0 = v["instance"]["id"].as_str().unwrap().to_string();
    assert_eq!(v["members"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(
        v["partitions"][0]["share"],
        serde_json::json!([4, 4]),
        "{v}"
    );
    for r in v["roles"].as_array().unwrap() {
        if r["role"].as_str().unwrap().starts_with("devices:") {
            // Settled: every role sits with its preferred holder.
            assert_eq!(r["preferred"] == id0, r["held_here"] == true, "{r}");
        }
    }
    let (_, _, page) = cluster::get(&format!("{}/", gws[0].admin_url()))
        .await
        .unwrap();
    let page = String::from_utf8_lossy(&page);
    assert!(
        page.contains("4 of 8 held here (fair share 4..4)"),
        "{page}"
    );
    let m = metrics(&gws[0]).await;
    let held = r#"rolegate_partition_roles_held{partition="devices"}"#;
    assert_eq!(m.get(held).copied(), Some(4.0));
    let out = std::process::Command::new(cluster::bin())
        .args(["status", "--config"])
        .arg(gws[0].config_path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("partition devices (8 roles, balanced): "),
        "{text}"
    );
    assert!(text.contains(&format!("{id0} 4")), "{text}");
}

/// A role released for bad health says so: in the 503, on `/leases`, on the
/// status page and in a metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_released_for_bad_health_say_so_everywhere_an_operator_looks() {
    let spec = ClusterSpec {
        upstream_yaml:
            "  health:\n    path: /healthz\n    interval: 100ms\n    unhealthy_after: 2\n".into(),
        ..ClusterSpec::postgres("op_health_why")
    };
    let (apps, gws) = two_gateways(&spec).await;
    for app in &apps {
        app.set_healthy(false);
    }
    let why = "the app failed 2 health probes of /healthz in a row";
    // Both must have withdrawn: in the moment between one gateway's release
    // and the other's withdrawal, the other may still take the role.
    support::wait_for_async(
        "both withdraw and nobody holds anything",
        Duration::from_secs(5),
        || async {
            let mut all = true;
            for g in &gws {
                let v = g.leases().await;
                all &= v["instance"]["not_candidate_because"] == why;
                all &= g.held().await.values().all(|h| !h.0);
                // Nor does either still see a holder of the role.
                all &= v["roles"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|r| r["role"] != "maintenance" || r["holder_address"].is_null());
            }
            all
        },
    )
    .await;
    let (status, _, body) = cluster::get(&format!("{}/maintenance/x", gws[0].url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.contains("does not contend") && body.contains(why),
        "{body}"
    );
    let v = gws[0].leases().await;
    assert_eq!(v["instance"]["not_candidate_because"], why, "{v}");
    let (_, _, page) = cluster::get(&format!("{}/", gws[0].admin_url()))
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&page).contains(why));
    let m = metrics(&gws[0]).await;
    assert_eq!(
        m.get("rolegate_health_withdrawals_total").copied(),
        Some(1.0)
    );
    // Healthy again: the reason is gone.
    apps[0].set_healthy(true);
    support::wait_for_async("g0 contends again", Duration::from_secs(5), || async {
        gws[0].leases().await["instance"]["not_candidate_because"].is_null()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hop_marker_request_counts_as_already_forwarded_in_metrics() {
    let spec = ClusterSpec::postgres("op_hopm");
    let (_apps, gws) = two_gateways(&spec).await;
    let req = Request::get(format!("{}/maintenance/x", gws[1].url()))
        .header("x-rolegate-hop", "x")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        cluster::request(req).await.unwrap().0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let m = metrics(&gws[1]).await;
    assert_eq!(
        m.get(r#"rolegate_proxy_requests_total{outcome="already-forwarded"}"#)
            .copied(),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_ends_open_streams_at_the_drain_bound_then_hands_over() {
    let spec = ClusterSpec::postgres("op_drain").with_extra("shutdown:\n  drain_timeout: 1s\n");
    let (_apps, mut gws) = two_gateways(&spec).await;

    // An SSE stream the app never finishes, open at the holder.
    let resp = cluster::send(
        Request::get(format!("{}/maintenance/sse", gws[0].url()))
            .body(Body::empty())
            .unwrap(),
    )
    .await
    .unwrap();
    let mut body = resp.into_body();
    let first = tokio::time::timeout(
        Duration::from_secs(5),
        http_body_util::BodyExt::frame(&mut body),
    )
    .await;
    assert!(matches!(first, Ok(Some(Ok(_)))), "first event");

    let t0 = std::time::Instant::now();
    gws[0].signal("TERM");
    // The stream is cut at the drain bound, not held open forever.
    let ended = tokio::time::timeout(Duration::from_secs(6), async {
        while let Some(Ok(_)) = http_body_util::BodyExt::frame(&mut body).await {}
    })
    .await;
    assert!(ended.is_ok(), "stream still open 6 s after SIGTERM");
    let exit = loop {
        if let Some(status) = gws[0].child.try_wait().unwrap() {
            break status;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(6),
            "gateway did not exit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = t0.elapsed();
    assert!(exit.success(), "{exit:?}");
    assert!(
        took >= Duration::from_millis(900),
        "exited before the drain bound: {took:?}"
    );
    let g1 = gws.remove(1);
    support::wait_for_async("g1 takes over", Duration::from_secs(3), || async {
        g1.held().await["maintenance"].0
    })
    .await;
}

/// Series on `/metrics` and roles held here, once this gateway holds all
/// of a 65,536-role partition.
async fn series_with_a_huge_partition(per_role: bool) -> (usize, usize) {
    let dir = support::test_dir(if per_role {
        "series_per_role"
    } else {
        "series"
    });
    let url = format!("sqlite://{}/leases.db", dir.display());
    let mut spec = ClusterSpec::store("sqlite", &url, "series")
        .with_extra(&format!("telemetry:\n  per_role_metrics: {per_role}\n"));
    // Room for a debug build to claim and renew 65,536 roles.
    spec.lease_yaml =
        "lease:\n  duration: 60s\n  renew_interval: 10s\n  safety_margin: 10s\n".into();
    let app = TestApp::start(0).await;
    let routes = "roles:\n  - name: maintenance\npartitions:\n  - name: tenants\n    count: 65536\n    balance: false\n\
                  routes:\n  - prefixes: [/maintenance]\n    role: maintenance\n  \
                  - prefixes: [/tenants]\n    partition: tenants\n    key:\n      header: X-Tenant\n";
    let gw = GatewayProcess::start_for_upstream(0, &spec, app.port, routes).await;
    let held = r#"rolegate_partition_roles_held{partition="tenants"}"#;
    support::wait_for_async(
        "every role of the partition held",
        Duration::from_secs(300),
        || async { metrics(&gw).await.get(held).copied() == Some(65536.0) },
    )
    .await;
    if !per_role {
        leases_page_through_a_huge_partition(&gw).await;
    }
    let m = metrics(&gw).await;
    let roles_held_here = m
        .keys()
        .filter(|k| k.starts_with("rolegate_lease_held{"))
        .count();
    // Term changes: one series for the partition, or one per role.
    let by_partition = m.get(r#"rolegate_lease_term_changes_total{role="tenants"}"#);
    let of_one_role = m.get(r#"rolegate_lease_term_changes_total{role="tenants:partition-7"}"#);
    if per_role {
        assert_eq!((by_partition, of_one_role), (None, Some(&1.0)));
    } else {
        assert_eq!((by_partition, of_one_role), (Some(&65536.0), None));
    }
    (m.len(), roles_held_here)
}

async fn leases_json(gw: &GatewayProcess, query: &str) -> (StatusCode, usize, serde_json::Value) {
    let (status, _, body) = cluster::get(&format!("{}/leases{query}", gw.admin_url()))
        .await
        .unwrap();
    let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    (status, body.len(), json)
}

/// `/leases` of a 65,536-role partition: a summary by default (it was
/// 11.9 MB), every role one cursor-paged query away, and a status page that
/// stays small.
async fn leases_page_through_a_huge_partition(gw: &GatewayProcess) {
    let (status, size, v) = leases_json(gw, "").await;
    assert_eq!(status, StatusCode::OK);
    eprintln!("figures: /leases with a 65,536-role partition: {size} bytes");
    assert!(size <= 64 * 1024, "{size} bytes");
    let p = &v["partitions"][0];
    assert_eq!(p["listed"], false, "{p}");
    assert_eq!(p["summary"]["held"], 65_536, "{p}");
    assert_eq!(p["summary"]["unheld"], 0, "{p}");
    let id = v["instance"]["id"].as_str().unwrap();
    assert_eq!(p["summary"]["by_holder"][id], 65_536, "{p}");
    assert_eq!(v["roles_total"], 1);
    assert_eq!(v["roles"][0]["role"], "maintenance");

    let mut seen = std::collections::HashSet::new();
    let mut pages = 0;
    let mut query = "?partition=tenants&limit=5000".to_string();
    loop {
        let (status, _, v) = leases_json(gw, &query).await;
        assert_eq!(status, StatusCode::OK, "{query}: {v}");
        assert_eq!(v["roles_total"], 65_536);
        for r in v["roles"].as_array().unwrap() {
            let name = r["role"].as_str().unwrap().to_string();
            assert!(name.starts_with("tenants:partition-"), "{name}");
            assert_eq!(r["held_here"], true, "{r}");
            assert!(seen.insert(name.clone()), "{name} listed twice");
        }
        pages += 1;
        match v["next"].as_str() {
            Some(next) => query = format!("?partition=tenants&limit=5000&after={next}"),
            None => break,
        }
    }
    assert_eq!((seen.len(), pages), (65_536, 14));

    let (_, _, one) = leases_json(gw, "?role=tenants:partition-7").await;
    assert_eq!(one["roles_total"], 1);
    assert_eq!(one["roles"][0]["role"], "tenants:partition-7");
    let (_, _, none) = leases_json(gw, "?partition=tenants&held_here=false").await;
    assert_eq!(none["roles_total"], 0, "{none}");
    for bad in [
        "?limit=0",
        "?partition=nope",
        "?partition=tenants&after=nope",
        "?colour=red",
        "?v=2",
    ] {
        let (status, _, v) = leases_json(gw, bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        assert!(v["error"].is_string(), "{bad}: {v}");
    }

    let page = |q: &'static str| async move {
        let (status, _, body) = cluster::get(&format!("{}/{q}", gw.admin_url()))
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
        String::from_utf8(body.to_vec()).unwrap()
    };
    let summary = page("").await;
    eprintln!("figures: status page summary: {} bytes", summary.len());
    assert!(summary.len() <= 64 * 1024, "{} bytes", summary.len());
    assert!(summary.contains("list its roles"), "{summary}");
    assert!(summary.contains("<td>maintenance</td>"), "{summary}");
    let listed = page("?partition=tenants").await;
    assert_eq!(listed.matches("<td>tenants:partition-").count(), 500);
    assert!(listed.contains("next 500"), "no next link");
    let found = page("?role=tenants:partition-65535").await;
    assert_eq!(found.matches("<td>tenants:partition-").count(), 1);
    // The search form as a browser submits it, blank fields included.
    let picked = page("?role=&partition=tenants").await;
    assert_eq!(picked.matches("<td>tenants:partition-").count(), 500);
    let blank = page("?role=&partition=").await;
    assert!(blank.contains("list its roles"), "{blank}");
    assert_eq!(blank.matches("<td>tenants:partition-").count(), 0);
    let (status, _, v) = leases_json(gw, "?role=&partition=tenants&limit=3").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["roles_total"], 65_536, "{v}");
}

/// A gateway holding a 65,536-role partition exposes a bounded number of
/// series by default: its partition counts as one label value, not 65,536
/// (it was 131,248 series, 8 MB a scrape); `telemetry.per_role_metrics`
/// brings the per-role series back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_partition_keeps_the_metrics_series_bounded() {
    let (series, per_role_gauges) = series_with_a_huge_partition(false).await;
    eprintln!("figures: series with a 65,536-role partition: {series}");
    assert!(series <= 2_000, "{series} series");
    assert_eq!(per_role_gauges, 1, "only the plain role has its own gauge");
    let (series, per_role_gauges) = series_with_a_huge_partition(true).await;
    eprintln!("figures: series with per_role_metrics: {series}");
    assert_eq!(per_role_gauges, 65_537);
    assert!(series > 65_536, "{series} series");
}

/// The access log lines of a gateway's log (its stderr), parsed.
fn access_lines(gw: &GatewayProcess) -> Vec<serde_json::Value> {
    gw.log()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("decision").is_some())
        .collect()
}

/// `telemetry.access_log` writes one line per request once its response has
/// streamed: what was asked, the route and decision, status, bytes, time,
/// the trace id of a `traceparent`, and the client; in JSON or the common
/// log format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_writes_one_line_per_request() {
    let dir = support::test_dir("access_log");
    let url = format!("sqlite://{}/leases.db", dir.display());
    let json = ClusterSpec::store("sqlite", &url, "access")
        .with_extra("telemetry:\n  access_log:\n    format: json\n    to: stderr\n");
    let app = TestApp::start(0).await;
    let gw = GatewayProcess::start(0, &json, &app).await;
    support::wait_for_async("gw holds maintenance", Duration::from_secs(30), || async {
        gw.held().await["maintenance"].0
    })
    .await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let local = Request::get(format!("{}/maintenance/run?x=1", gw.url()))
        .header("traceparent", format!("00-{trace}-00f067aa0ba902b7-01"))
        .body(Body::empty())
        .unwrap();
    // The test app answers 201.
    let (status, _, local_body) = cluster::request(local).await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, _) = cluster::get(&format!("{}/plain", gw.url())).await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, _) = cluster::get(&format!("{}/device-api/x", gw.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST, "no key");
    support::wait_for_async("three access lines", Duration::from_secs(30), || async {
        access_lines(&gw).len() >= 3
    })
    .await;
    let lines = access_lines(&gw);
    assert_eq!(lines.len(), 3, "{lines:#?}");
    let run = &lines[0];
    assert_eq!(run["method"], "GET");
    assert_eq!(run["path"], "/maintenance/run?x=1");
    assert_eq!(run["route"], "maintenance");
    assert_eq!(run["decision"], "local");
    assert_eq!(run["status"], 201);
    assert_eq!(run["bytes"], local_body.len());
    assert_eq!(run["trace_id"], trace);
    assert!(
        run["client"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{run}"
    );
    assert!(run["duration_ms"].as_f64().unwrap() >= 0.0);
    assert!(run["time"].as_str().unwrap().ends_with('Z'), "{run}");
    assert_eq!(
        (
            &lines[1]["route"],
            &lines[1]["decision"],
            &lines[1]["trace_id"]
        ),
        (
            &serde_json::Value::Null,
            &serde_json::json!("passthrough"),
            &serde_json::Value::Null
        )
    );
    assert_eq!(
        (
            &lines[2]["route"],
            &lines[2]["decision"],
            &lines[2]["status"]
        ),
        (
            &serde_json::json!("devices"),
            &serde_json::json!("missing-key"),
            &serde_json::json!(400)
        )
    );
    drop(gw);

    let common = ClusterSpec::store("sqlite", &url, "access_common")
        .with_extra("telemetry:\n  access_log:\n    format: common\n    to: stderr\n");
    let gw = GatewayProcess::start(1, &common, &app).await;
    let (status, _, body) = cluster::get(&format!("{}/plain?a=%22b", gw.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::CREATED);
    let line = || {
        gw.log()
            .lines()
            .find(|l| l.starts_with("127.0.0.1 - - ["))
            .map(str::to_string)
    };
    support::wait_for_async("a common log line", Duration::from_secs(30), || async {
        line().is_some()
    })
    .await;
    let line = line().unwrap();
    let expected = format!(
        "\"GET /plain?a=%22b HTTP/1.1\" 201 {} \"-\" passthrough ",
        body.len()
    );
    assert!(line.contains(&expected), "{line}\nlacks {expected}");
    assert!(line.ends_with(" -"), "no trace id: {line}");
}
