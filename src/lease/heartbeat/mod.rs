//! The heartbeat loop: one task per process renews and acquires every role
//! in one batched claim per tick, reads one snapshot, and publishes it.
//!
//! Trust window: a grant is trusted until `t_sent + duration - safety_margin`
//! on the local monotonic clock, with `t_sent` taken before the request left.
//! The store judges expiry with its own clock from a moment after `t_sent`, so
//! the local belief always ends at least `safety_margin` before anyone else
//! can be granted the role. A response that arrives after that deadline is
//! discarded and its term abandoned.
//!
//! A term abandoned that way (a fail-close: a store gap, a late answer) is
//! *lapsed*, not gone: the next claim offers its token, and the store keeps
//! it only while it still names this instance with that token, unexpired by
//! the store's own clock (etcd: the same key revision on the same lease).
//! Then the same term resumes: nobody else can have held the role
//! meanwhile, and a leader election or a database blip shorter than the
//! lease costs no new term. Otherwise the store starts a new term.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::snapshot::{HolderSnapshot, RoleState};
use super::TermEndReason;
mod balance;
mod claim;
mod definitions;

use super::state::{Counters, LeaseEvent, LeaseState};
use crate::role::RoleName;
use crate::store::{LeaseRecord, StoreError};
use crate::telemetry;

/// Smallest gap between two ticks triggered by store notifications, so a burst
/// of term changes elsewhere costs a handful of ticks, not one per change.
const NOTICE_COALESCE: Duration = Duration::from_millis(5);

/// Reads of changes between two checks of the whole view: a store's
/// [tally](crate::store::LeaseStore::tally) compared with the view's (a
/// full read when they differ), or a full read for a store without one. A
/// change the store's history missed (a trigger disabled by hand, a
/// restored backup) is therefore in the view within this many ticks and
/// one more. Presence is read in full this often.
pub(crate) const RESYNC_EVERY: u32 = 60;

/// A term that failed closed here (see [`LoopRole::lapsed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lapsed {
    token: u64,
    until: Instant,
}

/// A term this instance holds, as the loop tracks it.
#[derive(Debug, Clone, Copy)]
struct HeldTerm {
    token: u64,
    held_until: Instant,
    started: Instant,
    /// Whether a snapshot showing this term was published (readers saw it).
    published: bool,
}

#[derive(Debug, Clone)]
struct LoopRole {
    held: Option<HeldTerm>,
    /// Earliest time a claim could succeed, by the last snapshot.
    next_attempt: Instant,
    state: RoleState,
    /// What the held gauge last said, so it is only set on change.
    gauge_held: Option<bool>,
    /// A plain role: it has a held gauge of its own (a partition's roles are
    /// counted per partition, unless every role is to have its series).
    plain: bool,
    /// Since when the store has shown the role without a live holder.
    free_since: Option<Instant>,
    /// Whether the last full read (or a read of changes since) had a record.
    recorded: bool,
    /// A term that failed closed here and that the store may still keep:
    /// its token, which the next claim offers to resume that term, and the
    /// earliest time the store may let it expire (the last grant's send
    /// time + duration), after which a quick retry can no longer save it.
    lapsed: Option<Lapsed>,
}

pub(super) struct HeartbeatLoop {
    shared: Arc<LeaseState>,
    roles: Vec<LoopRole>,
    /// Terms ended since the last publish; their `Ended` events go out with it.
    ended: Vec<(usize, HeldTerm)>,
    loaded: bool,
    store_ok: bool,
    /// Whether the last snapshot read succeeded (readiness counts from it).
    read_ok: bool,
    /// Where the next read of changes starts; `None`: read everything.
    cursor: Option<crate::store::Cursor>,
    /// Reads of changes since the last full read or check.
    since_full: u32,
    /// A holder missing from a read of changes has at least this long left.
    horizon: Duration,
    /// When the last store round trip that succeeded was sent (readiness).
    last_ok_sent: Option<Instant>,
    registered: bool,
    registered_ticks: u64,
    calls_this_tick: u64,
    published: u64,
    warnings: telemetry::WarnGate,
    /// Partition balancing, when a partition has it on.
    balance: Option<balance::Balancer>,
    /// The store's partition definitions, when there are partitions.
    definitions: Option<definitions::Definitions>,
}

