//! The definition step of a tick: one read of the partition definitions the
//! store records, before the claim. A partition is claimed only while the
//! store records this instance's definition of it and no change is still
//! settling; otherwise its terms end (their work first) and its roles are
//! released, so a key is never served under two definitions at once.
//!
//! Why that holds: a term of a partition role is trusted only until the
//! send time of the last definition read that confirmed it, plus the
//! trust window `duration - safety_margin` (the claim's own, measured from
//! earlier).
//! A read that confirmed the old definition was sent before the change was
//! written, so every old-definition term ends within one lease duration of
//! the change, on every instance, even one frozen between its read and its
//! claim. The change settles for at least that long (`rolegate partitions
//! resize` waits the longest lease duration), and no instance claims the
//! partition under the new definition before the store says it settled.

use std::sync::Arc;
use std::time::Instant;

use super::HeartbeatLoop;
use crate::lease::snapshot::{DefinitionState, PartitionDefinition};
use crate::lease::TermEndReason;
use crate::role::RoleName;
use crate::store::PartitionRecord;
use crate::telemetry;

/// One partition, as the definition step tracks it.
struct Part {
    view: PartitionDefinition,
    first: usize,
    count: usize,
    /// The lease duration of its roles.
    duration: std::time::Duration,
    /// The record's epoch at the last read (none before the first).
    seen_epoch: Option<u64>,
    /// After a change seen here, not served before then (local clock),
    /// whatever the store says: a second guard on the settle window.
    serve_after: Option<Instant>,
}

/// A partition the store has no record of yet.
struct Missing {
    name: Arc<str>,
    definition: Arc<str>,
    roles: std::ops::Range<usize>,
    duration: std::time::Duration,
}

/// What the loop knows of the store's partition definitions.
pub(super) struct Definitions {
    parts: Vec<Part>,
    /// When the last read that answered was sent: partition terms are
    /// trusted from no later than this.
    read_sent: Option<Instant>,
    /// Partitions the last read found no record of.
    missing: Vec<Missing>,
}

impl Definitions {
    /// The definitions step of a registry, or `None` without partitions.
    pub(super) fn new(shared: &crate::lease::state::LeaseState) -> Option<Definitions> {
        let mut parts: Vec<Part> = shared
            .partitions()
            .map(|(name, meta)| Part {
                view: PartitionDefinition {
                    name: name.as_str().into(),
                    configured: meta.definition.clone(),
                    state: DefinitionState::Unread,
                },
                first: meta.first,
                count: meta.count as usize,
                duration: shared.role(meta.first).timings.duration,
                seen_epoch: None,
                serve_after: None,
            })
            .collect();
        if parts.is_empty() {
            return None;
        }
        parts.sort_by_key(|p| p.first);
        Some(Definitions {
            parts,
            read_sent: None,
            missing: Vec::new(),
        })
    }

    fn part_of(&self, i: usize) -> Option<&Part> {
        self.parts
            .iter()
            .find(|p| (p.first..p.first + p.count).contains(&i))
    }

    /// What the snapshot publishes.
    pub(super) fn views(&self) -> Vec<PartitionDefinition> {
        self.parts.iter().map(|p| p.view.clone()).collect()
    }
}

impl HeartbeatLoop {
    /// Whether role `i` may be claimed: any declared role; a partition role
    /// only while the store records this instance's definition, settled.
    pub(super) fn definition_allows(&self, i: usize) -> bool {
        let Some(defs) = &self.definitions else {
            return true;
        };
        match defs.part_of(i) {
            None => true,
            Some(p) => matches!(p.view.state, DefinitionState::Serving { .. }),
        }
    }

    /// The instant a grant of role `i`, whose claim was sent at `t_sent`,
    /// is trusted from: for a partition role, no later than the send time
    /// of the last definition read.
    pub(super) fn trusted_from(&self, i: usize, t_sent: Instant) -> Instant {
        match &self.definitions {
            Some(defs) if defs.part_of(i).is_some() => {
                defs.read_sent.map_or(t_sent, |r| r.min(t_sent))
            }
            _ => t_sent,
        }
    }

    /// Reads the recorded definitions and moves each recorded partition's
    /// state; partitions with no record yet wait for
    /// [`define_missing`](Self::define_missing), after the snapshot read.
    pub(super) async fn check_definitions(&mut self) {
        if self.definitions.is_none() {
            return;
        }
        let shared = self.shared.clone();
        self.calls_this_tick += 1;
        let t_sent = Instant::now();
        let result = tokio::time::timeout(shared.op_timeout(), shared.store().partitions()).await;
        Self::record_latency("partitions", t_sent);
        let records = match result {
            Ok(Ok(records)) => records,
            Ok(Err(e)) => return self.definitions_failed(&e.to_string(), e.is_schema()),
            Err(_) => return self.definitions_failed("timed out", false),
        };
        if let Some(defs) = self.definitions.as_mut() {
            defs.read_sent = Some(t_sent);
            defs.missing = (defs.parts.iter())
                .filter(|p| !records.iter().any(|r| *r.name == *p.view.name))
                .map(|p| Missing {
                    name: p.view.name.clone(),
                    definition: p.view.configured.clone(),
                    roles: p.first..p.first + p.count,
                    duration: p.duration,
                })
                .collect();
        }
        self.apply_records(&records).await;
    }

