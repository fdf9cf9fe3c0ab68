//! The one-holder checker shared by `tests/coordinator.rs` and
//! `tests/chaos.rs`: the believed-held intervals of one role never overlap
//! and tokens strictly increase from term to term, ordered by start (one
//! instance resuming its own term after a store gap keeps its token).

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use rolegate::lease::LeaseEvent;

/// A clock the checker compares intervals on.
pub trait Time: Ord + Copy {
    /// How far `self` lies after `earlier`, for messages.
    fn after(self, earlier: Self) -> String;
}

/// Nanoseconds (`CLOCK_MONOTONIC`, as in event logs).
impl Time for u64 {
    fn after(self, earlier: Self) -> String {
        format!("{} ns", self - earlier)
    }
}

impl Time for Instant {
    fn after(self, earlier: Self) -> String {
        format!("{:?}", self - earlier)
    }
}

/// One term as its holder believed it: held from `start` to `end`.
#[derive(Debug, Clone)]
pub struct Held<T> {
    pub instance: String,
    pub role: String,
    pub token: u64,
    pub start: T,
    pub end: T,
}

/// Which overlapping intervals are violations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlaps {
    /// Any two intervals of a role (in-process coordinators).
    AnyTwo,
    /// Intervals of different instances only (one gateway's own terms of a
    /// role may touch in its log).
    AcrossInstances,
}

/// What [`check`] found.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Intervals checked (terms seen).
    pub terms: usize,
    pub overlaps: Vec<String>,
    pub token_regressions: Vec<String>,
}

impl Verdict {
    /// Panics on the first violation.
    pub fn assert_clean(&self) {
        if let Some(v) = self.overlaps.first() {
            panic!("overlapping held intervals: {v}");
        }
        if let Some(v) = self.token_regressions.first() {
            panic!("token regression: {v}");
        }
    }
}

/// The intervals of every role, each list ordered by (start, token).
pub fn by_role<T: Time>(intervals: &[Held<T>]) -> BTreeMap<&str, Vec<&Held<T>>> {
    let mut roles: BTreeMap<&str, Vec<&Held<T>>> = BTreeMap::new();
    for i in intervals {
        roles.entry(&i.role).or_default().push(i);
    }
    for list in roles.values_mut() {
        list.sort_by_key(|i| (i.start, i.token));
    }
    roles
}

/// Checks every role: an interval that begins before the latest end seen so
/// far overlaps (ending exactly when the next begins does not), and each
/// token is greater than the one before it.
pub fn check<T: Time>(intervals: &[Held<T>], overlaps: Overlaps) -> Verdict {
    let mut v = Verdict {
        terms: intervals.len(),
        ..Verdict::default()
    };
    for (role, list) in by_role(intervals) {
        let mut latest_end: Option<&Held<T>> = None;
        for w in &list {
            if let Some(prev) = latest_end {
                let counts = overlaps == Overlaps::AnyTwo || prev.instance != w.instance;
                if prev.end > w.start && counts {
                    v.overlaps.push(format!(
                        "role {role}: {} (token {}) held until {} after {} (token {}) began",
                        prev.instance,
                        prev.token,
                        prev.end.after(w.start),
                        w.instance,
                        w.token
                    ));
                }
            }
            if latest_end.is_none_or(|p| w.end > p.end) {
                latest_end = Some(w);
            }
        }
        for pair in list.windows(2) {
            // One instance may resume its own term after a store gap (the
            // store kept the grant): the same token, the same instance.
            let resumed = pair[1].token == pair[0].token && pair[1].instance == pair[0].instance;
            if pair[1].token < pair[0].token || (pair[1].token == pair[0].token && !resumed) {
                v.token_regressions.push(format!(
                    "role {role}: token {} ({}) followed by token {} ({})",
                    pair[0].token, pair[0].instance, pair[1].token, pair[1].instance
                ));
            }
        }
    }
    v
}

/// Pairs every `Began` of `events` with its `Ended`, in order: a term that
/// failed closed and resumed (same instance, same token) is two intervals.
/// Panics on a term that begins twice without ending, ends without
/// beginning, or is left open.
pub fn from_events(events: &[LeaseEvent]) -> Vec<Held<Instant>> {
    let mut open: HashMap<(String, String, u64), Instant> = HashMap::new();
    let mut closed = Vec::new();
    for e in events {
        match e {
            LeaseEvent::Began {
                instance,
                role,
                token,
                at,
                ..
            } => {
                let key = (instance.to_string(), role.to_string(), *token);
                assert!(
                    open.insert(key, *at).is_none(),
                    "{role} token {token} began twice at {instance}"
                );
            }
            LeaseEvent::Ended {
                instance,
                role,
                token,
                at,
            } => {
                let key = (instance.to_string(), role.to_string(), *token);
                let start = open.remove(&key).unwrap_or_else(|| {
                    panic!("{role} token {token} ended at {instance} without beginning")
                });
                closed.push(Held {
                    instance: key.0,
                    role: key.1,
                    token: key.2,
                    start,
                    end: *at,
                });
            }
            // Renewals, and events a later version may add, begin or end nothing.
            _ => {}
        }
    }
    assert!(open.is_empty(), "intervals left open: {open:?}");
    closed
}
