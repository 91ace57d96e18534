//! Storage backends for ironsan logical units. One job: read and write byte ranges of a
//! linear address space (a RAM image, a sparse file or a block device) asynchronously,
//! with durability (FUA, flush) and thin-provisioning (punch, mapping status) operations, and
//! change its size while running where the backend can ([`Backend::resize`]).
//! The SCSI engine (crate `scsi`) talks to every backend through [`Backend`] as
//! `Arc<dyn Backend>`; it knows nothing about files or memory.
//!
//! All offsets and lengths are in bytes. Callers (the SCSI engine) only issue ranges
//! that lie inside `0..size()`; backends still check and return `InvalidInput` rather than
//! panic. Methods must be called from inside a tokio runtime. The file and block backends
//! submit reads, writes, flushes, punching and zeroing (fallocate, module `alloc`) through an
//! io_uring ring of their own (module `uring`; completions are reaped on the runtime the
//! backend was made on where it has an I/O driver, [`UringStats`] counts where), or, with
//! [`IoMode::Threads`] or no io_uring in the kernel, run them as blocking system calls on
//! tokio's blocking pool, bounded per backend (module `pool`); mapping status always uses
//! the pool. Block devices, and files opened `direct`, take aligned requests with O_DIRECT
//! (module `direct`; on a ring, reads go into registered buffers where one is free, module
//! `fixed`). Concurrent flushes share fdatasyncs (module `flush`). A read that finds the backing file shorter than the
//! device (truncated under it) fails with `UnexpectedEof` rather than reading zeroes; see
//! [`device_gone`] for the errno that says the device went away.
//!
//! A read may be produced into memory its consumer lends ([`ReadBuf`], [`Backend::read_into`]):
//! the buffer's own work (a transport's CRCs) rides on the backend's copy, and a RAM image in
//! registered memory ([`ImageMemory`], its [`Registration`]) is taken where it lies. What the
//! buffer noted goes back to its lender as a [`BufNote`], whose kinds name what the
//! transports act on (the CRCs of fixed-size pieces; where the bytes lie in registered memory).
//!
//! Several gateways serving the same storage agree through two seams: [`ExclusiveOwner`]
//! (which gateway writes, the others fenced) and [`SharedBlob`] (a record they share, such as
//! persistent reservations), from the backend where its storage offers them; where it does not,
//! [`owner_file::FileOwner`] keeps ownership in a lock file every gateway reaches, and a
//! [`shared_blob_file::FileBlob`] such a record in a file on storage every gateway reaches.

mod alloc;
mod block;
mod direct;
mod file;
mod fixed;
mod flush;
mod lent;
mod memory;
pub mod owner;
pub mod owner_file;
mod pool;
pub mod shared_blob;
pub mod shared_blob_file;
mod uring;

use std::io;

use async_trait::async_trait;
use bytes::Bytes;
use std::sync::Arc;

pub use block::BlockBackend;
pub use file::FileBackend;
pub use lent::{BufNote, Held, Registered, Registration, SegmentCrcs};
pub use memory::{ImageMemory, MemoryBackend};
pub use owner::ExclusiveOwner;
pub use shared_blob::SharedBlob;
pub use uring::UringStats;

/// How the file and block backends issue their reads, writes and flushes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoMode {
    /// Through an io_uring ring per backend (the default). Where the kernel does not offer
    /// io_uring (too old, or disabled by `kernel.io_uring_disabled`) the backend uses
    /// `Threads` instead and says so in one log line.
    #[default]
    Uring,
    /// Blocking system calls on tokio's blocking pool, bounded per backend.
    Threads,
}

/// Memory a read is produced into, lent by whoever consumes the data (a transport's buffer,
/// later registered RDMA memory). Bytes are appended in order. A buffer may do its own work
/// in the same pass as the backend's copy; storage and the SCSI engine never know what.
pub trait ReadBuf: Send + 'static {
    /// Appends bytes the backend copies out of its own memory.
    fn put(&mut self, src: &[u8]);
    /// Appends `n` zero bytes (a never-written range).
    fn put_zeros(&mut self, n: usize);
    /// Appends bytes the backend already holds (the kernel copied them); a buffer that can
    /// take them over without a copy does.
    fn put_bytes(&mut self, data: Bytes);
    /// Offers the bytes where they lie, in memory the backend was given
    /// ([`ImageMemory`]): a buffer that can send them from there (memory registered where
    /// it sends from: [`ImageMemory::registration`]) keeps a reference
    /// (`offset..offset+len` of `image`) instead of a copy and returns true. Only offered to
    /// an empty buffer; the default declines, and the backend copies.
    fn put_image(&mut self, _image: &Arc<dyn ImageMemory>, _offset: usize, _len: usize) -> bool {
        false
    }
    /// Keeps `hold` (the reader's lock on the range) until the data has been sent, when the
    /// buffer refers to the bytes where they lie (a writer must not change them before they
    /// leave); a buffer that copied them lets it go at once (the default).
    fn keep_until_sent(&mut self, hold: Held) {
        drop(hold);
    }
    /// Bytes appended so far.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The data, and what the buffer noted while it was filled, for its lender.
    fn finish(self: Box<Self>) -> (Bytes, Option<BufNote>);
}

