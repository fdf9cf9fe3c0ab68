//! An outbox worker on leased work rows (`rolegate::work::Worker`), for
//! PostgreSQL or SQLite: the handler "delivers" a row; the worker claims as
//! slots free up, renews each running row's lease, completes it, retries a
//! failed one later, and marks it dead after 10 attempts. Run several
//! copies against one table; kill or pause any of them: every row is still
//! delivered, and a worker that stalled past its lease learns it lost its
//! rows.
//!
//! ```text
//! cargo run --example outbox_worker -- --db sqlite:///tmp/outbox.db --setup 100
//! cargo run --example outbox_worker -- --db sqlite:///tmp/outbox.db --name w1 &
//! cargo run --example outbox_worker -- --db sqlite:///tmp/outbox.db --name w2 &
//! ```
//!
//! Flags: `--db URL` (`postgres://…` or `sqlite://PATH`), `--table NAME`
//! (default `outbox`), `--setup N` (create the table and its claim index,
//! insert N rows, exit), `--name NAME`, `--batch N` (rows at once, 20),
//! `--lease-ms N` (5000), `--work-ms N` (10, per row), `--log FILE` (one JSON
//! line per claim and finalize), `--exit-when-empty`.

use std::io::Write;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rolegate::work::{Job, JobError, Outcome, WorkQueue, WorkTable, Worker};

struct Args {
    db: String,
    table: String,
    setup: Option<u32>,
    name: String,
    batch: u32,
    lease: Duration,
    work: Duration,
    log: Option<std::fs::File>,
    exit_when_empty: bool,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        db: "sqlite://outbox.db".into(),
        table: "outbox".into(),
        setup: None,
        name: format!("worker-{}", std::process::id()),
        batch: 20,
        lease: Duration::from_secs(5),
        work: Duration::from_millis(10),
        log: None,
        exit_when_empty: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--db" => a.db = value()?,
            "--table" => a.table = value()?,
            "--setup" => a.setup = Some(value()?.parse()?),
            "--name" => a.name = value()?,
            "--batch" => a.batch = value()?.parse()?,
            "--lease-ms" => a.lease = Duration::from_millis(value()?.parse()?),
            "--work-ms" => a.work = Duration::from_millis(value()?.parse()?),
            "--log" => {
                a.log = Some(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(value()?)?,
                )
            }
            "--exit-when-empty" => a.exit_when_empty = true,
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    Ok(a)
}

/// The table, for either database: `status`, `attempts` and `run_at` are the
/// app's own columns; `lock_id` and `locked_until` are the two it adds.
fn table(name: &str, postgres: bool) -> anyhow::Result<WorkTable> {
    let now = if postgres {
        "clock_timestamp()"
    } else {
        "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
    };
    Ok(WorkTable::new(name)?
        .eligible(&format!("status = 'pending' AND run_at <= {now}"))
        .order_by(&["run_at"])?
        .attempts("attempts")?
        .on_complete("status = 'done'")
        .on_fail("run_at", None)?
        .on_dead("status = 'dead'"))
}

async fn setup(q: &Queue, rows: u32, table: &str) -> anyhow::Result<()> {
    let ddl = match q {
        Queue::Pg(..) => format!(
            "CREATE TABLE IF NOT EXISTS {table} (id bigserial PRIMARY KEY, payload text NOT NULL, \
             status text NOT NULL DEFAULT 'pending', attempts int NOT NULL DEFAULT 0, \
             run_at timestamptz NOT NULL DEFAULT now(), partition_no int NOT NULL DEFAULT 0, \
             lock_id text, locked_until timestamptz)"
        ),
        Queue::Lite(..) => format!(
            "CREATE TABLE IF NOT EXISTS {table} (id INTEGER PRIMARY KEY, payload TEXT NOT NULL, \
             status TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0, \
             run_at INTEGER NOT NULL DEFAULT 0, partition_no INTEGER NOT NULL DEFAULT 0, \
             lock_id TEXT, locked_until INTEGER)"
        ),
    };
    let index = q
        .queue()
        .claim_index_ddl(&format!("{table}_claim"), "status = 'pending'")?;
    let insert = match q {
        Queue::Pg(..) => format!(
            "INSERT INTO {table} (payload) SELECT 'message ' || n FROM generate_series(1, {rows}) AS n"
        ),
        Queue::Lite(..) => format!(
            "INSERT INTO {table} (payload) WITH RECURSIVE c(n) AS \
             (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < {rows}) SELECT 'message ' || n FROM c"
        ),
    };
    for stmt in [ddl, index, insert] {
        match q {
            Queue::Pg(pool, _) => {
                sqlx::query(&stmt).execute(pool).await?;
            }
            Queue::Lite(pool, _) => {
                sqlx::query(&stmt).execute(pool).await?;
            }
        }
    }
    Ok(())
}

