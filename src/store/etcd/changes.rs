//! Reads of changes: a watch on the role keys, started just after a full
//! read's revision, keeps every put and delete since in a log; a read of
//! changes hands out the entries after the reader's cursor. etcd delivers a
//! watch's events in revision order and without gaps while the watch lives,
//! so the log is whole from its start: a watch that ends (its member
//! failed, the cluster compacted its start revision) ends the log, and the
//! next read is a full read that starts another.
//!
//! Expiry needs no polling here: etcd deletes the keys of an expired lease,
//! and the watch carries those deletes like any other change. Renewals are
//! keep-alives of the instance's lease, which change no key.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use etcd_client::{EventType, GetOptions, WatchOptions};

use super::members::Patience;
use super::EtcdStore;
use crate::store::{Changes, Cursor, LeaseRecord, RoleName, StoreError};

/// Changes a log keeps at most (a reader trims what it has read); a reader
/// further behind gets a full read.
const KEPT: usize = 65_536;

/// The changes to role keys since a watch began.
#[derive(Default)]
pub(super) struct ChangeLog {
    /// Which watch this is: every new one takes the next number, the
    /// epoch of its readers' cursors.
    epoch: u64,
    /// Whether the watch still runs (an ended one has lost changes since).
    live: bool,
    /// The log holds every change after this revision...
    base: i64,
    /// ...up to this one (the last the watch delivered).
    upto: i64,
    /// The changes, by revision: the role and its record after the change.
    entries: VecDeque<(i64, LeaseRecord)>,
}

pub(super) type SharedLog = Arc<Mutex<ChangeLog>>;

fn lock(log: &SharedLog) -> std::sync::MutexGuard<'_, ChangeLog> {
    log.lock().unwrap_or_else(|p| p.into_inner())
}

impl EtcdStore {
    /// The read of changes: one count of the role keys (answered from
    /// etcd's index, no value read), which shows the cluster answers, then
    /// the log's entries after `since`, or a full read when the log cannot
    /// answer from it.
    pub(super) async fn changes_call(
        &self,
        roles: &[RoleName],
        since: Option<Cursor>,
    ) -> Result<Changes, StoreError> {
        if let Some(since) = since {
            let prefix = self.lease_prefix();
            let count = self
                .members
                .call(|mut c| {
                    let prefix = prefix.clone();
                    let options = GetOptions::new().with_prefix().with_count_only();
                    async move { c.get(prefix, Some(options)).await }
                })
                .await
                .map_err(self.error("snapshot"))?;
            let now = count.header().map_or(0, |h| h.revision());
            let read = i64::try_from(since.position).unwrap_or(i64::MAX);
            let mut log = lock(&self.log);
            // A cursor from beyond the cluster's revision is from another
            // cluster (or a restored one): read everything.
            let known = read >= log.base && read <= now.max(log.upto);
            if log.live && log.epoch == since.epoch && known {
                let records = (log.entries.iter())
                    .filter(|(rev, _)| *rev > read)
                    .map(|(_, record)| record.clone())
                    .collect();
                let position = log.upto.max(read) as u64;
                // What this reader has read goes: another reader of the
                // same client further behind gets a full read instead.
                while log.entries.front().is_some_and(|(rev, _)| *rev <= read) {
                    if let Some((rev, _)) = log.entries.pop_front() {
                        log.base = rev;
                    }
                }
                return Ok(Changes::changed(
                    records,
                    Cursor {
                        epoch: log.epoch,
                        position,
                    },
                ));
            }
        }
        let records = self.snapshot_at(roles).await?;
        let revision = self
            .read_revision
            .load(std::sync::atomic::Ordering::Relaxed);
        let epoch = self.follow_from(revision).await?;
        Ok(Changes::full(
            records,
            Cursor {
                epoch,
                position: revision.max(0) as u64,
            },
        ))
    }

    /// Makes sure a live watch logs every change after `revision` (a full
    /// read's): keeps the running one if it covers it, else starts another.
    /// Returns the log's epoch.
    async fn follow_from(&self, revision: i64) -> Result<u64, StoreError> {
        {
            let log = lock(&self.log);
            if log.live && log.base <= revision {
                return Ok(log.epoch);
            }
        }
        let prefix = self.lease_prefix();
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        let (member, (watcher, mut stream)) = self
            .members
            .call_at(Patience::Read, |mut c| {
                let (prefix, options) = (prefix.clone(), options.clone());
                async move { c.watch(prefix, Some(options)).await }
            })
            .await
            .map_err(self.error("watch"))?;
        let epoch = {
            let mut log = lock(&self.log);
            *log = ChangeLog {
                epoch: log.epoch + 1,
                live: true,
                base: revision,
                upto: revision,
                entries: VecDeque::new(),
            };
            log.epoch
        };
        let log = self.log.clone();
        let logged = self.logged.clone();
        let mut failures = self.members.failures(member);
        failures.mark_unchanged();
        let prefix = self.lease_prefix();
        tokio::spawn(async move {
            // The watcher lives as long as the stream.
            let _watcher = watcher;
            loop {
                let message = tokio::select! {
                    m = stream.message() => m,
                    _ = failures.changed() => break,
                };
                let resp = match message {
                    Ok(Some(resp)) if !resp.canceled() => resp,
                    _ => break,
                };
                let changed = !resp.events().is_empty();
                let mut log = lock(&log);
                if log.epoch != epoch {
                    return;
                }
                for event in resp.events() {
                    let Some(kv) = event.kv() else { continue };
                    let Some(role) = kv.key_str().ok().and_then(|k| k.strip_prefix(&prefix)) else {
                        continue;
                    };
                    let key = match event.event_type() {
                        EventType::Put => EtcdStore::role_key(kv),
                        EventType::Delete => None,
                    };
                    let record = EtcdStore::record(role, key.as_ref(), None);
                    log.upto = log.upto.max(kv.mod_revision());
                    log.entries.push_back((kv.mod_revision(), record));
                    if log.entries.len() > KEPT {
                        if let Some((rev, _)) = log.entries.pop_front() {
                            log.base = rev;
                        }
                    }
                }
                if let Some(h) = resp.header() {
                    log.upto = log.upto.max(h.revision());
                }
                drop(log);
                if changed {
                    let _ = logged.send(());
                }
            }
            let mut log = lock(&log);
            if log.epoch == epoch {
                log.live = false;
            }
        });
        Ok(epoch)
    }
}
