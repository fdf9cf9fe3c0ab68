//! Traces (`telemetry.otlp`): real gateway processes on PostgreSQL export
//! their spans over OTLP/HTTP to a real receiver, a Python server that
//! decodes them with the `opentelemetry-proto` package. A forwarded
//! request is one trace across both gateways and the app; a collector that
//! is down costs no request.

mod support;

use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use serde_json::Value;
use support::cluster::{self, ClusterSpec, GatewayProcess, TestApp};

const ROUTES: &str = "roles:
  - name: maintenance
routes:
  - prefixes: [/maintenance]
    role: maintenance
";

const SECRET: &str = "a-trace-hop-secret-of-32-bytes!!";

/// The client's own trace, sent as its `traceparent`.
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// The receiver process and the spans it has printed.
struct Receiver {
    child: Child,
    port: u16,
    spans: Arc<Mutex<Vec<Value>>>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    async fn start() -> Receiver {
        let script = format!(
            "{}/tests/support/otlp_receiver.py",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut child = Command::new(support::python_with("opentelemetry.proto"))
            .arg(script)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the OTLP receiver");
        let stdout = child.stdout.take().expect("piped stdout");
        let (port_tx, port_rx) = tokio::sync::oneshot::channel();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let sink = spans.clone();
        std::thread::spawn(move || {
            let mut lines = std::io::BufReader::new(stdout).lines();
            let first = lines.next().and_then(Result::ok).unwrap_or_default();
            let _ = port_tx.send(first);
            for line in lines.map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    sink.lock().unwrap().push(v);
                }
            }
        });
        let first = tokio::time::timeout(Duration::from_secs(30), port_rx).await;
        let port = match first {
            Ok(Ok(line)) => line
                .strip_prefix("listening ")
                .and_then(|p| p.trim().parse::<u16>().ok()),
            _ => None,
        };
        let Some(port) = port else {
            let _ = child.kill();
            panic!("the OTLP receiver reported no port ({:?})", child.wait());
        };
        Receiver { child, port, spans }
    }

    fn spans_of(&self, trace: &str) -> Vec<Value> {
        let spans = self.spans.lock().unwrap();
        spans
            .iter()
            .filter(|s| s["trace_id"] == trace)
            .cloned()
            .collect()
    }
}

fn otlp_yaml(port: u16, extra: &str) -> String {
    format!("telemetry:\n  otlp:\n    endpoint: http://127.0.0.1:{port}\n{extra}")
}

/// The trace and span ids of a `traceparent`, and its flags.
fn parts(traceparent: &str) -> (String, String, String) {
    let p: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(p.len(), 4, "{traceparent}");
    assert_eq!(p[0], "00", "{traceparent}");
    (p[1].to_string(), p[2].to_string(), p[3].to_string())
}

async fn get_with_parent(url: &str, traceparent: &str) -> StatusCode {
    answer_with_parent(url, traceparent).await.0
}

