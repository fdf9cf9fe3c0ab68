//! Config parsing (`config::Config::parse`): arbitrary text never panics, and
//! an accepted config keeps its invariants.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolegate::fuzzing::headers::usable_key_header;
use rolegate::fuzzing::routes::canonical_prefix;
use rolegate::fuzzing::RouteTarget;
use rolegate::{Config, KeySource};

fn check_known() -> bool {
    // The findings this once skipped are fixed in src/: always checked.
    true
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let env = |name: &str| (name == "FUZZ").then(|| "fuzz-value".to_string());
    let parsed = Config::parse(text, "fuzz.yaml", &env);
    if std::env::var_os("ROLEGATE_FUZZ_DEBUG").is_some() {
        eprintln!("{:?}", parsed.as_ref().map(|c| &c.routes));
    }
    let config = match parsed {
        Ok(c) => c,
        Err(e) => {
            assert_eq!(e.file, "fuzz.yaml");
            let _ = e.to_string();
            // Without `${VAR}`, the environment is never consulted.
            if !text.contains('$') {
                assert_eq!(Config::parse(text, "fuzz.yaml", &|_| None).err(), Some(e));
            }
            return;
        }
    };
    let _ = Config::parse(text, "fuzz.yaml", &|_| None);
    let yaml = config.to_yaml();
    assert!(!yaml.starts_with("# cannot render"), "{yaml}");
    if let Some(secret) = &config.proxy.cluster_secret {
        // The secret is redacted: it occurs no more often than in the same
        // config rendered without a secret at all.
        if !secret.contains("redacted") && !secret.contains("cluster_secret") {
            let mut plain = config.clone();
            plain.proxy.cluster_secret = None;
            let without = plain.to_yaml();
            assert!(
                yaml.matches(secret.as_str()).count() <= without.matches(secret.as_str()).count(),
                "cluster secret in to_yaml()"
            );
        }
    }

    assert!(config.lease.check().is_ok());
    let fold = config.proxy.case_insensitive_paths;
    let mut seen = std::collections::HashSet::new();
    for r in &config.routes {
        assert!(!r.prefixes.is_empty());
        for p in &r.prefixes {
            assert!(p.starts_with('/'), "prefix {p:?}");
            // Prefixes are stored as written; the route table canonicalizes
            // them once (RouteTable::add), so each must canonicalize, and no
            // two may be equal once canonicalized (none is dropped or shared).
            let canon = canonical_prefix(p, fold);
            assert!(
                canon.is_ok(),
                "stored prefix {p:?} does not canonicalize: {canon:?}"
            );
            if check_known() {
                assert!(
                    seen.insert(canon.unwrap()),
                    "prefix {p:?} claimed twice once canonicalized"
                );
            }
        }
        match &r.target().expect("every read route has a target") {
            RouteTarget::Role(name) => {
                assert!(config.roles.iter().any(|x| &x.name == name));
            }
            RouteTarget::Partition { name, key, .. } => {
                assert!(config.partitions.iter().any(|x| &x.name == name));
                match key {
                    KeySource::Header(h) => {
                        assert!(http::HeaderName::from_bytes(h.as_bytes()).is_ok(), "{h:?}");
                        // Never a header the gateway removes or rewrites.
                        assert!(usable_key_header(h), "key header {h:?}");
                    }
                    KeySource::Query(q) => assert!(!q.is_empty()),
                    KeySource::PathSegment(n) => assert!((1..=1024).contains(n)),
                    KeySource::PathSegmentLast => {}
                    other => panic!("a key source this target does not check yet: {other:?}"),
                }
            }
        }
    }
    for p in &config.partitions {
        assert!(p.count >= 1 && p.count <= 65_536);
        assert!(p.lease().check().is_ok());
    }
    for r in &config.roles {
        assert!(r.lease().check().is_ok());
    }
    for u in &config.proxy.upgrades {
        assert_ne!(u, "h2c", "h2c accepted as an upgrade");
        assert_eq!(u, &u.to_ascii_lowercase());
    }
    if let Some(s) = &config.proxy.cluster_secret {
        assert!(s.len() >= 16);
    }
    if let Some(n) = &config.instance.name {
        assert!(
            !n.is_empty()
                && n.len() <= 64
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')),
            "instance name {n:?}"
        );
    }
});
