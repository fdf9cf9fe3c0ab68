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
/// `proxy.http2.max_concurrent_streams`: streams one HTTP/2 client may have open at once.
pub(crate) const HTTP2_MAX_CONCURRENT_STREAMS: u32 = 100;
/// `proxy.hold_timeout`: how long a role request with no servable holder waits for one.
pub(crate) const HOLD_TIMEOUT: Duration = Duration::from_secs(1);
