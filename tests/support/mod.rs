//! Shared test support: throwaway PostgreSQL servers on their own ports,
//! a real multi-member etcd cluster (`etcd`), unique table names, waiting
//! for conditions with deadlines, and the one-holder interval checker
//! (`intervals`).
#![allow(dead_code)]

pub mod cluster;
pub mod conformance;
pub mod etcd;
pub mod events;
pub mod gateway_tls;
pub mod intervals;
pub mod tls;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// A unique, valid table name for one test.
pub fn unique_table(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("rg_{}_{}_{}", tag, std::process::id(), n)
}

/// A fresh directory for one test's files, under `$ROLEGATE_TEST_TMP`
/// (`scripts/test` points it at a directory it removes when the run ends),
/// else under the system temp dir in `rolegate-tests/`.
pub fn test_dir(tag: &str) -> PathBuf {
    let root = std::env::var_os("ROLEGATE_TEST_TMP")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("rolegate-tests"));
    let dir = root.join(unique_table(tag));
    std::fs::create_dir_all(&dir).expect("create a test directory");
    dir
}

/// A port for a store server the tests start (PostgreSQL, Redis, etcd):
/// they take a port number, and cannot bind port 0 and report what they
/// got. Gateways, test apps and anything the tests bind themselves use
/// port 0 and read the bound port back.
///
/// The port comes from outside the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`), the range every port-0 bind and every
/// outgoing connection draws from, so nothing else in the run can take it
/// between this check and the server's own bind (a port picked by binding
/// port 0 and released could be, and once was). A counter keeps the servers
/// of one test binary apart, an offset by process id keeps consecutive
/// binaries apart, and a port another program holds is skipped.
pub fn store_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (low, high) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|p| p.parse::<u32>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999));
    // The wider of the two gaps around the ephemeral range.
    let (from, to) = if low.saturating_sub(1024) >= 65535u32.saturating_sub(high) {
        (1024, low)
    } else {
        (high + 1, 65536)
    };
    let span = to - from;
    assert!(
        span >= 100,
        "no room outside the ephemeral ports {low}-{high}"
    );
    let offset = std::process::id() * 101;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (from + (offset + n) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {from}..{to}");
}

/// A loopback port that refuses connections and that nothing else can
/// take while this lives: bound, never listening.
pub struct ClosedPort {
    _socket: tokio::net::TcpSocket,
    pub port: u16,
}

pub fn closed_port() -> ClosedPort {
    let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
    socket
        .bind("127.0.0.1:0".parse().unwrap())
        .expect("bind a loopback port");
    let port = socket.local_addr().expect("bound address").port();
    ClosedPort {
        _socket: socket,
        port,
    }
}

/// Waits until `f` returns true, polling every 5 ms, or panics after `limit`.
pub async fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if f() {
            return start.elapsed();
        }
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Like [`wait_for`] with an async condition.
pub async fn wait_for_async<F, Fut>(what: &str, limit: Duration, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return start.elapsed();
        }
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The shared PostgreSQL that `scripts/test` starts (ROLEGATE_TEST_PG_URL).
/// Without it the test fails and says how to get one.
pub fn postgres_url() -> String {
    match std::env::var("ROLEGATE_TEST_PG_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "this test needs PostgreSQL: run `scripts/test` (it installs and starts a throwaway server), \
             or set ROLEGATE_TEST_PG_URL=postgres://USER@127.0.0.1:PORT/DB"
        ),
    }
}

fn pg_bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("ROLEGATE_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .filter(|p| p.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!("PostgreSQL server binaries not found under /usr/lib/postgresql: run `scripts/test` or `apt-get install -y postgresql`")
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

fn pg_command(bin: &Path, tool: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(tool));
        c
    } else {
        Command::new(bin.join(tool))
    }
}

/// A private PostgreSQL cluster that a test may stop and start (outage tests).
pub struct PrivatePostgres {
    bin: PathBuf,
    dir: PathBuf,
    pub port: u16,
}

