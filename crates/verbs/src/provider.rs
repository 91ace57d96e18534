//! The `rdma` traits over libibverbs/librdmacm (through the C shim in src/shim.c).
//!
//! Mapping: a [`Verbs`] is one device as librdmacm sees it (its `ibv_context`, so PDs, CQs and the
//! QPs rdma_cm creates share one context). A [`Qp`] exists as an `ibv_qp` only once connected or
//! accepted: rdma_cm creates the QP on the connection's `rdma_cm_id`, so receives posted before that
//! are kept and posted right after the QP is created, before the connection can deliver anything.
//! Each connected QP has its own rdma_cm event channel (established, disconnected). Memory regions
//! own zeroed memory registered with `ibv_reg_mr`; local invalidation deregisters and re-validation
//! registers again under new keys.

use crate::ffi::{self, *};
use rdma::{
    Access, CompletionChannel, CompletionQueue, ConnInfo, ConnParams, ConnectRequest, Error,
    Listener, MemoryRegion, Provider, QpCaps, QpState, QueuePair, RecvWr, Result, SendOp, SendWr,
    Sge, Wc, WcOpcode, WcStatus,
};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::RawFd;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn errno_err(rc: c_int, what: &str) -> Error {
    let e = std::io::Error::from_raw_os_error(-rc);
    Error::Io(std::io::Error::new(e.kind(), format!("{what}: {e}")))
}

fn last_os(what: &str) -> Error {
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(0) {
        // A provider that fails on a limit of its own may leave errno unset ("Success").
        return Error::Io(std::io::Error::other(format!(
            "{what} failed and the provider gave no reason (check the memlock limit, ulimit -l, and the device's limits in ibv_devinfo -v)"
        )));
    }
    Error::Io(std::io::Error::new(e.kind(), format!("{what}: {e}")))
}

/// rdma_resolve_addr/rdma_resolve_route timeout (rping's value).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

fn ms(d: Duration) -> c_int {
    d.as_millis().clamp(1, c_int::MAX as u128) as c_int
}

fn sock_parts(a: SocketAddr) -> (c_int, [u8; 16], u16) {
    let mut ip = [0u8; 16];
    match a.ip() {
        IpAddr::V4(v4) => {
            ip[..4].copy_from_slice(&v4.octets());
            (4, ip, a.port())
        }
        IpAddr::V6(v6) => {
            ip.copy_from_slice(&v6.octets());
            (6, ip, a.port())
        }
    }
}

fn sock_from(family: c_int, ip: [u8; 16], port: u16) -> Option<SocketAddr> {
    match family {
        4 => Some(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])),
            port,
        )),
        6 => Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port)),
        _ => None,
    }
}

/// The device list from librdmacm and the context of the device in use.
struct Device {
    list: *mut *mut ibv_context,
    ctx: *mut ibv_context,
    name: String,
}

// SAFETY: libibverbs contexts may be used from any thread (rdma-core's verbs are thread-safe);
// the list is only freed in Drop.
unsafe impl Send for Device {}
// SAFETY: see above.
unsafe impl Sync for Device {}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: the list came from rdma_get_devices and is freed once, after every object that
        // used the context (they hold an Arc<Device>) is gone.
        unsafe { rdma_free_devices(self.list) };
    }
}

/// One RDMA device through rdma-core.
#[derive(Clone)]
pub struct Verbs {
    dev: Arc<Device>,
}

impl Verbs {
    /// Opens the first device librdmacm reports (where rdma_cm connections will resolve).
    pub fn open() -> Result<Verbs> {
        let mut n: c_int = 0;
        // SAFETY: rdma_get_devices fills n and returns a NULL-terminated array (or NULL).
        let list = unsafe { rdma_get_devices(&mut n) };
        if list.is_null() || n <= 0 {
            if !list.is_null() {
                // SAFETY: a list from rdma_get_devices, freed once.
                unsafe { rdma_free_devices(list) };
            }
            return Err(Error::Unavailable("no RDMA devices".into()));
        }
        // SAFETY: n > 0, so the first entry is a valid context.
        let ctx = unsafe { *list };
        // SAFETY: ctx is a live context; the name is a NUL-terminated string owned by libibverbs.
        let name = unsafe {
            let p = is_ctx_name(ctx);
            if p.is_null() {
                String::from("?")
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Ok(Verbs {
            dev: Arc::new(Device { list, ctx, name }),
        })
    }
}

/// A protection domain.
#[derive(Clone)]
pub struct Pd(Arc<PdInner>);

struct PdInner {
    pd: *mut ibv_pd,
    dev: Arc<Device>,
}
// SAFETY: ibv_pd handles are thread-safe to use; freed only in Drop.
unsafe impl Send for PdInner {}
// SAFETY: see above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd; every MR/QP on it holds a Pd clone, so none is left.
        unsafe { ibv_dealloc_pd(self.pd) };
    }
}

