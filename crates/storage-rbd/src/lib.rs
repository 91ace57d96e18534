//! Ceph RBD images as ironsan LUN backends. One job: serve [`storage::Backend`] from an RBD
//! image through librbd's asynchronous C API, with bindings of our own ([`ffi`]) resolved from
//! `librbd.so.1` and `librados.so.2` at run time, so that builds need no Ceph headers and a
//! host without librbd gets a one-line message saying what to install.
//!
//! Every I/O is one librbd AIO whose result goes into a oneshot channel the awaiting task
//! holds: no thread per command. How librbd reports completions is the LUN's `completions`
//! ([`Completions`]): by default through an eventfd, reaped in batches by one thread per
//! image (module `reap`); else (or with a librbd lacking that API) by a callback on librbd's
//! thread for each (COMPARE AND WRITE always so: librbd does not queue it for polling).
//! Buffers an operation reads into or writes from belong to the completion until it is
//! reaped, so a task dropped mid-operation never leaves librbd with freed memory. A FUA write
//! is a write and then an `rbd_aio_flush` (librbd's cache acknowledges writes before they
//! are durable). A resize of the image by anyone (seen through `rbd_update_watch`) changes
//! [`Backend::size`].
//!
//! Several gateways may serve one image. Which one writes is decided by the image's
//! exclusive lock in librbd's managed mode ([`RbdOwner`], the backend's
//! [`Backend::exclusive_owner`]): a gateway that takes over breaks the owner's lock, which
//! blocklists the owner's RADOS client (fencing it), so writes it still had in flight can
//! never land after the new owner's. A fenced gateway's I/O fails with an error
//! [`is_fenced`] recognises (one log line); it serves again on a new client once asked
//! ([`RbdOwner::recover`]) or once its blocklist entry is gone. The gateways keep a small
//! shared record (persistent reservations) in a RADOS object beside the image, replaced by
//! compare-and-swap ([`RadosBlob`], the backend's [`Backend::shared_state`]).

mod blob;
pub mod ffi;
mod owner;
mod reap;

use std::ffi::{c_int, c_void, CString};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use storage::{Backend, ExclusiveOwner, MapRun, SharedBlob};
use tokio::sync::oneshot;

use ffi::{Api, RadosIoctxT, RadosT, RbdCompletionT, RbdImageT};

pub use blob::RadosBlob;
pub use owner::{is_fenced, RbdOwner, RECOVER_CHECK_SECS};

/// Where an RBD LUN's image is, as configured
/// (`backend = { type = "rbd", pool = "rbd", image = "disk1" }`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RbdSpec {
    pub pool: String,
    pub image: String,
    /// The Ceph configuration file (default [`DEFAULT_CONF`]).
    pub conf: Option<PathBuf>,
    /// The client id (`admin` for client.admin); librados' default when left out.
    pub user: Option<String>,
    /// The RADOS namespace of the image within its pool.
    pub namespace: Option<String>,
    /// Create the image (of the LUN's `size`) when it does not exist.
    #[serde(default)]
    pub create: bool,
    /// How librbd reports completed I/O.
    #[serde(default)]
    pub completions: Completions,
}

/// How librbd reports completed I/O to the backend (`completions = "eventfd"` in the LUN's
/// backend table).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Completions {
    /// Through an eventfd per image, reaped in batches by one thread (`rbd_poll_io_events`);
    /// a librbd without that API falls back to callbacks.
    #[default]
    Eventfd,
    /// A callback per completion on librbd's thread.
    Callback,
}

/// The Ceph configuration file used when `conf` is left out.
pub const DEFAULT_CONF: &str = "/etc/ceph/ceph.conf";

/// Seconds a monitor or OSD operation may take before librados fails it (ETIMEDOUT): a
/// cluster lost during I/O fails commands after this long instead of hanging them.
pub const OP_TIMEOUT_SECS: u64 = 30;
/// Seconds connecting to the monitors may take at start.
pub const CONNECT_TIMEOUT_SECS: u64 = 10;

impl RbdSpec {
    /// `pool/namespace/image` as `rbd` writes it, for messages.
    pub fn display_name(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/{ns}/{}", self.pool, self.image),
            None => format!("{}/{}", self.pool, self.image),
        }
    }

    /// The configuration file this spec reads.
    pub fn conf_path(&self) -> &Path {
        self.conf.as_deref().unwrap_or(Path::new(DEFAULT_CONF))
    }
}

/// The cluster connection, pool context and open image; closed in reverse order on drop,
/// after every operation holding a reference has completed.
struct Handles {
    api: &'static Api,
    cluster: RadosT,
    ioctx: RadosIoctxT,
    image: RbdImageT,
    /// The eventfd reaper, when completions come that way (else by callback).
    reaper: Option<reap::Reaper>,
    /// This client's address, which names it as a lock owner (and in the blocklist).
    addr: String,
    /// Set when an operation found this client blocklisted (fenced): logged once.
    fenced: AtomicBool,
    /// The backend's shared state, told when this client is found fenced.
    shared: Weak<Shared>,
}

