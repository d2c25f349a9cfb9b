//! `DURATION_IS_GREGORIAN`: a duration that is a calendar interval (the minute, hour, day,
//! month or year the request falls in), ending at the interval's last millisecond.
//!
//! Gubernator reads the interval off the server's local clock; Weir reads it off the
//! request's `created_at` (the server's clock when the client sends none), in UTC, so a client
//! that sends its own times gets the same ends from every node.

use chrono::{DateTime, Datelike, NaiveDate, Utc};

/// Why a Gregorian duration cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GregorianError {
    /// `duration = 3` (weeks): Gubernator does not support it either.
    #[error("`Duration = GregorianWeeks` not yet supported")]
    Weeks,
    /// Not one of 0 (minutes) … 5 (years).
    #[error(
        "behavior DURATION_IS_GREGORIAN is set; but `Duration` is not a valid gregorian interval"
    )]
    NotAnInterval,
    /// A time before 1970 or past the calendar's range.
    #[error("created_at {0} is not a time the calendar can place")]
    OutOfRange(i64),
}

const MINUTE: i64 = 60_000;
const HOUR: i64 = 60 * MINUTE;
const DAY: i64 = 24 * HOUR;

/// The calendar interval `now` (epoch milliseconds) falls in, for `duration` 0 (minutes) to 5
/// (years), as `[start, end)` in epoch milliseconds.
fn interval(now: i64, duration: i64) -> Result<(i64, i64), GregorianError> {
    let fixed = |length: i64| {
        let start = now - now.rem_euclid(length);
        Ok((start, start + length))
    };
    match duration {
        0 => fixed(MINUTE),
        1 => fixed(HOUR),
        2 => fixed(DAY),
        3 => Err(GregorianError::Weeks),
        4 | 5 => {
            let date = DateTime::<Utc>::from_timestamp_millis(now)
                .ok_or(GregorianError::OutOfRange(now))?
                .date_naive();
            let (first, next) = if duration == 4 {
                let first = NaiveDate::from_ymd_opt(date.year(), date.month(), 1);
                let next = match date.month() {
                    12 => NaiveDate::from_ymd_opt(date.year() + 1, 1, 1),
                    month => NaiveDate::from_ymd_opt(date.year(), month + 1, 1),
                };
                (first, next)
            } else {
                (
                    NaiveDate::from_ymd_opt(date.year(), 1, 1),
                    NaiveDate::from_ymd_opt(date.year() + 1, 1, 1),
                )
            };
            let millis = |day: Option<NaiveDate>| {
                day.and_then(|day| day.and_hms_opt(0, 0, 0))
                    .map(|midnight| midnight.and_utc().timestamp_millis())
                    .ok_or(GregorianError::OutOfRange(now))
            };
            Ok((millis(first)?, millis(next)?))
        }
        _ => Err(GregorianError::NotAnInterval),
    }
}

/// The last millisecond of the interval `now` falls in: when a bucket of this duration resets.
pub fn expiration(now: i64, duration: i64) -> Result<i64, GregorianError> {
    interval(now, duration).map(|(_, end)| end - 1)
}

/// The interval's length in milliseconds (a month's or a year's as the calendar has it).
///
/// Gubernator's own reckoning of a month's and a year's length mixes nanoseconds with
/// milliseconds; Weir takes the calendar's (`docs/gubernator.md`, "Differences").
pub fn length(now: i64, duration: i64) -> Result<i64, GregorianError> {
    interval(now, duration).map(|(start, end)| end - start)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2024-02-29T13:45:30.250Z, a leap day.
    const LEAP_DAY: i64 = 1_709_214_330_250;

    #[test]
    fn each_interval_ends_on_its_last_millisecond() {
        assert_eq!(expiration(LEAP_DAY, 0), Ok(1_709_214_359_999)); // 13:45:59.999
        assert_eq!(expiration(LEAP_DAY, 1), Ok(1_709_215_199_999)); // 13:59:59.999
        assert_eq!(expiration(LEAP_DAY, 2), Ok(1_709_251_199_999)); // 23:59:59.999
        assert_eq!(expiration(LEAP_DAY, 4), Ok(1_709_251_199_999)); // Feb ends today
        assert_eq!(expiration(LEAP_DAY, 5), Ok(1_735_689_599_999)); // 2024-12-31T23:59:59.999
    }

    #[test]
    fn lengths_follow_the_calendar() {
        assert_eq!(length(LEAP_DAY, 0), Ok(MINUTE));
        assert_eq!(length(LEAP_DAY, 2), Ok(DAY));
        assert_eq!(length(LEAP_DAY, 4), Ok(29 * DAY));
        assert_eq!(length(LEAP_DAY, 5), Ok(366 * DAY));
        // December rolls into the next year.
        assert_eq!(length(1_733_011_200_000, 4), Ok(31 * DAY)); // 2024-12-01
    }

    #[test]
    fn weeks_and_other_numbers_are_refused_by_name() {
        assert_eq!(expiration(LEAP_DAY, 3), Err(GregorianError::Weeks));
        assert_eq!(expiration(LEAP_DAY, 6), Err(GregorianError::NotAnInterval));
        assert_eq!(expiration(LEAP_DAY, -1), Err(GregorianError::NotAnInterval));
    }
}
