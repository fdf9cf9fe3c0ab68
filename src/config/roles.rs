//! The `roles` and `partitions` sections: names checked once (as
//! [`RoleName`]s), declared once, generated partition roles included.

use std::collections::HashSet;

use super::file::{self, Text};
use super::resolve::{line_of, Resolver, RoleNames};
use super::{ConfigError, LeaseTimings, PartitionConfig, RoleConfig};
use crate::role::{partition_role_name, RoleName, MAX_PARTITION_COUNT};

/// The most roles one file declares, partition roles included: every one is
/// a lease record, a name in memory and a row in every snapshot.
pub(super) const MAX_ROLES: usize = 262_144;

impl Resolver<'_> {
    fn role_name(&self, t: &Text, key: &str) -> Result<RoleName, ConfigError> {
        let name = self.text(t, key)?;
        RoleName::new(&name).map_err(|e| self.err(Some(&t.referenced), key, e.to_string()))
    }

    pub(super) fn roles(
        &self,
        raw: &[file::Role],
        lease: LeaseTimings,
        names: &mut RoleNames,
    ) -> Result<Vec<RoleConfig>, ConfigError> {
        let mut roles = Vec::new();
        for (i, r) in raw.iter().enumerate() {
            let key = format!("roles[{i}].name");
            let name = self.role_name(&r.name, &key)?;
            if names
                .0
                .insert(name.to_string(), Some(r.name.referenced))
                .is_some()
            {
                return Err(self.err(
                    Some(&r.name.referenced),
                    &key,
                    format!("role `{name}` is declared twice"),
                ));
            }
            let timings = self.timings(
                lease,
                &r.duration,
                &r.renew_interval,
                &r.safety_margin,
                &format!("roles[{i}]"),
                Some(&r.name.referenced),
            )?;
            roles.push(RoleConfig {
                name,
                lease: timings,
            });
        }
        Ok(roles)
    }

    pub(super) fn partitions(
        &self,
        raw: &[file::Partition],
        lease: LeaseTimings,
        names: &mut RoleNames,
    ) -> Result<Vec<PartitionConfig>, ConfigError> {
        let mut partitions = Vec::new();
        let mut partition_names = HashSet::new();
        for (i, p) in raw.iter().enumerate() {
            let key = format!("partitions[{i}].name");
            let name = self.role_name(&p.name, &key)?;
            if !partition_names.insert(name.clone()) {
                return Err(self.err(
                    Some(&p.name.referenced),
                    &key,
                    format!("partition `{name}` is declared twice"),
                ));
            }
            let count = self.partition_count(p, i)?;
            if names.0.len() + count as usize > MAX_ROLES {
                return Err(self.err(
                    Some(&p.count.referenced),
                    &format!("partitions[{i}].count"),
                    format!("brings the roles of this file past {MAX_ROLES} (roles and partition roles together)"),
                ));
            }
            self.generated_roles(p, &name, count, &key, names)?;
            let timings = self.timings(
                lease,
                &p.duration,
                &p.renew_interval,
                &p.safety_margin,
                &format!("partitions[{i}]"),
                Some(&p.name.referenced),
            )?;
            let rebalance_delay = self.duration(
                &p.rebalance_delay,
                &format!("partitions[{i}].rebalance_delay"),
                timings.renew_interval * 2,
            )?;
            let handover_drain = self.duration(
                &p.handover_drain,
                &format!("partitions[{i}].handover_drain"),
                timings.renew_interval,
            )?;
            if handover_drain > std::time::Duration::from_secs(3600) {
                return Err(self.err(
                    p.handover_drain.as_ref().map(|t| &t.referenced),
                    &format!("partitions[{i}].handover_drain"),
                    "must be at most 1h (the moving role has no admitting holder meanwhile)",
                ));
            }
            partitions.push(PartitionConfig {
                name,
                count,
                lease: timings,
                balance: p.balance.unwrap_or(true),
                rebalance_delay,
                handover_drain,
            });
        }
        Ok(partitions)
    }

    fn partition_count(&self, p: &file::Partition, i: usize) -> Result<u32, ConfigError> {
        let count = p.count.value;
        if count == 0 || count > u64::from(MAX_PARTITION_COUNT) {
            return Err(self.err(
                Some(&p.count.referenced),
                &format!("partitions[{i}].count"),
                format!("must be between 1 and {MAX_PARTITION_COUNT}, got {count}"),
            ));
        }
        Ok(count as u32)
    }

    /// Generated names are checked (length, collisions) before anything starts.
    fn generated_roles(
        &self,
        p: &file::Partition,
        name: &RoleName,
        count: u32,
        key: &str,
        names: &mut RoleNames,
    ) -> Result<(), ConfigError> {
        let longest = partition_role_name(name, count - 1);
        RoleName::new(&longest).map_err(|e| {
            self.err(
                Some(&p.name.referenced),
                key,
                format!("generated role `{longest}`: {e}"),
            )
        })?;
        for idx in 0..count {
            let generated = partition_role_name(name, idx);
            if let Some(prev) = names.0.insert(generated.clone(), Some(p.name.referenced)) {
                let at = prev
                    .and_then(|l| line_of(&l))
                    .map(|l| format!(" (line {l})"))
                    .unwrap_or_default();
                return Err(self.err(
                    Some(&p.name.referenced),
                    key,
                    format!("generated role `{generated}` is already declared{at}"),
                ));
            }
        }
        Ok(())
    }
}
