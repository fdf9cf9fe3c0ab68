//! Real processes and sockets for proxy tests: small test apps that record
//! every request they execute, `rolegate run` processes in front of them, and
//! an HTTP client.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

/// One request a test app executed.
#[derive(Debug, Clone)]
pub struct Executed {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    /// The HTTP version it arrived in.
    pub version: http::Version,
    /// CLOCK_MONOTONIC nanoseconds when the app began executing it.
    pub t_ns: u64,
    /// The port of the connection it came on (the gateway's side).
    pub from_port: u16,
}

/// Request extension: the port the app's connection comes from.
#[derive(Clone, Copy)]
struct FromPort(u16);

struct AppState {
    n: usize,
    log: Mutex<Vec<Executed>>,
    accepts: AtomicUsize,
    /// The ports of the connections open now (the gateway's side).
    open: Mutex<std::collections::HashSet<u16>>,
    /// The SSE handler waits on this before writing event 2.
    sse_next: Notify,
    /// Handlers that wait (`/slow`) are released by this.
    release_slow: Notify,
    /// What `/healthz` answers.
    healthy: std::sync::atomic::AtomicBool,
}

/// A small app recording what it executes.
pub struct TestApp {
    pub port: u16,
    state: Arc<AppState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestApp {
    pub async fn start(n: usize) -> TestApp {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind test app");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(AppState {
            n,
            log: Mutex::new(Vec::new()),
            accepts: AtomicUsize::new(0),
            open: Mutex::default(),
            sse_next: Notify::new(),
            release_slow: Notify::new(),
            healthy: std::sync::atomic::AtomicBool::new(true),
        });
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, from)) = listener.accept().await else {
                    continue;
                };
                st.accepts.fetch_add(1, Ordering::SeqCst);
                st.open.lock().unwrap().insert(from.port());
                let st = st.clone();
                tokio::spawn(async move {
                    let open = st.clone();
                    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                        req.extensions_mut().insert(FromPort(from.port()));
                        let st = st.clone();
                        async move { Ok::<_, Infallible>(app_handle(st, req).await) }
                    });
                    // HTTP/1.1 and h2c with prior knowledge, as `upstream.protocol` picks.
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                        .await;
                    open.open.lock().unwrap().remove(&from.port());
                });
            }
        });
        TestApp { port, state, task }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn executed(&self) -> Vec<Executed> {
        self.state.log.lock().unwrap().clone()
    }

    pub fn executed_paths(&self) -> Vec<String> {
        self.executed().into_iter().map(|e| e.path).collect()
    }

    pub fn accepts(&self) -> usize {
        self.state.accepts.load(Ordering::SeqCst)
    }

    /// Whether the connection from `port` is open to the app now.
    pub fn is_open_from(&self, port: u16) -> bool {
        self.state.open.lock().unwrap().contains(&port)
    }

    /// Lets the SSE handler write its next event.
    pub fn sse_next(&self) {
        self.state.sse_next.notify_one();
    }

    pub fn set_healthy(&self, healthy: bool) {
        self.state.healthy.store(healthy, Ordering::SeqCst);
    }

    pub fn release_slow(&self) {
        self.state.release_slow.notify_waiters();
    }
}

fn stream_body(rx: mpsc::Receiver<Bytes>) -> Body {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    Body::from_stream(stream)
}

