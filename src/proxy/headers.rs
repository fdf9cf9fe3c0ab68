//! Header rules: hop-by-hop fields stripped both ways (including every field
//! `Connection` names), forwarding headers appended (or replaced, for clients
//! outside `trusted_proxies`), client-sent `X-Rolegate-*` and their `_`
//! look-alikes removed at the edge, and `Upgrade` passed only for allowed
//! protocols.

use std::net::SocketAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

#[cfg(any(feature = "gateway", fuzzing))]
/// Set on requests run locally: the role held.
pub const ROLE: HeaderName = HeaderName::from_static("x-rolegate-role");
#[cfg(any(feature = "gateway", fuzzing))]
/// Set on requests run locally: the term's fencing token.
pub const TOKEN: HeaderName = HeaderName::from_static("x-rolegate-token");
/// The hop marker between gateways.
pub const HOP: HeaderName = HeaderName::from_static("x-rolegate-hop");
/// On a holder gateway's 503 to a forwarded hop it did not admit (it does
/// not hold the role, or is handing it over): signed like the hop marker,
/// it tells the forwarding gateway that none of the request was read, so
/// the request may be held and sent to the next holder.
pub const REFUSED: HeaderName = HeaderName::from_static("x-rolegate-refused");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const FORWARDED: HeaderName = HeaderName::from_static("forwarded");
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// How many rolegate gateways a request already passed (its `Via` entries).
pub fn rolegate_hops(headers: &HeaderMap) -> usize {
    headers
        .get_all(header::VIA)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .filter(|e| {
            let e = e.trim_ascii();
            e.len() >= 12
                && e[..12].eq_ignore_ascii_case(b"1.1 rolegate")
                && (e.len() == 12 || e[12] == b' ')
        })
        .count()
}

#[cfg(any(test, feature = "gateway", fuzzing))]
/// Whether a request carries any sign of a gateway hop: the hop marker (in
/// any spelling a CGI server would merge with it) or a `Via: 1.1 rolegate
/// (<id>)` entry, which only a gateway forwarding to a peer writes.
pub fn carries_hop_marker(headers: &HeaderMap) -> bool {
    let marker = headers
        .keys()
        .any(|k| same_when_folded(k.as_str(), HOP.as_str()));
    marker
        || headers
            .get_all(header::VIA)
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .any(|e| {
                let e = e.trim_ascii();
                e.len() > 12 && e[..12].eq_ignore_ascii_case(b"1.1 rolegate") && e.contains(&b'(')
            })
}

/// Whether this very instance already passed the request on to a peer (its
/// id is in a `Via: 1.1 rolegate (<id>)` comment): a forwarding loop.
pub fn passed_through(headers: &HeaderMap, instance_id: &str) -> bool {
    headers
        .get_all(header::VIA)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .filter_map(|e| {
            let e = e.trim_ascii();
            let open = e.iter().position(|b| *b == b'(')?;
            e[open + 1..].strip_suffix(b")")
        })
        .any(|id| id == instance_id.as_bytes())
}

/// A header name byte as a CGI server folds it into an environment
/// variable name: letters and digits kept (case ignored), every other byte
/// read as `_`. RFC 3875 maps `-` to `_`; PHP also maps `.` and space, and
/// Apache's `ap_create_environment` every byte that is not a letter or digit.
fn cgi_fold(b: u8) -> u8 {
    if b.is_ascii_alphanumeric() {
        b.to_ascii_uppercase()
    } else {
        b'_'
    }
}

/// Whether header names `a` and `b` are the same variable to a CGI, PHP,
/// Rack or WSGI app (`X.Rolegate-Role` and `x_rolegate_role` both become
/// `HTTP_X_ROLEGATE_ROLE`).
pub fn same_when_folded(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .all(|(x, y)| cgi_fold(x) == cgi_fold(y))
}