/// A registered memory region owning its bytes, or holding the caller's (`reg_bytes`).
pub struct Mr {
    pd: Pd,
    buf: *mut u8,
    len: usize,
    /// The caller's bytes when registered in place: held so they outlive the registration,
    /// never written (read rights only; `write_at` refuses). `None`: `buf` is our allocation.
    borrowed: Option<bytes::Bytes>,
    access: Access,
    mr: Mutex<*mut ibv_mr>,
    /// lkey << 32 | rkey of the current registration.
    keys: AtomicU64,
    /// Bytes from the start the current registration covers (all, or a command's length).
    reg_len: std::sync::atomic::AtomicUsize,
}
// SAFETY: the buffer is owned by this struct (freed in Drop) or is the `Bytes` it holds (Send +
// Sync, only read); the ibv_mr handle is guarded by the mutex; copies in and out use raw
// pointers without long-lived references.
unsafe impl Send for Mr {}
// SAFETY: see above.
unsafe impl Sync for Mr {}

fn ibv_access(a: Access) -> c_int {
    // libibverbs: LOCAL_WRITE 1, REMOTE_WRITE 2, REMOTE_READ 4 — the same bits as rdma::Access.
    // Remote write needs local write in verbs.
    let mut v = a.0 as c_int & 7;
    if v & 2 != 0 {
        v |= 1;
    }
    v
}

impl Mr {
    fn register(&self) -> Result<()> {
        // SAFETY: buf..buf+len is our live allocation; pd is live (held by self.pd).
        let mr = unsafe {
            is_reg_mr(
                self.pd.0.pd,
                self.buf as *mut c_void,
                self.reg_len.load(Ordering::Acquire),
                ibv_access(self.access),
            )
        };
        if mr.is_null() {
            return Err(last_os("ibv_reg_mr"));
        }
        let (mut l, mut r) = (0u32, 0u32);
        // SAFETY: mr is the registration just made.
        unsafe { is_mr_keys(mr, &mut l, &mut r) };
        self.keys
            .store(((l as u64) << 32) | r as u64, Ordering::Release);
        *self.mr.lock().unwrap() = mr;
        Ok(())
    }
    fn deregister(&self) {
        let mut g = self.mr.lock().unwrap();
        if !g.is_null() {
            // SAFETY: a registration made by `register`, deregistered once (then nulled).
            unsafe { ibv_dereg_mr(*g) };
            *g = std::ptr::null_mut();
        }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        self.deregister();
        if self.borrowed.is_some() {
            return;
        }
        // SAFETY: buf/len came from Box<[u8]>::into_raw in reg_mr and are freed once, after the
        // registration is gone.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.buf, self.len,
            )))
        };
    }
}

impl MemoryRegion for Mr {
    fn lkey(&self) -> u32 {
        (self.keys.load(Ordering::Acquire) >> 32) as u32
    }
    fn rkey(&self) -> u32 {
        self.keys.load(Ordering::Acquire) as u32
    }
    fn addr(&self) -> u64 {
        self.buf as u64
    }
    fn len(&self) -> usize {
        self.len
    }
    fn access(&self) -> Access {
        self.access
    }
    fn read_at(&self, offset: usize, out: &mut [u8]) {
        assert!(
            offset.checked_add(out.len()).is_some_and(|e| e <= self.len),
            "read outside the region"
        );
        // SAFETY: bounds checked above; `out` is a distinct Rust borrow.
        unsafe { std::ptr::copy_nonoverlapping(self.buf.add(offset), out.as_mut_ptr(), out.len()) };
    }
    fn write_at(&self, offset: usize, data: &[u8]) {
        assert!(
            offset
                .checked_add(data.len())
                .is_some_and(|e| e <= self.len),
            "write outside the region"
        );
        assert!(
            self.borrowed.is_none(),
            "the region is the caller's read-only bytes"
        );
        // SAFETY: bounds checked above; the region owns its buffer (checked above).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.buf.add(offset), data.len()) };
    }
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: buf/len are the Box<[u8]> this Mr owns until Drop, so they outlive the
        // borrow; the trait's contract keeps writers (local and remote) away while it is held.
        unsafe { std::slice::from_raw_parts(self.buf, self.len) }
    }
    fn bytes_at(&self, offset: usize, len: usize) -> &[u8] {
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= self.len),
            "bytes outside the region"
        );
        // SAFETY: in range (checked above) of the Box<[u8]> this Mr owns until Drop; the
        // trait's contract keeps writers away from these bytes while borrowed.
        unsafe { std::slice::from_raw_parts(self.buf.add(offset), len) }
    }
    fn invalidate(&self) {
        self.deregister();
    }
    fn revalidate(&self) -> u32 {
        self.revalidate_bounded(self.len)
    }
    fn revalidate_bounded(&self, remote_len: usize) -> u32 {
        self.reg_len
            .store(remote_len.clamp(1, self.len), Ordering::Release);
        self.deregister();
        if let Err(e) = self.register() {
            panic!("re-registering a memory region failed: {e}");
        }
        self.rkey()
    }
    fn is_valid(&self) -> bool {
        !self.mr.lock().unwrap().is_null()
    }
}

