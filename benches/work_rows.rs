//! Work-row benchmark on a real PostgreSQL (run by `scripts/bench --only work`):
//!
//! 1. claims per second at batch 20 with 1, 4 and 16 workers, beside the
//!    `SELECT … FOR UPDATE SKIP LOCKED` pattern on the same table (all
//!    finalize every row: leased one statement per row, or one `complete_all`
//!    per claim; the work itself is empty, so this is pure overhead);
//! 2. claim latency as the completed history grows from 0 to 1,000,000 rows,
//!    with the partial claim index (and once without it, for contrast).
//!
//! `cargo bench --bench work_rows -- --pg URL [--quick] [--json FILE]`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rolegate::work::{WorkQueue, WorkTable};
use sqlx::postgres::{PgPool, PgPoolOptions};

const BATCH: u32 = 20;
const LEASE: Duration = Duration::from_secs(30);

fn table(name: &str) -> WorkTable {
    WorkTable::new(name)
        .unwrap()
        .eligible("status = 'pending'")
        .order_by(&["run_at"])
        .unwrap()
        .on_claim("attempts = attempts + 1")
        .on_complete("status = 'done'")
}

async fn create(pool: &PgPool, name: &str, pending: u64, done: u64, index: bool) {
    for sql in [
        format!("DROP TABLE IF EXISTS {name}"),
        format!(
            "CREATE TABLE {name} (id bigserial PRIMARY KEY, payload text NOT NULL DEFAULT 'x', \
             status text NOT NULL DEFAULT 'pending', attempts int NOT NULL DEFAULT 0, \
             run_at timestamptz NOT NULL DEFAULT now(), lock_id text, locked_until timestamptz)"
        ),
        format!("INSERT INTO {name} (status) SELECT 'done' FROM generate_series(1, {done})"),
        format!("INSERT INTO {name} (status) SELECT 'pending' FROM generate_series(1, {pending})"),
    ] {
        sqlx::query(&sql).execute(pool).await.unwrap();
    }
    if index {
        let q = WorkQueue::postgres(pool.clone(), table(name));
        let ddl = q
            .claim_index_ddl(&format!("{name}_claim"), "status = 'pending'")
            .unwrap();
        sqlx::query(&ddl).execute(pool).await.unwrap();
    }
    sqlx::query(&format!("VACUUM ANALYZE {name}"))
        .execute(pool)
        .await
        .unwrap();
}

