//! Terminate error codes (layer, error type, code). They sit below DDP and RDMAP because both
//! layers, and MPA framing, report their errors with them.

/// Terminate layer field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TermLayer {
    Rdmap = 0,
    Ddp = 1,
    Llp = 2,
}

/// Layer, error type and error code of a Terminate (RFC 5040 §7.1, RFC 5041 §7.2, RFC 5044/6581).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminateCode {
    pub layer: u8,
    pub etype: u8,
    pub code: u8,
}

impl TerminateCode {
    const fn new(layer: u8, etype: u8, code: u8) -> Self {
        TerminateCode { layer, etype, code }
    }
    // RDMAP, remote protection error (etype 1).
    pub const RDMAP_INVALID_STAG: Self = Self::new(0, 1, 0x00);
    pub const RDMAP_BASE_BOUNDS: Self = Self::new(0, 1, 0x01);
    pub const RDMAP_ACCESS: Self = Self::new(0, 1, 0x02);
    pub const RDMAP_STAG_NOT_ASSOC: Self = Self::new(0, 1, 0x03);
    pub const RDMAP_TO_WRAP: Self = Self::new(0, 1, 0x04);
    pub const RDMAP_CANNOT_INVALIDATE: Self = Self::new(0, 1, 0x09);
    // RDMAP, remote operation error (etype 2).
    pub const RDMAP_VERSION: Self = Self::new(0, 2, 0x05);
    pub const RDMAP_OPCODE: Self = Self::new(0, 2, 0x06);
    pub const RDMAP_CATASTROPHIC_STREAM: Self = Self::new(0, 2, 0x07);
    pub const RDMAP_UNSPECIFIED: Self = Self::new(0, 2, 0xff);
    // DDP tagged buffer errors (etype 1).
    pub const DDP_TAGGED_INVALID_STAG: Self = Self::new(1, 1, 0x00);
    pub const DDP_TAGGED_BASE_BOUNDS: Self = Self::new(1, 1, 0x01);
    pub const DDP_TAGGED_NOT_ASSOC: Self = Self::new(1, 1, 0x02);
    pub const DDP_TAGGED_TO_WRAP: Self = Self::new(1, 1, 0x03);
    pub const DDP_TAGGED_VERSION: Self = Self::new(1, 1, 0x04);
    // DDP untagged buffer errors (etype 2).
    pub const DDP_UNTAGGED_QN: Self = Self::new(1, 2, 0x01);
    pub const DDP_UNTAGGED_NO_BUFFER: Self = Self::new(1, 2, 0x02);
    pub const DDP_UNTAGGED_MSN_RANGE: Self = Self::new(1, 2, 0x03);
    pub const DDP_UNTAGGED_MO: Self = Self::new(1, 2, 0x04);
    pub const DDP_UNTAGGED_TOO_LONG: Self = Self::new(1, 2, 0x05);
    pub const DDP_UNTAGGED_VERSION: Self = Self::new(1, 2, 0x06);
    // LLP (MPA) errors.
    pub const LLP_CONNECTION_LOST: Self = Self::new(2, 0, 0x01);
    pub const LLP_CRC: Self = Self::new(2, 0, 0x02);
    pub const LLP_FPDU_START: Self = Self::new(2, 0, 0x03);
    pub const LLP_INVALID_REQ_REP: Self = Self::new(2, 0, 0x04);
    pub const LLP_INSUFFICIENT_IRD: Self = Self::new(2, 0, 0x06);
    pub const LLP_NO_MATCHING_RTR: Self = Self::new(2, 0, 0x07);
}

impl std::fmt::Display for TerminateCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let layer = ["RDMAP", "DDP", "LLP"]
            .get(self.layer as usize)
            .copied()
            .unwrap_or("?");
        write!(f, "{layer} etype {} code {:#04x}", self.etype, self.code)
    }
}
