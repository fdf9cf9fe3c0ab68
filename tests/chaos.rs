//! Fault injection against real processes, with a checker.
//!
//! PostgreSQL, five `rolegate run --events` gateways with short timings
//! (each reaching PostgreSQL through its own TCP fault proxy), five recording
//! apps, steady client load on role and partition routes, and random faults:
//! kill -9, SIGSTOP past the lease, SIGTERM, gateway restart, PostgreSQL
//! stopped, PostgreSQL frozen, added latency and blackholing between one
//! gateway and PostgreSQL. The checker then reads every event log and app
//! record and counts violations of the one-holder promise.
//!
//! Short mode (this test, about 2 minutes) runs in `scripts/test`. Long mode:
//! `scripts/chaos --minutes N` (sets ROLEGATE_CHAOS_SECS and
//! ROLEGATE_CHAOS_REPORT).

mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::Request;
use http_body_util::BodyExt;
use rand::{Rng, SeedableRng};
use rolegate::events::monotonic_ns;
use support::cluster::{self, TestApp};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GATEWAYS: usize = 5;
const PARTITIONS: u32 = 16;
const DURATION_MS: u64 = 1_000;
const RENEW_MS: u64 = 250;
const MARGIN_MS: u64 = 300;

// ---------------------------------------------------------------------------
// TCP fault proxy between one gateway and PostgreSQL.

const PASS: u8 = 0;
const DELAY: u8 = 1;
const BLACKHOLE: u8 = 2;

#[derive(Clone, Default)]
struct FaultProxy {
    mode: Arc<AtomicU8>,
    delay_ms: Arc<AtomicU64>,
}

