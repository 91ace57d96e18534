//! Our bindings of the part of librados' and librbd's C API (Ceph 16, librbd 1.16) the
//! backend uses, resolved from `librados.so.2` and `librbd.so.1` at run time.

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use libloading::Library;

pub type RadosT = *mut c_void;
pub type RadosIoctxT = *mut c_void;
pub type RbdImageT = *mut c_void;
pub type RbdCompletionT = *mut c_void;
pub type RbdCallbackT = unsafe extern "C" fn(c: RbdCompletionT, arg: *mut c_void);
pub type RbdUpdateCallbackT = unsafe extern "C" fn(arg: *mut c_void);
pub type RadosWriteOpT = *mut c_void;
pub type RadosReadOpT = *mut c_void;

/// librbd.h's `RBD_LOCK_MODE_EXCLUSIVE` (`rbd_lock_mode_t`).
pub const RBD_LOCK_MODE_EXCLUSIVE: c_int = 0;
/// librados.h's `LIBRADOS_CREATE_EXCLUSIVE`: `rados_write_op_create` fails (EEXIST) when the
/// object exists.
pub const LIBRADOS_CREATE_EXCLUSIVE: c_int = 1;

/// The library names the backend loads (the sonames Debian's librados2 and librbd1 ship).
pub const RADOS_LIB: &str = "librados.so.2";
pub const RBD_LIB: &str = "librbd.so.1";

/// Function pointers into the loaded libraries, which stay loaded as long as this lives.
pub struct Api {
    pub rados_create: unsafe extern "C" fn(*mut RadosT, *const c_char) -> c_int,
    pub rados_conf_read_file: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
    pub rados_conf_set: unsafe extern "C" fn(RadosT, *const c_char, *const c_char) -> c_int,
    pub rados_connect: unsafe extern "C" fn(RadosT) -> c_int,
    pub rados_shutdown: unsafe extern "C" fn(RadosT),
    pub rados_ioctx_create: unsafe extern "C" fn(RadosT, *const c_char, *mut RadosIoctxT) -> c_int,
    pub rados_ioctx_destroy: unsafe extern "C" fn(RadosIoctxT),
    pub rados_ioctx_set_namespace: unsafe extern "C" fn(RadosIoctxT, *const c_char),
    pub rbd_create: unsafe extern "C" fn(RadosIoctxT, *const c_char, u64, *mut c_int) -> c_int,
    pub rbd_open:
        unsafe extern "C" fn(RadosIoctxT, *const c_char, *mut RbdImageT, *const c_char) -> c_int,
    pub rbd_close: unsafe extern "C" fn(RbdImageT) -> c_int,
    pub rbd_get_size: unsafe extern "C" fn(RbdImageT, *mut u64) -> c_int,
    /// A `None` callback is librbd's NULL: the completion is then only reported through the
    /// image's event notification ([`Api::events`]).
    pub rbd_aio_create_completion:
        unsafe extern "C" fn(*mut c_void, Option<RbdCallbackT>, *mut RbdCompletionT) -> c_int,
    pub rbd_aio_get_return_value: unsafe extern "C" fn(RbdCompletionT) -> isize,
    pub rbd_aio_release: unsafe extern "C" fn(RbdCompletionT),
    pub rbd_aio_readv:
        unsafe extern "C" fn(RbdImageT, *const libc::iovec, c_int, u64, RbdCompletionT) -> c_int,
    pub rbd_aio_writev:
        unsafe extern "C" fn(RbdImageT, *const libc::iovec, c_int, u64, RbdCompletionT) -> c_int,
    pub rbd_aio_flush: unsafe extern "C" fn(RbdImageT, RbdCompletionT) -> c_int,
    pub rbd_aio_discard: unsafe extern "C" fn(RbdImageT, u64, u64, RbdCompletionT) -> c_int,
    pub rbd_aio_write_zeroes:
        unsafe extern "C" fn(RbdImageT, u64, usize, RbdCompletionT, c_int, c_int) -> c_int,
    pub rbd_aio_compare_and_write: unsafe extern "C" fn(
        RbdImageT,
        u64,
        usize,
        *const c_char,
        *const c_char,
        RbdCompletionT,
        *mut u64,
        c_int,
    ) -> isize,
    pub rbd_update_watch:
        unsafe extern "C" fn(RbdImageT, *mut u64, RbdUpdateCallbackT, *mut c_void) -> c_int,
    pub rbd_update_unwatch: unsafe extern "C" fn(RbdImageT, u64) -> c_int,
    /// The image's managed exclusive lock (module `owner`).
    pub lock: Lock,
    /// Compare-and-swap of one object (module `blob`).
    pub objects: Objects,
    /// Completion by event notification, when this librbd has it (see [`Events`]).
    pub events: Option<Events>,
    _rados: Library,
    _rbd: Library,
}

