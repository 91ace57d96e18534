//! Faults under a running backend: a backing file truncated under the LUN, an errno that
//! says the device is gone.

use std::io;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::{Backend, BlockBackend, FileBackend, IoMode};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap()
}

const MIB: u64 = 1 << 20;

/// Writes, truncates the backing file to 2 MiB under `b`, and checks that reads past the
/// new end fail (never zeroes as data), reads before it still work, and `other` (another
/// backend) is untouched.
async fn truncate_under(b: Arc<dyn Backend>, path: &Path, other: &Arc<dyn Backend>) {
    let data = Bytes::from(vec![0x5Au8; 65536]);
    b.write_at(MIB, data.clone(), false).await.unwrap();
    b.write_at(3 * MIB, data.clone(), false).await.unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(2 * MIB)
        .unwrap();
    for (at, len) in [(3 * MIB, 65536), (2 * MIB - 4096, 8192), (2 * MIB, 512)] {
        let err = b.read_at(at, len).await.unwrap_err();
        assert_eq!(
            err.kind(),
            io::ErrorKind::UnexpectedEof,
            "{at}+{len}: {err}"
        );
    }
    // Twice: the first failure changed nothing about how the next read is done.
    for _ in 0..2 {
        assert_eq!(b.read_at(MIB, 65536).await.unwrap(), data);
        assert!(b.read_at(3 * MIB, 4096).await.is_err());
    }
    other.write_at(MIB, data.clone(), true).await.unwrap();
    assert_eq!(other.read_at(MIB, 65536).await.unwrap(), data);
    other.flush().await.unwrap();
    // A write past the end grows the file again; what it wrote reads back.
    b.write_at(3 * MIB, data.clone(), false).await.unwrap();
    assert_eq!(b.read_at(3 * MIB, 65536).await.unwrap(), data);
}

fn dir(tag: &str, base: &Path) -> std::path::PathBuf {
    let d = base.join(format!("ironsan-fault-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A file LUN (on disk and on tmpfs) and a block LUN on a file, in both I/O modes, whose
/// backing file is truncated while they run.
#[test]
fn a_truncated_backing_file_fails_reads_past_its_new_end() {
    let mut bases = vec![std::env::temp_dir()];
    if Path::new("/dev/shm").is_dir() {
        bases.push("/dev/shm".into());
    }
    for base in bases {
        for mode in [IoMode::Uring, IoMode::Threads] {
            let d = dir(&format!("{mode:?}"), &base);
            let other: Arc<dyn Backend> = Arc::new(
                FileBackend::open_with(&d.join("other"), Some(4 * MIB), true, false, mode).unwrap(),
            );
            let path = d.join("img");
            let file = FileBackend::open_with(&path, Some(4 * MIB), true, false, mode).unwrap();
            rt().block_on(truncate_under(Arc::new(file), &path, &other));
            let path = d.join("dev");
            std::fs::File::create(&path)
                .unwrap()
                .set_len(4 * MIB)
                .unwrap();
            let blk = BlockBackend::open_with(&path, None, false, mode).unwrap();
            rt().block_on(truncate_under(Arc::new(blk), &path, &other));
            std::fs::remove_dir_all(&d).unwrap();
        }
    }
}

#[test]
fn enodev_and_enxio_say_the_device_is_gone_and_eio_does_not() {
    let os = io::Error::from_raw_os_error;
    assert!(crate::device_gone(&os(
        rustix::io::Errno::NODEV.raw_os_error()
    )));
    assert!(crate::device_gone(&os(
        rustix::io::Errno::NXIO.raw_os_error()
    )));
    assert!(!crate::device_gone(&os(
        rustix::io::Errno::IO.raw_os_error()
    )));
    assert!(!crate::device_gone(&io::Error::other("x")));
}

/// A file LUN opened `direct`, in both modes, on disk and on tmpfs (which may refuse
/// O_DIRECT: then it is buffered): the backend script (aligned and unaligned requests),
/// aligned and unaligned transfers over the same bytes agreeing both ways, and a
/// truncated file failing a direct read.
#[test]
fn a_direct_file_lun_mixes_aligned_and_unaligned_requests_coherently() {
    let mut bases = vec![std::env::temp_dir()];
    if Path::new("/dev/shm").is_dir() {
        bases.push("/dev/shm".into());
    }
    for base in bases {
        for mode in [IoMode::Uring, IoMode::Threads] {
            let d = dir(&format!("direct-{mode:?}"), &base);
            let path = d.join("img");
            let b = Arc::new(
                FileBackend::open_direct(&path, Some(4 * MIB), true, false, mode, true).unwrap(),
            );
            if base == std::env::temp_dir() {
                assert!(b.is_direct(), "O_DIRECT on {}", base.display());
            }
            rt().block_on(async {
                crate::tests::script(b.clone()).await;
                let a = Bytes::from(vec![0xA1u8; 65536]);
                b.write_at(MIB, a.clone(), true).await.unwrap(); // direct
                let r = b.read_at(MIB + 512, 4096).await.unwrap(); // buffered
                assert!(r.iter().all(|&x| x == 0xA1));
                b.write_at(MIB + 1000, Bytes::from(vec![0xB2u8; 100]), false)
                    .await
                    .unwrap(); // buffered
                let r = b.read_at(MIB, 4096).await.unwrap(); // direct
                assert!(r[..1000].iter().all(|&x| x == 0xA1));
                assert!(r[1000..1100].iter().all(|&x| x == 0xB2));
                assert!(r[1100..].iter().all(|&x| x == 0xA1));
                b.flush().await.unwrap();
            });
            let other: Arc<dyn Backend> = Arc::new(
                FileBackend::open_with(&d.join("other"), Some(4 * MIB), true, false, mode).unwrap(),
            );
            let b = FileBackend::open_direct(&path, None, false, false, mode, true).unwrap();
            rt().block_on(truncate_under(Arc::new(b), &path, &other));
            std::fs::remove_dir_all(&d).unwrap();
        }
    }
}
