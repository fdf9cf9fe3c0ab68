//! The claim step of a tick: one batched call acquires and renews every
//! due role; each answer is applied against the trust window measured from
//! before the call.

use std::collections::HashMap;
use std::time::Instant;

use super::{HeartbeatLoop, HeldTerm};
use crate::lease::state::{Counters, LeaseEvent};
use crate::lease::TermEndReason;
use crate::role::RoleName;
use crate::store::Claim;
use crate::telemetry;

/// What one claim call did, gathered across its roles.
#[derive(Default)]
struct ClaimOutcome {
    tally: OpTally,
    /// (role, token, new deadline) of published terms that were renewed.
    renewed: Vec<(usize, u64, Instant)>,
    /// New terms begun.
    acquired: Vec<(RoleName, u64)>,
    /// Lapsed terms the store still kept, resumed with their token.
    resumed: Vec<(RoleName, u64)>,
}

impl HeartbeatLoop {
    pub(super) async fn claim(&mut self) {
        let shared = self.shared.clone();
        // A term whose deadline passed during the snapshot read fails closed
        // now; this claim offers its token (the store resumes it only if it
        // kept it unexpired).
        self.expire_local(Instant::now());
        let (claims, which) = self.claims_due();
        if claims.is_empty() {
            return;
        }
        let window = which
            .iter()
            .map(|&i| shared.role(i).timings.duration - shared.role(i).timings.safety_margin)
            .min()
            .unwrap_or(shared.op_timeout());
        Counters::bump(&shared.counters().claim_calls);
        self.calls_this_tick += 1;
        let t_sent = Instant::now();
        let result =
            tokio::time::timeout(window, shared.store().claim(shared.instance(), &claims)).await;
        let t_recv = Instant::now();
        Self::record_latency("claim", t_sent);
        let grants = match result {
            Ok(Ok(grants)) => grants,
            Ok(Err(e)) => return self.store_failed("claim", &e),
            Err(_) => return self.store_failed_msg("claim", "timed out"),
        };
        self.store_ok = true;
        let granted: HashMap<&str, u64> =
            grants.iter().map(|g| (g.role.as_str(), g.token)).collect();
        let mut outcome = ClaimOutcome::default();
        for &i in &which {
            let token = granted.get(shared.role(i).name.as_str()).copied();
            self.apply_grant(i, token, (t_sent, t_recv), &mut outcome);
        }
        outcome.tally.emit();
        if !outcome.acquired.is_empty() {
            // One line per tick, not one per role: a start takes every role at once.
            const SHOWN: usize = 8;
            let mut names: Vec<&str> = outcome
                .acquired
                .iter()
                .take(SHOWN)
                .map(|(r, _)| r.as_str())
                .collect();
            if outcome.acquired.len() > SHOWN {
                names.push("...");
            }
            tracing::info!(count = outcome.acquired.len(), roles = %names.join(", "), "acquired roles");
        }
        for (role, token) in &outcome.resumed {
            tracing::info!(%role, token, "the store kept this instance's term through the gap; resumed it (same token)");
        }
        if self.shared.has_hook() {
            for (i, token, until) in outcome.renewed {
                self.emit(LeaseEvent::Renewed {
                    instance: shared.instance_id().clone(),
                    role: shared.role(i).name.as_arc().clone(),
                    token,
                    until,
                });
            }
        }
    }

    /// The roles to claim this tick: every held one (renewal), and, unless
    /// draining (which keeps what it holds but takes nothing new), every
    /// free one whose next attempt is due; a lapsed term's token goes with
    /// its claim, so the store resumes that term if it still keeps it.
    fn claims_due(&self) -> (Vec<Claim>, Vec<usize>) {
        let now = Instant::now();
        let draining = self.shared.is_draining();
        let mut claims = Vec::new();
        let mut which = Vec::new();
        for (i, r) in self.roles.iter().enumerate() {
            let held_token = r.held.map(|h| h.token).or(r.lapsed.map(|l| l.token));
            let free_turn = r.next_attempt <= now && self.may_take_free(i, now);
            // A lapsed term is still this instance's in the store: offered
            // whatever the balance prefers or a drain says (a handover or the
            // stop's release moves it on afterwards), or the role would stay
            // the store's and unserved until it expired.
            if !self.definition_allows(i) {
                // Not this instance's meaning of the partition's keys (or
                // not settled yet): its roles are neither renewed nor taken.
                continue;
            }
            if held_token.is_some() || (!draining && free_turn) {
                let meta = self.shared.role(i);
                claims.push(Claim::renewable(
                    meta.name.clone(),
                    held_token,
                    meta.timings.duration,
                ));
                which.push(i);
            }
        }
        (claims, which)
    }

