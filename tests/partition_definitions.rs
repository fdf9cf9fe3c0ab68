//! One meaning of a key across the fleet: the store records each
//! partition's definition; an instance configured differently neither holds
//! nor serves the partition (503 `partition-mismatch`), a resize is an
//! explicit migration that no instance serves through until every old term
//! has ended, and members that route differently are reported by everyone.
//!
//! Real gateway processes in front of recording apps, on PostgreSQL (and
//! the mismatch case on Redis and etcd too).

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use rolegate::lease::partition_index;
use support::cluster::{self, ClusterSpec, GatewayProcess, TestApp};

const KEYS: usize = 40;

/// The `devices` partition with `count` roles, keyed by `X-Device-Id`.
fn routes(count: u32) -> String {
    format!(
        "partitions:\n  - name: devices\n    count: {count}\nroutes:\n  - prefixes: [/device-api]\n    partition: devices\n    key: {{ header: X-Device-Id }}\n"
    )
}

fn key(i: usize) -> String {
    format!("dev-{i}")
}

/// One keyed request through a gateway: (status, body).
async fn send_key(url: &str, key: &str) -> (StatusCode, String) {
    let req = Request::get(format!("{url}/device-api/x"))
        .header("x-device-id", key)
        .body(Body::empty())
        .unwrap();
    match cluster::request(req).await {
        Ok((status, _, body)) => (status, String::from_utf8_lossy(&body).into_owned()),
        Err(e) => (StatusCode::from_u16(599).unwrap(), e),
    }
}

/// How many of the partition's roles the gateways hold, together.
async fn roles_held(gws: &[GatewayProcess]) -> usize {
    let mut n = 0;
    for g in gws {
        n += (g.held().await)
            .iter()
            .filter(|(role, (here, _))| *here && role.starts_with("devices:"))
            .count();
    }
    n
}

async fn wait_roles_held(gws: &[GatewayProcess], count: usize) {
    support::wait_for_async(
        &format!("the gateways hold all {count} roles of devices"),
        Duration::from_secs(30),
        || async { roles_held(gws).await == count },
    )
    .await;
}

/// Every execution of a keyed request by `app`: (key, role index, time).
fn executions(app: &TestApp) -> Vec<(String, u32, u64)> {
    app.executed()
        .into_iter()
        .filter(|e| e.path.starts_with("/device-api"))
        .map(|e| {
            let key = e.headers["x-device-id"].to_str().unwrap().to_string();
            let role = e.headers["x-rolegate-role"].to_str().unwrap().to_string();
            let index = role
                .strip_prefix("devices:partition-")
                .and_then(|i| i.parse().ok())
                .unwrap_or_else(|| panic!("a devices role: {role}"));
            (key, index, e.t_ns)
        })
        .collect()
}

