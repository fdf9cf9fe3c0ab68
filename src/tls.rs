//! TLS material: the `tls` and `peers` settings, reading PEM certificates,
//! keys and CA bundles (rustls with the ring provider; no OpenSSL), and the
//! rustls configs built from them: the client config for hops to peer
//! gateways, and the client-certificate verifiers of the public listener.
//! The listener's handshake and certificate reload live in the gateway.

use crate::protocol::HopProtocol;
use std::path::PathBuf;

#[cfg(feature = "gateway")]
mod files;
#[cfg(feature = "gateway")]
pub(crate) use files::{
    certified_key, check_files, peer_client_config, provider, ClientAuth, TlsError,
};

/// `tls`: the public listener serves HTTPS with this certificate.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first; re-read when the file changes.
    #[serde(default, with = "crate::value::path")]
    pub cert_file: PathBuf,
    /// PEM private key of the leaf (PKCS#8, PKCS#1 or SEC1).
    #[serde(default, with = "crate::value::path")]
    pub key_file: PathBuf,
    /// When set, every client must present a certificate from this CA.
    #[serde(
        default,
        with = "crate::value::opt_path",
        skip_serializing_if = "Option::is_none"
    )]
    pub client_ca_file: Option<PathBuf>,
}

/// `peers`: TLS between gateways.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct PeersConfig {
    /// Verify https peers against this CA instead of the web PKI roots.
    #[serde(
        default,
        with = "crate::value::opt_path",
        skip_serializing_if = "Option::is_none"
    )]
    pub ca_file: Option<PathBuf>,
    /// Client certificate presented on hops (mutual TLS).
    #[serde(
        default,
        with = "crate::value::opt_path",
        skip_serializing_if = "Option::is_none"
    )]
    pub cert_file: Option<PathBuf>,
    /// Its private key.
    #[serde(
        default,
        with = "crate::value::opt_path",
        skip_serializing_if = "Option::is_none"
    )]
    pub key_file: Option<PathBuf>,
    /// Refuse hop-marked requests on connections without a client
    /// certificate from `ca_file`.
    #[serde(default)]
    pub require_client_cert: bool,
    /// `http1` (pooled connections, the default) or `h2` (one multiplexed
    /// HTTP/2 connection per peer). gRPC hops are HTTP/2 either way.
    #[serde(default, with = "peer_protocol")]
    pub protocol: HopProtocol,
}

/// `peers.protocol`: `http1` or `h2`.
mod peer_protocol {
    use crate::protocol::HopProtocol;
    use serde::{Deserializer, Serializer};
    const WORDS: &[(&str, HopProtocol)] =
        &[("http1", HopProtocol::Http1), ("h2", HopProtocol::Http2)];
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<HopProtocol, D::Error> {
        crate::value::word(d, WORDS, "a protocol")
    }
    pub(crate) fn serialize<S: Serializer>(v: &HopProtocol, s: S) -> Result<S::Ok, S::Error> {
        crate::value::write_word(v, WORDS, s)
    }
}
