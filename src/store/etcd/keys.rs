//! The role keys: their value, how they are read, and the one
//! transaction that begins a term.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use futures_util::future::join_all;

use super::members::{self, CallError};
use super::{EtcdStore, MAX_TXN_OPS};
use crate::store::{Grant, InstanceInfo, LeaseRecord, StoreError};

/// A role key's value.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Holder {
    pub(super) holder: String,
    pub(super) address: String,
    /// The TTL of the holder's etcd lease, in milliseconds (absent in keys
    /// written by versions before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) ttl_ms: Option<u64>,
}

/// A role key as read from etcd.
pub(super) struct RoleKey {
    pub(super) holder: Holder,
    /// The token: the revision of the put that began the term.
    pub(super) token: u64,
    pub(super) lease: i64,
}

impl EtcdStore {
    /// The value of a role key held by `instance` under a lease of `ttl`.
    pub(super) fn holder_value(
        &self,
        instance: &InstanceInfo,
        ttl: Duration,
    ) -> Result<Vec<u8>, StoreError> {
        serde_json::to_vec(&Holder {
            holder: instance.id.clone(),
            address: instance.address.clone(),
            ttl_ms: Some(ttl.as_millis() as u64),
        })
        .map_err(|e| {
            StoreError::unavailable(format!("etcd at {}: encoding the holder", self.at), e)
        })
    }

