//! The PDUs of NVMe/TCP: their types, headers and flags, and the encoder.
//!
//! Every PDU starts with the 8-byte common header: PDU-type, FLAGS, HLEN (header length),
//! PDO (where the data starts) and PLEN (the whole PDU). After the PDU-specific header comes
//! the header digest when HDGSTF is set, then padding up to PDO (the receiver asked for data
//! aligned to `(PDA + 1) * 4` bytes), the data, and its digest when DDGSTF is set. ICReq,
//! ICResp and the TermReqs never carry digests; DDGSTF is set only on PDUs with data.

use crate::cqe::Cqe;
use crate::le::{put16, put32};
use crate::sqe::Sqe;
use crate::{COMMON_HEADER_LEN, DIGEST_LEN};
use bytes::Bytes;
use std::io::IoSlice;

/// PDU-type of the common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PduType {
    /// Initialize Connection Request (host to controller).
    IcReq = 0x00,
    /// Initialize Connection Response.
    IcResp = 0x01,
    /// Host to controller Terminate Connection Request.
    H2CTermReq = 0x02,
    /// Controller to host Terminate Connection Request.
    C2HTermReq = 0x03,
    /// Command capsule (a 64-byte SQE and optional in-capsule data).
    CapsuleCmd = 0x04,
    /// Response capsule (a 16-byte CQE).
    CapsuleResp = 0x05,
    /// Host to controller data, answering an R2T.
    H2CData = 0x06,
    /// Controller to host data of a read.
    C2HData = 0x07,
    /// Ready to Transfer: the controller asks for a range of a command's data.
    R2T = 0x09,
}

impl PduType {
    /// The type of a PDU-type byte, if it is a defined one.
    pub fn from_u8(v: u8) -> Option<PduType> {
        Some(match v {
            0x00 => PduType::IcReq,
            0x01 => PduType::IcResp,
            0x02 => PduType::H2CTermReq,
            0x03 => PduType::C2HTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2CData,
            0x07 => PduType::C2HData,
            0x09 => PduType::R2T,
            _ => return None,
        })
    }

    /// The HLEN every PDU of this type has.
    pub fn hlen(self) -> usize {
        match self {
            PduType::IcReq | PduType::IcResp => IC_LEN,
            PduType::CapsuleCmd => COMMON_HEADER_LEN + crate::sqe::SQE_LEN,
            _ => 24,
        }
    }

    /// True for the PDUs a host sends.
    pub fn is_h2c(self) -> bool {
        matches!(
            self,
            PduType::IcReq | PduType::H2CTermReq | PduType::CapsuleCmd | PduType::H2CData
        )
    }

    /// True for the PDUs that may carry data with PDO and a data digest.
    pub fn carries_data(self) -> bool {
        matches!(
            self,
            PduType::CapsuleCmd | PduType::H2CData | PduType::C2HData
        )
    }

    /// True for the PDUs that never carry digests (the IC exchange and the TermReqs).
    pub fn digestless(self) -> bool {
        matches!(
            self,
            PduType::IcReq | PduType::IcResp | PduType::H2CTermReq | PduType::C2HTermReq
        )
    }
}

/// FLAGS bit: a header digest follows the header.
pub const FLAG_HDGST: u8 = 1 << 0;
/// FLAGS bit: a data digest follows the data.
pub const FLAG_DDGST: u8 = 1 << 1;
/// FLAGS bit of H2CData/C2HData: the last data PDU of an R2T or of a command's read data.
pub const FLAG_LAST_PDU: u8 = 1 << 2;
/// FLAGS bit of C2HData (with LAST_PDU): the command succeeded; no response capsule follows.
pub const FLAG_SUCCESS: u8 = 1 << 3;

/// HLEN and PLEN of ICReq and ICResp.
pub const IC_LEN: usize = 128;
/// ICReq/ICResp digest field bit: header digests.
pub const IC_HDGST_ENABLE: u8 = 1 << 0;
/// ICReq/ICResp digest field bit: data digests.
pub const IC_DDGST_ENABLE: u8 = 1 << 1;

