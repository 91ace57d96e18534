//! What a host reads from the Identify data structures and the controller registers: the
//! Identify Controller fields a host needs to size its commands (IOCCSZ, MDTS, ONCS, VWC,
//! the names), the Identify Namespace size and formatted LBA size, and the CAP/CC/CSTS bits
//! of bringing a controller up. Parsers take the 4096-byte structure and never panic on a
//! shorter one: it is an error.

use crate::le::{get16, get32};

/// Bytes of an Identify data structure.
pub const IDENTIFY_LEN: usize = 4096;

/// Why an Identify structure cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentifyError {
    /// Not the 4096 bytes of an Identify data structure.
    #[error("Identify data is {0} bytes, not 4096")]
    Length(usize),
    /// The namespace's formatted LBA size is not a usable block size.
    #[error("namespace LBA data size 2^{0} is not a block size (9 to 16)")]
    LbaSize(u8),
}

fn get64(b: &[u8], at: usize) -> u64 {
    u64::from(get32(b, at)) | (u64::from(get32(b, at + 4)) << 32)
}

/// An ASCII field, its trailing spaces and NULs cut.
fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .trim_end_matches([' ', '\0'])
        .to_string()
}

/// The Identify Controller fields a host uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentifyController {
    /// Serial number.
    pub serial: String,
    /// Model number.
    pub model: String,
    /// Firmware revision.
    pub firmware: String,
    /// Maximum data transfer size as a power of two of the minimum page size (0: no limit).
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: u16,
    /// Keep Alive granularity in 100 ms units (0: keep alive not supported).
    pub kas: u16,
    /// Most commands outstanding on one queue (0: not reported).
    pub maxcmd: u16,
    /// Number of namespaces (the highest NSID).
    pub nn: u32,
    /// Optional NVM commands supported (bit 2 Dataset Management, bit 3 Write Zeroes).
    pub oncs: u16,
    /// A volatile write cache is present.
    pub vwc: bool,
    /// I/O queue command capsule size in 16-byte units (the 64-byte SQE included).
    pub ioccsz: u32,
    /// The subsystem's NQN.
    pub subnqn: String,
}

impl IdentifyController {
    /// Parses the 4096-byte structure.
    pub fn parse(b: &[u8]) -> Result<IdentifyController, IdentifyError> {
        if b.len() != IDENTIFY_LEN {
            return Err(IdentifyError::Length(b.len()));
        }
        Ok(IdentifyController {
            serial: text(&b[4..24]),
            model: text(&b[24..64]),
            firmware: text(&b[64..72]),
            mdts: b[77],
            cntlid: get16(b, 78),
            kas: get16(b, 320),
            maxcmd: get16(b, 514),
            nn: get32(b, 516),
            oncs: get16(b, 520),
            vwc: b[525] & 1 != 0,
            ioccsz: get32(b, 1792),
            subnqn: text(&b[768..1024]),
        })
    }

    /// Most in-capsule data of an I/O command: IOCCSZ less the SQE.
    pub fn in_capsule_data(&self) -> u32 {
        self.ioccsz.saturating_mul(16).saturating_sub(64)
    }

    /// Dataset Management (deallocate) is supported.
    pub fn supports_dsm(&self) -> bool {
        self.oncs & (1 << 2) != 0
    }

    /// Write Zeroes is supported.
    pub fn supports_write_zeroes(&self) -> bool {
        self.oncs & (1 << 3) != 0
    }

    /// Most bytes of one command given the minimum page size; `None` when unlimited.
    pub fn max_transfer(&self, min_page: u32) -> Option<u64> {
        (self.mdts != 0).then(|| u64::from(min_page) << self.mdts.min(32))
    }
}

/// The Identify Namespace fields a host uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdentifyNamespace {
    /// Namespace size in logical blocks.
    pub nsze: u64,
    /// Namespace capacity in logical blocks.
    pub ncap: u64,
    /// Bytes of a logical block (of the formatted LBA format).
    pub block_size: u32,
    /// Metadata bytes per block of the formatted LBA format.
    pub metadata: u16,
}