/// Whether a header name holds a byte other than a letter, a digit or `-`:
/// such a name is the same variable as a plain one to a CGI server, so the
/// gateway drops it (as nginx's `ignore_invalid_headers` does by default).
fn has_foldable_punctuation(name: &str) -> bool {
    name.bytes()
        .any(|b| !(b.is_ascii_alphanumeric() || b == b'-'))
}

/// URL-rewrite fields, removed from every request.
const REWRITE_FIELDS: &[&str] = &["x-original-url", "x-rewrite-url", "x-original-uri"];

/// Client-address and mount-point fields that apps and libraries read as if
/// a proxy had set them; replaced like the forwarding fields.
const CLIENT_VIEW_FIELDS: &[&str] = &[
    "forwarded",
    "x-forwarded",
    "x-real-ip",
    "x-client-ip",
    "client-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-cluster-client-ip",
    "x-script-name",
];

/// Whether a request field is removed at the edge: any name with a byte
/// other than a letter, a digit or `-` (CGI, PHP, Rack and WSGI servers fold
/// `_`, `.` and other punctuation into `_` as they do `-`, so `X.Rolegate.Role`
/// would reach a PHP app as `HTTP_X_ROLEGATE_ROLE`, and gunicorn takes
/// `SCRIPT_NAME` from a header; nginx drops such names by default too),
/// `X-Rolegate-*` (only gateways set them), URL-rewrite fields, and,
/// `with_forwarding`, the fields that describe the client and the proxy
/// chain. Names are lowercase.
fn is_gateway_field(name: &str, with_forwarding: bool) -> bool {
    if has_foldable_punctuation(name)
        || name.starts_with("x-rolegate-")
        || REWRITE_FIELDS.contains(&name)
    {
        return true;
    }
    with_forwarding && (name.starts_with("x-forwarded-") || CLIENT_VIEW_FIELDS.contains(&name))
}

/// Whether a header can carry a partition key: not one the gateway removes
/// or rewrites before the app sees it (lowercase name).
pub fn usable_key_header(name: &str) -> bool {
    const REWRITTEN: &[&str] = &[
        "host",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "proxy-authorization",
        "proxy-authenticate",
        "http2-settings",
        "via",
    ];
    !is_gateway_field(name, true) && !REWRITTEN.contains(&name)
}

/// Whether a request field reaches the app exactly as the client sent it:
/// one the gateway never removes, rewrites or reads as framing (lowercase
/// name). The HTTP/1.1 fast path takes only requests whose fields all pass.
#[cfg(feature = "gateway")]
pub(crate) fn passes_unchanged(name: &str) -> bool {
    usable_key_header(name) && name != "expect" && name != "forwarded"
}

/// Whether a request asks for a protocol upgrade (WebSocket and friends).
pub fn is_upgrade_request(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE) && connection_has(headers, "upgrade")
}

/// Whether the request's `Upgrade` names exactly one protocol and that
/// protocol is in `allowed`: compared whole, ignoring ASCII case, so a
/// version suffix passes only when the allowed entry has the same version
/// (`websocket/13` is not `websocket`). `h2c` is never allowed: a tunnel
/// would carry requests past the gate.
pub fn upgrade_allowed(headers: &HeaderMap, allowed: &[String]) -> bool {
    // One `Upgrade` field only: the hop-by-hop strip keeps a single field, so
    // a second (or a blank first) one would make the gate approve what it
    // does not forward.
    let mut fields = headers.get_all(header::UPGRADE).iter();
    let (Some(value), None) = (fields.next(), fields.next()) else {
        return false;
    };
    let proto = value.as_bytes().trim_ascii();
    if proto.is_empty() || proto.contains(&b',') {
        return false;
    }
    let name = proto.split(|b| *b == b'/').next().unwrap_or_default();
    !name.eq_ignore_ascii_case(b"h2c")
        && allowed
            .iter()
            .any(|a| a.as_bytes().eq_ignore_ascii_case(proto))
}

