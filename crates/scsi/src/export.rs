//! A block LUN seen from another front end (NVMe/TCP): its backend, geometry and identity,
//! so that one LUN is served by several protocols over the same storage and the same
//! designators.

use crate::device::Device;
use crate::lun::Lun;
use std::sync::Arc;
use storage::Backend;

/// A block LUN as another front end sees it: it follows the LUN's size and read-only flag
/// as they change while the target runs.
#[derive(Clone)]
pub struct LunExport {
    lun: Arc<Lun>,
}

impl std::fmt::Debug for LunExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LunExport")
            .field("lun", &self.lun.id)
            .field("target", &self.lun.target_name)
            .finish()
    }
}

impl LunExport {
    /// The storage the LUN reads and writes.
    pub fn backend(&self) -> Arc<dyn Backend> {
        self.lun.backend.clone()
    }

    /// Logical block size in bytes (a power of two).
    pub fn block_size(&self) -> u32 {
        self.lun.block_size
    }

    /// Number of logical blocks now.
    pub fn num_blocks(&self) -> u64 {
        self.lun.num_blocks()
    }

    /// The NAA designator of VPD page 0x83 (8 or 16 bytes): the LUN's identity, which other
    /// protocols derive their identifiers from.
    pub fn naa(&self) -> &[u8] {
        &self.lun.naa
    }

    /// The unit serial number of VPD page 0x80.
    pub fn serial(&self) -> &str {
        &self.lun.serial
    }

    /// Whether writes are refused (configured read-only, or set so while running, or
    /// software write protect).
    pub fn write_protected(&self) -> bool {
        self.lun.write_protected()
    }

    /// Whether the LUN deallocates for real (thin provisioning on a backend that punches).
    pub fn thin(&self) -> bool {
        self.lun.thin
    }

    /// The LUN's number in its target.
    pub fn id(&self) -> u64 {
        self.lun.id
    }
}

impl Device {
    /// The block LUN `lun` for another front end; `None` for no such LUN or an object LUN.
    pub fn lun_export(&self, lun: u64) -> Option<LunExport> {
        self.block(lun).map(|lun| LunExport { lun })
    }
}
