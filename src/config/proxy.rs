//! The `proxy` section's own readers. Its defaults live with the proxy
//! ([`crate::proxy::defaults`]), which the library layers use too.

use std::time::Duration;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serializer};

use super::value;

/// The longest `proxy.hold_timeout` accepted.
const MAX_HOLD: Duration = Duration::from_secs(3600);

/// `proxy.hold_timeout`: at most an hour.
pub(super) mod hold_timeout {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = value::duration::deserialize(d)?;
        if v > MAX_HOLD {
            return Err(D::Error::custom(
                "must be at most 1h: a request held longer has long been given up by its client",
            ));
        }
        Ok(v)
    }
    pub(crate) use value::duration::serialize;
}

/// `proxy.cluster_secret`: at least 16 bytes; written as
/// `${ROLEGATE_CLUSTER_SECRET}`.
pub(super) mod cluster_secret {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        let Some(s) = value::read_opt_text(d)? else {
            return Ok(None);
        };
        if s.len() < 16 {
            return Err(D::Error::custom(
                "must be at least 16 bytes (use a random string)",
            ));
        }
        Ok(Some(s))
    }
    pub(crate) fn serialize<S: Serializer>(v: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
        value::write_secret(v, super::super::CLUSTER_SECRET_VAR, s)
    }
}

/// `proxy.upgrades`: protocol names, lowercased; never `h2c`.
pub(super) mod upgrades {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        struct Upgrade(String);
        impl<'de> Deserialize<'de> for Upgrade {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let name = value::read_text(d)?.to_ascii_lowercase();
                if name.is_empty()
                    || !name.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'/')
                    })
                {
                    return Err(D::Error::custom(format!("`{name}` is not a protocol name")));
                }
                if name == "h2c" {
                    return Err(D::Error::custom(
                        "h2c cannot be passed through: the tunnel would carry requests past the gate",
                    ));
                }
                Ok(Upgrade(name))
            }
        }
        Ok(value::list::<D, Upgrade>(d)?
            .into_iter()
            .map(|u| u.0)
            .collect())
    }
    pub(crate) fn serialize<S: Serializer>(v: &[String], s: S) -> Result<S::Ok, S::Error> {
        value::texts::serialize(v, s)
    }
}

/// `proxy.trusted_proxies`: addresses and CIDR networks.
pub(super) mod cidrs {
    use super::*;
    use crate::proxy::Cidr;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Cidr>, D::Error> {
        struct One(Cidr);
        impl<'de> Deserialize<'de> for One {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                value::read_text(d)?
                    .parse()
                    .map(One)
                    .map_err(D::Error::custom)
            }
        }
        Ok(value::list::<D, One>(d)?.into_iter().map(|c| c.0).collect())
    }
    pub(crate) fn serialize<S: Serializer>(v: &[Cidr], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|c| c.to_string()))
    }
}
