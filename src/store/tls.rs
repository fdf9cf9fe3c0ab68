//! TLS to the stores (rustls everywhere). Redis (`rediss://`) and etcd
//! (`https://` endpoints) take [`StoreTls`]: a CA file and an optional client
//! certificate. PostgreSQL takes libpq's `sslmode`, `sslrootcert`, `sslcert`
//! and `sslkey` in its URL instead. This module owns the rules that say
//! which store takes what, and reads and checks the PEM files, so a bad
//! file is refused at start (and by `check-config`) naming the file, before
//! any connection is tried.

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::{StoreError, StoreKind};

/// `store.tls`: how to verify a Redis or etcd server, and the client
/// certificate to show it. Files are read when the store is opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreTls {
    /// PEM CA certificate(s) to verify the server against; `None`: the web
    /// PKI roots.
    pub ca_file: Option<PathBuf>,
    /// A client certificate, for servers that require one.
    pub client_cert: Option<ClientCertFiles>,
}

/// A client certificate chain and its private key, both PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertFiles {
    /// The certificate chain (leaf first).
    pub cert_file: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

/// A combination of store, URL and TLS settings that cannot work as meant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsRuleError {
    /// `store.tls` given to PostgreSQL, which takes its TLS in the URL.
    #[error("PostgreSQL takes its TLS settings in store.url, as libpq does: sslmode, sslrootcert, sslcert, sslkey (e.g. postgres://USER@HOST/DB?sslmode=verify-full&sslrootcert=/etc/rolegate/pg-ca.pem); remove store.tls")]
    PostgresInUrl,
    /// `store.tls` given to a store without a network connection.
    #[error("store.tls is for the redis (rediss://) and etcd (https://) stores only; the {0} store has no network connection")]
    NoNetwork(&'static str),
    /// `store.tls` with a plain URL: it would silently not be used.
    #[error("store.tls is set but {0} is not a TLS URL, so it would not be used; use {1}")]
    PlainUrl(String, &'static str),
    /// Some etcd endpoints are https and some are not.
    #[error("etcd endpoints must be all https:// or all http://, not a mix")]
    MixedEndpoints,
    /// A Redis URL asking not to verify the server.
    #[error("`#insecure` (no server certificate verification) is refused; to trust a private CA set store.tls.ca_file")]
    Insecure,
    /// An `sslmode` rolegate does not offer.
    #[error("unknown sslmode `{0}`; use disable, prefer, require, verify-ca or verify-full")]
    UnknownSslMode(String),
    /// `sslmode=allow`, which the PostgreSQL client here treats as `disable`.
    #[error("sslmode `allow` is not supported (it would never use TLS here); use prefer, require, verify-ca or verify-full, or disable")]
    SslModeAllow,
    /// `sslcert` without `sslkey`, or the reverse.
    #[error("sslcert and sslkey go together")]
    PgCertWithoutKey,
}

impl TlsRuleError {
    /// The configuration key at fault.
    pub fn field(&self) -> &'static str {
        match self {
            TlsRuleError::PostgresInUrl | TlsRuleError::NoNetwork(_) => "store.tls",
            TlsRuleError::PlainUrl(..) => "store.tls",
            _ => "store.url",
        }
    }
}

/// A TLS file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsFileError {
    /// The file could not be read.
    #[error("cannot read `{}`", .path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not the PEM it should be.
    #[error("`{}` is not a PEM {what}", .path.display())]
    BadPem {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
        /// The parser's words.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// A CA file with a certificate that cannot be a trust anchor.
    #[error("`{}` holds a certificate that cannot be a trust anchor", .path.display())]
    BadCa {
        /// The file.
        path: PathBuf,
        /// The verifier's words.
        #[source]
        source: rustls::Error,
    },
    /// A client certificate that does not go with its key (or a key of a
    /// kind rustls does not sign with).
    #[error("client certificate `{}` and key `{}` cannot be used together", .cert.display(), .key.display())]
    KeyRejected {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's words.
        #[source]
        source: rustls::Error,
    },
}

