//! Sparse-file backend: reads, writes (FUA as RWF_DSYNC writes) and flush (fdatasync)
//! through the backend's io_uring ring ([`crate::uring`]), or with [`IoMode::Threads`] (or
//! no io_uring in the kernel) as pread/pwrite on tokio's blocking pool, a read whose data
//! is all in the page cache done in place first (RWF_NOWAIT) and FUA writes through a second
//! O_DSYNC descriptor. On tmpfs reads are done in place in both modes (the file is memory).
//! Opened `direct`, requests aligned to 4 KiB bypass the page cache ([`crate::direct`]).
//! Unmap by fallocate(PUNCH_HOLE), zeroing by fallocate(ZERO_RANGE) ([`crate::alloc`]: on
//! the ring or the pool), mapping status by SEEK_DATA/SEEK_HOLE on the pool. A read that
//! finds the file shorter than the device (truncated under the LUN) fails
//! ([`crate::ends_early`]).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use rustix::fs::{FallocateFlags, OFlags, SeekFrom};

use crate::alloc::{Alloc, Via};
use crate::direct::{aligned_bytes, read_direct, write_direct};
use crate::flush::FlushBatch;
use crate::pool::{BlockingPool, DEFAULT_LIMIT};
use crate::uring::{ring_for, Ring};
use crate::{check_range, Backend, IoMode, MapRun};

/// Indexes of the image file, and of its O_DIRECT descriptor if any, among the ring's
/// registered files.
const IMAGE: u32 = 0;
const DIRECT: u32 = 1;

/// A device image stored in a (normally sparse) regular file.
pub struct FileBackend {
    path: PathBuf,
    /// The capacity: the file's length as opened, or as [`Backend::resize`] set it.
    size: AtomicU64,
    file: Arc<File>,
    /// Same file opened with O_DSYNC: a write on it is durable when it returns (FUA). Only
    /// without a ring (which writes FUA with RWF_DSYNC).
    dsync: Option<Arc<File>>,
    /// Same file opened with O_DIRECT, for aligned requests (`direct` in the LUN's config).
    direct: Option<Arc<File>>,
    ring: Option<Ring>,
    pool: BlockingPool,
    /// Punching and zeroing (fallocate).
    alloc: Alloc,
    /// SYNCHRONIZE CACHE: concurrent flushes share fdatasyncs.
    flushes: FlushBatch,
    /// How a read may skip the blocking pool (see [`InPlace`]); downgraded to `Never` when the
    /// kernel refuses RWF_NOWAIT on this file system.
    in_place: AtomicU8,
}

/// Reads done on the calling thread instead of the blocking pool.
#[repr(u8)]
enum InPlace {
    /// Try preadv2(RWF_NOWAIT): done in place when the page cache holds the whole range.
    NoWait = 0,
    /// tmpfs: the file is memory (RWF_NOWAIT is not supported there), a read never waits.
    Memory = 1,
    Never = 2,
}

/// statfs f_type of tmpfs.
const TMPFS_MAGIC: i64 = 0x0102_1994;

impl FileBackend {
    /// Opens (or with `create`, creates) the image at `path`.
    ///
    /// `size`: the device size; `None` means the file's current length. A file shorter
    /// than `size` is extended sparsely; a longer one is used up to `size`.
    pub fn open(path: &Path, size: Option<u64>, create: bool, read_only: bool) -> io::Result<Self> {
        Self::open_with(path, size, create, read_only, IoMode::default())
    }

    /// [`FileBackend::open`] with the I/O path chosen (io_uring falls back to threads where
    /// the kernel does not offer it: [`FileBackend::io_mode`] tells which is in use).
    pub fn open_with(
        path: &Path,
        size: Option<u64>,
        create: bool,
        read_only: bool,
        io: IoMode,
    ) -> io::Result<Self> {
        Self::open_direct(path, size, create, read_only, io, false)
    }

