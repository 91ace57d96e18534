//! Byte sizes for people: `8 KiB` out, `128k` / `16MiB` / `4096` in. Units are binary (1 KiB =
//! 1024 B) in both directions, as storage benchmarks conventionally use them; `k`, `kb` and `kib`
//! all mean 1024.

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
        }
    }
}

impl std::error::Error for SizeError {}

/// Parses a byte size: a decimal integer, optional whitespace, and an optional binary unit
/// (`128k`, `1m`, `16MiB`, `8 KiB`, `4096`, `512B`). Units are case-insensitive.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(SizeError::Empty);
    }
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits_end == 0 {
        return Err(SizeError::NoNumber(text.to_string()));
    }
    let number: u64 = s[..digits_end]
        .parse()
        .map_err(|_| SizeError::Overflow(text.to_string()))?;
    let unit = s[digits_end..].trim_start().to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        "e" | "eb" | "eib" => 60,
        _ => return Err(SizeError::UnknownUnit(text.to_string())),
    };
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| SizeError::Overflow(text.to_string()))
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
        }
    }
}
