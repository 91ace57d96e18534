//! io_uring submission for the file and block backends: reads, writes (FUA as `RWF_DSYNC`
//! writes), fdatasync and fallocate (punching and zeroing: [`crate::alloc`]) go to a ring
//! owned by the backend instead of the blocking pool's threads. Mapping status (lseek) has
//! no io_uring operation and stays on the blocking pool ([`crate::pool`]).
//!
//! One ring per backend, its files registered (fixed files). A submitter pushes under the
//! ring's lock, submits without it, and takes whatever has completed on the way out: an
//! operation the kernel completes inside the submit call (a read the page cache holds)
//! costs no thread hand-off at all. The rest are reaped by the ring's one reaper thread, which waits in the
//! kernel for completions and completes each operation's oneshot channel, keyed by
//! `user_data`: no thread per command, and no dependence on the runtime having an I/O
//! driver. The memory an operation lends the kernel (the read vector, the
//! write `Bytes`) is owned by the in-flight table until its completion is reaped, so a
//! command whose future is dropped never leaves the kernel writing into freed memory. Fewer
//! than [`RING_ENTRIES`] operations are in flight per ring; further ones queue on a
//! semaphore. A failed completion is an `io::Error` for that operation only.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use io_uring::{opcode, squeue, types, IoUring};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

/// Submission queue size of a backend's ring (the completion queue is twice that, so it
/// cannot overflow while at most this many are in flight).
pub(crate) const RING_ENTRIES: u32 = 128;

/// `user_data` of the no-op that tells the reaper its ring is being dropped.
const CLOSE: u64 = u64::MAX;

/// Largest transfer one read or write operation asks for (longer ones loop).
const MAX_OP: usize = 1 << 30;

/// Retries of an operation the kernel answered with EINTR or EAGAIN.
const MAX_RETRIES: u32 = 16;

/// Memory an operation lends the kernel.
enum OpBuf {
    None,
    Read(Vec<u8>),
    /// Only held: the kernel reads it.
    Write(#[allow(dead_code)] Bytes),
}

struct InFlight {
    /// Kept alive (and unmoved: only its heap memory is lent) until the completion arrives.
    buf: OpBuf,
    done: oneshot::Sender<(i32, OpBuf)>,
    _slot: OwnedSemaphorePermit,
}

/// The in-flight table and the ring's queues: both only touched under [`Shared::state`].
struct State {
    ops: HashMap<u64, InFlight>,
    next: u64,
}

struct Shared {
    ring: IoUring,
    state: Mutex<State>,
    slots: Arc<Semaphore>,
    closing: AtomicBool,
}

/// A backend's ring (see the module comment). Dropping it stops the reaper once the
/// operations still in flight have completed.
pub(crate) struct Ring {
    shared: Arc<Shared>,
}

/// Why io_uring cannot be used here, when it cannot: `io_uring_disabled` set to 2, or ring
/// setup failing (ENOSYS on a kernel without it, EPERM when restricted).
pub(crate) fn unavailable() -> Option<String> {
    #[cfg(test)]
    if test_hooks::FORCE_UNAVAILABLE.with(|f| f.get()) {
        return Some("disabled by the test".into());
    }
    if let Ok(v) = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled") {
        if v.trim() == "2" {
            return Some("disabled by kernel.io_uring_disabled".into());
        }
    }
    None
}

/// The ring a backend asked for `mode` uses, or `None` for the blocking pool: asked for
/// threads, or io_uring is not available (logged once per process).
pub(crate) fn ring_for(mode: crate::IoMode, files: &[&File], path: &Path) -> Option<Ring> {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    if mode == crate::IoMode::Threads {
        return None;
    }
    match Ring::new(files) {
        Ok(ring) => Some(ring),
        Err(e) => {
            if !LOGGED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "io_uring unavailable ({e}) for {}: file and block LUNs use the blocking thread pool",
                    path.display()
                );
            }
            None
        }
    }
}

