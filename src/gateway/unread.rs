//! The process-wide budget of response bytes handed to client connections
//! that have not asked for more. A body that yields a frame holds the
//! frame's bytes against the budget until its connection polls it again (it
//! had room for more) or drops it, so what the budget counts is what sits in
//! connections whose clients are not reading. When a frame would take the
//! total past the budget, the connection whose body has waited longest is
//! closed: a few clients that never read cannot take the memory that
//! everyone else's requests need. Per stream and per connection the
//! buffering is bounded already (see `proxy::defaults`); this bounds their sum.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::sync::Notify;

/// A body whose size is known and at most this is not metered: it is one
/// small frame, bounded by the per-stream limits already.
pub(crate) const UNMETERED_BELOW: u64 = 16 * 1024;

/// The budget and who holds what of it.
pub(crate) struct UnreadBudget {
    limit: usize,
    ledger: Mutex<Ledger>,
}

#[derive(Default)]
struct Ledger {
    used: usize,
    next_id: u64,
    holders: HashMap<u64, Holder>,
}

struct Holder {
    bytes: usize,
    since: Instant,
    /// Closes the holder's client connection.
    evict: Arc<Notify>,
}

impl UnreadBudget {
    pub(crate) fn new(limit_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            limit: limit_bytes,
            ledger: Mutex::new(Ledger::default()),
        })
    }

    pub(crate) fn new_id(&self) -> u64 {
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        ledger.next_id += 1;
        ledger.next_id
    }

    /// `id` now holds `bytes` unread; over the budget, the longest-waiting
    /// other holders' connections are closed until it fits.
    pub(crate) fn hold(&self, id: u64, bytes: usize, evict: &Arc<Notify>) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        ledger.used += bytes;
        let holder = Holder {
            bytes,
            since: Instant::now(),
            evict: evict.clone(),
        };
        if let Some(old) = ledger.holders.insert(id, holder) {
            ledger.used -= old.bytes;
        }
        while ledger.used > self.limit {
            let slowest = ledger
                .holders
                .iter()
                .filter(|(other, h)| **other != id && !Arc::ptr_eq(&h.evict, evict))
                .min_by_key(|(_, h)| h.since)
                .map(|(other, _)| *other);
            let Some(slowest) = slowest else { break };
            if let Some(h) = ledger.holders.remove(&slowest) {
                ledger.used -= h.bytes;
                h.evict.notify_one();
                metrics::counter!(crate::telemetry::SLOW_READERS_CLOSED).increment(1);
            }
        }
        metrics::gauge!(crate::telemetry::UNREAD_BYTES).set(ledger.used as f64);
    }

    pub(crate) fn release(&self, id: u64) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = ledger.holders.remove(&id) {
            ledger.used -= h.bytes;
        }
    }

    /// `body`, metered against this budget; `evict` closes its connection.
    pub(crate) fn meter(
        self: &Arc<Self>,
        body: axum::body::Body,
        evict: &Arc<Notify>,
    ) -> axum::body::Body {
        use http_body::Body as _;
        let hint = body.size_hint();
        if body.is_end_stream() || hint.upper().is_some_and(|n| n <= UNMETERED_BELOW) {
            return body;
        }
        axum::body::Body::new(Metered {
            body,
            budget: self.clone(),
            evict: evict.clone(),
            id: self.new_id(),
            holding: false,
        })
    }
}

/// A response body that holds its last frame's bytes against the budget.
struct Metered {
    body: axum::body::Body,
    budget: Arc<UnreadBudget>,
    evict: Arc<Notify>,
    id: u64,
    holding: bool,
}

impl http_body::Body for Metered {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if self.holding {
            // Asked again: the connection had room for the last frame.
            self.budget.release(self.id);
            self.holding = false;
        }
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.budget.hold(self.id, data.len(), &self.evict);
                self.holding = true;
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        if self.holding {
            self.budget.release(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_the_budget_the_longest_waiting_other_connection_is_closed() {
        let budget = UnreadBudget::new(100);
        let (a, b, c) = (
            Arc::new(Notify::new()),
            Arc::new(Notify::new()),
            Arc::new(Notify::new()),
        );
        budget.hold(1, 40, &a);
        budget.hold(2, 40, &b);
        budget.release(2);
        budget.hold(2, 40, &b);
        // 120 > 100: the oldest holder (1, connection a) goes.
        budget.hold(3, 40, &c);
        let used = budget.ledger.lock().unwrap().used;
        assert_eq!(used, 80);
        let ledger = budget.ledger.lock().unwrap();
        assert!(!ledger.holders.contains_key(&1));
        assert!(ledger.holders.contains_key(&2) && ledger.holders.contains_key(&3));
        drop(ledger);
        // a's notice is stored for its connection to see.
        let closed = futures_util::FutureExt::now_or_never(a.notified());
        assert!(closed.is_some(), "a was told to close");
        assert!(futures_util::FutureExt::now_or_never(b.notified()).is_none());
        // A connection is never closed for its own frame.
        budget.hold(4, 500, &c);
        assert!(futures_util::FutureExt::now_or_never(c.notified()).is_none());
    }
}
