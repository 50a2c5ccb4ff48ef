//! Times as the page shows and takes them: UTC, `YYYY-MM-DD HH:MM:SS.mmm`, and a page
//! cursor as microseconds since the Unix epoch.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `at` in UTC, to the millisecond.
pub(crate) fn utc(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// The civil date of a day count since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A cursor: `at` in microseconds since the epoch.
pub(crate) fn cursor(at: SystemTime) -> u128 {
    at.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros()
}

/// The time of a cursor.
pub(crate) fn from_cursor(micros: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(micros)
}

/// A row's page cursor: `MICROS.ROW`, its time in microseconds since the epoch and its
/// row number (the order of calls dispatched in the same microsecond).
pub(crate) fn row_cursor(at: SystemTime, row: u64) -> String {
    format!("{}.{row}", cursor(at))
}

/// A page cursor: `MICROS.ROW` (see [`row_cursor`]), or `MICROS` alone (every call of that
/// microsecond on one side).
pub(crate) fn parse_cursor(text: &str) -> Result<(SystemTime, Option<u64>), String> {
    let bad = || {
        format!(
            "`{text}` is not a page cursor: give MICROS.ROW (the time in microseconds since the epoch, and the row), as the page's links do"
        )
    };
    let (micros, row) = match text.split_once('.') {
        Some((m, r)) => (m, Some(r.parse::<u64>().map_err(|_| bad())?)),
        None => (text, None),
    };
    let micros = micros.parse::<u64>().map_err(|_| bad())?;
    Ok((from_cursor(micros), row))
}

/// A duration for people: `850 µs`, `12.3 ms`, `4.20 s`.
pub(crate) fn took(d: Duration) -> String {
    let us = d.as_micros();
    if us < 1000 {
        format!("{us} µs")
    } else if us < 1_000_000 {
        format!("{:.1} ms", us as f64 / 1000.0)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_in_utc() {
        for (secs, want) in [
            (0, "1970-01-01 00:00:00.000"),
            (951_782_400, "2000-02-29 00:00:00.000"),
            (1_796_601_599, "2026-12-06 23:59:59.000"),
        ] {
            assert_eq!(utc(UNIX_EPOCH + Duration::from_secs(secs)), want);
        }
        let at = from_cursor(1_796_601_599_123_456);
        assert_eq!(cursor(at), 1_796_601_599_123_456);
        assert_eq!(utc(at), "2026-12-06 23:59:59.123");
        assert_eq!(row_cursor(at, 42), "1796601599123456.42");
        assert_eq!(parse_cursor("1796601599123456.42"), Ok((at, Some(42))));
        assert_eq!(parse_cursor("1796601599123456"), Ok((at, None)));
        for bad in ["", "x", "1.x", "1.2.3", "-1.2"] {
            let e = parse_cursor(bad).unwrap_err();
            assert!(e.contains("MICROS.ROW"), "{e}");
        }
        assert_eq!(took(Duration::from_micros(850)), "850 µs");
        assert_eq!(took(Duration::from_micros(12_340)), "12.3 ms");
        assert_eq!(took(Duration::from_millis(4200)), "4.20 s");
    }
}
