//! Partition keys: where a route finds the key a partition is chosen by.
//! The key is the value the app itself will see (path segments and query
//! values percent-decoded once), so `rolegate resolve KEY` and the library's
//! `resolve(key)` agree with the gateway whatever encoding the client used.
//! Where two parsers could see two different keys, the request is refused.
//! Every reading an app might apply to the key's text (as sent, percent-decoded,
//! form-decoded with `+` as a space) must land in one partition; the gate
//! checks that with [`KeyExtractor::readings`].

use std::borrow::Cow;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, Uri};

/// Where a partition route finds its key (the config's `key:` field).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeySource {
    /// A request header, by lowercase name.
    Header(String),
    /// A query parameter, by name.
    Query(String),
    /// 1-based index of a path segment (`/a/b` has segment 1 = `a`).
    PathSegment(usize),
    /// The last path segment.
    PathSegmentLast,
}

/// Whether a query-keyed route reads a form body for its key parameter
/// (the config's `key.body`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FormBody {
    /// Read a form body (`application/x-www-form-urlencoded`,
    /// `multipart/form-data`) before deciding, and refuse the request when
    /// it names the key parameter: many apps merge body parameters over the
    /// query's (Go's `FormValue`, Rack's `params`, PHP's `$_REQUEST`).
    #[default]
    Check,
    /// Leave bodies alone: only for an app that reads the key from the URL
    /// alone (Rails' `params`, Tomcat's and Jetty's `getParameter`, whose
    /// query wins).
    Ignore,
}

type KeyFn = Arc<dyn Fn(&Uri, &HeaderMap) -> Option<String> + Send + Sync>;

/// Finds a request's partition key. An absent or empty key is `None` (400).
#[derive(Clone)]
#[non_exhaustive]
pub enum KeyExtractor {
    /// A request header.
    Header(HeaderName),
    /// A query parameter, by name (compared ignoring case).
    Query(String),
    /// 1-based path segment (`/a/b`: 1 = `a`).
    PathSegment(usize),
    /// The last path segment.
    PathSegmentLast,
    /// Your own function of the URI and headers.
    Custom(KeyFn),
}

impl std::fmt::Debug for KeyExtractor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyExtractor::Header(h) => write!(f, "header {h}"),
            KeyExtractor::Query(q) => write!(f, "query {q}"),
            KeyExtractor::PathSegment(n) => write!(f, "path segment {n}"),
            KeyExtractor::PathSegmentLast => write!(f, "last path segment"),
            KeyExtractor::Custom(_) => write!(f, "custom"),
        }
    }
}

impl KeyExtractor {
    /// The key is the header `name`; fails on an invalid header name.
    pub fn header(name: &str) -> Result<Self, http::header::InvalidHeaderName> {
        Ok(KeyExtractor::Header(HeaderName::from_bytes(
            name.as_bytes(),
        )?))
    }

    /// The key is the query parameter `name`.
    pub fn query(name: impl Into<String>) -> Self {
        KeyExtractor::Query(name.into())
    }

    /// A closure over the request URI and headers.
    pub fn custom(f: impl Fn(&Uri, &HeaderMap) -> Option<String> + Send + Sync + 'static) -> Self {
        KeyExtractor::Custom(Arc::new(f))
    }

    /// The extractor a config `key:` describes.
    pub fn from_source(source: &KeySource) -> Self {
        match source {
            // Validated by the config loader.
            KeySource::Header(h) => HeaderName::from_bytes(h.as_bytes())
                .map(KeyExtractor::Header)
                .unwrap_or_else(|_| KeyExtractor::Query(h.clone())),
            KeySource::Query(q) => KeyExtractor::Query(q.clone()),
            KeySource::PathSegment(n) => KeyExtractor::PathSegment(*n),
            KeySource::PathSegmentLast => KeyExtractor::PathSegmentLast,
        }
    }

