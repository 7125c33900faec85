//! Time. Policy code never reads the wall clock: it is handed the time, and services get it
//! from an injected [`Clock`] so that tests and the simulator can drive time themselves.

use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, NaiveDate, Utc};

/// Milliseconds since the Unix epoch, UTC.
pub type UnixMillis = i64;
/// Seconds since the Unix epoch, UTC.
pub type UnixSeconds = i64;

pub const MS_PER_HOUR: i64 = 3_600_000;
pub const MS_PER_DAY: i64 = 86_400_000;

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_ms(&self) -> UnixMillis;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> UnixMillis {
        Utc::now().timestamp_millis()
    }
}

/// A clock that only moves when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(now_ms: UnixMillis) -> Self {
        ManualClock(AtomicI64::new(now_ms))
    }

    pub fn set(&self, now_ms: UnixMillis) {
        self.0.store(now_ms, Ordering::SeqCst);
    }

    pub fn advance_ms(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> UnixMillis {
        self.0.load(Ordering::SeqCst)
    }
}

/// The UTC calendar day of a time.
pub fn date_of_ms(ms: UnixMillis) -> NaiveDate {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .date_naive()
}

/// Midnight UTC of a day, in ms.
pub fn day_start_ms(date: NaiveDate) -> UnixMillis {
    date.and_hms_opt(0, 0, 0)
        .unwrap_or_default()
        .and_utc()
        .timestamp_millis()
}

/// The start of the UTC hour holding `ms`.
pub fn hour_start_ms(ms: UnixMillis) -> UnixMillis {
    ms.div_euclid(MS_PER_HOUR) * MS_PER_HOUR
}

/// A quarter of an hour: the grain billing cuts an hour at (every zone's offset from UTC, and
/// every change of it, is a whole number of quarter hours).
pub const MS_PER_QUARTER_HOUR: i64 = 900_000;

/// A sample's GPU-seconds in each quarter of its hour: `offset_ms` after the hour, `secs` long.
/// Each part is what lies before the quarter's end, rounded to the second, less what the earlier
/// quarters took, so the parts sum exactly to `secs`; what runs past the hour (a sampler that
/// does not cut at hours) stays in the last quarter, as the row stays in its start hour.
pub fn quarter_split(offset_ms: i64, secs: i64) -> [i64; 4] {
    let q = (offset_ms / MS_PER_QUARTER_HOUR).clamp(0, 3) as usize;
    let end = offset_ms + secs * 1000;
    let mut out = [0; 4];
    if q == 3 || end <= (q as i64 + 1) * MS_PER_QUARTER_HOUR {
        out[q] = secs;
        return out;
    }
    let mut given = 0;
    for (i, part) in out.iter_mut().enumerate().take(3) {
        let boundary = (i as i64 + 1) * MS_PER_QUARTER_HOUR;
        let before = (boundary.clamp(offset_ms, end) - offset_ms + 500) / 1000;
        *part = before - given;
        given = before;
    }
    out[3] = secs - given;
    out
}

/// RFC 3339 text of a time in seconds, for reports.
/// A point in time as people write one in an option or a query: Unix seconds, RFC 3339, or a
/// date (its midnight UTC); in Unix seconds. The error says which forms are taken.
pub fn parse_instant_s(text: &str) -> Result<UnixSeconds, String> {
    let text = text.trim();
    if let Ok(s) = text.parse::<i64>() {
        return Ok(s);
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.timestamp());
    }
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .map(|d| {
            d.and_hms_opt(0, 0, 0)
                .unwrap_or_default()
                .and_utc()
                .timestamp()
        })
        .map_err(|_| format!("`{text}`: not Unix seconds, RFC 3339 nor a date (2026-06-01)"))
}

pub fn rfc3339(secs: UnixSeconds) -> String {
    DateTime::<Utc>::from_timestamp(secs, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| secs.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instant_is_unix_seconds_rfc3339_or_a_date() {
        assert_eq!(parse_instant_s("86400"), Ok(86_400));
        assert_eq!(parse_instant_s("1970-01-02T00:00:00Z"), Ok(86_400));
        assert_eq!(parse_instant_s("1970-01-02"), Ok(86_400));
        assert!(parse_instant_s("tomorrow")
            .unwrap_err()
            .contains("RFC 3339"));
    }

    #[test]
    fn a_samples_seconds_fall_in_the_quarters_it_spans_and_sum_exactly() {
        assert_eq!(quarter_split(0, 10), [10, 0, 0, 0]);
        assert_eq!(quarter_split(895_000, 10), [5, 5, 0, 0]);
        // 12:14:58.300 for 10 s: 1.7 s before the quarter, rounded to 2.
        assert_eq!(quarter_split(898_300, 10), [2, 8, 0, 0]);
        assert_eq!(quarter_split(0, 3600), [900, 900, 900, 900]);
        assert_eq!(quarter_split(1_800_000, 1800), [0, 0, 900, 900]);
        // Past the hour's end: kept in the last quarter, as the row in its start hour.
        assert_eq!(quarter_split(3_595_000, 10), [0, 0, 0, 10]);
        assert_eq!(quarter_split(2_690_000, 20), [0, 0, 10, 10]);
        for offset in (0..3_600_000).step_by(77_777) {
            for secs in [1, 9, 10, 61, 900, 3600] {
                assert_eq!(quarter_split(offset, secs).iter().sum::<i64>(), secs);
            }
        }
    }
}