/// PEM bytes read from the files of a [`StoreTls`], each checked. (Only the
/// Redis and etcd clients read them; PostgreSQL takes its files by path.)
#[derive(Clone, Default)]
#[cfg_attr(not(any(feature = "redis", feature = "etcd")), allow(dead_code))]
pub(crate) struct TlsMaterial {
    /// The CA certificates, PEM.
    pub(crate) ca: Option<Vec<u8>>,
    /// The client certificate chain and key, PEM.
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl StoreTls {
    /// Reads and checks every file (PEM that parses, CA certificates that
    /// are trust anchors, a key that goes with the certificate).
    pub(crate) fn load(&self) -> Result<TlsMaterial, StoreError> {
        let ca = match &self.ca_file {
            Some(path) => {
                Some(read_ca(path).map_err(|e| StoreError::config("store.tls.ca_file", e))?)
            }
            None => None,
        };
        let identity = match &self.client_cert {
            Some(files) => Some(read_identity(files)?),
            None => None,
        };
        Ok(TlsMaterial { ca, identity })
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|source| TlsFileError::Unreadable {
        path: path.to_path_buf(),
        source,
    })
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let bad = |source| TlsFileError::BadPem {
        path: path.to_path_buf(),
        what: "certificate",
        source,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(bad)?;
    if certs.is_empty() {
        return Err(bad(rustls_pki_types::pem::Error::NoItemsFound));
    }
    Ok(certs)
}

/// Reads a CA file: PEM certificates, each usable as a trust anchor.
fn read_ca(path: &Path) -> Result<Vec<u8>, TlsFileError> {
    let pem = read(path)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(path, &pem)? {
        roots.add(cert).map_err(|source| TlsFileError::BadCa {
            path: path.to_path_buf(),
            source,
        })?;
    }
    Ok(pem)
}

/// Reads a client certificate and its key, and checks rustls accepts the
/// pair (the key parses, is of a supported kind and matches the certificate).
fn read_identity(files: &ClientCertFiles) -> Result<(Vec<u8>, Vec<u8>), StoreError> {
    let cert_pem =
        read(&files.cert_file).map_err(|e| StoreError::config("store.tls.cert_file", e))?;
    let chain = certificates(&files.cert_file, &cert_pem)
        .map_err(|e| StoreError::config("store.tls.cert_file", e))?;
    let key_pem = read(&files.key_file).map_err(|e| StoreError::config("store.tls.key_file", e))?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|source| {
        let e = TlsFileError::BadPem {
            path: files.key_file.clone(),
            what: "private key",
            source,
        };
        StoreError::config("store.tls.key_file", e)
    })?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| key_rejected(files, source))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_client_auth_cert(chain, key)
        .map_err(|source| key_rejected(files, source))?;
    Ok((cert_pem, key_pem))
}

fn key_rejected(files: &ClientCertFiles, source: rustls::Error) -> StoreError {
    let e = TlsFileError::KeyRejected {
        cert: files.cert_file.clone(),
        key: files.key_file.clone(),
        source,
    };
    StoreError::config("store.tls.key_file", e)
}

/// Checks that `tls` fits the store `kind` and its `url`, and that the
/// URL's own TLS settings are ones rolegate offers. Pure: no file is read.
pub(crate) fn check_tls_rules(
    kind: StoreKind,
    url: &str,
    tls: Option<&StoreTls>,
) -> Result<(), TlsRuleError> {
    match kind {
        StoreKind::Postgres => {
            if tls.is_some() {
                return Err(TlsRuleError::PostgresInUrl);
            }
            PgTlsParams::parse(url).map(|_| ())
        }
        StoreKind::Memory | StoreKind::Sqlite if tls.is_some() => {
            Err(TlsRuleError::NoNetwork(kind.as_str()))
        }
        StoreKind::Memory | StoreKind::Sqlite => Ok(()),
        StoreKind::Redis => {
            // Schemes and the fragment compare ignoring case, as the url parser does.
            let scheme_tls = url.len() >= 9 && url[..9].eq_ignore_ascii_case("rediss://");
            let insecure = url
                .rsplit_once('#')
                .is_some_and(|(_, f)| f.eq_ignore_ascii_case("insecure"));
            if insecure {
                return Err(TlsRuleError::Insecure);
            }
            if tls.is_some() && !scheme_tls {
                let scheme = url.split("://").next().unwrap_or(url);
                return Err(TlsRuleError::PlainUrl(
                    format!("`{scheme}://`"),
                    "rediss://HOST:PORT",
                ));
            }
            Ok(())
        }
        StoreKind::Etcd => {
            let https = etcd_uses_https(url)?;
            if tls.is_some() && !https {
                return Err(TlsRuleError::PlainUrl(
                    "an http:// endpoint".into(),
                    "https://HOST:PORT endpoints",
                ));
            }
            Ok(())
        }
    }
}

