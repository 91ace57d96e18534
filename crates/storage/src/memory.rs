//! RAM backend: the device image lives in lazily allocated fixed-size chunks, each behind
//! its own lock, so a large RAM LUN costs nothing until written and independent ranges
//! never contend on one lock. Or the image is memory lent by its owner ([`ImageMemory`]:
//! an RDMA device's region, registered once), with the same chunk locks over it, and reads
//! offer their bytes where they lie ([`ReadBuf::put_image`]).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};

use crate::{check_range, Backend, MapRun, ReadBuf, Registration};

/// Smallest chunk: small enough that a 4 KiB random write allocates little.
const MIN_CHUNK: u64 = 64 * 1024;
/// Upper bound on the number of chunk slots (keeps the slot table itself small).
const MAX_CHUNKS: u64 = 1 << 20;
/// How many times its size at start a RAM device can grow to ([`Backend::resize`]): its slot
/// table is made that long up front (a few bytes per chunk), so that I/O never waits on a
/// table that moves.
pub const GROWTH: u64 = 4;

/// Memory a RAM LUN's image lives in when another layer provides it: zeroed when handed
/// over, `len()` bytes, written only through the backend (under its chunk locks). A
/// consumer that sends from memory registered where this is ([`ImageMemory::registration`]:
/// an RDMA transport in the same protection domain) sends read data straight from it.
pub trait ImageMemory: Send + Sync + 'static {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `data` to `offset` (in range: the backend checked).
    fn write_at(&self, offset: usize, data: &[u8]);
    /// `len` bytes at `offset`, borrowed; the backend holds the chunk lock that keeps its
    /// own writers away while it copies from them.
    fn bytes_at(&self, offset: usize, len: usize) -> &[u8];
    /// Where it is registered with an RDMA device, if it is.
    fn registration(&self) -> Option<Registration>;
}

/// Where the image lives.
enum Store {
    /// Chunks allocated on first write (never-written ones read as zeroes).
    Heap(Vec<RwLock<Option<Box<[u8]>>>>),
    /// Lent memory; a chunk's flag says whether it holds anything (for `map_status`).
    Image {
        mem: Arc<dyn ImageMemory>,
        written: Vec<RwLock<bool>>,
    },
}

/// A RAM device, resizable up to its slot table ([`GROWTH`] times its size at start; lent
/// memory: its length). Unwritten chunks read as zeroes without allocating.
pub struct MemoryBackend {
    size: AtomicU64,
    /// The largest size the slot table (lent memory) holds.
    capacity: u64,
    chunk_shift: u32,
    store: Store,
}

impl MemoryBackend {
    /// Creates an all-zero RAM device of `size` bytes (no memory is allocated yet).
    pub fn new(size: u64) -> Self {
        let (chunk_shift, count) = Self::chunking(size);
        let slots = (count as u64)
            .saturating_mul(GROWTH)
            .min(MAX_CHUNKS.max(count as u64));
        MemoryBackend {
            size: AtomicU64::new(size),
            capacity: slots << chunk_shift,
            chunk_shift,
            store: Store::Heap((0..slots).map(|_| RwLock::new(None)).collect()),
        }
    }

    /// A RAM device whose image is `mem` (zeroed, its length the device's size).
    pub fn with_image(mem: Arc<dyn ImageMemory>) -> Self {
        let size = mem.len() as u64;
        let (chunk_shift, count) = Self::chunking(size);
        MemoryBackend {
            size: AtomicU64::new(size),
            capacity: size,
            chunk_shift,
            store: Store::Image {
                mem,
                written: (0..count).map(|_| RwLock::new(false)).collect(),
            },
        }
    }

    /// Chunk size (as a shift) and count for a device of `size` bytes.
    fn chunking(size: u64) -> (u32, usize) {
        let chunk = MIN_CHUNK.max(size.div_ceil(MAX_CHUNKS).next_power_of_two());
        (chunk.trailing_zeros(), size.div_ceil(chunk) as usize)
    }

    fn chunk_size(&self) -> u64 {
        1 << self.chunk_shift
    }

    /// Length of chunk `index` (the last one may be short).
    fn chunk_len(&self, index: usize) -> usize {
        let start = (index as u64) << self.chunk_shift;
        let size = self.size.load(Ordering::Acquire);
        size.saturating_sub(start).min(self.chunk_size()) as usize
    }

    /// Byte offset of `in_chunk` in chunk `index`.
    fn image_offset(&self, index: usize, in_chunk: usize) -> usize {
        (index << self.chunk_shift) + in_chunk
    }

