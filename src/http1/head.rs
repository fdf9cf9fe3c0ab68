//! Request and response heads, parsed in place with `httparse` and judged
//! by the rules of hyper's HTTP/1 server (requests) and client (responses):
//! what hyper accepts, this accepts, with the same fields and the same body
//! framing. `oracle` holds the two to each other.

use std::mem::MaybeUninit;

use httparse::Header;

/// The most header fields a head may carry (hyper refuses the 101st: 431).
pub(crate) const MAX_HEADERS: usize = 100;

/// Chunk extension bytes a chunked body may carry in all (hyper's limit).
pub(crate) const MAX_CHUNK_EXTENSION_BYTES: u64 = 16 * 1024;

/// The longest Content-Length a body may declare (hyper's: two values of a
/// u64 are kept as markers).
const MAX_CONTENT_LENGTH: u64 = u64::MAX - 2;

/// Empty header slots for a parse; fill them with [`parse_request`] or
/// [`parse_response`].
pub(crate) fn header_slots<'b>() -> [MaybeUninit<Header<'b>>; MAX_HEADERS] {
    [MaybeUninit::uninit(); MAX_HEADERS]
}

/// HTTP/1.0 or HTTP/1.1 (httparse knows no other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    Http10,
    Http11,
}

impl Version {
    fn from_minor(minor: u8) -> Self {
        if minor == 1 {
            Version::Http11
        } else {
            Version::Http10
        }
    }

    #[cfg(any(test, fuzzing))] // the oracle's
    /// `HTTP/1.0` or `HTTP/1.1`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }
}

/// Where a message's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding, to its last chunk and trailers.
    Chunked,
    /// Until the sender closes the connection (responses only).
    UntilClose,
}

/// Why a head was refused, and the status hyper answers it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeadError {
    /// 400: a malformed line, token, version or framing field.
    Malformed(&'static str),
    /// 431: too many fields, a field name of 64 KiB or more, or a
    /// Content-Length past what a body may declare.
    TooLarge,
    /// A response status outside 100..=999 (no status answers it: the
    /// upstream answer is unusable).
    Status,
    /// The HTTP/2 connection preface where an HTTP/1 head should be: the
    /// connection is closed without an answer, as hyper closes it.
    Http2Preface,
}

/// What an HTTP/2 client sends first.
pub(crate) const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

impl HeadError {
    #[cfg(any(test, fuzzing))] // the oracle's
    /// The status a client is answered with (hyper's automatic answer), or
    /// None when the connection is closed without one.
    pub(crate) fn status(self) -> Option<u16> {
        match self {
            HeadError::Malformed(_) | HeadError::Status => Some(400),
            HeadError::TooLarge => Some(431),
            HeadError::Http2Preface => None,
        }
    }
}

impl From<httparse::Error> for HeadError {
    fn from(e: httparse::Error) -> Self {
        match e {
            httparse::Error::TooManyHeaders => HeadError::TooLarge,
            httparse::Error::Status => HeadError::Status,
            other => HeadError::Malformed(other.description_str()),
        }
    }
}

trait Describe {
    fn description_str(&self) -> &'static str;
}

impl Describe for httparse::Error {
    fn description_str(&self) -> &'static str {
        match self {
            httparse::Error::HeaderName => "invalid header name",
            httparse::Error::HeaderValue => "invalid header value",
            httparse::Error::NewLine => "invalid new line",
            httparse::Error::Status => "invalid status",
            httparse::Error::Token => "invalid token",
            httparse::Error::TooManyHeaders => "too many headers",
            httparse::Error::Version => "invalid HTTP version",
        }
    }
}

/// What a parse of a head found.
#[derive(Debug)]
pub(crate) enum Parsed<T> {
    /// The whole head, and what follows it is the body.
    Complete(T),
    /// More bytes are needed.
    Partial,
}

