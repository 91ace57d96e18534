//! [`RbdOwner`]: which of several gateways serving one image may write it, decided by
//! librbd's exclusive lock in managed mode, and the fencing of a gateway whose lock another
//! one broke.
//!
//! `rbd_lock_acquire` puts the image's lock under the caller's control: from then on librbd
//! neither hands the lock over when another client asks for it nor asks for it on a write,
//! so a gateway that does not own the image gets EROFS for its writes instead of taking the
//! lock away (the ping-pong of two gateways that both write). A gateway that never called
//! [`RbdOwner::acquire`] still has librbd's automatic policy: its writes ask the owner, which
//! refuses, and fail the same way; only when nobody holds the lock does such a write take
//! it, as librbd always did.
//!
//! Lock owners are named by their RADOS client's address (`127.0.0.1:0/3729642123`), which is
//! also what a broken lock blocklists: `rbd_lock_break` blocklists the owner's client (we set
//! `rbd_blocklist_on_break_lock`, librbd's default) for `rbd_blocklist_expire_seconds`, 0 by
//! default, meaning the monitors' `mon_osd_blocklist_default_expire`, one hour. Ceph lists the
//! entry with `ceph osd blocklist ls`; `ceph osd blocklist rm ADDR` removes it. The OSDs refuse
//! every operation of a blocklisted client (ESHUTDOWN, librados' EBLOCKLISTED), including
//! writes it had in flight, before the new owner takes the lock: they can never land after
//! the new owner's.
//!
//! A fenced gateway's I/O fails with an error [`is_fenced`] recognises, logged once. It
//! serves again on a new client (a new address, not blocklisted) with the image reopened:
//! when asked ([`RbdOwner::recover`], and [`ExclusiveOwner::acquire`] does it first), or by
//! itself once the old client's blocklist entry is gone (removed or expired), which a thread
//! checks every [`RECOVER_CHECK_SECS`]. It comes back as a non-owner.

use std::ffi::{c_char, c_int, CStr, CString};
use std::fmt;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use storage::ExclusiveOwner;

use crate::ffi::{self, Api, RadosT};
use crate::{errno, Connection, Handles, RbdSpec, Shared};

/// Seconds between checks of a fenced gateway's blocklist entry.
pub const RECOVER_CHECK_SECS: u64 = 10;

/// How long a fenced gateway checks its blocklist entry by itself (a day; the entry expires
/// after an hour unless configured otherwise): after that only [`RbdOwner::recover`] helps.
const RECOVER_CHECK_FOR: Duration = Duration::from_secs(24 * 3600);

/// This gateway's handle on an RBD image's exclusive lock ([`storage::ExclusiveOwner`]); see
/// the module's description. Its id is its current RADOS client address, the name
/// `rbd lock` commands, [`ExclusiveOwner::owner`] and the blocklist give it.
pub struct RbdOwner {
    shared: Arc<Shared>,
}

impl fmt::Debug for RbdOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RbdOwner")
            .field("image", &self.shared.spec.display_name())
            .field("id", &self.id())
            .finish()
    }
}

/// The payload of the error I/O of a fenced gateway fails with.
#[derive(Debug)]
struct Fenced(String);

impl fmt::Display for Fenced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Fenced {}

/// Whether `e` says this gateway is fenced: its client was blocklisted because another
/// gateway broke its exclusive lock (kind [`io::ErrorKind::PermissionDenied`]).
pub fn is_fenced(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Fenced>())
}

/// The error of an operation a fenced gateway's client tried.
pub(crate) fn fenced_error(spec: &RbdSpec) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        Fenced(format!(
            "rbd image {}: this gateway is fenced (another gateway took the exclusive lock and blocklisted its client)",
            spec.display_name()
        )),
    )
}

/// The client addresses a gateway had, oldest first: an append-only chain, so that
/// [`ExclusiveOwner::id`] can lend the current one while a recovery appends another.
#[derive(Default)]
pub(crate) struct Ids {
    first: OnceLock<Box<IdNode>>,
}

struct IdNode {
    id: String,
    next: OnceLock<Box<IdNode>>,
}

impl Ids {
    /// The current id, if a connection was ever made.
    pub(crate) fn current(&self) -> Option<&str> {
        let mut node = self.first.get()?;
        while let Some(next) = node.next.get() {
            node = next;
        }
        Some(&node.id)
    }

    /// Makes `id` the current one (callers hold `Shared::reconnecting`, or own the chain).
    pub(crate) fn push(&self, id: &str) {
        if self.current() == Some(id) {
            return;
        }
        let mut slot = &self.first;
        while let Some(node) = slot.get() {
            slot = &node.next;
        }
        let _ = slot.set(Box::new(IdNode {
            id: id.to_string(),
            next: OnceLock::new(),
        }));
    }
}

