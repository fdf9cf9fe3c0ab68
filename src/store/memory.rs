//! In-process store: one process, tests and single-instance development.
//! Expiry is judged by this process's monotonic clock.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::{stream, FutureExt};
use tokio::sync::broadcast;

use super::{
    feed, ChangeFeed, Changes, Claim, Cursor, Grant, InstanceInfo, LeaseRecord, LeaseStore, Member,
    MemberChanges, PartitionRecord, RoleName, StoreError, Tally,
};

#[derive(Debug, Clone)]
struct Record {
    holder: Option<String>,
    holder_address: Option<String>,
    token: u64,
    expires_at: Instant,
    /// The generation of the last change that began or ended a term here.
    changed: u64,
}

#[derive(Debug)]
struct Presence {
    member: Member,
    until: Instant,
    /// The member generation of its last change.
    changed: u64,
}

/// How long a presence record is kept after its end.
const PRESENCE_KEPT: Duration = Duration::from_secs(3600);

/// A lease table in memory; clone the `Arc` to share it between coordinators.
#[derive(Debug)]
pub struct MemoryStore {
    table: Mutex<BTreeMap<String, Record>>,
    /// Presence records by id, kept an hour past their end (so readers of
    /// changes see them go).
    members: Mutex<BTreeMap<String, Presence>>,
    /// Counts the presence changes (joins, returns, changes, leaves).
    member_generation: AtomicU64,
    /// Partition definitions: (definition, epoch, settled at).
    partitions: Mutex<BTreeMap<String, (String, u64, Instant)>>,
    changes: broadcast::Sender<()>,
    /// Counts the changes that began or ended a term (written under the
    /// table's lock, so in the order of the changes).
    generation: AtomicU64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty lease table.
    pub fn new() -> Self {
        Self {
            table: Mutex::new(BTreeMap::new()),
            members: Mutex::new(BTreeMap::new()),
            member_generation: AtomicU64::new(0),
            partitions: Mutex::new(BTreeMap::new()),
            changes: broadcast::channel(64).0,
            generation: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Record>> {
        // A poisoned lock only means another thread panicked mid-update of plain
        // data; the map itself is still consistent record by record.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next generation; called with the table locked.
    fn next_generation(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn blank(&self, now: Instant) -> Record {
        Record {
            holder: None,
            holder_address: None,
            token: 0,
            expires_at: now,
            changed: self.next_generation(),
        }
    }
}

impl MemoryStore {
    /// Writes `me`'s presence record, a change when it is new, back after
    /// its end, or says something else; forgets records long ended.
    fn write_presence(
        &self,
        me: &InstanceInfo,
        candidate: bool,
        routes: &str,
        ttl: Duration,
        now: Instant,
    ) -> std::sync::MutexGuard<'_, BTreeMap<String, Presence>> {
        let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
        let member = Member {
            id: me.id.clone(),
            address: me.address.clone(),
            candidate,
            routes: routes.to_string(),
        };
        let until = now + ttl;
        match members.get_mut(&me.id) {
            Some(p) if p.until > now && p.member == member => p.until = until,
            _ => {
                let changed = self.member_generation.fetch_add(1, Ordering::Relaxed) + 1;
                let record = Presence {
                    member,
                    until,
                    changed,
                };
                members.insert(me.id.clone(), record);
            }
        }
        members.retain(|_, p| p.until + PRESENCE_KEPT > now);
        members
    }
}

/// The members whose record has not ended.
fn live_members(members: &mut BTreeMap<String, Presence>, now: Instant) -> Vec<Member> {
    (members.values())
        .filter(|p| p.until > now)
        .map(|p| p.member.clone())
        .collect()
}

impl LeaseStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn migrate(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        async { Ok(()) }.boxed()
    }

    fn register<'a>(&'a self, roles: &'a [RoleName]) -> BoxFuture<'a, Result<(), StoreError>> {
        async move {
            let now = Instant::now();
            let mut t = self.lock();
            for r in roles {
                t.entry(r.to_string()).or_insert_with(|| self.blank(now));
            }
            Ok(())
        }
        .boxed()
    }

    fn claim<'a>(
        &'a self,
        instance: &'a InstanceInfo,
        claims: &'a [Claim],
    ) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>> {
        async move {
            let now = Instant::now();
            let mut changed = false;
            let mut grants = Vec::new();
            {
                let mut t = self.lock();
                for c in claims {
                    let rec = t
                        .entry(c.role.to_string())
                        .or_insert_with(|| self.blank(now));
                    let live = rec.holder.is_some() && rec.expires_at > now;
                    let mine = rec.holder.as_deref() == Some(instance.id.as_str());
                    if live && (!mine || c.one_shot) {
                        continue;
                    }
                    if !(live && mine && c.held_token == Some(rec.token)) {
                        rec.token += 1;
                        rec.changed = self.next_generation();
                        changed = true;
                    }
                    rec.holder = Some(instance.id.clone());
                    rec.holder_address = Some(instance.address.clone());
                    rec.expires_at = now
                        .checked_add(c.duration)
                        .unwrap_or(now + Duration::from_secs(86_400 * 365));
                    grants.push(Grant {
                        role: c.role.to_string(),
                        token: rec.token,
                    });
                }
            }
            if changed {
                let _ = self.changes.send(());
            }
            Ok(grants)
        }
        .boxed()
    }

    fn release<'a>(
        &'a self,
        instance: &'a InstanceInfo,
        held: &'a [(RoleName, u64)],
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        async move {
            let now = Instant::now();
            let mut released = Vec::new();
            {
                let mut t = self.lock();
                for (role, token) in held {
                    if let Some(rec) = t.get_mut(role.as_str()) {
                        if rec.holder.as_deref() == Some(instance.id.as_str())
                            && rec.token == *token
                        {
                            rec.holder = None;
                            rec.holder_address = None;
                            rec.expires_at = now;
                            rec.changed = self.next_generation();
                            released.push(role.to_string());
                        }
                    }
                }
            }
            if !released.is_empty() {
                let _ = self.changes.send(());
            }
            Ok(released)
        }
        .boxed()
    }

