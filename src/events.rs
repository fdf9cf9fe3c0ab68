//! The opt-in event log (`rolegate run --events FILE`): JSON lines recording
//! every interval in which this gateway believed it held a role (began,
//! renewed, ended) and every request it admitted for local execution, with
//! times on `CLOCK_MONOTONIC` in nanoseconds — one clock for every process on
//! a machine, so logs of different gateways compare exactly. Each line is
//! written with one `write` call, so a `kill -9` loses at most the line being
//! written. Used by the fault-injection checker (`tests/chaos.rs`).
//!
//! Every line is one [`Event`], for example:
//!
//! ```json
//! {"ev":"began","instance":"gw-1a2b3c4d","role":"maintenance","token":7,"t":1234,"until":5678}
//! ```

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

use crate::lease::LeaseEvent;

/// Nanoseconds on `CLOCK_MONOTONIC` now.
pub(crate) fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// One line of the event log. The variant is the `ev` key (`start`, `began`,
/// `renewed`, `ended`, `admit`); the fields follow it in declaration order.
/// Times (`t`, `until`) are nanoseconds on `CLOCK_MONOTONIC`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(test, derive(serde::Deserialize))]
#[serde(tag = "ev", rename_all = "lowercase")]
pub(crate) enum Event {
    /// The gateway process started with this instance id.
    Start {
        /// The instance id of the process (new on every start).
        instance: String,
        /// The operating-system process id.
        pid: u32,
        /// When the line was written.
        t: u64,
    },
    /// A term began: `instance` believes it holds `role` from `t`.
    Began {
        /// The instance holding the role.
        instance: String,
        /// The role held.
        role: String,
        /// The fencing token of the term.
        token: u64,
        /// When the belief began.
        t: u64,
        /// The local trust deadline at the start; renewals extend it.
        until: u64,
    },
    /// A term was renewed: the belief now lasts until `until`.
    Renewed {
        /// The instance holding the role.
        instance: String,
        /// The role held.
        role: String,
        /// The fencing token of the term.
        token: u64,
        /// The new local trust deadline.
        until: u64,
    },
    /// A term ended: `instance` no longer believes it holds `role` from `t`.
    Ended {
        /// The instance that held the role.
        instance: String,
        /// The role that was held.
        role: String,
        /// The fencing token of the term.
        token: u64,
        /// When the belief ended.
        t: u64,
    },
    /// A request was admitted for local execution under `token`.
    Admit {
        /// The admitting instance.
        instance: String,
        /// The role the request was routed by.
        role: String,
        /// The fencing token the request carries to the app.
        token: u64,
        /// When the role was judged held for this request.
        t: u64,
    },
}

/// An append-only event log file; shared by the coordinator's lease hook and
/// the request path.
pub(crate) struct EventLog {
    file: Mutex<File>,
    base: Instant,
    base_ns: u64,
}

impl EventLog {
    /// Opens `path` for appending, creating it if needed.
    pub(crate) fn create(path: &Path) -> std::io::Result<EventLog> {
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
    pub(crate) fn ns(&self, t: Instant) -> u64 {
        match t.checked_duration_since(self.base) {
            Some(d) => self.base_ns.saturating_add(d.as_nanos() as u64),
            None => self
                .base_ns
                .saturating_sub((self.base - t).as_nanos() as u64),
        }
    }

    /// Appends one event as one JSON line, with one `write` call.
    fn write(&self, event: &Event) {
        let mut line = match serde_json::to_vec(event) {
            Ok(line) => line,
            Err(e) => {
                tracing::warn!(error = %e, "cannot encode an event");
                return;
            }
        };
        line.push(b'\n');
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = f.write_all(&line) {
            tracing::warn!(error = %e, "cannot write the event log");
        }
    }

    /// The process started as `instance`.
    pub(crate) fn started(&self, instance: &str) {
        self.write(&Event::Start {
            instance: instance.to_string(),
            pid: std::process::id(),
            t: monotonic_ns(),
        });
    }

    /// A lease event of the coordinator (began, renewed or ended a term).
    pub(crate) fn lease(&self, e: &LeaseEvent) {
        let event = match e {
            LeaseEvent::Began {
                instance,
                role,
                token,
                at,
                until,
            } => Event::Began {
                instance: instance.to_string(),
                role: role.to_string(),
                token: *token,
                t: self.ns(*at),
                until: self.ns(*until),
            },
            LeaseEvent::Renewed {
                instance,
                role,
                token,
                until,
            } => Event::Renewed {
                instance: instance.to_string(),
                role: role.to_string(),
                token: *token,
                until: self.ns(*until),
            },
            LeaseEvent::Ended {
                instance,
                role,
                token,
                at,
            } => Event::Ended {
                instance: instance.to_string(),
                role: role.to_string(),
                token: *token,
                t: self.ns(*at),
            },
        };
        self.write(&event);
    }

    /// A request admitted for local execution under `token`, judged held at `at`.
    pub(crate) fn admitted(&self, instance: &str, role: &str, token: u64, at: Instant) {
        self.write(&Event::Admit {
            instance: instance.to_string(),
            role: role.to_string(),
            token,
            t: self.ns(at),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::Event;

    /// The line format is what `docs/reliability.md` shows and what logs
    /// written by earlier versions contain: `ev` first, then the fields in
    /// this order.
    #[test]
    fn lines_keep_their_format_and_read_back() {
        let s = |v: &str| v.to_string();
        let cases = [
            (
                Event::Start {
                    instance: s("gw-1"),
                    pid: 42,
                    t: 1,
                },
                r#"{"ev":"start","instance":"gw-1","pid":42,"t":1}"#,
            ),
            (
                Event::Began {
                    instance: s("gw-1"),
                    role: s("m"),
                    token: 7,
                    t: 2,
                    until: 3,
                },
                r#"{"ev":"began","instance":"gw-1","role":"m","token":7,"t":2,"until":3}"#,
            ),
            (
                Event::Renewed {
                    instance: s("gw-1"),
                    role: s("m"),
                    token: 7,
                    until: 4,
                },
                r#"{"ev":"renewed","instance":"gw-1","role":"m","token":7,"until":4}"#,
            ),
            (
                Event::Ended {
                    instance: s("gw-1"),
                    role: s("m"),
                    token: 7,
                    t: 5,
                },
                r#"{"ev":"ended","instance":"gw-1","role":"m","token":7,"t":5}"#,
            ),
            (
                Event::Admit {
                    instance: s("gw-1"),
                    role: s("m"),
                    token: 7,
                    t: 6,
                },
                r#"{"ev":"admit","instance":"gw-1","role":"m","token":7,"t":6}"#,
            ),
        ];
        for (event, line) in cases {
            assert_eq!(serde_json::to_string(&event).unwrap(), line);
            assert_eq!(serde_json::from_str::<Event>(line).unwrap(), event);
        }
    }
}