/// The functions of librbd's completion-by-notification API: with an eventfd set on an image
/// (`rbd_set_image_notification`), every AIO on it that completes is queued for
/// `rbd_poll_io_events` and the eventfd is signalled (a completion with a callback gets both).
#[derive(Clone, Copy)]
pub struct Events {
    pub rbd_set_image_notification: unsafe extern "C" fn(RbdImageT, c_int, c_int) -> c_int,
    pub rbd_poll_io_events: unsafe extern "C" fn(RbdImageT, *mut RbdCompletionT, c_int) -> c_int,
    pub rbd_aio_get_arg: unsafe extern "C" fn(RbdCompletionT) -> *mut c_void,
}

/// librbd's managed exclusive lock and what fencing needs of librados: the lock owners are
/// named by their clients' addresses, which `rados_getaddrs` gives for this client.
#[derive(Clone, Copy)]
pub struct Lock {
    pub rbd_is_exclusive_lock_owner: unsafe extern "C" fn(RbdImageT, *mut c_int) -> c_int,
    pub rbd_lock_acquire: unsafe extern "C" fn(RbdImageT, c_int) -> c_int,
    pub rbd_lock_release: unsafe extern "C" fn(RbdImageT) -> c_int,
    pub rbd_lock_get_owners:
        unsafe extern "C" fn(RbdImageT, *mut c_int, *mut *mut c_char, *mut usize) -> c_int,
    pub rbd_lock_get_owners_cleanup: unsafe extern "C" fn(*mut *mut c_char, usize),
    pub rbd_lock_break: unsafe extern "C" fn(RbdImageT, c_int, *const c_char) -> c_int,
    pub rados_getaddrs: unsafe extern "C" fn(RadosT, *mut *mut c_char) -> c_int,
    pub rados_buffer_free: unsafe extern "C" fn(*mut c_char),
    #[allow(clippy::type_complexity)]
    pub rados_mon_command: unsafe extern "C" fn(
        RadosT,
        *const *const c_char,
        usize,
        *const c_char,
        usize,
        *mut *mut c_char,
        *mut usize,
        *mut *mut c_char,
        *mut usize,
    ) -> c_int,
}

