//! The `tls` and `peers` sections, and the rules between them and
//! `instance.advertise`. Only paths are checked here; the files themselves
//! are read by [`crate::tls::check_files`] (`check-config`) and at start.

use std::path::PathBuf;

use super::file::{self, Spanned, Text};
use super::resolve::Resolver;
use super::ConfigError;
use crate::protocol::HopProtocol;
use crate::tls::{PeersConfig, TlsConfig};

impl Resolver<'_> {
    fn path(&self, t: &Option<Text>, key: &str) -> Result<Option<PathBuf>, ConfigError> {
        let Some(t) = t else { return Ok(None) };
        let s = self.text(t, key)?;
        if s.trim().is_empty() {
            return Err(self.err(Some(&t.referenced), key, "must be a file path"));
        }
        Ok(Some(PathBuf::from(s)))
    }

    pub(super) fn tls(
        &self,
        raw: Option<&Spanned<file::Tls>>,
    ) -> Result<Option<TlsConfig>, ConfigError> {
        let Some(raw) = raw else { return Ok(None) };
        let at = Some(&raw.referenced);
        let required = |t: &Option<Text>, key: &str| -> Result<PathBuf, ConfigError> {
            self.path(t, key)?
                .ok_or_else(|| self.err(at, key, "is required when `tls` is set (PEM file)"))
        };
        Ok(Some(TlsConfig {
            cert_file: required(&raw.value.cert_file, "tls.cert_file")?,
            key_file: required(&raw.value.key_file, "tls.key_file")?,
            client_ca_file: self.path(&raw.value.client_ca_file, "tls.client_ca_file")?,
        }))
    }

    pub(super) fn peers(
        &self,
        raw: &file::Peers,
        tls: Option<&TlsConfig>,
    ) -> Result<PeersConfig, ConfigError> {
        let peers = PeersConfig {
            ca_file: self.path(&raw.ca_file, "peers.ca_file")?,
            cert_file: self.path(&raw.cert_file, "peers.cert_file")?,
            key_file: self.path(&raw.key_file, "peers.key_file")?,
            require_client_cert: raw.require_client_cert.as_ref().is_some_and(|b| b.value),
            protocol: match &raw.protocol {
                None => HopProtocol::Http1,
                Some(p) => match self.text(p, "peers.protocol")?.as_str() {
                    "http1" => HopProtocol::Http1,
                    "h2" => HopProtocol::Http2,
                    other => {
                        return Err(self.err(
                            Some(&p.referenced),
                            "peers.protocol",
                            format!("`{other}` is not a protocol: use http1 or h2"),
                        ))
                    }
                },
            },
        };
        match (&raw.cert_file, &raw.key_file) {
            (Some(t), None) => {
                return Err(self.err(
                    Some(&t.referenced),
                    "peers.key_file",
                    "is required with peers.cert_file",
                ))
            }
            (None, Some(t)) => {
                return Err(self.err(
                    Some(&t.referenced),
                    "peers.cert_file",
                    "is required with peers.key_file",
                ))
            }
            _ => {}
        }
        if let Some(flag) = raw.require_client_cert.as_ref().filter(|b| b.value) {
            let missing = match (tls, &peers.ca_file) {
                (None, _) => {
                    Some("needs `tls`: client certificates are asked for in the TLS handshake")
                }
                (_, None) => {
                    Some("needs peers.ca_file: it is the CA peer certificates must chain to")
                }
                _ => None,
            };
            if let Some(why) = missing {
                return Err(self.err(Some(&flag.referenced), "peers.require_client_cert", why));
            }
        }
        Ok(peers)
    }

    /// An `https://` advertise address needs the listener to serve TLS.
    pub(super) fn advertise_scheme(
        &self,
        raw: &file::Instance,
        advertise: Option<&str>,
        tls: Option<&TlsConfig>,
    ) -> Result<(), ConfigError> {
        let https =
            advertise.is_some_and(|a| a.len() >= 8 && a[..8].eq_ignore_ascii_case("https://"));
        if https && tls.is_none() {
            return Err(self.err(
                raw.advertise.as_ref().map(|t| &t.referenced),
                "instance.advertise",
                "is https:// but the listener serves plain HTTP: set `tls` (cert_file, key_file), or advertise http://",
            ));
        }
        if advertise.is_some() && !https && tls.is_some() {
            return Err(self.err(
                raw.advertise.as_ref().map(|t| &t.referenced),
                "instance.advertise",
                "is http:// but the listener serves only TLS: advertise https://",
            ));
        }
        Ok(())
    }
}
