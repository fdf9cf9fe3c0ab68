//! Leases: role names, the coordinator that holds and renews them, the
//! published holder snapshot, and partition hashing.
//!
//! The one promise: for a role, the intervals in which instances believe they
//! hold it never overlap, and each term's fencing token is larger than the last.

mod coordinator;
mod heartbeat;
mod partition;
mod snapshot;

pub use coordinator::{
    Coordinator, CoordinatorBuilder, CoordinatorError, CoordinatorStats, HolderInfo, LeaseEvent,
    NotReady, OneShotLease, RoleLease, RolePartition, MAX_DURATION,
};
pub use partition::{partition_index, partition_role_name, scoped_key_bytes, PartitionResolution};
pub use snapshot::{HolderSnapshot, RoleState};

use crate::config::LeaseTimings;

/// Longest role name, in bytes, including generated partition role names.
pub const MAX_ROLE_NAME_LEN: usize = 128;

/// A role this process contends for, with its lease timings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleSpec {
    pub name: String,
    pub timings: LeaseTimings,
}

/// A role partition: `count` roles named `{name}:partition-{i}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionSpec {
    pub name: String,
    pub count: u32,
    pub timings: LeaseTimings,
}

/// Proof, at the moment it was taken, that this instance held `role` in the
/// term numbered `token`. Pass the token to resources that can fence on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLease {
    pub role: std::sync::Arc<str>,
    pub token: u64,
    /// When the lease was verified held (monotonic clock).
    pub checked_at: std::time::Instant,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoleNameError {
    #[error("role name is empty")]
    Empty,
    #[error("role name is {0} bytes; the limit is 128")]
    TooLong(usize),
    #[error("role name `{0}` has characters outside [A-Za-z0-9._:-]")]
    BadCharacter(String),
}

/// Checks the SPEC 1 rule: 1-128 bytes of `[A-Za-z0-9._:-]`.
pub fn validate_role_name(name: &str) -> Result<(), RoleNameError> {
    if name.is_empty() {
        return Err(RoleNameError::Empty);
    }
    if name.len() > MAX_ROLE_NAME_LEN {
        return Err(RoleNameError::TooLong(name.len()));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
    {
        return Err(RoleNameError::BadCharacter(name.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_follow_the_rule() {
        assert!(validate_role_name("maintenance").is_ok());
        assert!(validate_role_name("devices:partition-15").is_ok());
        assert!(validate_role_name(&"a".repeat(128)).is_ok());
        assert_eq!(
            validate_role_name(&"a".repeat(129)),
            Err(RoleNameError::TooLong(129))
        );
        assert_eq!(validate_role_name(""), Err(RoleNameError::Empty));
        assert!(validate_role_name("a b").is_err());
        assert!(validate_role_name("a/b").is_err());
    }
}