    /// Applies the store's answer for role `i`: a grant in time renews or
    /// begins a term; a late grant is abandoned; a denial keeps the deadline.
    fn apply_grant(
        &mut self,
        i: usize,
        granted: Option<u64>,
        (t_sent, t_recv): (Instant, Instant),
        outcome: &mut ClaimOutcome,
    ) {
        let shared = self.shared.clone();
        let meta = shared.role(i);
        let trusted_from = self.trusted_from(i, t_sent);
        let deadline = trusted_from + meta.timings.duration - meta.timings.safety_margin;
        if granted.is_some() && self.roles[i].held.is_some_and(|h| h.held_until <= t_recv) {
            // The term's deadline passed while this claim was out: readers
            // stopped trusting it then. It failed closed; if the store kept
            // it, it resumes below as a term of its own (its work before the
            // gap stays ended), never as one unbroken interval.
            self.end_term(i, TermEndReason::FailClose);
        }
        let renewing = self.roles[i].held.is_some();
        match granted {
            Some(token) if t_recv < deadline => {
                outcome.tally.add(renewing, "granted");
                let lapsed = self.roles[i].lapsed.map(|l| l.token);
                match self.roles[i].held {
                    Some(ref mut h) if h.token == token => {
                        h.held_until = deadline;
                        if h.published {
                            outcome.renewed.push((i, token, deadline));
                        }
                    }
                    None if lapsed == Some(token) => {
                        // The store kept the lapsed term: the same term resumes.
                        self.roles[i].lapsed = None;
                        shared.terms().reopen(i, token);
                        self.roles[i].held = Some(HeldTerm {
                            token,
                            held_until: deadline,
                            started: t_recv,
                            published: false,
                        });
                        outcome.resumed.push((meta.name.clone(), token));
                    }
                    _ => {
                        self.roles[i].lapsed = None;
                        // A new term. An older one still believed ends with this publish.
                        self.end_term(i, TermEndReason::Lost);
                        Counters::bump(&shared.counters().term_changes);
                        metrics::counter!(telemetry::TERM_CHANGES, "role" => shared.metric_label(i))
                            .increment(1);
                        self.roles[i].held = Some(HeldTerm {
                            token,
                            held_until: deadline,
                            // Replaced by the publish instant before readers see it.
                            started: t_recv,
                            published: false,
                        });
                        tracing::debug!(role = %meta.name, token, "acquired role");
                        let last = self.roles[i].state.holder.clone();
                        self.count_takeover(i, last.as_ref());
                        outcome.acquired.push((meta.name.clone(), token));
                    }
                }
                let st = &mut self.roles[i].state;
                st.token = token;
                st.holder = Some(shared.instance_id().clone());
                st.holder_address = Some(shared.instance().address.as_str().into());
                st.holder_valid_until = Some(trusted_from + meta.timings.duration);
            }
            Some(token) => {
                // Late: the grant may already be unsafe to act on. Fail closed;
                // the next claim offers the token, and resumes the term if the
                // store still keeps it (else a new one is granted at once).
                Counters::bump(&shared.counters().late_responses);
                outcome.tally.add(renewing, "late");
                tracing::warn!(role = %meta.name, token, late_by = ?t_recv - deadline, "lease grant arrived after its trust window; failing closed until the next claim");
                // A held term becomes lapsed (end_term); a late grant of a
                // term never held here starts a new one at the next claim.
                self.end_term(i, TermEndReason::FailClose);
                self.roles[i].state.token = token;
                self.roles[i].state.holder = Some(shared.instance_id().clone());
            }
            None => {
                // A denied renewal extends nothing, but the last grant's deadline
                // still stands: the store keeps that term at least that long. So a
                // row briefly locked by another claimer costs a renewal, not the
                // role. A newer term elsewhere shows in the next snapshot read.
                outcome.tally.add(renewing, "denied");
                if renewing {
                    tracing::debug!(role = %meta.name, "renewal not applied this tick; keeping the current deadline");
                }
            }
        }
    }
}

/// Lease operation outcomes of one claim, emitted as a few counter updates.
#[derive(Default)]
struct OpTally(HashMap<(&'static str, &'static str), u64>);

impl OpTally {
    fn add(&mut self, renewing: bool, outcome: &'static str) {
        *self
            .0
            .entry((if renewing { "renew" } else { "acquire" }, outcome))
            .or_default() += 1;
    }

    fn emit(self) {
        for ((op, outcome), n) in self.0 {
            metrics::counter!(telemetry::LEASE_OPS, "op" => op, "outcome" => outcome).increment(n);
        }
    }
}
