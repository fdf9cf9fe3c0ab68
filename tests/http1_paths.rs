//! The HTTP/1.1 fast path and the full stack, side by side: the same
//! requests, one taken by each path, must reach the app as the same request
//! and come back to the client as the same answer.
//!
//! A real gateway process on SQLite in front of a raw app that records
//! each request head byte for byte and answers by path: a length-framed
//! body, a chunked one, 204, 304, a HEAD, an answer framed by closing the
//! connection, an interim 103 before the answer, and one with fields the
//! client must not get. Each request goes once as sent (the fast path
//! keeps the case of its field names) and once with an `X-Forwarded-For`
//! from an untrusted client (which the stack removes, so the app sees the
//! same request, but which only the stack handles: its field names arrive
//! lowercase).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::cluster::{ClusterSpec, GatewayProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const ROUTES: &str = "roles:
  - name: maintenance
routes:
  - prefixes: [/maintenance]
    role: maintenance
";

/// Request heads as the app read them, in order, each with the number of
/// the app connection it came on.
type Heads = Arc<Mutex<Vec<(usize, String)>>>;

/// The app's answer to `path`: the raw bytes, and whether it closes after.
fn answer(path: &str, head_request: bool) -> (Vec<u8>, bool) {
    let body = b"0123456789abcdef";
    let plain = |extra: &str| {
        let mut a = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{extra}Content-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        if !head_request {
            a.extend_from_slice(body);
        }
        a
    };
    let end = path.rsplit('/').next().unwrap_or("");
    match end {
        "chunked" => (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-App: 1\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n".to_vec(),
            false,
        ),
        "nocontent" => (b"HTTP/1.1 204 No Content\r\nX-App: 2\r\n\r\n".to_vec(), false),
        "notmodified" => (
            b"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n".to_vec(),
            false,
        ),
        "closing" => (
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nX-App: 3\r\n\r\nuntil the end".to_vec(),
            true,
        ),
        "interim" => {
            let mut a = b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n".to_vec();
            a.extend(plain(""));
            (a, false)
        }
        // Reads the request, then closes without a word.
        "hangup" => (Vec::new(), true),
        // An event stream that sends one event and then waits.
        "stream" => (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\nd\r\ndata: first\n\n\r\n".to_vec(),
            false,
        ),
        "hopfields" => (
            plain("Keep-Alive: timeout=5\r\nConnection: X-Secret\r\nX-Secret: 1\r\nX-Rolegate-Refused: forged\r\nProxy-Authenticate: Basic\r\n"),
            false,
        ),
        _ => (plain("Cache-Control: no-store\r\n"), false),
    }
}

/// An HTTP/1.1 app that records each head and answers by path; requests
/// carry no body here.
async fn raw_app(heads: Heads) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut accepted = 0;
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            accepted += 1;
            let conn = accepted;
            let heads = heads.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end);
                    let line = head.lines().next().unwrap_or("").to_string();
                    let mut parts = line.split(' ');
                    let method = parts.next().unwrap_or("");
                    let path = parts.next().unwrap_or("").to_string();
                    heads.lock().unwrap().push((conn, head));
                    if path.ends_with("/slow") {
                        // Past the fast path's wait before it watches the client.
                        tokio::time::sleep(Duration::from_millis(300)).await;
                    }
                    let (bytes, close) = answer(&path, method == "HEAD");
                    if s.write_all(&bytes).await.is_err() || close {
                        return;
                    }
                    if path.ends_with("/stream") {
                        // Held open until the gateway closes it.
                        let mut rest = [0u8; 64];
                        while let Ok(n) = s.read(&mut rest).await {
                            if n == 0 {
                                break;
                            }
                        }
                        heads.lock().unwrap().push((conn, "CLOSED".into()));
                        return;
                    }
                }
            });
        }
    });
    port
}

/// The fields of a head, names lowercased, in order; the request line.
fn fields(head: &str) -> (String, Vec<(String, String)>) {
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or("").to_string();
    let f = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    (first, f)
}

/// One exchange on a fresh connection: the raw answer, read to the close.
async fn exchange(port: u16, request: &str) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "no answer to {request:?}");
    out
}

