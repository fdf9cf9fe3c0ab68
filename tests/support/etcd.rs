//! A real etcd cluster on loopback for tests: `n` members on ports of their own,
//! data under [`super::test_dir`], with per-member kill, restart, SIGSTOP
//! and SIGCONT. Dropping the cluster kills every member and removes its
//! files (a failing test keeps them, for the members' logs). Needs the `etcd` binary (`scripts/test` installs it); without it
//! [`EtcdCluster::start`] fails and says so.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::Request;

use super::cluster;

/// One member: its ports, files and process.
pub struct EtcdMember {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    data: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
}

impl EtcdMember {
    /// `http://127.0.0.1:{client port}`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    /// Whether the process runs and is not stopped.
    pub fn is_up(&self) -> bool {
        self.child.is_some() && !self.paused
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args([&format!("-{sig}"), &c.id().to_string()])
                .status();
        }
    }
}

/// A cluster of etcd members on loopback.
pub struct EtcdCluster {
    pub members: Vec<EtcdMember>,
    program: PathBuf,
    initial: String,
    token: String,
    dir: PathBuf,
}

impl EtcdCluster {
    /// Starts `n` members with etcd's default timings (heartbeat 100 ms,
    /// election timeout 1 s) and waits until the cluster takes writes.
    pub async fn start(n: usize) -> EtcdCluster {
        let program = super::require_binary("etcd");
        let dir = super::test_dir("etcd_cluster");
        let members: Vec<EtcdMember> = (0..n)
            .map(|i| EtcdMember {
                name: format!("m{i}"),
                client_port: super::store_port(),
                peer_port: super::store_port(),
                data: dir.join(format!("m{i}")),
                log: dir.join(format!("m{i}.log")),
                child: None,
                paused: false,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let token = dir
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut c = EtcdCluster {
            members,
            program,
            initial,
            token,
            dir,
        };
        for i in 0..n {
            c.spawn(i);
        }
        c.wait_writable(Duration::from_secs(30)).await;
        c
    }

    fn spawn(&mut self, i: usize) {
        let m = &self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .expect("open the etcd member's log");
        let err = log.try_clone().expect("clone the log handle");
        let child = Command::new(&self.program)
            .args(["--name", &m.name, "--data-dir"])
            .arg(&m.data)
            .args(["--listen-client-urls", &m.url()])
            .args(["--advertise-client-urls", &m.url()])
            .args(["--listen-peer-urls", &m.peer_url()])
            .args(["--initial-advertise-peer-urls", &m.peer_url()])
            .args(["--initial-cluster", &self.initial])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.token])
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.program.display()));
        self.members[i].child = Some(child);
        self.members[i].paused = false;
    }

    /// Every member's client URL, comma-separated, in member order.
    pub fn endpoints(&self) -> String {
        self.endpoints_from(0)
    }

    /// Every member's client URL, starting with member `first`.
    pub fn endpoints_from(&self, first: usize) -> String {
        let n = self.members.len();
        (0..n)
            .map(|k| self.members[(first + k) % n].url())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Kills member `i` (SIGKILL), as a crash would.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.members[i].paused = false;
    }

    /// Starts a killed member again on its ports and data.
    pub fn restart(&mut self, i: usize) {
        assert!(self.members[i].child.is_none(), "member {i} still runs");
        self.spawn(i);
    }

    /// Freezes member `i` (SIGSTOP): it keeps accepting TCP connections but
    /// never answers.
    pub fn pause(&mut self, i: usize) {
        self.members[i].signal("STOP");
        self.members[i].paused = true;
    }

    /// Lets a frozen member run again (SIGCONT).
    pub fn resume(&mut self, i: usize) {
        self.members[i].signal("CONT");
        self.members[i].paused = false;
    }

    /// POSTs a JSON body to a member's gRPC gateway, with a short deadline.
    async fn post(&self, i: usize, path: &str, body: &str) -> Option<serde_json::Value> {
        let req = Request::post(format!("{}{path}", self.members[i].url()))
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .ok()?;
        let answer = tokio::time::timeout(Duration::from_millis(500), cluster::request(req));
        match answer.await {
            Ok(Ok((status, _, bytes))) if status.is_success() => {
                serde_json::from_slice(&bytes).ok()
            }
            _ => None,
        }
    }

    /// The member that is leader by its own account, if one answers so.
    pub async fn leader(&self) -> Option<usize> {
        for (i, m) in self.members.iter().enumerate() {
            if !m.is_up() {
                continue;
            }
            let Some(v) = self.post(i, "/v3/maintenance/status", "{}").await else {
                continue;
            };
            if v["leader"].is_string() && v["leader"] == v["header"]["member_id"] {
                return Some(i);
            }
        }
        None
    }

    /// Waits for a leader, or panics after `limit`.
    pub async fn wait_leader(&self, limit: Duration) -> usize {
        let start = Instant::now();
        loop {
            if let Some(i) = self.leader().await {
                return i;
            }
            assert!(start.elapsed() < limit, "no etcd leader after {limit:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether a write through any running member succeeds now.
    pub async fn writable(&self) -> bool {
        // key "rolegate-probe", value "x", base64 as the gateway wants them
        let body = r#"{"key":"cm9sZWdhdGUtcHJvYmU=","value":"eA=="}"#;
        for (i, m) in self.members.iter().enumerate() {
            if m.is_up() && self.post(i, "/v3/kv/put", body).await.is_some() {
                return true;
            }
        }
        false
    }

    /// Waits until the cluster takes writes (a quorum and a leader); returns
    /// how long that took, or panics after `limit` with the members' logs.
    pub async fn wait_writable(&self, limit: Duration) -> Duration {
        let start = Instant::now();
        loop {
            if self.writable().await {
                return start.elapsed();
            }
            if start.elapsed() > limit {
                let logs: String = self
                    .members
                    .iter()
                    .map(|m| {
                        let text = std::fs::read_to_string(&m.log).unwrap_or_default();
                        let tail: Vec<&str> = text.lines().rev().take(15).collect();
                        format!("--- {} ---\n{}\n", m.name, tail.join("\n"))
                    })
                    .collect();
                panic!("the etcd cluster took no write within {limit:?}; logs:\n{logs}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        if std::thread::panicking() {
            // A failed test keeps the members' logs.
            eprintln!("etcd cluster logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
