//! Block-device backend: O_DIRECT for page-aligned requests (bypassing the page cache,
//! with the data read straight into the buffer that becomes the response), a buffered
//! descriptor for unaligned ones, fdatasync for flush. Reads, writes, flushes, unmap and
//! zeroing go through the backend's io_uring ring ([`crate::uring`]; FUA as an RWF_DSYNC
//! write), or with [`IoMode::Threads`] (or no io_uring in the kernel) run on tokio's
//! blocking pool (FUA as write then fdatasync). Unmap is fallocate(PUNCH_HOLE), offered
//! (thin provisioning) only where the device zeroes that way without writing (its queue
//! takes write-zeroes requests): it then reads back as zeroes, as LBPRZ says. Zeroing is
//! fallocate(ZERO_RANGE), the kernel's BLKZEROOUT ([`crate::alloc`]).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use rustix::fs::SeekFrom;

use crate::alloc::{device_punches, discard_granularity, Alloc, Via};
use crate::direct::{aligned, aligned_bytes, read_direct, write_direct};
use crate::file::{probe_punch, read_exact};
use crate::flush::FlushBatch;
use crate::pool::{BlockingPool, DEFAULT_LIMIT};
use crate::uring::{ring_for, Ring};
use crate::{check_range, Backend, IoMode, MapRun};

/// Indexes of the buffered and the O_DIRECT descriptor among the ring's registered files.
const BUFFERED: u32 = 0;
const DIRECT: u32 = 1;

/// A block device (or any file) accessed with O_DIRECT where possible.
pub struct BlockBackend {
    path: PathBuf,
    size: u64,
    buffered: Arc<File>,
    direct: Option<Arc<File>>,
    ring: Option<Ring>,
    pool: BlockingPool,
    /// Unmap and zeroing (fallocate).
    alloc: Alloc,
    /// Discard granularity of the device in bytes (0: unknown).
    granularity: u64,
    /// SYNCHRONIZE CACHE: concurrent flushes share fdatasyncs.
    flushes: FlushBatch,
}

impl BlockBackend {
    /// Opens the device at `path`; its size is the device size, or `size` if smaller.
    pub fn open(path: &Path, size: Option<u64>, read_only: bool) -> io::Result<Self> {
        Self::open_with(path, size, read_only, IoMode::default())
    }

    /// [`BlockBackend::open`] with the I/O path chosen (io_uring falls back to threads
    /// where the kernel does not offer it: [`BlockBackend::io_mode`] tells which is in use).
    pub fn open_with(
        path: &Path,
        size: Option<u64>,
        read_only: bool,
        io: IoMode,
    ) -> io::Result<Self> {
        let ctx = |e: io::Error, what: &str| {
            io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
        };
        let mut opts = OpenOptions::new();
        opts.read(true).write(!read_only);
        let buffered = opts.open(path).map_err(|e| ctx(e, "cannot open"))?;
        let dev_size = rustix::fs::seek(&buffered, SeekFrom::End(0))
            .map_err(|e| ctx(e.into(), "cannot size"))?;
        let size = match size {
            Some(s) if s > dev_size => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} has {dev_size} bytes, less than the configured {s}",
                        path.display()
                    ),
                ))
            }
            Some(s) => s,
            None => dev_size,
        };
        // O_DIRECT is refused by some filesystems (tmpfs): then everything is buffered.
        let direct = crate::direct::open(path, read_only).ok().map(Arc::new);
        let mut files = vec![&buffered];
        files.extend(direct.as_deref());
        let ring = ring_for(io, &files, path, direct.is_some());
        // Unmap is offered where a punch zeroes without writing (see `crate::alloc`).
        let punches =
            !read_only && device_punches(&buffered).unwrap_or_else(|| probe_punch(&buffered, size));
        let granularity = discard_granularity(&buffered);
        Ok(BlockBackend {
            path: path.to_path_buf(),
            size,
            buffered: Arc::new(buffered),
            direct,
            ring,
            pool: BlockingPool::new(DEFAULT_LIMIT),
            flushes: FlushBatch::default(),
            alloc: Alloc::new(punches),
            granularity,
        })
    }

    /// Path of the device.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when O_DIRECT is in use for aligned requests.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Operations on the ring not yet completed (0 without a ring).
    #[cfg(test)]
    pub(crate) fn ring_in_flight(&self) -> usize {
        crate::uring::in_flight(self.ring.as_ref())
    }

    /// The I/O path in use.
    pub fn io_mode(&self) -> IoMode {
        crate::uring::mode(self.ring.as_ref())
    }

    /// How the io_uring ring's completions were reaped so far, and how many reads took its
    /// registered buffers (`None` on the blocking pool).
    pub fn uring_stats(&self) -> Option<crate::UringStats> {
        self.ring.as_ref().map(crate::uring::Ring::stats)
    }

    fn via(&self) -> Via<'_> {
        Via {
            ring: self.ring.as_ref(),
            index: BUFFERED,
            pool: &self.pool,
            file: &self.buffered,
        }
    }

    fn direct_for(&self, offset: u64, len: usize) -> Option<Arc<File>> {
        if aligned(offset, len) {
            self.direct.clone()
        } else {
            None
        }
    }
}