impl PrivatePostgres {
    pub fn start() -> Self {
        let pg = Self::init();
        pg.start_server();
        pg
    }

    /// A new cluster's data directory (`initdb`), owned by `postgres` when
    /// run as root; not started.
    pub fn init() -> Self {
        let bin = pg_bin_dir();
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rolegate-pg-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        // A leftover of an earlier process with this id would stop initdb.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create pg dir");
        if is_root() {
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .map(|s| s.success());
            assert_eq!(
                ok.ok(),
                Some(true),
                "chown of {} to postgres failed",
                dir.display()
            );
        }
        let out = pg_command(&bin, "initdb")
            .args(["-A", "trust", "-U", "postgres", "-D"])
            .arg(dir.join("data"))
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self {
            bin,
            dir,
            port: store_port(),
        }
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn start_server(&self) {
        self.start_server_with("");
    }

    /// Starts the server with `extra` server options (`-c key=value ...`).
    pub fn start_server_with(&self, extra: &str) {
        let out = pg_command(&self.bin, "pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .arg("-l")
            .arg(self.dir.join("data/server.log"))
            .arg("-o")
            .arg(format!(
                "-p {} -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off {extra}",
                self.port
            ))
            .args(["-w", "start"])
            .output()
            .expect("run pg_ctl start");
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The postmaster and its children (for SIGSTOP/SIGCONT freezes).
    pub fn pids(&self) -> Vec<u32> {
        let Ok(text) = std::fs::read_to_string(self.dir.join("data/postmaster.pid")) else {
            return Vec::new();
        };
        let Some(master) = text
            .lines()
            .next()
            .and_then(|l| l.trim().parse::<u32>().ok())
        else {
            return Vec::new();
        };
        let mut pids = vec![master];
        if let Ok(rd) = std::fs::read_dir("/proc") {
            for e in rd.flatten() {
                let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                    continue;
                };
                let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                    continue;
                };
                let ppid = stat
                    .rsplit_once(") ")
                    .and_then(|(_, r)| r.split_whitespace().nth(1))
                    .and_then(|p| p.parse::<u32>().ok());
                if ppid == Some(master) {
                    pids.push(pid);
                }
            }
        }
        pids
    }

    /// Sends a signal (`STOP`, `CONT`) to every process of the cluster.
    pub fn signal_all(&self, sig: &str) {
        for pid in self.pids() {
            let _ = Command::new("kill")
                .args([&format!("-{sig}"), &pid.to_string()])
                .status();
        }
    }

    /// Stops the server at once (`-m immediate`), as a crash or outage would.
    pub fn stop_server(&self) {
        let out = pg_command(&self.bin, "pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .output()
            .expect("run pg_ctl stop");
        assert!(
            out.status.success(),
            "pg_ctl stop failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = pg_command(&self.bin, "pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The shared Redis that `scripts/test` starts (ROLEGATE_TEST_REDIS_URL).
pub fn redis_url() -> String {
    match std::env::var("ROLEGATE_TEST_REDIS_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "this test needs Redis: run `scripts/test` (it installs and starts one), \
             or set ROLEGATE_TEST_REDIS_URL=redis://127.0.0.1:PORT"
        ),
    }
}

/// The shared etcd that `scripts/test` starts (ROLEGATE_TEST_ETCD_URL).
pub fn etcd_url() -> String {
    match std::env::var("ROLEGATE_TEST_ETCD_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "this test needs etcd: run `scripts/test` (it installs and starts one), \
             or set ROLEGATE_TEST_ETCD_URL=http://127.0.0.1:PORT"
        ),
    }
}

fn require_binary(name: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/local/bin", "/usr/sbin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("`{name}` not found: run `scripts/test` (it installs etcd-server and redis-server with apt)")
}

/// A server process a test may stop and start again on the same port and data.
pub struct PrivateServer {
    program: PathBuf,
    args: Vec<String>,
    child: Option<std::process::Child>,
    dir: PathBuf,
    pub port: u16,
}

impl PrivateServer {
    /// A Redis with an append-only file, so its data survives a restart.
    pub fn redis() -> Self {
        Self::redis_with(&[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
        ])
    }

    /// A Redis that keeps nothing across a restart (`--save ''
    /// --appendonly no`), as Redis is often run.
    pub fn redis_without_persistence() -> Self {
        Self::redis_with(&["--appendonly", "no", "--save", ""])
    }

    /// A Redis without persistence that replicates the one on `primary`.
    pub fn redis_replica_of(primary: u16) -> Self {
        Self::redis_with(&[
            "--appendonly",
            "no",
            "--save",
            "",
            "--replicaof",
            "127.0.0.1",
            &primary.to_string(),
        ])
    }

    /// A Redis on a port of its own with its files in a directory of its own and
    /// `extra` options.
    fn redis_with(extra: &[&str]) -> Self {
        let port = store_port();
        let dir =
            std::env::temp_dir().join(format!("rolegate-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut args: Vec<String> = vec![
            "--port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            dir.display().to_string(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut s = Self {
            program: require_binary("redis-server"),
            args,
            child: None,
            dir,
            port,
        };
        s.start_server();
        s
    }

    /// A single-member etcd with its own data directory.
    pub fn etcd() -> Self {
        let port = store_port();
        let peer = store_port();
        let dir = std::env::temp_dir().join(format!("rolegate-etcd-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let client = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let args = vec![
            "--name".into(),
            "t".into(),
            "--data-dir".into(),
            dir.join("data").display().to_string(),
            "--listen-client-urls".into(),
            client.clone(),
            "--advertise-client-urls".into(),
            client,
            "--listen-peer-urls".into(),
            peer_url.clone(),
            "--initial-advertise-peer-urls".into(),
            peer_url.clone(),
            "--initial-cluster".into(),
            format!("t={peer_url}"),
        ];
        let mut s = Self {
            program: require_binary("etcd"),
            args,
            child: None,
            dir,
            port,
        };
        s.start_server();
        s
    }

    /// Starts `program` with `args`, its log and files in `dir`, and waits
    /// until it accepts connections on `port`.
    pub fn launch(program: PathBuf, args: Vec<String>, dir: PathBuf, port: u16) -> Self {
        let mut s = Self {
            program,
            args,
            child: None,
            dir,
            port,
        };
        s.start_server();
        s
    }

    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn start_server(&mut self) {
        let log = std::fs::File::create(self.dir.join("server.log")).unwrap();
        let child = Command::new(&self.program)
            .args(&self.args)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.program.display()));
        self.child = Some(child);
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{} did not start",
                self.program.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `sig` (`STOP`, `CONT`, ...) to the server process.
    pub fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let ok = Command::new("kill")
                .args([&format!("-{sig}"), &c.id().to_string()])
                .status()
                .unwrap();
            assert!(ok.success(), "kill -{sig} failed");
        }
    }

    /// Kills the server (SIGKILL), as a crash or outage would.
    pub fn stop_server(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        self.stop_server();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The test Python (`$ROLEGATE_TEST_PYTHON`, set by `scripts/test` to its
/// venv), checked to import `modules`; panics with how to get them.
pub fn python_with(modules: &str) -> String {
    let imports = |py: &str| {
        Command::new(py)
            .args(["-c", &format!("import {modules}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let py = std::env::var("ROLEGATE_TEST_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".into());
    assert!(
        imports(&py),
        "this test needs Python with `{modules}`: run `scripts/test` (it installs them into a venv \
         and sets ROLEGATE_TEST_PYTHON), or set ROLEGATE_TEST_PYTHON to a python that can \
         `import {modules}` (pip install grpcio h2 flask gunicorn opentelemetry-proto)"
    );
    py
}
