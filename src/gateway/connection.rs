//! What the gateway knows of a client connection.

use std::net::SocketAddr;

/// What the gateway knows of a connection, from the socket and the TLS
/// session only (never from a header).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionFacts {
    /// The peer's address.
    pub(crate) client: SocketAddr,
    /// The connection is TLS (the forwarding fields say `https`).
    pub(crate) tls: bool,
    /// The client presented a certificate that chains to `peers.ca_file`.
    pub(crate) verified_peer: bool,
}

impl ConnectionFacts {
    /// A connection without TLS: no certificate, so never a verified peer.
    pub(crate) fn plain(client: SocketAddr) -> Self {
        Self {
            client,
            tls: false,
            verified_peer: false,
        }
    }
}
