//! The lease coordinator's handles: the builder that registers roles and
//! partitions and starts the heartbeat loop (`heartbeat.rs`), and the
//! lock-free readers of the snapshot it publishes (`RoleLease`,
//! `RolePartition`, `Coordinator::snapshot`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use super::partition::{partition_index, partition_role_name, PartitionResolution};
use super::snapshot::{HolderSnapshot, RoleState};
use super::{validate_role_name, HeldLease, PartitionSpec, RoleNameError, RoleSpec};
use crate::config::LeaseTimings;
use crate::store::{Claim, InstanceInfo, LeaseStore, StoreError};

/// Longest lease duration accepted, so deadline arithmetic never overflows.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error(transparent)]
    RoleName(#[from] RoleNameError),
    #[error("role `{0}` is registered twice")]
    DuplicateRole(String),
    #[error("partition `{0}` has count {1}; it must be between 1 and 65536")]
    PartitionCount(String, u32),
    #[error("role `{role}`: {message}")]
    Timings { role: String, message: String },
    #[error("no roles or partitions registered")]
    Empty,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The edges of the intervals in which this instance believes it holds a role.
/// `Began` is emitted just before readers can see the term, `Ended` just after
/// they can no longer; `at` is on the monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    Began {
        instance: Arc<str>,
        role: Arc<str>,
        token: u64,
        at: Instant,
        /// Local trust deadline at the start; later renewals extend it.
        until: Instant,
    },
    /// The term was renewed: belief now lasts until `until`.
    Renewed {
        instance: Arc<str>,
        role: Arc<str>,
        token: u64,
        until: Instant,
    },
    Ended {
        instance: Arc<str>,
        role: Arc<str>,
        token: u64,
        at: Instant,
    },
}

pub(super) type IntervalHook = Arc<dyn Fn(LeaseEvent) + Send + Sync>;

/// Counters of store work, for tests, metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoordinatorStats {
    pub ticks: u64,
    pub claim_calls: u64,
    pub snapshot_calls: u64,
    pub release_calls: u64,
    pub store_errors: u64,
    pub late_responses: u64,
    pub term_changes: u64,
    /// Most store calls made by one tick, after the first (registration) tick.
    pub max_calls_per_tick: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) ticks: AtomicU64,
    pub(super) claim_calls: AtomicU64,
    pub(super) snapshot_calls: AtomicU64,
    pub(super) release_calls: AtomicU64,
    pub(super) store_errors: AtomicU64,
    pub(super) late_responses: AtomicU64,
    pub(super) term_changes: AtomicU64,
    pub(super) max_calls_per_tick: AtomicU64,
}

pub(super) struct RoleMeta {
    pub(super) name: Arc<str>,
    pub(super) timings: LeaseTimings,
}

struct PartitionMeta {
    count: u32,
    first: usize,
}

pub(super) struct Shared {
    pub(super) instance: InstanceInfo,
    pub(super) instance_id: Arc<str>,
    pub(super) store: Arc<dyn LeaseStore>,
    pub(super) roles: Vec<RoleMeta>,
    pub(super) names: Vec<String>,
    pub(super) index: HashMap<Arc<str>, usize>,
    partitions: HashMap<String, PartitionMeta>,
    pub(super) snapshot: ArcSwap<HolderSnapshot>,
    pub(super) draining: AtomicBool,
    pub(super) candidate: AtomicBool,
    pub(super) stopping: AtomicBool,
    pub(super) wake: Notify,
    pub(super) published: watch::Sender<u64>,
    pub(super) counters: Counters,
    pub(super) hook: Option<IntervalHook>,
    pub(super) task: Mutex<Option<JoinHandle<()>>>,
    /// Shortest renew interval and shortest trust window among all roles.
    pub(super) tick_every: Duration,
    pub(super) op_timeout: Duration,
}

/// Why [`Coordinator::readiness`] says no.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// The store has not answered since start.
    #[error("no snapshot from the lease store yet")]
    NoSnapshot,
    /// The last successful store round trip is too old to trust any lease.
    #[error("the last successful lease store round trip was {since:.1?} ago (limit {window:?}, duration - safety_margin)")]
    StoreStale { since: Duration, window: Duration },
}

/// Builds a [`Coordinator`]: who this instance is, its roles and partitions, its store.
pub struct CoordinatorBuilder {
    store: Arc<dyn LeaseStore>,
    name: Option<String>,
    address: String,
    roles: Vec<RoleSpec>,
    partitions: Vec<PartitionSpec>,
    hook: Option<IntervalHook>,
}

impl CoordinatorBuilder {
    pub fn new(store: Arc<dyn LeaseStore>) -> Self {
        Self {
            store,
            name: None,
            address: String::new(),
            roles: Vec::new(),
            partitions: Vec::new(),
            hook: None,
        }
    }