/// Rows per second with `workers` leased-row workers draining `rows` rows;
/// `batched`: one `complete_all` per claim instead of one `complete` per row.
async fn leased(pool: &PgPool, workers: usize, rows: u64, batched: bool) -> (f64, f64) {
    create(pool, "bench_work", rows, 0, true).await;
    let q = WorkQueue::postgres(pool.clone(), table("bench_work"));
    let claims = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let q = q.clone();
        let claims = claims.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let got = q.claim(BATCH, LEASE).await.unwrap().ids();
                if got.is_empty() {
                    return;
                }
                claims.fetch_add(1, Ordering::Relaxed);
                if batched {
                    let ids: Vec<i64> = got.iter().map(|r| r.0).collect();
                    let done = q.complete_all(&ids, &got[0].1).await.unwrap();
                    assert_eq!(done.len(), ids.len());
                } else {
                    for (id, lock) in got {
                        assert!(q.complete(id, &lock).await.unwrap());
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    (
        claims.load(Ordering::Relaxed) as f64 / secs,
        rows as f64 / secs,
    )
}

/// The same with the transaction-held pattern: `FOR UPDATE SKIP LOCKED`,
/// finalize each row, commit.
async fn skip_locked(pool: &PgPool, workers: usize, rows: u64) -> (f64, f64) {
    create(pool, "bench_work", rows, 0, true).await;
    let claims = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let pool = pool.clone();
        let claims = claims.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let mut tx = pool.begin().await.unwrap();
                let ids: Vec<i64> = sqlx::query_scalar(
                    "SELECT id FROM bench_work WHERE status = 'pending' ORDER BY run_at, id \
                     LIMIT 20 FOR UPDATE SKIP LOCKED",
                )
                .fetch_all(&mut *tx)
                .await
                .unwrap();
                if ids.is_empty() {
                    tx.commit().await.unwrap();
                    // Rows may only look absent because others hold them.
                    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM bench_work WHERE status = 'pending'")
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                    if left == 0 {
                        return;
                    }
                    continue;
                }
                claims.fetch_add(1, Ordering::Relaxed);
                for id in ids {
                    sqlx::query("UPDATE bench_work SET status = 'done', attempts = attempts + 1 WHERE id = $1")
                        .bind(id)
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                }
                tx.commit().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    (
        claims.load(Ordering::Relaxed) as f64 / secs,
        rows as f64 / secs,
    )
}

/// Median and p99 claim latency (µs) over `n` claims of 20 from 200 pending
/// rows, each batch released again, with `history` completed rows.
async fn latency(pool: &PgPool, history: u64, n: usize, index: bool) -> (f64, f64) {
    create(pool, "bench_hist", 200, history, index).await;
    let q = WorkQueue::postgres(pool.clone(), table("bench_hist"));
    let mut us = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let got = q.claim(BATCH, LEASE).await.unwrap().ids();
        us.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(got.len(), BATCH as usize);
        for (id, lock) in got {
            q.release(id, &lock).await.unwrap();
        }
    }
    us.sort_by(|a, b| a.total_cmp(b));
    (
        us[us.len() / 2],
        us[(us.len() * 99 / 100).min(us.len() - 1)],
    )
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (mut url, mut json, mut quick) = (None, None, false);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--pg" => url = args.next(),
            "--json" => json = args.next(),
            "--quick" => quick = true,
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    let url = url.expect("--pg URL (a PostgreSQL this benchmark may create tables in)");
    let pool = PgPoolOptions::new()
        .max_connections(20)
        .connect(&url)
        .await
        .unwrap();
    let rows: u64 = if quick { 4_000 } else { 20_000 };
    let mut throughput = Vec::new();
    for workers in [1usize, 4, 16] {
        let (lc, lr) = leased(&pool, workers, rows, false).await;
        let (bc, br) = leased(&pool, workers, rows, true).await;
        let (sc, sr) = skip_locked(&pool, workers, rows).await;
        eprintln!(
            "workers {workers}: leased {lc:.0} claims/s {lr:.0} rows/s; batched {bc:.0} claims/s {br:.0} rows/s; \
             skip locked {sc:.0} claims/s {sr:.0} rows/s"
        );
        throughput.push(serde_json::json!({
            "workers": workers, "leased_claims_s": lc, "leased_rows_s": lr,
            "batched_claims_s": bc, "batched_rows_s": br,
            "skip_locked_claims_s": sc, "skip_locked_rows_s": sr,
        }));
    }
    let histories: &[u64] = if quick {
        &[0, 10_000, 100_000]
    } else {
        &[0, 10_000, 100_000, 1_000_000]
    };
    let n = if quick { 100 } else { 300 };
    let mut growth = Vec::new();
    for &h in histories {
        let (p50, p99) = latency(&pool, h, n, true).await;
        eprintln!("history {h}: claim p50 {p50:.0} µs p99 {p99:.0} µs");
        growth.push(serde_json::json!({"history": h, "index": true, "p50_us": p50, "p99_us": p99}));
    }
    let last = *histories.last().unwrap();
    let (p50, p99) = latency(&pool, last, n / 3, false).await;
    eprintln!("history {last} without the index: claim p50 {p50:.0} µs p99 {p99:.0} µs");
    growth.push(serde_json::json!({"history": last, "index": false, "p50_us": p50, "p99_us": p99}));
    for t in ["bench_work", "bench_hist"] {
        let _ = sqlx::query(&format!("DROP TABLE IF EXISTS {t}"))
            .execute(&pool)
            .await;
    }
    let out = serde_json::json!({"quick": quick, "batch": BATCH, "rows": rows, "claims": n, "throughput": throughput, "growth": growth});
    match json {
        Some(path) => std::fs::write(path, out.to_string()).unwrap(),
        None => println!("{out}"),
    }
}
