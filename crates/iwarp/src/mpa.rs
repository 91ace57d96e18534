//! MPA connection setup (RFC 5044 §7.1, RFC 6581): the Request/Reply start frames and the
//! negotiation of CRC, markers, IRD/ORD and the ready-to-receive (RTR) message.

use crate::fields::{be16, need, WireError};

pub const KEY_REQUEST: &[u8; 16] = b"MPA ID Req Frame";
pub const KEY_REPLY: &[u8; 16] = b"MPA ID Rep Frame";
/// Key (16) + flags (1) + revision (1) + PD_Length (2).
pub const HEADER_LEN: usize = 20;
/// RFC 5044 limit on private data.
pub const MAX_PRIVATE_DATA: usize = 512;

pub const FLAG_MARKERS: u8 = 0x80;
pub const FLAG_CRC: u8 = 0x40;
pub const FLAG_REJECT: u8 = 0x20;
/// RFC 6581 "enhanced connection establishment": the private data starts with the IRD/ORD word.
pub const FLAG_ENHANCED: u8 = 0x10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MpaKind {
    Request,
    Reply,
}

/// One MPA Request or Reply frame as it appears on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpaFrame {
    pub kind: MpaKind,
    /// The whole flags byte (M, C, R, enhanced and reserved bits).
    pub flags: u8,
    pub revision: u8,
    /// Private data exactly as carried (for revision 2 + enhanced it starts with the RFC 6581 word).
    pub private_data: Vec<u8>,
}

impl MpaFrame {
    pub fn markers(&self) -> bool {
        self.flags & FLAG_MARKERS != 0
    }
    pub fn crc(&self) -> bool {
        self.flags & FLAG_CRC != 0
    }
    pub fn reject(&self) -> bool {
        self.flags & FLAG_REJECT != 0
    }
    pub fn enhanced(&self) -> bool {
        self.revision == 2 && self.flags & FLAG_ENHANCED != 0
    }

    /// The wire bytes of this frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.private_data.len());
        out.extend_from_slice(match self.kind {
            MpaKind::Request => KEY_REQUEST,
            MpaKind::Reply => KEY_REPLY,
        });
        out.push(self.flags);
        out.push(self.revision);
        out.extend_from_slice(&(self.private_data.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.private_data);
        out
    }

    /// Total frame length once the 20-byte header is available.
    pub fn frame_len(header: &[u8]) -> Result<usize, WireError> {
        need(header, HEADER_LEN)?;
        Ok(HEADER_LEN + be16(header, 18) as usize)
    }

    /// Decodes one frame of the expected kind. `max_private_data` is the receiver's limit
    /// (Linux: 256; RFC: 512). Returns the frame and the number of bytes it used.
    pub fn decode(
        buf: &[u8],
        expect: MpaKind,
        max_private_data: usize,
    ) -> Result<(MpaFrame, usize), WireError> {
        need(buf, HEADER_LEN)?;
        let key = match expect {
            MpaKind::Request => KEY_REQUEST,
            MpaKind::Reply => KEY_REPLY,
        };
        if &buf[..16] != key {
            return Err(WireError::Invalid("MPA key"));
        }
        let pd_len = be16(buf, 18) as usize;
        if pd_len > max_private_data.min(MAX_PRIVATE_DATA) {
            return Err(WireError::Invalid("MPA private data length"));
        }
        need(buf, HEADER_LEN + pd_len)?;
        let frame = MpaFrame {
            kind: expect,
            flags: buf[16],
            revision: buf[17],
            private_data: buf[HEADER_LEN..HEADER_LEN + pd_len].to_vec(),
        };
        Ok((frame, HEADER_LEN + pd_len))
    }
}

/// The ready-to-receive message types of RFC 6581 peer-to-peer mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rtr {
    /// Zero-length Send.
    Send,
    /// Zero-length RDMA Write.
    Write,
    /// Zero-length RDMA Read Request.
    Read,
}

const IRD_ORD_MASK: u16 = 0x3fff;
const P2P: u16 = 0x8000;
const RTR_SEND: u16 = 0x4000; // in the IRD word
const RTR_WRITE: u16 = 0x8000; // in the ORD word
const RTR_READ: u16 = 0x4000; // in the ORD word

