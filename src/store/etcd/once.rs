//! One-shot claims: each granted term gets an etcd lease of its own, with the
//! claim's TTL and never kept alive, so it ends at its TTL even while the
//! instance's heartbeat keeps the instance lease alive. Any role key counts
//! as a live term (keys go with their lease), the caller's own included.

use std::time::{Duration, Instant};

use futures_util::future::join_all;

use super::EtcdStore;
use crate::store::{Claim, Grant, InstanceInfo, StoreError};

/// The etcd lease of a one-shot term, until the term has surely ended.
pub(super) struct OneShotTerm {
    lease: i64,
    ends: Instant,
}

impl EtcdStore {
    /// Grants each role that has no key, as a term on a lease of its own.
    pub(super) async fn claim_once(
        &self,
        instance: &InstanceInfo,
        claims: &[&Claim],
    ) -> Result<Vec<Grant>, StoreError> {
        let (current, _) = self.read_roles().await?;
        let attempts = claims
            .iter()
            .filter(|c| !current.contains_key(c.role.as_str()))
            .map(|c| self.begin_once(instance, c));
        let mut grants = Vec::new();
        for result in join_all(attempts).await {
            grants.extend(result?);
        }
        Ok(grants)
    }

    async fn begin_once(
        &self,
        instance: &InstanceInfo,
        claim: &Claim,
    ) -> Result<Option<Grant>, StoreError> {
        // Whole seconds, rounded up: the store term is never shorter than asked.
        let secs = claim.duration.as_millis().div_ceil(1000).max(1) as i64;
        let t_sent = Instant::now();
        let granted = self
            .members
            .write(|mut c| async move { c.lease_grant(secs, None).await })
            .await
            .map_err(self.error("one-shot lease grant"))?;
        let ttl = Duration::from_secs(granted.ttl().max(1) as u64);
        let value = self.holder_value(instance, ttl)?;
        let role = claim.role.to_string();
        match self.begin_term(role, None, &value, granted.id()).await? {
            Some((role, token)) => {
                let term = OneShotTerm {
                    lease: granted.id(),
                    ends: t_sent + ttl,
                };
                let mut terms = self.one_shot_terms();
                // Forget terms that have ended: their keys are gone with their lease.
                let now = Instant::now();
                terms.retain(|_, t| t.ends > now);
                terms.insert((instance.id.clone(), token), term);
                Ok(Some(Grant { role, token }))
            }
            None => {
                // Lost the race: the lease holds nothing; let it go now
                // rather than at its TTL (a failure here costs nothing).
                let id = granted.id();
                let _ = self
                    .members
                    .write(|mut c| async move { c.lease_revoke(id).await })
                    .await;
                Ok(None)
            }
        }
    }

    /// The etcd lease of the one-shot term `token` of `instance`, if it is one.
    pub(super) fn one_shot_lease(&self, instance: &str, token: u64) -> Option<i64> {
        self.one_shot_terms()
            .get(&(instance.to_string(), token))
            .map(|t| t.lease)
    }

    /// Forgets a released one-shot term.
    pub(super) fn forget_one_shot(&self, instance: &str, token: u64) {
        self.one_shot_terms().remove(&(instance.to_string(), token));
    }

    fn one_shot_terms(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<(String, u64), OneShotTerm>> {
        // Plain data: a panic elsewhere leaves every entry whole.
        self.one_shot.lock().unwrap_or_else(|p| p.into_inner())
    }
}
