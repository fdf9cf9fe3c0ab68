//! The `instance`, `upstream` and `shutdown` sections.

use std::time::Duration;

use super::file;
use super::resolve::{check_http_url, Resolver};
use super::{
    ConfigError, HealthConfig, HopProtocol, InstanceConfig, ShutdownConfig, UpstreamConfig,
};

/// Defaults of the `upstream.health` and `shutdown` sections.
pub(super) mod defaults {
    use std::time::Duration;
    /// `upstream.health.path`.
    pub(crate) const HEALTH_PATH: &str = "/healthz";
    /// `upstream.health.interval`.
    pub(crate) const HEALTH_INTERVAL: Duration = Duration::from_secs(2);
    /// `upstream.health.unhealthy_after`.
    pub(crate) const UNHEALTHY_AFTER: u32 = 3;
    /// `shutdown.drain_timeout`.
    pub(crate) const DRAIN_TIMEOUT: Duration = crate::lease::DEFAULT_DRAIN_TIMEOUT;
}

impl Resolver<'_> {
    pub(super) fn instance(&self, raw: &file::Instance) -> Result<InstanceConfig, ConfigError> {
        let name = self.opt_text(&raw.name, "instance.name")?;
        if let (Some(name), Some(t)) = (&name, &raw.name) {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
                || name.len() > 64
            {
                return Err(self.err(
                    Some(&t.referenced),
                    "instance.name",
                    "must be 1-64 characters of [A-Za-z0-9._-]",
                ));
            }
        }
        let advertise = match &raw.advertise {
            Some(t) => {
                let s = self.text(t, "instance.advertise")?;
                check_http_url(&s).map_err(|e| {
                    self.err(Some(&t.referenced), "instance.advertise", e.to_string())
                })?;
                Some(s.trim_end_matches('/').to_string())
            }
            None => None,
        };
        Ok(InstanceConfig { name, advertise })
    }

    pub(super) fn upstream(&self, u: &file::Upstream) -> Result<UpstreamConfig, ConfigError> {
        let url = self.text(&u.url, "upstream.url")?;
        check_http_url(&url)
            .map_err(|e| self.err(Some(&u.url.referenced), "upstream.url", e.to_string()))?;
        let health = u.health.as_ref().map(|h| self.health(h)).transpose()?;
        let protocol = match &u.protocol {
            None => HopProtocol::Http1,
            Some(p) => match self.text(p, "upstream.protocol")?.as_str() {
                "http1" => HopProtocol::Http1,
                "h2c" if url.starts_with("https://") => {
                    return Err(self.err(
                        Some(&p.referenced),
                        "upstream.protocol",
                        "h2c is HTTP/2 without TLS; an https upstream takes http1",
                    ))
                }
                "h2c" => HopProtocol::Http2,
                other => {
                    return Err(self.err(
                        Some(&p.referenced),
                        "upstream.protocol",
                        format!("`{other}` is not a protocol: use http1 or h2c"),
                    ))
                }
            },
        };
        let close_after_body = u.close_after_body.unwrap_or(false);
        if close_after_body && protocol == HopProtocol::Http2 {
            return Err(self.err(
                None,
                "upstream.close_after_body",
                "applies to http1 upstreams only: over h2c every body is framed, and a body left unread cannot become a request",
            ));
        }
        Ok(UpstreamConfig {
            url: url.trim_end_matches('/').to_string(),
            protocol,
            health,
            close_after_body,
        })
    }

    fn health(&self, h: &file::Health) -> Result<HealthConfig, ConfigError> {
        let path = self
            .opt_text(&h.path, "upstream.health.path")?
            .unwrap_or_else(|| defaults::HEALTH_PATH.into());
        if !path.starts_with('/') {
            return Err(self.err(
                h.path.as_ref().map(|p| &p.referenced),
                "upstream.health.path",
                "must start with /",
            ));
        }
        let interval = self.duration(
            &h.interval,
            "upstream.health.interval",
            defaults::HEALTH_INTERVAL,
        )?;
        if interval.is_zero() {
            return Err(self.err(
                h.interval.as_ref().map(|p| &p.referenced),
                "upstream.health.interval",
                "must be greater than 0",
            ));
        }
        let unhealthy_after = match &h.unhealthy_after {
            None => defaults::UNHEALTHY_AFTER,
            Some(n) if n.value >= 1 && n.value <= 1000 => n.value as u32,
            Some(n) => {
                return Err(self.err(
                    Some(&n.referenced),
                    "upstream.health.unhealthy_after",
                    "must be between 1 and 1000",
                ))
            }
        };
        Ok(HealthConfig {
            path,
            interval,
            unhealthy_after,
        })
    }

    pub(super) fn shutdown(&self, raw: &file::Shutdown) -> Result<ShutdownConfig, ConfigError> {
        let drain_timeout: Duration = self.duration(
            &raw.drain_timeout,
            "shutdown.drain_timeout",
            defaults::DRAIN_TIMEOUT,
        )?;
        Ok(ShutdownConfig { drain_timeout })
    }
}
