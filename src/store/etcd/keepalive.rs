//! One instance's etcd lease and its keep-alive stream.
//!
//! The lease outlives its stream: a stream that breaks, or whose member
//! stops answering, is reopened on the same lease through the next member
//! (opening a stream sends a keep-alive and waits for its answer). The
//! lease is given up only when the cluster answers that it is gone, which
//! etcd does once the expired lease is revoked and every key attached to it
//! deleted. So a stream's failure never starts new terms; only a lease that
//! really expired does.

use std::time::Duration;

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};

use super::members::{is_lease_gone, CallError, Members, Patience};

/// An open keep-alive stream on one member.
struct Stream {
    member: usize,
    keeper: LeaseKeeper,
    answers: LeaseKeepAliveStream,
    /// A keep-alive was sent and its answer not read: a cancelled call left
    /// it so, and a late answer could be mistaken for a fresh one, so the
    /// stream is not used again.
    pending: bool,
}

/// What a keep-alive found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Renewal {
    /// Renewed by the member that answered, in the Raft term it answered
    /// in: the cluster's expiry is at least the TTL after the keep-alive was
    /// sent, provided that member's leader was the cluster's leader (a
    /// leader that was frozen and resumes answers keep-alives for a moment
    /// in its old term: the caller checks the term with a linearizable
    /// read).
    Alive {
        /// The answering member's Raft term when the keep-alive arrived.
        term: u64,
    },
    /// The cluster no longer has the lease (expired and revoked, its keys
    /// deleted).
    Gone,
}

/// One attempt's outcome on one member.
enum Attempt {
    Answered(Renewal),
    Failed(CallError),
}

/// An instance's etcd lease.
pub(super) struct InstanceLease {
    /// The lease id.
    pub(super) id: i64,
    /// The TTL it was granted.
    pub(super) ttl: Duration,
    stream: Option<Stream>,
}

impl InstanceLease {
    /// A lease just granted (the grant started its TTL; no stream yet).
    pub(super) fn new(id: i64, ttl: Duration) -> InstanceLease {
        InstanceLease {
            id,
            ttl,
            stream: None,
        }
    }

    /// Sends one keep-alive, through the open stream if its member leads
    /// the order, else by opening a stream on the next member in order,
    /// always on this lease. Each member gets its attempt deadline; the
    /// members are tried as for any call ([`Members::attempts`]).
    pub(super) async fn renew(&mut self, members: &Members) -> Result<Renewal, CallError> {
        let mut last = CallError::TimedOut(members.attempt());
        for (i, limit) in members.attempts(Patience::Read) {
            let attempt = tokio::time::timeout(limit, self.renew_on(members, i)).await;
            match attempt {
                Ok(Attempt::Answered(renewal)) => {
                    members.ok(i);
                    return Ok(renewal);
                }
                Ok(Attempt::Failed(e)) => {
                    self.stream = None;
                    members.failed(i);
                    last = e;
                }
                Err(_) => {
                    self.stream = None;
                    members.failed(i);
                    last = CallError::TimedOut(limit);
                }
            }
        }
        Err(last)
    }

    /// One keep-alive on member `i`, on the open stream when it is on that
    /// member, else on a new one (opening a stream sends a keep-alive whose
    /// answer the client library keeps to itself, so one more is sent for
    /// the term in its answer's header).
    async fn renew_on(&mut self, members: &Members, i: usize) -> Attempt {
        let usable = self
            .stream
            .as_ref()
            .is_some_and(|s| s.member == i && !s.pending);
        if !usable {
            self.stream = None;
            match self.open(members, i).await {
                Attempt::Answered(Renewal::Alive { .. }) => {}
                other => return other,
            }
        }
        let Some(s) = self.stream.as_mut() else {
            return Attempt::Failed(CallError::Etcd(etcd_client::Error::LeaseKeepAliveError(
                "no keep-alive stream".into(),
            )));
        };
        s.pending = true;
        if let Err(e) = s.keeper.keep_alive().await {
            return Attempt::Failed(CallError::Etcd(e));
        }
        match s.answers.message().await {
            Ok(Some(answer)) => {
                s.pending = false;
                if answer.ttl() > 0 {
                    let term = answer.header().map_or(0, |h| h.raft_term());
                    Attempt::Answered(Renewal::Alive { term })
                } else {
                    self.stream = None;
                    Attempt::Answered(Renewal::Gone)
                }
            }
            Ok(None) => Attempt::Failed(CallError::Etcd(etcd_client::Error::LeaseKeepAliveError(
                "keep-alive stream closed".into(),
            ))),
            Err(e) => Attempt::Failed(CallError::Etcd(e)),
        }
    }

    /// Opens a keep-alive stream for this lease on member `i` (which sends
    /// one keep-alive and reads its answer).
    async fn open(&mut self, members: &Members, i: usize) -> Attempt {
        let opened = match members.client(i).await {
            Ok(mut c) => c.lease_keep_alive(self.id).await,
            Err(e) => Err(e),
        };
        match opened {
            Ok((keeper, answers)) => {
                self.stream = Some(Stream {
                    member: i,
                    keeper,
                    answers,
                    pending: false,
                });
                Attempt::Answered(Renewal::Alive { term: 0 })
            }
            Err(etcd_client::Error::LeaseKeepAliveError(m)) if is_lease_gone(&m) => {
                Attempt::Answered(Renewal::Gone)
            }
            Err(e) => Attempt::Failed(CallError::Etcd(e)),
        }
    }
}
