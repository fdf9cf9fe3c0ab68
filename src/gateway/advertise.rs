//! The address other instances forward to: the configured one, or one
//! derived from the bound listener.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// The advertise address: the configured one, else `http://` (`https://`
/// when the listener serves TLS) + the bound
/// address with a wildcard host replaced by a non-loopback IPv4 of this host
/// (loopback when the host has no other).
pub(super) fn advertise_address(
    configured: Option<&str>,
    bound: SocketAddr,
    https: bool,
) -> String {
    if let Some(a) = configured {
        return a.trim_end_matches('/').to_string();
    }
    let ip = if bound.ip().is_unspecified() {
        non_loopback_ipv4()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
    } else {
        bound.ip()
    };
    let scheme = if https { "https" } else { "http" };
    match ip {
        IpAddr::V4(v4) => format!("{scheme}://{v4}:{}", bound.port()),
        IpAddr::V6(v6) => format!("{scheme}://[{v6}]:{}", bound.port()),
    }
}

fn non_loopback_ipv4() -> Option<Ipv4Addr> {
    let addrs = if_addrs::get_if_addrs().ok()?;
    addrs.into_iter().find_map(|iface| match iface.ip() {
        IpAddr::V4(v4) if !v4.is_loopback() && !v4.is_link_local() && !v4.is_unspecified() => {
            Some(v4)
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertise_replaces_wildcards_only() {
        assert_eq!(
            advertise_address(None, "127.0.0.1:8080".parse().unwrap(), false),
            "http://127.0.0.1:8080"
        );
        assert_eq!(
            advertise_address(
                Some("https://a.example/"),
                "0.0.0.0:1".parse().unwrap(),
                false
            ),
            "https://a.example"
        );
        let wild = advertise_address(None, "0.0.0.0:8080".parse().unwrap(), false);
        assert!(!wild.contains("0.0.0.0"), "{wild}");
        assert!(wild.ends_with(":8080"));
        assert_eq!(
            advertise_address(None, "127.0.0.1:8443".parse().unwrap(), true),
            "https://127.0.0.1:8443",
            "a TLS listener is advertised as https"
        );
    }
}
