//! The state the coordinator's handles (`coordinator.rs`) and the heartbeat
//! loop (`heartbeat.rs`) share. Both sides go through these methods, so the
//! orderings that matter live here: the flags are read with `Acquire` and
//! written with `Release`, and a snapshot is published in one swap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, Guard};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use super::snapshot::{HolderSnapshot, RoleState};
use super::term::Terms;
use super::LeaseTimings;
use crate::role::RoleName;
use crate::store::{InstanceInfo, LeaseStore};

/// The edges of the intervals in which this instance believes it holds a role.
/// `Began` is emitted just before readers can see the term, `Ended` just after
/// they can no longer; `at` is on the monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseEvent {
    /// A term is about to become visible to readers: a new one, or one this
    /// instance failed closed on and resumed with the same token because
    /// the store kept its grant through the gap.
    Began {
        /// This instance's id.
        instance: Arc<str>,
        /// The role.
        role: Arc<str>,
        /// The term's fencing token.
        token: u64,
        /// When belief began.
        at: Instant,
        /// Local trust deadline at the start; later renewals extend it.
        until: Instant,
    },
    /// The term was renewed: belief now lasts until `until`.
    Renewed {
        /// This instance's id.
        instance: Arc<str>,
        /// The role.
        role: Arc<str>,
        /// The term's fencing token.
        token: u64,
        /// The new local trust deadline.
        until: Instant,
    },
    /// No reader can see the term any more.
    Ended {
        /// This instance's id.
        instance: Arc<str>,
        /// The role.
        role: Arc<str>,
        /// The term's fencing token.
        token: u64,
        /// When belief ended.
        at: Instant,
    },
}

pub(super) type IntervalHook = Arc<dyn Fn(LeaseEvent) + Send + Sync>;

/// Counters of store work, read by [`super::Coordinator::stats`].
#[derive(Default)]
pub(super) struct Counters {
    pub(super) ticks: AtomicU64,
    pub(super) claim_calls: AtomicU64,
    pub(super) snapshot_calls: AtomicU64,
    pub(super) full_reads: AtomicU64,
    pub(super) rows_read: AtomicU64,
    pub(super) release_calls: AtomicU64,
    pub(super) store_errors: AtomicU64,
    pub(super) late_responses: AtomicU64,
    pub(super) term_changes: AtomicU64,
    pub(super) max_calls_per_tick: AtomicU64,
}

impl Counters {
    /// Adds one to a counter.
    pub(super) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A registered role: its name and timings.
pub(super) struct RoleMeta {
    pub(super) name: RoleName,
    pub(super) timings: LeaseTimings,
}

/// Where a partition's roles sit among all registered roles.
#[derive(Clone)]
pub(super) struct PartitionMeta {
    /// Its definition text (`definition_text`), compared with the store's.
    pub(super) definition: Arc<str>,
    /// The scopes declared for it (part of the definition).
    pub(super) scopes: Arc<[Option<String>]>,
    pub(super) count: u32,
    pub(super) first: usize,
    /// `Some(rebalance_delay)` when the partition is balanced.
    pub(super) balance: Option<Duration>,
    /// How long a balance move waits for local work before ending it.
    pub(super) handover_drain: Duration,
}

/// Every registered role, in order, with lookups by name.
pub(super) struct Registry {
    pub(super) roles: Vec<RoleMeta>,
    pub(super) index: HashMap<Arc<str>, usize>,
    pub(super) partitions: HashMap<String, PartitionMeta>,
}

/// The last store failure, and the last one that named a cause (not a bare
/// timeout).
#[derive(Default)]
struct StoreErrors {
    latest: Option<Arc<str>>,
    cause: Option<Arc<str>>,
}

/// The shared state of one coordinator.
pub(super) struct LeaseState {
    instance: InstanceInfo,
    instance_id: Arc<str>,
    store: Arc<dyn LeaseStore>,
    registry: Registry,
    names: Vec<RoleName>,
    snapshot: ArcSwap<HolderSnapshot>,
    /// Per role: a graceful handover began (no new local work).
    handing_over: Vec<AtomicBool>,
    /// Per role: local requests running under it.
    in_flight: Vec<AtomicUsize>,
    /// Woken when a role's local work drops to none.
    idle: Notify,
    /// Per role: the signals of its current term's local work.
    terms: Terms,
    draining: AtomicBool,
    candidate: AtomicBool,
    /// Why this instance does not contend, when it was withdrawn with a reason.
    withdrawal: Mutex<Option<Arc<str>>>,
    /// The last store failure, and the last one that named a cause (not a
    /// bare timeout), for answers given before the first snapshot.
    last_store_error: Mutex<StoreErrors>,
    stopping: AtomicBool,
    wake: Notify,
    published: watch::Sender<u64>,
    counters: Counters,
    hook: Option<IntervalHook>,
    task: Mutex<Option<JoinHandle<()>>>,
    /// Shortest renew interval among all roles.
    tick_every: Duration,
    /// Shortest trust window (`duration - safety_margin`) among all roles.
    op_timeout: Duration,
    /// What the presence record carries: the route-table fingerprint and
    /// the partition definitions.
    routes: Arc<str>,
}

impl LeaseState {
    pub(super) fn new(
        instance: InstanceInfo,
        store: Arc<dyn LeaseStore>,
        registry: Registry,
        hook: Option<IntervalHook>,
        routes: Arc<str>,
    ) -> LeaseState {
        let mut registry_defs: Vec<(String, Arc<str>)> = (registry.partitions.iter())
            .map(|(n, m)| (n.clone(), m.definition.clone()))
            .collect();
        registry_defs.sort();
        let roles = &registry.roles;
        let tick_every = roles
            .iter()
            .map(|r| r.timings.renew_interval)
            .min()
            .unwrap_or_default();
        let op_timeout = roles
            .iter()
            .map(|r| r.timings.duration - r.timings.safety_margin)
            .min()
            .unwrap_or_default();
        let initial = HolderSnapshot {
            roles: roles
                .iter()
                .map(|r| RoleState {
                    name: r.name.as_arc().clone(),
                    ..RoleState::default()
                })
                .collect(),
            members: Vec::new(),
            published_at: Instant::now(),
            loaded: false,
            store_ok: false,
            last_ok_sent: None,
            candidate: true,
            draining: false,
            definitions: Vec::new(),
        };
        LeaseState {
            instance_id: instance.id.as_str().into(),
            instance,
            store,
            names: roles.iter().map(|r| r.name.clone()).collect(),
            handing_over: roles.iter().map(|_| AtomicBool::new(false)).collect(),
            in_flight: roles.iter().map(|_| AtomicUsize::new(0)).collect(),
            idle: Notify::new(),
            terms: Terms::new(roles.len()),
            registry,
            snapshot: ArcSwap::from_pointee(initial),
            draining: AtomicBool::new(false),
            candidate: AtomicBool::new(true),
            withdrawal: Mutex::new(None),
            last_store_error: Mutex::new(StoreErrors::default()),
            stopping: AtomicBool::new(false),
            wake: Notify::new(),
            published: watch::channel(0).0,
            counters: Counters::default(),
            hook,
            task: Mutex::new(None),
            tick_every,
            op_timeout,
            routes: {
                let defs: Vec<(&str, &str)> = (registry_defs.iter())
                    .map(|(n, d)| (n.as_str(), &**d))
                    .collect();
                super::fingerprint::presence_payload(&routes, &defs).into()
            },
        }
    }

