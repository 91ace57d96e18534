//! The streaming decoder: bytes in, whole PDUs out.
//!
//! It takes from the input only what the current PDU needs, so it never holds more than one
//! PDU. The 8-byte common header is checked (type, direction, HLEN, flags against the
//! negotiated digests, PDO against the alignment, PLEN against the type and the data limits)
//! before any more of the PDU is buffered: a PDU larger than the limits is an error, never an
//! allocation. After a fatal error the decoder refuses everything.

use crate::cqe::{Cqe, CQE_LEN};
use crate::le::{get16, get32};
use crate::pdu::{
    offset, DataHeader, Framing, IcReq, IcResp, Pdu, PduHeader, PduType, R2t, TermReq, FLAG_DDGST,
    FLAG_HDGST, FLAG_LAST_PDU, FLAG_SUCCESS, IC_DDGST_ENABLE, IC_HDGST_ENABLE, IC_LEN,
};
use crate::sqe::{Sqe, SQE_LEN};
use crate::{Fes, PduError, COMMON_HEADER_LEN, DIGEST_LEN, TERM_REQ_MAX_DATA};
use bytes::{Bytes, BytesMut};

/// Which end decodes: a controller receives host-to-controller PDUs, a host the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The controller (target) side.
    Controller,
    /// The host (initiator) side.
    Host,
}

/// What the decoder accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderConfig {
    /// Which PDUs are received.
    pub role: Role,
    /// Digests and this side's data alignment.
    pub framing: Framing,
    /// Most data of one H2CData (a controller's MAXH2CDATA) or C2HData PDU.
    pub max_data: u32,
    /// Most in-capsule data of one CapsuleCmd.
    pub max_in_capsule: u32,
}

impl DecoderConfig {
    /// A configuration for `role` before the IC exchange (no digests, alignment 4).
    pub fn new(role: Role, max_data: u32, max_in_capsule: u32) -> DecoderConfig {
        DecoderConfig {
            role,
            framing: Framing::default(),
            max_data,
            max_in_capsule,
        }
    }
}

/// Why the decoder stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A fatal error: the connection ends with a TermReq.
    #[error(transparent)]
    Fatal(#[from] PduError),
    /// The data digest does not match a well-formed PDU's data. Not fatal: the command the
    /// PDU belongs to fails with Transient Transport Error; the PDU is handed back.
    #[error("data digest error in a {:?} PDU", pdu.header.pdu_type())]
    DataDigest {
        /// The PDU whose data digest failed.
        pdu: Box<Pdu>,
    },
}

/// The layout of a PDU whose common header passed the checks.
#[derive(Debug, Clone, Copy)]
struct Layout {
    ty: PduType,
    flags: u8,
    plen: usize,
    /// Start of the data (PDO, or HLEN for a TermReq).
    data_at: usize,
    data_len: usize,
    hdgst: bool,
    ddgst: bool,
}

/// The streaming decoder of one connection's received bytes.
#[derive(Debug)]
pub struct Decoder {
    config: DecoderConfig,
    buf: BytesMut,
    layout: Option<Layout>,
    failed: bool,
    last_header: [u8; TERM_REQ_MAX_DATA],
    last_header_len: usize,
}

fn invalid(fei: u32, what: &'static str) -> PduError {
    PduError::new(Fes::InvalidHeaderField, fei, what)
}

impl Decoder {
    /// A decoder with `config`.
    pub fn new(config: DecoderConfig) -> Decoder {
        Decoder {
            config,
            buf: BytesMut::with_capacity(COMMON_HEADER_LEN),
            layout: None,
            failed: false,
            last_header: [0; TERM_REQ_MAX_DATA],
            last_header_len: 0,
        }
    }

    /// The current configuration.
    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// Changes the configuration (after the IC exchange); applies from the next PDU.
    pub fn set_config(&mut self, config: DecoderConfig) {
        self.config = config;
    }

    /// The header (HLEN bytes) of the last PDU decoded, which a TermReq about it carries.
    pub fn last_header(&self) -> &[u8] {
        &self.last_header[..self.last_header_len]
    }

    /// Bytes of a partial PDU held.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Takes bytes from the front of `input` and returns the next whole PDU, or `Ok(None)`
    /// when `input` ran out first (what was taken is kept for the next call).
    pub fn decode(&mut self, input: &mut &[u8]) -> Result<Option<Pdu>, DecodeError> {
        if self.failed {
            return Err(
                PduError::new(Fes::PduSequenceError, 0, "input after a fatal error").into(),
            );
        }
        let r = self.step(input);
        if matches!(r, Err(DecodeError::Fatal(_))) {
            self.failed = true;
        }
        r
    }

