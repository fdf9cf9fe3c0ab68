//! Role names: the one type every layer uses for "which role", validated
//! once when it is made, plus partition naming and the limits on both.
//!
//! This module is a leaf: it depends on nothing else in the crate, so the
//! store, the coordinator, the proxy and the config can all share it.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// Longest role name, in bytes, including generated partition role names.
pub const MAX_ROLE_NAME_LEN: usize = 128;

/// Largest number of roles one partition may declare.
pub const MAX_PARTITION_COUNT: u32 = 65_536;

/// Why a string is not a role name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RoleNameError {
    /// The name is the empty string.
    #[error("role name is empty")]
    Empty,
    /// The name is longer than [`MAX_ROLE_NAME_LEN`] bytes.
    #[error("role name is {0} bytes; the limit is 128")]
    TooLong(usize),
    /// The name holds a byte outside `[A-Za-z0-9._:-]`.
    #[error("role name `{0}` has characters outside [A-Za-z0-9._:-]")]
    BadCharacter(String),
}

/// A valid role name: 1 to 128 bytes of `[A-Za-z0-9._:-]`.
///
/// Cheap to clone (a shared string). Holding one proves the rule was
/// checked, so stores can paste it into keys and queries without checking
/// again.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RoleName(Arc<str>);

impl RoleName {
    /// Checks the rule and wraps the name.
    pub fn new(name: &str) -> Result<RoleName, RoleNameError> {
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
        Ok(RoleName(name.into()))
    }

    /// The generated role of partition `index`: `{partition}:partition-{index}`.
    pub fn partition(partition: &str, index: u32) -> Result<RoleName, RoleNameError> {
        RoleName::new(&partition_role_name(partition, index))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as a shared string.
    pub fn as_arc(&self) -> &Arc<str> {
        &self.0
    }
}

/// The generated role name of partition `index`, unchecked (for messages and
/// lookups; [`RoleName::partition`] checks it).
pub(crate) fn partition_role_name(partition: &str, index: u32) -> String {
    format!("{partition}:partition-{index}")
}

impl Deref for RoleName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for RoleName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for RoleName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RoleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RoleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl TryFrom<&str> for RoleName {
    type Error = RoleNameError;
    fn try_from(name: &str) -> Result<Self, Self::Error> {
        RoleName::new(name)
    }
}

impl TryFrom<String> for RoleName {
    type Error = RoleNameError;
    fn try_from(name: String) -> Result<Self, Self::Error> {
        RoleName::new(&name)
    }
}

impl From<RoleName> for Arc<str> {
    fn from(name: RoleName) -> Arc<str> {
        name.0
    }
}

impl PartialEq<str> for RoleName {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for RoleName {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

/// Serializes as the plain name (e.g. a JSON string).
impl serde::Serialize for RoleName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_follow_the_rule() {
        assert!(RoleName::new("maintenance").is_ok());
        assert!(RoleName::new("devices:partition-15").is_ok());
        assert!(RoleName::new(&"a".repeat(128)).is_ok());
        assert_eq!(
            RoleName::new(&"a".repeat(129)),
            Err(RoleNameError::TooLong(129))
        );
        assert_eq!(RoleName::new(""), Err(RoleNameError::Empty));
        assert!(RoleName::new("a b").is_err());
        assert!(RoleName::new("a/b").is_err());
    }

    #[test]
    fn partition_roles_are_named_and_checked() {
        assert_eq!(
            RoleName::partition("devices", 3).unwrap().as_str(),
            "devices:partition-3"
        );
        assert!(RoleName::partition(&"a".repeat(120), 65_535).is_err());
    }
}
