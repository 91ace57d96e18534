//! Byte sizes for people: `8 KiB` out, `128k` / `16MiB` / `4096` in. Command lines and
//! benchmark scripts read units as binary (1 KiB = 1024 B), as storage benchmarks
//! conventionally do, so `k`, `kb` and `kib` all mean 1024 ([`parse_size`]). Configuration
//! files read the two-letter units as decimal and accept a fraction that comes to whole
//! bytes (`10MB` = 10,000,000, `1.5GiB`) ([`parse_size_si`]). Both are one parser.

use std::fmt;

const UNITS: [(&str, u64); 6] = [
    ("EiB", 1 << 60),
    ("PiB", 1 << 50),
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
];

/// Formats a byte count with the largest binary unit not exceeding it: `512 B`, `8 KiB`,
/// `1 MiB`, `1.5 KiB`. Exact multiples print without decimals (and parse back exactly with
/// [`parse_size`]); other values are rounded to one or two decimals (`1.0 KiB` for 1025).
pub fn format_size(bytes: u64) -> String {
    for (name, unit) in UNITS {
        if bytes >= unit {
            if bytes.is_multiple_of(unit) {
                return format!("{} {name}", bytes / unit);
            }
            // Keep one decimal at least, so an inexact size never looks exact.
            let value = format!("{:.2}", bytes as f64 / unit as f64);
            let value = value.strip_suffix('0').unwrap_or(&value);
            return format!("{value} {name}");
        }
    }
    format!("{bytes} B")
}

/// Why a size string was rejected by [`parse_size`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeError {
    /// Nothing but whitespace.
    Empty,
    /// The string does not start with a decimal integer.
    NoNumber(String),
    /// The suffix is not one of b, k, kb, kib, m, mb, mib, g, ... (any case).
    UnknownUnit(String),
    /// The value does not fit in 64 bits.
    Overflow(String),
    /// A fractional value that does not come to a whole number of bytes.
    NotWhole(String),
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeError::Empty => write!(f, "empty size"),
            SizeError::NoNumber(s) => write!(f, "size {s:?} does not start with a number"),
            SizeError::UnknownUnit(s) => write!(
                f,
                "size {s:?} has an unknown unit (use B, K/KiB, M/MiB, G/GiB, T/TiB)"
            ),
            SizeError::Overflow(s) => write!(f, "size {s:?} is too large"),
            SizeError::NotWhole(s) => write!(f, "size {s:?} is not a whole number of bytes"),
        }
    }
}

impl std::error::Error for SizeError {}

/// Parses a byte size: a decimal integer, optional whitespace, and an optional binary unit
/// (`128k`, `1m`, `16MiB`, `8 KiB`, `4096`, `512B`). Units are case-insensitive.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    parse(text, Dialect::Binary)
}

/// Parses a byte size as configuration files write it: like [`parse_size`], except that
/// `kb`, `mb`, `gb`, `tb`, `pb` and `eb` are decimal (`10MB` = 10,000,000) and the number
/// may have a fraction when the result is a whole number of bytes (`1.5GiB`).
pub fn parse_size_si(text: &str) -> Result<u64, SizeError> {
    parse(text, Dialect::Si)
}

/// How the two-letter units read, and whether a fraction is allowed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Binary,
    Si,
}

