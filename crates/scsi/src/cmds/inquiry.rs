//! INQUIRY (standard data and VPD pages), READ CAPACITY, REPORT SUPPORTED OPERATION CODES
//! (REPORT TARGET PORT GROUPS among them with `[gateway]`).

use super::rw::{
    MAX_CAW_BLOCKS, MAX_TRANSFER_BYTES, MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS,
    MAX_WRITE_SAME_BLOCKS,
};
use crate::cdb::{be16, be32, op};
use crate::lun::Lun;
use crate::outcome::{CmdResult, Done};
use crate::sense::Sense;

/// Whether EXTENDED COPY is offered (3PC bit, supported opcodes).
pub(crate) const XCOPY_SUPPORTED: bool = true;

/// Version descriptors: SAM-5, iSCSI, SPC-4, SBC-3.
const VERSION_DESCRIPTORS: [u16; 4] = [0x00A0, 0x0960, 0x0460, 0x04C0];

/// Supported VPD pages, ascending.
const VPD_PAGES: [u8; 6] = [0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2];

/// `s` in `out`, padded with spaces (INQUIRY's vendor, product and revision fields).
pub(crate) fn pad_ascii(out: &mut [u8], s: &str) {
    out.fill(b' ');
    for (o, b) in out.iter_mut().zip(s.bytes()) {
        *o = b;
    }
}

impl Lun {
    pub(crate) fn inquiry(&self, cdb: &[u8]) -> CmdResult {
        let evpd = cdb[1] & 0x01 != 0;
        let page = cdb[2];
        let alloc = be16(cdb, 3) as usize;
        if cdb[1] & 0x02 != 0 {
            // CMDDT (obsolete) is not supported.
            return Err(Sense::invalid_cdb_field(1, Some(1)).into());
        }
        if !evpd {
            if page != 0 {
                return Err(Sense::invalid_cdb_field(2, None).into());
            }
            return Done::alloc(self.standard_inquiry(), alloc);
        }
        let body = match page {
            0x00 => VPD_PAGES.to_vec(),
            0x80 => self.serial.as_bytes().to_vec(),
            0x83 => self.device_identification(),
            0xB0 => self.block_limits(),
            0xB1 => {
                let mut b = vec![0u8; 0x3C];
                b[1] = 0x01; // medium rotation rate: non-rotating
                if self.sanitize_erase_supported() {
                    // WABEREQ = WACEREQ = 01b: reads after BLOCK/CRYPTO ERASE succeed.
                    b[3] = 0x40 | 0x10;
                }
                b
            }
            0xB2 => self.logical_block_provisioning(),
            _ => return Err(Sense::invalid_cdb_field(2, None).into()),
        };
        let mut d = vec![0x00, page, 0, 0];
        d[2..4].copy_from_slice(&(body.len() as u16).to_be_bytes());
        d.extend_from_slice(&body);
        Done::alloc(d, alloc)
    }

    fn standard_inquiry(&self) -> Vec<u8> {
        let mut d = vec![0u8; 96];
        d[0] = 0x00; // connected, direct access block device
        d[1] = if self.cfg.removable { 0x80 } else { 0 };
        d[2] = 0x06; // SPC-4
        d[3] = 0x12; // HISUP, response data format 2
        d[4] = (d.len() - 5) as u8;
        d[5] = if XCOPY_SUPPORTED { 0x08 } else { 0 }; // 3PC: EXTENDED COPY
        if self.alua.is_some() {
            d[5] |= 0x10; // TPGS 01b: implicit asymmetric access
        }
        d[6] = 0x00;
        d[7] = 0x02; // CMDQUE
        pad_ascii(&mut d[8..16], &self.cfg.vendor);
        pad_ascii(&mut d[16..32], &self.cfg.product);
        pad_ascii(&mut d[32..36], &self.cfg.revision);
        for (i, v) in VERSION_DESCRIPTORS.iter().enumerate() {
            d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
        }
        d
    }

    fn device_identification(&self) -> Vec<u8> {
        let mut b = Vec::new();
        // NAA, LU association, binary.
        b.extend_from_slice(&[0x01, 0x03, 0x00, self.naa.len() as u8]);
        b.extend_from_slice(&self.naa);
        // T10 vendor ID: vendor (8) + serial, ASCII.
        let mut t10 = vec![b' '; 8];
        pad_ascii(&mut t10, &self.cfg.vendor);
        t10.extend_from_slice(self.serial.as_bytes());
        b.extend_from_slice(&[0x02, 0x01, 0x00, t10.len() as u8]);
        b.extend_from_slice(&t10);
        // SCSI name string of the target device (UTF-8, null padded to a multiple of 4).
        let mut name = self.target_name.as_bytes().to_vec();
        name.truncate(250);
        name.push(0);
        while !name.len().is_multiple_of(4) {
            name.push(0);
        }
        b.extend_from_slice(&[0x53, 0xA8, 0x00, name.len() as u8]);
        b.extend_from_slice(&name);
        match &self.alua {
            // This gateway's relative target port and target port group.
            Some(alua) => b.extend_from_slice(&alua.designators()),
            // Relative target port 1 (iSCSI protocol, target port association).
            None => b.extend_from_slice(&[0x51, 0x94, 0x00, 0x04, 0, 0, 0, 1]),
        }
        b
    }

