//! Command dispatch and the per-opcode handlers.

pub(crate) mod inquiry;
mod misc;
mod mode;
mod rw;
mod xcopy;

use bytes::Bytes;

use crate::cdb::{be32, byte, min_cdb_len, op};
use crate::command::{Command, NexusInfo};
use crate::lun::{DeviceView, Lun};
use crate::outcome::{CmdResult, Done, Fail};
use crate::sense::{asc, Sense};
use crate::tasks::TaskGuard;

pub use rw::{RwParams, MAX_TRANSFER_BYTES};

/// REPORT LUNS data for `luns` (SELECT REPORT 0, 1, 2 all return the same flat list).
pub(crate) fn report_luns(luns: &[u64], cdb: &[u8]) -> Result<Bytes, Sense> {
    let select = byte(cdb, 2);
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
        dev: &dyn DeviceView,
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
            op::TEST_UNIT_READY => Done::none(),
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
            op::REPORT_LUNS => Ok(Done {
                data: report_luns(&dev.luns(), cdb)?,
                note: None,
                status: 0,
            }),
            op::MAINTENANCE_IN => match cdb[1] & 0x1F {
                op::SA_REPORT_SUPPORTED_OPCODES => self.report_supported_opcodes(cdb),
                crate::alua::SA_REPORT_TARGET_PORT_GROUPS => match &self.alua {
                    Some(alua) => Done::data(alua.report_target_port_groups(cdb)?),
                    None => Err(Sense::invalid_cdb_field(1, Some(4)).into()),
                },
                _ => Err(Sense::invalid_cdb_field(1, Some(4)).into()),
            },
            op::START_STOP_UNIT => self.start_stop_unit(cmd).await,
            op::PREVENT_ALLOW => self.prevent_allow(cmd),
            op::READ_DEFECT_10 | op::READ_DEFECT_12 => self.read_defect_data(cdb),
            op::RESERVE_6 => self.reserve6(cmd),
            op::RELEASE_6 => self.release6(cmd),
            op::PR_IN => self.pr_in(dev, cdb).await,
            op::PR_OUT => self.pr_out(dev, cmd, info).await,
            op::SANITIZE if self.cfg.sanitize => self.sanitize(cmd).await,
            op::EXTENDED_COPY => self.extended_copy(dev, cmd, info, guard).await,
            op::RECEIVE_COPY_RESULTS => self.receive_copy_results(cmd),
            _ => Err(Fail::Check(Sense::illegal(asc::INVALID_OPCODE))),
        }
    }
}
