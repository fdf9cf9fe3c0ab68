//! The checker: reads every gateway's event log (typed [`Event`] lines) and
//! the apps' records, and counts violations of the one-holder promise, lost
//! requests, and per fault kind the longest time without a holder (and, for
//! the faults of one etcd member, the new terms and 503s they caused).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use rolegate::events::Event;

use super::backend::Store;
use super::harness::{EdgeFault, Execution, Fault, FaultKind, Sent};
use super::{GATEWAYS, PARTITIONS};
use crate::support::intervals::{self, Held, Overlaps};

#[derive(Debug, Default)]
pub struct Report {
    pub transitions: usize,
    /// Held intervals of partition roles (balanced): moves, failovers included.
    pub partition_terms: usize,
    pub overlaps: Vec<String>,
    pub token_regressions: Vec<String>,
    pub admissions: usize,
    pub admissions_outside: Vec<String>,
    pub executions: usize,
    pub stale_executions: Vec<String>,
    pub requests: usize,
    pub answered_2xx: usize,
    pub answered_503: usize,
    pub answered_400: usize,
    pub attributed_to_faulted_edge: usize,
    pub lost: Vec<String>,
    pub faults: BTreeMap<FaultKind, Vec<u64>>,
    pub no_holder_ms: BTreeMap<FaultKind, Vec<u64>>,
    /// Terms begun while a fault of one etcd member lasted.
    pub new_terms: BTreeMap<FaultKind, usize>,
    /// 503 answers to requests sent while a fault of one etcd member lasted.
    pub answered_503_during: BTreeMap<FaultKind, usize>,
}

/// A local admission: (instance, role, token, t_ns).
type Admission = (String, String, u64, u64);

/// A believed-held interval, in nanoseconds on `CLOCK_MONOTONIC`.
type Interval = Held<u64>;

/// Every held interval and admission in the event logs. Lines that do not
/// parse (a line cut by `kill -9`) are skipped.
fn read_events(paths: &[PathBuf]) -> (Vec<Interval>, Vec<Admission>) {
    let mut intervals = Vec::new();
    let mut admits = Vec::new();
    for p in paths {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        // (instance, role, token) -> (start, last known end)
        let mut open: HashMap<(String, String, u64), (u64, u64)> = HashMap::new();
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<Event>(line) else {
                continue;
            };
            match event {
                Event::Began {
                    instance,
                    role,
                    token,
                    t,
                    until,
                } => {
                    open.insert((instance, role, token), (t, until));
                }
                Event::Renewed {
                    instance,
                    role,
                    token,
                    until,
                } => {
                    if let Some(e) = open.get_mut(&(instance, role, token)) {
                        e.1 = e.1.max(until);
                    }
                }
                Event::Ended {
                    instance,
                    role,
                    token,
                    t,
                } => {
                    let key = (instance, role, token);
                    if let Some((start, _)) = open.remove(&key) {
                        intervals.push(Held {
                            instance: key.0,
                            role: key.1,
                            token: key.2,
                            start,
                            end: t,
                        });
                    }
                }
                Event::Admit {
                    instance,
                    role,
                    token,
                    t,
                } => admits.push((instance, role, token, t)),
                Event::Start { .. } => {}
            }
        }
        // Killed processes never wrote `ended`: belief ended at the last deadline.
        for ((instance, role, token), (start, until)) in open {
            intervals.push(Held {
                instance,
                role,
                token,
                start,
                end: until,
            });
        }
    }
    (intervals, admits)
}

/// Every (start time, instance id) of one gateway's log.
fn starts_of(file: &Path) -> Vec<(u64, String)> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter_map(|l| match serde_json::from_str::<Event>(l) {
            Ok(Event::Start { instance, t, .. }) => Some((t, instance)),
            _ => None,
        })
        .collect()
}

/// Which instance id a gateway had at time `t`.
fn instance_at(starts: &[(u64, String)], t: u64) -> Option<String> {
    starts
        .iter()
        .filter(|(at, _)| *at <= t)
        .max_by_key(|(at, _)| *at)
        .map(|(_, id)| id.clone())
}

pub fn check(
    event_files: &[PathBuf],
    executions: &[Execution],
    sent: &[Sent],
    faults: &[Fault],
    edge_faults: &[EdgeFault],
) -> Report {
    let (intervals, admits) = read_events(event_files);
    let verdict = intervals::check(&intervals, Overlaps::AcrossInstances);
    let partition_terms = intervals
        .iter()
        .filter(|i| i.role.contains(":partition-"))
        .count();
    let mut r = Report {
        transitions: verdict.terms,
        partition_terms,
        overlaps: verdict.overlaps,
        token_regressions: verdict.token_regressions,
        ..Report::default()
    };
    check_admissions(&mut r, &intervals, &admits);
    check_executions(&mut r, executions);
    check_requests(&mut r, sent, edge_faults);
    measure_faults(&mut r, &intervals, event_files, faults);
    measure_member_faults(&mut r, &intervals, sent, faults);
    r
}

