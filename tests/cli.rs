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
        let (status, _, body) = support::cluster::get(&format!("{}{path}", gw.url()))
            .await
            .unwrap();
        // An escaped key is also read as sent by some apps: where that
        // reading lands in another role, the gateway refuses it.
        if path.contains('%') && status.as_u16() == 400 {
            assert!(
                String::from_utf8_lossy(&body).contains("ambiguous-key"),
                "{path}"
            );
            continue;
        }
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

/// The demo's default ports: public 8081-8083, admin +10, apps +20.
const DEMO_PORTS: [u16; 9] = [8081, 8082, 8083, 8091, 8092, 8093, 8101, 8102, 8103];

/// `rolegate demo` exactly as the README says, on the default ports when
/// they are free (they lie outside the kernel's ephemeral range, so only
/// another program can hold them), else on ports of the kernel's choosing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_answers_every_request_it_prints_twice_15_s_apart_and_stops_cleanly() {
    let free = DEMO_PORTS
        .iter()
        .all(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok());
    let args: &[&str] = if free { &[] } else { &["--base-port", "0"] };
    demo_round_trip(args).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_answers_every_request_it_prints_on_postgres() {
    let pg = support::PrivatePostgres::start();
    let url = pg.url();
    demo_round_trip(&[
        "--base-port",
        "0",
        "--store",
        "postgres",
        "--store-url",
        &url,
    ])
    .await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_answers_every_request_it_prints_on_redis() {
    let redis = support::PrivateServer::redis();
    let url = redis.redis_url();
    demo_round_trip(&["--base-port", "0", "--store", "redis", "--store-url", &url]).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_answers_every_request_it_prints_on_etcd() {
    let etcd = support::PrivateServer::etcd();
    let url = etcd.etcd_url();
    demo_round_trip(&["--base-port", "0", "--store", "etcd", "--store-url", &url]).await;
}

/// An app that exits is reported with its log's end and restarted, and
/// answers again; one that keeps exiting stops the demo with exit 1 rather
/// than leaving a broken cluster running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_restarts_an_app_that_exits_and_stops_when_one_keeps_exiting() {
    let mut demo = Demo::start(&["--base-port", "0"]);
    demo.read_until("its guide", Duration::from_secs(90), |l| {
        l.starts_with("Ctrl-C")
    });
    let dir = demo.printed[0]
        .rsplit("files in ")
        .next()
        .unwrap()
        .trim()
        .to_string();
    let (_, _, mut app) = demo.pids()[0].clone();
    for exit in 1..=3 {
        assert!(Command::new("kill")
            .args(["-9", &app.to_string()])
            .status()
            .unwrap()
            .success());
        if exit == 3 {
            break;
        }
        let reported = format!("app-1 (pid {app}) exited");
        demo.read_until("the app's exit", Duration::from_secs(10), |l| {
            l.contains(&reported)
        });
        demo.read_until("the app back", Duration::from_secs(10), |l| {
            l.starts_with("app-1 is back (pid ") && !l.contains(&format!("(pid {app})"))
        });
        app = demo
            .printed
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix("app-1 is back (pid "))
            .and_then(|l| l.trim_end_matches(')').parse().ok())
            .unwrap();
        assert!(alive(app));
        // Its log's end came with the report: the app's own line.
        assert!(
            demo.printed
                .iter()
                .any(|l| l.trim().starts_with("listening on 127.0.0.1:")),
            "{:#?}",
            demo.printed
        );
        let out = run_line(
            demo.printed
                .iter()
                .map(|l| l.trim())
                .find(|l| l.starts_with("for d in"))
                .unwrap(),
        );
        assert_eq!(
            out.lines().filter(|l| l.contains(" as holder of ")).count(),
            6,
            "{out}"
        );
    }
    let start = Instant::now();
    let status = loop {
        if let Some(s) = demo.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the demo went on with an app that keeps exiting"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(1), "{status}");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut demo.child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("exited 3 times within 60 s"), "{err}");
    assert!(!Path::new(&dir).exists(), "{dir} removed");
}

/// A running demo and the lines it printed.
struct Demo {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    printed: Vec<String>,
}

impl Drop for Demo {
    fn drop(&mut self) {
        // A failed test must not leave a cluster running.
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .args(["-INT", &self.child.id().to_string()])
                .status();
            let _ = self.child.wait();
        }
    }
}

