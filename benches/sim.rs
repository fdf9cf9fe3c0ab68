//! Store load with many coordinators, on a real store: C coordinators in
//! this process, one partition of R roles balanced over them (run by
//! `scripts/bench --only sim`, or directly):
//!
//! `cargo bench --bench sim --features etcd -- --store postgres|etcd --url URL
//!  [--coordinators C] [--roles R] [--clients K] [--measure S] [--churn]
//!  [--settle S] [--reads changes|full] [--balance on|off] [--json FILE]`
//!
//! `--balance off` leaves the roles where they fall (the first claims
//! spread them): a steady state at once, where a balanced partition of
//! thousands of roles takes minutes to settle, since a holder hands over one
//! role per tick.
//!
//! `--reads full` makes every read of the lease and presence records a
//! full read (the way before reads of changes), for a baseline in the same
//! run.
//!
//! `--settle` bounds each wait for balance (default 30 s plus a tick per
//! role a member may have to take over).
//!
//! Steady state (after every role is held and each coordinator holds its
//! fair share, and then no term began for three renew intervals, each
//! wait bounded by `--settle`), for `--measure` seconds: the records the store returned per
//! second (rows read) and store calls per second, counted by a wrapper
//! around each coordinator's store; the store server's CPU (every process
//! named `postgres` or `etcd` on this machine, from /proc); claim latency
//! p50 and p99; the process's resident memory per coordinator.
//!
//! With `--churn`: a tenth of the coordinators (at least one) leave and a
//! new one joins in their place, one at a time; for each step the time until
//! the partition is balanced again, and over the whole run the longest time
//! any role had no holder and the terms started. Every run ends with the
//! one-holder check on the believed-held intervals of every role.
//!
//! Each coordinator has a store client of its own, as each instance would
//! (`--clients K` shares K among them instead). A PostgreSQL client keeps one
//! connection for its change feed (`LISTEN`) and up to 4 for calls, so the
//! server's `max_connections` bounds C: `scripts/sim` starts one with 1000.

#[path = "../tests/support/intervals.rs"]
#[allow(dead_code)]
mod intervals;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use rolegate::lease::LeaseEvent;
use rolegate::store::{
    ChangeFeed, Changes, Claim, Cursor, Grant, InstanceInfo, LeaseRecord, LeaseStore, Member,
    MemberChanges, PartitionRecord, RoleName, StoreError,
};
use rolegate::{Coordinator, CoordinatorBuilder, LeaseTimings};

const PARTITION: &str = "sim";

/// One churn step: how long until balanced after the leave, and after the
/// join (`None`: not within the limit).
type Step = (Option<Duration>, Option<Duration>);

fn timings() -> LeaseTimings {
    LeaseTimings {
        duration: Duration::from_secs(3),
        renew_interval: Duration::from_secs(1),
        safety_margin: Duration::from_millis(500),
    }
}

/// What every coordinator's store calls add up to.
#[derive(Default)]
struct Counts {
    calls: AtomicU64,
    rows: AtomicU64,
    /// Of `rows`, the lease records (full reads and reads of changes).
    lease_rows: AtomicU64,
    /// Of `rows`, the presence records.
    presence_rows: AtomicU64,
    /// `--reads full`: every read of the lease and presence records reads
    /// them all.
    full_reads: bool,
    claims_ns: Mutex<Vec<u64>>,
}

/// A store that counts its calls and the records they return.
struct Counting {
    inner: Arc<dyn LeaseStore>,
    counts: Arc<Counts>,
}

impl Counting {
    /// Counts one store call that returned `rows` records.
    fn read<T>(&self, rows: usize, out: T) -> T {
        self.counts.calls.fetch_add(1, Ordering::Relaxed);
        self.counts.rows.fetch_add(rows as u64, Ordering::Relaxed);
        out
    }
}

