//! What members publish with their presence records, as compact JSON:
//! the route-table fingerprint of a gateway, `"fold":true,"routes":
//! {"/orders":"9f3a2b10"}` (each canonical prefix with a short hash of what
//! owns it: role, or partition with its key source and scope), and every
//! coordinator's partition definitions, `"partitions":{"devices":"count=…"}`.
//! Two members route alike when their route parts are equal; otherwise the
//! prefixes that differ are named. Balance spreads a partition only over
//! members that define it alike.

use std::collections::BTreeMap;

#[derive(serde::Deserialize, Default)]
struct Fingerprint {
    fold: Option<bool>,
    routes: Option<BTreeMap<String, String>>,
    #[serde(default)]
    partitions: BTreeMap<String, String>,
}

fn parse(payload: &str) -> Fingerprint {
    serde_json::from_str(payload).unwrap_or_default()
}

/// The presence payload of a coordinator: its route fingerprint (JSON, or
/// empty) with its partition definitions added.
pub(super) fn presence_payload(routes: &str, partitions: &[(&str, &str)]) -> String {
    let mut value = serde_json::from_str::<serde_json::Value>(routes)
        .ok()
        .filter(|v| v.is_object())
        .unwrap_or_else(|| serde_json::json!({}));
    let defs: serde_json::Map<String, serde_json::Value> = partitions
        .iter()
        .map(|(name, def)| (name.to_string(), serde_json::Value::from(*def)))
        .collect();
    if !defs.is_empty() {
        value["partitions"] = serde_json::Value::Object(defs);
    }
    if value.as_object().is_some_and(|o| o.is_empty()) {
        return String::new();
    }
    value.to_string()
}

/// Whether a payload carries a route table with at least one route.
pub(super) fn has_routes(payload: &str) -> bool {
    parse(payload).routes.is_some_and(|r| !r.is_empty())
}

/// The definition of `partition` a member published, if any.
pub(super) fn published_definition(payload: &str, partition: &str) -> Option<String> {
    parse(payload).partitions.remove(partition)
}

/// How the route table `theirs` differs from `mine`, one phrase per
/// difference (empty when they agree, or when either side published none
/// or one this version cannot read).
pub fn route_differences(mine: &str, theirs: &str) -> Vec<String> {
    if mine == theirs {
        return Vec::new();
    }
    let (a, b) = (parse(mine), parse(theirs));
    let (Some(ra), Some(rb)) = (&a.routes, &b.routes) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if a.fold != b.fold {
        out.push("case_insensitive_paths differs".to_string());
    }
    for (prefix, owner) in ra {
        match rb.get(prefix) {
            None => out.push(format!("{prefix} is routed only here")),
            Some(o) if o != owner => out.push(format!("{prefix} has another owner, key or scope")),
            Some(_) => {}
        }
    }
    for prefix in rb.keys().filter(|p| !ra.contains_key(*p)) {
        out.push(format!("{prefix} is routed only there"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{presence_payload, published_definition, route_differences};

    #[test]
    fn the_payload_carries_routes_and_definitions_and_either_alone_reads() {
        let routes = r#"{"fold":true,"routes":{"/a":"1"}}"#;
        let both = presence_payload(routes, &[("devices", "count=12")]);
        assert_eq!(
            published_definition(&both, "devices").as_deref(),
            Some("count=12")
        );
        assert_eq!(published_definition(&both, "other"), None);
        assert!(route_differences(routes, &both).is_empty());
        let library = presence_payload("", &[("devices", "count=16")]);
        assert!(
            route_differences(routes, &library).is_empty(),
            "no routes: nothing to compare"
        );
        assert_eq!(presence_payload("", &[]), "");
    }

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