// SAFETY: librados and librbd handles may be used from any thread, and librbd's C API is
// safe to call concurrently on one image (its ImageCtx does its own locking).
unsafe impl Send for Handles {}
// SAFETY: as for Send: every call through a shared handle is thread-safe in librbd.
unsafe impl Sync for Handles {}

impl Drop for Handles {
    fn drop(&mut self) {
        // No operation is in flight (each holds a reference): the reaper can stop first. Its
        // eventfd is closed after the image (the field drops after this body).
        if let Some(r) = &mut self.reaper {
            r.stop();
        }
        // SAFETY: each handle was created by the matching open call, is non-null once set,
        // and is released exactly once, here, when no operation refers to it any more.
        unsafe {
            if !self.image.is_null() {
                (self.api.rbd_close)(self.image);
            }
            if !self.ioctx.is_null() {
                (self.api.rados_ioctx_destroy)(self.ioctx);
            }
            if !self.cluster.is_null() {
                (self.api.rados_shutdown)(self.cluster);
            }
        }
    }
}

fn cstring(what: &str, s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} {s:?} contains a NUL byte"),
        )
    })
}

fn errno(ret: i64) -> io::Error {
    io::Error::from_raw_os_error((-ret) as i32)
}

/// Connects to the cluster of `spec` and opens (or creates) its image.
fn connect(
    api: &'static Api,
    spec: &RbdSpec,
    size: Option<u64>,
    shared: Weak<Shared>,
) -> io::Result<Handles> {
    let name = spec.display_name();
    let err = |what: String, ret: c_int| {
        let e = errno(ret as i64);
        io::Error::new(e.kind(), format!("rbd image {name}: {what}: {e}"))
    };
    let mut h = Handles {
        api,
        cluster: std::ptr::null_mut(),
        ioctx: std::ptr::null_mut(),
        image: std::ptr::null_mut(),
        reaper: None,
        addr: String::new(),
        fenced: AtomicBool::new(false),
        shared,
    };
    let user = spec
        .user
        .as_deref()
        .map(|u| cstring("user", u))
        .transpose()?;
    let conf = cstring("conf", &spec.conf_path().to_string_lossy())?;
    let pool = cstring("pool", &spec.pool)?;
    let image = cstring("image", &spec.image)?;
    // SAFETY: out-pointer to our handle; `user` is a NUL-terminated string or null
    // (librados' default id), both valid for the call.
    let r = unsafe {
        (api.rados_create)(
            &mut h.cluster,
            user.as_ref().map_or(std::ptr::null(), |u| u.as_ptr()),
        )
    };
    if r < 0 {
        return Err(err("cannot create a cluster handle".into(), r));
    }
    // SAFETY: a created cluster handle and a NUL-terminated path.
    let r = unsafe { (api.rados_conf_read_file)(h.cluster, conf.as_ptr()) };
    if r < 0 {
        return Err(err(
            format!(
                "cannot read the Ceph configuration {} (set conf = \"...\")",
                spec.conf_path().display()
            ),
            r,
        ));
    }
    let settings = [
        ("client_mount_timeout", CONNECT_TIMEOUT_SECS.to_string()),
        ("rados_mon_op_timeout", OP_TIMEOUT_SECS.to_string()),
        ("rados_osd_op_timeout", OP_TIMEOUT_SECS.to_string()),
        // Unmapped ranges must read back as zeroes, however small the discard.
        ("rbd_skip_partial_discard", "false".to_string()),
        // Breaking another gateway's exclusive lock fences it (module `owner`), whatever
        // the configuration file says.
        ("rbd_blocklist_on_break_lock", "true".to_string()),
    ];
    for (key, value) in settings {
        let (k, v) = (cstring("option", key)?, cstring("value", &value)?);
        // SAFETY: a created, not yet connected cluster handle and NUL-terminated strings.
        let r = unsafe { (api.rados_conf_set)(h.cluster, k.as_ptr(), v.as_ptr()) };
        if r < 0 {
            return Err(err(format!("cannot set {key}"), r));
        }
    }
    // SAFETY: a configured cluster handle.
    let r = unsafe { (api.rados_connect)(h.cluster) };
    if r < 0 {
        // NotConnected marks the one failure that is worth retrying (see RbdBackend::open).
        return Err(io::Error::new(
            io::ErrorKind::NotConnected,
            format!(
                "rbd image {name}: cannot reach the cluster of {} within {CONNECT_TIMEOUT_SECS} s: {}",
                spec.conf_path().display(),
                errno(r as i64)
            ),
        ));
    }
    h.addr = owner::client_addr(api, h.cluster)
        .map_err(|e| io::Error::new(e.kind(), format!("rbd image {name}: {e}")))?;
    // SAFETY: a connected cluster handle, a NUL-terminated pool name, an out-pointer.
    let r = unsafe { (api.rados_ioctx_create)(h.cluster, pool.as_ptr(), &mut h.ioctx) };
    if r < 0 {
        return Err(err(
            format!("pool {:?} cannot be opened (does it exist?)", spec.pool),
            r,
        ));
    }
    if let Some(ns) = &spec.namespace {
        let ns = cstring("namespace", ns)?;
        // SAFETY: a valid ioctx and a NUL-terminated namespace, copied by librados.
        unsafe { (api.rados_ioctx_set_namespace)(h.ioctx, ns.as_ptr()) };
    }
    // SAFETY: a valid ioctx, NUL-terminated image name, out-pointer, null snapshot (head).
    let mut r = unsafe { (api.rbd_open)(h.ioctx, image.as_ptr(), &mut h.image, std::ptr::null()) };
    if r == -libc::ENOENT && spec.create {
        let Some(size) = size else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("rbd image {name} does not exist and cannot be created without a size (set size = \"...\")"),
            ));
        };
        let mut order: c_int = 0; // librbd's default object size
                                  // SAFETY: a valid ioctx, NUL-terminated name, an out-pointer for the order.
        let c = unsafe { (api.rbd_create)(h.ioctx, image.as_ptr(), size, &mut order) };
        if c < 0 {
            return Err(err("cannot create the image".into(), c));
        }
        tracing::info!(image = %name, size, "created rbd image");
        // SAFETY: as for the first rbd_open.
        r = unsafe { (api.rbd_open)(h.ioctx, image.as_ptr(), &mut h.image, std::ptr::null()) };
    }
    if r == -libc::ENOENT {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("rbd image {name} does not exist (create it with `rbd create {name} --size SIZE`, or set create = true and size)"),
        ));
    }
    if r < 0 {
        return Err(err("cannot open the image".into(), r));
    }
    h.reaper = start_reaper(api, spec, h.image);
    Ok(h)
}

