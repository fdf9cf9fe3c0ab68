//! An upgraded tunnel run as local work: bytes copied both ways until either
//! side closes, nothing moves for the idle timeout, or the term the tunnel
//! was admitted under is over. Then nothing more goes to the app, the app's
//! frame in flight is finished (briefly), a WebSocket client gets a close
//! frame with code 1012 ("service restart"), and both connections close.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::idle::Progress;
use crate::lease::LocalWork;

/// A server's WebSocket close frame: code 1012, reason "service restart".
const CLOSE_1012: &[u8] = b"\x88\x11\x03\xf4service restart";

/// How long the app's frame in flight, the close frame and the shutdown may
/// take once the term is over.
const FINISH_FRAME: Duration = Duration::from_millis(200);

/// Where the server-to-client byte stream stands in WebSocket framing
/// (RFC 6455 5.2), so a close frame is only ever written between frames.
#[derive(Debug, Default)]
pub(crate) struct FrameCursor {
    head: [u8; 14],
    have: usize,
    payload_left: u64,
}

impl FrameCursor {
    /// Between two frames.
    pub(crate) fn at_boundary(&self) -> bool {
        self.have == 0 && self.payload_left == 0
    }

    fn header_len(&self) -> Option<usize> {
        if self.have < 2 {
            return None;
        }
        let ext = match self.head[1] & 0x7f {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let mask = if self.head[1] & 0x80 != 0 { 4 } else { 0 };
        Some(2 + ext + mask)
    }

    fn payload_len(&self) -> u64 {
        match self.head[1] & 0x7f {
            126 => u64::from(u16::from_be_bytes([self.head[2], self.head[3]])),
            127 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&self.head[2..10]);
                u64::from_be_bytes(b)
            }
            n => u64::from(n),
        }
    }

    /// Takes `buf` as the next bytes of the stream. With `stop_at_boundary`,
    /// stops at the end of the current frame; returns the bytes consumed.
    pub(crate) fn advance(&mut self, buf: &[u8], stop_at_boundary: bool) -> usize {
        let mut i = 0;
        while i < buf.len() {
            if stop_at_boundary && self.at_boundary() && i > 0 {
                return i;
            }
            if self.payload_left > 0 {
                let k =
                    (buf.len() - i).min(usize::try_from(self.payload_left).unwrap_or(usize::MAX));
                self.payload_left -= k as u64;
                i += k;
                continue;
            }
            self.head[self.have] = buf[i];
            self.have += 1;
            i += 1;
            if self.header_len() == Some(self.have) {
                self.payload_left = self.payload_len();
                self.have = 0;
            }
        }
        i
    }
}

/// Runs the tunnel as `work`: see the module doc.
pub(crate) async fn bridge_until_over<C, P>(
    client: C,
    peer: P,
    progress: &Arc<Progress>,
    idle: Duration,
    work: LocalWork,
    websocket: bool,
) where
    C: AsyncRead + AsyncWrite + Unpin,
    P: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_rd, mut client_wr) = tokio::io::split(client);
    let (mut peer_rd, mut peer_wr) = tokio::io::split(peer);
    let over = work.over();
    tokio::pin!(over);
    let mut frames = FrameCursor::default();
    let mut buf = vec![0u8; 16 * 1024];
    // False once a write to the client was cut mid-way: the client's stream
    // then ends inside a frame, and no close frame can follow it.
    let mut clean = true;
    {
        let up = async {
            let _ = tokio::io::copy(&mut client_rd, &mut peer_wr).await;
            let _ = peer_wr.shutdown().await;
        };
        tokio::pin!(up);
        // The client half-closed: what the app still sends goes on to it.
        let mut up_done = false;
        loop {
            tokio::select! {
                _ = &mut over => break,
                _ = &mut up, if !up_done => up_done = true,
                _ = progress.idle_for(idle) => {
                    tracing::debug!(?idle, "upgraded tunnel idle; closing");
                    return;
                }
                read = peer_rd.read(&mut buf) => {
                    let n = match read {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    // A client that stops reading must not hold the
                    // tunnel past its term: the write races the end too.
                    tokio::select! {
                        written = client_wr.write_all(&buf[..n]) => {
                            if written.is_err() {
                                return;
                            }
                            frames.advance(&buf[..n], false);
                        }
                        _ = &mut over => {
                            clean = false;
                            break;
                        }
                        _ = progress.idle_for(idle) => return,
                    }
                }
            }
        }
    }
    // The term is over: nothing more reaches the app.
    let _ = peer_wr.shutdown().await;
    let role = work.watch().metric_label();
    let reason = work.watch().reason().map_or("lost", |r| r.as_str());
    metrics::counter!(crate::telemetry::STREAMS_ENDED, "role" => role, "reason" => reason)
        .increment(1);
    // Finishing the app's frame in flight, the close frame and the shutdown
    // are bounded together: a client that does not read gets its connection
    // dropped instead.
    let close = async {
        if websocket && clean {
            while !frames.at_boundary() {
                let n = match peer_rd.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let k = frames.advance(&buf[..n], true);
                if client_wr.write_all(&buf[..k]).await.is_err() {
                    return;
                }
            }
            if client_wr.write_all(CLOSE_1012).await.is_err() {
                return;
            }
        }
        let _ = client_wr.shutdown().await;
    };
    let _ = tokio::time::timeout(FINISH_FRAME, close).await;
    drop(work);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_boundaries_are_found_in_any_split() {
        // A 5-byte text frame, a 300-byte binary frame (16-bit length), an
        // empty ping, a masked 2-byte frame.
        let mut stream = vec![0x81, 5];
        stream.extend_from_slice(b"hello");
        stream.extend_from_slice(&[0x82, 126, 0x01, 0x2c]);
        stream.extend(std::iter::repeat_n(7u8, 300));
        stream.extend_from_slice(&[0x89, 0]);
        stream.extend_from_slice(&[0x81, 0x82, 1, 2, 3, 4, b'a', b'b']);
        let ends = [7, 7 + 304, 7 + 304 + 2, stream.len()];
        for chunk in [1, 2, 3, 5, 64, 1000] {
            let mut c = FrameCursor::default();
            let mut at = Vec::new();
            for (i, piece) in stream.chunks(chunk).enumerate() {
                let mut off = 0;
                while off < piece.len() {
                    off += c.advance(&piece[off..], true);
                    if c.at_boundary() {
                        at.push(i * chunk + off);
                    }
                }
            }
            at.dedup();
            assert_eq!(at, ends, "chunks of {chunk}");
        }
    }

    #[test]
    fn the_close_frame_says_1012() {
        assert_eq!(CLOSE_1012[0], 0x88);
        assert_eq!(usize::from(CLOSE_1012[1]), CLOSE_1012.len() - 2);
        assert_eq!(u16::from_be_bytes([CLOSE_1012[2], CLOSE_1012[3]]), 1012);
    }
}
