//! RAM backend: the device image lives in lazily allocated fixed-size chunks, each behind
//! its own lock, so a large RAM LUN costs nothing until written and independent ranges
//! never contend on one lock.

use std::io;
use std::sync::RwLock;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};

use crate::{check_range, Backend, MapRun, ReadBuf};

/// Smallest chunk: small enough that a 4 KiB random write allocates little.
const MIN_CHUNK: u64 = 64 * 1024;
/// Upper bound on the number of chunk slots (keeps the slot table itself small).
const MAX_CHUNKS: u64 = 1 << 20;

/// A RAM device of fixed size. Unwritten chunks read as zeroes without allocating.
pub struct MemoryBackend {
    size: u64,
    chunk_shift: u32,
    chunks: Vec<RwLock<Option<Box<[u8]>>>>,
}

impl MemoryBackend {
    /// Creates an all-zero RAM device of `size` bytes (no memory is allocated yet).
    pub fn new(size: u64) -> Self {
        let chunk = MIN_CHUNK.max(size.div_ceil(MAX_CHUNKS).next_power_of_two());
        let chunk_shift = chunk.trailing_zeros();
        let count = size.div_ceil(chunk) as usize;
        let chunks = (0..count).map(|_| RwLock::new(None)).collect();
        MemoryBackend {
            size,
            chunk_shift,
            chunks,
        }
    }

    fn chunk_size(&self) -> u64 {
        1 << self.chunk_shift
    }

    /// Length of chunk `index` (the last one may be short).
    fn chunk_len(&self, index: usize) -> usize {
        let start = (index as u64) << self.chunk_shift;
        (self.size - start).min(self.chunk_size()) as usize
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

    fn read_sync(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        check_range(self.size, offset, len as u64)?;
        // Appended piece by piece (pieces come in order): no zero-fill of bytes then copied.
        let mut buf = BytesMut::with_capacity(len);
        self.for_each_piece(offset, len as u64, |index, in_chunk, at, n| {
            debug_assert_eq!(buf.len(), at);
            let slot = self.chunks[index].read().unwrap_or_else(|e| e.into_inner());
            match slot.as_ref() {
                Some(chunk) => buf.extend_from_slice(&chunk[in_chunk..in_chunk + n]),
                None => buf.resize(at + n, 0),
            }
        });
        Ok(buf.freeze())
    }

    /// `read_sync` into a lent buffer: each piece is copied (or, never written, zeroed)
    /// straight into it, so the lender's work rides on this one copy.
    fn read_into_sync(&self, offset: u64, len: usize, buf: &mut dyn ReadBuf) -> io::Result<()> {
        check_range(self.size, offset, len as u64)?;
        self.for_each_piece(offset, len as u64, |index, in_chunk, _, n| {
            let slot = self.chunks[index].read().unwrap_or_else(|e| e.into_inner());
            match slot.as_ref() {
                Some(chunk) => buf.put(&chunk[in_chunk..in_chunk + n]),
                None => buf.put_zeros(n),
            }
        });
        Ok(())
    }

    fn write_sync(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        check_range(self.size, offset, data.len() as u64)?;
        self.for_each_piece(offset, data.len() as u64, |index, in_chunk, at, n| {
            let mut slot = self.chunks[index]
                .write()
                .unwrap_or_else(|e| e.into_inner());
            let chunk_len = self.chunk_len(index);
            let chunk = slot.get_or_insert_with(|| vec![0u8; chunk_len].into_boxed_slice());
            chunk[in_chunk..in_chunk + n].copy_from_slice(&data[at..at + n]);
        });
        Ok(())
    }

    fn punch_sync(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        self.for_each_piece(offset, len, |index, in_chunk, _, n| {
            let mut slot = self.chunks[index]
                .write()
                .unwrap_or_else(|e| e.into_inner());
            if in_chunk == 0 && n == self.chunk_len(index) {
                *slot = None;
            } else if let Some(chunk) = slot.as_mut() {
                chunk[in_chunk..in_chunk + n].fill(0);
                if chunk.iter().all(|&b| b == 0) {
                    *slot = None;
                }
            }
        });
        Ok(())
    }

    /// Zeroes a range but keeps it allocated (so it still reports as mapped).
    fn zero_sync(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        self.for_each_piece(offset, len, |index, in_chunk, _, n| {
            let mut slot = self.chunks[index]
                .write()
                .unwrap_or_else(|e| e.into_inner());
            let chunk_len = self.chunk_len(index);
            let chunk = slot.get_or_insert_with(|| vec![0u8; chunk_len].into_boxed_slice());
            chunk[in_chunk..in_chunk + n].fill(0);
        });
        Ok(())
    }

    fn map_status_sync(&self, offset: u64, len: u64) -> io::Result<MapRun> {
        check_range(self.size, offset, len.max(1))?;
        let mut first: Option<bool> = None;
        let mut run = 0u64;
        let mut stop = false;
        self.for_each_piece(offset, len, |index, _, _, n| {
            if stop {
                return;
            }
            let mapped = self.chunks[index]
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .is_some();
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

#[async_trait]
impl Backend for MemoryBackend {
    fn size(&self) -> u64 {
        self.size
    }

    fn kind(&self) -> &'static str {
        "memory"
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
