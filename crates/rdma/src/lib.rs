//! The RDMA API the iSER layer is written against: protection domains, memory regions with STags
//! and access rights, reliable connected queue pairs with Send/Send-with-SE/Send-with-Invalidate,
//! RDMA Write and RDMA Read, receive queues, completion queues with a completion channel (a real
//! file descriptor), and a connection manager with private data. It is a set of traits plus plain
//! data types; providers implement it: `rnic` (software iWARP over TCP) and `verbs` (rdma-core).
//!
//! # Addresses and keys
//! A memory region has a base address (`Mr::addr`, an opaque 64-bit I/O virtual address), a length
//! and one STag used both as local key (in [`Sge`]) and remote key (in RDMA Write/Read work
//! requests and in messages to the peer). Remote peers address registered memory as
//! `(rkey, addr + offset)` — the non-zero-based addressing Linux uses for iSER.
//!
//! # Completions and the re-arm-then-poll rule
//! A completion queue raises one event on its channel after [`CompletionQueue::req_notify`] when the
//! next completion arrives; the arm is then consumed. A consumer must therefore, after waking up:
//! 1. re-arm (`req_notify`), **then**
//! 2. poll until the queue is empty,
//!
//! and only then sleep on the channel again. Polling before re-arming loses the wakeup for a
//! completion that lands between the last poll and the re-arm.
//!
//! # Completion order
//! Receives complete in the order the messages were sent. On a send queue, Sends and RDMA Writes
//! complete in posting order; an RDMA Read completes when its last Read Response segment has been
//! placed, which may be after Sends or Writes posted behind it (a ULP that must not send before
//! its read data is in waits for the Read's completion, as iSER targets do).

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Duration;

/// Access rights of a memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(pub u8);

impl Access {
    pub const NONE: Access = Access(0);
    /// The local QP may write into it (receive buffers, RDMA Read sinks).
    pub const LOCAL_WRITE: Access = Access(1);
    /// The peer may RDMA Write into it.
    pub const REMOTE_WRITE: Access = Access(2);
    /// The peer may RDMA Read from it.
    pub const REMOTE_READ: Access = Access(4);
    pub const ALL: Access = Access(7);

    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// One scatter/gather element: `len` bytes at `addr` inside the region whose local key is `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    pub lkey: u32,
    pub addr: u64,
    pub len: u32,
}

/// What a send-queue work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    Send,
    /// Send with Solicited Event.
    SendSe,
    /// Send with Invalidate: the peer invalidates its STag `rkey` before completing the receive.
    SendInvalidate {
        rkey: u32,
    },
    SendSeInvalidate {
        rkey: u32,
    },
    /// Write the local SGEs to the peer's `(rkey, remote_addr)`.
    RdmaWrite {
        remote_addr: u64,
        rkey: u32,
    },
    /// Read the peer's `(rkey, remote_addr)` into the local SGE (exactly one SGE).
    RdmaRead {
        remote_addr: u64,
        rkey: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub op: SendOp,
    pub sges: Vec<Sge>,
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sges: Vec<Sge>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    Recv,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    Success,
    /// The work request was still queued when the QP entered the error state.
    Flushed,
    /// A local SGE failed its lkey/PD/bounds/rights check.
    LocalProtection,
    /// The incoming message did not fit the posted receive buffer.
    LocalLength,
    /// The peer refused a tagged access (Terminate with a protection error).
    RemoteAccess,
    /// The peer terminated the connection for another reason, or it was lost.
    RemoteOperation,
    /// A work request was malformed (e.g. an RDMA Read with more than one SGE).
    InvalidRequest,
    /// The completion queue overflowed: it was full (its owner polled too slowly for its
    /// depth) when a completion of this QP arrived. Nothing is dropped (that completion and the
    /// ones after it are still there), but the CQ is in error and every QP completing into it
    /// since is moved to the error state.
    CqOverrun,
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// Bytes received (Recv) or transferred.
    pub byte_len: u32,
    /// For a Recv of a Send with Invalidate: the local STag that was invalidated.
    pub invalidated_rkey: Option<u32>,
    /// For a Recv: the Send carried the Solicited Event flag.
    pub solicited: bool,
    pub qp_num: u32,
}

