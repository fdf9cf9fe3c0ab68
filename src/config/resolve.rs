//! The resolver: turns the raw YAML shapes into a [`Config`], one function
//! per section (in the sibling files), with `${VAR}` expansion and every
//! refusal naming its file, line and dotted key.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::file::{self, Location, Text};
use super::{Config, ConfigError, LeaseTimings, StoreKind};

/// Every role name seen so far, declared or generated, with where it came from.
#[derive(Default)]
pub(super) struct RoleNames(pub(super) HashMap<String, Option<Location>>);

pub(super) struct Resolver<'a> {
    pub(super) file: &'a str,
    pub(super) env: &'a dyn Fn(&str) -> Option<String>,
    /// Which store kinds this binary has.
    pub(super) built: fn(StoreKind) -> bool,
}

/// The longest duration any setting takes.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

pub(super) fn line_of(loc: &Location) -> Option<u64> {
    Some(loc.line()).filter(|l| *l > 0)
}

impl Resolver<'_> {
    pub(super) fn err(
        &self,
        loc: Option<&Location>,
        key: &str,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            file: self.file.to_string(),
            line: loc.and_then(line_of),
            key: key.to_string(),
            message: message.into(),
        }
    }

    /// Expands `${VAR}` in a string value; `$$` is a literal `$`.
    pub(super) fn text(&self, t: &Text, key: &str) -> Result<String, ConfigError> {
        expand_env(&t.value, self.env)
            .map_err(|e| self.err(Some(&t.referenced), key, e.to_string()))
    }

    pub(super) fn opt_text(
        &self,
        t: &Option<Text>,
        key: &str,
    ) -> Result<Option<String>, ConfigError> {
        t.as_ref().map(|t| self.text(t, key)).transpose()
    }

    pub(super) fn duration(
        &self,
        t: &Option<Text>,
        key: &str,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        let Some(t) = t else { return Ok(default) };
        let s = self.text(t, key)?;
        let d = humantime::parse_duration(s.trim()).map_err(|e| {
            self.err(
                Some(&t.referenced),
                key,
                format!("`{s}` is not a duration ({e}); write e.g. 500ms, 15s, 2m"),
            )
        })?;
        // Every duration is added to a clock somewhere; past this, the sum
        // would not fit.
        if d > MAX_DURATION {
            return Err(self.err(
                Some(&t.referenced),
                key,
                format!("`{s}` is longer than a year, the longest duration a setting takes"),
            ));
        }
        Ok(d)
    }

    pub(super) fn timings(
        &self,
        base: LeaseTimings,
        duration: &Option<Text>,
        renew: &Option<Text>,
        margin: &Option<Text>,
        prefix: &str,
        loc: Option<&Location>,
    ) -> Result<LeaseTimings, ConfigError> {
        let t = LeaseTimings {
            duration: self.duration(duration, &format!("{prefix}.duration"), base.duration)?,
            renew_interval: self.duration(
                renew,
                &format!("{prefix}.renew_interval"),
                base.renew_interval,
            )?,
            safety_margin: self.duration(
                margin,
                &format!("{prefix}.safety_margin"),
                base.safety_margin,
            )?,
        };
        let loc = duration
            .as_ref()
            .or(renew.as_ref())
            .or(margin.as_ref())
            .map(|t| &t.referenced)
            .or(loc);
        t.check()
            .map_err(|e| self.err(loc, prefix, e.to_string()))?;
        Ok(t)
    }

    pub(super) fn socket(
        &self,
        t: &Option<Text>,
        key: &str,
        default: &str,
    ) -> Result<SocketAddr, ConfigError> {
        let (s, loc) = match t {
            Some(t) => (self.text(t, key)?, Some(&t.referenced)),
            None => (default.to_string(), None),
        };
        s.trim().parse().map_err(|e| {
            self.err(
                loc,
                key,
                format!("`{s}` is not a socket address like 0.0.0.0:8080 ({e})"),
            )
        })
    }

    /// Every section, in the order later sections depend on earlier ones.
    pub(super) fn resolve(&self, raw: file::File) -> Result<Config, ConfigError> {
        let instance = self.instance(&raw.instance)?;
        let listen = self.socket(&raw.listen, "listen", "0.0.0.0:8080")?;
        let admin_listen = self.socket(&raw.admin_listen, "admin_listen", "127.0.0.1:9090")?;
        if listeners_overlap(listen, admin_listen) {
            let at = raw.admin_listen.as_ref().or(raw.listen.as_ref());
            return Err(self.err(
                at.map(|t| &t.referenced),
                "admin_listen",
                format!("{admin_listen} takes the same port as listen ({listen}); give the admin listener a port of its own"),
            ));
        }
        let upstream = raw
            .upstream
            .as_ref()
            .map(|u| self.upstream(u))
            .transpose()?;
        let store = self.store(raw.store.as_ref())?;
        let lease = self.timings(
            LeaseTimings::default(),
            &raw.lease.duration,
            &raw.lease.renew_interval,
            &raw.lease.safety_margin,
            "lease",
            None,
        )?;
        let mut names = RoleNames::default();
        let roles = self.roles(&raw.roles, lease, &mut names)?;
        let partitions = self.partitions(&raw.partitions, lease, &mut names)?;
        let proxy = self.proxy(&raw.proxy)?;
        let routes = self.routes(
            &raw.routes,
            &roles,
            &partitions,
            proxy.case_insensitive_paths,
        )?;
        let shutdown = self.shutdown(&raw.shutdown)?;
        let tls = self.tls(raw.tls.as_ref())?;
        let peers = self.peers(&raw.peers, tls.as_ref())?;
        self.advertise_scheme(&raw.instance, instance.advertise.as_deref(), tls.as_ref())?;
        Ok(Config {
            instance,
            listen,
            admin_listen,
            upstream,
            store,
            lease,
            roles,
            partitions,
            routes,
            proxy,
            shutdown,
            tls,
            peers,
        })
    }
}

