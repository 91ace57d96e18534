//! Registered memory and the STag table: every tagged access from the wire is checked here
//! (validity, protection domain, access rights, bounds) before a single byte is placed or read.

use iwarp::crc::{Crc32c, Shift};
use iwarp::TerminateCode;
use rdma::{Access, BlockCrcs, MemoryRegion};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

/// Blocks whose MPA CRC was joined from their owner's block CRCs, in this process.
static BLOCKS_SENT_BY_CRC: AtomicU64 = AtomicU64::new(0);

/// How many blocks of payload left with their CRC taken from their owner's
/// [`rdma::BlockCrcs`] (not read) in this process so far: a diagnostic, and what tests check.
pub fn blocks_sent_by_crc() -> u64 {
    BLOCKS_SENT_BY_CRC.load(Ordering::Relaxed)
}

/// The memory behind one region. Allocated once, freed when the last `Arc` goes (the engine holds
/// a clone while it places into or sends from the region, so deregistration never frees memory
/// under an in-flight copy).
pub struct MrInner {
    ptr: *mut u8,
    len: usize,
    /// The caller's bytes when the region was registered in place (`register_bytes`): held so
    /// they outlive every access, and never written (such a region has no write rights).
    /// `None`: the region owns its allocation.
    borrowed: Option<bytes::Bytes>,
    pub(crate) pd: u32,
    pub(crate) access: Access,
    /// The owner's CRCs of the region's blocks, and the shift past one block
    /// ([`MemoryRegion::keep_block_crcs`]).
    block_crcs: OnceLock<(Arc<dyn BlockCrcs>, Shift)>,
    stag: AtomicU32,
    valid: AtomicBool,
    /// Bytes from the start a peer may reach through the STag (remote rights).
    remote_len: AtomicUsize,
    table: Arc<StagTable>,
}

// SAFETY: the raw pointer is owned exclusively by this struct (allocated in `register`, freed in
// Drop), or points into the `Bytes` it holds (`register_bytes`, never written: no write rights,
// and the writing methods refuse it; `Bytes` is itself Send + Sync); all accesses copy through
// raw pointers without creating long-lived references, and concurrent access to the same bytes
// by the local user and a remote peer is a race the ULP must avoid, as with any RDMA device.
unsafe impl Send for MrInner {}
// SAFETY: see above.
unsafe impl Sync for MrInner {}

impl MrInner {
    pub(crate) fn base(&self) -> u64 {
        self.ptr as u64
    }
    pub(crate) fn stag(&self) -> u32 {
        self.stag.load(Ordering::Acquire)
    }
    pub(crate) fn valid(&self) -> bool {
        self.valid.load(Ordering::Acquire)
    }
    pub(crate) fn invalidate(&self) {
        self.valid.store(false, Ordering::Release);
    }
    /// Whether the memory is the caller's immutable bytes ([`StagTable::register_bytes`]):
    /// nothing can change them while the region holds them.
    pub(crate) fn immutable(&self) -> bool {
        self.borrowed.is_some()
    }
    /// Adds `len` bytes at `offset` to `crc` by the owner's block CRCs where it keeps them
    /// (reading only the partial blocks at either end) and returns true; false, with `crc`
    /// untouched, when it keeps none. The owner keeps the bytes unchanged until they are sent
    /// (the [`BlockCrcs`] promise), so they may leave from where they lie.
    pub(crate) fn crc_by_blocks(&self, crc: &mut Crc32c, offset: usize, len: usize) -> bool {
        let Some((blocks, shift)) = self.block_crcs.get() else {
            return false;
        };
        let block = shift.len();
        let end = offset + len;
        let first_full = offset.next_multiple_of(block).min(end);
        let last_full = (end / block * block).max(first_full);
        // SAFETY: the caller checked offset..offset+len against the region, which stays
        // allocated while `self` is held; the owner keeps these bytes unchanged meanwhile.
        let bytes = |from: usize, to: usize| unsafe {
            std::slice::from_raw_parts(self.ptr_at(from), to - from)
        };
        crc.update(bytes(offset, first_full));
        BLOCKS_SENT_BY_CRC.fetch_add(((last_full - first_full) / block) as u64, Ordering::Relaxed);
        for index in first_full / block..last_full / block {
            let at = index * block;
            crc.update_block_crc(blocks.block_crc(index, bytes(at, at + block)), shift);
        }
        crc.update(bytes(last_full, end));
        true
    }
    /// Panics if the memory is the caller's immutable bytes (no one may write it).
    fn assert_writable(&self) {
        assert!(
            self.borrowed.is_none(),
            "the region is the caller's read-only bytes"
        );
    }
    /// Pointer to byte `offset`; the caller has bounds-checked `offset + len <= self.len`.
    pub(crate) fn ptr_at(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.len);
        // SAFETY: offset is within (or one past) the allocation.
        unsafe { self.ptr.add(offset) }
    }
}

