//! The gateway's event log (`rolegate run --events FILE`) as the tests read
//! it: JSON lines, one event each, times in nanoseconds on `CLOCK_MONOTONIC`
//! (one clock for every process on the machine, so the logs of several
//! gateways and the tests' own records compare exactly).

use serde::{Deserialize, Serialize};

/// Nanoseconds on `CLOCK_MONOTONIC` now: the clock of the event log.
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// One line of the event log. The variant is the `ev` key (`start`, `began`,
/// `renewed`, `ended`, `admit`); the fields follow it in declaration order.
/// Times (`t`, `until`) are nanoseconds on `CLOCK_MONOTONIC`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "lowercase")]
pub enum Event {
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