    /// Roles and partitions of a config (its instance name too).
    pub fn from_config(config: &crate::config::Config, store: Arc<dyn LeaseStore>) -> Self {
        let mut b = Self::new(store);
        b.name = config.instance.name.clone();
        b.roles = config.role_specs();
        b.partitions = config.partition_specs();
        b
    }

    /// The instance name; a random suffix is always added. Default: hostname.
    pub fn instance_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The base URL other instances forward to.
    pub fn advertise(mut self, address: impl Into<String>) -> Self {
        self.address = address.into();
        self
    }

    pub fn role(mut self, name: impl Into<String>, timings: LeaseTimings) -> Self {
        self.roles.push(RoleSpec {
            name: name.into(),
            timings,
        });
        self
    }

    pub fn partition(mut self, name: impl Into<String>, count: u32, timings: LeaseTimings) -> Self {
        self.partitions.push(PartitionSpec {
            name: name.into(),
            count,
            timings,
        });
        self
    }

    /// Called at the start and end of every held interval (event logs, tests).
    /// Runs on the heartbeat loop: keep it quick.
    pub fn on_lease_event(mut self, hook: impl Fn(LeaseEvent) + Send + Sync + 'static) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// Validates the registrations and starts the heartbeat loop on the
    /// current tokio runtime. Store problems do not fail this: the loop keeps
    /// retrying and the snapshot reports them.
    pub fn start(self) -> Result<Coordinator, CoordinatorError> {
        let mut roles = Vec::new();
        let mut index = HashMap::new();
        let mut partitions = HashMap::new();
        let mut push = |name: String, timings: LeaseTimings, roles: &mut Vec<RoleMeta>| {
            validate_role_name(&name)?;
            timings
                .check()
                .map_err(|message| CoordinatorError::Timings {
                    role: name.clone(),
                    message,
                })?;
            let name: Arc<str> = name.into();
            if index.insert(name.clone(), roles.len()).is_some() {
                return Err(CoordinatorError::DuplicateRole(name.to_string()));
            }
            roles.push(RoleMeta { name, timings });
            Ok(())
        };
        for r in self.roles {
            push(r.name, r.timings, &mut roles)?;
        }
        for p in self.partitions {
            if p.count == 0 || p.count > 65_536 {
                return Err(CoordinatorError::PartitionCount(p.name, p.count));
            }
            let first = roles.len();
            for i in 0..p.count {
                push(partition_role_name(&p.name, i), p.timings, &mut roles)?;
            }
            if partitions
                .insert(
                    p.name.clone(),
                    PartitionMeta {
                        count: p.count,
                        first,
                    },
                )
                .is_some()
            {
                return Err(CoordinatorError::DuplicateRole(p.name));
            }
        }
        if roles.is_empty() {
            return Err(CoordinatorError::Empty);
        }
        let id = crate::identity::instance_id(self.name.as_deref());
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
        let now = Instant::now();
        let initial = HolderSnapshot {
            roles: roles
                .iter()
                .map(|r| RoleState {
                    name: r.name.clone(),
                    ..RoleState::default()
                })
                .collect(),
            published_at: now,
            loaded: false,
            store_ok: false,
            last_ok_sent: None,
            candidate: true,
            draining: false,
        };
        let shared = Arc::new(Shared {
            instance_id: id.clone().into(),
            instance: InstanceInfo {
                id,
                address: self.address,
            },
            store: self.store,
            names: roles.iter().map(|r| r.name.to_string()).collect(),
            roles,
            index,
            partitions,
            snapshot: ArcSwap::from_pointee(initial),
            draining: AtomicBool::new(false),
            candidate: AtomicBool::new(true),
            stopping: AtomicBool::new(false),
            wake: Notify::new(),
            published: watch::channel(0).0,
            counters: Counters::default(),
            hook: self.hook,
            task: Mutex::new(None),
            tick_every,
            op_timeout,
        });
        let task = tokio::spawn(super::heartbeat::HeartbeatLoop::new(shared.clone()).run());
        *lock(&shared.task) = Some(task);
        Ok(Coordinator { shared })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Handle to the process's lease coordinator. Cheap to clone.
#[derive(Clone)]
pub struct Coordinator {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("instance", &self.shared.instance.id)
            .field("roles", &self.shared.roles.len())
            .finish()
    }
}

impl Coordinator {
    pub fn instance_id(&self) -> &str {
        &self.shared.instance.id
    }

    pub fn advertise_address(&self) -> &str {
        &self.shared.instance.address
    }

    pub fn store_kind(&self) -> &'static str {
        self.shared.store.kind()
    }

    /// The latest published snapshot (lock-free).
    pub fn snapshot(&self) -> Arc<HolderSnapshot> {
        self.shared.snapshot.load_full()
    }

    /// A handle for one role, or `None` if it is not registered.
    pub fn role(&self, name: &str) -> Option<RoleLease> {
        let idx = *self.shared.index.get(name)?;
        Some(RoleLease {
            shared: self.shared.clone(),
            idx,
        })
    }

    /// A handle for one partition, or `None` if it is not registered.
    pub fn partition(&self, name: &str) -> Option<RolePartition> {
        let meta = self.shared.partitions.get(name)?;
        Some(RolePartition {
            shared: self.shared.clone(),
            name: name.into(),
            count: meta.count,
            first: meta.first,
        })
    }

    /// Every registered role name, partition roles included, in order.
    pub fn role_names(&self) -> &[String] {
        &self.shared.names
    }

    /// True once a snapshot from the store is published and the last store
    /// round trip that succeeded was sent less than `duration - safety_margin`
    /// ago (the shortest among the roles): readiness ends no later than the
    /// first held role fails closed.
    pub fn is_ready(&self) -> bool {
        self.readiness().is_ok()
    }

    /// Why this instance is not ready, judged now.
    pub fn readiness(&self) -> Result<(), NotReady> {
        let s = self.shared.snapshot.load();
        if !s.loaded {
            return Err(NotReady::NoSnapshot);
        }
        let window = self.shared.op_timeout;
        match s.last_ok_sent {
            Some(t) if t.elapsed() < window => Ok(()),
            Some(t) => Err(NotReady::StoreStale {
                since: t.elapsed(),
                window,
            }),
            None => Err(NotReady::NoSnapshot),
        }
    }

    /// Resolves when a snapshot newer than the current one is published.
    pub fn subscribe_published(&self) -> watch::Receiver<u64> {
        self.shared.published.subscribe()
    }

    pub fn stats(&self) -> CoordinatorStats {
        let c = &self.shared.counters;
        CoordinatorStats {
            ticks: c.ticks.load(Ordering::Relaxed),
            claim_calls: c.claim_calls.load(Ordering::Relaxed),
            snapshot_calls: c.snapshot_calls.load(Ordering::Relaxed),
            release_calls: c.release_calls.load(Ordering::Relaxed),
            store_errors: c.store_errors.load(Ordering::Relaxed),
            late_responses: c.late_responses.load(Ordering::Relaxed),
            term_changes: c.term_changes.load(Ordering::Relaxed),
            max_calls_per_tick: c.max_calls_per_tick.load(Ordering::Relaxed),
        }
    }

    /// Whether this instance contends for roles.
    pub fn is_candidate(&self) -> bool {
        self.shared.candidate.load(Ordering::Acquire)
    }

    /// Stop (false) or resume (true) contending. Stopping releases held roles
    /// at once so a healthy instance takes over.
    pub fn set_candidate(&self, candidate: bool) {
        if self.shared.candidate.swap(candidate, Ordering::AcqRel) != candidate {
            self.shared.wake.notify_one();
        }
    }

    /// Stops admitting new local work: `is_held` answers false from now on,
    /// while the loop keeps renewing so in-flight work stays covered.
    pub fn begin_drain(&self) {
        self.shared.draining.store(true, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.shared.draining.load(Ordering::Acquire)
    }

    /// Graceful stop: ends local belief, releases every held role in one store
    /// call (so a waiting instance takes over at once), and stops the loop.
    pub async fn shutdown(&self) {
        self.begin_drain();
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.wake.notify_one();
        let task = lock(&self.shared.task).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// Stops the loop without releasing anything, as a crash would. Local
    /// belief still ends at each term's deadline.
    pub fn abort(&self) {
        if let Some(task) = lock(&self.shared.task).take() {
            task.abort();
        }
    }

    /// One-shot lease for bootstrap-style jobs: a single claim of `role` for
    /// `ttl`, outside the heartbeat loop; not renewed. The returned lease is
    /// trusted until `valid_until` (80% of `ttl` after the request was sent).
    /// Roles registered with the heartbeat loop are refused: use `role()`.
    pub async fn try_acquire(
        &self,
        role: &str,
        ttl: Duration,
    ) -> Result<Option<OneShotLease>, CoordinatorError> {
        validate_role_name(role)?;
        if self.shared.index.contains_key(role) {
            return Err(CoordinatorError::DuplicateRole(role.to_string()));
        }
        let ttl = ttl.clamp(Duration::from_millis(10), MAX_DURATION);
        let store = &self.shared.store;
        let limit = ttl / 2;
        let timed_out =
            || CoordinatorError::Store(StoreError::Unavailable("one-shot claim timed out".into()));
        tokio::time::timeout(limit, store.register(&[role.to_string()]))
            .await
            .map_err(|_| timed_out())??;
        let t_sent = Instant::now();
        let claims = [Claim {
            role: role.to_string(),
            held_token: None,
            duration: ttl,
        }];
        let grants = tokio::time::timeout(limit, store.claim(&self.shared.instance, &claims))
            .await
            .map_err(|_| timed_out())??;
        Ok(grants.into_iter().next().and_then(|g| {
            let valid_until = t_sent + ttl.mul_f64(0.8);
            (Instant::now() < valid_until).then(|| OneShotLease {
                lease: HeldLease {
                    role: role.into(),
                    token: g.token,
                    checked_at: Instant::now(),
                },
                valid_until,
            })
        }))
    }

    /// Releases a one-shot lease.
    pub async fn release(&self, lease: OneShotLease) -> Result<bool, CoordinatorError> {
        let released = self
            .shared
            .store
            .release(
                &self.shared.instance,
                &[(lease.lease.role.to_string(), lease.lease.token)],
            )
            .await?;
        Ok(!released.is_empty())
    }
}

/// A lease taken by [`Coordinator::try_acquire`].
#[derive(Debug, Clone)]
pub struct OneShotLease {
    pub lease: HeldLease,
    pub valid_until: Instant,
}

impl OneShotLease {
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }
}

/// Who holds a role, as this instance last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderInfo {
    pub id: Arc<str>,
    pub address: Arc<str>,
    pub token: u64,
    pub here: bool,
}

/// A registered role.
#[derive(Clone)]
pub struct RoleLease {
    shared: Arc<Shared>,
    idx: usize,
}

impl RoleLease {
    pub fn name(&self) -> &Arc<str> {
        &self.shared.roles[self.idx].name
    }

