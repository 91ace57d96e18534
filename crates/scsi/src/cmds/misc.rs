//! REQUEST SENSE, START STOP UNIT, PREVENT ALLOW MEDIUM REMOVAL, READ DEFECT DATA,
//! RESERVE/RELEASE(6), PERSISTENT RESERVE IN/OUT glue, SANITIZE.

use std::sync::Arc;

use bytes::Bytes;

use crate::cdb::{be16, be32, byte, op};
use crate::command::{Command, NexusInfo};
use crate::lun::{DeviceView, Lun};
use crate::outcome::{CmdResult, Done, Fail};
use crate::sense::{asc, key, Sense};
use crate::status;

/// Marks the LUN as sanitizing (other commands get NOT READY, SANITIZE IN PROGRESS)
/// for as long as it lives, including when the command future is dropped midway.
struct SanitizeInProgress<'a>(&'a Lun);

impl<'a> SanitizeInProgress<'a> {
    fn start(lun: &'a Lun) -> Self {
        let mut st = lun.state();
        st.sanitizing = true;
        lun.refresh(&st);
        SanitizeInProgress(lun)
    }
}

impl Drop for SanitizeInProgress<'_> {
    fn drop(&mut self) {
        let mut st = self.0.state();
        st.sanitizing = false;
        self.0.refresh(&st);
    }
}

impl Lun {
    pub(crate) fn request_sense(&self, cmd: &Command) -> CmdResult {
        let cdb: &[u8] = &cmd.cdb;
        let desc = cdb[1] & 0x01 != 0;
        let alloc = byte(cdb, 4) as usize;
        let sense = match self.take_ua(cmd.nexus) {
            Some(code) => Sense::new(key::UNIT_ATTENTION, code),
            None if self.state().sanitizing => Sense::new(key::NOT_READY, asc::NOT_READY_SANITIZE),
            None => Sense::new(key::NO_SENSE, asc::NO_ADDITIONAL),
        };
        let d = if desc {
            sense.to_descriptor()
        } else {
            sense.to_fixed().to_vec()
        };
        Done::alloc(d, alloc)
    }

    pub(crate) async fn start_stop_unit(&self, cmd: &Command) -> CmdResult {
        let cdb: &[u8] = &cmd.cdb;
        let power_condition = cdb[4] >> 4;
        let loej = cdb[4] & 0x02 != 0;
        let start = cdb[4] & 0x01 != 0;
        if power_condition != 0 {
            // Power conditions are accepted and ignored (no standby states); LOEJ/START
            // are ignored with a non-zero POWER CONDITION (SBC-3 5.25).
            return Done::none();
        }
        if !loej {
            if !start && cdb[4] & 0x04 == 0 {
                // Stopping flushes the cache unless NO_FLUSH.
                let _ = self.backend.flush().await;
            }
            return Done::none();
        }
        if !self.cfg.removable {
            if start {
                return Done::none();
            }
            return Err(Sense::illegal((0x53, 0x00)).into()); // medium load or eject failed
        }
        let mut st = self.state();
        if !start {
            if !st.prevent.is_empty() {
                return Err(Sense::illegal(asc::MEDIUM_REMOVAL_PREVENTED).into());
            }
            st.ejected = true;
        } else {
            st.ejected = false;
        }
        self.refresh(&st);
        Done::none()
    }

    pub(crate) fn prevent_allow(&self, cmd: &Command) -> CmdResult {
        let prevent = cmd.cdb[4] & 0x03;
        if prevent > 1 {
            return Err(Sense::invalid_cdb_field(4, Some(1)).into());
        }
        let mut st = self.state();
        if prevent == 1 && self.cfg.removable {
            st.prevent.insert(cmd.nexus);
        } else {
            st.prevent.remove(&cmd.nexus);
        }
        Done::none()
    }

    pub(crate) fn read_defect_data(&self, cdb: &[u8]) -> CmdResult {
        let twelve = cdb[0] == op::READ_DEFECT_12;
        let (flags, alloc) = if twelve {
            (cdb[1], be32(cdb, 6) as usize)
        } else {
            (cdb[2], be16(cdb, 7) as usize)
        };
        let format = flags & 0x07;
        // No defects: a header with an empty list, in the requested format.
        let byte1 = flags & 0x18 | format;
        let d = if twelve {
            vec![0, byte1, 0, 0, 0, 0, 0, 0]
        } else {
            vec![0, byte1, 0, 0]
        };
        Done::alloc(d, alloc)
    }