impl FaultProxy {
    async fn start(target: u16) -> (FaultProxy, u16) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let proxy = FaultProxy::default();
        let p = proxy.clone();
        tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                let p = p.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    tokio::spawn(pump(ri, wo, p.clone()));
                    tokio::spawn(pump(ro, wi, p));
                });
            }
        });
        (proxy, port)
    }

    fn set(&self, mode: u8, delay_ms: u64) {
        self.delay_ms.store(delay_ms, Ordering::SeqCst);
        self.mode.store(mode, Ordering::SeqCst);
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    p: FaultProxy,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // A blackhole holds the bytes (as a network that drops packets would,
        // until retransmission succeeds); latency delays every chunk.
        while p.mode.load(Ordering::SeqCst) == BLACKHOLE {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if p.mode.load(Ordering::SeqCst) == DELAY {
            tokio::time::sleep(Duration::from_millis(p.delay_ms.load(Ordering::SeqCst))).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

// ---------------------------------------------------------------------------
// Gateways.

struct Gateway {
    /// A private copy of the binary, so a rebuild during a long run cannot
    /// pull it away between restarts.
    bin: PathBuf,
    n: usize,
    port: u16,
    admin: u16,
    config: PathBuf,
    events: PathBuf,
    child: Option<Child>,
    /// Set while the process is killed, stopped or restarting: requests to it
    /// may fail for that reason alone.
    faulted: Arc<AtomicBool>,
    proxy: FaultProxy,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        // A failed run must not leave gateways behind.
        self.kill();
    }
}

impl Gateway {
    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.config.with_extension("log"))
            .unwrap();
        let child = Command::new(&self.bin)
            .args(["run", "--config"])
            .arg(&self.config)
            .arg("--events")
            .arg(&self.events)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn gateway");
        self.child = Some(child);
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    fn signal(&self, sig: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .args([&format!("-{sig}"), &pid.to_string()])
                .status();
        }
    }

    fn wait_exit(&mut self, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(c) = &mut self.child {
                if let Ok(Some(_)) = c.try_wait() {
                    self.child = None;
                    return true;
                }
            } else {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    async fn wait_up(&self) {
        let url = format!("http://127.0.0.1:{}/healthz", self.admin);
        for _ in 0..500 {
            if matches!(cluster::get(&url).await, Ok((http::StatusCode::OK, _, _))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("gateway {} did not come up", self.n);
    }

    async fn roles_held(&self) -> usize {
        let Ok((_, _, body)) =
            cluster::get(&format!("http://127.0.0.1:{}/leases", self.admin)).await
        else {
            return 0;
        };
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        v["roles"]
            .as_array()
            .map(|r| r.iter().filter(|x| x["held_here"] == true).count())
            .unwrap_or(0)
    }
}

fn config_text(port: u16, admin: u16, app: u16, pg_port: u16, table: &str, n: usize) -> String {
    format!(
        r#"instance:
  name: chaos{n}
listen: 127.0.0.1:{port}
admin_listen: 127.0.0.1:{admin}
upstream:
  url: http://127.0.0.1:{app}
store:
  kind: postgres
  url: postgres://postgres@127.0.0.1:{pg_port}/postgres
  table: {table}
lease:
  duration: {DURATION_MS}ms
  renew_interval: {RENEW_MS}ms
  safety_margin: {MARGIN_MS}ms
roles:
  - name: maintenance
partitions:
  - name: devices
    count: {PARTITIONS}
routes:
  - prefixes: [/maintenance]
    role: maintenance
  - prefixes: [/device-api]
    partition: devices
    key: {{ header: X-Device-Id }}
proxy:
  connect_timeout: 300ms
  response_header_timeout: 2s
shutdown:
  drain_timeout: 1s
"#
    )
}

// ---------------------------------------------------------------------------
// Faults and load records.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum FaultKind {
    Kill,
    Pause,
    Term,
    Restart,
    PgStop,
    PgFreeze,
    Latency,
    Blackhole,
}

impl FaultKind {
    const ALL: [FaultKind; 8] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Term,
        FaultKind::Restart,
        FaultKind::PgStop,
        FaultKind::PgFreeze,
        FaultKind::Latency,
        FaultKind::Blackhole,
    ];

    fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill -9 of the holder",
            FaultKind::Pause => "SIGSTOP of the holder past the lease",
            FaultKind::Term => "SIGTERM of the holder (graceful)",
            FaultKind::Restart => "gateway restart",
            FaultKind::PgStop => "PostgreSQL stopped",
            FaultKind::PgFreeze => "PostgreSQL frozen (SIGSTOP)",
            FaultKind::Latency => "+400 ms latency gateway↔PostgreSQL",
            FaultKind::Blackhole => "blackhole gateway↔PostgreSQL",
        }
    }

    /// The bound the failover (or fail-closed) time is compared with.
    fn bound(self) -> (&'static str, u64) {
        match self {
            FaultKind::Term | FaultKind::Restart => ("≈ one store round trip (handover)", 100),
            FaultKind::Kill | FaultKind::Pause => {
                ("duration + renew interval", DURATION_MS + RENEW_MS)
            }
            _ => (
                "fail closed within duration − margin",
                DURATION_MS - MARGIN_MS,
            ),
        }
    }

    fn targets_holder(self) -> bool {
        matches!(
            self,
            FaultKind::Kill | FaultKind::Pause | FaultKind::Term | FaultKind::Restart
        )
    }
}

#[derive(Debug, Clone)]
struct Fault {
    kind: FaultKind,
    /// The gateway the fault hit (`None`: all of them, PostgreSQL faults).
    target: Option<usize>,
    start_ns: u64,
    end_ns: u64,
}

#[derive(Debug, Clone)]
struct Sent {
    gateway: usize,
    start_ns: u64,
    end_ns: u64,
    /// Status, or None for a transport error / timeout.
    status: Option<u16>,
}

// ---------------------------------------------------------------------------
// The checker.

#[derive(Debug, Clone)]
struct Interval {
    instance: String,
    role: String,
    token: u64,
    start: u64,
    end: u64,
}

