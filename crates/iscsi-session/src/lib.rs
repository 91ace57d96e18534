//! Sans-IO state of an iSCSI session in full feature phase (RFC 7143), shared by the
//! target and the initiator: the CmdSN window that orders commands across a session's
//! connections, the tracker that validates Data-Out PDUs and decides which R2Ts to send,
//! the segmentation of read data into Data-In PDUs and bursts, the initiator's Data-Out
//! sequences, the target's StatSN numbering with retention of unacknowledged status, and
//! what a SNACK asks for again at ErrorRecoveryLevel 1 ([`erl1`]). Pure state machines:
//! the runtimes feed them header fields and act on what they return.

pub mod data_out;
pub mod erl1;
pub mod read;
pub mod status;
pub mod window;
pub mod write;

pub use data_out::DataOutSequence;
pub use read::{data_in_segments, DataSegment};
pub use status::StatusSeq;
pub use window::{Admission, CmdWindow};
pub use write::{R2tRequest, WriteError, WriteLimits, WriteTransfer};
