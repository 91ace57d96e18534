//! The seam between the access generator and a transport: [`BlockDevice`], the reads and
//! writes [`crate::workload`] submits, implemented for iSCSI sessions here and for NVMe/TCP
//! namespaces by [`NvmeNamespace`]. Errors are the iSCSI initiator's type, which the
//! workload reports; an NVMe error keeps its text (and its status's name).

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use iscsi_initiator::scsi::{self, status, Sense};
use iscsi_initiator::{CommandRequest, Error, RecoveryStats, Session};

/// A device of whole blocks that keeps many commands in flight.
pub trait BlockDevice: Send + Sync + 'static {
    /// Reads `blocks` blocks (`len` bytes) at `lba` of logical unit `lun`.
    fn read(
        &self,
        lun: u16,
        lba: u64,
        blocks: u32,
        len: u32,
    ) -> impl Future<Output = Result<Bytes, Error>> + Send;

    /// Writes `data` (`blocks` blocks) at `lba` of logical unit `lun`.
    fn write(
        &self,
        lun: u16,
        lba: u64,
        blocks: u32,
        data: Bytes,
    ) -> impl Future<Output = Result<(), Error>> + Send;

    /// Error recovery counters so far (none by default).
    fn recovery(&self) -> RecoveryStats {
        RecoveryStats::default()
    }

    /// Write data registration counters so far (none by default).
    fn write_registrations(&self) -> datamover::RegistrationStats {
        datamover::RegistrationStats::default()
    }

    /// Connections (or queues) carrying the commands.
    fn connection_count(&self) -> usize;
}

fn scsi_error(what: &str, status: u8, sense: &[u8]) -> Error {
    Error::Scsi {
        what: what.to_string(),
        status,
        sense: Sense::parse(sense),
    }
}

impl BlockDevice for Session {
    async fn read(&self, lun: u16, lba: u64, blocks: u32, len: u32) -> Result<Bytes, Error> {
        let cdb = scsi::read_write(false, lba, blocks, false);
        let r = self
            .execute_past_unit_attentions(CommandRequest::read(lun, cdb, len))
            .await?;
        if r.status != status::GOOD {
            return Err(scsi_error("READ", r.status, &r.sense));
        }
        Ok(r.data)
    }

    async fn write(&self, lun: u16, lba: u64, blocks: u32, data: Bytes) -> Result<(), Error> {
        let cdb = scsi::read_write(true, lba, blocks, false);
        let r = self
            .execute_past_unit_attentions(CommandRequest::write(lun, cdb, data))
            .await?;
        if r.status != status::GOOD {
            return Err(scsi_error("WRITE", r.status, &r.sense));
        }
        Ok(())
    }

    fn recovery(&self) -> RecoveryStats {
        Session::recovery(self)
    }

    fn write_registrations(&self) -> datamover::RegistrationStats {
        Session::write_registrations(self)
    }

    fn connection_count(&self) -> usize {
        Session::connection_count(self)
    }
}

/// One namespace of an NVMe/TCP controller; the `lun` argument is not used.
pub struct NvmeNamespace {
    /// The controller.
    pub controller: Arc<nvme_initiator::Controller>,
    /// The namespace.
    pub nsid: u32,
}

fn nvme_error(e: nvme_initiator::Error) -> Error {
    match e {
        nvme_initiator::Error::Timeout(_) => Error::Timeout(e.to_string()),
        nvme_initiator::Error::Io { .. } | nvme_initiator::Error::Closed(_) => {
            Error::Io(e.to_string())
        }
        _ => Error::Protocol(e.to_string()),
    }
}

impl BlockDevice for NvmeNamespace {
    async fn read(&self, _lun: u16, lba: u64, blocks: u32, _len: u32) -> Result<Bytes, Error> {
        let c = &self.controller;
        c.read(self.nsid, lba, u64::from(blocks))
            .await
            .map_err(nvme_error)
    }

    async fn write(&self, _lun: u16, lba: u64, _blocks: u32, data: Bytes) -> Result<(), Error> {
        let c = &self.controller;
        c.write(self.nsid, lba, data).await.map_err(nvme_error)
    }

    fn connection_count(&self) -> usize {
        self.controller.queues()
    }
}
