//! One RDMA device as the target uses it: every connection's queue pair and regions in one
//! protection domain, so memory registered once serves them all — above all a RAM LUN's
//! image ([`TargetDevice::register_image`]: OSU's zero-cost registration, in user space).
//! Read data then leaves in RDMA Writes straight from the LUN, with no copy into a buffer
//! first, and with MPA CRC too: the image keeps its blocks' CRCs ([`ImageCrcs`]) for the
//! RNIC to join each FPDU's CRC from. One domain lets no initiator reach another's data: the
//! target grants its peers no remote access to any region (it moves data with RDMA Writes and
//! Reads on the initiator's memory), so its STags never leave it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rdma::{Access, MemoryRegion};
use storage::{ImageMemory, Registration};

use crate::endpoint::Device;

/// A device and the protection domain all of the target's connections on it share.
pub struct TargetDevice<P: Device> {
    dev: Arc<P>,
    pd: P::Pd,
}

impl<P: Device> TargetDevice<P> {
    pub fn new(dev: Arc<P>) -> rdma::Result<Arc<Self>> {
        let pd = dev.alloc_pd()?;
        Ok(Arc::new(TargetDevice { dev, pd }))
    }

    pub fn dev(&self) -> &Arc<P> {
        &self.dev
    }

    pub fn pd(&self) -> &P::Pd {
        &self.pd
    }

    /// Identifies the domain: regions of a device with the same id serve its connections.
    pub fn domain(self: &Arc<Self>) -> usize {
        Arc::as_ptr(self) as *const u8 as usize
    }

    /// Registers `len` zeroed bytes as a RAM LUN's image, with local write access only (RDMA
    /// Reads may land in it; no peer may reach it).
    ///
    /// The image keeps the CRC32Cs of its blocks for the device ([`ImageCrcs`]), so that read
    /// data sent with MPA CRC leaves in place too, its CRC joined from theirs.
    pub fn register_image(self: &Arc<Self>, len: usize) -> rdma::Result<Arc<LunImage<P>>> {
        let mr = self.dev.reg_mr(&self.pd, len, Access::LOCAL_WRITE)?;
        let crcs = Arc::new(ImageCrcs::new(len));
        let crcs = mr.keep_block_crcs(crcs.clone()).then_some(crcs);
        Ok(Arc::new(LunImage {
            mr,
            crcs,
            domain: self.domain(),
            _device: self.clone(),
        }))
    }
}

/// A RAM LUN's image in a region registered once.
pub struct LunImage<P: Device> {
    mr: P::Mr,
    /// Its blocks' CRCs, when the device takes them.
    crcs: Option<Arc<ImageCrcs>>,
    domain: usize,
    // The device and domain must outlive the region.
    _device: Arc<TargetDevice<P>>,
}

/// The CRC32Cs of a LUN image's 4 KiB blocks, each taken the first time a send needs it and
/// forgotten when the block is written. A block's CRC serves only a send of the whole block,
/// that is of a range of logical blocks covering it, which the SCSI engine's range lock keeps
/// writers off until the data has left (plain writes lock exclusively): its bytes cannot
/// change between the CRC and the send, the promise [`rdma::BlockCrcs`] asks for. Writes
/// that share the block but not the read's range only touch its partial blocks, whose bytes
/// the sender reads itself.
pub struct ImageCrcs {
    /// Per block: a generation (bumped by every write) above a valid bit and the CRC.
    entries: Vec<AtomicU64>,
}

impl ImageCrcs {
    pub const BLOCK: usize = 4096;
    const VALID: u64 = 1 << 32;
    const GENERATION: u64 = 1 << 33;

    fn new(len: usize) -> ImageCrcs {
        ImageCrcs {
            entries: (0..len.div_ceil(Self::BLOCK))
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    /// Forgets the CRCs of the blocks `offset..offset+len` touches (after writing them).
    fn written(&self, offset: usize, len: usize) {
        if len == 0 {
            return;
        }
        let first = offset / Self::BLOCK;
        let last = (offset + len - 1) / Self::BLOCK;
        for e in &self.entries[first..=last.min(self.entries.len() - 1)] {
            let g = e.load(Ordering::Acquire) & !(Self::GENERATION - 1);
            e.store(g.wrapping_add(Self::GENERATION), Ordering::Release);
        }
    }
}

impl rdma::BlockCrcs for ImageCrcs {
    fn block_len(&self) -> usize {
        Self::BLOCK
    }

    fn block_crc(&self, index: usize, bytes: &[u8]) -> u32 {
        let entry = &self.entries[index];
        let seen = entry.load(Ordering::Acquire);
        if seen & Self::VALID != 0 {
            return seen as u32;
        }
        let crc = digest::crc32c(bytes);
        // Kept unless a write came in between (its generation differs then).
        let _ = entry.compare_exchange(
            seen,
            (seen & !(Self::GENERATION - 1)) | Self::VALID | u64::from(crc),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        crc
    }
}

impl<P: Device> LunImage<P> {
    pub fn mr(&self) -> &P::Mr {
        &self.mr
    }

    /// The [`TargetDevice::domain`] it was registered in.
    pub fn domain(&self) -> usize {
        self.domain
    }
}

impl<P: Device> ImageMemory for LunImage<P> {
    fn len(&self) -> usize {
        self.mr.len()
    }

    /// An image spans far more than the caches, and data written to it is seldom read back
    /// while still cached: the region may take it past them.
    fn write_at(&self, offset: usize, data: &[u8]) {
        self.mr.write_at_streaming(offset, data);
        if let Some(crcs) = &self.crcs {
            crcs.written(offset, data.len());
        }
    }

    fn bytes_at(&self, offset: usize, len: usize) -> &[u8] {
        self.mr.bytes_at(offset, len)
    }

    /// In the domain of the device it was registered with: a connection there sends read
    /// data straight from it.
    fn registration(&self) -> Option<Registration> {
        Some(Registration {
            domain: self.domain,
            lkey: self.mr.lkey(),
            addr: self.mr.addr(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma::BlockCrcs;

    /// A block's CRC is taken from its bytes once and kept; a write to any byte of the block
    /// forgets it (and only its blocks'), so the next send takes it from the new bytes.
    #[test]
    fn block_crcs_are_kept_until_their_block_is_written() {
        let crcs = ImageCrcs::new(2 * ImageCrcs::BLOCK + 100);
        assert_eq!(crcs.entries.len(), 3);
        let (old, new) = (vec![1u8; ImageCrcs::BLOCK], vec![2u8; ImageCrcs::BLOCK]);
        for i in 0..3 {
            assert_eq!(crcs.block_crc(i, &old), digest::crc32c(&old));
        }
        // Kept: the bytes are not read again.
        assert_eq!(crcs.block_crc(0, &new), digest::crc32c(&old));
        crcs.written(ImageCrcs::BLOCK - 1, 2);
        assert_eq!(
            crcs.block_crc(0, &new),
            digest::crc32c(&new),
            "block 0 written"
        );
        assert_eq!(
            crcs.block_crc(1, &new),
            digest::crc32c(&new),
            "block 1 written"
        );
        assert_eq!(
            crcs.block_crc(2, &new),
            digest::crc32c(&old),
            "block 2 untouched"
        );
        crcs.written(2 * ImageCrcs::BLOCK + 99, 1);
        assert_eq!(
            crcs.block_crc(2, &new),
            digest::crc32c(&new),
            "the short last block"
        );
    }
}
