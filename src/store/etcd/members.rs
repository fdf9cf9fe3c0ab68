//! The endpoints of an etcd cluster, each with a connection and a health of
//! its own, and the one way calls reach them ([`Members::call`]).
//!
//! A call goes to the healthy member that answered last, and moves on to
//! the next member when one fails or does not answer within a short
//! per-attempt deadline, as the Go client's health-checked balancer does,
//! going round the members with fresh attempts until its budget is spent.
//! A member that fails is probed in the background with a status call,
//! which every running member answers on its own (leader or not, even
//! during an election). So when calls fail everywhere, the members that
//! are up are tried before one that is frozen (SIGSTOP: it accepts TCP
//! connections but never answers) or dead: such a member costs one attempt
//! deadline once, not every call. A member that fails a call also ends the
//! streams opened on it (see [`Members::failures`]), so a watch never hangs
//! on a dead member.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};
use futures_util::future::join_all;
use tokio::sync::{watch, OnceCell};

/// Bounds of the per-attempt deadline, which is a twentieth of the shortest
/// lease duration claimed so far (see [`Members::tune`]).
const ATTEMPT_MIN: Duration = Duration::from_millis(100);
const ATTEMPT_MAX: Duration = Duration::from_millis(500);
/// The deadline before any claim told the durations.
const ATTEMPT_DEFAULT: Duration = Duration::from_millis(250);
/// A write (a transaction, a lease grant) gets this many attempt deadlines,
/// so a slow but healthy cluster (a slow disk) still commits it.
const WRITE_FACTOR: u32 = 4;
/// The attempt deadline of a [`Patience::Setup`] call, which goes round
/// the members twice.
const SETUP_DEADLINE: Duration = Duration::from_secs(2);
/// Bounds of a call's budget: it keeps going round the members with fresh
/// attempts (after an election the first fresh one succeeds, while one sent
/// before it waits on the old leader) until half the shortest lease
/// duration claimed has passed, within 1-5 s; always one full round.
const BUDGET_MIN: Duration = Duration::from_secs(1);
const BUDGET_MAX: Duration = Duration::from_secs(5);
const BUDGET_DEFAULT: Duration = Duration::from_millis(1_500);

/// Why a call failed: the last member's error, or its deadline.
#[derive(Debug)]
pub(super) enum CallError {
    /// A member answered with an error, or the transport failed.
    Etcd(etcd_client::Error),
    /// No member answered within its attempt deadline.
    TimedOut(Duration),
}

/// How long a call may wait for one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Patience {
    /// Reads and keep-alives: one attempt deadline.
    Read,
    /// Writes that go through Raft and the disk: [`WRITE_FACTOR`] of them.
    Write,
    /// A one-off call at start (`migrate`), which may meet a cluster that
    /// is still starting: [`SETUP_DEADLINE`].
    Setup,
}

#[derive(Debug, Default, Clone, Copy)]
struct Health {
    /// Calls failed in a row (0: healthy).
    fails: u32,
    /// When the member last answered a call.
    last_ok: Option<Instant>,
    /// When it last failed one.
    last_fail: Option<Instant>,
    /// When it last answered a status probe.
    alive_at: Option<Instant>,
}

impl Health {
    /// 0: healthy; 1: failing calls but answering probes since; 2: failing
    /// and silent (down, frozen, or not probed yet).
    fn class(&self) -> u8 {
        match (self.fails, self.alive_at, self.last_fail) {
            (0, _, _) => 0,
            (_, Some(alive), Some(failed)) if alive > failed => 1,
            _ => 2,
        }
    }
}

struct Member {
    url: String,
    client: OnceCell<Client>,
    health: Mutex<Health>,
    /// Counts the member's failures; streams on the member end when it moves.
    failures: watch::Sender<u64>,
}

/// Every endpoint of the cluster.
pub(super) struct Members {
    members: Vec<Member>,
    options: ConnectOptions,
    attempt_ms: AtomicU64,
    budget_ms: AtomicU64,
}