    fn block_limits(&self) -> Vec<u8> {
        let mut b = vec![0u8; 0x3C];
        b[0] = 0x01; // WSNZ
        b[1] = MAX_CAW_BLOCKS;
        b[2..4].copy_from_slice(&1u16.to_be_bytes()); // optimal transfer length granularity
        let max_xfer = (MAX_TRANSFER_BYTES >> self.bs_shift) as u32;
        b[4..8].copy_from_slice(&max_xfer.to_be_bytes());
        b[8..12].copy_from_slice(&((1u32 << 20) >> self.bs_shift).to_be_bytes()); // optimal: 1 MiB
        b[12..16].copy_from_slice(&max_xfer.to_be_bytes()); // maximum prefetch
        if self.thin {
            b[16..20].copy_from_slice(&MAX_UNMAP_BLOCKS.to_be_bytes());
            b[20..24].copy_from_slice(&MAX_UNMAP_DESCRIPTORS.to_be_bytes());
            // Optimal unmap granularity: the backend's (a block device's discard
            // granularity), at least one block.
            let granularity = (self.backend.punch_granularity() >> self.bs_shift).max(1);
            b[24..28].copy_from_slice(&(granularity.min(u32::MAX as u64) as u32).to_be_bytes());
        }
        b[32..40].copy_from_slice(&MAX_WRITE_SAME_BLOCKS.to_be_bytes());
        // WRITE ATOMIC(16): maximum atomic transfer length, atomic alignment 1, atomic
        // transfer length granularity 1; bytes 56..64 (atomic boundaries) stay 0.
        b[40..44].copy_from_slice(&self.max_atomic_blocks().to_be_bytes());
        b[44..48].copy_from_slice(&1u32.to_be_bytes());
        b[48..52].copy_from_slice(&1u32.to_be_bytes());
        b
    }

    fn logical_block_provisioning(&self) -> Vec<u8> {
        let mut b = vec![0u8; 4];
        if self.thin {
            b[1] = 0x80 | 0x40 | 0x20 | 0x04; // LBPU, LBPWS, LBPWS10, LBPRZ
            b[2] = 0x02; // thin provisioned
        }
        b
    }

    pub(crate) fn read_capacity_10(&self, cdb: &[u8]) -> CmdResult {
        if be32(cdb, 2) != 0 || cdb[8] & 0x01 != 0 {
            return Err(Sense::invalid_cdb_field(if cdb[8] & 1 != 0 { 8 } else { 2 }, None).into());
        }
        let last = self.num_blocks() - 1;
        let mut d = Vec::with_capacity(8);
        d.extend_from_slice(&(last.min(u32::MAX as u64) as u32).to_be_bytes());
        d.extend_from_slice(&self.block_size.to_be_bytes());
        Done::data(d)
    }

    pub(crate) fn read_capacity_16(&self, cdb: &[u8]) -> CmdResult {
        let alloc = be32(cdb, 10) as usize;
        let mut d = vec![0u8; 32];
        d[0..8].copy_from_slice(&(self.num_blocks() - 1).to_be_bytes());
        d[8..12].copy_from_slice(&self.block_size.to_be_bytes());
        if self.thin {
            d[14] = 0x80 | 0x40; // LBPME, LBPRZ
        }
        Done::alloc(d, alloc)
    }