/// A completion channel (`ibv_comp_channel`, its fd non-blocking).
pub struct Channel(Arc<ChannelInner>);

struct ChannelInner {
    ch: *mut ibv_comp_channel,
    _dev: Arc<Device>,
}
// SAFETY: the channel handle is thread-safe in libibverbs; destroyed only in Drop.
unsafe impl Send for ChannelInner {}
// SAFETY: see above.
unsafe impl Sync for ChannelInner {}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_comp_channel; every CQ on it holds an Arc to this.
        unsafe { ibv_destroy_comp_channel(self.ch) };
    }
}

impl CompletionChannel for Channel {
    fn fd(&self) -> RawFd {
        // SAFETY: a live channel.
        unsafe { is_comp_channel_fd(self.0.ch) }
    }
    fn get_events(&self, timeout: Option<Duration>) -> Result<u64> {
        let mut pfd = [PollFd {
            fd: self.fd(),
            events: 1, // POLLIN
            revents: 0,
        }];
        let t = timeout.map(ms).unwrap_or(-1);
        // SAFETY: one valid pollfd.
        let n = unsafe { poll(pfd.as_mut_ptr(), 1, t) };
        if n < 0 {
            return Err(last_os("poll on the completion channel"));
        }
        let mut got = 0u64;
        for _ in 0..1024 {
            // SAFETY: a live, non-blocking channel; the shim acks each event it takes.
            match unsafe { is_get_cq_event(self.0.ch) } {
                1 => got += 1,
                0 => break,
                rc => return Err(errno_err(rc, "ibv_get_cq_event")),
            }
        }
        Ok(got)
    }
}

#[repr(C)]
struct PollFd {
    fd: c_int,
    events: i16,
    revents: i16,
}
extern "C" {
    fn poll(fds: *mut PollFd, n: u64, timeout: c_int) -> c_int;
}

/// A completion queue.
pub struct Cq(Arc<CqInner>);

struct CqInner {
    cq: *mut ibv_cq,
    _channel: Option<Arc<ChannelInner>>,
    _dev: Arc<Device>,
}
// SAFETY: CQ handles are thread-safe in libibverbs; destroyed only in Drop.
unsafe impl Send for CqInner {}
// SAFETY: see above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq; QPs using it hold an Arc, so none is left.
        unsafe { ibv_destroy_cq(self.cq) };
    }
}

impl CompletionQueue for Cq {
    fn poll(&self, out: &mut [Wc]) -> usize {
        // In batches of `raw`'s size until `out` is full or the queue is empty, so a caller
        // that asks for N gets N whenever N are waiting.
        let mut filled = 0;
        while filled < out.len() {
            let n = self.poll_batch(&mut out[filled..]);
            filled += n;
            if n == 0 {
                break;
            }
        }
        filled
    }
    fn req_notify(&self, solicited_only: bool) {
        // SAFETY: a live CQ.
        unsafe { is_req_notify_cq(self.0.cq, solicited_only as c_int) };
    }
}

