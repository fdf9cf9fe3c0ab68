//! `proxy.trusted_proxies`: the networks whose `X-Forwarded-*`/`Forwarded`
//! fields are kept and appended to. From anyone else they are replaced by the
//! gateway's own view, so a client cannot make the app believe another origin.

use std::net::IpAddr;

use ipnet::IpNet;

/// One CIDR block, e.g. `10.0.0.0/8` or `fd00::/8` (a bare address is /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr(IpNet);

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Text that is not an address or CIDR block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CidrError {
    /// Not an IP address.
    #[error("`{0}` is not an IP address or CIDR block")]
    NotAnAddress(String),
    /// The prefix length is not a number up to 32 (IPv4) or 128 (IPv6).
    #[error("`{text}`: the prefix length must be 0..={max}")]
    PrefixLength {
        /// The text.
        text: String,
        /// The largest length for the address family.
        max: u8,
    },
}

impl std::str::FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, CidrError> {
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a.trim(), Some(b.trim())),
            None => (s.trim(), None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| CidrError::NotAnAddress(s.to_string()))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => Some(max),
            Some(b) => b.parse::<u8>().ok(),
        };
        bits.and_then(|bits| IpNet::new(addr, bits).ok())
            .map(Cidr)
            .ok_or_else(|| CidrError::PrefixLength {
                text: s.to_string(),
                max,
            })
    }
}

impl Cidr {
    /// Whether `ip` lies in this block (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        self.0.contains(&ip)
    }
}

/// Whether `ip` is in any of `blocks`.
pub(crate) fn is_trusted(blocks: &[Cidr], ip: Option<IpAddr>) -> bool {
    ip.is_some_and(|ip| blocks.iter().any(|b| b.contains(ip)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_parse_and_contain() {
        let b: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(b.contains("10.1.2.3".parse().unwrap()));
        assert!(!b.contains("11.0.0.1".parse().unwrap()));
        assert!(b.contains("::ffff:10.0.0.9".parse().unwrap()));
        let one: Cidr = "127.0.0.1".parse().unwrap();
        assert!(one.contains("127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("8.8.8.8".parse().unwrap()));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(!v6.contains("10.0.0.1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nope".parse::<Cidr>().is_err());
        assert!(!is_trusted(&[b], None));
    }
}
