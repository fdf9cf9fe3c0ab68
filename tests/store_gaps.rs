//! A store that stops answering for longer than the holder's trust window,
//! but not past the lease itself: the holder fails closed during the gap
//! and then resumes the same term, with the same fencing token, because the
//! store kept its grant (PostgreSQL by its own clock, Redis by the key's TTL).
//! A new term would be a needless move of the role.
//!
//! Each case freezes a private server with SIGSTOP for
//! `duration - safety_margin + 0.5 s` right after a renewal, so the trust
//! window runs out in the gap while the store's lease does not.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rolegate::lease::LeaseEvent;
use rolegate::store::LeaseStore;
use rolegate::{CoordinatorBuilder, LeaseTimings};
use support::intervals::{self, Overlaps};

const T: LeaseTimings = LeaseTimings {
    duration: Duration::from_secs(3),
    renew_interval: Duration::from_secs(1),
    safety_margin: Duration::from_secs(1),
};

/// Freezes the store with `freeze`, thaws it with `thaw`, and checks that
/// the one holder failed closed in the gap and then went on under the token
/// it had before.
async fn a_gap_keeps_the_term(store: Arc<dyn LeaseStore>, freeze: impl Fn(), thaw: impl Fn()) {
    let events: Arc<Mutex<Vec<LeaseEvent>>> = Arc::default();
    let log = events.clone();
    let c = CoordinatorBuilder::new(store)
        .instance_name("gap")
        .advertise("http://127.0.0.1:9")
        .role("r", T)
        .on_lease_event(move |e| log.lock().unwrap().push(e))
        .start()
        .unwrap();
    let role = c.role("r").unwrap();
    support::wait_for("the role is held", Duration::from_secs(10), || {
        role.is_held()
    })
    .await;
    let token = role.guard().map(|g| g.token).unwrap();
    // Freeze right after a renewal: the store's lease then outlasts the gap
    // by `safety_margin - 0.5 s`, while the trust window does not.
    let renewals = |events: &[LeaseEvent]| {
        events
            .iter()
            .filter(|e| matches!(e, LeaseEvent::Renewed { .. }))
            .count()
    };
    let before = renewals(&events.lock().unwrap());
    support::wait_for("a renewal", Duration::from_secs(5), || {
        renewals(&events.lock().unwrap()) > before
    })
    .await;
    freeze();
    let frozen = Instant::now();
    let gap = T.duration - T.safety_margin + Duration::from_millis(500);
    let mut failed_closed = false;
    while frozen.elapsed() < gap {
        failed_closed |= !role.is_held();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    thaw();
    assert!(
        failed_closed,
        "the holder kept trusting its term through a {gap:?} gap"
    );
    support::wait_for("the role is held again", Duration::from_secs(10), || {
        role.is_held()
    })
    .await;
    let after = role.guard().map(|g| g.token).unwrap();
    c.shutdown().await;
    let events = events.lock().unwrap().clone();
    let began: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            LeaseEvent::Began { token, .. } => Some(*token),
            _ => None,
        })
        .collect();
    assert_eq!(
        after, token,
        "a new term began after the gap although the store kept the grant (terms began: {began:?})"
    );
    assert_eq!(began, vec![token, token], "began once, resumed once");
    intervals::check(&intervals::from_events(&events), Overlaps::AnyTwo).assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_frozen_past_the_trust_window_keeps_the_term() {
    let pg = support::PrivatePostgres::start();
    let store = rolegate::store::PostgresStore::connect(&pg.url(), "gap_leases")
        .await
        .expect("connect to the private PostgreSQL");
    store.migrate().await.unwrap();
    a_gap_keeps_the_term(
        Arc::new(store),
        || pg.signal_all("STOP"),
        || pg.signal_all("CONT"),
    )
    .await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_frozen_past_the_trust_window_keeps_the_term() {
    let redis = support::PrivateServer::redis_without_persistence();
    let store = rolegate::store::RedisStore::connect(&redis.redis_url(), "gap")
        .await
        .expect("connect to the private Redis");
    a_gap_keeps_the_term(
        Arc::new(store),
        || redis.signal("STOP"),
        || redis.signal("CONT"),
    )
    .await;
}
