//! The balancing steps of a tick, for partitions with `balance` on: keep
//! this instance's presence record fresh and read the live candidates;
//! decide which free roles to claim at once (those this instance is
//! preferred for) and which only after a renew interval; and hand surplus
//! roles to their preferred holder gracefully, one at a time, once
//! membership has been stable for the partition's `rebalance_delay`.
//! Nothing is ever taken from a live holder: roles move only by release.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::HeartbeatLoop;
use crate::lease::balance::assign;
use crate::lease::fingerprint::{has_routes, published_definition};
use crate::lease::state::Counters;
use crate::lease::TermEndReason;
use crate::store::{Cursor, Member};
use crate::telemetry;

/// One balanced partition: where its roles sit among all registered roles.
struct Balanced {
    name: Arc<str>,
    /// This instance's definition: the partition is spread only over
    /// members that publish the same one (or none).
    definition: Arc<str>,
    first: usize,
    count: usize,
    rebalance_delay: Duration,
    /// How long a move waits for local work before ending it.
    handover_drain: Duration,
}

/// A surplus role on its way to its preferred holder.
struct Handover {
    idx: usize,
    to: Arc<str>,
    /// Release by then even if local work is still running (the drain bound).
    until: Instant,
    cause: &'static str,
}

/// What the loop knows about membership, and the handover in progress.
pub(super) struct Balancer {
    partitions: Vec<Balanced>,
    /// The presence record's lifetime: the shortest duration among the roles.
    ttl: Duration,
    /// Every live member as last listed, candidates or not.
    pub(super) members: Vec<Member>,
    /// Sorted ids of the live candidates.
    candidates: Vec<Arc<str>>,
    /// Per balanced partition: the candidates that define it alike.
    alike: Vec<Vec<Arc<str>>>,
    /// The store answered a presence call at least once.
    known: bool,
    /// When the candidate set last changed, and whether it grew then.
    since: Instant,
    grew: bool,
    /// Per registered role: its preferred holder (balanced roles only).
    pub(super) preferred: Vec<Option<Arc<str>>>,
    handover: Option<Handover>,
    /// Members whose route table differs from this one's, with how (each
    /// logged once per difference).
    route_differences: std::collections::BTreeMap<String, Vec<String>>,
    /// Every live member by id, as the reads of presence built it.
    known_members: std::collections::BTreeMap<String, Member>,
    /// Where the next read of presence changes starts; `None`: read all.
    cursor: Option<Cursor>,
    /// Reads of presence changes since the last full read.
    since_full: u32,
}

impl Balancer {
    /// The balancer of a registry, or `None` when no partition is balanced
    /// and no route table is published. With routes but no balanced
    /// partition it only keeps the presence record (route comparison).
    pub(super) fn new(shared: &crate::lease::state::LeaseState) -> Option<Balancer> {
        let mut partitions: Vec<Balanced> = shared
            .partitions()
            .filter_map(|(name, meta)| {
                Some(Balanced {
                    name: name.as_str().into(),
                    definition: meta.definition.clone(),
                    first: meta.first,
                    count: meta.count as usize,
                    rebalance_delay: meta.balance?,
                    handover_drain: meta.handover_drain,
                })
            })
            .collect();
        if partitions.is_empty() && !has_routes(shared.routes()) {
            return None;
        }
        partitions.sort_by_key(|p| p.first);
        let ttl = if partitions.is_empty() {
            (0..shared.role_count())
                .map(|i| shared.role(i).timings.duration)
                .min()
        } else {
            partitions
                .iter()
                .flat_map(|p| p.first..p.first + p.count)
                .map(|i| shared.role(i).timings.duration)
                .min()
        }
        .unwrap_or(Duration::from_secs(15));
        Some(Balancer {
            partitions,
            ttl,
            members: Vec::new(),
            candidates: Vec::new(),
            alike: Vec::new(),
            known: false,
            since: Instant::now(),
            grew: false,
            preferred: vec![None; shared.role_count()],
            handover: None,
            route_differences: std::collections::BTreeMap::new(),
            known_members: std::collections::BTreeMap::new(),
            cursor: None,
            since_full: 0,
        })
    }

    /// Whether role `i` belongs to a balanced partition.
    fn balances(&self, i: usize) -> bool {
        self.partitions
            .iter()
            .any(|p| (p.first..p.first + p.count).contains(&i))
    }