    /// Every role key, and the Raft term the read was answered in.
    pub(super) async fn read_roles(&self) -> Result<(BTreeMap<String, RoleKey>, u64), StoreError> {
        let prefix = self.lease_prefix();
        let resp = self
            .members
            .call(|mut c| {
                let prefix = prefix.clone();
                async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await }
            })
            .await
            .map_err(self.error("read"))?;
        let mut term = 0;
        if let Some(h) = resp.header() {
            self.read_revision.store(h.revision(), Ordering::Relaxed);
            term = h.raft_term();
        }
        let mut out = BTreeMap::new();
        for kv in resp.kvs() {
            let Some(role) = kv.key_str().ok().and_then(|k| k.strip_prefix(&prefix)) else {
                continue;
            };
            if let Some(key) = Self::role_key(kv) {
                out.insert(role.to_string(), key);
            }
        }
        Ok((out, term))
    }

    /// The role keys of `roles` only (the ones a claim renews or takes),
    /// in one read-only transaction per [`MAX_TXN_OPS`] roles, and the Raft
    /// term the reads were answered in (they must agree).
    pub(super) async fn read_some(
        &self,
        roles: &[&str],
    ) -> Result<(BTreeMap<String, RoleKey>, u64), StoreError> {
        let reads = roles.chunks(MAX_TXN_OPS).map(|chunk| {
            let gets: Vec<TxnOp> = (chunk.iter())
                .map(|r| TxnOp::get(self.lease_key(r), None))
                .collect();
            let txn = Txn::new().and_then(gets);
            self.members.call(move |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
        });
        let mut out = BTreeMap::new();
        let mut term = None;
        let prefix = self.lease_prefix();
        for resp in join_all(reads).await {
            let resp = resp.map_err(self.error("read"))?;
            let answered = resp.header().map_or(0, |h| h.raft_term());
            if *term.get_or_insert(answered) != answered {
                return Err(StoreError::unavailable(
                    format!("etcd at {}: read failed", self.at),
                    "the reads were answered in two Raft terms; reading again",
                ));
            }
            for op in resp.op_responses() {
                let TxnOpResponse::Get(get) = op else {
                    continue;
                };
                for kv in get.kvs() {
                    let Some(role) = kv.key_str().ok().and_then(|k| k.strip_prefix(&prefix)) else {
                        continue;
                    };
                    if let Some(key) = Self::role_key(kv) {
                        out.insert(role.to_string(), key);
                    }
                }
            }
        }
        Ok((out, term.unwrap_or(0)))
    }

    /// A role key's holder, token and lease, if its value reads as one.
    pub(super) fn role_key(kv: &KeyValue) -> Option<RoleKey> {
        let holder = serde_json::from_slice::<Holder>(kv.value()).ok()?;
        Some(RoleKey {
            holder,
            token: kv.mod_revision() as u64,
            lease: kv.lease(),
        })
    }

    /// The record of `role` as its key says (`None`: no key, no holder);
    /// `legacy` is the lease TTL looked up for a key without one in its value.
    pub(super) fn record(
        role: &str,
        key: Option<&RoleKey>,
        legacy: Option<Duration>,
    ) -> LeaseRecord {
        match key {
            // The key exists, so its lease was alive when read: the term
            // runs at most its TTL from then.
            Some(k) => LeaseRecord {
                role: role.to_string(),
                holder: Some(k.holder.holder.clone()),
                holder_address: Some(k.holder.address.clone()),
                token: k.token,
                remaining: (k.holder.ttl_ms.map(Duration::from_millis))
                    .or(legacy)
                    .unwrap_or_default(),
            },
            None => LeaseRecord {
                role: role.to_string(),
                holder: None,
                holder_address: None,
                token: 0,
                remaining: Duration::ZERO,
            },
        }
    }

    /// Begins a new term for `role` in one transaction: puts the key
    /// attached to `lease` if it is still absent (`seen` None) or still at
    /// the token `seen` (a key of the caller's that it does not hold as
    /// that term). The token is the put's revision.
    pub(super) async fn begin_term(
        &self,
        role: String,
        seen: Option<u64>,
        value: &[u8],
        lease: i64,
    ) -> Result<Option<(String, u64)>, StoreError> {
        let key = self.lease_key(&role);
        let unchanged = match seen {
            Some(token) => Compare::mod_revision(key.clone(), CompareOp::Equal, token as i64),
            None => Compare::version(key.clone(), CompareOp::Equal, 0),
        };
        let put = TxnOp::put(
            key,
            value.to_vec(),
            Some(PutOptions::new().with_lease(lease)),
        );
        let txn = Txn::new().when([unchanged]).and_then([put]);
        let resp = self.write_txn(txn, "acquire").await?;
        Ok(resp
            .succeeded()
            .then(|| resp.header().map(|h| (role, h.revision() as u64)))
            .flatten())
    }

    /// Begins a new term for each `(role, seen)` of `batch` in one
    /// transaction of nested ones, each putting its key attached to `lease`
    /// if it is still absent (`seen` None) or still at the token `seen`,
    /// as [`Self::begin_term`] does for one. Every put of the transaction
    /// has its revision, which is each new term's token.
    pub(super) async fn begin_terms(
        &self,
        batch: &[(String, Option<u64>)],
        value: &[u8],
        lease: i64,
    ) -> Result<Vec<Grant>, StoreError> {
        let ops: Vec<TxnOp> = (batch.iter())
            .map(|(role, seen)| {
                let key = self.lease_key(role);
                let unchanged = match seen {
                    Some(token) => {
                        Compare::mod_revision(key.clone(), CompareOp::Equal, *token as i64)
                    }
                    None => Compare::version(key.clone(), CompareOp::Equal, 0),
                };
                let options = PutOptions::new().with_lease(lease);
                let put = TxnOp::put(key, value.to_vec(), Some(options));
                TxnOp::txn(Txn::new().when([unchanged]).and_then([put]))
            })
            .collect();
        let resp = self.write_txn(Txn::new().and_then(ops), "acquire").await?;
        let Some(revision) = resp.header().map(|h| h.revision() as u64) else {
            return Ok(Vec::new());
        };
        Ok((batch.iter())
            .zip(resp.op_responses())
            .filter(|(_, op)| matches!(op, TxnOpResponse::Txn(t) if t.succeeded()))
            .map(|((role, _), _)| Grant {
                role: role.clone(),
                token: revision,
            })
            .collect())
    }

    /// The time left on each holder's term, for keys without a TTL in their
    /// value (written by earlier versions): the granted TTL of their lease.
    pub(super) async fn legacy_ttls(
        &self,
        current: &BTreeMap<String, RoleKey>,
    ) -> Result<HashMap<i64, Duration>, StoreError> {
        let mut ids: Vec<i64> = current
            .values()
            .filter(|k| k.holder.ttl_ms.is_none())
            .map(|k| k.lease)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let lookups = ids.iter().map(|&id| async move {
            let found = self
                .members
                .call(|mut c| async move { c.lease_time_to_live(id, None).await })
                .await;
            match found {
                Ok(r) if r.ttl() > 0 => {
                    Ok((id, Duration::from_secs(r.granted_ttl().max(1) as u64)))
                }
                Ok(_) => Ok((id, Duration::ZERO)),
                Err(CallError::Etcd(e)) if members::is_answer(&e) => Ok((id, Duration::ZERO)),
                Err(e) => Err(self.error("lease lookup")(e)),
            }
        });
        join_all(lookups).await.into_iter().collect()
    }

    /// Every registered role name (the marker keys).
    pub(super) async fn known_roles(&self) -> Result<Vec<String>, StoreError> {
        let prefix = self.known_prefix();
        let resp = self
            .members
            .call(|mut c| {
                let prefix = prefix.clone();
                let options = GetOptions::new().with_prefix().with_keys_only();
                async move { c.get(prefix, Some(options)).await }
            })
            .await
            .map_err(self.error("snapshot"))?;
        Ok(resp
            .kvs()
            .iter()
            .filter_map(|kv| kv.key_str().ok()?.strip_prefix(&prefix).map(str::to_owned))
            .collect())
    }
}
