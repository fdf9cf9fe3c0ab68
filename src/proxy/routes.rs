//! The route table: canonical prefixes matched on path-segment boundaries,
//! longest first, against every reading of the request path (see
//! [`canonical`](super::canonical)): when in doubt, gate.

use super::canonical::{self, BadPath};

/// Why a path gets no route decision (answered 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error(transparent)]
    /// The path cannot be read safely.
    BadPath(#[from] BadPath),
    /// Two readings of the path fall under different routes.
    #[error("the path reads as more than one gated route once decoded and normalized")]
    Ambiguous,
}

/// Checks a configured prefix and returns its canonical form: starts with
/// `/`, no query, no `.`/`..` segment, no control byte once decoded; trailing
/// slashes dropped; ASCII case folded when `fold_case`.
pub fn canonical_prefix(prefix: &str, fold_case: bool) -> Result<String, PrefixError> {
    let refuse = |why| {
        Err(PrefixError {
            prefix: prefix.to_string(),
            why,
        })
    };
    if !prefix.starts_with('/') {
        return refuse(PrefixProblem::NoSlash);
    }
    if prefix.contains(['?', '#'])
        || prefix
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return refuse(PrefixProblem::NotPlain);
    }
    let decoded = canonical::percent_decode(prefix.as_bytes());
    if decoded
        .split(|b| *b == b'/' || *b == b'\\')
        .any(|s| s == b"." || s == b"..")
    {
        return refuse(PrefixProblem::DotSegment);
    }
    if decoded.contains(&b';') {
        return refuse(PrefixProblem::Semicolon);
    }
    let canon = match canonical::canonical(prefix, fold_case) {
        // Folded like a path's folded reading, so that reading matches it
        // and two prefixes that fold alike collide.
        Ok(canon) if fold_case => canonical::fold_reading(&canon).unwrap_or(canon),
        Ok(canon) => canon,
        Err(e) => return refuse(PrefixProblem::BadPath(e)),
    };
    match String::from_utf8(canon) {
        Ok(canon) => Ok(canon),
        Err(_) => refuse(PrefixProblem::NotUtf8),
    }
}

/// A configured prefix that cannot be matched safely.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("prefix `{prefix}` {why}")]
pub struct PrefixError {
    /// The prefix as written.
    pub prefix: String,
    /// What is wrong with it.
    pub why: PrefixProblem,
}

/// What is wrong with a prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefixProblem {
    /// It does not start with `/`.
    #[error("must start with /")]
    NoSlash,
    /// It has a query, a fragment, a space or a control byte.
    #[error("must be a plain path")]
    NotPlain,
    /// It has a `.` or `..` segment.
    #[error("must not contain . or .. segments")]
    DotSegment,
    /// It has a `;`.
    #[error("must not contain `;` (path parameters are ignored when matching)")]
    Semicolon,
    /// It cannot be read as one path.
    #[error("{0}")]
    BadPath(#[source] BadPath),
    /// It is not UTF-8 once decoded.
    #[error("is not UTF-8 once percent-decoded")]
    NotUtf8,
}

/// Prefix table: the longest matching prefix wins.
#[derive(Debug, Clone)]
pub struct RouteTable<T> {
    /// (canonical prefix, index into targets), longest prefix first.
    entries: Vec<(Vec<u8>, usize)>,
    targets: Vec<T>,
    fold_case: bool,
}

impl<T> Default for RouteTable<T> {
    fn default() -> Self {
        Self::new(true)
    }
}

impl<T> RouteTable<T> {
    /// An empty table; `fold_case` ignores ASCII case when matching.
    pub fn new(fold_case: bool) -> Self {
        if fold_case {
            canonical::prepare_folds();
        }
        Self {
            entries: Vec::new(),
            targets: Vec::new(),
            fold_case,
        }
    }

    #[cfg(any(test, feature = "gateway", fuzzing))]
    /// Adds a target reachable under each of `prefixes` (canonicalized here;
    /// a prefix that cannot be is skipped: the config loader refuses those).
    pub fn add(&mut self, prefixes: &[String], target: T) {
        let idx = self.targets.len();
        self.targets.push(target);
        for p in prefixes {
            if let Ok(c) = canonical_prefix(p, self.fold_case) {
                self.entries.push((c.into_bytes(), idx));
            }
        }
        self.entries
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
    }

    fn longest(&self, reading: &[u8]) -> Option<usize> {
        self.entries
            .iter()
            .find(|(prefix, _)| canonical::prefix_matches(prefix, reading, self.fold_case))
            .map(|(_, i)| *i)
    }

