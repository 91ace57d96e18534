//! Command dispatch and the per-opcode handlers.

pub(crate) mod inquiry;
mod misc;
mod mode;
mod rw;
mod xcopy;

use bytes::Bytes;

use crate::device::{Command, Device, NexusInfo};
use crate::lun::{CmdResult, Fail, Lun};
use crate::sense::{asc, Sense};
use crate::tasks::TaskGuard;

pub use rw::{RwParams, MAX_TRANSFER_BYTES};

/// Operation codes handled by the engine.
pub mod op {
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const READ_6: u8 = 0x08;
    pub const WRITE_6: u8 = 0x0A;
    pub const INQUIRY: u8 = 0x12;
    pub const MODE_SELECT_6: u8 = 0x15;
    pub const RESERVE_6: u8 = 0x16;
    pub const RELEASE_6: u8 = 0x17;
    pub const MODE_SENSE_6: u8 = 0x1A;
    pub const START_STOP_UNIT: u8 = 0x1B;
    pub const PREVENT_ALLOW: u8 = 0x1E;
    pub const READ_CAPACITY_10: u8 = 0x25;
    pub const READ_10: u8 = 0x28;
    pub const WRITE_10: u8 = 0x2A;
    pub const WRITE_VERIFY_10: u8 = 0x2E;
    pub const VERIFY_10: u8 = 0x2F;
    pub const PRE_FETCH_10: u8 = 0x34;
    pub const SYNC_CACHE_10: u8 = 0x35;
    pub const READ_DEFECT_10: u8 = 0x37;
    pub const WRITE_SAME_10: u8 = 0x41;
    pub const UNMAP: u8 = 0x42;
    pub const SANITIZE: u8 = 0x48;
    pub const MODE_SELECT_10: u8 = 0x55;
    pub const MODE_SENSE_10: u8 = 0x5A;
    pub const PR_IN: u8 = 0x5E;
    pub const PR_OUT: u8 = 0x5F;
    pub const EXTENDED_COPY: u8 = 0x83;
    pub const RECEIVE_COPY_RESULTS: u8 = 0x84;
    pub const READ_16: u8 = 0x88;
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    pub const WRITE_16: u8 = 0x8A;
    pub const ORWRITE_16: u8 = 0x8B;
    pub const WRITE_VERIFY_16: u8 = 0x8E;
    pub const VERIFY_16: u8 = 0x8F;
    pub const PRE_FETCH_16: u8 = 0x90;
    pub const SYNC_CACHE_16: u8 = 0x91;
    pub const WRITE_SAME_16: u8 = 0x93;
    pub const WRITE_ATOMIC_16: u8 = 0x9C;
    pub const SERVICE_ACTION_IN_16: u8 = 0x9E;
    pub const REPORT_LUNS: u8 = 0xA0;
    pub const MAINTENANCE_IN: u8 = 0xA3;
    pub const READ_12: u8 = 0xA8;
    pub const WRITE_12: u8 = 0xAA;
    pub const WRITE_VERIFY_12: u8 = 0xAE;
    pub const VERIFY_12: u8 = 0xAF;
    pub const READ_DEFECT_12: u8 = 0xB7;

    /// SERVICE ACTION IN(16) service actions.
    pub const SA_READ_CAPACITY_16: u8 = 0x10;
    pub const SA_GET_LBA_STATUS: u8 = 0x12;
    /// MAINTENANCE IN service action.
    pub const SA_REPORT_SUPPORTED_OPCODES: u8 = 0x0C;
}

/// Big-endian field readers over a CDB or parameter list that never panic: a field past
/// the end reads as zero (CDB lengths are checked up front by `min_cdb_len`).
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([get(b, at), get(b, at + 1)])
}
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([get(b, at), get(b, at + 1), get(b, at + 2), get(b, at + 3)])
}
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    ((be32(b, at) as u64) << 32) | be32(b, at + 4) as u64
}
pub(crate) fn get(b: &[u8], at: usize) -> u8 {
    b.get(at).copied().unwrap_or(0)
}

/// CDB length implied by the operation code's group (SPC-4 4.2.5.1).
pub(crate) fn min_cdb_len(opcode: u8) -> usize {
    match opcode >> 5 {
        0 => 6,
        1 | 2 => 10,
        4 => 16,
        5 => 12,
        _ => 6,
    }
}

