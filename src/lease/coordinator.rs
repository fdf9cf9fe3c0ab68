//! The lease coordinator's handles: the builder that registers roles and
//! partitions and starts the heartbeat loop (`heartbeat.rs`), and the
//! lock-free readers of the snapshot it publishes (`RoleLease`,
//! `RolePartition`, `Coordinator::snapshot`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::handles::{Keepalive, RoleLease, RolePartition};
use super::heartbeat::HeartbeatLoop;
use super::snapshot::HolderSnapshot;
use super::state::{IntervalHook, LeaseState, PartitionMeta, Registry, RoleMeta};
use super::timings::{TimingsError, MAX_DURATION};
use super::{HeldLease, LeaseEvent, LeaseTimings, PartitionSpec, RoleSpec};
use crate::role::{RoleName, RoleNameError, MAX_PARTITION_COUNT};
use crate::store::{Claim, InstanceInfo, LeaseStore, StoreError};

/// Why a coordinator could not start, or a one-shot lease failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoordinatorError {
    /// A role or partition name breaks the naming rule.
    #[error(transparent)]
    RoleName(#[from] RoleNameError),
    /// The same role (or partition) was registered twice.
    #[error("role `{0}` is registered twice")]
    DuplicateRole(String),
    /// `partition_scopes` named a partition that was not registered.
    #[error("partition_scopes names `{0}`, which is not a registered partition")]
    UnknownPartition(String),
    /// A partition count outside 1..=65536.
    #[error("partition `{0}` has count {1}; it must be between 1 and 65536")]
    PartitionCount(String, u32),
    /// A role's timings break the timing rule.
    #[error("role `{role}`: {source}")]
    Timings {
        /// The role.
        role: String,
        /// The broken rule.
        #[source]
        source: TimingsError,
    },
    /// Nothing was registered.
    #[error("no roles or partitions registered")]
    Empty,
    /// The store failed (one-shot leases only; the loop retries on its own).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Counters of store work, for tests, metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CoordinatorStats {
    /// Heartbeat ticks run.
    pub ticks: u64,
    /// Batched claim calls made.
    pub claim_calls: u64,
    /// Reads of the lease records made (full reads and reads of changes).
    pub snapshot_calls: u64,
    /// Of those, full reads of every role.
    pub full_reads: u64,
    /// Lease records those reads returned.
    pub rows_read: u64,
    /// Batched release calls made.
    pub release_calls: u64,
    /// Store calls that failed or timed out.
    pub store_errors: u64,
    /// Claim answers that came back too late to trust.
    pub late_responses: u64,
    /// New terms this instance began.
    pub term_changes: u64,
    /// Most store calls made by one tick, after the first (registration) tick.
    pub max_calls_per_tick: u64,
}

/// Why [`Coordinator::readiness`] says no.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotReady {
    /// The store has not answered since start.
    #[error("no snapshot from the lease store yet")]
    NoSnapshot,
    /// The last successful store round trip is too old to trust any lease.
    #[error("the last successful lease store round trip was {since:.1?} ago (limit {window:?}, duration - safety_margin)")]
    StoreStale {
        /// Time since that round trip was sent.
        since: Duration,
        /// The trust window it is judged against.
        window: Duration,
    },
}

/// Default of [`CoordinatorBuilder::drain_timeout`] (the gateway's `shutdown.drain_timeout`).
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds a [`Coordinator`]: who this instance is, its roles and partitions, its store.
pub struct CoordinatorBuilder {
    store: Arc<dyn LeaseStore>,
    name: Option<String>,
    address: String,
    roles: Vec<(String, LeaseTimings)>,
    partitions: Vec<PartitionReg>,
    hook: Option<IntervalHook>,
    drain_timeout: Duration,
    routes: String,
    /// Declared scopes per partition, applied by `start`.
    scopes: Vec<(String, Vec<Option<String>>)>,
    per_role_metrics: Option<bool>,
}