    fn snapshot<'a>(
        &'a self,
        roles: &'a [RoleName],
    ) -> BoxFuture<'a, Result<Vec<LeaseRecord>, StoreError>> {
        async move {
            let now = Instant::now();
            let t = self.lock();
            let to_record = |role: &str, r: &Record| LeaseRecord {
                role: role.to_string(),
                holder: r.holder.clone(),
                holder_address: r.holder_address.clone(),
                token: r.token,
                remaining: r.expires_at.saturating_duration_since(now),
            };
            Ok(if roles.is_empty() {
                t.iter().map(|(k, v)| to_record(k, v)).collect()
            } else {
                roles
                    .iter()
                    .filter_map(|k| t.get(k.as_str()).map(|v| to_record(k, v)))
                    .collect()
            })
        }
        .boxed()
    }

    fn changes<'a>(
        &'a self,
        roles: &'a [RoleName],
        since: Option<Cursor>,
        horizon: Duration,
    ) -> BoxFuture<'a, Result<Changes, StoreError>> {
        async move {
            let now = Instant::now();
            let t = self.lock();
            let position = self.generation.load(Ordering::Relaxed);
            let cursor = Cursor::at(position);
            let Some(since) = since.filter(|c| c.position <= position) else {
                drop(t);
                let records = self.snapshot(roles).await?;
                // The cursor was read first: a change made before the
                // snapshot below is newer than it, and read again next time.
                return Ok(Changes::full(records, cursor));
            };
            let ending = now + horizon;
            let records = t
                .iter()
                .filter(|(_, r)| {
                    r.changed > since.position || (r.holder.is_some() && r.expires_at < ending)
                })
                .map(|(k, r)| LeaseRecord {
                    role: k.clone(),
                    holder: r.holder.clone(),
                    holder_address: r.holder_address.clone(),
                    token: r.token,
                    remaining: r.expires_at.saturating_duration_since(now),
                })
                .collect();
            Ok(Changes::changed(records, cursor))
        }
        .boxed()
    }

    fn tally<'a>(
        &'a self,
        roles: &'a [RoleName],
    ) -> BoxFuture<'a, Result<Option<Tally>, StoreError>> {
        async move {
            let t = self.lock();
            let mut tally = Tally::default();
            for r in roles.iter().filter_map(|r| t.get(r.as_str())) {
                tally.records += 1;
                tally.holders += u64::from(r.holder.is_some());
                tally.tokens = tally.tokens.wrapping_add(r.token);
            }
            Ok(Some(tally))
        }
        .boxed()
    }

    fn subscribe(&self) -> BoxFuture<'_, Result<ChangeFeed, StoreError>> {
        // Subscribed before the future runs: no change after this call is missed.
        let rx = self.changes.subscribe();
        async move {
            let notices = stream::unfold(rx, |mut rx| async move {
                match rx.recv().await {
                    Ok(()) | Err(broadcast::error::RecvError::Lagged(_)) => Some(((), rx)),
                    Err(broadcast::error::RecvError::Closed) => None,
                }
            });
            Ok(feed::spawn(notices))
        }
        .boxed()
    }

    fn presence<'a>(
        &'a self,
        me: &'a InstanceInfo,
        candidate: bool,
        routes: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Member>, StoreError>> {
        async move {
            let now = Instant::now();
            let mut members = self.write_presence(me, candidate, routes, ttl, now);
            Ok(live_members(&mut members, now))
        }
        .boxed()
    }

    fn presence_changes<'a>(
        &'a self,
        me: &'a InstanceInfo,
        candidate: bool,
        routes: &'a str,
        ttl: Duration,
        since: Option<Cursor>,
        horizon: Duration,
    ) -> BoxFuture<'a, Result<MemberChanges, StoreError>> {
        async move {
            let now = Instant::now();
            let mut members = self.write_presence(me, candidate, routes, ttl, now);
            let position = self.member_generation.load(Ordering::Relaxed);
            let cursor = Cursor::at(position);
            let Some(since) = since.filter(|c| c.position <= position) else {
                return Ok(MemberChanges::full(live_members(&mut members, now), cursor));
            };
            let (mut live, mut gone) = (Vec::new(), Vec::new());
            for (id, p) in members.iter() {
                if p.until > now {
                    if p.changed > since.position {
                        live.push(p.member.clone());
                    }
                } else if p.changed > since.position || p.until + horizon * 3 >= now {
                    // Ended since the cursor, or lately (expiry is no
                    // change of its own; a reader reads every tick).
                    gone.push(id.clone());
                }
            }
            Ok(MemberChanges::changed(live, gone, cursor))
        }
        .boxed()
    }

    fn partitions(&self) -> BoxFuture<'_, Result<Vec<PartitionRecord>, StoreError>> {
        async move {
            let now = Instant::now();
            let t = self.partitions.lock().unwrap_or_else(|p| p.into_inner());
            Ok(t.iter()
                .map(|(name, (def, epoch, settled))| {
                    partition_record(name, def, *epoch, *settled, now)
                })
                .collect())
        }
        .boxed()
    }

    fn define_partition<'a>(
        &'a self,
        name: &'a str,
        definition: &'a str,
    ) -> BoxFuture<'a, Result<PartitionRecord, StoreError>> {
        async move {
            let now = Instant::now();
            let mut t = self.partitions.lock().unwrap_or_else(|p| p.into_inner());
            let (def, epoch, settled) = t
                .entry(name.to_string())
                .or_insert_with(|| (definition.to_string(), 1, now));
            Ok(partition_record(name, def, *epoch, *settled, now))
        }
        .boxed()
    }

    fn redefine_partition<'a>(
        &'a self,
        name: &'a str,
        from_epoch: u64,
        definition: &'a str,
        settle: Duration,
    ) -> BoxFuture<'a, Result<Option<PartitionRecord>, StoreError>> {
        async move {
            let now = Instant::now();
            let record = {
                let mut t = self.partitions.lock().unwrap_or_else(|p| p.into_inner());
                let epoch = t.get(name).map_or(0, |r| r.1);
                if epoch != from_epoch {
                    return Ok(None);
                }
                let settled = now + settle;
                t.insert(
                    name.to_string(),
                    (definition.to_string(), epoch + 1, settled),
                );
                partition_record(name, definition, epoch + 1, settled, now)
            };
            let _ = self.changes.send(());
            Ok(Some(record))
        }
        .boxed()
    }

    fn leave<'a>(&'a self, me: &'a InstanceInfo) -> BoxFuture<'a, Result<(), StoreError>> {
        async move {
            let mut members = self.members.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = members.get_mut(&me.id) {
                p.until = Instant::now();
                p.changed = self.member_generation.fetch_add(1, Ordering::Relaxed) + 1;
            }
            drop(members);
            let _ = self.changes.send(());
            Ok(())
        }
        .boxed()
    }
}

fn partition_record(
    name: &str,
    definition: &str,
    epoch: u64,
    settled: Instant,
    now: Instant,
) -> PartitionRecord {
    PartitionRecord {
        name: name.to_string(),
        definition: definition.to_string(),
        epoch,
        settling: settled.saturating_duration_since(now),
    }
}