impl Cq {
    /// One ibv_poll_cq of at most 16 completions into `out`.
    fn poll_batch(&self, out: &mut [Wc]) -> usize {
        let mut raw = [is_wc::default(); 16];
        let want = out.len().min(raw.len()) as c_int;
        // SAFETY: raw has room for `want` entries.
        let n = unsafe { is_poll_cq(self.0.cq, raw.as_mut_ptr(), want) };
        if n <= 0 {
            return 0;
        }
        for (o, w) in out.iter_mut().zip(&raw[..n as usize]) {
            *o = Wc {
                wr_id: w.wr_id,
                status: match w.status {
                    ffi::IS_WC_SUCCESS => WcStatus::Success,
                    ffi::IS_WC_FLUSHED => WcStatus::Flushed,
                    ffi::IS_WC_LOC_PROT => WcStatus::LocalProtection,
                    ffi::IS_WC_LOC_LEN => WcStatus::LocalLength,
                    ffi::IS_WC_REM_ACCESS => WcStatus::RemoteAccess,
                    ffi::IS_WC_INVALID_REQ => WcStatus::InvalidRequest,
                    _ => WcStatus::RemoteOperation,
                },
                opcode: match w.opcode {
                    ffi::IS_OP_SEND => WcOpcode::Send,
                    ffi::IS_OP_WRITE => WcOpcode::RdmaWrite,
                    ffi::IS_OP_READ => WcOpcode::RdmaRead,
                    _ => WcOpcode::Recv,
                },
                byte_len: w.byte_len,
                invalidated_rkey: (w.with_inv != 0).then_some(w.invalidated_rkey),
                // libibverbs' work completion does not say whether a Send carried SE.
                solicited: false,
                qp_num: w.qp_num,
            };
        }
        n as usize
    }
}

/// The rdma_cm side of a queue pair: its id and event channel once connected or accepted.
struct Conn {
    id: *mut rdma_cm_id,
    ch: *mut rdma_event_channel,
    pending_recv: Vec<RecvWr>,
    failed: bool,
    /// The connection was established once: a QP back in RESET/INIT (siw returns an orderly
    /// closed QP to IDLE, reported as INIT) is then closed, not new.
    established: bool,
}

/// A reliable connected queue pair (created on its rdma_cm id at connect/accept).
pub struct Qp {
    pd: Pd,
    scq: Arc<CqInner>,
    rcq: Arc<CqInner>,
    caps: QpCaps,
    conn: Mutex<Conn>,
}
// SAFETY: rdma_cm ids and QPs are thread-safe in rdma-core; the handles are guarded by the mutex
// and destroyed only in Drop.
unsafe impl Send for Qp {}
// SAFETY: see above.
unsafe impl Sync for Qp {}

impl Drop for Qp {
    fn drop(&mut self) {
        let c = self.conn.get_mut().unwrap();
        // SAFETY: each handle was created for this QP and is destroyed once, QP before id before
        // channel as librdmacm requires.
        unsafe {
            if !c.id.is_null() {
                if !is_id_qp(c.id).is_null() {
                    rdma_destroy_qp(c.id);
                }
                rdma_destroy_id(c.id);
            }
            if !c.ch.is_null() {
                rdma_destroy_event_channel(c.ch);
            }
        }
    }
}

fn to_sges(sges: &[Sge]) -> Vec<is_sge> {
    sges.iter()
        .map(|s| is_sge {
            addr: s.addr,
            len: s.len,
            lkey: s.lkey,
        })
        .collect()
}

/// Waits (bounded) for event `want` on `ch`; other events are skipped. REJECTED becomes
/// `Error::Rejected` with the peer's private data.
fn wait_event(ch: *mut rdma_event_channel, want: i32, timeout: Duration) -> Result<is_event> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Connect(format!("no rdma_cm event {want} in time")));
        }
        let mut ev = is_event {
            id: std::ptr::null_mut(),
            event: -1,
            status: 0,
            private_data_len: 0,
            responder_resources: 0,
            initiator_depth: 0,
            private_data: [0; 256],
        };
        // SAFETY: a live event channel; ev is a valid out-struct.
        let rc = unsafe { is_next_event(ch, ms(left), &mut ev) };
        if rc == -110 {
            continue; // ETIMEDOUT: the loop's deadline decides
        }
        if rc < 0 {
            return Err(errno_err(rc, "rdma_get_cm_event"));
        }
        if ev.event == want && ev.status == 0 {
            return Ok(ev);
        }
        if ev.event == EV_REJECTED && want == EV_ESTABLISHED {
            let pd = ev.private_data[..ev.private_data_len as usize].to_vec();
            return Err(Error::Rejected(pd));
        }
        // A listener sees events of ids not yet migrated; a closing QP, stray ones: skip them.
        if want == EV_DISCONNECTED || want == EV_CONNECT_REQUEST {
            continue;
        }
        return Err(Error::Connect(format!(
            "rdma_cm event {} (status {}) instead of {want}",
            ev.event, ev.status
        )));
    }
}

