//! Throwaway certificate authorities and certificates (rcgen), written as
//! PEM files for gateways, and a rustls HTTP/1.1 client that reports the
//! certificate the server presented.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};

/// A certificate authority that issues leaf certificates.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A leaf certificate and its key.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).expect("self-signed CA");
        Ca { cert, key }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// Writes the CA certificate to `dir/name`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.pem()).expect("write CA");
        path
    }

    /// A leaf for 127.0.0.1 and localhost (server or client use).
    pub fn issue(&self, name: &str) -> Leaf {
        let key = KeyPair::generate().expect("leaf key");
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("signed leaf");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
            key_der: key.serialize_der(),
        }
    }

    pub fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.cert.der().clone()).expect("CA as root");
        roots
    }
}

impl Leaf {
    /// Writes `dir/stem.pem` and `dir/stem.key`; returns both paths.
    pub fn write(&self, dir: &Path, stem: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{stem}.pem"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, &self.cert_pem).expect("write cert");
        std::fs::write(&key, &self.key_pem).expect("write key");
        (cert, key)
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()))
    }
}

/// A client trusting `ca`, presenting `cert` when given. No ALPN: HTTP/1.1.
pub fn client_config(ca: &Ca, cert: Option<&Leaf>) -> Arc<ClientConfig> {
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(ca.roots());
    let config = match cert {
        Some(leaf) => builder
            .with_client_auth_cert(vec![leaf.der.clone()], leaf.key())
            .expect("client cert"),
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

/// One HTTP/1.1 connection over TLS, kept open for several requests.
pub struct TlsConn {
    send: SendRequest<Body>,
    /// The leaf certificate the server presented.
    pub server_cert: CertificateDer<'static>,
}

impl TlsConn {
    pub async fn open(port: u16, config: Arc<ClientConfig>) -> Result<TlsConn, String> {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        let name = ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let server_cert = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first().cloned())
            .ok_or("no server certificate")?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(TlsConn { send, server_cert })
    }

    /// GET `path` with `headers`: (status, headers, body).
    pub async fn get(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<(StatusCode, HeaderMap, Bytes), String> {
        let mut req = Request::get(path).header("host", "127.0.0.1");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Body::empty()).map_err(|e| e.to_string())?;
        self.send.ready().await.map_err(|e| e.to_string())?;
        let resp = self
            .send
            .send_request(req)
            .await
            .map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((parts.status, parts.headers, body))
    }
}

/// One GET over a fresh TLS connection.
pub async fn get(
    port: u16,
    config: Arc<ClientConfig>,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(StatusCode, HeaderMap, Bytes), String> {
    TlsConn::open(port, config).await?.get(path, headers).await
}

/// One GET over a fresh TLS connection that offers only `h2` by ALPN:
/// (status, body, the protocol the server chose).
pub async fn get_h2(
    port: u16,
    ca: &Ca,
    path: &str,
) -> Result<(StatusCode, Bytes, Option<Vec<u8>>), String> {
    let mut config = (*client_config(ca, None)).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let alpn = tls.get_ref().1.alpn_protocol().map(|p| p.to_vec());
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(tls),
    )
    .await
    .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = Request::get(format!("https://127.0.0.1:{port}{path}"))
        .body(Body::empty())
        .map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok((status, body.to_bytes(), alpn))
}
