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

/// RFC 3339 text of a time in seconds, for reports.
pub fn rfc3339(secs: UnixSeconds) -> String {
    DateTime::<Utc>::from_timestamp(secs, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| secs.to_string())
}