    /// The key the app will see: path segments and query values are
    /// percent-decoded (`+` is a space in a query), header values are used as
    /// sent. A key given twice, or a path the app may split differently,
    /// is refused rather than guessed.
    pub fn extract<'a>(
        &self,
        uri: &'a Uri,
        headers: &'a HeaderMap,
    ) -> Result<Cow<'a, str>, KeyError> {
        let key: Cow<'a, str> = match self {
            KeyExtractor::Header(name) => header_key(headers, name)?,
            KeyExtractor::Query(name) => {
                let query = uri.query().unwrap_or_default();
                // Tomcat drops a pair with a malformed escape, so a second
                // value of the key (a form body's) would win there.
                if has_malformed_escape(query) {
                    return Err(KeyError::Ambiguous);
                }
                // PHP's `$_REQUEST` takes cookies over the query unless
                // `request_order` says otherwise.
                if cookie_names(headers, name) {
                    return Err(KeyError::Ambiguous);
                }
                let by_amp = query_key(query, name, false)?;
                if query.contains(';') && query_key(query, name, true)? != by_amp {
                    // Some servers split on `;` as well as `&`.
                    return Err(KeyError::Ambiguous);
                }
                by_amp.ok_or(KeyError::Missing)?
            }
            KeyExtractor::PathSegment(n) => {
                let segments = path_segments(uri.path())?;
                let i = n.saturating_sub(1);
                let raw = segments.get(i).copied().ok_or(KeyError::Missing)?;
                segment_key(raw, i + 1 == segments.len())?
            }
            KeyExtractor::PathSegmentLast => {
                let segments = path_segments(uri.path())?;
                let raw = segments.last().copied().ok_or(KeyError::Missing)?;
                segment_key(raw, true)?
            }
            KeyExtractor::Custom(f) => Cow::Owned(f(uri, headers).ok_or(KeyError::Missing)?),
        };
        if key.is_empty() {
            return Err(KeyError::Missing);
        }
        Ok(key)
    }

    /// The other texts an app might take the key to be, beside `key` (what
    /// [`extract`](Self::extract) gave), as far as they differ from it. A
    /// route is safe only when all of them land in one partition.
    /// - A path segment as sent, and form-decoded (`+` as a space): Rack's
    ///   `PATH_INFO`, Go's `EscapedPath` and Tomcat's `getRequestURI` give
    ///   `/orders/%701` as `%701`, and `URLDecoder.decode` of that gives
    ///   `/orders/p+3` as `p 3`.
    /// - A query value percent-decoded with `+` kept (`decodeURIComponent`,
    ///   Go's `PathUnescape`) as well as with `+` as a space.
    /// - A header value is read as sent: nothing else.
    ///
    /// Nothing for a custom key.
    pub fn readings(&self, uri: &Uri, key: &str) -> Vec<String> {
        let (raw, forms): (Option<&str>, &[(bool, bool)]) = match self {
            KeyExtractor::Query(name) => (
                raw_query_value(uri.query().unwrap_or_default(), name),
                &[(true, false)],
            ),
            KeyExtractor::PathSegment(n) => (
                path_segments(uri.path())
                    .ok()
                    .and_then(|s| s.get(n.saturating_sub(1)).copied()),
                &[(false, false), (true, true)],
            ),
            KeyExtractor::PathSegmentLast => (
                path_segments(uri.path())
                    .ok()
                    .and_then(|s| s.last().copied()),
                &[(false, false), (true, true)],
            ),
            KeyExtractor::Header(_) | KeyExtractor::Custom(_) => (None, &[]),
        };
        let Some(raw) = raw else {
            return Vec::new();
        };
        let mut out: Vec<String> = Vec::new();
        for &(decode, plus) in forms {
            let spaced: Vec<u8> = raw
                .bytes()
                .map(|b| if plus && b == b'+' { b' ' } else { b })
                .collect();
            let reading = if decode {
                String::from_utf8_lossy(&super::canonical::percent_decode(&spaced)).into_owned()
            } else {
                String::from_utf8_lossy(&spaced).into_owned()
            };
            if reading != key && !reading.is_empty() && !out.contains(&reading) {
                out.push(reading);
            }
        }
        out
    }
}

/// Whether `text` holds a `%` not followed by two hex digits (`%zz`, `%u0041`,
/// a trailing `%`): servers differ on what such an escape means, and some
/// drop the whole parameter.
pub(crate) fn has_malformed_escape(text: &str) -> bool {
    let b = text.as_bytes();
    b.iter().enumerate().any(|(i, &c)| {
        c == b'%'
            && !(b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    })
}

/// Whether a `Cookie` field names the query key `name` (compared as
/// lenient parsers fold names).
fn cookie_names(headers: &HeaderMap, name: &str) -> bool {
    let want = fold_param_name(name);
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b';'))
        .filter_map(|pair| {
            let pair = std::str::from_utf8(pair).ok()?;
            Some(pair.split_once('=').map_or(pair, |(k, _)| k).trim())
        })
        .any(|k| {
            let k = decode_utf8(k, true).unwrap_or(Cow::Borrowed(k));
            fold_param_name(&k) == want
        })
}

/// The undecoded value of query parameter `name` (its first pair).
fn raw_query_value<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split(['&', ';'])
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .find(|(k, _)| {
            decode_utf8(k, true)
                .unwrap_or(Cow::Borrowed(k))
                .eq_ignore_ascii_case(name)
        })
        .map(|(_, v)| v)
}