impl Wc {
    /// A placeholder to fill arrays handed to [`CompletionQueue::poll`].
    pub const EMPTY: Wc = Wc {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        invalidated_rkey: None,
        solicited: false,
        qp_num: 0,
    };
}

/// Connection parameters for connect and accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParams {
    /// ULP private data (≤ 252 bytes so that it fits Linux's 256 with the MPA v2 word).
    pub private_data: Vec<u8>,
    /// Inbound RDMA Reads this side serves at once (rdma_cm `responder_resources`).
    pub ird: u16,
    /// Outbound RDMA Reads this side keeps in flight (rdma_cm `initiator_depth`).
    pub ord: u16,
    /// iWARP: ask for (initiator) or insist on (responder) MPA CRC. A responder always mirrors an
    /// initiator that asks.
    pub crc: bool,
    /// iWARP: MPA revision (1 or 2).
    pub mpa_revision: u8,
    /// iWARP: request RFC 6581 peer-to-peer mode with a ready-to-receive message.
    pub p2p: bool,
    /// Initiator without RTR: wait this long after the MPA Reply before the first FPDU (Linux siw
    /// starts reading its socket late after accepting).
    pub first_fpdu_delay: Duration,
    pub timeout: Duration,
}

impl Default for ConnParams {
    fn default() -> Self {
        ConnParams {
            private_data: Vec::new(),
            ird: 16,
            ord: 16,
            crc: false,
            mpa_revision: 2,
            p2p: false,
            first_fpdu_delay: Duration::from_millis(20),
            timeout: Duration::from_secs(10),
        }
    }
}

/// What the connection ended up with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    pub peer_private_data: Vec<u8>,
    pub peer_addr: SocketAddr,
    pub ird: u16,
    pub ord: u16,
    pub crc: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// Created, receives may be posted, not connected yet.
    Init,
    /// Connected, ready to send.
    Rts,
    /// Orderly close in progress.
    Closing,
    /// Disconnected or failed; all outstanding work requests were flushed.
    Error,
}

