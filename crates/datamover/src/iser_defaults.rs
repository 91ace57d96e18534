//! The iSER settings the iSCSI layers and their configuration need without depending on the
//! iSER implementation: what a target's iSER connections receive (declared at login) and the
//! software RNIC's default polling window (a configuration default on both roles).
//! `datamover-iser` re-exports them where it uses them.

use std::time::Duration;

/// Largest data segment a target's iSER receive buffers hold (its declared
/// iSERTargetRecvDataSegmentLength; LIO declares 8192). 16 KiB: a write that fits travels as
/// immediate data in the command's Send, which beats fetching it with an RDMA Read (a round
/// trip the initiator must wake up for); see docs/performance-notes.md.
pub const DEFAULT_RECV_DATA: u32 = 16_384;

/// Receives a target's iSER connection keeps posted beyond the command window (its declared
/// MaxOutstandingUnexpectedPDUs).
pub const UNEXPECTED_RECVS: u32 = 64;

/// How long the software RNIC's engine polls on after its last work before it sleeps.
pub const DEFAULT_POLL: Duration = Duration::from_micros(50);
