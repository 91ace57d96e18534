//! ironsan's NVMe/TCP front end. One job: serve the LUNs the SCSI layer built as NVMe
//! namespaces of NVM subsystems, over NVMe/TCP, beside iSCSI on the same storage.
//!
//! - [`config`]: `[[subsystem]]` in the target's TOML (NQN, allowed hosts, listen
//!   addresses, namespaces naming iSCSI LUNs) and its checks.
//! - [`subsystem`]: a subsystem with its namespaces ([`scsi::LunExport`]s), their NGUID
//!   and EUI-64 derived from the LUN's NAA designator.
//! - [`controller`]: sans IO, the controllers of every subsystem and of the discovery
//!   subsystem: Fabrics Connect (CNTLID, host and subsystem checks), Property Get/Set,
//!   Identify, Get Log Page, Get/Set Features, Keep Alive (timer enforced by
//!   [`controller::Registry::expire`]), Asynchronous Event Requests, and the NVM commands
//!   turned into backend operations.
//! - [`io`]: the NVM commands checked against their namespace and carried out on the
//!   LUN's backend, with NVMe status codes for every failure.
//! - [`driver`]: tokio: listeners, one task per connection (one queue each) running
//!   `nvme_tcp::queue` and the controllers, commands of a queue executed concurrently,
//!   every buffer a host can cause bounded (see [`driver::DriverConfig`]).

pub mod config;
pub mod controller;
pub mod driver;
pub mod io;
pub mod subsystem;

pub use config::{NamespaceConfig, SubsystemConfig, DISCOVERY_NQN};
pub use controller::{Limits, Outcome, QueueBinding, Registry};
pub use driver::{DriverConfig, NvmeTarget};
pub use subsystem::Subsystem;

#[cfg(test)]
mod tests;
