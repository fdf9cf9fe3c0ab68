//! Hostile clients against a NON-holder gateway in front of apps built with
//! real decoding routers: an axum `Router` in this process and a Flask app
//! (`tests/support/flask_app.py`) under Werkzeug's dev server or the standard
//! library's `wsgiref`. Two `rolegate run` processes on PostgreSQL, each in
//! front of its own app instance, so each app's own records say where a
//! request executed.
//!
//! The guarantee pinned for every attack: it ends executed on the HOLDER's app
//! (carrying the holder gateway's `X-Rolegate-Role`/`-Token`) or is refused
//! with a 4xx by the gateway; never executed by the non-holder's app on a
//! gated handler, and an app never sees a role or token the gateway did not
//! set, in any spelling.
//!
//! Flask needs a Python that can `import flask`: `scripts/test` makes a venv
//! and sets `ROLEGATE_TEST_PYTHON`; else `python3` is used if it has Flask.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use http::{HeaderMap, StatusCode, Uri};
use support::cluster::{self, raw_exchange, status_of, ClusterSpec, GatewayProcess};

/// `/maintenance` is a role route; `/orders` (2nd path segment), `/device-api`
/// (query `id`) and `/device-hdr` (header `X-Device-Id`) are partition routes.
const ROUTES: &str = r#"roles:
  - name: maintenance
partitions:
  - name: devices
    count: 8
routes:
  - prefixes: [/maintenance, /tasks]
    role: maintenance
  - prefixes: [/orders]
    partition: devices
    key: { path_segment: 2 }
  - prefixes: [/device-api]
    partition: devices
    key: { query: id }
  - prefixes: [/device-hdr]
    partition: devices
    key: { header: X-Device-Id }
"#;

/// Handlers behind a gated prefix, in both apps.
const GATED_HANDLERS: &[&str] = &[
    "maintenance",
    "maintenance_root",
    "orders",
    "device_api",
    "tasks",
];

// ---------------------------------------------------------------------------
// What an app saw
// ---------------------------------------------------------------------------

/// One request an app executed, as its own framework presented it.
#[derive(Debug, Clone, Default, serde::Deserialize)]
struct Seen {
    app: String,
    route: String,
    #[serde(default)]
    params: BTreeMap<String, String>,
    #[serde(default)]
    uri: String,
    attack: Option<String>,
    /// `X-Rolegate-Role` through the framework's header API.
    role: Option<String>,
    token: Option<String>,
    /// WSGI only: `environ["HTTP_X_ROLEGATE_ROLE"]` / `..._TOKEN`.
    #[serde(default)]
    environ_role: Option<String>,
    #[serde(default)]
    environ_token: Option<String>,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default)]
    environ_http: BTreeMap<String, String>,
}

impl Seen {
    fn gated(&self) -> bool {
        GATED_HANDLERS.contains(&self.route.as_str())
    }

    /// Header names, lowercased with `_` read as `-`.
    fn header_names(&self) -> Vec<String> {
        self.headers
            .iter()
            .map(|(k, _)| k.to_ascii_lowercase().replace('_', "-"))
            .collect()
    }

