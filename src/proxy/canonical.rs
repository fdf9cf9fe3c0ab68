//! The canonical form of a request path, for gating only (the request is
//! forwarded with its path exactly as received).
//!
//! The app behind the gateway decodes and normalizes a path before its router
//! sees it, and frameworks differ in how. So the gateway asks "could *any*
//! common reading of this path fall under a gated prefix?" and gates when one
//! does. A reading is the raw path put through some of these steps, in this
//! order: percent-decode once (every `%XX`, `%2F` and `%5C` included), read `\`
//! as `/`, drop each segment's `;parameters`, merge repeated slashes, remove
//! dot segments (RFC 3986 5.2.4); or drop the `;parameters` of the raw
//! segments before decoding (Tomcat's and Spring's order). A decoded `?` or
//! `#` ends the path in one more reading: an app that decodes before it
//! splits off the query routes `/maintenance%3Fx` to `/maintenance`. The
//! *canonical* form applies the first five; ASCII case is folded in every
//! reading unless paths are case-sensitive, and then non-ASCII letters that
//! some router folds to ASCII (the Kelvin sign to `k`, dotless `ı` to `i`)
//! give one more reading (see [`fold_to_ascii`]). Encodings some servers
//! decode and others do not (`%uXXXX`, overlong UTF-8) are refused rather than
//! guessed.

use std::borrow::Cow;

/// Why a path cannot be gated safely (answered 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadPath {
    /// The target is not a path (authority-form, `*`, empty).
    #[error("the request target must be a path starting with /")]
    NotAPath,
    /// A decoded byte is NUL or another control character.
    #[error("the path contains a control character once percent-decoded")]
    ControlByte,
    /// `%uXXXX` (IIS) or overlong UTF-8 (`%C0%AF`): some servers decode these
    /// to `/` or letters, others do not.
    #[error("the path uses an encoding servers disagree on (%uXXXX or overlong UTF-8)")]
    AmbiguousEncoding,
}

/// One normalization step a framework may or may not apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Steps {
    /// Percent-decode once.
    pub decode: bool,
    /// Read `\\` as `/`.
    pub backslash: bool,
    /// Drop `;params` from segments.
    pub params: bool,
    /// Merge repeated slashes.
    pub merge: bool,
    /// Remove `.` and `..` segments.
    pub dots: bool,
    /// Drop `;parameters` from the raw segments before decoding.
    pub raw_params: bool,
    /// End the path at the first decoded `?` or `#` (with `decode` only).
    pub cut_query: bool,
}

impl Steps {
    /// Every step: the canonical form.
    pub const ALL: Steps = Steps {
        decode: true,
        backslash: true,
        params: true,
        merge: true,
        dots: true,
        raw_params: false,
        cut_query: false,
    };

    /// All 64 combinations without `cut_query`, the canonical form first.
    pub fn every() -> impl Iterator<Item = Steps> {
        (0u8..64).map(|bits| {
            let on = |b: u8| bits & b == 0;
            Steps {
                decode: on(1),
                backslash: on(2),
                params: on(4),
                merge: on(8),
                dots: on(16),
                raw_params: !on(32),
                cut_query: false,
            }
        })
    }
}