    fn step(&mut self, input: &mut &[u8]) -> Result<Option<Pdu>, DecodeError> {
        if self.layout.is_none() {
            if !self.fill(input, COMMON_HEADER_LEN) {
                return Ok(None);
            }
            let mut ch = [0; COMMON_HEADER_LEN];
            ch.copy_from_slice(&self.buf[..COMMON_HEADER_LEN]);
            let layout = check_common(&ch, &self.config).map_err(|e| e.with_header(&ch))?;
            self.buf.reserve(layout.plen - COMMON_HEADER_LEN);
            self.layout = Some(layout);
        }
        let Some(layout) = self.layout else {
            return Ok(None);
        };
        if !self.fill(input, layout.plen) {
            return Ok(None);
        }
        self.layout = None;
        let pdu = self.buf.split_to(layout.plen).freeze();
        let n = layout.ty.hlen().min(TERM_REQ_MAX_DATA);
        self.last_header[..n].copy_from_slice(&pdu[..n]);
        self.last_header_len = n;
        parse(pdu, &layout)
    }

    /// Moves bytes from `input` until `self.buf` holds `want`; true when it does.
    fn fill(&mut self, input: &mut &[u8], want: usize) -> bool {
        let take = want.saturating_sub(self.buf.len()).min(input.len());
        self.buf.extend_from_slice(&input[..take]);
        *input = &input[take..];
        self.buf.len() >= want
    }
}

fn accepts(role: Role, ty: PduType) -> bool {
    match role {
        Role::Controller => ty.is_h2c(),
        Role::Host => !ty.is_h2c(),
    }
}

/// Checks a common header against the configuration and works out the PDU's layout.
fn check_common(ch: &[u8; COMMON_HEADER_LEN], cfg: &DecoderConfig) -> Result<Layout, PduError> {
    let ty = PduType::from_u8(ch[0])
        .filter(|&t| accepts(cfg.role, t))
        .ok_or(invalid(0, "PDU-type unknown or of the other direction"))?;
    let (flags, hlen, pdo) = (ch[1], usize::from(ch[2]), usize::from(ch[3]));
    let plen = get32(ch, 4) as usize;
    if hlen != ty.hlen() {
        return Err(invalid(offset::HLEN, "HLEN is not the PDU type's"));
    }
    let mut layout = Layout {
        ty,
        flags,
        plen,
        data_at: hlen,
        data_len: 0,
        hdgst: false,
        ddgst: false,
    };
    if ty.digestless() {
        if flags & (FLAG_HDGST | FLAG_DDGST) != 0 {
            return Err(invalid(
                offset::FLAGS,
                "digest flag on an IC or TermReq PDU",
            ));
        }
        let max = if matches!(ty, PduType::IcReq | PduType::IcResp) {
            IC_LEN
        } else {
            hlen + TERM_REQ_MAX_DATA
        };
        if plen < hlen || plen > max {
            return Err(invalid(offset::PLEN, "PLEN out of range for the PDU type"));
        }
        layout.data_len = plen - hlen;
        return Ok(layout);
    }
    let f = &cfg.framing;
    layout.hdgst = flags & FLAG_HDGST != 0;
    if layout.hdgst != f.hdgst {
        return Err(invalid(
            offset::FLAGS,
            "HDGSTF does not match the negotiated header digest",
        ));
    }
    let head = hlen + if f.hdgst { DIGEST_LEN } else { 0 };
    if plen < head {
        return Err(invalid(offset::PLEN, "PLEN shorter than the header"));
    }
    layout.ddgst = flags & FLAG_DDGST != 0;
    if !ty.carries_data() || plen == head {
        if layout.ddgst {
            return Err(invalid(offset::FLAGS, "DDGSTF on a PDU without data"));
        }
        if plen != head {
            return Err(invalid(offset::PLEN, "PLEN longer than a PDU without data"));
        }
        return check_flags(layout);
    }
    if layout.ddgst != f.ddgst {
        return Err(invalid(
            offset::FLAGS,
            "DDGSTF does not match the negotiated data digest",
        ));
    }
    if pdo < head || pdo % f.alignment() != 0 {
        return Err(invalid(
            offset::PDO,
            "PDO before the header's end or not aligned",
        ));
    }
    let dd = if f.ddgst { DIGEST_LEN } else { 0 };
    if plen <= pdo + dd {
        return Err(invalid(offset::PLEN, "PLEN leaves no data after PDO"));
    }
    layout.data_at = pdo;
    layout.data_len = plen - pdo - dd;
    let limit = if ty == PduType::CapsuleCmd {
        cfg.max_in_capsule
    } else {
        cfg.max_data
    };
    if layout.data_len > limit as usize {
        return Err(PduError::new(
            Fes::R2tLimitExceeded,
            0,
            "PDU data over the negotiated limit",
        ));
    }
    check_flags(layout)
}