/// Bytes of data-out the CDB announces (SPDTL) for data-out commands, or None for
/// commands without data-out.
pub(crate) fn data_out_len(cdb: &[u8], block_size: u32) -> Option<u64> {
    let bs = block_size as u64;
    let opcode = get(cdb, 0);
    Some(match opcode {
        op::WRITE_6 => {
            let n = get(cdb, 4) as u64;
            if n == 0 {
                256 * bs
            } else {
                n * bs
            }
        }
        op::WRITE_10 | op::WRITE_VERIFY_10 => be16(cdb, 7) as u64 * bs,
        op::WRITE_12 | op::WRITE_VERIFY_12 => be32(cdb, 6) as u64 * bs,
        op::WRITE_16 | op::WRITE_VERIFY_16 | op::ORWRITE_16 => be32(cdb, 10) as u64 * bs,
        op::WRITE_ATOMIC_16 => be16(cdb, 12) as u64 * bs,
        op::VERIFY_10 if get(cdb, 1) & 0x06 != 0 => be16(cdb, 7) as u64 * bs,
        op::VERIFY_12 if get(cdb, 1) & 0x06 != 0 => be32(cdb, 6) as u64 * bs,
        op::VERIFY_16 if get(cdb, 1) & 0x06 != 0 => be32(cdb, 10) as u64 * bs,
        op::COMPARE_AND_WRITE => 2 * get(cdb, 13) as u64 * bs,
        op::WRITE_SAME_10 | op::WRITE_SAME_16 if get(cdb, 1) & 0x01 == 0 => bs,
        op::MODE_SELECT_6 => get(cdb, 4) as u64,
        op::MODE_SELECT_10 | op::UNMAP | op::SANITIZE => be16(cdb, 7) as u64,
        op::PR_OUT => be32(cdb, 5) as u64,
        op::EXTENDED_COPY => be32(cdb, 10) as u64,
        _ => return None,
    })
}

/// Commands a nexus may run while another holds a RESERVE(6) reservation (SPC-2 5.5.1).
pub(crate) fn allowed_under_reserve6(opcode: u8) -> bool {
    matches!(
        opcode,
        op::INQUIRY
            | op::REQUEST_SENSE
            | op::REPORT_LUNS
            | op::RELEASE_6
            | op::PR_IN
            | op::MAINTENANCE_IN
    )
}

/// Commands that need the medium (fail NOT READY when it is ejected).
pub(crate) fn needs_medium(opcode: u8) -> bool {
    !matches!(
        opcode,
        op::INQUIRY
            | op::REQUEST_SENSE
            | op::REPORT_LUNS
            | op::START_STOP_UNIT
            | op::PREVENT_ALLOW
            | op::MODE_SENSE_6
            | op::MODE_SENSE_10
            | op::MODE_SELECT_6
            | op::MODE_SELECT_10
            | op::PR_IN
            | op::PR_OUT
            | op::RESERVE_6
            | op::RELEASE_6
            | op::MAINTENANCE_IN
    )
}

/// REPORT LUNS data for `luns` (SELECT REPORT 0, 1, 2 all return the same flat list).
pub(crate) fn report_luns(luns: &[u64], cdb: &[u8]) -> Result<Bytes, Sense> {
    let select = get(cdb, 2);
    if select > 2 && !(0x10..=0x12).contains(&select) {
        return Err(Sense::invalid_cdb_field(2, None));
    }
    let alloc = be32(cdb, 6) as usize;
    if alloc < 16 {
        return Err(Sense::invalid_cdb_field(6, None));
    }
    let mut d = Vec::with_capacity(8 + luns.len() * 8);
    d.extend_from_slice(&((luns.len() * 8) as u32).to_be_bytes());
    d.extend_from_slice(&[0; 4]);
    for &l in luns {
        let entry: u64 = if l < 256 { l << 48 } else { (0x4000 | l) << 48 };
        d.extend_from_slice(&entry.to_be_bytes());
    }
    d.truncate(alloc);
    Ok(Bytes::from(d))
}