    /// Records this instance's definition of each partition the store had
    /// none of, now that the lease table was read in this tick: if any role
    /// of the partition has a live holder (a record lost or restored,
    /// instances of an older version), the record settles for a lease
    /// duration first.
    pub(super) async fn define_missing(&mut self) {
        let Some(defs) = self.definitions.as_mut() else {
            return;
        };
        let missing = std::mem::take(&mut defs.missing);
        if missing.is_empty() || !self.read_ok {
            return;
        }
        let shared = self.shared.clone();
        let mut records = Vec::new();
        for m in missing {
            let now = Instant::now();
            let held = m.roles.clone().any(|i| {
                let st = &self.roles[i].state;
                st.holder.is_some() && st.holder_valid_until.is_some_and(|t| t > now)
            });
            self.calls_this_tick += 1;
            let t_define = Instant::now();
            let store = shared.store();
            let (name, definition) = (&*m.name, &*m.definition);
            let define = async {
                if held {
                    let r = store.redefine_partition(name, 0, definition, m.duration);
                    match r.await? {
                        Some(record) => Ok(record),
                        // Recorded meanwhile by another instance: read it.
                        None => store.define_partition(name, definition).await,
                    }
                } else {
                    store.define_partition(name, definition).await
                }
            };
            let result = tokio::time::timeout(shared.op_timeout(), define).await;
            Self::record_latency("define_partition", t_define);
            match result {
                Ok(Ok(record)) => {
                    if record.definition == definition {
                        tracing::info!(partition = %name, %definition, settling = ?record.settling, "recorded the partition's definition in the store");
                    }
                    records.push(record);
                }
                Ok(Err(e)) => return self.definitions_failed(&e.to_string(), e.is_schema()),
                Err(_) => return self.definitions_failed("timed out", false),
            }
        }
        self.apply_records(&records).await;
    }

    /// Moves the state of each partition `records` names; ends the terms
    /// of those that stopped being served, and releases what the store
    /// still gives this instance of partitions not served here.
    async fn apply_records(&mut self, records: &[PartitionRecord]) {
        let shared = self.shared.clone();
        let t_recv = Instant::now();
        let mut ended: Vec<usize> = Vec::new();
        let Some(defs) = self.definitions.as_mut() else {
            return;
        };
        for p in &mut defs.parts {
            let Some(record) = records.iter().find(|r| *r.name == *p.view.name) else {
                continue;
            };
            if p.seen_epoch.is_some_and(|e| e != record.epoch) {
                // A change seen here: every term of the previous record ends
                // within a lease duration of it, on every instance.
                p.serve_after = Some(t_recv + p.duration);
            }
            p.seen_epoch = Some(record.epoch);
            let next = judge(&p.view.configured, record, t_recv, p.serve_after);
            let was = std::mem::replace(&mut p.view.state, next.clone());
            let serving = |s: &DefinitionState| matches!(s, DefinitionState::Serving { .. });
            if serving(&was) && was != next {
                ended.extend(p.first..p.first + p.count);
            }
            report(&p.view, &was);
        }
        // Roles of a partition not served here that the store still gives
        // this instance without a local term (a release that failed, a late
        // grant): released, or on etcd the instance's lease would keep them.
        let me = shared.instance_id().clone();
        let leftovers: Vec<(RoleName, u64)> = (defs.parts.iter())
            .filter(|p| {
                matches!(
                    p.view.state,
                    DefinitionState::Mismatch { .. } | DefinitionState::Settling { .. }
                )
            })
            .flat_map(|p| p.first..p.first + p.count)
            .filter(|&i| !ended.contains(&i))
            .filter(|&i| self.roles[i].held.is_none())
            .filter(|&i| self.roles[i].state.holder.as_ref() == Some(&me))
            .map(|i| (shared.role(i).name.clone(), self.roles[i].state.token))
            .collect();
        self.end_redefined(ended).await;
        if !leftovers.is_empty() {
            self.calls_this_tick += 1;
            let call = shared.store().release(shared.instance(), &leftovers);
            if let Ok(Ok(released)) = tokio::time::timeout(shared.op_timeout(), call).await {
                for r in released {
                    if let Some(i) = shared.index_of(&r) {
                        self.roles[i].state.holder = None;
                    }
                }
            }
        }
    }

