//! iSCSI wire codec (RFC 7143), sans-IO: typed Basic Header Segments for every opcode,
//! Additional Header Segments, LUN encoding, serial-number arithmetic, the framing
//! arithmetic (header digest, padding, data digest) that tells a reader how many bytes
//! the rest of a PDU takes. It never touches a socket; transports and the analyzer feed it
//! bytes. Digest values are computed by the caller (the `digest` crate), so a runtime can
//! fuse the CRC with the copy of the data segment into its final buffer. The SCSI sense
//! data a SCSI Response carries is the `scsi-spec` crate's to read.

mod bhs;
pub mod serial;

pub use bhs::*;

use bytes::Bytes;

/// Length of the Basic Header Segment.
pub const BHS_LEN: usize = 48;
/// Length of a header or data digest (CRC32C, little-endian on the wire).
pub const DIGEST_LEN: usize = 4;
/// Largest DataSegmentLength the 24-bit field can carry.
pub const MAX_DATA_SEGMENT: u32 = (1 << 24) - 1;

/// Errors decoding bytes from the network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("unknown opcode 0x{0:02x}")]
    UnknownOpcode(u8),
    #[error("invalid field: {0}")]
    InvalidField(&'static str),
    #[error("truncated: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("data segment of {len} bytes exceeds the limit of {limit}")]
    DataTooLong { len: u32, limit: u32 },
    #[error("malformed AHS: {0}")]
    BadAhs(&'static str),
}

/// PDU opcodes (byte 0, bits 5..0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Opcode {
    NopOut = 0x00,
    ScsiCommand = 0x01,
    TaskMgmtRequest = 0x02,
    LoginRequest = 0x03,
    TextRequest = 0x04,
    DataOut = 0x05,
    LogoutRequest = 0x06,
    SnackRequest = 0x10,
    NopIn = 0x20,
    ScsiResponse = 0x21,
    TaskMgmtResponse = 0x22,
    LoginResponse = 0x23,
    TextResponse = 0x24,
    DataIn = 0x25,
    LogoutResponse = 0x26,
    R2t = 0x31,
    AsyncMessage = 0x32,
    Reject = 0x3f,
}

impl Opcode {
    pub fn from_u8(v: u8) -> Option<Opcode> {
        Some(match v {
            0x00 => Opcode::NopOut,
            0x01 => Opcode::ScsiCommand,
            0x02 => Opcode::TaskMgmtRequest,
            0x03 => Opcode::LoginRequest,
            0x04 => Opcode::TextRequest,
            0x05 => Opcode::DataOut,
            0x06 => Opcode::LogoutRequest,
            0x10 => Opcode::SnackRequest,
            0x20 => Opcode::NopIn,
            0x21 => Opcode::ScsiResponse,
            0x22 => Opcode::TaskMgmtResponse,
            0x23 => Opcode::LoginResponse,
            0x24 => Opcode::TextResponse,
            0x25 => Opcode::DataIn,
            0x26 => Opcode::LogoutResponse,
            0x31 => Opcode::R2t,
            0x32 => Opcode::AsyncMessage,
            0x3f => Opcode::Reject,
            _ => return None,
        })
    }

    /// Whether this opcode is sent by an initiator.
    pub fn is_request(self) -> bool {
        (self as u8) < 0x20
    }

    /// The name used in listings ("SCSI Command", "Data-In", ...).
    pub fn name(self) -> &'static str {
        match self {
            Opcode::NopOut => "NOP-Out",
            Opcode::ScsiCommand => "SCSI Command",
            Opcode::TaskMgmtRequest => "Task Management Function Request",
            Opcode::LoginRequest => "Login Request",
            Opcode::TextRequest => "Text Request",
            Opcode::DataOut => "SCSI Data Out",
            Opcode::LogoutRequest => "Logout Request",
            Opcode::SnackRequest => "SNACK Request",
            Opcode::NopIn => "NOP-In",
            Opcode::ScsiResponse => "SCSI Response",
            Opcode::TaskMgmtResponse => "Task Management Function Response",
            Opcode::LoginResponse => "Login Response",
            Opcode::TextResponse => "Text Response",
            Opcode::DataIn => "SCSI Data In",
            Opcode::LogoutResponse => "Logout Response",
            Opcode::R2t => "Ready To Transfer",
            Opcode::AsyncMessage => "Asynchronous Message",
            Opcode::Reject => "Reject",
        }
    }
}

