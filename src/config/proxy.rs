//! The `proxy` section. Its defaults live with the proxy
//! ([`crate::proxy::defaults`]), which the library layers use too.

use std::time::Duration;

use super::file::{self, Text};
use super::resolve::Resolver;
use super::{ConfigError, Http2Config, ProxyConfig};
use crate::proxy::defaults as d;
use crate::proxy::trust::CidrError;
use crate::proxy::Cidr;

/// The longest `proxy.hold_timeout` accepted.
const MAX_HOLD: Duration = Duration::from_secs(3600);

impl Resolver<'_> {
    pub(super) fn proxy(&self, raw: &file::Proxy) -> Result<ProxyConfig, ConfigError> {
        let connect_timeout = self.positive(
            &raw.connect_timeout,
            "proxy.connect_timeout",
            d::CONNECT_TIMEOUT,
        )?;
        let response_header_timeout = self.positive(
            &raw.response_header_timeout,
            "proxy.response_header_timeout",
            d::RESPONSE_HEADER_TIMEOUT,
        )?;
        let idle_timeout =
            self.positive(&raw.idle_timeout, "proxy.idle_timeout", d::IDLE_TIMEOUT)?;
        let cluster_secret = self.opt_text(&raw.cluster_secret, "proxy.cluster_secret")?;
        if let (Some(s), Some(t)) = (&cluster_secret, &raw.cluster_secret) {
            if s.len() < 16 {
                return Err(self.err(
                    Some(&t.referenced),
                    "proxy.cluster_secret",
                    "must be at least 16 bytes (use a random string)",
                ));
            }
        }
        let max_connections = match &raw.max_connections {
            None => d::MAX_CONNECTIONS,
            Some(m) if m.value == 0 || m.value > 1_000_000 => {
                return Err(self.err(
                    Some(&m.referenced),
                    "proxy.max_connections",
                    "must be between 1 and 1000000",
                ))
            }
            Some(m) => m.value as usize,
        };
        let hold_timeout =
            self.duration(&raw.hold_timeout, "proxy.hold_timeout", d::HOLD_TIMEOUT)?;
        if hold_timeout > MAX_HOLD {
            return Err(self.err(
                raw.hold_timeout.as_ref().map(|t| &t.referenced),
                "proxy.hold_timeout",
                "must be at most 1h: a request held longer has long been given up by its client",
            ));
        }
        let max_held = match &raw.max_held {
            None => max_connections,
            Some(m) if m.value > 1_000_000 => {
                return Err(self.err(
                    Some(&m.referenced),
                    "proxy.max_held",
                    "must be between 0 and 1000000",
                ))
            }
            Some(m) => m.value as usize,
        };
        Ok(ProxyConfig {
            hold_timeout,
            max_held,
            connect_timeout,
            response_header_timeout,
            retry_after: raw.retry_after.as_ref().map(|s| s.value),
            cluster_secret,
            idle_timeout,
            case_insensitive_paths: raw
                .case_insensitive_paths
                .unwrap_or(d::CASE_INSENSITIVE_PATHS),
            upgrades: self.upgrades(raw.upgrades.as_deref())?,
            trusted_proxies: self.trusted_proxies(raw.trusted_proxies.as_deref())?,
            max_connections,
            http2: self.http2(&raw.http2)?,
        })
    }

    /// A duration that must be above zero.
    fn positive(
        &self,
        t: &Option<Text>,
        key: &str,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        let v = self.duration(t, key, default)?;
        if v.is_zero() {
            return Err(self.err(
                t.as_ref().map(|t| &t.referenced),
                key,
                "must be greater than 0",
            ));
        }
        Ok(v)
    }

    fn http2(&self, raw: &file::Http2) -> Result<Http2Config, ConfigError> {
        let max_concurrent_streams = match &raw.max_concurrent_streams {
            None => d::HTTP2_MAX_CONCURRENT_STREAMS,
            Some(m) if m.value == 0 || m.value > 10_000 => {
                return Err(self.err(
                    Some(&m.referenced),
                    "proxy.http2.max_concurrent_streams",
                    "must be between 1 and 10000",
                ))
            }
            Some(m) => m.value as u32,
        };
        Ok(Http2Config {
            enabled: raw.enabled.unwrap_or(true),
            max_concurrent_streams,
        })
    }

    fn upgrades(&self, raw: Option<&[Text]>) -> Result<Vec<String>, ConfigError> {
        let Some(raw) = raw else {
            return Ok(d::UPGRADES.iter().map(|s| s.to_string()).collect());
        };
        let mut upgrades = Vec::new();
        for (i, u) in raw.iter().enumerate() {
            let key = format!("proxy.upgrades[{i}]");
            let name = self.text(u, &key)?.to_ascii_lowercase();
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'/'))
            {
                return Err(self.err(
                    Some(&u.referenced),
                    &key,
                    format!("`{name}` is not a protocol name"),
                ));
            }
            if name == "h2c" {
                return Err(self.err(
                    Some(&u.referenced),
                    &key,
                    "h2c cannot be passed through: the tunnel would carry requests past the gate",
                ));
            }
            upgrades.push(name);
        }
        Ok(upgrades)
    }

    fn trusted_proxies(&self, raw: Option<&[Text]>) -> Result<Vec<Cidr>, ConfigError> {
        let mut trusted = Vec::new();
        for (i, t) in raw.unwrap_or_default().iter().enumerate() {
            let key = format!("proxy.trusted_proxies[{i}]");
            let text = self.text(t, &key)?;
            trusted.push(
                text.parse()
                    .map_err(|e: CidrError| self.err(Some(&t.referenced), &key, e.to_string()))?,
            );
        }
        Ok(trusted)
    }
}
