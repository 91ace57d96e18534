use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;

use super::*;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap()
}

/// Exercises one backend against a plain Vec model with a fixed script.
pub(crate) async fn script(b: Arc<dyn Backend>) {
    let size = b.size();
    assert_eq!(&b.read_at(0, 4096).await.unwrap()[..], &[0u8; 4096][..]);
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    b.write_at(70_000, Bytes::from(data.clone()), false)
        .await
        .unwrap();
    assert_eq!(&b.read_at(70_000, data.len()).await.unwrap()[..], &data[..]);
    b.write_at(size - 512, Bytes::from(vec![7u8; 512]), true)
        .await
        .unwrap();
    assert_eq!(
        &b.read_at(size - 512, 512).await.unwrap()[..],
        &[7u8; 512][..]
    );
    b.flush().await.unwrap();
    b.punch(70_000 + 4096, 8192).await.unwrap();
    let back = b.read_at(70_000, data.len()).await.unwrap();
    assert_eq!(&back[..4096], &data[..4096]);
    assert!(back[4096..4096 + 8192].iter().all(|&x| x == 0));
    assert_eq!(&back[12288..], &data[12288..]);
    b.write_zeroes(70_000, 100).await.unwrap();
    assert!(b
        .read_at(70_000, 100)
        .await
        .unwrap()
        .iter()
        .all(|&x| x == 0));
    assert!(
        b.read_at(size - 1, 2).await.is_err(),
        "read past end must fail"
    );
    assert!(b
        .write_at(u64::MAX - 1, Bytes::from_static(b"ab"), false)
        .await
        .is_err());
}

#[test]
fn memory_backend_script() {
    rt().block_on(script(Arc::new(MemoryBackend::new(4 << 20))));
}

/// Grown, a device reads zeroes past its old end; shrunk and grown again, zeroes where it
/// was cut (a RAM device's last chunk included), while what stayed keeps its data.
async fn resize_script(b: Arc<dyn Backend>, start: u64) {
    let data = Bytes::from(vec![0xA5u8; 8192]);
    b.write_at(start - 8192, data.clone(), false).await.unwrap();
    b.resize(start * 2).unwrap();
    assert_eq!(b.size(), start * 2);
    assert_eq!(b.read_at(start - 8192, 8192).await.unwrap(), data);
    assert!(b
        .read_at(start, 8192)
        .await
        .unwrap()
        .iter()
        .all(|&x| x == 0));
    b.write_at(start, data.clone(), false).await.unwrap();
    b.resize(start - 4096).unwrap();
    assert!(b.read_at(start - 4096, 4096).await.is_err(), "past the end");
    b.resize(start * 2).unwrap();
    let back = b.read_at(start - 8192, 16384).await.unwrap();
    assert!(back[..4096].iter().all(|&x| x == 0xA5), "kept");
    assert!(back[4096..].iter().all(|&x| x == 0), "cut off: zeroes");
}

#[test]
fn memory_and_file_backends_resize() {
    // 100 KiB + 4 KiB: the last 64 KiB chunk is partial.
    let start = 104 << 10;
    rt().block_on(resize_script(Arc::new(MemoryBackend::new(start)), start));
    let small = MemoryBackend::new(1 << 20);
    let e = small.resize(1 << 30).unwrap_err().to_string();
    assert!(e.contains("times 4"), "{e}");
    let dir = temp_dir("storage-resize");
    let path = dir.join("img");
    let _ = std::fs::remove_file(&path);
    let f = Arc::new(FileBackend::open(&path, Some(start), true, false).unwrap());
    rt().block_on(resize_script(f, start));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), start * 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Both I/O paths, the one io_uring setup gives on this kernel checked against `io_mode`.
const MODES: [IoMode; 2] = [IoMode::Uring, IoMode::Threads];

/// True when a ring can be set up here (a kernel or sandbox may refuse io_uring).
fn uring_works() -> bool {
    let f = std::fs::File::open("/proc/self/exe").unwrap();
    crate::uring::Ring::new(&[&f]).is_ok()
}

