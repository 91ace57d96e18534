//! MPA FPDU framing (RFC 5044 §4): `ULPDU_Length (2) | ULPDU | PAD (0..3) | CRC (4)`. Markers are
//! never negotiated (see `mpa`), so none are inserted or expected. The CRC field is always present;
//! without negotiated CRC it is sent as zero and ignored on receipt, as Linux siw does.

use crate::crc::Crc32c;
use crate::fields::{be16, need};
use crate::terminate_code::TerminateCode;

/// Largest ULPDU the 16-bit length field can describe.
pub const MAX_ULPDU: usize = 65535;
pub const LEN_FIELD: usize = 2;
pub const CRC_LEN: usize = 4;

/// Zero bytes after the ULPDU so that the length field, ULPDU and pad end on a 4-byte boundary.
pub fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (ulpdu_len + LEN_FIELD) % 4) % 4
}

/// Sizes of one FPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FpduLayout {
    pub ulpdu_len: usize,
    pub pad: usize,
}

impl FpduLayout {
    pub fn new(ulpdu_len: usize) -> FpduLayout {
        FpduLayout {
            ulpdu_len,
            pad: pad_len(ulpdu_len),
        }
    }
    /// Bytes after the ULPDU: pad and CRC.
    pub fn trailer_len(&self) -> usize {
        self.pad + CRC_LEN
    }
    pub fn total(&self) -> usize {
        LEN_FIELD + self.ulpdu_len + self.trailer_len()
    }
}

/// Payload bytes that fit in one FPDU of at most `fpdu_budget` bytes (e.g. the TCP MSS rounded down
/// to a multiple of 8, as siw sizes its FPDUs) after a DDP/RDMAP header of `header_len` bytes.
pub fn max_payload(fpdu_budget: usize, header_len: usize) -> usize {
    let budget = fpdu_budget.min(LEN_FIELD + MAX_ULPDU + 1 + CRC_LEN) & !3;
    let room = budget.saturating_sub(LEN_FIELD + header_len + CRC_LEN);
    let room = room.min(MAX_ULPDU - header_len);
    room & !3
}

/// The trailer (pad + CRC) for an FPDU whose CRC state covers length field, header and payload.
/// Returns the bytes and how many of them to send.
pub fn trailer(layout: &FpduLayout, crc: Option<&mut Crc32c>) -> ([u8; 7], usize) {
    let mut out = [0u8; 7];
    let pad = layout.pad;
    if let Some(c) = crc {
        c.update(&out[..pad]);
        out[pad..pad + 4].copy_from_slice(&c.wire_bytes());
    }
    (out, pad + CRC_LEN)
}

/// Builds one complete FPDU from header bytes (DDP + RDMAP, and any body) and payload.
pub fn encode(header: &[u8], payload: &[u8], crc: bool) -> Vec<u8> {
    let ulpdu = header.len() + payload.len();
    assert!(ulpdu <= MAX_ULPDU, "ULPDU too long for one FPDU");
    let layout = FpduLayout::new(ulpdu);
    let mut out = vec![0u8; layout.total()];
    out[..LEN_FIELD].copy_from_slice(&(ulpdu as u16).to_be_bytes());
    let body = LEN_FIELD + header.len();
    out[LEN_FIELD..body].copy_from_slice(header);
    let end = LEN_FIELD + ulpdu + layout.pad;
    if crc {
        // The payload is copied anyway: its CRC comes with the copy, in one pass.
        let mut c = Crc32c::new();
        c.update(&out[..body]);
        c.update_copy(&mut out[body..body + payload.len()], payload);
        c.update(&[0u8; 3][..layout.pad]);
        out[end..].copy_from_slice(&c.wire_bytes());
    } else {
        out[body..body + payload.len()].copy_from_slice(payload);
    }
    out
}

/// Decodes one FPDU from the front of `buf`. `Ok(None)` means more bytes are needed; the ULPDU
/// range and the bytes used are returned otherwise. A CRC mismatch is an LLP error.
pub fn decode(
    buf: &[u8],
    crc: bool,
) -> Result<Option<(std::ops::Range<usize>, usize)>, TerminateCode> {
    if need(buf, LEN_FIELD).is_err() {
        return Ok(None);
    }
    let ulpdu = be16(buf, 0) as usize;
    let layout = FpduLayout::new(ulpdu);
    if buf.len() < layout.total() {
        return Ok(None);
    }
    if crc {
        let body = LEN_FIELD + ulpdu + layout.pad;
        let want = Crc32c::new().update(&buf[..body]).wire_bytes();
        if buf[body..body + CRC_LEN] != want {
            return Err(TerminateCode::LLP_CRC);
        }
    }
    Ok(Some((LEN_FIELD..LEN_FIELD + ulpdu, layout.total())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pads_to_four() {
        assert_eq!(pad_len(18), 0);
        assert_eq!(pad_len(19), 3);
        assert_eq!(pad_len(554), 0); // the Linux Login Send in the reference capture
        assert_eq!(FpduLayout::new(554).total(), 560);
    }

    #[test]
    fn budget_sizing_like_siw() {
        // MSS 1460 rounded down to 1456: a tagged FPDU carries 1456 - 16 - 4 = 1436 payload bytes.
        let p = max_payload(1456, 14);
        assert_eq!(p, 1436);
        assert_eq!(FpduLayout::new(14 + p).total(), 1456);
        assert!(max_payload(1 << 20, 14) + 14 <= MAX_ULPDU);
    }

    #[test]
    fn crc_detects_corruption() {
        let mut f = encode(
            &[0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0],
            b"hello",
            true,
        );
        assert!(decode(&f, true).unwrap().is_some());
        f[21] ^= 1;
        assert_eq!(decode(&f, true), Err(TerminateCode::LLP_CRC));
        assert!(
            decode(&f, false).unwrap().is_some(),
            "CRC ignored when not negotiated"
        );
    }

    proptest! {
        #[test]
        fn round_trip(hdr in proptest::collection::vec(any::<u8>(), 14..48), payload in proptest::collection::vec(any::<u8>(), 0..3000), crc in any::<bool>()) {
            let f = encode(&hdr, &payload, crc);
            prop_assert_eq!(f.len() % 4, 0);
            let (range, used) = decode(&f, crc).unwrap().unwrap();
            prop_assert_eq!(used, f.len());
            prop_assert_eq!(&f[range.clone()][..hdr.len()], &hdr[..]);
            prop_assert_eq!(&f[range][hdr.len()..], &payload[..]);
            prop_assert_eq!(decode(&f[..f.len() - 1], crc).unwrap(), None);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200), crc in any::<bool>()) {
            let _ = decode(&bytes, crc);
        }
    }
}