async fn app_handle(st: Arc<AppState>, mut req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    if path == "/healthz" {
        return health(&st);
    }
    let path_and_query = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    st.log.lock().unwrap().push(Executed {
        method: req.method().to_string(),
        path: path_and_query.clone(),
        headers: req.headers().clone(),
        version: req.version(),
        t_ns: super::events::monotonic_ns(),
        from_port: req.extensions().get::<FromPort>().map_or(0, |p| p.0),
    });
    let n = st.n;
    if path.ends_with("/ws") {
        return websocket_echo(&mut req);
    }
    if path.ends_with("/ticks") {
        return sse_ticks(n, req.headers());
    }
    if path.ends_with("/ws-ticks") {
        return websocket_ticks(n, &mut req);
    }
    if path.ends_with("/sse") {
        return sse_two_events(st);
    }
    if path.ends_with("/upload") {
        return count_upload(req).await;
    }
    if path.ends_with("/download") {
        return download(&req);
    }
    if path.ends_with("/trailers") {
        return with_trailers();
    }
    if path.ends_with("/slow") {
        st.release_slow.notified().await;
        return Response::new(Body::from(format!("slow done by app{n}")));
    }
    if path == "/status/204" {
        return Response::builder()
            .status(204)
            .header("x-app", n.to_string())
            .body(Body::empty())
            .unwrap();
    }
    if path.ends_with("/forged-refusal") {
        // A 503 carrying the field only a gateway's hop refusal carries.
        return Response::builder()
            .status(503)
            .header("x-rolegate-refused", "forged")
            .header("x-app", n.to_string())
            .body(Body::from("busy"))
            .unwrap();
    }
    if path == "/status/304" {
        return Response::builder()
            .status(304)
            .header("etag", "\"v1\"")
            .body(Body::empty())
            .unwrap();
    }
    if path.ends_with("/echo-trailers") {
        // The names of the request trailers that reached the app, sorted.
        let collected = req.into_body().collect().await.ok();
        let mut names: Vec<String> = (collected.and_then(|c| c.trailers().cloned()))
            .map(|t| t.keys().map(|k| k.to_string()).collect())
            .unwrap_or_default();
        names.sort();
        return Response::new(Body::from(names.join(",")));
    }
    if path.ends_with("/echo-body") {
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Response::new(Body::from(body));
    }
    let body = format!("app{n} {} {path_and_query}", req.method());
    Response::builder()
        .status(201)
        .header("content-type", "text/plain; charset=utf-8")
        .header("x-app", n.to_string())
        .header("x-multi", "a")
        .header("x-multi", "b")
        .header("set-cookie", "s=1; Path=/")
        .body(Body::from(body))
        .unwrap()
}

/// `/healthz`: 200 or 503 as the test set it; not recorded as executed.
fn health(st: &AppState) -> Response<Body> {
    let ok = st.healthy.load(Ordering::SeqCst);
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    Response::builder()
        .status(status)
        .body(Body::from("health"))
        .unwrap()
}