impl LeaseStore for Counting {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn migrate(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.inner.migrate()
    }
    fn register<'a>(&'a self, roles: &'a [RoleName]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { self.read(0, self.inner.register(roles).await) })
    }
    fn claim<'a>(
        &'a self,
        instance: &'a InstanceInfo,
        claims: &'a [Claim],
    ) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>> {
        Box::pin(async move {
            let sent = Instant::now();
            let out = self.inner.claim(instance, claims).await;
            let ns = sent.elapsed().as_nanos() as u64;
            self.counts.claims_ns.lock().unwrap().push(ns);
            self.read(0, out)
        })
    }
    fn release<'a>(
        &'a self,
        instance: &'a InstanceInfo,
        held: &'a [(RoleName, u64)],
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move { self.read(0, self.inner.release(instance, held).await) })
    }
    fn snapshot<'a>(
        &'a self,
        roles: &'a [RoleName],
    ) -> BoxFuture<'a, Result<Vec<LeaseRecord>, StoreError>> {
        Box::pin(async move {
            let out = self.inner.snapshot(roles).await;
            let rows = out.as_ref().map_or(0, Vec::len);
            self.counts
                .lease_rows
                .fetch_add(rows as u64, Ordering::Relaxed);
            self.read(rows, out)
        })
    }
    fn changes<'a>(
        &'a self,
        roles: &'a [RoleName],
        since: Option<Cursor>,
        horizon: Duration,
    ) -> BoxFuture<'a, Result<Changes, StoreError>> {
        Box::pin(async move {
            let since = since.filter(|_| !self.counts.full_reads);
            let out = self.inner.changes(roles, since, horizon).await;
            let rows = out.as_ref().map_or(0, |c| c.records.len());
            self.counts
                .lease_rows
                .fetch_add(rows as u64, Ordering::Relaxed);
            self.read(rows, out)
        })
    }
    fn subscribe(&self) -> BoxFuture<'_, Result<ChangeFeed, StoreError>> {
        self.inner.subscribe()
    }
    fn presence<'a>(
        &'a self,
        me: &'a InstanceInfo,
        candidate: bool,
        routes: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Member>, StoreError>> {
        Box::pin(async move {
            let out = self.inner.presence(me, candidate, routes, ttl).await;
            let rows = out.as_ref().map_or(0, Vec::len);
            self.counts
                .presence_rows
                .fetch_add(rows as u64, Ordering::Relaxed);
            self.read(rows, out)
        })
    }
    fn presence_changes<'a>(
        &'a self,
        me: &'a InstanceInfo,
        candidate: bool,
        routes: &'a str,
        ttl: Duration,
        since: Option<Cursor>,
        horizon: Duration,
    ) -> BoxFuture<'a, Result<MemberChanges, StoreError>> {
        Box::pin(async move {
            let since = since.filter(|_| !self.counts.full_reads);
            let out = (self.inner)
                .presence_changes(me, candidate, routes, ttl, since, horizon)
                .await;
            let rows = out.as_ref().map_or(0, |c| c.members.len() + c.gone.len());
            self.counts
                .presence_rows
                .fetch_add(rows as u64, Ordering::Relaxed);
            self.read(rows, out)
        })
    }
    fn leave<'a>(&'a self, me: &'a InstanceInfo) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { self.read(0, self.inner.leave(me).await) })
    }
    fn partitions(&self) -> BoxFuture<'_, Result<Vec<PartitionRecord>, StoreError>> {
        Box::pin(async move {
            let out = self.inner.partitions().await;
            let rows = out.as_ref().map_or(0, Vec::len);
            self.read(rows, out)
        })
    }
    fn define_partition<'a>(
        &'a self,
        name: &'a str,
        definition: &'a str,
    ) -> BoxFuture<'a, Result<PartitionRecord, StoreError>> {
        Box::pin(async move { self.read(1, self.inner.define_partition(name, definition).await) })
    }
    fn redefine_partition<'a>(
        &'a self,
        name: &'a str,
        from_epoch: u64,
        definition: &'a str,
        settle: Duration,
    ) -> BoxFuture<'a, Result<Option<PartitionRecord>, StoreError>> {
        Box::pin(async move {
            let out = (self.inner)
                .redefine_partition(name, from_epoch, definition, settle)
                .await;
            self.read(1, out)
        })
    }
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn number(name: &str, default: u64) -> u64 {
    arg(name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} takes a number, got {v}"))
    })
}

