//! Sparse-file backend: reads, writes (FUA as RWF_DSYNC writes) and flush (fdatasync)
//! through the backend's io_uring ring ([`crate::uring`]), or with [`IoMode::Threads`] (or
//! no io_uring in the kernel) as pread/pwrite on tokio's blocking pool, a read whose data
//! is all in the page cache done in place first (RWF_NOWAIT) and FUA writes through a second
//! O_DSYNC descriptor. On tmpfs reads are done in place in both modes (the file is memory).
//! Unmap by fallocate(PUNCH_HOLE) and mapping status by SEEK_DATA/SEEK_HOLE, on the pool.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use rustix::fs::{FallocateFlags, OFlags, SeekFrom};

use crate::pool::{BlockingPool, DEFAULT_LIMIT};
use crate::uring::{ring_for, Ring};
use crate::{check_range, Backend, IoMode, MapRun};

/// Index of the image file among the ring's registered files.
const IMAGE: u32 = 0;

/// A device image stored in a (normally sparse) regular file.
pub struct FileBackend {
    path: PathBuf,
    /// The capacity: the file's length as opened, or as [`Backend::resize`] set it.
    size: AtomicU64,
    file: Arc<File>,
    /// Same file opened with O_DSYNC: a write on it is durable when it returns (FUA). Only
    /// without a ring (which writes FUA with RWF_DSYNC).
    dsync: Option<Arc<File>>,
    ring: Option<Ring>,
    pool: BlockingPool,
    punch_works: bool,
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
        let ctx = |e: io::Error, what: &str| {
            io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
        };
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
        let mut opts = OpenOptions::new();
        opts.read(true)
            .write(!read_only)
            .create(create && !read_only);
        let file = opts.open(path).map_err(|e| ctx(e, "cannot open"))?;
        let current = file.metadata().map_err(|e| ctx(e, "cannot stat"))?.len();
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
            file.set_len(size).map_err(|e| ctx(e, "cannot extend"))?;
        }
        let ring = ring_for(io, &[&file], path);
        let dsync = match ring {
            Some(_) => None,
            None => Some(Arc::new(
                OpenOptions::new()
                    .read(true)
                    .write(!read_only)
                    .custom_flags(OFlags::DSYNC.bits() as i32)
                    .open(path)
                    .map_err(|e| ctx(e, "cannot open (O_DSYNC)"))?,
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
            ring,
            pool: BlockingPool::new(DEFAULT_LIMIT),
            punch_works,
            in_place: AtomicU8::new(in_place as u8),
        })
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
}

/// Checks whether the filesystem supports hole punching, by punching the last byte of
/// the image when that byte is zero (so no data can be lost). When it is not zero we
/// assume support; a failing punch later falls back to writing zeroes.
fn probe_punch(file: &File, size: u64) -> bool {
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
            Ok(0) => break, // past end of file: the rest stays zero
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
            Ok(0) => break, // past end of file: the rest stays zero
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf.freeze())
}

/// Deallocate a range (PUNCH_HOLE, which reads back as zeroes on files and is a discard on
/// block devices); where punching is not tried or fails, write zeroes instead.
pub(crate) fn punch_or_write_zeroes(
    file: &File,
    offset: u64,
    len: u64,
    try_punch: bool,
) -> io::Result<()> {
    let punched = try_punch
        && rustix::fs::fallocate(
            file,
            FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
            offset,
            len,
        )
        .is_ok();
    if punched {
        return Ok(());
    }
    write_zeroes_by_writing(file, offset, len)
}

pub(crate) fn write_zeroes_by_writing(file: &File, offset: u64, len: u64) -> io::Result<()> {
    const STEP: u64 = 1 << 20;
    let zeroes = vec![0u8; STEP.min(len) as usize];
    let mut done = 0;
    while done < len {
        let n = STEP.min(len - done) as usize;
        file.write_all_at(&zeroes[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
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
        self.punch_works
    }

    async fn read_at(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        check_range(self.size(), offset, len as u64)?;
        // A page-cache hit costs a memcpy; handing it to a blocking thread costs more than
        // that. RWF_NOWAIT never sleeps: a miss goes to the pool. (A ring serves a hit inside
        // its submit call already.)
        match self.in_place.load(Ordering::Relaxed) {
            m if m == InPlace::Memory as u8 => return read_exact(&self.file, offset, len),
            _ if self.ring.is_some() => {}
            m if m == InPlace::NoWait as u8 => match read_cached(&self.file, offset, len) {
                Ok(Some(data)) => return Ok(data),
                Ok(None) => {}
                Err(_) => self.in_place.store(InPlace::Never as u8, Ordering::Relaxed),
            },
            _ => {}
        }
        if let Some(ring) = &self.ring {
            return ring.read(IMAGE, offset, len, 1).await;
        }
        let file = self.file.clone();
        self.pool.run(move || read_exact(&file, offset, len)).await
    }

    async fn write_at(&self, offset: u64, data: Bytes, fua: bool) -> io::Result<()> {
        check_range(self.size(), offset, data.len() as u64)?;
        if let Some(ring) = &self.ring {
            return ring.write(IMAGE, offset, data, fua).await;
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
        if let Some(ring) = &self.ring {
            return ring.fdatasync(IMAGE).await;
        }
        let file = self.file.clone();
        self.pool.run(move || file.sync_data()).await
    }

    async fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let file = self.file.clone();
        let try_punch = self.punch_works;
        self.pool
            .run(move || punch_or_write_zeroes(&file, offset, len, try_punch))
            .await
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len)?;
        let file = self.file.clone();
        self.pool
            .run(move || write_zeroes_by_writing(&file, offset, len))
            .await
    }

    async fn map_status(&self, offset: u64, len: u64) -> io::Result<MapRun> {
        check_range(self.size(), offset, len)?;
        let file = self.file.clone();
        self.pool
            .run(move || seek_map_status(&file, offset, len))
            .await
    }
}
