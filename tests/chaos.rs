//! Fault injection against real processes, with a checker.
//!
//! PostgreSQL, five `rolegate run --events` gateways with short timings
//! (each reaching PostgreSQL through its own TCP fault proxy), five recording
//! apps, steady client load on role and partition routes, a few clients
//! keeping SSE streams of ticks open on partition routes (opened again when
//! they end), and random faults:
//! kill -9, SIGSTOP past the lease, SIGTERM, gateway restart, PostgreSQL
//! stopped, PostgreSQL frozen, added latency and blackholing between one
//! gateway and PostgreSQL. The checker then reads every event log and app
//! record and counts violations of the one-holder promise, and of "work
//! never outlives its term": no tick a stream client received was made by an
//! app after a newer term of its role began.
//!
//! With ROLEGATE_CHAOS_STORE=etcd-cluster the store is a 3-member etcd
//! cluster instead (every gateway lists all endpoints), with etcd-sized
//! timings, and the store faults are one member killed (`kill -9`, then a
//! restart) or frozen (SIGSTOP, then SIGCONT), the leader half the time.
//!
//! Short mode (this test, about 2 minutes, PostgreSQL) runs in `scripts/test`.
//! Long mode: `scripts/chaos --minutes N [--store etcd-cluster]` (sets
//! ROLEGATE_CHAOS_SECS, ROLEGATE_CHAOS_REPORT and ROLEGATE_CHAOS_STORE).
//!
//! The parts live in `tests/chaos/`: `backend.rs` (the store and its faults),
//! `harness.rs` (processes, load, faults), `fault_proxy.rs` (the TCP proxy)
//! and `checker.rs`.

mod support;

#[path = "chaos/mod.rs"]
mod chaos;

use rand::SeedableRng;
use support::events::Event;

