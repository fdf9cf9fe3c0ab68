//! The resolver: the checks between settings, run on the typed values once
//! a file is read (one function per section, in the sibling files), each
//! refusal naming its file, line and dotted key. Lines come from the file's
//! [`Locations`]; so does whether a key whose default depends on another
//! (a role's timings, `proxy.max_held`) was set.

use std::net::SocketAddr;

use super::file::Locations;
use super::{Config, ConfigError};

pub(super) struct Checker {
    file: String,
    pub(super) keys: Locations,
}

impl Checker {
    pub(super) fn new(text: &str, file: &str) -> Result<Self, ConfigError> {
        Ok(Self {
            file: file.to_string(),
            keys: Locations::read(text, file)?,
        })
    }

    /// A refusal of `key`, at its line.
    pub(super) fn err(&self, key: &str, message: impl Into<String>) -> ConfigError {
        self.err_at(key, key, message)
    }

    /// A refusal of `key`, at the line of `at` (the key that made it wrong).
    pub(super) fn err_at(&self, at: &str, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.clone(),
            line: self.keys.line(at),
            key: key.to_string(),
            message: message.into(),
        }
    }

    /// Every check, in the order later sections depend on earlier ones;
    /// fills the defaults that depend on other settings.
    pub(super) fn config(&self, c: &mut Config) -> Result<(), ConfigError> {
        if listeners_overlap(c.listen, c.admin_listen) {
            let at = match self.keys.has("admin_listen") {
                true => "admin_listen",
                false => "listen",
            };
            return Err(self.err_at(
                at,
                "admin_listen",
                format!("{} takes the same port as listen ({}); give the admin listener a port of its own", c.admin_listen, c.listen),
            ));
        }
        if let Some(u) = &c.upstream {
            self.upstream(u)?;
        }
        self.store(&mut c.store)?;
        let lease_at = [
            "lease.duration",
            "lease.renew_interval",
            "lease.safety_margin",
        ]
        .into_iter()
        .find(|k| self.keys.has(k))
        .unwrap_or("lease");
        c.lease
            .check()
            .map_err(|e| self.err_at(lease_at, "lease", e.to_string()))?;
        self.roles(&mut c.roles, &mut c.partitions, c.lease)?;
        if !self.keys.has("proxy.max_held") {
            c.proxy.max_held = c.proxy.max_connections;
        }
        self.routes(c)?;
        if c.telemetry.otlp.is_some() && !cfg!(feature = "otel") {
            return Err(self.err(
                "telemetry.otlp",
                "this rolegate was built without traces; build it with `cargo build --release --features otel`, or remove telemetry.otlp",
            ));
        }
        self.peers(c)?;
        self.advertise_scheme(c)
    }
}

/// Whether two listeners would bind the same port: the same address, or one
/// of them on every address (port 0 picks a free port each time).
fn listeners_overlap(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}