impl CoordinatorBuilder {
    /// A builder for an instance using `store`, with no roles yet.
    pub fn new(store: Arc<dyn LeaseStore>) -> Self {
        Self {
            store,
            name: None,
            address: String::new(),
            roles: Vec::new(),
            partitions: Vec::new(),
            hook: None,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            per_role_metrics: None,
            routes: String::new(),
            scopes: Vec::new(),
        }
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

    /// Registers a role; its name is checked by [`start`](Self::start).
    pub fn role(mut self, name: impl Into<String>, timings: LeaseTimings) -> Self {
        self.roles.push((name.into(), timings));
        self
    }

    /// Registers a partition of `count` roles named `{name}:partition-{i}`,
    /// balanced over the live candidates with the default rebalance delay
    /// (2 × `renew_interval`).
    pub fn partition(mut self, name: impl Into<String>, count: u32, timings: LeaseTimings) -> Self {
        let delay = timings.renew_interval * 2;
        self.partitions
            .push((name.into(), count, timings, Some(delay), None, Vec::new()));
        self
    }

    /// The scopes a registered partition's keys are hashed with (`None`:
    /// unscoped), part of the definition the store records and every
    /// instance must agree on. Default: none declared. A gateway declares
    /// the scopes of its routes; an app sharing the partition with gateways
    /// declares the same.
    /// [`start`](Self::start) refuses a partition name not registered by
    /// then.
    pub fn partition_scopes(mut self, partition: &str, scopes: Vec<Option<String>>) -> Self {
        self.scopes.push((partition.to_string(), scopes));
        self
    }

    /// The fingerprint of this instance's route table, published with its
    /// presence record so members can see that they route alike (see
    /// `Config::routes_fingerprint`). Default: none.
    pub fn routes_fingerprint(mut self, fingerprint: impl Into<String>) -> Self {
        self.routes = fingerprint.into();
        self
    }

    /// How long a balance move of a registered partition's role waits for
    /// the local work running under it before ending that work and releasing
    /// the role. Default: the partition's renew interval.
    pub fn handover_drain(mut self, partition: &str, drain: Duration) -> Self {
        for p in self.partitions.iter_mut().filter(|p| p.0 == partition) {
            p.4 = Some(drain);
        }
        self
    }

    /// Metrics for each role of a partition (`rolegate_lease_held`, the
    /// `role` label of the counters) instead of one series per partition,
    /// which is the default. Process-wide, as the `metrics` recorder is:
    /// the last coordinator started with it set decides.
    pub fn per_role_metrics(mut self, on: bool) -> Self {
        self.per_role_metrics = Some(on);
        self
    }

    /// How long [`Coordinator::shutdown`] waits for local work before ending
    /// it and releasing every role. Default 10 s.
    pub fn drain_timeout(mut self, drain: Duration) -> Self {
        self.drain_timeout = drain;
        self
    }

    /// Sets how a registered partition is balanced: `Some(rebalance_delay)`,
    /// or `None` to leave its roles where they fall.
    pub fn balance(mut self, partition: &str, balance: Option<Duration>) -> Self {
        for p in self.partitions.iter_mut().filter(|p| p.0 == partition) {
            p.3 = balance;
        }
        self
    }

    /// Registers every role and partition of a spec list (what
    /// `Config::coordinator` passes).
    pub fn specs(mut self, roles: &[RoleSpec], partitions: &[PartitionSpec]) -> Self {
        for r in roles {
            self = self.role(r.name.as_str(), r.timings);
        }
        for p in partitions {
            self = self
                .partition(p.name.as_str(), p.count, p.timings)
                .balance(p.name.as_str(), p.balance);
            if let Some(drain) = p.handover_drain {
                self = self.handover_drain(p.name.as_str(), drain);
            }
            self = self.partition_scopes(p.name.as_str(), p.scopes.clone());
        }
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
    pub fn start(mut self) -> Result<Coordinator, CoordinatorError> {
        if let Some(on) = self.per_role_metrics {
            crate::telemetry::set_per_role_metrics(on);
        }
        for (name, scopes) in std::mem::take(&mut self.scopes) {
            let Some(p) = self.partitions.iter_mut().find(|p| p.0 == name) else {
                return Err(CoordinatorError::UnknownPartition(name));
            };
            p.5 = scopes;
        }
        let registry = register(self.roles, self.partitions)?;
        let id = crate::identity::instance_id(self.name.as_deref());
        let instance = InstanceInfo {
            id,
            address: self.address,
        };
        let routes = Arc::from(self.routes.as_str());
        let shared = Arc::new(LeaseState::new(
            instance, self.store, registry, self.hook, routes,
        ));
        shared.set_task(tokio::spawn(HeartbeatLoop::new(shared.clone()).run()));
        Ok(Coordinator {
            keep: Arc::new(Keepalive(shared.clone())),
            shared,
            drain_timeout: self.drain_timeout,
        })
    }
}

/// A partition as registered: name, count, timings, balance, handover
/// drain, scopes.
type PartitionReg = (
    String,
    u32,
    LeaseTimings,
    Option<Duration>,
    Option<Duration>,
    Vec<Option<String>>,
);

/// Checks every name, timing and count once, and lays the roles out in
/// order: declared roles first, then each partition's roles in a block.
fn register(
    roles: Vec<(String, LeaseTimings)>,
    partitions: Vec<PartitionReg>,
) -> Result<Registry, CoordinatorError> {
    let mut registry = Registry {
        roles: Vec::new(),
        index: HashMap::new(),
        partitions: HashMap::new(),
    };
    let push = |name: RoleName, timings: LeaseTimings, registry: &mut Registry| {
        timings
            .check()
            .map_err(|source| CoordinatorError::Timings {
                role: name.to_string(),
                source,
            })?;
        if registry
            .index
            .insert(name.as_arc().clone(), registry.roles.len())
            .is_some()
        {
            return Err(CoordinatorError::DuplicateRole(name.to_string()));
        }
        registry.roles.push(RoleMeta { name, timings });
        Ok(())
    };
    for (name, timings) in roles {
        push(RoleName::new(&name)?, timings, &mut registry)?;
    }
    for (name, count, timings, balance, handover_drain, scopes) in partitions {
        RoleName::new(&name)?;
        if count == 0 || count > MAX_PARTITION_COUNT {
            return Err(CoordinatorError::PartitionCount(name, count));
        }
        let first = registry.roles.len();
        for i in 0..count {
            push(RoleName::partition(&name, i)?, timings, &mut registry)?;
        }
        let meta = PartitionMeta {
            definition: super::definition_text(count, &scopes).into(),
            scopes: scopes.into(),
            count,
            first,
            balance,
            handover_drain: handover_drain.unwrap_or(timings.renew_interval),
        };
        if registry.partitions.insert(name.clone(), meta).is_some() {
            return Err(CoordinatorError::DuplicateRole(name));
        }
    }
    if registry.roles.is_empty() {
        return Err(CoordinatorError::Empty);
    }
    Ok(registry)
}

/// Handle to the process's lease coordinator. Cheap to clone.
///
/// The loop runs while any handle lives (this one, a clone, a [`RoleLease`]
/// or a [`RolePartition`]). When the last one is dropped without
/// [`shutdown`](Self::shutdown), the coordinator stops admitting work at
/// once and releases its roles in one store call in the background, bounded
/// by the store timeout, with one WARN naming them; if the runtime is
/// shutting down and the release cannot run, the roles expire as after a
/// crash.
#[derive(Clone)]
pub struct Coordinator {
    shared: Arc<LeaseState>,
    keep: Arc<Keepalive>,
    drain_timeout: Duration,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("instance", &self.shared.instance().id)
            .field("roles", &self.shared.role_count())
            .finish()
    }
}

impl Coordinator {
    /// This instance's id (name plus a random suffix).
    pub fn instance_id(&self) -> &str {
        &self.shared.instance().id
    }

