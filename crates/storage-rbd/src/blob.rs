//! [`RadosBlob`]: the record the gateways of one image share (persistent reservations), as
//! one RADOS object beside the image, `ironsan.shared.<image>` in the image's pool and
//! namespace, replaced whole by compare-and-swap on the object's version.
//!
//! The version is the object's own (its user version, which every write raises): a write
//! asserts the version it read (`rados_write_op_assert_version`) and replaces the data
//! (`rados_write_op_write_full`) in one operation, which the OSD applies atomically or not
//! at all; the first write creates the object exclusively, so two first writers cannot both
//! win. A read takes the size and the data in one operation and the version of what it read.
//! Each call uses an I/O context of its own, whose "last version" is then this call's.

use std::ffi::{c_char, c_int, CString};
use std::fmt;
use std::io;
use std::sync::Arc;

use storage::SharedBlob;

use crate::ffi::{self, RadosIoctxT};
use crate::{errno, owner, Handles, Shared};

/// The prefix of the shared record's object name; the image's name follows it.
pub const OBJECT_PREFIX: &str = "ironsan.shared.";

/// What one read takes before it knows the record's size.
const FIRST_READ: usize = 4096;

/// The shared record beside an RBD image ([`storage::SharedBlob`]); see the module's
/// description. Its calls use the backend's connection (a fenced gateway's fail until it
/// recovers).
pub struct RadosBlob {
    shared: Arc<Shared>,
    oid: CString,
}

impl fmt::Debug for RadosBlob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RadosBlob")
            .field("pool", &self.shared.spec.pool)
            .field("namespace", &self.shared.spec.namespace)
            .field("object", &self.oid)
            .finish()
    }
}

/// An I/O context of its own for one call, destroyed after it.
struct Ctx<'a> {
    h: &'a Handles,
    io: RadosIoctxT,
}

impl Drop for Ctx<'_> {
    fn drop(&mut self) {
        // SAFETY: created by rados_ioctx_create below, destroyed once.
        unsafe { (self.h.api.rados_ioctx_destroy)(self.io) };
    }
}

impl RadosBlob {
    pub(crate) fn new(shared: Arc<Shared>) -> RadosBlob {
        // An image name holds no NUL (it was opened by it), so neither does this.
        let oid = CString::new(format!("{OBJECT_PREFIX}{}", shared.spec.image))
            .unwrap_or_else(|_| c"ironsan.shared.invalid".to_owned());
        RadosBlob { shared, oid }
    }

    /// The object's name.
    pub fn object(&self) -> &str {
        self.oid.to_str().unwrap_or("")
    }

    /// Runs `f` with an I/O context of the image's pool and namespace on the current client.
    fn with_ctx<T>(&self, f: impl FnOnce(&Ctx) -> io::Result<T>) -> io::Result<T> {
        let conn = self.shared.connection()?;
        let h = &conn.handles;
        let spec = &self.shared.spec;
        if h.fenced.load(std::sync::atomic::Ordering::Acquire) {
            return Err(owner::fenced_error(spec));
        }
        let pool = crate::cstring("pool", &spec.pool)?;
        let mut io: RadosIoctxT = std::ptr::null_mut();
        // SAFETY: a connected cluster handle, a NUL-terminated pool name, an out-pointer.
        let r = unsafe { (h.api.rados_ioctx_create)(h.cluster, pool.as_ptr(), &mut io) };
        if r < 0 {
            return Err(self.error(h, "cannot open the pool", r));
        }
        let ctx = Ctx { h, io };
        if let Some(ns) = &spec.namespace {
            let ns = crate::cstring("namespace", ns)?;
            // SAFETY: a valid ioctx and a NUL-terminated namespace, copied by librados.
            unsafe { (h.api.rados_ioctx_set_namespace)(io, ns.as_ptr()) };
        }
        f(&ctx)
    }

    /// The error of a call librados failed with `r`; a blocklisted client is fenced.
    fn error(&self, h: &Handles, what: &str, r: c_int) -> io::Error {
        if r == -libc::ESHUTDOWN {
            h.note_fenced();
            return owner::fenced_error(&self.shared.spec);
        }
        let e = errno(r as i64);
        io::Error::new(
            e.kind(),
            format!("rados object {}: {what}: {e}", self.object()),
        )
    }