    pub(crate) fn reserve6(&self, cmd: &Command) -> CmdResult {
        if cmd.cdb[1] & 0x01 != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(0)).into()); // 3rd party reservations
        }
        let mut st = self.state();
        if st.pr.reservation.is_some() {
            return Err(Fail::Status(status::RESERVATION_CONFLICT));
        }
        match st.reserve6 {
            Some(holder) if holder != cmd.nexus => {
                return Err(Fail::Status(status::RESERVATION_CONFLICT))
            }
            _ => st.reserve6 = Some(cmd.nexus),
        }
        self.refresh(&st);
        Done::none()
    }

    pub(crate) fn release6(&self, cmd: &Command) -> CmdResult {
        let mut st = self.state();
        if st.pr.reservation.is_some() && st.reserve6.is_none() {
            return Err(Fail::Status(status::RESERVATION_CONFLICT));
        }
        if st.reserve6 == Some(cmd.nexus) {
            st.reserve6 = None;
        }
        self.refresh(&st);
        Done::none()
    }

    pub(crate) async fn pr_in(&self, dev: &dyn DeviceView, cdb: &[u8]) -> CmdResult {
        let alloc = be16(cdb, 7) as usize;
        let d = match &self.shared_pr {
            Some(sh) => self.pr_in_shared(sh, dev, cdb).await?,
            None => self.state().pr.pr_in(cdb)?,
        };
        Done::alloc(d, alloc)
    }

    pub(crate) async fn pr_out(
        &self,
        dev: &dyn DeviceView,
        cmd: &Command,
        info: Option<&NexusInfo>,
    ) -> CmdResult {
        let (port, tid, rtp): (Arc<str>, Bytes, u16) = match info {
            Some(i) => (i.port.clone(), i.transport_id.clone(), i.rel_port),
            None => (
                Arc::from(format!("nexus-{}", cmd.nexus.0)),
                Bytes::new(),
                dev.relative_port(),
            ),
        };
        if self.state().reserve6.is_some_and(|h| h != cmd.nexus) {
            return Err(Fail::Status(status::RESERVATION_CONFLICT));
        }
        if let Some(sh) = &self.shared_pr {
            self.pr_out_shared(sh, dev, cmd, &port, rtp, &tid).await?;
            return Done::none();
        }
        let mut st = self.state();
        let notices = st.pr.pr_out(&cmd.cdb, &cmd.data_out, &port, rtp, &tid)?;
        if !notices.is_empty() {
            let nexuses = dev.known_nexus_ports();
            for n in notices {
                let targets: Vec<_> = nexuses
                    .iter()
                    .filter(|(_, np)| n.reaches(np, rtp))
                    .map(|(id, _)| *id)
                    .collect();
                self.raise_ua(&mut st, &targets, None, n.code);
            }
        }
        self.refresh(&st);
        Done::none()
    }

    pub(crate) async fn sanitize(&self, cmd: &Command) -> CmdResult {
        let cdb: &[u8] = &cmd.cdb;
        let sa = cdb[1] & 0x1F;
        let ause = cdb[1] & 0x20 != 0;
        let param_len = be16(cdb, 7) as usize;
        if cdb[1] & 0x40 != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(6)).into());
        }
        if let Some(i) = (2..7).find(|&i| cdb[i] != 0) {
            return Err(Sense::invalid_cdb_field(i as u16, None).into());
        }
        let pattern: Option<Bytes> = match sa {
            0x01 => {
                if param_len < 5 || param_len > self.block_size as usize + 4 {
                    return Err(Sense::invalid_cdb_field(7, None).into());
                }
                let data = &cmd.data_out[..param_len.min(cmd.data_out.len())];
                if data.len() < param_len {
                    return Err(Sense::illegal(asc::PARAMETER_LIST_LENGTH_ERROR).into());
                }
                let count = data[0] & 0x1F;
                let plen = be16(data, 2) as usize;
                if count == 0 {
                    return Err(Sense::invalid_param_field(0, Some(4)).into());
                }
                if plen == 0 || plen > self.block_size as usize || plen + 4 != param_len {
                    return Err(Sense::invalid_param_field(2, None).into());
                }
                Some(Bytes::copy_from_slice(&data[4..4 + plen]))
            }
            0x02 | 0x03 => {
                if !self.sanitize_erase_supported() {
                    return Err(Sense::invalid_cdb_field(1, Some(4)).into());
                }
                if param_len != 0 {
                    return Err(Sense::invalid_cdb_field(7, None).into());
                }
                None
            }
            0x1F => {
                if param_len != 0 {
                    return Err(Sense::invalid_cdb_field(7, None).into());
                }
                return Done::none();
            }
            _ => return Err(Sense::invalid_cdb_field(1, Some(4)).into()),
        };
        let _ = ause;
        if self.write_protected() {
            let code = if self.read_only() {
                asc::WRITE_PROTECTED
            } else {
                asc::SOFTWARE_WRITE_PROTECTED
            };
            return Err(Sense::new(key::DATA_PROTECT, code).into());
        }
        let _sanitizing = SanitizeInProgress::start(self);
        let size = self.num_blocks() << self.bs_shift;
        let result = match pattern {
            None => {
                if self.thin {
                    self.backend.punch(0, size).await
                } else {
                    self.backend.write_zeroes(0, size).await
                }
            }
            Some(p) => {
                let chunk_len = 1usize << 20;
                let mut chunk = Vec::with_capacity(chunk_len);
                while chunk.len() < chunk_len {
                    chunk.extend_from_slice(&p);
                }
                // Keep whole pattern repetitions per block: restart the pattern at each block.
                let bs = self.block_size as usize;
                let mut block = Vec::with_capacity(bs);
                while block.len() < bs {
                    let n = (bs - block.len()).min(p.len());
                    block.extend_from_slice(&p[..n]);
                }
                let per = (chunk_len / bs).max(1);
                let buf = Bytes::from(block.repeat(per));
                let mut at = 0u64;
                let mut r = Ok(());
                while at < size && r.is_ok() {
                    let n = (buf.len() as u64).min(size - at) as usize;
                    r = self.backend.write_at(at, buf.slice(..n), false).await;
                    at += n as u64;
                }
                if r.is_ok() {
                    r = self.backend.flush().await;
                }
                r
            }
        };
        result.map_err(|e| self.backend_failed("sanitize", 0, &e, asc::WRITE_ERROR))?;
        Done::none()
    }
}