    /// Takes a new member list; recomputes preferences when the candidates changed.
    fn update(&mut self, members: Vec<Member>, roles: &[Arc<str>], now: Instant) {
        let mut candidates: Vec<Arc<str>> = members
            .iter()
            .filter(|m| m.candidate)
            .map(|m| Arc::from(m.id.as_str()))
            .collect();
        candidates.sort();
        // A member that defines a partition otherwise never takes its roles:
        // preferring it would leave them unheld.
        let alike: Vec<Vec<Arc<str>>> = (self.partitions.iter())
            .map(|p| {
                let agrees = |m: &&Member| {
                    published_definition(&m.routes, &p.name).is_none_or(|d| *d == *p.definition)
                };
                let mut ids: Vec<Arc<str>> = (members.iter())
                    .filter(|m| m.candidate)
                    .filter(agrees)
                    .map(|m| Arc::from(m.id.as_str()))
                    .collect();
                ids.sort();
                ids
            })
            .collect();
        self.members = members;
        self.known = true;
        if candidates == self.candidates
            && alike == self.alike
            && self.preferred.iter().any(Option::is_some)
        {
            return;
        }
        self.grew = candidates.iter().any(|c| !self.candidates.contains(c));
        self.since = now;
        self.candidates = candidates;
        self.alike = alike;
        for (p, alike) in self.partitions.iter().zip(&self.alike) {
            let ids: Vec<&str> = alike.iter().map(|c| &**c).collect();
            let names: Vec<&str> = roles[p.first..p.first + p.count]
                .iter()
                .map(|r| &**r)
                .collect();
            for (k, m) in assign(&names, &ids).into_iter().enumerate() {
                self.preferred[p.first + k] = m.map(|m| alike[m].clone());
            }
        }
    }
}

impl Balancer {
    /// Compares each live member's route-table fingerprint with this
    /// instance's: one WARN per member and difference, and the gauge.
    fn compare_routes(&mut self, mine: &str, members: &[Member]) {
        let mut now = std::collections::BTreeMap::new();
        for m in members {
            let diff = crate::lease::route_differences(mine, &m.routes);
            if diff.is_empty() {
                continue;
            }
            if self.route_differences.get(&m.id) != Some(&diff) {
                tracing::warn!(member = %m.id, differences = %diff.join("; "), "a live member routes differently from this instance; requests for these prefixes may be gated by different roles depending on which gateway they reach. Deploy one route table everywhere (docs/operations.md gives the safe order for moving a prefix)");
            }
            now.insert(m.id.clone(), diff);
        }
        metrics::gauge!(telemetry::ROUTE_MISMATCH).set(now.len() as f64);
        self.route_differences = now;
    }
}

impl HeartbeatLoop {
    /// Writes this instance's presence and reads the live members (one
    /// store call). A failure keeps the previous view: balancing only
    /// decides who claims first, never whether a lease is trusted.
    pub(super) async fn refresh_membership(&mut self) {
        let Some(ttl) = self.balance.as_ref().map(|b| b.ttl) else {
            return;
        };
        let shared = self.shared.clone();
        self.calls_this_tick += 1;
        let (since, horizon) = match self.balance.as_ref() {
            Some(b) => (
                b.cursor.filter(|_| b.since_full < super::RESYNC_EVERY),
                ttl.saturating_sub(shared.tick_every()) / 2,
            ),
            None => return,
        };
        let call = shared.store().presence_changes(
            shared.instance(),
            shared.is_candidate(),
            shared.routes(),
            ttl,
            since,
            horizon,
        );
        let t_sent = Instant::now();
        let result = tokio::time::timeout(shared.op_timeout(), call).await;
        Self::record_latency("presence", t_sent);
        let every = Duration::from_secs(10);
        let changes = match result {
            Ok(Ok(changes)) => changes,
            Ok(Err(e)) => {
                if let Some(b) = self.balance.as_mut() {
                    b.cursor = None;
                }
                // A schema from before the presence record's route column
                // fails here: say so, not only at debug.
                if let Some(suppressed) = self.warnings.admit("presence", every, Instant::now()) {
                    let error = crate::redact::redact_text(&e.to_string());
                    tracing::warn!(%error, suppressed, "writing the presence record failed; partitions are not rebalanced meanwhile (run `rolegate migrate` if the schema is older than this version)");
                }
                return;
            }
            Err(_) => {
                if let Some(b) = self.balance.as_mut() {
                    b.cursor = None;
                }
                return tracing::debug!("presence call timed out");
            }
        };
        let roles: Vec<Arc<str>> = self.roles.iter().map(|r| r.state.name.clone()).collect();
        if let Some(b) = self.balance.as_mut() {
            b.cursor = Some(changes.cursor);
            let mut changed = changes.full;
            if changes.full {
                b.since_full = 0;
                b.known_members.clear();
            } else {
                b.since_full += 1;
            }
            for id in &changes.gone {
                changed |= b.known_members.remove(id).is_some();
            }
            for m in changes.members {
                if b.known_members.get(&m.id) != Some(&m) {
                    changed = true;
                    b.known_members.insert(m.id.clone(), m);
                }
            }
            if changed || !b.known {
                let members: Vec<Member> = b.known_members.values().cloned().collect();
                b.compare_routes(shared.routes(), &members);
                b.update(members, &roles, Instant::now());
            }
        }
    }

    /// Whether a free role `i` may be claimed now: at once by its preferred
    /// holder (or when there is no preference), by anyone else once it has
    /// been free for a renew interval, so balancing never leaves it unheld.
    pub(super) fn may_take_free(&self, i: usize, now: Instant) -> bool {
        let Some(b) = &self.balance else { return true };
        if !b.known || !b.balances(i) {
            return true;
        }
        match &b.preferred[i] {
            None => true,
            Some(p) if p == self.shared.instance_id() => true,
            Some(_) => {
                let wait = self.shared.role(i).timings.renew_interval;
                self.roles[i]
                    .free_since
                    .is_some_and(|t| now.saturating_duration_since(t) >= wait)
            }
        }
    }

