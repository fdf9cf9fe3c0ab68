//! The worker loop over leased work rows, against real PostgreSQL and
//! SQLite: every row once, leases renewed under long work, retries with
//! backoff and dead rows, a lost lease cancelling its handler, a graceful
//! stop giving rows back, PostgreSQL notifications waking an idle worker,
//! enqueue and prune, role affinity following a move, and the metrics.

mod support;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rolegate::store::{LeaseStore, MemoryStore};
use rolegate::work::{
    Backoff, Finalized, Job, JobError, Outcome, Value, WorkQueue, WorkTable, Worker, WorkerReport,
};
use rolegate::{CoordinatorBuilder, LeaseTimings};
use tokio::sync::oneshot;

enum Db {
    Pg(sqlx::PgPool),
    Lite(sqlx::SqlitePool, #[allow(dead_code)] tempfile::TempDir),
}

impl Db {
    async fn pg() -> Db {
        Db::Pg(
            sqlx::PgPool::connect(&support::postgres_url())
                .await
                .unwrap(),
        )
    }

    async fn lite() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("work.db").display());
        let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&url)
            .unwrap()
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await
            .unwrap();
        Db::Lite(pool, dir)
    }

    fn pg_kind(&self) -> bool {
        matches!(self, Db::Pg(_))
    }

    async fn exec(&self, sql: &str) {
        match self {
            Db::Pg(p) => sqlx::query(sql).execute(p).await.map(|_| ()),
            Db::Lite(p, _) => sqlx::query(sql).execute(p).await.map(|_| ()),
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    async fn int(&self, sql: &str) -> i64 {
        match self {
            Db::Pg(p) => sqlx::query_scalar::<_, i64>(sql).fetch_one(p).await,
            Db::Lite(p, _) => sqlx::query_scalar::<_, i64>(sql).fetch_one(p).await,
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    fn now(&self) -> &'static str {
        if self.pg_kind() {
            "clock_timestamp()"
        } else {
            "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
        }
    }

    /// A fresh outbox table with `rows` pending rows; its name.
    async fn outbox(&self, tag: &str, rows: u32) -> String {
        let table = support::unique_table(tag);
        let ddl = if self.pg_kind() {
            format!(
                "CREATE TABLE {table} (id bigserial PRIMARY KEY, payload text NOT NULL DEFAULT '', \
                 status text NOT NULL DEFAULT 'pending', attempts int NOT NULL DEFAULT 0, \
                 run_at timestamptz NOT NULL DEFAULT now(), partition_no int NOT NULL DEFAULT 0, \
                 dedupe text UNIQUE, lock_id text, locked_until timestamptz, meta jsonb)"
            )
        } else {
            format!(
                "CREATE TABLE {table} (id INTEGER PRIMARY KEY, payload TEXT NOT NULL DEFAULT '', \
                 status TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0, \
                 run_at INTEGER NOT NULL DEFAULT 0, partition_no INTEGER NOT NULL DEFAULT 0, \
                 dedupe TEXT UNIQUE, lock_id TEXT, locked_until INTEGER, meta TEXT)"
            )
        };
        self.exec(&ddl).await;
        for i in 0..rows {
            self.exec(&format!(
                "INSERT INTO {table} (payload, partition_no) VALUES ('message {i}', {})",
                i % 2
            ))
            .await;
        }
        table
    }

    fn queue(&self, table: &str) -> WorkQueue {
        self.queue_with(table, |t| t)
    }

    /// The queue of `queue`, its table shaped further by `shape`.
    fn queue_with(&self, table: &str, shape: impl FnOnce(WorkTable) -> WorkTable) -> WorkQueue {
        let t = WorkTable::new(table)
            .unwrap()
            .eligible(&format!("status = 'pending' AND run_at <= {}", self.now()))
            .order_by(&["run_at"])
            .unwrap()
            .attempts("attempts")
            .unwrap()
            .on_complete("status = 'done'")
            .on_fail("run_at", None)
            .unwrap()
            .on_dead("status = 'dead'")
            .partition_column("partition_no")
            .unwrap();
        let t = shape(t);
        match self {
            Db::Pg(p) => WorkQueue::postgres(p.clone(), t),
            Db::Lite(p, _) => WorkQueue::sqlite(p.clone(), t),
        }
    }
}

/// Runs `worker` with `handler` in the background; the sender stops it.
/// Sends its message when dropped: tells a test a handler's future was.
struct OnDrop(
    tokio::sync::mpsc::UnboundedSender<&'static str>,
    &'static str,
);

impl Drop for OnDrop {
    fn drop(&mut self) {
        let _ = self.0.send(self.1);
    }
}

fn spawn<H, F>(
    worker: Worker,
    handler: H,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<WorkerReport, rolegate::work::WorkError>>,
)
where
    H: Fn(Job) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Result<(), JobError>> + Send + 'static,
{
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(worker.run(handler, async move {
        let _ = rx.await;
    }));
    (tx, task)
}

async fn wait_rows(db: &Db, what: &str, sql: &str, want: i64) {
    support::wait_for_async(what, Duration::from_secs(30), || async {
        db.int(sql).await == want
    })
    .await;
}

/// Two workers of 8 slots each drain 200 rows: each row's handler runs
/// once, every row ends done, and the reports add up.
async fn every_row_runs_once(db: Db) {
    let table = db.outbox("wk_once", 200).await;
    let runs: Arc<Mutex<HashMap<i64, usize>>> = Arc::default();
    let handler = |runs: Arc<Mutex<HashMap<i64, usize>>>| {
        move |job: Job| {
            let runs = runs.clone();
            async move {
                let payload: String = job.get("payload")?;
                assert!(payload.starts_with("message "));
                *runs.lock().unwrap().entry(job.id).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
                Ok(())
            }
        }
    };
    let worker = || Worker::new(db.queue(&table)).concurrency(8);
    let (stop_a, a) = spawn(worker(), handler(runs.clone()));
    let (stop_b, b) = spawn(worker(), handler(runs.clone()));
    let done = format!("SELECT count(*) FROM {table} WHERE status = 'done'");
    wait_rows(&db, "every row done", &done, 200).await;
    let _ = (stop_a.send(()), stop_b.send(()));
    let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 200);
    assert!(runs.values().all(|n| *n == 1), "a row ran twice: {runs:?}");
    assert_eq!(a.completed + b.completed, 200, "{a:?} {b:?}");
    assert_eq!(a.claimed + b.claimed, 200, "{a:?} {b:?}");
    assert_eq!(a.lost + b.lost + a.failed + b.failed, 0, "{a:?} {b:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_runs_once_on_postgres() {
    every_row_runs_once(Db::pg().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_runs_once_on_sqlite() {
    every_row_runs_once(Db::lite().await).await;
}

/// Work four times longer than the lease: the lease is renewed while the
/// handler runs, so a second worker polling all along never gets the rows.
async fn long_work_is_renewed_and_runs_once(db: Db) {
    let table = db.outbox("wk_long", 4).await;
    let runs: Arc<Mutex<HashMap<i64, usize>>> = Arc::default();
    let handler = |runs: Arc<Mutex<HashMap<i64, usize>>>| {
        move |job: Job| {
            let runs = runs.clone();
            async move {
                *runs.lock().unwrap().entry(job.id).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(4_000)).await;
                Ok(())
            }
        }
    };
    // Long enough that a busy machine's scheduling delays (renewals are
    // due every third of it) do not look like a lost lease.
    let lease = Duration::from_millis(1_000);
    let worker = || {
        Worker::new(db.queue(&table))
            .concurrency(4)
            .lease(lease)
            .idle_poll(Duration::from_millis(20), Duration::from_millis(50))
    };
    let (stop_a, a) = spawn(worker(), handler(runs.clone()));
    // The second starts once the first holds every row.
    let locked = format!("SELECT count(*) FROM {table} WHERE lock_id IS NOT NULL");
    wait_rows(&db, "the first worker holds every row", &locked, 4).await;
    let (stop_b, b) = spawn(worker(), handler(runs.clone()));
    let done = format!("SELECT count(*) FROM {table} WHERE status = 'done'");
    wait_rows(&db, "every row done", &done, 4).await;
    let _ = (stop_a.send(()), stop_b.send(()));
    let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
    let runs = runs.lock().unwrap().clone();
    assert!(runs.values().all(|n| *n == 1), "a row ran twice: {runs:?}");
    assert_eq!((a.completed, b.claimed), (4, 0), "{a:?} {b:?}");
    let attempts = format!("SELECT CAST(max(attempts) AS BIGINT) FROM {table}");
    assert_eq!(db.int(&attempts).await, 1, "no row was claimed twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_work_is_renewed_and_runs_once_on_postgres() {
    long_work_is_renewed_and_runs_once(Db::pg().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_work_is_renewed_and_runs_once_on_sqlite() {
    long_work_is_renewed_and_runs_once(Db::lite().await).await;
}

/// A row whose handler always fails is retried after the backoff and is
/// dead after its third attempt; a row its handler discards is dead after
/// one. `on_finalize` reports each end.
async fn failures_retry_then_die(db: Db) {
    let table = db.outbox("wk_fail", 2).await;
    type Ends = Mutex<Vec<(i64, Option<u32>, Outcome)>>;
    let ends: Arc<Ends> = Arc::default();
    let worker = Worker::new(db.queue(&table))
        .max_attempts(3)
        .backoff(Backoff {
            base: Duration::from_millis(50),
            factor: 2.0,
            max: Duration::from_secs(1),
            jitter: 0.0,
        })
        .idle_poll(Duration::from_millis(10), Duration::from_millis(20))
        .on_finalize({
            let ends = ends.clone();
            move |f: &Finalized| ends.lock().unwrap().push((f.id, f.attempt, f.outcome))
        });
    let runs: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = runs.clone();
    let (stop, task) = spawn(worker, move |job: Job| {
        let seen = seen.clone();
        async move {
            if job.id == 1 {
                seen.lock().unwrap().push(Instant::now());
                Err(JobError::retry("the remote end refused"))
            } else {
                Err(JobError::discard("this message can never be sent"))
            }
        }
    });
    let dead = format!("SELECT count(*) FROM {table} WHERE status = 'dead'");
    wait_rows(&db, "both rows dead", &dead, 2).await;
    let _ = stop.send(());
    let report = task.await.unwrap().unwrap();
    assert_eq!((report.failed, report.dead), (2, 2), "{report:?}");
    let attempts = |id| format!("SELECT CAST(attempts AS BIGINT) FROM {table} WHERE id = {id}");
    assert_eq!(db.int(&attempts(1)).await, 3);
    assert_eq!(db.int(&attempts(2)).await, 1);
    let ends = ends.lock().unwrap().clone();
    let of = |id| -> Vec<(Option<u32>, Outcome)> {
        ends.iter()
            .filter(|e| e.0 == id)
            .map(|e| (e.1, e.2))
            .collect()
    };
    assert_eq!(
        of(1),
        [
            (Some(1), Outcome::Failed),
            (Some(2), Outcome::Failed),
            (Some(3), Outcome::Dead)
        ]
    );
    assert_eq!(of(2), [(Some(1), Outcome::Dead)]);
    // Each retry waited its backoff (50 ms, then 100 ms; no jitter). The
    // retry time is kept in whole milliseconds (truncated) and SQLite's
    // clock counts them, so a retry may come up to 1 ms early by this
    // process's clock (99.94 ms was seen on SQLite); never more.
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 3);
    let gaps = [runs[1] - runs[0], runs[2] - runs[1]];
    assert!(
        gaps[0] >= Duration::from_millis(49) && gaps[1] >= Duration::from_millis(99),
        "{gaps:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_retry_then_die_on_postgres() {
    failures_retry_then_die(Db::pg().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_retry_then_die_on_sqlite() {
    failures_retry_then_die(Db::lite().await).await;
}

/// Another lock on the row (its lease expired and it was claimed again):
/// the next renewal finds it, the handler's token is cancelled and its
/// future dropped, nothing is written, and the end is reported lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_cancels_the_handler() {
    let db = Db::pg().await;
    let table = db.outbox("wk_lost", 1).await;
    let (seen_tx, seen_rx) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
    let ends: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let worker = Worker::new(db.queue(&table))
        .lease(Duration::from_millis(300))
        .on_finalize({
            let ends = ends.clone();
            move |f: &Finalized| ends.lock().unwrap().push(f.outcome)
        });
    let (stop, task) = spawn(worker, move |job: Job| {
        let seen = seen_tx.clone();
        async move {
            let _ = seen.send("started");
            let _dropped = OnDrop(seen.clone(), "dropped");
            // Tells the test once the token fires (a task of its own, since
            // this future is dropped at that moment).
            let cancel = job.cancel.clone();
            let told = seen.clone();
            tokio::spawn(async move {
                cancel.cancelled().await;
                let _ = told.send("cancelled");
            });
            std::future::pending::<()>().await;
            Ok(())
        }
    });
    let mut seen = seen_rx;
    assert_eq!(seen.recv().await, Some("started"));
    // Claimed by someone else, for long: this worker may not take it back.
    let far = match &db {
        Db::Pg(_) => "now() + interval '1 hour'",
        Db::Lite(..) => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + 3600000",
    };
    db.exec(&format!(
        "UPDATE {table} SET lock_id = 'someone else', locked_until = {far}"
    ))
    .await;
    // The token fires and the handler's future is dropped, in either order.
    let mut got = Vec::new();
    for _ in 0..2 {
        let next = tokio::time::timeout(Duration::from_secs(10), seen.recv()).await;
        got.push(next.ok().flatten());
    }
    got.sort();
    assert_eq!(got, [Some("cancelled"), Some("dropped")]);
    let _ = stop.send(());
    let report = task.await.unwrap().unwrap();
    assert_eq!(report.lost, 1, "{report:?}");
    assert_eq!(*ends.lock().unwrap(), [Outcome::Lost]);
    let row = format!(
        "SELECT count(*) FROM {table} WHERE status = 'pending' AND lock_id = 'someone else'"
    );
    assert_eq!(db.int(&row).await, 1, "the new owner's row is untouched");
}

/// A renewal that hangs (another transaction holds the row's lock) is a
/// lost lease once the lease runs out: the handler's token is cancelled
/// then, not when the database answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_hangs_past_the_lease_cancels_the_handler() {
    let db = Db::pg().await;
    let table = db.outbox("wk_hang", 1).await;
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
    let worker = Worker::new(db.queue(&table)).lease(Duration::from_millis(600));
    let (stop, task) = spawn(worker, move |job: Job| {
        let seen = seen_tx.clone();
        async move {
            let _ = seen.send("started");
            let cancel = job.cancel.clone();
            let told = seen.clone();
            tokio::spawn(async move {
                cancel.cancelled().await;
                let _ = told.send("cancelled");
            });
            std::future::pending::<()>().await;
            Ok(())
        }
    });
    assert_eq!(seen.recv().await, Some("started"));
    // Hold the row's lock: every renewal waits on it.
    let Db::Pg(pool) = &db else { unreachable!() };
    let mut holder = pool.begin().await.unwrap();
    sqlx::query(&format!("SELECT id FROM {table} FOR UPDATE"))
        .fetch_all(&mut *holder)
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), seen.recv()).await;
    assert_eq!(
        got,
        Ok(Some("cancelled")),
        "cancelled while the renewal hung"
    );
    holder.rollback().await.unwrap();
    let _ = stop.send(());
    let report = task.await.unwrap().unwrap();
    assert_eq!(report.lost, 1, "{report:?}");
}

/// A stop with handlers still running past the grace: they are cancelled
/// and dropped, and their rows given back, claimable at once.
async fn a_stop_gives_running_rows_back(db: Db) {
    let table = db.outbox("wk_stop", 3).await;
    let worker = Worker::new(db.queue(&table))
        .lease(Duration::from_secs(60))
        .grace(Duration::from_millis(200));
    let (dropped, mut drops) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
    let (stop, task) = spawn(worker, move |_job: Job| {
        let dropped = dropped.clone();
        async move {
            let _dropped = OnDrop(dropped, "dropped");
            std::future::pending::<()>().await;
            Ok(())
        }
    });
    let locked = format!("SELECT count(*) FROM {table} WHERE lock_id IS NOT NULL");
    wait_rows(&db, "every row running", &locked, 3).await;
    let _ = stop.send(());
    let report = task.await.unwrap().unwrap();
    assert_eq!(report.released, 3, "{report:?}");
    // Every handler was dropped by the time `run` returned.
    let mut n = 0;
    while drops.try_recv().is_ok() {
        n += 1;
    }
    assert_eq!(n, 3, "handlers dropped");
    assert_eq!(db.int(&locked).await, 0);
    let again = db
        .queue(&table)
        .claim(10, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        again.len(),
        3,
        "claimable at once, not after the 60 s lease"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_gives_running_rows_back_on_postgres() {
    a_stop_gives_running_rows_back(Db::pg().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_gives_running_rows_back_on_sqlite() {
    a_stop_gives_running_rows_back(Db::lite().await).await;
}

/// An idle worker that polls only every 10 minutes wakes on a
/// notification: from `enqueue().notify(..)`, and from the trigger of
/// `notify_trigger_ddl` on a plain INSERT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_wake_an_idle_worker_on_postgres() {
    let db = Db::pg().await;
    let table = db.outbox("wk_wake", 0).await;
    let channel = format!("{table}_wake");
    let q = db.queue(&table);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<i64>();
    let long = Duration::from_secs(600);
    // One slot: no claim runs while a job does. Each job waits for the test
    // to let it finish.
    let worker = Worker::new(q.clone())
        .concurrency(1)
        .idle_poll(long, long)
        .listen(&channel);
    let finish = Arc::new(tokio::sync::Semaphore::new(0));
    let go = finish.clone();
    let (stop, task) = spawn(worker, move |job: Job| {
        let (tx, go) = (tx.clone(), go.clone());
        async move {
            let _ = tx.send(job.id);
            go.acquire().await.unwrap().forget();
            Ok(())
        }
    });
    // Idle once it listens: its first claim (sent as it started, before
    // the LISTEN connection) found nothing, and the next poll is 10 min away.
    let Db::Pg(pool) = &db else { unreachable!() };
    let listening =
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' || $1 || '%'";
    let started = Instant::now();
    loop {
        let n: i64 = sqlx::query_scalar(listening)
            .bind(&channel)
            .fetch_one(pool)
            .await
            .unwrap();
        if n > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the worker never listened"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let id = q
        .enqueue()
        .set("payload", "hello")
        .notify(&channel)
        .execute()
        .await
        .unwrap()
        .expect("inserted");
    let got = tokio::time::timeout(Duration::from_secs(60), rx.recv()).await;
    assert_eq!(got, Ok(Some(id)), "woken by enqueue's notification");
    // While the job runs, no claim does: the first to finish after this
    // moment is the one that follows the job.
    let ran: String = sqlx::query_scalar("SELECT clock_timestamp()::text")
        .fetch_one(pool)
        .await
        .unwrap();
    finish.add_permits(1);
    sqlx::raw_sql(&q.notify_trigger_ddl(&channel).unwrap())
        .execute(pool)
        .await
        .unwrap();
    // The claim that follows the finished job must have found nothing
    // before the next row arrives (else that claim, not the trigger, would
    // pick it up): a connection whose last statement is a claim, finished
    // after the job ran.
    let claimed_after = "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle' \
         AND query LIKE '%SKIP LOCKED%' AND query LIKE '%' || $2 || '%' \
         AND state_change > $1::timestamptz";
    support::wait_for_async(
        "the claim after the job",
        Duration::from_secs(30),
        || async {
            let n: i64 = sqlx::query_scalar(claimed_after)
                .bind(&ran)
                .bind(&table)
                .fetch_one(pool)
                .await
                .unwrap();
            n > 0
        },
    )
    .await;
    db.exec(&format!("INSERT INTO {table} (payload) VALUES ('plain')"))
        .await;
    let got = tokio::time::timeout(Duration::from_secs(60), rx.recv()).await;
    assert!(
        matches!(got, Ok(Some(n)) if n > id),
        "woken by the trigger: {got:?}"
    );
    finish.add_permits(1);
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// `enqueue` skips a duplicate of its unique column and delays a row by
/// the database clock; `prune` deletes old finished rows, never live ones.
async fn enqueue_and_prune(db: Db) {
    let table = db.outbox("wk_enq", 0).await;
    let q = db.queue(&table);
    let first = q
        .enqueue()
        .set("payload", "a")
        .set("dedupe", "order-7")
        .unique_on("dedupe")
        .execute()
        .await
        .unwrap();
    assert!(first.is_some());
    let again = q
        .enqueue()
        .set("payload", "b")
        .set("dedupe", "order-7")
        .unique_on("dedupe")
        .execute()
        .await
        .unwrap();
    assert_eq!(again, None, "a duplicate is skipped");
    // NULL goes into a column of any type; JSON into a jsonb column.
    let later = q
        .enqueue()
        .set("payload", "later")
        .set("locked_until", Value::Null)
        .set("meta", Value::Json(r#"{"order": 7}"#.into()))
        .run_after("run_at", Duration::from_secs(3600))
        .execute()
        .await
        .unwrap()
        .unwrap();
    let order = if db.pg_kind() {
        format!("SELECT (meta->>'order')::bigint FROM {table} WHERE id = {later}")
    } else {
        format!("SELECT json_extract(meta, '$.order') FROM {table} WHERE id = {later}")
    };
    assert_eq!(db.int(&order).await, 7);
    let claimed = q.claim(10, Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        claimed.ids().len(),
        1,
        "the delayed row is not eligible yet"
    );
    let (id, lock) = claimed.ids()[0].clone();
    assert_eq!(Some(id), first);
    assert!(q.complete(id, &lock).await.unwrap());
    let (depth, _) = q.depth(Some("run_at")).await.unwrap();
    assert_eq!(depth, 0, "nothing claimable now");
    // The finished row goes; the pending (delayed) one stays.
    let gone = q
        .prune("status IN ('done', 'dead')", "run_at", Duration::ZERO, 100)
        .await
        .unwrap();
    assert_eq!(gone, 1);
    assert_eq!(db.int(&format!("SELECT count(*) FROM {table}")).await, 1);
    assert!(q
        .enqueue()
        .set("no such; column", 1)
        .execute()
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_and_prune_on_postgres() {
    enqueue_and_prune(Db::pg().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_and_prune_on_sqlite() {
    enqueue_and_prune(Db::lite().await).await;
}

/// A worker following a partition runs nothing while another instance
/// holds the partition's roles, and every row once they move to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_worker_follows_the_roles() {
    let db = Db::pg().await;
    let table = db.outbox("wk_part", 20).await;
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let timings = LeaseTimings {
        duration: Duration::from_millis(900),
        renew_interval: Duration::from_millis(150),
        safety_margin: Duration::from_millis(300),
    };
    let coordinator = |name: &str| {
        CoordinatorBuilder::new(store.clone())
            .instance_name(name)
            .advertise(format!("http://{name}"))
            .partition("outbox", 2, timings)
            .balance("outbox", None)
            .start()
            .unwrap()
    };
    let other = coordinator("other");
    other.ready(Duration::from_secs(5)).await.unwrap();
    support::wait_for(
        "the other instance holds both roles",
        Duration::from_secs(5),
        || other.partition("outbox").unwrap().held_here() == 2,
    )
    .await;
    let here = coordinator("here");
    here.ready(Duration::from_secs(5)).await.unwrap();
    let runs = Arc::new(Mutex::new(0usize));
    let worker = Worker::new(db.queue(&table))
        .partition(here.partition("outbox").unwrap())
        .idle_poll(Duration::from_millis(20), Duration::from_millis(50));
    let (stop, task) = spawn(worker, {
        let runs = runs.clone();
        move |_job: Job| {
            let runs = runs.clone();
            async move {
                *runs.lock().unwrap() += 1;
                Ok(())
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(*runs.lock().unwrap(), 0, "no role held here: no row runs");
    other.shutdown().await;
    let done = format!("SELECT count(*) FROM {table} WHERE status = 'done'");
    wait_rows(&db, "every row done after the move", &done, 20).await;
    let _ = stop.send(());
    let report = task.await.unwrap().unwrap();
    assert_eq!(report.completed, 20);
    here.shutdown().await;
}

/// The worker's metrics reach whatever `metrics` recorder the app
/// installed (here the Prometheus exporter the gateway uses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_reports_its_metrics() {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    let db = Db::lite().await;
    let table = db.outbox("wk_metrics", 5).await;
    let (stop, task) = spawn(Worker::new(db.queue(&table)), |job: Job| async move {
        if job.id == 5 {
            return Err(JobError::discard("bad row"));
        }
        Ok(())
    });
    let finished = format!("SELECT count(*) FROM {table} WHERE status <> 'pending'");
    wait_rows(&db, "every row finished", &finished, 5).await;
    // Depth is sampled every 5 s while the worker runs.
    let started = Instant::now();
    let depth = format!("rolegate_work_queue_depth{{queue=\"{table}\"}} 0");
    while !handle.render().lines().any(|l| l == depth) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{depth} never sampled"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = stop.send(());
    task.await.unwrap().unwrap();
    let text = handle.render();
    // Whole lines: `... 5` must not be matched by `... 50`.
    for want in [
        format!("rolegate_work_claimed_total{{queue=\"{table}\"}} 5"),
        format!("rolegate_work_completed_total{{queue=\"{table}\"}} 4"),
        format!("rolegate_work_dead_total{{queue=\"{table}\"}} 1"),
    ] {
        assert!(
            text.lines().any(|l| l == want),
            "{want} missing from:\n{text}"
        );
    }
    let claims = format!("rolegate_work_claim_seconds_count{{queue=\"{table}\"}} ");
    assert!(
        text.lines().any(|l| l.starts_with(&claims)),
        "{claims} missing from:\n{text}"
    );
}

/// A `run()` future that is dropped (a `select!` that took another branch,
/// a timeout) stops what it started: its LISTEN connection and its
/// queue-depth sampler end with it, so no connection and no task is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_run_future_leaves_no_listen_connection_and_no_task() {
    let db = Db::pg().await;
    let table = db.outbox("wk_drop", 0).await;
    let channel = format!("{table}_drop");
    let q = db.queue(&table);
    let long = Duration::from_secs(600);
    let Db::Pg(pool) = &db else { unreachable!() };
    let listening =
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' || $1 || '%'";
    let count = || async {
        sqlx::query_scalar::<_, i64>(listening)
            .bind(&channel)
            .fetch_one(pool)
            .await
            .unwrap()
    };
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let before = tasks();
    let worker = Worker::new(q.clone())
        .idle_poll(long, long)
        .listen(&channel);
    // Never stopped: only dropped.
    let run = tokio::spawn(worker.run(|_job: Job| async { Ok(()) }, std::future::pending()));
    support::wait_for_async("the worker listens", Duration::from_secs(30), || async {
        count().await > 0
    })
    .await;
    assert!(tasks() > before + 1, "the worker's helpers run");
    run.abort();
    let _ = run.await;
    support::wait_for_async(
        "the LISTEN connection gone",
        Duration::from_secs(30),
        || async { count().await == 0 },
    )
    .await;
    support::wait_for("no task left", Duration::from_secs(30), || {
        tasks() <= before
    })
    .await;
}

/// A claim answered after its lease ran out (here it waited on a table
/// lock; to the worker a process paused while its claim was in flight is
/// the same) never starts its handler: the row is given back unrun, then
/// claimed again and run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_answered_after_its_lease_is_given_back_unrun() {
    let db = Db::pg().await;
    let table = db.outbox("wk_late", 1).await;
    let Db::Pg(pool) = &db else { unreachable!() };
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query(&format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
        .execute(&mut *blocker)
        .await
        .unwrap();
    let outcomes: Arc<Mutex<Vec<(Outcome, String)>>> = Arc::default();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let lease = Duration::from_secs(1);
    let worker = Worker::new(db.queue(&table)).lease(lease).on_finalize({
        let outcomes = outcomes.clone();
        move |f: &Finalized| (outcomes.lock().unwrap()).push((f.outcome, f.lock_id.to_string()))
    });
    let (stop, task) = spawn(worker, {
        let runs = runs.clone();
        move |_job: Job| {
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            }
        }
    });
    // The worker's claim waits on the lock ...
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND query LIKE '%SKIP LOCKED%' AND query LIKE '%' || $1 || '%'";
    support::wait_for_async(
        "the claim waits on the lock",
        Duration::from_secs(30),
        || async {
            let n: i64 = sqlx::query_scalar(waiting)
                .bind(&table)
                .fetch_one(pool)
                .await
                .unwrap();
            n > 0
        },
    )
    .await;
    // ... until well past its lease: its answer comes too late to run on.
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    blocker.commit().await.unwrap();
    let done = format!("SELECT count(*) FROM {table} WHERE status = 'done'");
    wait_rows(&db, "the row done", &done, 1).await;
    let _ = stop.send(());
    let report = task.await.unwrap().unwrap();
    // The late claim was given back, and another claim (another lock id)
    // ran the row, once. (The two reports may come in either order: the
    // second claim can finish before the first's report is made.)
    let mut outcomes = outcomes.lock().unwrap().clone();
    outcomes.sort_by_key(|(o, _)| *o == Outcome::Completed);
    assert!(
        matches!(&outcomes[..], [(Outcome::Released, a), (Outcome::Completed, b)] if a != b),
        "given back unrun, then run once under another claim: {outcomes:?} {report:?}"
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!((report.released, report.completed), (1, 1), "{report:?}");
    let attempts = format!("SELECT CAST(max(attempts) AS BIGINT) FROM {table}");
    assert_eq!(db.int(&attempts).await, 2, "claimed twice, run once");
}

/// A worker that listens on an app pool of one connection still claims and
/// finishes rows: its LISTEN connection is its own, not the pool's one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listening_worker_on_a_pool_of_one_still_claims() {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&support::postgres_url())
        .await
        .unwrap();
    let db = Db::Pg(pool.clone());
    let table = db.outbox("wk_one", 0).await;
    let channel = format!("{table}_wake");
    let worker = Worker::new(db.queue(&table))
        .idle_poll(Duration::from_millis(50), Duration::from_millis(200))
        .listen(&channel);
    let (stop, task) = spawn(worker, |_job: Job| async { Ok(()) });
    let listening =
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' || $1 || '%'";
    support::wait_for_async("the worker listens", Duration::from_secs(30), || async {
        let n: i64 = sqlx::query_scalar(listening)
            .bind(&channel)
            .fetch_one(&pool)
            .await
            .unwrap();
        n > 0
    })
    .await;
    for i in 0..5 {
        db.exec(&format!("INSERT INTO {table} (payload) VALUES ('row {i}')"))
            .await;
    }
    let done = format!("SELECT count(*) FROM {table} WHERE status = 'done'");
    wait_rows(&db, "every row done while the worker listens", &done, 5).await;
    let _ = stop.send(());
    let report = task.await.unwrap().unwrap();
    assert_eq!(report.completed, 5, "{report:?}");
}

/// Rows a listening worker gives back at its stop are announced on its
/// channel, so the other workers take them at once rather than at their
/// next idle poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_given_back_wake_the_listening_workers() {
    let db = Db::pg().await;
    let table = db.outbox("wk_back", 2).await;
    let channel = format!("{table}_wake");
    let Db::Pg(pool) = &db else { unreachable!() };
    let mut heard = sqlx::postgres::PgListener::connect_with(pool)
        .await
        .unwrap();
    heard.listen(&channel).await.unwrap();
    let worker = Worker::new(db.queue(&table))
        .lease(Duration::from_secs(60))
        .grace(Duration::from_millis(100))
        .listen(&channel);
    let (stop, task) = spawn(worker, |_job: Job| async {
        std::future::pending::<()>().await;
        Ok(())
    });
    let locked = format!("SELECT count(*) FROM {table} WHERE lock_id IS NOT NULL");
    wait_rows(&db, "both rows running", &locked, 2).await;
    let _ = stop.send(());
    let report = task.await.unwrap().unwrap();
    assert_eq!(report.released, 2, "{report:?}");
    let note = tokio::time::timeout(Duration::from_secs(30), heard.recv()).await;
    assert!(
        matches!(&note, Ok(Ok(n)) if n.channel() == channel),
        "the give-back was announced on {channel}: {note:?}"
    );
}

/// Per-key limits: 8 workers of 2 slots drain 300 rows of 50 keys, each
/// key's 6 rows next to each other in queue order, under `fifo_key`. No two rows of one key ever run at once (each handler
/// counts its key's running rows as it starts), every row runs once, and
/// each key's rows start in queue order.
async fn one_row_per_key_runs_at_a_time(db: Db) {
    let table = db.outbox("wk_key", 0).await;
    for i in 0..300 {
        db.exec(&format!(
            "INSERT INTO {table} (payload) VALUES ('key-{}')",
            i / 6
        ))
        .await;
    }
    #[derive(Default)]
    struct Seen {
        running: HashMap<String, usize>,
        overlaps: Vec<String>,
        starts: HashMap<String, Vec<i64>>,
    }
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let handler = |seen: Arc<Mutex<Seen>>| {
        move |job: Job| {
            let seen = seen.clone();
            async move {
                let key: String = job.get("payload")?;
                {
                    let mut s = seen.lock().unwrap();
                    let n = s.running.entry(key.clone()).or_default();
                    *n += 1;
                    if *n > 1 {
                        let n = *n;
                        s.overlaps
                            .push(format!("{key}: {n} running as row {} started", job.id));
                    }
                    s.starts.entry(key.clone()).or_default().push(job.id);
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
                *seen.lock().unwrap().running.get_mut(&key).unwrap() -= 1;
                Ok(())
            }
        }
    };
    let mut workers = Vec::new();
    for _ in 0..8 {
        let q = db.queue_with(&table, |t| t.fifo_key("payload").unwrap());
        let w = Worker::new(q)
            .concurrency(2)
            .idle_poll(Duration::from_millis(5), Duration::from_millis(50));
        workers.push(spawn(w, handler(seen.clone())));
    }
    let done = format!("SELECT count(*) FROM {table} WHERE status = 'done'");
    wait_rows(&db, "every row done", &done, 300).await;
    let mut completed = 0;
    for (stop, task) in workers {
        let _ = stop.send(());
        completed += task.await.unwrap().unwrap().completed;
    }
    assert_eq!(completed, 300, "every row ran once");
    let seen = seen.lock().unwrap();
    assert!(seen.overlaps.is_empty(), "{:?}", seen.overlaps);
    assert_eq!(seen.starts.len(), 50);
    for (key, ids) in &seen.starts {
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, &sorted, "{key}'s rows started out of queue order");
        assert_eq!(ids.len(), 6, "{key}: {ids:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_row_per_key_runs_at_a_time_on_postgres() {
    one_row_per_key_runs_at_a_time(Db::pg().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_row_per_key_runs_at_a_time_on_sqlite() {
    one_row_per_key_runs_at_a_time(Db::lite().await).await;
}

/// A limit of 2 per key: two rows of a key run at once, never three, and a
/// worker that dies with its key's rows running blocks the key only until
/// their leases run out.
async fn a_key_limit_holds_and_a_dead_worker_frees_its_key(db: Db) {
    let table = db.outbox("wk_key2", 0).await;
    for _ in 0..5 {
        db.exec(&format!("INSERT INTO {table} (payload) VALUES ('k')"))
            .await;
    }
    let shape = |t: WorkTable| t.concurrency_key("payload", 2).unwrap();
    let locked = format!("SELECT count(*) FROM {table} WHERE lock_id IS NOT NULL");
    // A worker of 4 slots whose handlers never end takes two rows, not more.
    let stuck = Worker::new(db.queue_with(&table, shape))
        .concurrency(4)
        .lease(Duration::from_secs(2))
        .idle_poll(Duration::from_millis(5), Duration::from_millis(20));
    let (started, mut starts) = tokio::sync::mpsc::unbounded_channel::<i64>();
    let dying = tokio::spawn(stuck.run(
        move |job: Job| {
            let started = started.clone();
            async move {
                let _ = started.send(job.id);
                std::future::pending::<()>().await;
                Ok(())
            }
        },
        std::future::pending::<()>(),
    ));
    let first = (starts.recv().await.unwrap(), starts.recv().await.unwrap());
    wait_rows(&db, "two rows running", &locked, 2).await;
    // A row of another key, after the key's three waiting rows in queue
    // order: the claim that takes it has free slots and passes those rows
    // first, so it would take the third row of `k` too were the limit not
    // kept.
    db.exec(&format!("INSERT INTO {table} (payload) VALUES ('other')"))
        .await;
    let other = db.int(&format!("SELECT max(id) FROM {table}")).await;
    let next = tokio::time::timeout(Duration::from_secs(30), starts.recv()).await;
    assert_eq!(
        next,
        Ok(Some(other)),
        "the next row to start is the other key's"
    );
    let k_locked =
        format!("SELECT count(*) FROM {table} WHERE lock_id IS NOT NULL AND payload = 'k'");
    assert_eq!(
        db.int(&k_locked).await,
        2,
        "a third row of the key was claimed"
    );
    // The worker dies: its rows stay locked until their leases run out.
    dying.abort();
    let _ = dying.await;
    let done = format!("SELECT count(*) FROM {table} WHERE status = 'done'");
    let (stop, task) = spawn(
        Worker::new(db.queue_with(&table, shape))
            .concurrency(4)
            .idle_poll(Duration::from_millis(5), Duration::from_millis(50)),
        |_job: Job| async { Ok(()) },
    );
    wait_rows(
        &db,
        "the key's rows done after the dead worker's leases",
        &done,
        6,
    )
    .await;
    let _ = stop.send(());
    let report = task.await.unwrap().unwrap();
    assert_eq!(report.completed, 6, "{report:?} (first two: {first:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_limit_holds_and_a_dead_worker_frees_its_key_on_postgres() {
    a_key_limit_holds_and_a_dead_worker_frees_its_key(Db::pg().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_limit_holds_and_a_dead_worker_frees_its_key_on_sqlite() {
    a_key_limit_holds_and_a_dead_worker_frees_its_key(Db::lite().await).await;
}