impl Ring {
    /// A ring with `files` registered (operations name them by index), and its reaper
    /// thread started.
    pub(crate) fn new(files: &[&File]) -> io::Result<Ring> {
        if let Some(why) = unavailable() {
            return Err(io::Error::new(io::ErrorKind::Unsupported, why));
        }
        let ring = IoUring::new(RING_ENTRIES)?;
        let fds: Vec<_> = files.iter().map(|f| f.as_raw_fd()).collect();
        ring.submitter().register_files(&fds)?;
        let shared = Arc::new(Shared {
            ring,
            state: Mutex::new(State {
                ops: HashMap::new(),
                next: 0,
            }),
            slots: Arc::new(Semaphore::new(RING_ENTRIES as usize - 1)),
            closing: AtomicBool::new(false),
        });
        let reaper = shared.clone();
        std::thread::Builder::new()
            .name("ironsan-uring".into())
            .spawn(move || reaper.reap_until_closed())?;
        Ok(Ring { shared })
    }

    /// Reads `len` bytes at `offset` of registered file `file` into a fresh buffer whose
    /// start is `align`-aligned in memory (1: any); a short read is continued, and the end
    /// of the file before `offset + len` is an error ([`crate::ends_early`]).
    pub(crate) async fn read(
        &self,
        file: u32,
        offset: u64,
        len: usize,
        align: usize,
    ) -> io::Result<Bytes> {
        // Not zeroed first: only the alignment padding is; the kernel fills the rest.
        let mut buf: Vec<u8> = Vec::with_capacity(len + align - 1);
        let start = match buf.as_ptr() as usize % align {
            0 => 0,
            mis => align - mis,
        };
        buf.spare_capacity_mut()[..start].fill(std::mem::MaybeUninit::new(0));
        let (mut done, mut retries) = (0, 0);
        while done < len {
            let n = (len - done).min(MAX_OP);
            let at = buf.spare_capacity_mut()[start + done..]
                .as_mut_ptr()
                .cast::<u8>();
            let entry = opcode::Read::new(types::Fixed(file), at, n as u32)
                .offset(offset + done as u64)
                .build();
            let (res, back) = self.shared.clone().submit(entry, OpBuf::Read(buf)).await;
            buf = match back {
                OpBuf::Read(b) => b,
                _ => return res.and(Err(io::Error::other("io_uring read lost its buffer"))),
            };
            match res {
                Ok(0) => return Err(crate::ends_early(offset + done as u64)),
                Ok(got) => done += got as usize,
                Err(e) if retry(&e, &mut retries) => {}
                Err(e) => return Err(e),
            }
        }
        // SAFETY: the first `start` bytes were zeroed above and the completed reads wrote
        // the `done == len` bytes after them; the vector's capacity holds `start + len`
        // bytes, and nothing reads it before this length is set.
        unsafe { buf.set_len(start + done) };
        Ok(Bytes::from(buf).slice(start..start + len))
    }

