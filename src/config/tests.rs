//! Unit tests of the config loader: every refusal names its key.

use std::time::Duration;

use super::*;
use crate::value::expand_env;

fn env(name: &str) -> Option<String> {
    match name {
        "DB" => Some("postgres://x@127.0.0.1/db".into()),
        "SECRET" => Some("0123456789abcdef0123".into()),
        "HOME_X" => Some("home".into()),
        _ => None,
    }
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, "test.yaml", &env)
}

fn refused(text: &str) -> ConfigError {
    match parse(text) {
        Ok(c) => panic!("expected a refusal, got {c:?}"),
        Err(e) => e,
    }
}

#[test]
fn empty_file_gives_defaults() {
    let c = parse("{}").unwrap();
    assert_eq!(c.store.kind, StoreKind::Sqlite);
    assert_eq!(c.lease, LeaseTimings::default());
    assert_eq!(c.listen.port(), 8080);
    assert_eq!(c.shutdown.drain_timeout, Duration::from_secs(10));
    assert_eq!(c.retry_after_secs(), 5);
}

#[test]
fn env_vars_expand_in_string_values() {
    let c = parse("store:\n  kind: postgres\n  url: ${DB}\nproxy:\n  cluster_secret: ${SECRET}\n")
        .unwrap();
    assert_eq!(c.store.url, "postgres://x@127.0.0.1/db");
    assert_eq!(
        c.proxy.cluster_secret.as_deref(),
        Some("0123456789abcdef0123")
    );
    assert_eq!(expand_env("a$$b", &env).unwrap(), "a$b");
}

#[test]
fn unset_env_var_is_refused_with_line_and_key() {
    let e = refused("listen: 0.0.0.0:1\nstore:\n  kind: postgres\n  url: ${NOPE}\n");
    assert_eq!(e.line, Some(4));
    assert_eq!(e.key, "store.url");
    assert!(e.message.contains("NOPE"), "{e}");
    assert!(e.to_string().starts_with("test.yaml:4: store.url:"), "{e}");
}

#[test]
fn unknown_key_is_refused_with_its_full_dotted_path() {
    let e = refused("lease:\n  duration: 15s\n  renew_interal: 5s\n");
    assert_eq!(e.key, "lease.renew_interal", "{e}");
    assert!(e.message.contains("expected one of"), "{e}");
    assert_eq!(e.line, Some(3), "{e}");
}

#[test]
fn a_duration_past_a_year_is_refused_not_added_to_a_clock() {
    let e = refused("proxy:\n  idle_timeout: 300000000000y\n");
    assert_eq!(e.key, "proxy.idle_timeout", "{e}");
    assert_eq!(e.line, Some(2), "{e}");
    assert!(e.message.contains("longer than a year"), "{e}");
    assert!(parse("shutdown:\n  drain_timeout: 365days\n").is_ok());
}

#[test]
fn an_unknown_key_is_named_in_the_message_too() {
    // `value` is the one name the path cannot show (a located value is read
    // as a map holding it under `value`): the message names it.
    let e = refused("proxy:\n  value: 1\n");
    assert!(e.message.starts_with("unknown key `value`"), "{e}");
    assert_eq!(e.line, Some(2), "{e}");
}

#[test]
fn the_roles_of_one_file_are_bounded() {
    let mut text = String::from("partitions:\n");
    for i in 0..5 {
        text.push_str(&format!("  - name: p{i}\n    count: 65536\n"));
    }
    let e = refused(&text);
    assert_eq!(e.key, "partitions[4].count", "{e}");
    assert!(e.message.contains("262144"), "{e}");
}

#[test]
fn a_dollar_in_a_value_survives_print_and_read() {
    let c =
        parse("upstream:\n  url: http://127.0.0.1:1\n  health:\n    path: /a$${HOME_X}${HOME_X}\n")
            .unwrap();
    let path = |c: &Config| {
        c.upstream
            .as_ref()
            .unwrap()
            .health
            .as_ref()
            .unwrap()
            .path
            .clone()
    };
    assert_eq!(path(&c), "/a${HOME_X}home");
    // Printed, the computed `retry_after` is written out; all else reads back.
    let again = parse(&c.to_yaml()).unwrap();
    assert_eq!(again.upstream, c.upstream);
    assert_eq!(again.to_yaml(), c.to_yaml());
}

#[test]
fn route_to_undeclared_role_is_refused() {
    let e = refused("roles:\n  - name: a\nroutes:\n  - prefixes: [/x]\n    role: b\n");
    assert_eq!(e.key, "routes[0].role");
    assert_eq!(e.line, Some(5));
}

