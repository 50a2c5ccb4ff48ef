//! Durations as a configuration writes them: a number of seconds (`30`, `2.5`) or a string
//! (`"90s"`, `"500ms"`, `"2m"`, `"1h"`; `"off"` where a setting can be turned off), from 1 ms
//! to a year.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Liveness;

impl<'de> Deserialize<'de> for Liveness {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match d.deserialize_any(RawDuration { off: true })? {
            Raw::Word(w) if w.trim().eq_ignore_ascii_case("off") => Ok(Liveness::Off),
            raw => raw.duration(true).map(Liveness::Every),
        }
        .map_err(serde::de::Error::custom)
    }
}

impl Serialize for Liveness {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Liveness::Every(d) => s.serialize_str(&written(*d)),
            Liveness::Off => s.serialize_str("off"),
        }
    }
}

/// A duration as a configuration writes it, read back the same: `"500ms"`, `"90s"`,
/// `"2.5s"`.
fn written(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d < Duration::from_secs(1) && d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}s", quiver_contract::short_number(d.as_secs_f64()))
    }
}

/// Writes an optional duration as [`written`] gives it (a configuration shown back).
pub(super) fn ser_duration<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&written(*d)),
        None => s.serialize_none(),
    }
}

/// A duration as written: a number of seconds or a string.
enum Raw {
    Secs(f64, String),
    Word(String),
}

impl Raw {
    fn duration(self, off: bool) -> Result<Duration, String> {
        match self {
            Raw::Secs(secs, written) => seconds(secs, &written, off),
            Raw::Word(w) => parse_duration(&w, off),
        }
    }
}

/// Reads a duration's raw form, saying what is expected when it is neither (serde's
/// untagged enums say only "data did not match any variant").
struct RawDuration {
    /// Whether `off` is a value too (`liveness`).
    off: bool,
}

impl serde::de::Visitor<'_> for RawDuration {
    type Value = Raw;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(if self.off {
            "a duration: seconds (30, 2.5), a string such as \"90s\" or \"500ms\", or \"off\""
        } else {
            "a duration: seconds (30, 2.5) or a string such as \"90s\" or \"500ms\""
        })
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Raw, E> {
        Ok(Raw::Secs(v as f64, v.to_string()))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Raw, E> {
        Ok(Raw::Secs(v as f64, v.to_string()))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Raw, E> {
        // Quoted back short: `1e300`, not its 301 digits.
        Ok(Raw::Secs(v, quiver_contract::short_number(v)))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Raw, E> {
        Ok(Raw::Word(v.to_owned()))
    }
}

pub(super) fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    struct Maybe;
    impl<'de> serde::de::Visitor<'de> for Maybe {
        type Value = Option<Raw>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            RawDuration { off: false }.expecting(f)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(RawDuration { off: false }).map(Some)
        }
    }
    match d.deserialize_option(Maybe)? {
        None => Ok(None),
        Some(raw) => raw
            .duration(false)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

/// A number of seconds as a duration, bounded.
fn seconds(secs: f64, written: &str, off: bool) -> Result<Duration, String> {
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!(
            "duration {written:?} must be a positive number of seconds{}",
            if off { " (or `off`)" } else { "" }
        ));
    }
    let d = Duration::try_from_secs_f64(secs)
        .map_err(|_| format!("duration {written:?} is longer than a year"))?;
    // Positive, however small (1e-12 rounds to no nanosecond): too short, not zero.
    if secs > 0.0 && d < MIN_DURATION {
        return Err(too_short(written));
    }
    bounded(d, written, off)
}

/// Parses `250ms`, `30s`, `2.5s`, `2m`, `1h` or a bare number of seconds.
fn parse_duration(s: &str, off: bool) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let expected = if off {
        "expected e.g. `30s`, `500ms`, `2.5s` or `off`"
    } else {
        "expected e.g. `30s`, `500ms` or `2.5s`"
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: {expected}"))?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        other => {
            return Err(format!(
                "invalid duration unit {other:?} in {s:?}: {expected} (units: ms, s, m, h)"
            ));
        }
    };
    seconds(secs, s, off)
}

/// The longest duration a setting takes: a year (longer ones overflow deadlines).
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// The shortest duration a setting takes (as `[limits]` does): a shorter one times out
/// before anything starts.
const MIN_DURATION: Duration = Duration::from_millis(1);

/// Why `as_written`, a positive duration under [`MIN_DURATION`], is refused.
fn too_short(as_written: &str) -> String {
    format!(
        "duration {as_written:?} is shorter than 1 ms, the shortest this setting takes (write e.g. \"1ms\")"
    )
}

/// A configured duration: more than zero, from [`MIN_DURATION`] to [`MAX_DURATION`].
fn bounded(d: Duration, as_written: &str, off: bool) -> Result<Duration, String> {
    if d.is_zero() {
        Err(format!(
            "duration {as_written:?} must be more than 0{}",
            if off {
                " (to turn it off, write \"off\")"
            } else {
                ""
            }
        ))
    } else if d < MIN_DURATION {
        Err(too_short(as_written))
    } else if d > MAX_DURATION {
        Err(format!("duration {as_written:?} is longer than a year"))
    } else {
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert!(
            parse_duration("0s", false)
                .unwrap_err()
                .contains("more than 0")
        );
        assert!(
            parse_duration("99999999999999999h", false)
                .unwrap_err()
                .contains("longer than a year")
        );
        assert_eq!(parse_duration("8760h", false).unwrap(), MAX_DURATION);
        assert_eq!(
            parse_duration("30s", false).unwrap(),
            Duration::from_secs(30)
        );
        assert_eq!(
            parse_duration("250ms", false).unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            parse_duration("2m", false).unwrap(),
            Duration::from_secs(120)
        );
        assert_eq!(
            parse_duration("2.5s", false).unwrap(),
            Duration::from_millis(2500)
        );
        assert!(parse_duration("fast", false).is_err());
        // Positive but under 1 ms: said so (it was "must be more than 0").
        for tiny in ["0.0001ms", "0.0000001", "0.000000000001"] {
            let e = parse_duration(tiny, false).unwrap_err();
            assert!(e.contains("is shorter than 1 ms"), "{tiny}: {e}");
        }
        assert_eq!(
            parse_duration("1ms", false).unwrap(),
            Duration::from_millis(1)
        );
        // A float is quoted back short, whatever its size.
        for (secs, shown) in [(1e300, "\"1e300\""), (1e-12, "\"1e-12\"")] {
            let Raw::Secs(v, written) = serde::de::Visitor::visit_f64::<serde::de::value::Error>(
                RawDuration { off: false },
                secs,
            )
            .unwrap() else {
                panic!()
            };
            let e = seconds(v, &written, false).unwrap_err();
            assert!(e.contains(shown), "{e}");
            assert!(!e.contains("more than 0"), "{e}");
        }
    }
}
