//! The NVMe/TCP transport binding (NVMe/TCP 1.0, TP 8000) and the NVMe over Fabrics capsules,
//! sans IO: no sockets, clocks or threads. It is the core of ironsan's NVMe/TCP front end (`nvme-target`),
//! which serves the same LUNs as iSCSI.
//!
//! - [`pdu`]: the nine PDU types (common header, ICReq/ICResp, H2C/C2H TermReq, CapsuleCmd,
//!   CapsuleResp, H2CData, C2HData, R2T), header and data digests (CRC32C, least significant
//!   byte first, as iSCSI's), PDO padding to the receiver's alignment, and an encoder that
//!   lays a PDU out as its header bytes plus the caller's borrowed data slices.
//! - [`decoder`]: bytes in, whole PDUs out; it buffers at most one PDU, whose size it checks
//!   against the negotiated limits from the 8-byte common header before buffering the rest.
//!   Every malformed input is a [`PduError`] naming the fatal error status ([`Fes`]) and the
//!   field offset a TermReq reports, never a panic.
//! - [`sqe`], [`cqe`], [`status`]: the 64-byte submission and 16-byte completion entries as
//!   typed views, the SGL descriptors NVMe/TCP uses, the Fabrics commands (Connect and its
//!   1 KiB data, Property Get/Set, the controller registers), admin and NVM opcodes, and the
//!   status codes with names.
//! - [`queue`]: the controller side of one connection: the IC exchange, then per command
//!   in-capsule data or R2Ts (one outstanding per command, each at most the configured length)
//!   and the checks of every H2CData against its R2T, the C2HData cuts of read data (with the
//!   SUCCESS flag instead of a response capsule when SQ flow control is off), the response
//!   capsule; out come [`queue::Action`]s.
//! - [`identify_host`]: what a host reads from Identify Controller/Namespace and the CAP,
//!   CC and CSTS registers (the host side is the `nvme-initiator` crate).
//! - [`identify`], [`log`]: the Identify data structures (controller, namespace, active
//!   namespace list, identification descriptors) and the log pages (SMART, Changed Namespace
//!   List, Discovery) with their encoders and parsers, for both sides.
//!
//! Facts are from NVM Express Base 2.0, NVMe over Fabrics 1.1 and the NVMe/TCP transport
//! binding 1.0, checked against Linux's `nvme-tcp.h`.

pub mod cqe;
pub mod decoder;
pub mod identify;
pub mod identify_host;
mod le;
pub mod log;
pub mod pdu;
pub mod queue;
pub mod sqe;
pub mod status;

pub use cqe::{Cqe, Status};
pub use decoder::{DecodeError, Decoder, DecoderConfig, Role};
pub use pdu::{DataHeader, Encoded, Framing, IcReq, IcResp, Pdu, PduHeader, PduType, R2t, TermReq};
pub use sqe::{SglDescriptor, Sqe};
pub use status::StatusCode;

/// The IANA port of NVMe/TCP I/O controllers.
pub const NVME_TCP_PORT: u16 = 4420;
/// The port of NVMe/TCP discovery controllers.
pub const NVME_TCP_DISCOVERY_PORT: u16 = 8009;
/// Bytes of the common header every PDU starts with.
pub const COMMON_HEADER_LEN: usize = 8;
/// Bytes of a header or data digest.
pub const DIGEST_LEN: usize = 4;
/// The smallest MAXH2CDATA a controller may announce.
pub const MIN_MAXH2CDATA: u32 = 4096;
/// The most header bytes a TermReq carries back from the PDU in error.
pub const TERM_REQ_MAX_DATA: usize = 128;

/// Fatal error status of a TermReq: why a connection is being ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Fes {
    /// A header field is invalid; FEI is its byte offset in the PDU.
    InvalidHeaderField = 0x01,
    /// A PDU arrived where the sequence does not allow it.
    PduSequenceError = 0x02,
    /// The header digest does not match the header.
    HeaderDigestError = 0x03,
    /// Data lies outside the range the command or the R2T allows.
    DataOutOfRange = 0x04,
    /// An R2T or data limit was exceeded (MAXR2T, MAXH2CDATA, in-capsule data size).
    R2tLimitExceeded = 0x05,
    /// A parameter (PFV, HPDA, a digest) is not supported; FEI is its byte offset.
    UnsupportedParameter = 0x06,
}

impl Fes {
    /// The status of a received TermReq's FES field, if it is a defined one.
    pub fn from_u16(v: u16) -> Option<Fes> {
        Some(match v {
            0x01 => Fes::InvalidHeaderField,
            0x02 => Fes::PduSequenceError,
            0x03 => Fes::HeaderDigestError,
            0x04 => Fes::DataOutOfRange,
            0x05 => Fes::R2tLimitExceeded,
            0x06 => Fes::UnsupportedParameter,
            _ => return None,
        })
    }

    /// The specification's name.
    pub fn name(self) -> &'static str {
        match self {
            Fes::InvalidHeaderField => "Invalid Header Field",
            Fes::PduSequenceError => "PDU Sequence Error",
            Fes::HeaderDigestError => "Header Digest Error",
            Fes::DataOutOfRange => "Data Transfer Out of Range",
            Fes::R2tLimitExceeded => "R2T Limit Exceeded",
            Fes::UnsupportedParameter => "Unsupported Parameter",
        }
    }
}

/// A fatal protocol error: the connection ends with a TermReq carrying `fes` and `fei`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} (FEI {fei}): {what}", fes.name())]
pub struct PduError {
    /// The fatal error status.
    pub fes: Fes,
    /// Fatal error information: the byte offset of the field in error for Invalid Header
    /// Field and Unsupported Parameter, else 0.
    pub fei: u32,
    /// What was wrong, for logs.
    pub what: &'static str,
    /// The header of the PDU in error (at most [`TERM_REQ_MAX_DATA`] bytes), which the
    /// TermReq carries back; empty when the error is not about one PDU.
    pub header: Vec<u8>,
}

impl PduError {
    /// An error with no PDU header attached.
    pub fn new(fes: Fes, fei: u32, what: &'static str) -> PduError {
        PduError {
            fes,
            fei,
            what,
            header: Vec::new(),
        }
    }

    /// Attaches the header of the PDU in error (cut to [`TERM_REQ_MAX_DATA`] bytes).
    pub fn with_header(mut self, header: &[u8]) -> PduError {
        self.header = header[..header.len().min(TERM_REQ_MAX_DATA)].to_vec();
        self
    }
}