impl HeartbeatLoop {
    pub(super) fn new(shared: Arc<LeaseState>) -> Self {
        let now = Instant::now();
        let in_partition: Vec<std::ops::Range<usize>> = (shared.partitions())
            .map(|(_, p)| p.first..p.first + p.count as usize)
            .collect();
        let roles = (0..shared.role_count())
            .map(|i| (i, shared.role(i)))
            .map(|(i, r)| LoopRole {
                held: None,
                next_attempt: now,
                state: RoleState {
                    name: r.name.as_arc().clone(),
                    ..RoleState::default()
                },
                gauge_held: None,
                plain: !in_partition.iter().any(|p| p.contains(&i)),
                free_since: None,
                recorded: false,
                lapsed: None,
            })
            .collect();
        let horizon = change_horizon(&shared);
        Self {
            balance: balance::Balancer::new(&shared),
            definitions: definitions::Definitions::new(&shared),
            shared,
            roles,
            ended: Vec::new(),
            loaded: false,
            store_ok: false,
            read_ok: false,
            cursor: None,
            since_full: 0,
            horizon,
            last_ok_sent: None,
            registered: false,
            registered_ticks: 0,
            calls_this_tick: 0,
            published: 0,
            warnings: telemetry::WarnGate::default(),
        }
    }

    pub(super) async fn run(mut self) {
        let mut feed = None;
        let mut last_notice_tick = Instant::now() - NOTICE_COALESCE;
        loop {
            if self.shared.is_stopping() {
                self.release_all().await;
                return;
            }
            self.tick().await;
            // After the tick, and briefly: a slow subscribe must never delay a
            // renewal. Without a feed, the snapshot read of every tick still
            // finds every change.
            if feed.is_none() {
                let limit = self.shared.tick_every().min(Duration::from_secs(1));
                match tokio::time::timeout(limit, self.shared.store().subscribe()).await {
                    Ok(Ok(f)) => feed = Some(f),
                    Ok(Err(e)) => tracing::debug!(error = %e, "change feed unavailable; polling"),
                    Err(_) => tracing::debug!("change feed subscribe timed out; polling"),
                }
            }

            let now = Instant::now();
            let mut next = now + self.shared.tick_every();
            if !self.store_ok {
                // Retry sooner while the store is failing, but not in a hot
                // loop; sooner still with a lapsed term, which resumes only
                // if its claim reaches the store before the lease expires.
                let lapsed = self
                    .roles
                    .iter()
                    .any(|r| r.lapsed.is_some_and(|l| l.until > now));
                let every = self.shared.tick_every() / if lapsed { 10 } else { 2 };
                next = now + every.max(Duration::from_millis(50));
            } else if !self.read_ok {
                // The store failed the read but answered the claim: it is back
                // (an etcd quorum returning). Read it again soon, so readiness
                // and the holder view return within a fraction of a tick.
                next = now + (self.shared.tick_every() / 10).max(Duration::from_millis(50));
            }
            if self.shared.is_candidate() {
                for r in &self.roles {
                    // Wake at a held-elsewhere role's observed expiry (crash takeover),
                    // and at a held term's deadline (tiny timings, a slow tick).
                    if r.held.is_none() && r.next_attempt > now && r.next_attempt < next {
                        next = r.next_attempt;
                    }
                    if let Some(h) = r.held {
                        if h.held_until < next {
                            next = h.held_until;
                        }
                    }
                }
            }
            let sleep = tokio::time::sleep_until(next.into());
            tokio::select! {
                _ = sleep => {}
                _ = self.shared.woken() => {}
                notice = recv_feed(&mut feed) => {
                    if notice.is_none() {
                        // The feed ended (connection lost): poll, and subscribe anew.
                        feed = None;
                    }
                    let since = last_notice_tick.elapsed();
                    if since < NOTICE_COALESCE {
                        tokio::time::sleep(NOTICE_COALESCE - since).await;
                    }
                    last_notice_tick = Instant::now();
                }
            }
        }
    }

    fn store_failed(&mut self, what: &'static str, error: &StoreError) {
        if error.is_schema() {
            // The table may have been recreated: register the rows again.
            self.registered = false;
        }
        self.store_failed_msg(what, &error.to_string());
    }

