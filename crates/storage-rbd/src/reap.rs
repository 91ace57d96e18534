//! Completion by eventfd: an image with an eventfd set by `rbd_set_image_notification` has
//! every AIO that completes queued inside librbd and the eventfd signalled; one thread per
//! image waits on the eventfd and reaps the queue with `rbd_poll_io_events`, up to [`BATCH`]
//! completions a call, handing each result to its waiting task. librbd's own thread then
//! only writes the eventfd (no callback runs on it, and none is queued to its work queue),
//! and completions that arrive together reach the runtime together.
//!
//! The reaper is a plain thread rather than a tokio `AsyncFd`: a backend may be opened
//! outside any runtime (the reconnect thread opens it) or on a runtime built without the I/O
//! driver, where registering an `AsyncFd` panics and cannot be checked for beforehand.

use std::ffi::c_int;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::ffi::{Api, Events, RbdCompletionT, RbdImageT, EVENT_TYPE_EVENTFD};
use crate::OpContext;

/// Completions reaped by one `rbd_poll_io_events` call.
pub(crate) const BATCH: usize = 32;
/// Calls in one drain before the eventfd is waited on again (bounds the drain loop).
const MAX_BATCHES: usize = 64;
/// Longest wait on the eventfd in one turn of the loop, in milliseconds.
const WAIT_MS: c_int = 1000;

/// An image's eventfd and the thread reaping its completions.
pub(crate) struct Reaper {
    /// Closed when the Reaper is dropped, which its owner does after closing the image, so
    /// that librbd never signals a closed (possibly reused) descriptor.
    fd: OwnedFd,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The image handle, moved to the reaper thread.
struct Image(RbdImageT);
// SAFETY: librbd's calls on an image are thread-safe; the image stays open until the reaper
// thread has been joined (Reaper::stop, called before rbd_close).
unsafe impl Send for Image {}

impl Reaper {
    /// Creates the eventfd, starts the reaper thread and sets the eventfd as `image`'s
    /// notification (in that order: should librbd refuse it, the thread is stopped and the
    /// image never had the descriptor).
    pub(crate) fn start(api: &'static Api, events: Events, image: RbdImageT) -> io::Result<Reaper> {
        // SAFETY: eventfd has no memory arguments; a non-negative result is a new descriptor.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor we just opened and own alone.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (stop, image) = (stop.clone(), Image(image));
            std::thread::Builder::new()
                .name("rbd-reap".into())
                .spawn(move || reap(api, events, &image, raw, &stop))?
        };
        let mut reaper = Reaper {
            fd,
            stop,
            thread: Some(thread),
        };
        // SAFETY: an open image and an open eventfd, which outlives the image (see `fd`).
        let r = unsafe { (events.rbd_set_image_notification)(image, raw, EVENT_TYPE_EVENTFD) };
        if r < 0 {
            reaper.stop();
            return Err(io::Error::from_raw_os_error(-r));
        }
        Ok(reaper)
    }

    /// Stops the thread and waits for it; called with no operation in flight, before the
    /// image is closed. Never called on the reaper thread (see `crate::complete`).
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        signal(self.fd.as_raw_fd());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Reaper {
    /// A reaper not stopped yet (its owner failed before using it) is stopped before its
    /// eventfd closes.
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop();
        }
    }
}

/// Adds one to the eventfd's counter (wakes the reaper).
fn signal(fd: RawFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: eight readable bytes, the size an eventfd write takes.
    let _ = unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
}

/// The reaper thread: waits for the eventfd (at most [`WAIT_MS`] at a time), resets it, and
/// drains the image's completion queue, until told to stop.
fn reap(api: &'static Api, events: Events, image: &Image, fd: RawFd, stop: &AtomicBool) {
    let mut comps: [RbdCompletionT; BATCH] = [std::ptr::null_mut(); BATCH];
    let mut more = false;
    loop {
        if !more {
            wait(fd);
        }
        // Read after the wait: the stop flag is set before the eventfd is signalled.
        let stopping = stop.load(Ordering::Acquire);
        more = drain(api, events, image.0, &mut comps);
        if stopping {
            return;
        }
    }
}

/// Waits until the eventfd is readable or [`WAIT_MS`] passed, and resets its counter. The
/// counter is reset before the queue is drained, so a completion queued after the drain
/// began signals again and is not missed.
fn wait(fd: RawFd) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, WAIT_MS) };
    if n > 0 {
        let mut buf = [0u8; 8];
        // SAFETY: eight writable bytes; the descriptor is non-blocking (EAGAIN is harmless).
        let _ = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    }
}

/// Reaps queued completions, [`BATCH`] at a time, at most [`MAX_BATCHES`] calls; true when
/// the last call filled the whole batch (more may be queued).
fn drain(
    api: &'static Api,
    events: Events,
    image: RbdImageT,
    comps: &mut [RbdCompletionT; BATCH],
) -> bool {
    for _ in 0..MAX_BATCHES {
        // SAFETY: an open image and room for BATCH completion handles.
        let n = unsafe { (events.rbd_poll_io_events)(image, comps.as_mut_ptr(), BATCH as c_int) };
        let n = usize::try_from(n).unwrap_or(0).min(BATCH);
        for &c in &comps[..n] {
            // SAFETY: `c` is a completed AIO of this image, handed out once by librbd; its
            // argument is the OpContext `issue` leaked for it, and it is released just after
            // its result is read.
            let (arg, ret) = unsafe {
                let arg = (events.rbd_aio_get_arg)(c);
                let ret = (api.rbd_aio_get_return_value)(c);
                (api.rbd_aio_release)(c);
                (arg, ret)
            };
            // SAFETY: the completion was created with a null callback and this context, so
            // only this reap reclaims it, exactly once.
            crate::complete(*unsafe { Box::from_raw(arg.cast::<OpContext>()) }, ret);
        }
        if n < BATCH {
            return false;
        }
    }
    true
}
