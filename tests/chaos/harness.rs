//! The harness: the store (PostgreSQL, or a 3-member etcd cluster), gateways
//! (`rolegate run --events`; on PostgreSQL each behind its own fault proxy),
//! recording apps, steady client load, clients keeping SSE streams of ticks
//! open on partition routes, and random faults one at a time, with a record
//! of what was sent, streamed and injected.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::events::monotonic_ns;
use axum::body::Body;
use http::Request;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::backend::{self, Servers, Store, Timings};
use super::fault_proxy::{FaultProxy, BLACKHOLE, DELAY, PASS};
use super::{GATEWAYS, PARTITIONS};
use crate::support;
use crate::support::cluster::{self, TestApp};

// ---------------------------------------------------------------------------
// Settings.

/// The env knobs: ROLEGATE_CHAOS_SECS (default 110) and ROLEGATE_CHAOS_SEED
/// (default random).
pub struct Settings {
    pub secs: u64,
    pub seed: u64,
}

impl Settings {
    pub fn from_env() -> Settings {
        let secs: u64 = std::env::var("ROLEGATE_CHAOS_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(110);
        let seed: u64 = std::env::var("ROLEGATE_CHAOS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| rand::thread_rng().gen());
        Settings { secs, seed }
    }
}

// ---------------------------------------------------------------------------
// Gateways.

pub struct Gateway {
    /// A private copy of the binary, so a rebuild during a long run cannot
    /// pull it away between restarts.
    bin: PathBuf,
    pub n: usize,
    pub port: u16,
    admin: u16,
    config: PathBuf,
    pub events: PathBuf,
    child: Option<Child>,
    /// Set while the process is killed, stopped or restarting: requests to it
    /// may fail for that reason alone.
    pub faulted: Arc<AtomicBool>,
    /// The proxy between the gateway and PostgreSQL (none on etcd).
    pub proxy: Option<FaultProxy>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        // A failed run must not leave gateways behind.
        self.kill();
    }
}

impl Gateway {
    pub fn spawn(&mut self) {
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

    pub fn signal(&self, sig: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .args([&format!("-{sig}"), &pid.to_string()])
                .status();
        }
    }