    /// What this instance publishes with its presence record.
    pub(super) fn routes(&self) -> &str {
        &self.routes
    }

    pub(super) fn instance(&self) -> &InstanceInfo {
        &self.instance
    }

    pub(super) fn instance_id(&self) -> &Arc<str> {
        &self.instance_id
    }

    pub(super) fn store(&self) -> &Arc<dyn LeaseStore> {
        &self.store
    }

    pub(super) fn role(&self, i: usize) -> &RoleMeta {
        &self.registry.roles[i]
    }

    /// The `role` label of role `i`'s metrics: its name, or for a
    /// partition's role the partition's (its series sums the partition's
    /// roles), unless every role is to have series of its own.
    pub(super) fn metric_label(&self, i: usize) -> String {
        if !crate::telemetry::per_role_metrics() {
            let mut partitions = self.registry.partitions.iter();
            if let Some((name, _)) =
                partitions.find(|(_, p)| (p.first..p.first + p.count as usize).contains(&i))
            {
                return name.clone();
            }
        }
        self.role(i).name.to_string()
    }

    pub(super) fn role_count(&self) -> usize {
        self.registry.roles.len()
    }

    /// Every registered role name, in registration order.
    pub(super) fn names(&self) -> &[RoleName] {
        &self.names
    }

    pub(super) fn index_of(&self, role: &str) -> Option<usize> {
        self.registry.index.get(role).copied()
    }

    pub(super) fn partition(&self, name: &str) -> Option<PartitionMeta> {
        self.registry.partitions.get(name).cloned()
    }

    /// Every partition, by name.
    pub(super) fn partitions(&self) -> impl Iterator<Item = (&String, &PartitionMeta)> {
        self.registry.partitions.iter()
    }

    /// Starts or ends the graceful handover of role `i`; starting it tells
    /// the work running under the role that its term is ending.
    pub(super) fn set_handing_over(&self, i: usize, on: bool) {
        self.handing_over[i].store(on, Ordering::SeqCst);
        if on {
            self.terms.begin_ending(i);
        }
    }

    /// Whether role `i` is being handed over (no new local work).
    pub(super) fn is_handing_over(&self, i: usize) -> bool {
        self.handing_over[i].load(Ordering::SeqCst)
    }

    /// Counts one local request under role `i`, unless its handover began.
    /// The count goes up before the flag is read, and the handover sets the
    /// flag before it reads the count (both `SeqCst`): a request either sees
    /// the handover and stays out, or is seen by it and waited for.
    pub(super) fn enter_local(&self, i: usize) -> bool {
        self.in_flight[i].fetch_add(1, Ordering::SeqCst);
        if self.is_handing_over(i) {
            self.leave_local(i);
            return false;
        }
        true
    }