    fn store_failed_msg(&mut self, what: &'static str, error: &str) {
        self.shared
            .counters()
            .store_errors
            .fetch_add(1, Ordering::Relaxed);
        metrics::counter!(telemetry::STORE_ERRORS, "op" => what).increment(1);
        self.store_ok = false;
        self.shared.set_store_error(
            &crate::redact::redact_text(&format!("{what}: {error}")),
            error == "timed out",
        );
        // One warning per second at most while the store is down, saying how
        // many were held back.
        let every = Duration::from_secs(1);
        if let Some(suppressed) = self.warnings.admit("store", every, Instant::now()) {
            let error = crate::redact::redact_text(error);
            tracing::warn!(store = self.shared.store().kind(), op = what, %error, suppressed, "lease store call failed; failing closed and retrying");
        }
    }

    /// Readiness counts from the snapshot read, which each tick sends before
    /// its claim: readiness therefore ends no later than any grant of the tick.
    fn store_answered(&mut self, t_sent: Instant) {
        if self.last_ok_sent.is_none_or(|t| t < t_sent) {
            self.last_ok_sent = Some(t_sent);
        }
    }

    fn record_latency(op: &'static str, since: Instant) {
        metrics::histogram!(telemetry::STORE_LATENCY, "op" => op)
            .record(since.elapsed().as_secs_f64());
    }

    /// Ends terms whose local deadline has passed.
    fn expire_local(&mut self, now: Instant) {
        for i in 0..self.roles.len() {
            if self.roles[i].held.is_some_and(|h| h.held_until <= now) {
                self.end_term(i, TermEndReason::FailClose);
            }
        }
    }

    /// Ends local belief in a term. Readers keep seeing the last published
    /// snapshot until the next publish, so the interval's end is recorded
    /// then: the earlier of the deadline and the moment the new snapshot is
    /// stored.
    fn end_term(&mut self, i: usize, reason: TermEndReason) {
        if let Some(h) = self.roles[i].held.take() {
            // Work admitted under the term stops with it (a graceful end has
            // already stopped it, before this).
            self.shared.terms().end(i, h.token, reason);
            self.roles[i].next_attempt = Instant::now();
            let until = h.held_until + self.shared.role(i).timings.safety_margin;
            self.roles[i].lapsed = (reason == TermEndReason::FailClose).then_some(Lapsed {
                token: h.token,
                until,
            });
            if h.published {
                self.ended.push((i, h));
            }
        }
    }

    fn emit(&self, event: LeaseEvent) {
        self.shared.emit(event);
    }

    async fn tick(&mut self) {
        Counters::bump(&self.shared.counters().ticks);
        let shared = self.shared.clone();
        if !self.registered {
            let t_sent = Instant::now();
            let result =
                tokio::time::timeout(shared.op_timeout(), shared.store().register(shared.names()))
                    .await;
            Self::record_latency("register", t_sent);
            match result {
                Ok(Ok(())) => {
                    self.registered = true;
                    self.registered_ticks = 0;
                }
                Ok(Err(e)) => self.store_failed("register", &e),
                Err(_) => self.store_failed_msg("register", "timed out"),
            }
            if !self.registered {
                self.expire_local(Instant::now());
                self.publish();
                return;
            }
        }
        self.expire_local(Instant::now());

        // The definitions first: a partition term is trusted from no later
        // than this read, which confirms what its keys mean.
        self.check_definitions().await;
        // Read first, so a role freed since the last tick (a notification woke
        // us) is claimed in this same tick.
        self.read_snapshot().await;
        self.define_missing().await;
        self.refresh_membership().await;
        if shared.is_candidate() {
            self.claim().await;
            self.hand_over_step().await;
        } else {
            self.release_all().await;
        }
        self.publish();
        let calls = std::mem::take(&mut self.calls_this_tick);
        if self.registered_ticks > 0 {
            shared
                .counters()
                .max_calls_per_tick
                .fetch_max(calls, Ordering::Relaxed);
        }
        self.registered_ticks += 1;
    }