    pub fn wait_exit(&mut self, limit: Duration) -> bool {
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

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub async fn wait_up(&self) {
        let url = format!("http://127.0.0.1:{}/healthz", self.admin);
        for _ in 0..500 {
            if matches!(cluster::get(&url).await, Ok((http::StatusCode::OK, _, _))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("gateway {} did not come up", self.n);
    }

    pub async fn roles_held(&self) -> usize {
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

    /// SIGTERM, then waits up to 5 s for the exit before killing it.
    fn terminate(&mut self) {
        self.signal("TERM");
        if !tokio::task::block_in_place(|| self.wait_exit(Duration::from_secs(5))) {
            self.kill();
        }
    }
}

fn config_text(port: u16, admin: u16, app: u16, store: &str, t: Timings, n: usize) -> String {
    let Timings {
        duration_ms,
        renew_ms,
        margin_ms,
    } = t;
    format!(
        r#"instance:
  name: chaos{n}
listen: 127.0.0.1:{port}
admin_listen: 127.0.0.1:{admin}
upstream:
  url: http://127.0.0.1:{app}
{store}lease:
  duration: {duration_ms}ms
  renew_interval: {renew_ms}ms
  safety_margin: {margin_ms}ms
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
pub enum FaultKind {
    Kill,
    Pause,
    Term,
    Restart,
    PgStop,
    PgFreeze,
    Latency,
    Blackhole,
    MemberKill,
    MemberPause,
}

impl FaultKind {
    /// The faults of a run on PostgreSQL.
    pub const POSTGRES: [FaultKind; 8] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Term,
        FaultKind::Restart,
        FaultKind::PgStop,
        FaultKind::PgFreeze,
        FaultKind::Latency,
        FaultKind::Blackhole,
    ];

    /// The faults of a run on a 3-member etcd cluster: the gateway faults,
    /// and one member killed or frozen at a time (a majority stays up).
    pub const ETCD_CLUSTER: [FaultKind; 6] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Term,
        FaultKind::Restart,
        FaultKind::MemberKill,
        FaultKind::MemberPause,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill -9 of the holder",
            FaultKind::Pause => "SIGSTOP of the holder past the lease",
            FaultKind::Term => "SIGTERM of the holder (graceful)",
            FaultKind::Restart => "gateway restart",
            FaultKind::PgStop => "PostgreSQL stopped",
            FaultKind::PgFreeze => "PostgreSQL frozen (SIGSTOP)",
            FaultKind::Latency => "+400 ms latency gateway↔PostgreSQL",
            FaultKind::Blackhole => "blackhole gateway↔PostgreSQL",
            FaultKind::MemberKill => "kill -9 of one etcd member (the leader half the time)",
            FaultKind::MemberPause => "SIGSTOP of one etcd member (the leader half the time)",
        }
    }

    /// Faults of one etcd member, with a majority up.
    pub fn is_member(self) -> bool {
        matches!(self, FaultKind::MemberKill | FaultKind::MemberPause)
    }

    /// The bound the failover (or fail-closed, or no-holder) time is
    /// compared with.
    pub fn bound(self, t: Timings) -> (&'static str, u64) {
        match self {
            // A graceful stop waits for the work under its terms (the open
            // streams) up to `shutdown.drain_timeout` (1 s), then ends it and
            // releases: the successor follows one store round trip later.
            FaultKind::Term | FaultKind::Restart => (
                "drain bound (1 s) + ≈ one store round trip (handover)",
                1_100,
            ),
            FaultKind::Kill | FaultKind::Pause => {
                ("duration + renew interval", t.duration_ms + t.renew_ms)
            }
            FaultKind::MemberKill | FaultKind::MemberPause => {
                ("no role without holder, no new term", 0)
            }
            _ => (
                "fail closed within duration − margin",
                t.duration_ms - t.margin_ms,
            ),
        }
    }

    pub fn targets_holder(self) -> bool {
        matches!(
            self,
            FaultKind::Kill | FaultKind::Pause | FaultKind::Term | FaultKind::Restart
        )
    }
}

#[derive(Debug, Clone)]
pub struct Fault {
    pub kind: FaultKind,
    /// The gateway the fault hit (`None`: all of them, PostgreSQL faults).
    pub target: Option<usize>,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// A window (gateway, start_ns, end_ns) in which requests through that
/// gateway may be cut by a fault; gateway `usize::MAX` means any gateway.
pub type EdgeFault = (usize, u64, u64);

#[derive(Debug, Clone)]
pub struct Sent {
    pub gateway: usize,
    /// The role the request's route needs (`maintenance`, or the partition
    /// role of its device).
    pub role: String,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Status, or None for a transport error / timeout.
    pub status: Option<u16>,
}

/// A request an app executed: (app, role, token, t_ns).
pub type Execution = (usize, String, u64, u64);

// ---------------------------------------------------------------------------
// The cluster.

/// The store, the apps and the gateways in front of them. Fields drop in
/// order: gateways first, the store last.
pub struct Rig {
    pub gws: Vec<Gateway>,
    apps: Vec<TestApp>,
    pub store: Store,
    servers: Servers,
}

impl Rig {
    /// Starts the store, `GATEWAYS` apps and a gateway in front of each
    /// (reaching PostgreSQL through its own fault proxy); files go to `dir`.
    pub async fn start(dir: &Path, store: Store) -> Rig {
        let servers = Servers::start(store).await;
        std::fs::create_dir_all(dir).unwrap();
        let table = support::unique_table("chaos");
        let bin = dir.join("rolegate");
        std::fs::copy(cluster::bin(), &bin).expect("copy the rolegate binary");
        let mut apps = Vec::new();
        for n in 0..GATEWAYS {
            apps.push(TestApp::start(n).await);
        }
        let mut gws = Vec::new();
        for (n, app) in apps.iter().enumerate() {
            let (proxy, proxy_port) = match servers.pg_port() {
                Some(pg_port) => {
                    let (proxy, port) = FaultProxy::start(pg_port).await;
                    (Some(proxy), Some(port))
                }
                None => (None, None),
            };
            // The first start binds port 0; restarts keep the ports it bound.
            let config = dir.join(format!("gw{n}.yaml"));
            let store_yaml = servers.store_yaml(n, &table, proxy_port).await;
            let text =
                |port, admin| config_text(port, admin, app.port, &store_yaml, store.timings(), n);
            std::fs::write(&config, text(0, 0)).unwrap();
            let mut g = Gateway {
                bin: bin.clone(),
                n,
                port: 0,
                admin: 0,
                config,
                events: dir.join(format!("gw{n}.events")),
                child: None,
                faulted: Arc::new(AtomicBool::new(false)),
                proxy,
            };
            g.spawn();
            let mut ports = None;
            let log = g.config.with_extension("log");
            support::wait_for(
                "the gateway's started line",
                Duration::from_secs(15),
                || {
                    ports =
                        cluster::started_ports(&std::fs::read_to_string(&log).unwrap_or_default());
                    ports.is_some()
                },
            )
            .await;
            (g.port, g.admin) = ports.unwrap_or_default();
            std::fs::write(&g.config, text(g.port, g.admin)).unwrap();
            g.wait_up().await;
            gws.push(g);
        }
        Rig {
            gws,
            apps,
            store,
            servers,
        }
    }

    /// Stops every gateway gracefully (killing those that do not exit).
    pub fn stop_gateways(&mut self) {
        for g in self.gws.iter() {
            g.signal("TERM");
        }
        for g in self.gws.iter_mut() {
            if !tokio::task::block_in_place(|| g.wait_exit(Duration::from_secs(5))) {
                g.kill();
            }
        }
    }

    /// Every execution at the apps that carried a role and token.
    pub fn executions(&self) -> Vec<Execution> {
        self.apps
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
            .collect()
    }

    pub fn event_files(&self) -> Vec<PathBuf> {
        self.gws.iter().map(|g| g.events.clone()).collect()
    }

    /// The gateway holding the most roles (the first one on a tie).
    async fn holder(&self) -> usize {
        let mut holder = 0;
        let mut most = 0;
        for g in &self.gws {
            let n = g.roles_held().await;
            if n > most {
                most = n;
                holder = g.n;
            }
        }
        holder
    }
}

// ---------------------------------------------------------------------------
// Load.

/// Four clients sending steady load through every gateway that is up.
pub struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<Mutex<Vec<Sent>>>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    pub fn start(seed: u64, gws: &[Gateway]) -> Load {
        let ports: Vec<u16> = gws.iter().map(|g| g.port).collect();
        let faulted: Vec<Arc<AtomicBool>> = gws.iter().map(|g| g.faulted.clone()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let sent: Arc<Mutex<Vec<Sent>>> = Arc::default();
        let mut clients = Vec::new();
        for c in 0..4u64 {
            let (stop, sent, ports, faulted) =
                (stop.clone(), sent.clone(), ports.clone(), faulted.clone());
            clients.push(tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed ^ (c + 1));
                let client = cluster::client();
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let g = rng.gen_range(0..ports.len());
                    if faulted[g].load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    let (req, role) = random_request(&mut rng, ports[g], c, i);
                    let start_ns = monotonic_ns();
                    let status = send_bounded(&client, req).await;
                    sent.lock().unwrap().push(Sent {
                        gateway: g,
                        role,
                        start_ns,
                        end_ns: monotonic_ns(),
                        status,
                    });
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
            }));
        }
        Load {
            stop,
            sent,
            clients,
        }
    }

    /// Stops the clients; returns every request they sent.
    pub async fn finish(self) -> Vec<Sent> {
        self.stop.store(true, Ordering::SeqCst);
        for c in self.clients {
            let _ = c.await;
        }
        let sent = self.sent.lock().unwrap().clone();
        sent
    }
}

/// A role request (POST /maintenance/job) or a partition request (GET
/// /device-api with one of 64 device ids), half and half; and the role its
/// route needs.
fn random_request(rng: &mut StdRng, port: u16, c: u64, i: u64) -> (Request<Body>, String) {
    if rng.gen_bool(0.5) {
        let req = Request::post(format!("http://127.0.0.1:{port}/maintenance/job/{c}-{i}"))
            .body(Body::from("x"))
            .unwrap();
        (req, "maintenance".to_string())
    } else {
        let device = format!("dev-{}", rng.gen_range(0..64));
        let p = rolegate::lease::partition_index(None, &device, PARTITIONS);
        let req = Request::get(format!("http://127.0.0.1:{port}/device-api/d/{c}-{i}"))
            .header("x-device-id", &device)
            .body(Body::empty())
            .unwrap();
        (req, format!("devices:partition-{p}"))
    }
}

/// The status once the whole body arrived, or None on an error or after 5 s.
async fn send_bounded(client: &Client<HttpConnector, Body>, req: Request<Body>) -> Option<u16> {
    tokio::time::timeout(Duration::from_secs(5), async {
        let resp = client.request(req).await.ok()?;
        let status = resp.status().as_u16();
        resp.into_body().collect().await.ok()?;
        Some(status)
    })
    .await
    .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// Streams.

/// Clients keeping a long SSE stream open on a partition route.
pub const STREAM_CLIENTS: u64 = 4;

/// A stream with no event for this long is given up (a frozen gateway on
/// its way) and opened again.
const STREAM_IDLE: Duration = Duration::from_secs(3);

/// One tick a stream client received: `data: app{n} {role} {token} {t_ns}`,
/// made by app `n` at `made` (CLOCK_MONOTONIC) for a request the gateway
/// gave `role` and `token`.
#[derive(Debug, Clone)]
pub struct Tick {
    pub app: String,
    pub role: String,
    pub token: u64,
    pub made: u64,
    /// The gateway the client's stream entered through.
    pub gateway: usize,
}

/// One stream a client opened (answered 200): (gateway, opened_ns,
/// ended_ns, how it ended).
pub type StreamSpan = (usize, u64, u64, &'static str);

/// What the stream clients saw.
#[derive(Debug, Clone, Default)]
pub struct Streamed {
    pub clients: usize,
    pub streams: Vec<StreamSpan>,
    /// Attempts that got no stream (another status, an error, a timeout).
    pub refused: usize,
    pub ticks: Vec<Tick>,
    /// Events that were not ticks with a role and a token.
    pub malformed: Vec<String>,
}

/// `STREAM_CLIENTS` clients, each keeping an SSE stream of ticks open on
/// `/device-api/.../ticks` for its own device (one partition each), through
/// a random gateway that is up; when the stream ends (the gateway ended it,
/// the connection broke, or it went quiet for `STREAM_IDLE`) the client
/// opens it again after 100 ms, as an SSE client would, so balance moves
/// and faults cross open streams.
pub struct Streams {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Streamed>>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Streams {
    pub fn start(seed: u64, gws: &[Gateway]) -> Streams {
        let ports: Vec<u16> = gws.iter().map(|g| g.port).collect();
        let faulted: Vec<Arc<AtomicBool>> = gws.iter().map(|g| g.faulted.clone()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Streamed {
            clients: STREAM_CLIENTS as usize,
            ..Streamed::default()
        }));
        let mut clients = Vec::new();
        for c in 0..STREAM_CLIENTS {
            let (stop, seen, ports, faulted) =
                (stop.clone(), seen.clone(), ports.clone(), faulted.clone());
            // Devices in partitions spread over the 16.
            let device = device_in(c as u32 * PARTITIONS / STREAM_CLIENTS as u32, c);
            clients.push(tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed ^ (0x5eed_0000 + c));
                let client = cluster::client();
                while !stop.load(Ordering::SeqCst) {
                    let g = rng.gen_range(0..ports.len());
                    if faulted[g].load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    let req = Request::get(format!(
                        "http://127.0.0.1:{}/device-api/s/{c}/ticks",
                        ports[g]
                    ))
                    .header("x-device-id", &device)
                    .header("accept", "text/event-stream")
                    .body(Body::empty())
                    .unwrap();
                    match tokio::time::timeout(Duration::from_secs(5), client.request(req)).await {
                        Ok(Ok(resp)) if resp.status() == 200 => {
                            read_ticks(resp.into_body(), g, &stop, &seen).await;
                        }
                        _ => seen.lock().unwrap().refused += 1,
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }));
        }
        Streams {
            stop,
            seen,
            clients,
        }
    }

    /// Stops the clients; returns what they saw.
    pub async fn finish(self) -> Streamed {
        self.stop.store(true, Ordering::SeqCst);
        for c in self.clients {
            let _ = c.await;
        }
        let seen = self.seen.lock().unwrap().clone();
        seen
    }
}

/// A device id whose key falls in partition `p`.
fn device_in(p: u32, c: u64) -> String {
    (0..)
        .map(|i| format!("stream-{c}-{i}"))
        .find(|k| rolegate::lease::partition_index(None, k, PARTITIONS) == p)
        .unwrap()
}

/// Reads one SSE stream until it ends, goes quiet for `STREAM_IDLE`, or the
/// run stops; records its ticks and its span.
async fn read_ticks(
    mut body: hyper::body::Incoming,
    gateway: usize,
    stop: &AtomicBool,
    seen: &Mutex<Streamed>,
) {
    let opened = monotonic_ns();
    let mut pending = String::new();
    let mut quiet = Duration::ZERO;
    let step = Duration::from_millis(250);
    let how = loop {
        if stop.load(Ordering::SeqCst) {
            break "stopped by the client";
        }
        match tokio::time::timeout(step, body.frame()).await {
            Err(_) => {
                quiet += step;
                if quiet >= STREAM_IDLE {
                    break "quiet, given up by the client";
                }
            }
            Ok(Some(Ok(frame))) => {
                quiet = Duration::ZERO;
                let Some(data) = frame.data_ref() else {
                    continue;
                };
                pending.push_str(&String::from_utf8_lossy(data));
                while let Some(end) = pending.find("\n\n") {
                    let event: String = pending.drain(..end + 2).collect();
                    let mut s = seen.lock().unwrap();
                    match parse_tick(&event, gateway) {
                        Some(t) => s.ticks.push(t),
                        None => s.malformed.push(event),
                    }
                }
            }
            Ok(Some(Err(_))) => break "error",
            Ok(None) => break "eof",
        }
    };
    seen.lock()
        .unwrap()
        .streams
        .push((gateway, opened, monotonic_ns(), how));
}

pub fn parse_tick(event: &str, gateway: usize) -> Option<Tick> {
    let mut parts = event.trim().strip_prefix("data: ")?.split(' ');
    let tick = Tick {
        app: parts.next()?.to_string(),
        role: parts.next()?.to_string(),
        token: parts.next()?.parse().ok()?,
        made: parts.next()?.parse().ok()?,
        gateway,
    };
    parts.next().is_none().then_some(tick)
}

// ---------------------------------------------------------------------------
// Faults.

/// Injects faults one at a time for `secs` seconds: first every kind once in
/// order, then kinds at random; returns the faults and the windows in which
/// requests may be cut by them.
pub async fn inject_faults(
    rig: &mut Rig,
    rng: &mut StdRng,
    secs: u64,
) -> (Vec<Fault>, Vec<EdgeFault>) {
    let mut faults = Vec::new();
    let mut edge_faults: Vec<EdgeFault> = Vec::new();
    let t_end = Instant::now() + Duration::from_secs(secs);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut round = 0usize;
    while Instant::now() < t_end {
        round += 1;
        let kinds = rig.store.faults();
        let kind = kinds[if round <= kinds.len() {
            round - 1
        } else {
            rng.gen_range(0..kinds.len())
        }];
        // The gateway holding the most roles is the "holder".
        let holder = rig.holder().await;
        let start_ns = monotonic_ns();
        let victim = kind.targets_holder().then_some(holder);
        let target = inject(rig, kind, holder, rng).await.or(victim);
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
        tokio::time::sleep(Duration::from_millis(rng.gen_range(rig.store.settle_ms()))).await;
    }
    (faults, edge_faults)
}

/// Injects one fault and lifts it again; returns the gateway a network fault
/// hit (holder faults and PostgreSQL faults return None).
async fn inject(rig: &mut Rig, kind: FaultKind, holder: usize, rng: &mut StdRng) -> Option<usize> {
    let t = rig.store.timings();
    match kind {
        FaultKind::Kill => {
            let g = &mut rig.gws[holder];
            g.faulted.store(true, Ordering::SeqCst);
            g.kill();
            tokio::time::sleep(Duration::from_millis(t.duration_ms + 500)).await;
            g.spawn();
            g.wait_up().await;
            g.faulted.store(false, Ordering::SeqCst);
        }
        FaultKind::Pause => {
            let g = &rig.gws[holder];
            g.faulted.store(true, Ordering::SeqCst);
            g.signal("STOP");
            tokio::time::sleep(Duration::from_millis(t.duration_ms * 3 / 2)).await;
            g.signal("CONT");
            tokio::time::sleep(Duration::from_millis(300)).await;
            g.faulted.store(false, Ordering::SeqCst);
        }
        FaultKind::Term | FaultKind::Restart => {
            let g = &mut rig.gws[holder];
            g.faulted.store(true, Ordering::SeqCst);
            g.terminate();
            if kind == FaultKind::Term {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            g.spawn();
            g.wait_up().await;
            g.faulted.store(false, Ordering::SeqCst);
        }
        FaultKind::PgStop | FaultKind::PgFreeze | FaultKind::Latency | FaultKind::Blackhole
            if rig.servers.pg().is_none() =>
        {
            panic!("{kind:?} needs PostgreSQL");
        }
        FaultKind::PgStop => {
            let p = pg(rig);
            tokio::task::spawn_blocking(move || p.stop_server())
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            let p = pg(rig);
            tokio::task::spawn_blocking(move || p.start_server())
                .await
                .unwrap();
        }
        FaultKind::PgFreeze => {
            pg(rig).signal_all("STOP");
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            pg(rig).signal_all("CONT");
        }
        FaultKind::Latency | FaultKind::Blackhole => {
            let (mode, delay_ms) = if kind == FaultKind::Latency {
                (DELAY, 400)
            } else {
                (BLACKHOLE, 0)
            };
            if let Some(proxy) = &rig.gws[holder].proxy {
                proxy.set(mode, delay_ms);
                tokio::time::sleep(Duration::from_millis(2_000)).await;
                proxy.set(PASS, 0);
            }
            return Some(holder);
        }
        FaultKind::MemberKill | FaultKind::MemberPause => match &rig.servers {
            Servers::Etcd(cluster) => backend::member_fault(cluster, kind, rng).await,
            Servers::Postgres(_) => panic!("{kind:?} needs an etcd cluster"),
        },
    }
    None
}

/// The run's PostgreSQL (only PostgreSQL faults call this).
fn pg(rig: &Rig) -> Arc<crate::support::PrivatePostgres> {
    rig.servers.pg().cloned().expect("a PostgreSQL run")
}
