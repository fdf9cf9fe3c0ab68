//! The reader handles of one role (`RoleLease`) and one partition
//! (`RolePartition`): lock-free reads of the published snapshot, judged at
//! the moment of the call.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use super::partition::{partition_index, PartitionResolution};
use super::snapshot::RoleState;
use super::state::LeaseState;
use super::term::{TermEndReason, TermSignals};
use super::HeldLease;

/// Who holds a role, as this instance last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The holder's instance id.
    pub id: Arc<str>,
    /// The holder's advertise address.
    pub address: Arc<str>,
    /// The term's fencing token.
    pub token: u64,
    /// True when the holder is this instance.
    pub here: bool,
}

/// Local work running under a role, counted until dropped (see
/// [`RoleLease::begin_local`]).
///
/// The work must not outlive the term it was admitted under. A graceful end
/// of the term (a balance move, a stop) first tells it the term is
/// [`ending`](Self::ending), waits for it to drop up to the drain bound, then
/// declares the term [`over`](Self::over) and releases the role; a fail-close
/// makes it over at the trust deadline. Stop producing anything for the role
/// once `over` resolves: from then on another instance may hold it.
pub struct LocalWork {
    watch: TermWatch,
}

impl std::fmt::Debug for LocalWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalWork")
            .field("watch", &self.watch)
            .finish()
    }
}

impl LocalWork {
    /// What this work learns of its term's end (cheap to clone).
    pub fn watch(&self) -> &TermWatch {
        &self.watch
    }

    /// Resolves when the term is ending (a handover or a stop began) or over.
    pub fn ending(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.watch.ending()
    }

    /// Resolves when the term is over: stop now.
    pub fn over(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.watch.over()
    }

    /// True once the term is over.
    pub fn is_over(&self) -> bool {
        self.watch.is_over()
    }
}

impl Drop for LocalWork {
    fn drop(&mut self) {
        self.watch.leave_local();
    }
}

fn begin_local(
    shared: &Arc<LeaseState>,
    idx: usize,
    guard: impl FnOnce() -> Option<HeldLease>,
) -> Option<(HeldLease, LocalWork)> {
    if !shared.enter_local(idx) {
        return None;
    }
    let Some(lease) = guard() else {
        shared.leave_local(idx);
        return None;
    };
    let watch = TermWatch::new(shared.clone(), idx, lease.token);
    Some((lease, LocalWork { watch }))
}

/// A registered role.
#[derive(Clone)]
pub struct RoleLease {
    pub(super) shared: Arc<LeaseState>,
    pub(super) idx: usize,
    /// Keeps the coordinator's loop running while this handle lives.
    pub(super) _keep: Arc<Keepalive>,
}

impl RoleLease {
    /// The role's name.
    pub fn name(&self) -> &Arc<str> {
        self.shared.role(self.idx).name.as_arc()
    }

    /// True while this instance holds the role and is not draining.
    pub fn is_held(&self) -> bool {
        self.guard().is_some()
    }

    /// The held lease with its fencing token, if held here right now.
    pub fn guard(&self) -> Option<HeldLease> {
        if self.shared.is_draining() || self.shared.is_handing_over(self.idx) {
            return None;
        }
        // The guard is held while checking: a term that ends is only recorded
        // as ended once no reader still looks at the snapshot showing it.
        let snap = self.shared.snapshot();
        let state = &snap.roles[self.idx];
        let now = Instant::now();
        state.held_now(now).then(|| HeldLease {
            role: state.name.clone(),
            token: state.token,
            checked_at: now,
        })
    }

    /// Like [`guard`](Self::guard), and counts the work as running until the
    /// returned [`LocalWork`] drops: a graceful handover of the role (partition
    /// balancing) waits for it before releasing. The gateway and the layers
    /// admit every local request this way.
    pub fn begin_local(&self) -> Option<(HeldLease, LocalWork)> {
        begin_local(&self.shared, self.idx, || self.guard())
    }

    /// Why this instance does not contend for roles, if it was withdrawn
    /// with a reason (see [`Coordinator::withdraw`](super::Coordinator::withdraw)).
    pub fn withdrawal(&self) -> Option<Arc<str>> {
        self.shared.withdrawal()
    }

    /// Wakes on every snapshot the coordinator publishes.
    pub(crate) fn subscribe_published(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.subscribe_published()
    }