/// The GUID RFC 6455 appends to `Sec-WebSocket-Key`.
const WEBSOCKET_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// What an upgrade request asked for, to check the 101 against: a 101 is
/// bridged only when it completes this handshake, so an endpoint whose
/// status a client can pick (`/status/101`) cannot open a raw tunnel to the
/// app behind a non-holder.
#[derive(Debug, Clone)]
pub struct UpgradeAsk {
    protocol: HeaderValue,
    /// For WebSocket: the `Sec-WebSocket-Accept` the 101 must carry.
    accept: Option<String>,
}

/// Why a 101 is not bridged (answered 502 `upstream-bad-upgrade`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadUpgrade {
    /// The request asked for no upgrade.
    #[error("it answered 101 Switching Protocols to a request that asked for no upgrade")]
    Unasked,
    /// The 101's `Upgrade` is not the protocol asked for.
    #[error("its 101 Switching Protocols names another protocol than the request asked for")]
    OtherProtocol,
    /// The WebSocket handshake is incomplete or wrong.
    #[error("its 101 Switching Protocols has no Sec-WebSocket-Accept matching the request's key")]
    BadAccept,
}

impl UpgradeAsk {
    /// The upgrade `headers` ask for (after the gateway's strip, so one
    /// allowed protocol), or `None` when they ask for none.
    pub fn of(headers: &HeaderMap) -> Option<Self> {
        if !is_upgrade_request(headers) {
            return None;
        }
        let protocol = headers.get(header::UPGRADE)?.clone();
        let websocket = protocol
            .as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"websocket");
        let accept = websocket.then(|| {
            // Without a key no 101 can match: an empty expectation fails below.
            headers
                .get("sec-websocket-key")
                .map(|k| websocket_accept(k.as_bytes().trim_ascii()))
                .unwrap_or_default()
        });
        Some(Self { protocol, accept })
    }

    /// Whether the upgrade asked for is WebSocket.
    pub fn is_websocket(&self) -> bool {
        self.accept.is_some()
    }

    /// Checks a 101's headers against the request.
    pub fn check(ask: Option<&Self>, response: &HeaderMap) -> Result<(), BadUpgrade> {
        let ask = ask.ok_or(BadUpgrade::Unasked)?;
        let mut fields = response.get_all(header::UPGRADE).iter();
        let same = match (fields.next(), fields.next()) {
            (Some(v), None) => v
                .as_bytes()
                .trim_ascii()
                .eq_ignore_ascii_case(ask.protocol.as_bytes().trim_ascii()),
            _ => false,
        };
        if !same {
            return Err(BadUpgrade::OtherProtocol);
        }
        match &ask.accept {
            None => Ok(()),
            Some(want) => {
                let mut fields = response.get_all("sec-websocket-accept").iter();
                match (fields.next(), fields.next()) {
                    (Some(got), None)
                        if !want.is_empty() && got.as_bytes().trim_ascii() == want.as_bytes() =>
                    {
                        Ok(())
                    }
                    _ => Err(BadUpgrade::BadAccept),
                }
            }
        }
    }
}

/// `base64(SHA-1(key ++ GUID))` (RFC 6455 4.2.2).
fn websocket_accept(key: &[u8]) -> String {
    use base64::Engine as _;
    use sha1::Digest as _;
    let mut sha = sha1::Sha1::new();
    sha.update(key);
    sha.update(WEBSOCKET_GUID);
    base64::engine::general_purpose::STANDARD.encode(sha.finalize())
}

fn connection_has(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// The hop-by-hop fields (RFC 9110 7.6.1 and the legacy ones), removed
/// from every request and response that crosses the gateway. A `static`, not
/// a `const`: a `const` array is built and dropped at each use.
static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    HTTP2_SETTINGS,
];

/// Whether `name` is one of [`HOP_BY_HOP`], by its text: a match on the
/// lowercase name is a length switch and one comparison, where comparing
/// against each name in turn is nine.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "transfer-encoding"
            | "upgrade"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "http2-settings"
    )
}