#[derive(Debug, Default)]
struct Report {
    transitions: usize,
    overlaps: Vec<String>,
    token_regressions: Vec<String>,
    admissions: usize,
    admissions_outside: Vec<String>,
    executions: usize,
    stale_executions: Vec<String>,
    requests: usize,
    answered_2xx: usize,
    answered_503: usize,
    answered_400: usize,
    attributed_to_faulted_edge: usize,
    lost: Vec<String>,
    faults: BTreeMap<FaultKind, Vec<u64>>,
    no_holder_ms: BTreeMap<FaultKind, Vec<u64>>,
}

/// A local admission: (instance, role, token, t_ns).
type Admission = (String, String, u64, u64);

fn read_events(paths: &[PathBuf]) -> (Vec<Interval>, Vec<Admission>) {
    let mut intervals = Vec::new();
    let mut admits = Vec::new();
    for p in paths {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        // (instance, role, token) -> (start, last known end)
        let mut open: HashMap<(String, String, u64), (u64, u64)> = HashMap::new();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            let u = |k: &str| v[k].as_u64().unwrap_or(0);
            let key = (s("instance"), s("role"), u("token"));
            match v["ev"].as_str() {
                Some("began") => {
                    open.insert(key, (u("t"), u("until")));
                }
                Some("renewed") => {
                    if let Some(e) = open.get_mut(&key) {
                        e.1 = e.1.max(u("until"));
                    }
                }
                Some("ended") => {
                    if let Some((start, _)) = open.remove(&key) {
                        intervals.push(Interval {
                            instance: key.0,
                            role: key.1,
                            token: key.2,
                            start,
                            end: u("t"),
                        });
                    }
                }
                Some("admit") => admits.push((key.0, key.1, key.2, u("t"))),
                _ => {}
            }
        }
        // Killed processes never wrote `ended`: belief ended at the last deadline.
        for ((instance, role, token), (start, until)) in open {
            intervals.push(Interval {
                instance,
                role,
                token,
                start,
                end: until,
            });
        }
    }
    (intervals, admits)
}