/// The eventfd reaper of an open image when `spec` asks for one and librbd can; else None
/// (completions by callback), with a log line saying why when it was asked for.
fn start_reaper(api: &'static Api, spec: &RbdSpec, image: RbdImageT) -> Option<reap::Reaper> {
    if spec.completions != Completions::Eventfd {
        return None;
    }
    let Some(events) = api.events else {
        tracing::info!(image = %spec.display_name(), "this librbd lacks rbd_poll_io_events: completions by callback");
        return None;
    };
    match reap::Reaper::start(api, events, image) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(image = %spec.display_name(), "no eventfd completions ({e}): completions by callback");
            None
        }
    }
}

/// Reads the image's current size.
fn image_size(h: &Handles) -> io::Result<u64> {
    let mut size = 0u64;
    // SAFETY: an open image and an out-pointer.
    let r = unsafe { (h.api.rbd_get_size)(h.image, &mut size) };
    if r < 0 {
        return Err(errno(r as i64));
    }
    Ok(size)
}

/// Memory an operation reads into or writes from, owned by its completion until it fires.
enum OpBuf {
    None,
    /// Empty, with room for the read of `len` bytes: librbd fills that much of its spare
    /// capacity, and only the bytes it reports read become the buffer's (see `read_at`),
    /// so nothing is zeroed first.
    Read {
        buf: BytesMut,
        len: usize,
    },
    Write(Bytes),
    /// COMPARE AND WRITE: the bytes to compare, the bytes to write.
    CompareAndWrite(Bytes, Bytes),
}

/// What `issue` gives the function that starts an operation: pointers into memory the
/// operation's context owns until its completion fires.
struct OpArgs {
    /// The data read into or written from.
    iov: libc::iovec,
    /// The compare half of a COMPARE AND WRITE (null otherwise).
    compare: *const u8,
    /// Where librbd reports a COMPARE AND WRITE's first differing byte.
    mismatch: *mut u64,
}

/// What a completion hands back to the task awaiting it.
struct Completed {
    ret: isize,
    buf: OpBuf,
    /// A COMPARE AND WRITE's first differing byte, as librbd reported it.
    mismatch: u64,
}

/// What a completion carries for one operation (its argument), reclaimed when it completes.
struct OpContext {
    tx: oneshot::Sender<Completed>,
    buf: OpBuf,
    /// Keeps the image open until librbd is done with the operation.
    handles: Arc<Handles>,
    mismatch: u64,
}

