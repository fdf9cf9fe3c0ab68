//! Holding a role request that has no servable holder right now (the
//! holder is unknown or expired, this instance is handing the role over or
//! draining, the hop could not be sent, the holder refused it before reading
//! any of it): the request waits, woken by the coordinator's view changing,
//! and is then served where the view says. Bounded by `proxy.hold_timeout`
//! and `proxy.max_held`. A held request's body stays unread on its socket.
//!
//! A request is never sent twice: it is sent again only when none of it can
//! have reached an app or been admitted by a peer. [`Reclaim`] is the body
//! that knows: until the first poll the body is still ours to take back, and
//! a hop with a body waits for the holder's `100 Continue` (its admission)
//! before the first poll.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use futures_util::task::AtomicWaker;

use crate::telemetry;

/// The bounds of holding, shared by every request of a process, and what is
/// held now per role.
#[derive(Debug)]
pub(crate) struct Holds {
    /// `proxy.hold_timeout` (zero: answer 503 at once).
    pub timeout: Duration,
    max: usize,
    now: AtomicUsize,
    /// Per role, the requests held since none were: one episode per move
    /// of the role as this instance sees it.
    roles: Mutex<HashMap<Arc<str>, Episode>>,
}

/// The requests of one role held since none were, and how their holds ended.
#[derive(Debug)]
struct Episode {
    now: usize,
    started: Instant,
    held: usize,
    longest: Duration,
    local: usize,
    forwarded: usize,
    timed_out: usize,
    /// Answered with a refusal of another kind once the view changed.
    refused: usize,
    /// The client went away while held.
    gone: usize,
}

impl Holds {
    /// Holding for up to `timeout`, at most `max` requests at once.
    pub(crate) fn new(timeout: Duration, max: usize) -> Arc<Self> {
        Arc::new(Self {
            timeout,
            max,
            now: AtomicUsize::new(0),
            roles: Mutex::default(),
        })
    }

