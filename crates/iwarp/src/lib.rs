//! Sans-IO iWARP wire codecs: MPA start frames (Request/Reply, revisions 1 and 2 with the RFC 6581
//! IRD/ORD word and ready-to-receive negotiation), MPA FPDU framing (length, pad, CRC32C, marker
//! refusal), DDP tagged/untagged segment headers and the RDMAP opcodes, Read Request and Terminate
//! bodies. Everything here turns bytes into typed values and back; no sockets, clocks or threads, so
//! the software RNIC (crate `rnic`) and the capture analyzer can share one tested implementation.

pub mod crc;
pub mod ddp;
pub mod fpdu;
pub mod mpa;
pub mod rdmap;
pub mod terminate_code;

pub use ddp::{DdpHeader, Opcode, TaggedHeader, UntaggedHeader};
pub use fpdu::{FpduLayout, MAX_ULPDU};
pub use mpa::{MpaFrame, MpaKind, Negotiated, Rfc6581};
pub use rdmap::{ReadRequest, Terminate};
pub use terminate_code::{TermLayer, TerminateCode};

/// A malformed or unacceptable byte sequence; never a panic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// Fewer bytes than the structure needs.
    Truncated { need: usize, have: usize },
    /// A field holds a value the protocol forbids.
    Invalid(&'static str),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Truncated { need, have } => {
                write!(f, "truncated: need {need} bytes, have {have}")
            }
            WireError::Invalid(what) => write!(f, "invalid {what}"),
        }
    }
}

impl std::error::Error for WireError {}

pub(crate) fn need(buf: &[u8], n: usize) -> Result<(), WireError> {
    if buf.len() < n {
        Err(WireError::Truncated {
            need: n,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}
