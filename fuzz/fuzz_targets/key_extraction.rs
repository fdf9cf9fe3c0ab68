//! Partition-key extraction (`proxy::KeyExtractor`): a key is the value the
//! app will see, never empty, and never one of two readings.
//!
//! Input: `URI bytes 0xFF header lines` (`name: value`, one per line).
#![no_main]

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, HeaderValue, Uri};
use libfuzzer_sys::fuzz_target;
use rolegate::fuzzing::canonical::{canonical, percent_decode, readings};
use rolegate::KeyExtractor;

/// Percent-decodes (`+` as space when `plus`), as text when valid UTF-8.
fn decode(raw: &str, plus: bool) -> Option<String> {
    let spaced: Vec<u8> = raw
        .bytes()
        .map(|b| if plus && b == b'+' { b' ' } else { b })
        .collect();
    String::from_utf8(percent_decode(&spaced).into_owned()).ok()
}

/// A parameter name as PHP / Rack read it: cut at NUL, leading spaces and
/// brackets dropped, cut at the first bracket, `.` and space as `_`, ASCII
/// case folded.
fn lenient_name(name: &str) -> String {
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

/// Names of the query's parameters, decoded, split on `&` (and `;`).
fn names(query: &str, semicolons: bool) -> Vec<String> {
    query
        .split(|c| c == '&' || (semicolons && c == ';'))
        .filter(|p| !p.is_empty())
        .map(|p| {
            let k = p.split_once('=').map_or(p, |(k, _)| k);
            decode(k, true).unwrap_or_else(|| k.to_string())
        })
        .collect()
}

fn headers_from(bytes: &[u8]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for line in bytes.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            h.append(n, v);
        }
    }
    h
}

/// Segment `n` (1-based; 0 = last) of the canonical form, as the app's
/// router sees it (case kept).
fn canonical_segment(path: &str, n: usize) -> Option<Vec<u8>> {
    let c = canonical(path, false).ok()?;
    let segs: Vec<&[u8]> = c
        .split(|b| *b == b'/')
        .skip(1)
        .filter(|s| !s.is_empty())
        .collect();
    let s = if n == 0 { segs.last() } else { segs.get(n - 1) };
    s.map(|s| s.to_vec())
}

fuzz_target!(|data: &[u8]| {
    let (uri_part, header_part) = match data.iter().position(|b| *b == 0xFF) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let uri_bytes: Cow<[u8]> = if uri_part.first() == Some(&b'/') {
        Cow::Borrowed(uri_part)
    } else {
        let mut v = Vec::with_capacity(uri_part.len() + 1);
        v.push(b'/');
        v.extend_from_slice(uri_part);
        Cow::Owned(v)
    };
    let Ok(uri) = Uri::try_from(&uri_bytes[..]) else {
        return;
    };
    let headers = headers_from(header_part);

    // query("id")
    let id = KeyExtractor::query("id");
    if let Ok(key) = id.extract(&uri, &headers) {
        assert!(!key.is_empty(), "empty query key from {uri}");
        let query = uri.query().unwrap_or_default();
        // Exactly one `&`-separated parameter whose decoded name is `id`
        // (ASCII case ignored) ...
        let named: Vec<&str> = query
            .split('&')
            .filter(|p| !p.is_empty())
            .filter(|p| {
                let k = p.split_once('=').map_or(*p, |(k, _)| k);
                decode(k, true)
                    .as_deref()
                    .unwrap_or(k)
                    .eq_ignore_ascii_case("id")
            })
            .collect();
        assert_eq!(
            named.len(),
            1,
            "query key {key:?} from {query:?}: named {named:?}"
        );
        // ... and the key is its decoded value.
        let v = named[0].split_once('=').map_or("", |(_, v)| v);
        assert_eq!(decode(v, true).as_deref(), Some(&*key), "{query:?}");
        // A server splitting on `;` too sees the same single parameter.
        let by_semi: Vec<&str> = query
            .split(['&', ';'])
            .filter(|p| !p.is_empty())
            .filter(|p| {
                let k = p.split_once('=').map_or(*p, |(k, _)| k);
                decode(k, true)
                    .as_deref()
                    .unwrap_or(k)
                    .eq_ignore_ascii_case("id")
            })
            .collect();
        assert_eq!(
            by_semi.len(),
            1,
            "`;` splits give {by_semi:?} for {query:?}"
        );
        let v = by_semi[0].split_once('=').map_or("", |(_, v)| v);
        assert_eq!(
            decode(v, true).as_deref(),
            Some(&*key),
            "`;` reading differs: {query:?}"
        );
        // No second parameter a lenient (PHP / Rack) parser reads as `id`.
        for semicolons in [false, true] {
            let disguised = names(query, semicolons)
                .iter()
                .filter(|n| lenient_name(n) == "id")
                .count();
            assert_eq!(disguised, 1, "a second `id` in disguise in {query:?}");
        }
    }

    // Path segments: the key is the app's (canonical) segment, decoded.
    for (ex, n) in [
        (KeyExtractor::PathSegment(2), 2usize),
        (KeyExtractor::PathSegmentLast, 0),
    ] {
        if let Ok(key) = ex.extract(&uri, &headers) {
            assert!(!key.is_empty(), "empty path key from {uri}");
            assert!(
                !key.contains(['/', '\\', ';']),
                "separator in path key {key:?} from {uri}"
            );
            assert!(key != "." && key != "..", "dot key from {uri}");
            // The last segment carries no format suffix (`victim.json`).
            let segs = uri.path()[1..].trim_end_matches('/').split('/').count();
            if n == 0 || n == segs {
                assert!(
                    !key.contains('.'),
                    "dotted last-segment key {key:?} from {uri}"
                );
            }
            // Paths the router refuses (`%uXXXX`, overlong UTF-8, control
            // bytes: `readings` fails first, in the gateway and the layers)
            // never reach key extraction; any other path's key is the app's
            // segment.
            if canonical(uri.path(), false).is_ok() {
                assert_eq!(
                    canonical_segment(uri.path(), n).as_deref(),
                    Some(key.as_bytes()),
                    "key {key:?} is not segment {n} of the canonical form of {:?}",
                    uri.path()
                );
            } else {
                assert!(readings(uri.path()).is_err(), "{:?}", uri.path());
            }
            // Every segment of the raw path is a single, plain segment.
            let raw = uri.path();
            assert!(
                !raw[1..].trim_end_matches('/').split('/').any(|s| {
                    let d = percent_decode(s.as_bytes());
                    d.is_empty() || d.iter().any(|b| b.is_ascii_control())
                }),
                "{raw:?}"
            );
        }
    }

    // header("X-Device-Id")
    let dev = KeyExtractor::header("X-Device-Id").expect("valid header name");
    if let Ok(key) = dev.extract(&uri, &headers) {
        assert!(!key.is_empty(), "empty header key");
        assert_eq!(
            headers.get_all("x-device-id").iter().count(),
            1,
            "{headers:?}"
        );
        let look_alikes = headers
            .keys()
            .filter(|k| {
                k.as_str() != "x-device-id" && k.as_str().replace('_', "-") == "x-device-id"
            })
            .count();
        assert_eq!(
            look_alikes, 0,
            "`_` look-alike next to the key header: {headers:?}"
        );
        let value = headers["x-device-id"].to_str().expect("a text key");
        assert_eq!(value.trim(), key, "key is the trimmed value");
    }
});
