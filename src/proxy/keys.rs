//! Partition keys: where a route finds the key a partition is chosen by.
//! Keys are taken as received (nothing is percent-decoded), so a client and
//! `rolegate resolve` agree byte for byte.

use std::borrow::Cow;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, Uri};

use crate::config::KeySource;

type KeyFn = Arc<dyn Fn(&Uri, &HeaderMap) -> Option<String> + Send + Sync>;

/// Finds a request's partition key. An absent or empty key is `None` (400).
#[derive(Clone)]
pub enum KeyExtractor {
    Header(HeaderName),
    Query(String),
    /// 1-based path segment (`/a/b`: 1 = `a`).
    PathSegment(usize),
    PathSegmentLast,
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
    pub fn header(name: &str) -> Result<Self, http::header::InvalidHeaderName> {
        Ok(KeyExtractor::Header(HeaderName::from_bytes(
            name.as_bytes(),
        )?))
    }

    pub fn query(name: impl Into<String>) -> Self {
        KeyExtractor::Query(name.into())
    }

    /// A closure over the request URI and headers.
    pub fn custom(f: impl Fn(&Uri, &HeaderMap) -> Option<String> + Send + Sync + 'static) -> Self {
        KeyExtractor::Custom(Arc::new(f))
    }

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

    /// The key, or `None` when absent or empty.
    pub fn extract<'a>(&self, uri: &'a Uri, headers: &'a HeaderMap) -> Option<Cow<'a, str>> {
        let key: Option<Cow<'a, str>> = match self {
            KeyExtractor::Header(name) => headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(|s| Cow::Borrowed(s.trim())),
            KeyExtractor::Query(name) => uri.query().and_then(|q| {
                q.split('&').find_map(|pair| {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    (k == name).then_some(Cow::Borrowed(v))
                })
            }),
            KeyExtractor::PathSegment(n) => uri
                .path()
                .split('/')
                .skip(1)
                .nth(n.saturating_sub(1))
                .map(Cow::Borrowed),
            KeyExtractor::PathSegmentLast => {
                let path = uri.path();
                let path = path.strip_suffix('/').unwrap_or(path);
                path.rsplit('/').next().map(Cow::Borrowed)
            }
            KeyExtractor::Custom(f) => f(uri, headers).map(Cow::Owned),
        };
        key.filter(|k| !k.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    #[test]
    fn keys_from_each_source() {
        let mut h = HeaderMap::new();
        h.insert("x-device-id", "d-7".parse().unwrap());
        let u = uri("/orders/42/items/9?id=abc&x=&flag");
        assert_eq!(
            KeyExtractor::header("X-Device-Id")
                .unwrap()
                .extract(&u, &h)
                .as_deref(),
            Some("d-7")
        );
        assert_eq!(
            KeyExtractor::query("id").extract(&u, &h).as_deref(),
            Some("abc")
        );
        assert_eq!(
            KeyExtractor::query("x").extract(&u, &h),
            None,
            "empty is missing"
        );
        assert_eq!(KeyExtractor::query("flag").extract(&u, &h), None);
        assert_eq!(KeyExtractor::query("nope").extract(&u, &h), None);
        assert_eq!(
            KeyExtractor::PathSegment(2).extract(&u, &h).as_deref(),
            Some("42")
        );
        assert_eq!(KeyExtractor::PathSegment(9).extract(&u, &h), None);
        assert_eq!(
            KeyExtractor::PathSegmentLast.extract(&u, &h).as_deref(),
            Some("9")
        );
        assert_eq!(
            KeyExtractor::PathSegmentLast
                .extract(&uri("/orders/7/"), &h)
                .as_deref(),
            Some("7")
        );
        assert_eq!(
            KeyExtractor::PathSegmentLast.extract(&uri("/orders//"), &h),
            None
        );
        assert_eq!(
            KeyExtractor::header("x-missing").unwrap().extract(&u, &h),
            None
        );
        let custom = KeyExtractor::custom(|u, _| u.path().strip_prefix("/t/").map(str::to_owned));
        assert_eq!(custom.extract(&uri("/t/k1"), &h).as_deref(), Some("k1"));
        assert_eq!(
            KeyExtractor::query("id")
                .extract(&uri("/a?id=a%20b"), &h)
                .as_deref(),
            Some("a%20b")
        );
    }
}