/// The 4-byte RFC 6581 word at the start of revision-2 private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rfc6581 {
    pub ird: u16,
    pub ord: u16,
    pub p2p: bool,
    pub rtr_send: bool,
    pub rtr_write: bool,
    pub rtr_read: bool,
}

impl Rfc6581 {
    pub const LEN: usize = 4;

    pub fn encode(&self) -> [u8; 4] {
        let mut ird = self.ird.min(IRD_ORD_MASK);
        let mut ord = self.ord.min(IRD_ORD_MASK);
        if self.p2p {
            ird |= P2P;
        }
        if self.rtr_send {
            ird |= RTR_SEND;
        }
        if self.rtr_write {
            ord |= RTR_WRITE;
        }
        if self.rtr_read {
            ord |= RTR_READ;
        }
        let mut out = [0u8; 4];
        out[..2].copy_from_slice(&ird.to_be_bytes());
        out[2..].copy_from_slice(&ord.to_be_bytes());
        out
    }

    pub fn decode(buf: &[u8]) -> Result<Rfc6581, WireError> {
        need(buf, 4)?;
        let ird = be16(buf, 0);
        let ord = be16(buf, 2);
        Ok(Rfc6581 {
            ird: ird & IRD_ORD_MASK,
            ord: ord & IRD_ORD_MASK,
            p2p: ird & P2P != 0,
            rtr_send: ird & RTR_SEND != 0,
            rtr_write: ord & RTR_WRITE != 0,
            rtr_read: ord & RTR_READ != 0,
        })
    }

    /// The RTR type this word selects (for a Reply) or the first one offered (Write, Read, Send).
    pub fn rtr(&self) -> Option<Rtr> {
        if !self.p2p {
            None
        } else if self.rtr_write {
            Some(Rtr::Write)
        } else if self.rtr_read {
            Some(Rtr::Read)
        } else if self.rtr_send {
            Some(Rtr::Send)
        } else {
            None
        }
    }
}

/// What one side brings to the negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalParams {
    /// 1 or 2. Revision 2 carries the RFC 6581 word.
    pub revision: u8,
    /// Ask for (initiator) or insist on (responder) MPA CRC.
    pub crc: bool,
    /// Inbound RDMA Read Requests we can serve at once.
    pub ird: u16,
    /// Outbound RDMA Read Requests we want to have in flight.
    pub ord: u16,
    /// Initiator: request peer-to-peer mode and offer a Write RTR. Responder: accept P2P if offered.
    pub p2p: bool,
    /// The ULP's private data (after the RFC 6581 word).
    pub private_data: Vec<u8>,
}

impl Default for LocalParams {
    fn default() -> Self {
        LocalParams {
            revision: 2,
            crc: false,
            ird: 16,
            ord: 16,
            p2p: false,
            private_data: Vec::new(),
        }
    }
}

/// The outcome of a successful MPA exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub revision: u8,
    pub crc: bool,
    /// Read Requests this side serves at once.
    pub ird: u16,
    /// Read Requests this side may have outstanding.
    pub ord: u16,
    /// The RTR message the initiator sends first (peer-to-peer mode), if any.
    pub rtr: Option<Rtr>,
    /// The peer's ULP private data (RFC 6581 word removed).
    pub peer_private_data: Vec<u8>,
}

/// Why a start frame was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MpaError {
    Wire(WireError),
    /// The peer asked for markers; we never use them.
    MarkersRequested,
    /// Revision higher than 2 or an enhanced frame without the 4-byte word.
    BadRevision(u8),
    /// The peer rejected the connection (R bit); its private data explains why.
    Rejected(Vec<u8>),
    /// The Reply does not match what the Request asked (e.g. enhanced mode dropped).
    Mismatch(&'static str),
    /// No RTR type both sides support.
    NoMatchingRtr,
}

