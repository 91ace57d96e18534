//! One RDMA device as the target uses it: every connection's queue pair and regions in one
//! protection domain, so memory registered once serves them all — above all a RAM LUN's
//! image ([`TargetDevice::register_image`]: OSU's zero-cost registration, in user space).
//! Read data then leaves in RDMA Writes straight from the LUN, with no copy into a buffer
//! first. One domain lets no initiator reach another's data: the target grants its peers no
//! remote access to any region (it moves data with RDMA Writes and Reads on the initiator's
//! memory), so its STags never leave it.

use std::any::Any;
use std::sync::Arc;

use rdma::{Access, MemoryRegion};
use storage::ImageMemory;

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
    pub fn register_image(self: &Arc<Self>, len: usize) -> rdma::Result<Arc<LunImage<P>>> {
        let mr = self.dev.reg_mr(&self.pd, len, Access::LOCAL_WRITE)?;
        Ok(Arc::new(LunImage {
            mr,
            domain: self.domain(),
            _device: self.clone(),
        }))
    }
}

/// A RAM LUN's image in a region registered once.
pub struct LunImage<P: Device> {
    mr: P::Mr,
    domain: usize,
    // The device and domain must outlive the region.
    _device: Arc<TargetDevice<P>>,
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
    }

    fn bytes_at(&self, offset: usize, len: usize) -> &[u8] {
        self.mr.bytes_at(offset, len)
    }

    fn as_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}