/// Why a request has no usable partition key (answered 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the key is missing or empty")]
    Missing,
    #[error("the key is given more than once")]
    Duplicate,
    #[error("the key reads differently depending on how the app parses the request")]
    Ambiguous,
    #[error("the key is not UTF-8 text once decoded")]
    NotText,
}

/// A header key: exactly one field of that name, and no look-alike that a
/// CGI server folds into it (`X.Device_Id` for `X-Device-Id`).
fn header_key<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Result<Cow<'a, str>, KeyError> {
    let mut values = headers.get_all(name).iter();
    let value = values.next().ok_or(KeyError::Missing)?;
    if values.next().is_some() {
        return Err(KeyError::Duplicate);
    }
    // The gateway and the layers drop every name with punctuation other
    // than `-` before deciding; this keeps `extract` safe for a library user
    // who calls it on raw headers.
    if headers
        .keys()
        .any(|k| k != name && super::headers::same_when_folded(k.as_str(), name.as_str()))
    {
        return Err(KeyError::Duplicate);
    }
    let text = value.to_str().map_err(|_| KeyError::NotText)?;
    Ok(Cow::Borrowed(text.trim()))
}

/// The value of query parameter `name` (names compared decoded and ignoring
/// ASCII case); `Duplicate` when it appears twice. `semicolons` also splits
/// pairs on `;`.
fn query_key<'a>(
    query: &'a str,
    name: &str,
    semicolons: bool,
) -> Result<Option<Cow<'a, str>>, KeyError> {
    let mut found = None;
    let pairs = query.split(|c| c == '&' || (semicolons && c == ';'));
    for pair in pairs.filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = decode_utf8(k, true).unwrap_or(Cow::Borrowed(k));
        if !k.eq_ignore_ascii_case(name) {
            // PHP and Rack rewrite some names into this one (`id[]`, `[id]`,
            // ` id`, `device.id` for `device_id`): a second key in disguise.
            if fold_param_name(&k) == fold_param_name(name) {
                return Err(KeyError::Duplicate);
            }
            continue;
        }
        if found.is_some() {
            return Err(KeyError::Duplicate);
        }
        found = Some(decode_utf8(v, true)?);
    }
    Ok(found)
}