    /// Every header and environ value the app could read.
    fn all_values(&self) -> impl Iterator<Item = &str> {
        self.headers
            .iter()
            .map(|(_, v)| v.as_str())
            .chain(self.environ_http.values().map(String::as_str))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Axum,
    /// Flask under `werkzeug` or `wsgiref` (see flask_app.py).
    Flask(&'static str),
    /// The standard library's `http.server` with a router that folds
    /// Unicode case, a client-chosen status and unread bodies (raw_app.py).
    Raw,
}

enum Inner {
    Axum {
        log: Arc<Mutex<Vec<Seen>>>,
        task: tokio::task::JoinHandle<()>,
    },
    Flask {
        child: Child,
        dir: PathBuf,
    },
}

/// One app instance; `name` is what it answers in `X-App`.
struct App {
    name: String,
    port: u16,
    inner: Inner,
}

impl Drop for App {
    fn drop(&mut self) {
        match &mut self.inner {
            Inner::Axum { task, .. } => task.abort(),
            Inner::Flask { child, dir } => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

impl App {
    async fn start(kind: Kind, name: &str) -> App {
        match kind {
            Kind::Axum => start_axum(name).await,
            Kind::Flask(server) => start_flask(name, server).await,
            Kind::Raw => start_raw(name).await,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        match &self.inner {
            Inner::Axum { log, .. } => log.lock().unwrap().clone(),
            Inner::Flask { dir, .. } => std::fs::read_to_string(dir.join("seen.jsonl"))
                .unwrap_or_default()
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| {
                    serde_json::from_str(l).unwrap_or_else(|e| panic!("bad log line {l}: {e}"))
                })
                .collect(),
        }
    }

    fn tagged(&self, id: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.attack.as_deref() == Some(id))
            .collect()
    }
}

// --- axum -------------------------------------------------------------------

#[derive(Clone)]
struct AxState {
    name: String,
    log: Arc<Mutex<Vec<Seen>>>,
}

impl AxState {
    fn record(
        &self,
        route: &str,
        params: &[(&str, String)],
        uri: &Uri,
        headers: &HeaderMap,
    ) -> Response {
        let joined = |name: &str| {
            let v: Vec<&str> = headers
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap_or("<bytes>"))
                .collect();
            (!v.is_empty()).then(|| v.join(","))
        };
        self.log.lock().unwrap().push(Seen {
            app: self.name.clone(),
            route: route.into(),
            params: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            uri: uri.to_string(),
            attack: joined("x-attack"),
            role: joined("x-rolegate-role"),
            token: joined("x-rolegate-token"),
            headers: headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            ..Seen::default()
        });
        (
            [("x-app", self.name.clone())],
            format!("{} {route}\n", self.name),
        )
            .into_response()
    }
}

async fn ax_maintenance(
    State(st): State<AxState>,
    Path(rest): Path<String>,
    uri: Uri,
    h: HeaderMap,
) -> Response {
    st.record("maintenance", &[("rest", rest)], &uri, &h)
}

async fn ax_orders(
    State(st): State<AxState>,
    Path(id): Path<String>,
    uri: Uri,
    h: HeaderMap,
) -> Response {
    st.record("orders", &[("oid", id)], &uri, &h)
}

async fn ax_fallback(State(st): State<AxState>, uri: Uri, h: HeaderMap) -> Response {
    st.record("fallback", &[], &uri, &h)
}

async fn start_axum(name: &str) -> App {
    let log = Arc::new(Mutex::new(Vec::new()));
    let state = AxState {
        name: name.into(),
        log: log.clone(),
    };
    let router = Router::new()
        .route(
            "/maintenance",
            any(
                |State(st): State<AxState>, uri: Uri, h: HeaderMap| async move {
                    st.record("maintenance_root", &[], &uri, &h)
                },
            ),
        )
        .route("/maintenance/{*rest}", any(ax_maintenance))
        .route("/orders/{id}", any(ax_orders))
        .fallback(ax_fallback)
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    App {
        name: name.into(),
        port,
        inner: Inner::Axum { log, task },
    }
}

// --- Flask ------------------------------------------------------------------

/// A Python that can `import flask`, or a failure that says how to get one.
fn flask_python() -> String {
    let has_flask = |py: &str| {
        Command::new(py)
            .args(["-c", "import flask, gunicorn"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if let Ok(py) = std::env::var("ROLEGATE_TEST_PYTHON") {
        if !py.is_empty() {
            assert!(
                has_flask(&py),
                "ROLEGATE_TEST_PYTHON={py} cannot `import flask, gunicorn`: run `scripts/test` (it installs both into a venv)"
            );
            return py;
        }
    }
    if has_flask("python3") {
        return "python3".into();
    }
    panic!(
        "these tests need Python with Flask and gunicorn: run `scripts/test` (it installs both into a \
         venv and sets ROLEGATE_TEST_PYTHON), or set ROLEGATE_TEST_PYTHON to a python that can \
         `import flask, gunicorn`"
    )
}

async fn start_flask(name: &str, server: &str) -> App {
    let python = flask_python();
    let dir = support::test_dir(&format!("flask-{name}"));
    let port_file = dir.join("port");
    let _ = std::fs::remove_file(&port_file); // a leftover from a reused pid
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/flask_app.py");
    let child = Command::new(python)
        .arg(script)
        .arg(&port_file)
        .arg(dir.join("seen.jsonl"))
        .arg(name)
        .arg(server)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
        .spawn()
        .expect("spawn the Flask app");
    let mut inner = Inner::Flask {
        child,
        dir: dir.clone(),
    };
    let start = Instant::now();
    loop {
        // The app binds port 0 and writes the port it got once it listens.
        let port: Option<u16> = std::fs::read_to_string(&port_file)
            .ok()
            .and_then(|p| p.trim().parse().ok());
        if let Some(port) = port {
            if let Ok((StatusCode::OK, _, _)) =
                cluster::get(&format!("http://127.0.0.1:{port}/healthz")).await
            {
                return App {
                    name: name.into(),
                    port,
                    inner,
                };
            }
        }
        let Inner::Flask { child, .. } = &mut inner else {
            unreachable!()
        };
        let exited = child.try_wait().ok().flatten();
        if exited.is_some() || start.elapsed() > Duration::from_secs(20) {
            let err = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
            panic!("Flask app ({server}) did not come up ({exited:?}); stderr:\n{err}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `tests/support/raw_app.py`: binds port 0 and reports the port in a file.
async fn start_raw(name: &str) -> App {
    let python = std::env::var("ROLEGATE_TEST_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".into());
    let dir = support::test_dir(&format!("raw-app-{name}"));
    let port_file = dir.join("port");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/raw_app.py");
    let child = Command::new(&python)
        .arg(script)
        .arg(&port_file)
        .arg(dir.join("seen.jsonl"))
        .arg(name)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {python} (python3 is needed): {e}"));
    let mut inner = Inner::Flask {
        child,
        dir: dir.clone(),
    };
    let start = Instant::now();
    loop {
        if let Some(port) = std::fs::read_to_string(&port_file)
            .ok()
            .and_then(|p| p.trim().parse().ok())
        {
            return App {
                name: name.into(),
                port,
                inner,
            };
        }
        let Inner::Flask { child, .. } = &mut inner else {
            unreachable!()
        };
        let exited = child.try_wait().ok().flatten();
        if exited.is_some() || start.elapsed() > Duration::from_secs(20) {
            let err = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
            panic!("raw_app.py did not come up ({exited:?}); stderr:\n{err}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------
// Two gateways, two apps
// ---------------------------------------------------------------------------

struct Rig {
    apps: Vec<App>,
    gws: Vec<GatewayProcess>,
    /// Index of the gateway (and app) holding `maintenance`.
    holder: usize,
    /// The other one: every attack goes here.
    other: usize,
}

impl Rig {
    /// Two apps of `kind`, two gateways started together (so the partitions
    /// may spread), every lease held and known to both.
    async fn start(kind: Kind, tag: &str) -> Rig {
        Self::start_with(kind, ClusterSpec::postgres(tag)).await
    }

    async fn start_with(kind: Kind, spec: ClusterSpec) -> Rig {
        let apps = vec![
            App::start(kind, "app0").await,
            App::start(kind, "app1").await,
        ];
        let (a, b) = tokio::join!(
            GatewayProcess::start_for_upstream(0, &spec, apps[0].port, ROUTES),
            GatewayProcess::start_for_upstream(1, &spec, apps[1].port, ROUTES)
        );
        let gws = vec![a, b];
        let holder = cluster::wait_holder(&gws, "maintenance").await;
        for i in 0..8 {
            cluster::wait_holder(&gws, &format!("devices:partition-{i}")).await;
        }
        Rig {
            apps,
            gws,
            holder,
            other: 1 - holder,
        }
    }

    /// (holder index, token) of `role`.
    async fn lease(&self, role: &str) -> (usize, u64) {
        let i = cluster::holder_of(&self.gws, role)
            .await
            .unwrap_or_else(|| panic!("no holder of {role}"));
        (i, self.gws[i].held().await[role].1)
    }

    fn gateway_logs(&self) -> String {
        self.gws
            .iter()
            .map(|g| format!("--- gw{} log (tail) ---\n{}", g.n, tail(&g.log(), 40)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ---------------------------------------------------------------------------
// Raw HTTP
// ---------------------------------------------------------------------------

/// A header of the first response head.
fn header_of(resp: &str, name: &str) -> Option<String> {
    let head = resp.split("\r\n\r\n").next().unwrap_or_default();
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// `head` (request line and header lines, each ending in CRLF) with
/// `X-Attack: id` and `Connection: close` added and the head closed.
fn tagged_request(head: &str, id: &str) -> Vec<u8> {
    let (line, rest) = head.split_once("\r\n").expect("a request line");
    format!("{line}\r\nX-Attack: {id}\r\nConnection: close\r\n{rest}\r\n").into_bytes()
}

/// What must become of one attack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Forwarded: executed once, by the holder's app, with the holder's role and token.
    AtHolder,
    /// Answered by the gateway itself with this status; no app executes it.
    Gateway(u16),
    /// Either of the above (the HTTP parser may refuse first).
    GatewayOrAtHolder(u16),
    /// Answered by the gateway with some 4xx (its parser or its own checks).
    Refused,
    /// Not gated in any reading: executed by the non-holder's own app, ungated, without a role.
    LocalUngated,
}

/// What the non-holder's gateway answered to one attack.
struct Answer {
    /// The status, or 0 when HTTP/2 reset the stream or sent GOAWAY instead.
    status: u16,
    x_app: Option<String>,
    /// First line of the answer, for failure messages.
    shown: String,
}

/// Sends each attack (request head, expectation) to the non-holder and checks
/// the guarantee from both apps' records. Returns one line per violation.
async fn run_attacks(rig: &Rig, role: &str, attacks: &[(Expect, String)]) -> Vec<String> {
    let (lease_holder, token) = rig.lease(role).await;
    assert_eq!(lease_holder, rig.holder);
    let mut failures = Vec::new();
    for (i, (expect, head)) in attacks.iter().enumerate() {
        let id = format!("a{i:02}");
        let resp = raw_exchange(rig.gws[rig.other].port, &tagged_request(head, &id)).await;
        let answer = Answer {
            status: status_of(&resp),
            x_app: header_of(&resp, "x-app"),
            shown: first_line(&resp).to_string(),
        };
        let what = head.lines().next().unwrap_or_default();
        failures.extend(judge(
            rig,
            (role, token),
            &id,
            what,
            *expect,
            &answer,
            false,
        ));
    }
    failures
}

/// Checks one attack's outcome against both apps' records: the guarantee
/// whatever was expected, then the expected outcome. `reset_refuses`: a
/// stream reset or GOAWAY (HTTP/2) counts as the gateway refusing.
fn judge(
    rig: &Rig,
    (role, token): (&str, u64),
    id: &str,
    what: &str,
    expect: Expect,
    answer: &Answer,
    reset_refuses: bool,
) -> Vec<String> {
    let (holder, other) = (&rig.apps[rig.holder], &rig.apps[rig.other]);
    let (status, x_app) = (answer.status, answer.x_app.as_deref());
    let at_holder = holder.tagged(id);
    let at_other = other.tagged(id);
    eprintln!(
        "{id} {what:<50} -> {status} x-app={x_app:?} holder={} other={}",
        at_holder.len(),
        at_other.len()
    );
    let mut failures = Vec::new();
    let mut fail = |why: String| {
        failures.push(format!(
            "{id} `{}`: {why}; response: {}",
            what.escape_debug(),
            answer.shown
        ))
    };
    for s in &at_other {
        if s.gated() || s.role.is_some() || s.token.is_some() || s.environ_role.is_some() {
            fail(format!("EXECUTED BY THE NON-HOLDER'S APP: {s:?}"));
        }
    }
    for s in &at_holder {
        if s.gated() && (s.role.as_deref() != Some(role) || s.token != Some(token.to_string())) {
            fail(format!(
                "gated handler at the holder without the gateway's role/token: {s:?}"
            ));
        }
    }
    let forwarded_ok = (200..300).contains(&status)
        && x_app == Some(holder.name.as_str())
        && at_other.is_empty()
        && at_holder.len() == 1
        && at_holder[0].role.as_deref() == Some(role)
        && at_holder[0].token == Some(token.to_string());
    let nothing_ran = x_app.is_none() && at_holder.is_empty() && at_other.is_empty();
    let reset = reset_refuses && status == 0;
    let refused_ok = |code: u16| (status == code || reset) && nothing_ran;
    let ok = match expect {
        Expect::AtHolder => forwarded_ok,
        Expect::Gateway(code) => refused_ok(code),
        Expect::GatewayOrAtHolder(code) => forwarded_ok || refused_ok(code),
        Expect::Refused => ((400..500).contains(&status) || reset) && nothing_ran,
        Expect::LocalUngated => {
            (200..300).contains(&status)
                && x_app == Some(other.name.as_str())
                && at_holder.is_empty()
                && at_other.len() == 1
                && !at_other[0].gated()
        }
    };
    if !ok {
        fail(format!("expected {expect:?}; got {status}, x-app {x_app:?}, holder saw {at_holder:?}, non-holder saw {at_other:?}"));
    }
    failures
}

fn first_line(resp: &str) -> &str {
    resp.lines().next().unwrap_or("<nothing>")
}

/// Path and request-target attacks on the `maintenance` role route.
fn path_attacks() -> Vec<(Expect, String)> {
    use Expect::*;
    let h = "Host: gw.test\r\n";
    let get = |target: &str| format!("GET {target} HTTP/1.1\r\n{h}");
    vec![
        (AtHolder, get("/maintenance/x")), // the plain request, for contrast
        (AtHolder, get("/%6daintenance/x")),
        (AtHolder, get("/%6Daintenance")),
        (AtHolder, get("/maintenance%2Fx")),
        (AtHolder, get("/maintenance%2fx")),
        (AtHolder, get("/maintenance%5Cx")),
        (AtHolder, get("//maintenance/x")),
        (AtHolder, get("///maintenance//x")),
        (AtHolder, get("/MAINTENANCE/x")),
        (AtHolder, get("/Maintenance")),
        (AtHolder, get("/x/../maintenance/x")),
        (AtHolder, get("/x/%2e%2e/maintenance/x")),
        (AtHolder, get("/x/%2E%2E%2Fmaintenance/x")),
        (AtHolder, get("/./maintenance/x")),
        (AtHolder, get("/maintenance;v=1/x")),
        (AtHolder, get("/x/..;/maintenance/x")),
        (GatewayOrAtHolder(400), get("/maintenance\\x")),
        (GatewayOrAtHolder(400), get("/x\\..\\maintenance\\x")),
        (
            AtHolder,
            format!("GET http://gw.test/%6daintenance/x HTTP/1.1\r\n{h}"),
        ),
        (
            AtHolder,
            format!("POST http://gw.test/MAINTENANCE/x HTTP/1.1\r\n{h}Content-Length: 0\r\n"),
        ),
        (AtHolder, "GET /%6daintenance/x HTTP/1.0\r\n".into()),
        (AtHolder, get("/%2fmaintenance/x")),
        (AtHolder, get("/maintenance%3bv=1/x")),
        (AtHolder, get("/%4D%41%49%4E%54%45%4E%41%4E%43%45/x")),
        (AtHolder, get("/.%2e/maintenance/x")),
        (AtHolder, get("/%ff/../maintenance/x")),
        (AtHolder, get("/maintenance%2F..%2Fx")), // some reading stays under /maintenance
        (AtHolder, get("/maintenance#x")),
        // A format suffix (Rails `(.:format)`, Spring suffix matching) and
        // Tomcat's order (raw `;params` dropped before decoding) are gated too.
        (AtHolder, get("/maintenance.json")),
        (AtHolder, get("/;%2Fx/%6Daintenance/x")),
        // Encodings servers disagree on are refused.
        (Gateway(400), get("/%u006daintenance/x")),
        (Gateway(400), get("/x%C0%AF..%C0%AFmaintenance/x")),
        // gunicorn strips a SCRIPT_NAME header from the path; the gateway
        // drops every header with `_`, so the app sees the path as sent.
        (
            LocalUngated,
            format!("GET /x/maintenance/run HTTP/1.1\r\n{h}SCRIPT_NAME: /x\r\n"),
        ),
        (
            LocalUngated,
            format!("GET /x/maintenance/run HTTP/1.1\r\n{h}X-Original-URL: /maintenance/run\r\n"),
        ),
        (AtHolder, get("HTTP://gw.test/MAINTENANCE/x")),
        (AtHolder, get("http://gw.test//maintenance/x")),
        (AtHolder, get("http://u@gw.test/maintenance/x")),
        (Gateway(400), get("/maintenance%00/x")),
        (Gateway(400), get("/maintenance%09/x")),
        (
            Gateway(400),
            get("/%6daintenance%0d%0aX-Rolegate-Role:%20maintenance"),
        ),
        (Gateway(400), get("/orders/x/../../maintenance/x")),
        (Gateway(400), get("/orders/%2e%2e/maintenance")),
        (Refused, get("http:/maintenance/x")),
        (Refused, get("http:///maintenance/x")),
        (Refused, get("x:/maintenance/x")),
        (Gateway(405), format!("CONNECT gw.test:443 HTTP/1.1\r\n{h}")),
        (Refused, format!("CONNECT /maintenance/x HTTP/1.1\r\n{h}")),
        (Refused, format!("GET gw.test:80 HTTP/1.1\r\n{h}")),
        (Gateway(400), format!("GET * HTTP/1.1\r\n{h}")),
        (Gateway(200), format!("OPTIONS * HTTP/1.1\r\n{h}")),
        (
            Gateway(400),
            format!("GET /maintenance/x HTTP/1.1\r\n{h}Host: other.test\r\n"),
        ),
        (
            Gateway(400),
            format!("GET /plain HTTP/1.1\r\n{h}Host: other.test\r\n"),
        ),
        (Gateway(400), "GET /maintenance/x HTTP/1.1\r\n".into()),
        // A Host that is no authority (an HTTP/2 hop could not carry it as sent).
        (
            Gateway(400),
            "GET /maintenance/x HTTP/1.1\r\nHost: u@gw.test\r\n".into(),
        ),
        (
            Gateway(400),
            "GET /maintenance/x HTTP/1.1\r\nHost: gw.test/x\r\n".into(),
        ),
        (
            Gateway(400),
            "GET /plain HTTP/1.1\r\nHost: gw test\r\n".into(),
        ),
        // Not gated in any reading, and no app routes them to /maintenance.
        (LocalUngated, get("/%256daintenance/x")), // decoded once, never twice
        (LocalUngated, get("/maintenancex")),
        (LocalUngated, get("/maintenance%20/x")),
        (LocalUngated, get("/x#/../maintenance/x")), // the fragment never leaves the gateway
        (LocalUngated, get("/x?/../../maintenance")),
    ]
}

/// The path attacks against a rig of `kind`, plus a control showing which of
/// them the app itself routes to its gated handler when nobody is in front.
async fn encoded_paths_against(kind: Kind, tag: &str, must_reach_directly: &[&str]) {
    let rig = Rig::start(kind, tag).await;
    let failures = run_attacks(&rig, "maintenance", &path_attacks()).await;
    // Control: straight to the non-holder's app, no gateway. These do run the
    // gated handler there, so the gateway is what stops them above.
    let app = &rig.apps[rig.other];
    for target in must_reach_directly {
        let id = format!("direct {target}");
        let head = format!("GET {target} HTTP/1.1\r\nHost: gw.test\r\n");
        let resp = raw_exchange(app.port, &tagged_request(&head, &id)).await;
        let seen = app.tagged(&id);
        assert!(
            seen.len() == 1 && seen[0].route == "maintenance",
            "control: {kind:?} app was expected to route {target} to its maintenance handler; saw {seen:?}, {}",
            first_line(&resp)
        );
    }
    assert!(
        failures.is_empty(),
        "{} attack(s) broke the guarantee on {kind:?}:\n{}\n{}",
        failures.len(),
        failures.join("\n"),
        rig.gateway_logs()
    );
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_and_normalized_paths_never_run_gated_handlers_on_a_non_holder_axum() {
    // axum routes on the raw path and decodes only the params it extracts, so
    // only the plain spelling reaches `/maintenance/{*rest}` directly.
    encoded_paths_against(Kind::Axum, "hc_paths_axum", &["/maintenance/x"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_and_normalized_paths_never_run_gated_handlers_on_a_non_holder_flask() {
    // Werkzeug percent-decodes the whole path (`%2F` included) before routing
    // and reads a leading `//x` as `/x`: all of these run the gated handler.
    let direct = [
        "/maintenance/x",
        "/%6daintenance/x",
        "/maintenance%2Fx",
        "//maintenance/x",
    ];
    encoded_paths_against(Kind::Flask("werkzeug"), "hc_paths_flask", &direct).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_paths_and_script_name_never_run_gated_handlers_on_a_non_holder_gunicorn() {
    encoded_paths_against(
        Kind::Flask("gunicorn"),
        "hc_paths_gunicorn",
        &["/maintenance/x"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gunicorn_really_routes_by_a_script_name_header_without_a_gateway() {
    // The control for the SCRIPT_NAME attack above: straight to the app from
    // 127.0.0.1, gunicorn strips the header's value from the path.
    let app = start_flask("direct", "gunicorn").await;
    let head = "GET /x/maintenance/run HTTP/1.1\r\nHost: gw.test\r\nSCRIPT_NAME: /x\r\n";
    let resp = raw_exchange(app.port, &tagged_request(head, "direct-sn")).await;
    let seen = app.tagged("direct-sn");
    assert!(
        seen.len() == 1 && seen[0].route == "maintenance",
        "gunicorn did not route by SCRIPT_NAME ({}); saw {seen:?}",
        first_line(&resp)
    );
}

/// Client-sent gateway headers, in `-` and `_` spellings, plus forwarding fields.
const SPOOFED: &str = "X_Rolegate_Role: maintenance\r\nX_Rolegate_Token: 4242424242\r\n\
X-Rolegate-Role: maintenance\r\nX-Rolegate-Token: 4242424242\r\nx_rolegate_hop: spoofed\r\n\
X_Forwarded_For: 6.6.6.6\r\nX-Forwarded-For: 6.6.6.6\r\nForwarded: for=6.6.6.6\r\nX_Real_IP: 6.6.6.6\r\n";

/// Asserts `seen` carries exactly `expected` (role, token) in every spelling
/// and no client-sent forwarding value.
fn assert_gateway_headers_only(what: &str, seen: &[Seen], expected: Option<(&str, String)>) {
    assert_eq!(
        seen.len(),
        1,
        "{what}: expected one execution, saw {seen:?}"
    );
    let s = &seen[0];
    let (role, token) = match &expected {
        Some((r, t)) => (Some(r.to_string()), Some(t.clone())),
        None => (None, None),
    };
    assert_eq!(
        (&s.role, &s.token),
        (&role, &token),
        "{what}: role/token via the header API: {s:?}"
    );
    if s.environ_http.contains_key("HTTP_HOST") {
        // A WSGI app: the environ is what middleware reads.
        assert_eq!(
            (&s.environ_role, &s.environ_token),
            (&role, &token),
            "{what}: WSGI environ: {s:?}"
        );
    }
    let role_fields = s
        .header_names()
        .into_iter()
        .filter(|n| n == "x-rolegate-role" || n == "x-rolegate-token")
        .count();
    assert_eq!(
        role_fields,
        if expected.is_some() { 2 } else { 0 },
        "{what}: {s:?}"
    );
    let spoofed =
        |v: &str| v.contains("6.6.6.6") || v.contains("4242424242") || v.contains("spoofed");
    assert!(
        !s.all_values().any(spoofed),
        "{what}: a client-sent value reached the app: {s:?}"
    );
}

async fn look_alikes_against(kind: Kind, tag: &str) {
    let rig = Rig::start(kind, tag).await;
    let (holder, other) = (&rig.apps[rig.holder], &rig.apps[rig.other]);
    let token = rig.lease("maintenance").await.1.to_string();
    if kind == Kind::Flask("wsgiref") {
        // Control: with no gateway in front, this server merges `_` into `-`.
        let head = format!("GET /plain/control HTTP/1.1\r\nHost: gw.test\r\n{SPOOFED}");
        raw_exchange(other.port, &tagged_request(&head, "control")).await;
        let s = other.tagged("control");
        assert_eq!(
            s.first().and_then(|s| s.environ_role.as_deref()),
            Some("maintenance,maintenance"),
            "control: wsgiref should merge `X_Rolegate_Role` into the environ: {s:?}"
        );
    }
    for (gw, path, id) in [
        (rig.other, "/plain/look", "ungated-via-non-holder"),
        (rig.holder, "/plain/look", "ungated-via-holder"),
        (rig.other, "/maintenance/look", "gated-via-non-holder"),
        (rig.holder, "/maintenance/look", "gated-via-holder"),
    ] {
        let head = format!("GET {path} HTTP/1.1\r\nHost: gw.test\r\n{SPOOFED}");
        let resp = raw_exchange(rig.gws[gw].port, &tagged_request(&head, id)).await;
        assert_eq!(status_of(&resp), 200, "{id}: {resp}");
        let gated = path.starts_with("/maintenance");
        // Gated requests run at the holder, ungated ones where they were sent.
        let runs_at = if gated { holder } else { &rig.apps[gw] };
        let elsewhere = if std::ptr::eq(runs_at, holder) {
            other
        } else {
            holder
        };
        assert!(
            elsewhere.tagged(id).is_empty(),
            "{id} also ran at {}",
            elsewhere.name
        );
        let expected = gated.then(|| ("maintenance", token.clone()));
        assert_gateway_headers_only(&format!("{kind:?} {id}"), &runs_at.tagged(id), expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn underscore_look_alike_headers_never_reach_a_wsgi_app_as_rolegate_headers() {
    // wsgiref merges `X_Rolegate_Role` into HTTP_X_ROLEGATE_ROLE (as CGI-style
    // servers do); Werkzeug 3's dev server drops `_` fields itself.
    look_alikes_against(Kind::Flask("wsgiref"), "hc_look_wsgiref").await;
    look_alikes_against(Kind::Flask("werkzeug"), "hc_look_werkzeug").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn underscore_look_alike_headers_never_reach_an_axum_app_as_rolegate_headers() {
    look_alikes_against(Kind::Axum, "hc_look_axum").await;
}

/// An h2c upgrade request (`upgrade` holds its `Upgrade`-related fields)
/// followed at once by an HTTP/2 preface and a HEADERS frame for
/// `GET /maintenance/x`: the smuggling attempt if the app ever switched.
fn h2c_attack(path: &str, id: &str, upgrade: &str, connection: &str) -> Vec<u8> {
    let head = format!("GET {path} HTTP/1.1\r\nHost: gw.test\r\n{upgrade}");
    // `tagged_request` says `Connection: close`; an h2c client says this:
    let text = String::from_utf8(tagged_request(&head, id)).unwrap();
    let mut bytes = text
        .replace("Connection: close", &format!("Connection: {connection}"))
        .into_bytes();
    bytes.extend_from_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    bytes.extend_from_slice(&[0, 0, 0, 0x04, 0, 0, 0, 0, 0]); // empty SETTINGS
    let mut block = vec![0x82, 0x86]; // :method GET, :scheme http
    let mut literal = |name_index: u8, name: &[u8], value: &[u8]| {
        block.push(name_index);
        if name_index == 0 {
            block.push(name.len() as u8);
            block.extend_from_slice(name);
        }
        block.push(value.len() as u8);
        block.extend_from_slice(value);
    };
    literal(0x04, b"", b"/maintenance/x"); // :path
    literal(0x01, b"", b"gw.test"); // :authority
    literal(0x00, b"x-attack", b"h2c-smuggled");
    let len = block.len();
    // HEADERS, END_STREAM | END_HEADERS, stream 1.
    bytes.extend_from_slice(&[
        (len >> 16) as u8,
        (len >> 8) as u8,
        len as u8,
        0x01,
        0x05,
        0,
        0,
        0,
        1,
    ]);
    bytes.extend_from_slice(&block);
    bytes
}

const H2C_VARIANTS: &[(&str, &str)] = &[
    (
        "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n",
        "Upgrade, HTTP2-Settings",
    ),
    (
        "Upgrade: websocket, h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n",
        "Upgrade",
    ),
    ("Upgrade: H2C\r\n", "keep-alive, upgrade"),
    (
        "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n",
        "HTTP2-Settings",
    ),
    // No upgrade asked at all: an HTTP/2 preface behind a plain request is
    // bytes of an HTTP/1.1 connection, never an HTTP/2 one.
    ("", "keep-alive"),
];

async fn h2c_against(kind: Kind, tag: &str) {
    let rig = Rig::start(kind, tag).await;
    let (holder, other) = (&rig.apps[rig.holder], &rig.apps[rig.other]);
    for (v, (upgrade, connection)) in H2C_VARIANTS.iter().enumerate() {
        for (path, runs_at) in [("/plain/h2c", other), ("/maintenance/h2c", holder)] {
            let id = format!(
                "h2c-{v}-{}",
                if std::ptr::eq(runs_at, holder) {
                    "gated"
                } else {
                    "plain"
                }
            );
            let resp = raw_exchange(
                rig.gws[rig.other].port,
                &h2c_attack(path, &id, upgrade, connection),
            )
            .await;
            let what = format!("{kind:?} {id} ({})", upgrade.escape_debug());
            assert!(
                !resp.contains(" 101 "),
                "{what}: switched protocols: {resp}"
            );
            assert_eq!(status_of(&resp), 200, "{what}: {resp}");
            assert_eq!(
                header_of(&resp, "x-app").as_deref(),
                Some(runs_at.name.as_str()),
                "{what}: {resp}"
            );
            let seen = runs_at.tagged(&id);
            assert_eq!(seen.len(), 1, "{what}: {seen:?}");
            let names = seen[0].header_names();
            for field in ["upgrade", "http2-settings"] {
                assert!(
                    !names.contains(&field.to_string()),
                    "{what}: the app saw `{field}`: {:?}",
                    seen[0]
                );
            }
            for (k, v) in &seen[0].headers {
                let v = v.to_ascii_lowercase();
                let bad = k.eq_ignore_ascii_case("connection")
                    && (v.contains("upgrade") || v.contains("http2"));
                assert!(!bad, "{what}: the app saw Connection: {v}");
            }
        }
    }
    // The HTTP/2 bytes after each upgrade request never became a request.
    for app in &rig.apps {
        let smuggled: Vec<Seen> = app
            .seen()
            .into_iter()
            .filter(|s| {
                s.attack.as_deref() == Some("h2c-smuggled") || s.uri.contains("/maintenance/x")
            })
            .collect();
        assert!(
            smuggled.is_empty(),
            "{kind:?}: the smuggled HTTP/2 request ran at {}: {smuggled:?}",
            app.name
        );
    }
    assert!(
        other.seen().iter().all(|s| !s.gated()),
        "{kind:?}: {:?}",
        other.seen()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_upgrade_is_never_passed_to_the_app() {
    h2c_against(Kind::Axum, "hc_h2c_axum").await;
    h2c_against(Kind::Flask("werkzeug"), "hc_h2c_flask").await;
}

/// Requests pipelined on one connection, and requests hidden in bodies with
/// every framing trick, sent to the non-holder.
async fn smuggling_against(kind: Kind, tag: &str) {
    let rig = Rig::start(kind, tag).await;
    let (holder, other) = (&rig.apps[rig.holder], &rig.apps[rig.other]);
    let token = rig.lease("maintenance").await.1.to_string();
    let port = rig.gws[rig.other].port;
    let h = "Host: gw.test\r\n";
    // Pipelined: each request is gated on its own, whatever came before it.
    let pipelined = format!(
        "GET /plain/p1 HTTP/1.1\r\n{h}X-Attack: p1\r\n\r\n\
         GET /%6daintenance/p2 HTTP/1.1\r\n{h}X-Attack: p2\r\n\r\n\
         GET /plain/p3 HTTP/1.1\r\n{h}X-Attack: p3\r\nConnection: close\r\n\r\n"
    );
    let resp = raw_exchange(port, pipelined.as_bytes()).await;
    assert_eq!(
        resp.matches("HTTP/1.1 200").count(),
        3,
        "{kind:?} pipelined: {resp}"
    );
    assert_eq!(
        (other.tagged("p1").len(), other.tagged("p3").len()),
        (1, 1),
        "{kind:?}"
    );
    let p2 = holder.tagged("p2");
    assert!(
        other.tagged("p2").is_empty(),
        "{kind:?}: p2 ran at the non-holder"
    );
    assert_eq!(p2.len(), 1, "{kind:?}: p2 must run at the holder: {p2:?}");
    assert_eq!(
        (p2[0].role.as_deref(), p2[0].token.as_deref()),
        (Some("maintenance"), Some(token.as_str()))
    );
    // Hidden in a body: never a request of its own at the non-holder's app.
    let hidden = format!("GET /maintenance/x HTTP/1.1\r\n{h}X-Attack: smuggled\r\n\r\n");
    let n = hidden.len();
    let bodies = [
        format!("POST /plain/cl HTTP/1.1\r\n{h}Content-Length: {n}\r\n\r\n{hidden}"),
        format!("POST /plain/ch HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n{n:x}\r\n{hidden}\r\n0\r\n\r\n"),
        format!("POST /plain/tecl HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\nContent-Length: {n}\r\n\r\n0\r\n\r\n{hidden}"),
        format!("POST /plain/clcl HTTP/1.1\r\n{h}Content-Length: 0\r\nContent-Length: {n}\r\n\r\n{hidden}"),
        format!("POST /plain/tex HTTP/1.1\r\n{h}Transfer-Encoding: xchunked\r\nContent-Length: {n}\r\n\r\n{hidden}"),
        format!("POST /plain/te2 HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\n{hidden}"),
    ];
    for (i, raw) in bodies.iter().enumerate() {
        let (line, rest) = raw.split_once("\r\n").unwrap();
        let req = format!("{line}\r\nX-Attack: body{i}\r\nConnection: close\r\n{rest}");
        let resp = raw_exchange(port, req.as_bytes()).await;
        eprintln!(
            "{kind:?} body{i} {line}: {}",
            resp.lines()
                .filter(|l| l.starts_with("HTTP/"))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        // The pooled connection to the app still answers in step afterwards.
        let after = raw_exchange(
            port,
            &tagged_request(
                &format!("GET /plain/after{i} HTTP/1.1\r\n{h}"),
                &format!("after{i}"),
            ),
        )
        .await;
        assert_eq!(
            header_of(&after, "x-app").as_deref(),
            Some(other.name.as_str()),
            "{kind:?} after body{i}: {after}"
        );
        assert_eq!(
            other.tagged(&format!("after{i}")).len(),
            1,
            "{kind:?} after body{i}"
        );
    }
    for s in other.seen() {
        assert!(
            !s.gated() && s.attack.as_deref() != Some("smuggled"),
            "{kind:?}: EXECUTED BY THE NON-HOLDER'S APP: {s:?}"
        );
    }
    for s in holder.tagged("smuggled") {
        // Read as the client's next pipelined request: gated like any other.
        assert_eq!(
            (s.role.as_deref(), s.token.as_deref()),
            (Some("maintenance"), Some(token.as_str())),
            "{kind:?}: {s:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_and_body_smuggled_requests_are_gated_each_on_its_own() {
    smuggling_against(Kind::Axum, "hc_smuggle_axum").await;
    smuggling_against(Kind::Flask("werkzeug"), "hc_smuggle_flask").await;
}

/// (role, holder index) of the partition `key` falls in.
async fn key_lease(rig: &Rig, key: &str) -> (String, usize) {
    let role = format!(
        "devices:partition-{}",
        rolegate::lease::partition_index(None, key, 8)
    );
    let holder = rig.lease(&role).await.0;
    (role, holder)
}

/// A key whose percent-encoded spelling (`e` as `%65`) would hash to another
/// partition than the decoded key, preferably one held by the other gateway.
async fn telling_key(rig: &Rig) -> (String, String) {
    let role_of = |key: &str| {
        format!(
            "devices:partition-{}",
            rolegate::lease::partition_index(None, key, 8)
        )
    };
    let mut holder = BTreeMap::new();
    for i in 0..8 {
        let role = format!("devices:partition-{i}");
        holder.insert(role.clone(), rig.lease(&role).await.0);
    }
    let mut fallback = None;
    for k in 0..500 {
        let key = format!("order-{k}");
        let encoded = format!("ord%65r-{k}");
        if role_of(&key) == role_of(&encoded) {
            continue;
        }
        if holder[&role_of(&key)] != holder[&role_of(&encoded)] {
            return (key, encoded);
        }
        fallback.get_or_insert((key, encoded));
    }
    fallback.expect("some key whose raw spelling lands elsewhere")
}

/// Requests whose partition key is given twice or could be read two ways.
fn key_refusals(key: &str) -> Vec<(Expect, String)> {
    let n = key.trim_start_matches("order-");
    let refused = [
        "GET /device-api?%69d=victim&id=benign HTTP/1.1\r\nHost: gw.test\r\n".to_string(),
        "GET /device-api?id=benign&ID=victim HTTP/1.1\r\nHost: gw.test\r\n".into(),
        "GET /device-api?id=benign;id=victim HTTP/1.1\r\nHost: gw.test\r\n".into(),
        "GET /device-api?id=victim;x=1 HTTP/1.1\r\nHost: gw.test\r\n".into(),
        "GET /device-api HTTP/1.1\r\nHost: gw.test\r\n".into(),
        // PHP and Rack read `id[]` / `[id]` as `id`: a second key in disguise.
        "GET /device-api?id=benign&id[]=victim HTTP/1.1\r\nHost: gw.test\r\n".into(),
        "GET /device-api?id=benign&[id]=victim HTTP/1.1\r\nHost: gw.test\r\n".into(),
        // The key header named in Connection is gone before the decision,
        // as it is for the app: no key.
        "GET /device-hdr/x HTTP/1.1\r\nHost: gw.test\r\nX-Device-Id: victim\r\nConnection: X-Device-Id\r\n".into(),
        "GET /device-hdr/x HTTP/1.1\r\nHost: gw.test\r\nX-Device-Id: benign\r\nX-Device-Id: victim\r\n".into(),
        format!("GET /orders/{key};v=1 HTTP/1.1\r\nHost: gw.test\r\n"),
        format!("GET /orders/ord%2F{n} HTTP/1.1\r\nHost: gw.test\r\n"),
        format!("GET /orders/ord%5C{n} HTTP/1.1\r\nHost: gw.test\r\n"),
        format!("GET //orders/{key} HTTP/1.1\r\nHost: gw.test\r\n"),
        format!("GET /orders//{key} HTTP/1.1\r\nHost: gw.test\r\n"),
        format!("GET /orders/x/../{key} HTTP/1.1\r\nHost: gw.test\r\n"),
        format!("GET /orders/%2e/{key} HTTP/1.1\r\nHost: gw.test\r\n"),
        // Rails' `(.:format)` would read the key as `{key}`.
        format!("GET /orders/{key}.json HTTP/1.1\r\nHost: gw.test\r\n"),
    ];
    refused
        .into_iter()
        .map(|h| (Expect::Gateway(400), h))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_in_any_encoding_reaches_one_partition_holder() {
    let rig = Rig::start(Kind::Flask("werkzeug"), "hc_keys").await;
    let (key, encoded) = telling_key(&rig).await;
    eprintln!(
        "key {key}: {:?}; raw spelling {encoded} would be {:?}",
        key_lease(&rig, &key).await,
        key_lease(&rig, &encoded).await
    );
    let n = key.trim_start_matches("order-");
    // (request head, key, expected handler param, the key's other reading:
    // a path segment as sent, a query value with `+` kept)
    let mut cases: Vec<(String, &str, Option<&str>, Option<String>)> = Vec::new();
    for (target, sent) in [
        (format!("/orders/{key}"), None),
        (format!("/orders/{encoded}"), Some(encoded.clone())),
        (format!("/orders/%6Frder-{n}"), Some(format!("%6Frder-{n}"))),
        (
            format!("/orders/%6f%72%64%65%72%2D{n}"),
            Some(format!("%6f%72%64%65%72%2D{n}")),
        ),
        (format!("/ORDERS/{key}"), None),
    ] {
        cases.push((
            format!("GET {target} HTTP/1.1\r\nHost: gw.test\r\n"),
            key.as_str(),
            Some("oid"),
            sent,
        ));
    }
    for (query, k, kept) in [
        ("id=victim", "victim", None),
        ("%69d=victim", "victim", None),
        ("id=vict%69m", "victim", None),
        ("id=a+b", "a b", Some("a+b".to_string())),
        ("id=a%20b", "a b", None),
    ] {
        cases.push((
            format!("GET /device-api?{query} HTTP/1.1\r\nHost: gw.test\r\n"),
            k,
            Some("id"),
            kept,
        ));
    }
    cases.push((
        "GET /device-hdr/x HTTP/1.1\r\nHost: gw.test\r\nX-Device-Id: victim\r\n".into(),
        "victim",
        None,
        None,
    ));
    let mut landed: BTreeMap<String, HashSet<(String, String)>> = BTreeMap::new();
    let mut refused = 0;
    for (c, (head, k, param, other)) in cases.iter().enumerate() {
        let role_of = |k: &str| {
            format!(
                "devices:partition-{}",
                rolegate::lease::partition_index(None, k, 8)
            )
        };
        let role = role_of(k);
        // A key that another reading puts in another role is refused.
        let split = other.as_deref().is_some_and(|o| role_of(o) != role);
        let (h, token) = rig.lease(&role).await;
        for via in [rig.other, rig.holder] {
            let id = format!("k{c:02}-via{via}");
            let resp = raw_exchange(rig.gws[via].port, &tagged_request(head, &id)).await;
            let what = format!("{} via gw{via}", head.lines().next().unwrap());
            if split {
                assert_eq!(status_of(&resp), 400, "{what}: {resp}");
                assert!(resp.contains("ambiguous-key"), "{what}: {resp}");
                assert!(
                    rig.apps.iter().all(|a| a.tagged(&id).is_empty()),
                    "{what} ran"
                );
                refused += 1;
                continue;
            }
            assert_eq!(status_of(&resp), 200, "{what}: {resp}");
            let seen = rig.apps[h].tagged(&id);
            assert_eq!(
                seen.len(),
                1,
                "{what}: must run at app{h} (holder of {role}); saw {seen:?}, {}",
                first_line(&resp)
            );
            assert!(
                rig.apps[1 - h].tagged(&id).is_empty(),
                "{what} also ran at app{}",
                1 - h
            );
            let s = &seen[0];
            assert_eq!(
                (s.role.as_deref(), s.token.clone()),
                (Some(role.as_str()), Some(token.to_string())),
                "{what}: {s:?}"
            );
            if let (Some(p), true) = (param, s.gated()) {
                assert_eq!(
                    s.params.get(*p).map(String::as_str),
                    Some(*k),
                    "{what}: the app's own decoded key: {s:?}"
                );
            }
            landed
                .entry(k.to_string())
                .or_default()
                .insert((s.app.clone(), s.role.clone().unwrap()));
        }
    }
    for (k, places) in &landed {
        assert_eq!(
            places.len(),
            1,
            "key {k:?} landed in several places: {places:?}"
        );
    }
    // The telling key's raw spelling lands elsewhere by its choice.
    assert!(refused >= 2, "the raw spelling {encoded} was not refused");
    // Keys given twice, or readable two ways, are refused by the gateway.
    let attacks = key_refusals(&key);
    let failures = run_attacks(&rig, "maintenance", &attacks).await;
    assert!(
        failures.is_empty(),
        "{}\n{}",
        failures.join("\n"),
        rig.gateway_logs()
    );
}

// ---------------------------------------------------------------------------
// The same attacks over HTTP/2 (h2c with prior knowledge)
// ---------------------------------------------------------------------------

type H2Headers = Vec<(String, String)>;

fn h2_request(fields: &[(&str, &str)]) -> H2Headers {
    fields
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn h2_get(path: &str, extra: &[(&str, &str)]) -> H2Headers {
    let mut h = h2_request(&[
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "gw.test"),
        (":path", path),
    ]);
    h.extend(h2_request(extra));
    h
}

/// Every HTTP/1.1 path attack whose request is a plain GET, with its target
/// sent as `:path` (a target that is not a path may be refused or read as
/// the path inside it), then attacks only HTTP/2 can make: pseudo-header
/// abuse, `Host` against `:authority`, connection-specific fields.
fn h2_attacks() -> Vec<(Expect, H2Headers)> {
    use Expect::*;
    let mut out = Vec::new();
    for (expect, head) in path_attacks() {
        let Some(target) = head
            .strip_prefix("GET ")
            .and_then(|r| r.strip_suffix(" HTTP/1.1\r\nHost: gw.test\r\n"))
        else {
            continue;
        };
        let expect = match expect {
            _ if !target.starts_with('/') => GatewayOrAtHolder(400),
            Gateway(400) => Refused, // the h2 layer may reset it first
            e => e,
        };
        out.push((expect, h2_get(target, &[])));
    }
    let m = "/maintenance/x";
    let base = |p: &str| h2_get(p, &[]);
    let without =
        |name: &str| -> H2Headers { base(m).into_iter().filter(|(k, _)| k != name).collect() };
    out.extend([
        (Gateway(400), h2_get(m, &[("host", "other.test")])),
        (Gateway(400), h2_get("/plain", &[("host", "other.test")])),
        (AtHolder, h2_get(m, &[("host", "GW.TEST")])),
        (AtHolder, {
            let mut h = without(":authority");
            h.push(("host".into(), "gw.test".into()));
            h
        }),
        (Gateway(400), without(":authority")),
        (Refused, h2_get("/plain", &[(":path", m)])),
        (Refused, h2_get(m, &[(":path", "/plain")])),
        (Refused, without(":path")),
        (Refused, h2_get("", &[])),
        (Refused, without(":method")),
        (Refused, h2_get(m, &[(":method", "POST")])),
        (Refused, h2_get(m, &[(":foo", "bar")])),
        (Refused, {
            let mut h = without(":path");
            h.push(("x-a".into(), "1".into()));
            h.push((":path".into(), m.into()));
            h
        }),
        (Refused, h2_get("/device-hdr/x", &[("X-Device-Id", "k1")])),
        (Refused, h2_get(m, &[("connection", "close")])),
        (Refused, h2_get(m, &[("transfer-encoding", "chunked")])),
        (Refused, h2_get("/plain", &[("upgrade", "h2c")])),
        (Refused, h2_get(m, &[("keep-alive", "timeout=5")])),
        (Refused, h2_get(m, &[("proxy-connection", "keep-alive")])),
        (Refused, h2_get(m, &[("te", "gzip")])),
        (AtHolder, h2_get(m, &[("te", "trailers")])),
        (
            LocalUngated,
            h2_get(
                "/plain",
                &[
                    ("x_rolegate_role", "maintenance"),
                    ("x-rolegate-token", "1"),
                ],
            ),
        ),
        (
            Refused,
            h2_request(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":authority", "u@gw.test"),
                (":path", m),
            ]),
        ),
        (
            Gateway(405),
            h2_request(&[(":method", "CONNECT"), (":authority", "gw.test:443")]),
        ),
        (
            Refused,
            h2_get(m, &[(":method", "CONNECT"), (":protocol", "websocket")]),
        ),
        (
            GatewayOrAtHolder(400),
            h2_request(&[
                (":method", "GET"),
                (":scheme", "ftp"),
                (":authority", "gw.test"),
                (":path", m),
            ]),
        ),
        (
            Refused,
            h2_get("/plain", &[("x-a", "1\r\nx-rolegate-role: maintenance")]),
        ),
        (Refused, h2_get("/plain", &[("x a", "1")])),
        (Refused, h2_get(m, &[("x-big", &"a".repeat(70 * 1024))])),
    ]);
    out
}

fn h2_attack_script() -> String {
    format!("{}/tests/support/h2_attack.py", env!("CARGO_MANIFEST_DIR"))
}

/// Runs the `h2_attack.py` mode `args` with `stdin`; its JSON lines.
async fn h2_script(args: Vec<String>, stdin: String) -> Vec<serde_json::Value> {
    let python = support::python_with("h2");
    let out = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new(python)
            .arg(h2_attack_script())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run h2_attack.py");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().expect("h2_attack.py output")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "h2_attack.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// Sends each HTTP/2 attack to the non-holder, one connection each, and
/// judges it as [`run_attacks`] does; a reset stream or GOAWAY is a refusal.
async fn run_h2_attacks(rig: &Rig, role: &str, attacks: &[(Expect, H2Headers)]) -> Vec<String> {
    let lease = rig.lease(role).await;
    assert_eq!(lease.0, rig.holder);
    let batch: Vec<_> = attacks
        .iter()
        .enumerate()
        .map(|(i, (_, h))| {
            let id = format!("h{i:02}");
            let mut h = h.clone();
            h.push(("x-attack".into(), id.clone()));
            serde_json::json!({"id": id, "headers": h})
        })
        .collect();
    let port = rig.gws[rig.other].port.to_string();
    let results = h2_script(
        vec!["requests".into(), port],
        serde_json::to_string(&batch).unwrap(),
    )
    .await;
    assert_eq!(results.len(), attacks.len(), "one result per attack");
    let mut failures = Vec::new();
    for (i, ((expect, headers), r)) in attacks.iter().zip(&results).enumerate() {
        let refused = r["reset"].is_number() || r["goaway"].is_number();
        let status = match r["status"].as_u64() {
            Some(s) => s as u16,
            None if refused => 0,
            None => 1, // no answer at all: fails every expectation
        };
        let answer = Answer {
            status,
            x_app: r["x_app"].as_str().map(str::to_string),
            shown: r.to_string(),
        };
        let what = format!("{:?}", &headers[..headers.len().min(6)]);
        let what: String = what.chars().take(160).collect();
        failures.extend(judge(
            rig,
            (role, lease.1),
            &format!("h{i:02}"),
            &what,
            *expect,
            &answer,
            true,
        ));
    }
    failures
}

async fn h2_attacks_against(kind: Kind, tag: &str) {
    let rig = Rig::start(kind, tag).await;
    let failures = run_h2_attacks(&rig, "maintenance", &h2_attacks()).await;
    assert!(
        failures.is_empty(),
        "{} HTTP/2 attack(s) broke the guarantee on {kind:?}:\n{}\n{}",
        failures.len(),
        failures.join("\n"),
        rig.gateway_logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_path_and_pseudo_header_attacks_never_run_gated_handlers_on_a_non_holder_axum() {
    h2_attacks_against(Kind::Axum, "hc_h2_axum").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_path_and_pseudo_header_attacks_never_run_gated_handlers_on_a_non_holder_flask() {
    h2_attacks_against(Kind::Flask("werkzeug"), "hc_h2_flask").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_stream_floods_and_rapid_resets_are_cut_and_the_gateway_keeps_serving() {
    let spec = ClusterSpec::postgres("hc_h2_flood")
        .with_proxy("  http2:\n    max_concurrent_streams: 4\n");
    let rig = Rig::start_with(Kind::Axum, spec).await;
    let port = rig.gws[rig.other].port.to_string();
    // Ten streams at once where four are allowed: six are refused unopened.
    let r = &h2_script(
        vec![
            "streams".into(),
            port.clone(),
            "10".into(),
            "/plain/flood".into(),
        ],
        String::new(),
    )
    .await[0];
    assert_eq!(r["refused"].as_array().map(Vec::len), Some(6), "{r}");
    assert_eq!(r["answered"], 4, "{r}");
    // Rapid reset (CVE-2023-44487): HEADERS then RST_STREAM, as fast as it goes.
    let before = rig.apps[rig.other].seen().len();
    let r = &h2_script(
        vec![
            "rapid-reset".into(),
            port,
            "5000".into(),
            "/plain/reset".into(),
        ],
        String::new(),
    )
    .await[0];
    eprintln!("rapid reset: {r}");
    assert_eq!(r["goaway"], 11, "cut with ENHANCE_YOUR_CALM: {r}");
    let sent = r["sent"].as_u64().unwrap();
    assert!(
        sent < 5000,
        "the connection was cut before the flood ended: {r}"
    );
    let reached = rig.apps[rig.other].seen().len() - before;
    eprintln!("rapid reset: {sent} streams sent, {reached} reached the app");
    // The gateway is alive and serves the next client at once.
    let resp = raw_exchange(
        rig.gws[rig.other].port,
        b"GET /plain/after HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&resp), 200, "{resp}");
    assert!(rig.gws[rig.other].child_alive());
}

/// An HTTP/1.1 request head as HTTP/2 fields: the request line becomes
/// `:method`/`:path`, `Host` becomes `:authority`, names are lower-cased.
fn h2_from_head(head: &str) -> H2Headers {
    let mut lines = head.split("\r\n").filter(|l| !l.is_empty());
    let line = lines.next().expect("a request line");
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap(), parts.next().unwrap());
    let mut h = h2_request(&[(":method", method), (":scheme", "http"), (":path", target)]);
    for l in lines {
        let (k, v) = l.split_once(':').expect("a header line");
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
        if k == "host" {
            h.insert(2, (":authority".into(), v));
        } else {
            h.push((k, v));
        }
    }
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_keys_given_twice_or_readable_two_ways_are_refused() {
    let rig = Rig::start(Kind::Flask("werkzeug"), "hc_h2_keys").await;
    let attacks: Vec<_> = key_refusals("order-7")
        .into_iter()
        .map(|(_, head)| (Expect::Refused, h2_from_head(&head)))
        .collect();
    assert!(attacks.len() >= 15);
    let failures = run_h2_attacks(&rig, "maintenance", &attacks).await;
    assert!(
        failures.is_empty(),
        "{}\n{}",
        failures.join("\n"),
        rig.gateway_logs()
    );
}

// ---------------------------------------------------------------------------
// Round three: letters folded beyond ASCII, forged 101s, unread bodies
// ---------------------------------------------------------------------------

/// Sends `head` (tagged `id`) straight to an app, with no gateway, and
/// returns what the app recorded for it: shows the app really has the
/// behaviour a test defends against, so the test can fail.
async fn straight_to(app: &App, raw: &[u8], id: &str) -> Vec<Seen> {
    raw_exchange(app.port, raw).await;
    app.tagged(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn letters_a_router_folds_to_ascii_and_decoded_query_delimiters_are_gated() {
    use Expect::*;
    let rig = Rig::start(Kind::Raw, "hc_fold").await;
    let h = "HTTP/1.1\r\nHost: gw.test\r\n";
    let gated = [
        // Kelvin sign: Python's str.lower and JavaScript's toLowerCase give `k`.
        format!("GET /tas%E2%84%AAs/x {h}"),
        // Dotless i and capital I with dot: Python's re.IGNORECASE reads `i`.
        format!("GET /ma%C4%B1ntenance/x {h}"),
        format!("GET /MA%C4%B0NTENANCE/x {h}"),
        // Decoded, then split: the app routes the part before `?` or `#`.
        format!("GET /maintenance%3Fx {h}"),
        format!("GET /maintenance%23x {h}"),
    ];
    let other = &rig.apps[rig.other];
    for (i, head) in gated.iter().enumerate() {
        let id = format!("direct{i}");
        let seen = straight_to(other, &tagged_request(head, &id), &id).await;
        assert!(
            seen.len() == 1 && seen[0].gated(),
            "the app itself must route `{head}` to a gated handler: {seen:?}"
        );
    }
    let mut attacks: Vec<(Expect, String)> = gated.iter().map(|h| (AtHolder, h.clone())).collect();
    // Methods are case-sensitive tokens: `get` is an extension method, gated by its path.
    attacks.push((AtHolder, format!("get /maintenance/x {h}")));
    attacks.push((LocalUngated, format!("get /plain/x {h}")));
    attacks.push((LocalUngated, format!("GET /ta%C3%9Fks {h}")));
    let mut failures = run_attacks(&rig, "maintenance", &attacks).await;
    // The same over HTTP/2 (h2c with prior knowledge), `:method get` included.
    let mut h2: Vec<(Expect, H2Headers)> = [
        "/tas%E2%84%AAs/x",
        "/ma%C4%B1ntenance/x",
        "/maintenance%3Fx",
    ]
    .iter()
    .map(|p| (AtHolder, h2_get(p, &[])))
    .collect();
    h2.push((
        AtHolder,
        h2_request(&[
            (":method", "get"),
            (":scheme", "http"),
            (":authority", "gw.test"),
            (":path", "/maintenance/x"),
        ]),
    ));
    failures.extend(run_h2_attacks(&rig, "maintenance", &h2).await);
    assert!(
        failures.is_empty(),
        "{}\n{}",
        failures.join("\n"),
        rig.gateway_logs()
    );
}

/// An upgrade request for `path` with a request for `/maintenance/run`
/// pipelined behind it in the same write.
fn upgrade_then_request(path: &str, upgrade: Option<&str>, id: &str) -> Vec<u8> {
    let upgrade = upgrade
        .map(|u| format!("Connection: Upgrade\r\nUpgrade: {u}\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"))
        .unwrap_or_default();
    format!(
        "GET {path} HTTP/1.1\r\nHost: gw.test\r\n{upgrade}X-Attack: {id}\r\n\r\n\
         GET /maintenance/run HTTP/1.1\r\nHost: gw.test\r\nX-Attack: {id}-inner\r\nConnection: close\r\n\r\n"
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_101_the_client_chose_opens_no_tunnel_to_an_app() {
    let rig = Rig::start(Kind::Raw, "hc_forged101").await;
    let (holder, other) = (&rig.apps[rig.holder], &rig.apps[rig.other]);
    let seen = straight_to(
        other,
        &upgrade_then_request("/status/101", Some("websocket"), "direct"),
        "direct-inner",
    )
    .await;
    assert!(
        seen.iter().any(Seen::gated),
        "the app itself must run the request behind its 101: {:?}",
        other.seen()
    );
    let port = rig.gws[rig.other].port;
    let cases = [
        ("/status/101", Some("websocket")),
        ("/status/101", Some("WebSocket")),
        // A version `websocket` does not have: the upgrade is stripped, so
        // the app's 101 answers a request that asked for none.
        ("/status/101", Some("websocket/13")),
        ("/status/101", None),
        // Gated: the holder's gateway checks its app's 101 too.
        ("/tasks/status/101", Some("websocket")),
    ];
    for (i, (path, upgrade)) in cases.into_iter().enumerate() {
        let id = format!("u{i}");
        let resp = raw_exchange(port, &upgrade_then_request(path, upgrade, &id)).await;
        eprintln!("{id} {path} {upgrade:?}: {}", first_line(&resp));
        assert_eq!(status_of(&resp), 502, "{id} {path} {upgrade:?}: {resp}");
        assert!(
            resp.contains("upstream-bad-upgrade")
                && header_of(&resp, "content-type").as_deref() == Some("application/problem+json"),
            "{id}: {resp}"
        );
        assert!(
            !resp.contains("HTTP/1.1 101"),
            "{id}: a 101 reached the client: {resp}"
        );
        let inner = format!("{id}-inner");
        for s in other.tagged(&inner) {
            assert!(
                !s.gated(),
                "{id}: EXECUTED BY THE NON-HOLDER'S APP through a tunnel: {s:?}"
            );
        }
        for s in holder.tagged(&inner) {
            assert_eq!(s.role.as_deref(), Some("maintenance"), "{id}: {s:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_hidden_in_a_body_the_app_leaves_unread_never_runs_with_close_after_body() {
    let mut spec = ClusterSpec::postgres("hc_unread_body");
    spec.upstream_yaml.push_str("  close_after_body: true\n");
    let rig = Rig::start_with(Kind::Raw, spec).await;
    let other = &rig.apps[rig.other];
    let h = "Host: gw.test\r\n";
    let hidden =
        |id: &str| format!("GET /maintenance/x HTTP/1.1\r\n{h}X-Attack: {id}-hidden\r\n\r\n");
    let shapes = |id: &str| {
        let body = hidden(id);
        let n = body.len();
        vec![
            format!("POST /plain HTTP/1.1\r\n{h}X-Attack: {id}\r\nContent-Length: {n}\r\n\r\n{body}"),
            format!("GET /plain HTTP/1.1\r\n{h}X-Attack: {id}\r\nContent-Length: {n}\r\n\r\n{body}"),
            format!("OPTIONS /plain HTTP/1.1\r\n{h}X-Attack: {id}\r\nContent-Length: {n}\r\n\r\n{body}"),
            format!("POST /plain HTTP/1.1\r\n{h}X-Attack: {id}\r\nExpect: 100-continue\r\nContent-Length: {n}\r\n\r\n{body}"),
            format!("POST /plain HTTP/1.0\r\n{h}X-Attack: {id}\r\nConnection: keep-alive\r\nContent-Length: {n}\r\n\r\n{body}"),
            format!("POST /plain HTTP/1.1\r\n{h}X-Attack: {id}\r\nTransfer-Encoding: chunked\r\n\r\n{n:x}\r\n{body}\r\n0\r\n\r\n"),
            format!("POST /status/204 HTTP/1.1\r\n{h}X-Attack: {id}\r\nContent-Length: {n}\r\n\r\n{body}"),
            format!("POST /status/302 HTTP/1.1\r\n{h}X-Attack: {id}\r\nContent-Length: {n}\r\n\r\n{body}"),
            format!("POST /status/304 HTTP/1.1\r\n{h}X-Attack: {id}\r\nContent-Length: {n}\r\n\r\n{body}"),
            format!("POST /plain HTTP/1.1\r\n{h}X-Attack: {id}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: {n}\r\n\r\n{body}"),
        ]
    };
    let count = shapes("x").len();
    // Straight to the app, every shape runs the hidden request (but the
    // chunked one: http.server does not read chunked bodies).
    for i in 0..count {
        let id = format!("direct{i}");
        let raw = &shapes(&id)[i];
        if raw.contains("chunked") {
            continue;
        }
        let (line, rest) = raw.split_once("\r\n").unwrap();
        let raw = format!("{line}\r\n{rest}GET /x HTTP/1.1\r\n{h}Connection: close\r\n\r\n");
        let seen = straight_to(other, raw.as_bytes(), &format!("{id}-hidden")).await;
        assert!(
            seen.iter().any(Seen::gated),
            "shape {i}: the app itself must leave the body unread and run what is in it: {:?}",
            other.tagged(&id)
        );
    }
    let port = rig.gws[rig.other].port;
    for i in 0..count {
        let id = format!("gw{i}");
        let raw = &shapes(&id)[i];
        let (line, rest) = raw.split_once("\r\n").unwrap();
        let raw = format!("{line}\r\nConnection: close\r\n{rest}");
        let resp = raw_exchange(port, raw.as_bytes()).await;
        eprintln!("{id} {line}: {}", first_line(&resp));
        assert_eq!(
            other.tagged(&id).len(),
            1,
            "{id} must reach the app once: {resp}"
        );
    }
    // Give the app time to read whatever the connections still hold.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let through_gateway = other
        .seen()
        .into_iter()
        .filter(|s| s.attack.as_deref().is_some_and(|a| a.starts_with("gw")));
    for s in through_gateway {
        assert!(
            !s.gated() && !s.attack.as_deref().is_some_and(|a| a.ends_with("-hidden")),
            "EXECUTED BY THE NON-HOLDER'S APP from a body it left unread: {s:?}"
        );
    }
}
