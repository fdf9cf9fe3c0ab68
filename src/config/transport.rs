//! The `tls` and `peers` sections' checks, and the rules between them and
//! `instance.advertise` (in `instance.rs`). Only paths are checked here;
//! the files themselves are read by [`crate::tls::check_files`]
//! (`check-config`) and at start.

use super::resolve::Checker;
use super::{Config, ConfigError};

impl Checker {
    pub(super) fn peers(&self, c: &Config) -> Result<(), ConfigError> {
        if let Some(tls) = &c.tls {
            for (file, key) in [
                (&tls.cert_file, "tls.cert_file"),
                (&tls.key_file, "tls.key_file"),
            ] {
                if file.as_os_str().is_empty() {
                    return Err(self.err_at(
                        "tls",
                        key,
                        "is required when `tls` is set (PEM file)",
                    ));
                }
            }
        }
        let peers = &c.peers;
        match (&peers.cert_file, &peers.key_file) {
            (Some(_), None) => {
                return Err(self.err_at(
                    "peers.cert_file",
                    "peers.key_file",
                    "is required with peers.cert_file",
                ))
            }
            (None, Some(_)) => {
                return Err(self.err_at(
                    "peers.key_file",
                    "peers.cert_file",
                    "is required with peers.key_file",
                ))
            }
            _ => {}
        }
        if peers.require_client_cert {
            let missing = match (&c.tls, &peers.ca_file) {
                (None, _) => {
                    Some("needs `tls`: client certificates are asked for in the TLS handshake")
                }
                (_, None) => {
                    Some("needs peers.ca_file: it is the CA peer certificates must chain to")
                }
                _ => None,
            };
            if let Some(why) = missing {
                return Err(self.err("peers.require_client_cert", why));
            }
        }
        Ok(())
    }
}