/// librbd's completion callback (callback mode): hands the result and the buffer back to the
/// awaiting task.
unsafe extern "C" fn on_complete(c: RbdCompletionT, arg: *mut c_void) {
    // SAFETY: `arg` is the Box<OpContext> that `submit` leaked for this completion; librbd
    // calls back exactly once per completion, so the box is reclaimed exactly once.
    let ctx = unsafe { Box::from_raw(arg.cast::<OpContext>()) };
    let api = ctx.handles.api;
    // SAFETY: `c` is this operation's completion, valid until released just below.
    let ret = unsafe { (api.rbd_aio_get_return_value)(c) };
    // SAFETY: released once; librbd no longer refers to it after the callback returns.
    unsafe { (api.rbd_aio_release)(c) };
    complete(*ctx, ret);
}

/// Hands an operation's result `ret` and its buffer back to the awaiting task; on librbd's
/// callback thread or the image's reaper thread.
fn complete(ctx: OpContext, ret: isize) {
    let OpContext {
        tx,
        buf,
        handles,
        mismatch,
    } = ctx;
    if ret == -(libc::ESHUTDOWN as isize) {
        handles.note_fenced();
    }
    // The awaiting task may be gone (aborted command): the result is then dropped.
    let _ = tx.send(Completed { ret, buf, mismatch });
    // When this operation holds the last reference (its backend was dropped while it ran),
    // closing the image and shutting the cluster connection down here, on librbd's own
    // callback thread or the reaper (which the close joins), would wait for this very
    // thread: another thread does it. Should no
    // thread start, the handles are leaked rather than closed in place.
    if let Some(last) = Arc::into_inner(handles) {
        let last = std::mem::ManuallyDrop::new(last);
        let _ = std::thread::Builder::new()
            .name("rbd-close".into())
            .spawn(move || drop(std::mem::ManuallyDrop::into_inner(last)));
    }
}

/// Longest a task waits for a completion: librados fails a stuck operation after
/// [`OP_TIMEOUT_SECS`]; this bounds the wait should it not.
const COMPLETION_WAIT: Duration = Duration::from_secs(2 * OP_TIMEOUT_SECS + 5);

/// A RBD image serving as a LUN's backend.
pub struct RbdBackend {
    shared: Arc<Shared>,
}

/// What the backend, its [`RbdOwner`] and its [`RadosBlob`] share: the image's connection,
/// replaced when a fenced gateway reconnects.
struct Shared {
    api: &'static Api,
    spec: RbdSpec,
    /// The configured size, if any.
    want: Option<u64>,
    /// The open image, once the cluster was reached (until then the LUN is NOT READY); a
    /// new one after [`RbdOwner::recover`].
    conn: RwLock<Option<Arc<Connection>>>,
    /// Held while a connection is replaced, so that two recoveries never race.
    reconnecting: Mutex<()>,
    /// The LUN's size in bytes, updated when a resize of the image is seen.
    size: Arc<AtomicU64>,
    /// The client addresses this gateway had, the current one last ([`RbdOwner`]'s id).
    ids: owner::Ids,
}

impl Shared {
    /// The current connection, or the error a command meets while the cluster was never
    /// reached.
    fn connection(&self) -> io::Result<Arc<Connection>> {
        match &*self.conn.read().unwrap_or_else(|e| e.into_inner()) {
            Some(c) => Ok(c.clone()),
            None => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!(
                    "rbd image {}: cluster not reached yet",
                    self.spec.display_name()
                ),
            )),
        }
    }

    /// Makes `conn` the current connection (dropping the one it replaces, if any).
    fn install(&self, conn: Connection) {
        self.ids.push(&conn.handles.addr);
        let old = self
            .conn
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .replace(Arc::new(conn));
        drop(old);
    }

    /// The error an operation that librbd failed with `ret` returns: fencing and a write
    /// refused to a non-owner get errors of their own (see [`is_fenced`]).
    fn op_error(&self, ret: i64) -> io::Error {
        match -ret as i32 {
            libc::ESHUTDOWN => owner::fenced_error(&self.spec),
            libc::EROFS => io::Error::new(
                io::ErrorKind::ReadOnlyFilesystem,
                format!(
                    "rbd image {}: another gateway holds the image's exclusive lock (this one may not write)",
                    self.spec.display_name()
                ),
            ),
            _ => errno(ret),
        }
    }
}

impl Handles {
    /// Records that this client was found blocklisted: the backend logs it once and starts
    /// watching for the entry's removal ([`owner::watch_blocklist`], on a thread of its own:
    /// this may run on librbd's callback thread).
    fn note_fenced(&self) {
        if !self.fenced.swap(true, Ordering::AcqRel) {
            owner::watch_blocklist(self.shared.clone(), self.addr.clone());
        }
    }
}