impl Demo {
    fn start(args: &[&str]) -> Demo {
        let mut child = Command::new(cluster::bin())
            .arg("demo")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start rolegate demo");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Demo {
            child,
            lines,
            printed: Vec::new(),
        }
    }

    /// Reads printed lines until one satisfies `done`; panics after `limit`
    /// or when the demo exits.
    fn read_until(&mut self, what: &str, limit: Duration, done: impl Fn(&str) -> bool) {
        let start = Instant::now();
        loop {
            if self.printed.iter().any(|l| done(l)) {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "demo did not print {what} within {limit:?}: {:#?}",
                self.printed
            );
            if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(100)) {
                self.printed.push(line);
                continue;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                panic!("demo exited early ({status}): {:#?}\n{err}", self.printed);
            }
        }
    }

    /// Takes in what has been printed meanwhile.
    fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.printed.push(line);
        }
    }

    /// The PIDs in the guide's table (gateway, app), by gateway name.
    fn pids(&self) -> Vec<(String, u32, u32)> {
        self.printed
            .iter()
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                if w.len() == 5 && w[0].starts_with("gw-") {
                    Some((w[0].to_string(), w[3].parse().ok()?, w[4].parse().ok()?))
                } else {
                    None
                }
            })
            .collect()
    }
}

/// Whether a process runs (exists and is not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        })
        .unwrap_or(false)
}

/// Runs one printed shell line as a newcomer would (curl from the shell),
/// for at most 5 s, and gives what it printed.
fn run_line(line: &str) -> String {
    let out = Command::new("timeout")
        .args(["5", "sh", "-c", line])
        .output()
        .expect("sh");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every request line the guide printed answers: each `curl` is served by
/// a demo app as the holder of its role (the apps answer only 200), the
/// SSE line streams at least one event.
fn every_printed_request_answers(printed: &[String]) {
    let lines: Vec<&str> = printed
        .iter()
        .map(|l| l.trim())
        .filter(|l| l.starts_with("curl ") || l.starts_with("for d in"))
        .collect();
    assert_eq!(
        lines.len(),
        4,
        "three curl lines and the loop: {printed:#?}"
    );
    let mut answered = 0;
    for line in lines {
        let out = run_line(line);
        if line.starts_with("curl -N") {
            assert!(
                out.lines().any(|l| l.starts_with("data: app-")),
                "{line}: {out:?}"
            );
            answered += 1;
            continue;
        }
        let expected = if line.starts_with("for d in") { 6 } else { 1 };
        let handled: Vec<&str> = out
            .lines()
            .filter(|l| l.contains(" handled /") && l.contains(" as holder of "))
            .collect();
        assert_eq!(handled.len(), expected, "{line}: {out:?}");
        answered += handled.len();
    }
    assert_eq!(answered, 9);
}

/// Each status page, as headless Chromium renders it, names its gateway,
/// says it is ready and shows the partition's share.
fn status_pages_render(printed: &[String], shots: &Path) {
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or_else(|| {
            panic!("this test needs Chromium: run `scripts/test` (it installs it) or `apt-get install -y chromium`")
        });
    let pages: Vec<(String, String)> = printed
        .iter()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 5 && w[0].starts_with("gw-")).then(|| (w[0].to_string(), w[2].to_string()))
        })
        .collect();
    assert_eq!(pages.len(), 3, "{printed:#?}");
    for (name, url) in pages {
        let profile = shots.join(format!("profile-{name}"));
        let shot = shots.join(format!("{name}.png"));
        let browse = |extra: &[&str]| {
            Command::new("timeout")
                .arg("60")
                .arg(chromium)
                .args([
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--window-size=1280,900",
                ])
                .arg(format!("--user-data-dir={}", profile.display()))
                .args(extra)
                .arg(&url)
                .output()
                .expect("run chromium")
        };
        let dom = browse(&["--dump-dom"]);
        let text = String::from_utf8_lossy(&dom.stdout);
        for expected in [
            format!("instance <b>{name}-"),
            "ready".to_string(),
            "partition <b>devices</b>".to_string(),
            "<td>maintenance</td>".to_string(),
        ] {
            assert!(
                text.contains(&expected),
                "{url} as Chromium renders it lacks {expected:?}:\n{text}\n{}",
                String::from_utf8_lossy(&dom.stderr)
            );
        }
        // A picture for a reviewer (kept under the test's directory).
        let _ = browse(&[&format!("--screenshot={}", shot.display())]);
    }
}