impl Lun {
    pub(crate) async fn dispatch(
        &self,
        dev: &Device,
        cmd: &Command,
        info: Option<&NexusInfo>,
        guard: &TaskGuard<'_>,
    ) -> CmdResult {
        let cdb: &[u8] = &cmd.cdb;
        let opcode = cdb[0];
        if cdb.len() < min_cdb_len(opcode) {
            return Err(Sense::illegal(asc::INVALID_OPCODE).into());
        }
        // The CONTROL byte's NACA bit: ACA is not supported.
        let control = cdb[min_cdb_len(opcode) - 1];
        if control & 0x04 != 0 && opcode != op::REQUEST_SENSE {
            return Err(Sense::invalid_cdb_field((min_cdb_len(opcode) - 1) as u16, Some(2)).into());
        }
        match opcode {
            op::READ_6 | op::READ_10 | op::READ_12 | op::READ_16 => {
                self.read(cdb, cmd.read_buffers.as_deref(), guard).await
            }
            op::WRITE_6 | op::WRITE_10 | op::WRITE_12 | op::WRITE_16 => {
                self.write(cmd, false, guard).await
            }
            op::WRITE_ATOMIC_16 => self.write(cmd, true, guard).await,
            op::WRITE_VERIFY_10 | op::WRITE_VERIFY_12 | op::WRITE_VERIFY_16 => {
                self.write_verify(cmd, guard).await
            }
            op::VERIFY_10 | op::VERIFY_12 | op::VERIFY_16 => self.verify(cmd).await,
            op::ORWRITE_16 => self.orwrite(cmd, guard).await,
            op::COMPARE_AND_WRITE => self.compare_and_write(cmd, guard).await,
            op::WRITE_SAME_10 | op::WRITE_SAME_16 => self.write_same(cmd, guard).await,
            op::UNMAP => self.unmap(cmd, guard).await,
            op::PRE_FETCH_10 | op::PRE_FETCH_16 => self.pre_fetch(cdb),
            op::SYNC_CACHE_10 | op::SYNC_CACHE_16 => self.sync_cache(cdb).await,
            op::TEST_UNIT_READY => crate::lun::Done::none(),
            op::REQUEST_SENSE => self.request_sense(cmd),
            op::INQUIRY => self.inquiry(cdb),
            op::MODE_SENSE_6 | op::MODE_SENSE_10 => self.mode_sense(cdb),
            op::MODE_SELECT_6 | op::MODE_SELECT_10 => self.mode_select(cmd),
            op::READ_CAPACITY_10 => self.read_capacity_10(cdb),
            op::SERVICE_ACTION_IN_16 => match cdb[1] & 0x1F {
                op::SA_READ_CAPACITY_16 => self.read_capacity_16(cdb),
                op::SA_GET_LBA_STATUS => self.get_lba_status(cdb).await,
                _ => Err(Sense::invalid_cdb_field(1, Some(4)).into()),
            },
            op::REPORT_LUNS => Ok(crate::lun::Done {
                data: report_luns(&dev.luns(), cdb)?,
                note: None,
                status: 0,
            }),
            op::MAINTENANCE_IN => match cdb[1] & 0x1F {
                op::SA_REPORT_SUPPORTED_OPCODES => self.report_supported_opcodes(cdb),
                _ => Err(Sense::invalid_cdb_field(1, Some(4)).into()),
            },
            op::START_STOP_UNIT => self.start_stop_unit(cmd).await,
            op::PREVENT_ALLOW => self.prevent_allow(cmd),
            op::READ_DEFECT_10 | op::READ_DEFECT_12 => self.read_defect_data(cdb),
            op::RESERVE_6 => self.reserve6(cmd),
            op::RELEASE_6 => self.release6(cmd),
            op::PR_IN => self.pr_in(cdb),
            op::PR_OUT => self.pr_out(dev, cmd, info),
            op::SANITIZE if self.cfg.sanitize => self.sanitize(cmd).await,
            op::EXTENDED_COPY => self.extended_copy(dev, cmd, info, guard).await,
            op::RECEIVE_COPY_RESULTS => self.receive_copy_results(cmd),
            _ => Err(Fail::Check(Sense::illegal(asc::INVALID_OPCODE))),
        }
    }
}