/// The address of a connected client, as lock owners and the blocklist name it.
pub(crate) fn client_addr(api: &Api, cluster: RadosT) -> io::Result<String> {
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: a connected cluster handle and an out-pointer; librados allocates the string.
    let r = unsafe { (api.lock.rados_getaddrs)(cluster, &mut out) };
    if r < 0 || out.is_null() {
        return Err(io::Error::new(
            errno(r.min(-1) as i64).kind(),
            "cannot read this client's address",
        ));
    }
    // SAFETY: librados returned a NUL-terminated string, freed right after copying.
    let addr = unsafe { CStr::from_ptr(out) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: the string came from librados and is freed once.
    unsafe { (api.lock.rados_buffer_free)(out) };
    Ok(addr)
}

/// An address as `ceph osd blocklist ls` prints it: without a `v1:`/`v2:`/`any:` prefix.
pub(crate) fn bare(addr: &str) -> &str {
    let addr = addr.trim_start_matches('[').trim_end_matches(']');
    let addr = addr.split(',').next().unwrap_or(addr);
    ["v1:", "v2:", "any:"]
        .iter()
        .find_map(|p| addr.strip_prefix(p))
        .unwrap_or(addr)
}

/// Whether `addr` is in the cluster's blocklist, asked of the monitors through `cluster`.
fn blocklisted(api: &Api, cluster: RadosT, addr: &str) -> io::Result<bool> {
    let cmd = c"{\"prefix\": \"osd blocklist ls\"}";
    let cmds = [cmd.as_ptr()];
    let (mut out, mut out_len) = (std::ptr::null_mut::<c_char>(), 0usize);
    let (mut status, mut status_len) = (std::ptr::null_mut::<c_char>(), 0usize);
    // SAFETY: a connected cluster, one NUL-terminated command, no input, out-pointers for
    // the two buffers librados allocates (freed below).
    let r = unsafe {
        (api.lock.rados_mon_command)(
            cluster,
            cmds.as_ptr(),
            1,
            std::ptr::null(),
            0,
            &mut out,
            &mut out_len,
            &mut status,
            &mut status_len,
        )
    };
    let listing = if out.is_null() {
        String::new()
    } else {
        // SAFETY: librados' buffer of `out_len` bytes.
        let bytes = unsafe { std::slice::from_raw_parts(out.cast::<u8>(), out_len) };
        String::from_utf8_lossy(bytes).into_owned()
    };
    for buf in [out, status] {
        if !buf.is_null() {
            // SAFETY: allocated by librados for this call, freed once.
            unsafe { (api.lock.rados_buffer_free)(buf) };
        }
    }
    if r < 0 {
        return Err(errno(r as i64));
    }
    let want = bare(addr);
    Ok(listing
        .lines()
        .any(|l| l.split_whitespace().next().map(bare) == Some(want)))
}

/// Logs that the client `addr` is fenced (the one line saying so), then watches its
/// blocklist entry every [`RECOVER_CHECK_SECS`] and recovers the backend once it is gone;
/// ends early when the backend is dropped or recovered otherwise.
pub(crate) fn watch_blocklist(shared: Weak<Shared>, addr: String) {
    let client = addr.clone();
    let spawned = std::thread::Builder::new()
        .name("rbd-fenced".into())
        .spawn(move || {
            match shared.upgrade() {
                Some(sh) => tracing::error!(
                    image = %sh.spec.display_name(),
                    client = %addr,
                    "this gateway was FENCED: another gateway broke its exclusive lock and the cluster blocklisted this client; its I/O fails until it reconnects (RbdOwner::recover, or by itself once `ceph osd blocklist rm {addr}` removes the entry or it expires)"
                ),
                None => return,
            }
            let rounds = RECOVER_CHECK_FOR.as_secs() / RECOVER_CHECK_SECS;
            for _ in 0..rounds {
                std::thread::sleep(Duration::from_secs(RECOVER_CHECK_SECS));
                let Some(sh) = shared.upgrade() else { return };
                let Ok(conn) = sh.connection() else { return };
                if conn.handles.addr != addr {
                    return; // recovered already
                }
                // The monitors still answer a blocklisted client (only the OSDs refuse it).
                match blocklisted(sh.api, conn.handles.cluster, &addr) {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => {
                        tracing::debug!(client = %addr, "cannot list the blocklist: {e}");
                        continue;
                    }
                }
                drop(conn);
                let owner = RbdOwner { shared: sh };
                match owner.recover() {
                    Ok(()) => return,
                    Err(e) => tracing::warn!(
                        image = %owner.shared.spec.display_name(),
                        "the blocklist entry of {addr} is gone but reconnecting failed: {e}"
                    ),
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!(client = %client, "this gateway was FENCED (its client is blocklisted) and no thread watches the entry ({e}): RbdOwner::recover brings it back");
    }
}

impl RbdOwner {
    pub(crate) fn new(shared: Arc<Shared>) -> RbdOwner {
        RbdOwner { shared }
    }

    fn name(&self) -> String {
        self.shared.spec.display_name()
    }

    /// Brings a fenced gateway back: a new RADOS client (a new address, which no blocklist
    /// entry names), the image reopened, as a non-owner. Does nothing when the current
    /// client is not fenced (asked of the cluster first). I/O in flight on the old client
    /// fails; none of it is retried on the new one.
    pub fn recover(&self) -> io::Result<()> {
        let sh = &self.shared;
        let _one = sh.reconnecting.lock().unwrap_or_else(|e| e.into_inner());
        let conn = sh.connection()?;
        if !conn.handles.fenced.load(Ordering::Acquire) {
            // Not known to be fenced yet: ask (a blocklisted client finds out here).
            let _ = self.owner_state(&conn.handles);
            if !conn.handles.fenced.load(Ordering::Acquire) {
                return Ok(());
            }
        }
        let old = conn.handles.addr.clone();
        drop(conn);
        let new = Connection::open(sh.api, &sh.spec, sh.want, &sh.size, Arc::downgrade(sh))?;
        let addr = new.handles.addr.clone();
        sh.install(new);
        tracing::info!(
            image = %self.name(),
            old_client = %old,
            client = %addr,
            "recovered from fencing: reconnected with a new client, not the owner (`ceph osd blocklist rm {old}` clears the old entry before it expires)"
        );
        Ok(())
    }

    /// The current connection, recovered first when it is fenced.
    fn live(&self) -> io::Result<Arc<Connection>> {
        let conn = self.shared.connection()?;
        if !conn.handles.fenced.load(Ordering::Acquire) {
            return Ok(conn);
        }
        drop(conn);
        self.recover()?;
        self.shared.connection()
    }

    /// Whether `h` holds the lock; a blocklisted client is marked fenced and does not.
    fn owner_state(&self, h: &Handles) -> io::Result<bool> {
        if h.fenced.load(Ordering::Acquire) {
            return Ok(false);
        }
        let mut owner: c_int = 0;
        // SAFETY: an open image and an out-pointer.
        let r = unsafe { (h.api.lock.rbd_is_exclusive_lock_owner)(h.image, &mut owner) };
        if r == -libc::ESHUTDOWN {
            h.note_fenced();
            return Ok(false);
        }
        if r < 0 {
            return Err(self.error("cannot read the lock's state", r));
        }
        Ok(owner != 0)
    }

    /// The lock's owner as librbd names it, if anyone holds it.
    fn owner_of(&self, h: &Handles) -> io::Result<Option<String>> {
        const MAX: usize = 8;
        let mut owners = [std::ptr::null_mut::<c_char>(); MAX];
        let (mut mode, mut n): (c_int, usize) = (0, MAX);
        // SAFETY: an open image, out-pointers, and room for `n` owner strings, which
        // librbd allocates and rbd_lock_get_owners_cleanup frees.
        let r = unsafe {
            (h.api.lock.rbd_lock_get_owners)(h.image, &mut mode, owners.as_mut_ptr(), &mut n)
        };
        if r == -libc::ENOENT {
            return Ok(None);
        }
        if r == -libc::ESHUTDOWN {
            h.note_fenced();
            return Err(fenced_error(&self.shared.spec));
        }
        if r < 0 {
            return Err(self.error("cannot list the lock's owners", r));
        }
        let n = n.min(MAX);
        let first = owners[..n].first().filter(|p| !p.is_null()).map(|&p| {
            // SAFETY: librbd filled the first `n` slots with NUL-terminated strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        });
        // SAFETY: the `n` strings librbd returned, freed once.
        unsafe { (h.api.lock.rbd_lock_get_owners_cleanup)(owners.as_mut_ptr(), n) };
        Ok(first)
    }

    /// Breaks `owner`'s lock, which blocklists its client (fencing it).
    fn break_lock(&self, h: &Handles, owner: &str) -> io::Result<()> {
        let c_owner = CString::new(owner)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "owner name with a NUL"))?;
        // SAFETY: an open image and a NUL-terminated owner name.
        let r = unsafe {
            (h.api.lock.rbd_lock_break)(h.image, ffi::RBD_LOCK_MODE_EXCLUSIVE, c_owner.as_ptr())
        };
        match -r {
            0 => {
                tracing::warn!(
                    image = %self.name(),
                    old_owner = %owner,
                    client = %h.addr,
                    "broke the exclusive lock of {owner}: that client is blocklisted (`ceph osd blocklist ls`) and can no longer write"
                );
                Ok(())
            }
            // Released (or broken by someone else) meanwhile: nothing left to break.
            libc::ENOENT => Ok(()),
            libc::ESHUTDOWN => {
                h.note_fenced();
                Err(fenced_error(&self.shared.spec))
            }
            _ => Err(self.error(&format!("cannot break the lock of {owner}"), r)),
        }
    }

    fn error(&self, what: &str, r: c_int) -> io::Error {
        let e = errno(r as i64);
        io::Error::new(e.kind(), format!("rbd image {}: {what}: {e}", self.name()))
    }
}

impl ExclusiveOwner for RbdOwner {
    fn id(&self) -> &str {
        self.shared.ids.current().unwrap_or("(not connected)")
    }

    fn acquire(&self, force: bool) -> io::Result<bool> {
        let conn = self.live()?;
        let h = &conn.handles;
        if self.owner_state(h)? {
            return Ok(true);
        }
        if let Some(owner) = self.owner_of(h)? {
            if owner != h.addr {
                if !force {
                    return Ok(false);
                }
                self.break_lock(h, &owner)?;
            }
        }
        // SAFETY: an open image.
        let r = unsafe { (h.api.lock.rbd_lock_acquire)(h.image, ffi::RBD_LOCK_MODE_EXCLUSIVE) };
        match -r {
            0 => {
                tracing::info!(image = %self.name(), client = %h.addr, "took the exclusive lock");
                Ok(true)
            }
            // Another gateway took it first; it refuses to hand it over.
            libc::EROFS => Ok(false),
            libc::ESHUTDOWN => {
                h.note_fenced();
                Err(fenced_error(&self.shared.spec))
            }
            _ => Err(self.error("cannot take the exclusive lock", r)),
        }
    }

    fn release(&self) -> io::Result<()> {
        let Ok(conn) = self.shared.connection() else {
            return Ok(());
        };
        let h = &conn.handles;
        if h.fenced.load(Ordering::Acquire) {
            return Ok(()); // the lock was taken away already
        }
        // SAFETY: an open image.
        let r = unsafe { (h.api.lock.rbd_lock_release)(h.image) };
        match -r {
            0 => {
                tracing::info!(image = %self.name(), client = %h.addr, "released the exclusive lock");
                Ok(())
            }
            // Not the owner: nothing to give up.
            libc::EINVAL => Ok(()),
            libc::ESHUTDOWN => {
                h.note_fenced();
                Ok(())
            }
            _ => Err(self.error("cannot release the exclusive lock", r)),
        }
    }

    fn is_owner(&self) -> io::Result<bool> {
        match self.shared.connection() {
            Ok(conn) => self.owner_state(&conn.handles),
            Err(_) => Ok(false),
        }
    }

    fn owner(&self) -> io::Result<Option<String>> {
        let conn = self.shared.connection()?;
        if conn.handles.fenced.load(Ordering::Acquire) {
            return Err(fenced_error(&self.shared.spec));
        }
        self.owner_of(&conn.handles)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_lend_the_latest_address() {
        let ids = Ids::default();
        assert_eq!(ids.current(), None);
        ids.push("127.0.0.1:0/1");
        let first = ids.current().unwrap();
        ids.push("127.0.0.1:0/1");
        ids.push("127.0.0.1:0/2");
        assert_eq!(first, "127.0.0.1:0/1", "a lent id stays valid");
        assert_eq!(ids.current(), Some("127.0.0.1:0/2"));
    }

    #[test]
    fn addresses_compare_without_their_protocol() {
        assert_eq!(bare("127.0.0.1:0/42"), "127.0.0.1:0/42");
        assert_eq!(bare("v1:127.0.0.1:0/42"), "127.0.0.1:0/42");
        assert_eq!(bare("[any:127.0.0.1:0/42]"), "127.0.0.1:0/42");
    }

    #[test]
    fn fenced_errors_are_recognised() {
        let spec = RbdSpec {
            pool: "rbd".into(),
            image: "i".into(),
            conf: None,
            user: None,
            namespace: None,
            create: false,
            completions: Default::default(),
        };
        let e = fenced_error(&spec);
        assert!(is_fenced(&e));
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("rbd/i"), "{e}");
        assert!(!is_fenced(&io::Error::from_raw_os_error(libc::ESHUTDOWN)));
    }
}