/// Two gateways sharing a store, one with `devices` at count 12 (first, so
/// recorded) and one at 16: no key runs on the second one's app, which
/// answers 503 `partition-mismatch` naming both definitions, logs one
/// ERROR, stays ready and shows the mismatch on `/leases` and `/metrics`.
async fn two_counts_side_by_side(spec: ClusterSpec) {
    let (app0, app1) = (TestApp::start(0).await, TestApp::start(1).await);
    let gw0 = GatewayProcess::start_for_upstream(0, &spec, app0.port, &routes(12)).await;
    wait_roles_held(std::slice::from_ref(&gw0), 12).await;
    let gw1 = GatewayProcess::start_for_upstream(1, &spec, app1.port, &routes(16)).await;
    // Until it has read the recorded definition and judged it: from then
    // on it must hold and serve none of the partition's roles.
    let started = std::time::Instant::now();
    while gw1.leases().await["partitions"][0]["state"] != "mismatch" {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "gateway 1 never judged its definition: {}",
            gw1.leases().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    for i in 0..KEYS {
        let (status, body) = send_key(&gw0.url(), &key(i)).await;
        assert!(
            status.is_success(),
            "{} via the recorded one: {status} {body}",
            key(i)
        );
        let (status, body) = send_key(&gw1.url(), &key(i)).await;
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}: {body}",
            key(i)
        );
        assert!(body.contains("partition-mismatch"), "{body}");
        assert!(
            body.contains("count=16") && body.contains("count=12"),
            "{body}"
        );
    }
    assert!(
        executions(&app1).is_empty(),
        "keys ran on the mismatched instance's app: {:?}",
        executions(&app1)
    );
    let ran = executions(&app0);
    assert_eq!(
        ran.len(),
        KEYS,
        "each key ran once, on the recorded definition's holder"
    );
    for (k, index, _) in &ran {
        assert_eq!(
            *index,
            partition_index(None, k, 12),
            "{k} ran under count 12"
        );
    }

    let view = gw1.leases().await;
    let p = &view["partitions"][0];
    assert_eq!(p["state"], "mismatch");
    assert_eq!(p["definition"], "count=16 hash=xxh64-v1 scopes=[null]");
    assert_eq!(p["recorded"], "count=12 hash=xxh64-v1 scopes=[null]");
    assert_eq!(p["held_here"], 0);
    assert_eq!(gw0.leases().await["partitions"][0]["state"], "serving");
    let (status, _, _) = cluster::get(&format!("{}/readyz", gw1.admin_url()))
        .await
        .unwrap();
    assert_eq!(
        status,
        StatusCode::OK,
        "the mismatch leaves readiness alone"
    );
    let (_, _, metrics) = cluster::get(&format!("{}/metrics", gw1.admin_url()))
        .await
        .unwrap();
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains("rolegate_partition_mismatch{partition=\"devices\"} 1"),
        "{metrics}"
    );
    let log = gw1.log();
    let errors = log
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("differs from the one the store records"))
        .count();
    assert_eq!(errors, 1, "one ERROR for the mismatch:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_counts_side_by_side_serve_no_key_under_two_definitions_on_postgres() {
    two_counts_side_by_side(ClusterSpec::postgres("pdef")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_counts_side_by_side_serve_no_key_under_two_definitions_on_redis() {
    two_counts_side_by_side(ClusterSpec::store("redis", &support::redis_url(), "pdef")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_counts_side_by_side_serve_no_key_under_two_definitions_on_etcd() {
    two_counts_side_by_side(ClusterSpec::store("etcd", &support::etcd_url(), "pdef")).await;
}

/// Stops a gateway gracefully and waits for its exit.
async fn stop(mut gw: GatewayProcess) {
    gw.signal("TERM");
    support::wait_for(
        "the gateway exits after SIGTERM",
        Duration::from_secs(20),
        || matches!(gw.child.try_wait(), Ok(Some(_))),
    )
    .await;
}

/// A resize from 12 to 16 roles under steady load, with a rolling
/// redeploy around it (one gateway redeployed before the resize, two
/// after): no key ever runs under both definitions at once (every
/// execution under count 12 comes before every one under count 16), and
/// after the rollout every key is served again through every gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_under_load_with_a_rolling_redeploy_serves_no_key_under_two_definitions() {
    let spec = ClusterSpec::postgres("resize");
    let mut apps = Vec::new();
    for n in 0..3 {
        apps.push(TestApp::start(n).await);
    }
    let mut gws = Vec::new();
    for (n, app) in apps.iter().enumerate() {
        gws.push(Some(
            GatewayProcess::start_for_upstream(n, &spec, app.port, &routes(12)).await,
        ));
    }
    let live = |gws: &[Option<GatewayProcess>]| -> Vec<String> {
        gws.iter().flatten().map(|g| g.url()).collect()
    };
    support::wait_for_async(
        "the three gateways hold all 12 roles",
        Duration::from_secs(30),
        || async {
            let mut n = 0;
            for g in gws.iter().flatten() {
                n += (g.held().await)
                    .iter()
                    .filter(|(r, (here, _))| *here && r.starts_with("devices:"))
                    .count();
            }
            n == 12
        },
    )
    .await;

    // Steady load: keys round robin over whichever gateways are up.
    let urls = Arc::new(Mutex::new(live(&gws)));
    let done = Arc::new(AtomicBool::new(false));
    let statuses = Arc::new(Mutex::new(HashMap::<u16, usize>::new()));
    let load = {
        let (urls, done, statuses) = (urls.clone(), done.clone(), statuses.clone());
        tokio::spawn(async move {
            let mut i = 0usize;
            while !done.load(Ordering::SeqCst) {
                let url = {
                    let urls = urls.lock().unwrap();
                    urls[i % urls.len()].clone()
                };
                let (status, _) = send_key(&url, &key(i % KEYS)).await;
                *statuses.lock().unwrap().entry(status.as_u16()).or_default() += 1;
                i += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Redeploy gateway 0 with count 16 first: it must not serve the
    // partition while the store still records 12.
    let down = |gws: &[Option<GatewayProcess>], n: usize| -> Vec<String> {
        (gws.iter().enumerate())
            .filter(|(i, _)| *i != n)
            .filter_map(|(_, g)| g.as_ref().map(|g| g.url()))
            .collect()
    };
    *urls.lock().unwrap() = down(&gws, 0);
    stop(gws[0].take().expect("gateway 0")).await;
    gws[0] = Some(GatewayProcess::start_for_upstream(10, &spec, apps[0].port, &routes(16)).await);
    *urls.lock().unwrap() = live(&gws);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The resize: an explicit migration through the CLI.
    let config = gws[0].as_ref().unwrap().config_path();
    let out = std::process::Command::new(cluster::bin())
        .args(["partitions", "resize", "devices", "16", "--config"])
        .arg(&config)
        .output()
        .expect("run rolegate partitions resize");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    for n in 1..3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        *urls.lock().unwrap() = down(&gws, n);
        stop(gws[n].take().expect("gateway")).await;
        gws[n] = Some(
            GatewayProcess::start_for_upstream(10 + n, &spec, apps[n].port, &routes(16)).await,
        );
        *urls.lock().unwrap() = live(&gws);
    }
    let gws: Vec<GatewayProcess> = gws.into_iter().flatten().collect();
    wait_roles_held(&gws, 16).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    done.store(true, Ordering::SeqCst);
    load.await.unwrap();

    // Every key is served again, through every gateway.
    for i in 0..KEYS {
        for g in &gws {
            let (status, body) = send_key(&g.url(), &key(i)).await;
            assert!(
                status.is_success(),
                "{} via gateway {}: {status} {body}",
                key(i),
                g.n
            );
        }
    }

    // No key under two definitions at once: classify each execution by the
    // definition its role index belongs to (keys whose index is the same
    // under both are the same role either way, held by one instance).
    let (mut old, mut new) = (Vec::new(), Vec::new());
    for app in &apps {
        for (k, index, t) in executions(app) {
            let (i12, i16) = (partition_index(None, &k, 12), partition_index(None, &k, 16));
            if i12 == i16 {
                continue;
            }
            if index == i12 {
                old.push(t);
            } else if index == i16 {
                new.push(t);
            } else {
                panic!("{k} ran as partition {index}, under neither definition");
            }
        }
    }
    let statuses = statuses.lock().unwrap().clone();
    assert!(
        !old.is_empty() && !new.is_empty(),
        "the load ran under both definitions: {} and {} executions; statuses {statuses:?}",
        old.len(),
        new.len()
    );
    let last_old = old.iter().max().unwrap();
    let first_new = new.iter().min().unwrap();
    assert!(
        last_old < first_new,
        "an execution under count 12 came {} ms after the first under count 16; statuses {statuses:?}",
        (last_old - first_new) / 1_000_000
    );
    assert!(said.contains("epoch 2"), "{said}");
    eprintln!(
        "resize: {} executions under count 12, {} under 16, gap {} ms; statuses {statuses:?}",
        old.len(),
        new.len(),
        (first_new - last_old) / 1_000_000
    );
}

/// Three balanced gateways, the third routing one more prefix: every
/// member reports the difference (a WARN naming the prefix, and `/leases`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_table_difference_is_reported_by_every_member() {
    let spec = ClusterSpec::postgres("routefp");
    let mut apps = Vec::new();
    for n in 0..3 {
        apps.push(TestApp::start(n).await);
    }
    let more = format!(
        "{}  - prefixes: [/reports]\n    partition: devices\n    key: {{ header: X-Device-Id }}\n",
        routes(8)
    );
    let mut gws = Vec::new();
    for (n, app) in apps.iter().enumerate() {
        let r = if n == 2 { more.clone() } else { routes(8) };
        gws.push(GatewayProcess::start_for_upstream(n, &spec, app.port, &r).await);
    }
    let mut ids = Vec::new();
    for g in &gws {
        ids.push(
            g.leases().await["instance"]["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    for (n, g) in gws.iter().enumerate() {
        support::wait_for_async(
            &format!("gateway {n} lists the differing members"),
            Duration::from_secs(15),
            || async {
                let view = g.leases().await;
                let members = view["members"].as_array().cloned().unwrap_or_default();
                let differing: Vec<String> = members
                    .iter()
                    .filter(|m| !m["route_differences"].as_array().unwrap().is_empty())
                    .map(|m| m["id"].as_str().unwrap().to_string())
                    .collect();
                let want: Vec<String> = if n == 2 {
                    vec![ids[0].clone(), ids[1].clone()]
                } else {
                    vec![ids[2].clone()]
                };
                let mut differing = differing;
                differing.sort();
                let mut want = want;
                want.sort();
                members.len() == 3 && differing == want
            },
        )
        .await;
        let view = g.leases().await;
        let text = view["members"].to_string();
        assert!(text.contains("/reports is routed only"), "{text}");
        let log = g.log();
        let warns = log
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("routes differently"))
            .filter(|l| l.contains("/reports"))
            .count();
        let expected = if n == 2 { 2 } else { 1 };
        assert_eq!(
            warns, expected,
            "gateway {n}, one WARN per differing member:\n{log}"
        );
    }
}

/// Roles only, no partition: a prefix that one gateway routes to another
/// role than the other does (the prefix moving between roles mid-deploy)
/// is reported by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_moving_between_roles_is_reported_by_both_members() {
    let spec = ClusterSpec::postgres("routefp_roles");
    let (app0, app1) = (TestApp::start(0).await, TestApp::start(1).await);
    let table = |role: &str| {
        format!(
            "roles:\n  - name: billing\n  - name: reports\nroutes:\n  - prefixes: [/billing]\n    role: billing\n  - prefixes: [/reports]\n    role: {role}\n"
        )
    };
    let gws = [
        GatewayProcess::start_for_upstream(0, &spec, app0.port, &table("reports")).await,
        GatewayProcess::start_for_upstream(1, &spec, app1.port, &table("billing")).await,
    ];
    for (n, g) in gws.iter().enumerate() {
        support::wait_for_async(
            &format!("gateway {n} reports the other's /reports"),
            Duration::from_secs(15),
            || async {
                let members = g.leases().await["members"].to_string();
                members.contains("/reports has another owner, key or scope")
            },
        )
        .await;
        // Only the prefix that differs: both route /billing alike.
        let members = g.leases().await["members"].to_string();
        assert!(!members.contains("/billing"), "gateway {n}: {members}");
        let log = g.log();
        assert!(
            log.lines().any(|l| l.contains("WARN")
                && l.contains("routes differently")
                && l.contains("/reports")),
            "gateway {n}:\n{log}"
        );
    }
}
