//! The worker loop over a [`WorkQueue`]: claims as slots free up, renews
//! each running row's lease, finalizes by the handler's answer (complete,
//! retry with backoff, or dead after its attempts), wakes on PostgreSQL
//! notifications, follows a partition's roles when given one, and stops
//! gracefully. One `run` call is one worker; run it in as many processes as
//! you like.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{Backoff, ClaimedRows, WorkError, WorkPool, WorkQueue};
use crate::lease::RolePartition;

/// Metric names (label `queue`: the table).
const CLAIMED: &str = "rolegate_work_claimed_total";
const COMPLETED: &str = "rolegate_work_completed_total";
const FAILED: &str = "rolegate_work_failed_total";
const DEAD: &str = "rolegate_work_dead_total";
const RENEW_FAILURES: &str = "rolegate_work_renew_failures_total";
const LOST: &str = "rolegate_work_leases_lost_total";
const EXPIRED_UNRUN: &str = "rolegate_work_expired_unrun_total";
const CLAIM_SECONDS: &str = "rolegate_work_claim_seconds";
const DEPTH: &str = "rolegate_work_queue_depth";
const OLDEST: &str = "rolegate_work_oldest_eligible_seconds";

/// A claimed row as the app's backend returns it; read columns with
/// [`Job::get`] or through the variant's `sqlx::Row`.
pub enum JobRow {
    #[cfg(feature = "postgres")]
    /// A PostgreSQL row.
    Postgres(sqlx::postgres::PgRow),
    #[cfg(feature = "sqlite")]
    /// A SQLite row.
    Sqlite(sqlx::sqlite::SqliteRow),
}

impl std::fmt::Debug for JobRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobRow")
    }
}

/// One row handed to the handler.
#[derive(Debug)]
pub struct Job {
    /// The row's id.
    pub id: i64,
    /// The claim's lock id (the worker finalizes with it).
    pub lock_id: Arc<str>,
    /// This attempt's number (1 for the first), when the table counts
    /// attempts ([`WorkTable::attempts`](super::WorkTable::attempts)).
    pub attempt: Option<u32>,
    /// The row as claimed.
    pub row: JobRow,
    /// Cancelled when the row's lease could not be renewed (another worker
    /// may have it now) or the worker stops past its grace: stop then. The
    /// handler's future is dropped at that moment anyway.
    pub cancel: CancellationToken,
}

impl Job {
    /// Reads one column of the row.
    pub fn get<T: RowValue>(&self, column: &str) -> Result<T, WorkError> {
        use sqlx::Row;
        Ok(match &self.row {
            #[cfg(feature = "postgres")]
            JobRow::Postgres(r) => r.try_get(column)?,
            #[cfg(feature = "sqlite")]
            JobRow::Sqlite(r) => r.try_get(column)?,
        })
    }
}

/// A value [`Job::get`] can read from every enabled backend.
#[cfg(all(feature = "postgres", feature = "sqlite"))]
pub trait RowValue:
    for<'r> sqlx::Decode<'r, sqlx::Postgres>
    + sqlx::Type<sqlx::Postgres>
    + for<'r> sqlx::Decode<'r, sqlx::Sqlite>
    + sqlx::Type<sqlx::Sqlite>
{
}
#[cfg(all(feature = "postgres", feature = "sqlite"))]
impl<T> RowValue for T where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres>
        + sqlx::Type<sqlx::Postgres>
        + for<'r> sqlx::Decode<'r, sqlx::Sqlite>
        + sqlx::Type<sqlx::Sqlite>
{
}
/// A value [`Job::get`] can read from every enabled backend.
#[cfg(all(feature = "postgres", not(feature = "sqlite")))]
pub trait RowValue: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> {}
#[cfg(all(feature = "postgres", not(feature = "sqlite")))]
impl<T> RowValue for T where T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>
{}
/// A value [`Job::get`] can read from every enabled backend.
#[cfg(all(not(feature = "postgres"), feature = "sqlite"))]
pub trait RowValue: for<'r> sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite> {}
#[cfg(all(not(feature = "postgres"), feature = "sqlite"))]
impl<T> RowValue for T where T: for<'r> sqlx::Decode<'r, sqlx::Sqlite> + sqlx::Type<sqlx::Sqlite> {}

