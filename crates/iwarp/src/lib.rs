//! Sans-IO iWARP wire codecs: MPA start frames (Request/Reply, revisions 1 and 2 with the RFC 6581
//! IRD/ORD word and ready-to-receive negotiation), MPA FPDU framing (length, pad, CRC32C, marker
//! refusal), DDP tagged/untagged segment headers and the RDMAP opcodes, Read Request and Terminate
//! bodies. Everything here turns bytes into typed values and back; no sockets, clocks or threads, so
//! the software RNIC (crate `rnic`) and the capture analyzer can share one tested implementation.

pub mod crc;
pub mod ddp;
mod fields;
pub mod fpdu;
pub mod mpa;
pub mod rdmap;
pub mod terminate_code;

pub use ddp::{DdpHeader, Opcode, TaggedHeader, UntaggedHeader};
pub use fields::WireError;
pub use fpdu::{FpduLayout, MAX_ULPDU};
pub use mpa::{MpaFrame, MpaKind, Negotiated, Rfc6581};
pub use rdmap::{ReadRequest, Terminate};
pub use terminate_code::{TermLayer, TerminateCode};