/// Byte offsets of header fields, as FEI reports them.
pub mod offset {
    /// FLAGS.
    pub const FLAGS: u32 = 1;
    /// HLEN.
    pub const HLEN: u32 = 2;
    /// PDO.
    pub const PDO: u32 = 3;
    /// PLEN.
    pub const PLEN: u32 = 4;
    /// ICReq/ICResp PFV.
    pub const PFV: u32 = 8;
    /// ICReq HPDA / ICResp CPDA.
    pub const PDA: u32 = 10;
    /// ICReq/ICResp digest enables.
    pub const DIGEST: u32 = 11;
    /// ICReq MAXR2T / ICResp MAXH2CDATA.
    pub const MAX: u32 = 12;
    /// CapsuleCmd: the SQE's command identifier.
    pub const CAPSULE_CID: u32 = 10;
    /// CapsuleCmd: the SQE's SGL descriptor.
    pub const CAPSULE_SGL: u32 = 32;
    /// H2CData/C2HData/R2T CCCID.
    pub const CCCID: u32 = 8;
    /// H2CData/R2T TTAG.
    pub const TTAG: u32 = 10;
    /// H2CData/C2HData DATAO, R2T R2TO.
    pub const DATAO: u32 = 12;
    /// H2CData/C2HData DATAL, R2T R2TL.
    pub const DATAL: u32 = 16;
}

/// Initialize Connection Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcReq {
    /// PDU format version (0 for NVMe/TCP 1.0).
    pub pfv: u16,
    /// Host PDU data alignment, in dwords, 0's based.
    pub hpda: u8,
    /// The host asks for header digests.
    pub hdgst: bool,
    /// The host asks for data digests.
    pub ddgst: bool,
    /// Most R2Ts the host accepts outstanding per command, 0's based.
    pub maxr2t: u32,
}

/// Initialize Connection Response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcResp {
    /// PDU format version.
    pub pfv: u16,
    /// Controller PDU data alignment, in dwords, 0's based.
    pub cpda: u8,
    /// Header digests are on.
    pub hdgst: bool,
    /// Data digests are on.
    pub ddgst: bool,
    /// Most data one H2CData PDU may carry.
    pub maxh2cdata: u32,
}

/// H2CTermReq or C2HTermReq; the PDU's data is the header of the PDU in error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermReq {
    /// Fatal error status (see [`crate::Fes`]; kept raw so any received value is shown).
    pub fes: u16,
    /// Fatal error information.
    pub fei: u32,
}

/// H2CData or C2HData header; DATAL is the length of the PDU's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    /// Command capsule CID the data belongs to.
    pub cid: u16,
    /// Transfer tag of the R2T answered (H2CData; reserved, 0, in C2HData).
    pub ttag: u16,
    /// Offset of this data in the command's data.
    pub offset: u32,
    /// LAST_PDU: the last data of the R2T (H2C) or of the command (C2H).
    pub last: bool,
    /// SUCCESS (C2HData only): the command succeeded and no CapsuleResp follows.
    pub success: bool,
}

/// Ready to Transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2t {
    /// Command the data is asked for.
    pub cid: u16,
    /// Transfer tag the H2CData PDUs answering this R2T carry.
    pub ttag: u16,
    /// Offset of the range asked for.
    pub offset: u32,
    /// Length of the range asked for.
    pub length: u32,
}

/// A PDU's type-specific header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PduHeader {
    /// ICReq.
    IcReq(IcReq),
    /// ICResp.
    IcResp(IcResp),
    /// H2CTermReq.
    H2CTermReq(TermReq),
    /// C2HTermReq.
    C2HTermReq(TermReq),
    /// CapsuleCmd.
    CapsuleCmd(Sqe),
    /// CapsuleResp.
    CapsuleResp(Cqe),
    /// H2CData.
    H2CData(DataHeader),
    /// C2HData.
    C2HData(DataHeader),
    /// R2T.
    R2T(R2t),
}

