//! The ironsan NVMe/TCP host (initiator): one job, reaching namespaces of an NVMe/TCP
//! controller (issue 42's second front end, or any NVMe/TCP target such as Linux's nvmet).
//!
//! - [`host`]: one connection's host side, sans IO: the IC exchange with header/data digest
//!   negotiation, command capsules with in-capsule data up to the controller's limit, R2Ts
//!   answered by H2CData cut at MAXH2CDATA, C2HData reassembly (with the SUCCESS flag),
//!   response capsules matched by CID, TermReqs; every bad input ends the connection with a
//!   typed [`HostError`], never a panic.
//! - [`conn`]: one queue's TCP connection driving a [`HostQueue`] with tokio: a reader and a
//!   writer task, many commands outstanding (the CID space is the queue's depth).
//! - [`controller`]: [`Controller::connect`] brings a controller up (admin Connect, CAP,
//!   CC.EN and CSTS.RDY, Identify, Number of Queues, I/O queue Connects, Keep Alive at
//!   KATO/2); then `read`, `write`, `flush`, `write_zeroes`, `deallocate`.
//!
//! The PDUs, SQE/CQE and Identify fields come from the `nvme-tcp` crate.

pub mod conn;
pub mod controller;
pub mod error;
pub mod host;

pub use controller::{ConnectOptions, Controller, Namespace, DEFAULT_HOSTNQN};
pub use error::Error;
pub use host::{Completion, HostConfig, HostError, HostQueue, SubmitError};