    /// The base URL other instances forward to.
    pub fn advertise_address(&self) -> &str {
        &self.shared.instance().address
    }

    /// The store backend's name (`postgres`, `sqlite`, ...).
    pub fn store_kind(&self) -> &'static str {
        self.shared.store().kind()
    }

    /// What this instance publishes with its presence record: the route
    /// fingerprint it was given and its partition definitions, as JSON
    /// (empty when it has neither). Compare with
    /// [`route_differences`](crate::lease::route_differences).
    pub fn routes_fingerprint(&self) -> &str {
        self.shared.routes()
    }

    /// The latest published snapshot (lock-free).
    pub fn snapshot(&self) -> Arc<HolderSnapshot> {
        self.shared.snapshot_full()
    }

    /// A handle for one role, or `None` if it is not registered.
    pub fn role(&self, name: &str) -> Option<RoleLease> {
        let idx = self.shared.index_of(name)?;
        Some(RoleLease {
            shared: self.shared.clone(),
            idx,
            _keep: self.keep.clone(),
        })
    }

    /// A handle for one partition, or `None` if it is not registered.
    pub fn partition(&self, name: &str) -> Option<RolePartition> {
        let meta = self.shared.partition(name)?;
        Some(RolePartition {
            shared: self.shared.clone(),
            name: name.into(),
            count: meta.count,
            first: meta.first,
            keep: self.keep.clone(),
        })
    }

    /// Every registered partition, in registration order.
    pub fn partitions(&self) -> Vec<RolePartition> {
        let mut names: Vec<(usize, &String)> = self
            .shared
            .partitions()
            .map(|(name, meta)| (meta.first, name))
            .collect();
        names.sort();
        names
            .into_iter()
            .filter_map(|(_, name)| self.partition(name))
            .collect()
    }

