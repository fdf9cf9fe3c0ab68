//! The `instance`, `listen`, `upstream` and `shutdown` settings: how their
//! values are read, and the checks between them.

use std::net::SocketAddr;

use serde::de::Error as _;
use serde::{Deserializer, Serializer};

use super::resolve::Checker;
use super::value;
use super::{Config, ConfigError, HopProtocol, UpstreamConfig};

/// `listen` when unset.
pub(super) fn listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 8080))
}

/// `admin_listen` when unset.
pub(super) fn admin_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9090))
}

/// `instance.name`: 1-64 characters of `[A-Za-z0-9._-]`.
pub(super) mod name {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        let Some(name) = value::opt_text::deserialize(d)? else {
            return Ok(None);
        };
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(D::Error::custom(
                "must be 1-64 characters of [A-Za-z0-9._-]",
            ));
        }
        Ok(Some(name))
    }
    pub(crate) use value::opt_text::serialize;
}

/// `upstream.health.path`: starts with `/`.
pub(super) mod health_path {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        let path = value::text::deserialize(d)?;
        if !path.starts_with('/') {
            return Err(D::Error::custom("must start with /"));
        }
        Ok(path)
    }
    pub(crate) use value::text::serialize;
}

impl Checker {
    pub(super) fn upstream(&self, u: &UpstreamConfig) -> Result<(), ConfigError> {
        if u.protocol == HopProtocol::Http2 && u.url.starts_with("https://") {
            return Err(self.err(
                "upstream.protocol",
                "h2c is HTTP/2 without TLS; an https upstream takes http1",
            ));
        }
        if u.close_after_body && u.protocol == HopProtocol::Http2 {
            return Err(self.err(
                "upstream.close_after_body",
                "applies to http1 upstreams only: over h2c every body is framed, and a body left unread cannot become a request",
            ));
        }
        Ok(())
    }

    /// An `https://` advertise address needs the listener to serve TLS.
    pub(super) fn advertise_scheme(&self, c: &Config) -> Result<(), ConfigError> {
        let Some(advertise) = c.instance.advertise.as_deref() else {
            return Ok(());
        };
        let https = advertise.len() >= 8 && advertise[..8].eq_ignore_ascii_case("https://");
        if https && c.tls.is_none() {
            return Err(self.err(
                "instance.advertise",
                "is https:// but the listener serves plain HTTP: set `tls` (cert_file, key_file), or advertise http://",
            ));
        }
        if !https && c.tls.is_some() {
            return Err(self.err(
                "instance.advertise",
                "is http:// but the listener serves only TLS: advertise https://",
            ));
        }
        Ok(())
    }
}

/// `upstream.protocol`: `http1` or `h2c`.
pub(super) mod upstream_protocol {
    use super::*;
    use crate::protocol::HopProtocol;
    const WORDS: &[(&str, HopProtocol)] =
        &[("http1", HopProtocol::Http1), ("h2c", HopProtocol::Http2)];
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<HopProtocol, D::Error> {
        value::word(d, WORDS, "a protocol")
    }
    pub(crate) fn serialize<S: Serializer>(v: &HopProtocol, s: S) -> Result<S::Ok, S::Error> {
        value::write_word(v, WORDS, s)
    }
}