/// Admissions inside the admitting instance's own interval for that term.
fn check_admissions(r: &mut Report, intervals: &[Interval], admits: &[Admission]) {
    let mut own: HashMap<(&str, &str, u64), Vec<&Interval>> = HashMap::new();
    for i in intervals {
        own.entry((&i.instance, &i.role, i.token))
            .or_default()
            .push(i);
    }
    r.admissions = admits.len();
    for (instance, role, token, t) in admits {
        let inside = own
            .get(&(instance.as_str(), role.as_str(), *token))
            .is_some_and(|v| v.iter().any(|i| i.start <= *t && *t <= i.end));
        if !inside {
            r.admissions_outside
                .push(format!("{instance} admitted {role} token {token} at {t}"));
        }
    }
}

/// Executions carrying an older token than one already executed.
fn check_executions(r: &mut Report, executions: &[Execution]) {
    let mut execs: Vec<&Execution> = executions.iter().collect();
    execs.sort_by_key(|e| e.3);
    r.executions = execs.len();
    let mut max_token: HashMap<&str, (u64, usize, u64)> = HashMap::new();
    for e in execs {
        let (app, role, token, t) = (e.0, e.1.as_str(), e.2, e.3);
        match max_token.get(role) {
            Some(&(m, mapp, mt)) if token < m => r.stale_executions.push(format!(
                "{role}: app{app} executed token {token} {} µs after app{mapp} executed token {m} — admitted by the old holder inside its term, reached its app after the new holder's first execution",
                (t - mt) / 1_000
            )),
            Some(&(m, _, _)) if token == m => {}
            _ => {
                max_token.insert(role, (token, app, t));
            }
        }
    }
}

/// Every request got a response or a clear 503/400, unless a fault at its own
/// gateway (or at the gateway it was forwarded to) may have cut it.
fn check_requests(r: &mut Report, sent: &[Sent], edge_faults: &[EdgeFault]) {
    r.requests = sent.len();
    for s in sent {
        match s.status {
            Some(200..=299) => r.answered_2xx += 1,
            Some(503) => r.answered_503 += 1,
            Some(400) => r.answered_400 += 1,
            _ => {
                let faulted = edge_faults.iter().any(|(g, a, b)| {
                    *a <= s.end_ns && s.start_ns <= *b && (*g == s.gateway || *g == usize::MAX)
                });
                if faulted {
                    r.attributed_to_faulted_edge += 1;
                } else {
                    r.lost.push(format!(
                        "gateway {} status {:?} at {}",
                        s.gateway, s.status, s.start_ns
                    ));
                }
            }
        }
    }
}

/// Per fault: holder faults — the longest time until another instance began
/// holding a role the victim held; store faults — the longest time until
/// every belief of the affected instances that was active at the start ended.
fn measure_faults(
    r: &mut Report,
    intervals: &[Interval],
    event_files: &[PathBuf],
    faults: &[Fault],
) {
    let by_role = intervals::by_role(intervals);
    let starts: Vec<Vec<(u64, String)>> = event_files.iter().map(|f| starts_of(f)).collect();
    for f in faults.iter().filter(|f| !f.kind.is_member()) {
        r.faults
            .entry(f.kind)
            .or_default()
            .push(f.end_ns - f.start_ns);
        let affected: Option<String> = f.target.and_then(|g| instance_at(&starts[g], f.start_ns));
        let mut worst = 0u64;
        for list in by_role.values() {
            let active: Vec<&&Interval> = list
                .iter()
                .filter(|i| i.start <= f.start_ns && f.start_ns < i.end)
                .filter(|i| affected.as_deref().is_none_or(|a| i.instance == a))
                .collect();
            if f.kind.targets_holder() {
                for victim in &active {
                    if let Some(next) = list
                        .iter()
                        .filter(|i| i.instance != victim.instance && i.start >= f.start_ns)
                        .map(|i| i.start)
                        .min()
                    {
                        worst = worst.max(next - f.start_ns);
                    }
                }
            } else {
                for i in &active {
                    worst = worst.max(i.end.saturating_sub(f.start_ns));
                }
            }
        }
        r.no_holder_ms
            .entry(f.kind)
            .or_default()
            .push(worst / 1_000_000);
    }
}

