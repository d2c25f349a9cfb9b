//! Durations as people write them in a config: `"100ms"`, `"5s"`, `"1m"`, `"1h 30m"`, `"7d"`.
//!
//! Only units whose length is fixed and whose letter cannot be misread are taken: `ns`, `us`
//! (`µs`), `ms`, `s`, `m` or `min`, `h`, `d` and `w`, with their spelled-out names. A rate
//! limiter's users write minutes, so `M` — a month to the general-purpose parser Weir used
//! before, and so `window = "1M"` ran as a month — is refused, and so are `y` and `mo`. A number
//! with no unit is refused too (`"5"`: seconds or milliseconds?). Each refusal names what was
//! read and shows the form expected. `month` and `year` spelled out are read with that parser's
//! fixed lengths (30.44 and 365.25 days): it wrote them into the data dir, and a policy saved by
//! an older version must still load.
//!
//! [`serde`] is the `#[serde(with = …)]` module for config fields; it writes durations back in
//! the same units, so what is read is what is shown.

use std::fmt;
use std::time::Duration;

/// Why a text is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{text}` is not a duration: {problem}; write a whole number and a unit, such as \"5s\", \"100ms\" or \"1h 30m\" (units: ns, us, ms, s, m or min, h, d, w)"
)]
pub struct DurationError {
    /// The text as given.
    pub text: String,
    /// What is wrong with it.
    pub problem: String,
}

/// A unit's length in nanoseconds, if `unit` names one Weir takes.
fn unit_nanos(unit: &str) -> Result<u64, String> {
    const NS: u64 = 1;
    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;
    Ok(match unit {
        "ns" | "nsec" | "nanos" => NS,
        "us" | "µs" | "usec" | "micros" => US,
        "ms" | "msec" | "millis" => MS,
        "s" | "sec" | "secs" | "second" | "seconds" => S,
        "m" | "min" | "mins" | "minute" | "minutes" => 60 * S,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600 * S,
        "d" | "day" | "days" => 86_400 * S,
        "w" | "week" | "weeks" => 7 * 86_400 * S,
        "M" => {
            return Err(
                "`M` is refused (a month elsewhere, a minute to many readers): for minutes write `m` or `min`"
                    .to_owned(),
            );
        }
        // Spelled out, as the general-purpose parser Weir used before wrote them into the
        // data dir: read with that parser's lengths (30.44 and 365.25 days), so a policy saved
        // by an older version still loads. Abbreviated, they are refused.
        "month" | "months" => 2_630_016 * S,
        "year" | "years" => 31_557_600 * S,
        "y" | "mo" => {
            return Err(format!(
                "`{unit}` is refused: its length varies; give days (`30d`, `365d`)"
            ));
        }
        "" => return Err("a number needs a unit".to_owned()),
        other => return Err(format!("`{other}` is not a unit")),
    })
}

/// Reads a duration: one or more `<number><unit>` pieces, with or without spaces between them.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let refuse = |problem: String| DurationError {
        text: text.to_owned(),
        problem,
    };
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(refuse("it is empty".to_owned()));
    }
    let mut total: u64 = 0;
    let mut rest = trimmed;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(refuse(format!("expected a number at `{rest}`")));
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| refuse("the number is too large".to_owned()))?;
        // "3 seconds" as well as "3s".
        rest = rest[digits..].trim_start();
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || c.is_whitespace())
            .map_or(rest.len(), |(at, _)| at);
        let nanos = unit_nanos(&rest[..unit_len]).map_err(refuse)?;
        rest = rest[unit_len..].trim_start();
        total = number
            .checked_mul(nanos)
            .and_then(|piece| total.checked_add(piece))
            .ok_or_else(|| refuse("it is longer than 584 years".to_owned()))?;
    }
    Ok(Duration::from_nanos(total))
}

/// Writes a duration in the units [`parse`] reads, largest first (`"1h 30m"`, `"100ms"`,
/// `"0s"`), so that it reads back the same.
pub fn format(duration: Duration) -> impl fmt::Display {
    Formatted(duration)
}

struct Formatted(Duration);

impl fmt::Display for Formatted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut nanos = u64::try_from(self.0.as_nanos()).unwrap_or(u64::MAX);
        if nanos == 0 {
            return f.write_str("0s");
        }
        let units = [
            ("d", 86_400_000_000_000u64),
            ("h", 3_600_000_000_000),
            ("m", 60_000_000_000),
            ("s", 1_000_000_000),
            ("ms", 1_000_000),
            ("us", 1_000),
            ("ns", 1),
        ];
        let mut first = true;
        for (name, length) in units {
            let count = nanos / length;
            if count == 0 {
                continue;
            }
            nanos -= count * length;
            if !first {
                f.write_str(" ")?;
            }
            write!(f, "{count}{name}")?;
            first = false;
        }
        Ok(())
    }
}

/// `#[serde(with = "weir::duration::serde")]`: a duration as a string in [`parse`]'s form.
pub mod serde {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `duration` as [`format`](super::format) does.
    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&super::format(*duration))
    }

    /// Reads a duration string, refusing ambiguous units by name.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        super::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_units_people_write_are_read() {
        for (text, nanos) in [
            ("100ms", 100_000_000u64),
            ("5s", 5_000_000_000),
            ("1m", 60_000_000_000),
            ("2min", 120_000_000_000),
            ("1h 30m", 5_400_000_000_000),
            ("1h30m", 5_400_000_000_000),
            ("7d", 604_800_000_000_000),
            ("1w", 604_800_000_000_000),
            ("250us", 250_000),
            ("3 seconds", 3_000_000_000),
            ("0s", 0),
        ] {
            assert_eq!(parse(text), Ok(Duration::from_nanos(nanos)), "{text}");
        }
    }

    #[test]
    fn ambiguous_or_unitless_durations_are_refused_by_name() {
        for (text, says) in [
            ("1M", "for minutes write `m`"),
            ("1y", "its length varies"),
            ("2mo", "its length varies"),
            ("5", "a number needs a unit"),
            ("", "it is empty"),
            ("fast", "expected a number"),
            ("5 parsecs", "`parsecs` is not a unit"),
            ("99999999999999999999s", "too large"),
            ("1000000w", "longer than 584 years"),
        ] {
            let error = parse(text).unwrap_err().to_string();
            assert!(error.contains(says), "{text}: {error}");
            assert!(
                error.contains("\"5s\""),
                "{text}: the form expected is shown: {error}"
            );
        }
    }

    #[test]
    fn what_an_older_version_wrote_still_reads() {
        // The previous parser's own output for 31 days and for a year and a day.
        assert_eq!(
            parse("1month 13h 26m 24s"),
            Ok(Duration::from_secs(31 * 86_400))
        );
        assert_eq!(
            parse("1year 1day"),
            Ok(Duration::from_secs(31_557_600 + 86_400))
        );
        assert_eq!(
            parse("2days 3us"),
            Ok(Duration::from_nanos(2 * 86_400 * 1_000_000_000 + 3_000))
        );
    }

    #[test]
    fn what_is_written_reads_back_the_same() {
        for nanos in [
            0u64,
            1,
            999,
            1_500_000_000,
            60_000_000_000,
            5_400_000_000_000,
            86_400_000_000_000 * 31 + 7,
            u64::MAX,
        ] {
            let duration = Duration::from_nanos(nanos);
            let text = format(duration).to_string();
            assert_eq!(parse(&text), Ok(duration), "{text}");
        }
        assert_eq!(format(Duration::from_millis(100)).to_string(), "100ms");
        assert_eq!(format(Duration::from_secs(5400)).to_string(), "1h 30m");
    }
}