#[derive(Debug)]
pub enum Error {
    Io(std::io::Error),
    /// The peer rejected the connection; its private data.
    Rejected(Vec<u8>),
    /// Connection setup failed (MPA negotiation, timeout, ...).
    Connect(String),
    /// The request is invalid for this object (e.g. bad key, QP in the wrong state).
    Invalid(String),
    /// No such device or the provider cannot run here.
    Unavailable(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io(e) => write!(f, "I/O error: {e}"),
            Error::Rejected(pd) => write!(
                f,
                "connection rejected ({} bytes of private data)",
                pd.len()
            ),
            Error::Connect(s) => write!(f, "connection failed: {s}"),
            Error::Invalid(s) => write!(f, "invalid request: {s}"),
            Error::Unavailable(s) => write!(f, "unavailable: {s}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// The CRC32Cs of a region's blocks of `block_len()` bytes, kept by the region's owner, who
/// also promises that bytes sent from the region stay unchanged until their send completes
/// (a RAM LUN image under its range locks): a sender that must CRC them (MPA) may then take
/// their CRC from here and send them where they lie, instead of reading them twice or copying
/// them so the CRC stays true.
pub trait BlockCrcs: Send + Sync {
    /// Bytes per block; a power of two.
    fn block_len(&self) -> usize;
    /// The CRC32C of block `index`, whose current bytes are `bytes` (the provider reads
    /// them from the region; an owner that has not kept this block's CRC takes it from them).
    fn block_crc(&self, index: usize, bytes: &[u8]) -> u32;
}

/// A registered memory region. The provider owns the memory; the user reads and writes it
/// through these methods (remote peers reach it by RDMA).
pub trait MemoryRegion: Send + Sync {
    /// Local key (for [`Sge::lkey`]).
    fn lkey(&self) -> u32;
    /// Remote key (STag) to give to the peer.
    fn rkey(&self) -> u32;
    /// Base address used in SGEs and by the peer.
    fn addr(&self) -> u64;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn access(&self) -> Access;
    /// Copies `out.len()` bytes from `offset`. Panics if out of range.
    fn read_at(&self, offset: usize, out: &mut [u8]);
    /// Copies `data` to `offset`. Panics if out of range.
    fn write_at(&self, offset: usize, data: &[u8]);
    /// [`MemoryRegion::write_at`] for bulk data that nobody reads back soon (a RAM LUN's
    /// image): a provider may store it past the CPU caches, sparing the cache lines it would
    /// otherwise fetch only to overwrite them.
    fn write_at_streaming(&self, offset: usize, data: &[u8]) {
        self.write_at(offset, data);
    }
    /// The region's bytes, borrowed for as long as the region is: data the local side wrote
    /// can leave (as `bytes::Bytes`, say) without a copy. While the borrow lives, nothing may
    /// write into the region: the user posts no receive or RDMA Read into it and gives no
    /// peer an STag with remote write access to it.
    fn as_bytes(&self) -> &[u8];
    /// `len` bytes at `offset`, borrowed as in [`MemoryRegion::as_bytes`] but only those:
    /// the contract covers these bytes, and the rest of the region may be written meanwhile.
    /// Panics if out of range.
    fn bytes_at(&self, offset: usize, len: usize) -> &[u8] {
        &self.as_bytes()[offset..offset + len]
    }
    /// An SGE for `len` bytes at `offset`.
    fn sge(&self, offset: usize, len: usize) -> Sge {
        assert!(offset + len <= self.len(), "SGE outside the region");
        Sge {
            lkey: self.lkey(),
            addr: self.addr() + offset as u64,
            len: len as u32,
        }
    }
    /// Local invalidation: after this no remote access with the current STag succeeds.
    fn invalidate(&self);
    /// Re-validates the region under a new STag (key byte incremented); returns the new STag.
    fn revalidate(&self) -> u32;
    /// [`MemoryRegion::revalidate`], with the new STag reaching only the first `remote_len`
    /// bytes remotely (a command's buffer in a larger pooled region: a peer's access past the
    /// command's length is refused). A provider that cannot bound an STag reaches the whole
    /// region (the default).
    fn revalidate_bounded(&self, remote_len: usize) -> u32 {
        let _ = remote_len;
        self.revalidate()
    }
    fn is_valid(&self) -> bool;
    /// Gives the provider the region's [`BlockCrcs`] (and so the promise they carry). True
    /// if it will use them; a provider that never CRCs payload in software ignores them.
    fn keep_block_crcs(&self, crcs: std::sync::Arc<dyn BlockCrcs>) -> bool {
        let _ = crcs;
        false
    }
}

/// What [`Provider::reg_bytes`] accepts: some bytes, and no write rights (they are immutable).
pub fn check_reg_bytes(data: &[u8], access: Access) -> Result<()> {
    if access.contains(Access::LOCAL_WRITE) || access.contains(Access::REMOTE_WRITE) {
        return Err(Error::Invalid(
            "bytes registered in place are read-only: ask for REMOTE_READ or no rights".into(),
        ));
    }
    if data.is_empty() {
        return Err(Error::Invalid("no bytes to register".into()));
    }
    Ok(())
}

/// A region of `provider`'s own holding a copy of `data`: [`Provider::reg_bytes`] for a
/// provider (or a device) that cannot register memory it did not allocate.
pub fn reg_copy<P: Provider + ?Sized>(
    provider: &P,
    pd: &P::Pd,
    data: &[u8],
    access: Access,
) -> Result<P::Mr> {
    let mr = provider.reg_mr(pd, data.len(), access)?;
    mr.write_at(0, data);
    Ok(mr)
}

/// A completion queue.
pub trait CompletionQueue: Send + Sync {
    /// Moves up to `out.len()` completions into `out`; returns how many. A provider may move
    /// fewer than are waiting: a caller about to sleep on the channel polls until this
    /// returns 0, since completions left behind raise no event of their own.
    fn poll(&self, out: &mut [Wc]) -> usize;
    /// Arms the CQ: the next completion (or next solicited/error one) raises one channel event.
    fn req_notify(&self, solicited_only: bool);
}

/// A completion channel: a file descriptor that becomes readable when an armed CQ fires.
pub trait CompletionChannel: Send + Sync {
    /// The pollable file descriptor (register it with epoll or tokio's `AsyncFd`).
    fn fd(&self) -> RawFd;
    /// Consumes pending events, waiting up to `timeout` for one; returns the number consumed.
    fn get_events(&self, timeout: Option<Duration>) -> Result<u64>;
}

/// A reliable connected queue pair.
pub trait QueuePair: Send + Sync {
    fn qp_num(&self) -> u32;
    fn state(&self) -> QpState;
    fn post_send(&self, wr: SendWr) -> Result<()>;
    fn post_recv(&self, wr: RecvWr) -> Result<()>;
    /// Active side: connect to a listening peer (blocking, bounded by `params.timeout`).
    fn connect(&self, addr: SocketAddr, params: &ConnParams) -> Result<ConnInfo>;
    /// Orderly close: queued sends go out, then the connection is shut down; outstanding work
    /// requests are flushed once the peer has closed too.
    fn disconnect(&self);
    /// Abortive close, for a peer that stopped taking part: the connection is torn down at
    /// once, whatever is still queued or outstanding, and every work request is flushed (an
    /// orderly [`QueuePair::disconnect`] waits for the peer to take the queued sends and
    /// answer the outstanding RDMA Reads). By default the orderly close, for providers whose
    /// disconnect already does this (rdma_disconnect moves the QP to the error state).
    fn abort(&self) {
        self.disconnect();
    }
    /// Waits until the QP is in the error state (disconnected); true if it got there in time.
    fn wait_closed(&self, timeout: Duration) -> bool;
}

/// An incoming connection request.
pub trait ConnectRequest: Send {
    type Qp: QueuePair;
    fn private_data(&self) -> &[u8];
    fn peer_addr(&self) -> SocketAddr;
    /// The peer's offered IRD/ORD (0/0 when it sent none).
    fn peer_ird_ord(&self) -> (u16, u16);
    fn accept(self, qp: &Self::Qp, params: &ConnParams) -> Result<ConnInfo>;
    fn reject(self, private_data: &[u8]) -> Result<()>;
}

pub trait Listener: Send {
    type Request: ConnectRequest;
    fn local_addr(&self) -> SocketAddr;
    /// Waits up to `timeout` for the next connection request.
    fn get_request(&self, timeout: Duration) -> Result<Option<Self::Request>>;
}

/// Queue pair sizing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_sge: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_sge: 16,
        }
    }
}