/// The mode a backend opened with `mode` must report.
fn expected(mode: IoMode) -> IoMode {
    match mode {
        IoMode::Uring if uring_works() => IoMode::Uring,
        _ => IoMode::Threads,
    }
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ironsan-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn file_backend_script_and_holes() {
    for mode in MODES {
        let dir = temp_dir(&format!("storage-{mode:?}"));
        let path = dir.join("img");
        let _ = std::fs::remove_file(&path);
        let b = Arc::new(FileBackend::open_with(&path, Some(4 << 20), true, false, mode).unwrap());
        assert_eq!(b.io_mode(), expected(mode));
        rt().block_on(async {
            script(b.clone()).await;
            // A fresh region of a sparse file is a hole; a written one is data.
            let run = b.map_status(2 << 20, 1 << 20).await.unwrap();
            assert!(!run.mapped || !b.supports_punch());
            b.write_at(2 << 20, Bytes::from(vec![1u8; 65536]), false)
                .await
                .unwrap();
            let run = b.map_status(2 << 20, 1 << 20).await.unwrap();
            assert!(run.mapped);
            if b.supports_punch() {
                b.punch(2 << 20, 65536).await.unwrap();
                assert!(!b.map_status(2 << 20, 65536).await.unwrap().mapped);
            }
        });
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn file_backend_open_errors_are_clear() {
    let err = FileBackend::open(
        Path::new("/nonexistent/dir/img"),
        Some(1 << 20),
        false,
        false,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("does not exist"), "{err}");
}

#[test]
fn block_backend_script_on_a_file() {
    for mode in MODES {
        let dir = temp_dir(&format!("block-{mode:?}"));
        let path = dir.join("dev");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(4 << 20)
            .unwrap();
        let b = Arc::new(BlockBackend::open_with(&path, None, false, mode).unwrap());
        assert_eq!(b.size(), 4 << 20);
        assert_eq!(b.io_mode(), expected(mode));
        rt().block_on(async {
            script(b.clone()).await;
            // Aligned (O_DIRECT) and unaligned paths see the same bytes.
            let data = Bytes::from((0..8192u32).map(|i| (i * 7) as u8).collect::<Vec<_>>());
            b.write_at(8192, data.clone(), false).await.unwrap();
            assert_eq!(b.read_at(8192, 8192).await.unwrap(), data);
            assert_eq!(
                &b.read_at(8192 + 100, 50).await.unwrap()[..],
                &data[100..150]
            );
            // Misaligned memory on the O_DIRECT path, FUA too.
            b.write_at(16384, data.slice(1..4097), true).await.unwrap();
            assert_eq!(b.read_at(16384, 4096).await.unwrap(), data.slice(1..4097));
        });
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

use std::path::Path;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// The memory backend behaves like a flat zero-initialised array.
    #[test]
    fn memory_matches_model(ops in proptest::collection::vec((0u64..300_000, 1usize..70_000, any::<u8>(), 0u8..3), 1..20), lent_image in any::<bool>()) {
        let size = 400_000u64;
        let b = if lent_image {
            MemoryBackend::with_image(TestImage::new(size as usize))
        } else {
            MemoryBackend::new(size)
        };
        let mut model = vec![0u8; size as usize];
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            for (off, len, val, op) in ops {
                let len = len.min((size - off) as usize);
                match op {
                    0 => {
                        b.write_at(off, Bytes::from(vec![val; len]), false).await.unwrap();
                        model[off as usize..off as usize + len].fill(val);
                    }
                    1 => {
                        b.punch(off, len as u64).await.unwrap();
                        model[off as usize..off as usize + len].fill(0);
                    }
                    _ => {
                        let want = &model[off as usize..off as usize + len];
                        let got = b.read_at(off, len).await.unwrap();
                        assert_eq!(&got[..], want);
                        // Into a lent buffer: the same bytes, put in order.
                        let lent = Box::new(VecReadBuf(Vec::with_capacity(len)));
                        let filled = b.read_into(off, len, lent).await.unwrap();
                        assert_eq!(filled.len(), len);
                        let (got, note) = filled.finish();
                        assert_eq!(&got[..], want);
                        assert!(note.is_none());
                        // Into a buffer that takes lent memory where it lies.
                        let taker = ImageTaker::in_domain(TEST_DOMAIN);
                        let (got, _) = b.read_into(off, len, taker).await.unwrap().finish();
                        assert_eq!(&got[..], want);
                    }
                }
            }
            let all = b.read_at(0, size as usize).await.unwrap();
            assert_eq!(&all[..], &model[..]);
        });
    }
}

/// A backend whose calls are stuck (all of its pool's permits held by blocked system
/// calls) queues its own further calls but leaves another backend's pool running.
#[test]
fn stuck_pool_does_not_stall_another_pool() {
    use crate::pool::BlockingPool;
    use std::sync::mpsc;
    use std::time::Duration;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let slow = BlockingPool::new(2);
        let fast = BlockingPool::new(2);
        let (release, gate) = mpsc::channel::<()>();
        let gate = Arc::new(std::sync::Mutex::new(gate));
        let mut stuck = Vec::new();
        for _ in 0..2 {
            let (slow, gate) = (slow.clone(), gate.clone());
            stuck.push(tokio::spawn(async move {
                slow.run(move || {
                    // Bounded: gives up after 10 s if the test never releases it.
                    let _ = gate.lock().unwrap().recv_timeout(Duration::from_secs(10));
                    Ok(1u8)
                })
                .await
            }));
        }
        // Let both stuck calls take their permits.
        for _ in 0..100 {
            if slow.permits_in_use() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(slow.permits_in_use(), 2);
        // A third call on the stuck pool waits for a permit ...
        let queued = {
            let slow = slow.clone();
            tokio::spawn(async move { slow.run(|| Ok(3u8)).await })
        };
        // ... while the other pool completes its call.
        let other = tokio::time::timeout(Duration::from_secs(10), fast.run(|| Ok(7u8)))
            .await
            .expect("other pool stalled")
            .unwrap();
        assert_eq!(other, 7);
        assert!(!queued.is_finished(), "stuck pool ran beyond its limit");
        release.send(()).unwrap();
        release.send(()).unwrap();
        for h in stuck {
            assert_eq!(h.await.unwrap().unwrap(), 1);
        }
        assert_eq!(queued.await.unwrap().unwrap(), 3);
    });
}

/// A page-cache-hot range is read in place (RWF_NOWAIT) with the same bytes the blocking
/// path reads; a range reaching past the end of the file fails on both.
#[test]
fn cached_read_in_place_matches_the_blocking_read() {
    let dir = std::env::temp_dir().join(format!("ironsan-cached-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("img");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    for (off, len) in [(0u64, 4096usize), (12_345, 100_000), (290_000, 10_000)] {
        let hot = crate::file::read_cached(&f, off, len)
            .expect("RWF_NOWAIT on the temp directory's file system")
            .expect("just written: in the page cache");
        let cold = crate::file::read_exact(&f, off, len).unwrap();
        assert_eq!(hot, cold, "{off}+{len}");
    }
    let eof = io::ErrorKind::UnexpectedEof;
    let hot = crate::file::read_cached(&f, 290_000, 20_000).unwrap_err();
    assert_eq!(hot.kind(), eof);
    let cold = crate::file::read_exact(&f, 290_000, 20_000).unwrap_err();
    assert_eq!(cold.kind(), eof);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// On tmpfs (no RWF_NOWAIT; the file is memory) reads are done in place: the same script
/// passes there.
#[test]
fn file_backend_on_tmpfs() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        return; // no tmpfs mounted here: nothing to exercise
    }
    for mode in MODES {
        let path = shm.join(format!(
            "ironsan-storage-{}-{mode:?}.img",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let b = Arc::new(FileBackend::open_with(&path, Some(4 << 20), true, false, mode).unwrap());
        rt().block_on(script(b));
        std::fs::remove_file(&path).unwrap();
    }
}

/// The simplest lent buffer: the bytes, appended.
struct VecReadBuf(Vec<u8>);

impl crate::ReadBuf for VecReadBuf {
    fn put(&mut self, src: &[u8]) {
        self.0.extend_from_slice(src);
    }
    fn put_zeros(&mut self, n: usize) {
        self.0.resize(self.0.len() + n, 0);
    }
    fn put_bytes(&mut self, data: Bytes) {
        self.put(&data);
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn finish(self: Box<Self>) -> (Bytes, Option<crate::BufNote>) {
        (Bytes::from(self.0), None)
    }
}

#[test]
fn memory_backend_script_on_a_lent_image() {
    rt().block_on(script(Arc::new(MemoryBackend::with_image(TestImage::new(
        4 << 20,
    )))));
}

/// A lent image whose reader takes the bytes where they lie: no copy, and what was
/// read is the image's own memory at the offset.
#[test]
fn a_lent_image_is_read_where_it_lies() {
    rt().block_on(async {
        let image = TestImage::new(1 << 20);
        let b = MemoryBackend::with_image(image.clone());
        b.write_at(300_000, Bytes::from(vec![9u8; 100_000]), false)
            .await
            .unwrap();
        let filled = b
            .read_into(300_000, 100_000, ImageTaker::in_domain(TEST_DOMAIN))
            .await
            .unwrap();
        let (got, note) = filled.finish();
        assert!(got.iter().all(|&x| x == 9));
        assert_eq!(
            got.as_ptr(),
            image.bytes_at(300_000, 1).as_ptr(),
            "the data is the image's memory, not a copy"
        );
        let Some(BufNote::Registered(at)) = note else {
            panic!("no note of where the data lies: {note:?}")
        };
        let reg = image.registration().unwrap();
        assert_eq!((at.lkey, at.in_image), (reg.lkey, true));
        assert_eq!(at.addr_of(&got[1000..]), Some(reg.addr + 301_000));
        // An image registered in another domain, or a heap backend (which offers nothing
        // where it lies): the taker gets a copy.
        let filled = b
            .read_into(300_000, 4096, ImageTaker::in_domain(TEST_DOMAIN + 1))
            .await
            .unwrap();
        let (got, note) = filled.finish();
        assert!(got.iter().all(|&x| x == 9) && got.len() == 4096 && note.is_none());
        let heap = MemoryBackend::new(1 << 20);
        let filled = heap
            .read_into(0, 4096, ImageTaker::in_domain(TEST_DOMAIN))
            .await
            .unwrap();
        assert_eq!(filled.finish().0.len(), 4096);
        // Punched whole or back to all zeroes, a lent chunk reports unmapped again.
        assert!(b.map_status(300_000, 1).await.unwrap().mapped);
        b.punch(0, 1 << 20).await.unwrap();
        assert!(!b.map_status(0, 1 << 20).await.unwrap().mapped);
        assert!(b
            .read_at(300_000, 100_000)
            .await
            .unwrap()
            .iter()
            .all(|&x| x == 0));
    });
}

/// Lent image memory for tests: plain memory written through raw copies, as an RDMA
/// device's region is.
struct TestImage(Box<[std::cell::UnsafeCell<u8>]>);

// SAFETY: the backend writes the image only under a chunk's write lock and borrows bytes
// only under its read lock, so no borrow sees a write; the cells are never moved.
unsafe impl Sync for TestImage {}

impl TestImage {
    fn new(len: usize) -> Arc<TestImage> {
        Arc::new(TestImage(
            (0..len).map(|_| std::cell::UnsafeCell::new(0)).collect(),
        ))
    }
}

impl ImageMemory for TestImage {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn write_at(&self, offset: usize, data: &[u8]) {
        let to = self.0[offset..offset + data.len()].as_ptr() as *mut u8;
        // SAFETY: in range (sliced above); UnsafeCell<u8> has u8's layout, so the cells are
        // `data.len()` contiguous bytes; the backend's chunk lock excludes readers.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), to, data.len()) };
    }
    fn bytes_at(&self, offset: usize, len: usize) -> &[u8] {
        let cells = &self.0[offset..offset + len];
        // SAFETY: as in write_at; no write happens while the backend lends this borrow.
        unsafe { std::slice::from_raw_parts(cells.as_ptr() as *const u8, len) }
    }
    fn registration(&self) -> Option<Registration> {
        Some(Registration {
            domain: TEST_DOMAIN,
            lkey: 7,
            addr: 0x10_0000,
        })
    }
}

/// The protection domain [`TestImage`]s say they are registered in.
const TEST_DOMAIN: usize = 1;

/// A read buffer that takes an image registered in its domain where it lies (as an RDMA
/// transport takes its own registered memory), and copies anything else.
struct ImageTaker {
    domain: usize,
    lent: Option<(Arc<dyn ImageMemory>, usize, usize)>,
    copied: Vec<u8>,
}

impl ImageTaker {
    fn in_domain(domain: usize) -> Box<ImageTaker> {
        Box::new(ImageTaker {
            domain,
            lent: None,
            copied: Vec::new(),
        })
    }
}

impl crate::ReadBuf for ImageTaker {
    fn put_image(&mut self, image: &Arc<dyn ImageMemory>, offset: usize, len: usize) -> bool {
        let ours = image
            .registration()
            .is_some_and(|r| r.domain == self.domain);
        if ours {
            self.lent = Some((image.clone(), offset, len));
        }
        ours
    }
    fn put(&mut self, src: &[u8]) {
        self.copied.extend_from_slice(src);
    }
    fn put_zeros(&mut self, n: usize) {
        self.copied.resize(self.copied.len() + n, 0);
    }
    fn put_bytes(&mut self, data: Bytes) {
        self.put(&data);
    }
    fn len(&self) -> usize {
        self.lent.as_ref().map_or(self.copied.len(), |l| l.2)
    }
    fn finish(self: Box<Self>) -> (Bytes, Option<crate::BufNote>) {
        match self.lent {
            Some((image, offset, len)) => {
                let reg = image.registration().expect("registered");
                let note = crate::Registered {
                    domain: reg.domain,
                    lkey: reg.lkey,
                    addr: reg.addr + offset as u64,
                    at: image.bytes_at(offset, len).as_ptr() as usize,
                    len,
                    in_image: true,
                    held: Held::new(image.clone()),
                };
                let data = Bytes::from_owner(LentView(image, offset, len));
                (data, Some(BufNote::Registered(note)))
            }
            None => (Bytes::from(self.copied), None),
        }
    }
}

struct LentView(Arc<dyn ImageMemory>, usize, usize);

impl AsRef<[u8]> for LentView {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes_at(self.1, self.2)
    }
}

/// A kernel without io_uring (forced here) gives the blocking pool, which serves the
/// same script.
#[test]
fn without_io_uring_the_pool_serves() {
    crate::uring::test_hooks::FORCE_UNAVAILABLE.with(|f| f.set(true));
    let dir = temp_dir("fallback");
    let b = Arc::new(
        FileBackend::open_with(&dir.join("img"), Some(4 << 20), true, false, IoMode::Uring)
            .unwrap(),
    );
    std::fs::File::create(dir.join("dev"))
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let blk = BlockBackend::open(&dir.join("dev"), None, false).unwrap();
    crate::uring::test_hooks::FORCE_UNAVAILABLE.with(|f| f.set(false));
    assert_eq!(b.io_mode(), IoMode::Threads);
    assert_eq!(blk.io_mode(), IoMode::Threads);
    rt().block_on(script(b));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Futures of reads and writes dropped while their operations are in the kernel: the
/// buffers stay owned until the completions arrive, so memory allocated afterwards is never
/// written by them, and the backend keeps serving.
#[test]
fn dropped_commands_leave_memory_and_backend_intact() {
    use std::future::Future;
    use std::task::{Context, Waker};
    if !uring_works() {
        return; // nothing in flight to drop without a ring
    }
    let dir = temp_dir("dropped");
    let path = dir.join("dev");
    std::fs::write(&path, vec![0u8; 8 << 20]).unwrap();
    let b = Arc::new(BlockBackend::open(&path, None, false).unwrap());
    let file = Arc::new(FileBackend::open(&dir.join("img"), Some(8 << 20), true, false).unwrap());
    rt().block_on(async {
        let mut cx = Context::from_waker(Waker::noop());
        let mut submitted = 0;
        for i in 0..64u64 {
            let off = (i % 8) << 20;
            // O_DIRECT reads of the device and FUA writes of the file go to the kernel's
            // workers: they are in flight when their futures are dropped.
            let mut read = Box::pin(b.read_at(off, 1 << 20));
            let mut write = Box::pin(file.write_at(off, Bytes::from(vec![i as u8; 1 << 20]), true));
            if read.as_mut().poll(&mut cx).is_pending() {
                submitted += 1;
            }
            if write.as_mut().poll(&mut cx).is_pending() {
                submitted += 1;
            }
        }
        // Memory allocated now may reuse what the dropped reads lent: it must keep its bytes.
        let canaries: Vec<Vec<u8>> = (0..64).map(|_| vec![0xC3u8; (1 << 20) + 4095]).collect();
        for _ in 0..1000 {
            if b.ring_in_flight() == 0 && file.ring_in_flight() == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(
            b.ring_in_flight() + file.ring_in_flight(),
            0,
            "completions reaped"
        );
        assert!(canaries.iter().all(|c| c.iter().all(|&x| x == 0xC3)));
        eprintln!("{submitted} operations were in flight when dropped");
        // Both backends go on serving (what the dropped writes left is not checked).
        for back in [b.clone() as Arc<dyn Backend>, file.clone()] {
            let data = Bytes::from(vec![0xEEu8; 65536]);
            back.write_at(1 << 20, data.clone(), true).await.unwrap();
            assert_eq!(back.read_at(1 << 20, 65536).await.unwrap(), data);
            back.flush().await.unwrap();
        }
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A completion with an error (a write to an image opened read-only) fails that command
/// only: reads on the same ring go on.
#[test]
fn a_failed_completion_fails_only_its_command() {
    let dir = temp_dir("cqe-error");
    let path = dir.join("img");
    std::fs::write(&path, vec![9u8; 1 << 20]).unwrap();
    for mode in MODES {
        let b = FileBackend::open_with(&path, None, false, true, mode).unwrap();
        let blk = BlockBackend::open_with(&path, None, true, mode).unwrap();
        rt().block_on(async {
            for _ in 0..3 {
                let err = b
                    .write_at(4096, Bytes::from(vec![1u8; 4096]), false)
                    .await
                    .unwrap_err();
                assert_eq!(
                    err.raw_os_error(),
                    Some(rustix::io::Errno::BADF.raw_os_error()),
                    "{err}"
                );
                assert!(blk
                    .write_at(8192, Bytes::from(vec![1u8; 4096]), true)
                    .await
                    .is_err());
                assert_eq!(&b.read_at(4096, 4096).await.unwrap()[..], &[9u8; 4096][..]);
                assert_eq!(
                    &blk.read_at(8192, 4096).await.unwrap()[..],
                    &[9u8; 4096][..]
                );
            }
        });
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A FUA write is in the file when it completes: a fresh descriptor reads it back.
#[test]
fn fua_writes_are_in_the_file() {
    for mode in MODES {
        let dir = temp_dir(&format!("fua-{mode:?}"));
        let path = dir.join("img");
        let b = FileBackend::open_with(&path, Some(1 << 20), true, false, mode).unwrap();
        let data: Vec<u8> = (0..65536u32).map(|i| (i % 253) as u8).collect();
        rt().block_on(b.write_at(123_456, Bytes::from(data.clone()), true))
            .unwrap();
        let mut back = vec![0u8; data.len()];
        std::os::unix::fs::FileExt::read_exact_at(
            &std::fs::File::open(&path).unwrap(),
            &mut back,
            123_456,
        )
        .unwrap();
        assert_eq!(back, data);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// More commands at once than the ring has entries: the rest queue, and all complete with
/// the right bytes.
#[test]
fn more_commands_than_ring_entries_queue_and_complete() {
    let dir = temp_dir("many");
    let b = Arc::new(FileBackend::open(&dir.join("img"), Some(4 << 20), true, false).unwrap());
    let n = 3 * crate::uring::RING_ENTRIES as u64;
    rt().block_on(async {
        let writes: Vec<_> = (0..n)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move {
                    b.write_at(i * 4096, Bytes::from(vec![i as u8; 4096]), i % 7 == 0)
                        .await
                })
            })
            .collect();
        for w in writes {
            w.await.unwrap().unwrap();
        }
        let reads: Vec<_> = (0..n)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { b.read_at(i * 4096, 4096).await })
            })
            .collect();
        for (i, r) in reads.into_iter().enumerate() {
            assert!(r.await.unwrap().unwrap().iter().all(|&x| x == i as u8));
        }
    });
    assert_eq!(b.ring_in_flight(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
