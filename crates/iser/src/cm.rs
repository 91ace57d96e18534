//! The iSER word in the connection manager's private data (RFC 7145 §5.1.1; on iWARP it
//! follows the MPA v2 IRD/ORD word in the MPA Request and Reply): byte 0 bit 0x80 = ZBVA not
//! used (Linux always sets it: addresses are real VAs), 0x40 = Send with Invalidate not
//! used; three reserved bytes.

/// What a side says of itself in its private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmFlags {
    /// Zero-based virtual addressing is not supported (0x80).
    pub no_zbva: bool,
    /// Send with Invalidate is not supported (0x40): the target must answer with plain
    /// Sends, and the initiator invalidates its own STags.
    pub no_send_invalidate: bool,
}

impl CmFlags {
    /// What ironsan sends: real VAs; Send with Invalidate as `send_invalidate` says.
    pub fn ours(send_invalidate: bool) -> CmFlags {
        CmFlags {
            no_zbva: true,
            no_send_invalidate: !send_invalidate,
        }
    }

    pub fn encode(&self) -> [u8; 4] {
        let mut b = [0u8; 4];
        if self.no_zbva {
            b[0] |= 0x80;
        }
        if self.no_send_invalidate {
            b[0] |= 0x40;
        }
        b
    }

    /// The flags in a peer's private data. A peer that sent no iSER word is taken to support
    /// neither feature (0xC0), the safe reading.
    pub fn decode(private_data: &[u8]) -> CmFlags {
        let b = private_data.first().copied().unwrap_or(0xC0);
        CmFlags {
            no_zbva: b & 0x80 != 0,
            no_send_invalidate: b & 0x40 != 0,
        }
    }

    /// Whether the target answers with Send with Invalidate: only when neither side
    /// refuses it.
    pub fn send_invalidate(initiator: CmFlags, target: CmFlags) -> bool {
        !initiator.no_send_invalidate && !target.no_send_invalidate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_flags_decode_and_a_missing_word_means_neither_feature() {
        // ib_iser over siw: 0x80 (ZBVA off, Send with Invalidate accepted).
        let linux = CmFlags::decode(&[0x80, 0, 0, 0]);
        assert!(linux.no_zbva && !linux.no_send_invalidate);
        assert!(CmFlags::send_invalidate(linux, CmFlags::ours(true)));
        assert!(!CmFlags::send_invalidate(linux, CmFlags::ours(false)));
        let none = CmFlags::decode(&[]);
        assert!(none.no_zbva && none.no_send_invalidate);
        assert_eq!(CmFlags::ours(true).encode(), [0x80, 0, 0, 0]);
        assert_eq!(CmFlags::ours(false).encode(), [0xc0, 0, 0, 0]);
    }
}