#[async_trait]
impl Backend for BlockBackend {
    fn size(&self) -> u64 {
        self.size
    }

    fn kind(&self) -> &'static str {
        "block"
    }

    fn supports_punch(&self) -> bool {
        self.alloc.punches()
    }

    fn punch_granularity(&self) -> u64 {
        self.granularity
    }

    async fn read_at(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        check_range(self.size, offset, len as u64)?;
        if let Some(ring) = &self.ring {
            return match self.direct_for(offset, len) {
                Some(_) => ring.read_direct(DIRECT, offset, len).await,
                None => ring.read(BUFFERED, offset, len, 1).await,
            };
        }
        match self.direct_for(offset, len) {
            Some(direct) => {
                self.pool
                    .run(move || read_direct(&direct, offset, len))
                    .await
            }
            None => {
                let file = self.buffered.clone();
                self.pool.run(move || read_exact(&file, offset, len)).await
            }
        }
    }

    async fn write_at(&self, offset: u64, data: Bytes, fua: bool) -> io::Result<()> {
        check_range(self.size, offset, data.len() as u64)?;
        let direct = self.direct_for(offset, data.len());
        if let Some(ring) = &self.ring {
            // RWF_DSYNC: the write is durable on completion (the device's volatile cache
            // included), as FUA asks.
            return match direct {
                Some(_) => ring.write(DIRECT, offset, aligned_bytes(data), fua).await,
                None => ring.write(BUFFERED, offset, data, fua).await,
            };
        }
        let buffered = self.buffered.clone();
        self.pool
            .run(move || {
                match direct {
                    Some(direct) => write_direct(&direct, offset, &data)?,
                    None => buffered.write_all_at(&data, offset)?,
                }
                // O_DIRECT skips the page cache but not the device's volatile cache.
                if fua {
                    buffered.sync_data()?;
                }
                Ok(())
            })
            .await
    }

    async fn flush(&self) -> io::Result<()> {
        self.flushes
            .flush(|| async {
                if let Some(ring) = &self.ring {
                    return ring.fdatasync(BUFFERED).await;
                }
                let file = self.buffered.clone();
                self.pool.run(move || file.sync_data()).await
            })
            .await
    }

    async fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        self.alloc.punch(self.via(), offset, len).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        self.alloc.zero(self.via(), offset, len).await
    }

    async fn map_status(&self, offset: u64, len: u64) -> io::Result<MapRun> {
        check_range(self.size, offset, len)?;
        Ok(MapRun {
            mapped: true,
            len: len.max(1),
        })
    }
}
