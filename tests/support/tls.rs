//! Real TLS for store tests: a throwaway CA with a server certificate for
//! `localhost` and `127.0.0.1`, one for another host name, a client
//! certificate (clientAuth), and a second, unrelated CA, written as PEM
//! files under [`super::test_dir`]; and PostgreSQL, Redis and etcd servers
//! started with TLS on free loopback ports. A missing server binary fails
//! the test and says how to get it.

use std::path::{Path, PathBuf};
use std::process::Command;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

use super::{require_binary, PrivatePostgres, PrivateServer};

/// The PEM files of one test.
pub struct TlsFiles {
    pub dir: PathBuf,
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// A CA that signed nothing here.
    pub other_ca: PathBuf,
    /// For `localhost` and `127.0.0.1`.
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// For `wrong.example` only, by the same CA.
    pub wrong_host_cert: PathBuf,
    pub wrong_host_key: PathBuf,
    /// clientAuth, by the same CA.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.distinguished_name.push(DnType::CommonName, name);
    let cert = params.self_signed(&key).expect("self-sign the CA");
    Ca { cert, key }
}

/// A leaf certificate for `names` with one extended key usage, signed by `ca`.
fn leaf(ca: &Ca, names: &[&str], usage: ExtendedKeyUsagePurpose) -> (String, String) {
    let key = KeyPair::generate().expect("leaf key");
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names.clone()).expect("leaf params");
    params.distinguished_name.push(
        DnType::CommonName,
        names.first().cloned().unwrap_or_default(),
    );
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    let cert = params
        .signed_by(&key, &ca.cert, &ca.key)
        .expect("sign the leaf");
    (cert.pem(), key.serialize_pem())
}

impl TlsFiles {
    /// Makes every certificate of one test, in a fresh directory.
    pub fn generate(tag: &str) -> TlsFiles {
        let dir = super::test_dir(tag);
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write a PEM file");
            path
        };
        let main = ca("rolegate test CA");
        let other = ca("unrelated test CA");
        let server = leaf(
            &main,
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let wrong = leaf(
            &main,
            &["wrong.example"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let client = leaf(
            &main,
            &["rolegate-client"],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        TlsFiles {
            ca: write("ca.pem", &main.cert.pem()),
            other_ca: write("other-ca.pem", &other.cert.pem()),
            server_cert: write("server.pem", &server.0),
            server_key: write("server-key.pem", &server.1),
            wrong_host_cert: write("wrong-host.pem", &wrong.0),
            wrong_host_key: write("wrong-host-key.pem", &wrong.1),
            client_cert: write("client.pem", &client.0),
            client_key: write("client-key.pem", &client.1),
            dir,
        }
    }

    /// The server certificate and key: the right one, or the one for
    /// `wrong.example`.
    pub fn server(&self, right_host: bool) -> (&Path, &Path) {
        if right_host {
            (&self.server_cert, &self.server_key)
        } else {
            (&self.wrong_host_cert, &self.wrong_host_key)
        }
    }
}

/// How a test server presents itself and what it asks of clients.
#[derive(Clone, Copy)]
pub struct ServerTls {
    /// Present the certificate for `localhost`/`127.0.0.1` (else the one
    /// for `wrong.example`).
    pub right_host: bool,
    /// Refuse clients without a certificate signed by the test CA.
    pub require_client_cert: bool,
}

impl ServerTls {
    pub const PLAIN: ServerTls = ServerTls {
        right_host: true,
        require_client_cert: false,
    };
    pub const WRONG_HOST: ServerTls = ServerTls {
        right_host: false,
        require_client_cert: false,
    };
    pub const CLIENT_CERTS: ServerTls = ServerTls {
        right_host: true,
        require_client_cert: true,
    };
}

/// A private PostgreSQL that takes TLS connections only (`hostssl`), with
/// client certificates verified when `require_client_cert`.
pub fn postgres(files: &TlsFiles, tls: ServerTls) -> PrivatePostgres {
    let pg = PrivatePostgres::init();
    let data = pg.dir.join("data");
    let (cert, key) = files.server(tls.right_host);
    // The server reads them as `postgres`, and wants its key private.
    for (from, name) in [
        (cert, "server.crt"),
        (key, "server.key"),
        (&files.ca, "ca.crt"),
    ] {
        std::fs::copy(from, data.join(name)).expect("copy a PEM file into the data dir");
    }
    let auth = if tls.require_client_cert {
        "trust clientcert=verify-ca"
    } else {
        "trust"
    };
    let hba = format!("local all all trust\nhostssl all all 127.0.0.1/32 {auth}\n");
    std::fs::write(data.join("pg_hba.conf"), hba).expect("write pg_hba.conf");
    if super::is_root() {
        let ok = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&data)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "chown of {} to postgres failed", data.display());
    }
    let ok = Command::new("chmod")
        .arg("600")
        .arg(data.join("server.key"))
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "chmod of the server key failed");
    pg.start_server_with(
        "-c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key -c ssl_ca_file=ca.crt",
    );
    pg
}

/// A Redis that listens for TLS only.
pub fn redis(files: &TlsFiles, tls: ServerTls) -> PrivateServer {
    let program = require_binary("redis-server");
    let port = super::store_port();
    let dir = super::test_dir("redis_tls");
    let (cert, key) = files.server(tls.right_host);
    let auth = if tls.require_client_cert { "yes" } else { "no" };
    let args: Vec<String> = [
        "--port",
        "0",
        "--tls-port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        &dir.display().to_string(),
        "--tls-cert-file",
        &cert.display().to_string(),
        "--tls-key-file",
        &key.display().to_string(),
        "--tls-ca-cert-file",
        &files.ca.display().to_string(),
        "--tls-auth-clients",
        auth,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    PrivateServer::launch(program, args, dir, port)
}

/// A single-member etcd whose client URL is https.
pub fn etcd(files: &TlsFiles, tls: ServerTls) -> PrivateServer {
    let program = require_binary("etcd");
    let port = super::store_port();
    let peer = format!("http://127.0.0.1:{}", super::store_port());
    let dir = super::test_dir("etcd_tls");
    let client = format!("https://127.0.0.1:{port}");
    let (cert, key) = files.server(tls.right_host);
    let mut args: Vec<String> = [
        "--name",
        "t",
        "--data-dir",
        &dir.join("data").display().to_string(),
        "--listen-client-urls",
        &client,
        "--advertise-client-urls",
        &client,
        "--listen-peer-urls",
        &peer,
        "--initial-advertise-peer-urls",
        &peer,
        "--initial-cluster",
        &format!("t={peer}"),
        "--cert-file",
        &cert.display().to_string(),
        "--key-file",
        &key.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // etcd asks for client certificates whenever it has a CA to check them.
    if tls.require_client_cert {
        args.push("--trusted-ca-file".into());
        args.push(files.ca.display().to_string());
        args.push("--client-cert-auth".into());
    }
    PrivateServer::launch(program, args, dir, port)
}