    /// Runs `cycle` once per `interval` on whichever instance holds the role:
    /// a maintenance loop only the holder runs.
    ///
    /// Each cycle is gated: it starts only if the role is held here at that
    /// moment, and gets the term's [`HeldLease`] (its fencing token) and a
    /// [`TermWatch`]. It runs as local work, so a graceful handover of the
    /// role waits for it (up to the drain bound) before another instance may
    /// take the role; when the term is over (lost, past its trust deadline,
    /// or the drain bound passed) the cycle's future is dropped, so it never
    /// overlaps a cycle of the next holder. A cycle that runs longer than
    /// `interval` delays the next one; missed ticks are skipped. Not held
    /// here, it waits for the role without polling the store. Returns once
    /// the coordinator is shut down (`shutdown()`); a coordinator stopped by
    /// `abort()` holds nothing, so no cycle runs, but the loop goes on
    /// waiting until it is dropped.
    pub async fn every<F, Fut>(&self, interval: std::time::Duration, mut cycle: F)
    where
        F: FnMut(HeldLease, TermWatch) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut published = self.subscribe_published();
        let mut ticks = tokio::time::interval(interval.max(std::time::Duration::from_millis(1)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            if self.shared.is_stopping() {
                return;
            }
            if !self.is_held() {
                // Wait for the next snapshot, and look again at least once
                // per interval (a stopped coordinator publishes no more).
                let interval = ticks.period();
                if let Ok(Err(_)) = tokio::time::timeout(interval, published.changed()).await {
                    return;
                }
                continue;
            }
            // Waits without counting as local work: a handover is not held
            // up by a cycle that has not started.
            ticks.tick().await;
            let Some((lease, work)) = self.begin_local() else {
                continue;
            };
            let watch = work.watch().clone();
            let over = watch.over();
            tokio::select! {
                _ = cycle(lease, watch) => {}
                _ = over => {}
            }
            drop(work);
        }
    }

    /// `Some(the last store error, if any)` while this instance has not read
    /// the lease store yet (no holder can be known).
    pub fn store_unread(&self) -> Option<Option<Arc<str>>> {
        self.shared.store_unread()
    }

    /// The current holder if known and unexpired (this instance included).
    pub fn current_holder(&self) -> Option<HolderInfo> {
        let snap = self.shared.snapshot();
        holder_of(&self.shared, &snap.roles[self.idx])
    }
}

fn holder_of(shared: &LeaseState, state: &RoleState) -> Option<HolderInfo> {
    let now = Instant::now();
    if state.held_now(now) {
        return Some(HolderInfo {
            id: shared.instance_id().clone(),
            address: shared.instance().address.as_str().into(),
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
        here: **id == **shared.instance_id(),
    })
}

/// A registered partition: `count` roles, a key picks one.
#[derive(Clone)]
pub struct RolePartition {
    pub(super) shared: Arc<LeaseState>,
    pub(super) name: Arc<str>,
    pub(super) count: u32,
    pub(super) first: usize,
    /// Keeps the coordinator's loop running while this handle lives.
    pub(super) keep: Arc<Keepalive>,
}

impl RolePartition {
    /// The partition's name.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Why this instance does not contend for roles, if it was withdrawn
    /// with a reason (see [`Coordinator::withdraw`](super::Coordinator::withdraw)).
    pub fn withdrawal(&self) -> Option<Arc<str>> {
        self.shared.withdrawal()
    }

    /// Wakes on every snapshot the coordinator publishes.
    pub(crate) fn subscribe_published(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.subscribe_published()
    }

    /// `Some(the last store error, if any)` while this instance has not read
    /// the lease store yet (no holder can be known).
    pub fn store_unread(&self) -> Option<Option<Arc<str>>> {
        self.shared.store_unread()
    }

    /// How many roles the partition has.
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

    /// Where partition `index` lives now (clamped to the count). No I/O.
    pub fn resolve_index(&self, index: u32) -> PartitionResolution {
        let idx = self.first + index.min(self.count - 1) as usize;
        let snap = self.shared.snapshot();
        let state = &snap.roles[idx];
        let closed = self.shared.is_draining() || self.shared.is_handing_over(idx);
        let now = Instant::now();
        let held = !closed && state.held_now(now);
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

    /// [`RoleLease::begin_local`] for partition `index`: the held lease and
    /// its work count, if held here and not being handed over.
    pub fn begin_local(&self, index: u32) -> Option<(HeldLease, LocalWork)> {
        self.role(index)?.begin_local()
    }

    /// Whether `scope` (`None`: unscoped) is among the scopes declared for
    /// the partition (`CoordinatorBuilder::partition_scopes`), which its
    /// recorded definition covers.
    pub fn declares_scope(&self, scope: Option<&str>) -> bool {
        self.shared
            .partition(&self.name)
            .is_some_and(|p| p.scopes.iter().any(|s| s.as_deref() == scope))
    }

    /// The partition's definition here and how it stands against the one
    /// the store records, as last read.
    pub fn definition(&self) -> Option<super::PartitionDefinition> {
        let snap = self.shared.snapshot();
        let found = snap.definitions.iter().find(|d| *d.name == *self.name);
        found.cloned()
    }

    /// How many of the partition's roles this instance holds now.
    pub fn held_here(&self) -> usize {
        let snap = self.shared.snapshot();
        let now = Instant::now();
        let roles = &snap.roles[self.first..self.first + self.count as usize];
        roles.iter().filter(|r| r.held_now(now)).count()
    }

    /// Whether the partition's roles are spread over the live candidates.
    pub fn is_balanced(&self) -> bool {
        self.shared
            .partition(&self.name)
            .is_some_and(|p| p.balance.is_some())
    }

    /// Index of partition role 0 among all registered roles (as in
    /// [`HolderSnapshot::roles`](super::HolderSnapshot::roles)).
    pub fn first_index(&self) -> usize {
        self.first
    }

    /// The role handle of partition `index`.
    pub fn role(&self, index: u32) -> Option<RoleLease> {
        (index < self.count).then(|| RoleLease {
            shared: self.shared.clone(),
            idx: self.first + index as usize,
            _keep: self.keep.clone(),
        })
    }
}

// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------

/// What local work learns of its term's end (see [`LocalWork`](super::LocalWork)).
/// Cheap to clone; the layers put one on each request they run locally.
#[derive(Clone)]
pub struct TermWatch {
    shared: Arc<LeaseState>,
    idx: usize,
    token: u64,
    signals: TermSignals,
}

impl std::fmt::Debug for TermWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TermWatch")
            .field("role", &self.shared.role(self.idx).name.as_str())
            .field("token", &self.token)
            .finish()
    }
}

