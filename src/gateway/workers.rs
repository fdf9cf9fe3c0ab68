//! Thread-per-core: `--workers N` threads, each with a single-threaded
//! runtime, its own `SO_REUSEPORT` listener on the public address (the
//! kernel spreads new connections over them) and its own forwarder, so its
//! upstream and peer connections and their pools are its own. A request is
//! accepted, gated, forwarded and answered on one thread, with no hand-off
//! to another. The coordinator, the admin listener and the health probe run
//! on the process's small main runtime; the hot path only reads their state
//! (lock-free loads).

use std::net::SocketAddr;
use std::sync::Arc;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::oneshot;

use super::handler::GatewayState;
use super::server::{serve, ConnectionTracker, ServeLimits};
use super::tls::ListenerTls;

/// Listen backlog of each worker's socket: a burst of new connections is
/// queued rather than dropped (a dropped SYN costs the client a 1 s
/// retransmit, as long as a default connect timeout).
const BACKLOG: i32 = 4096;

/// The running workers.
pub(crate) struct Workers {
    /// Each resolves once its worker has stopped accepting.
    accepting: Vec<oneshot::Receiver<()>>,
    /// Dropping these lets each worker's runtime end (and with it any
    /// connection still open).
    exit: Vec<oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Binds `n` listening sockets to `addr`, all in one `SO_REUSEPORT` group
/// when `n > 1`. An address another process already listens on is refused,
/// with or without `SO_REUSEPORT` on its side: a probe bind without it runs
/// first, so two gateways configured on one port fail loudly instead of
/// silently sharing it.
pub(crate) fn bind(
    addr: SocketAddr,
    n: usize,
) -> std::io::Result<(Vec<std::net::TcpListener>, SocketAddr)> {
    let probe = socket(addr)?;
    probe.bind(&addr.into())?;
    probe.listen(1)?;
    let bound = probe
        .local_addr()?
        .as_socket()
        .ok_or_else(|| std::io::Error::other("the bound address is not an IP address"))?;
    drop(probe);
    let mut listeners = Vec::with_capacity(n);
    for _ in 0..n {
        let s = socket(bound)?;
        if n > 1 {
            s.set_reuse_port(true)?;
        }
        s.bind(&bound.into())?;
        s.listen(BACKLOG)?;
        s.set_nonblocking(true)?;
        listeners.push(s.into());
    }
    Ok((listeners, bound))
}

fn socket(addr: SocketAddr) -> std::io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    Ok(s)
}

impl Workers {
    /// Starts one worker per listener, each serving with its own state.
    pub(crate) fn start(
        listeners: Vec<std::net::TcpListener>,
        states: Vec<Arc<GatewayState>>,
        tracker: &ConnectionTracker,
        limits: ServeLimits,
        tls: Option<Arc<ListenerTls>>,
    ) -> std::io::Result<Workers> {
        let mut workers = Workers {
            accepting: Vec::new(),
            exit: Vec::new(),
            threads: Vec::new(),
        };
        for (i, (listener, state)) in listeners.into_iter().zip(states).enumerate() {
            let (accepting_tx, accepting_rx) = oneshot::channel();
            let (exit_tx, exit_rx) = oneshot::channel::<()>();
            let (tracker, tls, limits) = (tracker.clone(), tls.clone(), limits.clone());
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let thread = std::thread::Builder::new()
                .name(format!("rolegate-worker-{i}"))
                .spawn(move || {
                    runtime.block_on(async move {
                        match tokio::net::TcpListener::from_std(listener) {
                            Ok(listener) => serve(listener, state, tracker, limits, tls).await,
                            Err(e) => {
                                tracing::error!(worker = i, error = %e, "worker cannot listen")
                            }
                        }
                        let _ = accepting_tx.send(());
                        // Open connections keep being served until the drain ends.
                        let _ = exit_rx.await;
                    });
                })?;
            workers.accepting.push(accepting_rx);
            workers.exit.push(exit_tx);
            workers.threads.push(thread);
        }
        Ok(workers)
    }

    /// Waits until every worker has stopped accepting.
    pub(crate) async fn stopped_accepting(&mut self) {
        for rx in self.accepting.drain(..) {
            let _ = rx.await;
        }
    }

    /// Ends every worker (connections still open are closed) and joins them.
    pub(crate) async fn end(mut self) {
        self.exit.clear();
        let threads = std::mem::take(&mut self.threads);
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }
}