    /// Ends one local request under role `i`.
    pub(super) fn leave_local(&self, i: usize) {
        if self.in_flight[i].fetch_sub(1, Ordering::SeqCst) == 1 {
            self.idle.notify_waiters();
        }
    }

    /// Waits until no local work runs under any of `roles`, or `limit`
    /// passes; true when none runs.
    pub(super) async fn wait_idle(&self, roles: &[usize], limit: Duration) -> bool {
        let deadline = deadline_after(limit);
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if roles.iter().all(|&i| self.in_flight(i) == 0) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return roles.iter().all(|&i| self.in_flight(i) == 0);
            }
        }
    }

    /// The signals of every role's current term.
    pub(super) fn terms(&self) -> &Terms {
        &self.terms
    }

    /// Local requests running under role `i`.
    pub(super) fn in_flight(&self, i: usize) -> usize {
        self.in_flight[i].load(Ordering::SeqCst)
    }

    /// The published snapshot; hold the guard while judging from it.
    pub(super) fn snapshot(&self) -> Guard<Arc<HolderSnapshot>> {
        self.snapshot.load()
    }

    pub(super) fn snapshot_full(&self) -> Arc<HolderSnapshot> {
        self.snapshot.load_full()
    }

    /// Publishes a snapshot and returns the one it replaced.
    pub(super) fn publish(&self, snapshot: HolderSnapshot) -> Arc<HolderSnapshot> {
        self.snapshot.swap(Arc::new(snapshot))
    }

    /// Tells subscribers that publication number `n` is out.
    pub(super) fn announce(&self, n: u64) {
        self.published.send_replace(n);
    }

    pub(super) fn subscribe_published(&self) -> watch::Receiver<u64> {
        self.published.subscribe()
    }

    pub(super) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// No new local work from now on; the work running is told its term is ending.
    pub(super) fn begin_drain(&self) {
        self.draining.store(true, Ordering::Release);
        for i in 0..self.role_count() {
            self.terms.begin_ending(i);
        }
    }

    pub(super) fn is_candidate(&self) -> bool {
        self.candidate.load(Ordering::Acquire)
    }

    /// Sets candidacy; wakes the loop when it changed. Contending again
    /// forgets the reason of the last withdrawal.
    pub(super) fn set_candidate(&self, candidate: bool, reason: Option<Arc<str>>) {
        *lock(&self.withdrawal) = if candidate { None } else { reason };
        if self.candidate.swap(candidate, Ordering::AcqRel) != candidate {
            self.wake.notify_one();
        }
    }

    /// Why this instance does not contend, when it was withdrawn with a reason.
    /// Notes a store failure; `timed_out` when it names no cause.
    pub(crate) fn set_store_error(&self, error: &str, timed_out: bool) {
        let mut last = lock(&self.last_store_error);
        let error: Arc<str> = error.into();
        if !timed_out {
            last.cause = Some(error.clone());
        }
        last.latest = Some(error);
    }

    /// `Some(last store error, if any)` until a snapshot from the store is
    /// published; `None` after. A bare timeout says the cause seen before it.
    pub(super) fn store_unread(&self) -> Option<Option<Arc<str>>> {
        if self.snapshot().loaded {
            return None;
        }
        let last = lock(&self.last_store_error);
        Some(match (&last.latest, &last.cause) {
            (Some(latest), Some(cause)) if !Arc::ptr_eq(latest, cause) => {
                Some(format!("{latest}; before that: {cause}").into())
            }
            (latest, _) => latest.clone(),
        })
    }

    pub(super) fn withdrawal(&self) -> Option<Arc<str>> {
        if self.is_candidate() {
            return None;
        }
        lock(&self.withdrawal).clone()
    }

    pub(super) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Asks the loop to release everything and stop.
    pub(super) fn request_stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Wakes the loop early (a change notice, a candidacy change).
    pub(super) async fn woken(&self) {
        self.wake.notified().await
    }

    pub(super) fn counters(&self) -> &Counters {
        &self.counters
    }

    pub(super) fn has_hook(&self) -> bool {
        self.hook.is_some()
    }

    /// Reports an interval edge to the hook, if any.
    pub(super) fn emit(&self, event: LeaseEvent) {
        if let Some(hook) = &self.hook {
            // A panicking hook must not stop the heartbeat loop.
            let call = std::panic::AssertUnwindSafe(|| hook(event));
            if std::panic::catch_unwind(call).is_err() {
                tracing::error!("lease event hook panicked");
            }
        }
    }

    pub(super) fn tick_every(&self) -> Duration {
        self.tick_every
    }

    pub(super) fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    pub(super) fn set_task(&self, task: JoinHandle<()>) {
        *lock(&self.task) = Some(task);
    }

    pub(super) fn take_task(&self) -> Option<JoinHandle<()>> {
        lock(&self.task).take()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `limit` from now, saturating: a huge configured bound waits "forever"
/// (a century) instead of overflowing the clock.
pub(crate) fn deadline_after(limit: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(limit)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
}