    /// A place among the held requests of `role`, unless `max_held` are
    /// held already.
    pub(crate) fn enter(self: &Arc<Self>, role: Arc<str>) -> Option<HeldSlot> {
        let mut n = self.now.load(Ordering::Relaxed);
        loop {
            if n >= self.max {
                return None;
            }
            match self
                .now
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(seen) => n = seen,
            }
        }
        metrics::gauge!(telemetry::HELD_REQUESTS).increment(1.0);
        let since = Instant::now();
        let mut roles = self.roles();
        let e = roles.entry(role.clone()).or_insert_with(|| Episode {
            now: 0,
            started: since,
            held: 0,
            longest: Duration::ZERO,
            local: 0,
            forwarded: 0,
            timed_out: 0,
            refused: 0,
            gone: 0,
        });
        e.now += 1;
        e.held += 1;
        Some(HeldSlot {
            holds: self.clone(),
            since,
            role,
            outcome: None,
        })
    }

    #[cfg(feature = "gateway")]
    /// The requests held now, per role (roles with none left out).
    pub(crate) fn held_by_role(&self) -> HashMap<Arc<str>, usize> {
        self.roles()
            .iter()
            .map(|(r, e)| (r.clone(), e.now))
            .collect()
    }

    fn roles(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Episode>> {
        self.roles.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One held request of `role` ended with `outcome`. The last one of an
    /// episode says in one line how many were held, for how long, and where
    /// they went.
    fn leave(&self, role: &Arc<str>, held_for: Duration, outcome: Option<&'static str>) {
        let mut roles = self.roles();
        let Some(e) = roles.get_mut(role) else {
            return;
        };
        e.now -= 1;
        e.longest = e.longest.max(held_for);
        match outcome {
            Some("held_then_local") => e.local += 1,
            Some("held_then_forwarded") => e.forwarded += 1,
            Some("held_then_refused") => e.refused += 1,
            Some(_) => e.timed_out += 1,
            None => e.gone += 1,
        }
        let ended = if e.now == 0 { roles.remove(role) } else { None };
        // Logged without the lock: a slow log writer never stalls holds.
        drop(roles);
        if let Some(e) = ended {
            tracing::info!(
                %role,
                held = e.held,
                longest_ms = e.longest.as_millis() as u64,
                over_ms = e.started.elapsed().as_millis() as u64,
                served_here = e.local,
                forwarded = e.forwarded,
                timed_out = e.timed_out,
                refused = e.refused,
                client_gone = e.gone,
                "requests held while the role had no servable holder were released"
            );
        }
    }
}

/// One held request; counted until dropped.
#[derive(Debug)]
pub(crate) struct HeldSlot {
    holds: Arc<Holds>,
    since: Instant,
    role: Arc<str>,
    outcome: Option<&'static str>,
}

impl HeldSlot {
    /// Records how the hold ended (`held_then_local`, `held_then_forwarded`,
    /// `held_then_refused`, `hold_timeout`) and how long it lasted.
    pub(crate) fn done(mut self, outcome: &'static str) {
        metrics::histogram!(telemetry::HOLD_SECONDS).record(self.since.elapsed().as_secs_f64());
        metrics::counter!(telemetry::HOLD_OUTCOMES, "outcome" => outcome).increment(1);
        self.outcome = Some(outcome);
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        self.holds.now.fetch_sub(1, Ordering::AcqRel);
        metrics::gauge!(telemetry::HELD_REQUESTS).decrement(1.0);
        self.holds
            .leave(&self.role, self.since.elapsed(), self.outcome);
    }
}

/// What [`Reclaim`] and its owner share.
#[derive(Default)]
struct Shared {
    body: Mutex<Option<Body>>,
    /// The body was polled: some of it may have left.
    taken: AtomicBool,
    /// The next hop admitted the request (`100 Continue`), or no admission is awaited.
    admitted: AtomicBool,
    waker: AtomicWaker,
}

/// The owner's side of a [`Reclaim`] body.
#[derive(Clone)]
pub(crate) struct ReclaimHandle(Arc<Shared>);

impl ReclaimHandle {
    /// The body back, if no byte of it can have been sent.
    pub(crate) fn take_back(&self) -> Option<Body> {
        // Under the lock the body's poller takes it by, so the two never both
        // get it.
        let mut body = self.0.body.lock().unwrap_or_else(|p| p.into_inner());
        if self.0.taken.load(Ordering::Acquire) {
            return None;
        }
        body.take()
    }

    /// Whether the body was polled (some of it may have been sent).
    pub(crate) fn is_taken(&self) -> bool {
        self.0.taken.load(Ordering::Acquire)
    }

    /// The next hop admitted the request: the body may go.
    pub(crate) fn admit(&self) {
        self.0.admitted.store(true, Ordering::Release);
        self.0.waker.wake();
    }
}

/// A request body that stays the sender's until it is first polled, and is
/// only polled once the next hop admitted the request.
pub(crate) struct Reclaim {
    shared: Arc<Shared>,
    body: Option<Body>,
    size: http_body::SizeHint,
    end: bool,
    /// Sends the body anyway after this long without an admission (a peer
    /// that never answers `100 Continue`), as RFC 9110 10.1.1 allows.
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Reclaim {
    /// `body`, to be admitted first when `await_admission` (then the body
    /// goes anyway after `patience`).
    pub(crate) fn new(
        body: Body,
        await_admission: bool,
        patience: Duration,
    ) -> (Self, ReclaimHandle) {
        let size = http_body::Body::size_hint(&body);
        let end = http_body::Body::is_end_stream(&body);
        let shared = Arc::new(Shared {
            body: Mutex::new(Some(body)),
            admitted: AtomicBool::new(!await_admission),
            ..Shared::default()
        });
        let handle = ReclaimHandle(shared.clone());
        let wait = await_admission.then(|| Box::pin(tokio::time::sleep(patience)));
        (
            Self {
                shared,
                body: None,
                size,
                end,
                wait,
            },
            handle,
        )
    }
}

impl http_body::Body for Reclaim {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if this.body.is_none() {
            if !this.shared.admitted.load(Ordering::Acquire) {
                this.shared.waker.register(cx.waker());
                let patient = this
                    .wait
                    .as_mut()
                    .is_some_and(|w| w.as_mut().poll(cx).is_pending());
                if !this.shared.admitted.load(Ordering::Acquire) && patient {
                    return Poll::Pending;
                }
            }
            let body = {
                let mut slot = this.shared.body.lock().unwrap_or_else(|p| p.into_inner());
                this.shared.taken.store(true, Ordering::Release);
                slot.take()
            };
            match body {
                Some(b) => this.body = Some(b),
                // Taken back for another holder: this send must not look
                // complete.
                None => {
                    return Poll::Ready(Some(Err(axum::Error::new(std::io::Error::other(
                        "the request body went to another holder",
                    )))))
                }
            }
        }
        match this.body.as_mut() {
            Some(b) => Pin::new(b).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            Some(b) => b.is_end_stream(),
            None => self.end,
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match &self.body {
            Some(b) => b.size_hint(),
            None => self.size,
        }
    }
}