/// A query parameter name as lenient parsers read it: leading spaces and
/// brackets dropped, cut at NUL or the first bracket (`id[]` is `id`), `.`
/// and space read as `_` (PHP), ASCII case folded.
pub(crate) fn fold_param_name(name: &str) -> String {
    let name = name.split('\0').next().unwrap_or_default();
    let name = name.trim_start_matches([' ', '[', ']']);
    let name = name.split(['[', ']']).next().unwrap_or_default();
    name.chars()
        .map(|c| match c {
            '.' | ' ' => '_',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

/// A path-segment key, decoded. A dot in the path's last segment is refused:
/// Rails' `(.:format)` and Spring's suffix matching would read
/// `/orders/victim.json` as key `victim`.
fn segment_key(raw: &str, last: bool) -> Result<Cow<'_, str>, KeyError> {
    if has_malformed_escape(raw) {
        return Err(KeyError::Ambiguous);
    }
    let key = decode_utf8(raw, false)?;
    if last && key.contains('.') {
        return Err(KeyError::Ambiguous);
    }
    Ok(key)
}

/// The raw segments of a path whose every reading agrees on its segments:
/// refused when a segment is empty (but a trailing slash), a dot segment, or
/// holds `\` or `;` or an encoded `/`, since frameworks split those differently.
fn path_segments(path: &str) -> Result<Vec<&str>, KeyError> {
    let body = path.strip_prefix('/').ok_or(KeyError::Missing)?;
    let body = body.strip_suffix('/').unwrap_or(body);
    if body.is_empty() {
        return Ok(Vec::new());
    }
    let segments: Vec<&str> = body.split('/').collect();
    for s in &segments {
        let decoded = super::canonical::percent_decode(s.as_bytes());
        if decoded.is_empty()
            || &*decoded == b"."
            || &*decoded == b".."
            || decoded
                .iter()
                .any(|b| matches!(b, b'/' | b'\\' | b';') || b.is_ascii_control())
        {
            return Err(KeyError::Ambiguous);
        }
    }
    Ok(segments)
}

/// Percent-decodes once (`+` as a space when `plus`), as UTF-8.
fn decode_utf8(raw: &str, plus: bool) -> Result<Cow<'_, str>, KeyError> {
    if !(raw.contains('%') || (plus && raw.contains('+'))) {
        return Ok(Cow::Borrowed(raw));
    }
    let spaced: Cow<'_, [u8]> = if plus && raw.contains('+') {
        Cow::Owned(
            raw.bytes()
                .map(|b| if b == b'+' { b' ' } else { b })
                .collect(),
        )
    } else {
        Cow::Borrowed(raw.as_bytes())
    };
    let decoded = super::canonical::percent_decode(&spaced).into_owned();
    String::from_utf8(decoded)
        .map(Cow::Owned)
        .map_err(|_| KeyError::NotText)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    fn key(k: &KeyExtractor, u: &str, h: &HeaderMap) -> Result<String, KeyError> {
        k.extract(&uri(u), h).map(|c| c.into_owned())
    }

    #[test]
    fn keys_from_each_source() {
        let mut h = HeaderMap::new();
        h.insert("x-device-id", "d-7".parse().unwrap());
        let u = "/orders/42/items/9?id=abc&x=&flag";
        let header = KeyExtractor::header("X-Device-Id").unwrap();
        assert_eq!(key(&header, u, &h).as_deref(), Ok("d-7"));
        let id = KeyExtractor::query("id");
        assert_eq!(key(&id, u, &h).as_deref(), Ok("abc"));
        assert_eq!(
            key(&KeyExtractor::query("x"), u, &h),
            Err(KeyError::Missing)
        );
        assert_eq!(
            key(&KeyExtractor::query("flag"), u, &h),
            Err(KeyError::Missing)
        );
        assert_eq!(
            key(&KeyExtractor::query("nope"), u, &h),
            Err(KeyError::Missing)
        );
        assert_eq!(
            key(&KeyExtractor::PathSegment(2), u, &h).as_deref(),
            Ok("42")
        );
        assert_eq!(
            key(&KeyExtractor::PathSegment(9), u, &h),
            Err(KeyError::Missing)
        );
        assert_eq!(
            key(&KeyExtractor::PathSegmentLast, u, &h).as_deref(),
            Ok("9")
        );
        assert_eq!(
            key(&KeyExtractor::PathSegmentLast, "/orders/7/", &h).as_deref(),
            Ok("7")
        );
        assert_eq!(
            key(&KeyExtractor::header("x-missing").unwrap(), u, &h),
            Err(KeyError::Missing)
        );
        let custom = KeyExtractor::custom(|u, _| u.path().strip_prefix("/t/").map(str::to_owned));
        assert_eq!(key(&custom, "/t/k1", &h).as_deref(), Ok("k1"));
    }

    #[test]
    fn keys_are_the_decoded_value_the_app_sees() {
        let h = HeaderMap::new();
        let last = KeyExtractor::PathSegmentLast;
        assert_eq!(
            key(&last, "/orders/ord%65r-42", &h).as_deref(),
            Ok("order-42")
        );
        assert_eq!(
            key(&last, "/orders/order-42", &h).as_deref(),
            Ok("order-42")
        );
        let id = KeyExtractor::query("id");
        assert_eq!(key(&id, "/a?id=a%20b", &h).as_deref(), Ok("a b"));
        assert_eq!(key(&id, "/a?id=a+b", &h).as_deref(), Ok("a b"));
        assert_eq!(key(&id, "/a?%69d=victim", &h).as_deref(), Ok("victim"));
        assert_eq!(key(&id, "/a?ID=victim", &h).as_deref(), Ok("victim"));
        assert_eq!(key(&id, "/a?id=%ff", &h), Err(KeyError::NotText));
    }

    #[test]
    fn keys_given_twice_or_readable_two_ways_are_refused() {
        let h = HeaderMap::new();
        let id = KeyExtractor::query("id");
        assert_eq!(
            key(&id, "/a?%69d=victim&id=benign", &h),
            Err(KeyError::Duplicate)
        );
        assert_eq!(key(&id, "/a?id=1&id=1", &h), Err(KeyError::Duplicate));
        assert_eq!(key(&id, "/a?Id=1&id=2", &h), Err(KeyError::Duplicate));
        assert_eq!(key(&id, "/a?x=1;id=2&id=3", &h), Err(KeyError::Duplicate));
        assert_eq!(key(&id, "/a?id=1;x=2", &h), Err(KeyError::Ambiguous));
        let last = KeyExtractor::PathSegmentLast;
        for p in [
            "/orders/a%2Fb",
            "/orders/a%5Cb",
            "/orders/a\\b",
            "/orders//42",
            "//orders/42",
            "/orders/42/..",
            "/orders/42/%2e%2e/43",
            "/orders/42;v=1",
        ] {
            assert_eq!(key(&last, p, &h), Err(KeyError::Ambiguous), "{p}");
        }
        let seg = KeyExtractor::PathSegment(2);
        assert_eq!(key(&seg, "/x/../orders/42", &h), Err(KeyError::Ambiguous));
        // A format suffix on the last segment (Rails, Spring) hides the key.
        assert_eq!(
            key(&last, "/orders/victim.json", &h),
            Err(KeyError::Ambiguous)
        );
        assert_eq!(
            key(&seg, "/orders/victim.json", &h),
            Err(KeyError::Ambiguous)
        );
        assert_eq!(
            key(&seg, "/orders/a.b/items", &h).as_deref(),
            Ok("a.b"),
            "not the last segment"
        );
        // Names PHP and Rack rewrite into the key's name.
        for q in [
            "/a?id=benign&id[]=victim",
            "/a?id=benign&[id]=victim",
            "/a?id=benign&+id=victim",
            "/a?id=benign&id%00=victim",
        ] {
            assert_eq!(key(&id, q, &h), Err(KeyError::Duplicate), "{q}");
        }
        let dev = KeyExtractor::query("device_id");
        assert_eq!(
            key(&dev, "/a?device_id=a&device.id=b", &h),
            Err(KeyError::Duplicate)
        );
        assert_eq!(key(&id, "/a?idx=1&id=2", &h).as_deref(), Ok("2"));

        let dev = KeyExtractor::header("X-Device-Id").unwrap();
        let mut two = HeaderMap::new();
        two.append("x-device-id", "a".parse().unwrap());
        two.append("x-device-id", "b".parse().unwrap());
        assert_eq!(key(&dev, "/", &two), Err(KeyError::Duplicate));
        let mut look_alike = HeaderMap::new();
        look_alike.append("x-device-id", "benign".parse().unwrap());
        look_alike.append("x_device_id", "victim".parse().unwrap());
        assert_eq!(key(&dev, "/", &look_alike), Err(KeyError::Duplicate));
    }

    #[test]
    fn malformed_escapes_and_cookies_naming_a_query_key_are_ambiguous() {
        let id = KeyExtractor::query("id");
        let h = HeaderMap::new();
        for q in [
            "/a?id=m0%zz",
            "/a?id=m0%",
            "/a?id=m0%2",
            "/a?id=m0%g1",
            "/a?id=m0%%",
            "/a?id=m0%u0041",
            "/a?id=m0&x=%zz",
        ] {
            assert_eq!(key(&id, q, &h), Err(KeyError::Ambiguous), "{q}");
        }
        assert_eq!(
            key(&KeyExtractor::PathSegment(2), "/orders/m%zz/x", &h),
            Err(KeyError::Ambiguous)
        );
        let mut cookie = HeaderMap::new();
        cookie.insert("cookie", "session=1; ID=victim".parse().unwrap());
        assert_eq!(key(&id, "/a?id=mine", &cookie), Err(KeyError::Ambiguous));
        cookie.insert("cookie", "session=1; idx=2".parse().unwrap());
        assert_eq!(key(&id, "/a?id=mine", &cookie).as_deref(), Ok("mine"));
    }

    #[test]
    fn readings_are_the_other_texts_an_app_may_take_the_key_for() {
        let h = HeaderMap::new();
        let readings = |k: &KeyExtractor, u: &str| {
            let u = uri(u);
            let key = k.extract(&u, &h).unwrap().into_owned();
            k.readings(&u, &key)
        };
        let seg = KeyExtractor::PathSegment(2);
        assert_eq!(readings(&seg, "/orders/p+3/x"), vec!["p 3".to_string()]);
        assert_eq!(readings(&seg, "/orders/%701/x"), vec!["%701".to_string()]);
        assert!(readings(&seg, "/orders/p1/x").is_empty());
        let last = KeyExtractor::PathSegmentLast;
        assert_eq!(
            readings(&last, "/orders/a%2Bb"),
            vec!["a%2Bb".to_string()],
            "decoded, form-decoded: a+b both"
        );
        let id = KeyExtractor::query("id");
        assert_eq!(readings(&id, "/a?id=a+b"), vec!["a+b".to_string()]);
        assert!(readings(&id, "/a?id=a%20b").is_empty());
        let mut dev = HeaderMap::new();
        dev.insert("x-device-id", "a+b%41".parse().unwrap());
        let header = KeyExtractor::header("x-device-id").unwrap();
        assert!(header.readings(&uri("/"), "a+b%41").is_empty());
    }
}
