//! The immutable holder snapshot the coordinator publishes after every tick.
//! Readers load it lock-free; "held here" is judged at read time against a
//! local monotonic deadline, so a stalled heartbeat loop fails closed.

use std::sync::Arc;
use std::time::Instant;

/// What this process knows of one role.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RoleState {
    /// The role.
    pub name: Arc<str>,
    /// Holder id as the store last reported it (may be this instance).
    pub holder: Option<Arc<str>>,
    /// The holder's advertise address, as the store reported it.
    pub holder_address: Option<Arc<str>>,
    /// Token of the current (or last) term.
    pub token: u64,
    /// Local estimate of when the holder's term ends in the store.
    pub holder_valid_until: Option<Instant>,
    /// Set while this instance holds the role: `t_sent + duration - margin`.
    pub held_until: Option<Instant>,
    /// The preferred holder (balanced partitions): the live candidate the
    /// role should end up with.
    pub preferred: Option<Arc<str>>,
    /// This instance is handing the role over: it admits no new local work.
    pub handing_over: bool,
}

impl RoleState {
    /// True while this instance holds the role, judged now.
    pub fn held_now(&self, now: Instant) -> bool {
        self.held_until.is_some_and(|d| now < d)
    }

    /// The holder's address if the holder is another instance whose term has not
    /// expired by local estimate.
    pub fn live_holder(&self, now: Instant) -> Option<(&Arc<str>, &Arc<str>)> {
        match (&self.holder, &self.holder_address, self.holder_valid_until) {
            (Some(h), Some(a), Some(until)) if now < until => Some((h, a)),
            _ => None,
        }
    }
}

/// Where a partition stands against the definition the store records.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DefinitionState {
    /// Not read from the store yet: its roles are not claimed.
    Unread,
    /// The store records this instance's definition, changed recently: no
    /// instance serves the partition until `until` (local clock), when every
    /// term of the previous definition has ended.
    Settling {
        /// The recorded epoch.
        epoch: u64,
        /// When the settle window ends, by the last read.
        until: Instant,
    },
    /// The store records this instance's definition: served.
    Serving {
        /// The recorded epoch.
        epoch: u64,
    },
    /// The store records another definition: this instance neither holds
    /// nor serves the partition (503 `partition-mismatch`).
    Mismatch {
        /// The recorded epoch.
        epoch: u64,
        /// The recorded definition.
        recorded: Arc<str>,
    },
}

/// One partition's definition here, and how it stands in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionDefinition {
    /// The partition.
    pub name: Arc<str>,
    /// The definition this instance is configured with.
    pub configured: Arc<str>,
    /// How it compares with the store's record.
    pub state: DefinitionState,
}

/// All roles, in registration order; published as one `Arc`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HolderSnapshot {
    /// Every role, in registration order.
    pub roles: Vec<RoleState>,
    /// The live members as their presence records say (only kept when a
    /// partition is balanced).
    pub members: Vec<crate::store::Member>,
    /// When this snapshot was published.
    pub published_at: Instant,
    /// False until the store answered once and this snapshot came from it.
    pub loaded: bool,
    /// True when the last store round trip succeeded.
    pub store_ok: bool,
    /// When the last store round trip that succeeded was sent.
    pub last_ok_sent: Option<Instant>,
    /// Whether this instance currently contends for roles.
    pub candidate: bool,
    /// Set once draining began: no new local work is admitted.
    pub draining: bool,
    /// Every partition's definition and how it stands in the store.
    pub definitions: Vec<PartitionDefinition>,
}
