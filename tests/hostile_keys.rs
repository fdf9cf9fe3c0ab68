//! Partition keys read as real apps read them. Each test puts a gateway in
//! front of a real app server (PHP's `php -S`, a Go net/http app) or an app
//! that reproduces an accessor exactly (Tomcat's `getParameter`, Rack's
//! `params` and path unescaping), sends requests that name one key to the
//! gateway and another to the app, and requires every one to be refused
//! (400) or run under the partition of the key the app itself read: the
//! role the gateway admitted it under (`X-Rolegate-Role`, as the app got
//! it) is the partition of what the app read.

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use support::cluster::{self, ClusterSpec, GatewayProcess};

const COUNT: u32 = 8;

const ROUTES: &str = r#"roles:
  - name: maintenance
partitions:
  - name: devices
    count: 8
    balance: false
routes:
  - prefixes: [/maintenance]
    role: maintenance
  - prefixes: [/device-q]
    partition: devices
    key: { query: id }
  - prefixes: [/device-h]
    partition: devices
    key: { header: X-Device-Id }
  - prefixes: [/orders]
    partition: devices
    key: { path_segment: 2 }
"#;

fn role_of(key: &str) -> String {
    format!(
        "devices:partition-{}",
        rolegate::lease::partition_index(None, key, COUNT)
    )
}

/// Two keys in different partitions: `(mine, victim)`.
fn two_keys() -> (String, String) {
    let mine = "mine0".to_string();
    let victim = (0..)
        .map(|i| format!("victim{i}"))
        .find(|v| role_of(v) != role_of(&mine))
        .unwrap();
    (mine, victim)
}

/// An app process that prints its port first (or is given one).
struct App {
    child: Child,
    port: u16,
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn key_apps() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/key_apps")
}

fn require(program: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "this test needs `{program}`: run `scripts/test` (it installs it) or `apt-get install -y {package}`"
    );
}

/// Starts a program that prints the port it bound as its first line.
fn start_printing_port(mut command: Command) -> App {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the app");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line.trim().parse().unwrap_or_else(|_| {
        let _ = child.kill();
        panic!("the app did not print its port: {line:?}")
    });
    App { child, port }
}