#[test]
fn route_to_undeclared_partition_is_refused() {
    let e = refused("routes:\n  - prefixes: [/x]\n    partition: p\n    key: {header: X-Id}\n");
    assert_eq!(e.key, "routes[0].partition");
}

#[test]
fn duplicate_role_is_refused() {
    let e = refused("roles:\n  - name: a\n  - name: a\n");
    assert_eq!(e.line, Some(3));
    assert!(e.message.contains("twice"));
}

#[test]
fn role_equal_to_generated_partition_role_is_refused() {
    let e = refused("roles:\n  - name: p:partition-1\npartitions:\n  - name: p\n    count: 4\n");
    assert!(e.message.contains("p:partition-1"), "{e}");
    assert_eq!(e.line, Some(4));
}

#[test]
fn prefix_claimed_twice_is_refused() {
    let e = refused(
        "roles:\n  - name: a\n  - name: b\nroutes:\n  - prefixes: [/x]\n    role: a\n  - prefixes: [/y, /x/]\n    role: b\n",
    );
    assert_eq!(e.key, "routes[1].prefixes[1]");
    assert!(e.message.contains("routes[0]"));
}

#[test]
fn timing_rule_is_enforced_globally_and_per_role() {
    let e = refused("lease:\n  duration: 5s\n  renew_interval: 3s\n  safety_margin: 2s\n");
    assert_eq!(e.key, "lease");
    let e = refused("roles:\n  - name: a\n    duration: 6s\n");
    assert_eq!(e.key, "roles[0]");
    assert_eq!(e.line, Some(3));
    assert!(refused("lease:\n  safety_margin: 0s\n")
        .message
        .contains("safety_margin"));
    assert!(refused("lease:\n  duration: 2d\n").message.contains("24h"));
    let c = parse("roles:\n  - name: a\n    duration: 30s\n    renew_interval: 10s\n").unwrap();
    assert_eq!(c.roles[0].duration, Duration::from_secs(30));
    assert_eq!(c.roles[0].safety_margin, Duration::from_secs(2));
}

#[test]
fn bad_duration_is_refused() {
    let e = refused("lease:\n  duration: fifteen\n");
    assert_eq!(e.key, "lease.duration");
    assert_eq!(e.line, Some(2));
}

#[test]
fn long_names_are_refused_including_generated_ones() {
    let long = "a".repeat(129);
    let e = refused(&format!("roles:\n  - name: {long}\n"));
    assert!(e.message.contains("128"), "{e}");
    let name = "b".repeat(115); // 115 + ":partition-10" = 128 is fine, "-100" is not
    assert!(parse(&format!("partitions:\n  - name: {name}\n    count: 11\n")).is_ok());
    let e = refused(&format!("partitions:\n  - name: {name}\n    count: 101\n"));
    assert!(e.message.contains("generated"), "{e}");
    let e = refused("roles:\n  - name: 'bad name'\n");
    assert!(e.message.contains("A-Za-z0-9"), "{e}");
}

#[test]
fn partition_count_bounds() {
    assert_eq!(
        refused("partitions:\n  - name: p\n    count: 0\n").key,
        "partitions[0].count"
    );
    assert_eq!(
        refused("partitions:\n  - name: p\n    count: 65537\n").key,
        "partitions[0].count"
    );
    assert!(parse("partitions:\n  - name: p\n    count: 65536\n").is_ok());
}

#[test]
fn keys_parse_in_all_forms() {
    let c = parse(
        "partitions:\n  - name: p\n    count: 4\nroutes:\n  - prefixes: [/a]\n    partition: p\n    key: {header: X-Id}\n  - prefixes: [/b]\n    partition: p\n    key: {query: id}\n  - prefixes: [/c]\n    partition: p\n    key: {path_segment: 2}\n  - prefixes: [/d]\n    partition: p\n    scope: Order\n    key: {path_segment: last}\n",
    )
    .unwrap();
    let keys: Vec<_> = c
        .routes
        .iter()
        .map(|r| match &r.target().unwrap() {
            RouteTarget::Partition { key, .. } => key.clone(),
            _ => panic!(),
        })
        .collect();
    assert_eq!(
        keys,
        vec![
            KeySource::Header("x-id".into()),
            KeySource::Query("id".into()),
            KeySource::PathSegment(2),
            KeySource::PathSegmentLast
        ]
    );
    let e = refused(
        "partitions:\n  - name: p\n    count: 4\nroutes:\n  - prefixes: [/a]\n    partition: p\n",
    );
    assert_eq!(e.key, "routes[0].key");
    let e = refused("partitions:\n  - name: p\n    count: 4\nroutes:\n  - prefixes: [/a]\n    partition: p\n    key: {path_segment: first}\n");
    assert_eq!(e.key, "routes[0].key.path_segment");
}