impl TermWatch {
    fn new(shared: Arc<LeaseState>, idx: usize, token: u64) -> Self {
        let ending = shared.is_draining() || shared.is_handing_over(idx);
        let signals = shared.terms().signals(idx, token, ending);
        Self {
            shared,
            idx,
            token,
            signals,
        }
    }

    /// The term's trust deadline while it lasts, judged now; `None` once it
    /// is over (ended, lost, or past its deadline).
    pub(crate) fn deadline(&self, now: Instant) -> Option<Instant> {
        if self.signals.over.is_cancelled() {
            return None;
        }
        let snap = self.shared.snapshot();
        let state = &snap.roles[self.idx];
        if state.token == self.token && state.held_now(now) {
            state.held_until
        } else {
            None
        }
    }

    /// True once the term is over: stop the work now.
    pub fn is_over(&self) -> bool {
        self.deadline(Instant::now()).is_none()
    }

    /// Resolves when the term is over: ended at a drain bound, lost, or past
    /// its trust deadline (fail-closed). No byte of the work may be produced
    /// after it.
    pub fn over(&self) -> impl Future<Output = ()> + Send + 'static {
        let watch = self.clone();
        async move {
            while let Some(until) = watch.deadline(Instant::now()) {
                tokio::select! {
                    _ = watch.signals.over.cancelled() => return,
                    _ = tokio::time::sleep_until(until.into()) => {}
                }
            }
        }
    }

    /// Resolves when the term is ending: a handover or a stop began (its drain
    /// bound is running), or the term is already over. Stop taking new steps
    /// and finish what is in hand.
    pub fn ending(&self) -> impl Future<Output = ()> + Send + 'static {
        let ending = self.signals.ending.clone();
        let over = self.over();
        async move {
            tokio::select! {
                _ = ending.cancelled() => {}
                _ = over => {}
            }
        }
    }

    /// Why the term ended, once it is over.
    pub fn reason(&self) -> Option<TermEndReason> {
        match self.signals.reason.get() {
            Some(r) => Some(*r),
            None if self.is_over() => Some(TermEndReason::FailClose),
            None => None,
        }
    }

    /// The role's name.
    pub fn role(&self) -> &Arc<str> {
        self.shared.role(self.idx).name.as_arc()
    }

    /// The `role` label of this role's metrics (its partition's name for a
    /// partition's role).
    pub(crate) fn metric_label(&self) -> String {
        self.shared.metric_label(self.idx)
    }

    /// Ends the count of local work this watch's [`LocalWork`](super::LocalWork) held.
    fn leave_local(&self) {
        self.shared.leave_local(self.idx);
    }

    /// [`over`](Self::over), boxed, for bodies that poll it.
    pub(crate) fn over_boxed(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(self.over())
    }
}

/// What the user's handles keep alive: dropping the last one without a
/// shutdown stops the loop, which ends local work and releases the roles.
pub(super) struct Keepalive(pub(super) Arc<LeaseState>);

impl Drop for Keepalive {
    fn drop(&mut self) {
        let shared = &self.0;
        if shared.is_stopping() {
            return;
        }
        let now = Instant::now();
        let snap = shared.snapshot();
        let held: Vec<&str> = snap
            .roles
            .iter()
            .filter(|r| r.held_now(now))
            .map(|r| r.name.as_ref())
            .collect();
        shared.begin_drain();
        shared.request_stop();
        // The first eight named, as the acquisition line does.
        let mut named = held.iter().take(8).copied().collect::<Vec<_>>().join(", ");
        if held.len() > 8 {
            named.push_str(", ...");
        }
        tracing::warn!(
            instance = %shared.instance().id,
            count = held.len(),
            roles = %named,
            "coordinator dropped without shutdown; releasing its roles"
        );
    }
}
