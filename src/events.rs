//! The opt-in event log (`rolegate run --events FILE`): JSON lines recording
//! every interval in which this gateway believed it held a role (began,
//! renewed, ended) and every request it admitted for local execution, with
//! times on `CLOCK_MONOTONIC` in nanoseconds — one clock for every process on
//! a machine, so logs of different gateways compare exactly. Each line is
//! written with one `write` call, so a `kill -9` loses at most the line being
//! written. Used by the fault-injection checker (`tests/chaos.rs`).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use crate::lease::LeaseEvent;

/// Nanoseconds on `CLOCK_MONOTONIC` now.
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

pub struct EventLog {
    file: Mutex<File>,
    base: Instant,
    base_ns: u64,
}

impl EventLog {
    pub fn create(path: &Path) -> std::io::Result<EventLog> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let base = Instant::now();
        let base_ns = monotonic_ns();
        Ok(EventLog {
            file: Mutex::new(file),
            base,
            base_ns,
        })
    }

    /// An `Instant` as nanoseconds on `CLOCK_MONOTONIC`.
    pub fn ns(&self, t: Instant) -> u64 {
        match t.checked_duration_since(self.base) {
            Some(d) => self.base_ns.saturating_add(d.as_nanos() as u64),
            None => self
                .base_ns
                .saturating_sub((self.base - t).as_nanos() as u64),
        }
    }

    fn write(&self, value: serde_json::Value) {
        let mut line = value.to_string();
        line.push('\n');
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = f.write_all(line.as_bytes()) {
            tracing::warn!(error = %e, "cannot write the event log");
        }
    }

    pub fn started(&self, instance: &str) {
        self.write(serde_json::json!({"ev": "start", "instance": instance, "pid": std::process::id(), "t": monotonic_ns()}));
    }

    pub fn lease(&self, e: &LeaseEvent) {
        let v = match e {
            LeaseEvent::Began {
                instance,
                role,
                token,
                at,
                until,
            } => serde_json::json!({
                "ev": "began", "instance": &**instance, "role": &**role, "token": token,
                "t": self.ns(*at), "until": self.ns(*until)
            }),
            LeaseEvent::Renewed {
                instance,
                role,
                token,
                until,
            } => serde_json::json!({
                "ev": "renewed", "instance": &**instance, "role": &**role, "token": token, "until": self.ns(*until)
            }),
            LeaseEvent::Ended {
                instance,
                role,
                token,
                at,
            } => serde_json::json!({
                "ev": "ended", "instance": &**instance, "role": &**role, "token": token, "t": self.ns(*at)
            }),
        };
        self.write(v);
    }

    /// A request admitted for local execution under `token`, judged held at `at`.
    pub fn admitted(&self, instance: &str, role: &str, token: u64, at: Instant) {
        self.write(serde_json::json!({
            "ev": "admit", "instance": instance, "role": role, "token": token, "t": self.ns(at)
        }));
    }
}
