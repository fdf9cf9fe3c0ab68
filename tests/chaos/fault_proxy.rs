//! TCP fault proxy between one gateway and PostgreSQL: passes bytes through,
//! delays every chunk, or holds them (a blackhole).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bytes pass unchanged.
pub const PASS: u8 = 0;
/// Every chunk waits the configured delay.
pub const DELAY: u8 = 1;
/// Bytes are held until the mode changes.
pub const BLACKHOLE: u8 = 2;

#[derive(Clone, Default)]
pub struct FaultProxy {
    mode: Arc<AtomicU8>,
    delay_ms: Arc<AtomicU64>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards every connection to
    /// `target`; returns the proxy and its port.
    pub async fn start(target: u16) -> (FaultProxy, u16) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let proxy = FaultProxy::default();
        let p = proxy.clone();
        tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                let p = p.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    tokio::spawn(pump(ri, wo, p.clone()));
                    tokio::spawn(pump(ro, wi, p));
                });
            }
        });
        (proxy, port)
    }

    /// Switches every connection to `mode` (`PASS`, `DELAY`, `BLACKHOLE`).
    pub fn set(&self, mode: u8, delay_ms: u64) {
        self.delay_ms.store(delay_ms, Ordering::SeqCst);
        self.mode.store(mode, Ordering::SeqCst);
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    p: FaultProxy,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // A blackhole holds the bytes (as a network that drops packets would,
        // until retransmission succeeds); latency delays every chunk.
        while p.mode.load(Ordering::SeqCst) == BLACKHOLE {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if p.mode.load(Ordering::SeqCst) == DELAY {
            tokio::time::sleep(Duration::from_millis(p.delay_ms.load(Ordering::SeqCst))).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