    /// Reads the store's view of every role: everything on the first tick,
    /// after a failed read and after a check that found the view wrong
    /// (every [`RESYNC_EVERY`] reads), otherwise only what changed since
    /// the last read.
    async fn read_snapshot(&mut self) {
        let shared = self.shared.clone();
        shared
            .counters()
            .snapshot_calls
            .fetch_add(1, Ordering::Relaxed);
        self.calls_this_tick += 1;
        let since = self.cursor;
        let t_sent = Instant::now();
        let read = shared.store().changes(shared.names(), since, self.horizon);
        let result = tokio::time::timeout(shared.op_timeout(), read).await;
        let t_recv = Instant::now();
        Self::record_latency("snapshot", t_sent);
        self.read_ok = matches!(result, Ok(Ok(_)));
        let changes = match result {
            Ok(Ok(changes)) => changes,
            Ok(Err(e)) => {
                self.cursor = None;
                return self.store_failed("snapshot", &e);
            }
            Err(_) => {
                self.cursor = None;
                return self.store_failed_msg("snapshot", "timed out");
            }
        };
        self.store_ok = true;
        self.store_answered(t_sent);
        self.loaded = true;
        self.cursor = Some(changes.cursor);
        if changes.full {
            shared.counters().full_reads.fetch_add(1, Ordering::Relaxed);
            self.since_full = 0;
            for r in &mut self.roles {
                r.recorded = false;
            }
            if changes.records.len() < shared.names().len() {
                // Rows vanished (a restored or new database): register them again.
                tracing::warn!(
                    found = changes.records.len(),
                    expected = shared.names().len(),
                    "lease rows missing from the store; registering them again"
                );
                self.registered = false;
            }
        } else {
            self.since_full += 1;
            // Every holder the read left out has at least the horizon left.
            let live_until = t_recv + self.horizon;
            let me = shared.instance_id();
            for r in &mut self.roles {
                if r.state.holder.is_some() {
                    r.state.holder_valid_until =
                        r.state.holder_valid_until.map(|t| t.max(live_until));
                    let elsewhere = r.state.holder.as_ref() != Some(me);
                    if elsewhere && r.held.is_none() && r.free_since.is_none() {
                        r.next_attempt = r.next_attempt.max(live_until);
                    }
                }
            }
        }
        shared
            .counters()
            .rows_read
            .fetch_add(changes.records.len() as u64, Ordering::Relaxed);
        for rec in changes.records {
            if let Some(i) = shared.index_of(&rec.role) {
                self.apply_record(i, &rec, t_recv);
            }
        }
        if !changes.full && self.since_full >= RESYNC_EVERY {
            self.check_view().await;
        }
    }

    /// Compares the view with the store's tally: equal, the reads of
    /// changes go on; different, unknown or failed, the next read is full.
    async fn check_view(&mut self) {
        let shared = self.shared.clone();
        self.calls_this_tick += 1;
        let tally = shared.store().tally(shared.names());
        let answer = tokio::time::timeout(shared.op_timeout(), tally).await;
        let mut mine = crate::store::Tally::default();
        for r in self.roles.iter().filter(|r| r.recorded) {
            mine.records += 1;
            mine.holders += u64::from(r.state.holder.is_some());
            mine.tokens = mine.tokens.wrapping_add(r.state.token);
        }
        match answer {
            Ok(Ok(Some(tally))) if tally == mine => self.since_full = 0,
            Ok(Ok(Some(tally))) => {
                tracing::info!(?tally, view = ?mine, "the lease view differs from the store's; reading every role");
                self.cursor = None;
            }
            _ => self.cursor = None,
        }
    }

    /// Applies what the store says about role `i`, read at `t_recv`.
    fn apply_record(&mut self, i: usize, rec: &LeaseRecord, t_recv: Instant) {
        let mine = rec.holder.as_deref() == Some(self.shared.instance().id.as_str());
        if let Some(h) = self.roles[i].held {
            if rec.token != h.token || !mine {
                // The store no longer shows our term (a newer term, a release, a
                // rollback): it is over, whatever the deadline says.
                tracing::warn!(role = %rec.role, token = h.token, store_token = rec.token, "the store no longer shows this instance's term; role lost");
                self.end_term(i, TermEndReason::Lost);
            }
        }
        let r = &mut self.roles[i];
        r.recorded = true;
        if r.lapsed.is_some_and(|l| !mine || rec.token != l.token) {
            // Another term, or a release: the lapsed one cannot resume.
            r.lapsed = None;
        }
        r.state.holder = rec.holder.as_deref().map(Arc::from);
        r.state.holder_address = rec.holder_address.as_deref().map(Arc::from);
        r.state.token = rec.token.max(r.held.map_or(0, |h| h.token));
        let live = rec.holder.is_some() && !rec.remaining.is_zero();
        r.state.holder_valid_until = live.then(|| t_recv + rec.remaining);
        r.free_since = if live {
            None
        } else {
            r.free_since.or(Some(t_recv))
        };
        r.next_attempt = if live && !mine {
            // Try again just after the observed expiry: crash takeover lands
            // right after `duration` instead of a poll later.
            t_recv + rec.remaining + Duration::from_millis(1)
        } else {
            t_recv
        };
    }

