//! Retry timing for failed work: an exponential backoff, and a ladder of
//! fixed steps that honours a remote `Retry-After` (seconds or HTTP date).

use std::time::{Duration, SystemTime};

/// Exponential backoff: `base × factor^(attempt-1)`, capped at `max`, with
/// up to `jitter` (0..=1) of the delay taken off at random so retries spread.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// First delay.
    pub base: Duration,
    /// Growth per attempt.
    pub factor: f64,
    /// Largest delay.
    pub max: Duration,
    /// Random spread, as a fraction of the delay (0 to 1).
    pub jitter: f64,
}

impl Default for Backoff {
    /// 1 s doubling to at most 1 h, with 20 % jitter.
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            factor: 2.0,
            max: Duration::from_secs(3600),
            jitter: 0.2,
        }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (1 = the first retry), no jitter.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = self
            .factor
            .max(1.0)
            .powi(attempt.saturating_sub(1).min(64) as i32);
        let secs = (self.base.as_secs_f64() * exp).min(self.max.as_secs_f64());
        Duration::from_secs_f64(secs.max(0.0))
    }

    /// [`delay`](Self::delay) with jitter applied.
    pub fn delay_jittered(&self, attempt: u32) -> Duration {
        let d = self.delay(attempt);
        let cut: f64 = rand::random::<f64>() * self.jitter.clamp(0.0, 1.0);
        d.mul_f64(1.0 - cut)
    }
}

/// Fixed retry steps (`1m, 5m, 30m, 2h`); past the last step, `None`: give up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryLadder {
    /// Delay after attempt 1, 2, ...; the last repeats.
    pub steps: Vec<Duration>,
}

impl RetryLadder {
    /// A ladder of these steps.
    pub fn new(steps: impl Into<Vec<Duration>>) -> Self {
        Self {
            steps: steps.into(),
        }
    }

    /// When to retry after failed attempt number `attempt` (1-based), or `None`
    /// when the ladder is exhausted. A remote `Retry-After` value (seconds or
    /// an HTTP date) pushes the retry later, never earlier.
    pub fn next(
        &self,
        attempt: u32,
        retry_after: Option<&str>,
        now: SystemTime,
    ) -> Option<SystemTime> {
        let step = *self.steps.get(attempt.checked_sub(1)? as usize)?;
        let remote = retry_after
            .and_then(|v| parse_retry_after(v, now))
            .unwrap_or_default();
        Some(now + step.max(remote))
    }
}

/// The longest delay a remote `Retry-After` may ask for; a longer one (a
/// peer's mistake, or a value meant to overflow a clock) is taken as this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(365 * 24 * 3600);

/// A `Retry-After` value as a delay from `now`: delay-seconds, or an HTTP
/// date (a date in the past is zero), at most [`MAX_RETRY_AFTER`]. `None`
/// when it is neither.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    let delay = match v.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => {
            let at = httpdate::parse_http_date(v).ok()?;
            at.duration_since(now).unwrap_or_default()
        }
    };
    Some(delay.min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_retry_after_is_capped_not_overflowed() {
        let now = SystemTime::now();
        let ladder = RetryLadder::new(vec![Duration::from_secs(1)]);
        let at = ladder.next(1, Some("18446744073709551615"), now).unwrap();
        assert_eq!(at, now + MAX_RETRY_AFTER);
        assert_eq!(
            parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
    }

    #[test]
    fn backoff_doubles_to_its_cap() {
        let b = Backoff {
            base: Duration::from_millis(100),
            factor: 2.0,
            max: Duration::from_secs(1),
            jitter: 0.5,
        };
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(200));
        assert_eq!(b.delay(4), Duration::from_millis(800));
        assert_eq!(b.delay(5), Duration::from_secs(1));
        assert_eq!(b.delay(1000), Duration::from_secs(1));
        for _ in 0..100 {
            let j = b.delay_jittered(3);
            assert!(j <= Duration::from_millis(400) && j >= Duration::from_millis(200));
        }
    }

    #[test]
    fn ladder_honours_retry_after_in_seconds_and_dates() {
        let now = httpdate::parse_http_date("Sun, 29 Nov 2026 12:00:00 GMT").unwrap();
        let ladder = RetryLadder::new(vec![Duration::from_secs(60), Duration::from_secs(300)]);
        assert_eq!(
            ladder.next(1, None, now),
            Some(now + Duration::from_secs(60))
        );
        assert_eq!(
            ladder.next(2, None, now),
            Some(now + Duration::from_secs(300))
        );
        assert_eq!(ladder.next(3, None, now), None, "exhausted");
        assert_eq!(ladder.next(0, None, now), None);
        assert_eq!(
            ladder.next(1, Some("120"), now),
            Some(now + Duration::from_secs(120)),
            "a later Retry-After wins"
        );
        assert_eq!(
            ladder.next(1, Some("5"), now),
            Some(now + Duration::from_secs(60))
        );
        assert_eq!(
            ladder.next(1, Some("Sun, 29 Nov 2026 12:10:00 GMT"), now),
            Some(now + Duration::from_secs(600))
        );
        assert_eq!(
            parse_retry_after("Sun, 29 Nov 2026 11:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(
            ladder.next(1, Some("soon"), now),
            Some(now + Duration::from_secs(60))
        );
    }
}