/// A request head, borrowed from the buffer it was read into.
#[derive(Debug)]
pub(crate) struct RequestHead<'h, 'b> {
    /// Bytes the head takes, its blank line included.
    pub(crate) len: usize,
    pub(crate) method: &'b str,
    /// The target as the app is told it: a fragment (`#…`) is dropped.
    pub(crate) path_and_query: &'b str,
    pub(crate) version: Version,
    /// Every field as sent, in order.
    pub(crate) headers: &'h [Header<'b>],
    pub(crate) framing: Framing,
    /// False when the client asked to close after this exchange (or sent
    /// both `Transfer-Encoding` and `Content-Length`).
    pub(crate) keep_alive: bool,
    /// Both `Transfer-Encoding` and `Content-Length` were sent: the length
    /// is ignored (the body is chunked) and the connection closes after.
    pub(crate) length_ignored: bool,
}

impl<'h, 'b> RequestHead<'h, 'b> {
    #[cfg(any(test, fuzzing))] // the oracle's
    /// The fields as the app is to be handed them: a `Content-Length`
    /// beside `Transfer-Encoding` is dropped, and so is a repeat of the
    /// first `Content-Length` (hyper's reading).
    pub(crate) fn fields(&self) -> impl Iterator<Item = &'h Header<'b>> + '_ {
        let mut seen_length = false;
        self.headers.iter().filter(move |h| {
            if !h.name.eq_ignore_ascii_case("content-length") {
                return true;
            }
            let first = !seen_length;
            seen_length = true;
            first && !self.length_ignored
        })
    }
}

/// A request head, or a decline to hyper.
#[derive(Debug)]
pub(crate) enum Request<'h, 'b> {
    Head(RequestHead<'h, 'b>),
    /// A request left to hyper, decided on the head alone, before a byte
    /// past it is read: CONNECT (hyper treats it as an upgrade), or a target
    /// that is not origin-form (`/…`: absolute-form, authority-form, `*`).
    Decline,
}

/// Parses a request head from the start of `buf` into `slots`.
///
/// Partial means more bytes are needed: a caller whose buffer already holds
/// its head limit answers 431, as hyper does once its buffer is full.
pub(crate) fn parse_request<'h, 'b>(
    buf: &'b [u8],
    slots: &'h mut [MaybeUninit<Header<'b>>],
) -> Result<Parsed<Request<'h, 'b>>, HeadError> {
    let mut req = httparse::Request::new(&mut []);
    let parsed =
        httparse::ParserConfig::default().parse_request_with_uninit_headers(&mut req, buf, slots);
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(e) => return Err(refused(buf, e.into())),
    };
    let (Some(method), Some(target), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(HeadError::Malformed("incomplete request line"));
    };
    let headers: &'h [Header<'b>] = req.headers;
    check_names(headers).map_err(|e| refused(buf, e))?;
    if !is_method(method) {
        return Err(refused(buf, HeadError::Malformed("invalid method")));
    }
    if method == "CONNECT" {
        return Ok(Parsed::Complete(Request::Decline));
    }
    if !target.starts_with('/') {
        return Ok(Parsed::Complete(Request::Decline));
    }
    // hyper has taken the head off its buffer by the time it settles it.
    settle(len, method, target, minor, headers)
        .map(|head| Parsed::Complete(Request::Head(head)))
        .map_err(|e| refused(&buf[len..], e))
}

/// A refused request head as hyper answers it: it drops the CR and LF
/// bytes at the front of what it has not taken off its buffer (`rest`), and
/// closes the connection unanswered when the HTTP/2 preface follows.
fn refused(rest: &[u8], e: HeadError) -> HeadError {
    let lines = rest
        .iter()
        .take_while(|&&b| b == b'\r' || b == b'\n')
        .count();
    if rest[lines..].starts_with(H2_PREFACE) {
        HeadError::Http2Preface
    } else {
        e
    }
}

