//! The `roles` and `partitions` sections: names checked once (as
//! [`RoleName`]s), declared once, generated partition roles included, and
//! the timings each takes from the `lease` section.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::de::Error as _;
use serde::Deserializer;

use super::resolve::Checker;
use super::value;
use super::{ConfigError, LeaseTimings, PartitionConfig, RoleConfig};
use crate::role::{partition_role_name, RoleName, MAX_PARTITION_COUNT};

/// The most roles one file declares, partition roles included: every one is
/// a lease record, a name in memory and a row in every snapshot.
pub(super) const MAX_ROLES: usize = 262_144;

/// The longest `partitions[].handover_drain`.
const MAX_HANDOVER_DRAIN: Duration = Duration::from_secs(3600);

const DRAIN_TOO_LONG: &str =
    "must be at most 1h (the moving role has no admitting holder meanwhile)";

/// `partitions[].count`: 1 to 65536.
pub(super) fn count<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    value::count::<D, u32, 1, { MAX_PARTITION_COUNT as u64 }>(d)
}

/// `partitions[].balance` when unset.
pub(super) fn yes() -> bool {
    true
}

/// `partitions[].handover_drain`: at most an hour.
pub(super) mod handover_drain {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = value::inherited_duration::deserialize(d)?;
        if v > MAX_HANDOVER_DRAIN {
            return Err(D::Error::custom(DRAIN_TOO_LONG));
        }
        Ok(v)
    }
    pub(crate) use value::inherited_duration::serialize;
}

impl Checker {
    /// The timings of `at` (`roles[3]`): each one the file leaves out is
    /// the `lease` section's.
    fn timings(
        &self,
        at: &str,
        lease: LeaseTimings,
        mut own: LeaseTimings,
    ) -> Result<LeaseTimings, ConfigError> {
        let set = |key: &str| self.keys.has(&format!("{at}.{key}"));
        if !set("duration") {
            own.duration = lease.duration;
        }
        if !set("renew_interval") {
            own.renew_interval = lease.renew_interval;
        }
        if !set("safety_margin") {
            own.safety_margin = lease.safety_margin;
        }
        let line_at = ["duration", "renew_interval", "safety_margin"]
            .into_iter()
            .map(|k| format!("{at}.{k}"))
            .find(|k| self.keys.has(k))
            .unwrap_or_else(|| format!("{at}.name"));
        own.check()
            .map_err(|e| self.err_at(&line_at, at, e.to_string()))?;
        Ok(own)
    }

    pub(super) fn roles(
        &self,
        roles: &mut [RoleConfig],
        partitions: &mut [PartitionConfig],
        lease: LeaseTimings,
    ) -> Result<(), ConfigError> {
        // Every role name so far, declared or generated, with the key that
        // brought it.
        let mut names: HashMap<String, String> = HashMap::new();
        for (i, r) in roles.iter_mut().enumerate() {
            let key = format!("roles[{i}].name");
            if names.insert(r.name.to_string(), key.clone()).is_some() {
                return Err(self.err(&key, format!("role `{}` is declared twice", r.name)));
            }
            let t = self.timings(&format!("roles[{i}]"), lease, r.lease())?;
            (r.duration, r.renew_interval, r.safety_margin) =
                (t.duration, t.renew_interval, t.safety_margin);
        }
        let mut partition_names = HashSet::new();
        for (i, p) in partitions.iter_mut().enumerate() {
            let key = format!("partitions[{i}].name");
            if !partition_names.insert(p.name.clone()) {
                return Err(self.err(&key, format!("partition `{}` is declared twice", p.name)));
            }
            if names.len() + p.count as usize > MAX_ROLES {
                return Err(self.err(
                    &format!("partitions[{i}].count"),
                    format!("brings the roles of this file past {MAX_ROLES} (roles and partition roles together)"),
                ));
            }
            self.generated_roles(&p.name, p.count, &key, &mut names)?;
            let t = self.timings(&format!("partitions[{i}]"), lease, p.lease())?;
            (p.duration, p.renew_interval, p.safety_margin) =
                (t.duration, t.renew_interval, t.safety_margin);
            if !self.keys.has(&format!("partitions[{i}].rebalance_delay")) {
                p.rebalance_delay = t.renew_interval * 2;
            }
            let drain = format!("partitions[{i}].handover_drain");
            if !self.keys.has(&drain) {
                p.handover_drain = t.renew_interval;
                // The default too: `--print` writes it, and must read back.
                if p.handover_drain > MAX_HANDOVER_DRAIN {
                    let at = match self.keys.has(&format!("partitions[{i}].renew_interval")) {
                        true => format!("partitions[{i}].renew_interval"),
                        false => format!("partitions[{i}].name"),
                    };
                    return Err(self.err_at(&at, &drain, DRAIN_TOO_LONG));
                }
            }
        }
        Ok(())
    }

    /// Generated names are checked (length, collisions) before anything starts.
    fn generated_roles(
        &self,
        name: &RoleName,
        count: u32,
        key: &str,
        names: &mut HashMap<String, String>,
    ) -> Result<(), ConfigError> {
        let longest = partition_role_name(name, count - 1);
        RoleName::new(&longest)
            .map_err(|e| self.err(key, format!("generated role `{longest}`: {e}")))?;
        for idx in 0..count {
            let generated = partition_role_name(name, idx);
            if let Some(prev) = names.insert(generated.clone(), key.to_string()) {
                let at = self
                    .keys
                    .line(&prev)
                    .map(|l| format!(" (line {l})"))
                    .unwrap_or_default();
                return Err(self.err(
                    key,
                    format!("generated role `{generated}` is already declared{at}"),
                ));
            }
        }
        Ok(())
    }
}