/// `.../ws`: accepts the WebSocket upgrade and echoes text and binary
/// messages until the peer closes.
fn websocket_echo(req: &mut Request<Incoming>) -> Response<Body> {
    let key = req.headers().get("sec-websocket-key").cloned();
    let Some(key) = key else {
        return Response::builder()
            .status(400)
            .body(Body::from("not a websocket"))
            .unwrap();
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let on = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let Ok(upgraded) = on.await else { return };
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await;
        while let Some(Ok(msg)) = ws.next().await {
            if msg.is_text() || msg.is_binary() {
                if ws.send(msg).await.is_err() {
                    break;
                }
            } else if msg.is_close() {
                break;
            }
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("upgrade", "websocket")
        .header("connection", "Upgrade")
        .header("sec-websocket-accept", accept)
        .body(Body::empty())
        .unwrap()
}

/// What one tick of `/ticks` or `/ws-ticks` says: `app{n} {role} {token} {t_ns}`,
/// the role and token the gateway gave the request, and when the app made it
/// (CLOCK_MONOTONIC, comparable with the gateways' event logs).
fn tick_text(n: usize, role: &str, token: &str) -> String {
    format!("app{n} {role} {token} {}", super::events::monotonic_ns())
}

fn role_and_token(headers: &HeaderMap) -> (String, String) {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string()
    };
    (get("x-rolegate-role"), get("x-rolegate-token"))
}

/// `.../ticks`: an SSE stream with an event every 50 ms, for as long as the
/// client reads.
fn sse_ticks(n: usize, headers: &HeaderMap) -> Response<Body> {
    let (role, token) = role_and_token(headers);
    let stream = futures_util::stream::unfold(0u64, move |i| {
        let (role, token) = (role.clone(), token.clone());
        async move {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let event = format!("data: {}\n\n", tick_text(n, &role, &token));
            Some((Ok::<_, std::io::Error>(Bytes::from(event)), i + 1))
        }
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// `.../ws-ticks`: a WebSocket that sends a text message every 50 ms until
/// the connection ends.
fn websocket_ticks(n: usize, req: &mut Request<Incoming>) -> Response<Body> {
    let Some(key) = req.headers().get("sec-websocket-key").cloned() else {
        return Response::builder()
            .status(400)
            .body(Body::from("not a websocket"))
            .unwrap();
    };
    let (role, token) = role_and_token(req.headers());
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let on = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let Ok(upgraded) = on.await else { return };
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await;
        loop {
            let text = tick_text(n, &role, &token);
            if ws
                .send(tokio_tungstenite::tungstenite::Message::text(text))
                .await
                .is_err()
            {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                msg = ws.next() => {
                    if !matches!(msg, Some(Ok(m)) if !m.is_close()) {
                        return;
                    }
                }
            }
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("upgrade", "websocket")
        .header("connection", "Upgrade")
        .header("sec-websocket-accept", accept)
        .body(Body::empty())
        .unwrap()
}

/// `.../sse`: event 1 at once, event 2 when the test calls `sse_next`.
fn sse_two_events(st: Arc<AppState>) -> Response<Body> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let _ = tx.send(Bytes::from_static(b"data: 1\n\n")).await;
        st.sse_next.notified().await;
        let _ = tx.send(Bytes::from_static(b"data: 2\n\n")).await;
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(stream_body(rx))
        .unwrap()
}

/// `.../upload`: reads the whole body and answers how many bytes came.
async fn count_upload(req: Request<Incoming>) -> Response<Body> {
    let mut body = req.into_body();
    let mut total = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Some(d) = f.data_ref() {
                    total += d.len() as u64;
                }
            }
            Err(_) => break,
        }
    }
    Response::new(Body::from(format!("received {total}")))
}

/// `.../download?bytes=N`: N bytes of `x` in 64 KiB chunks, with a length.
fn download(req: &Request<Incoming>) -> Response<Body> {
    let bytes: u64 = req
        .uri()
        .query()
        .and_then(|q| q.strip_prefix("bytes="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(async move {
        let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
        let mut left = bytes;
        while left > 0 {
            let take = left.min(chunk.len() as u64) as usize;
            if tx.send(chunk.slice(..take)).await.is_err() {
                return;
            }
            left -= take as u64;
        }
    });
    Response::builder()
        .header("content-length", bytes.to_string())
        .body(stream_body(rx))
        .unwrap()
}

/// `.../trailers`: two data frames and an `x-checksum` trailer.
fn with_trailers() -> Response<Body> {
    let mut trailers = HeaderMap::new();
    trailers.insert("x-checksum", http::HeaderValue::from_static("abc123"));
    let frames = vec![
        Ok::<_, Infallible>(http_body::Frame::data(Bytes::from_static(b"part-1 "))),
        Ok(http_body::Frame::data(Bytes::from_static(b"part-2"))),
        Ok(http_body::Frame::trailers(trailers)),
    ];
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
    Response::builder()
        .header("trailer", "x-checksum")
        .body(Body::new(body))
        .unwrap()
}

/// A `rolegate run` process.
pub struct GatewayProcess {
    pub child: Child,
    pub port: u16,
    pub admin_port: u16,
    pub dir: PathBuf,
    pub n: usize,
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What every gateway of a test shares.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    pub store_yaml: String,
    pub extra_yaml: String,
    pub lease_yaml: String,
    /// Lines appended under `proxy:` (indented two spaces).
    pub proxy_yaml: String,
    /// Lines appended under `upstream:` (indented two spaces).
    pub upstream_yaml: String,
    /// A path after the app's address in `upstream.url` (`/prefix`).
    pub upstream_path: String,
    /// Whether `start` waits for `/readyz` (else only for `/healthz`).
    pub wait_ready: bool,
    /// Arguments to the shell's `ulimit` before the gateway starts (`-S -n 256`).
    pub ulimit: Option<String>,
    /// Spread the `devices` partition over the gateways. Off by default, so
    /// a test that picks a key by its holder sees that holder stay put.
    pub balance: bool,
    /// `rolegate run --workers N` (default: one per core).
    pub workers: Option<u16>,
    /// `rolegate run --events FILE` (read back with `GatewayProcess::events`).
    pub events: bool,
}

impl ClusterSpec {
    /// Gateways on the shared test PostgreSQL, each test in its own table.
    pub fn postgres(tag: &str) -> Self {
        Self {
            store_yaml: format!(
                "store:\n  kind: postgres\n  url: {}\n  table: {}\n",
                super::postgres_url(),
                super::unique_table(tag)
            ),
            extra_yaml: String::new(),
            lease_yaml: "lease:\n  duration: 3s\n  renew_interval: 500ms\n  safety_margin: 1s\n"
                .into(),
            proxy_yaml: String::new(),
            upstream_yaml: String::new(),
            upstream_path: String::new(),
            wait_ready: true,
            ulimit: None,
            balance: false,
            workers: None,
            events: false,
        }
    }

    /// Gateways on any store kind and URL.
    pub fn store(kind: &str, url: &str, tag: &str) -> Self {
        Self {
            store_yaml: format!(
                "store:\n  kind: {kind}\n  url: {url}\n  table: {}\n",
                super::unique_table(tag)
            ),
            ..Self::postgres_lazy()
        }
    }

    fn postgres_lazy() -> Self {
        Self {
            store_yaml: String::new(),
            extra_yaml: String::new(),
            lease_yaml: "lease:\n  duration: 3s\n  renew_interval: 500ms\n  safety_margin: 1s\n"
                .into(),
            proxy_yaml: String::new(),
            upstream_yaml: String::new(),
            upstream_path: String::new(),
            wait_ready: true,
            ulimit: None,
            balance: false,
            workers: None,
            events: false,
        }
    }

    /// Gateways on a given PostgreSQL URL.
    pub fn postgres_at(url: &str, tag: &str) -> Self {
        Self {
            store_yaml: format!(
                "store:\n  kind: postgres\n  url: {url}\n  table: {}\n",
                super::unique_table(tag)
            ),
            ..Self::postgres(tag)
        }
    }

    pub fn with_proxy(mut self, yaml: &str) -> Self {
        self.proxy_yaml.push_str(yaml);
        self
    }

    pub fn with_workers(mut self, n: u16) -> Self {
        self.workers = Some(n);
        self
    }

    pub fn with_events(mut self) -> Self {
        self.events = true;
        self
    }

    pub fn with_extra(mut self, yaml: &str) -> Self {
        self.extra_yaml.push_str(yaml);
        self
    }
}

pub const ROUTES_YAML: &str = r#"roles:
  - name: maintenance
partitions:
  - name: devices
    count: 8
routes:
  - prefixes: [/maintenance]
    role: maintenance
  - prefixes: [/device-api]
    partition: devices
    key: { header: X-Device-Id }
  - prefixes: [/orders]
    partition: devices
    scope: Order
    key: { path_segment: last }
"#;

/// The public and admin ports named by a gateway log's first
/// `rolegate gateway started` line (how a gateway on port 0 reports them).
pub fn started_ports(log: &str) -> Option<(u16, u16)> {
    let line = log
        .lines()
        .find(|l| l.contains("rolegate gateway started"))?;
    let port = |key: &str| -> Option<u16> {
        let value = line.split_whitespace().find_map(|w| w.strip_prefix(key))?;
        value.rsplit(':').next()?.parse().ok()
    };
    Some((port("listen=")?, port("admin=")?))
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_rolegate")
}

impl GatewayProcess {
    /// Starts `rolegate run` in front of `app` and waits until it is ready.
    /// Both listeners bind port 0; the ports are read back from the log.
    pub async fn start(n: usize, spec: &ClusterSpec, app: &TestApp) -> GatewayProcess {
        Self::start_on(n, spec, app.port, 0, 0).await
    }

    pub async fn start_on(
        n: usize,
        spec: &ClusterSpec,
        app_port: u16,
        port: u16,
        admin_port: u16,
    ) -> GatewayProcess {
        Self::start_on_advertised(n, spec, app_port, port, admin_port, "null").await
    }

    /// Like `start_on`, with `instance.advertise` set.
    pub async fn start_on_advertised(
        n: usize,
        spec: &ClusterSpec,
        app_port: u16,
        port: u16,
        admin_port: u16,
        advertise: &str,
    ) -> GatewayProcess {
        let routes = if spec.balance {
            ROUTES_YAML.to_string()
        } else {
            ROUTES_YAML.replace("    count: 8\n", "    count: 8\n    balance: false\n")
        };
        Self::start_configured(n, spec, app_port, port, admin_port, advertise, &routes).await
    }

    /// Starts `rolegate run` in front of whatever app listens on `app_port`
    /// (not necessarily a [`TestApp`]), with `routes_yaml` (the `roles`,
    /// `partitions` and `routes` sections) in place of [`ROUTES_YAML`].
    pub async fn start_for_upstream(
        n: usize,
        spec: &ClusterSpec,
        app_port: u16,
        routes_yaml: &str,
    ) -> GatewayProcess {
        Self::start_configured(n, spec, app_port, 0, 0, "null", routes_yaml).await
    }

    async fn start_configured(
        n: usize,
        spec: &ClusterSpec,
        app_port: u16,
        port: u16,
        admin_port: u16,
        advertise: &str,
        routes_yaml: &str,
    ) -> GatewayProcess {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let nth = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("rolegate-gw-{}-{nth}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Test defaults for the proxy section, unless the spec sets them.
        let mut proxy_defaults = String::new();
        for (key, value) in [
            ("connect_timeout", "500ms"),
            ("response_header_timeout", "5s"),
        ] {
            if !spec.proxy_yaml.contains(key) {
                proxy_defaults.push_str(&format!("  {key}: {value}\n"));
            }
        }
        let config = format!(
            "instance:\n  name: gw{n}\n  advertise: {advertise}\nlisten: 127.0.0.1:{port}\nadmin_listen: 127.0.0.1:{admin_port}\nupstream:\n  url: http://127.0.0.1:{app_port}{}\n{}{}{}{}{}proxy:\n{proxy_defaults}{}",
            spec.upstream_path,
            spec.upstream_yaml, spec.store_yaml, spec.lease_yaml, routes_yaml, spec.extra_yaml, spec.proxy_yaml
        );
        let path = dir.join("rolegate.yaml");
        std::fs::write(&path, config).unwrap();
        let log = std::fs::File::create(dir.join("gateway.log")).unwrap();
        let mut command = match &spec.ulimit {
            None => {
                let mut c = Command::new(bin());
                c.args(["run", "--config"]).arg(&path);
                if let Some(n) = spec.workers {
                    c.args(["--workers", &n.to_string()]);
                }
                if spec.events {
                    c.arg("--events").arg(dir.join("events.jsonl"));
                }
                c
            }
            Some(limits) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!(
                        "ulimit {limits} && exec \"$0\" run --config \"$1\""
                    ))
                    .arg(bin())
                    .arg(&path);
                c
            }
        };
        let child = command
            .env("RUST_LOG", "rolegate=debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn rolegate");
        let mut gw = GatewayProcess {
            child,
            port,
            admin_port,
            dir,
            n,
        };
        if port == 0 || admin_port == 0 {
            gw.read_bound_ports().await;
        }
        if spec.wait_ready {
            gw.wait_ready().await;
        } else {
            gw.wait_healthy().await;
        }
        gw
    }

    /// Reads the ports a gateway started on port 0 bound from its log.
    async fn read_bound_ports(&mut self) {
        let start = std::time::Instant::now();
        loop {
            let log = self.log();
            if let Some(ports) = started_ports(&log) {
                (self.port, self.admin_port) = ports;
                return;
            }
            if start.elapsed() > Duration::from_secs(15) || !self.child_alive() {
                panic!("gateway {} did not start in 15s; log:\n{log}", self.n);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits for `/healthz` (the process is up), not for the store. Only
    /// the gateway's own answer counts: should another test's app have
    /// taken the admin port between a restart's release of it and the new bind, its
    /// `/healthz` (200, `health`) must not pass for this gateway's.
    pub async fn wait_healthy(&self) {
        let url = format!("{}/healthz", self.admin_url());
        let start = std::time::Instant::now();
        while !matches!(get(&url).await, Ok((StatusCode::OK, _, body)) if body == "ok\n") {
            if start.elapsed() > Duration::from_secs(15) {
                panic!("gateway {} not up in 15s; log:\n{}", self.n, self.log());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The lines of `--events` so far (see `ClusterSpec::with_events`).
    /// Every complete line must read as an event (a format change fails
    /// here, not as missing events); only a last line still being written
    /// (no newline yet) is left out.
    pub fn events(&self) -> Vec<super::events::Event> {
        let text = std::fs::read_to_string(self.dir.join("events.jsonl")).unwrap_or_default();
        text.split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .map(|l| {
                serde_json::from_str(l.trim_end())
                    .unwrap_or_else(|e| panic!("an event line the tests cannot read ({e}): {l}"))
            })
            .collect()
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join("rolegate.yaml")
    }

    pub async fn wait_ready(&self) {
        let url = format!("{}/readyz", self.admin_url());
        let start = std::time::Instant::now();
        loop {
            if let Ok(r) = get(&url).await {
                if r.0 == StatusCode::OK {
                    return;
                }
            }
            // Room for a loaded machine: a debug build readying 65,536
            // roles beside a compiler took over 15 s.
            if start.elapsed() > Duration::from_secs(60) {
                panic!("gateway {} not ready in 60s; log:\n{}", self.n, self.log());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn admin_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.admin_port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("gateway.log")).unwrap_or_default()
    }

    /// True while the process runs (not exited, not a zombie).
    pub fn child_alive(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
            .unwrap_or(false)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `/leases` as JSON.
    pub async fn leases(&self) -> serde_json::Value {
        let (status, _, body) = get(&format!("{}/leases", self.admin_url()))
            .await
            .expect("leases");
        assert_eq!(status, StatusCode::OK);
        serde_json::from_slice(&body).expect("leases json")
    }

    /// role -> (held_here, token)
    pub async fn held(&self) -> HashMap<String, (bool, u64)> {
        let v = self.leases().await;
        v["roles"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["role"].as_str().unwrap().to_string(),
                    (
                        r["held_here"].as_bool().unwrap(),
                        r["token"].as_u64().unwrap(),
                    ),
                )
            })
            .collect()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// Resident memory in KiB from /proc.
    pub fn rss_kib(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }
}

pub fn client() -> Client<HttpConnector, Body> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// A fresh single-use client, so connection reuse is the gateway's alone.
pub async fn send(
    req: Request<Body>,
) -> Result<Response<Incoming>, hyper_util::client::legacy::Error> {
    client().request(req).await
}

/// GET and collect: (status, headers, body).
pub async fn get(url: &str) -> Result<(StatusCode, HeaderMap, Bytes), String> {
    request(Request::get(url).body(Body::empty()).unwrap()).await
}

pub async fn request(req: Request<Body>) -> Result<(StatusCode, HeaderMap, Bytes), String> {
    let resp = send(req).await.map_err(|e| e.to_string())?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((parts.status, parts.headers, body))
}

/// Which gateway holds `role`, by their `/leases`.
pub async fn holder_of(gws: &[GatewayProcess], role: &str) -> Option<usize> {
    for (i, g) in gws.iter().enumerate() {
        if g.held().await.get(role).is_some_and(|h| h.0) {
            return Some(i);
        }
    }
    None
}

/// Waits until every gateway agrees one of them holds `role`; returns its index.
pub async fn wait_holder(gws: &[GatewayProcess], role: &str) -> usize {
    let start = std::time::Instant::now();
    loop {
        if let Some(i) = holder_of(gws, role).await {
            // Everyone else must know the holder too, so forwarding works.
            let address = gws[i].leases().await["instance"]["address"]
                .as_str()
                .unwrap()
                .to_string();
            let mut all_know = true;
            for g in gws {
                let v = g.leases().await;
                let known = v["roles"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|r| r["role"] == role && r["holder_address"] == address.as_str());
                all_know &= known;
            }
            if all_know {
                return i;
            }
        }
        if start.elapsed() > Duration::from_secs(10) {
            panic!("no agreed holder of {role} within 10s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes `request` as is and reads until the peer closes (or 5 s pass).
pub async fn raw_exchange(port: u16, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let _ = s.write_all(request).await;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    String::from_utf8_lossy(&buf).into_owned()
}

/// The status code of a raw response (0 when there is none).
pub fn status_of(resp: &str) -> u16 {
    resp.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Three apps and three gateways; gateway 0 starts first and so holds every role.
pub struct Cluster {
    pub apps: Vec<TestApp>,
    pub gws: Vec<GatewayProcess>,
}

impl Cluster {
    pub async fn start(spec: ClusterSpec) -> Cluster {
        let mut apps = Vec::new();
        for n in 0..3 {
            apps.push(TestApp::start(n).await);
        }
        let mut gws = vec![GatewayProcess::start(0, &spec, &apps[0]).await];
        super::wait_for_async(
            "gateway 0 holds maintenance",
            std::time::Duration::from_secs(10),
            || async { gws[0].held().await.get("maintenance").is_some_and(|h| h.0) },
        )
        .await;
        for (n, app) in apps.iter().enumerate().skip(1) {
            gws.push(GatewayProcess::start(n, &spec, app).await);
        }
        assert_eq!(wait_holder(&gws, "maintenance").await, 0);
        Cluster { apps, gws }
    }

    /// Per app, how many executed paths contain `part`.
    pub fn total_executed(&self, part: &str) -> Vec<usize> {
        (self.apps.iter())
            .map(|a| {
                a.executed_paths()
                    .iter()
                    .filter(|p| p.contains(part))
                    .count()
            })
            .collect()
    }

    /// Like [`Cluster::total_executed`], ignoring ASCII case.
    pub fn executed_with(&self, part: &str) -> Vec<usize> {
        let part = part.to_ascii_lowercase();
        (self.apps.iter())
            .map(|a| {
                (a.executed_paths().iter())
                    .filter(|p| p.to_ascii_lowercase().contains(&part))
                    .count()
            })
            .collect()
    }
}

/// Five text messages echoed through a WebSocket at `url` (`ws://host:port/path`).
pub async fn websocket_client_echo(url: &str) {
    let uri: http::Uri = url.parse().unwrap();
    let stream = tokio::net::TcpStream::connect((uri.host().unwrap(), uri.port_u16().unwrap()))
        .await
        .unwrap();
    let (mut ws, resp) = tokio_tungstenite::client_async(url, stream)
        .await
        .expect("websocket handshake");
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    for i in 0..5 {
        let text = format!("hello {i}");
        futures_util::SinkExt::send(
            &mut ws,
            tokio_tungstenite::tungstenite::Message::text(text.clone()),
        )
        .await
        .unwrap();
        let got = tokio::time::timeout(
            Duration::from_secs(5),
            futures_util::StreamExt::next(&mut ws),
        )
        .await
        .unwrap()
        .unwrap()
        .unwrap();
        assert_eq!(got.into_text().unwrap().as_str(), text);
    }
    ws.close(None).await.unwrap();
}