/// Removes hop-by-hop fields. With `keep_upgrade`, `Upgrade` and
/// `Connection: upgrade` survive so the next hop can switch protocols.
/// `Trailer` is kept (unless `Connection` names it): it is end-to-end in
/// RFC 9110, and HTTP/1.1 senders only emit the trailer fields it declares,
/// so removing it would drop the trailers themselves.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // The usual request and response carry none of them: one pass over the
    // names instead of a hashed removal per name (this runs three times per
    // request).
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    // The values `Connection` names are removed by name, read from a copy
    // of its values (a reference count each, no parsing into owned names).
    let connection: Vec<HeaderValue> = headers
        .get_all(header::CONNECTION)
        .iter()
        .cloned()
        .collect();
    let upgrade = keep_upgrade
        .then(|| headers.get(header::UPGRADE).cloned())
        .flatten();
    let te_trailers = headers
        .get_all(header::TE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("trailers"));
    // Split on bytes: a value with obs-text must not hide the names before it.
    let named = (connection.iter())
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .filter_map(|t| std::str::from_utf8(t.trim_ascii()).ok());
    for name in named {
        if upgrade.is_none() || !name.eq_ignore_ascii_case(header::UPGRADE.as_str()) {
            // A token that is no field name matches no field.
            headers.remove(name);
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    if te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    if let Some(up) = upgrade {
        headers.insert(header::UPGRADE, up);
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

/// Removes every client-sent `X-Rolegate-*` field, every field whose name
/// holds punctuation other than `-` and the URL-rewrite fields.
pub fn strip_rolegate(headers: &mut HeaderMap) {
    strip_fields(headers, false);
}

/// Removes what `strip_rolegate` does plus the fields that describe the
/// client and the proxy chain (`X-Forwarded-*`, `Forwarded`, `X-Real-IP`,
/// `X-Client-IP`, `True-Client-IP`, …): for a client whose view of the chain
/// is not trusted.
pub fn strip_untrusted_forwarding(headers: &mut HeaderMap) {
    strip_fields(headers, true);
}

fn strip_fields(headers: &mut HeaderMap, with_forwarding: bool) {
    // One pass with no allocation for the usual request.
    if !headers
        .keys()
        .any(|k| is_gateway_field(k.as_str(), with_forwarding))
    {
        return;
    }
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|k| is_gateway_field(k.as_str(), with_forwarding))
        .cloned()
        .collect();
    for name in names {
        headers.remove(&name);
    }
}

/// Appends `Forwarded`, `X-Forwarded-For`, and sets `X-Forwarded-Proto/-Host`
/// when the client did not; adds `Via: 1.1 rolegate`, or on a hop to a peer
/// gateway `Via: 1.1 rolegate (<by>)` so a forwarding loop comes back
/// recognizable.
pub fn add_forwarding(
    headers: &mut HeaderMap,
    client: Option<SocketAddr>,
    by: &str,
    proto: &str,
    to_peer: bool,
) {
    // One buffer for the values this adds (this runs on every request).
    let mut value = Vec::with_capacity(96);
    let host = headers.get(header::HOST).cloned();
    let (ip, by_safe) = forwarded_value(
        &mut value,
        client,
        by,
        proto,
        host.as_ref().map(|h| h.as_bytes()),
    );
    append(headers, FORWARDED, &value);
    if client.is_some() {
        append(headers, X_FORWARDED_FOR, &value[ip]);
    }
    if !headers.contains_key(X_FORWARDED_PROTO) {
        headers.insert(
            X_FORWARDED_PROTO,
            HeaderValue::from_static(if proto == "https" { "https" } else { "http" }),
        );
    }
    if let Some(h) = host {
        if !headers.contains_key(X_FORWARDED_HOST) {
            headers.insert(X_FORWARDED_HOST, h);
        }
    }
    if to_peer && by_safe {
        value.clear();
        value.extend_from_slice(b"1.1 rolegate (");
        value.extend_from_slice(by.as_bytes());
        value.push(b')');
        append(headers, header::VIA, &value);
    } else if headers.contains_key(header::VIA) {
        append(headers, header::VIA, b"1.1 rolegate");
    } else {
        headers.insert(header::VIA, HeaderValue::from_static("1.1 rolegate"));
    }
}

/// What [`add_forwarding`] adds to a request that carries none of the
/// fields it adds to (no `Forwarded`, `X-Forwarded-*` or `Via`), with one
/// `host`, written as `name: value` lines in the order it adds them: the
/// HTTP/1.1 fast path writes a plain request's head this way.
#[cfg(feature = "gateway")]
pub(crate) fn write_forwarding(
    out: &mut Vec<u8>,
    client: SocketAddr,
    by: &str,
    host: &[u8],
    to_peer: bool,
) {
    out.extend_from_slice(b"forwarded: ");
    let start = out.len();
    let (ip, by_safe) = forwarded_value(out, Some(client), by, "http", Some(host));
    out.extend_from_slice(b"\r\nx-forwarded-for: ");
    out.extend_from_within(start + ip.start..start + ip.end);
    out.extend_from_slice(b"\r\nx-forwarded-proto: http\r\nx-forwarded-host: ");
    out.extend_from_slice(host);
    out.extend_from_slice(b"\r\nvia: 1.1 rolegate");
    if to_peer && by_safe {
        out.extend_from_slice(b" (");
        out.extend_from_slice(by.as_bytes());
        out.push(b')');
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes this hop's `Forwarded` element into `value`; returns where the
/// client's address sits in it (for `X-Forwarded-For`) and whether `by`
/// could be named in it.
fn forwarded_value(
    value: &mut Vec<u8>,
    client: Option<SocketAddr>,
    by: &str,
    proto: &str,
    host: Option<&[u8]>,
) -> (std::ops::Range<usize>, bool) {
    let start = value.len();
    let mut ip = 0..0;
    if let Some(c) = client {
        value.extend_from_slice(b"for=");
        let quoted = c.is_ipv6();
        if quoted {
            value.extend_from_slice(b"\"[");
        }
        ip.start = value.len() - start;
        push_ip(value, c.ip());
        ip.end = value.len() - start;
        value.extend_from_slice(if quoted { b"]\";" } else { b";" });
    }
    // RFC 7239 obfuscated node name: `_` then [A-Za-z0-9._-].
    let by_safe = token_safe(by);
    if by_safe {
        value.extend_from_slice(b"by=_");
        value.extend_from_slice(by.as_bytes());
    } else {
        value.extend_from_slice(b"by=unknown");
    }
    value.extend_from_slice(b";proto=");
    value.extend_from_slice(proto.as_bytes());
    if let Some(h) = host {
        if h.iter()
            .all(|b| b.is_ascii_graphic() && *b != b'"' && *b != b'\\')
        {
            value.extend_from_slice(b";host=\"");
            value.extend_from_slice(h);
            value.push(b'"');
        }
    }
    (ip, by_safe)
}

/// Writes `ip` as text: an IPv4 address digit by digit (the formatting
/// machinery costs more than the rest of the field), IPv6 as `Display` does.
fn push_ip(out: &mut Vec<u8>, ip: std::net::IpAddr) {
    match ip {
        std::net::IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                if octet >= 100 {
                    out.push(b'0' + octet / 100);
                }
                if octet >= 10 {
                    out.push(b'0' + octet / 10 % 10);
                }
                out.push(b'0' + octet % 10);
            }
        }
        std::net::IpAddr::V6(v6) => {
            use std::io::Write as _;
            let _ = write!(out, "{v6}");
        }
    }
}

fn token_safe(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Appends to a comma-separated list field, joining existing values.
fn append(headers: &mut HeaderMap, name: HeaderName, value: &[u8]) {
    let mut values = headers.get_all(&name).iter();
    let joined = match (values.next(), values.next()) {
        (None, _) => HeaderValue::from_bytes(value).ok(),
        (Some(one), None) => {
            let mut b = Vec::with_capacity(one.len() + 2 + value.len());
            b.extend_from_slice(one.as_bytes());
            b.extend_from_slice(b", ");
            b.extend_from_slice(value);
            HeaderValue::from_bytes(&b).ok()
        }
        (Some(_), Some(_)) => {
            let all: Vec<&[u8]> = headers
                .get_all(&name)
                .iter()
                .map(|v| v.as_bytes())
                .collect();
            let mut b = all.join(&b", "[..]);
            b.extend_from_slice(b", ");
            b.extend_from_slice(value);
            HeaderValue::from_bytes(&b).ok()
        }
    };
    if let Some(v) = joined {
        headers.insert(name, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn hop_markers_are_seen_in_every_spelling_and_in_a_peer_via() {
        assert!(carries_hop_marker(&map(&[("x-rolegate-hop", "gw")])));
        assert!(carries_hop_marker(&map(&[("x_rolegate_hop", "gw")])));
        assert!(carries_hop_marker(&map(&[(
            "via",
            "1.0 a, 1.1 rolegate (gw-1)"
        )])));
        assert!(!carries_hop_marker(&map(&[("via", "1.1 rolegate")])));
        assert!(!carries_hop_marker(&map(&[("via", "1.1 other (x)")])));
        assert!(!carries_hop_marker(&map(&[("x-rolegate-role", "r")])));
    }

    #[test]
    fn hop_by_hop_fields_and_connection_named_fields_are_removed() {
        let mut h = map(&[
            ("connection", "close, x-secret-hop"),
            ("x-secret-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("te", "gzip, trailers"),
            ("transfer-encoding", "chunked"),
            ("trailer", "x-checksum"),
            ("upgrade", "websocket"),
            ("content-type", "text/plain"),
        ]);
        strip_hop_by_hop(&mut h, false);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, vec!["content-type", "te", "trailer"]);
        assert_eq!(h["te"], "trailers");
    }

    #[test]
    fn upgrade_survives_when_kept() {
        let mut h = map(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "k"),
        ]);
        assert!(is_upgrade_request(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "upgrade");
        assert_eq!(h["sec-websocket-key"], "k");
    }

    #[test]
    fn rolegate_hops_are_counted_from_via() {
        let h = map(&[("via", "1.0 squid, 1.1 rolegate"), ("via", "1.1 rolegate")]);
        assert_eq!(rolegate_hops(&h), 2);
        assert_eq!(rolegate_hops(&HeaderMap::new()), 0);
    }

    #[test]
    fn connection_names_survive_obs_text_in_the_value() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_bytes(b"x-secret, \xff").unwrap(),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
    }

    #[test]
    fn rolegate_headers_from_clients_are_removed() {
        let mut h = map(&[
            ("x-rolegate-role", "admin"),
            ("X-Rolegate-Token", "99"),
            ("x-other", "1"),
            ("x_other_thing", "1"),
            ("x-original-url", "/maintenance/x"),
        ]);
        strip_rolegate(&mut h);
        assert_eq!(
            h.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
            vec!["x-other"]
        );
    }

    #[test]
    fn underscore_names_and_client_view_fields_are_removed() {
        let mut h = map(&[
            ("x_rolegate_role", "maintenance"),
            ("X_Rolegate_Token", "999"),
            ("x-rolegate_hop", "gw"),
            ("x_forwarded_for", "10.9.9.9"),
            ("script_name", "/x"),
            ("x_custom", "dropped too"),
            ("x-forwarded-for", "10.0.0.1"),
            ("true-client-ip", "6.6.6.6"),
            ("x-script-name", "/x"),
            ("x-original-url", "/maintenance/x"),
        ]);
        strip_rolegate(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(
            left,
            vec!["true-client-ip", "x-forwarded-for", "x-script-name"]
        );
        strip_untrusted_forwarding(&mut h);
        assert!(h.is_empty(), "{h:?}");
    }

    #[test]
    fn only_allowed_upgrades_pass_and_h2c_never() {
        let allowed = vec!["websocket".to_string()];
        assert!(upgrade_allowed(&map(&[("upgrade", "websocket")]), &allowed));
        assert!(upgrade_allowed(&map(&[("upgrade", "WebSocket")]), &allowed));
        assert!(!upgrade_allowed(&map(&[("upgrade", "h2c")]), &allowed));
        assert!(!upgrade_allowed(
            &map(&[("upgrade", "websocket, h2c")]),
            &allowed
        ));
        assert!(!upgrade_allowed(
            &map(&[("upgrade", "h2c")]),
            &["h2c".to_string()]
        ));
        assert!(!upgrade_allowed(&map(&[("upgrade", "TLS/1.2")]), &allowed));
        assert!(!upgrade_allowed(&HeaderMap::new(), &allowed));
        let blank_first = map(&[("upgrade", ""), ("upgrade", "websocket")]);
        assert!(
            !upgrade_allowed(&blank_first, &allowed),
            "two Upgrade fields"
        );
        assert!(!upgrade_allowed(&map(&[("upgrade", " ")]), &allowed));
        assert!(
            !upgrade_allowed(&map(&[("upgrade", "websocket/13")]), &allowed),
            "a version the allowed entry does not name"
        );
        assert!(upgrade_allowed(
            &map(&[("upgrade", "foo/2")]),
            &["foo/2".to_string()]
        ));
        assert!(!upgrade_allowed(
            &map(&[("upgrade", "websocket, websocket")]),
            &allowed
        ));
        let mut h = map(&[
            ("connection", "Upgrade, HTTP2-Settings"),
            ("upgrade", "h2c"),
            ("http2-settings", "AAMAAABkAARAAAAAAAIAAAAA"),
        ]);
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
        let mut h = map(&[("http2-settings", "AAMA")]);
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "HTTP2-Settings is always hop-by-hop");
    }

    #[test]
    fn the_hop_by_hop_test_names_the_hop_by_hop_fields() {
        for name in &HOP_BY_HOP {
            assert!(is_hop_by_hop(name), "{name}");
        }
        for name in [header::HOST, header::TRAILER, header::VIA, HOP] {
            assert!(!is_hop_by_hop(&name), "{name}");
        }
    }

    #[test]
    fn look_alike_names_compare_as_a_cgi_server_folds_them() {
        assert!(same_when_folded("x_device_id", "x-device-id"));
        assert!(same_when_folded("X_Device-Id", "x-device-id"));
        assert!(same_when_folded("x.device.id", "x-device-id"));
        assert!(!same_when_folded("x_device_ids", "x-device-id"));
        assert!(!same_when_folded("x-devicexid", "x-device-id"));
    }

    /// Every punctuation byte a field name may hold (RFC 9110 `tchar`) but
    /// `-` makes a name the gateway drops, in place of any `-` of a trusted
    /// or forwarding name; letters and digits do not.
    #[test]
    fn every_tchar_punctuation_spelling_of_a_trusted_name_is_removed() {
        const PUNCTUATION: &[u8] = b"!#$%&'*+.^_`|~";
        for name in [
            "x-rolegate-role",
            "x-rolegate-token",
            "x-rolegate-hop",
            "x-forwarded-for",
        ] {
            for &p in PUNCTUATION {
                let spelled: String = name
                    .bytes()
                    .map(|b| if b == b'-' { p as char } else { b as char })
                    .collect();
                let mut h = HeaderMap::new();
                h.insert(
                    HeaderName::from_bytes(spelled.as_bytes()).unwrap(),
                    HeaderValue::from_static("forged"),
                );
                h.insert("x-kept", HeaderValue::from_static("1"));
                strip_rolegate(&mut h);
                assert_eq!(h.len(), 1, "{spelled} survived: {h:?}");
                assert!(same_when_folded(&spelled, name), "{spelled}");
            }
        }
        let mut h = HeaderMap::new();
        h.insert("x-device-id2", HeaderValue::from_static("1"));
        strip_rolegate(&mut h);
        assert_eq!(h.len(), 1, "letters and digits are kept");
    }

    #[test]
    fn forwarding_headers_append() {
        let mut h = map(&[("host", "example.com"), ("x-forwarded-for", "10.0.0.1")]);
        add_forwarding(
            &mut h,
            Some("127.0.0.1:5000".parse().unwrap()),
            "gw-1",
            "http",
            false,
        );
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.1");
        assert_eq!(
            h["forwarded"],
            "for=127.0.0.1;by=_gw-1;proto=http;host=\"example.com\""
        );
        assert_eq!(h["x-forwarded-host"], "example.com");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["via"], "1.1 rolegate");
        add_forwarding(
            &mut h,
            Some("[::1]:1".parse().unwrap()),
            "gw-2",
            "http",
            true,
        );
        assert_eq!(h["via"], "1.1 rolegate, 1.1 rolegate (gw-2)");
        assert_eq!(rolegate_hops(&h), 2);
        assert!(passed_through(&h, "gw-2"));
        assert!(!passed_through(&h, "gw-1"));
        assert!(h["forwarded"]
            .to_str()
            .unwrap()
            .ends_with("for=\"[::1]\";by=_gw-2;proto=http;host=\"example.com\""));
    }

    #[test]
    fn a_101_is_bridged_only_when_it_completes_the_handshake_asked_for() {
        // The example handshake of RFC 6455 1.3.
        let req = map(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ]);
        let ask = UpgradeAsk::of(&req).unwrap();
        let good = map(&[
            ("upgrade", "WebSocket"),
            ("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        ]);
        assert_eq!(UpgradeAsk::check(Some(&ask), &good), Ok(()));
        let no_accept = map(&[("upgrade", "websocket")]);
        assert_eq!(
            UpgradeAsk::check(Some(&ask), &no_accept),
            Err(BadUpgrade::BadAccept)
        );
        let wrong = map(&[
            ("upgrade", "websocket"),
            ("sec-websocket-accept", "AAAAAAAAAAAAAAAAAAAAAAAAAAA="),
        ]);
        assert_eq!(
            UpgradeAsk::check(Some(&ask), &wrong),
            Err(BadUpgrade::BadAccept)
        );
        let other = map(&[
            ("upgrade", "foo"),
            ("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        ]);
        assert_eq!(
            UpgradeAsk::check(Some(&ask), &other),
            Err(BadUpgrade::OtherProtocol)
        );
        assert_eq!(UpgradeAsk::check(None, &good), Err(BadUpgrade::Unasked));
        let keyless =
            UpgradeAsk::of(&map(&[("connection", "upgrade"), ("upgrade", "websocket")])).unwrap();
        assert_eq!(
            UpgradeAsk::check(Some(&keyless), &no_accept),
            Err(BadUpgrade::BadAccept)
        );
        let foo = UpgradeAsk::of(&map(&[("connection", "upgrade"), ("upgrade", "foo/2")])).unwrap();
        assert_eq!(
            UpgradeAsk::check(Some(&foo), &map(&[("upgrade", "foo/2")])),
            Ok(())
        );
        assert_eq!(
            UpgradeAsk::check(Some(&foo), &map(&[("upgrade", "foo/3")])),
            Err(BadUpgrade::OtherProtocol)
        );
        assert!(
            UpgradeAsk::of(&map(&[("upgrade", "websocket")])).is_none(),
            "no Connection: upgrade"
        );
    }
}