/// The value of one hex digit.
fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Percent-decodes once; a `%` not followed by two hex digits stays as is.
pub fn percent_decode(raw: &[u8]) -> Cow<'_, [u8]> {
    if !raw.contains(&b'%') {
        return Cow::Borrowed(raw);
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            if let (Some(h), Some(l)) = (hex(raw[i + 1]), hex(raw[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    Cow::Owned(out)
}

/// Whether a path needs more than one reading: it holds a byte or a shape that
/// some step would change. Plain paths (the common case) skip all the work.
pub fn is_plain(path: &[u8]) -> bool {
    if path.first() != Some(&b'/') {
        return false;
    }
    if path
        .iter()
        .any(|b| matches!(b, b'%' | b'\\' | b';') || b.is_ascii_control())
    {
        return false;
    }
    if path.windows(2).any(|w| w == b"//") {
        return false;
    }
    !path[1..]
        .split(|b| *b == b'/')
        .any(|s| s == b"." || s == b"..")
}

/// One reading of `path` (which starts with `/`): segments after the chosen
/// steps, joined by `/`, no trailing slash (except `/` itself).
pub fn reading(path: &[u8], steps: Steps) -> Result<Vec<u8>, BadPath> {
    let path: Cow<'_, [u8]> = if steps.raw_params && path.contains(&b';') {
        let kept: Vec<&[u8]> = path
            .split(|b| *b == b'/')
            .map(|seg| seg.split(|b| *b == b';').next().unwrap_or_default())
            .collect();
        Cow::Owned(kept.join(&b'/'))
    } else {
        Cow::Borrowed(path)
    };
    let mut decoded = if steps.decode {
        percent_decode(&path)
    } else {
        Cow::Borrowed(&*path)
    };
    if steps.decode && steps.cut_query {
        if let Some(end) = decoded.iter().position(|b| matches!(b, b'?' | b'#')) {
            decoded.to_mut().truncate(end);
        }
    }
    if decoded.iter().any(|b| b.is_ascii_control()) {
        return Err(BadPath::ControlByte);
    }
    if steps.decode && has_overlong_utf8(&decoded) {
        return Err(BadPath::AmbiguousEncoding);
    }
    // `\` and `;` together: servers differ in which they handle first
    // (`/\;\x/maintenance`), and no ordinary path needs both.
    if decoded.contains(&b'\\') && decoded.contains(&b';') {
        return Err(BadPath::AmbiguousEncoding);
    }
    let mut segments: Vec<&[u8]> = Vec::new();
    let split = |b: &u8| *b == b'/' || (steps.backslash && *b == b'\\');
    // The first byte is a separator, so the first piece is always empty.
    for seg in decoded.split(split).skip(1) {
        let seg = if steps.params {
            seg.split(|b| *b == b';').next().unwrap_or_default()
        } else {
            seg
        };
        if steps.merge && seg.is_empty() {
            continue;
        }
        if steps.dots && seg == b"." {
            continue;
        }
        if steps.dots && seg == b".." {
            segments.pop();
            continue;
        }
        segments.push(seg);
    }
    // A trailing empty segment is a trailing slash: it never changes a match.
    while segments.last().is_some_and(|s| s.is_empty()) {
        segments.pop();
    }
    let mut out = Vec::with_capacity(decoded.len() + 1);
    for s in &segments {
        out.push(b'/');
        out.extend_from_slice(s);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    Ok(out)
}

/// Whether decoded bytes hold an overlong UTF-8 sequence (`C0`/`C1` lead
/// bytes, `E0` followed by `80..9F`, `F0` followed by `80..8F`): lenient
/// decoders read `%C0%AF` as `/`.
fn has_overlong_utf8(b: &[u8]) -> bool {
    b.iter().enumerate().any(|(i, &c)| {
        let next = b.get(i + 1).copied().unwrap_or(0);
        c == 0xC0
            || c == 0xC1
            || (c == 0xE0 && (0x80..=0x9F).contains(&next))
            || (c == 0xF0 && (0x80..=0x8F).contains(&next))
    })
}

/// Whether the raw path holds an IIS-style `%uXXXX` escape.
fn has_percent_u(path: &[u8]) -> bool {
    path.windows(6).any(|w| {
        w[0] == b'%' && (w[1] == b'u' || w[1] == b'U') && w[2..].iter().all(u8::is_ascii_hexdigit)
    })
}

/// The canonical form of a path (every step), case folded when asked.
pub fn canonical(path: &str, fold_case: bool) -> Result<Vec<u8>, BadPath> {
    if !path.starts_with('/') {
        return Err(BadPath::NotAPath);
    }
    if has_percent_u(path.as_bytes()) {
        return Err(BadPath::AmbiguousEncoding);
    }
    let mut out = reading(path.as_bytes(), Steps::ALL)?;
    if fold_case {
        out.make_ascii_lowercase();
    }
    Ok(out)
}

/// Every distinct reading of a path, for matching. A plain path has one.
pub fn readings(path: &str) -> Result<Vec<Vec<u8>>, BadPath> {
    if !path.starts_with('/') {
        return Err(BadPath::NotAPath);
    }
    let bytes = path.as_bytes();
    if has_percent_u(bytes) {
        return Err(BadPath::AmbiguousEncoding);
    }
    let mut out: Vec<Vec<u8>> = Vec::with_capacity(4);
    if is_plain(bytes) {
        out.push(reading(bytes, Steps::ALL)?);
        return Ok(out);
    }
    // Deduplicated by hash, not by comparing with every earlier reading: a
    // 64 KiB path must cost 64 readings, not 64² comparisons of 64 KiB.
    let mut seen = std::collections::HashSet::with_capacity(64);
    for steps in Steps::every() {
        let r = reading(bytes, steps)?;
        if seen.insert(r.clone()) {
            out.push(r);
        }
    }
    if percent_decode(bytes)
        .iter()
        .any(|b| matches!(b, b'?' | b'#'))
    {
        for steps in Steps::every().filter(|s| s.decode) {
            let r = reading(
                bytes,
                Steps {
                    cut_query: true,
                    ..steps
                },
            )?;
            if seen.insert(r.clone()) {
                out.push(r);
            }
        }
    }
    Ok(out)
}

/// The readings matched against the route table: [`readings`], plus, with
/// `fold_case`, each reading that holds a non-ASCII letter some router folds
/// to ASCII, with those letters folded ([`fold_to_ascii`]).
pub fn match_readings(path: &str, fold_case: bool) -> Result<Vec<Vec<u8>>, BadPath> {
    let mut out = readings(path)?;
    if fold_case && out.iter().any(|r| !r.is_ascii()) {
        // Deduplicated by hash, as in `readings`: a long path must not cost
        // a comparison of every pair of readings.
        let mut seen: std::collections::HashSet<Vec<u8>> = out.iter().cloned().collect();
        let folded: Vec<Vec<u8>> = out.iter().filter_map(|r| fold_reading(r)).collect();
        for f in folded {
            if seen.insert(f.clone()) {
                out.push(f);
            }
        }
    }
    Ok(out)
}

/// `reading` with every character that [`fold_to_ascii`] maps replaced by
/// its ASCII text; `None` when nothing changes. Bytes that are not UTF-8 stay.
pub(crate) fn fold_reading(reading: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(reading.len());
    let mut changed = false;
    for chunk in reading.utf8_chunks() {
        for c in chunk.valid().chars() {
            match FOLDS.get_or_init(fold_table).get(&c) {
                Some(ascii) => {
                    out.extend_from_slice(ascii.as_bytes());
                    changed = true;
                }
                None => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        out.extend_from_slice(chunk.invalid());
    }
    changed.then_some(out)
}

/// Every character [`fold_to_ascii`] maps, with its ASCII text: about a
/// hundred, found once by walking every scalar value, so a request's path is
/// folded by look-ups, not by case mappings per character.
static FOLDS: std::sync::OnceLock<std::collections::HashMap<char, String>> =
    std::sync::OnceLock::new();

fn fold_table() -> std::collections::HashMap<char, String> {
    (0x80..=0x10FFFFu32)
        .filter_map(char::from_u32)
        .filter_map(|c| Some((c, fold_to_ascii(c)?)))
        .collect()
}

/// Builds the fold table now (a route table that folds case does, so the
/// first request does not pay for it).
pub(crate) fn prepare_folds() {
    FOLDS.get_or_init(fold_table);
}

/// The ASCII letters a non-ASCII character folds to under some router's
/// case rules, lowercased: the first of its lowercase, uppercase,
/// lowercase-of-uppercase and uppercase-of-lowercase mappings (together a
/// superset of Unicode's full case folding) that holds an ASCII letter, with
/// everything else in it dropped. The Kelvin sign `K` gives `k` (JavaScript's
/// `toLowerCase`), `ı` and `İ` give `i` and `ſ` gives `s` (Python's
/// `re.IGNORECASE`), `ß` gives `ss` and `ﬆ` gives `st`. `None` for ASCII and
/// for every character no mapping takes to an ASCII letter. Derived from the
/// Unicode tables the standard library ships, so it follows Rust's Unicode
/// version.
pub fn fold_to_ascii(c: char) -> Option<String> {
    if c.is_ascii() || !c.is_alphabetic() {
        return None;
    }
    let lower: String = c.to_lowercase().collect();
    let upper: String = c.to_uppercase().collect();
    let lower_of_upper: String = upper.chars().flat_map(char::to_lowercase).collect();
    let upper_of_lower: String = lower.chars().flat_map(char::to_uppercase).collect();
    [lower, upper, lower_of_upper, upper_of_lower]
        .iter()
        .map(|m| {
            m.chars()
                .filter(char::is_ascii_alphabetic)
                .map(|a| a.to_ascii_lowercase())
                .collect::<String>()
        })
        .find(|ascii| !ascii.is_empty())
}

/// Whether `path` is under `prefix` (canonical, no trailing slash) on a
/// segment boundary, or carries a format suffix on the prefix's last segment
/// (`/maintenance.json`: Rails' `(.:format)` and Spring's suffix matching
/// route it to `/maintenance`); with `fold_case`, ASCII case is ignored.
pub fn prefix_matches(prefix: &[u8], path: &[u8], fold_case: bool) -> bool {
    if prefix == b"/" {
        return path.first() == Some(&b'/');
    }
    if path.len() < prefix.len() {
        return false;
    }
    let (head, rest) = path.split_at(prefix.len());
    let same = if fold_case {
        head.eq_ignore_ascii_case(prefix)
    } else {
        head == prefix
    };
    same && (rest.is_empty() || rest[0] == b'/' || (rest[0] == b'.' && !rest.contains(&b'/')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(p: &str) -> String {
        String::from_utf8(canonical(p, true).unwrap()).unwrap()
    }

    #[test]
    fn canonical_form_applies_every_step_once() {
        assert_eq!(canon("/%6daintenance/x"), "/maintenance/x");
        assert_eq!(canon("/maintenance%2Fx"), "/maintenance/x");
        assert_eq!(canon("//maintenance/x"), "/maintenance/x");
        assert_eq!(canon("/a\\b"), "/a/b");
        assert_eq!(canon("/a%5Cb"), "/a/b");
        assert_eq!(canon("/a;jsessionid=1/b"), "/a/b");
        assert_eq!(canon("/x/..;/maintenance"), "/maintenance");
        assert_eq!(canon("/x/%2e%2e/maintenance"), "/maintenance");
        assert_eq!(canon("/./a/./b/"), "/a/b");
        assert_eq!(canon("/../../a"), "/a");
        assert_eq!(canon("/MAINTENANCE"), "/maintenance");
        assert_eq!(canon("/"), "/");
        assert_eq!(canon("/%256d"), "/%6d", "decoded once, not twice");
        assert_eq!(canon("/100%"), "/100%", "a lone % stays");
        assert_eq!(canon("/a%zz"), "/a%zz");
        assert_eq!(
            String::from_utf8(canonical("/A/B", false).unwrap()).unwrap(),
            "/A/B"
        );
    }

    #[test]
    fn control_bytes_and_non_paths_are_refused() {
        assert_eq!(canonical("/a%00b", true), Err(BadPath::ControlByte));
        assert_eq!(canonical("/a%0d%0ab", true), Err(BadPath::ControlByte));
        assert_eq!(canonical("/a%7f", true), Err(BadPath::ControlByte));
        assert_eq!(canonical("*", true), Err(BadPath::NotAPath));
        assert_eq!(canonical("", true), Err(BadPath::NotAPath));
        assert!(canonical("/caf%C3%A9", true).is_ok(), "UTF-8 is fine");
        assert!(canonical("/%ff", true).is_ok(), "matching is byte-wise");
    }

    #[test]
    fn encodings_servers_disagree_on_are_refused() {
        assert_eq!(
            canonical("/%u006daintenance", true),
            Err(BadPath::AmbiguousEncoding)
        );
        assert_eq!(
            readings("/%U006Daintenance").unwrap_err(),
            BadPath::AmbiguousEncoding
        );
        assert_eq!(
            canonical("/a%C0%AFmaintenance", true),
            Err(BadPath::AmbiguousEncoding)
        );
        assert_eq!(
            canonical("/a%E0%80%AFb", true),
            Err(BadPath::AmbiguousEncoding)
        );
        assert!(
            canonical("/%E2%82%AC", true).is_ok(),
            "a real three-byte character"
        );
        assert!(canonical("/%uzzzz", true).is_ok(), "not an escape");
        assert_eq!(
            readings("/%5c%3b\\c/maintenance").unwrap_err(),
            BadPath::AmbiguousEncoding
        );
    }

    #[test]
    fn tomcat_order_drops_raw_params_before_decoding() {
        let r: Vec<String> = readings("/;%2Fx/%6Daintenance/run")
            .unwrap()
            .into_iter()
            .map(|r| String::from_utf8(r).unwrap())
            .collect();
        assert!(r.contains(&"/maintenance/run".to_string()), "{r:?}");
    }

    #[test]
    fn plain_paths_have_one_reading() {
        assert!(is_plain(b"/a/b/c"));
        assert!(is_plain(b"/a/b/"));
        assert!(is_plain(b"/"));
        assert!(!is_plain(b"//a"));
        assert!(!is_plain(b"/a//b"));
        assert!(!is_plain(b"/a/./b"));
        assert!(!is_plain(b"/a/.."));
        assert!(!is_plain(b"/a%2fb"));
        assert!(!is_plain(b"/a;b"));
        assert!(!is_plain(b"/a\\b"));
        assert_eq!(readings("/a/b").unwrap().len(), 1);
    }

    #[test]
    fn readings_keep_what_some_framework_sees() {
        let r: Vec<String> = readings("/a//../b")
            .unwrap()
            .into_iter()
            .map(|r| String::from_utf8(r).unwrap())
            .collect();
        assert!(r.contains(&"/b".to_string()), "{r:?}");
        assert!(
            r.contains(&"/a/b".to_string()),
            "dots without merging: {r:?}"
        );
        assert!(r.contains(&"/a/../b".to_string()), "dots kept: {r:?}");
    }

    #[test]
    fn prefixes_match_on_segment_boundaries() {
        assert!(prefix_matches(b"/orders", b"/orders", true));
        assert!(prefix_matches(b"/orders", b"/orders/7", true));
        assert!(prefix_matches(b"/orders", b"/ORDERS/7", true));
        assert!(!prefix_matches(b"/orders", b"/ORDERS/7", false));
        assert!(!prefix_matches(b"/orders", b"/ordersx", true));
        assert!(
            prefix_matches(b"/orders", b"/orders.json", true),
            "format suffix"
        );
        assert!(!prefix_matches(b"/orders", b"/orders.v2/x", true));
        assert!(!prefix_matches(b"/orders", b"/order", true));
        assert!(prefix_matches(b"/", b"/anything", true));
    }

    /// Every character a router may fold onto an ASCII letter, by the
    /// mappings JavaScript's `toLowerCase`/`toUpperCase` and Python's
    /// `re.IGNORECASE` apply: (character, ASCII letter).
    fn folds_onto_ascii() -> Vec<(char, char)> {
        let mut out = Vec::new();
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            if c.is_ascii() {
                continue;
            }
            let mut maps: Vec<String> =
                vec![c.to_lowercase().collect(), c.to_uppercase().collect()];
            maps.push(maps[1].to_lowercase());
            maps.push(maps[0].to_uppercase());
            for m in maps {
                for a in m.chars().filter(char::is_ascii_alphabetic) {
                    out.push((c, a.to_ascii_lowercase()));
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    #[test]
    fn every_scalar_value_that_folds_onto_an_ascii_letter_is_read_as_it() {
        let folds = folds_onto_ascii();
        for (c, a) in [
            ('\u{212A}', 'k'),
            ('ı', 'i'),
            ('İ', 'i'),
            ('ſ', 's'),
            ('ß', 's'),
            ('ẞ', 's'),
            ('ﬀ', 'f'),
            ('ﬆ', 't'),
        ] {
            assert!(folds.contains(&(c, a)), "{c:?} -> {a}");
        }
        for (c, a) in &folds {
            let text =
                fold_to_ascii(*c).unwrap_or_else(|| panic!("{c:?} ({:X}) not folded", *c as u32));
            assert!(text.contains(*a), "{c:?} folds to {text:?}, not onto {a}");
            // A letter of a path read through the folded reading.
            let mut buf = [0u8; 4];
            let encoded: String = c
                .encode_utf8(&mut buf)
                .bytes()
                .map(|b| format!("%{b:02X}"))
                .collect();
            let path = format!("/x{encoded}y");
            let r = match_readings(&path, true).unwrap();
            assert!(
                r.contains(&format!("/x{text}y").into_bytes()),
                "{path}: {r:?}"
            );
            assert_eq!(
                match_readings(&path, false).unwrap().len(),
                readings(&path).unwrap().len()
            );
        }
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            if fold_to_ascii(c).is_some() {
                assert!(
                    folds.iter().any(|(f, _)| *f == c),
                    "{c:?} folded needlessly"
                );
            }
        }
    }

    #[test]
    fn a_decoded_query_delimiter_ends_one_reading() {
        let r = readings("/maintenance%3Fx/y").unwrap();
        assert!(r.contains(&b"/maintenance".to_vec()), "{r:?}");
        assert!(r.contains(&b"/maintenance?x/y".to_vec()), "{r:?}");
        let r = readings("/a%23b").unwrap();
        assert!(r.contains(&b"/a".to_vec()), "{r:?}");
        assert_eq!(
            readings("/a%3Cb").unwrap().len(),
            2,
            "no delimiter, no extra reading"
        );
    }
}