/// The checks hyper makes once it has taken a request head off its buffer:
/// the target, and the framing fields.
fn settle<'h, 'b>(
    len: usize,
    method: &'b str,
    target: &'b str,
    minor: u8,
    headers: &'h [Header<'b>],
) -> Result<RequestHead<'h, 'b>, HeadError> {
    let path_and_query = origin_form(target)?;
    let version = Version::from_minor(minor);
    let http11 = version == Version::Http11;

    let mut framing = Framing::Empty;
    let mut keep_alive = http11;
    let mut saw_close = false;
    let mut length: Option<u64> = None;
    let mut saw_length = false;
    let mut saw_te = false;
    let mut te_chunked = false;
    for h in headers {
        let name = h.name;
        if name.eq_ignore_ascii_case("transfer-encoding") {
            if !http11 {
                return Err(HeadError::Malformed("Transfer-Encoding on HTTP/1.0"));
            }
            saw_te = true;
            length = None;
            te_chunked = last_coding_is_chunked(h.value);
            framing = if te_chunked {
                Framing::Chunked
            } else {
                Framing::Empty
            };
        } else if name.eq_ignore_ascii_case("content-length") {
            saw_length = true;
            if saw_te {
                continue;
            }
            let n = digits(h.value).ok_or(HeadError::Malformed("invalid Content-Length"))?;
            match length {
                Some(prev) if prev != n => {
                    return Err(HeadError::Malformed("differing Content-Length values"))
                }
                Some(_) => {}
                None => {
                    if n > MAX_CONTENT_LENGTH {
                        return Err(HeadError::TooLarge);
                    }
                    length = Some(n);
                    framing = Framing::Length(n);
                }
            }
        } else if name.eq_ignore_ascii_case("connection") {
            if saw_close || has_token(h.value, "close") {
                saw_close = true;
                keep_alive = false;
            } else if !keep_alive {
                keep_alive = has_token(h.value, "keep-alive");
            }
        }
    }
    if saw_te && !te_chunked {
        return Err(HeadError::Malformed("Transfer-Encoding is not chunked"));
    }
    let length_ignored = saw_te && saw_length;
    if length_ignored {
        keep_alive = false;
    }
    if framing == Framing::Length(0) {
        framing = Framing::Empty;
    }
    Ok(RequestHead {
        len,
        method,

        path_and_query,
        version,
        headers,
        framing,
        keep_alive,
        length_ignored,
    })
}

/// A response head, borrowed from the buffer it was read into.
#[derive(Debug)]
pub(crate) struct ResponseHead<'h, 'b> {
    /// Bytes the head takes, its blank line included.
    pub(crate) len: usize,
    pub(crate) status: u16,
    pub(crate) version: Version,
    pub(crate) headers: &'h [Header<'b>],
    pub(crate) framing: Framing,
}

/// A response head, or an interim (1xx but 101) answer to skip.
#[derive(Debug)]
pub(crate) enum Response<'h, 'b> {
    Head(ResponseHead<'h, 'b>),
    /// A 100 or 102..=199 head of this many bytes: hyper's client drops it
    /// and reads the next head.
    Interim(usize),
}

/// What the request was, as far as its response's framing cares (CONNECT
/// is declined to hyper, so its answers are never read here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asked {
    Head,
    Other,
}

/// Parses a response head from the start of `buf` into `slots`.
pub(crate) fn parse_response<'h, 'b>(
    buf: &'b [u8],
    slots: &'h mut [MaybeUninit<Header<'b>>],
    asked: Asked,
) -> Result<Parsed<Response<'h, 'b>>, HeadError> {
    let mut res = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut res, buf, slots)?
    {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => return Ok(Parsed::Partial),
    };
    let (Some(status), Some(minor)) = (res.code, res.version) else {
        return Err(HeadError::Malformed("incomplete status line"));
    };
    if !(100..=999).contains(&status) {
        return Err(HeadError::Status);
    }
    let headers: &'h [Header<'b>] = res.headers;
    check_names(headers)?;
    let version = Version::from_minor(minor);
    let framing = match (status, asked) {
        // A 101 ends HTTP on the connection: no body.
        (101, _) => Framing::Empty,
        (100 | 102..=199, _) => return Ok(Parsed::Complete(Response::Interim(len))),
        (204 | 304, _) | (_, Asked::Head) => Framing::Empty,
        _ => response_framing(headers, version)?,
    };
    Ok(Parsed::Complete(Response::Head(ResponseHead {
        len,
        status,
        version,
        headers,
        framing,
    })))
}