impl Drop for MrInner {
    fn drop(&mut self) {
        if self.borrowed.is_some() {
            // The caller's bytes: dropping the field lets them go.
            return;
        }
        // SAFETY: ptr/len came from alloc_zeroed with Layout::array::<u8>(len) in
        // `StagTable::register` (the layout of a Box<[u8]> of len bytes) and are freed once.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr, self.len,
            )))
        };
    }
}

/// Maps STag index (upper 24 bits) to regions. The low 8 bits are the key, changed on
/// re-validation so a stale STag no longer matches.
#[derive(Default)]
pub struct StagTable {
    map: RwLock<HashMap<u32, Arc<MrInner>>>,
    next_index: AtomicU32,
}

/// Why an access failed, as the Terminate code the check implies for a tagged RDMA Write / Read
/// Response (DDP layer) and the code for an RDMA Read Request source (RDMAP layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessError {
    InvalidStag,
    WrongPd,
    Rights,
    Bounds,
}

impl AccessError {
    pub fn ddp_code(self) -> TerminateCode {
        match self {
            AccessError::InvalidStag => TerminateCode::DDP_TAGGED_INVALID_STAG,
            AccessError::WrongPd => TerminateCode::DDP_TAGGED_NOT_ASSOC,
            // DDP has no rights code of its own; RFC 5040 reports rights at the RDMAP layer.
            AccessError::Rights => TerminateCode::RDMAP_ACCESS,
            AccessError::Bounds => TerminateCode::DDP_TAGGED_BASE_BOUNDS,
        }
    }
    pub fn rdmap_code(self) -> TerminateCode {
        match self {
            AccessError::InvalidStag => TerminateCode::RDMAP_INVALID_STAG,
            AccessError::WrongPd => TerminateCode::RDMAP_STAG_NOT_ASSOC,
            AccessError::Rights => TerminateCode::RDMAP_ACCESS,
            AccessError::Bounds => TerminateCode::RDMAP_BASE_BOUNDS,
        }
    }
}

impl StagTable {
    pub fn new() -> Arc<StagTable> {
        Arc::new(StagTable {
            map: RwLock::new(HashMap::new()),
            next_index: AtomicU32::new(1),
        })
    }