/// An open image and its update watch.
struct Connection {
    handles: Arc<Handles>,
    /// The watch's handle and the leaked sender its callback uses.
    watch: (u64, *mut mpsc::SyncSender<()>),
    /// The thread that re-reads the size; joined on drop, so that the image is closed by
    /// whoever drops the connection and never by that thread while the process exits.
    watcher: Option<std::thread::JoinHandle<()>>,
}

// SAFETY: the raw watch pointer is only dereferenced by librbd's callback (through
// `on_update`) and freed in Drop after the watch is removed; Handles is Send + Sync.
unsafe impl Send for Connection {}
// SAFETY: as for Send; no method touches the watch pointer.
unsafe impl Sync for Connection {}

impl Drop for Connection {
    fn drop(&mut self) {
        let (handle, tx) = self.watch;
        // SAFETY: the handle came from rbd_update_watch on this open image.
        unsafe { (self.handles.api.rbd_update_unwatch)(self.handles.image, handle) };
        // SAFETY: librbd calls `on_update` no more once unwatched: we are the only owner.
        drop(unsafe { Box::from_raw(tx) });
        // The channel is now disconnected: the watcher ends after at most one size query.
        if let Some(t) = self.watcher.take() {
            let _ = t.join();
        }
    }
}

/// librbd's update-watch callback: wakes the thread that re-reads the size. Never blocks.
unsafe extern "C" fn on_update(arg: *mut c_void) {
    // SAFETY: `arg` is the SyncSender leaked by `Connection::open`, freed only after
    // `rbd_update_unwatch` returned (after which librbd no longer calls back).
    let tx = unsafe { &*arg.cast::<mpsc::SyncSender<()>>() };
    let _ = tx.try_send(());
}

/// Seconds between attempts to reach a cluster that was unreachable at start.
pub const RETRY_SECS: u64 = 5;

/// The LUN's size on an image of `image_bytes`: the configured `size`, or the image's when
/// none is configured or the image has shrunk below it (the blocks past its end are gone).
fn lun_bytes(size: Option<u64>, image_bytes: u64) -> u64 {
    size.map_or(image_bytes, |want| want.min(image_bytes))
}

/// The size a LUN reports while its image's size is unknown (cluster unreachable at start,
/// no `size` configured): one 4 KiB block, replaced (with CAPACITY DATA HAS CHANGED) once
/// the image is open.
pub const UNKNOWN_SIZE: u64 = 4096;

impl Connection {
    /// Connects and opens the image; checks it against the configured `size` and returns
    /// the LUN's size with the connection, whose watch keeps `lun_size` current.
    fn open(
        api: &'static Api,
        spec: &RbdSpec,
        size: Option<u64>,
        lun_size: &Arc<AtomicU64>,
        shared: Weak<Shared>,
    ) -> io::Result<Connection> {
        let handles = Arc::new(connect(api, spec, size, shared)?);
        let image_bytes = image_size(&handles)?;
        let bytes = match size {
            Some(want) if want > image_bytes => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "rbd image {} is {image_bytes} bytes, smaller than the configured size {want} (resize it with `rbd resize` or leave size out)",
                        spec.display_name()
                    ),
                ))
            }
            Some(want) => want,
            None => image_bytes,
        };
        let (tx, rx) = mpsc::sync_channel::<()>(1);
        let tx = Box::into_raw(Box::new(tx));
        let mut handle = 0u64;
        // SAFETY: an open image; `on_update` matches rbd_update_callback_t, and `tx` lives
        // until Connection's Drop removes the watch.
        let r = unsafe { (api.rbd_update_watch)(handles.image, &mut handle, on_update, tx.cast()) };
        if r < 0 {
            // SAFETY: the watch was not registered: nobody else holds the pointer.
            drop(unsafe { Box::from_raw(tx) });
            return Err(errno(r as i64));
        }
        let mut conn = Connection {
            handles: handles.clone(),
            watch: (handle, tx),
            watcher: None,
        };
        lun_size.store(bytes, Ordering::Release);
        let lun_size = lun_size.clone();
        let name = spec.display_name();
        // librbd's callback must not wait on the image itself: a thread re-reads the size.
        let watcher = std::thread::Builder::new()
            .name("rbd-watch".into())
            .spawn(move || {
                let mut seen = image_bytes;
                // Ends when the connection's Drop frees the sender (the channel disconnects).
                while rx.recv().is_ok() {
                    match image_size(&handles) {
                        // Other updates (snapshots, metadata) change nothing.
                        Ok(new) if new != seen => {
                            tracing::info!(image = %name, old = seen, new, "rbd image resized");
                            seen = new;
                            lun_size.store(lun_bytes(size, new), Ordering::Release);
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!(image = %name, "cannot read the size after an update: {e}"),
                    }
                }
            })?;
        conn.watcher = Some(watcher);
        Ok(conn)
    }
}