async fn answer_with_parent(url: &str, traceparent: &str) -> (StatusCode, String) {
    let req = Request::get(url)
        .header("traceparent", traceparent)
        .header("tracestate", "client=secret-state")
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = cluster::request(req).await.unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Gateway 1 forwards a client's request to gateway 0, the holder, which
/// runs it on its app. The two gateways' spans and the app's parent are one
/// trace; the client (not trusted) is a link, not the parent; each span
/// says how it was decided. With the collector gone, the same request still
/// succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_request_is_one_trace_from_both_gateways_and_the_collector_is_optional() {
    let receiver = Receiver::start().await;
    let apps = [TestApp::start(0).await, TestApp::start(1).await];
    let spec = ClusterSpec::postgres("otlp")
        .with_proxy(&format!("  cluster_secret: {SECRET}\n"))
        .with_extra(&otlp_yaml(receiver.port, "    timeout: 2s\n"));
    let g0 = GatewayProcess::start_for_upstream(0, &spec, apps[0].port, ROUTES).await;
    support::wait_for_async("gateway 0 holds", Duration::from_secs(30), || async {
        g0.held().await.get("maintenance").is_some_and(|h| h.0)
    })
    .await;
    let g1 = GatewayProcess::start_for_upstream(1, &spec, apps[1].port, ROUTES).await;
    let gws = [g0, g1];
    assert_eq!(cluster::wait_holder(&gws, "maintenance").await, 0);

    let client_parent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let status =
        get_with_parent(&format!("{}/maintenance/run", gws[1].url()), &client_parent).await;
    assert_eq!(status, StatusCode::CREATED, "{}", gws[1].log());

    // The app behind the holder saw the holder's span as its parent.
    let ran = apps[0].executed();
    let ran = ran
        .iter()
        .find(|e| e.path == "/maintenance/run")
        .expect("the holder's app ran it");
    let app_parent = ran.headers["traceparent"].to_str().unwrap().to_string();
    let (trace, holder_span, flags) = parts(&app_parent);
    assert_ne!(
        trace, CLIENT_TRACE,
        "an untrusted client's trace is not continued"
    );
    assert_eq!(flags, "01", "sampled (ratio 1)");
    assert!(
        ran.headers.get("tracestate").is_none(),
        "the client's tracestate belongs to its own trace"
    );

    let waited =
        support::wait_for_async("both gateways' spans", Duration::from_secs(60), || async {
            receiver.spans_of(&trace).len() >= 2
        })
        .await;
    let spans = receiver.spans_of(&trace);
    assert_eq!(
        spans.len(),
        2,
        "one span per gateway (after {waited:?}): {spans:#?}"
    );
    let holder = spans
        .iter()
        .find(|s| s["span_id"] == holder_span.as_str())
        .unwrap_or_else(|| panic!("the holder's span is the app's parent: {spans:#?}"));
    let forwarder = spans
        .iter()
        .find(|s| s["span_id"] != holder_span.as_str())
        .unwrap();

    // The forwarding gateway: a root of the new trace, linked to the
    // client's, forwarded to the holder's address.
    assert_eq!(forwarder["parent_span_id"], "", "{forwarder:#}");
    assert_eq!(
        forwarder["links"],
        serde_json::json!([{ "trace_id": CLIENT_TRACE, "span_id": CLIENT_SPAN }]),
        "{forwarder:#}"
    );
    let fa = &forwarder["attributes"];
    assert_eq!(fa["rolegate.decision"], "forwarded", "{forwarder:#}");
    assert_eq!(fa["rolegate.route"], "maintenance");
    assert_eq!(fa["rolegate.role"], "maintenance");
    assert_eq!(fa["rolegate.upstream_status"], 201);
    assert_eq!(fa["http.response.status_code"], 201);
    assert_eq!(fa["http.request.method"], "GET");
    assert_eq!(fa["url.path"], "/maintenance/run");
    assert!(fa["rolegate.token"].is_null(), "{forwarder:#}");
    let holder_address = fa["rolegate.holder"]
        .as_str()
        .expect("the holder's address");
    assert!(
        holder_address.contains(&gws[0].url().replace("http://", "")),
        "{holder_address} is gateway 0 ({})",
        gws[0].url()
    );
    assert_eq!(forwarder["name"], "GET maintenance");
    assert_eq!(forwarder["kind"], 2, "a server span");
    assert_eq!(forwarder["content_type"], "application/x-protobuf");

    // The holder: the forwarding gateway's span is its parent (a hop
    // verified with the cluster secret), and it ran the request here
    // under its token.
    assert_eq!(holder["parent_span_id"], forwarder["span_id"], "{holder:#}");
    assert_eq!(holder["links"], serde_json::json!([]));
    let ha = &holder["attributes"];
    assert_eq!(ha["rolegate.decision"], "local", "{holder:#}");
    assert_eq!(ha["rolegate.role"], "maintenance");
    assert_eq!(ha["rolegate.upstream_status"], 201);
    let token = gws[0].held().await["maintenance"].1;
    assert_eq!(ha["rolegate.token"], token, "{holder:#}");
    assert_eq!(
        ha["rolegate.holder"], holder["resource"]["service.instance.id"],
        "run by the instance that exported it"
    );
    assert_ne!(
        holder["resource"]["service.instance.id"],
        forwarder["resource"]["service.instance.id"]
    );
    assert_eq!(holder["resource"]["service.name"], "rolegate");
    assert!(holder["start"].as_u64() >= forwarder["start"].as_u64());

    // The collector goes away: requests are answered as before, and the
    // failed exports are counted.
    drop(receiver);
    for _ in 0..20 {
        let status =
            get_with_parent(&format!("{}/maintenance/run", gws[1].url()), &client_parent).await;
        assert_eq!(status, StatusCode::CREATED);
    }
    support::wait_for_async(
        "failed exports counted",
        Duration::from_secs(60),
        || async {
            let metrics = cluster::get(&format!("{}/metrics", gws[1].admin_url()))
                .await
                .map(|r| String::from_utf8_lossy(&r.2).to_string())
                .unwrap_or_default();
            metrics
                .lines()
                .find(|l| l.starts_with("rolegate_otlp_export_failures_total"))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .is_some_and(|n| n >= 1.0)
        },
    )
    .await;
}