    pub(crate) fn report_supported_opcodes(&self, cdb: &[u8]) -> CmdResult {
        let rctd = cdb[2] & 0x80 != 0;
        let options = cdb[2] & 0x07;
        let req_op = cdb[3];
        let req_sa = be16(cdb, 4);
        let alloc = be32(cdb, 6) as usize;
        let table: Vec<&OpInfo> = OPS.iter().filter(|o| self.op_supported(o)).collect();
        match options {
            0 => {
                let mut d = vec![0u8; 4];
                for o in &table {
                    d.push(o.op);
                    d.push(0);
                    d.extend_from_slice(&o.sa.unwrap_or(0).to_be_bytes());
                    d.push(0);
                    d.push(if o.sa.is_some() { 0x01 } else { 0 } | if rctd { 0x02 } else { 0 });
                    d.extend_from_slice(&(o.usage.len() as u16).to_be_bytes());
                    if rctd {
                        d.extend_from_slice(&TIMEOUTS);
                    }
                }
                let len = (d.len() - 4) as u32;
                d[0..4].copy_from_slice(&len.to_be_bytes());
                Done::alloc(d, alloc)
            }
            1 | 2 => {
                let has_sa = OPS.iter().any(|o| o.op == req_op && o.sa.is_some());
                if (options == 1 && has_sa)
                    || (options == 2 && !has_sa && OPS.iter().any(|o| o.op == req_op))
                {
                    return Err(Sense::invalid_cdb_field(2, Some(2)).into());
                }
                let found = table
                    .iter()
                    .find(|o| o.op == req_op && (options == 1 || o.sa == Some(req_sa)));
                let mut d = vec![0u8; 4];
                match found {
                    Some(o) => {
                        d[1] = 0x03 | if rctd { 0x80 } else { 0 };
                        d[2..4].copy_from_slice(&(o.usage.len() as u16).to_be_bytes());
                        d.extend_from_slice(o.usage);
                        if rctd {
                            d.extend_from_slice(&TIMEOUTS);
                        }
                    }
                    None => d[1] = 0x01, // not supported
                }
                Done::alloc(d, alloc)
            }
            _ => Err(Sense::invalid_cdb_field(2, Some(2)).into()),
        }
    }

    /// BLOCK ERASE and CRYPTO ERASE deallocate the whole LUN, so they need thin
    /// provisioning (LBPME) besides the `sanitize` config key.
    pub(crate) fn sanitize_erase_supported(&self) -> bool {
        self.cfg.sanitize && self.thin
    }

    fn op_supported(&self, o: &OpInfo) -> bool {
        match o.op {
            op::UNMAP => self.thin,
            op::EXTENDED_COPY | op::RECEIVE_COPY_RESULTS => XCOPY_SUPPORTED,
            op::MAINTENANCE_IN => {
                o.sa != Some(crate::alua::SA_REPORT_TARGET_PORT_GROUPS.into())
                    || self.alua.is_some()
            }
            op::SANITIZE => match o.sa {
                Some(0x02) | Some(0x03) => self.sanitize_erase_supported(),
                _ => self.cfg.sanitize,
            },
            _ => true,
        }
    }
}

/// Command timeouts descriptor: length 10, nominal 0, recommended 30 s.
const TIMEOUTS: [u8; 12] = [0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 30];

struct OpInfo {
    op: u8,
    sa: Option<u16>,
    usage: &'static [u8],
}

const fn o(op: u8, usage: &'static [u8]) -> OpInfo {
    OpInfo {
        op,
        sa: None,
        usage,
    }
}

const fn s(op: u8, sa: u16, usage: &'static [u8]) -> OpInfo {
    OpInfo {
        op,
        sa: Some(sa),
        usage,
    }
}