    /// Registers `len` zeroed bytes; `None` if the memory cannot be had (a region as large as
    /// a RAM LUN may not be), where a plain allocation would abort the process.
    pub fn register(self: &Arc<Self>, pd: u32, len: usize, access: Access) -> Option<Arc<MrInner>> {
        let len = len.max(1);
        let layout = std::alloc::Layout::array::<u8>(len).ok()?;
        // SAFETY: the layout has a non-zero size; the zeroed memory is owned by the region
        // and freed in its Drop as the Box<[u8]> of `len` bytes this layout describes.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return None;
        }
        Some(self.insert(ptr, len, None, pd, access))
    }

    /// Registers the caller's bytes where they lie (zero-copy write data), read-only: the
    /// engine writes only into regions with write rights, and those are refused here.
    pub fn register_bytes(
        self: &Arc<Self>,
        pd: u32,
        data: bytes::Bytes,
        access: Access,
    ) -> rdma::Result<Arc<MrInner>> {
        rdma::check_reg_bytes(&data, access)?;
        // The pointer is only ever read through (the region has no write rights, and
        // `Mr::write_at` / `with_bytes_mut` refuse a read-only region).
        let ptr = data.as_ptr() as *mut u8;
        let len = data.len();
        Ok(self.insert(ptr, len, Some(data), pd, access))
    }

    fn insert(
        self: &Arc<Self>,
        ptr: *mut u8,
        len: usize,
        borrowed: Option<bytes::Bytes>,
        pd: u32,
        access: Access,
    ) -> Arc<MrInner> {
        let index = self.next_index.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
        let stag = (index << 8) | 0x01;
        let mr = Arc::new(MrInner {
            ptr,
            len,
            borrowed,
            pd,
            access,
            block_crcs: OnceLock::new(),
            stag: AtomicU32::new(stag),
            valid: AtomicBool::new(true),
            remote_len: AtomicUsize::new(len),
            table: self.clone(),
        });
        self.map.write().unwrap().insert(index, mr.clone());
        mr
    }

    pub fn deregister(&self, stag: u32) {
        if let Some(mr) = self.map.write().unwrap().remove(&(stag >> 8)) {
            mr.invalidate();
        }
    }

    /// How many regions are registered (for diagnostics and leak tests).
    pub fn registered(&self) -> usize {
        self.map.read().unwrap().len()
    }

    /// Looks up a valid region by its current STag.
    pub fn lookup(&self, stag: u32) -> Option<Arc<MrInner>> {
        let map = self.map.read().unwrap();
        let mr = map.get(&(stag >> 8))?;
        (mr.stag() == stag && mr.valid()).then(|| mr.clone())
    }

    /// The one check every tagged access goes through: `len` bytes at address `to` of region `stag`,
    /// from a QP in protection domain `pd`, needing `need` rights. Returns the region and the
    /// offset of `to` inside it. A zero-length access names no memory and is not checked further
    /// than the STag (ready-to-receive messages use STags that may not exist).
    pub fn check(
        &self,
        stag: u32,
        pd: u32,
        need: Access,
        to: u64,
        len: u64,
    ) -> Result<(Arc<MrInner>, usize), AccessError> {
        let mr = self.lookup(stag).ok_or(AccessError::InvalidStag)?;
        if mr.pd != pd {
            return Err(AccessError::WrongPd);
        }
        if !mr.access.contains(need) {
            return Err(AccessError::Rights);
        }
        let start = to.checked_sub(mr.base()).ok_or(AccessError::Bounds)?;
        let end = start.checked_add(len).ok_or(AccessError::Bounds)?;
        let reach = if need.contains(Access::REMOTE_WRITE) || need.contains(Access::REMOTE_READ) {
            mr.remote_len.load(Ordering::Acquire)
        } else {
            mr.len
        };
        if end > reach as u64 {
            return Err(AccessError::Bounds);
        }
        Ok((mr, start as usize))
    }

    /// Invalidation requested by the peer (Send with Invalidate): the STag must be a valid region
    /// of this PD that grants remote access.
    pub fn remote_invalidate(&self, stag: u32, pd: u32) -> bool {
        match self.lookup(stag) {
            Some(mr)
                if mr.pd == pd
                    && (mr.access.contains(Access::REMOTE_READ)
                        || mr.access.contains(Access::REMOTE_WRITE)) =>
            {
                mr.invalidate();
                true
            }
            _ => false,
        }
    }
}

/// A registered memory region of the software RNIC.
pub struct Mr {
    pub(crate) inner: Arc<MrInner>,
}

impl Mr {
    /// Borrow the region's bytes for reading. Remote writes may land concurrently if the ULP lets
    /// them, exactly as with hardware; ironsan's protocols never read a buffer that is in flight.
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        // SAFETY: ptr/len describe a live allocation owned by `inner`, kept alive by `self`.
        let s = unsafe { std::slice::from_raw_parts(self.inner.ptr, self.inner.len) };
        f(s)
    }
    /// Where `len` bytes at `offset` are written; panics unless they lie in the region and
    /// the region may be written locally.
    fn writable_at(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= self.inner.len),
            "write outside the region"
        );
        self.inner.assert_writable();
        self.inner.ptr_at(offset)
    }
    /// Fill the region (or part of it) through a closure.
    pub fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        self.inner.assert_writable();
        // SAFETY: as above; the mutable borrow lasts only for the closure, and the engine only
        // writes into the region when a remote peer targets it, which the ULP sequences.
        let s = unsafe { std::slice::from_raw_parts_mut(self.inner.ptr, self.inner.len) };
        f(s)
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        self.inner.table.deregister(self.inner.stag());
    }
}