#[test]
fn bad_listen_and_upstream_are_refused() {
    assert_eq!(refused("listen: nowhere\n").key, "listen");
    assert_eq!(refused("upstream:\n  url: ftp://x\n").key, "upstream.url");
    let q = refused("upstream:\n  url: http://127.0.0.1:8080/api?v=2\n");
    assert_eq!(q.key, "upstream.url");
    assert!(q.to_string().contains("has a query"), "{q}");
    let q = refused("instance:\n  name: a\n  advertise: http://10.0.0.1:8080/?x\n");
    assert_eq!(q.key, "instance.advertise");
    let f = refused("upstream:\n  url: http://127.0.0.1:8080/api#v2\n");
    assert_eq!(f.key, "upstream.url");
    assert!(f.to_string().contains("has a fragment"), "{f}");
    let f = refused("instance:\n  name: a\n  advertise: http://10.0.0.1:8080#x\n");
    assert_eq!(f.key, "instance.advertise");
    assert_eq!(refused("store:\n  kind: mongo\n").key, "store.kind");
    assert_eq!(refused("store:\n  kind: postgres\n").key, "store.url");
}

#[test]
fn yaml_syntax_error_names_the_line() {
    let e = refused("roles:\n  - name: a\n   bad: [\n");
    assert!(e.line.is_some(), "{e}");
}

#[test]
fn secret_is_redacted_when_printed() {
    let c = parse("proxy:\n  cluster_secret: ${SECRET}\n").unwrap();
    let y = c.to_yaml();
    assert!(y.contains("${ROLEGATE_CLUSTER_SECRET}"), "{y}");
    assert!(!y.contains("0123456789abcdef"), "{y}");
}

/// What `check-config --print` writes is a config: read again, it resolves
/// to the same thing (secrets come back from the variables it names).
#[test]
fn printed_config_reads_back_to_the_same_config() {
    let example = include_str!("../../config.example.yaml");
    for text in [
        example,
        "{}",
        "proxy:\n  cluster_secret: ${SECRET}\n  retry_after: 7\n  trusted_proxies: [10.0.0.0/8]\nstore:\n  kind: etcd\n  url: http://127.0.0.1:2379\n  username: u\n  password: p\n",
    ] {
        let first = parse(text).unwrap();
        let printed = first.to_yaml();
        let env = |name: &str| match name {
            "ROLEGATE_CLUSTER_SECRET" => Some("0123456789abcdef0123".to_string()),
            "ROLEGATE_STORE_PASSWORD" => Some("p".to_string()),
            other => env(other),
        };
        let again = Config::parse(&printed, "printed.yaml", &env)
            .unwrap_or_else(|e| panic!("printed config refused: {e}\n{printed}"));
        let mut expected = first.clone();
        // `retry_after` is printed as the value in force.
        expected.proxy.retry_after = Some(first.retry_after_secs());
        assert_eq!(again, expected, "{printed}");
        assert!(!printed.contains("target:"), "{printed}");
    }
}

#[test]
fn proxy_hardening_keys_parse_with_defaults() {
    let c = parse("").unwrap();
    assert_eq!(c.proxy.idle_timeout, Duration::from_secs(300));
    assert!(c.proxy.case_insensitive_paths);
    assert_eq!(c.proxy.upgrades, vec!["websocket".to_string()]);
    assert!(c.proxy.trusted_proxies.is_empty());
    assert_eq!(c.proxy.max_connections, 10_000);
    let c = parse(
        "proxy:\n  idle_timeout: 2s\n  case_insensitive_paths: false\n  upgrades: [WebSocket, foo]\n  trusted_proxies: [10.0.0.0/8, ::1]\n  max_connections: 5\n",
    )
    .unwrap();
    assert_eq!(c.proxy.idle_timeout, Duration::from_secs(2));
    assert!(!c.proxy.case_insensitive_paths);
    assert_eq!(
        c.proxy.upgrades,
        vec!["websocket".to_string(), "foo".to_string()]
    );
    assert_eq!(c.proxy.trusted_proxies.len(), 2);
    assert_eq!(c.proxy.max_connections, 5);
    assert!(c.to_yaml().contains("10.0.0.0/8"));
}

