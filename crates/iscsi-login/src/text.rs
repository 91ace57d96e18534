//! The iSCSI text data format: `key=value` pairs, each terminated by one
//! NUL byte (RFC 7143 §6.1), plus helpers for the value encodings: numbers
//! (decimal or `0x` hex), binary items (`0x` hex or `0b` base64) and lists.

use std::fmt;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;

/// Longest key name allowed (RFC 7143 §6.1: at most 63 bytes).
pub const KEY_MAX: usize = 63;
/// Longest value allowed for ordinary keys (255 bytes).
pub const VALUE_MAX: usize = 255;
/// Longest value allowed for keys that carry large binary items (CHAP
/// challenges/responses, SRP/Kerberos/SPKM tokens): a 1024-byte item in hex
/// is 2050 characters; leave room for base64 and vendor variants.
pub const LONG_VALUE_MAX: usize = 4096;

/// A text data segment that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextError {
    /// A `key=value` item without the `=`.
    MissingEquals { item: usize },
    /// An item starting with `=`.
    EmptyKey { item: usize },
    /// A key longer than 63 bytes.
    KeyTooLong { item: usize, len: usize },
    /// A value longer than allowed for its key.
    ValueTooLong { key: String, len: usize },
    /// An item that is not UTF-8.
    BadUtf8 { item: usize },
}

impl fmt::Display for TextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TextError::MissingEquals { item } => write!(f, "text item {item} has no '='"),
            TextError::EmptyKey { item } => write!(f, "text item {item} has an empty key"),
            TextError::KeyTooLong { item, len } => {
                write!(f, "text item {item}: key of {len} bytes (max {KEY_MAX})")
            }
            TextError::ValueTooLong { key, len } => {
                write!(f, "value of {key} is {len} bytes long, over its limit")
            }
            TextError::BadUtf8 { item } => write!(f, "text item {item} is not UTF-8"),
        }
    }
}

impl std::error::Error for TextError {}

/// Keys whose values may exceed 255 bytes (large binary items).
pub fn allows_long_value(key: &str) -> bool {
    matches!(
        key,
        "CHAP_C" | "CHAP_R" | "KRB_AP_REQ" | "KRB_AP_REP" | "SPKM_REQ" | "SPKM_ERROR"
    ) || key.starts_with("SRP_")
        || key.starts_with("SPKM-")
}

/// Splits a text data segment into `(key, value)` pairs, in order.
///
/// Empty items (runs of NUL bytes, e.g. padding) are skipped; a final item
/// without its NUL terminator is accepted. Keys must be 1..=63 bytes;
/// values at most 255 bytes except for the large-binary keys.
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    let mut out = Vec::new();
    for (index, raw) in data.split(|&b| b == 0).enumerate() {
        if raw.is_empty() {
            continue;
        }
        let item = std::str::from_utf8(raw).map_err(|_| TextError::BadUtf8 { item: index })?;
        let (key, value) = item
            .split_once('=')
            .ok_or(TextError::MissingEquals { item: index })?;
        if key.is_empty() {
            return Err(TextError::EmptyKey { item: index });
        }
        if key.len() > KEY_MAX {
            return Err(TextError::KeyTooLong {
                item: index,
                len: key.len(),
            });
        }
        let limit = if allows_long_value(key) {
            LONG_VALUE_MAX
        } else {
            VALUE_MAX
        };
        if value.len() > limit {
            return Err(TextError::ValueTooLong {
                key: key.to_string(),
                len: value.len(),
            });
        }
        out.push((key.to_string(), value.to_string()));
    }
    Ok(out)
}

/// Encodes pairs as `key=value\0` items, in order.
pub fn encode<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_ref().as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_ref().as_bytes());
        out.push(0);
    }
    out
}

/// A value that is not a valid number or binary item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueError(pub String);

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad value: {}", self.0)
    }
}

impl std::error::Error for ValueError {}

fn strip_prefix_ci<'a>(s: &'a str, lower: &str) -> Option<&'a str> {
    let upper = lower.to_ascii_uppercase();
    s.strip_prefix(lower)
        .or_else(|| s.strip_prefix(upper.as_str()))
}