/// Whether every endpoint of an etcd URL list is `https://` (`false` when
/// none is); a mix is refused.
pub(crate) fn etcd_uses_https(url: &str) -> Result<bool, TlsRuleError> {
    let endpoints: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    let https = endpoints
        .iter()
        .filter(|e| e.starts_with("https://"))
        .count();
    match https {
        0 => Ok(false),
        n if n == endpoints.len() => Ok(true),
        _ => Err(TlsRuleError::MixedEndpoints),
    }
}

/// The TLS parameters of a PostgreSQL URL (libpq's names, and the aliases
/// the PostgreSQL client also reads).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct PgTlsParams {
    pub(crate) sslmode: Option<String>,
    pub(crate) sslrootcert: Option<String>,
    pub(crate) sslcert: Option<String>,
    pub(crate) sslkey: Option<String>,
}

impl PgTlsParams {
    /// Reads and checks the TLS parameters of `url`.
    pub(crate) fn parse(url: &str) -> Result<PgTlsParams, TlsRuleError> {
        let mut p = PgTlsParams::default();
        let query = url.split_once('?').map(|(_, q)| q).unwrap_or("");
        let query = query.split('#').next().unwrap_or("");
        // Decoded as URL query parsers do (`+` a space, `%XX` a byte).
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            let slot = match k.as_ref() {
                "sslmode" | "ssl-mode" => &mut p.sslmode,
                "sslrootcert" | "ssl-root-cert" | "ssl-ca" => &mut p.sslrootcert,
                "sslcert" | "ssl-cert" => &mut p.sslcert,
                "sslkey" | "ssl-key" => &mut p.sslkey,
                _ => continue,
            };
            *slot = Some(v.into_owned());
        }
        if let Some(mode) = &p.sslmode {
            match mode.to_ascii_lowercase().as_str() {
                "disable" | "prefer" | "require" | "verify-ca" | "verify-full" => {}
                "allow" => return Err(TlsRuleError::SslModeAllow),
                _ => return Err(TlsRuleError::UnknownSslMode(mode.clone())),
            }
        }
        if p.sslcert.is_some() != p.sslkey.is_some() {
            return Err(TlsRuleError::PgCertWithoutKey);
        }
        Ok(p)
    }

    #[cfg(feature = "postgres")]
    /// libpq: with a root certificate, `require` verifies as `verify-ca`.
    pub(crate) fn require_means_verify_ca(&self) -> bool {
        self.sslrootcert.is_some()
            && self
                .sslmode
                .as_deref()
                .is_some_and(|m| m.eq_ignore_ascii_case("require"))
    }

    /// Reads and checks the files the parameters name (inline PEM, which
    /// the PostgreSQL client also takes, is checked as it is).
    pub(crate) fn check_files(&self) -> Result<(), StoreError> {
        let path = |v: &str| PathBuf::from(v);
        if let Some(ca) = self.sslrootcert.as_deref().filter(|v| !is_inline(v)) {
            read_ca(&path(ca)).map_err(|e| StoreError::config("store.url", e))?;
        }
        if let (Some(cert), Some(key)) = (&self.sslcert, &self.sslkey) {
            if !is_inline(cert) && !is_inline(key) {
                let files = ClientCertFiles {
                    cert_file: path(cert),
                    key_file: path(key),
                };
                read_identity(&files).map_err(|e| match e {
                    StoreError::Config { source, .. } => StoreError::Config {
                        field: "store.url",
                        source,
                    },
                    other => other,
                })?;
            }
        }
        Ok(())
    }
}

/// The PostgreSQL client's test for a PEM value given inline.
fn is_inline(v: &str) -> bool {
    let t = v.trim();
    t.starts_with("-----BEGIN") && t.ends_with("-----")
}

/// Reads and checks every TLS file the store config names, without
/// connecting (for `check-config`; opening the store does the same).
pub(crate) fn check_tls_files(config: &super::StoreConfig) -> Result<(), StoreError> {
    check_tls_rules(config.kind, &config.url, config.tls.as_ref())
        .map_err(|e| StoreError::config(e.field(), e))?;
    if config.kind == StoreKind::Postgres {
        PgTlsParams::parse(&config.url)
            .map_err(|e| StoreError::config(e.field(), e))?
            .check_files()?;
    }
    if let Some(tls) = &config.tls {
        tls.load()?;
    }
    Ok(())
}