    /// True while this instance holds the role and is not draining.
    pub fn is_held(&self) -> bool {
        self.guard().is_some()
    }

    /// The held lease with its fencing token, if held here right now.
    pub fn guard(&self) -> Option<HeldLease> {
        if self.shared.draining.load(Ordering::Acquire) {
            return None;
        }
        // The guard is held while checking: a term that ends is only recorded
        // as ended once no reader still looks at the snapshot showing it.
        let snap = self.shared.snapshot.load();
        let state = &snap.roles[self.idx];
        let now = Instant::now();
        state.held_now(now).then(|| HeldLease {
            role: state.name.clone(),
            token: state.token,
            checked_at: now,
        })
    }

    /// The current holder if known and unexpired (this instance included).
    pub fn current_holder(&self) -> Option<HolderInfo> {
        let snap = self.shared.snapshot.load();
        holder_of(&self.shared, &snap.roles[self.idx])
    }
}

fn holder_of(shared: &Shared, state: &RoleState) -> Option<HolderInfo> {
    let now = Instant::now();
    if state.held_now(now) {
        return Some(HolderInfo {
            id: shared.instance_id.clone(),
            address: shared.instance.address.as_str().into(),
            token: state.token,
            here: true,
        });
    }
    // A live record naming this instance without a local term (abandoned,
    // late) is reported as here, so callers never forward to themselves.
    state.live_holder(now).map(|(id, address)| HolderInfo {
        id: id.clone(),
        address: address.clone(),
        token: state.token,
        here: **id == *shared.instance_id,
    })
}

/// A registered partition: `count` roles, a key picks one.
#[derive(Clone)]
pub struct RolePartition {
    shared: Arc<Shared>,
    name: Arc<str>,
    count: u32,
    first: usize,
}

impl RolePartition {
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// Where an unscoped key lives now. No I/O.
    pub fn resolve(&self, key: &str) -> PartitionResolution {
        self.resolve_index(partition_index(None, key, self.count))
    }

    /// Where a scoped key (`scope ++ 0x00 ++ key`) lives now. No I/O.
    pub fn resolve_scoped(&self, scope: &str, key: &str) -> PartitionResolution {
        self.resolve_index(partition_index(Some(scope), key, self.count))
    }

    pub fn resolve_index(&self, index: u32) -> PartitionResolution {
        let idx = self.first + index.min(self.count - 1) as usize;
        let snap = self.shared.snapshot.load();
        let state = &snap.roles[idx];
        let draining = self.shared.draining.load(Ordering::Acquire);
        let now = Instant::now();
        let held = !draining && state.held_now(now);
        let holder = holder_of(&self.shared, state);
        PartitionResolution {
            role: state.name.clone(),
            index,
            held,
            token: held.then_some(state.token),
            holder_address: holder.filter(|h| held || !h.here).map(|h| h.address),
            checked_at: now,
        }
    }

    /// The role handle of partition `index`.
    pub fn role(&self, index: u32) -> Option<RoleLease> {
        (index < self.count).then(|| RoleLease {
            shared: self.shared.clone(),
            idx: self.first + index as usize,
        })
    }
}

// ---------------------------------------------------------------------------