/// An answer as a client reads it: status, fields (lowercase names, in
/// order, without `date`, the framing fields and `connection`), and the
/// body with chunked framing removed.
fn read_answer(raw: &[u8]) -> (String, Vec<(String, String)>, Vec<u8>) {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(raw)))
        + 4;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let (status, all) = fields(&head);
    let chunked = all.iter().any(|(n, _)| n == "transfer-encoding");
    let kept = all
        .into_iter()
        .filter(|(n, _)| {
            !matches!(
                n.as_str(),
                "date" | "transfer-encoding" | "content-length" | "connection"
            )
        })
        .collect();
    let mut body = raw[end..].to_vec();
    if chunked {
        let mut out = Vec::new();
        let mut rest = &body[..];
        loop {
            let line_end = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap().trim(), 16)
                    .unwrap();
            rest = &rest[line_end + 2..];
            if size == 0 {
                break;
            }
            out.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
        body = out;
    }
    (status, kept, body)
}

/// A spec on its own SQLite store. `stack` turns the access log on, which
/// keeps the fast path off: that gateway serves every request through the
/// full stack. Gateways of both kinds are named `gw0`, `gw1`, ... so the
/// fields that name them read the same.
fn spec(tag: &str, stack: bool) -> ClusterSpec {
    let dir = support::test_dir(tag);
    let url = format!("sqlite://{}/leases.db", dir.display());
    let spec = ClusterSpec::store("sqlite", &url, tag)
        .with_proxy("  cluster_secret: differential-secret-0123\n");
    match stack {
        true => spec.with_extra("telemetry:\n  access_log:\n    format: json\n    to: stderr\n"),
        false => spec,
    }
}

fn port_of(gw: &GatewayProcess) -> u16 {
    gw.url().rsplit(':').next().unwrap().parse().unwrap()
}

/// `text` with each instance id (`gw0-1a2b3c4d`: the name and a random
/// suffix) cut to its name, so two gateways of one name read the same.
fn unnamed(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("gw") {
        let (before, at) = rest.split_at(i);
        out.push_str(before);
        let b = at.as_bytes();
        let id = b.len() >= 12
            && b[2].is_ascii_digit()
            && b[3] == b'-'
            && b[4..12].iter().all(u8::is_ascii_hexdigit);
        if id {
            out.push_str(&at[..3]);
            rest = &at[12..];
        } else {
            out.push_str("gw");
            rest = &at[2..];
        }
    }
    out.push_str(rest);
    out
}

/// A metric of a gateway without labels (0 when it has none yet).
async fn metric(gw: &GatewayProcess, name: &str) -> f64 {
    let (_, _, body) = support::cluster::get(&format!("{}/metrics", gw.admin_url()))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&body);
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// `rolegate_fast_path_requests_total` of a gateway.
async fn fast_count(gw: &GatewayProcess) -> u64 {
    metric(gw, "rolegate_fast_path_requests_total").await as u64
}

