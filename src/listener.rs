//! What both listeners (public and admin) share: head limits and the header
//! read timeout, accept-error backoff with a rate-limited log, the
//! open-files limit and the connection cap that fits it, and the accept
//! step both loops run.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::shutdown::Shutdown;

/// The next connection, with the connection slot it holds: a slot is taken
/// first (at the cap, connections wait in the kernel's backlog and file
/// descriptors stay free), accept errors back off and are retried, never
/// fatal. `None` once `stop` fires.
pub(crate) async fn next_connection(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
    backoff: &mut AcceptBackoff,
    stop: &mut Shutdown,
) -> Option<(TcpStream, SocketAddr, OwnedSemaphorePermit)> {
    loop {
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => s.ok()?,
            _ = stop.recv() => return None,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.recv() => return None,
        };
        match accepted {
            Ok((stream, client)) => {
                backoff.reset();
                return Some((stream, client, slot));
            }
            // Out of file descriptors and the like: back off, never exit.
            Err(e) => backoff.failed(&e).await,
        }
    }
}

/// Largest request head (request line + headers) accepted; larger gets 431.
pub(crate) const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Most header fields in a request head; more gets 431.
pub(crate) const MAX_HEADERS: usize = 100;

/// How long a client may take to send a request head (public listener).
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The admin listener's header read timeout: shorter, since its clients are
/// probes and scrapers, and `/readyz` must stay answerable.
pub(crate) const ADMIN_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Accept failures (out of file descriptors, mostly): a growing pause between
/// attempts, and at most one log line per second with how many were hidden.
#[derive(Default)]
pub(crate) struct AcceptBackoff {
    delay: Duration,
    last_log: Option<std::time::Instant>,
    hidden: u64,
}

impl AcceptBackoff {
    pub(crate) fn reset(&mut self) {
        self.delay = Duration::ZERO;
    }

    pub(crate) async fn failed(&mut self, e: &std::io::Error) {
        if let Some(suppressed) = self.record(std::time::Instant::now()) {
            tracing::warn!(error = %e, suppressed, "accept failed; backing off");
        }
        tokio::time::sleep(self.delay).await;
    }

    /// Counts one failure at `now` and grows the pause; `Some(hidden)` when
    /// this one is logged (at most once a second), with how many were not.
    fn record(&mut self, now: std::time::Instant) -> Option<u64> {
        self.delay = (self.delay * 2).clamp(Duration::from_millis(10), Duration::from_millis(500));
        if self
            .last_log
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
        {
            self.last_log = Some(now);
            Some(std::mem::take(&mut self.hidden))
        } else {
            self.hidden += 1;
            None
        }
    }
}

/// Raises the soft open-files limit to the hard limit; returns the soft limit
/// now in force (`None`: unlimited or unknown).
pub(crate) fn raise_nofile_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let wanted = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, wanted) {
            Ok(()) => limit = getrlimit(Resource::Nofile),
            Err(e) => tracing::debug!(error = %e, "cannot raise the open-files limit"),
        }
    }
    limit.current
}

/// `max_connections` within the open-files limit: each proxied connection
/// may need two more descriptors upstream, and some stay free for the admin
/// listener, the store and logs.
pub(crate) fn connection_cap(max_connections: usize, nofile: Option<u64>) -> usize {
    const RESERVED: u64 = 64;
    match nofile {
        Some(n) => {
            // A served connection may hold three descriptors: its own, the
            // upstream connection it keeps, and one for a request beyond it
            // (another HTTP/2 stream, an upgrade) through the pool.
            let fit = (n.saturating_sub(RESERVED) / 3).max(1) as usize;
            max_connections.min(fit)
        }
        None => max_connections,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_are_logged_once_a_second_and_back_off() {
        let mut b = AcceptBackoff::default();
        let t0 = std::time::Instant::now();
        let logged: Vec<Option<u64>> = (0..1000)
            .map(|i| b.record(t0 + Duration::from_millis(i)))
            .collect();
        assert_eq!(logged.iter().filter(|l| l.is_some()).count(), 1);
        assert_eq!(b.delay, Duration::from_millis(500), "capped");
        assert_eq!(
            b.record(t0 + Duration::from_millis(1000)),
            Some(999),
            "the count of hidden ones"
        );
        b.reset();
        assert_eq!(b.delay, Duration::ZERO);
        assert_eq!(connection_cap(10_000, Some(256)), 64);
        assert_eq!(connection_cap(50, Some(256)), 50);
        assert_eq!(connection_cap(10_000, None), 10_000);
        assert_eq!(connection_cap(10_000, Some(10)), 1);
    }
}