    /// One read of at most `room` bytes: `None` when the object does not exist, else its
    /// version, its size and the bytes read.
    fn read_once(&self, ctx: &Ctx, room: usize) -> io::Result<Option<(u64, u64, Vec<u8>)>> {
        let ops = ctx.h.api.objects;
        let mut buf = vec![0u8; room];
        let (mut size, mut got) = (0u64, 0usize);
        let (mut stat_rv, mut read_rv): (c_int, c_int) = (0, 0);
        // SAFETY: a fresh read op whose out-pointers (size, buf of `room` bytes, got, the
        // return values) outlive its synchronous operate; released once.
        let r = unsafe {
            let op = (ops.rados_create_read_op)();
            (ops.rados_read_op_stat)(op, &mut size, std::ptr::null_mut(), &mut stat_rv);
            (ops.rados_read_op_read)(
                op,
                0,
                room,
                buf.as_mut_ptr().cast::<c_char>(),
                &mut got,
                &mut read_rv,
            );
            let r = (ops.rados_read_op_operate)(op, ctx.io, self.oid.as_ptr(), 0);
            (ops.rados_release_read_op)(op);
            r
        };
        if r == -libc::ENOENT {
            return Ok(None);
        }
        if r < 0 {
            return Err(self.error(ctx.h, "cannot read", r));
        }
        // SAFETY: the ioctx's last operation was this read.
        let version = unsafe { (ops.rados_get_last_version)(ctx.io) };
        buf.truncate(got.min(room));
        Ok(Some((version, size, buf)))
    }
}

impl SharedBlob for RadosBlob {
    fn read(&self) -> io::Result<(u64, Vec<u8>)> {
        self.with_ctx(|ctx| {
            let mut room = FIRST_READ;
            // A record that grew past `room` is read again with room for all of it; bounded
            // in case it keeps growing.
            for _ in 0..4 {
                match self.read_once(ctx, room)? {
                    None => return Ok((0, Vec::new())),
                    Some((_, size, _)) if size > room as u64 => {
                        room = usize::try_from(size).map_err(|_| {
                            io::Error::new(io::ErrorKind::InvalidData, "record too large")
                        })?;
                    }
                    Some((version, _, data)) => return Ok((version, data)),
                }
            }
            Err(io::Error::other(format!(
                "rados object {}: grew on every read",
                self.object()
            )))
        })
    }

    fn compare_and_write(&self, expected: u64, data: &[u8]) -> io::Result<Option<u64>> {
        self.with_ctx(|ctx| {
            let ops = ctx.h.api.objects;
            // SAFETY: a fresh write op; `data` and the object name outlive its synchronous
            // operate; released once.
            let r = unsafe {
                let op = (ops.rados_create_write_op)();
                if expected == 0 {
                    (ops.rados_write_op_create)(
                        op,
                        ffi::LIBRADOS_CREATE_EXCLUSIVE,
                        std::ptr::null(),
                    );
                } else {
                    (ops.rados_write_op_assert_version)(op, expected);
                }
                (ops.rados_write_op_write_full)(op, data.as_ptr().cast::<c_char>(), data.len());
                let r = (ops.rados_write_op_operate)(
                    op,
                    ctx.io,
                    self.oid.as_ptr(),
                    std::ptr::null_mut(),
                    0,
                );
                (ops.rados_release_write_op)(op);
                r
            };
            match -r {
                // SAFETY: the ioctx's last operation was this write.
                0 => Ok(Some(unsafe { (ops.rados_get_last_version)(ctx.io) })),
                // Created by another first (EEXIST), changed since (ERANGE, EOVERFLOW), or
                // removed (ENOENT): the caller reads again.
                libc::EEXIST | libc::ERANGE | libc::EOVERFLOW | libc::ENOENT => Ok(None),
                _ => Err(self.error(ctx.h, "cannot write", r)),
            }
        })
    }
}
