//! The FUSE file system of `ironsan mount`: a root directory holding one regular file per
//! LUN, each of the LUN's size. The glue is thin: every read, write, fsync and fallocate
//! becomes a task on the initiator's runtime calling [`lun_io::Lun`] (the shared crate that
//! cuts byte ranges into SCSI commands), and the FUSE reply is sent from that task when the
//! target has answered. The dispatch thread never waits for the network, so as many
//! requests are in flight as the kernel sends (`max_background`, async direct I/O) and the
//! session's CmdSN window admits.
//!
//! [`Layout`] (names, inode numbers, attributes, range clamping) is plain data with unit
//! tests; [`LunFs`] is the `fuser::Filesystem` over it.

use std::ffi::OsStr;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, WriteFlags,
};
use lun_io::{IoError, Lun};

/// How long the kernel may cache names and attributes (a LUN's size does not change while
/// mounted; a short time still picks up a resize after a remount).
const TTL: Duration = Duration::from_secs(1);
/// Largest read or write the kernel sends in one request (its limit is 256 pages).
pub const MAX_IO: u32 = 1 << 20;
/// `fallocate` zeroes at most this much per `Lun::write_zeroes` call.
const ZERO_CHUNK: u64 = 1 << 30;

/// One LUN as a file.
#[derive(Debug, Clone)]
pub struct LunFile {
    pub name: String,
    pub size: u64,
    pub block_size: u32,
    pub read_only: bool,
}

/// The directory: inode 1 is the root, inode 2 + i the i-th file.
pub struct Layout {
    pub files: Vec<LunFile>,
    pub uid: u32,
    pub gid: u32,
    pub mounted_at: SystemTime,
}

impl Layout {
    pub fn file(&self, ino: INodeNo) -> Option<&LunFile> {
        let i = ino.0.checked_sub(2)?;
        self.files.get(usize::try_from(i).ok()?)
    }

    pub fn lookup(&self, name: &OsStr) -> Option<INodeNo> {
        let i = self
            .files
            .iter()
            .position(|f| OsStr::new(&f.name) == name)?;
        Some(INodeNo(i as u64 + 2))
    }

    pub fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let t = self.mounted_at;
        let mut a = FileAttr {
            ino,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: FileType::Directory,
            perm: 0o755,
            nlink: 2,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        };
        if ino == INodeNo::ROOT {
            return Some(a);
        }
        let f = self.file(ino)?;
        a.kind = FileType::RegularFile;
        a.perm = if f.read_only { 0o444 } else { 0o644 };
        a.nlink = 1;
        a.size = f.size;
        a.blocks = f.size.div_ceil(512);
        a.blksize = f.block_size.max(512);
        Some(a)
    }

    /// Directory entries from `offset` on: (inode, next offset, kind, name).
    pub fn entries(&self, offset: u64) -> Vec<(INodeNo, u64, FileType, String)> {
        let mut all = vec![
            (INodeNo::ROOT, FileType::Directory, ".".to_string()),
            (INodeNo::ROOT, FileType::Directory, "..".to_string()),
        ];
        for (i, f) in self.files.iter().enumerate() {
            all.push((INodeNo(i as u64 + 2), FileType::RegularFile, f.name.clone()));
        }
        all.into_iter()
            .enumerate()
            .skip(offset as usize)
            .map(|(i, (ino, kind, name))| (ino, i as u64 + 1, kind, name))
            .collect()
    }
}

/// The part of `[offset, offset + len)` inside a file of `size` bytes (`None`: none of it).
pub fn clamp(offset: u64, len: u64, size: u64) -> Option<(u64, u64)> {
    if offset >= size || len == 0 {
        return None;
    }
    Some((offset, len.min(size - offset)))
}

/// The file system handed to fuser.
pub struct LunFs {
    layout: Layout,
    /// The LUN of each file of the layout, in its order.
    luns: Vec<Arc<Lun>>,
    rt: tokio::runtime::Handle,
    io_timeout: Duration,
    max_background: u16,
}

impl LunFs {
    pub fn new(
        layout: Layout,
        luns: Vec<Arc<Lun>>,
        rt: tokio::runtime::Handle,
        io_timeout: Duration,
        max_background: u16,
    ) -> LunFs {
        LunFs {
            layout,
            luns,
            rt,
            io_timeout,
            max_background: max_background.max(16),
        }
    }

