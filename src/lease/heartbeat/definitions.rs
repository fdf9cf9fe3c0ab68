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
}

/// What the loop knows of the store's partition definitions.
pub(super) struct Definitions {
    parts: Vec<Part>,
    /// When the last read that answered was sent: partition terms are
    /// trusted from no later than this.
    read_sent: Option<Instant>,
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
            })
            .collect();
        if parts.is_empty() {
            return None;
        }
        parts.sort_by_key(|p| p.first);
        Some(Definitions {
            parts,
            read_sent: None,
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

    /// Reads the recorded definitions (recording this instance's for any
    /// partition that has none yet), and moves each partition's state.
    pub(super) async fn check_definitions(&mut self) {
        if self.definitions.is_none() {
            return;
        }
        let shared = self.shared.clone();
        self.calls_this_tick += 1;
        let t_sent = Instant::now();
        let result = tokio::time::timeout(shared.op_timeout(), shared.store().partitions()).await;
        Self::record_latency("partitions", t_sent);
        let mut records = match result {
            Ok(Ok(records)) => records,
            Ok(Err(e)) => return self.definitions_failed(&e.to_string(), e.is_schema()),
            Err(_) => return self.definitions_failed("timed out", false),
        };
        let missing: Vec<(Arc<str>, Arc<str>)> = (self.definitions.iter())
            .flat_map(|d| d.parts.iter())
            .filter(|p| !records.iter().any(|r| *r.name == *p.view.name))
            .map(|p| (p.view.name.clone(), p.view.configured.clone()))
            .collect();
        for (name, definition) in missing {
            // The first instance to see the partition records it.
            self.calls_this_tick += 1;
            let define = shared.store().define_partition(&name, &definition);
            match tokio::time::timeout(shared.op_timeout(), define).await {
                Ok(Ok(record)) => {
                    if *record.definition == *definition {
                        tracing::info!(partition = %name, %definition, "recorded the partition's definition in the store");
                    }
                    records.push(record);
                }
                Ok(Err(e)) => return self.definitions_failed(&e.to_string(), e.is_schema()),
                Err(_) => return self.definitions_failed("timed out", false),
            }
        }
        let t_recv = Instant::now();
        let mut ended: Vec<usize> = Vec::new();
        let Some(defs) = self.definitions.as_mut() else {
            return;
        };
        defs.read_sent = Some(t_sent);
        for p in &mut defs.parts {
            let Some(record) = records.iter().find(|r| *r.name == *p.view.name) else {
                continue;
            };
            let next = judge(&p.view.configured, record, t_recv);
            let was = std::mem::replace(&mut p.view.state, next.clone());
            let serving = |s: &DefinitionState| matches!(s, DefinitionState::Serving { .. });
            if serving(&was) && was != next {
                ended.extend(p.first..p.first + p.count);
            }
            report(&p.view, &was);
        }
        self.end_redefined(ended).await;
    }

    /// A failed read leaves every partition as it was: its terms stay
    /// trusted only as long as the last read that answered allows.
    fn definitions_failed(&mut self, error: &str, schema: bool) {
        let error = crate::redact::redact_text(error);
        let every = std::time::Duration::from_secs(1);
        let Some(suppressed) = self.warnings.admit("definitions", every, Instant::now()) else {
            return;
        };
        if schema {
            tracing::error!(%error, suppressed, "the store has no partition definitions table; partitions are not served until `rolegate migrate` (or store.migrate: true) adds it");
        } else {
            tracing::warn!(%error, suppressed, "reading the partition definitions failed; partition terms end when the last read's trust runs out");
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
        for &(i, token) in &held {
            shared.terms().end(i, token, TermEndReason::Redefined);
        }
        let idx: Vec<usize> = held.iter().map(|&(i, _)| i).collect();
        self.wait_work_ended(&idx).await;
        for &i in &idx {
            self.end_term(i, TermEndReason::Redefined);
        }
        self.publish();
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

/// How a partition stands against the store's `record`, read at `t_recv`.
fn judge(configured: &str, record: &PartitionRecord, t_recv: Instant) -> DefinitionState {
    if record.definition != configured {
        DefinitionState::Mismatch {
            epoch: record.epoch,
            recorded: record.definition.as_str().into(),
        }
    } else if !record.settling.is_zero() {
        DefinitionState::Settling {
            epoch: record.epoch,
            until: t_recv + record.settling,
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