/// librados' compound object operations, for a record replaced by compare-and-swap on the
/// object's version.
#[derive(Clone, Copy)]
pub struct Objects {
    pub rados_create_write_op: unsafe extern "C" fn() -> RadosWriteOpT,
    pub rados_release_write_op: unsafe extern "C" fn(RadosWriteOpT),
    pub rados_write_op_assert_version: unsafe extern "C" fn(RadosWriteOpT, u64),
    pub rados_write_op_create: unsafe extern "C" fn(RadosWriteOpT, c_int, *const c_char),
    pub rados_write_op_write_full: unsafe extern "C" fn(RadosWriteOpT, *const c_char, usize),
    pub rados_write_op_operate: unsafe extern "C" fn(
        RadosWriteOpT,
        RadosIoctxT,
        *const c_char,
        *mut libc::time_t,
        c_int,
    ) -> c_int,
    pub rados_create_read_op: unsafe extern "C" fn() -> RadosReadOpT,
    pub rados_release_read_op: unsafe extern "C" fn(RadosReadOpT),
    pub rados_read_op_stat:
        unsafe extern "C" fn(RadosReadOpT, *mut u64, *mut libc::time_t, *mut c_int),
    pub rados_read_op_read:
        unsafe extern "C" fn(RadosReadOpT, u64, usize, *mut c_char, *mut usize, *mut c_int),
    pub rados_read_op_operate:
        unsafe extern "C" fn(RadosReadOpT, RadosIoctxT, *const c_char, c_int) -> c_int,
    pub rados_get_last_version: unsafe extern "C" fn(RadosIoctxT) -> u64,
}

/// `rbd_set_image_notification`'s type for an eventfd (librbd.h's `EVENT_TYPE_EVENTFD`).
pub const EVENT_TYPE_EVENTFD: c_int = 2;

/// Resolves `name` in `lib` as a value of type `T` (a function pointer type).
///
/// # Safety
/// `T` must be the C function's true signature.
unsafe fn sym<T: Copy>(lib: &Library, name: &str, soname: &str) -> Result<T, String> {
    // SAFETY: the caller guarantees T is the symbol's signature; the pointer is only used
    // while `lib` stays loaded (Api keeps it).
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("{soname} lacks {name} (Ceph 16 or newer is needed): {e}"))
}

