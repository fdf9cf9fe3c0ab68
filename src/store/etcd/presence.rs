//! Presence records (partition balance): a key `{ns}/members/{id}` on the
//! instance's own etcd lease, so it expires with it; written and read back in
//! one transaction.
//!
//! Reads of presence changes put the key only when its value or lease
//! changed (the lease's keep-alive keeps it otherwise), and read only the
//! keys modified after the cursor's revision, with a count of all of them:
//! a member that left or expired (its key deleted) leaves the count short
//! of the members the reader knows, and the read becomes a full one.

use std::time::Duration;

use std::collections::BTreeSet;

use etcd_client::{GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::EtcdStore;
use crate::store::{Cursor, InstanceInfo, Member, MemberChanges, StoreError};

/// What one instance's reads of presence changes left behind.
#[derive(Default)]
pub(super) struct PresenceView {
    /// The lease and value of the record as last put.
    written: Option<(i64, String)>,
    /// The members the reader knows.
    ids: BTreeSet<String>,
}

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
            if let TxnOpResponse::Get(get) = op {
                members.extend(parse_members(get.kvs(), &prefix));
            }
        }
        Ok(members)
    }

    pub(super) async fn presence_changes_call(
        &self,
        me: &InstanceInfo,
        candidate: bool,
        routes: &str,
        ttl: Duration,
        since: Option<Cursor>,
    ) -> Result<MemberChanges, StoreError> {
        let (lease, _, _) = self.keep_alive(&me.id, ttl).await?;
        let value = crate::store::member_value(candidate, &me.address, routes);
        let prefix = format!("{}/members/", self.ns);
        let mut view = self.take_view(&me.id);
        let unchanged = view.written.as_ref() == Some(&(lease, value.clone()));
        if let Some(since) = since.filter(|_| unchanged) {
            let after = i64::try_from(since.position).unwrap_or(i64::MAX);
            let changed = GetOptions::new()
                .with_prefix()
                .with_min_mod_revision(after.saturating_add(1));
            let count = GetOptions::new().with_prefix().with_count_only();
            let txn = Txn::new().and_then([
                TxnOp::get(prefix.clone(), Some(changed)),
                TxnOp::get(prefix.clone(), Some(count)),
            ]);
            let resp = self.write_txn(txn, "presence").await?;
            let revision = resp.header().map_or(0, |h| h.revision());
            let gets: Vec<_> = (resp.op_responses().into_iter())
                .filter_map(|op| match op {
                    TxnOpResponse::Get(get) => Some(get),
                    _ => None,
                })
                .collect();
            if let [changed, count] = &gets[..] {
                let members = parse_members(changed.kvs(), &prefix);
                let mut ids = view.ids.clone();
                ids.extend(members.iter().map(|m| m.id.clone()));
                // Keys are only added or changed here: a count short of the
                // members known means one was deleted (left or expired).
                if ids.len() as i64 == count.count() && revision >= after {
                    view.ids = ids;
                    self.keep_view(&me.id, view);
                    return Ok(MemberChanges::changed(
                        members,
                        Vec::new(),
                        Cursor::at(revision as u64),
                    ));
                }
            }
        }
        let put = TxnOp::put(
            self.member_key(&me.id),
            value.clone(),
            Some(PutOptions::new().with_lease(lease)),
        );
        let all = TxnOp::get(prefix.clone(), Some(GetOptions::new().with_prefix()));
        let resp = self
            .write_txn(Txn::new().and_then([put, all]), "presence")
            .await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let mut members = Vec::new();
        for op in resp.op_responses() {
            if let TxnOpResponse::Get(get) = op {
                members.extend(parse_members(get.kvs(), &prefix));
            }
        }
        view.written = Some((lease, value));
        view.ids = members.iter().map(|m| m.id.clone()).collect();
        self.keep_view(&me.id, view);
        Ok(MemberChanges::full(
            members,
            Cursor::at(revision.max(0) as u64),
        ))
    }

    /// The presence view of reader `id` (taken out; put back with
    /// [`Self::keep_view`] after a read that succeeded).
    fn take_view(&self, id: &str) -> PresenceView {
        let mut views = self
            .presence_views
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        views.remove(id).unwrap_or_default()
    }

    fn keep_view(&self, id: &str, view: PresenceView) {
        let mut views = self
            .presence_views
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        views.insert(id.to_string(), view);
    }

    pub(super) async fn leave_call(&self, me: &InstanceInfo) -> Result<(), StoreError> {
        self.take_view(&me.id);
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

/// The presence records among `kvs`, keys under `prefix`.
fn parse_members(kvs: &[etcd_client::KeyValue], prefix: &str) -> Vec<Member> {
    kvs.iter()
        .filter_map(|kv| {
            let (key, value) = (kv.key_str().ok()?, kv.value_str().ok()?);
            crate::store::parse_member(key.strip_prefix(prefix)?, value)
        })
        .collect()
}
