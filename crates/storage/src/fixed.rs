//! Registered read buffers for a ring's O_DIRECT reads: one page-aligned allocation cut into
//! [`SLOTS`] slots of [`SLOT`] bytes, registered with the ring (`register_buffers`), so a read
//! that fits a slot is a `ReadFixed` (the kernel skips pinning the pages per read). The read
//! data goes up as `Bytes` that own the slot (no copy); dropping the last of them returns the
//! slot. While a read is in flight its slot is held by the ring's in-flight table, like any
//! lent buffer, so a dropped command never frees a slot under the kernel. No slot free (or a
//! read larger than a slot): the read takes an unregistered buffer as before.

use std::alloc::Layout;
use std::io;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

/// Bytes per slot: the largest read a slot takes.
pub(crate) const SLOT: usize = 128 << 10;

/// Slots per ring (4 MiB registered).
pub(crate) const SLOTS: usize = 32;

/// The pool's memory and its free slots.
struct Inner {
    base: NonNull<u8>,
    layout: Layout,
    free: Mutex<Vec<u16>>,
}

// SAFETY: the memory is plain bytes behind a pointer the pool never hands out as a
// reference except through a slot, and each slot has one owner at a time (the free list
// hands an index out once until it comes back).
unsafe impl Send for Inner {}
// SAFETY: as for Send; the free list is behind a mutex.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: allocated in FixedPool::new with this layout; every slot holds an Arc to
        // this, so none is left when it drops.
        unsafe { std::alloc::dealloc(self.base.as_ptr(), self.layout) };
    }
}

/// A ring's registered buffers (see the module comment).
#[derive(Clone)]
pub(crate) struct FixedPool(Arc<Inner>);

impl FixedPool {
    /// The pool's memory, zeroed and page-aligned (not yet registered).
    pub(crate) fn new() -> io::Result<FixedPool> {
        let layout = Layout::from_size_align(SLOT * SLOTS, crate::direct::DIRECT_ALIGN)
            .map_err(io::Error::other)?;
        // SAFETY: the layout has a non-zero size.
        let base = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(FixedPool(Arc::new(Inner {
            base,
            layout,
            free: Mutex::new((0..SLOTS as u16).rev().collect()),
        })))
    }

    /// Start and length of each slot, in buffer-index order, for `register_buffers`.
    pub(crate) fn regions(&self) -> Vec<(*mut u8, usize)> {
        (0..SLOTS)
            .map(|i| (self.slot_ptr(i as u16), SLOT))
            .collect()
    }

    fn slot_ptr(&self, index: u16) -> *mut u8 {
        // SAFETY: index < SLOTS, so the offset stays inside the allocation.
        unsafe { self.0.base.as_ptr().add(index as usize * SLOT) }
    }

    /// A free slot, if any.
    pub(crate) fn take(&self) -> Option<Slot> {
        let index = self
            .0
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()?;
        Some(Slot {
            pool: self.clone(),
            index,
        })
    }

    /// Slots free now.
    #[cfg(test)]
    pub(crate) fn free(&self) -> usize {
        self.0.free.lock().unwrap().len()
    }
}

/// One slot, owned: its memory is this holder's until it drops (back to the pool).
pub(crate) struct Slot {
    pool: FixedPool,
    index: u16,
}

impl Slot {
    /// The registered buffer index (`buf_index` of ReadFixed).
    pub(crate) fn index(&self) -> u16 {
        self.index
    }

    /// Start of the slot's memory, for the kernel to write into.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.pool.slot_ptr(self.index)
    }

    /// The first `len` bytes of the slot as `Bytes` owning it (the slot returns to the pool
    /// when the last clone drops).
    pub(crate) fn into_bytes(self, len: usize) -> Bytes {
        Bytes::from_owner(Filled {
            slot: self,
            len: len.min(SLOT),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.pool
            .0
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(self.index);
    }
}

/// A slot holding `len` bytes of read data.
struct Filled {
    slot: Slot,
    len: usize,
}

impl AsRef<[u8]> for Filled {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the slot is this value's alone (nothing else writes it: its read has
        // completed and the kernel is done with it), its memory lives as long as the pool
        // Arc the slot holds, and len <= SLOT bytes of it were zeroed at allocation or
        // written by the read.
        unsafe { std::slice::from_raw_parts(self.slot.ptr(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots are handed out once each, come back when their holder (or the last clone of
    /// their bytes) drops, and run out rather than being shared.
    #[test]
    fn slots_are_exclusive_and_come_back() {
        let pool = FixedPool::new().unwrap();
        let slots: Vec<Slot> = (0..SLOTS).map(|_| pool.take().unwrap()).collect();
        assert!(pool.take().is_none(), "exhausted");
        let mut seen: Vec<u16> = slots.iter().map(Slot::index).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), SLOTS);
        assert!(slots
            .iter()
            .all(|s| (s.ptr() as usize).is_multiple_of(crate::direct::DIRECT_ALIGN)));
        drop(slots);
        assert_eq!(pool.free(), SLOTS);

        let slot = pool.take().unwrap();
        // SAFETY: the slot is ours; 5 bytes lie well inside it.
        unsafe { std::ptr::copy_nonoverlapping(b"hello".as_ptr(), slot.ptr(), 5) };
        let bytes = slot.into_bytes(5);
        let part = bytes.slice(1..3);
        drop(bytes);
        assert_eq!(pool.free(), SLOTS - 1, "a clone still holds the slot");
        assert_eq!(&part[..], b"el");
        drop(part);
        assert_eq!(pool.free(), SLOTS);
    }
}