    #[cfg(feature = "gateway")]
    /// Notes a store failure seen outside the coordinator (the gateway's
    /// first call at start), said in answers until the store is read.
    pub(crate) fn note_store_error(&self, error: &str) {
        self.shared
            .set_store_error(&crate::redact::redact_text(error), false);
    }

    /// Every registered role name, partition roles included, in order.
    pub fn role_names(&self) -> &[RoleName] {
        self.shared.names()
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
        let s = self.shared.snapshot();
        if !s.loaded {
            return Err(NotReady::NoSnapshot);
        }
        let window = self.shared.op_timeout();
        match s.last_ok_sent {
            Some(t) if t.elapsed() < window => Ok(()),
            Some(t) => Err(NotReady::StoreStale {
                since: t.elapsed(),
                window,
            }),
            None => Err(NotReady::NoSnapshot),
        }
    }

    /// Waits until the coordinator is ready (see [`readiness`](Self::readiness)):
    /// its first tick has read the store and claimed what was free, so
    /// `guard()` answers from a real snapshot. Gives up after `limit` and
    /// says why. Call it after [`CoordinatorBuilder::start`] before acting.
    pub async fn ready(&self, limit: Duration) -> Result<(), NotReady> {
        let mut published = self.subscribe_published();
        let deadline = super::deadline_after(limit);
        loop {
            if self.readiness().is_ok() {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, published.changed()).await {
                Ok(Ok(())) => {}
                // Timed out, or the loop is gone (aborted): judge once more.
                _ => return self.readiness(),
            }
        }
    }

    /// Resolves when a snapshot newer than the current one is published.
    pub fn subscribe_published(&self) -> watch::Receiver<u64> {
        self.shared.subscribe_published()
    }

    /// Counters of store work since start.
    pub fn stats(&self) -> CoordinatorStats {
        let c = &self.shared.counters();
        CoordinatorStats {
            ticks: c.ticks.load(Ordering::Relaxed),
            claim_calls: c.claim_calls.load(Ordering::Relaxed),
            snapshot_calls: c.snapshot_calls.load(Ordering::Relaxed),
            full_reads: c.full_reads.load(Ordering::Relaxed),
            rows_read: c.rows_read.load(Ordering::Relaxed),
            release_calls: c.release_calls.load(Ordering::Relaxed),
            store_errors: c.store_errors.load(Ordering::Relaxed),
            late_responses: c.late_responses.load(Ordering::Relaxed),
            term_changes: c.term_changes.load(Ordering::Relaxed),
            max_calls_per_tick: c.max_calls_per_tick.load(Ordering::Relaxed),
        }
    }

    /// Whether this instance contends for roles.
    pub fn is_candidate(&self) -> bool {
        self.shared.is_candidate()
    }

    /// Stop (false) or resume (true) contending. Stopping releases held roles
    /// at once so a healthy instance takes over.
    pub fn set_candidate(&self, candidate: bool) {
        self.shared.set_candidate(candidate, None);
    }

    /// Stops contending, like `set_candidate(false)`, and records why: the
    /// reason shows on `/leases`, the status page, and in the 503 a request
    /// for a role with no holder gets from this instance.
    pub fn withdraw(&self, reason: impl Into<String>) {
        let reason: String = reason.into();
        self.shared.set_candidate(false, Some(reason.into()));
    }

    /// Why this instance does not contend for roles, if it was withdrawn
    /// with a reason ([`withdraw`](Self::withdraw)).
    pub fn withdrawal(&self) -> Option<Arc<str>> {
        self.shared.withdrawal()
    }

    /// Stops admitting new local work: `is_held` answers false from now on,
    /// while the loop keeps renewing so in-flight work stays covered.
    pub fn begin_drain(&self) {
        self.shared.begin_drain();
    }

    /// Whether draining began (no new local work is admitted).
    pub fn is_draining(&self) -> bool {
        self.shared.is_draining()
    }

    /// Graceful stop: admits no new local work and tells the work running
    /// that its term is ending; waits for it up to the drain bound
    /// ([`CoordinatorBuilder::drain_timeout`], default 10 s); ends what is
    /// left; then ends local belief, releases every held role in one store
    /// call (so a waiting instance takes over at once), and stops the loop.
    pub async fn shutdown(&self) {
        self.begin_drain();
        let all: Vec<usize> = (0..self.shared.role_count()).collect();
        self.shared.wait_idle(&all, self.drain_timeout).await;
        self.shutdown_now().await;
    }