    /// Calls `f(chunk_index, offset_in_chunk, offset_in_range, len)` for each piece of
    /// the range `offset..offset+len`.
    fn for_each_piece(&self, offset: u64, len: u64, mut f: impl FnMut(usize, usize, usize, usize)) {
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let index = (pos >> self.chunk_shift) as usize;
            let in_chunk = (pos & (self.chunk_size() - 1)) as usize;
            let n = (self.chunk_size() - in_chunk as u64).min(len - done);
            f(index, in_chunk, done as usize, n as usize);
            done += n;
        }
    }

    /// Hands `n` bytes at `in_chunk` of chunk `index` to `f` under the chunk's read lock,
    /// or `None` if the chunk holds nothing (they are zeroes).
    fn read_piece(&self, index: usize, in_chunk: usize, n: usize, f: impl FnOnce(Option<&[u8]>)) {
        match &self.store {
            Store::Heap(chunks) => {
                let slot = chunks[index].read().unwrap_or_else(|e| e.into_inner());
                f(slot.as_deref().map(|c| &c[in_chunk..in_chunk + n]))
            }
            Store::Image { mem, written } => {
                let w = written[index].read().unwrap_or_else(|e| e.into_inner());
                f(w.then(|| mem.bytes_at(self.image_offset(index, in_chunk), n)))
            }
        }
    }

    /// Writes `data` at `in_chunk` of chunk `index` (`None`: that many zeroes), which then
    /// holds something.
    fn write_piece(&self, index: usize, in_chunk: usize, n: usize, data: Option<&[u8]>) {
        match &self.store {
            Store::Heap(chunks) => {
                let mut slot = chunks[index].write().unwrap_or_else(|e| e.into_inner());
                // Whole even at the end: the device may grow past it.
                let chunk_len = self.chunk_size() as usize;
                let chunk = slot.get_or_insert_with(|| vec![0u8; chunk_len].into_boxed_slice());
                match data {
                    Some(d) => chunk[in_chunk..in_chunk + n].copy_from_slice(d),
                    None => chunk[in_chunk..in_chunk + n].fill(0),
                }
            }
            Store::Image { mem, written } => {
                let mut w = written[index].write().unwrap_or_else(|e| e.into_inner());
                let at = self.image_offset(index, in_chunk);
                match data {
                    Some(d) => mem.write_at(at, d),
                    None if *w => write_zeroes(mem.as_ref(), at, n),
                    None => {} // never written: already zero
                }
                *w = true;
            }
        }
    }

    /// Deallocates `n` bytes at `in_chunk` of chunk `index`: a whole chunk, or one left all
    /// zero, holds nothing afterwards.
    fn punch_piece(&self, index: usize, in_chunk: usize, n: usize) {
        let whole = in_chunk == 0 && n == self.chunk_len(index);
        match &self.store {
            Store::Heap(chunks) => {
                let mut slot = chunks[index].write().unwrap_or_else(|e| e.into_inner());
                if whole {
                    *slot = None;
                } else if let Some(chunk) = slot.as_mut() {
                    chunk[in_chunk..in_chunk + n].fill(0);
                    if chunk.iter().all(|&b| b == 0) {
                        *slot = None;
                    }
                }
            }
            Store::Image { mem, written } => {
                let mut w = written[index].write().unwrap_or_else(|e| e.into_inner());
                if *w {
                    write_zeroes(mem.as_ref(), self.image_offset(index, in_chunk), n);
                    let start = self.image_offset(index, 0);
                    *w = !mem
                        .bytes_at(start, self.chunk_len(index))
                        .iter()
                        .all(|&b| b == 0);
                }
            }
        }
    }

    fn piece_mapped(&self, index: usize) -> bool {
        match &self.store {
            Store::Heap(chunks) => chunks[index]
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .is_some(),
            Store::Image { written, .. } => {
                *written[index].read().unwrap_or_else(|e| e.into_inner())
            }
        }
    }

    fn read_sync(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        check_range(self.size(), offset, len as u64)?;
        // Appended piece by piece (pieces come in order): no zero-fill of bytes then copied.
        let mut buf = BytesMut::with_capacity(len);
        self.for_each_piece(offset, len as u64, |index, in_chunk, at, n| {
            debug_assert_eq!(buf.len(), at);
            self.read_piece(index, in_chunk, n, |bytes| match bytes {
                Some(b) => buf.extend_from_slice(b),
                None => buf.resize(at + n, 0),
            });
        });
        Ok(buf.freeze())
    }

    /// `read_sync` into a lent buffer: each piece is copied (or, never written, zeroed)
    /// straight into it, so the lender's work rides on this one copy; or, lent memory, the
    /// buffer takes the bytes where they lie.
    fn read_into_sync(&self, offset: u64, len: usize, buf: &mut dyn ReadBuf) -> io::Result<()> {
        check_range(self.size(), offset, len as u64)?;
        if let Store::Image { mem, .. } = &self.store {
            if buf.is_empty() && buf.put_image(mem, offset as usize, len) {
                return Ok(());
            }
        }
        self.for_each_piece(offset, len as u64, |index, in_chunk, _, n| {
            self.read_piece(index, in_chunk, n, |bytes| match bytes {
                Some(b) => buf.put(b),
                None => buf.put_zeros(n),
            });
        });
        Ok(())
    }

    fn write_sync(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        check_range(self.size(), offset, data.len() as u64)?;
        self.for_each_piece(offset, data.len() as u64, |index, in_chunk, at, n| {
            self.write_piece(index, in_chunk, n, Some(&data[at..at + n]));
        });
        Ok(())
    }

    fn punch_sync(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len)?;
        self.for_each_piece(offset, len, |index, in_chunk, _, n| {
            self.punch_piece(index, in_chunk, n);
        });
        Ok(())
    }

    /// Zeroes a range but keeps it allocated (so it still reports as mapped).
    fn zero_sync(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len)?;
        self.for_each_piece(offset, len, |index, in_chunk, _, n| {
            self.write_piece(index, in_chunk, n, None);
        });
        Ok(())
    }

    fn map_status_sync(&self, offset: u64, len: u64) -> io::Result<MapRun> {
        check_range(self.size(), offset, len.max(1))?;
        let mut first: Option<bool> = None;
        let mut run = 0u64;
        let mut stop = false;
        self.for_each_piece(offset, len, |index, _, _, n| {
            if stop {
                return;
            }
            let mapped = self.piece_mapped(index);
            match first {
                None => first = Some(mapped),
                Some(m) if m != mapped => {
                    stop = true;
                    return;
                }
                _ => {}
            }
            run += n as u64;
        });
        Ok(MapRun {
            mapped: first.unwrap_or(false),
            len: run.max(1),
        })
    }
}

