//! `proxy.trusted_proxies`: the networks whose `X-Forwarded-*`/`Forwarded`
//! fields are kept and appended to. From anyone else they are replaced by the
//! gateway's own view, so a client cannot make the app believe another origin.

use std::net::IpAddr;

/// One CIDR block, e.g. `10.0.0.0/8` or `fd00::/8` (a bare address is /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    bits: u8,
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

/// Text that is not an address or CIDR block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| CidrError::NotAnAddress(s.to_string()))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => max,
            Some(b) => b
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(|| CidrError::PrefixLength {
                    text: s.to_string(),
                    max,
                })?,
        };
        Ok(Cidr { addr, bits })
    }
}

impl Cidr {
    /// Whether `ip` lies in this block (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - self.bits as u32).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - self.bits as u32).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// Whether `ip` is in any of `blocks`.
pub fn is_trusted(blocks: &[Cidr], ip: Option<IpAddr>) -> bool {
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