/// Per fault of one etcd member (a majority up): the longest time a role
/// held when it began had no holder before it ended, the terms begun while
/// it lasted, and the 503s answered to requests sent meanwhile.
fn measure_member_faults(r: &mut Report, intervals: &[Interval], sent: &[Sent], faults: &[Fault]) {
    let by_role = intervals::by_role(intervals);
    for f in faults.iter().filter(|f| f.kind.is_member()) {
        r.faults
            .entry(f.kind)
            .or_default()
            .push(f.end_ns - f.start_ns);
        let (a, b) = (f.start_ns, f.end_ns);
        let mut worst = 0u64;
        for list in by_role.values() {
            if !list.iter().any(|i| i.start <= a && a < i.end) {
                continue;
            }
            // Walk the role's intervals (ordered by start): a gap is time
            // inside [a, b] covered by none of them.
            let mut covered_to = a;
            for i in list.iter().filter(|i| i.end > a && i.start < b) {
                if i.start > covered_to {
                    worst = worst.max(i.start - covered_to);
                }
                covered_to = covered_to.max(i.end);
            }
            if covered_to < b {
                worst = worst.max(b - covered_to);
            }
        }
        r.no_holder_ms
            .entry(f.kind)
            .or_default()
            .push(worst / 1_000_000);
        *r.new_terms.entry(f.kind).or_default() += intervals
            .iter()
            .filter(|i| a <= i.start && i.start <= b)
            .count();
        *r.answered_503_during.entry(f.kind).or_default() += sent
            .iter()
            .filter(|s| a <= s.start_ns && s.start_ns <= b && s.status == Some(503))
            .count();
    }
}

fn pct(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    let idx = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[idx]
}

pub fn render(r: &Report, secs: u64, store: Store) -> String {
    let t = store.timings();
    let mut out = String::new();
    if store != Store::Postgres {
        out.push_str(&format!("Store: {}.\n\n", store.name()));
    }
    out.push_str(&format!(
        "Run of {secs} s with {GATEWAYS} gateways, 1 role + {PARTITIONS} partition roles, duration {} ms, renew {} ms, margin {} ms.\n\n",
        t.duration_ms, t.renew_ms, t.margin_ms
    ));
    out.push_str("| measure | value |\n|---|---|\n");
    out.push_str(&format!(
        "| role transitions (held intervals) | {} |\n",
        r.transitions
    ));
    out.push_str(&format!(
        "| of which partition roles (balanced: handovers and failovers) | {} |\n",
        r.partition_terms
    ));
    out.push_str(&format!(
        "| requests sent | {} (2xx {}, 503 {}, 400 {}, cut by a fault at their own gateway {}) |\n",
        r.requests, r.answered_2xx, r.answered_503, r.answered_400, r.attributed_to_faulted_edge
    ));
    out.push_str(&format!(
        "| local admissions checked | {} |\n",
        r.admissions
    ));
    out.push_str(&format!(
        "| **admissions outside a held interval** | **{}** |\n",
        r.admissions_outside.len()
    ));
    out.push_str(&format!(
        "| **overlapping held intervals** | **{}** |\n",
        r.overlaps.len()
    ));
    out.push_str(&format!(
        "| **token regressions** | **{}** |\n",
        r.token_regressions.len()
    ));
    out.push_str(&format!("| executions at apps | {} |\n", r.executions));
    out.push_str(&format!(
        "| stale-token executions (fencing would reject) | {} |\n",
        r.stale_executions.len()
    ));
    out.push_str(&format!("| **lost requests** | **{}** |\n\n", r.lost.len()));
    out.push_str("| fault | injected | longest time without holder (ms) p50 / p99 / max | bound |\n|---|---|---|---|\n");
    for &kind in store.faults() {
        let n = r.faults.get(&kind).map_or(0, |v| v.len());
        let mut v = r.no_holder_ms.get(&kind).cloned().unwrap_or_default();
        let (what, ms) = kind.bound(t);
        let p50 = pct(&mut v, 0.5);
        let p99 = pct(&mut v, 0.99);
        let max = v.iter().copied().max().unwrap_or(0);
        out.push_str(&format!(
            "| {} | {n} | {p50} / {p99} / {max} | {what}: {ms} ms |\n",
            kind.name()
        ));
    }
    let members: Vec<FaultKind> = store
        .faults()
        .iter()
        .copied()
        .filter(|k| k.is_member())
        .collect();
    if !members.is_empty() {
        out.push_str("\n| fault of one member (a majority up) | injected | new terms while it lasted | 503s answered while it lasted |\n|---|---|---|---|\n");
        for kind in members {
            let n = r.faults.get(&kind).map_or(0, |v| v.len());
            let terms = r.new_terms.get(&kind).copied().unwrap_or(0);
            let answered_503 = r.answered_503_during.get(&kind).copied().unwrap_or(0);
            out.push_str(&format!(
                "| {} | {n} | {terms} | {answered_503} |\n",
                kind.name()
            ));
        }
    }
    if !r.stale_executions.is_empty() {
        out.push_str("\nStale-token executions (first 5):\n\n");
        for s in r.stale_executions.iter().take(5) {
            out.push_str(&format!("- {s}\n"));
        }
    }
    out
}

/// Prints the first 20 violations of any kind.
pub fn print_violations(r: &Report) {
    for v in r
        .overlaps
        .iter()
        .chain(&r.token_regressions)
        .chain(&r.admissions_outside)
        .chain(&r.lost)
        .take(20)
    {
        eprintln!("violation: {v}");
    }
}