    /// [`shutdown`](Self::shutdown) without waiting for local work: for
    /// callers that drained it themselves. Work still running is ended
    /// (told its term is over) before the roles are released.
    pub async fn shutdown_now(&self) {
        self.begin_drain();
        self.shared.request_stop();
        let task = self.shared.take_task();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    #[cfg(feature = "gateway")]
    /// Waits until no local work runs under any role, or `limit` passes;
    /// true when none runs.
    pub(crate) async fn wait_local_idle(&self, limit: Duration) -> bool {
        let all: Vec<usize> = (0..self.shared.role_count()).collect();
        self.shared.wait_idle(&all, limit).await
    }

    #[cfg(feature = "gateway")]
    /// After [`withdraw`](Self::withdraw): waits until this instance holds
    /// no role any more (the loop released them), or `limit` passes.
    pub(crate) async fn wait_released(&self, limit: Duration) {
        let mut published = self.shared.subscribe_published();
        let deadline = super::deadline_after(limit);
        loop {
            published.borrow_and_update();
            let held = {
                let snap = self.shared.snapshot();
                let now = Instant::now();
                snap.roles.iter().any(|r| r.held_now(now))
            };
            if !held {
                return;
            }
            if tokio::time::timeout_at(deadline, published.changed())
                .await
                .is_err()
            {
                return;
            }
        }
    }

    #[cfg(feature = "gateway")]
    /// Ends the local work still running under any held role (streams are
    /// cut, tunnels closed) and waits briefly for it to stop; for a stop
    /// whose drain bound passed, before connections are closed.
    pub(crate) async fn end_local_work(&self) {
        let all: Vec<usize> = (0..self.shared.role_count()).collect();
        for &i in &all {
            self.shared
                .terms()
                .end_current(i, crate::lease::TermEndReason::Stop);
        }
        self.shared.wait_idle(&all, Duration::from_secs(1)).await;
    }

    /// Stops the loop without releasing anything, as a crash would. Local
    /// belief still ends at each term's deadline.
    pub fn abort(&self) {
        if let Some(task) = self.shared.take_task() {
            task.abort();
        }
    }

    /// One-shot lease for bootstrap-style jobs: a single claim of `role` for
    /// `ttl`, outside the heartbeat loop; not renewed. It is granted only when
    /// the role is free, released or expired in the store, so of several
    /// calls (from other instances, or from tasks of this one) while a lease
    /// is valid exactly one gets it; the others get `None`. The returned
    /// lease is trusted until `valid_until` (80% of `ttl` after the request
    /// was sent); fence the job's writes with its token. Roles registered
    /// with the heartbeat loop are refused: use `role()`.
    pub async fn try_acquire(
        &self,
        role: &str,
        ttl: Duration,
    ) -> Result<Option<OneShotLease>, CoordinatorError> {
        let name = RoleName::new(role)?;
        if self.shared.index_of(role).is_some() {
            return Err(CoordinatorError::DuplicateRole(role.to_string()));
        }
        let ttl = ttl.clamp(Duration::from_millis(10), MAX_DURATION);
        let store = &self.shared.store();
        let limit = ttl / 2;
        let timed_out = || CoordinatorError::Store(StoreError::timeout("one-shot claim", limit));
        tokio::time::timeout(limit, store.register(std::slice::from_ref(&name)))
            .await
            .map_err(|_| timed_out())??;
        let t_sent = Instant::now();
        // One-shot: never renews, so a second call of this same instance
        // while the lease is valid is refused like anyone else's.
        let claims = [Claim::one_shot(name, ttl)];
        let grants = tokio::time::timeout(limit, store.claim(self.shared.instance(), &claims))
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

    /// Releases a one-shot lease: exactly the term its token names (a lease
    /// that expired and was granted again is not touched). True when it was
    /// still held.
    pub async fn release(&self, lease: OneShotLease) -> Result<bool, CoordinatorError> {
        let released = self
            .shared
            .store()
            .release(
                self.shared.instance(),
                &[(RoleName::new(&lease.lease.role)?, lease.lease.token)],
            )
            .await?;
        Ok(!released.is_empty())
    }
}

/// A lease taken by [`Coordinator::try_acquire`].
#[derive(Debug, Clone)]
pub struct OneShotLease {
    /// The lease, with its fencing token.
    pub lease: HeldLease,
    /// Trust it until then (monotonic clock); it is not renewed.
    pub valid_until: Instant,
}

impl OneShotLease {
    /// Whether the lease may still be trusted now.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }
}
