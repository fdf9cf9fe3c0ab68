//! Leased work rows against real PostgreSQL and SQLite: claim and finalize
//! semantics, the partial claim index, role affinity through a coordinator,
//! and worker processes (`examples/outbox_worker.rs`) that are killed with
//! SIGKILL or paused past their lease while others carry on.

mod support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rolegate::store::{LeaseStore, MemoryStore};
use rolegate::work::{WorkQueue, WorkTable};
use rolegate::{CoordinatorBuilder, LeaseTimings};

/// The example worker binary (built by `cargo build --examples`, which
/// `scripts/test` runs first).
fn worker_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = dir.join("examples").join("outbox_worker");
    assert!(
        bin.exists(),
        "{} is missing: run `scripts/test`, or `cargo build --all-features --examples` first",
        bin.display()
    );
    bin
}

enum Db {
    Pg(sqlx::PgPool),
    Lite(sqlx::SqlitePool),
}

impl Db {
    async fn exec(&self, sql: &str) -> u64 {
        match self {
            Db::Pg(p) => sqlx::query(sql).execute(p).await.unwrap().rows_affected(),
            Db::Lite(p) => sqlx::query(sql).execute(p).await.unwrap().rows_affected(),
        }
    }

    async fn int(&self, sql: &str) -> i64 {
        match self {
            Db::Pg(p) => sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(p)
                .await
                .unwrap(),
            Db::Lite(p) => sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(p)
                .await
                .unwrap(),
        }
    }
}

/// The same table the example worker uses, for either database.
fn outbox(table: &str, pg: bool) -> WorkTable {
    let now = if pg {
        "clock_timestamp()"
    } else {
        "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
    };
    WorkTable::new(table)
        .unwrap()
        .eligible(&format!("status = 'pending' AND run_at <= {now}"))
        .order_by(&["run_at"])
        .unwrap()
        .on_claim("attempts = attempts + 1")
        .on_complete("status = 'done'")
        .on_fail("run_at", None)
        .unwrap()
        .partition_column("partition_no")
        .unwrap()
}

