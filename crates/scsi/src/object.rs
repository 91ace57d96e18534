//! An object-based storage logical unit (T10 OSD-2, peripheral device type 0x11): the SPC
//! commands every logical unit answers (INQUIRY, TEST UNIT READY, REQUEST SENSE, REPORT LUNS)
//! here, and the OSD commands (opcode 0x7F) handed to the `osd` crate's unit on a blocking
//! thread (it does file and database I/O; running it in place with `block_in_place` measured
//! no faster: the unit's own SQLite work dominates a small command).

use std::sync::Arc;

use bytes::Bytes;

use crate::cdb::op;
use crate::cmds::inquiry::pad_ascii;
use crate::cmds::report_luns;
use crate::command::{finish_data_in, finish_error, Command, Residual, Response};
use crate::sense::{asc, Sense};
use crate::status;

/// Peripheral device type of an object-based storage device.
pub const OSD_DEVICE_TYPE: u8 = 0x11;

/// The largest data-in one OSD command may return: the unit allocates what the initiator
/// says it expects, which the network sets (up to 4 GiB).
const MAX_DATA_IN: u32 = 64 << 20;

/// Version descriptors: SAM-5, iSCSI, SPC-4, OSD-2.
const VERSION_DESCRIPTORS: [u16; 4] = [0x00A0, 0x0960, 0x0460, 0x0340];

/// Supported VPD pages, ascending.
const VPD_PAGES: [u8; 3] = [0x00, 0x80, 0x83];

pub(crate) struct ObjectLun {
    unit: Arc<osd::OsdUnit>,
    vendor: String,
    product: String,
    revision: String,
    serial: String,
    naa: Vec<u8>,
}

impl ObjectLun {
    pub(crate) fn open(
        dir: &std::path::Path,
        capacity: u64,
        cfg: &crate::config::LunConfig,
        serial: String,
        naa: Vec<u8>,
    ) -> Result<ObjectLun, String> {
        let unit = osd::OsdUnit::open(dir, capacity)
            .map_err(|e| format!("object store {}: {e}", dir.display()))?;
        Ok(ObjectLun {
            unit: Arc::new(unit),
            vendor: cfg.vendor.clone(),
            product: cfg.product.clone(),
            revision: cfg.revision.clone(),
            serial,
            naa,
        })
    }

    pub(crate) async fn execute(&self, luns: &[u64], cmd: Command) -> Response {
        let opcode = cmd.cdb.first().copied().unwrap_or(0xFF);
        let fixed = |d: Result<Vec<u8>, Sense>| match d {
            Ok(data) => data_in(&cmd, data),
            Err(s) => refused(&cmd, &s),
        };
        match opcode {
            osd::cdb::OPCODE => self.osd_command(&cmd).await,
            op::INQUIRY => fixed(self.inquiry(&cmd.cdb)),
            op::TEST_UNIT_READY => data_in(&cmd, Vec::new()),
            op::REQUEST_SENSE => {
                let alloc = cmd.cdb.get(4).copied().unwrap_or(0) as usize;
                let mut s = Sense::new(0, (0, 0)).to_fixed().to_vec();
                s.truncate(alloc);
                data_in(&cmd, s)
            }
            op::REPORT_LUNS => fixed(report_luns(luns, &cmd.cdb).map(|b| b.to_vec())),
            _ => refused(&cmd, &Sense::illegal(asc::INVALID_OPCODE)),
        }
    }

    async fn osd_command(&self, cmd: &Command) -> Response {
        let read_len = match (cmd.bidi_read_len, cmd.read) {
            (Some(n), _) => n,
            (None, true) => cmd.expected_len,
            (None, false) => 0,
        };
        let unit = self.unit.clone();
        let cdb = cmd.cdb.clone();
        let data_out = if cmd.write {
            cmd.data_out.clone()
        } else {
            Bytes::new()
        };
        let allowed = read_len.min(MAX_DATA_IN);
        let reply = tokio::task::spawn_blocking(move || unit.execute(&cdb, &data_out, allowed))
            .await
            .unwrap_or_else(|e| {
                tracing::warn!("OSD command failed: {e}");
                osd::Reply {
                    status: osd::CHECK_CONDITION,
                    sense: Some(osd::SenseCode::internal_failure()),
                    data_in: Vec::new(),
                }
            });
        let data = Bytes::from(reply.data_in);
        let read_residual = match read_len.saturating_sub(data.len() as u32) {
            0 => Residual::None,
            n => Residual::Underflow(n),
        };
        // OSD answers in descriptor-format sense (it carries the object identification).
        let sense = reply.sense.map(|s| Bytes::from(s.to_descriptor()));
        let (residual, bidi_read_residual) = match cmd.bidi_read_len {
            Some(_) => (Residual::None, Some(read_residual)),
            None if read_len > 0 => (read_residual, None),
            None => (Residual::None, None),
        };
        Response {
            status: reply.status,
            sense,
            data_in: data,
            data_in_note: None,
            residual,
            bidi_read_residual,
            aborted: false,
        }
    }

    fn inquiry(&self, cdb: &[u8]) -> Result<Vec<u8>, Sense> {
        if cdb.len() < 6 || cdb[1] & 0x02 != 0 {
            return Err(Sense::invalid_cdb_field(1, Some(1)));
        }
        let alloc = u16::from_be_bytes([cdb[3], cdb[4]]) as usize;
        let mut d = if cdb[1] & 0x01 == 0 {
            if cdb[2] != 0 {
                return Err(Sense::invalid_cdb_field(2, None));
            }
            self.standard_inquiry()
        } else {
            let body = match cdb[2] {
                0x00 => VPD_PAGES.to_vec(),
                0x80 => self.serial.as_bytes().to_vec(),
                0x83 => self.device_identification(),
                _ => return Err(Sense::invalid_cdb_field(2, None)),
            };
            let mut d = vec![OSD_DEVICE_TYPE, cdb[2], 0, 0];
            d[2..4].copy_from_slice(&(body.len() as u16).to_be_bytes());
            d.extend_from_slice(&body);
            d
        };
        d.truncate(alloc);
        Ok(d)
    }

    fn standard_inquiry(&self) -> Vec<u8> {
        let mut d = vec![0u8; 74];
        d[0] = OSD_DEVICE_TYPE; // connected, object-based storage device
        d[2] = 0x06; // SPC-4
        d[3] = 0x12; // HISUP, response data format 2
        d[4] = (d.len() - 5) as u8;
        d[7] = 0x02; // CMDQUE
        pad_ascii(&mut d[8..16], &self.vendor);
        pad_ascii(&mut d[16..32], &self.product);
        pad_ascii(&mut d[32..36], &self.revision);
        for (i, v) in VERSION_DESCRIPTORS.iter().enumerate() {
            d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
        }
        d
    }

    /// VPD 0x83: the NAA designator of the logical unit.
    fn device_identification(&self) -> Vec<u8> {
        let mut d = vec![0x01, 0x03, 0x00, self.naa.len() as u8]; // binary, LU, NAA
        d.extend_from_slice(&self.naa);
        d
    }
}

/// GOOD with `data` (cut to what the initiator expects).
fn data_in(cmd: &Command, data: Vec<u8>) -> Response {
    finish_data_in(cmd, Bytes::from(data), status::GOOD)
}

fn refused(cmd: &Command, s: &Sense) -> Response {
    finish_error(cmd, status::CHECK_CONDITION, Some(s.encode(true)))
}