impl Qp {
    /// Creates the verbs QP on `id` (which must be on this provider's device), posts the receives
    /// queued so far.
    fn create_on(&self, c: &mut Conn) -> Result<()> {
        // SAFETY: a live id.
        if unsafe { is_id_verbs(c.id) } != self.pd.0.dev.ctx {
            return Err(Error::Unavailable(
                "the address is reached through another RDMA device".into(),
            ));
        }
        // SAFETY: live id, PD and CQs (held by self).
        let rc = unsafe {
            is_create_qp(
                c.id,
                self.pd.0.pd,
                self.scq.cq,
                self.rcq.cq,
                self.caps.max_send_wr,
                self.caps.max_recv_wr,
                self.caps.max_sge,
            )
        };
        if rc < 0 {
            return Err(errno_err(rc, "rdma_create_qp"));
        }
        for wr in std::mem::take(&mut c.pending_recv) {
            post_recv_on(c.id, &wr)?;
        }
        Ok(())
    }
}

fn post_recv_on(id: *mut rdma_cm_id, wr: &RecvWr) -> Result<()> {
    let s = to_sges(&wr.sges);
    // SAFETY: the id has a QP; s holds s.len() SGEs.
    let rc = unsafe { is_post_recv(is_id_qp(id), wr.wr_id, s.as_ptr(), s.len() as c_int) };
    if rc < 0 {
        return Err(errno_err(rc, "ibv_post_recv"));
    }
    Ok(())
}

fn private_len(p: &ConnParams) -> Result<u8> {
    u8::try_from(p.private_data.len())
        .map_err(|_| Error::Invalid("private data longer than 255 bytes".into()))
}

