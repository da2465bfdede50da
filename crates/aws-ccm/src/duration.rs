//! Go `time.ParseDuration` syntax, so flag values copied from upstream manifests
//! (`15s`, `5m0s`, `1h30m`, `1.5h`, `300ms`) mean the same thing here.

use std::time::Duration;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {value:?}: {reason} (use Go syntax such as 300ms, 15s, 5m0s, 1h30m)")]
pub(crate) struct ParseDurationError {
    value: String,
    reason: &'static str,
}

/// Parses a Go duration string. Negative durations are rejected: no flag of
/// ours means anything with one.
pub(crate) fn parse(value: &str) -> Result<Duration, ParseDurationError> {
    let err = |reason| ParseDurationError {
        value: value.to_string(),
        reason,
    };
    let s = value.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    if s.starts_with('-') {
        return Err(err("negative"));
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = s;
    let mut total_nanos: f64 = 0.0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| err("missing unit"))?;
        if number_len == 0 {
            return Err(err("expected a number"));
        }
        let number: f64 = rest[..number_len].parse().map_err(|_| err("bad number"))?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos_per_unit = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(err("unknown unit")),
        };
        rest = &rest[unit_len..];
        total_nanos += number * nanos_per_unit;
    }
    if !total_nanos.is_finite() || total_nanos > u64::MAX as f64 {
        return Err(err("overflow"));
    }
    Ok(Duration::from_nanos(total_nanos.round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_upstream_spellings() {
        assert_eq!(parse("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse("5m0s"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse("2us"), Ok(Duration::from_micros(2)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_what_go_rejects() {
        for bad in ["", "15", "s", "1x", "-1s", "1..5s"] {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
        let message = parse("10 minutes").unwrap_err().to_string();
        assert!(
            message.contains("10 minutes") && message.contains("5m0s"),
            "{message}"
        );
    }
}
