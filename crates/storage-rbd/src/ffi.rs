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