/// `php -n -S` on a port of its own choosing is not possible (it needs a
/// number), so it gets a port outside the ephemeral range, as the stores do.
fn php_app() -> App {
    require("php", "php-cli");
    let port = support::store_port();
    let child = Command::new("php")
        // No php.ini: `$_REQUEST` merges GET, POST and cookies.
        .args(["-n", "-S", &format!("127.0.0.1:{port}")])
        .arg(key_apps().join("router.php"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start php -S");
    let start = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed().as_secs() < 15, "php -S did not listen");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    App { child, port }
}

fn go_app() -> App {
    require("go", "golang-go");
    let dir = support::test_dir("go_key_app");
    let bin = dir.join("app");
    let built = Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(key_apps().join("main.go"))
        .env("HOME", &dir)
        .env("GOCACHE", dir.join("cache"))
        .env("GOPATH", dir.join("path"))
        .env("GO111MODULE", "off")
        .output()
        .expect("go build");
    assert!(
        built.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    start_printing_port(Command::new(bin))
}

fn python_app() -> App {
    let mut c = Command::new(support::python_with("json"));
    c.arg(key_apps().join("readers.py"));
    start_printing_port(c)
}

async fn gateway(tag: &str, app: &App) -> GatewayProcess {
    GatewayProcess::start_for_upstream(1, &ClusterSpec::postgres(tag), app.port, ROUTES).await
}

/// Sends `request` and requires it refused with 400, or run by the app under
/// the partition of the key it read (`field` of its JSON answer). Gives the
/// status.
async fn refused_or_run_where_the_app_reads(
    gw: &GatewayProcess,
    request: &str,
    field: &str,
) -> u16 {
    let resp = cluster::raw_exchange(gw.port, request.as_bytes()).await;
    let status = cluster::status_of(&resp);
    if status == 400 {
        assert!(
            resp.contains("ambiguous-key") || resp.contains("bad-key"),
            "{request:?} refused for another reason: {resp}"
        );
        return status;
    }
    assert_eq!(status, 200, "{request:?}: {resp}");
    let json = answer_json(&resp);
    let read = json[field].as_str().unwrap_or_default();
    let admitted = json["role"].as_str().unwrap_or_default();
    assert!(
        read.is_empty() || admitted == role_of(read),
        "{request:?}: the app acted for key {read:?} ({}) under {admitted:?}",
        role_of(read)
    );
    status
}

/// The JSON object an app answered with (the body may come chunked).
fn answer_json(resp: &str) -> serde_json::Value {
    let body = resp.split("\r\n\r\n").nth(1).unwrap_or_default();
    let object = body
        .find('{')
        .zip(body.rfind('}'))
        .map(|(a, b)| &body[a..=b])
        .unwrap_or_default();
    serde_json::from_str(object).unwrap_or_else(|e| panic!("{e}: {resp}"))
}

fn form_post(path: &str, content_type: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: app\r\nConnection: close\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn multipart(name: &str, value: &str) -> String {
    format!("--XX\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n--XX--\r\n")
}

/// Class 1: a form body (URL-encoded or multipart, any method) naming the
/// query key; PHP's `$_REQUEST` and Go's `FormValue` take the body's value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_body_naming_the_query_key_is_refused_for_apps_that_merge_it() {
    let (mine, victim) = two_keys();
    let php = php_app();
    let go = go_app();
    let py = python_app();
    let gw_php = gateway("keys_form_php", &php).await;
    let gw_go = gateway("keys_form_go", &go).await;
    let gw_py = gateway("keys_form_py", &py).await;
    let urlencoded = "application/x-www-form-urlencoded";
    let path = format!("/device-q?id={mine}");
    let mut requests = vec![
        form_post(&path, urlencoded, &format!("id={victim}")),
        form_post(
            &path,
            &format!("{urlencoded}; charset=utf-8"),
            &format!("a=1&id={victim}"),
        ),
        form_post(
            &path,
            "multipart/form-data; boundary=XX",
            &multipart("id", &victim),
        ),
    ];
    for method in ["PUT", "PATCH", "DELETE", "GET"] {
        let body = format!("id={victim}");
        requests.push(format!(
            "{method} {path} HTTP/1.1\r\nHost: app\r\nConnection: close\r\nContent-Type: {urlencoded}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ));
    }
    for request in &requests {
        let a = refused_or_run_where_the_app_reads(&gw_php, request, "request").await;
        let b = refused_or_run_where_the_app_reads(&gw_go, request, "form").await;
        let c = refused_or_run_where_the_app_reads(&gw_py, request, "rack").await;
        // Refused whether or not this app reads the body for this method:
        // the gateway cannot know which app it fronts.
        assert_eq!((a, b, c), (400, 400, 400), "{request}");
    }
    // A body that does not name the key reaches the app unchanged, and the
    // key's own partition runs it.
    let fine = form_post(&path, urlencoded, "note=hello");
    assert_eq!(
        refused_or_run_where_the_app_reads(&gw_php, &fine, "request").await,
        200
    );
    // `key.body: ignore` leaves bodies alone, for an app that reads the URL.
    let ignoring = ROUTES.replace("key: { query: id }", "key: { query: id, body: ignore }");
    let gw = GatewayProcess::start_for_upstream(
        2,
        &ClusterSpec::postgres("keys_form_ignore"),
        py.port,
        &ignoring,
    )
    .await;
    let tomcat = form_post(&path, urlencoded, &format!("id={victim}"));
    assert_eq!(
        refused_or_run_where_the_app_reads(&gw, &tomcat, "tomcat").await,
        200
    );
}

/// Cookies naming the query key: PHP's `$_REQUEST` takes them over the
/// query when `request_order` is unset (no php.ini).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_naming_the_query_key_is_refused() {
    let (mine, victim) = two_keys();
    let php = php_app();
    let gw = gateway("keys_cookie", &php).await;
    let request = format!(
        "GET /device-q?id={mine} HTTP/1.1\r\nHost: app\r\nConnection: close\r\nCookie: id={victim}\r\n\r\n"
    );
    assert_eq!(
        refused_or_run_where_the_app_reads(&gw, &request, "request").await,
        400
    );
}

/// Class 2: a malformed escape in the query makes Tomcat drop the pair, so
/// the body's value wins there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_escape_in_a_query_keyed_route_is_refused() {
    let (mine, victim) = two_keys();
    let py = python_app();
    let ignoring = ROUTES.replace("key: { query: id }", "key: { query: id, body: ignore }");
    // Even with bodies ignored: the query itself is what Tomcat misreads.
    let gw = GatewayProcess::start_for_upstream(
        1,
        &ClusterSpec::postgres("keys_malformed"),
        py.port,
        &ignoring,
    )
    .await;
    for suffix in ["%zz", "%", "%2", "%g1", "%%", "%u0041"] {
        let request = form_post(
            &format!("/device-q?id={mine}{suffix}"),
            "application/x-www-form-urlencoded",
            &format!("id={victim}"),
        );
        assert_eq!(
            refused_or_run_where_the_app_reads(&gw, &request, "tomcat").await,
            400,
            "{suffix}"
        );
    }
    let request = form_post(
        &format!("/device-q?id={mine}&x=%zz"),
        "application/x-www-form-urlencoded",
        "note=1",
    );
    assert_eq!(
        refused_or_run_where_the_app_reads(&gw, &request, "tomcat").await,
        400
    );
}

/// Class 3: header names with `.` (or any punctuation but `-`) become `_`
/// in PHP's `$_SERVER`: they cannot forge the trusted headers, nor stand in
/// for the key header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_names_php_folds_cannot_forge_trust_or_the_key() {
    let (mine, victim) = two_keys();
    let php = php_app();
    let gw = gateway("keys_fold", &php).await;
    for p in [
        '.', '_', '~', '!', '#', '$', '%', '&', '\'', '*', '+', '^', '`', '|',
    ] {
        let name = |n: &str| n.replace('-', &p.to_string());
        let request = format!(
            "GET /plain HTTP/1.1\r\nHost: app\r\nConnection: close\r\n{}: maintenance\r\n{}: 999999\r\n{}: gw\r\n\r\n",
            name("X-Rolegate-Role"),
            name("X-Rolegate-Token"),
            name("X-Rolegate-Hop")
        );
        let resp = cluster::raw_exchange(gw.port, request.as_bytes()).await;
        assert_eq!(cluster::status_of(&resp), 200, "{resp}");
        let json = answer_json(&resp);
        for field in ["role", "token", "hop"] {
            assert!(json[field].is_null(), "`{p}` forged {field}: {json}");
        }
        // The key header spelled with it beside the real one.
        for order in [0, 1] {
            let (a, b) = (
                format!("X-Device-Id: {mine}"),
                format!("{}: {victim}", name("X-Device-Id")),
            );
            let (first, second) = if order == 0 { (a, b) } else { (b, a) };
            let request = format!(
                "GET /device-h/x HTTP/1.1\r\nHost: app\r\nConnection: close\r\n{first}\r\n{second}\r\n\r\n"
            );
            refused_or_run_where_the_app_reads(&gw, &request, "header").await;
        }
    }
}

/// Class 4: a path-segment key with `+` or an escape, for apps that read the
/// raw path (Go's `EscapedPath`, Rack's `PATH_INFO`) or form-decode it
/// (`URLDecoder.decode`, `Rack::Utils.unescape`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_keys_read_raw_or_form_decoded_land_in_one_partition() {
    let go = go_app();
    let py = python_app();
    let gw_go = gateway("keys_path_go", &go).await;
    let gw_py = gateway("keys_path_py", &py).await;
    // Keys whose readings land in different partitions.
    let plus = (0..)
        .map(|i| format!("p+{i}"))
        .find(|k| role_of(k) != role_of(&k.replace('+', " ")))
        .unwrap();
    let escaped = (0..)
        .map(|i| format!("%70{i}"))
        .find(|k| role_of(k) != role_of(&k.replacen("%70", "p", 1)))
        .unwrap();
    let mut refused = 0;
    for key in [&plus, &escaped] {
        let request =
            format!("GET /orders/{key}/x HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n");
        for (gw, field) in [
            (&gw_go, "segment"),
            (&gw_py, "segment_raw"),
            (&gw_py, "segment_unescaped"),
        ] {
            if refused_or_run_where_the_app_reads(gw, &request, field).await == 400 {
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 6);
    // A plain key still runs.
    let request = "GET /orders/p1/x HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n";
    assert_eq!(
        refused_or_run_where_the_app_reads(&gw_go, request, "segment").await,
        200
    );
}
