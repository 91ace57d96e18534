//! Deallocating and zeroing ranges for the file and block backends, by fallocate: through
//! the backend's ring (IORING_OP_FALLOCATE) when it has one, else on its blocking pool.
//!
//! - Punch (UNMAP, WRITE SAME with UNMAP): `PUNCH_HOLE | KEEP_SIZE`. On a file the range
//!   becomes a hole; on a block device the kernel zeroes it without writing zeroes itself
//!   (REQ_OP_WRITE_ZEROES, which the device may do by deallocating), or fails where the
//!   device cannot. Either way the range reads back as zeroes, which LBPRZ promises; a
//!   plain discard (BLKDISCARD) would not, so it is not used.
//! - Zeroing (WRITE SAME of zeroes): `ZERO_RANGE | KEEP_SIZE`: on a file, unwritten extents
//!   in place of written zeroes; on a block device, BLKZEROOUT's zeroing.
//!
//! Where the kernel refuses (a file system without the operation: tmpfs has no
//! ZERO_RANGE) the zeroes are written instead; a refusal with EOPNOTSUPP is remembered, so
//! later calls write at once.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustix::fs::FallocateFlags;

use crate::pool::BlockingPool;
use crate::uring::Ring;

/// A backend's punching and zeroing: which fallocate modes are still worth trying.
pub(crate) struct Alloc {
    /// Whether punching is tried at all (probed when the backend opened).
    punch: AtomicBool,
    /// Cleared once ZERO_RANGE was refused as unsupported.
    zero_range: AtomicBool,
}

/// Where one operation runs: the backend's ring (and the file's index there) or its pool.
pub(crate) struct Via<'a> {
    pub(crate) ring: Option<&'a Ring>,
    /// The file's index among the ring's registered files.
    pub(crate) index: u32,
    pub(crate) pool: &'a BlockingPool,
    pub(crate) file: &'a Arc<File>,
}

impl Alloc {
    pub(crate) fn new(punch: bool) -> Alloc {
        Alloc {
            punch: AtomicBool::new(punch),
            zero_range: AtomicBool::new(true),
        }
    }

    /// True when a punch deallocates (else it writes zeroes).
    pub(crate) fn punches(&self) -> bool {
        self.punch.load(Ordering::Relaxed)
    }

    /// Deallocates `offset..offset+len` (it reads back as zeroes); zeroes it where that
    /// fails.
    pub(crate) async fn punch(&self, via: Via<'_>, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        if self.punches() {
            let mode = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
            if fallocate(&via, mode, offset, len).await.is_ok() {
                return Ok(());
            }
        }
        self.zero(via, offset, len).await
    }

    /// Zeroes `offset..offset+len`, keeping it allocated.
    pub(crate) async fn zero(&self, via: Via<'_>, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        if self.zero_range.load(Ordering::Relaxed) {
            let mode = FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE;
            match fallocate(&via, mode, offset, len).await {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::OPNOTSUPP.raw_os_error()) => {
                    self.zero_range.store(false, Ordering::Relaxed);
                }
                Err(_) => {} // (an unaligned range on a block device): written below
            }
        }
        let file = via.file.clone();
        via.pool
            .run(move || write_zeroes_by_writing(&file, offset, len))
            .await
    }
}

async fn fallocate(via: &Via<'_>, mode: FallocateFlags, offset: u64, len: u64) -> io::Result<()> {
    if let Some(ring) = via.ring {
        return ring
            .fallocate(via.index, mode.bits() as i32, offset, len)
            .await;
    }
    let file = via.file.clone();
    via.pool
        .run(move || Ok(rustix::fs::fallocate(&*file, mode, offset, len)?))
        .await
}

/// Whether punching a block device zeroes without writing: its queue takes write-zeroes
/// requests (`write_zeroes_max_bytes` in sysfs; a partition's is its disk's). `None` for
/// anything that is not a block device.
pub(crate) fn device_punches(file: &File) -> Option<bool> {
    let dir = block_queue(file)?;
    Some(read_number(&dir.join("write_zeroes_max_bytes")).unwrap_or(0) > 0)
}

/// The discard granularity of a block device in bytes (0: unknown, or not a block device).
pub(crate) fn discard_granularity(file: &File) -> u64 {
    block_queue(file)
        .and_then(|dir| read_number(&dir.join("discard_granularity")))
        .unwrap_or(0)
}