/// Starts `rolegate demo` with `args` and follows its guide as a newcomer
/// would: runs every request line it printed at once and again 15 s later
/// (every one must answer, no process may have died), looks at the status
/// pages in a browser, kills the gateway it names as the holder and sees
/// another take over, then stops it with Ctrl-C (exit 0, folder removed).
async fn demo_round_trip(args: &[&str]) {
    let mut demo = Demo::start(args);
    demo.read_until("its guide", Duration::from_secs(90), |l| {
        l.starts_with("Ctrl-C")
    });
    let dir = demo.printed[0]
        .rsplit("files in ")
        .next()
        .unwrap()
        .trim()
        .to_string();
    assert!(Path::new(&dir).exists());
    let pids = demo.pids();
    assert_eq!(pids.len(), 3, "{:#?}", demo.printed);

    let first = Instant::now();
    every_printed_request_answers(&demo.printed);
    status_pages_render(&demo.printed, &support::test_dir("demo_pages"));
    let later = Duration::from_secs(15).saturating_sub(first.elapsed());
    // The second look comes 15 s after the first (the old demo's apps had
    // died by then).
    tokio::time::sleep(later).await;
    every_printed_request_answers(&demo.printed);
    demo.drain();
    for (name, gateway, app) in &pids {
        assert!(
            alive(*gateway),
            "{name}'s gateway died: {:#?}",
            demo.printed
        );
        assert!(alive(*app), "{name}'s app died: {:#?}", demo.printed);
    }
    assert!(
        !demo.printed.iter().any(|l| l.contains("exited")),
        "{:#?}",
        demo.printed
    );

    // The kill line names the gateway that holds `maintenance`.
    let holds = demo
        .printed
        .iter()
        .find_map(|l| l.strip_prefix("Watch failover: "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();
    let kill_line = demo
        .printed
        .iter()
        .find(|l| l.trim().starts_with("kill -9 "))
        .unwrap();
    let pid: u32 = kill_line
        .trim()
        .trim_start_matches("kill -9 ")
        .parse()
        .unwrap();
    let named = pids
        .iter()
        .find(|(_, g, _)| *g == pid)
        .expect("a gateway's PID");
    assert_eq!(named.0, holds, "{:#?}", demo.printed);
    let (status, _, body) = cluster::get(&format!(
        "{}/leases",
        demo.printed
            .iter()
            .find_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                (w.len() == 5 && w[0] == holds).then(|| w[2].trim_end_matches('/').to_string())
            })
            .unwrap()
    ))
    .await
    .unwrap();
    assert_eq!(status, http::StatusCode::OK);
    let leases: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let held_here = leases["roles"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["role"] == "maintenance" && r["held_here"] == true);
    assert!(held_here, "{holds} does not hold maintenance: {leases}");

    // Killed, the gateway is reported and reaped, and the demo says which
    // gateway holds the role now.
    let killed = Command::new("kill").args(["-9", &pid.to_string()]).status();
    assert!(killed.unwrap().success());
    let reported = format!("(pid {pid}) exited");
    demo.read_until("the killed gateway", Duration::from_secs(10), |l| {
        l.contains(&reported)
    });
    demo.read_until("the new holder", Duration::from_secs(30), |l| {
        l.starts_with("maintenance is now held by gw-")
    });
    let now = demo
        .printed
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("maintenance is now held by "))
        .unwrap();
    assert!(!now.starts_with(&holds), "{now}");
    assert!(!alive(pid), "{pid} is still there (a zombie?)");

    let ok = Command::new("kill")
        .args(["-INT", &demo.child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = demo.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "demo did not stop on SIGINT"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    assert!(!Path::new(&dir).exists(), "{dir} removed");
    for (name, gateway, app) in &pids {
        assert!(!alive(*gateway), "{name}'s gateway outlived the demo");
        assert!(!alive(*app), "{name}'s app outlived the demo");
    }
}

/// A gateway whose stdout and stderr are closed under it (a supervisor's
/// journal that went away, a `| head`) keeps running: it takes a role it
/// must log about, and serves requests under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_whose_stdout_and_stderr_close_keeps_taking_roles_and_serving() {
    let dir = support::test_dir("closed_stdio");
    let app = cluster::TestApp::start(1).await;
    let config = |name: &str| {
        let p = dir.join(format!("{name}.yaml"));
        std::fs::write(
            &p,
            format!(
                "instance:\n  name: {name}\nlisten: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\n\
                 upstream:\n  url: http://127.0.0.1:{}\nstore:\n  kind: sqlite\n  url: sqlite://{}/leases.db\n\
                 lease:\n  duration: 2s\n  renew_interval: 500ms\n  safety_margin: 500ms\n\
                 roles:\n  - name: solo\nroutes:\n  - prefixes: [/solo]\n    role: solo\n",
                app.port,
                dir.display()
            ),
        )
        .unwrap();
        p
    };
    // The first gateway holds `solo`, logging to a file as usual.
    let first_log = dir.join("first.log");
    let mut first = Command::new(cluster::bin())
        .args(["run", "--config"])
        .arg(config("first"))
        .env("RUST_LOG", "rolegate=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&first_log).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !std::fs::read_to_string(&first_log)
        .unwrap_or_default()
        .contains("acquired roles")
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "first never held"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The second logs to pipes that the test closes once it has started.
    let mut second = Command::new(cluster::bin())
        .args(["run", "--config"])
        .arg(config("second"))
        .env("RUST_LOG", "rolegate=debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(second.stderr.take().unwrap());
    let mut seen = String::new();
    let (port, admin) = loop {
        let mut line = String::new();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "second exited: {seen}"
        );
        seen.push_str(&line);
        if let Some(ports) = cluster::started_ports(&line) {
            break ports;
        }
    };
    drop(err);
    drop(second.stdout.take());
    // The first dies; the second must take the role and log it, and debug
    // lines flow on every tick, all into closed pipes.
    let _ = first.kill();
    let _ = first.wait();
    let admin_url = format!("http://127.0.0.1:{admin}/leases");
    support::wait_for_async("the second to hold solo", Duration::from_secs(30), || {
        let url = admin_url.clone();
        async move {
            match cluster::get(&url).await {
                Ok((http::StatusCode::OK, _, body)) => {
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    v["roles"][0]["held_here"] == true
                }
                _ => false,
            }
        }
    })
    .await;
    for i in 0..20 {
        let (status, _, _) = cluster::get(&format!("http://127.0.0.1:{port}/solo/{i}"))
            .await
            .unwrap();
        assert!(status.is_success(), "{status}");
    }
    let executed: Vec<_> = app
        .executed()
        .into_iter()
        .filter(|e| e.path.starts_with("/solo/"))
        .collect();
    assert_eq!(executed.len(), 20, "{executed:?}");
    assert!(executed.iter().all(|e| e
        .headers
        .get("x-rolegate-role")
        .is_some_and(|r| r == "solo")));
    assert!(
        second.try_wait().unwrap().is_none(),
        "the gateway exited with its output closed"
    );
    let _ = second.kill();
    let _ = second.wait();
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