/// Why a handler did not finish its row: `map_err(JobError::retry)?` (or
/// `retry_after`, `discard`); a [`WorkError`] or `sqlx::Error` converts
/// with `?` into a retry.
#[derive(Debug)]
pub struct JobError {
    retry: Option<Option<Duration>>,
    message: String,
}

impl JobError {
    /// Retry later, after the worker's backoff for this attempt (the row
    /// is dead instead once its attempts are used up).
    pub fn retry(error: impl std::fmt::Display) -> Self {
        Self {
            retry: Some(None),
            message: error.to_string(),
        }
    }

    /// Retry after `delay` (by the database clock), e.g. a remote
    /// `Retry-After`.
    pub fn retry_after(delay: Duration, error: impl std::fmt::Display) -> Self {
        Self {
            retry: Some(Some(delay)),
            message: error.to_string(),
        }
    }

    /// The row can never succeed: dead now, whatever its attempts.
    pub fn discard(error: impl std::fmt::Display) -> Self {
        Self {
            retry: None,
            message: error.to_string(),
        }
    }
}

impl From<WorkError> for JobError {
    fn from(e: WorkError) -> Self {
        JobError::retry(e)
    }
}

impl From<sqlx::Error> for JobError {
    fn from(e: sqlx::Error) -> Self {
        JobError::retry(e)
    }
}

/// The rows running now: id → (lock id, the job's token, its attempt).
type Running = Mutex<HashMap<i64, (Arc<str>, CancellationToken, Option<u32>)>>;

/// What became of a claimed row (see [`Worker::on_finalize`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Completed.
    Completed,
    /// Failed, and scheduled for a retry (or given back at once when the
    /// table has no `on_fail`).
    Failed,
    /// Dead: its attempts were used up, or its handler discarded it.
    Dead,
    /// Its lease was lost: a renewal or the finalize found another lock on
    /// the row (it expired and was claimed again). Nothing was written.
    Lost,
    /// Given back at stop, its handler cancelled.
    Released,
}

/// One row's end, as [`Worker::on_finalize`] reports it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Finalized {
    /// The row's id.
    pub id: i64,
    /// The claim's lock id.
    pub lock_id: Arc<str>,
    /// The attempt's number, when the table counts attempts.
    pub attempt: Option<u32>,
    /// What became of it.
    pub outcome: Outcome,
}

#[derive(Clone)]
struct Hook(Arc<dyn Fn(&Finalized) + Send + Sync>);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

/// What one [`Worker::run`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerReport {
    /// Rows claimed.
    pub claimed: u64,
    /// Rows completed.
    pub completed: u64,
    /// Rows failed and scheduled for a retry.
    pub failed: u64,
    /// Rows marked dead.
    pub dead: u64,
    /// Rows whose lease this worker lost (a renewal or finalize found
    /// another lock on the row: it had expired and was claimed again).
    pub lost: u64,
    /// Rows still running at the end of the grace, given back.
    pub released: u64,
}

#[derive(Default)]
struct Tally {
    report: Mutex<WorkerReport>,
}