/// Which digests a connection uses (negotiated at login; login PDUs never carry them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// What a Login Response tells an observer of the stream (a proxy, a trace) about the full
/// feature phase: the digests it answered (None: not in this PDU) and whether it ends the
/// login (transit to full feature phase with success).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoginDigestAnswers {
    pub header: Option<bool>,
    pub data: Option<bool>,
    pub ends_login: bool,
}

/// Reads a Login Response's BHS and text for [`LoginDigestAnswers`].
pub fn login_digest_answers(bhs: &[u8], text: &[u8]) -> LoginDigestAnswers {
    let mut a = LoginDigestAnswers::default();
    for kv in text.split(|&b| b == 0) {
        match kv {
            b"HeaderDigest=CRC32C" => a.header = Some(true),
            b"HeaderDigest=None" => a.header = Some(false),
            b"DataDigest=CRC32C" => a.data = Some(true),
            b"DataDigest=None" => a.data = Some(false),
            _ => {}
        }
    }
    a.ends_login = bhs.len() >= BHS_LEN && bhs[1] & 0x80 != 0 && bhs[1] & 0x03 == 3 && bhs[36] == 0;
    a
}

/// Bytes a data segment of `len` occupies with its padding to 4.
pub fn padded_len(len: u32) -> usize {
    (len as usize + 3) & !3
}

/// Where the parts of one PDU lie, counted from the first byte after the BHS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLayout {
    /// AHS bytes (TotalAHSLength * 4).
    pub ahs_len: usize,
    /// 4 when a header digest follows the AHS.
    pub header_digest_len: usize,
    /// DataSegmentLength (payload without padding).
    pub data_len: u32,
    /// Padding bytes after the payload (0..3).
    pub pad_len: usize,
    /// 4 when a data digest follows the padded payload.
    pub data_digest_len: usize,
}

impl FrameLayout {
    /// Layout of the PDU whose BHS is `bhs`, with the connection's digests, refusing data
    /// segments longer than `max_data` (the receiver's declared MaxRecvDataSegmentLength,
    /// or a login-phase bound).
    pub fn of(
        bhs: &[u8; BHS_LEN],
        digests: Digests,
        max_data: u32,
    ) -> Result<FrameLayout, WireError> {
        let ahs_len = bhs[4] as usize * 4;
        let data_len = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]);
        if data_len > max_data {
            return Err(WireError::DataTooLong {
                len: data_len,
                limit: max_data,
            });
        }
        Ok(FrameLayout {
            ahs_len,
            header_digest_len: if digests.header { DIGEST_LEN } else { 0 },
            data_len,
            pad_len: padded_len(data_len) - data_len as usize,
            data_digest_len: if digests.data && data_len > 0 {
                DIGEST_LEN
            } else {
                0
            },
        })
    }

    /// Bytes between the BHS and the data segment (AHS + header digest).
    pub fn header_rest_len(&self) -> usize {
        self.ahs_len + self.header_digest_len
    }

    /// Bytes after the header part: payload + padding + data digest.
    pub fn data_part_len(&self) -> usize {
        self.data_len as usize + self.pad_len + self.data_digest_len
    }

    /// Bytes of the whole PDU including the BHS.
    pub fn total_len(&self) -> usize {
        BHS_LEN + self.header_rest_len() + self.data_part_len()
    }
}

/// An Additional Header Segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ahs {
    /// CDB bytes 16.. of a CDB longer than 16 bytes.
    ExtendedCdb(Vec<u8>),
    /// Expected read data length of a bidirectional command.
    BidiReadLength(u32),
    /// Any other type (kept for listings).
    Other { ahs_type: u8, data: Vec<u8> },
}

