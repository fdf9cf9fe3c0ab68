//! `rolegate demo`: a local cluster of three gateways in front of three demo
//! apps on the embedded SQLite store, as child processes (so one can really
//! be killed). It prints what to curl only once every printed request
//! answers, names the gateway that really holds `maintenance` (read from the
//! gateways' `/leases`), reports each child that exits with its log's end,
//! and restarts an app that dies unless it keeps dying. Ctrl-C stops
//! everything and removes what it created.
//!
//! Every child writes its output to its own log file in the demo's folder,
//! never to a pipe the demo could stop reading: a child must not die of its
//! own output.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::EXIT_RUNTIME;

const INSTANCES: usize = 3;
/// The plain role the guide's failover walk-through is about.
const ROLE: &str = "maintenance";
/// The partition and its number of roles.
const PARTITION: &str = "devices";
const PARTITION_COUNT: u32 = 6;
/// The keys of the guide's `for` loop.
const LOOP_KEYS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
/// How long the demo waits for its cluster to answer before it gives up.
const SERVE_LIMIT: Duration = Duration::from_secs(60);
/// After this long the demo says what it is still waiting for.
const PATIENCE: Duration = Duration::from_secs(5);
/// An app that exits this many times within `EXIT_WINDOW` stops the demo.
const APP_EXITS: usize = 3;
const EXIT_WINDOW: Duration = Duration::from_secs(60);
/// Lines of a log shown when its process exits.
const TAIL_LINES: usize = 8;

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
    /// The gateway's instance id, as its `/leases` says.
    id: Option<String>,
    gateway: Option<Child>,
    app_child: Option<Child>,
    /// When the app exited, within the last `EXIT_WINDOW`.
    app_exits: Vec<Instant>,
}

impl Node {
    fn gateway_log(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}.log", self.name))
    }

    fn app_log(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}-app.log", self.name))
    }

    fn app_name(&self) -> String {
        self.name.replace("gw", "app")
    }
}

fn pid(c: &Option<Child>) -> String {
    c.as_ref().map(|c| c.id().to_string()).unwrap_or_default()
}

fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Why the demo could not start, or stopped.
#[derive(Debug, thiserror::Error)]
enum DemoError {
    /// A file or process operation failed.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Ports, options, or a process that did not come up or kept exiting.
    #[error("{0}")]
    Setup(String),
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

/// The last lines of a log file, indented.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(TAIL_LINES)..];
    if tail.is_empty() {
        return format!("    ({} is empty)", log.display());
    }
    tail.iter()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
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

/// The port a demo app's log says it bound (its `listening on` line).
fn app_port(log: &str) -> Option<u16> {
    let line = log.lines().find_map(|l| l.strip_prefix("listening on "))?;
    line.trim().rsplit(':').next()?.parse().ok()
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
  - name: {ROLE}
partitions:
  - name: {PARTITION}
    count: {PARTITION_COUNT}
routes:
  - prefixes: [/{ROLE}]
    role: {ROLE}
  - prefixes: [/{PARTITION}]
    partition: {PARTITION}
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

/// Starts this binary with `args`; its stdout and stderr are appended to
/// `log` (an app restarted keeps its earlier lines).
fn spawn(args: &[&str], log: &Path) -> Result<Child, DemoError> {
    let exe = std::env::current_exe().map_err(io("cannot find this binary".into()))?;
    let cannot = || format!("cannot open {}", log.display());
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(io(cannot()))?;
    let err = out.try_clone().map_err(io(cannot()))?;
    Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
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

/// The exit status of a child that has exited; the child is reaped.
fn exited(child: &mut Option<Child>) -> Option<std::process::ExitStatus> {
    let status = child.as_mut()?.try_wait().ok()??;
    Some(status)
}

// ---------------------------------------------------------------------------
// Asking the cluster.

/// A GET of `http://127.0.0.1:{port}{path}` within `limit`: the status and
/// the body (of a stream, only its first chunk).
async fn get(port: u16, path: &str, limit: Duration) -> Result<(u16, String), String> {
    let ask = async {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        let conn = tokio::spawn(conn);
        let req = Request::get(path)
            .header(http::header::HOST, format!("127.0.0.1:{port}"))
            .body(http_body_util::Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut text = Vec::new();
        // A whole answer, or the first chunk of a stream (SSE).
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.map_err(|e| e.to_string())?.into_data() {
                text.extend_from_slice(&data);
                if text.len() > 1 << 20 || path.ends_with("/events") {
                    break;
                }
            }
        }
        conn.abort();
        Ok((status, String::from_utf8_lossy(&text).into_owned()))
    };
    tokio::time::timeout(limit, ask)
        .await
        .map_err(|_| format!("no answer within {limit:?}"))?
}

/// What one gateway's `/leases` says: its own id and each role's holder.
struct LeaseView {
    id: String,
    holders: HashMap<String, String>,
}

async fn lease_view(admin: u16) -> Result<LeaseView, String> {
    let (status, body) = get(admin, "/leases", Duration::from_secs(2)).await?;
    if status != 200 {
        return Err(format!("/leases answered {status}"));
    }
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    let id = v["instance"]["id"]
        .as_str()
        .ok_or("/leases names no instance id")?
        .to_string();
    let holders = v["roles"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| Some((r["role"].as_str()?.into(), r["holder"].as_str()?.into())))
        .collect();
    Ok(LeaseView { id, holders })
}

/// One request the guide prints: through which gateway, which path, and
/// whether it is the event stream.
struct Printed {
    port: u16,
    path: String,
}

fn printed_requests(nodes: &[Node]) -> Vec<Printed> {
    let at = |i: usize, path: String| Printed {
        port: nodes[i].public,
        path,
    };
    let mut out = vec![
        at(1, format!("/{ROLE}/hello")),
        at(2, format!("/{PARTITION}/device-42/status")),
        at(2, format!("/{ROLE}/events")),
    ];
    out.extend(
        LOOP_KEYS
            .iter()
            .map(|k| at(0, format!("/{PARTITION}/{k}/status"))),
    );
    out
}

/// What keeps the cluster from answering every request the guide prints
/// (empty: nothing). Learns each gateway's instance id on the way.
async fn not_yet_serving(nodes: &mut [Node]) -> Vec<String> {
    let mut missing = Vec::new();
    let mut holders = HashMap::new();
    for n in nodes.iter_mut() {
        match lease_view(n.admin).await {
            Ok(view) => {
                n.id = Some(view.id);
                if holders.is_empty() {
                    holders = view.holders;
                }
            }
            Err(e) => missing.push(format!("{}'s /leases: {e}", n.name)),
        }
        if let Err(e) = get(n.app, "/healthz", Duration::from_secs(2)).await {
            missing.push(format!("{} app: {e}", n.name));
        }
    }
    let roles = std::iter::once(ROLE.to_string())
        .chain((0..PARTITION_COUNT).map(|i| crate::role::partition_role_name(PARTITION, i)));
    for role in roles {
        if !holders.contains_key(&role) {
            missing.push(format!("{role} has no holder yet"));
        }
    }
    if !missing.is_empty() {
        return missing;
    }
    for r in printed_requests(nodes) {
        match get(r.port, &r.path, Duration::from_secs(5)).await {
            Ok((200, _)) => {}
            Ok((status, body)) => missing.push(format!(
                "{} on port {} answers {status} {}",
                r.path,
                r.port,
                body.trim()
            )),
            Err(e) => missing.push(format!("{} on port {}: {e}", r.path, r.port)),
        }
    }
    missing
}

/// The node whose gateway holds `role`, as the first gateway that answers
/// says.
async fn holder_of(nodes: &[Node], role: &str) -> Option<usize> {
    for n in nodes.iter().filter(|n| n.gateway.is_some()) {
        if let Ok(view) = lease_view(n.admin).await {
            let holder = view.holders.get(role)?;
            return nodes.iter().position(|n| n.id.as_ref() == Some(holder));
        }
    }
    None
}

// ---------------------------------------------------------------------------
// Starting and watching.

/// Runs the demo until Ctrl-C or SIGTERM (exit 0), or until it cannot go on
/// (exit 1).
pub(super) async fn run(options: DemoOptions) -> ExitCode {
    let dir = std::env::temp_dir().join(format!("rolegate-demo-{}", std::process::id()));
    let mut nodes = Vec::new();
    let mut result = start(&options, &dir, &mut nodes).await;
    if result.is_ok() {
        result = watch_until_stopped(&mut nodes, &dir).await;
    }
    match &result {
        Ok(()) => say!("\nstopping the demo ..."),
        Err(e) => tell!("error: {}\nstopping the demo ...", super::report(e)),
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
            say!("stopped; removed {}", dir.display());
            ExitCode::SUCCESS
        }
        Err(_) => ExitCode::from(EXIT_RUNTIME),
    }
}

/// Starts a node's demo app. One started on port 0 writes the port it bound
/// to its log, where this reads it.
async fn spawn_app(n: &mut Node, dir: &Path) -> Result<(), DemoError> {
    let port = n.app.to_string();
    let log = n.app_log(dir);
    let name = n.app_name();
    n.app_child = Some(spawn(
        &["demo-app", "--port", &port, "--name", &name],
        &log,
    )?);
    // Started means answering: a restarted app (its port known) is only
    // back once it serves, else its gateway answers 502 meanwhile.
    let started = Instant::now();
    loop {
        if n.app == 0 {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(port) = app_port(&text) {
                n.app = port;
            }
        }
        if n.app != 0
            && get(n.app, "/healthz", Duration::from_millis(500))
                .await
                .is_ok()
        {
            return Ok(());
        }
        if let Some(status) = exited(&mut n.app_child) {
            return Err(DemoError::Setup(format!(
                "{name} exited ({status}); its log ends:\n{}",
                log_tail(&log)
            )));
        }
        if started.elapsed() > Duration::from_secs(15) {
            let what = if n.app == 0 { "say its port" } else { "answer" };
            return Err(DemoError::Setup(format!(
                "{name} did not {what} within 15 s; its log ends:\n{}",
                log_tail(&log)
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts a node's gateway and waits until its `/readyz` answers.
async fn spawn_gateway(
    node: &mut Node,
    dir: &Path,
    store_kind: &str,
    store_url: &str,
) -> Result<(), DemoError> {
    let config = dir.join(format!("{}.yaml", node.name));
    std::fs::write(&config, config_text(node, store_kind, store_url))
        .map_err(io(format!("cannot write {}", config.display())))?;
    let config = config.display().to_string();
    let log = node.gateway_log(dir);
    node.gateway = Some(spawn(&["run", "--config", &config], &log)?);
    let started = Instant::now();
    loop {
        if node.admin == 0 {
            // Bound on port 0: the started line says which ports.
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some((public, admin)) = started_ports(&text) {
                (node.public, node.admin) = (public, admin);
            }
        }
        if node.admin != 0 {
            if let Ok((200, _)) = get(node.admin, "/readyz", Duration::from_millis(500)).await {
                return Ok(());
            }
        }
        // The demo removes its files on the way out: say the log's end.
        if let Some(status) = exited(&mut node.gateway) {
            return Err(DemoError::Setup(format!(
                "{} exited ({status}); its log ends:\n{}",
                node.name,
                log_tail(&log)
            )));
        }
        if started.elapsed() > Duration::from_secs(15) {
            return Err(DemoError::Setup(format!(
                "{} did not become ready within 15 s; its log ends:\n{}",
                node.name,
                log_tail(&log)
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
                id: None,
                gateway: None,
                app_child: None,
                app_exits: Vec::new(),
            }),
    );
    say!(
        "rolegate demo: starting {INSTANCES} gateways and {INSTANCES} demo apps on the {store_kind} store, files in {}",
        dir.display()
    );
    for n in nodes.iter_mut() {
        spawn_app(n, dir).await?;
    }
    for n in nodes.iter_mut() {
        spawn_gateway(n, dir, &store_kind, &store_url).await?;
    }
    wait_until_serving(nodes, dir).await?;
    let holder = holder_of(nodes, ROLE)
        .await
        .ok_or_else(|| DemoError::Setup(format!("no gateway names the holder of {ROLE}")))?;
    print_guide(nodes, holder, dir);
    Ok(())
}

/// Waits until every role the guide mentions has a holder and every request
/// it prints answers 200; says what is missing once it takes longer than
/// `PATIENCE`, and gives up after `SERVE_LIMIT`.
async fn wait_until_serving(nodes: &mut [Node], dir: &Path) -> Result<(), DemoError> {
    let started = Instant::now();
    let mut next_note = PATIENCE;
    loop {
        let missing = not_yet_serving(nodes).await;
        if missing.is_empty() {
            return Ok(());
        }
        for n in nodes.iter_mut() {
            let (log, name) = (n.gateway_log(dir), n.name.clone());
            if let Some(status) = exited(&mut n.gateway) {
                return Err(DemoError::Setup(format!(
                    "{name} exited ({status}) while starting; its log ends:\n{}",
                    log_tail(&log)
                )));
            }
            let (log, name) = (n.app_log(dir), n.app_name());
            if let Some(status) = exited(&mut n.app_child) {
                return Err(DemoError::Setup(format!(
                    "{name} exited ({status}) while starting; its log ends:\n{}",
                    log_tail(&log)
                )));
            }
        }
        let waited = started.elapsed();
        if waited >= SERVE_LIMIT {
            return Err(DemoError::Setup(format!(
                "the cluster did not answer within {} s (is the store slow, or a port in use?): {}; \
                 gw-1's log ends:\n{}",
                SERVE_LIMIT.as_secs(),
                missing.join("; "),
                log_tail(&nodes[0].gateway_log(dir))
            )));
        }
        if waited >= next_note {
            say!(
                "still waiting after {} s: {}",
                waited.as_secs(),
                missing.join("; ")
            );
            next_note += Duration::from_secs(10);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Watches the cluster until Ctrl-C or SIGTERM: reports once each process
/// that exits, with its log's end; restarts an app that exits, and stops
/// the demo if one keeps exiting; says when `maintenance` changes holder.
async fn watch_until_stopped(nodes: &mut [Node], dir: &Path) -> Result<(), DemoError> {
    let stop = crate::shutdown::signal();
    tokio::pin!(stop);
    let mut every = tokio::time::interval(Duration::from_millis(500));
    let mut holder = holder_of(nodes, ROLE).await;
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = every.tick() => {}
        }
        for n in nodes.iter_mut() {
            if let Some(status) = exited(&mut n.gateway) {
                let pid = n.gateway.take().map(|c| c.id()).unwrap_or_default();
                say!(
                    "\n{} (pid {pid}) exited: {status}. Its roles move to the other gateways within \
                     about 3 s (the lease duration); meanwhile requests for them are held or answered \
                     503, and its own URLs refuse connections. Its log ends:\n{}",
                    n.name,
                    log_tail(&n.gateway_log(dir))
                );
            }
            if let Some(status) = exited(&mut n.app_child) {
                app_exited(n, dir, status).await?;
            }
        }
        // A gateway that exited is never announced as the new holder: until
        // its lease runs out the others may still name it, some of them
        // longer than others.
        let now = holder_of(nodes, ROLE)
            .await
            .filter(|&i| nodes[i].gateway.is_some());
        if now != holder {
            match now {
                Some(i) => say!(
                    "{ROLE} is now held by {} (gateway pid {})",
                    nodes[i].name,
                    pid(&nodes[i].gateway)
                ),
                None => say!("{ROLE} has no holder right now"),
            }
            holder = now;
        }
    }
}

/// Reports an app that exited and restarts it, or stops the demo when it
/// keeps exiting.
async fn app_exited(
    n: &mut Node,
    dir: &Path,
    status: std::process::ExitStatus,
) -> Result<(), DemoError> {
    let gone = n.app_child.take().map(|c| c.id()).unwrap_or_default();
    let log = n.app_log(dir);
    let now = Instant::now();
    n.app_exits.retain(|t| now.duration_since(*t) < EXIT_WINDOW);
    n.app_exits.push(now);
    if n.app_exits.len() >= APP_EXITS {
        return Err(DemoError::Setup(format!(
            "{} (pid {gone}) exited {} times within {} s ({status}); its log ends:\n{}",
            n.app_name(),
            n.app_exits.len(),
            EXIT_WINDOW.as_secs(),
            log_tail(&log)
        )));
    }
    say!(
        "\n{} (pid {gone}) exited: {status}. Its log ends:\n{}\nUntil it is back, what {} runs \
         itself answers 502 (after 3 failed health checks, 3 s, it also hands its roles over). \
         Restarting it on port {}.",
        n.app_name(),
        log_tail(&log),
        n.name,
        n.app
    );
    spawn_app(n, dir).await?;
    say!("{} is back (pid {})", n.app_name(), pid(&n.app_child));
    Ok(())
}

fn print_guide(nodes: &[Node], holder: usize, dir: &Path) {
    let g = |i: usize| &nodes[i];
    say!();
    say!("  name   public URL               status page                gateway PID  app PID");
    for n in nodes {
        say!(
            "  {:<6} {:<24} {:<26} {:<12} {}",
            n.name,
            format!("http://127.0.0.1:{}", n.public),
            format!("http://127.0.0.1:{}/", n.admin),
            pid(&n.gateway),
            pid(&n.app_child)
        );
    }
    let requests = printed_requests(nodes);
    let curl = |r: &Printed| format!("http://127.0.0.1:{}{}", r.port, r.path);
    say!();
    say!("Every gateway answers; try (the answer says which app ran it):");
    say!("  curl {}", curl(&requests[0]));
    say!("  curl {}", curl(&requests[1]));
    say!("  curl -N {}", curl(&requests[2]));
    say!();
    say!(
        "Partitions spread: the {PARTITION_COUNT} `{PARTITION}` roles settle 2/2/2 over the gateways within a few"
    );
    say!("seconds (each status page shows its share, the members and each role's preferred");
    say!("holder). Different keys land on different apps:");
    say!(
        "  for d in {}; do curl -s http://127.0.0.1:{}/{PARTITION}/$d/status; done",
        LOOP_KEYS.join(" "),
        g(0).public
    );
    let other = (holder + 1) % nodes.len();
    say!();
    say!(
        "Watch failover: {} holds `{ROLE}` (its /leases says so). Kill its gateway:",
        g(holder).name
    );
    say!("  kill -9 {}", pid(&g(holder).gateway));
    say!(
        "then reload http://127.0.0.1:{}/ : another gateway takes the role within about 3 s,",
        g(other).admin
    );
    say!("and this demo says which.");
    say!(
        "Graceful handover instead: kill {} (SIGTERM) hands over at once.",
        pid(&g(holder).gateway)
    );
    say!();
    say!("Ctrl-C stops everything and removes {}.", dir.display());
}

// ---------------------------------------------------------------------------
// The demo app: answers with who ran the request and under which lease.

/// `rolegate demo-app`: the small app each demo gateway fronts.
pub(super) async fn run_app(port: u16, name: String) -> ExitCode {
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
        Ok(l) => l,
        Err(e) => {
            tell!("error: demo app cannot listen on {port}: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    if let Ok(addr) = listener.local_addr() {
        say!("listening on {addr}");
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