impl std::fmt::Display for MpaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MpaError::Wire(e) => write!(f, "MPA: {e}"),
            MpaError::MarkersRequested => write!(f, "MPA: peer requested markers (not supported)"),
            MpaError::BadRevision(r) => write!(f, "MPA: unsupported revision {r}"),
            MpaError::Rejected(pd) => write!(
                f,
                "MPA: connection rejected by peer ({} bytes of private data)",
                pd.len()
            ),
            MpaError::Mismatch(w) => write!(f, "MPA: reply mismatch: {w}"),
            MpaError::NoMatchingRtr => write!(f, "MPA: no matching RTR type"),
        }
    }
}

impl std::error::Error for MpaError {}

impl From<WireError> for MpaError {
    fn from(e: WireError) -> Self {
        MpaError::Wire(e)
    }
}

/// Builds the Request an initiator sends.
pub fn build_request(local: &LocalParams) -> MpaFrame {
    let mut flags = 0;
    if local.crc {
        flags |= FLAG_CRC;
    }
    let mut pd = Vec::new();
    if local.revision >= 2 {
        flags |= FLAG_ENHANCED;
        let word = Rfc6581 {
            ird: local.ird,
            ord: local.ord,
            p2p: local.p2p,
            rtr_write: local.p2p,
            rtr_read: local.p2p,
            rtr_send: false,
        };
        pd.extend_from_slice(&word.encode());
    }
    pd.extend_from_slice(&local.private_data);
    MpaFrame {
        kind: MpaKind::Request,
        flags,
        revision: local.revision.min(2),
        private_data: pd,
    }
}

/// A parsed, acceptable Request as the responder sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRequest {
    pub frame: MpaFrame,
    /// The initiator's RFC 6581 word (revision 2), if present.
    pub word: Option<Rfc6581>,
    /// The ULP private data (RFC 6581 word removed).
    pub private_data: Vec<u8>,
}

/// Validates a Request (responder side). Markers and unknown revisions are refused.
pub fn parse_request(frame: MpaFrame) -> Result<PeerRequest, MpaError> {
    if frame.revision > 2 {
        return Err(MpaError::BadRevision(frame.revision));
    }
    if frame.markers() {
        return Err(MpaError::MarkersRequested);
    }
    let (word, private_data) = if frame.enhanced() {
        if frame.private_data.len() < Rfc6581::LEN {
            return Err(MpaError::BadRevision(frame.revision));
        }
        (
            Some(Rfc6581::decode(&frame.private_data)?),
            frame.private_data[Rfc6581::LEN..].to_vec(),
        )
    } else {
        (None, frame.private_data.clone())
    };
    Ok(PeerRequest {
        frame,
        word,
        private_data,
    })
}

/// Builds the responder's accepting Reply. Like Linux siw, the Reply mirrors the initiator's
/// revision and CRC choice (and adds C if we insist on CRC); IRD/ORD are clamped to what the
/// initiator offered ("relaxed" negotiation).
pub fn build_reply(
    req: &PeerRequest,
    local: &LocalParams,
) -> Result<(MpaFrame, Negotiated), MpaError> {
    let crc = req.frame.crc() || local.crc;
    let mut flags = if crc { FLAG_CRC } else { 0 };
    let mut pd = Vec::new();
    let (ird, ord, rtr) = match req.word {
        Some(w) => {
            flags |= FLAG_ENHANCED;
            let ird = local.ird.min(w.ord);
            let ord = local.ord.min(w.ird);
            let rtr = if w.p2p && local.p2p {
                if w.rtr_write {
                    Some(Rtr::Write)
                } else if w.rtr_read {
                    Some(Rtr::Read)
                } else if w.rtr_send {
                    Some(Rtr::Send)
                } else {
                    return Err(MpaError::NoMatchingRtr);
                }
            } else {
                None
            };
            let word = Rfc6581 {
                ird,
                ord,
                p2p: rtr.is_some(),
                rtr_write: rtr == Some(Rtr::Write),
                rtr_read: rtr == Some(Rtr::Read),
                rtr_send: rtr == Some(Rtr::Send),
            };
            pd.extend_from_slice(&word.encode());
            (ird, ord, rtr)
        }
        None => (local.ird, local.ord, None),
    };
    pd.extend_from_slice(&local.private_data);
    let revision = req.frame.revision.max(1);
    let reply = MpaFrame {
        kind: MpaKind::Reply,
        flags,
        revision,
        private_data: pd,
    };
    let neg = Negotiated {
        revision,
        crc,
        ird,
        ord,
        rtr,
        peer_private_data: req.private_data.clone(),
    };
    Ok((reply, neg))
}

