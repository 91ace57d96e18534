//! io_uring submission for the file and block backends: reads, writes (FUA as `RWF_DSYNC`
//! writes), fdatasync and fallocate (punching and zeroing: [`crate::alloc`]) go to a ring
//! owned by the backend instead of the blocking pool's threads. Mapping status (lseek) has
//! no io_uring operation and stays on the blocking pool ([`crate::pool`]).
//!
//! One ring per backend, its files registered (fixed files), and for a backend that reads
//! O_DIRECT a pool of registered read buffers ([`crate::fixed`]: `ReadFixed` where a slot
//! is free and the read fits one). A submitter pushes under the ring's lock, submits
//! without it, and takes whatever has completed on the way out: an operation the kernel
//! completes inside the submit call (a read the page cache holds) costs no hand-off at all.
//! The rest (an O_DIRECT read waits for the device) are reaped by the ring's one reaper,
//! which completes each operation's oneshot channel, keyed by `user_data`. A ring made
//! inside a tokio runtime with an I/O driver reaps on that runtime: the ring signals an
//! eventfd registered with the runtime's reactor, and a task reaps when it is readable, so
//! a completion reaches its command without a thread hop. Elsewhere (no runtime, or one
//! without an I/O driver), and if that runtime shuts down while the ring lives, a reaper
//! thread waits in the kernel instead. [`UringStats`] counts which path each completion
//! took. The memory an operation lends the kernel (the read vector, a registered slot, the
//! write `Bytes`) is owned by the in-flight table until its completion is reaped, so a command whose future
//! is dropped never leaves the kernel writing into freed memory. Fewer than
//! [`RING_ENTRIES`] operations are in flight per ring; further ones queue on a semaphore. A
//! failed completion is an `io::Error` for that operation only.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use io_uring::{opcode, squeue, types, IoUring};
use tokio::io::unix::AsyncFd;

use crate::direct::DIRECT_ALIGN;
use crate::fixed::{FixedPool, Slot, SLOT};
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
    /// A registered slot a ReadFixed fills.
    Fixed(Slot),
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
    /// Registered read buffers (after `ring`: the ring is closed before the pool's Arc is
    /// released; slots lent out hold the memory on).
    fixed: Option<FixedPool>,
    state: Mutex<State>,
    slots: Arc<Semaphore>,
    closing: AtomicBool,
    /// Completions reaped by submitters, by the reaper task, by the reaper thread.
    reaped: [AtomicU64; 3],
    /// Reads through a registered slot.
    fixed_reads: AtomicU64,
}

/// How a ring's completions were reaped, counted since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UringStats {
    /// By a submit call on its way out (its own operation's or another's): no hand-off.
    pub in_submit: u64,
    /// By the reaper task on the runtime, woken through the ring's eventfd.
    pub by_task: u64,
    /// By the reaper thread: a thread hand-off to the command's task.
    pub by_thread: u64,
    /// O_DIRECT reads through a registered buffer (the others found no slot free, or did
    /// not fit one).
    pub fixed_reads: u64,
}