#[test]
fn unsafe_or_bad_proxy_values_are_refused_with_their_key() {
    let e = refused("proxy:\n  upgrades: [websocket, h2c]\n");
    assert_eq!(e.key, "proxy.upgrades[1]");
    assert!(e.message.contains("h2c"), "{e}");
    let e = refused("proxy:\n  trusted_proxies: [10.0.0.0/99]\n");
    assert_eq!(e.key, "proxy.trusted_proxies[0]");
    let e = refused("proxy:\n  max_connections: 0\n");
    assert_eq!(e.key, "proxy.max_connections");
    let e = refused("proxy:\n  idle_timeout: 0s\n");
    assert_eq!(e.key, "proxy.idle_timeout");
}

#[test]
fn prefixes_colliding_once_canonicalized_are_refused() {
    let e = refused(
        "roles:\n  - name: a\n  - name: b\nroutes:\n  - prefixes: [/Maintenance]\n    role: a\n  - prefixes: [//maintenance/]\n    role: b\n",
    );
    assert_eq!(e.key, "routes[1].prefixes[0]");
    assert!(e.message.contains("/maintenance"), "{e}");
    let ok = parse(
        "proxy:\n  case_insensitive_paths: false\nroles:\n  - name: a\n  - name: b\nroutes:\n  - prefixes: [/Maintenance]\n    role: a\n  - prefixes: [/maintenance]\n    role: b\n",
    );
    assert!(ok.is_ok(), "case-sensitive prefixes do not collide");
    let e = refused("roles:\n  - name: a\nroutes:\n  - prefixes: [/a;b]\n    role: a\n");
    assert_eq!(e.key, "routes[0].prefixes[0]");
}

#[test]
fn key_headers_the_gateway_rewrites_are_refused() {
    for h in [
        "Connection",
        "X-Forwarded-For",
        "Forwarded",
        "Host",
        "X-Rolegate-Token",
        "X_Device",
        "TE",
        "True-Client-IP",
    ] {
        let e = refused(&format!(
            "partitions:\n  - name: p\n    count: 4\nroutes:\n  - prefixes: [/a]\n    partition: p\n    key: {{header: {h}}}\n"
        ));
        assert_eq!(e.key, "routes[0].key.header", "{h}");
    }
}

#[test]
fn prefixes_are_decoded_once_not_twice() {
    let c =
        parse("roles:\n  - name: a\nroutes:\n  - prefixes: [/%2541dmin]\n    role: a\n").unwrap();
    let mut t = crate::proxy::routes::RouteTable::new(true);
    t.add(&c.routes[0].prefixes, "a");
    assert_eq!(
        t.find("/%2541dmin"),
        Ok(Some(&"a")),
        "the path the prefix describes"
    );
    assert_eq!(t.find("/admin"), Ok(None), "not a second decoding of it");
    // Dot segments hidden behind an encoded `%` stay literal, never dropped.
    let c = parse("roles:\n  - name: a\nroutes:\n  - prefixes: [/%252e%252e/x]\n    role: a\n")
        .unwrap();
    let mut t = crate::proxy::routes::RouteTable::new(true);
    t.add(&c.routes[0].prefixes, "a");
    assert_eq!(t.find("/%252e%252e/x"), Ok(Some(&"a")));
}

#[test]
fn url_secrets_are_redacted_when_printed() {
    let c = parse(
        "store:\n  kind: postgres\n  url: postgres://app:hunter2@db/app?password=hunter3&sslmode=require\nupstream:\n  url: http://u:hunter4@127.0.0.1:3000\n",
    )
    .unwrap();
    let y = c.to_yaml();
    for secret in ["hunter2", "hunter3", "hunter4"] {
        assert!(!y.contains(secret), "{secret} in {y}");
    }
    assert!(y.contains("sslmode=require"), "{y}");
}

#[test]
fn unknown_keys_are_named_by_their_path_in_lists_and_nested_maps() {
    let e = refused("upstream:\n  url: http://127.0.0.1:3000\n  timeout: 3s\n");
    assert_eq!(e.key, "upstream.timeout", "{e}");
    assert_eq!(e.line, Some(3), "{e}");
    let e = refused(
        "upstream:\n  url: http://127.0.0.1:3000\n  health:\n    path: /h\n    every: 2s\n",
    );
    assert_eq!(e.key, "upstream.health.every", "{e}");
    let yaml = "roles:\n  - name: a\npartitions:\n  - name: p\n    count: 2\nroutes:\n  - prefixes: [/a]\n    role: a\n  - prefixes: [/p]\n    partition: p\n    key:\n      header: x-id\n      hedaer: y\n";
    let e = refused(yaml);
    assert_eq!(e.key, "routes[1].key.hedaer", "{e}");
    let yaml = "roles:\n- name: a\n- name: b\n  duraton: 5s\n";
    let e = refused(yaml);
    assert_eq!(e.key, "roles[1].duraton", "{e}");
}