enum Queue {
    Pg(sqlx::PgPool, WorkQueue),
    Lite(sqlx::SqlitePool, WorkQueue),
}

impl Queue {
    fn queue(&self) -> &WorkQueue {
        match self {
            Queue::Pg(_, q) | Queue::Lite(_, q) => q,
        }
    }
}

/// One JSON line per event, one write each, so a kill -9 never leaves half
/// a line.
fn log(file: &Option<Arc<Mutex<std::fs::File>>>, line: serde_json::Value) {
    if let Some(f) = file {
        let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let a = args()?;
    let postgres = a.db.starts_with("postgres");
    let t = table(&a.table, postgres)?;
    let q = if postgres {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&a.db)
            .await?;
        Queue::Pg(pool.clone(), WorkQueue::postgres(pool, t))
    } else {
        let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&a.db)?
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(opts)
            .await?;
        Queue::Lite(pool.clone(), WorkQueue::sqlite(pool, t))
    };
    if let Some(rows) = a.setup {
        setup(&q, rows, &a.table).await?;
        println!("created {} with {rows} rows", a.table);
        return Ok(());
    }
    let queue = q.queue().clone();
    let logfile = a.log.map(|f| Arc::new(Mutex::new(f)));
    let (name, work) = (a.name.clone(), a.work);

    // The handler: deliver the row. Every 97th message fails once and is
    // retried after a short delay.
    let handler = {
        let (logfile, name) = (logfile.clone(), name.clone());
        move |job: Job| {
            let (logfile, name) = (logfile.clone(), name.clone());
            async move {
                log(
                    &logfile,
                    serde_json::json!({"ev": "claim", "worker": name, "id": job.id, "lock": &*job.lock_id}),
                );
                let _payload: String = job.get("payload")?;
                tokio::time::sleep(work).await; // the delivery
                if job.id % 97 == 0 && job.attempt == Some(1) {
                    return Err(JobError::retry_after(
                        Duration::from_millis(100),
                        "the remote end refused",
                    ));
                }
                Ok(())
            }
        }
    };
    let worker = Worker::new(queue.clone())
        .concurrency(a.batch as usize)
        .lease(a.lease)
        .max_attempts(10)
        .idle_poll(Duration::from_millis(20), Duration::from_millis(200))
        .on_finalize({
            let (logfile, name) = (logfile.clone(), name.clone());
            move |f| {
                let ev = match f.outcome {
                    Outcome::Completed => "complete",
                    Outcome::Failed => "fail",
                    Outcome::Dead => "dead",
                    Outcome::Lost => "lost",
                    Outcome::Released => "released",
                    // `Outcome` may grow: a later version can add outcomes.
                    _ => "other",
                };
                let ok = f.outcome != Outcome::Lost;
                log(
                    &logfile,
                    serde_json::json!({"ev": ev, "worker": name, "id": f.id, "lock": &*f.lock_id, "ok": ok}),
                );
            }
        });
    // Stop on SIGTERM or Ctrl-C, or (with --exit-when-empty) once nothing
    // was claimable for two leases.
    let exit_when_empty = a.exit_when_empty;
    let lease = a.lease;
    let stop = async move {
        let empty = async {
            if !exit_when_empty {
                return std::future::pending().await;
            }
            let mut since = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                match queue.depth(None).await {
                    Ok((0, _)) if since.elapsed() > lease * 2 => return,
                    Ok((0, _)) => {}
                    _ => since = Instant::now(),
                }
            }
        };
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = empty => {}
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let report = worker.run(handler, stop).await?;
    eprintln!("{name}: {report:?}");
    Ok(())
}