impl MemoryRegion for Mr {
    fn lkey(&self) -> u32 {
        self.inner.stag()
    }
    fn rkey(&self) -> u32 {
        self.inner.stag()
    }
    fn addr(&self) -> u64 {
        self.inner.base()
    }
    fn len(&self) -> usize {
        self.inner.len
    }
    fn access(&self) -> Access {
        self.inner.access
    }
    fn read_at(&self, offset: usize, out: &mut [u8]) {
        assert!(
            offset
                .checked_add(out.len())
                .is_some_and(|e| e <= self.inner.len),
            "read outside the region"
        );
        // SAFETY: bounds checked above; source and destination cannot overlap (out is a Rust borrow).
        unsafe {
            std::ptr::copy_nonoverlapping(self.inner.ptr_at(offset), out.as_mut_ptr(), out.len())
        };
    }
    fn write_at(&self, offset: usize, data: &[u8]) {
        let to = self.writable_at(offset, data.len());
        // SAFETY: `writable_at` checked that `data.len()` bytes at `to` lie in the region.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), to, data.len()) };
    }
    /// Copies of [`STREAMING_MIN`] bytes or more go with non-temporal stores.
    fn write_at_streaming(&self, offset: usize, data: &[u8]) {
        if data.len() < STREAMING_MIN {
            return self.write_at(offset, data);
        }
        let to = self.writable_at(offset, data.len());
        // SAFETY: as in `write_at`.
        unsafe { copy_streaming(to, data) };
    }
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: ptr/len describe the allocation `inner` owns, alive as long as `self` (the
        // borrow's lifetime); the trait's contract keeps writers away while it is held.
        unsafe { std::slice::from_raw_parts(self.inner.ptr, self.inner.len) }
    }
    fn bytes_at(&self, offset: usize, len: usize) -> &[u8] {
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= self.inner.len),
            "bytes outside the region"
        );
        // SAFETY: in range (checked above) of the allocation `inner` owns, alive as long as
        // `self`; the trait's contract keeps writers away from these bytes while borrowed.
        unsafe { std::slice::from_raw_parts(self.inner.ptr_at(offset), len) }
    }
    fn invalidate(&self) {
        self.inner.invalidate();
    }
    fn revalidate(&self) -> u32 {
        self.revalidate_bounded(self.inner.len)
    }
    fn revalidate_bounded(&self, remote_len: usize) -> u32 {
        self.inner
            .remote_len
            .store(remote_len.min(self.inner.len), Ordering::Release);
        let old = self.inner.stag();
        let new = (old & 0xffff_ff00) | ((old.wrapping_add(1)) & 0xff);
        self.inner.stag.store(new, Ordering::Release);
        self.inner.valid.store(true, Ordering::Release);
        new
    }
    fn is_valid(&self) -> bool {
        self.inner.valid()
    }
    /// The engine takes MPA CRCs of payload sent from this region from `crcs` and sends the
    /// bytes in place (see `MrInner::crc_by_blocks`).
    fn keep_block_crcs(&self, crcs: Arc<dyn BlockCrcs>) -> bool {
        let block = crcs.block_len();
        if !block.is_power_of_two() || self.inner.immutable() {
            return false;
        }
        self.inner
            .block_crcs
            .set((crcs, Shift::bytes(block)))
            .is_ok()
    }
}

/// Below this a streaming copy is an ordinary one: short data may well be read again while
/// still cached, and the fence after non-temporal stores costs more than they save.
pub const STREAMING_MIN: usize = 32 << 10;