#[test]
fn a_store_kind_not_built_into_the_binary_is_refused_by_the_config() {
    let without_redis = |k: StoreKind| k != StoreKind::Redis;
    let text = "store:\n  kind: redis\n  url: redis://127.0.0.1:6379\n";
    let e = Config::parse_built(text, "t.yaml", &env, without_redis).unwrap_err();
    assert_eq!(e.key, "store.kind", "{e}");
    assert_eq!(e.line, Some(2), "{e}");
    assert!(e.message.contains("not built into this binary"), "{e}");
    assert!(Config::parse_built(text, "t.yaml", &env, |_| true).is_ok());
}

fn parse_any_store(text: &str) -> Result<Config, ConfigError> {
    Config::parse_built(text, "t.yaml", &env, |_| true)
}

fn store_yaml(kind: &str, url: &str, tls: &str) -> String {
    format!("store:\n  kind: {kind}\n  url: \"{url}\"\n{tls}")
}

#[test]
fn store_tls_keys_parse_for_rediss_and_https_etcd() {
    let tls = "  tls:\n    ca_file: /etc/rolegate/store-ca.pem\n    cert_file: /c.pem\n    key_file: /k.pem\n";
    let c = parse_any_store(&store_yaml("redis", "rediss://cache:6380", tls)).unwrap();
    let t = c.store.tls.expect("store.tls");
    assert_eq!(
        t.ca_file.as_deref(),
        Some(std::path::Path::new("/etc/rolegate/store-ca.pem"))
    );
    let client = t.client_cert.expect("client certificate");
    assert_eq!(client.cert_file, std::path::Path::new("/c.pem"));
    assert_eq!(client.key_file, std::path::Path::new("/k.pem"));
    let eps = "https://10.0.0.1:2379,https://10.0.0.2:2379";
    let tls = "  tls:\n    ca_file: /ca.pem\n    cert_file: null\n    key_file: null\n";
    let c = parse_any_store(&store_yaml("etcd", eps, tls)).unwrap();
    assert_eq!(c.store.tls.unwrap().client_cert, None);
}

#[test]
fn store_tls_is_refused_where_it_would_not_be_used() {
    let tls = "  tls:\n    ca_file: /ca.pem\n";
    let cases = [
        ("postgres", "postgres://u@db/app", "sslmode"),
        ("sqlite", "sqlite://x.db", "etcd (https://) stores only"),
        ("memory", "memory://", "no network connection"),
        ("redis", "redis://cache:6379", "rediss://"),
        ("etcd", "http://10.0.0.1:2379", "https://"),
    ];
    for (kind, url, says) in cases {
        let e = parse_any_store(&store_yaml(kind, url, tls)).unwrap_err();
        assert_eq!(e.key, "store.tls", "{kind}: {e}");
        // The line of the block's first key.
        assert_eq!(e.line, Some(5), "{kind}: {e}");
        assert!(e.message.contains(says), "{kind}: {e}");
    }
    let e = parse_any_store(&store_yaml("postgres", "postgres://u@db/app", tls)).unwrap_err();
    for param in ["sslrootcert", "sslcert", "sslkey", "store.url"] {
        assert!(e.message.contains(param), "{e}");
    }
}

#[test]
fn a_client_certificate_without_its_key_is_refused() {
    for (tls, missing) in [
        ("  tls:\n    cert_file: /c.pem\n", "set key_file too"),
        ("  tls:\n    key_file: /k.pem\n", "set cert_file too"),
    ] {
        let e = parse_any_store(&store_yaml("redis", "rediss://cache:6380", tls)).unwrap_err();
        assert_eq!(e.key, "store.tls", "{e}");
        assert!(e.message.contains("go together"), "{e}");
        assert!(e.message.contains(missing), "{e}");
    }
}