/// Parses a numerical value: decimal, `0x`/`0X` hex, or `0b`/`0B` base64
/// (a big-endian binary item of at most 8 bytes). No sign, no spaces.
pub fn parse_number(s: &str) -> Result<u64, ValueError> {
    let bad = || ValueError(format!("not a number: {s:?}"));
    if let Some(hex) = strip_prefix_ci(s, "0x") {
        if hex.is_empty() || hex.len() > 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        return u64::from_str_radix(hex, 16).map_err(|_| bad());
    }
    if strip_prefix_ci(s, "0b").is_some() {
        let bytes = parse_binary(s)?;
        if bytes.is_empty() || bytes.len() > 8 {
            return Err(bad());
        }
        return Ok(bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)));
    }
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    s.parse::<u64>().map_err(|_| bad())
}

/// Parses a number and checks it lies in `min..=max`.
pub fn parse_number_in(s: &str, min: u64, max: u64) -> Result<u64, ValueError> {
    let n = parse_number(s)?;
    if n < min || n > max {
        return Err(ValueError(format!("{n} is outside {min}..={max}")));
    }
    Ok(n)
}

fn base64_engine() -> GeneralPurpose {
    GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    )
}

/// Decodes a binary item: `0x`/`0X` followed by hex digits (an odd count
/// has an implied leading zero) or `0b`/`0B` followed by base64.
pub fn parse_binary(s: &str) -> Result<Vec<u8>, ValueError> {
    if let Some(hex) = strip_prefix_ci(s, "0x") {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ValueError(format!("bad hex item: {s:?}")));
        }
        let digits: Vec<u8> = hex
            .bytes()
            .map(|b| match b {
                b'0'..=b'9' => b - b'0',
                b'a'..=b'f' => b - b'a' + 10,
                _ => b - b'A' + 10,
            })
            .collect();
        let mut out = Vec::with_capacity(digits.len().div_ceil(2));
        let mut rest = &digits[..];
        if digits.len() % 2 == 1 {
            out.push(digits[0]);
            rest = &digits[1..];
        }
        for pair in rest.chunks(2) {
            out.push((pair[0] << 4) | pair[1]);
        }
        return Ok(out);
    }
    if let Some(b64) = strip_prefix_ci(s, "0b") {
        if b64.is_empty() {
            return Err(ValueError(format!("empty base64 item: {s:?}")));
        }
        return base64_engine()
            .decode(b64)
            .map_err(|_| ValueError(format!("bad base64 item: {s:?}")));
    }
    Err(ValueError(format!(
        "binary item without 0x/0b prefix: {s:?}"
    )))
}

/// Encodes bytes as a `0x` lower-case hex item.
pub fn encode_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 + bytes.len() * 2);
    s.push_str("0x");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Encodes bytes as a `0b` base64 item (with padding).