impl Tally {
    fn add(&self, f: impl FnOnce(&mut WorkerReport)) {
        f(&mut self.report.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

/// A worker over one queue (see the module docs and `docs/work-rows.md`).
#[derive(Clone)]
pub struct Worker {
    queue: WorkQueue,
    concurrency: usize,
    lease: Duration,
    max_attempts: Option<u32>,
    backoff: Backoff,
    idle_min: Duration,
    idle_max: Duration,
    grace: Duration,
    partition: Option<RolePartition>,
    listen: Option<String>,
    age_column: Option<String>,
    sample_every: Duration,
    hook: Option<Hook>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("queue", &self.queue.table().table)
            .field("concurrency", &self.concurrency)
            .field("lease", &self.lease)
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// A worker on `queue`: 4 rows at a time, 30 s leases, retries after
    /// the default [`Backoff`], polling every 50 ms to 2 s when idle, 10 s
    /// of grace at stop.
    pub fn new(queue: WorkQueue) -> Self {
        Self {
            queue,
            concurrency: 4,
            lease: Duration::from_secs(30),
            max_attempts: None,
            backoff: Backoff::default(),
            idle_min: Duration::from_millis(50),
            idle_max: Duration::from_secs(2),
            grace: Duration::from_secs(10),
            partition: None,
            listen: None,
            age_column: None,
            sample_every: Duration::from_secs(5),
            hook: None,
        }
    }

    /// Called once for every claimed row when its end is known (after the
    /// finalize was written, or the lease was found lost): an audit log,
    /// a metric of your own. Keep it quick.
    pub fn on_finalize(mut self, f: impl Fn(&Finalized) + Send + Sync + 'static) -> Self {
        self.hook = Some(Hook(Arc::new(f)));
        self
    }

    fn report(&self, id: i64, lock_id: &Arc<str>, attempt: Option<u32>, outcome: Outcome) {
        if let Some(Hook(f)) = &self.hook {
            f(&Finalized {
                id,
                lock_id: lock_id.clone(),
                attempt,
                outcome,
            });
        }
    }

    /// Rows run at once (1 to 10000).
    pub fn concurrency(mut self, n: usize) -> Self {
        // One claim takes at most 10000 rows.
        self.concurrency = n.clamp(1, 10_000);
        self
    }

    /// Each row's lease; renewed every third of it while its handler runs.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// A row whose handler failed on its `n`th attempt is dead (needs
    /// [`WorkTable::attempts`](super::WorkTable::attempts) and
    /// [`WorkTable::on_dead`](super::WorkTable::on_dead)).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n.max(1));
        self
    }

    /// The retry delay per attempt.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How often an idle worker looks for rows: from `min`, doubling to
    /// `max` while it finds none.
    pub fn idle_poll(mut self, min: Duration, max: Duration) -> Self {
        self.idle_min = min;
        self.idle_max = max.max(min);
        self
    }

    /// How long a stop waits for running handlers before cancelling them
    /// and giving their rows back.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Claims only rows of `partition`'s roles held here right now
    /// ([`WorkQueue::claim_held`]): the work follows the roles as they move.
    pub fn partition(mut self, partition: RolePartition) -> Self {
        self.partition = Some(partition);
        self
    }

    /// PostgreSQL: wakes on notifications on `channel` (sent by
    /// [`Enqueue::notify`](super::Enqueue::notify) or the trigger of
    /// [`WorkQueue::notify_trigger_ddl`]) instead of waiting for the next
    /// poll. Polling goes on as the fallback.
    pub fn listen(mut self, channel: &str) -> Self {
        self.listen = Some(channel.to_string());
        self
    }

    /// The time column whose minimum over claimable rows gives the
    /// oldest-eligible-row gauge, sampled with the queue depth.
    pub fn age_column(mut self, column: &str) -> Self {
        self.age_column = Some(column.to_string());
        self
    }

    fn check(&self) -> Result<(), WorkError> {
        let t = self.queue.table();
        if self.max_attempts.is_some() && (t.attempts.is_none() || t.on_dead.is_none()) {
            return Err(WorkError::BadArgument(
                "max_attempts needs WorkTable::attempts and WorkTable::on_dead",
            ));
        }
        if self.lease < Duration::from_millis(30) {
            return Err(WorkError::BadArgument(
                "a worker's lease must be at least 30 ms (it is renewed every third)",
            ));
        }
        if let Some(c) = &self.age_column {
            super::ident(c)?;
        }
        if let Some(c) = &self.listen {
            super::ident(c)?;
        }
        Ok(())
    }

    /// Runs until `stop` resolves: then claims nothing more, lets running
    /// handlers finish for up to the grace, cancels and drops the rest and
    /// gives their rows back (claimable at once by another worker).
    pub async fn run<H, F>(
        self,
        handler: H,
        stop: impl Future<Output = ()>,
    ) -> Result<WorkerReport, WorkError>
    where
        H: Fn(Job) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), JobError>> + Send + 'static,
    {
        self.check()?;
        let this = Arc::new(self);
        let handler = Arc::new(handler);
        let tally = Arc::new(Tally::default());
        let slots = Arc::new(Semaphore::new(this.concurrency));
        let running: Arc<Running> = Arc::default();
        let wake = Arc::new(Notify::new());
        let mut tasks = JoinSet::new();
        let background = CancellationToken::new();
        // The helpers end with this future, however it ends: returned, or
        // dropped by a `select!` or a timeout (the handlers' tasks, in the
        // JoinSet, are aborted then; their rows come back when their
        // leases end).
        let _helpers = background.clone().drop_guard();
        if let Some(channel) = this.listen.clone() {
            tokio::spawn(listen(
                this.queue.pool().clone(),
                channel,
                wake.clone(),
                background.clone(),
            ));
        }
        tokio::spawn(sample(this.clone(), background.clone()));
        let label = this.queue.table().table.clone();
        tokio::pin!(stop);
        let mut idle = this.idle_min;
        loop {
            while tasks.try_join_next().is_some() {}
            let free = slots.available_permits();
            if free == 0 {
                tokio::select! {
                    _ = &mut stop => break,
                    _ = tasks.join_next() => continue,
                }
            }
            let started = Instant::now();
            let claim = async {
                match &this.partition {
                    Some(p) => (this.queue).claim_held(p, free as u32, this.lease).await,
                    None => this.queue.claim(free as u32, this.lease).await,
                }
            };
            // A stop does not wait for a claim the database sits on: rows a
            // dropped claim took come back when their lease ends.
            let claimed = tokio::select! {
                _ = &mut stop => break,
                claimed = claim => claimed,
            };
            metrics::histogram!(CLAIM_SECONDS, "queue" => label.clone())
                .record(started.elapsed().as_secs_f64());
            let rows = match claimed {
                Ok(rows) => rows,
                Err(e @ (WorkError::BadArgument(_) | WorkError::Schema(_))) => {
                    background.cancel();
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(queue = %label, error = %e, "claiming work rows failed; retrying");
                    idle = (idle * 2).min(this.idle_max);
                    tokio::select! {
                        _ = &mut stop => break,
                        _ = tokio::time::sleep(idle) => {}
                    }
                    continue;
                }
            };
            if rows.is_empty() {
                tokio::select! {
                    _ = &mut stop => break,
                    _ = tokio::time::sleep(idle) => {}
                    _ = wake.notified() => {}
                }
                idle = (idle * 2).min(this.idle_max);
                continue;
            }
            idle = this.idle_min;
            let n = rows.len() as u64;
            metrics::counter!(CLAIMED, "queue" => label.clone()).increment(n);
            tally.add(|r| r.claimed += n);
            for (job, lock) in jobs(rows, this.queue.table().attempts.as_deref()) {
                // At most `free` rows were claimed: a slot is there for each.
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    break;
                };
                let (this, handler, tally) = (this.clone(), handler.clone(), tally.clone());
                let running = running.clone();
                tasks.spawn(async move {
                    let _permit = permit;
                    (this.run_one(job, lock, started, &*handler, &tally, &running)).await;
                });
            }
        }
        // Stop: nothing more is claimed; running handlers get the grace.
        let deadline = tokio::time::sleep(this.grace);
        tokio::pin!(deadline);
        while !tasks.is_empty() {
            tokio::select! {
                _ = &mut deadline => break,
                _ = tasks.join_next() => {}
            }
        }
        let left: Vec<(i64, Arc<str>, Option<u32>)> = {
            let running = running.lock().unwrap_or_else(|p| p.into_inner());
            for (_, cancel, _) in running.values() {
                cancel.cancel();
            }
            (running.iter())
                .map(|(id, (l, _, a))| (*id, l.clone(), *a))
                .collect()
        };
        // The handlers are dropped before their rows are given back.
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        let give_back = left.into_iter().map(|(id, lock, attempt)| {
            let (this, tally, label) = (&this, &tally, &label);
            async move {
                match this.queue.release(id, &lock).await {
                    Ok(true) => {
                        tally.add(|r| r.released += 1);
                        this.report(id, &lock, attempt, Outcome::Released);
                    }
                    Ok(false) => this.report(id, &lock, attempt, Outcome::Lost),
                    Err(e) => {
                        tracing::warn!(queue = %label, id, error = %e, "giving a row back at stop failed; it is claimable again when its lease ends")
                    }
                }
            }
        });
        // Past one lease the rows are claimable anyway: the stop waits no
        // longer for a database that does not answer.
        let released_before = tally
            .report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .released;
        let all = futures_util::future::join_all(give_back);
        if tokio::time::timeout(this.lease, all).await.is_err() {
            tracing::warn!(queue = %label, "giving rows back at stop timed out; they are claimable again when their leases end");
        }
        let released = tally
            .report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .released;
        this.wake_others(released - released_before).await;
        background.cancel();
        let report = tally
            .report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Ok(report)
    }

