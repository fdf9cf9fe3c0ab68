//! TLS on the public listener and between gateways, against real `rolegate
//! run` processes on PostgreSQL: https hops verified against a cluster CA,
//! mutual TLS between gateways, certificate reload, client certificates.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use http::StatusCode;
use support::cluster::{self, ClusterSpec, GatewayProcess, TestApp};
use support::gateway_tls::{client_config, Ca, Leaf, TlsConn};

/// One test's certificates: a cluster CA and the gateways' server pair.
struct Pki {
    dir: PathBuf,
    cluster: Ca,
    ca_file: PathBuf,
    server: (PathBuf, PathBuf),
}

impl Pki {
    fn new(tag: &str) -> Pki {
        let dir = support::test_dir(tag);
        let cluster = Ca::new("rolegate test cluster CA");
        let ca_file = cluster.write(&dir, "cluster-ca.pem");
        let server = cluster.issue("gateway").write(&dir, "gateway");
        Pki {
            dir,
            cluster,
            ca_file,
            server,
        }
    }

    /// `tls:` with the server pair (and a client CA when given).
    fn tls_yaml(&self, client_ca: Option<&Path>) -> String {
        let mut y = format!(
            "tls:\n  cert_file: {}\n  key_file: {}\n",
            self.server.0.display(),
            self.server.1.display()
        );
        if let Some(ca) = client_ca {
            y.push_str(&format!("  client_ca_file: {}\n", ca.display()));
        }
        y
    }
}

/// `peers:` lines.
fn peers_yaml(ca: Option<&Path>, cert: Option<&(PathBuf, PathBuf)>, require: bool) -> String {
    let mut y = format!("peers:\n  require_client_cert: {require}\n");
    if let Some(ca) = ca {
        y.push_str(&format!("  ca_file: {}\n", ca.display()));
    }
    if let Some((c, k)) = cert {
        y.push_str(&format!(
            "  cert_file: {}\n  key_file: {}\n",
            c.display(),
            k.display()
        ));
    }
    y
}

/// Starts a TLS gateway on port 0; it advertises `https://127.0.0.1:<port>`.
async fn start_tls(n: usize, spec: &ClusterSpec, extra: &str, app: &TestApp) -> GatewayProcess {
    let spec = spec.clone().with_extra(extra);
    let gw = GatewayProcess::start(n, &spec, app).await;
    let advertised = format!("advertise=https://127.0.0.1:{}", gw.port);
    assert!(gw.log().contains(&advertised), "{}", gw.log());
    gw
}

/// Starts gateway 0 (which then holds `maintenance`) and the others.
async fn start_pair(
    spec: &ClusterSpec,
    extras: &[String],
    apps: &[TestApp],
) -> Vec<GatewayProcess> {
    let mut gws = vec![start_tls(0, spec, &extras[0], &apps[0]).await];
    support::wait_for_async(
        "gateway 0 holds maintenance",
        Duration::from_secs(10),
        || async { gws[0].held().await.get("maintenance").is_some_and(|h| h.0) },
    )
    .await;
    for (n, extra) in extras.iter().enumerate().skip(1) {
        gws.push(start_tls(n, spec, extra, &apps[n]).await);
    }
    assert_eq!(cluster::wait_holder(&gws, "maintenance").await, 0);
    gws
}

async fn apps(n: usize) -> Vec<TestApp> {
    let mut apps = Vec::new();
    for i in 0..n {
        apps.push(TestApp::start(i).await);
    }
    apps
}

