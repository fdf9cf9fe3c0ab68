//! Defaults of the proxy settings, shared by the config loader (the `proxy`
//! section) and the library layers, so both behave alike when unset.

use std::time::Duration;

/// `proxy.connect_timeout`: time to open a connection to the app or a peer.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// `proxy.response_header_timeout`: time for the response head after the request body.
pub(crate) const RESPONSE_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// `proxy.idle_timeout`: no byte either way for this long closes a connection or tunnel.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// `proxy.case_insensitive_paths`: prefixes match ignoring ASCII case.
pub(crate) const CASE_INSENSITIVE_PATHS: bool = true;
/// `proxy.upgrades`: protocols passed through an `Upgrade`.
pub(crate) const UPGRADES: &[&str] = &["websocket"];
/// `proxy.max_connections`: public-listener connections served at once.
pub(crate) const MAX_CONNECTIONS: usize = 10_000;
/// `proxy.max_unread_mib`: response MiB handed to clients that have not
/// asked for more, process-wide, before the slowest reader is closed.
pub(crate) const MAX_UNREAD_MIB: usize = 64;
/// `proxy.http2.max_concurrent_streams`: streams one HTTP/2 client may have open at once.
pub(crate) const HTTP2_MAX_CONCURRENT_STREAMS: u32 = 100;
/// `proxy.hold_timeout`: how long a role request with no servable holder waits for one.
pub(crate) const HOLD_TIMEOUT: Duration = Duration::from_secs(1);

#[cfg(feature = "gateway")]
/// Bytes of a response the HTTP/2 server buffers per stream before it stops
/// reading the response from upstream, whatever window the client grants:
/// a client that never reads holds at most this per stream (hyper's default,
/// 400 KiB, let 800 unread streams hold a gigabyte).
pub(crate) const H2_STREAM_SEND_BUFFER: usize = 16 * 1024;

/// The most an upstream HTTP/1 connection buffers of a response the client
/// has not taken yet (hyper's default grows to about 400 KiB): with the
/// server side's own 64 KiB, what a client that never reads can hold per
/// connection.
pub(crate) const UPSTREAM_READ_BUFFER: usize = 16 * 1024;