/// Copies `src` to `dst` with non-temporal stores (SSE2, baseline on x86-64), so that the
/// destination's cache lines are not first fetched only to be overwritten (up to twice
/// memcpy's speed into a large image; docs/performance-notes.md). The head up to 16-byte
/// alignment and the tail go by ordinary copy; a store
/// fence at the end orders the streamed bytes before whatever this thread stores next (the
/// release of the lock that publishes them).
///
/// # Safety
/// `dst` must be valid for `src.len()` bytes of writes and not overlap `src`.
unsafe fn copy_streaming(dst: *mut u8, src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let n = src.len();
        let head = dst.align_offset(16).min(n);
        // SAFETY (all three copies and the loop): the caller's contract covers `n` bytes at
        // `dst`; `head`, the 64-byte blocks and the tail partition [0, n); the stores in the
        // loop are to 16-byte-aligned addresses (`dst + head` is aligned), as
        // `_mm_stream_si128` requires, and the loads are unaligned ones.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, head);
            let mut at = head;
            while at + 64 <= n {
                let s = src.as_ptr().add(at) as *const __m128i;
                let d = dst.add(at) as *mut __m128i;
                let (a, b, c, e) = (
                    _mm_loadu_si128(s),
                    _mm_loadu_si128(s.add(1)),
                    _mm_loadu_si128(s.add(2)),
                    _mm_loadu_si128(s.add(3)),
                );
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
                at += 64;
            }
            std::ptr::copy_nonoverlapping(src.as_ptr().add(at), dst.add(at), n - at);
            _mm_sfence();
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len())
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn check_enforces_pd_rights_bounds_validity() {
        let t = StagTable::new();
        let a = t
            .register(1, 4096, Access::REMOTE_WRITE | Access::LOCAL_WRITE)
            .unwrap();
        let base = a.base();
        assert!(t
            .check(a.stag(), 1, Access::REMOTE_WRITE, base, 4096)
            .is_ok());
        assert_eq!(
            t.check(a.stag(), 2, Access::REMOTE_WRITE, base, 1).err(),
            Some(AccessError::WrongPd)
        );
        assert_eq!(
            t.check(a.stag(), 1, Access::REMOTE_READ, base, 1).err(),
            Some(AccessError::Rights)
        );
        assert_eq!(
            t.check(a.stag(), 1, Access::REMOTE_WRITE, base + 1, 4096)
                .err(),
            Some(AccessError::Bounds)
        );
        assert_eq!(
            t.check(a.stag(), 1, Access::REMOTE_WRITE, base - 1, 1)
                .err(),
            Some(AccessError::Bounds)
        );
        assert_eq!(
            t.check(a.stag(), 1, Access::REMOTE_WRITE, u64::MAX, 2)
                .err(),
            Some(AccessError::Bounds)
        );
        assert_eq!(
            t.check(a.stag() ^ 1, 1, Access::REMOTE_WRITE, base, 1)
                .err(),
            Some(AccessError::InvalidStag)
        );
        a.invalidate();
        assert_eq!(
            t.check(a.stag(), 1, Access::REMOTE_WRITE, base, 1).err(),
            Some(AccessError::InvalidStag)
        );
    }

    #[test]
    fn as_bytes_is_the_region_written_through_write_at() {
        let t = StagTable::new();
        let mr = Mr {
            inner: t.register(1, 8192, Access::LOCAL_WRITE).unwrap(),
        };
        mr.write_at(4090, b"lent bytes");
        let view = mr.as_bytes();
        assert_eq!(view.len(), 8192);
        assert_eq!(&view[4090..4100], b"lent bytes");
        assert_eq!(
            view.as_ptr() as u64,
            mr.addr(),
            "the SGE address is the view's"
        );
    }

    #[test]
    fn a_streaming_write_lands_exactly_its_bytes_at_any_offset() {
        let t = StagTable::new();
        let len = 512 << 10;
        let mr = Mr {
            inner: t.register(1, len, Access::LOCAL_WRITE).unwrap(),
        };
        let mut model = vec![0xA5u8; len];
        mr.write_at(0, &model);
        // Aligned and unaligned starts; lengths below the streaming minimum, at it, with a
        // partial last block and a tail.
        let cases = [
            (0, STREAMING_MIN),
            (7, STREAMING_MIN + 63),
            (4096 + 13, 128 << 10),
            (65_536 - 1, STREAMING_MIN - 1),
            (len - (64 << 10) - 5, (64 << 10) + 5),
            (100, 17),
        ];
        for (i, (at, n)) in cases.into_iter().enumerate() {
            let data: Vec<u8> = (0..n).map(|k| (k * 31 + i * 7 + 1) as u8).collect();
            mr.write_at_streaming(at, &data);
            model[at..at + n].copy_from_slice(&data);
            let mut got = vec![0u8; len];
            mr.read_at(0, &mut got);
            assert!(got == model, "case {i}: {n} bytes at {at}");
        }
    }

    #[test]
    #[should_panic(expected = "write outside the region")]
    fn a_streaming_write_past_the_end_panics() {
        let t = StagTable::new();
        let mr = Mr {
            inner: t.register(1, 64 << 10, Access::LOCAL_WRITE).unwrap(),
        };
        mr.write_at_streaming(1, &vec![1u8; 64 << 10]);
    }

    #[test]
    fn bytes_registered_in_place_are_read_only_and_not_copied() {
        /// Bytes that say when their memory is let go.
        struct Owned(Vec<u8>, Arc<AtomicBool>);
        impl AsRef<[u8]> for Owned {
            fn as_ref(&self) -> &[u8] {
                &self.0
            }
        }
        impl Drop for Owned {
            fn drop(&mut self) {
                self.1.store(true, Ordering::SeqCst);
            }
        }
        let freed = Arc::new(AtomicBool::new(false));
        let t = StagTable::new();
        let data =
            bytes::Bytes::from_owner(Owned(vec![7u8; 10000], freed.clone())).slice(100..9100);
        for rights in [
            Access::LOCAL_WRITE,
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        ] {
            assert!(t.register_bytes(1, data.clone(), rights).is_err());
        }
        assert!(t
            .register_bytes(1, bytes::Bytes::new(), Access::REMOTE_READ)
            .is_err());
        let mr = Mr {
            inner: t
                .register_bytes(1, data.clone(), Access::REMOTE_READ)
                .unwrap(),
        };
        assert_eq!(
            mr.addr(),
            data.as_ptr() as u64,
            "the caller's bytes, where they lie"
        );
        assert_eq!(mr.as_bytes(), &data[..]);
        let stag = mr.rkey();
        assert!(t
            .check(stag, 1, Access::REMOTE_READ, mr.addr(), 9000)
            .is_ok());
        assert_eq!(
            t.check(stag, 1, Access::REMOTE_WRITE, mr.addr(), 1).err(),
            Some(AccessError::Rights),
            "no peer may write into them"
        );
        assert_eq!(
            t.check(stag, 1, Access::LOCAL_WRITE, mr.addr(), 1).err(),
            Some(AccessError::Rights),
            "nor may a receive or a Read Response land in them"
        );
        let writing =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mr.write_at(0, b"x")));
        assert!(writing.is_err(), "write_at refuses them");
        // The region holds the bytes: they outlive the caller's handle, and go with the region.
        drop(data);
        assert!(!freed.load(Ordering::SeqCst), "held while registered");
        assert_eq!(mr.bytes_at(0, 4), &[7, 7, 7, 7]);
        drop(mr);
        assert_eq!(t.registered(), 0);
        assert!(freed.load(Ordering::SeqCst), "let go with the region");
    }

    proptest! {
        /// Whatever STag/offset/length a peer names, an accepted access lies entirely inside one
        /// valid region of the right PD with the right rights.
        #[test]
        fn accepted_accesses_stay_inside_a_region(
            regions in proptest::collection::vec((1u32..3, 1usize..5000, 0u8..8), 1..6),
            probes in proptest::collection::vec((any::<u32>(), 0usize..6, any::<i64>(), 0u64..10000, 1u32..3, 0u8..8, any::<bool>()), 1..200),
        ) {
            let t = StagTable::new();
            let mrs: Vec<_> = regions.iter().map(|&(pd, len, acc)| t.register(pd, len, Access(acc)).unwrap()).collect();
            for (raw_stag, pick, delta, len, pd, need, use_real) in probes {
                let (stag, to) = if use_real {
                    let mr = &mrs[pick % mrs.len()];
                    (mr.stag(), mr.base().wrapping_add_signed(delta % 6000))
                } else {
                    (raw_stag, delta as u64)
                };
                if let Ok((mr, off)) = t.check(stag, pd, Access(need), to, len) {
                    prop_assert!(mr.valid());
                    prop_assert_eq!(mr.stag(), stag);
                    prop_assert_eq!(mr.pd, pd);
                    prop_assert!(mr.access.contains(Access(need)));
                    prop_assert!(off as u64 + len <= mr.len as u64);
                    prop_assert_eq!(mr.base() + off as u64, to);
                }
            }
        }
    }
}