    /// One row: the handler under a renewed lease, then its finalize.
    async fn run_one<H, F>(
        &self,
        job: Job,
        lock: Arc<str>,
        claimed_at: Instant,
        handler: &H,
        tally: &Tally,
        running: &Running,
    ) where
        H: Fn(Job) -> F,
        F: Future<Output = Result<(), JobError>>,
    {
        let (id, attempt, cancel) = (job.id, job.attempt, job.cancel.clone());
        let label = self.queue.table().table.clone();
        if Instant::now() >= claimed_at + self.lease {
            // The claim's lease ran out before its handler could start (the
            // process was paused, or the claim's answer came late): another
            // worker may be running the row already. Never start it; give
            // it back, which fails harmlessly if another run took it.
            tracing::warn!(queue = %label, id, "a claimed work row's lease ran out before its handler started; giving it back unrun");
            metrics::counter!(EXPIRED_UNRUN, "queue" => label.clone()).increment(1);
            let outcome = match self.queue.release(id, &lock).await {
                Ok(true) => {
                    tally.add(|r| r.released += 1);
                    self.report(id, &lock, attempt, Outcome::Released);
                    self.wake_others(1).await;
                    return;
                }
                Ok(false) => {
                    tally.add(|r| r.lost += 1);
                    Outcome::Lost
                }
                Err(e) => {
                    tracing::warn!(queue = %label, id, error = %e, "giving back a work row whose lease ran out failed; it is claimable already");
                    return;
                }
            };
            self.report(id, &lock, attempt, outcome);
            return;
        }
        running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, (lock.clone(), cancel.clone(), attempt));
        let lost = CancellationToken::new();
        let renewal = self.renew(id, lock.clone(), claimed_at, cancel.clone(), lost.clone());
        let outcome = tokio::select! {
            r = handler(job) => Some(r),
            _ = cancel.cancelled() => None,
            _ = renewal => None,
        };
        {
            // A later claim of the same row (this run's lease was lost) is
            // another run: only this run's own entry goes.
            let mut running = running.lock().unwrap_or_else(|p| p.into_inner());
            if running.get(&id).is_some_and(|(l, _, _)| *l == lock) {
                running.remove(&id);
            }
        }
        let Some(outcome) = outcome else {
            if lost.is_cancelled() {
                // Lost, or not renewed before the lease ran out: either way
                // the row may be another worker's now.
                metrics::counter!(LOST, "queue" => label).increment(1);
                tally.add(|r| r.lost += 1);
                self.report(id, &lock, attempt, Outcome::Lost);
            }
            return;
        };
        let q = &self.queue;
        let (done, what) = match outcome {
            Ok(()) => (q.complete(id, &lock).await, "complete"),
            Err(e) => {
                let used_up =
                    matches!((self.max_attempts, attempt), (Some(max), Some(a)) if a >= max);
                match e.retry {
                    Some(after) if !used_up => {
                        tracing::debug!(queue = %label, id, error = %e.message, "work row failed; retrying later");
                        // A handler's delay is capped as a remote one is.
                        let delay = after
                            .unwrap_or_else(|| self.backoff.delay_jittered(attempt.unwrap_or(1)))
                            .min(super::backoff::MAX_RETRY_AFTER);
                        let r = if q.statements().fail_after.is_some() {
                            q.fail_after(id, &lock, delay).await
                        } else {
                            let r = q.release(id, &lock).await;
                            if matches!(r, Ok(true)) {
                                self.wake_others(1).await;
                            }
                            r
                        };
                        (r, "fail")
                    }
                    _ if q.table().on_dead.is_some() => {
                        tracing::warn!(queue = %label, id, ?attempt, error = %e.message, "work row is dead");
                        (q.discard(id, &lock).await, "dead")
                    }
                    _ => {
                        tracing::warn!(queue = %label, id, error = %e.message, "work row failed and the table has no on_dead; giving it back");
                        (q.release(id, &lock).await, "fail")
                    }
                }
            }
        };
        match done {
            Ok(true) => {
                let (metric, bump, outcome): (&'static str, fn(&mut WorkerReport), Outcome) =
                    match what {
                        "complete" => (COMPLETED, |r| r.completed += 1, Outcome::Completed),
                        "dead" => (DEAD, |r| r.dead += 1, Outcome::Dead),
                        _ => (FAILED, |r| r.failed += 1, Outcome::Failed),
                    };
                metrics::counter!(metric, "queue" => label).increment(1);
                tally.add(bump);
                self.report(id, &lock, attempt, outcome);
            }
            Ok(false) => {
                metrics::counter!(LOST, "queue" => label).increment(1);
                tally.add(|r| r.lost += 1);
                self.report(id, &lock, attempt, Outcome::Lost);
            }
            Err(e) => {
                tracing::error!(queue = %label, id, op = what, error = %e, "finalizing a work row failed; it runs again once its lease ends")
            }
        }
    }

