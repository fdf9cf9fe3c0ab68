//! Route-table fingerprints as members publish them with their presence
//! records: compact JSON, `{"fold":true,"routes":{"/orders":"9f3a2b10"}}`,
//! each canonical prefix with a short hash of what owns it (role, or
//! partition with its key source and scope). Two members route alike when
//! their fingerprints are equal; otherwise the prefixes that differ are named.

use std::collections::BTreeMap;

#[derive(serde::Deserialize, PartialEq)]
struct Fingerprint {
    fold: bool,
    routes: BTreeMap<String, String>,
}

/// How the route table `theirs` differs from `mine`, one phrase per
/// difference (empty when they agree, or when either side published none
/// or one this version cannot read).
pub fn route_differences(mine: &str, theirs: &str) -> Vec<String> {
    if mine.is_empty() || theirs.is_empty() || mine == theirs {
        return Vec::new();
    }
    let (Ok(a), Ok(b)) = (
        serde_json::from_str::<Fingerprint>(mine),
        serde_json::from_str::<Fingerprint>(theirs),
    ) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if a.fold != b.fold {
        out.push("case_insensitive_paths differs".to_string());
    }
    for (prefix, owner) in &a.routes {
        match b.routes.get(prefix) {
            None => out.push(format!("{prefix} is routed only here")),
            Some(o) if o != owner => out.push(format!("{prefix} has another owner, key or scope")),
            Some(_) => {}
        }
    }
    for prefix in b.routes.keys().filter(|p| !a.routes.contains_key(*p)) {
        out.push(format!("{prefix} is routed only there"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::route_differences;

    #[test]
    fn differing_prefixes_are_named_and_equal_tables_agree() {
        let a = r#"{"fold":true,"routes":{"/a":"1","/b":"2"}}"#;
        let b = r#"{"fold":false,"routes":{"/a":"1","/b":"3","/c":"4"}}"#;
        assert!(route_differences(a, a).is_empty());
        assert!(route_differences(a, "").is_empty());
        assert_eq!(
            route_differences(a, b),
            [
                "case_insensitive_paths differs",
                "/b has another owner, key or scope",
                "/c is routed only there"
            ]
        );
    }
}
