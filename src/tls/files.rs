//! Reading the PEM files the `tls` and `peers` settings name, and the
//! rustls configs the gateway builds from them.

use super::{PeersConfig, TlsConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;

/// Why TLS material could not be used; each names the file and its key.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    /// The file could not be read.
    #[error("{key}: cannot read {}", path.display())]
    Read {
        /// The config key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not PEM of the expected kind.
    #[error("{key}: {} is not valid PEM", path.display())]
    Pem {
        /// The config key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The file holds no certificate.
    #[error("{key}: {} holds no PEM certificate", path.display())]
    NoCertificate {
        /// The config key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// The file holds no private key.
    #[error("{key}: {} holds no PEM private key", path.display())]
    NoKey {
        /// The config key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// The key is unusable or does not belong to the certificate.
    #[error("{key}: {} does not match the certificate in {}, or is not a supported key", key_path.display(), cert_path.display())]
    KeyMismatch {
        /// The config key naming the key file.
        key: &'static str,
        /// The certificate file.
        cert_path: PathBuf,
        /// The key file.
        key_path: PathBuf,
        /// What rustls reported.
        #[source]
        source: Box<rustls::Error>,
    },
    /// A CA file holds a certificate that cannot be a trust anchor.
    #[error("{key}: {} holds a certificate that is not a usable CA", path.display())]
    BadCa {
        /// The config key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What rustls reported.
        #[source]
        source: rustls::Error,
    },
    /// A verifier or config could not be built from the material.
    #[error("TLS setup failed")]
    Setup(#[source] rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("{key}: cannot verify client certificates with it")]
    Verifier {
        /// The config key naming the CA file.
        key: &'static str,
        /// What rustls reported.
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
}

impl TlsError {
    /// The error with its causes, `outer: cause: root cause`.
    pub(crate) fn report(&self) -> String {
        let mut s = self.to_string();
        let mut next = std::error::Error::source(self);
        while let Some(cause) = next {
            s.push_str(": ");
            s.push_str(&cause.to_string());
            next = cause.source();
        }
        s
    }
}

/// The crypto provider every TLS config of the gateway uses.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        key,
        path: path.to_path_buf(),
        source,
    })
}

/// Every certificate in a PEM file (at least one).
pub(crate) fn certificates(
    key: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(key, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            key,
            path: path.to_path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            key,
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

fn private_key(key: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(key, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|source| match source {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey {
            key,
            path: path.to_path_buf(),
        },
        source => TlsError::Pem {
            key,
            path: path.to_path_buf(),
            source,
        },
    })
}

/// A certificate chain with its key, checked to belong together.
/// `keys` names the config keys of the two files, e.g. `tls.cert_file`.
pub(crate) fn certified_key(
    keys: (&'static str, &'static str),
    cert_path: &Path,
    key_path: &Path,
) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(keys.0, cert_path)?;
    let key = private_key(keys.1, key_path)?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|source| TlsError::KeyMismatch {
        key: keys.1,
        cert_path: cert_path.to_path_buf(),
        key_path: key_path.to_path_buf(),
        source: Box::new(source),
    })
}

/// The certificates of a CA file as trust anchors, added to `roots`.
pub(crate) fn add_roots(
    roots: &mut RootCertStore,
    key: &'static str,
    path: &Path,
) -> Result<(), TlsError> {
    for cert in certificates(key, path)? {
        roots.add(cert).map_err(|source| TlsError::BadCa {
            key,
            path: path.to_path_buf(),
            source,
        })?;
    }
    Ok(())
}

/// The client config for hops to https peers: `peers.ca_file` (or the web
/// PKI roots) and, with `peers.cert_file`, the client certificate. `None`
/// when `peers` sets neither, so hops use the default client.
pub(crate) fn peer_client_config(
    peers: &PeersConfig,
) -> Result<Option<rustls::ClientConfig>, TlsError> {
    if peers.ca_file.is_none() && peers.cert_file.is_none() {
        return Ok(None);
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Setup)?;
    let builder = match &peers.ca_file {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            add_roots(&mut roots, "peers.ca_file", ca)?;
            builder.with_root_certificates(roots)
        }
        None => hyper_rustls::ConfigBuilderExt::with_webpki_roots(builder),
    };
    let config = match (&peers.cert_file, &peers.key_file) {
        (Some(cert), Some(key)) => {
            let chain = certificates("peers.cert_file", cert)?;
            let private = private_key("peers.key_file", key)?;
            // The same check as the listener's pair: the key must be the certificate's.
            CertifiedKey::from_der(chain.clone(), private.clone_key(), &provider()).map_err(
                |source| TlsError::KeyMismatch {
                    key: "peers.key_file",
                    cert_path: cert.clone(),
                    key_path: key.clone(),
                    source: Box::new(source),
                },
            )?;
            builder
                .with_client_auth_cert(chain, private)
                .map_err(TlsError::Setup)?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Some(config))
}

/// Whom the public listener asks for a client certificate, and which of
/// those certificates make a connection a verified peer gateway.
#[derive(Debug, Clone)]
pub(crate) struct ClientAuth {
    /// The handshake's verifier: `client_ca_file` (mandatory) and, with
    /// `require_client_cert`, `peers.ca_file` too.
    pub(crate) handshake: Option<Arc<dyn ClientCertVerifier>>,
    /// `peers.ca_file` alone, judged after the handshake: only a chain to it
    /// makes a peer (a certificate from `client_ca_file` never does).
    pub(crate) peers: Option<Arc<dyn ClientCertVerifier>>,
}

impl ClientAuth {
    /// Builds both verifiers from the config (reads the CA files).
    pub(crate) fn new(tls: &TlsConfig, peers: &PeersConfig) -> Result<Self, TlsError> {
        let mut roots = RootCertStore::empty();
        if let Some(ca) = &tls.client_ca_file {
            add_roots(&mut roots, "tls.client_ca_file", ca)?;
        }
        let peer_ca = peers.ca_file.as_ref().filter(|_| peers.require_client_cert);
        let mut peer_roots = RootCertStore::empty();
        if let Some(ca) = peer_ca {
            add_roots(&mut peer_roots, "peers.ca_file", ca)?;
            roots.roots.extend(peer_roots.roots.iter().cloned());
        }
        let handshake = if roots.is_empty() {
            None
        } else {
            let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
            // Peers are asked, not obliged: a client certificate is only
            // mandatory when `client_ca_file` says every client needs one.
            let builder = if tls.client_ca_file.is_some() {
                builder
            } else {
                builder.allow_unauthenticated()
            };
            let key = if tls.client_ca_file.is_some() {
                "tls.client_ca_file"
            } else {
                "peers.ca_file"
            };
            Some(
                builder
                    .build()
                    .map_err(|source| TlsError::Verifier { key, source })?,
            )
        };
        let peers = match peer_ca {
            None => None,
            Some(_) => Some(
                WebPkiClientVerifier::builder_with_provider(Arc::new(peer_roots), provider())
                    .build()
                    .map_err(|source| TlsError::Verifier {
                        key: "peers.ca_file",
                        source,
                    })?,
            ),
        };
        Ok(Self { handshake, peers })
    }

    /// Whether a client's certificate chain (leaf first) chains to
    /// `peers.ca_file`. False without a chain or without peer verification.
    pub(crate) fn is_peer(&self, chain: Option<&[CertificateDer<'_>]>) -> bool {
        let (Some(verifier), Some((leaf, intermediates))) =
            (&self.peers, chain.and_then(|c| c.split_first()))
        else {
            return false;
        };
        verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .is_ok()
    }
}

/// Reads every TLS file the config names, as the gateway would at start,
/// so `check-config` refuses what `run` would.
pub(crate) fn check_files(tls: Option<&TlsConfig>, peers: &PeersConfig) -> Result<(), TlsError> {
    if let Some(tls) = tls {
        certified_key(
            ("tls.cert_file", "tls.key_file"),
            &tls.cert_file,
            &tls.key_file,
        )?;
        ClientAuth::new(tls, peers)?;
    }
    peer_client_config(peers)?;
    Ok(())
}
