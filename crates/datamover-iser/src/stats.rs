//! Process-wide counters of iSER's RDMA work (a target's, in `ironsan target`): RDMA Writes (Data-In) and Reads
//! (solicited Data-Out) with their bytes, memory registrations made by the region pools, and how often
//! a region registered earlier served instead (the [`crate::mr_pool`] reuse, and read data
//! sent straight from a registered LUN image). Relaxed atomics bumped where the work is
//! posted; [`snapshot`] reads them all for an exporter.

use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) static RDMA_WRITES: AtomicU64 = AtomicU64::new(0);
pub(crate) static RDMA_WRITE_BYTES: AtomicU64 = AtomicU64::new(0);
pub(crate) static RDMA_READS: AtomicU64 = AtomicU64::new(0);
pub(crate) static RDMA_READ_BYTES: AtomicU64 = AtomicU64::new(0);
pub(crate) static REGISTRATIONS: AtomicU64 = AtomicU64::new(0);
pub(crate) static POOL_HITS: AtomicU64 = AtomicU64::new(0);
/// RDMA Writes of read data sent straight from a registered LUN image, in this process.
pub(crate) static WRITES_FROM_LUN_IMAGES: AtomicU64 = AtomicU64::new(0);

/// Adds one operation of `bytes` to a pair of counters.
pub(crate) fn count(ops: &AtomicU64, bytes_counter: &AtomicU64, bytes: u64) {
    ops.fetch_add(1, Ordering::Relaxed);
    bytes_counter.fetch_add(bytes, Ordering::Relaxed);
}

/// The counters as read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IserStats {
    /// RDMA Writes posted (read data to the initiator) and their bytes.
    pub rdma_writes: u64,
    pub rdma_write_bytes: u64,
    /// RDMA Reads posted (write data from the initiator) and their bytes.
    pub rdma_reads: u64,
    pub rdma_read_bytes: u64,
    /// Memory regions registered for RDMA operations (pool misses).
    pub registrations: u64,
    /// RDMA operations that took a region registered earlier from the pool.
    pub registration_pool_hits: u64,
    /// RDMA Writes sent straight from a registered RAM LUN image (no copy, no registration).
    pub writes_from_lun_images: u64,
    /// Connections ended because the peer overran its receive credit.
    pub credit_overruns: u64,
}

/// Every counter of this process now.
pub fn snapshot() -> IserStats {
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    IserStats {
        rdma_writes: get(&RDMA_WRITES),
        rdma_write_bytes: get(&RDMA_WRITE_BYTES),
        rdma_reads: get(&RDMA_READS),
        rdma_read_bytes: get(&RDMA_READ_BYTES),
        registrations: get(&REGISTRATIONS),
        registration_pool_hits: get(&POOL_HITS),
        writes_from_lun_images: WRITES_FROM_LUN_IMAGES.load(Ordering::Relaxed),
        credit_overruns: crate::credit::overruns(),
    }
}