/// A provider: one RDMA device (software or hardware).
pub trait Provider: Send + Sync {
    type Pd: Clone + Send + Sync;
    type Mr: MemoryRegion;
    type Channel: CompletionChannel;
    type Cq: CompletionQueue;
    type Qp: QueuePair;
    type Listener: Listener<Request: ConnectRequest<Qp = Self::Qp>>;

    fn name(&self) -> String;
    fn alloc_pd(&self) -> Result<Self::Pd>;
    /// Allocates and registers `len` zeroed bytes.
    fn reg_mr(&self, pd: &Self::Pd, len: usize, access: Access) -> Result<Self::Mr>;
    /// Registers bytes the caller already holds, for a peer's RDMA Reads and local sends:
    /// zero-copy write data. `data` is immutable, so only read rights may be asked for
    /// (`REMOTE_READ` or none); `LOCAL_WRITE` or `REMOTE_WRITE` is refused. The region keeps
    /// `data` alive until it is dropped, so its address can never come to name other bytes.
    /// A provider that cannot register memory it did not allocate registers a copy (this
    /// default, [`reg_copy`]).
    fn reg_bytes(&self, pd: &Self::Pd, data: bytes::Bytes, access: Access) -> Result<Self::Mr> {
        check_reg_bytes(&data, access)?;
        reg_copy(self, pd, &data, access)
    }
    fn create_channel(&self) -> Result<Self::Channel>;
    fn create_cq(&self, depth: u32, channel: Option<&Self::Channel>) -> Result<Self::Cq>;
    fn create_qp(
        &self,
        pd: &Self::Pd,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
        caps: QpCaps,
    ) -> Result<Self::Qp>;
    fn listen(&self, addr: SocketAddr) -> Result<Self::Listener>;
}
