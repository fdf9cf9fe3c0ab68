//! The command line against real stores: `check-config`, `migrate`,
//! `status`, `resolve`, `run`, `demo`, and their exit codes
//! (0 success, 2 usage or config, 1 runtime).

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::cluster;

fn rolegate(args: &[&str]) -> Output {
    Command::new(cluster::bin())
        .args(args)
        .output()
        .expect("run rolegate")
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn temp_config(name: &str, text: &str) -> PathBuf {
    let dir = support::test_dir(name);
    let p = dir.join("rolegate.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn the_example_config_passes_check_config() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config.example.yaml");
    let o = rolegate(&["check-config", "--config", example]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains(": ok (sqlite store, 82 roles"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn check_config_print_writes_a_config_that_check_config_accepts() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config.example.yaml");
    let o = rolegate(&["check-config", "--print", "--config", example]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let printed = stdout(&o);
    assert!(
        printed.contains("maintenance") && printed.contains("devices"),
        "{printed}"
    );
    let p = temp_config("printed", &printed);
    let again = rolegate(&["check-config", "--print", "--config", s(&p)]);
    assert_eq!(code(&again), 0, "{}", stderr(&again));
    assert_eq!(stdout(&again), printed, "printing is a fixed point");
}

#[test]
fn check_config_never_prints_a_secret_from_a_url() {
    let p = temp_config(
        "redact",
        "store:\n  kind: postgres\n  url: postgres://app:pw-in-userinfo@db:5432/app?sslmode=require&password=pw-in-query\nupstream:\n  url: http://127.0.0.1:3000\nproxy:\n  cluster_secret: a-cluster-secret-0123456789\n",
    );
    let o = rolegate(&["check-config", "--print", "--config", s(&p)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o) + &stderr(&o);
    for secret in ["pw-in-userinfo", "pw-in-query", "a-cluster-secret"] {
        assert!(!out.contains(secret), "`{secret}` printed:\n{out}");
    }
    assert!(
        out.contains("sslmode=require") && out.contains("<redacted>"),
        "{out}"
    );
}

#[test]
fn a_bad_config_is_refused_with_file_line_and_key_and_exit_2() {
    let p = temp_config(
        "bad",
        "roles:\n  - name: a\nroutes:\n  - prefixes: [/x]\n    role: nope\n",
    );
    let o = rolegate(&["check-config", "--config", s(&p)]);
    assert_eq!(code(&o), 2);
    let err = stderr(&o);
    assert!(
        err.contains(&format!("{}:5: routes[0].role:", p.display())),
        "{err}"
    );
    // `run` refuses the same file before starting anything.
    let o = rolegate(&["run", "--config", s(&p)]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let missing = rolegate(&["check-config", "--config", "/nonexistent/rolegate.yaml"]);
    assert_eq!(code(&missing), 2);
    assert!(
        stderr(&missing).contains("cannot read"),
        "{}",
        stderr(&missing)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_postgres_is_named_with_its_cause() {
    let p = temp_config(
        "pg_down",
        "store:\n  kind: postgres\n  url: postgres://app:secret-pw@127.0.0.1:1/app\n",
    );
    for command in ["status", "migrate"] {
        let o = rolegate(&[command, "--config", s(&p)]);
        assert_eq!(code(&o), 1, "{command}");
        let err = stderr(&o);
        assert!(
            err.contains("127.0.0.1:1") && err.to_lowercase().contains("connection refused"),
            "{command} names the address and the cause: {err}"
        );
        assert!(!err.contains("secret-pw"), "{err}");
    }
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(code(&rolegate(&["--no-such-flag"])), 2);
    assert_eq!(code(&rolegate(&["resolve"])), 2);
}

#[test]
fn run_without_an_upstream_is_a_config_error() {
    let p = temp_config("noup", "store:\n  kind: memory\nroles:\n  - name: a\n");
    let o = rolegate(&["run", "--config", s(&p)]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("upstream.url"), "{}", stderr(&o));
}

#[test]
fn resolve_prints_the_partition_role_of_a_key() {
    let p = temp_config(
        "resolve",
        "partitions:\n  - name: devices\n    count: 16\n  - name: actors\n    count: 64\n",
    );
    let o = rolegate(&["resolve", "devices", "device-42", "--config", s(&p)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "devices:partition-1");
    let o = rolegate(&[
        "resolve",
        "actors",
        "7",
        "--scope",
        "Order",
        "--config",
        s(&p),
    ]);
    assert_eq!(stdout(&o).trim(), "actors:partition-12");
    let o = rolegate(&["resolve", "nope", "k", "--config", s(&p)]);
    assert_eq!(code(&o), 2);
    let p = temp_config(
        "resolve_role",
        "roles:\n  - name: maintenance\npartitions:\n  - name: devices\n    count: 4\n",
    );
    let o = rolegate(&["resolve", "maintenance", "x", "--config", s(&p)]);
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).contains("is a role, not a partition"),
        "{}",
        stderr(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_agrees_with_the_gateway_for_every_encoding_of_a_key() {
    let app = support::cluster::TestApp::start(0).await;
    let spec = support::cluster::ClusterSpec::postgres("cli_resolve_enc");
    let gw = support::cluster::GatewayProcess::start(0, &spec, &app).await;
    support::wait_for_async(
        "every role held",
        std::time::Duration::from_secs(10),
        || async { gw.held().await.values().all(|h| h.0) },
    )
    .await;
    let o = rolegate(&[
        "resolve",
        "devices",
        "order-42",
        "--scope",
        "Order",
        "--config",
        s(&gw.config_path()),
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let want = stdout(&o).trim().to_string();
    for path in [
        "/orders/order-42",
        "/orders/ord%65r-42",
        "/orders/%6Frder%2D42",
        "/Orders/order-42/",
    ] {
        let (status, _, _) = support::cluster::get(&format!("{}{path}", gw.url()))
            .await
            .unwrap();
        assert_eq!(status.as_u16(), 201, "{path}");
        let e = app.executed().into_iter().last().unwrap();
        assert_eq!(e.path, path);
        assert_eq!(e.headers["x-rolegate-role"], want.as_str(), "{path}");
    }
}

fn pg_config(tag: &str) -> PathBuf {
    let text = format!(
        "store:\n  kind: postgres\n  url: {}\n  table: {}\n  migrate: false\nroles:\n  - name: maintenance\npartitions:\n  - name: devices\n    count: 2\n",
        support::postgres_url(),
        support::unique_table(tag)
    );
    temp_config(tag, &text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_and_status_work_against_postgres() {
    let p = pg_config("cli_pg");
    // Before migrating, status says what is wrong and exits 1.
    let o = rolegate(&["status", "--config", s(&p)]);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("rolegate migrate"), "{}", stderr(&o));
    let o = rolegate(&["migrate", "--config", s(&p)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = rolegate(&["migrate", "--config", s(&p)]);
    assert_eq!(code(&o), 0, "migrate is idempotent: {}", stderr(&o));
    // PostgreSQL's notices ("relation ... already exists, skipping") are
    // third-party chatter: logged at warn only, so not by default.
    assert!(
        !stderr(&o).contains("already exists"),
        "a second migrate is quiet: {}",
        stderr(&o)
    );

    // A real holder, through the library against the same table.
    let config = rolegate::Config::load(&p).unwrap();
    let store = rolegate::store::open(&config.store).await.unwrap();
    let c = config
        .coordinator(store)
        .advertise("http://127.0.0.1:9")
        .start()
        .unwrap();
    // The partition's roles come a tick later: its definition is recorded
    // once the lease table has been read.
    support::wait_for("held", Duration::from_secs(5), || {
        c.role("maintenance").unwrap().is_held() && c.partition("devices").unwrap().held_here() == 2
    })
    .await;

    let o = rolegate(&["status", "--config", s(&p)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let table = stdout(&o);
    // The table, then one spread line per partition.
    let (lines, spread): (Vec<&str>, Vec<&str>) =
        table.lines().partition(|l| !l.starts_with("partition "));
    assert!(
        lines[0].starts_with("ROLE") && lines[0].contains("HOLDER") && lines[0].contains("TOKEN"),
        "{table}"
    );
    assert_eq!(lines.len(), 4, "header + 3 roles: {table}");
    let want = format!(
        "partition devices (2 roles, balanced): {} 2",
        c.instance_id()
    );
    assert_eq!(spread, [want.as_str()], "{table}");
    let row = lines.iter().find(|l| l.starts_with("maintenance")).unwrap();
    assert!(row.contains(c.instance_id()), "{table}");
    // Columns are aligned: every line has the HOLDER column at the same offset.
    let col = lines[0].find("HOLDER").unwrap();
    for l in &lines[1..] {
        assert_eq!(l.as_bytes()[col - 1], b' ', "{table}");
    }
    let o = rolegate(&["status", "--json", "--config", s(&p)]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let m = v
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == "maintenance")
        .unwrap();
    assert_eq!(m["holder"], c.instance_id());
    assert!(m["token"].as_u64().unwrap() >= 1);
    c.shutdown().await;
}

#[test]
fn an_unreachable_store_is_a_runtime_error() {
    let closed = support::closed_port();
    let p = temp_config(
        "down",
        &format!(
            "store:\n  kind: postgres\n  url: postgres://postgres@127.0.0.1:{}/postgres\nroles:\n  - name: a\n",
            closed.port
        ),
    );
    let o = rolegate(&["status", "--config", s(&p)]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let o = rolegate(&["migrate", "--config", s(&p)]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_starts_answers_its_printed_commands_and_stops_cleanly_on_sigint() {
    demo_round_trip(&[]).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_runs_on_redis() {
    demo_round_trip(&["--store", "redis", "--store-url", &support::redis_url()]).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_runs_on_etcd() {
    demo_round_trip(&["--store", "etcd", "--store-url", &support::etcd_url()]).await;
}

/// Starts `rolegate demo` with extra arguments, follows its printed guide, and
/// stops it with SIGINT.
async fn demo_round_trip(extra: &[&str]) {
    let mut child = Command::new(cluster::bin())
        .args(["demo", "--base-port", "0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut printed = Vec::new();
    let start = Instant::now();
    while !printed.iter().any(|l: &String| l.starts_with("Ctrl-C")) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "demo did not print its guide: {printed:?}"
        );
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
            printed.push(line);
        }
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("demo exited early ({status}): {printed:?}\n{err}");
        }
    }
    let dir = printed[0]
        .rsplit("files in ")
        .next()
        .unwrap()
        .trim()
        .to_string();
    assert!(Path::new(&dir).exists());
    let urls: Vec<String> = printed
        .iter()
        .filter_map(|l| l.trim().strip_prefix("curl "))
        .map(|rest| rest.trim_start_matches("-N ").to_string())
        .collect();
    assert_eq!(urls.len(), 3, "{printed:?}");
    for url in &urls[..2] {
        let (status, _, body) = cluster::get(url).await.unwrap();
        assert_eq!(status, http::StatusCode::OK, "{url}");
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains("as holder of"), "{url}: {body}");
    }
    // The SSE command streams events.
    let resp = cluster::send(
        http::Request::get(&urls[2])
            .body(axum::body::Body::empty())
            .unwrap(),
    )
    .await
    .unwrap();
    let mut body = resp.into_body();
    let frame = tokio::time::timeout(
        Duration::from_secs(5),
        http_body_util::BodyExt::frame(&mut body),
    )
    .await
    .unwrap()
    .unwrap()
    .unwrap();
    assert!(String::from_utf8_lossy(&frame.into_data().unwrap()).starts_with("data: app-1 event 0"));
    drop(body);
    // The printed PID is a real gateway process.
    let kill_line = printed
        .iter()
        .find(|l| l.trim().starts_with("kill -9 "))
        .unwrap();
    let pid: u32 = kill_line
        .trim()
        .trim_start_matches("kill -9 ")
        .parse()
        .unwrap();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    // Killed, the gateway is reported and reaped while the demo runs on.
    let killed = Command::new("kill").args(["-9", &pid.to_string()]).status();
    assert!(killed.unwrap().success());
    let reported = format!("(pid {pid}) exited");
    let start = Instant::now();
    while !printed.iter().any(|l| l.contains(&reported)) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the demo did not report the killed gateway: {printed:?}"
        );
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
            printed.push(line);
        }
    }
    // Reaped, not a zombie: the /proc entry is gone.
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "{pid} is a zombie"
    );

    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "demo did not stop on SIGINT"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    assert!(!Path::new(&dir).exists(), "{dir} removed");
}

/// `rolegate run` and `rolegate status` on a store kind: two gateways, the
/// first holds, a request through the second is served by the first's app,
/// and `status` shows the holder.
#[allow(dead_code)]
async fn run_and_status_on(spec: cluster::ClusterSpec) {
    let apps = [
        cluster::TestApp::start(0).await,
        cluster::TestApp::start(1).await,
    ];
    let g0 = cluster::GatewayProcess::start(0, &spec, &apps[0]).await;
    support::wait_for_async("g0 holds", Duration::from_secs(10), || async {
        g0.held().await["maintenance"].0
    })
    .await;
    let g1 = cluster::GatewayProcess::start(1, &spec, &apps[1]).await;
    let gws = vec![g0, g1];
    cluster::wait_holder(&gws, "maintenance").await;
    let (status, headers, _) = cluster::get(&format!("{}/maintenance/via-store", gws[1].url()))
        .await
        .unwrap();
    assert_eq!(status, http::StatusCode::CREATED);
    assert_eq!(headers["x-app"], "0");
    let o = rolegate(&["status", "--json", "--config", s(&gws[1].config_path())]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let id = gws[0].leases().await["instance"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let m = v
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == "maintenance")
        .expect("maintenance listed");
    assert_eq!(m["holder"], id.as_str());
    assert_eq!(
        v.as_array().unwrap().len(),
        9,
        "every registered role listed: {v}"
    );
    // Graceful handover on this store too.
    gws[0].signal("TERM");
    support::wait_for_async("g1 takes over", Duration::from_secs(5), || async {
        gws[1].held().await["maintenance"].0
    })
    .await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_status_work_on_redis() {
    run_and_status_on(cluster::ClusterSpec::store(
        "redis",
        &support::redis_url(),
        "cli_redis",
    ))
    .await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_status_work_on_etcd() {
    run_and_status_on(cluster::ClusterSpec::store(
        "etcd",
        &support::etcd_url(),
        "cli_etcd",
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_status_work_on_sqlite() {
    let dir = support::test_dir("sqlite");
    let url = format!("sqlite://{}/leases.db", dir.display());
    run_and_status_on(cluster::ClusterSpec::store("sqlite", &url, "cli_sqlite")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_exits_0_for_2xx_and_1_otherwise() {
    let app = cluster::TestApp::start(0).await;
    let ok = Command::new(cluster::bin())
        .args(["probe", &format!("{}/healthz", app.url())])
        .output()
        .unwrap();
    assert_eq!(code(&ok), 0);
    app.set_healthy(false);
    let sick = Command::new(cluster::bin())
        .args(["probe", &format!("{}/healthz", app.url())])
        .output()
        .unwrap();
    assert_eq!(code(&sick), 1);
    let closed = support::closed_port();
    let down = Command::new(cluster::bin())
        .args([
            "probe",
            &format!("http://127.0.0.1:{}/healthz", closed.port),
        ])
        .output()
        .unwrap();
    assert_eq!(code(&down), 1);
}

/// `check-config` and `run` refuse the same file with the same exit code (2),
/// so a service manager's `RestartPreventExitStatus=2` stops the loop.
fn refused_by_both(p: &Path, needle: &str) {
    for command in ["check-config", "run"] {
        let o = rolegate(&[command, "--config", s(p)]);
        assert_eq!(code(&o), 2, "{command}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{command}: {}", stderr(&o));
    }
}

const UPSTREAM: &str = "upstream:\n  url: http://127.0.0.1:9\n";

#[test]
fn a_store_url_of_another_kind_is_refused_by_check_config_and_run() {
    let p = temp_config(
        "scheme_pg",
        &format!("{UPSTREAM}store:\n  kind: postgres\n  url: mysql://app@127.0.0.1:1/app\n"),
    );
    refused_by_both(
        &p,
        "store.url: `mysql://` does not match store.kind postgres",
    );
    let p = temp_config(
        "scheme_lite",
        &format!("{UPSTREAM}store:\n  kind: sqlite\n  url: postgres://app@127.0.0.1:1/app\n"),
    );
    refused_by_both(&p, "does not match store.kind sqlite");
}

#[test]
fn listen_and_admin_listen_on_one_port_are_refused_by_check_config_and_run() {
    // Held for the test: if `run` ever bound before refusing, it would fail
    // on this port rather than take it.
    let closed = support::closed_port();
    let port = closed.port;
    for (listen, admin) in [
        (format!("127.0.0.1:{port}"), format!("127.0.0.1:{port}")),
        (format!("0.0.0.0:{port}"), format!("127.0.0.1:{port}")),
    ] {
        let p = temp_config(
            "same_port",
            &format!("{UPSTREAM}store:\n  kind: memory\nlisten: {listen}\nadmin_listen: {admin}\n"),
        );
        refused_by_both(&p, "admin_listen: ");
        refused_by_both(&p, "same port as listen");
    }
}

#[test]
fn a_sqlite_database_in_a_missing_directory_is_named_by_check_config_and_run() {
    let dir = support::test_dir("lite_nodir").join("no-such-dir");
    let p = temp_config(
        "lite_nodir",
        &format!(
            "{UPSTREAM}listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nstore:\n  kind: sqlite\n  url: sqlite://{}/leases.db\n",
            dir.display()
        ),
    );
    refused_by_both(&p, &format!("the directory `{}`", dir.display()));
    refused_by_both(&p, "does not exist");
}

#[test]
fn an_unreadable_tls_file_exits_2_from_run_as_from_check_config() {
    let p = temp_config(
        "tls_missing",
        &format!("{UPSTREAM}listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nstore:\n  kind: memory\ntls:\n  cert_file: /nonexistent/cert.pem\n  key_file: /nonexistent/key.pem\n"),
    );
    refused_by_both(&p, "/nonexistent/cert.pem");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_connect_and_status_need_only_the_store_section() {
    let table = support::unique_table("cli_connect");
    // Every other section names a variable this machine does not have.
    let text = |url: &str| {
        format!(
            "upstream:\n  url: ${{ROLEGATE_TEST_UNSET_UPSTREAM}}\nproxy:\n  cluster_secret: ${{ROLEGATE_TEST_UNSET_SECRET}}\nstore:\n  kind: postgres\n  url: {url}\n  table: {table}\n  migrate: false\nroles:\n  - name: maintenance\n"
        )
    };
    let p = temp_config("cli_connect", &text(&support::postgres_url()));
    // The whole file does not resolve here...
    let o = rolegate(&["check-config", "--config", s(&p)]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("ROLEGATE_TEST_UNSET"), "{}", stderr(&o));
    // ...but its store section does: not migrated yet says so, exit 1.
    let o = rolegate(&["check-config", "--connect", "--config", s(&p)]);
    assert_eq!(code(&o), 1, "{}{}", stdout(&o), stderr(&o));
    assert!(stderr(&o).contains("rolegate migrate"), "{}", stderr(&o));
    let o = rolegate(&["migrate", "--config", s(&p)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = rolegate(&["check-config", "--connect", "--config", s(&p)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("store ok (postgres store")
            && out.contains("read and write granted")
            && out.contains("round trip "),
        "{out}"
    );
    let o = rolegate(&["status", "--config", s(&p)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).starts_with("ROLE"), "{}", stdout(&o));

    // A user that may read the table but not write it is named as such.
    let pool = sqlx::PgPool::connect(&support::postgres_url())
        .await
        .unwrap();
    let user = format!("{table}_ro");
    for sql in [
        format!("CREATE ROLE {user} LOGIN"),
        format!("GRANT SELECT ON {table}, {table}_members, {table}_partitions TO {user}"),
    ] {
        sqlx::query(&sql).execute(&pool).await.unwrap();
    }
    let mut url = url_with_user(&support::postgres_url(), &user);
    url.push_str("?application_name=check");
    let ro = temp_config("cli_connect_ro", &text(&url));
    let o = rolegate(&["check-config", "--connect", "--config", s(&ro)]);
    let err = stderr(&o);
    // The least privileges docs/deploy.md grants the runtime role are enough.
    for sql in [
        format!("GRANT INSERT, UPDATE ON {table} TO {user}"),
        format!("GRANT INSERT, UPDATE, DELETE ON {table}_members TO {user}"),
        format!("GRANT INSERT, UPDATE ON {table}_partitions TO {user}"),
    ] {
        sqlx::query(&sql).execute(&pool).await.unwrap();
    }
    let granted = rolegate(&["check-config", "--connect", "--config", s(&ro)]);
    for sql in [
        format!("REVOKE ALL ON {table}, {table}_members, {table}_partitions FROM {user}"),
        format!("DROP ROLE {user}"),
    ] {
        sqlx::query(&sql).execute(&pool).await.unwrap();
    }
    assert_eq!(code(&o), 1, "{err}");
    assert!(
        err.contains("lacks privileges") && err.contains(&format!("{table}: INSERT")),
        "{err}"
    );
    // Recording a partition whose roles are already held updates its row.
    assert!(
        err.contains(&format!("{table}_partitions: UPDATE")),
        "{err}"
    );
    assert_eq!(code(&granted), 0, "{}", stderr(&granted));
}

/// `postgres://user@host...` with another user.
fn url_with_user(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let rest = rest.split_once('@').map_or(rest, |(_, r)| r);
    format!("{scheme}://{user}@{rest}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_sorts_partition_roles_by_number_and_says_1_role() {
    let text = format!(
        "store:\n  kind: postgres\n  url: {}\n  table: {}\nroles:\n  - name: maintenance\npartitions:\n  - name: devices\n    count: 12\n  - name: single\n    count: 1\nroutes:\n  - prefixes: [/m]\n    role: maintenance\n",
        support::postgres_url(),
        support::unique_table("cli_order")
    );
    let p = temp_config("cli_order", &text);
    let o = rolegate(&["check-config", "--config", s(&p)]);
    assert!(
        stdout(&o).contains("(postgres store, 14 roles, 1 route)"),
        "{}",
        stdout(&o)
    );
    let config = rolegate::Config::load(&p).unwrap();
    let store = rolegate::store::open(&config.store).await.unwrap();
    let c = config
        .coordinator(store)
        .advertise("http://127.0.0.1:9")
        .start()
        .unwrap();
    c.ready(Duration::from_secs(5)).await.unwrap();
    let o = rolegate(&["status", "--config", s(&p)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    let devices: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|r| r.starts_with("devices:"))
        .collect();
    let want: Vec<String> = (0..12).map(|i| format!("devices:partition-{i}")).collect();
    assert_eq!(devices, want, "{out}");
    assert!(
        out.contains("partition single (1 role, balanced): "),
        "{out}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_on_sqlite_leaves_no_wal_or_shm_file() {
    let dir = support::test_dir("sqlite_wal");
    let db = dir.join("leases.db");
    let url = format!("sqlite://{}", db.display());
    let app = cluster::TestApp::start(0).await;
    let spec = cluster::ClusterSpec::store("sqlite", &url, "cli_wal");
    let mut gw = cluster::GatewayProcess::start(0, &spec, &app).await;
    let wal = dir.join("leases.db-wal");
    let shm = dir.join("leases.db-shm");
    assert!(wal.exists() && shm.exists(), "WAL mode while running");
    gw.signal("TERM");
    let status = gw.child.wait().unwrap();
    assert!(status.success(), "{}", gw.log());
    assert!(
        gw.log().contains("stopped; leases released"),
        "{}",
        gw.log()
    );
    assert!(!wal.exists(), "{} left behind", wal.display());
    assert!(!shm.exists(), "{} left behind", shm.display());
    assert!(db.exists());
}