/// Parse the AHS area of a PDU.
pub fn parse_ahs(mut b: &[u8]) -> Result<Vec<Ahs>, WireError> {
    let mut out = Vec::new();
    while !b.is_empty() {
        if b.len() < 4 {
            return Err(WireError::BadAhs("fewer than 4 bytes left"));
        }
        let len = u16::from_be_bytes([b[0], b[1]]) as usize;
        let ahs_type = b[2];
        // AHSLength counts the bytes after byte 2 (reserved byte 3 included).
        if len == 0 || 3 + len > b.len() {
            return Err(WireError::BadAhs("AHSLength runs past the AHS area"));
        }
        let body = &b[4..3 + len];
        out.push(match ahs_type {
            1 => Ahs::ExtendedCdb(body.to_vec()),
            2 => {
                if body.len() != 4 {
                    return Err(WireError::BadAhs(
                        "bidirectional read length AHS must be 8 bytes",
                    ));
                }
                Ahs::BidiReadLength(u32::from_be_bytes([body[0], body[1], body[2], body[3]]))
            }
            t => Ahs::Other {
                ahs_type: t,
                data: body.to_vec(),
            },
        });
        let used = (3 + len + 3) & !3;
        b = &b[used.min(b.len())..];
    }
    Ok(out)
}

/// Encode AHS entries, each padded to 4 bytes.
pub fn encode_ahs(ahs: &[Ahs]) -> Vec<u8> {
    let mut out = Vec::new();
    for a in ahs {
        let (t, body): (u8, Vec<u8>) = match a {
            Ahs::ExtendedCdb(c) => (1, c.clone()),
            Ahs::BidiReadLength(l) => (2, l.to_be_bytes().to_vec()),
            Ahs::Other { ahs_type, data } => (*ahs_type, data.clone()),
        };
        let len = body.len() + 1;
        out.extend_from_slice(&(len as u16).to_be_bytes());
        out.push(t);
        out.push(0);
        out.extend_from_slice(&body);
        while out.len() % 4 != 0 {
            out.push(0);
        }
    }
    out
}

/// Full CDB of a SCSI Command: the 16 bytes in the BHS plus any Extended CDB AHS.
pub fn full_cdb(cmd: &ScsiCommand, ahs: &[Ahs]) -> Vec<u8> {
    let mut cdb = cmd.cdb.to_vec();
    for a in ahs {
        if let Ahs::ExtendedCdb(rest) = a {
            cdb.extend_from_slice(rest);
        }
    }
    cdb
}

/// Encode a LUN number into the 8-byte SAM LUN field (peripheral addressing below 256,
/// flat addressing up to 16383).
pub fn lun_to_wire(lun: u16) -> u64 {
    if lun < 256 {
        (lun as u64) << 48
    } else {
        (0x4000 | (lun as u64 & 0x3fff)) << 48
    }
}

/// Decode the 8-byte SAM LUN field into a LUN number (peripheral or flat addressing).
pub fn lun_from_wire(raw: u64) -> u16 {
    let top = (raw >> 48) as u16;
    match top >> 14 {
        0 | 1 => top & 0x3fff,
        _ => top,
    }
}

/// A whole PDU as held in memory: typed header, AHS bytes and the data segment
/// (without padding or digests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pdu {
    pub bhs: Bhs,
    pub ahs: Bytes,
    pub data: Bytes,
}

impl Pdu {
    pub fn new(bhs: Bhs, data: Bytes) -> Pdu {
        Pdu {
            bhs,
            ahs: Bytes::new(),
            data,
        }
    }

    /// The 48 encoded header bytes for this PDU.
    pub fn encode_bhs(&self) -> [u8; BHS_LEN] {
        self.bhs.encode(self.ahs.len(), self.data.len() as u32)
    }
}