    /// [`FileBackend::open_with`], and with `direct` requests aligned to 4 KiB (offset and
    /// length) bypass the page cache (O_DIRECT; the others stay buffered: `crate::direct`).
    /// A file system that refuses O_DIRECT gets buffered I/O and one log line
    /// ([`FileBackend::is_direct`] tells).
    pub fn open_direct(
        path: &Path,
        size: Option<u64>,
        create: bool,
        read_only: bool,
        io: IoMode,
        direct: bool,
    ) -> io::Result<Self> {
        let (file, size) = open_image(path, size, create, read_only)?;
        let direct = match direct.then(|| crate::direct::open(path, read_only)) {
            Some(Ok(f)) => Some(Arc::new(f)),
            Some(Err(e)) => {
                tracing::warn!(
                    "{}: O_DIRECT refused ({e}); the LUN is buffered",
                    path.display()
                );
                None
            }
            None => None,
        };
        let mut files = vec![&file];
        files.extend(direct.as_deref());
        let ring = ring_for(io, &files, path, direct.is_some());
        let dsync = match ring {
            Some(_) => None,
            None => Some(Arc::new(
                OpenOptions::new()
                    .read(true)
                    .write(!read_only)
                    .custom_flags(OFlags::DSYNC.bits() as i32)
                    .open(path)
                    .map_err(|e| context(path, e, "cannot open (O_DSYNC)"))?,
            )),
        };
        let punch_works = !read_only && probe_punch(&file, size);
        // f_type's integer type differs between architectures, hence the cast.
        #[allow(clippy::unnecessary_cast)]
        let on_tmpfs = rustix::fs::fstatfs(&file).is_ok_and(|s| s.f_type as i64 == TMPFS_MAGIC);
        let in_place = if on_tmpfs {
            InPlace::Memory
        } else {
            InPlace::NoWait
        };
        Ok(FileBackend {
            path: path.to_path_buf(),
            size: AtomicU64::new(size),
            file: Arc::new(file),
            dsync,
            direct,
            ring,
            pool: BlockingPool::new(DEFAULT_LIMIT),
            flushes: FlushBatch::default(),
            alloc: Alloc::new(punch_works),
            in_place: AtomicU8::new(in_place as u8),
        })
    }

    /// True when aligned requests bypass the page cache (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// The O_DIRECT descriptor when a transfer at `offset` of `len` bytes goes through it.
    fn direct_for(&self, offset: u64, len: usize) -> Option<&Arc<File>> {
        self.direct
            .as_ref()
            .filter(|_| crate::direct::aligned(offset, len))
    }

    /// Path of the image file.
    pub fn path(&self) -> &Path {
        &self.path
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
            index: IMAGE,
            pool: &self.pool,
            file: &self.file,
        }
    }
}

fn context(path: &Path, e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// Opens (or creates) the image and extends it to `size` (`None`: its length): the file,
/// and the device size.
fn open_image(
    path: &Path,
    size: Option<u64>,
    create: bool,
    read_only: bool,
) -> io::Result<(File, u64)> {
    let exists = path.exists();
    if !exists && !create {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "backing file {} does not exist (set create = true to create it)",
                path.display()
            ),
        ));
    }
    if !exists && size.is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot create {} without a size", path.display()),
        ));
    }
    let file = OpenOptions::new()
        .read(true)
        .write(!read_only)
        .create(create && !read_only)
        .open(path)
        .map_err(|e| context(path, e, "cannot open"))?;
    let current = file
        .metadata()
        .map_err(|e| context(path, e, "cannot stat"))?
        .len();
    let size = size.unwrap_or(current);
    if current < size {
        if read_only {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is {current} bytes, smaller than the configured {size}",
                    path.display()
                ),
            ));
        }
        file.set_len(size)
            .map_err(|e| context(path, e, "cannot extend"))?;
    }
    Ok((file, size))
}

/// Checks whether the filesystem supports hole punching, by punching the last byte of
/// the image when that byte is zero (so no data can be lost). When it is not zero we
/// assume support; a failing punch later falls back to writing zeroes.
pub(crate) fn probe_punch(file: &File, size: u64) -> bool {
    if size == 0 {
        return false;
    }
    let mut last = [0u8; 1];
    if file.read_exact_at(&mut last, size - 1).is_err() || last[0] != 0 {
        return true;
    }
    rustix::fs::fallocate(
        file,
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        size - 1,
        1,
    )
    .is_ok()
}

