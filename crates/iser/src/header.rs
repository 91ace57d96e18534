//! The 28-byte iSER header (RFC 7145 §9.2, the layout Linux uses):
//! byte 0 = opcode (high nibble) | WSV 0x08 | RSV 0x04; bytes 1..4 reserved; Write STag (u32)
//! and Write Base VA (u64); Read STag (u32) and Read Base VA (u64), big-endian.

use crate::{IserError, ISER_HEADER_LEN};

/// What the Send carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IserOpcode {
    /// An iSCSI control-type PDU follows (0x1).
    Control,
    /// iSER Hello (0x2) and HelloReply (0x3): RFC 5046's streaming-mode switch; neither Linux
    /// peer sends them.
    Hello,
    HelloReply,
}

/// An iSER header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IserHeader {
    pub opcode: IserOpcode,
    /// The Write STag and base address are valid (a command with write data).
    pub write: Option<(u32, u64)>,
    /// The Read STag and base address are valid (a command with read data).
    pub read: Option<(u32, u64)>,
}

const WSV: u8 = 0x08;
const RSV: u8 = 0x04;

impl IserHeader {
    /// A control PDU's header without STags.
    pub const CONTROL: IserHeader = IserHeader {
        opcode: IserOpcode::Control,
        write: None,
        read: None,
    };

    pub fn encode(&self) -> [u8; ISER_HEADER_LEN] {
        let mut b = [0u8; ISER_HEADER_LEN];
        b[0] = match self.opcode {
            IserOpcode::Control => 0x10,
            IserOpcode::Hello => 0x20,
            IserOpcode::HelloReply => 0x30,
        };
        if let Some((stag, va)) = self.write {
            b[0] |= WSV;
            b[4..8].copy_from_slice(&stag.to_be_bytes());
            b[8..16].copy_from_slice(&va.to_be_bytes());
        }
        if let Some((stag, va)) = self.read {
            b[0] |= RSV;
            b[16..20].copy_from_slice(&stag.to_be_bytes());
            b[20..28].copy_from_slice(&va.to_be_bytes());
        }
        b
    }

    /// Decodes the first 28 bytes of `b`. A control header's low nibble may only hold WSV
    /// and RSV (Wireshark drops anything else, and so do we).
    pub fn decode(b: &[u8]) -> Result<IserHeader, IserError> {
        if b.len() < ISER_HEADER_LEN {
            return Err(IserError::Short {
                got: b.len(),
                need: ISER_HEADER_LEN,
            });
        }
        let opcode = match b[0] >> 4 {
            1 if b[0] & 0x03 == 0 => IserOpcode::Control,
            2 => IserOpcode::Hello,
            3 => IserOpcode::HelloReply,
            _ => return Err(IserError::BadFlags(b[0])),
        };
        let be32 = |at: usize| u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let be64 = |at: usize| u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let control = opcode == IserOpcode::Control;
        Ok(IserHeader {
            opcode,
            write: (control && b[0] & WSV != 0).then(|| (be32(4), be64(8))),
            read: (control && b[0] & RSV != 0).then(|| (be32(16), be64(20))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stags_and_addresses_round_trip_with_their_valid_bits() {
        let h = IserHeader {
            opcode: IserOpcode::Control,
            write: Some((0x1122_3344, 0x5566_7788_99aa_bbcc)),
            read: Some((0xdead_beef, 0x1000)),
        };
        let b = h.encode();
        assert_eq!(b[0], 0x1c);
        assert_eq!(&b[4..8], &[0x11, 0x22, 0x33, 0x44]);
        assert_eq!(&b[16..20], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(IserHeader::decode(&b), Ok(h));
        let read_only = IserHeader { write: None, ..h };
        assert_eq!(read_only.encode()[0], 0x14);
        assert_eq!(IserHeader::CONTROL.encode()[0], 0x10);
    }

    #[test]
    fn unknown_opcodes_and_reserved_bits_are_refused() {
        for byte0 in [0x00u8, 0x11, 0x12, 0x40, 0xf0] {
            let mut b = [0u8; 28];
            b[0] = byte0;
            assert_eq!(IserHeader::decode(&b), Err(IserError::BadFlags(byte0)));
        }
        let mut b = [0u8; 28];
        b[0] = 0x20;
        assert_eq!(IserHeader::decode(&b).unwrap().opcode, IserOpcode::Hello);
        assert!(matches!(
            IserHeader::decode(&b[..27]),
            Err(IserError::Short { got: 27, .. })
        ));
    }
}
