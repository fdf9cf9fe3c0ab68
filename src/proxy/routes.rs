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
