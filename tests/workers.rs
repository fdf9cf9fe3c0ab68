//! `rolegate run --workers N`: N request-serving threads, each with its own
//! `SO_REUSEPORT` listener; the kernel spreads connections over them. A
//! second process on the same port is refused, not silently let in.

mod support;

use http::StatusCode;
use support::cluster::{self, ClusterSpec, GatewayProcess, TestApp};

/// (thread id, nanoseconds on CPU) of each `rolegate-worker-*` thread.
fn worker_cpu(pid: u32) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("rolegate-worke") {
            continue;
        }
        let sched = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        let ns = sched
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        out.push((task.file_name().to_string_lossy().into_owned(), ns));
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_spread_over_every_worker_and_a_second_process_is_refused() {
    let app = TestApp::start(0).await;
    let spec = ClusterSpec::postgres("wk_spread").with_workers(3);
    let gw = GatewayProcess::start(0, &spec, &app).await;
    let before = worker_cpu(gw.pid());
    assert_eq!(before.len(), 3, "three worker threads: {before:?}");
    // New connections (Connection: close) are spread by the kernel.
    for i in 0..300 {
        let req =
            format!("GET /maintenance/{i} HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n");
        let resp = cluster::raw_exchange(gw.port, req.as_bytes()).await;
        assert_eq!(cluster::status_of(&resp), 201, "{resp}");
    }
    let after = worker_cpu(gw.pid());
    for ((tid, t0), (_, t1)) in before.iter().zip(&after) {
        assert!(
            t1 > t0,
            "worker thread {tid} served nothing: {before:?} -> {after:?}"
        );
    }
    assert_eq!(app.executed_paths().len(), 300);

    // Another gateway configured on the same port fails to start (the first
    // bound port 0: the second names the port it got).
    let text = std::fs::read_to_string(gw.config_path()).unwrap();
    let same_port = text.replacen(
        "\nlisten: 127.0.0.1:0\n",
        &format!("\nlisten: 127.0.0.1:{}\n", gw.port),
        1,
    );
    assert_ne!(same_port, text, "{text}");
    let second_config = gw.dir.join("same-port.yaml");
    std::fs::write(&second_config, same_port).unwrap();
    let second = std::process::Command::new(cluster::bin())
        .args(["run", "--workers", "2", "--config"])
        .arg(&second_config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on 127.0.0.1:{}", gw.port)),
        "{stderr}"
    );
    // The first still serves.
    let (status, _, _) = cluster::get(&format!("{}/plain", gw.url())).await.unwrap();
    assert_eq!(status, StatusCode::CREATED);
}
