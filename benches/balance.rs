//! Partition-balance benchmark on a real PostgreSQL (run by
//! `scripts/bench --only balance`):
//!
//! 1. time to balance after a join: two members hold a 12-role partition
//!    6/6, a third joins; how long until 4/4/4, against the bound
//!    `rebalance_delay + N/C × renew_interval`;
//! 2. the cost of a graceful move: for every role that moves, how long no
//!    member admits local work for it (polled every millisecond), and what
//!    that gap means in 503s for a client sending 100 requests/s to the role.
//!
//! `cargo bench --bench balance -- --pg URL [--quick] [--json FILE]`

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rolegate::store::{LeaseStore, PostgresStore};
use rolegate::{Coordinator, CoordinatorBuilder, LeaseTimings};

const ROLES: u32 = 12;

fn timings() -> LeaseTimings {
    LeaseTimings {
        duration: Duration::from_secs(3),
        renew_interval: Duration::from_secs(1),
        safety_margin: Duration::from_millis(500),
    }
}

fn member(store: &Arc<dyn LeaseStore>, partition: &str, port: u16) -> Coordinator {
    CoordinatorBuilder::new(store.clone())
        .instance_name("bench")
        .advertise(format!("http://127.0.0.1:{port}"))
        .partition(partition, ROLES, timings())
        .start()
        .expect("coordinator starts")
}

fn shares(cs: &[Coordinator]) -> Vec<usize> {
    let mut out: Vec<usize> = cs.iter().map(|c| c.partitions()[0].held_here()).collect();
    out.sort();
    out
}

/// Who admits local work for partition role `i` right now, if anyone.
fn admitting(cs: &[Coordinator], partition: &str, i: u32) -> Option<usize> {
    cs.iter().position(|c| {
        c.partition(partition)
            .and_then(|p| p.begin_local(i))
            .is_some()
    })
}

struct Run {
    balance_s: f64,
    bound_s: f64,
    /// Per moved role: the gap with no member admitting, in ms.
    gaps_ms: Vec<f64>,
}

async fn one_run(store: &Arc<dyn LeaseStore>, round: u32) -> Run {
    let partition = format!("bench-{}-{round}", std::process::id());
    let mut cs = vec![member(store, &partition, 1), member(store, &partition, 2)];
    let start = Instant::now();
    while shares(&cs) != [6, 6] {
        assert!(start.elapsed() < Duration::from_secs(60), "never 6/6");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Let the two settle, then the third joins.
    tokio::time::sleep(timings().renew_interval * 3).await;
    let mut owner: HashMap<u32, Option<usize>> = (0..ROLES)
        .map(|i| (i, admitting(&cs, &partition, i)))
        .collect();
    let mut gap_start: HashMap<u32, Instant> = HashMap::new();
    let mut gaps_ms = Vec::new();
    cs.push(member(store, &partition, 3));
    let joined = Instant::now();
    let balance_s = loop {
        for i in 0..ROLES {
            let now_owner = admitting(&cs, &partition, i);
            let before = owner.get(&i).copied().flatten();
            match (before, now_owner) {
                (Some(_), None) => {
                    gap_start.entry(i).or_insert_with(Instant::now);
                }
                (_, Some(o)) if before != Some(o) => {
                    if let Some(t) = gap_start.remove(&i) {
                        gaps_ms.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                    owner.insert(i, Some(o));
                }
                _ => {}
            }
            if now_owner.is_none() {
                owner.insert(i, None);
            }
        }
        if shares(&cs) == [4, 4, 4] && gap_start.is_empty() {
            break joined.elapsed().as_secs_f64();
        }
        assert!(joined.elapsed() < Duration::from_secs(120), "never 4/4/4");
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    for c in cs {
        c.shutdown().await;
    }
    let t = timings();
    let bound = t.renew_interval * 2 + t.renew_interval * (ROLES / 3);
    Run {
        balance_s,
        bound_s: bound.as_secs_f64(),
        gaps_ms,
    }
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main]
async fn main() {
    let Some(url) = arg("--pg") else {
        eprintln!("usage: cargo bench --bench balance -- --pg URL [--quick] [--json FILE]");
        std::process::exit(2);
    };
    let quick = std::env::args().any(|a| a == "--quick");
    let table = format!("bench_balance_{}", std::process::id());
    let pg = PostgresStore::connect(&url, &table).await.expect("connect");
    pg.migrate().await.expect("migrate");
    let store: Arc<dyn LeaseStore> = Arc::new(pg);
    let rounds = if quick { 1 } else { 5 };
    let mut runs = Vec::new();
    for round in 0..rounds {
        let run = one_run(&store, round).await;
        eprintln!(
            "round {round}: balanced in {:.2} s (bound {:.1} s), {} moves, gaps {:?} ms",
            run.balance_s,
            run.bound_s,
            run.gaps_ms.len(),
            run.gaps_ms
        );
        runs.push(run);
    }
    let json = serde_json::json!({
        "roles": ROLES,
        "members_after": 3,
        "timings": {"duration_s": 3, "renew_interval_s": 1, "safety_margin_s": 0.5, "rebalance_delay_s": 2},
        "runs": runs.iter().map(|r| serde_json::json!({
            "balance_s": r.balance_s, "bound_s": r.bound_s, "gaps_ms": r.gaps_ms,
        })).collect::<Vec<_>>(),
    });
    match arg("--json") {
        Some(path) => std::fs::write(&path, json.to_string()).expect("write json"),
        None => println!("{json}"),
    }
}
