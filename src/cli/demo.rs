//! `rolegate demo`: a local cluster of three gateways in front of three demo
//! apps on the embedded SQLite store, as child processes (so one can really
//! be killed). Prints what to curl and which PID to kill to watch failover;
//! Ctrl-C stops everything and removes what it created.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::EXIT_RUNTIME;
use crate::proxy::{Forwarder, HopProtocol};

const INSTANCES: usize = 3;

/// Options of `rolegate demo`.
#[derive(Debug, Clone)]
pub(super) struct DemoOptions {
    /// First public port (then +1, +2); admin ports at +10, apps at +20.
    /// 0 picks free ports.
    pub base_port: u16,
    pub store: String,
    pub store_url: Option<String>,
}

struct Node {
    name: String,
    public: u16,
    admin: u16,
    app: u16,
    gateway: Option<Child>,
    app_child: Option<Child>,
}

fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Why the demo could not start.
#[derive(Debug, thiserror::Error)]
enum DemoError {
    /// A file or process operation failed.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Ports, options or a gateway that did not come up.
    #[error("{0}")]
    Setup(String),
    /// The readiness probe's client.
    #[error("cannot build the HTTP client")]
    Client(#[from] crate::proxy::ForwardError),
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> DemoError {
    move |source| DemoError::Io { what, source }
}

/// The ports of each node (public, admin, app): from `base`, or all 0 when
/// `base` is 0, so every process binds a port of the kernel's choosing and
/// reports it (no port is picked free and released first, which races).
fn pick_ports(base: u16) -> Result<Vec<(u16, u16, u16)>, DemoError> {
    let mut out = Vec::new();
    for i in 0..INSTANCES as u16 {
        if base == 0 {
            out.push((0, 0, 0));
            continue;
        }
        let p = (base + i, base + 10 + i, base + 20 + i);
        for port in [p.0, p.1, p.2] {
            if !port_free(port) {
                return Err(DemoError::Setup(format!(
                    "port {port} is in use; pick other ports with --base-port N (or 0 for any free ports)"
                )));
            }
        }
        out.push(p);
    }
    Ok(out)
}

/// The last lines of a log file.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

/// The public and admin ports a gateway's log says it bound (its
/// `rolegate gateway started` line).
fn started_ports(log: &str) -> Option<(u16, u16)> {
    let line = log
        .lines()
        .find(|l| l.contains("rolegate gateway started"))?;
    let port = |key: &str| -> Option<u16> {
        let value = line.split_whitespace().find_map(|w| w.strip_prefix(key))?;
        value.rsplit(':').next()?.parse().ok()
    };
    Some((port("listen=")?, port("admin=")?))
}

fn config_text(node: &Node, store_kind: &str, store_url: &str) -> String {
    format!(
        r#"# Written by `rolegate demo`.
instance:
  name: {name}
listen: 127.0.0.1:{public}
admin_listen: 127.0.0.1:{admin}
upstream:
  url: http://127.0.0.1:{app}
  health:
    path: /healthz
    interval: 1s
    unhealthy_after: 3
store:
  kind: {store_kind}
  url: {store_url}
lease:
  duration: 3s
  renew_interval: 1s
  safety_margin: 500ms
roles:
  - name: maintenance
partitions:
  - name: devices
    count: 6
routes:
  - prefixes: [/maintenance]
    role: maintenance
  - prefixes: [/devices]
    partition: devices
    key: {{ path_segment: 2 }}
shutdown:
  drain_timeout: 2s
"#,
        name = node.name,
        public = node.public,
        admin = node.admin,
        app = node.app,
    )
}

fn spawn(args: &[&str], log: &Path, stdout: Stdio) -> Result<Child, DemoError> {
    let exe = std::env::current_exe().map_err(io("cannot find this binary".into()))?;
    let log = std::fs::File::create(log).map_err(io(format!("cannot create {}", log.display())))?;
    Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(log)
        .spawn()
        .map_err(io(format!("cannot start {args:?}")))
}

fn terminate(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
    }
}

fn reap(child: &mut Child, limit: Duration) {
    let start = Instant::now();
    while start.elapsed() < limit {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Waits for Ctrl-C or SIGTERM, reaping and reporting any process of the
/// demo that exits meanwhile (a gateway you `kill -9` is not left a zombie).
async fn watch_until_stopped(nodes: &mut [Node]) {
    let stop = crate::shutdown::signal();
    tokio::pin!(stop);
    let mut every = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = every.tick() => {}
        }
        for n in nodes.iter_mut() {
            report_exit(&n.name, &mut n.gateway, "its roles move to another gateway");
            report_exit(
                &format!("{} app", n.name),
                &mut n.app_child,
                "its gateway answers 502",
            );
        }
    }
}

fn report_exit(name: &str, child: &mut Option<Child>, consequence: &str) {
    let Some(c) = child else { return };
    if let Ok(Some(status)) = c.try_wait() {
        println!("{name} (pid {}) exited: {status}; {consequence}", c.id());
        *child = None;
    }
}

/// Runs the demo until Ctrl-C or SIGTERM.
pub(super) async fn run(options: DemoOptions) -> ExitCode {
    let dir = std::env::temp_dir().join(format!("rolegate-demo-{}", std::process::id()));
    let mut nodes = Vec::new();
    let result = start(&options, &dir, &mut nodes).await;
    if let Err(e) = &result {
        eprintln!("error: {}", super::report(e));
    } else {
        watch_until_stopped(&mut nodes).await;
        println!("\nstopping the demo ...");
    }
    // Gateways first (they drain and release), then the apps.
    for n in &mut nodes {
        if let Some(g) = &mut n.gateway {
            terminate(g);
        }
    }
    for n in &mut nodes {
        if let Some(g) = &mut n.gateway {
            reap(g, Duration::from_secs(5));
        }
        if let Some(a) = &mut n.app_child {
            terminate(a);
            reap(a, Duration::from_secs(2));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(()) => {
            println!("stopped; removed {}", dir.display());
            ExitCode::SUCCESS
        }
        Err(_) => ExitCode::from(EXIT_RUNTIME),
    }
}

/// Starts each node's demo app; an app started on port 0 prints the port
/// it bound as its first line.
fn spawn_apps(nodes: &mut [Node], dir: &Path) -> Result<(), DemoError> {
    for n in nodes.iter_mut() {
        let port = n.app.to_string();
        let log = dir.join(format!("{}-app.log", n.name));
        let mut child = spawn(
            &[
                "demo-app",
                "--port",
                &port,
                "--name",
                &n.name.replace("gw", "app"),
            ],
            &log,
            Stdio::piped(),
        )?;
        let stdout = child.stdout.take();
        n.app_child = Some(child);
        if n.app == 0 {
            let mut line = String::new();
            if let Some(out) = stdout {
                let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
            }
            n.app = line
                .trim()
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| {
                    DemoError::Setup(format!(
                        "{} app did not say its port; see {}",
                        n.name,
                        log.display()
                    ))
                })?;
        }
    }
    Ok(())
}

async fn start(
    options: &DemoOptions,
    dir: &PathBuf,
    nodes: &mut Vec<Node>,
) -> Result<(), DemoError> {
    std::fs::create_dir_all(dir).map_err(io(format!("cannot create {}", dir.display())))?;
    let ports = pick_ports(options.base_port)?;
    let (store_kind, store_url) = match (options.store.as_str(), &options.store_url) {
        ("sqlite", None) => (
            "sqlite".to_string(),
            format!("sqlite://{}/leases.db", dir.display()),
        ),
        (kind, Some(url)) => (kind.to_string(), url.clone()),
        (kind, None) => {
            return Err(DemoError::Setup(format!(
                "--store {kind} needs --store-url"
            )))
        }
    };
    nodes.extend(
        ports
            .into_iter()
            .enumerate()
            .map(|(i, (public, admin, app))| Node {
                name: format!("gw-{}", i + 1),
                public,
                admin,
                app,
                gateway: None,
                app_child: None,
            }),
    );
    let probe = Forwarder::new(Duration::from_millis(500), Duration::from_secs(2))?;
    spawn_apps(nodes, dir)?;
    // Start the gateways one by one, so gw-1 holds the role at first.
    for (i, node) in nodes.iter_mut().enumerate() {
        let config = dir.join(format!("{}.yaml", node.name));
        std::fs::write(&config, config_text(node, &store_kind, &store_url))
            .map_err(io(format!("cannot write {}", config.display())))?;
        let config = config.display().to_string();
        let log = dir.join(format!("{}.log", node.name));
        node.gateway = Some(spawn(&["run", "--config", &config], &log, Stdio::null())?);
        let started = Instant::now();
        let wait = Duration::from_millis(500);
        loop {
            if node.admin == 0 {
                // Bound on port 0: the started line says which ports.
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if let Some((public, admin)) = started_ports(&text) {
                    (node.public, node.admin) = (public, admin);
                }
            }
            let ready = format!("http://127.0.0.1:{}/readyz", node.admin);
            if node.admin != 0 && probe.probe(&ready, HopProtocol::Http1, wait).await {
                break;
            }
            // The demo removes its files on the way out: say the log's end.
            if started.elapsed() > Duration::from_secs(15) {
                return Err(DemoError::Setup(format!(
                    "{} did not become ready; its log ends:\n{}",
                    node.name,
                    log_tail(&log)
                )));
            }
            if let Some(Ok(Some(status))) = node.gateway.as_mut().map(|g| g.try_wait()) {
                return Err(DemoError::Setup(format!(
                    "{} exited ({status}); its log ends:\n{}",
                    node.name,
                    log_tail(&log)
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if i == 0 {
            // Let gw-1 take every role before the others start.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    print_guide(nodes, dir, &store_kind);
    Ok(())
}

fn print_guide(nodes: &[Node], dir: &Path, store: &str) {
    let g = |i: usize| &nodes[i];
    let pid = |c: &Option<Child>| c.as_ref().map(|c| c.id().to_string()).unwrap_or_default();
    println!("rolegate demo: {INSTANCES} gateways in front of {INSTANCES} demo apps, {store} store, files in {}", dir.display());
    println!();
    println!("  name   public URL               status page                gateway PID  app PID");
    for n in nodes {
        println!(
            "  {:<6} {:<24} {:<26} {:<12} {}",
            n.name,
            format!("http://127.0.0.1:{}", n.public),
            format!("http://127.0.0.1:{}/", n.admin),
            pid(&n.gateway),
            pid(&n.app_child)
        );
    }
    println!();
    println!("Try (any gateway works; the answer says which app ran it):");
    println!("  curl http://127.0.0.1:{}/maintenance/hello", g(1).public);
    println!(
        "  curl http://127.0.0.1:{}/devices/device-42/status",
        g(2).public
    );
    println!(
        "  curl -N http://127.0.0.1:{}/maintenance/events",
        g(2).public
    );
    println!();
    println!(
        "Partitions spread: the 6 `devices` roles settle 2/2/2 over the gateways within a few"
    );
    println!("seconds (each status page shows its share, the members and each role's preferred");
    println!("holder). Different keys land on different apps:");
    println!(
        "  for d in a b c d e f; do curl -s http://127.0.0.1:{}/devices/$d/status; done",
        g(0).public
    );
    println!();
    println!("Watch failover: gw-1 holds `maintenance`. Kill its gateway:");
    println!("  kill -9 {}", pid(&g(0).gateway));
    println!(
        "then reload http://127.0.0.1:{}/ : another gateway takes the role within about 3 s.",
        g(1).admin
    );
    println!(
        "Graceful handover instead: kill {} (SIGTERM) hands over at once.",
        pid(&g(0).gateway)
    );
    println!();
    println!("Ctrl-C stops everything and removes {}.", dir.display());
}

// ---------------------------------------------------------------------------
// The demo app: answers with who ran the request and under which lease.

/// `rolegate demo-app`: the small app each demo gateway fronts.
pub(super) async fn run_app(port: u16, name: String) -> ExitCode {
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: demo app cannot listen on {port}: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    if let Ok(addr) = listener.local_addr() {
        println!("listening on {addr}");
    }
    let name: std::sync::Arc<str> = name.into();
    let accept = async {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let name = name.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let name = name.clone();
                    async move { Ok::<_, Infallible>(app_answer(&name, req)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    };
    tokio::select! {
        _ = accept => {}
        _ = crate::shutdown::signal() => {}
    }
    ExitCode::SUCCESS
}

fn app_answer(name: &str, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    if path == "/healthz" {
        return Response::new(Body::from("ok\n"));
    }
    let role = req
        .headers()
        .get("x-rolegate-role")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let token = req
        .headers()
        .get("x-rolegate-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if path.ends_with("/events") {
        let name = name.to_string();
        let stream = futures_util::stream::unfold(0u64, move |i| {
            let line = format!(
                "data: {name} event {i} (role {}, token {})\n\n",
                role.as_deref().unwrap_or("-"),
                token.as_deref().unwrap_or("-")
            );
            async move {
                if i > 0 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                (i < 600).then(|| (Ok::<_, Infallible>(Bytes::from(line)), i + 1))
            }
        });
        let mut resp = Response::new(Body::from_stream(stream));
        resp.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("text/event-stream"),
        );
        return resp;
    }
    let body = match (role, token) {
        (Some(role), Some(token)) => {
            format!("{name} handled {path} as holder of {role} (token {token})\n")
        }
        _ => format!("{name} handled {path} (no role)\n"),
    };
    Response::new(Body::from(body))
}