fn reason(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(body)));
    v["reason"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_request_through_the_non_holder_is_forwarded_over_https_to_the_holders_app() {
    let pki = Pki::new("tls_fwd");
    let spec = ClusterSpec::postgres("tls_fwd");
    let extra = pki.tls_yaml(None) + &peers_yaml(Some(&pki.ca_file), None, false);
    let apps = apps(2).await;
    let gws = start_pair(&spec, &[extra.clone(), extra], &apps).await;
    let address = gws[0].leases().await["instance"]["address"].clone();
    assert_eq!(address, format!("https://127.0.0.1:{}", gws[0].port));

    // A silent client (no ClientHello) holds neither the accept loop nor the
    // handshakes of others: the request below is served while it waits.
    let _silent = tokio::net::TcpStream::connect(("127.0.0.1", gws[1].port))
        .await
        .unwrap();
    let client = client_config(&pki.cluster, None);
    let served = support::gateway_tls::get(gws[1].port, client, "/maintenance/job", &[]);
    let (status, headers, body) = tokio::time::timeout(Duration::from_secs(5), served)
        .await
        .expect("served while a silent client waits")
        .unwrap();
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(headers["x-app"], "0", "executed by the holder's app");
    assert_eq!(apps[0].executed_paths(), vec!["/maintenance/job"]);
    assert!(apps[1].executed().is_empty());
    let seen = &apps[0].executed()[0].headers;
    assert_eq!(seen["x-forwarded-proto"], "https", "{seen:?}");
    let forwarded = seen["forwarded"].to_str().unwrap();
    assert!(
        forwarded.contains("proto=https") && !forwarded.contains("proto=http;"),
        "{forwarded}"
    );
    // HTTP/2 by ALPN over TLS, through the same forwarded hop.
    let (status, body, alpn) =
        support::gateway_tls::get_h2(gws[1].port, &pki.cluster, "/maintenance/h2")
            .await
            .unwrap();
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]), "h2 chosen by ALPN");
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(body, "app0 GET /maintenance/h2");
    // The holder's listener speaks only TLS: a plain request gets no answer.
    assert!(cluster::get(&format!("{}/maintenance/x", gws[0].url()))
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_trusting_another_ca_cannot_forward_and_answers_503_with_the_cause_logged() {
    let pki = Pki::new("tls_wrong_ca");
    let other = Ca::new("some other CA");
    let other_file = other.write(&pki.dir, "other-ca.pem");
    let spec = ClusterSpec::postgres("tls_wrong_ca");
    let holder = pki.tls_yaml(None) + &peers_yaml(Some(&pki.ca_file), None, false);
    let confused = pki.tls_yaml(None) + &peers_yaml(Some(&other_file), None, false);
    let apps = apps(2).await;
    let gws = start_pair(&spec, &[holder, confused], &apps).await;

    let client = client_config(&pki.cluster, None);
    let (status, headers, body) =
        support::gateway_tls::get(gws[1].port, client, "/maintenance/job", &[])
            .await
            .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reason(&body), "holder-unreachable");
    assert!(headers.contains_key("retry-after"));
    assert!(apps[0].executed().is_empty() && apps[1].executed().is_empty());
    support::wait_for("the cause in the log", Duration::from_secs(5), || {
        let log = gws[1].log();
        log.contains("forwarding to the role holder failed") && log.contains("UnknownIssuer")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_require_client_cert_only_a_peer_certificate_lets_a_hop_through() {
    let pki = Pki::new("tls_mtls");
    let peer = pki.cluster.issue("peer gateway");
    let peer_files = peer.write(&pki.dir, "peer");
    let spec = ClusterSpec::postgres("tls_mtls");
    let ca = Some(pki.ca_file.as_path());
    let holder = pki.tls_yaml(None) + &peers_yaml(ca, None, true);
    let with_cert = pki.tls_yaml(None) + &peers_yaml(ca, Some(&peer_files), true);
    let without = pki.tls_yaml(None) + &peers_yaml(ca, None, true);
    let apps = apps(3).await;
    let gws = start_pair(&spec, &[holder, with_cert, without], &apps).await;
    let anonymous = client_config(&pki.cluster, None);

    let (status, headers, _) =
        support::gateway_tls::get(gws[1].port, anonymous.clone(), "/maintenance/a", &[])
            .await
            .unwrap();
    assert_eq!(
        status,
        StatusCode::CREATED,
        "a peer with a client certificate forwards"
    );
    assert_eq!(headers["x-app"], "0");

    let (status, _, body) =
        support::gateway_tls::get(gws[2].port, anonymous.clone(), "/maintenance/b", &[])
            .await
            .unwrap();
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a peer without one is refused by the holder"
    );
    assert_eq!(reason(&body), "peer-certificate-required");

    // Hand-made hops straight to the holder, without a certificate.
    for (path, marker) in [
        ("/maintenance/c", ("x-rolegate-hop", "gw1-0000")),
        ("/plain/d", ("x-rolegate-hop", "gw1-0000")),
        ("/maintenance/e", ("via", "1.1 rolegate (gw1-0000)")),
    ] {
        let (status, _, body) =
            support::gateway_tls::get(gws[0].port, anonymous.clone(), path, &[marker])
                .await
                .unwrap();
        assert_eq!(status, StatusCode::FORBIDDEN, "{path} {marker:?}");
        assert_eq!(reason(&body), "peer-certificate-required");
    }
    // The same client without a marker is an ordinary client, and served.
    let (status, _, _) = support::gateway_tls::get(gws[0].port, anonymous, "/maintenance/f", &[])
        .await
        .unwrap();
    assert_eq!(status, StatusCode::CREATED);
    let executed: Vec<Vec<String>> = apps.iter().map(|a| a.executed_paths()).collect();
    assert_eq!(executed[0], vec!["/maintenance/a", "/maintenance/f"]);
    assert!(
        executed[1].is_empty() && executed[2].is_empty(),
        "{executed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_client_ca_file_does_not_count_as_a_peer() {
    let pki = Pki::new("tls_client_ca");
    let clients = Ca::new("rolegate test client CA");
    let clients_file = clients.write(&pki.dir, "clients-ca.pem");
    let spec = ClusterSpec::postgres("tls_client_ca");
    let extra = pki.tls_yaml(Some(&clients_file)) + &peers_yaml(Some(&pki.ca_file), None, true);
    let apps = apps(1).await;
    let gws = start_pair(&spec, &[extra], &apps).await;
    let port = gws[0].port;
    let customer = client_config(&pki.cluster, Some(&clients.issue("customer")));
    let peer = client_config(&pki.cluster, Some(&pki.cluster.issue("peer")));

    let hop = [("x-rolegate-hop", "gw1-0000")];
    let (status, _, body) =
        support::gateway_tls::get(port, customer.clone(), "/maintenance/a", &hop)
            .await
            .unwrap();
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a client certificate is no peer certificate"
    );
    assert_eq!(reason(&body), "peer-certificate-required");
    let (status, _, _) = support::gateway_tls::get(port, customer, "/maintenance/b", &[])
        .await
        .unwrap();
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the same client without a marker is served"
    );
    let (status, _, _) = support::gateway_tls::get(port, peer, "/maintenance/c", &hop)
        .await
        .unwrap();
    assert_eq!(
        status,
        StatusCode::CREATED,
        "a peer's hop reaches the holder's app"
    );
    assert_eq!(
        apps[0].executed_paths(),
        vec!["/maintenance/b", "/maintenance/c"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_client_ca_file_a_client_without_a_certificate_is_refused_at_the_handshake() {
    let pki = Pki::new("tls_mandatory");
    let clients = Ca::new("rolegate test client CA");
    let clients_file = clients.write(&pki.dir, "clients-ca.pem");
    let spec = ClusterSpec::postgres("tls_mandatory");
    let apps = apps(1).await;
    let gws = start_pair(&spec, &[pki.tls_yaml(Some(&clients_file))], &apps).await;
    let port = gws[0].port;

    let anonymous = client_config(&pki.cluster, None);
    let refused = support::gateway_tls::get(port, anonymous, "/maintenance/a", &[]).await;
    assert!(
        refused.is_err(),
        "served without a client certificate: {refused:?}"
    );
    let stranger = client_config(&pki.cluster, Some(&Ca::new("stranger CA").issue("x")));
    let refused = support::gateway_tls::get(port, stranger, "/maintenance/b", &[]).await;
    assert!(
        refused.is_err(),
        "served with a certificate from an unknown CA: {refused:?}"
    );

    let customer = client_config(&pki.cluster, Some(&clients.issue("customer")));
    let (status, _, _) = support::gateway_tls::get(port, customer, "/maintenance/c", &[])
        .await
        .unwrap();
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(apps[0].executed_paths(), vec!["/maintenance/c"]);
    let metrics = cluster::get(&format!("{}/metrics", gws[0].admin_url()))
        .await
        .unwrap()
        .2;
    let metrics = String::from_utf8_lossy(&metrics);
    let failures = metric(&metrics, "rolegate_tls_handshake_failures_total");
    assert!(failures >= 2.0, "handshake failures counted: {failures}");
}

/// The value of the first sample of `name` (with its labels) in a scrape.
fn metric(scrape: &str, name: &str) -> f64 {
    scrape
        .lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Replaces a pair the way a renewal tool does: new files renamed into place.
fn replace(leaf: &Leaf, files: &(PathBuf, PathBuf)) {
    let key_tmp = files.1.with_extension("key.new");
    let cert_tmp = files.0.with_extension("pem.new");
    std::fs::write(&key_tmp, &leaf.key_pem).unwrap();
    std::fs::write(&cert_tmp, &leaf.cert_pem).unwrap();
    std::fs::rename(&key_tmp, &files.1).unwrap();
    std::fs::rename(&cert_tmp, &files.0).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_certificate_is_served_to_new_handshakes_while_open_connections_keep_going() {
    let pki = Pki::new("tls_reload");
    let spec = ClusterSpec::postgres("tls_reload");
    let apps = apps(1).await;
    let gws = start_pair(&spec, &[pki.tls_yaml(None)], &apps).await;
    let (port, client) = (gws[0].port, client_config(&pki.cluster, None));
    let mut open = TlsConn::open(port, client.clone()).await.unwrap();
    assert_eq!(
        open.get("/maintenance/1", &[]).await.unwrap().0,
        StatusCode::CREATED
    );
    let first = open.server_cert.clone();

    let renewed = pki.cluster.issue("gateway renewed");
    replace(&renewed, &pki.server);
    support::wait_for_async(
        "a new handshake gets the new certificate",
        Duration::from_secs(5),
        || {
            let (client, want) = (client.clone(), renewed.der.clone());
            async move {
                TlsConn::open(port, client)
                    .await
                    .is_ok_and(|c| c.server_cert == want)
            }
        },
    )
    .await;
    assert_ne!(first, renewed.der);
    // The connection opened before the reload keeps working.
    assert_eq!(
        open.get("/maintenance/2", &[]).await.unwrap().0,
        StatusCode::CREATED
    );
    assert!(gws[0].log().contains("TLS certificate reloaded"));

    // A bad new file is refused with a warning; the renewed pair stays.
    let scrape = || async {
        let m = cluster::get(&format!("{}/metrics", gws[0].admin_url()))
            .await
            .unwrap()
            .2;
        String::from_utf8_lossy(&m).into_owned()
    };
    let refused = r#"rolegate_tls_certificate_reloads_total{outcome="refused"}"#;
    let before = metric(&scrape().await, refused);
    std::fs::write(&pki.server.0, "-----BEGIN CERTIFICATE-----\nnot base64!\n").unwrap();
    support::wait_for_async(
        "the bad file is refused",
        Duration::from_secs(5),
        || async { metric(&scrape().await, refused) > before },
    )
    .await;
    assert!(gws[0].log().contains("new TLS certificate refused"));
    let fresh = TlsConn::open(port, client.clone()).await.unwrap();
    assert_eq!(fresh.server_cert, renewed.der, "the previous pair is kept");
    assert_eq!(
        open.get("/maintenance/3", &[]).await.unwrap().0,
        StatusCode::CREATED
    );
    let ok = r#"rolegate_tls_certificate_reloads_total{outcome="ok"}"#;
    assert!(metric(&scrape().await, ok) >= 1.0);
}

/// `rolegate check-config --config <file>`: (success, stdout + stderr).
fn check_config(file: &Path) -> (bool, String) {
    let out = std::process::Command::new(cluster::bin())
        .args(["check-config", "--config"])
        .arg(file)
        .output()
        .expect("run check-config");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn every_yaml_example_in_docs_transport_passes_check_config() {
    let pki = Pki::new("tls_docs");
    // The docs name gateway.pem/.key and cluster-ca.pem, as `Pki` writes them.
    let dir = &pki.dir;
    Ca::new("clients").write(dir, "clients-ca.pem");
    pki.cluster.issue("peer").write(dir, "peer");
    let doc = include_str!("../docs/transport.md");
    let blocks: Vec<&str> = doc
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split("\n```").next())
        .collect();
    assert!(blocks.len() >= 4, "only {} yaml blocks found", blocks.len());
    for (i, block) in blocks.iter().enumerate() {
        let file = dir.join(format!("example-{i}.yaml"));
        let prefix = format!("{}/", dir.display());
        std::fs::write(&file, block.replace("/etc/rolegate/tls/", &prefix)).unwrap();
        let (ok, out) = check_config(&file);
        assert!(
            ok,
            "docs/transport.md yaml block {i} refused:\n{block}\n{out}"
        );
    }
}

#[test]
fn check_config_refuses_a_key_that_does_not_match_its_certificate_and_https_without_tls() {
    let pki = Pki::new("tls_check");
    let other = pki.cluster.issue("other").write(&pki.dir, "other");
    let file = pki.dir.join("mismatch.yaml");
    let yaml = format!(
        "tls:\n  cert_file: {}\n  key_file: {}\n",
        pki.server.0.display(),
        other.1.display()
    );
    std::fs::write(&file, yaml).unwrap();
    let (ok, out) = check_config(&file);
    assert!(!ok);
    assert!(
        out.contains("tls.key_file") && out.contains("does not match"),
        "{out}"
    );

    std::fs::write(
        &file,
        pki.tls_yaml(None).replace("gateway.pem", "missing.pem"),
    )
    .unwrap();
    let (ok, out) = check_config(&file);
    assert!(!ok);
    assert!(out.contains("tls.cert_file: cannot read"), "{out}");

    std::fs::write(&file, "instance:\n  advertise: https://10.0.0.7:8443\n").unwrap();
    let (ok, out) = check_config(&file);
    assert!(!ok);
    assert!(
        out.contains("instance.advertise") && out.contains("set `tls`"),
        "{out}"
    );
}
