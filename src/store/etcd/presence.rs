//! Presence records (partition balance): a key `{ns}/members/{id}` on the
//! instance's own etcd lease, so it expires with it; written and read back in
//! one transaction.

use std::time::Duration;

use etcd_client::{GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::EtcdStore;
use crate::store::{InstanceInfo, Member, StoreError};

impl EtcdStore {
    fn member_key(&self, id: &str) -> String {
        format!("{}/members/{id}", self.ns)
    }

    pub(super) async fn presence_call(
        &self,
        me: &InstanceInfo,
        candidate: bool,
        routes: &str,
        ttl: Duration,
    ) -> Result<Vec<Member>, StoreError> {
        let (lease, _, _) = self.keep_alive(&me.id, ttl).await?;
        let value = crate::store::member_value(candidate, &me.address, routes);
        let prefix = format!("{}/members/", self.ns);
        let txn = Txn::new().and_then([
            TxnOp::put(
                self.member_key(&me.id),
                value,
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::get(prefix.clone(), Some(GetOptions::new().with_prefix())),
        ]);
        let resp = self.write_txn(txn, "presence").await?;
        let mut members = Vec::new();
        for op in resp.op_responses() {
            let TxnOpResponse::Get(get) = op else {
                continue;
            };
            for kv in get.kvs() {
                let (Ok(key), Ok(value)) = (kv.key_str(), kv.value_str()) else {
                    continue;
                };
                let id = key.trim_start_matches(prefix.as_str());
                members.extend(crate::store::parse_member(id, value));
            }
        }
        Ok(members)
    }

    pub(super) async fn leave_call(&self, me: &InstanceInfo) -> Result<(), StoreError> {
        let key = self.member_key(&me.id);
        self.members
            .write(|mut c| {
                let key = key.clone();
                async move { c.delete(key, None).await }
            })
            .await
            .map_err(self.error("leave"))?;
        Ok(())
    }
}