    /// One step of the graceful handover: finish the one in progress once
    /// its local work is done (or its drain bound passed), else start one
    /// for a held role preferred elsewhere, if membership has been stable.
    pub(super) async fn hand_over_step(&mut self) {
        let Some(b) = self.balance.as_mut() else {
            return;
        };
        let now = Instant::now();
        if let Some(h) = &b.handover {
            let i = h.idx;
            if self.roles[i].held.is_none() {
                // Lost meanwhile (store outage, expiry): nothing to hand over.
                self.shared.set_handing_over(i, false);
                b.handover = None;
            } else if self.shared.in_flight(i) == 0 || now >= h.until {
                self.finish_handover().await;
            }
            return;
        }
        if !b.known || !self.shared.is_candidate() || self.shared.is_draining() {
            return;
        }
        let me = self.shared.instance_id().clone();
        let stable = |p: &Balanced| now.saturating_duration_since(b.since) >= p.rebalance_delay;
        let surplus = b.partitions.iter().filter(|p| stable(p)).find_map(|p| {
            (p.first..p.first + p.count).find_map(|i| {
                let held = self.roles[i].held.is_some_and(|h| h.published);
                let to = b.preferred[i].as_ref().filter(|to| **to != me)?;
                held.then(|| (i, to.clone(), p.handover_drain))
            })
        });
        let Some((i, to, drain)) = surplus else {
            return;
        };
        // From now on no new local work is admitted under the role.
        self.shared.set_handing_over(i, true);
        let cause = if b.grew { "join" } else { "surplus" };
        tracing::debug!(role = %self.roles[i].state.name, to = %to, cause, "handing a role over to its preferred holder");
        b.handover = Some(Handover {
            idx: i,
            to,
            until: now.checked_add(drain).unwrap_or(now),
            cause,
        });
        // The flag is set before the count is read: with no local work
        // running now, none can start, and the role goes in this same tick.
        if self.shared.in_flight(i) == 0 {
            self.finish_handover().await;
        }
    }

    /// Releases the role being handed over; its preferred holder, woken by
    /// the store's notification, takes it at once.
    async fn finish_handover(&mut self) {
        let Some(h) = self.balance.as_mut().and_then(|b| b.handover.take()) else {
            return;
        };
        let i = h.idx;
        let Some(term) = self.roles[i].held else {
            self.shared.set_handing_over(i, false);
            return;
        };
        let shared = self.shared.clone();
        let name = shared.role(i).name.clone();
        // The drain bound passed with work still running (a stream, a
        // tunnel): it ends now, before the role goes to anyone else.
        let ended = shared.in_flight(i);
        if ended > 0 {
            shared.terms().end(i, term.token, TermEndReason::Handover);
            self.wait_work_ended(&[i]).await;
        }
        // Local belief ends first, and is published, before the store can
        // grant the role to anyone else: as on a graceful stop, the two
        // intervals never overlap. If the release fails, the term is simply
        // abandoned here and expires in the store.
        self.end_term(i, TermEndReason::Handover);
        self.publish();
        self.roles[i].free_since = Some(Instant::now());
        self.shared.set_handing_over(i, false);
        Counters::bump(&shared.counters().release_calls);
        self.calls_this_tick += 1;
        let held = [(name.clone(), term.token)];
        let release = shared.store().release(shared.instance(), &held);
        let result = tokio::time::timeout(shared.op_timeout(), release).await;
        match result {
            Ok(Ok(_)) => {
                metrics::counter!(telemetry::PARTITION_MOVES, "cause" => h.cause).increment(1);
                tracing::info!(role = %name, to = %h.to, cause = h.cause, ended_work = ended, "handed role over");
            }
            Ok(Err(e)) => self.store_failed("release", &e),
            Err(_) => self.store_failed_msg("release", "timed out"),
        }
    }

    /// Counts a role taken because its last holder left the membership.
    pub(super) fn count_takeover(&self, i: usize, last_holder: Option<&Arc<str>>) {
        let Some(b) = &self.balance else { return };
        let gone = last_holder.is_some_and(|h| {
            h != self.shared.instance_id() && !b.candidates.iter().any(|c| c == h)
        });
        if b.balances(i) && gone {
            metrics::counter!(telemetry::PARTITION_MOVES, "cause" => "leave").increment(1);
        }
    }

    /// Held roles of each partition, for the gauge.
    pub(super) fn record_shares(&self) {
        for (name, p) in self.shared.partitions() {
            let first = p.first;
            let held = (first..first + p.count as usize)
                .filter(|&i| self.roles[i].held.is_some())
                .count();
            metrics::gauge!(telemetry::PARTITION_ROLES_HELD, "partition" => name.clone())
                .set(held as f64);
        }
    }
}
