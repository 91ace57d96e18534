//! RDMAP bodies (RFC 5040): the RDMA Read Request and the Terminate message, and the error codes
//! a Terminate carries.

use crate::ddp::{DdpHeader, TAGGED_LEN, UNTAGGED_LEN};
use crate::fields::{be16, be32, be64, need, WireError};

// Kept here too so `iwarp::rdmap::TerminateCode` still names the code a Terminate carries.
pub use crate::terminate_code::{TermLayer, TerminateCode};

/// RDMA Read Request body (after the untagged header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest {
    pub sink_stag: u32,
    pub sink_to: u64,
    pub size: u32,
    pub src_stag: u32,
    pub src_to: u64,
}

impl ReadRequest {
    pub const LEN: usize = 28;

    pub fn encode(&self) -> [u8; 28] {
        let mut b = [0u8; 28];
        b[0..4].copy_from_slice(&self.sink_stag.to_be_bytes());
        b[4..12].copy_from_slice(&self.sink_to.to_be_bytes());
        b[12..16].copy_from_slice(&self.size.to_be_bytes());
        b[16..20].copy_from_slice(&self.src_stag.to_be_bytes());
        b[20..28].copy_from_slice(&self.src_to.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<ReadRequest, WireError> {
        need(b, Self::LEN)?;
        Ok(ReadRequest {
            sink_stag: be32(b, 0),
            sink_to: be64(b, 4),
            size: be32(b, 12),
            src_stag: be32(b, 16),
            src_to: be64(b, 20),
        })
    }
}

const HDRCT_M: u8 = 0x80;
const HDRCT_D: u8 = 0x40;
const HDRCT_R: u8 = 0x20;

/// A Terminate message body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terminate {
    pub code: TerminateCode,
    /// Length of the offending DDP segment (M bit).
    pub ddp_segment_len: Option<u16>,
    /// Copy of the offending DDP header, 14 or 18 bytes (D bit).
    pub ddp_header: Option<Vec<u8>>,
    /// Copy of the offending Read Request body, 28 bytes (R bit).
    pub rdmap_header: Option<Vec<u8>>,
}

impl Terminate {
    /// A Terminate about an offending segment whose header we decoded.
    pub fn about(
        code: TerminateCode,
        segment_len: u16,
        header: &[u8],
        read_request: Option<&[u8]>,
    ) -> Terminate {
        let hdr_len = if header.first().is_some_and(|c| c & 0x80 != 0) {
            TAGGED_LEN
        } else {
            UNTAGGED_LEN
        };
        let ddp_header = (header.len() >= hdr_len).then(|| header[..hdr_len].to_vec());
        Terminate {
            code,
            ddp_segment_len: Some(segment_len),
            ddp_header,
            rdmap_header: read_request
                .filter(|r| r.len() >= ReadRequest::LEN)
                .map(|r| r[..ReadRequest::LEN].to_vec()),
        }
    }

    pub fn plain(code: TerminateCode) -> Terminate {
        Terminate {
            code,
            ddp_segment_len: None,
            ddp_header: None,
            rdmap_header: None,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut hdrct = 0;
        if self.ddp_segment_len.is_some() {
            hdrct |= HDRCT_M;
        }
        if self.ddp_header.is_some() {
            hdrct |= HDRCT_D;
        }
        if self.rdmap_header.is_some() {
            hdrct |= HDRCT_R;
        }
        let mut out = vec![
            (self.code.layer << 4) | (self.code.etype & 0x0f),
            self.code.code,
            hdrct,
            0,
        ];
        out.extend_from_slice(&self.ddp_segment_len.unwrap_or(0).to_be_bytes());
        if let Some(h) = &self.ddp_header {
            out.extend_from_slice(h);
        }
        if let Some(r) = &self.rdmap_header {
            out.extend_from_slice(r);
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<Terminate, WireError> {
        need(b, 4)?;
        let code = TerminateCode {
            layer: b[0] >> 4,
            etype: b[0] & 0x0f,
            code: b[1],
        };
        let hdrct = b[2];
        let mut at = 4;
        let mut t = Terminate::plain(code);
        if hdrct & (HDRCT_M | HDRCT_D | HDRCT_R) != 0 {
            need(b, at + 2)?;
            if hdrct & HDRCT_M != 0 {
                t.ddp_segment_len = Some(be16(b, at));
            }
            at += 2;
        }
        if hdrct & HDRCT_D != 0 {
            need(b, at + 1)?;
            let n = DdpHeader::len_from_control(b[at]);
            need(b, at + n)?;
            t.ddp_header = Some(b[at..at + n].to_vec());
            at += n;
        }
        if hdrct & HDRCT_R != 0 {
            need(b, at + ReadRequest::LEN)?;
            t.rdmap_header = Some(b[at..at + ReadRequest::LEN].to_vec());
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ddp::{Opcode, TaggedHeader};
    use proptest::prelude::*;

    #[test]
    fn terminate_bytes() {
        let hdr = DdpHeader::Tagged(TaggedHeader {
            last: true,
            opcode: Opcode::RdmaWrite,
            stag: 7,
            to: 9,
        })
        .to_bytes();
        let t = Terminate::about(TerminateCode::DDP_TAGGED_BASE_BOUNDS, 100, &hdr, None);
        let b = t.encode();
        assert_eq!(&b[..6], &[0x11, 0x01, 0xc0, 0x00, 0x00, 100]);
        assert_eq!(&b[6..], &hdr[..]);
        assert_eq!(Terminate::decode(&b).unwrap(), t);
    }

    proptest! {
        #[test]
        fn read_request_round_trip(a in any::<u32>(), b in any::<u64>(), c in any::<u32>(), d in any::<u32>(), e in any::<u64>()) {
            let r = ReadRequest { sink_stag: a, sink_to: b, size: c, src_stag: d, src_to: e };
            prop_assert_eq!(ReadRequest::decode(&r.encode()).unwrap(), r);
        }

        #[test]
        fn terminate_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Terminate::decode(&bytes);
        }
    }
}