/// A response body's framing: the last `Transfer-Encoding` line decides
/// chunked or until close; otherwise every `Content-Length` value must
/// agree.
fn response_framing(headers: &[Header<'_>], version: Version) -> Result<Framing, HeadError> {
    let mut last_te = None;
    let mut length: Option<u64> = None;
    let mut saw_length = false;
    let mut bad_length = false;
    for h in headers {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            last_te = Some(h.value);
        } else if h.name.eq_ignore_ascii_case("content-length") {
            saw_length = true;
            if bad_length {
                continue;
            }
            match visible(h.value) {
                None => bad_length = true,
                Some(line) => {
                    for v in line.split(',') {
                        match (digits(trim(v.as_bytes())), length) {
                            (None, _) => bad_length = true,
                            (Some(n), Some(prev)) if n != prev => bad_length = true,
                            (Some(n), _) => length = Some(n),
                        }
                    }
                }
            }
        }
    }
    if let Some(te) = last_te {
        if version == Version::Http10 {
            return Err(HeadError::Malformed("Transfer-Encoding on HTTP/1.0"));
        }
        return Ok(if last_coding_is_chunked(te) {
            Framing::Chunked
        } else {
            Framing::UntilClose
        });
    }
    match length {
        _ if bad_length => Err(HeadError::Malformed("invalid Content-Length")),
        Some(n) if n > MAX_CONTENT_LENGTH => Err(HeadError::TooLarge),
        Some(0) => Ok(Framing::Empty),
        Some(n) => Ok(Framing::Length(n)),
        None if saw_length => Err(HeadError::Malformed("invalid Content-Length")),
        None => Ok(Framing::UntilClose),
    }
}

/// hyper refuses a field name of 64 KiB or more.
fn check_names(headers: &[Header<'_>]) -> Result<(), HeadError> {
    if headers.iter().any(|h| h.name.len() >= 1 << 16) {
        return Err(HeadError::TooLarge);
    }
    Ok(())
}

/// A method is a token (RFC 9110 `tchar`s), as `http::Method` reads it.
fn is_method(m: &str) -> bool {
    !m.is_empty() && m.bytes().all(is_tchar)
}

fn is_tchar(b: u8) -> bool {
    matches!(b,
        b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.'
        | b'^' | b'_' | b'`' | b'|' | b'~' | b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z')
}

/// The longest target `http::Uri` takes.
const MAX_TARGET: usize = u16::MAX as usize - 1;

/// Checks an origin-form target as `http::Uri` does, and returns it without
/// its fragment.
fn origin_form(target: &str) -> Result<&str, HeadError> {
    const BAD: HeadError = HeadError::Malformed("invalid request target");
    if target.len() > MAX_TARGET {
        return Err(BAD);
    }
    let bytes = target.as_bytes();
    let mut end = bytes.len();
    let mut in_query = false;
    for (i, &b) in bytes.iter().enumerate() {
        let ok = match b {
            b'#' => {
                end = i;
                break;
            }
            b'?' if !in_query => {
                in_query = true;
                true
            }
            0x80..=0xFF => true,
            _ if in_query => matches!(b, 0x21 | 0x24..=0x3B | 0x3D | 0x3F..=0x7E),
            _ => matches!(b,
                0x21 | 0x24..=0x3B | 0x3D | 0x40..=0x5F | 0x61..=0x7A | 0x7C | 0x7E
                | b'"' | b'{' | b'}'),
        };
        if !ok {
            return Err(BAD);
        }
    }
    // httparse hands over a `&str`, so the bytes are UTF-8 already.
    Ok(&target[..end])
}

/// Whether the last coding of a `Transfer-Encoding` line is `chunked`.
fn last_coding_is_chunked(value: &[u8]) -> bool {
    match visible(value) {
        Some(line) => line
            .rsplit(',')
            .next()
            .is_some_and(|c| trim(c.as_bytes()).eq_ignore_ascii_case(b"chunked")),
        None => false,
    }
}

/// Whether a comma-separated field value carries `token` (ASCII case
/// ignored). A value with bytes outside visible ASCII and tab carries none.
pub(crate) fn has_token(value: &[u8], token: &str) -> bool {
    visible(value).is_some_and(|line| {
        line.split(',')
            .any(|t| trim(t.as_bytes()).eq_ignore_ascii_case(token.as_bytes()))
    })
}

/// The value as text if it is visible ASCII and tabs only (what
/// `HeaderValue::to_str` accepts).
fn visible(value: &[u8]) -> Option<&str> {
    if value
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7F).contains(&b))
    {
        std::str::from_utf8(value).ok()
    } else {
        None
    }
}