/// LAST_PDU and SUCCESS only where they mean something; SUCCESS only with LAST_PDU.
fn check_flags(layout: Layout) -> Result<Layout, PduError> {
    let f = layout.flags;
    let data = matches!(layout.ty, PduType::H2CData | PduType::C2HData);
    if !data && f & (FLAG_LAST_PDU | FLAG_SUCCESS) != 0 {
        return Err(invalid(
            offset::FLAGS,
            "LAST_PDU or SUCCESS on a PDU that is not data",
        ));
    }
    if f & FLAG_SUCCESS != 0 && (layout.ty != PduType::C2HData || f & FLAG_LAST_PDU == 0) {
        return Err(invalid(
            offset::FLAGS,
            "SUCCESS without LAST_PDU or on H2CData",
        ));
    }
    Ok(layout)
}

/// Parses a whole PDU whose common header passed [`check_common`].
fn parse(pdu: Bytes, l: &Layout) -> Result<Option<Pdu>, DecodeError> {
    let hlen = l.ty.hlen();
    let hdr = &pdu[..hlen];
    if l.hdgst {
        let got = &pdu[hlen..hlen + DIGEST_LEN];
        if digest::crc32c_le_bytes(hdr) != got {
            let e = PduError::new(Fes::HeaderDigestError, 0, "header digest mismatch");
            return Err(e.with_header(hdr).into());
        }
    }
    let data = pdu.slice(l.data_at..l.data_at + l.data_len);
    let header = parse_header(hdr, l, data.len()).map_err(|e| e.with_header(hdr))?;
    let ddgst_ok = !l.ddgst || {
        let at = l.data_at + l.data_len;
        digest::crc32c_le_bytes(&data) == pdu[at..at + DIGEST_LEN]
    };
    let pdu = Pdu { header, data };
    if ddgst_ok {
        Ok(Some(pdu))
    } else {
        Err(DecodeError::DataDigest { pdu: Box::new(pdu) })
    }
}

fn parse_header(h: &[u8], l: &Layout, data_len: usize) -> Result<PduHeader, PduError> {
    let last = l.flags & FLAG_LAST_PDU != 0;
    let success = l.flags & FLAG_SUCCESS != 0;
    Ok(match l.ty {
        PduType::IcReq => PduHeader::IcReq(IcReq {
            pfv: get16(h, 8),
            hpda: h[10],
            hdgst: h[11] & IC_HDGST_ENABLE != 0,
            ddgst: h[11] & IC_DDGST_ENABLE != 0,
            maxr2t: get32(h, 12),
        }),
        PduType::IcResp => PduHeader::IcResp(IcResp {
            pfv: get16(h, 8),
            cpda: h[10],
            hdgst: h[11] & IC_HDGST_ENABLE != 0,
            ddgst: h[11] & IC_DDGST_ENABLE != 0,
            maxh2cdata: get32(h, 12),
        }),
        PduType::H2CTermReq | PduType::C2HTermReq => {
            let t = TermReq {
                fes: get16(h, 8),
                fei: get32(h, 10),
            };
            if l.ty == PduType::H2CTermReq {
                PduHeader::H2CTermReq(t)
            } else {
                PduHeader::C2HTermReq(t)
            }
        }
        PduType::CapsuleCmd => {
            let mut sqe = [0; SQE_LEN];
            sqe.copy_from_slice(&h[8..8 + SQE_LEN]);
            PduHeader::CapsuleCmd(Sqe::from_bytes(sqe))
        }
        PduType::CapsuleResp => {
            let mut cqe = [0; CQE_LEN];
            cqe.copy_from_slice(&h[8..8 + CQE_LEN]);
            PduHeader::CapsuleResp(Cqe::from_bytes(&cqe))
        }
        PduType::H2CData | PduType::C2HData => {
            if get32(h, 16) as usize != data_len || data_len == 0 {
                return Err(invalid(offset::DATAL, "DATAL is not the PDU's data length"));
            }
            let d = DataHeader {
                cid: get16(h, 8),
                ttag: get16(h, 10),
                offset: get32(h, 12),
                last,
                success,
            };
            if l.ty == PduType::H2CData {
                PduHeader::H2CData(d)
            } else {
                PduHeader::C2HData(d)
            }
        }
        PduType::R2T => PduHeader::R2T(R2t {
            cid: get16(h, 8),
            ttag: get16(h, 10),
            offset: get32(h, 12),
            length: get32(h, 16),
        }),
    })
}