impl RbdBackend {
    /// Connects to the cluster and opens (with `spec.create`, creates) the image.
    ///
    /// `size`: the LUN's size; `None` means the image's size. An image larger than `size`
    /// is used up to `size`; a smaller one is an error, as are a missing pool or image. A
    /// cluster that cannot be reached is not: the backend is returned not ready
    /// ([`Backend::ready`]), with a log line, and a thread tries again every
    /// [`RETRY_SECS`] until it connects or the backend is dropped.
    pub fn open(spec: &RbdSpec, size: Option<u64>) -> io::Result<RbdBackend> {
        let api = Api::get().map_err(|e| io::Error::new(io::ErrorKind::Unsupported, e))?;
        let shared = Arc::new(Shared {
            api,
            spec: spec.clone(),
            want: size,
            conn: RwLock::new(None),
            reconnecting: Mutex::new(()),
            size: Arc::new(AtomicU64::new(size.unwrap_or(UNKNOWN_SIZE))),
            ids: owner::Ids::default(),
        });
        match Connection::open(api, spec, size, &shared.size, Arc::downgrade(&shared)) {
            Ok(c) => shared.install(c),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => {
                tracing::warn!(
                    "{e}: the LUN is NOT READY until it connects; retrying every {RETRY_SECS} s"
                );
                retry_in_background(Arc::downgrade(&shared))?;
            }
            Err(e) => return Err(e),
        }
        Ok(RbdBackend { shared })
    }

    /// How completions of this backend's I/O are reported (None until the cluster was
    /// reached): `spec.completions`, or callbacks where eventfd completions are unavailable.
    pub fn completions(&self) -> Option<Completions> {
        self.shared
            .connection()
            .ok()
            .map(|c| match c.handles.reaper {
                Some(_) => Completions::Eventfd,
                None => Completions::Callback,
            })
    }

    /// The image's exclusive lock as this gateway holds it ([`Backend::exclusive_owner`]).
    pub fn owner(&self) -> RbdOwner {
        RbdOwner::new(self.shared.clone())
    }

    /// The record beside the image that the gateways serving it share
    /// ([`Backend::shared_state`]).
    pub fn blob(&self) -> RadosBlob {
        RadosBlob::new(self.shared.clone())
    }

    /// The open image, or the error a command meets while the cluster was never reached.
    fn handles(&self) -> io::Result<Arc<Handles>> {
        Ok(self.shared.connection()?.handles.clone())
    }

    /// Starts one AIO (`start` issues it with the completion) owning `buf` until it
    /// completes, and awaits its result.
    async fn submit(
        &self,
        buf: OpBuf,
        start: impl FnOnce(RbdImageT, OpArgs, RbdCompletionT) -> c_int,
    ) -> io::Result<Completed> {
        let done = self.wait(self.issue(buf, start)?).await?;
        if done.ret < 0 {
            return Err(self.shared.op_error(done.ret as i64));
        }
        Ok(done)
    }