    /// Tells the workers listening on this worker's channel that `given_back`
    /// rows are claimable again at once; without it they would find them
    /// only at their next idle poll. Nothing to do without a channel, or on
    /// SQLite.
    async fn wake_others(&self, given_back: u64) {
        let Some(channel) = &self.listen else {
            return;
        };
        if given_back == 0 {
            return;
        }
        // Bounded as giving rows back is: a stop waits no longer than that.
        let error = match tokio::time::timeout(self.lease, self.queue.notify(channel)).await {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        let label = &self.queue.table().table;
        tracing::debug!(queue = %label, %channel, %error, "notifying the other workers of rows given back failed; they find them at their next poll");
    }

    /// Renews the row's lease every third of it. Resolves, with `lost` and
    /// the job cancelled, when the lease is lost or could not be renewed
    /// before it ran out.
    async fn renew(
        &self,
        id: i64,
        lock: Arc<str>,
        claimed_at: Instant,
        cancel: CancellationToken,
        lost: CancellationToken,
    ) {
        let label = self.queue.table().table.clone();
        let every = self.lease / 3;
        // The claim's own lease runs from no earlier than the claim was
        // sent: the database set its expiry after that.
        let mut until = claimed_at + self.lease;
        // A claim answered late in its lease (but not past it) is renewed
        // within half of what is left, not a third of a lease after its
        // handler started, which could be past the lease's end.
        let mut wait = every.min(until.saturating_duration_since(Instant::now()) / 2);
        loop {
            tokio::time::sleep(wait).await;
            wait = every;
            let sent = Instant::now();
            // A renewal still unanswered when the lease runs out (the
            // database or the pool hangs) is a lost lease: another worker
            // may claim the row from then on.
            let left = until.saturating_duration_since(sent);
            let renewed = tokio::time::timeout(left, self.queue.renew(id, &lock, self.lease)).await;
            let Ok(renewed) = renewed else {
                metrics::counter!(RENEW_FAILURES, "queue" => label.clone()).increment(1);
                break;
            };
            match renewed {
                Ok(true) => until = sent + self.lease,
                Ok(false) => {
                    lost.cancel();
                    break;
                }
                Err(e) => {
                    metrics::counter!(RENEW_FAILURES, "queue" => label.clone()).increment(1);
                    tracing::warn!(queue = %label, id, error = %e, "renewing a work row's lease failed; retrying until it runs out");
                    if Instant::now() + every >= until {
                        break;
                    }
                }
            }
        }
        tracing::warn!(queue = %label, id, "lost a work row's lease while its handler ran; cancelled it (another worker may run the row)");
        lost.cancel();
        cancel.cancel();
    }
}

/// The claim's rows as jobs, each carrying its lock id until `run_one`
/// takes it.
fn jobs(rows: ClaimedRows, attempts: Option<&str>) -> Vec<(Job, Arc<str>)> {
    let attempt_of = |get: &dyn Fn(&str) -> Option<i64>| {
        attempts
            .and_then(get)
            .map(|a| a.clamp(0, i64::from(u32::MAX)) as u32)
    };
    match rows {
        #[cfg(feature = "postgres")]
        ClaimedRows::Postgres(rows) => rows
            .into_iter()
            .map(|c| {
                use sqlx::Row;
                let attempt = attempt_of(&|col| {
                    (c.row.try_get::<i64, _>(col).ok())
                        .or_else(|| c.row.try_get::<i32, _>(col).ok().map(i64::from))
                        .or_else(|| c.row.try_get::<i16, _>(col).ok().map(i64::from))
                });
                let job = Job {
                    id: c.id,
                    lock_id: c.lock_id.clone(),
                    attempt,
                    row: JobRow::Postgres(c.row),
                    cancel: CancellationToken::new(),
                };
                (job, c.lock_id)
            })
            .collect(),
        #[cfg(feature = "sqlite")]
        ClaimedRows::Sqlite(rows) => rows
            .into_iter()
            .map(|c| {
                use sqlx::Row;
                let attempt = attempt_of(&|col| c.row.try_get::<i64, _>(col).ok());
                let job = Job {
                    id: c.id,
                    lock_id: c.lock_id.clone(),
                    attempt,
                    row: JobRow::Sqlite(c.row),
                    cancel: CancellationToken::new(),
                };
                (job, c.lock_id)
            })
            .collect(),
    }
}

/// SQLite has no notifications: its workers poll.
#[cfg(not(feature = "postgres"))]
async fn listen(_: WorkPool, _: String, _: Arc<Notify>, _: CancellationToken) {}

/// Wakes the worker on every notification on `channel`; reconnects after
/// a failure; ends with `stop`. The LISTEN connection is the worker's own,
/// opened with the app pool's options but outside that pool, so it never
/// takes a connection the claims need (a pool of one would otherwise claim
/// nothing while the worker listens).
#[cfg(feature = "postgres")]
async fn listen(pool: WorkPool, channel: String, wake: Arc<Notify>, stop: CancellationToken) {
    let options = match pool {
        WorkPool::Postgres(pool) => (*pool.connect_options()).clone(),
        #[allow(unreachable_patterns)]
        _ => return,
    };
    let own = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(options);
    listen_on(&own, &channel, &wake, &stop).await;
    own.close().await;
}

#[cfg(feature = "postgres")]
async fn listen_on(pool: &sqlx::PgPool, channel: &str, wake: &Notify, stop: &CancellationToken) {
    while !stop.is_cancelled() {
        let connected = async {
            let mut l = sqlx::postgres::PgListener::connect_with(pool).await?;
            l.listen(channel).await?;
            Ok::<_, sqlx::Error>(l)
        };
        let mut listener = tokio::select! {
            _ = stop.cancelled() => return,
            l = connected => match l {
                Ok(l) => l,
                Err(e) => {
                    tracing::debug!(%channel, error = %e, "LISTEN failed; polling meanwhile");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
        };
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                n = listener.recv() => match n {
                    Ok(_) => wake.notify_one(),
                    Err(e) => {
                        tracing::debug!(%channel, error = %e, "LISTEN connection lost; reconnecting");
                        break;
                    }
                },
            }
        }
    }
}

/// Samples the queue depth and the oldest eligible row's age.
async fn sample(worker: Arc<Worker>, stop: CancellationToken) {
    let label = worker.queue.table().table.clone();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(worker.sample_every) => {}
        }
        match worker.queue.depth(worker.age_column.as_deref()).await {
            Ok((depth, age)) => {
                metrics::gauge!(DEPTH, "queue" => label.clone()).set(depth as f64);
                if let Some(age) = age {
                    metrics::gauge!(OLDEST, "queue" => label.clone()).set(age.as_secs_f64());
                }
            }
            Err(e) => {
                tracing::debug!(queue = %label, error = %e, "sampling the queue depth failed")
            }
        }
    }
}
