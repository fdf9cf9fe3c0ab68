//! gRPC through a forwarded hop, with a real gRPC client and server that
//! nobody here wrote (Python grpcio): two gateways with `upstream.protocol:
//! h2c` on PostgreSQL, every call sent to the non-holder. Unary, server
//! streaming (messages arrive as sent), bidirectional streaming, status and
//! trailers, deadline propagation, and a holder that is gone (UNAVAILABLE,
//! not a hang).

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::cluster::{self, ClusterSpec, GatewayProcess};

const ROUTES: &str =
    "roles:\n  - name: maintenance\nroutes:\n  - prefixes: [/rg.Test]\n    role: maintenance\n";

/// One grpcio server process, killed on drop.
struct GrpcApp {
    child: Child,
    port: u16,
}

impl Drop for GrpcApp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rig_script() -> String {
    format!("{}/tests/support/grpc_rig.py", env!("CARGO_MANIFEST_DIR"))
}

/// Starts a grpcio server on port 0; it prints the port it bound once it
/// serves.
async fn start_app(name: &str) -> GrpcApp {
    let mut child = Command::new(support::python_with("grpc"))
        .args([&rig_script(), "serve", "0", name])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the grpcio server");
    let stdout = child.stdout.take().expect("piped stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).map(|_| line)
    });
    let line = tokio::time::timeout(Duration::from_secs(15), line).await;
    let port = match line {
        Ok(Ok(Ok(line))) => line.trim().parse::<u16>().ok(),
        _ => None,
    };
    let Some(port) = port else {
        let _ = child.kill();
        panic!("the grpcio server reported no port ({:?})", child.wait());
    };
    GrpcApp { child, port }
}

/// Runs one client case against `port` and returns its JSON report.
async fn call(port: u16, case: &str) -> Value {
    let python = support::python_with("grpc");
    let target = format!("127.0.0.1:{port}");
    let case = case.to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .args([&rig_script(), "call", &target, &case])
            .output()
            .expect("run the grpcio client")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "client printed no JSON: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

struct Rig {
    apps: Vec<GrpcApp>,
    gws: Vec<GatewayProcess>,
    holder: usize,
}

impl Rig {
    async fn start(tag: &str, peers_yaml: &str) -> Rig {
        let apps = vec![start_app("app0").await, start_app("app1").await];
        let mut spec = ClusterSpec::postgres(tag).with_extra(peers_yaml);
        spec.upstream_yaml.push_str("  protocol: h2c\n");
        let (a, b) = tokio::join!(
            GatewayProcess::start_for_upstream(0, &spec, apps[0].port, ROUTES),
            GatewayProcess::start_for_upstream(1, &spec, apps[1].port, ROUTES)
        );
        let gws = vec![a, b];
        let holder = cluster::wait_holder(&gws, "maintenance").await;
        Rig { apps, gws, holder }
    }

    fn other_port(&self) -> u16 {
        self.gws[1 - self.holder].port
    }

    fn holder_name(&self) -> String {
        format!("app{}", self.holder)
    }
}

async fn unary_streaming_status_and_deadlines_through_a_hop(rig: &Rig) {
    let port = rig.other_port();
    let unary = call(port, "unary").await;
    assert_eq!(unary["app"], rig.holder_name(), "{unary}");
    assert_eq!(unary["echo"], "hello");
    assert_eq!(
        unary["role"], "maintenance",
        "the holder's gateway marked the call"
    );
    // An ungated service runs on the gateway's own app.
    let local = call(port, "local").await;
    assert_eq!(local["app"], format!("app{}", 1 - rig.holder), "{local}");

    // Server streaming: each message arrives while the stream is still open.
    let stream = call(port, "stream").await;
    let msgs = stream["messages"].as_array().expect("messages").clone();
    assert_eq!(msgs.len(), 5, "{stream}");
    for m in &msgs {
        assert_eq!(m["app"], rig.holder_name());
        let delay = m["received"].as_f64().unwrap() - m["sent"].as_f64().unwrap();
        assert!(
            delay < 0.3,
            "message {} arrived {delay:.3}s after it was sent: buffered",
            m["i"]
        );
    }

    // Bidirectional ping-pong: only passes if both directions stream.
    let bidi = call(port, "bidi").await;
    let h = rig.holder_name();
    let expected: Vec<String> = (0..4).map(|i| format!("{h}:m{i}")).collect();
    assert_eq!(bidi["replies"], serde_json::json!(expected), "{bidi}");

    // Status, message and trailers come back end to end.
    let fail = call(port, "fail").await;
    assert_eq!(fail["error"]["code"], "NOT_FOUND", "{fail}");
    assert_eq!(fail["error"]["details"], format!("no such thing at {h}"));
    assert_eq!(fail["error"]["trailers"]["x-detail"], format!("kept-{h}"));

    // The client's deadline reaches the server, and is enforced.
    let deadline = call(port, "deadline").await;
    let remaining = deadline["remaining"].as_f64().expect("time_remaining");
    assert!(remaining > 2.0 && remaining <= 4.0, "{deadline}");
    assert_eq!(deadline["error"]["code"], "DEADLINE_EXCEEDED", "{deadline}");
    assert!(deadline["elapsed"].as_f64().unwrap() < 2.5, "{deadline}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_unary_streaming_status_and_deadlines_pass_a_forwarded_hop() {
    let rig = Rig::start("grpc_h1", "").await;
    unary_streaming_status_and_deadlines_through_a_hop(&rig).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_holder_gives_grpc_unavailable_not_a_hang() {
    let mut rig = Rig::start("grpc_gone", "").await;
    assert_eq!(
        call(rig.other_port(), "unary").await["app"],
        rig.holder_name()
    );
    // The holder's gateway dies without a word; its lease is still live.
    let _ = rig.gws[rig.holder].child.kill();
    let _ = rig.gws[rig.holder].child.wait();
    let gone = call(rig.other_port(), "gone").await;
    assert_eq!(gone["error"]["code"], "UNAVAILABLE", "{gone}");
    assert!(gone["elapsed"].as_f64().unwrap() < 5.0, "{gone}");
    let details = gone["error"]["details"].as_str().unwrap_or_default();
    assert!(details.contains("maintenance"), "{gone}");
    drop(rig.apps.drain(..));
}