/// Trims spaces and tabs (on visible ASCII, what `str::trim` trims).
fn trim(mut b: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = b {
        b = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = b {
        b = rest;
    }
    b
}

/// A decimal number of digits only, no sign, no overflow.
fn digits(b: &[u8]) -> Option<u64> {
    if b.is_empty() {
        return None;
    }
    b.iter().try_fold(0u64, |n, &d| {
        if d.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(raw: &[u8]) -> Result<Parsed<()>, HeadError> {
        let mut slots = header_slots();
        parse_request(raw, &mut slots).map(|p| match p {
            Parsed::Complete(_) => Parsed::Complete(()),
            Parsed::Partial => Parsed::Partial,
        })
    }

    #[test]
    fn a_plain_request_borrows_its_fields() {
        let raw = b"GET /a/b?x=1#frag HTTP/1.1\r\nHost: gw\r\nX-A: 1\r\n\r\nrest";
        let mut slots = header_slots();
        let Ok(Parsed::Complete(Request::Head(head))) = parse_request(raw, &mut slots) else {
            panic!("not parsed");
        };
        assert_eq!(head.len, raw.len() - 4);
        assert_eq!(head.method, "GET");
        assert_eq!(head.path_and_query, "/a/b?x=1");
        assert_eq!(head.headers.len(), 2);
        assert_eq!(head.framing, Framing::Empty);
        assert!(head.keep_alive);
    }

    #[test]
    fn framing_follows_the_last_transfer_coding_and_drops_the_length() {
        let raw =
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: gzip, chunked\r\n\r\n";
        let mut slots = header_slots();
        let Ok(Parsed::Complete(Request::Head(head))) = parse_request(raw, &mut slots) else {
            panic!("not parsed");
        };
        assert_eq!(head.framing, Framing::Chunked);
        assert!(head.length_ignored);
        assert!(!head.keep_alive);
    }

    #[test]
    fn refusals_carry_hyper_statuses() {
        let cases: [(&[u8], u16); 5] = [
            (
                b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                400,
            ),
            (b"GET / HTTP/1.1\r\nContent-Length: +1\r\n\r\n", 400),
            (b"GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            (
                b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                400,
            ),
            (b"GET /\x7f HTTP/1.1\r\n\r\n", 400),
        ];
        for (raw, status) in cases {
            match request(raw) {
                Err(e) => assert_eq!(e.status(), Some(status), "{}", String::from_utf8_lossy(raw)),
                Ok(p) => panic!("{} accepted: {p:?}", String::from_utf8_lossy(raw)),
            }
        }
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        let raw = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(request(raw.as_bytes()).unwrap_err().status(), Some(431));
    }

    #[test]
    fn a_response_to_head_has_no_body_whatever_it_declares() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n";
        let mut slots = header_slots();
        let Ok(Parsed::Complete(Response::Head(head))) =
            parse_response(raw, &mut slots, Asked::Head)
        else {
            panic!("not parsed");
        };
        assert_eq!(head.framing, Framing::Empty);
        let mut slots = header_slots();
        let Ok(Parsed::Complete(Response::Head(head))) =
            parse_response(raw, &mut slots, Asked::Other)
        else {
            panic!("not parsed");
        };
        assert_eq!(head.framing, Framing::Length(10));
    }
}
