//! Partition hashing (docs/partitions.md): `xxh64(seed 0, bytes) mod count`, where
//! `bytes` is the key, or `scope ++ 0x00 ++ key` for a scoped route.
//! Stable across versions and languages; see `docs/partitions.md`.

use std::sync::Arc;

use xxhash_rust::xxh64::xxh64;

/// The bytes hashed for a key, with an optional scope.
pub(crate) fn scoped_key_bytes(scope: Option<&str>, key: &str) -> Vec<u8> {
    match scope {
        None => key.as_bytes().to_vec(),
        Some(scope) => {
            let mut bytes = Vec::with_capacity(scope.len() + 1 + key.len());
            bytes.extend_from_slice(scope.as_bytes());
            bytes.push(0);
            bytes.extend_from_slice(key.as_bytes());
            bytes
        }
    }
}

/// Which partition a key belongs to.
pub fn partition_index(scope: Option<&str>, key: &str, count: u32) -> u32 {
    let hash = match scope {
        None => xxh64(key.as_bytes(), 0),
        Some(_) => xxh64(&scoped_key_bytes(scope, key), 0),
    };
    (hash % u64::from(count.max(1))) as u32
}

/// The version of the key hash above, recorded in partition definitions: a
/// different hash would be a different meaning of every key.
pub const HASH_VERSION: &str = "xxh64-v1";

/// A partition's definition as the store records it and instances compare
/// it: `count=16 hash=xxh64-v1 scopes=[null,"Order"]`. `scopes` are the
/// scopes its routes hash with (`None`: unscoped), sorted, each once.
pub(crate) fn definition_text(count: u32, scopes: &[Option<String>]) -> String {
    let mut scopes: Vec<&Option<String>> = scopes.iter().collect();
    scopes.sort();
    scopes.dedup();
    let scopes = serde_json::to_string(&scopes).unwrap_or_default();
    format!("count={count} hash={HASH_VERSION} scopes={scopes}")
}

/// Why a partition could not be redefined.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedefineError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// Another change of the same partition was recorded at the same time.
    #[error("partition `{0}` was changed by someone else meanwhile; read it again and retry")]
    Conflict(String),
}

/// Records a new definition of partition `name` (`count` roles, keys
/// hashed with `scopes`; `None` is unscoped) in the store (an explicit
/// migration, `rolegate partitions resize`): the epoch goes up by one, and
/// no instance serves the partition for `settle`, which must be at least
/// the longest lease duration of its roles anywhere in the fleet, so every
/// term begun under the previous definition has ended first. Every
/// coordinator sees the change at its next tick (the store's notification
/// wakes it at once) and ends its terms of the partition; those configured
/// with the new definition serve it once it settles, the others answer 503
/// `partition-mismatch` until they are deployed with it.
///
/// Returns the record in force and whether it changed (an identical
/// definition changes nothing).
pub async fn redefine_partition(
    store: &dyn crate::store::LeaseStore,
    name: &str,
    count: u32,
    scopes: &[Option<String>],
    settle: std::time::Duration,
) -> Result<(crate::store::PartitionRecord, bool), RedefineError> {
    let definition = &*definition_text(count, scopes);
    let current = store.partitions().await?;
    let current = current.into_iter().find(|r| r.name == name);
    if let Some(record) = current.as_ref().filter(|r| r.definition == definition) {
        return Ok((record.clone(), false));
    }
    let epoch = current.map_or(0, |r| r.epoch);
    match store
        .redefine_partition(name, epoch, definition, settle)
        .await?
    {
        Some(record) => Ok((record, true)),
        None => Err(RedefineError::Conflict(name.to_string())),
    }
}

/// Where a key lives right now, read from the local snapshot without I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionResolution {
    /// The partition role the key maps to.
    pub role: Arc<str>,
    /// Its index within the partition.
    pub index: u32,
    /// True when this instance holds the role at the moment of the call.
    pub held: bool,
    /// The fencing token of the term, when held here.
    pub token: Option<u64>,
    /// The holder's advertise address, when known and unexpired.
    pub holder_address: Option<Arc<str>>,
    /// When `held` was judged (monotonic clock).
    pub checked_at: std::time::Instant,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Golden vectors: (scope, key, count, partition). Pinned in tests and docs.
    const GOLDEN: &[(Option<&str>, &str, u32, u32)] = &[
        (None, "device-42", 16, 1),
        (None, "", 16, 9),
        (None, "a", 64, 27),
        (None, "user:1001", 64, 2),
        (Some("Order"), "7", 64, 12),
        (Some("Order"), "8d1f", 64, 59),
        (Some("Invoice"), "7", 64, 5),
        (None, "日本", 1024, 939),
    ];

    /// Golden vectors; the same table is in docs/partitions.md.
    #[test]
    fn golden_vectors() {
        // Reference values of xxh64 with seed 0.
        assert_eq!(xxh64(b"", 0), 0xef46db3751d8e999);
        assert_eq!(xxh64(b"a", 0), 0xd24ec4f1a98c6e5b);
        assert_eq!(xxh64(b"device-42", 0), 0xfa14548796d419f1);
        assert_eq!(xxh64(b"Order\x007", 0), 0xe31ae94b5567c10c);
        assert_eq!(
            xxh64(b"device-42", 0) % 16,
            u64::from(partition_index(None, "device-42", 16))
        );
        for (scope, key, count, expected) in GOLDEN {
            assert_eq!(
                partition_index(*scope, key, *count),
                *expected,
                "scope {scope:?} key {key:?} count {count}"
            );
        }
    }

    #[test]
    fn a_definition_names_count_hash_and_sorted_scopes_once() {
        let scopes = [Some("Order".to_string()), None, Some("Order".to_string())];
        assert_eq!(
            definition_text(16, &scopes),
            r#"count=16 hash=xxh64-v1 scopes=[null,"Order"]"#
        );
        assert_eq!(definition_text(4, &[]), "count=4 hash=xxh64-v1 scopes=[]");
    }

    #[test]
    fn scope_separates_keys() {
        assert_eq!(scoped_key_bytes(Some("Order"), "7"), b"Order\x007".to_vec());
        assert_eq!(scoped_key_bytes(None, "7"), b"7".to_vec());
    }

    #[test]
    fn names() {
        assert_eq!(
            crate::role::partition_role_name("devices", 3),
            "devices:partition-3"
        );
    }
}