#[test]
fn unsafe_or_unknown_store_tls_urls_are_refused() {
    let cases = [
        ("redis", "rediss://cache:6380/#insecure", "#insecure"),
        // The url parser reads schemes and fragments in any case.
        ("redis", "Rediss://cache:6380/#INSECURE", "#insecure"),
        (
            "etcd",
            "https://10.0.0.1:2379,http://10.0.0.2:2379",
            "all https:// or all http://",
        ),
        (
            "postgres",
            "postgres://u@db/app?sslmode=verify_full",
            "unknown sslmode `verify_full`",
        ),
        (
            "postgres",
            "postgres://u@db/app?sslmode=allow",
            "`allow` is not supported",
        ),
        (
            "postgres",
            "postgres://u@db/app?sslmode=require&sslcert=/c.pem",
            "sslcert and sslkey",
        ),
    ];
    for (kind, url, says) in cases {
        let e = parse_any_store(&store_yaml(kind, url, "")).unwrap_err();
        assert_eq!(e.key, "store.url", "{url}: {e}");
        assert_eq!(e.line, Some(3), "{url}: {e}");
        assert!(e.message.contains(says), "{url}: {e}");
    }
    for mode in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
        let url = format!("postgres://u@db/app?sslmode={mode}");
        assert!(
            parse_any_store(&store_yaml("postgres", &url, "")).is_ok(),
            "{mode}"
        );
    }
}

#[test]
fn printed_config_keeps_store_tls_settings() {
    let url = "postgres://app:pw@db/app?sslmode=verify-full&sslrootcert=/etc/pg/ca.pem&sslcert=/etc/pg/c.pem&sslkey=/etc/pg/k.pem";
    let c = parse_any_store(&store_yaml("postgres", url, "")).unwrap();
    let printed = c.to_yaml();
    let expected = "postgres://app:<redacted>@db/app?sslmode=verify-full&sslrootcert=/etc/pg/ca.pem&sslcert=/etc/pg/c.pem&sslkey=/etc/pg/k.pem";
    assert!(printed.contains(expected), "{printed}");
    let tls = "  tls:\n    ca_file: /ca.pem\n    cert_file: /c.pem\n    key_file: /k.pem\n";
    let c = parse_any_store(&store_yaml("redis", "rediss://cache:6380", tls)).unwrap();
    let again = parse_any_store(&c.to_yaml()).expect("printed config reads back");
    assert_eq!(again.store, c.store);
}

#[test]
fn a_store_url_of_another_kind_is_refused() {
    for (kind, url) in [
        ("postgres", "mysql://app@db/app"),
        ("postgres", "redis://db:6379"),
        ("sqlite", "postgres://app@db/app"),
        ("redis", "postgres://app@db/app"),
        ("etcd", "redis://10.0.0.1:2379"),
        ("etcd", "http://10.0.0.1:2379,mysql://10.0.0.2:2379"),
    ] {
        let e = refused(&format!("store:\n  kind: {kind}\n  url: {url}\n"));
        assert_eq!(
            (e.key.as_str(), e.line),
            ("store.url", Some(3)),
            "{kind} {url}: {e}"
        );
        assert!(
            e.message.contains(&format!("store.kind {kind}")) || kind == "etcd",
            "{e}"
        );
    }
    for (kind, url) in [
        ("postgres", "postgres://app@db/app"),
        ("postgres", "POSTGRESQL://app@db/app"),
        ("sqlite", "sqlite://rolegate.db"),
        ("sqlite", "sqlite::memory:"),
        ("redis", "rediss://:pw@cache:6380"),
        ("etcd", "10.0.0.1:2379,10.0.0.2:2379"),
        ("etcd", "https://10.0.0.1:2379,https://10.0.0.2:2379"),
    ] {
        let c = parse(&format!("store:\n  kind: {kind}\n  url: '{url}'\n"));
        assert!(c.is_ok(), "{kind} {url}: {c:?}");
    }
}

#[test]
fn listen_and_admin_listen_on_the_same_port_are_refused() {
    for (listen, admin) in [
        ("127.0.0.1:8080", "127.0.0.1:8080"),
        ("0.0.0.0:8080", "127.0.0.1:8080"),
        ("127.0.0.1:9090", "[::]:9090"),
    ] {
        let e = refused(&format!("listen: '{listen}'\nadmin_listen: '{admin}'\n"));
        assert_eq!(e.key, "admin_listen", "{e}");
        assert!(e.message.contains("same port"), "{e}");
    }
    assert!(parse("listen: 127.0.0.1:8080\nadmin_listen: 10.0.0.1:8080\n").is_ok());
    assert!(parse("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\n").is_ok());
}

#[test]
fn hold_timeout_and_handover_drain_are_bounded() {
    assert_eq!(
        refused("proxy:\n  hold_timeout: 2h\n").key,
        "proxy.hold_timeout"
    );
    assert_eq!(
        refused("partitions:\n  - name: p\n    count: 2\n    handover_drain: 2h\n").key,
        "partitions[0].handover_drain"
    );
}

