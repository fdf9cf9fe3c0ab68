//! etcd as the scale path, on a real 3-member etcd cluster on loopback with
//! etcd's default timings (heartbeat 100 ms, election timeout 1 s): three
//! coordinators, each with its own `EtcdStore` over all three endpoints,
//! share four roles while members are killed, frozen (SIGSTOP) and brought
//! back. A sampler watches every coordinator every 5 ms as a gateway would
//! (run the role here, or forward to a live holder, else answer 503).
//!
//! With a majority up, a held role keeps its token (no new term) and no
//! coordinator goes without a holder for a role beyond one renew interval.
//! On quorum loss every coordinator fails closed (no role held, not ready)
//! within `duration - safety_margin`, and serves again within one renew
//! interval of the quorum's return. Each test prints its figures
//! (`cargo test --features etcd --test etcd_cluster -- --nocapture`);
//! docs/stores.md carries them.
//!
//! The tests start their own cluster, one at a time. They need the `etcd`
//! binary (`scripts/test` installs it).
#![cfg(feature = "etcd")]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rolegate::lease::{LeaseEvent, RoleLease};
use rolegate::store::{EtcdStore, LeaseStore};
use rolegate::{Coordinator, CoordinatorBuilder, LeaseTimings};
use support::etcd::EtcdCluster;
use support::intervals::{self, Held, Overlaps};

/// Sized against etcd's election timeout (docs/stores.md): the trust window
/// less one renew interval (4 s) outlasts a leader election (1-2.6 s here)
/// and the first fresh call after it.
const T: LeaseTimings = LeaseTimings {
    duration: Duration::from_secs(6),
    renew_interval: Duration::from_secs(1),
    safety_margin: Duration::from_secs(1),
};
const ROLES: usize = 4;
const COORDINATORS: usize = 3;
/// How long a member stays killed, or a follower frozen.
const FAULT: Duration = Duration::from_secs(8);
/// How long the leader stays frozen: past an election (1-2 s), but less
/// than the lease TTL less one renew interval. A leader frozen longer
/// revokes, as it resumes, leases it believes expired although the new
/// leader kept them (etcd before 3.4.31 and 3.5.13; docs/stores.md): a
/// server fault no client can undo, which these tests do not inject.
const LEADER_FREEZE: Duration = Duration::from_secs(3);

/// One cluster at a time: three etcd members per test are enough for two cores.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

/// Every lease event of every coordinator of a test.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<LeaseEvent>>>);

impl Events {
    fn push(&self, e: LeaseEvent) {
        self.0.lock().unwrap().push(e);
    }

    /// Terms that began at or after `t`: (instance, role, token).
    fn began_since(&self, t: Instant) -> Vec<(String, String, u64)> {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter_map(|e| match e {
                LeaseEvent::Began {
                    instance,
                    role,
                    token,
                    at,
                    ..
                } if *at >= t => Some((instance.to_string(), role.to_string(), *token)),
                _ => None,
            })
            .collect()
    }

    /// The held intervals, every Began paired with its Ended.
    fn intervals(&self) -> Vec<Held<Instant>> {
        intervals::from_events(&self.0.lock().unwrap())
    }
}

/// Three coordinators over one cluster, sharing `ROLES` roles.
struct Rig {
    cs: Vec<Coordinator>,
    events: Events,
    names: Vec<String>,
}

impl Rig {
    /// Coordinator `n` lists the endpoints starting with member `first(n)`.
    async fn start(cluster: &EtcdCluster, first: impl Fn(usize) -> usize) -> Rig {
        Self::start_with(cluster, first, T).await
    }

    /// Like `start`, every role with `timings`.
    async fn start_with(
        cluster: &EtcdCluster,
        first: impl Fn(usize) -> usize,
        timings: LeaseTimings,
    ) -> Rig {
        // ROLEGATE_TEST_LOG=rolegate=debug shows the coordinators' logs.
        let filter = tracing_subscriber::EnvFilter::from_env("ROLEGATE_TEST_LOG");
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
        let ns = support::unique_table("cluster");
        let names: Vec<String> = (0..ROLES).map(|i| format!("role-{i}")).collect();
        let events = Events::default();
        let mut cs = Vec::new();
        for n in 0..COORDINATORS {
            let store = EtcdStore::connect(&cluster.endpoints_from(first(n)), &ns, None)
                .await
                .expect("connect to the etcd cluster");
            store.migrate().await.expect("the etcd cluster answers");
            let mut b = CoordinatorBuilder::new(Arc::new(store))
                .instance_name(format!("c{n}"))
                .advertise(format!("http://127.0.0.1:{}", 21_000 + n));
            for name in &names {
                b = b.role(name.clone(), timings);
            }
            let log = events.clone();
            cs.push(b.on_lease_event(move |e| log.push(e)).start().unwrap());
        }
        let rig = Rig { cs, events, names };
        support::wait_for(
            "every role held once and every coordinator ready",
            Duration::from_secs(20),
            || rig.steady(),
        )
        .await;
        rig
    }