/// Result of `decode_pdu` on a byte buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedPdu {
    pub pdu: Pdu,
    /// Bytes the PDU occupied in the buffer.
    pub consumed: usize,
    /// Header digest as it appeared on the wire (little-endian CRC32C), if present.
    pub header_digest: Option<u32>,
    /// Data digest as it appeared on the wire, if present.
    pub data_digest: Option<u32>,
}

/// Decode one PDU from the front of `buf`. `Err(Truncated)` means more bytes are needed.
/// Digests are returned, not checked: the caller verifies them with the CRC engine.
pub fn decode_pdu(buf: &[u8], digests: Digests, max_data: u32) -> Result<DecodedPdu, WireError> {
    if buf.len() < BHS_LEN {
        return Err(WireError::Truncated {
            need: BHS_LEN,
            have: buf.len(),
        });
    }
    let head: &[u8; BHS_LEN] = buf[..BHS_LEN].try_into().expect("length checked");
    let layout = FrameLayout::of(head, digests, max_data)?;
    let total = layout.total_len();
    if buf.len() < total {
        return Err(WireError::Truncated {
            need: total,
            have: buf.len(),
        });
    }
    let decoded = Bhs::decode(head)?;
    let mut at = BHS_LEN;
    let ahs = Bytes::copy_from_slice(&buf[at..at + layout.ahs_len]);
    at += layout.ahs_len;
    let header_digest = if layout.header_digest_len > 0 {
        let d = u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
        at += 4;
        Some(d)
    } else {
        None
    };
    let data = Bytes::copy_from_slice(&buf[at..at + layout.data_len as usize]);
    at += layout.data_len as usize + layout.pad_len;
    let data_digest = if layout.data_digest_len > 0 {
        let d = u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
        at += 4;
        Some(d)
    } else {
        None
    };
    Ok(DecodedPdu {
        pdu: Pdu {
            bhs: decoded.bhs,
            ahs,
            data,
        },
        consumed: at,
        header_digest,
        data_digest,
    })
}

/// A digest function over a byte slice (the `digest` crate's `crc32c`).
pub type CrcFn<'a> = &'a dyn Fn(&[u8]) -> u32;

/// Encode a PDU to bytes with the given digest functions (pass `None` for no digest).
/// Used by tests, tools and the initiator's slow paths; the hot paths build vectored writes.
pub fn encode_pdu(pdu: &Pdu, header_crc: Option<CrcFn>, data_crc: Option<CrcFn>) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(BHS_LEN + pdu.ahs.len() + padded_len(pdu.data.len() as u32) + 8);
    out.extend_from_slice(&pdu.encode_bhs());
    out.extend_from_slice(&pdu.ahs);
    if let Some(crc) = header_crc {
        let d = crc(&out);
        out.extend_from_slice(&d.to_le_bytes());
    }
    let data_start = out.len();
    out.extend_from_slice(&pdu.data);
    out.resize(data_start + padded_len(pdu.data.len() as u32), 0);
    if let Some(crc) = data_crc {
        if !pdu.data.is_empty() {
            let d = crc(&out[data_start..]);
            out.extend_from_slice(&d.to_le_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests;

/// Stream bytes for tests of code that cuts a byte stream into PDUs (proxies, traces).
#[doc(hidden)]
pub mod testing {
    use super::{padded_len, Digests, BHS_LEN};

    /// A PDU of `opcode` with `data` as its data segment, padded, with placeholder digests
    /// (0xaa.., 0xdd..) where `digests` says they go: only its layout is meant to be right.
    pub fn pdu_bytes(opcode: u8, data: &[u8], digests: Digests) -> Vec<u8> {
        let mut p = vec![0u8; BHS_LEN];
        p[0] = opcode;
        p[5..8].copy_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
        if digests.header {
            p.extend_from_slice(&[0xaa; 4]);
        }
        p.extend_from_slice(data);
        p.resize(p.len() + padded_len(data.len() as u32) - data.len(), 0);
        if digests.data && !data.is_empty() {
            p.extend_from_slice(&[0xdd; 4]);
        }
        p
    }
}