/// Creates `table` with `rows` rows through the example's `--setup`.
fn setup(url: &str, table: &str, rows: u32) {
    let out = Command::new(worker_bin())
        .args(["--db", url, "--table", table, "--setup", &rows.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn postgres(tag: &str, rows: u32) -> (Db, WorkQueue, String) {
    let url = support::postgres_url();
    let table = support::unique_table(tag);
    setup(&url, &table, rows);
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let q = WorkQueue::postgres(pool.clone(), outbox(&table, true));
    (Db::Pg(pool), q, table)
}

async fn sqlite(tag: &str, rows: u32) -> (Db, WorkQueue, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("work.db").display());
    setup(&url, tag, rows);
    let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&url)
        .unwrap()
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    let pool = sqlx::SqlitePool::connect_with(opts).await.unwrap();
    let q = WorkQueue::sqlite(pool.clone(), outbox(tag, false));
    (Db::Lite(pool), q, tag.to_string(), dir)
}

const LONG: Duration = Duration::from_secs(60);

/// Claim, complete, fail, release, renew and stale finalizes on one table of 5 rows.
async fn finalize_semantics(db: &Db, q: &WorkQueue, table: &str) {
    let first = q.claim(3, LONG).await.unwrap().ids();
    assert_eq!(first.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(
        first.iter().all(|r| r.1 == first[0].1),
        "one lock id per claim"
    );
    let second = q.claim(10, LONG).await.unwrap().ids();
    assert_eq!(
        second.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![4, 5],
        "never the same row twice"
    );
    assert!(q.claim(10, LONG).await.unwrap().is_empty());
    assert_eq!(
        db.int(&format!(
            "SELECT CAST(sum(attempts) AS BIGINT) FROM {table}"
        ))
        .await,
        5,
        "attempts counted at claim"
    );

    let (id, lock) = (&first[0].0, &first[0].1);
    assert!(q.complete(*id, lock).await.unwrap());
    assert!(
        !q.complete(*id, lock).await.unwrap(),
        "a second complete finds no lock"
    );
    assert!(
        !q.complete(first[1].0, &second[0].1).await.unwrap(),
        "another claim's lock id never matches"
    );

    // fail: retried later, not now.
    let retry_at = SystemTime::now() + Duration::from_secs(3600);
    assert!(q.fail(first[1].0, &first[1].1, retry_at).await.unwrap());
    // release: claimable again at once, the attempt stays counted.
    assert!(q.release(first[2].0, &first[2].1).await.unwrap());
    let again = q.claim(10, LONG).await.unwrap().ids();
    assert_eq!(again.iter().map(|r| r.0).collect::<Vec<_>>(), vec![3]);
    assert_eq!(
        db.int(&format!(
            "SELECT CAST(attempts AS BIGINT) FROM {table} WHERE id = 3"
        ))
        .await,
        2
    );

    // A lease that runs out: the row is claimable again, and the stale
    // worker's finalizes return false once another claim took it.
    assert!(q
        .renew(again[0].0, &again[0].1, Duration::from_millis(200))
        .await
        .unwrap());
    assert!(
        q.claim(10, LONG).await.unwrap().is_empty(),
        "held until its lease runs out"
    );
    let mut taken = Vec::new();
    let started = Instant::now();
    while taken.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the lapsed row was never claimable"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        taken = q.claim(10, LONG).await.unwrap().ids();
    }
    assert_eq!(taken.iter().map(|r| r.0).collect::<Vec<_>>(), vec![3]);
    assert!(
        !q.complete(again[0].0, &again[0].1).await.unwrap(),
        "stale complete"
    );
    assert!(
        !q.renew(again[0].0, &again[0].1, LONG).await.unwrap(),
        "stale renew"
    );
    assert!(q.renew(taken[0].0, &taken[0].1, LONG).await.unwrap());

    // Producers are never blocked by a held row: update one, withdraw another.
    assert_eq!(
        db.exec(&format!(
            "UPDATE {table} SET payload = 'edited' WHERE id = 4"
        ))
        .await,
        1
    );
    assert_eq!(
        db.exec(&format!("DELETE FROM {table} WHERE id = 5")).await,
        1
    );
    assert!(
        q.complete(4, &second[0].1).await.unwrap(),
        "an edited row still completes"
    );
    assert!(
        !q.complete(5, &second[1].1).await.unwrap(),
        "a withdrawn row reports false"
    );
    // Several rows of one claim in one statement: only those still carrying
    // the lock id are completed (4 is done already, 5 is gone).
    let done = q.complete_all(&[3, 4, 5], &taken[0].1).await.unwrap();
    assert_eq!(done, vec![3]);
    assert!(q.complete_all(&[3], &taken[0].1).await.unwrap().is_empty());
    assert_eq!(
        db.int(&format!(
            "SELECT count(*) FROM {table} WHERE status = 'done'"
        ))
        .await,
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizes_match_only_the_claim_that_holds_the_row_on_postgres() {
    let (db, q, table) = postgres("work_sem", 5).await;
    finalize_semantics(&db, &q, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizes_match_only_the_claim_that_holds_the_row_on_sqlite() {
    let (db, q, table, _dir) = sqlite("work_sem", 5).await;
    finalize_semantics(&db, &q, &table).await;
}

/// Sixteen claimers drain one table concurrently, half completing their rows
/// one by one, half with one `complete_all` per claim. Every claim and
/// complete must succeed (no deadlock, SQLSTATE 40P01, between statements
/// that lock several rows each) and every row must be completed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_and_completes_never_deadlock_on_postgres() {
    const ROWS: u32 = 6_000;
    let (db, q, table) = postgres("work_race", ROWS).await;
    let mut tasks = Vec::new();
    for n in 0..16 {
        let q = q.clone();
        let batched = n % 2 == 1;
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let got = q
                    .claim(20, LONG)
                    .await
                    .map_err(|e| format!("claim: {e}"))?
                    .ids();
                if got.is_empty() {
                    return Ok::<_, String>(done);
                }
                if batched {
                    let ids: Vec<i64> = got.iter().map(|r| r.0).collect();
                    let finished = q
                        .complete_all(&ids, &got[0].1)
                        .await
                        .map_err(|e| format!("complete_all: {e}"))?;
                    if finished.len() != ids.len() {
                        return Err(format!("{ids:?} lost their lock before complete_all"));
                    }
                    done.extend(ids);
                    continue;
                }
                for (id, lock) in got {
                    if !q
                        .complete(id, &lock)
                        .await
                        .map_err(|e| format!("complete: {e}"))?
                    {
                        return Err(format!("row {id} lost its lock before complete"));
                    }
                    done.push(id);
                }
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(
            t.await
                .unwrap()
                .unwrap_or_else(|e| panic!("a claimer failed: {e}")),
        );
    }
    all.sort_unstable();
    let expected: Vec<i64> = (1..=i64::from(ROWS)).collect();
    assert_eq!(all, expected, "every row completed exactly once");
    assert_eq!(
        db.int(&format!(
            "SELECT count(*) FROM {table} WHERE status = 'done' AND attempts = 1"
        ))
        .await,
        i64::from(ROWS)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_uses_the_partial_index_over_live_rows_on_postgres() {
    let (db, q, table) = postgres("work_idx", 100).await;
    // A long completed history and a few live rows.
    db.exec(&format!(
        "INSERT INTO {table} (payload, status) SELECT 'old', 'done' FROM generate_series(1, 50000)"
    ))
    .await;
    db.exec(&format!("ANALYZE {table}")).await;
    let claim = q
        .statements()
        .claim
        .replace("$1", "20")
        .replace("$2", "'x'")
        .replace("$3", "30");
    let Db::Pg(pool) = &db else { unreachable!() };
    let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {claim}"))
        .fetch_all(pool)
        .await
        .unwrap();
    let plan = plan.join("\n");
    assert!(
        plan.contains(&format!("{table}_claim")),
        "the claim does not use the index:\n{plan}"
    );
    let ddl = q
        .claim_index_ddl(&format!("{table}_claim"), "status = 'pending'")
        .unwrap();
    assert!(
        ddl.contains("(run_at, id) WHERE status = 'pending'"),
        "{ddl}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_holder_of_a_partition_delivers_its_rows_and_the_delivery_moves_with_the_role() {
    let (db, q, table) = postgres("work_aff", 40).await;
    db.exec(&format!(
        "UPDATE {table} SET partition_no = CAST(id % 4 AS INT)"
    ))
    .await;
    let t = LeaseTimings {
        duration: Duration::from_millis(900),
        renew_interval: Duration::from_millis(200),
        safety_margin: Duration::from_millis(200),
    };
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let a = CoordinatorBuilder::new(store.clone())
        .instance_name("a")
        .partition("outbox", 4, t)
        .start()
        .unwrap();
    let pa = a.partition("outbox").unwrap();
    support::wait_for("a holds every partition", Duration::from_secs(3), || {
        (0..4).all(|i| pa.role(i).unwrap().is_held())
    })
    .await;
    let b = CoordinatorBuilder::new(store)
        .instance_name("b")
        .partition("outbox", 4, t)
        .start()
        .unwrap();
    let pb = b.partition("outbox").unwrap();
    support::wait_for(
        "b sees a hold every partition",
        Duration::from_secs(3),
        || (0..4).all(|i| pb.role(i).unwrap().current_holder().is_some()),
    )
    .await;
    assert!(
        q.claim_held(&pb, 50, LONG).await.unwrap().is_empty(),
        "b holds nothing, claims nothing"
    );
    let mine = q.claim_held(&pa, 5, LONG).await.unwrap().ids();
    assert_eq!(mine.len(), 5);
    for (id, lock) in &mine {
        assert!(q.complete(*id, lock).await.unwrap());
    }
    // a stops: its roles move to b, and so does the delivery.
    a.shutdown().await;
    support::wait_for("b holds every partition", Duration::from_secs(3), || {
        (0..4).all(|i| pb.role(i).unwrap().is_held())
    })
    .await;
    let rest = q.claim_held(&pb, 100, LONG).await.unwrap().ids();
    assert_eq!(rest.len(), 35);
    b.shutdown().await;
}

/// One worker's JSON-lines log: (event, row id, lock id, ok).
fn read_log(path: &std::path::Path) -> Vec<(String, i64, String, Option<bool>)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| {
            (
                v["ev"].as_str().unwrap_or_default().to_string(),
                v["id"].as_i64().unwrap_or(-1),
                v["lock"].as_str().unwrap_or_default().to_string(),
                v["ok"].as_bool(),
            )
        })
        .collect()
}

fn spawn_worker(url: &str, table: &str, name: &str, log: &std::path::Path) -> Child {
    Command::new(worker_bin())
        .args([
            "--db", url, "--table", table, "--name", name, "--batch", "10",
        ])
        .args(["--lease-ms", "800", "--work-ms", "15", "--log"])
        .arg(log)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn signal(child: &Child, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status();
}

/// Rows a worker's log shows claimed and not yet finalized.
fn held_rows(log: &std::path::Path) -> Vec<i64> {
    let events = read_log(log);
    events
        .iter()
        .filter(|e| e.0 == "claim")
        .filter(|e| {
            !events
                .iter()
                .any(|f| f.0 != "claim" && f.1 == e.1 && f.2 == e.2)
        })
        .map(|e| e.1)
        .collect()
}

/// SIGSTOPs the worker at a moment it holds claimed rows (its log, written
/// before each step, is final once it is stopped) and keeps it stopped until
/// its leases ran out and other workers took every one of those rows. A
/// process stopped inside a statement holds that statement's locks (SQLite's
/// one write lock, or PostgreSQL row locks) and can stall the others; then it
/// is resumed and paused again later.
async fn pause_until_its_rows_are_taken(
    db: &Db,
    table: &str,
    worker: &Child,
    log: &std::path::Path,
) {
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "could not pause the worker holding rows"
        );
        signal(worker, "STOP");
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Two or more: the first may be finalized already, its log line not
        // yet written; the others the worker has not touched since its claim.
        let held = held_rows(log);
        if held.len() >= 2 {
            let events = read_log(log);
            let lock = events
                .iter()
                .rev()
                .find(|e| e.0 == "claim")
                .map(|e| e.2.clone())
                .unwrap();
            let ids: Vec<String> = held.iter().map(|i| i.to_string()).collect();
            let still_mine = format!(
                "SELECT count(*) FROM {table} WHERE id IN ({}) AND lock_id = '{lock}'",
                ids.join(",")
            );
            let paused = Instant::now();
            while paused.elapsed() < Duration::from_secs(4) {
                if db.int(&still_mine).await == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        signal(worker, "CONT");
        tokio::time::sleep(Duration::from_millis(7)).await;
    }
}

/// 4 worker processes on 300 rows; one is killed mid-batch, one is paused
/// past its lease (until others took its rows) and resumed. Every row is completed exactly once, the
/// paused worker's late finalizes return false, and rows the killed worker
/// held were claimed again (attempts counted at claim).
async fn workers_survive_kill_and_pause(db: &Db, url: &str, table: &str) {
    let dir = tempfile::tempdir().unwrap();
    let logs: Vec<PathBuf> = (0..4)
        .map(|i| dir.path().join(format!("w{i}.log")))
        .collect();
    let mut workers: Vec<Child> = (0..4)
        .map(|i| spawn_worker(url, table, &format!("w{i}"), &logs[i]))
        .collect();
    // SIGKILL a worker mid-batch: while its log shows three rows to go.
    let started = Instant::now();
    while held_rows(&logs[0]).len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "worker 0 never held rows"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    signal(&workers[0], "KILL");
    let _ = workers[0].wait();
    pause_until_its_rows_are_taken(db, table, &workers[1], &logs[1]).await;
    signal(&workers[1], "CONT");
    let started = Instant::now();
    while db
        .int(&format!(
            "SELECT count(*) FROM {table} WHERE status <> 'done'"
        ))
        .await
        > 0
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "rows left undelivered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let the live workers log their last finalizes (their logs show no
    // claimed row left unfinalized), then stop them.
    let started = Instant::now();
    while logs[1..].iter().any(|l| !held_rows(l).is_empty()) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "a live worker never finalized its rows"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for w in &mut workers[1..] {
        let _ = w.kill();
        let _ = w.wait();
    }
    let events: Vec<Vec<_>> = logs.iter().map(|l| read_log(l)).collect();
    let mut completes: HashMap<i64, usize> = HashMap::new();
    for e in events.iter().flatten() {
        if e.0 == "complete" && e.3 == Some(true) {
            *completes.entry(e.1).or_default() += 1;
        }
    }
    // Every row is done in the table (the loop above); the logs show no row
    // completed twice. A row without a logged complete can only be one the
    // killed worker completed just before SIGKILL hit, before its log line.
    assert!(
        completes.values().all(|n| *n == 1),
        "a row completed twice: {completes:?}"
    );
    let unlogged: Vec<i64> = (1..=300).filter(|id| !completes.contains_key(id)).collect();
    assert!(
        unlogged.len() <= 1
            && unlogged
                .iter()
                .all(|id| events[0].iter().any(|e| e.0 == "claim" && e.1 == *id)),
        "rows done without a logged complete: {unlogged:?}"
    );
    assert!(
        events[1].iter().any(|e| e.3 == Some(false)),
        "the paused worker never learned it lost a row: {:?}",
        events[1]
    );
    // The killed worker's rows were claimed again: attempts are counted at
    // claim. (The first may have been completed just before the kill.)
    let killed_held = held_rows(&logs[0]);
    assert!(killed_held.len() >= 2, "{killed_held:?}");
    for id in &killed_held[1..] {
        let attempts = db
            .int(&format!(
                "SELECT CAST(attempts AS BIGINT) FROM {table} WHERE id = {id}"
            ))
            .await;
        assert!(
            attempts >= 2,
            "row {id} held by the killed worker has attempts {attempts}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_is_completed_once_while_workers_are_killed_and_paused_on_postgres() {
    let (db, _q, table) = postgres("work_proc", 300).await;
    workers_survive_kill_and_pause(&db, &support::postgres_url(), &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_is_completed_once_while_workers_are_killed_and_paused_on_sqlite() {
    let (db, _q, table, dir) = sqlite("outbox", 300).await;
    let url = format!("sqlite://{}", dir.path().join("work.db").display());
    workers_survive_kill_and_pause(&db, &url, &table).await;
}

/// A table `table` with an id of SQL type `id_type`, the lock columns and a
/// status, holding three pending rows with ids `ids`.
async fn custom_table(db: &Db, table: &str, id_type: &str, ids: [&str; 3]) {
    let until = match db {
        Db::Pg(_) => "timestamptz",
        Db::Lite(_) => "INTEGER",
    };
    db.exec(&format!(
        "CREATE TABLE {table} (id {id_type} PRIMARY KEY, status TEXT NOT NULL DEFAULT 'pending', lock_id TEXT, locked_until {until})"
    ))
    .await;
    for id in ids {
        db.exec(&format!("INSERT INTO {table} (id) VALUES ({id})"))
            .await;
    }
}

fn queue(db: &Db, table: WorkTable) -> WorkQueue {
    match db {
        Db::Pg(p) => WorkQueue::postgres(p.clone(), table),
        Db::Lite(p) => WorkQueue::sqlite(p.clone(), table),
    }
}

async fn lite_db() -> (Db, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
    (
        Db::Lite(sqlx::SqlitePool::connect(&url).await.unwrap()),
        dir,
    )
}

async fn pg_db() -> Db {
    Db::Pg(
        sqlx::PgPool::connect(&support::postgres_url())
            .await
            .unwrap(),
    )
}

/// A text id is refused before the claim locks anything (it used to lock
/// the rows, use an attempt, and then fail to read their ids).
async fn a_text_id_is_refused_before_any_row_is_locked(db: &Db, table: &str) {
    custom_table(db, table, "TEXT", ["'a'", "'b'", "'c'"]).await;
    let q = queue(
        db,
        WorkTable::new(table)
            .unwrap()
            .eligible("status = 'pending'"),
    );
    let err = q.claim(10, LONG).await.unwrap_err().to_string();
    assert!(
        err.contains("the id column `id`") && err.contains("must be an integer"),
        "{err}"
    );
    let locked = db
        .int(&format!(
            "SELECT CAST(count(*) AS BIGINT) FROM {table} WHERE lock_id IS NOT NULL"
        ))
        .await;
    assert_eq!(locked, 0, "a refused claim locked rows");
    // A missing table is named too.
    let q = queue(db, WorkTable::new("no_such_work_table").unwrap());
    let err = q.claim(1, LONG).await.unwrap_err().to_string();
    assert!(err.contains("`no_such_work_table` does not exist"), "{err}");
}

#[tokio::test]
async fn a_text_id_is_refused_before_any_row_is_locked_on_postgres() {
    let db = pg_db().await;
    a_text_id_is_refused_before_any_row_is_locked(&db, &support::unique_table("work_textid")).await;
}

#[tokio::test]
async fn a_text_id_is_refused_before_any_row_is_locked_on_sqlite() {
    let (db, _dir) = lite_db().await;
    a_text_id_is_refused_before_any_row_is_locked(&db, "work_textid").await;
}

/// A `serial` (int4) id is read back and finalized like a bigint one.
#[tokio::test]
async fn an_integer_id_on_postgres_is_claimed_and_completed() {
    let db = pg_db().await;
    let table = support::unique_table("work_int4");
    custom_table(&db, &table, "integer", ["1", "2", "3"]).await;
    let q = queue(
        &db,
        WorkTable::new(&table)
            .unwrap()
            .eligible("status = 'pending'")
            .on_complete("status = 'done'"),
    );
    let claimed = q.claim(10, LONG).await.unwrap().ids();
    assert_eq!(claimed.iter().map(|c| c.0).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(q.complete(claimed[0].0, &claimed[0].1).await.unwrap());
}

/// An `on_complete` that leaves the row eligible is an error at the first
/// complete (it used to run the same row again and again).
async fn a_complete_that_leaves_the_row_eligible_is_an_error(db: &Db, table: &str) {
    custom_table(db, table, "INTEGER", ["1", "2", "3"]).await;
    let q = queue(
        db,
        WorkTable::new(table)
            .unwrap()
            .eligible("status = 'pending'")
            .on_complete("status = 'pending'"),
    );
    let claimed = q.claim(10, LONG).await.unwrap().ids();
    let err = q
        .complete(claimed[0].0, &claimed[0].1)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("on_complete leaves the row eligible (`status = 'pending'`"),
        "{err}"
    );
    let ids: Vec<i64> = claimed[1..].iter().map(|c| c.0).collect();
    let err = q.complete_all(&ids, &claimed[1].1).await.unwrap_err();
    assert!(err.to_string().contains("on_complete leaves"), "{err}");
    // One that ends the row is fine.
    let fixed = queue(
        db,
        WorkTable::new(table)
            .unwrap()
            .eligible("status = 'pending'")
            .on_complete("status = 'done'"),
    );
    db.exec(&format!(
        "UPDATE {table} SET lock_id = NULL, locked_until = NULL"
    ))
    .await;
    let claimed = fixed.claim(10, LONG).await.unwrap().ids();
    assert_eq!(claimed.len(), 3);
    assert!(fixed.complete(claimed[0].0, &claimed[0].1).await.unwrap());
    let rest: Vec<i64> = claimed[1..].iter().map(|c| c.0).collect();
    assert_eq!(
        fixed.complete_all(&rest, &claimed[1].1).await.unwrap(),
        rest
    );
}

#[tokio::test]
async fn a_complete_that_leaves_the_row_eligible_is_an_error_on_postgres() {
    let db = pg_db().await;
    a_complete_that_leaves_the_row_eligible_is_an_error(&db, &support::unique_table("work_elig"))
        .await;
}

#[tokio::test]
async fn a_complete_that_leaves_the_row_eligible_is_an_error_on_sqlite() {
    let (db, _dir) = lite_db().await;
    a_complete_that_leaves_the_row_eligible_is_an_error(&db, "work_elig").await;
}

/// `fail_after` sets the retry time `delay` after the database's now: a row
/// failed with no delay is claimable at once; one failed for an hour is not,
/// and its stored retry time is an hour ahead of the database's clock. (That
/// the statement reads the database clock, not the app's, is pinned by the
/// statement test in `src/work/sql.rs`: here both clocks are one.)
async fn fail_after_sets_the_retry_time_after_the_databases_now(
    db: &Db,
    q: &WorkQueue,
    table: &str,
) {
    let claimed = q.claim(2, LONG).await.unwrap().ids();
    assert!(q
        .fail_after(claimed[0].0, &claimed[0].1, Duration::ZERO)
        .await
        .unwrap());
    assert!(q
        .fail_after(claimed[1].0, &claimed[1].1, Duration::from_secs(3600))
        .await
        .unwrap());
    let again = q.claim(10, LONG).await.unwrap().ids();
    assert!(
        again.iter().any(|c| c.0 == claimed[0].0),
        "failed with no delay, claimable at once: {again:?}"
    );
    assert!(
        again.iter().all(|c| c.0 != claimed[1].0),
        "failed for an hour, claimable now: {again:?}"
    );
    let ahead = match db {
        Db::Pg(_) => format!(
            "SELECT CAST(EXTRACT(EPOCH FROM run_at - clock_timestamp()) AS BIGINT) FROM {table} WHERE id = {}",
            claimed[1].0
        ),
        Db::Lite(_) => format!(
            "SELECT CAST((run_at - CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)) / 1000 AS BIGINT) FROM {table} WHERE id = {}",
            claimed[1].0
        ),
    };
    let ahead = db.int(&ahead).await;
    assert!(
        (3590..=3600).contains(&ahead),
        "retry time {ahead} s ahead of the database's now, not 3600"
    );
}

#[tokio::test]
async fn fail_after_sets_the_retry_time_after_the_databases_now_on_postgres() {
    let (db, q, table) = postgres("work_failafter", 3).await;
    fail_after_sets_the_retry_time_after_the_databases_now(&db, &q, &table).await;
}

#[tokio::test]
async fn fail_after_sets_the_retry_time_after_the_databases_now_on_sqlite() {
    let (db, q, table, _dir) = sqlite("work_failafter", 3).await;
    fail_after_sets_the_retry_time_after_the_databases_now(&db, &q, &table).await;
}

/// `claim_held` over a coordinator whose lease store was never migrated
/// says so (it used to claim nothing forever, without an error).
#[tokio::test]
async fn claim_held_on_an_unmigrated_lease_store_is_an_error() {
    let (_db, q, _table) = postgres("work_unmig", 3).await;
    let store = rolegate::store::PostgresStore::connect(
        &support::postgres_url(),
        &support::unique_table("never_migrated"),
    )
    .await
    .unwrap();
    let t = LeaseTimings {
        duration: Duration::from_millis(900),
        renew_interval: Duration::from_millis(200),
        safety_margin: Duration::from_millis(200),
    };
    let c = CoordinatorBuilder::new(Arc::new(store))
        .instance_name("unmigrated")
        .partition("outbox", 4, t)
        .start()
        .unwrap();
    let p = c.partition("outbox").unwrap();
    support::wait_for("the store error is known", Duration::from_secs(5), || {
        matches!(p.store_unread(), Some(Some(_)))
    })
    .await;
    let err = q.claim_held(&p, 5, LONG).await.unwrap_err().to_string();
    assert!(err.contains("the lease store has not been read"), "{err}");
    c.shutdown().await;
}