    fn publish(&mut self) {
        let now = Instant::now();
        // A term whose deadline has passed ended for every reader at that
        // deadline (readers judge it at use): its `Ended` goes out first, so
        // it precedes the `Began` of the same term resumed in this tick.
        let (past, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.ended)
            .into_iter()
            .partition(|(_, h)| h.held_until <= now);
        self.ended = rest;
        for (i, h) in past {
            self.emit(LeaseEvent::Ended {
                instance: self.shared.instance_id().clone(),
                role: self.roles[i].state.name.clone(),
                token: h.token,
                at: h.held_until.max(h.started),
            });
        }
        let mut began = Vec::new();
        // A term's interval starts when readers can first see it: now, just
        // before the store below.
        for (i, r) in self.roles.iter_mut().enumerate() {
            let held = r.held.is_some();
            // A partition's roles are counted by `record_shares` instead,
            // unless each is to have its own series.
            let own_series = r.plain || telemetry::per_role_metrics();
            if own_series && r.gauge_held != Some(held) {
                r.gauge_held = Some(held);
                metrics::gauge!(telemetry::LEASE_HELD, "role" => r.state.name.to_string())
                    .set(if held { 1.0 } else { 0.0 });
            }
            if let Some(h) = &mut r.held {
                if !h.published {
                    h.started = now;
                    h.published = true;
                    began.push((i, *h));
                }
            }
        }
        for (i, h) in began {
            self.emit(LeaseEvent::Began {
                instance: self.shared.instance_id().clone(),
                role: self.roles[i].state.name.clone(),
                token: h.token,
                at: now,
                until: h.held_until,
            });
        }
        let (members, preferred) = match &self.balance {
            Some(b) => (b.members.clone(), Some(&b.preferred)),
            None => (Vec::new(), None),
        };
        let snapshot = HolderSnapshot {
            roles: (self.roles.iter().enumerate())
                .map(|(i, r)| RoleState {
                    held_until: r.held.map(|h| h.held_until),
                    preferred: preferred.and_then(|p| p[i].clone()),
                    handing_over: self.shared.is_handing_over(i),
                    ..r.state.clone()
                })
                .collect(),
            members,
            published_at: now,
            loaded: self.loaded,
            store_ok: self.store_ok,
            last_ok_sent: self.last_ok_sent,
            candidate: self.shared.is_candidate(),
            draining: self.shared.is_draining(),
            definitions: self
                .definitions
                .as_ref()
                .map(|d| d.views())
                .unwrap_or_default(),
        };
        let previous = self.shared.publish(snapshot);
        if !self.ended.is_empty() {
            // Readers hold the snapshot only while checking. Once the previous
            // one has no reader left, nobody can still believe an ended term:
            // that instant is the term's recorded end.
            let start = Instant::now();
            while Arc::strong_count(&previous) > 1 && start.elapsed() < Duration::from_millis(100) {
                std::thread::yield_now();
            }
        }
        drop(previous);
        let stored = Instant::now();
        for (i, h) in std::mem::take(&mut self.ended) {
            self.emit(LeaseEvent::Ended {
                instance: self.shared.instance_id().clone(),
                role: self.roles[i].state.name.clone(),
                token: h.token,
                at: h.held_until.min(stored).max(h.started),
            });
        }
        let fresh = self
            .last_ok_sent
            .is_some_and(|t| t.elapsed() < self.shared.op_timeout());
        metrics::gauge!(telemetry::READY).set(if self.loaded && fresh { 1.0 } else { 0.0 });
        self.record_shares();
        self.published += 1;
        self.shared.announce(self.published);
    }