impl IdentifyNamespace {
    /// Parses the 4096-byte structure. An inactive namespace reads as all zeros, which
    /// gives `nsze` 0 (the caller's check), and an LBA size of 2^0: an error.
    pub fn parse(b: &[u8]) -> Result<IdentifyNamespace, IdentifyError> {
        if b.len() != IDENTIFY_LEN {
            return Err(IdentifyError::Length(b.len()));
        }
        let flbas = b[26];
        let index = usize::from((flbas & 0x0F) | ((flbas >> 1) & 0x30));
        let lbaf = 128 + 4 * index.min(63);
        let lbads = b[lbaf + 2];
        if !(9..=16).contains(&lbads) {
            return Err(IdentifyError::LbaSize(lbads));
        }
        Ok(IdentifyNamespace {
            nsze: get64(b, 0),
            ncap: get64(b, 8),
            block_size: 1 << lbads,
            metadata: get16(b, lbaf),
        })
    }

    /// The namespace's bytes.
    pub fn bytes(&self) -> u64 {
        self.nsze.saturating_mul(u64::from(self.block_size))
    }
}

/// Controller Capabilities (CAP) fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap(pub u64);

impl Cap {
    /// Most entries of an I/O submission queue (MQES is 0's based; this is the count).
    pub fn max_queue_entries(&self) -> u32 {
        (self.0 & 0xFFFF) as u32 + 1
    }

    /// Worst-case milliseconds for CSTS.RDY to follow CC.EN (TO, in 500 ms units).
    pub fn timeout_ms(&self) -> u64 {
        ((self.0 >> 24) & 0xFF) * 500
    }

    /// The minimum memory page size in bytes (MPSMIN).
    pub fn min_page_size(&self) -> u32 {
        4096u32 << ((self.0 >> 48) & 0xF).min(16)
    }
}

/// Controller Configuration: enabled, NVM command set, 4 KiB pages, 64-byte SQEs and
/// 16-byte CQEs (IOSQES 6, IOCQES 4).
pub const CC_ENABLE: u32 = 1 | (6 << 16) | (4 << 20);
/// CC.SHN = 01b: normal shutdown notification (with [`CC_ENABLE`]'s other fields).
pub const CC_SHUTDOWN_NORMAL: u32 = CC_ENABLE | (1 << 14);
/// CSTS.RDY.
pub const CSTS_RDY: u32 = 1;
/// CSTS.CFS: controller fatal status.
pub const CSTS_CFS: u32 = 1 << 1;
/// CSTS.SHST (bits 3:2) = 10b: shutdown processing complete.
pub const CSTS_SHST_COMPLETE: u32 = 2 << 2;
/// The mask of CSTS.SHST.
pub const CSTS_SHST_MASK: u32 = 3 << 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_fields_at_their_offsets() {
        let mut b = vec![0u8; IDENTIFY_LEN];
        b[4..10].copy_from_slice(b"SN1234");
        b[24..30].copy_from_slice(b"Linux ");
        b[77] = 5;
        b[78..80].copy_from_slice(&7u16.to_le_bytes());
        b[520..522].copy_from_slice(&0x0cu16.to_le_bytes());
        b[525] = 1;
        b[768..773].copy_from_slice(b"nqn.x");
        b[1792..1796].copy_from_slice(&1028u32.to_le_bytes());
        let c = IdentifyController::parse(&b).unwrap();
        assert_eq!(c.serial, "SN1234");
        assert_eq!(c.model, "Linux");
        assert_eq!(c.cntlid, 7);
        assert_eq!(c.subnqn, "nqn.x");
        assert_eq!(c.in_capsule_data(), 16384);
        assert!(c.vwc && c.supports_dsm() && c.supports_write_zeroes());
        assert_eq!(c.max_transfer(4096), Some(128 * 1024));
        assert_eq!(
            IdentifyController::parse(&b[..100]),
            Err(IdentifyError::Length(100))
        );
    }

    #[test]
    fn namespace_block_size_from_the_formatted_lba_format() {
        let mut b = vec![0u8; IDENTIFY_LEN];
        b[0..8].copy_from_slice(&131072u64.to_le_bytes());
        b[26] = 1;
        b[128 + 2] = 9;
        b[132 + 2] = 12;
        let n = IdentifyNamespace::parse(&b).unwrap();
        assert_eq!((n.nsze, n.block_size, n.bytes()), (131072, 4096, 512 << 20));
        b[26] = 2;
        assert_eq!(IdentifyNamespace::parse(&b), Err(IdentifyError::LbaSize(0)));
    }

    #[test]
    fn cap_fields() {
        let cap = Cap(0x0000_0020_0f00_03ff | (1 << 48));
        assert_eq!(cap.max_queue_entries(), 1024);
        assert_eq!(cap.timeout_ms(), 15 * 500);
        assert_eq!(cap.min_page_size(), 8192);
    }
}
