//! The checker: reads every gateway's event log (typed [`Event`] lines) and
//! the apps' records, and counts violations of the one-holder promise, lost
//! requests, ticks of streams sent after their term's end, and per fault
//! kind the longest time without a holder (and, for the faults of one etcd
//! member, the new terms and 503s they caused).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::support::events::Event;

use super::backend::Store;
use super::harness::{EdgeFault, Execution, Fault, FaultKind, Sent, Streamed};
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
    /// Requests cut because the term of their role ended while they were in
    /// flight (work never outlives its term: at the trust deadline on a
    /// fail-close, at the drain bound on a graceful end).
    pub cut_by_term_end: usize,
    pub lost: Vec<String>,
    /// Stream clients configured (SSE on partition routes).
    pub stream_clients: usize,
    /// Streams opened (answered 200), by how they ended.
    pub streams_ended: BTreeMap<&'static str, usize>,
    /// Stream attempts that got no stream.
    pub streams_refused: usize,
    /// Ticks the stream clients received, each checked.
    pub ticks: usize,
    /// Distinct (role, token) terms the checked ticks were made under.
    pub tick_terms: usize,
    /// Of the ticks with a newer term of their role, the one made closest
    /// before that term began: how long before (ms).
    pub closest_tick_ms: Option<f64>,
    /// Ticks made at or after a newer term of their role began.
    pub ticks_after_term: Vec<String>,
    /// Stream events that were not ticks with a role and a token.
    pub malformed_ticks: Vec<String>,
    /// Faults injected while at least one stream was open, of all faults.
    pub faults_crossing_streams: usize,
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
    streamed: &Streamed,
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
    check_requests(&mut r, sent, edge_faults, &intervals);
    check_ticks(&mut r, &intervals, streamed, faults);
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
/// gateway (or at the gateway it was forwarded to) may have cut it, or a
/// term of its role ended while it was in flight (then the gateway ends it
/// by design).
fn check_requests(
    r: &mut Report,
    sent: &[Sent],
    edge_faults: &[EdgeFault],
    intervals: &[Interval],
) {
    r.requests = sent.len();
    let mut ends: HashMap<&str, Vec<u64>> = HashMap::new();
    for i in intervals {
        ends.entry(&i.role).or_default().push(i.end);
    }
    // The `ended` line follows the cut; the client may see the cut first.
    let slack = 100_000_000;
    for s in sent {
        match s.status {
            Some(200..=299) => r.answered_2xx += 1,
            Some(503) => r.answered_503 += 1,
            Some(400) => r.answered_400 += 1,
            _ => {
                let faulted = edge_faults.iter().any(|(g, a, b)| {
                    *a <= s.end_ns && s.start_ns <= *b && (*g == s.gateway || *g == usize::MAX)
                });
                let term_ended = ends
                    .get(s.role.as_str())
                    .into_iter()
                    .flatten()
                    .any(|&t| s.start_ns <= t && t <= s.end_ns + slack);
                if faulted {
                    r.attributed_to_faulted_edge += 1;
                } else if term_ended {
                    r.cut_by_term_end += 1;
                } else {
                    r.lost.push(format!(
                        "gateway {} {} status {:?} at {} ({} ms)",
                        s.gateway,
                        s.role,
                        s.status,
                        s.start_ns,
                        (s.end_ns - s.start_ns) / 1_000_000
                    ));
                }
            }
        }
    }
}

/// Work never outlives its term: for every tick a client received, no term
/// of its role with a greater token began (in any gateway's log) at or
/// before the moment the app made it. Every `began` line is the start of one
/// interval in `intervals`.
fn check_ticks(r: &mut Report, intervals: &[Interval], streamed: &Streamed, faults: &[Fault]) {
    // role -> (token, began at, instance), by token
    let mut began: HashMap<&str, Vec<(u64, u64, &str)>> = HashMap::new();
    for i in intervals {
        began
            .entry(&i.role)
            .or_default()
            .push((i.token, i.start, &i.instance));
    }
    for list in began.values_mut() {
        list.sort_unstable();
    }
    r.stream_clients = streamed.clients;
    r.streams_refused = streamed.refused;
    for s in &streamed.streams {
        *r.streams_ended.entry(s.3).or_default() += 1;
    }
    r.faults_crossing_streams = faults
        .iter()
        .filter(|f| {
            streamed
                .streams
                .iter()
                .any(|s| s.1 <= f.start_ns && f.start_ns < s.2)
        })
        .count();
    r.ticks = streamed.ticks.len();
    r.malformed_ticks = streamed
        .malformed
        .iter()
        .map(|e| format!("a stream event that is not a tick with a role and a token: {e:?}"))
        .collect();
    let mut terms = std::collections::HashSet::new();
    for tick in &streamed.ticks {
        terms.insert((tick.role.as_str(), tick.token));
        // The earliest begin of a newer term of the role.
        let Some(&(token, at, instance)) = began
            .get(tick.role.as_str())
            .into_iter()
            .flatten()
            .filter(|(token, _, _)| *token > tick.token)
            .min_by_key(|(_, at, _)| *at)
        else {
            continue;
        };
        if tick.made >= at {
            r.ticks_after_term.push(format!(
                "{} made a tick of {} under token {} {:.1} ms after {instance} began token {token} (received through gateway {})",
                tick.app,
                tick.role,
                tick.token,
                (tick.made - at) as f64 / 1e6,
                tick.gateway
            ));
        } else {
            let before = (at - tick.made) as f64 / 1e6;
            r.closest_tick_ms = Some(r.closest_tick_ms.map_or(before, |c: f64| c.min(before)));
        }
    }
    r.tick_terms = terms.len();
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
        "| requests sent | {} (2xx {}, 503 {}, 400 {}, cut by a fault at their own gateway {}, cut by their term's end {}) |\n",
        r.requests,
        r.answered_2xx,
        r.answered_503,
        r.answered_400,
        r.attributed_to_faulted_edge,
        r.cut_by_term_end
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
    out.push_str(&format!("| **lost requests** | **{}** |\n", r.lost.len()));
    let ended: Vec<String> = r
        .streams_ended
        .iter()
        .map(|(how, n)| format!("{how} {n}"))
        .collect();
    out.push_str(&format!(
        "| SSE stream clients on partition routes | {} (streams opened {}: {}; attempts refused {}) |\n",
        r.stream_clients,
        r.streams_ended.values().sum::<usize>(),
        ended.join(", "),
        r.streams_refused
    ));
    out.push_str(&format!(
        "| faults injected while a stream was open | {} of {} |\n",
        r.faults_crossing_streams,
        r.faults.values().map(Vec::len).sum::<usize>()
    ));
    out.push_str(&format!(
        "| stream ticks checked | {} (under {} terms; closest before a newer term began: {}) |\n",
        r.ticks,
        r.tick_terms,
        r.closest_tick_ms
            .map_or("none".to_string(), |ms| format!("{ms:.1} ms"))
    ));
    out.push_str(&format!(
        "| **ticks made after their term's end (a newer term had begun)** | **{}** |\n",
        r.ticks_after_term.len()
    ));
    out.push_str(&format!(
        "| **malformed stream events** | **{}** |\n\n",
        r.malformed_ticks.len()
    ));
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
        .chain(&r.ticks_after_term)
        .chain(&r.malformed_ticks)
        .take(20)
    {
        eprintln!("violation: {v}");
    }
}
