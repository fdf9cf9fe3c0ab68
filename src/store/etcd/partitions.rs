//! Partition definitions: a key `{ns}/lease/~partition/{name}` per partition
//! (under the watched lease prefix, so a change wakes every coordinator; `~`
//! is never in a role name, and the lease readers skip values that are not
//! holders). While a change settles, a key `{ns}/settling/{name}` lives on
//! an etcd lease of the settle time (refreshed once after the write, so
//! the window counts from it), and the cluster's own TTL ends it. A leader
//! election restores lease TTLs in full: the window then lasts longer,
//! never shorter.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use futures_util::future::join_all;

use super::members::{self, CallError};
use super::EtcdStore;
use crate::store::{PartitionRecord, StoreError};

/// A definition key's value.
#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    definition: String,
    epoch: u64,
}

impl EtcdStore {
    fn partition_prefix(&self) -> String {
        format!("{}/lease/~partition/", self.ns)
    }

    fn settling_prefix(&self) -> String {
        format!("{}/settling/", self.ns)
    }

    fn encode(&self, stored: &Stored) -> Result<Vec<u8>, StoreError> {
        serde_json::to_vec(stored).map_err(|e| {
            StoreError::unavailable(format!("etcd at {}: encoding a partition", self.at), e)
        })
    }

    /// Every definition, and how long each still settles.
    pub(super) async fn read_partitions(&self) -> Result<Vec<PartitionRecord>, StoreError> {
        let (defs, settling) = (self.partition_prefix(), self.settling_prefix());
        let txn = Txn::new().and_then([
            TxnOp::get(defs.clone(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(settling.clone(), Some(GetOptions::new().with_prefix())),
        ]);
        let resp = self
            .members
            .call(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
            .map_err(self.error("partitions"))?;
        let mut records = Vec::new();
        let mut leases = Vec::new();
        for op in resp.op_responses() {
            let TxnOpResponse::Get(get) = op else {
                continue;
            };
            for kv in get.kvs() {
                let Ok(key) = kv.key_str() else { continue };
                if let Some(name) = key.strip_prefix(&defs) {
                    let Ok(s) = serde_json::from_slice::<Stored>(kv.value()) else {
                        continue;
                    };
                    records.push(PartitionRecord {
                        name: name.to_string(),
                        definition: s.definition,
                        epoch: s.epoch,
                        settling: Duration::ZERO,
                    });
                } else if let Some(name) = key.strip_prefix(&settling) {
                    leases.push((name.to_string(), kv.lease()));
                }
            }
        }
        // Only while a change settles: the time left on its lease. etcd
        // answers in whole seconds, rounded down, so one second is added:
        // while the key exists the change has not settled.
        let lookups = leases.into_iter().map(|(name, id)| async move {
            let found = self
                .members
                .call(|mut c| async move { c.lease_time_to_live(id, None).await })
                .await;
            let left = |secs: i64| Duration::from_secs(secs.max(0) as u64 + 1);
            match found {
                Ok(r) => Ok((name, left(r.ttl()))),
                Err(CallError::Etcd(e)) if members::is_answer(&e) => Ok((name, left(0))),
                Err(e) => Err(self.error("partition settle lookup")(e)),
            }
        });
        for found in join_all(lookups).await {
            let (name, left) = found?;
            if let Some(r) = records.iter_mut().find(|r| r.name == name) {
                r.settling = left;
            }
        }
        records.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(records)
    }

    pub(super) async fn define_call(
        &self,
        name: &str,
        definition: &str,
    ) -> Result<PartitionRecord, StoreError> {
        let key = format!("{}{name}", self.partition_prefix());
        let value = self.encode(&Stored {
            definition: definition.to_string(),
            epoch: 1,
        })?;
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), value, None)]);
        self.write_txn(txn, "define_partition").await?;
        self.read_partitions()
            .await?
            .into_iter()
            .find(|r| r.name == name)
            .ok_or_else(|| {
                let e = format!(
                    "etcd at {}: partition `{name}` not found after recording it",
                    self.at
                );
                StoreError::decode(e, "missing key")
            })
    }

    pub(super) async fn redefine_call(
        &self,
        name: &str,
        from_epoch: u64,
        definition: &str,
        settle: Duration,
    ) -> Result<Option<PartitionRecord>, StoreError> {
        let key = format!("{}{name}", self.partition_prefix());
        let current = self
            .members
            .call(|mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await
            .map_err(self.error("redefine_partition"))?;
        let (epoch, revision) = match current.kvs().first() {
            Some(kv) => match serde_json::from_slice::<Stored>(kv.value()) {
                Ok(s) => (s.epoch, kv.mod_revision()),
                Err(e) => {
                    let at = format!("etcd at {}: partition `{name}`", self.at);
                    return Err(StoreError::decode(at, e));
                }
            },
            None => (0, 0),
        };
        if epoch != from_epoch {
            return Ok(None);
        }
        // Whole seconds, rounded up: the settle window is never shorter.
        let secs = settle.as_millis().div_ceil(1000).max(1) as i64;
        let granted = self
            .members
            .write(|mut c| async move { c.lease_grant(secs, None).await })
            .await
            .map_err(self.error("settle lease grant"))?;
        let value = self.encode(&Stored {
            definition: definition.to_string(),
            epoch: epoch + 1,
        })?;
        let settling = format!("{}{name}", self.settling_prefix());
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([
                TxnOp::put(key, value, None),
                TxnOp::put(
                    settling,
                    Vec::new(),
                    Some(PutOptions::new().with_lease(granted.id())),
                ),
            ]);
        if !self.write_txn(txn, "redefine_partition").await?.succeeded() {
            return Ok(None);
        }
        // The window counts from the write, not from the grant: one
        // keep-alive after the write restarts the lease's full TTL.
        let id = granted.id();
        let refreshed = self
            .members
            .write(|mut c| async move {
                let (mut keeper, mut answers) = c.lease_keep_alive(id).await?;
                keeper.keep_alive().await?;
                answers.message().await
            })
            .await;
        if let Err(e) = refreshed {
            // The record changed: the window may be short by the write's
            // own time. Say so rather than pretend.
            return Err(self.error("settle lease refresh after the change")(e));
        }
        Ok(Some(PartitionRecord {
            name: name.to_string(),
            definition: definition.to_string(),
            epoch: epoch + 1,
            settling: Duration::from_secs(granted.ttl().max(1) as u64),
        }))
    }
}