/// The sysfs queue directory of the block device `file` is.
fn block_queue(file: &File) -> Option<std::path::PathBuf> {
    let st = rustix::fs::fstat(file).ok()?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::BlockDevice {
        return None;
    }
    let rdev = st.st_rdev;
    let dev = Path::new("/sys/dev/block").join(format!(
        "{}:{}",
        rustix::fs::major(rdev),
        rustix::fs::minor(rdev)
    ));
    // A partition has no queue of its own: its disk's is one level up.
    [dev.join("queue"), dev.join("../queue")]
        .into_iter()
        .find(|q| q.is_dir())
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Zeroes `len` bytes at `offset` by writing them, a MiB at a time: where the file system
/// cannot zero a range itself.
fn write_zeroes_by_writing(file: &File, offset: u64, len: u64) -> io::Result<()> {
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use crate::{Backend, BlockBackend, FileBackend, IoMode};

    const MIB: u64 = 1 << 20;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap()
    }

    /// Zeroing and punching (aligned and not) read back as zeroes and leave the bytes
    /// around them alone.
    async fn zero_and_punch(b: &dyn Backend) {
        let data: Vec<u8> = (0..2 * MIB).map(|i| (i % 251) as u8 + 1).collect();
        let base = MIB / 2;
        b.write_at(base, Bytes::from(data.clone()), false)
            .await
            .unwrap();
        // Apart from each other: the bytes around each range are still the data.
        let cases = [
            (MIB, 65536, false),
            (MIB + 262_144, 4096, true),
            (MIB + 500_000, 3000, true),
            (MIB + 700_001, 5000, false),
        ];
        for (at, len, punch) in cases {
            if punch {
                b.punch(at, len).await.unwrap();
            } else {
                b.write_zeroes(at, len).await.unwrap();
            }
            let back = b.read_at(base, data.len()).await.unwrap();
            let (s, e) = ((at - base) as usize, (at - base + len) as usize);
            assert!(
                back[s..e].iter().all(|&x| x == 0),
                "{at}+{len} punch {punch}"
            );
            assert!(back[e..e + 4096] == data[e..e + 4096], "after {at}+{len}");
            assert!(back[s - 4096..s] == data[s - 4096..s], "before {at}+{len}");
        }
        b.flush().await.unwrap();
    }

    #[test]
    fn files_and_block_backends_on_files_zero_and_punch_in_both_modes() {
        for base in [std::env::temp_dir(), "/dev/shm".into()] {
            if !base.is_dir() {
                continue;
            }
            for mode in [IoMode::Uring, IoMode::Threads] {
                let path = base.join(format!("ironsan-alloc-{}-{mode:?}", std::process::id()));
                let _ = std::fs::remove_file(&path);
                let f = FileBackend::open_with(&path, Some(4 * MIB), true, false, mode).unwrap();
                assert!(f.supports_punch(), "{}", path.display());
                rt().block_on(zero_and_punch(&f));
                // A punched range of a file is a hole again.
                rt().block_on(async {
                    f.punch(2 * MIB, MIB).await.unwrap();
                    assert!(!f.map_status(2 * MIB, MIB).await.unwrap().mapped);
                });
                drop(f);
                let b = BlockBackend::open_with(&path, None, false, mode).unwrap();
                assert!(b.supports_punch());
                assert_eq!(b.punch_granularity(), 0, "not a block device");
                rt().block_on(zero_and_punch(&b));
                std::fs::remove_file(&path).unwrap();
            }
        }
    }

    /// A loop device over a file (where this test may set one up: root, losetup): unmap is
    /// offered when its queue takes write-zeroes requests, its discard granularity is
    /// reported, and zeroing and punching work in both modes.
    #[test]
    fn a_loop_device_zeroes_and_punches() {
        let path = std::env::temp_dir().join(format!("ironsan-alloc-loop-{}", std::process::id()));
        std::fs::File::create(&path)
            .unwrap()
            .set_len(8 * MIB)
            .unwrap();
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&path)
            .output();
        let dev = match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
            _ => {
                eprintln!("SKIP: no loop device here");
                let _ = std::fs::remove_file(&path);
                return;
            }
        };
        struct Detach(String, std::path::PathBuf);
        impl Drop for Detach {
            fn drop(&mut self) {
                let _ = std::process::Command::new("losetup")
                    .args(["-d", &self.0])
                    .status();
                let _ = std::fs::remove_file(&self.1);
            }
        }
        let _detach = Detach(dev.clone(), path);
        let name = dev.trim_start_matches("/dev/");
        let queue = std::path::Path::new("/sys/block").join(name).join("queue");
        let number = |f: &str| super::read_number(&queue.join(f)).unwrap_or(0);
        for mode in [IoMode::Uring, IoMode::Threads] {
            let b = BlockBackend::open_with(std::path::Path::new(&dev), None, false, mode).unwrap();
            assert_eq!(b.supports_punch(), number("write_zeroes_max_bytes") > 0);
            assert_eq!(b.punch_granularity(), number("discard_granularity"));
            rt().block_on(zero_and_punch(&b));
        }
    }
}