#[test]
fn a_default_taken_from_another_key_follows_it_unless_the_key_is_set() {
    let c = parse(
        "lease:\n  duration: 30s\n  renew_interval: 4s\nroles:\n  - name: a\n    safety_margin: 3s\n  - name: b\n    duration: 0s\n    renew_interval: 1s\n    safety_margin: 0s\npartitions:\n  - name: p\n    count: 2\n    renew_interval: 3s\nproxy:\n  max_connections: 7\n",
    );
    // `b` sets an impossible zero duration on purpose: a key that is set is
    // never replaced by the inherited value.
    let e = c.unwrap_err();
    assert_eq!((e.key.as_str(), e.line), ("roles[1]", Some(8)), "{e}");
    let c = parse(
        "lease:\n  duration: 30s\n  renew_interval: 4s\nroles:\n  - name: a\n    safety_margin: 3s\npartitions:\n  - name: p\n    count: 2\n    renew_interval: 3s\n  - name: q\n    count: 1\n    rebalance_delay: 1s\n    handover_drain: 2s\nproxy:\n  max_connections: 7\n",
    )
    .unwrap();
    let a = &c.roles[0];
    assert_eq!(
        (a.duration, a.renew_interval, a.safety_margin),
        (
            Duration::from_secs(30),
            Duration::from_secs(4),
            Duration::from_secs(3)
        )
    );
    let p = &c.partitions[0];
    assert_eq!(p.duration, Duration::from_secs(30));
    assert_eq!(
        p.rebalance_delay,
        Duration::from_secs(6),
        "2 × its renew_interval"
    );
    assert_eq!(
        p.handover_drain,
        Duration::from_secs(3),
        "its renew_interval"
    );
    let q = &c.partitions[1];
    assert_eq!(
        (q.rebalance_delay, q.handover_drain),
        (Duration::from_secs(1), Duration::from_secs(2))
    );
    assert_eq!(c.proxy.max_held, 7, "max_held follows max_connections");
    let c = parse("proxy:\n  max_connections: 7\n  max_held: 0\n").unwrap();
    assert_eq!(c.proxy.max_held, 0, "a max_held that is set stays");
}

#[test]
fn the_key_table_knows_every_key_and_its_line() {
    let keys = super::file::Locations::read(
        "proxy:\n  max_held: 5\nroutes:\n  - prefixes: [/a, /b]\n    key: {header: x}\n1: odd\n",
        "t.yaml",
    )
    .unwrap();
    assert_eq!(keys.line("proxy.max_held"), Some(2));
    assert_eq!(keys.line("routes[0].prefixes[1]"), Some(4));
    assert_eq!(keys.line("routes[0].key.header"), Some(5));
    assert!(keys.has("routes[0].key") && keys.has("1"));
    assert!(!keys.has("proxy.max_connections"));
    assert!(super::file::Locations::read(": : [", "t.yaml").is_err());
    assert!(!super::file::Locations::read("", "t.yaml")
        .unwrap()
        .has("proxy"));
}

#[test]
fn a_handover_drain_taken_from_renew_interval_is_bounded_too() {
    let e = refused(
        "partitions:\n  - name: p\n    count: 2\n    duration: 5h\n    renew_interval: 2h\n",
    );
    assert_eq!(
        (e.key.as_str(), e.line),
        ("partitions[0].handover_drain", Some(5)),
        "{e}"
    );
}

#[test]
fn an_empty_section_is_its_defaults_and_an_empty_value_is_refused_plainly() {
    let c = parse("store:\nproxy:\n  http2:\nroles:\n").unwrap();
    assert_eq!(c.store, StoreConfig::default());
    assert_eq!(c.proxy, ProxyConfig::default());
    assert!(c.roles.is_empty());
    for (text, key) in [
        ("listen:\n", "listen"),
        ("proxy:\n  connect_timeout:\n", "proxy.connect_timeout"),
        ("proxy:\n  max_connections:\n", "proxy.max_connections"),
        ("proxy:\n  upgrades: ~\n", "proxy.upgrades"),
    ] {
        let e = refused(text);
        assert_eq!(e.key, key, "{e}");
        assert!(e.message.contains("has no value"), "{e}");
    }
}

#[test]
fn variable_names_are_looked_up_only_when_well_formed() {
    let asked = std::cell::Cell::new(0usize);
    let env = |name: &str| {
        asked.set(asked.get() + name.len());
        None
    };
    // Thousands of `${` with one `}` at the end: no name is looked up, where
    // taking every `${...}` span as a name would look up megabytes of them.
    let text = format!("# {}}}\nlisten: 0.0.0.0:1\n", "${".repeat(5000));
    assert!(Config::parse(&text, "t.yaml", &env).is_ok());
    assert_eq!(asked.get(), 0);
}

