//! iSCSI over TCP, for both roles, behind the `datamover` traits: [`frame`] is the one PDU
//! framer (BHS, AHS, padding, header and data digests, the CRC fused with the receive
//! copy, vectored sends), [`trace`] the one tracing hook (every byte into a pcapng trace),
//! [`target`] the target's portal, login channel and datamover (Data-In, R2T, Data-Out),
//! [`initiator`] the initiator's connection and datamover (login-phase PDUs, then Data-In
//! placed and R2Ts answered by a sans-IO data path),
//! [`digest_buf`] the read buffers the target lends so data digests ride on the backend's
//! copy, [`poll`] the window both readers poll their socket in after each PDU.

pub mod digest_buf;
pub mod frame;
pub mod initiator;
pub mod poll;
mod socket;
pub mod target;
pub mod trace;

pub use target::{login_channels, login_channels_polling, TcpConnection, TcpDatamover, TcpPortal};
