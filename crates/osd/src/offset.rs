//! The 32-bit data-in/data-out buffer offset encoding (OSD-2 4.15.5):
//! bits 31..28 a signed exponent, bits 27..0 a mantissa, and
//! byte offset = mantissa << (exponent + 8). 0xFFFF_FFFF means "unused".

/// The raw value that says "no buffer at this offset".
pub const UNUSED: u32 = 0xFFFF_FFFF;

const MANTISSA_MASK: u32 = 0x0FFF_FFFF;
/// Exponents below -5 would give an alignment under 8 bytes, which OSD-2 forbids.
const MIN_EXPONENT: i32 = -5;
const MAX_EXPONENT: i32 = 7;

/// A valid, used buffer offset, kept in its wire form so encoding never fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offset(u32);

impl Offset {
    /// Decodes a raw field: `Ok(None)` for "unused", `Err(())` for an exponent below -5.
    #[allow(clippy::result_unit_err)]
    pub fn decode(raw: u32) -> Result<Option<Offset>, ()> {
        if raw == UNUSED {
            return Ok(None);
        }
        if exponent(raw) < MIN_EXPONENT {
            return Err(());
        }
        Ok(Some(Offset(raw)))
    }

    /// The offset that encodes `bytes` exactly, if one exists. Non-negative exponents
    /// are preferred: decoders that still apply OSD-1's unsigned rule read them the same.
    pub fn from_bytes(bytes: u64) -> Option<Offset> {
        let fits = |e: i32| {
            let shift = (e + 8) as u32;
            bytes.trailing_zeros() >= shift || bytes == 0
        };
        let candidates = (0..=MAX_EXPONENT).chain((MIN_EXPONENT..0).rev());
        for e in candidates {
            if !fits(e) {
                continue;
            }
            let mantissa = bytes >> (e + 8);
            if mantissa > u64::from(MANTISSA_MASK) {
                continue;
            }
            let raw = ((e as u32 & 0xF) << 28) | mantissa as u32;
            if raw != UNUSED {
                return Some(Offset(raw));
            }
        }
        None
    }

    /// The byte offset this value stands for.
    pub fn bytes(self) -> u64 {
        u64::from(self.0 & MANTISSA_MASK) << (exponent(self.0) + 8)
    }

    /// The wire form.
    pub fn raw(self) -> u32 {
        self.0
    }
}

/// The raw field for an optional offset.
pub fn raw_of(offset: Option<Offset>) -> u32 {
    offset.map_or(UNUSED, Offset::raw)
}

fn exponent(raw: u32) -> i32 {
    // Sign-extend the top nibble.
    ((raw as i32) >> 28) as i8 as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unused_is_none() {
        assert_eq!(Offset::decode(UNUSED), Ok(None));
    }

    #[test]
    fn small_exponents_are_refused() {
        // Exponent -6 (0xA) means 4-byte granularity.
        assert!(Offset::decode(0xA000_0001).is_err());
    }

    #[test]
    fn round_trips() {
        for bytes in [
            0u64,
            8,
            16,
            24,
            256,
            512,
            4096,
            1 << 20,
            3 << 30,
            0x7FF_FFF8,
        ] {
            let o = Offset::from_bytes(bytes).unwrap();
            assert_eq!(o.bytes(), bytes, "offset {bytes}");
            assert_eq!(Offset::decode(o.raw()).unwrap(), Some(o));
        }
    }

    #[test]
    fn multiples_of_256_use_a_non_negative_exponent() {
        let o = Offset::from_bytes(4096).unwrap();
        assert_eq!(o.raw() >> 28, 0);
        assert_eq!(o.raw(), 16);
    }

    #[test]
    fn negative_exponent_for_fine_alignment() {
        let o = Offset::from_bytes(24).unwrap();
        assert!(o.raw() >> 28 >= 0xB);
        assert_eq!(o.bytes(), 24);
        // Not 8-byte aligned: not representable.
        assert!(Offset::from_bytes(12).is_none());
    }
}
