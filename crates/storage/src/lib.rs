//! Storage backends for ironsan logical units. One job: read and write byte ranges of a
//! linear address space (a RAM image, a sparse file or a block device) asynchronously,
//! with durability (FUA, flush) and thin-provisioning (punch, mapping status) operations.
//! The SCSI engine (crate `scsi`) talks to every backend through [`Backend`] as
//! `Arc<dyn Backend>`; it knows nothing about files or memory.
//!
//! All offsets and lengths are in bytes. Callers (the SCSI engine) only issue ranges
//! that lie inside `0..size()`; backends still check and return `InvalidInput` rather than
//! panic. Methods must be called from inside a tokio runtime (file and block backends run
//! their blocking system calls on tokio's blocking pool, bounded per backend).

mod block;
mod file;
mod memory;
mod pool;

use std::io;

use async_trait::async_trait;
use bytes::Bytes;

pub use block::BlockBackend;
pub use file::FileBackend;
pub use memory::MemoryBackend;

/// Provisioning state of a run of bytes, as reported by [`Backend::map_status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapRun {
    /// True if the bytes have storage allocated (were written and not punched since).
    pub mapped: bool,
    /// Length in bytes of the run starting at the queried offset that has this state
    /// (at least 1, at most the queried length).
    pub len: u64,
}

/// A linear byte-addressed store behind a logical unit.
///
/// Object safe: the engine holds `Arc<dyn Backend>`. Every method may be called
/// concurrently from many tasks; implementations do their own locking, and never hold a
/// lock across a whole device (independent ranges proceed in parallel).
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Capacity in bytes.
    fn size(&self) -> u64;

    /// Short name for logs: "memory", "file", "block".
    fn kind(&self) -> &'static str;

    /// True if [`Backend::punch`] really deallocates (so unmapped ranges read back as
    /// zeroes and [`Backend::map_status`] can report them as unmapped).
    fn supports_punch(&self) -> bool;

    /// Reads `len` bytes at `offset` into a fresh buffer. Never-written ranges read as zeroes.
    async fn read_at(&self, offset: u64, len: usize) -> io::Result<Bytes>;

    /// [`Backend::read_at`], plus the CRC32C of every `seg_len`-byte piece of the data (the
    /// data digests of the Data-In PDUs that will carry it). A backend that copies the data
    /// in user space computes them in the same pass as that copy; the default reads, then
    /// makes one CRC pass (the data came from the kernel: there was no copy to fuse with).
    async fn read_at_with_crcs(
        &self,
        offset: u64,
        len: usize,
        seg_len: u32,
    ) -> io::Result<(Bytes, digest::SegmentCrcs)> {
        let data = self.read_at(offset, len).await?;
        let crcs = digest::SegmentCrcs::of(&data, seg_len);
        Ok((data, crcs))
    }

    /// Writes `data` at `offset`. With `fua`, the data is on stable storage when this returns.
    async fn write_at(&self, offset: u64, data: Bytes, fua: bool) -> io::Result<()>;

    /// Makes every completed write durable (fdatasync for file/block backends).
    async fn flush(&self) -> io::Result<()>;

    /// Deallocates a range; it then reads back as zeroes. Backends that cannot deallocate
    /// write zeroes instead.
    async fn punch(&self, offset: u64, len: u64) -> io::Result<()>;

    /// Writes zeroes over a range (the range stays allocated where the backend can tell).
    async fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()>;

    /// Provisioning status of the run starting at `offset` (at most `len` bytes long).
    async fn map_status(&self, offset: u64, len: u64) -> io::Result<MapRun>;
}

/// Checks that `offset..offset+len` lies inside a device of `size` bytes.
pub(crate) fn check_range(size: u64, offset: u64, len: u64) -> io::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("range {offset}+{len} outside device of {size} bytes"),
        )),
    }
}

#[cfg(test)]
mod tests;