/// Writes `n` zeroes at `offset` of `mem`.
fn write_zeroes(mem: &dyn ImageMemory, offset: usize, n: usize) {
    const ZEROS: [u8; 4096] = [0; 4096];
    let mut done = 0;
    while done < n {
        let k = (n - done).min(ZEROS.len());
        mem.write_at(offset + done, &ZEROS[..k]);
        done += k;
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    /// Grows up to the slot table's capacity (lent memory: its length). Shrinking zeroes
    /// what it cuts off, so that growing again reads zeroes there.
    fn resize(&self, size: u64) -> io::Result<()> {
        if size == 0 || size > self.capacity {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a RAM device of this one's start size can be 1 to {} bytes (the size it \
                     started with, times {GROWTH}; registered memory: its length), not {size}",
                    self.capacity
                ),
            ));
        }
        let old = self.size.swap(size, Ordering::AcqRel);
        if size < old {
            let tail = old - size;
            // chunk_len follows the new size: zero the tail piece by piece, whole chunks freed.
            self.for_each_piece(size, tail, |index, in_chunk, _, n| match &self.store {
                Store::Heap(chunks) => {
                    let mut slot = chunks[index].write().unwrap_or_else(|e| e.into_inner());
                    if in_chunk == 0 {
                        *slot = None;
                    } else if let Some(chunk) = slot.as_mut() {
                        chunk[in_chunk..in_chunk + n].fill(0);
                    }
                }
                Store::Image { mem, written } => {
                    let _w = written[index].write().unwrap_or_else(|e| e.into_inner());
                    write_zeroes(mem.as_ref(), self.image_offset(index, in_chunk), n);
                }
            });
        }
        Ok(())
    }

    fn supports_punch(&self) -> bool {
        true
    }

    async fn read_at(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        self.read_sync(offset, len)
    }

    async fn read_into(
        &self,
        offset: u64,
        len: usize,
        mut buf: Box<dyn ReadBuf>,
    ) -> io::Result<Box<dyn ReadBuf>> {
        self.read_into_sync(offset, len, buf.as_mut())?;
        Ok(buf)
    }

    async fn write_at(&self, offset: u64, data: Bytes, _fua: bool) -> io::Result<()> {
        self.write_sync(offset, &data)
    }

    async fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    async fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        self.punch_sync(offset, len)
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zero_sync(offset, len)
    }

    async fn map_status(&self, offset: u64, len: u64) -> io::Result<MapRun> {
        self.map_status_sync(offset, len)
    }
}
