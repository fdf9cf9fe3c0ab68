//! The hop marker (docs/proxy.md): `X-Rolegate-Hop: <origin instance id>`, or
//! with a cluster secret `<origin>;t=<unix seconds>;sig=<hex HMAC-SHA256>` over
//! origin, method, path and timestamp. A marker that does not verify is
//! dropped and the request treated as fresh.

use hmac::{Hmac, Mac};
use http::HeaderValue;
use sha2::Sha256;

/// How far a signed marker's timestamp may be from now, in seconds.
pub const SIGNATURE_WINDOW_SECS: u64 = 30;

#[derive(Clone)]
/// Makes and verifies hop markers, HMAC-signed when a cluster secret is set.
pub struct HopSigner {
    /// The keyed HMAC state, cloned per marker.
    key: Option<Hmac<Sha256>>,
}

impl std::fmt::Debug for HopSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HopSigner")
            .field("signed", &self.key.is_some())
            .finish()
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl HopSigner {
    /// A signer for `proxy.cluster_secret` (unsigned markers without one).
    pub fn new(secret: Option<&str>) -> Self {
        // HMAC takes keys of any length, so this never drops a secret.
        Self {
            key: secret.and_then(|s| <Hmac<Sha256> as Mac>::new_from_slice(s.as_bytes()).ok()),
        }
    }

    fn mac(key: &Hmac<Sha256>, origin: &str, method: &str, path: &str, ts: u64) -> Hmac<Sha256> {
        let mut mac = key.clone();
        for part in [
            origin.as_bytes(),
            b"\n",
            method.as_bytes(),
            b"\n",
            path.as_bytes(),
            b"\n",
        ] {
            mac.update(part);
        }
        mac.update(ts.to_string().as_bytes());
        mac
    }

    /// Whether markers are signed with a cluster secret.
    pub fn is_signed(&self) -> bool {
        self.key.is_some()
    }

    /// The marker to send on a forwarded request.
    pub fn marker(&self, origin: &str, method: &str, path: &str) -> Option<HeaderValue> {
        let text = match &self.key {
            None => origin.to_string(),
            Some(secret) => {
                let ts = unix_now();
                let sig = Self::mac(secret, origin, method, path, ts)
                    .finalize()
                    .into_bytes();
                format!("{origin};t={ts};sig={}", hex::encode(sig))
            }
        };
        HeaderValue::from_str(&text).ok()
    }

    /// Whether a received marker counts as a real forwarded hop. Without a
    /// secret, any marker counts (so a spoof can only cause a 503).
    pub fn verify(&self, value: &HeaderValue, method: &str, path: &str) -> bool {
        self.check(value, method, path).is_ok()
    }

    /// Like [`HopSigner::verify`], saying why a marker does not count.
    pub fn check(&self, value: &HeaderValue, method: &str, path: &str) -> Result<(), HopRefusal> {
        let Some(key) = &self.key else {
            return Ok(());
        };
        // UTF-8, not only visible ASCII: `marker` signs any origin.
        let Ok(text) = std::str::from_utf8(value.as_bytes()) else {
            return Err(HopRefusal::BadSignature);
        };
        if !text.contains(";sig=") {
            return Err(HopRefusal::Unsigned);
        }
        // `<origin>;t=<ts>;sig=<hex>`, read from the end: the origin may hold `;`.
        let mut parts = text.rsplitn(3, ';');
        let sig = parts
            .next()
            .and_then(|p| p.strip_prefix("sig="))
            .and_then(|v| hex::decode(v).ok());
        let ts = parts
            .next()
            .and_then(|p| p.strip_prefix("t="))
            .and_then(|v| v.parse::<u64>().ok());
        let origin = parts.next().unwrap_or_default();
        let (Some(ts), Some(sig)) = (ts, sig) else {
            return Err(HopRefusal::BadSignature);
        };
        if unix_now().abs_diff(ts) > SIGNATURE_WINDOW_SECS {
            return Err(HopRefusal::Stale);
        }
        Self::mac(key, origin, method, path, ts)
            .verify_slice(&sig)
            .map_err(|_| HopRefusal::BadSignature)
    }
}

/// Why a received hop marker does not count (the `reason` label of
/// `rolegate_hops_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HopRefusal {
    /// The signature does not match: another `cluster_secret`, or a forgery.
    BadSignature,
    /// No signature: the sender has no `cluster_secret`.
    Unsigned,
    /// Signed more than [`SIGNATURE_WINDOW_SECS`] from now: clocks apart.
    Stale,
}

impl HopRefusal {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            HopRefusal::BadSignature => "bad-signature",
            HopRefusal::Unsigned => "unsigned",
            HopRefusal::Stale => "stale",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_markers_verify_only_for_the_same_request() {
        let s = HopSigner::new(Some("0123456789abcdef"));
        let m = s.marker("gw-1", "GET", "/a?b=1").unwrap();
        assert!(s.verify(&m, "GET", "/a?b=1"));
        assert!(!s.verify(&m, "POST", "/a?b=1"));
        assert!(!s.verify(&m, "GET", "/a?b=2"));
        assert!(!HopSigner::new(Some("another-secret-16")).verify(&m, "GET", "/a?b=1"));
        assert!(!s.verify(&HeaderValue::from_static("gw-1"), "GET", "/a"));
        let stale = format!(
            "gw-1;t=1;sig={}",
            hex::encode(
                HopSigner::mac(s.key.as_ref().unwrap(), "gw-1", "GET", "/a", 1)
                    .finalize()
                    .into_bytes()
            )
        );
        assert!(!s.verify(&HeaderValue::from_str(&stale).unwrap(), "GET", "/a"));
    }

    #[test]
    fn an_origin_with_semicolons_verifies() {
        let s = HopSigner::new(Some("0123456789abcdef"));
        let m = s.marker("gw;1;t=2", "GET", "/a").unwrap();
        assert!(s.verify(&m, "GET", "/a"));
        let m = s.marker("gw-é", "GET", "/a").unwrap();
        assert!(s.verify(&m, "GET", "/a"), "a non-ASCII origin");
        assert!(!s.verify(&m, "GET", "/b"));
    }

    #[test]
    fn unsigned_markers_always_count() {
        let s = HopSigner::new(None);
        assert_eq!(s.marker("gw-1", "GET", "/").unwrap(), "gw-1");
        assert!(s.verify(&HeaderValue::from_static("anything"), "GET", "/"));
    }
}
