//! Registered memory lent to the layers above, so read data is produced where its RDMA Write
//! leaves from and write data is consumed where its RDMA Read landed: the backend's one copy
//! is the only one. A region leaves as `Bytes` over its own memory ([`view`]); the pool gets
//! it back when the last holder lets go, never while an operation still uses it.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use rdma::MemoryRegion;
use storage::{BufNote, ReadBuf, ReadBufSource};

use crate::endpoint::Device;
use crate::mr_pool::{MrPool, PooledMr};

/// The first `len` bytes of a leased region, as `Bytes` (no copy). The caller must have
/// finished writing them: the region is read-only from here on.
pub fn view<P: Device>(lease: Arc<PooledMr<P>>, len: usize) -> Bytes {
    assert!(len <= lease.mr().len(), "view beyond the region");
    Bytes::from_owner(RegionView { lease, len })
}

/// The region `note` names and the offset of `data` in it, if `data` was lent from it.
pub fn lent_region<P: Device>(
    note: Option<&BufNote>,
    data: &[u8],
) -> Option<(Arc<PooledMr<P>>, usize)> {
    let lease = note?.0.clone().downcast::<PooledMr<P>>().ok()?;
    let region = lease.mr().as_bytes().as_ptr_range();
    let data = data.as_ptr_range();
    if region.start <= data.start && data.end <= region.end {
        let offset = data.start as usize - region.start as usize;
        Some((lease, offset))
    } else {
        None
    }
}

struct RegionView<P: Device> {
    lease: Arc<PooledMr<P>>,
    len: usize,
}

impl<P: Device> AsRef<[u8]> for RegionView<P> {
    fn as_ref(&self) -> &[u8] {
        &self.lease.mr().as_bytes()[..self.len]
    }
}

/// Lends read buffers that are regions of a connection's RDMA Write pool.
pub struct RegisteredReadBuffers<P: Device> {
    pool: Arc<MrPool<P>>,
}

impl<P: Device> RegisteredReadBuffers<P> {
    pub fn new(pool: Arc<MrPool<P>>) -> Self {
        RegisteredReadBuffers { pool }
    }
}

impl<P: Device> std::fmt::Debug for RegisteredReadBuffers<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RegisteredReadBuffers")
    }
}

impl<P: Device> ReadBufSource for RegisteredReadBuffers<P> {
    fn lend(&self, len: usize) -> Box<dyn ReadBuf> {
        match self.pool.take(len) {
            Ok(lease) => Box::new(RegisteredReadBuf {
                lease: Arc::new(lease),
                len: 0,
            }),
            // The RDMA Write registers (and says why it cannot) when it needs the region.
            Err(_) => Box::new(HeapReadBuf(BytesMut::with_capacity(len))),
        }
    }
}

/// A read buffer in registered memory; its note is the region, which `put_data` finds again.
struct RegisteredReadBuf<P: Device> {
    lease: Arc<PooledMr<P>>,
    len: usize,
}

impl<P: Device> ReadBuf for RegisteredReadBuf<P> {
    fn put(&mut self, src: &[u8]) {
        self.lease.mr().write_at(self.len, src);
        self.len += src.len();
    }

    fn put_zeros(&mut self, n: usize) {
        // Regions are reused: never-written ranges must be zeroed here.
        const ZEROS: [u8; 4096] = [0; 4096];
        let mut left = n;
        while left > 0 {
            let k = left.min(ZEROS.len());
            self.put(&ZEROS[..k]);
            left -= k;
        }
    }

    fn put_bytes(&mut self, data: Bytes) {
        self.put(&data);
    }

    fn len(&self) -> usize {
        self.len
    }

    fn finish(self: Box<Self>) -> (Bytes, Option<BufNote>) {
        let note = BufNote(self.lease.clone());
        (view(self.lease, self.len), Some(note))
    }
}

/// The fallback when no region could be had: plain memory, copied at the RDMA Write.
struct HeapReadBuf(BytesMut);

impl ReadBuf for HeapReadBuf {
    fn put(&mut self, src: &[u8]) {
        self.0.extend_from_slice(src);
    }

    fn put_zeros(&mut self, n: usize) {
        self.0.resize(self.0.len() + n, 0);
    }

    fn put_bytes(&mut self, data: Bytes) {
        self.0.extend_from_slice(&data);
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn finish(self: Box<Self>) -> (Bytes, Option<BufNote>) {
        (self.0.freeze(), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma::{Access, Provider};
    use rnic::Rnic;

    fn pool() -> Arc<MrPool<Rnic>> {
        let dev = Arc::new(Rnic::new().unwrap());
        let pd = dev.alloc_pd().unwrap();
        MrPool::new(dev, pd, Access::NONE, 1 << 20)
    }

    #[test]
    fn read_data_is_produced_in_the_region_it_leaves_from() {
        let pool = pool();
        let lender = RegisteredReadBuffers::new(pool.clone());
        let mut buf = lender.lend(10_000);
        buf.put(b"abc");
        buf.put_zeros(5000);
        buf.put_bytes(Bytes::from_static(b"xyz"));
        let (data, note) = buf.finish();
        assert_eq!(data.len(), 5006);
        assert_eq!(&data[..3], b"abc");
        assert!(data[3..5003].iter().all(|&b| b == 0));
        assert_eq!(&data[5003..], b"xyz");
        // A slice of it (what SCSI may hand on) is found at its offset in the region.
        let (lease, offset) = lent_region::<Rnic>(note.as_ref(), &data[100..200]).unwrap();
        assert_eq!(offset, 100);
        assert_eq!(lease.mr().as_bytes()[offset..offset + 100], data[100..200]);
        // Bytes from elsewhere, or no note, are not taken for the region's.
        assert!(lent_region::<Rnic>(note.as_ref(), &[1, 2, 3]).is_none());
        assert!(lent_region::<Rnic>(None, &data).is_none());
        // The region goes back to the pool only when the data and the note are both gone.
        drop(lease);
        drop(data);
        assert_eq!(pool.idle_bytes(), 0);
        drop(note);
        assert_eq!(pool.idle_bytes(), 16384);
    }

    #[test]
    fn a_reused_region_reads_as_zeros_where_zeros_were_put() {
        let pool = pool();
        let lender = RegisteredReadBuffers::new(pool);
        let mut first = lender.lend(4096);
        first.put(&[0xff; 4096]);
        drop(first.finish());
        let mut second = lender.lend(4096);
        second.put_zeros(4096);
        let (data, _) = second.finish();
        assert!(data.iter().all(|&b| b == 0));
    }
}