impl QueuePair for Qp {
    fn qp_num(&self) -> u32 {
        let c = self.conn.lock().unwrap();
        if c.id.is_null() {
            return 0;
        }
        // SAFETY: a live id; its QP pointer is NULL until created.
        unsafe {
            let qp = is_id_qp(c.id);
            if qp.is_null() {
                0
            } else {
                is_qp_num(qp)
            }
        }
    }
    fn state(&self) -> QpState {
        let c = self.conn.lock().unwrap();
        if c.failed {
            return QpState::Error;
        }
        // SAFETY: a live id; its QP pointer is NULL until created.
        let qp = if c.id.is_null() {
            std::ptr::null_mut()
        } else {
            unsafe { is_id_qp(c.id) }
        };
        if qp.is_null() {
            return QpState::Init;
        }
        // SAFETY: a live QP.
        match unsafe { is_qp_state(qp) } {
            0 if c.established => QpState::Error,
            0 => QpState::Init,
            1 => QpState::Rts,
            2 => QpState::Closing,
            _ => QpState::Error,
        }
    }
    fn post_send(&self, wr: SendWr) -> Result<()> {
        let c = self.conn.lock().unwrap();
        // SAFETY: reading the id's QP pointer.
        let qp = if c.id.is_null() {
            std::ptr::null_mut()
        } else {
            unsafe { is_id_qp(c.id) }
        };
        if qp.is_null() {
            return Err(Error::Invalid("QP is not connected".into()));
        }
        let (op, se, remote, rkey, inv) = match wr.op {
            SendOp::Send => (IS_SEND, 0, 0, 0, 0),
            SendOp::SendSe => (IS_SEND, 1, 0, 0, 0),
            SendOp::SendInvalidate { rkey } => (IS_SEND_INV, 0, 0, 0, rkey),
            SendOp::SendSeInvalidate { rkey } => (IS_SEND_INV, 1, 0, 0, rkey),
            SendOp::RdmaWrite { remote_addr, rkey } => (IS_WRITE, 0, remote_addr, rkey, 0),
            SendOp::RdmaRead { remote_addr, rkey } => {
                if wr.sges.len() != 1 {
                    return Err(Error::Invalid("an RDMA Read takes exactly one SGE".into()));
                }
                (IS_READ, 0, remote_addr, rkey, 0)
            }
        };
        let s = to_sges(&wr.sges);
        // SAFETY: a live QP; s holds s.len() SGEs naming registered memory (checked by the device).
        let rc = unsafe {
            is_post_send(
                qp,
                wr.wr_id,
                op,
                se,
                wr.signaled as c_int,
                s.as_ptr(),
                s.len() as c_int,
                remote,
                rkey,
                inv,
            )
        };
        if rc < 0 {
            return Err(errno_err(rc, "ibv_post_send"));
        }
        Ok(())
    }
    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let mut c = self.conn.lock().unwrap();
        // SAFETY: reading the id's QP pointer.
        if c.id.is_null() || unsafe { is_id_qp(c.id) }.is_null() {
            c.pending_recv.push(wr);
            return Ok(());
        }
        post_recv_on(c.id, &wr)
    }
    fn connect(&self, addr: SocketAddr, params: &ConnParams) -> Result<ConnInfo> {
        let mut c = self.conn.lock().unwrap();
        if !c.id.is_null() {
            return Err(Error::Invalid("QP already connected".into()));
        }
        let len = private_len(params)?;
        // SAFETY: creating a channel and an id we own (destroyed in Drop).
        unsafe {
            c.ch = rdma_create_event_channel();
            if c.ch.is_null() {
                return Err(last_os("rdma_create_event_channel"));
            }
            if rdma_create_id(c.ch, &mut c.id, std::ptr::null_mut(), RDMA_PS_TCP) != 0 {
                c.id = std::ptr::null_mut();
                return Err(last_os("rdma_create_id"));
            }
        }
        let fail = |c: &mut Conn, e: Error| {
            c.failed = true;
            Err(e)
        };
        let (fam, ip, port) = sock_parts(addr);
        // The kernel retries an address resolution waiting for ARP at the end of this timeout
        // when it misses the neighbour update (seen with siw under qemu), so keep it short, as
        // rping does, and let the event wait below be the overall bound.
        let resolve_ms = ms(params.timeout.min(RESOLVE_TIMEOUT));
        // SAFETY: live id; ip holds 16 bytes.
        let rc = unsafe { is_resolve_addr(c.id, fam, ip.as_ptr(), port, resolve_ms) };
        if rc < 0 {
            return fail(&mut c, errno_err(rc, "rdma_resolve_addr"));
        }
        if let Err(e) = wait_event(c.ch, EV_ADDR_RESOLVED, params.timeout) {
            return fail(&mut c, e);
        }
        // SAFETY: live id with a resolved address.
        if unsafe { rdma_resolve_route(c.id, resolve_ms) } != 0 {
            return fail(&mut c, last_os("rdma_resolve_route"));
        }
        if let Err(e) = wait_event(c.ch, EV_ROUTE_RESOLVED, params.timeout) {
            return fail(&mut c, e);
        }
        if let Err(e) = self.create_on(&mut c) {
            return fail(&mut c, e);
        }
        let ird = params.ird.min(255) as u8;
        let ord = params.ord.min(255) as u8;
        // SAFETY: live id with a QP; the private data outlives the call.
        let rc = unsafe {
            is_connect(
                c.id,
                params.private_data.as_ptr() as *const c_void,
                len,
                ird,
                ord,
            )
        };
        if rc < 0 {
            return fail(&mut c, errno_err(rc, "rdma_connect"));
        }
        match wait_event(c.ch, EV_ESTABLISHED, params.timeout) {
            Ok(ev) => {
                c.established = true;
                Ok(ConnInfo {
                    peer_private_data: ev.private_data[..ev.private_data_len as usize].to_vec(),
                    peer_addr: addr,
                    ird: ev.initiator_depth as u16,
                    ord: ev.responder_resources as u16,
                    // MPA CRC is the device's business (siw: module settings); verbs does not
                    // tell.
                    crc: false,
                })
            }
            Err(e) => fail(&mut c, e),
        }
    }
    fn disconnect(&self) {
        let c = self.conn.lock().unwrap();
        if !c.id.is_null() {
            // SAFETY: a live id.
            unsafe { rdma_disconnect(c.id) };
        }
    }
    fn wait_closed(&self, timeout: Duration) -> bool {
        if self.state() == QpState::Error {
            return true;
        }
        let ch = self.conn.lock().unwrap().ch;
        if ch.is_null() {
            return false;
        }
        let ok = wait_event(ch, EV_DISCONNECTED, timeout).is_ok();
        if ok {
            self.conn.lock().unwrap().failed = true;
        }
        ok || self.state() == QpState::Error
    }
}

/// A listening rdma_cm id.
pub struct VerbsListener {
    id: *mut rdma_cm_id,
    ch: *mut rdma_event_channel,
    addr: SocketAddr,
}
// SAFETY: rdma_cm ids are thread-safe; destroyed only in Drop.
unsafe impl Send for VerbsListener {}

impl Drop for VerbsListener {
    fn drop(&mut self) {
        // SAFETY: created in `listen`, destroyed once, id before channel.
        unsafe {
            rdma_destroy_id(self.id);
            rdma_destroy_event_channel(self.ch);
        }
    }
}