pub fn encode_base64(bytes: &[u8]) -> String {
    format!(
        "0b{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// Splits a list value (`a,b,c`) into its items.
pub fn split_list(s: &str) -> Vec<&str> {
    s.split(',').collect()
}

/// Parses `Yes`/`No` (exact case, as the RFC spells them).
pub fn parse_bool(s: &str) -> Result<bool, ValueError> {
    match s {
        "Yes" => Ok(true),
        "No" => Ok(false),
        _ => Err(ValueError(format!("not Yes/No: {s:?}"))),
    }
}

/// `Yes` or `No`.
pub fn bool_str(b: bool) -> &'static str {
    if b {
        "Yes"
    } else {
        "No"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_keeps_order_and_skips_padding() {
        let data = b"InitiatorName=iqn.x\0TargetName=iqn.y\0\0\0";
        let pairs = parse(data).unwrap();
        assert_eq!(
            pairs,
            vec![
                ("InitiatorName".to_string(), "iqn.x".to_string()),
                ("TargetName".to_string(), "iqn.y".to_string())
            ]
        );
    }

    #[test]
    fn parse_accepts_empty_value_and_equals_in_value() {
        let pairs = parse(b"SendTargets=\0X-a=b=c\0").unwrap();
        assert_eq!(pairs[0], ("SendTargets".into(), "".into()));
        assert_eq!(pairs[1], ("X-a".into(), "b=c".into()));
    }

    #[test]
    fn parse_rejects_bad_items() {
        assert_eq!(parse(b"Foo\0"), Err(TextError::MissingEquals { item: 0 }));
        assert_eq!(parse(b"a=b\0=c\0"), Err(TextError::EmptyKey { item: 1 }));
        assert_eq!(parse(b"a=\xff\0"), Err(TextError::BadUtf8 { item: 0 }));
        let long_key = format!("{}=1\0", "K".repeat(64));
        assert!(matches!(
            parse(long_key.as_bytes()),
            Err(TextError::KeyTooLong { len: 64, .. })
        ));
        let ok_key = format!("{}=1\0", "K".repeat(63));
        assert!(parse(ok_key.as_bytes()).is_ok());
        let long_val = format!("TargetAlias={}\0", "v".repeat(256));
        assert!(matches!(
            parse(long_val.as_bytes()),
            Err(TextError::ValueTooLong { len: 256, .. })
        ));
        let chap = format!("CHAP_C=0x{}\0", "ab".repeat(1024));
        assert!(parse(chap.as_bytes()).is_ok());
    }

    #[test]
    fn parse_accepts_unterminated_last_item() {
        assert_eq!(parse(b"a=1\0b=2").unwrap().len(), 2);
    }

    #[test]
    fn encode_round_trips() {
        let pairs = vec![("A", "1"), ("B", "")];
        let bytes = encode(&pairs);
        assert_eq!(bytes, b"A=1\0B=\0");
        let back = parse(&bytes).unwrap();
        assert_eq!(
            back,
            vec![("A".into(), "1".into()), ("B".into(), "".into())]
        );
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_number("8192"), Ok(8192));
        assert_eq!(parse_number("0x2000"), Ok(8192));
        assert_eq!(parse_number("0X2000"), Ok(8192));
        assert_eq!(parse_number("0bIAA="), Ok(8192));
        assert_eq!(parse_number("0BIAA="), Ok(8192));
        for bad in [
            "",
            "-1",
            "+1",
            " 1",
            "1 ",
            "0x",
            "0xg",
            "12a",
            "99999999999999999999999",
        ] {
            assert!(parse_number(bad).is_err(), "{bad:?}");
        }
        assert!(parse_number_in("511", 512, 16_777_215).is_err());
        assert!(parse_number_in("16777216", 512, 16_777_215).is_err());
        assert_eq!(parse_number_in("512", 512, 16_777_215), Ok(512));
    }

    #[test]
    fn binaries() {
        assert_eq!(parse_binary("0x0a0B"), Ok(vec![0x0a, 0x0b]));
        assert_eq!(parse_binary("0XABC"), Ok(vec![0x0a, 0xbc]));
        assert_eq!(parse_binary("0bAQID"), Ok(vec![1, 2, 3]));
        assert_eq!(parse_binary("0BAQID"), Ok(vec![1, 2, 3]));
        assert_eq!(parse_binary("0bAQI"), Ok(vec![1, 2]));
        assert!(parse_binary("0x").is_err());
        assert!(parse_binary("0b").is_err());
        assert!(parse_binary("0b!!").is_err());
        assert!(parse_binary("abcd").is_err());
        let bytes = [0u8, 1, 254, 255, 16];
        assert_eq!(parse_binary(&encode_hex(&bytes)).unwrap(), bytes);
        assert_eq!(parse_binary(&encode_base64(&bytes)).unwrap(), bytes);
        assert_eq!(encode_hex(&[0xde, 0xad]), "0xdead");
    }

    #[test]
    fn booleans() {
        assert_eq!(parse_bool("Yes"), Ok(true));
        assert_eq!(parse_bool("No"), Ok(false));
        assert!(parse_bool("yes").is_err());
        assert!(parse_bool("").is_err());
    }
}