    /// The target of the longest prefix under which some reading of `path`
    /// falls; `Ambiguous` when readings fall under different targets.
    pub fn find(&self, path: &str) -> Result<Option<&T>, RouteError> {
        let mut found: Option<usize> = None;
        for reading in canonical::match_readings(path, self.fold_case)? {
            if let Some(i) = self.longest(&reading) {
                match found {
                    Some(j) if j != i => return Err(RouteError::Ambiguous),
                    _ => found = Some(i),
                }
            }
        }
        Ok(found.map(|i| &self.targets[i]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_checked_and_canonicalized() {
        assert_eq!(canonical_prefix("/a", true).unwrap(), "/a");
        assert_eq!(canonical_prefix("/A/", true).unwrap(), "/a");
        assert_eq!(canonical_prefix("/A/", false).unwrap(), "/A");
        assert_eq!(canonical_prefix("//a//b", true).unwrap(), "/a/b");
        assert_eq!(canonical_prefix("/%61", true).unwrap(), "/a");
        assert_eq!(canonical_prefix("/", true).unwrap(), "/");
        assert!(canonical_prefix("a", true).is_err());
        assert!(canonical_prefix("/a/../b", true).is_err());
        assert!(canonical_prefix("/a/%2e%2e/b", true).is_err());
        assert!(canonical_prefix("/a?x", true).is_err());
        assert!(canonical_prefix("/a;b", true).is_err());
        assert!(canonical_prefix("/a%00", true).is_err());
    }

    #[test]
    fn longest_prefix_wins_on_segment_boundaries() {
        let mut t = RouteTable::default();
        t.add(&["/a".into()], "a");
        t.add(&["/a/b".into(), "/c/".into()], "ab");
        assert_eq!(t.find("/a/x"), Ok(Some(&"a")));
        assert_eq!(t.find("/a/b"), Ok(Some(&"ab")));
        assert_eq!(t.find("/a/b/c"), Ok(Some(&"ab")));
        assert_eq!(t.find("/a/bc"), Ok(Some(&"a")));
        assert_eq!(t.find("/c"), Ok(Some(&"ab")));
        assert_eq!(t.find("/ab"), Ok(None));
        assert_eq!(t.find("/x"), Ok(None));
    }

    #[test]
    fn every_encoding_of_a_gated_path_is_gated() {
        let mut t = RouteTable::default();
        t.add(&["/maintenance".into()], "m");
        for p in [
            "/maintenance/x",
            "/%6daintenance/x",
            "/maintenance%2Fx",
            "//maintenance/x",
            "/MAINTENANCE/x",
            "/x/../maintenance/x",
            "/x/%2e%2e/maintenance",
            "/x/..%2Fmaintenance",
            "/x\\..\\maintenance",
            "/maintenance;v=1/x",
            "/x/..;/maintenance",
            "/./maintenance",
            "/maintenance/../x",
        ] {
            assert_eq!(t.find(p), Ok(Some(&"m")), "{p}");
        }
        assert_eq!(t.find("/maintenancex"), Ok(None));
        assert_eq!(t.find("/%256daintenance"), Ok(None), "decoded once");
        assert_eq!(
            t.find("/maintenance%00"),
            Err(RouteError::BadPath(BadPath::ControlByte))
        );
    }

    #[test]
    fn readings_under_different_routes_are_ambiguous() {
        let mut t = RouteTable::default();
        t.add(&["/a".into()], "a");
        t.add(&["/a/b".into()], "ab");
        assert_eq!(t.find("/a/b/../c"), Err(RouteError::Ambiguous));
        let mut case = RouteTable::new(false);
        case.add(&["/A".into()], "A");
        assert_eq!(case.find("/a"), Ok(None));
        assert_eq!(case.find("/%41"), Ok(Some(&"A")));
    }

    #[test]
    fn letters_a_router_folds_to_ascii_are_gated() {
        let mut t = RouteTable::default();
        t.add(&["/tasks".into()], "t");
        t.add(&["/maintenance".into()], "m");
        t.add(&["/staff".into()], "s");
        for p in [
            "/tas%E2%84%AAs/x",    // Kelvin sign, JavaScript toLowerCase
            "/ma%C4%B1ntenance/x", // dotless i, Python re.IGNORECASE
            "/MA%C4%B0NTENANCE",   // capital I with dot
            "/ta%C5%BFks",         // long s
        ] {
            assert!(matches!(t.find(p), Ok(Some(_))), "{p}");
        }
        assert_eq!(t.find("/%EF%AC%86aff"), Ok(Some(&"s")), "ligature st");
        assert_eq!(t.find("/sta%EF%AC%80"), Ok(Some(&"s")), "ligature ff");
        // Case-sensitive paths fold nothing, ASCII or not.
        let mut exact = RouteTable::new(false);
        exact.add(&["/tasks".into()], "t");
        assert_eq!(exact.find("/tas%E2%84%AAs"), Ok(None));
    }

    #[test]
    fn a_folded_reading_under_another_route_is_ambiguous() {
        let mut t = RouteTable::default();
        t.add(&["/a".into()], "a");
        t.add(&["/a/k".into()], "ak");
        assert_eq!(t.find("/a/%E2%84%AA"), Err(RouteError::Ambiguous));
        // A configured prefix is folded the same way, so it collides with
        // its ASCII twin (the config loader refuses the pair).
        assert_eq!(canonical_prefix("/%E2%84%AA", true).unwrap(), "/k");
        assert_eq!(canonical_prefix("/Stra%C3%9Fe", true).unwrap(), "/strasse");
        assert_eq!(canonical_prefix("/%E2%84%AA", false).unwrap(), "/\u{212A}");
    }

    #[test]
    fn a_decoded_query_or_fragment_ends_the_path_in_one_reading() {
        let mut t = RouteTable::default();
        t.add(&["/maintenance".into()], "m");
        assert_eq!(t.find("/maintenance%3Fx"), Ok(Some(&"m")));
        assert_eq!(t.find("/maintenance%23x"), Ok(Some(&"m")));
        assert_eq!(t.find("/maintenance%3f/../x"), Ok(Some(&"m")));
        assert_eq!(t.find("/maintenancex%3F"), Ok(None));
    }
}