    /// Awaits a completion, at most [`COMPLETION_WAIT`].
    async fn wait(&self, rx: oneshot::Receiver<Completed>) -> io::Result<Completed> {
        match tokio::time::timeout(COMPLETION_WAIT, rx).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(_)) => Err(io::Error::other("rbd completion dropped")),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "rbd image {}: no completion within {} s",
                    self.shared.spec.display_name(),
                    COMPLETION_WAIT.as_secs()
                ),
            )),
        }
    }

    /// Issues one AIO (`start` issues it with the completion), which owns `buf` until it
    /// completes; the receiver gets its result.
    fn issue(
        &self,
        buf: OpBuf,
        start: impl FnOnce(RbdImageT, OpArgs, RbdCompletionT) -> c_int,
    ) -> io::Result<oneshot::Receiver<Completed>> {
        let handles = self.handles()?;
        if handles.fenced.load(Ordering::Acquire) {
            // A fenced client is never used again, even should its blocklist entry go.
            return Err(owner::fenced_error(&self.shared.spec));
        }
        let api = handles.api;
        let mut buf = buf;
        // The data's address, taken before the buffer moves into the context (moving a
        // BytesMut or Bytes does not move the bytes).
        let (iov, compare) = match &mut buf {
            OpBuf::None => (iovec(std::ptr::null_mut(), 0), std::ptr::null()),
            OpBuf::Read { buf, len } => {
                let room = &mut buf.spare_capacity_mut()[..*len];
                (
                    iovec(room.as_mut_ptr().cast(), room.len()),
                    std::ptr::null(),
                )
            }
            OpBuf::Write(b) => (iovec(b.as_ptr().cast_mut(), b.len()), std::ptr::null()),
            OpBuf::CompareAndWrite(cmp, w) => (iovec(w.as_ptr().cast_mut(), w.len()), cmp.as_ptr()),
        };
        // With a reaper, no callback: the completion is reported through the eventfd only.
        // Except COMPARE AND WRITE: librbd's C function issues it as not natively
        // asynchronous, so it never reaches the event queue (librbd 16), only a callback.
        let callback = match (&handles.reaper, &buf) {
            (Some(_), OpBuf::CompareAndWrite(..)) | (None, _) => {
                Some(on_complete as ffi::RbdCallbackT)
            }
            (Some(_), _) => None,
        };
        let (tx, rx) = oneshot::channel();
        let ctx = Box::into_raw(Box::new(OpContext {
            tx,
            buf,
            handles: handles.clone(),
            mismatch: u64::MAX,
        }));
        // SAFETY: `ctx` is a live allocation; only the field's address is taken.
        let mismatch = unsafe { std::ptr::addr_of_mut!((*ctx).mismatch) };
        let mut c: RbdCompletionT = std::ptr::null_mut();
        // SAFETY: `ctx` stays valid until `on_complete` or the reaper reclaims it; `c` is an
        // out-pointer.
        let r = unsafe { (api.rbd_aio_create_completion)(ctx.cast(), callback, &mut c) };
        if r < 0 {
            // SAFETY: no completion exists, so nothing else holds `ctx`.
            drop(unsafe { Box::from_raw(ctx) });
            return Err(errno(r as i64));
        }
        // From here on `ctx` belongs to the completion (it may complete before `start`
        // returns).
        let r = start(
            handles.image,
            OpArgs {
                iov,
                compare,
                mismatch,
            },
            c,
        );
        if r < 0 {
            // librbd refused the operation and will not report it: release both ourselves.
            // SAFETY: the completion was never handed to an operation.
            unsafe { (api.rbd_aio_release)(c) };
            // SAFETY: no callback will come, so this is the only owner.
            drop(unsafe { Box::from_raw(ctx) });
            if r == -libc::ESHUTDOWN {
                handles.note_fenced();
            }
            return Err(self.shared.op_error(r as i64));
        }
        Ok(rx)
    }

    async fn aio_flush(&self) -> io::Result<()> {
        let api = self.handles()?.api;
        // SAFETY: an open image and a fresh completion.
        self.submit(OpBuf::None, |image, _, c| unsafe {
            (api.rbd_aio_flush)(image, c)
        })
        .await
        .map(drop)
    }
}

/// Tries to open the image every [`RETRY_SECS`] until it opens (then installs the
/// connection, unless a recovery installed one first) or the backend is gone.
fn retry_in_background(shared: Weak<Shared>) -> io::Result<()> {
    std::thread::Builder::new()
        .name("rbd-connect".into())
        .spawn(move || {
            let mut attempt = 1u64;
            loop {
                std::thread::sleep(Duration::from_secs(RETRY_SECS));
                let Some(sh) = shared.upgrade() else { return };
                let name = sh.spec.display_name();
                let _one = sh.reconnecting.lock().unwrap_or_else(|e| e.into_inner());
                if sh.connection().is_ok() {
                    return;
                }
                attempt += 1;
                match Connection::open(sh.api, &sh.spec, sh.want, &sh.size, shared.clone()) {
                    Ok(c) => {
                        sh.install(c);
                        tracing::info!(image = %name, attempt, "rbd image open: the LUN is ready");
                        return;
                    }
                    // Only every tenth failure is logged: the first one said what happens.
                    Err(e) if attempt.is_multiple_of(10) => {
                        tracing::warn!(image = %name, attempt, "still not open: {e}")
                    }
                    Err(_) => {}
                }
            }
        })?;
    Ok(())
}

fn iovec(ptr: *mut u8, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: ptr.cast(),
        iov_len: len,
    }
}

#[async_trait]
impl Backend for RbdBackend {
    fn size(&self) -> u64 {
        self.shared.size.load(Ordering::Acquire)
    }