    fn holders(&self, role: &str) -> usize {
        let held = |c: &Coordinator| c.role(role).is_some_and(|r| r.is_held());
        self.cs.iter().filter(|c| held(c)).count()
    }

    /// Every role held once, every coordinator ready and knowing where each
    /// role runs.
    fn steady(&self) -> bool {
        let knows = |c: &Coordinator| {
            self.names
                .iter()
                .all(|r| c.role(r).is_some_and(|l| served(&l)))
        };
        self.names.iter().all(|r| self.holders(r) == 1)
            && self.cs.iter().all(|c| c.is_ready() && knows(c))
    }

    /// Each role's token, read at its one holder.
    fn tokens(&self) -> Vec<(String, u64)> {
        let token = |r: &String| {
            self.cs
                .iter()
                .find_map(|c| c.role(r).and_then(|l| l.guard()))
                .map_or(0, |g| g.token)
        };
        self.names.iter().map(|r| (r.clone(), token(r))).collect()
    }

    fn closed(&self) -> bool {
        self.names.iter().all(|r| self.holders(r) == 0) && self.cs.iter().all(|c| !c.is_ready())
    }

    /// Stops every coordinator and checks the one-holder promise.
    async fn shutdown(self) {
        for c in &self.cs {
            c.shutdown().await;
        }
        intervals::check(&self.events.intervals(), Overlaps::AnyTwo).assert_clean();
    }
}

/// Whether a gateway with this coordinator would serve the role now: run it
/// here, or forward it to a live holder (else it answers 503).
fn served(l: &RoleLease) -> bool {
    l.is_held() || l.current_holder().is_some_and(|h| !h.here)
}

/// The longest spans the sampler saw.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    /// A role held by no coordinator.
    unserved: Duration,
    /// One coordinator neither holding a role nor knowing a live holder to
    /// forward to (a gateway answers 503 then).
    gap: Duration,
    /// Where the longest gap was: (coordinator, role, ended this long
    /// after sampling began).
    gap_at: Option<(usize, usize, Duration)>,
}

/// Samples every coordinator every 5 ms until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Seen>,
}

