//! Go `time.ParseDuration` syntax, so flag values copied from upstream manifests
//! (`15s`, `5m0s`, `1h30m`, `1.5h`, `300ms`) mean the same thing here.

use std::time::Duration;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {value:?}: {reason} (use Go syntax such as 300ms, 15s, 5m0s, 1h30m)")]
pub struct ParseDurationError {
    value: String,
    reason: &'static str,
}

/// Parses a Go duration string. Negative durations are rejected: no flag of
/// ours means anything with one.
pub fn parse(value: &str) -> Result<Duration, ParseDurationError> {
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

/// Formats like Go's `Duration.String()` for whole units (used in help text
/// and logs so operators see the upstream spelling, e.g. `5m0s`).
pub fn format(d: Duration) -> String {
    let total_ms = d.as_millis();
    if total_ms == 0 {
        return "0s".to_string();
    }
    if total_ms < 1000 {
        return format!("{total_ms}ms");
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let frac = d.subsec_millis();
    let s_part = if frac == 0 {
        format!("{s}s")
    } else {
        format!("{s}.{}s", format!("{frac:03}").trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => s_part,
        (0, m) => format!("{m}m{s_part}"),
        (h, m) => format!("{h}h{m}m{s_part}"),
    }
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

    #[test]
    fn formats_like_go() {
        assert_eq!(format(Duration::from_secs(300)), "5m0s");
        assert_eq!(format(Duration::from_secs(15)), "15s");
        assert_eq!(format(Duration::from_millis(200)), "200ms");
        assert_eq!(format(Duration::from_secs(3661)), "1h1m1s");
        for d in [1u64, 15, 59, 60, 61, 3600, 86399] {
            assert_eq!(
                parse(&format(Duration::from_secs(d))),
                Ok(Duration::from_secs(d))
            );
        }
    }
}
