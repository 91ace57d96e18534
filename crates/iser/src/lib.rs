//! iSER (RFC 7145, as Linux's ib_iser and isert speak it) on the wire, sans IO: the 28-byte
//! iSER header in front of every iSCSI PDU ([`IserHeader`]: opcode, Write/Read STag and base
//! address, the WSV/RSV bits), the 4-byte flags word of the connection manager's private data
//! ([`CmFlags`]: ZBVA and Send with Invalidate), and one iSCSI PDU per RDMA Send
//! ([`parse_send`] checks the lengths a peer declares against the bytes it sent;
//! [`encode_send`] lays a PDU out as a Send). Facts: ../shared/specs/iser.md (§7 was checked
//! against Linux's source and a capture).

mod cm;
mod header;
mod send;

pub use cm::CmFlags;
pub use header::{IserHeader, IserOpcode};
pub use send::{encode_send, parse_send, send_len, IserSend};

/// Bytes of the iSER header.
pub const ISER_HEADER_LEN: usize = 28;
/// The iSER header and the BHS: the shortest Send that carries a PDU.
pub const ISER_HEADERS_LEN: usize = ISER_HEADER_LEN + iscsi_wire::BHS_LEN;
/// Data a Linux ib_iser initiator can receive in one control PDU in full feature phase
/// (its receive buffers hold the headers and 128 bytes).
pub const LINUX_INITIATOR_RECV_DATA: u32 = 128;
/// Text a login PDU may carry (both Linux peers size login buffers for 8 KiB).
pub const LOGIN_DATA_MAX: u32 = 8192;

/// Why bytes are not a valid iSER message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IserError {
    #[error("Send of {got} bytes is shorter than the {need} its headers declare")]
    Short { got: usize, need: usize },
    #[error("Send of {got} bytes is longer than its {need}-byte PDU and padding")]
    Long { got: usize, need: usize },
    #[error("iSER header byte 0 is 0x{0:02x}: not a known opcode and flags")]
    BadFlags(u8),
    #[error("iSER Hello/HelloReply received (iSER-assisted login uses none)")]
    Hello,
    #[error("data segment of {len} bytes exceeds the {max} this side receives")]
    TooMuchData { len: u32, max: u32 },
    #[error("bad iSCSI header in a Send: {0}")]
    Bhs(String),
}
