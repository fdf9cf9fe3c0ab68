//! Lease timings and the one rule that ties them together.

use std::time::Duration;

/// Longest lease duration accepted, so deadline arithmetic never overflows.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Lease timings: a default for all roles, overridable per role or
/// partition (the config file's `lease` section).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseTimings {
    /// How long a term lasts in the store without renewal.
    #[serde(with = "crate::value::duration")]
    pub duration: Duration,
    /// How often the holder renews (and others retry).
    #[serde(with = "crate::value::duration")]
    pub renew_interval: Duration,
    /// How much earlier than the store's expiry the holder stops trusting
    /// its term (absorbs clock drift and delays).
    #[serde(with = "crate::value::duration")]
    pub safety_margin: Duration,
}

impl Default for LeaseTimings {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(15),
            renew_interval: Duration::from_secs(5),
            safety_margin: Duration::from_secs(2),
        }
    }
}

/// Timings that break the rule `duration > renew_interval + safety_margin`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TimingsError {
    /// `renew_interval` is zero.
    #[error("renew_interval must be greater than 0")]
    ZeroRenew,
    /// `safety_margin` is zero.
    #[error("safety_margin must be greater than 0 (it absorbs clock drift and delays)")]
    ZeroMargin,
    /// `duration` is over [`MAX_DURATION`].
    #[error("duration must be at most 24h")]
    TooLong,
    /// `duration` leaves no time between renewals and the margin.
    #[error(
        "duration ({}) must be greater than renew_interval ({}) + safety_margin ({})",
        humantime::format_duration(.0.duration),
        humantime::format_duration(.0.renew_interval),
        humantime::format_duration(.0.safety_margin)
    )]
    TooShort(LeaseTimings),
}

impl LeaseTimings {
    /// Checks the rule `duration > renew_interval + safety_margin`, with both
    /// intervals above zero and the duration at most 24 h.
    pub fn check(&self) -> Result<(), TimingsError> {
        if self.renew_interval.is_zero() {
            return Err(TimingsError::ZeroRenew);
        }
        if self.safety_margin.is_zero() {
            return Err(TimingsError::ZeroMargin);
        }
        if self.duration > MAX_DURATION {
            return Err(TimingsError::TooLong);
        }
        if self.duration <= self.renew_interval + self.safety_margin {
            return Err(TimingsError::TooShort(*self));
        }
        Ok(())
    }
}