/// The whole range if the page cache holds all of it (preadv2 with RWF_NOWAIT), else None;
/// an error when this file system does not do RWF_NOWAIT.
pub(crate) fn read_cached(file: &File, offset: u64, len: usize) -> io::Result<Option<Bytes>> {
    let mut buf = BytesMut::zeroed(len);
    let mut done = 0;
    while done < len {
        let mut iov = [io::IoSliceMut::new(&mut buf[done..])];
        match rustix::io::preadv2(
            file,
            &mut iov,
            offset + done as u64,
            rustix::io::ReadWriteFlags::NOWAIT,
        ) {
            Ok(0) => return Err(crate::ends_early(offset + done as u64)),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => return Ok(None), // not all in the page cache
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(buf.freeze()))
}

pub(crate) fn read_exact(file: &File, offset: u64, len: usize) -> io::Result<Bytes> {
    let mut buf = BytesMut::zeroed(len);
    let mut done = 0;
    while done < len {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => return Err(crate::ends_early(offset + done as u64)),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf.freeze())
}

/// SEEK_DATA/SEEK_HOLE based mapping status of `offset..offset+len`.
pub(crate) fn seek_map_status(file: &File, offset: u64, len: u64) -> io::Result<MapRun> {
    let end = offset + len;
    let next_data = match rustix::fs::seek(file, SeekFrom::Data(offset)) {
        Ok(pos) => pos,
        Err(rustix::io::Errno::NXIO) => u64::MAX,
        Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::OPNOTSUPP) => {
            return Ok(MapRun {
                mapped: true,
                len: len.max(1),
            })
        }
        Err(e) => return Err(e.into()),
    };
    if next_data > offset {
        return Ok(MapRun {
            mapped: false,
            len: (next_data.min(end) - offset).max(1),
        });
    }
    let next_hole = rustix::fs::seek(file, SeekFrom::Hole(offset)).unwrap_or(u64::MAX);
    Ok(MapRun {
        mapped: true,
        len: (next_hole.min(end) - offset).max(1),
    })
}

#[async_trait]
impl Backend for FileBackend {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn kind(&self) -> &'static str {
        "file"
    }

    /// Sets the file's length (sparsely when it grows); a file opened read-only refuses.
    fn resize(&self, size: u64) -> io::Result<()> {
        self.file.set_len(size).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot set the length of {}: {e}", self.path.display()),
            )
        })?;
        self.size.store(size, Ordering::Release);
        Ok(())
    }

    fn supports_punch(&self) -> bool {
        self.alloc.punches()
    }

    async fn read_at(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        check_range(self.size(), offset, len as u64)?;
        // A page-cache hit costs a memcpy; handing it to a blocking thread costs more than
        // that. RWF_NOWAIT never sleeps: a miss goes to the pool. (A ring serves a hit inside
        // its submit call already.)
        let direct = self.direct_for(offset, len);
        match self.in_place.load(Ordering::Relaxed) {
            m if m == InPlace::Memory as u8 => return read_exact(&self.file, offset, len),
            _ if self.ring.is_some() || direct.is_some() => {}
            m if m == InPlace::NoWait as u8 => match read_cached(&self.file, offset, len) {
                Ok(Some(data)) => return Ok(data),
                Ok(None) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(e),
                Err(_) => self.in_place.store(InPlace::Never as u8, Ordering::Relaxed),
            },
            _ => {}
        }
        if let Some(ring) = &self.ring {
            return match direct {
                Some(_) => ring.read_direct(DIRECT, offset, len).await,
                None => ring.read(IMAGE, offset, len, 1).await,
            };
        }
        if let Some(direct) = direct.cloned() {
            return self
                .pool
                .run(move || read_direct(&direct, offset, len))
                .await;
        }
        let file = self.file.clone();
        self.pool.run(move || read_exact(&file, offset, len)).await
    }

    async fn write_at(&self, offset: u64, data: Bytes, fua: bool) -> io::Result<()> {
        check_range(self.size(), offset, data.len() as u64)?;
        let direct = self.direct_for(offset, data.len()).cloned();
        if let Some(ring) = &self.ring {
            return match direct {
                Some(_) => ring.write(DIRECT, offset, aligned_bytes(data), fua).await,
                None => ring.write(IMAGE, offset, data, fua).await,
            };
        }
        if let Some(direct) = direct {
            // O_DIRECT skips the page cache, not the disk's volatile cache: FUA syncs.
            let file = self.file.clone();
            return self
                .pool
                .run(move || {
                    write_direct(&direct, offset, &data)?;
                    if fua {
                        file.sync_data()?;
                    }
                    Ok(())
                })
                .await;
        }
        let file = match (&self.dsync, fua) {
            (Some(dsync), true) => dsync.clone(),
            _ => self.file.clone(),
        };
        self.pool
            .run(move || file.write_all_at(&data, offset))
            .await
    }

    async fn flush(&self) -> io::Result<()> {
        self.flushes
            .flush(|| async {
                if let Some(ring) = &self.ring {
                    return ring.fdatasync(IMAGE).await;
                }
                let file = self.file.clone();
                self.pool.run(move || file.sync_data()).await
            })
            .await
    }

    async fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len)?;
        self.alloc.punch(self.via(), offset, len).await
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len)?;
        self.alloc.zero(self.via(), offset, len).await
    }

    async fn map_status(&self, offset: u64, len: u64) -> io::Result<MapRun> {
        check_range(self.size(), offset, len)?;
        let file = self.file.clone();
        self.pool
            .run(move || seek_map_status(&file, offset, len))
            .await
    }
}