async fn open(kind: &str, url: &str, table: &str) -> Arc<dyn LeaseStore> {
    let config = rolegate::store::StoreConfig {
        kind: rolegate::store::StoreKind::from_name(kind)
            .unwrap_or_else(|| panic!("unknown store kind {kind}")),
        url: url.to_string(),
        migrate: true,
        table: table.to_string(),
        ..Default::default()
    };
    rolegate::store::open(&config)
        .await
        .unwrap_or_else(|e| panic!("cannot open the {kind} store at {url}: {e}"))
}

struct Sim {
    clients: Vec<Arc<dyn LeaseStore>>,
    counts: Arc<Counts>,
    events: Arc<Mutex<Vec<LeaseEvent>>>,
    roles: u32,
    /// Whether the partition is balanced.
    balance: bool,
    members: Vec<Coordinator>,
    joined: usize,
}

impl Sim {
    fn join(&mut self) {
        let inner = self.clients[self.joined % self.clients.len()].clone();
        let store = Arc::new(Counting {
            inner,
            counts: self.counts.clone(),
        });
        let events = self.events.clone();
        let mut builder = CoordinatorBuilder::new(store)
            .instance_name(format!("sim{}", self.joined))
            .advertise(format!("http://127.0.0.1:{}", 10_000 + self.joined))
            .partition(PARTITION, self.roles, timings());
        if !self.balance {
            builder = builder.balance(PARTITION, None);
        }
        let c = builder
            .on_lease_event(move |e| {
                if !matches!(e, LeaseEvent::Renewed { .. }) {
                    events.lock().unwrap().push(e);
                }
            })
            .start()
            .expect("coordinator starts");
        self.joined += 1;
        self.members.push(c);
    }

    /// Every role held, each member within one of its fair share (without
    /// balance: every role held).
    fn balanced(&self) -> bool {
        let (roles, n) = (self.roles as usize, self.members.len());
        let (low, high) = (roles / n, roles.div_ceil(n));
        let shares: Vec<usize> = (self.members.iter())
            .map(|c| c.partition(PARTITION).map_or(0, |p| p.held_here()))
            .collect();
        let fair = !self.balance || shares.iter().all(|s| (low..=high).contains(s));
        shares.iter().sum::<usize>() == roles && fair
    }

    /// Terms begun so far.
    fn began(&self) -> usize {
        let events = self.events.lock().unwrap();
        (events.iter())
            .filter(|e| matches!(e, LeaseEvent::Began { .. }))
            .count()
    }

    /// How long until no term began for three renew intervals (the
    /// balance has moved every role to its preferred holder), or `None`
    /// past `limit`.
    async fn until_quiet(&self, limit: Duration) -> Option<Duration> {
        let started = Instant::now();
        let mut seen = self.began();
        while started.elapsed() < limit {
            tokio::time::sleep(timings().renew_interval * 3).await;
            let now = self.began();
            if now == seen {
                return Some(started.elapsed());
            }
            seen = now;
        }
        None
    }

    /// How long until balanced, or `None` past `limit`.
    async fn until_balanced(&self, limit: Duration) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.balanced() {
                return Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }
}

/// CPU seconds used so far by every process named `postgres` or `etcd`.
fn store_cpu_seconds() -> f64 {
    let mut ticks = 0u64;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = &stat[open + 1..close];
        if name != "postgres" && name != "etcd" {
            continue;
        }
        // Fields after the name: state is the 3rd field of the line, utime
        // the 14th and stime the 15th.
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        ticks += field(14).unwrap_or(0) + field(15).unwrap_or(0);
    }
    // USER_HZ, 100 on every Linux this runs on.
    ticks as f64 / 100.0
}

fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1e6
}