impl Members {
    /// One member per URL, connected lazily with `options`.
    pub(super) fn new(urls: Vec<String>, options: ConnectOptions) -> Members {
        let members = urls
            .into_iter()
            .map(|url| Member {
                url,
                client: OnceCell::new(),
                health: Mutex::new(Health::default()),
                failures: watch::channel(0).0,
            })
            .collect();
        Members {
            members,
            options,
            attempt_ms: AtomicU64::new(ATTEMPT_DEFAULT.as_millis() as u64),
            budget_ms: AtomicU64::new(BUDGET_DEFAULT.as_millis() as u64),
        }
    }

    /// Builds every member's client, each within `limit`; fails only when
    /// none could be built (a bad URL; with authentication, no member
    /// answered). Those that failed are built again on first use.
    pub(super) async fn connect(&self, limit: Duration) -> Result<(), CallError> {
        let attempts = (0..self.members.len()).map(|i| async move {
            match tokio::time::timeout(limit, self.client(i)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(CallError::Etcd(e)),
                Err(_) => Err(CallError::TimedOut(limit)),
            }
        });
        let mut last = None;
        for result in join_all(attempts).await {
            match result {
                Ok(()) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(CallError::TimedOut(limit)))
    }

    /// Starts the background prober: every attempt deadline, each failing
    /// member gets a status call; it ends when the members are dropped.
    pub(super) fn spawn_prober(self: &Arc<Self>) {
        let members = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(m) = members.upgrade() else { return };
                let every = m.attempt();
                m.probe_failing().await;
                drop(m);
                tokio::time::sleep(every).await;
            }
        });
    }

    async fn probe_failing(&self) {
        let failing = (0..self.members.len()).filter(|&i| lock(&self.members[i].health).fails > 0);
        let probes = failing.map(|i| async move {
            let limit = self.attempt();
            let status = async { self.client(i).await?.status().await };
            if let Ok(Ok(_)) = tokio::time::timeout(limit, status).await {
                lock(&self.members[i].health).alive_at = Some(Instant::now());
            }
        });
        join_all(probes).await;
    }

    /// The client of member `i`, connecting it on first use.
    pub(super) async fn client(&self, i: usize) -> Result<Client, etcd_client::Error> {
        let m = &self.members[i];
        let client = m
            .client
            .get_or_try_init(|| Client::connect([m.url.as_str()], Some(self.options.clone())))
            .await?;
        Ok(client.clone())
    }

    /// Sets the per-attempt deadline and the call budget from the shortest
    /// lease duration being claimed: a twentieth of it within 100-500 ms,
    /// and half of it within 1-5 s.
    pub(super) fn tune(&self, shortest: Duration) {
        let attempt = (shortest / 20).clamp(ATTEMPT_MIN, ATTEMPT_MAX);
        self.attempt_ms
            .store(attempt.as_millis() as u64, Ordering::Relaxed);
        let budget = (shortest / 2).clamp(BUDGET_MIN, BUDGET_MAX);
        self.budget_ms
            .store(budget.as_millis() as u64, Ordering::Relaxed);
    }

    /// How long a call keeps trying.
    pub(super) fn budget(&self) -> Duration {
        Duration::from_millis(self.budget_ms.load(Ordering::Relaxed))
    }

    /// How long one member gets to answer a read before the next is asked.
    pub(super) fn attempt(&self) -> Duration {
        Duration::from_millis(self.attempt_ms.load(Ordering::Relaxed))
    }

    /// The attempts of one call: (member, deadline), going round the members
    /// until the call's [`budget`](Self::budget) is spent (at least once;
    /// twice for [`Patience::Setup`]), each round in the
    /// [`order`](Self::order) of its start; from the second round on with
    /// twice the deadline (a cluster slow everywhere still answers).
    pub(super) fn attempts(
        &self,
        patience: Patience,
    ) -> impl Iterator<Item = (usize, Duration)> + '_ {
        let (deadline, budget, rounds) = match patience {
            Patience::Read => (self.attempt(), self.budget(), 1),
            Patience::Write => (self.attempt() * WRITE_FACTOR, self.budget(), 1),
            Patience::Setup => (SETUP_DEADLINE, Duration::ZERO, 2),
        };
        let at_least = rounds * self.members.len();
        let started = Instant::now();
        (1u32..)
            .flat_map(move |round| {
                let limit = deadline * round.min(2);
                self.order().into_iter().map(move |i| (i, limit))
            })
            .enumerate()
            .take_while(move |&(k, _)| k < at_least || started.elapsed() < budget)
            .map(|(_, attempt)| attempt)
    }

    /// The order a call tries the members in: healthy ones first, the one
    /// that answered last at their head; then failing ones that answer
    /// probes; then the silent ones; fewest failures in a row first among
    /// the failing. Ties keep the configured order.
    pub(super) fn order(&self) -> Vec<usize> {
        let health: Vec<Health> = self.members.iter().map(|m| *lock(&m.health)).collect();
        let mut order: Vec<usize> = (0..self.members.len()).collect();
        order.sort_by_key(|&i| {
            let h = health[i];
            (h.class(), h.fails, std::cmp::Reverse(h.last_ok))
        });
        order
    }

    /// Member `i` answered.
    pub(super) fn ok(&self, i: usize) {
        let mut h = lock(&self.members[i].health);
        h.fails = 0;
        h.last_ok = Some(Instant::now());
    }

    /// Member `i` failed a call or did not answer in time: it moves back in
    /// the order, and its streams end.
    pub(super) fn failed(&self, i: usize) {
        let first = {
            let mut h = lock(&self.members[i].health);
            h.fails = h.fails.saturating_add(1);
            h.last_fail = Some(Instant::now());
            h.fails == 1
        };
        if first {
            tracing::debug!(endpoint = %self.members[i].url, "etcd member failed a call; trying the others first");
        }
        self.members[i].failures.send_modify(|n| *n += 1);
    }

    /// Changes whenever member `i` fails a call.
    pub(super) fn failures(&self, i: usize) -> watch::Receiver<u64> {
        self.members[i].failures.subscribe()
    }

    /// Runs `op` against one member after another (see
    /// [`attempts`](Self::attempts)) until one answers; returns the answer
    /// and the member that gave it. An error that is the cluster's answer
    /// (not found, refused, invalid) is returned at once; any other error,
    /// or no answer within the attempt deadline, counts against the member
    /// and moves on.
    pub(super) async fn call_at<T, F, Fut>(
        &self,
        patience: Patience,
        mut op: F,
    ) -> Result<(usize, T), CallError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut last = CallError::TimedOut(self.attempt());
        for (i, limit) in self.attempts(patience) {
            let attempt = async {
                let client = self.client(i).await?;
                op(client).await
            };
            match tokio::time::timeout(limit, attempt).await {
                Ok(Ok(answer)) => {
                    self.ok(i);
                    return Ok((i, answer));
                }
                Ok(Err(e)) if is_answer(&e) => {
                    self.ok(i);
                    return Err(CallError::Etcd(e));
                }
                Ok(Err(e)) => {
                    self.failed(i);
                    last = CallError::Etcd(e);
                }
                Err(_) => {
                    self.failed(i);
                    last = CallError::TimedOut(limit);
                }
            }
        }
        Err(last)
    }

    /// [`call_at`](Self::call_at) for a read or keep-alive, without the member.
    pub(super) async fn call<T, F, Fut>(&self, op: F) -> Result<T, CallError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_at(Patience::Read, op)
            .await
            .map(|(_, answer)| answer)
    }

    /// [`call_at`](Self::call_at) for a write, without the member.
    pub(super) async fn write<T, F, Fut>(&self, op: F) -> Result<T, CallError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_at(Patience::Write, op)
            .await
            .map(|(_, answer)| answer)
    }
}