fn parse(text: &str, dialect: Dialect) -> Result<u64, SizeError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(SizeError::Empty);
    }
    let is_number = |c: char| c.is_ascii_digit() || (dialect == Dialect::Si && c == '.');
    let number_end = s.find(|c: char| !is_number(c)).unwrap_or(s.len());
    let number = &s[..number_end];
    if !number.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(SizeError::NoNumber(text.to_string()));
    }
    let unit = s[number_end..].trim_start().to_ascii_lowercase();
    let binary = |shift: u32| Some(1u64 << shift);
    let decimal = |power: u32| match dialect {
        Dialect::Binary => binary(power / 3 * 10),
        Dialect::Si => Some(10u64.pow(power)),
    };
    let multiplier = match unit.as_str() {
        "" | "b" => Some(1),
        "k" | "kib" => binary(10),
        "m" | "mib" => binary(20),
        "g" | "gib" => binary(30),
        "t" | "tib" => binary(40),
        "p" | "pib" => binary(50),
        "e" | "eib" => binary(60),
        "kb" => decimal(3),
        "mb" => decimal(6),
        "gb" => decimal(9),
        "tb" => decimal(12),
        "pb" => decimal(15),
        "eb" => decimal(18),
        _ => None,
    }
    .ok_or_else(|| SizeError::UnknownUnit(text.to_string()))?;
    match number.split_once('.') {
        None => number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(multiplier))
            .ok_or_else(|| SizeError::Overflow(text.to_string())),
        Some(_) => {
            let value: f64 = number
                .parse()
                .map_err(|_| SizeError::NoNumber(text.to_string()))?;
            let bytes = value * multiplier as f64;
            if !(bytes.is_finite() && bytes < u64::MAX as f64) {
                Err(SizeError::Overflow(text.to_string()))
            } else if bytes.fract() != 0.0 {
                Err(SizeError::NotWhole(text.to_string()))
            } else {
                Ok(bytes as u64)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn formats_common_sizes() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(1023), "1023 B");
        assert_eq!(format_size(1024), "1 KiB");
        assert_eq!(format_size(8192), "8 KiB");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(1 << 20), "1 MiB");
        assert_eq!(format_size(16 << 20), "16 MiB");
        assert_eq!(format_size(3 << 30), "3 GiB");
        assert_eq!(format_size(1025), "1.0 KiB");
        assert_eq!(format_size((1 << 20) - 1), "1024.0 KiB");
        assert_eq!(format_size(u64::MAX), "16.0 EiB");
    }

    #[test]
    fn parses_common_sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("128k"), Ok(128 * 1024));
        assert_eq!(parse_size("128K"), Ok(128 * 1024));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size(" 8 KiB "), Ok(8192));
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("1tb"), Ok(1 << 40));
    }

    #[test]
    fn rejects_bad_sizes() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert_eq!(parse_size("   "), Err(SizeError::Empty));
        assert!(matches!(parse_size("k"), Err(SizeError::NoNumber(_))));
        assert!(matches!(parse_size("-1"), Err(SizeError::NoNumber(_))));
        assert!(matches!(parse_size("1.5k"), Err(SizeError::UnknownUnit(_))));
        assert!(matches!(parse_size("12x"), Err(SizeError::UnknownUnit(_))));
        assert!(matches!(parse_size("1 2"), Err(SizeError::UnknownUnit(_))));
        assert!(matches!(parse_size("16e"), Err(SizeError::Overflow(_))));
        assert!(matches!(
            parse_size("99999999999999999999"),
            Err(SizeError::Overflow(_))
        ));
        assert!(parse_size("12x").unwrap_err().to_string().contains("12x"));
    }

    #[test]
    fn configuration_sizes() {
        assert_eq!(parse_size_si("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size_si("64k"), Ok(65536));
        assert_eq!(parse_size_si("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size_si("10MB"), Ok(10_000_000));
        assert_eq!(parse_size("10MB"), Ok(10 << 20));
        assert!(matches!(
            parse_size_si("1.0001k"),
            Err(SizeError::NotWhole(_))
        ));
        assert!(matches!(
            parse_size_si("1..5k"),
            Err(SizeError::NoNumber(_))
        ));
        assert!(matches!(parse_size_si(".5k"), Err(SizeError::NoNumber(_))));
        assert!(matches!(parse_size_si("GiB"), Err(SizeError::NoNumber(_))));
        assert!(matches!(
            parse_size_si("99999999999e"),
            Err(SizeError::Overflow(_))
        ));
    }

    proptest! {
        #[test]
        fn exact_multiples_round_trip(value in 1u64..1024, shift in prop::sample::select(vec![0u32, 10, 20, 30, 40, 50])) {
            let bytes = value << shift;
            prop_assert_eq!(parse_size(&format_size(bytes)), Ok(bytes));
        }

        #[test]
        fn formatted_sizes_are_exact_or_show_decimals(bytes in any::<u64>()) {
            let text = format_size(bytes);
            match parse_size(&text) {
                Ok(parsed) => prop_assert_eq!(parsed, bytes),
                Err(_) => prop_assert!(text.contains('.'), "{}", text),
            }
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,12}") {
            let _ = parse_size(&s);
            let _ = parse_size_si(&s);
        }
    }
}