/// The ways each case is sent: as a plain client would, which the fast
/// path writes from the bytes received; and with fields the gateway
/// removes or rewrites (an untrusted `X-Forwarded-For`, a field named in
/// `Connection`, a forged rolegate field), which it prepares as the stack
/// does.
fn variants(method: &str, target: &str) -> [String; 2] {
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: app.example\r\nUser-Agent: paths-test\r\nAccept: */*\r\n"
    );
    [
        format!("{head}Connection: close\r\n\r\n"),
        format!(
            "{head}X-Forwarded-For: 10.9.9.9\r\nX-Drop: 1\r\nX-Rolegate-Token: 99\r\nConnection: close, X-Drop\r\n\r\n"
        ),
    ]
}

/// Sends each case to `fast` and to `stack` (which both reach the app
/// behind `heads`) and asserts that the app saw the same request and the
/// client got the same answer, and that the fast path answered each one
/// at every gateway in `took` (the ones it crossed).
async fn differential(
    heads: &Heads,
    (fast, stack): (&GatewayProcess, &GatewayProcess),
    took: &[&GatewayProcess],
    cases: &[(&str, &str)],
) {
    for (method, target) in cases {
        for request in variants(method, target) {
            let counted: Vec<u64> =
                futures_util::future::join_all(took.iter().map(|g| fast_count(g))).await;
            let before = heads.lock().unwrap().len();
            let fast_answer = exchange(port_of(fast), &request).await;
            let after_fast = heads.lock().unwrap().len();
            let stack_answer = exchange(port_of(stack), &request).await;
            let seen: Vec<String> = heads.lock().unwrap()[before..]
                .iter()
                .map(|(_, h)| unnamed(h))
                .collect();
            assert_eq!(
                (after_fast - before, seen.len()),
                (1, 2),
                "{method} {target}: {seen:#?}"
            );
            for (g, was) in took.iter().zip(counted) {
                assert_eq!(
                    fast_count(g).await,
                    was + 1,
                    "{method} {target}: the fast path did not answer it at {}\n{request}",
                    g.url()
                );
            }
            assert_eq!(
                fields(&seen[0]),
                fields(&seen[1]),
                "{method} {target}: the app saw two requests\n{request}"
            );
            let (fast_status, fast_fields, fast_body) = read_answer(&fast_answer);
            let (stack_status, stack_fields, stack_body) = read_answer(&stack_answer);
            assert_eq!(
                (&fast_status, &fast_fields, &fast_body),
                (&stack_status, &stack_fields, &stack_body),
                "{method} {target}: the client got two answers\nfast: {}\nstack: {}",
                String::from_utf8_lossy(&fast_answer),
                String::from_utf8_lossy(&stack_answer)
            );
        }
    }
}

const CASES: [(&str, &str); 11] = [
    ("GET", "/maintenance/plain"),
    ("GET", "/maintenance/chunked"),
    ("GET", "/maintenance/nocontent"),
    ("GET", "/maintenance/notmodified"),
    ("HEAD", "/maintenance/plain"),
    ("GET", "/maintenance/closing"),
    ("GET", "/maintenance/interim"),
    ("GET", "/maintenance/hopfields"),
    ("DELETE", "/maintenance/plain?x=1&y=%20"),
    ("GET", "/ungated/plain"),
    ("GET", "/ungated/chunked"),
];

async fn holding(gw: &GatewayProcess) {
    support::wait_for_async("the gateway holds", Duration::from_secs(30), || async {
        gw.held().await.get("maintenance").is_some_and(|h| h.0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_paths_give_the_app_the_same_request_and_the_client_the_same_answer() {
    let heads: Heads = Arc::default();
    let app_port = raw_app(heads.clone()).await;
    let fast =
        GatewayProcess::start_for_upstream(0, &spec("paths_fast", false), app_port, ROUTES).await;
    let stack =
        GatewayProcess::start_for_upstream(0, &spec("paths_stack", true), app_port, ROUTES).await;
    holding(&fast).await;
    holding(&stack).await;
    differential(&heads, (&fast, &stack), &[&fast], &CASES).await;
    // The app's fields named in `Connection`, its hop-by-hop fields and a
    // forged hop refusal never reach the client, on either path.
    for gw in [&fast, &stack] {
        let hop = exchange(
            port_of(gw),
            "GET /maintenance/hopfields HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
        )
        .await;
        let (_, f, _) = read_answer(&hop);
        for name in [
            "x-secret",
            "keep-alive",
            "x-rolegate-refused",
            "proxy-authenticate",
        ] {
            assert!(f.iter().all(|(n, _)| n != name), "{name} in {f:?}");
        }
    }
}

/// A request forwarded to the holder: through two fast gateways (the
/// forwarder's hop and the holder's admission both on the fast path) and
/// through two stack gateways, the app sees the same request (the same
/// forwarding chain, the holder's role and token) and the client the same
/// answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_request_is_the_same_on_both_paths() {
    let heads: Heads = Arc::default();
    let app_port = raw_app(heads.clone()).await;
    let (fast_spec, stack_spec) = (spec("paths_fwd_fast", false), spec("paths_fwd_stack", true));
    let fast_holder = GatewayProcess::start_for_upstream(0, &fast_spec, app_port, ROUTES).await;
    let stack_holder = GatewayProcess::start_for_upstream(0, &stack_spec, app_port, ROUTES).await;
    holding(&fast_holder).await;
    holding(&stack_holder).await;
    let fast = GatewayProcess::start_for_upstream(1, &fast_spec, app_port, ROUTES).await;
    let stack = GatewayProcess::start_for_upstream(1, &stack_spec, app_port, ROUTES).await;
    for gw in [&fast, &stack] {
        support::wait_for_async(
            "the forwarder knows the holder",
            Duration::from_secs(30),
            || async {
                gw.held()
                    .await
                    .get("maintenance")
                    .is_some_and(|h| !h.0 && h.1 > 0)
            },
        )
        .await;
    }
    let gated: Vec<_> = CASES
        .iter()
        .copied()
        .filter(|(_, t)| t.starts_with("/maintenance"))
        .collect();
    differential(&heads, (&fast, &stack), &[&fast, &fast_holder], &gated).await;
    // The hop crossed both: the holder's Via names the forwarder.
    let last = heads.lock().unwrap().last().unwrap().1.clone();
    assert!(last.contains("rolegate (gw1-"), "{last}");
}

/// Keep-alive on the fast path: requests on one client connection go out
/// on one app connection, one after another, and pipelined requests are
/// answered in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_client_is_answered_in_order_on_one_app_connection() {
    let heads: Heads = Arc::default();
    let app_port = raw_app(heads.clone()).await;
    let dir = support::test_dir("http1_paths_keepalive");
    let url = format!("sqlite://{}/leases.db", dir.display());
    let spec = ClusterSpec::store("sqlite", &url, "paths_ka");
    let gw = GatewayProcess::start_for_upstream(0, &spec, app_port, ROUTES).await;
    support::wait_for_async("the gateway holds", Duration::from_secs(30), || async {
        gw.held().await.get("maintenance").is_some_and(|h| h.0)
    })
    .await;
    let port: u16 = gw.url().rsplit(':').next().unwrap().parse().unwrap();
    let one = |path: &str, last: bool| {
        format!(
            "GET {path} HTTP/1.1\r\nHost: h\r\n{}\r\n",
            if last { "Connection: close\r\n" } else { "" }
        )
    };
    // Three requests written at once (pipelined).
    let request = [
        one("/maintenance/chunked", false),
        one("/maintenance/plain", false),
        one("/ungated/nocontent", true),
    ]
    .concat();
    let raw = exchange(port, &request).await;
    let text = String::from_utf8_lossy(&raw);
    let statuses: Vec<&str> = text
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| &text[i + 9..i + 12])
        .collect();
    assert_eq!(statuses, ["200", "200", "204"], "{text}");
    assert!(
        text.contains("hello world") || text.contains("5\r\nhello\r\n6\r\n world"),
        "{text}"
    );
    let seen = heads.lock().unwrap().clone();
    let paths: Vec<&str> = seen
        .iter()
        .map(|(_, h)| h.split(' ').nth(1).unwrap_or(""))
        .collect();
    assert_eq!(
        paths,
        [
            "/maintenance/chunked",
            "/maintenance/plain",
            "/ungated/nocontent"
        ]
    );
    assert!(
        seen.iter().all(|(_, h)| h.contains("\r\nHost: h\r\n")),
        "all on the fast path: {seen:#?}"
    );
    assert!(
        seen.iter().all(|(c, _)| *c == seen[0].0),
        "one app connection: {seen:#?}"
    );
}

/// A GET on a kept app connection that the app reads and then closes
/// without answering is never sent again (the app may have run it): the
/// client gets a 502 `upstream-unreachable` and the app saw it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_app_read_and_left_unanswered_is_not_sent_again() {
    let heads: Heads = Arc::default();
    let app_port = raw_app(heads.clone()).await;
    let dir = support::test_dir("http1_paths_hangup");
    let url = format!("sqlite://{}/leases.db", dir.display());
    let spec = ClusterSpec::store("sqlite", &url, "paths_hangup");
    let gw = GatewayProcess::start_for_upstream(0, &spec, app_port, ROUTES).await;
    support::wait_for_async("the gateway holds", Duration::from_secs(30), || async {
        gw.held().await.get("maintenance").is_some_and(|h| h.0)
    })
    .await;
    let port: u16 = gw.url().rsplit(':').next().unwrap().parse().unwrap();
    // The first request keeps an app connection; the second goes out on it.
    let request = "GET /maintenance/plain HTTP/1.1\r\nHost: h\r\n\r\nGET /maintenance/hangup HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n";
    let raw = exchange(port, request).await;
    let text = String::from_utf8_lossy(&raw);
    let statuses: Vec<&str> = text
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| &text[i + 9..i + 12])
        .collect();
    assert_eq!(statuses, ["200", "502"], "{text}");
    assert!(text.contains("upstream-unreachable"), "{text}");
    let seen = heads.lock().unwrap().clone();
    let hangups: Vec<_> = seen
        .iter()
        .filter(|(_, h)| h.contains("/maintenance/hangup"))
        .collect();
    assert_eq!(hangups.len(), 1, "run once at the app: {seen:#?}");
    assert_eq!(hangups[0].0, seen[0].0, "on the kept connection: {seen:#?}");
}

/// A client that leaves an event stream between events: the gateway
/// closes the stream's app connection and stops counting it at once, not
/// when the next event finds the client gone (the app sends none here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_a_stream_between_events_ends_it() {
    let heads: Heads = Arc::default();
    let app_port = raw_app(heads.clone()).await;
    let gw =
        GatewayProcess::start_for_upstream(0, &spec("paths_leave", false), app_port, ROUTES).await;
    holding(&gw).await;
    let before = fast_count(&gw).await;
    let mut s = TcpStream::connect(("127.0.0.1", port_of(&gw)))
        .await
        .unwrap();
    s.write_all(b"GET /maintenance/stream HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("data: first") {
        let mut chunk = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut chunk))
            .await
            .expect("the first event")
            .unwrap();
        assert!(n > 0, "closed before the first event");
        got.extend_from_slice(&chunk[..n]);
    }
    assert_eq!(open_streams(&gw).await, 1.0);
    drop(s);
    support::wait_for(
        "the app's stream connection closed",
        Duration::from_secs(30),
        || heads.lock().unwrap().iter().any(|(_, h)| h == "CLOSED"),
    )
    .await;
    support::wait_for_async("no stream counted", Duration::from_secs(30), || async {
        open_streams(&gw).await == 0.0
    })
    .await;
    assert_eq!(fast_count(&gw).await, before + 1, "on the fast path");
}

/// `rolegate_open_streams` of a gateway.
async fn open_streams(gw: &GatewayProcess) -> f64 {
    metric(gw, "rolegate_open_streams").await
}

/// Statuses of the answers in `raw`, in order, and the bytes between the
/// first answer's head and the second's status line.
fn two_answers(raw: &[u8]) -> (Vec<String>, String) {
    let text = String::from_utf8_lossy(raw).into_owned();
    let statuses = text
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| text[i + 9..i + 12].to_string())
        .collect();
    let first_end = text.find("\r\n\r\n").map_or(0, |i| i + 4);
    let second = text[first_end..]
        .find("HTTP/1.1 ")
        .map_or(text.len(), |i| first_end + i);
    (statuses, text[first_end..second].to_string())
}

/// A `HEAD` whose app fails gets the gateway's problem as a head only: a
/// body after it would be read as the next answer on the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_request_the_app_fails_gets_no_body() {
    let heads: Heads = Arc::default();
    let app_port = raw_app(heads.clone()).await;
    let gw =
        GatewayProcess::start_for_upstream(0, &spec("paths_head", false), app_port, ROUTES).await;
    holding(&gw).await;
    let request = "HEAD /maintenance/hangup HTTP/1.1\r\nHost: h\r\n\r\nGET /maintenance/plain HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n";
    let (statuses, between) = two_answers(&exchange(port_of(&gw), request).await);
    assert_eq!(statuses, ["502", "200"], "{between}");
    assert_eq!(between, "", "a body after the HEAD's answer");
}

/// A client that pipelines two requests and closes its side at once is
/// answered both, in order, though the first answer is slow: it is not a
/// client that left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_closed_pipelining_client_gets_every_answer() {
    let heads: Heads = Arc::default();
    let app_port = raw_app(heads.clone()).await;
    let gw =
        GatewayProcess::start_for_upstream(0, &spec("paths_halfclose", false), app_port, ROUTES)
            .await;
    holding(&gw).await;
    let mut s = TcpStream::connect(("127.0.0.1", port_of(&gw)))
        .await
        .unwrap();
    s.write_all(b"GET /maintenance/slow HTTP/1.1\r\nHost: h\r\n\r\nGET /maintenance/plain HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    s.shutdown().await.unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "no end");
    let (statuses, _) = two_answers(&out);
    assert_eq!(
        statuses,
        ["200", "200"],
        "{}",
        String::from_utf8_lossy(&out)
    );
}
