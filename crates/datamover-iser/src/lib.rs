//! iSCSI over RDMA (iSER, RFC 7145 as Linux speaks it) behind the `datamover` traits, over the
//! `rdma` API, so it runs on ironsan's software iWARP RNIC and on rdma-core devices.
//! [`endpoint`] is one connection as iSER uses it: a queue pair, a completion task woken by
//! the completion channel, a ring of registered receive buffers kept posted (iWARP has no
//! receiver-not-ready retry) and a pool of registered send buffers; a peer with more Sends
//! waiting for the session than receives posted loses the connection ([`credit`]), and so
//! does, abortively, a peer that takes none of what is sent to it for the send-stall time or
//! leaves an RDMA Read unanswered past the data-out timeout. [`target`] accepts a
//! connection (the iSER word of the CM private data both ways) and runs the login phase in
//! iSER mode from the first PDU; [`datamover`] is the target's full feature phase (Data-In as
//! RDMA Writes, solicited data as RDMA Reads, status in Send with Invalidate), its RDMA
//! operations on regions from [`mr_pool`], read data produced in regions it lends ([`lent`]).
//! [`portal`] serves `iser://` on the software RNIC, alone or sharing a port with iSCSI/TCP;
//! [`device_portal`] on a provider's own listener (rdma-core). [`initiator`] is the initiator's
//! end: connection, login in Sends, and a datamover advertising a registered buffer per
//! command, the caller's own write data registered in place through [`write_regs`] (a
//! registration cache). [`target_device`] keeps a target's connections on a device in one
//! protection domain, where a RAM LUN's image is registered once and read data leaves straight
//! from it. [`stats`] counts the target's RDMA operations, bytes and registrations.

pub mod credit;
pub mod datamover;
pub mod device_portal;
pub mod endpoint;
pub mod initiator;
pub mod lent;
pub mod mr_pool;
pub mod portal;
pub mod rnic_task;
pub mod stats;
pub mod target;
pub mod target_device;
pub mod write_regs;

pub use device_portal::DevicePortal;
pub use initiator::IserInitiatorConnection;
pub use portal::IserPortal;
pub use target::{accept, AcceptConfig, IserLogin};
pub use target_device::{LunImage, TargetDevice};