/// `sample_ratio: 0` records no new trace, but a parent's "sampled" is
/// followed (`parent: always` trusts every client): the app gets the
/// gateway's context either way, with the decision in its flags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_follows_the_ratio_and_a_trusted_parent() {
    let receiver = Receiver::start().await;
    let app = TestApp::start(0).await;
    let spec = ClusterSpec::postgres("otlp_sampling").with_extra(&otlp_yaml(
        receiver.port,
        "    sample_ratio: 0\n    parent: always\n",
    ));
    let gw = GatewayProcess::start_for_upstream(0, &spec, app.port, ROUTES).await;
    support::wait_for_async("the gateway holds", Duration::from_secs(30), || async {
        gw.held().await.get("maintenance").is_some_and(|h| h.0)
    })
    .await;

    // No parent: a new trace, not sampled at a ratio of 0.
    let (status, _, _) = cluster::get(&format!("{}/maintenance/unsampled", gw.url()))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::CREATED);
    // A sampled parent, trusted: continued and recorded.
    let parent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let status = get_with_parent(&format!("{}/maintenance/sampled", gw.url()), &parent).await;
    assert_eq!(status, StatusCode::CREATED);

    let seen = |path: &str| {
        let ran = app.executed();
        let e = ran.iter().find(|e| e.path == path).expect("ran");
        parts(e.headers["traceparent"].to_str().unwrap())
    };
    let (unsampled_trace, _, unsampled_flags) = seen("/maintenance/unsampled");
    assert_eq!(unsampled_flags, "00");
    let (sampled_trace, sampled_span, sampled_flags) = seen("/maintenance/sampled");
    assert_eq!(
        sampled_trace, CLIENT_TRACE,
        "a trusted parent's trace goes on"
    );
    assert_eq!(sampled_flags, "01");
    let ran = app.executed();
    let sampled = ran
        .iter()
        .find(|e| e.path == "/maintenance/sampled")
        .unwrap();
    assert_eq!(
        sampled.headers["tracestate"], "client=secret-state",
        "a trusted parent's tracestate goes on"
    );

    support::wait_for_async("the sampled span", Duration::from_secs(60), || async {
        !receiver.spans_of(CLIENT_TRACE).is_empty()
    })
    .await;
    let spans = receiver.spans_of(CLIENT_TRACE);
    assert_eq!(spans.len(), 1, "{spans:#?}");
    assert_eq!(spans[0]["parent_span_id"], CLIENT_SPAN);
    assert_eq!(spans[0]["span_id"], sampled_span.as_str());
    // The unsampled request ended before the sampled one began, so its
    // span would have been queued first: it was never recorded.
    assert!(
        receiver.spans_of(&unsampled_trace).is_empty(),
        "{:#?}",
        receiver.spans.lock().unwrap()
    );
}

/// A request held while its role has no servable holder carries how long
/// it was held: the holder is killed, and the other gateway holds the
/// request until it takes the role, then runs it here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_request_records_its_hold_time() {
    let receiver = Receiver::start().await;
    let apps = [TestApp::start(0).await, TestApp::start(1).await];
    let spec = ClusterSpec::postgres("otlp_hold")
        .with_proxy("  hold_timeout: 20s\n")
        .with_extra(&otlp_yaml(receiver.port, ""));
    let g0 = GatewayProcess::start_for_upstream(0, &spec, apps[0].port, ROUTES).await;
    support::wait_for_async("gateway 0 holds", Duration::from_secs(30), || async {
        g0.held().await.get("maintenance").is_some_and(|h| h.0)
    })
    .await;
    let g1 = GatewayProcess::start_for_upstream(1, &spec, apps[1].port, ROUTES).await;
    let gws = [g0, g1];
    assert_eq!(cluster::wait_holder(&gws, "maintenance").await, 0);
    gws[0].signal("KILL");
    // Gone, so the request cannot reach it half-way through its death (a
    // request that may have been sent is not sent again).
    support::wait_for_async("gateway 0 exited", Duration::from_secs(30), || async {
        !gws[0].child_alive()
    })
    .await;
    // Its listening sockets may take a moment longer to go than the process.
    let port = gws[0].port;
    support::wait_for_async(
        "its port refuses connections",
        Duration::from_secs(30),
        || async { std::net::TcpStream::connect(("127.0.0.1", port)).is_err() },
    )
    .await;
    let (status, body) = answer_with_parent(
        &format!("{}/maintenance/after-crash", gws[1].url()),
        &format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let ran = apps[1].executed();
    let ran = ran
        .iter()
        .find(|e| e.path == "/maintenance/after-crash")
        .expect("gateway 1 ran it once it took the role");
    let (trace, span, _) = parts(ran.headers["traceparent"].to_str().unwrap());
    support::wait_for_async(
        "the held request's span",
        Duration::from_secs(60),
        || async { !receiver.spans_of(&trace).is_empty() },
    )
    .await;
    let spans = receiver.spans_of(&trace);
    assert_eq!(spans.len(), 1, "{spans:#?}");
    assert_eq!(spans[0]["span_id"], span.as_str());
    let a = &spans[0]["attributes"];
    assert_eq!(a["rolegate.decision"], "local", "{a:#}");
    let held = a["rolegate.hold_ms"].as_f64().expect("a hold time");
    assert!(held > 0.0, "{a:#}");
    let token = gws[1].held().await["maintenance"].1;
    assert_eq!(a["rolegate.token"], token, "{a:#}");
}
