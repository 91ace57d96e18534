//! SCSI direct-access device emulation (SBC-3/SPC-4) for ironsan. One job: turn a CDB
//! (plus its data-out buffer) into status, sense and data-in, for a set of logical units
//! backed by `storage` backends. It knows nothing about iSCSI or any transport: the target
//! runtime builds a [`Command`] per SCSI command and sends back the [`Response`].
//!
//! # How the runtime uses it
//! ```ignore
//! let device = scsi::Device::new("iqn.2024-01.org.example:t1", vec![(0, lun_config)])?;
//! device.nexus_added(nexus, "iqn.initiator,i,0x23d000000001", transport_id);
//! let rsp = device.execute(Command { nexus, lun: 0, cdb, .. }).await;
//! if !rsp.aborted { /* send rsp.status, rsp.sense, rsp.data_in, rsp.residual */ }
//! device.nexus_removed(nexus);
//! ```
//!
//! * LUNs: built from their [`LunConfig`] in one place, for the device's start
//!   ([`Device::new`]) and while it runs ([`Device::add_lun`], [`Device::remove_lun`]).
//!   A change publishes a new LUN map whole, so a command's lookup is one uncontended read
//!   lock; every nexus then hears REPORTED LUNS DATA HAS CHANGED once, on its next command
//!   to any LUN (REPORT LUNS clears it), and commands to a removed LUN get LOGICAL UNIT
//!   NOT SUPPORTED while those already running on it finish. A LUN's read-only flag and
//!   size change in place too ([`Device::set_read_only`], [`Device::resize_lun`]: every
//!   nexus then hears CAPACITY DATA HAS CHANGED), and [`Device::lun_config`] tells each
//!   LUN's configuration as it runs.
//! * Concurrency: `execute` may be called concurrently for any number of commands;
//!   SIMPLE tasks run in parallel, ORDERED tasks wait for older ones, HEAD OF QUEUE tasks
//!   start at once. Reads of independent ranges never share a lock across an await.
//! * Abort: task management calls ([`Device::abort_task`], [`Device::lun_reset`], ...)
//!   mark matching in-flight tasks aborted and wait until they finish; an aborted task's
//!   future resolves with `Response::aborted == true`, which the transport must not send.
//!   An aborted task stops waiting at once, whether for older tasks (ORDERED) or for a
//!   range of blocks another task holds; the range a read keeps while its data is being
//!   sent is released by aborting that task (ABORT TASK, ABORT TASK SET, CLEAR TASK SET,
//!   LUN or target reset, [`Device::nexus_removed`]).
//!   Dropping an `execute` future is also safe (the task leaves the task set; a backend
//!   write already handed to the kernel still completes).
//! * Persistent reservations (`pr`): registrations name an I_T nexus by initiator port and
//!   relative target port ([`Device::set_relative_port`], 1 unless set), or the initiator
//!   port through every target port (ALL_TG_PT). A LUN with a shared record (its
//!   `reservations` file, or its backend's [`storage::Backend::shared_state`]) keeps them
//!   there (`pr_shared`: the record and its encoding; `lun_pr_shared`: the LUN reading,
//!   adopting and writing it), so the gateways exporting one LUN share them and they outlive
//!   a gateway's restart; other LUNs keep them in memory.
//! * Counters: each block LUN counts its commands, bytes and latency by direction and
//!   the commands running on it ([`stats`]), read whole by [`Device::lun_stats`].
//! * Gateways: with a [`GatewayConfig`] ([`Device::with_gateway`]) the device is one of
//!   several gateways exporting the same LUNs, with asymmetric access ([`alua`]): INQUIRY's
//!   TPGS, the target port designators, REPORT TARGET PORT GROUPS, and each shared LUN's
//!   state following its owner ([`storage::ExclusiveOwner`]). A LUN owned through an
//!   `owner_lock` file also checks, through a roster beside it (`gateway_roster`), that no
//!   other gateway claims this one's port group or relative port; if one does, this gateway
//!   does not serve the LUN.
//!   state following its owner ([`storage::ExclusiveOwner`]).
//! * Other front ends: [`Device::lun_export`] hands a block LUN's backend, geometry and
//!   identity to another protocol (NVMe/TCP) serving the same storage.
//! * Sense: returned raw, fixed (0x70) or descriptor (0x72) format per the D_SENSE bit of
//!   the control mode page.

pub mod alua;
mod cdb;
pub(crate) mod cmds;
mod command;
pub mod config;
mod device;
mod export;
mod fault_log;
mod gateway_roster;
mod lun;
mod lun_pr_shared;
mod object;
mod outcome;
mod pr;
mod pr_shared;
pub mod stats;
mod tasks;

pub use alua::{AccessState, AluaStatus};
pub use cdb::op;
pub use cmds::{RwParams, MAX_TRANSFER_BYTES};
pub use command::{Command, NexusId, Residual, Response, TaskAttr};
pub use config::{BackendConfig, ByteSize, GatewayConfig, IoConfig, LunConfig, PeerConfig};
pub use device::{Device, DeviceError, ImageProvider, LunChangeError, ResetKind};
pub use export::LunExport;
pub use object::OSD_DEVICE_TYPE;
/// Status codes and sense data are the shared SCSI vocabulary's.
pub use scsi_spec::{sense, status, Sense};
pub use stats::{Direction, LunStatsSnapshot};

#[cfg(test)]
mod tests;