#[tokio::main]
async fn main() {
    let (Some(kind), Some(url)) = (arg("--store"), arg("--url")) else {
        eprintln!("usage: cargo bench --bench sim --features etcd -- --store postgres|etcd --url URL [--coordinators C] [--roles R] [--clients K] [--measure S] [--churn] [--settle S] [--reads changes|full] [--balance on|off] [--json FILE]");
        std::process::exit(2);
    };
    let c = number("--coordinators", 10) as usize;
    let roles = number("--roles", 64) as u32;
    let clients = number("--clients", c as u64).max(1) as usize;
    let measure = Duration::from_secs(number("--measure", 10));
    let churn = std::env::args().any(|a| a == "--churn");
    let balance = match arg("--balance").as_deref() {
        None | Some("on") => true,
        Some("off") => false,
        Some(other) => panic!("--balance takes on or off, got {other}"),
    };
    let full_reads = match arg("--reads").as_deref() {
        None | Some("changes") => false,
        Some("full") => true,
        Some(other) => panic!("--reads takes full or changes, got {other}"),
    };
    let table = format!("sim_{}_{}", std::process::id(), roles);
    let mut opened = Vec::new();
    for _ in 0..clients {
        opened.push(open(&kind, &url, &table).await);
    }
    let rss_before = resident_bytes();
    let mut sim = Sim {
        clients: opened,
        counts: Arc::new(Counts {
            full_reads,
            ..Counts::default()
        }),
        events: Arc::new(Mutex::new(Vec::new())),
        roles,
        balance,
        members: Vec::new(),
        joined: 0,
    };
    for _ in 0..c {
        sim.join();
    }
    // A join waits `rebalance_delay` (2 renew intervals) and then moves a
    // share per tick: R/C ticks at most, plus slack for a loaded store.
    let limit = match arg("--settle") {
        Some(s) => Duration::from_secs(s.parse().expect("--settle takes seconds")),
        None => Duration::from_secs(30) + timings().renew_interval * (roles / c as u32 + 10),
    };
    let balanced_in = sim.until_balanced(limit).await;
    let mut report = serde_json::json!({
        "store": kind,
        "coordinators": c,
        "roles": roles,
        "clients": clients,
        "reads": if full_reads { "full" } else { "changes" },
        "balance": balance,
        "balanced_in_s": balanced_in.map(|d| d.as_secs_f64()),
    });
    println!(
        "{kind} C={c} R={roles} clients={clients} reads={} balance={}: balanced in {}",
        if full_reads { "full" } else { "changes" },
        if balance { "on" } else { "off" },
        balanced_in.map_or("— (not within the limit)".to_string(), |d| format!(
            "{d:.1?}"
        ))
    );
    // Balanced by counts, roles may still be moving to their preferred
    // holders: measure once terms stop beginning (or the limit passed).
    let quiet_in = sim.until_quiet(limit).await;
    report["quiet_in_s"] = serde_json::json!(quiet_in.map(|d| d.as_secs_f64()));
    println!(
        "  quiet (no term began for 3 renew intervals) {} later",
        quiet_in.map_or("— (not within the limit)".to_string(), |d| format!(
            "{d:.1?}"
        ))
    );
    // Steady state, quiet or not: the load is what it is.
    sim.counts.calls.store(0, Ordering::Relaxed);
    sim.counts.rows.store(0, Ordering::Relaxed);
    sim.counts.lease_rows.store(0, Ordering::Relaxed);
    sim.counts.presence_rows.store(0, Ordering::Relaxed);
    sim.counts.claims_ns.lock().unwrap().clear();
    let cpu_before = store_cpu_seconds();
    let started = Instant::now();
    tokio::time::sleep(measure).await;
    let secs = started.elapsed().as_secs_f64();
    let cpu = (store_cpu_seconds() - cpu_before) / secs;
    let rows = sim.counts.rows.load(Ordering::Relaxed) as f64 / secs;
    let lease_rows = sim.counts.lease_rows.load(Ordering::Relaxed) as f64 / secs;
    let presence_rows = sim.counts.presence_rows.load(Ordering::Relaxed) as f64 / secs;
    let calls = sim.counts.calls.load(Ordering::Relaxed) as f64 / secs;
    let per_tick = |per_s: f64| per_s / c as f64 * timings().renew_interval.as_secs_f64();
    let mut claims = std::mem::take(&mut *sim.counts.claims_ns.lock().unwrap());
    claims.sort_unstable();
    let rss = resident_bytes().saturating_sub(rss_before) as f64 / c as f64;
    println!(
        "  steady: {rows:.0} rows read/s ({:.1} per coordinator per tick: lease {:.1}, presence {:.1}), {calls:.0} store calls/s, store CPU {:.0} %, claim p50 {:.1} ms p99 {:.1} ms, {:.0} KiB per coordinator",
        per_tick(rows),
        per_tick(lease_rows),
        per_tick(presence_rows),
        cpu * 100.0,
        percentile(&claims, 0.5),
        percentile(&claims, 0.99),
        rss / 1024.0
    );
    report["steady"] = serde_json::json!({
        "rows_read_per_s": rows,
        "rows_per_coordinator_per_tick": per_tick(rows),
        "lease_rows_per_s": lease_rows,
        "lease_rows_per_coordinator_per_tick": per_tick(lease_rows),
        "presence_rows_per_s": presence_rows,
        "presence_rows_per_coordinator_per_tick": per_tick(presence_rows),
        "store_calls_per_s": calls,
        "store_cpu": cpu,
        "claim_p50_ms": percentile(&claims, 0.5),
        "claim_p99_ms": percentile(&claims, 0.99),
        "resident_bytes_per_coordinator": rss,
    });
    let churn_from = Instant::now();
    if churn {
        let mut steps: Vec<Step> = Vec::new();
        for _ in 0..(c / 10).max(1) {
            let leaving = sim.members.remove(0);
            leaving.shutdown().await;
            let left = sim.until_balanced(limit).await;
            sim.join();
            let joined = sim.until_balanced(limit).await;
            steps.push((left, joined));
        }
        let worst = |f: fn(&Step) -> Option<Duration>| {
            steps
                .iter()
                .map(f)
                .try_fold(Duration::ZERO, |m, d| d.map(|d| m.max(d)))
        };
        let (leave, join) = (worst(|s| s.0), worst(|s| s.1));
        println!(
            "  churn: {} leave+join steps, balanced again within {} after a leave, {} after a join",
            steps.len(),
            leave.map_or("— (a step did not balance)".into(), |d| format!(
                "{d:.1?}"
            )),
            join.map_or("— (a step did not balance)".into(), |d| format!(
                "{d:.1?}"
            ))
        );
        report["churn"] = serde_json::json!({
            "steps": steps.len(),
            "balance_after_leave_s": leave.map(|d| d.as_secs_f64()),
            "balance_after_join_s": join.map(|d| d.as_secs_f64()),
        });
    }
    let churn_to = Instant::now();
    // All at once, as a fleet stops: one by one, each release waits on a
    // store the others keep busy.
    futures_util::future::join_all(sim.members.iter().map(|m| m.shutdown())).await;
    sim.members.clear();
    let events = std::mem::take(&mut *sim.events.lock().unwrap());
    let held = intervals::from_events(&events);
    let verdict = intervals::check(&held, intervals::Overlaps::AnyTwo);
    let violations = verdict.overlaps.len() + verdict.token_regressions.len();
    if churn {
        // The longest time a role had no holder before a term begun during
        // the churn, and the terms begun in it (not those of the final stop).
        let mut longest = Duration::ZERO;
        for list in intervals::by_role(&held).values() {
            for pair in list.windows(2) {
                let during = pair[1].start >= churn_from && pair[1].start < churn_to;
                if during && pair[1].start > pair[0].end {
                    longest = longest.max(pair[1].start - pair[0].end);
                }
            }
        }
        // A term that failed closed and resumed with its token is a second
        // interval of the same term.
        let begun: Vec<_> = (held.iter())
            .filter(|h| h.start >= churn_from && h.start < churn_to)
            .collect();
        let terms: std::collections::HashSet<(&str, u64)> =
            begun.iter().map(|h| (h.role.as_str(), h.token)).collect();
        println!(
            "  churn: longest time a role had no holder {longest:.1?}, {} terms started, {} held intervals begun",
            terms.len(),
            begun.len()
        );
        report["churn"]["longest_no_holder_s"] = longest.as_secs_f64().into();
        report["churn"]["terms_started"] = terms.len().into();
        report["churn"]["intervals_begun"] = begun.len().into();
    }
    println!(
        "  one-holder check: {} terms, {violations} violations",
        verdict.terms
    );
    report["terms"] = verdict.terms.into();
    report["violations"] = violations.into();
    if let Some(path) = arg("--json") {
        std::fs::write(&path, report.to_string()).expect("write json");
    }
    if violations > 0 {
        verdict.assert_clean();
    }
}
