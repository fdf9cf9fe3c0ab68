//! How a hop to the app or to a peer gateway is spoken.

/// How a hop is spoken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HopProtocol {
    /// HTTP/1.1 over pooled connections (the default).
    #[default]
    Http1,
    /// HTTP/2: h2c with prior knowledge to an `http://` address, h2 by ALPN
    /// to an `https://` one; one multiplexed connection per address carries
    /// every request. Upgrade requests (WebSocket) still go over HTTP/1.1.
    Http2,
}
