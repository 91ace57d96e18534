//! DDP segment headers (RFC 5041 §4) with the RDMAP control byte (RFC 5040 §4) folded in.
//! Offsets count from the DDP control byte, i.e. after the 2-byte MPA ULPDU_Length.

use crate::fields::{be32, be64, need};
use crate::terminate_code::TerminateCode;

/// Tagged header: control, RDMAP control, STag, TO.
pub const TAGGED_LEN: usize = 14;
/// Untagged header: control, RDMAP control, RsvdULP(4), QN, MSN, MO.
pub const UNTAGGED_LEN: usize = 18;

const T_FLAG: u8 = 0x80;
const L_FLAG: u8 = 0x40;
const DDP_VERSION: u8 = 1;
const RDMAP_VERSION: u8 = 1;

/// Untagged queue numbers used by RDMAP.
pub const QN_SEND: u32 = 0;
pub const QN_READ_REQUEST: u32 = 1;
pub const QN_TERMINATE: u32 = 2;

/// RDMAP opcodes (RFC 5040 §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    RdmaWrite = 0,
    ReadRequest = 1,
    ReadResponse = 2,
    Send = 3,
    SendInvalidate = 4,
    SendSe = 5,
    SendSeInvalidate = 6,
    Terminate = 7,
}

impl Opcode {
    pub fn from_u8(v: u8) -> Option<Opcode> {
        Some(match v {
            0 => Opcode::RdmaWrite,
            1 => Opcode::ReadRequest,
            2 => Opcode::ReadResponse,
            3 => Opcode::Send,
            4 => Opcode::SendInvalidate,
            5 => Opcode::SendSe,
            6 => Opcode::SendSeInvalidate,
            7 => Opcode::Terminate,
            _ => return None,
        })
    }
    /// Whether this message uses the tagged buffer model.
    pub fn is_tagged(self) -> bool {
        matches!(self, Opcode::RdmaWrite | Opcode::ReadResponse)
    }
    /// One of the four Send variants.
    pub fn is_send(self) -> bool {
        matches!(
            self,
            Opcode::Send | Opcode::SendInvalidate | Opcode::SendSe | Opcode::SendSeInvalidate
        )
    }
    pub fn invalidates(self) -> bool {
        matches!(self, Opcode::SendInvalidate | Opcode::SendSeInvalidate)
    }
    pub fn solicited(self) -> bool {
        matches!(self, Opcode::SendSe | Opcode::SendSeInvalidate)
    }
    /// The untagged queue this opcode travels on.
    pub fn queue(self) -> Option<u32> {
        match self {
            o if o.is_send() => Some(QN_SEND),
            Opcode::ReadRequest => Some(QN_READ_REQUEST),
            Opcode::Terminate => Some(QN_TERMINATE),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaggedHeader {
    pub last: bool,
    pub opcode: Opcode,
    pub stag: u32,
    pub to: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UntaggedHeader {
    pub last: bool,
    pub opcode: Opcode,
    /// RDMAP's use of RsvdULP: the STag to invalidate for Send with Invalidate, else 0.
    pub inv_stag: u32,
    pub qn: u32,
    pub msn: u32,
    pub mo: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DdpHeader {
    Tagged(TaggedHeader),
    Untagged(UntaggedHeader),
}

impl DdpHeader {
    pub fn len(&self) -> usize {
        match self {
            DdpHeader::Tagged(_) => TAGGED_LEN,
            DdpHeader::Untagged(_) => UNTAGGED_LEN,
        }
    }
    pub fn is_empty(&self) -> bool {
        false
    }
    pub fn opcode(&self) -> Opcode {
        match self {
            DdpHeader::Tagged(h) => h.opcode,
            DdpHeader::Untagged(h) => h.opcode,
        }
    }
    pub fn last(&self) -> bool {
        match self {
            DdpHeader::Tagged(h) => h.last,
            DdpHeader::Untagged(h) => h.last,
        }
    }

    /// Writes the header into the front of `out` (at least `self.len()` bytes); returns its length.
    pub fn encode_into(&self, out: &mut [u8]) -> usize {
        let (t, last, op) = match self {
            DdpHeader::Tagged(h) => (T_FLAG, h.last, h.opcode),
            DdpHeader::Untagged(h) => (0, h.last, h.opcode),
        };
        out[0] = t | if last { L_FLAG } else { 0 } | DDP_VERSION;
        out[1] = (RDMAP_VERSION << 6) | op as u8;
        match self {
            DdpHeader::Tagged(h) => {
                out[2..6].copy_from_slice(&h.stag.to_be_bytes());
                out[6..14].copy_from_slice(&h.to.to_be_bytes());
                TAGGED_LEN
            }
            DdpHeader::Untagged(h) => {
                out[2..6].copy_from_slice(&h.inv_stag.to_be_bytes());
                out[6..10].copy_from_slice(&h.qn.to_be_bytes());
                out[10..14].copy_from_slice(&h.msn.to_be_bytes());
                out[14..18].copy_from_slice(&h.mo.to_be_bytes());
                UNTAGGED_LEN
            }
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        self.encode_into(&mut v);
        v
    }

    /// How many header bytes follow the control byte pair, judged from the first byte: lets a
    /// stream reader know how much to read before `decode`.
    pub fn len_from_control(ctrl: u8) -> usize {
        if ctrl & T_FLAG != 0 {
            TAGGED_LEN
        } else {
            UNTAGGED_LEN
        }
    }

    /// Decodes and validates a header. On error returns the Terminate code the receiver must send.
    pub fn decode(buf: &[u8]) -> Result<DdpHeader, TerminateCode> {
        if need(buf, 2).is_err() {
            return Err(TerminateCode::LLP_FPDU_START);
        }
        let ctrl = buf[0];
        let tagged = ctrl & T_FLAG != 0;
        if need(buf, Self::len_from_control(ctrl)).is_err() {
            return Err(TerminateCode::LLP_FPDU_START);
        }
        if ctrl & 0x03 != DDP_VERSION {
            return Err(if tagged {
                TerminateCode::DDP_TAGGED_VERSION
            } else {
                TerminateCode::DDP_UNTAGGED_VERSION
            });
        }
        if buf[1] >> 6 != RDMAP_VERSION {
            return Err(TerminateCode::RDMAP_VERSION);
        }
        let opcode = Opcode::from_u8(buf[1] & 0x0f).ok_or(TerminateCode::RDMAP_OPCODE)?;
        if opcode.is_tagged() != tagged {
            return Err(TerminateCode::RDMAP_OPCODE);
        }
        let last = ctrl & L_FLAG != 0;
        if tagged {
            return Ok(DdpHeader::Tagged(TaggedHeader {
                last,
                opcode,
                stag: be32(buf, 2),
                to: be64(buf, 6),
            }));
        }
        let h = UntaggedHeader {
            last,
            opcode,
            inv_stag: be32(buf, 2),
            qn: be32(buf, 6),
            msn: be32(buf, 10),
            mo: be32(buf, 14),
        };
        if opcode.queue() != Some(h.qn) {
            return Err(TerminateCode::DDP_UNTAGGED_QN);
        }
        Ok(DdpHeader::Untagged(h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn linux_send_header_from_capture() {
        // DDP 41, RDMAP 43, RsvdULP 0, QN 0, MSN 1, MO 0 (reference capture frame 8).
        let bytes = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        let h = DdpHeader::decode(&bytes).unwrap();
        assert_eq!(
            h,
            DdpHeader::Untagged(UntaggedHeader {
                last: true,
                opcode: Opcode::Send,
                inv_stag: 0,
                qn: 0,
                msn: 1,
                mo: 0
            })
        );
        assert_eq!(h.to_bytes(), bytes);
    }

    #[test]
    fn tagged_write_bytes() {
        let h = DdpHeader::Tagged(TaggedHeader {
            last: false,
            opcode: Opcode::RdmaWrite,
            stag: 0x1234_5678,
            to: 0x10,
        });
        assert_eq!(
            h.to_bytes(),
            [0x81, 0x40, 0x12, 0x34, 0x56, 0x78, 0, 0, 0, 0, 0, 0, 0, 0x10]
        );
    }

    #[test]
    fn errors_map_to_terminate_codes() {
        let mut b = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            opcode: Opcode::Send,
            inv_stag: 0,
            qn: 0,
            msn: 1,
            mo: 0,
        })
        .to_bytes();
        b[0] = 0x42; // DDP version 2
        assert_eq!(
            DdpHeader::decode(&b),
            Err(TerminateCode::DDP_UNTAGGED_VERSION)
        );
        b[0] = 0x41;
        b[1] = 0x83; // RDMAP version 2
        assert_eq!(DdpHeader::decode(&b), Err(TerminateCode::RDMAP_VERSION));
        b[1] = 0x4a; // reserved opcode
        assert_eq!(DdpHeader::decode(&b), Err(TerminateCode::RDMAP_OPCODE));
        b[1] = 0x43;
        b[9] = 5; // QN 5
        assert_eq!(DdpHeader::decode(&b), Err(TerminateCode::DDP_UNTAGGED_QN));
        b[1] = 0x40; // Write in an untagged header
        assert_eq!(DdpHeader::decode(&b), Err(TerminateCode::RDMAP_OPCODE));
    }

    fn any_header() -> impl Strategy<Value = DdpHeader> {
        prop_oneof![
            (
                any::<bool>(),
                prop_oneof![Just(Opcode::RdmaWrite), Just(Opcode::ReadResponse)],
                any::<u32>(),
                any::<u64>()
            )
                .prop_map(|(last, opcode, stag, to)| DdpHeader::Tagged(TaggedHeader {
                    last,
                    opcode,
                    stag,
                    to
                })),
            (
                any::<bool>(),
                1u8..8,
                any::<u32>(),
                any::<u32>(),
                any::<u32>()
            )
                .prop_map(|(last, op, inv, msn, mo)| {
                    let opcode = Opcode::from_u8(if op == 2 { 3 } else { op }).unwrap();
                    DdpHeader::Untagged(UntaggedHeader {
                        last,
                        opcode,
                        inv_stag: inv,
                        qn: opcode.queue().unwrap(),
                        msn,
                        mo,
                    })
                }),
        ]
    }

    proptest! {
        #[test]
        fn round_trip(h in any_header()) {
            prop_assert_eq!(DdpHeader::decode(&h.to_bytes()), Ok(h));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = DdpHeader::decode(&bytes);
        }
    }
}