    fn kind(&self) -> &'static str {
        "rbd"
    }

    fn supports_punch(&self) -> bool {
        true
    }

    fn ready(&self) -> bool {
        self.shared.connection().is_ok()
    }

    fn exclusive_owner(&self) -> Option<Arc<dyn ExclusiveOwner>> {
        Some(Arc::new(self.owner()))
    }

    fn shared_state(&self) -> Option<Arc<dyn SharedBlob>> {
        Some(Arc::new(self.blob()))
    }

    async fn read_at(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        storage::check_range(self.size(), offset, len as u64)?;
        if len == 0 {
            return Ok(Bytes::new());
        }
        let api = self.handles()?.api;
        let done = self
            .submit(
                OpBuf::Read {
                    buf: BytesMut::with_capacity(len),
                    len,
                },
                |image, args, c| {
                    // SAFETY: the iovec points into the spare capacity of the buffer the
                    // completion owns until it fires (librbd copies the iovec array itself
                    // before returning).
                    unsafe { (api.rbd_aio_readv)(image, &args.iov, 1, offset, c) }
                },
            )
            .await?;
        match done.buf {
            OpBuf::Read { buf: mut b, .. } => {
                let filled = usize::try_from(done.ret).unwrap_or(0).min(len);
                // SAFETY: librbd wrote the first `ret` bytes of the spare capacity (the
                // bytes it reports read); nothing exposes the buffer before this length is
                // set, and `filled` is within the capacity.
                unsafe { b.set_len(filled) };
                // A short read (past the image's end after a shrink) reads as zeroes.
                b.resize(len, 0);
                Ok(b.freeze())
            }
            _ => Err(io::Error::other("rbd read completed without its buffer")),
        }
    }

    async fn write_at(&self, offset: u64, data: Bytes, fua: bool) -> io::Result<()> {
        storage::check_range(self.size(), offset, data.len() as u64)?;
        if !data.is_empty() {
            let api = self.handles()?.api;
            self.submit(OpBuf::Write(data), |image, args, c| {
                // SAFETY: librbd only reads through the iovec, which points into the Bytes
                // the completion owns until it fires.
                unsafe { (api.rbd_aio_writev)(image, &args.iov, 1, offset, c) }
            })
            .await?;
        }
        if fua {
            self.aio_flush().await?;
        }
        Ok(())
    }

    async fn flush(&self) -> io::Result<()> {
        self.aio_flush().await
    }

    async fn compare_and_write(
        &self,
        offset: u64,
        compare: Bytes,
        write: Bytes,
        fua: bool,
    ) -> Option<io::Result<Option<u64>>> {
        if compare.len() != write.len() {
            return None;
        }
        if let Err(e) = storage::check_range(self.size(), offset, write.len() as u64) {
            return Some(Err(e));
        }
        let api = match self.handles() {
            Ok(h) => h.api,
            Err(e) => return Some(Err(e)),
        };
        let len = write.len();
        let issued = self.issue(OpBuf::CompareAndWrite(compare, write), |image, args, c| {
            // SAFETY: both buffers and the mismatch word belong to the operation's context
            // until its completion fires; librbd only reads the buffers.
            let r = unsafe {
                (api.rbd_aio_compare_and_write)(
                    image,
                    offset,
                    len,
                    args.compare.cast(),
                    args.iov.iov_base.cast_const().cast(),
                    c,
                    args.mismatch,
                    0,
                )
            };
            r as c_int
        });
        let done = match issued {
            Ok(rx) => self.wait(rx).await,
            Err(e) => Err(e),
        };
        let done = match done {
            Ok(d) => d,
            // librbd (16) refuses ranges longer than one 512-byte sector or across objects:
            // the engine does those itself.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return None,
            Err(e) => return Some(Err(e)),
        };
        if done.ret == -(libc::EILSEQ as isize) {
            // librbd reports the mismatch as an offset in the image.
            let at = done.mismatch.checked_sub(offset).unwrap_or(done.mismatch);
            return Some(Ok(Some(at.min(len as u64 - 1))));
        }
        if done.ret == -(libc::EINVAL as isize) {
            return None;
        }
        if done.ret < 0 {
            return Some(Err(self.shared.op_error(done.ret as i64)));
        }
        if fua {
            if let Err(e) = self.aio_flush().await {
                return Some(Err(e));
            }
        }
        Some(Ok(None))
    }

    async fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        storage::check_range(self.size(), offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let api = self.handles()?.api;
        // SAFETY: an open image and a fresh completion; no buffer.
        self.submit(OpBuf::None, |image, _, c| unsafe {
            (api.rbd_aio_discard)(image, offset, len, c)
        })
        .await
        .map(drop)
    }

    async fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        storage::check_range(self.size(), offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let api = self.handles()?.api;
        // librbd takes a size_t length.
        let len = usize::try_from(len).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "range too long for this host")
        })?;
        // SAFETY: an open image and a fresh completion; no buffer; flags 0.
        self.submit(OpBuf::None, |image, _, c| unsafe {
            (api.rbd_aio_write_zeroes)(image, offset, len, c, 0, 0)
        })
        .await
        .map(drop)
    }

    async fn map_status(&self, offset: u64, len: u64) -> io::Result<MapRun> {
        storage::check_range(self.size(), offset, len)?;
        // Allocation is not queried from the cluster: everything reports mapped.
        Ok(MapRun {
            mapped: true,
            len: len.max(1),
        })
    }
}

#[cfg(test)]
mod tests;