use chaos::backend::Store;
use chaos::checker::{self, Report};
use chaos::harness::{self, Load, Rig, Sent, Settings, Streamed, Streams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_holder_survives_random_faults() {
    let Settings { secs, seed } = Settings::from_env();
    let store = Store::from_env();
    eprintln!("chaos: {secs} s on {}, seed {seed}", store.name());
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    let dir = std::env::temp_dir().join(format!("rolegate-chaos-{}", std::process::id()));
    let mut rig = Rig::start(&dir, store).await;
    let load = Load::start(seed, &rig.gws);
    let streams = Streams::start(seed, &rig.gws);
    let (faults, edge_faults) = harness::inject_faults(&mut rig, &mut rng, secs).await;
    let sent = load.finish().await;
    let streamed = streams.finish().await;
    rig.stop_gateways();

    let executions = rig.executions();
    let report = checker::check(
        &rig.event_files(),
        &executions,
        &sent,
        &streamed,
        &faults,
        &edge_faults,
    );
    let text = checker::render(&report, secs, store);
    eprintln!("{text}");
    if let Ok(path) = std::env::var("ROLEGATE_CHAOS_REPORT") {
        std::fs::write(&path, &text).unwrap();
    }
    checker::print_violations(&report);
    assert_one_holder_kept(&report, store);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The run's verdict: no violation of the one-holder promise, no lost
/// request, no stream tick made after its term's end, and enough
/// transitions, load and ticks to mean something.
fn assert_one_holder_kept(report: &Report, store: Store) {
    assert!(
        report.overlaps.is_empty(),
        "overlapping held intervals: {:?}",
        &report.overlaps[..report.overlaps.len().min(5)]
    );
    assert!(
        report.token_regressions.is_empty(),
        "token regressions: {:?}",
        &report.token_regressions[..report.token_regressions.len().min(5)]
    );
    assert!(
        report.admissions_outside.is_empty(),
        "admissions outside held intervals: {:?}",
        &report.admissions_outside[..report.admissions_outside.len().min(5)]
    );
    assert!(
        report.lost.is_empty(),
        "lost requests: {:?}",
        &report.lost[..report.lost.len().min(5)]
    );
    assert!(
        report.ticks_after_term.is_empty(),
        "{} stream ticks made after their term's end: {:?}",
        report.ticks_after_term.len(),
        &report.ticks_after_term[..report.ticks_after_term.len().min(5)]
    );
    assert!(
        report.malformed_ticks.is_empty(),
        "malformed stream events: {:?}",
        &report.malformed_ticks[..report.malformed_ticks.len().min(5)]
    );
    assert!(
        report.stream_clients == 0 || report.ticks > 0,
        "{} stream clients configured but no tick received: nothing was checked ({report:?})",
        report.stream_clients
    );
    if store == Store::EtcdCluster {
        // One member down or frozen, a majority up: no role goes without a
        // holder and no term changes.
        for (kind, ms) in &report.no_holder_ms {
            if kind.is_member() {
                assert!(
                    ms.iter().all(|&m| m == 0),
                    "{}: a role went without holder for {ms:?} ms",
                    kind.name()
                );
            }
        }
        for (kind, n) in &report.new_terms {
            assert_eq!(*n, 0, "{}: {n} new terms with a majority up", kind.name());
        }
    }
    let needed = store.min_transitions();
    assert!(
        report.transitions >= needed,
        "only {} role transitions; the short run needs at least {needed}",
        report.transitions
    );
    assert!(
        report.admissions > 100 && report.executions > 100,
        "too little load: {report:?}"
    );
}

/// The checker reads logs in the gateway's line format and flags what the
/// run must not contain: overlapping terms of two instances (one closed at
/// its last deadline, as after `kill -9`), an admission after the admitting
/// instance's term ended, a stale-token execution, a lost request (and not
/// one cut as its role's term ended), and a
/// stream tick made after a newer term of its role began.
#[test]
fn checker_flags_violations_in_event_logs() {
    let dir = tempfile::tempdir().unwrap();
    let s = |v: &str| v.to_string();
    let gw0 = [
        Event::Start {
            instance: s("a"),
            pid: 1,
            t: 0,
        },
        Event::Began {
            instance: s("a"),
            role: s("m"),
            token: 1,
            t: 100,
            until: 1_000,
        },
        Event::Renewed {
            instance: s("a"),
            role: s("m"),
            token: 1,
            until: 2_000,
        },
        Event::Ended {
            instance: s("a"),
            role: s("m"),
            token: 1,
            t: 1_500,
        },
        Event::Admit {
            instance: s("a"),
            role: s("m"),
            token: 1,
            t: 1_600,
        },
    ];
    let gw1 = [
        Event::Start {
            instance: s("b"),
            pid: 2,
            t: 0,
        },
        Event::Began {
            instance: s("b"),
            role: s("m"),
            token: 2,
            t: 1_200,
            until: 3_000,
        },
        Event::Admit {
            instance: s("b"),
            role: s("m"),
            token: 2,
            t: 1_300,
        },
    ];
    let mut files = Vec::new();
    for (n, events) in [&gw0[..], &gw1[..]].into_iter().enumerate() {
        let path = dir.path().join(format!("gw{n}.events"));
        let text: String = events
            .iter()
            .map(|e| serde_json::to_string(e).unwrap() + "\n")
            .collect();
        std::fs::write(&path, text + "{\"ev\":\"began\",\"inst").unwrap();
        files.push(path);
    }
    let executions = [(0, s("m"), 2, 10), (1, s("m"), 1, 20)];
    let sent = [
        // Cut with no fault and no term of its role ending: lost.
        Sent {
            gateway: 0,
            role: s("n"),
            start_ns: 0,
            end_ns: 5,
            status: None,
        },
        // Cut as its role's term ended (at 1_500): by design.
        Sent {
            gateway: 0,
            role: s("m"),
            start_ns: 1_400,
            end_ns: 1_450,
            status: None,
        },
    ];
    let tick = |token: u64, made: u64| {
        harness::parse_tick(&format!("data: app0 m {token} {made}\n\n"), 0).unwrap()
    };
    let streamed = Streamed {
        clients: 1,
        streams: vec![(0, 0, 2_000, "eof")],
        refused: 0,
        // Before token 2 began; at and after it; under token 2 itself.
        ticks: vec![
            tick(1, 1_100),
            tick(1, 1_200),
            tick(1, 1_250),
            tick(2, 1_300),
        ],
        malformed: vec![s("data: app0 - - 1\n\n")],
    };
    assert!(harness::parse_tick("data: app0 - - 1\n\n", 0).is_none());
    let report = checker::check(&files, &executions, &sent, &streamed, &[], &[]);
    assert_eq!(report.transitions, 2, "{report:?}");
    assert_eq!(report.overlaps.len(), 1, "{report:?}");
    assert!(report.token_regressions.is_empty(), "{report:?}");
    assert_eq!(report.admissions, 2, "{report:?}");
    assert_eq!(report.admissions_outside.len(), 1, "{report:?}");
    assert_eq!(report.stale_executions.len(), 1, "{report:?}");
    assert_eq!(report.lost.len(), 1, "{report:?}");
    assert_eq!(report.cut_by_term_end, 1, "{report:?}");
    assert_eq!(report.ticks, 4, "{report:?}");
    assert_eq!(report.tick_terms, 2, "{report:?}");
    assert_eq!(report.ticks_after_term.len(), 2, "{report:?}");
    assert_eq!(report.malformed_ticks.len(), 1, "{report:?}");
    // 100 ns before token 2 began.
    assert!(
        report
            .closest_tick_ms
            .is_some_and(|ms| (ms - 1e-4).abs() < 1e-9),
        "{report:?}"
    );
}