/// Every (start time, instance id) of one gateway's log.
fn starts_of(file: &Path) -> Vec<(u64, String)> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains(r#""ev":"start""#))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| {
            (
                v["t"].as_u64().unwrap_or(0),
                v["instance"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Which instance id a gateway had at time `t`.
fn instance_at(starts: &[(u64, String)], t: u64) -> Option<String> {
    starts
        .iter()
        .filter(|(at, _)| *at <= t)
        .max_by_key(|(at, _)| *at)
        .map(|(_, id)| id.clone())
}

fn check(
    event_files: &[PathBuf],
    executions: &[(usize, String, u64, u64)],
    sent: &[Sent],
    faults: &[Fault],
    edge_faults: &[(usize, u64, u64)],
) -> Report {
    let (intervals, admits) = read_events(event_files);
    let mut r = Report {
        transitions: intervals.len(),
        ..Report::default()
    };
    let mut by_role: BTreeMap<&str, Vec<&Interval>> = BTreeMap::new();
    for i in &intervals {
        by_role.entry(&i.role).or_default().push(i);
    }
    for (role, list) in by_role.iter_mut() {
        list.sort_by_key(|i| (i.start, i.token));
        let mut latest_end: Option<&Interval> = None;
        for w in list.iter() {
            if let Some(prev) = latest_end {
                if prev.end > w.start && prev.instance != w.instance {
                    r.overlaps.push(format!(
                        "{role}: {} token {} held until {} ns after {} token {} began",
                        prev.instance,
                        prev.token,
                        prev.end - w.start,
                        w.instance,
                        w.token
                    ));
                }
            }
            if latest_end.is_none_or(|p| w.end > p.end) {
                latest_end = Some(w);
            }
        }
        for pair in list.windows(2) {
            if pair[1].token <= pair[0].token {
                r.token_regressions.push(format!(
                    "{role}: token {} ({}) followed by {} ({})",
                    pair[0].token, pair[0].instance, pair[1].token, pair[1].instance
                ));
            }
        }
    }
    // Admissions inside the admitting instance's own interval for that term.
    let mut own: HashMap<(&str, &str, u64), Vec<&Interval>> = HashMap::new();
    for i in &intervals {
        own.entry((&i.instance, &i.role, i.token))
            .or_default()
            .push(i);
    }
    r.admissions = admits.len();
    for (instance, role, token, t) in &admits {
        let inside = own
            .get(&(instance.as_str(), role.as_str(), *token))
            .is_some_and(|v| v.iter().any(|i| i.start <= *t && *t <= i.end));
        if !inside {
            r.admissions_outside
                .push(format!("{instance} admitted {role} token {token} at {t}"));
        }
    }
    // Executions carrying an older token than one already executed.
    let mut execs: Vec<&(usize, String, u64, u64)> = executions.iter().collect();
    execs.sort_by_key(|e| e.3);
    r.executions = execs.len();
    let mut max_token: HashMap<&str, (u64, usize, u64)> = HashMap::new();
    for e in execs {
        let (app, role, token, t) = (e.0, e.1.as_str(), e.2, e.3);
        match max_token.get(role) {
            Some(&(m, mapp, mt)) if token < m => r.stale_executions.push(format!(
                "{role}: app{app} executed token {token} {} µs after app{mapp} executed token {m} — admitted by the old holder inside its term, reached its app after the new holder's first execution",
                (t - mt) / 1_000
            )),
            Some(&(m, _, _)) if token == m => {}
            _ => {
                max_token.insert(role, (token, app, t));
            }
        }
    }
    // Requests.
    r.requests = sent.len();
    for s in sent {
        match s.status {
            Some(200..=299) => r.answered_2xx += 1,
            Some(503) => r.answered_503 += 1,
            Some(400) => r.answered_400 += 1,
            _ => {
                let faulted = edge_faults.iter().any(|(g, a, b)| {
                    *a <= s.end_ns && s.start_ns <= *b && (*g == s.gateway || *g == usize::MAX)
                });
                if faulted {
                    r.attributed_to_faulted_edge += 1;
                } else {
                    r.lost.push(format!(
                        "gateway {} status {:?} at {}",
                        s.gateway, s.status, s.start_ns
                    ));
                }
            }
        }
    }
    // Per fault: holder faults — the longest time until another instance began
    // holding a role the victim held; store faults — the longest time until
    // every belief of the affected instances that was active at the start ended.
    let starts: Vec<Vec<(u64, String)>> = event_files.iter().map(|f| starts_of(f)).collect();
    for f in faults {
        r.faults
            .entry(f.kind)
            .or_default()
            .push(f.end_ns - f.start_ns);
        let affected: Option<String> = f.target.and_then(|g| instance_at(&starts[g], f.start_ns));
        let mut worst = 0u64;
        for list in by_role.values() {
            let active: Vec<&&Interval> = list
                .iter()
                .filter(|i| i.start <= f.start_ns && f.start_ns < i.end)
                .filter(|i| affected.as_deref().is_none_or(|a| i.instance == a))
                .collect();
            if f.kind.targets_holder() {
                for victim in &active {
                    if let Some(next) = list
                        .iter()
                        .filter(|i| i.instance != victim.instance && i.start >= f.start_ns)
                        .map(|i| i.start)
                        .min()
                    {
                        worst = worst.max(next - f.start_ns);
                    }
                }
            } else {
                for i in &active {
                    worst = worst.max(i.end.saturating_sub(f.start_ns));
                }
            }
        }
        r.no_holder_ms
            .entry(f.kind)
            .or_default()
            .push(worst / 1_000_000);
    }
    r
}

fn pct(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    let idx = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[idx]
}

fn render(r: &Report, secs: u64) -> String {
    let mut out = String::new();
    out.push_str(&format!("Run of {secs} s with {GATEWAYS} gateways, 1 role + {PARTITIONS} partition roles, duration {DURATION_MS} ms, renew {RENEW_MS} ms, margin {MARGIN_MS} ms.\n\n"));
    out.push_str("| measure | value |\n|---|---|\n");
    out.push_str(&format!(
        "| role transitions (held intervals) | {} |\n",
        r.transitions
    ));
    out.push_str(&format!(
        "| requests sent | {} (2xx {}, 503 {}, 400 {}, cut by a fault at their own gateway {}) |\n",
        r.requests, r.answered_2xx, r.answered_503, r.answered_400, r.attributed_to_faulted_edge
    ));
    out.push_str(&format!(
        "| local admissions checked | {} |\n",
        r.admissions
    ));
    out.push_str(&format!(
        "| **admissions outside a held interval** | **{}** |\n",
        r.admissions_outside.len()
    ));
    out.push_str(&format!(
        "| **overlapping held intervals** | **{}** |\n",
        r.overlaps.len()
    ));
    out.push_str(&format!(
        "| **token regressions** | **{}** |\n",
        r.token_regressions.len()
    ));
    out.push_str(&format!("| executions at apps | {} |\n", r.executions));
    out.push_str(&format!(
        "| stale-token executions (fencing would reject) | {} |\n",
        r.stale_executions.len()
    ));
    out.push_str(&format!("| **lost requests** | **{}** |\n\n", r.lost.len()));
    out.push_str("| fault | injected | longest time without holder (ms) p50 / p99 / max | bound |\n|---|---|---|---|\n");
    for kind in FaultKind::ALL {
        let n = r.faults.get(&kind).map_or(0, |v| v.len());
        let mut v = r.no_holder_ms.get(&kind).cloned().unwrap_or_default();
        let (what, ms) = kind.bound();
        let p50 = pct(&mut v, 0.5);
        let p99 = pct(&mut v, 0.99);
        let max = v.iter().copied().max().unwrap_or(0);
        out.push_str(&format!(
            "| {} | {n} | {p50} / {p99} / {max} | {what}: {ms} ms |\n",
            kind.name()
        ));
    }
    if !r.stale_executions.is_empty() {
        out.push_str("\nStale-token executions (first 5):\n\n");
        for s in r.stale_executions.iter().take(5) {
            out.push_str(&format!("- {s}\n"));
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The harness.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_holder_survives_random_faults() {
    let secs: u64 = std::env::var("ROLEGATE_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(110);
    let seed: u64 = std::env::var("ROLEGATE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    eprintln!("chaos: {secs} s, seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    let pg = Arc::new(support::PrivatePostgres::start());
    let dir = std::env::temp_dir().join(format!("rolegate-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let table = support::unique_table("chaos");
    let bin = dir.join("rolegate");
    std::fs::copy(cluster::bin(), &bin).expect("copy the rolegate binary");
    let mut apps = Vec::new();
    for n in 0..GATEWAYS {
        apps.push(TestApp::start(n).await);
    }
    let mut gws = Vec::new();
    for (n, app) in apps.iter().enumerate() {
        let (proxy, proxy_port) = FaultProxy::start(pg.port).await;
        let (port, admin) = (support::free_port(), support::free_port());
        let config = dir.join(format!("gw{n}.yaml"));
        std::fs::write(
            &config,
            config_text(port, admin, app.port, proxy_port, &table, n),
        )
        .unwrap();
        let mut g = Gateway {
            bin: bin.clone(),
            n,
            port,
            admin,
            config,
            events: dir.join(format!("gw{n}.events")),
            child: None,
            faulted: Arc::new(AtomicBool::new(false)),
            proxy,
        };
        g.spawn();
        g.wait_up().await;
        gws.push(g);
    }
    let ports: Vec<u16> = gws.iter().map(|g| g.port).collect();
    let faulted: Vec<Arc<AtomicBool>> = gws.iter().map(|g| g.faulted.clone()).collect();

    // Steady load through every gateway that is up, bounded in time.
    let stop = Arc::new(AtomicBool::new(false));
    let sent: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let mut clients = Vec::new();
    for c in 0..4u64 {
        let (stop, sent, ports, faulted) =
            (stop.clone(), sent.clone(), ports.clone(), faulted.clone());
        clients.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (c + 1));
            let client = cluster::client();
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                i += 1;
                let g = rng.gen_range(0..ports.len());
                if faulted[g].load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                let req = if rng.gen_bool(0.5) {
                    Request::post(format!(
                        "http://127.0.0.1:{}/maintenance/job/{c}-{i}",
                        ports[g]
                    ))
                    .body(Body::from("x"))
                    .unwrap()
                } else {
                    Request::get(format!(
                        "http://127.0.0.1:{}/device-api/d/{c}-{i}",
                        ports[g]
                    ))
                    .header("x-device-id", format!("dev-{}", rng.gen_range(0..64)))
                    .body(Body::empty())
                    .unwrap()
                };
                let start_ns = monotonic_ns();
                let status = tokio::time::timeout(Duration::from_secs(5), async {
                    let resp = client.request(req).await.ok()?;
                    let status = resp.status().as_u16();
                    resp.into_body().collect().await.ok()?;
                    Some(status)
                })
                .await
                .unwrap_or_default();
                sent.lock().unwrap().push(Sent {
                    gateway: g,
                    start_ns,
                    end_ns: monotonic_ns(),
                    status,
                });
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        }));
    }

    // Faults, one at a time, at random.
    let mut faults = Vec::new();
    let mut edge_faults: Vec<(usize, u64, u64)> = Vec::new();
    let t_end = Instant::now() + Duration::from_secs(secs);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut round = 0usize;
    while Instant::now() < t_end {
        round += 1;
        let kind = FaultKind::ALL[if round <= FaultKind::ALL.len() {
            round - 1
        } else {
            rng.gen_range(0..FaultKind::ALL.len())
        }];
        // The gateway holding the most roles is the "holder".
        let mut holder = 0;
        let mut most = 0;
        for g in &gws {
            let n = g.roles_held().await;
            if n > most {
                most = n;
                holder = g.n;
            }
        }
        let start_ns = monotonic_ns();
        let victim = kind.targets_holder().then_some(holder);
        let mut target = victim;
        match kind {
            FaultKind::Kill => {
                gws[holder].faulted.store(true, Ordering::SeqCst);
                gws[holder].kill();
                tokio::time::sleep(Duration::from_millis(DURATION_MS + 500)).await;
                gws[holder].spawn();
                gws[holder].wait_up().await;
                gws[holder].faulted.store(false, Ordering::SeqCst);
            }
            FaultKind::Pause => {
                gws[holder].faulted.store(true, Ordering::SeqCst);
                gws[holder].signal("STOP");
                tokio::time::sleep(Duration::from_millis(DURATION_MS * 3 / 2)).await;
                gws[holder].signal("CONT");
                tokio::time::sleep(Duration::from_millis(300)).await;
                gws[holder].faulted.store(false, Ordering::SeqCst);
            }
            FaultKind::Term | FaultKind::Restart => {
                gws[holder].faulted.store(true, Ordering::SeqCst);
                gws[holder].signal("TERM");
                let g = &mut gws[holder];
                if !tokio::task::block_in_place(|| g.wait_exit(Duration::from_secs(5))) {
                    g.kill();
                }
                if kind == FaultKind::Term {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                gws[holder].spawn();
                gws[holder].wait_up().await;
                gws[holder].faulted.store(false, Ordering::SeqCst);
            }
            FaultKind::PgStop => {
                let p = pg.clone();
                tokio::task::spawn_blocking(move || p.stop_server())
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                let p = pg.clone();
                tokio::task::spawn_blocking(move || p.start_server())
                    .await
                    .unwrap();
            }
            FaultKind::PgFreeze => {
                pg.signal_all("STOP");
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                pg.signal_all("CONT");
            }
            FaultKind::Latency => {
                let g = holder;
                target = Some(g);
                gws[g].proxy.set(DELAY, 400);
                tokio::time::sleep(Duration::from_millis(2_000)).await;
                gws[g].proxy.set(PASS, 0);
            }
            FaultKind::Blackhole => {
                let g = holder;
                target = Some(g);
                gws[g].proxy.set(BLACKHOLE, 0);
                tokio::time::sleep(Duration::from_millis(2_000)).await;
                gws[g].proxy.set(PASS, 0);
            }
        }
        let end_ns = monotonic_ns();
        if let Some(v) = victim {
            // Requests whose own gateway was killed, paused or restarted may be cut.
            edge_faults.push((v, start_ns, end_ns + 5_000_000_000));
            // The victim's in-flight forwarded requests die with it, so requests
            // through other gateways that were forwarded to it may be cut too.
            edge_faults.push((usize::MAX, start_ns, start_ns + 100_000_000));
        }
        faults.push(Fault {
            kind,
            target,
            start_ns,
            end_ns,
        });
        // Let the cluster settle between faults.
        tokio::time::sleep(Duration::from_millis(rng.gen_range(800..1_800))).await;
    }

    stop.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.await;
    }
    for g in gws.iter() {
        g.signal("TERM");
    }
    for g in gws.iter_mut() {
        if !tokio::task::block_in_place(|| g.wait_exit(Duration::from_secs(5))) {
            g.kill();
        }
    }

    let executions: Vec<(usize, String, u64, u64)> = apps
        .iter()
        .enumerate()
        .flat_map(|(n, a)| {
            a.executed().into_iter().filter_map(move |e| {
                let role = e.headers.get("x-rolegate-role")?.to_str().ok()?.to_string();
                let token = e
                    .headers
                    .get("x-rolegate-token")?
                    .to_str()
                    .ok()?
                    .parse()
                    .ok()?;
                Some((n, role, token, e.t_ns))
            })
        })
        .collect();
    let event_files: Vec<PathBuf> = gws.iter().map(|g| g.events.clone()).collect();
    let sent = sent.lock().unwrap().clone();
    let report = check(&event_files, &executions, &sent, &faults, &edge_faults);
    let text = render(&report, secs);
    eprintln!("{text}");
    if let Ok(path) = std::env::var("ROLEGATE_CHAOS_REPORT") {
        std::fs::write(&path, &text).unwrap();
    }
    for v in report
        .overlaps
        .iter()
        .chain(&report.token_regressions)
        .chain(&report.admissions_outside)
        .chain(&report.lost)
        .take(20)
    {
        eprintln!("violation: {v}");
    }
    assert!(
        report.overlaps.is_empty(),
        "overlapping held intervals: {:?}",
        &report.overlaps[..report.overlaps.len().min(5)]
    );
    assert!(
        report.token_regressions.is_empty(),
        "token regressions: {:?}",
        &report.token_regressions[..report.token_regressions.len().min(5)]
    );
    assert!(
        report.admissions_outside.is_empty(),
        "admissions outside held intervals: {:?}",
        &report.admissions_outside[..report.admissions_outside.len().min(5)]
    );
    assert!(
        report.lost.is_empty(),
        "lost requests: {:?}",
        &report.lost[..report.lost.len().min(5)]
    );
    assert!(
        report.transitions >= 200,
        "only {} role transitions; the short run needs at least 200",
        report.transitions
    );
    assert!(
        report.admissions > 100 && report.executions > 100,
        "too little load: {report:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