impl Api {
    /// Loads the two libraries by name; the error is one line saying what to install.
    pub fn load_from(rados: &str, rbd: &str) -> Result<Api, String> {
        let open = |soname: &str, package: &str| {
            // SAFETY: loading runs the library's initialisers; librados and librbd are
            // ordinary shared libraries whose initialisers have no preconditions.
            unsafe { Library::new(soname) }.map_err(|e| {
                format!("cannot load {soname} ({e}): install {package} (apt-get install {package}) to serve RBD LUNs")
            })
        };
        let rados_lib = open(rados, "librados2")?;
        let rbd_lib = open(rbd, "librbd1")?;
        // SAFETY: every type below is the C prototype from librados.h / librbd.h of
        // Ceph 16 (librbd 1.16), transcribed by hand.
        unsafe {
            Ok(Api {
                rados_create: sym(&rados_lib, "rados_create", rados)?,
                rados_conf_read_file: sym(&rados_lib, "rados_conf_read_file", rados)?,
                rados_conf_set: sym(&rados_lib, "rados_conf_set", rados)?,
                rados_connect: sym(&rados_lib, "rados_connect", rados)?,
                rados_shutdown: sym(&rados_lib, "rados_shutdown", rados)?,
                rados_ioctx_create: sym(&rados_lib, "rados_ioctx_create", rados)?,
                rados_ioctx_destroy: sym(&rados_lib, "rados_ioctx_destroy", rados)?,
                rados_ioctx_set_namespace: sym(&rados_lib, "rados_ioctx_set_namespace", rados)?,
                rbd_create: sym(&rbd_lib, "rbd_create", rbd)?,
                rbd_open: sym(&rbd_lib, "rbd_open", rbd)?,
                rbd_close: sym(&rbd_lib, "rbd_close", rbd)?,
                rbd_get_size: sym(&rbd_lib, "rbd_get_size", rbd)?,
                rbd_aio_create_completion: sym(&rbd_lib, "rbd_aio_create_completion", rbd)?,
                rbd_aio_get_return_value: sym(&rbd_lib, "rbd_aio_get_return_value", rbd)?,
                rbd_aio_release: sym(&rbd_lib, "rbd_aio_release", rbd)?,
                rbd_aio_readv: sym(&rbd_lib, "rbd_aio_readv", rbd)?,
                rbd_aio_writev: sym(&rbd_lib, "rbd_aio_writev", rbd)?,
                rbd_aio_flush: sym(&rbd_lib, "rbd_aio_flush", rbd)?,
                rbd_aio_discard: sym(&rbd_lib, "rbd_aio_discard", rbd)?,
                rbd_aio_write_zeroes: sym(&rbd_lib, "rbd_aio_write_zeroes", rbd)?,
                rbd_aio_compare_and_write: sym(&rbd_lib, "rbd_aio_compare_and_write", rbd)?,
                rbd_update_watch: sym(&rbd_lib, "rbd_update_watch", rbd)?,
                rbd_update_unwatch: sym(&rbd_lib, "rbd_update_unwatch", rbd)?,
                lock: Lock {
                    rbd_is_exclusive_lock_owner: sym(&rbd_lib, "rbd_is_exclusive_lock_owner", rbd)?,
                    rbd_lock_acquire: sym(&rbd_lib, "rbd_lock_acquire", rbd)?,
                    rbd_lock_release: sym(&rbd_lib, "rbd_lock_release", rbd)?,
                    rbd_lock_get_owners: sym(&rbd_lib, "rbd_lock_get_owners", rbd)?,
                    rbd_lock_get_owners_cleanup: sym(&rbd_lib, "rbd_lock_get_owners_cleanup", rbd)?,
                    rbd_lock_break: sym(&rbd_lib, "rbd_lock_break", rbd)?,
                    rados_getaddrs: sym(&rados_lib, "rados_getaddrs", rados)?,
                    rados_buffer_free: sym(&rados_lib, "rados_buffer_free", rados)?,
                    rados_mon_command: sym(&rados_lib, "rados_mon_command", rados)?,
                },
                objects: Objects {
                    rados_create_write_op: sym(&rados_lib, "rados_create_write_op", rados)?,
                    rados_release_write_op: sym(&rados_lib, "rados_release_write_op", rados)?,
                    rados_write_op_assert_version: sym(
                        &rados_lib,
                        "rados_write_op_assert_version",
                        rados,
                    )?,
                    rados_write_op_create: sym(&rados_lib, "rados_write_op_create", rados)?,
                    rados_write_op_write_full: sym(&rados_lib, "rados_write_op_write_full", rados)?,
                    rados_write_op_operate: sym(&rados_lib, "rados_write_op_operate", rados)?,
                    rados_create_read_op: sym(&rados_lib, "rados_create_read_op", rados)?,
                    rados_release_read_op: sym(&rados_lib, "rados_release_read_op", rados)?,
                    rados_read_op_stat: sym(&rados_lib, "rados_read_op_stat", rados)?,
                    rados_read_op_read: sym(&rados_lib, "rados_read_op_read", rados)?,
                    rados_read_op_operate: sym(&rados_lib, "rados_read_op_operate", rados)?,
                    rados_get_last_version: sym(&rados_lib, "rados_get_last_version", rados)?,
                },
                // Optional: without them, completions come by callback only.
                events: (|| {
                    Ok::<_, String>(Events {
                        rbd_set_image_notification: sym(
                            &rbd_lib,
                            "rbd_set_image_notification",
                            rbd,
                        )?,
                        rbd_poll_io_events: sym(&rbd_lib, "rbd_poll_io_events", rbd)?,
                        rbd_aio_get_arg: sym(&rbd_lib, "rbd_aio_get_arg", rbd)?,
                    })
                })()
                .ok(),
                _rados: rados_lib,
                _rbd: rbd_lib,
            })
        }
    }

    /// The process-wide API, loaded on first use (and the same error every time after a
    /// failed load).
    pub fn get() -> Result<&'static Api, String> {
        static API: OnceLock<Result<Api, String>> = OnceLock::new();
        API.get_or_init(|| Api::load_from(RADOS_LIB, RBD_LIB))
            .as_ref()
            .map_err(Clone::clone)
    }
}
