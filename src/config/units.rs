//! Human-readable durations (`"250ms"`, `"30s"`, `"24h"`) and sizes (`"1MiB"`, `"512KiB"`),
//! parsed once when the file is loaded so the request path only ever sees numbers.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// A duration written as a string with a unit, such as `"250ms"`, `"30s"` or `"24h"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration with a unit, such as \"250ms\", \"30s\" or \"24h\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<HumanDuration, E> {
                // humantime's own messages ("unknown time unit", "expected number at 0") speak
                // of its parser, not of the file.
                humantime::parse_duration(s.trim())
                    .map(HumanDuration)
                    .map_err(|_| E::custom(format!("{s:?} is not a duration: expected a duration such as 5s or 250ms")))
            }
        }
        d.deserialize_str(V)
    }
}

/// A size in bytes written as a string with a unit, such as `"1MiB"` or `"64KiB"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanSize(pub u64);

impl<'de> Deserialize<'de> for HumanSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HumanSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size with a unit, such as \"1MiB\" or \"64KiB\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<HumanSize, E> {
                s.trim()
                    .parse::<bytesize::ByteSize>()
                    .map(|b| HumanSize(b.as_u64()))
                    .map_err(|_| E::custom(format!("{s:?} is not a size: expected a size such as 64KiB or 1MiB")))
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct T {
        d: Option<HumanDuration>,
        s: Option<HumanSize>,
    }

    fn parse(text: &str) -> Result<T, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn durations_take_common_units() {
        for (text, want) in [
            ("250ms", Duration::from_millis(250)),
            ("30s", Duration::from_secs(30)),
            ("24h", Duration::from_secs(86_400)),
            ("1m 30s", Duration::from_secs(90)),
        ] {
            let t = parse(&format!("d = {text:?}")).unwrap();
            assert_eq!(t.d, Some(HumanDuration(want)), "{text}");
        }
    }

    #[test]
    fn durations_without_unit_or_as_numbers_are_rejected() {
        assert!(parse("d = \"30\"").is_err());
        assert!(parse("d = \"3x\"").is_err());
        assert!(parse("d = 30").is_err());
    }

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse("s = \"1MiB\"").unwrap().s, Some(HumanSize(1 << 20)));
        assert_eq!(parse("s = \"64KiB\"").unwrap().s, Some(HumanSize(64 << 10)));
        assert_eq!(parse("s = \"100\"").unwrap().s, Some(HumanSize(100)));
        assert!(parse("s = \"lots\"").is_err());
        assert!(parse("s = 5").is_err());
    }
}