    /// The file of `ino` with its LUN, or the errno to answer.
    fn lun_file(&self, ino: INodeNo) -> Result<(&LunFile, Arc<Lun>), Errno> {
        match self.layout.file(ino) {
            Some(f) => Ok((f, self.luns[(ino.0 - 2) as usize].clone())),
            None if ino == INodeNo::ROOT => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    /// Runs `op` on the runtime, bounded by the I/O timeout, and gives `reply` its result.
    fn spawn<T, F>(
        &self,
        what: String,
        op: F,
        reply: impl FnOnce(Result<T, Errno>) + Send + 'static,
    ) where
        T: Send + 'static,
        F: Future<Output = Result<T, IoError>> + Send + 'static,
    {
        let limit = self.io_timeout;
        self.rt.spawn(async move {
            let r = match tokio::time::timeout(limit, op).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => {
                    tracing::warn!("{what}: {e}");
                    Err(Errno::from_i32(e.errno as i32))
                }
                Err(_) => {
                    // The commands may still complete later; the caller is told the
                    // range's state is unknown, as a disk's timeout would.
                    tracing::warn!("{what}: no answer within {limit:?} (--io-timeout): EIO");
                    Err(Errno::EIO)
                }
            };
            reply(r);
        });
    }
}

impl Filesystem for LunFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Asynchronous direct I/O: a loop device with --direct-io=on (and aio users) keep
        // many requests in flight instead of one at a time.
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO) {
            tracing::info!("the kernel lacks {missing:?}: direct I/O runs one request at a time");
        }
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_background(self.max_background);
        let _ = config.set_congestion_threshold(self.max_background / 4 * 3);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        match self.layout.lookup(name).and_then(|i| self.layout.attr(i)) {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.layout.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(a) = self.layout.attr(ino) else {
            return reply.error(Errno::ENOENT);
        };
        // A LUN's size is fixed: truncation (O_TRUNC, `dd` without conv=notrunc) is refused;
        // times, modes and owners are accepted and not kept.
        if size.is_some_and(|s| s != a.size) {
            return reply.error(Errno::EPERM);
        }
        reply.attr(&TTL, &a)
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let f = match self.lun_file(ino) {
            Ok((f, _)) => f,
            Err(e) => return reply.error(e),
        };
        if f.read_only && flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        // O_DIRECT bypasses the page cache all the way to the LUN (what `losetup
        // --direct-io=on` asks for); other opens read through the page cache, which the
        // kernel drops at each open, and write through it (every write is sent and
        // answered before write(2) returns).
        let fopen = if flags.0 & libc::O_DIRECT != 0 {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        };
        reply.opened(FileHandle(0), fopen);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let (f, lun) = match self.lun_file(ino) {
            Ok(v) => v,
            Err(e) => return reply.error(e),
        };
        let Some((offset, len)) = clamp(offset, size as u64, f.size) else {
            return reply.data(&[]);
        };
        let what = format!("read of {len} bytes at {offset} of {}", f.name);
        self.spawn(
            what,
            async move { lun.read(offset, len as u32).await },
            move |r| match r {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(e),
            },
        );
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let (f, lun) = match self.lun_file(ino) {
            Ok(v) => v,
            Err(e) => return reply.error(e),
        };
        if f.read_only {
            return reply.error(Errno::EROFS);
        }
        let Some((offset, len)) = clamp(offset, data.len() as u64, f.size) else {
            return reply.error(if data.is_empty() {
                Errno::EINVAL
            } else {
                Errno::ENOSPC
            });
        };
        // The one copy: fuser reuses its request buffer once this returns.
        let data = Bytes::copy_from_slice(&data[..len as usize]);
        let what = format!("write of {len} bytes at {offset} of {}", f.name);
        self.spawn(
            what,
            async move { lun.write(offset, data, false).await },
            move |r| match r {
                Ok(()) => reply.written(len as u32),
                Err(e) => reply.error(e),
            },
        );
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2): every write was answered after the target's GOOD; nothing is held here.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let (f, lun) = match self.lun_file(ino) {
            Ok(v) => v,
            Err(e) => return reply.error(e),
        };
        let what = format!("fsync of {} (SYNCHRONIZE CACHE)", f.name);
        self.spawn(what, async move { lun.flush().await }, move |r| match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        });
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let (f, lun) = match self.lun_file(ino) {
            Ok(v) => v,
            Err(e) => return reply.error(e),
        };
        let known =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let end = offset.saturating_add(length);
        let zero = mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0;
        if end > f.size && mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
            // Growing the file would grow the LUN.
            return reply.error(Errno::EFBIG);
        }
        if !zero {
            // Preallocation: every block of a LUN exists already.
            return reply.ok();
        }
        if f.read_only {
            return reply.error(Errno::EROFS);
        }
        // Punched holes and zeroed ranges read back as zeros: WRITE SAME of a zero block
        // (written zeros where the target refuses it).
        let Some((offset, len)) = clamp(offset, length, f.size) else {
            return reply.ok();
        };
        let what = format!("zeroing {len} bytes at {offset} of {}", f.name);
        self.spawn(
            what,
            async move {
                let mut at = offset;
                while at < offset + len {
                    let n = ZERO_CHUNK.min(offset + len - at);
                    lun.write_zeroes(at, n as u32, false).await?;
                    at += n;
                }
                Ok(())
            },
            move |r| match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            },
        );
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino == INodeNo::ROOT {
            reply.opened(FileHandle(0), FopenFlags::empty());
        } else {
            reply.error(Errno::ENOTDIR);
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        for (ino, next, kind, name) in self.layout.entries(offset) {
            if reply.add(ino, next, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    // No extended attributes: ENOSYS tells the kernel to stop asking (fuser's defaults
    // answer the same, with a warning per call).
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bytes: u64 = self.layout.files.iter().map(|f| f.size).sum();
        let files = self.layout.files.len() as u64 + 1;
        reply.statfs(bytes / 4096, 0, 0, files, 0, 4096, 255, 4096);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamps_ranges_to_the_file() {
        assert_eq!(clamp(0, 10, 100), Some((0, 10)));
        assert_eq!(clamp(95, 10, 100), Some((95, 5)));
        assert_eq!(clamp(100, 10, 100), None);
        assert_eq!(clamp(1000, 10, 100), None);
        assert_eq!(clamp(5, 0, 100), None);
        assert_eq!(clamp(u64::MAX - 1, 10, u64::MAX), Some((u64::MAX - 1, 1)));
    }

    #[test]
    fn empty_layout_has_a_root_only() {
        let l = Layout {
            files: Vec::new(),
            uid: 1,
            gid: 2,
            mounted_at: SystemTime::UNIX_EPOCH,
        };
        let root = l.attr(INodeNo::ROOT).unwrap();
        assert_eq!(root.kind, FileType::Directory);
        assert_eq!((root.uid, root.gid), (1, 2));
        assert!(l.attr(INodeNo(2)).is_none());
        assert!(l.file(INodeNo(0)).is_none());
        assert!(l.lookup(OsStr::new("lun0")).is_none());
        let names: Vec<String> = l.entries(0).into_iter().map(|e| e.3).collect();
        assert_eq!(names, [".", ".."]);
        assert!(l.entries(2).is_empty());
        // Offsets resume after the entry they name.
        assert_eq!(l.entries(1)[0].1, 2);
    }

    #[test]
    fn files_by_name_and_inode() {
        let f = |name: &str, size, read_only| LunFile {
            name: name.into(),
            size,
            block_size: 512,
            read_only,
        };
        let l = Layout {
            files: vec![f("lun0", 1 << 20, false), f("lun3", 1000, true)],
            uid: 0,
            gid: 0,
            mounted_at: SystemTime::UNIX_EPOCH,
        };
        let ino = l.lookup(OsStr::new("lun3")).unwrap();
        assert_eq!(ino, INodeNo(3));
        let a = l.attr(ino).unwrap();
        assert_eq!(
            (a.kind, a.size, a.perm, a.blocks),
            (FileType::RegularFile, 1000, 0o444, 2)
        );
        assert_eq!(l.attr(INodeNo(2)).unwrap().perm, 0o644);
        assert!(l.attr(INodeNo(4)).is_none());
        let all = l.entries(0);
        assert_eq!(all.len(), 4);
        assert_eq!(
            (all[3].0, all[3].1, all[3].3.as_str()),
            (INodeNo(3), 4, "lun3")
        );
        assert_eq!(l.entries(3).len(), 1);
    }
}
