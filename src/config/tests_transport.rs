//! Unit tests of the `tls` and `peers` sections: shapes and the rules
//! between them and `instance.advertise` (the files are not read here).

use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, "test.yaml", &|_| None)
}

fn refused(text: &str) -> ConfigError {
    match parse(text) {
        Ok(c) => panic!("expected a refusal, got {c:?}"),
        Err(e) => e,
    }
}

const TLS: &str = "tls:\n  cert_file: /t/gw.pem\n  key_file: /t/gw.key\n";

#[test]
fn no_tls_section_means_plain_tcp_and_no_peer_tls() {
    let c = parse("{}").unwrap();
    assert_eq!(c.tls, None);
    assert_eq!(c.peers, PeersConfig::default());
    let c = parse("tls: null\n").unwrap();
    assert_eq!(c.tls, None);
}

#[test]
fn tls_and_peers_resolve_to_paths() {
    let c = parse(&format!(
        "{TLS}  client_ca_file: /t/clients.pem\npeers:\n  ca_file: /t/ca.pem\n  cert_file: /t/p.pem\n  key_file: /t/p.key\n  require_client_cert: true\ninstance:\n  advertise: https://gw.example:8443\n"
    ))
    .unwrap();
    let tls = c.tls.unwrap();
    assert_eq!(tls.cert_file, std::path::PathBuf::from("/t/gw.pem"));
    assert_eq!(
        tls.client_ca_file.as_deref(),
        Some(std::path::Path::new("/t/clients.pem"))
    );
    assert!(c.peers.require_client_cert);
    assert_eq!(
        c.peers.key_file.as_deref(),
        Some(std::path::Path::new("/t/p.key"))
    );
}

#[test]
fn tls_needs_both_files() {
    let e = refused("tls:\n  cert_file: /t/gw.pem\n");
    assert_eq!(e.key, "tls.key_file");
    let e = refused("tls:\n  key_file: /t/gw.key\n");
    assert_eq!(e.key, "tls.cert_file");
    let e = refused("tls:\n  cert_file: ''\n  key_file: /k\n");
    assert_eq!(e.key, "tls.cert_file");
    let e = refused("tls:\n  cert_file: /c\n  key_file: /k\n  certfile: /x\n");
    assert!(e.message.contains("unknown key"), "{e}");
}

#[test]
fn an_https_advertise_address_needs_tls() {
    let e = refused("instance:\n  advertise: https://gw.example:8443\n");
    assert_eq!(e.key, "instance.advertise");
    assert_eq!(e.line, Some(2));
    assert!(e.message.contains("set `tls`"), "{e}");
    parse(&format!(
        "{TLS}instance:\n  advertise: https://gw.example:8443\n"
    ))
    .unwrap();
    parse("instance:\n  advertise: http://gw.example:8080\n").unwrap();
    // The listener serves only TLS: a plain advertise address cannot work.
    let e = refused(&format!(
        "{TLS}instance:\n  advertise: http://gw.example:8080\n"
    ));
    assert_eq!(e.key, "instance.advertise");
    assert!(e.message.contains("advertise https://"), "{e}");
}

#[test]
fn require_client_cert_needs_tls_and_the_peer_ca() {
    let e = refused("peers:\n  ca_file: /t/ca.pem\n  require_client_cert: true\n");
    assert_eq!(e.key, "peers.require_client_cert");
    assert!(e.message.contains("needs `tls`"), "{e}");
    let e = refused(&format!("{TLS}peers:\n  require_client_cert: true\n"));
    assert_eq!(e.key, "peers.require_client_cert");
    assert!(e.message.contains("peers.ca_file"), "{e}");
    let ok = parse(&format!(
        "{TLS}peers:\n  ca_file: /t/ca.pem\n  require_client_cert: true\n"
    ));
    assert!(ok.unwrap().peers.require_client_cert);
}

#[test]
fn a_peer_client_certificate_needs_its_key_and_the_other_way_round() {
    assert_eq!(
        refused("peers:\n  cert_file: /t/p.pem\n").key,
        "peers.key_file"
    );
    assert_eq!(
        refused("peers:\n  key_file: /t/p.key\n").key,
        "peers.cert_file"
    );
}

#[test]
fn printed_transport_sections_are_accepted_again() {
    let c = parse(&format!(
        "{TLS}peers:\n  ca_file: /t/ca.pem\n  require_client_cert: true\n"
    ))
    .unwrap();
    let again = parse(&c.to_yaml()).unwrap();
    assert_eq!(again.tls, c.tls);
    assert_eq!(again.peers, c.peers);
}