    /// Writes all of `data` at `offset` of registered file `file`; with `dsync` each write
    /// is durable when it completes (RWF_DSYNC: FUA on devices that have it).
    pub(crate) async fn write(
        &self,
        file: u32,
        offset: u64,
        data: Bytes,
        dsync: bool,
    ) -> io::Result<()> {
        let flags = if dsync {
            rustix::io::ReadWriteFlags::DSYNC.bits() as i32
        } else {
            0
        };
        let (mut done, mut retries) = (0, 0);
        while done < data.len() {
            let n = (data.len() - done).min(MAX_OP);
            let entry = opcode::Write::new(types::Fixed(file), data[done..].as_ptr(), n as u32)
                .offset(offset + done as u64)
                .rw_flags(flags)
                .build();
            let (res, _) = self
                .shared
                .clone()
                .submit(entry, OpBuf::Write(data.clone()))
                .await;
            match res {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(put) => done += put as usize,
                Err(e) if retry(&e, &mut retries) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// fallocate(`mode`) of `offset..offset+len` of registered file `file`.
    pub(crate) async fn fallocate(
        &self,
        file: u32,
        mode: i32,
        offset: u64,
        len: u64,
    ) -> io::Result<()> {
        let mut retries = 0;
        loop {
            let entry = opcode::Fallocate::new(types::Fixed(file), len)
                .offset(offset)
                .mode(mode)
                .build();
            match self.shared.clone().submit(entry, OpBuf::None).await.0 {
                Ok(_) => return Ok(()),
                Err(e) if retry(&e, &mut retries) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// fdatasync of registered file `file`.
    pub(crate) async fn fdatasync(&self, file: u32) -> io::Result<()> {
        let mut retries = 0;
        loop {
            let entry = opcode::Fsync::new(types::Fixed(file))
                .flags(types::FsyncFlags::DATASYNC)
                .build();
            match self.shared.clone().submit(entry, OpBuf::None).await.0 {
                Ok(_) => return Ok(()),
                Err(e) if retry(&e, &mut retries) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl Ring {
    /// Operations submitted and not yet reaped.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.shared.lock().ops.len()
    }
}

/// The I/O path of a backend that has `ring` (none: the blocking pool).
pub(crate) fn mode(ring: Option<&Ring>) -> crate::IoMode {
    match ring {
        Some(_) => crate::IoMode::Uring,
        None => crate::IoMode::Threads,
    }
}

/// Operations in flight on a backend's `ring` (0 without one).
#[cfg(test)]
pub(crate) fn in_flight(ring: Option<&Ring>) -> usize {
    ring.map_or(0, Ring::in_flight)
}

/// True (and counts it) when `e` is worth another try.
fn retry(e: &io::Error, retries: &mut u32) -> bool {
    *retries += 1;
    *retries <= MAX_RETRIES
        && matches!(
            e.kind(),
            io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
        )
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        // Wake the reaper: it exits once nothing is in flight any more.
        let _state = self.shared.lock();
        let nop = opcode::Nop::new().build().user_data(CLOSE);
        // SAFETY: a no-op lends the kernel no memory; the queue is only touched under the
        // state lock, held here.
        let pushed = unsafe { self.shared.ring.submission_shared().push(&nop) };
        if pushed.is_err() || self.shared.ring.submit().is_err() {
            tracing::warn!("io_uring: cannot wake the reaper; its thread stays until exit");
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Submits `entry`, whose memory is `buf`, and waits for its completion: the result
    /// (the CQE's non-negative result, or its error) and the buffer back.
    async fn submit(self: Arc<Self>, entry: squeue::Entry, buf: OpBuf) -> (io::Result<u32>, OpBuf) {
        let slot = match self.slots.clone().acquire_owned().await {
            Ok(slot) => slot,
            Err(e) => return (Err(io::Error::other(e)), buf),
        };
        let (tx, rx) = oneshot::channel();
        {
            let mut state = self.lock();
            let id = state.next;
            state.next = (state.next + 1) % CLOSE;
            // SAFETY: the memory the entry points into is `buf`'s heap memory, which the
            // in-flight table owns (below) until this entry's completion is reaped, and which
            // `Shared::drop` leaks if the ring goes away first; the file is registered with
            // the ring. The queue is only touched under the state lock, held here.
            let pushed = unsafe { self.ring.submission_shared().push(&entry.user_data(id)) };
            if pushed.is_err() {
                // Cannot happen: fewer operations are in flight than the queue has entries.
                return (Err(io::Error::other("io_uring submission queue full")), buf);
            }
            state.ops.insert(
                id,
                InFlight {
                    buf,
                    done: tx,
                    _slot: slot,
                },
            );
        }
        // The system call runs without the lock: other submitters push meanwhile (the kernel
        // serialises the calls, and takes whatever the queue's tail shows).
        self.enter();
        let completed = self.drain(&mut self.lock());
        complete(completed);
        match rx.await {
            Ok((res, buf)) if res >= 0 => (Ok(res as u32), buf),
            Ok((res, buf)) => (Err(io::Error::from_raw_os_error(-res)), buf),
            Err(_) => (Err(io::Error::other("io_uring ring closed")), OpBuf::None),
        }
    }

    /// Hands the queued entries to the kernel. An entry the kernel did not take now stays
    /// queued and goes with the next submission (the reaper's wait submits too).
    fn enter(&self) {
        for _ in 0..MAX_RETRIES {
            match self.ring.submit() {
                Err(e) if retry_submit(&e) => std::thread::yield_now(),
                Err(e) => {
                    tracing::warn!("io_uring submit failed: {e}");
                    return;
                }
                Ok(_) => return,
            }
        }
    }

    /// Takes every completion out of the queue, with its in-flight entry (the caller
    /// completes them after releasing the lock).
    fn drain(&self, state: &mut State) -> Reaped {
        let mut out = Reaped::new();
        // SAFETY: the completion queue is only touched under the state lock, which the
        // caller holds (`state` is borrowed from it).
        for cqe in unsafe { self.ring.completion_shared() } {
            if let Some(op) = state.ops.remove(&cqe.user_data()) {
                out.push((op, cqe.result()));
            }
        }
        out
    }

    /// The reaper thread: waits for completions and completes them, until the ring is
    /// dropped and nothing is in flight.
    fn reap_until_closed(self: Arc<Self>) {
        loop {
            let idle = {
                let mut state = self.lock();
                let done = self.drain(&mut state);
                let idle = state.ops.is_empty();
                drop(state);
                complete(done);
                idle
            };
            if idle && self.closing.load(Ordering::Acquire) {
                return;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if retry_submit(&e) => {}
                Err(e) => {
                    tracing::warn!("io_uring wait failed: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        }
    }
}

/// Completions taken from the queue in one drain, completed once the lock is released: a
/// few inline (a submitter's drain usually finds its own and maybe one more), more on the heap.
type Reaped = smallvec::SmallVec<[(InFlight, i32); 4]>;

fn retry_submit(e: &io::Error) -> bool {
    use rustix::io::Errno;
    let code = e.raw_os_error();
    [Errno::INTR, Errno::AGAIN, Errno::BUSY]
        .iter()
        .any(|x| code == Some(x.raw_os_error()))
}

/// Completes operations (their waiters may be gone: the buffer is then dropped here, after
/// the kernel is done with it).
fn complete(done: Reaped) {
    for (op, res) in done {
        let _ = op.done.send((res, op.buf));
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Only reached with operations in flight if the reaper thread died: the kernel may
        // still write into their buffers, so they are leaked rather than freed.
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        for (_, op) in state.ops.drain() {
            std::mem::forget(op.buf);
        }
    }
}

#[cfg(test)]
pub(crate) mod test_hooks {
    use std::cell::Cell;

    thread_local! {
        /// Set by a test to make ring setup on this thread fail as on a kernel without
        /// io_uring.
        pub(crate) static FORCE_UNAVAILABLE: Cell<bool> = const { Cell::new(false) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ring reads (any memory alignment) return the file's bytes, and a read reaching past
    /// its end fails rather than passing off unwritten memory (or zeroes) as data.
    #[test]
    fn ring_reads_give_the_bytes_and_fail_past_the_end() {
        let path = std::env::temp_dir().join(format!("ironsan-uring-read-{}", std::process::id()));
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        let Ok(ring) = Ring::new(&[&file]) else {
            eprintln!("SKIP: no io_uring here");
            return;
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            for align in [1, 512, 4096] {
                let got = ring.read(0, 4096, 4096, align).await.unwrap();
                assert_eq!(got[..], data[4096..8192], "align {align}");
                let tail = ring.read(0, 8192, 1808, align).await.unwrap();
                assert_eq!(tail[..], data[8192..], "align {align}");
                for (at, len) in [(8192, 8192), (20_000, 4096)] {
                    let err = ring.read(0, at, len, align).await.unwrap_err();
                    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "align {align}");
                }
            }
        });
        drop(ring);
        std::fs::remove_file(&path).unwrap();
    }
}