    /// Ends local belief first (published), then releases in one store call
    /// every term this instance holds or that the store still shows as its own.
    async fn release_all(&mut self) {
        if self.shared.is_stopping() && self.balance.is_some() {
            // Leaving: the others rebalance at once, not at this record's expiry.
            let shared = self.shared.clone();
            let leave = shared.store().leave(shared.instance());
            if let Ok(Err(e)) = tokio::time::timeout(shared.op_timeout(), leave).await {
                tracing::debug!(error = %e, "removing the presence record failed");
            }
        }
        let mut held: Vec<(RoleName, u64)> = Vec::new();
        for (i, r) in self.roles.iter().enumerate() {
            let name = self.shared.role(i).name.clone();
            if let Some(h) = r.held {
                held.push((name, h.token));
            } else if r.state.holder.as_deref() == Some(self.shared.instance_id().as_ref()) {
                // Abandoned (late) or unseen grants the store still gives us; the
                // store's token check keeps this safe.
                held.push((name, r.state.token));
            }
        }
        // Work still running is ended before anything is released.
        let running: Vec<usize> = (0..self.roles.len())
            .filter(|&i| self.roles[i].held.is_some())
            .collect();
        for &i in &running {
            if let Some(h) = self.roles[i].held {
                self.shared.terms().end(i, h.token, TermEndReason::Stop);
            }
        }
        self.wait_work_ended(&running).await;
        for i in 0..self.roles.len() {
            self.end_term(i, TermEndReason::Stop);
        }
        self.publish();
        if held.is_empty() {
            return;
        }
        let shared = self.shared.clone();
        shared
            .counters()
            .release_calls
            .fetch_add(1, Ordering::Relaxed);
        self.calls_this_tick += 1;
        let t_sent = Instant::now();
        let result = tokio::time::timeout(
            shared.op_timeout(),
            shared.store().release(shared.instance(), &held),
        )
        .await;
        Self::record_latency("release", t_sent);
        match result {
            Ok(Ok(released)) => {
                metrics::counter!(telemetry::LEASE_OPS, "op" => "release", "outcome" => "granted")
                    .increment(released.len() as u64);
                for r in &released {
                    if let Some(i) = shared.index_of(r) {
                        self.roles[i].state.holder = None;
                        self.roles[i].state.holder_address = None;
                        self.roles[i].state.holder_valid_until = None;
                    }
                }
                if !released.is_empty() {
                    tracing::info!(count = released.len(), "released held roles");
                }
            }
            Ok(Err(e)) => self.store_failed("release", &e),
            Err(_) => self.store_failed_msg("release", "timed out"),
        }
    }
}

impl HeartbeatLoop {
    /// After a term's work was told it is over: waits, briefly, until it has
    /// stopped, so the role is released only after its last byte. Work that
    /// ignores the signal (a library user's own loop) is waited for no longer.
    pub(super) async fn wait_work_ended(&self, roles: &[usize]) -> usize {
        let grace = self.shared.tick_every().min(Duration::from_secs(1));
        if self.shared.wait_idle(roles, grace).await {
            return 0;
        }
        let left: usize = roles.iter().map(|&i| self.shared.in_flight(i)).sum();
        tracing::warn!(
            left,
            ?grace,
            "local work still running after its term ended; releasing anyway"
        );
        left
    }
}

/// How long a holder a read of changes leaves out has left, at least: half
/// the margin between a role's duration and its renewal interval, for the
/// role where that is least. A holder renewing on time never comes that
/// close to its end, so a read of changes names only holders that stopped
/// renewing; one that did is named before its term ends (or, with a short
/// margin, at the latest one tick after).
fn change_horizon(shared: &LeaseState) -> Duration {
    (0..shared.role_count())
        .map(|i| {
            let t = &shared.role(i).timings;
            t.duration.saturating_sub(t.renew_interval) / 2
        })
        .min()
        .unwrap_or_default()
}

async fn recv_feed(feed: &mut Option<crate::store::ChangeFeed>) -> Option<()> {
    match feed {
        Some(f) => f.recv().await,
        None => std::future::pending().await,
    }
}