#[test]
fn a_value_only_a_declared_type_reads_does_not_hide_the_keys_set() {
    // `.inf` is a float to an untyped reader, text to the name's.
    let c = parse(
        "instance: {name: .inf}\nroles: [{name: b, duration: 60s, renew_interval: 20s, safety_margin: 5s}]\nproxy: {max_held: 0}\n",
    )
    .unwrap();
    assert_eq!(c.roles[0].duration, Duration::from_secs(60));
    assert_eq!(c.proxy.max_held, 0);
}

#[test]
fn an_empty_key_whose_default_depends_on_another_reads_as_unset() {
    // As the documented example file writes them.
    let c = parse(
        "instance:\n  name: null\n  advertise: null\nlease:\n  renew_interval: 4s\nroles:\n  - name: a\n    duration: ~\npartitions:\n  - name: p\n    count: 2\n    handover_drain:\n    rebalance_delay: null\nproxy:\n  retry_after: null\n  max_connections: 7\n  max_held: null\n",
    )
    .unwrap();
    assert_eq!((c.instance.name, c.instance.advertise), (None, None));
    assert_eq!(c.roles[0].duration, LeaseTimings::default().duration);
    let p = &c.partitions[0];
    assert_eq!(
        (p.handover_drain, p.rebalance_delay),
        (Duration::from_secs(4), Duration::from_secs(8))
    );
    assert_eq!((c.proxy.retry_after, c.proxy.max_held), (None, 7));
}

#[test]
fn per_role_metrics_over_a_few_thousand_partition_roles_is_warned_about() {
    let text = |on: bool, count: u32| {
        format!("telemetry:\n  per_role_metrics: {on}\npartitions:\n  - name: tenants\n    count: {count}\n")
    };
    let warned = parse(&text(true, 8192)).unwrap().per_role_series_warning();
    assert!(
        warned
            .as_deref()
            .is_some_and(|w| w.contains("8192 partition roles")),
        "{warned:?}"
    );
    assert_eq!(
        parse(&text(false, 65536))
            .unwrap()
            .per_role_series_warning(),
        None
    );
    assert_eq!(
        parse(&text(true, 4096)).unwrap().per_role_series_warning(),
        None
    );
    assert!(!parse("{}").unwrap().telemetry.per_role_metrics);
    let e = refused("telemetry:\n  per_role_metric: true\n");
    assert_eq!(e.key, "telemetry.per_role_metric", "{e}");
}

#[test]
fn otlp_settings_have_defaults_and_bad_ones_are_refused() {
    let c = parse("telemetry:\n  otlp:\n    endpoint: http://collector:4318/\n").unwrap();
    let o = c.telemetry.otlp.expect("set");
    assert_eq!(o.endpoint, "http://collector:4318");
    assert_eq!(o.sample_ratio.0, 1.0);
    assert_eq!(o.parent, super::TraceParentTrust::Trusted);
    assert_eq!(o.service_name, "rolegate");
    assert_eq!((o.queue, o.timeout), (2048, Duration::from_secs(10)));
    let c = parse(
        "telemetry:\n  otlp:\n    endpoint: https://c:4318\n    sample_ratio: 0.25\n    parent: never\n",
    )
    .unwrap();
    let o = c.telemetry.otlp.unwrap();
    assert_eq!(
        (o.sample_ratio.0, o.parent),
        (0.25, super::TraceParentTrust::Never)
    );
    for (text, key) in [
        ("    sample_ratio: 1.5\n", "telemetry.otlp.sample_ratio"),
        ("    parent: clients\n", "telemetry.otlp.parent"),
        ("    queue: 0\n", "telemetry.otlp.queue"),
        ("    timeout: 0s\n", "telemetry.otlp.timeout"),
        ("    endpoint2: x\n", "telemetry.otlp.endpoint2"),
    ] {
        let e = refused(&format!(
            "telemetry:\n  otlp:\n    endpoint: http://c:4318\n{text}"
        ));
        assert_eq!(e.key, key, "{text}: {e}");
    }
    let e = refused("telemetry:\n  otlp:\n    endpoint: udp://c:4318\n");
    assert_eq!(e.key, "telemetry.otlp.endpoint", "{e}");
    let e = refused("telemetry:\n  otlp:\n    sample_ratio: 1\n");
    assert!(e.to_string().contains("endpoint"), "{e}");
}