/// Builds a rejecting Reply carrying the ULP's private data.
pub fn build_reject(req: &PeerRequest, private_data: &[u8]) -> MpaFrame {
    let mut pd = Vec::new();
    let mut flags = FLAG_REJECT;
    if req.word.is_some() {
        flags |= FLAG_ENHANCED;
        pd.extend_from_slice(&Rfc6581::default().encode());
    }
    pd.extend_from_slice(private_data);
    MpaFrame {
        kind: MpaKind::Reply,
        flags,
        revision: req.frame.revision.max(1),
        private_data: pd,
    }
}

/// Checks the Reply an initiator received against its Request.
pub fn process_reply(local: &LocalParams, reply: &MpaFrame) -> Result<Negotiated, MpaError> {
    if reply.revision > 2 {
        return Err(MpaError::BadRevision(reply.revision));
    }
    let enhanced_asked = local.revision >= 2;
    let (word, ulp) = if reply.enhanced() && reply.private_data.len() >= Rfc6581::LEN {
        (
            Some(Rfc6581::decode(&reply.private_data)?),
            reply.private_data[Rfc6581::LEN..].to_vec(),
        )
    } else {
        (None, reply.private_data.clone())
    };
    if reply.reject() {
        return Err(MpaError::Rejected(ulp));
    }
    if reply.markers() {
        return Err(MpaError::MarkersRequested);
    }
    if enhanced_asked && word.is_none() {
        return Err(MpaError::Mismatch(
            "enhanced mode requested but not in reply",
        ));
    }
    let (ird, ord, rtr) = match word {
        Some(w) => {
            let rtr = if local.p2p && w.p2p {
                match w.rtr() {
                    Some(Rtr::Send) | None => return Err(MpaError::NoMatchingRtr),
                    r => r,
                }
            } else {
                None
            };
            (local.ird, local.ord.min(w.ird), rtr)
        }
        None => (local.ird, local.ord, None),
    };
    Ok(Negotiated {
        revision: reply.revision,
        crc: local.crc || reply.crc(),
        ird,
        ord,
        rtr,
        peer_private_data: ulp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The Request Linux ib_iser sent over siw (reference capture): rev 2, enhanced, IRD 128, ORD 1,
    /// then the 4-byte iSER CM header 0x80.
    const LINUX_ISER_REQUEST: [u8; 28] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d,
        0x65, 0x10, 0x02, 0x00, 0x08, 0x00, 0x80, 0x00, 0x01, 0x80, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn decodes_linux_request_and_builds_the_reply_linux_accepted() {
        let (frame, used) = MpaFrame::decode(&LINUX_ISER_REQUEST, MpaKind::Request, 256).unwrap();
        assert_eq!(used, 28);
        assert!(frame.enhanced() && !frame.crc() && !frame.markers());
        let req = parse_request(frame).unwrap();
        let w = req.word.unwrap();
        assert_eq!((w.ird, w.ord, w.p2p), (128, 1, false));
        assert_eq!(req.private_data, vec![0x80, 0, 0, 0]);
        let local = LocalParams {
            ird: 128,
            ord: 128,
            private_data: vec![0, 0, 0, 0],
            ..Default::default()
        };
        let (reply, neg) = build_reply(&req, &local).unwrap();
        // The reply the guest accepted: "MPA ID Rep Frame" 10 02 00 08 00 01 00 80 00 00 00 00
        let mut expect = KEY_REPLY.to_vec();
        expect.extend_from_slice(&[0x10, 0x02, 0x00, 0x08, 0x00, 0x01, 0x00, 0x80, 0, 0, 0, 0]);
        assert_eq!(reply.encode(), expect);
        assert_eq!((neg.ird, neg.ord, neg.crc, neg.rtr), (1, 128, false, None));
    }

    #[test]
    fn reply_mirrors_initiator_crc_and_responder_can_insist() {
        let req = parse_request(build_request(&LocalParams {
            crc: true,
            ..Default::default()
        }))
        .unwrap();
        let (reply, neg) = build_reply(&req, &LocalParams::default()).unwrap();
        assert!(reply.crc() && neg.crc);
        let req = parse_request(build_request(&LocalParams::default())).unwrap();
        let (reply, neg) = build_reply(
            &req,
            &LocalParams {
                crc: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(reply.crc() && neg.crc);
        let ini = process_reply(&LocalParams::default(), &reply).unwrap();
        assert!(
            ini.crc,
            "initiator accepts CRC the responder turned on (siw is not strict)"
        );
    }

    #[test]
    fn markers_are_refused() {
        let mut f = build_request(&LocalParams::default());
        f.flags |= FLAG_MARKERS;
        assert_eq!(parse_request(f), Err(MpaError::MarkersRequested));
    }

    #[test]
    fn p2p_negotiates_write_rtr() {
        let ini = LocalParams {
            p2p: true,
            ird: 4,
            ord: 8,
            ..Default::default()
        };
        let req = parse_request(build_request(&ini)).unwrap();
        let (reply, rneg) = build_reply(
            &req,
            &LocalParams {
                p2p: true,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(rneg.rtr, Some(Rtr::Write));
        let ineg = process_reply(&ini, &reply).unwrap();
        assert_eq!(ineg.rtr, Some(Rtr::Write));
        assert_eq!((ineg.ord, rneg.ird), (8, 8));
    }

    #[test]
    fn reject_carries_private_data() {
        let req = parse_request(build_request(&LocalParams::default())).unwrap();
        let rej = build_reject(&req, b"no");
        let bytes = rej.encode();
        let (back, _) = MpaFrame::decode(&bytes, MpaKind::Reply, 256).unwrap();
        assert_eq!(
            process_reply(&LocalParams::default(), &back),
            Err(MpaError::Rejected(b"no".to_vec()))
        );
    }

    #[test]
    fn enhanced_without_word_is_refused() {
        let f = MpaFrame {
            kind: MpaKind::Request,
            flags: FLAG_ENHANCED,
            revision: 2,
            private_data: vec![1],
        };
        assert!(matches!(parse_request(f), Err(MpaError::BadRevision(2))));
        let f = MpaFrame {
            kind: MpaKind::Request,
            flags: 0,
            revision: 3,
            private_data: vec![],
        };
        assert!(matches!(parse_request(f), Err(MpaError::BadRevision(3))));
    }

    #[test]
    fn oversized_private_data_is_an_error_not_a_panic() {
        let mut bytes = KEY_REQUEST.to_vec();
        bytes.extend_from_slice(&[0x10, 2, 0x01, 0x01]);
        assert!(matches!(
            MpaFrame::decode(&bytes, MpaKind::Request, 256),
            Err(WireError::Invalid(_))
        ));
        assert!(matches!(
            MpaFrame::decode(&bytes[..10], MpaKind::Request, 256),
            Err(WireError::Truncated { .. })
        ));
    }

    proptest! {
        #[test]
        fn frame_round_trip(flags in any::<u8>(), rev in 0u8..3, pd in proptest::collection::vec(any::<u8>(), 0..256), req in any::<bool>()) {
            let kind = if req { MpaKind::Request } else { MpaKind::Reply };
            let f = MpaFrame { kind, flags, revision: rev, private_data: pd };
            let bytes = f.encode();
            let (back, used) = MpaFrame::decode(&bytes, kind, 256).unwrap();
            prop_assert_eq!(used, bytes.len());
            prop_assert_eq!(back, f);
        }

        #[test]
        fn word_round_trip(ird in 0u16..0x4000, ord in 0u16..0x4000, p2p in any::<bool>(), s in any::<bool>(), w in any::<bool>(), r in any::<bool>()) {
            let word = Rfc6581 { ird, ord, p2p, rtr_send: s, rtr_write: w, rtr_read: r };
            prop_assert_eq!(Rfc6581::decode(&word.encode()).unwrap(), word);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = MpaFrame::decode(&bytes, MpaKind::Request, 512);
            let _ = MpaFrame::decode(&bytes, MpaKind::Reply, 512);
        }
    }
}