impl PduHeader {
    /// The PDU-type.
    pub fn pdu_type(&self) -> PduType {
        match self {
            PduHeader::IcReq(_) => PduType::IcReq,
            PduHeader::IcResp(_) => PduType::IcResp,
            PduHeader::H2CTermReq(_) => PduType::H2CTermReq,
            PduHeader::C2HTermReq(_) => PduType::C2HTermReq,
            PduHeader::CapsuleCmd(_) => PduType::CapsuleCmd,
            PduHeader::CapsuleResp(_) => PduType::CapsuleResp,
            PduHeader::H2CData(_) => PduType::H2CData,
            PduHeader::C2HData(_) => PduType::C2HData,
            PduHeader::R2T(_) => PduType::R2T,
        }
    }

    /// Writes the type-specific fields (everything after the common header) into `h`,
    /// which is `hlen` bytes of zeros.
    fn write_fields(&self, h: &mut [u8]) {
        match self {
            PduHeader::IcReq(ic) => {
                put16(h, 8, ic.pfv);
                h[10] = ic.hpda;
                h[11] = digest_bits(ic.hdgst, ic.ddgst);
                put32(h, 12, ic.maxr2t);
            }
            PduHeader::IcResp(ic) => {
                put16(h, 8, ic.pfv);
                h[10] = ic.cpda;
                h[11] = digest_bits(ic.hdgst, ic.ddgst);
                put32(h, 12, ic.maxh2cdata);
            }
            PduHeader::H2CTermReq(t) | PduHeader::C2HTermReq(t) => {
                put16(h, 8, t.fes);
                put32(h, 10, t.fei);
            }
            PduHeader::CapsuleCmd(sqe) => h[8..72].copy_from_slice(sqe.as_bytes()),
            PduHeader::CapsuleResp(cqe) => h[8..24].copy_from_slice(&cqe.to_bytes()),
            PduHeader::H2CData(d) | PduHeader::C2HData(d) => {
                put16(h, 8, d.cid);
                put16(h, 10, d.ttag);
                put32(h, 12, d.offset);
            }
            PduHeader::R2T(r) => {
                put16(h, 8, r.cid);
                put16(h, 10, r.ttag);
                put32(h, 12, r.offset);
                put32(h, 16, r.length);
            }
        }
    }

    fn flags(&self) -> u8 {
        match self {
            PduHeader::H2CData(d) | PduHeader::C2HData(d) => {
                (if d.last { FLAG_LAST_PDU } else { 0 })
                    | (if d.success { FLAG_SUCCESS } else { 0 })
            }
            _ => 0,
        }
    }
}

fn digest_bits(h: bool, d: bool) -> u8 {
    (if h { IC_HDGST_ENABLE } else { 0 }) | (if d { IC_DDGST_ENABLE } else { 0 })
}

/// A decoded PDU: its header and its data (a slice of the receive buffer; empty when none).
/// For TermReqs the data is the header of the PDU in error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pdu {
    /// The type-specific header.
    pub header: PduHeader,
    /// The data.
    pub data: Bytes,
}

/// What the two ends agreed on for the PDUs one side receives: digests and the receiver's
/// data alignment (HPDA for PDUs to the host, CPDA for PDUs to the controller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Framing {
    /// Header digests on.
    pub hdgst: bool,
    /// Data digests on.
    pub ddgst: bool,
    /// The receiver's PDU data alignment, in dwords, 0's based (0 to 31).
    pub pda: u8,
}

impl Framing {
    /// Bytes data must be aligned to in a PDU.
    pub fn alignment(&self) -> usize {
        (usize::from(self.pda.min(31)) + 1) * 4
    }
}

/// The most header bytes a PDU can have before its data: PDO is one byte.
pub const MAX_HEAD: usize = 256;

/// An encoded PDU: its header bytes (common header, header, header digest, padding) in a
/// fixed buffer, the caller's data slices borrowed, and the data digest.
#[derive(Debug, Clone)]
pub struct Encoded<'a> {
    head: [u8; MAX_HEAD],
    head_len: usize,
    data: Vec<&'a [u8]>,
    ddgst: Option<[u8; DIGEST_LEN]>,
}