    /// A failed read leaves every partition as it was: its terms stay
    /// trusted only as long as the last read that answered allows.
    fn definitions_failed(&mut self, error: &str, schema: bool) {
        metrics::counter!(telemetry::STORE_ERRORS, "op" => "partitions").increment(1);
        let error = crate::redact::redact_text(error);
        let every = std::time::Duration::from_secs(1);
        let Some(suppressed) = self.warnings.admit("definitions", every, Instant::now()) else {
            return;
        };
        if schema {
            tracing::error!(%error, suppressed, "the store has no partition definitions table; partitions are not served until `rolegate migrate` (or store.migrate: true) adds it");
        } else {
            tracing::warn!(%error, suppressed, "reading or recording the partition definitions failed; partition terms end when the last read's trust runs out");
        }
    }

    /// Ends the terms of roles whose partition left `Serving`: their work
    /// first, then local belief (published), then the store's record.
    async fn end_redefined(&mut self, roles: Vec<usize>) {
        let held: Vec<(usize, u64)> = roles
            .iter()
            .filter_map(|&i| self.roles[i].held.map(|h| (i, h.token)))
            .collect();
        for &i in &roles {
            // A lapsed token of the old definition must not be resumed.
            self.roles[i].lapsed = None;
        }
        if held.is_empty() {
            return;
        }
        let shared = self.shared.clone();
        let idx: Vec<usize> = held.iter().map(|&(i, _)| i).collect();
        for &(i, token) in &held {
            // No new local work from now on, then the running work ends.
            shared.set_handing_over(i, true);
            shared.terms().end(i, token, TermEndReason::Redefined);
        }
        self.wait_work_ended(&idx).await;
        for &i in &idx {
            self.end_term(i, TermEndReason::Redefined);
        }
        self.publish();
        for &i in &idx {
            shared.set_handing_over(i, false);
        }
        let release: Vec<(RoleName, u64)> = held
            .iter()
            .map(|&(i, token)| (shared.role(i).name.clone(), token))
            .collect();
        self.calls_this_tick += 1;
        let call = shared.store().release(shared.instance(), &release);
        match tokio::time::timeout(shared.op_timeout(), call).await {
            Ok(Ok(released)) => {
                tracing::info!(
                    count = released.len(),
                    "released the roles of a redefined partition"
                )
            }
            Ok(Err(e)) => self.store_failed("release", &e),
            Err(_) => self.store_failed_msg("release", "timed out"),
        }
    }
}

/// How a partition stands against the store's `record`, read at `t_recv`;
/// it is not served before `serve_after` either.
fn judge(
    configured: &str,
    record: &PartitionRecord,
    t_recv: Instant,
    serve_after: Option<Instant>,
) -> DefinitionState {
    let until = Some(t_recv + record.settling).max(serve_after);
    if record.definition != configured {
        DefinitionState::Mismatch {
            epoch: record.epoch,
            recorded: record.definition.as_str().into(),
        }
    } else if let Some(until) = until.filter(|u| *u > t_recv) {
        DefinitionState::Settling {
            epoch: record.epoch,
            until,
        }
    } else {
        DefinitionState::Serving {
            epoch: record.epoch,
        }
    }
}

/// One log line per change of a partition's standing, and the gauge.
fn report(view: &PartitionDefinition, was: &DefinitionState) {
    let name = &view.name;
    let configured = &view.configured;
    let mismatch = matches!(view.state, DefinitionState::Mismatch { .. });
    metrics::gauge!(telemetry::PARTITION_MISMATCH, "partition" => name.to_string())
        .set(if mismatch { 1.0 } else { 0.0 });
    let same_epoch = |a: &DefinitionState, b: &DefinitionState| epoch(a) == epoch(b);
    if std::mem::discriminant(was) == std::mem::discriminant(&view.state)
        && same_epoch(was, &view.state)
    {
        return;
    }
    match &view.state {
        DefinitionState::Mismatch { epoch, recorded } => tracing::error!(
            partition = %name,
            %configured,
            %recorded,
            epoch,
            "this instance's definition of the partition differs from the one the store records; it neither holds nor serves the partition's roles (503 partition-mismatch). Deploy the recorded definition, or change the record with `rolegate partitions resize` and then deploy the new one everywhere"
        ),
        DefinitionState::Settling { epoch, until } => tracing::info!(
            partition = %name,
            %configured,
            epoch,
            settles_in = ?until.saturating_duration_since(Instant::now()),
            "the partition's recorded definition changed; serving it once the change settles (every term of the previous definition has ended by then)"
        ),
        DefinitionState::Serving { epoch } if !matches!(was, DefinitionState::Unread) => {
            tracing::info!(partition = %name, %configured, epoch, "serving the partition under its recorded definition")
        }
        _ => {}
    }
}

fn epoch(s: &DefinitionState) -> u64 {
    match s {
        DefinitionState::Unread => 0,
        DefinitionState::Settling { epoch, .. }
        | DefinitionState::Serving { epoch }
        | DefinitionState::Mismatch { epoch, .. } => *epoch,
    }
}
