//! The route table: prefixes matched on path-segment boundaries, longest
//! first, on the raw path (nothing is percent-decoded, so `..` or `%2F`
//! tricks cannot move a request between routes).

/// Checks a configured prefix: starts with `/`, no query, no `..` segment.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    if !prefix.starts_with('/') {
        return Err(format!("prefix `{prefix}` must start with /"));
    }
    if prefix.contains(['?', '#'])
        || prefix
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err(format!("prefix `{prefix}` must be a plain path"));
    }
    if prefix.split('/').any(|s| s == "." || s == "..") {
        return Err(format!(
            "prefix `{prefix}` must not contain . or .. segments"
        ));
    }
    Ok(())
}

/// Drops a trailing `/` (except for `/` itself): `/a/` and `/a` are one prefix.
pub fn normalize_prefix(prefix: &str) -> String {
    let trimmed = prefix.trim_end_matches('/');
    if trimmed.is_empty() {
        "/".into()
    } else {
        trimmed.into()
    }
}

/// Whether `path` is under `prefix` on a segment boundary.
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return path.starts_with('/');
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_boundaries() {
        assert!(prefix_matches("/orders", "/orders"));
        assert!(prefix_matches("/orders", "/orders/7"));
        assert!(!prefix_matches("/orders", "/ordersx"));
        assert!(!prefix_matches("/orders", "/order"));
        assert!(prefix_matches("/", "/anything"));
        assert!(!prefix_matches("/a/b", "/a/%62"));
    }

    #[test]
    fn prefixes_are_checked_and_normalized() {
        assert!(check_prefix("/a").is_ok());
        assert!(check_prefix("a").is_err());
        assert!(check_prefix("/a/../b").is_err());
        assert!(check_prefix("/a?x").is_err());
        assert_eq!(normalize_prefix("/a/"), "/a");
        assert_eq!(normalize_prefix("/"), "/");
    }
}

/// Prefix table: the longest matching prefix wins.
#[derive(Debug, Clone)]
pub struct RouteTable<T> {
    /// (prefix, index into targets), longest prefix first.
    entries: Vec<(String, usize)>,
    targets: Vec<T>,
}

impl<T> Default for RouteTable<T> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            targets: Vec::new(),
        }
    }
}

impl<T> RouteTable<T> {
    /// Adds a target reachable under each of `prefixes`.
    pub fn add(&mut self, prefixes: &[String], target: T) {
        let idx = self.targets.len();
        self.targets.push(target);
        for p in prefixes {
            self.entries.push((normalize_prefix(p), idx));
        }
        self.entries
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
    }

    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// The target whose prefix is the longest match of the raw `path`.
    pub fn find(&self, path: &str) -> Option<&T> {
        self.entries
            .iter()
            .find(|(prefix, _)| prefix_matches(prefix, path))
            .map(|(_, i)| &self.targets[*i])
    }
}

#[cfg(test)]
mod table_tests {
    use super::*;

    #[test]
    fn longest_prefix_wins_on_segment_boundaries() {
        let mut t = RouteTable::default();
        t.add(&["/a".into()], "a");
        t.add(&["/a/b".into(), "/c/".into()], "ab");
        assert_eq!(t.find("/a/x"), Some(&"a"));
        assert_eq!(t.find("/a/b"), Some(&"ab"));
        assert_eq!(t.find("/a/b/c"), Some(&"ab"));
        assert_eq!(t.find("/a/bc"), Some(&"a"));
        assert_eq!(t.find("/c"), Some(&"ab"));
        assert_eq!(t.find("/ab"), None);
        assert_eq!(t.find("/a/%2e%2e/x"), Some(&"a"), "nothing is decoded");
        assert_eq!(t.find("/x/../a/b"), None, "dot segments are not resolved");
    }
}
