//! Clients that ask for large responses and never read them hold at most a
//! bounded amount of the gateway's memory, whatever window they advertise,
//! and give it back when they go: 8 HTTP/2 connections of 100 streams each
//! with 2^31-1 windows, and 400 HTTP/1 connections. A normal request is
//! answered meanwhile. The figures go to stderr (docs/benchmarks.md
//! quotes them); the bounds asserted are the ones docs/proxy.md states.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::cluster::{self, ClusterSpec, GatewayProcess, TestApp};

/// A response far larger than any buffer: 64 MiB.
const BIG: &str = "/big/download?bytes=67108864";

/// Peak RSS of the gateway while `attack` lasts (sampled until it has not
/// grown for 2 s, at most 15 s), in KiB.
async fn peak_rss(gw: &GatewayProcess) -> u64 {
    let mut peak = gw.rss_kib();
    let mut grew = Instant::now();
    let start = Instant::now();
    while grew.elapsed() < Duration::from_secs(2) && start.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = gw.rss_kib();
        if now > peak + 1024 {
            grew = Instant::now();
        }
        peak = peak.max(now);
    }
    peak
}

/// RSS once the clients left, in KiB: the lowest reading within 5 s of
/// their going (sooner once it is back within 8 MiB of `before`).
async fn settled_rss(gw: &GatewayProcess, before: u64) -> u64 {
    let start = Instant::now();
    let mut low = gw.rss_kib();
    while low > before + 8 * 1024 && start.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        low = low.min(gw.rss_kib());
    }
    low
}

/// A normal request during the attack: answered, and how long it took.
async fn normal_request(gw: &GatewayProcess) -> Duration {
    let started = Instant::now();
    let (status, _, _) = cluster::get(&format!("{}/plain/x", gw.url()))
        .await
        .expect("a normal request during the attack");
    assert!(status.is_success(), "{status}");
    started.elapsed()
}

/// What may stay above the level before once the clients left: memory
/// the allocator keeps for reuse.
const AFTER_MIB: u64 = 64;

/// Prints the figures of an attack and checks that RSS (KiB: before, at
/// peak, after) rose at most `peak_mib` at peak and `AFTER_MIB` after.
fn check_bounds(
    what: &str,
    (before, peak, after): (u64, u64, u64),
    during: Duration,
    peak_mib: u64,
) {
    let mib = |kib: u64| kib.saturating_sub(before) / 1024;
    eprintln!(
        "figures: {what}: RSS {} MiB before, +{} MiB at peak, +{} MiB after; a normal request meanwhile took {during:?}",
        before / 1024,
        mib(peak),
        mib(after)
    );
    assert!(
        peak <= before + peak_mib * 1024,
        "{what}: peak +{} MiB",
        mib(peak)
    );
    assert!(
        after <= before + AFTER_MIB * 1024,
        "{what}: RSS stayed +{} MiB after the clients left",
        mib(after)
    );
}

async fn warmed_gateway(tag: &str) -> (TestApp, GatewayProcess) {
    let app = TestApp::start(1).await;
    let gw = GatewayProcess::start(1, &ClusterSpec::postgres(tag), &app).await;
    for _ in 0..20 {
        normal_request(&gw).await;
    }
    (app, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_that_never_read_hold_a_bounded_share_of_memory() {
    let (_app, gw) = warmed_gateway("never_read_h2").await;
    let before = gw.rss_kib();
    let python = support::python_with("h2");
    let script = format!("{}/tests/support/h2_attack.py", env!("CARGO_MANIFEST_DIR"));
    let mut attack = Command::new(python)
        .arg(script)
        .args(["never-read", &gw.port.to_string(), "8", "100", BIG])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(attack.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("\"opened\": 800"), "{line}");
    let peak = peak_rss(&gw).await;
    let during = normal_request(&gw).await;
    drop(attack.stdin.take());
    let _ = attack.wait();
    let after = settled_rss(&gw, before).await;
    check_bounds(
        "HTTP/2, 8 connections x 100 streams never read",
        (before, peak, after),
        during,
        128,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_clients_that_never_read_hold_a_bounded_share_of_memory() {
    let (_app, gw) = warmed_gateway("never_read_h1").await;
    let before = gw.rss_kib();
    let mut clients = Vec::new();
    for _ in 0..400 {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
        write!(s, "GET {BIG} HTTP/1.1\r\nHost: gw.test\r\n\r\n").unwrap();
        clients.push(s);
    }
    let peak = peak_rss(&gw).await;
    let during = normal_request(&gw).await;
    drop(clients);
    let after = settled_rss(&gw, before).await;
    check_bounds(
        "HTTP/1, 400 connections never read",
        (before, peak, after),
        during,
        96,
    );
}

/// With the process's budget of unread response bytes full, the clients
/// that have waited longest are closed, counted, and a client that reads
/// gets its whole download meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_unread_budget_closes_the_slowest_readers_and_serves_readers() {
    let app = TestApp::start(1).await;
    let spec = ClusterSpec::postgres("never_read_budget").with_proxy("  max_unread_mib: 1\n");
    let gw = GatewayProcess::start(1, &spec, &app).await;
    let mut clients = Vec::new();
    for _ in 0..200 {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", gw.port)).unwrap();
        write!(s, "GET {BIG} HTTP/1.1\r\nHost: gw.test\r\n\r\n").unwrap();
        clients.push(s);
    }
    let closed = || async {
        let (_, _, body) = cluster::get(&format!("{}/metrics", gw.admin_url()))
            .await
            .unwrap();
        String::from_utf8_lossy(&body)
            .lines()
            .find_map(|l| l.strip_prefix("rolegate_slow_readers_closed_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    support::wait_for_async(
        "slow readers closed by the budget",
        Duration::from_secs(30),
        || async { closed().await > 0.0 },
    )
    .await;
    // A client that reads gets all of a 16 MiB download meanwhile.
    let (status, _, body) = cluster::get(&format!("{}/big/download?bytes=16777216", gw.url()))
        .await
        .unwrap();
    assert!(status.is_success(), "{status}");
    assert_eq!(body.len(), 16 << 20);
    eprintln!(
        "figures: budget 1 MiB, 200 unread connections: {} closed as the slowest readers",
        closed().await
    );
    drop(clients);
}