impl<'a> Encoded<'a> {
    /// The header bytes (up to PDO, or the whole PDU when it has no data).
    pub fn head(&self) -> &[u8] {
        &self.head[..self.head_len]
    }

    /// PLEN: the bytes of the whole PDU.
    pub fn len(&self) -> usize {
        self.head_len
            + self.data.iter().map(|d| d.len()).sum::<usize>()
            + self.ddgst.map_or(0, |d| d.len())
    }

    /// Never true: a PDU has at least its common header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The PDU as slices for a vectored write: header, data slices, data digest.
    pub fn io_slices(&self) -> Vec<IoSlice<'_>> {
        let mut v = Vec::with_capacity(self.data.len() + 2);
        v.push(IoSlice::new(self.head()));
        v.extend(
            self.data
                .iter()
                .filter(|d| !d.is_empty())
                .map(|d| IoSlice::new(d)),
        );
        if let Some(d) = &self.ddgst {
            v.push(IoSlice::new(d));
        }
        v
    }

    /// Appends the PDU's bytes to `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.reserve(self.len());
        out.extend_from_slice(self.head());
        for d in &self.data {
            out.extend_from_slice(d);
        }
        if let Some(d) = &self.ddgst {
            out.extend_from_slice(d);
        }
    }

    /// The PDU's bytes in one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.write_to(&mut v);
        v
    }
}

/// Lays a PDU out for sending: `data` is its data in any number of slices (a TermReq's is
/// the header in error, cut to 128 bytes by the caller), `framing` what the receiver
/// negotiated. Digests are left out of the PDUs that never carry them. Data on a PDU type
/// that carries none (CapsuleResp, R2T, IC) is ignored.
pub fn encode<'a>(header: &PduHeader, data: &[&'a [u8]], framing: &Framing) -> Encoded<'a> {
    let ty = header.pdu_type();
    let hlen = ty.hlen();
    let takes_data = ty.carries_data() || matches!(ty, PduType::H2CTermReq | PduType::C2HTermReq);
    let data: Vec<&'a [u8]> = if takes_data {
        data.to_vec()
    } else {
        Vec::new()
    };
    let dlen: usize = data.iter().map(|d| d.len()).sum();
    let hd = !ty.digestless() && framing.hdgst;
    let dd = ty.carries_data() && framing.ddgst && dlen > 0;
    let mut e = Encoded {
        head: [0; MAX_HEAD],
        head_len: hlen,
        data,
        ddgst: None,
    };
    header.write_fields(&mut e.head[..hlen]);
    if matches!(ty, PduType::H2CData | PduType::C2HData) {
        put32(&mut e.head, 16, u32::try_from(dlen).unwrap_or(u32::MAX));
    }
    let mut head_len = hlen + if hd { DIGEST_LEN } else { 0 };
    let mut pdo = 0;
    if ty.carries_data() && dlen > 0 {
        let a = framing.alignment();
        head_len = head_len.div_ceil(a) * a;
        pdo = head_len;
    }
    if dd {
        let mut crc = digest::Crc32c::new();
        e.data.iter().for_each(|d| crc.update(d));
        e.ddgst = Some(digest::to_wire(crc.finalize()));
    }
    let plen = head_len + dlen + if dd { DIGEST_LEN } else { 0 };
    let h = &mut e.head;
    h[0] = ty as u8;
    h[1] = header.flags() | if hd { FLAG_HDGST } else { 0 } | if dd { FLAG_DDGST } else { 0 };
    h[2] = hlen as u8;
    h[3] = pdo as u8;
    put32(h, 4, u32::try_from(plen).unwrap_or(u32::MAX));
    if hd {
        let crc = digest::crc32c_le_bytes(&h[..hlen]);
        h[hlen..hlen + DIGEST_LEN].copy_from_slice(&crc);
    }
    e.head_len = head_len;
    e
}