/// Indexes into [`Shared::reaped`].
#[derive(Clone, Copy)]
enum Reaper {
    Submit = 0,
    Task = 1,
    Thread = 2,
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
/// threads, or io_uring is not available (logged once per process). With `fixed_reads`
/// (the backend reads O_DIRECT) the ring gets registered read buffers ([`crate::fixed`]).
pub(crate) fn ring_for(
    mode: crate::IoMode,
    files: &[&File],
    path: &Path,
    fixed_reads: bool,
) -> Option<Ring> {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    if mode == crate::IoMode::Threads {
        return None;
    }
    match Ring::new_with(files, fixed_reads) {
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
    /// started.
    #[cfg(test)]
    pub(crate) fn new(files: &[&File]) -> io::Result<Ring> {
        Ring::new_with(files, false)
    }

    /// [`Ring::new`], with registered read buffers if `fixed_reads` (none where registering
    /// fails, e.g. past the locked-memory limit: reads then take unregistered buffers).
    pub(crate) fn new_with(files: &[&File], fixed_reads: bool) -> io::Result<Ring> {
        if let Some(why) = unavailable() {
            return Err(io::Error::new(io::ErrorKind::Unsupported, why));
        }
        let ring = IoUring::new(RING_ENTRIES)?;
        let fds: Vec<_> = files.iter().map(|f| f.as_raw_fd()).collect();
        ring.submitter().register_files(&fds)?;
        let fixed = fixed_reads.then(|| register_fixed(&ring)).flatten();
        let shared = Arc::new(Shared {
            ring,
            fixed,
            fixed_reads: AtomicU64::new(0),
            state: Mutex::new(State {
                ops: HashMap::new(),
                next: 0,
            }),
            slots: Arc::new(Semaphore::new(RING_ENTRIES as usize - 1)),
            closing: AtomicBool::new(false),
            reaped: Default::default(),
        });
        if !spawn_reaper_task(&shared) {
            spawn_reaper_thread(shared.clone())?;
        }
        Ok(Ring { shared })
    }

    /// How this ring's completions were reaped so far.
    pub(crate) fn stats(&self) -> UringStats {
        let n = |r: Reaper| self.shared.reaped[r as usize].load(Ordering::Relaxed);
        UringStats {
            in_submit: n(Reaper::Submit),
            by_task: n(Reaper::Task),
            by_thread: n(Reaper::Thread),
            fixed_reads: self.shared.fixed_reads.load(Ordering::Relaxed),
        }
    }

    /// An O_DIRECT read of `len` bytes at `offset` of registered file `file`: into a
    /// registered slot when one is free and the read fits it, the data then handed up in
    /// the slot itself; else as [`Ring::read`] into fresh aligned memory.
    pub(crate) async fn read_direct(
        &self,
        file: u32,
        offset: u64,
        len: usize,
    ) -> io::Result<Bytes> {
        let slot = match &self.shared.fixed {
            Some(pool) if len <= SLOT => pool.take(),
            _ => None,
        };
        match slot {
            Some(slot) => self.read_fixed(file, offset, len, slot).await,
            None => self.read(file, offset, len, DIRECT_ALIGN).await,
        }
    }

    /// [`Ring::read_direct`] into `slot` (`len` fits it).
    async fn read_fixed(
        &self,
        file: u32,
        offset: u64,
        len: usize,
        slot: Slot,
    ) -> io::Result<Bytes> {
        let (mut slot, mut done, mut retries) = (slot, 0, 0);
        while done < len {
            let entry = opcode::ReadFixed::new(
                types::Fixed(file),
                slot.ptr().wrapping_add(done),
                (len - done) as u32,
                slot.index(),
            )
            .offset(offset + done as u64)
            .build();
            let (res, back) = self.shared.clone().submit(entry, OpBuf::Fixed(slot)).await;
            slot = match back {
                OpBuf::Fixed(s) => s,
                _ => return res.and(Err(io::Error::other("io_uring read lost its buffer"))),
            };
            match res {
                Ok(0) => return Err(crate::ends_early(offset + done as u64)),
                Ok(got) => done += got as usize,
                Err(e) if retry(&e, &mut retries) => {}
                Err(e) => return Err(e),
            }
        }
        self.shared.fixed_reads.fetch_add(1, Ordering::Relaxed);
        Ok(slot.into_bytes(len))
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

/// A pool of read buffers registered with `ring`, or `None` (logged) where that fails.
fn register_fixed(ring: &IoUring) -> Option<FixedPool> {
    #[cfg(test)]
    if test_hooks::NO_FIXED.with(|f| f.get()) {
        return None;
    }
    let pool = FixedPool::new().ok()?;
    let iovecs: Vec<libc::iovec> = pool
        .regions()
        .into_iter()
        .map(|(base, len)| libc::iovec {
            iov_base: base.cast(),
            iov_len: len,
        })
        .collect();
    // SAFETY: the regions are the pool's memory, which stays allocated while the ring
    // lives: `Shared` holds the pool after the ring (dropped, and so unregistered, first),
    // and only ReadFixed entries whose slot the in-flight table owns name a region.
    match unsafe { ring.submitter().register_buffers(&iovecs) } {
        Ok(()) => Some(pool),
        Err(e) => {
            tracing::info!(
                "io_uring: no registered read buffers ({e}); reads use unregistered ones"
            );
            None
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
        self.complete(completed, Reaper::Submit);
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
                self.complete(done, Reaper::Thread);
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

impl Shared {
    /// Completes operations (their waiters may be gone: the buffer is then dropped here,
    /// after the kernel is done with it), counting them for `by`.
    fn complete(&self, done: Reaped, by: Reaper) {
        self.reaped[by as usize].fetch_add(done.len() as u64, Ordering::Relaxed);
        for (op, res) in done {
            let _ = op.done.send((res, op.buf));
        }
    }

    /// The reaper task (the guard holds its ring, also when the task is dropped before it
    /// first runs): waits until the ring's eventfd is readable, then completes what the
    /// ring holds, until the ring is dropped and nothing is in flight. Dropped unfinished
    /// (its runtime shut down), it hands the ring to a reaper thread ([`TaskGuard`]).
    async fn reap_on_runtime(mut guard: TaskGuard, efd: AsyncFd<OwnedFd>) {
        let Some(shared) = guard.0.clone() else {
            return;
        };
        loop {
            let Ok(mut ready) = efd.readable().await else {
                // The reactor failed us: the thread takes over (the guard starts it).
                return;
            };
            // Readiness cleared before the eventfd is emptied and the queue drained: a
            // completion posted after the drain signals the eventfd again, a new edge.
            ready.clear_ready();
            let mut count = [0u8; 8];
            let _ = rustix::io::read(efd.get_ref(), &mut count);
            let mut state = shared.lock();
            let done = shared.drain(&mut state);
            let idle = state.ops.is_empty();
            drop(state);
            shared.complete(done, Reaper::Task);
            if idle && shared.closing.load(Ordering::Acquire) {
                guard.0 = None;
                return;
            }
        }
    }
}

/// Holds the ring while its reaper task runs; dropped with the ring still in use (the task's
/// runtime shut down), it starts a reaper thread so operations still complete.
struct TaskGuard(Option<Arc<Shared>>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            if let Err(e) = spawn_reaper_thread(shared) {
                tracing::warn!("io_uring: no reaper after the runtime stopped: {e}");
            }
        }
    }
}

fn spawn_reaper_thread(shared: Arc<Shared>) -> io::Result<()> {
    std::thread::Builder::new()
        .name("ironsan-uring".into())
        .spawn(move || shared.reap_until_closed())?;
    Ok(())
}

/// Starts the reaper as a task on the current runtime, its eventfd registered with the ring
/// and with the runtime's reactor; false (nothing started) outside a runtime, in one without
/// an I/O driver, or when the eventfd cannot be set up.
fn spawn_reaper_task(shared: &Arc<Shared>) -> bool {
    #[cfg(test)]
    if test_hooks::FORCE_THREAD.with(|f| f.get()) {
        return false;
    }
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return false;
    };
    use rustix::event::{eventfd, EventfdFlags};
    let Ok(efd) = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK) else {
        return false;
    };
    // tokio panics (rather than failing) registering with a runtime built without an I/O
    // driver, and offers no way to ask first.
    let registered = std::panic::catch_unwind(|| {
        // SAFETY: the AsyncFd owns the descriptor (an OwnedFd), so it stays open and the
        // same for the AsyncFd's whole life.
        unsafe { AsyncFd::register_with_interest(efd, tokio::io::Interest::READABLE) }
    });
    let Ok(Ok(efd)) = registered else {
        return false;
    };
    if shared
        .ring
        .submitter()
        .register_eventfd(efd.get_ref().as_raw_fd())
        .is_err()
    {
        return false;
    }
    handle.spawn(Shared::reap_on_runtime(
        TaskGuard(Some(shared.clone())),
        efd,
    ));
    true
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
        /// Set by a test to give rings made on this thread a reaper thread even inside a
        /// runtime with an I/O driver.
        pub(crate) static FORCE_THREAD: Cell<bool> = const { Cell::new(false) };
        /// Set by a test to make rings made on this thread do without registered buffers.
        pub(crate) static NO_FIXED: Cell<bool> = const { Cell::new(false) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixed::SLOTS;

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

    /// A scratch file (removed with its directory) and a ring with it registered, made on
    /// the calling thread's runtime context, if any.
    fn scratch_ring() -> Option<(tempfile::TempDir, File, Ring)> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        let file = File::open(&path).unwrap();
        let ring = Ring::new(&[&file]).ok()?;
        Some((dir, file, ring))
    }

    /// A timeout of 20 ms on the ring: an operation that always completes after its submit
    /// call (ETIME), lending the kernel `buf`.
    async fn timeout(ring: &Ring, buf: OpBuf) -> io::Result<u32> {
        static TS: types::Timespec = types::Timespec::new().nsec(20_000_000);
        let entry = opcode::Timeout::new(&TS).build();
        ring.shared.clone().submit(entry, buf).await.0
    }

    fn io_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .unwrap()
    }

    /// Made inside a runtime with an I/O driver, the ring's late completions are reaped by
    /// its task on that runtime, none by a thread; reads still return the file's bytes.
    #[test]
    fn late_completions_are_reaped_on_the_runtime() {
        let rt = io_runtime();
        rt.block_on(async {
            let Some((_dir, _file, ring)) = scratch_ring() else {
                eprintln!("SKIP: no io_uring here");
                return;
            };
            let waits = (0..8).map(|_| timeout(&ring, OpBuf::None));
            for res in futures_join(waits).await {
                assert_eq!(res.unwrap_err().raw_os_error(), Some(libc_etime()));
            }
            assert_eq!(&ring.read(0, 100, 50, 1).await.unwrap()[..], &[7u8; 50][..]);
            let stats = ring.stats();
            assert_eq!(stats.by_thread, 0, "{stats:?}");
            assert!(stats.by_task >= 8, "{stats:?}");
            assert_eq!(stats.in_submit + stats.by_task, 9, "{stats:?}");
        });
    }

    /// A runtime without an I/O driver (and no runtime at all) gives the ring a reaper
    /// thread, which reaps the late completions.
    #[test]
    fn without_an_io_driver_a_thread_reaps() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let Some((_dir, _file, ring)) = scratch_ring() else {
                eprintln!("SKIP: no io_uring here");
                return;
            };
            assert!(timeout(&ring, OpBuf::None).await.is_err());
            let stats = ring.stats();
            assert_eq!((stats.by_thread, stats.by_task), (1, 0), "{stats:?}");
        });
    }

    /// A command dropped with its operation in flight leaves the buffer with the ring until
    /// the reaper task reaps the completion: the buffer is never freed under the kernel.
    #[test]
    fn a_dropped_waiter_leaves_its_buffer_to_the_reaper_task() {
        let rt = io_runtime();
        rt.block_on(async {
            let Some((_dir, _file, ring)) = scratch_ring() else {
                eprintln!("SKIP: no io_uring here");
                return;
            };
            let ring = Arc::new(ring);
            let r = ring.clone();
            let task = tokio::spawn(async move { timeout(&r, OpBuf::Read(vec![1; 4096])).await });
            for _ in 0..100 {
                if ring.in_flight() == 1 {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert_eq!(ring.in_flight(), 1, "the operation was submitted");
            task.abort();
            assert!(task.await.unwrap_err().is_cancelled());
            assert_eq!(ring.in_flight(), 1, "the ring still owns the buffer");
            for _ in 0..200 {
                if ring.in_flight() == 0 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            assert_eq!(ring.in_flight(), 0);
            assert_eq!(ring.stats().by_task, 1);
        });
    }

    /// The runtime the reaper task ran on shutting down while the ring lives hands the ring
    /// to a reaper thread: operations from another runtime still complete.
    #[test]
    fn the_ring_outlives_its_runtime() {
        let rt = io_runtime();
        let made = rt.block_on(async { scratch_ring() });
        let Some((_dir, _file, ring)) = made else {
            eprintln!("SKIP: no io_uring here");
            return;
        };
        drop(rt);
        let other = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        other.block_on(async {
            assert!(timeout(&ring, OpBuf::None).await.is_err());
            assert_eq!(&ring.read(0, 0, 10, 1).await.unwrap()[..], &[7u8; 10][..]);
        });
        // The timeout, and the read if the thread took it before its submitter did.
        let stats = ring.stats();
        assert!(stats.by_thread >= 1 && stats.by_task == 0, "{stats:?}");
    }

    /// Runs `futs` concurrently on the current task.
    async fn futures_join<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
        let mut set = Vec::new();
        for f in futs {
            set.push(Box::pin(f));
        }
        let mut out: Vec<Option<F::Output>> = set.iter().map(|_| None).collect();
        std::future::poll_fn(|cx| {
            let mut pending = false;
            for (f, o) in set.iter_mut().zip(out.iter_mut()) {
                if o.is_none() {
                    match f.as_mut().poll(cx) {
                        std::task::Poll::Ready(v) => *o = Some(v),
                        std::task::Poll::Pending => pending = true,
                    }
                }
            }
            if pending {
                std::task::Poll::Pending
            } else {
                std::task::Poll::Ready(())
            }
        })
        .await;
        out.into_iter().map(|o| o.unwrap()).collect()
    }

    /// A measurement rather than a check (`--ignored --nocapture`): 4 KiB random writes then
    /// reads at QD 32 on a file on tmpfs and on one on disk (O_DIRECT), the ring reaped on
    /// the runtime or by a thread, alternating; prints IOPS and how completions were reaped.
    #[test]
    #[ignore]
    fn qd32_completion_paths() {
        use crate::{Backend, FileBackend, IoMode};
        const SIZE: u64 = 256 << 20;
        const PER_TASK: u64 = 1500;
        for (dir, direct) in [("/dev/shm", false), ("/var/tmp", true)] {
            for thread in [false, true, false, true] {
                FORCE_THREAD_FOR_TEST.with(|f| f.set(thread));
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_io()
                    .build()
                    .unwrap();
                let scratch = tempfile::tempdir_in(dir).unwrap();
                let path = scratch.path().join("img");
                rt.block_on(async {
                    let b = Arc::new(
                        FileBackend::open_direct(
                            &path,
                            Some(SIZE),
                            true,
                            false,
                            IoMode::Uring,
                            direct,
                        )
                        .unwrap(),
                    );
                    let mut line = format!("{dir} direct={direct} thread={thread}:");
                    for write in [true, false] {
                        let start = std::time::Instant::now();
                        let tasks: Vec<_> = (0..32u64)
                            .map(|t| {
                                let b = b.clone();
                                tokio::spawn(async move {
                                    let mut x = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                                    for _ in 0..PER_TASK {
                                        x ^= x << 13;
                                        x ^= x >> 7;
                                        x ^= x << 17;
                                        let at = (x % (SIZE / 4096)) * 4096;
                                        if write {
                                            b.write_at(at, Bytes::from(vec![1u8; 4096]), false)
                                                .await
                                                .unwrap();
                                        } else {
                                            b.read_at(at, 4096).await.unwrap();
                                        }
                                    }
                                })
                            })
                            .collect();
                        for t in tasks {
                            t.await.unwrap();
                        }
                        let iops = (32 * PER_TASK) as f64 / start.elapsed().as_secs_f64();
                        line +=
                            &format!(" {} {iops:.0} IOPS", if write { "write" } else { "read" });
                    }
                    eprintln!("{line}; {:?}", b.uring_stats().unwrap());
                });
            }
        }
        FORCE_THREAD_FOR_TEST.with(|f| f.set(false));
    }

    use test_hooks::FORCE_THREAD as FORCE_THREAD_FOR_TEST;

    /// A ring with registered read buffers on a 256 KiB file of known bytes.
    fn fixed_ring() -> Option<(tempfile::TempDir, Vec<u8>, File, Ring)> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..256 << 10).map(|i: u32| (i % 251) as u8 + 1).collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        let ring = Ring::new_with(&[&file], true).ok()?;
        ring.shared.fixed.as_ref()?;
        Some((dir, data, file, ring))
    }

    /// Reads through registered slots give the file's bytes, in memory the slot owns until
    /// the last `Bytes` of it drops; a read larger than a slot takes unregistered memory, a
    /// read past the end fails.
    #[test]
    fn fixed_reads_give_the_bytes_and_return_their_slots() {
        io_runtime().block_on(async {
            let Some((_dir, data, _file, ring)) = fixed_ring() else {
                eprintln!("SKIP: no io_uring with registered buffers here");
                return;
            };
            let pool = ring.shared.fixed.clone().unwrap();
            let got = ring.read_direct(0, 8192, 4096).await.unwrap();
            assert_eq!(got[..], data[8192..12288]);
            assert_eq!(pool.free(), SLOTS - 1, "the data holds its slot");
            let whole = ring.read_direct(0, 0, SLOT).await.unwrap();
            assert_eq!(whole[..], data[..SLOT]);
            assert_eq!(ring.stats().fixed_reads, 2);
            drop((got, whole));
            assert_eq!(pool.free(), SLOTS);
            let big = ring.read_direct(0, 4096, SLOT + 4096).await.unwrap();
            assert_eq!(big[..], data[4096..SLOT + 8192]);
            assert_eq!(
                ring.stats().fixed_reads,
                2,
                "larger than a slot: unregistered"
            );
            let err = ring.read_direct(0, 252 << 10, 8192).await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
            assert_eq!(pool.free(), SLOTS, "a failed read gives its slot back");
        });
    }

    /// With every slot taken, reads take unregistered memory and still give the bytes.
    #[test]
    fn an_exhausted_pool_falls_back_to_unregistered_reads() {
        io_runtime().block_on(async {
            let Some((_dir, data, _file, ring)) = fixed_ring() else {
                eprintln!("SKIP: no io_uring with registered buffers here");
                return;
            };
            let pool = ring.shared.fixed.clone().unwrap();
            let held: Vec<_> = (0..SLOTS).map(|_| pool.take().unwrap()).collect();
            let got = ring.read_direct(0, 4096, 4096).await.unwrap();
            assert_eq!(got[..], data[4096..8192]);
            assert_eq!(ring.stats().fixed_reads, 0);
            drop(held);
            assert_eq!(pool.free(), SLOTS);
        });
    }

    /// A command dropped while its registered slot is lent to the kernel leaves the slot
    /// with the ring until the completion is reaped; only then does it go back to the pool.
    #[test]
    fn a_dropped_fixed_read_keeps_its_slot_until_reaped() {
        io_runtime().block_on(async {
            let Some((_dir, _data, _file, ring)) = fixed_ring() else {
                eprintln!("SKIP: no io_uring with registered buffers here");
                return;
            };
            let pool = ring.shared.fixed.clone().unwrap();
            let ring = Arc::new(ring);
            let (r, slot) = (ring.clone(), pool.take().unwrap());
            let task = tokio::spawn(async move { timeout(&r, OpBuf::Fixed(slot)).await });
            for _ in 0..100 {
                if ring.in_flight() == 1 {
                    break;
                }
                tokio::task::yield_now().await;
            }
            task.abort();
            assert!(task.await.unwrap_err().is_cancelled());
            assert_eq!((ring.in_flight(), pool.free()), (1, SLOTS - 1));
            for _ in 0..200 {
                if ring.in_flight() == 0 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            assert_eq!((ring.in_flight(), pool.free()), (0, SLOTS));
        });
    }

    /// A measurement rather than a check (`--ignored --nocapture`): O_DIRECT reads on a file
    /// on disk (/var/tmp), 4 KiB at QD 32 and 128 KiB at QD 8, through registered buffers or
    /// not, alternating.
    #[test]
    #[ignore]
    fn fixed_vs_unregistered_direct_reads() {
        use crate::{Backend, FileBackend, IoMode};
        const SIZE: u64 = 256 << 20;
        let scratch = tempfile::tempdir_in("/var/tmp").unwrap();
        let path = scratch.path().join("img");
        std::fs::write(&path, vec![5u8; SIZE as usize]).unwrap();
        File::open(&path).unwrap().sync_all().unwrap();
        for registered in [false, true, false, true, false, true] {
            test_hooks::NO_FIXED.with(|f| f.set(!registered));
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_io()
                .build()
                .unwrap();
            rt.block_on(async {
                let b = Arc::new(
                    FileBackend::open_direct(&path, Some(SIZE), false, false, IoMode::Uring, true)
                        .unwrap(),
                );
                let mut line = format!("registered={registered}:");
                for (bytes, qd, per_task) in [(4096u64, 32u64, 1500u64), (128 << 10, 8, 300)] {
                    let start = std::time::Instant::now();
                    let tasks: Vec<_> = (0..qd)
                        .map(|t| {
                            let b = b.clone();
                            tokio::spawn(async move {
                                let mut x = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                                for _ in 0..per_task {
                                    x ^= x << 13;
                                    x ^= x >> 7;
                                    x ^= x << 17;
                                    let at = (x % (SIZE / bytes)) * bytes;
                                    b.read_at(at, bytes as usize).await.unwrap();
                                }
                            })
                        })
                        .collect();
                    for t in tasks {
                        t.await.unwrap();
                    }
                    let secs = start.elapsed().as_secs_f64();
                    let ops = (qd * per_task) as f64;
                    line += &format!(
                        " {} KiB QD{qd} {:.0} IOPS {:.0} MB/s;",
                        bytes >> 10,
                        ops / secs,
                        ops * bytes as f64 / secs / 1e6
                    );
                }
                eprintln!("{line} {:?}", b.uring_stats().unwrap());
            });
        }
        test_hooks::NO_FIXED.with(|f| f.set(false));
    }

    fn libc_etime() -> i32 {
        rustix::io::Errno::TIME.raw_os_error()
    }
}