/// Every supported command with its CDB usage data (bits the device server looks at).
static OPS: &[OpInfo] = &[
    o(op::TEST_UNIT_READY, &[0x00, 0, 0, 0, 0, 0]),
    o(op::REQUEST_SENSE, &[0x03, 0x01, 0, 0, 0xFF, 0]),
    o(op::READ_6, &[0x08, 0x1F, 0xFF, 0xFF, 0xFF, 0]),
    o(op::WRITE_6, &[0x0A, 0x1F, 0xFF, 0xFF, 0xFF, 0]),
    o(op::INQUIRY, &[0x12, 0x01, 0xFF, 0xFF, 0xFF, 0]),
    o(op::MODE_SELECT_6, &[0x15, 0x11, 0, 0, 0xFF, 0]),
    o(op::RESERVE_6, &[0x16, 0, 0, 0, 0, 0]),
    o(op::RELEASE_6, &[0x17, 0, 0, 0, 0, 0]),
    o(op::MODE_SENSE_6, &[0x1A, 0x08, 0xFF, 0xFF, 0xFF, 0]),
    o(op::START_STOP_UNIT, &[0x1B, 0x01, 0, 0x0F, 0xF7, 0]),
    o(op::PREVENT_ALLOW, &[0x1E, 0, 0, 0, 0x03, 0]),
    o(op::READ_CAPACITY_10, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    o(
        op::READ_10,
        &[0x28, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0],
    ),
    o(
        op::WRITE_10,
        &[0x2A, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0],
    ),
    o(
        op::WRITE_VERIFY_10,
        &[0x2E, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0],
    ),
    o(
        op::VERIFY_10,
        &[0x2F, 0x16, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0],
    ),
    o(
        op::PRE_FETCH_10,
        &[0x34, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0],
    ),
    o(
        op::SYNC_CACHE_10,
        &[0x35, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0],
    ),
    o(
        op::READ_DEFECT_10,
        &[0x37, 0, 0x1F, 0, 0, 0, 0, 0xFF, 0xFF, 0],
    ),
    o(
        op::WRITE_SAME_10,
        &[0x41, 0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0],
    ),
    o(op::UNMAP, &[0x42, 0, 0, 0, 0, 0, 0x1F, 0xFF, 0xFF, 0]),
    s(
        op::SANITIZE,
        0x01,
        &[0x48, 0x81, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0],
    ),
    s(
        op::SANITIZE,
        0x02,
        &[0x48, 0x82, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0],
    ),
    s(
        op::SANITIZE,
        0x03,
        &[0x48, 0x83, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0],
    ),
    s(
        op::SANITIZE,
        0x1F,
        &[0x48, 0x9F, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0],
    ),
    o(
        op::MODE_SELECT_10,
        &[0x55, 0x11, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0],
    ),
    o(
        op::MODE_SENSE_10,
        &[0x5A, 0x18, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0],
    ),
    s(op::PR_IN, 0x00, &[0x5E, 0x00, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0]),
    s(op::PR_IN, 0x01, &[0x5E, 0x01, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0]),
    s(op::PR_IN, 0x02, &[0x5E, 0x02, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0]),
    s(op::PR_IN, 0x03, &[0x5E, 0x03, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0]),
    s(
        op::PR_OUT,
        0x00,
        &[0x5F, 0x00, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0],
    ),
    s(
        op::PR_OUT,
        0x01,
        &[0x5F, 0x01, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0],
    ),
    s(
        op::PR_OUT,
        0x02,
        &[0x5F, 0x02, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0],
    ),
    s(
        op::PR_OUT,
        0x03,
        &[0x5F, 0x03, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0],
    ),
    s(
        op::PR_OUT,
        0x04,
        &[0x5F, 0x04, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0],
    ),
    s(
        op::PR_OUT,
        0x05,
        &[0x5F, 0x05, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0],
    ),
    s(
        op::PR_OUT,
        0x06,
        &[0x5F, 0x06, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0],
    ),
    s(
        op::EXTENDED_COPY,
        0x00,
        &[
            0x83, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0,
        ],
    ),
    s(
        op::RECEIVE_COPY_RESULTS,
        0x00,
        &[
            0x84, 0x00, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0,
        ],
    ),
    s(
        op::RECEIVE_COPY_RESULTS,
        0x03,
        &[
            0x84, 0x03, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0,
        ],
    ),
    o(
        op::READ_16,
        &[
            0x88, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x1F, 0,
        ],
    ),
    o(
        op::COMPARE_AND_WRITE,
        &[
            0x89, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0x1F, 0,
        ],
    ),
    o(
        op::WRITE_16,
        &[
            0x8A, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x1F, 0,
        ],
    ),
    o(
        op::ORWRITE_16,
        &[
            0x8B, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x1F, 0,
        ],
    ),
    o(
        op::WRITE_VERIFY_16,
        &[
            0x8E, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x1F, 0,
        ],
    ),
    o(
        op::VERIFY_16,
        &[
            0x8F, 0x16, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x1F, 0,
        ],
    ),
    o(
        op::PRE_FETCH_16,
        &[
            0x90, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x1F, 0,
        ],
    ),
    o(
        op::SYNC_CACHE_16,
        &[
            0x91, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x1F, 0,
        ],
    ),
    o(
        op::WRITE_SAME_16,
        &[
            0x93, 0x09, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x1F, 0,
        ],
    ),
    o(
        op::WRITE_ATOMIC_16,
        &[
            0x9C, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0xFF, 0xFF, 0x1F, 0,
        ],
    ),
    s(
        op::SERVICE_ACTION_IN_16,
        0x10,
        &[
            0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0,
        ],
    ),
    s(
        op::SERVICE_ACTION_IN_16,
        0x12,
        &[
            0x9E, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0,
            0,
        ],
    ),
    o(
        op::REPORT_LUNS,
        &[0xA0, 0, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0],
    ),
    s(
        op::MAINTENANCE_IN,
        0x0A,
        &[0xA3, 0xEA, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0],
    ),
    s(
        op::MAINTENANCE_IN,
        0x0C,
        &[
            0xA3, 0x0C, 0x87, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0,
        ],
    ),
    o(
        op::READ_12,
        &[
            0xA8, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0,
        ],
    ),
    o(
        op::WRITE_12,
        &[
            0xAA, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0,
        ],
    ),
    o(
        op::WRITE_VERIFY_12,
        &[
            0xAE, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0,
        ],
    ),
    o(
        op::VERIFY_12,
        &[
            0xAF, 0x16, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0,
        ],
    ),
    o(
        op::READ_DEFECT_12,
        &[0xB7, 0x1F, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0],
    ),
];