impl Listener for VerbsListener {
    type Request = Request;
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }
    fn get_request(&self, timeout: Duration) -> Result<Option<Request>> {
        match wait_event(self.ch, EV_CONNECT_REQUEST, timeout) {
            Ok(ev) => {
                let (mut ip, mut port) = ([0u8; 16], 0u16);
                // SAFETY: the new id from the event; ip has 16 bytes.
                let fam = unsafe { is_peer_addr(ev.id, ip.as_mut_ptr(), &mut port) };
                Ok(Some(Request {
                    id: ev.id,
                    private_data: ev.private_data[..ev.private_data_len as usize].to_vec(),
                    peer: sock_from(fam, ip, port).unwrap_or(self.addr),
                    ird_ord: (ev.responder_resources as u16, ev.initiator_depth as u16),
                }))
            }
            Err(Error::Connect(m)) if m.starts_with("no rdma_cm event") => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// An incoming connection request (its own rdma_cm id).
pub struct Request {
    id: *mut rdma_cm_id,
    private_data: Vec<u8>,
    peer: SocketAddr,
    ird_ord: (u16, u16),
}
// SAFETY: the id is owned by this request until accepted (moved into the QP) or rejected.
unsafe impl Send for Request {}

impl Drop for Request {
    fn drop(&mut self) {
        if !self.id.is_null() {
            // SAFETY: an id nobody else owns (neither accepted nor rejected).
            unsafe {
                rdma_reject(self.id, std::ptr::null(), 0);
                rdma_destroy_id(self.id);
            }
        }
    }
}

impl ConnectRequest for Request {
    type Qp = Qp;
    fn private_data(&self) -> &[u8] {
        &self.private_data
    }
    fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
    fn peer_ird_ord(&self) -> (u16, u16) {
        self.ird_ord
    }
    fn accept(mut self, qp: &Qp, params: &ConnParams) -> Result<ConnInfo> {
        let len = private_len(params)?;
        let mut c = qp.conn.lock().unwrap();
        if !c.id.is_null() {
            return Err(Error::Invalid("QP already connected".into()));
        }
        // SAFETY: a fresh channel for this connection's events; the request's id moves to it and
        // from now on belongs to the QP (destroyed in Qp's Drop).
        unsafe {
            c.ch = rdma_create_event_channel();
            if c.ch.is_null() {
                return Err(last_os("rdma_create_event_channel"));
            }
            if rdma_migrate_id(self.id, c.ch) != 0 {
                return Err(last_os("rdma_migrate_id"));
            }
        }
        c.id = std::mem::replace(&mut self.id, std::ptr::null_mut());
        if let Err(e) = qp.create_on(&mut c) {
            c.failed = true;
            return Err(e);
        }
        // SAFETY: live id with a QP; the private data outlives the call.
        let rc = unsafe {
            is_accept(
                c.id,
                params.private_data.as_ptr() as *const c_void,
                len,
                params.ird.min(255) as u8,
                params.ord.min(255) as u8,
            )
        };
        if rc < 0 {
            c.failed = true;
            return Err(errno_err(rc, "rdma_accept"));
        }
        if let Err(e) = wait_event(c.ch, EV_ESTABLISHED, params.timeout) {
            c.failed = true;
            return Err(e);
        }
        c.established = true;
        Ok(ConnInfo {
            peer_private_data: self.private_data.clone(),
            peer_addr: self.peer,
            ird: params.ird,
            ord: params.ord,
            crc: false,
        })
    }
    fn reject(mut self, private_data: &[u8]) -> Result<()> {
        let len = u8::try_from(private_data.len())
            .map_err(|_| Error::Invalid("private data longer than 255 bytes".into()))?;
        let id = std::mem::replace(&mut self.id, std::ptr::null_mut());
        // SAFETY: the request's own id, rejected and destroyed once.
        unsafe {
            let rc = rdma_reject(id, private_data.as_ptr() as *const c_void, len);
            rdma_destroy_id(id);
            if rc != 0 {
                return Err(last_os("rdma_reject"));
            }
        }
        Ok(())
    }
}

impl Provider for Verbs {
    type Pd = Pd;
    type Mr = Mr;
    type Channel = Channel;
    type Cq = Cq;
    type Qp = Qp;
    type Listener = VerbsListener;

    fn name(&self) -> String {
        format!("verbs (rdma-core device {})", self.dev.name)
    }
    fn alloc_pd(&self) -> Result<Pd> {
        // SAFETY: a live context.
        let pd = unsafe { ibv_alloc_pd(self.dev.ctx) };
        if pd.is_null() {
            return Err(last_os("ibv_alloc_pd"));
        }
        Ok(Pd(Arc::new(PdInner {
            pd,
            dev: self.dev.clone(),
        })))
    }
    fn reg_mr(&self, pd: &Pd, len: usize, access: Access) -> Result<Mr> {
        let len = len.max(1);
        let buf = Box::into_raw(vec![0u8; len].into_boxed_slice()) as *mut u8;
        let mr = Mr {
            pd: pd.clone(),
            buf,
            len,
            access,
            borrowed: None,
            mr: Mutex::new(std::ptr::null_mut()),
            keys: AtomicU64::new(0),
            reg_len: std::sync::atomic::AtomicUsize::new(len),
        };
        mr.register()?;
        Ok(mr)
    }
    fn reg_bytes(&self, pd: &Pd, data: bytes::Bytes, access: Access) -> Result<Mr> {
        rdma::check_reg_bytes(&data, access)?;
        let mr = Mr {
            pd: pd.clone(),
            // Only read through: the registration has no write rights (checked above).
            buf: data.as_ptr() as *mut u8,
            len: data.len(),
            access,
            mr: Mutex::new(std::ptr::null_mut()),
            keys: AtomicU64::new(0),
            reg_len: std::sync::atomic::AtomicUsize::new(data.len()),
            // A reference, not a copy: the region holds the bytes alive.
            borrowed: Some(data.clone()),
        };
        match mr.register() {
            Ok(()) => Ok(mr),
            // A device that will not pin these pages (read-only memory, say) gets a copy.
            Err(_) => rdma::reg_copy(self, pd, &data, access),
        }
    }
    fn create_channel(&self) -> Result<Channel> {
        // SAFETY: a live context.
        let ch = unsafe { ibv_create_comp_channel(self.dev.ctx) };
        if ch.is_null() {
            return Err(last_os("ibv_create_comp_channel"));
        }
        let inner = Arc::new(ChannelInner {
            ch,
            _dev: self.dev.clone(),
        });
        // SAFETY: the channel's fd, made non-blocking so get_events never blocks past its poll.
        let rc = unsafe { is_set_nonblock(is_comp_channel_fd(ch)) };
        if rc < 0 {
            return Err(errno_err(rc, "fcntl(O_NONBLOCK)"));
        }
        Ok(Channel(inner))
    }
    fn create_cq(&self, depth: u32, channel: Option<&Channel>) -> Result<Cq> {
        let ch = channel.map(|c| c.0.clone());
        let raw_ch = ch.as_ref().map_or(std::ptr::null_mut(), |c| c.ch);
        // SAFETY: a live context and (optional) channel.
        let cq = unsafe {
            ibv_create_cq(
                self.dev.ctx,
                depth.max(1) as c_int,
                std::ptr::null_mut(),
                raw_ch,
                0,
            )
        };
        if cq.is_null() {
            return Err(last_os("ibv_create_cq"));
        }
        Ok(Cq(Arc::new(CqInner {
            cq,
            _channel: ch,
            _dev: self.dev.clone(),
        })))
    }
    fn create_qp(&self, pd: &Pd, send_cq: &Cq, recv_cq: &Cq, caps: QpCaps) -> Result<Qp> {
        Ok(Qp {
            pd: pd.clone(),
            scq: send_cq.0.clone(),
            rcq: recv_cq.0.clone(),
            caps,
            conn: Mutex::new(Conn {
                id: std::ptr::null_mut(),
                ch: std::ptr::null_mut(),
                pending_recv: Vec::new(),
                failed: false,
                established: false,
            }),
        })
    }
    fn listen(&self, addr: SocketAddr) -> Result<VerbsListener> {
        let mut id = std::ptr::null_mut();
        // SAFETY: a channel and id we own; on error both are destroyed before returning.
        unsafe {
            let ch = rdma_create_event_channel();
            if ch.is_null() {
                return Err(last_os("rdma_create_event_channel"));
            }
            if rdma_create_id(ch, &mut id, std::ptr::null_mut(), RDMA_PS_TCP) != 0 {
                let e = last_os("rdma_create_id");
                rdma_destroy_event_channel(ch);
                return Err(e);
            }
            let (fam, ip, port) = sock_parts(addr);
            let rc = is_bind_listen(id, fam, ip.as_ptr(), port, 64);
            if rc < 0 {
                rdma_destroy_id(id);
                rdma_destroy_event_channel(ch);
                return Err(errno_err(rc, "rdma_bind_addr/rdma_listen"));
            }
            let (mut lip, mut lport) = ([0u8; 16], 0u16);
            let lfam = is_local_addr(id, lip.as_mut_ptr(), &mut lport);
            Ok(VerbsListener {
                id,
                ch,
                addr: sock_from(lfam, lip, lport).unwrap_or(addr),
            })
        }
    }
}