/// Whether an error is the cluster's answer to the request rather than a
/// failure of the member or the way to it: asking another member would get
/// the same answer.
pub(super) fn is_answer(e: &etcd_client::Error) -> bool {
    use tonic::Code;
    match e {
        etcd_client::Error::GRpcStatus(s) => matches!(
            s.code(),
            Code::NotFound
                | Code::InvalidArgument
                | Code::FailedPrecondition
                | Code::PermissionDenied
                | Code::Unauthenticated
                | Code::AlreadyExists
                | Code::OutOfRange
                | Code::Unimplemented
        ),
        etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) => true,
        etcd_client::Error::LeaseKeepAliveError(m) => is_lease_gone(m),
        _ => false,
    }
}

/// The keep-alive answer for a lease the cluster no longer has (etcd
/// answers a keep-alive of an expired lease only once it is revoked, with
/// its keys deleted).
pub(super) fn is_lease_gone(message: &str) -> bool {
    message == "lease not found"
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Members {
        let urls = (0..n)
            .map(|i| format!("http://127.0.0.1:{}", 1 + i))
            .collect();
        Members::new(urls, ConnectOptions::new())
    }

    fn probed(m: &Members, i: usize) {
        lock(&m.members[i].health).alive_at = Some(Instant::now());
    }

    #[test]
    fn the_member_that_answered_last_leads_and_failing_ones_sink() {
        let m = members(3);
        assert_eq!(m.order(), vec![0, 1, 2], "the configured order at first");
        m.failed(0);
        assert_eq!(m.order(), vec![1, 2, 0]);
        m.ok(2);
        assert_eq!(m.order(), vec![2, 1, 0], "the last to answer leads");
        m.failed(2);
        m.failed(2);
        assert_eq!(m.order(), vec![1, 0, 2], "fewest failures in a row first");
        m.ok(0);
        assert_eq!(m.order(), vec![0, 1, 2]);
    }

    #[test]
    fn when_all_fail_the_members_that_answer_probes_come_first() {
        let m = members(3);
        m.ok(0);
        // The leader freezes; the others fail too while they elect a new one.
        for i in [0, 1, 2] {
            m.failed(i);
        }
        assert_eq!(m.order(), vec![0, 1, 2], "no probe answered yet");
        probed(&m, 1);
        probed(&m, 2);
        assert_eq!(m.order(), vec![1, 2, 0], "the frozen member goes last");
        m.failed(1);
        assert_eq!(m.order(), vec![2, 0, 1], "a failure after the probe counts");
    }

    #[test]
    fn attempt_deadlines_follow_the_shortest_duration_within_bounds() {
        let m = members(3);
        assert_eq!(m.attempt(), ATTEMPT_DEFAULT);
        m.tune(Duration::from_secs(5));
        assert_eq!(m.attempt(), Duration::from_millis(250));
        assert_eq!(m.budget(), Duration::from_millis(2_500));
        let reads: Vec<_> = m.attempts(Patience::Read).take(9).collect();
        assert_eq!(reads.len(), 9, "round after round within the budget");
        let (first, later) = reads.split_at(3);
        assert!(first.iter().all(|&(_, d)| d == Duration::from_millis(250)));
        assert!(later.iter().all(|&(_, d)| d == Duration::from_millis(500)));
        let setup: Vec<_> = m.attempts(Patience::Setup).collect();
        assert_eq!(setup.len(), 6, "two rounds at start");
        let (_, write) = m.attempts(Patience::Write).next().unwrap_or_default();
        assert_eq!(write, Duration::from_secs(1));
        m.tune(Duration::from_secs(60));
        assert_eq!(m.attempt(), ATTEMPT_MAX);
        assert_eq!(m.budget(), BUDGET_MAX);
        m.tune(Duration::from_millis(500));
        assert_eq!(m.attempt(), ATTEMPT_MIN);
        assert_eq!(m.budget(), BUDGET_MIN);
    }

    #[test]
    fn a_failure_ends_the_streams_on_that_member() {
        let m = members(2);
        let rx = m.failures(1);
        m.failed(0);
        assert!(!rx.has_changed().unwrap_or(true));
        m.failed(1);
        assert!(rx.has_changed().unwrap_or(false));
    }

    #[tokio::test]
    async fn a_call_moves_past_a_member_that_does_not_answer() {
        let m = members(3);
        let calls = std::sync::atomic::AtomicUsize::new(0);
        // The client is not used: the op decides per attempt.
        let answer = m
            .call_at(Patience::Read, |_c| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        std::future::pending::<()>().await;
                    }
                    Ok::<_, etcd_client::Error>(n)
                }
            })
            .await;
        assert!(matches!(answer, Ok((1, 1))), "{answer:?}");
        assert_eq!(m.order()[0], 1, "the member that answered leads now");
        let refused = m
            .call(|_c| async { Err::<(), _>(etcd_client::Error::InvalidArgs("no".into())) })
            .await;
        assert!(matches!(refused, Err(CallError::Etcd(_))));
        assert_eq!(m.order()[0], 1, "an answer is not a member failure");
        let down = m
            .call(|_c| async { Err::<(), _>(etcd_client::Error::WatchError("down".into())) })
            .await;
        assert!(matches!(down, Err(CallError::Etcd(_))));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "the first call took two attempts"
        );
    }
}