/// Whether two listeners would bind the same port: the same address, or one
/// of them on every address (port 0 picks a free port each time).
fn listeners_overlap(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// A URL the gateway cannot use; it quotes the URL with secrets redacted.
#[derive(Debug, thiserror::Error)]
pub(super) enum UrlError {
    #[error("`{0}` is not a URL ({1})")]
    Invalid(String, #[source] http::uri::InvalidUri),
    #[error("`{0}` must start with http:// or https://")]
    Scheme(String),
    #[error("`{0}` has no host")]
    NoHost(String),
    #[error("`{0}` has a query (`?…`); a path prefix is all a base URL may add")]
    Query(String),
    #[error("`{0}` has a fragment (`#…`); a path prefix is all a base URL may add")]
    Fragment(String),
}

pub(super) fn check_http_url(s: &str) -> Result<(), UrlError> {
    let uri: Result<http::Uri, _> = s.parse();
    let shown = crate::redact::redact_url(s);
    let uri = uri.map_err(|e| UrlError::Invalid(shown.clone(), e))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(UrlError::Scheme(shown)),
    }
    if uri.host().is_none() {
        return Err(UrlError::NoHost(shown));
    }
    // Every request's path is appended: a query here would end up in the
    // middle of the app's path.
    if uri.query().is_some() {
        return Err(UrlError::Query(shown));
    }
    // A fragment is dropped when the URI is parsed, and with it every path
    // appended after it: the app would see the prefix alone.
    if s.contains('#') {
        return Err(UrlError::Fragment(shown));
    }
    Ok(())
}

/// A `${VAR}` that cannot be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// `${` without `}`.
    #[error("unterminated `${{` in `{0}`")]
    Unterminated(String),
    /// A name outside `[A-Za-z0-9_]+`.
    #[error("`${{{0}}}` is not a valid variable name")]
    BadName(String),
    /// The variable is not set.
    #[error("environment variable `{0}` is not set")]
    Unset(String),
}

/// Expands `${NAME}`; an unset variable is an error. `$$` stands for `$`.
pub fn expand_env(input: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, EnvError> {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| EnvError::Unterminated(input.to_string()))?;
            let name = &body[..end];
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(EnvError::BadName(name.to_string()));
            }
            let value = env(name).ok_or_else(|| EnvError::Unset(name.to_string()))?;
            out.push_str(&value);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}
