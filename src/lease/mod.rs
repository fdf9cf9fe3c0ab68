//! Leases: the coordinator that holds and renews roles, the published holder
//! snapshot, lease timings, and partition hashing.
//!
//! The one promise: for a role, the intervals in which instances believe they
//! hold it never overlap, and each term's fencing token is larger than the last.
//!
//! Files: `coordinator.rs` (builder and reader handles) and `heartbeat.rs`
//! (the loop) share `state.rs`; neither imports the other's internals.

mod balance;
mod coordinator;
mod fingerprint;
mod handles;
mod heartbeat;
mod partition;
mod snapshot;
mod state;
mod term;
mod timings;

pub use coordinator::{
    Coordinator, CoordinatorBuilder, CoordinatorError, CoordinatorStats, NotReady, OneShotLease,
    DEFAULT_DRAIN_TIMEOUT,
};
pub use fingerprint::route_differences;
pub use handles::TermWatch;
pub use handles::{HolderInfo, LocalWork, RoleLease, RolePartition};
pub(crate) use partition::definition_text;
pub use partition::{
    partition_index, redefine_partition, PartitionResolution, RedefineError, HASH_VERSION,
};
pub use snapshot::{DefinitionState, HolderSnapshot, PartitionDefinition, RoleState};
pub(crate) use state::deadline_after;
pub use state::LeaseEvent;
pub use term::TermEndReason;
pub use timings::{LeaseTimings, TimingsError, MAX_DURATION};

use crate::role::RoleName;

/// A role this process contends for, with its lease timings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleSpec {
    /// The role.
    pub name: RoleName,
    /// Its timings.
    pub timings: LeaseTimings,
}

/// A role partition: `count` roles named `{name}:partition-{i}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionSpec {
    /// The partition's name.
    pub name: RoleName,
    /// How many roles it has.
    pub count: u32,
    /// Timings of each of its roles.
    pub timings: LeaseTimings,
    /// Spread its roles over the live candidates: `Some(rebalance_delay)`,
    /// the time membership must be stable before surplus is handed over;
    /// `None` leaves the roles where they fall (first come, first held).
    pub balance: Option<std::time::Duration>,
    /// How long a balance move waits for local work under the role before
    /// ending it and releasing; `None`: the renew interval.
    pub handover_drain: Option<std::time::Duration>,
    /// The scopes its routes hash keys with (`None`: unscoped); part of the
    /// definition the store records.
    pub scopes: Vec<Option<String>>,
}

/// Proof, at the moment it was taken, that this instance held `role` in the
/// term numbered `token`. Pass the token to resources that can fence on it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldLease {
    /// The role.
    pub role: std::sync::Arc<str>,
    /// The term's fencing token.
    pub token: u64,
    /// When the lease was verified held (monotonic clock).
    pub checked_at: std::time::Instant,
}