impl Sampler {
    fn start(rig: &Rig) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let (cs, names, halt) = (rig.cs.clone(), rig.names.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut seen = Seen::default();
            let mut unserved_since: Vec<Option<Instant>> = vec![None; names.len()];
            let mut gap_since: Vec<Option<Instant>> = vec![None; names.len() * cs.len()];
            let began = Instant::now();
            // Tracks one bad span; true when it is the longest so far.
            let track =
                |since: &mut Option<Instant>, bad: bool, now: Instant, max: &mut Duration| {
                    match (bad, *since) {
                        (true, None) => *since = Some(now),
                        (true, Some(t)) if now - t > *max => {
                            *max = now - t;
                            return true;
                        }
                        (true, Some(_)) => {}
                        (false, _) => *since = None,
                    }
                    false
                };
            while !halt.load(Ordering::SeqCst) {
                let now = Instant::now();
                for (r, name) in names.iter().enumerate() {
                    let roles: Vec<_> = cs.iter().filter_map(|c| c.role(name)).collect();
                    let held = roles.iter().any(|l| l.is_held());
                    track(&mut unserved_since[r], !held, now, &mut seen.unserved);
                    for (n, l) in roles.iter().enumerate() {
                        let since = &mut gap_since[r * cs.len() + n];
                        if track(since, !served(l), now, &mut seen.gap) {
                            seen.gap_at = Some((n, r, now - began));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            seen
        });
        Sampler { stop, task }
    }

    async fn finish(self) -> Seen {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("the sampler ran")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Kill,
    Pause,
}

/// Which member a fault hits, chosen once the cluster has a leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Victim {
    Leader,
    Follower,
    /// The member first in every coordinator's endpoint list (a follower
    /// when the coordinators started).
    FirstInEveryList,
}

/// One member is killed or frozen for `FAULT` (`LEADER_FREEZE` for a
/// frozen leader), then comes back. Each
/// coordinator lists a different member first (so every member carries one
/// coordinator's calls), except for `FirstInEveryList`.
async fn member_fault_keeps_every_role(victim: Victim, fault: Fault) {
    let _serial = serial().await;
    let mut cluster = EtcdCluster::start(3).await;
    let first = (cluster.wait_leader(Duration::from_secs(10)).await + 1) % 3;
    let rig = match victim {
        Victim::FirstInEveryList => Rig::start(&cluster, |_| first).await,
        _ => Rig::start(&cluster, |n| n).await,
    };
    // One quiet renew interval, then the fault.
    tokio::time::sleep(T.renew_interval).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let v = match victim {
        Victim::Leader => leader,
        Victim::Follower => (leader + 1) % 3,
        Victim::FirstInEveryList => first,
    };
    let sampler = Sampler::start(&rig);
    let t0 = Instant::now();
    match fault {
        Fault::Kill => cluster.kill(v),
        Fault::Pause => cluster.pause(v),
    }
    let frozen_leader = fault == Fault::Pause && v == leader;
    let hold = if frozen_leader { LEADER_FREEZE } else { FAULT };
    // How long etcd itself took writes no more (an election, for the leader).
    let etcd_out = cluster.wait_writable(Duration::from_secs(30)).await;
    tokio::time::sleep(hold.saturating_sub(t0.elapsed())).await;
    match fault {
        Fault::Kill => cluster.restart(v),
        Fault::Pause => cluster.resume(v),
    }
    cluster.wait_writable(Duration::from_secs(20)).await;
    // The member's return may itself move the leadership: watch through it.
    tokio::time::sleep(T.renew_interval * 3).await;
    let seen = sampler.finish().await;
    let new_terms = rig.events.began_since(t0);
    eprintln!(
        "figures: {fault:?} {victim:?} (member {v}, leader was {leader}; etcd took no write for {etcd_out:?}): \
         longest without any holder {:?}, longest gap at one coordinator {:?} (coordinator, role, end: {:?}), new terms {}",
        seen.unserved,
        seen.gap,
        seen.gap_at,
        new_terms.len()
    );
    assert!(
        new_terms.is_empty(),
        "a majority stayed up, yet new terms began (etcd took no write for {etcd_out:?}): {new_terms:?}"
    );
    assert!(
        seen.unserved <= T.renew_interval,
        "a role had no holder for {:?}, more than one renew interval",
        seen.unserved
    );
    assert!(
        seen.gap <= T.renew_interval,
        "a coordinator knew no live holder for {:?}, more than one renew interval",
        seen.gap
    );
    rig.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_keeps_every_role_and_token() {
    member_fault_keeps_every_role(Victim::Leader, Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_follower_keeps_every_role_and_token() {
    member_fault_keeps_every_role(Victim::Follower, Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freezing_the_leader_keeps_every_role_and_token() {
    member_fault_keeps_every_role(Victim::Leader, Fault::Pause).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freezing_a_follower_keeps_every_role_and_token() {
    member_fault_keeps_every_role(Victim::Follower, Fault::Pause).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_first_endpoint_of_every_list_keeps_every_role_and_token() {
    member_fault_keeps_every_role(Victim::FirstInEveryList, Fault::Kill).await;
}

/// Two of three members die: every coordinator fails closed (no role held,
/// not ready) within `duration - safety_margin`; once one member is back
/// and the cluster takes writes, every role is held again and every
/// coordinator ready and knowing the holder within one renew interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_loss_fails_closed_then_serves_again_within_one_renew_interval() {
    let _serial = serial().await;
    let mut cluster = EtcdCluster::start(3).await;
    let rig = Rig::start(&cluster, |n| n).await;
    tokio::time::sleep(T.renew_interval).await;

    let t0 = Instant::now();
    cluster.kill(1);
    cluster.kill(2);
    let bound = T.duration - T.safety_margin;
    let closed = support::wait_for("no role held and no coordinator ready", bound * 2, || {
        rig.closed()
    })
    .await;
    let closed = t0.elapsed().max(closed);
    // Stay closed through the outage.
    for _ in 0..20 {
        assert!(rig.closed(), "a coordinator served without a quorum");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    cluster.restart(1);
    cluster.wait_writable(Duration::from_secs(30)).await;
    let t1 = Instant::now();
    tracing::info!("the etcd cluster takes writes again");
    support::wait_for(
        "every role held again and every coordinator ready",
        Duration::from_secs(20),
        || rig.steady(),
    )
    .await;
    let back = t1.elapsed();
    eprintln!(
        "figures: quorum loss: failed closed after {closed:?} (bound {bound:?}), \
         served again {back:?} after the cluster took writes"
    );
    assert!(
        closed <= bound + Duration::from_millis(100),
        "failing closed took {closed:?}, bound duration - safety_margin = {bound:?}"
    );
    assert!(
        back <= T.renew_interval,
        "serving again took {back:?} after the quorum returned, more than one renew interval"
    );
    cluster.restart(2);
    rig.shutdown().await;
}

/// A healthy minute: no coordinator ever lacks a holder for a role, and no
/// term changes (etcd's whole-second TTLs and lease lookups must not make a
/// live holder look expired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_minute_has_no_gap_and_no_new_term() {
    let _serial = serial().await;
    let cluster = EtcdCluster::start(3).await;
    let rig = Rig::start(&cluster, |n| n).await;
    let sampler = Sampler::start(&rig);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let seen = sampler.finish().await;
    let new_terms = rig.events.began_since(t0);
    eprintln!(
        "figures: healthy minute: longest without any holder {:?}, longest gap at one coordinator {:?}, new terms {}",
        seen.unserved,
        seen.gap,
        new_terms.len()
    );
    assert!(new_terms.is_empty(), "new terms: {new_terms:?}");
    assert_eq!(seen.unserved, Duration::ZERO, "a role went without holder");
    assert_eq!(
        seen.gap,
        Duration::ZERO,
        "a coordinator lacked a live holder"
    );
    rig.shutdown().await;
}

/// Below the sizing rule of docs/stores.md on purpose: a leader election
/// (1-2.6 s here) can outlast the trust window (`duration - safety_margin`,
/// 2 s), so holders fail closed in it. etcd's new leader extends every lease
/// by its TTL, so the grant survives, and the holder resumes the same term.
const TIGHT: LeaseTimings = LeaseTimings {
    duration: Duration::from_secs(3),
    renew_interval: Duration::from_secs(1),
    safety_margin: Duration::from_secs(1),
};
/// A frozen leader stays frozen past the election timeout (1 s), and less
/// than the lease TTL less one renew interval (see `LEADER_FREEZE`).
const TIGHT_LEADER_FREEZE: Duration = Duration::from_millis(1800);
const ROUNDS: usize = 10;

/// The leader is killed (and restarted) or frozen (and resumed) `ROUNDS`
/// times; after each round every role runs under the token it had before.
/// Terms that failed closed in an election resume (a `Began` with the same
/// token at the same instance). How many fail closed depends on how long
/// each election takes (the figures line says); before terms resumed, a
/// new term began in the first round or two.
async fn leader_faults_keep_every_token(fault: Fault) {
    let _serial = serial().await;
    let mut cluster = EtcdCluster::start(3).await;
    let rig = Rig::start_with(&cluster, |n| n, TIGHT).await;
    let before = rig.tokens();
    let t0 = Instant::now();
    for round in 0..ROUNDS {
        let leader = cluster.wait_leader(Duration::from_secs(10)).await;
        match fault {
            Fault::Kill => {
                cluster.kill(leader);
                cluster.wait_writable(Duration::from_secs(30)).await;
                cluster.restart(leader);
            }
            Fault::Pause => {
                cluster.pause(leader);
                tokio::time::sleep(TIGHT_LEADER_FREEZE).await;
                cluster.resume(leader);
            }
        }
        cluster.wait_writable(Duration::from_secs(20)).await;
        support::wait_for(
            "every role held once and every coordinator ready",
            Duration::from_secs(20),
            || rig.steady(),
        )
        .await;
        assert_eq!(
            rig.tokens(),
            before,
            "round {round}: a new term began although the cluster kept every grant"
        );
    }
    let resumed = rig.events.began_since(t0);
    eprintln!(
        "figures: {fault:?} the leader {ROUNDS} times at 3 s / 1 s / 1 s: terms resumed with their token {}, new terms 0",
        resumed.len()
    );
    for (instance, role, token) in &resumed {
        let was = before.iter().find(|(r, _)| r == role).map(|(_, t)| *t);
        assert_eq!(
            Some(*token),
            was,
            "{instance} began {role} with a new token"
        );
    }
    rig.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_ten_times_at_tight_timings_keeps_every_token() {
    leader_faults_keep_every_token(Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freezing_the_leader_ten_times_at_tight_timings_keeps_every_token() {
    leader_faults_keep_every_token(Fault::Pause).await;
}