/// Lends read buffers: a consumer (a transport) hands one to the SCSI engine per command,
/// which passes it to the backend.
pub trait ReadBufSource: Send + Sync + std::fmt::Debug {
    /// A buffer for a read of `len` bytes.
    fn lend(&self, len: usize) -> Box<dyn ReadBuf>;
}

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

    /// False while the backend cannot serve I/O at all (a network backend that has not
    /// reached its cluster yet); the engine then answers NOT READY.
    fn ready(&self) -> bool {
        true
    }

    /// True if [`Backend::punch`] really deallocates (so unmapped ranges read back as
    /// zeroes and [`Backend::map_status`] can report them as unmapped).
    fn supports_punch(&self) -> bool;

    /// The granularity in bytes at which [`Backend::punch`] deallocates best (a block
    /// device's discard granularity), reported to initiators as the optimal unmap
    /// granularity; 0 when the backend does not say.
    fn punch_granularity(&self) -> u64 {
        0
    }

    /// Reads `len` bytes at `offset` into a fresh buffer. Never-written ranges read as zeroes.
    async fn read_at(&self, offset: u64, len: usize) -> io::Result<Bytes>;

    /// Reads `len` bytes at `offset` into memory its consumer lends (`buf`), appended in
    /// order, and gives the buffer back. A backend that copies the data in user space copies
    /// it into `buf` (whose own work, such as a transport's CRCs, rides on that copy); the
    /// default hands over the buffer [`Backend::read_at`] filled (the kernel's copy).
    async fn read_into(
        &self,
        offset: u64,
        len: usize,
        mut buf: Box<dyn ReadBuf>,
    ) -> io::Result<Box<dyn ReadBuf>> {
        buf.put_bytes(self.read_at(offset, len).await?);
        Ok(buf)
    }

    /// Writes `data` at `offset`, consumed where it is (the caller's or its transport's
    /// buffer). With `fua`, the data is on stable storage when this returns.
    async fn write_at(&self, offset: u64, data: Bytes, fua: bool) -> io::Result<()>;

    /// COMPARE AND WRITE done by the storage in one operation (atomic also against writers
    /// this process does not see, such as other gateways of a shared image): writes `write`
    /// at `offset` if the bytes there equal `compare` (as long), then with `fua` makes it
    /// durable. `Some(Ok(None))`: written; `Some(Ok(Some(at)))`: not written, the first
    /// differing byte is `at` bytes past `offset`. `None` (the default): not offered for this
    /// range; the engine compares and writes under its own range lock.
    async fn compare_and_write(
        &self,
        _offset: u64,
        _compare: Bytes,
        _write: Bytes,
        _fua: bool,
    ) -> Option<io::Result<Option<u64>>> {
        None
    }

    /// Makes every completed write durable (fdatasync for file/block backends).
    async fn flush(&self) -> io::Result<()>;

    /// Deallocates a range; it then reads back as zeroes. Backends that cannot deallocate
    /// write zeroes instead.
    async fn punch(&self, offset: u64, len: u64) -> io::Result<()>;

    /// Writes zeroes over a range (the range stays allocated where the backend can tell).
    async fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()>;

    /// Provisioning status of the run starting at `offset` (at most `len` bytes long).
    async fn map_status(&self, offset: u64, len: u64) -> io::Result<MapRun>;

    /// The lock that decides which of several gateways serving this storage may write it,
    /// where the storage itself offers one (an RBD image's exclusive lock); `None` (the
    /// default) when ownership must come from the configuration.
    fn exclusive_owner(&self) -> Option<Arc<dyn ExclusiveOwner>> {
        None
    }

    /// A record beside this storage that every gateway serving it reaches (persistent
    /// reservations live there), where the storage offers one; `None` (the default) when it
    /// must come from the configuration.
    fn shared_state(&self) -> Option<Arc<dyn SharedBlob>> {
        None
    }

    /// Makes the capacity `size` bytes while the backend runs (what grows reads back as
    /// zeroes), where the backend can; it may block. The default refuses, saying why.
    fn resize(&self, size: u64) -> io::Result<()> {
        let _ = size;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("a {} backend cannot be resized", self.kind()),
        ))
    }
}

/// The error of a read that found the backing file or device ending at byte `at`, inside
/// the device's size: it was truncated (or shrank) under the running LUN. Never zeroes
/// passed off as data: `UnexpectedEof`, which the SCSI engine answers with MEDIUM ERROR /
/// UNRECOVERED READ ERROR (the LBA is inside the capacity the initiator was given, so not
/// LBA OUT OF RANGE).
pub(crate) fn ends_early(at: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("the backing store ends at byte {at}, inside the device (truncated?)"),
    )
}

/// True when `e` says the backing device is gone (ENODEV, ENXIO: removed or detached under
/// the running LUN), as opposed to a failure of its medium (EIO).
pub fn device_gone(e: &io::Error) -> bool {
    use rustix::io::Errno;
    let code = e.raw_os_error();
    [Errno::NODEV, Errno::NXIO]
        .iter()
        .any(|x| code == Some(x.raw_os_error()))
}

/// Checks that `offset..offset+len` lies inside a device of `size` bytes.
pub fn check_range(size: u64, offset: u64, len: u64) -> io::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("range {offset}+{len} outside device of {size} bytes"),
        )),
    }
}

#[cfg(test)]
mod fault_tests;
#[cfg(test)]
mod tests;
